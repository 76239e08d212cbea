use super::*;
use crate::model::Actor;

fn parse(text: &str) -> AlertsConfig {
    toml::from_str(text).unwrap()
}

fn problems(config: &AlertsConfig) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    config.validate("alerts", &mut problems);
    problems
}

fn fields(config: &AlertsConfig) -> Vec<String> {
    problems(config).into_iter().map(|(field, _)| field).collect()
}

#[test]
fn a_full_config_parses_with_its_defaults() {
    let config = parse(
        r#"
        [[sinks]]
        name = "pager"
        kind = "alertmanager"
        url = "http://127.0.0.1:9093"
        labels = { cluster = "a" }

        [[sinks]]
        name = "aws"
        kind = "cloudwatch"
        url = "https://example.com/sns"
        secret = "s"
        min_severity = "critical"
        kinds = ["state-changed", "breaker"]
        timeout = "3s"
        retry_initial = "100ms"
        retry_max = "1m"
        from_start = true
        topic_arn = "arn:aws:sns:eu-west-1:123456789012:fleet"
        "#,
    );
    assert!(problems(&config).is_empty(), "{:?}", problems(&config));
    assert_eq!(config.poll_interval, Duration::from_secs(5));
    let pager = &config.sinks[0];
    assert_eq!(pager.min_severity, Severity::Warning);
    assert_eq!(pager.kinds, DEFAULT_KINDS.to_vec());
    assert!(!pager.from_start);
    assert_eq!(pager.sink_kind(), Some(SinkKind::Alertmanager));
    let aws = &config.sinks[1];
    assert_eq!(aws.kinds, vec![EventKind::StateChanged, EventKind::Breaker]);
    assert_eq!(aws.retry_initial, Duration::from_millis(100));
    assert!(!format!("{aws:?}").contains("\"s\""), "the secret is not printed");
}

#[test]
fn unknown_fields_are_refused() {
    assert!(toml::from_str::<AlertsConfig>("[[sinks]]\nname = \"a\"\nsecrets = \"x\"").is_err());
}

#[test]
fn validate_names_every_bad_field() {
    let config = parse(
        r#"
        poll_interval = "0s"
        batch = 0
        [[sinks]]
        name = "a b"
        kind = "pagerduty"
        url = "ftp://example.com"
        secret = "x"
        secret_file = "/etc/x"
        kinds = []
        timeout = "0s"
        retry_initial = "10s"
        retry_max = "1s"
        topic_arn = "arn:aws:sns:x:1:y"
        [[sinks]]
        kind = "webhook"
        url = "not a url"
        topic_arn = "arn:aws:sns:local:000000000000:fleetmend"
        labels = { cluster = "a" }
        firing_ttl = "1h"
        [[sinks]]
        name = "dup"
        kind = "alertmanager"
        url = "http://h"
        labels = { "bad-name" = "x", severity = "page" }
        firing_ttl = "0s"
        [[sinks]]
        name = "dup"
        kind = "webhook"
        url = "http://h"
        "#,
    );
    let fields = fields(&config);
    for expected in [
        "alerts.poll_interval",
        "alerts.batch",
        "alerts.sinks[0].name",
        "alerts.sinks[0].kind",
        "alerts.sinks[0].url",
        "alerts.sinks[0].secret_file",
        "alerts.sinks[0].kinds",
        "alerts.sinks[0].timeout",
        "alerts.sinks[0].retry_max",
        "alerts.sinks[0].topic_arn",
        "alerts.sinks[1].name",
        "alerts.sinks[1].url",
        "alerts.sinks[1].topic_arn",
        "alerts.sinks[1].labels",
        "alerts.sinks[1].firing_ttl",
        "alerts.sinks[2].labels.bad-name",
        "alerts.sinks[2].labels.severity",
        "alerts.sinks[2].firing_ttl",
        "alerts.sinks[3].name",
    ] {
        assert!(fields.iter().any(|field| field == expected), "{expected} missing from {fields:?}");
    }
    let kind = problems(&config).into_iter().find(|(field, _)| field == "alerts.sinks[0].kind");
    assert!(kind.unwrap().1.contains("pagerduty"));
}

#[test]
fn alerts_new_refuses_an_invalid_config() {
    let store = Arc::new(Store::in_memory().unwrap());
    let config = parse("[[sinks]]\nname = \"x\"\nkind = \"nope\"\nurl = \"http://h\"");
    let err = Alerts::new(config, store).unwrap_err();
    assert!(err.to_string().contains("alerts.sinks[0].kind"), "{err}");
}

#[test]
fn conditions() {
    let mut event = Event::new(
        EventKind::StateChanged,
        Severity::Warning,
        Some("n1"),
        Actor::repairer(),
        "x",
        1,
    );
    event.to_state = Some(NodeState::Draining);
    assert_eq!(Condition::of(&event), Condition::Alarm);
    event.to_state = Some(NodeState::Healthy);
    assert_eq!(Condition::of(&event), Condition::Clear);
    let breaker =
        Event::new(EventKind::Breaker, Severity::Critical, None, Actor::repairer(), "open", 1);
    assert_eq!(Condition::of(&breaker), Condition::Alarm);
    let closed = Event { severity: Severity::Info, ..breaker };
    assert_eq!(Condition::of(&closed), Condition::Clear);
}

#[test]
fn a_clearing_event_passes_the_severity_filter() {
    let store = Arc::new(Store::in_memory().unwrap());
    let config = parse("[[sinks]]\nname = \"x\"\nkind = \"webhook\"\nurl = \"http://h\"");
    let alerts = Alerts::new(config, store).unwrap();
    let sink = &alerts.sinks[0];
    let mut event =
        Event::new(EventKind::StateChanged, Severity::Info, Some("n1"), Actor::repairer(), "x", 1);
    event.to_state = Some(NodeState::Suspect);
    assert!(!sink.wants(&event), "info alarm below min_severity");
    event.to_state = Some(NodeState::Healthy);
    assert!(sink.wants(&event), "a clear always goes");
    let decision = Event { kind: EventKind::Decision, severity: Severity::Critical, ..event };
    assert!(!sink.wants(&decision), "kind not configured");
}

#[test]
fn backoff_doubles_and_caps_with_jitter() {
    let initial = Duration::from_millis(100);
    let max = Duration::from_secs(1);
    for _ in 0..50 {
        let first = backoff(initial, max, 0);
        assert!(first >= initial / 2 && first <= initial);
        let third = backoff(initial, max, 2);
        assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
        let late = backoff(initial, max, 40);
        assert!(late >= max / 2 && late <= max);
    }
}

#[test]
fn iso8601_is_utc_with_milliseconds() {
    assert_eq!(iso8601(1_561_521_261_746), "2019-06-26T03:54:21.746Z");
}
