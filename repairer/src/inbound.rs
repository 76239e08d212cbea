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

use std::collections::BTreeMap;
use std::fmt;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;
use serde_json::{Map, Value};

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

/// `[inbound]`: how alerts pushed by Alertmanager and CloudWatch (through SNS) become findings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InboundConfig {
    /// Alert labels that name the node, tried in order; the first present wins. A `host:port`
    /// value (Prometheus' `instance`) is cut to `host`.
    pub node_labels: Vec<String>,
    /// The alert label whose value becomes the finding's subject (a GPU index); empty for none.
    pub subject_label: String,
    /// The alert label that holds the severity.
    pub severity_label: String,
    /// Severity label value (compared in lower case) to finding status. Setting it replaces the
    /// whole default map: `critical`, `page`, `error` → fail, `warning` → warn, `info` → ok.
    pub severity_map: BTreeMap<String, Status>,
    /// Status of a firing alert whose severity is missing or not in `severity_map`.
    pub unmapped_severity: Status,
    /// Alert labels (Alertmanager) or alarm dimensions (CloudWatch) copied onto the finding's
    /// labels, values cut to 128 characters. `xid` matters: it tells two Xids on one GPU apart.
    pub copy_labels: Vec<String>,
    /// CloudWatch alarm dimensions that name the node, tried in order; the first present wins.
    pub node_dimensions: Vec<String>,
    /// The CloudWatch alarm dimension whose value becomes the finding's subject; empty for none.
    pub subject_dimension: String,
    /// Status of the finding while a CloudWatch alarm is in `ALARM` (warn or fail).
    pub alarm_status: Status,
    /// Most alerts in one Alertmanager notification; a larger one is refused whole. Set the
    /// webhook's `max_alerts` in Alertmanager to this or less.
    pub max_alerts: usize,
    /// Largest request body parsed, in bytes.
    pub max_body_bytes: usize,
}

impl Default for InboundConfig {
    fn default() -> InboundConfig {
        InboundConfig {
            node_labels: strings(&["node", "instance"]),
            subject_label: "gpu".to_owned(),
            severity_label: "severity".to_owned(),
            severity_map: [
                ("critical", Status::Fail),
                ("page", Status::Fail),
                ("error", Status::Fail),
                ("warning", Status::Warn),
                ("info", Status::Ok),
            ]
            .into_iter()
            .map(|(name, status)| (name.to_owned(), status))
            .collect(),
            unmapped_severity: Status::Warn,
            copy_labels: strings(&["alertname", "severity", "gpu", "xid"]),
            node_dimensions: strings(&["node", "InstanceId"]),
            subject_dimension: "gpu".to_owned(),
            alarm_status: Status::Fail,
            max_alerts: 1000,
            max_body_bytes: 4 * 1024 * 1024,
        }
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

/// A Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A CloudWatch dimension name: 1 to 255 characters, no control characters.
fn is_dimension_name(name: &str) -> bool {
    !name.is_empty() && name.chars().count() <= 255 && !name.chars().any(char::is_control)
}

impl InboundConfig {
    /// Every problem as `(field, message)`, naming fields under `section` (e.g. `inbound`).
    pub fn validate(&self, section: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: &str, message: String| {
            problems.push((format!("{section}.{field}"), message));
        };
        let mut names = |field: &str, list: &[String], valid: fn(&str) -> bool, what: &str| {
            let mut seen = std::collections::BTreeSet::new();
            for (i, name) in list.iter().enumerate() {
                if !valid(name) {
                    push(&format!("{field}[{i}]"), format!("{name:?} is not {what}"));
                } else if !seen.insert(name.as_str()) {
                    push(&format!("{field}[{i}]"), format!("{name:?} is listed twice"));
                }
            }
        };
        let label_name = "a label name ([a-zA-Z_][a-zA-Z0-9_]*)";
        let dimension_name = "a dimension name (1 to 255 characters)";
        names("node_labels", &self.node_labels, is_label_name, label_name);
        names("copy_labels", &self.copy_labels, is_label_name, label_name);
        names("node_dimensions", &self.node_dimensions, is_dimension_name, dimension_name);
        if self.node_labels.is_empty() {
            push("node_labels", "must name at least one label".into());
        }
        if self.node_dimensions.is_empty() {
            push("node_dimensions", "must name at least one dimension".into());
        }
        if self.copy_labels.len() > COPY_LABELS_MAX {
            push(
                "copy_labels",
                format!("{} labels, more than {COPY_LABELS_MAX}", self.copy_labels.len()),
            );
        }
        if !self.subject_label.is_empty() && !is_label_name(&self.subject_label) {
            push("subject_label", format!("{:?} is not {label_name}", self.subject_label));
        }
        if !is_label_name(&self.severity_label) {
            push("severity_label", format!("{:?} is not {label_name}", self.severity_label));
        }
        if !self.subject_dimension.is_empty() && !is_dimension_name(&self.subject_dimension) {
            push(
                "subject_dimension",
                format!("{:?} is not {dimension_name}", self.subject_dimension),
            );
        }
        for severity in self.severity_map.keys() {
            if severity.is_empty() || *severity != severity.to_lowercase() {
                push(
                    &format!("severity_map.{severity}"),
                    "severities are matched in lower case: write the key in lower case".into(),
                );
            }
        }
        if !matches!(self.alarm_status, Status::Warn | Status::Fail) {
            push("alarm_status", format!("{} is not warn or fail", self.alarm_status));
        }
        if !(1..=100_000).contains(&self.max_alerts) {
            push("max_alerts", format!("{} is not from 1 to 100000", self.max_alerts));
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.max_body_bytes) {
            push(
                "max_body_bytes",
                format!("{} is not from 1024 to 67108864 (64 MiB)", self.max_body_bytes),
            );
        }
        problems
    }
}

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

/// One Alertmanager webhook notification (one alert group), parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertmanagerNotification {
    /// The Alertmanager receiver that sent it.
    pub receiver: String,
    /// The alert group's key.
    pub group_key: String,
    /// Alerts Alertmanager left out because of the webhook's `max_alerts`.
    pub truncated_alerts: u64,
    /// The alerts that became findings, in the notification's order.
    pub alerts: Vec<InboundAlert>,
    /// How many alerts did not become findings (`skipped_alerts.len()`).
    pub skipped: usize,
    /// The alerts that did not, with the reason.
    pub skipped_alerts: Vec<SkippedAlert>,
}

/// One SNS message to the repairer's HTTP(S) subscription.
#[derive(Debug, Clone, PartialEq)]
pub enum SnsMessage {
    /// A `Notification` carrying a CloudWatch alarm state change (or, with raw message delivery
    /// on, the alarm itself): `ALARM` (firing) or `OK` (resolved) on a node; `None` where the
    /// alarm names no node or went to `INSUFFICIENT_DATA` (the reason is logged).
    Alarm(Option<InboundAlert>),
    /// SNS asks to confirm the subscription. The repairer records it for the operator and does not
    /// visit `subscribe_url` itself: an inbound request must not make the repairer call out.
    SubscriptionConfirmation {
        topic_arn: String,
        subscribe_url: String,
        token: String,
        message_id: String,
    },
    /// SNS confirms the endpoint was unsubscribed; `subscribe_url` subscribes it again.
    UnsubscribeConfirmation {
        topic_arn: String,
        subscribe_url: String,
        token: String,
        message_id: String,
    },
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

fn invalid(path: &str, problem: impl Into<String>) -> InboundError {
    InboundError::Invalid { path: path.to_owned(), problem: problem.into() }
}

/// `parent.key`, or `key` at the top.
fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() { key.to_owned() } else { format!("{parent}.{key}") }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn expected(path: &str, what: &str, found: &Value) -> InboundError {
    invalid(path, format!("expected {what}, found {}", json_type(found)))
}

fn as_object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, InboundError> {
    value
        .as_object()
        .ok_or_else(|| expected(if path.is_empty() { "(body)" } else { path }, "an object", value))
}

fn required<'a>(
    object: &'a Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<&'a Value, InboundError> {
    object.get(key).ok_or_else(|| invalid(&join(parent, key), "missing"))
}

fn required_str<'a>(
    object: &'a Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<&'a str, InboundError> {
    let value = required(object, parent, key)?;
    value.as_str().ok_or_else(|| expected(&join(parent, key), "a string", value))
}

/// A string field that may be missing or null.
fn optional_str<'a>(
    object: &'a Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<Option<&'a str>, InboundError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(other) => Err(expected(&join(parent, key), "a string", other)),
    }
}

/// An object of string values (Alertmanager labels and annotations).
fn string_map<'a>(
    value: &'a Value,
    path: &str,
) -> Result<BTreeMap<&'a str, &'a str>, InboundError> {
    let object = as_object(value, path)?;
    object
        .iter()
        .map(|(key, value)| match value.as_str() {
            Some(text) => Ok((key.as_str(), text)),
            None => Err(expected(&join(path, key), "a string", value)),
        })
        .collect()
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

/// Parses an Alertmanager webhook notification (payload version 4): one finding per alert that
/// names a node, `firing` from each alert's own `status` (a group can hold both).
pub fn parse_alertmanager(
    body: &[u8],
    config: &InboundConfig,
) -> Result<AlertmanagerNotification, InboundError> {
    check_size(body, config)?;
    let root: Value = serde_json::from_slice(body).map_err(InboundError::NotJson)?;
    let root = as_object(&root, "")?;
    let version = required(root, "", "version")?;
    let version = version.as_str().ok_or_else(|| expected("version", "a string", version))?;
    if version != ALERTMANAGER_WEBHOOK_VERSION {
        return Err(InboundError::UnsupportedVersion { found: truncate(version, 32) });
    }
    let receiver = optional_str(root, "", "receiver")?.unwrap_or_default().to_owned();
    let group_key = optional_str(root, "", "groupKey")?.unwrap_or_default().to_owned();
    let truncated_alerts = match root.get("truncatedAlerts") {
        None | Some(Value::Null) => 0,
        Some(value) => {
            value.as_u64().ok_or_else(|| expected("truncatedAlerts", "a whole number", value))?
        }
    };
    let alerts = required(root, "", "alerts")?;
    let alerts = alerts.as_array().ok_or_else(|| expected("alerts", "an array", alerts))?;
    if alerts.len() > config.max_alerts {
        return Err(InboundError::TooManyAlerts { count: alerts.len(), limit: config.max_alerts });
    }
    let mut notification = AlertmanagerNotification {
        receiver,
        group_key,
        truncated_alerts,
        alerts: Vec::with_capacity(alerts.len()),
        skipped: 0,
        skipped_alerts: Vec::new(),
    };
    for (index, alert) in alerts.iter().enumerate() {
        match alertmanager_alert(alert, &format!("alerts[{index}]"), config)? {
            Ok(alert) => notification.alerts.push(alert),
            Err((alertname, reason)) => {
                notification.skipped_alerts.push(SkippedAlert { index, alertname, reason });
            }
        }
    }
    notification.skipped = notification.skipped_alerts.len();
    Ok(notification)
}

type Placed = Result<InboundAlert, (String, SkipReason)>;

fn alertmanager_alert(
    alert: &Value,
    at: &str,
    config: &InboundConfig,
) -> Result<Placed, InboundError> {
    let alert = as_object(alert, at)?;
    let labels = string_map(required(alert, at, "labels")?, &join(at, "labels"))?;
    let annotations = match alert.get("annotations") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(value) => string_map(value, &join(at, "annotations"))?,
    };
    let firing = match required_str(alert, at, "status")? {
        "firing" => true,
        "resolved" => false,
        other => {
            return Err(invalid(
                &join(at, "status"),
                format!("{:?} is neither \"firing\" nor \"resolved\"", truncate(other, 32)),
            ));
        }
    };
    let alertname = labels.get("alertname").copied().unwrap_or_default();
    let finding_name = snake_case(alertname);
    let shown_name = truncate(alertname, LABEL_VALUE_MAX_CHARS);
    if finding_name.is_empty() {
        return Ok(Err((shown_name, SkipReason::NoAlertName)));
    }
    let node = match find_node(&config.node_labels, |name| labels.get(name).copied()) {
        Ok(node) => node,
        Err(reason) => return Ok(Err((shown_name, reason))),
    };
    let status = if firing {
        labels
            .get(config.severity_label.as_str())
            .and_then(|severity| config.severity_map.get(&severity.to_lowercase()))
            .copied()
            .unwrap_or(config.unmapped_severity)
    } else {
        Status::Ok
    };
    let subject = if config.subject_label.is_empty() {
        ""
    } else {
        labels.get(config.subject_label.as_str()).copied().unwrap_or_default()
    };
    let message = match annotations.get("summary").or_else(|| annotations.get("description")) {
        Some(text) if !text.trim().is_empty() => truncate(text.trim(), MESSAGE_MAX_CHARS),
        _ => format!("{shown_name} {}", if firing { "firing" } else { "resolved" }),
    };
    let mut finding = Finding::new(
        ALERTMANAGER_CHECK,
        &finding_name,
        truncate(subject, LABEL_VALUE_MAX_CHARS),
        status,
        RecommendedAction::None,
        message,
    );
    for name in &config.copy_labels {
        if let Some(value) = labels.get(name.as_str()) {
            finding.labels.insert(name.clone(), truncate(value, LABEL_VALUE_MAX_CHARS));
        }
    }
    Ok(Ok(InboundAlert { node, finding, firing }))
}

/// Parses a message SNS posts to an HTTP(S) subscription: a CloudWatch alarm notification, a
/// subscription confirmation or an unsubscribe confirmation. With raw message delivery on, the
/// body is the CloudWatch alarm itself (no envelope); that is read too.
///
/// SNS signs every message (`Signature`, `SigningCertURL`), but checking it needs the signing
/// certificate fetched from AWS, which a repairer answering an inbound request must not do (and
/// cannot, off the internet). The signature is not checked: the handler authenticates the request
/// with the token in its URL instead.
pub fn parse_sns(body: &[u8], config: &InboundConfig) -> Result<SnsMessage, InboundError> {
    check_size(body, config)?;
    let root: Value = serde_json::from_slice(body).map_err(InboundError::NotJson)?;
    let envelope = as_object(&root, "")?;
    if !envelope.contains_key("Type") && envelope.contains_key("AlarmName") {
        return cloudwatch_alarm(envelope, "", config).map(alarm_message);
    }
    let kind = required(envelope, "", "Type")?;
    let kind = kind.as_str().ok_or_else(|| expected("Type", "a string", kind))?;
    match kind {
        "Notification" => {
            let message = required(envelope, "", "Message")?;
            let message = message.as_str().ok_or_else(|| {
                expected("Message", "a string holding the CloudWatch alarm as JSON", message)
            })?;
            let alarm: Value = serde_json::from_str(message).map_err(|err| {
                invalid(
                    "Message",
                    format!("not JSON ({err}); only CloudWatch alarm notifications are understood"),
                )
            })?;
            let alarm = as_object(&alarm, "Message")?;
            cloudwatch_alarm(alarm, "Message", config).map(alarm_message)
        }
        "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
            let topic_arn = required_str(envelope, "", "TopicArn")?.to_owned();
            let subscribe_url = required_str(envelope, "", "SubscribeURL")?.to_owned();
            let token = required_str(envelope, "", "Token")?.to_owned();
            let message_id = required_str(envelope, "", "MessageId")?.to_owned();
            Ok(if kind == "SubscriptionConfirmation" {
                SnsMessage::SubscriptionConfirmation { topic_arn, subscribe_url, token, message_id }
            } else {
                SnsMessage::UnsubscribeConfirmation { topic_arn, subscribe_url, token, message_id }
            })
        }
        other => Err(InboundError::UnsupportedSnsType { found: truncate(other, 64) }),
    }
}

fn alarm_message(placed: Placed) -> SnsMessage {
    SnsMessage::Alarm(match placed {
        Ok(alert) => Some(alert),
        Err((alarm_name, reason)) => {
            tracing::info!(alarm = %alarm_name, reason = %reason, "CloudWatch alarm skipped");
            None
        }
    })
}

/// Whether `url` is where AWS sends people to confirm an SNS subscription
/// (`https://sns.<region>.amazonaws.com[.cn]/...`): worth checking before an operator is told to
/// open a URL that arrived in a request.
pub fn is_aws_sns_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("https://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = host.strip_suffix(":443").unwrap_or(host);
    host.starts_with("sns.")
        && (host.ends_with(".amazonaws.com") || host.ends_with(".amazonaws.com.cn"))
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
}

/// The dimensions of an alarm's trigger, first value per name: `Trigger.Dimensions` for a
/// single-metric alarm, else those of `Trigger.Metrics[].MetricStat.Metric` (metric math).
fn alarm_dimensions<'a>(
    trigger: &'a Map<String, Value>,
    at: &str,
) -> Result<BTreeMap<&'a str, &'a str>, InboundError> {
    let mut dimensions = BTreeMap::new();
    let mut add = |list: &'a Value, path: &str| -> Result<(), InboundError> {
        let items = list.as_array().ok_or_else(|| expected(path, "an array", list))?;
        for (i, item) in items.iter().enumerate() {
            let path = format!("{path}[{i}]");
            let item = as_object(item, &path)?;
            // SNS writes `name`/`value`; the CloudWatch API writes `Name`/`Value`.
            let field = |lower: &str, upper: &str| -> Result<&'a str, InboundError> {
                let key = if item.contains_key(lower) { lower } else { upper };
                required_str(item, &path, key)
            };
            let (name, value) = (field("name", "Name")?, field("value", "Value")?);
            dimensions.entry(name).or_insert(value);
        }
        Ok(())
    };
    match trigger.get("Dimensions") {
        None | Some(Value::Null) => {}
        Some(list) => add(list, &join(at, "Dimensions"))?,
    }
    if let Some(metrics) = trigger.get("Metrics").and_then(Value::as_array) {
        for (i, metric) in metrics.iter().enumerate() {
            let list = metric.pointer("/MetricStat/Metric/Dimensions");
            if let Some(list) = list.filter(|list| !list.is_null()) {
                add(list, &join(at, &format!("Metrics[{i}].MetricStat.Metric.Dimensions")))?;
            }
        }
    }
    Ok(dimensions)
}

fn cloudwatch_alarm(
    alarm: &Map<String, Value>,
    at: &str,
    config: &InboundConfig,
) -> Result<Placed, InboundError> {
    let alarm_name = required_str(alarm, at, "AlarmName")?;
    let finding_name = snake_case(alarm_name);
    if finding_name.is_empty() {
        return Err(invalid(&join(at, "AlarmName"), "has no letters or digits"));
    }
    let shown_name = truncate(alarm_name, LABEL_VALUE_MAX_CHARS);
    let state = required_str(alarm, at, "NewStateValue")?;
    let (firing, status) = match state {
        "ALARM" => (true, config.alarm_status),
        "OK" => (false, Status::Ok),
        "INSUFFICIENT_DATA" => {
            return Ok(Err((shown_name, SkipReason::InsufficientData)));
        }
        other => {
            return Err(invalid(
                &join(at, "NewStateValue"),
                format!("{:?} is not ALARM, OK or INSUFFICIENT_DATA", truncate(other, 32)),
            ));
        }
    };
    let trigger_at = join(at, "Trigger");
    let (dimensions, metric, namespace) = match alarm.get("Trigger") {
        None | Some(Value::Null) => (BTreeMap::new(), None, None),
        Some(trigger) => {
            let trigger = as_object(trigger, &trigger_at)?;
            (
                alarm_dimensions(trigger, &trigger_at)?,
                optional_str(trigger, &trigger_at, "MetricName")?,
                optional_str(trigger, &trigger_at, "Namespace")?,
            )
        }
    };
    let node = match find_node(&config.node_dimensions, |name| dimensions.get(name).copied()) {
        Ok(node) => node,
        Err(reason) => return Ok(Err((shown_name, reason))),
    };
    let subject = if config.subject_dimension.is_empty() {
        ""
    } else {
        dimensions.get(config.subject_dimension.as_str()).copied().unwrap_or_default()
    };
    let description = optional_str(alarm, at, "AlarmDescription")?.unwrap_or_default().trim();
    let reason = optional_str(alarm, at, "NewStateReason")?.unwrap_or_default().trim();
    let message = match (description.is_empty(), reason.is_empty()) {
        (false, false) => format!("{description}: {reason}"),
        (false, true) => description.to_owned(),
        (true, false) => reason.to_owned(),
        (true, true) => format!("{shown_name} {state}"),
    };
    let mut finding = Finding::new(
        CLOUDWATCH_CHECK,
        &finding_name,
        truncate(subject, LABEL_VALUE_MAX_CHARS),
        status,
        RecommendedAction::None,
        truncate(&message, MESSAGE_MAX_CHARS),
    );
    finding.labels.insert("alarm_name".to_owned(), shown_name);
    for (key, value) in [("metric", metric), ("namespace", namespace)] {
        if let Some(value) = value.filter(|value| !value.is_empty()) {
            finding.labels.insert(key.to_owned(), truncate(value, LABEL_VALUE_MAX_CHARS));
        }
    }
    for name in &config.copy_labels {
        if let Some(value) = dimensions.get(name.as_str()) {
            finding.labels.insert(name.clone(), truncate(value, LABEL_VALUE_MAX_CHARS));
        }
    }
    Ok(Ok(InboundAlert { node, finding, firing }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use super::*;

    fn config() -> InboundConfig {
        InboundConfig::default()
    }

    fn alertmanager(body: &Value) -> Result<AlertmanagerNotification, InboundError> {
        parse_alertmanager(body.to_string().as_bytes(), &config())
    }

    fn sns(body: &Value) -> Result<SnsMessage, InboundError> {
        parse_sns(body.to_string().as_bytes(), &config())
    }

    fn error_text(result: Result<impl fmt::Debug, InboundError>) -> String {
        result.expect_err("should be refused").to_string()
    }

    /// A group as Alertmanager 0.25 sends it: two alerts for two nodes, one firing, one resolved.
    const ALERTMANAGER_GROUP: &str = r#"{
      "receiver": "fleetmend",
      "status": "firing",
      "alerts": [
        {
          "status": "firing",
          "labels": {"alertname": "GpuXidError", "instance": "gpu-node-17.cluster:9100",
                     "job": "node", "severity": "critical", "gpu": "3", "xid": "79"},
          "annotations": {"summary": "GPU 3 fell off the bus (Xid 79)",
                          "description": "Xid 79 on gpu-node-17 GPU 3"},
          "startsAt": "2024-05-01T10:00:00.000Z",
          "endsAt": "0001-01-01T00:00:00Z",
          "generatorURL": "http://prometheus:9090/graph?g0.expr=fleetmend_gpu_xid_total",
          "fingerprint": "1a30ba71cca2921f"
        },
        {
          "status": "resolved",
          "labels": {"alertname": "GpuXidError", "node": "gpu-node-04", "instance": "10.0.0.4:9100",
                     "severity": "critical", "gpu": "0", "xid": "48"},
          "annotations": {"description": "Xid 48 on gpu-node-04 GPU 0"},
          "startsAt": "2024-05-01T09:00:00.000Z",
          "endsAt": "2024-05-01T09:30:00.000Z",
          "generatorURL": "http://prometheus:9090/graph",
          "fingerprint": "2b41cb82ddb0a320"
        }
      ],
      "groupLabels": {"alertname": "GpuXidError"},
      "commonLabels": {"alertname": "GpuXidError", "severity": "critical"},
      "commonAnnotations": {},
      "externalURL": "http://alertmanager:9093",
      "version": "4",
      "groupKey": "{}:{alertname=\"GpuXidError\"}",
      "truncatedAlerts": 0
    }"#;

    fn group_with(alerts: Value) -> Value {
        let mut group: Value = serde_json::from_str(ALERTMANAGER_GROUP).unwrap();
        group["alerts"] = alerts;
        group
    }

    fn alert(labels: Value, status: &str) -> Value {
        json!({"status": status, "labels": labels, "annotations": {},
               "startsAt": "2024-05-01T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
               "generatorURL": "", "fingerprint": "0000000000000000"})
    }

    #[test]
    fn alertmanager_group_becomes_one_finding_per_alert() {
        let parsed = parse_alertmanager(ALERTMANAGER_GROUP.as_bytes(), &config()).unwrap();
        assert_eq!(parsed.receiver, "fleetmend");
        assert_eq!(parsed.group_key, "{}:{alertname=\"GpuXidError\"}");
        assert_eq!(parsed.truncated_alerts, 0);
        assert_eq!(parsed.skipped, 0, "{:?}", parsed.skipped_alerts);
        assert_eq!(parsed.alerts.len(), 2);

        let firing = &parsed.alerts[0];
        assert_eq!(firing.node, "gpu-node-17.cluster", "instance with the port cut");
        assert!(firing.firing);
        let expected = Finding::new(
            "alertmanager",
            "gpu_xid_error",
            "3",
            Status::Fail,
            RecommendedAction::None,
            "GPU 3 fell off the bus (Xid 79)",
        )
        .with_label("alertname", "GpuXidError")
        .with_label("severity", "critical")
        .with_label("gpu", "3")
        .with_label("xid", "79");
        assert_eq!(firing.finding, expected, "job and instance are not copied");

        let resolved = &parsed.alerts[1];
        assert_eq!(resolved.node, "gpu-node-04", "the node label wins over instance");
        assert!(!resolved.firing);
        assert_eq!(resolved.finding.status, Status::Ok);
        assert_eq!(resolved.finding.subject, "0");
        assert_eq!(resolved.finding.labels["xid"], "48");
        assert_eq!(resolved.finding.message, "Xid 48 on gpu-node-04 GPU 0", "description");
    }

    #[test]
    fn severities_map_to_statuses_with_a_fallback() {
        let cases = [
            (Some("critical"), Status::Fail),
            (Some("PAGE"), Status::Fail),
            (Some("error"), Status::Fail),
            (Some("warning"), Status::Warn),
            (Some("info"), Status::Ok),
            (Some("whatever"), Status::Warn),
            (None, Status::Warn),
        ];
        for (severity, status) in cases {
            let mut labels = json!({"alertname": "NodeHot", "node": "n1"});
            if let Some(severity) = severity {
                labels["severity"] = json!(severity);
            }
            let parsed = alertmanager(&group_with(json!([alert(labels, "firing")]))).unwrap();
            assert_eq!(parsed.alerts[0].finding.status, status, "severity {severity:?}");
            assert_eq!(parsed.alerts[0].finding.subject, "", "no gpu label, node-wide");
            assert_eq!(parsed.alerts[0].finding.message, "NodeHot firing", "no annotations");
        }
        let mut custom = config();
        custom.severity_map = BTreeMap::from([("sev1".to_owned(), Status::Fail)]);
        custom.unmapped_severity = Status::Ok;
        let body = group_with(json!([
            alert(json!({"alertname": "A", "node": "n1", "severity": "SEV1"}), "firing"),
            alert(json!({"alertname": "B", "node": "n1", "severity": "critical"}), "firing"),
        ]));
        let parsed = parse_alertmanager(body.to_string().as_bytes(), &custom).unwrap();
        let statuses: Vec<Status> = parsed.alerts.iter().map(|a| a.finding.status).collect();
        assert_eq!(
            statuses,
            [Status::Fail, Status::Ok],
            "the configured map replaces the defaults"
        );
    }

    #[test]
    fn alerts_without_a_node_or_name_are_skipped_and_the_rest_count() {
        let body = group_with(json!([
            alert(json!({"alertname": "DiskFull", "job": "node"}), "firing"),
            alert(json!({"alertname": "DiskFull", "node": "n2"}), "firing"),
            alert(json!({"node": "n3"}), "firing"),
            alert(json!({"alertname": "DiskFull", "node": "has space"}), "firing"),
            alert(json!({"alertname": "--", "node": "n5"}), "firing"),
        ]));
        let parsed = alertmanager(&body).unwrap();
        assert_eq!(parsed.alerts.len(), 1);
        assert_eq!(parsed.alerts[0].node, "n2");
        assert_eq!(parsed.skipped, 4);
        let skipped: Vec<(usize, &str)> =
            parsed.skipped_alerts.iter().map(|s| (s.index, s.reason.kind())).collect();
        assert_eq!(
            skipped,
            [(0, "no_node"), (2, "no_alertname"), (3, "invalid_node"), (4, "no_alertname")]
        );
        assert_eq!(
            parsed.skipped_alerts[0].to_string(),
            "alerts[0] (DiskFull) names no node (looked for node, instance)"
        );
    }

    #[test]
    fn node_names_lose_the_port_only() {
        let cases = [
            ("node1", Some("node1")),
            ("node1:9100", Some("node1")),
            ("10.1.2.3:9100", Some("10.1.2.3")),
            ("[fe80::1]:9100", Some("fe80::1")),
            ("[fe80::1]", Some("fe80::1")),
            ("fe80::1", Some("fe80::1")),
            ("host:", Some("host:")),
            ("host:http", Some("host:http")),
            ("  node1  ", Some("node1")),
            ("", None),
            ("a b", None),
            ("bad\u{7}", None),
        ];
        for (value, node) in cases {
            assert_eq!(node_name(value).as_deref(), node, "{value:?}");
        }
        assert_eq!(node_name(&"n".repeat(254)), None, "longer than a DNS name");
    }

    #[test]
    fn alert_names_become_snake_case_findings() {
        let cases = [
            ("GpuXidError", "gpu_xid_error"),
            ("GPUFellOffBus", "gpu_fell_off_bus"),
            ("HighCPU", "high_cpu"),
            ("node-down", "node_down"),
            ("Xid79Error", "xid79_error"),
            ("already_snake", "already_snake"),
            ("  Spaces  and--dashes ", "spaces_and_dashes"),
            ("NVLinkDown", "nv_link_down"),
            ("ÜberHot", "ber_hot"),
            ("!!", ""),
        ];
        for (name, finding) in cases {
            assert_eq!(snake_case(name), finding, "{name:?}");
        }
        assert_eq!(snake_case(&"Ab".repeat(200)).len(), 128);
    }

    #[test]
    fn long_values_are_cut_and_only_listed_labels_copied() {
        let summary = "é".repeat(1000);
        let mut one = alert(
            json!({"alertname": "Long", "node": "n1", "xid": "x".repeat(500), "team": "ml"}),
            "firing",
        );
        one["annotations"] = json!({"summary": summary});
        let parsed = alertmanager(&group_with(json!([one]))).unwrap();
        let finding = &parsed.alerts[0].finding;
        assert_eq!(finding.message.chars().count(), 300);
        assert_eq!(finding.labels["xid"].len(), 128);
        assert!(!finding.labels.contains_key("team"));
        assert!(!finding.labels.contains_key("node"));
    }

    #[test]
    fn alertmanager_payloads_that_are_not_version_4_are_refused() {
        let mut body: Value = serde_json::from_str(ALERTMANAGER_GROUP).unwrap();
        body["version"] = json!("5");
        let err = alertmanager(&body).unwrap_err();
        assert!(matches!(err, InboundError::UnsupportedVersion { .. }), "{err}");
        assert!(err.to_string().contains("\"5\""), "{err}");
        body["version"] = json!(4);
        assert_eq!(error_text(alertmanager(&body)), "version: expected a string, found a number");
        body.as_object_mut().unwrap().remove("version");
        assert_eq!(error_text(alertmanager(&body)), "version: missing");
    }

    #[test]
    fn malformed_alertmanager_payloads_name_the_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!([]), "(body): expected an object, found an array"),
            (json!({"version": "4"}), "alerts: missing"),
            (json!({"version": "4", "alerts": {}}), "alerts: expected an array, found an object"),
            (group_with(json!([1])), "alerts[0]: expected an object, found a number"),
            (
                group_with(json!([alert(json!({"node": "n"}), "firing"), {"status": "firing"}])),
                "alerts[1].labels: missing",
            ),
            (
                group_with(json!([alert(json!({"alertname": 3}), "firing")])),
                "alerts[0].labels.alertname: expected a string, found a number",
            ),
            (
                group_with(json!([alert(json!({"alertname": "A", "node": "n"}), "pending")])),
                "alerts[0].status: \"pending\" is neither \"firing\" nor \"resolved\"",
            ),
            (group_with(json!([{"labels": {"alertname": "A"}}])), "alerts[0].status: missing"),
            (
                group_with(json!([{"labels": {}, "status": "firing", "annotations": []}])),
                "alerts[0].annotations: expected an object, found an array",
            ),
            (
                json!({"version": "4", "alerts": [], "truncatedAlerts": "many"}),
                "truncatedAlerts: expected a whole number, found a string",
            ),
        ];
        for (body, message) in cases {
            assert_eq!(error_text(alertmanager(&body)), message, "{body}");
        }
    }

    #[test]
    fn alertmanager_lists_and_bodies_are_bounded() {
        let one = alert(json!({"alertname": "A", "node": "n"}), "firing");
        let body = group_with(Value::Array(vec![one; 1001]));
        let err = alertmanager(&body).unwrap_err();
        assert!(matches!(err, InboundError::TooManyAlerts { count: 1001, limit: 1000 }), "{err}");
        assert!(err.to_string().contains("max_alerts"), "{err}");

        let mut small = config();
        small.max_body_bytes = 1024;
        let err = parse_alertmanager(&[b' '; 1025], &small).unwrap_err();
        assert_eq!(err.to_string(), "the body is 1025 bytes, more than max_body_bytes (1024)");
        assert_eq!(err.kind(), "body_too_large");
    }

    #[test]
    fn garbage_is_refused_never_a_panic() {
        let mut seed = 7u64;
        let mut bodies: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"{".to_vec(),
            b"null".to_vec(),
            b"\"4\"".to_vec(),
            vec![0xff, 0xfe, 0x00, 0x7b],
            "[".repeat(100_000).into_bytes(),
            format!("{}{}", "{\"a\":".repeat(5000), "}".repeat(5000)).into_bytes(),
        ];
        // Truncations and byte flips of real payloads.
        for payload in [ALERTMANAGER_GROUP.as_bytes(), CLOUDWATCH_ALARM_NOTIFICATION.as_bytes()] {
            for end in (0..payload.len()).step_by(7) {
                bodies.push(payload[..end].to_vec());
            }
            for _ in 0..300 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let mut flipped = payload.to_vec();
                let at = (seed >> 33) as usize % flipped.len();
                flipped[at] = (seed >> 17) as u8;
                bodies.push(flipped);
            }
        }
        for body in &bodies {
            // Either result is fine; reaching the end without a panic is the point.
            let _ = parse_alertmanager(body, &config());
            let _ = parse_sns(body, &config());
        }
        assert_eq!(parse_alertmanager(b"", &config()).unwrap_err().kind(), "not_json");
        let err = parse_sns(&[0xff, 0xfe], &config()).unwrap_err();
        assert!(err.to_string().starts_with("the body is not JSON"), "{err}");
    }

    /// A CloudWatch alarm notification as SNS posts it to an HTTP(S) subscription.
    const CLOUDWATCH_ALARM_NOTIFICATION: &str = r#"{
      "Type": "Notification",
      "MessageId": "5f5a3d7c-8c1b-5a0e-9a5e-2f1d0b7c3e11",
      "TopicArn": "arn:aws:sns:us-east-1:123456789012:fleet-alarms",
      "Subject": "ALARM: \"GpuXidErrors-i-0abc\" in US East (N. Virginia)",
      "Message": "{\"AlarmName\":\"GpuXidErrors-i-0abc\",\"AlarmDescription\":\"Xid errors on a GPU\",\"AWSAccountId\":\"123456789012\",\"AlarmConfigurationUpdatedTimestamp\":\"2024-05-01T09:00:00.000+0000\",\"NewStateValue\":\"ALARM\",\"NewStateReason\":\"Threshold Crossed: 1 out of the last 1 datapoints [2.0 (01/05/24 10:00:00)] was greater than or equal to the threshold (1.0).\",\"StateChangeTime\":\"2024-05-01T10:01:00.000+0000\",\"Region\":\"US East (N. Virginia)\",\"AlarmArn\":\"arn:aws:cloudwatch:us-east-1:123456789012:alarm:GpuXidErrors-i-0abc\",\"OldStateValue\":\"OK\",\"OKActions\":[],\"AlarmActions\":[\"arn:aws:sns:us-east-1:123456789012:fleet-alarms\"],\"InsufficientDataActions\":[],\"Trigger\":{\"MetricName\":\"XidErrors\",\"Namespace\":\"Fleet/GPU\",\"StatisticType\":\"Statistic\",\"Statistic\":\"MAXIMUM\",\"Unit\":null,\"Dimensions\":[{\"value\":\"i-0abc\",\"name\":\"InstanceId\"},{\"value\":\"2\",\"name\":\"gpu\"},{\"value\":\"79\",\"name\":\"xid\"}],\"Period\":60,\"EvaluationPeriods\":1,\"DatapointsToAlarm\":1,\"ComparisonOperator\":\"GreaterThanOrEqualToThreshold\",\"Threshold\":1.0,\"TreatMissingData\":\"missing\",\"EvaluateLowSampleCountPercentile\":\"\"}}",
      "Timestamp": "2024-05-01T10:01:00.123Z",
      "SignatureVersion": "1",
      "Signature": "EXAMPLEpH+DcEwjAPg8O9mY8dReBSwksfg2S7WKQcikcNKWLQjwu6A4VbeS0QHVCkhRS7fUQvi2egU3N858fiTDN6bkkOxYDVrY0Ad8L10Hs3zH81mtnPk5uvvolIC1CXGu43obcgFxeL3khZl8IKvO61GWB6jI9b5+gLPoBc1Q=",
      "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem",
      "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-east-1:123456789012:fleet-alarms:2bcfbf39-05c3-41de-beaa-fcfcc21c8f55"
    }"#;

    fn notification_with(alarm: &Value) -> Value {
        let mut envelope: Value = serde_json::from_str(CLOUDWATCH_ALARM_NOTIFICATION).unwrap();
        envelope["Message"] = json!(alarm.to_string());
        envelope
    }

    fn real_alarm() -> Value {
        let envelope: Value = serde_json::from_str(CLOUDWATCH_ALARM_NOTIFICATION).unwrap();
        serde_json::from_str(envelope["Message"].as_str().unwrap()).unwrap()
    }

    fn alert_of(message: SnsMessage) -> InboundAlert {
        match message {
            SnsMessage::Alarm(Some(alert)) => alert,
            other => panic!("expected an alert, got {other:?}"),
        }
    }

    #[test]
    fn cloudwatch_alarm_fires_a_failing_finding() {
        let alert =
            alert_of(parse_sns(CLOUDWATCH_ALARM_NOTIFICATION.as_bytes(), &config()).unwrap());
        assert_eq!(alert.node, "i-0abc", "InstanceId, as no node dimension is present");
        assert!(alert.firing);
        let expected = Finding::new(
            "cloudwatch",
            "gpu_xid_errors_i_0abc",
            "2",
            Status::Fail,
            RecommendedAction::None,
            "Xid errors on a GPU: Threshold Crossed: 1 out of the last 1 datapoints [2.0 (01/05/24 \
             10:00:00)] was greater than or equal to the threshold (1.0).",
        )
        .with_label("alarm_name", "GpuXidErrors-i-0abc")
        .with_label("metric", "XidErrors")
        .with_label("namespace", "Fleet/GPU")
        .with_label("gpu", "2")
        .with_label("xid", "79");
        assert_eq!(alert.finding, expected);
    }

    #[test]
    fn cloudwatch_ok_resolves_and_insufficient_data_is_skipped() {
        let mut alarm = real_alarm();
        alarm["NewStateValue"] = json!("OK");
        alarm["OldStateValue"] = json!("ALARM");
        alarm["AlarmDescription"] = Value::Null;
        alarm["Trigger"]["Dimensions"] = json!([{"name": "node", "value": "gpu-node-9"},
                                               {"name": "InstanceId", "value": "i-0abc"}]);
        let alert = alert_of(sns(&notification_with(&alarm)).unwrap());
        assert_eq!(alert.node, "gpu-node-9", "node wins over InstanceId");
        assert!(!alert.firing);
        assert_eq!(alert.finding.status, Status::Ok);
        assert_eq!(alert.finding.subject, "", "no gpu dimension");
        assert!(
            alert.finding.message.starts_with("Threshold Crossed"),
            "{}",
            alert.finding.message
        );

        alarm["NewStateValue"] = json!("INSUFFICIENT_DATA");
        assert_eq!(sns(&notification_with(&alarm)).unwrap(), SnsMessage::Alarm(None));
        let placed = cloudwatch_alarm(alarm.as_object().unwrap(), "", &config()).unwrap();
        assert_eq!(placed, Err(("GpuXidErrors-i-0abc".into(), SkipReason::InsufficientData)));

        alarm["NewStateValue"] = json!("ALARM");
        alarm["Trigger"]["Dimensions"] = json!([{"name": "AutoScalingGroupName", "value": "asg"}]);
        assert_eq!(sns(&notification_with(&alarm)).unwrap(), SnsMessage::Alarm(None));
        let (_, reason) =
            cloudwatch_alarm(alarm.as_object().unwrap(), "", &config()).unwrap().unwrap_err();
        assert_eq!(reason.to_string(), "names no node (looked for node, InstanceId)");
    }

    #[test]
    fn metric_math_and_raw_delivery_alarms_are_read() {
        let mut alarm = real_alarm();
        let trigger = alarm["Trigger"].as_object_mut().unwrap();
        trigger.remove("Dimensions");
        trigger.remove("MetricName");
        trigger.insert(
            "Metrics".into(),
            json!([
                {"Id": "e1", "Expression": "m1 * 2", "ReturnData": true},
                {"Id": "m1", "ReturnData": false, "MetricStat": {"Metric": {
                    "Namespace": "Fleet/GPU", "MetricName": "XidErrors",
                    "Dimensions": [{"Name": "node", "Value": "n7"}, {"Name": "gpu", "Value": "5"}]},
                    "Period": 60, "Stat": "Maximum"}}
            ]),
        );
        let alert = alert_of(sns(&notification_with(&alarm)).unwrap());
        assert_eq!((alert.node.as_str(), alert.finding.subject.as_str()), ("n7", "5"));
        assert!(!alert.finding.labels.contains_key("metric"));

        // Raw message delivery: the alarm is the whole body.
        let alert = alert_of(sns(&real_alarm()).unwrap());
        assert_eq!(alert.node, "i-0abc");
        assert!(alert.firing);
    }

    #[test]
    fn subscription_messages_are_recorded_not_followed() {
        let confirmation = json!({
            "Type": "SubscriptionConfirmation",
            "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
            "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92768dd60a747ba6f3beb71854e285d6ad02428b09ceece29417f1f02d609c582afbacc99c583a916b9981dd2728f4ae6fdb82efd087cc3b7849e05798d2d2785c03b0879594eeac82c01f235d0e717736",
            "TopicArn": "arn:aws:sns:us-west-2:123456789012:MyTopic",
            "Message": "You have chosen to subscribe to the topic arn:aws:sns:us-west-2:123456789012:MyTopic.\nTo confirm the subscription, visit the SubscribeURL included in this message.",
            "SubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-west-2:123456789012:MyTopic&Token=2336412f37",
            "Timestamp": "2012-04-26T20:45:04.751Z",
            "SignatureVersion": "1",
            "Signature": "EXAMPLEpH+DcEwjAPg8O9mY8dReBSwksfg2S7WKQcikcNKWLQjwu6A4VbeS0QHVCkhRS7fUQvi2egU3N858fiTDN6bkkOxYDVrY0Ad8L10Hs3zH81mtnPk5uvvolIC1CXGu43obcgFxeL3khZl8IKvO61GWB6jI9b5+gLPoBc1Q=",
            "SigningCertURL": "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem"
        });
        let message = sns(&confirmation).unwrap();
        let SnsMessage::SubscriptionConfirmation { topic_arn, subscribe_url, token, message_id } =
            message
        else {
            panic!("expected a subscription confirmation, got {message:?}");
        };
        assert_eq!(topic_arn, "arn:aws:sns:us-west-2:123456789012:MyTopic");
        assert!(subscribe_url.contains("Action=ConfirmSubscription"));
        assert!(token.starts_with("2336412f37fb"));
        assert_eq!(message_id, "165545c9-2a5c-472c-8df2-7ff2be2b3b1b");
        assert!(is_aws_sns_url(&subscribe_url));

        let mut unsubscribe = confirmation.clone();
        unsubscribe["Type"] = json!("UnsubscribeConfirmation");
        assert!(matches!(sns(&unsubscribe).unwrap(), SnsMessage::UnsubscribeConfirmation { .. }));

        let mut no_url = confirmation;
        no_url.as_object_mut().unwrap().remove("SubscribeURL");
        assert_eq!(error_text(sns(&no_url)), "SubscribeURL: missing");
    }

    #[test]
    fn only_aws_sns_hosts_look_like_subscribe_urls() {
        for url in [
            "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription",
            "https://sns.cn-north-1.amazonaws.com.cn/?Action=ConfirmSubscription",
            "https://sns.eu-west-1.amazonaws.com:443/x",
        ] {
            assert!(is_aws_sns_url(url), "{url}");
        }
        for url in [
            "http://sns.us-east-1.amazonaws.com/",
            "https://sns.us-east-1.amazonaws.com.evil.example/",
            "https://evil.example/?sns.us-east-1.amazonaws.com",
            "https://user@sns.us-east-1.amazonaws.com/",
            "https://s3.amazonaws.com/",
        ] {
            assert!(!is_aws_sns_url(url), "{url}");
        }
    }

    #[test]
    fn malformed_sns_messages_name_the_field() {
        let mut non_string = notification_with(&real_alarm());
        non_string["Message"] = real_alarm();
        let mut not_json = notification_with(&real_alarm());
        not_json["Message"] = json!("Hello from the console");
        let mut bad_state = real_alarm();
        bad_state["NewStateValue"] = json!("PANIC");
        let mut bad_dimension = real_alarm();
        bad_dimension["Trigger"]["Dimensions"] = json!([{"name": "node"}]);
        let mut bad_trigger = real_alarm();
        bad_trigger["Trigger"] = json!("x");
        let mut no_name = real_alarm();
        no_name.as_object_mut().unwrap().remove("AlarmName");
        let cases: Vec<(Value, &str)> = vec![
            (
                non_string,
                "Message: expected a string holding the CloudWatch alarm as JSON, found an object",
            ),
            (json!({"Message": "x"}), "Type: missing"),
            (json!({"Type": 1}), "Type: expected a string, found a number"),
            (json!({"Type": "Notification"}), "Message: missing"),
            (notification_with(&json!([1])), "Message: expected an object, found an array"),
            (
                notification_with(&bad_state),
                "Message.NewStateValue: \"PANIC\" is not ALARM, OK or INSUFFICIENT_DATA",
            ),
            (notification_with(&bad_dimension), "Message.Trigger.Dimensions[0].Value: missing"),
            (
                notification_with(&bad_trigger),
                "Message.Trigger: expected an object, found a string",
            ),
            (notification_with(&no_name), "Message.AlarmName: missing"),
        ];
        for (body, message) in cases {
            assert_eq!(error_text(sns(&body)), message, "{body}");
        }
        let err = sns(&not_json).unwrap_err().to_string();
        assert!(err.starts_with("Message: not JSON"), "{err}");
        let err = sns(&json!({"Type": "Nonsense"})).unwrap_err();
        assert_eq!(err.kind(), "unsupported_sns_type");
        assert!(err.to_string().contains("\"Nonsense\""), "{err}");
    }

    #[test]
    fn config_defaults_validate_and_bad_fields_are_named() {
        assert_eq!(config().validate("inbound"), Vec::new());
        let parsed: InboundConfig = toml::from_str(
            r#"
            node_labels = ["hostname"]
            severity_map = { sev1 = "fail", sev2 = "warn" }
            max_alerts = 50
            "#,
        )
        .unwrap();
        assert_eq!(parsed.node_labels, ["hostname"]);
        assert_eq!(parsed.severity_map.len(), 2);
        assert_eq!(parsed.copy_labels, config().copy_labels, "unset fields keep their defaults");
        assert!(toml::from_str::<InboundConfig>("node_label = \"x\"").is_err(), "unknown field");

        let bad = InboundConfig {
            node_labels: vec![],
            subject_label: "gpu index".into(),
            severity_label: String::new(),
            severity_map: BTreeMap::from([("Critical".to_owned(), Status::Fail)]),
            copy_labels: vec!["xid".into(), "xid".into(), "9lives".into()],
            node_dimensions: vec![String::new()],
            alarm_status: Status::Ok,
            max_alerts: 0,
            max_body_bytes: 10,
            ..config()
        };
        let fields: Vec<String> = bad.validate("inbound").into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "inbound.copy_labels[1]",
                "inbound.copy_labels[2]",
                "inbound.node_dimensions[0]",
                "inbound.node_labels",
                "inbound.subject_label",
                "inbound.severity_label",
                "inbound.severity_map.Critical",
                "inbound.alarm_status",
                "inbound.max_alerts",
                "inbound.max_body_bytes",
            ]
        );
    }
}
