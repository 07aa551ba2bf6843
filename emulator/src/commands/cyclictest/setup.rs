//! What `qpw-emu cyclictest` sets up before its threads start and holds until it ends, in
//! cyclictest's order: memory locked, `/dev/cpu_dma_latency`, the isolation check, the trace
//! marker, Ctrl-C, and ours after it (RT throttling, `--isolate`), the `-F` pipe and the main
//! thread's CPUs.

use anyhow::Result;

use crate::cli::CyclictestArgs;
use crate::cyclictest::{Fifo, ThreadSpec};
use crate::rt::{self, AwayFrom, TraceMarker};
use crate::sink::Sink;
use crate::throttling::RtThrottling;

use super::plan::Plan;

/// What the run holds, put back when dropped, in the reverse of the order it was taken.
pub(super) struct SetUp {
    /// `--mainaffinity`: the main thread kept off the measured CPUs.
    _main: Option<AwayFrom>,
    /// `-F`: the named pipe, until the main loop takes it.
    pub(super) fifo: Option<Fifo>,
    /// `--isolate`.
    pub(super) isolation: Option<crate::isolate::Isolation>,
    /// RT throttling as the run had it.
    pub(super) throttling: RtThrottling,
    /// `--no-rt-throttling`.
    _throttling_off: Option<crate::throttling::ThrottlingOff>,
    /// `--tracemark`: the marker written at a break.
    pub(super) marker: Option<TraceMarker>,
    /// Memory locked, `cpu_dma_latency` held.
    _guard: rt::RtGuard,
}

impl SetUp {
    /// Takes what the run holds, saying what cyclictest says as it does (`-v`'s lines, the
    /// `cpu_dma_latency` line) and recording what fails in `sink`.
    pub(super) fn hold(plan: &Plan, args: &CyclictestArgs, sink: &mut Sink) -> Result<SetUp> {
        let Plan {
            ref cpus,
            explicit_set,
            distance,
            ref specs,
            ref measured,
            ref main_cpus,
            clock,
            breaktrace,
            ..
        } = *plan;
        print_cpus(plan, args, sink);
        let guard = dma_latency(args, sink);
        if !args.drain.isolate {
            rt::check_isolation(measured, sink);
        }
        let marker = (breaktrace.is_some() && args.tracemark).then(|| {
            let marker = TraceMarker::open(sink);
            sink.say_deferred();
            marker
        });
        if args.resolution {
            check_resolution(clock, sink, args.dbg_cyclictest);
        }
        rt::catch_sigint(sink);
        // After Ctrl-C is taken: a signal must not end the process before the guard restores.
        let throttling_off = crate::drain::throttling_for_run(&args.drain, sink)?;
        let throttling = RtThrottling::read(throttling_off.as_ref());
        let isolation = crate::isolate::for_run(args.drain.isolate, measured, &cpus.allowed, sink)?;
        if sink.is_verbose() {
            print_threads(specs, explicit_set, distance);
        }
        let fifo = args.fifo.as_deref().map(Fifo::create).transpose()?;
        let main = main_cpus.as_ref().map(|m| AwayFrom::onto(m, sink));

        Ok(SetUp {
            _main: main,
            fifo,
            isolation,
            throttling,
            _throttling_off: throttling_off,
            marker,
            _guard: guard,
        })
    }
}

/// `-v`'s lines about the CPUs, as 2.4 prints them while it parses its options.
fn print_cpus(plan: &Plan, args: &CyclictestArgs, sink: &Sink) {
    let Plan {
        ref cpus,
        ref set,
        explicit_set,
        ..
    } = *plan;
    // 2.4 says it once more while it parses `-a`, when `-v` came before it.
    if sink.is_verbose() && args.verbose_before_affinity && explicit_set {
        println!("Using {} cpus.", set.len());
    }
    if sink.is_verbose() {
        println!("Max CPUs = {}", cpus.allowed.last().map_or(0, |c| c + 1));
        println!("Online CPUs = {}", cpus.allowed.len());
        if explicit_set {
            println!("Using {} cpus.", set.len());
        }
    }
}

/// Memory locked (`-m`) and `/dev/cpu_dma_latency` held as `--laptop`, `--default-system` or
/// `--latency` say, with cyclictest's line when it is held.
fn dma_latency(args: &CyclictestArgs, sink: &mut Sink) -> rt::RtGuard {
    let mut guard = rt::prepare(args.mlockall, sink);
    if args.laptop {
        sink.tool_warn(format_args!(
            "not setting cpu_dma_latency to save battery power"
        ));
        guard.set_dma_latency(None, sink);
    } else if args.default_system {
        sink.tool_warn(format_args!("not setting cpu_dma_latency from cyclictest"));
        guard.set_dma_latency(None, sink);
    } else if let Some(v) = args.latency {
        guard.set_dma_latency(Some(v as i32), sink);
    }
    if guard.holds_dma_latency() {
        println!(
            "# /dev/cpu_dma_latency set to {}us",
            args.latency.unwrap_or(0)
        );
    }
    guard
}

/// `-v`'s line for each thread: its CPU (with `-a`) and its interval.
fn print_threads(specs: &[ThreadSpec], explicit_set: bool, distance: u64) {
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

/// cyclictest's `-R`: reads the clock back to back and says when the measured resolution is
/// coarser than the reported one (always with `-v`); `--dbg_cyclictest` lists the readings.
fn check_resolution(clock: libc::clockid_t, sink: &Sink, list: bool) {
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `res` is a valid, writable timespec.
    let reported = if unsafe { libc::clock_getres(clock, &mut res) } == 0 {
        res.tv_sec as u64 * 1_000_000_000 + res.tv_nsec as u64
    } else {
        sink.tool_warn(format_args!("clock_getres failed"));
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
    if sink.is_verbose() || (min_diff != u64::MAX && min_diff > reported) {
        sink.tool_warn(format_args!("reported clock resolution: {reported} nsec"));
        sink.tool_warn(format_args!(
            "measured clock resolution approximately: {min_diff} nsec"
        ));
    }
}
