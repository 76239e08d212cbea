//! What comes in: agents' reports, findings from external alert sources, and the tick that sees
//! nodes go silent.

use std::sync::{Arc, PoisonError};

use fleetmend_proto::{Finding, RecommendedAction, Report, ReportReply, Status};

use super::{Engine, EngineError};
use crate::inventory::Membership;
use crate::model::TrackedFinding;
use crate::model::{Actor, Event, EventKind, FindingKey, FindingSource, NodeState, Severity};
use crate::nodes::{self, NodeRecord, metrics_target, remove_findings, track};
use crate::policy::Hold;

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

/// The finding the repairer keeps on a node that stopped reporting.
const UNREACHABLE: &str = "unreachable";

impl Engine {
    /// Takes in a report; returns the reply (commands for the node).
    pub fn ingest_report(self: &Arc<Self>, report: &Report) -> Result<ReportReply, EngineError> {
        self.take_report(report).map(|(reply, _)| reply)
    }

    /// Takes in a report; returns the reply and whether its node is held as unknown (outside the
    /// inventory). A report from a node outside the inventory where such are refused, or from one
    /// more than `max_unknown`, is an error and changes nothing.
    pub fn take_report(
        self: &Arc<Self>,
        report: &Report,
    ) -> Result<(ReportReply, bool), EngineError> {
        if self.is_unknown(&report.node)? {
            self.take_unknown_report(report)?;
            return Ok((ReportReply { commands: Vec::new() }, true));
        }
        let now = self.clock.now_ms();
        self.commands.record_results(&report.command_results);
        let mut nodes = self.nodes.lock();
        let joined = nodes.get(&report.node).is_none();
        if joined {
            self.events.record(&Event::new(
                EventKind::NodeJoined,
                Severity::Info,
                Some(&report.node),
                Actor::repairer(),
                format!("first report (agent {}, boot {})", report.agent_version, report.boot_id),
                now,
            ))?;
            nodes.insert(NodeRecord::new(&report.node, now));
        }
        let (changed, rebooted, save) = nodes.update(&report.node, |node, events| {
            // Held as unknown until the inventory took it in: it is in the fleet from now on.
            let came_in = nodes::set_unknown(events, node, false, "in the inventory now", now)?;
            let rebooted = !node.boot_id.is_empty() && node.boot_id != report.boot_id;
            // A new node or a new agent version is saved at once: a restarted repairer must know
            // every node, including those that never had a finding.
            let new_agent =
                node.agent_version.is_empty() || node.agent_version != report.agent_version;
            node.boot_id.clone_from(&report.boot_id);
            node.agent_version.clone_from(&report.agent_version);
            node.last_report_ms = now;
            node.last_seq = report.seq;
            // Saved when it moves (an agent restarted on another port), so a restarted repairer
            // serves service discovery for every node before their next reports.
            let target = metrics_target(report);
            let moved_target = target.is_some() && node.metrics_target != target;
            if moved_target {
                node.metrics_target = target;
            }
            let address = report.address.clone().filter(|a| !a.is_empty());
            let moved_address = address.is_some() && node.address != address;
            if moved_address {
                node.address = address;
            }
            let mut changed = rebooted || came_in;
            // The node reports: it is not unreachable.
            changed |= remove_findings(node, |t| {
                t.source == FindingSource::Repairer && t.finding.finding == UNREACHABLE
            });
            let incoming: Vec<&Finding> =
                report.findings.iter().filter(|f| f.status != Status::Ok).collect();
            changed |= track(node, FindingSource::Agent, &incoming, now);
            Ok((changed, rebooted, changed || new_agent || moved_target || moved_address))
        })?;
        // Started under the lock (so a node's writes are made in the order of its changes) and
        // waited for after it: no other report waits for this one's write.
        let saving = save.then(|| nodes.start_save(&report.node));
        drop(nodes);
        if let Some(saving) = saving {
            saving.wait()?;
        }
        // Only a change that decide() reads decides again: deciding on every first report made
        // 100,000 joining nodes 100,000 decisions for nothing (see BENCHMARKS.md).
        if changed {
            self.evaluate(&report.node, now)?;
        }
        // What a workflow waits for: a new boot, a replacement's first report, a command's result.
        if rebooted || joined || !report.command_results.is_empty() {
            self.progress.notify_waiters();
        }
        // The queue's commands for this node (run-rank, signal-rank) ride in this reply.
        if let Some(observer) = &self.observer {
            observer.observe_report(report, now);
        }
        self.metrics.report_ok();
        Ok((ReportReply { commands: self.commands.take(&report.node) }, false))
    }

    /// Whether `name` is to be held as unknown: outside the inventory where such nodes are
    /// admitted. Outside it where they are refused: an error.
    fn is_unknown(&self, name: &str) -> Result<bool, EngineError> {
        let Some(inventory) = &self.inventory else { return Ok(false) };
        match inventory.membership(name) {
            Membership::Inventoried => Ok(false),
            Membership::Refused => Err(EngineError::NotInInventory(name.to_owned())),
            Membership::Unknown => Ok(true),
        }
    }

    /// A report from a node held as unknown: its record is kept for people to see (agent, boot,
    /// last report, findings); its first report, or the first after it left the inventory, is its
    /// one `node-unknown` event. Nothing else follows: no decision, no command in the reply, no
    /// command result taken, no job placed on it. A node not seen before, with `max_unknown`
    /// others held already, is refused (counted under the same lock as its insertion, so
    /// concurrent reports cannot pass the limit together).
    fn take_unknown_report(&self, report: &Report) -> Result<(), EngineError> {
        let now = self.clock.now_ms();
        let mut nodes = self.nodes.lock();
        let joined = nodes.get(&report.node).is_none();
        let max = self.inventory.as_ref().map_or(u32::MAX, |i| i.max_unknown());
        if joined && nodes.unknown_count() >= max {
            return Err(EngineError::TooManyUnknown { node: report.node.clone(), max });
        }
        if joined {
            let mut record = NodeRecord::new(&report.node, now);
            let reason = format!(
                "first report (agent {}, boot {}) from a node {}",
                report.agent_version,
                report.boot_id,
                nodes::UNKNOWN_REASON
            );
            nodes::set_unknown(&self.events, &mut record, true, &reason, now)?;
            nodes.insert(record);
        }
        let save = nodes.update(&report.node, |node, events| {
            let left = nodes::set_unknown(events, node, true, nodes::UNKNOWN_REASON, now)?;
            let new_agent =
                node.agent_version != report.agent_version || node.boot_id != report.boot_id;
            node.boot_id.clone_from(&report.boot_id);
            node.agent_version.clone_from(&report.agent_version);
            node.last_report_ms = now;
            node.last_seq = report.seq;
            let incoming: Vec<&Finding> =
                report.findings.iter().filter(|f| f.status != Status::Ok).collect();
            let changed = track(node, FindingSource::Agent, &incoming, now);
            Ok(joined || left || new_agent || changed)
        })?;
        let saving = save.then(|| nodes.start_save(&report.node));
        drop(nodes);
        saving.map_or(Ok(()), |saving| Ok(saving.wait()?))
    }

    /// Takes in findings from an external alert source for `node`: `firing` ones are tracked,
    /// resolved ones cleared.
    pub fn ingest_external(
        self: &Arc<Self>,
        node_name: &str,
        source: FindingSource,
        finding: &Finding,
        firing: bool,
    ) -> Result<(), EngineError> {
        if self.inventory.as_ref().is_some_and(|i| i.membership(node_name) == Membership::Refused) {
            return Err(EngineError::NotInInventory(node_name.to_owned()));
        }
        let now = self.clock.now_ms();
        let mut nodes = self.nodes.lock();
        let key = FindingKey::of(finding, source);
        // The change is worked out on a copy first: its event is written before the record
        // changes, so a finding whose event could not be written is not tracked either.
        let Some(mut node) = nodes.get(node_name).cloned() else {
            return Err(EngineError::UnknownNode(node_name.to_owned()));
        };
        let changed = if firing {
            let mut current: Vec<Finding> = node
                .findings
                .iter()
                .filter(|t| t.source == source && t.key() != key)
                .map(|t| t.finding.clone())
                .collect();
            current.push(finding.clone());
            let refs: Vec<&Finding> = current.iter().collect();
            track(&mut node, source, &refs, now)
        } else {
            remove_findings(&mut node, |t| t.key() == key)
        };
        if !changed {
            return Ok(());
        }
        self.events.record(&Event {
            findings: vec![finding.clone()],
            ..Event::new(
                EventKind::Finding,
                Severity::Info,
                Some(node_name),
                Actor(format!("{source:?}").to_lowercase()),
                format!(
                    "{} {} {}",
                    finding.check,
                    finding.finding,
                    if firing { "firing" } else { "resolved" }
                ),
                now,
            )
        })?;
        nodes.update(node_name, |record, _| {
            *record = node;
            Ok(())
        })?;
        nodes.save(node_name)?;
        drop(nodes);
        self.evaluate(node_name, now)
    }

    /// Time-based work: unreachable nodes, debounce durations, cooldowns ending, held actions.
    pub fn tick(self: &Arc<Self>, now: u64) {
        let deadline = self.config.report_interval.as_millis() as u64
            * u64::from(self.config.unreachable_after);
        let names: Vec<String> = {
            let mut nodes = self.nodes.lock();
            let heartbeats = self.nodes.heartbeats();
            let heard = |node: &NodeRecord| match heartbeats {
                Some(heartbeats) => heartbeats.last_heard_ms(&node.name, node.last_report_ms),
                None => node.last_report_ms,
            };
            let is_silent = |node: &NodeRecord| {
                now.saturating_sub(heard(node).max(self.started_ms)) > deadline
                    && !node.findings.iter().any(|t| t.finding.finding == UNREACHABLE)
                    && node.state.is_member()
                    && !node.unknown
                    && node.state != NodeState::Repairing
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
