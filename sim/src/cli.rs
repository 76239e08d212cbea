//! `fleetmend simulate`: the flags as setting overrides; one run, a sweep of one setting or a
//! grid of two, each setting under one seed or several, all run in parallel ([`grid`],
//! [`runner`]); and their output ([`output`]): the text summary or table, or deterministic JSON,
//! on stdout, an SVG chart, a progress bar and the wall-clock figures on stderr (never in the
//! JSON, which is the same bytes for the same inputs).

mod grid;
mod output;
mod runner;

use std::collections::BTreeSet;
use std::io::Write;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use self::grid::{Plan, Swept};
use self::output::WallClock;
use crate::inputs::{InputError, OwnInputs};
use crate::plot::PlotError;
use crate::replay::{self, ReplayReport};
use crate::replications::ReplicationsError;
use crate::run::SimError;

/// Exit status for bad flags or settings.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for a simulation (or its output) that failed.
const EXIT_RUN_FAILED: u8 = 1;
const SECONDS_PER_DAY: f64 = 86_400.0;

/// `fleetmend simulate`'s flags. Each sets a field of the settings by its dotted path, in the
/// order listed here, then `--set`, then the swept keys; `--seeds N` then runs each setting under
/// the seed they give and the N - 1 after it.
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
    /// Benign noise on every node (application Xids, OOM kills, link flaps, planned reboots,
    /// agent restarts, a rolling driver upgrade; `noise.enabled`, rates under `noise.*`), and the
    /// repairer's actions on healthy nodes counted; with `failures.rate_per_node_day=0`, a
    /// healthy fleet.
    #[arg(long)]
    pub noise: bool,
    /// Any setting by its dotted path, e.g. `failures.rate_per_node_day=0.01` (repeatable; after
    /// the flags above).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    pub set: Vec<(String, String)>,
    /// The report as JSON instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Draw ETTR to this SVG file: with --sweep against the swept value (with two, a line per
    /// value of the second against the first), else the closed-form model against the
    /// checkpoint interval with this run marked; with --seeds, ± the 95 % interval.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Run once per value of one setting, in parallel, e.g. `job.checkpoint_every=10m,30m,1h`;
    /// given twice, once per combination of two settings' values (a grid).
    #[arg(long, value_name = "KEY=V1,V2,...", value_parser = parse_sweep)]
    pub sweep: Vec<Sweep>,
    /// Run each setting under N seeds (`fleet.seed`, `fleet.seed`+1, ...), in parallel, and
    /// report the mean ETTR with its 95 % confidence interval (Student's t) and the mean figures.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_seeds)]
    pub seeds: NonZeroU32,
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
    #[error("--sweep: at most two settings (a grid), got {}: {}", .keys.len(), .keys.join(", "))]
    TooManySweeps { keys: Vec<String> },
    #[error("--sweep {key} is given twice: list all its values in one --sweep")]
    SweptTwice { key: String },
    #[error(
        "--seeds {seeds} from fleet.seed {first}: the seeds would pass 2^63 - 1, the highest fleet.seed takes"
    )]
    SeedsPastTheLast { first: u64, seeds: NonZeroU32 },
    #[error(transparent)]
    Settings(Box<InputError>),
    #[error("settings with {}: {source}", sweep_flags(.point))]
    SweepSettings { point: Vec<(String, String)>, source: Box<InputError> },
    #[error("simulation{}: {source}", point_name(.point))]
    Run { point: Vec<(String, String)>, source: SimError },
    #[error(transparent)]
    Replications(#[from] ReplicationsError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error("writing the report as JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("writing to stdout: {0}")]
    Stdout(#[source] std::io::Error),
}

/// ` of KEY=VALUE, KEY=VALUE`: a run's swept values (and seed); nothing for none.
fn point_name(point: &[(String, String)]) -> String {
    if point.is_empty() {
        return String::new();
    }
    let settings: Vec<String> = point.iter().map(|(key, value)| format!("{key}={value}")).collect();
    format!(" of {}", settings.join(", "))
}

/// `--sweep KEY=VALUE --sweep KEY=VALUE`: the flags that set a combination's values.
fn sweep_flags(point: &[(String, String)]) -> String {
    let flags: Vec<String> =
        point.iter().map(|(key, value)| format!("--sweep {key}={value}")).collect();
    flags.join(" ")
}

impl SimulateError {
    /// 2 for bad flags or settings (settings problems the run itself found included), 1 for a run
    /// or output that failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            SimulateError::PlotFile { .. }
            | SimulateError::TooManySweeps { .. }
            | SimulateError::SweptTwice { .. }
            | SimulateError::SeedsPastTheLast { .. }
            | SimulateError::Settings(_)
            | SimulateError::SweepSettings { .. } => EXIT_BAD_INPUT,
            SimulateError::Run { source, .. } => match source {
                SimError::Config(_) | SimError::Failures(_) => EXIT_BAD_INPUT,
                _ => EXIT_RUN_FAILED,
            },
            SimulateError::Replications(_)
            | SimulateError::Plot(_)
            | SimulateError::Json(_)
            | SimulateError::Stdout(_) => EXIT_RUN_FAILED,
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
    let plan = Plan { swept: Swept::of(&args.sweep)?, seeds: args.seeds };
    let configs = plan.configs(args.config.as_deref(), own_inputs(args), &overrides(args))?;
    if let [config] = configs.as_slice()
        && config.replay.is_some()
    {
        return replayed(args, config);
    }
    let threads = runner::threads_for(configs.len());
    let bar = runner::progress_bar(configs.len());
    let started = Instant::now();
    let results = plan.run(&configs, threads, bar.as_ref());
    if let Some(feed) = &bar {
        feed.finish();
    }
    let (points, events) = results?;
    let wall = WallClock { seconds: started.elapsed().as_secs_f64(), threads, events };
    print(&output::render(plan.swept, &points, args.json)?)?;
    if let Some(path) = &args.plot {
        output::chart(path, plan.swept, &points)?;
    }
    eprintln!("{}", output::wall_clock_line(plan.swept, &points, &wall));
    Ok(())
}

/// The operator's own inputs the flags name.
fn own_inputs(args: &SimulateArgs) -> OwnInputs<'_> {
    OwnInputs {
        repairer_config: args.repairer_config.as_deref(),
        inventory: args.inventory.as_deref(),
        replay: args.replay.as_deref(),
    }
}

/// One replay of a recorded history: the summary (or JSON) with the recorded and replayed
/// decisions per node, the chart. A sweep or several seeds of a replay report their ETTRs only.
fn replayed(args: &SimulateArgs, config: &crate::config::SimConfig) -> Result<(), SimulateError> {
    let bar = runner::progress_bar(1);
    let started = Instant::now();
    let result = match &bar {
        Some(feed) => replay::simulate(config, Some(&|share| feed.advance(0, share))),
        None => replay::simulate(config, None),
    };
    if let Some(feed) = &bar {
        feed.finish();
    }
    let (report, replayed) =
        result.map_err(|source| SimulateError::Run { point: Vec::new(), source })?;
    let text = match (&replayed, args.json) {
        (Some(replay), true) => output::json(&ReplayReport { report: &report, replay })?,
        (Some(replay), false) => report.summary() + &replay.summary(),
        (None, true) => output::json(&report)?,
        (None, false) => report.summary(),
    };
    print(&text)?;
    if let Some(path) = &args.plot {
        crate::plot::single_chart(path, &report)?;
    }
    let wall = started.elapsed().as_secs_f64();
    eprintln!(
        "replayed {} days of {} nodes in {wall:.1} s wall: {} events",
        output::short(report.setting.days),
        report.setting.nodes,
        report.sim_events
    );
    Ok(())
}

fn print(text: &str) -> Result<(), SimulateError> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).map_err(SimulateError::Stdout)
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
    set("noise.enabled", args.noise.then(|| "true".to_owned()));
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

/// `--seeds N`: how many seeds to run each setting under, at least one.
pub fn parse_seeds(text: &str) -> Result<NonZeroU32, String> {
    let seeds: u32 = text
        .trim()
        .parse()
        .map_err(|_| "not a number of seeds (a whole number, e.g. 5)".to_owned())?;
    NonZeroU32::new(seeds).ok_or_else(|| "must be at least 1 (the runs of each setting)".to_owned())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::Path;

    use clap::Parser;

    use super::*;
    use crate::config::SimConfig;

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
            point: vec![("fleet.nodes".into(), "64".into())],
            source: SimError::Repairer("the clock stopped".into()),
        };
        assert_eq!(failed.exit_code(), EXIT_RUN_FAILED);
        assert_eq!(
            failed.to_string(),
            "simulation of fleet.nodes=64: building the repairer: the clock stopped"
        );
        let config =
            SimConfig::load(Some(Path::new("/nonexistent/fleetmend-sim.toml")), &[]).unwrap_err();
        let settings = SimulateError::Run { point: Vec::new(), source: SimError::Config(config) };
        assert_eq!(settings.exit_code(), EXIT_BAD_INPUT);
    }

    #[test]
    fn a_sweep_with_json_and_plot_runs_end_to_end() {
        let svg = chart_of("sweep", &["--sweep", "job.checkpoint_every=10m,1h"]);
        assert!(svg.contains(crate::plot::MODEL_LABEL));
        assert!(svg.contains("job.checkpoint_every (minutes)"));
    }

    #[test]
    fn seeds_are_one_unless_asked_and_at_least_one() {
        assert_eq!(parse(&[]).unwrap().seeds.get(), 1);
        assert_eq!(parse(&["--seeds", "5"]).unwrap().seeds.get(), 5);
        for (seeds, wanted) in [
            ("0", "must be at least 1"),
            ("-2", "not a number of seeds"),
            ("2.5", "not a number of seeds"),
            ("many", "not a number of seeds"),
        ] {
            let err = parse_seeds(seeds).unwrap_err();
            assert!(err.contains(wanted), "{seeds}: {err}");
        }
        let err = parse(&["--seeds", "0"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let message = err.to_string();
        assert!(message.contains("--seeds") && message.contains("at least 1"), "{message}");
    }

    #[test]
    fn sweep_repeats_in_order() {
        let args = parse(&[
            "--sweep",
            "repairer.policy.guard_rails.max_concurrent_repairs=8,32",
            "--sweep",
            "job.checkpoint_every=15m,30m",
        ])
        .unwrap();
        let keys: Vec<&str> = args.sweep.iter().map(|sweep| sweep.key.as_str()).collect();
        assert_eq!(
            keys,
            ["repairer.policy.guard_rails.max_concurrent_repairs", "job.checkpoint_every"]
        );
        assert!(parse(&[]).unwrap().sweep.is_empty());
    }

    #[test]
    fn a_third_sweep_or_a_key_swept_twice_is_refused_before_any_run() {
        let args = parse(&[
            "--sweep",
            "fleet.spares=1",
            "--sweep",
            "fleet.nodes=8",
            "--sweep",
            "fleet.seed=1,2",
        ])
        .unwrap();
        let err = simulate_command(&args).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_BAD_INPUT);
        assert!(
            err.to_string().starts_with("--sweep: at most two settings (a grid), got 3"),
            "{err}"
        );
        let args = parse(&["--sweep", "fleet.spares=1", "--sweep", "fleet.spares=2"]).unwrap();
        let err = simulate_command(&args).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_BAD_INPUT);
        assert!(err.to_string().contains("fleet.spares is given twice"), "{err}");
    }

    #[test]
    fn a_run_that_fails_names_its_swept_values_and_seed() {
        let failed = SimulateError::Run {
            point: vec![
                ("fleet.spares".into(), "1".into()),
                ("job.checkpoint_every".into(), "1h".into()),
                ("fleet.seed".into(), "3".into()),
            ],
            source: SimError::Repairer("the clock stopped".into()),
        };
        assert_eq!(
            failed.to_string(),
            "simulation of fleet.spares=1, job.checkpoint_every=1h, fleet.seed=3: \
             building the repairer: the clock stopped"
        );
    }

    /// The SVG `flags` draw, with the flags of a small fleet before them.
    fn chart_of(name: &str, flags: &[&str]) -> String {
        let path =
            std::env::temp_dir().join(format!("fleetmend-cli-{}-{name}.svg", std::process::id()));
        let mut all = vec!["--nodes", "4", "--spares", "1", "--days", "0.25", "--json", "--plot"];
        all.push(path.to_str().unwrap());
        all.extend(flags);
        simulate_command(&parse(&all).unwrap()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        svg
    }

    #[test]
    fn a_grid_with_seeds_and_a_plot_runs_end_to_end() {
        let svg = chart_of(
            "grid",
            &[
                "--seeds",
                "2",
                "--sweep",
                "job.checkpoint_every=10m,1h",
                "--sweep",
                "fleet.spares=0,1",
            ],
        );
        assert!(svg.contains("fleet.spares=0") && svg.contains("fleet.spares=1"), "{svg}");
        assert!(svg.contains("job.checkpoint_every (minutes)"), "{svg}");
    }

    #[test]
    fn seeds_with_a_plot_mark_the_mean_on_the_model() {
        let svg = chart_of("seeds", &["--seeds", "3"]);
        assert!(svg.contains("simulated, 3 seeds (ETTR "), "{svg}");
        assert!(svg.contains(crate::plot::MODEL_LABEL));
    }
}
