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
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use qpw_core::{CpuSet, Mode};

use crate::cli::RunArgs;
use crate::clock::Calibration;
use crate::cpus::Cpus;
use crate::defaults::BUSY_OWNER;
use crate::drain::note_outcome;
use crate::hist::Histogram;
use crate::json::{self, Interruptions, ProbePreemptions, QpwFields, Settings, ThreadFigures};
use crate::kernel::info::KernelInfo;
use crate::load::{LoadReport, Phase, RequesterReport};
use crate::oslat::{self, oslat_json, OslatConfig, OslatRun};
use crate::rt::{self, SysInfo, Warnings};
use crate::scenario::{self, DrainSpec};
use crate::svg::{self, Series};
use crate::table::{self, Row};
use crate::trace::{tracefs, Session};
use crate::validate;
use crate::workload::WorkloadName;

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

/// The experiment's summary file.
#[derive(Debug, serde::Serialize)]
struct Summary {
    /// rt-tests' format version, kept for tools that check it.
    file_version: u32,
    /// The command line.
    #[serde(rename = "cmdline:")]
    cmdline: String,
    /// The rt-tests format version (`2.40`), as in the scenario files.
    #[serde(rename = "rt_test_version:")]
    rt_test_version: String,
    /// Our version.
    qpw_emu_version: String,
    /// When the experiment started.
    start_time: String,
    /// When this summary was written (after the last scenario so far).
    end_time: String,
    /// 0.
    return_code: i32,
    /// The system.
    sysinfo: SysInfo,
    /// `qpw-emu run`.
    tool: String,
    /// The measured CPU.
    target_cpu: usize,
    /// The requester's CPU.
    housekeeping_cpu: usize,
    /// Seconds per scenario, over all rounds.
    scenario_seconds: f64,
    /// Rounds: each runs every scenario once, interleaved.
    rounds: u32,
    /// Requester drains per second.
    drain_rate_hz: f64,
    /// The interruption threshold and its rule.
    threshold_us: Option<f64>,
    /// How the threshold was derived.
    threshold_rule: Option<String>,
    /// One row per scenario done.
    rows: Vec<Row>,
    /// Each scenario's JSON file.
    files: Vec<String>,
    /// What the reader should know about the comparison.
    notes: Vec<String>,
    /// Setup steps that failed.
    warnings: Vec<String>,
    /// The running kernel's per-CPU-work mode, isolation and RT throttling.
    kernel: KernelInfo,
    /// With tracing: per scenario, what the target's interruptions were (and, for the kernel
    /// workloads, the work items run on the target).
    attribution: Vec<ScenarioAttribution>,
    /// Whether the kernel runs the target tickless (`nohz_full`).
    target_nohz_full: bool,
    /// Per scenario: the target's local timer interrupts, and (with tracing) the timers that
    /// fired there and the run's own tasks that ran there besides the probe.
    tick: Vec<crate::tick::TargetTick>,
    /// Whether Ctrl-C ended the run before every round of every scenario ran (the notes say
    /// which scenarios were cut short or left out).
    interrupted: bool,
}

/// What the trace of the target said about one scenario.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct ScenarioAttribution {
    /// The scenario.
    scenario: String,
    /// The target's interruptions (gaps at or above the threshold) by what ran in them:
    /// `qpw` (our worker), `kernel` (kworkers), `other`, `unexplained`.
    by_bucket: BTreeMap<String, u64>,
    /// The sources, most gap time first (the first 8).
    top: Vec<crate::trace::SourceFigures>,
    /// For a kernel workload: its drains, and the runs of its work function on the target.
    kernel_work: Option<KernelWork>,
    /// Events the trace lost in this scenario.
    lost_events: u64,
}

/// The kernel's work on the target for one kernel workload.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct KernelWork {
    /// The work function.
    function: String,
    /// Drains (triggers) done.
    drains: u64,
    /// Runs of the work function on the target.
    runs: u64,
    /// Runs per drain.
    runs_per_drain: Option<f64>,
    /// The target's interruptions attributed to this work function (a kworker running it).
    gaps: u64,
    /// Their total time, in microseconds.
    gaps_us: f64,
    /// Run time p50, p99 and max, in microseconds.
    p50_us: f64,
    /// 99th percentile.
    p99_us: f64,
    /// Longest.
    max_us: f64,
    /// The times a task other than the filler took the target from the probe (a kworker, any
    /// other thread; the filler runs there before every trigger by design), from the trace.
    preempted_not_filler: u64,
    /// The same per drain.
    preempted_not_filler_per_drain: Option<f64>,
    /// Other work items run on the target during the scenario, by function (not the drain's:
    /// the kernel's periodic work, or the trigger's side effects).
    other_work: BTreeMap<String, u64>,
    /// kernel-pcp: who drained the target's pcp pages, and what was queued to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pcp: Option<crate::kernel::pcp::PcpReport>,
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

/// What one round of a scenario measured on the target, kept apart so that each round can be
/// compared with the idle baseline of the same round.
struct RoundPart {
    hist: Histogram,
    seconds: f64,
    target_drains: u64,
    /// The probe thread's context switches, involuntary plus voluntary.
    probe_switches: u64,
}

/// One scenario's measurements, accumulated over the rounds.
struct Acc {
    name: String,
    mode: Mode,
    workload: WorkloadName,
    rate: f64,
    hist: Histogram,
    op_hist: Histogram,
    op_time: Histogram,
    seconds: f64,
    local_ops: u64,
    local_op_errors: u64,
    /// The probe thread's involuntary context switches.
    probe_switches: u64,
    /// The probe thread's voluntary context switches (it slept, waiting for its lock).
    probe_voluntary: u64,
    requester: Option<(RequesterReport, crate::load::DrainTimes)>,
    load: LoadReport,
    target_drains: u64,
    qpw_desc: String,
    rounds: u32,
    /// The target's figures of each round, in order.
    by_round: Vec<RoundPart>,
    /// With tracing: what the target's interruptions were.
    attribution: ScenarioAttribution,
    /// With tracing, for a kernel workload: each run of its work function on the target, in
    /// microseconds.
    work_us: Vec<f64>,
    /// Whether Ctrl-C cut one of its rounds short.
    cut_short: bool,
    /// The probe's local operation period, when the scenario has its own (`fenced-idle-*`,
    /// `fenced-poll-*`).
    every: Option<Duration>,
    /// Whether the probe polls its binding at every turn of its loop (`fenced-poll-*`).
    polls: bool,
    /// The target's tick over the rounds, and the run's own tasks there.
    tick: crate::tick::TargetTick,
}

impl Acc {
    fn new(name: &str, mode: Mode, workload: WorkloadName, rate: f64) -> Self {
        Self {
            name: name.to_string(),
            mode,
            workload,
            rate,
            hist: Histogram::new(GAP_BUCKETS, GAP_WIDTH_NS),
            op_hist: Histogram::new(GAP_BUCKETS, GAP_WIDTH_NS),
            op_time: oslat::op_time_hist(),
            seconds: 0.0,
            local_ops: 0,
            local_op_errors: 0,
            probe_switches: 0,
            probe_voluntary: 0,
            requester: None,
            load: LoadReport::default(),
            target_drains: 0,
            qpw_desc: String::new(),
            rounds: 0,
            by_round: Vec::new(),
            attribution: ScenarioAttribution {
                scenario: name.to_string(),
                ..ScenarioAttribution::default()
            },
            work_us: Vec::new(),
            every: None,
            polls: false,
            cut_short: false,
            tick: crate::tick::TargetTick {
                scenario: name.to_string(),
                ..Default::default()
            },
        }
    }
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

/// Gaps kept for attribution: from 1 us, so that the threshold can be derived afterwards.
const GAP_LOG_NS: u64 = 1000;

impl Ctx {
    /// With `--isolate`: the target isolated for scenario `i`, unless it is the unisolated
    /// baseline, for which the isolation is put back first.
    fn isolate_for(&mut self, i: usize) -> Result<()> {
        if !self.isolate {
            return Ok(());
        }
        if self.scenarios[i].name == UNISOLATED {
            self.isolation = None;
            return Ok(());
        }
        if self.isolation.is_none() {
            let target = CpuSet::from_iter([self.target]);
            let housekeeping = self.cpus.allowed.difference(&target);
            let iso = crate::isolate::Isolation::apply(&target, &housekeeping)?;
            if self.isolation_report.is_none() {
                iso.report.say(self.quiet);
                self.isolation_report = Some(iso.report.clone());
            }
            self.isolation = Some(iso);
        }
        Ok(())
    }

    /// One round of scenario `i`, merged into its accumulator.
    fn run_round(&mut self, i: usize, round: u32) -> Result<()> {
        let target_set = CpuSet::from_iter([self.target]);
        let acc = &self.scenarios[i];
        let spec = DrainSpec {
            mode: acc.mode,
            workload: acc.workload,
            drain_rate_hz: acc.rate,
            force: false,
            timeout: Duration::from_secs(1),
            stall_threshold: STALL_THRESHOLD,
            load_cpus: self.cpus.allowed.difference(&target_set),
            requester_cpu: self.housekeeping,
            local_op_every: acc.every.unwrap_or(self.every),
            owner_polls: acc.polls,
            requester_prio: None,
            target_cpu: self.target,
            kernel_ready: self
                .ready
                .get(acc.name.as_str())
                .cloned()
                .unwrap_or_default(),
        };
        let session = if self.tracing {
            match Session::start(&target_set, Some(self.housekeeping)) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.warnings.push(
                        self.quiet,
                        format!("tracing stopped: cannot start the trace ({e:#})"),
                    );
                    self.tracing = false;
                    None
                }
            }
        } else {
            None
        };
        let setup = scenario::setup(&spec)?;
        let cfg = OslatConfig {
            cpus: target_set,
            duration: self.chunk,
            warmup: Duration::from_millis(100),
            single_preheat: false,
            bias: false,
            memmove_bytes: None,
            main_cpus: None,
            bucket_size: GAP_BUCKETS,
            bucket_width_ns: GAP_WIDTH_NS,
            rtprio: self.rtprio,
            trace_threshold_ns: None,
            local_op: setup.local_op(),
            announce_start: false,
            quiet: self.quiet,
            label: format!("{} ({}/{})", acc.name, round + 1, self.rounds),
            progress_span: Some((self.chunk * self.done, self.chunk * self.total_chunks)),
            gap_log_ns: session.as_ref().map(|_| GAP_LOG_NS),
        };
        let phase: std::sync::Arc<Phase> = setup.phase.clone();
        let qpw_desc = setup.describe();
        let loc_before = (
            crate::tick::local_timer_count(self.target),
            crate::clock::monotonic_ns(),
        );
        let run = oslat::run(&cfg, self.calibration, &phase);
        let loc_after = (
            crate::tick::local_timer_count(self.target),
            crate::clock::monotonic_ns(),
        );
        let outcome = setup.finish(Some(self.target))?;
        let run: OslatRun = run?;
        let quiet = self.quiet;
        self.warnings.extend(quiet, run.warnings.clone());
        note_outcome(&outcome, &mut self.warnings, quiet);
        let Some(thread) = run.threads.first() else {
            return Err(anyhow!("the probe measured nothing"));
        };
        let acc = &mut self.scenarios[i];
        acc.hist.merge(&thread.hist);
        acc.op_hist.merge(&thread.op_hist);
        acc.op_time.merge(&thread.op_time);
        acc.seconds += thread.duration_s;
        acc.local_ops += thread.local_ops;
        acc.local_op_errors += thread.local_op_errors;
        acc.probe_switches += thread.involuntary_switches;
        acc.probe_voluntary += thread.voluntary_switches;
        acc.target_drains += outcome.target_drains;
        acc.load.ops += outcome.load.ops;
        acc.load.errors += outcome.load.errors;
        acc.load.cpus = outcome.load.cpus.clone();
        if acc.load.first_error.is_none() {
            acc.load.first_error.clone_from(&outcome.load.first_error);
        }
        if let (Some(r), Some(h)) = (&outcome.requester, &outcome.requester_hist) {
            match &mut acc.requester {
                Some((total, hist)) => {
                    total.add_counts(r);
                    hist.merge(h);
                    total.set_times(hist);
                }
                None => acc.requester = Some((r.clone(), h.clone())),
            }
        }
        acc.by_round.push(RoundPart {
            hist: thread.hist.clone(),
            seconds: thread.duration_s,
            target_drains: outcome.target_drains,
            probe_switches: thread.involuntary_switches + thread.voluntary_switches,
        });
        acc.tick.add_loc(
            loc_before.0,
            loc_after.0,
            loc_after.1.saturating_sub(loc_before.1) as f64 / 1e9,
        );
        acc.qpw_desc = qpw_desc;
        acc.rounds += 1;
        acc.cut_short |= run.interrupted;
        self.done += 1;
        if let Some(session) = session {
            let traced = session.finish()?;
            self.attribute_round(i, &traced, thread, &outcome);
        }
        Ok(())
    }

    /// Matches one round's gaps at the threshold (the idle baseline's so far; the idle
    /// scenario runs first in every round) and adds them to scenario `i`'s attribution.
    fn attribute_round(
        &mut self,
        i: usize,
        traced: &crate::trace::Traced,
        thread: &crate::oslat::OslatThread,
        outcome: &scenario::Outcome,
    ) {
        // The idle scenario of this round is merged into its accumulator only afterwards: for
        // it, derive the threshold from its own gaps.
        let threshold_ns = THRESHOLD_NS;
        let conv = crate::probe_trace::ticks_to_us(&traced.clock, self.calibration);
        let gaps: Vec<(u64, u64)> = thread
            .gaps
            .iter()
            .copied()
            .filter(|&(a, b)| self.calibration.to_ns(b - a) >= threshold_ns)
            .collect();
        let a = traced.attribute_gaps(
            self.target,
            thread.tid,
            &gaps,
            thread.gaps_not_kept,
            threshold_ns as f64 / 1000.0,
            &conv,
        );
        // For a kernel workload, the gaps its own work function made (before `a` is consumed).
        let kernel_fns: Vec<String> = self.scenarios[i]
            .workload
            .kernel()
            .map(|k| {
                k.drain_functions()
                    .iter()
                    .map(|f| format!("kworker {f}"))
                    .collect()
            })
            .unwrap_or_default();
        let (fn_gaps, fn_gaps_us) = a
            .top
            .iter()
            .filter(|s| kernel_fns.contains(&s.source))
            .fold((0, 0.0), |(n, t), s| (n + s.count, t + s.total_us));
        // Everything that took the target from the probe over the round: the run's own tasks
        // among it, and the timers that fired there.
        let noise = traced
            .noise(Some(thread.tid), &conv)
            .into_iter()
            .find(|n| n.cpu == self.target);
        let (timers, kept) = traced
            .timeline
            .cpus
            .get(&self.target)
            .map(|t| (t.timers.clone(), t.tick_kept.clone()))
            .unwrap_or_default();
        // The times a task other than the filler (and other than the idle task: the probe
        // slept) took the target from the probe.
        let preempted_not_filler: u64 = noise.as_ref().map_or(0, |n| {
            n.top
                .iter()
                .filter(|s| s.class == "thread" && s.source != "qpw-filler" && s.source != "idle")
                .map(|s| s.count)
                .sum()
        });
        let ours = traced.tasks_of(
            self.target,
            thread.tid,
            thread.window,
            std::process::id() as i32,
            &["qpw-filler"],
            &conv,
        );
        let mut other_work: BTreeMap<String, u64> = BTreeMap::new();
        let acc = &mut self.scenarios[i];
        if let Some(n) = &noise {
            acc.tick.add_trace(&timers, &kept, &ours, n.seconds);
        }
        for (k, v) in a.by_bucket {
            *acc.attribution.by_bucket.entry(k).or_default() += v;
        }
        if let Some(lost) = a.by_class.get("lost") {
            *acc.attribution.by_bucket.entry("lost".into()).or_default() += lost.count;
        }
        acc.attribution.lost_events += traced.lost_events;
        let mut top: BTreeMap<String, crate::trace::SourceFigures> = acc
            .attribution
            .top
            .drain(..)
            .map(|s| (s.source.clone(), s))
            .collect();
        for s in a.top {
            let e = top
                .entry(s.source.clone())
                .or_insert_with(|| crate::trace::SourceFigures {
                    source: s.source.clone(),
                    class: s.class.clone(),
                    ..Default::default()
                });
            e.count += s.count;
            e.total_us += s.total_us;
            e.max_us = e.max_us.max(s.max_us);
        }
        let mut top: Vec<_> = top.into_values().collect();
        top.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
        top.truncate(8);
        acc.attribution.top = top;
        if let Some(k) = acc.workload.kernel() {
            let names = k.drain_functions();
            // The name this kernel uses, as seen on the target (else the newest).
            let mut function = names[0];
            if let Some(t) = traced.timeline.cpus.get(&self.target) {
                if let Some(w) = t.work.iter().find(|w| names.contains(&w.function.as_str())) {
                    function = names
                        .iter()
                        .copied()
                        .find(|n| *n == w.function)
                        .unwrap_or(function);
                }
                let runs: Vec<f64> = t
                    .work
                    .iter()
                    .filter(|w| names.contains(&w.function.as_str()))
                    .map(|w| conv(w.end.saturating_sub(w.start)))
                    .collect();
                // A mode-0 drain "reaches" the target when its work function runs there; a
                // mode-1 drain (kernel-pcp) reaches it from the requester, at every trigger.
                let reached = if k.is_remote() {
                    outcome.requester.as_ref().map_or(0, |r| r.drains)
                } else {
                    runs.len() as u64
                };
                acc.target_drains += reached;
                if let Some(last) = acc.by_round.last_mut() {
                    last.target_drains = reached;
                }
                acc.work_us.extend(runs);
                for w in t
                    .work
                    .iter()
                    .filter(|w| !names.contains(&w.function.as_str()))
                {
                    *other_work.entry(w.function.clone()).or_default() += 1;
                }
            }
            let drains = outcome.requester.as_ref().map_or(0, |r| r.drains);
            let work = acc
                .attribution
                .kernel_work
                .get_or_insert_with(|| KernelWork {
                    function: function.to_string(),
                    ..KernelWork::default()
                });
            if function != names[0] {
                work.function = function.to_string();
            }
            work.drains += drains;
            work.gaps += fn_gaps;
            work.gaps_us += fn_gaps_us;
            for (f, n) in other_work {
                *work.other_work.entry(f).or_default() += n;
            }
            work.preempted_not_filler += preempted_not_filler;
            work.preempted_not_filler_per_drain =
                (work.drains > 0).then(|| work.preempted_not_filler as f64 / work.drains as f64);
            if let Some(p) = outcome
                .requester
                .as_ref()
                .and_then(|r| r.kernel_pcp.as_ref())
            {
                work.pcp.get_or_insert_with(Default::default).add(p);
            }
            work.runs = acc.work_us.len() as u64;
            work.runs_per_drain = (work.drains > 0).then(|| work.runs as f64 / work.drains as f64);
            let mut d = acc.work_us.clone();
            d.sort_by(f64::total_cmp);
            if !d.is_empty() {
                let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
                (work.p50_us, work.p99_us, work.max_us) = (at(0.5), at(0.99), at(1.0));
            }
        }
    }

    /// The interruption threshold, once the idle baseline has measured something.
    fn threshold(&self) -> Option<(u64, String)> {
        self.scenarios
            .first()
            .filter(|idle| idle.hist.count() > 0)
            .map(|_| {
                (
                    THRESHOLD_NS,
                    "fixed at 5 us: above the probe's own operation and this kind of VM's dense \
                     band of 1-3 us noise (per_second_at_us: the rate at other thresholds)"
                        .to_string(),
                )
            })
    }

    fn baseline_rate(&self) -> f64 {
        self.scenarios
            .first()
            .map_or(0.0, |idle| self.rate_at_threshold(idle))
    }

    /// A scenario's excess interruptions per drain in each round, against the idle rate of the
    /// same round (the idle scenario runs first in every round), or `pooled_baseline` for a
    /// round the idle scenario has no slice of.
    fn excess_by_round(
        &self,
        acc: &Acc,
        threshold_ns: u64,
        pooled_baseline: f64,
    ) -> Vec<Option<f64>> {
        let idle = self
            .scenarios
            .first()
            .map(|idle| idle.by_round.as_slice())
            .unwrap_or_default();
        acc.by_round
            .iter()
            .enumerate()
            .map(|(k, part)| {
                // Kernel rows run without the probe's local operation and the load, unlike the
                // idle baseline: no excess against it (the trace's gaps per drain stand in).
                if part.target_drains < MIN_ROUND_DRAINS || acc.workload.kernel().is_some() {
                    return None;
                }
                let baseline = idle
                    .get(k)
                    .filter(|i| i.seconds > 0.0)
                    .map_or(pooled_baseline, |i| {
                        i.hist.count_at_least(threshold_ns) as f64 / i.seconds
                    });
                let count = part.hist.count_at_least(threshold_ns) as f64;
                Some((count - baseline * part.seconds) / part.target_drains as f64)
            })
            .collect()
    }

    /// A scenario's JSON document, from what it has accumulated.
    fn document(&self, acc: &Acc) -> crate::json::Envelope<crate::json::OslatBody> {
        let threshold = self.threshold();
        let baseline = self.baseline_rate();
        let seconds = acc.seconds.max(1e-9);
        let interruptions = threshold.map(|(ns, rule)| {
            let count = acc.hist.count_at_least(ns);
            let excess = count as f64 - baseline * seconds;
            let by_round = self.excess_by_round(acc, ns, baseline);
            let known: Vec<f64> = by_round.iter().flatten().copied().collect();
            let se = (known.len() >= 2).then(|| {
                let n = known.len() as f64;
                let mean = known.iter().sum::<f64>() / n;
                let var = known.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
                (var / n).sqrt()
            });
            Interruptions {
                threshold_us: ns as f64 / 1000.0,
                rule,
                count,
                per_second: count as f64 / seconds,
                baseline_per_second: baseline,
                during_local_op: acc.op_hist.count_at_least(ns),
                drains_reaching_target: acc.target_drains,
                // Pooled over the run only where the rounds give a figure too.
                excess_per_drain: (acc.target_drains > 0 && !known.is_empty())
                    .then(|| excess / acc.target_drains as f64),
                excess_per_drain_median: median(known.iter()),
                excess_per_drain_se: se,
                excess_per_drain_by_round: by_round,
                per_second_at_us: rates_at_thresholds(acc),
            }
        });
        let per_drain =
            |switches: u64, drains: u64| (drains > 0).then(|| switches as f64 / drains as f64);
        let preemptions_by_round: Vec<Option<f64>> = acc
            .by_round
            .iter()
            .map(|part| per_drain(part.probe_switches, part.target_drains))
            .collect();
        let probe_preemptions = ProbePreemptions {
            count: acc.probe_switches,
            voluntary: acc.probe_voluntary,
            drains_reaching_target: acc.target_drains,
            per_drain: per_drain(acc.probe_switches + acc.probe_voluntary, acc.target_drains),
            per_drain_median: median(preemptions_by_round.iter().flatten()),
            per_drain_by_round: preemptions_by_round,
        };
        let spec_mode = (acc.rate > 0.0).then(|| acc.mode.name().to_string());
        let settings = Settings {
            bucket_width_ns: GAP_WIDTH_NS,
            bucket_size: GAP_BUCKETS,
            duration_s: self.chunk.as_secs_f64() * f64::from(acc.rounds),
            rtprio: self.rtprio,
            local_op_every_us: Some(acc.every.unwrap_or(self.every).as_secs_f64() * 1e6),
            interval_us: None,
        };
        let fields = QpwFields {
            tool: "oslat".to_string(),
            scenario: Some(acc.name.clone()),
            mode: spec_mode,
            workload: Some(acc.workload.name().to_string()),
            qpw: Some(acc.qpw_desc.clone()),
            settings: Some(settings),
            percentiles: vec![ThreadFigures::of(
                self.target,
                &acc.hist,
                acc.local_ops,
                acc.local_op_errors,
            )
            .with_op_time(&acc.op_time)],
            interruptions,
            probe_preemptions: Some(probe_preemptions),
            requester: acc.requester.as_ref().map(|r| r.0.clone()),
            rt_throttling: Some(crate::throttling::RtThrottling::read(None)),
            isolation: self
                .isolation_report
                .clone()
                .filter(|_| acc.name != UNISOLATED),
            load: Some(acc.load.clone()),
            stopped_by: acc.cut_short.then(crate::signals::stopped_by),
            interrupted: acc.cut_short,
            warnings: self.warnings.list().to_vec(),
            trace: None,
        };
        let run = OslatRun {
            threads: vec![crate::oslat::OslatThread {
                cpu: self.target,
                hist: acc.hist.clone(),
                op_hist: acc.op_hist.clone(),
                duration_s: acc.seconds,
                local_ops: acc.local_ops,
                op_time: acc.op_time.clone(),
                local_op_errors: acc.local_op_errors,
                first_error: None,
                tid: 0,
                involuntary_switches: acc.probe_switches,
                voluntary_switches: acc.probe_voluntary,
                gaps: Vec::new(),
                gaps_not_kept: 0,
                window: (0, 0),
            }],
            calibration: self.calibration,
            threshold_hit: None,
            bias_ns: None,
            interrupted: false,
            warnings: Vec::new(),
        };
        oslat_json(&run, self.start_time.clone(), fields)
    }

    /// Says in the notes what Ctrl-C left out: it came before scenario `next` of round
    /// `round` (0-based) ran.
    fn note_interruption(&mut self, round: u32, next: usize) {
        self.interrupted = true;
        let cut: Vec<&str> = self
            .scenarios
            .iter()
            .filter(|a| a.cut_short)
            .map(|a| a.name.as_str())
            .collect();
        let skipped: Vec<&str> = self.scenarios[next..]
            .iter()
            .filter(|a| a.rounds > 0)
            .map(|a| a.name.as_str())
            .collect();
        let never: Vec<&str> = self
            .scenarios
            .iter()
            .filter(|a| a.rounds == 0)
            .map(|a| a.name.as_str())
            .collect();
        let list = |v: &[&str]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let by = match crate::signals::stop_signal() {
            "SIGINT" => "Ctrl-C",
            other => other,
        };
        self.notes.push(format!(
            "INTERRUPTED ({by}) in round {} of {}: cut short: {} (marked !); one round fewer \
             than the rest: {}; not run at all (no row): {}. Compare the modes only where both \
             ran the same rounds.",
            round + 1,
            self.rounds,
            list(&cut),
            list(&skipped),
            list(&never)
        ));
    }

    fn rows(&self) -> Vec<Row> {
        self.scenarios
            .iter()
            .filter(|a| a.rounds > 0)
            .map(|a| Row::from_oslat(&a.name, &self.document(a)))
            .collect()
    }

    /// Writes every scenario's JSON, the summary and the plots.
    fn write_all(&mut self) -> Result<()> {
        let mut files = Vec::new();
        for acc in self.scenarios.iter().filter(|a| a.rounds > 0) {
            let file = self.out.join(format!("{}.json", acc.name));
            json::write(&file, &self.document(acc))?;
            files.push(file.display().to_string());
        }
        for f in files {
            if !self.files.contains(&f) {
                self.files.push(f);
            }
        }
        self.write_summary()?;
        self.write_plots()
    }

    /// Compares the modes and says in words what the table shows, or why it does not.
    fn conclude(&mut self) {
        let rows = self.rows();
        let baseline = self.baseline_rate();
        let find = |scen: &str| rows.iter().find(|r| r.name == scen);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
            _ => "n/a".to_string(),
        };
        let two = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}"));
        let ns = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.0} ns"));
        let mut lines = Vec::new();
        for row in &rows {
            let Some(w) = row.name.strip_prefix("queue-") else {
                continue;
            };
            let (Some(q), Some(r)) = (find(&format!("queue-{w}")), find(&format!("remote-{w}")))
            else {
                continue;
            };
            let by_round = |row: &Row| {
                let parts: Vec<String> = row
                    .excess_per_drain_by_round
                    .iter()
                    .map(|&v| two(v))
                    .collect();
                parts.join("/")
            };
            lines.push(format!(
                "{w}: queue/remote drain p50 {}, p99 {}; target interruptions/s {:.0} vs {:.0} \
                 (idle {:.0}); excess interruptions per drain {} vs {} (median of the rounds; \
                 by round {} vs {}); probe preemptions per drain {} vs {}",
                ratio(q.drain_p50, r.drain_p50),
                ratio(q.drain_p99, r.drain_p99),
                q.interruptions_per_s.unwrap_or(0.0),
                r.interruptions_per_s.unwrap_or(0.0),
                baseline,
                two(q.excess_per_drain),
                two(r.excess_per_drain),
                by_round(q),
                by_round(r),
                two(q.preemptions_per_drain),
                two(r.preemptions_per_drain),
            ));
            if q.target_drains == Some(0) {
                lines.push(format!(
                    "{w}: no queue-mode drain reached the target (its cache was always empty when \
                     the requester looked), so no drain could interrupt it"
                ));
            }
            if q.excess_per_drain.unwrap_or(0.0) <= r.excess_per_drain.unwrap_or(0.0) {
                let in_op = r.during_local_op.unwrap_or(0);
                let total = r.interruptions.unwrap_or(0).max(1);
                lines.push(format!(
                    "{w}: in this run the target saw at least as many interruptions per drain in \
                     remote mode as in queue mode, though no worker of ours runs there in remote \
                     mode: {in_op} of its {total} interruptions came while the probe was doing \
                     its own local operation, i.e. waiting for its per-CPU lock (held by the \
                     requester, which in userspace can itself be preempted or blocked while \
                     holding it, unlike under a kernel spinlock); the rest is this machine's \
                     noise ({baseline:.0} interruptions/s idle)"
                ));
            }
        }
        // Fenced mode against remote mode, whether or not queue mode ran.
        for f in &rows {
            let Some(w) = f.name.strip_prefix("fenced-") else {
                continue;
            };
            if let Some(w) = w.strip_prefix("idle-") {
                lines.push(format!(
                    "{w}: with an idle owner (it spins, touching its lock once per {} us), per \
                     drain the target answered {} of the requester's flags and was fenced for {}: \
                     the fence's interrupt lands there (the trace's call_function_single, below); \
                     drain p50 {}",
                    IDLE_OWNER.as_micros(),
                    two(f.answers_per_drain),
                    two(f.fences_per_drain),
                    f.drain_p50.map_or("n/a".into(), |v| format!("{v:.1} us")),
                ));
                continue;
            }
            if let Some(w) = w.strip_prefix("poll-") {
                let remote = find(&format!("remote-{w}"));
                lines.push(format!(
                    "{w}: the same idle owner polling its binding at every turn of its spin loop \
                     (fenced-poll-{w}: Binding::poll, as an owner's poll loop answers requesters \
                     between its operations): per drain the target answered {} of the \
                     requester's flags and was fenced for {}; drain p50 {}, {} remote mode's",
                    two(f.answers_per_drain),
                    two(f.fences_per_drain),
                    f.drain_p50.map_or("n/a".into(), |v| format!("{v:.1} us")),
                    remote.map_or("n/a".into(), |r| ratio(f.drain_p50, r.drain_p50)),
                ));
                continue;
            }
            let Some(r) = find(&format!("remote-{w}")) else {
                continue;
            };
            lines.push(format!(
                "{w}: fenced/remote drain p50 {}, p99 {}; per drain the target answered {} of \
                 the requester's flags and was fenced for {} (a membarrier interrupt each, when \
                 a thread of ours ran there); owner's local op p50 {} vs {}; excess \
                 interruptions per drain {} vs {}; probe context switches per drain {} vs {}",
                ratio(f.drain_p50, r.drain_p50),
                ratio(f.drain_p99, r.drain_p99),
                two(f.answers_per_drain),
                two(f.fences_per_drain),
                ns(f.local_op_ns),
                ns(r.local_op_ns),
                two(f.excess_per_drain),
                two(r.excess_per_drain),
                two(f.preemptions_per_drain),
                two(r.preemptions_per_drain),
            ));
        }
        lines.push(self.threshold_line());
        if self.isolate {
            lines.extend(self.isolation_lines());
        } else if let Some(how) = rt::isolation_of(self.target) {
            self.notes.push(format!(
                "the target, cpu {}, is isolated by the kernel ({how}): what reaches it is the \
                 kernel's own per-CPU work, the tick where it still runs, and the modes' own",
                self.target
            ));
        } else {
            self.notes.push(
                "no isolated CPU here: the figures carry the machine's own noise (including \
                 millisecond gaps on an idle vCPU), so compare the modes within this run, as \
                 ratios and counts, not with other machines"
                    .to_string(),
            );
        }
        if let Some(idle) = self
            .scenarios
            .iter()
            .find(|a| a.name == "idle" && a.rounds > 0)
        {
            let (warn, line) = crate::tick::verdict(self.target, self.nohz_full, &idle.tick);
            if warn {
                self.warnings.push(self.quiet, line);
            } else {
                self.notes.push(line);
            }
        }
        if rt::emulated_cpu() {
            self.notes.push(
                "the CPUs are emulated (qemu TCG): every time is stretched, so read the counts \
                 and ratios (what ran on the target, per drain), not the microseconds"
                    .to_string(),
            );
        }
        self.notes.extend(lines);
    }

    /// How the interruption counts move with the threshold: each scenario's gaps per second
    /// at 2, 5, 10 and 20 us.
    fn threshold_line(&self) -> String {
        let parts: Vec<String> = self
            .scenarios
            .iter()
            .filter(|a| a.rounds > 0 && a.seconds > 0.0)
            .map(|a| {
                let at: Vec<String> = rates_at_thresholds(a)
                    .iter()
                    .map(|(_, per_s)| format!("{per_s:.0}"))
                    .collect();
                format!("{} {}", a.name, at.join("/"))
            })
            .collect();
        format!(
            "interruptions per second at 2/5/10/20 us (the table counts from {} us): {}",
            THRESHOLD_NS / 1000,
            parts.join("; ")
        )
    }

    /// With `--isolate`: what the isolation removed (the idle baseline against the unisolated
    /// one of the same rounds, by the trace's classes), and which kernel drains still reached
    /// the target.
    fn isolation_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let find = |name: &str| {
            self.scenarios
                .iter()
                .find(|a| a.name == name && a.rounds > 0)
        };
        if let (Some(iso), Some(un)) = (find("idle"), find(UNISOLATED)) {
            let get = |a: &Acc, k: &str| a.attribution.by_bucket.get(k).copied().unwrap_or(0);
            if iso.attribution.by_bucket.is_empty() && un.attribution.by_bucket.is_empty() {
                lines.push(format!(
                    "isolation: no trace, so no classes to compare; interruptions/s idle {:.0} \
                     isolated vs {:.0} not",
                    self.rate_at_threshold(iso),
                    self.rate_at_threshold(un)
                ));
            } else {
                let (ki, oi) = (get(iso, "kernel"), get(iso, "other"));
                let (ku, ou) = (get(un, "kernel"), get(un, "other"));
                // The tick stays with run-time isolation (no nohz_full), and a probe that
                // shares its CPU sees fewer ticks (it is not running for many of them): the
                // comparison leaves it out.
                let tick = |a: &Acc| {
                    a.attribution
                        .top
                        .iter()
                        .find(|s| s.source == "vector local_timer")
                        .map_or(0, |s| s.count)
                };
                let (ti, tu) = (tick(iso), tick(un));
                let (a, b) = ((ki + oi).saturating_sub(ti), (ku + ou).saturating_sub(tu));
                let noise = 2.0 * ((a + b) as f64).sqrt();
                let verdict = if b as f64 - a as f64 > noise {
                    "dropped"
                } else if a as f64 - b as f64 > noise {
                    "rose"
                } else {
                    "did not change beyond counting noise"
                };
                lines.push(format!(
                    "isolation: the idle target's kernel and other interruptions but the tick \
                     {verdict} with cpu {} isolated at run time: {a} vs {b} (isolated vs not; 2 \
                     sigma {noise:.0}); the probe was preempted {} vs {} times; all kernel {ki} \
                     vs {ku}, other {oi} vs {ou}, of which the local timer (the tick, which only \
                     nohz_full stops) {ti} vs {tu}; {:.1} s each, interleaved in the same rounds",
                    self.target,
                    iso.probe_switches,
                    un.probe_switches,
                    iso.seconds.min(un.seconds)
                ));
            }
        }
        for a in self.scenarios.iter().filter(|a| a.rounds > 0) {
            let Some(k) = a.workload.kernel() else {
                continue;
            };
            let Some(w) = &a.attribution.kernel_work else {
                continue;
            };
            let seen = self
                .isolation_report
                .as_ref()
                .is_some_and(|r| r.kernel_sees_isolated);
            lines.push(format!(
                "isolation: {k}: {} run(s) of {} on the isolated cpu {} in {} drains: the kernel \
                 {} it ({})",
                w.runs,
                w.function,
                self.target,
                w.drains,
                if w.runs == 0 {
                    "skipped"
                } else {
                    "did not skip"
                },
                if seen {
                    "the kernel counts the CPU as isolated"
                } else {
                    "the kernel does not count a CPU isolated at run time without a cgroup v2 \
                     partition as isolated"
                }
            ));
        }
        lines
    }

    /// A scenario's gaps at or above the threshold, per second.
    fn rate_at_threshold(&self, a: &Acc) -> f64 {
        match self.threshold() {
            Some((ns, _)) if a.seconds > 0.0 => a.hist.count_at_least(ns) as f64 / a.seconds,
            _ => 0.0,
        }
    }

    /// Each traced scenario's attribution.
    fn attributions(&self) -> Vec<ScenarioAttribution> {
        self.scenarios
            .iter()
            .filter(|a| a.rounds > 0 && !a.attribution.by_bucket.is_empty())
            .map(|a| a.attribution.clone())
            .collect()
    }

    /// Prints, under the table, what the target's interruptions were in each scenario and the
    /// kernel's work per kernel drain.
    fn print_attribution(&self) {
        let rows = self.attributions();
        if rows.is_empty() {
            return;
        }
        println!(
            "\nWhat interrupted the target (cpu {}; trace of the measured CPU, gaps at or above \
             the threshold):",
            self.target
        );
        println!(
            "{:<16} {:>8} {:>8} {:>8} {:>12} {:>6}   top source",
            "scenario", "qpw", "kernel", "other", "unexplained", "lost"
        );
        for r in &rows {
            let get = |k: &str| r.by_bucket.get(k).copied().unwrap_or(0);
            println!(
                "{:<16} {:>8} {:>8} {:>8} {:>12} {:>6}   {}",
                r.scenario,
                get("qpw"),
                get("kernel"),
                get("other"),
                get("unexplained"),
                get("lost"),
                r.top
                    .first()
                    .map_or("-".to_string(), |t| format!("{} ({})", t.source, t.count))
            );
        }
        let kernel: Vec<_> = rows.iter().filter(|r| r.kernel_work.is_some()).collect();
        if !kernel.is_empty() {
            println!(
                "(runs: of the work function on the target, per drain, and how long each ran; \
                 gaps/d: the target's interruptions in which a kworker ran it, per drain, and \
                 their mean length; the filler that fills the target's caches before each drain \
                 counts as `other`)"
            );
            println!(
                "\nThe kernel's own drains ({}; PW/QPW: {}): runs of the work function on cpu {}",
                self.kernel.release, self.kernel.mode, self.target
            );
            println!(
                "{:<16} {:>4} {:<26} {:>7} {:>7} {:>10} {:>8} {:>8} {:>8} {:>7} {:>7} {:>9}",
                "workload",
                "mode",
                "work function",
                "drains",
                "runs",
                "per drain",
                "p50 us",
                "p99 us",
                "max us",
                "gaps/d",
                "gap us",
                "preempt/d"
            );
            let mut more = Vec::new();
            for r in kernel {
                let Some(w) = &r.kernel_work else { continue };
                let remote = crate::kernel::KernelDrain::from_name(&r.scenario)
                    .is_some_and(crate::kernel::KernelDrain::is_remote);
                println!(
                    "{:<16} {:>4} {:<26} {:>7} {:>7} {:>10} {:>8.1} {:>8.1} {:>8.1} {:>7} {:>7} {:>9}",
                    r.scenario,
                    if remote { "1" } else { "0" },
                    w.function,
                    w.drains,
                    w.runs,
                    w.runs_per_drain.map_or("-".into(), |v| format!("{v:.2}")),
                    w.p50_us,
                    w.p99_us,
                    w.max_us,
                    if w.drains > 0 {
                        format!("{:.2}", w.gaps as f64 / w.drains as f64)
                    } else {
                        "-".into()
                    },
                    if w.gaps > 0 {
                        format!("{:.1}", w.gaps_us / w.gaps as f64)
                    } else {
                        "-".into()
                    },
                    w.preempted_not_filler_per_drain
                        .map_or("-".into(), |v| format!("{v:.2}"))
                );
                if let Some(p) = &w.pcp {
                    more.push(format!("{}: {}", r.scenario, p.line()));
                }
                if !w.other_work.is_empty() {
                    let list: Vec<String> = w
                        .other_work
                        .iter()
                        .map(|(f, n)| format!("{f} {n}"))
                        .collect();
                    more.push(format!(
                        "{}: other work run on cpu {} meanwhile: {}",
                        r.scenario,
                        self.target,
                        list.join(", ")
                    ));
                }
            }
            println!(
                "(mode 1: the kernel drains the target from the caller, with no work there: \
                 drain_all_pages since 6.0, whose work function before 6.0 the runs column \
                 counts; preempt/d: the times a task other than the filler took the cpu from \
                 the probe, per drain)"
            );
            for m in more {
                println!("{m}");
            }
        }
    }

    /// Prints, under the attribution, each scenario's tick on the target and what of this run
    /// ran there besides the probe.
    fn print_tick(&self) {
        let rows: Vec<&crate::tick::TargetTick> = self
            .scenarios
            .iter()
            .filter(|a| a.rounds > 0)
            .map(|a| &a.tick)
            .collect();
        if rows.iter().all(|t| t.local_timer.is_none()) {
            return;
        }
        println!(
            "\nThe tick on cpu {} (nohz_full: {}) and this run's own tasks there besides the probe:",
            self.target,
            if self.nohz_full { "yes" } else { "no" }
        );
        println!(
            "{:<16} {:>8} {:>8}   {:<24} {:<28} ours (runs)",
            "scenario", "LOC/s", "tick/s", "tick kept by", "other timers"
        );
        for t in rows {
            println!(
                "{:<16} {:>8} {:>8}   {:<24} {:<28} {}",
                t.scenario,
                t.local_timer_per_s
                    .map_or("-".into(), |v| format!("{v:.1}")),
                t.tick_per_s.map_or("-".into(), |v| format!("{v:.1}")),
                if t.traced_seconds > 0.0 {
                    t.kept_line()
                } else {
                    "-".into()
                },
                if t.traced_seconds > 0.0 {
                    t.other_timers()
                } else {
                    "-".into()
                },
                if t.traced_seconds > 0.0 {
                    t.ours_line()
                } else {
                    "- (no trace)".into()
                }
            );
        }
        println!(
            "(LOC/s: the target's local timer interrupts per second, /proc/interrupts, around \
             each round; tick/s and other timers: the timers that fired there, from the trace \
             (hrtimer_expire_entry); tick kept by: what kept a nohz_full cpu's tick on when it \
             tried to stop it (tick_stop; SCHED: a second runnable task); ours: the run's own tasks that took the cpu from the probe)"
        );
    }

    fn write_summary(&self) -> Result<()> {
        let threshold = self.threshold();
        let summary = Summary {
            file_version: 1,
            cmdline: json::cmdline(),
            rt_test_version: json::RT_TESTS_VERSION.to_string(),
            qpw_emu_version: json::VERSION.to_string(),
            start_time: self.start_time.clone(),
            end_time: rt::rt_timestamp(),
            return_code: 0,
            sysinfo: SysInfo::read(),
            tool: "qpw-emu run".to_string(),
            target_cpu: self.target,
            housekeeping_cpu: self.housekeeping,
            scenario_seconds: self.duration.as_secs_f64(),
            rounds: self.rounds,
            drain_rate_hz: self.scenarios.iter().map(|a| a.rate).fold(0.0, f64::max),
            threshold_us: threshold.as_ref().map(|t| t.0 as f64 / 1000.0),
            threshold_rule: threshold.map(|t| t.1),
            rows: self.rows(),
            files: self.files.clone(),
            notes: self.notes.clone(),
            warnings: self.warnings.list().to_vec(),
            kernel: self.kernel.clone(),
            attribution: self.attributions(),
            target_nohz_full: self.nohz_full,
            tick: self
                .scenarios
                .iter()
                .filter(|a| a.rounds > 0)
                .map(|a| a.tick.clone())
                .collect(),
            interrupted: self.interrupted || self.scenarios.iter().any(|a| a.cut_short),
        };
        json::write(&self.out.join("summary.json"), &summary)
    }

    fn write_plots(&mut self) -> Result<()> {
        let mut written = Vec::new();
        let done: Vec<&Acc> = self.scenarios.iter().filter(|a| a.rounds > 0).collect();
        let idle = done.iter().find(|a| a.name == "idle");
        let mut workloads: Vec<WorkloadName> = Vec::new();
        for a in done.iter().filter(|a| a.name != "idle") {
            if !workloads.contains(&a.workload) {
                workloads.push(a.workload);
            }
        }
        for w in workloads {
            let mut series = Vec::new();
            let gaps = |label: &str, a: &Acc| Series {
                max_us: Some(a.hist.max_ns() as f64 / 1000.0),
                bucket_us: Some(GAP_WIDTH_NS as f64 / 1000.0),
                ..Series::exact(label, a.hist.nonzero_buckets_us())
            };
            if let Some(idle) = idle {
                series.push(gaps("idle", idle));
            }
            for a in done.iter().filter(|a| a.workload == w && a.name != "idle") {
                series.push(gaps(a.mode.name(), a));
            }
            let title = format!("cpu {} gaps under {w} drains (oslat probe)", self.target);
            written.push(write_file(
                &self.out.join(format!("gaps-{w}.svg")),
                &svg::histogram(&title, &series),
            )?);
            written.push(write_file(
                &self.out.join(format!("gaps-ccdf-{w}.svg")),
                &svg::ccdf(&title, &series),
            )?);
        }
        let drains: Vec<Series> = done
            .iter()
            .filter_map(|a| {
                a.requester.as_ref().map(|(r, _)| Series {
                    max_us: Some(r.time_us.max),
                    ..Series::exact(a.name.clone(), r.histogram_us.clone())
                })
            })
            .collect();
        if !drains.is_empty() {
            written.push(write_file(
                &self.out.join("drain-ccdf.svg"),
                &svg::ccdf("requester drain time", &drains),
            )?);
            written.push(write_file(
                &self.out.join("drain-hist.svg"),
                &svg::histogram("requester drain time", &drains),
            )?);
        }
        for f in written {
            if !self.files.contains(&f) {
                self.files.push(f);
            }
        }
        Ok(())
    }
}

fn write_file(path: &Path, text: &str) -> Result<String> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.display().to_string())
}

/// A scenario's gaps per second at each of [`OTHER_THRESHOLDS_NS`], as `(us, per second)`.
fn rates_at_thresholds(a: &Acc) -> Vec<(f64, f64)> {
    let seconds = a.seconds.max(1e-9);
    OTHER_THRESHOLDS_NS
        .iter()
        .map(|&t| (t as f64 / 1000.0, a.hist.count_at_least(t) as f64 / seconds))
        .collect()
}

/// The median of `values` (the mean of the middle two for an even count), or `None` if there
/// are none.
fn median<'a>(values: impl IntoIterator<Item = &'a f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(&[3.0, -1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[0.5]), Some(0.5));
        assert_eq!(median(&[]), None);
    }
}
