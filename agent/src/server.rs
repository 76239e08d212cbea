//! The agent's HTTP endpoints: `/metrics`, `/healthz`, `/v1/health`.
//!
//! A scrape only encodes the newest results; it never runs a check, so a hung probe cannot make a
//! scrape hang and a scrape costs microseconds of CPU. A path it does not serve, or a method a
//! path does not take, is answered as the repairer answers one: `{"error": "..."}` with 404 or 405
//! (and `Allow`).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics;
use crate::runner::AgentState;

/// Prometheus text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn router(state: Arc<AgentState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/v1/health", get(health))
        // After every route: it applies to the routes there are.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_route)
        .with_state(state)
}

/// An error answer in the API's shape.
fn error(status: StatusCode, message: String) -> impl IntoResponse {
    (status, axum::Json(serde_json::json!({ "error": message })))
}

/// The router's fallback: no route has this path.
async fn no_route(method: Method, uri: Uri) -> impl IntoResponse {
    error(StatusCode::NOT_FOUND, format!("no route for {method} {}", uri.path()))
}

/// The routes' fallback for a method they do not take (axum adds the `Allow` header).
async fn method_not_allowed(method: Method, uri: Uri) -> impl IntoResponse {
    error(StatusCode::METHOD_NOT_ALLOWED, format!("{} does not take {method}", uri.path()))
}

async fn metrics_page(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], metrics::encode(&state.samples()))
}

/// Liveness: the process serves requests. Node health is `/v1/health`.
async fn healthz() -> &'static str {
    "ok\n"
}

async fn health(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    axum::Json(state.health())
}
