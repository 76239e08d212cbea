//! A monitor hung by the failing hardware reports that hardware: the real agent binary, one of its
//! queries replaced by a stand-in that never returns. The stand-in is a FIFO that no one writes
//! at the path the check reads (NVML's snapshot for the GPU check, the mount table for the disk
//! check, an interface's `operstate` for the NIC check): opening it blocks for good, as an NVML
//! call into a hung GPU or a read from a hung device does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fleetmend_proto::{HealthView, RecommendedAction, Status};
use fleetmend_tests::{fixture, fixture_flags, free_port, http_get, poll_until, start_agent};

fn health(listen: SocketAddr) -> Option<HealthView> {
    let (status, body) = http_get(listen, "/v1/health")?;
    (status == 200).then(|| serde_json::from_str(&body).ok()).flatten()
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Runs the agent on a copy of the healthy fixture whose `hung` file (relative to the copy) is a
/// FIFO, with `check` run every second under a 300 ms timeout; asserts that the check's first
/// timeouts are only `check_timeout`, that the third in a row fails with `id` recommending
/// `action`, and that the agent and its other checks go on meanwhile.
fn a_hung_query_becomes_a_finding(check: &str, hung: &str, id: &str, action: RecommendedAction) {
    hung_with(check, hung, id, action, "");
}

/// [`a_hung_query_becomes_a_finding`] with `more` settings in the check's table.
fn hung_with(check: &str, hung: &str, id: &str, action: RecommendedAction, more: &str) {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    let copied = Command::new("cp").arg("-r").arg(fixture("healthy")).arg(&node).status().unwrap();
    assert!(copied.success());
    mkfifo(&node.join(hung));
    let base = std::fs::read_to_string(node.join("agent.toml")).unwrap();
    let table = format!("[checks.{check}]\n");
    let schedule = format!("interval = \"1s\"\ntimeout = \"300ms\"\n{more}");
    let config = if base.contains(&table) {
        base.replace(&table, &format!("{table}{schedule}"))
    } else {
        format!("{base}\n{table}{schedule}")
    };
    let config_path = dir.path().join("agent.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut flags = fixture_flags(&node);
    flags.push(format!("--config={}", config_path.display()));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let agent = start_agent(dir.path(), listen, &args);

    let finding = |view: &HealthView, id: &str| {
        view.findings.iter().find(|f| f.check == check && f.finding == id).cloned()
    };
    let mut saw_timeout_first = false;
    let mut unresponsive = None;
    let found = poll_until(Duration::from_secs(30), || {
        let Some(view) = health(listen) else { return false };
        if unresponsive.is_none() && finding(&view, "check_timeout").is_some() {
            saw_timeout_first = true;
        }
        unresponsive = finding(&view, id);
        unresponsive.is_some()
    });
    assert!(found, "no {id} within 30 s:\n{}", agent.stderr());
    assert!(saw_timeout_first, "{check}: the first timed-out runs are only check_timeout");
    let unresponsive = unresponsive.unwrap();
    assert_eq!(unresponsive.status, Status::Fail, "{unresponsive:?}");
    assert_eq!(unresponsive.action, action, "{unresponsive:?}");
    assert!(unresponsive.message.contains("3 runs in a row"), "{}", unresponsive.message);

    // The hung query holds one worker, not the agent: it answers at once, and the other checks
    // finish their runs.
    let asked = Instant::now();
    let view = health(listen).expect("the agent answers while the query hangs");
    assert!(asked.elapsed() < Duration::from_secs(1), "answered in {:?}", asked.elapsed());
    let others: Vec<_> = view.checks.iter().filter(|c| c.check != check).collect();
    assert!(others.iter().any(|c| c.check == "host"), "the host check ran: {:?}", view.checks);
    assert!(others.iter().all(|c| !c.timed_out), "only {check} hangs: {:?}", view.checks);
    let hung = view.checks.iter().find(|c| c.check == check).unwrap();
    assert!(hung.timed_out && hung.status == Status::Fail, "{hung:?}");
}

#[test]
fn a_gpu_query_that_never_returns_becomes_gpu_unresponsive_after_three_runs() {
    a_hung_query_becomes_a_finding(
        "gpu",
        "gpu.json",
        "gpu_unresponsive",
        RecommendedAction::Reboot,
    );
}

#[test]
fn a_disk_probe_that_never_returns_becomes_disk_unresponsive_after_three_runs() {
    // Its per-mount probes have their own, shorter timeout (a hung mount is a finding of its
    // own); the mount table is read before any of them.
    let more = "probe_timeout = \"100ms\"\n";
    hung_with("disk", "proc/mounts", "disk_unresponsive", RecommendedAction::Reboot, more);
}

#[test]
fn a_nic_query_that_never_returns_becomes_nic_unresponsive_after_three_runs() {
    let hung = "sys/class/net/eth0/operstate";
    a_hung_query_becomes_a_finding("nic", hung, "nic_unresponsive", RecommendedAction::Drain);
}
