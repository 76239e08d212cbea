//! Scripted chaos scenarios for a local fleet (`fleetmend up --scenario builtin|FILE`): faults
//! written into nodes at given job steps or times, then a summary of how the self-healing loop
//! answered each one (time to detect, to drain, to the job's first step after resume, steps lost,
//! the repair and its outcome) and whether the job's final weights equal an uninterrupted run's.
//!
//! A scenario file is TOML:
//!
//! ```toml
//! name = "xid-79"
//! timeout = "10m"
//!
//! [fleet]            # optional: what the fleet needs (fleetmend up's flags fill in the rest)
//! nodes = 4
//! spares = 1
//! steps = 60
//!
//! [[faults]]
//! at_step = 30       # or `at = "20s"`: since the scenario began
//! node = "rank:1"    # a node's name, "rank:K" (the node of rank K then) or "any-healthy"
//! fault = "gpu-xid:79"
//! persistent = true
//! expect = "replace" # optional: none, alert, drain, reboot, replace, breaker
//! ```

mod reference;
mod run;
mod summary;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::faults::Fault;
use crate::up::{FleetConfig, TrainModel};

pub use self::reference::uninterrupted_hash;
pub use self::run::run;
pub use self::summary::{FaultSummary, Stats, Summary, Target, summarize};

/// The built-in scenario's file, compiled in.
const BUILTIN: &str = include_str!("../scenarios/builtin.toml");

/// What `--scenario builtin` names.
pub const BUILTIN_NAME: &str = "builtin";

/// A chaos scenario: the fleet it needs, the faults in order, and how long it may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// Names the scenario in its output and summary.
    pub name: String,
    /// What it shows, in a sentence.
    pub description: String,
    /// The fleet it needs; what it leaves out comes from `fleetmend up`'s flags.
    pub fleet: FleetSettings,
    /// Longest the scenario may run, from its start to the job's end (faults not due by then are
    /// reported as not injected).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// After the job ended, how long to wait for repairs still under way before summing up.
    #[serde(with = "humantime_serde")]
    pub settle_timeout: Duration,
    /// Run the job's command again, uninterrupted, and compare its weights hash with the job's.
    pub compare_hash: bool,
    /// The faults, injected in this order: each waits for its trigger after the one before it.
    pub faults: Vec<FaultPlan>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            name: "scenario".to_owned(),
            description: String::new(),
            fleet: FleetSettings::default(),
            timeout: Duration::from_secs(15 * 60),
            settle_timeout: Duration::from_secs(90),
            compare_hash: true,
            faults: Vec::new(),
        }
    }
}

/// The fleet a scenario needs (`[fleet]`); each field left out keeps `fleetmend up`'s value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetSettings {
    /// Nodes that run the job (its ranks).
    pub nodes: Option<u32>,
    /// Standby nodes that replace broken ones.
    pub spares: Option<u32>,
    /// The job's training steps.
    pub steps: Option<u64>,
    /// The job's checkpoint interval: a number of steps or `auto`.
    pub checkpoint_every: Option<String>,
    /// The trainer's seed.
    pub seed: Option<u64>,
    /// How long a simulated reboot keeps a node down.
    #[serde(with = "humantime_serde")]
    pub boot_delay: Option<Duration>,
    /// The model the job trains (`default` or `small`).
    pub model: Option<TrainModel>,
    /// Each training step takes at least this long (the trainer's `--pace`).
    #[serde(with = "humantime_serde")]
    pub pace: Option<Duration>,
}

/// One fault of a scenario (`[[faults]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPlan {
    /// Inject once the job runs at this step or later (its step as the queue sees it: the
    /// current attempt's progress, after its first step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_step: Option<u64>,
    /// Inject this long after the scenario began.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub at: Option<Duration>,
    /// Which node: its name, `rank:K` (the node running rank K of the job at that moment) or
    /// `any-healthy` (the lowest-ranked node of the job that is healthy, out of cooldown and not
    /// hit by an earlier fault of the scenario).
    pub node: NodeTarget,
    /// The fault, as `fleetmend inject` names it (`gpu-xid:79`, `nic-down`, ...).
    pub fault: Fault,
    /// The fault survives reboots (a broken part, not a passing event).
    #[serde(default)]
    pub persistent: bool,
    /// What the repairer should do about it; the summary says whether it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Expect>,
}

/// Which node a fault goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum NodeTarget {
    /// A node by name.
    Named(String),
    /// The node running this rank of the job when the fault comes due.
    Rank(u32),
    /// A healthy node of the job with no failing finding, not hit before and out of cooldown
    /// (lowest rank first).
    AnyHealthy,
}

impl FromStr for NodeTarget {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "any-healthy" {
            return Ok(NodeTarget::AnyHealthy);
        }
        if let Some(rank) = text.strip_prefix("rank:") {
            return rank.parse::<u32>().map(NodeTarget::Rank).map_err(|_| {
                format!("{text:?}: the rank must be a number from 0, e.g. \"rank:1\"")
            });
        }
        crate::tree::validate_node_name(text).map_err(|err| format!("{text:?}: {err}"))?;
        Ok(NodeTarget::Named(text.to_owned()))
    }
}

impl TryFrom<String> for NodeTarget {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<NodeTarget> for String {
    fn from(target: NodeTarget) -> String {
        target.to_string()
    }
}

impl fmt::Display for NodeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeTarget::Named(name) => f.write_str(name),
            NodeTarget::Rank(rank) => write!(f, "rank:{rank}"),
            NodeTarget::AnyHealthy => f.write_str("any-healthy"),
        }
    }
}

/// What the repairer is expected to do about a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// Nothing is done: no workflow on the node.
    None,
    /// An alert only: the node keeps working.
    Alert,
    /// Drained, and left drained until its findings clear.
    Drain,
    /// A reboot repairs it: validated and back at work.
    Reboot,
    /// Replaced by a spare (a reboot may be tried first); the spare validated and at work.
    Replace,
    /// The breaker opens: nothing is rebooted or replaced.
    Breaker,
}

impl Expect {
    pub fn as_str(self) -> &'static str {
        match self {
            Expect::None => "none",
            Expect::Alert => "alert",
            Expect::Drain => "drain",
            Expect::Reboot => "reboot",
            Expect::Replace => "replace",
            Expect::Breaker => "breaker",
        }
    }
}

/// A scenario could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("reading the scenario {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the scenario {path} is not a valid scenario: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("the scenario {origin} has {} problem(s): {}", .problems.len(), .problems.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    Invalid { origin: String, problems: Vec<(String, String)> },
    #[error("the scenario {scenario} needs a training job, and the fleet runs none")]
    NoJob { scenario: String },
    #[error("fault {index} ({fault}): {message}")]
    Target { index: usize, fault: String, message: String },
    #[error("fault {index} ({fault}) on {node}: {source}")]
    Inject { index: usize, fault: String, node: String, source: crate::up::FleetError },
    #[error("reading the repairer's event log: {0}")]
    Events(crate::up::FleetError),
    #[error("writing the scenario's output: {0}")]
    Output(#[from] std::io::Error),
    #[error("the uninterrupted reference run of job {job}: {message}")]
    Reference { job: String, message: String },
}

impl Scenario {
    /// The built-in scenario (`local/scenarios/builtin.toml`).
    pub fn builtin() -> Scenario {
        match Scenario::parse(BUILTIN, Path::new("builtin")) {
            Ok(scenario) => scenario,
            // The file is compiled in and covered by a unit test: this cannot be reached.
            Err(err) => {
                tracing::error!(error = %err, "the built-in scenario does not load");
                Scenario::default()
            }
        }
    }

    /// `builtin` or a file's path.
    pub fn load(name_or_path: &str) -> Result<Scenario, ScenarioError> {
        if name_or_path == BUILTIN_NAME {
            return Ok(Scenario::builtin());
        }
        Scenario::from_file(Path::new(name_or_path))
    }

    /// Reads and validates a scenario file.
    pub fn from_file(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ScenarioError::Read { path: path.to_owned(), source })?;
        Scenario::parse(&text, path)
    }

    /// Parses and validates scenario TOML; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = toml::from_str(text).map_err(|err| ScenarioError::Parse {
            path: path.to_owned(),
            message: err.to_string().trim_end().to_owned(),
        })?;
        let problems = scenario.problems();
        if problems.is_empty() {
            Ok(scenario)
        } else {
            Err(ScenarioError::Invalid { origin: path.display().to_string(), problems })
        }
    }

    /// Every problem, naming its field.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: String, message: &str| problems.push((field, message.to_owned()));
        if self.name.trim().is_empty() {
            push("name".to_owned(), "must not be empty");
        }
        if self.timeout.is_zero() {
            push("timeout".to_owned(), "must be greater than zero");
        }
        if self.faults.is_empty() {
            push("faults".to_owned(), "a scenario needs at least one fault");
        }
        if self.fleet.nodes == Some(0) {
            push("fleet.nodes".to_owned(), "must be at least 1");
        }
        if self.fleet.steps == Some(0) {
            push("fleet.steps".to_owned(), "must be at least 1");
        }
        if let Some(every) = &self.fleet.checkpoint_every
            && every != "auto"
            && every.parse::<u64>().map_or(true, |n| n == 0)
        {
            push(
                "fleet.checkpoint_every".to_owned(),
                "must be a number of steps (at least 1) or \"auto\"",
            );
        }
        for (i, plan) in self.faults.iter().enumerate() {
            let field = |name: &str| format!("faults[{i}].{name}");
            match (plan.at_step, plan.at) {
                (None, None) => push(field("at_step"), "give at_step or at: when the fault comes"),
                (Some(_), Some(_)) => push(field("at"), "give at_step or at, not both"),
                _ => {}
            }
            if let (Some(step), Some(steps)) = (plan.at_step, self.fleet.steps)
                && step >= steps
            {
                push(field("at_step"), "must be below fleet.steps: the job ends at its last step");
            }
            if let (NodeTarget::Rank(rank), Some(nodes)) = (&plan.node, self.fleet.nodes)
                && *rank >= nodes
            {
                push(field("node"), "the job has no such rank (ranks count from 0 to nodes - 1)");
            }
            if plan.persistent && plan.fault == Fault::AgentKill {
                push(
                    field("persistent"),
                    "agent-kill cannot be persistent: a reboot starts the agent again",
                );
            } else if plan.persistent && !plan.fault.can_persist() {
                push(
                    field("persistent"),
                    "a job fault (hang, nan) cannot be persistent: a reboot ends the ranks",
                );
            }
        }
        problems
    }

    /// Applies the scenario's `[fleet]` settings to a fleet's config (what it leaves out stays).
    pub fn configure(&self, config: &mut FleetConfig) {
        let fleet = &self.fleet;
        if let Some(nodes) = fleet.nodes {
            config.nodes = nodes;
        }
        if let Some(spares) = fleet.spares {
            config.spares = spares;
        }
        if let Some(steps) = fleet.steps {
            config.steps = steps;
        }
        if let Some(every) = &fleet.checkpoint_every {
            config.checkpoint_every.clone_from(every);
        }
        if let Some(seed) = fleet.seed {
            config.seed = seed;
        }
        if let Some(delay) = fleet.boot_delay {
            config.boot_delay = delay;
        }
        if let Some(model) = fleet.model {
            config.model = model;
        }
        if let Some(pace) = fleet.pace {
            config.pace = pace;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_loads_and_is_the_issue_s_scenario() {
        let scenario = Scenario::parse(BUILTIN, Path::new("builtin")).unwrap();
        assert_eq!(scenario, Scenario::builtin());
        assert_eq!(scenario.name, "builtin");
        assert_eq!((scenario.fleet.nodes, scenario.fleet.spares), (Some(4), Some(2)));
        let first = &scenario.faults[0];
        assert_eq!(first.fault, Fault::GpuXid(79));
        assert_eq!(first.node, NodeTarget::Rank(1));
        assert!(first.persistent);
        assert_eq!(first.at_step, Some(30));
        assert_eq!(first.expect, Some(Expect::Replace));
        let second = &scenario.faults[1];
        assert_eq!(second.fault, Fault::GpuXid(48));
        assert!(!second.persistent);
        assert_eq!(second.expect, Some(Expect::Reboot));
        assert!(Scenario::load("builtin").is_ok());
    }

    #[test]
    fn an_unknown_field_is_named() {
        let text = "name = \"x\"\n[[faults]]\nat_step = 3\nnode = \"node-1\"\nfault = \"nic-down\"\nwhen = 4\n";
        let err = Scenario::parse(text, Path::new("x.toml")).unwrap_err().to_string();
        assert!(err.contains("x.toml"), "{err}");
        assert!(err.contains("unknown field `when`"), "{err}");
        let text = "name = \"x\"\nfleet.gpus = 3\n";
        let err = Scenario::parse(text, Path::new("x.toml")).unwrap_err().to_string();
        assert!(err.contains("unknown field `gpus`"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let text =
            "name = \"x\"\n[[faults]]\nat_step = 3\nnode = \"rank:one\"\nfault = \"nic-down\"\n";
        let err = Scenario::parse(text, Path::new("x.toml")).unwrap_err().to_string();
        assert!(err.contains("rank:one"), "{err}");
        let text =
            "name = \"x\"\n[[faults]]\nat = \"soon\"\nnode = \"node-1\"\nfault = \"nic-down\"\n";
        let err = Scenario::parse(text, Path::new("x.toml")).unwrap_err().to_string();
        assert!(err.contains("at"), "{err}");
        let text =
            "name = \"x\"\n[[faults]]\nat_step = 3\nnode = \"node-1\"\nfault = \"gpu-xid\"\n";
        let err = Scenario::parse(text, Path::new("x.toml")).unwrap_err().to_string();
        assert!(err.contains("gpu-xid needs a code"), "{err}");
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let text = "name = \"x\"\ntimeout = \"0s\"\n[fleet]\nnodes = 2\nsteps = 10\ncheckpoint_every = \"often\"\n\
                    [[faults]]\nnode = \"rank:2\"\nfault = \"agent-kill\"\npersistent = true\n\
                    [[faults]]\nat_step = 10\nat = \"1s\"\nnode = \"any-healthy\"\nfault = \"nic-down\"\n";
        let err = Scenario::parse(text, Path::new("x.toml")).unwrap_err();
        let ScenarioError::Invalid { problems, .. } = err else { panic!("{err}") };
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "timeout",
                "fleet.checkpoint_every",
                "faults[0].at_step",
                "faults[0].node",
                "faults[0].persistent",
                "faults[1].at",
                "faults[1].at_step",
            ]
        );
        let empty = Scenario::parse("name = \"x\"\n", Path::new("x.toml")).unwrap_err();
        assert!(empty.to_string().contains("faults: a scenario needs at least one fault"));
    }

    #[test]
    fn the_fleet_settings_apply_to_a_fleet_config() {
        let mut config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        config.steps = 300;
        config.seed = 5;
        Scenario::builtin().configure(&mut config);
        assert_eq!((config.nodes, config.spares, config.steps), (4, 2, 100));
        assert_eq!(config.checkpoint_every, "10");
        assert_eq!(config.seed, 5, "left out: fleetmend up's value stays");
    }

    #[test]
    fn targets_parse_and_print_back() {
        for text in ["node-3", "rank:0", "any-healthy"] {
            assert_eq!(text.parse::<NodeTarget>().unwrap().to_string(), text);
        }
        assert!("rank:-1".parse::<NodeTarget>().is_err());
        assert!("../x".parse::<NodeTarget>().is_err());
    }
}
