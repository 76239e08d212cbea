//! The repairer's vocabulary: node states, actions, tracked findings and audit events.

use std::fmt;

use fleetmend_proto::Finding;
use serde::{Deserialize, Serialize};

/// A node's place in the repair cycle.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Reporting, and no failing finding that a rule acts on.
    Healthy,
    /// A failing finding matched a rule; its debounce (observations or duration) is not met yet.
    Suspect,
    /// Out of scheduling: jobs on it are asked to checkpoint, then stopped and requeued.
    Draining,
    /// Out of scheduling by a `drain` rule; goes back once its findings clear.
    Drained,
    /// A reboot or replacement is in progress.
    Repairing,
    /// Running the deep health check after a repair; only a pass puts it back.
    Validating,
    /// Missed its reports; itself a finding for policy.
    Unreachable,
    /// A person must look: escalation exhausted, validation failed, or a lemon.
    Quarantined,
    /// Replaced by another node; kept for the record.
    Retired,
}

impl NodeState {
    pub const ALL: [NodeState; 9] = [
        NodeState::Healthy,
        NodeState::Suspect,
        NodeState::Draining,
        NodeState::Drained,
        NodeState::Repairing,
        NodeState::Validating,
        NodeState::Unreachable,
        NodeState::Quarantined,
        NodeState::Retired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Healthy => "healthy",
            NodeState::Suspect => "suspect",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
            NodeState::Repairing => "repairing",
            NodeState::Validating => "validating",
            NodeState::Unreachable => "unreachable",
            NodeState::Quarantined => "quarantined",
            NodeState::Retired => "retired",
        }
    }

    /// Not available for work: counts against the fleet's unavailable fraction.
    pub fn is_unavailable(self) -> bool {
        matches!(
            self,
            NodeState::Draining
                | NodeState::Drained
                | NodeState::Repairing
                | NodeState::Validating
                | NodeState::Unreachable
                | NodeState::Quarantined
        )
    }

    /// Part of the fleet (a retired node is history).
    pub fn is_member(self) -> bool {
        self != NodeState::Retired
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for NodeState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NodeState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown node state {s:?}"))
    }
}

/// What a rule asks for when it matches.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    /// Record only.
    None,
    /// Send an alert; the node keeps working.
    Alert,
    /// Take the node out of scheduling until its findings clear.
    Drain,
    /// Drain, reboot, validate, put back.
    Reboot,
    /// Drain, replace with a new node, retire this one.
    Replace,
}

impl RuleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleAction::None => "none",
            RuleAction::Alert => "alert",
            RuleAction::Drain => "drain",
            RuleAction::Reboot => "reboot",
            RuleAction::Replace => "replace",
        }
    }

    /// How disruptive: the most disruptive matched action wins.
    pub fn weight(self) -> u8 {
        match self {
            RuleAction::None => 0,
            RuleAction::Alert => 1,
            RuleAction::Drain => 2,
            RuleAction::Reboot => 3,
            RuleAction::Replace => 4,
        }
    }

    /// Takes the node out of service (guard rails apply).
    pub fn is_disruptive(self) -> bool {
        self.weight() >= RuleAction::Drain.weight()
    }

    /// A repair that changes the node (reboot, replace), limited by `max_concurrent_repairs`.
    pub fn is_repair(self) -> bool {
        matches!(self, RuleAction::Reboot | RuleAction::Replace)
    }
}

impl fmt::Display for RuleAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a finding came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FindingSource {
    /// The node's agent (reports).
    Agent,
    /// An Alertmanager webhook.
    Alertmanager,
    /// A CloudWatch alarm through SNS.
    Cloudwatch,
    /// The repairer itself (a node that stopped reporting).
    Repairer,
    /// The embedded queue, from a job's progress (a straggler rank).
    Job,
    /// The repairer's own probes of nodes against the fleet (the allreduce bandwidth).
    Probe,
}

/// A non-ok finding the repairer is tracking on a node, with how long and how often it was seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrackedFinding {
    pub finding: Finding,
    pub source: FindingSource,
    /// Unix ms of the first observation in the current run of observations.
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    /// Consecutive observations that carried it: looks of the check that reports it (a report
    /// carrying the same run of the check again is not another look), alert notifications.
    pub observations: u32,
    /// When the run of the check behind the latest observation finished (the report's
    /// `checks[].finished_at_ms`); none where the report named no run of its check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub looked_ms: Option<u64>,
}

impl TrackedFinding {
    /// Identity of a finding on a node: check, finding id, subject, and (for event-like findings such
    /// as Xids) the labels that tell occurrences apart.
    pub fn key(&self) -> FindingKey {
        FindingKey::of(&self.finding, self.source)
    }
}

/// Identity of a tracked finding on one node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FindingKey {
    pub source: FindingSource,
    pub check: String,
    pub finding: String,
    pub subject: String,
    /// The `xid` label where present: Xid 79 and Xid 48 on one GPU are two findings.
    pub discriminator: String,
}

impl FindingKey {
    pub fn of(finding: &Finding, source: FindingSource) -> FindingKey {
        FindingKey {
            source,
            check: finding.check.clone(),
            finding: finding.finding.clone(),
            subject: finding.subject.clone(),
            discriminator: finding.labels.get("xid").cloned().unwrap_or_default(),
        }
    }
}

/// Who made a change: a rule, a person (through the API), or the repairer's own machinery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Actor(pub String);

impl Actor {
    pub fn rule(name: &str) -> Actor {
        Actor(format!("rule:{name}"))
    }

    pub fn person(name: &str) -> Actor {
        Actor(format!("person:{name}"))
    }

    pub fn repairer() -> Actor {
        Actor("repairer".to_owned())
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What happened, for the audit trail and the alert sinks. Bounded set, used as a metric label
/// and to filter sinks.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// A node appeared (first report, or added by a replacement).
    NodeJoined,
    /// A node changed state.
    StateChanged,
    /// decide() chose an action (also in dry-run, where nothing else follows).
    Decision,
    /// An action was held back by a guard rail (cooldown, concurrency, unavailable fraction,
    /// breaker) or waits for approval.
    ActionHeld,
    /// A person approved a waiting action.
    Approved,
    /// A workflow step ran (drain, checkpoint, reboot, replace, validate, undrain) or failed.
    WorkflowStep,
    /// A repair finished: repaired, escalated, quarantined or failed.
    RepairFinished,
    /// The breaker opened or was closed.
    Breaker,
    /// A finding appeared or cleared.
    Finding,
    /// An inbound alert endpoint asked for confirmation (SNS SubscriptionConfirmation).
    Subscription,
    /// A job was submitted to the embedded queue.
    JobSubmitted,
    /// An attempt of a job was started on its nodes.
    JobStarted,
    /// A rank of a job failed (exited non-zero, by a signal, did not start, or its node was lost
    /// or drained).
    JobRankFailed,
    /// A job's ranks were asked to checkpoint (SIGUSR1).
    JobCheckpointRequested,
    /// A job's ranks were sent SIGTERM or SIGKILL, or given up on.
    JobStopping,
    /// A job was requeued at the front of its priority to restart.
    JobRequeued,
    /// Every rank of a job exited 0.
    JobCompleted,
    /// A job ran out of restarts.
    JobFailed,
    /// A person cancelled a job.
    JobCancelled,
    /// A hot spare was put to work for a job waiting for nodes.
    SpareTaken,
    /// A job has waited for nodes longer than `wait_alert`: how many it needs and which are out.
    JobWaiting,
    /// A running job's step stopped advancing: the ranks that did not arrive are named and the
    /// job is restarted.
    JobHung,
    /// A running job's loss went NaN or infinite: it is restarted from its newest checkpoint, or
    /// fails when that happened before.
    JobLossNotFinite,
    /// A rank of a running job steps persistently slower than the others: a `straggler`
    /// finding on its node.
    JobStraggler,
    /// A healthy idle node was held out of work as a hot spare (Slurm's `spare_pool`).
    SpareHeld,
    /// An evidence bundle was kept before a disruptive repair (or none came in time).
    Evidence,
    /// A node outside the inventory reported and is held as unknown, or a known node left the
    /// inventory (warning: raised once per node); or it came into the inventory (info: cleared).
    NodeUnknown,
    /// A repairer took the lead of a shared store (a new epoch): after a clean hand-over (info)
    /// or after the previous leader's lease lapsed (warning).
    LeaderChanged,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::NodeJoined => "node-joined",
            EventKind::StateChanged => "state-changed",
            EventKind::Decision => "decision",
            EventKind::ActionHeld => "action-held",
            EventKind::Approved => "approved",
            EventKind::WorkflowStep => "workflow-step",
            EventKind::RepairFinished => "repair-finished",
            EventKind::Breaker => "breaker",
            EventKind::Finding => "finding",
            EventKind::Subscription => "subscription",
            EventKind::JobSubmitted => "job-submitted",
            EventKind::JobStarted => "job-started",
            EventKind::JobRankFailed => "job-rank-failed",
            EventKind::JobCheckpointRequested => "job-checkpoint-requested",
            EventKind::JobStopping => "job-stopping",
            EventKind::JobRequeued => "job-requeued",
            EventKind::JobCompleted => "job-completed",
            EventKind::JobFailed => "job-failed",
            EventKind::JobCancelled => "job-cancelled",
            EventKind::SpareTaken => "spare-taken",
            EventKind::JobWaiting => "job-waiting",
            EventKind::JobHung => "job-hung",
            EventKind::JobLossNotFinite => "job-loss-not-finite",
            EventKind::JobStraggler => "job-straggler",
            EventKind::Evidence => "evidence",
            EventKind::SpareHeld => "spare-held",
            EventKind::NodeUnknown => "node-unknown",
            EventKind::LeaderChanged => "leader-changed",
        }
    }
}

/// How much an event matters to whoever is paged.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

/// One line of the audit trail: what, why, when, by whom. Written before it is acted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Increasing id assigned by the store (0 before it is stored).
    pub id: i64,
    pub at_ms: u64,
    pub kind: EventKind,
    pub severity: Severity,
    /// The node concerned, if any (breaker events concern the fleet).
    pub node: Option<String>,
    pub actor: Actor,
    pub from_state: Option<NodeState>,
    pub to_state: Option<NodeState>,
    pub action: Option<RuleAction>,
    /// The repair workflow this belongs to.
    pub workflow: Option<i64>,
    /// Why, in words.
    pub reason: String,
    /// The findings behind it.
    #[serde(default)]
    pub findings: Vec<Finding>,
    /// The leadership epoch it was written under, on a store shared by several repairers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
}

impl Event {
    /// `node` went from `from` to `to`.
    pub fn state_change(
        node: &str,
        from: NodeState,
        to: NodeState,
        severity: Severity,
        actor: Actor,
        reason: impl Into<String>,
        at_ms: u64,
    ) -> Event {
        Event {
            from_state: Some(from),
            to_state: Some(to),
            ..Event::new(EventKind::StateChanged, severity, Some(node), actor, reason, at_ms)
        }
    }

    /// An event about `node` with no state change, action or findings; fill in with struct update.
    pub fn new(
        kind: EventKind,
        severity: Severity,
        node: Option<&str>,
        actor: Actor,
        reason: impl Into<String>,
        at_ms: u64,
    ) -> Event {
        Event {
            id: 0,
            at_ms,
            kind,
            severity,
            node: node.map(str::to_owned),
            actor,
            from_state: None,
            to_state: None,
            action: None,
            workflow: None,
            reason: reason.into(),
            findings: Vec::new(),
            epoch: None,
        }
    }
}
