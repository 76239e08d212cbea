//! A real Prometheus (Debian's `prometheus`, which scripts/test installs) run with the shipped
//! deploy/prometheus/prometheus.yml, pointed at a real repairer with two real agents reporting to
//! it: through the repairer's service discovery (with the admin token) it scrapes both agents and
//! the repairer, with the node and state labels the repairer gives, and loads the shipped rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleetmend_tests::{
    Running, Up, fixture, fixture_flags, free_port, http_get, poll_until, start_agent,
    workspace_root,
};
use serde_json::Value;

const ADMIN_TOKEN: &str = "sd-admin-secret";
/// Prometheus's first scrape comes ~5 s after start (see shared notes); generous for a busy host.
const SCRAPED_DEADLINE: Duration = Duration::from_secs(60);

/// The shipped prometheus.yml, pointed at this test's repairer and token, scraping every second.
fn prometheus_config(dir: &std::path::Path, repairer: SocketAddr) -> std::path::PathBuf {
    let token = dir.join("admin.token");
    std::fs::write(&token, ADMIN_TOKEN).unwrap();
    prometheus_config_with(dir, repairer, &token)
}

/// The shipped prometheus.yml, pointed at `repairer` with the admin token in `token`.
fn prometheus_config_with(
    dir: &std::path::Path,
    repairer: SocketAddr,
    token: &std::path::Path,
) -> std::path::PathBuf {
    let shipped =
        std::fs::read_to_string(workspace_root().join("deploy/prometheus/prometheus.yml")).unwrap();
    let rules = workspace_root().join("deploy/prometheus/rules/fleetmend.rules.yml");
    let replaced = [
        ("repairer.example:9830", repairer.to_string()),
        ("/etc/prometheus/fleetmend-admin.token", token.display().to_string()),
        ("rules/fleetmend.rules.yml", rules.display().to_string()),
        ("scrape_interval: 15s", "scrape_interval: 1s".to_owned()),
        ("refresh_interval: 30s", "refresh_interval: 1s".to_owned()),
    ];
    let mut text = shipped;
    for (from, to) in replaced {
        assert!(text.contains(from), "prometheus.yml no longer has {from:?}: update this test");
        text = text.replace(from, &to);
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, text).unwrap();
    path
}

fn start_prometheus(
    dir: &std::path::Path,
    config: &std::path::Path,
    listen: SocketAddr,
) -> Running {
    let stderr_path = dir.join("prometheus.stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address={listen}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("prometheus (Debian package `prometheus`) is installed by scripts/test");
    Running { child, stderr_path }
}

/// `up` series as (job, node or "", state or "", value).
fn up_series(prometheus: SocketAddr) -> Vec<(String, String, String, String)> {
    let Some((200, body)) = http_get(prometheus, "/api/v1/query?query=up") else {
        return Vec::new();
    };
    let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let label = |s: &Value, name: &str| s["metric"][name].as_str().unwrap_or("").to_owned();
    let mut series: Vec<_> = parsed["data"]["result"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| {
            (
                label(s, "job"),
                label(s, "node"),
                label(s, "state"),
                s["value"][1].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    series.sort();
    series
}

#[test]
fn prometheus_scrapes_every_agent_and_the_repairer_through_service_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let (repairer_addr, repairer) =
        fleetmend_tests::repairer_in(dir.path(), &format!("admin_token = \"{ADMIN_TOKEN}\"\n"));

    // Two agents on the healthy fixture; they advertise loopback, where they listen.
    let case = fixture("healthy");
    let fixture_config = std::fs::read_to_string(case.join("agent.toml")).unwrap();
    let mut agents = Vec::new();
    for node in ["sd-a", "sd-b"] {
        let config = dir.path().join(format!("{node}.toml"));
        let jobs = dir.path().join(format!("{node}-jobs"));
        std::fs::write(
            &config,
            format!(
                "{fixture_config}\n[jobs]\nadvertise_address = \"127.0.0.1\"\ndir = \"{}\"\n",
                jobs.display()
            ),
        )
        .unwrap();
        let mut flags = fixture_flags(&case);
        flags.push(format!("--config={}", config.display()));
        flags.push(format!("--repairer=http://{repairer_addr}"));
        flags.push(format!("--node={node}"));
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        agents.push(start_agent(dir.path(), listen, &args));
    }

    let prometheus_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = prometheus_config(dir.path(), repairer_addr);
    let prometheus = start_prometheus(dir.path(), &config, prometheus_addr);

    let expected = vec![
        ("fleetmend-agents".to_owned(), "sd-a".to_owned(), "healthy".to_owned(), "1".to_owned()),
        ("fleetmend-agents".to_owned(), "sd-b".to_owned(), "healthy".to_owned(), "1".to_owned()),
        ("fleetmend-repairer".to_owned(), String::new(), String::new(), "1".to_owned()),
    ];
    let mut seen = Vec::new();
    let scraped = poll_until(SCRAPED_DEADLINE, || {
        seen = up_series(prometheus_addr);
        seen == expected
    });
    let agent_logs: Vec<String> = agents.iter().map(Running::stderr).collect();
    assert!(
        scraped,
        "up series: {seen:?}\nprometheus:\n{}\nrepairer:\n{}\nagents:\n{agent_logs:?}",
        prometheus.stderr(),
        repairer.stderr()
    );

    // The agents' own series carry the node label too, and the repairer's metrics are there.
    for (query, want) in [
        ("count(fleetmend_agent_info{job=\"fleetmend-agents\",node=~\"sd-a|sd-b\"})", "2"),
        ("fleetmend_breaker_open{job=\"fleetmend-repairer\"}", "0"),
    ] {
        let path = format!("/api/v1/query?query={}", urlencode(query));
        let (status, body) = http_get(prometheus_addr, &path).unwrap();
        assert_eq!(status, 200, "{body}");
        let parsed: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed["data"]["result"][0]["value"][1], want, "{query}: {body}");
    }
    // The shipped rules loaded (the recording rules of every group are there).
    let (status, body) = http_get(prometheus_addr, "/api/v1/rules").unwrap();
    assert_eq!(status, 200, "{body}");
    let rules: Value = serde_json::from_str(&body).unwrap();
    let groups = rules["data"]["groups"].as_array().cloned().unwrap_or_default();
    assert_eq!(groups.len(), 5, "{body}");
}

/// Percent-encodes a query parameter value.
fn urlencode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the single series `query` returns, if there is one.
fn query_value(prometheus: SocketAddr, query: &str) -> Option<f64> {
    let path = format!("/api/v1/query?query={}", urlencode(query));
    let (status, body) = http_get(prometheus, &path)?;
    let parsed: Value = serde_json::from_str(&body).ok()?;
    (status == 200).then_some(())?;
    parsed["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_a_fleetmend_up_fleet_and_its_job_through_service_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("up");
    let repairer_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    // A job long enough to outlast the test; two workers and a spare.
    let listen = repairer_addr.to_string();
    let up = Up::start(
        dir.path(),
        &state,
        &[
            "--nodes", "2", "--spares", "1", "--steps", "1000000", "--listen", &listen,
            // Paced: the job waits, it does not take the cores the tests beside it share.
            "--model", "small", "--pace", "100ms",
        ],
    );
    let token = state.join("admin.token");
    let started = poll_until(SCRAPED_DEADLINE, || up.stdout().contains("agent node-3"));
    assert!(started, "fleetmend up did not start:\n{}", up.output());

    let prometheus_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = prometheus_config_with(dir.path(), repairer_addr, &token);
    let prometheus = start_prometheus(dir.path(), &config, prometheus_addr);

    let expected = vec![
        ("fleetmend-agents".to_owned(), "node-1".to_owned(), "healthy".to_owned(), "1".to_owned()),
        ("fleetmend-agents".to_owned(), "node-2".to_owned(), "healthy".to_owned(), "1".to_owned()),
        ("fleetmend-agents".to_owned(), "node-3".to_owned(), "healthy".to_owned(), "1".to_owned()),
        ("fleetmend-repairer".to_owned(), String::new(), String::new(), "1".to_owned()),
    ];
    let mut seen = Vec::new();
    let scraped = poll_until(SCRAPED_DEADLINE, || {
        seen = up_series(prometheus_addr);
        seen == expected
    });
    // The job's series, under the job_id label the shipped config gives them.
    let stepping = scraped
        && poll_until(SCRAPED_DEADLINE, || {
            query_value(prometheus_addr, "max(fleetmend_job_step{job_id!=\"\"})")
                .is_some_and(|step| step >= 1.0)
        });
    let agents =
        query_value(prometheus_addr, "count(fleetmend_gpu_devices{job=\"fleetmend-agents\"})");
    up.signal("INT");
    assert!(scraped, "up series: {seen:?}\nprometheus:\n{}\n{}", prometheus.stderr(), up.output());
    assert!(stepping, "no fleetmend_job_step{{job_id}} in Prometheus:\n{}", prometheus.stderr());
    assert!(agents.is_some_and(|n| n >= 3.0), "GPU series of every agent: {agents:?}");
    let exited =
        poll_until(Up::STOP_LIMIT, || up.stdout().contains("everything it started is stopped"));
    assert!(exited, "fleetmend up did not stop on SIGINT:\n{}", up.output());
}
