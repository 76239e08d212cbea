//! The jobs' attempts under the gang scheduler (`crate::gang`): placed by the queue's own
//! placement, launched, stopped and requeued as one, each step at the time the slowest agent
//! concerned would have taken its command (its heartbeat phase), as the embedded queue moves
//! them rank by rank.
//!
//! The queue's rules, kept here:
//! - a launch ends when every rank has started (at its node's next heartbeat); a rank on a node
//!   that went down meanwhile fails the attempt after `start_timeout`, one on a node whose fault
//!   kills jobs dies as it starts;
//! - a rank that dies with its node up is seen at once (its agent reports the exit); one on a node
//!   that went silent is lost when the engine turns the node unreachable (or repairing,
//!   validating, quarantined, retired). Either stops the attempt;
//! - a stop asks for a checkpoint and waits for it up to `checkpoint_grace` (twice the measured
//!   write while no rank is lost), or, after the repairer's own request, from that request on;
//!   then SIGTERM; SIGKILL after `stop_grace`; given up on after another `stop_grace`. The
//!   attempt ends when no rank is live, and the job is requeued at the front;
//! - `--checkpoint-every auto`: the queue's Young/Daly interval from the measured write and the
//!   observed time between failed attempts of jobs of the job's size.

use std::collections::BTreeMap;

use fleetmend_repairer::model::NodeState;
use fleetmend_repairer::queue::checkpoint_grace_ms;
use fleetmend_repairer::queue::interval::young_daly_steps;

mod place;
mod slots;

use self::slots::SlotSet;

use super::{ActiveFault, Happening, World};
use crate::gang::Request;
use crate::job::Phase;

/// The phases of an attempt's stop, as the queue's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopPhase {
    Checkpoint,
    Term,
    Kill,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Stop {
    phase: StopPhase,
    since_ms: u64,
    requested_ms: u64,
    /// The job's checkpoints when the stop (or the repairer's request) began: one more is the
    /// checkpoint it waits for.
    checkpoints_before: u64,
    /// No rank was lost when it began: the job can still write a checkpoint.
    whole: bool,
    /// When the slowest up node has taken the stop's signal and reported its rank's exit.
    heard_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Queued,
    Launching { since_ms: u64 },
    Running,
    Stopping(Stop),
}

/// A job's attempts under the gang scheduler.
#[derive(Debug, Clone)]
pub struct GangJob {
    nodes_wanted: u32,
    seq: u64,
    pub attempt: u32,
    pub restarts: u32,
    state: State,
    /// The index of the job in the scheduler's book.
    index: usize,
    /// The attempt's nodes by slot, rank i in slots[i].
    slots: Vec<u32>,
    /// The slots of the last attempt (to count the spares a restart used).
    last_slots: SlotSet,
    /// The slots whose rank has not ended.
    live: SlotSet,
    /// The repairer's checkpoint request in this attempt: when, and the checkpoints before it.
    checkpoint_asked: Option<(u64, u64)>,
    started_ms: u64,
    ended_ms: u64,
    /// Checkpoint write time the job reported (after its first checkpoint).
    measured_write_s: Option<f64>,
    /// Steps between checkpoints the queue last answered (`auto`).
    auto_steps: Option<u64>,
    token: u64,
}

impl GangJob {
    pub fn new(nodes_wanted: u32, index: usize, seq: u64, now: u64) -> GangJob {
        GangJob {
            nodes_wanted,
            index,
            seq,
            attempt: 0,
            restarts: 0,
            state: State::Queued,
            slots: Vec::new(),
            last_slots: SlotSet::default(),
            live: SlotSet::default(),
            checkpoint_asked: None,
            started_ms: now,
            ended_ms: now,
            measured_write_s: None,
            auto_steps: None,
            token: 0,
        }
    }

    /// The nodes it holds: a starting or running attempt its whole allocation, a stopping one
    /// the nodes whose rank is still live.
    fn holds(&self, slot: u32) -> bool {
        match self.state {
            State::Queued => false,
            State::Stopping(_) => self.live.contains(slot),
            State::Launching { .. } | State::Running => true,
        }
    }
}

/// Failed attempts and the running time of jobs of one size, for the observed MTBF.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttemptTally {
    running_ms: u64,
    failures: u64,
}

impl World {
    fn gang_job(&mut self, id: &str) -> Option<&mut GangJob> {
        self.gangs.get_mut(id)
    }

    /// When the first and the last of the attempt's nodes take a command pushed at `at`: each at
    /// its next heartbeat.
    fn heard_span(&self, id: &str, at: u64) -> Option<(u64, u64)> {
        let interval = self.config.repairer.engine.report_interval.as_millis().max(1) as u64;
        let gang = self.gangs.get(id)?;
        gang.slots.iter().fold(None, |span, slot| {
            let phase = super::heartbeat_phase(*slot, interval);
            let t = at + ((phase + interval - at % interval) % interval).max(1);
            Some(match span {
                None => (t, t),
                Some((first, last)) => (first.min(t), last.max(t)),
            })
        })
    }

    /// The nodes of `among` that are down or retired. Such a node is down in [`Presence`] or not
    /// healthy in the engine's eyes (being repaired): those few are read, not every node of
    /// `among`. A retired node was repairing first, and its rank lost then: retired records are
    /// not read.
    ///
    /// [`Presence`]: crate::ports::Presence
    fn silent_among(&self, among: &SlotSet) -> SlotSet {
        let Some(gang) = &self.gang else { return SlotSet::default() };
        let down: Vec<u32> = {
            let book = gang.lock();
            self.presence.down().keys().filter_map(|name| book.slot(name)).collect()
        };
        let not_healthy = self.not_healthy();
        let silent: Vec<u32> = down
            .into_iter()
            .chain(not_healthy.in_slots().map(|(slot, _)| slot))
            // A rank of `among` there (a bit, read first), on a node down or retired.
            .filter(|slot| among.contains(*slot))
            .filter(|slot| self.nodes.get(self.in_slot(*slot)).is_some_and(|s| !s.up || s.retired))
            .collect();
        SlotSet::from_slots(&silent)
    }

    /// The node in `slot` now.
    fn in_slot(&self, slot: u32) -> &str {
        self.slots.get(slot as usize).map_or("", String::as_str)
    }

    fn schedule_gang(&mut self, id: &str, at: u64) {
        let Some(gang) = self.gang_job(id) else { return };
        gang.token += 1;
        let token = gang.token;
        self.schedule(at, Happening::GangStep { job: id.to_owned(), token });
    }

    /// What the repairer asked for and what changed in the fleet since the last look: carried
    /// out after the engine's tasks settle.
    pub fn gang_settle(&mut self) {
        let Some(gang) = self.gang.clone() else { return };
        let mut place = false;
        for request in gang.take() {
            match request {
                Request::Checkpoint { job, at_ms } => self.gang_checkpoint(&job, at_ms),
                Request::Requeue { job } => self.gang_requeue(&job),
                Request::Undrained => place = true,
            }
        }
        let generation = self.fleet.generation();
        if generation != self.gang_generation {
            self.gang_generation = generation;
            self.gang_fleet_changed();
            place = true;
        }
        if place {
            self.gang_place();
        }
    }

    /// The repairer's SIGUSR1 (before it requeues the job off a drained node): the job writes a
    /// checkpoint at its next step and trains on.
    fn gang_checkpoint(&mut self, id: &str, at_ms: u64) {
        let now = self.now();
        let checkpoints = self.jobs.get(id).map_or(0, |j| j.checkpoints);
        let Some(gang) = self.gang_job(id) else { return };
        if !matches!(gang.state, State::Launching { .. } | State::Running) {
            return;
        }
        // The first request of the attempt is the one its ranks act on.
        if gang.checkpoint_asked.is_some() {
            return;
        }
        gang.checkpoint_asked = Some((at_ms, checkpoints));
        if let Some((first, _)) = self.heard_span(id, now) {
            self.usr1_reached(id, first, None);
        }
    }

    /// SIGUSR1 reached the job's first rank at `at` (`stop_requested_ms`: a stop sent it).
    fn usr1_reached(&mut self, id: &str, at: u64, stop_requested_ms: Option<u64>) {
        let held = self.held();
        let on_signal = self.config.job.checkpoint_on_signal;
        let write = self.config.job.checkpoint_write.as_millis() as u64;
        let Some(job) = self.jobs.get_mut(id) else { return };
        let now = self.clock.now_ms();
        job.accrue(now, held);
        if let Some(requested) = stop_requested_ms
            && job.interrupted.is_none_or(|i| i.stop_requested_ms.is_none())
        {
            job.stop_reached(now, requested);
        }
        let alive = !matches!(job.phase, Phase::Interrupted);
        let writing_at_signal = matches!(job.phase, Phase::Writing { signal: true, .. });
        if alive
            && on_signal
            && !writing_at_signal
            && matches!(job.phase, Phase::Training | Phase::Writing { .. })
        {
            job.phase = Phase::Writing { until_ms: at.max(now) + write, signal: true };
        }
        self.plan_job(id);
    }

    /// The repairer requeues the job: its stop counts from the checkpoint it asked for, if any.
    fn gang_requeue(&mut self, id: &str) {
        let now = self.now();
        let Some(gang) = self.gang_job(id) else { return };
        if !matches!(gang.state, State::Launching { .. } | State::Running) {
            return;
        }
        let asked = gang.checkpoint_asked;
        self.gang_begin_stop(id, now, asked);
    }

    /// Starts stopping the attempt; `asked`: the repairer's checkpoint request it waits on (else
    /// the stop sends SIGUSR1 itself).
    fn gang_begin_stop(&mut self, id: &str, now: u64, asked: Option<(u64, u64)>) {
        let checkpoints = self.jobs.get(id).map_or(0, |j| j.checkpoints);
        let Some(gang) = self.gang_job(id) else { return };
        let whole = gang.live.len() == gang.slots.len();
        let (since_ms, checkpoints_before) = asked.unwrap_or((now, checkpoints));
        gang.state = State::Stopping(Stop {
            phase: StopPhase::Checkpoint,
            since_ms: since_ms.min(now),
            requested_ms: now,
            checkpoints_before,
            whole,
            heard_ms: now,
        });
        if asked.is_none()
            && let Some((first, _)) = self.heard_span(id, now)
        {
            self.usr1_reached(id, first, Some(now));
        }
        self.gang_advance(id);
    }

    /// A timed step of an attempt.
    pub(super) fn gang_step(&mut self, id: &str, token: u64) {
        let now = self.now();
        let Some(gang) = self.gang_job(id).filter(|g| g.token == token) else { return };
        match gang.state {
            State::Launching { since_ms } => self.gang_launched(id, since_ms, now),
            State::Stopping(_) => self.gang_advance(id),
            State::Queued | State::Running => {}
        }
    }

    /// Every rank of the attempt has been sent to its node: it runs, or a rank failed to start.
    fn gang_launched(&mut self, id: &str, since_ms: u64, now: u64) {
        let start_timeout = self.config.repairer.queue.start_timeout.as_millis() as u64;
        let every_fault_kills = self.config.job.every_fault_kills;
        let Some(gang) = self.gangs.get(id) else { return };
        let down = !self.silent_among(&gang.live).is_empty();
        if down && now < since_ms + start_timeout {
            self.schedule_gang(id, since_ms + start_timeout);
            return;
        }
        let kills =
            |f: &ActiveFault| every_fault_kills || self.catalog.categories[f.category].kills_job;
        let doomed: Vec<u32> = self
            .faulted
            .iter()
            .filter_map(|name| {
                let node = self.nodes.get(name)?;
                let current = self.in_slot(node.slot) == name;
                let kills = node.fault.as_ref().is_some_and(kills);
                (current && kills && gang.live.contains(node.slot)).then_some(node.slot)
            })
            .collect();
        if down || !doomed.is_empty() {
            self.gang_failed(id, &doomed, now);
            return;
        }
        let restart = self.config.job.restart.as_millis() as u64;
        if let Some(gang) = self.gang_job(id) {
            gang.state = State::Running;
        }
        let held = self.held();
        if let Some(job) = self.jobs.get_mut(id) {
            job.accrue(now, held);
            job.phase = Phase::Restarting { until_ms: now + restart };
        }
        self.plan_job(id);
    }

    /// A rank of the attempt failed at `now` (those on `ended` exited, their agents said so): the
    /// job stops where it is and the attempt is stopped to restart.
    fn gang_failed(&mut self, id: &str, ended: &[u32], now: u64) {
        let held = self.held();
        if let Some(job) = self.jobs.get_mut(id) {
            job.accrue(now, held);
            job.kill(now);
        }
        self.plan_job(id);
        self.gang_ranks_ended(id, ended);
        let running = self
            .gangs
            .get(id)
            .is_some_and(|g| matches!(g.state, State::Launching { .. } | State::Running));
        if running {
            self.gang_begin_stop(id, now, None);
        } else {
            self.gang_advance(id);
        }
    }

    /// A fault killed the rank on `node` at `now` (`reported`: its agent saw the exit).
    pub(super) fn gang_rank_died(&mut self, node: &str, now: u64, reported: bool) {
        let Some(gang) = self.gang.clone() else { return };
        let held = {
            let book = gang.lock();
            book.slot(node).and_then(|slot| {
                let index = book.holder[slot as usize]?;
                Some((slot, book.jobs.get(index)?.0.clone()))
            })
        };
        let Some((slot, id)) = held else { return };
        if reported {
            self.gang_failed(&id, &[slot], now);
        } else {
            // The job stops making progress; the queue hears of it when the node turns unusable.
            let held = self.held();
            if let Some(job) = self.jobs.get_mut(&id) {
                job.accrue(now, held);
                job.kill(now);
            }
            self.plan_job(&id);
        }
    }

    /// Moves a stopping attempt on: its checkpoint written or its grace over, SIGTERM; SIGKILL;
    /// given up on; done when no rank is live.
    fn gang_advance(&mut self, id: &str) {
        let now = self.now();
        let grace = self.config.repairer.queue.checkpoint_grace;
        let stop_grace = self.config.repairer.queue.stop_grace.as_millis() as u64;
        let checkpoints = self.jobs.get(id).map_or(0, |j| j.checkpoints);
        let Some(gang) = self.gangs.get(id) else { return };
        let State::Stopping(stop) = gang.state else { return };
        let measured = gang.measured_write_s;
        if matches!(stop.phase, StopPhase::Term | StopPhase::Kill) && now >= stop.heard_ms {
            // Every up node has taken the signal and reported its rank's exit.
            let silent = self.silent_among(&gang.live);
            self.gang_ranks_ended_but(id, &silent);
        }
        let Some(gang) = self.gangs.get(id) else { return };
        if gang.live.is_empty() {
            self.gang_finish_stop(id, now);
            return;
        }
        let elapsed = now.saturating_sub(stop.since_ms);
        let next = match stop.phase {
            StopPhase::Checkpoint => {
                let grace = checkpoint_grace_ms(grace, measured, stop.whole);
                if checkpoints > stop.checkpoints_before || elapsed >= grace {
                    Some(StopPhase::Term)
                } else {
                    self.schedule_gang(id, stop.since_ms + grace);
                    None
                }
            }
            StopPhase::Term if elapsed >= stop_grace => Some(StopPhase::Kill),
            StopPhase::Kill if elapsed >= stop_grace => {
                // No exit reported after SIGKILL: given up on.
                self.gang_finish_stop(id, now);
                return;
            }
            StopPhase::Term | StopPhase::Kill => {
                let next =
                    if now < stop.heard_ms { stop.heard_ms } else { stop.since_ms + stop_grace };
                self.schedule_gang(id, next);
                None
            }
        };
        if let Some(phase) = next {
            self.gang_signal(id, stop, phase, now);
        }
    }

    /// SIGTERM or SIGKILL to the live ranks: the job stops at the first; the attempt moves on
    /// when the slowest up node has taken it.
    fn gang_signal(&mut self, id: &str, stop: Stop, phase: StopPhase, now: u64) {
        let heard_ms = self.heard_span(id, now).map_or(now, |(_, last)| last);
        if let Some(gang) = self.gang_job(id) {
            gang.state = State::Stopping(Stop { phase, since_ms: now, heard_ms, ..stop });
        }
        let held = self.held();
        if let Some(job) = self.jobs.get_mut(id) {
            job.accrue(now, held);
            if job.interrupted.is_none_or(|i| i.stop_requested_ms.is_none()) {
                job.stop_reached(now, stop.requested_ms);
            }
            job.phase = Phase::Interrupted;
        }
        self.plan_job(id);
        self.schedule_gang(id, heard_ms.max(now + 1));
    }

    fn gang_ranks_ended(&mut self, id: &str, slots: &[u32]) {
        if let Some(job) = self.gangs.get_mut(id) {
            for slot in slots {
                job.live.remove(*slot);
            }
        }
        self.release(id, slots.iter());
    }

    /// Every live rank ended but those on `silent` nodes.
    fn gang_ranks_ended_but(&mut self, id: &str, silent: &SlotSet) {
        let Some(job) = self.gangs.get_mut(id) else { return };
        let ended: Vec<u32> = job.live.iter().filter(|n| !silent.contains(*n)).collect();
        for slot in &ended {
            job.live.remove(*slot);
        }
        self.release(id, ended.iter());
    }

    /// The job's ranks in `slots` hold them no more: they are idle (a retired node's slot too:
    /// placement passes it over until its replacement joins).
    fn release<'a>(&mut self, id: &str, slots: impl Iterator<Item = &'a u32>) {
        let (Some(gang), Some(index)) = (self.gang.clone(), self.gangs.get(id).map(|g| g.index))
        else {
            return;
        };
        let mut book = gang.lock();
        for slot in slots {
            if let Some(holder) = book.holder.get_mut(*slot as usize)
                && *holder == Some(index)
            {
                *holder = None;
                if let Some(idle) = self.gang_idle.get_mut(*slot as usize) {
                    *idle = true;
                }
            }
        }
    }

    /// The job's attempt takes `slots`.
    fn hold(&mut self, id: &str, slots: &[u32]) {
        let (Some(gang), Some(index)) = (self.gang.clone(), self.gangs.get(id).map(|g| g.index))
        else {
            return;
        };
        let mut book = gang.lock();
        for slot in slots {
            if let Some(holder) = book.holder.get_mut(*slot as usize) {
                *holder = Some(index);
            }
            if let Some(idle) = self.gang_idle.get_mut(*slot as usize) {
                *idle = false;
            }
        }
        if let Some(job) = book.jobs.get_mut(index) {
            job.1 = slots.to_vec();
        }
    }

    /// No rank is live: the attempt ends and the job is requeued at the front.
    fn gang_finish_stop(&mut self, id: &str, now: u64) {
        let Some(job) = self.gangs.get_mut(id) else { return };
        job.restarts += 1;
        job.ended_ms = now;
        job.state = State::Queued;
        job.token += 1;
        let size = job.nodes_wanted;
        let ran = now.saturating_sub(job.started_ms);
        let slots = std::mem::take(&mut job.slots);
        let index = job.index;
        job.live.clear();
        self.release(id, slots.iter());
        if let Some(gang) = &self.gang
            && let Some(job) = gang.lock().jobs.get_mut(index)
        {
            job.1.clear();
        }
        let tally = self.gang_attempts.entry(size).or_default();
        tally.running_ms += ran;
        tally.failures += 1;
        self.gang_place();
    }

    /// The fleet changed: a live rank on a node that can no longer run it (unreachable,
    /// repairing, validating, quarantined, retired) is lost. A drained node still can: the
    /// repair workflow stops its jobs. The few nodes that are not healthy are read, not every
    /// job's every rank.
    fn gang_fleet_changed(&mut self) {
        let now = self.now();
        let Some(gang) = self.gang.clone() else { return };
        let unusable: Vec<(u32, usize)> = {
            let book = gang.lock();
            // A retired node was repairing first: its rank was lost then. (Retired nodes stay
            // in the engine's records, and are passed over here unread.)
            self.not_healthy()
                .in_slots()
                .filter(|(_, state)| {
                    matches!(
                        state,
                        NodeState::Unreachable
                            | NodeState::Repairing
                            | NodeState::Validating
                            | NodeState::Quarantined
                    )
                })
                .filter_map(|(slot, _)| Some((slot, book.holder[slot as usize]?)))
                .collect()
        };
        let mut lost: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (id, job) in &self.gangs {
            for (slot, _) in
                unusable.iter().filter(|(s, i)| *i == job.index && job.live.contains(*s))
            {
                lost.entry(id.clone()).or_default().push(*slot);
            }
        }
        for (id, gone) in lost {
            let running = self
                .gangs
                .get(&id)
                .is_some_and(|g| matches!(g.state, State::Launching { .. } | State::Running));
            if running {
                self.gang_failed(&id, &gone, now);
            } else {
                self.gang_ranks_ended(&id, &gone);
                self.gang_advance(&id);
            }
        }
    }

    /// A checkpoint the job wrote (`write_s` seconds): a stop waiting for it moves on; under
    /// `auto`, the interval the queue would answer with.
    pub(super) fn gang_checkpoint_written(&mut self, id: &str, write_s: f64) {
        if let Some(gang) = self.gang_job(id) {
            gang.measured_write_s = Some(write_s);
        }
        if self.gangs.get(id).is_some_and(|g| matches!(g.state, State::Stopping(_))) {
            self.gang_advance(id);
        }
    }

    /// The checkpoint interval, in steps, the queue would answer the job's progress post with
    /// under `auto` (its last answer until the write is measured).
    pub(super) fn gang_auto_steps(&mut self, id: &str) -> Option<u64> {
        let now = self.now();
        let prior = self.config.repairer.queue.mtbf_prior.as_secs_f64();
        let step_s = self.config.job.step_time.as_secs_f64();
        let gang = self.gangs.get(id)?;
        let size = gang.nodes_wanted;
        let mut tally = self.gang_attempts.get(&size).copied().unwrap_or_default();
        for other in self.gangs.values().filter(|g| g.nodes_wanted == size) {
            if other.state != State::Queued {
                tally.running_ms += now.saturating_sub(other.started_ms);
            }
        }
        let mtbf = if tally.failures > 0 {
            tally.running_ms as f64 / 1000.0 / tally.failures as f64
        } else {
            prior
        };
        let steps = young_daly_steps(gang.measured_write_s, mtbf, Some(1.0 / step_s));
        let gang = self.gang_job(id)?;
        gang.auto_steps = steps.or(gang.auto_steps);
        gang.auto_steps
    }

    /// Queues a job of `nodes` nodes under the gang scheduler (placed when the engine's tasks
    /// next settle).
    pub fn submit_gang(&mut self, id: &str, nodes: u32, seq: u64) {
        let now = self.now();
        let Some(gang) = self.gang.clone() else { return };
        let index = {
            let mut book = gang.lock();
            book.jobs.push((id.to_owned(), Vec::new()));
            book.jobs.len() - 1
        };
        self.gangs.insert(id.to_owned(), GangJob::new(nodes, index, seq, now));
        // Placement looks at the next settle.
        self.gang_generation = u64::MAX;
    }

    /// Restarts per job, under the gang scheduler.
    pub fn gang_restarts(&self, id: &str) -> Option<u32> {
        self.gangs.get(id).map(|g| g.restarts)
    }
}

/// Per job size: failed attempts and their running time.
pub type AttemptTallies = BTreeMap<u32, AttemptTally>;
