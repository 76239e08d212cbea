//! Durable repair workflows: drain → checkpoint → requeue → settle → reboot or replace → await the
//! node → validate (deep check) → undrain. Every step is written to the store before it is acted on,
//! so a repairer killed at any point resumes where it was: a reboot that was issued is awaited, not
//! issued again, and one that was lost is issued again once its timeout passes.
//!
//! What to do next is decided by a pure state machine (`machine.rs`: [`next`], with table tests of
//! every step × outcome); a small driver (`driver.rs`: [`run`]) writes what it says and carries out
//! its one effect through the scheduler, provider and command ports.

mod driver;
mod machine;
mod progress;
pub mod trace;

pub use self::driver::{WorkflowContext, run};
pub use self::machine::{
    Answer, DeepCheck, Done, Effect, Failure, FailureKind, Limits, Note, Observation, Transition,
    finish_reason, next, node_states,
};
pub use self::progress::Progress;

use std::time::Duration;

use fleetmend_proto::{EvidenceBundle, Finding};
use serde::{Deserialize, Serialize};

use crate::model::RuleAction;
use crate::policy::Rung;

/// Timeouts of the workflow's steps (`[engine.workflow]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkflowTimeouts {
    /// Longest one scheduler or provider call may take.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// After asking the jobs on the node to checkpoint, how long to let them write it before they
    /// are stopped and requeued.
    #[serde(with = "humantime_serde")]
    pub checkpoint_grace: Duration,
    /// From the reboot call to the node reporting with a new boot id.
    #[serde(with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// From the replace call to the new node reporting.
    #[serde(with = "humantime_serde")]
    pub replace_timeout: Duration,
    /// From sending the deep check to its result.
    #[serde(with = "humantime_serde")]
    pub validate_timeout: Duration,
    /// Longest a reboot or replacement waits for the node's evidence bundle (asked for when the
    /// workflow settles, so it is gathered meanwhile); then the repair goes on without it. Zero:
    /// no evidence is asked for.
    #[serde(with = "humantime_serde")]
    pub evidence_timeout: Duration,
    /// Reboot attempts before the repair counts as failed (and escalates).
    pub reboot_attempts: u32,
    /// First retry delay of a failed call; doubles up to `retry_max`, with jitter.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
}

impl Default for WorkflowTimeouts {
    fn default() -> Self {
        WorkflowTimeouts {
            call_timeout: Duration::from_secs(30),
            checkpoint_grace: Duration::from_secs(30),
            reboot_timeout: Duration::from_secs(15 * 60),
            replace_timeout: Duration::from_secs(60 * 60),
            validate_timeout: Duration::from_secs(20 * 60),
            evidence_timeout: Duration::from_secs(90),
            reboot_attempts: 2,
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
        }
    }
}

/// What a workflow is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkflowKind {
    /// Drain, and reboot or replace when the action asks for it.
    Repair,
    /// Put a drained node back.
    Release,
    /// Take a node out for a person.
    Quarantine,
}

/// A workflow's step; each is written before it is acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    Drain,
    Checkpoint,
    Requeue,
    /// Waits for `settle` after the fault, and for a closed breaker, before anything destructive.
    Settle,
    /// Waits (time-boxed) for the evidence bundle asked for when the workflow settled.
    Evidence,
    /// Reboot or replace; `issued_ms` says whether the call may have been made.
    Repair,
    AwaitBoot,
    AwaitReplacement,
    Validate,
    Undrain,
    Done,
}

/// How a workflow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Repaired and validated, back at work.
    Repaired,
    /// Drained until its findings clear.
    Drained,
    /// Put back after its findings cleared.
    Released,
    /// A person must look.
    Quarantined,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Repaired => "repaired",
            Outcome::Drained => "drained",
            Outcome::Released => "released",
            Outcome::Quarantined => "quarantined",
        }
    }
}

/// One durable workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub id: i64,
    pub node: String,
    pub kind: WorkflowKind,
    pub action: RuleAction,
    pub rule: String,
    pub reason: String,
    pub findings: Vec<Finding>,
    /// When the fault that started it was first seen (for settle and time-to-repair).
    pub fault_since_ms: u64,
    pub started_ms: u64,
    pub step: Step,
    pub step_since_ms: u64,
    /// Attempt of the current repair call (1-based).
    pub attempt: u32,
    pub boot_id_before: String,
    /// Set before the provider is called: the call may have been made.
    pub issued_ms: Option<u64>,
    pub jobs: Vec<String>,
    pub checkpoint_sent_ms: Option<u64>,
    pub replacement: Option<String>,
    pub validation: Option<String>,
    pub outcome: Option<Outcome>,
    pub last_error: Option<String>,
    /// The root span of the workflow's trace (when traces are exported), so a resumed workflow
    /// continues the same trace.
    #[serde(default)]
    pub trace: Option<crate::workflow::trace::TraceParent>,
    /// Set when a repair that did not help escalated to this one (a reboot to a replacement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalated_from: Option<RuleAction>,
    /// The rung its rule stops the ladder at: a reboot that did not help goes to a person
    /// instead of a replacement when it is `reboot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at: Option<Rung>,
    /// The `evidence` command asked of the node before this repair, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_asked_ms: Option<u64>,
}

/// An evidence bundle as the repairer keeps it: with the workflow it was gathered for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeptEvidence {
    pub workflow: i64,
    pub node: String,
    /// The repair it was gathered before.
    pub action: RuleAction,
    pub command: String,
    pub asked_ms: u64,
    pub kept_ms: u64,
    pub bundle: EvidenceBundle,
}

impl Workflow {
    /// A repair (drain, reboot or replace) of `node`.
    #[allow(clippy::too_many_arguments)]
    pub fn repair(
        node: &str,
        action: RuleAction,
        rule: &str,
        reason: &str,
        findings: Vec<Finding>,
        fault_since_ms: u64,
        boot_id: &str,
        now: u64,
    ) -> Workflow {
        Workflow {
            id: 0,
            node: node.to_owned(),
            kind: WorkflowKind::Repair,
            action,
            rule: rule.to_owned(),
            reason: reason.to_owned(),
            findings,
            fault_since_ms,
            started_ms: now,
            step: Step::Drain,
            step_since_ms: now,
            attempt: 1,
            boot_id_before: boot_id.to_owned(),
            issued_ms: None,
            jobs: Vec::new(),
            checkpoint_sent_ms: None,
            replacement: None,
            validation: None,
            outcome: None,
            last_error: None,
            trace: None,
            escalated_from: None,
            stop_at: None,
            evidence: None,
            evidence_asked_ms: None,
        }
    }

    pub fn release(node: &str, reason: &str, now: u64) -> Workflow {
        Workflow {
            kind: WorkflowKind::Release,
            step: Step::Undrain,
            ..Workflow::repair(node, RuleAction::None, "release", reason, Vec::new(), now, "", now)
        }
    }

    pub fn quarantine(node: &str, reason: &str, now: u64) -> Workflow {
        Workflow {
            kind: WorkflowKind::Quarantine,
            ..Workflow::repair(
                node,
                RuleAction::Drain,
                "quarantine",
                reason,
                Vec::new(),
                now,
                "",
                now,
            )
        }
    }

    /// The node the current step works on: the replacement, once there is one, else the node.
    pub fn target(&self) -> &str {
        self.replacement.as_deref().unwrap_or(&self.node)
    }
}
