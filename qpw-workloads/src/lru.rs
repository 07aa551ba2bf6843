//! LRU folio batches (`mm/swap.c`) and the buffer-head LRU (`fs/buffer.c`): per-CPU batches in
//! front of a global LRU list, per-CPU caches of buffer heads, and the drain-all that empties
//! them.
//!
//! # What the kernel does
//!
//! A new folio does not go onto its LRU list at once: `folio_add_lru()` puts it in the
//! calling CPU's `cpu_fbatches.lru_add` batch, and only when the batch is full
//! (`folio_batch_add()` returns 0 slots left: `FOLIO_BATCH_SIZE` = 31 folios since 2024, 15
//! before, in `include/linux/pagevec.h`) does `folio_batch_move_lru()` move the whole batch
//! under `lru_lock`. Moves within the LRU are batched the same way: `folio_deactivate()`
//! (`lru_deactivate`), `deactivate_file_folio()`, `folio_mark_lazyfree()`, `folio_activate()`,
//! and `folio_rotate_reclaimable()` (`lru_move_tail`, called when writeback ends, from
//! interrupt context). So `struct cpu_fbatches` has six batches under **two** local locks:
//! `lock` for the five that process context fills, and `lock_irq` (interrupts off) for
//! `lru_move_tail` alone, so that an interrupt can batch a rotation while the task it
//! interrupted holds `lock`. The drain of a CPU (`lru_add_drain_cpu()`) runs under `lock` and
//! takes `lock_irq` inside it for `lru_move_tail`.
//!
//! Each CPU also caches the 16 (`BH_LRU_SIZE`) buffer heads it looked up last
//! (`bh_lrus`), each holding a reference that pins its page (and so can make a migration
//! fail). It is guarded by `bh_lru_lock()`, which is `local_irq_disable()`: no lock another
//! CPU could take. Mainline does not cache buffer heads on isolated CPUs at all
//! (`bh_lru_install()` and `lookup_bh_lru()` check `cpu_is_isolated()`).
//!
//! Whoever needs every folio on the LRU (migration, mlock, CMA, memory hotplug) runs
//! `lru_add_drain_all()` (`__lru_add_drain_all(false)`):
//!
//! 1. snapshot the drain generation `lru_drain_gen` (after a full barrier);
//! 2. drain the caller's own batches; take the drain mutex; if the generation has moved
//!    meanwhile, a drain that *started after our snapshot* has already covered every folio we
//!    could care about: return at once;
//! 3. bump the generation, then queue `lru_add_drain_per_cpu` only on the CPUs that need it
//!    (`cpu_needs_drain()`, a racy peek: a non-empty batch, or a buffer head in `bh_lrus`);
//! 4. `flush_work()` each of them, and release the mutex.
//!
//! The work (`lru_add_and_bh_lrus_drain()`) drains the batches and then invalidates the CPU's
//! buffer-head LRU (`invalidate_bh_lrus_cpu()`), on the CPU. `lru_cache_disable()` calls
//! `__lru_add_drain_all(true)`, which never skips on the generation.
//!
//! # The two modes
//!
//! The batches' drain is a [`PerCpuWork`] from the [`Qpw`] instance: queued to the CPU's worker
//! in mode 0, run by the requester under the CPU's two locks in mode 1, as the QPW patches
//! convert `lru_add_drain_per_cpu`. The buffer-head LRU cannot be reached that way (its lock is
//! "interrupts off on that CPU"), so it stays a queued work item in both modes
//! ([`Qpw::work_on_cpu`]): in mode 0 one worker run does both, as in mainline; in mode 1 the
//! batches are drained remotely and, on a CPU whose buffer-head LRU holds something, the
//! invalidation is still queued to its worker and flushed. Such a CPU counts as both queued
//! and run remotely in the [`DrainOutcome`].
//!
//! # What this model keeps, and what it simplifies
//!
//! [`Lru::folio_add_lru`], [`Lru::folio_deactivate`], [`Lru::folio_rotate_reclaimable`],
//! [`Lru::bh_lookup`], [`Lru::lru_add_drain`], [`Lru::lru_add_drain_all`] and
//! [`Lru::lru_cache_disable`] keep the kernel's names and steps. The batch size is a parameter
//! ([`FOLIO_BATCH_SIZE`], [`FOLIO_BATCH_SIZE_BEFORE_2024`]).
//!
//! Simplified: three of the six batches (`lru_add` and `lru_deactivate` under `lock`,
//! `lru_move_tail` under `lock_irq`; `lru_deactivate_file`, `lru_lazyfree` and `lru_activate`
//! would sit under `lock` beside `lru_deactivate` and drain the same way); one LRU list in add
//! order instead of per-node, per-memcg active and inactive lists, on which a deactivation or a
//! rotation is counted, not carried out (the drain protocol does not depend on the order);
//! folios are bare ids and never leave the LRU, so `folio_test_lru()` is "added, and no longer
//! in its CPU's `lru_add` batch"; buffer heads are bare block numbers and their references a
//! count per block; no mlock batches. Reading another CPU's batch counts without its lock is
//! forbidden in Rust: each CPU publishes them in atomic hints instead, written by the owner
//! under its lock and read by drainers (with the kernel's full barriers as `SeqCst`). The
//! caller's own batches are drained first, directly, so the remote part concerns only the other
//! CPUs (its own buffer-head LRU is left to the per-CPU pass, as in mainline's
//! `lru_add_drain()`, which does not touch it). `lru_cache_disable()` does not raise
//! `lru_disable_count` here (adds keep batching), and its drain, like the trait's forced
//! drain, reaches every CPU's batches, empty or not (ours: mainline's `force_all_cpus` only
//! skips the generation test); a forced drain queues the buffer-head invalidation only where
//! the buffer-head LRU looks used, as an unforced one does. [`Workload::process_op`] adds
//! folios, and rotates and deactivates some; it does not look buffer heads up, so that a
//! remote-mode CPU of the emulator (a stand-in for an isolated CPU, whose buffer-head LRU
//! mainline keeps empty) gets no queued work from the LRU.
//!
//! # Conservation
//!
//! Every folio added is in exactly one place: a CPU's `lru_add` batch or the LRU list. Folios
//! are made by `folio_add_lru` itself, numbered per CPU, so the law is checked exactly: CPU
//! `c`'s `n`-th add is folio `(c, n)`, and the batches plus the LRU hold each `(c, 1..=adds[c])`
//! once. Every deactivation and rotation accepted is either waiting in a batch, naming a folio
//! on the LRU, or counted as carried out on the LRU. Every buffer-head reference is held by
//! exactly one CPU's buffer-head LRU, and no LRU holds a block twice.

use std::time::{Duration, Instant};

use qpw_core::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};
use qpw_core::{CpuSet, PerCpu, PerCpuGuard, PerCpuWork, Qpw, Result, WorkCtx};

use crate::{
    conservation_verdict, lock, CpuCounters, CpuLockHeld, DrainOutcome, DrainPass, OwnerCounters,
    SkipCounters, Workload, WorkloadError,
};

/// `FOLIO_BATCH_SIZE` (`include/linux/pagevec.h`): folios per batch since 2024.
pub const FOLIO_BATCH_SIZE: usize = 31;

/// `FOLIO_BATCH_SIZE` before 2024 (`PAGEVEC_SIZE`, 15).
pub const FOLIO_BATCH_SIZE_BEFORE_2024: usize = 15;

/// The largest batch size accepted.
pub const MAX_BATCH_SIZE: usize = 4096;

/// `BH_LRU_SIZE` (`fs/buffer.c`): buffer heads each CPU's buffer-head LRU caches.
pub const BH_LRU_SIZE: usize = 16;

/// A folio: the CPU that added it and the add's number on that CPU (from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Folio {
    /// The CPU whose `folio_add_lru` made it.
    pub cpu: usize,
    /// Its number among that CPU's adds, from 1.
    pub seq: u64,
}

/// The LRU list keeps this many folios by default, the newest; older ones are reclaimed
/// (dropped, and counted per CPU for the conservation law), so that a run of hours holds 16 MiB
/// of them instead of growing by the adds' rate (millions a second) for as long as it runs.
pub const LRU_KEEPS: usize = 1 << 20;

/// A buffer head, by the number of its block.
pub type Block = u32;

/// The LRU workload's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LruConfig {
    /// Folios per batch (`FOLIO_BATCH_SIZE`), 1 to [`MAX_BATCH_SIZE`].
    pub batch_size: usize,
    /// Blocks whose buffer heads [`Lru::bh_lookup`] can look up, 1 to 1 << 20.
    pub blocks: usize,
    /// Folios the LRU list keeps, the newest (default [`LRU_KEEPS`]), 1 to 1 << 28.
    pub lru_keeps: usize,
}

impl Default for LruConfig {
    fn default() -> Self {
        Self {
            batch_size: FOLIO_BATCH_SIZE,
            blocks: 1024,
            lru_keeps: LRU_KEEPS,
        }
    }
}

/// One CPU's `cpu_fbatches` batches under `lock`, with the CPU's counters.
#[derive(Debug)]
struct Fbatches {
    lru_add: Vec<Folio>,
    lru_deactivate: Vec<Folio>,
    /// Folios this CPU added: the number of its newest.
    adds: u64,
    /// Deactivations this CPU batched.
    deactivations: u64,
    counters: OwnerCounters,
}

/// One CPU's `cpu_fbatches` batch under `lock_irq`.
#[derive(Debug)]
struct FbatchesIrq {
    lru_move_tail: Vec<Folio>,
    /// Rotations this CPU batched.
    rotations: u64,
    /// Calls of [`Lru::folio_rotate_reclaimable`] on this CPU (local operations).
    ops: u64,
}

/// One CPU's `bh_lrus`, under `bh_lru_lock()`: taken only on the CPU (its own threads and its
/// worker), never remotely.
#[derive(Debug)]
struct BhLru {
    /// The cached blocks, most recent first.
    bhs: Vec<Block>,
    /// Calls of [`Lru::bh_lookup`] on this CPU (local operations).
    ops: u64,
}

/// The LRU list, behind `lru_lock`.
#[derive(Debug, Default)]
struct Lruvec {
    folios: std::collections::VecDeque<Folio>,
    /// Folios reclaimed from the LRU's old end, by CPU index (see [`LRU_KEEPS`]).
    reclaimed: Vec<u64>,
    /// Deactivations carried out (`lru_deactivate`).
    deactivated: u64,
    /// Rotations to the tail carried out (`lru_move_tail`).
    rotated: u64,
}

/// A snapshot of the drain generation, step 1 of `__lru_add_drain_all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainGen(u64);

#[derive(Debug)]
struct Shared {
    batch_size: usize,
    blocks: usize,
    /// Folios the LRU list keeps ([`LruConfig::lru_keeps`]).
    lru_keeps: usize,
    /// `cpu_fbatches` under `lock`.
    fbatches: PerCpu<Fbatches>,
    /// `cpu_fbatches` under `lock_irq`.
    fbatches_irq: PerCpu<FbatchesIrq>,
    bh_lrus: PerCpu<BhLru>,
    /// Per CPU (by slot): folios in the batches under `lock`, stored by the owner under it;
    /// read racily by drainers, as `cpu_needs_drain()` reads `folio_batch_count()`.
    hints: Vec<AtomicUsize>,
    /// Per CPU: folios in `lru_move_tail`, stored under `lock_irq`.
    irq_hints: Vec<AtomicUsize>,
    /// Per CPU: `has_bh_in_lru()`, stored under `bh_lru_lock()`.
    bh_hints: Vec<AtomicBool>,
    /// Per CPU: the number of its newest folio on the LRU (its older ones are there too):
    /// `folio_test_lru()` for the folios it added.
    on_lru: Vec<AtomicU64>,
    /// Per block: the references the CPUs' buffer-head LRUs hold.
    bh_refs: Vec<AtomicU64>,
    /// Per CPU: runs of the buffer-head invalidation queued on its own (remote-mode CPUs).
    bh_runs: Vec<AtomicU64>,
    /// The managed CPUs whose physical CPU is isolated: no buffer heads are cached there.
    isolated: CpuSet,
    lru: Mutex<Lruvec>,
    /// `lru_drain_gen`.
    gen: AtomicU64,
    /// The static `lock` of `__lru_add_drain_all`.
    drain_lock: Mutex<()>,
    skips: SkipCounters,
}

impl Shared {
    fn publish(&self, cpu: usize, fb: &Fbatches) {
        let len = fb.lru_add.len() + fb.lru_deactivate.len();
        self.hints[self.skips.idx(cpu)].store(len, Ordering::SeqCst);
    }

    fn publish_irq(&self, cpu: usize, irq: &FbatchesIrq) {
        self.irq_hints[self.skips.idx(cpu)].store(irq.lru_move_tail.len(), Ordering::SeqCst);
    }

    fn publish_bh(&self, cpu: usize, bh: &BhLru) {
        self.bh_hints[self.skips.idx(cpu)].store(!bh.bhs.is_empty(), Ordering::SeqCst);
    }

    /// `folio_test_lru()`: whether `folio` (of a managed CPU) has reached the LRU.
    fn folio_test_lru(&self, folio: Folio) -> bool {
        folio.seq <= self.on_lru[self.skips.idx(folio.cpu)].load(Ordering::Acquire)
    }

    /// `folio_batch_move_lru(lru_add)`: `cpu`'s `lru_add` batch onto the LRU, under `lru_lock`.
    fn move_added(&self, cpu: usize, fb: &mut Fbatches) {
        let Some(newest) = fb.lru_add.last().map(|f| f.seq) else {
            return;
        };
        let mut lru = lock(&self.lru);
        lru.folios.extend(fb.lru_add.drain(..));
        // Reclaim as many old folios as came in: the list stays at `lru_keeps`.
        while lru.folios.len() > self.lru_keeps {
            let Some(old) = lru.folios.pop_front() else {
                break;
            };
            let idx = self.skips.idx(old.cpu);
            if lru.reclaimed.len() <= idx {
                lru.reclaimed.resize(idx + 1, 0);
            }
            lru.reclaimed[idx] += 1;
        }
        drop(lru);
        self.on_lru[self.skips.idx(cpu)].store(newest, Ordering::Release);
    }

    /// `folio_batch_move_lru(lru_deactivate)`.
    fn move_deactivated(&self, fb: &mut Fbatches) {
        if !fb.lru_deactivate.is_empty() {
            lock(&self.lru).deactivated += fb.lru_deactivate.len() as u64;
            fb.lru_deactivate.clear();
        }
    }

    /// `folio_batch_move_lru(lru_move_tail)`.
    fn move_to_tail(&self, irq: &mut FbatchesIrq) {
        if !irq.lru_move_tail.is_empty() {
            lock(&self.lru).rotated += irq.lru_move_tail.len() as u64;
            irq.lru_move_tail.clear();
        }
    }

    /// `lru_add_drain_cpu()`: every batch of `cpu`, whose `lock` (`fb`) and, inside it,
    /// `lock_irq` (`irq`) the caller holds.
    fn lru_add_drain_cpu(&self, cpu: usize, fb: &mut Fbatches, irq: &mut FbatchesIrq) {
        self.move_added(cpu, fb);
        self.move_to_tail(irq);
        self.publish_irq(cpu, irq);
        self.move_deactivated(fb);
        self.publish(cpu, fb);
    }

    /// `lru_add_drain_per_cpu()`: the work item, run for `ctx.cpu()` wherever it runs. On the
    /// CPU (queued), it invalidates the buffer-head LRU too (`lru_add_and_bh_lrus_drain()`).
    fn lru_add_drain_per_cpu(&self, ctx: &WorkCtx) {
        {
            // A remote run past its drain's deadline gives up here: the drain reports it.
            let Ok(mut fb) = self.fbatches.lock_work(ctx) else {
                return;
            };
            fb.counters.drained(ctx);
            let Ok(mut irq) = self.fbatches_irq.lock_work(ctx) else {
                return;
            };
            self.lru_add_drain_cpu(ctx.cpu(), &mut fb, &mut irq);
        }
        if ctx.is_queued() {
            self.invalidate_bh_lrus_cpu(ctx);
        }
    }

    /// The buffer-head invalidation queued on its own, to a remote-mode CPU's worker.
    fn invalidate_bh_lrus_work(&self, ctx: &WorkCtx) {
        debug_assert!(ctx.is_queued(), "the bh LRU is only reached on its CPU");
        self.bh_runs[self.skips.idx(ctx.cpu())].fetch_add(1, Ordering::Relaxed);
        self.invalidate_bh_lrus_cpu(ctx);
    }

    /// `invalidate_bh_lrus_cpu()`: drops every buffer head `ctx.cpu()` caches, on that CPU.
    fn invalidate_bh_lrus_cpu(&self, ctx: &WorkCtx) {
        let Ok(mut bh) = self.bh_lrus.lock_work(ctx) else {
            return; // a remote run past its drain's deadline: the drain reports it
        };
        for block in bh.bhs.drain(..) {
            self.bh_refs[block as usize].fetch_sub(1, Ordering::Relaxed);
        }
        self.publish_bh(ctx.cpu(), &bh);
    }
}

/// Per-CPU folio batches over one LRU list, and per-CPU buffer-head LRUs.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
/// use qpw_workloads::lru::{Lru, LruConfig};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
/// let lru = Lru::new(&qpw, LruConfig { batch_size: 4, ..LruConfig::default() })?;
/// {
///     let _bound = qpw.bind_current(1)?;
///     lru.folio_add_lru()?;
/// }
/// assert_eq!(lru.lru_len(), 0); // still in cpu 1's batch
/// let outcome = lru.lru_add_drain_all();
/// assert_eq!((outcome.ran_remote, outcome.skipped_cpus), (1, 1)); // cpu 0 was empty
/// assert_eq!(lru.lru_len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Lru {
    shared: Arc<Shared>,
    /// `lru_add_drain_per_cpu`: queued in mode 0, run remotely in mode 1.
    work: PerCpuWork,
    /// `invalidate_bh_lrus_cpu` on its own: queued in every mode.
    bh_work: PerCpuWork,
}

impl Lru {
    /// Per-CPU batches and buffer-head LRUs on `qpw`'s CPUs, and the two drain work items (the
    /// buffer-head one starts a worker on every remote-mode CPU).
    pub fn new(qpw: &Qpw, config: LruConfig) -> Result<Self, WorkloadError> {
        WorkloadError::check("FOLIO_BATCH_SIZE", config.batch_size, 1, MAX_BATCH_SIZE)?;
        WorkloadError::check("blocks", config.blocks, 1, 1 << 20)?;
        WorkloadError::check("lru_keeps", config.lru_keeps, 1, 1 << 28)?;
        let mut isolated = CpuSet::new();
        for cpu in qpw.cpus().iter() {
            if qpw.isolated().contains(qpw.physical_cpu(cpu)?) {
                isolated.insert(cpu);
            }
        }
        let nr_cpus = qpw.cpus().len();
        let batch_size = config.batch_size;
        let shared = Arc::new(Shared {
            batch_size,
            blocks: config.blocks,
            lru_keeps: config.lru_keeps,
            fbatches: qpw.per_cpu(|_| Fbatches {
                lru_add: Vec::with_capacity(batch_size),
                lru_deactivate: Vec::with_capacity(batch_size),
                adds: 0,
                deactivations: 0,
                counters: OwnerCounters::default(),
            }),
            fbatches_irq: qpw.per_cpu(|_| FbatchesIrq {
                lru_move_tail: Vec::with_capacity(batch_size),
                rotations: 0,
                ops: 0,
            }),
            bh_lrus: qpw.per_cpu(|_| BhLru {
                bhs: Vec::with_capacity(BH_LRU_SIZE + 1),
                ops: 0,
            }),
            hints: (0..nr_cpus).map(|_| AtomicUsize::new(0)).collect(),
            irq_hints: (0..nr_cpus).map(|_| AtomicUsize::new(0)).collect(),
            bh_hints: (0..nr_cpus).map(|_| AtomicBool::new(false)).collect(),
            on_lru: (0..nr_cpus).map(|_| AtomicU64::new(0)).collect(),
            bh_refs: (0..config.blocks).map(|_| AtomicU64::new(0)).collect(),
            bh_runs: (0..nr_cpus).map(|_| AtomicU64::new(0)).collect(),
            isolated,
            lru: Mutex::new(Lruvec::default()),
            gen: AtomicU64::new(0),
            drain_lock: Mutex::new(()),
            skips: SkipCounters::new(qpw.cpus()),
        });
        let for_work = shared.clone();
        let work = qpw.work(move |ctx| for_work.lru_add_drain_per_cpu(ctx))?;
        let for_bh = shared.clone();
        let bh_work = qpw.work_on_cpu(move |ctx| for_bh.invalidate_bh_lrus_work(ctx))?;
        Ok(Self {
            shared,
            work,
            bh_work,
        })
    }

    /// Folios per batch.
    pub fn batch_size(&self) -> usize {
        self.shared.batch_size
    }

    /// The managed CPUs whose physical CPU is isolated, where no buffer head is cached.
    pub fn isolated_cpus(&self) -> &CpuSet {
        &self.shared.isolated
    }

    fn check_folio(&self, folio: Folio) -> Result<(), WorkloadError> {
        let cpus = self.shared.skips.cpus();
        if folio.seq > 0 && cpus.binary_search(&folio.cpu).is_ok() {
            return Ok(());
        }
        let managed: Vec<String> = cpus.iter().map(ToString::to_string).collect();
        Err(WorkloadError::NoSuchFolio {
            folio: format!("({}, {})", folio.cpu, folio.seq),
            managed: format!("{{{}}}", managed.join(",")),
        })
    }

    /// `folio_add_lru()`: makes a new folio and adds it to the calling CPU's `lru_add` batch,
    /// under `lock`; a full batch moves to the LRU under `lru_lock`. Fails only when the thread
    /// has no CPU of the instance.
    #[inline]
    pub fn folio_add_lru(&self) -> Result<Folio> {
        let mut fb = self.shared.fbatches.lock_local()?;
        let cpu = PerCpuGuard::cpu(&fb);
        fb.counters.local_ops += 1;
        Ok(self.add_locked(cpu, &mut fb))
    }

    fn add_locked(&self, cpu: usize, fb: &mut Fbatches) -> Folio {
        let shared = &*self.shared;
        fb.adds += 1;
        let folio = Folio { cpu, seq: fb.adds };
        fb.lru_add.push(folio);
        // Is the batch full (folio_batch_add() left no slot)?
        if fb.lru_add.len() >= shared.batch_size {
            // Yes: move it to the LRU under lru_lock.
            shared.move_added(cpu, fb);
        }
        shared.publish(cpu, fb);
        folio
    }

    /// `folio_deactivate()`: batches `folio` in the calling CPU's `lru_deactivate` batch, under
    /// `lock`; `false` (and nothing batched) when the folio is not on the LRU yet
    /// (`!folio_test_lru()`). A folio no CPU of the instance could have added is an error.
    pub fn folio_deactivate(&self, folio: Folio) -> Result<bool, WorkloadError> {
        self.check_folio(folio)?;
        let mut fb = self.shared.fbatches.lock_local()?;
        let cpu = PerCpuGuard::cpu(&fb);
        fb.counters.local_ops += 1;
        Ok(self.deactivate_locked(cpu, &mut fb, folio))
    }

    fn deactivate_locked(&self, cpu: usize, fb: &mut Fbatches, folio: Folio) -> bool {
        let shared = &*self.shared;
        if !shared.folio_test_lru(folio) {
            return false;
        }
        fb.deactivations += 1;
        fb.lru_deactivate.push(folio);
        if fb.lru_deactivate.len() >= shared.batch_size {
            shared.move_deactivated(fb);
        }
        shared.publish(cpu, fb);
        true
    }

    /// `folio_rotate_reclaimable()`: batches `folio` in the calling CPU's `lru_move_tail`
    /// batch, under `lock_irq` only (the kernel calls it from interrupt context, at the end of
    /// writeback), so it goes through while a task of the CPU holds `lock`; `false` (and
    /// nothing batched) when the folio is not on the LRU yet. A folio no CPU of the instance
    /// could have added is an error.
    pub fn folio_rotate_reclaimable(&self, folio: Folio) -> Result<bool, WorkloadError> {
        self.check_folio(folio)?;
        let mut irq = self.shared.fbatches_irq.lock_local()?;
        let cpu = PerCpuGuard::cpu(&irq);
        irq.ops += 1;
        Ok(self.rotate_locked(cpu, &mut irq, folio))
    }

    fn rotate_locked(&self, cpu: usize, irq: &mut FbatchesIrq, folio: Folio) -> bool {
        let shared = &*self.shared;
        if !shared.folio_test_lru(folio) {
            return false;
        }
        irq.rotations += 1;
        irq.lru_move_tail.push(folio);
        if irq.lru_move_tail.len() >= shared.batch_size {
            shared.move_to_tail(irq);
        }
        shared.publish_irq(cpu, irq);
        true
    }

    /// `__find_get_block()`'s buffer-head LRU: looks `block` up in the calling CPU's
    /// buffer-head LRU (`lookup_bh_lru()`), moving it to the front on a hit, and installs it on
    /// a miss (`bh_lru_install()`: a reference taken, the least recent one dropped past
    /// [`BH_LRU_SIZE`]). Returns whether it hit. On an isolated CPU nothing is cached (mainline's
    /// `cpu_is_isolated()` checks). A block past the configured ones is an error.
    pub fn bh_lookup(&self, block: Block) -> Result<bool, WorkloadError> {
        let shared = &*self.shared;
        WorkloadError::check("block", block as usize, 0, shared.blocks - 1)?;
        let mut bh = shared.bh_lrus.lock_local()?;
        let cpu = PerCpuGuard::cpu(&bh);
        bh.ops += 1;
        if shared.isolated.contains(cpu) {
            return Ok(false);
        }
        // Is it cached? Then to the front.
        if let Some(i) = bh.bhs.iter().position(|&b| b == block) {
            bh.bhs[..=i].rotate_right(1);
            return Ok(true);
        }
        // No: install it at the front, evicting the least recent one when full.
        shared.bh_refs[block as usize].fetch_add(1, Ordering::Relaxed);
        bh.bhs.insert(0, block);
        if bh.bhs.len() > BH_LRU_SIZE {
            if let Some(evicted) = bh.bhs.pop() {
                shared.bh_refs[evicted as usize].fetch_sub(1, Ordering::Relaxed);
            }
        }
        shared.publish_bh(cpu, &bh);
        Ok(false)
    }

    /// `lru_add_drain()`: moves the calling CPU's batches to the LRU (not its buffer heads).
    pub fn lru_add_drain(&self) -> Result<()> {
        let shared = &*self.shared;
        let mut fb = shared.fbatches.lock_local()?;
        let cpu = PerCpuGuard::cpu(&fb);
        let mut irq = shared.fbatches_irq.lock_local()?;
        shared.lru_add_drain_cpu(cpu, &mut fb, &mut irq);
        Ok(())
    }

    /// `lru_add_drain_all()` (`__lru_add_drain_all(false)`): drains the caller's batches, then
    /// every CPU whose batches are non-empty or whose buffer-head LRU holds a buffer head, unless
    /// a drain that started after this call already did.
    pub fn lru_add_drain_all(&self) -> DrainOutcome {
        self.drain_all(false, None)
    }

    /// `lru_cache_disable()`'s drain (`__lru_add_drain_all(true)`): never skips on the
    /// generation, and reaches every CPU's batches, empty or not.
    pub fn lru_cache_disable(&self) -> DrainOutcome {
        self.drain_all(true, None)
    }

    fn drain_all(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        // The caller's own batches first, directly; an unbound caller has none.
        let _ = self.lru_add_drain();
        let gen = self.drain_generation();
        self.lru_add_drain_all_from(gen, force, timeout)
    }

    /// Step 1 of `__lru_add_drain_all`: the drain generation, read after a full barrier so
    /// that this thread's batch stores are visible to whoever bumps it next.
    pub fn drain_generation(&self) -> DrainGen {
        // The kernel's smp_mb() + smp_load_acquire(), as a read-modify-write that changes
        // nothing: it takes its place in the word's modification order, so a drain that bumps
        // the generation after it reads from it (release/acquire) and sees our batch's hint.
        // A plain SeqCst load would do on hardware, but loom models SeqCst loads as acquire
        // loads only, and its model of this protocol found the missed folio that allows.
        DrainGen(self.shared.gen.fetch_add(0, Ordering::SeqCst))
    }

    /// Steps 2-4 of `__lru_add_drain_all`, for a generation snapshot taken earlier with
    /// [`drain_generation`](Self::drain_generation): a caller that took its snapshot and then
    /// waited on the mutex while another drain ran is modelled by calling this after that
    /// drain. Returns at once ([`DrainOutcome::skipped`]) when the generation has moved and
    /// `force` is false.
    pub fn lru_add_drain_all_from(
        &self,
        this_gen: DrainGen,
        force: bool,
        timeout: Option<Duration>,
    ) -> DrainOutcome {
        let start = Instant::now();
        let shared = &*self.shared;
        let _serialised = lock(&shared.drain_lock);

        // (B) Has a drain that started after our snapshot already run?
        if this_gen.0 != shared.gen.load(Ordering::SeqCst) && !force {
            // Yes: it saw every folio added before our call.
            return DrainOutcome::whole_drain_skipped();
        }
        // (C) No: start a new generation, so that callers that snapshot the old one and wait
        // on the mutex behind us can skip.
        shared.gen.fetch_add(1, Ordering::SeqCst);

        // Queue only on the CPUs that look like they need it (cpu_needs_drain), then flush.
        let mut pass = DrainPass::new();
        for &cpu in shared.skips.cpus() {
            let idx = shared.skips.idx(cpu);
            let batches = shared.hints[idx].load(Ordering::SeqCst) > 0
                || shared.irq_hints[idx].load(Ordering::SeqCst) > 0;
            let bhs = shared.bh_hints[idx].load(Ordering::SeqCst);
            // Does the batches' work run on the CPU (mode 0)? Then it takes the buffer heads
            // too; in mode 1 they need a work of their own, queued all the same.
            let on_cpu = matches!(self.work.is_queued(cpu), Ok(true));
            let mut visited = false;
            if force || batches || (bhs && on_cpu) {
                pass.queue(&self.work, cpu);
                visited = true;
            }
            if bhs && !on_cpu {
                pass.queue(&self.bh_work, cpu);
                visited = true;
            }
            if !visited {
                shared.skips.skip(cpu, 0);
                pass.skip();
            }
        }
        pass.flush(start, timeout)
    }

    /// Holds the calling thread's CPU's `cpu_fbatches.lock` as a task inside `folio_add_lru()`
    /// does, until the guard is dropped: meanwhile `folio_rotate_reclaimable()` on this CPU
    /// still goes through (it takes `lock_irq` only), and adds, deactivations and drains of
    /// this CPU wait. Fails when the thread has no CPU of the instance.
    pub fn hold_fbatches_lock(&self) -> Result<CpuLockHeld<'_>> {
        Ok(CpuLockHeld::new(self.shared.fbatches.lock_local()?))
    }

    /// Folios on the LRU list.
    pub fn lru_len(&self) -> usize {
        lock(&self.shared.lru).folios.len()
    }

    /// Deactivations and rotations carried out on the LRU so far (`lru_deactivate`,
    /// `lru_move_tail`).
    pub fn lru_moves(&self) -> (u64, u64) {
        let lru = lock(&self.shared.lru);
        (lru.deactivated, lru.rotated)
    }

    /// Folios waiting in each CPU's `lru_add` batch, in CPU order (each read under the CPU's
    /// lock).
    pub fn batch_lens(&self) -> Vec<(usize, usize)> {
        let mut lens = Vec::new();
        self.shared
            .fbatches
            .for_each_locked(|cpu, fb| lens.push((cpu, fb.lru_add.len())));
        lens
    }

    /// Folios waiting in each CPU's `lru_deactivate` and `lru_move_tail` batches, in CPU order.
    pub fn move_batch_lens(&self) -> Vec<(usize, usize, usize)> {
        let mut deactivate = Vec::new();
        self.shared
            .fbatches
            .for_each_locked(|cpu, fb| deactivate.push((cpu, fb.lru_deactivate.len())));
        let mut lens = Vec::new();
        self.shared.fbatches_irq.for_each_locked(|cpu, irq| {
            let (_, d) = deactivate[lens.len()];
            lens.push((cpu, d, irq.lru_move_tail.len()));
        });
        lens
    }

    /// Buffer heads in each CPU's buffer-head LRU, in CPU order.
    pub fn bh_lens(&self) -> Vec<(usize, usize)> {
        let mut lens = Vec::new();
        self.shared
            .bh_lrus
            .for_each_locked(|cpu, bh| lens.push((cpu, bh.bhs.len())));
        lens
    }

    /// References the buffer-head LRUs hold on `block` (0 for a block past the configured
    /// ones).
    pub fn bh_refs(&self, block: Block) -> u64 {
        self.shared
            .bh_refs
            .get(block as usize)
            .map_or(0, |r| r.load(Ordering::Relaxed))
    }

    /// Whether `folio` is on the LRU list.
    pub fn on_lru(&self, folio: Folio) -> bool {
        lock(&self.shared.lru).folios.contains(&folio)
    }
}

impl Workload for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    /// Adds a folio; every fourth operation instead rotates this CPU's newest folio on the LRU
    /// (under `lock_irq`), and one in eight deactivates it (under `lock`), once there is one.
    fn process_op(&self) -> Result<()> {
        let shared = &*self.shared;
        let mut fb = shared.fbatches.lock_local()?;
        let cpu = PerCpuGuard::cpu(&fb);
        fb.counters.local_ops += 1;
        let n = fb.counters.local_ops;
        let newest = Folio {
            cpu,
            seq: shared.on_lru[shared.skips.idx(cpu)].load(Ordering::Acquire),
        };
        if newest.seq > 0 && n % 8 == 6 {
            self.deactivate_locked(cpu, &mut fb, newest);
        } else if newest.seq > 0 && n % 4 == 3 {
            drop(fb);
            let mut irq = shared.fbatches_irq.lock_local()?;
            self.rotate_locked(cpu, &mut irq, newest);
        } else {
            self.add_locked(cpu, &mut fb);
        }
        Ok(())
    }

    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        self.drain_all(force, timeout)
    }

    /// The counters, with rotations and buffer-head look-ups among the local operations and
    /// the buffer-head invalidations queued on their own among the queued drains.
    fn counters(&self) -> Vec<CpuCounters> {
        let shared = &*self.shared;
        let mut counters = shared.skips.merge(&shared.fbatches, |fb| fb.counters);
        let mut other_ops = vec![0; counters.len()];
        shared
            .fbatches_irq
            .for_each_locked(|cpu, irq| other_ops[shared.skips.idx(cpu)] += irq.ops);
        shared
            .bh_lrus
            .for_each_locked(|cpu, bh| other_ops[shared.skips.idx(cpu)] += bh.ops);
        for c in &mut counters {
            let idx = shared.skips.idx(c.cpu);
            c.local_ops += other_ops[idx];
            c.drains_queued += shared.bh_runs[idx].load(Ordering::Relaxed);
        }
        counters
    }

    fn check_conservation(&self) -> Result<(), String> {
        let shared = &*self.shared;
        let mut seen: Vec<(Folio, Place)> = Vec::new();
        let mut adds = Vec::new();
        let mut problems = Vec::new();
        // Deactivations and rotations: batched in total, and still waiting.
        let (mut deactivations, mut rotations, mut waiting_d, mut waiting_r) = (0, 0, 0, 0);
        let on_lru_in_batch = |folio: &Folio, batch: &str, problems: &mut Vec<String>| {
            let known = shared.skips.cpus().binary_search(&folio.cpu).is_ok();
            if !known || folio.seq == 0 || !shared.folio_test_lru(*folio) {
                problems.push(format!("{batch} names folio {folio:?}, not on the LRU"));
            }
        };
        shared.fbatches.for_each_locked(|cpu, fb| {
            let idx = shared.skips.idx(cpu);
            adds.push((cpu, fb.adds));
            let hint = shared.hints[idx].load(Ordering::SeqCst);
            let len = fb.lru_add.len() + fb.lru_deactivate.len();
            if hint != len {
                problems.push(format!(
                    "cpu {cpu}'s hint says {hint} folios, its batches hold {len}"
                ));
            }
            let on_lru = shared.on_lru[idx].load(Ordering::Acquire);
            if on_lru + fb.lru_add.len() as u64 != fb.adds {
                problems.push(format!(
                    "cpu {cpu} added {} folios, {} batched, but says {on_lru} are on the LRU",
                    fb.adds,
                    fb.lru_add.len()
                ));
            }
            seen.extend(fb.lru_add.iter().map(|&f| (f, Place::Batch(cpu))));
            let here = format!("cpu {cpu}'s lru_deactivate batch");
            for folio in &fb.lru_deactivate {
                on_lru_in_batch(folio, &here, &mut problems);
            }
            deactivations += fb.deactivations;
            waiting_d += fb.lru_deactivate.len() as u64;
        });
        shared.fbatches_irq.for_each_locked(|cpu, irq| {
            let hint = shared.irq_hints[shared.skips.idx(cpu)].load(Ordering::SeqCst);
            if hint != irq.lru_move_tail.len() {
                problems.push(format!(
                    "cpu {cpu}'s lru_move_tail hint says {hint}, its batch holds {}",
                    irq.lru_move_tail.len()
                ));
            }
            let here = format!("cpu {cpu}'s lru_move_tail batch");
            for folio in &irq.lru_move_tail {
                on_lru_in_batch(folio, &here, &mut problems);
            }
            rotations += irq.rotations;
            waiting_r += irq.lru_move_tail.len() as u64;
        });
        {
            let lru = lock(&shared.lru);
            // Counted here, under the lock, from the list itself: it may hold tens of millions.
            let mut tally = Tally::new(&adds, &seen);
            for &f in &lru.folios {
                tally.found(f, Place::Lru);
            }
            let reclaimed = |cpu: usize| {
                lru.reclaimed
                    .get(shared.skips.idx(cpu))
                    .copied()
                    .unwrap_or(0)
            };
            tally.report(reclaimed, &mut problems);
            if deactivations != waiting_d + lru.deactivated {
                problems.push(format!(
                    "{deactivations} deactivations batched, {waiting_d} waiting and {} done",
                    lru.deactivated
                ));
            }
            if rotations != waiting_r + lru.rotated {
                problems.push(format!(
                    "{rotations} rotations batched, {waiting_r} waiting and {} done",
                    lru.rotated
                ));
            }
        }
        self.check_bh_lrus(&mut problems);
        conservation_verdict(problems)
    }
}

impl Lru {
    /// The buffer-head part of the conservation law: each reference held by one LRU, no block
    /// twice in an LRU, none on an isolated CPU, every hint right.
    fn check_bh_lrus(&self, problems: &mut Vec<String>) {
        let shared = &*self.shared;
        let mut held = vec![0u64; shared.blocks];
        shared.bh_lrus.for_each_locked(|cpu, bh| {
            if bh.bhs.len() > BH_LRU_SIZE {
                problems.push(format!(
                    "cpu {cpu}'s bh LRU holds {} buffer heads, more than {BH_LRU_SIZE}",
                    bh.bhs.len()
                ));
            }
            if !bh.bhs.is_empty() && shared.isolated.contains(cpu) {
                problems.push(format!("isolated cpu {cpu} caches buffer heads"));
            }
            if shared.bh_hints[shared.skips.idx(cpu)].load(Ordering::SeqCst) == bh.bhs.is_empty() {
                problems.push(format!("cpu {cpu}'s has_bh_in_lru hint is stale"));
            }
            for (i, &block) in bh.bhs.iter().enumerate() {
                if bh.bhs[..i].contains(&block) {
                    problems.push(format!("cpu {cpu}'s bh LRU holds block {block} twice"));
                }
                held[block as usize] += 1;
            }
        });
        for (block, (&held, refs)) in held.iter().zip(&shared.bh_refs).enumerate() {
            let refs = refs.load(Ordering::Relaxed);
            if refs != held {
                problems.push(format!(
                    "block {block} has {refs} references from bh LRUs, which hold it {held} times"
                ));
            }
        }
    }
}

/// Where the conservation check found a folio: a CPU's `lru_add` batch or the LRU. A `Copy`
/// tag, not a string, since the LRU may hold millions after a long run.
#[derive(Debug, Clone, Copy)]
enum Place {
    Batch(usize),
    Lru,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Batch(cpu) => write!(f, "cpu {cpu}'s batch"),
            Place::Lru => f.write_str("the LRU"),
        }
    }
}

/// The folio part of the conservation law: each CPU's adds, numbered from 1, each found exactly
/// once, in a batch or on the LRU, and nothing else found. A bit per add rather than a sorted
/// list of every folio: after a 30 s run the LRU holds tens of millions, and the list took
/// seconds and gigabytes to build and sort (each allocation populated at once, since the
/// emulator locks its future memory), which a Ctrl-C waited for.
struct Tally {
    /// By CPU: (adds, a bit per add, how many found).
    cpus: Vec<Option<(u64, Vec<u64>, u64)>>,
    /// The batches' folios and where (few), to name both places of a folio found twice.
    in_batches: std::collections::HashMap<Folio, Place>,
    twice: Vec<String>,
    never_added: Vec<String>,
    more: u64,
}

impl Tally {
    /// At most this many lines of each kind of problem; the rest are counted.
    const LINES: usize = 10;

    fn new(adds: &[(usize, u64)], batches: &[(Folio, Place)]) -> Self {
        let len = adds.iter().map(|&(cpu, _)| cpu + 1).max().unwrap_or(0);
        let mut cpus = vec![None; len];
        for &(cpu, n) in adds {
            let words = usize::try_from(n.div_ceil(64)).unwrap_or(usize::MAX);
            cpus[cpu] = Some((n, vec![0u64; words], 0));
        }
        let mut tally = Self {
            cpus,
            in_batches: std::collections::HashMap::new(),
            twice: Vec::new(),
            never_added: Vec::new(),
            more: 0,
        };
        for &(f, place) in batches {
            // Where it was first seen, before `found` looks it up for a second sighting.
            tally.in_batches.entry(f).or_insert(place);
            tally.found(f, place);
        }
        tally
    }

    fn found(&mut self, f: Folio, place: Place) {
        let entry = self.cpus.get_mut(f.cpu).and_then(Option::as_mut);
        let Some((_, bits, found)) = entry.filter(|(n, ..)| f.seq != 0 && f.seq <= *n) else {
            let line = format!("{place} holds folio {f:?}, never added");
            Self::note(&mut self.never_added, &mut self.more, line);
            return;
        };
        let (word, bit) = ((f.seq - 1) / 64, (f.seq - 1) % 64);
        let word = &mut bits[word as usize];
        if *word & (1 << bit) != 0 {
            let first = self.in_batches.get(&f).copied().unwrap_or(Place::Lru);
            let line = format!("folio {f:?} is both in {first} and in {place}");
            Self::note(&mut self.twice, &mut self.more, line);
            return;
        }
        *word |= 1 << bit;
        *found += 1;
    }

    fn note(lines: &mut Vec<String>, more: &mut u64, line: String) {
        if lines.len() < Self::LINES {
            lines.push(line);
        } else {
            *more += 1;
        }
    }

    /// Adds the findings to `problems`; `reclaimed(cpu)`: that CPU's folios reclaimed from the
    /// LRU, which count as found.
    fn report(self, reclaimed: impl Fn(usize) -> u64, problems: &mut Vec<String>) {
        problems.extend(self.twice);
        problems.extend(self.never_added);
        if self.more > 0 {
            problems.push(format!(
                "and {} more folios found twice or never added",
                self.more
            ));
        }
        for (cpu, entry) in self.cpus.iter().enumerate() {
            if let Some((n, _, found)) = entry {
                let accounted = found + reclaimed(cpu);
                if accounted < *n {
                    problems.push(format!(
                        "cpu {cpu} added {n} folios, {} are lost",
                        n - accounted
                    ));
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::test_support::remote;

    fn config(batch_size: usize) -> LruConfig {
        LruConfig {
            batch_size,
            ..LruConfig::default()
        }
    }

    #[test]
    fn full_batch_moves_to_the_lru() {
        let qpw = remote(1);
        let lru = Lru::new(&qpw, config(3)).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        lru.folio_add_lru().unwrap();
        lru.folio_add_lru().unwrap();
        assert_eq!((lru.lru_len(), lru.batch_lens()), (0, vec![(0, 2)]));
        lru.folio_add_lru().unwrap();
        assert_eq!((lru.lru_len(), lru.batch_lens()), (3, vec![(0, 0)]));
        lru.check_conservation().unwrap();
    }

    /// Drops one folio from cpu 0's batch: the conservation check must find it lost.
    fn assert_one_lost_from_the_batch(lru: &Lru) {
        let mut fb = lru.shared.fbatches.lock(0).unwrap();
        fb.lru_add.pop();
        lru.shared.publish(0, &fb);
        drop(fb);
        let err = lru.check_conservation().unwrap_err();
        assert!(err.contains("1 are lost"), "{err}");
    }

    #[test]
    fn conservation_catches_a_lost_folio() {
        let qpw = remote(1);
        let lru = Lru::new(&qpw, config(8)).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        lru.folio_add_lru().unwrap();
        lru.folio_add_lru().unwrap();
        assert_one_lost_from_the_batch(&lru);
    }

    #[test]
    fn conservation_catches_a_duplicate() {
        let qpw = remote(1);
        let lru = Lru::new(&qpw, config(8)).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        let folio = lru.folio_add_lru().unwrap();
        lock(&lru.shared.lru).folios.push_back(folio);
        let err = lru.check_conservation().unwrap_err();
        assert!(err.contains("is both in"), "{err}");
    }

    #[test]
    fn conservation_catches_a_folio_never_added() {
        let qpw = remote(1);
        let lru = Lru::new(&qpw, config(8)).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        lru.folio_add_lru().unwrap();
        let cpu = lru.shared.skips.cpus()[0];
        lock(&lru.shared.lru)
            .folios
            .push_back(Folio { cpu, seq: 999 });
        let err = lru.check_conservation().unwrap_err();
        assert!(
            err.contains("the LRU holds folio") && err.contains("never added"),
            "{err}"
        );
    }

    #[test]
    fn the_lru_keeps_its_newest_folios_and_counts_the_reclaimed_as_found() {
        let qpw = remote(1);
        let lru = Lru::new(
            &qpw,
            LruConfig {
                lru_keeps: 8,
                ..config(4)
            },
        )
        .unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        for _ in 0..98 {
            lru.folio_add_lru().unwrap();
        }
        // 98 added: 96 moved in full batches of 4, of which the newest 8 are kept and 88
        // reclaimed; 2 wait in the batch.
        assert_eq!((lru.lru_len(), lru.batch_lens()), (8, vec![(0, 2)]));
        lru.check_conservation().unwrap();
        // A folio lost from a batch is still found missing.
        assert_one_lost_from_the_batch(&lru);
    }

    #[test]
    fn batch_size_is_checked() {
        let qpw = remote(1);
        let err = Lru::new(&qpw, config(0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "FOLIO_BATCH_SIZE = 0 is out of range: the legal range is 1-4096"
        );
    }
}
