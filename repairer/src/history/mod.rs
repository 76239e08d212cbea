//! The failure history: every fault that reached a decision, read from the audit trail, as a
//! versioned JSON document (`GET /v1/history/faults`, `fleetmend export-faults`) that
//! `fleetmend simulate --replay` replays through a policy.
//!
//! A fault is a finding on a node that the repairer decided about: its first decision (an action,
//! an alert, a held action, a dry-run record or a quarantine) opens it, later decisions about the
//! same finding on the same node (the ladder's next rung, an escalation, the action a guard rail
//! held and then let go) join it, and the node's return to health closes it. With each fault come
//! the repairs that followed (how long the reboot or replacement took, how it ended) and, when it
//! cleared without one, when it cleared: what a replay needs to know of the fault itself rather
//! than of the policy that answered it.
//!
//! - [`fold`]: the events, oldest first, folded into faults (pure; table-tested).
//! - [`export`]: the scan of a store over a time window, bounded.

mod export;
mod fold;

use fleetmend_proto::Finding;
use serde::{Deserialize, Serialize};

pub use self::export::{DEFAULT_LIMIT, HistoryError, LOOKBACK_MS, MAX_LIMIT, MAX_SCANNED, export};
pub use self::fold::{Fold, fold};
use crate::model::RuleAction;

/// The version of the document this repairer writes and reads.
pub const HISTORY_VERSION: u32 = 1;

/// Problems listed at most when a file is refused (the count of the rest follows).
const PROBLEMS_SHOWN: usize = 20;

/// The failure history of a time window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultHistory {
    /// The document's version: 1.
    pub version: u32,
    /// The window: faults first decided about at or after this time (unix ms) ...
    pub since_ms: u64,
    /// ... and before this one (unix ms).
    pub until_ms: u64,
    /// The faults, in the order of their first decision.
    pub faults: Vec<HistoricFault>,
}

/// One fault that reached a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoricFault {
    /// When the repairer first saw it (unix ms): when the node turned suspect for it (a rule's
    /// debounce), else its first decision.
    pub at_ms: u64,
    pub node: String,
    /// The finding the first decision named first (the one its reason is about).
    pub finding: Finding,
    /// The first decision's other findings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_findings: Vec<Finding>,
    /// What was decided about it, in order (at least one).
    pub decisions: Vec<FaultDecision>,
    /// The repairs that followed, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<FaultRepair>,
    /// When it cleared without a repair (unix ms): a drained node put back once its findings
    /// cleared, a suspect node healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_ms: Option<u64>,
}

/// One decision about a fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultDecision {
    /// Unix ms.
    pub at_ms: u64,
    pub kind: DecisionKind,
    pub action: RuleAction,
    /// Who decided: `rule:NAME`, `person:NAME`, or `repairer` (an escalation).
    pub by: String,
}

/// What a decision was.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionKind {
    /// The action's workflow started.
    Act,
    /// An alert went out; the node kept working.
    Alert,
    /// A guard rail held the action back, or it waited for a person's approval.
    Held,
    /// Dry-run: recorded, not acted on.
    DryRun,
    /// The node was quarantined for a person (a lemon, its attempts used up).
    Quarantine,
    /// A reboot that did not help became a replacement.
    Escalation,
}

impl DecisionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Act => "act",
            DecisionKind::Alert => "alert",
            DecisionKind::Held => "held",
            DecisionKind::DryRun => "dry-run",
            DecisionKind::Quarantine => "quarantine",
            DecisionKind::Escalation => "escalation",
        }
    }
}

/// One repair of a fault: a workflow's reboot, replacement or drain, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultRepair {
    pub action: RuleAction,
    pub outcome: RepairOutcome,
    /// When the reboot or replacement was asked for (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// When the node came back from it, or its replacement joined, to be validated (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_ms: Option<u64>,
    /// When it ended (unix ms).
    pub finished_ms: u64,
}

impl FaultRepair {
    /// How long the node was away for it: from the provider's call to the node's return.
    pub fn took_ms(&self) -> Option<u64> {
        match (self.started_ms, self.back_ms) {
            (Some(started), Some(back)) => Some(back.saturating_sub(started)),
            _ => None,
        }
    }
}

/// How a repair ended.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum RepairOutcome {
    /// Repaired and validated: the fault is gone.
    Repaired,
    /// A reboot that did not help (the fault was still there): escalated to a replacement.
    Escalated,
    /// Drained until its findings clear.
    Drained,
    /// Put back after its findings cleared.
    Released,
    /// Quarantined for a person.
    Quarantined,
}

/// A history file that cannot be replayed, with every problem named by its entry.
#[derive(Debug, thiserror::Error)]
pub enum HistoryFileError {
    #[error("not a fault history (JSON with version, since_ms, until_ms and faults): {0}")]
    Json(String),
    #[error("version {found} is not one this fleetmend reads (it reads version {HISTORY_VERSION})")]
    Version { found: u32 },
    #[error("{} problem(s): {}", problems.len(), render(problems))]
    Invalid { problems: Vec<(String, String)> },
}

fn render(problems: &[(String, String)]) -> String {
    let mut parts: Vec<String> = problems
        .iter()
        .take(PROBLEMS_SHOWN)
        .map(|(field, message)| format!("{field}: {message}"))
        .collect();
    if problems.len() > PROBLEMS_SHOWN {
        parts.push(format!("and {} more", problems.len() - PROBLEMS_SHOWN));
    }
    parts.join("; ")
}

/// The document as read before its entries: each entry is read on its own, so an error names it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHistory {
    version: u32,
    since_ms: u64,
    until_ms: u64,
    faults: Vec<serde_json::Value>,
}

impl FaultHistory {
    /// Reads and checks a history document: every entry that does not read, and every problem
    /// [`FaultHistory::problems`] finds, named by its place (`faults[3].decisions`).
    pub fn parse(text: &str) -> Result<FaultHistory, HistoryFileError> {
        let raw: RawHistory =
            serde_json::from_str(text).map_err(|err| HistoryFileError::Json(err.to_string()))?;
        if raw.version != HISTORY_VERSION {
            return Err(HistoryFileError::Version { found: raw.version });
        }
        let mut problems = Vec::new();
        let mut faults = Vec::with_capacity(raw.faults.len());
        for (i, value) in raw.faults.into_iter().enumerate() {
            match serde_json::from_value::<HistoricFault>(value) {
                Ok(fault) => faults.push(fault),
                Err(err) => problems.push((format!("faults[{i}]"), err.to_string())),
            }
        }
        let history = FaultHistory {
            version: raw.version,
            since_ms: raw.since_ms,
            until_ms: raw.until_ms,
            faults,
        };
        // The entries' meaning is checked once every entry reads: until then the read ones'
        // places in `faults` are not their places in the file.
        if problems.is_empty() {
            problems.extend(history.problems());
        }
        if problems.is_empty() { Ok(history) } else { Err(HistoryFileError::Invalid { problems }) }
    }

    /// Every problem, named by its place: a window that ends before it starts, a node that is no
    /// node name, a finding without its check or id, a fault without decisions or with times out
    /// of order.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.version != HISTORY_VERSION {
            problems.push(("version".to_owned(), format!("must be {HISTORY_VERSION}")));
        }
        if self.until_ms < self.since_ms {
            problems.push(("until_ms".to_owned(), "is before since_ms".to_owned()));
        }
        for (i, fault) in self.faults.iter().enumerate() {
            fault.problems(&format!("faults[{i}]"), &mut problems);
        }
        problems
    }
}

impl HistoricFault {
    fn problems(&self, at: &str, problems: &mut Vec<(String, String)>) {
        let mut push = |field: &str, message: String| {
            problems.push((format!("{at}{field}"), message));
        };
        if !crate::identity::is_node_name(&self.node) {
            push(".node", format!("{:?} is not a node name (letters, digits, - . _)", self.node));
        }
        for (field, value) in
            [(".finding.check", &self.finding.check), (".finding.finding", &self.finding.finding)]
        {
            if value.trim().is_empty() {
                push(field, "must not be empty".to_owned());
            }
        }
        match self.decisions.first() {
            None => push(".decisions", "must hold at least one decision".to_owned()),
            Some(first) if first.at_ms < self.at_ms => push(
                ".decisions[0].at_ms",
                format!("{} is before the fault's at_ms {}", first.at_ms, self.at_ms),
            ),
            Some(_) => {}
        }
        for (j, pair) in self.decisions.windows(2).enumerate() {
            if pair[1].at_ms < pair[0].at_ms {
                push(
                    &format!(".decisions[{}].at_ms", j + 1),
                    "is before the decision before it".into(),
                );
            }
        }
        for (j, repair) in self.repairs.iter().enumerate() {
            let times =
                [Some(self.at_ms), repair.started_ms, repair.back_ms, Some(repair.finished_ms)];
            let known: Vec<u64> = times.into_iter().flatten().collect();
            if known.windows(2).any(|pair| pair[1] < pair[0]) {
                push(
                    &format!(".repairs[{j}]"),
                    "times out of order (at_ms ≤ started_ms ≤ back_ms ≤ finished_ms)".into(),
                );
            }
        }
        if let Some(cleared) = self.cleared_ms
            && cleared < self.at_ms
        {
            push(".cleared_ms", format!("{cleared} is before the fault's at_ms {}", self.at_ms));
        }
    }

    /// The first decision's time (the fault's place in its window).
    pub fn decided_ms(&self) -> u64 {
        self.decisions.first().map_or(self.at_ms, |d| d.at_ms)
    }

    /// Whether a reboot cleared it, as far as the history tells: a reboot that repaired it, or
    /// one that did not help.
    pub fn reboot_cleared(&self) -> Option<bool> {
        self.repairs.iter().find_map(|repair| match (repair.action, repair.outcome) {
            (RuleAction::Reboot, RepairOutcome::Repaired) => Some(true),
            (RuleAction::Reboot, RepairOutcome::Escalated | RepairOutcome::Quarantined) => {
                Some(false)
            }
            _ => None,
        })
    }

    /// How long the history's first measured repair of `action` kept the node away.
    pub fn took_ms(&self, action: RuleAction) -> Option<u64> {
        self.repairs.iter().filter(|r| r.action == action).find_map(FaultRepair::took_ms)
    }
}

#[cfg(test)]
mod tests;
