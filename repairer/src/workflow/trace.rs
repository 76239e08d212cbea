//! OpenTelemetry traces of the repair workflows: one trace per workflow, exported over OTLP/gRPC
//! when `[telemetry] otlp_endpoint` is set.
//!
//! A workflow's trace: a root span `repair <action> <node>` (`release <node>`, `quarantine <node>`)
//! from the fault's first sighting to the workflow's end; a `detect` child from that sighting to the
//! decision; and one child per step (`drain`, `checkpoint`, `requeue`, `settle`, `repair`,
//! `await-boot`, `await-replacement`, `validate`, `undrain`) from when the step began to when the
//! workflow moved on. Spans carry the node, action, rule, workflow id and attempt; a step's retries
//! are events on its span; the step that ends the workflow and the root carry the outcome.
//!
//! Workflows outlive processes: a repairer restarted mid-repair resumes the workflow, and the trace
//! with it. So the root span's ids are chosen when the workflow starts and stored with it
//! ([`TraceParent`]); every child names that stored root as its parent (after a restart, a remote
//! parent); and the root span itself is recorded once, when the workflow finishes, with the stored
//! ids and the workflow's start time. A root span held open for the workflow's hours instead would
//! be lost with the process that held it, or exported twice.
//!
//! The API is used directly (span builders and explicit parent contexts) rather than through
//! `tracing-opentelemetry`: a workflow is a durable object, not a call stack, and the mapping from
//! its steps to spans stays in one place.

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider, TracerProviderBuilder,
};
use serde::{Deserialize, Serialize};

use super::{Outcome, Step, Workflow, WorkflowKind};
use crate::model::RuleAction;

/// Traces (`[telemetry]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/gRPC endpoint for the repair workflows' traces (e.g. `http://127.0.0.1:4317`). Unset:
    /// no traces are exported.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported traces (one per cluster's repairer tells them apart).
    pub service_name: String,
    /// Longest one export to the collector may take (and a flush at shutdown, twice that).
    #[serde(with = "humantime_serde")]
    pub export_timeout: std::time::Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "fleetmend-repairer".to_owned(),
            export_timeout: std::time::Duration::from_secs(10),
        }
    }
}

/// Span attribute keys.
pub mod attr {
    pub const NODE: &str = "fleetmend.node";
    pub const ACTION: &str = "fleetmend.action";
    pub const RULE: &str = "fleetmend.rule";
    pub const WORKFLOW_ID: &str = "fleetmend.workflow.id";
    pub const WORKFLOW_KIND: &str = "fleetmend.workflow.kind";
    pub const STEP: &str = "fleetmend.step";
    pub const ATTEMPT: &str = "fleetmend.attempt";
    /// How a step or the workflow ended: `next` (a step that moved on) or the workflow's outcome.
    pub const OUTCOME: &str = "fleetmend.outcome";
    /// The step the workflow moved on to.
    pub const NEXT_STEP: &str = "fleetmend.next_step";
    /// The latest error of a step that was retried.
    pub const ERROR: &str = "fleetmend.error";
    /// The action a failed reboot escalated to.
    pub const ESCALATED_TO: &str = "fleetmend.escalated_to";
    /// The span was started by a repairer that resumed the workflow after a restart.
    pub const RESUMED: &str = "fleetmend.resumed";
    /// A step span ended because its process stopped, not because the step did.
    pub const INTERRUPTED: &str = "fleetmend.interrupted";
    pub const REASON: &str = "fleetmend.reason";
    pub const FINDINGS: &str = "fleetmend.findings";
    pub const REPLACEMENT: &str = "fleetmend.replacement";
}

/// The instrumentation scope of the spans.
pub const SCOPE: &str = "fleetmend-repairer";

/// The ids of a workflow's root span, stored with the workflow (lowercase hex) so a resumed
/// workflow continues its trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceParent {
    pub trace_id: String,
    pub span_id: String,
}

impl TraceParent {
    fn new(trace_id: TraceId, span_id: SpanId) -> TraceParent {
        TraceParent { trace_id: trace_id.to_string(), span_id: span_id.to_string() }
    }

    /// The ids, or `None` when they do not parse or are the invalid all-zero ids.
    pub fn ids(&self) -> Option<(TraceId, SpanId)> {
        let trace_id = TraceId::from_hex(&self.trace_id).ok().filter(|t| *t != TraceId::INVALID)?;
        let span_id = SpanId::from_hex(&self.span_id).ok().filter(|s| *s != SpanId::INVALID)?;
        Some((trace_id, span_id))
    }
}

/// Setting up or flushing traces failed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("building the OTLP exporter for {endpoint}: {message}")]
    Exporter { endpoint: String, message: String },
    #[error("flushing traces: {0}")]
    Flush(String),
    #[error("shutting down the trace exporter: {0}")]
    Shutdown(String),
}

/// The tracer of repair workflows and the provider that exports its spans.
#[derive(Debug)]
pub struct WorkflowTracer {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Longest a flush or shutdown is awaited.
    flush_timeout: Duration,
}

impl WorkflowTracer {
    /// The OTLP/gRPC tracer of `config`, or `None` when no endpoint is set. Spans go out in batches
    /// from the SDK's own thread through a lazily connected channel: no collector listening costs
    /// failed exports (logged by the SDK), nothing else. Call within a Tokio runtime (the gRPC
    /// channel's worker runs on it).
    pub fn from_config(config: &TelemetryConfig) -> Result<Option<WorkflowTracer>, TelemetryError> {
        let Some(endpoint) = config.otlp_endpoint.as_deref() else { return Ok(None) };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|err| TelemetryError::Exporter {
                endpoint: endpoint.to_owned(),
                message: err.to_string(),
            })?;
        let builder = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(
            Resource::builder().with_service_name(config.service_name.clone()).build(),
        );
        // A flush may wait for a batch already being exported, then export the rest.
        Ok(Some(WorkflowTracer::new(builder, config.export_timeout.saturating_mul(2))))
    }

    /// A tracer over the provider `builder` makes (tests give one with their own exporter). Its id
    /// generator is replaced: finished workflows record their root span under stored ids.
    pub fn new(builder: TracerProviderBuilder, flush_timeout: Duration) -> WorkflowTracer {
        let provider = builder.with_id_generator(StoredRootIds::default()).build();
        let scope =
            InstrumentationScope::builder(SCOPE).with_version(env!("CARGO_PKG_VERSION")).build();
        let tracer = provider.tracer_with_scope(scope);
        WorkflowTracer { provider, tracer, flush_timeout }
    }

    /// Exports every ended span now. The SDK blocks the calling thread while the export runs on
    /// the runtime, so the wait happens on a blocking thread.
    pub async fn flush(&self) -> Result<(), TelemetryError> {
        let provider = self.provider.clone();
        let flushed = tokio::time::timeout(
            self.flush_timeout,
            tokio::task::spawn_blocking(move || provider.force_flush()),
        )
        .await;
        match flushed {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => Err(TelemetryError::Flush(err.to_string())),
            Ok(Err(join)) => Err(TelemetryError::Flush(join.to_string())),
            Err(_) => {
                Err(TelemetryError::Flush(format!("not done within {:?}", self.flush_timeout)))
            }
        }
    }

    /// Exports every ended span and stops the exporter (at service stop).
    pub async fn shutdown(&self) -> Result<(), TelemetryError> {
        let provider = self.provider.clone();
        let timeout = self.flush_timeout;
        let stopped = tokio::time::timeout(
            timeout,
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout)),
        )
        .await;
        match stopped {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => Err(TelemetryError::Shutdown(err.to_string())),
            Ok(Err(join)) => Err(TelemetryError::Shutdown(join.to_string())),
            Err(_) => Err(TelemetryError::Shutdown(format!("not done within {timeout:?}"))),
        }
    }
}

thread_local! {
    // Ids the next root span started on this thread takes (see `StoredRootIds`).
    static PINNED_TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
    static PINNED_SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// Random ids, except while [`start_root_with_ids`] starts a workflow's root span: the SDK asks its
/// id generator for a root span's ids synchronously, on the calling thread, so ids pinned in
/// thread-locals just before the call reach that one span and no other.
#[derive(Debug, Default)]
struct StoredRootIds {
    random: RandomIdGenerator,
}

impl IdGenerator for StoredRootIds {
    fn new_trace_id(&self) -> TraceId {
        PINNED_TRACE_ID.with(Cell::take).unwrap_or_else(|| self.random.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        PINNED_SPAN_ID.with(Cell::take).unwrap_or_else(|| self.random.new_span_id())
    }
}

fn start_root_with_ids(
    tracer: &SdkTracer,
    builder: opentelemetry::trace::SpanBuilder,
    trace_id: TraceId,
    span_id: SpanId,
) -> opentelemetry_sdk::trace::Span {
    PINNED_TRACE_ID.with(|p| p.set(Some(trace_id)));
    PINNED_SPAN_ID.with(|p| p.set(Some(span_id)));
    let span = builder.start_with_context(tracer, &Context::new());
    // Not taken when the provider is shut down (no span is built): never leak to another span.
    PINNED_TRACE_ID.with(|p| p.set(None));
    PINNED_SPAN_ID.with(|p| p.set(None));
    span
}

/// The span name of a step.
pub fn step_name(step: Step) -> &'static str {
    match step {
        Step::Drain => "drain",
        Step::Checkpoint => "checkpoint",
        Step::Requeue => "requeue",
        Step::Settle => "settle",
        Step::Evidence => "evidence",
        Step::Repair => "repair",
        Step::AwaitBoot => "await-boot",
        Step::AwaitReplacement => "await-replacement",
        Step::Validate => "validate",
        Step::Undrain => "undrain",
        Step::Done => "done",
    }
}

/// The root span's name: `repair <action> <node>`, `release <node>`, `quarantine <node>`.
pub fn root_name(workflow: &Workflow) -> String {
    match workflow.kind {
        WorkflowKind::Repair => format!("repair {} {}", workflow.action, workflow.node),
        WorkflowKind::Release => format!("release {}", workflow.node),
        WorkflowKind::Quarantine => format!("quarantine {}", workflow.node),
    }
}

fn kind_name(kind: WorkflowKind) -> &'static str {
    match kind {
        WorkflowKind::Repair => "repair",
        WorkflowKind::Release => "release",
        WorkflowKind::Quarantine => "quarantine",
    }
}

fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// `check/finding{label=value}` of the workflow's findings (the first ten).
fn findings_summary(workflow: &Workflow) -> String {
    workflow
        .findings
        .iter()
        .take(10)
        .map(|f| {
            let labels: Vec<String> = f.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if labels.is_empty() {
                format!("{}/{}", f.check, f.finding)
            } else {
                format!("{}/{}{{{}}}", f.check, f.finding, labels.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn common_attributes(workflow: &Workflow) -> Vec<KeyValue> {
    vec![
        KeyValue::new(attr::NODE, workflow.node.clone()),
        KeyValue::new(attr::ACTION, workflow.action.as_str()),
        KeyValue::new(attr::RULE, workflow.rule.clone()),
        KeyValue::new(attr::WORKFLOW_ID, workflow.id),
        KeyValue::new(attr::WORKFLOW_KIND, kind_name(workflow.kind)),
    ]
}

/// The trace of one workflow in this process; inert when traces are off.
#[derive(Debug)]
pub struct WorkflowTrace {
    active: Option<ActiveTrace>,
}

#[derive(Debug)]
struct ActiveTrace {
    tracer: SdkTracer,
    trace_id: TraceId,
    root_span_id: SpanId,
    /// The stored root as the parent of every child span.
    parent: Context,
    resumed: bool,
    /// The root's ids were chosen now: the caller stores them with the workflow.
    assigned: bool,
    step: Option<StepSpan>,
}

/// The span of the current step.
#[derive(Debug)]
struct StepSpan {
    span: opentelemetry_sdk::trace::Span,
    action: RuleAction,
}

impl StepSpan {
    fn end(mut self, workflow: &Workflow, outcome: &str, at: SystemTime) {
        self.span.set_attribute(KeyValue::new(attr::OUTCOME, outcome.to_owned()));
        if workflow.action != self.action {
            self.span.set_attribute(KeyValue::new(attr::ESCALATED_TO, workflow.action.as_str()));
        }
        self.span.end_with_timestamp(at);
    }
}

impl Drop for StepSpan {
    // The SDK ends and exports a span when it is dropped: say why this one ended (the task was
    // dropped with its runtime at shutdown). The resumed workflow starts the step's span again.
    fn drop(&mut self) {
        if self.span.is_recording() {
            self.span.set_attribute(KeyValue::new(attr::INTERRUPTED, true));
            self.span.end();
        }
    }
}

impl WorkflowTrace {
    /// Starts tracing `workflow` in this process: a fresh workflow gets its root ids (stored in
    /// `workflow.trace`: persist it when [`WorkflowTrace::assigned_root`] says so) and its `detect`
    /// span; a resumed one continues the stored trace. Either way the current step's span starts.
    pub fn begin(
        tracer: Option<&WorkflowTracer>,
        workflow: &mut Workflow,
        now_ms: u64,
    ) -> WorkflowTrace {
        let Some(tracer) = tracer else { return WorkflowTrace { active: None } };
        let stored = workflow.trace.as_ref().and_then(TraceParent::ids);
        let resumed = stored.is_some();
        let (trace_id, root_span_id) = stored.unwrap_or_else(|| {
            let random = RandomIdGenerator::default();
            (random.new_trace_id(), random.new_span_id())
        });
        if !resumed {
            workflow.trace = Some(TraceParent::new(trace_id, root_span_id));
        }
        let parent = Context::new().with_remote_span_context(SpanContext::new(
            trace_id,
            root_span_id,
            TraceFlags::SAMPLED,
            resumed,
            TraceState::default(),
        ));
        let mut active = ActiveTrace {
            tracer: tracer.tracer.clone(),
            trace_id,
            root_span_id,
            parent,
            resumed,
            assigned: !resumed,
            step: None,
        };
        if !resumed && workflow.kind != WorkflowKind::Release {
            let mut detect = active.child("detect", workflow, at_ms(root_start_ms(workflow)));
            detect.set_attribute(KeyValue::new(attr::FINDINGS, findings_summary(workflow)));
            detect.set_attribute(KeyValue::new(attr::REASON, workflow.reason.clone()));
            detect.end_with_timestamp(at_ms(workflow.started_ms));
        }
        // A fresh workflow's first step began at the decision; a resumed one's span starts now (the
        // interrupted process ended its own).
        let start = if resumed { at_ms(now_ms) } else { at_ms(workflow.step_since_ms) };
        active.step = Some(active.start_step(workflow, start));
        WorkflowTrace { active: Some(active) }
    }

    /// Whether [`WorkflowTrace::begin`] chose the root's ids (to be persisted with the workflow).
    pub fn assigned_root(&self) -> bool {
        self.active.as_ref().is_some_and(|a| a.assigned)
    }

    /// The trace's id, when traced.
    pub fn trace_id(&self) -> Option<TraceId> {
        self.active.as_ref().map(|a| a.trace_id)
    }

    /// The workflow moved on to `workflow.step`: ends the previous step's span, starts this one's.
    pub fn step(&mut self, workflow: &Workflow) {
        let Some(active) = &mut self.active else { return };
        // The step began when the workflow's clock said it did.
        let now = at_ms(workflow.step_since_ms);
        if let Some(previous) = active.step.take() {
            let mut previous = previous;
            previous.span.set_attribute(KeyValue::new(attr::NEXT_STEP, step_name(workflow.step)));
            previous.end(workflow, "next", now);
        }
        active.step = Some(active.start_step(workflow, now));
    }

    /// The current step failed with `error` and will be retried.
    pub fn retry(&mut self, workflow: &Workflow, error: &str) {
        let Some(step) = self.active.as_mut().and_then(|a| a.step.as_mut()) else { return };
        step.span.add_event(
            "retry",
            vec![
                KeyValue::new(attr::ERROR, error.to_owned()),
                KeyValue::new(attr::ATTEMPT, i64::from(workflow.attempt)),
            ],
        );
        step.span.set_attribute(KeyValue::new(attr::ERROR, error.to_owned()));
    }

    /// The workflow finished (`workflow.outcome` set): ends the last step's span and records the
    /// root span under the stored ids, from the fault's first sighting to now.
    pub fn finish(&mut self, workflow: &Workflow) {
        let Some(mut active) = self.active.take() else { return };
        // A finished workflow's last step time is when it finished.
        let now = at_ms(workflow.step_since_ms);
        let outcome = workflow.outcome.map(Outcome::as_str).unwrap_or("unknown");
        let failed = workflow.outcome == Some(Outcome::Quarantined);
        if let Some(mut step) = active.step.take() {
            if failed {
                step.span.set_status(Status::error(workflow.reason.clone()));
            }
            step.end(workflow, outcome, now);
        }
        let mut attributes = common_attributes(workflow);
        attributes.extend([
            KeyValue::new(attr::ATTEMPT, i64::from(workflow.attempt)),
            KeyValue::new(attr::OUTCOME, outcome),
            KeyValue::new(attr::REASON, workflow.reason.clone()),
            KeyValue::new(attr::FINDINGS, findings_summary(workflow)),
        ]);
        if let Some(replacement) = &workflow.replacement {
            attributes.push(KeyValue::new(attr::REPLACEMENT, replacement.clone()));
        }
        if active.resumed {
            attributes.push(KeyValue::new(attr::RESUMED, true));
        }
        let builder = active
            .tracer
            .span_builder(root_name(workflow))
            .with_kind(SpanKind::Internal)
            .with_start_time(at_ms(root_start_ms(workflow)))
            .with_attributes(attributes);
        let mut root =
            start_root_with_ids(&active.tracer, builder, active.trace_id, active.root_span_id);
        if failed {
            root.set_status(Status::error(workflow.reason.clone()));
        }
        root.end_with_timestamp(now);
    }
}

/// The root covers the fault's first sighting (detection) to the end.
fn root_start_ms(workflow: &Workflow) -> u64 {
    workflow.fault_since_ms.min(workflow.started_ms)
}

impl ActiveTrace {
    fn child(
        &self,
        name: &'static str,
        workflow: &Workflow,
        start: SystemTime,
    ) -> opentelemetry_sdk::trace::Span {
        let mut attributes = common_attributes(workflow);
        attributes.push(KeyValue::new(attr::ATTEMPT, i64::from(workflow.attempt)));
        if self.resumed {
            attributes.push(KeyValue::new(attr::RESUMED, true));
        }
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.parent)
    }

    fn start_step(&self, workflow: &Workflow, start: SystemTime) -> StepSpan {
        let mut span = self.child(step_name(workflow.step), workflow, start);
        span.set_attribute(KeyValue::new(attr::STEP, step_name(workflow.step)));
        StepSpan { span, action: workflow.action }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::Value;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};

    use super::*;

    /// Keeps every exported span.
    #[derive(Debug, Clone, Default)]
    struct Collected(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Collected {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    impl Collected {
        fn spans(&self) -> Vec<SpanData> {
            self.0.lock().unwrap().clone()
        }
    }

    fn tracer(collected: &Collected) -> WorkflowTracer {
        WorkflowTracer::new(
            SdkTracerProvider::builder().with_simple_exporter(collected.clone()),
            Duration::from_secs(5),
        )
    }

    fn attribute(span: &SpanData, key: &str) -> Option<Value> {
        span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.clone())
    }

    fn reboot_workflow() -> Workflow {
        let mut workflow = Workflow::repair(
            "gpu-7",
            RuleAction::Reboot,
            "xid-fallen-off-bus",
            "xid 79",
            Vec::new(),
            1_000,
            "boot-a",
            2_000,
        );
        workflow.id = 42;
        workflow
    }

    #[test]
    fn a_workflow_is_one_trace_with_a_span_per_step_under_its_root() {
        let collected = Collected::default();
        let tracer = tracer(&collected);
        let mut workflow = reboot_workflow();
        let mut trace = WorkflowTrace::begin(Some(&tracer), &mut workflow, 3_000);
        assert!(trace.assigned_root());
        let stored = workflow.trace.clone().expect("root ids stored with the workflow");
        for step in [Step::Checkpoint, Step::Settle, Step::Repair] {
            workflow.step = step;
            trace.step(&workflow);
        }
        trace.retry(&workflow, "provider said no");
        workflow.step = Step::AwaitBoot;
        trace.step(&workflow);
        workflow.outcome = Some(Outcome::Repaired);
        trace.finish(&workflow);

        let spans = collected.spans();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "detect",
                "drain",
                "checkpoint",
                "settle",
                "repair",
                "await-boot",
                "repair reboot gpu-7"
            ]
        );
        let root = spans.last().unwrap();
        assert_eq!(root.span_context.trace_id().to_string(), stored.trace_id);
        assert_eq!(root.span_context.span_id().to_string(), stored.span_id);
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        assert_eq!(root.start_time, at_ms(1_000));
        assert_eq!(attribute(root, attr::OUTCOME), Some(Value::from("repaired")));
        for child in &spans[..spans.len() - 1] {
            assert_eq!(child.span_context.trace_id(), root.span_context.trace_id());
            assert_eq!(child.parent_span_id, root.span_context.span_id(), "{}", child.name);
            assert_eq!(attribute(child, attr::NODE), Some(Value::from("gpu-7")));
            assert_eq!(attribute(child, attr::WORKFLOW_ID), Some(Value::I64(42)));
        }
        let repair = &spans[4];
        assert_eq!(repair.events.events.len(), 1);
        assert_eq!(attribute(repair, attr::ERROR), Some(Value::from("provider said no")));
        assert_eq!(attribute(repair, attr::NEXT_STEP), Some(Value::from("await-boot")));
    }

    #[test]
    fn a_resumed_workflow_continues_its_trace_and_the_root_is_recorded_once() {
        let collected = Collected::default();
        let mut workflow = reboot_workflow();
        {
            // The first process: drains, then stops while checkpointing.
            let tracer = tracer(&collected);
            let mut trace = WorkflowTrace::begin(Some(&tracer), &mut workflow, 3_000);
            workflow.step = Step::Checkpoint;
            trace.step(&workflow);
            drop(trace);
        }
        let interrupted = collected.spans();
        assert_eq!(
            interrupted.iter().map(|s| s.name.as_ref()).collect::<Vec<_>>(),
            ["detect", "drain", "checkpoint"]
        );
        assert_eq!(attribute(&interrupted[2], attr::INTERRUPTED), Some(Value::Bool(true)));

        // The workflow as stored comes back in a new process.
        let stored: Workflow = serde_json::from_str(&serde_json::to_string(&workflow).unwrap())
            .expect("the workflow round-trips");
        let mut workflow = stored;
        let tracer = tracer(&collected);
        let mut trace = WorkflowTrace::begin(Some(&tracer), &mut workflow, 3_000);
        assert!(!trace.assigned_root(), "a resumed workflow keeps its root");
        workflow.step = Step::Settle;
        trace.step(&workflow);
        workflow.outcome = Some(Outcome::Drained);
        trace.finish(&workflow);

        let spans = collected.spans();
        let roots: Vec<&SpanData> =
            spans.iter().filter(|s| s.parent_span_id == SpanId::INVALID).collect();
        assert_eq!(roots.len(), 1, "{spans:#?}");
        let root = roots[0];
        let (trace_id, span_id) = workflow.trace.as_ref().unwrap().ids().unwrap();
        assert_eq!(root.span_context.trace_id(), trace_id);
        assert_eq!(root.span_context.span_id(), span_id);
        assert_eq!(attribute(root, attr::RESUMED), Some(Value::Bool(true)));
        for child in spans.iter().filter(|s| s.parent_span_id != SpanId::INVALID) {
            assert_eq!(child.span_context.trace_id(), trace_id, "{}", child.name);
            assert_eq!(child.parent_span_id, span_id, "{}", child.name);
        }
        let after: Vec<&str> = spans[3..].iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(after, ["checkpoint", "settle", "repair reboot gpu-7"]);
        assert!(spans[3].parent_span_is_remote, "after a restart the root is a remote parent");
    }

    #[test]
    fn pinned_ids_reach_only_the_root_span() {
        let collected = Collected::default();
        let tracer = tracer(&collected);
        let mut workflow = reboot_workflow();
        let mut trace = WorkflowTrace::begin(Some(&tracer), &mut workflow, 3_000);
        workflow.outcome = Some(Outcome::Drained);
        trace.finish(&workflow);
        let other = tracer.tracer.start("unrelated");
        let (trace_id, span_id) = workflow.trace.as_ref().unwrap().ids().unwrap();
        assert_ne!(other.span_context().trace_id(), trace_id);
        assert_ne!(other.span_context().span_id(), span_id);
    }

    #[test]
    fn without_a_tracer_nothing_is_traced_or_stored() {
        let mut workflow = reboot_workflow();
        let mut trace = WorkflowTrace::begin(None, &mut workflow, 3_000);
        workflow.step = Step::Checkpoint;
        trace.step(&workflow);
        trace.finish(&workflow);
        assert!(!trace.assigned_root());
        assert_eq!(workflow.trace, None);
    }
}
