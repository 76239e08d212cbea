//! A replay's account: what was struck and what was left out, and the decisions per node of the
//! replayed repairer against the recorded ones (both audit trails folded the same way,
//! [`fleetmend_repairer::history::fold`]).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::{Duration, UNIX_EPOCH};

use fleetmend_repairer::history::{DecisionKind, HistoricFault, fold};
use fleetmend_repairer::model::{Event, RuleAction};
use serde::Serialize;

use super::Replay;
use crate::config::SimConfig;
use crate::report::SimReport;
use crate::run::{self, SimError};

/// Runs `config`'s simulation; with a replay, also its account.
pub fn simulate(
    config: &SimConfig,
    progress: Option<&(dyn Fn(f64) + Sync)>,
) -> Result<(SimReport, Option<ReplayOutcome>), SimError> {
    let Some(replay) = config.replay.as_deref() else {
        return run::simulate(config, progress).map(|report| (report, None));
    };
    let (report, events) = run::simulate_recorded(config, progress)?;
    Ok((report, Some(replay.outcome(&events, config.fleet.duration))))
}

/// One decision, as compared: its kind and action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Decided {
    pub kind: DecisionKind,
    pub action: RuleAction,
}

impl fmt::Display for Decided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DecisionKind::Act => write!(f, "{}", self.action),
            DecisionKind::Alert => f.write_str("alert"),
            DecisionKind::Held => write!(f, "{} held", self.action),
            DecisionKind::DryRun => write!(f, "{} (dry run)", self.action),
            DecisionKind::Quarantine => write!(f, "quarantine ({})", self.action),
            DecisionKind::Escalation => write!(f, "{} (escalated)", self.action),
        }
    }
}

/// One node's decisions, recorded and replayed, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeDecisions {
    pub node: String,
    pub recorded: Vec<Decided>,
    pub replayed: Vec<Decided>,
    pub same: bool,
}

/// A recorded fault that was not struck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    /// Its index in the history's `faults`.
    pub fault: usize,
    pub node: String,
    pub why: String,
}

/// The replay's part of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayOutcome {
    /// The history's file.
    pub file: String,
    pub since_ms: u64,
    pub until_ms: u64,
    /// The unix ms the run's start stands for.
    pub zero_ms: u64,
    pub recorded_faults: usize,
    pub struck_faults: usize,
    /// Faults not struck: none of the simulator's faults stands for them, or they come after the
    /// run's end.
    pub left_out: Vec<LeftOut>,
    /// Every node with a decision, recorded or replayed, in natural order.
    pub nodes: Vec<NodeDecisions>,
    /// Nodes whose replayed decisions are the recorded ones.
    pub same_nodes: usize,
    /// The fleet's size before it grew to hold the history's nodes, if it had to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_grown_from: Option<u32>,
}

impl Replay {
    /// The account of a run of this replay that lasted `duration` and wrote `events`.
    pub fn outcome(&self, events: &[Event], duration: Duration) -> ReplayOutcome {
        let end_ms = self.zero_ms.saturating_add(duration.as_millis() as u64);
        let mut left_out: Vec<LeftOut> = self
            .skipped
            .iter()
            .map(|(index, why)| LeftOut {
                fault: *index,
                node: self.history.faults[*index].node.clone(),
                why: why.clone(),
            })
            .collect();
        for (index, fault) in self.history.faults.iter().enumerate() {
            if fault.at_ms >= end_ms && !self.skipped.iter().any(|(i, _)| *i == index) {
                left_out.push(LeftOut {
                    fault: index,
                    node: fault.node.clone(),
                    why: "after the run's end".to_owned(),
                });
            }
        }
        left_out.sort_by_key(|l| l.fault);
        let struck: Vec<&HistoricFault> = self
            .history
            .faults
            .iter()
            .enumerate()
            .filter(|(index, _)| !left_out.iter().any(|l| l.fault == *index))
            .map(|(_, fault)| fault)
            .collect();
        let mut by_node: BTreeMap<String, (Vec<Decided>, Vec<Decided>)> = BTreeMap::new();
        for fault in &struck {
            by_node.entry(fault.node.clone()).or_default().0.extend(decided(fault));
        }
        for fault in fold(events, 0, u64::MAX) {
            let node = self.recorded_name(&fault.node);
            by_node.entry(node).or_default().1.extend(decided(&fault));
        }
        let mut nodes: Vec<NodeDecisions> = by_node
            .into_iter()
            .map(|(node, (recorded, replayed))| NodeDecisions {
                same: recorded == replayed,
                node,
                recorded,
                replayed,
            })
            .collect();
        nodes.sort_by(|a, b| super::natural_order(&a.node, &b.node));
        ReplayOutcome {
            file: self.origin.clone(),
            since_ms: self.history.since_ms,
            until_ms: self.history.until_ms,
            zero_ms: self.zero_ms,
            recorded_faults: self.history.faults.len(),
            struck_faults: struck.len(),
            left_out,
            same_nodes: nodes.iter().filter(|n| n.same).count(),
            nodes,
            fleet_grown_from: self.grown_from,
        }
    }
}

fn decided(fault: &HistoricFault) -> impl Iterator<Item = Decided> + '_ {
    fault.decisions.iter().map(|d| Decided { kind: d.kind, action: d.action })
}

impl ReplayOutcome {
    /// The text summary, after the simulation's.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "replay of {}: {} recorded fault(s) from {} to {}; {} struck, {} left out",
            self.file,
            self.recorded_faults,
            moment(self.since_ms),
            moment(self.until_ms),
            self.struck_faults,
            self.left_out.len()
        );
        if let Some(nodes) = self.fleet_grown_from {
            let _ = writeln!(
                out,
                "  the fleet grew from {nodes} node(s) to hold every node of the history"
            );
        }
        for left in &self.left_out {
            let _ = writeln!(out, "  faults[{}] on {}: {}", left.fault, left.node, left.why);
        }
        let _ = writeln!(
            out,
            "decisions per node: the recorded ones on {} of {} node(s)",
            self.same_nodes,
            self.nodes.len()
        );
        for node in self.nodes.iter().filter(|n| !n.same) {
            let _ = writeln!(
                out,
                "  {}: recorded {}; replayed {}",
                node.node,
                list(&node.recorded),
                list(&node.replayed)
            );
        }
        out
    }
}

fn list(decisions: &[Decided]) -> String {
    if decisions.is_empty() {
        return "none".to_owned();
    }
    decisions.iter().map(Decided::to_string).collect::<Vec<_>>().join(", ")
}

/// A unix ms as RFC 3339 (to the second).
fn moment(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The report and the replay's account as one JSON document: the report's fields and `replay`.
#[derive(Debug, Serialize)]
pub struct ReplayReport<'a> {
    #[serde(flatten)]
    pub report: &'a SimReport,
    pub replay: &'a ReplayOutcome,
}
