//! The step loop: from the agreed start point to the last step (or a stop), each step computing
//! this rank's gradients, summing them with every rank's in one all-reduce together with the
//! control values, updating the weights, and at the boundary checkpointing and reporting progress
//! as the ranks decided together.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_proto::jobs::{PROGRESS_TOKEN_VAR, PROGRESS_URL_VAR, Progress};
use serde_json::json;

use super::checkpointing::{RunState, interval_due};
use super::data::BatchSpec;
use super::model::Gpt;
use super::optim::{AdamW, TrainTensors};
use super::progress::{self, ProgressPoster};
use super::setup::Setup;
use super::signals::Signals;
use super::start::{self, StartPoint};
use super::telemetry::{TrainTelemetry, Trigger};
use super::{TrainError, emit, emit_done, state};
use crate::collective::{CollectiveWatch, Communicator};

/// Longest wait at exit for the last progress post.
const FINAL_POST_LIMIT: Duration = Duration::from_secs(3);
/// Control values appended to the gradients: checkpoint requested, stop requested, rank 0's
/// newest committed checkpoint step + 1 (high and low halves, so it is exact in f32), loss.
const CONTROL_VALUES: usize = 5;
/// The committed step is sent as `hi · 2²⁰ + lo`: both halves are exact in f32 (< 2²⁴).
const STEP_SPLIT: u64 = 1 << 20;

/// Trains from where the ranks agree to start up to `--steps`, or until a stop at a step boundary.
pub(super) fn train(
    setup: Setup,
    signals: &Signals,
    telemetry: Option<&TrainTelemetry>,
) -> Result<(), TrainError> {
    let (comm, start) = start::meet_at_start_point(&setup, telemetry)?;
    let args = &setup.args;
    emit(&json!({
        "event": "start",
        "rank": setup.membership.rank,
        "world_size": setup.membership.world_size,
        "start_step": start.step,
        "steps": args.steps,
        "params": start.tensors.params.len(),
        "threads": setup.threads,
        "device": format!("{:?}", args.device).to_lowercase(),
        "checkpoint_dir": setup.checkpoint_dir,
    }));
    if start.step >= args.steps {
        signals.starting.store(false, Ordering::SeqCst);
        emit_done(args.steps, start.loss, &start.tensors.params);
        return Ok(());
    }
    let mut training = Training::new(&setup, telemetry, comm, start)?;
    // From here a SIGTERM is a request to checkpoint and stop at the next step boundary, which
    // every rank must reach together (one rank leaving alone would fail the others).
    signals.starting.store(false, Ordering::SeqCst);
    let stopped_at = training.run_steps(signals);
    training.finish(stopped_at)
}

/// A rank's training between its first and its last step.
struct Training<'a> {
    setup: &'a Setup,
    /// Rank 0's checkpointing (declared before `comm`: a write in flight is joined before the
    /// ring closes).
    checkpoints: RunState<'a>,
    /// `None` in a world of one.
    comm: Option<Communicator>,
    model: Gpt,
    /// The state of the newest step, shared with a checkpoint being written; the next step is
    /// computed into a spare buffer (a recycled older state) and replaces it.
    current: Arc<TrainTensors>,
    spares: Vec<TrainTensors>,
    optimizer: AdamW,
    start_step: u64,
    /// The loss of the newest step, averaged over the ranks.
    loss: f32,
    /// Set once a non-finite gradient or loss has reached the weights.
    lost: bool,
    /// The step at which a checkpoint was last asked for.
    last_requested: u64,
    batch_spec: BatchSpec,
    /// This rank's gradients and control values, then their sums over the ranks.
    buffer: Vec<f32>,
    /// The checkpoint interval the queue's reply to a progress post set (0: none yet).
    queue_interval: Arc<AtomicU64>,
    poster: Option<ProgressPoster>,
    window: ProgressWindow,
}

/// Where the time of the steps since the last progress line went.
struct ProgressWindow {
    start: Instant,
    steps: u64,
    /// Seconds spent computing (forward, backward, update).
    compute: f64,
    /// Seconds spent in the all-reduce.
    comm: f64,
    /// When the last progress line was written.
    last_line: Option<Instant>,
}

impl ProgressWindow {
    fn new() -> ProgressWindow {
        ProgressWindow { start: Instant::now(), steps: 0, compute: 0.0, comm: 0.0, last_line: None }
    }

    /// Mean seconds per step of `seconds` over this window.
    fn per_step(&self, seconds: f64) -> f64 {
        seconds / self.steps.max(1) as f64
    }
}

/// What the ranks decided together at a step boundary, from the summed control values.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Control {
    /// Some rank asked for a checkpoint (SIGUSR1, or rank 0's interval).
    checkpoint: bool,
    /// Some rank was asked to stop (SIGTERM or SIGINT).
    stop: bool,
    /// Rank 0's newest committed checkpoint, if it has one.
    committed: Option<u64>,
    /// The loss averaged over the ranks.
    loss: f32,
}

impl Control {
    /// Appends this rank's control values to its gradients; what other ranks append for
    /// `committed` must be `None`, so that the sum is rank 0's.
    fn append_to(&self, buffer: &mut Vec<f32>) {
        let committed = self.committed.map_or(0, |s| s + 1);
        buffer.extend([
            f32::from(u8::from(self.checkpoint)),
            f32::from(u8::from(self.stop)),
            (committed / STEP_SPLIT) as f32,
            (committed % STEP_SPLIT) as f32,
            self.loss,
        ]);
    }

    /// Takes the summed control values off the end of `buffer`.
    fn take_sum(buffer: &mut Vec<f32>, world: usize) -> Control {
        let sums = buffer.split_off(buffer.len() - CONTROL_VALUES);
        let committed = sums[2] as u64 * STEP_SPLIT + sums[3] as u64;
        Control {
            checkpoint: sums[0] > 0.0,
            stop: sums[1] > 0.0,
            committed: committed.checked_sub(1),
            loss: sums[4] / world as f32,
        }
    }
}

impl<'a> Training<'a> {
    fn new(
        setup: &'a Setup,
        telemetry: Option<&'a TrainTelemetry>,
        comm: Option<Communicator>,
        start: StartPoint,
    ) -> Result<Training<'a>, TrainError> {
        let rank = setup.membership.rank;
        let model = Gpt::new(setup.config, &start.tensors.params, &setup.device)
            .map_err(|source| TrainError::Compute { rank, step: start.step, source })?;
        let checkpoints = RunState::start(setup, telemetry, start.checkpoint_step)?;
        let queue_interval = Arc::new(AtomicU64::new(0));
        let poster =
            progress_poster(queue_interval.clone(), comm.as_ref().and_then(Communicator::watch));
        let args = &setup.args;
        let batch_spec = BatchSpec {
            seed: args.seed,
            world_size: setup.membership.world_size,
            batch_size: args.batch_size,
            context: args.context,
        };
        Ok(Training {
            setup,
            checkpoints,
            comm,
            model,
            buffer: Vec::with_capacity(start.tensors.params.len() + CONTROL_VALUES),
            current: Arc::new(start.tensors),
            spares: Vec::new(),
            optimizer: start.optimizer,
            start_step: start.step,
            loss: start.loss,
            lost: false,
            last_requested: start.step,
            batch_spec,
            queue_interval,
            poster,
            window: ProgressWindow::new(),
        })
    }

    /// The steps after the start point; the step a stop ended them at, if one did.
    fn run_steps(&mut self, signals: &Signals) -> Result<Option<u64>, TrainError> {
        for step in self.start_step + 1..=self.setup.args.steps {
            let (control, periodic) = self.step(step, signals)?;
            self.checkpoint_at_boundary(step, control, periodic)?;
            self.checkpoints.poll_writes(&mut self.spares);
            self.report_progress(step, control.stop);
            if control.stop {
                return Ok(Some(step));
            }
        }
        Ok(None)
    }

    /// One step: gradients, all-reduce, update. Returns what the ranks decided, and whether
    /// rank 0's interval asked for the checkpoint.
    fn step(&mut self, step: u64, signals: &Signals) -> Result<(Control, bool), TrainError> {
        let compute_start = Instant::now();
        let periodic = self.gradients(step, signals)?;
        if let Some(rest) = self.setup.args.pace.checked_sub(compute_start.elapsed()) {
            std::thread::sleep(rest);
        }
        let comm_start = Instant::now();
        self.window.compute += (comm_start - compute_start).as_secs_f64();
        if let Some(comm) = self.comm.as_mut() {
            comm.all_reduce_sum(&mut self.buffer).map_err(|source| TrainError::Collective {
                rank: self.setup.membership.rank,
                what: "gradient all-reduce",
                step,
                source,
            })?;
        }
        let update_start = Instant::now();
        self.window.comm += (update_start - comm_start).as_secs_f64();
        let control = self.update(step)?;
        self.window.steps += 1;
        self.window.compute += update_start.elapsed().as_secs_f64();
        Ok((control, periodic))
    }

    /// This rank's gradients of its batch of `step`, then its control values, into the buffer.
    /// Returns whether rank 0's checkpoint interval came around.
    fn gradients(&mut self, step: u64, signals: &Signals) -> Result<bool, TrainError> {
        let (setup, rank) = (self.setup, self.setup.membership.rank);
        let (inputs, targets) = setup.corpus.batch(self.batch_spec, step, rank);
        self.buffer.clear();
        let loss = self
            .model
            .loss_and_grads(&inputs, &targets, setup.args.batch_size, &mut self.buffer)
            .map_err(|source| TrainError::Compute { rank, step, source })?;
        // Every gradient: a NaN in a parameter no batch uses (a byte's embedding row) would
        // never reach the loss.
        if signals.poison.swap(false, Ordering::SeqCst) {
            self.buffer.iter_mut().for_each(|g| *g = f32::NAN);
            emit(&json!({ "event": "poisoned", "rank": rank, "step": step }));
        }
        let periodic = rank == 0
            && self.checkpoints.writes()
            && interval_due(
                setup.args.checkpoint_every,
                &self.queue_interval,
                step,
                self.last_requested,
            );
        let usr1 = signals.checkpoint.swap(false, Ordering::SeqCst);
        let control = Control {
            checkpoint: usr1 || periodic,
            stop: signals.stop.load(Ordering::SeqCst),
            committed: if rank == 0 { self.checkpoints.committed } else { None },
            loss,
        };
        control.append_to(&mut self.buffer);
        Ok(periodic)
    }

    /// Takes the summed control values off the buffer, averages the gradients and updates the
    /// weights with them.
    fn update(&mut self, step: u64) -> Result<Control, TrainError> {
        let (rank, world) = (self.setup.membership.rank, self.setup.membership.world_size);
        let control = Control::take_sum(&mut self.buffer, world);
        if world > 1 {
            let w = world as f32;
            self.buffer.iter_mut().for_each(|g| *g /= w);
        }
        if rank != 0 {
            self.checkpoints.committed = control.committed.or(self.checkpoints.committed);
        }
        self.loss = control.loss;
        let mut next = self.spares.pop().unwrap_or_else(|| TrainTensors::fresh(Vec::new()));
        self.optimizer.step(&self.current, &self.buffer, &mut next);
        let previous = std::mem::replace(&mut self.current, Arc::new(next));
        // Not unique while a checkpoint still writes it: it is recycled when that is done.
        if let Ok(previous) = Arc::try_unwrap(previous) {
            self.spares.push(previous);
        }
        self.model.set_params(&self.current.params).map_err(|source| TrainError::Compute {
            rank,
            step,
            source,
        })?;
        // Weights updated with a NaN or infinite gradient, or that gave such a loss, are lost for
        // good: they are never checkpointed, so a restart resumes from the newest checkpoint
        // before them.
        self.lost |= !self.loss.is_finite() || !self.buffer.iter().all(|g| g.is_finite());
        Ok(control)
    }

    /// Rank 0 checkpoints at the boundary the ranks reached together when a signal on any rank,
    /// its interval or a stop asked for it, unless the weights are lost.
    fn checkpoint_at_boundary(
        &mut self,
        step: u64,
        control: Control,
        periodic: bool,
    ) -> Result<(), TrainError> {
        if !(control.checkpoint || control.stop) {
            return Ok(());
        }
        self.last_requested = step;
        if self.lost {
            emit(&json!({
                "event": "checkpoint refused",
                "rank": self.setup.membership.rank,
                "step": step,
                "reason": "the loss is not finite",
            }));
            return Ok(());
        }
        let trigger = if control.stop {
            Trigger::Sigterm
        } else if periodic {
            Trigger::Interval
        } else {
            Trigger::Sigusr1
        };
        self.checkpoint(step, trigger)
    }

    fn checkpoint(&mut self, step: u64, trigger: Trigger) -> Result<(), TrainError> {
        self.checkpoints.checkpoint(
            self.setup,
            step,
            trigger,
            self.loss,
            &self.current,
            &self.optimizer,
            &mut self.spares,
        )
    }

    /// A progress line (and post) when one is due, and always at a stop, once the weights are
    /// lost and at the last step.
    fn report_progress(&mut self, step: u64, stop: bool) {
        let args = &self.setup.args;
        let due = self.window.last_line.is_none_or(|at| at.elapsed() >= args.progress_interval);
        if !(due || stop || self.lost || step == args.steps) {
            return;
        }
        let window = &self.window;
        let elapsed = window.start.elapsed().as_secs_f64().max(1e-9);
        let progress = Progress {
            job: self.setup.job_id.clone(),
            attempt: self.setup.attempt,
            rank: self.setup.membership.rank as u32,
            step,
            start_step: self.start_step,
            loss: f64::from(self.loss),
            samples_per_second: (window.steps * args.batch_size as u64) as f64 / elapsed,
            checkpoint_step: self.checkpoints.committed,
            checkpoint_write_seconds: self.checkpoints.last_write_seconds,
            checkpoint_stall_seconds: self.checkpoints.last_stall_seconds,
            step_seconds: Some(window.per_step(window.compute)),
            waiting_for: Vec::new(),
            at_ms: unix_ms(),
        };
        emit_progress(&progress, window.per_step(window.compute), window.per_step(window.comm));
        if let Some(poster) = &self.poster {
            poster.offer(progress);
        }
        self.window = ProgressWindow { last_line: Some(Instant::now()), ..ProgressWindow::new() };
    }

    /// After the last step, a stop or a failure: the last progress post, the final checkpoint of
    /// a run that reached `--steps`, the write in flight, and the closing line.
    fn finish(mut self, stopped_at: Result<Option<u64>, TrainError>) -> Result<(), TrainError> {
        // The final progress (a rank's last step) is worth a short wait; a dead queue is not.
        if let Some(poster) = self.poster.take() {
            poster.finish(FINAL_POST_LIMIT);
        }
        let stopped_at = match stopped_at {
            Ok(stopped_at) => stopped_at,
            Err(err) => {
                // A checkpoint already being written is finished: it is valid work.
                let _ = self.checkpoints.finish_writes(&mut self.spares);
                return Err(err);
            }
        };
        let steps = self.setup.args.steps;
        let step = stopped_at.unwrap_or(steps);
        // The end of a run is a checkpoint too: a resumed run with the same --steps is done.
        if stopped_at.is_none() && self.last_requested != step && !self.lost {
            self.checkpoint(step, Trigger::Final)?;
        }
        if let Some(reason) = self.checkpoints.finish_writes(&mut self.spares) {
            return Err(TrainError::Checkpoint { step, reason });
        }
        match stopped_at {
            Some(step) => emit(&json!({
                "event": "stopped",
                "rank": self.setup.membership.rank,
                "step": step,
                "loss": self.loss,
                "checkpoint_step": self.checkpoints.committed,
                "weights_sha256": state::weights_sha256(&self.current.params),
            })),
            None => emit_done(steps, self.loss, &self.current.params),
        }
        Ok(())
    }
}

fn progress_poster(
    interval: Arc<AtomicU64>,
    watch: Option<Arc<CollectiveWatch>>,
) -> Option<ProgressPoster> {
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

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summed(ranks: &[Control]) -> Vec<f32> {
        let mut sum = vec![0.0f32; 2 + CONTROL_VALUES];
        for control in ranks {
            let mut buffer = vec![0.5, 0.25];
            control.append_to(&mut buffer);
            sum.iter_mut().zip(&buffer).for_each(|(total, value)| *total += *value);
        }
        sum
    }

    #[test]
    fn a_signal_on_one_rank_and_rank_0s_checkpoint_reach_every_rank_through_the_sum() {
        let quiet = Control { checkpoint: false, stop: false, committed: None, loss: 3.0 };
        // Past 2²⁴: the halves keep the step exact in f32.
        let rank_0 = Control { committed: Some(50_000_000), loss: 1.0, ..quiet };
        let rank_1 = Control { checkpoint: true, loss: 2.0, ..quiet };
        let rank_2 = Control { stop: true, ..quiet };
        let mut buffer = summed(&[rank_0, rank_1, rank_2]);
        let control = Control::take_sum(&mut buffer, 3);
        assert_eq!(buffer, [1.5, 0.75], "only the gradients' sums stay");
        assert_eq!(
            control,
            Control { checkpoint: true, stop: true, committed: Some(50_000_000), loss: 2.0 }
        );
    }

    #[test]
    fn no_checkpoint_and_no_request_read_back_as_none_and_false() {
        let quiet = Control { checkpoint: false, stop: false, committed: None, loss: 0.5 };
        let rank_0 = Control { committed: Some(0), ..quiet };
        let control = Control::take_sum(&mut summed(&[quiet, quiet]), 2);
        assert_eq!(control, quiet);
        let control = Control::take_sum(&mut summed(&[rank_0, quiet]), 2);
        assert_eq!(control.committed, Some(0), "step 0 is a checkpoint, not none");
        assert!(!control.checkpoint && !control.stop);
    }
}
