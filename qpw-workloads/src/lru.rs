//! LRU add batches (`mm/swap.c`): per-CPU folio batches in front of a global LRU list, and the
//! drain-all that empties them.
//!
//! # What the kernel does
//!
//! A new folio does not go onto its LRU list at once: `folio_add_lru()` puts it in the
//! calling CPU's `cpu_fbatches.lru_add` batch under `local_lock(&cpu_fbatches.lock)`, and only
//! when the batch is full (`FOLIO_BATCH_SIZE` = 31 folios since 2024, 15 before, in
//! `include/linux/pagevec.h`) does `folio_batch_move_lru()` move the whole batch to the LRU
//! under `lru_lock`. That saves one `lru_lock` round trip per folio, and leaves up to 31 folios
//! per CPU invisible to whoever needs every folio on the LRU (migration, mlock, CMA, memory
//! hotplug). Those callers run `lru_add_drain_all()` (`__lru_add_drain_all(false)`):
//!
//! 1. snapshot the drain generation `lru_drain_gen` (after a full barrier);
//! 2. take the drain mutex; if the generation has moved meanwhile, a drain that *started after
//!    our snapshot* has already covered every folio we could care about: return at once;
//! 3. bump the generation, then queue `lru_add_drain_per_cpu` only on the CPUs whose batches
//!    are non-empty (`cpu_needs_drain()`, a racy peek at the batch counts);
//! 4. `flush_work()` each of them, and release the mutex.
//!
//! `lru_cache_disable()` calls `__lru_add_drain_all(true)`: it never skips on the generation.
//!
//! # What this model keeps, and what it simplifies
//!
//! [`Lru::folio_add_lru`], [`Lru::lru_add_drain`], [`Lru::lru_add_drain_all`] and
//! [`Lru::lru_cache_disable`] keep those names and steps. The batch size is a parameter
//! ([`FOLIO_BATCH_SIZE`], [`FOLIO_BATCH_SIZE_BEFORE_2024`]). The work item is made from the
//! [`Qpw`] instance, so the same code queues it (mode 0) or runs it in the requester under the
//! target's lock (mode 1), as the QPW patches convert `lru_add_drain_per_cpu`.
//!
//! Simplified: one batch per CPU (the kernel has several: `lru_add`, `lru_deactivate`,
//! `lru_lazyfree`, `lru_move_tail`, `activate`), one LRU list instead of per-node, per-memcg
//! lruvecs, and folios are bare ids. `cpu_needs_drain()` reads another CPU's batch without its
//! lock, which Rust forbids: each CPU publishes its batch length in an atomic hint instead,
//! written by the owner under its lock and read by drainers (with the kernel's full barriers
//! as `SeqCst`). The caller's own batch is drained first, directly, so the remote part concerns
//! only the other CPUs. `lru_cache_disable()` does not raise `lru_disable_count` here (adds keep
//! batching); its drain, like the trait's forced drain, reaches every CPU, empty or not.
//!
//! # Conservation
//!
//! Every folio added is in exactly one place: a CPU's batch or the LRU list. Folios are made by
//! `folio_add_lru` itself, numbered per CPU, so the law is checked exactly: CPU `c`'s `n`-th
//! add is folio `(c, n)`, and the batches plus the LRU hold each `(c, 1..=adds[c])` once.

use std::time::Duration;

use qpw_core::sync::{Arc, AtomicU64, AtomicUsize, Mutex, Ordering};
use qpw_core::{PerCpu, PerCpuWork, Qpw, Result, WorkCtx};

use crate::{
    conservation_verdict, drain_used_cpus, lock, CpuCounters, DrainOutcome, OwnerCounters,
    SkipCounters, Workload, WorkloadError,
};

/// `FOLIO_BATCH_SIZE` (`include/linux/pagevec.h`): folios per batch since 2024.
pub const FOLIO_BATCH_SIZE: usize = 31;

/// `FOLIO_BATCH_SIZE` before 2024 (`PAGEVEC_SIZE`, 15).
pub const FOLIO_BATCH_SIZE_BEFORE_2024: usize = 15;

/// The largest batch size accepted.
pub const MAX_BATCH_SIZE: usize = 4096;

/// A folio: the CPU that added it and the add's number on that CPU (from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Folio {
    /// The CPU whose `folio_add_lru` made it.
    pub cpu: usize,
    /// Its number among that CPU's adds, from 1.
    pub seq: u64,
}

/// The LRU workload's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LruConfig {
    /// Folios per batch (`FOLIO_BATCH_SIZE`), 1 to [`MAX_BATCH_SIZE`].
    pub batch_size: usize,
}

impl Default for LruConfig {
    fn default() -> Self {
        Self {
            batch_size: FOLIO_BATCH_SIZE,
        }
    }
}

/// One CPU's `cpu_fbatches`, reduced to the `lru_add` batch.
#[derive(Debug)]
struct CpuBatch {
    batch: Vec<Folio>,
    counters: OwnerCounters,
}

/// A snapshot of the drain generation, step 1 of `__lru_add_drain_all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainGen(u64);

#[derive(Debug)]
struct Shared {
    batch_size: usize,
    cpus: PerCpu<CpuBatch>,
    /// Per CPU (by slot): the batch length, stored by the owner under its lock; read racily by
    /// drainers, as `cpu_needs_drain()` reads `folio_batch_count()`.
    hints: Vec<AtomicUsize>,
    /// The LRU list, behind `lru_lock`.
    lru: Mutex<Vec<Folio>>,
    /// `lru_drain_gen`.
    gen: AtomicU64,
    /// The static `lock` of `__lru_add_drain_all`.
    drain_lock: Mutex<()>,
    skips: SkipCounters,
}

impl Shared {
    /// `folio_batch_move_lru()`: empties `batch` onto the LRU under `lru_lock`.
    fn move_to_lru(&self, cpu: &mut CpuBatch) {
        lock(&self.lru).append(&mut cpu.batch);
    }

    fn publish(&self, cpu: usize, len: usize) {
        self.hints[self.skips.idx(cpu)].store(len, Ordering::SeqCst);
    }

    /// `lru_add_drain_per_cpu()`: the work item, run for `ctx.cpu()` wherever it runs.
    fn lru_add_drain_per_cpu(&self, ctx: &WorkCtx) {
        let Ok(mut cpu) = self.cpus.lock_work(ctx) else {
            return; // a remote run past its drain's deadline: the drain reports it
        };
        cpu.counters.drained(ctx);
        self.move_to_lru(&mut cpu);
        self.publish(ctx.cpu(), 0);
    }
}

/// Per-CPU LRU add batches over one LRU list.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
/// use qpw_workloads::lru::{Lru, LruConfig};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
/// let lru = Lru::new(&qpw, LruConfig { batch_size: 4 })?;
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
    work: PerCpuWork,
}

impl Lru {
    /// Per-CPU batches on `qpw`'s CPUs, and the drain work item.
    pub fn new(qpw: &Qpw, config: LruConfig) -> Result<Self, WorkloadError> {
        WorkloadError::check("FOLIO_BATCH_SIZE", config.batch_size, 1, MAX_BATCH_SIZE)?;
        let cpus = qpw.per_cpu(|_| CpuBatch {
            batch: Vec::with_capacity(config.batch_size),
            counters: OwnerCounters::default(),
        });
        let shared = Arc::new(Shared {
            batch_size: config.batch_size,
            hints: (0..qpw.cpus().len()).map(|_| AtomicUsize::new(0)).collect(),
            cpus,
            lru: Mutex::new(Vec::new()),
            gen: AtomicU64::new(0),
            drain_lock: Mutex::new(()),
            skips: SkipCounters::new(qpw.cpus()),
        });
        let for_work = shared.clone();
        let work = qpw.work(move |ctx| for_work.lru_add_drain_per_cpu(ctx))?;
        Ok(Self { shared, work })
    }

    /// Folios per batch.
    pub fn batch_size(&self) -> usize {
        self.shared.batch_size
    }

    /// `folio_add_lru()`: makes a new folio and adds it to the calling CPU's batch; a full
    /// batch moves to the LRU under `lru_lock`. Fails only when the thread has no CPU of the
    /// instance.
    #[inline]
    pub fn folio_add_lru(&self) -> Result<Folio> {
        let shared = &*self.shared;
        let mut guard = shared.cpus.lock_local()?;
        let cpu = qpw_core::PerCpuGuard::cpu(&guard);
        guard.counters.local_ops += 1;
        let folio = Folio {
            cpu,
            seq: guard.counters.local_ops,
        };
        guard.batch.push(folio);
        // Is the batch full?
        if guard.batch.len() >= shared.batch_size {
            // Yes: move it to the LRU under lru_lock (folio_batch_move_lru).
            shared.move_to_lru(&mut guard);
        }
        shared.publish(cpu, guard.batch.len());
        Ok(folio)
    }

    /// `lru_add_drain()`: moves the calling CPU's batch to the LRU.
    pub fn lru_add_drain(&self) -> Result<()> {
        let shared = &*self.shared;
        let mut guard = shared.cpus.lock_local()?;
        let cpu = qpw_core::PerCpuGuard::cpu(&guard);
        shared.move_to_lru(&mut guard);
        shared.publish(cpu, 0);
        Ok(())
    }

    /// `lru_add_drain_all()` (`__lru_add_drain_all(false)`): drains the caller's batch, then
    /// every CPU whose batch is non-empty, unless a drain that started after this call already
    /// did.
    pub fn lru_add_drain_all(&self) -> DrainOutcome {
        self.drain_all(false, None)
    }

    /// `lru_cache_disable()`'s drain (`__lru_add_drain_all(true)`): never skips on the
    /// generation, and reaches every CPU, empty or not.
    pub fn lru_cache_disable(&self) -> DrainOutcome {
        self.drain_all(true, None)
    }

    fn drain_all(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        // The caller's own batch first, directly; an unbound caller has none.
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

        // Queue only on the CPUs whose batches look non-empty (cpu_needs_drain), then flush.
        drain_used_cpus(&self.work, &shared.skips, force, timeout, |cpu| {
            shared.hints[shared.skips.idx(cpu)].load(Ordering::SeqCst) > 0
        })
    }

    /// Folios on the LRU list.
    pub fn lru_len(&self) -> usize {
        lock(&self.shared.lru).len()
    }

    /// Folios waiting in each CPU's batch, in CPU order (each read under the CPU's lock).
    pub fn batch_lens(&self) -> Vec<(usize, usize)> {
        let mut lens = Vec::new();
        self.shared
            .cpus
            .for_each_locked(|cpu, batch| lens.push((cpu, batch.batch.len())));
        lens
    }

    /// Whether `folio` is on the LRU list.
    pub fn on_lru(&self, folio: Folio) -> bool {
        lock(&self.shared.lru).contains(&folio)
    }
}

impl Workload for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn process_op(&self) -> Result<()> {
        self.folio_add_lru().map(|_| ())
    }

    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        self.drain_all(force, timeout)
    }

    fn counters(&self) -> Vec<CpuCounters> {
        let shared = &*self.shared;
        shared.skips.merge(&shared.cpus, |batch| batch.counters)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let shared = &*self.shared;
        let mut seen: Vec<(Folio, String)> = Vec::new();
        let mut adds = Vec::new();
        let mut problems = Vec::new();
        shared.cpus.for_each_locked(|cpu, batch| {
            adds.push((cpu, batch.counters.local_ops));
            let hint = shared.hints[shared.skips.idx(cpu)].load(Ordering::SeqCst);
            if hint != batch.batch.len() {
                problems.push(format!(
                    "cpu {cpu}'s hint says {hint} folios, its batch holds {}",
                    batch.batch.len()
                ));
            }
            seen.extend(
                batch
                    .batch
                    .iter()
                    .map(|&f| (f, format!("cpu {cpu}'s batch"))),
            );
        });
        seen.extend(
            lock(&shared.lru)
                .iter()
                .map(|&f| (f, "the LRU".to_string())),
        );
        check_folios(&adds, seen, problems)
    }
}

/// Checks that `seen` holds each folio `(c, 1..=adds[c])` exactly once.
fn check_folios(
    adds: &[(usize, u64)],
    mut seen: Vec<(Folio, String)>,
    mut problems: Vec<String>,
) -> Result<(), String> {
    seen.sort_by_key(|entry| entry.0);
    for pair in seen.windows(2) {
        if pair[0].0 == pair[1].0 {
            problems.push(format!(
                "folio {:?} is both in {} and in {}",
                pair[0].0, pair[0].1, pair[1].1
            ));
        }
    }
    for &(cpu, n) in adds {
        let held = seen.iter().filter(|(f, _)| f.cpu == cpu).count() as u64;
        let bogus = seen
            .iter()
            .find(|(f, _)| f.cpu == cpu && (f.seq == 0 || f.seq > n));
        if let Some((f, place)) = bogus {
            problems.push(format!("{place} holds folio {f:?}, never added"));
        }
        if held < n {
            problems.push(format!("cpu {cpu} added {n} folios, {} are lost", n - held));
        }
    }
    conservation_verdict(problems)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::test_support::remote;

    #[test]
    fn full_batch_moves_to_the_lru() {
        let qpw = remote(1);
        let lru = Lru::new(&qpw, LruConfig { batch_size: 3 }).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        lru.folio_add_lru().unwrap();
        lru.folio_add_lru().unwrap();
        assert_eq!((lru.lru_len(), lru.batch_lens()), (0, vec![(0, 2)]));
        lru.folio_add_lru().unwrap();
        assert_eq!((lru.lru_len(), lru.batch_lens()), (3, vec![(0, 0)]));
        lru.check_conservation().unwrap();
    }

    #[test]
    fn conservation_catches_a_lost_folio() {
        let qpw = remote(1);
        let lru = Lru::new(&qpw, LruConfig { batch_size: 8 }).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        lru.folio_add_lru().unwrap();
        lru.folio_add_lru().unwrap();
        lru.shared.cpus.lock(0).unwrap().batch.pop();
        lru.shared.publish(0, 1);
        let err = lru.check_conservation().unwrap_err();
        assert!(err.contains("1 are lost"), "{err}");
    }

    #[test]
    fn conservation_catches_a_duplicate() {
        let qpw = remote(1);
        let lru = Lru::new(&qpw, LruConfig { batch_size: 8 }).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        let folio = lru.folio_add_lru().unwrap();
        lock(&lru.shared.lru).push(folio);
        let err = lru.check_conservation().unwrap_err();
        assert!(err.contains("is both in"), "{err}");
    }

    #[test]
    fn batch_size_is_checked() {
        let qpw = remote(1);
        let err = Lru::new(&qpw, LruConfig { batch_size: 0 }).unwrap_err();
        assert_eq!(
            err.to_string(),
            "FOLIO_BATCH_SIZE = 0 is out of range: the legal range is 1-4096"
        );
    }
}
