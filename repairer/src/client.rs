//! The client side of the admin API, for the `fleetmend nodes|events|drain|...` verbs: requests,
//! and tables for people.
//!
//! Given several repairers (`--repairer http://a:9830,http://b:9830`), a request goes to the first
//! that answers: one that cannot be reached or answers 5xx is passed over for the next, a standby's
//! 503 naming the leader (`Fleetmend-Leader`) sends the request to the leader when it is one of the
//! given repairers; the error when none served it names every repairer tried and what each said.

use std::time::Duration;

use fleetmend_proto::http_client::{CaFileError, Roots};
use serde::de::DeserializeOwned;

use crate::api::NodeDetail;
use crate::engine::{BreakerState, NodeSummary};
use crate::history::FaultHistory;
use crate::model::{Event, RuleAction};
use crate::queue::{CheckpointEvery, JobSpec, JobState, JobView};
use crate::workflow::KeptEvidence;

/// A request to the repairer failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("building the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    #[error(transparent)]
    Ca(#[from] CaFileError),
    #[error("{method} {url}: {}", fleetmend_proto::error_chain(source))]
    Send { method: &'static str, url: String, source: reqwest::Error },
    #[error("{method} {url}: HTTP {status}: {message}")]
    Refused {
        method: &'static str,
        url: String,
        status: u16,
        message: String,
        /// A standby's `Fleetmend-Leader`: the leader's base URL.
        leader: Option<String>,
    },
    #[error("the repairer list {list:?}: {message}")]
    Urls { list: String, message: String },
    #[error("{method} {path}: no repairer served it: {}", tried.join("; "))]
    Unserved { method: &'static str, path: String, tried: Vec<String> },
    #[error("{method} {url}: unexpected answer: {source}")]
    Decode { method: &'static str, url: String, source: serde_json::Error },
}

/// A client of one repairer's admin API.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The repairers' base URLs, without a trailing slash, in the order given.
    bases: Vec<String>,
    token: Option<String>,
    user: String,
}

impl Client {
    /// A client of the repairer at `base`, or of the repairers of a comma-separated list; an
    /// `https://` one is verified against the CA(s) in `ca_file` when given (else the system's
    /// roots).
    pub fn new(
        base: &str,
        token: Option<String>,
        user: &str,
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Client, ClientError> {
        let bases: Vec<String> = if base.contains(',') {
            let list = fleetmend_proto::repairers::split_list(base);
            let problems = fleetmend_proto::repairers::problems(&list);
            if !problems.is_empty() {
                let message = problems
                    .iter()
                    .map(|(at, message)| match at {
                        Some(i) => format!("entry {i}: {message}"),
                        None => message.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(ClientError::Urls { list: base.to_owned(), message });
            }
            list.iter().map(|b| b.trim_end_matches('/').to_owned()).collect()
        } else {
            vec![base.trim_end_matches('/').to_owned()]
        };
        let roots = ca_file.map_or(Roots::System, Roots::Only);
        let http = fleetmend_proto::http_client::builder(roots)?
            .timeout(timeout)
            .build()
            .map_err(ClientError::Build)?;
        Ok(Client { http, bases, token, user: user.to_owned() })
    }

    async fn request<T: DeserializeOwned>(
        &self,
        method: &'static str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        if let [base] = self.bases.as_slice() {
            return self.request_at(base, method, path, body.as_ref()).await;
        }
        let mut tried_at = vec![false; self.bases.len()];
        let mut tried = Vec::new();
        let mut next = Some(0);
        while let Some(at) = next {
            tried_at[at] = true;
            let err = match self.request_at(&self.bases[at], method, path, body.as_ref()).await {
                Ok(answer) => return Ok(answer),
                Err(err) => err,
            };
            let leader = match &err {
                ClientError::Send { .. } => None,
                ClientError::Refused { status: 503, leader, .. } => leader
                    .as_deref()
                    .and_then(|l| fleetmend_proto::repairers::position(&self.bases, l)),
                ClientError::Refused { status: 500..=599, .. } => None,
                // Anything else is the fleet's answer (a bad token, an unknown node).
                _ => return Err(err),
            };
            tried.push(err.to_string());
            next =
                leader.filter(|l| !tried_at[*l]).or_else(|| tried_at.iter().position(|done| !done));
        }
        Err(ClientError::Unserved { method, path: path.to_owned(), tried })
    }

    async fn request_at<T: DeserializeOwned>(
        &self,
        base: &str,
        method: &'static str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let url = format!("{base}{path}");
        let mut request = match method {
            "POST" => self.http.post(&url),
            _ => self.http.get(&url),
        }
        .header("x-fleetmend-user", &self.user);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|source| ClientError::Send {
            method,
            url: url.clone(),
            source,
        })?;
        let status = response.status();
        let leader = response
            .headers()
            .get(fleetmend_proto::repairers::LEADER_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(|value| value.trim().to_owned());
        let bytes = response.bytes().await.map_err(|source| ClientError::Send {
            method,
            url: url.clone(),
            source,
        })?;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_else(|| {
                    String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
                });
            return Err(ClientError::Refused {
                method,
                url,
                status: status.as_u16(),
                message,
                leader,
            });
        }
        let bytes = if bytes.is_empty() { &b"null"[..] } else { &bytes[..] };
        serde_json::from_slice(bytes).map_err(|source| ClientError::Decode { method, url, source })
    }

    pub async fn nodes(&self) -> Result<Vec<NodeSummary>, ClientError> {
        self.request("GET", "/v1/nodes", None).await
    }

    pub async fn node(&self, name: &str) -> Result<NodeDetail, ClientError> {
        self.request("GET", &format!("/v1/nodes/{name}"), None).await
    }

    pub async fn evidence(&self, name: &str) -> Result<Vec<KeptEvidence>, ClientError> {
        self.request("GET", &format!("/v1/nodes/{name}/evidence"), None).await
    }

    pub async fn events(
        &self,
        after: i64,
        node: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Event>, ClientError> {
        let mut path = format!("/v1/events?after={after}&limit={limit}");
        if let Some(node) = node {
            path.push_str(&format!("&node={node}"));
        }
        self.request("GET", &path, None).await
    }

    /// The failure history of `[since_ms, until_ms)` (`GET /v1/history/faults`).
    pub async fn history_faults(
        &self,
        since_ms: u64,
        until_ms: u64,
        limit: usize,
    ) -> Result<FaultHistory, ClientError> {
        let path = format!("/v1/history/faults?since={since_ms}&until={until_ms}&limit={limit}");
        self.request("GET", &path, None).await
    }

    pub async fn drain(&self, node: &str) -> Result<serde_json::Value, ClientError> {
        self.request("POST", &format!("/v1/nodes/{node}/drain"), None).await
    }

    pub async fn undrain(&self, node: &str) -> Result<serde_json::Value, ClientError> {
        self.request("POST", &format!("/v1/nodes/{node}/undrain"), None).await
    }

    pub async fn repair(
        &self,
        node: &str,
        action: RuleAction,
    ) -> Result<serde_json::Value, ClientError> {
        self.request(
            "POST",
            &format!("/v1/nodes/{node}/repair"),
            Some(serde_json::json!({ "action": action })),
        )
        .await
    }

    pub async fn approve(
        &self,
        node: &str,
        action: Option<RuleAction>,
    ) -> Result<serde_json::Value, ClientError> {
        self.request(
            "POST",
            &format!("/v1/nodes/{node}/approve"),
            Some(serde_json::json!({ "action": action })),
        )
        .await
    }

    pub async fn breaker(&self) -> Result<BreakerState, ClientError> {
        self.request("GET", "/v1/breaker", None).await
    }

    pub async fn close_breaker(&self) -> Result<BreakerState, ClientError> {
        self.request("POST", "/v1/breaker/close", None).await
    }

    /// Submits a job to the embedded queue.
    pub async fn submit(&self, spec: &JobSpec) -> Result<JobView, ClientError> {
        let body = serde_json::to_value(spec).map_err(|source| ClientError::Decode {
            method: "POST",
            url: format!("{}/v1/jobs", self.bases.join(",")),
            source,
        })?;
        self.request("POST", "/v1/jobs", Some(body)).await
    }

    pub async fn jobs(&self) -> Result<Vec<JobView>, ClientError> {
        self.request("GET", "/v1/jobs", None).await
    }

    pub async fn job(&self, id: &str) -> Result<JobView, ClientError> {
        self.request("GET", &format!("/v1/jobs/{id}"), None).await
    }

    pub async fn cancel(&self, id: &str) -> Result<JobView, ClientError> {
        self.request("POST", &format!("/v1/jobs/{id}/cancel"), None).await
    }
}

/// One client verb: a request to the admin API.
#[derive(Debug, Clone)]
pub enum Request {
    Nodes,
    Node(String),
    /// The evidence bundles kept for a node.
    Evidence(String),
    Events {
        node: Option<String>,
        after: i64,
        limit: usize,
    },
    /// The failure history of a window, as its JSON document whatever the format.
    ExportFaults {
        since_ms: u64,
        until_ms: u64,
        limit: usize,
    },
    Drain(String),
    Undrain(String),
    Repair {
        node: String,
        action: RuleAction,
    },
    Approve {
        node: String,
        action: Option<RuleAction>,
    },
    /// The breaker's state; `close`: close it first.
    Breaker {
        close: bool,
    },
    Submit(JobSpec),
    Job(String),
    Jobs,
    Cancel(String),
}

/// How a client verb prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Lists as tables, a job as one line; everything else as JSON.
    Table,
    Json,
}

impl Client {
    /// Sends `request`; its answer as the text to print. `now_ms` is what "ago" is measured from.
    pub async fn answer(
        &self,
        request: Request,
        format: Format,
        now_ms: u64,
    ) -> Result<String, ClientError> {
        let table = format == Format::Table;
        Ok(match request {
            Request::Nodes => {
                let nodes = self.nodes().await?;
                if table { nodes_table(&nodes, now_ms) } else { pretty(&nodes) }
            }
            Request::Node(name) => pretty(&self.node(&name).await?),
            Request::Evidence(name) => {
                let kept = self.evidence(&name).await?;
                if table { evidence_text(&name, &kept) } else { pretty(&kept) }
            }
            Request::Events { node, after, limit } => {
                let events = self.events(after, node.as_deref(), limit).await?;
                if table { events_table(&events) } else { pretty(&events) }
            }
            Request::ExportFaults { since_ms, until_ms, limit } => {
                pretty(&self.history_faults(since_ms, until_ms, limit).await?)
            }
            Request::Drain(node) => pretty(&self.drain(&node).await?),
            Request::Undrain(node) => pretty(&self.undrain(&node).await?),
            Request::Repair { node, action } => pretty(&self.repair(&node, action).await?),
            Request::Approve { node, action } => pretty(&self.approve(&node, action).await?),
            Request::Breaker { close } => {
                let state = if close { self.close_breaker().await } else { self.breaker().await }?;
                pretty(&state)
            }
            Request::Submit(spec) => {
                let job = self.submit(&spec).await?;
                if table {
                    format!(
                        "{} ({}) {}: {}",
                        job.job.id, job.job.name, job.job.state, job.job.reason
                    )
                } else {
                    pretty(&job)
                }
            }
            Request::Job(id) => pretty(&self.job(&id).await?),
            Request::Jobs => {
                let jobs = self.jobs().await?;
                if table { jobs_table(&jobs) } else { pretty(&jobs) }
            }
            Request::Cancel(id) => {
                let job = self.cancel(&id).await?;
                if table {
                    format!("{} {}: {}", job.job.id, job.job.state, job.job.reason)
                } else {
                    pretty(&job)
                }
            }
        })
    }
}

/// Indented JSON, keys in order (through `serde_json::Value`); `null` for what cannot be encoded.
/// Each bundle with its items: a heading per item, then its text (binary items by size only).
fn evidence_text(node: &str, kept: &[KeptEvidence]) -> String {
    if kept.is_empty() {
        return format!("no evidence kept for {node}\n");
    }
    let mut out = String::new();
    for k in kept {
        let bundle = &k.bundle;
        out.push_str(&format!(
            "# workflow {} ({}) on {}, boot {}: gathered in {} ms\n",
            k.workflow, k.action, k.node, bundle.boot_id, bundle.took_ms
        ));
        for item in &bundle.items {
            let mut notes = vec![format!("{} bytes", item.bytes)];
            if item.truncated {
                notes.push("newest part kept".to_owned());
            }
            if let Some(error) = &item.error {
                notes.push(error.clone());
            }
            out.push_str(&format!("## {} — {} ({})\n", item.name, item.source, notes.join("; ")));
            if item.encoding == "text" {
                out.push_str(&item.content);
                if !item.content.ends_with('\n') && !item.content.is_empty() {
                    out.push('\n');
                }
            } else if !item.content.is_empty() {
                out.push_str(&format!(
                    "({} content, {} characters: see --output json)\n",
                    item.encoding,
                    item.content.len()
                ));
            }
        }
        out.push('\n');
    }
    out
}

/// A moment of `fleetmend export-faults --since/--until`, unix ms: a duration before `now_ms`
/// (`30d`, `12h`) or an RFC 3339 time (`2026-01-01T00:00:00Z`).
pub fn parse_moment(text: &str, now_ms: u64) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(ago) = humantime::parse_duration(text) {
        let ago_ms = u64::try_from(ago.as_millis()).unwrap_or(u64::MAX);
        return Ok(now_ms.saturating_sub(ago_ms));
    }
    let at = humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!(
            "{text:?} is neither a duration ago (30d) nor an RFC 3339 time (2026-01-01T00:00:00Z)"
        )
    })?;
    let since_epoch =
        at.duration_since(std::time::UNIX_EPOCH).map_err(|_| format!("{text:?} is before 1970"))?;
    Ok(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
}

fn pretty(value: &impl serde::Serialize) -> String {
    let value = serde_json::to_value(value).unwrap_or_default();
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

fn table(rows: Vec<Vec<String>>) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count() + 2));
            }
        }
        out.push('\n');
    }
    out
}

fn ago(now_ms: u64, then_ms: u64) -> String {
    let secs = now_ms.saturating_sub(then_ms) / 1000;
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    }
}

/// `fleetmend nodes` as a table; a node outside the inventory is in the state `unknown`.
pub fn nodes_table(nodes: &[NodeSummary], now_ms: u64) -> String {
    let mut rows = vec![
        ["NODE", "STATE", "SINCE", "LAST REPORT", "FAILING", "WORKFLOW"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for n in nodes {
        // A node outside the inventory is shown, never acted on: its state says nothing.
        let state = if n.unknown { "unknown".to_owned() } else { n.state.to_string() };
        rows.push(vec![
            n.name.clone(),
            state,
            ago(now_ms, n.state_since_ms),
            ago(now_ms, n.last_report_ms),
            n.failing.to_string(),
            n.workflow.map(|w| w.to_string()).unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    table(rows)
}

/// `fleetmend events` as a table.
pub fn events_table(events: &[Event]) -> String {
    let mut rows = vec![
        ["ID", "AT (ms)", "NODE", "KIND", "CHANGE", "ACTOR", "REASON"].map(str::to_owned).to_vec(),
    ];
    for e in events {
        let change = match (e.from_state, e.to_state, e.action) {
            (Some(from), Some(to), _) => format!("{from} → {to}"),
            (_, _, Some(action)) => action.to_string(),
            _ => "-".to_owned(),
        };
        rows.push(vec![
            e.id.to_string(),
            e.at_ms.to_string(),
            e.node.clone().unwrap_or_else(|| "-".to_owned()),
            e.kind.as_str().to_owned(),
            change,
            e.actor.to_string(),
            e.reason.replace('\n', " "),
        ]);
    }
    table(rows)
}

/// `fleetmend jobs` as a table.
pub fn jobs_table(jobs: &[JobView]) -> String {
    let mut rows = vec![
        [
            "ID",
            "NAME",
            "STATE",
            "PRIORITY",
            "NODES",
            "STEP",
            "LOSS",
            "RESTARTS",
            "GOODPUT",
            "CHECKPOINT EVERY",
            "WHY",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for view in jobs {
        let job = &view.job;
        let interval = match (job.spec.checkpoint_every, job.checkpoint_interval) {
            (Some(CheckpointEvery::Auto), Some(steps)) => format!("auto ({steps})"),
            (Some(CheckpointEvery::Auto), None) => "auto (measuring)".to_owned(),
            (Some(CheckpointEvery::Steps(steps)), _) => steps.to_string(),
            (None, _) => "-".to_owned(),
        };
        rows.push(vec![
            job.id.clone(),
            job.name.clone(),
            job.state.to_string(),
            job.spec.priority.to_string(),
            job.spec.nodes.to_string(),
            view.step.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            view.loss.map_or_else(|| "-".to_owned(), |l| format!("{l:.4}")),
            format!("{}/{}", job.restarts, job.spec.max_restarts),
            format!("{:.0}%", view.goodput_ratio * 100.0),
            interval,
            // What a queued or stopping job waits for (a long wait for nodes names the nodes
            // that are out); a running job has nothing to say.
            if job.state == JobState::Running { String::new() } else { job.reason.clone() },
        ]);
    }
    table(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeState;

    #[test]
    fn moments_are_a_duration_ago_or_a_time() {
        let now = 1_767_225_600_000;
        assert_eq!(parse_moment("30d", now), Ok(now - 30 * 86_400_000));
        assert_eq!(parse_moment(" 90m ", now), Ok(now - 90 * 60_000));
        assert_eq!(parse_moment("2026-01-01T00:00:00Z", 0), Ok(1_767_225_600_000));
        assert_eq!(parse_moment("0s", now), Ok(now));
        assert_eq!(parse_moment("100000days", 5), Ok(0));
        let err = parse_moment("last month", now).unwrap_err();
        assert!(err.contains("neither a duration ago"), "{err}");
    }

    #[test]
    fn node_table_aligns_columns() {
        let draining = NodeSummary {
            name: "gpu-node-017".into(),
            state: NodeState::Draining,
            state_since_ms: 0,
            last_report_ms: 5_000,
            boot_id: "b".into(),
            failing: 2,
            workflow: Some(7),
            unknown: false,
        };
        let invented = NodeSummary {
            name: "made-up-1".into(),
            state: NodeState::Healthy,
            workflow: None,
            unknown: true,
            ..draining.clone()
        };
        let text = nodes_table(&[draining, invented], 10_000);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NODE          STATE"), "{text}");
        assert!(lines[1].contains("draining") && lines[1].contains(" 7"), "{text}");
        assert!(lines[2].starts_with("made-up-1     unknown "), "{text}");
    }

    #[test]
    fn jobs_table_shows_progress_restarts_goodput_and_the_interval() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "argv": ["fleetmend", "train"], "nodes": 4, "priority": 2,
            "checkpoint_dir": "/ckpt", "max_restarts": 10, "checkpoint_every": "auto"
        }))
        .unwrap();
        let job: crate::queue::Job = serde_json::from_value(serde_json::json!({
            "id": "j-3", "seq": 3, "name": "fleetmend", "spec": spec, "submitted_ms": 0,
            "state": "running", "state_since_ms": 0, "reason": "", "attempt": 1, "restarts": 1,
            "nodes": [], "master_addr": null, "master_port": null, "ranks": [], "history": [],
            "goodput": { "productive_ms": 0, "high_water_step": 0, "steps_lost_total": 0 },
            "measured": {}, "checkpoint_interval": 120
        }))
        .unwrap();
        let waiting = crate::queue::Job {
            id: "j-4".into(),
            state: JobState::Queued,
            reason: "waits for 4 eligible node(s): 3 free; out: n2 (drained: fleetmend: nic)"
                .into(),
            ..job.clone()
        };
        let view = JobView { job, step: Some(640), loss: Some(2.5), goodput_ratio: 0.873 };
        let queued = JobView { job: waiting, step: None, loss: None, goodput_ratio: 0.5 };
        let text = jobs_table(&[view, queued]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID   NAME       STATE"), "{text}");
        for cell in ["j-3", "running", "640", "2.5000", "1/10", "87%", "auto (120)"] {
            assert!(lines[1].contains(cell), "{cell} missing: {text}");
        }
        assert!(lines[2].ends_with("3 free; out: n2 (drained: fleetmend: nic)"), "{text}");
    }
}
