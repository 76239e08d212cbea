//! Chaos end to end: the self-healing loop on real processes.
//!
//! - The built-in scenario on a local fleet (4 working nodes + 2 hot spares, a 4-rank training
//!   job): a persistent Xid 79 under rank 1 at about step 30 → drained, the job checkpointed,
//!   requeued and resumed at once on a hot spare; a reboot tried, the fault still there → the other
//!   spare replaces the node and is validated; then a transient Xid 48 on another node → the job
//!   goes on without it, a reboot clears it; the job completes with an uninterrupted run's weights
//!   hash. Every transition is checked in the repairer's event log, in order.
//! - A storm: faults on 3 of 5 nodes at once → the breaker opens, nothing is rebooted, and the
//!   critical breaker event reaches a webhook receiver.
//! - A real network fault: two nodes in network namespaces, their data links veth pairs on a
//!   bridge, each agent reading its namespace's real /sys and reporting over a control veth; one
//!   data link set down → that agent's nic check fails → the repairer drains the node (and puts it
//!   back when the link returns).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetmend_local::faults::Fault;
use fleetmend_local::scenario::{self, Expect, Scenario};
use fleetmend_local::up::{Fleet, FleetConfig};
use fleetmend_repairer::alerts::SinkConfig;
use fleetmend_tests::netns::{NetnsFleet, events_cli, ip, node_state, nodes_json, story};
use fleetmend_tests::{fleetmend_bin, poll_until};
use serde_json::Value;

/// The fleet's events as JSON (the tests crate speaks to the repairer's types through serde).
fn events(fleet: &Fleet) -> Vec<Value> {
    let events = fleet.events(0, 100_000).unwrap();
    serde_json::to_value(events).unwrap().as_array().unwrap().clone()
}

fn id(event: &Value) -> i64 {
    event["id"].as_i64().unwrap()
}

/// The first event after `after` (an id) that `matches`, or a failure naming `what`.
fn first_after<'a>(
    events: &'a [Value],
    after: i64,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) -> &'a Value {
    events
        .iter()
        .find(|e| id(e) > after && matches(e))
        .unwrap_or_else(|| panic!("no {what} after event {after}:\n{}", story(events)))
}

fn state_change(e: &Value, node: &str, to: &str) -> bool {
    e["kind"] == "state-changed" && e["node"] == node && e["to_state"] == to
}

fn step(e: &Value, node: &str, reason: &str) -> bool {
    e["kind"] == "workflow-step" && e["node"] == node && e["reason"] == reason
}

fn job_event(e: &Value, job: &str, kind: &str) -> bool {
    e["kind"] == kind && e["reason"].as_str().is_some_and(|r| r.starts_with(&format!("job {job} ")))
}

/// The nodes a job-started event names (`started on a, b, c (MASTER_ADDR=...)`).
fn started_on(event: &Value) -> Vec<String> {
    let reason = event["reason"].as_str().unwrap_or("");
    let list = reason.split_once("started on ").map_or("", |(_, rest)| rest);
    let list = list.split_once(" (").map_or(list, |(nodes, _)| nodes);
    list.split(", ").map(str::to_owned).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// The fleet's settings for tests: short simulated boots.
fn test_config(dir: &Path) -> FleetConfig {
    FleetConfig {
        boot_delay: Duration::from_millis(500),
        ..FleetConfig::new(dir.join("state"), fleetmend_bin())
    }
}

#[test]
fn builtin_scenario_replaces_a_persistent_xid_79_reboots_a_transient_xid_48_and_keeps_the_bits() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let scenario = Scenario::builtin();
        let mut config = test_config(dir.path());
        scenario.configure(&mut config);
        assert_eq!((config.nodes, config.spares), (4, 2));
        let fleet = Fleet::start(config).await.unwrap();
        let job = fleet.job_id().unwrap().to_owned();
        let boot_ids: Vec<(String, String)> = ["node-1", "node-2", "node-3", "node-4"]
            .iter()
            .map(|n| (n.to_string(), fleet.supervisor().boot_id(n).unwrap()))
            .collect();

        let mut progress = Vec::new();
        let run = scenario::run(&fleet, &scenario, &mut progress).await;
        let progress = String::from_utf8_lossy(&progress).into_owned();
        let log = events(&fleet);
        let summary = match run {
            Ok(summary) => summary,
            Err(err) => panic!("the scenario failed: {err}\n{progress}\n{}", story(&log)),
        };
        let context = format!("{}\n{progress}\nevents:\n{}", summary.render(), story(&log));
        let job_view = fleet.job().unwrap();
        let boot_ids: Vec<(String, String, String)> = boot_ids
            .into_iter()
            .map(|(node, before)| {
                let after = fleet.supervisor().boot_id(&node).unwrap_or_default();
                (node, before, after)
            })
            .collect();
        fleet.shutdown().await;

        assert!(summary.passed, "{context}");
        let (first, second) = (&summary.faults[0], &summary.faults[1]);
        let victim = first.node.clone().unwrap();
        let other = second.node.clone().unwrap();
        assert_eq!(first.rank, Some(1), "{context}");
        assert!(first.at_step.is_some_and(|s| (30..40).contains(&s)), "{context}");
        assert_ne!(victim, other);
        assert_eq!((first.expect, first.expectation_met), (Some(Expect::Replace), Some(true)));
        assert_eq!((second.expect, second.expectation_met), (Some(Expect::Reboot), Some(true)));
        // The job takes the first hot spare at once; the replacement is the other one.
        let hot = "node-5".to_owned();
        let spare = first.replaced_by.clone().unwrap();
        assert_eq!(spare, "node-6", "{context}");
        assert_eq!(first.actions, ["reboot", "replace"], "{context}");
        assert_eq!(second.actions, ["reboot"], "{context}");
        // The ranks could checkpoint (SIGUSR1, then SIGTERM): nothing is done twice.
        assert_eq!((first.steps_lost, second.steps_lost), (Some(0), Some(0)), "{context}");
        assert_eq!(summary.hash_matches, Some(true), "{context}");
        assert_eq!(summary.restarts, 2, "{context}");

        // The job: resumed from its checkpoint each time, the hot spare at work, the victim not,
        // and never waiting for a repair (the second time the other spare, or the first
        // replacement back in the pool, takes the place of the rebooting node).
        let history = job_view.job.history.clone();
        assert_eq!(history.len(), 3, "{context}");
        for pair in history.windows(2) {
            assert!(pair[0].failed, "{context}");
            assert_eq!(pair[1].resumed_from_step, pair[0].last_step, "{context}");
        }
        assert!(history[0].nodes.contains(&victim) && !history[0].nodes.contains(&hot));
        assert!(history[1].nodes.contains(&hot) && !history[1].nodes.contains(&victim));
        assert!(!history[2].nodes.contains(&victim), "{context}");

        // The event log, in order. The persistent Xid 79 on the victim:
        let start = log
            .iter()
            .take_while(|e| e["at_ms"].as_u64().is_some_and(|at| at < summary.started_ms))
            .last()
            .map_or(0, id);
        let draining = first_after(&log, start, "victim draining", |e| {
            state_change(e, &victim, "draining") && e["from_state"] == "healthy"
        });
        let drained = first_after(&log, id(draining), "victim drained in the queue", |e| {
            step(e, &victim, "step Checkpoint")
        });
        let checkpoint = first_after(&log, id(draining), "checkpoint requested", |e| {
            job_event(e, &job, "job-checkpoint-requested")
        });
        let written = first_after(&log, id(checkpoint), "checkpoint written", |e| {
            job_event(e, &job, "job-stopping")
                && e["reason"].as_str().unwrap().contains("checkpoint step")
        });
        let requeued =
            first_after(&log, id(checkpoint), "requeued", |e| job_event(e, &job, "job-requeued"));
        let repairing = first_after(&log, id(drained), "victim repairing", |e| {
            state_change(e, &victim, "repairing")
        });
        let reboot = first_after(&log, id(repairing), "reboot issued", |e| {
            step(e, &victim, "step AwaitBoot")
        });
        assert!(id(written) < id(reboot), "rebooted before the checkpoint was written:\n{context}");
        let validating = first_after(&log, id(reboot), "victim validating", |e| {
            state_change(e, &victim, "validating")
        });
        let escalated = first_after(&log, id(validating), "reboot did not help", |e| {
            e["kind"] == "repair-finished"
                && e["node"] == victim.as_str()
                && e["reason"].as_str().unwrap().contains("escalating to replace")
        });
        assert!(
            escalated["reason"].as_str().unwrap().contains("validation failed"),
            "the fault did not persist through the reboot:\n{context}"
        );
        let replace = first_after(&log, id(escalated), "replacement", |e| {
            step(e, &victim, "step AwaitReplacement")
        });
        let spare_validating = first_after(&log, id(replace), "spare validating", |e| {
            state_change(e, &spare, "validating")
        });
        let replaced = first_after(&log, id(spare_validating), "replace finished", |e| {
            e["kind"] == "repair-finished"
                && e["node"] == victim.as_str()
                && e["reason"] == "replace repaired and validated"
        });
        let retired = first_after(&log, id(replaced), "victim retired", |e| {
            state_change(e, &victim, "retired")
        });
        let spare_healthy = first_after(&log, id(retired), "spare healthy", |e| {
            state_change(e, &spare, "healthy") && e["reason"] == format!("replaced {victim}")
        });
        // The job does not wait for the repair: requeued, it takes the hot spare at once.
        let taken = first_after(&log, id(requeued), "hot spare taken", |e| {
            e["kind"] == "spare-taken" && e["node"] == hot.as_str()
        });
        let resumed = first_after(&log, id(taken), "job started again", |e| {
            job_event(e, &job, "job-started")
        });
        assert!(
            started_on(resumed).contains(&hot),
            "the job did not resume on the spare: {resumed}"
        );
        assert!(id(resumed) < id(validating), "the job waited for the repair:\n{context}");
        // No new work for the victim from its fault on.
        assert!(
            !log.iter().any(|e| id(e) > id(draining)
                && job_event(e, &job, "job-started")
                && started_on(e).contains(&victim)),
            "the job went back to the victim:\n{context}"
        );

        // Then the transient Xid 48 on another node: a reboot clears it.
        // (the replacement may still be under way: the job is not waiting for it)
        let _ = spare_healthy;
        let after = id(resumed);
        let draining =
            first_after(&log, after, "other draining", |e| state_change(e, &other, "draining"));
        let checkpoint = first_after(&log, id(draining), "second checkpoint", |e| {
            job_event(e, &job, "job-checkpoint-requested")
        });
        let written = first_after(&log, id(checkpoint), "second checkpoint written", |e| {
            job_event(e, &job, "job-stopping")
                && e["reason"].as_str().unwrap().contains("checkpoint step")
        });
        let requeued = first_after(&log, id(checkpoint), "second requeue", |e| {
            job_event(e, &job, "job-requeued")
        });
        let reboot =
            first_after(&log, id(draining), "second reboot", |e| step(e, &other, "step AwaitBoot"));
        assert!(id(written) < id(reboot), "rebooted before the checkpoint was written:\n{context}");
        let validating = first_after(&log, id(reboot), "other validating", |e| {
            state_change(e, &other, "validating")
        });
        let repaired = first_after(&log, id(validating), "reboot repaired", |e| {
            e["kind"] == "repair-finished"
                && e["node"] == other.as_str()
                && e["reason"] == "reboot repaired and validated"
        });
        first_after(&log, id(repaired), "other healthy", |e| state_change(e, &other, "healthy"));
        let started =
            first_after(&log, id(requeued), "third start", |e| job_event(e, &job, "job-started"));
        assert!(!started_on(started).contains(&victim), "{started}");
        first_after(&log, id(started), "completed", |e| job_event(e, &job, "job-completed"));
        assert!(
            !log.iter().any(|e| e["kind"] == "state-changed"
                && e["node"] == other.as_str()
                && e["to_state"] == "retired"),
            "the transient fault's node was replaced:\n{context}"
        );
        // The reboot gave it a new boot id; the nodes no fault hit kept theirs.
        for (node, before, after) in &boot_ids {
            if *node == other {
                assert_ne!(before, after, "{node} was not rebooted");
            } else if *node != victim {
                assert_eq!(before, after, "{node} was rebooted:\n{context}");
            }
        }
        eprintln!("{}", summary.render());
    });
}

/// A webhook receiver on a free port: every JSON body POSTed to it, in order.
async fn alert_receiver() -> (SocketAddr, Arc<Mutex<Vec<Value>>>) {
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/alerts",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push(body);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, received)
}

#[test]
fn a_storm_on_3_of_5_nodes_opens_the_breaker_and_nothing_is_rebooted() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        // A webhook receiver: the breaker's alert must reach it.
        let (receiver, received) = alert_receiver().await;
        let sink = SinkConfig {
            name: "pager".to_owned(),
            kind: "webhook".to_owned(),
            url: format!("http://{receiver}/alerts"),
            ..SinkConfig::default()
        };
        let config = FleetConfig { job: false, alert_sinks: vec![sink], ..test_config(dir.path()) };
        let fleet = Fleet::start(config).await.unwrap();
        let supervisor = fleet.supervisor().clone();
        let nodes = ["node-1", "node-2", "node-3", "node-4", "node-5"];
        let boots: Vec<String> = nodes.iter().map(|n| supervisor.boot_id(n).unwrap()).collect();
        let pids: Vec<Option<u32>> =
            nodes.iter().map(|n| supervisor.node(n).unwrap().pid).collect();
        let start = events(&fleet).last().map_or(0, id);

        // A bad driver rollout: three nodes lose a GPU at the same moment.
        for node in &nodes[..3] {
            fleet.inject(node, &Fault::GpuXid(79), false).unwrap();
        }
        let opened = fleetmend_tests::poll_until_async(Duration::from_secs(30), || {
            fleet.engine().breaker().open
        })
        .await;
        let log = events(&fleet);
        assert!(opened, "the breaker did not open:\n{}", story(&log));

        // Every node that lost a GPU is held by the breaker. A node whose repair began before the
        // storm was recognised is drained at once, its reboot waits for the settle time, and there
        // the breaker holds it ("reboot held: the breaker is open") rather than rebooting it.
        let held = fleetmend_tests::poll_until_async(Duration::from_secs(30), || {
            let log = events(&fleet);
            nodes[..3].iter().all(|node| {
                log.iter().any(|e| {
                    id(e) > start
                        && e["kind"] == "action-held"
                        && e["node"] == *node
                        && e["reason"].as_str().is_some_and(|r| r.contains("breaker"))
                })
            })
        })
        .await;
        let log = events(&fleet);
        assert!(held, "not every faulty node is held by the breaker:\n{}", story(&log));
        let breaker = first_after(&log, start, "breaker opened", |e| e["kind"] == "breaker");
        assert_eq!(breaker["severity"], "critical", "{breaker}");
        assert!(
            breaker["reason"].as_str().unwrap().starts_with("3 of 5 nodes turned unhealthy"),
            "{breaker}"
        );
        // The alert went out: the critical breaker event, as the webhook sink sends it.
        let alerted = fleetmend_tests::poll_until_async(Duration::from_secs(10), || {
            received
                .lock()
                .unwrap()
                .iter()
                .any(|a| a["kind"] == "breaker" && a["id"] == breaker["id"])
        })
        .await;
        assert!(alerted, "no breaker alert reached the receiver: {:?}", received.lock().unwrap());
        // Every node that lost a GPU is held (breaker or the unavailable cap), none repaired.
        for node in &nodes[..3] {
            assert!(
                log.iter().any(|e| id(e) > start
                    && e["node"] == *node
                    && (e["kind"] == "action-held" || e["kind"] == "state-changed")),
                "{node} was not noticed:\n{}",
                story(&log)
            );
        }
        let repaired: Vec<&Value> = log
            .iter()
            .filter(|e| {
                id(e) > start
                    && (e["kind"] == "repair-finished"
                        || (e["kind"] == "workflow-step"
                            && ["step Repair", "step AwaitBoot", "step AwaitReplacement"]
                                .contains(&e["reason"].as_str().unwrap_or(""))))
            })
            .collect();
        assert!(repaired.is_empty(), "something was repaired in a storm:\n{}", story(&log));
        for (i, node) in nodes.iter().enumerate() {
            assert_eq!(supervisor.boot_id(node).unwrap(), boots[i], "{node} was rebooted");
            assert_eq!(supervisor.node(node).unwrap().pid, pids[i], "{node}'s agent was restarted");
        }
        assert!(
            !fleet
                .notes(0)
                .iter()
                .any(|n| n.what.contains("reboot") || n.what.contains("replaced")),
            "the supervisor rebooted or replaced a node: {:?}",
            fleet.notes(0)
        );
        eprintln!("{}", story(&log));
        fleet.shutdown().await;
    });
}

// --- a real network fault in network namespaces ---------------------------------------------------

#[test]
fn a_link_set_down_between_namespaces_fails_the_nic_check_and_drains_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let settings = "[engine]\ntick = \"100ms\"\nreport_interval = \"300ms\"\n";
    let fleet =
        NetnsFleet::start(dir.path(), "fmbr", &["ns-a", "ns-b"], settings, |_, _| String::new());
    let (api, hosts) = (fleet.api, &fleet.hosts);
    let healthy = poll_until(Duration::from_secs(30), || {
        let nodes = nodes_json(api);
        hosts.iter().all(|h| node_state(&nodes, &h.node).as_deref() == Some("healthy"))
    });
    assert!(healthy, "the namespaced nodes did not join healthy:\n{}", fleet.diagnostics());

    // The cable of ns-a is pulled at the switch: its NIC loses carrier inside its namespace.
    let pulled = Instant::now();
    ip(&["link", "set", &hosts[0].port, "down"]);
    let drained = poll_until(Duration::from_secs(30), || {
        node_state(&nodes_json(api), "ns-a").as_deref() == Some("drained")
    });
    assert!(drained, "ns-a was not drained:\n{}", fleet.diagnostics());
    eprintln!("link down → drained in {:.2} s", pulled.elapsed().as_secs_f64());
    let events = events_cli(api);
    let draining = events
        .iter()
        .find(|e| {
            e["kind"] == "state-changed" && e["node"] == "ns-a" && e["to_state"] == "draining"
        })
        .unwrap_or_else(|| panic!("no draining event:\n{}", story(&events)));
    let why = serde_json::to_string(&draining["findings"]).unwrap();
    assert!(
        why.contains("\"check\":\"nic\"") && why.contains(&hosts[0].nic),
        "ns-a was drained for something other than its NIC: {why}"
    );
    assert_eq!(
        node_state(&nodes_json(api), "ns-b").as_deref(),
        Some("healthy"),
        "{}",
        story(&events)
    );

    // The cable goes back: the finding clears and the node is put back to work.
    ip(&["link", "set", &hosts[0].port, "up"]);
    let back = poll_until(Duration::from_secs(30), || {
        node_state(&nodes_json(api), "ns-a").as_deref() == Some("healthy")
    });
    assert!(back, "ns-a did not come back after the link did:\n{}", fleet.diagnostics());

    fleet.stop();
}
