//! Text tables of results: one [`Row`] per measured CPU, from a run of ours or from the real
//! oslat's and cyclictest's files, and the comparison [`table`] that the default experiment and
//! `qpw-emu report` print.
//!
//! The real tools' files lack our exact figures, so their percentiles are read off the
//! histogram, and the table says so. The two tools key their buckets differently: oslat by the
//! bucket's *upper* edge (its last bucket "including overflows"), cyclictest by the latency in
//! whole microseconds as it records it (key `k` holds `[k, k+1)`: the *lower* edge), and
//! cyclictest leaves its overflows (latencies at or above `-h`) out of the histogram, counting
//! them only in `cycles`. Both kinds of overflow are samples known only to be at least some
//! value: a percentile whose rank falls among them is shown as `>=value`, and the plots draw
//! them dashed up to the max.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::json::{Envelope, OslatBody, QpwFields};
use crate::svg::{self, Series};

/// One line of a comparison table: one measured CPU of one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    /// The scenario or file name.
    pub name: String,
    /// `oslat` or `cyclictest`.
    pub tool: String,
    /// The drain mode, if any.
    pub mode: Option<String>,
    /// The workload, if any.
    pub workload: Option<String>,
    /// The measured CPU.
    pub cpu: usize,
    /// Samples (gaps or wake-ups).
    pub samples: u64,
    /// Largest gap or latency, us.
    pub max_us: f64,
    /// 99th percentile, us.
    pub p99_us: f64,
    /// 99.9th percentile, us.
    pub p99_9_us: f64,
    /// 99.99th percentile, us.
    pub p99_99_us: f64,
    /// For p99, p99.9 and p99.99: whether the figure is only a lower bound (read off a file
    /// whose overflows hold the percentile's rank).
    #[serde(default)]
    pub at_least: [bool; 3],
    /// Whether the percentiles were read off bucket edges of a file without ours.
    pub from_buckets: bool,
    /// Whether the interruptions were counted above `qpw-emu report --threshold`.
    #[serde(default)]
    pub from_threshold: bool,
    /// Gaps at or above the interruption threshold.
    pub interruptions: Option<u64>,
    /// The same, per second.
    pub interruptions_per_s: Option<f64>,
    /// Of the interruptions, those that contained the probe's own local operation.
    #[serde(default)]
    pub during_local_op: Option<u64>,
    /// The median time of the probe's own local operation (the owner's cost), ns.
    #[serde(default)]
    pub local_op_ns: Option<f64>,
    /// Interruptions beyond the idle rate, per drain that reached the target: the median over
    /// the rounds of `qpw-emu run` (each against its own round's idle rate), else the figure
    /// pooled over the whole run.
    pub excess_per_drain: Option<f64>,
    /// The same, round by round (`qpw-emu run` only).
    #[serde(default)]
    pub excess_per_drain_by_round: Vec<Option<f64>>,
    /// The standard error of `excess_per_drain` over the rounds, with two rounds or more.
    #[serde(default)]
    pub excess_per_drain_se: Option<f64>,
    /// The probe thread's context switches (involuntary plus voluntary) per drain that reached
    /// the target: the median over the rounds of `qpw-emu run`, else the pooled figure.
    #[serde(default)]
    pub preemptions_per_drain: Option<f64>,
    /// Fenced mode: the requester's flags that the target CPU answered, per drain.
    #[serde(default)]
    pub answers_per_drain: Option<f64>,
    /// Fenced mode: the requester's flags settled by a `membarrier` fence (an interrupt on the
    /// target CPU), per drain.
    #[serde(default)]
    pub fences_per_drain: Option<f64>,
    /// Drains that reached the target.
    pub target_drains: Option<u64>,
    /// Requester drains.
    pub drains: Option<u64>,
    /// Drain time p50, us.
    pub drain_p50: Option<f64>,
    /// Drain time p99, us.
    pub drain_p99: Option<f64>,
    /// Drain time max, us.
    pub drain_max: Option<f64>,
    /// Drains that stalled.
    pub stalls: Option<u64>,
    /// Whether Ctrl-C cut the run short.
    #[serde(default)]
    pub interrupted: bool,
}

impl Row {
    /// The row of an oslat result of ours (its first thread); `name` names the run.
    pub fn from_oslat(name: &str, doc: &Envelope<OslatBody>) -> Row {
        doc.body
            .thread
            .0
            .first()
            .map(|t| {
                let view = ThreadView {
                    tool: Tool::Oslat,
                    cpu: t.cpu,
                    points: Vec::new(),
                    overflow: None,
                    max_us: t.max.value(),
                    seconds: Some(t.duration),
                    bucket_us: None,
                };
                view.row(name, &doc.body.qpw)
            })
            .unwrap_or_default()
    }
}

/// Which tool wrote a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tool {
    Oslat,
    Cyclictest,
}

impl Tool {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Tool::Oslat => "oslat",
            Tool::Cyclictest => "cyclictest",
        }
    }
}

/// One measured thread of a file, as the report reads it.
#[derive(Debug, Clone)]
pub(crate) struct ThreadView {
    pub(crate) tool: Tool,
    pub(crate) cpu: usize,
    /// The in-range buckets: (key in us, count).
    pub(crate) points: Vec<(f64, u64)>,
    /// Samples known only to be at least some value.
    pub(crate) overflow: Option<svg::Overflow>,
    /// The largest sample, in us.
    pub(crate) max_us: f64,
    /// How long the thread measured, when the file tells.
    pub(crate) seconds: Option<f64>,
    /// The width of the file's buckets in us, when its keys are buckets' upper edges (oslat).
    pub(crate) bucket_us: Option<f64>,
}

impl ThreadView {
    fn total(&self) -> u64 {
        self.points.iter().map(|p| p.1).sum::<u64>() + self.overflow.map_or(0, |o| o.count)
    }

    /// The `q`-quantile off the buckets, and whether it is only a lower bound (its rank falls
    /// among the overflows).
    fn quantile(&self, q: f64) -> (f64, bool) {
        let total = self.total();
        if total == 0 {
            return (f64::NAN, false);
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for &(key, c) in &self.points {
            seen += c;
            if seen >= rank {
                return (key, false);
            }
        }
        match self.overflow {
            Some(o) => (o.from_us, true),
            None => (self.max_us, false),
        }
    }

    /// The table row: our exact figures when the file has them, else the buckets'.
    pub(crate) fn row(&self, name: &str, q: &QpwFields) -> Row {
        let ours = q.percentiles.iter().find(|p| p.cpu == self.cpu);
        let (samples, max_us, pcts, from_buckets) = match ours {
            Some(f) => (
                f.samples,
                f.us.max,
                [
                    (f.us.p99, f.us.is_lower_bound("p99")),
                    (f.us.p99_9, f.us.is_lower_bound("p99_9")),
                    (f.us.p99_99, f.us.is_lower_bound("p99_99")),
                ],
                false,
            ),
            None => (
                self.total(),
                self.max_us,
                [
                    self.quantile(0.99),
                    self.quantile(0.999),
                    self.quantile(0.9999),
                ],
                true,
            ),
        };
        let r = q.requester.as_ref();
        let i = q.interruptions.as_ref();
        Row {
            name: name.to_string(),
            tool: self.tool.name().to_string(),
            mode: q.mode.clone(),
            workload: q.workload.clone(),
            cpu: self.cpu,
            samples,
            max_us,
            p99_us: pcts[0].0,
            p99_9_us: pcts[1].0,
            p99_99_us: pcts[2].0,
            at_least: [pcts[0].1, pcts[1].1, pcts[2].1],
            from_buckets,
            from_threshold: false,
            interruptions: i.map(|i| i.count),
            interruptions_per_s: i.map(|i| i.per_second),
            during_local_op: i.map(|i| i.during_local_op),
            local_op_ns: ours.and_then(|f| f.local_op_p50_ns),
            excess_per_drain: i.and_then(|i| i.excess_per_drain_median.or(i.excess_per_drain)),
            excess_per_drain_by_round: i
                .map(|i| i.excess_per_drain_by_round.clone())
                .unwrap_or_default(),
            excess_per_drain_se: i.and_then(|i| i.excess_per_drain_se),
            preemptions_per_drain: q
                .probe_preemptions
                .as_ref()
                .and_then(|p| p.per_drain_median.or(p.per_drain)),
            target_drains: i.map(|i| i.drains_reaching_target),
            answers_per_drain: r
                .filter(|r| r.drains > 0 && r.flags_answered + r.flags_fenced > 0)
                .map(|r| r.flags_answered as f64 / r.drains as f64),
            fences_per_drain: r
                .filter(|r| r.drains > 0 && r.flags_answered + r.flags_fenced > 0)
                .map(|r| r.flags_fenced as f64 / r.drains as f64),
            drains: r.map(|r| r.drains),
            drain_p50: r.map(|r| r.time_us.p50),
            drain_p99: r.map(|r| r.time_us.p99),
            drain_max: r.map(|r| r.time_us.max),
            stalls: r.map(|r| r.stalls),
            interrupted: q.interrupted,
        }
    }

    /// For a file without our interruption count: the samples above `threshold` us (the
    /// overflows among them), and their rate when the length is known.
    pub(crate) fn count_above(&self, row: &mut Row, threshold: f64) {
        if row.interruptions.is_some() {
            return;
        }
        let count = self
            .points
            .iter()
            .filter(|p| p.0 > threshold)
            .map(|p| p.1)
            .sum::<u64>()
            + self.overflow.map_or(0, |o| o.count);
        row.interruptions = Some(count);
        row.interruptions_per_s = self.seconds.filter(|s| *s > 0.0).map(|s| count as f64 / s);
        row.from_threshold = true;
    }

    /// The median, for the default threshold.
    pub(crate) fn median(&self, q: &QpwFields) -> f64 {
        match q.percentiles.iter().find(|p| p.cpu == self.cpu) {
            Some(f) => f.us.p50,
            None => self.quantile(0.5).0,
        }
    }

    pub(crate) fn series(&self, label: String) -> Series {
        Series {
            label,
            points: self.points.clone(),
            overflow: self.overflow,
            max_us: Some(self.max_us),
            bucket_us: self.bucket_us,
        }
    }
}

/// A figure with two decimals, `>=` in front when it is only a lower bound, or `-` when there
/// is none (NaN).
fn num(v: f64, at_least: bool) -> String {
    match (v.is_nan(), at_least) {
        (true, _) => "-".to_string(),
        // Whole microseconds as before (cyclictest's -h edge); a sub-microsecond edge (oslat's
        // --bucket-width in ns) with its decimals, not as >=0.
        (false, true) if v.fract() == 0.0 => format!(">={v:.0}"),
        (false, true) => format!(">={v:.3}"),
        (false, false) => format!("{v:.2}"),
    }
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// The comparison table: target side, then requester side, then what its columns mean.
pub fn table(rows: &[Row], target: Option<usize>, threshold_ns: Option<u64>) -> String {
    let mut s = String::new();
    // The name column fits the longest name (and its marks).
    let nw = rows
        .iter()
        .map(|r| r.name.chars().count() + 2)
        .max()
        .unwrap_or(0)
        .max(14);
    heading(&mut s, target, threshold_ns, nw);
    for r in rows {
        row_line(&mut s, r, nw);
    }
    legend(&mut s, rows);
    s
}

/// The table's title and its column heads, for a name column `nw` wide.
fn heading(s: &mut String, target: Option<usize>, threshold_ns: Option<u64>, nw: usize) {
    let cpu = target.map_or_else(String::new, |c| format!(" (cpu {c})"));
    let thr = threshold_ns.map_or_else(String::new, |t| {
        format!(", interruptions = gaps >= {:.1} us", t as f64 / 1000.0)
    });
    let _ = writeln!(
        s,
        "\nTarget{cpu}: oslat gaps or cyclictest wake-up latencies in us{thr}; requester: \
         drain time in us"
    );
    let _ = writeln!(
        s,
        "{:<nw$} {:>9} {:>7} {:>7} {:>8} {:>10} {:>7} {:>7} {:>11} {:>8} {:>6} | {:>7} {:>8} {:>8} {:>9} {:>6}",
        "scenario",
        "max",
        "p99",
        "p99.9",
        "p99.99",
        "interrupt",
        "in op",
        "per s",
        "per drain",
        "switch",
        "op ns",
        "drains",
        "p50",
        "p99",
        "max",
        "stalls"
    );
    let _ = writeln!(s, "{}", "-".repeat(137 + nw));
}

/// One scenario's line.
fn row_line(s: &mut String, r: &Row, nw: usize) {
    let mark = match (r.from_buckets, r.interrupted) {
        (true, true) => "*!",
        (true, false) => "*",
        (false, true) => "!",
        (false, false) => "",
    };
    let _ = writeln!(
        s,
        "{:<nw$} {:>9.1} {:>7} {:>7} {:>8} {:>10} {:>7} {:>7} {:>11} {:>8} {:>6} | {:>7} {:>8} {:>8} {:>9} {:>6}",
        format!("{}{mark}", r.name),
        r.max_us,
        num(r.p99_us, r.at_least[0]),
        num(r.p99_9_us, r.at_least[1]),
        num(r.p99_99_us, r.at_least[2]),
        opt(r.interruptions, |v| v.to_string()),
        opt(r.during_local_op, |v| v.to_string()),
        opt(r.interruptions_per_s, |v| format!("{v:.0}")),
        opt(r.excess_per_drain, |v| match r.excess_per_drain_se {
            Some(se) => format!("{v:+.2}±{se:.2}"),
            None => format!("{v:+.2}"),
        }),
        opt(r.preemptions_per_drain, |v| format!("{v:.2}")),
        opt(r.local_op_ns, |v| format!("{v:.0}")),
        opt(r.drains, |v| v.to_string()),
        opt(r.drain_p50, |v| format!("{v:.1}")),
        opt(r.drain_p99, |v| format!("{v:.1}")),
        opt(r.drain_max, |v| format!("{v:.1}")),
        opt(r.stalls, |v| v.to_string()),
    );
}

/// Whether a row shows the figure a line of the legend explains.
type Shows = fn(&Row) -> bool;

/// The legend's lines after the first, each with the test on a row that shows the figure it
/// explains.
const LEGEND: [(Shows, &str); 10] = [
    (
        |r| r.interruptions.is_some() || r.excess_per_drain.is_some(),
        "interrupt: gaps at or above the threshold over the scenario (per s: the same per \
         second); per drain: the interruptions beyond the idle baseline's rate, per drain \
         that reached the target (the median of the rounds, ± its standard error with two \
         rounds or more; left out where a round has few drains)",
    ),
    (
        |r| r.drains.is_some(),
        "requester: drains made, the time each took (p50, p99, max, in us, from the call to \
         its return) and stalls (drains that waited --stall-threshold or longer)",
    ),
    (
        |r| r.preemptions_per_drain.is_some(),
        "switch: the probe thread's context switches per drain that reached the target, \
         involuntary (preempted) plus voluntary (it slept: on its CPU's lock while a drain \
         held it, for instance); a vCPU not running does not count: queue mode 1 to 2 (the \
         worker's wake-up, and a sleep where the probe then finds the worker holding its \
         lock), remote and fenced about 0",
    ),
    (
        |r| r.local_op_ns.is_some(),
        "op ns: the median time of the probe's own local operation, the owner's cost: the \
         workload's whole operation under its CPU's lock (taking and releasing the lock, a \
         compare-and-swap pair in queue and remote mode, a restartable sequence in fenced \
         mode, plus the work done under it), run once per --local-op-every, so from a cache \
         the probe's loop has not kept warm; timed alone with one clock read (lfence + \
         rdtsc) included, to the nanosecond",
    ),
    (
        |r| {
            r.workload
                .as_deref()
                .is_some_and(|w| w.starts_with("kernel-"))
        },
        "kernel-* rows: the requester's columns time the trigger's whole write() (for \
         kernel-lru a memory compaction), not the drain, whose runs on the target the \
         kernel table below times from the trace; their `switch` counts the filler's \
         preemptions of the probe too (it fills the target's caches before each trigger), \
         and `per drain` is left out: they run without the probe's local operation and the \
         load, unlike the idle baseline, so the trace's gaps per drain (gaps/d, below) is \
         their figure",
    ),
    (
        |r| r.during_local_op.is_some(),
        "in op: of the interruptions, those in which the probe was doing its own local \
         operation (waiting for its CPU's lock), not preempted by someone else",
    ),
    (
        |r| r.interrupted,
        "! cut short by Ctrl-C: its figures cover less time than the others'",
    ),
    (
        |r| r.from_buckets && r.tool == "oslat",
        "* oslat file: percentiles read off its histogram, whose keys are bucket upper edges \
         (the file has no exact ones)",
    ),
    (
        |r| r.from_buckets && r.tool == "cyclictest",
        "* cyclictest file: percentiles read off its histogram, whose keys are latencies in \
         whole us as cyclictest records them (key k holds [k, k+1) us: a lower edge)",
    ),
    (
        |r| r.at_least.contains(&true),
        ">=v: the percentile's rank falls among overflows, known only to be at least v us \
         (cyclictest's latencies past -h; oslat's last bucket)",
    ),
];

/// What the columns mean: each line only where a row has the figure it explains.
fn legend(s: &mut String, rows: &[Row]) {
    let _ = writeln!(
        s,
        "max, p99-p99.99: the longest gap (or latency) and the percentiles of all of them, in \
         us; on a virtual machine a maximum of milliseconds is mostly the host running \
         something else (the vCPU's steal time in /proc/stat), which no mode changes"
    );
    for (shown, line) in LEGEND {
        if rows.iter().any(shown) {
            let _ = writeln!(s, "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as a default run recorded them (issue 27): an emulated row with its rounds'
    /// standard error, and a kernel row, whose excess is left out.
    fn recorded() -> Vec<Row> {
        vec![
            Row {
                name: "queue-lru".into(),
                tool: "oslat".into(),
                workload: Some("lru".into()),
                excess_per_drain: Some(0.95),
                excess_per_drain_se: Some(0.17),
                local_op_ns: Some(41.0),
                interruptions: Some(1200),
                drains: Some(1000),
                ..Row::default()
            },
            Row {
                name: "kernel-memcg".into(),
                tool: "oslat".into(),
                workload: Some("kernel-memcg".into()),
                preemptions_per_drain: Some(3.37),
                ..Row::default()
            },
        ]
    }

    #[test]
    fn the_excess_carries_its_error_and_kernel_rows_none() {
        let t = table(&recorded(), Some(1), Some(5000));
        let line = |name: &str| t.lines().find(|l| l.starts_with(name)).unwrap().to_string();
        assert!(line("queue-lru").contains("+0.95±0.17"), "{t}");
        let kernel = line("kernel-memcg");
        assert!(!kernel.contains('±') && kernel.contains(" - "), "{kernel}");
        assert!(t.contains("interruptions = gaps >= 5.0 us"), "{t}");
    }

    #[test]
    fn the_notes_say_what_kernel_rows_and_op_ns_measure() {
        let t = table(&recorded(), Some(1), Some(5000));
        assert!(
            t.contains("kernel-* rows: the requester's columns time the trigger's whole write()"),
            "{t}"
        );
        assert!(
            t.contains("to the nanosecond") && !t.contains("10 ns steps"),
            "{t}"
        );
        // Every column has its line: the target's, the excess, the requester's, the switches.
        for note in [
            "max, p99-p99.99: the longest gap",
            "steal time",
            "interrupt: gaps at or above the threshold",
            "per drain: the interruptions beyond the idle baseline's rate",
            "requester: drains made",
            "switch: the probe thread's context switches",
        ] {
            assert!(t.contains(note), "`{note}` not in:\n{t}");
        }
        // Without a kernel row, no kernel note.
        let t = table(&recorded()[..1], Some(1), Some(5000));
        assert!(!t.contains("kernel-* rows"), "{t}");
    }
}
