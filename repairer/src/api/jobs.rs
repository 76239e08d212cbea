//! The embedded job queue's routes: submit, list, cancel, and the ranks' progress.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::auth::{bearer, gate, not_for_this};
use super::body::{parse_json, read_json_body};
use super::rejections::Path;
use super::{ApiError, ApiState, bad_request};
use crate::access::Role;

// --- the embedded job queue ----------------------------------------------------------------------

impl From<crate::queue::QueueError> for ApiError {
    fn from(err: crate::queue::QueueError) -> ApiError {
        use crate::queue::QueueError;
        let status = match &err {
            QueueError::UnknownJob(_) => StatusCode::NOT_FOUND,
            QueueError::InvalidSpec(_) | QueueError::BadProgress { .. } => StatusCode::BAD_REQUEST,
            QueueError::Conflict { .. } => StatusCode::CONFLICT,
            QueueError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            QueueError::OtherRank { .. } => StatusCode::FORBIDDEN,
            QueueError::Store { .. } | QueueError::Load(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, err.to_string())
    }
}

fn queue(state: &ApiState) -> Result<&Arc<crate::queue::JobQueue>, ApiError> {
    state.queue.as_ref().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            "this repairer runs no job queue (set scheduler = \"embedded\")".to_owned(),
        )
    })
}

#[utoipa::path(
    get,
    path = "/v1/jobs",
    summary = "Every job of the embedded queue, oldest first",
    responses(
        (status = 200, description = "the jobs", body = Vec<crate::queue::JobView>),
        (status = 404, description = "this repairer runs no job queue (scheduler is not embedded)", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
pub(super) async fn list_jobs(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "list jobs")?;
    Ok(axum::Json(queue(&state)?.jobs()).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/jobs",
    summary = "Submit a job",
    request_body(content = crate::queue::JobSpec, content_type = "application/json"),
    responses(
        (status = 201, description = "queued", body = crate::queue::JobView),
        (status = 400, description = "malformed or invalid: the message names every field", body = crate::api::openapi::Error),
        (status = 404, description = "this repairer runs no job queue (scheduler is not embedded)", body = crate::api::openapi::Error),
        crate::api::openapi::BodyRefused,
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("operator")))
)]
pub(super) async fn submit_job(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let actor = gate(&state, &headers, Role::Operator, "submit jobs")?;
    let queue = queue(&state)?;
    let body = read_json_body(&headers, body, state.max_body_bytes)?;
    let spec: crate::queue::JobSpec =
        parse_json(&body).map_err(|err| bad_request(format!("malformed job: {err}")))?;
    let job = queue.submit(spec, &actor)?;
    Ok((StatusCode::CREATED, axum::Json(job)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    summary = "One job",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 200, description = "the job", body = crate::queue::JobView),
        (status = 400, description = "the path parameter does not read (not UTF-8 once decoded)", body = crate::api::openapi::Error),
        (status = 404, description = "no such job, or this repairer runs no job queue (scheduler is not embedded)", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("read")))
)]
pub(super) async fn job_detail(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    gate(&state, &headers, Role::Read, "read a job")?;
    let job = queue(&state)?
        .job(&id)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no job {id}")))?;
    Ok(axum::Json(job).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/cancel",
    summary = "Cancel a job: SIGTERM then SIGKILL to its ranks",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 200, description = "the job", body = crate::queue::JobView),
        (status = 400, description = "the path parameter does not read (not UTF-8 once decoded)", body = crate::api::openapi::Error),
        (status = 404, description = "no such job, or this repairer runs no job queue (scheduler is not embedded)", body = crate::api::openapi::Error),
        (status = 409, description = "it finished already", body = crate::api::openapi::Error),
        crate::api::openapi::PersonRefused
    ),
    extensions(("x-fleetmend-role" = json!("operator")))
)]
pub(super) async fn cancel_job(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let actor = gate(&state, &headers, Role::Operator, "cancel jobs")?;
    Ok(axum::Json(queue(&state)?.cancel(&id, &actor)?).into_response())
}

/// A rank's progress: authenticated by the rank's own token (from `FLEETMEND_PROGRESS_TOKEN`),
/// which speaks for that rank of that attempt alone.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/progress",
    summary = "A rank's progress; the reply carries the checkpoint interval (checkpoint_every auto)",
    description = "Bearer token: the rank's own (FLEETMEND_PROGRESS_TOKEN), which speaks for that rank of that attempt only.",
    params(("id" = String, Path, description = "the job's id")),
    request_body(content = fleetmend_proto::Progress, content_type = "application/json"),
    responses(
        (status = 200, description = "taken", body = fleetmend_proto::ProgressReply),
        (status = 400, description = "malformed, past a bound, or not this attempt's", body = crate::api::openapi::Error),
        (status = 404, description = "no such job, or this repairer runs no job queue (scheduler is not embedded)", body = crate::api::openapi::Error),
        crate::api::openapi::BodyRefused,
        crate::api::openapi::RankRefused
    ),
    extensions(("x-fleetmend-role" = json!("rank")))
)]
pub(super) async fn job_progress(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let queue = queue(&state)?;
    let token = bearer(&headers);
    let refused = |err: crate::queue::QueueError| {
        let err = not_for_this(&state, &headers, None, err.into(), "post a rank's progress");
        state.refused.count(&err);
        err
    };
    queue.check_token(&id, token).map_err(refused)?;
    let body = read_json_body(&headers, body, state.max_body_bytes)?;
    let progress: fleetmend_proto::Progress =
        parse_json(&body).map_err(|err| bad_request(format!("malformed progress: {err}")))?;
    fleetmend_proto::bounds::check_progress(&progress)
        .map_err(|err| bad_request(format!("progress: {err}")))?;
    Ok(axum::Json(queue.progress(&id, token, &progress).map_err(refused)?).into_response())
}
