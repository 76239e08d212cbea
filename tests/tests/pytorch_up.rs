//! A real PyTorch job on the local fleet (`fleetmend up -- COMMAND`): the `fleetmend` Python
//! package's DDP example (deploy/examples/pytorch/train_ddp.py, CPU, gloo), one rank on each of
//! two nodes, under the embedded queue. A persistent Xid 79 under rank 1 mid-job: the node is
//! drained, the job checkpoints at the signal (SIGUSR1, then SIGTERM: both ranks at the same
//! step), resumes at once on a hot spare, the node is rebooted and then replaced, and the job
//! completes with the final weights of an uninterrupted run of the same command, 0 steps lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use fleetmend_local::scenario::{self, Expect, Scenario};
use fleetmend_local::up::{Fleet, FleetConfig};
use fleetmend_tests::netns::story;
use fleetmend_tests::{fleetmend_bin, torch_python, workspace_root};

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

#[test]
fn a_torch_job_checkpoints_at_a_persistent_xid_79_resumes_on_a_spare_and_keeps_the_bits() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let scenario = Scenario::parse(SCENARIO, Path::new("torch.toml")).unwrap();
        let root = workspace_root();
        let command = vec![
            "env".to_owned(),
            format!("PYTHONPATH={}", root.join("python").display()),
            "PYTHONDONTWRITEBYTECODE=1".to_owned(),
            "OMP_NUM_THREADS=1".to_owned(),
            torch_python().display().to_string(),
            root.join("deploy/examples/pytorch/train_ddp.py").display().to_string(),
            "--steps=120".to_owned(),
            "--checkpoint-every=20".to_owned(),
            "--step-seconds=0.05".to_owned(),
        ];
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
