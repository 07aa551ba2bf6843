//! The cyclictest probe: threads that sleep to an absolute deadline and measure how late they
//! wake.
//!
//! As rt-tests' `cyclictest.c` does it: each thread pins itself, takes its `SCHED_FIFO`
//! priority, reads `CLOCK_MONOTONIC`, and then loops: deadline += interval,
//! `clock_nanosleep(TIMER_ABSTIME)` to it, read the clock, latency = now - deadline. When a
//! wake-up comes later than the *next* deadline (an overrun), the deadline is moved forward by
//! whole intervals until it is in the future again, so that one long stall counts once instead
//! of as a burst of zero-sleep cycles. Latencies are whole microseconds (cyclictest's
//! `calcdiff()` divides by 1000), counted in 1 us buckets; those past the histogram count only
//! in `cycles`, min, max and the average, as in cyclictest.
//!
//! With a workload, each thread also does the workload's process-context operation on its CPU
//! every so many wake-ups (our addition, as in the oslat probe).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::clock::{monotonic_ns, sleep_until_ns};
use crate::hist::Histogram;
use crate::json::ThreadFigures;
use crate::load::Phase;
use crate::oslat::LocalOp;
use crate::progress::Progress;
use crate::threads;

/// What to measure.
#[derive(Debug, Clone)]
pub struct CyclicConfig {
    /// The CPU of each thread.
    pub thread_cpus: Vec<usize>,
    /// The wake-up interval.
    pub interval: Duration,
    /// How long to measure.
    pub duration: Duration,
    /// `SCHED_FIFO` priority, if any.
    pub prio: Option<i32>,
    /// 1 us buckets kept (at least 1).
    pub hist_buckets: usize,
    /// Stop when a latency exceeds this many microseconds (`-b`).
    pub breaktrace_us: Option<u64>,
    /// The local operation, if any.
    pub local_op: Option<LocalOp>,
    /// No progress display.
    pub quiet: bool,
    /// The progress label.
    pub label: String,
    /// Keep the counter readings of every wake-up at least this late (nanoseconds), for
    /// matching with a trace (`--trace`), with the counter's calibration; `None`: keep none.
    pub late_log: Option<(u64, crate::clock::Calibration)>,
}

/// One thread's result.
#[derive(Debug, Clone)]
pub struct CyclicThread {
    /// The CPU.
    pub cpu: usize,
    /// Latencies in nanoseconds, whole microseconds wide buckets.
    pub hist: Histogram,
    /// Wake-ups measured.
    pub cycles: u64,
    /// Sum of whole-microsecond latencies, for cyclictest's average.
    pub sum_us: u64,
    /// Smallest and largest whole-microsecond latency.
    pub min_us: u64,
    /// Largest whole-microsecond latency.
    pub max_us: u64,
    /// Wake-ups that came after the following deadline.
    pub overruns: u64,
    /// Local operations done.
    pub local_ops: u64,
    /// Local operations that failed.
    pub local_op_errors: u64,
    /// The thread's id (its pid in traces).
    pub tid: i32,
    /// With [`CyclicConfig::late_log`]: each late wake-up as counter readings (deadline,
    /// wake-up).
    pub late: Vec<(u64, u64)>,
    /// Late wake-ups past the log's capacity, counted but not kept.
    pub late_not_kept: u64,
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct CyclicRun {
    /// One result per thread.
    pub threads: Vec<CyclicThread>,
    /// The thread and latency (us) that crossed `-b`, if one did.
    pub break_hit: Option<(usize, u64)>,
    /// Whether SIGINT cut the run short.
    pub interrupted: bool,
    /// Setup steps that failed inside the threads.
    pub warnings: Vec<String>,
}

impl CyclicRun {
    /// Exact figures per thread, for the JSON.
    pub fn figures(&self) -> Vec<ThreadFigures> {
        self.threads
            .iter()
            .map(|t| ThreadFigures::of(t.cpu, &t.hist, t.local_ops, t.local_op_errors))
            .collect()
    }
}

struct Control {
    started: AtomicUsize,
    go: AtomicBool,
    stop: AtomicBool,
    break_hit: Mutex<Option<(usize, u64)>>,
    warnings: Mutex<Vec<String>>,
}

/// Runs the probe; `phase` goes when every thread has started and stops with it.
pub fn run(cfg: &CyclicConfig, phase: &Arc<Phase>) -> Result<CyclicRun> {
    let n = cfg.thread_cpus.len();
    let _away = crate::rt::AwayFrom::cpus(&cfg.thread_cpus.iter().copied().collect());
    let ctl = Arc::new(Control {
        started: AtomicUsize::new(0),
        go: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        break_hit: Mutex::new(None),
        warnings: Mutex::new(Vec::new()),
    });
    let mut handles = Vec::with_capacity(n);
    for (i, &cpu) in cfg.thread_cpus.iter().enumerate() {
        let (cfg, ctl) = (cfg.clone(), ctl.clone());
        let h = std::thread::Builder::new()
            .name(format!("cyclictest/{i}"))
            .spawn(move || {
                let r = thread_main(i, cpu, &cfg, &ctl);
                if r.is_err() {
                    ctl.stop.store(true, Ordering::SeqCst);
                }
                r
            })
            .with_context(|| format!("cannot start cyclictest thread {i} (cpu {cpu})"))?;
        handles.push(h);
    }
    threads::wait_for(&ctl.started, n, &handles);
    ctl.go.store(true, Ordering::SeqCst);
    phase.go();
    let progress = Progress::new(&cfg.label, cfg.duration, cfg.quiet);
    let interrupted = threads::measure_for(cfg.duration, &ctl.stop, || false, &progress, phase);
    let threads = threads::join_all(handles, "a cyclictest thread panicked")?;
    let break_hit = *ctl.break_hit.lock().unwrap_or_else(|e| e.into_inner());
    let warnings = std::mem::take(&mut *ctl.warnings.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(CyclicRun {
        threads,
        break_hit,
        interrupted,
        warnings,
    })
}

fn thread_main(
    index: usize,
    cpu: usize,
    cfg: &CyclicConfig,
    ctl: &Control,
) -> Result<CyclicThread> {
    let _binding = crate::rt::enter_probe_cpu(
        cfg.local_op.as_ref().map(|op| &*op.qpw),
        cpu,
        cfg.prio,
        &format!("cyclictest thread {index}"),
        &ctl.warnings,
    )?;
    let mut t = CyclicThread {
        cpu,
        hist: Histogram::new(cfg.hist_buckets.max(1), 1000),
        cycles: 0,
        sum_us: 0,
        min_us: u64::MAX,
        max_us: 0,
        overruns: 0,
        local_ops: 0,
        local_op_errors: 0,
        // SAFETY: `gettid` has no preconditions.
        tid: unsafe { libc::gettid() },
        late: Vec::new(),
        late_not_kept: 0,
    };
    if cfg.late_log.is_some() {
        t.late
            .try_reserve_exact(crate::oslat::GAP_LOG_CAPACITY)
            .map_err(|e| anyhow::anyhow!("cannot set aside the late wake-up log: {e}"))?;
    }
    let interval = cfg.interval.as_nanos() as u64;
    let op_every = cfg.local_op.as_ref().map(|op| {
        let per = op.every.as_nanos() as u64 / interval.max(1);
        per.max(1)
    });
    ctl.started.fetch_add(1, Ordering::SeqCst);
    while !ctl.go.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }

    let mut next = monotonic_ns() + interval;
    while !ctl.stop.load(Ordering::Relaxed) {
        sleep_until_ns(next);
        let now = monotonic_ns();
        let lat_ns = now.saturating_sub(next);
        let lat_us = lat_ns / 1000;
        t.cycles += 1;
        t.sum_us += lat_us;
        t.min_us = t.min_us.min(lat_us);
        t.max_us = t.max_us.max(lat_us);
        // Whole microseconds, as cyclictest buckets them.
        t.hist.record(lat_us * 1000);
        if let Some((from_ns, cal)) = cfg.late_log {
            if lat_ns >= from_ns {
                let woke = crate::clock::ticks();
                if t.late.len() < crate::oslat::GAP_LOG_CAPACITY {
                    t.late
                        .push((woke.saturating_sub(cal.from_ns(lat_ns)), woke));
                } else {
                    t.late_not_kept += 1;
                }
            }
        }
        if cfg.breaktrace_us.is_some_and(|b| lat_us > b) {
            let mut hit = ctl.break_hit.lock().unwrap_or_else(|e| e.into_inner());
            hit.get_or_insert((index, lat_us));
            ctl.stop.store(true, Ordering::SeqCst);
            break;
        }
        if let (Some(op), Some(every)) = (&cfg.local_op, op_every) {
            if t.cycles % every == 0 {
                match op.workload.process_op() {
                    Ok(()) => t.local_ops += 1,
                    Err(_) => t.local_op_errors += 1,
                }
            }
        }
        next += interval;
        // An overrun: move the deadline past now by whole intervals.
        if now > next {
            t.overruns += 1;
            while now > next {
                next += interval;
            }
        }
    }
    if t.cycles == 0 {
        t.min_us = 0;
    }
    Ok(t)
}
