//! Wire types shared by the fleetmend agent, repairer and runtime.
//!
//! Everything here travels as JSON between processes of possibly different versions, so readers
//! tolerate fields they do not know (no `deny_unknown_fields` on wire types) and enums that may grow
//! carry an `Unknown` fallback where a peer could send a newer value.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub mod backoff;
pub mod bounds;
pub mod config_problem;
#[cfg(feature = "http-client")]
pub mod http_client;
pub mod jobs;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod probes;
pub mod repairers;
pub mod stats;

pub use jobs::{
    Progress, ProgressReply, RankKey, RankSignal, RankState, RankStatus, RunRank, SignalRank,
};

/// The version of this wire format; bumped on incompatible changes.
pub const WIRE_VERSION: u32 = 1;

/// The prefix of every drain reason fleetmend sets in a scheduler, the repairer's and a node's
/// own (`fleetmend agent --once --slurm-drain`); fleetmend undrains only nodes whose reason
/// starts with it.
pub const DRAIN_REASON_PREFIX: &str = "fleetmend: ";

/// The label of a kernel-log finding that holds the `/dev/kmsg` sequence number of its latest
/// line: with the report's boot id, the identity of the record. An agent restarted reads the
/// boot's log again; the repairer does not act again on a record it already acted on.
pub const KMSG_SEQ_LABEL: &str = "kmsg_seq";

/// How a subject of a check is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Looked and found nothing wrong.
    Ok,
    /// Something is off but the node can keep working.
    Warn,
    /// The node should not run work until this is dealt with.
    Fail,
    /// Could not look (device absent, library missing, probe timed out).
    Unknown,
}

impl Status {
    /// The value of `fleetmend_check_status`: 0 ok, 1 warn, 2 fail, 3 unknown.
    pub fn metric_value(self) -> f64 {
        match self {
            Status::Ok => 0.0,
            Status::Warn => 1.0,
            Status::Fail => 2.0,
            Status::Unknown => 3.0,
        }
    }

    /// Severity order used to pick the worst status of a subject: ok < unknown < warn < fail.
    pub fn severity(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Unknown => 1,
            Status::Warn => 2,
            Status::Fail => 3,
        }
    }

    /// The worse of two statuses.
    pub fn worst(self, other: Status) -> Status {
        if other.severity() > self.severity() { other } else { self }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the agent recommends doing about a finding, from the built-in catalog (Xid catalog, DCGM
/// rules). The repairer's policy decides; this is advice it may follow or override.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum RecommendedAction {
    /// Nothing to do on the node.
    None,
    /// Restart the application that hit the fault; the node is fine.
    RestartApp,
    /// Reset the GPU (a node reboot also does it).
    ResetGpu,
    /// Reboot the node.
    Reboot,
    /// Replace the node (never the first action: follows repeated faults or a failed diagnostic).
    Replace,
    /// Take the node out of scheduling and let a person or later rule decide.
    Drain,
}

impl RecommendedAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RecommendedAction::None => "none",
            RecommendedAction::RestartApp => "restart-app",
            RecommendedAction::ResetGpu => "reset-gpu",
            RecommendedAction::Reboot => "reboot",
            RecommendedAction::Replace => "replace",
            RecommendedAction::Drain => "drain",
        }
    }

    /// How disruptive the action is; the most disruptive one wins when findings disagree.
    pub fn weight(self) -> u8 {
        match self {
            RecommendedAction::None => 0,
            RecommendedAction::RestartApp => 1,
            RecommendedAction::Drain => 2,
            RecommendedAction::ResetGpu => 3,
            RecommendedAction::Reboot => 4,
            RecommendedAction::Replace => 5,
        }
    }
}

impl fmt::Display for RecommendedAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RecommendedAction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "none" => RecommendedAction::None,
            "restart-app" => RecommendedAction::RestartApp,
            "reset-gpu" => RecommendedAction::ResetGpu,
            "reboot" => RecommendedAction::Reboot,
            "replace" => RecommendedAction::Replace,
            "drain" => RecommendedAction::Drain,
            other => {
                return Err(format!(
                    "unknown action {other:?} (expected none, restart-app, reset-gpu, reboot, replace or drain)"
                ));
            }
        })
    }
}

/// One observation of one subject by one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Finding {
    /// The check that made it: `gpu`, `kernel_log`, `nic`, `pcie`, `disk`, `host`.
    pub check: String,
    /// What the finding is about, stable and machine-readable: `xid`, `ecc_uncorrected`,
    /// `gpu_count`, `nic_down`, `disk_full`, ...
    pub finding: String,
    /// The thing looked at: a GPU index, an interface, a mount point; empty for the node itself.
    #[serde(default)]
    pub subject: String,
    pub status: Status,
    /// A short human sentence.
    #[serde(default)]
    pub message: String,
    pub action: RecommendedAction,
    /// The measured value where there is one (a temperature, a count, a ratio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Extra bounded facts (an Xid code, a PCI address, a kernel-log rule).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Finding {
    /// A finding with no value and no labels; add them with the builder methods.
    pub fn new(
        check: &str,
        finding: &str,
        subject: impl Into<String>,
        status: Status,
        action: RecommendedAction,
        message: impl Into<String>,
    ) -> Self {
        Finding {
            check: check.to_owned(),
            finding: finding.to_owned(),
            subject: subject.into(),
            status,
            message: message.into(),
            action,
            value: None,
            labels: BTreeMap::new(),
        }
    }

    /// An `ok` finding: looked at `subject` and found nothing wrong.
    pub fn ok(check: &str, finding: &str, subject: impl Into<String>) -> Self {
        Finding::new(check, finding, subject, Status::Ok, RecommendedAction::None, "ok")
    }

    pub fn with_value(mut self, value: f64) -> Self {
        self.value = Some(value);
        self
    }

    pub fn with_label(mut self, key: &str, value: impl Into<String>) -> Self {
        self.labels.insert(key.to_owned(), value.into());
        self
    }
}

/// The agent's overall view of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every finding is ok (some checks may be unknown: absent devices are not faults).
    Healthy,
    /// At least one warning, no failure.
    Degraded,
    /// At least one failing finding.
    Unhealthy,
}

impl Verdict {
    /// The verdict over a set of findings.
    pub fn of<'a>(findings: impl IntoIterator<Item = &'a Finding>) -> Verdict {
        let mut verdict = Verdict::Healthy;
        for finding in findings {
            match finding.status {
                Status::Fail => return Verdict::Unhealthy,
                Status::Warn => verdict = Verdict::Degraded,
                Status::Ok | Status::Unknown => {}
            }
        }
        verdict
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Degraded => "degraded",
            Verdict::Unhealthy => "unhealthy",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one check's latest run went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckRun {
    pub check: String,
    /// Worst status over the check's findings.
    pub status: Status,
    /// Wall time of the run in seconds (the timeout where it timed out).
    pub duration_seconds: f64,
    /// The run did not finish within the check's timeout.
    #[serde(default)]
    pub timed_out: bool,
    /// Unix time in milliseconds when the run finished (or timed out).
    pub finished_at_ms: u64,
}

/// `POST /v1/reports`: what an agent knows about its node now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Report {
    pub wire_version: u32,
    pub node: String,
    /// `/proc/sys/kernel/random/boot_id`: changes on every boot, so the repairer can tell a reboot
    /// happened.
    pub boot_id: String,
    pub agent_version: String,
    /// Increases by one with every report this agent process sends; restarts at 1 with the process.
    pub seq: u64,
    /// Unix time in milliseconds when the report was built.
    pub sent_at_ms: u64,
    /// Why this report was sent now.
    pub trigger: ReportTrigger,
    pub verdict: Verdict,
    pub checks: Vec<CheckRun>,
    /// Every current finding that is not ok. A finding the previous report carried and this one
    /// does not has cleared.
    pub findings: Vec<Finding>,
    /// Results of commands the repairer sent (in earlier replies) that finished since the last
    /// delivered report. Sent again until a report carrying them is accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_results: Vec<CommandResult>,
    /// The host other nodes reach this node at (a job's rank 0 hosts its rendezvous there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The ranks of jobs this agent runs or ran recently (see [`RankStatus`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankStatus>,
    /// The port the agent serves `/metrics` on, so the repairer can hand Prometheus a scrape target
    /// (`address`, or the node name, and this port). Absent from agents older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
}

/// Command kinds a repairer may send to an agent.
pub mod command_kind {
    /// Run every check once plus the active probes, and return the findings and a verdict.
    pub const DEEP_CHECK: &str = "deep-check";
    /// Run the agent's configured reboot command (the `agent` provider).
    pub const REBOOT: &str = "reboot";
    /// Start one rank of a job as a child of the agent ([`crate::RunRank`]).
    pub const RUN_RANK: &str = "run-rank";
    /// Forward a signal to a rank the agent runs ([`crate::SignalRank`]).
    pub const SIGNAL_RANK: &str = "signal-rank";
    /// Gather an evidence bundle ([`crate::EvidenceBundle`]) before a disruptive repair; the
    /// `budget_ms` argument bounds how long the agent may take.
    pub const EVIDENCE: &str = "evidence";
    /// Run one rank of the bundled all-reduce with other nodes and measure its bus bandwidth
    /// ([`crate::probes::AllreduceProbe`]).
    pub const ALLREDUCE: &str = "allreduce";
}

/// What a node looked like before a disruptive repair: kept by the repairer with the workflow,
/// so the reboot or replacement does not erase what a person (or a vendor's RMA) needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EvidenceBundle {
    pub node: String,
    pub boot_id: String,
    pub collected_at_ms: u64,
    /// How long gathering took, every item together.
    pub took_ms: u64,
    pub items: Vec<EvidenceItem>,
}

/// One piece of evidence: a log, the agent's own state, or a command's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EvidenceItem {
    /// `kernel-log`, `findings`, `checks`, or a configured command's name (`nvidia-smi`).
    pub name: String,
    /// Where it came from: a path, or the command line.
    pub source: String,
    /// `text`, or `base64` for binary output (a compressed report).
    pub encoding: String,
    /// What was kept, at most the item's size cap (the newest part of a log).
    pub content: String,
    /// The item's full size in bytes, before the cap.
    pub bytes: u64,
    /// Part of it was left out to stay within the cap.
    pub truncated: bool,
    pub took_ms: u64,
    /// Why the item is missing or incomplete (a timeout, a non-zero exit, an unreadable file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EvidenceItem {
    /// A text item kept whole.
    pub fn text(name: &str, source: &str, content: String) -> EvidenceItem {
        EvidenceItem {
            name: name.to_owned(),
            source: source.to_owned(),
            encoding: "text".to_owned(),
            bytes: content.len() as u64,
            content,
            truncated: false,
            took_ms: 0,
            error: None,
        }
    }
}

/// How a command the repairer sent went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandResult {
    /// The command's `id`.
    pub id: String,
    pub kind: String,
    /// It ran and succeeded (for a deep check: the node passed).
    pub ok: bool,
    /// A short account: the verdict, the failing findings, the error.
    #[serde(default)]
    pub message: String,
    /// For a deep check: the verdict over every finding it made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// For a deep check: its non-ok findings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// For an `evidence` command: the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<EvidenceBundle>,
    /// For an `allreduce` command that ran: what it measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce: Option<probes::AllreduceMeasurement>,
    pub finished_at_ms: u64,
}

impl CommandResult {
    /// The answer to `evidence` command `id`: `bundle`, with a message naming its items.
    pub fn evidence(id: &str, bundle: EvidenceBundle, finished_at_ms: u64) -> CommandResult {
        let names: Vec<&str> = bundle.items.iter().map(|i| i.name.as_str()).collect();
        CommandResult {
            id: id.to_owned(),
            kind: command_kind::EVIDENCE.to_owned(),
            ok: true,
            message: format!("evidence: {}", names.join(", ")),
            verdict: None,
            findings: Vec::new(),
            evidence: Some(bundle),
            allreduce: None,
            finished_at_ms,
        }
    }
}

/// Why a report was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum ReportTrigger {
    /// The regular heartbeat.
    Interval,
    /// A fault seen in an event stream (kernel log, GPU events) pushed at once.
    Event,
    /// The first report of this agent process.
    Startup,
    /// A command the repairer sent finished (its result is in `command_results`).
    Command,
    /// A rank of a job this agent runs ended.
    RankExit,
}

/// The repairer's answer to a report. Open for growth: commands for the node travel here, and an
/// agent that does not know a command's kind logs it and goes on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportReply {
    /// Commands for the node, in order.
    #[serde(default)]
    pub commands: Vec<NodeCommand>,
}

/// One command for a node, as sent by the repairer: a `kind` and its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeCommand {
    /// Identifies the command so the node does not run it twice.
    #[serde(default)]
    pub id: String,
    pub kind: String,
    #[serde(flatten)]
    pub args: BTreeMap<String, serde_json::Value>,
}

/// `GET /v1/health` on the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthView {
    pub node: String,
    pub boot_id: String,
    pub agent_version: String,
    pub verdict: Verdict,
    pub checks: Vec<CheckRun>,
    pub findings: Vec<Finding>,
}

/// `err` and each error it was caused by, joined with ": ", so that the one line a log or a
/// person gets says why (an HTTP client's "error sending request" alone names no certificate).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_is_the_worst_finding() {
        let ok = Finding::ok("gpu", "gpu", "0");
        let mut warn = ok.clone();
        warn.status = Status::Warn;
        let mut fail = ok.clone();
        fail.status = Status::Fail;
        let mut unknown = ok.clone();
        unknown.status = Status::Unknown;
        assert_eq!(Verdict::of([&ok, &unknown]), Verdict::Healthy);
        assert_eq!(Verdict::of([&ok, &warn]), Verdict::Degraded);
        assert_eq!(Verdict::of([&warn, &fail, &ok]), Verdict::Unhealthy);
    }

    #[test]
    fn reply_tolerates_unknown_commands_and_fields() {
        let reply: ReportReply = serde_json::from_str(
            r#"{"commands":[{"id":"c1","kind":"future-thing","x":1}],"later_field":true}"#,
        )
        .unwrap();
        assert_eq!(reply.commands[0].kind, "future-thing");
        assert_eq!(reply.commands[0].args["x"], 1);
        let empty: ReportReply = serde_json::from_str("{}").unwrap();
        assert!(empty.commands.is_empty());
    }

    #[test]
    fn actions_round_trip_as_kebab_case() {
        for action in [
            RecommendedAction::None,
            RecommendedAction::RestartApp,
            RecommendedAction::ResetGpu,
            RecommendedAction::Reboot,
            RecommendedAction::Replace,
            RecommendedAction::Drain,
        ] {
            let json = serde_json::to_string(&action).unwrap();
            assert_eq!(json, format!("\"{}\"", action.as_str()));
            assert_eq!(action.as_str().parse::<RecommendedAction>().unwrap(), action);
        }
    }
}
