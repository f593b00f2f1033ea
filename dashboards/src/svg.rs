//! Charts drawn on the server as SVG (no script, no other host): a sparkline for the
//! overview and a line chart with optional horizontal bands (the calibration ladder's
//! levels). Every chart carries `data-points` (how many points it draws) and one `<circle>`
//! per point, each with a `<title>` (escaped) for hover.

use std::fmt::Write;

use crate::html::{esc, time};

/// A horizontal band drawn behind a chart: a label and a value.
#[derive(Debug, Clone)]
pub struct Line {
    /// Label drawn at the right end ("w4").
    pub label: String,
    /// Value on the y axis.
    pub value: f64,
}

/// A small sparkline of `(t, v)` points (oldest first), 120×24.
pub fn sparkline(points: &[(i64, f64)]) -> String {
    let (w, h) = (120.0, 24.0);
    let mut out = format!(
        "<svg class=\"spark\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" \
         data-points=\"{}\">",
        points.len()
    );
    if points.is_empty() {
        out.push_str("<text x=\"2\" y=\"16\" font-size=\"10\">no runs</text></svg>");
        return out;
    }
    let (x, y) = scales(points, &[], w, h, 2.0);
    let path: Vec<String> = points
        .iter()
        .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
        .collect();
    let _ = write!(
        out,
        "<polyline fill=\"none\" stroke=\"#36c\" stroke-width=\"1.5\" points=\"{}\"/>",
        path.join(" ")
    );
    for (t, v) in points {
        let _ = write!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"1.5\" fill=\"#36c\"><title>{} {}</title></circle>",
            x(*t),
            y(*v),
            esc(&time(*t)),
            fmt(*v)
        );
    }
    out.push_str("</svg>");
    out
}

/// A line chart titled `title` of `(t, v)` points (oldest first), with `bands` drawn as
/// dashed horizontal lines, 600×180 (scales to the page width).
pub fn chart(title: &str, points: &[(i64, f64)], bands: &[Line]) -> String {
    let (w, h) = (600.0, 180.0);
    let mut out = format!(
        "<figure class=\"chart\"><figcaption>{}</figcaption><svg viewBox=\"0 0 {w} {h}\" \
         role=\"img\" data-points=\"{}\" preserveAspectRatio=\"none\">",
        esc(title),
        points.len()
    );
    let _ = write!(
        out,
        "<rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#fafafa\" stroke=\"#ddd\"/>"
    );
    if points.is_empty() {
        out.push_str(
            "<text x=\"10\" y=\"20\" font-size=\"12\">no data in the range</text></svg></figure>",
        );
        return out;
    }
    let band_values: Vec<f64> = bands.iter().map(|b| b.value).collect();
    let (x, y) = scales(points, &band_values, w, h, 12.0);
    for b in bands {
        let yy = y(b.value);
        let _ = write!(
            out,
            "<g class=\"band\"><line x1=\"0\" x2=\"{w}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" \
             stroke=\"#c63\" stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"{:.1}\" \
             font-size=\"10\" fill=\"#c63\" text-anchor=\"end\">{} {}</text></g>",
            w - 2.0,
            yy - 2.0,
            esc(&b.label),
            fmt(b.value)
        );
    }
    let path: Vec<String> = points
        .iter()
        .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
        .collect();
    let _ = write!(
        out,
        "<polyline fill=\"none\" stroke=\"#36c\" stroke-width=\"1.5\" points=\"{}\"/>",
        path.join(" ")
    );
    for (t, v) in points {
        let _ = write!(
            out,
            "<circle class=\"pt\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"#36c\"><title>{} {}</title></circle>",
            x(*t),
            y(*v),
            esc(&time(*t)),
            fmt(*v)
        );
    }
    let (lo, hi) = extent(
        points
            .iter()
            .map(|p| p.1)
            .chain(band_values.iter().copied()),
    );
    let _ = write!(
        out,
        "<text x=\"3\" y=\"11\" font-size=\"10\">{}</text><text x=\"3\" y=\"{:.0}\" font-size=\"10\">{}</text>",
        fmt(hi),
        h - 3.0,
        fmt(lo)
    );
    out.push_str("</svg></figure>");
    out
}

fn fmt(v: f64) -> String {
    if v != 0.0 && (v.abs() < 0.01 || v.abs() >= 10_000.0) {
        format!("{v:.3e}")
    } else {
        format!("{v:.3}")
    }
}

fn extent(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if (hi - lo).abs() < f64::EPSILON {
        (
            lo - 0.5_f64.max(lo.abs() * 0.1),
            hi + 0.5_f64.max(hi.abs() * 0.1),
        )
    } else {
        (lo, hi)
    }
}

/// The x (time) and y (value) scales of a chart `w`×`h` with `pad` pixels of margin.
fn scales(
    points: &[(i64, f64)],
    extra: &[f64],
    w: f64,
    h: f64,
    pad: f64,
) -> (impl Fn(i64) -> f64, impl Fn(f64) -> f64) {
    let t0 = points.iter().map(|p| p.0).min().unwrap_or(0);
    let t1 = points.iter().map(|p| p.0).max().unwrap_or(1).max(t0 + 1);
    let (lo, hi) = extent(points.iter().map(|p| p.1).chain(extra.iter().copied()));
    let x = move |t: i64| pad + (t - t0) as f64 / (t1 - t0) as f64 * (w - 2.0 * pad);
    let y = move |v: f64| h - pad - (v - lo) / (hi - lo) * (h - 2.0 * pad);
    (x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_draw_one_circle_per_point_and_escape() {
        let pts = [(0, 1.0), (60_000, 2.0), (120_000, 1.5)];
        let c = chart(
            "<b>kl</b>",
            &pts,
            &[Line {
                label: "<w4>".into(),
                value: 0.5,
            }],
        );
        assert_eq!(c.matches("<circle").count(), 3);
        assert!(c.contains("data-points=\"3\""));
        assert!(c.contains("&lt;b&gt;kl&lt;/b&gt;") && c.contains("&lt;w4&gt;"));
        assert!(!c.contains("<b>"));
        assert!(sparkline(&[]).contains("no runs"));
        assert_eq!(sparkline(&pts).matches("<circle").count(), 3);
    }
}
