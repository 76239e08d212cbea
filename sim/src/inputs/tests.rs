#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fleetmend_repairer::policy::Mode;

use super::*;

/// A scratch directory with files in it, removed when dropped.
struct Files(tempfile::TempDir);

impl Files {
    fn new() -> Files {
        Files(tempfile::tempdir().unwrap())
    }

    fn put(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

const REPAIRER: &str = r#"
listen = "127.0.0.1:9830"

[policy]
mode = "dry-run"

[policy.guard_rails]
cooldown = "2m"

[engine]
report_interval = "5s"

[engine.workflow]
reboot_timeout = "7m"
replace_timeout = "1h"

[queue]
hang_floor = "10m"
wait_alert = "42s"
"#;

#[test]
fn a_repairer_config_gives_policy_engine_and_queue_under_the_settings_and_flags() {
    let files = Files::new();
    let repairer = files.put("repairer.toml", REPAIRER);
    let inputs = OwnInputs { repairer_config: Some(&repairer), ..OwnInputs::default() };
    let settings = load(None, inputs, &[]).unwrap();
    let r = &settings.repairer;
    assert_eq!(r.policy.mode, Mode::DryRun);
    assert_eq!(r.policy.guard_rails.cooldown, Duration::from_secs(120));
    assert_eq!(r.engine.report_interval, Duration::from_secs(5));
    assert_eq!(r.engine.workflow.reboot_timeout, Duration::from_secs(7 * 60));
    assert_eq!(r.queue.wait_alert, Duration::from_secs(42));
    // The simulator's world-bound choices are kept: a part takes days, the job posts no hang.
    assert_eq!(r.engine.workflow.replace_timeout, Duration::from_secs(3 * 86_400));
    assert_eq!(r.queue.hang_floor, Duration::ZERO);

    // The settings file's [repairer.*] goes over the repairer config key by key, --set over both.
    let sim = files.put("sim.toml", "[repairer.policy]\nmode = \"approve\"\n");
    let overrides = pairs(&[("repairer.engine.report_interval", "7s")]);
    let settings = load(Some(&sim), inputs, &overrides).unwrap();
    let r = &settings.repairer;
    assert_eq!(r.policy.mode, Mode::Approve);
    assert_eq!(r.policy.guard_rails.cooldown, Duration::from_secs(120), "kept from the file");
    assert_eq!(r.engine.report_interval, Duration::from_secs(7));
    assert_eq!(r.queue.wait_alert, Duration::from_secs(42));
}

#[test]
fn a_bad_repairer_config_is_refused_with_every_problem() {
    let files = Files::new();
    let bad = files.put(
        "bad.toml",
        "listen = \"127.0.0.1:9830\"\n[engine]\ntick = \"0s\"\n[policy.guard_rails]\nmax_concurrent_repairs = 0\n",
    );
    let inputs = OwnInputs { repairer_config: Some(&bad), ..OwnInputs::default() };
    let err = load(None, inputs, &[]).unwrap_err().to_string();
    assert!(err.starts_with("--repairer-config: config"), "{err}");
    assert!(err.contains("2 problem(s)"), "{err}");
    assert!(err.contains("engine.tick"), "{err}");
    assert!(err.contains("policy.guard_rails.max_concurrent_repairs"), "{err}");

    let unknown = files.put("unknown.toml", "[policy]\ncolour = \"blue\"\n");
    let inputs = OwnInputs { repairer_config: Some(&unknown), ..OwnInputs::default() };
    let err = load(None, inputs, &[]).unwrap_err().to_string();
    assert!(err.contains("unknown field `colour`"), "{err}");

    let missing = files.0.path().join("missing.toml");
    let inputs = OwnInputs { repairer_config: Some(&missing), ..OwnInputs::default() };
    let err = load(None, inputs, &[]).unwrap_err().to_string();
    assert!(err.contains("reading config") && err.contains("missing.toml"), "{err}");
}

#[test]
fn an_inventory_sizes_the_fleet_with_the_repairers_parser() {
    let files = Files::new();
    let inventory = files.put("nodes.txt", "# the racks\nnode-[1-6]\ngpu-a  # one more\n\n");
    let inputs = OwnInputs { inventory: Some(&inventory), ..OwnInputs::default() };
    let settings = load(None, inputs, &pairs(&[("fleet.spares", "2")])).unwrap();
    assert_eq!(settings.fleet.nodes, 7);

    let bad = files.put("bad.txt", "node-1\nnode-[3-1]\n");
    let inputs = OwnInputs { inventory: Some(&bad), ..OwnInputs::default() };
    let err = load(None, inputs, &[]).unwrap_err().to_string();
    assert!(err.starts_with("--inventory: ") && err.contains("line 2"), "{err}");

    let empty = files.put("empty.txt", "# nobody\n");
    let inputs = OwnInputs { inventory: Some(&empty), ..OwnInputs::default() };
    let err = load(None, inputs, &[]).unwrap_err().to_string();
    assert!(err.ends_with("names no node"), "{err}");
}

const T: u64 = 1_767_225_600_000;

/// A history of Xid 79 on `nodes`, a minute apart.
fn history(nodes: &[&str]) -> String {
    let faults: Vec<serde_json::Value> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let at = T + i as u64 * 60_000;
            serde_json::json!({
                "at_ms": at,
                "node": node,
                "finding": {
                    "check": "gpu", "finding": "xid", "subject": "3", "status": "fail",
                    "action": "reboot", "message": "Xid 79", "labels": { "xid": "79" },
                },
                "decisions": [{ "at_ms": at, "kind": "act", "action": "reboot", "by": "rule:r" }],
            })
        })
        .collect();
    serde_json::json!({
        "version": 1, "since_ms": T, "until_ms": T + 3_600_000, "faults": faults,
    })
    .to_string()
}

#[test]
fn a_replay_grows_the_fleet_to_its_nodes_and_lasts_its_window() {
    let files = Files::new();
    let path = files.put("faults.json", &history(&["b-2", "b-10", "b-3"]));
    let inputs = OwnInputs { replay: Some(&path), ..OwnInputs::default() };
    let overrides = pairs(&[("fleet.nodes", "2"), ("fleet.spares", "1")]);
    let settings = load(None, inputs, &overrides).unwrap();
    assert_eq!(settings.fleet.nodes, 3);
    let replay = settings.replay.as_deref().unwrap();
    assert_eq!(replay.grown_from, Some(2));
    assert_eq!(replay.names, ["b-2", "b-3", "b-10"]);
    assert_eq!(settings.fleet.duration, replay.duration());
    assert_eq!(
        settings.fleet.duration,
        crate::replay::LEAD + Duration::from_secs(3_600) + crate::replay::SETTLE
    );
    // A duration set in the flags (or the file) stands.
    let overrides = pairs(&[("fleet.nodes", "8"), ("fleet.spares", "1"), ("fleet.duration", "3h")]);
    let settings = load(None, inputs, &overrides).unwrap();
    assert_eq!(settings.fleet.duration, Duration::from_secs(3 * 3_600));
    assert_eq!(settings.fleet.nodes, 8);
    assert_eq!(settings.replay.as_deref().unwrap().grown_from, None);
}

#[test]
fn a_replay_is_refused_with_scripted_faults_or_a_bad_history() {
    let files = Files::new();
    let path = files.put("faults.json", &history(&["n1"]));
    let sim = files.put(
        "sim.toml",
        "[fleet]\nnodes = 4\nspares = 1\n[[event]]\nat = \"1h\"\nnodes = 1\ncategory = \"faulty-gpu\"\n",
    );
    let inputs = OwnInputs { replay: Some(&path), ..OwnInputs::default() };
    let err = load(Some(&sim), inputs, &[]).unwrap_err();
    assert!(matches!(err, InputError::ReplayWithEvents), "{err}");

    let mut value: serde_json::Value = serde_json::from_str(&history(&["n1", "n2"])).unwrap();
    value["faults"][1]["decisions"] = serde_json::json!([]);
    let bad = files.put("bad.json", &value.to_string());
    let inputs = OwnInputs { replay: Some(&bad), ..OwnInputs::default() };
    let err = load(None, inputs, &pairs(&[("fleet.nodes", "4"), ("fleet.spares", "1")]));
    let err = err.unwrap_err().to_string();
    assert!(err.starts_with("--replay: ") && err.contains("bad.json"), "{err}");
    assert!(err.contains("faults[1].decisions: must hold at least one decision"), "{err}");

    let inventory = files.put("nodes.txt", "n[2-3]\n");
    let inputs =
        OwnInputs { replay: Some(&path), inventory: Some(&inventory), ..OwnInputs::default() };
    let err = load(None, inputs, &pairs(&[("fleet.spares", "1")])).unwrap_err().to_string();
    assert!(err.contains("faults[0].node: n1 is not in the inventory"), "{err}");
}
