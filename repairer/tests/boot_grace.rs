//! Boot and planned work are not faults: a link still down in the first reports after a boot (a
//! reboot the repairer made, as any other) is held for the boot grace and dropped when the link
//! comes up; the same finding on a node that did not just boot drains it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fleetmend_repairer::model::{EventKind, NodeState, RuleAction};
use support::{Expect, Harness, count, describe, names, nic_down, xid};

use NodeState::{Drained, Healthy, Suspect, Validating};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_down_right_after_a_boot_is_held_and_dropped_when_it_comes_up() {
    let h = Harness::start(|_| {}).await;
    let agents = h.fleet(&names("n", 5)).await;
    let (n1, n2) = (&agents[0], &agents[1]);
    // n1 is rebooted (an Xid 79) and comes back with a new boot id.
    let boot_before = n1.boot_id();
    n1.set_findings(vec![xid("79")]);
    h.wait_event(Some("n1"), &Expect::transition("n1", Validating, Healthy)).await;
    assert_ne!(n1.boot_id(), boot_before);

    // Its link trains for a few reports after the boot: held, then gone.
    n1.set_findings(vec![nic_down("eth0")]);
    h.wait_state("n1", Suspect).await;
    h.wait_more_reports(25.0).await;
    assert_eq!(h.state("n1").await, Some(Suspect), "held within the boot grace");
    n1.set_findings(Vec::new());
    h.wait_state("n1", Healthy).await;

    // The same finding on n2, which did not boot: drained.
    n2.set_findings(vec![nic_down("eth0")]);
    h.wait_state("n2", Drained).await;

    let events = h.events().await;
    let n1_decisions = Expect::kind(EventKind::Decision).node("n1");
    assert_eq!(count(&events, &n1_decisions), 1, "the reboot only: {}", describe(&events));
    assert_eq!(count(&events, &n1_decisions.action(RuleAction::Reboot)), 1);
    let drained = Expect::kind(EventKind::Decision).node("n2").action(RuleAction::Drain);
    assert_eq!(count(&events, &drained), 1, "{}", describe(&events));
    drop(agents);
}
