//! The wire bounds ([`crate::bounds`]) written into the OpenAPI schemas that `ToSchema` derives
//! (feature `openapi`): the derive takes literals only, so the bounds are set here from the
//! constants, and the document and the check that refuses a body past them cannot disagree.
//!
//! JSON Schema counts a string's length in characters, the bounds count bytes: a string within a
//! bound is within `maxLength`, and one past `maxLength` is past the bound.

use serde_json::{Value, json};

use crate::bounds::*;

/// `(schema, JSON pointer inside it, keyword, value)`: every bound the repairer checks on a body.
pub fn schema_bounds() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    vec![
        ("Report", "/properties/wire_version", "enum", json!([crate::WIRE_VERSION])),
        ("Report", "/properties/node", "maxLength", json!(253)),
        ("Report", "/properties/node", "minLength", json!(1)),
        ("Report", "/properties/node", "pattern", json!(NODE_NAME_PATTERN)),
        ("Report", "/properties/boot_id", "maxLength", json!(MAX_ID_BYTES)),
        ("Report", "/properties/agent_version", "maxLength", json!(MAX_ID_BYTES)),
        ("Report", "/properties/address", "maxLength", json!(MAX_ADDRESS_BYTES)),
        ("Report", "/properties/checks", "maxItems", json!(MAX_CHECKS)),
        ("Report", "/properties/findings", "maxItems", json!(MAX_FINDINGS)),
        ("Report", "/properties/command_results", "maxItems", json!(MAX_COMMAND_RESULTS)),
        ("Report", "/properties/ranks", "maxItems", json!(MAX_RANKS)),
        ("CheckRun", "/properties/check", "maxLength", json!(MAX_NAME_BYTES)),
        ("Finding", "/properties/check", "maxLength", json!(MAX_NAME_BYTES)),
        ("Finding", "/properties/check", "minLength", json!(1)),
        ("Finding", "/properties/finding", "maxLength", json!(MAX_NAME_BYTES)),
        ("Finding", "/properties/finding", "minLength", json!(1)),
        ("Finding", "/properties/subject", "maxLength", json!(MAX_SUBJECT_BYTES)),
        ("Finding", "/properties/message", "maxLength", json!(MAX_MESSAGE_BYTES)),
        ("Finding", "/properties/labels", "maxProperties", json!(MAX_LABELS)),
        (
            "Finding",
            "/properties/labels",
            "propertyNames",
            json!({ "maxLength": MAX_LABEL_KEY_BYTES }),
        ),
        (
            "Finding",
            "/properties/labels/additionalProperties",
            "maxLength",
            json!(MAX_LABEL_VALUE_BYTES),
        ),
        ("CommandResult", "/properties/id", "maxLength", json!(MAX_ID_BYTES)),
        ("CommandResult", "/properties/kind", "maxLength", json!(MAX_NAME_BYTES)),
        ("CommandResult", "/properties/message", "maxLength", json!(MAX_MESSAGE_BYTES)),
        ("CommandResult", "/properties/findings", "maxItems", json!(MAX_FINDINGS)),
        ("EvidenceBundle", "/properties/node", "maxLength", json!(MAX_ADDRESS_BYTES)),
        ("EvidenceBundle", "/properties/boot_id", "maxLength", json!(MAX_ID_BYTES)),
        ("EvidenceBundle", "/properties/items", "maxItems", json!(MAX_EVIDENCE_ITEMS)),
        ("EvidenceItem", "/properties/name", "maxLength", json!(MAX_NAME_BYTES)),
        ("EvidenceItem", "/properties/source", "maxLength", json!(MAX_SOURCE_BYTES)),
        ("EvidenceItem", "/properties/encoding", "maxLength", json!(MAX_NAME_BYTES)),
        ("EvidenceItem", "/properties/error", "maxLength", json!(MAX_MESSAGE_BYTES)),
        ("RankKey", "/properties/job", "maxLength", json!(MAX_ID_BYTES)),
        ("RankStatus", "/properties/message", "maxLength", json!(MAX_MESSAGE_BYTES)),
        ("Progress", "/properties/job", "maxLength", json!(MAX_ID_BYTES)),
        ("Progress", "/properties/waiting_for", "maxItems", json!(MAX_JOB_RANKS)),
    ]
}

/// A node's name as the repairer takes it (letters, digits, `-`, `.`, `_`).
pub const NODE_NAME_PATTERN: &str = "^[A-Za-z0-9._-]+$";

/// A bound whose place is not in the document: a schema or property renamed without this table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the OpenAPI document has no {schema}{pointer} for its {keyword} bound")]
pub struct MissingPlace {
    pub schema: String,
    pub pointer: String,
    pub keyword: String,
}

/// Writes `bounds` into `schemas` (the document's `components.schemas`). The place of a property
/// kept in `allOf` (a flattened struct) is searched in each part.
pub fn apply(
    schemas: &mut Value,
    bounds: &[(&str, &str, &str, Value)],
) -> Result<(), MissingPlace> {
    for (schema, pointer, keyword, value) in bounds {
        let missing = || MissingPlace {
            schema: (*schema).to_owned(),
            pointer: (*pointer).to_owned(),
            keyword: (*keyword).to_owned(),
        };
        let root = schemas.get_mut(*schema).ok_or_else(missing)?;
        let place = find(root, pointer).ok_or_else(missing)?;
        let place = place.as_object_mut().ok_or_else(missing)?;
        place.insert((*keyword).to_owned(), value.clone());
    }
    Ok(())
}

/// `pointer` in `schema`, or in one of its `allOf` parts.
fn find<'a>(schema: &'a mut Value, pointer: &str) -> Option<&'a mut Value> {
    if schema.pointer(pointer).is_some() {
        return schema.pointer_mut(pointer);
    }
    let parts = schema.get_mut("allOf")?.as_array_mut()?;
    parts.iter_mut().find_map(|part| part.pointer_mut(pointer))
}

/// The range of each integer format of the OpenAPI format registry, which the derive writes
/// (utoipa's `non_strict_integers`: a `u64` is `uint64`, a `u16` is `uint16`) and which JSON
/// Schema validators need not know, so the document says it with `minimum` and `maximum` too.
/// Without them a tool reads a `u64` as `int64` at most, or as unbounded: either way the document
/// and the body the repairer takes disagree.
const INTEGER_RANGES: &[(&str, i128, i128)] = &[
    ("int8", i8::MIN as i128, i8::MAX as i128),
    ("int16", i16::MIN as i128, i16::MAX as i128),
    ("int32", i32::MIN as i128, i32::MAX as i128),
    ("int64", i64::MIN as i128, i64::MAX as i128),
    ("uint8", 0, u8::MAX as i128),
    ("uint16", 0, u16::MAX as i128),
    ("uint32", 0, u32::MAX as i128),
    ("uint64", 0, u64::MAX as i128),
];

/// Writes each integer format's range into every schema that names the format, anywhere in
/// `document` (bodies, parameters, headers), keeping a bound already there where it is narrower
/// (a `u32` bounded at 1,000,000 stays so).
pub fn integer_ranges(document: &mut Value) {
    match document {
        Value::Object(object) => {
            // utoipa 6 writes an unsigned format kebab-cased (`u-int64`); the registry's name is
            // `uint64`.
            let format = object.get("format").and_then(Value::as_str);
            let format = format.map(|f| f.replacen("u-int", "uint", 1));
            let range = format
                .as_deref()
                .and_then(|format| INTEGER_RANGES.iter().find(|(name, ..)| *name == format));
            if let Some(&(name, lo, hi)) = range {
                object.insert("format".to_owned(), Value::from(name));
                narrow(object, "minimum", lo, i128::max);
                narrow(object, "maximum", hi, i128::min);
            }
            object.values_mut().for_each(integer_ranges);
        }
        Value::Array(items) => items.iter_mut().for_each(integer_ranges),
        _ => {}
    }
}

/// Sets `keyword` to `bound`, or to `pick(existing, bound)` where an integer bound is there.
fn narrow(
    object: &mut serde_json::Map<String, Value>,
    keyword: &str,
    bound: i128,
    pick: fn(i128, i128) -> i128,
) {
    let existing = object
        .get(keyword)
        .and_then(|v| v.as_i64().map(i128::from).or_else(|| v.as_u64().map(i128::from)));
    let value = existing.map_or(bound, |existing| pick(existing, bound));
    // Every range above fits an i64 or a u64.
    let number =
        i64::try_from(value).map(Value::from).or_else(|_| u64::try_from(value).map(Value::from));
    if let Ok(number) = number {
        object.insert(keyword.to_owned(), number);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn integer_ranges_fill_in_each_format_and_keep_a_narrower_bound() {
        let mut doc = json!({
            "a": { "type": "integer", "format": "u-int64", "minimum": 0 },
            "b": [{ "type": ["integer", "null"], "format": "int8" }],
            "c": { "type": "integer", "format": "uint32", "minimum": 1, "maximum": 1000 },
            "d": { "type": "string", "format": "date-time" },
            "properties": { "format": { "type": "string" } },
        });
        super::integer_ranges(&mut doc);
        assert_eq!(
            doc["a"],
            json!({ "type": "integer", "format": "uint64", "minimum": 0, "maximum": u64::MAX })
        );
        assert_eq!(
            (doc["b"][0]["minimum"].as_i64(), doc["b"][0]["maximum"].as_i64()),
            (Some(-128), Some(127))
        );
        assert_eq!(
            (doc["c"]["minimum"].as_i64(), doc["c"]["maximum"].as_i64()),
            (Some(1), Some(1000))
        );
        assert_eq!(doc["d"], json!({ "type": "string", "format": "date-time" }));
        assert_eq!(doc["properties"], json!({ "format": { "type": "string" } }));
    }
}
