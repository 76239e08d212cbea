//! A real PyTorch job on the local fleet (`fleetmend up -- COMMAND`): the `fleetmend` Python
//! package's DDP example (deploy/examples/pytorch/train_ddp.py, CPU, gloo), one rank on each of
//! two nodes, under the embedded queue.
//! - A persistent Xid 79 under rank 1 mid-job: the node is drained, the job checkpoints at the
//!   signal (SIGUSR1, then SIGTERM: both ranks at the same step), resumes at once on a hot spare,
//!   the node is rebooted and then replaced, and the job completes with the final weights of an
//!   uninterrupted run of the same command, 0 steps lost.
//! - A rank stopped with SIGSTOP: the queue finds the job hung from the package's progress
//!   heartbeats within 30 s, names the rank, restarts the job from its newest checkpoint, and it
//!   completes with the uninterrupted run's weights.
//! - A rank throttled to half its CPU (a cgroup's cpu.max): the package times each rank's own
//!   compute apart from the collectives, and the queue finds the straggler within 60 s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use fleetmend_local::scenario::{self, Expect, Scenario};
use fleetmend_local::up::{Fleet, FleetConfig};
use fleetmend_tests::netns::story;
use fleetmend_tests::{Up, fleetmend_bin, poll_until, torch_python, workspace_root};

const SCENARIO: &str = r#"
name = "torch-xid-79"
description = "a persistent Xid 79 under a PyTorch job's rank 1"
timeout = "10m"
settle_timeout = "90s"
compare_hash = true

[fleet]
nodes = 2
spares = 2

[[faults]]
at_step = 40
node = "rank:1"
fault = "gpu-xid:79"
persistent = true
expect = "replace"
"#;

/// The example's command, run as each rank (the package from the source tree).
fn torch_job(args: &[&str]) -> Vec<String> {
    let root = workspace_root();
    let mut command = vec![
        "env".to_owned(),
        format!("PYTHONPATH={}", root.join("python").display()),
        "PYTHONDONTWRITEBYTECODE=1".to_owned(),
        "OMP_NUM_THREADS=1".to_owned(),
        torch_python().display().to_string(),
        root.join("deploy/examples/pytorch/train_ddp.py").display().to_string(),
    ];
    command.extend(args.iter().map(|a| (*a).to_owned()));
    command
}

#[test]
fn a_torch_job_checkpoints_at_a_persistent_xid_79_resumes_on_a_spare_and_keeps_the_bits() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let scenario = Scenario::parse(SCENARIO, Path::new("torch.toml")).unwrap();
        let command = torch_job(&["--steps=120", "--checkpoint-every=20", "--step-seconds=0.05"]);
        let mut config = FleetConfig {
            boot_delay: Duration::from_millis(500),
            command,
            ..FleetConfig::new(dir.path().join("state"), fleetmend_bin())
        };
        scenario.configure(&mut config);
        let fleet = Fleet::start(config).await.unwrap();
        let mut progress = Vec::new();
        let run = scenario::run(&fleet, &scenario, &mut progress).await;
        let progress = String::from_utf8_lossy(&progress).into_owned();
        let events = serde_json::to_value(fleet.events(0, 100_000).unwrap()).unwrap();
        let story = story(events.as_array().unwrap());
        fleet.shutdown().await;
        let summary =
            run.unwrap_or_else(|err| panic!("the scenario failed: {err}\n{progress}\n{story}"));
        let context = format!("{}\n{progress}\nevents:\n{story}", summary.render());
        assert!(summary.passed, "{context}");
        let fault = &summary.faults[0];
        assert_eq!(fault.rank, Some(1), "{context}");
        assert_eq!((fault.expect, fault.expectation_met), (Some(Expect::Replace), Some(true)));
        assert_eq!(fault.steps_lost, Some(0), "checkpointed at the signal: {context}");
        assert_eq!(summary.hash_matches, Some(true), "{context}");
    });
}

const LIMIT: Duration = Duration::from_secs(120);

/// The uninterrupted run's weights of `job` with `ranks` ranks.
fn straight_hash(job: &[String], ranks: u32) -> String {
    let reference = tempfile::tempdir().unwrap();
    fleetmend_tests::uninterrupted_hash(reference.path(), job.to_vec(), ranks, LIMIT)
}

/// `fleetmend up` of `job` on 2 nodes and a hot spare, once the job trains past step 20.
fn up_training(dir: &Path, job: &[String]) -> Up {
    let mut args = vec!["--nodes", "2", "--spares", "1", "--collective-timeout", "600s", "--"];
    args.extend(job.iter().map(String::as_str));
    let up = Up::start(dir, &dir.join("state"), &args);
    let training = poll_until(LIMIT, || {
        up.stdout().lines().rev().find(|l| l.contains("job j-1 running")).is_some_and(|l| {
            l.split_once(", step ")
                .and_then(|(_, rest)| rest.split('/').next()?.parse::<u64>().ok())
                .is_some_and(|step| step >= 20)
        })
    });
    assert!(training, "the job did not train:\n{}", up.output());
    up
}

/// `fleetmend inject` of `fault` on node-2; what it said.
fn inject(dir: &Path, fault: &str) -> String {
    Up::inject(&dir.join("state"), "node-2", fault)
}

#[test]
fn a_stopped_torch_rank_is_found_hung_from_its_heartbeats_and_the_job_resumes() {
    let job = torch_job(&["--steps=150", "--checkpoint-every=10", "--step-seconds=0.1"]);
    let straight = straight_hash(&job, 2);
    let dir = tempfile::tempdir().unwrap();
    let mut up = up_training(dir.path(), &job);
    let said = inject(dir.path(), "hang");
    assert!(said.contains("SIGSTOP"), "{said}");
    let stopped_at = Instant::now();
    let decided = poll_until(Duration::from_secs(40), || up.stdout().contains("job-hung"));
    let took = stopped_at.elapsed();
    assert!(decided, "no hang decided:\n{}", up.output());
    assert!(took <= Duration::from_secs(30), "decided after {took:?}:\n{}", up.output());
    let text = up.stdout();
    let hung = text.lines().find(|l| l.contains("job-hung")).unwrap_or_default();
    assert!(hung.contains("on node-2"), "the stopped rank is named: {hung}");
    up.completes_with(LIMIT * 2, &straight, &["restarts 1", "after: hung"]);
}

#[test]
fn a_torch_rank_throttled_to_half_its_cpu_is_a_straggler() {
    // Every step computed (a batch of 2,048), so the throttle slows the rank's own compute.
    let job = torch_job(&["--steps=100000", "--checkpoint-every=100", "--batch-size=2048"]);
    let dir = tempfile::tempdir().unwrap();
    let mut up = up_training(dir.path(), &job);
    let said = inject(dir.path(), "slow:50");
    assert!(said.contains("throttled"), "{said}");
    let throttled_at = Instant::now();
    let found = poll_until(Duration::from_secs(70), || up.stdout().contains("job-straggler"));
    let took = throttled_at.elapsed();
    assert!(found, "no straggler found:\n{}", up.output());
    assert!(took <= Duration::from_secs(60), "found after {took:?}:\n{}", up.output());
    let text = up.stdout();
    let line = text.lines().find(|l| l.contains("job-straggler")).unwrap_or_default();
    assert!(line.contains("node-2 job-straggler"), "{line}");
    up.signal("INT");
    assert!(up.wait(Up::STOP_LIMIT).is_some(), "fleetmend up did not stop:\n{}", up.output());
}
