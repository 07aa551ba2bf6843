//! `qpw-emu resctrl`: the resctrl counter read paths side by side, shown as a table and exported
//! as JSON.
//!
//! The figures are measured by `qpw_workloads::resctrl::measure_read_paths`; this module only
//! validates options, runs it, and turns its typed result into our typed JSON (durations in
//! microseconds).

use std::fmt::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use qpw_workloads::resctrl::{self, FiguresConfig, ResctrlFigures};
use serde::Serialize;

use crate::cli::ResctrlArgs;
use crate::json::Envelope;
use crate::rt;
use crate::sink::{JsonOut, Sink};
use crate::validate;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One resctrl read path's figures, in microseconds.
#[derive(Debug, Serialize)]
struct PathJson {
    /// `workqueue`, `interrupt`, `local` or `cached`.
    path: String,
    /// Opening every file once.
    setup_us: f64,
    /// Passes over every file.
    passes: usize,
    /// Average pass over every file.
    pass_avg_us: f64,
    /// Longest pass over every file.
    pass_max_us: f64,
    /// Files of the reader's own domain.
    local_files: usize,
    /// Average pass over the reader's own domain.
    local_pass_avg_us: f64,
    /// File reads in the passes.
    reads: u64,
    /// Average `rdtgroup_mutex` hold per read.
    hold_avg_us: f64,
    /// Longest hold.
    hold_max_us: f64,
    /// Reads executed by another thread (a worker or an interrupted thread).
    remote_reads: u64,
    /// Average wait of the reader, mutex held, for that thread, per remote read.
    executor_wait_avg_us: f64,
    /// Longest such wait.
    executor_wait_max_us: f64,
    /// Reads that waited for the mutex itself.
    mutex_waits: u64,
    /// Time the reader was off-CPU during the passes (read once per pass, not per read).
    off_cpu_us: f64,
    /// The reader's voluntary context switches during the passes.
    voluntary_switches: u64,
    /// Reads run by a worker.
    worker_runs: u64,
    /// Reads run by interrupting a thread on a domain CPU.
    interrupts: u64,
    /// Reads the reader did itself.
    reader_direct: u64,
    /// Local-path reads that fell back to the workqueue.
    local_fallbacks: u64,
    /// Reads answered from the cache.
    cached: u64,
    /// Times a thread on a domain CPU was interrupted for a read.
    interruptions: u64,
    /// Involuntary context switches of the load threads.
    load_involuntary_switches: u64,
    /// Average age of cached values.
    cached_age_avg_us: Option<f64>,
    /// Oldest cached value returned.
    cached_age_max_us: Option<f64>,
    /// Results that were not values.
    non_values: u64,
}

/// The resctrl figures.
#[derive(Debug, Serialize)]
struct ResctrlJson {
    /// `resctrl`.
    tool: String,
    /// The CPUs the model ran on (physical or logical).
    cpus: String,
    /// Whether they were logical CPUs multiplexed onto fewer physical ones.
    logical: bool,
    /// L3 domains.
    domains: usize,
    /// Monitoring groups.
    groups: usize,
    /// Events per group.
    events: usize,
    /// Files per pass.
    files: usize,
    /// The reader's CPU.
    reader_cpu: usize,
    /// The reader's domain.
    reader_domain: usize,
    /// Busy load threads per loaded CPU.
    load_threads_per_cpu: usize,
    /// Whether the load threads were registered for the interrupt path.
    load_interruptible: bool,
    /// The loaded CPUs (every domain CPU but the reader's).
    loaded_cpus: Vec<usize>,
    /// Busy load threads in all.
    load_threads: usize,
    /// The overflow worker's period, in ms.
    overflow_interval_ms: f64,
    /// Reads that ran outside their domain (must be 0).
    violations: u64,
    /// One entry per read path.
    paths: Vec<PathJson>,
}

fn resctrl_json(f: &ResctrlFigures) -> ResctrlJson {
    ResctrlJson {
        tool: "resctrl".into(),
        cpus: f.cpus.clone(),
        logical: f.logical,
        domains: f.domains,
        groups: f.groups,
        events: f.events,
        files: f.files,
        reader_cpu: f.reader_cpu,
        reader_domain: f.reader_domain,
        load_threads_per_cpu: f.load.threads_per_cpu,
        load_interruptible: f.load.interruptible,
        loaded_cpus: f.loaded_cpus.clone(),
        load_threads: f.load_threads,
        overflow_interval_ms: f.overflow_interval.as_secs_f64() * 1e3,
        violations: f.violations,
        paths: f
            .paths
            .iter()
            .map(|p| PathJson {
                path: p.path.name().to_string(),
                setup_us: us(p.setup),
                passes: p.passes,
                pass_avg_us: us(p.pass_avg),
                pass_max_us: us(p.pass_max),
                local_files: p.local_files,
                local_pass_avg_us: us(p.local_pass_avg),
                reads: p.reads,
                hold_avg_us: us(p.hold_avg),
                hold_max_us: us(p.hold_max),
                remote_reads: p.remote_reads,
                executor_wait_avg_us: us(p.executor_wait_avg),
                executor_wait_max_us: us(p.executor_wait_max),
                mutex_waits: p.mutex_waits,
                off_cpu_us: us(p.off_cpu),
                voluntary_switches: p.voluntary_switches,
                worker_runs: p.counts.worker_runs,
                interrupts: p.counts.interrupts,
                reader_direct: p.counts.reader_direct,
                local_fallbacks: p.counts.local_fallbacks,
                cached: p.counts.cached,
                interruptions: p.interruptions,
                load_involuntary_switches: p.load_involuntary_switches,
                cached_age_avg_us: p.cached_age_avg.map(us),
                cached_age_max_us: p.cached_age_max.map(us),
                non_values: p.non_values,
            })
            .collect(),
    }
}

/// `qpw-emu resctrl`.
pub fn resctrl_cmd(args: &ResctrlArgs) -> Result<()> {
    let mut config = FiguresConfig::default();
    if let Some(g) = &args.groups {
        config.groups = Some(validate::int_in("--groups", g, 1, 4095)? as usize);
    }
    if let Some(l) = &args.load {
        config.load.threads_per_cpu =
            validate::int_in("--load", l, 0, resctrl::MAX_THREADS_PER_CPU as u64)? as usize;
    }
    if let Some(p) = &args.passes {
        config.passes = validate::int_in("--passes", p, 1, 1000)? as usize;
    }
    let json = JsonOut::checked("--json", args.json.as_deref())?;
    let start_time = rt::rt_timestamp();
    let sink = Sink::new(args.quiet).with_json(json);
    sink.say(format_args!(
        "qpw-emu resctrl: {} passes per read path, {} busy threads per loaded CPU, from \
             qpw_workloads::resctrl::measure_read_paths",
        config.passes, config.load.threads_per_cpu
    ));
    let figures = resctrl::measure_read_paths(&config).context("resctrl figures")?;
    let j = resctrl_json(&figures);
    print!("{}", text(&j));
    if sink.wants_json() {
        sink.write_json(&Envelope::succeeded(start_time, j))?;
    }
    Ok(())
}

/// The read paths side by side, as text.
fn text(j: &ResctrlJson) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "resctrl read paths: {} files per pass ({} groups x {} events x {} domains), reader cpu {} \
         (domain {}), {} busy load threads ({} on each of cpus {:?}); {}{}",
        j.files,
        j.groups,
        j.events,
        j.domains,
        j.reader_cpu,
        j.reader_domain,
        j.load_threads,
        j.load_threads_per_cpu,
        j.loaded_cpus,
        j.cpus,
        if j.logical {
            " (logical CPUs: compare paths with each other, not with the seed's figures)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "{:<10} {:>9} {:>12} {:>12} {:>11} {:>11} {:>11} {:>12} {:>11} {:>11} {:>7} {:>7} {:>7} {:>7} {:>8}",
        "path",
        "setup ms",
        "pass avg ms",
        "pass max ms",
        "local us",
        "hold avg us",
        "hold max us",
        "wait avg us",
        "wait max us",
        "off-cpu ms",
        "worker",
        "irq",
        "direct",
        "cached",
        "interr."
    );
    for p in &j.paths {
        let _ = writeln!(
            s,
            "{:<10} {:>9.1} {:>12.2} {:>12.2} {:>11.1} {:>11.2} {:>11.1} {:>12.1} {:>11.1} {:>11.1} {:>7} {:>7} {:>7} {:>7} {:>8}",
            p.path,
            p.setup_us / 1e3,
            p.pass_avg_us / 1e3,
            p.pass_max_us / 1e3,
            p.local_pass_avg_us,
            p.hold_avg_us,
            p.hold_max_us,
            p.executor_wait_avg_us,
            p.executor_wait_max_us,
            p.off_cpu_us / 1e3,
            p.worker_runs,
            p.interrupts,
            p.reader_direct,
            p.cached,
            p.interruptions
        );
    }
    let _ = writeln!(
        s,
        "wait: the reader's wait, rdtgroup_mutex held, for the worker or the interrupted thread \
         that executed a read, per read executed elsewhere; off-cpu: over the passes"
    );
    if j.violations > 0 {
        let _ = writeln!(
            s,
            "warning: {} reads ran outside their domain",
            j.violations
        );
    }
    s
}
