//! Leadership on the API: `GET /v1/leader`, and a standby's answer to every write — 503 with
//! `Retry-After`, the leader's URL in `Fleetmend-Leader` and the body, which agents and the CLI
//! follow to the leader ([`crate::leadership`]).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use fleetmend_proto::repairers::LEADER_HEADER;

use super::ApiState;
use crate::leadership::{LeaderView, Role};

/// The middleware: on a repairer that does not lead, every request but a read is answered with
/// the leader's address and changes nothing.
pub(super) async fn writes_to_the_leader(
    State(state): State<Arc<ApiState>>,
    request: Request,
    next: Next,
) -> Response {
    let read = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    match &state.leadership {
        Some(leadership) if !read && leadership.role() != Role::Leader => {
            let leader = leadership.leader_elsewhere();
            let error = match &leader {
                Some(url) => {
                    format!("this repairer is a standby: send writes to the leader, {url}")
                }
                None => "this repairer is a standby and no repairer leads right now: try again"
                    .to_owned(),
            };
            let body = serde_json::json!({ "error": error, "leader": leader });
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            let retry = leadership.config().poll.as_secs().max(1);
            let headers = response.headers_mut();
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry));
            if let Some(value) = leader.and_then(|url| HeaderValue::from_str(&url).ok()) {
                headers.insert(LEADER_HEADER, value);
            }
            response
        }
        _ => next.run(request).await,
    }
}

/// Who leads: on SQLite this repairer, always.
pub(super) fn view(state: &ApiState, this: Option<String>) -> LeaderView {
    match &state.leadership {
        Some(leadership) => leadership.view(),
        None => LeaderView::alone(this.unwrap_or_default()),
    }
}

#[utoipa::path(
    get,
    path = "/v1/leader",
    summary = "Which repairer leads the shared store, its epoch and when its lease ends (a repairer on SQLite always leads). A standby answers every other write 503 with Retry-After and the leader's URL in Fleetmend-Leader and the body",
    responses(
        (status = 200, description = "the leader", body = crate::leadership::LeaderView),
        crate::api::openapi::OpenRefused
    ),
    security(()),
    extensions(("x-fleetmend-role" = json!("none")))
)]
pub(super) async fn leader_view(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Response {
    // On SQLite, this repairer as the client reached it.
    let this =
        headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(|h| format!("http://{h}"));
    axum::Json(view(&state, this)).into_response()
}
