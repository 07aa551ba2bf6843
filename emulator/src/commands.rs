//! The commands: validate the options, set up, run the probe or the load, print, export.
//!
//! `oslat` and `cyclictest` have a module each (`commands/oslat.rs`, `commands/cyclictest.rs`):
//! they follow the real tools' output line for line. What they share with `load` (the CPUs, the
//! drain load around a probe, our JSON fields) is here.

mod cyclictest;
mod oslat;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use qpw_core::{CpuSet, Mode, Topology};

use crate::cli::{Cli, Command, DrainArgs, LoadArgs};
use crate::json::{
    self, Buckets, Envelope, Indexed, Micros, OslatBody, OslatThreadJson, QpwFields, Settings,
    ThreadFigures,
};
use crate::load::Phase;
use crate::oslat::{self as probe, OslatRun};
use crate::rt::{self, Warnings};
use crate::scenario::{self, DrainSpec, Outcome};
use crate::throttling::{RtThrottling, ThrottlingOff};
use crate::validate;
use crate::workload::WorkloadName;

/// Runs the command line's command.
pub fn dispatch(cli: Cli) -> Result<()> {
    rt::default_sigpipe();
    match cli.command {
        None => crate::experiment::run(&crate::experiment::default_args()),
        Some(Command::Run(args)) => crate::experiment::run(&args),
        Some(Command::Oslat(args)) => oslat::oslat_cmd(&args),
        Some(Command::Cyclictest(args)) => cyclictest::cyclictest_cmd(&args),
        Some(Command::Load(args)) => load_cmd(&args),
        Some(Command::Resctrl(args)) => crate::figures::resctrl_cmd(&args),
        Some(Command::Pool(args)) => crate::figures::pool_cmd(&args),
        Some(Command::Report(args)) => crate::report::report_cmd(&args),
        Some(Command::Trace(args)) => crate::trace_cmd::trace_cmd(&args),
        Some(Command::Filler(args)) => crate::kernel::filler_main(args.cpu),
    }
}

/// An exit with this status and no `Error:` line: the command has said what it had to say
/// (oslat's `-T` exits 1 after its own message, as oslat does).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("exit status {0}")]
pub struct Exit(pub i32);

/// Whether the program was called by a real tool's name (`oslat`, `cyclictest`: a link), so
/// that messages name it as the tool would.
pub fn called_as_tool(argv0: &str) -> bool {
    let name = std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str());
    matches!(name, Some("oslat" | "cyclictest"))
}

/// The CPUs a run may use, and the default target and housekeeping picks.
#[derive(Debug, Clone)]
pub struct Cpus {
    /// CPUs the process may run on.
    pub allowed: CpuSet,
    /// Isolated or nohz_full CPUs among them.
    pub isolated: CpuSet,
    /// The default measured CPU: an isolated one if any, else the last allowed one.
    pub target: usize,
}

impl Cpus {
    /// Reads them from the system.
    pub fn read() -> Result<Self> {
        let allowed = qpw_core::allowed_cpus().context("cannot read the allowed CPUs")?;
        let isolated = Topology::read()
            .map(|t| t.isolated_or_nohz_full().intersection(&allowed))
            .unwrap_or_default();
        let target = isolated
            .last()
            .or_else(|| allowed.last())
            .ok_or_else(|| anyhow!("the process may run on no CPU"))?;
        Ok(Self {
            allowed,
            isolated,
            target,
        })
    }

    /// The CPU list given with `flag`, or the default target alone when it was left out.
    pub fn list_or_target(&self, flag: &str, raw: Option<&str>) -> Result<CpuSet> {
        match raw {
            Some(list) => validate::cpu_list(flag, list, &self.allowed),
            None => Ok(CpuSet::from_iter([self.target])),
        }
    }

    /// A housekeeping CPU outside `measured`: a non-isolated one if there is one.
    pub fn housekeeping(&self, measured: &CpuSet) -> Option<usize> {
        let rest = self.allowed.difference(measured);
        let pick = rest.iter().find(|&c| !self.isolated.contains(c));
        pick.or_else(|| rest.first())
    }
}

/// The drain options, validated; `None` when no load was asked for.
pub fn resolve_drain(
    args: &DrainArgs,
    cpus: &Cpus,
    measured: &CpuSet,
    force: bool,
) -> Result<Option<DrainSpec>> {
    // Check every value even when the load is off, so a typo never passes silently.
    let rate = args
        .drain_rate
        .as_deref()
        .map(|r| validate::float_in("--drain-rate", r, 0.0, 100_000.0))
        .transpose()?;
    let load = validate::on_off("--load", &args.load)?;
    let every = validate::op_interval("--local-op-every", &args.local_op_every)?;
    let timeout = validate::int_in("--drain-timeout", &args.drain_timeout, 1, 60_000)?;
    let stall_threshold = validate::int_in("--stall-threshold", &args.stall_threshold, 1, 60_000)?;
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
    let load_cpus = if load {
        cpus.allowed.difference(measured)
    } else {
        CpuSet::new()
    };
    let workload = workload.unwrap_or_else(WorkloadName::default_mm);
    if let Some(k) = workload.kernel() {
        if let Some(m) = mode.filter(|m| m.is_remote()) {
            bail!(
                "--mode {m} {} {k}: the running kernel decides its own mode (see \
                 `qpw-emu trace`'s kernel report); leave --mode out for kernel workloads",
                args.workload_flag
            );
        }
        // Refuse now, before any set-up, when the kernel's drain cannot run here.
        crate::kernel::preflight(k)?;
    }
    let rate = match (rate, workload.kernel()) {
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
        timeout: Duration::from_millis(timeout),
        stall_threshold: Duration::from_millis(stall_threshold),
        load_cpus,
        requester_cpu,
        local_op_every: every,
        requester_prio: None,
        target_cpu,
    }))
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
pub fn throttling_for_run(
    args: &DrainArgs,
    warnings: &mut Warnings,
    quiet: bool,
) -> Result<Option<ThrottlingOff>> {
    args.no_rt_throttling
        .then(|| ThrottlingOff::for_run(warnings, quiet))
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

/// oslat's rounding of a gap for `min` and `max`: with whole-microsecond buckets, the upper
/// edge of the gap's 1 us slot (oslat 2.4: `floor(cycles / MHz) + 1`); else microseconds with
/// three decimals.
pub fn oslat_micros(ns: u64, width_ns: u64) -> Micros {
    if width_ns.is_multiple_of(1000) {
        Micros::Whole(ns / 1000 + 1)
    } else {
        Micros::Frac((ns as f64 / 1000.0 * 1000.0).round() / 1000.0)
    }
}

/// The oslat JSON of a run.
pub fn oslat_json(run: &OslatRun, start_time: String, qpw: QpwFields) -> Envelope<OslatBody> {
    let threads = run
        .threads
        .iter()
        .map(|t| OslatThreadJson {
            cpu: t.cpu,
            freq: run.calibration.mhz(),
            min: oslat_micros(t.hist.min_ns(), t.hist.width_ns()),
            // oslat writes "%3lf": six decimals.
            avg: (t.hist.bucket_mean_ns() / 1000.0 * 1e6).round() / 1e6,
            max: oslat_micros(t.hist.max_ns(), t.hist.width_ns()),
            duration: (t.duration_s * 1000.0).round() / 1000.0,
            histogram: Buckets::oslat(&t.hist),
        })
        .collect::<Vec<_>>();
    Envelope::succeeded(
        start_time,
        OslatBody {
            num_threads: threads.len(),
            thread: Indexed(threads),
            qpw,
        },
    )
}

/// Our fields for a probe run (`tool`) under an optional drain load; `settings` gets the local
/// operation's period from `spec`; an `interrupted` run says so (and why it stopped).
fn qpw_fields(
    tool: &str,
    spec: Option<&DrainSpec>,
    load: &LoadAfter,
    figures: Vec<ThreadFigures>,
    mut settings: Settings,
    warnings: &Warnings,
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
        warnings: warnings.list().to_vec(),
        trace: None,
    }
}

/// The optional drain load around one `oslat` or `cyclictest` run: set up before the probe,
/// released at the probe's start barrier, finished after it.
struct ProbeLoad {
    /// The scenario, when a load was asked for.
    setup: Option<scenario::Setup>,
    /// The phase the probe releases: the scenario's, or one nothing waits on.
    phase: Arc<Phase>,
    /// The framework instance, described before the run.
    desc: Option<String>,
}

/// The drain load once the probe is done.
struct LoadAfter {
    /// The framework instance it ran on.
    desc: Option<String>,
    /// What it did; `None` without a load.
    outcome: Option<Outcome>,
}

impl ProbeLoad {
    /// Sets up the load of `spec`, if any; its threads wait for the probe's go.
    fn start(spec: Option<&DrainSpec>) -> Result<Self> {
        let setup = spec.map(scenario::setup).transpose()?;
        let phase = setup
            .as_ref()
            .map_or_else(|| Arc::new(Phase::default()), |s| s.phase.clone());
        let desc = setup.as_ref().map(|s| s.describe());
        Ok(Self { setup, phase, desc })
    }

    /// The probe's local operation on the load's workload.
    fn local_op(&self) -> Option<probe::LocalOp> {
        self.setup.as_ref().and_then(|s| s.local_op())
    }

    /// Finishes the load once the probe has returned `run`, also when the probe failed (so
    /// that no load thread is left behind); then adds the probe's warnings (`probe_warnings`
    /// of its run) and the load's to `warnings`, in that order. `target` is the measured CPU
    /// whose drains are counted.
    fn finish<R>(
        self,
        run: Result<R>,
        probe_warnings: impl FnOnce(&R) -> &[String],
        target: Option<usize>,
        warnings: &mut Warnings,
        quiet: bool,
    ) -> Result<(R, LoadAfter)> {
        let outcome = self.setup.map(|s| s.finish(target)).transpose()?;
        let run = run?;
        warnings.extend(quiet, probe_warnings(&run).to_vec());
        if let Some(o) = &outcome {
            note_outcome(o, warnings, quiet);
        }
        let after = LoadAfter {
            desc: self.desc,
            outcome,
        };
        Ok((run, after))
    }
}

/// Folds the scenario's conservation check and load errors into the warnings.
pub fn note_outcome(outcome: &Outcome, warnings: &mut Warnings, quiet: bool) {
    if let Err(e) = &outcome.conservation {
        warnings.push(quiet, format!("conservation check failed: {e}"));
    }
    if let Some(e) = &outcome.load.first_error {
        warnings.push(quiet, format!("process-context load: {e}"));
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

fn load_cmd(args: &LoadArgs) -> Result<()> {
    let cpus = Cpus::read()?;
    let duration = args
        .duration
        .as_deref()
        .map(|d| validate::duration("--duration", d))
        .transpose()?;
    let free = cpus.list_or_target("--free", args.free.as_deref())?;
    let mut drain = args.drain.clone();
    if drain.mode.is_none() && drain.workload.is_none() {
        drain.mode = Some("queue".to_string());
    }
    let spec = resolve_drain(&drain, &cpus, &free, !args.no_force)?
        .ok_or_else(|| anyhow!("no load asked for"))?;
    if spec.drain_rate_hz == 0.0 && spec.load_cpus.is_empty() {
        bail!("--drain-rate 0 with --load off: nothing to run");
    }
    let quiet = args.quiet;
    if let Some(path) = &args.json {
        crate::validate::output_file("--json", path)?;
    }
    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    let _rt = rt::prepare(true, &mut warnings, quiet);
    rt::catch_sigint(&mut warnings, quiet);
    // After Ctrl-C is taken: a signal must not end the process before the guard restores.
    let throttling_off = throttling_for_run(&args.drain, &mut warnings, quiet)?;
    let throttling = RtThrottling::read(throttling_off.as_ref());
    let isolation = crate::isolate::for_run(
        args.drain.isolate,
        &free,
        &cpus.allowed,
        &mut warnings,
        quiet,
    )?;
    if !quiet {
        println!("qpw-emu load: {}", throttling.line());
    }
    let setup = scenario::setup(&spec)?;
    if let (false, Some(k)) = (quiet, spec.workload.kernel()) {
        for l in crate::kernel::info::KernelInfo::read().lines() {
            println!("{l}");
        }
        println!(
            "qpw-emu load: the running kernel's own drain {k}: it {}; {} triggers/s from cpu {}{}; \
             {}",
            k.effect(),
            spec.drain_rate_hz,
            spec.requester_cpu,
            if k.needs_filler() {
                format!(", the filler on cpu {}", spec.target_cpu)
            } else {
                String::new()
            },
            match duration {
                Some(d) => format!("running for {:.1} s.", d.as_secs_f64()),
                None => "Ctrl-C to stop.".to_string(),
            }
        );
    } else if !quiet {
        println!(
            "qpw-emu load: {} mode, workload {}, {} {}drains/s from cpu {}, process-context load on {}; \
             cpu(s) {free} left free{}. {}",
            spec.mode,
            spec.workload,
            spec.drain_rate_hz,
            if spec.force { "forced " } else { "" },
            spec.requester_cpu,
            spec.load_cpus,
            if spec.mode == Mode::Queue {
                " (but for their workers)"
            } else {
                ""
            },
            match duration {
                Some(d) => format!("Running for {:.1} s.", d.as_secs_f64()),
                None => "Ctrl-C to stop.".to_string(),
            }
        );
    }
    let _away = rt::AwayFrom::cpus(&free);
    setup.phase.go();
    let progress = crate::progress::Progress::new("load", duration.unwrap_or(Duration::MAX), quiet);
    let start = std::time::Instant::now();
    while duration.is_none_or(|d| start.elapsed() < d) && !rt::interrupted() {
        if duration.is_some() {
            progress.tick();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    progress.finish();
    let qpw_desc = setup.describe();
    let outcome = setup.finish(free.first())?;
    note_outcome(&outcome, &mut warnings, quiet);
    print_requester(&outcome);
    if let Some(path) = &args.json {
        let body = LoadBody {
            tool: "load".to_string(),
            mode: spec.mode.name().to_string(),
            workload: spec.workload.name().to_string(),
            qpw: qpw_desc,
            free: free.to_string(),
            seconds: start.elapsed().as_secs_f64(),
            requester: outcome.requester.clone(),
            rt_throttling: throttling,
            isolation: isolation.as_ref().map(|i| i.report.clone()),
            load: outcome.load.clone(),
            warnings: warnings.list().to_vec(),
        };
        json::write(path, &Envelope::succeeded(start_time, body))?;
    }
    Ok(())
}

/// The JSON body of `qpw-emu load`: no probe thread, only the load's figures.
#[derive(Debug, serde::Serialize)]
struct LoadBody {
    /// `load`.
    tool: String,
    /// The drain mode.
    mode: String,
    /// The workload.
    workload: String,
    /// The framework instance.
    qpw: String,
    /// The CPUs left free.
    free: String,
    /// Seconds the load ran.
    seconds: f64,
    /// The requester's figures.
    requester: Option<crate::load::RequesterReport>,
    /// The kernel's RT throttling during the run.
    rt_throttling: RtThrottling,
    /// With `--isolate`: what was isolated and how.
    #[serde(skip_serializing_if = "Option::is_none")]
    isolation: Option<crate::isolate::IsolationReport>,
    /// The process-context load's figures.
    load: crate::load::LoadReport,
    /// Setup steps that failed.
    warnings: Vec<String>,
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
