//! The drain-all helper, [`PerCpuWork::drain_all`]: the requester's loop over the CPUs, in
//! the shape of `lru_add_drain_all`, `drain_all_stock` and `flush_all`. For each CPU that
//! needs the work it posts the run to the CPU's queue or, where runs happen in the caller, runs
//! it at once under the CPU's lock; then it flushes each CPU it posted to. One deadline covers
//! the whole drain ([`PerCpuWork::drain_all_timeout`]); what happened, CPU by CPU, and the
//! drain's errors come back in a [`DrainReport`].

use std::time::{Duration, Instant};

use super::PerCpuWork;
use crate::{CpuSet, Error, Result};

impl PerCpuWork {
    /// Runs the work on every CPU for which `needs(cpu)` is true, then flushes each: the shape
    /// of `lru_add_drain_all`, `drain_all_stock` and `flush_all`. Never gives up: a remote run
    /// whose CPU's lock is held (by the caller too) waits for it.
    pub fn drain_all(&self, needs: impl FnMut(usize) -> bool) -> DrainReport {
        self.drain(needs, None)
    }

    /// Like [`drain_all`](Self::drain_all), with one deadline for the whole drain, in both
    /// modes: queued CPUs whose work has not finished by then are reported as
    /// [`Error::Stall`], and a remote run that cannot take its CPU's lock by then (another
    /// thread holds it, or the caller itself) gets [`Error::LockStall`] from
    /// [`PerCpu::lock_work`](crate::PerCpu::lock_work), which the report carries too. A remote
    /// run that starts after the deadline still runs if the lock is free.
    pub fn drain_all_timeout(
        &self,
        needs: impl FnMut(usize) -> bool,
        timeout: Duration,
    ) -> DrainReport {
        self.drain(needs, Some((Instant::now(), timeout)))
    }

    fn drain(
        &self,
        mut needs: impl FnMut(usize) -> bool,
        limit: Option<(Instant, Duration)>,
    ) -> DrainReport {
        let shared = &*self.shared;
        let started = Instant::now();
        let mut report = DrainReport {
            timeout: limit.map(|(_, timeout)| timeout),
            ..DrainReport::default()
        };
        let mut posted = Vec::new();
        for (idx, cpu) in shared.inner.managed.iter().enumerate() {
            if !needs(cpu) {
                report.skipped.insert(cpu);
                continue;
            }
            match &shared.workers[idx] {
                Some(worker) => match worker.post(&shared.slots[idx]) {
                    Ok(fresh) => {
                        report.queued.insert(cpu);
                        if !fresh {
                            report.coalesced.insert(cpu);
                        }
                        posted.push(idx);
                    }
                    Err(e) => report.errors.push(e),
                },
                None => match self.run_remote(idx, cpu, limit) {
                    Ok(()) => {
                        report.ran_remote.insert(cpu);
                    }
                    Err(e @ Error::ShutDown { .. }) => report.errors.push(e),
                    Err(e) => {
                        report.ran_remote.insert(cpu);
                        report.errors.push(e);
                    }
                },
            }
        }
        for idx in posted {
            if let Err(e) = self.flush_idx(idx, limit) {
                report.errors.push(e);
            }
        }
        report.elapsed = started.elapsed();
        report
    }
}

/// What a [`PerCpuWork::drain_all`] did, CPU by CPU.
///
/// It carries the drain's errors (stalls, panics of the work, refusals), each reported once,
/// here: dropping it unread loses them, so the compiler says so.
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # fn main() -> Result<(), qpw_core::Error> {
/// let qpw = qpw_core::Qpw::new()?;
/// let work = qpw.work(|_ctx| {})?;
/// work.drain_all(|_cpu| true); // error: unused `DrainReport` that must be used
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
#[must_use = "the report carries the drain's errors (stalls, panics), reported nowhere else"]
pub struct DrainReport {
    /// CPUs whose work was posted to their worker (and flushed).
    pub queued: CpuSet,
    /// Among `queued`, the CPUs whose work was already pending there, so no new run was
    /// queued (the kernel's `queue_work_on` returning `false`); the flush waited for the
    /// pending run.
    pub coalesced: CpuSet,
    /// CPUs whose work ran in the caller, under their lock (including runs that panicked or
    /// gave up at the deadline, which `errors` names).
    pub ran_remote: CpuSet,
    /// CPUs that did not need the work.
    pub skipped: CpuSet,
    /// What went wrong: stalls, panics, refusals; at most one per CPU.
    pub errors: Vec<Error>,
    /// How long the drain took, from the call to its return.
    pub elapsed: Duration,
    /// The deadline it was given ([`PerCpuWork::drain_all_timeout`]), if any.
    pub timeout: Option<Duration>,
}

impl DrainReport {
    /// Whether every CPU that needed the work got it done.
    pub fn is_complete(&self) -> bool {
        self.errors.is_empty()
    }

    /// Whether the drain returned after its deadline. A deadline bounds every wait the drain
    /// makes (for a queued CPU's worker, for a remote CPU's lock), but not what it cannot
    /// interrupt: a work function that runs long, or the one system call a fenced CPU's lock
    /// may need (a `membarrier` fence waits for the target CPU's interrupt, which a vCPU the
    /// hypervisor does not run takes late). This says when that happened; the report's
    /// `elapsed` says by how much.
    ///
    /// ```
    /// use std::time::Duration;
    /// use qpw_core::{CpuSpec, Policy, Qpw};
    ///
    /// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
    /// let work = qpw.work(|_ctx| {})?;
    /// let report = work.drain_all_timeout(|_cpu| true, Duration::from_secs(5));
    /// assert!(report.is_complete() && !report.overran());
    /// assert_eq!(report.timeout, Some(Duration::from_secs(5)));
    /// # Ok::<(), qpw_core::Error>(())
    /// ```
    pub fn overran(&self) -> bool {
        self.timeout.is_some_and(|timeout| self.elapsed > timeout)
    }

    /// The report, or its first error.
    pub fn into_result(mut self) -> Result<Self> {
        if self.errors.is_empty() {
            Ok(self)
        } else {
            Err(self.errors.swap_remove(0))
        }
    }
}
