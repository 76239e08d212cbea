//! Traces of repair workflows over OTLP: a repairer started in-process with a fake scheduler and
//! provider exports to an in-process OTLP/gRPC receiver, one reboot repair is driven through the
//! HTTP API as an agent would, and the receiver must hold one trace for it: the root span named
//! for the repair and its step spans, each the root's child, in time order.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fake_opentelemetry_collector::{ExportedSpan, FakeCollectorServer};
use fleetmend_proto::{
    CommandResult, EvidenceBundle, EvidenceItem, Finding, NodeCommand, RecommendedAction, Report,
    ReportReply, ReportTrigger, Status, Verdict, WIRE_VERSION, command_kind,
};
use fleetmend_repairer::config::RepairerConfig;
use fleetmend_repairer::engine::NodeSummary;
use fleetmend_repairer::model::NodeState;
use fleetmend_repairer::provider::{FakeProvider, Provider, ProviderCall};
use fleetmend_repairer::scheduler::{MemoryScheduler, Scheduler};
use fleetmend_repairer::service::{self, Repairer};
use tokio::sync::oneshot;

/// Longest any wait in these tests lasts (a shared, loaded machine).
const DEADLINE: Duration = Duration::from_secs(20);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(25);
const NODE: &str = "gpu-node-1";

/// Polls `probe` until it returns `Some`, failing the test with `what` at the deadline.
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn config(dir: &std::path::Path, otlp_endpoint: &str) -> RepairerConfig {
    let text = format!(
        r#"
listen = "127.0.0.1:0"
store = "{store}"

[engine]
tick = "50ms"

[engine.workflow]
call_timeout = "5s"
checkpoint_grace = "0s"
retry_initial = "50ms"
retry_max = "500ms"

[policy.guard_rails]
settle = "0s"

[telemetry]
otlp_endpoint = "{otlp_endpoint}"
service_name = "fleetmend-traces-test"
export_timeout = "5s"
"#,
        store = dir.join("repairer.db").display()
    );
    let config = RepairerConfig::parse(&text).expect("test config parses");
    config.validated(std::path::Path::new("test")).expect("test config is valid")
}

/// A repairer with fakes, stopped when dropped.
struct Harness {
    repairer: Option<Repairer>,
    provider: Arc<FakeProvider>,
    client: reqwest::Client,
    base: String,
    shutdown: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Harness {
    async fn start(otlp_endpoint: &str) -> Harness {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let provider = Arc::new(FakeProvider::new());
        let (shutdown, stopped) = oneshot::channel::<()>();
        let repairer = service::start_with(
            config(dir.path(), otlp_endpoint),
            Some(Arc::new(MemoryScheduler::new()) as Arc<dyn Scheduler>),
            Some(provider.clone() as Arc<dyn Provider>),
            async move {
                let _ = stopped.await;
            },
        )
        .await
        .expect("the repairer starts");
        let base = format!("http://{}", repairer.local_addr);
        let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
        Harness {
            repairer: Some(repairer),
            provider,
            client,
            base,
            shutdown: Some(shutdown),
            _dir: dir,
        }
    }

    fn repairer(&self) -> &Repairer {
        self.repairer.as_ref().unwrap()
    }

    /// Stops the server; the stop exports the traces still queued, within its deadline.
    async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let repairer = self.repairer.take().unwrap();
        tokio::time::timeout(DEADLINE, repairer.wait())
            .await
            .expect("the repairer stops within the deadline")
            .expect("the repairer stops cleanly");
    }

    async fn report(
        &self,
        seq: u64,
        boot_id: &str,
        findings: Vec<Finding>,
        command_results: Vec<CommandResult>,
    ) -> ReportReply {
        let report = Report {
            wire_version: WIRE_VERSION,
            node: NODE.to_owned(),
            boot_id: boot_id.to_owned(),
            agent_version: "test".to_owned(),
            seq,
            sent_at_ms: now_ms(),
            trigger: if command_results.is_empty() {
                ReportTrigger::Interval
            } else {
                ReportTrigger::Command
            },
            verdict: Verdict::of(&findings),
            checks: Vec::new(),
            findings,
            command_results,
            address: None,
            ranks: Vec::new(),
            metrics_port: None,
        };
        let response =
            self.client.post(format!("{}/v1/reports", self.base)).json(&report).send().await;
        let response = response.expect("the report is delivered");
        assert!(response.status().is_success(), "report refused: {}", response.status());
        response.json().await.expect("the reply parses")
    }

    async fn node(&self) -> Option<NodeSummary> {
        let response = self.client.get(format!("{}/v1/nodes", self.base)).send().await.ok()?;
        let nodes: Vec<NodeSummary> = response.json().await.ok()?;
        nodes.into_iter().find(|n| n.name == NODE)
    }

    /// Drives one reboot repair as the node's agent would, until the node is healthy again:
    /// the GPU falls off the bus (Xid 79), the repairer reboots the node, the node comes back
    /// with a new boot id and passes the deep check it is sent.
    async fn drive_reboot_repair(&self) {
        let xid = Finding::new(
            "gpu",
            "xid",
            "0",
            Status::Fail,
            RecommendedAction::Reboot,
            "Xid 79: GPU has fallen off the bus",
        )
        .with_label("xid", "79");
        let mut seq = 1;
        self.report(seq, "boot-1", vec![xid.clone()], Vec::new()).await;
        // Before the reboot the node is asked for its evidence; a small bundle answers.
        let ask: NodeCommand = eventually("the evidence command", || {
            seq += 1;
            let (seq, xid) = (seq, xid.clone());
            async move {
                let reply = self.report(seq, "boot-1", vec![xid], Vec::new()).await;
                reply.commands.into_iter().find(|c| c.kind == command_kind::EVIDENCE)
            }
        })
        .await;
        let bundle = EvidenceBundle {
            node: NODE.to_owned(),
            boot_id: "boot-1".to_owned(),
            collected_at_ms: now_ms(),
            took_ms: 3,
            items: vec![EvidenceItem::text("kernel-log", "/dev/kmsg", "NVRM: Xid 79\n".to_owned())],
        };
        let gathered = CommandResult::evidence(&ask.id, bundle, now_ms());
        seq += 1;
        self.report(seq, "boot-1", vec![xid], vec![gathered]).await;
        eventually("the provider to reboot the node", || async {
            self.provider.calls().contains(&ProviderCall::Reboot(NODE.to_owned())).then_some(())
        })
        .await;
        // Back from the reboot, healthy: reports until the reply carries the deep check.
        let deep_check: NodeCommand = eventually("the deep-check command", || {
            seq += 1;
            let seq = seq;
            async move {
                let reply = self.report(seq, "boot-2", Vec::new(), Vec::new()).await;
                reply.commands.into_iter().find(|c| c.kind == command_kind::DEEP_CHECK)
            }
        })
        .await;
        let passed = CommandResult {
            id: deep_check.id.clone(),
            kind: command_kind::DEEP_CHECK.to_owned(),
            ok: true,
            message: "every check passed".to_owned(),
            verdict: Some(Verdict::Healthy),
            findings: Vec::new(),
            evidence: None,
            allreduce: None,
            finished_at_ms: now_ms(),
        };
        self.report(seq + 1, "boot-2", Vec::new(), vec![passed]).await;
        eventually("the node to be healthy after its repair", || async {
            self.node().await.filter(|n| n.state == NodeState::Healthy && n.workflow.is_none())
        })
        .await;
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// The value of a string attribute as the receiver shows it (the protobuf value's Debug form).
fn has_string_attribute(span: &ExportedSpan, key: &str, value: &str) -> bool {
    span.attributes.get(key).is_some_and(|v| v.contains(&format!("StringValue({value:?})")))
}

fn is_root(span: &ExportedSpan) -> bool {
    span.parent_span_id.is_empty() || span.parent_span_id.chars().all(|c| c == '0')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_repair_is_one_trace_with_a_span_per_step() {
    let mut collector = FakeCollectorServer::start().await.expect("the OTLP receiver starts");
    let harness = Harness::start(&collector.endpoint()).await;
    assert!(harness.repairer().tracer.is_some(), "an OTLP endpoint turns traces on");
    harness.drive_reboot_repair().await;

    // The root span is recorded as the workflow finishes, a moment after the node turns healthy:
    // flush and collect until it has arrived.
    let root_name = format!("repair reboot {NODE}");
    let mut spans: Vec<ExportedSpan> = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    loop {
        harness.repairer().flush_traces().await.expect("the spans are exported");
        spans.extend(collector.exported_spans(0, Duration::ZERO).await);
        if spans.iter().any(|s| s.name == root_name) {
            break;
        }
        assert!(Instant::now() < deadline, "timed out waiting for the root span: {spans:#?}");
        tokio::time::sleep(POLL).await;
    }

    let roots: Vec<&ExportedSpan> = spans.iter().filter(|s| is_root(s)).collect();
    assert_eq!(roots.len(), 1, "one root span: {roots:#?}");
    let root = roots[0];
    assert_eq!(root.name, root_name);
    assert!(has_string_attribute(root, "fleetmend.node", NODE), "{:?}", root.attributes);
    assert!(has_string_attribute(root, "fleetmend.action", "reboot"), "{:?}", root.attributes);
    assert!(has_string_attribute(root, "fleetmend.outcome", "repaired"), "{:?}", root.attributes);
    assert!(
        has_string_attribute(root, "fleetmend.rule", "xid-fallen-off-bus"),
        "{:?}",
        root.attributes
    );

    let mut children: Vec<&ExportedSpan> = spans.iter().filter(|s| !is_root(s)).collect();
    children.sort_by_key(|s| (s.start_time_unix_nano, s.end_time_unix_nano));
    let names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "detect",
            "drain",
            "checkpoint",
            "settle",
            "evidence",
            "repair",
            "await-boot",
            "validate",
            "undrain"
        ],
        "the workflow's steps, in the order it ran them"
    );
    let mut previous_end = root.start_time_unix_nano;
    for child in &children {
        assert_eq!(child.trace_id, root.trace_id, "{} is in the repair's trace", child.name);
        assert_eq!(child.parent_span_id, root.span_id, "{} is a child of the root", child.name);
        assert!(has_string_attribute(child, "fleetmend.node", NODE), "{}", child.name);
        assert_eq!(
            child.attributes.get("fleetmend.workflow.id"),
            root.attributes.get("fleetmend.workflow.id"),
            "{} names the workflow",
            child.name
        );
        assert!(
            child.start_time_unix_nano >= previous_end,
            "{} starts after the span before it ended",
            child.name
        );
        assert!(child.end_time_unix_nano >= child.start_time_unix_nano, "{}", child.name);
        previous_end = child.end_time_unix_nano;
    }
    assert!(root.end_time_unix_nano >= previous_end, "the root ends last");
    let undrain = children.last().unwrap();
    assert!(has_string_attribute(undrain, "fleetmend.outcome", "repaired"));
    let await_boot = children.iter().find(|s| s.name == "await-boot").unwrap();
    assert!(has_string_attribute(await_boot, "fleetmend.next_step", "validate"));

    harness.stop().await;
    collector.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_completes_with_no_collector_listening() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let harness = Harness::start(&format!("http://127.0.0.1:{port}")).await;
    harness.drive_reboot_repair().await;
    // The export fails, but within its deadline, and the service still stops cleanly.
    let flushed = tokio::time::timeout(DEADLINE, harness.repairer().flush_traces())
        .await
        .expect("a flush with no collector returns within the deadline");
    drop(flushed);
    harness.stop().await;
}
