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
use crate::report::SimReport;

/// The legend text of the simulated ETTR.
pub const SIMULATED_LABEL: &str = "simulated";
/// The legend text of the closed-form model's ETTR.
pub const MODEL_LABEL: &str = "closed-form model (Kokolis et al.)";

/// The checkpoint intervals the single-run chart draws the model over, minutes.
const INTERVAL_MINUTES: std::ops::RangeInclusive<u32> = 5..=240;

const SIZE: (u32, u32) = (900, 540);
const SIMULATED_COLOR: RGBColor = RGBColor(31, 119, 180);
const MODEL_COLOR: RGBColor = RGBColor(214, 39, 40);

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

/// Draws the sweep's simulated ETTR (points joined by a line) and the closed-form model's ETTR
/// of each point against the swept value, to the SVG file `path`.
pub fn sweep_chart(
    path: &Path,
    key: &str,
    points: &[(String, SimReport)],
) -> Result<(), PlotError> {
    let values: Vec<&str> = points.iter().map(|(value, _)| value.as_str()).collect();
    let axis = sweep_axis(key, &values);
    let mut simulated: Vec<(f64, f64)> = Vec::with_capacity(points.len());
    let mut model: Vec<(f64, f64)> = Vec::with_capacity(points.len());
    for (x, (_, report)) in axis.positions.iter().zip(points) {
        simulated.push((*x, report.ettr));
        model.push((*x, report.model_ettr));
    }
    let series = [
        Series {
            label: SIMULATED_LABEL.to_owned(),
            points: simulated,
            color: SIMULATED_COLOR,
            line: true,
            markers: true,
        },
        Series {
            label: MODEL_LABEL.to_owned(),
            points: model,
            color: MODEL_COLOR,
            line: true,
            markers: false,
        },
    ];
    draw(path, &format!("ETTR by {key}"), &axis.label, &series)
}

/// Draws the closed-form model's ETTR against the checkpoint interval (5 min to 4 h) for the
/// report's setting (the job on the nodes less the spares), with the simulated run marked at its
/// interval, to the SVG file `path`.
pub fn single_chart(path: &Path, report: &SimReport) -> Result<(), PlotError> {
    let setting = &report.setting;
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
    }];
    if let Some(minutes) = simulated_interval_minutes(report) {
        series.push(Series {
            label: format!("{SIMULATED_LABEL} (ETTR {:.3})", report.ettr),
            points: vec![(minutes, report.ettr)],
            color: SIMULATED_COLOR,
            line: false,
            markers: true,
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
fn simulated_interval_minutes(report: &SimReport) -> Option<f64> {
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
            mtbi_hours: Some(16.0),
            sim_events: 12_345,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("fleetmend-plot-{}-{name}.svg", std::process::id()))
    }

    #[test]
    fn sweep_chart_writes_an_svg_with_both_series() {
        let points: Vec<(String, SimReport)> =
            [("10m", 0.93, 0.94), ("30m", 0.95, 0.96), ("2h", 0.9, 0.91)]
                .iter()
                .map(|&(value, ettr, model)| (value.to_owned(), report(value, ettr, model)))
                .collect();
        let path = scratch("sweep");
        sweep_chart(&path, "job.checkpoint_every", &points).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "not an SVG: {}", &svg[..80.min(svg.len())]);
        assert!(svg.contains(SIMULATED_LABEL));
        assert!(svg.contains(MODEL_LABEL));
        assert!(svg.contains("job.checkpoint_every (minutes)"));
        // Three dots for the simulated points, none for the model's line.
        assert_eq!(svg.matches("<circle").count(), 3, "{svg}");
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
        let points: Vec<(String, SimReport)> = ["false", "true"]
            .iter()
            .map(|value| (value.to_string(), report("30m", 0.9, 0.92)))
            .collect();
        let path = scratch("words");
        sweep_chart(&path, "job.checkpoint_on_signal", &points).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.contains("job.checkpoint_on_signal (index of the value: false, true)"));
    }
}
