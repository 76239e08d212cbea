//! The `[alerts]` section: the sinks, their defaults and their validation.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use super::{alertmanager, cloudwatch};
use crate::model::{EventKind, Severity};

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

/// The event kinds a sink sends unless told otherwise: what a person on call acts on (a node
/// reporting from outside the inventory is one: a mistyped inventory, or a credential in use by
/// something that is not a node of the fleet), and so is a repairer taking the lead from one that
/// stopped renewing its lease.
pub const DEFAULT_KINDS: [EventKind; 6] = [
    EventKind::StateChanged,
    EventKind::RepairFinished,
    EventKind::Breaker,
    EventKind::ActionHeld,
    EventKind::NodeUnknown,
    EventKind::LeaderChanged,
];

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
