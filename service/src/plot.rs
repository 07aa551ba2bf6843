//! The comparison's plot: request p99 against scrape rate, one line per mode, as an SVG.
//!
//! Written by hand rather than with a plotting crate: one chart of a few lines on a log axis
//! is about sixty lines, and `plotters` would bring a font stack to draw it.

use std::fmt::Write as _;

/// One line of the chart: a name and its (x, y) points, x > 0.
pub type Series = (String, Vec<(f64, f64)>);

/// An SVG chart of `series` with a logarithmic x axis.
pub fn chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 420.0, 70.0, 150.0, 40.0, 50.0);
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
    let px = |x: f64| left + (x.ln() - x0.ln()) / (x1.ln() - x0.ln()) * (w - left - right);
    let py = |y: f64| h - bottom - y / y1 * (h - top - bottom);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        (w - right + left) / 2.0,
        escape(title)
    );
    // Axes, x ticks at each point's x, y ticks at fifths.
    let _ = write!(
        s,
        r#"<path d="M{left} {top} V{} H{}" stroke="black" fill="none"/>"#,
        h - bottom,
        w - right
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
            px(x),
            h - bottom + 16.0
        );
    }
    for i in 0..=5 {
        let y = y1 * f64::from(i) / 5.0;
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{y:.0}</text><path d="M{left} {:.1} H{}" stroke="lightgray"/>"#,
            left - 6.0,
            py(y) + 4.0,
            py(y),
            w - right
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (w - right + left) / 2.0,
        h - 12.0,
        escape(x_label)
    );
    let _ = write!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"#,
        h / 2.0,
        h / 2.0,
        escape(y_label)
    );
    let colours = [
        "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    ];
    for (i, (name, points)) in series.iter().enumerate() {
        let c = colours[i % colours.len()];
        let d: Vec<String> = points
            .iter()
            .enumerate()
            .map(|(j, &(x, y))| {
                format!(
                    "{}{:.1} {:.1}",
                    if j == 0 { "M" } else { "L" },
                    px(x),
                    py(y)
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
                px(x),
                py(y)
            );
        }
        let ly = top + 20.0 * i as f64;
        let _ = write!(
            s,
            r#"<path d="M{} {ly} h20" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            w - right + 10.0,
            w - right + 36.0,
            ly + 4.0,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

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
