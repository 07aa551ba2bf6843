//! `qpw-emu cyclictest`: rt-tests 2.4's `cyclictest`, flag for flag and line for line, with our
//! drain load and our figures after its output.
//!
//! What cyclictest prints, in order: `# /dev/cpu_dma_latency set to 0us` when it holds it; the
//! live lines (`policy: ...: loadavg: ...`, then `T: 0 (tid) P:.. I:.. C:.. Min: Act: Avg: Max:`
//! per thread, redrawn in place) unless `-q`, or `-v`'s `thread:cycle:value` lines; with `-q`
//! and no histogram, the `T:` lines once at the end; `--spike`'s list; the `# Histogram` block
//! with `-h`; with `-b`, `# Thread Ids:` and the break. Ours go to stderr, on lines of their own
//! that start with `# qpw-emu`: scripts read the `T:` lines from the end of stdout (Linaro's
//! `tail -n <threads>`), so nothing of ours may follow them there.
//!
//! A few flags are taken with their stated meaning where 2.4's code differs from its help:
//! `--policy batch` and `idle` are applied (2.4 runs such threads `SCHED_OTHER`).

use std::io::Write;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use qpw_core::CpuSet;

use crate::cli::{CyclictestArgs, RunLength};
use crate::cpus::Cpus;
use crate::cyclictest::{
    self, Align, CyclicConfig, CyclicRun, Fifo, LiveLines, MainLoop, Policy, SleepMode, ThreadSpec,
    Verbose,
};
use crate::drain::{print_requester, qpw_fields, ProbeLoad};
use crate::json::{
    self, Buckets, CyclictestBody, CyclictestThreadJson, Envelope, Indexed, QpwFields, Settings,
};
use crate::rt::{self, AwayFrom, TraceMarker, Warnings};
use crate::throttling::RtThrottling;
use crate::validate;

/// cyclictest's `HIST_MAX`: larger `-h` values are cut to it.
const HIST_MAX: u64 = 1_000_000;
/// cyclictest's default distance between the threads' intervals, in us.
const DEFAULT_DISTANCE: u64 = 500;
/// cyclictest's default number of spikes kept (`--spike-nodes`).
const DEFAULT_SPIKE_NODES: u64 = 1024;

/// The NUMA node of `cpu`, from sysfs (0 when the system does not say).
fn numa_node(cpu: usize) -> i64 {
    std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{cpu}"))
        .ok()
        .and_then(|dir| {
            dir.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("node"))
                        .and_then(|n| n.parse().ok())
                })
                .next()
        })
        .unwrap_or(0)
}

/// `qpw-emu cyclictest`, or `cyclictest` through a link.
pub fn cyclictest_cmd(args: &CyclictestArgs) -> Result<()> {
    crate::cli::note_stray("cyclictest", &args.stray);
    if args.smi {
        bail!(
            "--smi: not supported: cyclictest counts SMIs by reading MSR 0x34 through \
             /dev/cpu/N/msr on the Intel models it knows; qpw-emu reads no MSRs (and a \
             virtual machine has no SMI counter to read)"
        );
    }
    if args.aligned.is_some() && args.secaligned.is_some() {
        bail!("-A/--aligned and --secaligned: give one or the other, not both");
    }
    if args.oscope.is_some_and(|r| r > 1) && !args.verbose {
        bail!("-o/--oscope: only meaningful with -v (the values it reduces)");
    }
    let cpus = Cpus::read()?;
    let quiet = args.quiet;
    // Which CPUs, how many threads.
    let (set, explicit_set, nthreads) = if args.smp {
        if args.threads.is_some() {
            eprintln!("WARN: -t ignored due to smp mode");
        }
        if args.affinity.is_some() {
            eprintln!("WARN: -a ignored due to smp mode");
        }
        (cpus.allowed.clone(), false, cpus.allowed.len())
    } else {
        let (set, explicit) = match args.affinity.as_deref() {
            Some(raw) if raw != "all" => {
                (validate::cpu_list("--affinity", raw, &cpus.allowed)?, true)
            }
            _ => (cpus.allowed.clone(), false),
        };
        let n = match args.threads {
            None => 1,
            Some(None) => set.len(),
            Some(Some(n)) => n as usize,
        };
        (set, explicit, n)
    };
    // Policy and priorities, as cyclictest settles them.
    let mut policy = match &args.policy {
        Some(raw) => raw
            .parse::<Policy>()
            .map_err(|e| anyhow!("--policy {raw}: {e}"))?,
        None => Policy::Other,
    };
    let mut priority = args.priority as i32;
    if priority > 0 && !policy.is_realtime() {
        policy = Policy::Fifo;
    }
    if (args.priospread || policy.is_realtime()) && priority == 0 {
        priority = (nthreads as i32 + 1).min(99);
        eprintln!("defaulting realtime priority to {priority}");
        if !policy.is_realtime() {
            policy = Policy::Fifo;
        }
    }
    let histogram = args
        .histogram
        .or(args.histofall)
        .map(|h| h.min(HIST_MAX) as usize);
    if histogram.is_some() && args.distance.is_some() {
        eprintln!("WARN: distance is ignored and set to 0, if histogram enabled");
    }
    let distance = if histogram.is_some() {
        0
    } else {
        args.distance.unwrap_or(DEFAULT_DISTANCE)
    };
    let mut specs = Vec::with_capacity(nthreads);
    let mut prio = priority;
    for i in 0..nthreads {
        let (p, pol) = if prio > 0 && policy.is_realtime() {
            (prio, policy)
        } else if policy.is_realtime() {
            (0, Policy::Other)
        } else {
            (0, policy)
        };
        specs.push(ThreadSpec {
            cpu: set.as_slice()[i % set.len()],
            policy: pol,
            prio: p,
            interval: Duration::from_micros(args.interval + i as u64 * distance),
        });
        if args.priospread {
            prio = (prio - 1).max(0);
        }
    }
    let forced_other = !(priority > 0 && policy.is_realtime()) && policy == Policy::Other;
    let policy_label = if forced_other {
        format!("{}/other", policy.name())
    } else {
        policy.name().to_string()
    };
    let measured: CpuSet = specs.iter().map(|s| s.cpu).collect();
    let spec = crate::drain::resolve_drain(&args.drain, &cpus, &measured, false)?;
    if let Some(w) = args.drain.workload.as_deref() {
        if w == "memmove" || w == "no" {
            bail!("--workload {w}: oslat's busy-loop workloads belong to `qpw-emu oslat`");
        }
    }
    for (flag, path) in [("--json", &args.json), ("--histfile", &args.histfile)] {
        if let Some(path) = path {
            validate::output_file(flag, path)?;
        }
    }
    if let Some(path) = &args.fifo {
        if path.is_dir() {
            bail!(
                "-F/--fifo {}: is a directory: give the path of the named pipe to create",
                path.display()
            );
        }
    }
    let trace_us = args
        .trace
        .as_deref()
        .map(crate::probe_trace::threshold_us)
        .transpose()?;
    if trace_us.is_some() {
        crate::trace::tracefs::preflight()?;
    }
    let main_cpus = match &args.mainaffinity {
        Some(raw) => Some(validate::cpu_list("--mainaffinity", raw, &cpus.allowed)?),
        None => explicit_set.then(|| set.clone()),
    };
    let duration = match args.duration {
        Some(RunLength::For(d)) => Some(d),
        Some(RunLength::UntilStopped) | None => None,
    };
    let clock = if args.clock == 1 {
        libc::CLOCK_REALTIME
    } else {
        libc::CLOCK_MONOTONIC
    };
    let sleep = match (args.system, args.posix_timers, args.relative) {
        (true, true, _) => {
            eprintln!("WARN: The system option requires clock_nanosleep");
            eprintln!("WARN: and is not compatible with posix_timers");
            eprintln!("WARN: Using clock_nanosleep");
            SleepMode::Nanosleep
        }
        (true, false, _) => SleepMode::Nanosleep,
        (false, true, _) => SleepMode::PosixTimer,
        (false, false, true) => SleepMode::Relative,
        (false, false, false) => SleepMode::Absolute,
    };
    let align = match (args.aligned, args.secaligned) {
        (Some(off), _) => Align::Threads(Duration::from_micros(off.unwrap_or(0))),
        (_, Some(off)) => Align::Second(Duration::from_micros(off.unwrap_or(0))),
        _ => Align::None,
    };
    let breaktrace = args.breaktrace.filter(|&b| b > 0);

    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    // 2.4 says it once more while it parses `-a`, when `-v` came before it.
    if args.verbose && args.verbose_before_affinity && explicit_set {
        println!("Using {} cpus.", set.len());
    }
    if args.verbose {
        println!("Max CPUs = {}", cpus.allowed.last().map_or(0, |c| c + 1));
        println!("Online CPUs = {}", cpus.allowed.len());
        if explicit_set {
            println!("Using {} cpus.", set.len());
        }
    }
    let mut guard = rt::prepare(args.mlockall, &mut warnings, quiet);
    if args.laptop {
        eprintln!("WARN: not setting cpu_dma_latency to save battery power");
        guard.set_dma_latency(None, &mut warnings, quiet);
    } else if args.default_system {
        eprintln!("WARN: not setting cpu_dma_latency from cyclictest");
        guard.set_dma_latency(None, &mut warnings, quiet);
    } else if let Some(v) = args.latency {
        guard.set_dma_latency(Some(v as i32), &mut warnings, quiet);
    }
    if guard.holds_dma_latency() {
        println!(
            "# /dev/cpu_dma_latency set to {}us",
            args.latency.unwrap_or(0)
        );
    }
    if !args.drain.isolate {
        rt::check_isolation(&measured, &mut warnings, quiet);
    }
    let mut marker = (breaktrace.is_some() && args.tracemark).then(|| {
        let marker = TraceMarker::open(&mut warnings);
        marker.say_missing(quiet);
        marker
    });
    if args.resolution {
        check_resolution(clock, args.verbose, args.dbg_cyclictest);
    }
    rt::catch_sigint(&mut warnings, quiet);
    // After Ctrl-C is taken: a signal must not end the process before the guard restores.
    let throttling_off = crate::drain::throttling_for_run(&args.drain, &mut warnings, quiet)?;
    let throttling = RtThrottling::read(throttling_off.as_ref());
    let isolation = crate::isolate::for_run(
        args.drain.isolate,
        &measured,
        &cpus.allowed,
        &mut warnings,
        quiet,
    )?;
    if args.verbose {
        for (i, s) in specs.iter().enumerate() {
            if explicit_set {
                println!("Thread {i} using cpu {}.", s.cpu);
            }
            // As 2.4 prints it: after it has added the distance for the next thread, so the
            // figure is this thread's interval plus one distance (the thread runs at its own).
            println!(
                "Thread {i} Interval: {}",
                s.interval.as_micros() as u64 + distance
            );
        }
    }
    let fifo = args.fifo.as_deref().map(Fifo::create).transpose()?;
    let _main = main_cpus.map(|m| AwayFrom::onto(&m, &mut warnings, quiet));

    let calibration = trace_us.map(|_| crate::clock::Calibration::measure());
    let tracing = trace_us
        .map(|_| crate::probe_trace::start_for_probe(&measured, &cpus, true))
        .transpose()?;
    let load = ProbeLoad::start(spec.as_ref())?;
    let cfg = CyclicConfig {
        threads: specs.clone(),
        duration,
        loops: args.loops,
        clock,
        sleep,
        nsecs: args.nsecs,
        histogram,
        breaktrace,
        spike: args
            .spike
            .filter(|&t| t > 0)
            .map(|t| (t, args.spike_nodes.unwrap_or(DEFAULT_SPIKE_NODES) as usize)),
        align,
        verbose: args.verbose,
        local_op: load.local_op(),
        late_log: trace_us
            .zip(calibration)
            .map(|(us, cal)| ((us * 1000.0) as u64, cal)),
    };
    let lines = LiveLines::new(
        specs.clone(),
        args.nsecs,
        policy_label,
        args.refresh_on_max,
        quiet,
        args.verbose
            .then(|| Verbose::new(nthreads, args.oscope.unwrap_or(1))),
    );
    // Our progress line: only where cyclictest draws nothing itself (-q) and the end is known.
    let progress = (quiet && !args.verbose)
        .then(|| duration.map(|d| crate::progress::Progress::new("cyclictest", d, false)))
        .flatten();
    let mut main = MainLoop::new(lines, fifo, progress);
    let run = cyclictest::run(&cfg, &load.phase, &mut main);
    let (run, load) = load.finish(run, |r| &r.warnings, measured.first(), &mut warnings, quiet)?;
    let traced = match (tracing, trace_us, calibration) {
        (Some(session), Some(us), Some(cal)) => {
            let probes: Vec<_> = run
                .threads
                .iter()
                .map(|t| crate::probe_trace::ProbeGaps {
                    cpu: t.cpu,
                    tid: t.tid,
                    gaps: &t.late,
                    not_kept: t.late_not_kept,
                })
                .collect();
            Some(crate::probe_trace::attribute(
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
    if let (Some((_, value)), Some(m)) = (run.break_hit, &mut marker) {
        m.mark(&format!(
            "hit latency threshold ({value} > {})",
            breaktrace.unwrap_or(0)
        ));
    }

    // cyclictest writes its JSON before the final lines.
    if let Some(path) = &args.json {
        let settings = Settings {
            bucket_width_ns: cfg.unit_ns(),
            bucket_size: run.threads.first().map_or(0, |t| t.hist.buckets()),
            duration_s: duration.map_or(0.0, |d| d.as_secs_f64()),
            rtprio: (priority > 0).then_some(priority),
            local_op_every_us: None,
            interval_us: Some(args.interval),
        };
        let mut fields = qpw_fields(
            "cyclictest",
            spec.as_ref(),
            &load,
            run.figures(),
            settings,
            &warnings,
            run.interrupted,
        );
        if let (None, Some((tid, v))) = (&fields.stopped_by, run.break_hit) {
            fields.stopped_by = Some(format!("breaktrace: thread {tid} saw {v}"));
        }
        fields.trace = traced.clone();
        fields.rt_throttling = spec.is_some().then_some(throttling.clone());
        fields.isolation = isolation.as_ref().map(|i| i.report.clone());
        let doc = cyclictest_json(&run, &cfg, start_time, fields);
        json::write(path, &doc)?;
    }
    if quiet && histogram.is_none() {
        for (i, t) in run.threads.iter().enumerate() {
            println!("{}", final_line(i, t, &specs[i], args.nsecs));
        }
    }
    let (spikes, count) = &run.spikes;
    if !spikes.is_empty() {
        println!();
        for s in spikes {
            println!("T:{:2} Spike:{:8}: TS: {:12}", s.thread, s.value, s.at_us);
        }
        println!("spikes = {count}\n");
    }
    if let Some(h) = histogram {
        let histofall = args.histofall.is_some();
        match &args.histfile {
            Some(path) => {
                let mut f = std::fs::File::create(path)
                    .with_context(|| format!("--histfile {}: cannot create", path.display()))?;
                cyclictest::write_histogram(&mut f, &run, h, histofall)?;
            }
            None => {
                // A standard output that is gone stops the run as Ctrl-C does (crate::out).
                crate::out::check_stdout(cyclictest::write_histogram(
                    &mut std::io::stdout().lock(),
                    &run,
                    h,
                    histofall,
                ));
            }
        }
    }
    if breaktrace.is_some() {
        let tids: String = run
            .threads
            .iter()
            .map(|t| format!(" {:05}", t.tid))
            .collect();
        println!("# Thread Ids:{tids}");
        if let Some((tid, value)) = run.break_hit {
            println!("# Break thread: {tid}");
            println!("# Break value: {value}");
        }
    }
    print_extras(&run, cfg.local_op.is_some());
    if let Some(o) = &load.outcome {
        print_requester(o);
        eprintln!("# qpw-emu {}", throttling.line());
    }
    crate::probe_trace::print_after_tool(
        traced.as_ref(),
        load.outcome.as_ref(),
        spec.as_ref().is_some_and(|s| s.workload.kernel().is_some()),
    );
    if run.interrupted {
        eprintln!("# qpw-emu: {}", crate::signals::stopped_by());
    }
    crate::out::check_stdout(std::io::stdout().flush());
    Ok(())
}

/// The `T:` line from a thread's final figures.
fn final_line(i: usize, t: &cyclictest::CyclicThread, spec: &ThreadSpec, nsecs: bool) -> String {
    let head = format!(
        "T:{i:2} ({:5}) P:{:2} I:{} C:{:7} Min:{:7} ",
        t.tid,
        spec.prio,
        spec.interval.as_micros(),
        t.cycles,
        t.min
    );
    if nsecs {
        format!("{head}Act:{:8} Avg:{:8} Max:{:8}", t.act, t.avg(), t.max)
    } else {
        format!("{head}Act:{:5} Avg:{:5} Max:{:8}", t.act, t.avg(), t.max)
    }
}

/// Our figures, after cyclictest's: exact percentiles and overruns per thread.
fn print_extras(run: &CyclicRun, local_ops: bool) {
    for (i, t) in run.threads.iter().enumerate() {
        eprintln!(
            "# qpw-emu thread {i} (cpu {}): {}; {} overruns{}",
            t.cpu,
            t.hist.percentiles_us(),
            t.overruns,
            if local_ops {
                format!("; {} local ops", t.local_ops)
            } else {
                String::new()
            }
        );
    }
}

/// cyclictest's `-R`: reads the clock back to back and says when the measured resolution is
/// coarser than the reported one (always with `-v`); `--dbg_cyclictest` lists the readings.
fn check_resolution(clock: libc::clockid_t, verbose: bool, list: bool) {
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `res` is a valid, writable timespec.
    let reported = if unsafe { libc::clock_getres(clock, &mut res) } == 0 {
        res.tv_sec as u64 * 1_000_000_000 + res.tv_nsec as u64
    } else {
        eprintln!("WARN: clock_getres failed");
        u64::MAX
    };
    let times: Vec<u64> = (0..10_000).map(|_| crate::clock::clock_ns(clock)).collect();
    let mut min_diff = u64::MAX;
    for pair in times.windows(2) {
        let d = pair[1] - pair[0];
        if list {
            eprintln!(
                "{}.{:09}  {d:5}",
                pair[1] / 1_000_000_000,
                pair[1] % 1_000_000_000
            );
        }
        if d > 0 {
            min_diff = min_diff.min(d);
        }
    }
    if verbose || (min_diff != u64::MAX && min_diff > reported) {
        eprintln!("WARN: reported clock resolution: {reported} nsec");
        eprintln!("WARN: measured clock resolution approximately: {min_diff} nsec");
    }
}

fn cyclictest_json(
    run: &CyclicRun,
    cfg: &CyclicConfig,
    start_time: String,
    qpw: QpwFields,
) -> Envelope<CyclictestBody> {
    let threads: Vec<CyclictestThreadJson> = run
        .threads
        .iter()
        .map(|t| CyclictestThreadJson {
            histogram: if cfg.histogram.is_some() {
                Buckets::cyclictest(&t.hist)
            } else {
                Buckets::default()
            },
            cycles: t.cycles,
            min: t.min,
            max: t.max,
            // cyclictest writes "%.2f".
            avg: if t.cycles == 0 {
                0.0
            } else {
                (t.sum as f64 / t.cycles as f64 * 100.0).round() / 100.0
            },
            cpu: t.cpu,
            node: numa_node(t.cpu),
        })
        .collect();
    Envelope::succeeded(
        start_time,
        CyclictestBody {
            num_threads: threads.len(),
            resolution_in_ns: u64::from(cfg.nsecs),
            thread: Indexed(threads),
            qpw,
        },
    )
}
