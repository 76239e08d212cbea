//! `GET /v1/openapi.json`: the API's description (OpenAPI 3.1), generated from the handlers'
//! `#[utoipa::path]` attributes and the wire types' `ToSchema` derives. The router is built from
//! the same attributes ([`crate::api`] registers each handler with `utoipa_axum::routes!`), so a
//! route cannot be missing from the document nor a documented path be unrouted; the bounds of the
//! bodies are written in from [`fleetmend_proto::bounds`] (the derive takes literals only).

use std::sync::OnceLock;

use serde::Serialize;
use serde_json::{Value, json};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

/// What every operation has in common, said once.
const DESCRIPTION: &str = "Agents report here; alert sources post here; people drive repairs \
here. Each operation names in x-fleetmend-role what it needs: read, operator or admin (a person's \
credential of that role or higher), agent (the agent token or the node's own), alerts (the alerts \
token, bearer or ?token=), rank (the rank's own progress token) or none. No credential or an \
unknown one is a 401; a known one without the right is a 403. Every error of every route is the \
Error object ({\"error\": \"...\"}) with its status: a body past one of the bounds given here as \
maxItems/maxLength/maxProperties is a 400 naming the field (findings[3].labels: 30000 labels is \
more than 64; string bounds count bytes, which is never fewer than the characters maxLength \
counts); a query string or path parameter that does not read is a 400; a JSON body sent as \
another Content-Type than application/json is a 415 (the SNS webhook excepted: SNS posts \
text/plain); a path no route has is a 404; a method the path does not take is a 405 with an \
Allow header; a caller beyond its rate ([rate_limits]) is a 429 with Retry-After.";

/// The API's error answer: `{"error": "..."}`, a sentence naming what is wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct Error {
    pub error: String,
}

/// Refusals of a route for people: a read, operator or admin credential.
#[derive(Debug, IntoResponses)]
pub enum PersonRefused {
    /// No bearer token, or one the repairer does not know.
    #[response(status = 401)]
    Unauthorized(Error),
    /// A known credential whose role falls short (the message names the role it needs), or an
    /// agent's, alert source's or node's credential.
    #[response(status = 403)]
    Forbidden(Error),
    /// Beyond the credential's rate (`[rate_limits]`); nothing changed.
    #[response(status = 429, headers(("Retry-After" = u64, description = "seconds to wait")))]
    TooMany(Error),
}

/// Refusals of the agents' route.
#[derive(Debug, IntoResponses)]
pub enum AgentRefused {
    /// No token, or one that is no agent's.
    #[response(status = 401)]
    Unauthorized(Error),
    /// A known credential that is no agent's, a node's token on a report for another node, or a
    /// node outside the inventory (refused, or beyond max_unknown).
    #[response(status = 403)]
    Forbidden(Error),
    /// Beyond the node's rate (`[rate_limits]`); the report was not taken.
    #[response(status = 429, headers(("Retry-After" = u64, description = "seconds to wait")))]
    TooMany(Error),
}

/// Refusals of the alert webhooks.
#[derive(Debug, IntoResponses)]
pub enum AlertsRefused {
    /// No token, or not the alerts token.
    #[response(status = 401)]
    Unauthorized(Error),
    /// A known credential that is not the alerts token.
    #[response(status = 403)]
    Forbidden(Error),
    /// Beyond the alert sources' rate (`[rate_limits]`); nothing changed.
    #[response(status = 429, headers(("Retry-After" = u64, description = "seconds to wait")))]
    TooMany(Error),
}

/// Refusals of a rank's progress post.
#[derive(Debug, IntoResponses)]
pub enum RankRefused {
    /// No token, or none of this job's rank tokens.
    #[response(status = 401)]
    Unauthorized(Error),
    /// A rank's token on a post for another rank or attempt, or a credential that is no rank's.
    #[response(status = 403)]
    Forbidden(Error),
    /// Beyond the rank's rate (`[rate_limits]`); nothing changed.
    #[response(status = 429, headers(("Retry-After" = u64, description = "seconds to wait")))]
    TooMany(Error),
}

/// Refusals of a route open to all: only beyond the peer's rate.
#[derive(Debug, IntoResponses)]
pub enum OpenRefused {
    /// Beyond the peer's rate (`[rate_limits]`; loopback peers are not limited).
    #[response(status = 429, headers(("Retry-After" = u64, description = "seconds to wait")))]
    TooMany(Error),
}

/// Refusals of a JSON body for what it is, before it is read.
#[derive(Debug, IntoResponses)]
pub enum BodyRefused {
    /// The body is larger than max_body_bytes.
    #[response(status = 413)]
    TooLarge(Error),
    /// A body sent with a Content-Type other than application/json.
    #[response(status = 415)]
    NotJson(Error),
}

/// The security scheme: every credential is a bearer token.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The document's frame; the paths come from the router ([`crate::api::routes`]).
#[derive(OpenApi)]
#[openapi(
    info(title = "fleetmend repairer", version = "1"),
    components(schemas(Error)),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
struct Frame;

/// The bounds of the repairer's own request bodies, from the same constants as its checks.
fn repairer_bounds() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    use fleetmend_proto::bounds::*;
    vec![
        ("JobSpec", "/properties/argv", "maxItems", json!(MAX_ARGS)),
        ("JobSpec", "/properties/argv", "minItems", json!(1)),
        (
            "JobSpec",
            "/properties/argv",
            "prefixItems",
            json!([{ "type": "string", "pattern": "\\S" }]),
        ),
        ("JobSpec", "/properties/argv/items", "maxLength", json!(MAX_ARG_BYTES)),
        ("JobSpec", "/properties/nodes", "minimum", json!(1)),
        ("JobSpec", "/properties/nodes", "maximum", json!(MAX_JOB_RANKS)),
        ("JobSpec", "/properties/max_restarts", "maximum", json!(crate::queue::MAX_RESTARTS)),
        ("JobSpec", "/properties/checkpoint_dir", "maxLength", json!(MAX_PATH_BYTES)),
        ("JobSpec", "/properties/checkpoint_dir", "pattern", json!("^/")),
        ("JobSpec", "/properties/name", "minLength", json!(1)),
        ("JobSpec", "/properties/name", "maxLength", json!(crate::queue::MAX_JOB_NAME)),
        ("JobSpec", "/properties/name", "pattern", json!("^[^\\x00-\\x1f\\x7f-\\x9f]*$")),
        ("JobSpec", "/properties/env", "maxProperties", json!(MAX_ENV)),
        (
            "JobSpec",
            "/properties/env",
            "propertyNames",
            json!({
                "minLength": 1,
                "pattern": "^[^=\\x00]*$",
                "not": { "enum": crate::queue::RESERVED_ENV },
            }),
        ),
    ]
}

/// Why the document could not be made: a bound whose place is not in it.
pub type DocumentError = fleetmend_proto::openapi::MissingPlace;

/// The document, built from the router's operations and the schemas they name.
pub fn document() -> Result<Value, DocumentError> {
    let (_, paths) = crate::api::routes().split_for_parts();
    let mut api = Frame::openapi();
    api.merge(paths);
    api.info.description = Some(DESCRIPTION.to_owned());
    // The document is made of Rust values: it always serialises.
    let mut doc = serde_json::to_value(&api).unwrap_or(Value::Null);
    let schemas = &mut doc["components"]["schemas"];
    fleetmend_proto::openapi::apply(schemas, &fleetmend_proto::openapi::schema_bounds())?;
    fleetmend_proto::openapi::apply(schemas, &repairer_bounds())?;
    fleetmend_proto::openapi::integer_ranges(&mut doc);
    Ok(doc)
}

/// The document as served, made once.
pub fn served() -> &'static Result<String, String> {
    static DOCUMENT: OnceLock<Result<String, String>> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        document().map(|doc| doc.to_string()).map_err(|err| format!("the OpenAPI document: {err}"))
    })
}

#[cfg(test)]
mod tests;

/// `POST /v1/alerts/alertmanager`: an Alertmanager webhook notification (payload version 4), as
/// `inbound::parse_alertmanager` reads it; fields not named here are read past. (For the document
/// only: the handler reads the body itself, to name the field that is wrong.)
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // a schema, never built
pub struct AlertmanagerBody {
    #[schema(pattern = "^4$")]
    version: String,
    receiver: Option<String>,
    #[schema(rename = "groupKey")]
    group_key: Option<String>,
    /// Alerts Alertmanager left out for the webhook's max_alerts.
    #[schema(rename = "truncatedAlerts")]
    truncated_alerts: Option<u64>,
    /// At most `[inbound] max_alerts` (1000 unless configured).
    alerts: Vec<AlertmanagerAlert>,
}

/// One alert of an Alertmanager notification.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // a schema, never built
pub struct AlertmanagerAlert {
    /// `alertname` names the finding; the node comes from the first of `[inbound] node_labels`.
    labels: std::collections::BTreeMap<String, String>,
    annotations: Option<std::collections::BTreeMap<String, String>>,
    status: AlertStatus,
}

/// Whether an alert fires or was resolved.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // a schema, never built
#[schema(rename_all = "lowercase")]
pub enum AlertStatus {
    Firing,
    Resolved,
}

/// `POST /v1/alerts/cloudwatch`: an SNS message (a Notification whose Message is a CloudWatch
/// alarm as JSON, a SubscriptionConfirmation or an UnsubscribeConfirmation), or, with raw message
/// delivery, the alarm itself.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // a schema, never built
pub struct SnsBody {
    /// Notification, SubscriptionConfirmation or UnsubscribeConfirmation (absent: a raw alarm).
    #[schema(rename = "Type")]
    kind: Option<String>,
    /// A Notification's CloudWatch alarm, as JSON.
    #[schema(rename = "Message")]
    message: Option<String>,
    #[schema(rename = "TopicArn")]
    topic_arn: Option<String>,
    #[schema(rename = "SubscribeURL")]
    subscribe_url: Option<String>,
    /// A raw alarm's name.
    #[schema(rename = "AlarmName")]
    alarm_name: Option<String>,
    /// A raw alarm's state: ALARM, OK or INSUFFICIENT_DATA.
    #[schema(rename = "NewStateValue")]
    new_state_value: Option<String>,
}
