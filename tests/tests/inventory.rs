//! The node inventory with the real binary: a repairer whose inventory is `n[01-20]` (10 % of
//! them, 2, may be out at once) is sent 5,000 invented node names with the one agent token, half
//! of them with fatal findings. Refused or admitted as unknown, they change nothing the guard
//! rails count: three real nodes failing afterwards get exactly two drains, and service discovery
//! lists the 20 real nodes alone. Admitted ones are listed by `fleetmend nodes` as unknown.
//! Then Slurm's own node list as the inventory, against the real Slurm dev cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fleetmend_tests::slurm::{DevCluster, can_run};
use fleetmend_tests::{fleetmend_bin, http_get, http_with_token, poll_until, run_with_timeout};

const AGENT: &str = "agent-secret";
const ADMIN: &str = "admin-secret";
const REAL: usize = 20;
const MAY_BE_OUT: usize = 2;
const INVENTED: usize = 5_000;

fn real_names() -> BTreeSet<String> {
    (1..=REAL).map(|i| format!("n{i:02}")).collect()
}

/// A report for `node`: with a metrics port (every node that counts is a scrape target) and the
/// given failing findings.
fn report(node: &str, findings: serde_json::Value) -> String {
    serde_json::json!({
        "wire_version": fleetmend_proto::WIRE_VERSION,
        "node": node, "boot_id": format!("{node}-boot"), "agent_version": "scripted",
        "seq": 1, "sent_at_ms": 1, "trigger": "interval",
        "verdict": if findings.as_array().is_some_and(|f| !f.is_empty()) { "unhealthy" } else { "healthy" },
        "checks": [], "findings": findings, "address": "10.9.9.9", "metrics_port": 9831,
    })
    .to_string()
}

fn nic_down() -> serde_json::Value {
    serde_json::json!([{ "check": "nic", "finding": "nic_down", "subject": "eth0", "status": "fail",
        "action": "drain", "message": "eth0 has no carrier" }])
}

fn fatal() -> serde_json::Value {
    serde_json::json!([
        { "check": "gpu", "finding": "xid", "subject": "0", "status": "fail", "action": "reboot",
          "message": "Xid 79 on GPU 0", "labels": { "xid": "79" } },
        { "check": "nic", "finding": "nic_down", "subject": "eth0", "status": "fail",
          "action": "drain", "message": "eth0 has no carrier" },
    ])
}

fn post_report(repairer: SocketAddr, body: &str) -> (u16, String) {
    http_with_token(repairer, "/v1/reports", AGENT, Some(body)).expect("the repairer answers")
}

/// Posts the 5,000 invented names (every other one with fatal findings) from 8 threads; each
/// name with its answer.
fn post_invented(repairer: SocketAddr) -> Vec<(String, u16, String)> {
    let names: Vec<String> = (1..=INVENTED).map(|i| format!("made-up-{i:04}")).collect();
    let threads: Vec<_> = names
        .chunks(INVENTED / 8)
        .map(|chunk| {
            let chunk = chunk.to_vec();
            std::thread::spawn(move || {
                chunk
                    .into_iter()
                    .enumerate()
                    .map(|(i, name)| {
                        let findings = if i % 2 == 0 { fatal() } else { serde_json::json!([]) };
                        let (status, body) = post_report(repairer, &report(&name, findings));
                        (name, status, body)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
}

/// `fleetmend nodes --output json` as the admin: each node's name, state and unknown mark.
fn nodes(repairer: SocketAddr, dir: &Path) -> Vec<(String, String, bool)> {
    let token = dir.join("admin.token");
    std::fs::write(&token, ADMIN).unwrap();
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(["nodes", "--output", "json", "--token-file"])
            .arg(&token)
            .env("FLEETMEND_REPAIRER", format!("http://{repairer}")),
        Duration::from_secs(30),
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let nodes: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let name = n["name"].as_str().unwrap().to_owned();
            (name, n["state"].as_str().unwrap().to_owned(), n["unknown"].as_bool().unwrap())
        })
        .collect()
}

/// The nodes service discovery gives Prometheus as agent targets.
fn scrape_targets(repairer: SocketAddr) -> BTreeSet<String> {
    let (status, body) = http_with_token(repairer, "/v1/sd/prometheus", ADMIN, None).unwrap();
    assert_eq!(status, 200, "{body}");
    let groups: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    groups
        .iter()
        .filter(|g| g["labels"]["component"] == "agent")
        .map(|g| g["labels"]["node"].as_str().unwrap().to_owned())
        .collect()
}

/// What the guard rails take their shares of and what Prometheus is handed: the nodes of the
/// fleet (`fleetmend_nodes` summed over its states) and the agents service discovery lists.
fn fleet_seen(repairer: SocketAddr) -> (f64, BTreeSet<String>) {
    let (_, text) = http_get(repairer, "/metrics").expect("the repairer answers");
    let nodes = text
        .lines()
        .filter(|l| l.starts_with("fleetmend_nodes{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    (nodes, scrape_targets(repairer))
}

/// Posts the invented names and checks that the fleet seen is the same after as before; returns
/// the answers.
fn post_invented_and_compare(repairer: SocketAddr, mode: &str) -> Vec<(String, u16, String)> {
    let before = fleet_seen(repairer);
    assert_eq!(before, (REAL as f64, real_names()), "{mode}: before");
    let started = Instant::now();
    let answers = post_invented(repairer);
    let took = started.elapsed();
    let after = fleet_seen(repairer);
    eprintln!(
        "{mode}: {INVENTED} invented reports answered in {took:?}; fleet nodes {} -> {}, \
         scrape targets {} -> {}",
        before.0,
        after.0,
        before.1.len(),
        after.1.len()
    );
    assert_eq!(after, before, "{mode}: the invented names changed the fleet seen");
    answers
}

fn metric(repairer: SocketAddr, series: &str) -> Option<f64> {
    let (_, text) = http_get(repairer, "/metrics")?;
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Makes n01..n03 fail (a dead NIC: the agent recommends a drain) and returns the real nodes out
/// once the three are decided: two drained, the third held (suspect) for the unavailable share.
fn three_real_nodes_fail(repairer: SocketAddr, dir: &Path) -> BTreeSet<String> {
    let failing: Vec<String> = (1..=MAY_BE_OUT + 1).map(|i| format!("n{i:02}")).collect();
    let out = |nodes: &[(String, String, bool)]| -> BTreeSet<String> {
        let out_states = ["draining", "drained"];
        nodes
            .iter()
            .filter(|(name, state, _)| {
                real_names().contains(name) && out_states.contains(&state.as_str())
            })
            .map(|(name, _, _)| name.clone())
            .collect()
    };
    let mut settled = BTreeSet::new();
    let decided = poll_until(Duration::from_secs(30), || {
        for node in &failing {
            post_report(repairer, &report(node, nic_down()));
        }
        let nodes = nodes(repairer, dir);
        settled = out(&nodes);
        let suspects =
            nodes.iter().filter(|(n, s, _)| failing.contains(n) && s == "suspect").count();
        settled.len() + suspects == failing.len() && settled.len() >= MAY_BE_OUT
    });
    assert!(decided, "the failing nodes were not all decided: out {settled:?}");
    // More observations of the same failures change nothing.
    for _ in 0..3 {
        for node in &failing {
            post_report(repairer, &report(node, nic_down()));
        }
    }
    out(&nodes(repairer, dir))
}

fn start(dir: &Path, unknown_nodes: &str) -> (SocketAddr, fleetmend_tests::Running) {
    fleetmend_tests::repairer_in(
        dir,
        &format!(
            "agent_token = \"{AGENT}\"\nadmin_token = \"{ADMIN}\"\nscheduler = \"memory\"\n\
             [engine]\nreport_interval = \"1h\"\ntick = \"100ms\"\n\
             [policy.guard_rails]\nmax_unavailable_fraction = 0.10\nsettle = \"0s\"\n\
             breaker_fraction = 0.20\n\
             [inventory]\nnodes = [\"n[01-20]\"]\nunknown_nodes = \"{unknown_nodes}\"\n"
        ),
    )
}

fn real_fleet_reports(repairer: SocketAddr) {
    for node in real_names() {
        let (status, body) = post_report(repairer, &report(&node, serde_json::json!([])));
        assert_eq!(status, 200, "{node}: {body}");
    }
}

#[test]
fn invented_names_refused_by_the_inventory_change_no_guard_rail_and_no_scrape_target() {
    let dir = tempfile::tempdir().unwrap();
    let (repairer, process) = start(dir.path(), "refuse");
    real_fleet_reports(repairer);

    let answers = post_invented_and_compare(repairer, "refuse");
    assert_eq!(answers.len(), INVENTED);
    for (name, status, body) in &answers {
        assert_eq!(*status, 403, "{name}: {body}");
        assert!(body.contains(&format!("node {name} is not in the inventory")), "{body}");
    }
    let listed: BTreeSet<String> = nodes(repairer, dir.path()).into_iter().map(|n| n.0).collect();
    assert_eq!(listed, real_names(), "nothing stored of the invented names");
    let (_, events) = http_with_token(repairer, "/v1/events?limit=10000", ADMIN, None).unwrap();
    assert!(!events.contains("made-up-"), "nothing recorded of the invented names");

    let out = three_real_nodes_fail(repairer, dir.path());
    assert_eq!(out.len(), MAY_BE_OUT, "exactly k drained: {out:?}\n{}", process.stderr());
    assert_eq!(scrape_targets(repairer), real_names());
    let refused = r#"fleetmend_reports_received_total{outcome="unknown_refused"}"#;
    assert_eq!(metric(repairer, refused), Some(INVENTED as f64));
    assert_eq!(metric(repairer, "fleetmend_inventory_nodes"), Some(REAL as f64));
}

#[test]
fn invented_names_admitted_as_unknown_are_listed_but_change_no_guard_rail_and_no_scrape_target() {
    let dir = tempfile::tempdir().unwrap();
    let (repairer, process) = start(dir.path(), "admit");
    real_fleet_reports(repairer);

    let answers = post_invented_and_compare(repairer, "admit");
    assert_eq!(answers.len(), INVENTED);
    let refused: Vec<_> = answers.iter().filter(|a| a.1 != 200).take(3).collect();
    assert!(refused.is_empty(), "{refused:?}");
    let listed = nodes(repairer, dir.path());
    assert_eq!(listed.len(), REAL + INVENTED);
    let known: BTreeSet<String> = listed.iter().filter(|n| !n.2).map(|n| n.0.clone()).collect();
    assert_eq!(known, real_names());
    assert!(listed.iter().filter(|n| n.2).all(|n| n.0.starts_with("made-up-")));

    // The table marks them unknown.
    let token = dir.path().join("admin.token");
    let table = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(["nodes", "--token-file"])
            .arg(&token)
            .env("FLEETMEND_REPAIRER", format!("http://{repairer}")),
        Duration::from_secs(30),
    );
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table.lines().find(|l| l.starts_with("made-up-0001 ")).expect("listed");
    assert_eq!(row.split_whitespace().nth(1), Some("unknown"), "{row}");

    let out = three_real_nodes_fail(repairer, dir.path());
    assert_eq!(out.len(), MAY_BE_OUT, "exactly k drained: {out:?}\n{}", process.stderr());
    assert_eq!(scrape_targets(repairer), real_names());
    assert_eq!(metric(repairer, "fleetmend_nodes_unknown"), Some(INVENTED as f64));
    assert_eq!(metric(repairer, "fleetmend_breaker_open"), Some(0.0));
    // One alert per invented name: the event log's node-unknown warnings.
    let (_, events) = http_with_token(repairer, "/v1/events?limit=10000", ADMIN, None).unwrap();
    let events: Vec<serde_json::Value> = serde_json::from_str(&events).unwrap();
    let alerted: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "node-unknown" && e["severity"] == "warning")
        .filter_map(|e| e["node"].as_str())
        .collect();
    assert_eq!(alerted.len(), INVENTED);
    assert_eq!(alerted.iter().collect::<BTreeSet<_>>().len(), INVENTED, "once each");
}

/// Slurm's own node list as the inventory: the dev cluster's node1..node4 report, a name Slurm
/// does not know is refused; with slurmctld stopped, the failed refreshes are counted and the
/// list read before stays.
#[test]
fn slurms_node_list_is_the_inventory_and_survives_a_stopped_controller() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let (repairer, process) = fleetmend_tests::repairer_in(
        dir.path(),
        &format!(
            "agent_token = \"{AGENT}\"\nadmin_token = \"{ADMIN}\"\nscheduler = \"slurm\"\n\
             [engine]\nreport_interval = \"1h\"\n\
             [slurm]\nslurm_conf = \"{}\"\n\
             [inventory]\nslurm = true\nslurm_refresh = \"300ms\"\nslurm_timeout = \"5s\"\n",
            cluster.conf().display()
        ),
    );
    assert_eq!(metric(repairer, "fleetmend_inventory_nodes"), Some(4.0), "{}", process.stderr());
    let ok = |node: &str| post_report(repairer, &report(node, serde_json::json!([]))).0;
    assert_eq!(ok("node2"), 200);
    let (status, body) = post_report(repairer, &report("node9", serde_json::json!([])));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("node node9 is not in the inventory"), "{body}");

    cluster.stop_controller();
    let failed = r#"fleetmend_inventory_refreshes_total{source="slurm",outcome="error"}"#;
    assert!(
        poll_until(Duration::from_secs(30), || metric(repairer, failed).is_some_and(|n| n >= 2.0)),
        "no failed refresh counted: {:?}\n{}",
        metric(repairer, failed),
        process.stderr()
    );
    assert_eq!(metric(repairer, "fleetmend_inventory_nodes"), Some(4.0), "the list stays");
    assert_eq!(ok("node3"), 200);
    assert!(process.stderr().contains("Slurm's node list was not read again"), "logged");
}
