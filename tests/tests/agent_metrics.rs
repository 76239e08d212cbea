//! `/metrics` of the real binary on the healthy fixture: a golden file, and `promtool check metrics`
//! on it and on the live output. `FLEETMEND_UPDATE_GOLDEN=1` rewrites the golden file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleetmend_tests::{
    fixture, fixture_flags, free_port, http_get, poll_until, start_agent, workspace_root,
};

/// Families whose values change from run to run or machine to machine; the golden file keeps their
/// series (names and labels) and masks their values.
const VOLATILE: &[&str] = &[
    "fleetmend_agent_start_time_seconds",
    "fleetmend_check_duration_seconds",
    "fleetmend_check_last_run_timestamp_seconds",
    "fleetmend_disk_probe_latency_seconds",
    "fleetmend_disk_size_bytes",
    "fleetmend_disk_free_bytes",
    "fleetmend_disk_free_ratio",
    "fleetmend_disk_inodes_free_ratio",
];

fn normalise(metrics: &str) -> String {
    let mut out = String::new();
    for line in metrics.lines() {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if !line.starts_with('#') && VOLATILE.contains(&name) {
            let series = line.rsplit_once(' ').map(|(series, _)| series).unwrap_or(line);
            out.push_str(series);
            out.push_str(" <masked>\n");
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Runs `promtool check metrics` on `text`: exit status and everything it printed.
fn promtool_check(text: &str) -> (Option<i32>, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`) must be installed: the test command installs it");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), printed)
}

fn live_metrics() -> (String, fleetmend_tests::Running, tempfile::TempDir) {
    let (listen, agent, dir) = healthy_agent();
    let mut body = String::new();
    let ok = poll_until(Duration::from_secs(10), || match http_get(listen, "/metrics") {
        Some((200, text)) if text.contains("fleetmend_check_status") => {
            body = text;
            true
        }
        _ => false,
    });
    assert!(ok, "no /metrics:\n{}", agent.stderr());
    (body, agent, dir)
}

/// An agent on the healthy fixture, answering: its address, the process, its directory.
fn healthy_agent() -> (SocketAddr, fleetmend_tests::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let case = fixture("healthy");
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", case.join("agent.toml").display()));
    flags.push("--node=fixture-node".to_owned());
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let agent = start_agent(dir.path(), listen, &args);
    (listen, agent, dir)
}

#[test]
fn healthy_metrics_match_the_golden_file() {
    let (body, agent, _dir) = live_metrics();
    let actual = normalise(&body);
    let golden = workspace_root().join("tests/golden/agent_healthy.metrics");
    if std::env::var_os("FLEETMEND_UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    if actual != expected {
        let diff: Vec<String> = expected
            .lines()
            .filter(|l| !actual.lines().any(|a| a == *l))
            .map(|l| format!("- {l}"))
            .chain(
                actual
                    .lines()
                    .filter(|l| !expected.lines().any(|e| e == *l))
                    .map(|l| format!("+ {l}")),
            )
            .collect();
        panic!(
            "/metrics differs from {} (FLEETMEND_UPDATE_GOLDEN=1 rewrites it):\n{}\n{}",
            golden.display(),
            diff.join("\n"),
            agent.stderr()
        );
    }
}

#[test]
fn promtool_accepts_the_golden_file_and_the_live_output() {
    let golden =
        std::fs::read_to_string(workspace_root().join("tests/golden/agent_healthy.metrics"))
            .unwrap()
            .replace(" <masked>", " 1");
    let (code, printed) = promtool_check(&golden);
    assert_eq!(code, Some(0), "promtool on the golden file:\n{printed}");
    assert!(printed.trim().is_empty(), "promtool warnings on the golden file:\n{printed}");

    let (body, _agent, _dir) = live_metrics();
    let (code, printed) = promtool_check(&body);
    assert_eq!(code, Some(0), "promtool on live /metrics:\n{printed}\n{body}");
    assert!(printed.trim().is_empty(), "promtool warnings on live /metrics:\n{printed}");
    for required in [
        "fleetmend_check_status{",
        "fleetmend_check_duration_seconds{",
        "fleetmend_gpu_xid_errors_total{",
        "fleetmend_gpu_temperature_celsius{",
        "fleetmend_gpu_ecc_errors_total{",
        "fleetmend_gpu_remapped_rows{",
        "fleetmend_nic_up{",
        "fleetmend_nic_errors_total{",
        "fleetmend_disk_free_ratio{",
        "fleetmend_disk_probe_latency_seconds{",
        "fleetmend_agent_info{",
    ] {
        assert!(body.contains(required), "/metrics lacks {required}");
    }
}

/// The whole response to a raw HTTP/1.1 request, head and body.
fn raw_request(addr: SocketAddr, request: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn the_listener_answers_an_unknown_path_and_a_wrong_method_with_the_json_error() {
    let (listen, _agent, _dir) = healthy_agent();
    let missing = raw_request(listen, "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let (head, body) = missing.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 404"), "{missing}");
    assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{missing}");
    let error: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(error["error"], "no route for GET /nope", "{missing}");

    let wrong = raw_request(
        listen,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let (head, body) = wrong.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 405"), "{wrong}");
    assert!(head.to_ascii_lowercase().contains("allow: get,head"), "{wrong}");
    let error: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(error["error"], "/metrics does not take POST", "{wrong}");
}
