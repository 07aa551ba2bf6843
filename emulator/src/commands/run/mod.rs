//! The default experiment (`qpw-emu`, `qpw-emu run`): the same probe, the same load, once per
//! mode and workload, so that the two modes are compared in one run on one machine.
//!
//! 1. **Idle baseline**: the oslat probe on the target CPU, with the process-context load on
//!    the other CPUs and the probe's own local operations, but no drains (in remote mode, so
//!    that no worker thread of ours exists on the target). Its gaps are the machine's own
//!    noise, against which each scenario's interruptions (gaps of 5 us or more) are counted.
//!    The run also counts the target's tick in every scenario, and what of its own ran there
//!    besides the probe ([`crate::tick`]): on a `nohz_full` target the idle baseline must not
//!    keep the tick on, and the report warns when it does.
//! 2. For each mm workload, **queue** then **remote**: the same, plus a requester on a
//!    housekeeping CPU draining every CPU at a fixed rate. In queue mode each drain that finds
//!    the target's cache non-empty wakes the target's worker, which preempts the probe; in
//!    remote mode the requester takes the target's lock and drains it from its own CPU. The
//!    probe counts its own involuntary context switches over each round, so each scenario
//!    also reports *probe preemptions per drain* (FIDELITY 1): about 1 in queue mode, about 0
//!    in remote mode, beside the gap-based figure that also carries the vCPU's own noise.
//! 3. With fenced mode, for the first workload, two more fenced rows whose owner touches its
//!    lock only once per 200 us: `fenced-idle-<workload>`, which never answers the requester's
//!    flags (each costs a fence), and `fenced-poll-<workload>`, the same owner polling its
//!    binding at every turn of its loop (`Binding::poll`), as a poll loop would, which answers
//!    them from there.
//!
//! The scenarios are **interleaved**: each of `--rounds` rounds (default 3) runs every scenario
//! for its share of the duration, and each scenario's figures are the sum of its rounds. The
//! noise of this kind of machine drifts over tens of seconds; interleaving puts the same drift
//! on the baseline and on both modes.
//!
//! Results are written after every scenario round (every scenario's JSON so far, then the
//! summary and the plots), so an interrupted run keeps what it measured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use qpw_core::{CpuSet, Mode};

use crate::cli::RunArgs;
use crate::clock::Calibration;
use crate::cpus::Cpus;
use crate::defaults::BUSY_OWNER;
use crate::kernel::info::KernelInfo;
use crate::rt::{self, Warnings};
use crate::table;
use crate::trace::tracefs;
use crate::validate;
use crate::workload::WorkloadName;

mod acc;
mod attribution;
mod conclude;
mod figures;
mod files;
mod report;
mod round;

use acc::Acc;

/// A drain that waits this long counts as a stall: well under RT throttling's 1 s period, in
/// which a starved worker gets in after 0.95 s (see `--stall-threshold`).
const STALL_THRESHOLD: Duration = Duration::from_millis(100);

/// With `--isolate`: the idle baseline run in every round without the isolation.
pub const UNISOLATED: &str = "idle-unisolated";

/// Gap histogram: 10 ns buckets up to 500 us, exact past that (the probe's loop turns in a few
/// tens of ns, so its p99 needs buckets finer than 100 ns to be a figure, not a bucket's edge).
const GAP_WIDTH_NS: u64 = 10;
const GAP_BUCKETS: usize = 50_000;

/// The interruption threshold: a gap of 5 us or more. Fixed rather than derived from the idle
/// baseline: a derived one (twice the idle p99.99) fell among gaps that hold the probe's own
/// operation and moved between 1.0 and 3.6 us from run to run, inside a dense band of this
/// kind of VM's noise; 5 us is above both, and the rate at 2, 10 and 20 us is reported beside
/// it (`per_second_at_us`).
pub const THRESHOLD_NS: u64 = 5000;
/// The other thresholds the counts are given at.
const OTHER_THRESHOLDS_NS: [u64; 4] = [2000, 5000, 10_000, 20_000];

/// A round with fewer drains reaching the target than this gives no excess per drain: the
/// idle baseline's noise, scaled to the round, would swamp it (kernel-lru triggers 2 drains a
/// second).
const MIN_ROUND_DRAINS: u64 = 50;

/// The idle-owner scenarios' period (`fenced-idle-<workload>`, `fenced-poll-<workload>`): the
/// owner spins and touches its lock only this often, enough to give the drains something to
/// take, too seldom to answer a requester's flag from its lock: the fence lands instead,
/// unless the owner polls its binding between its operations.
const IDLE_OWNER: Duration = Duration::from_micros(200);

/// The options of a bare `qpw-emu`.
pub fn default_args() -> RunArgs {
    RunArgs {
        duration: "5s".into(),
        out: None,
        workloads: None,
        modes: None,
        drain_rate: None,
        target: None,
        rtprio: None,
        local_op_every: BUSY_OWNER.into(),
        rounds: "3".into(),
        isolate: false,
        quiet: false,
    }
}

/// Runs the experiment.
pub fn run(args: &RunArgs) -> Result<()> {
    if args.isolate {
        crate::isolate::check_root()?;
    }
    let cpus = Cpus::read()?;
    let duration = validate::duration("--duration", &args.duration)?;
    let rate_given = args
        .drain_rate
        .as_deref()
        .map(|r| validate::float_in("--drain-rate", r, 1.0, 100_000.0))
        .transpose()?;
    let rate = rate_given.unwrap_or(1000.0);
    let target = match &args.target {
        Some(t) => validate::cpu("--target", t, &cpus.allowed)?,
        None => cpus.target,
    };
    let rtprio = validate::opt_int_in("--rtprio", args.rtprio.as_deref(), 1, 99)?.map(|p| p as i32);
    let every = validate::op_interval("--local-op-every", &args.local_op_every)?;
    let modes: Vec<Mode> = match &args.modes {
        Some(list) => {
            let mut modes = Vec::new();
            for m in list.split(',') {
                let mode = crate::drain::parse_mode(m)
                    .map_err(|_| anyhow!("--modes {list}: `{m}` is not queue, remote or fenced"))?;
                if modes.contains(&mode) {
                    return Err(anyhow!(
                        "--modes {list}: `{}` is given twice; give each of queue, remote, \
                         fenced once",
                        m.trim()
                    ));
                }
                modes.push(mode);
            }
            modes
        }
        None => vec![Mode::Queue, Mode::Remote, Mode::Fenced],
    };
    let mut notes = Vec::new();
    let asked: Vec<WorkloadName> = match &args.workloads {
        Some(list) => list
            .split(',')
            .map(|w| {
                w.trim()
                    .parse::<WorkloadName>()
                    .map_err(|e| anyhow!("--workloads {list}: {e}"))
            })
            .collect::<Result<_>>()?,
        None => WorkloadName::DEFAULT_EXPERIMENT.to_vec(),
    };
    for (i, w) in asked.iter().enumerate() {
        if asked[..i].contains(w) {
            return Err(anyhow!(
                "--workloads {}: `{w}` is given twice; give each workload once",
                args.workloads.as_deref().unwrap_or_default()
            ));
        }
    }
    // With root and tracefs: the kernel's own drains too, and every scenario traced.
    let tracing = match tracefs::preflight().and_then(|()| tracefs::available()) {
        Ok(()) => true,
        Err(e) => {
            notes.push(format!(
                "no kernel rows and no attribution of the target's interruptions: {e:#}"
            ));
            false
        }
    };
    // What each kernel workload's preflight left ready (kernel-pcp's held page), for the run.
    let mut ready: BTreeMap<String, crate::kernel::Ready> = BTreeMap::new();
    let asked: Vec<WorkloadName> = if args.workloads.is_none() && tracing {
        let mut all = asked;
        for k in crate::kernel::KernelDrain::ALL {
            if k == crate::kernel::KernelDrain::Memcg
                && args.isolate
                && crate::isolate::makes_v2_partition()
            {
                notes.push(format!(
                    "no {k} row: {}",
                    crate::isolate::NO_MEMCG_UNDER_PARTITION
                ));
                continue;
            }
            match crate::kernel::preflight(k) {
                Ok(r) => {
                    ready.insert(k.name().to_string(), r);
                    all.push(WorkloadName::Kernel(k));
                }
                Err(e) => notes.push(format!("no {k} row: {e:#}")),
            }
        }
        all
    } else {
        for k in asked.iter().filter_map(|w| w.kernel()) {
            ready.insert(k.name().to_string(), crate::kernel::preflight(k)?);
        }
        asked
    };
    let mut workloads = Vec::new();
    for w in asked {
        if !workloads.contains(&w) {
            workloads.push(w);
        }
    }
    let target_set = CpuSet::from_iter([target]);
    let housekeeping = cpus.housekeeping(&target_set).ok_or_else(|| {
        anyhow!(
            "the default experiment needs two CPUs (a target and a housekeeping CPU); only {} \
             is allowed",
            cpus.allowed
        )
    })?;
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => PathBuf::from("results").join(rt::local_time("%Y%m%d-%H%M%S")),
    };
    validate::output_dir("--out", &out)?;

    let quiet = args.quiet;
    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    let _rt = rt::prepare(true, &mut warnings, quiet);
    // The main thread, and every thread it starts until that thread pins itself, stays off
    // the target: on a machine without isolcpus a new thread may otherwise run its first
    // instructions there (seen in the trace as one run of `qpw-emu`, `qpw/0`, the requester).
    let _away = rt::AwayFrom::cpus(&target_set);
    if !args.isolate {
        rt::check_isolation(&target_set, &mut warnings, quiet);
    }
    if rtprio.is_none() {
        notes.push(
            "the probe runs SCHED_OTHER (no -f): the queue-mode worker preempts it (interruptions) \
             instead of starving behind it (stalls)"
                .to_string(),
        );
    }
    rt::catch_sigint(&mut warnings, quiet);
    let calibration = Calibration::measure();
    let rounds = validate::int_in("--rounds", &args.rounds, 1, 100)? as u32;
    let emulated = workloads.iter().filter(|w| w.kernel().is_none()).count();
    let n_scen = 1
        + usize::from(args.isolate)
        + (workloads.len() - emulated)
        + emulated * modes.len()
        + usize::from(emulated > 0 && modes.contains(&Mode::Fenced));
    let chunk = duration / rounds;
    if !quiet {
        eprintln!(
            "qpw-emu: target cpu {target}, requester on cpu {housekeeping}, load on {}; {n_scen} \
             scenarios of {:.1} s, interleaved in {rounds} rounds (about {:.0} s); results in {}",
            cpus.allowed.difference(&target_set),
            duration.as_secs_f64(),
            n_scen as f64 * (duration.as_secs_f64() + 0.3 * f64::from(rounds)),
            out.display()
        );
    }

    // The scenarios: the idle baseline, then each workload in each mode.
    let base_workload = workloads.first().copied().unwrap_or(WorkloadName::Lru);
    let base_workload = if base_workload.kernel().is_some() {
        WorkloadName::Lru
    } else {
        base_workload
    };
    // The idle baselines in remote mode: the same lock on the probe's path as queue mode's,
    // and no worker thread of the target's that could run there.
    let mut scenarios = vec![Acc::new("idle", Mode::Remote, base_workload, 0.0)];
    if args.isolate {
        scenarios.push(Acc::new(UNISOLATED, Mode::Remote, base_workload, 0.0));
    }
    for &w in &workloads {
        if let Some(k) = w.kernel() {
            // The kernel decides its own mode (mode 1, remote, for drain_all_pages since 6.0);
            // its drains go at a rate that suits their cost.
            let rate = rate_given.unwrap_or_else(|| k.default_rate_hz());
            let mode = if k.is_remote() {
                Mode::Remote
            } else {
                Mode::Queue
            };
            scenarios.push(Acc::new(w.name(), mode, w, rate));
            continue;
        }
        for &mode in &modes {
            scenarios.push(Acc::new(&format!("{mode}-{w}"), mode, w, rate));
        }
        // The fenced owner that hardly touches its lock, once (for the first workload): its
        // CPU does not answer, so each flag costs a fence; and the same owner polling.
        if modes.contains(&Mode::Fenced) && !scenarios.iter().any(|a| a.every.is_some()) {
            let mut idle = Acc::new(&format!("fenced-idle-{w}"), Mode::Fenced, w, rate);
            idle.every = Some(IDLE_OWNER);
            scenarios.push(idle);
            // The same owner as a poll loop would be (issue 34): between its rare operations
            // it polls its binding, and answers the requester's flags from there.
            let mut polling = Acc::new(&format!("fenced-poll-{w}"), Mode::Fenced, w, rate);
            polling.every = Some(IDLE_OWNER);
            polling.polls = true;
            scenarios.push(polling);
        }
    }
    let mut ctx = Ctx {
        out,
        start_time,
        target,
        housekeeping,
        duration,
        chunk,
        rounds,
        every,
        rtprio,
        calibration,
        quiet,
        cpus,
        total_chunks: scenarios.len() as u32 * rounds,
        done: 0,
        scenarios,
        files: Vec::new(),
        notes,
        warnings,
        tracing,
        kernel: KernelInfo::read(),
        interrupted: false,
        isolate: args.isolate,
        isolation: None,
        isolation_report: None,
        nohz_full: crate::tick::is_nohz_full(target),
        ready,
    };

    // Every round runs every scenario once, so that slow drifts in the machine's noise fall on
    // all of them alike.
    'rounds: for round in 0..rounds {
        for i in 0..ctx.scenarios.len() {
            if rt::interrupted() {
                ctx.note_interruption(round, i);
                break 'rounds;
            }
            ctx.isolate_for(i)?;
            ctx.run_round(i, round)?;
            ctx.write_all()?;
        }
    }
    // Put back what --isolate changed before the report, so that nothing waits on the reader,
    // and give kernel-pcp's held page back.
    ctx.isolation = None;
    ctx.ready.clear();
    ctx.conclude();
    ctx.write_all()?;
    let rows = ctx.rows();
    print!(
        "{}",
        table::table(&rows, Some(ctx.target), ctx.threshold().map(|t| t.0))
    );
    ctx.print_attribution();
    ctx.print_tick();
    println!();
    for n in &ctx.notes {
        println!("note: {n}");
    }
    for w in ctx.warnings.list() {
        println!("warning: {w}");
    }
    println!("\nResults: {}", ctx.out.display());
    println!("  {}", ctx.out.join("summary.json").display());
    for f in &ctx.files {
        println!("  {f}");
    }
    Ok(())
}

struct Ctx {
    out: PathBuf,
    start_time: String,
    target: usize,
    housekeeping: usize,
    duration: Duration,
    chunk: Duration,
    rounds: u32,
    every: Duration,
    rtprio: Option<i32>,
    calibration: Calibration,
    quiet: bool,
    cpus: Cpus,
    scenarios: Vec<Acc>,
    /// Scenario rounds done, and to do in all (for the progress line).
    done: u32,
    total_chunks: u32,
    files: Vec<String>,
    notes: Vec<String>,
    warnings: Warnings,
    /// Whether every scenario is traced.
    tracing: bool,
    kernel: KernelInfo,
    /// Whether Ctrl-C ended the run early.
    interrupted: bool,
    /// `--isolate`: the target isolated for every scenario but [`UNISOLATED`].
    isolate: bool,
    /// The isolation in force, if any.
    isolation: Option<crate::isolate::Isolation>,
    /// What the first isolation did.
    isolation_report: Option<crate::isolate::IsolationReport>,
    /// Whether the kernel runs the target tickless (`nohz_full`).
    nohz_full: bool,
    /// What each kernel workload's preflight left ready (kernel-pcp's held page, given back
    /// when the run ends, whichever way).
    ready: BTreeMap<String, crate::kernel::Ready>,
}
