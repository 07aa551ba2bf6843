//! The default experiment (`qpw-emu`, `qpw-emu run`): the same probe, the same load, once per
//! mode and workload, so that the two modes are compared in one run on one machine.
//!
//! 1. **Idle baseline**: the oslat probe on the target CPU, with the process-context load on
//!    the other CPUs and the probe's own local operations, but no drains. Its gaps are the
//!    machine's own noise; the interruption threshold is derived from them.
//! 2. For each mm workload, **queue** then **remote**: the same, plus a requester on a
//!    housekeeping CPU draining every CPU at a fixed rate. In queue mode each drain that finds
//!    the target's cache non-empty wakes the target's worker, which preempts the probe; in
//!    remote mode the requester takes the target's lock and drains it from its own CPU.
//!
//! Results are written after every scenario (its JSON, then the summary and the plots), so an
//! interrupted run keeps what it measured.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use qpw_core::{CpuSet, Mode};

use crate::cli::RunArgs;
use crate::clock::Calibration;
use crate::commands::{note_outcome, oslat_json, qpw_fields, Cpus};
use crate::hist::Histogram;
use crate::json::{self, Interruptions, Settings, ThreadFigures};
use crate::load::Phase;
use crate::oslat::{self, OslatConfig, OslatRun};
use crate::report::{self, Row};
use crate::rt::{self, SysInfo, Warnings};
use crate::scenario::{self, DrainSpec};
use crate::svg::{self, Series};
use crate::validate;
use crate::workload::WorkloadName;

/// Gap histogram: 100 ns buckets up to 500 us, exact past that.
const GAP_WIDTH_NS: u64 = 100;
const GAP_BUCKETS: usize = 5000;

/// The options of a bare `qpw-emu`.
pub fn default_args() -> RunArgs {
    RunArgs {
        duration: "5s".into(),
        out: None,
        workloads: None,
        drain_rate: "1000".into(),
        target: None,
        rtprio: None,
        local_op_every: "200".into(),
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
    /// Our version.
    #[serde(rename = "rt_test_version:")]
    rt_test_version: String,
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
    /// Seconds per scenario.
    scenario_seconds: f64,
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
}

/// Runs the experiment.
pub fn run(args: &RunArgs) -> Result<()> {
    let cpus = Cpus::read()?;
    let duration = validate::duration("--duration", &args.duration)?;
    let rate = validate::float_in("--drain-rate", &args.drain_rate, 1.0, 100_000.0)?;
    let target = match &args.target {
        Some(t) => validate::cpu("--target", t, &cpus.allowed)?,
        None => cpus.target,
    };
    let rtprio = args
        .rtprio
        .as_deref()
        .map(|p| validate::int_in("--rtprio", p, 1, 99).map(|p| p as i32))
        .transpose()?;
    let every = validate::int_in("--local-op-every", &args.local_op_every, 1, 1_000_000)?;
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
    std::fs::create_dir_all(&out)
        .with_context(|| format!("cannot create the results folder {}", out.display()))?;

    let quiet = args.quiet;
    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    let _rt = rt::prepare(true, &mut warnings, quiet);
    rt::check_isolation(&target_set, &mut warnings, quiet);
    if rtprio.is_none() {
        notes.push(
            "the probe runs SCHED_OTHER (no -f): the queue-mode worker preempts it (interruptions) \
             instead of starving behind it (stalls)"
                .to_string(),
        );
    }
    rt::catch_sigint();
    let calibration = Calibration::measure();
    let n_scen = 1 + 2 * workloads.len();
    if !quiet {
        eprintln!(
            "qpw-emu: target cpu {target}, requester on cpu {housekeeping}, load on {}; {n_scen} \
             scenarios of {:.1} s (about {:.0} s); results in {}",
            cpus.allowed.difference(&target_set),
            duration.as_secs_f64(),
            n_scen as f64 * (duration.as_secs_f64() + 0.4),
            out.display()
        );
    }

    let mut ctx = Ctx {
        out,
        start_time,
        target,
        housekeeping,
        duration,
        rate,
        every: Duration::from_micros(every),
        rtprio,
        calibration,
        quiet,
        cpus,
        rows: Vec::new(),
        files: Vec::new(),
        hists: Vec::new(),
        drains: Vec::new(),
        threshold: None,
        baseline_rate: 0.0,
        notes,
        warnings,
    };

    // 1. The idle baseline.
    let base_workload = workloads.first().copied().unwrap_or(WorkloadName::Counter);
    ctx.scenario("idle", Mode::Queue, base_workload, 0.0)?;
    // 2. Each workload in each mode.
    for &w in &workloads {
        for mode in [Mode::Queue, Mode::Remote] {
            if rt::interrupted() {
                break;
            }
            ctx.scenario(&format!("{}-{}", mode, w), mode, w, rate)?;
        }
    }
    ctx.conclude();
    ctx.write_summary()?;
    print!(
        "{}",
        report::table(&ctx.rows, Some(ctx.target), ctx.threshold.map(|t| t.0))
    );
    println!();
    for n in &ctx.notes {
        println!("note: {n}");
    }
    for w in ctx.warnings.list() {
        println!("warning: {w}");
    }
    println!("\nResults: {}", ctx.out.display());
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
    rate: f64,
    every: Duration,
    rtprio: Option<i32>,
    calibration: Calibration,
    quiet: bool,
    cpus: Cpus,
    rows: Vec<Row>,
    files: Vec<String>,
    /// (scenario, workload, target gap histogram).
    hists: Vec<(String, String, Histogram)>,
    /// (scenario, drain-time buckets).
    drains: Vec<(String, Vec<(f64, u64)>)>,
    /// (threshold ns, rule).
    threshold: Option<(u64, String)>,
    baseline_rate: f64,
    notes: Vec<String>,
    warnings: Warnings,
}

impl Ctx {
    fn scenario(
        &mut self,
        name: &str,
        mode: Mode,
        workload: WorkloadName,
        rate: f64,
    ) -> Result<()> {
        let target_set = CpuSet::from_iter([self.target]);
        let spec = DrainSpec {
            mode,
            workload,
            drain_rate_hz: rate,
            force: false,
            timeout: Duration::from_secs(1),
            load_cpus: self.cpus.allowed.difference(&target_set),
            requester_cpu: self.housekeeping,
            local_op_every: self.every,
            requester_prio: None,
        };
        let setup = scenario::setup(&spec)?;
        let cfg = OslatConfig {
            cpus: target_set,
            duration: self.duration,
            warmup: Duration::from_millis(200),
            bucket_size: GAP_BUCKETS,
            bucket_width_ns: GAP_WIDTH_NS,
            rtprio: self.rtprio,
            trace_threshold_ns: None,
            local_op: Some(setup.local_op()),
            quiet: self.quiet,
            label: name.to_string(),
        };
        let phase: std::sync::Arc<Phase> = setup.phase.clone();
        let qpw_desc = setup.qpw.describe();
        let run = oslat::run(&cfg, self.calibration, &phase);
        let outcome = setup.finish(Some(self.target))?;
        let run: OslatRun = run?;
        let quiet = self.quiet;
        self.warnings.extend(quiet, run.warnings.clone());
        note_outcome(&outcome, &mut self.warnings, quiet);
        let Some(thread) = run.threads.first() else {
            return Err(anyhow!("the probe measured nothing"));
        };
        let hist = thread.hist.clone();
        let seconds = thread.duration_s.max(1e-9);

        // The idle baseline fixes the threshold.
        if name == "idle" {
            let (ns, rule) = derive_threshold(&hist);
            self.baseline_rate = hist.count_at_least(ns) as f64 / seconds;
            self.threshold = Some((ns, rule));
        }
        let interruptions = self.threshold.as_ref().map(|(ns, rule)| {
            let count = hist.count_at_least(*ns);
            let drains = outcome.target_drains;
            let excess = count as f64 - self.baseline_rate * seconds;
            Interruptions {
                threshold_us: *ns as f64 / 1000.0,
                rule: rule.clone(),
                count,
                per_second: count as f64 / seconds,
                baseline_per_second: self.baseline_rate,
                drains_reaching_target: drains,
                excess_per_drain: (drains > 0).then(|| excess / drains as f64),
            }
        });

        let figures = vec![ThreadFigures::of(
            thread.cpu,
            &hist,
            thread.local_ops,
            thread.local_op_errors,
        )];
        let settings = Settings {
            bucket_width_ns: GAP_WIDTH_NS,
            bucket_size: GAP_BUCKETS,
            duration_s: self.duration.as_secs_f64(),
            rtprio: self.rtprio,
            local_op_every_us: Some(self.every.as_micros() as u64),
            interval_us: None,
        };
        let mut fields = qpw_fields(
            "oslat",
            Some(&spec),
            Some(qpw_desc),
            Some(&outcome),
            figures,
            settings,
            &self.warnings,
        );
        fields.scenario = Some(name.to_string());
        if name == "idle" {
            fields.mode = None;
        }
        fields.interruptions = interruptions;
        let doc = oslat_json(&run, self.start_time.clone(), fields);
        let file = self.out.join(format!("{name}.json"));
        json::write(&file, &doc)?;
        self.files.push(file.display().to_string());

        self.rows.push(Row::from_oslat(name, &doc));
        self.hists
            .push((name.to_string(), workload.name().to_string(), hist));
        if let Some(r) = &outcome.requester {
            self.drains.push((name.to_string(), r.histogram_us.clone()));
        }
        self.write_summary()?;
        self.write_plots()?;
        Ok(())
    }

    /// Compares the modes and says in words what the table shows, or why it does not.
    fn conclude(&mut self) {
        let find = |scen: &str| self.rows.iter().find(|r| r.name == scen);
        let mut lines = Vec::new();
        for row in &self.rows {
            let Some(w) = row.name.strip_prefix("queue-") else {
                continue;
            };
            let (Some(q), Some(r)) = (find(&format!("queue-{w}")), find(&format!("remote-{w}")))
            else {
                continue;
            };
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
                _ => "n/a".to_string(),
            };
            lines.push(format!(
                "{w}: queue/remote drain p50 {}, p99 {}; target interruptions/s {:.0} vs {:.0} \
                 (idle {:.0}); excess interruptions per drain {} vs {}",
                ratio(q.drain_p50, r.drain_p50),
                ratio(q.drain_p99, r.drain_p99),
                q.interruptions_per_s.unwrap_or(0.0),
                r.interruptions_per_s.unwrap_or(0.0),
                self.baseline_rate,
                q.excess_per_drain
                    .map_or("n/a".into(), |v| format!("{v:.2}")),
                r.excess_per_drain
                    .map_or("n/a".into(), |v| format!("{v:.2}")),
            ));
            if q.target_drains == Some(0) {
                lines.push(format!(
                    "{w}: no queue-mode drain reached the target (its cache was always empty when \
                     the requester looked), so the target could not be interrupted by one"
                ));
            }
            if q.excess_per_drain.unwrap_or(0.0) <= r.excess_per_drain.unwrap_or(0.0) {
                lines.push(format!(
                    "{w}: the target saw no more interruptions per drain in queue mode than in \
                     remote mode; on this machine the worker's wake-ups were lost in the \
                     baseline noise ({:.0} interruptions/s idle)",
                    self.baseline_rate
                ));
            }
        }
        self.notes.push(
            "no isolated CPU here: the figures carry the machine's own noise, so compare the modes \
             within this run (ratios and counts), not with other machines"
                .to_string(),
        );
        self.notes.extend(lines);
    }

    fn write_summary(&self) -> Result<()> {
        let summary = Summary {
            file_version: 1,
            cmdline: json::cmdline(),
            rt_test_version: json::VERSION.to_string(),
            start_time: self.start_time.clone(),
            end_time: rt::rt_timestamp(),
            return_code: 0,
            sysinfo: SysInfo::read(),
            tool: "qpw-emu run".to_string(),
            target_cpu: self.target,
            housekeeping_cpu: self.housekeeping,
            scenario_seconds: self.duration.as_secs_f64(),
            drain_rate_hz: self.rate,
            threshold_us: self.threshold.as_ref().map(|t| t.0 as f64 / 1000.0),
            threshold_rule: self.threshold.as_ref().map(|t| t.1.clone()),
            rows: self.rows.clone(),
            files: self.files.clone(),
            notes: self.notes.clone(),
            warnings: self.warnings.list().to_vec(),
        };
        json::write(&self.out.join("summary.json"), &summary)
    }

    fn write_plots(&mut self) -> Result<()> {
        let mut written = Vec::new();
        let workloads: Vec<String> = {
            let mut v: Vec<String> = self.hists.iter().map(|h| h.1.clone()).collect();
            v.dedup();
            v
        };
        let idle = self.hists.iter().find(|h| h.0 == "idle");
        for w in workloads {
            let mut series = Vec::new();
            if let Some((_, _, h)) = idle {
                series.push(Series {
                    label: "idle".into(),
                    points: h.nonzero_buckets_us(),
                });
            }
            for (name, wl, h) in &self.hists {
                if *wl == w && name != "idle" {
                    series.push(Series {
                        label: name.split('-').next().unwrap_or(name).to_string(),
                        points: h.nonzero_buckets_us(),
                    });
                }
            }
            if series.len() < 2 {
                continue;
            }
            let title = format!("cpu {} gaps under {w} drains (oslat probe)", self.target);
            written.push(write_file(
                &self.out.join(format!("gaps-{w}.svg")),
                &svg::histogram(&title, &series),
            )?);
            written.push(write_file(
                &self.out.join(format!("gaps-cdf-{w}.svg")),
                &svg::cdf(&title, &series),
            )?);
        }
        if !self.drains.is_empty() {
            let series: Vec<Series> = self
                .drains
                .iter()
                .map(|(name, pts)| Series {
                    label: name.clone(),
                    points: pts.clone(),
                })
                .collect();
            written.push(write_file(
                &self.out.join("drain-cdf.svg"),
                &svg::cdf("requester drain time", &series),
            )?);
            written.push(write_file(
                &self.out.join("drain-hist.svg"),
                &svg::histogram("requester drain time", &series),
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

/// The interruption threshold from the idle baseline's gaps: twice the idle p99.99 (the top of
/// the loop's own jitter), and at least 1 us, rounded up to a bucket edge. A gap at or above it
/// is one the probe's own loop does not produce once in ten thousand iterations when nothing
/// is drained.
pub fn derive_threshold(idle: &Histogram) -> (u64, String) {
    let p = idle.quantile_ns(0.9999);
    let ns = (2 * p).max(1000).div_ceil(idle.width_ns()) * idle.width_ns();
    (
        ns,
        format!(
            "2 x the idle baseline's p99.99 gap ({:.2} us), at least 1 us",
            p as f64 / 1000.0
        ),
    )
}
