//! The fleet's training job: its spec for the embedded queue, the `done` line its rank 0 writes
//! at the end, and what counts as success.

use std::path::{Path, PathBuf};

use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::queue::{JobSpec, JobState, JobView};
use serde::{Deserialize, Serialize};

use super::FleetConfig;
use crate::up::trainer::trainer_args;

/// The final line of a completed job, from its rank 0's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalLine {
    pub step: u64,
    pub loss: f64,
    pub weights_sha256: String,
    /// The log it was read from.
    pub log: PathBuf,
}

/// The `done` line of `job`'s last attempt (its rank 0's log under `state_dir`), once it completed.
pub(in crate::up) fn final_line_of(state_dir: &Path, job: &JobView) -> Option<FinalLine> {
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

/// The training job of a fleet (its checkpoints in a new folder of `state_dir`): the bundled
/// trainer, or the fleet's own command.
pub(in crate::up) fn job_spec(config: &FleetConfig, state_dir: &Path) -> JobSpec {
    let checkpoints = state_dir.join("checkpoints").join(format!("run-{}", now_ms()));
    let (name, argv) = if config.command.is_empty() {
        ("train", trainer_argv(config))
    } else {
        ("job", config.command.clone())
    };
    JobSpec {
        name: Some(name.to_owned()),
        argv,
        nodes: config.nodes,
        priority: 0,
        checkpoint_dir: checkpoints.display().to_string(),
        max_restarts: config.max_restarts,
        checkpoint_every: None,
        env: Default::default(),
    }
}

/// The bundled trainer's command line for the fleet's settings.
fn trainer_argv(config: &FleetConfig) -> Vec<String> {
    let mut argv = vec![
        config.exe.display().to_string(),
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
    argv
}

/// Whether a job state counts as success for `fleetmend up`'s exit status.
pub fn succeeded(state: JobState) -> bool {
    state == JobState::Completed
}
