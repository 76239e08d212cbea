//! `fleetmend up --scheduler slurm`: the local fleet on a Slurm cluster. The repairer drives
//! Slurm (drains, requeues, the jobs on a node) instead of its embedded queue, the training job
//! is an sbatch job of `deploy/slurm/resumable.sbatch` running the bundled trainer through srun,
//! and the simulated nodes `node-1`.. stand for Slurm's nodes in order (`[slurm.node_names]`).
//!
//! Without a cluster of the user's own (`--slurm-conf`), `deploy/slurm/dev-cluster.sh` (built
//! into the binary) starts one under the state directory: munged, slurmctld and four slurmd on
//! this host; it is stopped with the fleet.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use fleetmend_process::{ProcessOutput, RunError};
use serde::{Deserialize, Serialize};
use tokio::process::Command;

use super::fleet::FinalLine;

/// The dev cluster's script, as in the repository.
const DEV_CLUSTER_SCRIPT: &str = include_str!("../../../deploy/slurm/dev-cluster.sh");
/// The resumable sbatch template, as in the repository.
pub const RESUMABLE_SBATCH: &str = include_str!("../../../deploy/slurm/resumable.sbatch");

/// Longest any one Slurm client command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest the dev cluster may take to start (its own bound is 30 s for idle nodes).
const DEV_CLUSTER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Something about Slurm failed.
#[derive(Debug, thiserror::Error)]
pub enum SlurmUpError {
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("running {what}: {message}")]
    Command { what: String, message: String },
    #[error(
        "the Slurm cluster has {found} node(s) ({names}); --nodes {nodes} and --spares {spares} need {}",
        nodes + spares
    )]
    TooFewNodes { found: usize, names: String, nodes: u32, spares: u32 },
    #[error("sbatch printed no job id: {0:?}")]
    NoJobId(String),
    #[error(transparent)]
    Slurm(Box<fleetmend_slurm::CommandError>),
}

impl From<fleetmend_slurm::CommandError> for SlurmUpError {
    fn from(err: fleetmend_slurm::CommandError) -> SlurmUpError {
        SlurmUpError::Slurm(Box::new(err))
    }
}

/// Runs `command` in a process group of its own; kills the group when `timeout` passes. A
/// non-zero exit is an error with the command's output.
async fn run(command: Command, timeout: Duration) -> Result<ProcessOutput, SlurmUpError> {
    let what = format!("{:?}", command.as_std());
    let fail = |message: String| SlurmUpError::Command { what: what.clone(), message };
    let options = fleetmend_process::Options {
        // The dev cluster's daemons outlive the script that starts them.
        leftovers: fleetmend_process::Leftovers::Leave,
        ..fleetmend_process::Options::new(timeout)
    };
    let output = match fleetmend_process::run(command, &options).await {
        Ok(output) => output,
        Err(RunError::TimedOut { .. }) => {
            return Err(fail(format!("no answer within {}", humantime::format_duration(timeout))));
        }
        Err(RunError::Spawn { source, .. } | RunError::Wait { source, .. }) => {
            return Err(fail(source.to_string()));
        }
    };
    if !output.status.success() {
        return Err(fail(format!(
            "{}: {}{}",
            output.status,
            output.stderr.text().trim(),
            output.stdout.text().trim()
        )));
    }
    Ok(output)
}

/// `program` with `args`.
fn command(program: impl AsRef<OsStr>, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    command
}

/// The Slurm cluster the fleet runs on.
#[derive(Debug)]
pub struct SlurmCluster {
    conf: PathBuf,
    /// Its client commands (every Slurm command line is a method of `fleetmend_slurm::Commands`).
    commands: fleetmend_slurm::Commands,
    /// The dev cluster's directory, when `fleetmend up` started it (and stops it).
    dev_cluster: Option<PathBuf>,
    /// Slurm's node names, in `sinfo`'s order.
    nodes: Vec<String>,
}

impl SlurmCluster {
    /// The cluster of `conf`, or (without one) a dev cluster started under `state_dir/slurm`.
    pub async fn start(
        state_dir: &Path,
        conf: Option<&Path>,
    ) -> Result<SlurmCluster, SlurmUpError> {
        let (conf, dev_cluster) = match conf {
            Some(conf) => (conf.to_owned(), None),
            None => {
                let dir = state_dir.join("slurm");
                let script = state_dir.join("dev-cluster.sh");
                write_executable(&script, DEV_CLUSTER_SCRIPT)?;
                // A cluster an earlier run left behind (killed before it could stop it).
                let mut stop = command(&script, &["stop"]);
                stop.arg(&dir);
                let _ = run(stop, COMMAND_TIMEOUT).await;
                let (ctld, first_node) = free_ports();
                let mut start = command(&script, &["start"]);
                start
                    .arg(&dir)
                    .env("FLEETMEND_SLURM_CTLD_PORT", ctld.to_string())
                    .env("FLEETMEND_SLURM_NODE_PORT", first_node.to_string());
                run(start, DEV_CLUSTER_START_TIMEOUT).await?;
                (dir.join("slurm.conf"), Some(dir))
            }
        };
        let commands = fleetmend_slurm::Commands {
            bin_dir: None,
            slurm_conf: Some(conf.clone()),
            command_timeout: COMMAND_TIMEOUT,
            // The fleet's own cluster answers or the run fails: nothing to wait out.
            controller_retry_for: Duration::ZERO,
            controller_retry_max_backoff: Duration::from_secs(1),
        };
        let mut cluster = SlurmCluster { conf, commands, dev_cluster, nodes: Vec::new() };
        match cluster.commands.node_names("list the nodes").await {
            Ok(names) => cluster.nodes = names,
            Err(err) => {
                cluster.stop().await;
                return Err(err.into());
            }
        }
        Ok(cluster)
    }

    /// The `SLURM_CONF` of the cluster.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// Slurm's node names.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// fleetmend name → Slurm name for `names` (the fleet's nodes in order), or why the cluster
    /// is too small.
    pub fn node_names(
        &self,
        names: &[String],
        nodes: u32,
        spares: u32,
    ) -> Result<BTreeMap<String, String>, SlurmUpError> {
        if names.len() > self.nodes.len() {
            return Err(SlurmUpError::TooFewNodes {
                found: self.nodes.len(),
                names: self.nodes.join(", "),
                nodes,
                spares,
            });
        }
        Ok(names.iter().cloned().zip(self.nodes.iter().cloned()).collect())
    }

    /// The cluster's client commands.
    pub fn commands(&self) -> &fleetmend_slurm::Commands {
        &self.commands
    }

    /// Stops the dev cluster `fleetmend up` started (a cluster of the user's own is left alone).
    pub async fn stop(&self) {
        let Some(dir) = &self.dev_cluster else { return };
        let script = dir.parent().map(|p| p.join("dev-cluster.sh")).unwrap_or_default();
        let mut stop = command(&script, &["stop"]);
        stop.arg(dir);
        if let Err(err) = run(stop, COMMAND_TIMEOUT).await {
            tracing::warn!(error = %err, "stopping the Slurm dev cluster failed");
        }
    }
}

fn write_executable(path: &Path, text: &str) -> Result<(), SlurmUpError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |source| SlurmUpError::Write { path: path.to_owned(), source };
    std::fs::write(path, text).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(fail)
}

/// A free port for slurmctld and the first of four consecutive free ports for the slurmd (they
/// bind every address).
/// `resumable.sbatch`'s `FLEETMEND_MASTER_PORT_BASE`: one below a port free now (the job ids of
/// a fresh cluster start at 1).
fn master_port_base() -> Option<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    Some(listener.local_addr().ok()?.port().saturating_sub(1))
}

fn free_ports() -> (u16, u16) {
    let bindable = |port: u16| std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
    let start = 17_001 + u16::try_from(std::process::id() % 500).unwrap_or(0) * 5;
    (0..400u16)
        .map(|i| 17_001 + (start - 17_001 + i * 5) % 10_000)
        .find(|base| (*base..*base + 5).all(bindable))
        .map_or((16_817, 17_001), |base| (base + 4, base))
}

/// The training job as Slurm shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJobStatus {
    pub id: String,
    /// `JobState` (`PENDING`, `RUNNING`, `COMPLETED`...).
    pub state: String,
    /// Slurm's `Restarts` (requeues so far).
    pub restarts: u32,
    /// The nodes it runs on, as Slurm lists them (`node[1-2]`).
    pub nodes: String,
    /// Slurm's `Reason` for a pending job.
    pub reason: String,
}

impl SlurmJobStatus {
    /// Over for good: Slurm runs it no more.
    pub fn is_final(&self) -> bool {
        matches!(
            self.state.as_str(),
            "COMPLETED"
                | "FAILED"
                | "CANCELLED"
                | "TIMEOUT"
                | "NODE_FAIL"
                | "OUT_OF_MEMORY"
                | "BOOT_FAIL"
                | "DEADLINE"
                | "PREEMPTED"
        )
    }

    pub fn succeeded(&self) -> bool {
        self.state == "COMPLETED"
    }

    /// `scontrol show job -o`'s one line.
    pub fn parse(id: &str, line: &str) -> Option<SlurmJobStatus> {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_owned)
        };
        Some(SlurmJobStatus {
            id: id.to_owned(),
            state: field("JobState")?,
            restarts: field("Restarts").and_then(|r| r.parse().ok()).unwrap_or(0),
            nodes: field("NodeList").filter(|n| n != "(null)").unwrap_or_default(),
            reason: field("Reason").filter(|r| r != "None").unwrap_or_default(),
        })
    }
}

/// What the training job is, for [`SlurmJob::submit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    /// Where `resumable.sbatch` is written for sbatch.
    pub script: PathBuf,
    /// The job's output file goes here (`train-<job id>.out`).
    pub output_dir: PathBuf,
    /// The `fleetmend` executable the ranks run.
    pub exe: PathBuf,
    pub checkpoints: PathBuf,
    pub nodes: u32,
    pub steps: u64,
    /// Steps, or `auto`.
    pub checkpoint_every: String,
    /// More `fleetmend train` flags (split on spaces by the script).
    pub train_args: String,
}

/// The training job, submitted with `resumable.sbatch`.
#[derive(Debug)]
pub struct SlurmJob {
    pub id: String,
    /// The job's output file (every attempt's, appended).
    pub output: PathBuf,
    /// The latest status read from Slurm.
    last: Mutex<Option<SlurmJobStatus>>,
}

impl SlurmJob {
    pub fn new(id: String, output: PathBuf) -> SlurmJob {
        SlurmJob { id, output, last: Mutex::new(None) }
    }

    /// Submits `resumable.sbatch` with `settings` to `cluster`.
    pub async fn submit(
        cluster: &SlurmCluster,
        settings: &JobSettings,
    ) -> Result<SlurmJob, SlurmUpError> {
        write_executable(&settings.script, RESUMABLE_SBATCH)?;
        std::fs::create_dir_all(&settings.checkpoints)
            .map_err(|source| SlurmUpError::Write { path: settings.checkpoints.clone(), source })?;
        let output_pattern = settings.output_dir.join("train-%j.out").display().to_string();
        let nodes = format!("--nodes={}", settings.nodes);
        let mut env = vec![
            ("FLEETMEND", settings.exe.display().to_string()),
            ("FLEETMEND_CHECKPOINT_DIR", settings.checkpoints.display().to_string()),
            ("FLEETMEND_TRAIN_STEPS", settings.steps.to_string()),
            ("FLEETMEND_CHECKPOINT_EVERY", settings.checkpoint_every.clone()),
            ("FLEETMEND_TRAIN_ARGS", settings.train_args.clone()),
        ];
        // Job ids start at 1 in every dev cluster: rank 0's port is taken from one free now, not
        // from the id alone, so that fleets side by side do not meet on one port.
        if let Some(base) = master_port_base() {
            env.push(("FLEETMEND_MASTER_PORT_BASE", base.to_string()));
        }
        let printed = cluster
            .commands
            .sbatch(
                "submit the job",
                &[&nodes, "--output", &output_pattern],
                &settings.script,
                &settings.output_dir,
                &env,
            )
            .await?;
        let printed = printed.trim().to_owned();
        // `--parsable` prints `ID` or `ID;CLUSTER`.
        let id = printed.split(';').next().unwrap_or_default().to_owned();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            return Err(SlurmUpError::NoJobId(printed));
        }
        let output = settings.output_dir.join(format!("train-{id}.out"));
        Ok(SlurmJob::new(id, output))
    }

    /// The newest `progress` line of the job's output: step and loss.
    pub fn progress(&self) -> Option<(u64, f64)> {
        let text = std::fs::read_to_string(&self.output).ok()?;
        text.lines().rev().find_map(|line| {
            let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
            (value["event"] == "progress").then_some(())?;
            Some((value["step"].as_u64()?, value["loss"].as_f64()?))
        })
    }

    /// Reads the job's status from Slurm (`scontrol show job`); the last one read when Slurm
    /// does not answer.
    pub async fn refresh(&self, cluster: &SlurmCluster) -> Option<SlurmJobStatus> {
        let read = cluster
            .commands
            .show_job("read the job", &self.id)
            .await
            .ok()
            .and_then(|text| SlurmJobStatus::parse(&self.id, text.trim()));
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if read.is_some() {
            *last = read;
        }
        last.clone()
    }

    pub fn status(&self) -> Option<SlurmJobStatus> {
        self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The last `done` line in the job's output (its last attempt's).
    pub fn final_line(&self) -> Option<FinalLine> {
        let text = std::fs::read_to_string(&self.output).ok()?;
        text.lines().rev().find_map(|line| {
            let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
            (value["event"] == "done").then_some(())?;
            Some(FinalLine {
                step: value["step"].as_u64()?,
                loss: value["loss"].as_f64()?,
                weights_sha256: value["weights_sha256"].as_str()?.to_owned(),
                log: self.output.clone(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_line_of_scontrol_show_job_is_read() {
        let line = "JobId=7 JobName=train UserId=root(0) Priority=1 JobState=RUNNING Reason=None \
                    Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 NodeList=node[1,3] \
                    BatchHost=node1";
        let status = SlurmJobStatus::parse("7", line).unwrap();
        assert_eq!(status.state, "RUNNING");
        assert_eq!(status.restarts, 1);
        assert_eq!(status.nodes, "node[1,3]");
        assert_eq!(status.reason, "");
        assert!(!status.is_final());
        let pending = "JobId=7 JobState=PENDING Reason=Resources Restarts=0 NodeList=(null)";
        let status = SlurmJobStatus::parse("7", pending).unwrap();
        assert_eq!((status.reason.as_str(), status.nodes.as_str()), ("Resources", ""));
        let done = SlurmJobStatus::parse("7", "JobId=7 JobState=COMPLETED Restarts=2").unwrap();
        assert!(done.is_final() && done.succeeded());
        assert_eq!(SlurmJobStatus::parse("7", "slurm_load_jobs error: Invalid job id"), None);
    }
}
