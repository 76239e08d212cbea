//! A simulated training job as the checkpoint protocol has it behave: its ranks start when the
//! queue launches them, it restarts from its newest checkpoint, trains, writes a checkpoint every
//! interval (stopping to write), writes one more when SIGUSR1 asks before a drain (if it is still
//! alive), and dies where a fault kills one of its ranks. Its time is accounted as it goes: new
//! training, training again over lost steps, and each cause of lost time.

use crate::report::{JobResult, LostTime};

/// What the job is doing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    /// Queued: no attempt runs.
    Waiting,
    /// Ranks of a new attempt are starting.
    Launching,
    /// Every rank runs; rendezvous and loading the checkpoint until `until_ms`.
    Restarting {
        until_ms: u64,
    },
    Training,
    /// Writing a checkpoint until `until_ms` (`signal`: asked to, before a drain).
    Writing {
        until_ms: u64,
        signal: bool,
    },
    /// A rank died (or the attempt is being stopped): nothing moves until the next attempt.
    Interrupted,
}

/// One simulated job.
#[derive(Debug, Clone)]
pub struct SimJob {
    pub id: String,
    pub nodes: u32,
    pub token: String,
    /// The attempt running (or last run).
    pub attempt: Option<u32>,
    pub ranks_started: u32,
    pub phase: Phase,
    /// Up to when the time is accounted.
    accounted_ms: u64,
    /// Training done in this attempt's timeline, seconds (the model's state).
    pub progress_s: f64,
    /// The furthest training ever reached, seconds.
    high_water_s: f64,
    /// Training saved in the newest checkpoint, seconds.
    pub checkpoint_s: f64,
    /// Training at which the next periodic checkpoint is due.
    pub next_checkpoint_s: f64,
    pub interval_s: f64,
    /// Training at which rank 0 posts its progress next.
    pub next_post_s: f64,
    /// From when the interruption's time is not accounted yet, and whether the job was dead
    /// (detection time) or alive (it was asked to stop).
    pub interrupted: Option<Interruption>,
    pub productive_s: f64,
    pub lost_s: LostTime,
    pub interruptions: u32,
    pub checkpoints: u64,
    pub at_signal: u32,
    /// Invalidates wakes scheduled for an earlier plan.
    pub wake_token: u64,
}

/// An interruption not accounted yet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interruption {
    pub since_ms: u64,
    pub dead: bool,
    /// When the queue began stopping the attempt, once known.
    pub stop_requested_ms: Option<u64>,
}

impl SimJob {
    pub fn new(id: &str, nodes: u32, token: &str, interval_s: f64, now: u64) -> SimJob {
        SimJob {
            id: id.to_owned(),
            nodes,
            token: token.to_owned(),
            attempt: None,
            ranks_started: 0,
            phase: Phase::Waiting,
            accounted_ms: now,
            progress_s: 0.0,
            high_water_s: 0.0,
            checkpoint_s: 0.0,
            next_checkpoint_s: interval_s,
            interval_s,
            next_post_s: 0.0,
            interrupted: None,
            productive_s: 0.0,
            lost_s: LostTime::default(),
            interruptions: 0,
            checkpoints: 0,
            at_signal: 0,
            wake_token: 0,
        }
    }

    /// Accounts the time up to `now` to the current phase; `held`: a guard rail holds nodes
    /// back (waiting counts as held).
    pub fn accrue(&mut self, now: u64, held: bool) {
        let dt = now.saturating_sub(self.accounted_ms) as f64 / 1000.0;
        self.accounted_ms = self.accounted_ms.max(now);
        if dt <= 0.0 {
            return;
        }
        match self.phase {
            Phase::Waiting if held => self.lost_s.held_by_guard_rail += dt,
            Phase::Waiting => self.lost_s.waiting_for_nodes += dt,
            Phase::Launching | Phase::Restarting { .. } => self.lost_s.restart += dt,
            Phase::Training => {
                let before = self.progress_s;
                self.progress_s += dt;
                let redone = (self.high_water_s.min(self.progress_s) - before).max(0.0);
                self.lost_s.rollback += redone;
                self.productive_s += dt - redone;
                self.high_water_s = self.high_water_s.max(self.progress_s);
            }
            Phase::Writing { signal: false, .. } => self.lost_s.checkpoint_writes += dt,
            Phase::Writing { signal: true, .. } => self.lost_s.drain_and_checkpoint += dt,
            // Split when the next attempt starts (`account_interruption`).
            Phase::Interrupted => {}
        }
    }

    /// When the job next has something to do by itself (a restart ending, a checkpoint due or
    /// written, a progress post), if anything.
    pub fn next_wake(&self) -> Option<u64> {
        let at = |seconds: f64| self.accounted_ms + (seconds.max(0.0) * 1000.0).ceil() as u64;
        match self.phase {
            Phase::Restarting { until_ms } | Phase::Writing { until_ms, .. } => Some(until_ms),
            Phase::Training => {
                let next = self.next_checkpoint_s.min(self.next_post_s);
                Some(at(next - self.progress_s))
            }
            _ => None,
        }
    }

    /// A fault killed one of its ranks at `now` (accounted up to `now` before).
    pub fn kill(&mut self, now: u64) {
        if self.interrupted.is_none() && self.attempt.is_some() && self.phase != Phase::Waiting {
            self.interrupted =
                Some(Interruption { since_ms: now, dead: true, stop_requested_ms: None });
            self.interruptions += 1;
        }
        self.phase = Phase::Interrupted;
    }

    /// The queue's stop reached the job while it was alive (accounted up to `now` before).
    pub fn stop_reached(&mut self, now: u64, requested_ms: u64) {
        match &mut self.interrupted {
            Some(interruption) => {
                interruption.stop_requested_ms.get_or_insert(requested_ms);
            }
            None => {
                self.interruptions += 1;
                self.interrupted = Some(Interruption {
                    since_ms: now,
                    dead: false,
                    stop_requested_ms: Some(requested_ms),
                });
            }
        }
    }

    /// A new attempt launched at `launched_ms`; the last one ended (was requeued) at `ended_ms`.
    /// Splits the interruption's time into detection, the stop, and waiting for nodes.
    pub fn account_interruption(&mut self, ended_ms: u64, launched_ms: u64, held: bool) {
        let Some(interruption) = self.interrupted.take() else { return };
        let since = interruption.since_ms;
        let ended = ended_ms.clamp(since, launched_ms.max(since));
        let launched = launched_ms.max(ended);
        let detection = match (interruption.dead, interruption.stop_requested_ms) {
            (true, Some(requested)) => requested.clamp(since, ended) - since,
            _ => 0,
        };
        let seconds = |ms: u64| ms as f64 / 1000.0;
        self.lost_s.detection += seconds(detection);
        self.lost_s.drain_and_checkpoint += seconds(ended - since - detection);
        if held {
            self.lost_s.held_by_guard_rail += seconds(launched - ended);
        } else {
            self.lost_s.waiting_for_nodes += seconds(launched - ended);
        }
        self.accounted_ms = self.accounted_ms.max(launched);
    }

    /// The figures, at the end of a run of `wall_s` seconds.
    pub fn result(&self, wall_s: f64, restarts: u32, interval_s: f64) -> JobResult {
        let hours = |s: f64| s / 3600.0;
        let l = &self.lost_s;
        JobResult {
            id: self.id.clone(),
            nodes: self.nodes,
            ettr: if wall_s > 0.0 { self.productive_s / wall_s } else { 0.0 },
            wall_hours: hours(wall_s),
            productive_hours: hours(self.productive_s),
            lost_hours: LostTime {
                detection: hours(l.detection),
                drain_and_checkpoint: hours(l.drain_and_checkpoint),
                rollback: hours(l.rollback),
                restart: hours(l.restart),
                waiting_for_nodes: hours(l.waiting_for_nodes),
                held_by_guard_rail: hours(l.held_by_guard_rail),
                checkpoint_writes: hours(l.checkpoint_writes),
            },
            interruptions: self.interruptions,
            restarts,
            checkpoints: self.checkpoints,
            checkpointed_at_signal: self.at_signal,
            checkpoint_interval_seconds: interval_s,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn training_over_lost_steps_is_rollback_not_new_work() {
        let mut job = SimJob::new("j-1", 4, "t", 600.0, 0);
        job.attempt = Some(0);
        job.phase = Phase::Training;
        job.accrue(1_000_000, false);
        assert_eq!(job.productive_s, 1_000.0);
        job.checkpoint_s = 600.0;
        job.kill(1_000_000);
        job.stop_reached(1_001_000, 1_000_500);
        job.account_interruption(1_010_000, 1_020_000, false);
        assert_eq!(job.lost_s.detection, 0.5);
        assert_eq!(job.lost_s.drain_and_checkpoint, 9.5);
        assert_eq!(job.lost_s.waiting_for_nodes, 10.0);
        job.progress_s = job.checkpoint_s;
        job.phase = Phase::Training;
        job.accrue(1_020_000 + 500_000, false);
        assert_eq!(job.lost_s.rollback, 400.0);
        assert_eq!(job.productive_s, 1_100.0);
        assert_eq!(job.interruptions, 1);
    }
}
