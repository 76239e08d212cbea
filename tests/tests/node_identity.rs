//! Per-node identity with the real binaries: `fleetmend token issue` writes each node's token and
//! the repairer's hashes file; an agent reporting with its own token is heard, an agent that
//! names itself after another node but holds the first node's token is refused (403), and the
//! node it claims to be never appears.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fleetmend_tests::{
    fixture, fixture_flags, fleetmend_bin, free_port, http_get, poll_until, run_with_timeout,
    start_agent,
};

const ADMIN: &str = "admin-secret";

/// `fleetmend nodes --output json` as the admin, by token file: each node's name and state.
fn nodes(repairer: SocketAddr, admin_file: &Path) -> Vec<(String, String)> {
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(["nodes", "--output", "json", "--token-file"])
            .arg(admin_file)
            .env("FLEETMEND_REPAIRER", format!("http://{repairer}")),
        Duration::from_secs(20),
    );
    let nodes: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    nodes
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .map(|n| {
                    let field = |k: &str| n[k].as_str().unwrap_or_default().to_owned();
                    (field("name"), field("state"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Starts an agent on the healthy fixture naming itself `node`, reporting with `token_file`.
fn agent(
    dir: &Path,
    repairer: SocketAddr,
    node: &str,
    token_file: &Path,
) -> fleetmend_tests::Running {
    let case = fixture("healthy");
    let config = dir.join(format!("agent-{node}.toml"));
    std::fs::write(
        &config,
        format!(
            "{}\n[report]\nrepairer = \"http://{repairer}\"\ntoken_file = \"{}\"\ninterval = \"200ms\"\n\
             backoff_initial = \"100ms\"\nbackoff_max = \"500ms\"\n\
             [commands]\nreboot = []\n",
            std::fs::read_to_string(case.join("agent.toml")).unwrap(),
            token_file.display()
        ),
    )
    .unwrap();
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", config.display()));
    flags.push(format!("--node={node}"));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    start_agent(dir, SocketAddr::from(([127, 0, 0, 1], free_port())), &args)
}

fn forbidden_reports(repairer: SocketAddr) -> f64 {
    let (_, body) = http_get(repairer, "/metrics").unwrap_or_default();
    body.lines()
        .find_map(|l| l.strip_prefix("fleetmend_reports_received_total{outcome=\"forbidden\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_node_reports_with_its_own_token_and_cannot_report_as_another() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let hashes = dir.path().join("node-tokens");
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(["token", "issue", "--dir"])
            .arg(&tokens)
            .arg("--hashes")
            .arg(&hashes)
            .args(["gpu-node-1", "gpu-node-2"]),
        Duration::from_secs(20),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("gpu-node-1\t") && stdout.contains("gpu-node-2\t"), "{stdout}");
    let own = tokens.join("gpu-node-1.token");
    let secret = std::fs::read_to_string(&own).unwrap();
    let kept = std::fs::read_to_string(&hashes).unwrap();
    assert!(kept.contains("\"gpu-node-2\" = \"") && !kept.contains(secret.trim()), "{kept}");

    let admin_file = dir.path().join("admin.token");
    std::fs::write(&admin_file, ADMIN).unwrap();
    let (repairer_addr, repairer) = fleetmend_tests::repairer_in(
        dir.path(),
        &format!("node_tokens_file = \"{}\"\nadmin_token = \"{ADMIN}\"\n", hashes.display()),
    );

    let _honest = agent(dir.path(), repairer_addr, "gpu-node-1", &own);
    let healthy = || nodes(repairer_addr, &admin_file) == [("gpu-node-1".into(), "healthy".into())];
    assert!(poll_until(Duration::from_secs(20), healthy), "{}", repairer.stderr());

    // An agent that calls itself gpu-node-2 with gpu-node-1's token: every report refused.
    let impostor = agent(dir.path(), repairer_addr, "gpu-node-2", &own);
    assert!(
        poll_until(Duration::from_secs(20), || forbidden_reports(repairer_addr) >= 3.0),
        "{}\n{}",
        repairer.stderr(),
        impostor.stderr()
    );
    assert!(
        impostor.stderr().contains("403"),
        "the agent says why it was refused:\n{}",
        impostor.stderr()
    );
    assert_eq!(
        nodes(repairer_addr, &admin_file),
        [("gpu-node-1".to_owned(), "healthy".to_owned())],
        "gpu-node-2 was never heard"
    );
}
