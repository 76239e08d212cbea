//! The scheduler the repairer drives: takes nodes out of work, finds the jobs on them, asks jobs
//! to checkpoint and requeues them. The embedded job queue and Slurm implement it; [`FakeScheduler`]
//! records calls for tests.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};

/// A boxed future, so the traits here can be used as `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The prefix of every drain reason fleetmend sets; fleetmend undrains only nodes whose reason
/// starts with it.
pub const DRAIN_REASON_PREFIX: &str = "fleetmend: ";

/// A job as the scheduler knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub id: String,
    pub nodes: Vec<String>,
}

/// What undrain did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UndrainOutcome {
    /// The node is back in scheduling.
    Undrained,
    /// The node was not drained.
    NotDrained,
    /// Someone else drained it (their reason given): fleetmend leaves it alone.
    DrainedByOther(String),
}

/// A scheduler call failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("{scheduler} does not know node {node}")]
    UnknownNode { scheduler: &'static str, node: String },
    #[error("{scheduler} does not know job {job}")]
    UnknownJob { scheduler: &'static str, job: String },
    #[error("{scheduler}: {operation} failed: {message}")]
    Failed { scheduler: &'static str, operation: &'static str, message: String },
    #[error("{scheduler}: {operation} timed out")]
    Timeout { scheduler: &'static str, operation: &'static str },
}

/// The scheduler operations the repairer needs.
pub trait Scheduler: Send + Sync {
    fn name(&self) -> &'static str;
    /// Stops new work on `node`; `reason` starts with [`DRAIN_REASON_PREFIX`]. Idempotent.
    fn drain<'a>(
        &'a self,
        node: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), SchedulerError>>;
    /// Puts `node` back, only if fleetmend drained it.
    fn undrain<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<UndrainOutcome, SchedulerError>>;
    /// The jobs with a rank on `node`.
    fn jobs_on<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Vec<JobRef>, SchedulerError>>;
    /// Asks `job` to write a checkpoint (SIGUSR1 under the checkpoint protocol).
    fn checkpoint<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>>;
    /// Stops `job` and puts it back in the queue to resume from its newest checkpoint.
    fn requeue<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>>;
}

/// One call made to a [`FakeScheduler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulerCall {
    Drain { node: String, reason: String },
    Undrain { node: String },
    JobsOn { node: String },
    Checkpoint { job: String },
    Requeue { job: String },
}

#[derive(Debug, Default)]
struct FakeState {
    calls: Vec<SchedulerCall>,
    /// node → drain reason
    drained: BTreeMap<String, String>,
    /// job → nodes
    jobs: BTreeMap<String, Vec<String>>,
    requeued: BTreeSet<String>,
    /// job → the nodes it moves to when asked to checkpoint
    moves: BTreeMap<String, Vec<String>>,
    failing: BTreeSet<&'static str>,
}

/// An in-memory scheduler that records every call (tests, dry runs of policy).
#[derive(Debug, Default)]
pub struct FakeScheduler {
    state: Mutex<FakeState>,
}

impl FakeScheduler {
    pub fn new() -> FakeScheduler {
        FakeScheduler::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<SchedulerCall> {
        self.state().calls.clone()
    }

    /// Puts a job with ranks on `nodes`.
    pub fn add_job(&self, job: &str, nodes: &[&str]) {
        self.state().jobs.insert(job.to_owned(), nodes.iter().map(|n| (*n).to_owned()).collect());
    }

    /// When `job` is asked to checkpoint it moves to `nodes`, as a scheduler that stops and
    /// restarts a job on its own (the embedded queue on a drain) may do before the requeue.
    pub fn move_on_checkpoint(&self, job: &str, nodes: &[&str]) {
        self.state().moves.insert(job.to_owned(), nodes.iter().map(|n| (*n).to_owned()).collect());
    }

    /// Drains `node` as someone else would (an admin), with `reason`.
    pub fn drain_as_other(&self, node: &str, reason: &str) {
        self.state().drained.insert(node.to_owned(), reason.to_owned());
    }

    pub fn drain_reason(&self, node: &str) -> Option<String> {
        self.state().drained.get(node).cloned()
    }

    /// Makes `operation` ("drain", "undrain", ...) fail until [`FakeScheduler::heal`].
    pub fn fail(&self, operation: &'static str) {
        self.state().failing.insert(operation);
    }

    pub fn heal(&self) {
        self.state().failing.clear();
    }

    fn check(&self, state: &FakeState, operation: &'static str) -> Result<(), SchedulerError> {
        if state.failing.contains(operation) {
            return Err(SchedulerError::Failed {
                scheduler: "fake",
                operation,
                message: "injected failure".to_owned(),
            });
        }
        Ok(())
    }
}

impl Scheduler for FakeScheduler {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn drain<'a>(
        &'a self,
        node: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            let mut state = self.state();
            state
                .calls
                .push(SchedulerCall::Drain { node: node.to_owned(), reason: reason.to_owned() });
            self.check(&state, "drain")?;
            // An admin's drain stays theirs.
            state.drained.entry(node.to_owned()).or_insert_with(|| reason.to_owned());
            Ok(())
        })
    }

    fn undrain<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<UndrainOutcome, SchedulerError>> {
        Box::pin(async move {
            let mut state = self.state();
            state.calls.push(SchedulerCall::Undrain { node: node.to_owned() });
            self.check(&state, "undrain")?;
            Ok(match state.drained.get(node) {
                None => UndrainOutcome::NotDrained,
                Some(reason) if !reason.starts_with(DRAIN_REASON_PREFIX) => {
                    UndrainOutcome::DrainedByOther(reason.clone())
                }
                Some(_) => {
                    state.drained.remove(node);
                    UndrainOutcome::Undrained
                }
            })
        })
    }

    fn jobs_on<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Vec<JobRef>, SchedulerError>> {
        Box::pin(async move {
            let mut state = self.state();
            state.calls.push(SchedulerCall::JobsOn { node: node.to_owned() });
            self.check(&state, "jobs_on")?;
            Ok(state
                .jobs
                .iter()
                .filter(|(job, nodes)| {
                    !state.requeued.contains(*job) && nodes.iter().any(|n| n == node)
                })
                .map(|(job, nodes)| JobRef { id: job.clone(), nodes: nodes.clone() })
                .collect())
        })
    }

    fn checkpoint<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            let mut state = self.state();
            state.calls.push(SchedulerCall::Checkpoint { job: job.to_owned() });
            self.check(&state, "checkpoint")?;
            if !state.jobs.contains_key(job) {
                return Err(SchedulerError::UnknownJob { scheduler: "fake", job: job.to_owned() });
            }
            if let Some(nodes) = state.moves.remove(job) {
                state.jobs.insert(job.to_owned(), nodes);
            }
            Ok(())
        })
    }

    fn requeue<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            let mut state = self.state();
            state.calls.push(SchedulerCall::Requeue { job: job.to_owned() });
            self.check(&state, "requeue")?;
            if !state.jobs.contains_key(job) {
                return Err(SchedulerError::UnknownJob { scheduler: "fake", job: job.to_owned() });
            }
            state.requeued.insert(job.to_owned());
            Ok(())
        })
    }
}
