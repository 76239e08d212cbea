//! The repairer on a virtual clock: every part of it (engine tick, workflow waits and timeouts,
//! settle) reads time only through its clock, so production timeouts of a quarter of an hour pass
//! in moments of real time, and pass only when the clock is moved.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fleetmend_repairer::clock::{Clock, SharedClock, VirtualClock, unix_now_ms};
use fleetmend_repairer::model::{EventKind, NodeState};
use fleetmend_repairer::provider::ProviderCall;
use support::{Expect, Harness, describe, xid};

/// Moves `clock` on by `step` each time `probe` answers `None` (polled in real time, with the
/// harness's deadline).
async fn advance_until<T>(
    h: &Harness,
    clock: &VirtualClock,
    step: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    h.eventually(what, async || {
        if let Some(value) = probe().await {
            return Some(value);
        }
        clock.advance(step);
        None
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_reboot_timeouts_pass_on_the_virtual_clock_and_escalate_to_a_replacement() {
    let clock = VirtualClock::new(unix_now_ms());
    let shared: SharedClock = clock.clone();
    // Production timings, not the scenarios' short ones.
    let h = Harness::start_on(shared, |c| {
        c.engine.report_interval = Duration::from_secs(60);
        c.engine.tick = Duration::from_secs(1);
        c.engine.workflow.reboot_timeout = Duration::from_secs(15 * 60);
        c.engine.workflow.replace_timeout = Duration::from_secs(60 * 60);
        c.engine.workflow.validate_timeout = Duration::from_secs(20 * 60);
        c.engine.workflow.checkpoint_grace = Duration::from_secs(30);
        c.policy.guard_rails.settle = Duration::from_secs(3);
    })
    .await;
    let n1 = h.agent("n1");
    n1.report().await;
    n1.start_heartbeat();
    n1.set_stays_down_after_reboot(true);
    n1.set_findings(vec![xid("79")]);

    // Nothing moves while the clock stands still: the settle time holds the reboot.
    h.wait_state("n1", NodeState::Draining).await;
    h.wait_more_reports(3.0).await;
    assert!(h.provider.calls().is_empty(), "rebooted before the settle time passed");

    let started = clock.now_ms();
    let replace = ProviderCall::Replace("n1".to_owned());
    advance_until(&h, &clock, Duration::from_secs(10), "n1 to be replaced", async || {
        h.provider.calls().contains(&replace).then_some(())
    })
    .await;
    let reboot = ProviderCall::Reboot("n1".to_owned());
    assert_eq!(h.provider.calls(), [reboot.clone(), reboot, replace]);
    // Two reboots of 15 minutes each passed on the clock, not in real time.
    let virtual_minutes = (clock.now_ms() - started) / 60_000;
    assert!(virtual_minutes >= 30, "only {virtual_minutes} virtual minutes passed");
    let events = h.events_of("n1").await;
    let escalated = events
        .iter()
        .find(|e| e.kind == EventKind::RepairFinished && e.reason.contains("escalating to replace"))
        .unwrap_or_else(|| panic!("no escalation: {}", describe(&events)));
    let decided = events.iter().find(|e| e.kind == EventKind::Decision).unwrap();
    assert!(
        escalated.at_ms - decided.at_ms >= 2 * 15 * 60 * 1000,
        "escalated {} ms after the decision: {}",
        escalated.at_ms - decided.at_ms,
        describe(&events)
    );

    // The replacement joins, is validated and takes the node's place.
    let r1 = h.agent("n1-r1");
    r1.report().await;
    r1.start_heartbeat();
    let validated = Expect::transition("n1-r1", NodeState::Validating, NodeState::Healthy);
    advance_until(&h, &clock, Duration::from_millis(500), "n1-r1 validated", async || {
        h.events_of("n1-r1").await.into_iter().find(|e| validated.matches(e))
    })
    .await;
    h.wait_state("n1", NodeState::Retired).await;
}
