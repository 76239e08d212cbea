//! Deciding about one node (the pure `policy::decide`) and carrying the decision out: a state,
//! an alert, a dry-run record, a held action, or a workflow. Each is written before it is acted on.

use std::sync::Arc;

use fleetmend_proto::Finding;

use super::{Engine, EngineError};
use crate::model::{Actor, Event, EventKind, FindingKey, NodeState, RuleAction, Severity};
use crate::nodes::{NodeRecord, NodesGuard, source_of, transition};
use crate::policy::{self, Decision, FleetView, Hold, NodeView, Verdict};
use crate::workflow::{self, Workflow};

pub(super) fn view(node: &NodeRecord) -> NodeView<'_> {
    NodeView {
        state: node.state,
        state_since_ms: node.state_since_ms,
        findings: &node.findings,
        history: &node.history,
        cooldown_until_ms: node.cooldown_until_ms,
        approved: node.approved,
        booted_ms: node.booted_ms,
    }
}

/// A node no rule decides about: one outside the inventory (never drained, rebooted or replaced,
/// whatever its findings), or one a person drained (theirs until they undrain it).
pub(super) fn never_decided(node: &NodeRecord) -> bool {
    node.unknown || (node.drained_by_person && node.state == NodeState::Drained)
}

impl Engine {
    /// Decides about one node and carries out the decision.
    pub fn evaluate(self: &Arc<Self>, name: &str, now: u64) -> Result<(), EngineError> {
        let mut nodes = self.nodes.lock();
        let Some(node) = nodes.get(name) else { return Ok(()) };
        if never_decided(node) {
            return Ok(());
        }
        // decide() reads the fleet only in its guard rails, which it reaches only with a
        // disruptive verdict (what comes out is then Act, Record or Held); any other decision is
        // the same whatever the fleet. The fleet's counts are kept as nodes change, so reading
        // them is cheap; the breaker is checked for such a verdict, or when this node just turned
        // unhealthy: the one moment its count can rise, so a storm opens it as it happens.
        let unknown_fleet = FleetView {
            members: 0,
            size: 0,
            unavailable: 0,
            repairs_in_flight: 0,
            breaker_open: false,
        };
        let mut decision = policy::decide(view(node), unknown_fleet, &self.policy, now);
        let turned_unhealthy = node.unhealthy_since_ms == Some(now);
        if turned_unhealthy
            || matches!(decision, Decision::Act(_) | Decision::Record(_) | Decision::Held { .. })
        {
            let fleet = self.guarded_fleet(&nodes, now)?;
            decision = policy::decide(view(node), fleet, &self.policy, now);
        }
        let spawned = match decision {
            Decision::Nothing => None,
            Decision::Become { state, reason } => {
                nodes.update(name, |node, events| {
                    transition(events, node, state, &reason, Actor::repairer(), now)?;
                    if state == NodeState::Healthy {
                        node.last_noted = None;
                    }
                    Ok(())
                })?;
                nodes.save(name)?;
                None
            }
            Decision::Alert(verdict) => {
                self.alert(&mut nodes, name, &verdict, now)?;
                None
            }
            Decision::Record(verdict) => {
                let note = format!("dry-run:{}:{}", verdict.action, verdict.rule);
                let event = Event {
                    action: Some(verdict.action),
                    findings: verdict.findings.clone(),
                    ..Event::new(
                        EventKind::Decision,
                        Severity::Info,
                        Some(name),
                        Actor::rule(&verdict.rule),
                        format!("dry-run: would {}: {}", verdict.action, verdict.reason),
                        now,
                    )
                };
                if self.note_once(&mut nodes, name, note, &event, None, now)? {
                    self.metrics.decision(verdict.action, "dry-run");
                }
                None
            }
            Decision::Held { verdict, hold } => {
                let note = format!("held:{}:{}", verdict.action, hold.as_str());
                let severity =
                    if hold == Hold::Breaker { Severity::Critical } else { Severity::Warning };
                let event = Event {
                    action: Some(verdict.action),
                    findings: verdict.findings.clone(),
                    ..Event::new(
                        EventKind::ActionHeld,
                        severity,
                        Some(name),
                        Actor::rule(&verdict.rule),
                        format!("{} held ({}): {}", verdict.action, hold.as_str(), verdict.reason),
                        now,
                    )
                };
                let suspect = "a failing finding waits for its action";
                self.note_once(&mut nodes, name, note, &event, Some(suspect), now)?;
                None
            }
            Decision::Act(verdict) => {
                self.metrics.decision(verdict.action, self.policy.mode.as_str());
                // The ladder's first step up: a drained node still failing gets a repair.
                if nodes.get(name).is_some_and(|n| n.state == NodeState::Drained)
                    && verdict.action.is_repair()
                {
                    self.metrics.repair(RuleAction::Drain, "escalated");
                }
                let actor = Actor::rule(&verdict.rule);
                Some(self.begin_workflow(&mut nodes, name, &verdict, actor, now)?)
            }
            Decision::Release { reason } => {
                let workflow = Workflow::release(name, &reason, now);
                Some(self.persist_new_workflow(&mut nodes, name, workflow, now)?)
            }
            Decision::Quarantine(verdict) => {
                self.events.record(&Event {
                    action: Some(verdict.action),
                    findings: verdict.findings.clone(),
                    ..Event::new(
                        EventKind::Decision,
                        Severity::Critical,
                        Some(name),
                        Actor::rule(&verdict.rule),
                        verdict.reason.clone(),
                        now,
                    )
                })?;
                self.metrics.decision(verdict.action, "quarantine");
                let workflow = Workflow::quarantine(name, &verdict.reason, now);
                Some(self.persist_new_workflow(&mut nodes, name, workflow, now)?)
            }
        };
        drop(nodes);
        if let Some(workflow) = spawned {
            self.spawn_workflow(workflow);
        }
        Ok(())
    }

    /// The fleet as the guard rails see it, the breaker checked (opened, its event written,
    /// where a storm is under way) and the fleet's size the inventory's where there is one.
    fn guarded_fleet(&self, nodes: &NodesGuard<'_>, now: u64) -> Result<FleetView, EngineError> {
        // An open breaker needs no count of the storm.
        let open = self.breaker.is_open();
        let window = self.policy.guard_rails.breaker_window.as_millis() as u64;
        let (mut fleet, recent) = nodes.fleet(now, (!open).then_some(window));
        if let Some(inventory) = &self.inventory {
            fleet.size = fleet.size.max(u32::try_from(inventory.len()).unwrap_or(u32::MAX));
        }
        fleet.breaker_open =
            open || self.breaker.check(fleet.members, recent, &self.policy.guard_rails, now)?;
        Ok(fleet)
    }

    /// Writes an alert decision for the findings no alert went out for yet.
    fn alert(
        &self,
        nodes: &mut NodesGuard<'_>,
        name: &str,
        verdict: &Verdict,
        now: u64,
    ) -> Result<(), EngineError> {
        let Some(node) = nodes.get(name) else { return Ok(()) };
        let fresh: Vec<(FindingKey, Finding)> = verdict
            .findings
            .iter()
            .map(|f| (FindingKey::of(f, source_of(node, f)), f.clone()))
            .filter(|(key, _)| !node.alerted.contains(key))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        self.events.record(&Event {
            action: Some(RuleAction::Alert),
            findings: fresh.iter().map(|(_, f)| f.clone()).collect(),
            ..Event::new(
                EventKind::Decision,
                Severity::Warning,
                Some(name),
                Actor::rule(&verdict.rule),
                verdict.reason.clone(),
                now,
            )
        })?;
        self.metrics.decision(verdict.action, "alert");
        nodes.update(name, |node, _| {
            node.alerted.extend(fresh.into_iter().map(|(key, _)| key));
            Ok(())
        })?;
        Ok(nodes.save(name)?)
    }

    /// Writes `event` unless the node's last noted decision is `note` already (a held or dry-run
    /// decision is written once, not every tick); a healthy node becomes `suspect_reason`'s
    /// suspect. True when it was written.
    fn note_once(
        &self,
        nodes: &mut NodesGuard<'_>,
        name: &str,
        note: String,
        event: &Event,
        suspect_reason: Option<&str>,
        now: u64,
    ) -> Result<bool, EngineError> {
        if nodes.get(name).and_then(|n| n.last_noted.as_deref()) == Some(note.as_str()) {
            return Ok(false);
        }
        self.events.record(event)?;
        nodes.update(name, |node, events| {
            node.last_noted = Some(note);
            if let Some(reason) = suspect_reason
                && node.state == NodeState::Healthy
            {
                transition(events, node, NodeState::Suspect, reason, Actor::repairer(), now)?;
            }
            Ok(())
        })?;
        nodes.save(name)?;
        Ok(true)
    }

    /// Records the decision, creates the workflow and moves the node to its first state.
    pub(super) fn begin_workflow(
        &self,
        nodes: &mut NodesGuard<'_>,
        name: &str,
        verdict: &Verdict,
        actor: Actor,
        now: u64,
    ) -> Result<Workflow, EngineError> {
        let node = nodes.get(name).ok_or_else(|| EngineError::UnknownNode(name.to_owned()))?;
        let fault_since = node
            .findings
            .iter()
            .filter(|t| verdict.findings.iter().any(|f| FindingKey::of(f, t.source) == t.key()))
            .map(|t| t.first_seen_ms)
            .min()
            .unwrap_or(now);
        let workflow = Workflow {
            stop_at: verdict.stop_at,
            ..Workflow::repair(
                name,
                verdict.action,
                &verdict.rule,
                &verdict.reason,
                verdict.findings.clone(),
                fault_since,
                &node.boot_id,
                now,
            )
        };
        self.events.record(&Event {
            action: Some(verdict.action),
            findings: verdict.findings.clone(),
            ..Event::new(
                EventKind::Decision,
                Severity::Warning,
                Some(name),
                actor,
                verdict.reason.clone(),
                now,
            )
        })?;
        nodes.update(name, |node, _| {
            node.last_noted = None;
            node.approved = None;
            Ok(())
        })?;
        self.persist_new_workflow(nodes, name, workflow, now)
    }

    /// Writes a new workflow, then the node's first state under it.
    pub(super) fn persist_new_workflow(
        &self,
        nodes: &mut NodesGuard<'_>,
        name: &str,
        mut workflow: Workflow,
        now: u64,
    ) -> Result<Workflow, EngineError> {
        let store = self.events.store();
        workflow.id =
            self.events.write("insert_workflow", store.insert_workflow(name, &workflow))?;
        self.events
            .write("update_workflow", store.update_workflow(workflow.id, true, &workflow))?;
        let id = workflow.id;
        let states = workflow::node_states(&workflow);
        nodes.update(name, |node, events| {
            node.workflow = Some(id);
            // The kernel-log records it acts on are not acted on again (`nodes/acted.rs`).
            node.mark_acted();
            if let Some((_, state, _)) = states.iter().find(|(n, _, _)| *n == name) {
                let reason = format!("workflow {id} ({}) started", workflow.action);
                transition(events, node, *state, &reason, Actor::repairer(), now)?;
            }
            Ok(())
        })?;
        nodes.save(name)?;
        Ok(workflow)
    }
}
