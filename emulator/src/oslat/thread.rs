//! One measuring thread of the oslat probe, as oslat's `thread_main`: pinned, at its priority,
//! it meets the others at the start, reads the TSC back to back and counts every gap until the
//! run ends, then meets them at the end.
//!
//! The thread's set-up ([`Probe::new`]) and its start ([`Probe::meet_at_start`]: the go, the
//! pre-heat, the start barrier, the bias) are their own functions. The measuring loop
//! ([`Probe::measure`]) is inlined into the thread and copies what it reads into locals
//! before its first reading, so that nothing stands between two readings of the counter but
//! the bookkeeping of a gap and, now and then, the workload's operation, as in oslat.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{anyhow, Result};
use qpw_workloads::Workload;

use super::{op_time_hist, Control, OslatConfig, OslatThread, GAP_LOG_CAPACITY};
use crate::clock::{ticks, Calibration};
use crate::hist::Histogram;

/// One measuring thread, as oslat's: pinned, at its priority, it meets the others at the
/// start, reads the TSC back to back and counts every gap until the run ends, then meets them
/// at the end.
pub(super) fn thread_main(
    cpu: usize,
    preheats: bool,
    cfg: &OslatConfig,
    cal: Calibration,
    ctl: &Control,
) -> Result<OslatThread> {
    // Pin (and, with a workload, register with its instance so the local lock knows our CPU).
    let binding = crate::rt::enter_probe_cpu(
        cfg.local_op.as_ref().map(|op| &*op.qpw),
        cpu,
        cfg.rtprio,
        "the probe",
        &ctl.warnings,
    )?;
    let mut probe = Probe::new(cpu, cfg, cal)?;
    // SAFETY: `gettid` has no preconditions.
    let tid = unsafe { libc::gettid() };
    probe.meet_at_start(preheats, ctl);
    // An owner's poll loop answers the requesters that called its CPU between its readings.
    let poller = binding
        .as_ref()
        .filter(|_| cfg.local_op.as_ref().is_some_and(|op| op.polls));

    let switches_at_start = crate::threads::context_switches();
    let window = probe.measure(ctl, poller);
    let switches_at_end = crate::threads::context_switches();
    let switches = (
        switches_at_end.0.saturating_sub(switches_at_start.0),
        switches_at_end.1.saturating_sub(switches_at_start.1),
    );

    // End barrier: exiting now could disturb the others.
    ctl.finished.fetch_add(1, Ordering::SeqCst);
    spin_until(&ctl.finished, ctl.n, None);
    Ok(probe.result(tid, window, switches))
}

/// What one measuring thread holds: its histograms, its workload and its gap log, set up
/// before the start so that the measuring allocates nothing.
struct Probe<'a> {
    cpu: usize,
    cfg: &'a OslatConfig,
    cal: Calibration,
    /// Every gap.
    hist: Histogram,
    /// The gaps that contain the probe's own operation.
    op_hist: Histogram,
    /// `-T`, in counter ticks.
    threshold: Option<u64>,
    /// oslat's memmove workload: two buffers of the thread's own, copied between readings
    /// (empty without it).
    src: Vec<u8>,
    dst: Vec<u8>,
    memmove: bool,
    /// The local operation and its period in ticks (`u64::MAX` without one).
    op: Option<&'a dyn Workload>,
    every: u64,
    ops: LocalOps,
    /// The shortest gap the log keeps, in ticks (`u64::MAX`: none).
    log_from: u64,
    gaps: Vec<(u64, u64)>,
    /// Long gaps past [`GAP_LOG_CAPACITY`], counted but not kept.
    gaps_not_kept: u64,
}

impl<'a> Probe<'a> {
    /// The thread's set-up for `cpu`: its histograms, buffers, operation and gap log.
    fn new(cpu: usize, cfg: &'a OslatConfig, cal: Calibration) -> Result<Self> {
        let (src, dst) = match cfg.memmove_bytes {
            Some(n) => (vec![0u8; n], vec![0u8; n]),
            None => (Vec::new(), Vec::new()),
        };
        let (op, every) = match &cfg.local_op {
            Some(op) => (
                Some(&*op.workload),
                cal.from_ns(op.every.as_nanos() as u64).max(1),
            ),
            None => (None, u64::MAX),
        };
        Ok(Self {
            cpu,
            cfg,
            cal,
            hist: Histogram::new(cfg.bucket_size, cfg.bucket_width_ns),
            op_hist: Histogram::new(cfg.bucket_size, cfg.bucket_width_ns),
            threshold: cfg.trace_threshold_ns.map(|ns| cal.from_ns(ns)),
            src,
            dst,
            memmove: cfg.memmove_bytes.is_some(),
            op,
            every,
            ops: LocalOps::new(),
            log_from: cfg.gap_log_ns.map_or(u64::MAX, |ns| cal.from_ns(ns).max(1)),
            gaps: gap_log(cfg, cpu)?,
            gaps_not_kept: 0,
        })
    }

    /// oslat's start: say the thread has started and wait (sleeping) for the go; warm up, or
    /// sleep while the single pre-heat runs; meet the others at the start barrier (spinning,
    /// so as not to sleep again); and take the bias.
    fn meet_at_start(&mut self, preheats: bool, ctl: &Control) {
        // Don't bash the CPU until everyone has started.
        ctl.started.fetch_add(1, Ordering::SeqCst);
        sleep_until(&ctl.go);

        // Warm up: the same loop, nothing kept but the smallest gap (for the bias). With a
        // single pre-heat thread, the others sleep until it is done, as oslat runs only one.
        if preheats {
            let memmove = self.memmove.then_some((&mut self.dst[..], &self.src[..]));
            preheat(self.cfg, self.cal, ctl, memmove, &mut self.hist);
        } else {
            sleep_until(&ctl.preheated);
        }

        // Start barrier.
        ctl.running.fetch_add(1, Ordering::SeqCst);
        spin_until(&ctl.running, ctl.n, Some(&ctl.stop));
        if self.cfg.bias {
            if let Some((hist, op_hist)) = biased(self.cfg, ctl) {
                (self.hist, self.op_hist) = (hist, op_hist);
            }
        }
    }

    /// The measuring: reads the counter back to back until told to stop (or until a gap
    /// crosses `-T`), counting every gap; returns the first and last readings.
    ///
    /// Inlined, with what it reads copied into locals first, so that the loop compiles as it
    /// would written out in the thread (`oslat.c`'s `doit` loop with our additions).
    #[inline(always)]
    fn measure(&mut self, ctl: &Control, poller: Option<&qpw_core::Binding>) -> (u64, u64) {
        let Self {
            cpu,
            cal,
            threshold,
            memmove,
            op,
            every,
            log_from,
            ..
        } = *self;
        let Self {
            hist,
            op_hist,
            src,
            dst,
            ops,
            gaps,
            ..
        } = self;
        // Keep the source buffer alive and unknown to the optimiser.
        std::hint::black_box(&mut *src);
        let mut gaps_not_kept = 0u64;

        let start = ticks();
        let mut next_op = start.saturating_add(every);
        let mut prev = start;
        let mut op_in_gap = false;
        loop {
            if memmove {
                copy(dst, src);
            }
            let now = ticks();
            let gap = now - prev;
            hist.record(cal.to_ns(gap));
            // The gaps that contain the probe's own operation, apart: they tell the time the
            // operation itself took (waiting for its lock) from time taken away by others.
            if op_in_gap {
                op_hist.record(cal.to_ns(gap));
                op_in_gap = false;
            }
            if gap >= log_from {
                if gaps.len() < GAP_LOG_CAPACITY {
                    gaps.push((prev, now));
                } else {
                    gaps_not_kept += 1;
                }
            }
            prev = now;
            // An owner's poll loop answers the requesters that called its CPU (one load when
            // none has).
            if let Some(binding) = poller {
                binding.poll();
            }
            if threshold.is_some_and(|t| gap >= t) {
                threshold_crossed(cpu, cal.to_ns(gap), ctl);
                break;
            }
            if now >= next_op {
                if let Some(w) = op {
                    op_in_gap = true;
                    ops.run(w, cal);
                }
                next_op = now.saturating_add(every);
            }
            if ctl.stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let stop = ticks();
        self.gaps_not_kept = gaps_not_kept;
        (start, stop)
    }

    /// The thread's result, from its measuring `window` (first and last readings) and its
    /// `(voluntary, involuntary)` context switches over it.
    fn result(self, tid: i32, window: (u64, u64), switches: (u64, u64)) -> OslatThread {
        OslatThread {
            cpu: self.cpu,
            hist: self.hist,
            op_hist: self.op_hist,
            duration_s: self.cal.to_ns(window.1 - window.0) as f64 / 1e9,
            local_ops: self.ops.done,
            op_time: self.ops.time,
            local_op_errors: self.ops.errors,
            first_error: self.ops.first_error,
            tid,
            voluntary_switches: switches.0,
            involuntary_switches: switches.1,
            gaps: self.gaps,
            gaps_not_kept: self.gaps_not_kept,
            window,
        }
    }
}

/// Waits, sleeping a millisecond at a time, until `flag` is set (the start, the pre-heat).
fn sleep_until(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Spins until `count` reaches `n` (a barrier), or until `stop` is set when given.
fn spin_until(count: &AtomicUsize, n: usize, stop: Option<&AtomicBool>) {
    while count.load(Ordering::SeqCst) < n && !stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
        std::hint::spin_loop();
    }
}

/// The gap log of `cpu`'s thread, set aside before the run (empty without `--trace`).
fn gap_log(cfg: &OslatConfig, cpu: usize) -> Result<Vec<(u64, u64)>> {
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    if cfg.gap_log_ns.is_some() {
        gaps.try_reserve_exact(GAP_LOG_CAPACITY).map_err(|e| {
            anyhow!("cannot set aside the gap log for cpu {cpu} ({GAP_LOG_CAPACITY} gaps): {e}")
        })?;
    }
    Ok(gaps)
}

/// The pre-heat: the measuring loop for `cfg.warmup` (with the memmove workload's buffers, if
/// any), its smallest gap kept for the bias, nothing else; then the other threads may go.
fn preheat(
    cfg: &OslatConfig,
    cal: Calibration,
    ctl: &Control,
    mut memmove: Option<(&mut [u8], &[u8])>,
    hist: &mut Histogram,
) {
    let warm_end = ticks() + cal.from_ns(cfg.warmup.as_nanos() as u64);
    let mut prev = ticks();
    while prev < warm_end && !ctl.stop.load(Ordering::Relaxed) {
        if let Some((dst, src)) = &mut memmove {
            copy(dst, src);
        }
        let now = ticks();
        hist.record(cal.to_ns(now - prev));
        prev = now;
    }
    ctl.preheat_min_ns
        .fetch_min(hist.min_ns(), Ordering::SeqCst);
    hist.clear();
    ctl.preheated.store(true, Ordering::SeqCst);
}

/// oslat's bias: the histograms with their origin at the smallest pre-heat gap in its whole
/// microseconds (the upper edge of its slot), in bucket widths here; `None` without a
/// pre-heat gap.
fn biased(cfg: &OslatConfig, ctl: &Control) -> Option<(Histogram, Histogram)> {
    let min = ctl.preheat_min_ns.load(Ordering::SeqCst);
    let w = cfg.bucket_width_ns;
    (min != u64::MAX).then(|| {
        let origin = (min / w + 1) * w;
        (
            Histogram::new(cfg.bucket_size, w).with_origin(origin),
            Histogram::new(cfg.bucket_size, w).with_origin(origin),
        )
    })
}

/// The probe's own local operations: done, failed (with the first failure's message), and
/// each one's time.
struct LocalOps {
    done: u64,
    errors: u64,
    first_error: Option<String>,
    time: Histogram,
}

impl LocalOps {
    fn new() -> Self {
        Self {
            done: 0,
            errors: 0,
            first_error: None,
            time: op_time_hist(),
        }
    }

    /// Does one operation, timed from just before it: the gap's bookkeeping (histogram
    /// updates, the gap log) is the probe's, not the owner's cost.
    #[inline]
    fn run(&mut self, w: &dyn Workload, cal: Calibration) {
        let began = ticks();
        let result = w.process_op();
        self.time.record(cal.to_ns(ticks().saturating_sub(began)));
        match result {
            Ok(()) => self.done += 1,
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// oslat's workload step: one `memmove` of the thread's buffer.
#[inline]
fn copy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(std::hint::black_box(src));
    std::hint::black_box(dst);
}

#[cold]
fn threshold_crossed(cpu: usize, ns: u64, ctl: &Control) {
    let mut hit = ctl.threshold_hit.lock().unwrap_or_else(|e| e.into_inner());
    if hit.is_none() {
        // oslat's rounding: the upper edge of the gap's 1 us slot.
        *hit = Some((cpu, ns / 1000 + 1));
    }
    ctl.stop.store(true, Ordering::SeqCst);
    crate::signals::wake();
}
