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

use anyhow::Result;

use crate::cli::CyclictestArgs;
use crate::clock::Calibration;
use crate::cyclictest::{self, CyclicConfig, CyclicRun, LiveLines, MainLoop, Verbose};
use crate::drain::{LoadAfter, ProbeLoad};
use crate::json::TraceFields;
use crate::oslat::LocalOp;
use crate::rt;
use crate::sink::Sink;
use crate::trace::Session;

mod plan;
mod report;
mod setup;

use plan::Plan;
use setup::SetUp;

/// cyclictest's default number of spikes kept (`--spike-nodes`).
const DEFAULT_SPIKE_NODES: u64 = 1024;

/// `qpw-emu cyclictest`, or `cyclictest` through a link: its plan, the set-up it holds, the
/// threads under the load, the report.
pub fn cyclictest_cmd(args: &CyclictestArgs) -> Result<()> {
    // What to measure: the threads, their CPUs, policies, intervals and sleep; the load; the
    // outputs (cyclictest's warnings about its options said as it says them).
    let sink = Sink::new(args.quiet).with_verbose(args.verbose);
    let plan = Plan::new(args, &sink)?;
    let mut sink = sink.with_json(plan.json.clone());
    let start_time = rt::rt_timestamp();
    // The set-up, held until the end.
    let mut held = SetUp::hold(&plan, args, &mut sink)?;
    // The threads under the load, the trace beside them.
    let measured = measure(&plan, args, &mut held, &mut sink)?;
    // The JSON first, then cyclictest's final lines on stdout, then ours on stderr.
    report::report(&plan, args, &held, measured, start_time, &sink)
}

/// What the threads measured, with the load's outcome and the trace's attribution.
struct Measured {
    cfg: CyclicConfig,
    run: CyclicRun,
    load: LoadAfter,
    traced: Option<TraceFields>,
    /// The live lines and the `-F` pipe, kept until the report is done.
    _main: MainLoop,
}

/// Runs the threads under the load, the live lines on the main thread, the trace beside them.
fn measure(
    plan: &Plan,
    args: &CyclictestArgs,
    held: &mut SetUp,
    sink: &mut Sink,
) -> Result<Measured> {
    let Plan {
        ref cpus,
        ref measured,
        ref spec,
        trace_us,
        ..
    } = *plan;
    let calibration = trace_us.map(|_| Calibration::measure());
    let tracing = trace_us
        .map(|_| crate::probe_trace::start_for_probe(measured, cpus, &Sink::new(true)))
        .transpose()?;
    let load = ProbeLoad::start(spec.as_ref())?;
    let cfg = probe_config(plan, args, sink, load.local_op(), calibration);
    let mut main = main_loop(plan, args, held, sink);
    let run = cyclictest::run(&cfg, &load.phase, &mut main);
    let (run, load) = load.finish(run, |r| &r.warnings, measured.first(), sink)?;
    let traced = match (tracing, trace_us, calibration) {
        (Some(session), Some(us), Some(cal)) => Some(attribute(session, &run, cal, us, sink)?),
        _ => None,
    };
    if let (Some((_, value)), Some(m)) = (run.break_hit, &mut held.marker) {
        m.mark(&format!(
            "hit latency threshold ({value} > {})",
            plan.breaktrace.unwrap_or(0)
        ));
    }

    Ok(Measured {
        cfg,
        run,
        load,
        traced,
        _main: main,
    })
}

/// What the probe measures: the plan's threads, clock, sleep and outputs, the load's local
/// operation, and with `--trace` the late wake-ups to keep for the trace (`calibration` is then
/// the counter's).
fn probe_config(
    plan: &Plan,
    args: &CyclictestArgs,
    sink: &Sink,
    local_op: Option<LocalOp>,
    calibration: Option<Calibration>,
) -> CyclicConfig {
    let Plan {
        histogram,
        ref specs,
        trace_us,
        duration,
        clock,
        sleep,
        align,
        breaktrace,
        ..
    } = *plan;
    CyclicConfig {
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
        verbose: sink.is_verbose(),
        local_op,
        late_log: trace_us
            .zip(calibration)
            .map(|(us, cal)| ((us * 1000.0) as u64, cal)),
    }
}

/// What the main thread runs while the threads measure: cyclictest's live lines (or `-v`'s
/// values), the `-F` pipe the set-up holds, and our progress line where cyclictest draws nothing
/// itself (`-q`) and the end is known.
fn main_loop(plan: &Plan, args: &CyclictestArgs, held: &mut SetUp, sink: &Sink) -> MainLoop {
    let lines = LiveLines::new(
        plan.specs.clone(),
        args.nsecs,
        plan.policy_label.clone(),
        args.refresh_on_max,
        sink.is_quiet(),
        sink.is_verbose()
            .then(|| Verbose::new(plan.nthreads, args.oscope.unwrap_or(1))),
    );
    let progress = (sink.is_quiet() && !sink.is_verbose())
        .then(|| {
            plan.duration
                .map(|d| crate::progress::Progress::new("cyclictest", d, false))
        })
        .flatten();
    MainLoop::new(lines, held.fifo.take(), progress)
}

/// Ends the trace and matches each thread's wake-ups later than `threshold_us` with it.
fn attribute(
    session: Session,
    run: &CyclicRun,
    cal: Calibration,
    threshold_us: f64,
    sink: &mut Sink,
) -> Result<TraceFields> {
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
    crate::probe_trace::attribute(session, &probes, cal, threshold_us, sink)
}
