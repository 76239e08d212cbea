//! The Slurm scheduler backend and the `slurm` provider against a real Slurm 22.05 cluster:
//! munged, slurmctld and four slurmd on this host (`deploy/slurm/dev-cluster.sh`, whose fake
//! RebootProgram gives a rebooted node a new boot id and restarts its slurmd), in a temp dir,
//! stopped at the end.
//!
//! Needs root and Debian's `slurm-wlm munge`. Without root it is skipped (with a message); without
//! Slurm it is skipped too unless `FLEETMEND_REQUIRE_SLURM=1` (set where Slurm is installed for
//! it), which turns a missing Slurm into a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use fleetmend_repairer::provider::{PowerState, Provider};
use fleetmend_repairer::scheduler::slurm::{SlurmConfig, SlurmScheduler};
use fleetmend_repairer::scheduler::{Scheduler, SchedulerError, UndrainOutcome};
use fleetmend_tests::slurm::{DevCluster, can_run};
use fleetmend_tests::{poll_until, poll_until_async};

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

    // A hot spare that turns faulty loses its spare reason: it must never be handed a job.
    slurm.drain("node2", "fleetmend: spare").await.unwrap();
    slurm.drain("node2", "fleetmend: nic down").await.unwrap();
    assert!(
        cluster.reasons().contains(&("node2".to_owned(), "fleetmend: nic down".to_owned())),
        "sinfo -R: {:?}",
        cluster.reasons()
    );
    assert_eq!(slurm.undrain("node2").await.unwrap(), UndrainOutcome::Undrained);
    assert!(
        poll_until(Duration::from_secs(15), || cluster.node_state("node2") == "idle"),
        "node2 after undrain: {}",
        cluster.node_state("node2")
    );

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slurm_provider_reboots_a_node_through_slurm() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let slurm = cluster.scheduler();
    let provider = cluster.provider();
    let reason = "fleetmend: xid 79 (GPU fell off the bus)";
    slurm.drain("node2", reason).await.unwrap();
    assert_eq!(provider.power_state("node2").await.unwrap(), PowerState::On);
    let boot_before = cluster.boot_id("node2");
    let slurmd_before = cluster.slurmd_pid("node2").expect("slurmd of node2 runs");
    let other_boot = cluster.boot_id("node3");

    let asked = Instant::now();
    provider.reboot("node2").await.unwrap();
    // The RebootProgram ran for node2 (a new boot id) and for no other node.
    assert!(
        poll_until(Duration::from_secs(30), || cluster.boot_id("node2") != boot_before),
        "node2 kept its boot id; scontrol: {:?}",
        cluster.show_node("node2")
    );
    assert_eq!(cluster.boot_id("node3"), other_boot);
    let boot_after = cluster.boot_id("node2");
    // Its slurmd was restarted (as rebooted: -b).
    assert!(
        poll_until(Duration::from_secs(30), || {
            cluster.slurmd_pid("node2").is_some_and(|pid| pid != slurmd_before)
        }),
        "slurmd of node2 was not restarted: {:?}",
        cluster.slurmd_pid("node2")
    );
    let log = std::fs::read_to_string(cluster.path().join("log/reboot-node2.log")).unwrap();
    assert!(log.contains(&boot_after), "{log}");

    // Back: Slurm saw the reboot complete (no reboot flags, slurmd answering) and keeps it out of
    // service (DOWN) with fleetmend's reason until fleetmend undrains it.
    assert!(
        poll_until(Duration::from_secs(60), || cluster.show_node("node2").state == "DOWN"),
        "node2 did not come back from the reboot: {:?}",
        cluster.show_node("node2")
    );
    let back = asked.elapsed();
    println!(
        "reboot through Slurm → node2 back (down, fleetmend's) in {:.2} s",
        back.as_secs_f64()
    );
    let node = cluster.show_node("node2");
    assert!(node.reason.as_deref().is_some_and(|r| r.starts_with(reason)), "{node:?}");
    assert!(
        cluster.reasons().iter().any(|(n, r)| n == "node2" && r.starts_with("fleetmend: xid 79")),
        "sinfo -R: {:?}",
        cluster.reasons()
    );
    assert_eq!(provider.power_state("node2").await.unwrap(), PowerState::On);
    // It stays out: Slurm does not return it to service by itself (nextstate=RESUME would have
    // made it idle within about 2 s of coming back).
    assert!(
        !poll_until(Duration::from_secs(5), || cluster.node_state("node2") == "idle"),
        "Slurm put node2 back in service before fleetmend undrained it"
    );
    assert_eq!(cluster.node_state("node2"), "down");

    // fleetmend's undrain (the node's reason is fleetmend's) returns it to idle.
    assert_eq!(slurm.undrain("node2").await.unwrap(), UndrainOutcome::Undrained);
    assert!(
        poll_until(Duration::from_secs(15), || cluster.node_state("node2") == "idle"),
        "node2 after undrain: {}",
        cluster.node_state("node2")
    );
    assert_eq!(cluster.boot_id("node2"), boot_after);
    let err = provider.replace("node2").await.unwrap_err().to_string();
    assert!(err.contains("not supported"), "{err}");
}

/// A `scontrol` in `dir` that counts its calls in `dir/calls`, then runs Slurm's.
fn counting_scontrol(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let real = ["/usr/bin/scontrol", "/usr/local/bin/scontrol"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("scontrol");
    let script =
        format!("#!/bin/sh\necho x >> {}\nexec {real} \"$@\"\n", dir.join("calls").display());
    let path = dir.join("scontrol");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn calls(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("calls")).unwrap_or_default().lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_while_slurmctld_is_stopped_is_retried_and_done_once_it_is_back() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let reason = "fleetmend: xid 48 (double bit ECC error)";
    cluster.stop_controller();

    // A short retry window: the drain is tried more than once, then fails naming the controller.
    // (Each Slurm client call itself spends ~9 s trying to connect before it gives up.)
    let bin = tempfile::tempdir().unwrap();
    counting_scontrol(bin.path());
    let config = SlurmConfig { bin_dir: Some(bin.path().to_owned()), ..cluster.slurm_config() };
    let short = SlurmScheduler::new(SlurmConfig {
        controller_retry_for: Duration::from_secs(15),
        controller_retry_max_backoff: Duration::from_millis(500),
        ..config.clone()
    });
    let started = Instant::now();
    let err = short.drain("node2", reason).await.unwrap_err().to_string();
    assert!(err.contains("Unable to contact slurm controller"), "{err}");
    assert!(err.contains("slurmctld unreachable; gave up after"), "{err}");
    assert!(calls(bin.path()) >= 2, "not retried: {} call(s); {err}", calls(bin.path()));
    assert!(started.elapsed() < Duration::from_secs(50), "{:?}", started.elapsed());
    println!("while slurmctld is stopped: {err}");

    // A long retry window: the drain waits for the controller and is done once it is back.
    let before = calls(bin.path());
    let long = SlurmScheduler::new(SlurmConfig {
        controller_retry_for: Duration::from_secs(120),
        controller_retry_max_backoff: Duration::from_millis(500),
        ..config
    });
    let drain = tokio::spawn(async move { long.drain("node2", reason).await });
    assert!(
        poll_until_async(Duration::from_secs(40), || calls(bin.path()) >= before + 2).await,
        "the drain was not retried while slurmctld was stopped: {} call(s)",
        calls(bin.path()) - before
    );
    assert!(!drain.is_finished(), "the drain ended while slurmctld was stopped");
    cluster.start_controller();
    let back = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), drain)
        .await
        .expect("the drain did not end within 60 s of slurmctld being back")
        .unwrap()
        .unwrap();
    println!(
        "drain done {:.2} s after slurmctld was back ({} scontrol calls)",
        back.elapsed().as_secs_f64(),
        calls(bin.path()) - before
    );
    let reasons = cluster.reasons();
    assert!(reasons.contains(&("node2".to_owned(), reason.to_owned())), "sinfo -R: {reasons:?}");
    assert_eq!(cluster.node_state("node2"), "drained");
}
