//! The repairer's HTTP surface: agent reports, inbound alert webhooks, the admin API, `/metrics`.
//!
//! Agents and alert sources authenticate with bearer tokens, people with named credentials whose
//! role opens some routes and not others ([`crate::access`]). Bodies are size-limited and every
//! collection and string in them bounded ([`fleetmend_proto::bounds`]); a malformed or
//! unauthenticated request gets a 4xx naming what is wrong, is counted, and changes nothing. Every
//! error, axum's own refusals included, is `{"error": "..."}`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleetmend_proto::{Report, WIRE_VERSION};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::access::Role;
use crate::alerts::Alerts;
use crate::config::Tokens;
use crate::engine::{Engine, EngineError, NodeRecord};
use crate::inbound::InboundConfig;
use crate::leadership::Leadership;
use crate::limits::Caller;
use crate::model::{Event, RuleAction};
use crate::workflow::{KeptEvidence, Workflow};
use auth::{gate, report_sender};
use body::{parse_json, read_json_body};
use rejections::{Path, Query};

mod alerts;
mod auth;
mod body;
use alerts::*;
mod history;
mod jobs;
use jobs::*;
mod leader;
mod metrics;
pub mod openapi;
mod rejections;
mod throttle;

/// Shared state of the handlers.
pub struct ApiState {
    pub engine: Arc<Engine>,
    /// The embedded job queue, when `scheduler = "embedded"`.
    pub queue: Option<Arc<crate::queue::JobQueue>>,
    pub alerts: Option<Arc<Alerts>>,
    /// This repairer's place among those sharing its store (PostgreSQL); `None` on SQLite, where
    /// it always leads.
    pub leadership: Option<Arc<Leadership>>,
    /// What is kept while the parts above are built again (a standby's, then the leader's).
    pub shared: ApiShared,
}

/// The API's credentials, counters and rate limits: made once per process and kept when its
/// parts are built again.
#[derive(Clone)]
pub struct ApiShared {
    pub tokens: Tokens,
    /// Per-node identity (`node_tokens_file`): a report only with its node's own token.
    pub node_tokens: Option<Arc<crate::identity::NodeTokens>>,
    pub inbound: InboundConfig,
    pub max_body_bytes: usize,
    /// `fleetmend_reports_received_total{outcome}`.
    pub reports: Arc<ReportCounters>,
    /// `fleetmend_api_refused_total{status}`: requests other than reports refused for their
    /// credential.
    pub refused: Arc<RefusedCounters>,
    /// SNS subscription confirmations waiting for an operator.
    pub subscriptions: Arc<Mutex<Vec<Subscription>>>,
    /// Each caller's rate (`[rate_limits]`).
    pub limits: Arc<crate::limits::RateLimits>,
    /// The listener's connection counts, for `/metrics`.
    pub listener: Arc<fleetmend_listener::ListenerStats>,
}

impl ApiShared {
    pub fn new(
        config: &crate::config::RepairerConfig,
        tokens: Tokens,
        node_tokens: Option<Arc<crate::identity::NodeTokens>>,
    ) -> ApiShared {
        ApiShared {
            tokens,
            node_tokens,
            inbound: config.inbound.clone(),
            max_body_bytes: config.max_body_bytes,
            reports: Arc::default(),
            refused: Arc::default(),
            subscriptions: Arc::default(),
            limits: Arc::new(crate::limits::RateLimits::new(&config.rate_limits)),
            listener: Arc::default(),
        }
    }
}

impl std::fmt::Debug for ApiShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiShared")
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for ApiState {
    type Target = ApiShared;

    fn deref(&self) -> &ApiShared {
        &self.shared
    }
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").finish_non_exhaustive()
    }
}

/// Reports by outcome.
#[derive(Debug, Default)]
pub struct ReportCounters {
    pub ok: AtomicU64,
    pub malformed: AtomicU64,
    pub unauthorized: AtomicU64,
    /// With another node's credential.
    pub forbidden: AtomicU64,
    /// From a node outside the inventory, refused (`unknown_nodes = "refuse"`, or beyond
    /// `max_unknown`).
    pub unknown_refused: AtomicU64,
    /// From a node outside the inventory, taken in as unknown (`unknown_nodes = "admit"`).
    pub unknown_admitted: AtomicU64,
    pub failed: AtomicU64,
}

/// Requests refused for their credential: none or unknown (401), known but not allowed (403), or
/// beyond its rate (429, every route, reports included).
#[derive(Debug, Default)]
pub struct RefusedCounters {
    pub unauthorized: AtomicU64,
    pub forbidden: AtomicU64,
    pub throttled: AtomicU64,
}

impl RefusedCounters {
    fn count(&self, err: &ApiError) {
        match err.0 {
            StatusCode::UNAUTHORIZED => self.unauthorized.fetch_add(1, Ordering::Relaxed),
            StatusCode::FORBIDDEN => self.forbidden.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }
}

/// An SNS subscription the operator must confirm (the repairer never fetches URLs itself).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Subscription {
    pub topic_arn: String,
    pub subscribe_url: String,
    pub received_ms: u64,
}

/// An error answer: a status and a sentence.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> ApiError {
        let status = match &err {
            EngineError::UnknownNode(_) => StatusCode::NOT_FOUND,
            EngineError::Refused(_) => StatusCode::CONFLICT,
            EngineError::NotInInventory(_) | EngineError::TooManyUnknown { .. } => {
                StatusCode::FORBIDDEN
            }
            EngineError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, err.to_string())
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// Every route with its operation: the router and the OpenAPI document are made of these.
pub(crate) fn routes() -> OpenApiRouter<Arc<ApiState>> {
    OpenApiRouter::new()
        .routes(routes!(report))
        .routes(routes!(alertmanager))
        .routes(routes!(cloudwatch))
        .routes(routes!(list_nodes))
        .routes(routes!(node_detail))
        .routes(routes!(node_evidence))
        .routes(routes!(drain))
        .routes(routes!(undrain))
        .routes(routes!(repair))
        .routes(routes!(approve))
        .routes(routes!(events))
        .routes(routes!(history::history_faults))
        .routes(routes!(breaker))
        .routes(routes!(close_breaker))
        .routes(routes!(subscriptions))
        .routes(routes!(prometheus_sd))
        .routes(routes!(list_jobs, submit_job))
        .routes(routes!(job_detail))
        .routes(routes!(cancel_job))
        .routes(routes!(job_progress))
        .routes(routes!(openapi))
        .routes(routes!(metrics::metrics))
        .routes(routes!(healthz))
        .routes(routes!(leader::leader_view))
}

pub fn router(state: Arc<ApiState>) -> Router {
    let limit = state.max_body_bytes;
    let (routes, _) = routes().split_for_parts();
    routes
        // After every route: it applies to the routes there are.
        .method_not_allowed_fallback(rejections::method_not_allowed)
        .fallback(rejections::no_route)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), leader::writes_to_the_leader))
        .layer(axum::middleware::from_fn_with_state(state.clone(), throttle::by_caller))
        .with_state(state)
}

#[utoipa::path(
    post,
    path = "/v1/reports",
    summary = "An agent's report; the reply carries commands for the node",
    request_body(content = fleetmend_proto::Report, content_type = "application/json"),
    responses(
        (status = 200, description = "taken", body = fleetmend_proto::ReportReply),
        (status = 400, description = "malformed, or past a bound (the message names the field)", body = crate::api::openapi::Error),
        crate::api::openapi::BodyRefused,
        crate::api::openapi::AgentRefused
    ),
    extensions(("x-fleetmend-role" = json!("agent")))
)]
async fn report(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let sender = report_sender(&state, &headers).inspect_err(|_| {
        state.reports.unauthorized.fetch_add(1, Ordering::Relaxed);
    })?;
    // An oversized body counts as malformed: it is not a report this repairer accepts.
    let body = read_json_body(&headers, body, state.max_body_bytes).inspect_err(|_| {
        state.reports.malformed.fetch_add(1, Ordering::Relaxed);
    })?;
    let report: Report = parse_json(&body).map_err(|err| {
        state.reports.malformed.fetch_add(1, Ordering::Relaxed);
        bad_request(format!("malformed report: {err}"))
    })?;
    if let Err(why) = check_report(&report) {
        state.reports.malformed.fetch_add(1, Ordering::Relaxed);
        return Err(bad_request(why));
    }
    // With a node's own token the middleware counted it already; with the shared agent token (or
    // none) the node is known only now.
    if sender.is_none()
        && let Err(throttled) = throttle::check(&state, &Caller::Node(report.node.clone()))
    {
        return Ok(throttled.into_response());
    }
    if let Some(sender) = sender
        && sender != report.node
    {
        state.reports.forbidden.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(credential = %sender, node = %report.node, "a report for another node's name refused");
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "this credential is node {sender}'s: it may not report for node {}",
                report.node
            ),
        ));
    }
    match state.engine.take_report(&report) {
        Ok((reply, unknown)) => {
            let counter = if unknown { &state.reports.unknown_admitted } else { &state.reports.ok };
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(axum::Json(reply).into_response())
        }
        Err(err @ (EngineError::NotInInventory(_) | EngineError::TooManyUnknown { .. })) => {
            state.reports.unknown_refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(node = %report.node, "a report from a node outside the inventory refused");
            Err(err.into())
        }
        Err(err) => {
            state.reports.failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(node = %report.node, error = %err, "ingesting a report failed");
            Err(err.into())
        }
    }
}

/// Checks what serde cannot: names and sizes (every bound of [`fleetmend_proto::bounds`]).
pub(crate) fn check_report(report: &Report) -> Result<(), String> {
    if report.wire_version != WIRE_VERSION {
        return Err(format!(
            "wire_version {} is not supported (this repairer speaks {WIRE_VERSION})",
            report.wire_version
        ));
    }
    if !crate::identity::is_node_name(&report.node) {
        return Err(format!(
            "node: {:?} is not a node name (letters, digits, - . _; at most 253)",
            report.node
        ));
    }
    fleetmend_proto::bounds::check_report(report).map_err(|err| err.to_string())
}

#[utoipa::path(
    get,
    path = "/v1/nodes",
    summary = "Every node",
    responses(
        (status = 200, description = "the nodes", body = Vec<crate::engine::NodeSummary>),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
async fn list_nodes(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "list nodes")?;
    Ok(axum::Json(state.engine.summaries()).into_response())
}

/// One target group of Prometheus HTTP service discovery (`http_sd_configs`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TargetGroup {
    pub targets: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// `GET /v1/sd/prometheus`: every node's agent (labels `node`, `state`, `component="agent"`) and
/// the repairer itself (`component="repairer"`), for Prometheus's `http_sd_configs`. Retired
/// nodes are left out: they are gone, and scraping them would only fire agent-down alerts.
///
/// The repairer's own target is the `Host` the request was sent to: the address Prometheus
/// reaches it at, which the repairer's listen address (often 0.0.0.0) does not tell.
#[utoipa::path(
    get,
    path = "/v1/sd/prometheus",
    summary = "Prometheus HTTP service discovery (http_sd_configs): one target group per node whose agent told its metrics port (labels node, state, component=agent; retired nodes left out), and the repairer itself at the Host the request named (component=repairer)",
    responses(
        (status = 200, description = "the target groups", body = Vec<TargetGroup>),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
async fn prometheus_sd(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "read service discovery")?;
    let mut groups: Vec<TargetGroup> = state
        .engine
        .scrape_targets()
        .into_iter()
        .filter(|(_, node_state, _)| *node_state != crate::model::NodeState::Retired)
        .map(|(node, node_state, target)| TargetGroup {
            targets: vec![target],
            labels: BTreeMap::from([
                ("component".to_owned(), "agent".to_owned()),
                ("node".to_owned(), node),
                ("state".to_owned(), node_state.as_str().to_owned()),
            ]),
        })
        .collect();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_graphic() && c != '/'));
    if let Some(host) = host {
        groups.push(TargetGroup {
            targets: vec![host.to_owned()],
            labels: BTreeMap::from([("component".to_owned(), "repairer".to_owned())]),
        });
    }
    Ok(axum::Json(groups).into_response())
}

/// A node with its findings, history and recent workflows and events.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeDetail {
    /// The node's record: state, findings tracked, repair history.
    #[schema(value_type = Object)]
    pub node: NodeRecord,
    /// Its newest workflows.
    #[schema(value_type = Vec<Object>)]
    pub workflows: Vec<Workflow>,
    pub events: Vec<Event>,
}

#[utoipa::path(
    get,
    path = "/v1/nodes/{name}",
    summary = "One node with its findings, history, workflows and recent events",
    params(("name" = String, Path, description = "the node's name")),
    responses(
        (status = 200, description = "the node", body = NodeDetail),
        (status = 400, description = "the path parameter does not read (not UTF-8 once decoded)", body = crate::api::openapi::Error),
        (status = 404, description = "no node of that name", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
async fn node_detail(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "read a node")?;
    let node = state
        .engine
        .node(&name)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no node named {name}")))?;
    let store = state.engine.store();
    let internal =
        |e: crate::store::StoreError| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let workflows = store.workflows_of(&name, 10).map_err(internal)?;
    let mut events = store.events(0, Some(&name), 10_000).map_err(internal)?;
    let keep = events.len().saturating_sub(50);
    events.drain(..keep);
    Ok(axum::Json(NodeDetail { node, workflows, events }).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct EvidenceQuery {
    /// Bundles to return, newest first (default 10).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<usize>,
}

/// Bundles returned at most (each up to the agent's bundle cap).
pub(crate) const EVIDENCE_LIMIT: usize = 100;

#[utoipa::path(
    get,
    path = "/v1/nodes/{name}/evidence",
    summary = "The evidence bundles gathered on the node before its disruptive repairs, newest first",
    params(("name" = String, Path, description = "the node's name"), EvidenceQuery),
    responses(
        (status = 200, description = "the bundles", body = Vec<crate::workflow::KeptEvidence>),
        (status = 400, description = "a path parameter or ?limit= that does not read, or a limit out of range", body = crate::api::openapi::Error),
        (status = 404, description = "no node of that name", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
async fn node_evidence(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(query): Query<EvidenceQuery>,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "read evidence")?;
    if state.engine.node(&name).is_none() {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("no node named {name}")));
    }
    let limit = query.limit.unwrap_or(10);
    if !(1..=EVIDENCE_LIMIT).contains(&limit) {
        let message = format!("limit must be between 1 and {EVIDENCE_LIMIT}");
        return Err(ApiError(StatusCode::BAD_REQUEST, message));
    }
    let kept: Vec<KeptEvidence> = state
        .engine
        .store()
        .evidence_of(&name, limit)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(axum::Json(kept).into_response())
}

/// The body of repair and approve.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct ActionBody {
    action: Option<RuleAction>,
}

/// The body of repair: the action to take.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema: repair reads an [`ActionBody`] and requires its action
struct RepairBody {
    action: RuleAction,
}

/// The workflow a request started.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct WorkflowStarted {
    workflow: i64,
}

/// What an undrain did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct UndrainOutcome {
    outcome: String,
}

/// The `{"action": ...}` body of repair and approve; an empty body names no action.
fn read_action(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Option<RuleAction>, ApiError> {
    let body = read_json_body(headers, body, limit)?;
    if body.is_empty() {
        return Ok(None);
    }
    // `null` names no action, as an empty body does. Only an object is an action body (serde
    // would also read a struct from an array, which the document does not allow).
    let expected = |e: String| {
        bad_request(format!("expected {{\"action\": \"drain\"|\"reboot\"|\"replace\"}}: {e}"))
    };
    let value: serde_json::Value = parse_json(&body).map_err(|e| expected(e.to_string()))?;
    if value.is_null() {
        return Ok(None);
    }
    if !value.is_object() {
        return Err(expected("not an object".to_owned()));
    }
    let body: ActionBody = serde_json::from_value(value).map_err(|e| expected(e.to_string()))?;
    Ok(body.action)
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/drain",
    summary = "Drain the node (a person): it stays drained until a person undrains it",
    params(("name" = String, Path, description = "the node's name")),
    responses(
        (status = 200, description = "the drain workflow", body = WorkflowStarted),
        (status = 400, description = "the path parameter does not read (not UTF-8 once decoded)", body = crate::api::openapi::Error),
        (status = 404, description = "no node of that name", body = crate::api::openapi::Error),
        (status = 409, description = "refused: a guard rail, or the node's state does not allow it", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("operator")))
)]
async fn drain(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let actor = gate(&state, &headers, Role::Operator, "drain")?;
    let id = state.engine.drain(&name, &actor)?;
    Ok(axum::Json(WorkflowStarted { workflow: id }).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/undrain",
    summary = "Return a node a person drained to service",
    params(("name" = String, Path, description = "the node's name")),
    responses(
        (status = 200, description = "what came of it", body = UndrainOutcome),
        (status = 400, description = "the path parameter does not read (not UTF-8 once decoded)", body = crate::api::openapi::Error),
        (status = 404, description = "no node of that name", body = crate::api::openapi::Error),
        (status = 409, description = "refused: the node is not drained by a person, or its state does not allow it", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("operator")))
)]
async fn undrain(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let actor = gate(&state, &headers, Role::Operator, "undrain")?;
    let outcome = state.engine.undrain(&name, &actor).await?;
    Ok(axum::Json(UndrainOutcome { outcome: format!("{outcome:?}") }).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/repair",
    summary = "Start a repair of the node (a person)",
    params(("name" = String, Path, description = "the node's name")),
    request_body(content = RepairBody, content_type = "application/json"),
    responses(
        (status = 200, description = "the repair workflow", body = WorkflowStarted),
        (status = 400, description = "the path parameter or body does not read, or names no action", body = crate::api::openapi::Error),
        (status = 404, description = "no node of that name", body = crate::api::openapi::Error),
        (status = 409, description = "refused: a guard rail, or the node's state does not allow it", body = crate::api::openapi::Error),
        crate::api::openapi::BodyRefused,
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("operator")))
)]
async fn repair(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let actor = gate(&state, &headers, Role::Operator, "repair")?;
    let action = read_action(&headers, body, state.max_body_bytes)?
        .ok_or_else(|| bad_request("action is required"))?;
    let id = state.engine.request_repair(&name, action, &actor)?;
    Ok(axum::Json(WorkflowStarted { workflow: id }).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/approve",
    summary = "Approve a repair the policy holds for a person (default: replace)",
    params(("name" = String, Path, description = "the node's name")),
    request_body(content = Option<ActionBody>, content_type = "application/json", description = "empty: replace"),
    responses(
        (status = 204, description = "approved"),
        (status = 400, description = "the path parameter or body does not read", body = crate::api::openapi::Error),
        (status = 404, description = "no node of that name", body = crate::api::openapi::Error),
        (status = 409, description = "refused: nothing waits for this approval", body = crate::api::openapi::Error),
        crate::api::openapi::BodyRefused,
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("operator")))
)]
async fn approve(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let actor = gate(&state, &headers, Role::Operator, "approve")?;
    let action = read_action(&headers, body, state.max_body_bytes)?.unwrap_or(RuleAction::Replace);
    state.engine.approve(&name, action, &actor)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Events with a greater id only.
    after: Option<i64>,
    /// Of this node only.
    node: Option<String>,
    /// At most this many (default 500; more than 10000 is 10000).
    #[param(value_type = Option<u64>)] // a usize, which the derive gives no format nor range
    limit: Option<usize>,
}

#[utoipa::path(
    get,
    path = "/v1/events",
    summary = "The audit trail, oldest first",
    params(EventsQuery),
    responses(
        (status = 200, description = "the events", body = Vec<crate::model::Event>),
        (status = 400, description = "a query parameter that does not read", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
async fn events(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "read events")?;
    let limit = query.limit.unwrap_or(500).min(10_000);
    let events = state
        .engine
        .store()
        .events(query.after.unwrap_or(0), query.node.as_deref(), limit)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(axum::Json(events).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/breaker",
    summary = "The breaker",
    responses(
        (status = 200, description = "its state", body = crate::breaker::BreakerState),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
async fn breaker(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "read the breaker")?;
    Ok(axum::Json(state.engine.breaker()).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/breaker/close",
    summary = "Close the breaker (a person)",
    responses(
        (status = 200, description = "its state", body = crate::breaker::BreakerState),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("operator")))
)]
async fn close_breaker(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let actor = gate(&state, &headers, Role::Operator, "close the breaker")?;
    Ok(axum::Json(state.engine.close_breaker(&actor)?).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/subscriptions",
    summary = "SNS subscription confirmations waiting for an operator",
    responses(
        (status = 200, description = "the confirmations", body = Vec<Subscription>),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("admin")))
)]
async fn subscriptions(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Admin, "read SNS subscriptions")?;
    let list = state.subscriptions.lock().map(|l| l.clone()).unwrap_or_default();
    Ok(axum::Json(list).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    summary = "This document",
    responses(
        (status = 200, description = "OpenAPI 3.1", body = Object),
        (status = 500, description = "the document could not be made", body = crate::api::openapi::Error),
        crate::api::openapi::OpenRefused
    ),
    security(()),
    extensions(("x-fleetmend-role" = json!("none")))
)]
async fn openapi() -> Response {
    match crate::api::openapi::served() {
        Ok(doc) => ([(header::CONTENT_TYPE, "application/json")], doc.as_str()).into_response(),
        Err(err) => ApiError(StatusCode::INTERNAL_SERVER_ERROR, err.clone()).into_response(),
    }
}

#[utoipa::path(
    get,
    path = "/healthz",
    summary = "Liveness",
    responses(
        (status = 200, description = "up", body = String, content_type = "text/plain; charset=utf-8"),
        crate::api::openapi::OpenRefused
    ),
    security(()),
    extensions(("x-fleetmend-role" = json!("none")))
)]
async fn healthz() -> &'static str {
    "ok\n"
}
