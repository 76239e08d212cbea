//! The `cloudwatch` sink: what an HTTP(S) subscriber of an SNS topic receives when a CloudWatch
//! alarm changes state, so tools built for CloudWatch alarms (chat bots, Lambda-style handlers,
//! ticketing bridges) take fleetmend's alarms unchanged.
//!
//! The body is the SNS notification envelope (`Type` `Notification`, `MessageId`, `TopicArn`,
//! `Subject`, `Message`, `Timestamp`, `SignatureVersion`, `Signature`, `SigningCertURL`,
//! `UnsubscribeURL`) sent as `text/plain` with the `x-amz-sns-*` headers; its `Message` is the
//! CloudWatch alarm as a JSON string (`AlarmName`, `AlarmDescription`, `AWSAccountId`,
//! `NewStateValue`, `NewStateReason`, `StateChangeTime`, `Region`, `AlarmArn`, `OldStateValue`,
//! `Trigger` with `Namespace` `Fleetmend` and `node`/`gpu` dimensions). One alarm per node
//! (`fleetmend-<node>`), one for the breaker (`fleetmend-breaker`).
//!
//! SNS signs with an AWS RSA key that fleetmend does not have: `Signature` and `SigningCertURL`
//! are empty and authenticity is the `X-Fleetmend-Signature` HMAC header. `MessageId` is derived
//! from the sink and event id, so a re-send carries the original message id, as SNS does.

use std::collections::BTreeSet;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::alerts::{Condition, Delivery, iso8601, problem_name, summary};
use crate::model::{Event, EventKind, NodeState};

/// SNS caps subjects at 100 characters.
const SUBJECT_MAX: usize = 100;

/// A parsed SNS topic ARN: `arn:<partition>:sns:<region>:<account>:<topic>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicArn {
    pub text: String,
    pub partition: String,
    pub region: String,
    pub account: String,
    pub topic: String,
}

impl TopicArn {
    pub fn parse(text: &str) -> Result<TopicArn, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let bad = || format!("{text:?} is not an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:TOPIC)");
        let [arn, partition, service, region, account, topic] = parts.as_slice() else {
            return Err(bad());
        };
        let word =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if *arn != "arn"
            || *service != "sns"
            || !word(partition)
            || !word(region)
            || account.len() != 12
            || !account.chars().all(|c| c.is_ascii_digit())
            || topic.is_empty()
            || topic.len() > 256
            || !topic.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(bad());
        }
        Ok(TopicArn {
            text: text.to_owned(),
            partition: (*partition).to_owned(),
            region: (*region).to_owned(),
            account: (*account).to_owned(),
            topic: (*topic).to_owned(),
        })
    }
}

/// The SNS HTTP notification envelope.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Notification<'a> {
    #[serde(rename = "Type")]
    kind: &'static str,
    message_id: &'a str,
    topic_arn: &'a str,
    subject: String,
    message: String,
    timestamp: String,
    signature_version: &'static str,
    signature: &'static str,
    #[serde(rename = "SigningCertURL")]
    signing_cert_url: &'static str,
    #[serde(rename = "UnsubscribeURL")]
    unsubscribe_url: &'static str,
}

/// A CloudWatch alarm state change, as CloudWatch publishes it to SNS.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct AlarmMessage {
    alarm_name: String,
    alarm_description: String,
    #[serde(rename = "AWSAccountId")]
    aws_account_id: String,
    alarm_configuration_updated_timestamp: String,
    new_state_value: &'static str,
    new_state_reason: String,
    state_change_time: String,
    region: String,
    alarm_arn: String,
    old_state_value: &'static str,
    #[serde(rename = "OKActions")]
    ok_actions: Vec<String>,
    alarm_actions: Vec<String>,
    insufficient_data_actions: Vec<String>,
    trigger: Trigger,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Trigger {
    metric_name: String,
    namespace: &'static str,
    statistic_type: &'static str,
    statistic: &'static str,
    unit: Option<String>,
    dimensions: Vec<Dimension>,
    period: u32,
    evaluation_periods: u32,
    datapoints_to_alarm: u32,
    comparison_operator: &'static str,
    threshold: f64,
    treat_missing_data: &'static str,
    evaluate_low_sample_count_percentile: &'static str,
}

/// CloudWatch writes dimensions in lower case (`value`, `name`) inside alarm messages.
#[derive(Debug, Serialize)]
struct Dimension {
    value: String,
    name: &'static str,
}

const ALARM: &str = "ALARM";
const OK: &str = "OK";
const INSUFFICIENT_DATA: &str = "INSUFFICIENT_DATA";

/// Renders events for one `cloudwatch` sink.
#[derive(Debug)]
pub(crate) struct CloudwatchFormat {
    url: String,
    topic: TopicArn,
}

impl CloudwatchFormat {
    /// `topic_arn` was validated with the config; a bad one falls back to the default topic.
    pub(crate) fn new(url: &str, topic_arn: &str) -> CloudwatchFormat {
        let topic = TopicArn::parse(topic_arn)
            .or_else(|_| TopicArn::parse(crate::alerts::DEFAULT_TOPIC_ARN))
            .unwrap_or_else(|_| TopicArn {
                text: crate::alerts::DEFAULT_TOPIC_ARN.to_owned(),
                partition: "aws".to_owned(),
                region: "local".to_owned(),
                account: "000000000000".to_owned(),
                topic: "fleetmend".to_owned(),
            });
        CloudwatchFormat { url: url.to_owned(), topic }
    }

    /// The notification for `event`, or `None` when it changes no alarm: a node's alarm goes
    /// back to OK only when the node is healthy again (a repair that worked, a held action that
    /// was approved, leave the node's alarm as it is until its state says so).
    pub(crate) fn render(
        &self,
        sink: &str,
        event: &Event,
    ) -> Result<Option<Delivery>, serde_json::Error> {
        let topic = &self.topic;
        let condition = Condition::of(event);
        if condition == Condition::Clear
            && event.node.is_some()
            && event.kind != EventKind::StateChanged
        {
            return Ok(None);
        }
        let new_state = match condition {
            Condition::Alarm => ALARM,
            Condition::Clear => OK,
        };
        let old_state = match (event.from_state, event.kind) {
            (Some(NodeState::Healthy | NodeState::Retired), _) => OK,
            (Some(_), _) => ALARM,
            // The breaker has two states: a change leaves the other one.
            (None, EventKind::Breaker) if condition == Condition::Alarm => OK,
            (None, EventKind::Breaker) => ALARM,
            (None, _) => INSUFFICIENT_DATA,
        };
        let alarm_name = alarm_name(event);
        let time = iso8601(event.at_ms);
        // CloudWatch writes alarm times as `2019-06-26T03:54:21.746+0000`.
        let alarm_time = time.trim_end_matches('Z').to_owned() + "+0000";
        let mut reason = event.reason.clone();
        if let (Some(from), Some(to)) = (event.from_state, event.to_state) {
            reason.push_str(&format!(" (node state {from} -> {to})"));
        }
        let message = AlarmMessage {
            alarm_description: match &event.node {
                Some(node) => format!("fleetmend: health of node {node}. {}", summary(event)),
                None => format!("fleetmend: {}", summary(event)),
            },
            aws_account_id: topic.account.clone(),
            alarm_configuration_updated_timestamp: alarm_time.clone(),
            new_state_value: new_state,
            new_state_reason: reason,
            state_change_time: alarm_time,
            region: topic.region.clone(),
            alarm_arn: format!(
                "arn:{}:cloudwatch:{}:{}:alarm:{alarm_name}",
                topic.partition, topic.region, topic.account
            ),
            old_state_value: old_state,
            ok_actions: vec![topic.text.clone()],
            alarm_actions: vec![topic.text.clone()],
            insufficient_data_actions: Vec::new(),
            trigger: trigger(event),
            alarm_name,
        };
        let message_id = message_id(sink, event.id);
        let subject: String =
            format!("{new_state}: \"{}\" in {}", message.alarm_name, topic.region)
                .chars()
                .take(SUBJECT_MAX)
                .collect();
        let notification = Notification {
            kind: "Notification",
            message_id: &message_id,
            topic_arn: &topic.text,
            subject,
            message: serde_json::to_string(&message)?,
            timestamp: time,
            signature_version: "1",
            signature: "",
            signing_cert_url: "",
            unsubscribe_url: "",
        };
        let body = serde_json::to_vec(&notification)?;
        Ok(Some(Delivery {
            url: self.url.clone(),
            content_type: "text/plain; charset=UTF-8",
            headers: vec![
                ("x-amz-sns-message-type", "Notification".to_owned()),
                ("x-amz-sns-message-id", message_id.clone()),
                ("x-amz-sns-topic-arn", topic.text.clone()),
                (
                    "x-amz-sns-subscription-arn",
                    format!("{}:{}", topic.text, uuid_of(sink.as_bytes())),
                ),
            ],
            body,
        }))
    }
}

/// The alarm's trigger: a metric per event kind, with the node and the GPUs as its dimensions.
fn trigger(event: &Event) -> Trigger {
    let mut dimensions = Vec::new();
    if let Some(node) = &event.node {
        dimensions.push(Dimension { value: node.clone(), name: "node" });
    }
    let gpus = gpus(event);
    if !gpus.is_empty() {
        dimensions
            .push(Dimension { value: gpus.into_iter().collect::<Vec<_>>().join(","), name: "gpu" });
    }
    Trigger {
        metric_name: problem_name(event.kind),
        namespace: "Fleetmend",
        statistic_type: "Statistic",
        statistic: "MAXIMUM",
        unit: None,
        dimensions,
        period: 60,
        evaluation_periods: 1,
        datapoints_to_alarm: 1,
        comparison_operator: "GreaterThanOrEqualToThreshold",
        threshold: 1.0,
        treat_missing_data: "missing",
        evaluate_low_sample_count_percentile: "",
    }
}

/// One alarm per node (its health: state changes, failed repairs and held actions raise it, the
/// node healthy again clears it); the breaker and other fleet-wide events have their own.
fn alarm_name(event: &Event) -> String {
    match (&event.node, event.kind) {
        (Some(node), _) => format!("fleetmend-{node}"),
        (None, EventKind::Breaker) => "fleetmend-breaker".to_owned(),
        (None, _) => "fleetmend-fleet".to_owned(),
    }
}

/// The GPUs the event's findings name: the subject of a `gpu` check's finding, or a `gpu` label.
fn gpus(event: &Event) -> BTreeSet<String> {
    let mut gpus = BTreeSet::new();
    for finding in &event.findings {
        if finding.check == "gpu" && !finding.subject.is_empty() {
            gpus.insert(finding.subject.clone());
        }
        if let Some(gpu) = finding.labels.get("gpu").filter(|gpu| !gpu.is_empty()) {
            gpus.insert(gpu.clone());
        }
    }
    gpus
}

/// The SNS message id of `event_id` at `sink`: stable across re-sends.
fn message_id(sink: &str, event_id: i64) -> String {
    uuid_of(format!("{sink}\0{event_id}").as_bytes())
}

/// A name-based UUID (version 8, RFC 9562) from SHA-256 of `name`.
fn uuid_of(name: &[u8]) -> String {
    let digest = Sha256::digest(name);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Actor, Severity};
    use fleetmend_proto::{Finding, RecommendedAction, Status};

    #[test]
    fn topic_arns() {
        let arn = TopicArn::parse("arn:aws-cn:sns:cn-north-1:123456789012:fleet.fifo").unwrap();
        assert_eq!((arn.partition.as_str(), arn.region.as_str()), ("aws-cn", "cn-north-1"));
        assert_eq!(arn.account, "123456789012");
        for bad in [
            "",
            "arn:aws:sqs:r:123456789012:t",
            "arn:aws:sns:r:12:t",
            "arn:aws:sns:r:123456789012:",
            "x:aws:sns:r:123456789012:t",
        ] {
            assert!(TopicArn::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn message_ids_are_stable_uuids() {
        let id = message_id("aws", 7);
        assert_eq!(id, message_id("aws", 7));
        assert_ne!(id, message_id("aws", 8));
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "8", "version nibble");
    }

    #[test]
    fn a_breaker_alarm_has_no_node_dimension() {
        let format = CloudwatchFormat::new("http://h", crate::alerts::DEFAULT_TOPIC_ARN);
        let event = Event::new(
            EventKind::Breaker,
            Severity::Critical,
            None,
            Actor::repairer(),
            "12 nodes failed in 5m",
            1_000,
        );
        let delivery = format.render("aws", &event).unwrap().unwrap();
        let envelope: serde_json::Value = serde_json::from_slice(&delivery.body).unwrap();
        let alarm: serde_json::Value =
            serde_json::from_str(envelope["Message"].as_str().unwrap()).unwrap();
        assert_eq!(alarm["AlarmName"], "fleetmend-breaker");
        assert_eq!(alarm["NewStateValue"], "ALARM");
        assert_eq!(alarm["OldStateValue"], "OK");
        assert_eq!(alarm["Trigger"]["Dimensions"], serde_json::json!([]));
        assert_eq!(alarm["Trigger"]["MetricName"], "BreakerOpen");
    }

    #[test]
    fn only_the_node_state_clears_a_node_alarm() {
        let format = CloudwatchFormat::new("http://h", crate::alerts::DEFAULT_TOPIC_ARN);
        let repaired = Event::new(
            EventKind::RepairFinished,
            Severity::Info,
            Some("n1"),
            Actor::repairer(),
            "drained until its findings clear",
            1,
        );
        assert!(format.render("aws", &repaired).unwrap().is_none());
        let quarantined = Event { severity: Severity::Critical, ..repaired };
        let delivery = format.render("aws", &quarantined).unwrap().unwrap();
        let envelope: serde_json::Value = serde_json::from_slice(&delivery.body).unwrap();
        assert_eq!(envelope["Subject"], "ALARM: \"fleetmend-n1\" in local");
    }

    #[test]
    fn gpus_come_from_gpu_findings_and_labels() {
        let mut event = Event::new(
            EventKind::StateChanged,
            Severity::Warning,
            Some("n1"),
            Actor::repairer(),
            "x",
            1,
        );
        let gpu = Finding::new(
            "gpu",
            "ecc_uncorrected",
            "3",
            Status::Fail,
            RecommendedAction::Reboot,
            "",
        );
        let mut xid = Finding::new(
            "kernel_log",
            "xid",
            "0000:3b:00.0",
            Status::Fail,
            RecommendedAction::Reboot,
            "",
        );
        xid.labels.insert("gpu".to_owned(), "1".to_owned());
        let nic =
            Finding::new("nic", "nic_down", "ib0", Status::Fail, RecommendedAction::Drain, "");
        event.findings = vec![gpu, xid, nic];
        assert_eq!(gpus(&event).into_iter().collect::<Vec<_>>(), vec!["1", "3"]);
    }
}
