//! Reports to the repairer: `POST {repairer}/v1/reports` on every interval and at once when a check
//! asks for it (a kernel-log fault, a changed problem).
//!
//! While the repairer is away the reporter retries with capped exponential backoff and jitter, and
//! every retry carries the newest state: nothing queues up, so a long outage costs memory for one
//! report, not one per interval. A refusal that says when to come back (429 beyond the node's rate,
//! or 503, with `Retry-After`) is honoured, with jitter on top, so agents refused in the same
//! second do not all come back in the same second either.
//!
//! With several repairers configured, [`crate::failover`] picks which one each attempt goes to:
//! the reporter stays on one that takes its reports, moves to the next at once when one fails, and
//! follows a standby's pointer to the leader when the leader is one of its own repairers.
//!
//! Commands in the repairer's replies go to the agent's [`Commands`]; their results travel in every
//! report until one carrying them is accepted, and a finished command is reported at once.
//!
//! Every report carries the ranks of jobs the agent runs (and those that ended recently) and the
//! address other nodes reach this node at; a rank that ends is reported at once (`rank-exit`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fleetmend_proto::backoff::Backoff;
use fleetmend_proto::http_client::{CaFileError, Roots};
use fleetmend_proto::{Finding, Report, ReportReply, ReportTrigger, Verdict, WIRE_VERSION};

use crate::commands::Commands;
use crate::config::ReportConfig;
use crate::failover::{Failover, Outcome, Wait};
use crate::runner::{AgentState, unix_millis};

/// Sending one report failed.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("reading the report token from {path}: {source}")]
    Token { path: std::path::PathBuf, source: std::io::Error },
    #[error("trusting the repairer's CA: {0}")]
    Ca(#[from] CaFileError),
    #[error("sending the report to {url}: {}", fleetmend_proto::error_chain(source))]
    Send { url: String, source: reqwest::Error },
    #[error("the repairer at {url} refused the report: HTTP {status}: {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
        /// `Retry-After` of a 429 or 503: how long the repairer asked to wait.
        retry_after: Option<Duration>,
        /// `Fleetmend-Leader` of a standby's 503: the leader's base URL.
        leader: Option<String>,
    },
}

/// Sends reports to one of the configured repairers.
#[derive(Debug)]
pub struct Reporter {
    client: reqwest::Client,
    /// The configured base URLs, without a trailing slash.
    repairers: Vec<String>,
    failover: Failover,
    token: Option<String>,
    config: ReportConfig,
    /// Where the repairer's commands go; none: they are logged and ignored.
    commands: Option<Arc<Commands>>,
    /// The port this agent serves `/metrics` on, told in every report so the repairer can serve
    /// Prometheus service discovery (only the bound listener knows it: `listen` may say port 0).
    metrics_port: Option<u16>,
}

impl Reporter {
    /// A reporter for `config`, or `None` when no repairer is configured.
    pub fn new(config: &ReportConfig) -> Result<Option<Reporter>, ReportError> {
        let Some(urls) = &config.repairer else {
            return Ok(None);
        };
        let repairers: Vec<String> =
            urls.urls().iter().map(|u| u.trim().trim_end_matches('/').to_owned()).collect();
        let token = match (&config.token, &config.token_file) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|source| ReportError::Token { path: path.clone(), source })?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        let roots = config.ca_file.as_deref().map_or(Roots::System, Roots::Only);
        let client = fleetmend_proto::http_client::builder(roots)?
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .user_agent(concat!("fleetmend-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ReportError::Client)?;
        Ok(Some(Reporter {
            client,
            failover: Failover::new(repairers.clone()),
            repairers,
            token,
            config: config.clone(),
            commands: None,
            metrics_port: None,
        }))
    }

    /// Hands the repairer's commands to `commands` and carries their results in reports.
    pub fn with_commands(mut self, commands: Arc<Commands>) -> Reporter {
        self.commands = Some(commands);
        self
    }

    /// Tells the repairer in every report that `/metrics` is served on `port`.
    pub fn with_metrics_port(mut self, port: u16) -> Reporter {
        self.metrics_port = Some(port);
        self
    }

    /// The base URL the next report goes to.
    pub fn current_repairer(&self) -> &str {
        self.failover.current_url()
    }

    /// Sends one report to the current repairer and returns its reply.
    pub async fn send(&self, report: &Report) -> Result<ReportReply, ReportError> {
        let target = format!("{}/v1/reports", self.failover.current_url());
        let mut request = self.client.post(&target).json(report);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let url = || target.clone();
        let response =
            request.send().await.map_err(|source| ReportError::Send { url: url(), source })?;
        let status = response.status();
        let retry_after = retry_after(status.as_u16(), response.headers());
        let leader = (status.as_u16() == 503)
            .then(|| response.headers().get(fleetmend_proto::repairers::LEADER_HEADER))
            .flatten()
            .and_then(|value| value.to_str().ok())
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty());
        let body =
            response.bytes().await.map_err(|source| ReportError::Send { url: url(), source })?;
        if !status.is_success() {
            let body = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            return Err(ReportError::Refused {
                url: url(),
                status: status.as_u16(),
                body,
                retry_after,
                leader,
            });
        }
        // An empty or unreadable reply still means the report arrived; there is just nothing to do.
        if body.is_empty() {
            return Ok(ReportReply::default());
        }
        Ok(serde_json::from_slice(&body).unwrap_or_else(|err| {
            tracing::warn!(error = %err, "the repairer's reply is not a report reply; ignoring it");
            ReportReply::default()
        }))
    }

    /// The delay before retry number `failures` (1-based): doubling from `backoff_initial` up to
    /// `backoff_max`, with "equal jitter" (half fixed, half random) so a fleet that lost its
    /// repairer at the same moment does not come back in lockstep.
    pub fn backoff(&self, failures: u32) -> Duration {
        self.retries().delay(failures, fastrand::f64())
    }

    /// The wait after a refusal whose `Retry-After` asked for `asked`: not sooner, at most
    /// `backoff_max` (a proxy's hour-long `Retry-After` must not silence the node past its
    /// unreachable window), with jitter on top ([`Backoff::after_asked`]).
    pub fn after_refusal(&self, asked: Duration) -> Duration {
        self.retries().after_asked(asked, fastrand::f64())
    }

    /// The configured backoff while the repairer is away.
    fn retries(&self) -> Backoff {
        Backoff::new(self.config.backoff_initial, self.config.backoff_max)
    }

    /// Reports until the process ends: a startup report, then one every interval, at once on a
    /// request or when a command finished, and with backoff while the repairer is away.
    pub async fn run(mut self, state: Arc<AgentState>) {
        state.note_repairer(self.failover.current_url(), false);
        let mut seq = 0u64;
        let mut failures = 0u32;
        let mut retry_in = Duration::ZERO;
        let mut trigger = ReportTrigger::Startup;
        let mut exits = self.commands.as_ref().and_then(|c| c.ranks()).map(|r| r.exits());
        loop {
            seq += 1;
            // Seen before the ranks are read: an exit after this point sends another report.
            let generation = exits.as_mut().map(|exits| *exits.borrow_and_update());
            let mut report = build_report(&state, seq, trigger);
            report.metrics_port = self.metrics_port;
            if let Some(commands) = &self.commands {
                report.command_results = commands.outbox().pending();
                if let Some(ranks) = commands.ranks() {
                    report.ranks = ranks.statuses();
                    report.address = Some(ranks.address().to_owned());
                }
            }
            // A report past the wire's bounds would be refused whole; nothing a check makes comes
            // near them, but a configured name or command line could.
            let cut = fleetmend_proto::bounds::fit_report(&mut report);
            if cut > 0 {
                tracing::warn!(cut, "fields of the report cut to the wire's bounds");
            }
            match self.send(&report).await {
                Ok(reply) => {
                    if failures > 0 {
                        tracing::info!(after_failures = failures, "the repairer is back");
                    }
                    failures = 0;
                    self.failover.after(&Outcome::Delivered);
                    state.note_report(true);
                    if let (Some(generation), Some(ranks)) =
                        (generation, self.commands.as_ref().and_then(|c| c.ranks()))
                    {
                        ranks.note_delivered(generation);
                    }
                    self.take_reply(&report, reply);
                }
                Err(err) => {
                    failures = failures.saturating_add(1);
                    state.note_report(false);
                    let wait = self.fail_over(&err, &state);
                    retry_in = wait.unwrap_or_default();
                    tracing::warn!(error = %err, failures, retry_in = ?retry_in, "report not delivered");
                    if wait.is_none() {
                        // The next repairer of this round gets the same report at once.
                        continue;
                    }
                }
            }
            trigger = if failures == 0 {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.interval) => ReportTrigger::Interval,
                    _ = state.report_requested() => ReportTrigger::Event,
                    _ = self.results_waiting() => ReportTrigger::Command,
                    _ = rank_exited(&mut exits) => ReportTrigger::RankExit,
                }
            } else {
                tokio::time::sleep(retry_in).await;
                if exits.as_ref().is_some_and(|e| e.has_changed().unwrap_or(false)) {
                    ReportTrigger::RankExit
                } else if self.commands.as_ref().is_some_and(|c| !c.outbox().is_empty()) {
                    ReportTrigger::Command
                } else {
                    ReportTrigger::Interval
                }
            };
        }
    }

    /// Picks the repairer of the next attempt after `err` and returns how long to wait first
    /// (none: the next repairer of the round, at once).
    fn fail_over(&mut self, err: &ReportError, state: &AgentState) -> Option<Duration> {
        let outcome = match err {
            ReportError::Refused { status: 503, leader, retry_after, .. } => {
                Outcome::Standby { leader: leader.clone(), retry_after: *retry_after }
            }
            ReportError::Refused { status: 500..=599, .. } => Outcome::Unreachable,
            ReportError::Refused { retry_after, .. } => {
                Outcome::Refused { retry_after: *retry_after }
            }
            _ => Outcome::Unreachable,
        };
        let from = self.failover.current();
        let (step, foreign) = self.failover.after(&outcome);
        if let Some(foreign) = foreign {
            tracing::warn!(
                repairer = %self.repairers[from],
                leader = %foreign.0,
                "a standby named a leader that is not a configured repairer; not following it"
            );
        }
        if let Some(why) = step.moved {
            tracing::info!(
                from = %self.repairers[from],
                to = %self.repairers[step.to],
                why = why.as_str(),
                "reporting to another repairer"
            );
            state.note_repairer(&self.repairers[step.to], true);
        }
        match step.wait {
            Wait::None => None,
            Wait::Backoff { rounds } => Some(self.backoff(rounds)),
            Wait::Asked(asked) => Some(self.after_refusal(asked)),
        }
    }

    /// The repairer accepted `report`: its command results are delivered; the reply's commands
    /// are queued in order.
    fn take_reply(&self, report: &Report, reply: ReportReply) {
        let Some(commands) = &self.commands else {
            for command in reply.commands {
                tracing::warn!(
                    kind = %command.kind,
                    id = %command.id,
                    "this agent takes no commands; ignoring it"
                );
            }
            return;
        };
        commands.outbox().delivered(&report.command_results);
        for command in reply.commands {
            commands.submit(command);
        }
    }

    /// Returns once a command result waits to be sent; never without commands.
    async fn results_waiting(&self) {
        match &self.commands {
            Some(commands) => commands.outbox().ready().await,
            None => std::future::pending().await,
        }
    }
}

/// Returns once a rank ended since the last look; never without a rank supervisor.
async fn rank_exited(exits: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(exits) = exits
        && exits.changed().await.is_ok()
    {
        return;
    }
    // No supervisor, or its sender is gone (it lives as long as the supervisor): never.
    std::future::pending().await
}

/// A report of the agent's newest state.
pub fn build_report(state: &AgentState, seq: u64, trigger: ReportTrigger) -> Report {
    let results = state.results();
    // Only what is not ok travels: the repairer clears a finding when a report no longer carries
    // it, and a healthy 8-GPU node's report stays a few hundred bytes instead of tens of KB (one
    // repairer takes 100,000 nodes' heartbeats).
    let findings: Vec<Finding> = results
        .iter()
        .flat_map(|r| r.observation.findings.iter())
        .filter(|f| f.status != fleetmend_proto::Status::Ok)
        .cloned()
        .collect();
    Report {
        wire_version: WIRE_VERSION,
        node: state.identity.node.clone(),
        boot_id: state.identity.boot_id.clone(),
        agent_version: state.identity.agent_version.clone(),
        seq,
        sent_at_ms: unix_millis(SystemTime::now()),
        trigger,
        verdict: Verdict::of(&findings),
        checks: results.iter().map(|r| r.summary()).collect(),
        findings,
        command_results: Vec::new(),
        address: None,
        ranks: Vec::new(),
        metrics_port: None,
    }
}

/// `Retry-After` of a 429 or 503 in seconds (the HTTP-date form is not used by the repairer: it
/// and anything unreadable fall back to the backoff).
fn retry_after(status: u16, headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    if status != 429 && status != 503 {
        return None;
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RepairerUrls;

    fn reporter(config: ReportConfig) -> Result<Reporter, ReportError> {
        let repairer = Some(RepairerUrls::One("http://127.0.0.1:9".to_owned()));
        Reporter::new(&ReportConfig { repairer, ..config }).map(|r| r.unwrap())
    }

    #[test]
    fn retries_wait_within_the_configured_backoff() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let config =
            ReportConfig { backoff_initial: initial, backoff_max: max, ..Default::default() };
        let reporter = reporter(config).unwrap();
        for _ in 0..50 {
            let first = reporter.backoff(1);
            assert!(first >= initial / 2 && first <= initial, "{first:?}");
            let late = reporter.backoff(50);
            assert!(late >= max / 2 && late <= max, "{late:?}");
            let refused = reporter.after_refusal(Duration::from_secs(3600));
            assert!(refused >= max && refused <= max + max / 2, "{refused:?}");
        }
    }

    #[test]
    fn a_ca_file_that_cannot_be_read_stops_the_reporter_naming_it() {
        let ca_file = Some(std::path::PathBuf::from("/nonexistent/fleetmend-ca.pem"));
        let err = reporter(ReportConfig { ca_file, ..Default::default() }).unwrap_err();
        assert!(matches!(err, ReportError::Ca(_)), "{err}");
        assert!(err.to_string().contains("/nonexistent/fleetmend-ca.pem"), "{err}");
    }

    #[test]
    fn retry_after_is_read_from_429_and_503_only() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers
            .insert(reqwest::header::RETRY_AFTER, reqwest::header::HeaderValue::from_static("7"));
        assert_eq!(retry_after(429, &headers), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(503, &headers), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(500, &headers), None);
        headers.insert(
            reqwest::header::RETRY_AFTER,
            reqwest::header::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(429, &headers), None);
    }
}
