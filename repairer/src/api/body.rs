//! Reading a request body: its size and Content-Type refused in the API's error shape, and JSON
//! read as JSON Schema reads it.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::{Number, Value};

use super::ApiError;

/// The request body, or a JSON error naming why it could not be read: axum's own rejection (a body
/// over the limit answers 413) is plain text, which no client of this API expects. Called after the
/// token check, so an unauthenticated request is refused for the token whatever its body.
pub(super) fn read_body(
    body: Result<Bytes, BytesRejection>,
    max_body_bytes: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the request body is larger than max_body_bytes ({max_body_bytes} bytes)")
        } else {
            format!("reading the request body: {}", rejection.body_text())
        };
        ApiError(status, message)
    })
}

/// A JSON body, read as [`read_body`] does; refused with 415 when its Content-Type says it is
/// something else (a body without one is read as JSON, as clients that send none expect).
pub(super) fn read_json_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    max_body_bytes: usize,
) -> Result<Bytes, ApiError> {
    if let Some(value) = headers.get(header::CONTENT_TYPE) {
        let essence = value.to_str().ok().and_then(|v| v.split(';').next()).map(str::trim);
        if !essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
            let sent = String::from_utf8_lossy(value.as_bytes());
            return Err(ApiError(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("the body must be sent as Content-Type: application/json, not {sent:?}"),
            ));
        }
    }
    read_body(body, max_body_bytes)
}

/// Parses a JSON body. A number with no fraction (`3.0`) is an integer to JSON Schema, and so to
/// the OpenAPI document: where serde wants an integer and the body has one written so, it is read
/// as the integer it is. The error names the line and column where the body is JSON serde
/// refuses as it stands.
pub(super) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    let err = match serde_json::from_slice(body) {
        Ok(value) => return Ok(value),
        Err(err) => err,
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else { return Err(err) };
    if !whole_numbers_as_integers(&mut value) {
        return Err(err);
    }
    // Refused even so: the reason is then this parse's (a position no longer exists).
    serde_json::from_value(value)
}

/// Rewrites every number with no fraction as an integer; whether there was one.
fn whole_numbers_as_integers(value: &mut Value) -> bool {
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0) else { return false };
            // Within ±2^53 a float is the integer it spells exactly.
            const EXACT: f64 = 9_007_199_254_740_992.0;
            if f.abs() > EXACT {
                return false;
            }
            *n = if f < 0.0 { Number::from(f as i64) } else { Number::from(f as u64) };
            true
        }
        Value::Array(items) => {
            items.iter_mut().fold(false, |any, item| whole_numbers_as_integers(item) | any)
        }
        Value::Object(map) => {
            map.values_mut().fold(false, |any, item| whole_numbers_as_integers(item) | any)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Spec {
        nodes: u32,
        priority: i32,
        loss: f64,
    }

    #[test]
    fn a_whole_number_written_as_a_float_is_the_integer() {
        let spec: Spec = parse_json(br#"{"nodes": 4.0, "priority": -2.0, "loss": 0.5}"#).unwrap();
        assert_eq!(spec, Spec { nodes: 4, priority: -2, loss: 0.5 });
    }

    #[test]
    fn a_fraction_where_an_integer_goes_is_still_refused_with_its_position() {
        let err = parse_json::<Spec>(br#"{"nodes": 4.5, "priority": 1, "loss": 1}"#).unwrap_err();
        assert!(err.to_string().contains("line 1 column"), "{err}");
        let err = parse_json::<Spec>(br#"{"nodes": 4.0, "priority": 1.5, "loss": 1}"#).unwrap_err();
        assert!(err.to_string().contains("expected i32"), "{err}");
    }
}
