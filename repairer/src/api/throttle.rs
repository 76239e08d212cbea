//! Each caller's rate ([`crate::limits`]): a request beyond it is answered 429 with `Retry-After`
//! and the API's JSON error body, counted in `fleetmend_api_refused_total{status="429"}`, before
//! its body is read or anything changes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use fleetmend_listener::PeerAddr;

use super::ApiState;
use super::auth::caller;
use crate::limits::{Caller, Throttled};

/// The middleware: counts the request against its caller, known from its credential (a report
/// with the shared agent token, or none, is counted by its node in the handler).
pub(super) async fn by_caller(
    State(state): State<Arc<ApiState>>,
    request: Request,
    next: Next,
) -> Response {
    let peer = request.extensions().get::<PeerAddr>().map(|p| p.0.ip());
    if let Some(caller) = caller(&state, request.headers(), request.uri(), peer)
        && let Err(throttled) = check(&state, &caller)
    {
        return throttled.into_response();
    }
    next.run(request).await
}

/// Counts one request of `caller`; beyond its rate, the answer to give.
pub(super) fn check(state: &ApiState, caller: &Caller) -> Result<(), TooMany> {
    state.limits.check(caller).map_err(|throttled| {
        state.refused.throttled.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(caller = %throttled.caller, "request beyond its caller's rate");
        TooMany(throttled)
    })
}

/// A 429 with `Retry-After` and `{"error": "..."}`.
#[derive(Debug)]
pub(super) struct TooMany(Throttled);

impl IntoResponse for TooMany {
    fn into_response(self) -> Response {
        let Throttled { caller, retry_after_secs } = self.0;
        let message = format!(
            "too many requests from {caller}: beyond its rate (rate_limits); retry after {retry_after_secs} s"
        );
        let mut response =
            (StatusCode::TOO_MANY_REQUESTS, axum::Json(serde_json::json!({ "error": message })))
                .into_response();
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        response
    }
}
