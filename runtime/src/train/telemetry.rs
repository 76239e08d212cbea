//! OpenTelemetry traces of the trainer's checkpoints and restores, exported over OTLP/gRPC when
//! `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) names a collector. Without one nothing is
//! built: no exporter, no thread, no runtime.
//!
//! Spans (names and attribute keys are stable; `docs/checkpoint-protocol.md`, "Traces"):
//! - `checkpoint`: one per checkpoint rank 0 wrote, from the snapshot (the training stall) to the
//!   manifest's atomic rename; step, bytes, stall and write seconds, path and trigger; error
//!   status when the write failed.
//! - `restore`: a run that found checkpoints to resume from: the search for the newest valid one
//!   and its load; the step restored, its path, how many were skipped (each skip an event with
//!   its path and reason) and the seconds it took; error status when resuming was refused.
//!
//! Both are root spans, tied to their run by attributes (job id, rank, attempt) rather than by a
//! parent `train` span: a run lasts hours and a span is exported only when it ends, so a root held
//! open for the run would be lost with the process on exactly the crashes worth tracing, and one
//! recorded at the end would be missing for them too.
//!
//! Ranks: only rank 0 writes checkpoints, so only rank 0 exports `checkpoint` spans. Every rank
//! resumes, so every rank exports its `restore` span: rank 0's covers the search and load
//! (`fleetmend.restore.source` = `checkpoint`); another rank's covers receiving rank 0's state
//! (`source` = `rank 0`), so a rank slow to start shows.
//!
//! A checkpoint is written on a background thread: its span is built afterwards with the
//! recorded start and end times rather than carried across threads.
//!
//! Exporting never fails or slows training: spans leave in batches from the SDK's own thread, an
//! export error is reported once on stderr, and at exit the provider is shut down within
//! [`SHUTDOWN_LIMIT`], whatever the collector does. (A SIGTERM before training starts exits at
//! once, as the protocol says, and a `restore` span not yet exported then goes with it.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};

/// The `service.name` of the trainer's spans.
pub const SERVICE_NAME: &str = "fleetmend-train";
/// The instrumentation scope of the spans.
pub const SCOPE: &str = "fleetmend-train";
/// Longest one export may take (connecting included).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest the exit waits for the last spans to leave.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_millis(1500);

/// Span names.
pub mod span {
    pub const CHECKPOINT: &str = "checkpoint";
    pub const RESTORE: &str = "restore";
}

/// Attribute keys (on the resource and on every span: job, rank, world size, attempt).
pub mod attr {
    pub const JOB_ID: &str = "fleetmend.job.id";
    pub const RANK: &str = "fleetmend.rank";
    pub const WORLD_SIZE: &str = "fleetmend.world_size";
    /// The restart count (FLEETMEND_RESTART_COUNT): 0 for a job's first run.
    pub const ATTEMPT: &str = "fleetmend.attempt";
    pub const CHECKPOINT_STEP: &str = "fleetmend.checkpoint.step";
    pub const CHECKPOINT_BYTES: &str = "fleetmend.checkpoint.bytes";
    pub const CHECKPOINT_PATH: &str = "fleetmend.checkpoint.path";
    pub const CHECKPOINT_STALL_SECONDS: &str = "fleetmend.checkpoint.stall_seconds";
    pub const CHECKPOINT_WRITE_SECONDS: &str = "fleetmend.checkpoint.write_seconds";
    /// What asked for the checkpoint: see [`super::Trigger`].
    pub const CHECKPOINT_TRIGGER: &str = "fleetmend.checkpoint.trigger";
    pub const RESTORE_STEP: &str = "fleetmend.restore.step";
    pub const RESTORE_PATH: &str = "fleetmend.restore.path";
    pub const RESTORE_SKIPPED: &str = "fleetmend.restore.skipped";
    pub const RESTORE_SECONDS: &str = "fleetmend.restore.seconds";
    /// `checkpoint` (read from the directory) or `rank 0` (received from rank 0).
    pub const RESTORE_SOURCE: &str = "fleetmend.restore.source";
    /// On a `checkpoint skipped` event: the checkpoint and why it was skipped.
    pub const SKIPPED_PATH: &str = "fleetmend.checkpoint.path";
    pub const SKIPPED_REASON: &str = "fleetmend.reason";
}

/// The event on a `restore` span for each checkpoint passed over.
pub const SKIPPED_EVENT: &str = "checkpoint skipped";

/// What asked for a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `--checkpoint-every` (or the queue's interval) came around.
    Interval,
    /// SIGUSR1 on some rank.
    Sigusr1,
    /// A stop (SIGTERM or SIGINT on some rank): the checkpoint before exiting.
    Sigterm,
    /// The end of the run.
    Final,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Interval => "interval",
            Trigger::Sigusr1 => "sigusr1",
            Trigger::Sigterm => "sigterm",
            Trigger::Final => "final",
        }
    }
}

/// Who this run is, as every span and the resource say.
#[derive(Debug, Clone)]
pub struct RunIdentity {
    pub job_id: String,
    pub rank: usize,
    pub world_size: usize,
    pub attempt: u32,
}

impl RunIdentity {
    fn attributes(&self) -> Vec<KeyValue> {
        vec![
            KeyValue::new(attr::JOB_ID, self.job_id.clone()),
            KeyValue::new(attr::RANK, self.rank as i64),
            KeyValue::new(attr::WORLD_SIZE, self.world_size as i64),
            KeyValue::new(attr::ATTEMPT, i64::from(self.attempt)),
        ]
    }

    /// The resource of the run's spans: the service name and the run's identity.
    pub fn resource(&self) -> Resource {
        Resource::builder()
            .with_service_name(SERVICE_NAME)
            .with_attributes(self.attributes())
            .build()
    }
}

/// Setting up the exporter failed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("starting the OTLP export thread: {0}")]
    Runtime(std::io::Error),
    #[error("OTLP endpoint {endpoint:?}: {message}")]
    Exporter { endpoint: String, message: String },
}

/// The trainer's tracer and the provider exporting its spans.
#[derive(Debug)]
pub struct TrainTelemetry {
    identity: RunIdentity,
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// The gRPC channel's worker runs here (the trainer has no async runtime of its own).
    runtime: Option<tokio::runtime::Runtime>,
}

impl TrainTelemetry {
    /// The OTLP/gRPC exporter to `endpoint` (`http://host:port`). The channel connects lazily:
    /// a collector that is down costs failed exports, nothing else.
    pub fn start(endpoint: &str, identity: RunIdentity) -> Result<TrainTelemetry, TelemetryError> {
        let failed =
            |message: String| TelemetryError::Exporter { endpoint: endpoint.to_owned(), message };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(failed("must start with http:// or https://".to_owned()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_all()
            .build()
            .map_err(TelemetryError::Runtime)?;
        let exporter = {
            let _entered = runtime.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|err| failed(err.to_string()))?
        };
        let exporter =
            ReportOnce { inner: exporter, reported: Arc::default(), endpoint: endpoint.to_owned() };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(identity.resource())
            .build();
        let scope =
            InstrumentationScope::builder(SCOPE).with_version(env!("CARGO_PKG_VERSION")).build();
        let tracer = provider.tracer_with_scope(scope);
        Ok(TrainTelemetry { identity, provider, tracer, runtime: Some(runtime) })
    }

    /// Records the `checkpoint` span of a finished write (ok or failed).
    pub fn checkpoint(&self, record: &CheckpointRecord) {
        let mut attributes = self.identity.attributes();
        attributes.extend([
            KeyValue::new(attr::CHECKPOINT_STEP, record.step as i64),
            KeyValue::new(attr::CHECKPOINT_TRIGGER, record.trigger.as_str()),
            KeyValue::new(attr::CHECKPOINT_STALL_SECONDS, record.stall_seconds),
        ]);
        if let Ok(written) = &record.outcome {
            attributes.extend([
                KeyValue::new(attr::CHECKPOINT_BYTES, written.bytes as i64),
                KeyValue::new(attr::CHECKPOINT_WRITE_SECONDS, written.write_seconds),
                KeyValue::new(attr::CHECKPOINT_PATH, written.path.clone()),
            ]);
        }
        let mut span = self
            .tracer
            .span_builder(span::CHECKPOINT)
            .with_kind(SpanKind::Internal)
            .with_start_time(record.started_at)
            .with_attributes(attributes)
            .start(&self.tracer);
        if let Err(reason) = &record.outcome {
            span.set_status(Status::error(reason.clone()));
        }
        span.end_with_timestamp(record.ended_at.max(record.started_at));
    }

    /// Records the `restore` span of this rank's start.
    pub fn restore(&self, record: &RestoreRecord) {
        let mut attributes = self.identity.attributes();
        attributes.extend([
            KeyValue::new(attr::RESTORE_SOURCE, record.source),
            KeyValue::new(attr::RESTORE_SKIPPED, record.skipped.len() as i64),
            KeyValue::new(
                attr::RESTORE_SECONDS,
                record.ended_at.duration_since(record.started_at).map_or(0.0, |d| d.as_secs_f64()),
            ),
        ]);
        if let Some(step) = record.step {
            attributes.push(KeyValue::new(attr::RESTORE_STEP, step as i64));
        }
        if let Some(path) = &record.path {
            attributes.push(KeyValue::new(attr::RESTORE_PATH, path.clone()));
        }
        let mut span = self
            .tracer
            .span_builder(span::RESTORE)
            .with_kind(SpanKind::Internal)
            .with_start_time(record.started_at)
            .with_attributes(attributes)
            .start(&self.tracer);
        for skip in &record.skipped {
            span.add_event_with_timestamp(
                SKIPPED_EVENT,
                skip.at,
                vec![
                    KeyValue::new(attr::SKIPPED_PATH, skip.path.clone()),
                    KeyValue::new(attr::SKIPPED_REASON, skip.reason.clone()),
                ],
            );
        }
        if let Some(reason) = &record.error {
            span.set_status(Status::error(reason.clone()));
        }
        span.end_with_timestamp(record.ended_at.max(record.started_at));
    }

    /// Exports the spans still queued and stops the exporter, within [`SHUTDOWN_LIMIT`]
    /// (a collector that is down or hangs costs at most that). Call on every exit path.
    pub fn shutdown(mut self) {
        if let Err(err) = self.provider.shutdown_with_timeout(SHUTDOWN_LIMIT) {
            eprintln!("fleetmend train: traces: the last spans were not exported: {err}");
        }
        // Export tasks still running are abandoned, not awaited.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A finished checkpoint write, as its span reports it.
#[derive(Debug, Clone)]
pub struct CheckpointRecord {
    pub step: u64,
    pub trigger: Trigger,
    /// When the training stall (the snapshot) began.
    pub started_at: SystemTime,
    /// When the manifest's rename committed it (or the write failed).
    pub ended_at: SystemTime,
    pub stall_seconds: f64,
    pub outcome: Result<WrittenRecord, String>,
}

/// What a committed checkpoint wrote.
#[derive(Debug, Clone)]
pub struct WrittenRecord {
    pub bytes: u64,
    pub write_seconds: f64,
    pub path: String,
}

/// How a rank found its start point.
#[derive(Debug, Clone)]
pub struct RestoreRecord {
    pub source: &'static str,
    pub started_at: SystemTime,
    pub ended_at: SystemTime,
    /// The step resumed from, if any.
    pub step: Option<u64>,
    pub path: Option<String>,
    pub skipped: Vec<SkippedCheckpoint>,
    /// Resuming was refused or the checkpoints could not be read.
    pub error: Option<String>,
}

impl RestoreRecord {
    pub fn begin(source: &'static str) -> RestoreRecord {
        let now = SystemTime::now();
        RestoreRecord {
            source,
            started_at: now,
            ended_at: now,
            step: None,
            path: None,
            skipped: Vec::new(),
            error: None,
        }
    }

    /// Whether there is a restore to report: a checkpoint resumed, skipped or refused.
    pub fn happened(&self) -> bool {
        self.step.is_some() || !self.skipped.is_empty() || self.error.is_some()
    }
}

/// A checkpoint the search passed over.
#[derive(Debug, Clone)]
pub struct SkippedCheckpoint {
    pub path: String,
    pub reason: String,
    pub at: SystemTime,
}

/// The OTLP exporter, reporting its first failure on stderr and no other: a collector that is
/// down would otherwise fill the job's log with one error per batch. Failures are not passed to
/// the SDK, which would log each one again.
#[derive(Debug)]
struct ReportOnce<E> {
    inner: E,
    reported: Arc<AtomicBool>,
    endpoint: String,
}

impl<E: SpanExporter> SpanExporter for ReportOnce<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if let Err(err) = self.inner.export(batch).await
            && !self.reported.swap(true, Ordering::Relaxed)
        {
            eprintln!(
                "fleetmend train: traces: exporting spans to {} failed (reported once; training goes on): {err}",
                self.endpoint
            );
        }
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use opentelemetry::{Key, Value};

    #[test]
    fn the_resource_names_the_service_and_the_run() {
        let identity =
            RunIdentity { job_id: "job-7".to_owned(), rank: 1, world_size: 2, attempt: 3 };
        let resource = identity.resource();
        assert_eq!(
            resource.get(&Key::new("service.name")),
            Some(Value::from(SERVICE_NAME)),
            "service name"
        );
        assert_eq!(resource.get(&Key::new(attr::JOB_ID)), Some(Value::from("job-7")));
        assert_eq!(resource.get(&Key::new(attr::RANK)), Some(Value::I64(1)));
        assert_eq!(resource.get(&Key::new(attr::ATTEMPT)), Some(Value::I64(3)));
    }

    #[test]
    fn an_endpoint_without_a_scheme_is_refused_by_name() {
        let identity = RunIdentity { job_id: "j".to_owned(), rank: 0, world_size: 1, attempt: 0 };
        let err = TrainTelemetry::start("127.0.0.1:4317", identity).unwrap_err();
        assert!(err.to_string().contains("127.0.0.1:4317"), "{err}");
        assert!(err.to_string().contains("http://"), "{err}");
    }
}
