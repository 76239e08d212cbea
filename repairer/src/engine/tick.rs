//! The engine's time-based work: nodes that went silent become unreachable, and the nodes whose
//! decision can change with time alone (a debounce or a drain window passing, a cooldown ending,
//! a repair leaving the escalation windows) are decided again. It runs when something is due,
//! not every second: each pass says when the next one may find work ([`Next`]), and a node's
//! change wakes it ([`crate::nodes::Nodes::subscribe`]).

use std::sync::{Arc, PoisonError};

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::Engine;
use super::apply::{never_decided, view};
use super::ingest::UNREACHABLE;
use crate::clock::{Earliest, Next};
use crate::model::{Actor, FindingSource, NodeState, TrackedFinding};
use crate::nodes::{self, NodeRecord, NodesGuard};
use crate::policy::{self, Hold};

/// Whether `node`'s action is held by the breaker or a limit on the fleet (what only a change of
/// the fleet or the breaker releases).
fn held_by_the_fleet(node: &NodeRecord) -> bool {
    let fleet_holds = [Hold::Breaker, Hold::MaxConcurrentRepairs, Hold::MaxUnavailable];
    node.last_noted.as_deref().is_some_and(|note| {
        note.strip_prefix("held:").is_some_and(|held| {
            fleet_holds.iter().any(|hold| held.ends_with(&format!(":{}", hold.as_str())))
        })
    })
}

/// Whether a silent `node` is one the tick marks unreachable: a working member, not one a
/// repair took down, not one a person drained (planned work: a reboot, a driver upgrade), not one
/// marked already.
fn may_turn_unreachable(node: &NodeRecord) -> bool {
    !node.findings.iter().any(|t| t.finding.finding == UNREACHABLE)
        && node.state.is_member()
        && !node.unknown
        && node.state != NodeState::Repairing
        && !node.drained_by_person
}

impl Engine {
    /// Time-based work: unreachable nodes, debounce durations, cooldowns ending, held actions.
    /// Returns when it may next find something to do with time alone.
    pub fn tick(self: &Arc<Self>, now: u64) -> Next {
        let deadline = self.silence_ms();
        let names: Vec<String> = {
            let mut nodes = self.nodes.lock();
            let heartbeats = self.nodes.heartbeats();
            let heard = |node: &NodeRecord| match heartbeats {
                Some(heartbeats) => heartbeats.last_heard_ms(&node.name, node.last_report_ms),
                None => node.last_report_ms,
            };
            let is_silent = |node: &NodeRecord| {
                now.saturating_sub(heard(node).max(self.started_ms)) > deadline
                    && may_turn_unreachable(node)
            };
            let silent: Vec<String> = match heartbeats {
                Some(heartbeats) => heartbeats
                    .maybe_silent_since(now.saturating_sub(deadline))
                    .into_iter()
                    .filter(|name| nodes.get(name).is_some_and(is_silent))
                    .collect(),
                None => nodes.records().filter(|n| is_silent(n)).map(|n| n.name.clone()).collect(),
            };
            for name in silent {
                let marked = nodes
                    .update(&name, |node, events| self.mark_unreachable(node, events, now))
                    .and_then(|()| Ok(nodes.save(&name)?));
                if let Err(err) = marked {
                    tracing::error!(node = %name, error = %err, "recording an unreachable node failed");
                }
            }
            // Nodes whose decision can change with time: debounce durations, cooldowns ending,
            // held actions, drained nodes waiting for their findings to clear (kept as records
            // change, not found by a pass over the fleet). An action held by the breaker or by a
            // limit on the fleet (concurrent repairs, unavailable nodes) waits for the fleet to
            // change, not for time: while no node changed state and the breaker did not move,
            // deciding again about it would decide the same (a storm holds thousands).
            let version = (nodes.generation(), self.breaker.is_open());
            let fleet_moved = {
                let mut last = self.tick_version.lock().unwrap_or_else(PoisonError::into_inner);
                let moved = *last != Some(version);
                *last = Some(version);
                moved
            };
            let mut timed = nodes.timed();
            if !fleet_moved {
                timed.retain(|name| !nodes.get(name).is_some_and(held_by_the_fleet));
            }
            timed
        };
        for name in names {
            if let Err(err) = self.evaluate(&name, now) {
                tracing::error!(node = %name, error = %err, "evaluating a node failed");
            }
        }
        let nodes = self.nodes.lock();
        let mut next = Earliest::after(now);
        next.merge(self.next_silence(&nodes, deadline));
        next.merge(self.next_change(&nodes, now));
        next.next()
    }

    /// How long a node may go unheard before it is unreachable.
    fn silence_ms(&self) -> u64 {
        self.config.report_interval.as_millis() as u64 * u64::from(self.config.unreachable_after)
    }

    /// When the first node that has not been heard from lately turns unreachable if it stays
    /// silent (reports only make it later; where heartbeats are not reports, their source wakes
    /// the tick when a node goes quiet).
    fn next_silence(&self, nodes: &NodesGuard<'_>, deadline: u64) -> Option<u64> {
        let at = |heard: u64| heard.max(self.started_ms).saturating_add(deadline).saturating_add(1);
        match self.nodes.heartbeats() {
            Some(heartbeats) => heartbeats
                .quiet()
                .into_iter()
                .filter(|(name, _)| nodes.get(name).is_some_and(may_turn_unreachable))
                .map(|(_, since)| at(since))
                .min(),
            None => nodes
                .records()
                .filter(|n| may_turn_unreachable(n))
                .map(|n| at(n.last_report_ms))
                .min(),
        }
    }

    /// When the first decision about a timed node may change with time alone. Actions held by
    /// the fleet are left out: they are decided again when the fleet moves, which wakes the tick.
    fn next_change(&self, nodes: &NodesGuard<'_>, now: u64) -> Option<u64> {
        let mut next = Earliest::after(now);
        for name in nodes.timed() {
            let Some(node) = nodes.get(&name) else { continue };
            if never_decided(node) || held_by_the_fleet(node) {
                continue;
            }
            next.merge(policy::next_change(view(node), &self.policy, now));
        }
        next.earliest()
    }

    /// Tracks the repairer's `unreachable` finding on a silent node, and makes a working one
    /// unreachable (the event first: a node whose event could not be written stays as it was).
    fn mark_unreachable(
        &self,
        node: &mut NodeRecord,
        events: &crate::ports::EventLog,
        now: u64,
    ) -> Result<(), crate::store::StoreError> {
        let mut marked = node.clone();
        let finding = Finding::new(
            "repairer",
            UNREACHABLE,
            "",
            Status::Fail,
            RecommendedAction::Reboot,
            format!("no report for {} s", now.saturating_sub(node.last_report_ms) / 1000),
        );
        marked.findings.push(TrackedFinding {
            finding,
            source: FindingSource::Repairer,
            first_seen_ms: now,
            last_seen_ms: now,
            observations: 1,
            looked_ms: None,
        });
        if marked.unhealthy_since_ms.is_none() {
            marked.unhealthy_since_ms = Some(now);
        }
        if matches!(marked.state, NodeState::Healthy | NodeState::Suspect) {
            let reason = format!("no report for {} intervals", self.config.unreachable_after);
            nodes::transition(
                events,
                &mut marked,
                NodeState::Unreachable,
                &reason,
                Actor::repairer(),
                now,
            )?;
        }
        *node = marked;
        Ok(())
    }
}
