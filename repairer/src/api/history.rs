//! `GET /v1/history/faults`: the failure history of a window, for `fleetmend simulate --replay`
//! ([`crate::history`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::rejections::Query;
use super::{ApiError, ApiState, auth::gate};
use crate::access::Role;
use crate::history::{DEFAULT_LIMIT, HistoryError, MAX_LIMIT};

/// The window when `since` is not given: the 30 days before `until`.
const DEFAULT_WINDOW_MS: u64 = 30 * 86_400_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct HistoryQuery {
    /// Faults first decided about at or after this time, unix ms (default: 30 days before
    /// `until`).
    since: Option<u64>,
    /// ... and before this time, unix ms (default: now; at or before `since`: an empty window).
    until: Option<u64>,
    /// At most this many faults (default 10000, at most 100000): a window with more is a 422.
    #[param(value_type = Option<u64>, minimum = 1, maximum = 100000)]
    limit: Option<usize>,
}

#[utoipa::path(
    get,
    path = "/v1/history/faults",
    summary = "The failure history: every fault that reached a decision in a window (its time, node, finding, the decisions, the repairs that followed), a versioned document that `fleetmend simulate --replay` replays",
    params(HistoryQuery),
    responses(
        (status = 200, description = "the faults", body = crate::history::FaultHistory),
        (status = 400, description = "a query parameter that does not read, or a limit out of range", body = crate::api::openapi::Error),
        (status = 422, description = "the window holds more faults than the limit, or more events than an export reads: ask for a shorter window", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
pub(super) async fn history_faults(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Query(query): Query<HistoryQuery>,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "read the failure history")?;
    let until = query.until.unwrap_or_else(|| state.engine.clock().now_ms());
    let since = query.since.unwrap_or_else(|| until.saturating_sub(DEFAULT_WINDOW_MS));
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("limit must be between 1 and {MAX_LIMIT}"),
        ));
    }
    let store = state.engine.store().clone();
    // A month of a large fleet's trail is read here: off the threads that serve requests.
    let read =
        tokio::task::spawn_blocking(move || crate::history::export(&store, since, until, limit))
            .await
            .map_err(|err| ApiError(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    match read {
        Ok(history) => Ok(axum::Json(history).into_response()),
        Err(err) => {
            let status = match &err {
                HistoryError::Limit { .. } => StatusCode::BAD_REQUEST,
                HistoryError::TooManyFaults { .. } | HistoryError::TooManyEvents => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                HistoryError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            Err(ApiError(status, err.to_string()))
        }
    }
}
