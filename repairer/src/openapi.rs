//! `GET /v1/openapi.json`: the API's description (OpenAPI 3.0), kept beside the routes in api.rs.
//! A test checks that every route in the router is described here.

/// The OpenAPI document.
pub const SPEC: &str = r##"{
  "openapi": "3.0.3",
  "info": {
    "title": "fleetmend repairer",
    "version": "1",
    "description": "Agents report here; alert sources post here; people drive repairs here. Each operation names in x-fleetmend-role what it needs: read, operator or admin (a person's credential of that role or higher), agent (the agent token or the node's own), alerts (the alerts token, bearer or ?token=), rank (the rank's own progress token) or none. No credential or an unknown one is a 401; a known one without the right is a 403. Every error of every route is the Error object ({\"error\": \"...\"}) with its status: a body past one of the bounds given here as maxItems/maxLength/maxProperties is a 400 naming the field (findings[3].labels: 30000 labels is more than 64); a query string or path parameter that does not read is a 400; a path no route has is a 404; a method the path does not take is a 405 with an Allow header."
  },
  "components": {
    "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
    "schemas": {
      "Error": { "type": "object", "properties": { "error": { "type": "string" } }, "required": ["error"] },
      "Finding": { "type": "object", "description": "fleetmend_proto::Finding; label keys are at most 128 bytes", "required": ["check", "finding", "status", "action"], "properties": {
        "check": { "type": "string", "maxLength": 128 }, "finding": { "type": "string", "maxLength": 128 }, "subject": { "type": "string", "maxLength": 4096 },
        "status": { "type": "string", "enum": ["ok", "warn", "fail", "unknown"] }, "message": { "type": "string", "maxLength": 16384 },
        "action": { "type": "string", "enum": ["none", "restart-app", "reset-gpu", "reboot", "replace", "drain"] }, "value": { "type": "number" },
        "labels": { "type": "object", "maxProperties": 64, "additionalProperties": { "type": "string", "maxLength": 1024 } } } },
      "Action": { "type": "string", "enum": ["none", "alert", "drain", "reboot", "replace"] },
      "NodeState": { "type": "string", "enum": ["healthy", "suspect", "draining", "drained", "repairing", "validating", "unreachable", "quarantined", "retired"] },
      "NodeSummary": { "type": "object", "properties": {
        "name": { "type": "string" }, "state": { "$ref": "#/components/schemas/NodeState" },
        "state_since_ms": { "type": "integer" }, "last_report_ms": { "type": "integer" },
        "boot_id": { "type": "string" }, "failing": { "type": "integer" }, "workflow": { "type": "integer", "nullable": true },
        "unknown": { "type": "boolean", "description": "not in the inventory: shown only, never counted by a guard rail or acted on" } } },
      "Event": { "type": "object", "properties": {
        "id": { "type": "integer" }, "at_ms": { "type": "integer" }, "kind": { "type": "string" },
        "severity": { "type": "string", "enum": ["info", "warning", "critical"] }, "node": { "type": "string", "nullable": true },
        "actor": { "type": "string" }, "from_state": { "$ref": "#/components/schemas/NodeState" }, "to_state": { "$ref": "#/components/schemas/NodeState" },
        "action": { "$ref": "#/components/schemas/Action" }, "workflow": { "type": "integer", "nullable": true },
        "reason": { "type": "string" }, "findings": { "type": "array", "items": { "type": "object" } } } },
      "Evidence": { "type": "object", "description": "A bundle kept with the workflow it was gathered for", "properties": {
        "workflow": { "type": "integer" }, "node": { "type": "string" }, "action": { "$ref": "#/components/schemas/Action" },
        "command": { "type": "string" }, "asked_ms": { "type": "integer" }, "kept_ms": { "type": "integer" },
        "bundle": { "type": "object", "properties": {
          "node": { "type": "string" }, "boot_id": { "type": "string" }, "collected_at_ms": { "type": "integer" }, "took_ms": { "type": "integer" },
          "items": { "type": "array", "items": { "type": "object", "properties": {
            "name": { "type": "string", "description": "kernel-log, findings, or a configured tool (nvidia-smi, nvidia-bug-report)" },
            "source": { "type": "string" }, "encoding": { "type": "string", "enum": ["text", "base64"] },
            "content": { "type": "string" }, "bytes": { "type": "integer", "description": "size before the cap" },
            "truncated": { "type": "boolean" }, "took_ms": { "type": "integer" }, "error": { "type": "string" } } } } } } } },
      "Breaker": { "type": "object", "properties": { "open": { "type": "boolean" }, "opened_ms": { "type": "integer", "nullable": true }, "reason": { "type": "string" } } },
      "Report": { "type": "object", "description": "fleetmend_proto::Report; the bounds are fleetmend_proto::bounds", "required": ["wire_version", "node", "boot_id", "agent_version", "seq", "sent_at_ms", "trigger", "verdict", "checks", "findings"], "properties": {
        "node": { "type": "string", "maxLength": 253 }, "boot_id": { "type": "string", "maxLength": 256 }, "agent_version": { "type": "string", "maxLength": 256 },
        "address": { "type": "string", "maxLength": 255 },
        "checks": { "type": "array", "maxItems": 256, "items": { "type": "object", "properties": { "check": { "type": "string", "maxLength": 128 } } } },
        "findings": { "type": "array", "maxItems": 10000, "items": { "$ref": "#/components/schemas/Finding" } },
        "command_results": { "type": "array", "maxItems": 1024, "items": { "type": "object", "properties": {
          "id": { "type": "string", "maxLength": 256 }, "kind": { "type": "string", "maxLength": 128 }, "message": { "type": "string", "maxLength": 16384 },
          "findings": { "type": "array", "maxItems": 10000, "items": { "$ref": "#/components/schemas/Finding" } },
          "evidence": { "type": "object", "properties": { "items": { "type": "array", "maxItems": 256, "items": { "type": "object", "properties": {
            "name": { "type": "string", "maxLength": 128 }, "source": { "type": "string", "maxLength": 4096 }, "encoding": { "type": "string", "maxLength": 128 }, "error": { "type": "string", "maxLength": 16384 } } } } } } } } },
        "ranks": { "type": "array", "maxItems": 4096, "items": { "type": "object", "properties": { "job": { "type": "string", "maxLength": 256 }, "message": { "type": "string", "maxLength": 16384 } } } } } },
      "JobSpec": { "type": "object", "description": "A job to run: one rank per node", "required": ["argv", "nodes", "checkpoint_dir"], "properties": {
        "name": { "type": "string", "maxLength": 128 }, "argv": { "type": "array", "items": { "type": "string", "maxLength": 131072 }, "minItems": 1, "maxItems": 1024 },
        "nodes": { "type": "integer", "minimum": 1 }, "priority": { "type": "integer", "description": "higher runs first; FIFO within a priority" },
        "checkpoint_dir": { "type": "string", "description": "absolute", "maxLength": 4096 }, "max_restarts": { "type": "integer", "minimum": 0 },
        "checkpoint_every": { "description": "steps, or \"auto\" (Young/Daly)", "oneOf": [{ "type": "integer", "minimum": 1 }, { "type": "string", "enum": ["auto"] }] },
        "env": { "type": "object", "description": "each KEY=value at most 131072 bytes", "maxProperties": 256, "additionalProperties": { "type": "string" } } } },
      "Job": { "type": "object", "description": "A job with its attempts, ranks, stop sequence and goodput", "properties": {
        "id": { "type": "string" }, "name": { "type": "string" }, "spec": { "$ref": "#/components/schemas/JobSpec" },
        "state": { "type": "string", "enum": ["queued", "starting", "running", "stopping", "completed", "failed", "cancelled"] },
        "reason": { "type": "string" }, "attempt": { "type": "integer" }, "restarts": { "type": "integer" },
        "nodes": { "type": "array", "items": { "type": "string" } }, "master_addr": { "type": "string", "nullable": true }, "master_port": { "type": "integer", "nullable": true },
        "ranks": { "type": "array", "items": { "type": "object" } }, "stop": { "type": "object", "nullable": true },
        "history": { "type": "array", "items": { "type": "object" } }, "goodput": { "type": "object" }, "measured": { "type": "object" },
        "checkpoint_interval": { "type": "integer", "nullable": true }, "step": { "type": "integer", "nullable": true },
        "loss": { "type": "number", "nullable": true }, "goodput_ratio": { "type": "number" } } },
      "Progress": { "type": "object", "description": "fleetmend_proto::Progress", "required": ["job", "attempt", "rank", "step", "loss", "samples_per_second", "at_ms"], "properties": {
        "job": { "type": "string", "maxLength": 256 }, "waiting_for": { "type": "array", "maxItems": 100000, "items": { "type": "integer" } } } },
      "ProgressReply": { "type": "object", "properties": { "checkpoint_every": { "type": "integer", "nullable": true } } },
      "ReportReply": { "type": "object", "properties": { "commands": { "type": "array", "items": { "type": "object", "properties": { "id": { "type": "string" }, "kind": { "type": "string" } } } } } }
    }
  },
  "security": [{ "bearer": [] }],
  "paths": {
    "/v1/reports": { "post": { "x-fleetmend-role": "agent", "summary": "An agent's report; the reply carries commands for the node",
      "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Report" } } } },
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no token, or one that is no agent's", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential that is no agent's, a node's token on a report for another node, or a node outside the inventory (refused, or beyond max_unknown)", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "accepted", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReportReply" } } } },
        "400": { "description": "malformed", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "413": { "description": "body too large", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/alerts/alertmanager": { "post": { "x-fleetmend-role": "alerts", "summary": "Alertmanager webhook (version 4): firing alerts naming a node become its findings; resolved ones clear them",
      "parameters": [{ "name": "token", "in": "query", "required": false, "schema": { "type": "string" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no token, or not the alerts token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential that is not the alerts token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "accepted, skipped and unknown nodes counted" }, "400": { "description": "malformed", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/alerts/cloudwatch": { "post": { "x-fleetmend-role": "alerts", "summary": "SNS HTTP notification whose Message is a CloudWatch alarm; SubscriptionConfirmation is recorded for the operator",
      "parameters": [{ "name": "token", "in": "query", "required": false, "schema": { "type": "string" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no token, or not the alerts token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential that is not the alerts token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "accepted" }, "400": { "description": "malformed", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/nodes": { "get": { "x-fleetmend-role": "read", "summary": "Every node", "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "nodes", "content": { "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/NodeSummary" } } } } } } } },
    "/v1/nodes/{name}": { "get": { "x-fleetmend-role": "read", "summary": "One node with its findings, history, workflows and recent events",
      "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "the node" }, "404": { "description": "no such node", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/nodes/{name}/evidence": { "get": { "x-fleetmend-role": "read", "summary": "The evidence bundles gathered on the node before its disruptive repairs, newest first",
      "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }, { "name": "limit", "in": "query", "schema": { "type": "integer", "minimum": 1, "maximum": 100 } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "bundles", "content": { "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/Evidence" } } } } }, "404": { "description": "no such node", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/nodes/{name}/drain": { "post": { "x-fleetmend-role": "operator", "summary": "Drain the node (as a person)", "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the operator role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "workflow started" }, "404": { "description": "no such node", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "409": { "description": "in a workflow already", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/nodes/{name}/undrain": { "post": { "x-fleetmend-role": "operator", "summary": "Put a drained or quarantined node back (only if fleetmend drained it)", "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the operator role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "outcome" }, "404": { "description": "no such node", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "409": { "description": "in a workflow", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/nodes/{name}/repair": { "post": { "x-fleetmend-role": "operator", "summary": "Start a drain, reboot or replace now (as a person)", "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
      "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "properties": { "action": { "$ref": "#/components/schemas/Action" } }, "required": ["action"] } } } },
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the operator role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "workflow started" }, "400": { "description": "bad action", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "404": { "description": "no such node", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "409": { "description": "in a workflow already", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/nodes/{name}/approve": { "post": { "x-fleetmend-role": "operator", "summary": "Approve the action waiting on the node (approve mode); the body may bound it", "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
      "requestBody": { "required": false, "content": { "application/json": { "schema": { "type": "object", "properties": { "action": { "$ref": "#/components/schemas/Action" } } } } } },
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the operator role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "204": { "description": "approved" }, "404": { "description": "no such node", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/events": { "get": { "x-fleetmend-role": "read", "summary": "The audit trail, oldest first",
      "parameters": [{ "name": "after", "in": "query", "schema": { "type": "integer" } }, { "name": "node", "in": "query", "schema": { "type": "string" } }, { "name": "limit", "in": "query", "schema": { "type": "integer" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "events", "content": { "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/Event" } } } } } } } },
    "/v1/breaker": { "get": { "x-fleetmend-role": "read", "summary": "The breaker", "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "state", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Breaker" } } } } } } },
    "/v1/breaker/close": { "post": { "x-fleetmend-role": "operator", "summary": "Close the breaker (a person)", "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the operator role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "state", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Breaker" } } } } } } },
    "/v1/sd/prometheus": { "get": { "x-fleetmend-role": "read", "summary": "Prometheus HTTP service discovery (http_sd_configs): one target group per node whose agent told its metrics port (labels node, state, component=agent; retired nodes left out), and the repairer itself at the Host the request named (component=repairer)",
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "target groups", "content": { "application/json": { "schema": { "type": "array", "items": { "type": "object", "properties": {
        "targets": { "type": "array", "items": { "type": "string", "description": "host:port" } },
        "labels": { "type": "object", "additionalProperties": { "type": "string" } } }, "required": ["targets", "labels"] } } } } } } } },
    "/v1/subscriptions": { "get": { "x-fleetmend-role": "admin", "summary": "SNS subscription confirmations waiting for an operator", "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the admin role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "list" } } } },
    "/v1/jobs": {
      "get": { "x-fleetmend-role": "read", "summary": "Every job of the embedded queue, oldest first", "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "jobs", "content": { "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/Job" } } } } }, "404": { "description": "no embedded queue", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } },
      "post": { "x-fleetmend-role": "operator", "summary": "Submit a job", "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/JobSpec" } } } },
        "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the operator role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "201": { "description": "queued", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Job" } } } }, "400": { "description": "invalid: the message names the field", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "404": { "description": "no embedded queue", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/jobs/{id}": { "get": { "x-fleetmend-role": "read", "summary": "One job", "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the read role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "the job", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Job" } } } }, "404": { "description": "no such job", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/jobs/{id}/cancel": { "post": { "x-fleetmend-role": "operator", "summary": "Cancel a job: SIGTERM then SIGKILL to its ranks", "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "400": { "description": "a query string, path parameter or body that does not read, or a value out of range", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no bearer token, or an unknown one", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a known credential without the operator role", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "the job" }, "404": { "description": "no such job", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "409": { "description": "finished already", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/jobs/{id}/progress": { "post": { "x-fleetmend-role": "rank", "summary": "A rank's progress; the reply carries the checkpoint interval (checkpoint_every auto)", "security": [{ "bearer": [] }],
      "description": "Bearer token: the rank's own (FLEETMEND_PROGRESS_TOKEN), which speaks for that rank of that attempt only.",
      "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
      "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Progress" } } } },
      "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "401": { "description": "no token, or none of this job's rank tokens", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "403": { "description": "a rank's token on a post for another rank or attempt", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "taken", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ProgressReply" } } } }, "400": { "description": "malformed", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "404": { "description": "no such job", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } } } },
    "/v1/openapi.json": { "get": { "x-fleetmend-role": "none", "summary": "This document", "security": [], "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "OpenAPI 3.0" } } } },
    "/metrics": { "get": { "x-fleetmend-role": "none", "summary": "Prometheus metrics", "security": [], "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "text format 0.0.4" } } } },
    "/healthz": { "get": { "x-fleetmend-role": "none", "summary": "Liveness", "security": [], "responses": { "default": { "description": "any other error: 404 for a path no route has, 405 (with Allow) for a method the path does not take", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "200": { "description": "ok" } } } }
  }
}"##;

#[cfg(test)]
mod tests {
    #[test]
    fn the_spec_is_json_and_describes_every_route() {
        let spec: serde_json::Value = serde_json::from_str(super::SPEC).unwrap();
        let paths = spec["paths"].as_object().unwrap();
        let source = include_str!("api/mod.rs");
        for line in source.lines().filter(|l| l.trim_start().starts_with(".route(\"")) {
            let path = line.split('"').nth(1).unwrap();
            assert!(paths.contains_key(path), "{path} is routed but not in the OpenAPI spec");
        }
        assert_eq!(paths.len(), source.matches(".route(\"").count());
    }

    #[test]
    fn the_documented_bounds_are_the_wire_bounds() {
        use fleetmend_proto::bounds::*;
        let spec: serde_json::Value = serde_json::from_str(super::SPEC).unwrap();
        let schemas = &spec["components"]["schemas"];
        let report = &schemas["Report"]["properties"];
        let finding = &schemas["Finding"]["properties"];
        let result = &report["command_results"]["items"]["properties"];
        let evidence = &result["evidence"]["properties"]["items"];
        let job = &schemas["JobSpec"]["properties"];
        let documented = [
            (&report["findings"]["maxItems"], MAX_FINDINGS),
            (&report["checks"]["maxItems"], MAX_CHECKS),
            (&report["checks"]["items"]["properties"]["check"]["maxLength"], MAX_NAME_BYTES),
            (&report["command_results"]["maxItems"], MAX_COMMAND_RESULTS),
            (&report["ranks"]["maxItems"], MAX_RANKS),
            (&report["ranks"]["items"]["properties"]["job"]["maxLength"], MAX_ID_BYTES),
            (&report["ranks"]["items"]["properties"]["message"]["maxLength"], MAX_MESSAGE_BYTES),
            (&report["boot_id"]["maxLength"], MAX_ID_BYTES),
            (&report["agent_version"]["maxLength"], MAX_ID_BYTES),
            (&report["address"]["maxLength"], MAX_ADDRESS_BYTES),
            (&finding["check"]["maxLength"], MAX_NAME_BYTES),
            (&finding["finding"]["maxLength"], MAX_NAME_BYTES),
            (&finding["subject"]["maxLength"], MAX_SUBJECT_BYTES),
            (&finding["message"]["maxLength"], MAX_MESSAGE_BYTES),
            (&finding["labels"]["maxProperties"], MAX_LABELS),
            (&finding["labels"]["additionalProperties"]["maxLength"], MAX_LABEL_VALUE_BYTES),
            (&result["id"]["maxLength"], MAX_ID_BYTES),
            (&result["kind"]["maxLength"], MAX_NAME_BYTES),
            (&result["message"]["maxLength"], MAX_MESSAGE_BYTES),
            (&result["findings"]["maxItems"], MAX_FINDINGS),
            (&evidence["maxItems"], MAX_EVIDENCE_ITEMS),
            (&evidence["items"]["properties"]["name"]["maxLength"], MAX_NAME_BYTES),
            (&evidence["items"]["properties"]["source"]["maxLength"], MAX_SOURCE_BYTES),
            (&evidence["items"]["properties"]["error"]["maxLength"], MAX_MESSAGE_BYTES),
            (&schemas["Progress"]["properties"]["job"]["maxLength"], MAX_ID_BYTES),
            (&schemas["Progress"]["properties"]["waiting_for"]["maxItems"], MAX_JOB_RANKS as usize),
            (&job["argv"]["maxItems"], MAX_ARGS),
            (&job["argv"]["items"]["maxLength"], MAX_ARG_BYTES),
            (&job["env"]["maxProperties"], MAX_ENV),
            (&job["checkpoint_dir"]["maxLength"], MAX_PATH_BYTES),
        ];
        for (i, (value, bound)) in documented.iter().enumerate() {
            assert_eq!(value.as_u64(), Some(*bound as u64), "documented bound {i}");
        }
    }
}
