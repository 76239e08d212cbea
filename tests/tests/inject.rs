//! Simulated node trees and `fleetmend inject`: every fault written into a tree is found by the
//! real agent (`fleetmend agent --once` on the tree) with the finding, status and action the real
//! fault gives; a reboot clears what is not persistent and keeps what is; the CLI refuses unknown
//! nodes and faults; agent-kill kills the real agent process, and only it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use fleetmend_local::faults::{Fault, InjectError};
use fleetmend_local::tree::{NodeTree, node_dir};
use fleetmend_proto::{Finding, HealthView, RecommendedAction, Status, Verdict};
use fleetmend_tests::{
    fleetmend_bin, free_port, http_get, is_root, poll_until, run_with_timeout, start_agent,
};

/// A fresh tree for `node` in a state directory of its own.
fn new_tree(node: &str) -> (tempfile::TempDir, NodeTree) {
    let state = tempfile::tempdir().unwrap();
    let tree = NodeTree::create(&node_dir(state.path(), node), node).unwrap();
    (state, tree)
}

/// `fleetmend agent --once --output json` on the tree: exit code and the health view.
fn once(tree: &NodeTree) -> (i32, HealthView) {
    let mut command = Command::new(fleetmend_bin());
    command.arg("agent").arg("--once").arg("--output=json").args(tree.agent_flags());
    let output = run_with_timeout(&mut command, Duration::from_secs(30));
    let view: HealthView = serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "no health view ({err}):\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), view)
}

fn problems(view: &HealthView) -> Vec<&Finding> {
    view.findings.iter().filter(|f| f.status != Status::Ok).collect()
}

fn summary(view: &HealthView) -> String {
    problems(view)
        .iter()
        .map(|f| {
            format!(
                "{}/{}[{}] {:?} {:?}: {}",
                f.check, f.finding, f.subject, f.status, f.action, f.message
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `(check, finding, subject, status, action)`.
type Expected<'a> = (&'a str, &'a str, &'a str, Status, RecommendedAction);

/// Asserts that each of `expected` is among the findings and that every other finding that is not
/// ok is one of `also` (check, finding): the fault shows as the real one does, and as nothing else.
fn assert_findings(view: &HealthView, expected: &[Expected<'_>], also: &[(&str, &str)]) {
    for &(check, finding, subject, status, action) in expected {
        let found = view
            .findings
            .iter()
            .find(|f| f.check == check && f.finding == finding && f.subject == subject);
        let found = found.unwrap_or_else(|| {
            panic!("no {check}/{finding}[{subject}] finding; problems:\n{}", summary(view))
        });
        assert_eq!(
            (found.status, found.action),
            (status, action),
            "{check}/{finding}[{subject}]: {}",
            found.message
        );
    }
    for problem in problems(view) {
        let listed = expected.iter().any(|e| {
            (e.0, e.1, e.2)
                == (problem.check.as_str(), problem.finding.as_str(), problem.subject.as_str())
        }) || also.contains(&(problem.check.as_str(), problem.finding.as_str()));
        assert!(listed, "unexpected finding; problems:\n{}", summary(view));
    }
}

/// Injects `fault` into a fresh tree and runs the agent once on it.
fn inject_and_check(fault: &str) -> (i32, HealthView) {
    let (_state, tree) = new_tree("n1");
    tree.inject(&fault.parse().unwrap(), false).unwrap();
    once(&tree)
}

#[test]
fn a_healthy_tree_is_healthy_to_the_real_agent() {
    let (_state, tree) = new_tree("healthy-1");
    let (code, view) = once(&tree);
    assert_eq!(code, 0, "{}", summary(&view));
    assert_eq!(view.verdict, Verdict::Healthy, "{}", summary(&view));
    assert!(problems(&view).is_empty(), "{}", summary(&view));
    assert_eq!(view.node, "healthy-1");
    assert_eq!(view.boot_id, tree.boot_id().unwrap());
    let checks: Vec<&str> = view.checks.iter().map(|c| c.check.as_str()).collect();
    assert_eq!(checks, ["gpu", "kernel_log", "nic", "pcie", "disk", "host"]);
}

#[test]
fn gpu_xid_79_is_a_lost_gpu_to_reboot() {
    let (code, view) = inject_and_check("gpu-xid:79");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[
            ("kernel_log", "xid", "0000:5d:00", Status::Fail, RecommendedAction::Reboot),
            ("gpu", "xid", "3", Status::Fail, RecommendedAction::Reboot),
            ("gpu", "gpu_access", "3", Status::Fail, RecommendedAction::Reboot),
            // The driver's own line after the Xid.
            (
                "kernel_log",
                "gpu_fallen_off_bus",
                "0000:5d:00.0",
                Status::Fail,
                RecommendedAction::Reboot,
            ),
        ],
        &[],
    );
}

#[test]
fn gpu_xid_48_is_an_ecc_error_to_reset() {
    let (code, view) = inject_and_check("gpu-xid:48");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[
            ("kernel_log", "xid", "0000:5d:00", Status::Fail, RecommendedAction::ResetGpu),
            ("gpu", "xid", "3", Status::Fail, RecommendedAction::ResetGpu),
            ("gpu", "ecc_uncorrected", "3", Status::Fail, RecommendedAction::ResetGpu),
            ("gpu", "row_remap", "3", Status::Fail, RecommendedAction::ResetGpu),
            ("gpu", "recovery_action", "3", Status::Fail, RecommendedAction::ResetGpu),
        ],
        &[],
    );
}

#[test]
fn gpu_xid_of_another_code_follows_the_catalog() {
    // 13: an application fault, a warning with restart-app.
    let (code, view) = inject_and_check("gpu-xid:13");
    assert_eq!(code, 0, "{}", summary(&view));
    assert_eq!(view.verdict, Verdict::Degraded);
    assert_findings(
        &view,
        &[
            ("kernel_log", "xid", "0000:5d:00", Status::Warn, RecommendedAction::RestartApp),
            ("gpu", "xid", "3", Status::Warn, RecommendedAction::RestartApp),
        ],
        &[],
    );
}

#[test]
fn gpu_missing_is_a_short_count_to_reboot() {
    let (code, view) = inject_and_check("gpu-missing");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[
            ("gpu", "gpu_count", "", Status::Fail, RecommendedAction::Reboot),
            // The driver's line for the GPU it could not bring up.
            (
                "kernel_log",
                "gpu_init_failed",
                "0000:db:00.0",
                Status::Fail,
                RecommendedAction::Reboot,
            ),
        ],
        &[],
    );
}

#[test]
fn nic_pcie_downtrained_is_a_slow_nic_link_to_reboot() {
    let (code, view) = inject_and_check("nic-pcie-downtrained");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[("pcie", "pcie_speed", "0000:0c:00.0", Status::Fail, RecommendedAction::Reboot)],
        &[],
    );
}

#[test]
fn gpu_lost_is_the_probes_three_line_message_without_an_xid_to_reboot() {
    let (code, view) = inject_and_check("gpu-lost");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[
            (
                "kernel_log",
                "gpu_fallen_off_bus",
                "0000:5d:00.0",
                Status::Fail,
                RecommendedAction::Reboot,
            ),
            ("gpu", "gpu_count", "", Status::Fail, RecommendedAction::Reboot),
        ],
        &[],
    );
    assert!(view.findings.iter().all(|f| f.finding != "xid" || f.status == Status::Ok));
}

#[test]
fn xid_burst_is_xid_13_repeating_on_one_tpc_to_reboot() {
    let (code, view) = inject_and_check("xid-burst");
    assert_eq!(code, 1);
    let burst = view.findings.iter().find(|f| f.finding == "xid_burst").expect("xid_burst");
    assert_eq!(burst.labels.get("count").map(String::as_str), Some("5"), "{burst:?}");
    assert_findings(
        &view,
        &[
            ("kernel_log", "xid_burst", "0000:5d:00", Status::Fail, RecommendedAction::Reboot),
            // Each Xid 13 on its own is the application's.
            ("kernel_log", "xid", "0000:5d:00", Status::Warn, RecommendedAction::RestartApp),
        ],
        &[],
    );
}

#[test]
fn gsp_timeout_is_a_gpu_to_reset() {
    let (code, view) = inject_and_check("gsp-timeout");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[
            (
                "kernel_log",
                "gpu_needs_reset",
                "0000:5d:00",
                Status::Fail,
                RecommendedAction::ResetGpu,
            ),
            ("kernel_log", "xid", "0000:5d:00", Status::Fail, RecommendedAction::ResetGpu),
            ("gpu", "xid", "3", Status::Fail, RecommendedAction::ResetGpu),
        ],
        &[],
    );
}

#[test]
fn row_remap_failure_is_a_gpu_to_replace() {
    let (code, view) = inject_and_check("row-remap-failure");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[("gpu", "row_remap", "3", Status::Fail, RecommendedAction::Replace)],
        &[],
    );
}

#[test]
fn nvlink_down_is_a_gpu_to_reset() {
    let (code, view) = inject_and_check("nvlink-down");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[("gpu", "nvlink_down", "3", Status::Fail, RecommendedAction::ResetGpu)],
        &[],
    );
}

#[test]
fn nic_down_is_a_required_link_down_to_drain() {
    let (code, view) = inject_and_check("nic-down");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[
            ("nic", "nic_down", "eth0", Status::Fail, RecommendedAction::Drain),
            // The kernel's own line about it: an event, the nic check has the lasting state.
            ("kernel_log", "link_down", "eth0", Status::Warn, RecommendedAction::None),
        ],
        // A link that is down has no speed.
        &[("nic", "nic_speed")],
    );
}

#[test]
fn ib_port_down_is_a_required_port_and_its_ipoib_link_down_to_drain() {
    let (code, view) = inject_and_check("ib-port-down");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[
            ("nic", "ib_port_down", "mlx5_0/1", Status::Fail, RecommendedAction::Drain),
            ("nic", "nic_down", "ib0", Status::Fail, RecommendedAction::Drain),
        ],
        &[("nic", "nic_speed")],
    );
}

#[test]
fn pcie_downtrained_is_a_narrow_gpu_link_to_reboot() {
    let (code, view) = inject_and_check("pcie-downtrained");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[("gpu", "pcie_link", "3", Status::Fail, RecommendedAction::Reboot)],
        &[],
    );
}

#[test]
fn gpu_throttle_is_a_sustained_hardware_slowdown_to_drain() {
    // Fixture GPUs hold their state: the tree's agent judges a slowdown sustained from its first
    // run (a real node's after `throttle_sustained_runs`).
    let (code, view) = inject_and_check("gpu-throttle");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[("gpu", "throttle", "3", Status::Fail, RecommendedAction::Drain)],
        &[("gpu", "temperature")],
    );
    let throttle = view.findings.iter().find(|f| f.finding == "throttle" && f.subject == "3");
    assert!(throttle.unwrap().message.contains("hw_thermal_slowdown"), "{}", summary(&view));
}

#[test]
fn nvswitch_fatal_is_a_fatal_sxid_to_reboot() {
    let (code, view) = inject_and_check("nvswitch-fatal");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[(
            "kernel_log",
            "nvswitch_fatal",
            "0000:07:00.0",
            Status::Fail,
            RecommendedAction::Reboot,
        )],
        &[],
    );
}

#[test]
fn mlx5_health_is_a_nic_whose_firmware_stopped_answering_to_reboot() {
    let (code, view) = inject_and_check("mlx5-health");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[("kernel_log", "nic_health", "0000:0c:00.0", Status::Fail, RecommendedAction::Reboot)],
        &[],
    );
}

#[test]
fn disk_readonly_is_a_remount_to_reboot() {
    let (code, view) = inject_and_check("disk-readonly");
    assert_eq!(code, 1);
    assert_findings(
        &view,
        &[("disk", "disk_readonly", "/scratch", Status::Fail, RecommendedAction::Reboot)],
        // The agent does not write-probe a mount the table says is read-only.
        &[("disk", "disk_probe")],
    );
}

#[test]
fn kernel_mce_is_a_warning() {
    let (code, view) = inject_and_check("kernel-mce");
    assert_eq!(code, 0, "{}", summary(&view));
    assert_eq!(view.verdict, Verdict::Degraded);
    assert_findings(
        &view,
        &[("kernel_log", "mce", "", Status::Warn, RecommendedAction::None)],
        &[],
    );
}

fn mounted(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mounts").unwrap();
    table.lines().any(|line| line.split(' ').nth(1) == Some(path.to_str().unwrap()))
}

#[test]
fn disk_full_is_a_real_full_filesystem_to_drain_and_cleanup_unmounts_it() {
    let (_state, tree) = new_tree("n1");
    let scratch = tree.dir().join("root/scratch");
    let result = tree.inject(&Fault::DiskFull, true);
    if !is_root() {
        // Without root there is no tmpfs to fill: a clear error, and nothing changed.
        let err = result.unwrap_err();
        assert!(matches!(err, InjectError::NeedsRoot { .. }), "{err}");
        assert!(err.to_string().contains("needs root"), "{err}");
        assert!(tree.faults().unwrap().is_empty());
        return;
    }
    result.unwrap();
    // Unmounts even when an assertion below fails, so the temp dir can go.
    let _unmount = Unmount(&tree);
    assert!(mounted(&scratch), "no tmpfs on {}", scratch.display());
    let (code, view) = once(&tree);
    assert_eq!(code, 1);
    assert_findings(
        &view,
        // The tree's mounts are not write-probed (local/src/tree.rs); a probe's ENOSPC on a full
        // filesystem is agent/tests/disk.rs's.
        &[("disk", "disk_full", "/scratch", Status::Fail, RecommendedAction::Drain)],
        &[("disk", "disk_probe")],
    );
    // A persistent disk-full is mounted and filled again after a reboot.
    tree.reboot().unwrap();
    assert!(mounted(&scratch));
    let (_, view) = once(&tree);
    assert_findings(
        &view,
        &[("disk", "disk_full", "/scratch", Status::Fail, RecommendedAction::Drain)],
        &[("disk", "disk_probe")],
    );
    tree.cleanup().unwrap();
    assert!(!mounted(&scratch), "cleanup left {} mounted", scratch.display());
}

struct Unmount<'a>(&'a NodeTree);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = self.0.cleanup();
    }
}

#[test]
fn reboot_clears_transient_faults_keeps_persistent_ones_and_changes_the_boot_id() {
    let (_state, tree) = new_tree("n1");
    let first_boot = tree.boot_id().unwrap();
    tree.inject(&Fault::GpuXid(48), false).unwrap();
    tree.inject(&Fault::NicDown, true).unwrap();
    let (code, view) = once(&tree);
    assert_eq!(code, 1);
    assert!(
        view.findings.iter().any(|f| f.finding == "ecc_uncorrected" && f.status == Status::Fail)
    );

    let second_boot = tree.reboot().unwrap();
    assert_ne!(second_boot, first_boot);
    assert_eq!(tree.boot_id().unwrap(), second_boot);
    let kept: Vec<(Fault, bool)> =
        tree.faults().unwrap().into_iter().map(|f| (f.fault, f.persistent)).collect();
    assert_eq!(kept, [(Fault::NicDown, true)]);
    let (code, view) = once(&tree);
    assert_eq!(code, 1, "{}", summary(&view));
    assert_eq!(view.boot_id, second_boot);
    // The Xid 48 is gone with its boot (no ECC error, no Xid line in the new kernel log)...
    assert_findings(
        &view,
        &[
            // ...and the NIC is down again after the boot, as a broken link would be.
            ("nic", "nic_down", "eth0", Status::Fail, RecommendedAction::Drain),
            ("kernel_log", "link_down", "eth0", Status::Warn, RecommendedAction::None),
        ],
        &[("nic", "nic_speed")],
    );
    let kmsg = std::fs::read_to_string(tree.kmsg_path()).unwrap();
    assert!(!kmsg.contains("Xid"), "{kmsg}");

    // A persistent fault only goes with a new tree (a replaced node).
    let third_boot = tree.reboot().unwrap();
    assert_ne!(third_boot, second_boot);
    assert_eq!(once(&tree).0, 1);
    let fresh = NodeTree::create(tree.dir(), "n1").unwrap();
    assert!(fresh.faults().unwrap().is_empty());
    assert_eq!(once(&fresh).0, 0);
}

#[test]
fn a_running_agent_reports_an_injected_xid_at_once() {
    let (state, tree) = new_tree("n1");
    let listen = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let flags = tree.agent_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _agent = start_agent(state.path(), listen, &flags);
    let health = || -> Option<HealthView> {
        let (status, body) = http_get(listen, "/v1/health")?;
        (status == 200).then(|| serde_json::from_str(&body).ok()).flatten()
    };
    // Every check has run once and the node is healthy before the fault.
    assert!(poll_until(Duration::from_secs(10), || {
        health().is_some_and(|v| v.checks.len() == 6 && v.verdict == Verdict::Healthy)
    }));
    let injected = Instant::now();
    tree.inject(&Fault::GpuXid(79), false).unwrap();
    let seen = poll_until(Duration::from_secs(5), || {
        health().is_some_and(|v| {
            v.findings
                .iter()
                .any(|f| f.check == "kernel_log" && f.finding == "xid" && f.status == Status::Fail)
                && v.findings.iter().any(|f| f.finding == "gpu_access" && f.status == Status::Fail)
        })
    });
    assert!(seen, "the running agent did not report the Xid within 5 s");
    eprintln!("fault written -> agent reports it: {:?}", injected.elapsed());
}

fn inject_cli(state: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(fleetmend_bin());
    command.arg("inject").args(args).arg(format!("--state-dir={}", state.display()));
    command.env_remove("FLEETMEND_UP_DIR");
    run_with_timeout(&mut command, Duration::from_secs(30))
}

#[test]
fn inject_cli_writes_faults_and_refuses_unknown_nodes_and_faults() {
    let state = tempfile::tempdir().unwrap();
    for node in ["node-a", "node-b"] {
        NodeTree::create(&node_dir(state.path(), node), node).unwrap();
    }

    let out = inject_cli(state.path(), &["node-c", "gpu-xid:79"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("node-c") && stderr.contains("node-a, node-b"), "{stderr}");

    let out = inject_cli(state.path(), &["node-a", "gpu-melt"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("gpu-melt") && stderr.contains("gpu-xid:N, gpu-missing"), "{stderr}");

    let out = inject_cli(state.path(), &["node-a", "agent-kill", "--persistent"]);
    assert_eq!(out.status.code(), Some(2));

    let empty = tempfile::tempdir().unwrap();
    let out = inject_cli(empty.path(), &["node-a", "nic-down"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("fleetmend up"), "{stderr}");

    // Nothing was written by the refused ones.
    let tree = NodeTree::open(&node_dir(state.path(), "node-a")).unwrap();
    assert!(tree.faults().unwrap().is_empty());

    let out = inject_cli(state.path(), &["node-a", "gpu-xid:79", "--persistent"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("node-a: gpu-xid:79 (persistent"), "{stdout}");
    let faults = tree.faults().unwrap();
    assert_eq!((faults[0].fault, faults[0].persistent), (Fault::GpuXid(79), true));
    assert_eq!(once(&tree).0, 1);
}

#[test]
fn agent_kill_kills_the_nodes_real_agent_and_nothing_else() {
    let state = tempfile::tempdir().unwrap();
    let tree = NodeTree::create(&node_dir(state.path(), "n1"), "n1").unwrap();

    // A pid that is not this node's agent (a stale file, a recycled pid) is refused.
    let mut bystander = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(tree.agent_pid_path(), format!("{}\n", bystander.id())).unwrap();
    let out = inject_cli(state.path(), &["n1", "agent-kill"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not that node's agent"), "{stderr}");
    assert!(bystander.try_wait().unwrap().is_none(), "the bystander was killed");
    bystander.kill().unwrap();
    bystander.wait().unwrap();

    let listen = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let flags = tree.agent_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut agent = start_agent(state.path(), listen, &flags);
    std::fs::write(tree.agent_pid_path(), format!("{}\n", agent.child.id())).unwrap();
    let out = inject_cli(state.path(), &["n1", "agent-kill"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("pid {}", agent.child.id())), "{stdout}");
    let mut status = None;
    assert!(poll_until(Duration::from_secs(5), || {
        status = agent.child.try_wait().unwrap();
        status.is_some()
    }));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.unwrap().signal(), Some(9), "{status:?}");
    assert!(http_get(listen, "/healthz").is_none(), "the agent still answers");
    let faults = tree.faults().unwrap();
    assert_eq!(faults.last().map(|f| f.fault), Some(Fault::AgentKill));

    // Killing it again: it is not running any more.
    let out = inject_cli(state.path(), &["n1", "agent-kill"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"));
}
