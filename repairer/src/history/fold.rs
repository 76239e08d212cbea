//! The audit trail folded into faults: a pure pass over the events, oldest first.
//!
//! Per node it keeps the time the node turned suspect (a rule debouncing a finding: the fault's
//! start) and the fault now open; per workflow, the fault it belongs to and when its reboot or
//! replacement was asked for and came back. What it reads of each event kind:
//!
//! - `decision`, `action-held` with findings: a decision about the open fault when they share a
//!   finding (the same check, finding, subject and Xid), else a new fault. An alert opens no
//!   fault that later decisions join: the node stays at work, and a second alert of a finding
//!   means it cleared and came back.
//! - `workflow-step` `step Repair` / `step Validate`: when the repair was asked for, and when the
//!   node (or its replacement) was back to be validated.
//! - `repair-finished`: the repair's outcome (its reason says which: `finish_reason`, and
//!   `escalating to replace` for a reboot that did not help, also a decision).
//! - `state-changed`: to `suspect` (the fault's start, when no fault is open), to `healthy` or
//!   `retired` (the fault is over; healthy without a repair that repaired it: it cleared).

use std::collections::{BTreeSet, HashMap};

use fleetmend_proto::Finding;

use super::{DecisionKind, FaultDecision, FaultRepair, HistoricFault, RepairOutcome};
use crate::model::{Event, EventKind, NodeState, RuleAction, Severity};

/// What a dry-run decision's reason starts with (engine/apply.rs).
const DRY_RUN_PREFIX: &str = "dry-run: would ";
/// What an escalation's reason ends with (workflow/driver.rs).
const ESCALATION_SUFFIX: &str = "escalating to replace";
/// The workflow steps whose times measure a repair (workflow/driver.rs writes `step {step:?}`).
const STEP_REPAIR: &str = "step Repair";
const STEP_VALIDATE: &str = "step Validate";

/// A finding as one fault knows it: check, finding id, subject and Xid.
type FindingId = (String, String, String, String);

fn finding_id(finding: &Finding) -> FindingId {
    (
        finding.check.clone(),
        finding.finding.clone(),
        finding.subject.clone(),
        finding.labels.get("xid").cloned().unwrap_or_default(),
    )
}

#[derive(Debug, Default)]
struct NodeTrack {
    /// Since when the node is suspect, while no fault is open on it.
    suspect_since: Option<u64>,
    /// The fault open on it (an index into the faults).
    open: Option<usize>,
}

#[derive(Debug)]
struct WorkflowTrack {
    fault: usize,
    /// The repair asked of the provider: its action and when.
    asked: Option<(RuleAction, u64)>,
    /// When the node (or its replacement) was back to be validated.
    back_ms: Option<u64>,
}

/// The fold in progress.
#[derive(Debug, Default)]
pub struct Fold {
    faults: Vec<HistoricFault>,
    /// The findings of each fault, to join later decisions to it.
    finding_ids: Vec<BTreeSet<FindingId>>,
    nodes: HashMap<String, NodeTrack>,
    workflows: HashMap<i64, WorkflowTrack>,
}

/// The faults in `events` (oldest first) whose first decision falls in `[since_ms, until_ms)`.
pub fn fold<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    since_ms: u64,
    until_ms: u64,
) -> Vec<HistoricFault> {
    let mut fold = Fold::default();
    for event in events {
        fold.take(event);
    }
    fold.finish(since_ms, until_ms)
}

impl Fold {
    /// Takes the next event.
    pub fn take(&mut self, event: &Event) {
        let Some(node) = event.node.as_deref() else { return };
        if let Some(id) = event.workflow
            && !self.workflows.contains_key(&id)
            && let Some(fault) = self.nodes.get(node).and_then(|n| n.open)
        {
            self.workflows.insert(id, WorkflowTrack { fault, asked: None, back_ms: None });
        }
        match event.kind {
            EventKind::Decision => {
                if let Some(action) = event.action {
                    let kind = decision_kind(event, action);
                    self.decide(node, event, kind, action);
                }
            }
            EventKind::ActionHeld => match (event.action, event.workflow) {
                (Some(action), _) if !event.findings.is_empty() => {
                    self.decide(node, event, DecisionKind::Held, action);
                }
                // A workflow's repair the breaker holds: a decision about its fault.
                (Some(action), Some(id)) => {
                    if let Some(fault) = self.workflows.get(&id).map(|w| w.fault) {
                        self.faults[fault].decisions.push(decision(
                            event,
                            DecisionKind::Held,
                            action,
                        ));
                    }
                }
                _ => {}
            },
            EventKind::WorkflowStep => self.step(event),
            EventKind::RepairFinished => self.finished(node, event),
            EventKind::StateChanged => self.state_changed(node, event),
            _ => {}
        }
    }

    /// The faults whose first decision falls in `[since_ms, until_ms)`, in the order of their
    /// first decision.
    pub fn finish(self, since_ms: u64, until_ms: u64) -> Vec<HistoricFault> {
        self.faults
            .into_iter()
            .filter(|fault| (since_ms..until_ms).contains(&fault.decided_ms()))
            .collect()
    }

    fn decide(&mut self, node: &str, event: &Event, kind: DecisionKind, action: RuleAction) {
        let Some((first, others)) = event.findings.split_first() else { return };
        let ids: BTreeSet<FindingId> = event.findings.iter().map(finding_id).collect();
        let track = self.nodes.entry(node.to_owned()).or_default();
        let joins = track.open.filter(|&open| {
            kind != DecisionKind::Alert && !self.finding_ids[open].is_disjoint(&ids)
        });
        if let Some(open) = joins {
            self.faults[open].decisions.push(decision(event, kind, action));
            self.finding_ids[open].extend(ids);
            return;
        }
        let at_ms = track.suspect_since.take().filter(|since| *since <= event.at_ms);
        let fault = HistoricFault {
            at_ms: at_ms.unwrap_or(event.at_ms),
            node: node.to_owned(),
            finding: first.clone(),
            other_findings: others.to_vec(),
            decisions: vec![decision(event, kind, action)],
            repairs: Vec::new(),
            cleared_ms: None,
        };
        self.faults.push(fault);
        self.finding_ids.push(ids);
        // An alert leaves the node at work: nothing joins it later.
        if kind != DecisionKind::Alert {
            track.open = Some(self.faults.len() - 1);
        }
    }

    fn step(&mut self, event: &Event) {
        let Some(track) = event.workflow.and_then(|id| self.workflows.get_mut(&id)) else {
            return;
        };
        match (event.reason.as_str(), event.action) {
            (STEP_REPAIR, Some(action)) => {
                track.asked = Some((action, event.at_ms));
                track.back_ms = None;
            }
            (STEP_VALIDATE, _) if track.asked.is_some() && track.back_ms.is_none() => {
                track.back_ms = Some(event.at_ms);
            }
            _ => {}
        }
    }

    fn finished(&mut self, node: &str, event: &Event) {
        let from_workflow = event.workflow.and_then(|id| self.workflows.get(&id)).map(|w| w.fault);
        let Some(fault) = from_workflow.or_else(|| self.nodes.get(node).and_then(|n| n.open))
        else {
            return;
        };
        let Some(action) = event.action else { return };
        let escalated = event.reason.ends_with(ESCALATION_SUFFIX);
        let outcome = if escalated { RepairOutcome::Escalated } else { finish_outcome(event) };
        // An escalation's event names the action it escalates to; the repair that ended is the
        // reboot.
        let ended = if escalated { RuleAction::Reboot } else { action };
        let mut repair = FaultRepair {
            action: ended,
            outcome,
            started_ms: None,
            back_ms: None,
            finished_ms: event.at_ms,
        };
        if let Some(track) = event.workflow.and_then(|id| self.workflows.get_mut(&id)) {
            if let Some((asked, at)) = track.asked.take()
                && asked == ended
            {
                repair.started_ms = Some(at);
                repair.back_ms = track.back_ms.take();
            }
            track.back_ms = None;
        }
        let record = &mut self.faults[fault];
        record.repairs.push(repair);
        if escalated {
            record.decisions.push(decision(event, DecisionKind::Escalation, RuleAction::Replace));
        }
        if outcome == RepairOutcome::Released {
            record.cleared_ms.get_or_insert(event.at_ms);
        }
    }

    fn state_changed(&mut self, node: &str, event: &Event) {
        let track = self.nodes.entry(node.to_owned()).or_default();
        match event.to_state {
            Some(NodeState::Suspect) if track.open.is_none() => {
                track.suspect_since.get_or_insert(event.at_ms);
            }
            Some(NodeState::Healthy) => {
                if let Some(open) = track.open.take() {
                    let fault = &mut self.faults[open];
                    let repaired =
                        fault.repairs.iter().any(|r| r.outcome == RepairOutcome::Repaired);
                    if !repaired {
                        fault.cleared_ms.get_or_insert(event.at_ms);
                    }
                }
                track.suspect_since = None;
            }
            Some(NodeState::Retired) => {
                track.open = None;
                track.suspect_since = None;
            }
            _ => {}
        }
    }
}

fn decision(event: &Event, kind: DecisionKind, action: RuleAction) -> FaultDecision {
    FaultDecision { at_ms: event.at_ms, kind, action, by: event.actor.0.clone() }
}

/// A `decision` event's kind: a quarantine is critical, a dry-run record says so, an alert is
/// its action; the rest started a workflow.
fn decision_kind(event: &Event, action: RuleAction) -> DecisionKind {
    if event.severity == Severity::Critical {
        DecisionKind::Quarantine
    } else if event.reason.starts_with(DRY_RUN_PREFIX) {
        DecisionKind::DryRun
    } else if action == RuleAction::Alert {
        DecisionKind::Alert
    } else {
        DecisionKind::Act
    }
}

/// A finished workflow's outcome from its event: critical is a quarantine, and the reason
/// (`workflow::machine::finish_reason`) tells the others apart.
fn finish_outcome(event: &Event) -> RepairOutcome {
    let reason = event.reason.as_str();
    if event.severity == Severity::Critical || reason.starts_with("quarantined") {
        RepairOutcome::Quarantined
    } else if reason.starts_with("drained") {
        RepairOutcome::Drained
    } else if reason.starts_with("findings cleared") {
        RepairOutcome::Released
    } else {
        RepairOutcome::Repaired
    }
}
