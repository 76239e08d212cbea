//! The Slurm scheduler backend against a real Slurm 22.05 cluster: munged, slurmctld and four
//! slurmd on this host (`deploy/slurm/dev-cluster.sh`), in a temp dir, stopped at the end.
//!
//! Needs root and Debian's `slurm-wlm munge`. Without root it is skipped (with a message); without
//! Slurm it is skipped too unless `FLEETMEND_REQUIRE_SLURM=1` (set where Slurm is installed for
//! it), which turns a missing Slurm into a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use fleetmend_repairer::scheduler::{Scheduler, SchedulerError, UndrainOutcome};
use fleetmend_tests::poll_until;
use fleetmend_tests::slurm::{DevCluster, can_run};

/// A resumable batch job: writes `start <restart count>` when it starts and `usr1` when SIGUSR1
/// arrives (where a real job would write a checkpoint).
const BATCH_SCRIPT: &str = r#"#!/bin/bash
trap 'echo usr1 >> "$MARKER"' USR1
echo "start ${SLURM_RESTART_COUNT:-0}" >> "$MARKER"
for _ in $(seq 1 3000); do sleep 0.1; done
"#;

fn marker_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slurm_backend_drains_undrains_signals_and_requeues_real_slurm() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let slurm = cluster.scheduler();

    // Drain node2: `sinfo -R` shows fleetmend's reason.
    slurm.drain("node2", "fleetmend: xid 79 (GPU fell off the bus)").await.unwrap();
    let reasons = cluster.reasons();
    assert!(
        reasons
            .contains(&("node2".to_owned(), "fleetmend: xid 79 (GPU fell off the bus)".to_owned())),
        "sinfo -R: {reasons:?}"
    );
    assert_eq!(cluster.node_state("node2"), "drained");
    // Draining again is a no-op and keeps the first reason.
    slurm.drain("node2", "fleetmend: another finding").await.unwrap();
    assert!(cluster.reasons().iter().any(|(n, r)| n == "node2" && r.contains("xid 79")));

    // Undrain: node2 is idle again (it may read `idle*` for a moment).
    assert_eq!(slurm.undrain("node2").await.unwrap(), UndrainOutcome::Undrained);
    assert!(
        poll_until(Duration::from_secs(15), || cluster.node_state("node2") == "idle"),
        "node2 after undrain: {}",
        cluster.node_state("node2")
    );
    assert_eq!(slurm.undrain("node2").await.unwrap(), UndrainOutcome::NotDrained);

    // An admin's drain is never undone, and fleetmend's drain does not take over its reason.
    cluster.slurm("scontrol", &["update", "NodeName=node3", "State=DRAIN", "Reason=maintenance"]);
    slurm.drain("node3", "fleetmend: test").await.unwrap();
    assert_eq!(
        slurm.undrain("node3").await.unwrap(),
        UndrainOutcome::DrainedByOther("maintenance".to_owned())
    );
    assert_eq!(cluster.node_state("node3"), "drained");
    assert!(cluster.reasons().contains(&("node3".to_owned(), "maintenance".to_owned())));

    // Unknown names are typed errors.
    assert!(matches!(
        slurm.drain("node9", "fleetmend: x").await,
        Err(SchedulerError::UnknownNode { .. })
    ));
    assert!(matches!(slurm.requeue("999999").await, Err(SchedulerError::UnknownJob { .. })));

    // A real job on node1: jobs_on finds it there and nowhere else.
    let script = cluster.path().join("job.sh");
    std::fs::write(&script, BATCH_SCRIPT).unwrap();
    let marker = cluster.path().join("marker");
    let out = cluster.path().join("job-%j.out");
    let job = cluster
        .slurm(
            "sbatch",
            &[
                "--parsable",
                "--requeue",
                "--open-mode=append",
                "-w",
                "node1",
                "-o",
                out.to_str().unwrap(),
                &format!("--export=ALL,MARKER={}", marker.display()),
                script.to_str().unwrap(),
            ],
        )
        .trim()
        .to_owned();
    assert!(
        poll_until(Duration::from_secs(20), || marker_lines(&marker) == ["start 0"]),
        "the job did not start: {:?}, squeue: {}",
        marker_lines(&marker),
        cluster.slurm("squeue", &["-t", "all"])
    );
    let jobs = slurm.jobs_on("node1").await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].id, job);
    assert_eq!(jobs[0].nodes, ["node1"]);
    assert!(slurm.jobs_on("node4").await.unwrap().is_empty());

    // Checkpoint: SIGUSR1 reaches the batch script.
    slurm.checkpoint(&job).await.unwrap();
    assert!(
        poll_until(Duration::from_secs(10), || marker_lines(&marker).contains(&"usr1".to_owned())),
        "no USR1 at the batch script: {:?}",
        marker_lines(&marker)
    );

    // Requeue: the job runs again (its restart count 1) at once, not after Slurm's ~120 s.
    let requeued = Instant::now();
    slurm.requeue(&job).await.unwrap();
    let restarted = poll_until(Duration::from_secs(20), || {
        marker_lines(&marker).contains(&"start 1".to_owned())
    });
    let took = requeued.elapsed();
    let state = cluster.slurm("squeue", &["-h", "-t", "all", "-j", &job, "-o", "%T %r %S"]);
    assert!(restarted, "the requeued job did not run again within 20 s: {state}");
    assert!(took < Duration::from_secs(10), "the requeued job ran again only after {took:?}");
    println!("requeue → running again in {:.2} s", took.as_secs_f64());
    assert!(
        poll_until(Duration::from_secs(10), || {
            cluster.slurm("squeue", &["-h", "-j", &job, "-o", "%T"]).trim() == "RUNNING"
        }),
        "squeue: {}",
        cluster.slurm("squeue", &["-h", "-t", "all", "-j", &job, "-o", "%T %r"])
    );
    cluster.slurm("scancel", &[&job]);
}
