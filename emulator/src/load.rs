//! The load around a probe: a **requester** that drains every CPU's cache at a fixed rate (the
//! kernel's `lru_add_drain_all`, `drain_all_stock`, `flush_all` callers) and **process-context
//! threads** that use the per-CPU caches on their own CPUs.
//!
//! The requester is paced like cyclictest: it sleeps to an absolute deadline, drains, and when
//! a drain overran one or more periods it skips the missed slots (and counts them) rather than
//! firing a burst. Each drain is timed from the requester's side: in queue mode that includes
//! waiting for the target CPU's worker to get the CPU; in remote mode it is the time to take
//! each CPU's lock and do the work. A drain whose queued work did not finish within the timeout,
//! or that waited the stall threshold or longer (100 ms by default, well under RT throttling's
//! period, which lets a starved worker in after 0.95 s: see [`crate::throttling`]), is a
//! *stall*; the report lists how long each one waited.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use qpw_core::{CpuSet, Qpw};
use qpw_workloads::Workload;

use crate::clock::{monotonic_ns, sleep_until_ns};
use crate::hist::Percentiles;

/// Where a run is: the probe's start and end barriers move every load thread along.
#[derive(Debug, Default)]
pub struct Phase(AtomicU8);

impl Phase {
    const WAIT: u8 = 0;
    const GO: u8 = 1;
    const STOP: u8 = 2;

    /// Starts everyone waiting on this phase.
    pub fn go(&self) {
        self.0.store(Self::GO, Ordering::SeqCst);
    }

    /// Tells everyone to stop.
    pub fn stop(&self) {
        self.0.store(Self::STOP, Ordering::SeqCst);
    }

    /// Whether the run is over.
    #[inline]
    pub fn stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Self::STOP
    }

    /// Waits (sleeping, 1 ms at a time, as oslat's threads wait for GO) until the run starts;
    /// false if it was stopped first.
    pub fn wait_go(&self) -> bool {
        loop {
            match self.0.load(Ordering::SeqCst) {
                Self::WAIT => std::thread::sleep(Duration::from_millis(1)),
                Self::GO => return true,
                _ => return false,
            }
        }
    }
}

/// What the load does.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The requester's CPU (a housekeeping CPU).
    pub requester_cpu: usize,
    /// Drains per second (0: no requester).
    pub drain_rate_hz: f64,
    /// Forced drains reach every CPU even when its cache is empty.
    pub force: bool,
    /// How long a drain waits for queued work before it gives up (and counts a stall).
    pub timeout: Duration,
    /// A drain that takes at least this long counts as a stall too.
    pub stall_threshold: Duration,
    /// The CPUs that run a process-context thread (empty: none).
    pub load_cpus: CpuSet,
    /// Operations per burst of a process-context thread.
    pub burst: u32,
    /// Pause between bursts.
    pub pause: Duration,
    /// `SCHED_FIFO` priority for the requester, if any.
    pub requester_prio: Option<i32>,
}

/// The requester's drain times: an HDR histogram of nanoseconds, from 1 ns to an hour at
/// three significant digits (a 0.1 % error at any size), in a few kilobytes fixed up front.
#[derive(Debug, Clone)]
pub struct DrainTimes(hdrhistogram::Histogram<u64>);

impl Default for DrainTimes {
    fn default() -> Self {
        Self::new()
    }
}

impl DrainTimes {
    /// The longest drain kept as such: an hour; longer ones count at an hour.
    const MAX_NS: u64 = 3_600_000_000_000;

    /// An empty histogram.
    pub fn new() -> Self {
        let h = hdrhistogram::Histogram::new_with_bounds(1, Self::MAX_NS, 3)
            .expect("constant bounds are valid");
        Self(h)
    }

    /// Counts one drain of `ns`.
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.clamp(1, Self::MAX_NS));
    }

    /// Adds another run's drains.
    pub fn merge(&mut self, other: &DrainTimes) {
        // Both have the same bounds, so adding cannot fail; a failure would lose counts only.
        let _ = self.0.add(&other.0);
    }

    /// Drains counted.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// p50 ... p99.99 and the max, in microseconds.
    pub fn percentiles_us(&self) -> Percentiles {
        let q = |q: f64| self.0.value_at_quantile(q) as f64 / 1000.0;
        Percentiles {
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p99_9: q(0.999),
            p99_99: q(0.9999),
            max: self.0.max() as f64 / 1000.0,
            // hdrhistogram has no last bucket: every figure is within its precision.
            over_last_bucket: Vec::new(),
        }
    }

    /// The mean, in microseconds.
    pub fn mean_us(&self) -> f64 {
        self.0.mean() / 1000.0
    }

    /// The recorded values as (microseconds, count), in increasing order.
    pub fn buckets_us(&self) -> Vec<(f64, u64)> {
        self.0
            .iter_recorded()
            .map(|v| {
                (
                    self.0.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0,
                    v.count_at_value(),
                )
            })
            .collect()
    }
}

/// The most stall waits a [`RequesterReport`] lists.
pub const STALL_WAITS_KEPT: usize = 1000;

/// What the requester saw, for the report.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RequesterReport {
    /// The requester's CPU.
    pub cpu: usize,
    /// Drains asked for per second.
    pub rate_hz: f64,
    /// Whether drains were forced (reach every CPU even when empty).
    pub force: bool,
    /// The timeout after which queued work counts as stalled, in milliseconds.
    pub timeout_ms: u64,
    /// Drains done.
    pub drains: u64,
    /// Drains that stalled: some CPU's queued work did not finish within the timeout, or the
    /// drain took `stall_threshold_ms` or longer.
    pub stalls: u64,
    /// A drain that takes this long or longer counts as a stall, in milliseconds (0: only the
    /// timeout counts).
    #[serde(default)]
    pub stall_threshold_ms: u64,
    /// How long each stall waited, in milliseconds, in order (the first
    /// [`STALL_WAITS_KEPT`]; `stalls` counts them all).
    #[serde(default)]
    pub stall_waits_ms: Vec<f64>,
    /// Other drain errors (panics, refusals).
    pub errors: u64,
    /// The first error seen, in words.
    pub first_error: Option<String>,
    /// Drain slots skipped because an earlier drain overran its period.
    pub missed_deadlines: u64,
    /// CPU drains queued to a worker, summed over all drains.
    pub cpus_queued: u64,
    /// CPU drains run remotely by the requester, summed over all drains.
    pub cpus_remote: u64,
    /// CPUs left alone (empty caches), summed over all drains.
    pub cpus_skipped: u64,
    /// Drains that returned at once because another drain covered them.
    pub whole_skipped: u64,
    /// Fenced mode: the requester's flags on fenced-mode CPUs' locks that the owner's CPU
    /// answered (no fence, no interrupt there), over all drains.
    #[serde(default)]
    pub flags_answered: u64,
    /// Fenced mode: the flags settled by a `membarrier` fence of the owner's CPU (an
    /// interrupt there, when a thread of the process ran on it).
    #[serde(default)]
    pub flags_fenced: u64,
    /// Drain time percentiles, in microseconds.
    pub time_us: Percentiles,
    /// Exact mean drain time, in microseconds.
    pub avg_us: f64,
    /// Drain time histogram: the HDR histogram's non-zero buckets, keyed by their upper edge
    /// in microseconds (three significant digits).
    pub histogram_us: Vec<(f64, u64)>,
    /// kernel-pcp: who drained the measured CPU's pcp pages, and what was queued to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_pcp: Option<crate::kernel::pcp::PcpReport>,
}

impl RequesterReport {
    /// Fills in the drain-time figures from `hist`.
    pub fn set_times(&mut self, hist: &DrainTimes) {
        self.time_us = hist.percentiles_us();
        self.avg_us = hist.mean_us();
        self.histogram_us = hist.buckets_us();
    }

    /// Adds another run's counts; the caller then sets the times from the merged histogram.
    pub fn add_counts(&mut self, other: &RequesterReport) {
        self.drains += other.drains;
        self.stalls += other.stalls;
        let room = STALL_WAITS_KEPT.saturating_sub(self.stall_waits_ms.len());
        self.stall_waits_ms
            .extend(other.stall_waits_ms.iter().take(room));
        self.errors += other.errors;
        self.missed_deadlines += other.missed_deadlines;
        self.cpus_queued += other.cpus_queued;
        self.cpus_remote += other.cpus_remote;
        self.cpus_skipped += other.cpus_skipped;
        self.whole_skipped += other.whole_skipped;
        self.flags_answered += other.flags_answered;
        self.flags_fenced += other.flags_fenced;
        match (&mut self.kernel_pcp, &other.kernel_pcp) {
            (Some(mine), Some(theirs)) => mine.add(theirs),
            (None, Some(theirs)) => self.kernel_pcp = Some(theirs.clone()),
            _ => {}
        }
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }
}

/// What the process-context threads did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LoadReport {
    /// The CPUs that ran a process-context thread.
    pub cpus: String,
    /// Operations done.
    pub ops: u64,
    /// Operations that failed.
    pub errors: u64,
    /// The first error seen, in words.
    pub first_error: Option<String>,
}

/// The running load.
#[derive(Debug)]
pub struct Load {
    requester: Option<JoinHandle<Result<(RequesterReport, DrainTimes)>>>,
    workers: Vec<JoinHandle<(u64, u64, Option<String>)>>,
    load_cpus: CpuSet,
}

/// Starts the requester and the process-context threads; they wait for `phase` to go.
pub fn start(
    cfg: &LoadConfig,
    qpw: &Arc<Qpw>,
    workload: &Arc<dyn Workload>,
    phase: &Arc<Phase>,
) -> Result<Load> {
    let requester = if cfg.drain_rate_hz > 0.0 {
        let requester_cpu = cfg.requester_cpu;
        let (cfg, qpw, w, phase) = (cfg.clone(), qpw.clone(), workload.clone(), phase.clone());
        Some(
            std::thread::Builder::new()
                .name("qpw-requester".into())
                .spawn(move || requester(&cfg, &qpw, &*w, &phase))
                .with_context(|| {
                    format!("cannot start the requester thread (cpu {requester_cpu})")
                })?,
        )
    } else {
        None
    };
    let mut workers = Vec::new();
    for cpu in cfg.load_cpus.iter() {
        let (qpw, w, phase) = (qpw.clone(), workload.clone(), phase.clone());
        let (burst, pause) = (cfg.burst, cfg.pause);
        workers.push(
            std::thread::Builder::new()
                .name(format!("qpw-load/{cpu}"))
                .spawn(move || process_load(cpu, burst, pause, &qpw, &*w, &phase))
                .with_context(|| format!("cannot start the load thread for cpu {cpu}"))?,
        );
    }
    Ok(Load {
        requester,
        workers,
        load_cpus: cfg.load_cpus.clone(),
    })
}

impl Load {
    /// Waits for the threads (after the phase was stopped) and collects their figures: the
    /// requester's with its drain-time histogram, and the process-context load's.
    pub fn finish(self) -> Result<(Option<(RequesterReport, DrainTimes)>, LoadReport)> {
        let requester = match self.requester {
            Some(h) => Some(
                h.join()
                    .map_err(|_| anyhow!("the requester thread panicked"))??,
            ),
            None => None,
        };
        let mut load = LoadReport {
            cpus: self.load_cpus.to_string(),
            ..LoadReport::default()
        };
        for h in self.workers {
            let (ops, errors, first) = h.join().map_err(|_| anyhow!("a load thread panicked"))?;
            load.ops += ops;
            load.errors += errors;
            if load.first_error.is_none() {
                load.first_error = first;
            }
        }
        Ok((requester, load))
    }
}

fn requester(
    cfg: &LoadConfig,
    qpw: &Qpw,
    w: &dyn Workload,
    phase: &Phase,
) -> Result<(RequesterReport, DrainTimes)> {
    let _bound = qpw
        .bind_current(cfg.requester_cpu)
        .with_context(|| format!("cannot bind the requester to cpu {}", cfg.requester_cpu))?;
    if let Some(prio) = cfg.requester_prio {
        // A failure here is the same failure the probe reports; the requester carries on.
        let _ = crate::rt::set_fifo(prio);
    }
    let mut hist = DrainTimes::new();
    let mut report = RequesterReport {
        cpu: cfg.requester_cpu,
        rate_hz: cfg.drain_rate_hz,
        force: cfg.force,
        timeout_ms: cfg.timeout.as_millis() as u64,
        stall_threshold_ms: cfg.stall_threshold.as_millis() as u64,
        ..RequesterReport::default()
    };
    if !phase.wait_go() {
        return Ok((report, hist));
    }
    // Process-wide, but the requester is the only thread of ours that takes another CPU's
    // lock (the probe and the load threads are bound and take their own).
    let flags_before = qpw_core::fenced_lock::fence_counts();
    let missed = paced(cfg.drain_rate_hz, phase, || {
        let t0 = monotonic_ns();
        let out = w.drain(cfg.force, Some(cfg.timeout));
        let waited_ns = monotonic_ns() - t0;
        hist.record(waited_ns);
        report.drains += 1;
        report.cpus_queued += out.queued as u64;
        report.cpus_remote += out.ran_remote as u64;
        report.cpus_skipped += out.skipped_cpus as u64;
        report.whole_skipped += u64::from(out.skipped);
        let stalled = out.errors.iter().any(qpw_core::Error::is_stall);
        // A drain that gave up waiting, or waited past the threshold though it completed
        // (RT throttling let the starved worker in), stalled.
        if stalled || waited_ns >= cfg.stall_threshold.as_nanos() as u64 {
            report.stalls += 1;
            if report.stall_waits_ms.len() < STALL_WAITS_KEPT {
                report.stall_waits_ms.push(waited_ns as f64 / 1e6);
            }
        }
        if !stalled && !out.errors.is_empty() {
            report.errors += 1;
        }
        if report.first_error.is_none() {
            report.first_error = out.errors.first().map(ToString::to_string);
        }
    });
    report.missed_deadlines = missed;
    let flags = qpw_core::fenced_lock::fence_counts().since(&flags_before);
    (report.flags_answered, report.flags_fenced) = (flags.answered, flags.fenced);
    report.set_times(&hist);
    Ok((report, hist))
}

/// Calls `each` `rate_hz` times a second until `phase` stops, paced like cyclictest: it sleeps
/// to an absolute deadline, and after a call overran one or more periods it skips the missed
/// slots (and counts them) rather than firing a burst. Returns the slots skipped.
pub fn paced(rate_hz: f64, phase: &Phase, mut each: impl FnMut()) -> u64 {
    let period = (1e9 / rate_hz).max(1.0) as u64;
    let mut missed_slots = 0;
    let mut next = monotonic_ns();
    loop {
        next += period;
        // Sleep to the deadline in slices of at most 100 ms, so a stop is seen soon.
        while monotonic_ns() < next && !phase.stopped() {
            sleep_until_ns(next.min(monotonic_ns() + 100_000_000));
        }
        if phase.stopped() {
            return missed_slots;
        }
        // Catch up after an overrun: skip the slots already missed.
        let now = monotonic_ns();
        if now > next + period {
            let missed = (now - next) / period;
            missed_slots += missed;
            next += missed * period;
        }
        each();
    }
}

fn process_load(
    cpu: usize,
    burst: u32,
    pause: Duration,
    qpw: &Qpw,
    w: &dyn Workload,
    phase: &Phase,
) -> (u64, u64, Option<String>) {
    let _bound = match qpw.bind_current(cpu) {
        Ok(b) => b,
        Err(e) => {
            return (
                0,
                1,
                Some(format!("cannot bind a load thread to cpu {cpu}: {e}")),
            )
        }
    };
    let (mut ops, mut errors, mut first) = (0, 0, None);
    if !phase.wait_go() {
        return (ops, errors, first);
    }
    while !phase.stopped() {
        for _ in 0..burst {
            match w.process_op() {
                Ok(()) => ops += 1,
                Err(e) => {
                    errors += 1;
                    first.get_or_insert_with(|| e.to_string());
                }
            }
        }
        std::thread::sleep(pause);
    }
    (ops, errors, first)
}

#[cfg(test)]
mod tests {
    use super::DrainTimes;

    #[test]
    fn drain_times_keep_three_digits_and_merge() {
        let mut a = DrainTimes::new();
        for us in 1..=1000u64 {
            a.record(us * 1000);
        }
        let mut b = DrainTimes::new();
        b.record(5_000_000_000); // a 5 s stall
        a.merge(&b);
        assert_eq!(a.count(), 1001);
        let p = a.percentiles_us();
        // The 501st of 1001 drains, within 0.1 %.
        assert!((p.p50 - 501.0).abs() <= 0.501, "{p:?}");
        assert!((p.max - 5_000_000.0).abs() <= 5_000.0, "{p:?}");
        let buckets = a.buckets_us();
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 1001);
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
