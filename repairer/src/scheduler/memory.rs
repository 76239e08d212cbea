//! The in-memory stand-in scheduler (`scheduler = "memory"`): drains are kept in memory, jobs are
//! what a test puts there, and every call is recorded. For dry runs of a policy and for tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use super::{BoxFuture, DRAIN_REASON_PREFIX, JobRef, Scheduler, SchedulerError, UndrainOutcome};

const NAME: &str = "memory";

/// One call made to a [`MemoryScheduler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulerCall {
    Drain { node: String, reason: String },
    Undrain { node: String },
    JobsOn { node: String },
    Checkpoint { job: String },
    Requeue { job: String },
}

#[derive(Debug, Default)]
struct MemoryState {
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

/// An in-memory scheduler that records every call: a stand-in for dry runs and tests
/// (`scheduler = "memory"`); it drains nothing real.
#[derive(Debug, Default)]
pub struct MemoryScheduler {
    state: Mutex<MemoryState>,
}

impl MemoryScheduler {
    pub fn new() -> MemoryScheduler {
        MemoryScheduler::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
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

    /// When `job` is asked to checkpoint it moves to `nodes`, as a job may before its requeue
    /// (it failed meanwhile and its scheduler restarted it elsewhere).
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

    /// Makes `operation` ("drain", "undrain", ...) fail until [`MemoryScheduler::heal`].
    pub fn fail(&self, operation: &'static str) {
        self.state().failing.insert(operation);
    }

    pub fn heal(&self) {
        self.state().failing.clear();
    }

    fn check(&self, state: &MemoryState, operation: &'static str) -> Result<(), SchedulerError> {
        if state.failing.contains(operation) {
            return Err(SchedulerError::Failed {
                scheduler: NAME,
                operation,
                message: "injected failure".to_owned(),
            });
        }
        Ok(())
    }
}

impl Scheduler for MemoryScheduler {
    fn name(&self) -> &'static str {
        NAME
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
                return Err(SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() });
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
                return Err(SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() });
            }
            state.requeued.insert(job.to_owned());
            Ok(())
        })
    }
}
