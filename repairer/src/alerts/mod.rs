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

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use serde::Deserialize;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::clock::{SharedClock, SystemClock};
use crate::model::{Event, EventKind, NodeState, Severity};
use crate::store::{Store, StoreError};

/// The `[alerts]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// How long an idle sink waits before it looks at the event log again when nothing wakes it.
    /// A safety net: the repairer wakes the sinks as it appends an event.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Events read from the log at a time per sink.
    pub batch: usize,
    /// Where alerts go (`[[alerts.sinks]]`).
    pub sinks: Vec<SinkConfig>,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig { poll_interval: Duration::from_secs(5), batch: 256, sinks: Vec::new() }
    }
}

/// One alert sink (`[[alerts.sinks]]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkConfig {
    /// Names the sink in metrics, logs, its cursor and its idempotency keys. Letters, digits,
    /// `-`, `_`, `.`. Renaming a sink starts a new cursor.
    pub name: String,
    /// `cloudwatch` (SNS notification carrying a CloudWatch alarm), `alertmanager` (Alertmanager
    /// API v2) or `webhook` (the event as JSON).
    pub kind: String,
    /// Where to POST: the receiver's URL; for `alertmanager` the Alertmanager base URL
    /// (`/api/v2/alerts` is appended unless already there).
    pub url: String,
    /// Shared secret for the HMAC signature header. Prefer `secret_file`.
    pub secret: Option<Secret>,
    /// File holding the shared secret (read at start; surrounding white space ignored).
    pub secret_file: Option<PathBuf>,
    /// The least severity sent. Events that clear an alarm (node healthy again, breaker closed)
    /// are sent whatever their severity, so that what was raised gets resolved.
    pub min_severity: Severity,
    /// The event kinds sent.
    pub kinds: Vec<EventKind>,
    /// Time limit of one delivery attempt (connect, send, response).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// First wait before re-sending an event the sink did not take; doubles per failure.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    /// Longest wait between re-sends.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// A new sink gets the whole event log rather than the events from now on.
    pub from_start: bool,
    /// `cloudwatch` only: the SNS topic ARN the notifications claim to come from; its region and
    /// account become the alarm's. Default `arn:aws:sns:local:000000000000:fleetmend`.
    pub topic_arn: Option<String>,
    /// `alertmanager` only: labels added to every alert (e.g. `cluster`).
    pub labels: BTreeMap<String, String>,
    /// `alertmanager` only: a firing alert ends by itself this long after it was raised if no
    /// resolving event came (a safety net; the resolve is normally delivered). Default 30 days.
    #[serde(with = "humantime_serde")]
    pub firing_ttl: Option<Duration>,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            name: String::new(),
            kind: String::new(),
            url: String::new(),
            secret: None,
            secret_file: None,
            min_severity: Severity::Warning,
            kinds: DEFAULT_KINDS.to_vec(),
            timeout: Duration::from_secs(10),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            from_start: false,
            topic_arn: None,
            labels: BTreeMap::new(),
            firing_ttl: None,
        }
    }
}

/// The event kinds a sink sends unless told otherwise: what a person on call acts on.
pub const DEFAULT_KINDS: [EventKind; 4] =
    [EventKind::StateChanged, EventKind::RepairFinished, EventKind::Breaker, EventKind::ActionHeld];

/// The default topic of `cloudwatch` sinks.
pub const DEFAULT_TOPIC_ARN: &str = "arn:aws:sns:local:000000000000:fleetmend";

/// Default [`SinkConfig::firing_ttl`].
pub const DEFAULT_FIRING_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// A secret from the config; never printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The kinds of sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkKind {
    Cloudwatch,
    Alertmanager,
    Webhook,
}

impl SinkKind {
    pub const ALL: [SinkKind; 3] =
        [SinkKind::Cloudwatch, SinkKind::Alertmanager, SinkKind::Webhook];

    pub fn as_str(self) -> &'static str {
        match self {
            SinkKind::Cloudwatch => "cloudwatch",
            SinkKind::Alertmanager => "alertmanager",
            SinkKind::Webhook => "webhook",
        }
    }
}

impl FromStr for SinkKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SinkKind::ALL.into_iter().find(|kind| kind.as_str() == s).ok_or_else(|| {
            format!("unknown sink kind {s:?}: expected cloudwatch, alertmanager or webhook")
        })
    }
}

impl SinkConfig {
    /// The parsed kind, if valid.
    pub fn sink_kind(&self) -> Option<SinkKind> {
        self.kind.parse().ok()
    }
}

impl AlertsConfig {
    /// Pushes every problem as `(field, message)`, naming the field under `section` (e.g.
    /// `alerts.sinks[0].kind`).
    pub fn validate(&self, section: &str, problems: &mut Vec<(String, String)>) {
        let mut push = |field: String, message: String| problems.push((field, message));
        if self.poll_interval.is_zero() {
            push(format!("{section}.poll_interval"), "must be greater than zero".into());
        }
        if !(1..=10_000).contains(&self.batch) {
            push(format!("{section}.batch"), format!("{} is not from 1 to 10000", self.batch));
        }
        let mut names = HashSet::new();
        for (i, sink) in self.sinks.iter().enumerate() {
            let at = format!("{section}.sinks[{i}]");
            sink.validate(&at, &mut push);
            if !sink.name.is_empty() && !names.insert(sink.name.as_str()) {
                push(format!("{at}.name"), format!("{:?} names two sinks", sink.name));
            }
        }
    }
}

impl SinkConfig {
    fn validate(&self, at: &str, push: &mut impl FnMut(String, String)) {
        if self.name.is_empty() {
            push(format!("{at}.name"), "must be set".into());
        } else if self.name.len() > 64
            || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            push(
                format!("{at}.name"),
                format!("{:?} must be 1 to 64 letters, digits, '-', '_' or '.'", self.name),
            );
        }
        let kind = if self.kind.is_empty() {
            push(format!("{at}.kind"), "must be set: cloudwatch, alertmanager or webhook".into());
            None
        } else {
            match self.kind.parse::<SinkKind>() {
                Ok(kind) => Some(kind),
                Err(message) => {
                    push(format!("{at}.kind"), message);
                    None
                }
            }
        };
        if self.url.is_empty() {
            push(format!("{at}.url"), "must be set".into());
        } else if let Err(message) = http_url(&self.url) {
            push(format!("{at}.url"), message);
        }
        if self.secret.is_some() && self.secret_file.is_some() {
            push(format!("{at}.secret_file"), "set either secret or secret_file, not both".into());
        }
        if self.secret.as_ref().is_some_and(|secret| secret.0.is_empty()) {
            push(format!("{at}.secret"), "must not be empty".into());
        }
        if self.kinds.is_empty() {
            push(format!("{at}.kinds"), "must name at least one event kind".into());
        }
        for (field, value) in [
            ("timeout", self.timeout),
            ("retry_initial", self.retry_initial),
            ("retry_max", self.retry_max),
        ] {
            if value.is_zero() {
                push(format!("{at}.{field}"), "must be greater than zero".into());
            }
        }
        if self.retry_max < self.retry_initial {
            push(
                format!("{at}.retry_max"),
                format!(
                    "{} is shorter than retry_initial {}",
                    humantime::format_duration(self.retry_max),
                    humantime::format_duration(self.retry_initial)
                ),
            );
        }
        if let Some(arn) = &self.topic_arn {
            if kind.is_some_and(|kind| kind != SinkKind::Cloudwatch) {
                push(format!("{at}.topic_arn"), "only for kind = \"cloudwatch\"".into());
            } else if let Err(message) = cloudwatch::TopicArn::parse(arn) {
                push(format!("{at}.topic_arn"), message);
            }
        }
        if !self.labels.is_empty() && kind.is_some_and(|kind| kind != SinkKind::Alertmanager) {
            push(format!("{at}.labels"), "only for kind = \"alertmanager\"".into());
        }
        for (name, value) in &self.labels {
            if let Err(message) = alertmanager::check_extra_label(name, value) {
                push(format!("{at}.labels.{name}"), message);
            }
        }
        if let Some(ttl) = self.firing_ttl {
            if kind.is_some_and(|kind| kind != SinkKind::Alertmanager) {
                push(format!("{at}.firing_ttl"), "only for kind = \"alertmanager\"".into());
            } else if ttl.is_zero() {
                push(format!("{at}.firing_ttl"), "must be greater than zero".into());
            }
        }
    }
}

/// `url` parsed when it is an absolute http(s) URL with a host.
fn http_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|err| format!("{url:?} is not a URL: {err}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    Ok(parsed)
}

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

/// What one delivery attempt came to.
enum Attempt {
    Delivered,
    /// Worth trying again: the sink is down, slow, overloaded or refusing for now.
    Failed(String),
    /// The sink says this request can never succeed (400, 413, 422): retrying the same bytes
    /// forever would block every later alert behind it.
    Rejected(String),
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
        // reqwest is built without a default TLS provider; installing one twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
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
            let client = reqwest::Client::builder()
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

    /// Runs one delivery loop per sink until this future is dropped (dropping it stops them all).
    pub async fn run(self: Arc<Self>) {
        if self.sinks.is_empty() {
            return std::future::pending().await;
        }
        let mut loops = JoinSet::new();
        for sink in &self.sinks {
            let alerts = Arc::clone(&self);
            let sink = Arc::clone(sink);
            loops.spawn(async move { alerts.deliver_forever(&sink).await });
        }
        while let Some(result) = loops.join_next().await {
            if let Err(err) = result
                && err.is_panic()
            {
                tracing::error!(error = %err, "an alert delivery loop panicked; its sink gets no more alerts");
            }
        }
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

    async fn deliver_forever(&self, sink: &Sink) {
        loop {
            let cursor = sink.cursor.load(Ordering::Relaxed);
            let events = match outbox::next_events(&self.store, cursor, self.batch) {
                Ok(events) => events,
                Err(err) => {
                    tracing::warn!(sink = %sink.name, error = %err, "reading the event log for alerts");
                    self.clock.sleep(self.poll_interval).await;
                    continue;
                }
            };
            if events.is_empty() {
                // `notify_one` keeps a permit, so a wake that came while reading is not lost.
                tokio::select! {
                    () = sink.wake.notified() => {}
                    () = self.clock.sleep(self.poll_interval) => {}
                }
                continue;
            }
            let mut skipped = false;
            for event in &events {
                if sink.wants(event) {
                    if skipped {
                        self.save_cursor(sink);
                        skipped = false;
                    }
                    self.deliver(sink, event).await;
                    sink.cursor.store(event.id, Ordering::Relaxed);
                    self.save_cursor(sink);
                } else {
                    sink.cursor.store(event.id, Ordering::Relaxed);
                    skipped = true;
                }
            }
            if skipped {
                self.save_cursor(sink);
            }
        }
    }

    fn save_cursor(&self, sink: &Sink) {
        let cursor = sink.cursor.load(Ordering::Relaxed);
        if let Err(err) = outbox::advance(&self.store, &sink.name, cursor) {
            // The loop goes on from its cursor in memory; a restart before the next successful
            // save re-sends from the saved one, and the receiver drops the duplicates by key.
            tracing::warn!(sink = %sink.name, cursor, error = %err, "saving the alert cursor");
        }
    }

    /// Sends `event` until the sink takes it (or rejects it for good).
    async fn deliver(&self, sink: &Sink, event: &Event) {
        let delivery = match sink.format.render(&sink.name, event) {
            Ok(Some(delivery)) => delivery,
            Ok(None) => return,
            Err(err) => {
                sink.sent_error.fetch_add(1, Ordering::Relaxed);
                tracing::error!(sink = %sink.name, event = event.id, error = %err, "rendering an alert; skipped");
                return;
            }
        };
        let key = sign::idempotency_key(&sink.name, event.id);
        let signature =
            sink.secret.as_ref().map(|secret| sign::signature(secret.0.as_bytes(), &delivery.body));
        let mut failures = 0u32;
        loop {
            match attempt(sink, &delivery, &key, signature.as_deref()).await {
                Attempt::Delivered => {
                    sink.sent_ok.fetch_add(1, Ordering::Relaxed);
                    if failures > 0 {
                        tracing::info!(sink = %sink.name, event = event.id, failures, "alert delivered after retries");
                    }
                    return;
                }
                Attempt::Rejected(why) => {
                    sink.sent_error.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(sink = %sink.name, event = event.id, why, "alert rejected by the sink; skipped");
                    return;
                }
                Attempt::Failed(why) => {
                    sink.sent_error.fetch_add(1, Ordering::Relaxed);
                    let wait = backoff(sink.retry_initial, sink.retry_max, failures);
                    failures = failures.saturating_add(1);
                    tracing::warn!(
                        sink = %sink.name, event = event.id, failures, why,
                        retry_in = %humantime::format_duration(Duration::from_millis(wait.as_millis() as u64)),
                        "alert delivery failed; will retry"
                    );
                    self.clock.sleep(wait).await;
                }
            }
        }
    }
}

async fn attempt(sink: &Sink, delivery: &Delivery, key: &str, signature: Option<&str>) -> Attempt {
    let mut request = sink
        .client
        .post(&delivery.url)
        .header(reqwest::header::CONTENT_TYPE, delivery.content_type)
        .header(sign::IDEMPOTENCY_HEADER, key);
    if let Some(signature) = signature {
        request = request.header(sign::SIGNATURE_HEADER, signature);
    }
    for (name, value) in &delivery.headers {
        request = request.header(*name, value);
    }
    let response = match request.body(delivery.body.clone()).send().await {
        Ok(response) => response,
        Err(err) => return Attempt::Failed(error_chain(&err)),
    };
    let status = response.status();
    if status.is_success() {
        return Attempt::Delivered;
    }
    // The body says why; bounded so a chatty receiver cannot flood the log.
    let body = response.text().await.unwrap_or_default();
    let why = format!("HTTP {status}: {}", body.chars().take(200).collect::<String>().trim());
    match status.as_u16() {
        400 | 413 | 422 => Attempt::Rejected(why),
        _ => Attempt::Failed(why),
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The wait before retry number `failures + 1`: `initial * 2^failures` capped at `max`, then
/// "equal jitter" (half fixed, half random) so sinks that failed together do not retry in step.
pub fn backoff(initial: Duration, max: Duration, failures: u32) -> Duration {
    let exponential = initial.saturating_mul(1u32 << failures.min(20));
    exponential.min(max).mul_f64(0.5 + fastrand::f64() * 0.5)
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
        EventKind::Breaker if clear => "repair breaker closed: automatic repairs resume".to_owned(),
        EventKind::Breaker => "repair breaker open: automatic repairs stopped".to_owned(),
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
mod tests {
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
        assert!(
            toml::from_str::<AlertsConfig>("[[sinks]]\nname = \"a\"\nsecrets = \"x\"").is_err()
        );
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
            assert!(
                fields.iter().any(|field| field == expected),
                "{expected} missing from {fields:?}"
            );
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
        let mut event = Event::new(
            EventKind::StateChanged,
            Severity::Info,
            Some("n1"),
            Actor::repairer(),
            "x",
            1,
        );
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
}
