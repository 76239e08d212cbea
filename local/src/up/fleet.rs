//! A whole local fleet as one library type: the repairer in this process (embedded queue, SQLite
//! in the state directory, the `local` provider), one agent process per simulated node, and a
//! training job. `fleetmend up`, the scenario runner and tests drive it through [`Fleet`].
//!
//! With [`FleetScheduler::Slurm`] the repairer drives a Slurm cluster instead of its embedded
//! queue, and the job is an sbatch job (see [`super::slurm`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetmend_repairer::alerts::SinkConfig;
use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::config::{RepairerConfig, SchedulerKind};
use fleetmend_repairer::engine::Engine;
use fleetmend_repairer::model::{Event, NodeState};
// Re-exported: FleetConfig::mode names it.
use fleetmend_repairer::policy::FleetShare;
pub use fleetmend_repairer::policy::Mode;
use fleetmend_repairer::queue::{JobQueue, JobSpec, JobState, JobView};
use fleetmend_repairer::scheduler::slurm::spares as slurm_spares;
use fleetmend_repairer::scheduler::slurm::{SlurmConfig, SlurmScheduler};
use fleetmend_repairer::scheduler::{SPARE_REASON, Scheduler};
use fleetmend_repairer::service::{self, Repairer};
use fleetmend_repairer::store::Store;
use serde::{Deserialize, Serialize};

use super::slurm::{SlurmCluster, SlurmJob, SlurmJobStatus, SlurmUpError};
use super::supervisor::{self, AgentSettings, NodeInfo, Note, Role, Supervisor, SupervisorError};
use super::trainer::{TrainModel, trainer_args};
use crate::faults::Fault;
use crate::provider::LocalProvider;
use crate::tree::NodeTree;

pub use crate::tree::STATE_DIR_ENV;

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
        problems
    }
}

/// The fleet could not start or do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("the fleet's settings have {} problem(s): {}", .0.len(), .0.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<(String, String)>),
    #[error("preparing the state directory {path}: {source}")]
    StateDir { path: PathBuf, source: std::io::Error },
    #[error(
        "the state directory {path} holds another fleet ({found}); start with --fresh to replace it"
    )]
    OtherFleet { path: PathBuf, found: String },
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("node tree of {node}: {source}")]
    Tree { node: String, source: Box<crate::tree::TreeError> },
    #[error(transparent)]
    Supervisor(Box<SupervisorError>),
    #[error("the repairer's config: {}", .0.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    RepairerConfig(Vec<(String, String)>),
    #[error("starting the repairer: {0}")]
    Repairer(#[from] Box<service::ServiceError>),
    #[error("the repairer runs no embedded queue")]
    NoQueue,
    #[error("setting the spare {node} aside: {message}")]
    Spare { node: String, message: String },
    #[error("{0}")]
    Join(Box<JoinFailure>),
    #[error("submitting the training job: {0}")]
    Submit(String),
    #[error("the fleet runs no job")]
    NoJob,
    #[error("opening the event log: {0}")]
    Events(Box<fleetmend_repairer::store::StoreError>),
    #[error("Slurm: {0}")]
    Slurm(#[from] SlurmUpError),
    #[error("the repairers' PostgreSQL: {0}")]
    Postgres(#[from] fleetmend_repairer::postgres_server::PostgresServerError),
    #[error("the repairers: {0}")]
    Repairers(String),
}

impl From<SupervisorError> for FleetError {
    fn from(err: SupervisorError) -> Self {
        FleetError::Supervisor(Box::new(err))
    }
}

/// An agent that did not report at start.
#[derive(Debug, thiserror::Error)]
#[error("the agent of {node} did not report within {seconds} s ({why}); its log {log}:\n{tail}")]
pub struct JoinFailure {
    pub node: String,
    pub seconds: u64,
    pub why: String,
    pub log: PathBuf,
    pub tail: String,
}

/// `<state>/fleet.json`: what other tools need to reach the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetFile {
    /// The repairer's base URL.
    pub repairer: String,
    /// The admin token's file.
    pub admin_token_file: PathBuf,
    /// The training job, once submitted.
    pub job: Option<String>,
    /// Whether `fleetmend up` runs now.
    pub running: bool,
    /// The `fleetmend up` process.
    pub pid: u32,
    /// Nodes that run the job now.
    pub nodes: Vec<String>,
    /// Standby nodes not used yet.
    pub spares: Vec<String>,
    /// Nodes replaced by a spare.
    pub retired: Vec<String>,
    /// Every node's agent: name, role, state, pid, `/metrics` URL, tree directory.
    pub agents: Vec<NodeInfo>,
    /// With several repairers (`--repairers N`): each repairer process, as last started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairers: Vec<super::ha::RepairerProcess>,
}

/// One node as the fleet shows it: the supervisor's view and the repairer's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    #[serde(flatten)]
    pub info: NodeInfo,
    /// The repairer's state of the node (unknown until its first report).
    pub state: Option<NodeState>,
    pub boot_id: Option<String>,
    /// Failing findings.
    pub failing: usize,
    /// The repairer's latest report from it.
    pub last_report_ms: Option<u64>,
}

/// The final line of a completed job, from its rank 0's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalLine {
    pub step: u64,
    pub loss: f64,
    pub weights_sha256: String,
    /// The log it was read from.
    pub log: PathBuf,
}

/// A running local fleet.
pub struct Fleet {
    config: FleetConfig,
    state_dir: PathBuf,
    supervisor: Arc<Supervisor>,
    repairer: Option<Repairer>,
    engine: Arc<Engine>,
    /// The embedded queue (none on Slurm).
    queue: Option<Arc<JobQueue>>,
    /// The Slurm cluster, its settings as the repairer has them, and the job on it.
    slurm: Option<SlurmFleet>,
    events: Store,
    repairer_url: String,
    admin_token_file: PathBuf,
    admin_token: String,
    job_id: Option<String>,
    stop_repairer: Option<tokio::sync::oneshot::Sender<()>>,
    watcher: tokio::task::JoinHandle<()>,
    started_ms: u64,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("state_dir", &self.state_dir)
            .field("repairer", &self.repairer_url)
            .field("job", &self.job_id)
            .finish_non_exhaustive()
    }
}

/// The Slurm side of a fleet on Slurm.
struct SlurmFleet {
    cluster: Arc<SlurmCluster>,
    config: SlurmConfig,
    job: Option<Arc<SlurmJob>>,
    /// Reads the job's status from Slurm every [`SLURM_POLL`].
    poller: Option<tokio::task::JoinHandle<()>>,
    /// Reads which nodes Slurm holds as hot spares every [`SLURM_POLL`] (the local provider
    /// replaces a node only with one of them: a spare the repairer released runs a job).
    spare_watch: tokio::task::JoinHandle<()>,
}

/// How often the Slurm job's status is read.
const SLURM_POLL: Duration = Duration::from_millis(500);

/// Random hex from /dev/urandom.
fn random_hex(bytes: usize) -> Result<String, std::io::Error> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Reads the token in `path`, or writes a new one there (mode 0600).
fn token_file(path: &Path) -> Result<String, FleetError> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let token = text.trim().to_owned();
        if !token.is_empty() {
            return Ok(token);
        }
    }
    let write_err = |source| FleetError::Write { path: path.to_owned(), source };
    let token = random_hex(24).map_err(write_err)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(write_err)?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes()).map_err(write_err)?;
    Ok(token)
}

/// Stops agents an earlier `fleetmend up` on this state directory left running (it was killed):
/// their pid files name them, and their command lines name the node's directory.
fn stop_stale_agents(nodes_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(nodes_dir) else { return };
    for entry in entries.flatten() {
        let pid_file = entry.path().join(crate::tree::AGENT_PID_FILE);
        let Some(pid) =
            std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let dir = entry.path().display().to_string();
        let ours = cmdline
            .split(|b| *b == 0)
            .filter_map(|arg| std::str::from_utf8(arg).ok())
            .any(|arg| arg.contains(&dir));
        if ours {
            tracing::warn!(pid, dir, "stopping an agent left by an earlier fleetmend up");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_file(&pid_file);
    }
    supervisor::kill_ranks_under(Path::new("/proc"), nodes_dir);
}

/// The last `lines` lines of the file at `path`.
pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The names and roles of a new fleet: `node-1`..`node-N` work, the spares come after them.
pub fn initial_roles(nodes: u32, spares: u32) -> Vec<(String, Role)> {
    (1..=nodes.saturating_add(spares))
        .map(|i| (format!("node-{i}"), if i <= nodes { Role::Worker } else { Role::Spare }))
        .collect()
}

/// What every kind of local fleet builds before its repairers start: the state directory (an
/// earlier fleet's leftovers stopped, or its state removed with `fresh`), the tokens, the nodes'
/// trees and roles, and the supervisor of their agents.
pub(super) struct Prepared {
    pub state_dir: PathBuf,
    pub admin_token_file: PathBuf,
    pub agent_token_file: PathBuf,
    pub admin_token: String,
    pub roles: Vec<(String, Role)>,
    pub supervisor: Arc<Supervisor>,
    pub started_ms: u64,
}

pub(super) fn prepare(config: &FleetConfig) -> Result<Prepared, FleetError> {
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(FleetError::Invalid(problems));
    }
    let started_ms = now_ms();
    let dir_err = |path: &Path| {
        let path = path.to_owned();
        move |source| FleetError::StateDir { path, source }
    };
    std::fs::create_dir_all(&config.state_dir).map_err(dir_err(&config.state_dir))?;
    let state_dir = config.state_dir.canonicalize().map_err(dir_err(&config.state_dir))?;
    let nodes_dir = state_dir.join("nodes");
    stop_stale_agents(&nodes_dir);
    super::ha::stop_stale_repairers(&state_dir);
    if config.fresh {
        Fleet::clear(&state_dir)?;
    }
    std::fs::create_dir_all(&nodes_dir).map_err(dir_err(&nodes_dir))?;
    let admin_token_file = state_dir.join("admin.token");
    let agent_token_file = state_dir.join("agent.token");
    let admin_token = token_file(&admin_token_file)?;
    token_file(&agent_token_file)?;

    let roles = Fleet::roles(&state_dir, config)?;
    let supervisor = Arc::new(Supervisor::new(AgentSettings {
        exe: config.exe.clone(),
        token_file: agent_token_file.clone(),
        report_interval: config.report_interval,
        rank_stop_grace: config.rank_stop_grace,
        boot_delay: config.boot_delay,
    }));
    for (node, role) in &roles {
        let dir = nodes_dir.join(node);
        let tree = if dir.exists() { NodeTree::open(&dir) } else { NodeTree::create(&dir, node) }
            .map_err(|source| FleetError::Tree {
            node: node.clone(),
            source: Box::new(source),
        })?;
        supervisor.add(tree, *role)?;
    }
    Ok(Prepared {
        state_dir,
        admin_token_file,
        agent_token_file,
        admin_token,
        roles,
        supervisor,
        started_ms,
    })
}

impl Fleet {
    /// Builds the state directory, starts the repairer and every agent, waits for their first
    /// reports, and submits the job.
    pub async fn start(config: FleetConfig) -> Result<Fleet, FleetError> {
        let Prepared {
            state_dir,
            admin_token_file,
            agent_token_file,
            admin_token,
            roles,
            supervisor,
            started_ms,
        } = prepare(&config)?;

        let slurm_spares: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let slurm = match &config.scheduler {
            FleetScheduler::Embedded => None,
            FleetScheduler::Slurm { conf } => {
                let cluster = SlurmCluster::start(&state_dir, conf.as_deref()).await?;
                let names: Vec<String> = roles.iter().map(|(name, _)| name.clone()).collect();
                let node_names = match cluster.node_names(&names, config.nodes, config.spares) {
                    Ok(node_names) => node_names,
                    Err(err) => {
                        cluster.stop().await;
                        return Err(err.into());
                    }
                };
                let slurm_config = slurm_config(cluster.conf(), node_names, config.spares);
                let cluster = Arc::new(cluster);
                let spare_watch = tokio::spawn(watch_slurm_spares(
                    cluster.clone(),
                    SlurmScheduler::new(slurm_config.clone()),
                    slurm_spares.clone(),
                ));
                Some(SlurmFleet {
                    cluster,
                    config: slurm_config,
                    job: None,
                    poller: None,
                    spare_watch,
                })
            }
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let repairer_config = Self::repairer_config(
            &config,
            &state_dir,
            &admin_token_file,
            &agent_token_file,
            slurm.as_ref().map(|s| &s.config),
        );
        let problems = repairer_config.problems();
        if !problems.is_empty() {
            if let Some(slurm) = slurm {
                slurm.cluster.stop().await;
            }
            return Err(FleetError::RepairerConfig(problems));
        }
        let provider = Arc::new(LocalProvider::new(supervisor.clone()));
        let started = service::start_with(repairer_config, None, Some(provider.clone()), async {
            let _ = stop_rx.await;
        })
        .await;
        let repairer = match started {
            Ok(repairer) => repairer,
            Err(err) => {
                if let Some(slurm) = slurm {
                    slurm.cluster.stop().await;
                }
                return Err(Box::new(err).into());
            }
        };
        let engine = repairer.engine.clone();
        let queue = repairer.queue.clone();
        if queue.is_none() && slurm.is_none() {
            return Err(FleetError::NoQueue);
        }
        if let Some(queue) = &queue {
            let queue = queue.clone();
            provider.set_standby(Arc::new(move || queue.spares()));
        } else if slurm.is_some() {
            let spares = slurm_spares.clone();
            provider.set_standby(Arc::new(move || {
                spares.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
            }));
        }
        let repairer_url = format!("http://{}", repairer.local_addr);
        supervisor.set_repairer_url(&repairer_url);
        let events = Store::open(&state_dir.join("repairer.db"))
            .map_err(|err| FleetError::Events(Box::new(err)))?;

        let watcher = tokio::spawn(Self::watch(supervisor.clone(), state_dir.clone()));
        let mut fleet = Fleet {
            config,
            state_dir,
            supervisor,
            repairer: Some(repairer),
            engine,
            queue,
            slurm,
            events,
            repairer_url,
            admin_token_file,
            admin_token,
            job_id: None,
            stop_repairer: Some(stop_tx),
            watcher,
            started_ms,
        };
        if let Err(err) = fleet.bring_up(&roles).await {
            fleet.shutdown().await;
            return Err(err);
        }
        Ok(fleet)
    }

    async fn bring_up(&mut self, roles: &[(String, Role)]) -> Result<(), FleetError> {
        for (node, role) in roles {
            if *role == Role::Spare {
                // A hot spare: a job short of nodes takes it at once; the replacement workflow
                // takes it too, and undrains it once it is validated.
                let reason = format!("{SPARE_REASON}: standby of fleetmend up");
                let drained = match (&self.queue, &self.slurm) {
                    (_, Some(slurm)) => SlurmScheduler::new(slurm.config.clone())
                        .drain(node, &reason)
                        .await
                        .map_err(|err| err.to_string()),
                    (Some(queue), None) => {
                        queue.admin_drain(node, &reason).map_err(|err| err.to_string())
                    }
                    (None, None) => Err(FleetError::NoQueue.to_string()),
                };
                drained.map_err(|message| FleetError::Spare { node: node.clone(), message })?;
            }
        }
        let since = now_ms();
        for (node, role) in roles {
            if *role != Role::Retired {
                self.supervisor.start_agent(node)?;
            }
        }
        self.write_fleet_file(true);
        let deadline = Instant::now() + self.config.join_timeout;
        for (node, _) in roles.iter().filter(|(_, role)| *role != Role::Retired) {
            loop {
                let reported = self.engine.node(node).is_some_and(|n| n.last_report_ms >= since);
                if reported {
                    break;
                }
                let dead = self.supervisor.reap().contains(node);
                if dead || Instant::now() >= deadline {
                    let log = self.state_dir.join("nodes").join(node).join("agent.log");
                    return Err(FleetError::Join(Box::new(JoinFailure {
                        node: node.clone(),
                        seconds: self.config.join_timeout.as_secs(),
                        why: if dead {
                            "its agent exited".to_owned()
                        } else {
                            "timed out".to_owned()
                        },
                        tail: tail(&log, 15),
                        log,
                    })));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if self.config.job {
            self.job_id = Some(match self.slurm.is_some() {
                true => self.submit_slurm_job().await?,
                false => self.submit_job()?,
            });
            self.write_fleet_file(true);
        }
        Ok(())
    }

    /// Removes a previous fleet's state (its trees unmounted first).
    fn clear(state_dir: &Path) -> Result<(), FleetError> {
        let nodes_dir = state_dir.join("nodes");
        if let Ok(entries) = std::fs::read_dir(&nodes_dir) {
            for entry in entries.flatten() {
                if let Ok(tree) = NodeTree::open(&entry.path())
                    && let Err(source) = tree.cleanup()
                {
                    return Err(FleetError::Tree {
                        node: tree.node().to_owned(),
                        source: Box::new(source),
                    });
                }
            }
        }
        let entries = std::fs::read_dir(state_dir)
            .map_err(|source| FleetError::StateDir { path: state_dir.to_owned(), source })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let removed = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(|source| FleetError::StateDir { path, source })?;
        }
        Ok(())
    }

    /// The nodes and their roles: from `fleet.json` when the state directory holds a fleet of the
    /// same size (a spare that replaced a node stays a worker), else a new layout.
    fn roles(state_dir: &Path, config: &FleetConfig) -> Result<Vec<(String, Role)>, FleetError> {
        let path = state_dir.join("fleet.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(initial_roles(config.nodes, config.spares));
        };
        let file: FleetFile = serde_json::from_str(&text)
            .map_err(|err| FleetError::Read { path: path.clone(), message: err.to_string() })?;
        let total = file.agents.len();
        let active = file.nodes.len();
        if active != config.nodes as usize || total != (config.nodes + config.spares) as usize {
            return Err(FleetError::OtherFleet {
                path: state_dir.to_owned(),
                found: format!(
                    "{active} working node(s), {} spare(s), {} retired",
                    file.spares.len(),
                    file.retired.len()
                ),
            });
        }
        Ok(file.agents.into_iter().map(|a| (a.name, a.role)).collect())
    }

    /// The repairer config of `config`'s fleet (a replay of its failure history runs with its
    /// policy, engine and queue: tests/tests/replay.rs).
    pub fn repairer_config(
        config: &FleetConfig,
        state_dir: &Path,
        admin_token_file: &Path,
        agent_token_file: &Path,
        slurm: Option<&SlurmConfig>,
    ) -> RepairerConfig {
        let mut repairer = RepairerConfig {
            listen: config.listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
            store: state_dir.join("repairer.db").into(),
            agent_token_file: Some(agent_token_file.to_owned()),
            admin_token_file: Some(admin_token_file.to_owned()),
            scheduler: SchedulerKind::Embedded,
            ..RepairerConfig::default()
        };
        let engine = &mut repairer.engine;
        engine.tick = Duration::from_millis(100);
        engine.report_interval = config.report_interval;
        // A killed agent is noticed within about a second and a half at the default interval.
        engine.unreachable_after = 5;
        let workflow = &mut engine.workflow;
        workflow.call_timeout = Duration::from_secs(10);
        // The queue's own stop sequence (SIGUSR1, a new checkpoint, SIGTERM) does the waiting.
        workflow.checkpoint_grace = Duration::from_secs(1);
        workflow.reboot_timeout =
            config.boot_delay + config.rank_stop_grace + Duration::from_secs(30);
        workflow.replace_timeout = Duration::from_secs(60);
        workflow.validate_timeout = Duration::from_secs(30);
        workflow.retry_max = Duration::from_secs(5);
        if let Some(slurm) = slurm {
            repairer.scheduler = SchedulerKind::Slurm;
            repairer.slurm = slurm.clone();
            // Slurm delivers SIGUSR1 and the requeue's SIGTERM; the trainer checkpoints on both.
            workflow.checkpoint_grace = Duration::from_secs(3);
        }
        repairer.policy.mode = config.mode;
        repairer.alerts.sinks = config.alert_sinks.clone();
        // A local fleet's alerts go out within a fraction of a second.
        repairer.alerts.poll_interval = Duration::from_millis(200);
        // One machine's fleet: a repaired node may be acted on again within a minute.
        repairer.policy.guard_rails.cooldown = Duration::from_secs(60);
        // The ladder at a local fleet's pace: a node still failing 10 s after its drain is
        // rebooted (a transient fault clears), then replaced by a spare.
        repairer.policy.escalation.drain_window = Duration::from_secs(10);
        // A handful of nodes: a third of them may be out at once (the 10 % of a large fleet
        // would hold a second fault's drain behind the first one's replacement here).
        repairer.policy.guard_rails.max_unavailable_fraction = 0.34;
        // Two repairs at once, as two faults may overlap here: a share of a handful of nodes
        // (the default's 2 %) rounds to one.
        repairer.policy.guard_rails.max_concurrent_repairs = FleetShare::Nodes(2);
        let queue = &mut repairer.queue;
        queue.tick = Duration::from_millis(100);
        queue.start_timeout = Duration::from_secs(60);
        queue.checkpoint_grace = Duration::from_secs(15);
        queue.stop_grace = config.rank_stop_grace + Duration::from_secs(5);
        // A repaired node rejoins the hot spares while fewer than `--spares` are held.
        queue.spare_pool = FleetShare::Nodes(config.spares);
        queue.wait_alert = Duration::from_secs(20);
        let (min, max) = rendezvous_ports(Path::new("/proc"));
        queue.master_port_min = min;
        queue.master_port_max = max;
        repairer
    }

    fn submit_job(&self) -> Result<String, FleetError> {
        // A fleet restarted on its state directory follows its unfinished job.
        let queue = self.queue.as_ref().ok_or(FleetError::NoQueue)?;
        if let Some(job) = queue.jobs().into_iter().rev().find(|j| !j.job.state.is_final()) {
            return Ok(job.job.id);
        }
        let spec = job_spec(&self.config, &self.state_dir);
        let view = queue
            .submit(spec, "fleetmend-up")
            .map_err(|err| FleetError::Submit(err.to_string()))?;
        Ok(view.job.id)
    }

    /// Reaps agents that died by themselves and keeps `fleet.json` current.
    pub(super) async fn watch(supervisor: Arc<Supervisor>, state_dir: PathBuf) {
        let mut last = supervisor.nodes();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if supervisor.is_stopping() {
                return;
            }
            supervisor.reap();
            let now = supervisor.nodes();
            if now != last {
                if let Some(mut file) = read_fleet_file(&state_dir) {
                    fill_nodes(&mut file, &now);
                    let _ = write_json(&state_dir.join("fleet.json"), &file);
                }
                last = now;
            }
        }
    }

    fn write_fleet_file(&self, running: bool) {
        let mut file = FleetFile {
            repairer: self.repairer_url.clone(),
            admin_token_file: self.admin_token_file.clone(),
            job: self.job_id.clone(),
            running,
            pid: std::process::id(),
            nodes: Vec::new(),
            spares: Vec::new(),
            retired: Vec::new(),
            agents: Vec::new(),
            repairers: Vec::new(),
        };
        fill_nodes(&mut file, &self.supervisor.nodes());
        let path = self.state_dir.join("fleet.json");
        if let Err(err) = write_json(&path, &file) {
            tracing::warn!(path = %path.display(), error = %err, "writing fleet.json failed");
        }
    }

    // --- what a scenario runner and the view use ---------------------------------------------------

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    /// When [`Fleet::start`] began (Unix ms).
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    /// Every node: role, agent, the repairer's state.
    pub fn nodes(&self) -> Vec<NodeView> {
        self.supervisor
            .nodes()
            .into_iter()
            .map(|info| {
                let record = self.engine.node(&info.name);
                NodeView {
                    state: record.as_ref().map(|r| r.state),
                    boot_id: record.as_ref().map(|r| r.boot_id.clone()),
                    failing: record.as_ref().map_or(0, |r| {
                        r.findings
                            .iter()
                            .filter(|t| t.finding.status == fleetmend_proto::Status::Fail)
                            .count()
                    }),
                    last_report_ms: record.as_ref().map(|r| r.last_report_ms),
                    info,
                }
            })
            .collect()
    }

    pub fn repairer_url(&self) -> &str {
        &self.repairer_url
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    pub fn admin_token_file(&self) -> &Path {
        &self.admin_token_file
    }

    pub fn job_id(&self) -> Option<&str> {
        self.job_id.as_deref()
    }

    /// The job as the embedded queue shows it (none on Slurm: see [`Fleet::slurm_job`]).
    pub fn job(&self) -> Option<JobView> {
        self.queue.as_ref()?.job(self.job_id.as_deref()?)
    }

    /// The job as Slurm showed it last (on Slurm).
    pub fn slurm_job(&self) -> Option<SlurmJobStatus> {
        self.slurm.as_ref()?.job.as_ref()?.status()
    }

    /// The Slurm job's newest progress from its output: step and loss (on Slurm).
    pub fn slurm_job_progress(&self) -> Option<(u64, f64)> {
        self.slurm.as_ref()?.job.as_ref()?.progress()
    }

    /// The Slurm job's output file (on Slurm).
    pub fn slurm_job_output(&self) -> Option<&Path> {
        Some(&self.slurm.as_ref()?.job.as_ref()?.output)
    }

    /// The Slurm cluster's `slurm.conf` (on Slurm).
    pub fn slurm_conf(&self) -> Option<&Path> {
        Some(self.slurm.as_ref()?.cluster.conf())
    }

    /// Slurm's name of each node (on Slurm).
    pub fn slurm_node_names(&self) -> Option<&BTreeMap<String, String>> {
        Some(&self.slurm.as_ref()?.config.node_names)
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The embedded queue (none on Slurm).
    pub fn queue(&self) -> Option<&Arc<JobQueue>> {
        self.queue.as_ref()
    }

    pub fn supervisor(&self) -> &Arc<Supervisor> {
        &self.supervisor
    }

    /// The repairer's events after `after` (its id), oldest first, at most `limit`.
    pub fn events(&self, after: i64, limit: usize) -> Result<Vec<Event>, FleetError> {
        self.events.events(after, None, limit).map_err(|err| FleetError::Events(Box::new(err)))
    }

    /// What the supervisor did and saw after note `after` (agents started, stopped, died; reboots; replacements).
    pub fn notes(&self, after: u64) -> Vec<Note> {
        self.supervisor.notes(after)
    }

    /// Writes `fault` into `node` (`agent-kill` kills its agent).
    pub fn inject(&self, node: &str, fault: &Fault, persistent: bool) -> Result<(), FleetError> {
        Ok(self.supervisor.inject(node, fault, persistent)?)
    }

    /// SIGKILLs `node`'s agent: the node stops reporting until a reboot.
    pub fn kill_agent(&self, node: &str) -> Result<(), FleetError> {
        Ok(self.supervisor.kill_agent(node)?)
    }

    /// Waits until the job ends (completed, failed or cancelled) or `timeout` passes; the job as
    /// it stands then.
    pub async fn wait_job(&self, timeout: Duration) -> Result<JobView, FleetError> {
        let id = self.job_id.clone().ok_or(FleetError::NoJob)?;
        let deadline = Instant::now() + timeout;
        loop {
            let job = self.job().filter(|j| j.job.id == id).ok_or(FleetError::NoJob)?;
            if job.job.state.is_final() || Instant::now() >= deadline {
                return Ok(job);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `done` line of the job's last attempt (rank 0's log), once it completed.
    pub fn final_line(&self) -> Option<FinalLine> {
        if let Some(slurm) = &self.slurm {
            return slurm.job.as_ref()?.final_line();
        }
        final_line_of(&self.state_dir, &self.job()?)
    }

    /// Stops everything it started: the job is cancelled (its ranks get SIGTERM through their
    /// agents, or from Slurm, and write a checkpoint), the repairer stopped, the agents stopped
    /// (they stop any rank left), ranks of killed agents killed, the trees unmounted, and a dev
    /// Slurm cluster it started stopped.
    pub async fn shutdown(mut self) {
        self.supervisor.begin_stop();
        if let Some(slurm) = &mut self.slurm {
            if let Some(poller) = slurm.poller.take() {
                poller.abort();
            }
            slurm.spare_watch.abort();
            let unfinished =
                slurm.job.as_ref().filter(|j| !j.status().is_some_and(|s| s.is_final()));
            if let Some(job) = unfinished {
                // The ranks get SIGTERM from Slurm and write a checkpoint.
                if let Err(err) = slurm.cluster.slurm("scancel", &[&job.id]).await {
                    tracing::warn!(error = %err, "cancelling the Slurm job failed");
                }
            }
        }
        if let Some(job) = self.job().filter(|j| !j.job.state.is_final())
            && let Some(queue) = &self.queue
        {
            if let Err(err) = queue.cancel(&job.job.id, "fleetmend up (stopping)") {
                tracing::warn!(job = %job.job.id, error = %err, "cancelling the job failed");
            }
            // The ranks hear SIGTERM in the reply to their agents' next report.
            let limit = self.config.report_interval * 4 + self.config.rank_stop_grace;
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline && self.job().is_some_and(|j| !j.job.state.is_final()) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.watcher.abort();
        // The repairer first: agents going quiet one after the other would read to it as nodes
        // turning unreachable (and a storm that opens the breaker) while the fleet shuts down.
        if let Some(stop) = self.stop_repairer.take() {
            let _ = stop.send(());
        }
        if let Some(repairer) = self.repairer.take() {
            match tokio::time::timeout(Duration::from_secs(5), repairer.wait()).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(error = %err, "the repairer stopped with an error"),
                Err(_) => tracing::warn!("the repairer did not stop within 5 s"),
            }
        }
        self.supervisor.stop_all(&self.state_dir.join("nodes")).await;
        self.write_fleet_file(false);
        if let Some(slurm) = self.slurm.take() {
            slurm.cluster.stop().await;
        }
    }

    /// Submits the training job to Slurm (`resumable.sbatch` on `nodes` nodes) and starts
    /// following its status.
    async fn submit_slurm_job(&mut self) -> Result<String, FleetError> {
        let slurm = self.slurm.as_mut().ok_or(FleetError::NoJob)?;
        let checkpoints = self.state_dir.join("checkpoints").join(format!("run-{}", now_ms()));
        let settings = super::slurm::JobSettings {
            script: self.state_dir.join("resumable.sbatch"),
            output_dir: self.state_dir.clone(),
            exe: self.config.exe.clone(),
            checkpoints,
            nodes: self.config.nodes,
            steps: self.config.steps,
            checkpoint_every: self.config.checkpoint_every.clone(),
            train_args: format!(
                "--seed {} --collective-timeout {} --rendezvous-timeout 60s {}",
                self.config.seed,
                humantime::format_duration(self.config.collective_timeout),
                trainer_args(self.config.model, self.config.pace).join(" ")
            ),
        };
        let job = SlurmJob::submit(&slurm.cluster, &settings).await?;
        let job = Arc::new(job);
        let id = job.id.clone();
        let (cluster, polled) = (slurm.cluster.clone(), job.clone());
        slurm.poller = Some(tokio::spawn(async move {
            loop {
                let status = polled.refresh(&cluster).await;
                if status.is_some_and(|s| s.is_final()) {
                    return;
                }
                tokio::time::sleep(SLURM_POLL).await;
            }
        }));
        slurm.job = Some(job);
        Ok(id)
    }
}

/// The repairer's `[slurm]` settings for a fleet on `conf`: snappy timeouts for one machine,
/// slurmctld retried for half a minute before a workflow step fails (and is retried itself).
/// Keeps `spares` (fleetmend names) to the nodes Slurm holds as hot spares.
async fn watch_slurm_spares(
    cluster: Arc<SlurmCluster>,
    names: SlurmScheduler,
    spares: Arc<std::sync::Mutex<Vec<String>>>,
) {
    loop {
        if let Ok(listing) = cluster.slurm("sinfo", &["-h", "-N", "-o", "%N|%T|%E"]).await {
            let held: Vec<String> = slurm_spares::parse_nodes(&listing)
                .into_iter()
                .filter(slurm_spares::NodeLine::is_spare)
                .map(|n| names.fleetmend_name(&n.name).to_owned())
                .collect();
            *spares.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = held;
        }
        tokio::time::sleep(SLURM_POLL).await;
    }
}

fn slurm_config(conf: &Path, node_names: BTreeMap<String, String>, spares: u32) -> SlurmConfig {
    SlurmConfig {
        slurm_conf: Some(conf.to_owned()),
        node_names,
        spare_pool: spares,
        spare_poll: Duration::from_secs(1),
        command_timeout: Duration::from_secs(15),
        controller_retry_for: Duration::from_secs(30),
        controller_retry_max_backoff: Duration::from_secs(2),
        ..SlurmConfig::default()
    }
}

/// The `done` line of `job`'s last attempt (its rank 0's log under `state_dir`), once it completed.
pub(super) fn final_line_of(state_dir: &Path, job: &JobView) -> Option<FinalLine> {
    let node = job.job.nodes.first()?;
    let log = state_dir
        .join("nodes")
        .join(node)
        .join("jobs")
        .join(&job.job.id)
        .join(format!("attempt-{}", job.job.attempt))
        .join("rank-0")
        .join("rank.log");
    let text = std::fs::read_to_string(&log).ok()?;
    let done = text.lines().rev().find_map(|line| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        (value["event"] == "done").then_some(value)
    })?;
    Some(FinalLine {
        step: done["step"].as_u64()?,
        loss: done["loss"].as_f64()?,
        weights_sha256: done["weights_sha256"].as_str()?.to_owned(),
        log,
    })
}

/// The training job of a fleet (its checkpoints in a new folder of `state_dir`).
pub(super) fn job_spec(config: &FleetConfig, state_dir: &Path) -> JobSpec {
    let checkpoints = state_dir.join("checkpoints").join(format!("run-{}", now_ms()));
    let exe = config.exe.display().to_string();
    let mut argv = vec![
        exe,
        "train".to_owned(),
        "--steps".to_owned(),
        config.steps.to_string(),
        "--seed".to_owned(),
        config.seed.to_string(),
        "--checkpoint-every".to_owned(),
        config.checkpoint_every.clone(),
        "--collective-timeout".to_owned(),
        humantime::format_duration(config.collective_timeout).to_string(),
        "--rendezvous-timeout".to_owned(),
        "60s".to_owned(),
    ];
    argv.extend(trainer_args(config.model, config.pace));
    JobSpec {
        name: Some("train".to_owned()),
        argv,
        nodes: config.nodes,
        priority: 0,
        checkpoint_dir: checkpoints.display().to_string(),
        max_restarts: config.max_restarts,
        checkpoint_every: None,
        env: Default::default(),
    }
}

/// Whether a job state counts as success for `fleetmend up`'s exit status.
pub fn succeeded(state: JobState) -> bool {
    state == JobState::Completed
}

pub(super) fn fill_nodes(file: &mut FleetFile, nodes: &[NodeInfo]) {
    let names =
        |role: Role| nodes.iter().filter(|n| n.role == role).map(|n| n.name.clone()).collect();
    file.nodes = names(Role::Worker);
    file.spares = names(Role::Spare);
    file.retired = names(Role::Retired);
    file.agents = nodes.to_vec();
}

pub(super) fn read_fleet_file(state_dir: &Path) -> Option<FleetFile> {
    serde_json::from_str(&std::fs::read_to_string(state_dir.join("fleet.json")).ok()?).ok()
}

/// Writes `value` as JSON to `path` through a temporary file and a rename (readers never see half).
pub(super) fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spares_sort_after_the_working_nodes() {
        let roles = initial_roles(4, 1);
        let names: Vec<&str> = roles.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["node-1", "node-2", "node-3", "node-4", "node-5"]);
        assert_eq!(roles[4].1, Role::Spare);
        assert!(roles[..4].iter().all(|(_, r)| *r == Role::Worker));
    }

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

    #[test]
    fn the_repairer_config_is_valid_and_fast() {
        let config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        let repairer = Fleet::repairer_config(
            &config,
            Path::new("/tmp/x"),
            Path::new("/tmp/x/admin.token"),
            Path::new("/tmp/x/agent.token"),
            None,
        );
        assert_eq!(repairer.problems(), Vec::new());
        assert_eq!(repairer.scheduler, SchedulerKind::Embedded);
        assert!(repairer.listen.ip().is_loopback());
        assert_eq!(repairer.engine.tick, Duration::from_millis(100));
        assert_eq!(repairer.queue.tick, Duration::from_millis(100));
        assert!(repairer.engine.workflow.reboot_timeout <= Duration::from_secs(60));
    }

    #[test]
    fn on_slurm_the_repairer_drives_the_cluster_with_the_nodes_mapped() {
        let config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        let names = BTreeMap::from([
            ("node-1".to_owned(), "node1".to_owned()),
            ("node-2".to_owned(), "node2".to_owned()),
        ]);
        let slurm = slurm_config(Path::new("/tmp/x/slurm/slurm.conf"), names.clone(), 1);
        let repairer = Fleet::repairer_config(
            &config,
            Path::new("/tmp/x"),
            Path::new("/tmp/x/admin.token"),
            Path::new("/tmp/x/agent.token"),
            Some(&slurm),
        );
        assert_eq!(repairer.problems(), Vec::new());
        assert_eq!(repairer.scheduler, SchedulerKind::Slurm);
        assert_eq!(repairer.slurm.node_names, names);
        assert_eq!(
            repairer.slurm.slurm_conf.as_deref(),
            Some(Path::new("/tmp/x/slurm/slurm.conf"))
        );
    }
}

/// Ports rank 0 of the job may listen on: a window of 200 below the kernel's ephemeral range (where
/// outgoing connections take their local ports, so a listener there can find its port taken) and
/// away from torchrun's default 29500, at a random offset so fleets on one machine rarely meet.
pub fn rendezvous_ports(procfs: &Path) -> (u16, u16) {
    const LOWEST: u16 = 10_000;
    const WIDTH: u16 = 200;
    let ephemeral_min = std::fs::read_to_string(procfs.join("sys/net/ipv4/ip_local_port_range"))
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32_768);
    let top = ephemeral_min.saturating_sub(WIDTH).max(LOWEST + WIDTH);
    let windows = (top - LOWEST) / WIDTH;
    let mut min = LOWEST + WIDTH * fastrand::u16(0..windows.max(1));
    if (29_300..=29_700).contains(&min) {
        min = LOWEST;
    }
    (min, min + WIDTH - 1)
}

#[cfg(test)]
mod rendezvous_port_tests {
    use super::*;

    #[test]
    fn rendezvous_ports_stay_below_the_ephemeral_range() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sys/net/ipv4/ip_local_port_range");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "32768\t60999\n").unwrap();
        for _ in 0..200 {
            let (min, max) = rendezvous_ports(dir.path());
            assert!(min >= 10_000 && max < 32_768 && max - min == 199, "{min}..{max}");
            assert!(!(min..=max).contains(&29_500), "{min}..{max}");
        }
        // Without the file: the kernel's default range is assumed.
        let (min, max) = rendezvous_ports(&dir.path().join("missing"));
        assert!(min >= 10_000 && max < 32_768, "{min}..{max}");
    }
}
