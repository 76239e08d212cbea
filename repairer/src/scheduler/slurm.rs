//! The Slurm scheduler backend: drives a real Slurm cluster through its client commands
//! (`scontrol`, `squeue`, `scancel`), each call with a timeout and its stderr in the error.
//!
//! Drains carry an owned reason (`fleetmend: ...`); undrain resumes only nodes whose reason is
//! fleetmend's, never an admin's drain. Requeue starts the job at once instead of leaving it
//! ineligible for Slurm's ~120 s BeginTime.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fleetmend_slurm::{CommandError, Commands};
use serde::Deserialize;
use tokio::time::Instant;

use crate::scheduler::{
    BoxFuture, DRAIN_REASON_PREFIX, JobRef, Scheduler, SchedulerError, UndrainOutcome,
};

pub mod spares;

pub use fleetmend_slurm::{SlurmNode, is_plain_name, parse_show_node};

const NAME: &str = "slurm";

/// How often requeue looks at a job that is still completing.
const REQUEUE_POLL: Duration = Duration::from_millis(100);

/// `[slurm]`: how the repairer reaches Slurm (used when `scheduler = "slurm"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Directory of the Slurm client commands (`scontrol`, `squeue`, `scancel`). Unset: they are
    /// found on `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` for every call. Unset: the repairer's own environment, else Slurm's default
    /// (`/etc/slurm/slurm.conf`).
    pub slurm_conf: Option<PathBuf>,
    /// fleetmend node name → Slurm node name, where they differ. Nodes not listed have the same
    /// name in both.
    pub node_names: BTreeMap<String, String>,
    /// Longest one Slurm command may take before it is killed and the call fails. Above Slurm's
    /// own `MessageTimeout` (10 s by default), so that an unreachable slurmctld shows as Slurm's
    /// error rather than a timeout.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How long a command that could not reach slurmctld is retried (capped exponential backoff
    /// with jitter) before the call fails; zero: never retried.
    #[serde(with = "humantime_serde")]
    pub controller_retry_for: Duration,
    /// Longest pause between two retries while slurmctld is unreachable.
    #[serde(with = "humantime_serde")]
    pub controller_retry_max_backoff: Duration,
    /// Longest requeue waits for the job to leave `COMPLETING` before it starts it at once.
    #[serde(with = "humantime_serde")]
    pub requeue_settle_timeout: Duration,
    /// Hot spares to hold: idle nodes fleetmend holds healthy are drained with the reason
    /// `fleetmend: spare` while fewer are held and no job waits for nodes. Any spare (also one an
    /// operator drained with that reason) is resumed at once for a pending job short of nodes.
    pub spare_pool: u32,
    /// How often the spares are looked after (`sinfo`, and `squeue` while there are spares).
    #[serde(with = "humantime_serde")]
    pub spare_poll: Duration,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            bin_dir: None,
            slurm_conf: None,
            node_names: BTreeMap::new(),
            command_timeout: Duration::from_secs(30),
            controller_retry_for: Duration::from_secs(120),
            controller_retry_max_backoff: Duration::from_secs(5),
            requeue_settle_timeout: Duration::from_secs(30),
            spare_pool: 0,
            spare_poll: Duration::from_secs(5),
        }
    }
}

impl SlurmConfig {
    /// Every problem, each naming its field under `prefix`.
    pub fn problems(&self, prefix: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.command_timeout.is_zero() {
            problems.push((
                format!("{prefix}.command_timeout"),
                "must be greater than zero".to_owned(),
            ));
        }
        if self.requeue_settle_timeout.is_zero() {
            problems.push((
                format!("{prefix}.requeue_settle_timeout"),
                "must be greater than zero".to_owned(),
            ));
        }
        if self.spare_poll.is_zero() {
            problems.push((format!("{prefix}.spare_poll"), "must be greater than zero".to_owned()));
        }
        if self.controller_retry_max_backoff.is_zero() {
            problems.push((
                format!("{prefix}.controller_retry_max_backoff"),
                "must be greater than zero".to_owned(),
            ));
        }
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (node, slurm_name) in &self.node_names {
            let field = format!("{prefix}.node_names.{node}");
            if !is_plain_name(node) {
                problems.push((field.clone(), "the fleetmend name is not a node name".to_owned()));
            }
            if !is_plain_name(slurm_name) {
                problems.push((field.clone(), format!("{slurm_name:?} is not a Slurm node name")));
            }
            if let Some(other) = seen.insert(slurm_name, node) {
                problems.push((
                    field,
                    format!("Slurm node {slurm_name:?} is already the name of {other:?}"),
                ));
            }
        }
        problems
    }
}

/// The node's drain reason is fleetmend's (`fleetmend: ...`): undrain may lift it.
fn reason_is_ours(node: &SlurmNode) -> bool {
    node.reason.as_deref().is_some_and(|r| r.starts_with(DRAIN_REASON_PREFIX))
}

/// The Slurm backend.
#[derive(Debug, Clone)]
pub struct SlurmScheduler {
    config: SlurmConfig,
    /// How its commands are run (from `config`).
    commands: Commands,
    /// Slurm node name → fleetmend node name.
    from_slurm: BTreeMap<String, String>,
    /// The jobs fleetmend requeued, each with when the spare keeper first saw it (its clock's
    /// milliseconds; `None` until then): each lost a node to a drain, so the keeper hands it
    /// spares before Slurm's scheduler has given its pending reason.
    requeued: Arc<Mutex<BTreeMap<String, Option<u64>>>>,
}

/// How long a requeued job counts as short of nodes for the spare keeper, in milliseconds.
const REQUEUED_MEMORY_MS: u64 = 600_000;

impl SlurmScheduler {
    pub fn new(config: SlurmConfig) -> SlurmScheduler {
        let from_slurm =
            config.node_names.iter().map(|(ours, theirs)| (theirs.clone(), ours.clone())).collect();
        let commands = Commands {
            bin_dir: config.bin_dir.clone(),
            slurm_conf: config.slurm_conf.clone(),
            command_timeout: config.command_timeout,
            controller_retry_for: config.controller_retry_for,
            controller_retry_max_backoff: config.controller_retry_max_backoff,
        };
        SlurmScheduler { config, commands, from_slurm, requeued: Arc::default() }
    }

    /// The jobs fleetmend requeued that the spare keeper first saw less than
    /// [`REQUEUED_MEMORY_MS`] before `now_ms` (its clock); older ones are forgotten.
    pub fn recently_requeued(&self, now_ms: u64) -> BTreeSet<String> {
        let mut requeued = self.requeued.lock().unwrap_or_else(PoisonError::into_inner);
        requeued.retain(|_, seen| {
            now_ms.saturating_sub(*seen.get_or_insert(now_ms)) < REQUEUED_MEMORY_MS
        });
        requeued.keys().cloned().collect()
    }

    /// The Slurm name of fleetmend's `node`.
    pub fn slurm_name<'a>(&'a self, node: &'a str) -> &'a str {
        self.config.node_names.get(node).map_or(node, String::as_str)
    }

    /// fleetmend's name of Slurm's `node`.
    pub fn fleetmend_name<'a>(&'a self, node: &'a str) -> &'a str {
        self.from_slurm.get(node).map_or(node, String::as_str)
    }

    /// The settings it runs with.
    pub fn config(&self) -> &SlurmConfig {
        &self.config
    }

    /// Slurm's commands as this scheduler runs them (the timeout, the retries while slurmctld is
    /// unreachable), for other users of Slurm (the `slurm` provider, the inventory, the spares).
    pub(crate) fn commands(&self) -> &Commands {
        &self.commands
    }

    /// What Slurm says about fleetmend's `node`.
    pub async fn show_node(&self, node: &str) -> Result<SlurmNode, SchedulerError> {
        self.show_node_for("show_node", node).await
    }

    pub(crate) async fn show_node_for(
        &self,
        operation: &'static str,
        node: &str,
    ) -> Result<SlurmNode, SchedulerError> {
        self.commands
            .show_node(operation, self.slurm_name(node))
            .await
            .map_err(node_error(operation, node))
    }

    /// The state (`PENDING`, `RUNNING`, `COMPLETING`...) of `job`.
    pub async fn job_state(&self, job: &str) -> Result<String, SchedulerError> {
        self.job_state_for("job_state", job).await
    }

    async fn job_state_for(
        &self,
        operation: &'static str,
        job: &str,
    ) -> Result<String, SchedulerError> {
        check_job_id(operation, job)?;
        self.commands
            .job_state(operation, job)
            .await
            .map_err(job_error(operation, job))?
            .ok_or_else(|| SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() })
    }
}

/// Job ids go to Slurm's commands as arguments: only plain ids (`123`, `123_4` array tasks).
fn check_job_id(operation: &'static str, job: &str) -> Result<(), SchedulerError> {
    if !job.is_empty() && job.chars().all(|c| c.is_ascii_digit() || c == '_') {
        Ok(())
    } else {
        Err(SchedulerError::Failed {
            scheduler: NAME,
            operation,
            message: format!("{job:?} is not a Slurm job id"),
        })
    }
}

/// A command that did not succeed, before it is known what it was about.
struct CommandFailure {
    operation: &'static str,
    error: CommandError,
}

impl CommandFailure {
    fn into_error(self) -> SchedulerError {
        let CommandFailure { operation, error } = self;
        match error {
            CommandError::TimedOut { .. } => SchedulerError::Timeout { scheduler: NAME, operation },
            error => {
                SchedulerError::Failed { scheduler: NAME, operation, message: error.to_string() }
            }
        }
    }

    /// Slurm's "Node X not found" becomes [`SchedulerError::UnknownNode`].
    fn node_error(self, node: &str) -> SchedulerError {
        if self.error.is_unknown_node() {
            return SchedulerError::UnknownNode { scheduler: NAME, node: node.to_owned() };
        }
        self.into_error()
    }

    /// Slurm's "Invalid job id specified" becomes [`SchedulerError::UnknownJob`].
    fn job_error(self, job: &str) -> SchedulerError {
        if self.error.is_unknown_job() {
            return SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() };
        }
        self.into_error()
    }
}

/// A failed command of `operation` about no node or job in particular, as a scheduler error.
pub(crate) fn listing_error(
    operation: &'static str,
) -> impl FnOnce(CommandError) -> SchedulerError {
    move |error| CommandFailure { operation, error }.into_error()
}

/// A failed command of `operation` about fleetmend's `node`: Slurm's "not found" is
/// [`SchedulerError::UnknownNode`].
pub(crate) fn node_error<'a>(
    operation: &'static str,
    node: &'a str,
) -> impl FnOnce(CommandError) -> SchedulerError + 'a {
    move |error| CommandFailure { operation, error }.node_error(node)
}

/// A failed command of `operation` about `job`: Slurm's "Invalid job id" is
/// [`SchedulerError::UnknownJob`].
fn job_error<'a>(
    operation: &'static str,
    job: &'a str,
) -> impl FnOnce(CommandError) -> SchedulerError + 'a {
    move |error| CommandFailure { operation, error }.job_error(job)
}

impl Scheduler for SlurmScheduler {
    fn name(&self) -> &'static str {
        NAME
    }

    fn drain<'a>(
        &'a self,
        node: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            let current = self.show_node_for("drain", node).await?;
            // Already drained: by fleetmend (idempotent), or by an admin whose reason stays. A
            // hot spare's reason is replaced: a spare with a fault must never be handed a job.
            let spare = current.reason.as_deref().is_some_and(super::is_spare);
            if current.is_drained() && !spare {
                return Ok(());
            }
            let operation = "drain";
            self.commands
                .drain(operation, self.slurm_name(node), reason)
                .await
                .map_err(node_error(operation, node))
        })
    }

    fn undrain<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<UndrainOutcome, SchedulerError>> {
        Box::pin(async move {
            let current = self.show_node_for("undrain", node).await?;
            if !current.is_out() {
                return Ok(UndrainOutcome::NotDrained);
            }
            if !reason_is_ours(&current) {
                return Ok(UndrainOutcome::DrainedByOther(current.reason.unwrap_or_default()));
            }
            // A node whose reboot Slurm has not seen through yet: resuming it now would clear
            // the reboot, and its slurmd's registration after the boot would then read as an
            // unexpected reboot (DOWN, "Node unexpectedly rebooted", an admin's reason). The
            // node's agent can report from the new boot before its slurmd registers: the
            // caller retries once Slurm has it back.
            if current.is_rebooting() {
                return Err(SchedulerError::Failed {
                    scheduler: NAME,
                    operation: "undrain",
                    message: format!(
                        "{node} is still rebooting in Slurm (State={}): resumed once its slurmd \
                         registers",
                        current.state
                    ),
                });
            }
            let operation = "undrain";
            self.commands
                .resume(operation, self.slurm_name(node))
                .await
                .map_err(node_error(operation, node))?;
            Ok(UndrainOutcome::Undrained)
        })
    }

    fn jobs_on<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Vec<JobRef>, SchedulerError>> {
        Box::pin(async move {
            let operation = "jobs_on";
            let running = self
                .commands
                .jobs_on(operation, self.slurm_name(node))
                .await
                .map_err(node_error(operation, node))?;
            let mut jobs = Vec::new();
            for (id, nodelist) in running {
                let hostnames = self
                    .commands
                    .hostnames(operation, &nodelist)
                    .await
                    .map_err(listing_error(operation))?;
                let nodes = hostnames.iter().map(|n| self.fleetmend_name(n).to_owned()).collect();
                jobs.push(JobRef { id, nodes });
            }
            Ok(jobs)
        })
    }

    fn checkpoint<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            let operation = "checkpoint";
            check_job_id(operation, job)?;
            self.commands
                .signal_job(operation, job, "USR1")
                .await
                .map_err(job_error(operation, job))
        })
    }

    fn requeue<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            let operation = "requeue";
            check_job_id(operation, job)?;
            self.commands.requeue(operation, job).await.map_err(job_error(operation, job))?;
            // Slurm sets BeginTime ~120 s ahead when the requeued job leaves COMPLETING; a
            // StartTime set before then is overwritten, so wait for it to be pending first.
            let deadline = Instant::now() + self.config.requeue_settle_timeout;
            loop {
                let state = self.job_state_for("requeue", job).await?;
                if state != "COMPLETING" {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(SchedulerError::Failed {
                        scheduler: NAME,
                        operation: "requeue",
                        message: format!(
                            "job {job} still completing {:?} after the requeue; it will start \
                             after Slurm's BeginTime",
                            self.config.requeue_settle_timeout
                        ),
                    });
                }
                tokio::time::sleep(REQUEUE_POLL).await;
            }
            self.commands.start_now(operation, job).await.map_err(job_error(operation, job))?;
            self.requeued
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(job.to_owned(), None);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
