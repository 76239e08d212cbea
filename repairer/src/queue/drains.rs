//! The queue as the repairer's `Scheduler`: drains (fleetmend's and an admin's), the jobs on a
//! node, checkpoint and requeue.

use std::collections::BTreeMap;

use fleetmend_proto::RankSignal;

use super::job::CheckpointAsked;
use super::{
    DRAINED_KEY, Job, JobQueue, JobState, NAME, QueueDrain, QueueState, StopCause, reindex,
};
use crate::model::{EventKind, Severity};
use crate::scheduler::{
    DRAIN_REASON_PREFIX, JobRef, SPARE_REASON, SchedulerError, UndrainOutcome, is_spare,
};

impl JobQueue {
    /// Drains `node` as an admin would outside fleetmend (the reason is not fleetmend's, so
    /// fleetmend never undrains it).
    pub fn admin_drain(&self, node: &str, reason: &str) -> Result<(), SchedulerError> {
        self.drain_node(node, reason)
    }

    /// The nodes drained in the queue, with their reasons.
    pub fn drained(&self) -> BTreeMap<String, QueueDrain> {
        self.lock().drained.clone()
    }

    /// The hot spares the queue holds now (drained with `scheduler::SPARE_REASON`).
    pub fn spares(&self) -> Vec<String> {
        let state = self.lock();
        state.drained.iter().filter(|(_, d)| is_spare(&d.reason)).map(|(n, _)| n.clone()).collect()
    }

    pub(super) fn save_drains(
        &self,
        drained: &BTreeMap<String, QueueDrain>,
    ) -> Result<(), SchedulerError> {
        let saved = self.events.store().put_setting(DRAINED_KEY, drained);
        self.events.write("put_setting", saved).map_err(|err| SchedulerError::Failed {
            scheduler: NAME,
            operation: "drain",
            message: err.to_string(),
        })
    }

    /// Takes `node` out of placement, as Slurm's drain does: the ranks running there run on. The
    /// repair workflow stops them (a checkpoint, then [`JobQueue::requeue_job`]); it is the one
    /// owner of stopping a job for a drain, whatever the scheduler.
    pub(crate) fn drain_node(&self, node: &str, reason: &str) -> Result<(), SchedulerError> {
        self.wake();
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let spare = state.drained.get(node).is_some_and(|d| is_spare(&d.reason));
        if !state.drained.contains_key(node) || spare {
            // An admin's drain stays theirs: a later fleetmend drain does not take it over. A
            // hot spare's does not: drained for a reason (a finding, validation as a
            // replacement), it is no longer a spare a job may take.
            let mut drained = state.drained.clone();
            drained
                .insert(node.to_owned(), QueueDrain { reason: reason.to_owned(), since_ms: now });
            self.save_drains(&drained)?;
            state.drained = drained;
        }
        Ok(())
    }

    /// Puts `node` back in the queue's placement, only if fleetmend drained it.
    pub(crate) fn undrain_node(&self, node: &str) -> Result<UndrainOutcome, SchedulerError> {
        self.wake();
        let mut state = self.lock();
        Ok(match state.drained.get(node) {
            None => UndrainOutcome::NotDrained,
            Some(drain) if !drain.reason.starts_with(DRAIN_REASON_PREFIX) => {
                UndrainOutcome::DrainedByOther(drain.reason.clone())
            }
            Some(drain) => {
                let was_spare = is_spare(&drain.reason);
                let mut drained = state.drained.clone();
                // A repaired node rejoins the hot spares while there are fewer than the pool
                // wants; else it goes back to work (as does a spare undrained by a person).
                let spares = drained.values().filter(|d| is_spare(&d.reason)).count();
                let pool = self.config.spare_pool.of(self.fleet.members()) as usize;
                if !was_spare && spares < pool {
                    let reason = format!("{SPARE_REASON}: rejoined the pool after its repair");
                    let since_ms = self.clock.now_ms();
                    drained.insert(node.to_owned(), QueueDrain { reason, since_ms });
                } else {
                    drained.remove(node);
                }
                self.save_drains(&drained).map_err(|err| match err {
                    SchedulerError::Failed { message, .. } => {
                        SchedulerError::Failed { scheduler: NAME, operation: "undrain", message }
                    }
                    other => other,
                })?;
                state.drained = drained;
                state.placement_blocked = None;
                UndrainOutcome::Undrained
            }
        })
    }

    /// The active jobs with a live rank on `node`.
    pub(crate) fn jobs_on_node(&self, node: &str) -> Vec<JobRef> {
        self.lock()
            .jobs
            .values()
            .filter(|j| j.state.is_active())
            .filter(|j| j.ranks.iter().any(|r| r.node == node && r.live()))
            .map(|j| JobRef { id: j.id.clone(), nodes: j.nodes.clone() })
            .collect()
    }

    /// SIGUSR1 to the live ranks of `job` (a job already stopping was asked when its stop began).
    /// The repair workflow asks before it requeues the job off a drained node.
    pub(crate) fn request_checkpoint(&self, job: &str) -> Result<(), SchedulerError> {
        self.wake();
        let mut state = self.lock();
        let job = Self::job_or_unknown(&mut state, job)?;
        if matches!(job.state, JobState::Starting | JobState::Running) {
            // The first request of the attempt is the one its ranks act on (a signal command
            // reaches a rank once); a requeue then waits for that checkpoint.
            if job.checkpoint_asked.is_none() {
                let at_ms = self.clock.now_ms();
                let step_before = job.newest_checkpoint_step();
                job.checkpoint_asked = Some(CheckpointAsked { at_ms, step_before });
                self.save(job);
            }
            let sent = self.signal_live(job, RankSignal::Usr1);
            self.event(
                EventKind::JobCheckpointRequested,
                Severity::Info,
                None,
                self.about(job, &format!("SIGUSR1 to ranks {sent:?} (the repairer asked)")),
            );
        }
        Ok(())
    }

    /// Stops `job` to restart it from its newest checkpoint. Idempotent: a job stopping, queued or
    /// done is left as it is.
    pub(crate) fn requeue_job(&self, job: &str) -> Result<(), SchedulerError> {
        self.wake();
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let QueueState { jobs, drained, .. } = &mut *state;
        let job = jobs
            .get_mut(job)
            .ok_or_else(|| SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() })?;
        if matches!(job.state, JobState::Starting | JobState::Running) {
            // The audit trail says which drained node the job leaves.
            let why = job
                .ranks
                .iter()
                .filter(|r| r.live())
                .find_map(|r| {
                    let drain = drained.get(&r.node)?;
                    Some(format!(
                        "requeued by the repairer: rank {} on {} (drained: {})",
                        r.rank, r.node, drain.reason
                    ))
                })
                .unwrap_or_else(|| "requeued by the repairer".to_owned());
            match job.checkpoint_asked {
                Some(asked) => self.begin_stop_after(job, asked, &why, now),
                None => self.begin_stop(job, StopCause::Restart, &why, now),
            }
        }
        reindex(&mut state);
        Ok(())
    }

    fn job_or_unknown<'a>(
        state: &'a mut QueueState,
        job: &str,
    ) -> Result<&'a mut Job, SchedulerError> {
        state
            .jobs
            .get_mut(job)
            .ok_or_else(|| SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() })
    }
}
