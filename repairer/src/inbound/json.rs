//! Reading a JSON request body into typed structs, with errors that name the field's path
//! (`serde_path_to_error`) in the words an operator reads: `alerts[2].labels: missing`,
//! `version: expected a string, found a number`.

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde_path_to_error::Segment;

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

/// Reads `T` from `text`, the JSON found at `at` (empty for the body itself). A body that is not
/// JSON at all is `not_json`; the caller words that for a nested document.
pub(super) fn read<T: DeserializeOwned>(text: &[u8], at: &str) -> Result<T, InboundError> {
    // serde reads a struct from an array too (its fields in order); a document is an object.
    let first = text.iter().find(|b| !b.is_ascii_whitespace());
    if let Some(found) = first.and_then(|b| leading_kind(*b)) {
        let path = if at.is_empty() { "(body)" } else { at };
        return Err(invalid(path, format!("expected an object, found {found}")));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = path_below(at, err.path());
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return InboundError::NotJson(inner);
        }
        field_error(path, &inner)
    })?;
    deserializer.end().map_err(InboundError::NotJson)?;
    Ok(value)
}

fn path_below(at: &str, path: &serde_path_to_error::Path) -> String {
    let mut out = at.to_owned();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => out = join(&out, key),
            Segment::Unknown => out = join(&out, "?"),
        }
    }
    out
}

/// What a JSON document that is not an object is, from its first byte; `None` for an object
/// (or something that is not JSON, which the parser words).
fn leading_kind(first: u8) -> Option<&'static str> {
    match first {
        b'[' => Some("an array"),
        b'"' => Some("a string"),
        b'-' | b'0'..=b'9' => Some("a number"),
        b't' | b'f' => Some("a boolean"),
        b'n' => Some("null"),
        _ => None,
    }
}

/// serde's message, in this module's words: a missing field names the field in the path.
fn field_error(path: String, err: &serde_json::Error) -> InboundError {
    let message = without_position(err);
    if let Some(field) = message.strip_prefix("missing field `").and_then(|m| m.strip_suffix('`')) {
        return invalid(&join(&path, field), "missing");
    }
    let path = if path.is_empty() { "(body)".to_owned() } else { path };
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((found, wanted)) = rest.split_once(", expected ")
    {
        return invalid(
            &path,
            format!("expected {}, found {}", json_kind(wanted), found_kind(found)),
        );
    }
    if message.starts_with("invalid length ") && message.contains(", expected struct ") {
        return invalid(&path, "expected an object, found an array");
    }
    invalid(&path, message)
}

/// serde_json appends ` at line L column C`; the path says where.
fn without_position(err: &serde_json::Error) -> String {
    let message = err.to_string();
    let position = format!(" at line {} column {}", err.line(), err.column());
    message.strip_suffix(&position).map(str::to_owned).unwrap_or(message)
}

/// What serde says a value was (`integer `4``, `map`, `string "x"`) as a JSON type.
fn found_kind(found: &str) -> &'static str {
    match found.split([' ', '`']).next().unwrap_or_default() {
        "integer" | "floating" => "a number",
        "string" | "character" => "a string",
        "map" => "an object",
        "sequence" => "an array",
        "boolean" => "a boolean",
        "null" | "unit" => "null",
        _ => "something else",
    }
}

/// What a typed field expects (serde's `a map`, `a sequence`, `struct Alert`) in JSON's words.
fn json_kind(wanted: &str) -> String {
    match wanted {
        "a map" => "an object".to_owned(),
        "a sequence" => "an array".to_owned(),
        other if other.starts_with("struct ") => "an object".to_owned(),
        other => other.to_owned(),
    }
}

/// What JSON type `value` is, as an error names it.
pub(super) fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A field that may be missing or null: its default then.
pub(super) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A whole number, `3.0` too (JSON Schema's integer), up to 2^53, past which an f64 no longer
/// holds every whole number (and 2^64 and beyond would saturate as u64); missing or null is 0.
pub(super) fn whole_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    const EXACT: f64 = (1u64 << f64::MANTISSA_DIGITS) as f64;
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(0) };
    let whole = value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < EXACT);
    value.as_u64().or(whole.map(|f| f as u64)).ok_or_else(|| {
        de::Error::custom(format!("expected a whole number, found {}", json_type(&value)))
    })
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
