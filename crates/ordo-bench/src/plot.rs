//! PNG line charts for the benchmarks (`ordo bench spindle`'s figures).
//!
//! Drawn with plotters' bitmap backend; text is rendered with ab_glyph from
//! the DejaVu Sans font bundled in the `dejavu` crate, so plotting needs no
//! system font, no fontconfig and nothing downloaded at run time.
//!
//! A figure is one PNG of one or more [`Panel`]s laid out in a grid; each
//! panel is a line chart of [`Series`] (solid or dashed, with point
//! markers), linear or logarithmic in y.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// The font family name every chart uses (registered once per process).
const FONT: &str = "sans-serif";

/// One line of a chart.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) points, drawn in this order.
    pub points: Vec<(f64, f64)>,
    /// Dashed instead of solid.
    pub dashed: bool,
    /// Palette index (default: the series' position), so that related
    /// lines (baseline dashed, optimized solid) can share a colour.
    pub color: Option<usize>,
}

/// One chart of a figure.
#[derive(Clone, Debug, Default)]
pub struct Panel {
    /// Title above the chart.
    pub title: String,
    /// X-axis description.
    pub x_label: String,
    /// Y-axis description.
    pub y_label: String,
    /// Logarithmic y axis (points with y ≤ 0 are left out).
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the bundled DejaVu Sans font did not load".to_string())
        })
        .clone()
}

/// Ten colours that stay distinct on white (Tableau 10), then repeats.
fn color_of(i: usize) -> RGBAColor {
    const TABLEAU: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (214, 39, 40),
        (44, 160, 44),
        (255, 127, 14),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = TABLEAU[i % TABLEAU.len()];
    RGBColor(r, g, b).to_rgba()
}

/// Axis numbers without needless decimals.
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn err(e: impl std::fmt::Display) -> String {
    format!("plotting: {e}")
}

/// Writes `panels` as one PNG at `path`, `cols` panels per row, under
/// `title`.
pub fn write_png(path: &Path, title: &str, panels: &[Panel], cols: usize) -> Result<(), String> {
    register_font()?;
    let cols = cols.clamp(1, panels.len().max(1));
    let rows = panels.len().div_ceil(cols).max(1);
    let size = (560 * cols as u32, 400 * rows as u32 + 50);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let body = root.titled(title, (FONT, 24)).map_err(err)?;
    let areas = body.split_evenly((rows, cols));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn draw_panel(area: &DrawingArea<BitMapBackend<'_>, Shift>, panel: &Panel) -> Result<(), String> {
    let keep = |&(_, y): &(f64, f64)| y.is_finite() && (!panel.log_y || y > 0.0);
    let series: Vec<Series> = panel
        .series
        .iter()
        .map(|s| Series { points: s.points.iter().copied().filter(keep).collect(), ..s.clone() })
        .filter(|s| !s.points.is_empty())
        .collect();
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    if series.is_empty() {
        area.titled(&panel.title, (FONT, 18)).map_err(err)?;
        area.draw_text("no data", &(FONT, 16).into_text_style(area), (40, 60)).map_err(err)?;
        return Ok(());
    }
    let (mut x0, mut x1) = all().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| (a.min(x), b.max(x)));
    if x1 - x0 < 1e-9 {
        x0 -= 1.0;
        x1 += 1.0;
    }
    // Members and bucket indices are integers: one tick per value.
    let integer_x = all().all(|(x, _)| x.fract() == 0.0);
    let x_ticks = ((x1 - x0) as usize + 1).clamp(2, 16);
    let pad = (x1 - x0) * 0.04;
    let (x0, x1) = (x0 - pad, x1 + pad);
    let y_max = all().map(|(_, y)| y).fold(f64::MIN, f64::max);
    let mut builder = ChartBuilder::on(area);
    builder.caption(&panel.title, (FONT, 18)).margin(8).x_label_area_size(38).y_label_area_size(64);
    // The two axis kinds are different types: one macro body for both.
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            let mut mesh = chart.configure_mesh();
            if integer_x {
                mesh.x_labels(x_ticks).x_label_formatter(&|x| format!("{x:.0}"));
            }
            mesh.light_line_style(WHITE.mix(0.0))
                .y_label_formatter(&|y| short_number(*y))
                .x_desc(panel.x_label.as_str())
                .y_desc(panel.y_label.as_str())
                .label_style((FONT, 13))
                .axis_desc_style((FONT, 14))
                .draw()
                .map_err(err)?;
            for (i, s) in series.iter().enumerate() {
                let color = color_of(s.color.unwrap_or(i));
                let style = ShapeStyle::from(color).stroke_width(2);
                let anno = if s.dashed {
                    chart
                        .draw_series(DashedLineSeries::new(s.points.iter().copied(), 8, 5, style))
                        .map_err(err)?
                } else {
                    chart.draw_series(LineSeries::new(s.points.iter().copied(), style)).map_err(err)?
                };
                anno.label(s.label.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
                chart
                    .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(err)?;
            }
            chart
                .configure_series_labels()
                .position(if panel.log_y {
                    SeriesLabelPosition::LowerRight
                } else {
                    SeriesLabelPosition::UpperRight
                })
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .label_font((FONT, 12))
                .draw()
                .map_err(err)?;
        }};
    }
    if panel.log_y {
        let y_min = all().map(|(_, y)| y).fold(f64::MAX, f64::min);
        draw!(builder.build_cartesian_2d(x0..x1, ((y_min / 1.5)..(y_max * 1.5)).log_scale()).map_err(err)?);
    } else {
        let top = if y_max > 0.0 { y_max * 1.12 } else { 1.0 };
        draw!(builder.build_cartesian_2d(x0..x1, 0.0..top).map_err(err)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_with_linear_log_and_empty_panels() {
        let dir = std::env::temp_dir().join(format!("ordo-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.png");
        let line = |label: &str, dashed| Series {
            label: label.into(),
            points: vec![(2.0, 1.0), (3.0, 4.0), (4.0, 0.0)],
            dashed,
            color: None,
        };
        let panels = vec![
            Panel {
                title: "linear".into(),
                series: vec![line("a", false), line("b", true)],
                ..Default::default()
            },
            Panel { title: "log".into(), log_y: true, series: vec![line("a", false)], ..Default::default() },
            Panel { title: "empty".into(), ..Default::default() },
        ];
        write_png(&path, "test", &panels, 2).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
