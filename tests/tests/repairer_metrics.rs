//! The repairer's `/metrics` from the real binary, with a real agent reporting to it, passes
//! `promtool check metrics` with no warnings and carries the families the dashboards use.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleetmend_tests::{fixture, fixture_flags, free_port, http_get, poll_until, start_agent};

#[test]
fn repairer_metrics_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let (repairer_addr, repairer) = fleetmend_tests::repairer_in(dir.path(), "");
    let case = fixture("healthy");
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", case.join("agent.toml").display()));
    flags.push(format!("--repairer=http://{repairer_addr}"));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _agent = start_agent(dir.path(), agent_addr, &args);

    let mut body = String::new();
    let joined =
        poll_until(Duration::from_secs(10), || match http_get(repairer_addr, "/metrics") {
            Some((200, text)) if text.contains("fleetmend_nodes{state=\"healthy\"} 1") => {
                body = text;
                true
            }
            _ => false,
        });
    assert!(joined, "the agent never joined:\n{body}\n{}", repairer.stderr());
    for family in [
        "fleetmend_nodes",
        "fleetmend_breaker_open",
        "fleetmend_time_to_drain_seconds",
        "fleetmend_time_to_repair_seconds",
        "fleetmend_reports_received_total",
    ] {
        assert!(body.contains(&format!("# TYPE {family} ")), "{family} missing:\n{body}");
    }
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`) is installed by scripts/test");
    promtool.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let output = promtool.wait_with_output().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(0), "{printed}\n{body}");
    assert!(printed.trim().is_empty(), "promtool warnings:\n{printed}");
}
