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
    /// Queue, remote or fenced, on every CPU.
    pub mode: Mode,
    /// The workload.
    pub workload: WorkloadName,
    /// Requester drains per second (0: none).
    pub drain_rate_hz: f64,
    /// Forced drains (reach every CPU even when its cache is empty).
    pub force: bool,
    /// Stall timeout per drain.
    pub timeout: Duration,
    /// A drain that waits at least this long counts as a stall.
    pub stall_threshold: Duration,
    /// CPUs that run a process-context load thread.
    pub load_cpus: CpuSet,
    /// The requester's CPU.
    pub requester_cpu: usize,
    /// How often the probe does its own local operation.
    pub local_op_every: Duration,
    /// Whether the probe polls its binding between its operations (`Binding::poll`).
    pub owner_polls: bool,
    /// `SCHED_FIFO` priority of the requester, if any.
    pub requester_prio: Option<i32>,
    /// The measured CPU (a kernel workload's filler runs there).
    pub target_cpu: usize,
    /// For a kernel workload: what its preflight left ready (kernel-pcp's held page).
    pub kernel_ready: crate::kernel::Ready,
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
    load: Running,
    before: Vec<CpuCounters>,
    local_op_every: Duration,
    owner_polls: bool,
}

/// The load that runs: ours on the emulated caches, or the kernel's own drains.
#[derive(Debug)]
enum Running {
    Emulated(Load),
    Kernel(crate::kernel::KernelLoad, crate::kernel::KernelDrain),
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
    /// A kernel workload: the drains are the kernel's, and only the trace can tell which of
    /// them reached the target (`target_drains` is 0).
    pub kernel_workload: bool,
    /// The workload's conservation check after the run.
    pub conservation: Result<(), String>,
}

/// Builds the instance and the workload, and starts the load threads (they wait for the go).
pub fn setup(spec: &DrainSpec) -> Result<Setup> {
    if let Some(k) = spec.workload.kernel() {
        return setup_kernel(spec, k);
    }
    let policy = match spec.mode {
        Mode::Queue => Policy::Queue,
        Mode::Remote => Policy::Remote,
        Mode::Fenced => Policy::Fenced,
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
        stall_threshold: spec.stall_threshold,
        load_cpus: spec.load_cpus.clone(),
        burst: 16,
        pause: Duration::from_micros(200),
        requester_prio: spec.requester_prio,
    };
    let load = Running::Emulated(load::start(&cfg, &qpw, &workload, &phase)?);
    let before = workload.counters();
    Ok(Setup {
        qpw,
        workload,
        phase,
        load,
        before,
        local_op_every: spec.local_op_every,
        owner_polls: spec.owner_polls,
    })
}

/// A kernel workload: no emulated cache, no process-context load; the requester sets off the
/// kernel's drain (the framework instance is built only to be described).
fn setup_kernel(spec: &DrainSpec, k: crate::kernel::KernelDrain) -> Result<Setup> {
    let qpw = Arc::new(
        Qpw::builder()
            .cpus(CpuSpec::Allowed)
            .policy(Policy::Queue)
            .build()
            .context("cannot build the qpw instance")?,
    );
    let workload = WorkloadName::Counter.build(&qpw)?;
    let phase = Arc::new(Phase::default());
    let kernel = crate::kernel::KernelLoad::start(
        k,
        spec.target_cpu,
        spec.requester_cpu,
        spec.drain_rate_hz,
        &phase,
        &spec.kernel_ready,
    )?;
    Ok(Setup {
        qpw,
        workload,
        phase,
        load: Running::Kernel(kernel, k),
        before: Vec::new(),
        local_op_every: spec.local_op_every,
        owner_polls: spec.owner_polls,
    })
}

impl Setup {
    /// The probe's local operation on this scenario's workload; none for a kernel workload
    /// (the kernel's caches are filled by the filler, not by the probe).
    pub fn local_op(&self) -> Option<LocalOp> {
        matches!(self.load, Running::Emulated(_)).then(|| LocalOp {
            qpw: self.qpw.clone(),
            workload: self.workload.clone(),
            every: self.local_op_every,
            polls: self.owner_polls,
        })
    }

    /// What drains, in words: the framework instance, or the kernel's own drain.
    pub fn describe(&self) -> String {
        match &self.load {
            Running::Emulated(_) => self.qpw.describe(),
            Running::Kernel(_, k) if k.is_remote() => format!(
                "the running kernel's own drains: {} (mode 1 since 6.0: no work on the other \
                 CPUs, the caller drains each one under its lock; before 6.0, {} on each)",
                k.effect(),
                k.work_functions().join(", ")
            ),
            Running::Kernel(_, k) => format!(
                "the running kernel's own drains: {} (work on each CPU: {})",
                k.effect(),
                k.work_functions().join(", ")
            ),
        }
    }

    /// Stops the load (if the probe has not), collects its figures and checks conservation.
    pub fn finish(self, target: Option<usize>) -> Result<Outcome> {
        self.phase.stop();
        let (requester, load) = match self.load {
            Running::Emulated(load) => load.finish()?,
            Running::Kernel(k, _) => {
                let requester = k.finish()?;
                let load = LoadReport {
                    cpus: "(none: a kernel workload)".to_string(),
                    ..LoadReport::default()
                };
                return Ok(Outcome {
                    requester_hist: requester.as_ref().map(|r| r.1.clone()),
                    requester: requester.map(|r| r.0),
                    load,
                    target_drains: 0,
                    kernel_workload: true,
                    conservation: Ok(()),
                });
            }
        };
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
            kernel_workload: false,
            conservation,
        })
    }
}
