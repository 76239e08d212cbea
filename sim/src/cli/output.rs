//! What `fleetmend simulate` shows of its runs: the text summary or table, or deterministic
//! JSON, on stdout; the SVG chart; the wall-clock line on stderr.

use std::path::Path;

use serde::Serialize;

use super::SimulateError;
use super::grid::{GridPoint, Outcome, Swept};
use crate::plot::{self, ChartPoint};
use crate::replications::CONFIDENCE;
use crate::report::LostTime;

/// One part of the lost time.
type LostPart = fn(&LostTime) -> f64;

/// The lost-time columns of a one-key table: the header, and the part of the lost time.
const LOST_COLUMNS: [(&str, LostPart); 7] = [
    ("detect h", |l| l.detection),
    ("drain h", |l| l.drain_and_checkpoint),
    ("rollback h", |l| l.rollback),
    ("restart h", |l| l.restart),
    ("wait h", |l| l.waiting_for_nodes),
    ("held h", |l| l.held_by_guard_rail),
    ("ckpt h", |l| l.checkpoint_writes),
];

/// The runs' stdout: for one setting its summary (or the seeds' summary), for one swept key a
/// table with a row per value, for two a grid; or any of them as JSON.
pub(super) fn render(
    swept: Swept<'_>,
    points: &[GridPoint],
    as_json: bool,
) -> Result<String, SimulateError> {
    match swept {
        Swept::Nothing => {
            let Some(point) = points.first() else { return Ok(String::new()) };
            match (&point.outcome, as_json) {
                (Outcome::Report(report), false) => Ok(report.summary()),
                (Outcome::Report(report), true) => json(report),
                (Outcome::Replications(summary), false) => Ok(summary.summary()),
                (Outcome::Replications(summary), true) => json(summary),
            }
        }
        Swept::One(sweep) if as_json => sweep_json(&sweep.key, points),
        Swept::One(sweep) => Ok(sweep_table(&sweep.key, points)),
        Swept::Two(first, second) if as_json => grid_json([&first.key, &second.key], points),
        Swept::Two(first, second) => Ok(grid_table((&first.key, &second.key), points)),
    }
}

/// Draws the chart of the runs to `path`: for one setting the closed-form model against the
/// checkpoint interval with the run (or the seeds' mean) marked, for one key ETTR against its
/// values, for two a line per value of the second key against the first.
pub(super) fn chart(
    path: &Path,
    swept: Swept<'_>,
    points: &[GridPoint],
) -> Result<(), SimulateError> {
    match swept {
        Swept::Nothing => match points.first().map(|point| (&point.outcome, point)) {
            Some((Outcome::Report(report), _)) => plot::single_chart(path, report)?,
            Some((Outcome::Replications(summary), point)) => {
                plot::replications_chart(path, summary, point.interval_minutes)?;
            }
            None => {}
        },
        Swept::One(sweep) => {
            let marks: Vec<ChartPoint<'_>> = points.iter().map(|point| mark(point)).collect();
            plot::sweep_chart(path, &sweep.key, &marks)?;
        }
        Swept::Two(first, second) => {
            let lines: Vec<(&str, Vec<ChartPoint<'_>>)> = second
                .values
                .iter()
                .map(|column| {
                    let line = points
                        .iter()
                        .filter(|point| point.values.get(1) == Some(column))
                        .map(|point| mark(point))
                        .collect();
                    (column.as_str(), line)
                })
                .collect();
            plot::grid_chart(path, (&first.key, &second.key), &lines)?;
        }
    }
    Ok(())
}

/// `point` as a chart draws it against its first swept value.
fn mark(point: &GridPoint) -> ChartPoint<'_> {
    ChartPoint {
        value: first_value(point),
        ettr: point.outcome.ettr(),
        half_width: point.outcome.half_width().unwrap_or(0.0),
        model_ettr: point.outcome.model_ettr(),
    }
}

/// What the runs took, for stderr: never in the report, which is the same for the same inputs.
pub(super) struct WallClock {
    pub seconds: f64,
    pub threads: usize,
    /// The discrete events all the runs processed.
    pub events: u64,
}

/// The stderr line: what was simulated, on how many threads, in how long.
pub(super) fn wall_clock_line(swept: Swept<'_>, points: &[GridPoint], wall: &WallClock) -> String {
    let WallClock { seconds, threads, events } = *wall;
    let rate = per_second(events, seconds);
    let seeds = points.first().map_or(1, |point| match &point.outcome {
        Outcome::Report(_) => 1,
        Outcome::Replications(summary) => summary.seeds.len(),
    });
    match (swept, points.first().map(|point| &point.outcome)) {
        (Swept::Nothing, Some(Outcome::Report(report))) => format!(
            "simulated {} days of {} nodes in {seconds:.1} s wall: {events} events ({rate}/s)",
            short(report.setting.days),
            report.setting.nodes,
        ),
        (Swept::Nothing, Some(Outcome::Replications(summary))) => format!(
            "simulated {seeds} seeds of {} days of {} nodes on {threads} thread(s) in {seconds:.1} s wall: {events} events ({rate}/s)",
            short(summary.setting.days),
            summary.setting.nodes,
        ),
        _ => {
            let keys: Vec<&str> = swept.sweeps().iter().map(|sweep| sweep.key.as_str()).collect();
            let each = if seeds > 1 { format!(", {seeds} seeds each,") } else { String::new() };
            format!(
                "simulated {} settings of {}{each} on {threads} thread(s) in {seconds:.1} s wall: {events} events ({rate}/s)",
                points.len(),
                keys.join(" and "),
            )
        }
    }
}

pub(super) fn json(value: &impl Serialize) -> Result<String, SimulateError> {
    serde_json::to_string_pretty(value).map(|text| text + "\n").map_err(SimulateError::Json)
}

/// A sweep's JSON: `{"sweep": {...}}`.
#[derive(Serialize)]
struct SweepOutput<T> {
    sweep: T,
}

/// One key: `{"key", "points": [{"value", "report" | "replications"}], "best"}`.
#[derive(Serialize)]
struct OneKeyJson<'a> {
    key: &'a str,
    points: Vec<OneKeyPoint<'a>>,
    best: Option<&'a str>,
}

#[derive(Serialize)]
struct OneKeyPoint<'a> {
    value: &'a str,
    #[serde(flatten)]
    outcome: &'a Outcome,
}

/// Two keys: `{"keys", "points": [{"values", "report" | "replications"}], "best"}`, the values in
/// the keys' order.
#[derive(Serialize)]
struct GridJson<'a> {
    keys: [&'a str; 2],
    points: Vec<GridPointJson<'a>>,
    best: Option<&'a [String]>,
}

#[derive(Serialize)]
struct GridPointJson<'a> {
    values: &'a [String],
    #[serde(flatten)]
    outcome: &'a Outcome,
}

fn first_value(point: &GridPoint) -> &str {
    point.values.first().map_or("", String::as_str)
}

fn sweep_json(key: &str, points: &[GridPoint]) -> Result<String, SimulateError> {
    json(&SweepOutput {
        sweep: OneKeyJson {
            key,
            points: points
                .iter()
                .map(|point| OneKeyPoint { value: first_value(point), outcome: &point.outcome })
                .collect(),
            best: best(points).map(first_value),
        },
    })
}

fn grid_json(keys: [&str; 2], points: &[GridPoint]) -> Result<String, SimulateError> {
    json(&SweepOutput {
        sweep: GridJson {
            keys,
            points: points
                .iter()
                .map(|point| GridPointJson { values: &point.values, outcome: &point.outcome })
                .collect(),
            best: best(points).map(|point| point.values.as_slice()),
        },
    })
}

/// The point with the highest ETTR (the seeds' mean); the first of equals.
pub(super) fn best(points: &[GridPoint]) -> Option<&GridPoint> {
    points.iter().fold(None, |best: Option<&GridPoint>, point| match best {
        Some(best) if best.outcome.ettr().total_cmp(&point.outcome.ettr()).is_ge() => Some(best),
        _ => Some(point),
    })
}

/// A one-key sweep as a table: each value's ETTR (with several seeds their mean and its
/// interval's half-width), the model's, and the lost time summed over the jobs.
pub(super) fn sweep_table(key: &str, points: &[GridPoint]) -> String {
    let seeded = points.iter().any(|point| point.outcome.half_width().is_some());
    let mut header = vec![key.to_owned(), "ETTR".to_owned()];
    if seeded {
        header.push(format!("±{:.0}%", CONFIDENCE * 100.0));
    }
    header.push("model".to_owned());
    header.extend(LOST_COLUMNS.iter().map(|(name, _)| (*name).to_owned()));
    header.push("interrupts".to_owned());
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|point| {
            let mut row =
                vec![first_value(point).to_owned(), format!("{:.3}", point.outcome.ettr())];
            if let Some(half_width) = point.outcome.half_width() {
                row.push(format!("{half_width:.3}"));
            }
            row.push(format!("{:.3}", point.outcome.model_ettr()));
            match &point.outcome {
                Outcome::Report(report) => {
                    row.extend(LOST_COLUMNS.iter().map(|(_, part)| {
                        format!(
                            "{:.1}",
                            report.jobs.iter().map(|job| part(&job.lost_hours)).sum::<f64>()
                        )
                    }));
                    let interruptions: u32 = report.jobs.iter().map(|job| job.interruptions).sum();
                    row.push(interruptions.to_string());
                }
                Outcome::Replications(summary) => {
                    let lost = &summary.mean.lost_hours;
                    row.extend(LOST_COLUMNS.iter().map(|(_, part)| format!("{:.1}", part(lost))));
                    row.push(format!("{:.1}", summary.mean.interruptions));
                }
            }
            row
        })
        .collect();
    let mut out = aligned(&header, &rows);
    match best(points) {
        Some(point) => {
            out += &format!("best {key}: {} ({})\n", first_value(point), best_figures(point));
        }
        None => out += "no points\n",
    }
    out += &interval_note(points, "the other columns are means per seed");
    out
}

/// A two-key sweep as a grid of ETTR: a row per value of the first key, a column per value of
/// the second; with several seeds each cell the mean ± its interval's half-width.
pub(super) fn grid_table(keys: (&str, &str), points: &[GridPoint]) -> String {
    let (first, second) = keys;
    let mut columns: Vec<&str> = Vec::new();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for point in points {
        let (Some(row), Some(column)) = (point.values.first(), point.values.get(1)) else {
            continue;
        };
        if !columns.contains(&column.as_str()) {
            columns.push(column);
        }
        if rows.last().and_then(|cells| cells.first()) != Some(row) {
            rows.push(vec![row.clone()]);
        }
        if let Some(cells) = rows.last_mut() {
            cells.push(match point.outcome.half_width() {
                Some(half_width) => format!("{:.3} ± {half_width:.3}", point.outcome.ettr()),
                None => format!("{:.3}", point.outcome.ettr()),
            });
        }
    }
    let header: Vec<String> =
        std::iter::once(String::new()).chain(columns.iter().map(|c| (*c).to_owned())).collect();
    let mut out = format!("ETTR by {first} (rows) and {second} (columns)\n");
    out += &aligned(&header, &rows);
    match best(points) {
        Some(point) => {
            let values: Vec<String> = [first, second]
                .iter()
                .zip(&point.values)
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            out += &format!("best: {} ({})\n", values.join(", "), best_figures(point));
        }
        None => out += "no points\n",
    }
    out += &interval_note(points, "one run per seed and combination");
    out
}

/// The best point's ETTR (± its half-width) and the closed-form model's.
fn best_figures(point: &GridPoint) -> String {
    let ettr = match point.outcome.half_width() {
        Some(half_width) => format!("{:.3} ± {half_width:.3}", point.outcome.ettr()),
        None => format!("{:.3}", point.outcome.ettr()),
    };
    format!("ETTR {ettr}; closed-form model {:.3}", point.outcome.model_ettr())
}

/// With several seeds, the line that says what the ETTR and its ± are; nothing for one.
fn interval_note(points: &[GridPoint], rest: &str) -> String {
    let Some(summary) = points.iter().find_map(|point| match &point.outcome {
        Outcome::Replications(summary) => Some(summary),
        Outcome::Report(_) => None,
    }) else {
        return String::new();
    };
    format!(
        "ETTR: the mean of {} seeds ± the half-width of its {:.0} % confidence interval (Student's t, {} degrees of freedom); {rest}\n",
        summary.seeds.len(),
        summary.ettr.confidence * 100.0,
        summary.ettr.degrees_of_freedom
    )
}

/// `rows` under `header`, columns two spaces apart: the first left-aligned, the rest right.
fn aligned(header: &[String], rows: &[Vec<String>]) -> String {
    let width = |cell: &String| cell.chars().count();
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            rows.iter()
                .filter_map(|row| row.get(column))
                .chain([&header[column]])
                .map(width)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> =
            cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(column, (cell, &width))| {
                    if column == 0 { format!("{cell:<width$}") } else { format!("{cell:>width$}") }
                })
                .collect();
        parts.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(header);
    for row in rows {
        out += &line(row);
    }
    out
}

/// `x` with at most two decimals and no trailing zeros: 54, 0.5, 0.33.
pub(super) fn short(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn per_second(events: u64, wall_seconds: f64) -> String {
    if wall_seconds > 0.0 { format!("{:.0}", events as f64 / wall_seconds) } else { "-".to_owned() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::plot::tests::report;
    use crate::replications::Replications;
    use crate::report::SimReport;

    fn point(values: &[&str], outcome: Outcome) -> GridPoint {
        GridPoint {
            values: values.iter().map(|v| (*v).to_owned()).collect(),
            outcome,
            interval_minutes: Some(30.0),
        }
    }

    fn sweep_points() -> Vec<GridPoint> {
        [("10m", 0.91, 0.92), ("30m", 0.95, 0.96), ("1h", 0.95, 0.94)]
            .iter()
            .map(|&(value, ettr, model)| {
                point(&[value], Outcome::Report(report(value, ettr, model)))
            })
            .collect()
    }

    /// Replications of three seeds with the ETTRs given.
    fn seeded(ettrs: [f64; 3]) -> Outcome {
        let runs: Vec<SimReport> = ettrs
            .iter()
            .enumerate()
            .map(|(index, &ettr)| {
                let mut run = report("30m", ettr, 0.96);
                run.setting.seed = 1 + index as u64;
                run
            })
            .collect();
        Outcome::Replications(Replications::of(&runs).unwrap())
    }

    #[test]
    fn best_is_the_highest_ettr_and_the_first_of_equals() {
        assert_eq!(best(&sweep_points()).unwrap().values, ["30m"]);
        assert!(best(&[]).is_none());
    }

    #[test]
    fn sweep_table_has_a_row_per_value_and_names_the_best() {
        let table = sweep_table("job.checkpoint_every", &sweep_points());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5, "{table}");
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(header[..4], ["job.checkpoint_every", "ETTR", "model", "detect"], "{table}");
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        // value, ETTR, model, then the lost hours: detection, drain, rollback, restart, waiting,
        // held, checkpoint writes; interruptions.
        assert_eq!(
            row,
            ["10m", "0.910", "0.920", "0.1", "0.1", "0.4", "0.3", "0.0", "0.0", "1.5", "3"]
        );
        assert!(lines[3].starts_with("1h "), "{table}");
        assert_eq!(
            lines[4],
            "best job.checkpoint_every: 30m (ETTR 0.950; closed-form model 0.960)"
        );
    }

    #[test]
    fn a_seeded_sweep_table_shows_the_interval_and_the_means() {
        let points = vec![
            point(&["8"], seeded([0.90, 0.93, 0.96])),
            point(&["32"], seeded([0.95, 0.95, 0.95])),
        ];
        let table = sweep_table("repairer.policy.guard_rails.max_concurrent_repairs", &points);
        let lines: Vec<&str> = table.lines().collect();
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(header[1..4], ["ETTR", "±95%", "model"], "{table}");
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "8", "0.930", "0.075", "0.960", "0.1", "0.1", "0.4", "0.3", "0.0", "0.0", "1.5",
                "3.0"
            ]
        );
        // The ± column lines up under its header.
        let ends = |line: &str, cell: &str| {
            line.find(cell).map(|at| line[..at].chars().count() + cell.chars().count())
        };
        assert_eq!(ends(lines[0], "±95%"), ends(lines[1], "0.075"), "{table}");
        assert_eq!(
            lines[3],
            "best repairer.policy.guard_rails.max_concurrent_repairs: 32 \
             (ETTR 0.950 ± 0.000; closed-form model 0.960)"
        );
        assert_eq!(
            lines[4],
            "ETTR: the mean of 3 seeds ± the half-width of its 95 % confidence interval \
             (Student's t, 2 degrees of freedom); the other columns are means per seed"
        );
        assert_eq!(lines.len(), 5, "{table}");
    }

    /// A 2 x 2 grid of repairs (rows) and checkpoint intervals (columns), one seed or three.
    fn grid(seeds: bool) -> Vec<GridPoint> {
        [("8", "15m", 0.90), ("8", "30m", 0.91), ("32", "15m", 0.95), ("32", "30m", 0.94)]
            .iter()
            .map(|&(repairs, every, ettr)| {
                let outcome = if seeds {
                    seeded([ettr - 0.01, ettr, ettr + 0.01])
                } else {
                    Outcome::Report(report(every, ettr, 0.96))
                };
                point(&[repairs, every], outcome)
            })
            .collect()
    }

    const KEYS: (&str, &str) =
        ("repairer.policy.guard_rails.max_concurrent_repairs", "job.checkpoint_every");

    #[test]
    fn a_grid_table_has_a_row_per_first_value_and_a_column_per_second() {
        let table = grid_table(KEYS, &grid(false));
        assert_eq!(
            table,
            "ETTR by repairer.policy.guard_rails.max_concurrent_repairs (rows) and \
             job.checkpoint_every (columns)\n\
             \x20     15m    30m\n\
             8   0.900  0.910\n\
             32  0.950  0.940\n\
             best: repairer.policy.guard_rails.max_concurrent_repairs=32, \
             job.checkpoint_every=15m (ETTR 0.950; closed-form model 0.960)\n"
        );
    }

    #[test]
    fn a_seeded_grid_shows_each_cell_with_its_interval() {
        let table = grid_table(KEYS, &grid(true));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["15m", "30m"]);
        // s = 0.01, t(0.975, 2) = 4.303: ± 0.025.
        assert_eq!(lines[2], "8   0.900 ± 0.025  0.910 ± 0.025", "{table}");
        assert_eq!(lines[3], "32  0.950 ± 0.025  0.940 ± 0.025", "{table}");
        assert!(
            lines[4].ends_with("=15m (ETTR 0.950 ± 0.025; closed-form model 0.960)"),
            "{table}"
        );
        assert!(
            lines[5].contains("the mean of 3 seeds") && lines[5].contains("Student's t"),
            "{table}"
        );
    }

    #[test]
    fn grid_json_lists_every_point_with_both_values_and_the_best() {
        let text = grid_json([KEYS.0, KEYS.1], &grid(true)).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let sweep = &value["sweep"];
        assert_eq!(sweep["keys"], serde_json::json!([KEYS.0, KEYS.1]));
        let values: Vec<&serde_json::Value> =
            sweep["points"].as_array().unwrap().iter().map(|p| &p["values"]).collect();
        assert_eq!(
            values,
            [
                &serde_json::json!(["8", "15m"]),
                &serde_json::json!(["8", "30m"]),
                &serde_json::json!(["32", "15m"]),
                &serde_json::json!(["32", "30m"]),
            ]
        );
        let cell = &sweep["points"][2]["replications"];
        assert_eq!(cell["ettr"]["method"], "student-t");
        assert_eq!(cell["ettr"]["degrees_of_freedom"], 2);
        assert_eq!(cell["seeds"].as_array().unwrap().len(), 3);
        assert_eq!(sweep["best"], serde_json::json!(["32", "15m"]));
        assert_eq!(text, grid_json([KEYS.0, KEYS.1], &grid(true)).unwrap());
        let one_seed = grid_json([KEYS.0, KEYS.1], &grid(false)).unwrap();
        let value: serde_json::Value = serde_json::from_str(&one_seed).unwrap();
        assert_eq!(value["sweep"]["points"][0]["report"]["ettr"], 0.9);
    }

    #[test]
    fn sweep_json_has_key_points_in_order_and_best() {
        let text = sweep_json("job.checkpoint_every", &sweep_points()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let sweep = &value["sweep"];
        assert_eq!(sweep["key"], "job.checkpoint_every");
        assert_eq!(sweep["best"], "30m");
        let values: Vec<&str> = sweep["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["value"].as_str().unwrap())
            .collect();
        assert_eq!(values, ["10m", "30m", "1h"]);
        assert_eq!(sweep["points"][1]["report"]["ettr"], 0.95);
        assert_eq!(text, sweep_json("job.checkpoint_every", &sweep_points()).unwrap());
    }

    #[test]
    fn one_seed_renders_as_the_single_run_always_has() {
        let run = report("30m", 0.95, 0.96);
        let points = [point(&[], Outcome::Report(run.clone()))];
        assert_eq!(render(Swept::Nothing, &points, false).unwrap(), run.summary());
        assert_eq!(
            render(Swept::Nothing, &points, true).unwrap(),
            serde_json::to_string_pretty(&run).unwrap() + "\n"
        );
    }

    #[test]
    fn several_seeds_render_their_summary() {
        let points = [point(&[], seeded([0.90, 0.93, 0.96]))];
        let text = render(Swept::Nothing, &points, false).unwrap();
        assert!(text.contains("ETTR 0.930 ± 0.075 over 3 seeds"), "{text}");
        let value: serde_json::Value =
            serde_json::from_str(&render(Swept::Nothing, &points, true).unwrap()).unwrap();
        assert_eq!(value["ettr"]["method"], "student-t");
        assert_eq!(value["seeds"][2]["seed"], 3);
    }

    #[test]
    fn the_wall_clock_line_says_what_ran() {
        let wall = WallClock { seconds: 2.0, threads: 2, events: 1_000 };
        let single = [point(&[], Outcome::Report(report("30m", 0.9, 0.9)))];
        assert_eq!(
            wall_clock_line(Swept::Nothing, &single, &wall),
            "simulated 2 days of 16 nodes in 2.0 s wall: 1000 events (500/s)"
        );
        let seeds = [point(&[], seeded([0.9, 0.9, 0.9]))];
        assert_eq!(
            wall_clock_line(Swept::Nothing, &seeds, &wall),
            "simulated 3 seeds of 2 days of 16 nodes on 2 thread(s) in 2.0 s wall: 1000 events (500/s)"
        );
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short(54.0), "54");
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(1.0 / 3.0), "0.33");
    }
}
