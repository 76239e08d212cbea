//! A whole local fleet as one library type: the repairer in this process (embedded queue, SQLite
//! in the state directory, the `local` provider), one agent process per simulated node, and a
//! training job. `fleetmend up`, the scenario runner and tests drive it through [`Fleet`].
//!
//! With [`FleetScheduler::Slurm`] the repairer drives a Slurm cluster instead of its embedded
//! queue, and the job is an sbatch job (see [`super::slurm`]).
//!
//! Around [`Fleet`]: its settings (`config`), its errors (`error`), the state directory it
//! starts on (`state_dir`), `fleet.json` (`fleet_file`), the repairer's settings
//! (`repairer_settings`), the training job (`job`) and the Slurm side (`on_slurm`).

mod config;
mod error;
mod fleet_file;
mod job;
mod on_slurm;
mod repairer_settings;
mod state_dir;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::engine::Engine;
use fleetmend_repairer::model::{Event, NodeState};
// Re-exported: FleetConfig::mode names it.
pub use fleetmend_repairer::policy::Mode;
use fleetmend_repairer::queue::{JobQueue, JobView};
use fleetmend_repairer::scheduler::slurm::SlurmScheduler;
use fleetmend_repairer::scheduler::{SPARE_REASON, Scheduler};
use fleetmend_repairer::service::{self, Repairer};
use fleetmend_repairer::store::Store;
use serde::{Deserialize, Serialize};

pub use self::config::{FleetConfig, FleetScheduler};
pub(super) use self::error::tail;
pub use self::error::{FleetError, JoinFailure};
pub use self::fleet_file::FleetFile;
pub(super) use self::fleet_file::{fill_nodes, read_fleet_file, watch_agents, write_fleet_json};
pub use self::job::{FinalLine, succeeded};
pub(super) use self::job::{final_line_of, job_spec};
use self::on_slurm::SlurmFleet;
pub use self::repairer_settings::rendezvous_ports;
pub use self::repairer_settings::repairer_config;
pub use self::state_dir::initial_roles;
pub(super) use self::state_dir::{Prepared, prepare};
use super::slurm::SlurmJobStatus;
use super::supervisor::{NodeInfo, Note, Role, Supervisor};
use crate::faults::Fault;
use crate::provider::LocalProvider;

pub use crate::tree::STATE_DIR_ENV;

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
            FleetScheduler::Slurm { conf } => Some(
                SlurmFleet::start(
                    &state_dir,
                    conf.as_deref(),
                    &roles,
                    &config,
                    slurm_spares.clone(),
                )
                .await?,
            ),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let repairer_config = repairer_config(
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

        let watcher = tokio::spawn(watch_agents(supervisor.clone(), state_dir.clone()));
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
            self.job_id = Some(match &mut self.slurm {
                Some(slurm) => slurm.submit_job(&self.config, &self.state_dir).await?,
                None => self.submit_job()?,
            });
            self.write_fleet_file(true);
        }
        Ok(())
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
        write_fleet_json(&self.state_dir, &file);
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
            slurm.cancel_job().await;
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
}
