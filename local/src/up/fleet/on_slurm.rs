//! The Slurm side of a fleet on Slurm ([`super::FleetScheduler::Slurm`]): the cluster, the
//! repairer's `[slurm]` settings for it, the sbatch job and the watches that follow the job's
//! status and the hot spares Slurm holds.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::scheduler::slurm::spares as slurm_spares;
use fleetmend_repairer::scheduler::slurm::{SlurmConfig, SlurmScheduler};

use super::repairer_settings::slurm_config;
use super::{FleetConfig, FleetError};
use crate::up::slurm::{JobSettings, SlurmCluster, SlurmJob};
use crate::up::supervisor::Role;
use crate::up::trainer::trainer_args;

/// The Slurm side of a fleet on Slurm.
pub(super) struct SlurmFleet {
    pub(super) cluster: Arc<SlurmCluster>,
    pub(super) config: SlurmConfig,
    pub(super) job: Option<Arc<SlurmJob>>,
    /// Reads the job's status from Slurm every [`SLURM_POLL`].
    poller: Option<tokio::task::JoinHandle<()>>,
    /// Reads which nodes Slurm holds as hot spares every [`SLURM_POLL`] (the local provider
    /// replaces a node only with one of them: a spare the repairer released runs a job).
    spare_watch: tokio::task::JoinHandle<()>,
}

/// How often the Slurm job's status is read.
const SLURM_POLL: Duration = Duration::from_millis(500);

impl SlurmFleet {
    /// Starts (or joins, with `conf`) the cluster, maps the fleet's nodes `roles` onto its nodes,
    /// and starts keeping `held_spares` to the nodes Slurm holds as hot spares.
    pub(super) async fn start(
        state_dir: &Path,
        conf: Option<&Path>,
        roles: &[(String, Role)],
        config: &FleetConfig,
        held_spares: Arc<Mutex<Vec<String>>>,
    ) -> Result<SlurmFleet, FleetError> {
        let cluster = SlurmCluster::start(state_dir, conf).await?;
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
            held_spares,
        ));
        Ok(SlurmFleet { cluster, config: slurm_config, job: None, poller: None, spare_watch })
    }

    /// Submits the training job to Slurm (`resumable.sbatch` on `nodes` nodes) and starts
    /// following its status.
    pub(super) async fn submit_job(
        &mut self,
        config: &FleetConfig,
        state_dir: &Path,
    ) -> Result<String, FleetError> {
        let checkpoints = state_dir.join("checkpoints").join(format!("run-{}", now_ms()));
        let settings = JobSettings {
            script: state_dir.join("resumable.sbatch"),
            output_dir: state_dir.to_owned(),
            exe: config.exe.clone(),
            checkpoints,
            nodes: config.nodes,
            steps: config.steps,
            checkpoint_every: config.checkpoint_every.clone(),
            train_args: format!(
                "--seed {} --collective-timeout {} --rendezvous-timeout 60s {}",
                config.seed,
                humantime::format_duration(config.collective_timeout),
                trainer_args(config.model, config.pace).join(" ")
            ),
        };
        let job = SlurmJob::submit(&self.cluster, &settings).await?;
        let job = Arc::new(job);
        let id = job.id.clone();
        let (cluster, polled) = (self.cluster.clone(), job.clone());
        self.poller = Some(tokio::spawn(async move {
            loop {
                let status = polled.refresh(&cluster).await;
                if status.is_some_and(|s| s.is_final()) {
                    return;
                }
                tokio::time::sleep(SLURM_POLL).await;
            }
        }));
        self.job = Some(job);
        Ok(id)
    }

    /// Stops following the job and the spares, and cancels the job if it has not ended.
    pub(super) async fn cancel_job(&mut self) {
        if let Some(poller) = self.poller.take() {
            poller.abort();
        }
        self.spare_watch.abort();
        let unfinished = self.job.as_ref().filter(|j| !j.status().is_some_and(|s| s.is_final()));
        if let Some(job) = unfinished {
            // The ranks get SIGTERM from Slurm and write a checkpoint.
            if let Err(err) = self.cluster.commands().cancel("cancel the job", &job.id).await {
                tracing::warn!(error = %err, "cancelling the Slurm job failed");
            }
        }
    }
}

/// Keeps `spares` (fleetmend names) to the nodes Slurm holds as hot spares.
async fn watch_slurm_spares(
    cluster: Arc<SlurmCluster>,
    names: SlurmScheduler,
    spares: Arc<Mutex<Vec<String>>>,
) {
    loop {
        if let Ok(listing) = cluster.commands().node_states("watch the spares").await {
            let held: Vec<String> = slurm_spares::parse_nodes(&listing)
                .into_iter()
                .filter(slurm_spares::NodeLine::is_spare)
                .map(|n| names.fleetmend_name(&n.name).to_owned())
                .collect();
            *spares.lock().unwrap_or_else(PoisonError::into_inner) = held;
        }
        tokio::time::sleep(SLURM_POLL).await;
    }
}
