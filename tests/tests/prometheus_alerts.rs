//! The whole alert path with real servers: a real agent's GPU fault (row remap failure, swapped
//! into its fixture GPU file) → the shipped rules fire in a real Prometheus → the shipped
//! alertmanager.yml routes it to the repairer's inbound webhook → the repairer records it as a
//! finding of that node; the fault gone → the alert resolves → the finding clears.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleetmend_tests::{
    Running, fixture, fixture_flags, free_port, http_get, poll_until, start_agent, workspace_root,
};
use serde_json::Value;

/// Scrape, evaluation, discovery and notification every second; still a few hops: generous.
const ALERT_DEADLINE: Duration = Duration::from_secs(90);

/// `text` with each `from` replaced, asserting each is there (the shipped file changed otherwise).
fn substitute(mut text: String, replacements: &[(&str, String)]) -> String {
    for (from, to) in replacements {
        assert!(text.contains(from), "the shipped config no longer has {from:?}: update this test");
        text = text.replace(from, to);
    }
    text
}

fn spawn(program: &str, args: &[String], stderr_path: PathBuf) -> Running {
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|err| panic!("{program} (installed by scripts/test): {err}"));
    Running { child, stderr_path }
}

/// The node's findings from the repairer as (source, finding).
fn findings(repairer: SocketAddr, node: &str) -> Vec<(String, String)> {
    let Some((200, body)) = http_get(repairer, &format!("/v1/nodes/{node}")) else {
        return Vec::new();
    };
    let detail: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    detail["node"]["findings"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t["source"].as_str().unwrap_or("").to_owned(),
                t["finding"]["finding"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn from_alertmanager(findings: &[(String, String)]) -> Vec<String> {
    findings.iter().filter(|(s, _)| s == "alertmanager").map(|(_, f)| f.clone()).collect()
}

#[test]
fn a_gpu_fault_alert_reaches_the_repairer_as_a_finding_and_clears() {
    let dir = tempfile::tempdir().unwrap();
    let root = workspace_root();
    // Dry run: the repairer records its decisions but leaves the node alone, so the node (and
    // its target) stay put while the alert comes and goes.
    let (repairer_addr, repairer) =
        fleetmend_tests::repairer_in(dir.path(), "[policy]\nmode = \"dry-run\"\n");

    // One agent on the healthy fixture, its GPU file a copy this test swaps; GPU checked often.
    let case = fixture("healthy");
    let gpu_json = dir.path().join("gpu.json");
    std::fs::copy(case.join("gpu.json"), &gpu_json).unwrap();
    let fixture_config = std::fs::read_to_string(case.join("agent.toml")).unwrap();
    let config = dir.path().join("agent.toml");
    let agent_config = substitute(
        fixture_config,
        &[(
            "[checks.gpu]\n",
            "[checks.gpu]\ninterval = \"500ms\"\ntimeout = \"400ms\"\n".to_owned(),
        )],
    );
    std::fs::write(
        &config,
        format!(
            "{agent_config}\n[jobs]\nadvertise_address = \"127.0.0.1\"\ndir = \"{}\"\n",
            dir.path().join("jobs").display()
        ),
    )
    .unwrap();
    let mut flags: Vec<String> =
        fixture_flags(&case).into_iter().filter(|f| !f.starts_with("--gpu=")).collect();
    flags.push(format!("--gpu=fixture:{}", gpu_json.display()));
    flags.push(format!("--config={}", config.display()));
    flags.push(format!("--repairer=http://{repairer_addr}"));
    flags.push("--node=am-a".to_owned());
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _agent = start_agent(dir.path(), SocketAddr::from(([127, 0, 0, 1], free_port())), &args);

    // Alertmanager with the shipped config, pointed at the repairer, flushing at once.
    let am_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let token = dir.path().join("alerts.token");
    std::fs::write(&token, "unused-on-loopback").unwrap();
    let shipped =
        std::fs::read_to_string(root.join("deploy/alertmanager/alertmanager.yml")).unwrap();
    let am_config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &am_config,
        substitute(
            shipped,
            &[
                ("http://repairer.example:9830", format!("http://{repairer_addr}")),
                ("/etc/alertmanager/fleetmend-alerts.token", token.display().to_string()),
                ("group_wait: 30s", "group_wait: 0s".to_owned()),
                ("group_interval: 5m", "group_interval: 1s".to_owned()),
                ("group_interval: 1m", "group_interval: 1s".to_owned()),
                // The example receiver: a closed port, not a name to resolve.
                ("alerts-relay.example:8080", format!("127.0.0.1:{}", free_port())),
            ],
        ),
    )
    .unwrap();
    let alertmanager = spawn(
        "prometheus-alertmanager",
        &[
            format!("--config.file={}", am_config.display()),
            format!("--storage.path={}", dir.path().join("am").display()),
            format!("--web.listen-address={am_addr}"),
            "--cluster.listen-address=".to_owned(),
        ],
        dir.path().join("alertmanager.stderr"),
    );

    // Prometheus with the shipped config and rules, every second.
    let prom_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let shipped = std::fs::read_to_string(root.join("deploy/prometheus/prometheus.yml")).unwrap();
    let prom_config = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_config,
        substitute(
            shipped,
            &[
                ("repairer.example:9830", repairer_addr.to_string()),
                ("/etc/prometheus/fleetmend-admin.token", token.display().to_string()),
                (
                    "rules/fleetmend.rules.yml",
                    root.join("deploy/prometheus/rules/fleetmend.rules.yml").display().to_string(),
                ),
                ("127.0.0.1:9093", am_addr.to_string()),
                ("scrape_interval: 15s", "scrape_interval: 1s".to_owned()),
                ("evaluation_interval: 15s", "evaluation_interval: 1s".to_owned()),
                ("refresh_interval: 30s", "refresh_interval: 1s".to_owned()),
            ],
        ),
    )
    .unwrap();
    let prometheus = spawn(
        "prometheus",
        &[
            format!("--config.file={}", prom_config.display()),
            format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
            format!("--web.listen-address={prom_addr}"),
        ],
        dir.path().join("prometheus.stderr"),
    );
    let logs = || {
        format!(
            "repairer:\n{}\nprometheus:\n{}\nalertmanager:\n{}",
            repairer.stderr(),
            prometheus.stderr(),
            alertmanager.stderr()
        )
    };

    // The agent scraped first: a fault before that would be one Prometheus never saw start.
    let scraped = poll_until(ALERT_DEADLINE, || {
        http_get(
            prom_addr,
            "/api/v1/query?query=fleetmend_gpu_remapped_rows_failure%7Bgpu%3D%220%22%7D",
        )
        .is_some_and(|(s, b)| s == 200 && b.contains("\"am-a\""))
    });
    assert!(scraped, "Prometheus never scraped the agent\n{}", logs());
    assert!(from_alertmanager(&findings(repairer_addr, "am-a")).is_empty());

    // The fault: a GPU out of spare rows.
    let faulty =
        std::fs::read_to_string(fixture("gpu_row_remap_failure").join("gpu.json")).unwrap();
    std::fs::write(&gpu_json, faulty).unwrap();
    let mut seen = Vec::new();
    let recorded = poll_until(ALERT_DEADLINE, || {
        seen = findings(repairer_addr, "am-a");
        from_alertmanager(&seen).iter().any(|f| f == "gpu_row_remap_failure")
    });
    assert!(recorded, "no alertmanager finding on am-a: {seen:?}\n{}", logs());

    // Fixed: the alert resolves and the repairer clears the finding.
    std::fs::copy(case.join("gpu.json"), &gpu_json).unwrap();
    let cleared = poll_until(ALERT_DEADLINE, || {
        seen = findings(repairer_addr, "am-a");
        from_alertmanager(&seen).is_empty()
    });
    assert!(cleared, "the alertmanager finding did not clear: {seen:?}\n{}", logs());
}
