//! The client verbs against a real repairer with a real agent: nodes, node, events, drain,
//! undrain, repair, breaker; tables for people and `--output json` for scripts; auth errors clear.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use fleetmend_tests::{
    fixture, fixture_flags, fleetmend_bin, free_port, poll_until, run_with_timeout, start_agent,
};

const ADMIN: &str = "admin-secret";
const AGENT: &str = "agent-secret";

fn cli(repairer: SocketAddr, token: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(args)
            .env("FLEETMEND_REPAIRER", format!("http://{repairer}"))
            .env("FLEETMEND_TOKEN", token)
            .env("USER", "alice"),
        Duration::from_secs(20),
    );
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn node_state(repairer: SocketAddr, name: &str) -> String {
    let (_, out, _) = cli(repairer, ADMIN, &["nodes", "--output", "json"]);
    let nodes: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    nodes
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["name"] == name))
        .and_then(|n| n["state"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn client_verbs_drive_a_real_repairer() {
    let dir = tempfile::tempdir().unwrap();
    let (repairer_addr, repairer) = fleetmend_tests::repairer_in(
        dir.path(),
        &format!(
            "agent_token = \"{AGENT}\"\nadmin_token = \"{ADMIN}\"\n[engine]\ntick = \"100ms\"\n\
             [engine.workflow]\ncheckpoint_grace = \"0s\"\n"
        ),
    );
    let case = fixture("healthy");
    let agent_config = dir.path().join("agent.toml");
    std::fs::write(
        &agent_config,
        format!(
            "{}\n[report]\nrepairer = \"http://{repairer_addr}\"\ntoken = \"{AGENT}\"\ninterval = \"200ms\"\n\
             # A reboot asked of this agent is refused: it runs on the test machine.\n\
             [commands]\nreboot = []\n[commands.evidence]\ndir = \"{}\"\n",
            std::fs::read_to_string(case.join("agent.toml")).unwrap(),
            dir.path().join("evidence").display()
        ),
    )
    .unwrap();
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", agent_config.display()));
    flags.push("--node=gpu-node-1".to_owned());
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _agent = start_agent(dir.path(), SocketAddr::from(([127, 0, 0, 1], free_port())), &args);

    assert!(
        poll_until(Duration::from_secs(10), || node_state(repairer_addr, "gpu-node-1")
            == "healthy"),
        "{}",
        repairer.stderr()
    );
    let (code, table, _) = cli(repairer_addr, ADMIN, &["nodes"]);
    assert_eq!(code, Some(0));
    assert!(table.starts_with("NODE"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("gpu-node-1") && l.contains("healthy")), "{table}");

    // A wrong token is a clear error and a non-zero exit.
    let (code, _, err) = cli(repairer_addr, "wrong", &["nodes"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("401") && err.contains("wrong bearer token"), "{err}");

    // A person drains the node: recorded with the person as the actor; the node ends drained.
    let (code, out, err) = cli(repairer_addr, ADMIN, &["drain", "gpu-node-1"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("\"workflow\""), "{out}");
    assert!(
        poll_until(Duration::from_secs(10), || node_state(repairer_addr, "gpu-node-1")
            == "drained"),
        "{}",
        repairer.stderr()
    );
    // A person's drain is theirs: the repairer does not release it although the node is healthy.
    // (A bounded look at a condition that must not change; the tick runs every 100 ms.)
    let released = poll_until(Duration::from_millis(1500), || {
        node_state(repairer_addr, "gpu-node-1") != "drained"
    });
    assert!(!released, "the repairer undrained a node a person drained:\n{}", repairer.stderr());
    let (_, events, _) =
        cli(repairer_addr, ADMIN, &["events", "--node", "gpu-node-1", "--output", "json"]);
    let events: Vec<serde_json::Value> = serde_json::from_str(&events).unwrap();
    assert!(
        events.iter().any(|e| e["kind"] == "decision" && e["actor"] == "person:alice"),
        "{events:#?}"
    );

    let (code, out, err) = cli(repairer_addr, ADMIN, &["undrain", "gpu-node-1"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("Undrained"), "{out}");
    assert_eq!(node_state(repairer_addr, "gpu-node-1"), "healthy");

    let (code, table, _) = cli(repairer_addr, ADMIN, &["events", "--node", "gpu-node-1"]);
    assert_eq!(code, Some(0));
    assert!(table.contains("healthy → draining") && table.contains("drained → healthy"), "{table}");

    let (code, out, _) = cli(repairer_addr, ADMIN, &["breaker", "--output", "json"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"open\": false"), "{out}");
    let (code, out, _) = cli(repairer_addr, ADMIN, &["node", "gpu-node-1"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"workflows\""), "{out}");
    let (code, _, err) =
        cli(repairer_addr, ADMIN, &["repair", "no-such-node", "--action", "reboot"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404") && err.contains("no-such-node"), "{err}");

    // Before a reboot the repairer keeps the node's evidence; `node --evidence` shows it.
    let (code, _, _) = cli(repairer_addr, ADMIN, &["node", "gpu-node-1", "--evidence"]);
    assert_eq!(code, Some(0));
    let (code, out, err) =
        cli(repairer_addr, ADMIN, &["repair", "gpu-node-1", "--action", "reboot"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let shown = || cli(repairer_addr, ADMIN, &["node", "gpu-node-1", "--evidence"]).1;
    assert!(
        poll_until(Duration::from_secs(20), || shown().contains("## kernel-log")),
        "{}\n{}",
        shown(),
        repairer.stderr()
    );
    let text = shown();
    assert!(text.starts_with("# workflow ") && text.contains("(reboot) on gpu-node-1"), "{text}");
    assert!(text.contains("## findings") && text.contains("\"verdict\""), "{text}");
    let (_, json, _) =
        cli(repairer_addr, ADMIN, &["node", "gpu-node-1", "--evidence", "--output", "json"]);
    let kept: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(kept.len(), 1, "{json}");
    assert_eq!(kept[0]["action"], "reboot");
    assert_eq!(kept[0]["bundle"]["node"], "gpu-node-1");
    assert_eq!(kept[0]["bundle"]["items"][0]["source"], case.join("kmsg").display().to_string());
    let (_, events, _) =
        cli(repairer_addr, ADMIN, &["events", "--node", "gpu-node-1", "--output", "json"]);
    let events: Vec<serde_json::Value> = serde_json::from_str(&events).unwrap();
    assert!(
        events.iter().any(|e| e["kind"] == "evidence"
            && e["reason"].as_str().unwrap().starts_with("evidence kept")),
        "{events:#?}"
    );
    let (code, _, err) = cli(repairer_addr, ADMIN, &["node", "no-such-node", "--evidence"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404"), "{err}");

    // The token from a file, off the command line; a missing file is a clear error.
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{ADMIN}\n")).unwrap();
    let with_file = |file: &std::path::Path| {
        run_with_timeout(
            Command::new(fleetmend_bin())
                .args(["nodes", "--token-file"])
                .arg(file)
                .env("FLEETMEND_REPAIRER", format!("http://{repairer_addr}"))
                .env_remove("FLEETMEND_TOKEN"),
            Duration::from_secs(20),
        )
    };
    let output = with_file(&token_file);
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(table.lines().any(|l| l.starts_with("gpu-node-1")), "{table}");
    let output = with_file(&dir.path().join("no-such.token"));
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("reading the token file") && err.contains("no-such.token"), "{err}");

    // The repairer's log went to a file: plain text, no terminal colour codes.
    let log = repairer.stderr();
    assert!(log.contains("repairer started"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file:\n{log:?}");
}
