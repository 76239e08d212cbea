//! The scheduler the repairer drives: takes nodes out of work, finds the jobs on them, asks jobs
//! to checkpoint and requeues them. Every backend lives in this folder:
//!
//! - [`embedded`]: the bundled job queue (`scheduler = "embedded"`, the default);
//! - [`slurm`]: a real Slurm cluster through its client commands (`scheduler = "slurm"`);
//! - [`memory`]: a stand-in that keeps drains in memory and records every call
//!   (`scheduler = "memory"`): for dry runs of a policy and for tests, never for a fleet.

pub mod embedded;
pub mod memory;
pub mod slurm;

pub use self::memory::{MemoryScheduler, SchedulerCall};

use std::future::Future;
use std::pin::Pin;

/// A boxed future, so the traits here can be used as `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use fleetmend_proto::DRAIN_REASON_PREFIX;

/// The drain reason of a hot spare: a healthy, validated node held out of work until a job waits
/// for nodes (then it is put to work at once, instead of the job waiting for a repair).
pub const SPARE_REASON: &str = "fleetmend: spare";

/// Whether a drain reason marks a hot spare.
pub fn is_spare(reason: &str) -> bool {
    reason.starts_with(SPARE_REASON)
}

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
    /// Stops new work on `node`; `reason` starts with [`DRAIN_REASON_PREFIX`]. Idempotent. The
    /// jobs running there run on: the repair workflow checkpoints and requeues them.
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
