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
        // A port: the derive says only `minimum: 0` (format int32) of a u16.
        ("Report", "/properties/metrics_port", "maximum", json!(u16::MAX)),
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
