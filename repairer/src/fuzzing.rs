//! Fuzz target bodies for the repairer's parsers of outside input: agent reports, the Alertmanager
//! and SNS (CloudWatch) webhooks, and the config file. Each takes arbitrary bytes and asserts what
//! must hold for any input; `fuzz/` runs them under cargo-fuzz and `tests/tests/fuzz_targets.rs`
//! under proptest on the stable toolchain.

use fleetmend_proto::{RecommendedAction, Report, Status, WIRE_VERSION};

use crate::config::RepairerConfig;
use crate::inbound::{
    ALERTMANAGER_CHECK, CLOUDWATCH_CHECK, InboundAlert, InboundConfig, InboundError, SnsMessage,
    parse_alertmanager, parse_sns,
};

/// Longest finding message, subject and label value an inbound alert may carry (the parsers' caps).
const MESSAGE_MAX_CHARS: usize = 300;
const LABEL_VALUE_MAX_CHARS: usize = 128;
const FINDING_NAME_MAX_CHARS: usize = 128;
/// Longest error text a refused request gets back: it names the field, not the whole input.
const ERROR_MAX_CHARS: usize = 1024;

fn chars(text: &str) -> usize {
    text.chars().count()
}

/// `data` as the body of `POST /v1/reports`: a report that parses serialises and parses back
/// equal, and one the repairer's own checks accept has a valid node name, the wire version this
/// repairer speaks, a bounded number of findings and no nameless finding.
pub fn check_report(data: &[u8]) {
    let Ok(report) = serde_json::from_slice::<Report>(data) else { return };
    let json = match serde_json::to_vec(&report) {
        Ok(json) => json,
        Err(err) => panic!("a parsed report does not serialise: {err}"),
    };
    match serde_json::from_slice::<Report>(&json) {
        Ok(again) => assert_eq!(again, report, "the report changed on its way through JSON"),
        Err(err) => panic!("a serialised report does not parse back: {err}"),
    }
    if crate::api::check_report(&report).is_ok() {
        assert_eq!(report.wire_version, WIRE_VERSION);
        assert!(crate::identity::is_node_name(&report.node), "{:?}", report.node);
        assert!(report.findings.len() <= 10_000);
        assert!(report.findings.iter().all(|f| !f.check.is_empty() && !f.finding.is_empty()));
    }
}

/// `data` as an Alertmanager webhook body, parsed with the default `[inbound]` config.
pub fn check_alertmanager(data: &[u8]) {
    check_alertmanager_with(data, &InboundConfig::default());
}

/// Every alert placed or skipped, never more than `max_alerts`; each placed alert passes
/// [`check_inbound_alert`]; a refusal's text is bounded.
fn check_alertmanager_with(data: &[u8], config: &InboundConfig) {
    match parse_alertmanager(data, config) {
        Ok(notification) => {
            let total = notification.alerts.len() + notification.skipped;
            assert!(total <= config.max_alerts, "{total} alerts");
            assert_eq!(notification.skipped, notification.skipped_alerts.len());
            let mut indices = notification.skipped_alerts.iter().map(|s| s.index);
            let mut previous = None;
            for index in indices.by_ref() {
                assert!(index < total && previous.is_none_or(|p| p < index), "index {index}");
                previous = Some(index);
            }
            for skipped in &notification.skipped_alerts {
                assert!(chars(&skipped.alertname) <= LABEL_VALUE_MAX_CHARS);
            }
            for alert in &notification.alerts {
                check_inbound_alert(alert, ALERTMANAGER_CHECK, config);
            }
        }
        Err(err) => check_refusal(&err),
    }
}

/// `data` as an SNS message to the CloudWatch webhook, parsed with the default `[inbound]` config.
pub fn check_sns(data: &[u8]) {
    check_sns_with(data, &InboundConfig::default());
}

fn check_sns_with(data: &[u8], config: &InboundConfig) {
    match parse_sns(data, config) {
        Ok(SnsMessage::Alarm(Some(alert))) => check_inbound_alert(&alert, CLOUDWATCH_CHECK, config),
        Ok(_) => {}
        Err(err) => check_refusal(&err),
    }
}

fn check_refusal(err: &InboundError) {
    let text = err.to_string();
    assert!(
        chars(&text) <= ERROR_MAX_CHARS,
        "a refusal of {} characters: {text:.200}",
        chars(&text)
    );
    assert!(!err.kind().is_empty());
}

/// What an alert from outside may become: a finding of `check` on a node whose name has no
/// spaces or control characters, a snake_case finding name, action `none` (the repairer's rules
/// decide), `ok` when resolved, and every text within its cap.
pub fn check_inbound_alert(alert: &InboundAlert, check: &str, config: &InboundConfig) {
    let node = &alert.node;
    assert!(
        !node.is_empty()
            && node.len() <= 253
            && !node.chars().any(|c| c.is_whitespace() || c.is_control()),
        "node {node:?}"
    );
    let finding = &alert.finding;
    assert_eq!(finding.check, check);
    let name = &finding.finding;
    assert!(
        !name.is_empty()
            && chars(name) <= FINDING_NAME_MAX_CHARS
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !name.starts_with('_')
            && !name.ends_with('_')
            && !name.contains("__"),
        "finding name {name:?}"
    );
    assert_eq!(finding.action, RecommendedAction::None);
    if !alert.firing {
        assert_eq!(finding.status, Status::Ok);
    }
    assert!(chars(&finding.message) <= MESSAGE_MAX_CHARS, "message {:?}", finding.message);
    assert!(chars(&finding.subject) <= LABEL_VALUE_MAX_CHARS, "subject {:?}", finding.subject);
    for (key, value) in &finding.labels {
        let known = config.copy_labels.contains(key)
            || (check == CLOUDWATCH_CHECK
                && ["alarm_name", "metric", "namespace"].contains(&&**key));
        assert!(known, "label {key:?} is neither copied nor the alarm's own");
        assert!(chars(value) <= LABEL_VALUE_MAX_CHARS, "label {key}={value:?}");
    }
    assert!(finding.value.is_none());
}

/// Alert bodies a valid `[inbound]` config is run on (see [`check_repairer_config`]).
const SAMPLE_ALERTMANAGER: &str = r#"{"version":"4","receiver":"fleetmend","status":"firing","alerts":[
{"status":"firing","labels":{"alertname":"GpuXidError","node":"gpu-7","instance":"gpu-7:9400","severity":"critical","gpu":"3","xid":"79"},"annotations":{"summary":"Xid 79 on GPU 3"}},
{"status":"resolved","labels":{"alertname":"NodeDown","instance":"gpu-8:9100","severity":"page"}}]}"#;
const SAMPLE_CLOUDWATCH: &str = r#"{"AlarmName":"GpuHot","NewStateValue":"ALARM","NewStateReason":"Threshold crossed","Trigger":{"MetricName":"gpu_temp","Namespace":"fleet","Dimensions":[{"name":"node","value":"gpu-7"},{"name":"InstanceId","value":"i-0abc"},{"name":"gpu","value":"3"}]}}"#;

/// `data` as the repairer's TOML config: parsing and validating never panic, every problem names
/// its field, and a config that validates runs its `[inbound]` section on sample alert bodies.
pub fn check_repairer_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = RepairerConfig::parse(text) else { return };
    let problems = config.problems();
    for (field, message) in &problems {
        assert!(!field.is_empty() && !message.is_empty(), "{field:?}: {message:?}");
    }
    if problems.is_empty() {
        check_alertmanager_with(SAMPLE_ALERTMANAGER.as_bytes(), &config.inbound);
        check_sns_with(SAMPLE_CLOUDWATCH.as_bytes(), &config.inbound);
    }
}
