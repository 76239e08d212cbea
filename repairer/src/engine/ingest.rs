//! What comes in: agents' reports and findings from external alert sources.

use std::sync::Arc;

use fleetmend_proto::{Finding, Report, ReportReply, Status};

use super::{Engine, EngineError};
use crate::inventory::Membership;
use crate::model::{Actor, Event, EventKind, FindingKey, FindingSource, Severity};
use crate::nodes::{self, NodeRecord, metrics_target, remove_findings, track};

/// The finding the repairer keeps on a node that stopped reporting.
pub(super) const UNREACHABLE: &str = "unreachable";

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
        // A report that brings nothing new (most are heartbeats) wakes no loop.
        let (changed, rebooted, save) = nodes.update_quietly(&report.node, |node, events| {
            // Held as unknown until the inventory took it in: it is in the fleet from now on.
            let came_in = nodes::set_unknown(events, node, false, "in the inventory now", now)?;
            let rebooted = !node.boot_id.is_empty() && node.boot_id != report.boot_id;
            // A new node or a new agent version is saved at once: a restarted repairer must know
            // every node, including those that never had a finding.
            let new_agent =
                node.agent_version.is_empty() || node.agent_version != report.agent_version;
            if rebooted {
                node.booted_ms = Some(now);
            }
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
            // A kernel-log record already acted on, read again by a restarted agent, is not new.
            let incoming: Vec<&Finding> = report
                .findings
                .iter()
                .filter(|f| f.status != Status::Ok && !node.acted_on_before(f))
                .collect();
            changed |= track(node, FindingSource::Agent, &incoming, &report.checks, now);
            Ok((changed, rebooted, changed || new_agent || moved_target || moved_address))
        })?;
        if changed {
            nodes.mark_changed();
        }
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
            self.progress.ring(&report.node);
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
        let save = nodes.update_quietly(&report.node, |node, events| {
            let left = nodes::set_unknown(events, node, true, nodes::UNKNOWN_REASON, now)?;
            let new_agent =
                node.agent_version != report.agent_version || node.boot_id != report.boot_id;
            node.boot_id.clone_from(&report.boot_id);
            node.agent_version.clone_from(&report.agent_version);
            node.last_report_ms = now;
            node.last_seq = report.seq;
            let incoming: Vec<&Finding> =
                report.findings.iter().filter(|f| f.status != Status::Ok).collect();
            let changed = track(node, FindingSource::Agent, &incoming, &report.checks, now);
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
            track(&mut node, source, &refs, &[], now)
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
}
