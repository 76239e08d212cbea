//! The alertmanager sink against a real Alertmanager (Debian `prometheus-alertmanager`, started by
//! the test on 127.0.0.1 with its own config and storage): a node that leaves healthy shows up as
//! an active alert with fleetmend's labels; healthy again, it is gone. Same for the breaker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_repairer::alerts::{Alerts, AlertsConfig, SinkConfig};
use fleetmend_repairer::model::{Actor, Event, EventKind, NodeState, Severity};
use fleetmend_repairer::store::Store;
use serde_json::Value;

/// A running Alertmanager, killed on drop.
struct Alertmanager {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_alertmanager(http: &reqwest::Client) -> Alertmanager {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("alertmanager.yml");
    std::fs::write(&config, "route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n")
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new("prometheus-alertmanager")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .arg(format!("--storage.path={}", dir.path().join("data").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus-alertmanager (Debian package prometheus-alertmanager; scripts/test installs it)");
    let alertmanager = Alertmanager { child, url: format!("http://127.0.0.1:{port}"), _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = http.get(format!("{}/-/ready", alertmanager.url)).send().await;
        if ready.is_ok_and(|response| response.status().is_success()) {
            return alertmanager;
        }
        assert!(Instant::now() < deadline, "Alertmanager not ready after 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The alerts Alertmanager lists (active, silenced, inhibited, unprocessed) matching `filter`.
async fn listed(http: &reqwest::Client, am: &Alertmanager, filter: &str) -> Vec<Value> {
    let mut url = reqwest::Url::parse(&format!("{}/api/v2/alerts", am.url)).unwrap();
    url.query_pairs_mut().append_pair("filter", filter);
    let response = http.get(url).send().await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    response.json::<Vec<Value>>().await.unwrap()
}

/// Polls until `check` holds for the listed alerts matching `filter`, with a deadline.
async fn until_listed(
    http: &reqwest::Client,
    am: &Alertmanager,
    filter: &str,
    what: &str,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let alerts = listed(http, am, filter).await;
        if check(&alerts) {
            return alerts;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; Alertmanager lists {alerts:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_fire_and_resolve_in_a_real_alertmanager() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let am = start_alertmanager(&http).await;

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("state.db")).unwrap());
    let sink = SinkConfig {
        name: "am".to_owned(),
        kind: "alertmanager".to_owned(),
        url: am.url.clone(),
        labels: [("cluster".to_owned(), "test".to_owned())].into(),
        retry_initial: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        ..SinkConfig::default()
    };
    let alerts = Arc::new(
        Alerts::new(AlertsConfig { sinks: vec![sink], ..AlertsConfig::default() }, store.clone())
            .unwrap(),
    );
    let run = tokio::spawn(Arc::clone(&alerts).run());

    // n1 leaves healthy (warning), then gets worse (critical): one alert, at the latest severity.
    store
        .append_event(&state_change(
            "n1",
            NodeState::Healthy,
            NodeState::Suspect,
            Severity::Warning,
            "Xid 48 on GPU 2",
        ))
        .unwrap();
    alerts.wake();
    let firing = until_listed(&http, &am, "node=\"n1\"", "n1 suspect", |alerts| {
        alerts.len() == 1 && alerts[0]["labels"]["severity"] == "warning"
    })
    .await;
    assert_eq!(firing[0]["labels"]["alertname"], "FleetmendNodeUnhealthy");
    assert_eq!(firing[0]["labels"]["cluster"], "test");
    assert_eq!(firing[0]["status"]["state"], "active");
    assert_eq!(firing[0]["annotations"]["state"], "suspect");

    store
        .append_event(&state_change(
            "n1",
            NodeState::Suspect,
            NodeState::Draining,
            Severity::Critical,
            "Xid 48 again",
        ))
        .unwrap();
    alerts.wake();
    let firing =
        until_listed(&http, &am, "node=\"n1\"", "n1 draining at critical only", |alerts| {
            alerts.len() == 1 && alerts[0]["labels"]["severity"] == "critical"
        })
        .await;
    assert_eq!(firing[0]["annotations"]["state"], "draining");
    assert_eq!(firing[0]["annotations"]["previous_state"], "suspect");
    assert!(firing[0]["annotations"]["description"].as_str().unwrap().contains("Xid 48 again"));

    // Another node's alert is separate and stays.
    store
        .append_event(&state_change(
            "n2",
            NodeState::Healthy,
            NodeState::Suspect,
            Severity::Warning,
            "ib0 down",
        ))
        .unwrap();
    // The breaker opens.
    let breaker = Event::new(
        EventKind::Breaker,
        Severity::Critical,
        None,
        Actor::repairer(),
        "5 nodes failed in 10m",
        now_ms(),
    );
    store.append_event(&breaker).unwrap();
    alerts.wake();
    until_listed(&http, &am, "alertname=\"FleetmendBreakerOpen\"", "the breaker alert", |alerts| {
        alerts.len() == 1
            && alerts[0]["status"]["state"] == "active"
            && alerts[0]["labels"].get("node").is_none()
    })
    .await;
    until_listed(&http, &am, "node=\"n2\"", "n2's alert", |alerts| alerts.len() == 1).await;

    // n1 healthy again (an info event, sent although the sink's least severity is warning).
    store
        .append_event(&state_change(
            "n1",
            NodeState::Validating,
            NodeState::Healthy,
            Severity::Info,
            "deep check passed",
        ))
        .unwrap();
    // The breaker closes.
    let closed = Event::new(
        EventKind::Breaker,
        Severity::Info,
        None,
        Actor::person("sre"),
        "breaker closed",
        now_ms(),
    );
    let last = store.append_event(&closed).unwrap();
    alerts.wake();
    until_listed(&http, &am, "node=\"n1\"", "n1's alert resolved", <[Value]>::is_empty).await;
    until_listed(
        &http,
        &am,
        "alertname=\"FleetmendBreakerOpen\"",
        "the breaker alert resolved",
        <[Value]>::is_empty,
    )
    .await;
    let n2 = listed(&http, &am, "node=\"n2\"").await;
    assert_eq!(n2.len(), 1, "n2 is still unhealthy");

    let deadline = Instant::now() + Duration::from_secs(10);
    while alerts.cursors()[0].1 != last {
        assert!(Instant::now() < deadline, "cursor stuck at {:?}", alerts.cursors());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let totals = alerts.sent_totals();
    assert!(totals.contains(&("am".to_owned(), "ok", 6)), "{totals:?}");
    assert!(totals.contains(&("am".to_owned(), "error", 0)), "{totals:?}");
    run.abort();
}
