//! `qpw-emu cyclictest`'s plan: its options, checked and settled as cyclictest 2.4 settles them
//! (the threads, their CPUs, policies, priorities and intervals, the sleep, the histogram),
//! the drain load, and where the outputs go. cyclictest's own `WARN` lines about its options
//! are said here, as it says them while it parses.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use qpw_core::CpuSet;

use crate::cli::{CyclictestArgs, RunLength};
use crate::cpus::Cpus;
use crate::cyclictest::{Align, Policy, SleepMode, ThreadSpec};
use crate::scenario::DrainSpec;
use crate::sink::{JsonOut, Sink};
use crate::validate;

/// cyclictest's `HIST_MAX`: larger `-h` values are cut to it.
const HIST_MAX: u64 = 1_000_000;
/// cyclictest's default distance between the threads' intervals, in us.
const DEFAULT_DISTANCE: u64 = 500;
/// What one cyclictest run measures, where and how.
pub(super) struct Plan {
    pub(super) cpus: Cpus,
    /// The CPUs the threads go to, in turn.
    pub(super) set: CpuSet,
    /// Whether `-a` named them.
    pub(super) explicit_set: bool,
    pub(super) nthreads: usize,
    /// The priority as settled (the first thread's).
    pub(super) priority: i32,
    /// `-h`/`-H`: the buckets, cut to `HIST_MAX`.
    pub(super) histogram: Option<usize>,
    /// The distance between the threads' intervals, in us (0 with a histogram).
    pub(super) distance: u64,
    pub(super) specs: Vec<ThreadSpec>,
    /// The policy as the live lines name it.
    pub(super) policy_label: String,
    /// The measured CPUs.
    pub(super) measured: CpuSet,
    /// The drain load, if any.
    pub(super) spec: Option<DrainSpec>,
    /// `--trace`'s threshold, in us.
    pub(super) trace_us: Option<f64>,
    /// `--mainaffinity`, or the measured set when `-a` named it.
    pub(super) main_cpus: Option<CpuSet>,
    pub(super) duration: Option<Duration>,
    pub(super) clock: libc::clockid_t,
    pub(super) sleep: SleepMode,
    pub(super) align: Align,
    pub(super) breaktrace: Option<u64>,
    /// `--json`'s destination, checked writable.
    pub(super) json: Option<JsonOut>,
}

impl Plan {
    /// The plan of `args`, or the first option that cannot be taken.
    pub(super) fn new(args: &CyclictestArgs, sink: &Sink) -> Result<Plan> {
        crate::cli::note_stray("cyclictest", &args.stray);
        refuse(args)?;
        let cpus = Cpus::read()?;
        // Which CPUs, how many threads.
        let (set, explicit_set, nthreads) = threads(args, &cpus, sink)?;
        let (policy, priority) = policy(args, nthreads)?;
        let (histogram, distance) = histogram_and_distance(args, sink);
        let specs = thread_specs(args, &set, nthreads, policy, priority, distance);
        let policy_label = policy_label(policy, priority);
        let measured: CpuSet = specs.iter().map(|s| s.cpu).collect();
        let spec = crate::drain::resolve_drain(&args.drain, &cpus, &measured, false)?;
        let json = check_outputs(args)?;
        let trace_us = crate::probe_trace::threshold_checked(args.trace.as_deref())?;
        let main_cpus = match &args.mainaffinity {
            Some(raw) => Some(validate::cpu_list("--mainaffinity", raw, &cpus.allowed)?),
            None => explicit_set.then(|| set.clone()),
        };
        let duration = match args.duration {
            Some(RunLength::For(d)) => Some(d),
            Some(RunLength::UntilStopped) | None => None,
        };
        let clock = if args.clock == 1 {
            libc::CLOCK_REALTIME
        } else {
            libc::CLOCK_MONOTONIC
        };
        let sleep = sleep_mode(args, sink);
        let align = align(args);
        let breaktrace = args.breaktrace.filter(|&b| b > 0);

        Ok(Plan {
            cpus,
            set,
            explicit_set,
            nthreads,
            priority,
            histogram,
            distance,
            specs,
            policy_label,
            measured,
            spec,
            trace_us,
            main_cpus,
            duration,
            clock,
            sleep,
            align,
            breaktrace,
            json,
        })
    }
}

/// The flags refused before anything else: `--smi`, and those that contradict each other.
fn refuse(args: &CyclictestArgs) -> Result<()> {
    if args.smi {
        bail!(
            "--smi: not supported: cyclictest counts SMIs by reading MSR 0x34 through \
             /dev/cpu/N/msr on the Intel models it knows; qpw-emu reads no MSRs (and a \
             virtual machine has no SMI counter to read)"
        );
    }
    if args.aligned.is_some() && args.secaligned.is_some() {
        bail!("-A/--aligned and --secaligned: give one or the other, not both");
    }
    if args.oscope.is_some_and(|r| r > 1) && !args.verbose {
        bail!("-o/--oscope: only meaningful with -v (the values it reduces)");
    }
    Ok(())
}

/// The CPUs the threads go to, whether `-a` named them, and how many threads (`-t`, `-S`).
fn threads(args: &CyclictestArgs, cpus: &Cpus, sink: &Sink) -> Result<(CpuSet, bool, usize)> {
    Ok(if args.smp {
        if args.threads.is_some() {
            sink.tool_warn(format_args!("-t ignored due to smp mode"));
        }
        if args.affinity.is_some() {
            sink.tool_warn(format_args!("-a ignored due to smp mode"));
        }
        (cpus.allowed.clone(), false, cpus.allowed.len())
    } else {
        let (set, explicit) = match args.affinity.as_deref() {
            Some(raw) if raw != "all" => {
                (validate::cpu_list("--affinity", raw, &cpus.allowed)?, true)
            }
            _ => (cpus.allowed.clone(), false),
        };
        let n = match args.threads {
            None => 1,
            Some(None) => set.len(),
            Some(Some(n)) => n as usize,
        };
        (set, explicit, n)
    })
}

/// The policy and the first thread's priority, as cyclictest settles them.
fn policy(args: &CyclictestArgs, nthreads: usize) -> Result<(Policy, i32)> {
    let mut policy = match &args.policy {
        Some(raw) => raw
            .parse::<Policy>()
            .map_err(|e| anyhow!("--policy {raw}: {e}"))?,
        None => Policy::Other,
    };
    let mut priority = args.priority as i32;
    if priority > 0 && !policy.is_realtime() {
        policy = Policy::Fifo;
    }
    if (args.priospread || policy.is_realtime()) && priority == 0 {
        priority = (nthreads as i32 + 1).min(99);
        eprintln!("defaulting realtime priority to {priority}");
        if !policy.is_realtime() {
            policy = Policy::Fifo;
        }
    }
    Ok((policy, priority))
}

/// `-h`/`-H`'s buckets (cut to `HIST_MAX`) and the distance between the threads' intervals
/// (0 with a histogram).
fn histogram_and_distance(args: &CyclictestArgs, sink: &Sink) -> (Option<usize>, u64) {
    let histogram = args
        .histogram
        .or(args.histofall)
        .map(|h| h.min(HIST_MAX) as usize);
    if histogram.is_some() && args.distance.is_some() {
        sink.tool_warn(format_args!(
            "distance is ignored and set to 0, if histogram enabled"
        ));
    }
    let distance = if histogram.is_some() {
        0
    } else {
        args.distance.unwrap_or(DEFAULT_DISTANCE)
    };
    (histogram, distance)
}

/// Each thread's CPU, policy, priority (`--priospread`: one less each) and interval.
fn thread_specs(
    args: &CyclictestArgs,
    set: &CpuSet,
    nthreads: usize,
    policy: Policy,
    priority: i32,
    distance: u64,
) -> Vec<ThreadSpec> {
    let mut specs = Vec::with_capacity(nthreads);
    let mut prio = priority;
    for i in 0..nthreads {
        let (p, pol) = if prio > 0 && policy.is_realtime() {
            (prio, policy)
        } else if policy.is_realtime() {
            (0, Policy::Other)
        } else {
            (0, policy)
        };
        specs.push(ThreadSpec {
            cpu: set.as_slice()[i % set.len()],
            policy: pol,
            prio: p,
            interval: Duration::from_micros(args.interval + i as u64 * distance),
        });
        if args.priospread {
            prio = (prio - 1).max(0);
        }
    }
    specs
}

/// The policy as the live lines name it (`fifo/other` when a thread runs `SCHED_OTHER`).
fn policy_label(policy: Policy, priority: i32) -> String {
    let forced_other = !(priority > 0 && policy.is_realtime()) && policy == Policy::Other;
    if forced_other {
        format!("{}/other", policy.name())
    } else {
        policy.name().to_string()
    }
}

/// The outputs checked before the run: no busy-loop workload of oslat's, the files
/// writable, `-F` not a directory; the JSON's destination.
fn check_outputs(args: &CyclictestArgs) -> Result<Option<JsonOut>> {
    if let Some(w) = args.drain.workload.as_deref() {
        if w == "memmove" || w == "no" {
            bail!("--workload {w}: oslat's busy-loop workloads belong to `qpw-emu oslat`");
        }
    }
    let json = JsonOut::checked("--json", args.json.as_deref())?;
    if let Some(path) = &args.histfile {
        validate::output_file("--histfile", path)?;
    }
    if let Some(path) = &args.fifo {
        if path.is_dir() {
            bail!(
                "-F/--fifo {}: is a directory: give the path of the named pipe to create",
                path.display()
            );
        }
    }
    Ok(json)
}

/// How the threads sleep (`-s`, `--posix_timers`, `-r`), with cyclictest's warning when
/// `-s` and `--posix_timers` are both given.
fn sleep_mode(args: &CyclictestArgs, sink: &Sink) -> SleepMode {
    match (args.system, args.posix_timers, args.relative) {
        (true, true, _) => {
            sink.tool_warn(format_args!("The system option requires clock_nanosleep"));
            sink.tool_warn(format_args!("and is not compatible with posix_timers"));
            sink.tool_warn(format_args!("Using clock_nanosleep"));
            SleepMode::Nanosleep
        }
        (true, false, _) => SleepMode::Nanosleep,
        (false, true, _) => SleepMode::PosixTimer,
        (false, false, true) => SleepMode::Relative,
        (false, false, false) => SleepMode::Absolute,
    }
}

/// When the threads first wake (`-A`, `--secaligned`).
fn align(args: &CyclictestArgs) -> Align {
    match (args.aligned, args.secaligned) {
        (Some(off), _) => Align::Threads(Duration::from_micros(off.unwrap_or(0))),
        (_, Some(off)) => Align::Second(Duration::from_micros(off.unwrap_or(0))),
        _ => Align::None,
    }
}
