//! The embedded job queue as the repairer's scheduler (`scheduler = "embedded"`, the default):
//! drain and undrain in the queue's own drain list, the jobs with a live rank on a node, SIGUSR1 to
//! ask for a checkpoint, and a requeue that stops the job and restarts it from its newest
//! checkpoint. The queue itself lives in `crate::queue`.

use super::{BoxFuture, JobRef, Scheduler, SchedulerError, UndrainOutcome};
use crate::queue::{JobQueue, NAME};

impl Scheduler for JobQueue {
    fn name(&self) -> &'static str {
        NAME
    }

    fn drain<'a>(
        &'a self,
        node: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move { self.drain_node(node, reason) })
    }

    fn undrain<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<UndrainOutcome, SchedulerError>> {
        Box::pin(async move { self.undrain_node(node) })
    }

    fn jobs_on<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Vec<JobRef>, SchedulerError>> {
        Box::pin(async move { Ok(self.jobs_on_node(node)) })
    }

    fn checkpoint<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move { self.request_checkpoint(job) })
    }

    fn requeue<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move { self.requeue_job(job) })
    }
}
