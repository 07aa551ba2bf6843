//! The commands: validate the options, set up, run the probe or the load, print, export.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use qpw_core::{CpuSet, Mode, Topology};

use crate::cli::{Cli, Command, CyclictestArgs, DrainArgs, LoadArgs, OslatArgs};
use crate::clock::Calibration;
use crate::cyclictest::{self, CyclicConfig, CyclicRun};
use crate::json::{
    self, Buckets, CyclictestBody, CyclictestThreadJson, Envelope, Indexed, Micros, OslatBody,
    OslatThreadJson, QpwFields, Settings, ThreadFigures,
};
use crate::load::Phase;
use crate::oslat::{self, OslatConfig, OslatRun};
use crate::rt::{self, TraceMarker, Warnings};
use crate::scenario::{self, DrainSpec, Outcome};
use crate::validate;
use crate::workload::WorkloadName;

/// Runs the command line's command.
pub fn dispatch(cli: Cli) -> Result<()> {
    rt::default_sigpipe();
    match cli.command {
        None => crate::experiment::run(&crate::experiment::default_args()),
        Some(Command::Run(args)) => crate::experiment::run(&args),
        Some(Command::Oslat(args)) => oslat_cmd(&args),
        Some(Command::Cyclictest(args)) => cyclictest_cmd(&args),
        Some(Command::Load(args)) => load_cmd(&args),
        Some(Command::Resctrl(args)) => crate::figures::resctrl_cmd(&args),
        Some(Command::Pool(args)) => crate::figures::pool_cmd(&args),
        Some(Command::Report(args)) => crate::report::report_cmd(&args),
        Some(Command::Trace(args)) => crate::trace_cmd::trace_cmd(&args),
        Some(Command::Filler(args)) => crate::kernel::filler_main(args.cpu),
    }
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
    let every = validate::int_in("--local-op-every", &args.local_op_every, 1, 1_000_000)?;
    let timeout = validate::int_in("--drain-timeout", &args.drain_timeout, 1, 60_000)?;
    let mode = args.mode.as_deref().map(parse_mode).transpose()?;
    let workload = args
        .workload
        .as_deref()
        .map(|w| {
            w.parse::<WorkloadName>()
                .map_err(|e| anyhow!("--workload {w}: {e}"))
        })
        .transpose()?;
    let requester = args
        .requester_cpu
        .as_deref()
        .map(|c| validate::cpu("--requester-cpu", c, &cpus.allowed))
        .transpose()?;
    if mode.is_none() && workload.is_none() {
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
        // Refuse now, before any set-up, when the kernel's drain cannot run here.
        crate::kernel::preflight(k)?;
        if mode == Some(Mode::Remote) {
            bail!(
                "--mode remote --workload {k}: the running kernel decides its own mode (see \
                 `qpw-emu trace`'s kernel report); leave --mode out for kernel workloads"
            );
        }
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
        mode: mode.unwrap_or(Mode::Queue),
        workload,
        drain_rate_hz: rate,
        force,
        timeout: Duration::from_millis(timeout),
        load_cpus,
        requester_cpu,
        local_op_every: Duration::from_micros(every),
        requester_prio: None,
        target_cpu,
    }))
}

/// `queue` or `remote`.
pub fn parse_mode(raw: &str) -> Result<Mode> {
    match raw.trim() {
        "queue" => Ok(Mode::Queue),
        "remote" => Ok(Mode::Remote),
        _ => Err(anyhow!("--mode {raw}: must be `queue` or `remote`")),
    }
}

/// oslat's rounding of a gap for `min` and `max`: with whole-microsecond buckets, the upper
/// edge of the gap's 1 us slot (oslat 2.4: `floor(cycles / MHz) + 1`); else microseconds with
/// three decimals.
pub fn oslat_micros(ns: u64, width_ns: u64) -> Micros {
    if width_ns % 1000 == 0 {
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
            avg: t.hist.bucket_mean_ns() / 1000.0,
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

/// Our fields for a probe run (`tool`) under an optional drain load.
fn qpw_fields(
    tool: &str,
    spec: Option<&DrainSpec>,
    load: &LoadAfter,
    figures: Vec<ThreadFigures>,
    settings: Settings,
    warnings: &Warnings,
    stopped_by: Option<String>,
) -> QpwFields {
    let outcome = load.outcome.as_ref();
    QpwFields {
        tool: tool.to_string(),
        scenario: None,
        mode: spec.map(|s| s.mode.name().to_string()),
        workload: spec.map(|s| s.workload.name().to_string()),
        qpw: load.desc.clone(),
        settings: Some(settings),
        percentiles: figures,
        interruptions: None,
        requester: outcome.and_then(|o| o.requester.clone()),
        load: outcome.map(|o| o.load.clone()),
        stopped_by,
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
    fn local_op(&self) -> Option<oslat::LocalOp> {
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

impl LoadAfter {
    /// Prints the requester's and the load's lines, when there was a load.
    fn print(&self) {
        if let Some(o) = &self.outcome {
            print_requester(o);
        }
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

fn oslat_cmd(args: &OslatArgs) -> Result<()> {
    let cpus = Cpus::read()?;
    let measured = cpus.list_or_target("--cpu-list", args.cpu_list.as_deref())?;
    let duration = validate::duration("--duration", &args.duration)?;
    let bucket_size = validate::int_in("--bucket-size", &args.bucket_size, 1, 4096)? as usize;
    let width = validate::int_in("--bucket-width", &args.bucket_width, 1, 1_000_000)?;
    let rtprio = validate::opt_int_in("--rtprio", args.rtprio.as_deref(), 1, 99)?.map(|p| p as i32);
    let trace = validate::opt_int_in(
        "--trace-threshold",
        args.trace_threshold.as_deref(),
        1,
        10_000_000,
    )?;
    let spec = resolve_drain(&args.drain, &cpus, &measured, false)?;
    let trace_us = args
        .trace
        .as_deref()
        .map(crate::trace_cmd::threshold_us)
        .transpose()?;
    if trace_us.is_some() {
        crate::trace::tracefs::preflight()?;
    }
    if let Some(path) = &args.json {
        json::check_writable(path)?;
    }

    let quiet = args.quiet;
    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    let _rt = rt::prepare(true, &mut warnings, quiet);
    rt::check_isolation(&measured, &mut warnings, quiet);
    let mut marker = trace.map(|_| TraceMarker::open(&mut warnings, quiet));
    rt::catch_sigint();
    let calibration = Calibration::measure();
    if !quiet {
        println!("qpw-emu oslat ({})", json::VERSION);
        println!("CPU list:         {measured}");
        println!("Duration:         {:.3} s", duration.as_secs_f64());
        println!(
            "Thread priority:  {}",
            rtprio.map_or("default".to_string(), |p| format!("SCHED_FIFO:{p}"))
        );
        println!("Counter:          {} MHz", calibration.mhz());
        match &spec {
            Some(s) => println!(
                "Load:             {} mode, workload {}, {} drains/s from cpu {}, load on {}",
                s.mode, s.workload, s.drain_rate_hz, s.requester_cpu, s.load_cpus
            ),
            None => println!("Load:             none"),
        }
        println!();
    }

    if !quiet
        && (trace_us.is_some() || spec.as_ref().is_some_and(|s| s.workload.kernel().is_some()))
    {
        for l in crate::kernel::info::KernelInfo::read().lines() {
            println!("{l}");
        }
    }
    let tracing = trace_us
        .map(|_| crate::trace_cmd::start_for_probe(&measured, &cpus, quiet))
        .transpose()?;
    let load = ProbeLoad::start(spec.as_ref())?;
    let cfg = OslatConfig {
        cpus: measured.clone(),
        duration,
        warmup: Duration::from_millis(200),
        bucket_size,
        bucket_width_ns: width,
        rtprio,
        trace_threshold_ns: trace.map(|us| us * 1000),
        local_op: load.local_op(),
        quiet,
        label: "oslat".to_string(),
        progress_span: None,
        gap_log_ns: trace_us.map(|us| (us * 1000.0) as u64),
    };
    let run = oslat::run(&cfg, calibration, &load.phase);
    let (run, load) = load.finish(run, |r| &r.warnings, measured.first(), &mut warnings, quiet)?;
    let traced = match (tracing, trace_us) {
        (Some(session), Some(us)) => Some(crate::trace_cmd::attribute_oslat(
            session,
            &run,
            us,
            &mut warnings,
            quiet,
        )?),
        _ => None,
    };
    let mut stopped_by = None;
    if let Some((cpu, us)) = run.threshold_hit {
        let line = format!(
            "qpw-emu oslat: Trace threshold ({} us) triggered on cpu {cpu} with {us:.3} us!\n",
            trace.unwrap_or(0)
        );
        if let Some(m) = &mut marker {
            m.mark(&line);
        }
        print!("{line}");
        stopped_by = Some(line.trim().to_string());
    }
    if run.interrupted {
        stopped_by = Some("interrupted (SIGINT)".to_string());
    }

    print_oslat_summary(&run, args.zero_omit);
    load.print();
    if let Some(t) = &traced {
        let drains = load
            .outcome
            .as_ref()
            .and_then(|o| o.requester.as_ref())
            .map(|r| r.drains);
        crate::trace_cmd::print_attribution(t, 12, drains);
    }
    let settings = Settings {
        bucket_width_ns: width,
        bucket_size,
        duration_s: duration.as_secs_f64(),
        rtprio,
        local_op_every_us: spec.as_ref().map(|s| s.local_op_every.as_micros() as u64),
        interval_us: None,
    };
    if let Some(path) = &args.json {
        let mut fields = qpw_fields(
            "oslat",
            spec.as_ref(),
            &load,
            run.figures(),
            settings,
            &warnings,
            stopped_by,
        );
        fields.trace = traced;
        json::write(path, &oslat_json(&run, start_time, fields))?;
    }
    Ok(())
}

/// Prints oslat's summary: one column per CPU.
pub fn print_oslat_summary(run: &OslatRun, zero_omit: bool) {
    let field = |label: &str, values: Vec<String>, end: &str| {
        println!("{label:>12}:\t {}{end}", values.join(" "));
    };
    let ts = &run.threads;
    field("Core", ts.iter().map(|t| t.cpu.to_string()).collect(), "");
    field(
        "Counter Freq",
        ts.iter()
            .map(|_| run.calibration.mhz().to_string())
            .collect(),
        " (MHz)",
    );
    let Some(first) = ts.first() else { return };
    let (n, w) = (first.hist.buckets(), first.hist.width_ns());
    let mut dots = false;
    for j in 0..n {
        let count = |t: &oslat::OslatThread| {
            let c = t.hist.counts()[j];
            if j == n - 1 {
                c + t.hist.overflow()
            } else {
                c
            }
        };
        if zero_omit && j < n - 1 && ts.iter().all(|t| count(t) == 0) {
            dots = true;
            continue;
        }
        if dots {
            println!("    ...");
            dots = false;
        }
        let edge = (j as u64 + 1) * w;
        let label = if w % 1000 == 0 {
            format!("{:03} (us)", edge / 1000)
        } else {
            format!("{:07.3} (us)", edge as f64 / 1000.0)
        };
        field(
            &label,
            ts.iter().map(|t| count(t).to_string()).collect(),
            if j == n - 1 {
                " (including overflows)"
            } else {
                ""
            },
        );
    }
    let micros = |m: Micros| match m {
        Micros::Whole(v) => v.to_string(),
        Micros::Frac(v) => format!("{v:.3}"),
    };
    field(
        "Minimum",
        ts.iter()
            .map(|t| micros(oslat_micros(t.hist.min_ns(), w)))
            .collect(),
        " (us)",
    );
    field(
        "Average",
        ts.iter()
            .map(|t| format!("{:.3}", t.hist.bucket_mean_ns() / 1000.0))
            .collect(),
        " (us)",
    );
    field(
        "Maximum",
        ts.iter()
            .map(|t| micros(oslat_micros(t.hist.max_ns(), w)))
            .collect(),
        " (us)",
    );
    field(
        "Max-Min",
        ts.iter()
            .map(|t| {
                let (a, b) = (
                    oslat_micros(t.hist.max_ns(), w).value(),
                    oslat_micros(t.hist.min_ns(), w).value(),
                );
                micros(if w % 1000 == 0 {
                    Micros::Whole((a - b) as u64)
                } else {
                    Micros::Frac(a - b)
                })
            })
            .collect(),
        " (us)",
    );
    field(
        "Duration",
        ts.iter().map(|t| format!("{:.3}", t.duration_s)).collect(),
        " (sec)",
    );
    // Ours: exact percentiles.
    for t in ts {
        let p = t.hist.percentiles_us();
        println!(
            "   cpu {:>3}: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}  max {:.3} (us); exact avg {:.3} us; {} local ops",
            t.cpu, p.p50, p.p90, p.p99, p.p99_9, p.p99_99, p.max, t.hist.mean_ns() / 1000.0, t.local_ops
        );
    }
    println!();
}

/// Prints the requester's line.
pub fn print_requester(o: &Outcome) {
    if let Some(r) = &o.requester {
        println!(
            "Requester (cpu {}): {} drains at {}/s: p50 {:.1} p99 {:.1} max {:.1} us (avg {:.1}); \
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
        if let Some(e) = &r.first_error {
            println!("  first drain error: {e}");
        }
    }
    println!(
        "Load: {} process-context ops on cpu(s) {} ({} errors); {} drains reached the measured CPU",
        o.load.ops, o.load.cpus, o.load.errors, o.target_drains
    );
}

fn cyclictest_cmd(args: &CyclictestArgs) -> Result<()> {
    let cpus = Cpus::read()?;
    let affinity = cpus.list_or_target("--affinity", args.affinity.as_deref())?;
    let nthreads = validate::int_in("--threads", &args.threads, 1, 1024)? as usize;
    let prio = validate::int_in("--priority", &args.priority, 0, 99)? as i32;
    let interval = validate::int_in("--interval", &args.interval, 10, 1_000_000)?;
    let duration = validate::duration("--duration", &args.duration)?;
    let hist = validate::opt_int_in("--histogram", args.histogram.as_deref(), 1, 1_000_000)?;
    let breaktrace =
        validate::opt_int_in("--breaktrace", args.breaktrace.as_deref(), 1, 10_000_000)?;
    let spec = resolve_drain(&args.drain, &cpus, &affinity, false)?;
    let trace_us = args
        .trace
        .as_deref()
        .map(crate::trace_cmd::threshold_us)
        .transpose()?;
    if trace_us.is_some() {
        crate::trace::tracefs::preflight()?;
    }
    if let Some(path) = &args.json {
        json::check_writable(path)?;
    }
    let quiet = args.quiet;
    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    let _rt = rt::prepare(args.mlockall, &mut warnings, quiet);
    rt::check_isolation(&affinity, &mut warnings, quiet);
    if prio == 0 {
        warnings.push(
            quiet,
            "threads run SCHED_OTHER (-p 0): wake-up latency includes ordinary scheduling",
        );
    }
    let mut marker = breaktrace.map(|_| TraceMarker::open(&mut warnings, quiet));
    rt::catch_sigint();
    let thread_cpus: Vec<usize> = (0..nthreads)
        .map(|i| affinity.as_slice()[i % affinity.len()])
        .collect();
    let calibration = trace_us.map(|_| Calibration::measure());
    let tracing = trace_us
        .map(|_| crate::trace_cmd::start_for_probe(&affinity, &cpus, quiet))
        .transpose()?;
    let load = ProbeLoad::start(spec.as_ref())?;
    let cfg = CyclicConfig {
        thread_cpus,
        interval: Duration::from_micros(interval),
        duration,
        prio: (prio > 0).then_some(prio),
        hist_buckets: hist.unwrap_or(10_000) as usize,
        breaktrace_us: breaktrace,
        local_op: load.local_op(),
        quiet,
        label: "cyclictest".to_string(),
        late_log: trace_us
            .zip(calibration)
            .map(|(us, cal)| ((us * 1000.0) as u64, cal)),
    };
    let run = cyclictest::run(&cfg, &load.phase);
    let (run, load) = load.finish(run, |r| &r.warnings, affinity.first(), &mut warnings, quiet)?;
    let traced = match (tracing, trace_us, calibration) {
        (Some(session), Some(us), Some(cal)) => {
            let probes: Vec<_> = run
                .threads
                .iter()
                .map(|t| crate::trace_cmd::ProbeGaps {
                    cpu: t.cpu,
                    tid: t.tid,
                    gaps: &t.late,
                    not_kept: t.late_not_kept,
                })
                .collect();
            Some(crate::trace_cmd::attribute(
                session,
                &probes,
                cal,
                us,
                &mut warnings,
                quiet,
            )?)
        }
        _ => None,
    };
    let mut stopped_by = None;
    if let Some((thread, us)) = run.break_hit {
        let line = format!("# Break thread: {thread}\n# Break value: {us}\n");
        if let Some(m) = &mut marker {
            m.mark(&format!(
                "hit latency threshold ({us} > {})\n",
                breaktrace.unwrap_or(0)
            ));
        }
        print!("{line}");
        stopped_by = Some(format!("breaktrace: thread {thread} saw {us} us"));
    }
    if run.interrupted {
        stopped_by = Some("interrupted (SIGINT)".to_string());
    }
    print_cyclictest(&run, &cfg, hist.is_some(), interval);
    load.print();
    if let Some(t) = &traced {
        let drains = load
            .outcome
            .as_ref()
            .and_then(|o| o.requester.as_ref())
            .map(|r| r.drains);
        crate::trace_cmd::print_attribution(t, 12, drains);
    }
    if let Some(path) = &args.json {
        let settings = Settings {
            bucket_width_ns: 1000,
            bucket_size: cfg.hist_buckets,
            duration_s: duration.as_secs_f64(),
            rtprio: cfg.prio,
            local_op_every_us: spec.as_ref().map(|s| s.local_op_every.as_micros() as u64),
            interval_us: Some(interval),
        };
        let mut fields = qpw_fields(
            "cyclictest",
            spec.as_ref(),
            &load,
            run.figures(),
            settings,
            &warnings,
            stopped_by,
        );
        fields.trace = traced;
        json::write(path, &cyclictest_json(&run, start_time, fields))?;
    }
    Ok(())
}

fn cyclictest_json(
    run: &CyclicRun,
    start_time: String,
    qpw: QpwFields,
) -> Envelope<CyclictestBody> {
    let threads: Vec<CyclictestThreadJson> = run
        .threads
        .iter()
        .map(|t| CyclictestThreadJson {
            histogram: Buckets::cyclictest(&t.hist),
            cycles: t.cycles,
            min: t.min_us,
            max: t.max_us,
            avg: if t.cycles == 0 {
                0.0
            } else {
                t.sum_us as f64 / t.cycles as f64
            },
            cpu: t.cpu,
            node: 0,
        })
        .collect();
    Envelope::succeeded(
        start_time,
        CyclictestBody {
            num_threads: threads.len(),
            resolution_in_ns: 0,
            thread: Indexed(threads),
            qpw,
        },
    )
}

fn print_cyclictest(run: &CyclicRun, cfg: &CyclicConfig, histogram: bool, interval: u64) {
    if histogram {
        println!("# Histogram");
        let n = run.threads.first().map_or(0, |t| t.hist.buckets());
        for j in 0..n {
            let counts: Vec<u64> = run.threads.iter().map(|t| t.hist.counts()[j]).collect();
            if counts.iter().all(|&c| c == 0) {
                continue;
            }
            let cols: Vec<String> = counts.iter().map(|c| format!("{c:06}")).collect();
            println!("{j:06} {}", cols.join("\t"));
        }
        let line = |label: &str, f: &dyn Fn(&cyclictest::CyclicThread) -> String| {
            let cols: Vec<String> = run.threads.iter().map(f).collect();
            println!("# {label}: {}", cols.join(" "));
        };
        line("Total", &|t| format!("{:09}", t.cycles));
        line("Min Latencies", &|t| format!("{:05}", t.min_us));
        line("Avg Latencies", &|t| {
            format!("{:05}", t.sum_us / t.cycles.max(1))
        });
        line("Max Latencies", &|t| format!("{:05}", t.max_us));
        line("Histogram Overflows", &|t| {
            format!("{:05}", t.hist.overflow())
        });
    }
    for (i, t) in run.threads.iter().enumerate() {
        println!(
            "T:{i:2} (cpu {:>3}) P:{:2} I:{interval} C:{:8} Min:{:7} Avg:{:7} Max:{:7}  overruns {}",
            t.cpu,
            cfg.prio.unwrap_or(0),
            t.cycles,
            t.min_us,
            t.sum_us / t.cycles.max(1),
            t.max_us,
            t.overruns
        );
    }
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
    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    let _rt = rt::prepare(true, &mut warnings, quiet);
    rt::catch_sigint();
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
    /// The process-context load's figures.
    load: crate::load::LoadReport,
    /// Setup steps that failed.
    warnings: Vec<String>,
}
