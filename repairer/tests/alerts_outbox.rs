//! The alert outbox against real HTTP receivers on 127.0.0.1: a sink that is down gets its backlog
//! once and in order when it comes back, signed; a restarted repairer resumes from the cursor; the
//! CloudWatch format field by field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use fleetmend_proto::{Finding, RecommendedAction, Status};
use fleetmend_repairer::alerts::{Alerts, AlertsConfig, Secret, SinkConfig, sign};
use fleetmend_repairer::model::{Actor, Event, EventKind, NodeState, Severity};
use fleetmend_repairer::store::Store;
use tokio::task::JoinHandle;

const SECRET: &str = "correct horse battery staple";

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Received {
    key: String,
    signature_ok: bool,
    accepted: bool,
    headers: HeaderMap,
    body: Vec<u8>,
}

#[derive(Debug, Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    /// Answer 503 to this many requests first.
    fail_first: Arc<AtomicUsize>,
    /// Answer 422 (this request can never succeed) to this many requests first.
    reject_first: Arc<AtomicUsize>,
}

impl Receiver {
    fn accepted(&self) -> Vec<Received> {
        self.got.lock().unwrap().iter().filter(|r| r.accepted).cloned().collect()
    }

    fn all(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or_default().to_owned()
    };
    let signature_ok = sign::verify(SECRET.as_bytes(), &body, &header(sign::SIGNATURE_HEADER));
    let take = |counter: &AtomicUsize| {
        counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    };
    let failing = signature_ok && take(&receiver.fail_first);
    let rejecting = signature_ok && !failing && take(&receiver.reject_first);
    let accepted = signature_ok && !failing && !rejecting;
    receiver.got.lock().unwrap().push(Received {
        key: header(sign::IDEMPOTENCY_HEADER),
        signature_ok,
        accepted,
        headers: headers.clone(),
        body: body.to_vec(),
    });
    match (signature_ok, failing, rejecting) {
        (false, _, _) => StatusCode::UNAUTHORIZED,
        (true, true, _) => StatusCode::SERVICE_UNAVAILABLE,
        (true, false, true) => StatusCode::UNPROCESSABLE_ENTITY,
        (true, false, false) => StatusCode::OK,
    }
}

/// A receiver listening on `port` until dropped.
struct Listening(JoinHandle<()>);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn listen(receiver: &Receiver, port: u16) -> Listening {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let app = Router::new().route("/hook", post(receive)).with_state(receiver.clone());
    Listening(tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    }))
}

/// A port nothing listens on (yet).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn sink(name: &str, kind: &str, port: u16) -> SinkConfig {
    SinkConfig {
        name: name.to_owned(),
        kind: kind.to_owned(),
        url: format!("http://127.0.0.1:{port}/hook"),
        secret: Some(Secret(SECRET.to_owned())),
        timeout: Duration::from_secs(2),
        retry_initial: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        ..SinkConfig::default()
    }
}

fn config(sinks: Vec<SinkConfig>) -> AlertsConfig {
    AlertsConfig { sinks, ..AlertsConfig::default() }
}

fn state_change(
    node: &str,
    from: NodeState,
    to: NodeState,
    severity: Severity,
    reason: &str,
) -> Event {
    Event::state_change(node, from, to, severity, Actor::repairer(), reason, now_ms())
}

/// Runs the delivery loops until dropped.
struct Running(JoinHandle<()>);

impl Running {
    fn start(alerts: &Arc<Alerts>) -> Running {
        Running(tokio::spawn(Arc::clone(alerts).run()))
    }

    async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn eventually(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn count(alerts: &Alerts, sink: &str, outcome: &str) -> u64 {
    alerts
        .sent_totals()
        .into_iter()
        .find(|(name, out, _)| name == sink && *out == outcome)
        .map_or(0, |(_, _, n)| n)
}

fn saved_cursor(store: &Store, sink: &str) -> i64 {
    store.setting::<i64>(&format!("alerts.cursor.{sink}")).unwrap().unwrap()
}

fn reasons(received: &[Received]) -> Vec<String> {
    received.iter().map(|r| serde_json::from_slice::<Event>(&r.body).unwrap().reason).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_piles_up_while_the_receiver_is_down_then_arrives_once_in_order_signed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("state.db")).unwrap());
    // History before the sink existed: a new sink starts at the end of the log.
    let old = store
        .append_event(&state_change(
            "n0",
            NodeState::Healthy,
            NodeState::Suspect,
            Severity::Warning,
            "old",
        ))
        .unwrap();
    let port = free_port();
    let alerts =
        Arc::new(Alerts::new(config(vec![sink("hook", "webhook", port)]), store.clone()).unwrap());
    let _running = Running::start(&alerts);

    let mut ids = Vec::new();
    for i in 0..5 {
        let event = state_change(
            "n1",
            NodeState::Healthy,
            NodeState::Draining,
            Severity::Critical,
            &format!("e{i}"),
        );
        ids.push(store.append_event(&event).unwrap());
        alerts.wake();
        // An event of a kind the sink does not take, between the others.
        let decision = Event::new(
            EventKind::Decision,
            Severity::Critical,
            Some("n1"),
            Actor::repairer(),
            "skip me",
            now_ms(),
        );
        store.append_event(&decision).unwrap();
        alerts.wake();
    }
    let last = store
        .append_event(&Event::new(
            EventKind::Decision,
            Severity::Info,
            None,
            Actor::repairer(),
            "tail",
            now_ms(),
        ))
        .unwrap();
    alerts.wake();

    // Down: attempts fail and are retried; nothing moves past the first undelivered event.
    eventually("failed attempts", Duration::from_secs(10), || count(&alerts, "hook", "error") >= 3)
        .await;
    assert_eq!(saved_cursor(&store, "hook"), old, "the cursor waits for the sink");
    assert_eq!(count(&alerts, "hook", "ok"), 0);

    let receiver = Receiver::default();
    let _listening = listen(&receiver, port).await;
    eventually("the backlog", Duration::from_secs(10), || saved_cursor(&store, "hook") == last)
        .await;

    let received = receiver.all();
    assert_eq!(received.len(), 5, "each event exactly once: {:?}", reasons(&received));
    assert!(received.iter().all(|r| r.signature_ok && r.accepted));
    let keys: Vec<String> = received.iter().map(|r| r.key.clone()).collect();
    let expected: Vec<String> = ids.iter().map(|id| format!("hook-{id}")).collect();
    assert_eq!(keys, expected, "in order, keyed <sink>-<event id>");
    assert_eq!(reasons(&received), vec!["e0", "e1", "e2", "e3", "e4"]);
    let first: Event = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(first.id, ids[0], "the event as stored, id included");
    assert_eq!(first.to_state, Some(NodeState::Draining));
    assert_eq!(received[0].headers["content-type"], "application/json");
    assert_eq!(count(&alerts, "hook", "ok"), 5);
    assert_eq!(alerts.cursors(), vec![("hook".to_owned(), last)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_repairer_resumes_from_its_cursor_without_resending() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let port = free_port();
    let receiver = Receiver::default();
    let _listening = listen(&receiver, port).await;

    let store = Arc::new(Store::open(&path).unwrap());
    let alerts =
        Arc::new(Alerts::new(config(vec![sink("hook", "webhook", port)]), store.clone()).unwrap());
    let running = Running::start(&alerts);
    let mut last = 0;
    for i in 0..3 {
        last = store
            .append_event(&state_change(
                "n1",
                NodeState::Healthy,
                NodeState::Suspect,
                Severity::Warning,
                &format!("a{i}"),
            ))
            .unwrap();
        alerts.wake();
    }
    eventually("the first three", Duration::from_secs(10), || saved_cursor(&store, "hook") == last)
        .await;
    running.stop().await;
    drop(alerts);
    drop(store);

    // Events appended while no delivery loop runs (the repairer is restarting).
    let store = Arc::new(Store::open(&path).unwrap());
    for i in 0..2 {
        last = store
            .append_event(&state_change(
                "n2",
                NodeState::Healthy,
                NodeState::Suspect,
                Severity::Warning,
                &format!("b{i}"),
            ))
            .unwrap();
    }
    let alerts =
        Arc::new(Alerts::new(config(vec![sink("hook", "webhook", port)]), store.clone()).unwrap());
    let _running = Running::start(&alerts);
    eventually("the two after the restart", Duration::from_secs(10), || {
        saved_cursor(&store, "hook") == last
    })
    .await;

    let received = receiver.all();
    assert_eq!(
        reasons(&received),
        vec!["a0", "a1", "a2", "b0", "b1"],
        "nothing re-sent, nothing lost"
    );
    let mut keys: Vec<&str> = received.iter().map(|r| r.key.as_str()).collect();
    keys.dedup();
    assert_eq!(keys.len(), 5);
    assert_eq!(count(&alerts, "hook", "ok"), 2, "the new process sent only what was left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_after_a_crash_before_the_cursor_moved_carries_the_same_key_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let port = free_port();
    let receiver = Receiver::default();
    let _listening = listen(&receiver, port).await;
    let store = Arc::new(Store::open(&path).unwrap());
    let alerts =
        Arc::new(Alerts::new(config(vec![sink("hook", "webhook", port)]), store.clone()).unwrap());
    let running = Running::start(&alerts);
    let id = store
        .append_event(&state_change(
            "n1",
            NodeState::Suspect,
            NodeState::Draining,
            Severity::Critical,
            "x",
        ))
        .unwrap();
    alerts.wake();
    eventually("the delivery", Duration::from_secs(10), || saved_cursor(&store, "hook") == id)
        .await;
    running.stop().await;
    drop(alerts);
    // As if the repairer died after the receiver took the event but before the cursor was saved.
    store.put_setting("alerts.cursor.hook", &(id - 1)).unwrap();
    let alerts =
        Arc::new(Alerts::new(config(vec![sink("hook", "webhook", port)]), store.clone()).unwrap());
    let _running = Running::start(&alerts);
    eventually("the re-send", Duration::from_secs(10), || receiver.all().len() == 2).await;
    let received = receiver.all();
    assert_eq!(received[0].key, format!("hook-{id}"));
    assert_eq!(received[1].key, received[0].key, "the receiver can drop the duplicate by key");
    assert_eq!(received[1].body, received[0].body);
    assert_eq!(
        received[1].headers[sign::SIGNATURE_HEADER],
        received[0].headers[sign::SIGNATURE_HEADER]
    );
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudwatch_sink_sends_an_sns_notification_carrying_the_alarm_then_ok() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("state.db")).unwrap());
    let port = free_port();
    let receiver = Receiver::default();
    // The first two attempts are refused: the re-send keeps the SNS message id.
    receiver.fail_first.store(2, Ordering::SeqCst);
    let _listening = listen(&receiver, port).await;
    let alerts = Arc::new(
        Alerts::new(config(vec![sink("aws", "cloudwatch", port)]), store.clone()).unwrap(),
    );
    let _running = Running::start(&alerts);

    let mut xid = Finding::new(
        "gpu",
        "xid",
        "3",
        Status::Fail,
        RecommendedAction::Reboot,
        "Xid 79: GPU fell off the bus",
    );
    xid.labels.insert("xid".to_owned(), "79".to_owned());
    let alarm = Event {
        findings: vec![xid],
        ..state_change(
            "gpu-node-7",
            NodeState::Healthy,
            NodeState::Draining,
            Severity::Critical,
            "Xid 79 on GPU 3",
        )
    };
    let alarm_id = store.append_event(&alarm).unwrap();
    alerts.wake();
    // Healthy again: an info event, sent even though the sink's least severity is warning.
    let ok = state_change(
        "gpu-node-7",
        NodeState::Validating,
        NodeState::Healthy,
        Severity::Info,
        "deep check passed",
    );
    let ok_id = store.append_event(&ok).unwrap();
    alerts.wake();
    eventually("both notifications", Duration::from_secs(10), || {
        saved_cursor(&store, "aws") == ok_id
    })
    .await;

    let all = receiver.all();
    assert_eq!(all.len(), 4, "two refused attempts, then two deliveries");
    assert_eq!(
        json(&all[0].body)["MessageId"],
        json(&all[2].body)["MessageId"],
        "a re-send keeps the message id"
    );
    let received = receiver.accepted();
    assert_eq!(received.len(), 2);

    // The envelope, as SNS POSTs it to an HTTP subscriber.
    let first = &received[0];
    assert_eq!(first.key, format!("aws-{alarm_id}"));
    assert_eq!(first.headers["x-amz-sns-message-type"], "Notification");
    assert_eq!(first.headers["x-amz-sns-topic-arn"], "arn:aws:sns:local:000000000000:fleetmend");
    assert!(
        first.headers["x-amz-sns-subscription-arn"]
            .to_str()
            .unwrap()
            .starts_with("arn:aws:sns:local:000000000000:fleetmend:")
    );
    assert_eq!(first.headers["content-type"], "text/plain; charset=UTF-8");
    let envelope = json(&first.body);
    assert_eq!(first.headers["x-amz-sns-message-id"].to_str().unwrap(), envelope["MessageId"]);
    assert_eq!(envelope["Type"], "Notification");
    let message_id = envelope["MessageId"].as_str().unwrap();
    assert_eq!(message_id.len(), 36);
    assert_eq!(message_id.matches('-').count(), 4, "a UUID: {message_id}");
    assert_eq!(envelope["TopicArn"], "arn:aws:sns:local:000000000000:fleetmend");
    assert_eq!(envelope["Subject"], "ALARM: \"fleetmend-gpu-node-7\" in local");
    let timestamp = envelope["Timestamp"].as_str().unwrap();
    assert!(
        timestamp.ends_with('Z') && timestamp.len() == "2024-01-01T00:00:00.000Z".len(),
        "{timestamp}"
    );
    assert_eq!(envelope["SignatureVersion"], "1");
    for field in ["Signature", "SigningCertURL", "UnsubscribeURL"] {
        assert!(envelope[field].is_string(), "{field}");
    }

    // The alarm inside, as CloudWatch publishes it.
    let alarm =
        serde_json::from_str::<serde_json::Value>(envelope["Message"].as_str().unwrap()).unwrap();
    assert_eq!(alarm["AlarmName"], "fleetmend-gpu-node-7");
    assert!(alarm["AlarmDescription"].as_str().unwrap().contains("gpu-node-7"));
    assert_eq!(alarm["AWSAccountId"], "000000000000");
    assert_eq!(alarm["NewStateValue"], "ALARM");
    assert_eq!(alarm["OldStateValue"], "OK");
    let reason = alarm["NewStateReason"].as_str().unwrap();
    assert!(
        reason.contains("Xid 79 on GPU 3") && reason.contains("healthy -> draining"),
        "{reason}"
    );
    let changed = alarm["StateChangeTime"].as_str().unwrap();
    assert!(
        changed.ends_with("+0000") && changed.len() == "2019-06-26T03:54:21.746+0000".len(),
        "{changed}"
    );
    assert_eq!(&changed[..23], &timestamp[..23], "the event's time in both");
    assert_eq!(alarm["Region"], "local");
    assert_eq!(
        alarm["AlarmArn"],
        "arn:aws:cloudwatch:local:000000000000:alarm:fleetmend-gpu-node-7"
    );
    assert_eq!(
        alarm["AlarmActions"],
        serde_json::json!(["arn:aws:sns:local:000000000000:fleetmend"])
    );
    let trigger = &alarm["Trigger"];
    assert_eq!(trigger["Namespace"], "Fleetmend");
    assert_eq!(trigger["MetricName"], "NodeUnhealthy");
    assert_eq!(trigger["StatisticType"], "Statistic");
    assert_eq!(trigger["ComparisonOperator"], "GreaterThanOrEqualToThreshold");
    assert!(trigger["Unit"].is_null());
    assert_eq!(
        trigger["Dimensions"],
        serde_json::json!([{"value": "gpu-node-7", "name": "node"}, {"value": "3", "name": "gpu"}])
    );

    // Healthy again: the same alarm goes back to OK.
    let second = &received[1];
    assert_eq!(second.key, format!("aws-{ok_id}"));
    let envelope = json(&second.body);
    assert_eq!(envelope["Subject"], "OK: \"fleetmend-gpu-node-7\" in local");
    assert_ne!(envelope["MessageId"], message_id);
    let ok =
        serde_json::from_str::<serde_json::Value>(envelope["Message"].as_str().unwrap()).unwrap();
    assert_eq!(ok["AlarmName"], "fleetmend-gpu-node-7");
    assert_eq!(ok["NewStateValue"], "OK");
    assert_eq!(ok["OldStateValue"], "ALARM");
    assert!(ok["NewStateReason"].as_str().unwrap().contains("deep check passed"));
    assert_eq!(
        ok["Trigger"]["Dimensions"],
        serde_json::json!([{"value": "gpu-node-7", "name": "node"}])
    );
    assert_eq!(count(&alerts, "aws", "ok"), 2);
    assert_eq!(count(&alerts, "aws", "error"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_sink_rejects_as_malformed_is_skipped_not_retried_forever() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("state.db")).unwrap());
    let port = free_port();
    let receiver = Receiver::default();
    receiver.reject_first.store(1, Ordering::SeqCst);
    let _listening = listen(&receiver, port).await;
    let alerts =
        Arc::new(Alerts::new(config(vec![sink("hook", "webhook", port)]), store.clone()).unwrap());
    let _running = Running::start(&alerts);
    for reason in ["rejected", "next"] {
        let event =
            state_change("n1", NodeState::Healthy, NodeState::Suspect, Severity::Warning, reason);
        store.append_event(&event).unwrap();
    }
    let last = store.events(0, None, 10).unwrap().last().unwrap().id;
    alerts.wake();
    eventually("both handled", Duration::from_secs(10), || saved_cursor(&store, "hook") == last)
        .await;
    let all = receiver.all();
    assert_eq!(reasons(&all), vec!["rejected", "next"], "one attempt each");
    assert!(!all[0].accepted && all[1].accepted);
    assert_eq!(count(&alerts, "hook", "error"), 1);
    assert_eq!(count(&alerts, "hook", "ok"), 1);
}
