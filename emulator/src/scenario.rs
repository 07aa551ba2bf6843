//! One measured scenario's surroundings: the framework instance in the chosen mode, the
//! workload built on it, and the load (requester plus process-context threads) that the probe
//! releases at its start barrier.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use qpw_core::{CpuSet, CpuSpec, Mode, Policy, Qpw};
use qpw_workloads::{CpuCounters, Workload};

use crate::load::{self, Load, LoadConfig, LoadReport, Phase, RequesterReport};
use crate::oslat::LocalOp;
use crate::workload::WorkloadName;

/// The drains around a probe.
#[derive(Debug, Clone)]
pub struct DrainSpec {
    /// Queue or remote, on every CPU.
    pub mode: Mode,
    /// The workload.
    pub workload: WorkloadName,
    /// Requester drains per second (0: none).
    pub drain_rate_hz: f64,
    /// Forced drains (reach every CPU even when its cache is empty).
    pub force: bool,
    /// Stall timeout per drain.
    pub timeout: Duration,
    /// CPUs that run a process-context load thread.
    pub load_cpus: CpuSet,
    /// The requester's CPU.
    pub requester_cpu: usize,
    /// How often the probe does its own local operation.
    pub local_op_every: Duration,
    /// `SCHED_FIFO` priority of the requester, if any.
    pub requester_prio: Option<i32>,
}

/// A scenario set up and waiting for the probe's go.
#[derive(Debug)]
pub struct Setup {
    /// The framework instance.
    pub qpw: Arc<Qpw>,
    /// The workload on it.
    pub workload: Arc<dyn Workload>,
    /// The load's phase: the probe starts and stops it.
    pub phase: Arc<Phase>,
    load: Load,
    before: Vec<CpuCounters>,
    local_op_every: Duration,
}

/// What the scenario's load did.
#[derive(Debug)]
pub struct Outcome {
    /// The requester's figures.
    pub requester: Option<RequesterReport>,
    /// The requester's drain-time histogram (for merging runs).
    pub requester_hist: Option<crate::load::DrainTimes>,
    /// The process-context load's figures.
    pub load: LoadReport,
    /// Drains of the target CPU during the run (queued to it or run under its lock).
    pub target_drains: u64,
    /// The workload's conservation check after the run.
    pub conservation: Result<(), String>,
}

/// Builds the instance and the workload, and starts the load threads (they wait for the go).
pub fn setup(spec: &DrainSpec) -> Result<Setup> {
    let policy = match spec.mode {
        Mode::Queue => Policy::Queue,
        Mode::Remote => Policy::Remote,
    };
    let qpw = Arc::new(
        Qpw::builder()
            .cpus(CpuSpec::Allowed)
            .policy(policy)
            .build()
            .context("cannot build the qpw instance")?,
    );
    let workload = spec.workload.build(&qpw)?;
    let phase = Arc::new(Phase::default());
    let cfg = LoadConfig {
        requester_cpu: spec.requester_cpu,
        drain_rate_hz: spec.drain_rate_hz,
        force: spec.force,
        timeout: spec.timeout,
        load_cpus: spec.load_cpus.clone(),
        burst: 16,
        pause: Duration::from_micros(200),
        requester_prio: spec.requester_prio,
    };
    let load = load::start(&cfg, &qpw, &workload, &phase)?;
    let before = workload.counters();
    Ok(Setup {
        qpw,
        workload,
        phase,
        load,
        before,
        local_op_every: spec.local_op_every,
    })
}

impl Setup {
    /// The probe's local operation on this scenario's workload.
    pub fn local_op(&self) -> LocalOp {
        LocalOp {
            qpw: self.qpw.clone(),
            workload: self.workload.clone(),
            every: self.local_op_every,
        }
    }

    /// Stops the load (if the probe has not), collects its figures and checks conservation.
    pub fn finish(self, target: Option<usize>) -> Result<Outcome> {
        self.phase.stop();
        let (requester, load) = self.load.finish()?;
        let (requester, requester_hist) = match requester {
            Some((r, h)) => (Some(r), Some(h)),
            None => (None, None),
        };
        let after = self.workload.counters();
        let target_drains = target.map_or(0, |cpu| {
            let get = |v: &[CpuCounters]| {
                v.iter()
                    .find(|c| c.cpu == cpu)
                    .map_or(0, |c| c.drains_queued + c.drains_remote)
            };
            get(&after).saturating_sub(get(&self.before))
        });
        let conservation = self.workload.check_conservation();
        Ok(Outcome {
            requester,
            requester_hist,
            load,
            target_drains,
            conservation,
        })
    }
}
