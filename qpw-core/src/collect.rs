//! A drain that returns what it took: per-CPU work that takes something out of each CPU's
//! state (a counter's increments, a histogram, a batch) and hands it to the caller.
//!
//! Every service with per-CPU state writes this: a work item whose function locks its CPU's
//! slot, takes the value, and pushes it to a shared list that the drain's caller then reads.
//! [`Collector`] is that item, made once and run as often as needed; it runs where the CPU's
//! mode says (the CPU's worker in queue mode, the caller under the CPU's lock in remote and
//! fenced mode), like any [`PerCpuWork`]. For the same job without work (the caller takes each
//! lock itself, in every mode), use [`PerCpu::take_each`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{DrainReport, PerCpu, PerCpuWork, Qpw, RawLocalLock, Result};

/// Per-CPU work that takes a value out of each CPU's state and returns the values to the
/// caller: made by [`Qpw::collector`].
///
/// ```
/// use std::time::Duration;
/// let qpw = qpw_core::Qpw::with_policy(qpw_core::Policy::Remote)?;
/// let requests = qpw.per_cpu(|cpu| cpu as u64 + 1); // each CPU's count so far
/// let collector = qpw.collector(&requests, |_cpu, count| std::mem::take(count))?;
/// let (taken, report) = collector.collect_timeout(Duration::from_secs(1));
/// report.into_result()?;
/// let total: u64 = taken.iter().map(|(_cpu, n)| n).sum();
/// assert_eq!(total, qpw.cpus().iter().map(|cpu| cpu as u64 + 1).sum::<u64>());
/// // Taken, not copied: a second collection finds nothing left.
/// let (again, _) = collector.collect_timeout(Duration::from_secs(1));
/// assert!(again.iter().all(|(_, n)| *n == 0));
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub struct Collector<R> {
    work: PerCpuWork,
    taken: Arc<Mutex<Vec<(usize, R)>>>,
    /// One collection at a time, so that each gets what its own runs took.
    running: Mutex<()>,
}

impl<R> std::fmt::Debug for Collector<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector").finish_non_exhaustive()
    }
}

impl Qpw {
    /// A [`Collector`] over `state`: each run locks its CPU's slot (with
    /// [`PerCpu::lock_work`]) and returns `take(cpu, &mut slot)` to the collection that ran
    /// it. A run refused its lock (a remote run past its deadline) takes nothing, and the
    /// collection's [`DrainReport`] says so.
    pub fn collector<T, L, R, F>(&self, state: &PerCpu<T, L>, take: F) -> Result<Collector<R>>
    where
        T: Send + 'static,
        L: RawLocalLock + Send + Sync + 'static,
        R: Send + 'static,
        F: Fn(usize, &mut T) -> R + Send + Sync + 'static,
    {
        let state = state.clone();
        let taken = Arc::new(Mutex::new(Vec::new()));
        let sink = taken.clone();
        let work = self.work(move |ctx| {
            let Ok(mut slot) = state.lock_work(ctx) else {
                return;
            };
            let value = take(ctx.cpu(), &mut slot);
            drop(slot);
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((ctx.cpu(), value));
        })?;
        Ok(Collector {
            work,
            taken,
            running: Mutex::new(()),
        })
    }
}

impl<R> Collector<R> {
    /// Runs the collector for every CPU of its instance and returns what the runs took, by
    /// CPU, with the drain's report. `timeout` bounds the whole collection as in
    /// [`PerCpuWork::drain_all_timeout`]: a queued run that has not run by then is reported as
    /// a stall, and what it takes when it does run is returned by the next collection, not
    /// lost.
    pub fn collect_timeout(&self, timeout: Duration) -> (Vec<(usize, R)>, DrainReport) {
        let _one = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let report = self.work.drain_all_timeout(|_| true, timeout);
        let mut taken = std::mem::take(&mut *self.taken.lock().unwrap_or_else(|e| e.into_inner()));
        taken.sort_by_key(|(cpu, _)| *cpu);
        (taken, report)
    }
}
