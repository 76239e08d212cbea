//! The agent reports to a repairer: at once on a kernel-log fault, with its bearer token, and again
//! with its newest state after the repairer was away.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use fleetmend_proto::{Report, ReportTrigger, Status};
use fleetmend_tests::{fixture, fixture_flags, free_port, poll_until, start_agent};

/// A stand-in repairer that keeps every report with the time it arrived.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(Instant, Report)>>>);

impl Received {
    fn all(&self) -> Vec<(Instant, Report)> {
        self.0.lock().unwrap().clone()
    }
}

async fn receive(
    State((received, token)): State<(Received, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let expected = format!("Bearer {token}");
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return StatusCode::UNAUTHORIZED;
    }
    match serde_json::from_slice::<Report>(&body) {
        Ok(report) => {
            received.0.lock().unwrap().push((Instant::now(), report));
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

/// Serves a stand-in repairer on `addr` in a background thread until the process ends.
fn serve_repairer(addr: SocketAddr, token: &str) -> Received {
    let received = Received::default();
    let state = (received.clone(), token.to_owned());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            ready_tx.send(()).unwrap();
            let app = axum::Router::new().route("/v1/reports", post(receive)).with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).expect("stand-in repairer listening");
    received
}

fn write_config(dir: &std::path::Path, repairer_port: u16, token: &str) -> std::path::PathBuf {
    let base = std::fs::read_to_string(fixture("healthy").join("agent.toml")).unwrap();
    let config = format!(
        "{base}\n[report]\nrepairer = \"http://127.0.0.1:{repairer_port}\"\ninterval = \"60s\"\ntoken = \"{token}\"\nbackoff_initial = \"100ms\"\nbackoff_max = \"400ms\"\n"
    );
    let path = dir.join("agent.toml");
    std::fs::write(&path, config).unwrap();
    path
}

fn has_xid_79(report: &Report) -> bool {
    report.findings.iter().any(|f| {
        f.check == "kernel_log"
            && f.status == Status::Fail
            && f.labels.get("xid").map(String::as_str) == Some("79")
    })
}

#[test]
fn an_xid_line_in_the_kernel_log_reaches_the_repairer_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let case = fixture("healthy");
    let kmsg = dir.path().join("kmsg");
    std::fs::copy(case.join("kmsg"), &kmsg).unwrap();
    let repairer_port = free_port();
    let token = "t0ps3cret";
    let received = serve_repairer(SocketAddr::from(([127, 0, 0, 1], repairer_port)), token);
    let config = write_config(dir.path(), repairer_port, token);

    let mut flags = fixture_flags(&case);
    flags.retain(|f| !f.starts_with("--kmsg="));
    flags.push(format!("--kmsg={}", kmsg.display()));
    flags.push(format!("--config={}", config.display()));
    flags.push("--node=node-7".to_owned());
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let agent = start_agent(dir.path(), listen, &args);

    assert!(
        poll_until(Duration::from_secs(10), || !received.all().is_empty()),
        "no startup report:\n{}",
        agent.stderr()
    );
    let startup = received.all()[0].1.clone();
    assert_eq!(startup.trigger, ReportTrigger::Startup);
    assert_eq!(startup.node, "node-7");
    assert_eq!(startup.seq, 1);
    // The port it serves /metrics on, for the repairer's Prometheus service discovery.
    assert_eq!(startup.metrics_port, Some(listen.port()));
    assert!(!has_xid_79(&startup), "the healthy fixture already has an Xid 79: {startup:?}");

    let appended = Instant::now();
    // A /dev/kmsg record; its timestamp (µs since boot) is just before the fixture's uptime (7200 s),
    // so the agent places it at "now" rather than as an old line outside the rule's window.
    let mut file = std::fs::OpenOptions::new().append(true).open(&kmsg).unwrap();
    writeln!(
        file,
        "4,2201,7199500000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=2317, name=python, GPU has fallen off the bus."
    )
    .unwrap();
    drop(file);

    assert!(
        poll_until(Duration::from_secs(5), || received.all().iter().any(|(_, r)| has_xid_79(r))),
        "no report with the Xid within 5 s:\n{}",
        agent.stderr()
    );
    let (arrived, report) =
        received.all().into_iter().find(|(_, r)| has_xid_79(r)).expect("report with the Xid");
    let latency = arrived.duration_since(appended);
    assert!(latency < Duration::from_secs(1), "the report took {latency:?}");
    assert_eq!(report.trigger, ReportTrigger::Event);
    assert!(report.seq > startup.seq);
    assert_eq!(report.verdict, fleetmend_proto::Verdict::Unhealthy);
    println!("kmsg append → report: {latency:?}");
}

#[test]
fn reports_resume_with_the_newest_state_when_the_repairer_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let case = fixture("healthy");
    let repairer_port = free_port();
    let token = "abc";
    let config = write_config(dir.path(), repairer_port, token);
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", config.display()));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let agent = start_agent(dir.path(), listen, &args);

    // Nobody listens yet: the agent keeps retrying (its metrics count the failures).
    assert!(
        poll_until(Duration::from_secs(10), || {
            fleetmend_tests::http_get(listen, "/metrics").is_some_and(|(_, body)| {
                body.lines().any(|l| {
                    l.starts_with("fleetmend_agent_reports_total{result=\"error\"}")
                        && !l.ends_with(" 0")
                })
            })
        }),
        "no failed report counted:\n{}",
        agent.stderr()
    );
    let received = serve_repairer(SocketAddr::from(([127, 0, 0, 1], repairer_port)), token);
    // backoff_max is 400 ms, the report interval 60 s: only a retry can deliver this quickly.
    assert!(
        poll_until(Duration::from_secs(5), || !received.all().is_empty()),
        "no report after the repairer came back:\n{}",
        agent.stderr()
    );
    let (_, report) = received.all()[0].clone();
    assert!(report.seq > 1, "the first delivered report should be a retry: {}", report.seq);
    assert_eq!(report.checks.len(), 6, "every check's run is reported: {report:?}");
    assert!(report.findings.iter().all(|f| f.status != Status::Ok), "only what is not ok travels");
}
