//! The agent as Slurm's HealthCheckProgram and Prolog (`fleetmend agent --once --slurm-drain`,
//! `deploy/slurm/healthcheck.sh`, `deploy/slurm/prolog.sh`) and the resumable job template
//! (`deploy/slurm/resumable.sbatch`), against a real Slurm 22.05 cluster: munged, slurmctld and
//! four slurmd on this host (`deploy/slurm/dev-cluster.sh`), one per test, stopped at its end.
//!
//! Needs root and Debian's `slurm-wlm munge`; skipped (with a message) without them, unless
//! `FLEETMEND_REQUIRE_SLURM=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use fleetmend_repairer::scheduler::Scheduler;
use fleetmend_tests::slurm::{DevCluster, can_run, train_events};
use fleetmend_tests::{
    fixture, fixture_flags, fleetmend_bin, poll_until, run_with_timeout, workspace_root,
};
use serde_json::Value;

/// Slurm kills a HealthCheckProgram at 60 s and a Prolog delays the job: the agent's whole run,
/// the drain included, must stay far below.
const RUN_LIMIT: Duration = Duration::from_secs(10);

/// The agent's flags for the healthy fixture tree with the GPU readings of `gpu_case`.
fn agent_flags(gpu_case: &str) -> Vec<String> {
    let mut flags = fixture_flags(&fixture("healthy"));
    flags.retain(|f| !f.starts_with("--gpu="));
    flags.push(format!("--gpu=fixture:{}", fixture(gpu_case).join("gpu.json").display()));
    flags.push(format!("--config={}", fixture("healthy").join("agent.toml").display()));
    flags
}

/// The agent's node name for Slurm's `node`: one of its own per test process, so that runs of
/// parallel tests on the shared fixture tree never share the disk check's probe file.
fn agent_node(node: &str) -> String {
    format!("slurm-agent-{}-{node}", std::process::id())
}

/// `fleetmend agent --once --slurm-drain` as slurmd runs it on `node` (SLURMD_NODENAME); the
/// output and how long it took.
fn drain_self(cluster: &DevCluster, node: &str, gpu_case: &str) -> (Output, Duration) {
    let started = Instant::now();
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(["agent", "--once", "--slurm-drain"])
            .args(agent_flags(gpu_case))
            // The agent's own name differs from Slurm's: SLURMD_NODENAME names the node to drain.
            .arg(format!("--node={}", agent_node(node)))
            .env("SLURMD_NODENAME", node)
            .env("SLURM_CONF", cluster.conf()),
        Duration::from_secs(30),
    );
    (output, started.elapsed())
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn reason_of(cluster: &DevCluster, node: &str) -> Option<String> {
    cluster.reasons().into_iter().find(|(n, _)| n == node).map(|(_, r)| r)
}

#[test]
fn an_unhealthy_node_drains_itself_with_a_fleetmend_reason_in_under_10_s() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let (output, took) = drain_self(&cluster, "node2", "gpu_xid79");
    println!("--once --slurm-drain, unhealthy, drained: {:.2} s", took.as_secs_f64());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(took < RUN_LIMIT, "took {took:?}");
    let reason = reason_of(&cluster, "node2");
    let reason = reason.unwrap_or_else(|| panic!("node2 not in sinfo -R: {:?}", cluster.reasons()));
    assert!(reason.starts_with("fleetmend: "), "{reason}");
    assert!(reason.contains("xid 79 on GPU 3"), "{reason}");
    assert_eq!(cluster.node_state("node2"), "drained");
    assert!(stderr(&output).contains(&format!("drained node2: {reason}")), "{}", stderr(&output));
    // Only this node.
    assert_eq!(cluster.reasons().len(), 1, "{:?}", cluster.reasons());

    // Again: already drained, the first reason stays.
    let (output, took) = drain_self(&cluster, "node2", "gpu_xid48_dbe");
    println!("--once --slurm-drain, unhealthy, already drained: {:.2} s", took.as_secs_f64());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!("node2 already drained: {reason}")),
        "{}",
        stderr(&output)
    );
    assert_eq!(reason_of(&cluster, "node2").as_deref(), Some(reason.as_str()));
}

#[test]
fn plain_once_ignores_slurmd_nodename() {
    // As slurmd's Prolog environment has it: `--once` without --slurm-drain still just checks.
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(["agent", "--once"])
            .args(agent_flags("healthy"))
            .env("SLURMD_NODENAME", "node2")
            .env("SLURM_CONF", "/nonexistent/slurm.conf"),
        Duration::from_secs(30),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("is healthy"));
}

#[test]
fn a_healthy_node_is_left_alone() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let (output, took) = drain_self(&cluster, "node3", "healthy");
    println!("--once --slurm-drain, healthy: {:.2} s", took.as_secs_f64());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(took < RUN_LIMIT, "took {took:?}");
    assert!(!stderr(&output).contains("drained"), "{}", stderr(&output));
    assert_eq!(cluster.node_state("node3"), "idle");
    assert!(cluster.reasons().is_empty(), "{:?}", cluster.reasons());
}

#[test]
fn an_admins_drain_keeps_its_reason() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    cluster.slurm("scontrol", &["update", "NodeName=node4", "State=DRAIN", "Reason=maintenance"]);
    let (output, took) = drain_self(&cluster, "node4", "gpu_xid79");
    println!("--once --slurm-drain, admin-drained node: {:.2} s", took.as_secs_f64());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(took < RUN_LIMIT, "took {took:?}");
    assert!(stderr(&output).contains("node4 already drained: maintenance"), "{}", stderr(&output));
    assert_eq!(reason_of(&cluster, "node4").as_deref(), Some("maintenance"));
    assert_eq!(cluster.node_state("node4"), "drained");
}

#[test]
fn a_node_slurm_does_not_know_is_a_failed_drain_exit_3() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let (output, took) = drain_self(&cluster, "node9", "gpu_xid79");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(took < RUN_LIMIT, "took {took:?}");
    let err = stderr(&output);
    assert!(err.contains("node9 is unhealthy but draining it failed"), "{err}");
    assert!(err.contains("does not know node node9"), "{err}");
    assert!(cluster.reasons().is_empty(), "{:?}", cluster.reasons());
}

/// A script slurmd runs (no PATH, SLURMD_NODENAME set): `script` on the fixture tree, unhealthy
/// (Xid 79) on `sick_node`, healthy elsewhere; each run appends the node's name to `marker`.
fn fixture_wrapper(
    cluster: &DevCluster,
    name: &str,
    script: &str,
    sick_node: &str,
    marker: &Path,
) -> PathBuf {
    let mut healthy = agent_flags("healthy");
    let mut sick = agent_flags("gpu_xid79");
    // The config comes through FLEETMEND_AGENT_CONFIG.
    healthy.retain(|f| !f.starts_with("--config="));
    sick.retain(|f| !f.starts_with("--config="));
    let path = cluster.path().join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n\
             echo \"$SLURMD_NODENAME\" >> {marker}\n\
             if [ \"$SLURMD_NODENAME\" = {sick_node} ]; then args='{sick}'; else args='{healthy}'; fi\n\
             args=\"$args --node={prefix}$SLURMD_NODENAME\"\n\
             FLEETMEND={bin} FLEETMEND_AGENT_CONFIG={config} FLEETMEND_AGENT_ARGS=\"$args\" \
             SLURM_CONF={conf} exec {script}\n",
            marker = marker.display(),
            prefix = agent_node(""),
            sick = sick.join(" "),
            healthy = healthy.join(" "),
            bin = fleetmend_bin().display(),
            config = fixture("healthy").join("agent.toml").display(),
            conf = cluster.conf().display(),
            script = workspace_root().join("deploy/slurm").join(script).display(),
        ),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).unwrap();
    path
}

/// Adds `lines` to the cluster's slurm.conf and makes every daemon read it again.
fn add_to_slurm_conf(cluster: &DevCluster, lines: &str) {
    let mut conf = std::fs::read_to_string(cluster.conf()).unwrap();
    conf.push_str(lines);
    std::fs::write(cluster.conf(), conf).unwrap();
    cluster.slurm("scontrol", &["reconfigure"]);
}

fn marker_has(marker: &Path, node: &str) -> bool {
    std::fs::read_to_string(marker).unwrap_or_default().lines().any(|l| l == node)
}

#[test]
fn slurmd_running_healthcheck_sh_drains_only_the_sick_node() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let marker = cluster.path().join("healthcheck-runs");
    let wrapper = fixture_wrapper(&cluster, "healthcheck", "healthcheck.sh", "node1", &marker);
    add_to_slurm_conf(
        &cluster,
        &format!(
            "HealthCheckProgram={}\nHealthCheckInterval=2\nHealthCheckNodeState=ANY\n",
            wrapper.display()
        ),
    );
    assert!(
        poll_until(Duration::from_secs(30), || {
            reason_of(&cluster, "node1").is_some_and(|r| r.starts_with("fleetmend: "))
        }),
        "node1 not drained by the health check: sinfo -R {:?}, runs {:?}",
        cluster.reasons(),
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    let reason = reason_of(&cluster, "node1").unwrap();
    assert!(reason.contains("xid 79 on GPU 3"), "{reason}");
    // The healthy nodes ran it too and stay in service.
    assert!(
        poll_until(Duration::from_secs(20), || {
            ["node2", "node3", "node4"].iter().all(|n| marker_has(&marker, n))
        }),
        "the health check did not run on every node: {:?}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    assert_eq!(cluster.reasons().len(), 1, "{:?}", cluster.reasons());
    for node in ["node2", "node3", "node4"] {
        assert_eq!(cluster.node_state(node), "idle", "{node}");
    }
}

#[test]
fn prolog_sh_on_a_sick_node_drains_it_and_slurm_requeues_the_job_unheld() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let marker = cluster.path().join("prolog-runs");
    let wrapper = fixture_wrapper(&cluster, "prolog", "prolog.sh", "node2", &marker);
    add_to_slurm_conf(
        &cluster,
        &format!("Prolog={}\nSchedulerParameters=nohold_on_prolog_fail\n", wrapper.display()),
    );
    let out = cluster.path().join("job-%j.out");
    let submit = |node: &str| {
        cluster
            .slurm(
                "sbatch",
                &[
                    "--parsable",
                    "--requeue",
                    "-w",
                    node,
                    "-o",
                    out.to_str().unwrap(),
                    "--wrap",
                    "true",
                ],
            )
            .trim()
            .to_owned()
    };
    // slurmd takes the new Prolog a moment after `scontrol reconfigure`: a healthy node's job
    // runs it once it does (each probe job is done in well under a second).
    let mut probe = submit("node1");
    assert!(
        poll_until(Duration::from_secs(20), || {
            if marker_has(&marker, "node1") {
                return true;
            }
            let state = cluster.slurm("squeue", &["-h", "-t", "all", "-j", &probe, "-o", "%T"]);
            if state.trim() == "COMPLETED" {
                probe = submit("node1");
            }
            false
        }),
        "the Prolog never ran on node1: squeue {}",
        cluster.slurm("squeue", &["-t", "all"])
    );
    // The healthy node's job runs; the node stays in service.
    assert_eq!(reason_of(&cluster, "node1"), None);

    let job = submit("node2");
    assert!(
        poll_until(Duration::from_secs(20), || {
            reason_of(&cluster, "node2").is_some_and(|r| r.starts_with("fleetmend: "))
        }),
        "node2 not drained by the Prolog: sinfo -R {:?}, squeue {}",
        cluster.reasons(),
        cluster.slurm("squeue", &["-t", "all"])
    );
    assert!(reason_of(&cluster, "node2").unwrap().contains("xid 79 on GPU 3"));
    // Slurm's own "Prolog error" drain did not replace fleetmend's reason, and the job went back
    // to the queue (not held, not run).
    let requeued = || {
        let show = cluster.slurm("scontrol", &["show", "job", &job]);
        show.contains("JobState=PENDING") && show.contains("Restarts=1")
    };
    assert!(
        poll_until(Duration::from_secs(20), requeued),
        "{}",
        cluster.slurm("scontrol", &["show", "job", &job])
    );
    let show = cluster.slurm("scontrol", &["show", "job", &job]);
    assert!(!show.contains("held"), "{show}");
    assert!(reason_of(&cluster, "node2").unwrap().starts_with("fleetmend: "));
    cluster.slurm("scancel", &[&job]);
}

/// The trainer's smallest settings: a few milliseconds a step.
const TINY_MODEL: &str = "--model-dim 16 --layers 1 --heads 2 --context 16 --batch-size 2";

fn step_dirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("step-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_resumable_sbatch_template_trains_on_two_nodes_to_done() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let checkpoints = cluster.path().join("checkpoints");
    let started = Instant::now();
    let (job, out) = cluster.submit_resumable(
        &checkpoints,
        6,
        2,
        &format!("{TINY_MODEL} --progress-interval 0s"),
    );
    let finished = poll_until(Duration::from_secs(40), || {
        matches!(cluster.job_state(&job).as_str(), "COMPLETED" | "FAILED" | "CANCELLED")
    });
    let output = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(finished, "job {job} not done in 40 s: {}\n{output}", cluster.job_state(&job));
    assert_eq!(cluster.job_state(&job), "COMPLETED", "{output}");
    println!("resumable.sbatch, 2 nodes, 6 steps: {:.2} s", started.elapsed().as_secs_f64());

    assert!(output.contains(&format!("fleetmend-train: job {job} restart 0 on node")), "{output}");
    let starts = train_events(&out, "start");
    let mut ranks: Vec<u64> = starts.iter().map(|s| s["rank"].as_u64().unwrap()).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1], "{output}");
    assert!(starts.iter().all(|s| s["world_size"] == 2), "{output}");
    let done = train_events(&out, "done");
    assert!(!done.is_empty(), "no done line: {output}");
    assert!(done.iter().all(|d| d["step"] == 6), "{output}");
    assert_eq!(step_dirs(&checkpoints), ["step-00000002", "step-00000004", "step-00000006"]);
    for step in step_dirs(&checkpoints) {
        assert!(checkpoints.join(&step).join("manifest.json").is_file(), "{step}");
    }
    // The checkpoints carry the protocol's job id: Slurm's.
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoints.join("step-00000006/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["job_id"], job.as_str());
    assert_eq!(manifest["world_size"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resumable_job_checkpoints_on_usr1_at_its_batch_script_and_resumes_after_a_requeue() {
    if !can_run() {
        return;
    }
    let cluster = DevCluster::start();
    let checkpoints = cluster.path().join("checkpoints");
    // Long enough never to finish here; checkpoints only when asked (0); paced, so that it
    // leaves the cores to the tests beside it while it waits for the signals.
    let (job, out) = cluster.submit_resumable(
        &checkpoints,
        10_000_000,
        0,
        &format!("{TINY_MODEL} --progress-interval 1s --pace 50ms"),
    );
    let output = || std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        poll_until(Duration::from_secs(30), || {
            train_events(&out, "progress").iter().any(|p| p["rank"] == 0)
        }),
        "the job did not start training: {} {}",
        cluster.job_state(&job),
        output()
    );
    assert!(step_dirs(&checkpoints).is_empty(), "{:?}", step_dirs(&checkpoints));

    // SIGUSR1 at the batch script only (as `--signal=B:USR1@60` sends it): forwarded to the
    // ranks, rank 0 writes a checkpoint and training goes on.
    cluster.slurm("scancel", &["--signal=USR1", "--batch", &job]);
    assert!(
        poll_until(Duration::from_secs(20), || !train_events(&out, "checkpoint").is_empty()),
        "no checkpoint after SIGUSR1 at the batch script: {}",
        output()
    );
    let first = train_events(&out, "checkpoint")[0]["step"].as_u64().unwrap();
    assert_eq!(cluster.job_state(&job), "RUNNING");

    // The repairer's requeue: the ranks get SIGTERM, checkpoint and stop; the job runs again with
    // restart count 1 and resumes from the newest checkpoint.
    cluster.scheduler().requeue(&job).await.unwrap();
    assert!(
        poll_until(Duration::from_secs(30), || {
            output().contains(&format!("fleetmend-train: job {job} restart 1 on node"))
                && train_events(&out, "start").len() >= 4
        }),
        "the job did not start again: {} {}",
        cluster.job_state(&job),
        output()
    );
    let newest = step_dirs(&checkpoints).last().cloned().unwrap();
    let newest: u64 = newest.trim_start_matches("step-").parse().unwrap();
    assert!(newest >= first, "{newest} < {first}");
    let resumed: Vec<u64> = train_events(&out, "start")[2..]
        .iter()
        .map(|s| s["start_step"].as_u64().unwrap())
        .collect();
    assert_eq!(resumed, [newest, newest], "{}", output());
    assert!(
        poll_until(Duration::from_secs(20), || {
            train_events(&out, "progress").iter().any(|p| p["attempt"] == 1)
        }),
        "{}",
        output()
    );
    cluster.slurm("scancel", &[&job]);
}
