//! Kernel-style per-CPU workloads, each written once against [`qpw_core`] and run unchanged in
//! every mode, as the kernel's QPW patches convert `mm/swap.c`, `mm/memcontrol.c` and
//! `mm/slub.c` without forking them per mode.
//!
//! | module | kernel source | per-CPU cache | requester drain |
//! |---|---|---|---|
//! | [`lru`] | `mm/swap.c` | folio batches | `lru_add_drain_all` |
//! | [`memcg`] | `mm/memcontrol.c` | charge stock | `drain_all_stock` |
//! | [`slub`] | `mm/slub.c` | sheaves | `flush_all` |
//! | [`pcp`] | `mm/page_alloc.c` | pcp lists | `drain_all_pages` |
//! | [`resctrl`] | `arch/x86/kernel/cpu/resctrl`, `fs/resctrl` | none: per-domain counters | `mon_event_read` |
//! | [`pool`] | `security/apparmor/lsm.c` | buffer caches | none: remote frees |
//!
//! The mm workloads share one driving interface, [`Workload`], which the emulator uses: a
//! process-context operation on the calling CPU, a requester drain, per-CPU counters, and the
//! workload's conservation law. [`build`] makes one from its [`WorkloadKind`] name (`lru`,
//! `memcg`, `slub`, `pcp`) and [`WorkloadOptions`] (the kernel's constants by default).

#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod lru;
pub mod memcg;
pub mod pcp;
pub mod pool;
pub mod resctrl;
pub mod slub;

use std::time::Duration;

/// What the emulator can do with an mm workload.
pub trait Workload: Send + Sync + std::fmt::Debug {
    /// The workload's short name (`lru`, `memcg`, `slub`, `pcp`).
    fn name(&self) -> &'static str;

    /// One process-context operation on the calling thread's CPU (the thread is bound to, or
    /// runs on, a CPU of the instance): adds a folio, charges a page, allocates or frees an
    /// object, allocates or frees a page.
    fn process_op(&self) -> qpw_core::Result<()>;

    /// One requester drain of every CPU, as the kernel's drain-all function does it.
    /// `force` drains every CPU even when its cache looks empty and never skips the whole
    /// drain (as `lru_cache_disable` does), so that a drain always reaches every CPU;
    /// `timeout` bounds the wait for queued work (a CPU past it is reported as stalled).
    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome;

    /// Each CPU's counters, in CPU order.
    fn counters(&self) -> Vec<CpuCounters>;

    /// Checks the workload's conservation law (every item in exactly one place); the error
    /// says what is missing or counted twice. Call it when no operation is in flight.
    fn check_conservation(&self) -> Result<(), String>;
}

/// One CPU's counters, as the emulator reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuCounters {
    /// The CPU.
    pub cpu: usize,
    /// Process-context operations done on this CPU.
    pub local_ops: u64,
    /// Drains of this CPU run remotely, by the requester under this CPU's lock.
    pub drains_remote: u64,
    /// Drains of this CPU queued to its worker.
    pub drains_queued: u64,
    /// Drains that left this CPU alone (empty cache, or a strategy that skips it).
    pub drains_skipped: u64,
    /// Items a skipped drain left behind in this CPU's cache (pages, folios, objects).
    pub stranded: u64,
}

/// What one requester drain did.
///
/// A CPU is counted once, except where part of its drain must run on the CPU itself: the LRU's
/// buffer-head invalidation stays queued to a remote-mode CPU's worker while its folio batches
/// are drained remotely, so that CPU counts in both `queued` and `ran_remote`.
#[derive(Debug, Default)]
pub struct DrainOutcome {
    /// CPUs whose drain (or part of it) was queued to their worker.
    pub queued: usize,
    /// CPUs drained remotely by the requester.
    pub ran_remote: usize,
    /// CPUs left alone.
    pub skipped_cpus: usize,
    /// Whether the whole drain returned at once (a newer generation already drained, or
    /// another drain was running).
    pub skipped: bool,
    /// Stalls, panics and refusals, one per CPU at most.
    pub errors: Vec<qpw_core::Error>,
}

// ---------------------------------------------------------------------------------------------
// Building an mm workload by name, and the counters the mm workloads share.

/// The mm workloads [`build`] can make, by the names the command line uses.
///
/// ```
/// use qpw_workloads::WorkloadKind;
///
/// assert_eq!("memcg".parse::<WorkloadKind>()?, WorkloadKind::Memcg);
/// let err = "slab".parse::<WorkloadKind>().unwrap_err().to_string();
/// assert_eq!(err, "unknown workload `slab`: expected one of lru, memcg, slub, pcp");
/// # Ok::<(), qpw_workloads::WorkloadError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    /// [`lru::Lru`]: LRU folio batches (`mm/swap.c`).
    Lru,
    /// [`memcg::Memcg`]: memcg charge stock (`mm/memcontrol.c`).
    Memcg,
    /// [`slub::Slub`]: SLUB per-CPU sheaves (`mm/slub.c`).
    Slub,
    /// [`pcp::Pcp`]: page-allocator pcp lists (`mm/page_alloc.c`).
    Pcp,
}

impl WorkloadKind {
    /// Every kind, in the order the names are listed.
    pub const ALL: [WorkloadKind; 4] = [
        WorkloadKind::Lru,
        WorkloadKind::Memcg,
        WorkloadKind::Slub,
        WorkloadKind::Pcp,
    ];

    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Lru => "lru",
            WorkloadKind::Memcg => "memcg",
            WorkloadKind::Slub => "slub",
            WorkloadKind::Pcp => "pcp",
        }
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WorkloadKind {
    type Err = WorkloadError;

    fn from_str(input: &str) -> Result<Self, WorkloadError> {
        let name = input.trim();
        WorkloadKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| WorkloadError::UnknownWorkload {
                input: input.to_string(),
            })
    }
}

/// What can go wrong when an mm workload is built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// A workload name that is not one of ours.
    #[error("unknown workload `{input}`: expected one of lru, memcg, slub, pcp")]
    UnknownWorkload {
        /// The name as given.
        input: String,
    },

    /// A size parameter outside its legal range.
    #[error("{name} = {value} is out of range: the legal range is {min}-{max}")]
    Parameter {
        /// The parameter (the kernel constant it stands for).
        name: &'static str,
        /// The value given.
        value: usize,
        /// The smallest legal value.
        min: usize,
        /// The largest legal value.
        max: usize,
    },

    /// A memcg id that the hierarchy does not have, or a parent named after its child.
    #[error("memcg {memcg} is not in the hierarchy of {count} memcgs (ids 0-{last})", last = count.saturating_sub(1))]
    NoSuchMemcg {
        /// The id given.
        memcg: usize,
        /// How many memcgs there are.
        count: usize,
    },

    /// An uncharge of more pages than the memcg holds.
    #[error("cannot uncharge {nr_pages} pages from memcg {memcg}: it holds only {held}")]
    NotCharged {
        /// The memcg.
        memcg: usize,
        /// The pages asked for.
        nr_pages: u64,
        /// The pages its tasks hold.
        held: u64,
    },

    /// A memcg hierarchy that is not a tree rooted at memcg 0 (each parent must come before
    /// its children), or whose limits do not match it.
    #[error("bad memcg hierarchy: {reason}")]
    Hierarchy {
        /// What is wrong with it.
        reason: String,
    },

    /// A free of something the workload did not hand out, or handed out and took back
    /// already: a double free (the kernel's "double free detected" or "Bad page state").
    #[error("{kind} {id} is not allocated: a double free, or never handed out by {alloc}")]
    NotAllocated {
        /// What was freed: `object` or `page`.
        kind: &'static str,
        /// Its number.
        id: u64,
        /// The function that hands it out (`kmem_cache_alloc`, `rmqueue_pcplist`).
        alloc: &'static str,
    },

    /// A folio that no CPU of the instance added: its CPU is not managed, or its number is 0.
    #[error(
        "folio {folio} was never added: folios are (cpu, n) with cpu in {managed} and n from 1"
    )]
    NoSuchFolio {
        /// The folio as given, `(cpu, n)`.
        folio: String,
        /// The managed CPUs.
        managed: String,
    },

    /// The framework refused: a work item could not be made (a worker did not start), or the
    /// calling thread has no CPU of the instance.
    #[error(transparent)]
    Qpw(#[from] qpw_core::Error),
}

impl WorkloadError {
    pub(crate) fn check(
        name: &'static str,
        value: usize,
        min: usize,
        max: usize,
    ) -> Result<(), Self> {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(WorkloadError::Parameter {
                name,
                value,
                min,
                max,
            })
        }
    }
}

/// Knobs [`build`] passes on; the defaults are the kernel's.
#[derive(Debug, Clone, Default)]
pub struct WorkloadOptions {
    /// [`lru::LruConfig`] (`FOLIO_BATCH_SIZE`).
    pub lru: lru::LruConfig,
    /// [`memcg::MemcgConfig`] (stock slots, batch, hierarchy, drain strategy).
    pub memcg: memcg::MemcgConfig,
    /// [`slub::SlubConfig`] (sheaf capacity, `PCS_BATCH_MAX`, objects).
    pub slub: slub::SlubConfig,
    /// [`pcp::PcpConfig`] (`batch`, `high`, zones, pages).
    pub pcp: pcp::PcpConfig,
}

/// Builds the mm workload `kind` on `qpw`'s CPUs, with `options`.
///
/// The handle is a plain `std::sync::Arc`: the emulator shares it between its threads and it
/// is never model-checked itself (the workloads' own state uses `qpw_core::sync`).
pub fn build(
    kind: WorkloadKind,
    qpw: &qpw_core::Qpw,
    options: &WorkloadOptions,
) -> Result<std::sync::Arc<dyn Workload>, WorkloadError> {
    Ok(match kind {
        WorkloadKind::Lru => std::sync::Arc::new(lru::Lru::new(qpw, options.lru.clone())?),
        WorkloadKind::Memcg => std::sync::Arc::new(memcg::Memcg::new(qpw, options.memcg.clone())?),
        WorkloadKind::Slub => std::sync::Arc::new(slub::Slub::new(qpw, options.slub.clone())?),
        WorkloadKind::Pcp => std::sync::Arc::new(pcp::Pcp::new(qpw, options.pcp.clone())?),
    })
}

/// The counters a CPU's owner side keeps, inside its per-CPU state and under its lock: local
/// operations, and the drains that ran for it (counted by the drain itself, which holds the
/// lock whether it runs on the worker or in the requester).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OwnerCounters {
    pub(crate) local_ops: u64,
    pub(crate) drains_remote: u64,
    pub(crate) drains_queued: u64,
}

impl OwnerCounters {
    /// Counts one drain run for this CPU, run in the requester or queued as `ctx` says.
    #[inline]
    pub(crate) fn drained(&mut self, ctx: &qpw_core::WorkCtx) {
        if ctx.is_queued() {
            self.drains_queued += 1;
        } else {
            self.drains_remote += 1;
        }
    }
}

/// The counters only requesters write (they hold no lock of the CPU they skip): per CPU, the
/// drains that left it alone and what they left behind.
#[derive(Debug)]
pub(crate) struct SkipCounters {
    cpus: Vec<usize>,
    skipped: Vec<qpw_core::sync::AtomicU64>,
    stranded: Vec<qpw_core::sync::AtomicU64>,
}

impl SkipCounters {
    pub(crate) fn new(cpus: &qpw_core::CpuSet) -> Self {
        let n = cpus.len();
        Self {
            cpus: cpus.as_slice().to_vec(),
            skipped: (0..n).map(|_| qpw_core::sync::AtomicU64::new(0)).collect(),
            stranded: (0..n).map(|_| qpw_core::sync::AtomicU64::new(0)).collect(),
        }
    }

    /// The managed CPUs, in order.
    pub(crate) fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// The slot index of a managed CPU (the position in the CPU list).
    #[inline]
    pub(crate) fn idx(&self, cpu: usize) -> usize {
        self.cpus
            .binary_search(&cpu)
            .expect("the drains only visit managed CPUs")
    }

    /// Counts one drain that left `cpu` alone with `stranded` items in its cache.
    pub(crate) fn skip(&self, cpu: usize, stranded: u64) {
        let idx = self.idx(cpu);
        self.skipped[idx].fetch_add(1, qpw_core::sync::Ordering::Relaxed);
        if stranded > 0 {
            self.stranded[idx].fetch_add(stranded, qpw_core::sync::Ordering::Relaxed);
        }
    }

    /// Every CPU's counters, in CPU order: the [`OwnerCounters`] that `owned` picks out of
    /// each CPU's state in `per_cpu` (read under that CPU's lock), joined with these.
    pub(crate) fn merge<T>(
        &self,
        per_cpu: &qpw_core::PerCpu<T>,
        owned: impl Fn(&T) -> OwnerCounters,
    ) -> Vec<CpuCounters> {
        let mut owners = Vec::new();
        per_cpu.for_each_locked(|cpu, state| owners.push((cpu, owned(state))));
        owners
            .into_iter()
            .map(|(cpu, own)| {
                let idx = self.idx(cpu);
                CpuCounters {
                    cpu,
                    local_ops: own.local_ops,
                    drains_remote: own.drains_remote,
                    drains_queued: own.drains_queued,
                    drains_skipped: self.skipped[idx].load(qpw_core::sync::Ordering::Relaxed),
                    stranded: self.stranded[idx].load(qpw_core::sync::Ordering::Relaxed),
                }
            })
            .collect()
    }
}

impl DrainOutcome {
    /// The outcome of a drain that returned at once.
    pub(crate) fn whole_drain_skipped() -> Self {
        DrainOutcome {
            skipped: true,
            ..DrainOutcome::default()
        }
    }

    /// The outcome of a drain that went through [`qpw_core::PerCpuWork::drain_all`] (or
    /// `drain_all_timeout`): the CPUs queued, run remotely and skipped, and the errors.
    pub fn from_report(report: qpw_core::DrainReport) -> Self {
        DrainOutcome {
            queued: report.queued.len(),
            ran_remote: report.ran_remote.len(),
            skipped_cpus: report.skipped.len(),
            skipped: false,
            errors: report.errors,
        }
    }
}

/// A workload's drain mutex, held as a running drain holds it (memcg's
/// `percpu_charge_mutex`, pcp's `pcpu_drain_mutex`) until this guard is dropped; from
/// [`memcg::Memcg::hold_drain`] and [`pcp::Pcp::hold_drain`]. Experiments and tests use it to
/// model a long drain that others meet.
#[must_use = "the mutex is released as soon as the guard is dropped"]
pub struct DrainInProgress<'a> {
    _guard: qpw_core::sync::MutexGuard<'a, ()>,
}

impl<'a> DrainInProgress<'a> {
    /// Takes `mutex` (even if poisoned, as [`lock`] does) and keeps it.
    pub(crate) fn hold(mutex: &'a qpw_core::sync::Mutex<()>) -> Self {
        DrainInProgress {
            _guard: lock(mutex),
        }
    }
}

impl std::fmt::Debug for DrainInProgress<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DrainInProgress")
    }
}

/// One CPU's lock of a workload's per-CPU state, held until dropped: a task of that CPU inside
/// its critical section, for tests and experiments ([`memcg::Memcg::hold_local_stock`],
/// [`lru::Lru::hold_fbatches_lock`]).
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct CpuLockHeld<'a> {
    _guard: Box<dyn HeldGuard + 'a>,
}

/// Any guard, kept only to be dropped.
trait HeldGuard {}

impl<T: ?Sized> HeldGuard for T {}

impl<'a> CpuLockHeld<'a> {
    pub(crate) fn new<T: 'a>(guard: qpw_core::PerCpuGuard<'a, T>) -> Self {
        CpuLockHeld {
            _guard: Box::new(guard),
        }
    }
}

impl std::fmt::Debug for CpuLockHeld<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CpuLockHeld")
    }
}

/// Runs `work` on the CPUs `needs` picks, then flushes them, within `timeout` if there is one.
pub(crate) fn drain_cpus(
    work: &qpw_core::PerCpuWork,
    needs: impl FnMut(usize) -> bool,
    timeout: Option<Duration>,
) -> qpw_core::DrainReport {
    match timeout {
        Some(timeout) => work.drain_all_timeout(needs, timeout),
        None => work.drain_all(needs),
    }
}

/// Runs `work` on the CPUs whose cache `looks_used` says holds something (a racy peek at the
/// owner's published hint), or on every CPU when `force` is set, then flushes them within
/// `timeout` if there is one. Each CPU left alone is counted as skipped in `skips`, with
/// nothing stranded: its cache looked empty.
pub(crate) fn drain_used_cpus(
    work: &qpw_core::PerCpuWork,
    skips: &SkipCounters,
    force: bool,
    timeout: Option<Duration>,
    looks_used: impl Fn(usize) -> bool,
) -> DrainOutcome {
    let report = drain_cpus(
        work,
        |cpu| {
            let needs = force || looks_used(cpu);
            if !needs {
                skips.skip(cpu, 0);
            }
            needs
        },
        timeout,
    );
    DrainOutcome::from_report(report)
}

/// One drain's work, queued CPU by CPU and flushed together at the end: the kernel's
/// `queue_work_on()` loop and its `has_work` mask, for drains that post more than one work item
/// or that do not flush at all (memcg's `drain_all_stock`).
pub(crate) struct DrainPass<'w> {
    outcome: DrainOutcome,
    /// The items to flush, with their CPU, in the order they were queued.
    to_flush: Vec<(&'w qpw_core::PerCpuWork, usize)>,
}

impl<'w> DrainPass<'w> {
    pub(crate) fn new() -> Self {
        DrainPass {
            outcome: DrainOutcome::default(),
            to_flush: Vec::new(),
        }
    }

    /// `queue_on(cpu)` (`pw_queue_on`): posted to the CPU's worker, or run here under the CPU's
    /// lock, as the item's mode for that CPU says; counted accordingly.
    pub(crate) fn queue(&mut self, work: &'w qpw_core::PerCpuWork, cpu: usize) {
        let queued = matches!(work.is_queued(cpu), Ok(true));
        match work.queue_on(cpu) {
            Ok(_) => {
                if queued {
                    self.outcome.queued += 1;
                } else {
                    self.outcome.ran_remote += 1;
                }
                self.to_flush.push((work, cpu));
            }
            Err(e) => self.outcome.errors.push(e),
        }
    }

    /// Counts a CPU this drain left alone.
    pub(crate) fn skip(&mut self) {
        self.outcome.skipped_cpus += 1;
    }

    /// Flushes `cpu`'s runs of `work` at the end, though this pass queued nothing there (a run
    /// an earlier drain queued, which this one relies on).
    pub(crate) fn flush_too(&mut self, work: &'w qpw_core::PerCpuWork, cpu: usize) {
        self.to_flush.push((work, cpu));
    }

    /// Flushes every item (`flush_work`), all within `timeout` of `start` if there is one: a
    /// CPU whose work has not run by then is reported as [`qpw_core::Error::Stall`], with the
    /// whole drain's wait and timeout.
    pub(crate) fn flush(
        mut self,
        start: std::time::Instant,
        timeout: Option<Duration>,
    ) -> DrainOutcome {
        for (work, cpu) in std::mem::take(&mut self.to_flush) {
            let flushed = match timeout {
                None => work.flush(cpu),
                Some(timeout) => work
                    .flush_timeout(cpu, timeout.saturating_sub(start.elapsed()))
                    .map_err(|e| match e {
                        qpw_core::Error::Stall { cpu, .. } => qpw_core::Error::Stall {
                            cpu,
                            waited: start.elapsed(),
                            timeout,
                        },
                        other => other,
                    }),
            };
            if let Err(e) = flushed {
                self.outcome.errors.push(e);
            }
        }
        self.outcome
    }

    /// Returns without waiting for the queued work (`schedule_work_on()` with no
    /// `flush_work()`). Runs done here, remotely, are complete: their flush only reports a
    /// panic, at once.
    pub(crate) fn leave_queued(mut self) -> DrainOutcome {
        for (work, cpu) in std::mem::take(&mut self.to_flush) {
            if matches!(work.is_queued(cpu), Ok(false)) {
                if let Err(e) = work.flush(cpu) {
                    self.outcome.errors.push(e);
                }
            }
        }
        self.outcome
    }
}

/// Which of a workload's numbered items (objects, pages) its callers hold: one bit each, set
/// when the item is handed out and cleared when it comes back, so that a second free of the
/// same item is caught instead of corrupting the counts.
#[derive(Debug)]
pub(crate) struct AllocMap {
    words: Vec<qpw_core::sync::AtomicU64>,
}

impl AllocMap {
    pub(crate) fn new(items: usize) -> Self {
        AllocMap {
            words: (0..items.div_ceil(64))
                .map(|_| qpw_core::sync::AtomicU64::new(0))
                .collect(),
        }
    }

    /// Marks `id` handed out.
    pub(crate) fn hand_out(&self, id: usize) {
        let before =
            self.words[id / 64].fetch_or(1 << (id % 64), qpw_core::sync::Ordering::Relaxed);
        debug_assert_eq!(before & (1 << (id % 64)), 0, "item {id} handed out twice");
    }

    /// Marks `id` returned; `false` (and nothing changed) when it was not handed out.
    pub(crate) fn take_back(&self, id: usize) -> bool {
        let bit = 1 << (id % 64);
        self.words[id / 64].fetch_and(!bit, qpw_core::sync::Ordering::Relaxed) & bit != 0
    }

    /// How many items are handed out.
    pub(crate) fn count(&self) -> usize {
        self.words
            .iter()
            .map(|w| w.load(qpw_core::sync::Ordering::Relaxed).count_ones() as usize)
            .sum()
    }
}

/// Turns the problems a conservation check collected into its verdict: `Ok` when there are
/// none, otherwise one error message listing them all, separated by `; `.
pub(crate) fn conservation_verdict(problems: Vec<String>) -> Result<(), String> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Takes a `qpw_core::sync` mutex; the workloads' critical sections leave their state
/// consistent at every step a panic could interrupt, so a poisoned lock is taken anyway.
pub(crate) fn lock<T>(mutex: &qpw_core::sync::Mutex<T>) -> qpw_core::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the workloads' unit tests share.
#[cfg(all(test, not(loom)))]
mod test_support {
    use qpw_core::{CpuSpec, Policy, Qpw};

    /// `n` logical CPUs, every one in remote mode.
    pub(crate) fn remote(n: usize) -> Qpw {
        Qpw::builder()
            .cpus(CpuSpec::Logical(n))
            .policy(Policy::Remote)
            .build()
            .unwrap()
    }
}
