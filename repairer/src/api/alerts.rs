//! The alert webhooks: Alertmanager's and Amazon SNS's (CloudWatch alarms).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::auth::alert_source;
use super::body::{read_body, read_json_body};
use super::rejections::Query;
use super::{ApiError, ApiState, Subscription, bad_request};
use crate::engine::EngineError;
use crate::inbound::{self, SnsMessage};
use crate::model::{Actor, Event, EventKind, FindingSource, Severity};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct TokenQuery {
    /// The alerts token, for a sender that cannot set a header (Amazon SNS).
    token: Option<String>,
}

/// What became of the alerts of a webhook post.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct InboundAnswer {
    // usize, which the derive gives no format nor range: 64 bits here.
    #[schema(value_type = u64)]
    accepted: usize,
    #[schema(value_type = u64)]
    skipped: usize,
    unknown_nodes: Vec<String>,
}

#[utoipa::path(
    post,
    path = "/v1/alerts/alertmanager",
    summary = "Alertmanager webhook (version 4): firing alerts naming a node become its findings; resolved ones clear them",
    params(TokenQuery),
    request_body(content = crate::api::openapi::AlertmanagerBody, content_type = "application/json"),
    responses(
        (status = 200, description = "taken: accepted, skipped and unknown nodes counted", body = InboundAnswer),
        (status = 400, description = "not an Alertmanager notification of version 4 (the message says why)", body = crate::api::openapi::Error),
        crate::api::openapi::BodyRefused,
        crate::api::openapi::AlertsRefused
    ),
    extensions(("x-fleetmend-role" = json!("alerts")))
)]
pub(super) async fn alertmanager(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    alert_source(&state, &headers, query.token.as_deref())?;
    let body = read_json_body(&headers, body, state.max_body_bytes)?;
    let parsed = inbound::parse_alertmanager(&body, &state.inbound)
        .map_err(|err| bad_request(err.to_string()))?;
    let mut answer =
        InboundAnswer { accepted: 0, skipped: parsed.skipped, unknown_nodes: Vec::new() };
    for alert in parsed.alerts {
        match state.engine.ingest_external(
            &alert.node,
            FindingSource::Alertmanager,
            &alert.finding,
            alert.firing,
        ) {
            Ok(()) => answer.accepted += 1,
            Err(EngineError::UnknownNode(node) | EngineError::NotInInventory(node)) => {
                answer.unknown_nodes.push(node)
            }
            Err(err) => return Err(err.into()),
        }
    }
    Ok(axum::Json(answer).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/alerts/cloudwatch",
    summary = "SNS HTTP notification whose Message is a CloudWatch alarm; SubscriptionConfirmation is recorded for the operator",
    params(TokenQuery),
    request_body(content((crate::api::openapi::SnsBody = "text/plain"), (crate::api::openapi::SnsBody = "application/json")), description = "SNS posts its JSON as text/plain"),
    responses(
        (status = 200, description = "taken (an alarm: accepted, skipped and unknown nodes counted; a subscription confirmation: recorded)", body = InboundAnswer),
        (status = 400, description = "not an SNS message this repairer reads (the message says why)", body = crate::api::openapi::Error),
        (status = 413, description = "the body is larger than max_body_bytes", body = crate::api::openapi::Error),
        crate::api::openapi::AlertsRefused
    ),
    extensions(("x-fleetmend-role" = json!("alerts")))
)]
pub(super) async fn cloudwatch(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    alert_source(&state, &headers, query.token.as_deref())?;
    let body = read_body(body, state.max_body_bytes)?;
    let message =
        inbound::parse_sns(&body, &state.inbound).map_err(|err| bad_request(err.to_string()))?;
    let now = state.engine.clock().now_ms();
    match message {
        SnsMessage::Alarm(Some(alert)) => {
            match state.engine.ingest_external(
                &alert.node,
                FindingSource::Cloudwatch,
                &alert.finding,
                alert.firing,
            ) {
                Ok(()) => Ok(axum::Json(InboundAnswer {
                    accepted: 1,
                    skipped: 0,
                    unknown_nodes: Vec::new(),
                })
                .into_response()),
                Err(EngineError::UnknownNode(node) | EngineError::NotInInventory(node)) => {
                    Ok(axum::Json(InboundAnswer {
                        accepted: 0,
                        skipped: 0,
                        unknown_nodes: vec![node],
                    })
                    .into_response())
                }
                Err(err) => Err(err.into()),
            }
        }
        SnsMessage::Alarm(None) => {
            Ok(axum::Json(InboundAnswer { accepted: 0, skipped: 1, unknown_nodes: Vec::new() })
                .into_response())
        }
        SnsMessage::SubscriptionConfirmation { topic_arn, subscribe_url, .. } => {
            let event = Event::new(
                EventKind::Subscription,
                Severity::Warning,
                None,
                Actor("cloudwatch".to_owned()),
                format!(
                    "SNS topic {topic_arn} asks to confirm the subscription: open {subscribe_url}"
                ),
                now,
            );
            state
                .engine
                .events()
                .record(&event)
                .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
            if let Ok(mut list) = state.subscriptions.lock() {
                list.push(Subscription { topic_arn, subscribe_url, received_ms: now });
            }
            Ok(StatusCode::OK.into_response())
        }
        SnsMessage::UnsubscribeConfirmation { .. } => Ok(StatusCode::OK.into_response()),
    }
}
