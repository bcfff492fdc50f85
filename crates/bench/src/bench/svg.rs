//! Line charts as hand-written SVG: one polyline per system against connections, axes with
//! ticks, a legend, and a red ring around every point whose step had errors.

use std::fmt::Write;

use super::model::ScenarioResult;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x index, y, step had errors)`.
    pub points: Vec<(usize, f64, bool)>,
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 56.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// Escapes text for XML content and attributes.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis maximum and tick step for data up to `max`.
pub fn nice_axis(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 || !max.is_finite() {
        return (1.0, 0.2);
    }
    let raw = max * 1.05 / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max * 1.05 / step).ceil() * step, step)
}

fn fmt_tick(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// A line chart: categorical x (`x_labels`, evenly spaced), linear y from 0.
pub fn line_chart(title: &str, y_label: &str, x_labels: &[String], series: &[Series]) -> String {
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let n = x_labels.len().max(1) as f64;
    let x_at = |i: usize| LEFT + (i as f64 + 0.5) * plot_w / n;
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let (top, step) = nice_axis(y_max);
    let y_at = |v: f64| TOP + plot_h - (v / top) * plot_h;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // Grid and y ticks.
    let mut v = 0.0;
    while v <= top + step / 2.0 {
        let y = y_at(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v)
        );
        v += step;
    }
    // Axes.
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#000"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000"/>"##,
        TOP + plot_h,
        TOP + plot_h,
        LEFT + plot_w,
        TOP + plot_h
    );
    for (i, label) in x_labels.iter().enumerate() {
        let x = x_at(i);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#000"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 5.0,
            TOP + plot_h + 20.0,
            escape(label)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">connections</text>"#,
        LEFT + plot_w / 2.0,
        H - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label)
    );
    // Lines, markers, legend.
    for (k, series) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let points: Vec<String> = series
            .points
            .iter()
            .map(|&(i, v, _)| format!("{:.1},{:.1}", x_at(i), y_at(v)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline data-system="{}" fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            escape(&series.name),
            points.join(" ")
        );
        for &(i, v, err) in &series.points {
            let (x, y) = (x_at(i), y_at(v));
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"><title>{}: {}</title></circle>"#,
                escape(&series.name),
                fmt_tick(v)
            );
            if err {
                let _ = writeln!(
                    s,
                    r##"<circle class="error" cx="{x:.1}" cy="{y:.1}" r="7" fill="none" stroke="#d00" stroke-width="2"><title>{}: step had errors</title></circle>"##,
                    escape(&series.name)
                );
            }
        }
        let ly = TOP + 10.0 + k as f64 * 20.0;
        let lx = W - RIGHT + 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(&series.name)
        );
    }
    if series.iter().any(|s| s.points.iter().any(|p| p.2)) {
        let ly = TOP + 10.0 + series.len() as f64 * 20.0;
        let lx = W - RIGHT + 27.0;
        let _ = writeln!(
            s,
            r##"<circle cx="{lx}" cy="{ly}" r="7" fill="none" stroke="#d00" stroke-width="2"/><text x="{}" y="{}">errors</text>"##,
            lx + 17.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The charts of one scenario: `(file name, svg)` for throughput, p90, p99 and CPU per request.
pub fn scenario_charts(sc: &ScenarioResult) -> Vec<(String, String)> {
    let mut conns: Vec<usize> = sc.steps.iter().map(|s| s.connections).collect();
    conns.sort_unstable();
    conns.dedup();
    let labels: Vec<String> = conns.iter().map(|c| c.to_string()).collect();
    let mut systems: Vec<&str> = Vec::new();
    for st in &sc.steps {
        if !systems.contains(&st.system.as_str()) {
            systems.push(&st.system);
        }
    }
    type Metric = fn(&super::model::Sample) -> Option<f64>;
    let metrics: [(&str, &str, &str, Metric); 4] = [
        ("throughput", "throughput", "requests/s", |s| Some(s.rps)),
        ("p90", "p90 latency", "ms", |s| Some(s.p90_ms)),
        ("p99", "p99 latency", "ms", |s| Some(s.p99_ms)),
        (
            "cpu",
            "CPU per 1000 requests (system under test)",
            "CPU ms / 1000 requests",
            |s| s.cpu_ms_per_1k,
        ),
    ];
    metrics
        .iter()
        .map(|(file, what, unit, f)| {
            let series: Vec<Series> = systems
                .iter()
                .map(|name| Series {
                    name: (*name).to_owned(),
                    points: sc
                        .steps
                        .iter()
                        .filter(|st| st.system == *name)
                        .filter_map(|st| {
                            let i = conns.iter().position(|&c| c == st.connections)?;
                            Some((i, f(&st.median)?, st.errors))
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            let title = format!("{}: {what}", sc.name);
            (
                format!("{}-{file}.svg", sc.name),
                line_chart(&title, unit, &labels, &series),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_nice() {
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        let (top, step) = nice_axis(9_500.0);
        assert!((9_500.0..=12_000.0).contains(&top), "{top}");
        assert_eq!(step, 2_000.0);
        let (top, step) = nice_axis(0.42);
        assert!(top >= 0.42 && step > 0.0);
        assert_eq!(fmt_tick(25_000.0), "25k");
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
