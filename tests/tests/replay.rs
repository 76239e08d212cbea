//! Replay fidelity: a `fleetmend up` fleet (4 working nodes, 3 hot spares, a small model at a
//! GPU's pace) through four faults (a persistent Xid 79, a transient Xid 48, a transient NIC link
//! down, a machine check); its failure history exported through the real API
//! (`fleetmend export-faults`, `GET /v1/history/faults`) and replayed by
//! `fleetmend simulate --replay` with the fleet's own repairer config (its policy, engine and
//! queue, through `--repairer-config`) on its own nodes (`--inventory`): the simulated repairer
//! comes to the same decisions, node by node, as the fleet's did.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fleetmend_local::scenario::{self, Scenario, Summary};
use fleetmend_local::up::{Fleet, FleetConfig, repairer_config};
use fleetmend_repairer::history::{DecisionKind, FaultHistory};
use fleetmend_repairer::model::RuleAction;
use fleetmend_tests::fleetmend_bin;
use serde_json::Value;

/// Four faults 80 steps (10 s at the pace) apart on nodes of the job no earlier fault hit: at most
/// two nodes are out at once, so the breaker (3 of the 7 nodes) stays shut. No reference run: the
/// weights are not what this test is about.
const SCENARIO: &str = r#"
name = "replay"
description = "four faults whose history is replayed in the simulator"
timeout = "6m"
settle_timeout = "90s"
compare_hash = false

[fleet]
nodes = 4
spares = 3
steps = 360
checkpoint_every = "10"
model = "small"
pace = "125ms"

[[faults]]
at_step = 20
node = "rank:1"
fault = "gpu-xid:79"
persistent = true

[[faults]]
at_step = 100
node = "any-healthy"
fault = "gpu-xid:48"
persistent = false

[[faults]]
at_step = 180
node = "any-healthy"
fault = "nic-down"
persistent = false

[[faults]]
at_step = 260
node = "any-healthy"
fault = "kernel-mce"
persistent = false
"#;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// `fleetmend ARGS`: its stdout, or a failure with its stderr.
fn fleetmend(args: &[&str]) -> String {
    let output = Command::new(fleetmend_bin()).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "fleetmend {args:?}: {}\n{stderr}", output.status);
    String::from_utf8(output.stdout).unwrap()
}

/// The fleet's repairer settings as a repairer config file: its `[policy]`, `[engine]` and
/// `[queue]`, on a loopback address (a config the repairer itself would take).
fn repairer_config_file(fleet: &Fleet, dir: &Path) -> std::path::PathBuf {
    let state = fleet.state_dir();
    let config = repairer_config(
        fleet.config(),
        state,
        fleet.admin_token_file(),
        &state.join("agent-token"),
        None,
    );
    let mut table = toml::Table::new();
    table.insert("listen".into(), "127.0.0.1:9830".into());
    table.insert("policy".into(), toml::Value::try_from(&config.policy).unwrap());
    table.insert("engine".into(), toml::Value::try_from(&config.engine).unwrap());
    table.insert("queue".into(), toml::Value::try_from(&config.queue).unwrap());
    let path = dir.join("repairer.toml");
    std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
    path
}

/// A decision as `fleetmend simulate --json` writes it: `kind action`.
fn decisions(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|d| format!("{} {}", d["kind"].as_str().unwrap(), d["action"].as_str().unwrap()))
        .collect()
}

/// `fleetmend export-faults` of the last hour against the fleet's repairer, as an operator runs it.
async fn export_history(fleet: &Fleet) -> String {
    let token_file = fleet.admin_token_file().to_str().unwrap().to_owned();
    let url = fleet.repairer_url().to_owned();
    tokio::task::spawn_blocking(move || {
        fleetmend(&[
            "export-faults",
            "--repairer",
            &url,
            "--token-file",
            &token_file,
            "--since",
            "1h",
        ])
    })
    .await
    .unwrap()
}

/// `fleetmend simulate --replay` of `exported` through `repairer` on the fleet's seven nodes: its
/// JSON report.
fn replay_history(dir: &Path, repairer: &Path, exported: &str) -> Value {
    let faults = dir.join("faults.json");
    std::fs::write(&faults, exported).unwrap();
    let inventory = dir.join("nodes.txt");
    std::fs::write(&inventory, "node-[1-7]\n").unwrap();
    let args = [
        "simulate",
        "--repairer-config",
        repairer.to_str().unwrap(),
        "--inventory",
        inventory.to_str().unwrap(),
        "--replay",
        faults.to_str().unwrap(),
        "--spares",
        "3",
        // The simulated job at the fleet's own pace (125 ms steps, a checkpoint every 10 steps,
        // restarts in seconds), not a 405B model's.
        "--set",
        "job.step_time=125ms",
        "--set",
        "job.checkpoint_every=1250ms",
        "--set",
        "job.checkpoint_write=1s",
        "--set",
        "job.restart=2s",
        "--set",
        "job.progress_every=10s",
        "--json",
    ];
    serde_json::from_str(&fleetmend(&args)).unwrap()
}

/// Each fault of the scenario is in the export with the repairs the fleet made (a drain, a
/// reboot, a replacement; an alert is none).
fn assert_exported(summary: &Summary, history: &FaultHistory, context: &str) {
    for fault in &summary.faults {
        let node = fault.node.clone().unwrap();
        let recorded: Vec<&str> = history
            .faults
            .iter()
            .filter(|f| f.node == node)
            .flat_map(|f| &f.decisions)
            .filter(|d| matches!(d.kind, DecisionKind::Act | DecisionKind::Escalation))
            .map(|d| d.action.as_str())
            .collect();
        assert_eq!(recorded, fault.actions, "fault {} on {node}:\n{context}", fault.number);
    }
    let victim = summary.faults[0].node.clone().unwrap();
    let first = history.faults.iter().find(|f| f.node == victim).unwrap();
    assert_eq!(first.reboot_cleared(), Some(false), "{context}");
    assert!(first.took_ms(RuleAction::Reboot).is_some(), "{context}");
}

#[test]
fn a_fleets_history_replayed_with_its_policy_decides_the_same_on_every_node() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let scenario = Scenario::parse(SCENARIO, Path::new("replay")).unwrap();
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
        let exported = export_history(&fleet).await;
        let repairer = repairer_config_file(&fleet, dir.path());
        fleet.shutdown().await;
        let context = format!("export:\n{exported}\n{}\n{progress}", summary.render());
        assert!(summary.passed, "{context}");
        let history = FaultHistory::parse(&exported)
            .unwrap_or_else(|err| panic!("the export does not read back: {err}\n{context}"));
        assert_exported(&summary, &history, &context);

        // The fleet is down: nothing else runs while the simulation does.
        let report = replay_history(dir.path(), &repairer, &exported);
        let replay = &report["replay"];
        let story =
            format!("replay:\n{}\n{context}", serde_json::to_string_pretty(replay).unwrap());
        assert_eq!(report["setting"]["nodes"], 7, "{story}");
        // Every recorded fault is struck, but for one first seen together with another on its
        // node (the link down's kernel-log warning beside the NIC's failure): a simulated node
        // carries one fault at a time.
        let left_out = replay["left_out"].as_array().unwrap();
        for left in left_out {
            let why = left["why"].as_str().unwrap();
            assert!(why.ends_with("a simulated node carries one fault at a time"), "{story}");
        }
        assert!(left_out.len() <= 1, "{story}");
        let recorded = history.faults.len();
        assert_eq!(replay["recorded_faults"].as_u64(), Some(recorded as u64), "{story}");
        assert_eq!(replay["struck_faults"].as_u64(), Some((recorded - left_out.len()) as u64));
        let nodes = replay["nodes"].as_array().unwrap();
        assert!(nodes.len() >= 4, "a node per fault at least: {story}");
        for node in nodes {
            let (replayed, recorded) = (decisions(&node["replayed"]), decisions(&node["recorded"]));
            assert_eq!(replayed, recorded, "{}: {story}", node["node"]);
        }
        assert_eq!(replay["same_nodes"].as_u64(), Some(nodes.len() as u64), "{story}");
        let of = |fault: usize| {
            let name = summary.faults[fault].node.clone().unwrap();
            let node = nodes.iter().find(|n| n["node"] == name.as_str());
            decisions(&node.unwrap_or_else(|| panic!("{name}: {story}"))["replayed"])
        };
        assert_eq!(of(0), ["act reboot", "escalation replace"], "{story}");
        assert_eq!(of(1), ["act reboot"], "{story}");
        assert_eq!(of(2), ["act drain", "act reboot"], "{story}");
        assert_eq!(of(3), ["alert alert"], "{story}");
    });
}
