//! `fleetmend simulate`: the flags as setting overrides, one run or a sweep run in parallel, and
//! their output: the text summary or deterministic JSON on stdout, an SVG chart, a progress bar
//! and the wall-clock figures on stderr (never in the JSON, which is the same bytes for the same
//! inputs).

use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::config::SimConfig;
use crate::inputs::{self, InputError, OwnInputs};
use crate::plot::{self, PlotError};
use crate::replay::{self, ReplayReport};
use crate::report::SimReport;
use crate::run::{self, SimError};

/// Exit status for bad flags or settings.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for a simulation (or its output) that failed.
const EXIT_RUN_FAILED: u8 = 1;
const SECONDS_PER_DAY: f64 = 86_400.0;
/// Progress bar steps per simulation.
const STEPS_PER_RUN: u64 = 1_000;
/// A sweep's worker threads get the stack a main thread has (or more): a simulation runs the
/// repairer's futures on the thread that runs it, and unoptimised builds make those large.
const WORKER_STACK_BYTES: usize = 16 << 20;

/// `fleetmend simulate`'s flags. Each sets a field of the settings by its dotted path, in the
/// order listed here, then `--set`, then the sweep's key.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Settings (TOML): [fleet], [job], [failures], [[event]], catalog, [repairer.policy],
    /// [repairer.engine], [repairer.queue]. Without it, the defaults: Llama 3 405B pre-training
    /// (2,048 nodes x 8 GPUs, 54 days).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A repairer config (`fleetmend repairer --config`): its [policy], [engine] and [queue],
    /// read and checked as the repairer reads it; the settings' [repairer.*] and --set go over it.
    #[arg(long, value_name = "FILE")]
    pub repairer_config: Option<PathBuf>,
    /// The fleet's inventory (names and hostlist patterns, one a line, as the repairer's
    /// [inventory] file): its size is the fleet's, its names the replayed history's nodes.
    #[arg(long, value_name = "FILE", conflicts_with = "nodes")]
    pub inventory: Option<PathBuf>,
    /// Strike a failure history exported from a repairer (`fleetmend export-faults`) instead of
    /// random failures, and compare the decisions per node with the recorded ones.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// Nodes in the fleet, spares included (`fleet.nodes`).
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    /// GPUs per node (`fleet.gpus_per_node`).
    #[arg(long, value_name = "G")]
    pub gpus_per_node: Option<u32>,
    /// Simulated days, fractions allowed (`fleet.duration`, in whole seconds).
    #[arg(long, value_name = "D", value_parser = parse_days)]
    pub days: Option<f64>,
    /// Nodes kept out of the job(s) to take a failed node's place (`fleet.spares`).
    #[arg(long, value_name = "S")]
    pub spares: Option<u32>,
    /// Checkpoint interval: a duration (`30m`) or `auto`, the queue's Young/Daly interval
    /// (`job.checkpoint_every`).
    #[arg(long, value_name = "DURATION|auto")]
    pub checkpoint_every: Option<String>,
    /// Seed of the failures; the same seed and settings give the same report (`fleet.seed`).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Any setting by its dotted path, e.g. `failures.rate_per_node_day=0.01` (repeatable; after
    /// the flags above).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    pub set: Vec<(String, String)>,
    /// The report as JSON instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Draw ETTR to this SVG file: with --sweep against the swept value, else the closed-form
    /// model against the checkpoint interval with this run marked.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Run once per value of one setting, in parallel, e.g. `job.checkpoint_every=10m,30m,1h`.
    #[arg(long, value_name = "KEY=V1,V2,...", value_parser = parse_sweep)]
    pub sweep: Option<Sweep>,
}

/// `--sweep KEY=V1,V2,...`: one setting and the values it takes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sweep {
    pub key: String,
    pub values: Vec<String>,
}

/// `fleetmend simulate` could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("--plot {}: the chart is SVG only: name a .svg file", .path.display())]
    PlotFile { path: PathBuf },
    #[error(transparent)]
    Settings(Box<InputError>),
    #[error("settings with --sweep {key}={value}: {source}")]
    SweepSettings { key: String, value: String, source: Box<InputError> },
    #[error("simulation{}: {source}", point_name(.point))]
    Run { point: Option<(String, String)>, source: SimError },
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error("writing the report as JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("writing to stdout: {0}")]
    Stdout(#[source] std::io::Error),
}

fn point_name(point: &Option<(String, String)>) -> String {
    point.as_ref().map_or_else(String::new, |(key, value)| format!(" of {key}={value}"))
}

impl SimulateError {
    /// 2 for bad flags or settings (settings problems the run itself found included), 1 for a run
    /// or output that failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            SimulateError::PlotFile { .. }
            | SimulateError::Settings(_)
            | SimulateError::SweepSettings { .. } => EXIT_BAD_INPUT,
            SimulateError::Run { source, .. } => match source {
                SimError::Config(_) | SimError::Failures(_) => EXIT_BAD_INPUT,
                _ => EXIT_RUN_FAILED,
            },
            SimulateError::Plot(_) | SimulateError::Json(_) | SimulateError::Stdout(_) => {
                EXIT_RUN_FAILED
            }
        }
    }
}

/// Runs `fleetmend simulate`: 0, or a one-line error on stderr and [`SimulateError::exit_code`].
pub fn run(args: SimulateArgs) -> ExitCode {
    match simulate_command(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fleetmend simulate: {}", one_line(&err.to_string()));
            ExitCode::from(err.exit_code())
        }
    }
}

/// `message` on one line (TOML's parse errors come on several).
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message.lines().map(str::trim).filter(|line| !line.is_empty()).collect();
    lines.join(" ")
}

fn simulate_command(args: &SimulateArgs) -> Result<(), SimulateError> {
    if let Some(path) = &args.plot
        && path.extension().is_none_or(|extension| !extension.eq_ignore_ascii_case("svg"))
    {
        return Err(SimulateError::PlotFile { path: path.clone() });
    }
    match &args.sweep {
        None => single(args),
        Some(sweep) => sweep_command(args, sweep),
    }
}

/// The settings overrides the flags make, in order: the flags, then `--set`.
pub fn overrides(args: &SimulateArgs) -> Vec<(String, String)> {
    let mut overrides = Vec::new();
    let mut set = |key: &str, value: Option<String>| {
        if let Some(value) = value {
            overrides.push((key.to_owned(), value));
        }
    };
    set("fleet.nodes", args.nodes.map(|n| n.to_string()));
    set("fleet.gpus_per_node", args.gpus_per_node.map(|g| g.to_string()));
    set("fleet.duration", args.days.map(|days| format!("{}s", day_seconds(days))));
    set("fleet.spares", args.spares.map(|s| s.to_string()));
    set("job.checkpoint_every", args.checkpoint_every.clone());
    set("fleet.seed", args.seed.map(|seed| seed.to_string()));
    overrides.extend(args.set.iter().cloned());
    overrides
}

/// `days` in whole seconds ([`parse_days`] has checked that it is at least one).
fn day_seconds(days: f64) -> u64 {
    (days * SECONDS_PER_DAY).round() as u64
}

/// `--days`: a finite number of days, at least one second long.
pub fn parse_days(text: &str) -> Result<f64, String> {
    let days: f64 =
        text.trim().parse().map_err(|_| "not a number of days (e.g. 0.5)".to_owned())?;
    if !days.is_finite() || days * SECONDS_PER_DAY < 0.5 {
        return Err("must be at least one second".to_owned());
    }
    if days * SECONDS_PER_DAY >= u64::MAX as f64 {
        return Err("too long".to_owned());
    }
    Ok(days)
}

/// `--set KEY=VALUE`.
pub fn parse_setting(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| "expected KEY=VALUE (a dotted setting, e.g. fleet.nodes=64)".to_owned())?;
    let key = checked_key(key)?;
    Ok((key, value.trim().to_owned()))
}

/// `--sweep KEY=V1,V2,...`: a key and one or more distinct, non-empty values.
pub fn parse_sweep(text: &str) -> Result<Sweep, String> {
    let (key, list) = text.split_once('=').ok_or_else(|| {
        "expected KEY=V1,V2,... (e.g. job.checkpoint_every=10m,30m,1h)".to_owned()
    })?;
    let key = checked_key(key)?;
    if list.trim().is_empty() {
        return Err(format!("no values to sweep {key} over"));
    }
    let mut seen = BTreeSet::new();
    let mut values = Vec::new();
    for value in list.split(',').map(str::trim) {
        if value.is_empty() {
            return Err("an empty value in the list".to_owned());
        }
        if !seen.insert(value) {
            return Err(format!("{value} is listed twice"));
        }
        values.push(value.to_owned());
    }
    Ok(Sweep { key, values })
}

/// A dotted setting path: non-empty parts, no spaces.
fn checked_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty()
        || key.split('.').any(|part| part.is_empty() || part.contains(char::is_whitespace))
    {
        return Err(format!("{key:?} is not a setting's dotted path (e.g. fleet.nodes)"));
    }
    Ok(key.to_owned())
}

/// The settings: the file, the operator's own inputs, then `overrides`.
fn settings(args: &SimulateArgs, overrides: &[(String, String)]) -> Result<SimConfig, InputError> {
    let own = OwnInputs {
        repairer_config: args.repairer_config.as_deref(),
        inventory: args.inventory.as_deref(),
        replay: args.replay.as_deref(),
    };
    inputs::load(args.config.as_deref(), own, overrides)
}

/// One simulation, its summary or JSON (with a replay's account), its chart.
fn single(args: &SimulateArgs) -> Result<(), SimulateError> {
    let config =
        settings(args, &overrides(args)).map_err(|err| SimulateError::Settings(Box::new(err)))?;
    let bar = progress_bar(1);
    let started = Instant::now();
    let result = match &bar {
        Some(feed) => replay::simulate(&config, Some(&|share| feed.advance(0, share))),
        None => replay::simulate(&config, None),
    };
    if let Some(feed) = &bar {
        feed.bar.finish_and_clear();
    }
    let (report, replayed) = result.map_err(|source| SimulateError::Run { point: None, source })?;
    let wall = started.elapsed().as_secs_f64();
    let text = match (&replayed, args.json) {
        (Some(replay), true) => json(&ReplayReport { report: &report, replay })?,
        (Some(replay), false) => report.summary() + &replay.summary(),
        (None, true) => json(&report)?,
        (None, false) => report.summary(),
    };
    print(&text)?;
    if let Some(path) = &args.plot {
        plot::single_chart(path, &report)?;
    }
    let s = &report.setting;
    eprintln!(
        "simulated {} days of {} nodes in {wall:.1} s wall: {} events ({}/s)",
        short(s.days),
        s.nodes,
        report.sim_events,
        per_second(report.sim_events, wall)
    );
    Ok(())
}

/// One simulation per swept value, in parallel; the table or JSON, the best value, the chart.
fn sweep_command(args: &SimulateArgs, sweep: &Sweep) -> Result<(), SimulateError> {
    let base = overrides(args);
    let configs = sweep
        .values
        .iter()
        .map(|value| {
            let mut overrides = base.clone();
            overrides.push((sweep.key.clone(), value.clone()));
            settings(args, &overrides).map_err(|source| SimulateError::SweepSettings {
                key: sweep.key.clone(),
                value: value.clone(),
                source: Box::new(source),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let threads =
        std::thread::available_parallelism().map_or(1, NonZeroUsize::get).min(configs.len());
    let bar = progress_bar(configs.len());
    let started = Instant::now();
    let results = sweep_reports(&configs, threads, bar.as_ref());
    if let Some(feed) = &bar {
        feed.bar.finish_and_clear();
    }
    let reports = results.map_err(|(index, source)| SimulateError::Run {
        point: Some((sweep.key.clone(), sweep.values[index].clone())),
        source,
    })?;
    let wall = started.elapsed().as_secs_f64();
    let points: Vec<(String, SimReport)> = sweep.values.iter().cloned().zip(reports).collect();
    let text =
        if args.json { sweep_json(&sweep.key, &points)? } else { sweep_table(&sweep.key, &points) };
    print(&text)?;
    if let Some(path) = &args.plot {
        plot::sweep_chart(path, &sweep.key, &points)?;
    }
    let events: u64 = points.iter().map(|(_, report)| report.sim_events).sum();
    eprintln!(
        "simulated {} settings of {} on {threads} thread(s) in {wall:.1} s wall: {events} events ({}/s)",
        points.len(),
        sweep.key,
        per_second(events, wall)
    );
    Ok(())
}

/// One simulation per config on up to `threads` threads: the reports in the configs' order, or
/// the first failure with its config's index.
fn sweep_reports(
    configs: &[SimConfig],
    threads: usize,
    bar: Option<&ProgressFeed>,
) -> Result<Vec<SimReport>, (usize, SimError)> {
    in_parallel(configs, threads, |index, config| match bar {
        Some(feed) => run::simulate(config, Some(&|share| feed.advance(index, share))),
        None => run::simulate(config, None),
    })
}

/// Runs `work` on each item on up to `threads` threads (this one among them) and gives the results in the items'
/// order, or the failure (of the earliest item among those that failed) with the item's index.
/// Once one fails no further item starts.
fn in_parallel<T: Sync, R: Send, E: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(usize, &T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, (usize, E)> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let worker = || {
        let mut done = Vec::new();
        while !failed.load(Ordering::Relaxed) {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(index) else { break };
            let result = work(index, item);
            if result.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            done.push((index, result));
        }
        done
    };
    let mut slots: Vec<Option<Result<R, E>>> = items.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        // This thread is one of the workers: should no helper start, it does all the work.
        let helpers: Vec<_> = (1..threads.clamp(1, items.len().max(1)))
            .filter_map(|_| {
                std::thread::Builder::new()
                    .stack_size(WORKER_STACK_BYTES)
                    .spawn_scoped(scope, worker)
                    .ok()
            })
            .collect();
        let mut finished = vec![worker()];
        for helper in helpers {
            match helper.join() {
                Ok(done) => finished.push(done),
                // A simulation that panicked is a bug: let it surface as the panic it is.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        for (index, result) in finished.into_iter().flatten() {
            slots[index] = Some(result);
        }
    });
    let mut results = Vec::with_capacity(items.len());
    let mut first_failure = None;
    for (index, slot) in slots.into_iter().enumerate() {
        match slot {
            Some(Ok(result)) => results.push(result),
            Some(Err(err)) => {
                first_failure.get_or_insert((index, err));
            }
            None => {}
        }
    }
    match first_failure {
        Some(failure) => Err(failure),
        None => Ok(results),
    }
}

/// A progress bar over `runs` simulations, each fed its share of simulated time done.
struct ProgressFeed {
    bar: ProgressBar,
    /// Steps each run has reported so far.
    steps: Vec<AtomicU64>,
}

impl ProgressFeed {
    fn advance(&self, run: usize, share: f64) {
        let Some(steps) = self.steps.get(run) else { return };
        let now = (share.clamp(0.0, 1.0) * STEPS_PER_RUN as f64) as u64;
        let before = steps.fetch_max(now, Ordering::Relaxed);
        if now > before {
            self.bar.inc(now - before);
        }
    }
}

/// A bar on stderr when stderr is a terminal; none otherwise (logs, pipes, CI).
fn progress_bar(runs: usize) -> Option<ProgressFeed> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(runs as u64 * STEPS_PER_RUN);
    let template = if runs > 1 {
        format!("{{bar:40}} {{percent:>3}}% of {runs} simulations, {{elapsed}} wall, eta {{eta}}")
    } else {
        "{bar:40} {percent:>3}% of simulated time, {elapsed} wall, eta {eta}".to_owned()
    };
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    Some(ProgressFeed { bar, steps: (0..runs).map(|_| AtomicU64::new(0)).collect() })
}

fn json(value: &impl Serialize) -> Result<String, SimulateError> {
    serde_json::to_string_pretty(value).map(|text| text + "\n").map_err(SimulateError::Json)
}

fn print(text: &str) -> Result<(), SimulateError> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).map_err(SimulateError::Stdout)
}

/// The sweep's JSON: `{"sweep": {"key", "points": [{"value", "report"}], "best"}}`.
#[derive(Serialize)]
struct SweepOutput<'a> {
    sweep: SweepJson<'a>,
}

#[derive(Serialize)]
struct SweepJson<'a> {
    key: &'a str,
    points: Vec<SweepPoint<'a>>,
    best: Option<&'a str>,
}

#[derive(Serialize)]
struct SweepPoint<'a> {
    value: &'a str,
    report: &'a SimReport,
}

fn sweep_json(key: &str, points: &[(String, SimReport)]) -> Result<String, SimulateError> {
    let output = SweepOutput {
        sweep: SweepJson {
            key,
            points: points.iter().map(|(value, report)| SweepPoint { value, report }).collect(),
            best: best(points).map(|(value, _)| value.as_str()),
        },
    };
    json(&output)
}

/// The point with the highest ETTR; the first of equals.
pub fn best(points: &[(String, SimReport)]) -> Option<&(String, SimReport)> {
    points.iter().fold(None, |best: Option<&(String, SimReport)>, point| match best {
        Some(best) if best.1.ettr.total_cmp(&point.1.ettr).is_ge() => Some(best),
        _ => Some(point),
    })
}

/// The sweep as a table: each value's ETTR, the model's, and the lost time summed over the jobs.
pub fn sweep_table(key: &str, points: &[(String, SimReport)]) -> String {
    let header = [
        key,
        "ETTR",
        "model",
        "detect h",
        "drain h",
        "rollback h",
        "restart h",
        "wait h",
        "held h",
        "ckpt h",
        "interrupts",
    ];
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|(value, report)| {
            let lost = |part: fn(&crate::report::LostTime) -> f64| {
                format!("{:.1}", report.jobs.iter().map(|job| part(&job.lost_hours)).sum::<f64>())
            };
            let interruptions: u32 = report.jobs.iter().map(|job| job.interruptions).sum();
            vec![
                value.clone(),
                format!("{:.3}", report.ettr),
                format!("{:.3}", report.model_ettr),
                lost(|l| l.detection),
                lost(|l| l.drain_and_checkpoint),
                lost(|l| l.rollback),
                lost(|l| l.restart),
                lost(|l| l.waiting_for_nodes),
                lost(|l| l.held_by_guard_rail),
                lost(|l| l.checkpoint_writes),
                interruptions.to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = header
        .iter()
        .enumerate()
        .map(|(column, name)| {
            rows.iter().map(|row| row[column].len()).chain([name.len()]).max().unwrap_or(0)
        })
        .collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let parts: Vec<String> =
            cells
                .zip(&widths)
                .enumerate()
                .map(|(column, (cell, &width))| {
                    if column == 0 { format!("{cell:<width$}") } else { format!("{cell:>width$}") }
                })
                .collect();
        parts.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for row in &rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    match best(points) {
        Some((value, report)) => {
            out += &format!(
                "best {key}: {value} (ETTR {:.3}; closed-form model {:.3})\n",
                report.ettr, report.model_ettr
            );
        }
        None => out += "no points\n",
    }
    out
}

/// `x` with at most two decimals and no trailing zeros: 54, 0.5, 0.33.
fn short(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn per_second(events: u64, wall_seconds: f64) -> String {
    if wall_seconds > 0.0 { format!("{:.0}", events as f64 / wall_seconds) } else { "-".to_owned() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::Path;

    use clap::Parser;

    use super::*;
    use crate::plot::tests::report;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn parse(flags: &[&str]) -> Result<SimulateArgs, clap::Error> {
        Command::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
            .map(|command| command.args)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn flags_become_overrides_in_order_then_set() {
        let args = parse(&[
            "--set",
            "failures.rate_per_node_day=0.01",
            "--seed",
            "9",
            "--checkpoint-every",
            "auto",
            "--days",
            "0.5",
            "--nodes",
            "64",
            "--gpus-per-node",
            "4",
            "--spares",
            "2",
            "--set",
            "fleet.nodes=32",
        ])
        .unwrap();
        assert_eq!(
            overrides(&args),
            pairs(&[
                ("fleet.nodes", "64"),
                ("fleet.gpus_per_node", "4"),
                ("fleet.duration", "43200s"),
                ("fleet.spares", "2"),
                ("job.checkpoint_every", "auto"),
                ("fleet.seed", "9"),
                ("failures.rate_per_node_day", "0.01"),
                ("fleet.nodes", "32"),
            ])
        );
    }

    #[test]
    fn no_flags_no_overrides() {
        assert!(overrides(&parse(&[]).unwrap()).is_empty());
    }

    #[test]
    fn days_round_to_whole_seconds() {
        let duration = |days: &str| overrides(&parse(&["--days", days]).unwrap());
        assert_eq!(duration("54"), pairs(&[("fleet.duration", "4665600s")]));
        assert_eq!(duration("0.00001"), pairs(&[("fleet.duration", "1s")]));
        assert_eq!(duration("1.5"), pairs(&[("fleet.duration", "129600s")]));
    }

    #[test]
    fn bad_days_are_refused_by_name() {
        for (days, wanted) in [
            ("half", "not a number of days"),
            ("0", "at least one second"),
            ("-1", "at least one second"),
            ("NaN", "at least one second"),
            ("inf", "at least one second"),
            ("1e300", "too long"),
        ] {
            let err = parse_days(days).unwrap_err();
            assert!(err.contains(wanted), "{days}: {err}");
        }
        let err = parse(&["--days", "0"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--days"), "{err}");
    }

    #[test]
    fn settings_need_key_and_value() {
        assert_eq!(parse_setting("fleet.nodes=64").unwrap(), ("fleet.nodes".into(), "64".into()));
        assert_eq!(
            parse_setting("job.checkpoint_every = 1h 30m").unwrap(),
            ("job.checkpoint_every".into(), "1h 30m".into())
        );
        assert!(parse_setting("fleet.nodes").unwrap_err().contains("expected KEY=VALUE"));
        for key in ["=1", "fleet..nodes=1", ".nodes=1", "fleet.=1", "fleet nodes=1"] {
            let err = parse_setting(key).unwrap_err();
            assert!(err.contains("not a setting's dotted path"), "{key}: {err}");
        }
    }

    #[test]
    fn sweep_parses_key_and_values_in_order() {
        assert_eq!(
            parse_sweep("job.checkpoint_every=10m, 30m,1h,auto").unwrap(),
            Sweep {
                key: "job.checkpoint_every".to_owned(),
                values: vec!["10m".into(), "30m".into(), "1h".into(), "auto".into()],
            }
        );
        assert_eq!(parse_sweep("fleet.spares=0").unwrap().values, vec!["0".to_owned()]);
    }

    #[test]
    fn sweep_refuses_what_it_cannot_run() {
        for (text, wanted) in [
            ("job.checkpoint_every", "expected KEY=V1,V2,..."),
            ("job.checkpoint_every=", "no values to sweep job.checkpoint_every over"),
            ("job.checkpoint_every=  ", "no values to sweep"),
            ("job.checkpoint_every=10m,,1h", "an empty value"),
            ("job.checkpoint_every=10m,", "an empty value"),
            ("job.checkpoint_every=10m,10m", "10m is listed twice"),
            ("=10m,1h", "not a setting's dotted path"),
        ] {
            let err = parse_sweep(text).unwrap_err();
            assert!(err.contains(wanted), "{text}: {err}");
        }
        let err = parse(&["--sweep", "fleet.nodes"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("expected KEY=V1,V2"), "{err}");
    }

    #[test]
    fn a_plot_must_be_svg() {
        let args = parse(&["--plot", "ettr.png"]).unwrap();
        let err = simulate_command(&args).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_BAD_INPUT);
        assert!(err.to_string().contains("--plot ettr.png"), "{err}");
        assert!(parse(&["--plot", "out/ETTR.SVG"]).unwrap().plot.is_some());
    }

    #[test]
    fn bad_settings_exit_2_naming_the_setting() {
        let args = parse(&["--nodes", "4", "--spares", "4"]).unwrap();
        let err = simulate_command(&args).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_BAD_INPUT);
        assert!(err.to_string().contains("fleet.spares"), "{err}");

        let args = parse(&["--nodes", "4", "--sweep", "fleet.spares=1,9"]).unwrap();
        let err = simulate_command(&args).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_BAD_INPUT);
        let message = err.to_string();
        assert!(
            message.contains("--sweep fleet.spares=9") && message.contains("fleet.spares"),
            "{message}"
        );

        let args = parse(&["--set", "fleet.colour=blue"]).unwrap();
        let err = simulate_command(&args).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_BAD_INPUT);
        let message = one_line(&err.to_string());
        assert!(message.contains("unknown field `colour`"), "{message}");
        assert!(!message.contains('\n') && message.ends_with("in `fleet`"), "{message}");
    }

    #[test]
    fn a_failed_run_exits_1_and_a_settings_error_from_the_run_2() {
        let failed = SimulateError::Run {
            point: Some(("fleet.nodes".into(), "64".into())),
            source: SimError::Repairer("the clock stopped".into()),
        };
        assert_eq!(failed.exit_code(), EXIT_RUN_FAILED);
        assert_eq!(
            failed.to_string(),
            "simulation of fleet.nodes=64: building the repairer: the clock stopped"
        );
        let config =
            SimConfig::load(Some(Path::new("/nonexistent/fleetmend-sim.toml")), &[]).unwrap_err();
        let settings = SimulateError::Run { point: None, source: SimError::Config(config) };
        assert_eq!(settings.exit_code(), EXIT_BAD_INPUT);
    }

    #[test]
    fn parallel_results_keep_the_items_order() {
        let items: Vec<u64> = (0..23).collect();
        let results = in_parallel(&items, 4, |index, &item| {
            // Later items finish first.
            std::thread::sleep(std::time::Duration::from_millis(23 - item));
            Ok::<_, String>((index, item * 2))
        })
        .unwrap();
        assert_eq!(results, items.iter().map(|&i| (i as usize, i * 2)).collect::<Vec<_>>());
        assert_eq!(
            in_parallel(&[] as &[u64], 4, |_, _| Ok::<u64, ()>(1)).unwrap(),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn a_parallel_failure_names_its_item_and_stops_new_ones() {
        let started = AtomicUsize::new(0);
        let items: Vec<u32> = (0..50).collect();
        let err = in_parallel(&items, 1, |_, &item| {
            started.fetch_add(1, Ordering::Relaxed);
            if item == 3 { Err(format!("item {item} failed")) } else { Ok(item) }
        })
        .unwrap_err();
        assert_eq!(err, (3, "item 3 failed".to_owned()));
        assert_eq!(started.load(Ordering::Relaxed), 4);
    }

    /// A fleet small enough to simulate in a test.
    fn small(extra: &[(&str, &str)]) -> SimConfig {
        let mut overrides =
            pairs(&[("fleet.nodes", "4"), ("fleet.spares", "1"), ("fleet.duration", "6h")]);
        overrides.extend(pairs(extra));
        SimConfig::load(None, &overrides).unwrap()
    }

    #[test]
    fn a_parallel_sweep_reports_what_one_run_at_a_time_does() {
        let configs: Vec<SimConfig> = ["1", "2", "3"]
            .iter()
            .map(|seed| small(&[("fleet.seed", seed), ("failures.rate_per_node_day", "2")]))
            .collect();
        let parallel = sweep_reports(&configs, 3, None).unwrap();
        let one_by_one: Vec<SimReport> =
            configs.iter().map(|config| run::simulate(config, None).unwrap()).collect();
        assert_eq!(parallel, one_by_one);
        let seeds: Vec<u64> = parallel.iter().map(|report| report.setting.seed).collect();
        assert_eq!(seeds, [1, 2, 3]);
        assert!(
            parallel.iter().any(|report| report.failures.node_failures > 0),
            "no failure struck"
        );
    }

    #[test]
    fn a_sweep_with_json_and_plot_runs_end_to_end() {
        let path = std::env::temp_dir().join(format!("fleetmend-cli-{}.svg", std::process::id()));
        let args = parse(&[
            "--nodes",
            "4",
            "--spares",
            "1",
            "--days",
            "0.25",
            "--json",
            "--plot",
            path.to_str().unwrap(),
            "--sweep",
            "job.checkpoint_every=10m,1h",
        ])
        .unwrap();
        simulate_command(&args).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.contains(crate::plot::MODEL_LABEL));
        assert!(svg.contains("job.checkpoint_every (minutes)"));
    }

    fn sweep_points() -> Vec<(String, SimReport)> {
        vec![
            ("10m".to_owned(), report("10m", 0.91, 0.92)),
            ("30m".to_owned(), report("30m", 0.95, 0.96)),
            ("1h".to_owned(), report("1h", 0.95, 0.94)),
        ]
    }

    #[test]
    fn best_is_the_highest_ettr_and_the_first_of_equals() {
        assert_eq!(best(&sweep_points()).unwrap().0, "30m");
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
    fn short_numbers() {
        assert_eq!(short(54.0), "54");
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(1.0 / 3.0), "0.33");
    }
}
