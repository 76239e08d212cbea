//! Alertmanager webhook notifications (payload version 4) to findings.

use std::collections::BTreeMap;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde_json::Value;

use super::json::{
    as_object, expected, invalid, join, optional_str, required, required_str, string_map,
};
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
            // `3.0` is a whole number too (JSON Schema's integer), up to 2^53, past which an f64
            // no longer holds every whole number (and 2^64 and beyond would saturate as u64).
            const EXACT: f64 = (1u64 << f64::MANTISSA_DIGITS) as f64;
            let whole = value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < EXACT);
            value
                .as_u64()
                .or(whole.map(|f| f as u64))
                .ok_or_else(|| expected("truncatedAlerts", "a whole number", value))?
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
