//! The allreduce probe in the repairer, against scripted agents that answer its `allreduce`
//! commands with a bandwidth: idle nodes are measured into a fleet median; a node measured low
//! with two peers gets `allreduce_slow` and is drained, and put back once it measures well; with
//! `on_validate`, a repaired node that measures low fails its validation though its deep check
//! passed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fleetmend_proto::command_kind;
use fleetmend_repairer::model::NodeState;
use fleetmend_repairer::provider::ProviderCall;
use support::{Expect, Harness, metric, names, xid};

use NodeState::{Drained, Healthy};

fn probing(config: &mut fleetmend_repairer::config::RepairerConfig, on_validate: bool) {
    config.allreduce.every = Duration::from_millis(300);
    config.allreduce.on_validate = on_validate;
    config.allreduce.min_samples = 3;
    config.allreduce.timeout = Duration::from_secs(10);
}

async fn passes(h: &Harness) -> f64 {
    metric(&h.metrics().await, "fleetmend_allreduce_probes_total{result=\"pass\"}").unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_slow_with_two_peers_is_drained_and_put_back_once_it_measures_well() {
    let h = Harness::start(|c| probing(c, false)).await;
    let agents = h.fleet(&names("n", 4)).await;
    h.eventually("a fleet median", async || (passes(&h).await >= 3.0).then_some(())).await;
    let median = metric(&h.metrics().await, "fleetmend_allreduce_fleet_busbw_gbps");
    assert_eq!(median, Some(10.0));

    agents[2].set_allreduce_gbps(1.0);
    let drained =
        h.wait_event(Some("n3"), &Expect::transition("n3", Healthy, NodeState::Draining)).await;
    let finding = drained.findings.first().expect("the finding that drained it");
    assert_eq!((finding.check.as_str(), finding.finding.as_str()), ("allreduce", "allreduce_slow"));
    assert!(finding.message.contains("0.10 ×"), "{}", finding.message);
    h.wait_state("n3", Drained).await;
    for other in ["n1", "n2", "n4"] {
        assert_eq!(h.state(other).await, Some(Healthy), "{other}");
    }
    // Only the allreduce commands went out to the slow node: nothing else was done to it.
    let kinds: Vec<String> = agents[2].commands().into_iter().map(|c| c.kind).collect();
    assert!(kinds.iter().all(|k| k == command_kind::ALLREDUCE), "{kinds:?}");

    agents[2].set_allreduce_gbps(9.0);
    h.wait_state("n3", Healthy).await;
    assert!(h.provider.calls().is_empty(), "nothing was rebooted: {:?}", h.provider.calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_validate_a_repaired_node_that_measures_low_fails_its_validation() {
    let h = Harness::start(|c| probing(c, true)).await;
    let agents = h.fleet(&names("n", 5)).await;
    // Enough that n1 is judged against at least three measurements it took no part in.
    h.eventually("a fleet median", async || (passes(&h).await >= 10.0).then_some(())).await;

    // n1's GPU falls off the bus; the reboot brings it back with a slow NIC.
    let n1 = &agents[0];
    n1.set_allreduce_gbps_after_reboot(2.0);
    n1.set_findings(vec![xid("79")]);
    n1.report().await;
    h.eventually("n1 to be replaced", async || {
        h.provider.calls().contains(&ProviderCall::Replace("n1".to_owned())).then_some(())
    })
    .await;
    let events = h.events_of("n1").await;
    let failed = events
        .iter()
        .find(|e| e.reason.contains("validation failed"))
        .unwrap_or_else(|| panic!("n1 did not fail its validation: {events:#?}"));
    assert!(
        failed.reason.contains("validation failed")
            && failed.reason.contains("allreduce: 2.000 GB/s"),
        "{}",
        failed.reason
    );
    assert!(failed.reason.contains("healthy"), "the deep check itself passed: {}", failed.reason);
}
