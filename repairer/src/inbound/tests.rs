#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde_json::{Value, json};

use super::sns::cloudwatch_alarm;
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
    assert_eq!(statuses, [Status::Fail, Status::Ok], "the configured map replaces the defaults");
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
        (
            // 2^64, past a u64 (read as a float, which must not saturate to u64::MAX).
            json!({"version": "4", "alerts": [], "truncatedAlerts": 18446744073709551616.0}),
            "truncatedAlerts: expected a whole number, found a number",
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
    let alert = alert_of(parse_sns(CLOUDWATCH_ALARM_NOTIFICATION.as_bytes(), &config()).unwrap());
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
    assert!(alert.finding.message.starts_with("Threshold Crossed"), "{}", alert.finding.message);

    alarm["NewStateValue"] = json!("INSUFFICIENT_DATA");
    assert_eq!(sns(&notification_with(&alarm)).unwrap(), SnsMessage::Alarm(None));
    let placed = cloudwatch_alarm(alarm.to_string().as_bytes(), "", &config()).unwrap();
    assert_eq!(placed, Err(("GpuXidErrors-i-0abc".into(), SkipReason::InsufficientData)));

    alarm["NewStateValue"] = json!("ALARM");
    alarm["Trigger"]["Dimensions"] = json!([{"name": "AutoScalingGroupName", "value": "asg"}]);
    assert_eq!(sns(&notification_with(&alarm)).unwrap(), SnsMessage::Alarm(None));
    let (_, reason) =
        cloudwatch_alarm(alarm.to_string().as_bytes(), "", &config()).unwrap().unwrap_err();
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
        (notification_with(&bad_dimension), "Message.Trigger.Dimensions[0].value: missing"),
        (notification_with(&bad_trigger), "Message.Trigger: expected an object, found a string"),
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
