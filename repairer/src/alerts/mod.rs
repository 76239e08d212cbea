//! Alerts out: every event worth a page goes to the configured sinks (CloudWatch-style SNS
//! notifications, Alertmanager, signed webhooks), each exactly once and in order, through a
//! durable outbox that survives a repairer killed at any point.
//!
//! The outbox is the audit event log ([`outbox`]): a sink keeps a cursor in the store and a
//! delivery loop per sink reads the events after it, skips those its filter rejects and delivers
//! the rest one at a time, moving the cursor after each success. A sink that is down gets the same
//! event again with capped exponential backoff and jitter, forever; when it comes back everything
//! it missed arrives, in order. Each delivery carries `X-Fleetmend-Idempotency-Key:
//! <sink>-<event id>` (the same on a re-send) and, when the sink has a secret,
//! `X-Fleetmend-Signature: sha256=<hex HMAC-SHA256 of the body>` ([`sign`]).

pub mod alertmanager;
pub mod cloudwatch;
pub mod outbox;
pub mod sign;
pub mod webhook;

mod config;
mod delivery;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use tokio::sync::Notify;

pub use self::config::{
    AlertsConfig, DEFAULT_FIRING_TTL, DEFAULT_KINDS, DEFAULT_TOPIC_ARN, Secret, SinkConfig,
    SinkKind,
};
pub use self::delivery::backoff;
use crate::clock::{SharedClock, SystemClock};
use crate::model::{Event, EventKind, NodeState, Severity};
use crate::store::{Store, StoreError};

/// Whether an event raises an alarm or clears one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Something needs attention: the node left healthy, a repair failed, the breaker opened, an
    /// action is held.
    Alarm,
    /// What was raised is over: the node is healthy again (or retired), the breaker closed, a held
    /// action was approved.
    Clear,
}

impl Condition {
    /// The condition an event signals. For events that carry no target state, the event's
    /// severity decides: `info` clears (a closed breaker, a repair that finished well), above
    /// raises (breaker opened, repair escalated or quarantined, action held).
    pub fn of(event: &Event) -> Condition {
        let by_severity =
            if event.severity == Severity::Info { Condition::Clear } else { Condition::Alarm };
        match event.kind {
            EventKind::StateChanged | EventKind::RepairFinished => match event.to_state {
                Some(NodeState::Healthy | NodeState::Retired) => Condition::Clear,
                Some(_) => Condition::Alarm,
                None => by_severity,
            },
            EventKind::Approved => Condition::Clear,
            _ => by_severity,
        }
    }
}

/// A rendered delivery: one HTTP POST.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub url: String,
    pub content_type: &'static str,
    /// Headers of the format (the signature and idempotency headers are added when sending).
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// How a sink turns events into requests.
#[derive(Debug)]
enum Format {
    Cloudwatch(cloudwatch::CloudwatchFormat),
    Alertmanager(alertmanager::AlertmanagerFormat),
    Webhook(webhook::WebhookFormat),
}

impl Format {
    /// The request for `event`, or `None` when this format has nothing to say about it.
    fn render(&self, sink: &str, event: &Event) -> Result<Option<Delivery>, serde_json::Error> {
        match self {
            Format::Cloudwatch(format) => format.render(sink, event),
            Format::Alertmanager(format) => format.render(event),
            Format::Webhook(format) => format.render(event).map(Some),
        }
    }
}

/// Setting up the alert sinks failed.
#[derive(Debug, thiserror::Error)]
pub enum AlertsError {
    #[error("alerts config has {} problem(s): {}", problems.len(), list(problems))]
    Invalid { problems: Vec<(String, String)> },
    #[error("alert sink {sink}: reading the secret file {path}: {source}")]
    ReadSecret { sink: String, path: PathBuf, source: std::io::Error },
    #[error("alert sink {sink}: the secret file {path} is empty")]
    EmptySecret { sink: String, path: PathBuf },
    #[error("alert sink {sink}: building the HTTP client: {source}")]
    Client { sink: String, source: reqwest::Error },
    #[error("alert sink {sink}: opening its cursor: {source}")]
    Cursor { sink: String, source: StoreError },
}

fn list(problems: &[(String, String)]) -> String {
    let lines: Vec<String> =
        problems.iter().map(|(field, message)| format!("{field}: {message}")).collect();
    lines.join("; ")
}

/// One sink at run time.
#[derive(Debug)]
struct Sink {
    name: String,
    format: Format,
    secret: Option<Secret>,
    min_severity: Severity,
    kinds: BTreeSet<EventKind>,
    retry_initial: Duration,
    retry_max: Duration,
    client: reqwest::Client,
    wake: Notify,
    cursor: AtomicI64,
    sent_ok: AtomicU64,
    sent_error: AtomicU64,
}

impl Sink {
    /// Whether this sink sends `event`.
    fn wants(&self, event: &Event) -> bool {
        self.kinds.contains(&event.kind)
            && (event.severity >= self.min_severity || Condition::of(event) == Condition::Clear)
    }
}
/// The alert sinks and their delivery loops.
#[derive(Debug)]
pub struct Alerts {
    store: Arc<Store>,
    /// What the delivery loops wait on.
    clock: SharedClock,
    sinks: Vec<Arc<Sink>>,
    poll_interval: Duration,
    batch: usize,
}

impl Alerts {
    /// Validates `config`, reads the secret files and opens each sink's cursor in `store` (a new
    /// sink's cursor is saved at once, so events appended before [`Alerts::run`] starts are sent).
    pub fn new(config: AlertsConfig, store: Arc<Store>) -> Result<Alerts, AlertsError> {
        let mut problems = Vec::new();
        config.validate("alerts", &mut problems);
        if !problems.is_empty() {
            return Err(AlertsError::Invalid { problems });
        }
        let mut sinks = Vec::new();
        for sink in config.sinks {
            let name = sink.name.clone();
            let secret = match (&sink.secret, &sink.secret_file) {
                (Some(secret), _) => Some(secret.clone()),
                (None, Some(path)) => {
                    let text = std::fs::read_to_string(path).map_err(|source| {
                        AlertsError::ReadSecret { sink: name.clone(), path: path.clone(), source }
                    })?;
                    let secret = text.trim();
                    if secret.is_empty() {
                        return Err(AlertsError::EmptySecret { sink: name, path: path.clone() });
                    }
                    Some(Secret(secret.to_owned()))
                }
                (None, None) => None,
            };
            let format = match sink.sink_kind() {
                Some(SinkKind::Cloudwatch) => {
                    Format::Cloudwatch(cloudwatch::CloudwatchFormat::new(
                        &sink.url,
                        sink.topic_arn.as_deref().unwrap_or(DEFAULT_TOPIC_ARN),
                    ))
                }
                Some(SinkKind::Alertmanager) => {
                    Format::Alertmanager(alertmanager::AlertmanagerFormat::new(
                        &sink.url,
                        sink.labels.clone(),
                        sink.firing_ttl.unwrap_or(DEFAULT_FIRING_TTL),
                        &sink.kinds,
                    ))
                }
                // Validated above: only a webhook is left.
                _ => Format::Webhook(webhook::WebhookFormat::new(&sink.url)),
            };
            let client = fleetmend_proto::http_client::system_roots()
                .timeout(sink.timeout)
                .connect_timeout(sink.timeout.min(Duration::from_secs(5)))
                .user_agent(concat!("fleetmend-repairer/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|source| AlertsError::Client { sink: name.clone(), source })?;
            let cursor = outbox::open_cursor(&store, &name, sink.from_start)
                .map_err(|source| AlertsError::Cursor { sink: name.clone(), source })?;
            sinks.push(Arc::new(Sink {
                name,
                format,
                secret,
                min_severity: sink.min_severity,
                kinds: sink.kinds.iter().copied().collect(),
                retry_initial: sink.retry_initial,
                retry_max: sink.retry_max,
                client,
                wake: Notify::new(),
                cursor: AtomicI64::new(cursor),
                sent_ok: AtomicU64::new(0),
                sent_error: AtomicU64::new(0),
            }));
        }
        Ok(Alerts {
            store,
            clock: SystemClock::shared(),
            sinks,
            poll_interval: config.poll_interval,
            batch: config.batch,
        })
    }

    /// [`Alerts::new`] with its waits on `clock`.
    pub fn with_clock(
        config: AlertsConfig,
        store: Arc<Store>,
        clock: SharedClock,
    ) -> Result<Alerts, AlertsError> {
        Ok(Alerts { clock, ..Alerts::new(config, store)? })
    }

    /// A new event was appended: idle sinks look at the log now instead of at their next poll.
    pub fn wake(&self) {
        for sink in &self.sinks {
            sink.wake.notify_one();
        }
    }

    /// Delivery attempts per sink and outcome (`ok` | `error`), for
    /// `fleetmend_alerts_sent_total{sink,outcome}`. Every sink appears with both outcomes.
    pub fn sent_totals(&self) -> Vec<(String, &'static str, u64)> {
        let mut out = Vec::with_capacity(self.sinks.len() * 2);
        for sink in &self.sinks {
            out.push((sink.name.clone(), "ok", sink.sent_ok.load(Ordering::Relaxed)));
            out.push((sink.name.clone(), "error", sink.sent_error.load(Ordering::Relaxed)));
        }
        out
    }

    /// Each sink's cursor: the id of the last event it delivered or skipped.
    pub fn cursors(&self) -> Vec<(String, i64)> {
        self.sinks
            .iter()
            .map(|sink| (sink.name.clone(), sink.cursor.load(Ordering::Relaxed)))
            .collect()
    }
}

/// `ms` since the epoch as ISO 8601 in UTC with milliseconds (`2024-05-01T12:00:00.123Z`).
pub(crate) fn iso8601(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The name of the problem an event kind raises, in PascalCase: the CloudWatch metric name, and
/// after `Fleetmend` the Alertmanager `alertname`.
pub(crate) fn problem_name(kind: EventKind) -> String {
    match kind {
        EventKind::StateChanged => "NodeUnhealthy".to_owned(),
        EventKind::RepairFinished => "RepairFailed".to_owned(),
        EventKind::ActionHeld => "ActionHeld".to_owned(),
        EventKind::Breaker => "BreakerOpen".to_owned(),
        other => other
            .as_str()
            .split('-')
            .map(|word| {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect(),
    }
}

/// A one-line headline for `event`, shared by the formats.
pub(crate) fn summary(event: &Event) -> String {
    let node = event.node.as_deref().unwrap_or("the fleet");
    let clear = Condition::of(event) == Condition::Clear;
    match event.kind {
        EventKind::StateChanged => match (event.from_state, event.to_state) {
            (Some(from), Some(to)) => format!("node {node} went from {from} to {to}"),
            (None, Some(to)) => format!("node {node} is {to}"),
            _ => format!("node {node} changed state"),
        },
        EventKind::RepairFinished if clear => format!("repair of node {node} finished"),
        EventKind::RepairFinished => match event.to_state {
            Some(to) => format!("repair of node {node} did not work: node is {to}"),
            None => format!("repair of node {node} did not work"),
        },
        EventKind::ActionHeld => match event.action {
            Some(action) => format!("{action} of node {node} held back"),
            None => format!("action on node {node} held back"),
        },
        EventKind::NodeUnknown if clear => format!("node {node} is in the inventory now"),
        EventKind::NodeUnknown => format!("node {node} reports but is not in the inventory"),
        EventKind::Breaker if clear => "repair breaker closed: automatic repairs resume".to_owned(),
        EventKind::Breaker => "repair breaker open: automatic repairs stopped".to_owned(),
        EventKind::LeaderChanged if clear => "a repairer took the lead".to_owned(),
        EventKind::LeaderChanged => {
            "a repairer took the lead after the leader stopped renewing its lease".to_owned()
        }
        kind => format!("{} on {node}", kind.as_str()),
    }
}

/// The reason with the findings behind it, for descriptions.
pub(crate) fn description(event: &Event) -> String {
    let mut text = event.reason.clone();
    for finding in &event.findings {
        text.push_str("\n- ");
        text.push_str(&finding.check);
        text.push('/');
        text.push_str(&finding.finding);
        if !finding.subject.is_empty() {
            text.push('[');
            text.push_str(&finding.subject);
            text.push(']');
        }
        if !finding.message.is_empty() {
            text.push_str(": ");
            text.push_str(&finding.message);
        }
    }
    text
}
#[cfg(test)]
mod tests;
