//! Rank 0's checkpoints during a run: when the interval comes around, the snapshot taken at a step
//! boundary (the training stall), the background thread that writes it while training goes on,
//! and what each finished write leaves behind (the committed step, its times, its trace).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread;
use std::time::{Instant, SystemTime};

use serde_json::json;

use super::model::ParamSpec;
use super::optim::{AdamW, TrainTensors};
use super::setup::Setup;
use super::state::{self, RngState, STATE_FORMAT_VERSION, Snapshot, TrainState, Written};
use super::telemetry::{CheckpointRecord, TrainTelemetry, Trigger, WrittenRecord};
use super::{CheckpointEvery, TrainError, emit};
use crate::checkpoint;

/// `--checkpoint-every auto` checkpoints this often until the queue says otherwise.
const AUTO_FALLBACK_EVERY: u64 = 100;

/// Whether rank 0's checkpoint interval has come around at `step`.
pub(super) fn interval_due(
    every: CheckpointEvery,
    queue: &AtomicU64,
    step: u64,
    last: u64,
) -> bool {
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
pub(super) struct RunState<'t> {
    /// Where `checkpoint` spans go, when traces are on.
    telemetry: Option<&'t TrainTelemetry>,
    /// Rank 0's background writer, when checkpoints are on.
    writer: Option<CheckpointThread>,
    /// Newest committed checkpoint (rank 0's, as every rank learns it).
    pub(super) committed: Option<u64>,
    pub(super) last_write_seconds: Option<f64>,
    pub(super) last_stall_seconds: Option<f64>,
}

impl<'t> RunState<'t> {
    /// Checkpointing from `committed` on: rank 0 starts its background writer when checkpoints
    /// are on.
    pub(super) fn start(
        setup: &Setup,
        telemetry: Option<&'t TrainTelemetry>,
        committed: Option<u64>,
    ) -> Result<Self, TrainError> {
        let writer = match (&setup.checkpoint_dir, setup.membership.rank) {
            (Some(dir), 0) => Some(CheckpointThread::start(
                dir.clone(),
                setup.job_id.clone(),
                setup.specs.clone(),
                setup.args.keep,
            )?),
            _ => None,
        };
        Ok(RunState {
            telemetry,
            writer,
            committed,
            last_write_seconds: None,
            last_stall_seconds: None,
        })
    }

    /// Whether this rank writes checkpoints (rank 0, with a checkpoint directory).
    pub(super) fn writes(&self) -> bool {
        self.writer.is_some()
    }

    /// Rank 0: hands the state of `step` to the writer (after the write still in flight, if
    /// any, is done). The tensors are shared, not copied: the stall is the wait and the
    /// bookkeeping. Other ranks: nothing.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn checkpoint(
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

    pub(super) fn poll_writes(&mut self, spares: &mut Vec<TrainTensors>) {
        if let Some(done) = self.writer.as_mut().and_then(CheckpointThread::poll) {
            self.record(done, spares);
        }
    }

    /// Waits for the write in flight; the reason of a failed one.
    pub(super) fn finish_writes(&mut self, spares: &mut Vec<TrainTensors>) -> Option<String> {
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
