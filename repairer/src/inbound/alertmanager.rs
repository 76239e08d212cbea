//! Alertmanager webhook notifications (payload version 4) to findings.

use std::collections::BTreeMap;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::json::{null_as_default, read, whole_number};
use super::{
    ALERTMANAGER_CHECK, ALERTMANAGER_WEBHOOK_VERSION, InboundAlert, InboundConfig, InboundError,
    LABEL_VALUE_MAX_CHARS, MESSAGE_MAX_CHARS, Placed, SkipReason, SkippedAlert, check_size,
    find_node, snake_case, truncate,
};

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

/// The fields of a notification read before the rest: a version this repairer does not read is
/// refused as such, whatever its other fields hold.
#[derive(Deserialize)]
struct Versioned {
    version: String,
}

/// Alertmanager's webhook payload (version 4), the fields fleetmend reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Payload {
    #[serde(default, deserialize_with = "null_as_default")]
    receiver: String,
    #[serde(default, deserialize_with = "null_as_default")]
    group_key: String,
    #[serde(default, deserialize_with = "whole_number")]
    truncated_alerts: u64,
    alerts: Vec<Alert>,
}

#[derive(Deserialize)]
struct Alert {
    labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_as_default")]
    annotations: BTreeMap<String, String>,
    status: AlertStatus,
}

/// An alert's own `status`: a group can hold firing and resolved alerts.
struct AlertStatus {
    firing: bool,
}

impl<'de> Deserialize<'de> for AlertStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let status = String::deserialize(deserializer)?;
        match status.as_str() {
            "firing" => Ok(AlertStatus { firing: true }),
            "resolved" => Ok(AlertStatus { firing: false }),
            other => Err(de::Error::custom(format!(
                "{:?} is neither \"firing\" nor \"resolved\"",
                truncate(other, 32)
            ))),
        }
    }
}

/// Parses an Alertmanager webhook notification (payload version 4): one finding per alert that
/// names a node, `firing` from each alert's own `status` (a group can hold both).
pub fn parse_alertmanager(
    body: &[u8],
    config: &InboundConfig,
) -> Result<AlertmanagerNotification, InboundError> {
    check_size(body, config)?;
    let Versioned { version } = read(body, "")?;
    if version != ALERTMANAGER_WEBHOOK_VERSION {
        return Err(InboundError::UnsupportedVersion { found: truncate(&version, 32) });
    }
    let payload: Payload = read(body, "")?;
    if payload.alerts.len() > config.max_alerts {
        let count = payload.alerts.len();
        return Err(InboundError::TooManyAlerts { count, limit: config.max_alerts });
    }
    let mut notification = AlertmanagerNotification {
        receiver: payload.receiver,
        group_key: payload.group_key,
        truncated_alerts: payload.truncated_alerts,
        alerts: Vec::with_capacity(payload.alerts.len()),
        skipped: 0,
        skipped_alerts: Vec::new(),
    };
    for (index, alert) in payload.alerts.iter().enumerate() {
        match alertmanager_alert(alert, config) {
            Ok(alert) => notification.alerts.push(alert),
            Err((alertname, reason)) => {
                notification.skipped_alerts.push(SkippedAlert { index, alertname, reason });
            }
        }
    }
    notification.skipped = notification.skipped_alerts.len();
    Ok(notification)
}

fn alertmanager_alert(alert: &Alert, config: &InboundConfig) -> Placed {
    let labels: BTreeMap<&str, &str> =
        alert.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let annotations = &alert.annotations;
    let firing = alert.status.firing;
    let alertname = labels.get("alertname").copied().unwrap_or_default();
    let finding_name = snake_case(alertname);
    let shown_name = truncate(alertname, LABEL_VALUE_MAX_CHARS);
    if finding_name.is_empty() {
        return Err((shown_name, SkipReason::NoAlertName));
    }
    let node = match find_node(&config.node_labels, |name| labels.get(name).copied()) {
        Ok(node) => node,
        Err(reason) => return Err((shown_name, reason)),
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
    Ok(InboundAlert { node, finding, firing })
}
