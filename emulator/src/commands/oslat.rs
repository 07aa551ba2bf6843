//! `qpw-emu oslat`: rt-tests 2.4's `oslat`, flag for flag and line for line, with our drain
//! load and our figures after its output.
//!
//! What oslat prints, in order: `oslat V 2.40`; unless `-q`, its settings
//! (`dump_globals()`), `Pre-heat for 1 seconds...` and `Test starts...`; `Global bias set to`
//! with `-B`; unless `-q`, `Test completed.` and a blank line; then the summary
//! (`write_summary()`): one column per CPU, every bucket (or the non-zero ones with `-z`),
//! minimum, average, maximum, max-min and duration, and a blank line. Ours go to stderr, on
//! lines of their own that start with `# qpw-emu`: nothing of ours follows oslat's lines on
//! stdout, where scripts parse them.
//!
//! `-T` ends the run as oslat does: its message on stderr, exit status 1, no summary, no JSON.

use std::time::Duration;

use anyhow::Result;
use qpw_core::CpuSet;

use crate::cli::{DrainArgs, OslatArgs};
use crate::clock::Calibration;
use crate::cpus::Cpus;
use crate::drain::{print_requester, qpw_fields, LoadAfter, ProbeLoad};
use crate::hist::Histogram;
use crate::json::{self, Micros, Settings, TraceFields, RT_TESTS_VERSION};
use crate::oslat::{self, OslatConfig, OslatRun, OslatThread};
use crate::rt::{self, Exit, TraceMarker};
use crate::scenario::DrainSpec;
use crate::sink::{JsonOut, Sink};
use crate::throttling::RtThrottling;
use crate::validate;

/// oslat's default memmove buffer: 16 KiB per thread (`WORKLOAD_MEM_SIZE`).
const WORKLOAD_MEM: u64 = 16 << 10;

/// `qpw-emu oslat`, or `oslat` through a link: its plan, the set-up it holds, the probe under
/// the load, the report.
pub fn oslat_cmd(args: &OslatArgs) -> Result<()> {
    crate::cli::note_stray("oslat", &args.stray);
    if args.version {
        println!("oslat V {RT_TESTS_VERSION}");
        eprintln!("# qpw-emu {}", env!("CARGO_PKG_VERSION"));
        return Ok(());
    }
    // What to measure: the CPUs, the main thread's, the busy loop, the load, the outputs.
    let plan = Plan::new(args)?;
    let mut sink = Sink::new(args.quiet).with_json(plan.json.clone());
    let start_time = rt::rt_timestamp();
    // The set-up, held until the end.
    let mut held = SetUp::hold(&plan, args, &mut sink)?;
    let calibration = Calibration::measure();
    // oslat's lines before the run, the probe under the load, the trace beside it.
    print_settings(&plan, args, &sink);
    let measured = measure(&plan, args, calibration, &mut sink)?;
    // A -T stop ends the run as oslat ends it; else the summary, ours, the JSON.
    stop_at_threshold(args, &measured.run, &mut held, &mut sink)?;
    report(&plan, args, &held, measured, start_time, &mut sink)
}

/// What `qpw-emu oslat` measures, where and how.
struct Plan {
    cpus: Cpus,
    /// The measured CPUs (`-c`).
    measured: CpuSet,
    /// The main thread's CPU (`-C`; oslat's default 0 where the process may run).
    main_cpu: Option<usize>,
    /// The drain options, `--drain-workload` named as such.
    drain: DrainArgs,
    /// `-w memmove`: oslat's own busy-loop workload.
    memmove: bool,
    /// The drain load, if any.
    spec: Option<DrainSpec>,
    /// `--trace`'s threshold, in us.
    trace_us: Option<f64>,
    rtprio: Option<i32>,
    duration: Duration,
    /// `-m`: the memmove buffer.
    mem: u64,
    /// `--json`.
    json: Option<JsonOut>,
}

impl Plan {
    /// The plan of `args`, or the first option that cannot be taken.
    fn new(args: &OslatArgs) -> Result<Plan> {
        let cpus = Cpus::read()?;
        // A refused CPU comes after oslat's version line, as oslat prints it (and for -C its own
        // line, with its range as 2.4 writes it); our reason follows on stderr.
        let measured = match &args.cpu_list {
            Some(list) => {
                validate::cpu_list("--cpu-list", list, &cpus.allowed).inspect_err(|_| {
                    println!("oslat V {RT_TESTS_VERSION}");
                })?
            }
            None => cpus.allowed.clone(),
        };
        let main_cpu = match &args.cpu_main_thread {
            Some(raw) => Some(
                validate::cpu("--cpu-main-thread", raw, &cpus.allowed).inspect_err(|_| {
                    println!("oslat V {RT_TESTS_VERSION}");
                    let top = cpus.allowed.last().map_or(0, |c| c + 1);
                    println!("Illegal core for main thread: {raw} (should be: 0-{top})");
                })?,
            ),
            // oslat's default: cpu 0 (when the process may run there).
            None => cpus.allowed.contains(0).then_some(0),
        };
        // `-w no|memmove` is oslat's busy-loop workload; ours is `--drain-workload`.
        let mut drain = args.drain.clone();
        drain.workload_flag = "--drain-workload";
        let memmove = args.loop_workload.as_deref() == Some("memmove");
        let spec = crate::drain::resolve_drain(&drain, &cpus, &measured, false)?;
        let json = JsonOut::checked("--json", args.json.as_deref())?;
        let trace_us = crate::probe_trace::threshold_checked(args.trace.as_deref())?;
        let rtprio = args.rtprio.map(|p| p as i32);
        let duration = args.duration;
        let mem = args.workload_mem.unwrap_or(WORKLOAD_MEM);
        Ok(Plan {
            cpus,
            measured,
            main_cpu,
            drain,
            memmove,
            spec,
            trace_us,
            rtprio,
            duration,
            mem,
            json,
        })
    }
}

/// What the run holds, put back when dropped, in the reverse of the order it was taken.
struct SetUp {
    /// `--isolate`.
    isolation: Option<crate::isolate::Isolation>,
    /// RT throttling as the run had it.
    throttling: RtThrottling,
    /// `--no-rt-throttling`.
    _throttling_off: Option<crate::throttling::ThrottlingOff>,
    /// `-T`'s trace marker.
    marker: Option<TraceMarker>,
    /// Memory locked, `cpu_dma_latency` held.
    _rt: rt::RtGuard,
}

impl SetUp {
    /// Takes what the run holds, in oslat's order, recording what fails in `sink`.
    fn hold(plan: &Plan, args: &OslatArgs, sink: &mut Sink) -> Result<SetUp> {
        let Plan {
            ref cpus,
            ref measured,
            ref drain,
            ..
        } = *plan;
        let guard = rt::prepare(true, sink);
        if !drain.isolate {
            rt::check_isolation(measured, sink);
        }
        let marker = args.trace_threshold.map(|_| TraceMarker::open(sink));
        rt::catch_sigint(sink);
        // After Ctrl-C is taken: a signal must not end the process before the guard restores.
        let throttling_off = crate::drain::throttling_for_run(drain, sink)?;
        let throttling = RtThrottling::read(throttling_off.as_ref());
        let isolation = crate::isolate::for_run(drain.isolate, measured, &cpus.allowed, sink)?;
        Ok(SetUp {
            isolation,
            throttling,
            _throttling_off: throttling_off,
            marker,
            _rt: guard,
        })
    }
}

/// oslat's lines before the run: its version, and unless `-q` its settings (`dump_globals()`)
/// and the pre-heat.
fn print_settings(plan: &Plan, args: &OslatArgs, sink: &Sink) {
    let Plan {
        ref measured,
        main_cpu,
        memmove,
        rtprio,
        duration,
        mem,
        ..
    } = *plan;
    println!("oslat V {RT_TESTS_VERSION}");
    if measured.contains(0) && rtprio.is_some() {
        println!("WARNING: Running SCHED_FIFO workload on CPU 0 may hang the thread");
    }
    let preheat_cores = if args.single_preheat {
        1
    } else {
        measured.len()
    };
    if !sink.is_quiet() {
        let secs = duration.as_secs_f64();
        if duration.subsec_nanos() == 0 {
            println!("Total runtime: \t\t{} seconds", duration.as_secs());
        } else {
            println!("Total runtime: \t\t{secs:.3} seconds");
        }
        println!(
            "Thread priority: \t{}",
            rtprio.map_or("default".to_string(), |p| format!("SCHED_FIFO:{p}"))
        );
        println!(
            "CPU list: \t\t{}",
            args.cpu_list.as_deref().unwrap_or("all")
        );
        println!("CPU for main thread: \t{}", main_cpu.unwrap_or(0));
        println!("Workload: \t\t{}", if memmove { "memmove" } else { "no" });
        println!(
            "Workload mem: \t\t{} (KiB)",
            if memmove { mem / 1024 } else { 0 }
        );
        println!("Preheat cores: \t\t{preheat_cores}");
        println!();
        println!("Pre-heat for 1 seconds...");
    }
}

/// What the probe measured, with the load's outcome and the trace's attribution.
struct Measured {
    cfg: OslatConfig,
    run: OslatRun,
    load: LoadAfter,
    traced: Option<TraceFields>,
}

/// Runs the probe under the load, the trace beside it.
fn measure(
    plan: &Plan,
    args: &OslatArgs,
    calibration: Calibration,
    sink: &mut Sink,
) -> Result<Measured> {
    let Plan {
        ref cpus,
        ref measured,
        main_cpu,
        memmove,
        ref spec,
        trace_us,
        rtprio,
        duration,
        mem,
        ..
    } = *plan;
    let tracing = trace_us
        .map(|_| crate::probe_trace::start_for_probe(measured, cpus, &Sink::new(true)))
        .transpose()?;
    let load = ProbeLoad::start(spec.as_ref())?;
    let cfg = OslatConfig {
        cpus: measured.clone(),
        duration,
        warmup: Duration::from_secs(1),
        single_preheat: args.single_preheat,
        bias: args.bias,
        memmove_bytes: memmove.then_some(mem as usize),
        main_cpus: main_cpu.map(|c| qpw_core::CpuSet::from_iter([c])),
        bucket_size: args.bucket_size as usize,
        bucket_width_ns: args.bucket_width,
        rtprio,
        // oslat stops at a gap whose rounded-up microseconds reach -T: floor(us) >= T - 1.
        trace_threshold_ns: args.trace_threshold.map(|us| (us - 1) * 1000),
        local_op: load.local_op(),
        announce_start: !sink.is_quiet(),
        quiet: sink.is_quiet(),
        label: "oslat".to_string(),
        progress_span: None,
        gap_log_ns: trace_us.map(|us| (us * 1000.0) as u64),
    };
    let run = oslat::run(&cfg, calibration, &load.phase);
    let (run, load) = load.finish(run, |r| &r.warnings, measured.first(), sink)?;
    let traced = match (tracing, trace_us) {
        (Some(session), Some(us)) => Some(crate::probe_trace::attribute_oslat(
            session, &run, us, sink,
        )?),
        _ => None,
    };
    Ok(Measured {
        cfg,
        run,
        load,
        traced,
    })
}

/// `-T`: a gap past the threshold ends the run as oslat ends it, its message on stderr and
/// exit status 1, after the trace marker.
fn stop_at_threshold(
    args: &OslatArgs,
    run: &OslatRun,
    held: &mut SetUp,
    sink: &mut Sink,
) -> Result<()> {
    if let Some((cpu, us)) = run.threshold_hit {
        let app = std::env::args_os()
            .next()
            .map_or_else(|| "oslat".into(), |a| json::escape_arg(&a));
        let app = if crate::cli::called_as_tool(&app) {
            app
        } else {
            format!("{app} oslat")
        };
        let threshold = args.trace_threshold.unwrap_or(0);
        let line = format!(
            "{app}: Trace threshold ({threshold} us) triggered on cpu {cpu} with {us} us!\n\
             Stopping the test.\n"
        );
        if let Some(m) = &mut held.marker {
            m.mark(&line);
        }
        // rt-tests' two lines first on stderr; then what we have to say about the marker.
        eprint!("{line}");
        sink.say_deferred();
        return Err(Exit(1).into());
    }
    Ok(())
}

/// oslat's summary and ours after it, then the JSON.
fn report(
    plan: &Plan,
    args: &OslatArgs,
    held: &SetUp,
    measured: Measured,
    start_time: String,
    sink: &mut Sink,
) -> Result<()> {
    let Plan {
        ref spec,
        rtprio,
        duration,
        ..
    } = *plan;
    let Measured {
        cfg,
        run,
        load,
        traced,
    } = measured;
    sink.say_deferred();
    if !sink.is_quiet() {
        println!("Test completed.");
        println!();
    }
    print_summary(&run, args.zero_omit);
    print_extras(&run, &cfg);
    if let Some(s) = &spec {
        eprintln!(
            "# qpw-emu load: {} mode, workload {}, {} drains/s from cpu {}, load on {}",
            s.mode, s.workload, s.drain_rate_hz, s.requester_cpu, s.load_cpus
        );
    }
    if let Some(o) = &load.outcome {
        print_requester(o);
        eprintln!("# qpw-emu {}", held.throttling.line());
    }
    crate::probe_trace::print_after_tool(
        traced.as_ref(),
        load.outcome.as_ref(),
        spec.as_ref().is_some_and(|s| s.workload.kernel().is_some()),
    );
    if run.interrupted {
        eprintln!(
            "# qpw-emu: {} after {:.3} s of {:.3} s",
            crate::signals::stopped_by(),
            run.threads.first().map_or(0.0, |t| t.duration_s),
            duration.as_secs_f64()
        );
    }
    if sink.wants_json() {
        let settings = Settings {
            bucket_width_ns: args.bucket_width,
            bucket_size: cfg.bucket_size,
            duration_s: duration.as_secs_f64(),
            rtprio,
            local_op_every_us: None,
            interval_us: None,
        };
        let mut fields = qpw_fields(
            "oslat",
            spec.as_ref(),
            &load,
            run.figures(),
            settings,
            sink,
            run.interrupted,
        );
        fields.trace = traced;
        fields.rt_throttling = spec.is_some().then_some(held.throttling.clone());
        fields.isolation = held.isolation.as_ref().map(|i| i.report.clone());
        sink.write_json(&oslat::oslat_json(&run, start_time, fields))?;
    }
    Ok(())
}

/// oslat's rounding of a gap for `min` and `max`, as printed.
fn micros_text(m: Micros) -> String {
    match m {
        Micros::Whole(v) => v.to_string(),
        Micros::Frac(v) => format!("{v:.3}"),
    }
}

/// Prints oslat's summary (`write_summary()`): one column per CPU.
fn print_summary(run: &OslatRun, zero_omit: bool) {
    let ts = &run.threads;
    summary_row("Core", ts.iter().map(|t| t.cpu.to_string()), "");
    summary_row(
        "Counter Freq",
        ts.iter().map(|_| run.calibration.mhz().to_string()),
        " (Mhz)",
    );
    if !ts.is_empty() {
        print_buckets(ts, zero_omit);
        print_figures(ts);
    }
    println!();
}

/// Prints one row of oslat's summary: its label right-aligned, a tab, then each CPU's value
/// after a space, then `end` (the unit).
fn summary_row(label: &str, values: impl Iterator<Item = String>, end: &str) {
    let cells: String = values.map(|v| format!(" {v}")).collect();
    println!("{label:>12}:\t{cells}{end}");
}

/// Prints the summary's bucket rows, labelled by each bucket's upper edge; with `zero_omit`
/// (`-z`), a bucket empty on every CPU is left out and a run of them is shown as `...`. The
/// last bucket also counts the overflows. Every thread has the first one's buckets.
fn print_buckets(ts: &[OslatThread], zero_omit: bool) {
    let n = ts[0].hist.buckets();
    let mut dots = false;
    for j in 0..n {
        if zero_omit && j < n - 1 && ts.iter().all(|t| bucket_count(t, j) == 0) {
            dots = true;
            continue;
        }
        if dots {
            println!("    ...");
            dots = false;
        }
        summary_row(
            &bucket_label(&ts[0].hist, j),
            ts.iter().map(|t| bucket_count(t, j).to_string()),
            if j == n - 1 {
                " (including overflows)"
            } else {
                ""
            },
        );
    }
}

/// The count of bucket `j` of a thread's histogram, the overflows included in the last bucket.
fn bucket_count(t: &OslatThread, j: usize) -> u64 {
    let c = t.hist.counts()[j];
    if j == t.hist.buckets() - 1 {
        c + t.hist.overflow()
    } else {
        c
    }
}

/// The label of bucket `j`: its upper edge in microseconds, whole when the buckets fall on
/// whole microseconds (`001 (us)`), else with three decimals (`000.500 (us)`).
fn bucket_label(hist: &Histogram, j: usize) -> String {
    let (w, origin) = (hist.width_ns(), hist.origin_ns());
    let edge = origin + (j as u64 + 1) * w;
    if w % 1000 == 0 && origin % 1000 == 0 {
        format!("{:03} (us)", edge / 1000)
    } else {
        format!("{:07.3} (us)", edge as f64 / 1000.0)
    }
}

/// Prints the summary's figures per CPU: minimum, average, maximum, max-min and duration, with
/// the bucket width of the first thread, as oslat rounds them.
fn print_figures(ts: &[OslatThread]) {
    let w = ts[0].hist.width_ns();
    let min = |t: &OslatThread| oslat::oslat_micros(t.hist.min_ns(), w);
    let max = |t: &OslatThread| oslat::oslat_micros(t.hist.max_ns(), w);
    summary_row("Minimum", ts.iter().map(|t| micros_text(min(t))), " (us)");
    summary_row(
        "Average",
        ts.iter()
            .map(|t| format!("{:.3}", t.hist.bucket_mean_ns() / 1000.0)),
        " (us)",
    );
    summary_row("Maximum", ts.iter().map(|t| micros_text(max(t))), " (us)");
    summary_row(
        "Max-Min",
        ts.iter().map(|t| match (max(t), min(t)) {
            (Micros::Whole(a), Micros::Whole(b)) => (a - b).to_string(),
            (a, b) => format!("{:.3}", a.value() - b.value()),
        }),
        " (us)",
    );
    summary_row(
        "Duration",
        ts.iter().map(|t| format!("{:.3}", t.duration_s)),
        " (sec)",
    );
}

/// Our figures, after oslat's: exact percentiles per CPU.
fn print_extras(run: &OslatRun, cfg: &OslatConfig) {
    for t in &run.threads {
        eprintln!(
            "# qpw-emu cpu {}: {}; exact avg {:.3} us; {} gaps past the last bucket{}",
            t.cpu,
            t.hist.percentiles_us(),
            t.hist.mean_ns() / 1000.0,
            t.hist.overflow(),
            if cfg.local_op.is_some() {
                format!("; {} local ops", t.local_ops)
            } else {
                String::new()
            }
        );
    }
}
