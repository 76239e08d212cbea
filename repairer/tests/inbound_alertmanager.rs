//! A real Alertmanager (the Debian package `prometheus-alertmanager`, which scripts/test installs)
//! notifies a webhook receiver on 127.0.0.1; what it sends parses into the finding the repairer
//! ingests: a firing alert, then the same alert resolved.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener as StdTcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use fleetmend_proto::{RecommendedAction, Status};
use fleetmend_repairer::inbound::{InboundAlert, InboundConfig, parse_alertmanager};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const ALERTMANAGER: &str = "prometheus-alertmanager";
/// Generous: Alertmanager's first flush waits for its dispatcher to start.
const WEBHOOK_DEADLINE: Duration = Duration::from_secs(30);

/// A running Alertmanager, killed when dropped.
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

fn free_port() -> u16 {
    StdTcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn config_yaml(webhook_url: &str) -> String {
    format!(
        r#"route:
  receiver: fleetmend
  group_by: [alertname, node]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: fleetmend
    webhook_configs:
      - url: {webhook_url}
        send_resolved: true
        max_alerts: 1000
"#
    )
}

impl Alertmanager {
    /// Starts Alertmanager on a free loopback port with no clustering, and waits until it is ready.
    async fn start(webhook_url: &str, client: &reqwest::Client) -> Alertmanager {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("alertmanager.yml");
        std::fs::write(&config, config_yaml(webhook_url)).unwrap();
        let log = std::fs::File::create(dir.path().join("alertmanager.log")).unwrap();
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let child = Command::new(ALERTMANAGER)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .arg(format!("--web.external-url={url}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| {
                panic!("starting {ALERTMANAGER} failed ({err}); scripts/test installs it")
            });
        let mut alertmanager = Alertmanager { child, url, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = client
                .get(format!("{}/-/ready", alertmanager.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if ready {
                return alertmanager;
            }
            if let Some(status) = alertmanager.child.try_wait().unwrap() {
                panic!("{ALERTMANAGER} exited with {status}: {}", log_of(alertmanager._dir.path()));
            }
            assert!(
                Instant::now() < deadline,
                "{ALERTMANAGER} not ready within 20 s: {}",
                log_of(alertmanager._dir.path())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Posts alerts through Alertmanager's v2 API, as Prometheus does.
    async fn post_alerts(&self, client: &reqwest::Client, alerts: &Value) {
        let response = client
            .post(format!("{}/api/v2/alerts", self.url))
            .json(alerts)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        let status = response.status();
        assert!(
            status.is_success(),
            "POST /api/v2/alerts: {status} {}",
            response.text().await.unwrap()
        );
    }
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("alertmanager.log")).unwrap_or_default()
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

async fn receive(State(bodies): State<mpsc::UnboundedSender<Bytes>>, body: Bytes) -> StatusCode {
    let _ = bodies.send(body);
    StatusCode::OK
}

/// Waits for the next notification whose alerts are all `status` and parses it.
async fn next_notification(
    bodies: &mut mpsc::UnboundedReceiver<Bytes>,
    status: &str,
    config: &InboundConfig,
) -> (Value, Vec<InboundAlert>) {
    let deadline = tokio::time::Instant::now() + WEBHOOK_DEADLINE;
    loop {
        let body = tokio::time::timeout_at(deadline, bodies.recv())
            .await
            .unwrap_or_else(|_| panic!("no {status} notification within {WEBHOOK_DEADLINE:?}"))
            .expect("the receiver stopped");
        let raw: Value = serde_json::from_slice(&body).unwrap();
        if raw["status"] != status {
            continue;
        }
        let parsed = parse_alertmanager(&body, config).unwrap();
        assert_eq!(parsed.skipped, 0, "{:?}", parsed.skipped_alerts);
        return (raw, parsed.alerts);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_alertmanager_notification_fires_then_resolves_a_finding() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().build().unwrap();

    let (sender, mut bodies) = mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook_url = format!("http://{}/v1/alerts/alertmanager", listener.local_addr().unwrap());
    let app = Router::new().route("/v1/alerts/alertmanager", post(receive)).with_state(sender);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let alertmanager = Alertmanager::start(&webhook_url, &client).await;
    let config = InboundConfig::default();

    let starts_at = SystemTime::now() - Duration::from_secs(10);
    let labels = json!({"alertname": "GpuXidError", "node": "gpu-node-7", "severity": "critical",
                        "gpu": "3", "xid": "79", "job": "fleetmend"});
    let annotations = json!({"summary": "GPU 3 on gpu-node-7 fell off the bus (Xid 79)"});
    alertmanager
        .post_alerts(
            &client,
            &json!([{"labels": labels, "annotations": annotations, "startsAt": rfc3339(starts_at),
                     "generatorURL": "http://prometheus.invalid/graph"}]),
        )
        .await;

    let (raw, alerts) = next_notification(&mut bodies, "firing", &config).await;
    assert_eq!(raw["version"], "4", "{raw}");
    assert_eq!(raw["receiver"], "fleetmend", "{raw}");
    assert_eq!(alerts.len(), 1, "{raw}");
    let firing = &alerts[0];
    assert_eq!(firing.node, "gpu-node-7");
    assert!(firing.firing);
    assert_eq!(firing.finding.check, "alertmanager");
    assert_eq!(firing.finding.finding, "gpu_xid_error");
    assert_eq!(firing.finding.subject, "3");
    assert_eq!(firing.finding.status, Status::Fail);
    assert_eq!(firing.finding.action, RecommendedAction::None);
    assert_eq!(firing.finding.message, "GPU 3 on gpu-node-7 fell off the bus (Xid 79)");
    assert_eq!(firing.finding.labels.get("xid").map(String::as_str), Some("79"));
    assert!(!firing.finding.labels.contains_key("job"), "job is not in copy_labels");

    // Prometheus resolves an alert by sending it once more with endsAt in the past.
    alertmanager
        .post_alerts(
            &client,
            &json!([{"labels": labels, "annotations": annotations, "startsAt": rfc3339(starts_at),
                     "endsAt": rfc3339(SystemTime::now() - Duration::from_secs(1)),
                     "generatorURL": "http://prometheus.invalid/graph"}]),
        )
        .await;

    let (raw, alerts) = next_notification(&mut bodies, "resolved", &config).await;
    assert_eq!(alerts.len(), 1, "{raw}");
    let resolved = &alerts[0];
    assert_eq!(resolved.node, "gpu-node-7");
    assert!(!resolved.firing);
    assert_eq!(resolved.finding.status, Status::Ok);
    assert_eq!(
        (resolved.finding.finding.as_str(), resolved.finding.subject.as_str()),
        (firing.finding.finding.as_str(), firing.finding.subject.as_str()),
        "the resolved alert names the same finding, so it clears the firing one"
    );
    assert_eq!(resolved.finding.labels.get("xid"), firing.finding.labels.get("xid"));

    drop(alertmanager);
    server.abort();
}
