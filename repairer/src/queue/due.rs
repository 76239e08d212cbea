//! When the queue's tick next has work with time alone: what [`JobQueue::tick`] returns so that
//! it runs when something is due, not every second. Everything else the tick does follows input
//! (a report, a progress post, a job submitted or cancelled, a drain, a node's change), which
//! wakes it.

use super::health::{self, HangRule};
use super::tick::{DIRTY_SAVE_EVERY, PLACEMENT_RETRY, STRAGGLER_HOLD};
use super::{JobQueue, JobState, QueueState};
use crate::clock::Earliest;

fn millis(duration: std::time::Duration) -> u64 {
    duration.as_millis() as u64
}

impl JobQueue {
    /// The earliest moment after `now` at which the tick may find work that it did not find at
    /// `now` with nothing else changed; `None`: only input brings work.
    pub(super) fn next_due(&self, state: &QueueState, now: u64) -> Option<u64> {
        let mut next = Earliest::after(now);
        // Moves the tick makes every second until they are over: a job starting (its ranks'
        // start timeout), stopping (the grace periods of the stop sequence), or whose ranks moved.
        let busy =
            state.jobs.values().any(|j| matches!(j.state, JobState::Starting | JobState::Stopping));
        if busy || !state.moved.is_empty() {
            next.add(now);
        }
        self.queued_due(state, &mut next);
        let rule = HangRule { factor: self.config.hang_factor, floor: self.config.hang_floor };
        for job in state.jobs.values().filter(|j| j.state == JobState::Running) {
            next.merge(health::hang_due(job, &rule));
        }
        // A node named in a hang is forgotten once the window passed.
        let window = millis(self.config.hang_window);
        for times in state.hang_named.values() {
            next.merge(times.iter().min().map(|at| at.saturating_add(window)));
        }
        // A straggler whose job stopped is cleared once held long enough.
        let hold = millis(STRAGGLER_HOLD);
        for (_, raised) in state.stragglers.values() {
            next.add_later(raised.saturating_add(hold));
        }
        let grace = millis(self.config.stop_grace) * 4;
        next.merge(state.stale_kills.values().min().map(|sent| sent.saturating_add(grace)));
        // A job's changed figures are saved at most every DIRTY_SAVE_EVERY.
        let every = millis(DIRTY_SAVE_EVERY);
        for id in &state.dirty {
            next.add(state.dirty_saved_ms.get(id).map_or(now, |at| at.saturating_add(every)));
        }
        next.earliest()
    }

    /// A queued job is placed again when placement may find room (at once, or after the retry
    /// while the fleet stands still), and its wait is alerted once it passes `wait_alert`.
    fn queued_due(&self, state: &QueueState, next: &mut Earliest) {
        let wait_alert = millis(self.config.wait_alert);
        let mut queued = false;
        for job in state.jobs.values().filter(|j| j.state == JobState::Queued) {
            queued = true;
            if state.wait_alerted.get(&job.id) != Some(&job.state_since_ms) {
                next.add(job.state_since_ms.saturating_add(wait_alert));
            }
        }
        if queued {
            let retry = millis(PLACEMENT_RETRY);
            match state.placement_blocked {
                Some((_, at)) => next.add(at.saturating_add(retry)),
                None => next.add(0),
            }
        }
    }
}
