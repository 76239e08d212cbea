//! The agent's HTTP endpoints: `/metrics`, `/healthz`, `/v1/health`.
//!
//! A scrape only encodes the newest results; it never runs a check, so a hung probe cannot make a
//! scrape hang and a scrape costs microseconds of CPU.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
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
        .with_state(state)
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
