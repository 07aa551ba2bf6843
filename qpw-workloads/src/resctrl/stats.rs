//! What the model records about its reads, cheaply enough not to hide what it measures.
//!
//! A cached read costs tens of nanoseconds, so the per-read record must cost no more: two
//! reads of the monotonic clock (the vDSO's `clock_gettime`, about 25 ns here) for the
//! `rdtgroup_mutex` hold, and plain additions to counters that the mutex itself guards (they
//! live in [`RdtState`](super::groups::RdtState)), no atomics and no system calls. What needs
//! system calls (the reader's voluntary context switches, `getrusage`, and its CPU time,
//! `CLOCK_THREAD_CPUTIME_ID`, several hundred nanoseconds each) is read once per pass over
//! the files by [`Fastcat`](super::Fastcat) ([`ThreadUsage`]). An earlier version read both
//! around every read, about 2 us, which made a cached read look 40 times dearer than it is.

use std::time::{Duration, Instant};

use qpw_core::sync::{AtomicU64, Ordering};

use super::model::{lock, Resctrl};
use super::read_path::ReadPath;
use super::value::MonRead;

/// `rdtgroup_mutex` hold statistics of one read path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldStats {
    /// File reads.
    pub reads: u64,
    /// Total time the mutex was held by those reads.
    pub hold_total: Duration,
    /// The longest hold.
    pub hold_max: Duration,
    /// Reads that found the mutex held (by the overflow worker or another reader) and waited
    /// for it.
    pub mutex_waits: u64,
    /// Reads executed by another thread (a worker, or an interrupted thread), which the
    /// reader waited for with the mutex held.
    pub remote_reads: u64,
    /// Total time those reads waited for their executor, from posting to done.
    pub executor_wait_total: Duration,
    /// The longest wait for an executor.
    pub executor_wait_max: Duration,
    /// Reads whose result was not a value.
    pub non_values: u64,
    /// Total age of the cached values returned (cached path).
    pub age_total: Duration,
    /// The oldest cached value returned.
    pub age_max: Duration,
}

impl HoldStats {
    /// Average hold per read.
    pub fn hold_avg(&self) -> Duration {
        avg(self.hold_total, self.reads)
    }

    /// Average wait for the executor per remote read.
    pub fn executor_wait_avg(&self) -> Duration {
        avg(self.executor_wait_total, self.remote_reads)
    }
}

pub(super) fn avg(total: Duration, n: u64) -> Duration {
    if n == 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos((total.as_nanos() / u128::from(n)) as u64)
    }
}

/// How the reads were executed, since creation or the last [`Resctrl::reset_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounts {
    /// Reads run by a worker (workqueue path and local fallbacks).
    pub worker_runs: u64,
    /// Reads run by interrupting a thread on a domain CPU.
    pub interrupts: u64,
    /// Reads the reader did itself (local path, interrupt path's own-CPU case).
    pub reader_direct: u64,
    /// Local-path reads that fell back to the workqueue (reader outside the domain).
    pub local_fallbacks: u64,
    /// Reads answered from the cache.
    pub cached: u64,
    /// Reads of a domain whose CPUs are all `nohz_full`, done by `smp_call_function_any`
    /// (directly or by an interrupt) instead of a worker.
    pub nohz_fallbacks: u64,
    /// Interrupts re-sent to the thread running on the CPU now because the one first chosen
    /// had not claimed them in time (it had lost the CPU).
    pub retargets: u64,
}

/// One read path's record, guarded by `rdtgroup_mutex` (nanoseconds).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PathStats {
    reads: u64,
    hold_ns: u64,
    hold_max_ns: u64,
    mutex_waits: u64,
    remote_reads: u64,
    wait_ns: u64,
    wait_max_ns: u64,
    non_values: u64,
    age_ns: u64,
    age_max_ns: u64,
}

impl PathStats {
    /// Records one read, from inside `rdtgroup_mutex`: how long it held the mutex, whether it
    /// had to wait for it, and what it returned.
    #[inline]
    pub(super) fn record(
        &mut self,
        hold: Duration,
        waited_for_mutex: bool,
        read: Option<&MonRead>,
    ) {
        let ns = |d: Duration| d.as_nanos() as u64;
        self.reads += 1;
        self.hold_ns += ns(hold);
        self.hold_max_ns = self.hold_max_ns.max(ns(hold));
        self.mutex_waits += u64::from(waited_for_mutex);
        let Some(read) = read else {
            return;
        };
        if read.value.value().is_none() {
            self.non_values += 1;
        }
        if let Some(waited) = read.waited {
            self.remote_reads += 1;
            self.wait_ns += ns(waited);
            self.wait_max_ns = self.wait_max_ns.max(ns(waited));
        }
        if let Some(age) = read.age {
            self.age_ns += ns(age);
            self.age_max_ns = self.age_max_ns.max(ns(age));
        }
    }

    fn snapshot(&self) -> HoldStats {
        let d = Duration::from_nanos;
        HoldStats {
            reads: self.reads,
            hold_total: d(self.hold_ns),
            hold_max: d(self.hold_max_ns),
            mutex_waits: self.mutex_waits,
            remote_reads: self.remote_reads,
            executor_wait_total: d(self.wait_ns),
            executor_wait_max: d(self.wait_max_ns),
            non_values: self.non_values,
            age_total: d(self.age_ns),
            age_max: d(self.age_max_ns),
        }
    }
}

/// How reads were executed, counted by whoever executed them (the worker counts its own runs,
/// outside the mutex's view), so atomics.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) worker_runs: AtomicU64,
    pub(super) interrupts: AtomicU64,
    pub(super) reader_direct: AtomicU64,
    pub(super) local_fallbacks: AtomicU64,
    pub(super) cached: AtomicU64,
    pub(super) nohz_fallbacks: AtomicU64,
    pub(super) retargets: AtomicU64,
}

impl Resctrl {
    /// The hold statistics of `path`.
    pub fn hold_stats(&self, path: ReadPath) -> HoldStats {
        lock(&self.shared.rdtgroup_mutex).stats[path.idx()].snapshot()
    }

    /// How reads were executed.
    pub fn path_counts(&self) -> PathCounts {
        let c = &self.shared.counts;
        PathCounts {
            worker_runs: c.worker_runs.load(Ordering::Relaxed),
            interrupts: c.interrupts.load(Ordering::Relaxed),
            reader_direct: c.reader_direct.load(Ordering::Relaxed),
            local_fallbacks: c.local_fallbacks.load(Ordering::Relaxed),
            cached: c.cached.load(Ordering::Relaxed),
            nohz_fallbacks: c.nohz_fallbacks.load(Ordering::Relaxed),
            retargets: c.retargets.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the hold statistics and path counts (not the violations).
    pub fn reset_stats(&self) {
        lock(&self.shared.rdtgroup_mutex).stats = Default::default();
        let c = &self.shared.counts;
        for a in [
            &c.worker_runs,
            &c.interrupts,
            &c.reader_direct,
            &c.local_fallbacks,
            &c.cached,
            &c.nohz_fallbacks,
            &c.retargets,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// What the calling thread has used so far: read once per pass, not per read (each field is
/// a system call of several hundred nanoseconds).
#[derive(Debug, Clone, Copy)]
pub(super) struct ThreadUsage {
    at: Instant,
    /// Voluntary context switches (`ru_nvcsw` of `getrusage(RUSAGE_THREAD)`).
    nvcsw: i64,
    /// CPU time (`CLOCK_THREAD_CPUTIME_ID`).
    cpu_ns: u64,
}

impl ThreadUsage {
    pub(super) fn now() -> Self {
        // SAFETY: `rusage` is plain data; all-zero bytes are a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable `rusage`.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Self {
            at: Instant::now(),
            nvcsw: ru.ru_nvcsw,
            cpu_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
        }
    }

    /// Since `earlier`: (voluntary context switches, time off-CPU = wall minus CPU time).
    pub(super) fn since(&self, earlier: &ThreadUsage) -> (u64, Duration) {
        let wall = self.at.duration_since(earlier.at);
        let cpu = Duration::from_nanos(self.cpu_ns.saturating_sub(earlier.cpu_ns));
        (
            (self.nvcsw - earlier.nvcsw).max(0) as u64,
            wall.saturating_sub(cpu),
        )
    }
}
