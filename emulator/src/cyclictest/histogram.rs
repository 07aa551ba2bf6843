//! cyclictest's `# Histogram` block, from a finished run.

use std::io::Write;

use super::{CyclicRun, CyclicThread};

/// cyclictest's `# Histogram` block (`print_hist()`), written to `out`. `histofall` adds the
/// all-threads column (with more than one thread).
pub fn write_histogram(
    out: &mut impl Write,
    run: &CyclicRun,
    buckets: usize,
    histofall: bool,
) -> std::io::Result<()> {
    let ts = &run.threads;
    let all = histofall && ts.len() > 1;
    writeln!(out, "# Histogram")?;
    let totals = write_buckets(out, ts, buckets, all)?;
    write_summary(out, ts, &totals, all)?;
    writeln!(out, "# Histogram Overflow at cycle number:")?;
    for (i, t) in ts.iter().enumerate() {
        let mut line = format!("# Thread {i}:");
        for c in &t.outliers {
            line.push_str(&format!(" {c:05}"));
        }
        let others = t.hist.overflow().saturating_sub(t.outliers.len() as u64);
        if others > 0 {
            line.push_str(&format!(" # {others:05} others"));
        }
        writeln!(out, "{line}")?;
    }
    writeln!(out)
}

/// The first `buckets` buckets, a line each with a column per thread (and the all-threads
/// column with `all`); returns each column's total.
fn write_buckets(
    out: &mut impl Write,
    ts: &[CyclicThread],
    buckets: usize,
    all: bool,
) -> std::io::Result<Vec<u64>> {
    let mut totals = vec![0u64; ts.len() + 1];
    for i in 0..buckets {
        let mut line = format!("{i:06} ");
        let mut sum = 0;
        for (j, t) in ts.iter().enumerate() {
            let c = t.hist.counts().get(i).copied().unwrap_or(0);
            line.push_str(&format!("{c:06}"));
            if j + 1 < ts.len() {
                line.push('\t');
            }
            totals[j] += c;
            sum += c;
        }
        if all {
            line.push_str(&format!("\t{sum:06}"));
            totals[ts.len()] += sum;
        }
        writeln!(out, "{line}")?;
    }
    Ok(totals)
}

/// The `# Total`, `# Min/Avg/Max Latencies` and `# Histogram Overflows` lines, with the
/// all-threads figure where 2.4 gives one (with `all`).
fn write_summary(
    out: &mut impl Write,
    ts: &[CyclicThread],
    totals: &[u64],
    all: bool,
) -> std::io::Result<()> {
    let row = |label: &str, cells: Vec<String>, extra: Option<String>| {
        let mut s = format!("# {label}:");
        for c in cells.into_iter().chain(extra.filter(|_| all)) {
            s.push(' ');
            s.push_str(&c);
        }
        s
    };
    let per = |f: &dyn Fn(&CyclicThread) -> u64, width: usize| -> Vec<String> {
        ts.iter().map(|t| format!("{:0width$}", f(t))).collect()
    };
    writeln!(
        out,
        "{}",
        row(
            "Total",
            totals[..ts.len()]
                .iter()
                .map(|c| format!("{c:09}"))
                .collect(),
            Some(format!("{:09}", totals[ts.len()]))
        )
    )?;
    writeln!(out, "{}", row("Min Latencies", per(&|t| t.min, 5), None))?;
    writeln!(out, "{}", row("Avg Latencies", per(&|t| t.avg(), 5), None))?;
    let maxmax = ts.iter().map(|t| t.max).max().unwrap_or(0);
    writeln!(
        out,
        "{}",
        row(
            "Max Latencies",
            per(&|t| t.max, 5),
            Some(format!("{maxmax:05}"))
        )
    )?;
    let overflows: u64 = ts.iter().map(|t| t.hist.overflow()).sum();
    writeln!(
        out,
        "{}",
        row(
            "Histogram Overflows",
            per(&|t| t.hist.overflow(), 5),
            Some(format!("{overflows:05}"))
        )
    )
}
