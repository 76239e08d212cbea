//! A monitor hung by the failing hardware reports that hardware: the real agent binary, its GPU
//! backend reading a stand-in for NVML that never returns (the fixture path is a FIFO no one
//! writes, so opening it blocks for good, as an NVML call into a hung GPU does).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use fleetmend_proto::{HealthView, RecommendedAction, Status};
use fleetmend_tests::{fixture, fixture_flags, free_port, http_get, poll_until, start_agent};

fn health(listen: SocketAddr) -> Option<HealthView> {
    let (status, body) = http_get(listen, "/v1/health")?;
    (status == 200).then(|| serde_json::from_str(&body).ok()).flatten()
}

/// Three GPU runs in a row that time out (a query that never returns) become `gpu_unresponsive`,
/// a failure recommending a reboot; the first is only an unknown `check_timeout`. Meanwhile the
/// agent is not blocked: it answers at once and its other checks run on.
#[test]
fn a_gpu_query_that_never_returns_becomes_gpu_unresponsive_after_three_runs() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("nvml.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo {}", fifo.display());
    let healthy = fixture("healthy");
    let base = std::fs::read_to_string(healthy.join("agent.toml")).unwrap();
    let config =
        base.replace("[checks.gpu]\n", "[checks.gpu]\ninterval = \"1s\"\ntimeout = \"300ms\"\n");
    assert_ne!(config, base, "the fixture's config has a [checks.gpu] table to extend");
    let config_path = dir.path().join("agent.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut flags = fixture_flags(&healthy);
    flags.retain(|f| !f.starts_with("--gpu="));
    flags.push(format!("--gpu=fixture:{}", fifo.display()));
    flags.push(format!("--config={}", config_path.display()));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let agent = start_agent(dir.path(), listen, &args);

    let gpu_finding = |view: &HealthView, id: &str| {
        view.findings.iter().find(|f| f.check == "gpu" && f.finding == id).cloned()
    };
    let mut saw_timeout_first = false;
    let mut unresponsive = None;
    let found = poll_until(Duration::from_secs(30), || {
        let Some(view) = health(listen) else { return false };
        if unresponsive.is_none() && gpu_finding(&view, "check_timeout").is_some() {
            saw_timeout_first = true;
        }
        unresponsive = gpu_finding(&view, "gpu_unresponsive");
        unresponsive.is_some()
    });
    assert!(found, "no gpu_unresponsive within 30 s:\n{}", agent.stderr());
    assert!(saw_timeout_first, "the first timed-out runs are only check_timeout");
    let finding = unresponsive.unwrap();
    assert_eq!(finding.status, Status::Fail);
    assert_eq!(finding.action, RecommendedAction::Reboot);
    assert!(finding.message.contains("3 runs in a row"), "{}", finding.message);

    // The hung query holds one worker, not the agent: it answers at once, and the other checks
    // finish their runs (none of them timed out).
    let asked = Instant::now();
    let view = health(listen).expect("the agent answers while the GPU query hangs");
    assert!(asked.elapsed() < Duration::from_secs(1), "answered in {:?}", asked.elapsed());
    let others: Vec<_> = view.checks.iter().filter(|c| c.check != "gpu").collect();
    assert!(others.iter().any(|c| c.check == "host"), "the host check ran: {:?}", view.checks);
    assert!(others.iter().all(|c| !c.timed_out), "only the GPU check hangs: {:?}", view.checks);
    let gpu = view.checks.iter().find(|c| c.check == "gpu").unwrap();
    assert!(gpu.timed_out && gpu.status == Status::Fail, "{gpu:?}");
}
