//! The hook alone: AppArmor's file-permission hook run back to back on every CPU, without the
//! system calls around it, to see what each design's get and put cost when that is all the
//! CPUs do. hackbench dilutes the pool in a pipe `write` and `read` per message; this shows
//! the part that grows with the number of CPUs taking the global lock at once.

use std::time::Duration;

use qpw_core::Qpw;

use super::bound_threads::run_bound;
use super::buffer_pool::{BufferPool, PoolStats};
use super::design::Design;
use super::error::{check, PoolError};
use super::hook::{file_permission, FileName};

/// What one run of [`hooks_alone`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HooksReport {
    /// The pool's design.
    pub design: Design,
    /// Threads, bound round-robin to the instance's CPUs.
    pub threads: usize,
    /// Hook runs in all.
    pub hooks: u64,
    /// Hook runs whose buffer did not read back what they wrote (must be 0).
    pub corrupt: u64,
    /// Wall time from the start barrier to the last thread's end.
    pub elapsed: Duration,
    /// Hook runs per second, all threads together.
    pub hooks_per_sec: f64,
    /// The pool's counters at the end.
    pub stats: PoolStats,
}

/// Runs `per_thread` hooks (get, write a pipe's name, match it, put) back to back on each of
/// `threads` threads (1-64), bound round-robin to `qpw`'s CPUs.
pub fn hooks_alone(
    qpw: &Qpw,
    pool: &dyn BufferPool,
    threads: usize,
    per_thread: usize,
) -> Result<HooksReport, PoolError> {
    check("threads", threads, 1, 64)?;
    check("hooks per thread", per_thread, 1, 10_000_000)?;
    let cpus: Vec<usize> = qpw.cpus().iter().collect();
    let work = (0..threads).map(|t| (cpus[t % cpus.len()], t)).collect();
    let (elapsed, corrupt) = run_bound(qpw, "hook", work, |t| {
        let name = FileName::named(&format!("pipe:[{}]", 4_026_532_000 + t));
        let mut damaged = 0;
        for _ in 0..per_thread {
            damaged += u64::from(!file_permission(pool, &name)?);
        }
        Ok(damaged)
    })?;
    let hooks = (threads * per_thread) as u64;
    Ok(HooksReport {
        design: pool.design(),
        threads,
        hooks,
        corrupt,
        elapsed,
        hooks_per_sec: hooks as f64 / elapsed.as_secs_f64().max(1e-9),
        stats: pool.stats(),
    })
}
