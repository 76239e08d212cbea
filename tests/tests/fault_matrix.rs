//! The fault matrix: every fault kind `fleetmend inject` knows, transient and `--persistent` (but
//! agent-kill, transient only), on a worker of a local fleet mid-job (the embedded queue, 4
//! working nodes and 3 hot spares). Each ends healed: the job completes with an uninterrupted run's weights hash, the node ends healthy,
//! retired (replaced) or quarantined with a reason, and the job never waits for nodes longer than
//! the queue's `wait_alert` (no `job-waiting` alert); before each reboot or replacement the node's
//! agent gathered its evidence (the kernel log with the fault's line, its findings).
//!
//! Up to four faults per fleet (local/scenarios/matrix-*.toml), each on a node of the job that no
//! earlier fault hit: each kind transient, then persistent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use fleetmend_local::faults::{FAULT_NAMES, Fault};
use fleetmend_local::scenario::{self, Scenario};
use fleetmend_local::up::{Fleet, FleetConfig};
use fleetmend_repairer::model::{EventKind, NodeState};
use fleetmend_repairer::workflow::KeptEvidence;
use fleetmend_tests::fleetmend_bin;

/// The longest a fault may keep the job waiting for nodes (the local fleet's `wait_alert`).
const WAIT_BOUND_S: f64 = 20.0;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// The matrix's scenario `name` (local/scenarios/matrix-NAME.toml).
fn scenario(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../local/scenarios")
        .join(format!("matrix-{name}.toml"));
    Scenario::load(path.to_str().unwrap()).unwrap()
}

fn run_matrix(name: &str) {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let scenario = scenario(name);
        let mut config = FleetConfig {
            boot_delay: Duration::from_millis(500),
            ..FleetConfig::new(dir.path().join("state"), fleetmend_bin())
        };
        scenario.configure(&mut config);
        let fleet = Fleet::start(config).await.unwrap();
        let mut progress = Vec::new();
        let run = scenario::run(&fleet, &scenario, &mut progress).await;
        let progress = String::from_utf8_lossy(&progress).into_owned();
        let summary = match run {
            Ok(summary) => summary,
            Err(err) => {
                fleet.shutdown().await;
                panic!("the scenario failed: {err}\n{progress}");
            }
        };
        let context = format!("{}\n{progress}", summary.render());
        let events = fleet.events(0, 100_000).unwrap();
        // Each faulted node's state now, and the repairer's last word on it: the change that put
        // it there, or the decision (an alert) that left it at work.
        let mut ends = Vec::new();
        for fault in &summary.faults {
            let node = fault.node.clone().unwrap_or_default();
            let state = fleet.engine().node(&node).map(|r| r.state);
            let reason = events
                .iter()
                .rev()
                .filter(|e| e.node.as_deref() == Some(&node))
                .find(|e| matches!(e.kind, EventKind::StateChanged | EventKind::Decision))
                .map(|e| e.reason.clone())
                .unwrap_or_default();
            ends.push((fault.number, node, state.map(|s| (s, reason))));
        }
        // The evidence each disruptive repair kept first, from the node's own agent.
        let mut evidence = Vec::new();
        for fault in &summary.faults {
            let node = fault.node.clone().unwrap_or_default();
            let kept: Vec<KeptEvidence> = fleet.engine().store().evidence_of(&node, 10).unwrap();
            evidence.push((fault.number, fault.fault, fault.actions.clone(), node, kept));
        }
        let waiting: Vec<String> = events
            .into_iter()
            .filter(|e| e.kind == EventKind::JobWaiting)
            .map(|e| e.reason)
            .collect();
        fleet.shutdown().await;

        assert!(summary.passed, "{context}");
        assert_eq!(summary.faults.len(), scenario.faults.len(), "{context}");
        assert_eq!(summary.hash_matches, Some(true), "{context}");
        for fault in &summary.faults {
            assert!(fault.not_injected.is_none(), "fault {}:\n{context}", fault.number);
            let waited = fault.waiting_for_nodes_s.unwrap_or(0.0);
            assert!(waited <= WAIT_BOUND_S, "fault {} waited {waited} s:\n{context}", fault.number);
        }
        for (number, node, end) in ends {
            let Some((state, reason)) = end else {
                panic!("fault {number}: {node} has no record:\n{context}");
            };
            assert!(
                matches!(state, NodeState::Healthy | NodeState::Retired | NodeState::Quarantined),
                "fault {number}: {node} ended {state} ({reason}):\n{context}"
            );
            assert!(!reason.is_empty(), "fault {number}: {node} ended {state} without a reason");
        }
        assert!(waiting.is_empty(), "the job waited for nodes: {waiting:?}\n{context}");
        for (number, fault, actions, node, kept) in evidence {
            let disruptive = actions.iter().any(|a| a == "reboot" || a == "replace");
            // A killed agent cannot answer: its repair goes on without evidence.
            if !disruptive || fault == Fault::AgentKill {
                continue;
            }
            let first = kept.last().unwrap_or_else(|| {
                panic!("fault {number}: no evidence kept for {node} before {actions:?}:\n{context}")
            });
            let names: Vec<&str> = first.bundle.items.iter().map(|i| i.name.as_str()).collect();
            assert_eq!(names, ["kernel-log", "findings"], "fault {number} on {node}");
            if let Fault::GpuXid(code) = fault {
                let log = &first.bundle.items[0].content;
                assert!(
                    log.contains("Xid") && log.contains(&code.to_string()),
                    "fault {number}: {log}"
                );
            }
        }
        eprintln!("{}", summary.render());
    });
}

/// Every kind `fleetmend inject` knows is in one of the matrix's scenarios, transient and
/// persistent.
#[test]
fn the_matrix_covers_every_fault_kind_both_ways() {
    let mut covered = Vec::new();
    for name in MATRIX {
        for fault in scenario(name).faults {
            covered.push((fault.fault.to_string(), fault.persistent));
        }
    }
    for name in FAULT_NAMES {
        let kind = name.split(':').next().unwrap_or(name);
        for persistent in [false, true] {
            // A reboot starts a killed agent again: inject refuses a persistent agent-kill.
            if persistent && kind == "agent-kill" {
                continue;
            }
            // A job fault breaks the job, not the node (which stays healthy):
            // tests/tests/job_health.rs.
            let concrete = name.replace("PERCENT", "50");
            if concrete.parse::<Fault>().is_ok_and(|f| f.is_job_fault()) {
                continue;
            }
            assert!(
                covered.iter().any(|(c, p)| c.split(':').next() == Some(kind) && *p == persistent),
                "{name} (persistent: {persistent}) is not in the fault matrix: {covered:?}"
            );
        }
    }
}

const MATRIX: [&str; 10] = [
    "xids",
    "gpu",
    "links",
    "fabric",
    "pcie",
    "throttle",
    "switches",
    "detections",
    "disks",
    "host",
];

#[test]
fn xid_79_and_xid_48_end_healed() {
    run_matrix("xids");
}

#[test]
fn gpu_missing_and_row_remap_failure_end_healed() {
    run_matrix("gpu");
}

#[test]
fn nvlink_down_and_nic_down_end_healed() {
    run_matrix("links");
}

#[test]
fn disk_full_and_disk_readonly_end_healed() {
    run_matrix("disks");
}

#[test]
fn ib_port_down_and_pcie_downtrained_end_healed() {
    run_matrix("fabric");
}

#[test]
fn a_sustained_gpu_throttle_and_a_gsp_timeout_end_healed() {
    run_matrix("throttle");
}

#[test]
fn a_nic_pcie_link_at_gen3_ends_healed() {
    run_matrix("pcie");
}

#[test]
fn gpu_lost_and_xid_burst_end_healed() {
    run_matrix("detections");
}

#[test]
fn nvswitch_fatal_and_mlx5_health_end_healed() {
    run_matrix("switches");
}

#[test]
fn kernel_mce_and_agent_kill_end_healed() {
    run_matrix("host");
}
