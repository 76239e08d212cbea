//! Where a run starts: rank 0 resumes from the newest checkpoint that verifies (or starts fresh),
//! the ranks meet, and rank 0's start point becomes every rank's, so that the ranks agree on the
//! step even when only rank 0 sees the checkpoint directory.

use std::time::SystemTime;

use super::TrainError;
use super::model::{self, ModelConfig};
use super::optim::{AdamW, TrainTensors};
use super::setup::Setup;
use super::state;
use super::telemetry::{RestoreRecord, SkippedCheckpoint, TrainTelemetry};
use crate::checkpoint::{self, LoadedCheckpoint};
use crate::collective::{CollectiveConfig, Communicator};

/// Where training starts: fresh, or from a checkpoint.
pub(super) struct StartPoint {
    pub(super) step: u64,
    pub(super) tensors: TrainTensors,
    pub(super) optimizer: AdamW,
    pub(super) loss: f32,
    /// The checkpoint resumed, if any.
    pub(super) checkpoint_step: Option<u64>,
}

/// The ranks meet and agree on where training starts: the ring (`None` in a world of one) and
/// the start point. Each rank's restore (rank 0's from its checkpoint, the others' from rank 0) is
/// traced when it happened.
pub(super) fn meet_at_start_point(
    setup: &Setup,
    telemetry: Option<&TrainTelemetry>,
) -> Result<(Option<Communicator>, StartPoint), TrainError> {
    let rank = setup.membership.rank;
    // Rank 0 reads the checkpoint before meeting the others: a refusal reaches them as a message.
    let resume = if rank == 0 {
        let mut restore = RestoreRecord::begin("checkpoint");
        let resume = find_resume_point(setup, &mut restore);
        restore.ended_at = SystemTime::now();
        match &resume {
            Ok(Some(point)) => restore.step = point.checkpoint_step,
            Ok(None) => {}
            Err(err) => restore.error = Some(err.to_string()),
        }
        if let Some(telemetry) = telemetry.filter(|_| restore.happened()) {
            telemetry.restore(&restore);
        }
        resume
    } else {
        Ok(None)
    };
    let mut comm = connect(setup)?;
    let start = if rank == 0 {
        share_start_point(setup, comm.as_mut(), resume)?
    } else {
        let mut restore = RestoreRecord::begin("rank 0");
        let start = share_start_point(setup, comm.as_mut(), resume);
        restore.ended_at = SystemTime::now();
        match &start {
            Ok(point) => restore.step = point.checkpoint_step,
            Err(err) => restore.error = Some(err.to_string()),
        }
        if let Some(telemetry) = telemetry.filter(|_| restore.happened()) {
            telemetry.restore(&restore);
        }
        start?
    };
    Ok((comm, start))
}

/// The rendezvous and the ring; `None` in a world of one.
fn connect(setup: &Setup) -> Result<Option<Communicator>, TrainError> {
    if setup.membership.world_size <= 1 {
        return Ok(None);
    }
    let config = CollectiveConfig {
        rendezvous_timeout: setup.args.rendezvous_timeout,
        collective_timeout: setup.args.collective_timeout,
        ..CollectiveConfig::default()
    };
    let rank = setup.membership.rank;
    Communicator::connect(&setup.membership, &config)
        .map(Some)
        .map_err(|e| TrainError::Rendezvous { rank, reason: e.to_string() })
}

/// Rank 0: the newest checkpoint that verifies (each one refused on the way is reported on
/// stderr with the reason), read and checked against this run. `Err` is a refusal to report to
/// every rank.
fn find_resume_point(
    setup: &Setup,
    restore: &mut RestoreRecord,
) -> Result<Option<StartPoint>, TrainError> {
    let Some(dir) = &setup.checkpoint_dir else {
        return Ok(None);
    };
    if !dir.exists() {
        return Ok(None);
    }
    let dirs = checkpoint::step_dirs(dir).map_err(|e| TrainError::ReadCheckpoint(e.to_string()))?;
    for candidate in dirs {
        // One pass: every byte is read once, hashed against the manifest and kept for decoding.
        let loaded = match checkpoint::load(&candidate.path) {
            Ok(valid) => valid,
            Err(reason) => {
                eprintln!("fleetmend train: checkpoint refused, trying the previous one: {reason}");
                restore.skipped.push(SkippedCheckpoint {
                    path: candidate.path.display().to_string(),
                    reason: reason.to_string(),
                    at: SystemTime::now(),
                });
                continue;
            }
        };
        let valid = &loaded.checkpoint;
        match load_checkpoint(setup, &loaded) {
            Ok(point) => {
                eprintln!(
                    "fleetmend train: resuming from {} (step {})",
                    valid.path.display(),
                    valid.step
                );
                restore.path = Some(valid.path.display().to_string());
                return Ok(Some(point));
            }
            Err(LoadError::Refuse(reason)) => {
                restore.path = Some(valid.path.display().to_string());
                return Err(TrainError::ResumeRefused {
                    path: valid.path.display().to_string(),
                    reason,
                });
            }
            Err(LoadError::Unreadable(reason)) => {
                eprintln!(
                    "fleetmend train: checkpoint refused, trying the previous one: {}: {reason}",
                    valid.path.display()
                );
                restore.skipped.push(SkippedCheckpoint {
                    path: valid.path.display().to_string(),
                    reason,
                    at: SystemTime::now(),
                });
            }
        }
    }
    Ok(None)
}

enum LoadError {
    /// The checkpoint is fine but of another model: resuming would be wrong.
    Refuse(String),
    /// The checkpoint's contents are damaged: try the previous one.
    Unreadable(String),
}

fn load_checkpoint(setup: &Setup, valid: &LoadedCheckpoint) -> Result<StartPoint, LoadError> {
    let state = state::read_state(valid).map_err(|e| LoadError::Unreadable(e.to_string()))?;
    if state.model != setup.config {
        return Err(LoadError::Refuse(format!(
            "it is of another model ({}), this run has {}",
            describe(&state.model),
            describe(&setup.config)
        )));
    }
    if state.step > setup.args.steps {
        return Err(LoadError::Refuse(format!(
            "it is of step {}, past --steps {}",
            state.step, setup.args.steps
        )));
    }
    let tensors = state::read_tensors(valid, &state, &setup.specs)
        .map_err(|e| LoadError::Unreadable(e.to_string()))?;
    let world = setup.membership.world_size;
    if state.world_size != world {
        eprintln!(
            "fleetmend train: warning: the checkpoint was written by {} ranks, this run has {world}: the batches differ from an uninterrupted run's",
            state.world_size
        );
    }
    if state.seed != setup.args.seed || state.batch_size != setup.args.batch_size {
        eprintln!(
            "fleetmend train: warning: the checkpoint has seed {} and batch size {}, this run {} and {}: training goes on with this run's",
            state.seed, state.batch_size, setup.args.seed, setup.args.batch_size
        );
    }
    if &state.data != setup.corpus.source() {
        eprintln!(
            "fleetmend train: warning: the checkpoint was trained on other data ({:?})",
            state.data
        );
    }
    Ok(StartPoint {
        step: state.step,
        tensors,
        optimizer: AdamW { config: setup.optimizer, t: state.adam_t },
        loss: state.loss,
        checkpoint_step: Some(state.step),
    })
}

fn describe(config: &ModelConfig) -> String {
    format!(
        "--model-dim {} --layers {} --heads {} --context {}",
        config.model_dim, config.layers, config.heads, config.context
    )
}

/// What rank 0 sends the others before the first step.
#[derive(serde::Serialize, serde::Deserialize)]
struct StartMessage {
    /// Rank 0's model: every rank must train the same one.
    model: ModelConfig,
    batch_size: usize,
    seed: u64,
    /// A refusal to resume, which every rank reports.
    refused: Option<(String, String)>,
    /// The step resumed from, with the loss there and AdamW's step count; the tensors follow.
    resume: Option<(u64, f32, u64, Option<u64>)>,
}

/// Rank 0's start point (fresh or resumed) on every rank; a world of one just uses its own.
fn share_start_point(
    setup: &Setup,
    comm: Option<&mut Communicator>,
    resume: Result<Option<StartPoint>, TrainError>,
) -> Result<StartPoint, TrainError> {
    let fresh = || StartPoint {
        step: 0,
        tensors: TrainTensors::fresh(model::initial_params(&setup.config, setup.args.seed)),
        optimizer: AdamW::new(setup.optimizer),
        loss: f32::NAN,
        checkpoint_step: None,
    };
    let Some(comm) = comm else {
        return resume.map(|point| point.unwrap_or_else(fresh));
    };
    let rank = setup.membership.rank;
    let collective =
        |source| TrainError::Collective { rank, what: "sharing the start point", step: 0, source };
    let mut payload = Vec::new();
    let mut header = [0u8; 8];
    if rank == 0 {
        let (refused, resume_info, tensors) = match &resume {
            Err(TrainError::ResumeRefused { path, reason }) => {
                (Some((path.clone(), reason.clone())), None, None)
            }
            Err(other) => (Some((String::from("checkpoints"), other.to_string())), None, None),
            Ok(None) => (None, None, None),
            Ok(Some(point)) => (
                None,
                Some((point.step, point.loss, point.optimizer.t, point.checkpoint_step)),
                Some(point),
            ),
        };
        let message = StartMessage {
            model: setup.config,
            batch_size: setup.args.batch_size,
            seed: setup.args.seed,
            refused,
            resume: resume_info,
        };
        let json = serde_json::to_vec(&message).unwrap_or_default();
        payload.extend_from_slice(&(json.len() as u64).to_le_bytes());
        payload.extend_from_slice(&json);
        if let Some(point) = tensors {
            let tensors = &point.tensors;
            for values in [&tensors.params, &tensors.m, &tensors.v] {
                values.iter().for_each(|x| payload.extend_from_slice(&x.to_le_bytes()));
            }
        }
        header = (payload.len() as u64).to_le_bytes();
    }
    comm.broadcast(0, &mut header).map_err(collective)?;
    if rank != 0 {
        payload = vec![0u8; u64::from_le_bytes(header) as usize];
    }
    comm.broadcast(0, &mut payload).map_err(collective)?;
    if rank == 0 {
        return resume.map(|point| point.unwrap_or_else(fresh));
    }
    let garbled = || TrainError::ReadCheckpoint("rank 0 sent a garbled start point".to_string());
    let json_len = payload
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(garbled)? as usize;
    let json_bytes = payload.get(8..8 + json_len).ok_or_else(garbled)?;
    let message: StartMessage = serde_json::from_slice(json_bytes).map_err(|_| garbled())?;
    if let Some((path, reason)) = message.refused {
        return Err(TrainError::ResumeRefused { path, reason: format!("rank 0: {reason}") });
    }
    let mut problems = Vec::new();
    if message.model != setup.config {
        problems.push(format!(
            "model flags: rank 0 has {}, this rank {}",
            describe(&message.model),
            describe(&setup.config)
        ));
    }
    if message.batch_size != setup.args.batch_size {
        problems.push(format!(
            "--batch-size: rank 0 has {}, this rank {}",
            message.batch_size, setup.args.batch_size
        ));
    }
    if message.seed != setup.args.seed {
        problems
            .push(format!("--seed: rank 0 has {}, this rank {}", message.seed, setup.args.seed));
    }
    if !problems.is_empty() {
        return Err(TrainError::InvalidSetup { problems });
    }
    let Some((step, loss, adam_t, checkpoint_step)) = message.resume else {
        return Ok(fresh());
    };
    let n = setup.config.param_count();
    let floats: Vec<f32> = payload[8 + json_len..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if floats.len() != 3 * n {
        return Err(garbled());
    }
    Ok(StartPoint {
        step,
        tensors: TrainTensors {
            params: floats[..n].to_vec(),
            m: floats[n..2 * n].to_vec(),
            v: floats[2 * n..].to_vec(),
        },
        optimizer: AdamW { config: setup.optimizer, t: adam_t },
        loss,
        checkpoint_step,
    })
}
