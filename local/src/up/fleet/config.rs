//! How a local fleet is built: its settings ([`FleetConfig`]), checked all at once, and who runs
//! its job ([`FleetScheduler`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fleetmend_repairer::alerts::SinkConfig;

use super::Mode;
use crate::tree::STATE_DIR_ENV;
use crate::up::trainer::TrainModel;

/// How a local fleet is built.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    /// Everything the fleet writes: node trees, the store, tokens, checkpoints, `fleet.json`.
    pub state_dir: PathBuf,
    /// Nodes that run the job.
    pub nodes: u32,
    /// Standby nodes that replace broken ones.
    pub spares: u32,
    /// Submit the training job (off: a fleet with no job, for tests of the nodes alone).
    pub job: bool,
    /// The job's training steps.
    pub steps: u64,
    /// The job's checkpoint interval in steps, or `auto`.
    pub checkpoint_every: String,
    /// The trainer's seed.
    pub seed: u64,
    /// Restarts the job may use before it fails.
    pub max_restarts: u32,
    /// The repairer's listen address (default: a free loopback port).
    pub listen: Option<SocketAddr>,
    /// Start from an empty state directory (a previous fleet's state is removed).
    pub fresh: bool,
    /// The agents' report interval.
    pub report_interval: Duration,
    /// How long a simulated reboot keeps the node down after its tree is rebuilt.
    pub boot_delay: Duration,
    /// When an agent stops, its ranks' grace between SIGTERM and SIGKILL.
    pub rank_stop_grace: Duration,
    /// The job's collective timeout (the trainer's `--collective-timeout`).
    pub collective_timeout: Duration,
    /// Longest wait for every agent's first report at start.
    pub join_timeout: Duration,
    /// The model the job trains.
    pub model: TrainModel,
    /// Each training step takes at least this long (zero: as long as its compute).
    pub pace: Duration,
    /// The `fleetmend` executable the agents and the trainer run as.
    pub exe: PathBuf,
    /// How the repairer acts on its decisions (dry-run: it acts on nothing, for tests that drive
    /// the provider by hand).
    pub mode: Mode,
    /// Alert sinks of the repairer (CloudWatch-style, Alertmanager, webhook): none by default.
    pub alert_sinks: Vec<SinkConfig>,
    /// Who runs the job: the repairer's embedded queue, or a Slurm cluster.
    pub scheduler: FleetScheduler,
    /// The job's own command instead of the bundled trainer (`fleetmend up -- COMMAND`): each
    /// rank runs it with the checkpoint protocol's environment, and `steps`, `seed`, `model`
    /// and `pace` are the command's to say. Empty: `fleetmend train`.
    pub command: Vec<String>,
}

/// Who runs a fleet's job.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FleetScheduler {
    /// The repairer's embedded queue; the agents run the ranks.
    #[default]
    Embedded,
    /// A Slurm cluster: the one of `conf` (a `slurm.conf`), or without one a dev cluster started
    /// under the state directory (`deploy/slurm/dev-cluster.sh`). The nodes `node-1`.. stand for
    /// its nodes in `sinfo`'s order; the job is an sbatch job of `resumable.sbatch`.
    Slurm { conf: Option<PathBuf> },
}

impl FleetConfig {
    /// The defaults of `fleetmend up` for `exe`.
    pub fn new(state_dir: PathBuf, exe: PathBuf) -> FleetConfig {
        FleetConfig {
            state_dir,
            nodes: 4,
            spares: 1,
            job: true,
            steps: 300,
            checkpoint_every: "10".to_owned(),
            seed: 0,
            max_restarts: 10,
            listen: None,
            fresh: false,
            report_interval: Duration::from_millis(300),
            boot_delay: Duration::from_secs(2),
            rank_stop_grace: Duration::from_secs(5),
            collective_timeout: Duration::from_secs(10),
            model: TrainModel::Default,
            pace: Duration::ZERO,
            join_timeout: Duration::from_secs(60),
            exe,
            mode: Mode::Enforce,
            alert_sinks: Vec::new(),
            scheduler: FleetScheduler::Embedded,
            command: Vec::new(),
        }
    }

    /// The state directory from `--state-dir`, else `$FLEETMEND_UP_DIR`, else `./fleetmend-up`.
    pub fn default_state_dir(flag: Option<PathBuf>) -> PathBuf {
        flag.or_else(|| std::env::var_os(STATE_DIR_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(crate::tree::DEFAULT_STATE_DIR))
    }

    /// Every problem, naming its field.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: &str, message: String| problems.push((field.to_owned(), message));
        if self.nodes == 0 {
            push("nodes", "must be at least 1".to_owned());
        }
        if self.nodes.saturating_add(self.spares) > 64 {
            push("nodes", "nodes and spares together must be at most 64 on one machine".to_owned());
        }
        if self.job && self.steps == 0 {
            push("steps", "must be at least 1".to_owned());
        }
        if self.checkpoint_every != "auto"
            && self.checkpoint_every.parse::<u64>().map_or(true, |n| n == 0)
        {
            push(
                "checkpoint_every",
                format!(
                    "{:?} is neither a number of steps (at least 1) nor \"auto\"",
                    self.checkpoint_every
                ),
            );
        }
        for (field, value) in [
            ("report_interval", self.report_interval),
            ("rank_stop_grace", self.rank_stop_grace),
            ("join_timeout", self.join_timeout),
            ("collective_timeout", self.collective_timeout),
        ] {
            if value.is_zero() {
                push(field, "must be greater than zero".to_owned());
            }
        }
        if self.state_dir.as_os_str().is_empty() {
            push("state_dir", "must not be empty".to_owned());
        }
        if !self.command.is_empty() && self.scheduler != FleetScheduler::Embedded {
            push(
                "command",
                "a job's own command runs on the embedded queue; with Slurm the job is \
                 deploy/slurm/resumable.sbatch (or submit your own sbatch script)"
                    .to_owned(),
            );
        }
        if self.command.first().is_some_and(String::is_empty) {
            push("command", "the program is empty".to_owned());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_named() {
        let mut config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        assert_eq!(config.problems(), Vec::new());
        config.nodes = 0;
        config.steps = 0;
        config.checkpoint_every = "often".to_owned();
        config.report_interval = Duration::ZERO;
        let fields: Vec<String> = config.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, ["nodes", "steps", "checkpoint_every", "report_interval"]);
    }
}
