//! What a trainer checkpoint holds and how it is written and read back.
//!
//! A checkpoint (`step-<N>/`, written through [`CheckpointWriter`]) has three files:
//! - `model.safetensors`: every parameter by name (f32);
//! - `optimizer.safetensors`: AdamW's first and second moments, `m.<name>` and `v.<name>`;
//! - `state.json` ([`TrainState`]): step, seed, world size, data cursor and RNG description, Adam's
//!   step count and hyperparameters, the model's shape, the data source, the last loss and the
//!   weights hash.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::data::DataSource;
use super::model::{ModelConfig, ParamSpec};
use super::optim::{AdamWConfig, TrainTensors};
use crate::checkpoint::{
    AddCheckpointFileError, BeginCheckpointError, CheckpointWriter, CommitCheckpointError,
    LoadedCheckpoint,
};
use std::sync::Arc;

/// The parameters.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer's moments.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Everything else, as JSON.
pub const STATE_FILE: &str = "state.json";
/// The `state.json` format this code writes and reads.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainState {
    /// [`STATE_FORMAT_VERSION`].
    pub format_version: u32,
    /// Steps completed; the resumed run starts at `step + 1`.
    pub step: u64,
    /// The run's seed.
    pub seed: u64,
    /// Ranks that trained it (the batches depend on it).
    pub world_size: usize,
    /// Sequences per rank per step.
    pub batch_size: usize,
    /// Where the next batch comes from: batches are a pure function of (seed, step, rank, world
    /// size), so this is the step.
    pub data_cursor: u64,
    /// The random state: how batches are drawn.
    pub rng: RngState,
    /// AdamW's step count.
    pub adam_t: u64,
    /// AdamW's hyperparameters.
    pub optimizer: AdamWConfig,
    /// The model's shape; a run with another one refuses to resume.
    pub model: ModelConfig,
    /// The corpus.
    pub data: DataSource,
    /// Mean loss over the ranks at `step`.
    pub loss: f32,
    /// SHA-256 of the parameters (f32 little-endian, in the fixed order), lowercase hex.
    pub weights_sha256: String,
}

/// How batches are drawn (recorded so a reader of the checkpoint knows the data position).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngState {
    /// The generator.
    pub algorithm: String,
    /// Its seed.
    pub seed: u64,
    /// How the state at a step is derived.
    pub derivation: String,
}

impl RngState {
    /// The trainer's (stateless) batch generator for `seed`.
    pub fn for_seed(seed: u64) -> Self {
        RngState {
            algorithm: "splitmix64".to_string(),
            seed,
            derivation: "the start of row r of rank k at step s is mix64(mix64(seed ^ C) ^ \
                         (((s - 1) * world_size + k) * batch_size + r)) mod (corpus length - \
                         context); no state carries from step to step"
                .to_string(),
        }
    }
}

/// What a checkpoint writes, taken at a step boundary: the tensors are shared, not copied
/// (training updates the next step into other buffers).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `state.json`.
    pub state: TrainState,
    /// Parameters and AdamW's moments at `state.step`.
    pub tensors: Arc<TrainTensors>,
}

/// SHA-256 of `params` as f32 little-endian bytes, lowercase hex.
pub fn weights_sha256(params: &[f32]) -> String {
    let mut hasher = Sha256::new();
    // In blocks: one update per float is slow.
    let mut block = Vec::with_capacity(4 * 4096);
    for chunk in params.chunks(4096) {
        block.clear();
        chunk.iter().for_each(|x| block.extend_from_slice(&x.to_le_bytes()));
        hasher.update(&block);
    }
    hex::encode(hasher.finalize())
}

/// Writing a checkpoint failed (nothing was committed).
#[derive(Debug, thiserror::Error)]
pub enum WriteTrainCheckpointError {
    /// Encoding a file failed.
    #[error("cannot encode {file} of the checkpoint of step {step}: {reason}")]
    Encode {
        /// The step.
        step: u64,
        /// The file.
        file: &'static str,
        /// Why.
        reason: String,
    },
    /// See [`BeginCheckpointError`].
    #[error(transparent)]
    Begin(#[from] BeginCheckpointError),
    /// See [`AddCheckpointFileError`].
    #[error(transparent)]
    Add(#[from] AddCheckpointFileError),
    /// See [`CommitCheckpointError`].
    #[error(transparent)]
    Commit(#[from] CommitCheckpointError),
}

/// A committed checkpoint.
#[derive(Debug, Clone)]
pub struct Written {
    /// Its step.
    pub step: u64,
    /// Its directory.
    pub path: PathBuf,
    /// Bytes written (all files).
    pub bytes: u64,
    /// Seconds from begin to commit (encoding, writing, fsync, rename).
    pub seconds: f64,
}

/// Writes `snapshot` as the checkpoint of its step in `checkpoint_dir`.
pub fn write_checkpoint(
    checkpoint_dir: &Path,
    job_id: &str,
    specs: &[ParamSpec],
    snapshot: &Snapshot,
) -> Result<Written, WriteTrainCheckpointError> {
    let started = Instant::now();
    let step = snapshot.state.step;
    let world = u32::try_from(snapshot.state.world_size).unwrap_or(u32::MAX);
    let tensors = &snapshot.tensors;
    let model = encode_tensors(specs, &[("", &tensors.params)])
        .map_err(|reason| WriteTrainCheckpointError::Encode { step, file: MODEL_FILE, reason })?;
    let optimizer =
        encode_tensors(specs, &[("m.", &tensors.m), ("v.", &tensors.v)]).map_err(|reason| {
            WriteTrainCheckpointError::Encode { step, file: OPTIMIZER_FILE, reason }
        })?;
    let state = serde_json::to_vec_pretty(&snapshot.state).map_err(|e| {
        WriteTrainCheckpointError::Encode { step, file: STATE_FILE, reason: e.to_string() }
    })?;
    let mut writer = CheckpointWriter::begin(checkpoint_dir, step, world, job_id)?;
    // Side by side: each file's SHA-256 runs on its own thread while the others are written.
    writer.add_files(&[
        (MODEL_FILE, &model),
        (OPTIMIZER_FILE, &optimizer),
        (STATE_FILE, &state),
    ])?;
    let path = writer.commit()?;
    Ok(Written {
        step,
        path,
        bytes: (model.len() + optimizer.len() + state.len()) as u64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One safetensors file of the flat vectors `groups` (prefix, values), cut by `specs`.
fn encode_tensors(specs: &[ParamSpec], groups: &[(&str, &[f32])]) -> Result<Vec<u8>, String> {
    let mut tensors = Vec::new();
    for (prefix, values) in groups {
        let mut offset = 0;
        for spec in specs {
            let part = values.get(offset..offset + spec.len()).ok_or("vector too short")?;
            let bytes: Vec<u8> = part.iter().flat_map(|x| x.to_le_bytes()).collect();
            tensors.push((format!("{prefix}{}", spec.name), spec.shape.clone(), bytes));
            offset += spec.len();
        }
    }
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|view| (name.clone(), view))
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}

/// Reading a checkpoint back failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadTrainCheckpointError {
    /// A file's contents are not what this trainer writes.
    #[error("checkpoint {path}: {file}: {reason}")]
    Invalid {
        /// The checkpoint directory.
        path: PathBuf,
        /// The file.
        file: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Reads `state.json`, the parameters and the moments of a verified checkpoint, checking every
/// tensor against `specs` (the caller compares the model configuration first, for a clear error).
pub fn read_state(checkpoint: &LoadedCheckpoint) -> Result<TrainState, ReadTrainCheckpointError> {
    let invalid = |file, reason: String| ReadTrainCheckpointError::Invalid {
        path: checkpoint.checkpoint.path.clone(),
        file,
        reason,
    };
    let bytes = file(checkpoint, STATE_FILE)?;
    let state: TrainState =
        serde_json::from_slice(bytes).map_err(|e| invalid(STATE_FILE, e.to_string()))?;
    if state.format_version != STATE_FORMAT_VERSION {
        return Err(invalid(
            STATE_FILE,
            format!(
                "format version {} (this trainer reads {STATE_FORMAT_VERSION})",
                state.format_version
            ),
        ));
    }
    if state.step != checkpoint.step() {
        return Err(invalid(
            STATE_FILE,
            format!("step {} but the directory is of step {}", state.step, checkpoint.step()),
        ));
    }
    Ok(state)
}

/// Reads the parameters and AdamW's moments (flat, fixed order) of a checkpoint whose model
/// matches `specs`; checks the parameters against the recorded hash.
pub fn read_tensors(
    checkpoint: &LoadedCheckpoint,
    state: &TrainState,
    specs: &[ParamSpec],
) -> Result<TrainTensors, ReadTrainCheckpointError> {
    let invalid = |file, reason: String| ReadTrainCheckpointError::Invalid {
        path: checkpoint.checkpoint.path.clone(),
        file,
        reason,
    };
    let model = file(checkpoint, MODEL_FILE)?;
    let params = decode_tensors(model, specs, "").map_err(|r| invalid(MODEL_FILE, r))?;
    if weights_sha256(&params) != state.weights_sha256 {
        return Err(invalid(MODEL_FILE, "the weights do not match state.json's hash".into()));
    }
    let optimizer = file(checkpoint, OPTIMIZER_FILE)?;
    let m = decode_tensors(optimizer, specs, "m.").map_err(|r| invalid(OPTIMIZER_FILE, r))?;
    let v = decode_tensors(optimizer, specs, "v.").map_err(|r| invalid(OPTIMIZER_FILE, r))?;
    Ok(TrainTensors { params, m, v })
}

/// A file of a loaded checkpoint (read and verified once, by `checkpoint::load`).
fn file<'a>(
    checkpoint: &'a LoadedCheckpoint,
    name: &'static str,
) -> Result<&'a [u8], ReadTrainCheckpointError> {
    checkpoint.file(name).ok_or_else(|| ReadTrainCheckpointError::Invalid {
        path: checkpoint.checkpoint.path.clone(),
        file: name,
        reason: "not in the manifest".to_owned(),
    })
}

fn decode_tensors(bytes: &[u8], specs: &[ParamSpec], prefix: &str) -> Result<Vec<f32>, String> {
    let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let mut flat = Vec::with_capacity(specs.iter().map(ParamSpec::len).sum());
    for spec in specs {
        let name = format!("{prefix}{}", spec.name);
        let view = file.tensor(&name).map_err(|e| format!("{name}: {e}"))?;
        if view.dtype() != safetensors::Dtype::F32 || view.shape() != spec.shape.as_slice() {
            return Err(format!(
                "{name}: {:?} {:?}, expected F32 {:?}",
                view.dtype(),
                view.shape(),
                spec.shape
            ));
        }
        flat.extend(
            view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    Ok(flat)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::model::{VOCAB, initial_params};

    #[test]
    fn a_snapshot_round_trips_bit_for_bit() {
        let config = ModelConfig { vocab: VOCAB, model_dim: 8, layers: 1, heads: 2, context: 4 };
        let specs = config.param_specs();
        let params = initial_params(&config, 5);
        let m: Vec<f32> = params.iter().map(|p| p * 0.5 + f32::MIN_POSITIVE).collect();
        let v: Vec<f32> = params.iter().map(|p| p * p).collect();
        let state = TrainState {
            format_version: STATE_FORMAT_VERSION,
            step: 12,
            seed: 5,
            world_size: 4,
            batch_size: 2,
            data_cursor: 12,
            rng: RngState::for_seed(5),
            adam_t: 12,
            optimizer: AdamWConfig::with_lr(0.003),
            model: config,
            data: DataSource::Synthetic { bytes: 100 },
            loss: 2.5,
            weights_sha256: weights_sha256(&params),
        };
        let snapshot =
            Snapshot { state: state.clone(), tensors: Arc::new(TrainTensors { params, m, v }) };
        let dir = tempfile::tempdir().unwrap();
        let written = write_checkpoint(dir.path(), "job", &specs, &snapshot).unwrap();
        assert_eq!(written.step, 12);
        let valid = crate::checkpoint::load(&written.path).unwrap();
        assert_eq!(valid.checkpoint.world_size(), 4);
        let read = read_state(&valid).unwrap();
        assert_eq!(read, state);
        let TrainTensors { params: p, m, v } = read_tensors(&valid, &read, &specs).unwrap();
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&p), bits(&snapshot.tensors.params));
        assert_eq!(bits(&m), bits(&snapshot.tensors.m));
        assert_eq!(bits(&v), bits(&snapshot.tensors.v));
    }
}
