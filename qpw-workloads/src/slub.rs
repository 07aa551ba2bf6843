//! SLUB per-CPU sheaves (`mm/slub.c`): per-CPU arrays of objects over a shared barn, and the
//! flushes that empty them.
//!
//! # What the kernel does
//!
//! Since Linux 6.18 (Vlastimil Babka's "SLUB percpu sheaves") a cache can keep, per CPU, a
//! `main` and a `spare` *sheaf*: an array of up to `sheaf_capacity` free objects
//! (`struct slub_percpu_sheaves`, under `local_trylock(&s->cpu_sheaves->lock)`). Allocation
//! pops from `main` (`alloc_from_pcs()`); when it is empty it swaps in a non-empty `spare`, or
//! trades it for a full sheaf from the node's *barn* (`barn_replace_empty_sheaf()`), or refills
//! it from the slabs. Freeing pushes to `main` (`free_to_pcs()`); when it is full, it swaps in
//! an empty `spare`, or trades it for an empty sheaf from the barn
//! (`barn_replace_full_sheaf()`), or, when the barn already holds `MAX_FULL_SHEAVES` (10), flushes
//! it back to the slabs. `kfree_rcu()` collects objects in a third sheaf, `rcu_free`, handed to
//! `call_rcu()` when full (`__kfree_rcu_sheaf()`).
//!
//! `flush_all(s)` (`flush_all_cpus_locked()`, under `flush_lock`) queues `flush_cpu_slab` only to
//! the CPUs with used sheaves (`has_pcs_used()`: a spare, an rcu sheaf, or a non-empty main)
//! and flushes them; the work (`pcs_flush_all()`) detaches `spare` and `rcu_free` under the
//! lock, then `sheaf_flush_main()` frees `main` in chunks of `PCS_BATCH_MAX` (32) objects,
//! releasing the lock between chunks. `flush_rcu_sheaves_on_cache(s)` queues
//! `flush_rcu_sheaf` to every CPU and then waits for a grace period (`rcu_barrier()`); it must
//! really run *on* each CPU (it also waits out a `__kfree_rcu_sheaf()` racing on that CPU), so
//! the QPW patches keep it queued in both modes.
//!
//! # What this model keeps, and what it simplifies
//!
//! [`Slub::flush_all`] uses a [`PerCpuWork`] from the [`Qpw`] instance (queued in mode 0, run by
//! the requester under the CPU's lock in mode 1); [`Slub::flush_rcu_sheaves_on_cache`] uses
//! [`Qpw::work_on_cpu`], queued in every mode, and reports where each run happened. Objects are
//! bare ids; the slabs are one free pool (one node, no partial lists, no per-slab freelists);
//! the barn is one list pair; `main` is never `NULL`, a missing spare or rcu sheaf is `None`.
//! RCU is modelled by a list of sheaves waiting for a grace period, which ends at every
//! `rcu_barrier()` and whenever 16 sheaves wait. `sheaf_flush_main()` takes the lock for each
//! chunk rather than trying it (a drain here must finish). `has_pcs_used()` reads another CPU's
//! pointers racily; here each CPU publishes it as an atomic flag, written under its lock.
//!
//! # Conservation
//!
//! Every object is in exactly one place: the slabs, a barn sheaf, a CPU's main, spare or rcu
//! sheaf, a sheaf waiting for RCU, a task of `process_op`, or a caller of
//! [`Slub::kmem_cache_alloc`] (those are only counted). Sheaves in the barn's full list are full, those in
//! its empty list empty, and no sheaf holds more than its capacity.
//!
//! Which objects the callers hold is known exactly (a bit per object), so a second free of the
//! same object, or a free of one that was never handed out, is refused with
//! [`WorkloadError::NotAllocated`] before it touches a sheaf. The kernel catches some of these
//! (`CONFIG_SLUB_DEBUG`'s "double free detected", the freelist's check of an object freed twice
//! in a row) and corrupts its lists on the others; here a bad free is always an error.

use std::collections::VecDeque;
use std::time::Duration;

use qpw_core::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};
use qpw_core::{PerCpu, PerCpuGuard, PerCpuWork, Qpw, Result, WorkCtx};

use crate::{
    conservation_verdict, drain_used_cpus, lock, AllocMap, CpuCounters, DrainOutcome,
    OwnerCounters, SkipCounters, Workload, WorkloadError,
};

/// `PCS_BATCH_MAX` (`mm/slub.c`): objects `sheaf_flush_main()` frees per hold of the lock.
pub const PCS_BATCH_MAX: usize = 32;

/// `MAX_FULL_SHEAVES` (`mm/slub.c`): full sheaves a barn keeps.
pub const MAX_FULL_SHEAVES: usize = 10;

/// `MAX_EMPTY_SHEAVES` (`mm/slub.c`): empty sheaves a barn keeps.
pub const MAX_EMPTY_SHEAVES: usize = 10;

/// Sheaves waiting for RCU after which a grace period is taken to have elapsed.
const RCU_PENDING_MAX: usize = 16;

/// Objects a task of [`Workload::process_op`] holds at most per CPU.
const OP_MAX_HELD: usize = 8;

/// An object, by number.
pub type Object = u32;

type Sheaf = Vec<Object>;

/// The SLUB workload's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlubConfig {
    /// Objects per sheaf (`s->sheaf_capacity`), 1 to 4096.
    pub sheaf_capacity: usize,
    /// Objects freed per hold of the lock by a flush (`PCS_BATCH_MAX`), 1 to 4096.
    pub batch_max: usize,
    /// Objects in the cache, 1 to 1 << 20.
    pub objects: usize,
}

impl Default for SlubConfig {
    /// The kernel's `PCS_BATCH_MAX`, sheaves of 64 objects (so a full main sheaf is flushed in
    /// two chunks), 16384 objects.
    fn default() -> Self {
        Self {
            sheaf_capacity: 64,
            batch_max: PCS_BATCH_MAX,
            objects: 16384,
        }
    }
}

/// One CPU's `slub_percpu_sheaves`, with the objects its tasks hold.
#[derive(Debug)]
struct Sheaves {
    main: Sheaf,
    spare: Option<Sheaf>,
    rcu_free: Option<Sheaf>,
    tasks: VecDeque<Object>,
    counters: OwnerCounters,
}

impl Sheaves {
    /// `has_pcs_used()`.
    fn used(&self) -> bool {
        self.spare.is_some() || self.rcu_free.is_some() || !self.main.is_empty()
    }
}

/// A `node_barn`.
#[derive(Debug, Default)]
struct Barn {
    full: Vec<Sheaf>,
    empty: Vec<Sheaf>,
}

#[derive(Debug)]
struct Shared {
    capacity: usize,
    batch_max: usize,
    objects: usize,
    pcs: PerCpu<Sheaves>,
    /// Per CPU (by slot index): `has_pcs_used()`, published by the owner under its lock.
    used: Vec<AtomicBool>,
    barn: Mutex<Barn>,
    /// The slabs' free objects.
    slabs: Mutex<Vec<Object>>,
    /// Sheaves handed to `call_rcu()`, waiting for a grace period.
    rcu_pending: Mutex<Vec<Sheaf>>,
    flush_lock: Mutex<()>,
    /// Chunks `sheaf_flush_main()` has freed, each under one hold of the lock (the kernel
    /// counts the objects, `SHEAF_FLUSH`).
    flush_chunks: AtomicU64,
    /// Objects handed out by [`Slub::kmem_cache_alloc`] and not yet freed: the callers hold
    /// them, outside the workload's sight.
    allocated: AllocMap,
    /// Per CPU (by slot index): the physical CPU the last `flush_rcu_sheaf` run for it ran on
    /// (`usize::MAX`: unknown or none yet).
    rcu_flush_ran_on: Vec<AtomicUsize>,
    skips: SkipCounters,
}

impl Shared {
    fn publish(&self, cpu: usize, pcs: &Sheaves) {
        self.used[self.skips.idx(cpu)].store(pcs.used(), Ordering::Release);
    }

    /// `sheaf_flush_unused()` / `__kmem_cache_free_bulk()`: returns objects to the slabs.
    fn free_to_slabs(&self, objects: &mut Sheaf) {
        lock(&self.slabs).append(objects);
    }

    /// Returns an emptied sheaf to the barn, or drops it when the barn has enough.
    fn put_empty(&self, sheaf: Sheaf) {
        debug_assert!(sheaf.is_empty());
        let mut barn = lock(&self.barn);
        if barn.empty.len() < MAX_EMPTY_SHEAVES {
            barn.empty.push(sheaf);
        }
    }

    /// `call_rcu()` on a sheaf: it waits for a grace period, which ends now if enough wait.
    fn call_rcu(&self, sheaf: Sheaf) {
        let mut pending = lock(&self.rcu_pending);
        pending.push(sheaf);
        if pending.len() >= RCU_PENDING_MAX {
            let done = std::mem::take(&mut *pending);
            drop(pending);
            self.grace_period_ended(done);
        }
    }

    /// `rcu_barrier()`: every sheaf handed to `call_rcu()` so far is freed
    /// (`rcu_free_sheaf_nobarn()`: its objects to the slabs).
    fn rcu_barrier(&self) {
        let done = std::mem::take(&mut *lock(&self.rcu_pending));
        self.grace_period_ended(done);
    }

    fn grace_period_ended(&self, sheaves: Vec<Sheaf>) {
        for mut sheaf in sheaves {
            self.free_to_slabs(&mut sheaf);
            self.put_empty(sheaf);
        }
    }

    /// `pcs_flush_all()` (the `flush_cpu_slab` work): detach spare and rcu sheaves under the
    /// lock, free them, then flush main in chunks.
    fn pcs_flush_all(&self, ctx: &WorkCtx) {
        let (spare, rcu_free) = {
            let Ok(mut pcs) = self.pcs.lock_work(ctx) else {
                return; // a remote run past its drain's deadline: the drain reports it
            };
            pcs.counters.drained(ctx);
            let detached = (pcs.spare.take(), pcs.rcu_free.take());
            self.publish(ctx.cpu(), &pcs);
            detached
        };
        if let Some(mut spare) = spare {
            self.free_to_slabs(&mut spare);
            self.put_empty(spare);
        }
        if let Some(rcu_free) = rcu_free {
            self.call_rcu(rcu_free);
        }
        self.sheaf_flush_main(ctx);
    }

    /// `sheaf_flush_main()`: frees main's objects `batch_max` at a time, releasing the lock
    /// between chunks so that the owner can run in between.
    fn sheaf_flush_main(&self, ctx: &WorkCtx) {
        let mut chunk = Vec::with_capacity(self.batch_max);
        loop {
            let remaining = {
                let Ok(mut pcs) = self.pcs.lock_work(ctx) else {
                    return; // a remote run past its drain's deadline: the drain reports it
                };
                let keep = pcs.main.len().saturating_sub(self.batch_max);
                chunk.extend(pcs.main.drain(keep..));
                self.publish(ctx.cpu(), &pcs);
                pcs.main.len()
            };
            // The lock is released: free the chunk.
            if !chunk.is_empty() {
                self.flush_chunks.fetch_add(1, Ordering::Relaxed);
            }
            self.free_to_slabs(&mut chunk);
            if remaining == 0 {
                return;
            }
        }
    }

    /// `flush_rcu_sheaf()`: the must-run-on-CPU work; notes where it ran.
    fn flush_rcu_sheaf(&self, ctx: &WorkCtx) {
        let ran_on = qpw_core::current_cpu().unwrap_or(usize::MAX);
        self.rcu_flush_ran_on[self.skips.idx(ctx.cpu())].store(ran_on, Ordering::Release);
        let rcu_free = {
            let Ok(mut pcs) = self.pcs.lock_work(ctx) else {
                return; // a remote run past its drain's deadline: the drain reports it
            };
            pcs.counters.drained(ctx);
            let rcu_free = pcs.rcu_free.take();
            self.publish(ctx.cpu(), &pcs);
            rcu_free
        };
        if let Some(rcu_free) = rcu_free {
            self.call_rcu(rcu_free);
        }
    }
}

/// What [`Slub::flush_rcu_sheaves_on_cache`] did, and where each CPU's flush ran.
#[derive(Debug)]
pub struct RcuFlush {
    /// The drain (queued on every CPU, in every mode).
    pub outcome: DrainOutcome,
    /// Per CPU, the physical CPU its `flush_rcu_sheaf` ran on (`sched_getcpu()` in the work),
    /// `None` where that is unknown (under loom) or it did not run.
    pub ran_on: Vec<(usize, Option<usize>)>,
}

/// A slab cache with per-CPU sheaves over a barn.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
/// use qpw_workloads::slub::{Slub, SlubConfig};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
/// let slub = Slub::new(&qpw, SlubConfig { sheaf_capacity: 8, batch_max: 4, objects: 64 })?;
/// {
///     let _bound = qpw.bind_current(1)?;
///     let object = slub.kmem_cache_alloc()?.expect("the cache has objects");
///     slub.kmem_cache_free(object)?;
/// }
/// let outcome = slub.flush_all();
/// assert_eq!((outcome.ran_remote, outcome.skipped_cpus), (1, 1)); // cpu 0 never used
/// assert_eq!(slub.slab_free(), 64);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Slub {
    shared: Arc<Shared>,
    flush_work: PerCpuWork,
    rcu_work: PerCpuWork,
}

impl Slub {
    /// The cache, its objects all in the slabs, the sheaves on `qpw`'s CPUs, and the two
    /// flush work items (the rcu one starts a worker on every remote-mode CPU).
    pub fn new(qpw: &Qpw, config: SlubConfig) -> Result<Self, WorkloadError> {
        WorkloadError::check("sheaf_capacity", config.sheaf_capacity, 1, 4096)?;
        WorkloadError::check("PCS_BATCH_MAX", config.batch_max, 1, 4096)?;
        WorkloadError::check("objects", config.objects, 1, 1 << 20)?;
        let nr_cpus = qpw.cpus().len();
        let pcs = qpw.per_cpu(|_| Sheaves {
            main: Vec::with_capacity(config.sheaf_capacity),
            spare: None,
            rcu_free: None,
            tasks: VecDeque::with_capacity(OP_MAX_HELD),
            counters: OwnerCounters::default(),
        });
        let shared = Arc::new(Shared {
            capacity: config.sheaf_capacity,
            batch_max: config.batch_max,
            objects: config.objects,
            pcs,
            used: (0..nr_cpus).map(|_| AtomicBool::new(false)).collect(),
            barn: Mutex::new(Barn::default()),
            slabs: Mutex::new((0..config.objects as Object).rev().collect()),
            rcu_pending: Mutex::new(Vec::new()),
            flush_lock: Mutex::new(()),
            flush_chunks: AtomicU64::new(0),
            allocated: AllocMap::new(config.objects),
            rcu_flush_ran_on: (0..nr_cpus).map(|_| AtomicUsize::new(usize::MAX)).collect(),
            skips: SkipCounters::new(qpw.cpus()),
        });
        let for_flush = shared.clone();
        let flush_work = qpw.work(move |ctx| for_flush.pcs_flush_all(ctx))?;
        let for_rcu = shared.clone();
        let rcu_work = qpw.work_on_cpu(move |ctx| for_rcu.flush_rcu_sheaf(ctx))?;
        Ok(Self {
            shared,
            flush_work,
            rcu_work,
        })
    }

    /// `kmem_cache_alloc()` through `alloc_from_pcs()`: an object from the calling CPU's main
    /// sheaf, after swapping in the spare, a full sheaf from the barn, or a refill from the
    /// slabs when main is empty; `None` when the cache has no free object left.
    pub fn kmem_cache_alloc(&self) -> Result<Option<Object>> {
        let mut pcs = self.shared.pcs.lock_local()?;
        let object = self.alloc_locked(&mut pcs);
        if let Some(object) = object {
            self.shared.allocated.hand_out(object as usize);
        }
        Ok(object)
    }

    fn alloc_locked(&self, pcs: &mut PerCpuGuard<'_, Sheaves>) -> Option<Object> {
        let shared = &*self.shared;
        let cpu = PerCpuGuard::cpu(pcs);
        // Is main empty?
        if pcs.main.is_empty() {
            if pcs.spare.as_ref().is_some_and(|s| !s.is_empty()) {
                // A non-empty spare: swap it in.
                let Sheaves { main, spare, .. } = &mut **pcs;
                std::mem::swap(main, spare.as_mut().expect("checked above"));
            } else {
                // Trade main for a full sheaf from the barn (barn_replace_empty_sheaf).
                let full = lock(&shared.barn).full.pop();
                match full {
                    Some(full) => {
                        let empty = std::mem::replace(&mut pcs.main, full);
                        shared.put_empty(empty);
                    }
                    None => {
                        // None there either: refill main from the slabs.
                        let mut slabs = lock(&shared.slabs);
                        let take = slabs.len().min(shared.capacity);
                        let at = slabs.len() - take;
                        pcs.main.extend(slabs.drain(at..));
                    }
                }
            }
        }
        let object = pcs.main.pop();
        shared.publish(cpu, pcs);
        object
    }

    /// `kmem_cache_free()` through `free_to_pcs()`: pushes `object` to the calling CPU's main
    /// sheaf, after making room when it is full. An object that is not allocated (freed
    /// already, or never handed out) is refused with [`WorkloadError::NotAllocated`] and
    /// changes nothing.
    pub fn kmem_cache_free(&self, object: Object) -> Result<(), WorkloadError> {
        self.take_back(object, Self::free_locked)
    }

    /// Takes `object` back from a caller of [`kmem_cache_alloc`](Self::kmem_cache_alloc):
    /// refuses an object the cache does not have or that no caller holds (a double free),
    /// otherwise hands it to `free` (one of the free paths) under the calling CPU's lock.
    fn take_back(
        &self,
        object: Object,
        free: fn(&Self, &mut PerCpuGuard<'_, Sheaves>, Object),
    ) -> Result<(), WorkloadError> {
        WorkloadError::check("object", object as usize, 0, self.shared.objects - 1)?;
        let mut pcs = self.shared.pcs.lock_local()?;
        if !self.shared.allocated.take_back(object as usize) {
            return Err(WorkloadError::NotAllocated {
                kind: "object",
                id: object.into(),
                alloc: "kmem_cache_alloc",
            });
        }
        free(self, &mut pcs, object);
        Ok(())
    }

    fn free_locked(&self, pcs: &mut PerCpuGuard<'_, Sheaves>, object: Object) {
        let shared = &*self.shared;
        let cpu = PerCpuGuard::cpu(pcs);
        // Is main full?
        if pcs.main.len() >= shared.capacity {
            match pcs.spare.as_ref().map(Vec::is_empty) {
                // An empty spare: swap it in.
                Some(true) => {
                    let Sheaves { main, spare, .. } = &mut **pcs;
                    std::mem::swap(main, spare.as_mut().expect("checked above"));
                }
                // No spare: main becomes the spare, an empty sheaf the main.
                None => {
                    let empty = lock(&shared.barn).empty.pop().unwrap_or_default();
                    let full = std::mem::replace(&mut pcs.main, empty);
                    pcs.spare = Some(full);
                }
                // A full spare: trade main for an empty sheaf from the barn
                // (barn_replace_full_sheaf), or flush it when the barn has enough full ones.
                Some(false) => {
                    let mut barn = lock(&shared.barn);
                    if barn.full.len() < MAX_FULL_SHEAVES {
                        let empty = barn.empty.pop().unwrap_or_default();
                        let full = std::mem::replace(&mut pcs.main, empty);
                        barn.full.push(full);
                    } else {
                        drop(barn);
                        shared.free_to_slabs(&mut pcs.main);
                    }
                }
            }
        }
        pcs.main.push(object);
        shared.publish(cpu, pcs);
    }

    /// `kfree_rcu()` through `__kfree_rcu_sheaf()`: puts `object` in the calling CPU's rcu
    /// sheaf, handed to `call_rcu()` when full.
    pub fn kfree_rcu(&self, object: Object) -> Result<(), WorkloadError> {
        self.take_back(object, Self::kfree_rcu_locked)
    }

    fn kfree_rcu_locked(&self, pcs: &mut PerCpuGuard<'_, Sheaves>, object: Object) {
        let shared = &*self.shared;
        let cpu = PerCpuGuard::cpu(pcs);
        if pcs.rcu_free.is_none() {
            pcs.rcu_free = Some(lock(&shared.barn).empty.pop().unwrap_or_default());
        }
        let rcu_free = pcs.rcu_free.as_mut().expect("just set");
        rcu_free.push(object);
        if rcu_free.len() >= shared.capacity {
            let full = pcs.rcu_free.take().expect("just filled");
            shared.call_rcu(full);
        }
        shared.publish(cpu, pcs);
    }

    /// `flush_all(s)`: flushes the sheaves of every CPU that has used ones.
    pub fn flush_all(&self) -> DrainOutcome {
        self.flush_all_inner(false, None)
    }

    fn flush_all_inner(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        let shared = &*self.shared;
        let _serialised = lock(&shared.flush_lock);
        drain_used_cpus(&self.flush_work, &shared.skips, force, timeout, |cpu| {
            shared.used[shared.skips.idx(cpu)].load(Ordering::Acquire)
        })
    }

    /// `flush_rcu_sheaves_on_cache(s)`: runs `flush_rcu_sheaf` on every CPU, queued to the CPU's
    /// worker in every mode, then `rcu_barrier()`.
    pub fn flush_rcu_sheaves_on_cache(&self) -> RcuFlush {
        let shared = &*self.shared;
        let outcome = {
            let _serialised = lock(&shared.flush_lock);
            for ran_on in &shared.rcu_flush_ran_on {
                ran_on.store(usize::MAX, Ordering::Relaxed);
            }
            DrainOutcome::from_report(self.rcu_work.drain_all(|_| true))
        };
        shared.rcu_barrier();
        let ran_on = shared
            .skips
            .cpus()
            .iter()
            .zip(&shared.rcu_flush_ran_on)
            .map(|(&cpu, ran_on)| {
                let phys = ran_on.load(Ordering::Acquire);
                (cpu, (phys != usize::MAX).then_some(phys))
            })
            .collect();
        RcuFlush { outcome, ran_on }
    }

    /// Chunks of at most `PCS_BATCH_MAX` objects that flushes of main sheaves have freed so
    /// far, each under one hold of the CPU's lock.
    pub fn flush_chunks(&self) -> u64 {
        self.shared.flush_chunks.load(Ordering::Relaxed)
    }

    /// Full sheaves in the barn.
    pub fn barn_full(&self) -> usize {
        lock(&self.shared.barn).full.len()
    }

    /// Free objects in the slabs.
    pub fn slab_free(&self) -> usize {
        lock(&self.shared.slabs).len()
    }

    /// Objects in each CPU's main and spare sheaves, in CPU order.
    pub fn sheaf_lens(&self) -> Vec<(usize, usize, usize)> {
        let mut lens = Vec::new();
        self.shared.pcs.for_each_locked(|cpu, pcs| {
            lens.push((cpu, pcs.main.len(), pcs.spare.as_ref().map_or(0, Vec::len)))
        });
        lens
    }
}

impl Workload for Slub {
    fn name(&self) -> &'static str {
        "slub"
    }

    /// A task on this CPU allocates eight objects, one per operation, then frees them, every
    /// fourth with `kfree_rcu()`.
    fn process_op(&self) -> Result<()> {
        let mut pcs = self.shared.pcs.lock_local()?;
        pcs.counters.local_ops += 1;
        let n = pcs.counters.local_ops as usize;
        if n % (2 * OP_MAX_HELD) < OP_MAX_HELD {
            if let Some(object) = self.alloc_locked(&mut pcs) {
                pcs.tasks.push_back(object);
            }
        } else if let Some(object) = pcs.tasks.pop_front() {
            if n.is_multiple_of(4) {
                self.kfree_rcu_locked(&mut pcs, object);
            } else {
                self.free_locked(&mut pcs, object);
            }
        }
        Ok(())
    }

    /// `flush_all(s)`; forced, every CPU is flushed, used sheaves or not.
    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        self.flush_all_inner(force, timeout)
    }

    fn counters(&self) -> Vec<CpuCounters> {
        let shared = &*self.shared;
        shared.skips.merge(&shared.pcs, |pcs| pcs.counters)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let shared = &*self.shared;
        let mut place: Vec<Option<String>> = vec![None; shared.objects];
        let mut problems = Vec::new();
        let mut put = |sheaf: &[Object], here: &str, problems: &mut Vec<String>| {
            for &object in sheaf {
                match place.get_mut(object as usize) {
                    None => problems.push(format!(
                        "{here} holds object {object}, which does not exist"
                    )),
                    Some(Some(there)) => {
                        problems.push(format!("object {object} is both in {there} and in {here}"))
                    }
                    Some(slot) => *slot = Some(here.to_string()),
                }
            }
        };
        let capacity = shared.capacity;
        let oversize = |len: usize, what: &str, problems: &mut Vec<String>| {
            if len > capacity {
                problems.push(format!("{what} holds {len} objects, more than {capacity}"));
            }
        };
        shared.pcs.for_each_locked(|cpu, pcs| {
            let here = format!("cpu {cpu}");
            put(&pcs.main, &format!("{here}'s main sheaf"), &mut problems);
            oversize(
                pcs.main.len(),
                &format!("{here}'s main sheaf"),
                &mut problems,
            );
            if let Some(spare) = &pcs.spare {
                put(spare, &format!("{here}'s spare sheaf"), &mut problems);
                oversize(spare.len(), &format!("{here}'s spare sheaf"), &mut problems);
            }
            if let Some(rcu_free) = &pcs.rcu_free {
                put(rcu_free, &format!("{here}'s rcu sheaf"), &mut problems);
                oversize(
                    rcu_free.len(),
                    &format!("{here}'s rcu sheaf"),
                    &mut problems,
                );
            }
            put(
                pcs.tasks.make_contiguous(),
                &format!("a task of {here}"),
                &mut problems,
            );
            if shared.used[shared.skips.idx(cpu)].load(Ordering::Acquire) != pcs.used() {
                problems.push(format!("{here}'s has_pcs_used hint is stale"));
            }
        });
        {
            let barn = lock(&shared.barn);
            for sheaf in &barn.full {
                put(sheaf, "a full barn sheaf", &mut problems);
                if sheaf.len() != capacity {
                    problems.push(format!("a full barn sheaf holds {} objects", sheaf.len()));
                }
            }
            if barn.empty.iter().any(|s| !s.is_empty()) {
                problems.push("an empty barn sheaf holds objects".to_string());
            }
        }
        for sheaf in lock(&shared.rcu_pending).iter() {
            put(sheaf, "a sheaf waiting for RCU", &mut problems);
        }
        put(&lock(&shared.slabs), "the slabs", &mut problems);
        // The objects the callers of kmem_cache_alloc hold are the ones the workload cannot see.
        let unseen = place.iter().filter(|p| p.is_none()).count();
        let outstanding = shared.allocated.count();
        if unseen != outstanding {
            problems.push(format!(
                "{unseen} of {} objects are nowhere, but callers hold {outstanding}",
                shared.objects
            ));
        }
        conservation_verdict(problems)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::test_support::remote;

    #[test]
    fn sheaves_rotate_through_spare_and_barn() {
        let qpw = remote(1);
        let slub = Slub::new(
            &qpw,
            SlubConfig {
                sheaf_capacity: 4,
                batch_max: 2,
                objects: 64,
            },
        )
        .unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        let objects: Vec<Object> = (0..12)
            .map(|_| slub.kmem_cache_alloc().unwrap().unwrap())
            .collect();
        assert_eq!(slub.slab_free(), 52); // three refills of 4
        for &object in &objects {
            slub.kmem_cache_free(object).unwrap();
        }
        // 4 in main, a full spare, and one full sheaf traded into the barn.
        assert_eq!(slub.sheaf_lens(), [(0, 4, 4)]);
        assert_eq!(lock(&slub.shared.barn).full.len(), 1);
        slub.check_conservation().unwrap();
        // The flush takes main in chunks of 2, and the spare.
        let outcome = slub.flush_all();
        assert_eq!(outcome.ran_remote, 1);
        assert_eq!(slub.sheaf_lens(), [(0, 0, 0)]);
        assert_eq!(slub.slab_free(), 60);
        slub.check_conservation().unwrap();
    }

    /// `sheaf_flush_main()` releases the CPU's lock between chunks of `PCS_BATCH_MAX`: with the
    /// flush stopped after its first chunk (it waits for the slabs' lock, which this test
    /// holds), a thread of the CPU takes the CPU's lock and frees an object into the sheaf
    /// being flushed; the flush then goes on, and takes that object too. In both modes: the
    /// flush runs in the requester (remote) or on the CPU's worker (queue).
    #[test]
    fn another_thread_takes_the_lock_between_two_chunks_of_one_flush() {
        for policy in [qpw_core::Policy::Remote, qpw_core::Policy::Queue] {
            let qpw = qpw_core::Qpw::builder()
                .cpus(qpw_core::CpuSpec::Logical(2))
                .policy(policy.clone())
                .build()
                .unwrap();
            let slub = Slub::new(
                &qpw,
                SlubConfig {
                    sheaf_capacity: 3 * PCS_BATCH_MAX,
                    batch_max: PCS_BATCH_MAX,
                    objects: 1024,
                },
            )
            .unwrap();
            let kept = {
                let _bound = qpw.bind_current(1).unwrap();
                let objects: Vec<Object> = (0..3 * PCS_BATCH_MAX)
                    .map(|_| slub.kmem_cache_alloc().unwrap().unwrap())
                    .collect();
                for &object in &objects[1..] {
                    slub.kmem_cache_free(object).unwrap();
                }
                objects[0]
            };
            assert_eq!(slub.sheaf_lens()[1], (1, 3 * PCS_BATCH_MAX - 1, 0));
            std::thread::scope(|s| {
                let slabs = lock(&slub.shared.slabs);
                let flusher = s.spawn(|| slub.flush_all());
                // Wait for the first chunk: taken under the CPU's lock, then the flush waits
                // for the slabs.
                while slub.flush_chunks() < 1 {
                    std::thread::yield_now();
                }
                let _bound = qpw.bind_current(1).unwrap();
                {
                    let pcs = slub.shared.pcs.try_lock(1).unwrap();
                    let pcs = pcs.expect("the flush kept the CPU's lock between chunks");
                    assert_eq!(pcs.main.len(), 2 * PCS_BATCH_MAX - 1, "{policy:?}");
                }
                slub.kmem_cache_free(kept).unwrap();
                drop(slabs);
                let outcome = flusher.join().unwrap();
                assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
            });
            assert_eq!(slub.flush_chunks(), 3, "{policy:?}");
            assert_eq!(slub.sheaf_lens()[1], (1, 0, 0), "{policy:?}");
            assert_eq!(slub.slab_free(), 1024);
            slub.check_conservation().unwrap();
        }
    }

    #[test]
    fn rcu_sheaf_goes_through_a_grace_period() {
        let qpw = remote(1);
        let slub = Slub::new(
            &qpw,
            SlubConfig {
                sheaf_capacity: 2,
                batch_max: 2,
                objects: 8,
            },
        )
        .unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        let a = slub.kmem_cache_alloc().unwrap().unwrap();
        let b = slub.kmem_cache_alloc().unwrap().unwrap();
        slub.kfree_rcu(a).unwrap();
        slub.kfree_rcu(b).unwrap(); // full: handed to call_rcu
        assert_eq!(lock(&slub.shared.rcu_pending).len(), 1);
        slub.check_conservation().unwrap();
        slub.shared.rcu_barrier();
        assert_eq!(slub.slab_free(), 8);
        slub.check_conservation().unwrap();
        let err = slub.kmem_cache_free(8).unwrap_err().to_string();
        assert_eq!(err, "object = 8 is out of range: the legal range is 0-7");
    }
}
