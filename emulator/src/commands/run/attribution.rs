//! What interrupted the target, from the trace of each round: the gaps at the threshold
//! matched with what ran on the target in them, and the kernel workloads' work there.

use std::collections::BTreeMap;

use crate::scenario;

use super::acc::Acc;
use super::{Ctx, THRESHOLD_NS};

/// What the trace of the target said about one scenario.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct ScenarioAttribution {
    /// The scenario.
    pub(super) scenario: String,
    /// The target's interruptions (gaps at or above the threshold) by what ran in them:
    /// `qpw` (our worker), `kernel` (kworkers), `other`, `unexplained`.
    pub(super) by_bucket: BTreeMap<String, u64>,
    /// The sources, most gap time first (the first 8).
    pub(super) top: Vec<crate::trace::SourceFigures>,
    /// For a kernel workload: its drains, and the runs of its work function on the target.
    pub(super) kernel_work: Option<KernelWork>,
    /// Events the trace lost in this scenario.
    pub(super) lost_events: u64,
}

/// The kernel's work on the target for one kernel workload.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct KernelWork {
    /// The work function.
    pub(super) function: String,
    /// Drains (triggers) done.
    pub(super) drains: u64,
    /// Runs of the work function on the target.
    pub(super) runs: u64,
    /// Runs per drain.
    pub(super) runs_per_drain: Option<f64>,
    /// The target's interruptions attributed to this work function (a kworker running it).
    pub(super) gaps: u64,
    /// Their total time, in microseconds.
    pub(super) gaps_us: f64,
    /// Run time p50, p99 and max, in microseconds.
    pub(super) p50_us: f64,
    /// 99th percentile.
    pub(super) p99_us: f64,
    /// Longest.
    pub(super) max_us: f64,
    /// The times a task other than the filler took the target from the probe (a kworker, any
    /// other thread; the filler runs there before every trigger by design), from the trace.
    pub(super) preempted_not_filler: u64,
    /// The same per drain.
    pub(super) preempted_not_filler_per_drain: Option<f64>,
    /// Other work items run on the target during the scenario, by function (not the drain's:
    /// the kernel's periodic work, or the trigger's side effects).
    pub(super) other_work: BTreeMap<String, u64>,
    /// kernel-pcp: who drained the target's pcp pages, and what was queued to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) pcp: Option<crate::kernel::pcp::PcpReport>,
}

/// What one traced round of a kernel workload showed of its work, before it is added to the
/// scenario's.
struct KernelRound {
    /// The workload's drain.
    drain: crate::kernel::KernelDrain,
    /// The gaps its own work function made: how many, and their total time in microseconds.
    gaps: (u64, f64),
    /// The times a task other than the filler took the target from the probe.
    preempted_not_filler: u64,
    /// The work run on the target, when the target was traced.
    seen: Option<TargetWork>,
}

/// The work items run on the target in one round, for a kernel workload.
struct TargetWork {
    /// The name of the drain's work function that this kernel uses, as seen on the target
    /// (else the newest).
    function: &'static str,
    /// Each run of that function on the target, in microseconds.
    runs: Vec<f64>,
    /// The other work items run there, by function.
    other_work: BTreeMap<String, u64>,
}

impl TargetWork {
    /// What the target's timeline `t` shows of the work functions `names` (the drain's, newest
    /// first) and of the other work run there; `conv` turns clock ticks into microseconds.
    fn of(
        names: &[&'static str],
        t: &crate::trace::timeline::CpuTimeline,
        conv: impl Fn(u64) -> f64,
    ) -> Self {
        // The name this kernel uses, as seen on the target (else the newest).
        let mut function = names[0];
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
        let mut other_work: BTreeMap<String, u64> = BTreeMap::new();
        for w in t
            .work
            .iter()
            .filter(|w| !names.contains(&w.function.as_str()))
        {
            *other_work.entry(w.function.clone()).or_default() += 1;
        }
        Self {
            function,
            runs,
            other_work,
        }
    }
}

impl Ctx {
    /// Matches one round's gaps at the threshold (the idle baseline's so far; the idle
    /// scenario runs first in every round) and adds them to scenario `i`'s attribution.
    pub(super) fn attribute_round(
        &mut self,
        i: usize,
        traced: &crate::trace::Traced,
        thread: &crate::oslat::OslatThread,
        outcome: &scenario::Outcome,
    ) {
        let conv = crate::probe_trace::ticks_to_us(&traced.clock, self.calibration);
        let a = self.match_gaps(traced, thread, &conv);
        // Everything that took the target from the probe over the round: the run's own tasks
        // among it, and the timers that fired there.
        let noise = traced
            .noise(Some(thread.tid), &conv)
            .into_iter()
            .find(|n| n.cpu == self.target);
        // For a kernel workload, what the round showed of its work (the gaps its own work
        // function made: before `a` is consumed).
        let kernel = self.scenarios[i]
            .workload
            .kernel()
            .map(|drain| KernelRound {
                drain,
                gaps: own_gaps(drain, &a.top),
                preempted_not_filler: preempted_not_filler(noise.as_ref()),
                seen: traced
                    .timeline
                    .cpus
                    .get(&self.target)
                    .map(|t| TargetWork::of(drain.drain_functions(), t, &conv)),
            });
        self.add_traced_tick(i, traced, thread, noise.as_ref(), &conv);
        let acc = &mut self.scenarios[i];
        acc.attribution.add_round(a, traced.lost_events);
        if let Some(round) = kernel {
            acc.add_kernel_round(round, outcome);
        }
    }

    /// The probe's gaps at the threshold in one round, matched with what ran on the target in
    /// them; `conv` turns clock ticks into microseconds.
    fn match_gaps(
        &self,
        traced: &crate::trace::Traced,
        thread: &crate::oslat::OslatThread,
        conv: impl Fn(u64) -> f64,
    ) -> crate::trace::GapAttribution {
        // The idle scenario of this round is merged into its accumulator only afterwards: for
        // it, derive the threshold from its own gaps.
        let threshold_ns = THRESHOLD_NS;
        let gaps: Vec<(u64, u64)> = thread
            .gaps
            .iter()
            .copied()
            .filter(|&(a, b)| self.calibration.to_ns(b - a) >= threshold_ns)
            .collect();
        traced.attribute_gaps(
            self.target,
            thread.tid,
            &gaps,
            thread.gaps_not_kept,
            threshold_ns as f64 / 1000.0,
            conv,
        )
    }

    /// Adds to scenario `i`'s tick what the trace of one round saw on the target: the timers
    /// that fired, what kept the tick on, and the run's own tasks that ran there besides the
    /// probe, over the span of `noise` (the target's; nothing is added without it).
    fn add_traced_tick(
        &mut self,
        i: usize,
        traced: &crate::trace::Traced,
        thread: &crate::oslat::OslatThread,
        noise: Option<&crate::trace::CpuNoise>,
        conv: impl Fn(u64) -> f64,
    ) {
        let (timers, kept) = traced
            .timeline
            .cpus
            .get(&self.target)
            .map(|t| (t.timers.clone(), t.tick_kept.clone()))
            .unwrap_or_default();
        let ours = traced.tasks_of(
            self.target,
            thread.tid,
            thread.window,
            std::process::id() as i32,
            &["qpw-filler"],
            conv,
        );
        if let Some(n) = noise {
            self.scenarios[i]
                .tick
                .add_trace(&timers, &kept, &ours, n.seconds);
        }
    }

    /// Each traced scenario's attribution.
    pub(super) fn attributions(&self) -> Vec<ScenarioAttribution> {
        self.scenarios
            .iter()
            .filter(|a| a.rounds > 0 && !a.attribution.by_bucket.is_empty())
            .map(|a| a.attribution.clone())
            .collect()
    }

    /// Prints, under the table, what the target's interruptions were in each scenario and the
    /// kernel's work per kernel drain.
    pub(super) fn print_attribution(&self) {
        let rows = self.attributions();
        if rows.is_empty() {
            return;
        }
        self.print_buckets(&rows);
        let kernel: Vec<_> = rows.iter().filter(|r| r.kernel_work.is_some()).collect();
        if !kernel.is_empty() {
            self.print_kernel_work(&kernel);
        }
    }

    /// Prints the table of the target's interruptions: per scenario, how many fell in each
    /// bucket, and the source with most gap time.
    fn print_buckets(&self, rows: &[ScenarioAttribution]) {
        println!(
            "\nWhat interrupted the target (cpu {}; trace of the measured CPU, gaps at or above \
             the threshold):",
            self.target
        );
        println!(
            "{:<16} {:>8} {:>8} {:>8} {:>12} {:>6}   top source",
            "scenario", "qpw", "kernel", "other", "unexplained", "lost"
        );
        for r in rows {
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
    }

    /// Prints the table of the kernel's own drains (one row per kernel workload: its work
    /// function's runs on the target, their lengths, the gaps they made), its legend, and
    /// after it each workload's kernel-pcp report and the other work run on the target.
    fn print_kernel_work(&self, kernel: &[&ScenarioAttribution]) {
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
            println!("{}", kernel_work_row(&r.scenario, w));
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

/// One row of the table of the kernel's own drains: scenario `scenario`'s work `w`.
fn kernel_work_row(scenario: &str, w: &KernelWork) -> String {
    let remote = crate::kernel::KernelDrain::from_name(scenario)
        .is_some_and(crate::kernel::KernelDrain::is_remote);
    format!(
        "{:<16} {:>4} {:<26} {:>7} {:>7} {:>10} {:>8.1} {:>8.1} {:>8.1} {:>7} {:>7} {:>9}",
        scenario,
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
    )
}

/// The gaps that kernel workload `drain`'s own work function made, from a round's sources
/// (`top`): those in which a kworker ran it; how many, and their total time in microseconds.
fn own_gaps(drain: crate::kernel::KernelDrain, top: &[crate::trace::SourceFigures]) -> (u64, f64) {
    let kernel_fns: Vec<String> = drain
        .drain_functions()
        .iter()
        .map(|f| format!("kworker {f}"))
        .collect();
    top.iter()
        .filter(|s| kernel_fns.contains(&s.source))
        .fold((0, 0.0), |(n, t), s| (n + s.count, t + s.total_us))
}

/// The times a task other than the filler (and other than the idle task: the probe slept)
/// took the target from the probe, from the target's `noise` (none without it).
fn preempted_not_filler(noise: Option<&crate::trace::CpuNoise>) -> u64 {
    noise.map_or(0, |n| {
        n.top
            .iter()
            .filter(|s| s.class == "thread" && s.source != "qpw-filler" && s.source != "idle")
            .map(|s| s.count)
            .sum()
    })
}

impl ScenarioAttribution {
    /// Adds one round's matched gaps `a`: by bucket, those lost with events, and the sources;
    /// and the events the round's trace lost.
    fn add_round(&mut self, a: crate::trace::GapAttribution, lost_events: u64) {
        for (k, v) in a.by_bucket {
            *self.by_bucket.entry(k).or_default() += v;
        }
        if let Some(lost) = a.by_class.get("lost") {
            *self.by_bucket.entry("lost".into()).or_default() += lost.count;
        }
        self.lost_events += lost_events;
        self.merge_top(a.top);
    }

    /// Merges one round's sources into the scenario's, keeping the 8 with most gap time.
    fn merge_top(&mut self, round: Vec<crate::trace::SourceFigures>) {
        let mut top: BTreeMap<String, crate::trace::SourceFigures> =
            self.top.drain(..).map(|s| (s.source.clone(), s)).collect();
        for s in round {
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
        self.top = top;
    }
}

impl Acc {
    /// Adds one traced round of a kernel workload: the drains that reached the target and
    /// each run of the work function there, and the round's figures to its [`KernelWork`].
    fn add_kernel_round(&mut self, round: KernelRound, outcome: &scenario::Outcome) {
        let names = round.drain.drain_functions();
        let function = round.seen.as_ref().map_or(names[0], |s| s.function);
        let mut other_work = BTreeMap::new();
        if let Some(seen) = round.seen {
            // A mode-0 drain "reaches" the target when its work function runs there; a
            // mode-1 drain (kernel-pcp) reaches it from the requester, at every trigger.
            let reached = if round.drain.is_remote() {
                outcome.requester.as_ref().map_or(0, |r| r.drains)
            } else {
                seen.runs.len() as u64
            };
            self.target_drains += reached;
            if let Some(last) = self.by_round.last_mut() {
                last.target_drains = reached;
            }
            self.work_us.extend(seen.runs);
            other_work = seen.other_work;
        }
        let work = self
            .attribution
            .kernel_work
            .get_or_insert_with(|| KernelWork {
                function: function.to_string(),
                ..KernelWork::default()
            });
        if function != names[0] {
            work.function = function.to_string();
        }
        work.add_round(outcome, round.gaps, round.preempted_not_filler, other_work);
        work.set_runs(&self.work_us);
    }
}

impl KernelWork {
    /// Adds one round: its drains, the `gaps` the work function made (how many, and their
    /// time in microseconds), the preemptions of the probe, the other work run on the target
    /// and kernel-pcp's report.
    fn add_round(
        &mut self,
        outcome: &scenario::Outcome,
        gaps: (u64, f64),
        preempted_not_filler: u64,
        other_work: BTreeMap<String, u64>,
    ) {
        self.drains += outcome.requester.as_ref().map_or(0, |r| r.drains);
        self.gaps += gaps.0;
        self.gaps_us += gaps.1;
        for (f, n) in other_work {
            *self.other_work.entry(f).or_default() += n;
        }
        self.preempted_not_filler += preempted_not_filler;
        self.preempted_not_filler_per_drain =
            (self.drains > 0).then(|| self.preempted_not_filler as f64 / self.drains as f64);
        if let Some(p) = outcome
            .requester
            .as_ref()
            .and_then(|r| r.kernel_pcp.as_ref())
        {
            self.pcp.get_or_insert_with(Default::default).add(p);
        }
    }

    /// Sets the runs of the work function (their number, per drain, and their p50, p99 and
    /// max) from every run on the target so far, `work_us`, in microseconds.
    fn set_runs(&mut self, work_us: &[f64]) {
        self.runs = work_us.len() as u64;
        self.runs_per_drain = (self.drains > 0).then(|| self.runs as f64 / self.drains as f64);
        let mut d = work_us.to_vec();
        d.sort_by(f64::total_cmp);
        if !d.is_empty() {
            let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
            (self.p50_us, self.p99_us, self.max_us) = (at(0.5), at(0.99), at(1.0));
        }
    }
}
