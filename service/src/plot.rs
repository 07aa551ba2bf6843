//! The comparison's plot: request p99 against scrape rate, one line per mode, as an SVG.
//!
//! Written by hand rather than with a plotting crate: one chart of a few lines on a log axis
//! is some 150 lines, and `plotters` would bring a font stack to draw it.

use std::fmt::Write as _;

/// One line of the chart: a name and its (x, y) points, x > 0.
pub type Series = (String, Vec<(f64, f64)>);

/// The chart's width and height, in pixels.
const W: f64 = 720.0;
/// See [`W`].
const H: f64 = 420.0;
/// The margins around the plot area, in pixels: the legend sits in the right one.
const LEFT: f64 = 70.0;
/// See [`LEFT`].
const RIGHT: f64 = 150.0;
/// See [`LEFT`].
const TOP: f64 = 40.0;
/// See [`LEFT`].
const BOTTOM: f64 = 50.0;
/// The series' colours, in turn.
const COLOURS: [&str; 6] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// An SVG chart of `series` with a logarithmic x axis.
pub fn chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let scale = Scale::of(series);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        (W - RIGHT + LEFT) / 2.0,
        escape(title)
    );
    axes(&mut s, &scale, series, x_label, y_label);
    for (i, (name, points)) in series.iter().enumerate() {
        line(&mut s, &scale, i, name, points);
    }
    s.push_str("</svg>\n");
    s
}

/// Where the points fall: the x axis from `x0` to `x1` (logarithmic), the y axis from 0 to
/// `y1`.
#[derive(Debug)]
struct Scale {
    /// The smallest x.
    x0: f64,
    /// The largest x.
    x1: f64,
    /// The top of the y axis.
    y1: f64,
}

impl Scale {
    /// The axes that hold every point of `series`: x from the smallest to the largest x
    /// (1 to 10 when there is none or one is not positive; a decade when all are one), y up
    /// to a tenth above the largest y (1 when none is positive).
    fn of(series: &[Series]) -> Self {
        let pts = series.iter().flat_map(|s| s.1.iter());
        let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        if x0 > x1 || x0 <= 0.0 {
            (x0, x1) = (1.0, 10.0);
        }
        if x1 <= x0 {
            x1 = x0 * 10.0;
        }
        let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
        Self { x0, x1, y1 }
    }

    /// The horizontal pixel of `x`.
    fn px(&self, x: f64) -> f64 {
        LEFT + (x.ln() - self.x0.ln()) / (self.x1.ln() - self.x0.ln()) * (W - LEFT - RIGHT)
    }

    /// The vertical pixel of `y`.
    fn py(&self, y: f64) -> f64 {
        H - BOTTOM - y / self.y1 * (H - TOP - BOTTOM)
    }
}

/// The axes, a tick at each point's x, a tick and a grid line at each fifth of y, and the
/// axes' labels.
fn axes(s: &mut String, scale: &Scale, series: &[Series], x_label: &str, y_label: &str) {
    let _ = write!(
        s,
        r#"<path d="M{LEFT} {TOP} V{} H{}" stroke="black" fill="none"/>"#,
        H - BOTTOM,
        W - RIGHT
    );
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{x}</text>"#,
            scale.px(x),
            H - BOTTOM + 16.0
        );
    }
    for i in 0..=5 {
        let y = scale.y1 * f64::from(i) / 5.0;
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{y:.0}</text><path d="M{LEFT} {:.1} H{}" stroke="lightgray"/>"#,
            LEFT - 6.0,
            scale.py(y) + 4.0,
            scale.py(y),
            W - RIGHT
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (W - RIGHT + LEFT) / 2.0,
        H - 12.0,
        escape(x_label)
    );
    let _ = write!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"#,
        H / 2.0,
        H / 2.0,
        escape(y_label)
    );
}

/// The `i`th series: its line, a dot at each point, and its entry in the legend.
fn line(s: &mut String, scale: &Scale, i: usize, name: &str, points: &[(f64, f64)]) {
    let c = COLOURS[i % COLOURS.len()];
    let d: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(j, &(x, y))| {
            format!(
                "{}{:.1} {:.1}",
                if j == 0 { "M" } else { "L" },
                scale.px(x),
                scale.py(y)
            )
        })
        .collect();
    let _ = write!(
        s,
        r#"<path d="{}" stroke="{c}" stroke-width="2" fill="none"/>"#,
        d.join(" ")
    );
    for &(x, y) in points {
        let _ = write!(
            s,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
            scale.px(x),
            scale.py(y)
        );
    }
    let ly = TOP + 20.0 * i as f64;
    let _ = write!(
        s,
        r#"<path d="M{} {ly} h20" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
        W - RIGHT + 10.0,
        W - RIGHT + 36.0,
        ly + 4.0,
        escape(name)
    );
}

/// `t` with `&`, `<` and `>` escaped, for the text of an SVG element.
fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_and_a_legend_per_series() {
        let svg = chart(
            "t",
            "x",
            "y",
            &[
                ("queue".into(), vec![(10.0, 5.0), (100.0, 50.0)]),
                ("remote <1>".into(), vec![(10.0, 4.0), (100.0, 4.0)]),
            ],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("stroke-width=\"2\" fill=\"none\"").count(), 2);
        assert!(svg.contains(">queue<") && svg.contains("remote &lt;1&gt;"));
        assert_eq!(svg.matches("<circle").count(), 4);
        // Nothing to draw: still a valid chart.
        assert!(chart("t", "x", "y", &[]).ends_with("</svg>\n"));
    }
}
