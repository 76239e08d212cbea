use serde_json::Value;

fn doc() -> Value {
    super::document().expect("every bound has its place in the document")
}

#[test]
fn every_routed_handler_is_an_operation_and_every_operation_is_routed() {
    // The router is `routes()` split: its routes are the document's operations. Count both from
    // the source too, so a handler routed some other way is caught.
    let doc = doc();
    let operations: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|item| item.as_object().unwrap().len())
        .sum();
    let source = include_str!("../mod.rs");
    let handlers = [
        source,
        include_str!("../alerts.rs"),
        include_str!("../history.rs"),
        include_str!("../jobs.rs"),
        include_str!("../leader.rs"),
        include_str!("../metrics.rs"),
    ]
    .concat();
    let routed: usize = source
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(".routes(routes!("))
        .map(|handlers| handlers.split(',').count())
        .sum();
    assert_eq!(operations, routed, "operations in the document vs handlers routed");
    assert_eq!(handlers.matches("#[utoipa::path(").count(), routed, "a handler without its path");
    assert!(!handlers.contains(".route(\""), "a route outside the document");
}

#[test]
fn every_operation_names_its_role_and_its_refusals() {
    let doc = doc();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let role = op["x-fleetmend-role"].as_str().unwrap_or_else(|| panic!("{method} {path}"));
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("429"), "{method} {path}: 429");
            if role != "none" {
                for status in ["401", "403"] {
                    assert!(responses.contains_key(status), "{method} {path}: {status}");
                }
            }
            if op.get("requestBody").is_some() {
                assert!(responses.contains_key("413"), "{method} {path}: 413");
                let json_only = path != "/v1/alerts/cloudwatch";
                assert_eq!(responses.contains_key("415"), json_only, "{method} {path}: 415");
            }
            for (status, response) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    let schema = &response["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(schema, "#/components/schemas/Error", "{method} {path} {status}");
                }
            }
        }
    }
}

#[test]
fn the_documented_bounds_are_the_wire_bounds() {
    use fleetmend_proto::bounds::*;
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    let prop = |schema: &str, field: &str| -> Value {
        let s = &schemas[schema];
        let direct = &s["properties"][field];
        if !direct.is_null() {
            return direct.clone();
        }
        s["allOf"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|part| part["properties"][field].clone())
            .find(|v| !v.is_null())
            .unwrap_or(Value::Null)
    };
    let documented = [
        (prop("Report", "findings")["maxItems"].clone(), MAX_FINDINGS),
        (prop("Report", "checks")["maxItems"].clone(), MAX_CHECKS),
        (prop("CheckRun", "check")["maxLength"].clone(), MAX_NAME_BYTES),
        (prop("Report", "command_results")["maxItems"].clone(), MAX_COMMAND_RESULTS),
        (prop("Report", "ranks")["maxItems"].clone(), MAX_RANKS),
        (prop("RankKey", "job")["maxLength"].clone(), MAX_ID_BYTES),
        (prop("RankStatus", "message")["maxLength"].clone(), MAX_MESSAGE_BYTES),
        (prop("Report", "boot_id")["maxLength"].clone(), MAX_ID_BYTES),
        (prop("Report", "agent_version")["maxLength"].clone(), MAX_ID_BYTES),
        (prop("Report", "address")["maxLength"].clone(), MAX_ADDRESS_BYTES),
        (prop("Finding", "check")["maxLength"].clone(), MAX_NAME_BYTES),
        (prop("Finding", "finding")["maxLength"].clone(), MAX_NAME_BYTES),
        (prop("Finding", "subject")["maxLength"].clone(), MAX_SUBJECT_BYTES),
        (prop("Finding", "message")["maxLength"].clone(), MAX_MESSAGE_BYTES),
        (prop("Finding", "labels")["maxProperties"].clone(), MAX_LABELS),
        (prop("Finding", "labels")["propertyNames"]["maxLength"].clone(), MAX_LABEL_KEY_BYTES),
        (
            prop("Finding", "labels")["additionalProperties"]["maxLength"].clone(),
            MAX_LABEL_VALUE_BYTES,
        ),
        (prop("CommandResult", "id")["maxLength"].clone(), MAX_ID_BYTES),
        (prop("CommandResult", "kind")["maxLength"].clone(), MAX_NAME_BYTES),
        (prop("CommandResult", "message")["maxLength"].clone(), MAX_MESSAGE_BYTES),
        (prop("CommandResult", "findings")["maxItems"].clone(), MAX_FINDINGS),
        (prop("EvidenceBundle", "items")["maxItems"].clone(), MAX_EVIDENCE_ITEMS),
        (prop("EvidenceItem", "name")["maxLength"].clone(), MAX_NAME_BYTES),
        (prop("EvidenceItem", "source")["maxLength"].clone(), MAX_SOURCE_BYTES),
        (prop("EvidenceItem", "error")["maxLength"].clone(), MAX_MESSAGE_BYTES),
        (prop("Progress", "job")["maxLength"].clone(), MAX_ID_BYTES),
        (prop("Progress", "waiting_for")["maxItems"].clone(), MAX_JOB_RANKS as usize),
        (prop("JobSpec", "argv")["maxItems"].clone(), MAX_ARGS),
        (prop("JobSpec", "argv")["items"]["maxLength"].clone(), MAX_ARG_BYTES),
        (prop("JobSpec", "env")["maxProperties"].clone(), MAX_ENV),
        (prop("JobSpec", "checkpoint_dir")["maxLength"].clone(), MAX_PATH_BYTES),
        (prop("JobSpec", "nodes")["maximum"].clone(), MAX_JOB_RANKS as usize),
    ];
    for (i, (value, bound)) in documented.iter().enumerate() {
        assert_eq!(value.as_u64(), Some(*bound as u64), "documented bound {i}: {value}");
    }
    let evidence = &doc["paths"]["/v1/nodes/{name}/evidence"]["get"]["parameters"];
    let limit = evidence.as_array().unwrap().iter().find(|p| p["name"] == "limit").unwrap();
    assert_eq!(limit["schema"]["maximum"].as_u64(), Some(crate::api::EVIDENCE_LIMIT as u64));
}

#[test]
fn a_bound_without_its_place_is_an_error() {
    let mut schemas = serde_json::json!({ "Report": { "properties": {} } });
    let bounds = [("Report", "/properties/gone", "maxLength", serde_json::json!(1))];
    let err = fleetmend_proto::openapi::apply(&mut schemas, &bounds).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the OpenAPI document has no Report/properties/gone for its maxLength bound"
    );
}

#[test]
fn every_integer_is_documented_with_the_range_its_rust_type_reads() {
    // A u64 documented as `int64` is refused by the document past 2^63-1 and taken by the
    // repairer; schemathesis sent 2^63 as `seq` and `truncatedAlerts`.
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    let range = |schema: &str, field: &str| {
        let prop = &schemas[schema]["properties"][field];
        (prop["format"].clone(), prop["minimum"].as_i64(), prop["maximum"].as_u64())
    };
    assert_eq!(range("Report", "seq"), ("uint64".into(), Some(0), Some(u64::MAX)));
    assert_eq!(
        range("AlertmanagerBody", "truncatedAlerts"),
        ("uint64".into(), Some(0), Some(u64::MAX))
    );
    assert_eq!(range("Report", "metrics_port"), ("uint16".into(), Some(0), Some(u16::MAX.into())));
    // A narrower bound of the repairer's own stays.
    assert_eq!(
        range("JobSpec", "max_restarts"),
        ("uint32".into(), Some(0), Some(crate::queue::MAX_RESTARTS.into()))
    );
    assert_eq!(range("JobSpec", "nodes").2, Some(fleetmend_proto::bounds::MAX_JOB_RANKS.into()));
    // No integer is left without its range, parameters and headers included.
    fn unranged(value: &Value, at: &str, out: &mut Vec<String>) {
        match value {
            Value::Object(object) => {
                let integer = |t: &Value| {
                    t == "integer" || t.as_array().is_some_and(|t| t.iter().any(|t| t == "integer"))
                };
                let format = object.get("format").and_then(Value::as_str);
                if (object.get("type").is_some_and(integer)
                    || format.is_some_and(|f| f.contains("int")))
                    && (object.get("minimum").is_none() || object.get("maximum").is_none())
                {
                    out.push(at.to_owned());
                }
                for (key, child) in object {
                    unranged(child, &format!("{at}/{key}"), out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    unranged(child, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut missing = Vec::new();
    unranged(&doc, "", &mut missing);
    assert!(missing.is_empty(), "integers without their range: {missing:?}");
}

#[test]
fn checkpoint_every_admits_null_as_the_repairer_reads_it() {
    let doc = doc();
    let one_of = doc["components"]["schemas"]["JobSpec"]["properties"]["checkpoint_every"]["oneOf"]
        .as_array()
        .unwrap()
        .clone();
    assert!(one_of.iter().any(|s| s["type"] == "null"), "{one_of:?}");
    let spec: crate::queue::JobSpec = serde_json::from_value(serde_json::json!({
        "argv": ["x"], "nodes": 1, "checkpoint_dir": "/c", "checkpoint_every": null
    }))
    .unwrap();
    assert_eq!(spec.checkpoint_every, None);
}
