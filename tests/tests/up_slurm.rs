//! `fleetmend up --scheduler slurm`: the local fleet on a Slurm dev cluster it starts itself. The
//! repairer drives Slurm, the job is an sbatch job of `resumable.sbatch`; a fault injected into
//! a node under the job drains it in Slurm, the job is requeued, resumes once the node is back,
//! and `up` exits 0 with the uninterrupted run's weights. Everything it started is stopped.
//!
//! Needs root and Debian's `slurm-wlm munge` (see tests/src/slurm.rs for when it is skipped).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use fleetmend_tests::slurm::can_run;
use fleetmend_tests::{Up, fleetmend_bin, poll_until, run_with_timeout, uninterrupted_hash};

const STEPS: u64 = 120;
const LIMIT: Duration = Duration::from_secs(100);

#[test]
fn up_on_slurm_drains_requeues_and_resumes_the_job_through_slurm_after_a_fault() {
    if !can_run() {
        return;
    }
    // The trainer flags `fleetmend up` gives the job (3 ranks, seed 0).
    let reference = tempfile::tempdir().unwrap();
    let argv: Vec<String> = [
        fleetmend_bin().display().to_string(),
        "train".to_owned(),
        "--steps".to_owned(),
        STEPS.to_string(),
        "--checkpoint-every".to_owned(),
        "10".to_owned(),
        "--seed".to_owned(),
        "0".to_owned(),
    ]
    .into();
    let straight = uninterrupted_hash(reference.path(), argv, 3, LIMIT);

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let steps = STEPS.to_string();
    let mut up = Up::start(
        dir.path(),
        &state,
        &["--scheduler", "slurm", "--checkpoint-every", "10", "--steps", &steps],
    );

    // The job trains on Slurm's nodes, node-2 among them.
    let training = poll_until(LIMIT, || {
        up.stdout()
            .lines()
            .any(|l| l.contains("Slurm job") && l.contains("RUNNING") && l.contains("step "))
    });
    assert!(training, "the Slurm job did not train:\n{}", up.output());
    assert!(
        up.stdout().contains("Slurm nodes: node-1=node1 node-2=node2 node-3=node3 node-4=node4"),
        "{}",
        up.output()
    );
    let injected = run_with_timeout(
        Command::new(fleetmend_bin())
            .arg("inject")
            .arg("--state-dir")
            .arg(&state)
            .args(["node-2", "gpu-xid:79"]),
        Duration::from_secs(20),
    );
    assert!(injected.status.success(), "{}", String::from_utf8_lossy(&injected.stderr));

    let status = up.wait(LIMIT * 2);
    let status = status.unwrap_or_else(|| panic!("fleetmend up did not finish:\n{}", up.output()));
    let text = up.stdout();
    assert!(status.success(), "fleetmend up: {status}\n{}", up.output());
    // Drained, requeued through Slurm, resumed once node-2 was repaired.
    for expected in [
        "node-2 state-changed healthy -> draining",
        "node-2 workflow-step: step Requeue",
        "restarts 1",
        "node-2 repair-finished: reboot repaired and validated",
        "COMPLETED",
    ] {
        assert!(text.contains(expected), "no {expected:?} in:\n{}", up.output());
    }
    let done = text.lines().find(|l| l.contains("completed: step")).unwrap_or_default();
    assert!(done.ends_with(&format!("weights sha256 {straight}")), "{done}\n{}", up.output());
    // The dev cluster went with it.
    let pid_file = state.join("slurm/run/slurmctld.pid");
    let pid = std::fs::read_to_string(&pid_file).unwrap_or_default();
    assert!(
        pid.trim().is_empty() || !std::path::Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "slurmctld ({}) still runs after up exited",
        pid.trim()
    );
}
