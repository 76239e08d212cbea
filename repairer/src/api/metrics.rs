//! `GET /metrics`: the repairer's state, counters and leadership in Prometheus text format
//! ([`crate::exposition`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::{ApiState, leader};

#[utoipa::path(
    get,
    path = "/metrics",
    summary = "Prometheus metrics",
    responses(
        (status = 200, description = "text format 0.0.4", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
        crate::api::openapi::OpenRefused
    ),
    security(()),
    extensions(("x-fleetmend-role" = json!("none")))
)]
pub(super) async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    let mut outcomes = BTreeMap::new();
    outcomes.insert("ok", state.reports.ok.load(Ordering::Relaxed));
    outcomes.insert("malformed", state.reports.malformed.load(Ordering::Relaxed));
    outcomes.insert("unauthorized", state.reports.unauthorized.load(Ordering::Relaxed));
    outcomes.insert("forbidden", state.reports.forbidden.load(Ordering::Relaxed));
    if state.engine.inventory().is_some() {
        let reports = &state.reports;
        outcomes.insert("unknown_refused", reports.unknown_refused.load(Ordering::Relaxed));
        outcomes.insert("unknown_admitted", reports.unknown_admitted.load(Ordering::Relaxed));
    }
    outcomes.insert("error", state.reports.failed.load(Ordering::Relaxed));
    let refused = [
        ("401", state.refused.unauthorized.load(Ordering::Relaxed)),
        ("403", state.refused.forbidden.load(Ordering::Relaxed)),
        ("429", state.refused.throttled.load(Ordering::Relaxed)),
    ];
    let body = crate::exposition::encode(&crate::exposition::Snapshot {
        node_states: state.engine.state_counts(),
        breaker_open: state.engine.breaker().open,
        metrics: &state.engine.metrics,
        alerts: state.alerts.as_deref(),
        reports: &outcomes,
        refused: &refused,
        queue: state.queue.as_ref().map(|q| q.metrics()),
        listener: &state.listener,
        inventory: state.engine.inventory().map(|i| i.figures()),
        nodes_unknown: state.engine.unknown_count(),
        leader: leader::view(&state, None),
    });
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}
