//! The node inventory against invented node names: with the one agent token, 5,000 names nobody
//! listed are posted (half with fatal findings) to a fleet of 20 inventoried nodes whose guard
//! rails let 2 be out at once. Whether such reports are refused or held as unknown, three real
//! nodes failing afterwards get exactly two drains, and service discovery lists the 20 real
//! nodes alone. Without an inventory the same names join the fleet (as before the inventory):
//! the third drain then goes through, which is what the inventory exists to stop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;

use fleetmend_proto::{Finding, Report, ReportTrigger, Verdict, WIRE_VERSION};
use fleetmend_repairer::alerts::SinkConfig;
use fleetmend_repairer::api::TargetGroup;
use fleetmend_repairer::inventory::{InventoryConfig, UnknownNodes};
use fleetmend_repairer::model::{EventKind, Severity};
use fleetmend_repairer::scheduler::SchedulerCall;
use support::{Agent, Expect, Harness, count, describe, metric, names, nic_down, xid};

const AGENT_TOKEN: &str = "agent-secret";
/// The inventoried fleet: n01..n20, of which 10 % (2) may be unavailable at once.
const REAL: usize = 20;
const MAY_BE_OUT: usize = 2;
const INVENTED: usize = 5_000;

async fn start(inventory: Option<UnknownNodes>) -> Harness {
    Harness::start(|c| {
        c.agent_token = Some(AGENT_TOKEN.to_owned());
        c.policy.guard_rails.max_unavailable_fraction = 0.10;
        // Three real nodes failing together here are the guard rails' to hold, not a storm.
        c.policy.guard_rails.breaker_fraction = 0.20;
        c.inventory = inventory.map(|unknown_nodes| InventoryConfig {
            nodes: vec!["n[01-20]".to_owned()],
            unknown_nodes,
            ..InventoryConfig::default()
        });
    })
    .await
}

/// The real fleet: each agent tells its metrics port (so each is a scrape target) and heartbeats.
async fn real_fleet(h: &Harness) -> Vec<Agent> {
    let mut agents = Vec::new();
    for name in names("n", REAL) {
        let agent = h.agent(&name);
        agent.set_metrics_port(9831);
        agent.report().await;
        agent.start_heartbeat();
        agents.push(agent);
    }
    agents
}

/// An invented node's report: with a metrics port (it would be a scrape target) and, for every
/// other name, fatal findings (a fallen GPU and a dead NIC).
fn invented_report(name: &str, fatal: bool, seq: u64) -> Vec<u8> {
    let findings: Vec<Finding> = if fatal { vec![xid("79"), nic_down("eth0")] } else { Vec::new() };
    let report = Report {
        wire_version: WIRE_VERSION,
        node: name.to_owned(),
        boot_id: "invented-boot".to_owned(),
        agent_version: "invented".to_owned(),
        seq,
        sent_at_ms: 1,
        trigger: ReportTrigger::Interval,
        verdict: if fatal { Verdict::Unhealthy } else { Verdict::Healthy },
        checks: Vec::new(),
        findings,
        command_results: Vec::new(),
        address: Some("10.9.9.9".to_owned()),
        ranks: Vec::new(),
        metrics_port: Some(9831),
    };
    serde_json::to_vec(&report).unwrap()
}

fn invented_names() -> Vec<String> {
    names("made-up-", INVENTED)
}

/// Posts every invented name's report with the agent token, 64 at a time, every other one fatal
/// when `with_fatal`; (name, status, body).
async fn post_invented(h: &Harness, seq: u64, with_fatal: bool) -> Vec<(String, u16, String)> {
    let mut answers = Vec::new();
    let invented = invented_names();
    for (chunk_index, chunk) in invented.chunks(64).enumerate() {
        let mut set = tokio::task::JoinSet::new();
        for (i, name) in chunk.iter().enumerate() {
            let fatal = with_fatal && (chunk_index * 64 + i) % 2 == 0;
            let request = h
                .client
                .post(h.url("/v1/reports"))
                .bearer_auth(AGENT_TOKEN)
                .header("content-type", "application/json")
                .body(invented_report(name, fatal, seq));
            let name = name.clone();
            set.spawn(async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                (name, status, response.text().await.unwrap())
            });
        }
        answers.extend(set.join_all().await);
    }
    answers
}

/// Makes three real nodes fail (a NIC down: the agent recommends a drain) and returns the nodes
/// drained once the rest was decided: the third is either drained too or held by the
/// max-unavailable guard rail.
async fn three_real_nodes_fail(h: &Harness, agents: &[Agent]) -> BTreeSet<String> {
    let failing = &agents[..=MAY_BE_OUT];
    for agent in failing {
        agent.set_findings(vec![nic_down("eth0")]);
    }
    let drained = || -> BTreeSet<String> {
        h.scheduler
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                SchedulerCall::Drain { node, .. } => Some(node),
                _ => None,
            })
            .collect()
    };
    h.eventually("each failing node drained or held for the unavailable share", async || {
        let events = h.events().await;
        let decided = failing.iter().all(|agent| {
            let node = agent.node();
            drained().contains(node)
                || count(
                    &events,
                    &Expect::kind(EventKind::ActionHeld).node(node).reason("(max-unavailable)"),
                ) > 0
        });
        decided.then_some(())
    })
    .await;
    // Whatever more these reports could trigger has been decided by then.
    h.wait_more_reports(3.0 * REAL as f64).await;
    drained()
}

/// The nodes service discovery hands Prometheus as agent targets.
async fn scrape_targets(h: &Harness) -> BTreeSet<String> {
    let groups: Vec<TargetGroup> = h.get_json("/v1/sd/prometheus").await;
    groups
        .into_iter()
        .filter(|g| g.labels.get("component").map(String::as_str) == Some("agent"))
        .map(|g| g.labels["node"].clone())
        .collect()
}

fn real_names() -> BTreeSet<String> {
    names("n", REAL).into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_invented_names_change_neither_the_guard_rails_nor_service_discovery() {
    let h = start(Some(UnknownNodes::Refuse)).await;
    let agents = real_fleet(&h).await;
    let events_before = h.events().await.len();

    let answers = post_invented(&h, 1, true).await;
    assert_eq!(answers.len(), INVENTED);
    for (name, status, body) in &answers {
        assert_eq!(*status, 403, "{name}: {body}");
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        let error = error["error"].as_str().unwrap();
        assert!(error.contains(&format!("node {name} is not in the inventory")), "{error}");
    }
    // Nothing stored: no node, no event.
    let nodes = h.nodes().await;
    assert_eq!(nodes.iter().map(|n| n.name.clone()).collect::<BTreeSet<_>>(), real_names());
    let events = h.events().await;
    let about_invented =
        events.iter().filter(|e| e.node.as_deref().is_some_and(|n| n.starts_with("made-up-")));
    assert_eq!(about_invented.count(), 0, "{}", describe(&events[events_before..]));

    let drained = three_real_nodes_fail(&h, &agents).await;
    assert_eq!(drained.len(), MAY_BE_OUT, "exactly k drained: {drained:?}");
    assert!(!h.breaker().await.open);
    assert_eq!(scrape_targets(&h).await, real_names());

    let text = h.metrics().await;
    let series = |s: &str| metric(&text, s);
    assert_eq!(series("fleetmend_inventory_nodes"), Some(REAL as f64), "{text}");
    assert_eq!(series("fleetmend_nodes_unknown"), Some(0.0), "{text}");
    let refused = r#"fleetmend_reports_received_total{outcome="unknown_refused"}"#;
    assert_eq!(series(refused), Some(INVENTED as f64), "{text}");
    let admitted = r#"fleetmend_reports_received_total{outcome="unknown_admitted"}"#;
    assert_eq!(series(admitted), Some(0.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_names_admitted_as_unknown_are_shown_and_alerted_once_but_never_counted() {
    let h = start(Some(UnknownNodes::Admit)).await;
    let agents = real_fleet(&h).await;

    // Each invented name reports twice: shown after the first, alerted once all the same.
    for seq in [1, 2] {
        let answers = post_invented(&h, seq, true).await;
        let refused: Vec<_> = answers.iter().filter(|(_, status, _)| *status != 200).collect();
        assert!(refused.is_empty(), "{:?}", &refused[..refused.len().min(3)]);
    }
    let nodes = h.nodes().await;
    let unknown: BTreeSet<String> =
        nodes.iter().filter(|n| n.unknown).map(|n| n.name.clone()).collect();
    assert_eq!(unknown, invented_names().into_iter().collect::<BTreeSet<_>>());
    let known: BTreeSet<String> =
        nodes.iter().filter(|n| !n.unknown).map(|n| n.name.clone()).collect();
    assert_eq!(known, real_names());
    let shown = nodes.iter().find(|n| n.name == "made-up-0001").unwrap();
    assert_eq!(shown.failing, 2, "an unknown node's findings are shown");
    assert_eq!(shown.workflow, None);

    // A person cannot have fleetmend drain one either.
    let (status, body) = h.post_admin("/v1/nodes/made-up-0001/drain", serde_json::json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("not in the inventory"), "{body}");

    let drained = three_real_nodes_fail(&h, &agents).await;
    assert_eq!(drained.len(), MAY_BE_OUT, "exactly k drained: {drained:?}");
    assert!(drained.iter().all(|n| real_names().contains(n)), "{drained:?}");
    assert!(!h.breaker().await.open, "2,500 fatal unknown nodes are no storm of the fleet");
    assert_eq!(h.provider.calls(), []);
    assert_eq!(scrape_targets(&h).await, real_names());
    let events = h.events().await;
    for name in invented_names() {
        let alerted = Expect::kind(EventKind::NodeUnknown).node(&name).severity(Severity::Warning);
        assert_eq!(count(&events, &alerted), 1, "{name} alerted once");
    }
    let decided = events.iter().filter(|e| {
        e.kind != EventKind::NodeUnknown
            && e.node.as_deref().is_some_and(|n| n.starts_with("made-up-"))
    });
    assert_eq!(
        decided.count(),
        0,
        "nothing but the alert about an unknown node (not even its silence)"
    );

    let text = h.metrics().await;
    let series = |s: &str| metric(&text, s);
    assert_eq!(series("fleetmend_inventory_nodes"), Some(REAL as f64), "{text}");
    assert_eq!(series("fleetmend_nodes_unknown"), Some(INVENTED as f64), "{text}");
    let admitted = r#"fleetmend_reports_received_total{outcome="unknown_admitted"}"#;
    assert_eq!(series(admitted), Some(2.0 * INVENTED as f64), "{text}");
    let by_state: f64 = text
        .lines()
        .filter(|l| l.starts_with("fleetmend_nodes{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(by_state, REAL as f64, "fleetmend_nodes counts the inventoried nodes: {text}");
}

/// Without an inventory every name that reports is in the fleet, as before: the invented names
/// swell the share the max-unavailable guard rail allows, and the third real node is drained
/// too. (The control for the two tests above: it fails where they pass.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_inventory_invented_names_count_in_the_fleet() {
    let h = Harness::start(|c| {
        c.agent_token = Some(AGENT_TOKEN.to_owned());
        c.policy.guard_rails.max_unavailable_fraction = 0.10;
        // The invented names report once: they must not go unreachable (and be drained) here.
        c.engine.report_interval = Duration::from_secs(3600);
    })
    .await;
    let agents = real_fleet(&h).await;
    // Healthy names only: fatal ones would open the breaker of a fleet that is mostly invented.
    let answers = post_invented(&h, 1, false).await;
    assert!(answers.iter().all(|(_, status, _)| *status == 200));
    let drained = three_real_nodes_fail(&h, &agents).await;
    assert_eq!(drained.len(), MAY_BE_OUT + 1, "{drained:?}");
    assert_eq!(scrape_targets(&h).await.len(), REAL + INVENTED);
}

/// At most `max_unknown` nodes are held as unknown: of 32 invented names reporting at once, 3 are
/// admitted and the rest refused naming the limit, and a node already held keeps reporting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_than_max_unknown_nodes_are_held_even_when_they_report_at_once() {
    const MAX: usize = 3;
    let h = Harness::start(|c| {
        c.agent_token = Some(AGENT_TOKEN.to_owned());
        c.inventory = Some(InventoryConfig {
            nodes: vec!["n[01-20]".to_owned()],
            unknown_nodes: UnknownNodes::Admit,
            max_unknown: MAX as u32,
            ..InventoryConfig::default()
        });
    })
    .await;
    let post = |name: String, seq: u64| {
        let request = h
            .client
            .post(h.url("/v1/reports"))
            .bearer_auth(AGENT_TOKEN)
            .header("content-type", "application/json")
            .body(invented_report(&name, false, seq));
        async move {
            let response = request.send().await.unwrap();
            (name, response.status().as_u16(), response.text().await.unwrap())
        }
    };
    let mut set = tokio::task::JoinSet::new();
    for name in names("made-up-", 32) {
        set.spawn(post(name, 1));
    }
    let answers = set.join_all().await;
    let admitted: Vec<String> =
        answers.iter().filter(|a| a.1 == 200).map(|a| a.0.clone()).collect();
    assert_eq!(admitted.len(), MAX, "{answers:?}");
    for (name, status, body) in answers.iter().filter(|a| a.1 != 200) {
        assert_eq!(*status, 403, "{name}: {body}");
        assert!(body.contains(&format!("node {name} is not in the inventory")), "{body}");
        assert!(body.contains("inventory.max_unknown"), "{body}");
    }
    let (_, status, body) = post(admitted[0].clone(), 2).await;
    assert_eq!(status, 200, "a node held already is not refused at the limit: {body}");
    let unknown = h.nodes().await.into_iter().filter(|n| n.unknown).count();
    assert_eq!(unknown, MAX);
    let text = h.metrics().await;
    assert_eq!(metric(&text, "fleetmend_nodes_unknown"), Some(MAX as f64), "{text}");
    let refused = r#"fleetmend_reports_received_total{outcome="unknown_refused"}"#;
    assert_eq!(metric(&text, refused), Some((32 - MAX) as f64), "{text}");
}

/// Alertmanager's findings follow the same rule: refused for a node outside the inventory
/// (answered among `unknown_nodes`, nothing stored), shown on a node held as unknown without
/// anything done about it, acted on for an inventoried node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_webhook_findings_for_nodes_outside_the_inventory_follow_the_same_rule() {
    let drain_on_alert = || {
        toml::from_str::<fleetmend_repairer::policy::RuleConfig>(
            "name = \"am-drain\"\ncheck = \"alertmanager\"\naction = \"drain\"",
        )
        .unwrap()
    };
    let notification = |node: &str| {
        serde_json::json!({
            "version": "4", "status": "firing", "receiver": "fleetmend", "groupKey": "{}",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093", "truncatedAlerts": 0,
            "alerts": [{
                "status": "firing",
                "labels": {"alertname": "NodeDiskFailing", "node": node, "severity": "critical"},
                "annotations": {}, "startsAt": "2024-05-01T10:00:00.000Z",
                "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "1"
            }]
        })
    };
    for mode in [UnknownNodes::Refuse, UnknownNodes::Admit] {
        let h = Harness::start(|c| {
            c.agent_token = Some(AGENT_TOKEN.to_owned());
            c.policy.rules.push(drain_on_alert());
            c.inventory = Some(InventoryConfig {
                nodes: vec!["n[01-20]".to_owned()],
                unknown_nodes: mode,
                ..InventoryConfig::default()
            });
        })
        .await;
        let agents = real_fleet(&h).await;
        let body = invented_report("made-up-1", false, 1);
        let admitted = h
            .client
            .post(h.url("/v1/reports"))
            .bearer_auth(AGENT_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(admitted, if mode == UnknownNodes::Admit { 200 } else { 403 }, "{mode:?}");

        let post = async |node: &str| {
            let url = h.url(&format!("/v1/alerts/alertmanager?token={AGENT_TOKEN}"));
            let response = h.client.post(url).json(&notification(node)).send().await.unwrap();
            assert_eq!(response.status().as_u16(), 200, "{mode:?}");
            response.json::<serde_json::Value>().await.unwrap()
        };
        let answer = post("made-up-1").await;
        let want = if mode == UnknownNodes::Admit {
            serde_json::json!({"accepted": 1, "skipped": 0, "unknown_nodes": []})
        } else {
            serde_json::json!({"accepted": 0, "skipped": 0, "unknown_nodes": ["made-up-1"]})
        };
        assert_eq!(answer, want, "{mode:?}");
        let answer = post("n05").await;
        assert_eq!(answer["accepted"], 1, "{mode:?}: {answer}");
        h.wait_state("n05", fleetmend_repairer::model::NodeState::Drained).await;
        h.wait_more_reports(REAL as f64).await;
        let drains: Vec<SchedulerCall> = h
            .scheduler
            .calls()
            .into_iter()
            .filter(|c| matches!(c, SchedulerCall::Drain { .. }))
            .collect();
        assert_eq!(drains.len(), 1, "{mode:?}: only n05 drained: {drains:?}");
        let shown = h.nodes().await.into_iter().find(|n| n.name == "made-up-1");
        match mode {
            UnknownNodes::Admit => {
                let shown = shown.unwrap();
                assert!(shown.unknown && shown.failing == 1, "{shown:?}");
            }
            UnknownNodes::Refuse => assert!(shown.is_none()),
        }
        drop(agents);
    }
}

/// What a webhook sink received: the events' kinds, severities and nodes.
type Received = Arc<Mutex<Vec<(String, String, String)>>>;

async fn receive(State(received): State<Received>, body: Bytes) -> StatusCode {
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let field = |k: &str| event[k].as_str().unwrap_or_default().to_owned();
    received.lock().unwrap().push((field("kind"), field("severity"), field("node")));
    StatusCode::OK
}

/// An inventory file read again when it changes: a node added to it joins the fleet, a node taken
/// out of it becomes unknown, at once. The alert sink gets one `node-unknown` alarm per node
/// however often it reports, and the clear when it comes into the inventory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inventory_file_change_moves_nodes_in_and_out_of_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodes");
    std::fs::write(&file, "# the fleet\nn[01-03]\n").unwrap();
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = Router::new().route("/hook", post(receive)).with_state(received.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let h = Harness::start(|c| {
        c.alerts.poll_interval = Duration::from_millis(100);
        c.alerts.sinks.push(SinkConfig {
            name: "pager".to_owned(),
            kind: "webhook".to_owned(),
            url: hook.clone(),
            from_start: true,
            ..SinkConfig::default()
        });
        c.inventory = Some(InventoryConfig {
            file: Some(file.clone()),
            file_recheck: Duration::from_millis(50),
            unknown_nodes: UnknownNodes::Admit,
            ..InventoryConfig::default()
        });
    })
    .await;
    let fleet: Vec<Agent> = ["n01", "n02", "n03", "n04"]
        .iter()
        .map(|name| {
            let agent = h.agent(name);
            agent.start_heartbeat();
            agent
        })
        .collect();
    let unknown_of = async || -> BTreeSet<String> {
        h.nodes().await.into_iter().filter(|n| n.unknown).map(|n| n.name).collect()
    };
    h.eventually("n04 held as unknown", async || {
        (h.nodes().await.len() == 4 && unknown_of().await == BTreeSet::from(["n04".to_owned()]))
            .then_some(())
    })
    .await;

    std::fs::write(&file, "n[02-04]\n").unwrap();
    h.eventually("n01 out of the fleet, n04 in it", async || {
        (unknown_of().await == BTreeSet::from(["n01".to_owned()])).then_some(())
    })
    .await;
    let events = h.events().await;
    let n04 = |severity| Expect::kind(EventKind::NodeUnknown).node("n04").severity(severity);
    assert_eq!(count(&events, &n04(Severity::Warning)), 1, "{}", describe(&events));
    assert_eq!(count(&events, &n04(Severity::Info)), 1, "{}", describe(&events));
    let n01 = Expect::kind(EventKind::NodeUnknown).node("n01").severity(Severity::Warning);
    assert_eq!(count(&events, &n01), 1, "{}", describe(&events));
    let text = h.metrics().await;
    assert_eq!(metric(&text, "fleetmend_nodes_unknown"), Some(1.0), "{text}");
    let read = r#"fleetmend_inventory_refreshes_total{source="file",outcome="ok"}"#;
    assert!(metric(&text, read).is_some_and(|n| n >= 1.0), "{text}");

    let unknown_alerts = || -> Vec<(String, String, String)> {
        let received = received.lock().unwrap();
        let mut got: Vec<_> = received.iter().filter(|r| r.0 == "node-unknown").cloned().collect();
        got.sort();
        got
    };
    let mut want = [("n01", "warning"), ("n04", "info"), ("n04", "warning")]
        .map(|(node, severity)| ("node-unknown".to_owned(), severity.to_owned(), node.to_owned()));
    want.sort();
    h.eventually("the sink to get each node-unknown alert", async || {
        (unknown_alerts().len() >= want.len()).then_some(())
    })
    .await;
    h.wait_more_reports(20.0).await;
    assert_eq!(unknown_alerts(), want, "once per node, however often it reported");
    drop(fleet);
    server.abort();
}
