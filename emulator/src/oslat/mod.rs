//! The oslat probe: a busy loop on each measured CPU that reads the TSC back to back and counts
//! every gap between two reads.
//!
//! It follows rt-tests' `oslat.c` step by step: each thread pins itself, sets `SCHED_FIFO` when
//! asked, says it has started and waits (sleeping) for the go; it warms up (oslat's "pre-heat",
//! so the CPU leaves its idle and low-frequency states: one second in `qpw-emu oslat`, on the
//! first CPU only with `-s`, the others sleeping meanwhile), meets the others at a start
//! barrier (spinning, so as not to sleep again), measures until told to stop, and meets them
//! again at an end barrier so that an early finisher does not disturb the rest by exiting.
//!
//! Between the pre-heat and the measuring, oslat's `-B` takes the smallest gap any thread saw
//! while warming up as the histogram's bias (its first bucket's origin), and `-w memmove`
//! copies a buffer between two readings of the counter, as oslat's workload does.
//!
//! Two additions of ours, both off unless asked for:
//!
//! - a **local operation** now and then ([`LocalOp`]): the probe calls the workload's
//!   process-context operation on its own CPU, as the kernel's isolated task does with an
//!   occasional system call, so that its per-CPU cache has something for the requester to
//!   drain; the operation's time lands in the gap that contains it, as it would in the kernel;
//! - the load (requester and process-context threads) is released only once every probe thread
//!   has passed the start barrier, so that no drain happens outside the measured window.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use qpw_core::{CpuSet, Qpw};
use qpw_workloads::Workload;

use crate::clock::Calibration;
use crate::hist::Histogram;
use crate::json::{
    Buckets, Envelope, Indexed, Micros, OslatBody, OslatThreadJson, QpwFields, ThreadFigures,
};
use crate::load::Phase;
use crate::progress::Progress;
use crate::threads;

mod thread;
use thread::thread_main;

/// The probe's local operation.
#[derive(Debug, Clone)]
pub struct LocalOp {
    /// The framework instance the workload was built on (the probe binds to it).
    pub qpw: Arc<Qpw>,
    /// The workload whose process-context operation the probe calls.
    pub workload: Arc<dyn Workload>,
    /// How often.
    pub every: Duration,
    /// Whether the probe polls its binding at every turn of its loop
    /// ([`Binding::poll`](qpw_core::Binding::poll)), as an owner's poll loop does to answer
    /// fenced-mode requesters between its operations (the default run's `fenced-poll-*`).
    pub polls: bool,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct OslatConfig {
    /// The measured CPUs, one thread each.
    pub cpus: CpuSet,
    /// How long to measure.
    pub duration: Duration,
    /// How long to spin before measuring (oslat's pre-heat).
    pub warmup: Duration,
    /// Pre-heat on the first CPU only (`-s`).
    pub single_preheat: bool,
    /// Start the buckets at the smallest pre-heat gap (`-B`).
    pub bias: bool,
    /// Copy a buffer of this many bytes between two readings (`-w memmove -m SIZE`).
    pub memmove_bytes: Option<usize>,
    /// Where the main thread waits (oslat's `-C`); `None`: any allowed CPU but the measured
    /// ones.
    pub main_cpus: Option<CpuSet>,
    /// Buckets (`-b`).
    pub bucket_size: usize,
    /// Bucket width in nanoseconds (`-W`).
    pub bucket_width_ns: u64,
    /// `SCHED_FIFO` priority (`-f`).
    pub rtprio: Option<i32>,
    /// Stop when a gap reaches this many nanoseconds (`-T`, given in microseconds).
    pub trace_threshold_ns: Option<u64>,
    /// The local operation, if any.
    pub local_op: Option<LocalOp>,
    /// oslat's lines at the start of the measuring, printed when every thread is past its
    /// pre-heat: `Global bias set to` (with `bias`) and, when this is set, `Test starts...`.
    /// So a `-T` trigger comes after them, as in oslat, which arms it only then.
    pub announce_start: bool,
    /// No progress display.
    pub quiet: bool,
    /// The progress label.
    pub label: String,
    /// Of a longer run this probe is part of: how much was done before it, and the whole
    /// run's length (`None`: the probe is the whole run).
    pub progress_span: Option<(Duration, Duration)>,
    /// Keep the counter readings around every gap at least this long (nanoseconds), for
    /// matching with a trace (`--trace`); `None`: keep none.
    pub gap_log_ns: Option<u64>,
}

/// The bucket width of a local operation's time: 1 ns, so that the median is read to the
/// nanosecond, not to a bucket's upper edge 10 ns away.
pub const OP_TIME_WIDTH_NS: u64 = 1;
/// Its buckets: 20 us; longer operations (preempted inside) are overflows.
pub const OP_TIME_BUCKETS: usize = 20_000;

/// A new, empty histogram of local-operation times.
pub fn op_time_hist() -> Histogram {
    Histogram::new(OP_TIME_BUCKETS, OP_TIME_WIDTH_NS)
}

/// The most gaps a thread keeps for attribution (16 bytes each); more are counted, not kept.
pub const GAP_LOG_CAPACITY: usize = 1 << 18;

/// One measured CPU's result.
#[derive(Debug, Clone)]
pub struct OslatThread {
    /// The CPU.
    pub cpu: usize,
    /// Every gap, in nanoseconds.
    pub hist: Histogram,
    /// The gaps that contained the probe's own local operation (also in `hist`).
    pub op_hist: Histogram,
    /// How long the thread measured, by its own counter, in seconds.
    pub duration_s: f64,
    /// Local operations done.
    pub local_ops: u64,
    /// How long each local operation took, from just before the call to just after it
    /// (the owner's cost: the workload's operation under its CPU's lock), in
    /// [`OP_TIME_WIDTH_NS`] buckets.
    pub op_time: Histogram,
    /// Local operations that failed, with the first error.
    pub local_op_errors: u64,
    /// The first local-operation error, in words.
    pub first_error: Option<String>,
    /// The probe thread's id (its pid in traces).
    pub tid: i32,
    /// The probe thread's involuntary context switches over the measuring window: how often
    /// something of this machine preempted it.
    pub involuntary_switches: u64,
    /// The probe thread's voluntary context switches while measuring: it slept (waiting for
    /// its CPU's lock, which a drain held), which a preemption count does not show.
    pub voluntary_switches: u64,
    /// With [`OslatConfig::gap_log_ns`]: each long gap's counter readings (before, after).
    pub gaps: Vec<(u64, u64)>,
    /// Long gaps past [`GAP_LOG_CAPACITY`], counted but not kept.
    pub gaps_not_kept: u64,
    /// The measuring window, in counter readings (first, last), which a trace shares.
    pub window: (u64, u64),
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct OslatRun {
    /// One result per CPU, in CPU order.
    pub threads: Vec<OslatThread>,
    /// The counter's calibration.
    pub calibration: Calibration,
    /// The CPU and gap that crossed the trace threshold, if one did: the gap in whole
    /// microseconds as oslat rounds it (the upper edge of its 1 us slot).
    pub threshold_hit: Option<(usize, u64)>,
    /// The bias (`-B`) in nanoseconds: the first bucket's origin.
    pub bias_ns: Option<u64>,
    /// Whether SIGINT cut the run short.
    pub interrupted: bool,
    /// Setup steps that failed inside the threads.
    pub warnings: Vec<String>,
}

impl OslatRun {
    /// Exact figures per measured CPU, for the JSON.
    pub fn figures(&self) -> Vec<ThreadFigures> {
        self.threads
            .iter()
            .map(|t| {
                ThreadFigures::of(t.cpu, &t.hist, t.local_ops, t.local_op_errors)
                    .with_op_time(&t.op_time)
            })
            .collect()
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

/// What the main thread and the probe threads share: the barriers' counts and flags, and what
/// the threads hand back besides their results.
struct Control {
    started: AtomicUsize,
    go: AtomicBool,
    /// Set once the (single) pre-heat is done, for the threads that did not pre-heat.
    preheated: AtomicBool,
    /// The smallest pre-heat gap, in nanoseconds, over the threads.
    preheat_min_ns: AtomicU64,
    running: AtomicUsize,
    stop: AtomicBool,
    finished: AtomicUsize,
    n: usize,
    threshold_hit: Mutex<Option<(usize, u64)>>,
    warnings: Mutex<Vec<String>>,
}

impl Control {
    /// The shared state of `n` threads before any has started.
    fn new(n: usize) -> Control {
        Control {
            started: AtomicUsize::new(0),
            go: AtomicBool::new(false),
            preheated: AtomicBool::new(false),
            preheat_min_ns: AtomicU64::new(u64::MAX),
            running: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            finished: AtomicUsize::new(0),
            n,
            threshold_hit: Mutex::new(None),
            warnings: Mutex::new(Vec::new()),
        }
    }
}

/// A probe thread's handle: its result once joined.
type ProbeHandle = std::thread::JoinHandle<Result<OslatThread>>;

/// Runs the probe; `phase` (the load's) goes once every thread is measuring and stops when the
/// measuring stops.
pub fn run(cfg: &OslatConfig, calibration: Calibration, phase: &Arc<Phase>) -> Result<OslatRun> {
    let n = cfg.cpus.len();
    if n == 0 {
        return Err(anyhow!("no CPU to measure"));
    }
    let mut ignored = crate::sink::Sink::new(true);
    let _away = match &cfg.main_cpus {
        Some(main) => crate::rt::AwayFrom::onto(main, &mut ignored),
        None => crate::rt::AwayFrom::cpus(&cfg.cpus),
    };
    let ctl = Arc::new(Control::new(n));
    let handles = start_threads(cfg, calibration, &ctl)?;
    // Wait until every thread has pinned itself, then let them go.
    threads::wait_for(&ctl.started, n, &handles);
    ctl.go.store(true, Ordering::SeqCst);
    // Release the load once every thread measures.
    threads::wait_for(&ctl.running, n, &handles);
    announce_start(cfg, &ctl);
    phase.go();
    let interrupted = measure(cfg, &ctl, &handles, phase);
    let threads = threads::join_all(handles, "a probe thread panicked")?;
    Ok(collect(cfg, &ctl, threads, calibration, interrupted))
}

/// Starts one probe thread per measured CPU, in CPU order. A thread that fails lets the others
/// past both barriers; a thread that cannot be started stops those already running.
fn start_threads(
    cfg: &OslatConfig,
    calibration: Calibration,
    ctl: &Arc<Control>,
) -> Result<Vec<ProbeHandle>> {
    let mut handles = Vec::with_capacity(ctl.n);
    for (index, cpu) in cfg.cpus.iter().enumerate() {
        let (cfg, tctl) = (cfg.clone(), ctl.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("oslat/{cpu}"))
            .spawn(move || {
                let preheats = index == 0 || !cfg.single_preheat;
                let result = thread_main(cpu, preheats, &cfg, calibration, &tctl);
                if result.is_err() {
                    // Let the others past both barriers.
                    tctl.stop.store(true, Ordering::SeqCst);
                    tctl.preheated.store(true, Ordering::SeqCst);
                    tctl.finished.fetch_add(1, Ordering::SeqCst);
                    crate::signals::wake();
                }
                result
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                ctl.stop.store(true, Ordering::SeqCst);
                ctl.go.store(true, Ordering::SeqCst);
                return Err(e).context(format!("cannot start the probe thread for cpu {cpu}"));
            }
        }
    }
    Ok(handles)
}

/// Prints oslat's lines at the start of the measuring, once every thread is past its pre-heat:
/// `Global bias set to` with `-B`, and `Test starts...` when asked; then flushes them, so that
/// they come before anything a `-T` trigger prints.
fn announce_start(cfg: &OslatConfig, ctl: &Control) {
    if cfg.bias {
        let min = ctl.preheat_min_ns.load(Ordering::SeqCst);
        let w = cfg.bucket_width_ns.max(1);
        if min != u64::MAX {
            println!("Global bias set to {} (us)", (min / w + 1) * w / 1000);
        }
    }
    if cfg.announce_start {
        println!("Test starts...");
    }
    if cfg.bias || cfg.announce_start {
        use std::io::Write as _;
        crate::out::check_stdout(std::io::stdout().flush());
    }
}

/// Lets the threads measure for the run's duration with the progress line, and stops them and
/// `phase`; returns whether SIGINT cut the run short.
fn measure(cfg: &OslatConfig, ctl: &Control, handles: &[ProbeHandle], phase: &Phase) -> bool {
    // No progress line when the main thread shares a measured CPU: redrawing it would disturb
    // the measuring.
    let shares = qpw_core::current_affinity()
        .map(|a| !a.intersection(&cfg.cpus).is_empty())
        .unwrap_or(true);
    let quiet = cfg.quiet || shares;
    let progress = match cfg.progress_span {
        Some((done, total)) => Progress::part(&cfg.label, done, total, quiet),
        None => Progress::new(&cfg.label, cfg.duration, quiet),
    };
    // A thread that ended early failed: stop measuring.
    let thread_ended = || handles.iter().any(|h| h.is_finished());
    threads::measure_for(
        Some(cfg.duration),
        &ctl.stop,
        thread_ended,
        &progress,
        phase,
    )
}

/// The run, from the joined threads' results and what they left in `ctl`.
fn collect(
    cfg: &OslatConfig,
    ctl: &Control,
    threads: Vec<OslatThread>,
    calibration: Calibration,
    interrupted: bool,
) -> OslatRun {
    let threshold_hit = *ctl.threshold_hit.lock().unwrap_or_else(|e| e.into_inner());
    let warnings = std::mem::take(&mut *ctl.warnings.lock().unwrap_or_else(|e| e.into_inner()));
    let bias_ns = cfg
        .bias
        .then(|| threads.first().map(|t| t.hist.origin_ns()))
        .flatten();
    OslatRun {
        threads,
        calibration,
        threshold_hit,
        bias_ns,
        interrupted,
        warnings,
    }
}
