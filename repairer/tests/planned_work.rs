//! What the noise soak (`fleetmend simulate --noise`) found the repairer doing to healthy nodes,
//! each held here against the HTTP repairer:
//! - a check's one run, carried again by reports sent for other reasons, counted as several
//!   observations (a 5-second link flap drained nodes);
//! - a node a person drained to reboot went unreachable while it was down, and the repairer would
//!   reboot it through the provider;
//! - the nodes of a driver upgrade's batch, back from their reboot with links still training,
//!   opened the storm breaker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use fleetmend_repairer::clock::unix_now_ms;
use fleetmend_repairer::model::{EventKind, NodeState};
use support::{Expect, Harness, count, describe, names, nic_down};

use NodeState::{Drained, Healthy, Suspect};

/// An InfiniBand port still waiting for its subnet manager after a boot.
fn ib_port_down() -> Finding {
    Finding::new(
        "nic",
        "ib_port_down",
        "mlx5_0/1",
        Status::Fail,
        RecommendedAction::Drain,
        "mlx5_0 port 1 is INIT",
    )
}

/// A rule's decision on `node` (a person's drain is the person's, not a rule's).
fn rule_decisions(node: &str) -> Expect {
    Expect::kind(EventKind::Decision).node(node).reason("observation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_of_a_check_carried_by_several_reports_is_one_observation() {
    let h = Harness::start(|_| {}).await;
    let agents = h.fleet(&names("n", 3)).await;
    let n1 = &agents[0];
    n1.stop_heartbeat();
    // The nic check saw the link down once; reports for other reasons carry that run again.
    let ran = unix_now_ms();
    n1.set_checks_ran_at(Some(ran));
    n1.set_findings(vec![nic_down("eth0")]);
    for _ in 0..5 {
        n1.report().await;
    }
    assert_eq!(h.state("n1").await, Some(Suspect), "one look is one observation");
    // Its next run sees the link down again: the second observation drains it.
    n1.set_checks_ran_at(Some(ran + 10_000));
    n1.report().await;
    h.wait_state("n1", Drained).await;
    let events = h.events().await;
    assert_eq!(count(&events, &rule_decisions("n1")), 1, "{}", describe(&events));
    drop(agents);
}

/// Planned work through fleetmend: a person drains four of ten nodes, reboots them (silent for
/// longer than the unreachable window), they come back with their links training, and the person
/// puts them back. No rule acts on them, none turns unreachable, the breaker stays closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_a_person_drained_goes_silent_and_boots_with_no_action_and_no_storm() {
    let h = Harness::start(|_| {}).await;
    let agents = h.fleet(&names("n", 10)).await;
    let planned = &agents[..4];
    for agent in planned {
        let path = format!("/v1/nodes/{}/drain", agent.node());
        let (status, body) = h.post_admin(&path, serde_json::json!({})).await;
        assert!(status < 300, "{status} {body}");
    }
    for agent in planned {
        h.wait_state(agent.node(), Drained).await;
        agent.stop_heartbeat();
    }
    // Down until a node nobody drained, silent from the same moment, turned unreachable.
    let control = &agents[9];
    control.stop_heartbeat();
    let silent = Expect::transition(control.node(), Healthy, NodeState::Unreachable);
    h.wait_event(Some(control.node()), &silent).await;
    for agent in planned {
        let detail: serde_json::Value = h.get_json(&format!("/v1/nodes/{}", agent.node())).await;
        let findings = detail["node"]["findings"].as_array().cloned().unwrap_or_default();
        let unreachable = findings.iter().any(|t| t["finding"]["finding"] == "unreachable");
        assert!(!unreachable, "{} went unreachable while a person rebooted it", agent.node());
    }
    for agent in planned {
        agent.reboot_by_hand();
        agent.set_findings(vec![nic_down("eth0"), ib_port_down()]);
        agent.start_heartbeat();
    }
    h.wait_more_reports(40.0).await;
    assert!(!h.breaker().await.open, "a planned reboot's links opened the breaker");
    for agent in planned {
        agent.set_findings(Vec::new());
    }
    h.wait_more_reports(20.0).await;
    for agent in planned {
        let path = format!("/v1/nodes/{}/undrain", agent.node());
        let (status, body) = h.post_admin(&path, serde_json::json!({})).await;
        assert!(status < 300, "{status} {body}");
        h.wait_state(agent.node(), Healthy).await;
    }
    let events = h.events().await;
    for agent in planned {
        let node = agent.node();
        assert_eq!(count(&events, &rule_decisions(node)), 0, "{}", describe(&events));
        let unreachable = Expect::kind(EventKind::StateChanged).node(node).reason("no report");
        assert_eq!(count(&events, &unreachable), 0, "{}", describe(&events));
        assert!(h.provider_calls_of(node).is_empty(), "{node} was repaired");
    }
    assert!(!h.breaker().await.open);
    drop(agents);
}

/// A rolling reboot done outside fleetmend (no drain): half the fleet boots at once with its
/// links still coming up. Within the boot grace that is no storm: the breaker stays closed, no
/// rule acts, and the links coming up leave every node healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_fleet_booting_with_its_links_training_is_no_storm() {
    let h = Harness::start(|_| {}).await;
    let agents = h.fleet(&names("n", 10)).await;
    let booted = &agents[..5];
    for agent in booted {
        agent.reboot_by_hand();
        agent.set_findings(vec![nic_down("eth0"), ib_port_down()]);
    }
    for agent in booted {
        h.wait_state(agent.node(), Suspect).await;
    }
    h.wait_more_reports(40.0).await;
    assert!(!h.breaker().await.open, "links training after a boot opened the breaker");
    for agent in booted {
        agent.set_findings(Vec::new());
    }
    for agent in booted {
        h.wait_state(agent.node(), Healthy).await;
    }
    let events = h.events().await;
    let decisions = Expect::kind(EventKind::Decision);
    assert_eq!(count(&events, &decisions), 0, "{}", describe(&events));
    let breaker = Expect::kind(EventKind::Breaker);
    assert_eq!(count(&events, &breaker), 0, "{}", describe(&events));
    drop(agents);
}
