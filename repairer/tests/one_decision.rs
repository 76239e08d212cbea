//! Floods and flaps stay one decision, in one place: a finding reported report after report, a
//! link that goes down and up between reports, and a node that fails, heals and fails again each
//! end in one decision per fault, and past the attempt cap in a quarantine that says why; never a
//! loop. (The agent's side of a flood, one finding for 100,000 identical kernel-log lines, and of
//! a flapping link, one `nic_flapping` warning for a window of flaps, are the kernel_log and nic
//! checks' own tests.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use fleetmend_repairer::model::{EventKind, NodeState, RuleAction, Severity};
use support::{Expect, Harness, count, describe, names, nic_down, xid};

use NodeState::{Drained, Healthy, Quarantined, Validating};

/// The NIC check's finding for a link whose carrier changed too often within its window (a
/// warning: the agent recommends nothing, the link works between flaps).
fn nic_flapping(interface: &str) -> Finding {
    Finding::new(
        "nic",
        "nic_flapping",
        interface,
        Status::Warn,
        RecommendedAction::None,
        format!("{interface} is flapping: 12 carrier changes within 10m (max 6)"),
    )
    .with_value(12.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finding_reported_report_after_report_is_one_decision() {
    let h = Harness::start(|_| {}).await;
    let agents = h.fleet(&names("n", 3)).await;
    agents[0].set_findings(vec![nic_down("eth0").with_value(100_000.0)]);
    h.wait_state("n1", Drained).await;
    // Held down report after report: the same fault, the same decision.
    h.wait_more_reports(60.0).await;
    let events = h.events().await;
    let decisions = Expect::kind(EventKind::Decision).node("n1");
    assert_eq!(count(&events, &decisions), 1, "{}", describe(&events));
    assert_eq!(h.state("n1").await, Some(Drained));
    drop(agents);
}

/// A link down in one report and up in the next, again and again, is never acted on by itself
/// (each observation clears before the debounce's second); the agent's count of carrier changes
/// over its window is the finding, and it is one decision: an alert, the node left at work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_link_is_one_alert_on_its_flap_count_not_one_decision_per_flap() {
    let h = Harness::start(|_| {}).await;
    let agents = h.fleet(&names("n", 3)).await;
    let n1 = &agents[0];
    n1.stop_heartbeat();
    for _ in 0..10 {
        n1.set_findings(vec![nic_down("eth0")]);
        n1.report().await;
        n1.set_findings(Vec::new());
        n1.report().await;
    }
    let events = h.events().await;
    let decisions = Expect::kind(EventKind::Decision).node("n1");
    assert_eq!(count(&events, &decisions), 0, "{}", describe(&events));
    assert_eq!(h.state("n1").await, Some(Healthy));
    n1.set_findings(vec![nic_flapping("eth0")]);
    n1.start_heartbeat();
    let alert = decisions.clone().action(RuleAction::Alert);
    h.eventually("the flapping alert", async || {
        (count(&h.events().await, &alert) == 1).then_some(())
    })
    .await;
    h.wait_more_reports(40.0).await;
    let events = h.events().await;
    assert_eq!(count(&events, &decisions), 1, "{}", describe(&events));
    assert_eq!(h.state("n1").await, Some(Healthy), "left at work");
    drop(agents);
}

/// A node whose fault comes back after each repair: a reboot per return while it stays under
/// `max_remediation_attempts` (3) within the window, then a quarantine that names the cap, and
/// nothing more however long the fault stays. (Each return comes after `reboot_window`, so the
/// ladder does not step up to a replacement, which would end the loop another way:
/// `scenarios.rs`, `a_fault_back_soon_after_a_good_reboot_is_replaced_after_the_cooldown`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fails_heals_and_fails_again_is_quarantined_past_the_attempt_cap() {
    let h = Harness::start(|c| c.policy.escalation.reboot_window = Duration::from_millis(1)).await;
    let agents = h.fleet(&names("n", 5)).await;
    let n1 = &agents[0];
    let repaired = Expect::transition("n1", Validating, Healthy);
    for round in 1..=3 {
        n1.set_findings(vec![xid("79")]);
        h.eventually(&format!("repair {round} of n1"), async || {
            (count(&h.events().await, &repaired) == round).then_some(())
        })
        .await;
    }
    n1.set_findings(vec![xid("79")]);
    h.wait_state("n1", Quarantined).await;
    h.wait_more_reports(40.0).await;

    let events = h.events().await;
    let decisions = Expect::kind(EventKind::Decision).node("n1");
    let reboots = decisions.clone().action(RuleAction::Reboot).severity(Severity::Warning);
    assert_eq!(count(&events, &reboots), 3, "{}", describe(&events));
    let cap = decisions.clone().severity(Severity::Critical).reason("max_remediation_attempts");
    assert_eq!(count(&events, &cap), 1, "{}", describe(&events));
    assert_eq!(count(&events, &decisions), 4, "one decision per return, no loop");
    assert_eq!(h.state("n1").await, Some(Quarantined));
    assert_eq!(h.provider.calls().len(), 3, "three reboots, nothing after the quarantine");
    drop(agents);
}
