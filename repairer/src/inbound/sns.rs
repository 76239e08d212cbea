//! SNS messages to the repairer's HTTP(S) subscription: CloudWatch alarms to findings, and the
//! subscription confirmations.

use std::collections::BTreeMap;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde_json::{Map, Value};

use super::json::{as_object, expected, invalid, join, optional_str, required, required_str};
use super::{
    CLOUDWATCH_CHECK, InboundAlert, InboundConfig, InboundError, LABEL_VALUE_MAX_CHARS,
    MESSAGE_MAX_CHARS, Placed, SkipReason, check_size, find_node, snake_case, truncate,
};

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

pub(super) fn cloudwatch_alarm(
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
