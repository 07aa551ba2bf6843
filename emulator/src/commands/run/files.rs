//! The files a run writes after every scenario round: each scenario's JSON, the summary and the
//! plots, so that an interrupted run keeps what it measured.

use std::path::Path;

use anyhow::{Context, Result};

use crate::json::{self, Interruptions, ProbePreemptions, QpwFields, Settings, ThreadFigures};
use crate::kernel::info::KernelInfo;
use crate::oslat::{oslat_json, OslatRun};
use crate::rt::{self, SysInfo};
use crate::svg::{self, Series};
use crate::table::Row;
use crate::workload::WorkloadName;

use super::acc::Acc;
use super::attribution::ScenarioAttribution;
use super::figures::{median, rates_at_thresholds};
use super::{Ctx, GAP_BUCKETS, GAP_WIDTH_NS, UNISOLATED};

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

impl Ctx {
    /// A scenario's JSON document, from what it has accumulated.
    pub(super) fn document(&self, acc: &Acc) -> crate::json::Envelope<crate::json::OslatBody> {
        let spec_mode = (acc.rate > 0.0).then(|| acc.mode.name().to_string());
        let fields = QpwFields {
            tool: "oslat".to_string(),
            scenario: Some(acc.name.clone()),
            mode: spec_mode,
            workload: Some(acc.workload.name().to_string()),
            qpw: Some(acc.qpw_desc.clone()),
            settings: Some(self.settings(acc)),
            percentiles: vec![ThreadFigures::of(
                self.target,
                &acc.hist,
                acc.local_ops,
                acc.local_op_errors,
            )
            .with_op_time(&acc.op_time)],
            interruptions: self.interruptions(acc),
            probe_preemptions: Some(probe_preemptions(acc)),
            requester: acc.requester.as_ref().map(|r| r.0.clone()),
            rt_throttling: Some(crate::throttling::RtThrottling::read(None)),
            isolation: self
                .isolation_report
                .clone()
                .filter(|_| acc.name != UNISOLATED),
            load: Some(acc.load.clone()),
            stopped_by: acc.cut_short.then(crate::signals::stopped_by),
            interrupted: acc.cut_short,
            warnings: self.sink.warnings().to_vec(),
            trace: None,
        };
        oslat_json(&self.probe_run(acc), self.start_time.clone(), fields)
    }

    /// A scenario's interruptions at the threshold (none before the idle baseline has measured
    /// something): their rate, and the excess over the idle baseline per drain, pooled over
    /// the run and round by round.
    fn interruptions(&self, acc: &Acc) -> Option<Interruptions> {
        let baseline = self.baseline_rate();
        let seconds = acc.seconds.max(1e-9);
        self.threshold().map(|(ns, rule)| {
            let count = acc.hist.count_at_least(ns);
            let excess = count as f64 - baseline * seconds;
            let by_round = self.excess_by_round(acc, ns, baseline);
            let known: Vec<f64> = by_round.iter().flatten().copied().collect();
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
                excess_per_drain_se: standard_error(&known),
                excess_per_drain_by_round: by_round,
                per_second_at_us: rates_at_thresholds(acc),
            }
        })
    }

    /// The probe's settings in a scenario: its histogram, its time over the rounds, its
    /// priority and its local operation's period.
    fn settings(&self, acc: &Acc) -> Settings {
        Settings {
            bucket_width_ns: GAP_WIDTH_NS,
            bucket_size: GAP_BUCKETS,
            duration_s: self.chunk.as_secs_f64() * f64::from(acc.rounds),
            rtprio: self.rtprio,
            local_op_every_us: Some(acc.every.unwrap_or(self.every).as_secs_f64() * 1e6),
            interval_us: None,
        }
    }

    /// A scenario's accumulated figures as the run of one probe thread on the target, in the
    /// shape the oslat JSON is written from.
    fn probe_run(&self, acc: &Acc) -> OslatRun {
        OslatRun {
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
        }
    }

    /// Writes every scenario's JSON, the summary and the plots.
    pub(super) fn write_all(&mut self) -> Result<()> {
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

    pub(super) fn write_summary(&self) -> Result<()> {
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
            warnings: self.sink.warnings().to_vec(),
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

    pub(super) fn write_plots(&mut self) -> Result<()> {
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

/// The probe's context switches in a scenario, per drain that reached the target: pooled over
/// the run and round by round.
fn probe_preemptions(acc: &Acc) -> ProbePreemptions {
    let per_drain =
        |switches: u64, drains: u64| (drains > 0).then(|| switches as f64 / drains as f64);
    let preemptions_by_round: Vec<Option<f64>> = acc
        .by_round
        .iter()
        .map(|part| per_drain(part.probe_switches, part.target_drains))
        .collect();
    ProbePreemptions {
        count: acc.probe_switches,
        voluntary: acc.probe_voluntary,
        drains_reaching_target: acc.target_drains,
        per_drain: per_drain(acc.probe_switches + acc.probe_voluntary, acc.target_drains),
        per_drain_median: median(preemptions_by_round.iter().flatten()),
        per_drain_by_round: preemptions_by_round,
    }
}

/// The standard error of the mean of `values` (none for fewer than two).
fn standard_error(values: &[f64]) -> Option<f64> {
    (values.len() >= 2).then(|| {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (var / n).sqrt()
    })
}

fn write_file(path: &Path, text: &str) -> Result<String> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.display().to_string())
}
