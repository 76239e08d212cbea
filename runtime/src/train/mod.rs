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

pub mod data;
pub mod model;
pub mod optim;
mod progress;
pub mod state;
pub mod telemetry;

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use candle_core::Device;
use fleetmend_proto::jobs::{PROGRESS_TOKEN_VAR, PROGRESS_URL_VAR, Progress};
use serde_json::json;

use crate::checkpoint::{self, LoadedCheckpoint};
use crate::collective::{
    CollectiveConfig, CollectiveError, CollectiveWatch, Communicator, Membership,
};
use data::{BatchSpec, Corpus};
use model::{Gpt, ModelConfig, ParamSpec, VOCAB};
use optim::{AdamW, AdamWConfig, TrainTensors};
use state::{RngState, STATE_FORMAT_VERSION, Snapshot, TrainState, Written};
use telemetry::{
    CheckpointRecord, RestoreRecord, RunIdentity, SkippedCheckpoint, TrainTelemetry, Trigger,
    WrittenRecord,
};

/// Exit code of a run that failed while training (a peer died, a step failed).
const EXIT_FAILED: u8 = 1;
/// Exit code of a run that could not start (bad flags or environment, a checkpoint of another
/// model).
const EXIT_CANNOT_RUN: u8 = 2;
/// `--checkpoint-every auto` checkpoints this often until the queue says otherwise.
const AUTO_FALLBACK_EVERY: u64 = 100;
/// Longest wait at exit for the last progress post.
const FINAL_POST_LIMIT: Duration = Duration::from_secs(3);
/// Control values appended to the gradients: checkpoint requested, stop requested, rank 0's
/// newest committed checkpoint step + 1 (high and low halves, so it is exact in f32), loss.
const CONTROL_VALUES: usize = 5;
/// The committed step is sent as `hi · 2²⁰ + lo`: both halves are exact in f32 (< 2²⁴).
const STEP_SPLIT: u64 = 1 << 20;

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

/// The signals, as flags the training loop reads at each step.
struct Signals {
    /// SIGUSR1 since the last step.
    checkpoint: Arc<AtomicBool>,
    /// SIGTERM or SIGINT at any time.
    stop: Arc<AtomicBool>,
    /// While set (before training starts: rendezvous, resume), SIGTERM exits at once with 0:
    /// there is no progress to save yet.
    starting: Arc<AtomicBool>,
    /// SIGUSR2 since the last step: the fault hook `fleetmend inject NODE nan` uses. The rank's
    /// next gradient gets a NaN, as a bad batch or silent data corruption would give it; the
    /// all-reduce spreads it to every rank's weights and the loss goes NaN from the step after.
    poison: Arc<AtomicBool>,
}

impl Signals {
    fn register() -> Result<Self, TrainError> {
        use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
        let signals = Signals {
            checkpoint: Arc::new(AtomicBool::new(false)),
            stop: Arc::new(AtomicBool::new(false)),
            starting: Arc::new(AtomicBool::new(true)),
            poison: Arc::new(AtomicBool::new(false)),
        };
        let problem = |e: std::io::Error| TrainError::InvalidSetup {
            problems: vec![format!("registering signal handlers: {e}")],
        };
        for signal in [SIGTERM, SIGINT] {
            signal_hook::flag::register_conditional_shutdown(signal, 0, signals.starting.clone())
                .map_err(problem)?;
            signal_hook::flag::register(signal, signals.stop.clone()).map_err(problem)?;
        }
        signal_hook::flag::register(SIGUSR1, signals.checkpoint.clone()).map_err(problem)?;
        signal_hook::flag::register(SIGUSR2, signals.poison.clone()).map_err(problem)?;
        Ok(signals)
    }
}

/// Everything a rank's run is made of, settled before the first step.
struct Setup {
    args: TrainArgs,
    membership: Membership,
    job_id: String,
    attempt: u32,
    config: ModelConfig,
    specs: Vec<ParamSpec>,
    optimizer: AdamWConfig,
    corpus: Corpus,
    device: Device,
    threads: usize,
    checkpoint_dir: Option<PathBuf>,
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

/// Set to the thread count once the trainer re-executed itself with it (so it never loops).
const THREADS_PINNED_VAR: &str = "FLEETMEND_TRAIN_THREADS_PINNED";

/// candle sizes its CPU thread pools from `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS` (else the
/// number of cores), read when first used, and its element-wise pool's idle workers spin: four
/// ranks on two cores, each with spinning workers, ran ~5× slower. The environment of a running
/// process cannot be changed safely, so the trainer replaces itself (same pid, so the launcher's
/// signals still reach it) with the variables set. Returns only when no re-exec is needed or it
/// failed (then candle's defaults apply: slower, same results).
fn pin_compute_threads(threads: usize) {
    let want = threads.to_string();
    let set = |name: &str| std::env::var(name).is_ok_and(|v| v == want);
    if set("CANDLE_NUM_THREADS") && set("RAYON_NUM_THREADS") {
        return;
    }
    if std::env::var_os(THREADS_PINNED_VAR).is_some() {
        eprintln!(
            "fleetmend train: warning: CANDLE_NUM_THREADS/RAYON_NUM_THREADS differ from --threads {threads} after re-executing; going on with them"
        );
        return;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!(
                "fleetmend train: warning: cannot find this executable to pin {threads} compute threads ({err}); going on with candle's default"
            );
            return;
        }
    };
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env("CANDLE_NUM_THREADS", &want)
        .env("RAYON_NUM_THREADS", &want)
        .env(THREADS_PINNED_VAR, &want)
        .exec();
    eprintln!(
        "fleetmend train: warning: cannot re-execute {} to pin {threads} compute threads ({err}); going on with candle's default",
        exe.display()
    );
}

fn setup(args: TrainArgs) -> Result<Setup, TrainError> {
    let config = ModelConfig {
        vocab: VOCAB,
        model_dim: args.model_dim,
        layers: args.layers,
        heads: args.heads,
        context: args.context,
    };
    let mut problems = config.problems();
    if args.batch_size == 0 {
        problems.push("--batch-size: must be at least 1".to_string());
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        problems.push(format!("--lr: {} is not a positive number", args.lr));
    }
    if args.keep == 0 {
        problems.push("--keep: must be at least 1".to_string());
    }
    if args.threads == 0 {
        problems.push("--threads: must be at least 1".to_string());
    }
    if args.collective_timeout < Duration::from_millis(10) {
        problems.push("--collective-timeout: must be at least 10ms".to_string());
    }
    if args.rendezvous_timeout.is_zero() {
        problems.push("--rendezvous-timeout: must be more than 0".to_string());
    }
    // Without RANK and WORLD_SIZE this is a run of one.
    let membership = match Membership::from_env() {
        Ok(membership) => Some(membership),
        Err(err) => {
            problems.extend(err.problems);
            None
        }
    };
    let device = match args.device {
        DeviceKind::Cpu => Some(Device::Cpu),
        DeviceKind::Cuda => cuda_device(&mut problems),
    };
    let corpus = match &args.data {
        None => Some(Corpus::synthetic(args.seed)),
        Some(path) => match Corpus::from_file(path, args.context) {
            Ok(corpus) => Some(corpus),
            Err(err) => {
                problems.push(format!("--data: {err}"));
                None
            }
        },
    };
    let (Some(membership), Some(device), Some(corpus)) = (membership, device, corpus) else {
        return Err(TrainError::InvalidSetup { problems });
    };
    if !problems.is_empty() {
        return Err(TrainError::InvalidSetup { problems });
    }
    let threads = args.threads;
    let job_id = std::env::var("FLEETMEND_JOB_ID")
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| "local".to_string());
    let attempt = std::env::var("FLEETMEND_RESTART_COUNT")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let checkpoint_dir = args.checkpoint_dir.clone().filter(|d| !d.as_os_str().is_empty());
    Ok(Setup {
        optimizer: AdamWConfig::with_lr(args.lr),
        specs: config.param_specs(),
        args,
        membership,
        job_id,
        attempt,
        config,
        corpus,
        device,
        threads,
        checkpoint_dir,
    })
}

#[cfg(feature = "cuda")]
fn cuda_device(problems: &mut Vec<String>) -> Option<Device> {
    let ordinal = std::env::var("LOCAL_RANK").ok().and_then(|n| n.parse().ok()).unwrap_or(0);
    match Device::new_cuda(ordinal) {
        Ok(device) => Some(device),
        Err(err) => {
            problems.push(format!("--device cuda: GPU {ordinal}: {err}"));
            None
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(problems: &mut Vec<String>) -> Option<Device> {
    problems.push(
        "--device cuda: this fleetmend was built without CUDA (rebuild with `--features cuda`)"
            .to_string(),
    );
    None
}

/// Where training starts: fresh, or from a checkpoint.
struct StartPoint {
    step: u64,
    tensors: TrainTensors,
    optimizer: AdamW,
    loss: f32,
    /// The checkpoint resumed, if any.
    checkpoint_step: Option<u64>,
}

fn train(
    setup: Setup,
    signals: &Signals,
    telemetry: Option<&TrainTelemetry>,
) -> Result<(), TrainError> {
    let rank = setup.membership.rank;
    let world = setup.membership.world_size;
    let args = &setup.args;
    // Rank 0 reads the checkpoint before meeting the others: a refusal reaches them as a message.
    let resume = if rank == 0 {
        let mut restore = RestoreRecord::begin("checkpoint");
        let resume = find_resume_point(&setup, &mut restore);
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
    let mut comm = if world > 1 {
        let config = CollectiveConfig {
            rendezvous_timeout: args.rendezvous_timeout,
            collective_timeout: args.collective_timeout,
            ..CollectiveConfig::default()
        };
        Some(
            Communicator::connect(&setup.membership, &config)
                .map_err(|e| TrainError::Rendezvous { rank, reason: e.to_string() })?,
        )
    } else {
        None
    };
    let start = if rank == 0 {
        share_start_point(&setup, comm.as_mut(), resume)?
    } else {
        let mut restore = RestoreRecord::begin("rank 0");
        let start = share_start_point(&setup, comm.as_mut(), resume);
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
    // The state of the newest step, shared with a checkpoint being written; the next step is
    // computed into a spare buffer (a recycled older state) and replaces it.
    let mut current = Arc::new(start.tensors);
    let mut spares: Vec<TrainTensors> = Vec::new();
    let mut optimizer = start.optimizer;
    let start_step = start.step;
    let mut done_loss = start.loss;
    // Set once a non-finite gradient or loss has reached the weights.
    let mut lost = false;

    emit(&json!({
        "event": "start",
        "rank": rank,
        "world_size": world,
        "start_step": start_step,
        "steps": args.steps,
        "params": current.params.len(),
        "threads": setup.threads,
        "device": format!("{:?}", args.device).to_lowercase(),
        "checkpoint_dir": setup.checkpoint_dir,
    }));
    if start_step >= args.steps {
        signals.starting.store(false, Ordering::SeqCst);
        emit_done(args.steps, done_loss, &current.params);
        return Ok(());
    }

    let model = Gpt::new(setup.config, &current.params, &setup.device)
        .map_err(|source| TrainError::Compute { rank, step: start_step, source })?;
    let writer = match (&setup.checkpoint_dir, rank) {
        (Some(dir), 0) => Some(CheckpointThread::start(
            dir.clone(),
            setup.job_id.clone(),
            setup.specs.clone(),
            args.keep,
        )?),
        _ => None,
    };
    let queue_interval = Arc::new(AtomicU64::new(0));
    let poster =
        progress_poster(queue_interval.clone(), comm.as_ref().and_then(Communicator::watch));
    let mut run = RunState {
        telemetry,
        writer,
        committed: start.checkpoint_step,
        last_write_seconds: None,
        last_stall_seconds: None,
    };
    // From here a SIGTERM is a request to checkpoint and stop at the next step boundary, which
    // every rank must reach together (one rank leaving alone would fail the others).
    signals.starting.store(false, Ordering::SeqCst);

    let batch_spec = BatchSpec {
        seed: args.seed,
        world_size: world,
        batch_size: args.batch_size,
        context: args.context,
    };
    let mut buffer = Vec::with_capacity(current.params.len() + CONTROL_VALUES);
    let mut last_requested = start_step;
    let mut window_start = Instant::now();
    let mut window_steps = 0u64;
    // Seconds of this window spent computing (forward, backward, update) and in the all-reduce.
    let (mut window_compute, mut window_comm) = (0.0f64, 0.0f64);
    let mut last_progress: Option<Instant> = None;
    let result = (|| -> Result<Option<u64>, TrainError> {
        for step in start_step + 1..=args.steps {
            let compute_start = Instant::now();
            let (inputs, targets) = setup.corpus.batch(batch_spec, step, rank);
            buffer.clear();
            let loss = model
                .loss_and_grads(&inputs, &targets, args.batch_size, &mut buffer)
                .map_err(|source| TrainError::Compute { rank, step, source })?;
            // Every gradient: a NaN in a parameter no batch uses (a byte's embedding row) would
            // never reach the loss.
            if signals.poison.swap(false, Ordering::SeqCst) {
                buffer.iter_mut().for_each(|g| *g = f32::NAN);
                emit(&json!({ "event": "poisoned", "rank": rank, "step": step }));
            }
            let periodic = rank == 0
                && run.writer.is_some()
                && interval_due(args.checkpoint_every, &queue_interval, step, last_requested);
            let usr1 = signals.checkpoint.swap(false, Ordering::SeqCst);
            let committed = if rank == 0 { run.committed.map_or(0, |s| s + 1) } else { 0 };
            buffer.extend([
                f32::from(u8::from(usr1 || periodic)),
                f32::from(u8::from(signals.stop.load(Ordering::SeqCst))),
                (committed / STEP_SPLIT) as f32,
                (committed % STEP_SPLIT) as f32,
                loss,
            ]);
            if let Some(rest) = args.pace.checked_sub(compute_start.elapsed()) {
                std::thread::sleep(rest);
            }
            let comm_start = Instant::now();
            window_compute += (comm_start - compute_start).as_secs_f64();
            if let Some(comm) = comm.as_mut() {
                comm.all_reduce_sum(&mut buffer).map_err(|source| TrainError::Collective {
                    rank,
                    what: "gradient all-reduce",
                    step,
                    source,
                })?;
            }
            let update_start = Instant::now();
            window_comm += (update_start - comm_start).as_secs_f64();
            let control = buffer.split_off(buffer.len() - CONTROL_VALUES);
            if world > 1 {
                let w = world as f32;
                buffer.iter_mut().for_each(|g| *g /= w);
            }
            let checkpoint_now = control[0] > 0.0;
            let stop_now = control[1] > 0.0;
            if rank != 0 {
                let committed = control[2] as u64 * STEP_SPLIT + control[3] as u64;
                run.committed = committed.checked_sub(1).or(run.committed);
            }
            done_loss = control[4] / world as f32;
            let mut next = spares.pop().unwrap_or_else(|| TrainTensors::fresh(Vec::new()));
            optimizer.step(&current, &buffer, &mut next);
            let previous = std::mem::replace(&mut current, Arc::new(next));
            // Not unique while a checkpoint still writes it: it is recycled when that is done.
            if let Ok(previous) = Arc::try_unwrap(previous) {
                spares.push(previous);
            }
            model.set_params(&current.params).map_err(|source| TrainError::Compute {
                rank,
                step,
                source,
            })?;
            window_steps += 1;
            window_compute += update_start.elapsed().as_secs_f64();

            // Weights updated with a NaN or infinite gradient, or that gave such a loss, are
            // lost for good: they are never checkpointed, so a restart resumes from the newest
            // checkpoint before them.
            lost |= !done_loss.is_finite() || !buffer.iter().all(|g| g.is_finite());
            let healthy = !lost;
            if (checkpoint_now || stop_now) && !healthy {
                last_requested = step;
                emit(&json!({
                    "event": "checkpoint refused",
                    "rank": rank,
                    "step": step,
                    "reason": "the loss is not finite",
                }));
            } else if checkpoint_now || stop_now {
                last_requested = step;
                let trigger = if stop_now {
                    Trigger::Sigterm
                } else if periodic {
                    Trigger::Interval
                } else {
                    Trigger::Sigusr1
                };
                run.checkpoint(
                    &setup,
                    step,
                    trigger,
                    done_loss,
                    &current,
                    &optimizer,
                    &mut spares,
                )?;
            }
            run.poll_writes(&mut spares);
            let due = last_progress.is_none_or(|at| at.elapsed() >= args.progress_interval);
            if due || stop_now || !healthy || step == args.steps {
                let elapsed = window_start.elapsed().as_secs_f64().max(1e-9);
                let progress = Progress {
                    job: setup.job_id.clone(),
                    attempt: setup.attempt,
                    rank: rank as u32,
                    step,
                    start_step,
                    loss: f64::from(done_loss),
                    samples_per_second: (window_steps * args.batch_size as u64) as f64 / elapsed,
                    checkpoint_step: run.committed,
                    checkpoint_write_seconds: run.last_write_seconds,
                    checkpoint_stall_seconds: run.last_stall_seconds,
                    step_seconds: Some(window_compute / window_steps.max(1) as f64),
                    waiting_for: Vec::new(),
                    at_ms: unix_ms(),
                };
                let per_step = |seconds: f64| seconds / window_steps.max(1) as f64;
                emit_progress(&progress, per_step(window_compute), per_step(window_comm));
                if let Some(poster) = &poster {
                    poster.offer(progress);
                }
                window_start = Instant::now();
                window_steps = 0;
                (window_compute, window_comm) = (0.0, 0.0);
                last_progress = Some(Instant::now());
            }
            if stop_now {
                return Ok(Some(step));
            }
        }
        Ok(None)
    })();

    // The final progress (a rank's last step) is worth a short wait; a dead queue is not.
    if let Some(poster) = poster {
        poster.finish(FINAL_POST_LIMIT);
    }
    match result {
        Ok(stopped_at) => {
            let step = stopped_at.unwrap_or(args.steps);
            // The end of a run is a checkpoint too: a resumed run with the same --steps is done.
            if stopped_at.is_none() && last_requested != step && !lost {
                run.checkpoint(
                    &setup,
                    step,
                    Trigger::Final,
                    done_loss,
                    &current,
                    &optimizer,
                    &mut spares,
                )?;
            }
            let failure = run.finish_writes(&mut spares);
            if let Some(reason) = failure {
                return Err(TrainError::Checkpoint { step, reason });
            }
            match stopped_at {
                Some(step) => emit(&json!({
                    "event": "stopped",
                    "rank": rank,
                    "step": step,
                    "loss": done_loss,
                    "checkpoint_step": run.committed,
                    "weights_sha256": state::weights_sha256(&current.params),
                })),
                None => emit_done(args.steps, done_loss, &current.params),
            }
            Ok(())
        }
        Err(err) => {
            // A checkpoint already being written is finished: it is valid work.
            let _ = run.finish_writes(&mut spares);
            Err(err)
        }
    }
}

/// Whether rank 0's checkpoint interval has come around at `step`.
fn interval_due(every: CheckpointEvery, queue: &AtomicU64, step: u64, last: u64) -> bool {
    let every = match every {
        CheckpointEvery::Steps(n) => n,
        CheckpointEvery::Auto => match queue.load(Ordering::Relaxed) {
            0 => AUTO_FALLBACK_EVERY,
            n => n,
        },
    };
    every > 0 && step.saturating_sub(last) >= every
}

/// The per-run state of checkpointing.
struct RunState<'t> {
    /// Where `checkpoint` spans go, when traces are on.
    telemetry: Option<&'t TrainTelemetry>,
    /// Rank 0's background writer, when checkpoints are on.
    writer: Option<CheckpointThread>,
    /// Newest committed checkpoint (rank 0's, as every rank learns it).
    committed: Option<u64>,
    last_write_seconds: Option<f64>,
    last_stall_seconds: Option<f64>,
}

impl RunState<'_> {
    /// Rank 0: hands the state of `step` to the writer (after the write still in flight, if
    /// any, is done). The tensors are shared, not copied: the stall is the wait and the
    /// bookkeeping. Other ranks: nothing.
    #[allow(clippy::too_many_arguments)]
    fn checkpoint(
        &mut self,
        setup: &Setup,
        step: u64,
        trigger: Trigger,
        loss: f32,
        tensors: &Arc<TrainTensors>,
        optimizer: &AdamW,
        spares: &mut Vec<TrainTensors>,
    ) -> Result<(), TrainError> {
        let Some(writer) = self.writer.as_mut() else {
            return Ok(());
        };
        if self.committed == Some(step) {
            return Ok(());
        }
        let stall = Instant::now();
        let started_at = SystemTime::now();
        let earlier = writer.wait();
        let snapshot = Snapshot {
            state: TrainState {
                format_version: STATE_FORMAT_VERSION,
                step,
                seed: setup.args.seed,
                world_size: setup.membership.world_size,
                batch_size: setup.args.batch_size,
                data_cursor: step,
                rng: RngState::for_seed(setup.args.seed),
                adam_t: optimizer.t,
                optimizer: optimizer.config,
                model: setup.config,
                data: setup.corpus.source().clone(),
                loss,
                // Hashed by the writer: hashing is part of the write, not of the stall.
                weights_sha256: String::new(),
            },
            tensors: Arc::clone(tensors),
        };
        let stall_seconds = stall.elapsed().as_secs_f64();
        writer.submit(snapshot, WriteRequest { stall_seconds, trigger, started_at })?;
        if let Some(done) = earlier {
            self.record(done, spares);
        }
        Ok(())
    }

    fn poll_writes(&mut self, spares: &mut Vec<TrainTensors>) {
        if let Some(done) = self.writer.as_mut().and_then(CheckpointThread::poll) {
            self.record(done, spares);
        }
    }

    /// Waits for the write in flight; the reason of a failed one.
    fn finish_writes(&mut self, spares: &mut Vec<TrainTensors>) -> Option<String> {
        let done = self.writer.as_mut().and_then(CheckpointThread::wait)?;
        let failure = done.outcome.as_ref().err().cloned();
        self.record(done, spares);
        failure
    }

    fn record(&mut self, done: WriteDone, spares: &mut Vec<TrainTensors>) {
        if let Ok(tensors) = Arc::try_unwrap(done.tensors) {
            spares.push(tensors);
        }
        if let Some(telemetry) = self.telemetry {
            telemetry.checkpoint(&CheckpointRecord {
                step: done.step,
                trigger: done.request.trigger,
                started_at: done.request.started_at,
                ended_at: done.ended_at,
                stall_seconds: done.request.stall_seconds,
                outcome: done.outcome.as_ref().map_err(Clone::clone).map(|written| WrittenRecord {
                    bytes: written.bytes,
                    write_seconds: written.seconds,
                    path: written.path.display().to_string(),
                }),
            });
        }
        let stall_seconds = done.request.stall_seconds;
        match done.outcome {
            Ok(written) => {
                self.committed = Some(written.step);
                self.last_write_seconds = Some(written.seconds);
                self.last_stall_seconds = Some(stall_seconds);
                emit(&json!({
                    "event": "checkpoint",
                    "rank": 0,
                    "step": written.step,
                    "path": written.path,
                    "bytes": written.bytes,
                    "write_seconds": written.seconds,
                    "stall_seconds": stall_seconds,
                    "trigger": done.request.trigger.as_str(),
                    "pruned": done.pruned,
                }));
            }
            Err(reason) => {
                eprintln!("fleetmend train: checkpoint of step {} failed: {reason}", done.step);
                emit(
                    &json!({"event": "checkpoint_failed", "rank": 0, "step": done.step, "error": reason}),
                );
            }
        }
    }
}

/// A finished background write.
struct WriteDone {
    step: u64,
    /// The tensors written, back for reuse as a spare buffer.
    tensors: Arc<TrainTensors>,
    request: WriteRequest,
    /// When the write committed (the manifest's rename) or failed.
    ended_at: SystemTime,
    outcome: Result<Written, String>,
    /// Checkpoints removed to keep the last K.
    pruned: Vec<PathBuf>,
}

/// How a checkpoint was asked for, handed to the writer with its snapshot.
#[derive(Debug, Clone, Copy)]
struct WriteRequest {
    stall_seconds: f64,
    trigger: Trigger,
    /// When the stall began.
    started_at: SystemTime,
}

/// Rank 0's checkpoint writer thread: one write at a time, while training goes on.
struct CheckpointThread {
    jobs: Option<Sender<(Snapshot, WriteRequest)>>,
    results: Receiver<WriteDone>,
    in_flight: bool,
    handle: Option<thread::JoinHandle<()>>,
}

impl CheckpointThread {
    fn start(
        dir: PathBuf,
        job_id: String,
        specs: Vec<ParamSpec>,
        keep: usize,
    ) -> Result<Self, TrainError> {
        let (jobs, job_receiver) = mpsc::channel::<(Snapshot, WriteRequest)>();
        let (result_sender, results) = mpsc::channel();
        let handle = thread::Builder::new()
            .name("checkpoint-write".into())
            .spawn(move || {
                for (mut snapshot, request) in job_receiver {
                    let step = snapshot.state.step;
                    snapshot.state.weights_sha256 = state::weights_sha256(&snapshot.tensors.params);
                    let outcome = state::write_checkpoint(&dir, &job_id, &specs, &snapshot)
                        .map_err(|e| e.to_string());
                    let ended_at = SystemTime::now();
                    let pruned = match &outcome {
                        Ok(_) => match checkpoint::prune(&dir, keep) {
                            Ok(outcome) => outcome.removed,
                            Err(err) => {
                                eprintln!("fleetmend train: pruning old checkpoints: {err}");
                                Vec::new()
                            }
                        },
                        Err(_) => Vec::new(),
                    };
                    let tensors = snapshot.tensors;
                    let done = WriteDone { step, tensors, request, ended_at, outcome, pruned };
                    if result_sender.send(done).is_err() {
                        return;
                    }
                }
            })
            .map_err(|source| TrainError::Thread { what: "checkpoint writer", source })?;
        Ok(CheckpointThread { jobs: Some(jobs), results, in_flight: false, handle: Some(handle) })
    }

    fn submit(&mut self, snapshot: Snapshot, request: WriteRequest) -> Result<(), TrainError> {
        let step = snapshot.state.step;
        let sent = self.jobs.as_ref().is_some_and(|jobs| jobs.send((snapshot, request)).is_ok());
        if !sent {
            return Err(TrainError::Checkpoint {
                step,
                reason: "the checkpoint writer thread is gone".to_string(),
            });
        }
        self.in_flight = true;
        Ok(())
    }

    fn poll(&mut self) -> Option<WriteDone> {
        if !self.in_flight {
            return None;
        }
        match self.results.try_recv() {
            Ok(done) => {
                self.in_flight = false;
                Some(done)
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.in_flight = false;
                None
            }
        }
    }

    /// Blocks until the write in flight (if any) is done.
    fn wait(&mut self) -> Option<WriteDone> {
        if !self.in_flight {
            return None;
        }
        self.in_flight = false;
        self.results.recv().ok()
    }
}

impl Drop for CheckpointThread {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
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

fn progress_poster(
    interval: Arc<AtomicU64>,
    watch: Option<Arc<CollectiveWatch>>,
) -> Option<progress::ProgressPoster> {
    let url = std::env::var(PROGRESS_URL_VAR).ok().filter(|u| !u.is_empty())?;
    let url = match progress::HttpUrl::parse(&url) {
        Ok(url) => url,
        Err(reason) => {
            eprintln!("fleetmend train: {PROGRESS_URL_VAR}: {reason}; progress is not posted");
            return None;
        }
    };
    let token = std::env::var(PROGRESS_TOKEN_VAR).ok().filter(|t| !t.is_empty());
    match progress::ProgressPoster::start(url, token, interval, watch) {
        Ok(poster) => Some(poster),
        Err(err) => {
            eprintln!(
                "fleetmend train: starting the progress thread: {err}; progress is not posted"
            );
            None
        }
    }
}

/// A progress line: the posted [`Progress`] plus where a step's time went (mean seconds per
/// step since the previous line: computing, and waiting in the all-reduce).
fn emit_progress(progress: &Progress, compute_seconds: f64, allreduce_seconds: f64) {
    let mut value = serde_json::to_value(progress).unwrap_or_else(|_| json!({}));
    if let Some(object) = value.as_object_mut() {
        object.insert("event".to_string(), json!("progress"));
        object.insert("compute_seconds".to_string(), json!(compute_seconds));
        object.insert("allreduce_seconds".to_string(), json!(allreduce_seconds));
    }
    emit(&value);
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

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
