//! Alerts that other monitoring systems push to the repairer: Alertmanager webhooks and CloudWatch
//! alarms delivered by SNS. Pure functions from a request body to findings; the HTTP handlers
//! authenticate the request and feed the result to `Engine::ingest_external`.
//!
//! ```toml
//! [inbound]
//! node_labels = ["node", "instance"]          # first present wins; "host:9100" -> "host"
//! severity_map = { critical = "fail", page = "fail", error = "fail", warning = "warn", info = "ok" }
//! copy_labels = ["alertname", "severity", "gpu", "xid"]
//! node_dimensions = ["node", "InstanceId"]
//! max_alerts = 1000
//! ```
//!
//! Every alert becomes a finding with `action = none`: the repairer's own rules decide what to do,
//! exactly as for an agent's finding, so an alert can never bypass the guard rails.
//!
//! A payload that is not what the sender documents (bad JSON, wrong version, a field of the wrong
//! type) is refused whole with an error naming the field, because it means a misconfigured sender.
//! A well-formed alert the repairer cannot place (no node label, no alert name, CloudWatch's
//! `INSUFFICIENT_DATA`) is skipped with a reason and the rest of the request still counts.

mod alertmanager;
mod config;
mod json;
mod sns;

use std::fmt;

use fleetmend_proto::Finding;

pub use alertmanager::{AlertmanagerNotification, parse_alertmanager};
pub use config::InboundConfig;
pub use sns::{SnsMessage, is_aws_sns_url, parse_sns};

/// The `check` of findings made from Alertmanager alerts.
pub const ALERTMANAGER_CHECK: &str = "alertmanager";
/// The `check` of findings made from CloudWatch alarms.
pub const CLOUDWATCH_CHECK: &str = "cloudwatch";
/// The only Alertmanager webhook payload version there is (Alertmanager 0.x sends "4").
pub const ALERTMANAGER_WEBHOOK_VERSION: &str = "4";

/// Longest finding message kept (annotations and alarm reasons can be pages long).
const MESSAGE_MAX_CHARS: usize = 300;
/// Longest label value copied onto a finding.
const LABEL_VALUE_MAX_CHARS: usize = 128;
/// Longest `finding` name made from an alert name.
const FINDING_NAME_MAX_CHARS: usize = 128;
/// Longest node name accepted (a DNS name's limit).
const NODE_NAME_MAX_BYTES: usize = 253;
/// Most labels `copy_labels` may name: findings carry bounded facts, not the whole alert.
const COPY_LABELS_MAX: usize = 32;

/// One alert, placed on a node, as a finding for `Engine::ingest_external`.
#[derive(Debug, Clone, PartialEq)]
pub struct InboundAlert {
    /// The node the alert is about, as the repairer names it.
    pub node: String,
    /// `check` is `alertmanager` or `cloudwatch`, `finding` the snake_case alert name, `action`
    /// always `none` (the repairer's rules decide).
    pub finding: Finding,
    /// True while the alert fires; false when it resolved (the finding clears).
    pub firing: bool,
}

/// Why a well-formed alert was not turned into a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// None of the configured node labels or dimensions is present.
    NoNode { looked_for: Vec<String> },
    /// The node label is present but its value cannot be a node name.
    InvalidNode { label: String, value: String },
    /// The alert has no `alertname` label (or one with no letters or digits).
    NoAlertName,
    /// A CloudWatch alarm went to `INSUFFICIENT_DATA`: no data says nothing about the node.
    InsufficientData,
}

impl SkipReason {
    /// A short, bounded name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            SkipReason::NoNode { .. } => "no_node",
            SkipReason::InvalidNode { .. } => "invalid_node",
            SkipReason::NoAlertName => "no_alertname",
            SkipReason::InsufficientData => "insufficient_data",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NoNode { looked_for } => {
                write!(f, "names no node (looked for {})", looked_for.join(", "))
            }
            SkipReason::InvalidNode { label, value } => {
                write!(f, "{label} {value:?} is not a node name")
            }
            SkipReason::NoAlertName => f.write_str("has no alertname label"),
            SkipReason::InsufficientData => {
                f.write_str("went to INSUFFICIENT_DATA, which says nothing about the node")
            }
        }
    }
}

/// An alert of an Alertmanager notification that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedAlert {
    /// Its position in the notification's `alerts`.
    pub index: usize,
    /// Its `alertname` label, cut to 128 characters; empty where it has none.
    pub alertname: String,
    pub reason: SkipReason,
}

impl fmt::Display for SkippedAlert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "alerts[{}] ({}) {}", self.index, self.alertname, self.reason)
    }
}

/// Parsing an inbound alert request failed; the request is refused whole.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    #[error("the body is {size} bytes, more than max_body_bytes ({limit})")]
    BodyTooLarge { size: usize, limit: usize },
    #[error("the body is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// A field is missing or of the wrong type; `path` names it (`alerts[2].labels`).
    #[error("{path}: {problem}")]
    Invalid { path: String, problem: String },
    #[error(
        "version: {found:?} is not an Alertmanager webhook version this repairer reads (it reads \"4\")"
    )]
    UnsupportedVersion { found: String },
    #[error(
        "alerts: {count} alerts in one notification, more than max_alerts ({limit}); set max_alerts \
         in Alertmanager's webhook_config to {limit} or less"
    )]
    TooManyAlerts { count: usize, limit: usize },
    #[error(
        "Type: {found:?} is not an SNS message type this repairer reads (Notification, \
         SubscriptionConfirmation, UnsubscribeConfirmation)"
    )]
    UnsupportedSnsType { found: String },
}

impl InboundError {
    /// A short, bounded name for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            InboundError::BodyTooLarge { .. } => "body_too_large",
            InboundError::NotJson(_) => "not_json",
            InboundError::Invalid { .. } => "invalid",
            InboundError::UnsupportedVersion { .. } => "unsupported_version",
            InboundError::TooManyAlerts { .. } => "too_many_alerts",
            InboundError::UnsupportedSnsType { .. } => "unsupported_sns_type",
        }
    }
}

fn check_size(body: &[u8], config: &InboundConfig) -> Result<(), InboundError> {
    if body.len() > config.max_body_bytes {
        return Err(InboundError::BodyTooLarge { size: body.len(), limit: config.max_body_bytes });
    }
    Ok(())
}

/// The first `max` characters of `text`.
fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => text[..end].to_owned(),
        None => text.to_owned(),
    }
}

/// `GpuXidError` → `gpu_xid_error`, `HighCPU` → `high_cpu`, `node-down` → `node_down`; anything
/// but ASCII letters and digits separates words. Cut to 128 characters.
pub fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    let separate = |out: &mut String| {
        if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    };
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            separate(&mut out);
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 {
            let previous = chars[i - 1];
            let next_is_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            // A word starts at `aB`, `9B`, and at the last capital of an acronym (`CPUTemp`).
            if previous.is_ascii_lowercase()
                || previous.is_ascii_digit()
                || (previous.is_ascii_uppercase() && next_is_lower)
            {
                separate(&mut out);
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    let mut out = truncate(&out, FINDING_NAME_MAX_CHARS);
    while out.ends_with('_') {
        out.pop();
    }
    out
}

/// The node name in a label or dimension value: `host:9100` → `host`, `[::1]:9100` → `::1`; `None`
/// where the result cannot be a node name (empty, too long, spaces or control characters).
fn node_name(value: &str) -> Option<String> {
    let value = value.trim();
    let host = if let Some(rest) = value.strip_prefix('[') {
        // `[v6]:port` or `[v6]`
        match rest.split_once(']') {
            Some((host, tail)) if tail.is_empty() || is_port_suffix(tail) => host,
            _ => value,
        }
    } else {
        match value.rsplit_once(':') {
            // Exactly one colon: `host:port`. More (a bare IPv6 address) stay as they are.
            Some((host, port))
                if !host.contains(':') && port.chars().all(|c| c.is_ascii_digit()) =>
            {
                if port.is_empty() { value } else { host }
            }
            _ => value,
        }
    };
    let ok = !host.is_empty()
        && host.len() <= NODE_NAME_MAX_BYTES
        && !host.chars().any(|c| c.is_whitespace() || c.is_control());
    ok.then(|| host.to_owned())
}

fn is_port_suffix(tail: &str) -> bool {
    tail.strip_prefix(':')
        .is_some_and(|port| !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()))
}

/// The node from the first of `names` present in `values`.
fn find_node<'a>(
    names: &[String],
    lookup: impl Fn(&str) -> Option<&'a str>,
) -> Result<String, SkipReason> {
    for name in names {
        if let Some(value) = lookup(name) {
            return node_name(value).ok_or_else(|| SkipReason::InvalidNode {
                label: name.clone(),
                value: truncate(value, LABEL_VALUE_MAX_CHARS),
            });
        }
    }
    Err(SkipReason::NoNode { looked_for: names.to_vec() })
}

/// An alert placed on a node, or the name it was shown under and why it was skipped.
type Placed = Result<InboundAlert, (String, SkipReason)>;

#[cfg(test)]
mod tests;
