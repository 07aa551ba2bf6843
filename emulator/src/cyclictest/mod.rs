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

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::clock::clock_ns;
use crate::hist::Histogram;
use crate::json::ThreadFigures;
use crate::load::Phase;
use crate::oslat::LocalOp;
use crate::threads;

mod histogram;
mod live;
mod thread;

pub use histogram::write_histogram;
pub use live::{Fifo, LiveLines, MainLoop, Verbose};
use thread::{install_wake, thread_main, wake_threads};

/// cyclictest's `VALBUF_SIZE`: the ring of recent values `-v` reads (a power of two).
const VALBUF: usize = 16384;

/// The signal that wakes a measuring thread from its sleep at the end of the run: a no-op
/// handler (`thread::on_wake`), installed without `SA_RESTART`, makes `clock_nanosleep` and
/// `nanosleep` return `EINTR`; a `-x` thread blocks it and takes it in `sigwait` with its
/// timer's SIGALRM.
pub const WAKE: libc::c_int = libc::SIGUSR2;

/// How long past `-D` the main thread lets a thread end by itself (at its first wake-up after
/// the duration, as it counts its last sample) before it wakes it.
const END_GRACE_NS: u64 = 50_000_000;

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

/// What the main thread and the measuring threads share: the start and stop flags, the common
/// start and end, and what the threads hand back besides their results.
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

impl Control {
    /// The shared state of `cfg`'s threads before any has started.
    fn new(cfg: &CyclicConfig) -> Control {
        Control {
            started: AtomicUsize::new(0),
            go: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            start_ns: AtomicU64::new(0),
            end_ns: AtomicU64::new(0),
            break_hit: Mutex::new(None),
            spikes: Mutex::new(Vec::with_capacity(cfg.spike.map_or(0, |s| s.1))),
            spike_count: AtomicU64::new(0),
            warnings: Mutex::new(Vec::new()),
        }
    }

    /// The run, from the joined threads' results and what they left here.
    fn collect(&self, threads: Vec<CyclicThread>, interrupted: bool) -> CyclicRun {
        let break_hit = *self.break_hit.lock().unwrap_or_else(|e| e.into_inner());
        let spikes = std::mem::take(&mut *self.spikes.lock().unwrap_or_else(|e| e.into_inner()));
        let warnings =
            std::mem::take(&mut *self.warnings.lock().unwrap_or_else(|e| e.into_inner()));
        CyclicRun {
            threads,
            break_hit,
            spikes: (spikes, self.spike_count.load(Ordering::SeqCst)),
            interrupted,
            warnings,
        }
    }
}

/// A measuring thread's handle: its result once joined.
type CyclicHandle = std::thread::JoinHandle<Result<CyclicThread>>;

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
    let ctl = Arc::new(Control::new(cfg));
    let live: Vec<Arc<Live>> = (0..n).map(|_| Arc::new(Live::new(cfg.verbose))).collect();
    install_wake().context("cannot install the handler of the threads' wake-up signal")?;
    let handles = start_threads(cfg, &ctl, &live)?;
    threads::wait_for(&ctl.started, n, &handles);
    ctl.start_ns.store(clock_ns(cfg.clock), Ordering::SeqCst);
    ctl.go.store(true, Ordering::SeqCst);
    phase.go();
    let interrupted = watch_until_the_end(cfg, &ctl, &live, &handles, watch);
    ctl.stop.store(true, Ordering::SeqCst);
    wake_threads(&handles);
    phase.stop();
    watch.done(&live);
    let threads = threads::join_all(handles, "a cyclictest thread panicked")?;
    Ok(ctl.collect(threads, interrupted))
}

/// Starts one measuring thread per [`ThreadSpec`], in order, each with its live figures. A
/// signal while they start stops starting more; a thread that fails stops the run; a thread
/// that cannot be started stops those already running.
fn start_threads(
    cfg: &CyclicConfig,
    ctl: &Arc<Control>,
    live: &[Arc<Live>],
) -> Result<Vec<CyclicHandle>> {
    let mut handles = Vec::with_capacity(cfg.threads.len());
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
    Ok(handles)
}

/// The main loop while the threads measure: `watch` every 10 ms, until `-D` is past, a thread
/// reached `-l`, one failed, `watch` or a thread asks to stop, or a signal comes; returns
/// whether a signal ended it.
fn watch_until_the_end(
    cfg: &CyclicConfig,
    ctl: &Control,
    live: &[Arc<Live>],
    handles: &[CyclicHandle],
    watch: &mut dyn Watch,
) -> bool {
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
            return true;
        }
        // -D, timed here too: a thread asleep past it (an interval longer than the run) is
        // woken below.
        let end = ctl.end_ns.load(Ordering::SeqCst);
        if end > 0 && clock_ns(cfg.clock) >= end.saturating_add(END_GRACE_NS) {
            return false;
        }
        let one_done = cfg.loops > 0
            && live
                .iter()
                .any(|l| l.cycles.load(Ordering::Acquire) >= cfg.loops);
        let asked_to_stop = watch.tick(live);
        // A thread that ended before its loops were done failed (or panicked): stop all.
        let failed = handles.iter().zip(live).any(|(h, l)| {
            h.is_finished() && (cfg.loops == 0 || l.cycles.load(Ordering::Relaxed) < cfg.loops)
        });
        if ctl.stop.load(Ordering::SeqCst) || failed || asked_to_stop {
            return false;
        }
        crate::signals::wait_for(Duration::from_millis(10));
        if one_done {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

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
