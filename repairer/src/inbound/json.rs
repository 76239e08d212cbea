//! Reading fields of a JSON request body, with errors that name the field's path.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::InboundError;

pub(super) fn invalid(path: &str, problem: impl Into<String>) -> InboundError {
    InboundError::Invalid { path: path.to_owned(), problem: problem.into() }
}

/// Characters of a key kept in a path: keys (label names) come from outside and an error must
/// stay short.
const KEY_MAX_CHARS: usize = 64;

/// `parent.key`, or `key` at the top; a key longer than [`KEY_MAX_CHARS`] is cut, with `...`.
pub(super) fn join(parent: &str, key: &str) -> String {
    let key = match key.char_indices().nth(KEY_MAX_CHARS) {
        Some((cut, _)) => format!("{}...", &key[..cut]),
        None => key.to_owned(),
    };
    if parent.is_empty() { key } else { format!("{parent}.{key}") }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn expected(path: &str, what: &str, found: &Value) -> InboundError {
    invalid(path, format!("expected {what}, found {}", json_type(found)))
}

pub(super) fn as_object<'a>(
    value: &'a Value,
    path: &str,
) -> Result<&'a Map<String, Value>, InboundError> {
    value
        .as_object()
        .ok_or_else(|| expected(if path.is_empty() { "(body)" } else { path }, "an object", value))
}

pub(super) fn required<'a>(
    object: &'a Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<&'a Value, InboundError> {
    object.get(key).ok_or_else(|| invalid(&join(parent, key), "missing"))
}

pub(super) fn required_str<'a>(
    object: &'a Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<&'a str, InboundError> {
    let value = required(object, parent, key)?;
    value.as_str().ok_or_else(|| expected(&join(parent, key), "a string", value))
}

/// A string field that may be missing or null.
pub(super) fn optional_str<'a>(
    object: &'a Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<Option<&'a str>, InboundError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(other) => Err(expected(&join(parent, key), "a string", other)),
    }
}

/// An object of string values (Alertmanager labels and annotations).
pub(super) fn string_map<'a>(
    value: &'a Value,
    path: &str,
) -> Result<BTreeMap<&'a str, &'a str>, InboundError> {
    let object = as_object(value, path)?;
    object
        .iter()
        .map(|(key, value)| match value.as_str() {
            Some(text) => Ok((key.as_str(), text)),
            None => Err(expected(&join(path, key), "a string", value)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_key_is_cut_in_the_path() {
        let key = "k".repeat(5000);
        let path = super::join("alerts[1].labels", &key);
        assert_eq!(path, format!("alerts[1].labels.{}...", "k".repeat(super::KEY_MAX_CHARS)));
        assert_eq!(super::join("", "labels"), "labels");
    }
}
