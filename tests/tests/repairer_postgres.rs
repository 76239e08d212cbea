//! The real `fleetmend repairer` on a real PostgreSQL store (`store = "postgres://..."`): a fatal
//! report (Xid 79) drains the node, the events are served by `GET /v1/events` and are rows in the
//! database, a restarted repairer finds the node where it was, and the URL's password is never in
//! the repairer's log. Skipped where PostgreSQL is not installed, unless
//! `FLEETMEND_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleetmend_proto::{
    Finding, RecommendedAction, Report, ReportTrigger, Status, Verdict, WIRE_VERSION,
};
use fleetmend_repairer::testing::PostgresCluster;
use fleetmend_tests::{free_port, http_get, http_post_json, poll_until, start_repairer};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);
const PASSWORD: &str = "pw-kept-out-of-logs";

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn report(node: &str, seq: u64, fatal: bool) -> String {
    let findings = if fatal {
        vec![
            Finding::new(
                "gpu",
                "xid",
                "0",
                Status::Fail,
                RecommendedAction::Reboot,
                "Xid 79: GPU has fallen off the bus",
            )
            .with_label("xid", "79"),
        ]
    } else {
        Vec::new()
    };
    let report = Report {
        wire_version: WIRE_VERSION,
        node: node.to_owned(),
        boot_id: format!("{node}-boot-0"),
        agent_version: "scripted".to_owned(),
        seq,
        sent_at_ms: now_ms(),
        trigger: ReportTrigger::Interval,
        verdict: Verdict::of(&findings),
        checks: Vec::new(),
        findings,
        command_results: Vec::new(),
        address: None,
        ranks: Vec::new(),
        metrics_port: None,
    };
    serde_json::to_string(&report).unwrap()
}

fn get_json(listen: SocketAddr, path: &str) -> Vec<Value> {
    http_get(listen, path)
        .filter(|(status, _)| *status == 200)
        .and_then(|(_, body)| serde_json::from_str(&body).ok())
        .unwrap_or_default()
}

fn state(listen: SocketAddr, node: &str) -> Option<String> {
    get_json(listen, "/v1/nodes")
        .into_iter()
        .find(|n| n["name"] == node)
        .and_then(|n| n["state"].as_str().map(str::to_owned))
}

#[test]
fn a_repairer_on_postgres_drains_a_fatal_node_and_keeps_it_across_a_restart() {
    let Some(cluster) = PostgresCluster::start() else { return };
    let url = cluster.fresh_database();
    let db = url.rsplit('/').next().unwrap().to_owned();
    // Trust authentication ignores the password: it is there to be kept out of the log.
    let with_password = format!("postgres://postgres:{PASSWORD}@127.0.0.1:{}/{db}", cluster.port());
    let dir = tempfile::tempdir().unwrap();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.path().join("repairer.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\nstore = \"{with_password}\"\nscheduler = \"memory\"\n\n\
             [engine]\ntick = \"100ms\"\n"
        ),
    )
    .unwrap();
    let stderr = dir.path().join("repairer.stderr");
    let mut repairer = start_repairer(&config, listen, &stderr, DEADLINE);

    let mut seq = 0;
    let mut post = |node: &str, fatal: bool| {
        seq += 1;
        http_post_json(listen, "/v1/reports", &report(node, seq, fatal))
    };
    for node in ["n1", "n2"] {
        assert_eq!(post(node, false).map(|(status, _)| status), Some(200));
    }
    assert!(poll_until(DEADLINE, || state(listen, "n1").as_deref() == Some("healthy")));

    assert_eq!(post("n1", true).map(|(status, _)| status), Some(200));
    let drained = poll_until(DEADLINE, || {
        get_json(listen, "/v1/events?limit=1000").iter().any(|e| {
            e["kind"] == "state-changed" && e["node"] == "n1" && e["to_state"] == "draining"
        })
    });
    assert!(drained, "n1 not drained:\n{}", repairer.stderr());
    let events = get_json(listen, "/v1/events?limit=1000");
    assert!(
        events.iter().any(|e| e["kind"] == "decision" && e["node"] == "n1"),
        "the decision is in the log: {events:?}"
    );
    assert_ne!(state(listen, "n1").as_deref(), Some("healthy"));
    assert_eq!(state(listen, "n2").as_deref(), Some("healthy"));

    // The events are rows in PostgreSQL, with the ids the API served.
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let ids: Vec<i64> = client
        .query("SELECT id FROM events ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for event in &events {
        assert!(ids.contains(&event["id"].as_i64().unwrap()), "event {event} not in the database");
    }

    // A repairer started again on the same database finds n1 where it was.
    let before = state(listen, "n1");
    repairer.terminate(Duration::from_secs(20)).expect("the repairer stops on SIGTERM");
    let repairer = start_repairer(&config, listen, &stderr, DEADLINE);
    assert!(poll_until(DEADLINE, || state(listen, "n1").is_some()));
    let after = state(listen, "n1");
    assert!(after.is_some() && after.as_deref() != Some("healthy"), "{before:?} then {after:?}");

    let log = repairer.stderr();
    assert!(!log.contains(PASSWORD), "the password is in the log:\n{log}");
    assert!(
        log.contains(&format!("postgres://postgres@127.0.0.1:{}/{db}", cluster.port())),
        "{log}"
    );
}
