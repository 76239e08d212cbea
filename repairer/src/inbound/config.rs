//! `[inbound]`: the configuration of the inbound alert webhooks, and its validation.

use std::collections::BTreeMap;

use fleetmend_proto::Status;
use serde::Deserialize;

use super::COPY_LABELS_MAX;

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
