//! `fleetmend up` as a newcomer runs it: the real binary with stdout not a terminal prints the
//! repairer's URL, its admin token's file and every agent's /metrics, runs the training job to
//! completion and exits 0 with the job's final line; SIGINT in the middle of a run stops
//! everything it started (agents and ranks, real processes) promptly. And the `local` provider,
//! in process: a reboot restarts the node's agent on a new boot id, a replacement returns the
//! spare and retires the old node, and with no spare left it says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use fleetmend_local::provider::{LocalProvider, PowerState, Provider};
use fleetmend_local::up::supervisor::{AgentState, Role, ranks_under};
use fleetmend_local::up::{Fleet, FleetConfig};
use fleetmend_tests::{Up, fleetmend_bin, poll_until};

/// Longest a small fleet may take to start, train and stop on two loaded cores (debug build).
const RUN_LIMIT: Duration = Duration::from_secs(240);
/// "Promptly": from SIGINT to the exit, every agent and rank stopped.
const STOP_LIMIT: Duration = Up::STOP_LIMIT;

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// The pids in `<state>/nodes/*/agent.pid`.
fn agent_pids(state: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(state.join("nodes")).unwrap().flatten() {
        if let Ok(text) = std::fs::read_to_string(entry.path().join("agent.pid")) {
            pids.push(text.trim().parse().unwrap());
        }
    }
    pids
}

/// Live processes whose command line names the state directory (the agents run with their
/// tree's paths as flags).
fn processes_naming(state: &Path) -> Vec<String> {
    let needle = state.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && alive(pid) {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

#[test]
fn up_runs_the_job_to_completion_and_exits_0_with_its_final_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut up = Up::start(
        dir.path(),
        &state,
        &["--nodes", "2", "--spares", "1", "--steps", "12", "--checkpoint-every", "5"],
    );
    let status = up.wait(RUN_LIMIT);
    assert!(status.is_some(), "fleetmend up did not finish within {RUN_LIMIT:?}\n{}", up.output());
    let status = status.unwrap();
    let stdout = up.stdout();
    assert!(status.success(), "fleetmend up exited with {status}\n{}", up.output());

    let state = state.canonicalize().unwrap();
    assert!(stdout.contains("repairer API: http://127.0.0.1:"), "{stdout}");
    let token = state.join("admin.token");
    assert!(stdout.contains(&format!("admin token: {}", token.display())), "{stdout}");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&token).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the admin token is readable by others");
    for (node, role) in [("node-1", "worker"), ("node-2", "worker"), ("node-3", "spare")] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("agent {node} ({role}): http://127.0.0.1:")))
            .unwrap_or_else(|| panic!("no metrics URL for {node}:\n{stdout}"));
        assert!(line.ends_with("/metrics"), "{line}");
    }

    // The last line is the job's: step, loss and the weights hash from rank 0's log.
    let last = stdout.lines().last().unwrap_or("");
    let rest = last.strip_prefix("job j-1 completed: step 12, loss ").unwrap_or_else(|| {
        panic!("the last line is not the job's final line: {last:?}\n{}", up.output())
    });
    let (loss, hash) = rest.split_once(", weights sha256 ").unwrap();
    assert!(loss.parse::<f64>().is_ok_and(f64::is_finite), "{last}");
    assert_eq!(hash.len(), 64, "{last}");
    assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{last}");
    // The spare never took a rank while the two workers were healthy.
    assert!(!state.join("nodes/node-3/jobs/j-1").exists(), "the spare ran a rank");

    // Nothing it started runs on, and fleet.json says it stopped.
    let fleet: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("fleet.json")).unwrap()).unwrap();
    assert_eq!(fleet["running"], false, "{fleet:#}");
    assert_eq!(fleet["spares"], serde_json::json!(["node-3"]), "{fleet:#}");
    assert!(processes_naming(&state).is_empty(), "left running: {:?}", processes_naming(&state));
    assert!(ranks_under(Path::new("/proc"), &state.join("nodes")).is_empty());
}

#[test]
fn sigint_in_the_middle_of_a_run_stops_everything_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // More steps than the test waits for: the job is running when SIGINT comes.
    let flags = ["--nodes", "2", "--spares", "1", "--steps", "100000", "--model", "small"];
    let mut up = Up::start(dir.path(), &state, &[&flags[..], &["--pace", "100ms"]].concat());
    let running = poll_until(RUN_LIMIT, || {
        up.stdout().lines().any(|l| l.contains("job j-1 running") && l.contains(", step "))
    });
    assert!(running, "the job did not get to run\n{}", up.output());
    let state = state.canonicalize().unwrap();
    let agents = agent_pids(&state);
    assert_eq!(agents.len(), 3, "agent.pid files: {agents:?}");
    let ranks = ranks_under(Path::new("/proc"), &state.join("nodes"));
    assert_eq!(ranks.len(), 2, "rank processes: {ranks:?}");
    assert!(agents.iter().chain(&ranks).all(|pid| alive(*pid)));

    let sent = Instant::now();
    up.signal("INT");
    let status = up.wait(STOP_LIMIT);
    assert!(
        status.is_some(),
        "fleetmend up did not exit within {STOP_LIMIT:?} of SIGINT\n{}",
        up.output()
    );
    let status = status.unwrap();
    assert_eq!(status.code(), Some(130), "{}", up.output());
    let left: Vec<u32> = agents.iter().chain(&ranks).copied().filter(|pid| alive(*pid)).collect();
    assert!(left.is_empty(), "still running {:?} after the exit\n{}", left, up.output());
    assert!(processes_naming(&state).is_empty(), "left running: {:?}", processes_naming(&state));
    assert!(ranks_under(Path::new("/proc"), &state.join("nodes")).is_empty());
    assert!(
        up.stdout().contains("SIGINT: stopping the job"),
        "no word of the stop\n{}",
        up.output()
    );
    eprintln!("stopped {:.1} s after SIGINT", sent.elapsed().as_secs_f64());
}

#[test]
fn the_local_provider_reboots_with_a_new_boot_id_and_replaces_with_the_spare() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let config = FleetConfig {
            nodes: 1,
            spares: 1,
            job: false,
            boot_delay: Duration::from_millis(200),
            // The repairer decides nothing by itself: this test alone drives the provider.
            mode: fleetmend_repairer_mode_dry_run(),
            ..FleetConfig::new(dir.path().join("state"), fleetmend_bin())
        };
        let fleet = Fleet::start(config).await.unwrap();
        let supervisor = fleet.supervisor().clone();
        let provider = LocalProvider::new(supervisor.clone());
        assert_eq!(provider.name(), "local");
        assert_eq!(provider.power_state("node-1").await.unwrap(), PowerState::On);
        assert!(provider.power_state("node-9").await.is_err());
        let boot_before = supervisor.boot_id("node-1").unwrap();
        let pid_before = supervisor.node("node-1").unwrap().pid.unwrap();

        provider.reboot("node-1").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let rebooted = loop {
            let node = supervisor.node("node-1").unwrap();
            let reported = fleet.engine().node("node-1").map(|n| n.boot_id).unwrap_or_default();
            if node.agent == AgentState::Running
                && node.pid.is_some_and(|pid| pid != pid_before)
                && reported != boot_before
            {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(rebooted, "node-1 did not come back on a new boot id: {:?}", fleet.notes(0));
        let boot_after = supervisor.boot_id("node-1").unwrap();
        assert_ne!(boot_after, boot_before);
        assert_eq!(fleet.engine().node("node-1").unwrap().boot_id, boot_after);
        assert!(!alive(pid_before), "the agent from before the reboot still runs");

        let spare = provider.replace("node-1").await.unwrap();
        assert_eq!(spare, "node-2");
        // Asked again (a repairer restarted after the call), the same spare.
        assert_eq!(provider.replace("node-1").await.unwrap(), "node-2");
        assert_eq!(supervisor.role("node-1"), Some(Role::Retired));
        assert_eq!(supervisor.role("node-2"), Some(Role::Worker));
        let pid_retired = supervisor.node("node-1").unwrap().pid;
        let retired = fleetmend_tests::poll_until_async(Duration::from_secs(30), || {
            supervisor.agent_state("node-1") == Some(AgentState::Stopped)
        })
        .await;
        assert!(retired, "the retired node's agent was not stopped: {:?}", fleet.notes(0));
        assert!(pid_retired.is_none_or(|pid| !alive(pid)));
        assert_eq!(provider.power_state("node-1").await.unwrap(), PowerState::Off);
        assert!(provider.reboot("node-1").await.is_err(), "a retired node was rebooted");

        let err = provider.replace("node-2").await.unwrap_err().to_string();
        assert!(err.contains("no spare left"), "{err}");
        fleet.shutdown().await;
    });
}

/// The repairer's dry-run mode, by name (the tests crate does not depend on the repairer).
fn fleetmend_repairer_mode_dry_run() -> fleetmend_local::up::fleet::Mode {
    serde_json::from_str("\"dry-run\"").unwrap()
}
