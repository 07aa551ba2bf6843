//! Text tables and plots of results: the experiment's comparison table, and `qpw-emu report`
//! over saved JSON files (ours, or the real oslat's and cyclictest's, whose files lack our
//! fields: their percentiles are then read off the histogram, bucket upper edges, and say so).

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};

use crate::cli::ReportArgs;
use crate::json::{Buckets, CyclictestBody, Envelope, OslatBody, QpwFields};
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
    /// Interruptions beyond the idle rate, per drain that reached the target: the median over
    /// the rounds of `qpw-emu run` (each against its own round's idle rate), else the figure
    /// pooled over the whole run.
    pub excess_per_drain: Option<f64>,
    /// The same, round by round (`qpw-emu run` only).
    #[serde(default)]
    pub excess_per_drain_by_round: Vec<Option<f64>>,
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
    /// The rows of an oslat result (one per thread); `name` names the run.
    pub fn from_oslat_all(name: &str, doc: &Envelope<OslatBody>) -> Vec<Row> {
        doc.body
            .thread
            .0
            .iter()
            .map(|t| {
                let points = t.histogram.points();
                Row::build(name, "oslat", &doc.body.qpw, t.cpu, t.max.value(), &points)
            })
            .collect()
    }

    /// The first row of an oslat result.
    pub fn from_oslat(name: &str, doc: &Envelope<OslatBody>) -> Row {
        Self::from_oslat_all(name, doc)
            .into_iter()
            .next()
            .unwrap_or_default()
    }

    fn build(
        name: &str,
        tool: &str,
        q: &QpwFields,
        cpu: usize,
        max: f64,
        points: &[(f64, u64)],
    ) -> Row {
        let ours = q.percentiles.iter().find(|p| p.cpu == cpu);
        let (samples, max_us, p99, p999, p9999, from_buckets) = match ours {
            Some(f) => (
                f.samples,
                f.us.max,
                f.us.p99,
                f.us.p99_9,
                f.us.p99_99,
                false,
            ),
            // A file with no histogram (cyclictest without -h): no percentiles to give.
            None if points.is_empty() => (0, max, f64::NAN, f64::NAN, f64::NAN, true),
            None => {
                let total: u64 = points.iter().map(|p| p.1).sum();
                (
                    total,
                    max,
                    bucket_quantile(points, 0.99),
                    bucket_quantile(points, 0.999),
                    bucket_quantile(points, 0.9999),
                    true,
                )
            }
        };
        let r = q.requester.as_ref();
        let i = q.interruptions.as_ref();
        Row {
            name: name.to_string(),
            tool: tool.to_string(),
            mode: q.mode.clone(),
            workload: q.workload.clone(),
            cpu,
            samples,
            max_us,
            p99_us: p99,
            p99_9_us: p999,
            p99_99_us: p9999,
            from_buckets,
            from_threshold: false,
            interruptions: i.map(|i| i.count),
            interruptions_per_s: i.map(|i| i.per_second),
            during_local_op: i.map(|i| i.during_local_op),
            excess_per_drain: i.and_then(|i| i.excess_per_drain_median.or(i.excess_per_drain)),
            excess_per_drain_by_round: i
                .map(|i| i.excess_per_drain_by_round.clone())
                .unwrap_or_default(),
            target_drains: i.map(|i| i.drains_reaching_target),
            drains: r.map(|r| r.drains),
            drain_p50: r.map(|r| r.time_us.p50),
            drain_p99: r.map(|r| r.time_us.p99),
            drain_max: r.map(|r| r.time_us.max),
            stalls: r.map(|r| r.stalls),
            interrupted: q.interrupted,
        }
    }
}

/// The `q`-quantile of (upper edge, count) buckets: the edge where the count reaches it.
pub fn bucket_quantile(points: &[(f64, u64)], q: f64) -> f64 {
    let total: u64 = points.iter().map(|p| p.1).sum();
    if total == 0 {
        return 0.0;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for &(edge, c) in points {
        seen += c;
        if seen >= rank {
            return edge;
        }
    }
    points.last().map_or(0.0, |p| p.0)
}

/// A figure with two decimals, or `-` when there is none (NaN).
fn num(v: f64) -> String {
    if v.is_nan() {
        "-".to_string()
    } else {
        format!("{v:.2}")
    }
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// The comparison table: target side, then requester side.
pub fn table(rows: &[Row], target: Option<usize>, threshold_ns: Option<u64>) -> String {
    let mut s = String::new();
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
        "{:<14} {:>9} {:>7} {:>7} {:>8} {:>10} {:>7} {:>7} {:>9} | {:>7} {:>8} {:>8} {:>9} {:>6}",
        "scenario",
        "max",
        "p99",
        "p99.9",
        "p99.99",
        "interrupt",
        "in op",
        "per s",
        "per drain",
        "drains",
        "p50",
        "p99",
        "max",
        "stalls"
    );
    let _ = writeln!(s, "{}", "-".repeat(133));
    for r in rows {
        let mark = match (r.from_buckets, r.interrupted) {
            (true, true) => "*!",
            (true, false) => "*",
            (false, true) => "!",
            (false, false) => "",
        };
        let _ = writeln!(
            s,
            "{:<14} {:>9.1} {:>7} {:>7} {:>8} {:>10} {:>7} {:>7} {:>9} | {:>7} {:>8} {:>8} {:>9} {:>6}",
            format!("{}{mark}", r.name),
            r.max_us,
            num(r.p99_us),
            num(r.p99_9_us),
            num(r.p99_99_us),
            opt(r.interruptions, |v| v.to_string()),
            opt(r.during_local_op, |v| v.to_string()),
            opt(r.interruptions_per_s, |v| format!("{v:.0}")),
            opt(r.excess_per_drain, |v| format!("{v:+.2}")),
            opt(r.drains, |v| v.to_string()),
            opt(r.drain_p50, |v| format!("{v:.1}")),
            opt(r.drain_p99, |v| format!("{v:.1}")),
            opt(r.drain_max, |v| format!("{v:.1}")),
            opt(r.stalls, |v| v.to_string()),
        );
    }
    if rows.iter().any(|r| r.during_local_op.is_some()) {
        let _ = writeln!(
            s,
            "in op: of the interruptions, those in which the probe was doing its own local \
             operation (waiting for its CPU's lock), not preempted by someone else"
        );
    }
    if rows.iter().any(|r| r.interrupted) {
        let _ = writeln!(
            s,
            "! cut short by Ctrl-C: its figures cover less time than the others'"
        );
    }
    if rows.iter().any(|r| r.from_buckets) {
        let _ = writeln!(
            s,
            "* percentiles read off the histogram's bucket upper edges (the file has no exact ones)"
        );
    }
    s
}

/// A result file, as far as the report needs it.
enum Loaded {
    Oslat(Envelope<OslatBody>),
    Cyclictest(Envelope<CyclictestBody>),
}

fn load(path: &Path) -> Result<Loaded> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let first = value
        .get("thread")
        .and_then(|t| t.as_object())
        .and_then(|t| t.values().next())
        .ok_or_else(|| {
            anyhow!(
                "{}: no `thread` object: not an oslat or cyclictest result",
                path.display()
            )
        })?;
    if first.get("freq").is_some() {
        Ok(Loaded::Oslat(serde_json::from_value(value).with_context(
            || format!("{}: not an oslat result", path.display()),
        )?))
    } else if first.get("cycles").is_some() {
        Ok(Loaded::Cyclictest(
            serde_json::from_value(value)
                .with_context(|| format!("{}: not a cyclictest result", path.display()))?,
        ))
    } else {
        Err(anyhow!(
            "{}: threads have neither `freq` (oslat) nor `cycles` (cyclictest)",
            path.display()
        ))
    }
}

/// `qpw-emu report FILE.json...`: one table, and a histogram and a CDF per tool.
pub fn report_cmd(args: &ReportArgs) -> Result<()> {
    let threshold = crate::validate::float_in("--threshold", &args.threshold, 0.001, 1e7)?;
    let mut rows = Vec::new();
    let mut oslat_series = Vec::new();
    let mut cyclic_series = Vec::new();
    for path in &args.files {
        let stem = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        match load(path)? {
            Loaded::Oslat(doc) => {
                let label = series_label(&stem, &doc.body.qpw);
                for (t, mut row) in doc
                    .body
                    .thread
                    .0
                    .iter()
                    .zip(Row::from_oslat_all(&stem, &doc))
                {
                    let points = t.histogram.points();
                    count_above(&mut row, &points, threshold, t.duration);
                    oslat_series.push(Series {
                        label: format!("{label} cpu{}", t.cpu),
                        points,
                    });
                    rows.push(row);
                }
            }
            Loaded::Cyclictest(doc) => {
                let label = series_label(&stem, &doc.body.qpw);
                for t in &doc.body.thread.0 {
                    let points = Buckets::points(&t.histogram);
                    let mut row = Row::build(
                        &stem,
                        "cyclictest",
                        &doc.body.qpw,
                        t.cpu,
                        t.max as f64,
                        &points,
                    );
                    let interval_s = doc
                        .body
                        .qpw
                        .settings
                        .as_ref()
                        .and_then(|s| s.interval_us)
                        .map_or(0.0, |us| us as f64 / 1e6);
                    count_above(&mut row, &points, threshold, t.cycles as f64 * interval_s);
                    rows.push(row);
                    cyclic_series.push(Series {
                        label: format!("{label} cpu{}", t.cpu),
                        points,
                    });
                }
            }
        }
    }
    print!("{}", table(&rows, None, None));
    if rows.iter().any(|r| r.from_threshold) {
        println!(
            "interrupt, per s: samples in buckets above {threshold} us (--threshold), for files \
             without an idle-baseline count of their own"
        );
    }
    let out: PathBuf = match &args.out {
        Some(d) => d.clone(),
        None => args
            .files
            .first()
            .and_then(|f| f.parent())
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut written = Vec::new();
    for (tool, series) in [("oslat", &oslat_series), ("cyclictest", &cyclic_series)] {
        if series.is_empty() {
            continue;
        }
        let title = format!(
            "{tool}: {}",
            if tool == "oslat" {
                "gaps"
            } else {
                "wake-up latency"
            }
        );
        for (kind, doc) in [
            ("hist", svg::histogram(&title, series)),
            ("cdf", svg::cdf(&title, series)),
        ] {
            let p = out.join(format!("report-{tool}-{kind}.svg"));
            std::fs::write(&p, doc).with_context(|| format!("cannot write {}", p.display()))?;
            written.push(p);
        }
    }
    println!();
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// For a file without our interruption count: the samples in buckets whose upper edge is
/// above `threshold` us, and their rate over `seconds` (when known).
fn count_above(row: &mut Row, points: &[(f64, u64)], threshold: f64, seconds: f64) {
    if row.interruptions.is_some() || points.is_empty() {
        return;
    }
    let count = points
        .iter()
        .filter(|p| p.0 > threshold)
        .map(|p| p.1)
        .sum::<u64>();
    row.interruptions = Some(count);
    row.interruptions_per_s = (seconds > 0.0).then(|| count as f64 / seconds);
    row.from_threshold = true;
}

fn series_label(stem: &str, q: &QpwFields) -> String {
    match (&q.mode, &q.workload) {
        (Some(m), Some(w)) => format!("{m} {w}"),
        _ => stem.to_string(),
    }
}
