//! The stop sequence of a job's attempt: SIGUSR1 (checkpoint, for a restart), SIGTERM, SIGKILL,
//! each after its grace; then the job is requeued, cancelled, failed or completed.

use fleetmend_proto::jobs::command_with_args;
use fleetmend_proto::{NodeCommand, RankKey, RankSignal, SignalRank, command_kind};

use super::job::CheckpointAsked;
use super::{Job, JobQueue, JobState, RankRecord, Stop, StopCause, StopPhase, set_state};
use crate::model::{EventKind, Severity};

impl JobQueue {
    /// Sends `signal` to every rank of the current attempt not known to have ended.
    pub(super) fn signal_live(&self, job: &Job, signal: RankSignal) -> Vec<u32> {
        let mut sent = Vec::new();
        for rank in job.ranks.iter().filter(|r| r.live()) {
            let key = RankKey { job: job.id.clone(), attempt: job.attempt, rank: rank.rank };
            self.commands.push(&rank.node, signal_command(&key, signal));
            sent.push(rank.rank);
        }
        sent
    }

    /// Stops the job's attempt: a restart first asks for a checkpoint, a cancel does not.
    pub(super) fn begin_stop(&self, job: &mut Job, cause: StopCause, reason: &str, now: u64) {
        let phase = match cause {
            StopCause::Restart => StopPhase::Checkpoint,
            StopCause::Cancel | StopCause::Fail => StopPhase::Term,
        };
        self.begin_stop_at(job, cause, phase, reason, now);
    }

    /// Stops the job's attempt for a restart after the repairer's checkpoint request: the stop's
    /// checkpoint phase began when it asked (its grace counts from then, and a checkpoint written
    /// since ends it at once), and SIGUSR1 is not sent again.
    pub(super) fn begin_stop_after(
        &self,
        job: &mut Job,
        asked: CheckpointAsked,
        reason: &str,
        now: u64,
    ) {
        let since_ms = asked.at_ms.min(now);
        Self::open_stop(job, StopCause::Restart, StopPhase::Checkpoint, reason, now, since_ms);
        if let Some(stop) = job.stop.as_mut() {
            stop.checkpoint_step_before = asked.step_before;
        }
        let what = format!("stopping once the checkpoint asked for is written ({reason})");
        self.event(EventKind::JobStopping, Severity::Info, None, self.about(job, &what));
        self.save(job);
        self.advance_stop(job, now);
    }

    /// Stops the job's attempt starting at `phase`.
    pub(super) fn begin_stop_at(
        &self,
        job: &mut Job,
        cause: StopCause,
        phase: StopPhase,
        reason: &str,
        now: u64,
    ) {
        Self::open_stop(job, cause, phase, reason, now, now);
        let sent = self.signal_live(job, phase_signal(phase));
        if !sent.is_empty() {
            let (kind, what) = match phase {
                StopPhase::Checkpoint => (
                    EventKind::JobCheckpointRequested,
                    format!("SIGUSR1 to ranks {sent:?}: checkpoint, then stop ({reason})"),
                ),
                _ => (EventKind::JobStopping, format!("SIGTERM to ranks {sent:?} ({reason})")),
            };
            self.event(kind, Severity::Info, None, self.about(job, &what));
        }
        self.save(job);
        self.advance_stop(job, now);
    }

    /// Records the stop (its phase begun at `since_ms`) and turns the job to stopping.
    fn open_stop(
        job: &mut Job,
        cause: StopCause,
        phase: StopPhase,
        reason: &str,
        now: u64,
        since_ms: u64,
    ) {
        if cause == StopCause::Restart {
            job.goodput.failure_ms = Some(now);
        }
        job.stop = Some(Stop {
            cause,
            reason: reason.to_owned(),
            requested_ms: now,
            phase,
            phase_since_ms: since_ms,
            checkpoint_step_before: job.newest_checkpoint_step(),
        });
        set_state(job, JobState::Stopping, reason, now);
    }

    pub(super) fn advance_stop(&self, job: &mut Job, now: u64) {
        let Some(stop) = job.stop.clone() else { return };
        if !job.ranks.iter().any(RankRecord::live) {
            self.finish_stop(job, now);
            return;
        }
        let elapsed = now.saturating_sub(stop.phase_since_ms);
        let next = match stop.phase {
            StopPhase::Checkpoint => {
                let newest = job.newest_checkpoint_step();
                let written = match (newest, stop.checkpoint_step_before) {
                    (Some(newest), Some(before)) => newest > before,
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if written {
                    Some((
                        StopPhase::Term,
                        format!("checkpoint step {} written", newest.unwrap_or(0)),
                    ))
                } else if elapsed
                    >= checkpoint_grace_ms(
                        self.config.checkpoint_grace,
                        job.measured.checkpoint_write_seconds,
                        job.ranks.iter().all(RankRecord::live),
                    )
                {
                    Some((StopPhase::Term, "no new checkpoint within checkpoint_grace".to_owned()))
                } else {
                    None
                }
            }
            StopPhase::Term if elapsed >= self.config.stop_grace.as_millis() as u64 => {
                Some((StopPhase::Kill, "ranks still running after stop_grace".to_owned()))
            }
            StopPhase::Kill if elapsed >= self.config.stop_grace.as_millis() as u64 => {
                let lost: Vec<String> = job
                    .ranks
                    .iter()
                    .filter(|r| r.live())
                    .map(|r| format!("rank {} on {}", r.rank, r.node))
                    .collect();
                self.event(
                    EventKind::JobStopping,
                    Severity::Warning,
                    None,
                    self.about(
                        job,
                        &format!(
                            "no exit reported after SIGKILL, given up on: {}",
                            lost.join(", ")
                        ),
                    ),
                );
                self.finish_stop(job, now);
                return;
            }
            _ => None,
        };
        if let Some((phase, why)) = next {
            if let Some(stop) = job.stop.as_mut() {
                stop.phase = phase;
                stop.phase_since_ms = now;
            }
            let signal = phase_signal(phase);
            let sent = self.signal_live(job, signal);
            self.event(
                EventKind::JobStopping,
                Severity::Info,
                None,
                self.about(job, &format!("SIG{signal} to ranks {sent:?}: {why}")),
            );
            self.save(job);
        }
    }

    fn end_attempt(&self, job: &mut Job, now: u64, reason: &str, failed: bool) {
        if let Some(attempt) = job.current_attempt_mut()
            && attempt.ended_ms.is_none()
        {
            attempt.ended_ms = Some(now);
            attempt.end_reason = Some(reason.to_owned());
            attempt.failed = failed;
        }
    }

    pub(super) fn complete(&self, job: &mut Job, now: u64) {
        job.stop = None;
        self.end_attempt(job, now, "every rank exited 0", false);
        job.finished_ms = Some(now);
        set_state(job, JobState::Completed, "every rank exited 0", now);
        self.event(
            EventKind::JobCompleted,
            Severity::Info,
            None,
            self.about(
                job,
                &format!(
                    "completed after {} restart(s), goodput {:.2}",
                    job.restarts,
                    job.goodput_ratio(now)
                ),
            ),
        );
        self.save(job);
    }

    fn finish_stop(&self, job: &mut Job, now: u64) {
        let Some(stop) = job.stop.take() else { return };
        // The ranks finished by themselves before anyone asked them to stop.
        if stop.cause == StopCause::Restart
            && stop.phase == StopPhase::Checkpoint
            && job.ranks.iter().all(RankRecord::succeeded)
        {
            self.complete(job, now);
            return;
        }
        let failed = matches!(stop.cause, StopCause::Restart | StopCause::Fail);
        self.end_attempt(job, now, &stop.reason, failed);
        match stop.cause {
            StopCause::Cancel => {
                job.finished_ms = Some(now);
                set_state(job, JobState::Cancelled, &stop.reason, now);
                self.event(
                    EventKind::JobCancelled,
                    Severity::Info,
                    None,
                    self.about(job, &stop.reason),
                );
            }
            StopCause::Restart if job.restarts < job.spec.max_restarts => {
                job.restarts += 1;
                job.attempt += 1;
                job.ranks.clear();
                let why = format!(
                    "requeued at the front (restart {} of {}) after: {}",
                    job.restarts, job.spec.max_restarts, stop.reason
                );
                set_state(job, JobState::Queued, &why, now);
                self.event(EventKind::JobRequeued, Severity::Warning, None, self.about(job, &why));
            }
            StopCause::Fail => {
                job.finished_ms = Some(now);
                let why = format!("failed: {}", stop.reason);
                set_state(job, JobState::Failed, &why, now);
                self.event(EventKind::JobFailed, Severity::Critical, None, self.about(job, &why));
            }
            StopCause::Restart => {
                job.finished_ms = Some(now);
                let why = format!(
                    "failed: restarts exhausted ({} of max_restarts {}); last failure: {}",
                    job.restarts, job.spec.max_restarts, stop.reason
                );
                set_state(job, JobState::Failed, &why, now);
                self.event(EventKind::JobFailed, Severity::Critical, None, self.about(job, &why));
            }
        }
        self.save(job);
    }
}

pub(super) fn phase_signal(phase: StopPhase) -> RankSignal {
    match phase {
        StopPhase::Checkpoint => RankSignal::Usr1,
        StopPhase::Term => RankSignal::Term,
        StopPhase::Kill => RankSignal::Kill,
    }
}

/// A `signal-rank` command; its id names the rank and the signal, so an agent that runs an id
/// once does not act twice on the same request sent again.
pub(super) fn signal_command(key: &RankKey, signal: RankSignal) -> NodeCommand {
    command_with_args(
        format!("signal-rank-{}-{}-{}-{}", key.job, key.attempt, key.rank, signal.as_str()),
        command_kind::SIGNAL_RANK,
        &SignalRank { key: key.clone(), signal },
    )
}

/// How long a stopping job has to write its checkpoint after SIGUSR1 (the simulator's gang
/// scheduler follows the same rule): `checkpoint_grace`, or, while every rank still runs
/// (`whole`: a drain, not a crash), twice the job's own measured checkpoint write when that is
/// longer — a 405B model's 60 s write must not be cut short by a 30 s grace and cost a rollback
/// instead. A job that already lost a rank cannot finish a
/// collective checkpoint: waiting longer for one would only add to its downtime.
pub fn checkpoint_grace_ms(
    configured: std::time::Duration,
    measured_write_s: Option<f64>,
    whole: bool,
) -> u64 {
    let configured = configured.as_millis() as u64;
    let measured = measured_write_s.filter(|s| whole && s.is_finite() && *s > 0.0);
    measured.map_or(configured, |s| configured.max((2.0 * s * 1000.0).ceil() as u64))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::checkpoint_grace_ms;

    #[test]
    fn a_whole_job_slower_to_checkpoint_than_the_grace_gets_twice_its_measured_write() {
        let grace = Duration::from_secs(30);
        assert_eq!(checkpoint_grace_ms(grace, None, true), 30_000, "nothing measured: the grace");
        assert_eq!(checkpoint_grace_ms(grace, Some(5.0), true), 30_000, "a fast write: the grace");
        assert_eq!(checkpoint_grace_ms(grace, Some(60.0), true), 120_000);
        assert_eq!(checkpoint_grace_ms(grace, Some(60.0), false), 30_000, "a rank is lost");
        assert_eq!(checkpoint_grace_ms(grace, Some(f64::NAN), true), 30_000, "nonsense ignored");
    }
}
