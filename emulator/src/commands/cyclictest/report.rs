//! `qpw-emu cyclictest`'s report, in cyclictest's order: the JSON (written before the final
//! lines), the `T:` lines with `-q`, `--spike`'s list, the histogram, `-b`'s thread ids and
//! break; then our own figures on stderr.

use std::io::Write;

use anyhow::{Context, Result};

use crate::cli::CyclictestArgs;
use crate::cyclictest::{self, CyclicConfig, CyclicRun, ThreadSpec};
use crate::drain::{print_requester, qpw_fields};
use crate::json::{
    Buckets, CyclictestBody, CyclictestThreadJson, Envelope, Indexed, QpwFields, Settings,
};
use crate::sink::Sink;

use super::plan::Plan;
use super::setup::SetUp;
use super::Measured;

/// Writes and prints what the run measured.
pub(super) fn report(
    plan: &Plan,
    args: &CyclictestArgs,
    held: &SetUp,
    measured: Measured,
    start_time: String,
    sink: &Sink,
) -> Result<()> {
    // cyclictest writes its JSON before the final lines.
    if sink.wants_json() {
        write_json(plan, args, held, &measured, start_time, sink)?;
    }
    let Plan {
        histogram,
        ref specs,
        ref spec,
        breaktrace,
        ..
    } = *plan;
    let throttling = &held.throttling;
    let Measured {
        cfg,
        run,
        load,
        traced,
        ..
    } = measured;
    if sink.is_quiet() && histogram.is_none() {
        for (i, t) in run.threads.iter().enumerate() {
            println!("{}", final_line(i, t, &specs[i], args.nsecs));
        }
    }
    print_spikes(&run);
    if let Some(h) = histogram {
        write_histogram(args, &run, h)?;
    }
    if breaktrace.is_some() {
        print_break(&run);
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

/// `--spike`'s list: each spike with its thread and time, then their count.
fn print_spikes(run: &CyclicRun) {
    let (spikes, count) = &run.spikes;
    if !spikes.is_empty() {
        println!();
        for s in spikes {
            println!("T:{:2} Spike:{:8}: TS: {:12}", s.thread, s.value, s.at_us);
        }
        println!("spikes = {count}\n");
    }
}

/// The histogram of `buckets` buckets, into `--histfile` or onto standard output.
fn write_histogram(args: &CyclictestArgs, run: &CyclicRun, buckets: usize) -> Result<()> {
    let histofall = args.histofall.is_some();
    match &args.histfile {
        Some(path) => {
            let mut f = std::fs::File::create(path)
                .with_context(|| format!("--histfile {}: cannot create", path.display()))?;
            cyclictest::write_histogram(&mut f, run, buckets, histofall)?;
        }
        None => {
            // A standard output that is gone stops the run as Ctrl-C does (crate::out).
            crate::out::check_stdout(cyclictest::write_histogram(
                &mut std::io::stdout().lock(),
                run,
                buckets,
                histofall,
            ));
        }
    }
    Ok(())
}

/// `-b`'s lines: the threads' ids, and the thread and value that broke the run if one did.
fn print_break(run: &CyclicRun) {
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

/// The rt-tests JSON of the run, with our fields, where `--json` said.
fn write_json(
    plan: &Plan,
    args: &CyclictestArgs,
    held: &SetUp,
    measured: &Measured,
    start_time: String,
    sink: &Sink,
) -> Result<()> {
    let Plan {
        priority,
        ref spec,
        duration,
        ..
    } = *plan;
    let Measured {
        cfg,
        run,
        load,
        traced,
        ..
    } = measured;
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
        load,
        run.figures(),
        settings,
        sink,
        run.interrupted,
    );
    if let (None, Some((tid, v))) = (&fields.stopped_by, run.break_hit) {
        fields.stopped_by = Some(format!("breaktrace: thread {tid} saw {v}"));
    }
    fields.trace = traced.clone();
    fields.rt_throttling = spec.is_some().then_some(held.throttling.clone());
    fields.isolation = held.isolation.as_ref().map(|i| i.report.clone());
    let doc = cyclictest_json(run, cfg, start_time, fields);
    sink.write_json(&doc)
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
