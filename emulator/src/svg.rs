//! Two plots, written as plain SVG (no plotting dependency): a latency histogram with a log
//! count axis, and a CDF; both with a log latency axis and one series per mode (or file).
//!
//! The SVG is built from typed elements through one small private writer, `Svg`, which escapes
//! every piece of text it is given.

use std::fmt::Write;

/// One series: a label and (latency in us, count) points in increasing latency.
#[derive(Debug, Clone)]
pub struct Series {
    /// The legend label.
    pub label: String,
    /// (bucket upper edge in microseconds, count).
    pub points: Vec<(f64, u64)>,
}

const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

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
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, width: f64) {
        let _ = writeln!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="{width}"/>"#
        );
    }

    fn text(&mut self, x: f64, y: f64, anchor: &str, size: u32, text: &str) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-family="sans-serif" font-size="{size}">{}</text>"#,
            escape(text)
        );
    }

    fn polyline(&mut self, points: &[(f64, f64)], stroke: &str) {
        let pts: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            self.body,
            r#"<polyline fill="none" stroke="{stroke}" stroke-width="1.6" points="{}"/>"#,
            pts.join(" ")
        );
    }

    fn dot(&mut self, x: f64, y: f64, fill: &str) {
        let _ = writeln!(
            self.body,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="1.8" fill="{fill}"/>"#
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

/// A log10 axis over whole decades covering `lo..hi`.
#[derive(Debug, Clone, Copy)]
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    fn covering(min: f64, max: f64) -> Self {
        let min = min.max(1e-3);
        let max = max.max(min * 10.0);
        Self {
            lo: min.log10().floor(),
            hi: max.log10().ceil(),
        }
    }

    /// Position of `v` in 0..1.
    fn frac(&self, v: f64) -> f64 {
        ((v.max(1e-12).log10() - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }

    fn decades(&self) -> impl Iterator<Item = f64> {
        (self.lo as i32..=self.hi as i32).map(|e| 10f64.powi(e))
    }
}

fn label_of(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn frame(svg: &mut Svg, title: &str, x_label: &str, y_label: &str) {
    let (x0, y0, x1, y1) = (LEFT, H - BOTTOM, W - RIGHT, TOP);
    svg.line(x0, y0, x1, y0, "black", 1.0);
    svg.line(x0, y0, x0, y1, "black", 1.0);
    svg.text(W / 2.0 - RIGHT / 2.0, 22.0, "middle", 15, title);
    svg.text((x0 + x1) / 2.0, H - 12.0, "middle", 12, x_label);
    let _ = writeln!(
        svg.body,
        r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle" font-family="sans-serif" font-size="12">{}</text>"#,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0,
        escape(y_label)
    );
}

fn x_axis(svg: &mut Svg, axis: &LogAxis) {
    let (x0, y0, x1) = (LEFT, H - BOTTOM, W - RIGHT);
    for d in axis.decades() {
        let x = x0 + axis.frac(d) * (x1 - x0);
        svg.line(x, y0, x, TOP, "#e0e0e0", 1.0);
        svg.text(x, y0 + 16.0, "middle", 11, &label_of(d));
    }
}

fn legend(svg: &mut Svg, series: &[Series]) {
    for (i, s) in series.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 18.0;
        let x = W - RIGHT + 14.0;
        svg.line(x, y, x + 22.0, y, COLORS[i % COLORS.len()], 3.0);
        svg.text(x + 28.0, y + 4.0, "start", 11, &s.label);
    }
}

fn x_range(series: &[Series]) -> LogAxis {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (min, max) = xs.fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    if min > max {
        LogAxis::covering(0.1, 10.0)
    } else {
        LogAxis::covering(min, max)
    }
}

/// A histogram with log-scaled latency and count axes.
pub fn histogram(title: &str, series: &[Series]) -> String {
    let mut svg = Svg::default();
    frame(
        &mut svg,
        title,
        "latency (us, log scale)",
        "count (log scale)",
    );
    let xa = x_range(series);
    let max_count = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(1);
    let ya = LogAxis {
        lo: 0.0,
        hi: (max_count.max(10) as f64).log10().ceil(),
    };
    x_axis(&mut svg, &xa);
    let (x0, y0, x1, y1) = (LEFT, H - BOTTOM, W - RIGHT, TOP);
    for d in ya.decades() {
        let y = y0 - ya.frac(d) * (y0 - y1);
        svg.line(x0, y, x1, y, "#e0e0e0", 1.0);
        svg.text(
            x0 - 6.0,
            y + 4.0,
            "end",
            11,
            &format!("1e{}", d.log10() as i32),
        );
    }
    for (i, s) in series.iter().enumerate() {
        // Each bucket a point at its edge; zero counts are left out (log scale).
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.1 > 0)
            .map(|&(x, c)| {
                (
                    x0 + xa.frac(x) * (x1 - x0),
                    y0 - ya.frac(c as f64) * (y0 - y1),
                )
            })
            .collect();
        let color = COLORS[i % COLORS.len()];
        svg.polyline(&pts, color);
        // A marker on every bucket, so that lone spikes far out in the tail stay visible.
        for &(x, y) in &pts {
            svg.dot(x, y, color);
        }
    }
    legend(&mut svg, series);
    svg.finish()
}

/// The cumulative distribution, with a log latency axis.
pub fn cdf(title: &str, series: &[Series]) -> String {
    let mut svg = Svg::default();
    frame(
        &mut svg,
        title,
        "latency (us, log scale)",
        "fraction at or below",
    );
    let xa = x_range(series);
    x_axis(&mut svg, &xa);
    let (x0, y0, x1, y1) = (LEFT, H - BOTTOM, W - RIGHT, TOP);
    for k in 0..=4 {
        let f = k as f64 / 4.0;
        let y = y0 - f * (y0 - y1);
        svg.line(x0, y, x1, y, "#e0e0e0", 1.0);
        svg.text(x0 - 6.0, y + 4.0, "end", 11, &format!("{f:.2}"));
    }
    for (i, s) in series.iter().enumerate() {
        let total: u64 = s.points.iter().map(|p| p.1).sum();
        if total == 0 {
            continue;
        }
        let mut seen = 0u64;
        let mut pts = Vec::with_capacity(s.points.len() * 2);
        let mut prev_y = y0;
        for &(x, c) in &s.points {
            seen += c;
            let px = x0 + xa.frac(x) * (x1 - x0);
            let py = y0 - (seen as f64 / total as f64) * (y0 - y1);
            pts.push((px, prev_y));
            pts.push((px, py));
            prev_y = py;
        }
        svg.polyline(&pts, COLORS[i % COLORS.len()]);
    }
    legend(&mut svg, series);
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_svg_with_every_label_escaped() {
        let s = vec![
            Series {
                label: "queue <lru>".into(),
                points: vec![(0.1, 1000), (5.0, 10), (800.0, 1)],
            },
            Series {
                label: "remote".into(),
                points: vec![(0.1, 1000), (1.0, 3)],
            },
        ];
        for doc in [histogram("gaps", &s), cdf("gaps", &s)] {
            assert!(doc.starts_with("<svg"));
            assert!(doc.trim_end().ends_with("</svg>"));
            assert!(doc.contains("queue &lt;lru&gt;"));
            assert_eq!(doc.matches("<polyline").count(), 2);
        }
        // Empty input still makes a document.
        assert!(histogram("x", &[]).contains("</svg>"));
    }
}
