//! Placement under the gang scheduler: the queue's own placement ([`placement::place_indexed`],
//! the nodes by their place among the candidates) over the idle nodes, and the launch of the
//! attempts it places.

use std::collections::BTreeSet;

use fleetmend_repairer::model::NodeState;
use fleetmend_repairer::queue::placement::{self, Candidate, Waiting};

use super::slots::SlotSet;
use super::{GangJob, State};
use crate::gang::GangScheduler;
use crate::job::Phase;
use crate::world::World;
use crate::world::not_healthy::NotHealthy;

impl World {
    /// Places the waiting jobs with the queue's placement, where the fleet has room for them.
    pub(super) fn gang_place(&mut self) {
        let Some(gang) = self.gang.clone() else { return };
        let now = self.now();
        let Some(smallest) = self
            .gangs
            .values()
            .filter(|g| g.state == State::Queued)
            .map(|g| u64::from(g.nodes_wanted))
            .min()
        else {
            return;
        };
        // Placement reads the idle nodes (those no job holds, kept as the jobs come and go), not
        // the whole fleet, and only when the healthy nodes no job holds could fit a job.
        let not_healthy = self.not_healthy();
        if smallest > self.gang_free(&gang, &not_healthy) {
            return;
        }
        let waiting: Vec<Waiting<'_>> = self
            .gangs
            .iter()
            .filter(|(_, g)| matches!(g.state, State::Queued | State::Stopping(_)))
            .map(|(id, g)| Waiting {
                id,
                nodes: g.nodes_wanted,
                priority: 0,
                requeued: g.restarts > 0,
                seq: g.seq,
                previous_port: None,
                stopping: matches!(g.state, State::Stopping(_)),
            })
            .collect();
        // The idle nodes (a retired node's slot is none until its replacement joins:
        // `gang_vacant`), healthy, undrained and heard from but for the few the engine says are
        // not healthy, the drains and the silent.
        let placements = {
            let book = gang.lock();
            let idle: Vec<u32> = self
                .gang_idle
                .iter()
                .enumerate()
                .filter(|(slot, idle)| **idle && !self.gang_vacant.get(*slot).is_some_and(|v| *v))
                .map(|(slot, _)| slot as u32)
                .collect();
            let mut candidates: Vec<Candidate<'_>> = idle
                .iter()
                .map(|slot| Candidate {
                    name: self.in_slot(*slot),
                    state: NodeState::Healthy,
                    last_report_ms: now,
                    address: None,
                    drained: false,
                    spare: false,
                    busy: false,
                })
                .collect();
            // `idle` is in slot order: a node's candidate is found by its slot.
            for (slot, state) in not_healthy.in_slots() {
                if let Ok(i) = idle.binary_search(&slot) {
                    candidates[i].state = state;
                }
            }
            for (slot, spare) in book.drained_slots() {
                if let Ok(i) = idle.binary_search(&slot) {
                    candidates[i].drained = true;
                    candidates[i].spare = spare;
                }
            }
            for (name, since) in self.presence.down() {
                if let Some(i) = book.slot(&name).and_then(|slot| idle.binary_search(&slot).ok()) {
                    candidates[i].last_report_ms = since;
                }
            }
            let (placed, _blocked) = placement::place_indexed(
                &waiting,
                &candidates,
                &BTreeSet::new(),
                29_500..=29_999,
                now,
                self.unreachable_window_ms,
            );
            let slots = |chosen: &[usize]| chosen.iter().map(|i| idle[*i]).collect::<Vec<u32>>();
            placed
                .into_iter()
                .map(|p| (p.job, slots(&p.nodes), slots(&p.spares)))
                .collect::<Vec<_>>()
        };
        for (job, slots, spares) in placements {
            {
                let mut book = gang.lock();
                for spare in spares {
                    let name = self.in_slot(spare);
                    book.lift_drain(name);
                }
            }
            self.gang_launch(&job, slots, now);
        }
    }

    /// Launches the job's next attempt on `slots`.
    fn gang_launch(&mut self, id: &str, slots: Vec<u32>, now: u64) {
        let held = self.held();
        let chosen = SlotSet::from_slots(&slots);
        let Some(job) = self.gangs.get_mut(id) else { return };
        if job.attempt > 0 {
            self.tally.spares_used += chosen.count_not_in(&job.last_slots) as u32;
        }
        job.last_slots = chosen.clone();
        job.attempt += 1;
        job.started_ms = now;
        job.checkpoint_asked = None;
        job.state = State::Launching { since_ms: now };
        job.live = chosen;
        job.slots = slots.clone();
        let attempt = job.attempt;
        let ended = job.ended_ms;
        self.hold(id, &slots);
        if let Some(sim) = self.jobs.get_mut(id) {
            sim.accrue(now, held);
            sim.account_interruption(ended, now, held);
            sim.accrue(now, held);
            sim.attempt = Some(attempt);
            sim.phase = Phase::Launching;
        }
        let started = self.heard_span(id, now).map_or(now + 1, |(_, last)| last);
        self.schedule_gang(id, started);
    }

    /// The healthy nodes no job holds: a bound on what placement could find. A node's state is
    /// the engine's: healthy unless among the few that are not.
    fn gang_free(&self, gang: &GangScheduler, not_healthy: &NotHealthy) -> u64 {
        let held: usize = self
            .gangs
            .values()
            .map(|g| match g.state {
                State::Queued => 0,
                State::Stopping(_) => g.live.len(),
                State::Launching { .. } | State::Running => g.slots.len(),
            })
            .sum();
        let held_not_healthy = {
            let book = gang.lock();
            let mut by_index: Vec<Option<&GangJob>> = vec![None; book.jobs.len()];
            for job in self.gangs.values() {
                if let Some(at) = by_index.get_mut(job.index) {
                    *at = Some(job);
                }
            }
            not_healthy
                .in_slots()
                .filter(|(slot, _)| {
                    book.holder[*slot as usize]
                        .and_then(|index| by_index.get(index).copied().flatten())
                        .is_some_and(|g| g.holds(*slot))
                })
                .count()
        };
        self.fleet.healthy().saturating_sub(held.saturating_sub(held_not_healthy) as u64)
    }
}
