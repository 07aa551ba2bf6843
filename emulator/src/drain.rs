//! The drain load as the commands take it from the command line and report it: its options
//! validated into a [`DrainSpec`] ([`resolve_drain`], with the mode's name, [`parse_mode`], and
//! the kernel's rule for `auto`, [`auto_mode`]), the load around one `oslat` or `cyclictest`
//! run ([`ProbeLoad`]), and what it did: in the warnings ([`note_outcome`]), on the
//! requester's line ([`print_requester`]) and in our JSON fields ([`qpw_fields`]).
//!
//! The drop-ins, `load` and the default experiment use it; it uses none of them (see
//! [`crate::commands`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use qpw_core::{CpuSet, Mode};

use crate::cli::DrainArgs;
use crate::cpus::Cpus;
use crate::json::{QpwFields, Settings, ThreadFigures};
use crate::load::Phase;
use crate::oslat::LocalOp;
use crate::scenario::{self, DrainSpec, Outcome};
use crate::sink::Sink;
use crate::throttling::ThrottlingOff;
use crate::validate;
use crate::workload::WorkloadName;

/// The drain options, validated; `None` when no load was asked for.
pub fn resolve_drain(
    args: &DrainArgs,
    cpus: &Cpus,
    measured: &CpuSet,
    force: bool,
) -> Result<Option<DrainSpec>> {
    // Check every value even when the load is off, so a typo never passes silently.
    let values = DrainValues::checked(args)?;
    let (mode, workload, requester) = choices(args, cpus, measured)?;
    if args.mode.is_none() && workload.is_none() {
        return Ok(None);
    }
    let requester_cpu = match requester {
        Some(c) => c,
        None => cpus.housekeeping(measured).ok_or_else(|| {
            anyhow!(
                "no CPU is left for the requester: every allowed CPU ({}) is measured",
                cpus.allowed
            )
        })?,
    };
    let load_cpus = if values.load {
        cpus.allowed.difference(measured)
    } else {
        CpuSet::new()
    };
    let workload = workload.unwrap_or_else(WorkloadName::default_mm);
    let kernel_ready = kernel_ready(args, workload, mode)?;
    let rate = match (values.rate, workload.kernel()) {
        (Some(r), _) => r,
        (None, Some(k)) => k.default_rate_hz(),
        (None, None) => 1000.0,
    };
    let target_cpu = measured
        .first()
        .ok_or_else(|| anyhow!("no CPU is measured"))?;
    Ok(Some(DrainSpec {
        mode: mode.unwrap_or_else(|| auto_mode(cpus, target_cpu)),
        workload,
        drain_rate_hz: rate,
        force,
        timeout: Duration::from_millis(values.timeout),
        stall_threshold: Duration::from_millis(values.stall_threshold),
        load_cpus,
        requester_cpu,
        local_op_every: values.every,
        owner_polls: false,
        requester_prio: None,
        target_cpu,
        kernel_ready,
    }))
}

/// The drain's numbers and switches, each checked against its legal range.
struct DrainValues {
    /// `--drain-rate`, when given.
    rate: Option<f64>,
    /// `--load`: whether the other CPUs run the load.
    load: bool,
    /// `--local-op-every`.
    every: Duration,
    /// `--drain-timeout`, in milliseconds.
    timeout: u64,
    /// `--stall-threshold`, in milliseconds.
    stall_threshold: u64,
}

impl DrainValues {
    /// Checks each value, then that the stall threshold fits in the drain timeout.
    fn checked(args: &DrainArgs) -> Result<Self> {
        let rate = args
            .drain_rate
            .as_deref()
            .map(|r| validate::float_in("--drain-rate", r, 0.0, 100_000.0))
            .transpose()?;
        let load = validate::on_off("--load", &args.load)?;
        let every = validate::op_interval("--local-op-every", &args.local_op_every)?;
        let timeout = validate::int_in("--drain-timeout", &args.drain_timeout, 1, 60_000)?;
        let stall_threshold =
            validate::int_in("--stall-threshold", &args.stall_threshold, 1, 60_000)?;
        if stall_threshold > timeout {
            bail!(
                "--stall-threshold {stall_threshold}: longer than --drain-timeout {timeout}, so \
                 no stall could ever count (a drain gives up at the timeout); give a threshold \
                 of 1 to {timeout} ms, or a longer --drain-timeout"
            );
        }
        Ok(DrainValues {
            rate,
            load,
            every,
            timeout,
            stall_threshold,
        })
    }
}

/// The mode, workload and requester CPU asked for, each checked; the requester must not be a
/// measured CPU.
fn choices(
    args: &DrainArgs,
    cpus: &Cpus,
    measured: &CpuSet,
) -> Result<(Option<Mode>, Option<WorkloadName>, Option<usize>)> {
    // `auto` (or no --mode) is the kernel's rule (FIDELITY 5), for the measured CPU: remote when
    // it is isolated or nohz_full, queue otherwise.
    let mode = match args.mode.as_deref() {
        Some(m) if m.trim() == "auto" => None,
        other => other.map(parse_mode).transpose()?,
    };
    let workload = args
        .workload
        .as_deref()
        .map(|w| {
            w.parse::<WorkloadName>()
                .map_err(|e| anyhow!("{} {w}: {e}", args.workload_flag))
        })
        .transpose()?;
    let requester = args
        .requester_cpu
        .as_deref()
        .map(|c| validate::cpu("--requester-cpu", c, &cpus.allowed))
        .transpose()?;
    if let Some(c) = requester.filter(|&c| measured.contains(c)) {
        bail!(
            "--requester-cpu {c}: is a measured CPU (measured, or left free with `load \
             --free`: {measured}): the requester's drains would preempt the probe they measure; \
             give another CPU of {}",
            cpus.allowed
        );
    }
    Ok((mode, workload, requester))
}

/// For a kernel workload: refuses a remote `--mode` (the kernel picks its own), then checks
/// now, before any set-up, that the kernel's drain can run here.
fn kernel_ready(
    args: &DrainArgs,
    workload: WorkloadName,
    mode: Option<Mode>,
) -> Result<crate::kernel::Ready> {
    let Some(k) = workload.kernel() else {
        return Ok(crate::kernel::Ready::default());
    };
    if let Some(m) = mode.filter(|m| m.is_remote()) {
        bail!(
            "--mode {m} {} {k}: the running kernel decides its own mode (see \
             `qpw-emu trace`'s kernel report); leave --mode out for kernel workloads",
            args.workload_flag
        );
    }
    // Refuse now, before any set-up, when the kernel's drain cannot run here.
    crate::kernel::preflight(k)
}

/// The kernel's rule for one CPU (`pwlocks=` auto-enabled by isolation, per CPU as qpw-core's
/// `Policy::Auto` does it): remote on an isolated or `nohz_full` CPU, queue elsewhere.
pub fn auto_mode(cpus: &Cpus, cpu: usize) -> Mode {
    if cpus.isolated.contains(cpu) {
        Mode::Remote
    } else {
        Mode::Queue
    }
}

/// With `--no-rt-throttling`: RT throttling off until the guard drops (refused without root,
/// before anything runs).
pub fn throttling_for_run(args: &DrainArgs, sink: &mut Sink) -> Result<Option<ThrottlingOff>> {
    args.no_rt_throttling
        .then(|| ThrottlingOff::for_run(sink))
        .transpose()
}

/// `queue`, `remote` or `fenced`.
pub fn parse_mode(raw: &str) -> Result<Mode> {
    match raw.trim() {
        "queue" => Ok(Mode::Queue),
        "remote" => Ok(Mode::Remote),
        "fenced" => Ok(Mode::Fenced),
        _ => Err(anyhow!(
            "--mode {raw}: must be `auto`, `queue`, `remote` or `fenced`"
        )),
    }
}

/// Our fields for a probe run (`tool`) under an optional drain load; `settings` gets the local
/// operation's period from `spec`; an `interrupted` run says so (and why it stopped).
pub fn qpw_fields(
    tool: &str,
    spec: Option<&DrainSpec>,
    load: &LoadAfter,
    figures: Vec<ThreadFigures>,
    mut settings: Settings,
    sink: &Sink,
    interrupted: bool,
) -> QpwFields {
    let outcome = load.outcome.as_ref();
    settings.local_op_every_us = spec.map(|s| s.local_op_every.as_secs_f64() * 1e6);
    QpwFields {
        tool: tool.to_string(),
        scenario: None,
        mode: spec.map(|s| s.mode.name().to_string()),
        workload: spec.map(|s| s.workload.name().to_string()),
        qpw: load.desc.clone(),
        settings: Some(settings),
        percentiles: figures,
        interruptions: None,
        probe_preemptions: None,
        requester: outcome.and_then(|o| o.requester.clone()),
        rt_throttling: None,
        isolation: None,
        load: outcome.map(|o| o.load.clone()),
        stopped_by: interrupted.then(crate::signals::stopped_by),
        interrupted,
        warnings: sink.warnings().to_vec(),
        trace: None,
    }
}

/// The optional drain load around one `oslat` or `cyclictest` run: set up before the probe,
/// released at the probe's start barrier, finished after it.
#[derive(Debug)]
pub struct ProbeLoad {
    /// The scenario, when a load was asked for.
    setup: Option<scenario::Setup>,
    /// The phase the probe releases: the scenario's, or one nothing waits on.
    pub phase: Arc<Phase>,
    /// The framework instance, described before the run.
    desc: Option<String>,
}

/// The drain load once the probe is done.
#[derive(Debug)]
pub struct LoadAfter {
    /// The framework instance it ran on.
    desc: Option<String>,
    /// What it did; `None` without a load.
    pub outcome: Option<Outcome>,
}

impl ProbeLoad {
    /// Sets up the load of `spec`, if any; its threads wait for the probe's go.
    pub fn start(spec: Option<&DrainSpec>) -> Result<Self> {
        let setup = spec.map(scenario::setup).transpose()?;
        let phase = setup
            .as_ref()
            .map_or_else(|| Arc::new(Phase::default()), |s| s.phase.clone());
        let desc = setup.as_ref().map(|s| s.describe());
        Ok(Self { setup, phase, desc })
    }

    /// The probe's local operation on the load's workload.
    pub fn local_op(&self) -> Option<LocalOp> {
        self.setup.as_ref().and_then(|s| s.local_op())
    }

    /// Finishes the load once the probe has returned `run`, also when the probe failed (so
    /// that no load thread is left behind); then adds the probe's warnings (`probe_warnings`
    /// of its run) and the load's to `warnings`, in that order. `target` is the measured CPU
    /// whose drains are counted.
    pub fn finish<R>(
        self,
        run: Result<R>,
        probe_warnings: impl FnOnce(&R) -> &[String],
        target: Option<usize>,
        sink: &mut Sink,
    ) -> Result<(R, LoadAfter)> {
        let outcome = self.setup.map(|s| s.finish(target)).transpose()?;
        let run = run?;
        sink.warn_all(probe_warnings(&run).to_vec());
        if let Some(o) = &outcome {
            note_outcome(o, sink);
        }
        let after = LoadAfter {
            desc: self.desc,
            outcome,
        };
        Ok((run, after))
    }
}

/// Folds the scenario's conservation check and load errors into the warnings.
pub fn note_outcome(outcome: &Outcome, sink: &mut Sink) {
    if let Err(e) = &outcome.conservation {
        sink.warn(format!("conservation check failed: {e}"));
    }
    if let Some(e) = &outcome.load.first_error {
        sink.warn(format!("process-context load: {e}"));
    }
}

/// Prints the requester's line.
pub fn print_requester(o: &Outcome) {
    if let Some(r) = &o.requester {
        eprintln!(
            "# qpw-emu requester (cpu {}): {} drains at {}/s: p50 {:.1} p99 {:.1} max {:.1} us (avg {:.1}); \
             {} stalls, {} errors, {} missed slots; CPU drains: {} queued, {} remote, {} skipped",
            r.cpu,
            r.drains,
            r.rate_hz,
            r.time_us.p50,
            r.time_us.p99,
            r.time_us.max,
            r.avg_us,
            r.stalls,
            r.errors,
            r.missed_deadlines,
            r.cpus_queued,
            r.cpus_remote,
            r.cpus_skipped
        );
        if r.stalls > 0 {
            let longest = r.stall_waits_ms.iter().copied().fold(0.0, f64::max);
            eprintln!(
                "# qpw-emu   {} stalls: drains that gave up after {} ms or waited {} ms or more \
                 (longest {longest:.1} ms; each wait in the JSON)",
                r.stalls, r.timeout_ms, r.stall_threshold_ms
            );
        }
        if let Some(e) = &r.first_error {
            eprintln!("# qpw-emu   first drain error: {e}");
        }
    }
    if let Some(p) = o.requester.as_ref().and_then(|r| r.kernel_pcp.as_ref()) {
        eprintln!("# qpw-emu   kernel-pcp: {}", p.line());
    }
    if o.kernel_workload {
        eprintln!(
            "# qpw-emu load: the kernel's own drains, no process-context load; which of them \
             reached the measured CPU only a trace shows (--trace, or qpw-emu trace beside)"
        );
        return;
    }
    eprintln!(
        "# qpw-emu load: {} process-context ops on cpu(s) {} ({} errors); {} drains reached the measured CPU",
        o.load.ops, o.load.cpus, o.load.errors, o.target_drains
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_mode_is_remote_on_isolated_cpus_only() {
        let cpus = Cpus {
            allowed: CpuSet::from_iter([0, 1, 2, 3]),
            isolated: CpuSet::from_iter([3]),
            target: 3,
        };
        assert_eq!(auto_mode(&cpus, 3), Mode::Remote);
        assert_eq!(auto_mode(&cpus, 1), Mode::Queue);
        assert!(
            parse_mode("auto").is_err(),
            "auto is resolved before parse_mode"
        );
    }
}
