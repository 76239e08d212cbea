//! `fleetmend simulate`'s settings: the fleet, the job(s), the failures and the repairer's own
//! `[policy]`, `[engine]` and `[queue]`, as one TOML document. Every table and field is optional
//! (the defaults reproduce Llama 3 405B pre-training: 2,048 nodes × 8 GPUs, 54 days); unknown
//! fields are refused and every problem is named by its field. `--sweep KEY=V1,V2` and the flags
//! set fields of the same document by their dotted path ([`SimConfig::with_overrides`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fleetmend_agent::config::ConfigProblems;
use fleetmend_local::faults::Fault;
use fleetmend_repairer::config::RepairerConfig;
use fleetmend_repairer::engine::EngineConfig;
use fleetmend_repairer::policy::Policy;
use fleetmend_repairer::queue::QueueConfig;
use serde::{Deserialize, Deserializer, Serialize};

use crate::catalog::{CatalogError, FaultCatalog};
use crate::failures::{CorrelatedFailures, FailureConfig, InterFailure, Lemons};
use crate::noise::NoiseConfig;
use crate::recorded::Replay;

const DAY: Duration = Duration::from_secs(86_400);

/// Everything one simulation runs with.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    pub fleet: FleetConfig,
    pub job: JobConfig,
    pub failures: FailuresConfig,
    /// Faults at given times, besides the random ones (the breaker scenario, a drill).
    #[serde(rename = "event")]
    pub events: Vec<ScriptedFault>,
    /// A fault catalog file instead of the built-in Llama 3 table.
    pub catalog: Option<PathBuf>,
    pub repairer: RepairerSettings,
    /// Benign noise on every node (`--noise`).
    pub noise: NoiseConfig,
    /// A recorded failure history struck instead of the random failures (`--replay`; not a
    /// setting of the document: [`crate::inputs`] sets it).
    #[serde(skip)]
    pub replay: Option<Arc<Replay>>,
}

/// The simulated fleet.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// How long the simulated run lasts.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Nodes left out of the job(s): they take a failed node's place at once.
    pub spares: u32,
    pub seed: u64,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig { nodes: 2048, gpus_per_node: 8, duration: DAY * 54, spares: 16, seed: 1 }
    }
}

/// How often a job checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    Every(Duration),
    /// The queue's Young/Daly interval from the measured write time and observed MTBF.
    Auto,
}

impl<'de> Deserialize<'de> for Interval {
    fn deserialize<D: Deserializer<'de>>(from: D) -> Result<Interval, D::Error> {
        let text = String::deserialize(from)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Interval {
    type Err = String;

    fn from_str(text: &str) -> Result<Interval, String> {
        if text == "auto" {
            return Ok(Interval::Auto);
        }
        humantime::parse_duration(text)
            .map(Interval::Every)
            .map_err(|err| format!("{text:?} is neither `auto` nor a duration: {err}"))
    }
}

impl std::fmt::Display for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Interval::Every(every) => write!(f, "{}", humantime::format_duration(*every)),
            Interval::Auto => f.write_str("auto"),
        }
    }
}

/// The simulated training job(s), which follow the checkpoint protocol.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    /// How many jobs share the fleet less its spares (equal shares).
    pub jobs: u32,
    pub checkpoint_every: Interval,
    /// How long the job stops to write one checkpoint (w).
    #[serde(with = "humantime_serde")]
    pub checkpoint_write: Duration,
    /// From every rank running to the first step: rendezvous and loading the checkpoint (u0).
    #[serde(with = "humantime_serde")]
    pub restart: Duration,
    /// One training step.
    #[serde(with = "humantime_serde")]
    pub step_time: Duration,
    /// How often rank 0 posts its progress between checkpoints.
    #[serde(with = "humantime_serde")]
    pub progress_every: Duration,
    /// Whether the job writes a checkpoint when asked to before a drain (the protocol's SIGUSR1);
    /// false: it is killed with what it last wrote (the closed-form model's assumption).
    pub checkpoint_on_signal: bool,
    /// Whether every fault kills the job where it strikes (the closed-form model's assumption);
    /// false: as the catalog says (`kills_job`).
    pub every_fault_kills: bool,
    /// How the job's ranks are scheduled: `gang`, each attempt's ranks moved as one (fast: what
    /// a restart costs in time, not one event per rank), or `queue`, the repairer's embedded job
    /// queue moving every rank through its node's agent (slow at scale; the check on `gang`).
    pub scheduler: SchedulerModel,
}

/// How the simulated job's ranks are scheduled (`job.scheduler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerModel {
    /// Each attempt's ranks as one gang (`crate::gang`).
    #[default]
    Gang,
    /// The repairer's embedded job queue, rank by rank.
    Queue,
}

impl std::fmt::Display for SchedulerModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SchedulerModel::Gang => "gang",
            SchedulerModel::Queue => "queue",
        })
    }
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            jobs: 1,
            checkpoint_every: Interval::Every(Duration::from_secs(30 * 60)),
            checkpoint_write: Duration::from_secs(60),
            restart: Duration::from_secs(5 * 60),
            step_time: Duration::from_secs(10),
            progress_every: Duration::from_secs(30 * 60),
            checkpoint_on_signal: true,
            every_fault_kills: false,
            scheduler: SchedulerModel::Gang,
        }
    }
}

/// How nodes fail.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailuresConfig {
    /// Failures per node per day; default: the catalog's (419 / (2,048 × 54) for Llama 3).
    pub rate_per_node_day: Option<f64>,
    /// Weibull shape of the time between failures; none: exponential.
    pub weibull_shape: Option<f64>,
    pub lemons: Lemons,
    pub correlated: CorrelatedFailures,
    /// The share of repairs that report success without fixing the node, 0 to 1.
    pub silent_repair_rate: f64,
}

impl Default for FailuresConfig {
    fn default() -> Self {
        FailuresConfig {
            rate_per_node_day: None,
            weibull_shape: None,
            lemons: Lemons::default(),
            correlated: CorrelatedFailures::default(),
            silent_repair_rate: 0.02,
        }
    }
}

/// One scripted fault: `nodes` nodes (or a `fraction` of the fleet), from node 0 up, at `at`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedFault {
    #[serde(with = "humantime_serde")]
    pub at: Duration,
    #[serde(default)]
    pub nodes: Option<u32>,
    #[serde(default)]
    pub fraction: Option<f64>,
    /// A catalog category (`faulty-gpu`) ...
    #[serde(default)]
    pub category: Option<String>,
    /// ... or a `fleetmend inject` fault (`gpu-xid:79`): the first category with that fault.
    #[serde(default)]
    pub fault: Option<String>,
}

/// The repairer's own settings, as in its config file. A `[repairer.*]` table the settings give
/// is laid over these defaults key by key (`from_table`), so setting `repairer.queue.tick` keeps
/// the simulator's `hang_floor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RepairerSettings {
    pub policy: Policy,
    pub engine: EngineConfig,
    pub queue: QueueConfig,
}

impl Default for RepairerSettings {
    fn default() -> Self {
        let mut engine = EngineConfig::default();
        // A replacement joins when the catalog says (2 days for a part); the repairer waits for
        // it rather than giving up after the default hour.
        engine.workflow.replace_timeout = DAY * 3;
        // The simulated job posts its progress every `job.progress_every` (30 min) without
        // heartbeats, and no fault of the catalog hangs it: the queue would take the gap between
        // two posts for a hang. `--set repairer.queue.hang_floor=...` turns it back on.
        let queue = QueueConfig { hang_floor: Duration::ZERO, ..QueueConfig::default() };
        RepairerSettings { policy: Policy::default(), engine, queue }
    }
}

impl RepairerSettings {
    /// A repairer config's `[policy]`, `[engine]` and `[queue]` (`--repairer-config`), keeping the
    /// simulator's own choices where they stand for its world rather than for the repairer: a
    /// replacement may take as long as the catalog's (the file's `replace_timeout` or the
    /// simulator's 3 days, whichever is longer), and the simulated job's 30-minute progress posts
    /// are no hang (`hang_floor` 0). `--set repairer....` still sets either.
    pub fn from_repairer(config: &RepairerConfig) -> RepairerSettings {
        let own = RepairerSettings::default();
        let mut engine = config.engine.clone();
        let timeouts = &mut engine.workflow;
        timeouts.replace_timeout =
            timeouts.replace_timeout.max(own.engine.workflow.replace_timeout);
        let queue = QueueConfig { hang_floor: own.queue.hang_floor, ..config.queue.clone() };
        RepairerSettings { policy: config.policy.clone(), engine, queue }
    }
}

/// The settings could not be read or are not valid.
#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: {}", render(.problems))]
    Invalid { origin: String, problems: ConfigProblems },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

fn render(problems: &ConfigProblems) -> String {
    let parts: Vec<String> =
        problems.iter().map(|p| format!("{}: {}", p.field, p.message)).collect();
    parts.join("; ")
}

impl SimConfig {
    /// Reads `path` (none: the defaults) and sets `overrides` (dotted path, value) on it.
    pub fn load(
        path: Option<&Path>,
        overrides: &[(String, String)],
    ) -> Result<SimConfig, SimConfigError> {
        let (document, origin) = SimConfig::read_document(path)?;
        SimConfig::from_table(document, overrides, &origin)
    }

    /// The settings file as a TOML table (none: an empty one), and its name for errors.
    pub fn read_document(path: Option<&Path>) -> Result<(toml::Table, String), SimConfigError> {
        let (text, origin) = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| SimConfigError::Read { path: path.to_owned(), source })?;
                (text, path.display().to_string())
            }
            None => (String::new(), "the default settings".to_owned()),
        };
        let document: toml::Table = toml::from_str(&text).map_err(|err| SimConfigError::Parse {
            origin: origin.clone(),
            message: err.to_string(),
        })?;
        Ok((document, origin))
    }

    /// The settings of `document` with `overrides` set.
    pub fn from_table(
        document: toml::Table,
        overrides: &[(String, String)],
        origin: &str,
    ) -> Result<SimConfig, SimConfigError> {
        SimConfig::from_table_over(document, overrides, origin, &RepairerSettings::default())
    }

    /// The settings of `document` with `overrides` set, its `[repairer.*]` tables laid over
    /// `repairer` (the simulator's defaults, or a repairer config's settings) key by key.
    pub fn from_table_over(
        document: toml::Table,
        overrides: &[(String, String)],
        origin: &str,
        repairer: &RepairerSettings,
    ) -> Result<SimConfig, SimConfigError> {
        let mut document = with_repairer_base(document, repairer)
            .map_err(|message| SimConfigError::Parse { origin: origin.to_owned(), message })?;
        for (key, value) in overrides {
            set_path(&mut document, key, value)
                .map_err(|message| SimConfigError::Parse { origin: origin.to_owned(), message })?;
        }
        let config: SimConfig =
            toml::Value::Table(document).try_into().map_err(|err: toml::de::Error| {
                SimConfigError::Parse { origin: origin.to_owned(), message: err.to_string() }
            })?;
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(SimConfigError::Invalid { origin: origin.to_owned(), problems });
        }
        Ok(config)
    }

    /// The fault catalog: the file named, or the built-in one.
    pub fn catalog(&self) -> Result<FaultCatalog, SimConfigError> {
        match &self.catalog {
            None => Ok(FaultCatalog::builtin()?),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| SimConfigError::Read { path: path.clone(), source })?;
                Ok(FaultCatalog::parse(&text, &path.display().to_string())?)
            }
        }
    }

    /// How the failure stream is drawn, for `catalog`.
    pub fn failure_config(&self, catalog: &FaultCatalog) -> FailureConfig {
        let mut config = FailureConfig::from_catalog(catalog);
        config.nodes = self.fleet.nodes;
        config.lemons = self.failures.lemons;
        config.correlated = self.failures.correlated.clone();
        let per_node_day =
            self.failures.rate_per_node_day.unwrap_or_else(|| catalog.rate_per_node_day());
        let lemons = self.failures.lemons;
        let base = per_node_day / (1.0 - lemons.fraction + lemons.fraction * lemons.factor);
        let mean_seconds = if base > 0.0 { DAY.as_secs_f64() / base } else { f64::MAX };
        let mean = Duration::try_from_secs_f64(mean_seconds).unwrap_or(Duration::MAX);
        config.inter_failure = match self.failures.weibull_shape {
            None => InterFailure::Exponential { mean },
            Some(shape) => {
                let scale = mean_seconds / crate::failures::gamma(1.0 + 1.0 / shape);
                InterFailure::Weibull {
                    shape,
                    scale: Duration::try_from_secs_f64(scale).unwrap_or(Duration::MAX),
                }
            }
        };
        config
    }

    /// The scripted fault's catalog category index, or why there is none.
    pub fn scripted_category(
        fault: &ScriptedFault,
        catalog: &FaultCatalog,
    ) -> Result<usize, String> {
        match (&fault.category, &fault.fault) {
            (Some(name), None) => {
                catalog.index_of(name).ok_or_else(|| format!("no category {name:?} in the catalog"))
            }
            (None, Some(name)) => {
                let wanted: Fault = name.parse().map_err(|err| format!("{err}"))?;
                catalog
                    .categories
                    .iter()
                    .position(|c| c.fault.as_ref() == Some(&wanted))
                    .ok_or_else(|| format!("no catalog category has fault {name:?}"))
            }
            _ => Err("set either category or fault".to_owned()),
        }
    }

    /// Every problem, named by its field.
    pub fn problems(&self) -> ConfigProblems {
        let mut problems = ConfigProblems::default();
        let fleet = &self.fleet;
        if fleet.nodes == 0 {
            problems.push("fleet.nodes", "must be greater than zero");
        }
        if fleet.gpus_per_node == 0 {
            problems.push("fleet.gpus_per_node", "must be greater than zero");
        }
        if fleet.duration.is_zero() {
            problems.push("fleet.duration", "must be greater than zero");
        }
        if fleet.spares >= fleet.nodes {
            problems
                .push("fleet.spares", format!("must be fewer than fleet.nodes ({})", fleet.nodes));
        }
        let job = &self.job;
        let job_nodes = fleet.nodes.saturating_sub(fleet.spares);
        if job.jobs == 0 || job.jobs > job_nodes.max(1) {
            problems
                .push("job.jobs", format!("must be 1 to the nodes less the spares ({job_nodes})"));
        }
        if job.checkpoint_every == Interval::Every(Duration::ZERO) {
            problems.push("job.checkpoint_every", "must be greater than zero (or auto)");
        }
        for (field, value) in
            [("job.step_time", job.step_time), ("job.progress_every", job.progress_every)]
        {
            if value < Duration::from_millis(1) {
                problems.push(field, "must be at least 1ms");
            }
        }
        let failures = &self.failures;
        if let Some(rate) = failures.rate_per_node_day
            && !(rate.is_finite() && rate >= 0.0)
        {
            problems
                .push("failures.rate_per_node_day", format!("{rate} is not a rate of at least 0"));
        }
        if let Some(shape) = failures.weibull_shape
            && !(shape.is_finite() && shape > 0.0)
        {
            problems.push("failures.weibull_shape", format!("{shape} is not above 0"));
        }
        if !(0.0..=1.0).contains(&failures.silent_repair_rate) {
            problems.push("failures.silent_repair_rate", "must be 0 to 1");
        }
        for (i, fault) in self.events.iter().enumerate() {
            let field = format!("event[{i}]");
            match (fault.nodes, fault.fraction) {
                (Some(_), None) => {}
                (None, Some(f)) if f > 0.0 && f <= 1.0 => {}
                (None, Some(f)) => problems
                    .push(format!("{field}.fraction"), format!("{f} is not above 0 and at most 1")),
                _ => problems.push(&field, "set either nodes or fraction"),
            }
            if fault.at >= fleet.duration {
                problems.push(format!("{field}.at"), "is not within fleet.duration");
            }
        }
        self.noise.problems("noise", &mut problems);
        for (field, message) in self.repairer.queue.problems("repairer.queue") {
            problems.push(&field, message);
        }
        for (field, message) in self.repairer.policy.problems("repairer.policy") {
            problems.push(&field, message);
        }
        let engine = &self.repairer.engine;
        if engine.report_interval.is_zero() {
            problems.push("repairer.engine.report_interval", "must be greater than zero");
        }
        if engine.tick.is_zero() {
            problems.push("repairer.engine.tick", "must be greater than zero");
        }
        if engine.unreachable_after == 0 {
            problems.push("repairer.engine.unreachable_after", "must be at least 1");
        }
        problems
    }
}

/// `document` laid over `repairer`'s settings: a key it gives replaces the base's, a table it
/// gives is laid over the base's table.
fn with_repairer_base(
    document: toml::Table,
    repairer: &RepairerSettings,
) -> Result<toml::Table, String> {
    let defaults =
        toml::Table::try_from(repairer).map_err(|err| format!("the repairer's settings: {err}"))?;
    let mut base = toml::Table::new();
    base.insert("repairer".to_owned(), toml::Value::Table(defaults));
    lay_over(&mut base, document);
    Ok(base)
}

fn lay_over(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above)) => lay_over(below, above),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Sets `key` (a dotted path: `job.checkpoint_every`) in `document` to `value`, read as a TOML
/// value (`16`, `0.5`, `true`) or else as a string (`30m`).
pub fn set_path(document: &mut toml::Table, key: &str, value: &str) -> Result<(), String> {
    let parsed: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(last) = parts.pop().filter(|p| !p.is_empty()) else {
        return Err(format!("{key:?} is not a setting's dotted path"));
    };
    let mut table = document;
    for part in parts {
        let entry =
            table.entry(part.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| format!("{key}: {part} is not a table"))?;
    }
    table.insert(last.to_owned(), parsed);
    Ok(())
}
