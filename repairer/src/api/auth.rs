//! Who is calling: the bearer token of a request, checked against the agents', the alert
//! sources' and people's credentials (see [`crate::access`] for the roles).

use std::net::IpAddr;

use axum::http::{HeaderMap, StatusCode, Uri, header};

use super::{ApiError, ApiState};
use crate::access::Role;
use crate::limits::Caller;

/// Checks `Authorization: Bearer <token>` (or `?token=` where allowed) against `expected`; no
/// expected token means none is required (loopback or `insecure`).
pub(super) fn authorize(
    headers: &HeaderMap,
    query_token: Option<&str>,
    expected: &Option<String>,
) -> Result<(), ApiError> {
    let Some(expected) = expected else { return Ok(()) };
    match bearer(headers).or(query_token) {
        Some(token) if crate::access::constant_time_eq(token.as_bytes(), expected.as_bytes()) => {
            Ok(())
        }
        Some(_) => Err(ApiError(StatusCode::UNAUTHORIZED, "wrong bearer token".to_owned())),
        None => Err(ApiError(StatusCode::UNAUTHORIZED, "a bearer token is required".to_owned())),
    }
}

/// The token of `Authorization: Bearer <token>`, if any.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Who may post a report: with per-node identity the node whose token was presented (a report
/// for any other node is then refused), else anyone with the agent token (`None`).
pub(super) fn report_sender(
    state: &ApiState,
    headers: &HeaderMap,
) -> Result<Option<String>, ApiError> {
    let Some(tokens) = &state.node_tokens else {
        return authorize(headers, None, &state.tokens.agent)
            .map(|()| None)
            .map_err(|err| not_for_this(state, headers, None, err, "post reports"));
    };
    let Some(token) = bearer(headers) else {
        return Err(ApiError(StatusCode::UNAUTHORIZED, "a bearer token is required".to_owned()));
    };
    match tokens.node_of(token) {
        Some(node) => Ok(Some(node)),
        None => Err(not_for_this(
            state,
            headers,
            None,
            ApiError(StatusCode::UNAUTHORIZED, "wrong bearer token".to_owned()),
            "post reports",
        )),
    }
}

/// An alert webhook's caller: the alerts token, as a bearer token or `?token=`.
pub(super) fn alert_source(
    state: &ApiState,
    headers: &HeaderMap,
    query_token: Option<&str>,
) -> Result<(), ApiError> {
    authorize(headers, query_token, &state.tokens.alerts)
        .map_err(|err| not_for_this(state, headers, query_token, err, "post alerts"))
        .inspect_err(|err| state.refused.count(err))
}

/// A person's route: the credential presented must have `need` or a higher role. Returns who
/// acted, for the audit trail: the credential's name (with the shared `admin_token`, the
/// `x-fleetmend-user` header's name, else `admin`). With no people's credentials configured
/// (loopback, or `insecure`) every caller may, and is named by the header.
pub(super) fn gate(
    state: &ApiState,
    headers: &HeaderMap,
    need: Role,
    what: &str,
) -> Result<String, ApiError> {
    let people = &state.tokens.people;
    if people.is_empty() {
        return Ok(person(headers));
    }
    let found = bearer(headers).map(|token| crate::access::find(people, token));
    let outcome = match found {
        None => Err(ApiError(StatusCode::UNAUTHORIZED, "a bearer token is required".to_owned())),
        Some(Some(credential)) if credential.role >= need => {
            let shared_admin =
                state.tokens.admin.as_deref().zip(bearer(headers)).is_some_and(|(admin, token)| {
                    crate::access::constant_time_eq(admin.as_bytes(), token.as_bytes())
                });
            Ok(if shared_admin { person(headers) } else { credential.name.clone() })
        }
        Some(Some(credential)) => Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "credential {} ({}) may not {what}: that needs the {need} role",
                credential.name, credential.role
            ),
        )),
        Some(None) => Err(not_for_this(
            state,
            headers,
            None,
            ApiError(StatusCode::UNAUTHORIZED, "wrong bearer token".to_owned()),
            what,
        )),
    };
    outcome.inspect_err(|err| state.refused.count(err))
}

/// `err` (a 401) turned into a 403 when the token is one the repairer knows for another use:
/// a person's credential on an agent's route, an agent's on a person's, and so on.
pub(super) fn not_for_this(
    state: &ApiState,
    headers: &HeaderMap,
    query_token: Option<&str>,
    err: ApiError,
    what: &str,
) -> ApiError {
    let Some(token) = bearer(headers).or(query_token) else { return err };
    if err.0 != StatusCode::UNAUTHORIZED {
        return err;
    }
    let same = |known: &Option<String>| {
        known
            .as_deref()
            .is_some_and(|k| crate::access::constant_time_eq(k.as_bytes(), token.as_bytes()))
    };
    let whose = if let Some(credential) = crate::access::find(&state.tokens.people, token) {
        format!("{}'s ({})", credential.name, credential.role)
    } else if let Some(node) = state.node_tokens.as_ref().and_then(|t| t.node_of(token)) {
        format!("node {node}'s")
    } else if same(&state.tokens.agent) {
        "the agents'".to_owned()
    } else if same(&state.tokens.alerts) {
        "the alert sources'".to_owned()
    } else {
        return err;
    };
    ApiError(StatusCode::FORBIDDEN, format!("this credential is {whose}: it may not {what}"))
}

pub(super) fn person(headers: &HeaderMap) -> String {
    headers
        .get("x-fleetmend-user")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or("admin")
        .to_owned()
}

/// Whom a request's rate is counted against, from its credential alone (before its body is
/// read): a node's own token, a person's, the alert sources', a rank's progress token; anything
/// else (no credential, a wrong one) counts against the peer's address. `None` for a report with
/// the shared agent token or on a repairer without agent credentials: its node, named in the
/// body, is counted by the handler.
pub(super) fn caller(
    state: &ApiState,
    headers: &HeaderMap,
    uri: &Uri,
    peer: Option<IpAddr>,
) -> Option<Caller> {
    let path = uri.path();
    let token = bearer(headers).or_else(|| query_token(uri));
    let same = |known: &Option<String>, token: &str| {
        known
            .as_deref()
            .is_some_and(|k| crate::access::constant_time_eq(k.as_bytes(), token.as_bytes()))
    };
    let peer = || Caller::Peer(peer.unwrap_or(IpAddr::from([0, 0, 0, 0])));
    let Some(token) = token else {
        let open = state.tokens.agent.is_none() && state.node_tokens.is_none();
        return if path == "/v1/reports" && open { None } else { Some(peer()) };
    };
    if let Some(node) = state.node_tokens.as_ref().and_then(|t| t.node_of(token)) {
        return Some(Caller::Node(node));
    }
    if path == "/v1/reports" && same(&state.tokens.agent, token) {
        return None;
    }
    if path.starts_with("/v1/alerts/") && same(&state.tokens.alerts, token) {
        return Some(Caller::Alerts);
    }
    if let Some(credential) = crate::access::find(&state.tokens.people, token) {
        return Some(Caller::Person(credential.name.clone()));
    }
    let job = path.strip_prefix("/v1/jobs/").and_then(|rest| rest.strip_suffix("/progress"));
    if let (Some(job), Some(queue)) = (job, &state.queue)
        && let Ok((attempt, rank)) = queue.check_token(job, Some(token))
    {
        return Some(Caller::Rank { job: job.to_owned(), attempt, rank });
    }
    Some(peer())
}

/// `?token=` of the query (the alert webhooks' form, for SNS that cannot send headers).
fn query_token(uri: &Uri) -> Option<&str> {
    uri.query()?.split('&').find_map(|pair| pair.strip_prefix("token=")).filter(|t| !t.is_empty())
}
