//! `qpw-emu report FILE.json...`: one comparison table (see [`crate::table`]) and a histogram
//! and a CCDF plot per tool, from saved results: ours, or the real oslat's and cyclictest's.
//!
//! Every file is read and checked before anything is printed. The command line each file
//! records tells the interval (for cyclictest's samples per second) and the histogram's size.
//!
//! `summary.json` of `qpw-emu run` is recognised and skipped (its rows are the scenario files'),
//! so `report results/<ts>/*.json` works.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};

use crate::cli::ReportArgs;
use crate::json::{Buckets, CyclictestBody, Envelope, OslatBody, QpwFields};
use crate::svg::{self, Series};
use crate::table::{table, Row, ThreadView, Tool};

/// A result file, as far as the report needs it.
enum Loaded {
    Oslat(Envelope<OslatBody>),
    Cyclictest(Envelope<CyclictestBody>),
    /// `qpw-emu run`'s summary: skipped.
    Summary,
}

/// The largest file `report` reads: 64 MiB, far above what a run writes (a cyclictest file of
/// `-h 1000000` with every bucket filled on a few threads is tens of MB), so that a wrong
/// argument (`/dev/urandom`, a huge log) is refused rather than read into memory.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads `path`, when it is a regular file of at most [`MAX_FILE_BYTES`].
fn read_limited(path: &Path) -> Result<String> {
    use std::io::Read as _;
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        return Err(anyhow!(
            "{}: not a regular file (a directory, device, pipe or socket): give a JSON file",
            path.display()
        ));
    }
    let too_big = |n: u64| {
        anyhow!(
            "{}: {n} bytes, more than the {MAX_FILE_BYTES} bytes (64 MiB) report reads",
            path.display()
        )
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text))
        .with_context(|| format!("cannot read {}", path.display()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(text.len() as u64));
    }
    Ok(text)
}

fn load(path: &Path) -> Result<Loaded> {
    let text = read_limited(path)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    if value.get("tool").and_then(|t| t.as_str()) == Some("qpw-emu run") {
        return Ok(Loaded::Summary);
    }
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
    check_numbers(&value, &mut String::new()).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    // The field a value of the wrong type is in, named (`thread.0.cycles: invalid type`).
    let typed = |what: &'static str, located: Option<String>| {
        let path = path.display().to_string();
        move |e: serde_json::Error| match &located {
            Some(l) => anyhow!("{path}: not {what}: {l}"),
            None => anyhow!("{path}: not {what}: {e}"),
        }
    };
    if first.get("freq").is_some() {
        let located = locate_type_error::<crate::json::OslatThreadJson>(&value);
        let doc: Envelope<OslatBody> =
            serde_json::from_value(value).map_err(typed("an oslat result", located))?;
        for (i, f) in doc.body.qpw.percentiles.iter().enumerate() {
            check_percentiles(&format!("percentiles.{i}.us"), &f.us)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        }
        Ok(Loaded::Oslat(doc))
    } else if first.get("cycles").is_some() {
        let located = locate_type_error::<crate::json::CyclictestThreadJson>(&value);
        let doc: Envelope<CyclictestBody> =
            serde_json::from_value(value).map_err(typed("a cyclictest result", located))?;
        for (i, f) in doc.body.qpw.percentiles.iter().enumerate() {
            check_percentiles(&format!("percentiles.{i}.us"), &f.us)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        }
        Ok(Loaded::Cyclictest(doc))
    } else {
        Err(anyhow!(
            "{}: threads have neither `freq` (oslat) nor `cycles` (cyclictest)",
            path.display()
        ))
    }
}

/// Where in `value` a field has the wrong type, as `field `thread.0.cycles`: invalid type...`:
/// the parts are read one by one (each thread as a `T`, our fields, the envelope), since the
/// flattened whole loses the path.
fn locate_type_error<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> Option<String> {
    let at = |prefix: &str, e: serde_path_to_error::Error<serde_json::Error>| {
        let inner = e.path().to_string();
        let field = match (prefix, inner.as_str()) {
            (p, ".") => p.to_string(),
            ("", i) => i.to_string(),
            (p, i) => format!("{p}.{i}"),
        };
        format!("field `{field}`: {}", e.inner())
    };
    if let Some(threads) = value.get("thread").and_then(|t| t.as_object()) {
        for (k, t) in threads {
            if let Err(e) = serde_path_to_error::deserialize::<_, T>(t) {
                return Some(at(&format!("thread.{k}"), e));
            }
        }
    }
    if let Err(e) = serde_path_to_error::deserialize::<_, QpwFields>(value) {
        return Some(at("", e));
    }
    serde_path_to_error::deserialize::<_, Envelope<serde::de::IgnoredAny>>(value)
        .err()
        .map(|e| at("", e))
}

/// The largest count or integer a file may hold: 2^53, past which JSON's numbers are not exact
/// (and a sum of such counts, per second, overflows what the table can show).
const MAX_INTEGER: u64 = 1 << 53;

/// Every number of `value` (at the field path `at`) checked: integers within +-2^53, other
/// numbers within +-1e15 (no figure of a run comes near; `1e308` is a damaged or crafted
/// file); the error names the field.
fn check_numbers(value: &serde_json::Value, at: &mut String) -> std::result::Result<(), String> {
    use serde_json::Value;
    let field = |at: &str| {
        if at.is_empty() {
            "(top)".to_string()
        } else {
            at.to_string()
        }
    };
    match value {
        Value::Number(n) => {
            let ok = if let Some(u) = n.as_u64() {
                u <= MAX_INTEGER
            } else if let Some(i) = n.as_i64() {
                i.unsigned_abs() <= MAX_INTEGER
            } else {
                n.as_f64().is_some_and(|f| f.is_finite() && f.abs() <= 1e15)
            };
            if !ok {
                return Err(format!(
                    "field `{}`: {n} is out of range (integers up to 2^53 = {MAX_INTEGER}, other \
                     figures up to 1e15)",
                    field(at)
                ));
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let len = at.len();
                at.push_str(&if at.is_empty() {
                    i.to_string()
                } else {
                    format!(".{i}")
                });
                check_numbers(v, at)?;
                at.truncate(len);
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                let len = at.len();
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(k);
                check_numbers(v, at)?;
                at.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Our percentiles of one thread (at field `at`): latencies in 0-1e9 us, in increasing order.
fn check_percentiles(at: &str, p: &crate::hist::Percentiles) -> std::result::Result<(), String> {
    let all = [
        ("p50", p.p50),
        ("p90", p.p90),
        ("p99", p.p99),
        ("p99_9", p.p99_9),
        ("p99_99", p.p99_99),
        ("max", p.max),
    ];
    for (name, v) in all {
        if !(v.is_finite() && (0.0..=Buckets::MAX_KEY_US).contains(&v)) {
            return Err(format!(
                "field `{at}.{name}`: {v} is not a latency (0-1e9 us)"
            ));
        }
    }
    for pair in all.windows(2) {
        if pair[0].1 > pair[1].1 {
            return Err(format!(
                "field `{at}.{}`: {} is more than `{}`'s {}: percentiles grow",
                pair[0].0, pair[0].1, pair[1].0, pair[1].1
            ));
        }
    }
    Ok(())
}

/// The settings a file's command line gives, as the tool would read them (the defaults when
/// the line does not parse).
#[derive(Debug, Clone, Copy)]
struct Recorded {
    /// cyclictest: the base interval and the distance between the threads' intervals, in us.
    interval_us: u64,
    distance_us: u64,
    /// cyclictest: the histogram's size (`-h`/`-H`).
    histogram: Option<u64>,
}

impl Recorded {
    fn of(cmdline: &str) -> Self {
        let mut rec = Self {
            interval_us: 1000,
            distance_us: 500,
            histogram: None,
        };
        let args = crate::cli::args_for_invocation(cmdline.split_whitespace().map(Into::into));
        use clap::Parser;
        if let Ok(crate::cli::Cli {
            command: Some(crate::cli::Command::Cyclictest(c)),
        }) = crate::cli::Cli::try_parse_from(args)
        {
            rec.interval_us = c.interval;
            rec.histogram = c.histogram.or(c.histofall);
            rec.distance_us = if rec.histogram.is_some() {
                0
            } else {
                c.distance.unwrap_or(500)
            };
        }
        rec
    }
}

/// The sum of thread `i`'s histogram counts, refused past 2^53 (no run counts that many
/// samples; the table's sums and rates would overflow).
fn histogram_total(i: usize, points: &[(f64, u64)]) -> std::result::Result<u64, String> {
    points
        .iter()
        .try_fold(0u64, |sum, p| sum.checked_add(p.1))
        .filter(|&t| t <= MAX_INTEGER)
        .ok_or_else(|| {
            format!(
                "field `thread.{i}.histogram`: its counts add up past 2^53 = {MAX_INTEGER}, more \
                 samples than any run takes"
            )
        })
}

/// The threads of one file, checked: keys that are latencies, counts that add up.
fn views(path: &Path, loaded: &Loaded) -> Result<Vec<ThreadView>> {
    let bad = |i: usize, e: String| anyhow!("{}: thread {i}: {e}", path.display());
    match loaded {
        Loaded::Summary => Ok(Vec::new()),
        Loaded::Oslat(doc) => oslat_views(doc, &bad),
        Loaded::Cyclictest(doc) => cyclictest_views(doc, &bad),
    }
}

/// The threads of an oslat file; `bad` says which thread is wrong and how.
fn oslat_views(
    doc: &Envelope<OslatBody>,
    bad: &dyn Fn(usize, String) -> anyhow::Error,
) -> Result<Vec<ThreadView>> {
    // oslat's buckets are 1 us; ours say their width.
    let width_us = doc
        .body
        .qpw
        .settings
        .as_ref()
        .map_or(1.0, |s| s.bucket_width_ns as f64 / 1000.0);
    let mut out = Vec::new();
    for (i, t) in doc.body.thread.0.iter().enumerate() {
        let mut points = t.histogram.points().map_err(|e| bad(i, e))?;
        histogram_total(i, &points).map_err(|e| bad(i, e))?;
        let max = t.max.value();
        if !max.is_finite() || max > Buckets::MAX_KEY_US {
            return Err(bad(i, format!("max {max} is not a latency in 0-1e9 us")));
        }
        // oslat's last bucket holds the overflows too: when the max lies past it, its
        // samples are known only to be at least its lower edge.
        let overflow = match points.last() {
            Some(&(key, count)) if max > key => {
                points.pop();
                Some(svg::Overflow {
                    from_us: (key - 1.0).max(0.0),
                    count,
                })
            }
            _ => None,
        };
        out.push(ThreadView {
            tool: Tool::Oslat,
            cpu: t.cpu,
            points,
            overflow,
            max_us: max,
            seconds: Some(t.duration),
            bucket_us: Some(width_us),
        });
    }
    Ok(out)
}

/// The threads of a cyclictest file; `bad` says which thread is wrong and how.
fn cyclictest_views(
    doc: &Envelope<CyclictestBody>,
    bad: &dyn Fn(usize, String) -> anyhow::Error,
) -> Result<Vec<ThreadView>> {
    let rec = Recorded::of(&doc.cmdline);
    let mut out = Vec::new();
    for (i, t) in doc.body.thread.0.iter().enumerate() {
        let points = t.histogram.points().map_err(|e| bad(i, e))?;
        let in_range = histogram_total(i, &points).map_err(|e| bad(i, e))?;
        if in_range > t.cycles {
            return Err(bad(
                i,
                format!(
                    "its histogram counts {in_range} samples, more than its {} cycles",
                    t.cycles
                ),
            ));
        }
        // Samples past -h count only in `cycles`.
        let over = t.cycles - in_range;
        let from = rec
            .histogram
            .map(|h| h as f64)
            .or_else(|| points.last().map(|p| p.0 + 1.0))
            .unwrap_or(0.0);
        let overflow = (over > 0 && !points.is_empty()).then_some(svg::Overflow {
            from_us: from,
            count: over,
        });
        let interval = rec.interval_us + i as u64 * rec.distance_us;
        out.push(ThreadView {
            tool: Tool::Cyclictest,
            cpu: t.cpu,
            points,
            overflow,
            max_us: t.max as f64,
            seconds: Some(t.cycles as f64 * interval as f64 / 1e6),
            // Whole-microsecond latencies as cyclictest records them: exact values.
            bucket_us: None,
        });
    }
    Ok(out)
}

/// `qpw-emu report FILE.json...`: one table, and a histogram and a CCDF per tool.
pub fn report_cmd(args: &ReportArgs) -> Result<()> {
    let given = args
        .threshold
        .as_deref()
        .map(|t| crate::validate::float_in("--threshold", t, 0.001, 1e7))
        .transpose()?;
    if let Some(out) = &args.out {
        crate::validate::output_dir("--out", out)?;
    }
    // Every file read and checked before anything is printed.
    let (files, skipped) = read_all(&args.files)?;
    let (rows, series, thresholds_used) = tabulate(&files, given);
    for s in &skipped {
        println!("skipped {s}: the summary of a `qpw-emu run` (its rows are the scenario files')");
    }
    print!("{}", table(&rows, None, None));
    print_thresholds(&thresholds_used, given.is_some());
    let written = write_plots(args, &series)?;
    println!();
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// One file read: its name, our fields, and a view per measured CPU.
type ReadFile = (String, QpwFields, Vec<ThreadView>);

/// The plots' series, per tool.
type SeriesByTool = [(Tool, Vec<Series>); 2];

/// Every file of `paths`, read and checked; and the summaries of `qpw-emu run`, skipped.
fn read_all(paths: &[PathBuf]) -> Result<(Vec<ReadFile>, Vec<String>)> {
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for path in paths {
        let stem = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        let loaded = load(path)?;
        if matches!(loaded, Loaded::Summary) {
            skipped.push(path.display().to_string());
            continue;
        }
        let views = views(path, &loaded)?;
        let q = match &loaded {
            Loaded::Oslat(d) => d.body.qpw.clone(),
            Loaded::Cyclictest(d) => d.body.qpw.clone(),
            Loaded::Summary => QpwFields::default(),
        };
        files.push((stem, q, views));
    }
    Ok((files, skipped))
}

/// The table's rows (one per file and CPU), the plots' series, and the thresholds used for
/// files without an idle-baseline count of their own (`given`, or per tool 10 x the quietest
/// file's median), as `(tool, threshold's bits)`.
fn tabulate(files: &[ReadFile], given: Option<f64>) -> (Vec<Row>, SeriesByTool, Vec<(Tool, u64)>) {
    // The threshold for files without our count: given, or per tool 10 x the quietest file's
    // median (at least 1 us), so that every file of a tool is held to the same one.
    let threshold = |tool: Tool| -> f64 {
        given.unwrap_or_else(|| {
            let quietest = files
                .iter()
                .flat_map(|(_, q, vs)| vs.iter().filter(|v| v.tool == tool).map(|v| v.median(q)))
                .filter(|m| m.is_finite())
                .fold(f64::INFINITY, f64::min);
            (10.0 * quietest).max(1.0)
        })
    };
    let mut rows = Vec::new();
    let mut series: [(Tool, Vec<Series>); 2] =
        [(Tool::Oslat, Vec::new()), (Tool::Cyclictest, Vec::new())];
    let mut thresholds_used = Vec::new();
    for (stem, q, vs) in files {
        let label = series_label(stem, q);
        for v in vs {
            // A file of several CPUs: one row each, named apart.
            let name = if vs.len() > 1 {
                format!("{stem} cpu{}", v.cpu)
            } else {
                stem.clone()
            };
            let mut row = v.row(&name, q);
            let t = threshold(v.tool);
            v.count_above(&mut row, t);
            if row.from_threshold && !thresholds_used.contains(&(v.tool, t.to_bits())) {
                thresholds_used.push((v.tool, t.to_bits()));
            }
            rows.push(row);
            let slot = series.iter_mut().find(|(tool, _)| *tool == v.tool);
            if let Some((_, list)) = slot {
                list.push(v.series(format!("{label} cpu{}", v.cpu)));
            }
        }
    }
    (rows, series, thresholds_used)
}

/// Says, under the table, which threshold counted the interruptions of which tool's files.
fn print_thresholds(thresholds_used: &[(Tool, u64)], given: bool) {
    for (tool, bits) in thresholds_used {
        let t = f64::from_bits(*bits);
        let rule = if given {
            "--threshold".to_string()
        } else {
            "10 x the smallest median among its files, at least 1 us; --threshold to set".into()
        };
        println!(
            "interrupt, per s ({}): samples above {t} us ({rule}), for files without an \
             idle-baseline count of their own",
            tool.name()
        );
    }
}

/// Writes a histogram and a CCDF per tool beside the first file (or in `--out`); returns the
/// paths written.
fn write_plots(args: &ReportArgs, series: &SeriesByTool) -> Result<Vec<PathBuf>> {
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
    crate::validate::output_dir("--out", &out)?;
    let mut written = Vec::new();
    for (tool, list) in series {
        if list.is_empty() {
            continue;
        }
        let title = match tool {
            Tool::Oslat => "oslat: gaps",
            Tool::Cyclictest => "cyclictest: wake-up latency",
        };
        for (kind, doc) in [
            ("hist", svg::histogram(title, list)),
            ("ccdf", svg::ccdf(title, list)),
        ] {
            let p = out.join(format!("report-{}-{kind}.svg", tool.name()));
            std::fs::write(&p, doc).with_context(|| format!("cannot write {}", p.display()))?;
            written.push(p);
        }
    }
    Ok(written)
}

fn series_label(stem: &str, q: &QpwFields) -> String {
    match (&q.mode, &q.workload) {
        (Some(m), Some(w)) => format!("{m} {w}"),
        _ => stem.to_string(),
    }
}
