//! SNS messages to the repairer's HTTP(S) subscription: CloudWatch alarms to findings, and the
//! subscription confirmations.

use std::collections::BTreeMap;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny};

use super::json::{invalid, join, json_type, null_as_default, read};
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
    let kind: Kind = read(body, "")?;
    let Some(kind) = kind.kind else {
        if kind.alarm_name.is_some() {
            return cloudwatch_alarm(body, "", config).map(alarm_message);
        }
        return Err(invalid("Type", "missing"));
    };
    match kind.as_str() {
        "Notification" => {
            let Notification { message } = read(body, "")?;
            cloudwatch_alarm(message.0.as_bytes(), "Message", config).map(alarm_message)
        }
        "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
            let Confirmation { topic_arn, subscribe_url, token, message_id } = read(body, "")?;
            Ok(if kind == "SubscriptionConfirmation" {
                SnsMessage::SubscriptionConfirmation { topic_arn, subscribe_url, token, message_id }
            } else {
                SnsMessage::UnsubscribeConfirmation { topic_arn, subscribe_url, token, message_id }
            })
        }
        other => Err(InboundError::UnsupportedSnsType { found: truncate(other, 64) }),
    }
}

/// What a body is: an SNS message of a `Type`, or (raw message delivery) a CloudWatch alarm.
#[derive(Deserialize)]
struct Kind {
    #[serde(rename = "Type", default)]
    kind: Option<String>,
    #[serde(rename = "AlarmName", default)]
    alarm_name: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Notification {
    #[serde(rename = "Message")]
    message: AlarmText,
}

/// A notification's `Message`: the CloudWatch alarm as a JSON string.
struct AlarmText(String);

impl<'de> Deserialize<'de> for AlarmText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(text) => Ok(AlarmText(text)),
            other => Err(de::Error::custom(format!(
                "expected a string holding the CloudWatch alarm as JSON, found {}",
                json_type(&other)
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Confirmation {
    topic_arn: String,
    #[serde(rename = "SubscribeURL")]
    subscribe_url: String,
    token: String,
    message_id: String,
}

/// A CloudWatch alarm state change, the fields fleetmend reads.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Alarm {
    alarm_name: String,
    #[serde(rename = "NewStateValue")]
    state: AlarmState,
    #[serde(default, deserialize_with = "null_as_default")]
    alarm_description: String,
    #[serde(default, deserialize_with = "null_as_default")]
    new_state_reason: String,
    #[serde(default)]
    trigger: Option<Trigger>,
}

#[derive(Clone, Copy)]
enum AlarmState {
    Alarm,
    Ok,
    InsufficientData,
}

impl<'de> Deserialize<'de> for AlarmState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let state = String::deserialize(deserializer)?;
        match state.as_str() {
            "ALARM" => Ok(AlarmState::Alarm),
            "OK" => Ok(AlarmState::Ok),
            "INSUFFICIENT_DATA" => Ok(AlarmState::InsufficientData),
            other => Err(de::Error::custom(format!(
                "{:?} is not ALARM, OK or INSUFFICIENT_DATA",
                truncate(other, 32)
            ))),
        }
    }
}

/// The alarm's trigger: `Dimensions` for a single-metric alarm, `Metrics` for metric math.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Trigger {
    #[serde(default)]
    metric_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    dimensions: Option<Vec<Dimension>>,
    #[serde(default)]
    metrics: Option<Vec<MetricQuery>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct MetricQuery {
    #[serde(default)]
    metric_stat: Option<MetricStat>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct MetricStat {
    #[serde(default)]
    metric: Option<Metric>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Metric {
    #[serde(default)]
    dimensions: Option<Vec<Dimension>>,
}

/// SNS writes `name`/`value`; the CloudWatch API writes `Name`/`Value`.
#[derive(Deserialize)]
struct Dimension {
    #[serde(alias = "Name")]
    name: String,
    #[serde(alias = "Value")]
    value: String,
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
fn alarm_dimensions(trigger: &Trigger) -> BTreeMap<&str, &str> {
    let metrics = trigger.metrics.iter().flatten();
    let of_metrics = metrics.filter_map(|query| query.metric_stat.as_ref()?.metric.as_ref());
    let lists = trigger.dimensions.iter().chain(of_metrics.filter_map(|m| m.dimensions.as_ref()));
    let mut dimensions = BTreeMap::new();
    for dimension in lists.flatten() {
        dimensions.entry(dimension.name.as_str()).or_insert(dimension.value.as_str());
    }
    dimensions
}

/// Reads the CloudWatch alarm in `text` (found at `at`) and places it on a node.
pub(super) fn cloudwatch_alarm(
    text: &[u8],
    at: &str,
    config: &InboundConfig,
) -> Result<Placed, InboundError> {
    let alarm: Alarm = read(text, at).map_err(|err| match err {
        InboundError::NotJson(err) if !at.is_empty() => invalid(
            at,
            format!("not JSON ({err}); only CloudWatch alarm notifications are understood"),
        ),
        other => other,
    })?;
    let alarm_name = alarm.alarm_name.as_str();
    let finding_name = snake_case(alarm_name);
    if finding_name.is_empty() {
        return Err(invalid(&join(at, "AlarmName"), "has no letters or digits"));
    }
    let shown_name = truncate(alarm_name, LABEL_VALUE_MAX_CHARS);
    let (firing, status, state) = match alarm.state {
        AlarmState::Alarm => (true, config.alarm_status, "ALARM"),
        AlarmState::Ok => (false, Status::Ok, "OK"),
        AlarmState::InsufficientData => {
            return Ok(Err((shown_name, SkipReason::InsufficientData)));
        }
    };
    let (dimensions, metric, namespace) = match &alarm.trigger {
        None => (BTreeMap::new(), None, None),
        Some(trigger) => (
            alarm_dimensions(trigger),
            trigger.metric_name.as_deref(),
            trigger.namespace.as_deref(),
        ),
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
    let description = alarm.alarm_description.trim();
    let reason = alarm.new_state_reason.trim();
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
