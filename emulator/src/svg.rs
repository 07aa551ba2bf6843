//! Two plots of latency distributions that show the tail, written as plain SVG:
//!
//! - [`ccdf`]: the complementary CDF, the fraction of samples *above* each latency, on log-log
//!   axes: the latency engineer's view, where one sample in ten million still has a place
//!   (a CDF on a linear axis is a flat line at 1.0 above the first bucket);
//! - [`histogram`]: counts on a log axis over log-spaced bins (so a 250 ns bucket and a 4 ms
//!   one read alike), each non-empty bin a step; empty bins leave a gap, never a line.
//!
//! Both extend the latency axis to the largest sample and mark it (a triangle and its value),
//! and mark an *overflow*: samples known only to lie above some value (cyclictest's `-h`
//! overflows, oslat's last bucket "including overflows") are drawn as a dashed segment from
//! where the known part ends to the max, with their count, rather than left out.
//!
//! Why no plotting crate: the ones that fit (plotters) lay out text with a font backend
//! (fontconfig or a bundled TTF), and their log axes offer no dashed "unknown" segment or tail
//! marker without drawing them by hand anyway; this writer is small, escapes every piece of
//! text, and renders the same in every SVG viewer.

use std::fmt::Write;

/// Samples known only to lie at or above a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overflow {
    /// The value they are at least, in microseconds.
    pub from_us: f64,
    /// How many.
    pub count: u64,
}

/// One series: a label and (latency in us, count) points in increasing latency.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// The legend label.
    pub label: String,
    /// (value in microseconds, count): each bucket's upper edge (oslat, ours) or exact value
    /// (cyclictest's whole microseconds).
    pub points: Vec<(f64, u64)>,
    /// Samples past the known points, if the source only counts them.
    pub overflow: Option<Overflow>,
    /// The largest sample, when known (else the last point).
    pub max_us: Option<f64>,
    /// When the points are buckets' upper edges (oslat's files): the buckets' width in us.
    /// The histogram spreads each bucket's count over the log bins it covers, instead of
    /// putting it all in the bin of its upper edge (whole-microsecond buckets on bins a tenth
    /// of a decade wide left every other bin empty: a comb).
    pub bucket_us: Option<f64>,
}

impl Series {
    /// A series of exactly known points.
    pub fn exact(label: impl Into<String>, points: Vec<(f64, u64)>) -> Self {
        Self {
            label: label.into(),
            points,
            ..Self::default()
        }
    }

    fn total(&self) -> u64 {
        self.points.iter().map(|p| p.1).sum::<u64>() + self.overflow.map_or(0, |o| o.count)
    }

    fn max(&self) -> Option<f64> {
        self.max_us
            .or_else(|| self.points.last().map(|p| p.0))
            .filter(|m| *m > 0.0)
    }
}

const W: f64 = 820.0;
const H: f64 = 460.0;
const LEFT: f64 = 74.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
/// Bins per decade of the histogram's latency axis.
const BINS_PER_DECADE: f64 = 10.0;
/// Decades an axis may span at most (values are validated well inside this).
const MAX_DECADES: f64 = 14.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

/// A minimal SVG document writer.
#[derive(Debug, Default)]
struct Svg {
    body: String,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Svg {
    fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str, width: f64) {
        let _ = writeln!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="{width}"/>"#
        );
    }

    fn dashed(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str) {
        let _ = writeln!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="1.6" stroke-dasharray="5,4"/>"#
        );
    }

    fn text(&mut self, (x, y): (f64, f64), anchor: &str, size: u32, fill: &str, text: &str) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-family="sans-serif" font-size="{size}" fill="{fill}">{}</text>"#,
            escape(text)
        );
    }

    fn polyline(&mut self, points: &[(f64, f64)], stroke: &str) {
        if points.len() < 2 {
            return;
        }
        let pts: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            self.body,
            r#"<polyline fill="none" stroke="{stroke}" stroke-width="1.8" points="{}"/>"#,
            pts.join(" ")
        );
    }

    fn dot(&mut self, (x, y): (f64, f64), fill: &str) {
        let _ = writeln!(
            self.body,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.2" fill="{fill}"/>"#
        );
    }

    /// A downward triangle with its tip at (x, y): the max marker.
    fn triangle(&mut self, (x, y): (f64, f64), fill: &str) {
        let _ = writeln!(
            self.body,
            r#"<path d="M {x:.1} {y:.1} L {:.1} {:.1} L {:.1} {:.1} Z" fill="{fill}"/>"#,
            x - 5.0,
            y - 9.0,
            x + 5.0,
            y - 9.0
        );
    }

    fn finish(self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{}</svg>\n",
            self.body
        )
    }
}

/// A log10 axis from `10^lo` to `10^hi` (whole decades).
#[derive(Debug, Clone, Copy)]
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    /// Whole decades covering `min..max` (both positive; at least one decade, at most
    /// [`MAX_DECADES`], keeping the top).
    fn covering(min: f64, max: f64) -> Self {
        let max = if max.is_finite() { max.max(1e-3) } else { 1e9 };
        let min = if min.is_finite() && min > 0.0 {
            min.min(max)
        } else {
            max / 10.0
        };
        let hi = max.log10().ceil().max(min.log10().floor() + 1.0);
        let lo = min.log10().floor().max(hi - MAX_DECADES);
        Self { lo, hi }
    }

    /// Position of `v` in 0..1.
    fn frac(&self, v: f64) -> f64 {
        ((v.max(1e-300).log10() - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }

    fn decades(&self) -> impl Iterator<Item = f64> {
        (self.lo as i32..=self.hi as i32).map(|e| 10f64.powi(e))
    }
}

/// The plotting area and its two axes.
struct Frame {
    x: LogAxis,
    y: LogAxis,
}

impl Frame {
    fn px(&self, x: f64, y: f64) -> (f64, f64) {
        (
            LEFT + self.x.frac(x) * (W - RIGHT - LEFT),
            (H - BOTTOM) - self.y.frac(y) * (H - BOTTOM - TOP),
        )
    }

    /// Draws the title, axes, grid and labels.
    fn draw(&self, svg: &mut Svg, title: &str, x_label: &str, y_label: &str) {
        let (x0, y0, x1, y1) = (LEFT, H - BOTTOM, W - RIGHT, TOP);
        for d in self.x.decades() {
            let (x, _) = self.px(d, 1.0);
            svg.line((x, y0), (x, y1), "#e4e4e4", 1.0);
            svg.text((x, y0 + 16.0), "middle", 11, "black", &label_of(d));
        }
        for d in self.y.decades() {
            let (_, y) = self.px(1.0, d);
            svg.line((x0, y), (x1, y), "#e4e4e4", 1.0);
            svg.text((x0 - 6.0, y + 4.0), "end", 11, "black", &power_of(d));
        }
        svg.line((x0, y0), (x1, y0), "black", 1.0);
        svg.line((x0, y0), (x0, y1), "black", 1.0);
        svg.text((W / 2.0 - RIGHT / 2.0, 22.0), "middle", 15, "black", title);
        svg.text(((x0 + x1) / 2.0, H - 12.0), "middle", 12, "black", x_label);
        let mid = (y0 + y1) / 2.0;
        let _ = writeln!(
            svg.body,
            r#"<text x="16" y="{mid:.1}" transform="rotate(-90 16 {mid:.1})" text-anchor="middle" font-family="sans-serif" font-size="12">{}</text>"#,
            escape(y_label)
        );
    }
}

fn label_of(v: f64) -> String {
    if v >= 1e6 {
        format!("{}s", v / 1e6)
    } else if v >= 1e3 {
        format!("{}ms", v / 1e3)
    } else if v >= 1.0 {
        format!("{v:.0}us")
    } else {
        format!("{}ns", (v * 1e3).round())
    }
}

fn power_of(v: f64) -> String {
    format!("1e{}", v.log10().round() as i32)
}

/// The legend, then the notes, each in its series' colour.
fn legend(svg: &mut Svg, series: &[Series], notes: &[(String, &str)]) {
    let x = W - RIGHT + 14.0;
    let mut y = TOP + 10.0;
    for (i, s) in series.iter().enumerate() {
        svg.line((x, y), (x + 22.0, y), color(i), 3.0);
        svg.text((x + 28.0, y + 4.0), "start", 11, "black", &s.label);
        y += 18.0;
    }
    y += 8.0;
    for (n, c) in notes {
        svg.text((x, y), "start", 10, c, n);
        y += 14.0;
    }
}

/// The latency range every series needs, its max and overflow included.
fn x_axis(series: &[Series]) -> LogAxis {
    let xs = series.iter().flat_map(|s| {
        s.points
            .iter()
            .map(|p| p.0)
            .chain(s.max())
            .chain(s.overflow.map(|o| o.from_us))
    });
    let (min, max) = xs
        .filter(|x| x.is_finite() && *x > 0.0)
        .fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    if min > max {
        LogAxis::covering(0.1, 10.0)
    } else {
        LogAxis::covering(min, max)
    }
}

/// The complementary CDF: for each latency, the fraction of samples above it; log-log.
pub fn ccdf(title: &str, series: &[Series]) -> String {
    let mut svg = Svg::default();
    let smallest = series
        .iter()
        .map(Series::total)
        .filter(|&t| t > 0)
        .max()
        .map_or(1e-3, |t| 1.0 / t as f64);
    let frame = Frame {
        x: x_axis(series),
        y: LogAxis::covering(smallest, 1.0),
    };
    frame.draw(
        &mut svg,
        title,
        "latency (log scale)",
        "fraction of samples above (log scale)",
    );
    let floor = 10f64.powf(frame.y.lo);
    let mut notes = Vec::new();
    let mut labels: Vec<(f64, f64)> = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let total = s.total();
        if total == 0 {
            continue;
        }
        let c = color(i);
        // Steps: up to each point the fraction above the one before; at the point, it drops.
        let mut above = total;
        let mut pts = Vec::with_capacity(2 * s.points.len() + 1);
        let first_x = s.points.first().map_or(1.0, |p| p.0);
        pts.push(frame.px(first_x, 1.0));
        for &(x, n) in &s.points {
            pts.push(frame.px(x, above as f64 / total as f64));
            above -= n.min(above);
            if above == 0 {
                pts.push(frame.px(x, floor));
                break;
            }
            pts.push(frame.px(x, above as f64 / total as f64));
        }
        svg.polyline(&pts, c);
        let max = s.max();
        if let Some(o) = s.overflow.filter(|o| o.count > 0) {
            // Only their count is known: a dashed line from where they start to the max.
            let frac = o.count as f64 / total as f64;
            let start = frame.px(o.from_us, frac);
            let end = frame.px(max.unwrap_or(o.from_us).max(o.from_us), 1.0 / total as f64);
            svg.dashed(start, end, c);
            svg.dot(start, c);
            notes.push((
                format!("dashed: {} samples >= {}", o.count, label_of(o.from_us)),
                c,
            ));
        }
        if let Some(m) = max {
            let tip = frame.px(m, 1.0 / total as f64);
            svg.triangle(tip, c);
            // Nearby maxima's labels go one above the other instead of over each other.
            let mut y = tip.1 - 12.0;
            while labels
                .iter()
                .any(|&(lx, ly)| (lx - tip.0).abs() < 44.0 && (ly - y).abs() < 11.0)
            {
                y -= 11.0;
            }
            labels.push((tip.0, y));
            svg.text((tip.0, y), "middle", 10, c, &label_of_value(m));
        }
    }
    notes.push(("triangle: the largest sample".to_string(), "#444"));
    legend(&mut svg, series, &notes);
    svg.finish()
}

/// A value as a marker's label: `4.06ms`, `850us`.
fn label_of_value(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{us:.0}us")
    }
}

/// Counts over log-spaced bins (ten per decade) of the latency axis, each
/// non-empty bin drawn as a step; a gap where a bin is empty.
pub fn histogram(title: &str, series: &[Series]) -> String {
    let mut svg = Svg::default();
    let xa = x_axis(series);
    let bins = Bins {
        lo: xa.lo,
        n: ((xa.hi - xa.lo) * BINS_PER_DECADE).round().max(1.0) as usize,
    };
    let binned: Vec<Vec<f64>> = series.iter().map(|s| bins.counts(s)).collect();
    let top = binned.iter().flatten().copied().fold(1.0, f64::max).ceil() as u64;
    // From half a count, so that a bin of one sits clearly above the axis.
    let frame = Frame {
        x: xa,
        y: LogAxis {
            lo: 0.5f64.log10(),
            hi: (top as f64 * 2.0).log10().ceil(),
        },
    };
    frame.draw(
        &mut svg,
        title,
        "latency (log scale)",
        &format!(
            "count per bin ({} bins per decade, log scale)",
            BINS_PER_DECADE
        ),
    );
    let base = 0.5;
    let mut notes = Vec::new();
    for (i, (s, counts)) in series.iter().zip(&binned).enumerate() {
        let c = color(i);
        bins.draw_steps(&mut svg, &frame, counts, base, c);
        if let Some(o) = s.overflow.filter(|o| o.count > 0) {
            // Only their count and range are known: one dot for the count where they start,
            // the range dashed along the baseline. (A line at the count's height across the
            // range read as that count in every bin it crossed.)
            let at = frame.px(o.from_us, o.count as f64);
            let from = frame.px(o.from_us, base);
            let to = frame.px(s.max().unwrap_or(o.from_us).max(o.from_us), base);
            svg.dashed(from, to, c);
            svg.dot(at, c);
            notes.push((
                format!("dashed: {} samples >= {}", o.count, label_of(o.from_us)),
                c,
            ));
        }
        if let Some(m) = s.max() {
            let tip = frame.px(m, base);
            svg.triangle((tip.0, tip.1 - 2.0), c);
        }
    }
    notes.push(("triangle: the largest sample".to_string(), "#444"));
    legend(&mut svg, series, &notes);
    svg.finish()
}

/// The histogram's log-spaced bins: [`BINS_PER_DECADE`] a decade from the axis's low end.
struct Bins {
    /// The axis's low end, as a power of ten.
    lo: f64,
    /// How many bins.
    n: usize,
}

impl Bins {
    /// The bin `x` falls in (the first or the last one beyond the axis).
    fn of(&self, x: f64) -> usize {
        (((x.max(1e-300).log10() - self.lo) * BINS_PER_DECADE)
            .floor()
            .max(0.0) as usize)
            .min(self.n - 1)
    }

    /// The lower edge of bin `b`.
    fn edge(&self, b: usize) -> f64 {
        10f64.powf(self.lo + b as f64 / BINS_PER_DECADE)
    }

    /// The counts of series `s` in each bin; a bucket of known width spread over the bins it
    /// covers.
    fn counts(&self, s: &Series) -> Vec<f64> {
        let mut bins = vec![0f64; self.n];
        for &(x, n) in &s.points {
            match s.bucket_us.filter(|w| *w > 0.0 && x > *w) {
                // Spread over the bins [x - w, x) covers, by the share of it each covers.
                Some(w) => {
                    let (lo, hi) = (x - w, x);
                    for (b, bin) in bins
                        .iter_mut()
                        .enumerate()
                        .take(self.of(hi * (1.0 - 1e-12)) + 1)
                        .skip(self.of(lo))
                    {
                        let share = (hi.min(self.edge(b + 1)) - lo.max(self.edge(b))).max(0.0) / w;
                        *bin += n as f64 * share;
                    }
                }
                None => bins[self.of(x)] += n as f64,
            }
        }
        bins
    }

    /// Runs of non-empty bins of `counts`, each drawn as one step outline from and to the
    /// baseline `base`, in colour `c`.
    fn draw_steps(&self, svg: &mut Svg, frame: &Frame, counts: &[f64], base: f64, c: &str) {
        let mut b = 0;
        while b < self.n {
            if counts[b] <= 0.0 {
                b += 1;
                continue;
            }
            let mut pts = vec![frame.px(self.edge(b), base)];
            while b < self.n && counts[b] > 0.0 {
                let y = counts[b].max(base);
                pts.push(frame.px(self.edge(b), y));
                pts.push(frame.px(self.edge(b + 1), y));
                b += 1;
            }
            pts.push(frame.px(self.edge(b), base));
            svg.polyline(&pts, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Vec<Series> {
        vec![
            Series::exact("queue <lru>", vec![(0.1, 1000), (5.0, 10), (800.0, 1)]),
            Series {
                label: "remote".into(),
                points: vec![(0.1, 1000), (1.0, 3)],
                overflow: Some(Overflow {
                    from_us: 20.0,
                    count: 2,
                }),
                max_us: Some(22_000.0),
                bucket_us: None,
            },
        ]
    }

    #[test]
    fn plots_are_svg_with_every_label_escaped_and_the_tail_marked() {
        let s = two();
        for doc in [histogram("gaps", &s), ccdf("gaps", &s)] {
            assert!(doc.starts_with("<svg"));
            assert!(doc.trim_end().ends_with("</svg>"));
            assert!(doc.contains("queue &lt;lru&gt;"));
            // One max marker per series, and the overflow drawn dashed.
            assert_eq!(doc.matches("<path").count(), 2);
            assert_eq!(doc.matches("stroke-dasharray").count(), 1);
            // The axis reaches the 22 ms max.
            assert!(doc.contains(">100ms<"), "the x axis stops short");
        }
        assert!(histogram("x", &[]).contains("</svg>"));
        assert!(ccdf("x", &[]).contains("</svg>"));
    }

    #[test]
    fn histogram_leaves_a_gap_at_empty_bins() {
        // Two non-empty bins decades apart: two separate steps, not one line joining them.
        let s = vec![Series::exact("a", vec![(1.0, 5), (1000.0, 1)])];
        let doc = histogram("x", &s);
        assert_eq!(doc.matches("<polyline").count(), 2);
    }

    /// Issue 25's plots: whole-microsecond buckets make no comb, the overflow is a dot and
    /// a baseline range, and two maxima close together get labels apart.
    #[test]
    fn buckets_spread_overflow_at_the_baseline_and_labels_apart() {
        // oslat's 1 us buckets from 1 to 40 us, each with samples: one run of bins, no gaps.
        let points: Vec<(f64, u64)> = (1..=40).map(|k| (k as f64, 100)).collect();
        let mut s = Series::exact("oslat cpu1", points.clone());
        s.bucket_us = Some(1.0);
        assert_eq!(
            histogram("x", std::slice::from_ref(&s))
                .matches("<polyline")
                .count(),
            1
        );
        s.bucket_us = None;
        assert!(
            histogram("x", std::slice::from_ref(&s))
                .matches("<polyline")
                .count()
                > 1,
            "without the width the comb is there: the test would not see a regression"
        );
        // The overflow's dashed range lies on the baseline (y1 == y2, the lowest y drawn).
        let doc = histogram("x", &two());
        let dashed = doc
            .lines()
            .find(|l| l.contains("stroke-dasharray"))
            .unwrap();
        let attr = |name: &str| -> f64 {
            let at = dashed.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            dashed[at..].split('"').next().unwrap().parse().unwrap()
        };
        assert_eq!(attr("y1"), attr("y2"), "{dashed}");
        let base = frame_base_y(&doc);
        assert!(
            (attr("y1") - base).abs() < 0.2,
            "{dashed} vs baseline {base}"
        );
        // Two series whose maxima are 1 % apart: their labels do not overlap.
        let a = Series::exact("a", vec![(1.0, 10), (1000.0, 1)]);
        let b = Series::exact("b", vec![(1.0, 10), (1010.0, 1)]);
        let doc = ccdf("x", &[a, b]);
        let ys: Vec<f64> = doc
            .lines()
            .filter(|l| l.contains("font-size=\"10\"") && l.contains(">1.0"))
            .map(|l| {
                let at = l.find(" y=\"").unwrap() + 4;
                l[at..].split('"').next().unwrap().parse().unwrap()
            })
            .collect();
        assert_eq!(ys.len(), 2, "{doc}");
        assert!((ys[0] - ys[1]).abs() >= 11.0, "labels overlap: {ys:?}");
    }

    /// The y of the histogram's baseline: the first point of its first step outline.
    fn frame_base_y(doc: &str) -> f64 {
        let l = doc.lines().find(|l| l.contains("<polyline")).unwrap();
        let pts = l.split("points=\"").nth(1).unwrap();
        pts.split(' ')
            .next()
            .unwrap()
            .split(',')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn huge_or_odd_values_keep_the_axis_bounded() {
        let a = LogAxis::covering(1e-9, f64::INFINITY);
        assert!(a.hi - a.lo <= MAX_DECADES);
        let b = LogAxis::covering(f64::NAN, 5.0);
        assert!(b.hi > b.lo);
    }
}
