//! What the model records about its reads: `rdtgroup_mutex` hold statistics per read path
//! and how each read was executed.

use std::time::{Duration, Instant};

use qpw_core::sync::{AtomicU64, Ordering};

use super::model::Resctrl;
use super::read_path::ReadPath;

/// `rdtgroup_mutex` hold statistics of one read path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldStats {
    /// File reads.
    pub reads: u64,
    /// Total time the mutex was held by those reads.
    pub hold_total: Duration,
    /// The longest hold.
    pub hold_max: Duration,
    /// Voluntary context switches of the reader while holding it (`ru_nvcsw`).
    pub voluntary_switches: u64,
    /// Time the reader was off-CPU while holding it (hold time minus thread CPU time).
    pub off_cpu: Duration,
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
}

#[derive(Debug, Default)]
pub(super) struct PathStats {
    pub(super) reads: AtomicU64,
    hold_ns: AtomicU64,
    hold_max_ns: AtomicU64,
    nvcsw: AtomicU64,
    off_cpu_ns: AtomicU64,
    pub(super) non_values: AtomicU64,
    pub(super) age_ns: AtomicU64,
    pub(super) age_max_ns: AtomicU64,
}

#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) worker_runs: AtomicU64,
    pub(super) interrupts: AtomicU64,
    pub(super) reader_direct: AtomicU64,
    pub(super) local_fallbacks: AtomicU64,
    pub(super) cached: AtomicU64,
}

impl Resctrl {
    /// The hold statistics of `path`.
    pub fn hold_stats(&self, path: ReadPath) -> HoldStats {
        let s = &self.shared.stats[path.idx()];
        let ns = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        HoldStats {
            reads: s.reads.load(Ordering::Relaxed),
            hold_total: ns(&s.hold_ns),
            hold_max: ns(&s.hold_max_ns),
            voluntary_switches: s.nvcsw.load(Ordering::Relaxed),
            off_cpu: ns(&s.off_cpu_ns),
            non_values: s.non_values.load(Ordering::Relaxed),
            age_total: ns(&s.age_ns),
            age_max: ns(&s.age_max_ns),
        }
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
        }
    }

    /// Zeroes the hold statistics and path counts (not the violations).
    pub fn reset_stats(&self) {
        for s in &self.shared.stats {
            for a in [
                &s.reads,
                &s.hold_ns,
                &s.hold_max_ns,
                &s.nvcsw,
                &s.off_cpu_ns,
                &s.non_values,
                &s.age_ns,
                &s.age_max_ns,
            ] {
                a.store(0, Ordering::Relaxed);
            }
        }
        let c = &self.shared.counts;
        for a in [
            &c.worker_runs,
            &c.interrupts,
            &c.reader_direct,
            &c.local_fallbacks,
            &c.cached,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// Measures one `rdtgroup_mutex` hold: wall time, voluntary context switches and thread CPU
/// time, so that time off-CPU is wall minus CPU.
pub(super) struct HoldProbe {
    start: Instant,
    nvcsw: i64,
    cpu_ns: u64,
}

fn thread_nvcsw() -> i64 {
    // SAFETY: `rusage` is plain data; all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nvcsw
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl HoldProbe {
    pub(super) fn start() -> Self {
        Self {
            nvcsw: thread_nvcsw(),
            cpu_ns: thread_cpu_ns(),
            start: Instant::now(),
        }
    }

    pub(super) fn finish(self, stats: &PathStats) {
        let wall = self.start.elapsed().as_nanos() as u64;
        let cpu = thread_cpu_ns().saturating_sub(self.cpu_ns);
        let switches = (thread_nvcsw() - self.nvcsw).max(0) as u64;
        stats.reads.fetch_add(1, Ordering::Relaxed);
        stats.hold_ns.fetch_add(wall, Ordering::Relaxed);
        stats.hold_max_ns.fetch_max(wall, Ordering::Relaxed);
        stats.nvcsw.fetch_add(switches, Ordering::Relaxed);
        stats
            .off_cpu_ns
            .fetch_add(wall.saturating_sub(cpu), Ordering::Relaxed);
    }
}
