//! `fleetmend train`: the bundled data-parallel trainer (a small GPT-style byte-level language
//! model on candle), speaking the checkpoint protocol (`docs/checkpoint-protocol.md`).
//!
//! Every rank runs the same loop. At each step it computes the loss and gradients of its own
//! batch, gathers the gradients into one flat vector in the model's fixed parameter order, and
//! appends control values: "checkpoint requested" (SIGUSR1 here, or rank 0's interval), "stop
//! requested" (SIGTERM here), rank 0's newest committed checkpoint and this rank's loss. One
//! deterministic ring all-reduce sums all of it, so every rank gets the same averaged gradients
//! and sees the same control sums: a signal delivered to one rank becomes a decision of every rank
//! at the same step boundary. AdamW (on flat vectors, see [`optim`]) then updates identical
//! weights on every rank.
//!
//! Only rank 0 writes checkpoints: at the step boundary it copies the weights and optimizer
//! state in memory (the training stall) and a background thread writes them while training goes
//! on (at most one write in flight). On start, rank 0 resumes from the newest checkpoint that
//! verifies and sends it to the other ranks, so ranks agree on the step even when only rank 0
//! sees the checkpoint directory.
//!
//! # Determinism
//!
//! For a given seed and world size a resumed run ends with bit-identical weights to an
//! uninterrupted one: the initial weights and every batch are pure functions of (seed, step,
//! rank, world size); candle's CPU kernels compute each output element in a fixed order (its
//! threaded kernels, gemm's matmul and the large element-wise maps, split the outputs between
//! threads, never a sum: runs with 1, 2 and 3 threads gave the same weights bit for bit); the
//! all-reduce sums in a fixed order; AdamW is plain scalar code; and a checkpoint stores the exact
//! bits of the weights and of AdamW's state. The thread count per rank (`--threads`) therefore
//! changes speed, not results. Across CPU models gemm's kernels and cache blocking may differ, so resume on the same
//! kind of machine for bit-exact results; CUDA kernels make no such promise.
//!
//! # Parts
//!
//! `setup` checks the flags and the environment, `signals` turns signals into flags, `start`
//! resumes rank 0 and shares its start point, `step_loop` runs the steps, `checkpointing` is rank
//! 0's background writer; `data`, `model`, `optim` and `state` are the corpus, the model, AdamW and
//! the checkpoint's contents; `progress` and `telemetry` report to the queue and the collector.

mod checkpointing;
pub mod data;
pub mod model;
pub mod optim;
mod progress;
mod setup;
mod signals;
mod start;
pub mod state;
mod step_loop;
pub mod telemetry;

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use serde_json::json;

use crate::collective::CollectiveError;
use setup::{pin_compute_threads, setup};
use signals::Signals;
use step_loop::train;
use telemetry::{RunIdentity, TrainTelemetry};

/// Exit code of a run that failed while training (a peer died, a step failed).
const EXIT_FAILED: u8 = 1;
/// Exit code of a run that could not start (bad flags or environment, a checkpoint of another
/// model).
const EXIT_CANNOT_RUN: u8 = 2;

/// The flags of `fleetmend train`.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// Steps to train in all (a resumed run counts the steps before it).
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Seed of the initial weights, the synthetic corpus and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Train on this file's bytes instead of the synthetic corpus generated from the seed.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Width of the model.
    #[arg(long, default_value_t = 64)]
    pub model_dim: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Attention heads per block.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Bytes per training sequence.
    #[arg(long, default_value_t = 64)]
    pub context: usize,
    /// Sequences per rank per step.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Where checkpoints are written and resumed from; none when unset.
    #[arg(long, env = "FLEETMEND_CHECKPOINT_DIR", value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps (0: only on signals and at the end), or `auto`: every 100 steps
    /// until the queue's reply to a progress post sets the interval.
    #[arg(long, default_value = "auto", value_name = "N|auto")]
    pub checkpoint_every: CheckpointEvery,
    /// Checkpoints kept (older ones are removed after each new one).
    #[arg(long, default_value_t = 3)]
    pub keep: usize,
    /// CPU threads per rank for candle's kernels. Results do not depend on it. More than 1
    /// pays only for large models: with the default model 2 threads took ~3.5× the CPU time of 1
    /// for no gain (gemm's split of small matrices and candle's spinning element-wise workers),
    /// and ranks sharing a machine share its cores anyway.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// How long a collective waits for a peer before failing (a dead peer fails sooner).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub collective_timeout: Duration,
    /// How long ranks wait for each other at the start.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub rendezvous_timeout: Duration,
    /// Each step takes at least this long (0s: as long as its compute). A rank waits out the
    /// rest of the step after computing its gradients, standing in for a GPU's step time where
    /// many simulated nodes share one machine's CPUs (`fleetmend up`): the job keeps a GPU's
    /// pace on little CPU. The wait counts as compute time; results do not depend on it.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub pace: Duration,
    /// Progress lines (and posts) at most this often; 0s: every step.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub progress_interval: Duration,
    /// Where to compute.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// Export traces of checkpoints and restores to this OTLP/gRPC collector
    /// (`http://host:4317`); none when unset. See `docs/checkpoint-protocol.md`, "Traces".
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

/// `--checkpoint-every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointEvery {
    /// Every N steps (0: never on a schedule).
    Steps(u64),
    /// As the queue says (a fallback interval until it does).
    Auto,
}

impl FromStr for CheckpointEvery {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "auto" {
            return Ok(CheckpointEvery::Auto);
        }
        text.parse()
            .map(CheckpointEvery::Steps)
            .map_err(|_| format!("{text:?} is neither a number of steps nor `auto`"))
    }
}

impl fmt::Display for CheckpointEvery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointEvery::Steps(n) => write!(f, "{n}"),
            CheckpointEvery::Auto => f.write_str("auto"),
        }
    }
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceKind {
    /// The CPU (candle's CPU backend).
    Cpu,
    /// An NVIDIA GPU (the `cuda` cargo feature), the one of `LOCAL_RANK`.
    Cuda,
}

/// Training failed or could not start.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Flags or environment are unusable.
    #[error("invalid setup: {}", .problems.join("; "))]
    InvalidSetup {
        /// One line per problem, naming the flag or variable.
        problems: Vec<String>,
    },
    /// The checkpoint cannot be resumed by this run.
    #[error("cannot resume {path}: {reason}")]
    ResumeRefused {
        /// The checkpoint.
        path: String,
        /// Why.
        reason: String,
    },
    /// The checkpoint directory or a checkpoint could not be read.
    #[error("reading checkpoints: {0}")]
    ReadCheckpoint(String),
    /// The ranks could not meet.
    #[error("rank {rank}: meeting the other ranks: {reason}")]
    Rendezvous {
        /// This rank.
        rank: usize,
        /// Why.
        reason: String,
    },
    /// A collective failed: a peer died, hung or sent garbage.
    #[error("rank {rank}: {what} at step {step} failed: {source}")]
    Collective {
        /// This rank.
        rank: usize,
        /// Which exchange.
        what: &'static str,
        /// The step.
        step: u64,
        /// The failure (names the suspect peer).
        source: CollectiveError,
    },
    /// The model's computation failed.
    #[error("rank {rank}: step {step}: {source}")]
    Compute {
        /// This rank.
        rank: usize,
        /// The step.
        step: u64,
        /// candle's error.
        source: candle_core::Error,
    },
    /// Writing the checkpoint a stop needed failed.
    #[error("rank 0: checkpoint of step {step} failed: {reason}")]
    Checkpoint {
        /// The step.
        step: u64,
        /// Why.
        reason: String,
    },
    /// A thread could not be started.
    #[error("starting the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

impl TrainError {
    fn exit_code(&self) -> u8 {
        match self {
            TrainError::InvalidSetup { .. } | TrainError::ResumeRefused { .. } => EXIT_CANNOT_RUN,
            _ => EXIT_FAILED,
        }
    }
}

/// Runs the trainer; the exit code follows the checkpoint protocol (0 = done or stopped cleanly).
pub fn main(args: TrainArgs) -> ExitCode {
    pin_compute_threads(args.threads.max(1));
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fleetmend train: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

fn run(args: TrainArgs) -> Result<(), TrainError> {
    let signals = Signals::register()?;
    let setup = setup(args)?;
    let telemetry = match setup.args.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
        None => None,
        Some(endpoint) => {
            let identity = RunIdentity {
                job_id: setup.job_id.clone(),
                rank: setup.membership.rank,
                world_size: setup.membership.world_size,
                attempt: setup.attempt,
            };
            let telemetry = TrainTelemetry::start(endpoint, identity).map_err(|err| {
                TrainError::InvalidSetup {
                    problems: vec![format!("--otlp-endpoint/OTEL_EXPORTER_OTLP_ENDPOINT: {err}")],
                }
            })?;
            Some(telemetry)
        }
    };
    let result = train(setup, &signals, telemetry.as_ref());
    // Every way out of training (done, stopped, failed) passes here.
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    result
}

fn emit_done(step: u64, loss: f32, params: &[f32]) {
    emit(&json!({
        "event": "done",
        "step": step,
        "loss": loss,
        "weights_sha256": state::weights_sha256(params),
    }));
}

/// One JSON line on stdout. A closed stdout must not stop training.
fn emit(value: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}
