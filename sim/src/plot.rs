//! `fleetmend simulate --plot`: ETTR charts as SVG files.
//!
//! Only plotters' SVG backend is built: it writes text as `<text>` elements and leaves the fonts
//! to whoever views the file, so drawing needs no font files and the build no system library
//! (plotters' crude built-in text measure only places the labels).

use std::path::{Path, PathBuf};
use std::time::Duration;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::model::{EttrModel, ModelError};
use crate::replications::Replications;
use crate::report::{Setting, SimReport};

/// The legend text of the simulated ETTR.
pub const SIMULATED_LABEL: &str = "simulated";
/// The legend text of the closed-form model's ETTR.
pub const MODEL_LABEL: &str = "closed-form model (Kokolis et al.)";

/// The checkpoint intervals the single-run chart draws the model over, minutes.
const INTERVAL_MINUTES: std::ops::RangeInclusive<u32> = 5..=240;

const SIZE: (u32, u32) = (900, 540);
const SIMULATED_COLOR: RGBColor = RGBColor(31, 119, 180);
const MODEL_COLOR: RGBColor = RGBColor(214, 39, 40);
/// One colour per line of a two-key chart (matplotlib's tab10), in turn.
const GRID_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
/// Half the width of an error bar's caps, pixels.
const ERROR_CAP: i32 = 4;

/// A chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("drawing {path}: {message}")]
    Draw { path: PathBuf, message: String },
    #[error("drawing {path}: no point has a finite ETTR")]
    NoPoints { path: PathBuf },
    #[error("drawing {path}: the closed-form model: {source}")]
    Model { path: PathBuf, source: ModelError },
}

/// Where the swept values go on the x axis, and what the axis says.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepAxis {
    pub label: String,
    /// One position per value, in the values' order.
    pub positions: Vec<f64>,
}

/// The x axis for `values` of `key`: plain numbers as they are, else durations in minutes, else
/// (a value such as `auto` among them) the values' index.
pub fn sweep_axis(key: &str, values: &[&str]) -> SweepAxis {
    let numbers: Option<Vec<f64>> = values
        .iter()
        .map(|value| value.trim().parse::<f64>().ok().filter(|number| number.is_finite()))
        .collect();
    if let Some(positions) = numbers {
        return SweepAxis { label: key.to_owned(), positions };
    }
    let minutes: Option<Vec<f64>> = values
        .iter()
        .map(|value| humantime::parse_duration(value.trim()).ok().map(|d| d.as_secs_f64() / 60.0))
        .collect();
    if let Some(positions) = minutes {
        return SweepAxis { label: format!("{key} (minutes)"), positions };
    }
    SweepAxis {
        label: format!("{key} (index of the value: {})", values.join(", ")),
        positions: (0..values.len()).map(|index| index as f64).collect(),
    }
}

/// One point of a sweep as a chart draws it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChartPoint<'a> {
    /// The swept setting's value.
    pub value: &'a str,
    /// The simulated ETTR (over several seeds, their mean).
    pub ettr: f64,
    /// Half the confidence interval around `ettr`, drawn as an error bar; 0 draws none.
    pub half_width: f64,
    /// The closed-form model's ETTR.
    pub model_ettr: f64,
}

/// Draws the sweep's simulated ETTR (points joined by a line, error bars where a point has an
/// interval) and the closed-form model's ETTR of each point against the swept value, to the SVG
/// file `path`.
pub fn sweep_chart(path: &Path, key: &str, points: &[ChartPoint<'_>]) -> Result<(), PlotError> {
    let values: Vec<&str> = points.iter().map(|point| point.value).collect();
    let axis = sweep_axis(key, &values);
    let mut model: Vec<(f64, f64)> = Vec::with_capacity(points.len());
    for (x, point) in axis.positions.iter().zip(points) {
        model.push((*x, point.model_ettr));
    }
    let series = [
        simulated_series(SIMULATED_LABEL.to_owned(), SIMULATED_COLOR, &axis, points),
        Series {
            label: MODEL_LABEL.to_owned(),
            points: model,
            color: MODEL_COLOR,
            line: true,
            markers: false,
            error_bars: Vec::new(),
        },
    ];
    draw(path, &format!("ETTR by {key}"), &axis.label, &series)
}

/// Draws a two-key sweep: the simulated ETTR against the first key's values, one line (and
/// colour) per value of the second key, with error bars where a point has an interval, to the SVG
/// file `path`. The closed-form model is left out: one more line per value would bury the
/// simulated ones.
pub fn grid_chart(
    path: &Path,
    keys: (&str, &str),
    lines: &[(&str, Vec<ChartPoint<'_>>)],
) -> Result<(), PlotError> {
    let (first, second) = keys;
    let values: Vec<&str> = lines
        .first()
        .map(|(_, points)| points.iter().map(|p| p.value).collect())
        .unwrap_or_default();
    let axis = sweep_axis(first, &values);
    let series: Vec<Series> = lines
        .iter()
        .enumerate()
        .map(|(index, (value, points))| {
            let color = GRID_COLORS[index % GRID_COLORS.len()];
            simulated_series(format!("{second}={value}"), color, &axis, points)
        })
        .collect();
    draw(path, &format!("ETTR by {first} and {second}"), &axis.label, &series)
}

/// The simulated ETTR of `points` at the axis' positions, joined and marked, with error bars.
fn simulated_series(
    label: String,
    color: RGBColor,
    axis: &SweepAxis,
    points: &[ChartPoint<'_>],
) -> Series {
    let at: Vec<(f64, &ChartPoint<'_>)> = axis.positions.iter().copied().zip(points).collect();
    Series {
        label,
        points: at.iter().map(|(x, point)| (*x, point.ettr)).collect(),
        color,
        line: true,
        markers: true,
        error_bars: at
            .iter()
            .filter(|(_, point)| point.half_width > 0.0)
            .map(|(x, point)| (*x, point.ettr - point.half_width, point.ettr + point.half_width))
            .collect(),
    }
}

/// Draws the closed-form model's ETTR against the checkpoint interval (5 min to 4 h) for the
/// report's setting (the job on the nodes less the spares), with the simulated run marked at its
/// interval, to the SVG file `path`.
pub fn single_chart(path: &Path, report: &SimReport) -> Result<(), PlotError> {
    let run = simulated_interval_minutes(report).map(|minutes| ChartRun {
        minutes,
        ettr: report.ettr,
        half_width: 0.0,
        label: format!("{SIMULATED_LABEL} (ETTR {:.3})", report.ettr),
    });
    model_chart(path, &report.setting, run)
}

/// Draws the closed-form model's ETTR against the checkpoint interval for the replications'
/// setting, with their mean ETTR and its interval marked at `interval_minutes` (for `auto`, the
/// interval the jobs ended with), to the SVG file `path`.
pub fn replications_chart(
    path: &Path,
    replications: &Replications,
    interval_minutes: Option<f64>,
) -> Result<(), PlotError> {
    let e = &replications.ettr;
    let run = interval_minutes.map(|minutes| ChartRun {
        minutes,
        ettr: e.mean,
        half_width: e.half_width,
        label: format!(
            "{SIMULATED_LABEL}, {} seeds (ETTR {:.3} ± {:.3})",
            replications.seeds.len(),
            e.mean,
            e.half_width
        ),
    });
    model_chart(path, &replications.setting, run)
}

/// A simulated result marked on the model's curve.
struct ChartRun {
    minutes: f64,
    ettr: f64,
    half_width: f64,
    label: String,
}

/// The closed-form model's curve for `setting`, and `run` marked on it.
fn model_chart(path: &Path, setting: &Setting, run: Option<ChartRun>) -> Result<(), PlotError> {
    let nodes = setting.nodes.saturating_sub(setting.spares);
    let model_at = |minutes: f64| {
        EttrModel {
            nodes,
            failures_per_node_day: setting.failures_per_node_day,
            restart_overhead: seconds(setting.restart_seconds),
            checkpoint_interval: seconds(minutes * 60.0),
            checkpoint_write: seconds(setting.checkpoint_write_seconds),
        }
        .expected_ettr()
        .map_err(|source| PlotError::Model { path: path.to_owned(), source })
    };
    let curve = INTERVAL_MINUTES
        .map(|minutes| Ok((f64::from(minutes), model_at(f64::from(minutes))?)))
        .collect::<Result<Vec<_>, PlotError>>()?;
    let mut series = vec![Series {
        label: MODEL_LABEL.to_owned(),
        points: curve,
        color: MODEL_COLOR,
        line: true,
        markers: false,
        error_bars: Vec::new(),
    }];
    if let Some(run) = run {
        let bar = (run.minutes, run.ettr - run.half_width, run.ettr + run.half_width);
        series.push(Series {
            label: run.label,
            points: vec![(run.minutes, run.ettr)],
            color: SIMULATED_COLOR,
            line: false,
            markers: true,
            error_bars: if run.half_width > 0.0 { vec![bar] } else { Vec::new() },
        });
    }
    let caption = format!(
        "ETTR by checkpoint interval: {nodes} nodes, {:.4} failures per node-day",
        setting.failures_per_node_day
    );
    draw(path, &caption, "checkpoint interval (minutes)", &series)
}

/// The simulated run's checkpoint interval, minutes: the setting's, or for `auto` the interval
/// the first job ended with.
pub fn simulated_interval_minutes(report: &SimReport) -> Option<f64> {
    let seconds = match humantime::parse_duration(&report.setting.checkpoint_every) {
        Ok(every) => every.as_secs_f64(),
        Err(_) => report.jobs.first()?.checkpoint_interval_seconds,
    };
    (seconds.is_finite() && seconds > 0.0).then_some(seconds / 60.0)
}

fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value).unwrap_or(Duration::ZERO)
}

/// One thing the chart shows.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
    color: RGBColor,
    /// Joined by a line (in the order of x).
    line: bool,
    /// Each point marked with a dot.
    markers: bool,
    /// Vertical bars: x, low, high.
    error_bars: Vec<(f64, f64, f64)>,
}

/// Draws `series` on ETTR 0..1 against an x range that holds all their points.
fn draw(path: &Path, caption: &str, x_label: &str, series: &[Series]) -> Result<(), PlotError> {
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let xs = series.iter().flat_map(|s| s.points.iter().filter(|p| finite(p)).map(|p| p.0));
    let Some((low, high)) = xs.fold(None, |range: Option<(f64, f64)>, x| match range {
        None => Some((x, x)),
        Some((low, high)) => Some((low.min(x), high.max(x))),
    }) else {
        return Err(PlotError::NoPoints { path: path.to_owned() });
    };
    let pad = if high > low { (high - low) * 0.05 } else { 1.0 };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    draw_on(&root, caption, x_label, (low - pad)..(high + pad), series)
        .and_then(|()| root.present().map_err(|err| err.to_string()))
        .map_err(|message| PlotError::Draw { path: path.to_owned(), message })
}

fn draw_on(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    x_label: &str,
    x_range: std::ops::Range<f64>,
    series: &[Series],
) -> Result<(), String> {
    let text = |err: DrawingAreaErrorKind<std::io::Error>| err.to_string();
    root.fill(&WHITE).map_err(text)?;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range, 0.0..1.0)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("ETTR")
        .x_label_formatter(&|x| tick(*x))
        .draw()
        .map_err(text)?;
    for one in series {
        let color = one.color;
        let mut points: Vec<(f64, f64)> =
            one.points.iter().copied().filter(|&(x, y)| x.is_finite() && y.is_finite()).collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        if one.line {
            let drawn = chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(text)?;
            drawn.label(one.label.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        if !one.error_bars.is_empty() {
            // An interval can reach past ETTR's 0..1 (few seeds, far apart): the bar stops at
            // the axis' end, and only an end within the axis gets its cap.
            let bars = &one.error_bars;
            chart
                .draw_series(bars.iter().map(|&(x, low, high)| {
                    PathElement::new([(x, low.max(0.0)), (x, high.min(1.0))], color)
                }))
                .map_err(text)?;
            let caps = bars
                .iter()
                .flat_map(|&(x, low, high)| [(x, low), (x, high)])
                .filter(|&(_, y)| (0.0..=1.0).contains(&y));
            chart
                .draw_series(caps.map(|end| {
                    EmptyElement::at(end)
                        + PathElement::new([(-ERROR_CAP, 0), (ERROR_CAP, 0)], color)
                }))
                .map_err(text)?;
        }
        if one.markers {
            let drawn = chart
                .draw_series(points.iter().map(|&point| Circle::new(point, 4, color.filled())))
                .map_err(text)?;
            if !one.line {
                drawn
                    .label(one.label.as_str())
                    .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(text)
}

/// A tick label with at most two decimals and no trailing zeros: 20, 2.5.
fn tick(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeMap;

    use super::*;
    use crate::report::{FailureFigures, JobResult, LostTime, RepairFigures, Setting};

    /// A report as a run of `checkpoint_every` on 16 nodes might give, with the ETTRs given.
    pub(crate) fn report(checkpoint_every: &str, ettr: f64, model_ettr: f64) -> SimReport {
        SimReport {
            setting: Setting {
                nodes: 16,
                gpus_per_node: 8,
                days: 2.0,
                spares: 1,
                seed: 7,
                jobs: 1,
                checkpoint_every: checkpoint_every.to_owned(),
                checkpoint_write_seconds: 60.0,
                restart_seconds: 300.0,
                failures_per_node_day: 0.0038,
                catalog: "llama3-405b".to_owned(),
            },
            ettr,
            jobs: vec![JobResult {
                id: "job-1".to_owned(),
                nodes: 15,
                ettr,
                wall_hours: 48.0,
                productive_hours: 48.0 * ettr,
                lost_hours: LostTime {
                    detection: 0.1,
                    drain_and_checkpoint: 0.05,
                    rollback: 0.4,
                    restart: 0.3,
                    waiting_for_nodes: 0.0,
                    held_by_guard_rail: 0.0,
                    checkpoint_writes: 1.5,
                },
                interruptions: 3,
                restarts: 3,
                checkpoints: 90,
                checkpointed_at_signal: 1,
                checkpoint_interval_seconds: 1800.0,
            }],
            model_ettr,
            failures: FailureFigures {
                node_failures: 3,
                by_category: BTreeMap::from([("faulty-gpu".to_owned(), 3)]),
                ..FailureFigures::default()
            },
            repairs: RepairFigures::default(),
            spares: crate::spares::SpareFigures::default(),
            mtbi_hours: Some(16.0),
            sim_events: 12_345,
            noise: None,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("fleetmend-plot-{}-{name}.svg", std::process::id()))
    }

    /// Three points of a checkpoint interval sweep, each ± `half_width`.
    fn sweep_points(half_width: f64) -> Vec<ChartPoint<'static>> {
        [("10m", 0.93, 0.94), ("30m", 0.95, 0.96), ("2h", 0.9, 0.91)]
            .iter()
            .map(|&(value, ettr, model_ettr)| ChartPoint { value, ettr, half_width, model_ettr })
            .collect()
    }

    /// The SVG `draw` writes to a scratch file named `name`.
    fn drawn(name: &str, draw: impl FnOnce(&Path) -> Result<(), PlotError>) -> String {
        let path = scratch(name);
        draw(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        svg
    }

    #[test]
    fn sweep_chart_writes_an_svg_with_both_series() {
        let points = sweep_points(0.0);
        let svg = drawn("sweep", |path| sweep_chart(path, "job.checkpoint_every", &points));
        assert!(svg.trim_start().starts_with("<svg"), "not an SVG: {}", &svg[..80.min(svg.len())]);
        assert!(svg.contains(SIMULATED_LABEL));
        assert!(svg.contains(MODEL_LABEL));
        assert!(svg.contains("job.checkpoint_every (minutes)"));
        // Three dots for the simulated points, none for the model's line.
        assert_eq!(svg.matches("<circle").count(), 3, "{svg}");
    }

    #[test]
    fn points_with_an_interval_get_error_bars() {
        let key = "job.checkpoint_every";
        let plain = drawn("no-bars", |path| sweep_chart(path, key, &sweep_points(0.0)));
        let barred = drawn("bars", |path| sweep_chart(path, key, &sweep_points(0.02)));
        // Each bar: the vertical line and its two caps.
        let lines = |svg: &str| svg.matches("<polyline").count();
        assert_eq!(lines(&barred), lines(&plain) + 3 * 3, "{barred}");
        assert_eq!(barred.matches("<circle").count(), 3);
    }

    #[test]
    fn an_error_bar_past_the_axis_stops_at_its_end_without_a_cap() {
        let key = "job.checkpoint_every";
        let plain = drawn("no-bars-wide", |path| sweep_chart(path, key, &sweep_points(0.0)));
        // 0.93 ± 0.5, 0.95 ± 0.5 and 0.9 ± 0.5 all pass 1 (and none 0): one cap each.
        let wide = drawn("wide-bars", |path| sweep_chart(path, key, &sweep_points(0.5)));
        let lines = |svg: &str| svg.matches("<polyline").count();
        assert_eq!(lines(&wide), lines(&plain) + 3 * 2, "{wide}");
    }

    #[test]
    fn grid_chart_draws_a_line_per_value_of_the_second_key() {
        let lines: Vec<(&str, Vec<ChartPoint<'_>>)> =
            vec![("8", sweep_points(0.0)), ("32", sweep_points(0.01))];
        let keys = ("job.checkpoint_every", "repairer.policy.guard_rails.max_concurrent_repairs");
        let svg = drawn("grid", |path| grid_chart(path, keys, &lines));
        assert!(svg.contains("repairer.policy.guard_rails.max_concurrent_repairs=8"), "{svg}");
        assert!(svg.contains("repairer.policy.guard_rails.max_concurrent_repairs=32"), "{svg}");
        assert!(svg.contains("job.checkpoint_every (minutes)"));
        assert!(!svg.contains(MODEL_LABEL));
        assert_eq!(svg.matches("<circle").count(), 6, "{svg}");
        // The two lines in two colours.
        assert!(svg.contains("#1F77B4") && svg.contains("#FF7F0E"), "{svg}");
    }

    #[test]
    fn replications_chart_marks_the_mean_with_its_interval() {
        let mut runs = vec![report("30m", 0.93, 0.96), report("30m", 0.94, 0.96)];
        runs[1].setting.seed = 8;
        let replications = Replications::of(&runs).unwrap();
        let svg = drawn("replications", |path| {
            replications_chart(path, &replications, simulated_interval_minutes(&runs[0]))
        });
        // t(0.975, 1) = 12.706 times s / sqrt(2) = 0.005: 0.064, within the axis.
        assert!(svg.contains("simulated, 2 seeds (ETTR 0.935 ± 0.064)"), "{svg}");
        assert!(svg.contains(MODEL_LABEL));
        let single = drawn("single-for-bars", |path| single_chart(path, &runs[0]));
        let lines = |svg: &str| svg.matches("<polyline").count();
        assert_eq!(lines(&svg), lines(&single) + 3, "{svg}");
    }

    #[test]
    fn single_chart_draws_the_model_curve_and_marks_the_run() {
        let path = scratch("single");
        single_chart(&path, &report("30m", 0.95, 0.96)).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.contains(MODEL_LABEL));
        assert!(svg.contains("simulated (ETTR 0.950)"));
        assert!(svg.contains("checkpoint interval (minutes)"));
        // The marked run and its legend entry.
        assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
    }

    #[test]
    fn single_chart_marks_an_auto_run_at_the_interval_it_ended_with() {
        let auto = report("auto", 0.95, 0.96);
        assert_eq!(simulated_interval_minutes(&auto), Some(30.0));
        assert_eq!(simulated_interval_minutes(&report("1h", 0.9, 0.9)), Some(60.0));
    }

    #[test]
    fn single_chart_refuses_a_fleet_of_spares_only() {
        let mut spares_only = report("30m", 0.95, 0.96);
        spares_only.setting.spares = spares_only.setting.nodes;
        let path = scratch("spares-only");
        let err = single_chart(&path, &spares_only).unwrap_err();
        assert!(matches!(err, PlotError::Model { .. }), "{err}");
    }

    #[test]
    fn sweep_axis_reads_numbers_durations_or_falls_back_to_the_index() {
        let numbers = sweep_axis("fleet.nodes", &["16", "64", "0.5"]);
        assert_eq!(
            numbers,
            SweepAxis { label: "fleet.nodes".to_owned(), positions: vec![16.0, 64.0, 0.5] }
        );
        let durations = sweep_axis("job.checkpoint_every", &["5m", "1h 30m", "90s"]);
        assert_eq!(durations.label, "job.checkpoint_every (minutes)");
        assert_eq!(durations.positions, vec![5.0, 90.0, 1.5]);
        let mixed = sweep_axis("job.checkpoint_every", &["30m", "auto"]);
        assert_eq!(mixed.positions, vec![0.0, 1.0]);
        assert_eq!(mixed.label, "job.checkpoint_every (index of the value: 30m, auto)");
    }

    #[test]
    fn a_sweep_of_words_is_drawn_against_the_index() {
        let points: Vec<ChartPoint<'_>> = ["false", "true"]
            .iter()
            .map(|value| ChartPoint { value, ettr: 0.9, half_width: 0.0, model_ettr: 0.92 })
            .collect();
        let svg = drawn("words", |path| sweep_chart(path, "job.checkpoint_on_signal", &points));
        assert!(svg.contains("job.checkpoint_on_signal (index of the value: false, true)"));
    }
}
