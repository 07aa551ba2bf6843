//! The cyclictest probe: threads that sleep to a deadline and measure how late they wake, and
//! cyclictest's text output.
//!
//! As rt-tests' `cyclictest.c` (2.4) does it: each thread pins itself, takes its policy and
//! priority, reads the clock, and then loops: deadline += interval, sleep to it, read the clock,
//! latency = now - deadline, in whole microseconds (cyclictest's `calcdiff()` truncates) or, with
//! `-N`, nanoseconds. When a wake-up comes later than the *next* deadline, the deadline is moved
//! forward by whole intervals until it is in the future again, so that one long stall counts
//! once instead of as a burst of zero-sleep cycles. The sleep is `clock_nanosleep` to an
//! absolute deadline by default; `-r` sleeps for the interval instead, `-s` with `nanosleep()`,
//! and `-x` waits for a POSIX interval timer's signal with `sigwait()`.
//!
//! With `-h N` latencies of N units or more are *overflows*: counted in `cycles`, min, max and
//! the average, listed by cycle number (the first N of them), but in no bucket, as cyclictest
//! does; our own histogram keeps their exact values for the percentiles we add.
//!
//! The main thread reads each thread's live figures (atomics the thread updates after every
//! wake-up) to redraw cyclictest's status lines, answer `-F` readers and print `-v` values.
//!
//! The run ends within a bounded time whatever the intervals (`-i 10000000` sleeps 10 s): at
//! the end (`-D`, `-l`, `-b`, a signal) the main thread wakes every thread still asleep with
//! [`WAKE`], as cyclictest 2.4 signals its threads, again every 10 ms until each has ended, and
//! a thread woken so ends without counting the wake-up. `-D` is also timed by the main thread,
//! so that a thread asleep past it is woken then; and a signal during the set-up of many
//! threads (`-t 4096`) stops starting them.
//!
//! With a workload, each thread also does the workload's process-context operation on its CPU
//! every so many wake-ups (our addition, as in the oslat probe).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::clock::{clock_ns, sleep_for_ns, sleep_until_unless};
use crate::hist::Histogram;
use crate::json::ThreadFigures;
use crate::load::Phase;
use crate::oslat::LocalOp;
use crate::progress::Progress;
use crate::threads;

/// cyclictest's `VALBUF_SIZE`: the ring of recent values `-v` reads (a power of two).
const VALBUF: usize = 16384;

/// The signal that wakes a measuring thread from its sleep at the end of the run: a no-op
/// handler ([`on_wake`]), installed without `SA_RESTART`, makes `clock_nanosleep` and
/// `nanosleep` return `EINTR`; a `-x` thread blocks it and takes it in `sigwait` with its
/// timer's SIGALRM.
pub const WAKE: libc::c_int = libc::SIGUSR2;

/// How long past `-D` the main thread lets a thread end by itself (at its first wake-up after
/// the duration, as it counts its last sample) before it wakes it.
const END_GRACE_NS: u64 = 50_000_000;

extern "C" fn on_wake(_signal: libc::c_int) {}

/// Installs [`WAKE`]'s no-op handler (once per process).
fn install_wake() -> std::io::Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), i32>> = OnceLock::new();
    let done = INSTALLED.get_or_init(|| {
        // SAFETY: an all-zero sigaction is valid storage; the handler is an `extern "C"` fn
        // that does nothing (async-signal-safe); the mask is initialised before the call.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_wake as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(WAKE, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    done.map_err(std::io::Error::from_raw_os_error)
}

/// Wakes the threads of `handles` that have not ended with [`WAKE`], again every 10 ms until
/// each has ended (a signal that came just before a thread went to sleep is lost on it), for
/// at most 10 s (a thread stuck elsewhere is then left to the join).
fn wake_threads<T>(handles: &[std::thread::JoinHandle<T>]) {
    use std::os::unix::thread::JoinHandleExt as _;
    let start = Instant::now();
    while handles.iter().any(|h| !h.is_finished()) && start.elapsed() < Duration::from_secs(10) {
        for h in handles.iter().filter(|h| !h.is_finished()) {
            // SAFETY: the thread is joinable and not joined yet (its handle is here), so its
            // pthread_t is valid even if it has just ended; WAKE has a handler or is blocked.
            unsafe { libc::pthread_kill(h.as_pthread_t(), WAKE) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How a thread waits for its next deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepMode {
    /// `clock_nanosleep(TIMER_ABSTIME)` to the deadline (the default).
    Absolute,
    /// `clock_nanosleep` for the interval (`-r`).
    Relative,
    /// `nanosleep()` for the interval (`-s`).
    Nanosleep,
    /// A POSIX interval timer and `sigwait()` (`-x`).
    PosixTimer,
}

/// A scheduling policy as `--policy` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_OTHER` (also `normal`).
    Other,
    /// `SCHED_BATCH`.
    Batch,
    /// `SCHED_IDLE`.
    Idle,
    /// `SCHED_FIFO`.
    Fifo,
    /// `SCHED_RR`.
    Rr,
}

impl Policy {
    /// cyclictest's name of the policy.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Other => "other",
            Policy::Batch => "batch",
            Policy::Idle => "idle",
            Policy::Fifo => "fifo",
            Policy::Rr => "rr",
        }
    }

    /// Whether the policy takes a real-time priority.
    pub fn is_realtime(self) -> bool {
        matches!(self, Policy::Fifo | Policy::Rr)
    }

    fn raw(self) -> libc::c_int {
        match self {
            Policy::Other => libc::SCHED_OTHER,
            Policy::Batch => libc::SCHED_BATCH,
            Policy::Idle => libc::SCHED_IDLE,
            Policy::Fifo => libc::SCHED_FIFO,
            Policy::Rr => libc::SCHED_RR,
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;

    /// `--policy NAME`: other, normal, batch, idle, fifo or rr.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "other" | "normal" => Ok(Policy::Other),
            "batch" => Ok(Policy::Batch),
            "idle" => Ok(Policy::Idle),
            "fifo" => Ok(Policy::Fifo),
            "rr" => Ok(Policy::Rr),
            _ => Err("must be one of other, normal, batch, idle, fifo, rr".to_string()),
        }
    }
}

/// One measuring thread's settings.
#[derive(Debug, Clone)]
pub struct ThreadSpec {
    /// The CPU it is pinned to.
    pub cpu: usize,
    /// Its policy.
    pub policy: Policy,
    /// Its priority (0 with a policy that takes none).
    pub prio: i32,
    /// Its interval.
    pub interval: Duration,
}

/// When the threads first wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Each thread one interval after it reads the clock.
    None,
    /// All from one start, thread N offset by N x this (`-A`).
    Threads(Duration),
    /// From the next full second, plus this (`--secaligned`).
    Second(Duration),
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct CyclicConfig {
    /// The threads.
    pub threads: Vec<ThreadSpec>,
    /// How long to measure (`None`: until stopped).
    pub duration: Option<Duration>,
    /// Wake-ups per thread, then stop (0: no limit).
    pub loops: u64,
    /// The clock (`CLOCK_MONOTONIC` or `CLOCK_REALTIME`).
    pub clock: libc::clockid_t,
    /// How the threads sleep.
    pub sleep: SleepMode,
    /// Latencies in nanoseconds (`-N`) instead of microseconds.
    pub nsecs: bool,
    /// cyclictest's histogram (`-h`): this many buckets of one unit; `None`: no histogram.
    pub histogram: Option<usize>,
    /// Stop when a latency exceeds this many units (`-b`).
    pub breaktrace: Option<u64>,
    /// Record latencies above this many units (`--spike`), at most this many.
    pub spike: Option<(u64, usize)>,
    /// When the threads first wake.
    pub align: Align,
    /// Keep the ring of recent values for `-v`.
    pub verbose: bool,
    /// The local operation, if any.
    pub local_op: Option<LocalOp>,
    /// Keep the counter readings of every wake-up at least this late (nanoseconds), for
    /// matching with a trace (`--trace`), with the counter's calibration; `None`: keep none.
    pub late_log: Option<(u64, crate::clock::Calibration)>,
}

impl CyclicConfig {
    /// Nanoseconds per unit of the figures.
    pub fn unit_ns(&self) -> u64 {
        if self.nsecs {
            1
        } else {
            1000
        }
    }
}

/// One thread's figures while it runs, for the main thread's live lines.
#[derive(Debug)]
pub struct Live {
    /// The thread's id (0 until it started).
    pub tid: AtomicI32,
    /// Wake-ups so far.
    pub cycles: AtomicU64,
    /// Smallest latency so far (1000000 before the first, as cyclictest).
    pub min: AtomicU64,
    /// Largest latency so far.
    pub max: AtomicU64,
    /// The last latency.
    pub act: AtomicU64,
    /// Sum of the latencies.
    pub sum: AtomicU64,
    /// The last `VALBUF` latencies, by cycle (`-v`).
    values: Vec<AtomicU64>,
}

impl Live {
    fn new(verbose: bool) -> Self {
        Self {
            tid: AtomicI32::new(0),
            cycles: AtomicU64::new(0),
            min: AtomicU64::new(1_000_000),
            max: AtomicU64::new(0),
            act: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            values: if verbose {
                (0..VALBUF).map(|_| AtomicU64::new(0)).collect()
            } else {
                Vec::new()
            },
        }
    }

    /// The latency of wake-up `cycle`, if it is still in the ring.
    pub fn value(&self, cycle: u64) -> Option<u64> {
        self.values
            .get(cycle as usize & (VALBUF - 1))
            .map(|v| v.load(Ordering::Relaxed))
    }

    /// cyclictest's status line for thread `index`: `T: 0 ( 1234) P:80 I:1000 C: ...`.
    pub fn status_line(&self, index: usize, spec: &ThreadSpec, nsecs: bool) -> String {
        let cycles = self.cycles.load(Ordering::Relaxed);
        let avg = self
            .sum
            .load(Ordering::Relaxed)
            .checked_div(cycles)
            .unwrap_or(0);
        let (min, act, max) = (
            self.min.load(Ordering::Relaxed),
            self.act.load(Ordering::Relaxed),
            self.max.load(Ordering::Relaxed),
        );
        let head = format!(
            "T:{index:2} ({:5}) P:{:2} I:{} C:{cycles:7} Min:{min:7} ",
            self.tid.load(Ordering::Relaxed),
            spec.prio,
            spec.interval.as_micros()
        );
        if nsecs {
            format!("{head}Act:{act:8} Avg:{avg:8} Max:{max:8}")
        } else {
            format!("{head}Act:{act:5} Avg:{avg:5} Max:{max:8}")
        }
    }
}

/// One thread's result.
#[derive(Debug, Clone)]
pub struct CyclicThread {
    /// The CPU.
    pub cpu: usize,
    /// The thread's id.
    pub tid: i32,
    /// Every latency, in nanoseconds, in buckets of one unit (cyclictest's histogram when
    /// `-h` was given: its overflows are this histogram's).
    pub hist: Histogram,
    /// Wake-ups measured.
    pub cycles: u64,
    /// Sum of the latencies, in units.
    pub sum: u64,
    /// Smallest latency, in units (1000000 when there was none, as cyclictest).
    pub min: u64,
    /// Largest latency, in units.
    pub max: u64,
    /// The last latency, in units.
    pub act: u64,
    /// Wake-ups that came after the following deadline (ours).
    pub overruns: u64,
    /// The cycle numbers of the first overflows (cyclictest keeps as many as `-h`).
    pub outliers: Vec<u64>,
    /// Local operations done.
    pub local_ops: u64,
    /// Local operations that failed.
    pub local_op_errors: u64,
    /// With [`CyclicConfig::late_log`]: each late wake-up as counter readings (deadline,
    /// wake-up).
    pub late: Vec<(u64, u64)>,
    /// Late wake-ups past the log's capacity, counted but not kept.
    pub late_not_kept: u64,
}

impl CyclicThread {
    /// cyclictest's average: the sum over the cycles, truncated.
    pub fn avg(&self) -> u64 {
        self.sum.checked_div(self.cycles).unwrap_or(0)
    }
}

/// A latency above `--spike`.
#[derive(Debug, Clone, Copy)]
pub struct Spike {
    /// The thread's index.
    pub thread: usize,
    /// The latency, in units.
    pub value: u64,
    /// When, in microseconds of the measuring clock.
    pub at_us: u64,
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct CyclicRun {
    /// One result per thread.
    pub threads: Vec<CyclicThread>,
    /// The thread id and latency (units) that crossed `-b`, if one did.
    pub break_hit: Option<(i32, u64)>,
    /// The spikes kept, and how many there were.
    pub spikes: (Vec<Spike>, u64),
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
    /// The common start, for aligned wake-ups (ns of the clock), set by the main thread.
    start_ns: AtomicU64,
    /// With `-D`: the latest of the threads' ends (ns of the clock; 0 before they know it).
    end_ns: AtomicU64,
    break_hit: Mutex<Option<(i32, u64)>>,
    spikes: Mutex<Vec<Spike>>,
    spike_count: AtomicU64,
    warnings: Mutex<Vec<String>>,
}

/// What the main thread does while the threads measure: redraw the live lines, feed `-F`
/// readers and print `-v` values.
pub trait Watch {
    /// Called about every 10 ms (cyclictest's pace) with every thread's live figures; returns
    /// whether to stop.
    fn tick(&mut self, live: &[Arc<Live>]) -> bool;
    /// Called once the threads have stopped, before they are joined.
    fn done(&mut self, live: &[Arc<Live>]);
}

/// Runs the probe; `phase` goes when every thread has started and stops with it; `watch`
/// runs on the calling thread.
pub fn run(cfg: &CyclicConfig, phase: &Arc<Phase>, watch: &mut dyn Watch) -> Result<CyclicRun> {
    let n = cfg.threads.len();
    let ctl = Arc::new(Control {
        started: AtomicUsize::new(0),
        go: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        start_ns: AtomicU64::new(0),
        end_ns: AtomicU64::new(0),
        break_hit: Mutex::new(None),
        spikes: Mutex::new(Vec::with_capacity(cfg.spike.map_or(0, |s| s.1))),
        spike_count: AtomicU64::new(0),
        warnings: Mutex::new(Vec::new()),
    });
    let live: Vec<Arc<Live>> = (0..n).map(|_| Arc::new(Live::new(cfg.verbose))).collect();
    install_wake().context("cannot install the handler of the threads' wake-up signal")?;
    let mut handles = Vec::with_capacity(n);
    for (i, spec) in cfg.threads.iter().enumerate() {
        // A signal while thousands of threads start: start no more (the run then ends with
        // those it has, as interrupted).
        if crate::rt::interrupted() {
            break;
        }
        let (cfg, tctl, spec, tlive) = (cfg.clone(), ctl.clone(), spec.clone(), live[i].clone());
        let h = std::thread::Builder::new()
            .name(format!("cyclictest/{i}"))
            .spawn(move || {
                let r = thread_main(i, &spec, &cfg, &tctl, &tlive);
                if r.is_err() {
                    tctl.stop.store(true, Ordering::SeqCst);
                    crate::signals::wake();
                }
                r
            });
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                ctl.stop.store(true, Ordering::SeqCst);
                ctl.go.store(true, Ordering::SeqCst);
                return Err(e).context("cannot start a cyclictest thread");
            }
        }
    }
    threads::wait_for(&ctl.started, n, &handles);
    ctl.start_ns.store(clock_ns(cfg.clock), Ordering::SeqCst);
    ctl.go.store(true, Ordering::SeqCst);
    phase.go();
    let mut interrupted = false;
    // cyclictest 2.4's main loop: print, then count the threads that reached -l, sleep 10 ms,
    // and stop everything once one has. A thread that reaches -l ends alone; the others run
    // on until this loop has seen it (up to two of its turns), and what they record after its
    // last print is not printed, as in 2.4.
    //
    // One difference: the counts are read before the print, where 2.4 reads them after it. A
    // thread that reached -l between 2.4's print and its count ended the run with its last
    // samples unprinted (`-l 40 -v -o 10` once printed 3 reduced lines of 4 in CI); here the
    // print that ends the run has seen every sample of the thread that ended it.
    loop {
        if crate::rt::interrupted() {
            interrupted = true;
            break;
        }
        // -D, timed here too: a thread asleep past it (an interval longer than the run) is
        // woken below.
        let end = ctl.end_ns.load(Ordering::SeqCst);
        if end > 0 && clock_ns(cfg.clock) >= end.saturating_add(END_GRACE_NS) {
            break;
        }
        let one_done = cfg.loops > 0
            && live
                .iter()
                .any(|l| l.cycles.load(Ordering::Acquire) >= cfg.loops);
        let asked_to_stop = watch.tick(&live);
        // A thread that ended before its loops were done failed (or panicked): stop all.
        let failed = handles.iter().zip(&live).any(|(h, l)| {
            h.is_finished() && (cfg.loops == 0 || l.cycles.load(Ordering::Relaxed) < cfg.loops)
        });
        if ctl.stop.load(Ordering::SeqCst) || failed || asked_to_stop {
            break;
        }
        crate::signals::wait_for(Duration::from_millis(10));
        if one_done {
            break;
        }
    }
    ctl.stop.store(true, Ordering::SeqCst);
    wake_threads(&handles);
    phase.stop();
    watch.done(&live);
    let threads = threads::join_all(handles, "a cyclictest thread panicked")?;
    let break_hit = *ctl.break_hit.lock().unwrap_or_else(|e| e.into_inner());
    let spikes = std::mem::take(&mut *ctl.spikes.lock().unwrap_or_else(|e| e.into_inner()));
    let warnings = std::mem::take(&mut *ctl.warnings.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(CyclicRun {
        threads,
        break_hit,
        spikes: (spikes, ctl.spike_count.load(Ordering::SeqCst)),
        interrupted,
        warnings,
    })
}

/// Sets the calling thread's policy and priority.
fn set_policy(policy: Policy, prio: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, policy.raw(), &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A POSIX interval timer that signals one thread (cyclictest's `-x`), deleted on drop.
struct PosixTimer {
    id: libc::timer_t,
    set: libc::sigset_t,
}

impl PosixTimer {
    /// A timer on `clock` that sends SIGALRM to the calling thread every `interval`, the
    /// first at `first_ns` (absolute); SIGALRM (and [`WAKE`]) are blocked in the thread so
    /// `sigwait` takes them.
    fn start(clock: libc::clockid_t, first_ns: u64, interval: Duration) -> std::io::Result<Self> {
        let os = std::io::Error::last_os_error;
        // SAFETY: an all-zero sigset_t is valid storage for sigemptyset to initialise.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is valid, writable storage; SIGALRM is a valid signal number.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGALRM);
            // And the end of the run's wake-up, taken in the same `sigwait`.
            libc::sigaddset(&mut set, WAKE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        // SAFETY: an all-zero sigevent is valid; the fields we need are set below.
        let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
        ev.sigev_notify = libc::SIGEV_THREAD_ID | libc::SIGEV_SIGNAL;
        ev.sigev_signo = libc::SIGALRM;
        // SAFETY: gettid has no preconditions.
        ev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `ev` and `id` are valid for the call.
        if unsafe { libc::timer_create(clock, &mut ev, &mut id) } != 0 {
            return Err(os());
        }
        let ts = |ns: u64| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts(interval.as_nanos() as u64),
            it_value: ts(first_ns),
        };
        // SAFETY: `id` was created above; `spec` is valid; the old value may be null.
        if unsafe { libc::timer_settime(id, libc::TIMER_ABSTIME, &spec, std::ptr::null_mut()) } != 0
        {
            let e = os();
            // SAFETY: `id` is a timer we created and delete once.
            unsafe { libc::timer_delete(id) };
            return Err(e);
        }
        Ok(Self { id, set })
    }

    /// Waits for the next expiry; returns the expiries missed since the last one.
    fn wait(&self) -> u64 {
        let mut sig = 0;
        // SAFETY: `self.set` was initialised in `start`; `sig` is writable.
        unsafe { libc::sigwait(&self.set, &mut sig) };
        // SAFETY: `self.id` is a live timer.
        let over = unsafe { libc::timer_getoverrun(self.id) };
        over.max(0) as u64
    }
}

impl Drop for PosixTimer {
    fn drop(&mut self) {
        // SAFETY: `self.id` is a timer we created and delete once.
        unsafe { libc::timer_delete(self.id) };
    }
}

fn thread_main(
    index: usize,
    spec: &ThreadSpec,
    cfg: &CyclicConfig,
    ctl: &Control,
    live: &Live,
) -> Result<CyclicThread> {
    let who = format!("cyclictest thread {index}");
    let _binding = crate::rt::enter_probe_cpu(
        cfg.local_op.as_ref().map(|op| &*op.qpw),
        spec.cpu,
        None,
        &who,
        &ctl.warnings,
    )?;
    if let Err(e) = set_policy(spec.policy, spec.prio) {
        let how = if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(" ({})", crate::rt::rt_priority_hint(spec.prio))
        } else {
            String::new()
        };
        ctl.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!(
                "{who} on cpu {} runs SCHED_OTHER, not {} at priority {}: {e}{how}",
                spec.cpu,
                spec.policy.name(),
                spec.prio
            ));
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    live.tid.store(tid, Ordering::Relaxed);
    let unit = cfg.unit_ns();
    // Our histogram: cyclictest's when -h was given (its overflows are ours), else one wide
    // enough for the percentiles we add (past it, exact values up to a limit).
    let buckets = cfg
        .histogram
        .unwrap_or(if cfg.nsecs { 100_000 } else { 10_000 });
    let mut t = CyclicThread {
        cpu: spec.cpu,
        tid,
        hist: Histogram::whole_units(buckets, unit),
        cycles: 0,
        sum: 0,
        min: 1_000_000,
        max: 0,
        act: 0,
        overruns: 0,
        outliers: Vec::with_capacity(cfg.histogram.unwrap_or(0).min(1 << 20)),
        local_ops: 0,
        local_op_errors: 0,
        late: Vec::new(),
        late_not_kept: 0,
    };
    if cfg.late_log.is_some() {
        t.late
            .try_reserve_exact(crate::oslat::GAP_LOG_CAPACITY)
            .map_err(|e| anyhow::anyhow!("cannot set aside the late wake-up log: {e}"))?;
    }
    let interval = spec.interval.as_nanos() as u64;
    let op_every = cfg.local_op.as_ref().map(|op| {
        let per = op.every.as_nanos() as u64 / interval.max(1);
        per.max(1)
    });
    ctl.started.fetch_add(1, Ordering::SeqCst);
    while !ctl.go.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }

    // The first deadline.
    let mut now = clock_ns(cfg.clock);
    match cfg.align {
        Align::None => {}
        Align::Threads(offset) => {
            now = ctl.start_ns.load(Ordering::SeqCst) + offset.as_nanos() as u64 * index as u64;
        }
        Align::Second(offset) => {
            let start = ctl.start_ns.load(Ordering::SeqCst);
            let (secs, frac) = (start / 1_000_000_000, start % 1_000_000_000);
            let skip = if frac > 900_000_000 { 2 } else { 1 };
            now = (secs + skip) * 1_000_000_000 + offset.as_nanos() as u64;
        }
    }
    let mut next = now + interval;
    let stop_at = cfg.duration.map(|d| now + d.as_nanos() as u64);
    if let Some(end) = stop_at {
        ctl.end_ns.fetch_max(end, Ordering::SeqCst);
    }
    let timer = match cfg.sleep {
        SleepMode::PosixTimer => Some(
            PosixTimer::start(cfg.clock, next, spec.interval)
                .with_context(|| format!("{who}: cannot start a POSIX timer"))?,
        ),
        _ => None,
    };
    while !ctl.stop.load(Ordering::Relaxed) {
        // Wait for the next period.
        let mut missed = 0;
        match cfg.sleep {
            SleepMode::Absolute => {
                if !sleep_until_unless(cfg.clock, next, &ctl.stop) {
                    break;
                }
            }
            SleepMode::Relative | SleepMode::Nanosleep => {
                let before = clock_ns(cfg.clock);
                sleep_for_ns(cfg.clock, interval, cfg.sleep == SleepMode::Nanosleep);
                next = before + interval;
            }
            SleepMode::PosixTimer => {
                if let Some(timer) = &timer {
                    missed = timer.wait();
                }
            }
        }
        let now = clock_ns(cfg.clock);
        // Woken before the deadline because the run ends: no sample, as cyclictest's thread
        // leaves its loop when its sleep is interrupted.
        if now < next && ctl.stop.load(Ordering::SeqCst) {
            break;
        }
        // calcdiff(): whole microseconds, truncated (or nanoseconds with -N).
        let diff = now.saturating_sub(next) / unit;
        if let Some((from_ns, cal)) = cfg.late_log {
            let late_ns = now.saturating_sub(next);
            if late_ns >= from_ns {
                // The same span on the probe counter (the trace's clock): deadline to now.
                let woke = crate::clock::ticks();
                if t.late.len() < crate::oslat::GAP_LOG_CAPACITY {
                    t.late
                        .push((woke.saturating_sub(cal.from_ns(late_ns)), woke));
                } else {
                    t.late_not_kept += 1;
                }
            }
        }
        t.cycles += 1;
        t.sum += diff;
        t.act = diff;
        t.min = t.min.min(diff);
        if diff > t.max {
            t.max = diff;
            live.max.store(diff, Ordering::Relaxed);
        }
        live.min.store(t.min, Ordering::Relaxed);
        live.act.store(diff, Ordering::Relaxed);
        live.sum.store(t.sum, Ordering::Relaxed);
        if let Some(slot) = live.values.get((t.cycles - 1) as usize & (VALBUF - 1)) {
            slot.store(diff, Ordering::Relaxed);
        }
        if let Some((trigger, nodes)) = cfg.spike {
            if diff > trigger {
                spike(ctl, nodes, index, diff, now / 1000);
            }
        }
        if stop_at.is_some_and(|s| now >= s) {
            ctl.stop.store(true, Ordering::SeqCst);
        }
        if cfg.breaktrace.is_some_and(|b| diff > b) {
            let mut hit = ctl.break_hit.lock().unwrap_or_else(|e| e.into_inner());
            hit.get_or_insert((tid, diff));
            ctl.stop.store(true, Ordering::SeqCst);
        }
        // The histogram: past its last bucket an overflow, listed by cycle number.
        if let Some(h) = cfg.histogram {
            if diff >= h as u64 && t.outliers.len() < h {
                t.outliers.push(t.cycles - 1);
            }
        }
        t.hist.record(diff * unit);
        live.cycles.store(t.cycles, Ordering::Release);
        if let (Some(op), Some(every)) = (&cfg.local_op, op_every) {
            if t.cycles.is_multiple_of(every) {
                match op.workload.process_op() {
                    Ok(()) => t.local_ops += 1,
                    Err(_) => t.local_op_errors += 1,
                }
            }
        }
        next += interval * (1 + missed);
        // An overrun: move the deadline past now by whole intervals.
        if now > next {
            t.overruns += 1;
            while now > next {
                next += interval;
            }
        }
        // A thread that reaches -l ends alone, as in cyclictest; the main loop stops the others
        // once it has seen it, so they show fewer cycles.
        if cfg.loops > 0 && t.cycles >= cfg.loops {
            break;
        }
    }
    Ok(t)
}

#[cold]
fn spike(ctl: &Control, nodes: usize, thread: usize, value: u64, at_us: u64) {
    ctl.spike_count.fetch_add(1, Ordering::Relaxed);
    let mut list = ctl.spikes.lock().unwrap_or_else(|e| e.into_inner());
    if list.len() < nodes {
        list.push(Spike {
            thread,
            value,
            at_us,
        });
    }
}

/// cyclictest's status lines, redrawn in place (`\x1b[NA`) every tick; the last drawing stays
/// on the screen. `policy` is the line above them.
#[derive(Debug)]
pub struct LiveLines {
    /// The threads' settings.
    pub specs: Vec<ThreadSpec>,
    /// `-N`.
    pub nsecs: bool,
    /// `policy: fifo: loadavg: ...`'s policy part.
    pub policy: String,
    /// `-M`: redraw only after a new maximum.
    pub refresh_on_max: bool,
    /// `-q`: draw nothing.
    pub quiet: bool,
    /// `-v`: print `thread:cycle:value` lines instead.
    pub verbose: Option<Verbose>,
    drawn: bool,
    maxima: Vec<u64>,
}

/// `-v`'s state: how far each thread's values were printed, and `-o`'s reduction.
#[derive(Debug)]
pub struct Verbose {
    /// Print the largest of every this many values.
    pub reduce: u64,
    read: Vec<u64>,
    red_max: Vec<(u64, u64)>,
    red_count: Vec<u64>,
}

impl Verbose {
    /// `-v` with `-o reduce`.
    pub fn new(threads: usize, reduce: u64) -> Self {
        Self {
            reduce: reduce.max(1),
            read: vec![0; threads],
            red_max: vec![(0, 0); threads],
            red_count: vec![0; threads],
        }
    }

    /// Prints the values each thread recorded since the last call: `%8d:%8lu:%8ld`.
    fn print(&mut self, live: &[Arc<Live>], out: &mut impl Write) {
        for (i, l) in live.iter().enumerate() {
            let cycles = l.cycles.load(Ordering::Acquire);
            // Values older than the ring are gone, as in cyclictest.
            self.read[i] = self.read[i].max(cycles.saturating_sub(VALBUF as u64));
            while self.read[i] < cycles {
                let c = self.read[i];
                let v = l.value(c).unwrap_or(0);
                if v > self.red_max[i].1 || self.red_count[i] == 0 {
                    self.red_max[i] = (c, v);
                }
                self.red_count[i] += 1;
                if self.red_count[i] == self.reduce {
                    let (cycle, value) = self.red_max[i];
                    let _ = writeln!(out, "{i:8}:{cycle:8}:{value:8}");
                    self.red_count[i] = 0;
                }
                self.read[i] += 1;
            }
        }
    }
}

impl LiveLines {
    /// The live display of `specs`.
    pub fn new(
        specs: Vec<ThreadSpec>,
        nsecs: bool,
        policy: String,
        refresh_on_max: bool,
        quiet: bool,
        verbose: Option<Verbose>,
    ) -> Self {
        let n = specs.len();
        Self {
            specs,
            nsecs,
            policy,
            refresh_on_max,
            quiet,
            verbose,
            drawn: false,
            maxima: vec![u64::MAX; n],
        }
    }

    /// Draws the lines on standard output; a failed write stops the run (see [`crate::out`]).
    fn draw(&mut self, live: &[Arc<Live>], last: bool) {
        let mut out = Vec::new();
        self.render(live, last, &mut out);
        if !out.is_empty() {
            let mut stdout = std::io::stdout().lock();
            crate::out::check_stdout(stdout.write_all(&out).and_then(|()| stdout.flush()));
        }
    }

    fn render(&mut self, live: &[Arc<Live>], last: bool, out: &mut Vec<u8>) {
        if let Some(v) = &mut self.verbose {
            v.print(live, out);
            return;
        }
        if self.quiet {
            return;
        }
        let maxima: Vec<u64> = live.iter().map(|l| l.max.load(Ordering::Relaxed)).collect();
        if self.refresh_on_max && self.drawn && maxima == self.maxima && !last {
            return;
        }
        self.maxima = maxima;
        if self.drawn {
            let _ = write!(out, "\x1b[{}A", live.len() + 2);
        }
        let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let _ = writeln!(
            out,
            "policy: {}: loadavg: {}          \n",
            self.policy,
            loadavg.trim_end()
        );
        for (i, l) in live.iter().enumerate() {
            let _ = writeln!(out, "{}", l.status_line(i, &self.specs[i], self.nsecs));
        }
        self.drawn = true;
    }
}

impl Watch for LiveLines {
    fn tick(&mut self, live: &[Arc<Live>]) -> bool {
        self.draw(live, false);
        false
    }

    fn done(&mut self, live: &[Arc<Live>]) {
        // 2.4 prints no sample after its main loop's last turn (`-v`): nor do we.
        if self.verbose.is_some() {
            return;
        }
        self.draw(live, true);
    }
}

/// cyclictest's `-F`: a named pipe that every reader gets the status lines from.
#[derive(Debug)]
pub struct Fifo {
    path: std::path::PathBuf,
}

impl Fifo {
    /// Creates the pipe at `path` (replacing a file there, as cyclictest does).
    pub fn create(path: &std::path::Path) -> Result<Self> {
        let _ = std::fs::remove_file(path);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .with_context(|| format!("-F {}: the path has a NUL byte", path.display()))?;
        // SAFETY: `c` is a NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o666) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("-F {}: cannot create the named pipe", path.display()));
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// Writes the status lines to a reader, if one has the pipe open.
    pub fn serve(&self, live: &[Arc<Live>], specs: &[ThreadSpec], nsecs: bool) {
        use std::os::unix::fs::OpenOptionsExt;
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path);
        if let Ok(mut f) = opened {
            for (i, l) in live.iter().enumerate() {
                let _ = writeln!(f, "{}", l.status_line(i, &specs[i], nsecs));
            }
        }
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The live display and the `-F` pipe together, as the main thread runs them.
#[derive(Debug)]
pub struct MainLoop {
    /// The status lines (or `-v` values).
    pub lines: LiveLines,
    /// The `-F` pipe.
    pub fifo: Option<Fifo>,
    /// The progress line on stderr (ours; only with -q and a known duration).
    pub progress: Option<Progress>,
    /// When the last `-F` reader was served.
    served: Option<Instant>,
}

impl MainLoop {
    /// The main thread's work.
    pub fn new(lines: LiveLines, fifo: Option<Fifo>, progress: Option<Progress>) -> Self {
        Self {
            lines,
            fifo,
            progress,
            served: None,
        }
    }
}

impl Watch for MainLoop {
    fn tick(&mut self, live: &[Arc<Live>]) -> bool {
        self.lines.tick(live);
        if let Some(p) = &self.progress {
            p.tick();
        }
        if let Some(f) = &self.fifo {
            // cyclictest's fifo thread looks for a reader every half second.
            if self
                .served
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(500))
            {
                f.serve(live, &self.lines.specs, self.lines.nsecs);
                self.served = Some(Instant::now());
            }
        }
        false
    }

    fn done(&mut self, live: &[Arc<Live>]) {
        if let Some(p) = &self.progress {
            p.finish();
        }
        self.lines.done(live);
    }
}

/// cyclictest's `# Histogram` block (`print_hist()`), written to `out`. `histofall` adds the
/// all-threads column (with more than one thread).
pub fn write_histogram(
    out: &mut impl Write,
    run: &CyclicRun,
    buckets: usize,
    histofall: bool,
) -> std::io::Result<()> {
    let ts = &run.threads;
    let all = histofall && ts.len() > 1;
    writeln!(out, "# Histogram")?;
    let mut totals = vec![0u64; ts.len() + 1];
    for i in 0..buckets {
        let mut line = format!("{i:06} ");
        let mut sum = 0;
        for (j, t) in ts.iter().enumerate() {
            let c = t.hist.counts().get(i).copied().unwrap_or(0);
            line.push_str(&format!("{c:06}"));
            if j + 1 < ts.len() {
                line.push('\t');
            }
            totals[j] += c;
            sum += c;
        }
        if all {
            line.push_str(&format!("\t{sum:06}"));
            totals[ts.len()] += sum;
        }
        writeln!(out, "{line}")?;
    }
    let row = |label: &str, cells: Vec<String>, extra: Option<String>| {
        let mut s = format!("# {label}:");
        for c in cells.into_iter().chain(extra.filter(|_| all)) {
            s.push(' ');
            s.push_str(&c);
        }
        s
    };
    let per = |f: &dyn Fn(&CyclicThread) -> u64, width: usize| -> Vec<String> {
        ts.iter().map(|t| format!("{:0width$}", f(t))).collect()
    };
    writeln!(
        out,
        "{}",
        row(
            "Total",
            totals[..ts.len()]
                .iter()
                .map(|c| format!("{c:09}"))
                .collect(),
            Some(format!("{:09}", totals[ts.len()]))
        )
    )?;
    writeln!(out, "{}", row("Min Latencies", per(&|t| t.min, 5), None))?;
    writeln!(out, "{}", row("Avg Latencies", per(&|t| t.avg(), 5), None))?;
    let maxmax = ts.iter().map(|t| t.max).max().unwrap_or(0);
    writeln!(
        out,
        "{}",
        row(
            "Max Latencies",
            per(&|t| t.max, 5),
            Some(format!("{maxmax:05}"))
        )
    )?;
    let overflows: u64 = ts.iter().map(|t| t.hist.overflow()).sum();
    writeln!(
        out,
        "{}",
        row(
            "Histogram Overflows",
            per(&|t| t.hist.overflow(), 5),
            Some(format!("{overflows:05}"))
        )
    )?;
    writeln!(out, "# Histogram Overflow at cycle number:")?;
    for (i, t) in ts.iter().enumerate() {
        let mut line = format!("# Thread {i}:");
        for c in &t.outliers {
            line.push_str(&format!(" {c:05}"));
        }
        let others = t.hist.overflow().saturating_sub(t.outliers.len() as u64);
        if others > 0 {
            line.push_str(&format!(" # {others:05} others"));
        }
        writeln!(out, "{line}")?;
    }
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch that prints `-v -o 10` into a buffer and, at its first turn after the thread
    /// started, holds the main loop until the thread has reached `-l`: the widest form of the
    /// race between a print and the count that ends the run.
    struct HoldingWatch {
        verbose: Verbose,
        out: Vec<u8>,
        loops: u64,
        held: bool,
    }

    impl Watch for HoldingWatch {
        fn tick(&mut self, live: &[Arc<Live>]) -> bool {
            self.verbose.print(live, &mut self.out);
            if !self.held && live[0].cycles.load(Ordering::Acquire) > 0 {
                self.held = true;
                let until = Instant::now() + Duration::from_secs(10);
                while live[0].cycles.load(Ordering::Acquire) < self.loops && Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            false
        }

        fn done(&mut self, _live: &[Arc<Live>]) {}
    }

    /// The thread that ends a `-l` run has every sample printed, however late the main loop
    /// counts it (2.4 counts after printing and can drop the last ones).
    #[test]
    fn the_print_that_ends_a_loops_run_has_every_sample() {
        let loops = 40;
        let cfg = CyclicConfig {
            threads: vec![ThreadSpec {
                cpu: 0,
                policy: Policy::Other,
                prio: 0,
                interval: Duration::from_micros(500),
            }],
            duration: None,
            loops,
            clock: libc::CLOCK_MONOTONIC,
            sleep: SleepMode::Absolute,
            nsecs: false,
            histogram: None,
            breaktrace: None,
            spike: None,
            align: Align::None,
            verbose: true,
            local_op: None,
            late_log: None,
        };
        let mut watch = HoldingWatch {
            verbose: Verbose::new(1, 10),
            out: Vec::new(),
            loops,
            held: false,
        };
        let run = run(&cfg, &Arc::new(Phase::default()), &mut watch).expect("the run");
        assert!(watch.held, "the thread never started before the run ended");
        assert_eq!(run.threads[0].cycles, loops);
        let text = String::from_utf8(watch.out).expect("utf-8");
        let cycles: Vec<u64> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(':').map(str::trim).collect();
                assert_eq!(f.len(), 3, "{l}");
                assert_eq!(f[0], "0", "{l}");
                f[1].parse().expect("a cycle")
            })
            .collect();
        assert_eq!(
            cycles.len(),
            4,
            "one reduced line per 10 of 40 samples:\n{text}"
        );
        for (block, c) in cycles.iter().enumerate() {
            let first = block as u64 * 10;
            assert!(
                (first..first + 10).contains(c),
                "line {block} names cycle {c}:\n{text}"
            );
        }
    }
}
