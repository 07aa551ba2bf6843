//! Read path 1, the workqueue (`smp_call_on_cpu`): a worker hop to the domain's
//! housekeeping CPU, always.

use qpw_core::sync::Ordering;

use super::error::ResctrlError;
use super::event::Event;
use super::file::MonFile;
use std::time::Instant;

use qpw_core::sync::MutexGuard;

use super::groups::RdtState;
use super::hardware::Executing;
use super::model::{lock, Resctrl, Shared};
use super::read::Executed;
use super::value::{Executor, ReadValue};

#[derive(Debug, Default)]
pub(super) struct WqRequest {
    seq: u64,
    pub(super) domain: usize,
    pub(super) rmid: u32,
    pub(super) event: Option<Event>,
    pub(super) result: Option<(u64, ReadValue, Option<usize>)>,
}

impl Resctrl {
    /// `mon_event_read` where it queues to a worker (the workqueue path, and the local path
    /// from outside the domain): `cpu = cpumask_any_housekeeping(domain)`; if that CPU is
    /// `nohz_full` (so is every CPU of the domain), `smp_call_function_any`, else
    /// `smp_call_on_cpu(cpu)`.
    pub(super) fn mon_event_read_queued(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
    ) -> Result<Executed, ResctrlError> {
        if self.shared.domains[file.domain].all_nohz_full {
            self.nohz_full_fallback(state, file)
        } else {
            self.smp_call_on_cpu(file)
        }
    }

    /// Path 1: post the read to the housekeeping CPU's worker and sleep until it ran.
    pub(super) fn smp_call_on_cpu(&self, file: &MonFile) -> Result<Executed, ResctrlError> {
        let cpu = self.shared.domains[file.domain].housekeeping;
        let seq = {
            let mut req = lock(&self.shared.wq);
            req.seq += 1;
            req.domain = file.domain;
            req.rmid = file.rmid;
            req.event = Some(file.event);
            req.result = None;
            req.seq
        };
        let posted = Instant::now();
        self.read_work.queue_on(cpu)?;
        self.read_work
            .flush_timeout(cpu, self.shared.call_timeout)?;
        let waited = Some(posted.elapsed());
        let mut req = lock(&self.shared.wq);
        match req.result.take() {
            Some((s, value, ran_on)) if s == seq => Ok((
                value,
                Executor::Worker {
                    cpu: ran_on.unwrap_or(cpu),
                },
                waited,
            )),
            _ => Ok((ReadValue::Error, Executor::Worker { cpu }, waited)),
        }
    }
}

impl Shared {
    /// The worker side of path 1 (`smp_mon_event_count`), on `cpu`'s worker.
    pub(super) fn smp_mon_event_count(&self, cpu: usize) {
        self.counts.worker_runs.fetch_add(1, Ordering::Relaxed);
        let on = Some(Executing::now(cpu));
        let mut req = lock(&self.wq);
        let Some(event) = req.event else {
            return;
        };
        let value = self.hw.rmid_read(on, req.domain, req.rmid, event);
        req.result = Some((req.seq, value, Some(cpu)));
    }
}
