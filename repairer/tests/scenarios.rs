//! End-to-end scenarios: a repairer started in-process on 127.0.0.1 with a fake scheduler and a
//! fake provider, and scripted agents that report over real HTTP, answer deep checks and come back
//! from reboots with a new boot id. Each scenario asserts the repairer's event log in order and
//! every call the scheduler and the provider got.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fleetmend_proto::command_kind;
use fleetmend_repairer::api::NodeDetail;
use fleetmend_repairer::model::{EventKind, NodeState, RuleAction, Severity};
use fleetmend_repairer::policy::Mode;
use fleetmend_repairer::provider::ProviderCall;
use fleetmend_repairer::scheduler::{DRAIN_REASON_PREFIX, SchedulerCall};
use support::{
    Expect, Harness, assert_in_order, assert_transitions, count, describe, metric, names, nic_down,
    transitions, xid,
};

use NodeState::{
    Draining, Healthy, Quarantined, Repairing, Retired, Suspect, Unreachable, Validating,
};

fn reboot(node: &str) -> ProviderCall {
    ProviderCall::Reboot(node.to_owned())
}

fn replace(node: &str) -> ProviderCall {
    ProviderCall::Replace(node.to_owned())
}

/// The drain call's reason, after asserting the call is a drain of `node` by fleetmend.
fn fleetmend_drain_of(call: &SchedulerCall, node: &str) -> String {
    match call {
        SchedulerCall::Drain { node: n, reason } if n == node => {
            assert!(reason.starts_with(DRAIN_REASON_PREFIX), "drain reason {reason:?}");
            reason.clone()
        }
        other => panic!("expected a drain of {node}, got {other:?}"),
    }
}

/// The nodes other than `except` went through no state change at all.
fn assert_untouched(events: &[fleetmend_repairer::model::Event], all: &[String], except: &[&str]) {
    for node in all.iter().filter(|n| !except.contains(&n.as_str())) {
        assert_eq!(transitions(events, node), [], "{node} changed state:\n{}", describe(events));
    }
}

// --- 1 --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_79_is_drained_checkpointed_rebooted_validated_and_put_back() {
    let h = Harness::start(|_| {}).await;
    h.scheduler.add_job("job-1", &["n1", "n2"]);
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n1 = &agents[0];
    let boot_before = n1.boot_id();

    n1.set_findings(vec![xid("79")]);
    n1.report().await;
    h.wait_event(Some("n1"), &Expect::transition("n1", Validating, Healthy)).await;

    // The scheduler: drained by fleetmend, the job asked to checkpoint and requeued, put back.
    let calls = h.scheduler.calls();
    assert_eq!(calls.len(), 6, "{calls:?}");
    fleetmend_drain_of(&calls[0], "n1");
    assert_eq!(
        calls[1..],
        [
            SchedulerCall::JobsOn { node: "n1".into() },
            SchedulerCall::Checkpoint { job: "job-1".into() },
            SchedulerCall::JobsOn { node: "n1".into() },
            SchedulerCall::Requeue { job: "job-1".into() },
            SchedulerCall::Undrain { node: "n1".into() },
        ]
    );
    assert_eq!(h.scheduler.drain_reason("n1"), None, "n1 is back in scheduling");
    // The provider: one reboot, of n1.
    assert_eq!(h.provider.calls(), [reboot("n1")]);
    // The agent came back with a new boot id and was sent exactly one deep check to run.
    assert_ne!(n1.boot_id(), boot_before);
    let node = h.nodes().await.into_iter().find(|n| n.name == "n1").unwrap();
    assert_eq!(node.boot_id, n1.boot_id());
    assert_eq!((node.state, node.failing, node.workflow), (Healthy, 0, None));
    let deep_checks: std::collections::BTreeSet<String> = n1
        .commands()
        .into_iter()
        .filter(|c| c.kind == command_kind::DEEP_CHECK)
        .map(|c| c.id)
        .collect();
    assert_eq!(deep_checks.len(), 1, "{deep_checks:?}");

    // The event log, in order.
    let events = h.events().await;
    assert_transitions(
        &events,
        "n1",
        &[
            (Healthy, Draining),
            (Draining, Repairing),
            (Repairing, Validating),
            (Validating, Healthy),
        ],
    );
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::NodeJoined).node("n1"),
            Expect::kind(EventKind::Decision).node("n1").action(RuleAction::Reboot),
            Expect::transition("n1", Healthy, Draining),
            Expect::kind(EventKind::WorkflowStep).node("n1").reason("step Checkpoint"),
            Expect::kind(EventKind::WorkflowStep).node("n1").reason("step Requeue"),
            Expect::transition("n1", Draining, Repairing),
            Expect::kind(EventKind::WorkflowStep).node("n1").reason("step AwaitBoot"),
            Expect::transition("n1", Repairing, Validating),
            Expect::kind(EventKind::WorkflowStep).node("n1").reason("step Undrain"),
            Expect::kind(EventKind::RepairFinished).node("n1").reason("reboot repaired"),
            Expect::transition("n1", Validating, Healthy),
        ],
    );
    assert_eq!(count(&events, &Expect::kind(EventKind::Decision)), 1, "{}", describe(&events));
    assert_eq!(
        count(&events, &Expect::kind(EventKind::RepairFinished)),
        1,
        "{}",
        describe(&events)
    );
    let decision = events.iter().find(|e| e.kind == EventKind::Decision).unwrap();
    assert_eq!(decision.actor.0, "rule:xid-fallen-off-bus");
    assert_eq!(decision.findings, [xid("79")]);
    assert_untouched(&events, &fleet, &["n1"]);

    let text = h.metrics().await;
    assert_eq!(
        metric(&text, r#"fleetmend_repairs_total{action="reboot",outcome="repaired"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "fleetmend_time_to_drain_seconds_count"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "fleetmend_time_to_repair_seconds_count"), Some(1.0), "{text}");
    assert_eq!(metric(&text, r#"fleetmend_nodes{state="healthy"}"#), Some(5.0), "{text}");
}

// --- 2 --------------------------------------------------------------------------------------------

/// Runs n1 through a reboot that does not help (set up by `break_n1`) and its replacement by n1-r1.
async fn reboot_then_replace(break_n1: impl FnOnce(&support::Agent), why: &str) {
    let h = Harness::start(|_| {}).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n1 = &agents[0];
    break_n1(n1);
    n1.set_findings(vec![xid("79")]);
    n1.report().await;

    h.eventually("n1 to be replaced", async || {
        h.provider.calls().contains(&replace("n1")).then_some(())
    })
    .await;
    // The old machine's agent may report a little longer; then it is gone and the new one boots.
    let sent = n1.reports_sent();
    h.eventually("n1 to report once more", async || (n1.reports_sent() > sent).then_some(())).await;
    n1.stop_heartbeat();
    let r1 = h.agent("n1-r1");
    r1.report().await;
    r1.start_heartbeat();
    h.wait_event(Some("n1-r1"), &Expect::transition("n1-r1", Validating, Healthy)).await;

    assert_eq!(h.provider.calls(), [reboot("n1"), replace("n1")]);
    let calls = h.scheduler.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    fleetmend_drain_of(&calls[0], "n1");
    assert_eq!(calls[1], SchedulerCall::JobsOn { node: "n1".into() });
    let reason = fleetmend_drain_of(&calls[2], "n1-r1");
    assert!(reason.contains("replacement of n1"), "{reason}");
    assert_eq!(calls[3], SchedulerCall::Undrain { node: "n1-r1".into() });
    assert_eq!(h.scheduler.drain_reason("n1-r1"), None, "the replacement is at work");

    let events = h.events().await;
    assert_transitions(
        &events,
        "n1",
        &[
            (Healthy, Draining),
            (Draining, Repairing),
            (Repairing, Validating),
            (Validating, Repairing),
            (Repairing, Retired),
        ],
    );
    assert_transitions(&events, "n1-r1", &[(Healthy, Validating), (Validating, Healthy)]);
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::Decision).node("n1").action(RuleAction::Reboot),
            Expect::transition("n1", Repairing, Validating),
            Expect::kind(EventKind::RepairFinished)
                .node("n1")
                .action(RuleAction::Replace)
                .reason("reboot did not help")
                .reason(why),
            Expect::transition("n1", Validating, Repairing),
            Expect::kind(EventKind::NodeJoined).node("n1-r1"),
            Expect::transition("n1-r1", Healthy, Validating),
            Expect::kind(EventKind::RepairFinished).node("n1").reason("replace repaired"),
            Expect::transition("n1", Repairing, Retired),
            Expect::transition("n1-r1", Validating, Healthy),
        ],
    );
    assert_eq!(
        count(&events, &Expect::kind(EventKind::RepairFinished)),
        2,
        "{}",
        describe(&events)
    );
    assert_untouched(&events, &fleet, &["n1"]);

    let detail: NodeDetail = h.get_json("/v1/nodes/n1").await;
    assert_eq!(detail.node.replaced_by.as_deref(), Some("n1-r1"));
    assert_eq!(h.state("n1").await, Some(Retired));
    assert_eq!(h.state("n1-r1").await, Some(Healthy));
    let text = h.metrics().await;
    for (series, value) in [
        (r#"fleetmend_repairs_total{action="reboot",outcome="escalated"}"#, Some(1.0)),
        (r#"fleetmend_repairs_total{action="replace",outcome="repaired"}"#, Some(1.0)),
        // Exported at zero from the start: the reboot did not repair it.
        (r#"fleetmend_repairs_total{action="reboot",outcome="repaired"}"#, Some(0.0)),
        (r#"fleetmend_nodes{state="retired"}"#, Some(1.0)),
        (r#"fleetmend_nodes{state="healthy"}"#, Some(5.0)),
    ] {
        assert_eq!(metric(&text, series), value, "{series}\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_that_survives_the_reboot_escalates_to_replace() {
    reboot_then_replace(|n1| n1.set_fault_persists(true), "validation failed: 1 failing finding")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_validation_after_a_reboot_escalates_to_replace() {
    reboot_then_replace(
        |n1| n1.set_deep_check_fails(true),
        "validation failed: the active GPU probe failed",
    )
    .await;
}

/// Results are at-least-once: a deep check's result that arrives again after its workflow used it
/// must not stand in for the replacement's own deep check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_delivered_again_does_not_decide_the_replacements_validation() {
    reboot_then_replace(
        |n1| {
            n1.set_fault_persists(true);
            n1.set_resend_delivered_results(true);
        },
        "validation failed: 1 failing finding",
    )
    .await;
}

/// A replacement that fails its own deep check: the repair ends in quarantine, and the new node is
/// not left validating with no workflow to finish it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_that_fails_validation_is_quarantined() {
    let h = Harness::start(|_| {}).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n1 = &agents[0];
    n1.set_fault_persists(true);
    n1.set_findings(vec![xid("79")]);
    n1.report().await;
    h.eventually("n1 to be replaced", async || {
        h.provider.calls().contains(&replace("n1")).then_some(())
    })
    .await;
    n1.stop_heartbeat();
    let r1 = h.agent("n1-r1");
    r1.set_deep_check_fails(true);
    r1.report().await;
    r1.start_heartbeat();

    h.wait_event(
        Some("n1"),
        &Expect::kind(EventKind::RepairFinished).reason("quarantined").severity(Severity::Critical),
    )
    .await;
    h.wait_state("n1-r1", Quarantined).await;
    assert_eq!(h.provider.calls(), [reboot("n1"), replace("n1")]);
    // The replacement takes no work: fleetmend drained it for its validation and leaves it so.
    let reason = h.scheduler.drain_reason("n1-r1").unwrap();
    assert!(reason.starts_with(DRAIN_REASON_PREFIX), "{reason}");
    assert!(!h.scheduler.calls().contains(&SchedulerCall::Undrain { node: "n1-r1".into() }));
    let events = h.events().await;
    assert_transitions(&events, "n1-r1", &[(Healthy, Validating), (Validating, Quarantined)]);
    assert_eq!(h.state("n1").await, Some(Quarantined));
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::RepairFinished).node("n1").reason("escalating to replace"),
            Expect::transition("n1-r1", Healthy, Validating),
            Expect::kind(EventKind::RepairFinished)
                .node("n1")
                .reason("validation failed: the active GPU probe failed"),
            Expect::transition("n1", Repairing, Quarantined),
            Expect::transition("n1-r1", Validating, Quarantined),
        ],
    );
    let text = h.metrics().await;
    assert_eq!(
        metric(&text, r#"fleetmend_repairs_total{action="replace",outcome="quarantined"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric(&text, r#"fleetmend_nodes{state="validating"}"#), Some(0.0), "{text}");
}

/// A reboot that does not bring the node back is tried again, then escalates to a replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_come_back_from_its_reboots_is_replaced() {
    let h = Harness::start(|c| c.engine.workflow.reboot_timeout = Duration::from_secs(1)).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n1 = &agents[0];
    n1.set_stays_down_after_reboot(true);
    n1.set_findings(vec![xid("79")]);
    n1.report().await;
    h.eventually("n1 to be replaced", async || {
        h.provider.calls().contains(&replace("n1")).then_some(())
    })
    .await;
    let r1 = h.agent("n1-r1");
    r1.report().await;
    r1.start_heartbeat();
    h.wait_event(Some("n1-r1"), &Expect::transition("n1-r1", Validating, Healthy)).await;

    // Two reboot attempts (`reboot_attempts` = 2), then the replacement.
    assert_eq!(h.provider.calls(), [reboot("n1"), reboot("n1"), replace("n1")]);
    let events = h.events().await;
    assert_transitions(
        &events,
        "n1",
        &[(Healthy, Draining), (Draining, Repairing), (Repairing, Retired)],
    );
    assert_transitions(&events, "n1-r1", &[(Healthy, Validating), (Validating, Healthy)]);
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::WorkflowStep).node("n1").reason("step AwaitBoot"),
            Expect::kind(EventKind::WorkflowStep).node("n1").reason("rebooting again"),
            Expect::kind(EventKind::WorkflowStep).node("n1").reason("step AwaitBoot"),
            Expect::kind(EventKind::RepairFinished)
                .node("n1")
                .action(RuleAction::Replace)
                .reason("did not come back from its reboots"),
            Expect::kind(EventKind::RepairFinished).node("n1").reason("replace repaired"),
            Expect::transition("n1", Repairing, Retired),
        ],
    );
    assert_untouched(&events, &fleet, &["n1"]);
}

/// A fault back soon after a reboot that seemed to work: decide() escalates to a replacement,
/// which waits for the node's cooldown first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_back_soon_after_a_good_reboot_is_replaced_after_the_cooldown() {
    let h = Harness::start(|c| c.policy.guard_rails.cooldown = Duration::from_secs(3)).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n1 = &agents[0];
    n1.set_findings(vec![xid("79")]);
    n1.report().await;
    h.wait_event(Some("n1"), &Expect::transition("n1", Validating, Healthy)).await;
    // The same fault, right after the repair.
    n1.set_findings(vec![xid("79")]);
    n1.report().await;
    h.eventually("n1 to be replaced", async || {
        h.provider.calls().contains(&replace("n1")).then_some(())
    })
    .await;
    n1.stop_heartbeat();
    let r1 = h.agent("n1-r1");
    r1.report().await;
    r1.start_heartbeat();
    h.wait_event(Some("n1-r1"), &Expect::transition("n1-r1", Validating, Healthy)).await;

    assert_eq!(h.provider.calls(), [reboot("n1"), replace("n1")]);
    let events = h.events().await;
    assert_transitions(
        &events,
        "n1",
        &[
            (Healthy, Draining),
            (Draining, Repairing),
            (Repairing, Validating),
            (Validating, Healthy),
            (Healthy, Suspect),
            (Suspect, Draining),
            (Draining, Repairing),
            (Repairing, Retired),
        ],
    );
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::RepairFinished).node("n1").reason("reboot repaired"),
            Expect::kind(EventKind::ActionHeld)
                .node("n1")
                .action(RuleAction::Replace)
                .reason("(cooldown)"),
            Expect::kind(EventKind::Decision)
                .node("n1")
                .action(RuleAction::Replace)
                .reason("a reboot did not clear it"),
            Expect::transition("n1", Suspect, Draining),
            Expect::kind(EventKind::RepairFinished).node("n1").reason("replace repaired"),
        ],
    );
    let held = events.iter().find(|e| e.kind == EventKind::ActionHeld).unwrap();
    let decided = events
        .iter()
        .rfind(|e| e.kind == EventKind::Decision && e.node.as_deref() == Some("n1"))
        .unwrap();
    let finished = events.iter().find(|e| e.kind == EventKind::RepairFinished).unwrap();
    assert!(
        decided.at_ms >= finished.at_ms + 3000,
        "the replacement was decided {} ms after the reboot finished, inside the 3 s cooldown",
        decided.at_ms - finished.at_ms
    );
    assert!(held.at_ms < finished.at_ms + 3000);
    assert_untouched(&events, &fleet, &["n1"]);
}

// --- 3 --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_opens_the_breaker_and_nothing_is_rebooted_until_a_person_closes_it() {
    // Reboots wait 2 s after the fault, so the storm is seen before anything is rebooted.
    let h = Harness::start(|c| {
        c.policy.guard_rails.settle = Duration::from_secs(2);
        c.policy.guard_rails.breaker_fraction = 0.20;
    })
    .await;
    let fleet = names("n", 20);
    let agents = h.fleet(&fleet).await;
    let sick = &agents[..6];
    // Six fatal Xids within a second, one after the other so the order is known.
    for agent in sick {
        agent.set_findings(vec![xid("79")]);
        agent.report().await;
    }

    h.eventually("the breaker to open", async || h.breaker().await.open.then_some(())).await;
    let opened = h.wait_event(None, &Expect::kind(EventKind::Breaker)).await;
    assert_eq!(opened.severity, Severity::Critical);
    assert_eq!(opened.node, None);
    // 5 of 20 is the first count above 20 %.
    assert!(opened.reason.starts_with("5 of 20 nodes"), "{}", opened.reason);

    // n01 and n02 were drained (10 % of 20 may be unavailable); their workflows now hold the
    // reboot for the breaker.
    h.eventually("both drained nodes to hold their reboot", async || {
        let events = h.events().await;
        let held = count(
            &events,
            &Expect::kind(EventKind::ActionHeld).reason("held: the breaker is open"),
        );
        (held == 2).then_some(())
    })
    .await;
    assert_eq!(h.provider.calls(), [], "nothing may be rebooted while the breaker is open");
    // Each workflow drains on its own task: the two drains may come in either order.
    let mut drained: Vec<String> = h
        .scheduler
        .calls()
        .iter()
        .filter_map(|c| match c {
            SchedulerCall::Drain { node, .. } => Some(node.clone()),
            _ => None,
        })
        .collect();
    drained.sort();
    assert_eq!(drained, ["n01", "n02"]);
    // A hold is written before the node's move to suspect: wait for the last of those moves so
    // the snapshot below does not fall between the two.
    for node in ["n03", "n04", "n05", "n06"] {
        h.wait_event(Some(node), &Expect::transition(node, Healthy, Suspect)).await;
    }
    let events = h.events().await;
    for node in ["n01", "n02"] {
        assert_transitions(&events, node, &[(Healthy, Draining)]);
        let held = Expect::kind(EventKind::ActionHeld)
            .node(node)
            .reason("held: the breaker is open")
            .severity(Severity::Critical);
        assert_eq!(count(&events, &held), 1, "{}", describe(&events));
    }
    // The others wait for a guard rail: two for the unavailable budget, then the breaker.
    for node in ["n03", "n04"] {
        assert_in_order(
            &events,
            &[
                Expect::kind(EventKind::ActionHeld).node(node).reason("(max-unavailable)"),
                Expect::transition(node, Healthy, Suspect),
            ],
        );
    }
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::ActionHeld).node("n04"),
            Expect::kind(EventKind::Breaker).severity(Severity::Critical),
            Expect::kind(EventKind::ActionHeld)
                .node("n05")
                .reason("(breaker)")
                .severity(Severity::Critical),
            Expect::kind(EventKind::ActionHeld)
                .node("n06")
                .reason("(breaker)")
                .severity(Severity::Critical),
        ],
    );
    for node in ["n05", "n06"] {
        assert_transitions(&events, node, &[(Healthy, Suspect)]);
    }
    assert_untouched(&events, &fleet, &["n01", "n02", "n03", "n04", "n05", "n06"]);
    let text = h.metrics().await;
    assert_eq!(metric(&text, "fleetmend_breaker_open"), Some(1.0), "{text}");

    // A person closes it: the held repairs go on, two at a time, until every sick node is back.
    let (status, body) = h.post_admin("/v1/breaker/close", serde_json::json!({})).await;
    assert_eq!(status, 200, "{body}");
    let closed: fleetmend_repairer::engine::BreakerState = serde_json::from_str(&body).unwrap();
    assert!(!closed.open);
    assert!(!h.breaker().await.open);
    for agent in sick {
        h.wait_event(Some(agent.node()), &Expect::transition(agent.node(), Validating, Healthy))
            .await;
    }
    let mut rebooted: Vec<ProviderCall> = h.provider.calls();
    rebooted.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(rebooted, fleet[..6].iter().map(|n| reboot(n)).collect::<Vec<_>>());
    let events = h.events().await;
    assert_eq!(count(&events, &Expect::kind(EventKind::Breaker)), 2, "{}", describe(&events));
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::Breaker).reason("nodes turned unhealthy"),
            Expect::kind(EventKind::Breaker).reason("breaker closed"),
            Expect::transition("n01", Draining, Repairing),
        ],
    );
    assert!(!h.breaker().await.open, "the breaker stays closed");
}

// --- 4 --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_records_what_it_would_do_and_touches_nothing() {
    let h = Harness::start(|c| c.policy.mode = Mode::DryRun).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    agents[0].set_findings(vec![xid("79")]);
    agents[0].report().await;

    let decision = h
        .wait_event(Some("n1"), &Expect::kind(EventKind::Decision).reason("dry-run: would reboot"))
        .await;
    assert_eq!(decision.action, Some(RuleAction::Reboot));
    // Many more reports and ticks go by: still nothing acts, and the decision is written once.
    h.wait_more_reports(25.0).await;
    assert_eq!(h.scheduler.calls(), []);
    assert_eq!(h.provider.calls(), []);
    let events = h.events().await;
    assert_eq!(count(&events, &Expect::kind(EventKind::Decision)), 1, "{}", describe(&events));
    assert_untouched(&events, &fleet, &[]);
    assert_eq!(h.state("n1").await, Some(Healthy));
    let text = h.metrics().await;
    assert_eq!(
        metric(&text, r#"fleetmend_decisions_total{action="reboot",mode="dry-run"}"#),
        Some(1.0),
        "{text}"
    );
}

// --- 5 --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_mode_holds_the_action_until_a_person_approves() {
    let h = Harness::start(|c| c.policy.mode = Mode::Approve).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    agents[0].set_findings(vec![xid("79")]);
    agents[0].report().await;

    h.wait_event(
        Some("n1"),
        &Expect::kind(EventKind::ActionHeld).reason("awaiting-approval").action(RuleAction::Reboot),
    )
    .await;
    h.wait_state("n1", Suspect).await;
    h.wait_more_reports(25.0).await;
    assert_eq!(h.scheduler.calls(), [], "nothing acts before the approval");
    assert_eq!(h.provider.calls(), []);
    let events = h.events().await;
    assert_eq!(count(&events, &Expect::kind(EventKind::ActionHeld)), 1, "{}", describe(&events));

    let (status, body) =
        h.post_admin("/v1/nodes/n1/approve", serde_json::json!({ "action": "reboot" })).await;
    assert_eq!(status, 204, "{body}");
    h.wait_event(Some("n1"), &Expect::transition("n1", Validating, Healthy)).await;

    assert_eq!(h.provider.calls(), [reboot("n1")]);
    let calls = h.scheduler.calls();
    fleetmend_drain_of(&calls[0], "n1");
    assert_eq!(calls.last(), Some(&SchedulerCall::Undrain { node: "n1".into() }));
    let events = h.events().await;
    assert_transitions(
        &events,
        "n1",
        &[
            (Healthy, Suspect),
            (Suspect, Draining),
            (Draining, Repairing),
            (Repairing, Validating),
            (Validating, Healthy),
        ],
    );
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::ActionHeld).node("n1").reason("awaiting-approval"),
            Expect::transition("n1", Healthy, Suspect),
            Expect::kind(EventKind::Approved).node("n1").action(RuleAction::Reboot),
            Expect::kind(EventKind::Decision).node("n1").action(RuleAction::Reboot),
            Expect::transition("n1", Suspect, Draining),
            Expect::kind(EventKind::RepairFinished).node("n1").reason("reboot repaired"),
        ],
    );
    let approved = events.iter().find(|e| e.kind == EventKind::Approved).unwrap();
    assert_eq!(approved.actor.0, "person:admin");
    assert_untouched(&events, &fleet, &["n1"]);
}

// --- 6 --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finding_that_clears_before_its_debounce_drains_nothing() {
    let h = Harness::start(|_| {}).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet[1..]).await;
    // n1 reports by hand: one report with the NIC down, the next without.
    let n1 = h.agent("n1");
    n1.report().await;
    n1.set_findings(vec![nic_down("eth0")]);
    n1.report().await;
    h.wait_state("n1", Suspect).await;
    n1.set_findings(Vec::new());
    n1.report().await;
    h.wait_state("n1", Healthy).await;
    n1.start_heartbeat();
    h.wait_more_reports(25.0).await;

    assert_eq!(h.scheduler.calls(), [], "a single observation drains nothing");
    assert_eq!(h.provider.calls(), []);
    let events = h.events().await;
    assert_transitions(&events, "n1", &[(Healthy, Suspect), (Suspect, Healthy)]);
    assert_in_order(
        &events,
        &[
            Expect::transition("n1", Healthy, Suspect).reason("waiting for its debounce"),
            Expect::transition("n1", Suspect, Healthy).reason("cleared before any action"),
        ],
    );
    assert_eq!(count(&events, &Expect::kind(EventKind::Decision)), 0, "{}", describe(&events));
    assert_eq!(count(&events, &Expect::kind(EventKind::ActionHeld)), 0);
    assert_untouched(&events, &fleet, &["n1"]);
    drop(agents);
}

/// A job its own scheduler moves off the draining node (the embedded queue stops and restarts a
/// job on a drain) is not requeued by the workflow: that would stop it again where it runs now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_left_the_node_before_the_requeue_is_left_running() {
    let h = Harness::start(|_| {}).await;
    h.scheduler.add_job("job-1", &["n1", "n2"]);
    h.scheduler.move_on_checkpoint("job-1", &["n2", "n3"]);
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    agents[0].set_findings(vec![nic_down("eth0")]);
    h.wait_state("n1", NodeState::Drained).await;
    let calls = h.scheduler.calls();
    fleetmend_drain_of(&calls[0], "n1");
    assert_eq!(
        calls[1..],
        [
            SchedulerCall::JobsOn { node: "n1".into() },
            SchedulerCall::Checkpoint { job: "job-1".into() },
            SchedulerCall::JobsOn { node: "n1".into() },
        ]
    );
    drop(agents);
}

/// A `drain` rule (the agent's recommendation for a NIC without carrier, two observations):
/// drained with its jobs requeued, put back once the finding clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_rule_keeps_the_node_out_until_its_finding_clears() {
    let h = Harness::start(|_| {}).await;
    h.scheduler.add_job("job-1", &["n1"]);
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n1 = &agents[0];
    n1.set_findings(vec![nic_down("eth0")]);
    h.wait_state("n1", NodeState::Drained).await;
    let calls = h.scheduler.calls();
    assert_eq!(calls.len(), 5, "{calls:?}");
    fleetmend_drain_of(&calls[0], "n1");
    assert_eq!(
        calls[1..],
        [
            SchedulerCall::JobsOn { node: "n1".into() },
            SchedulerCall::Checkpoint { job: "job-1".into() },
            SchedulerCall::JobsOn { node: "n1".into() },
            SchedulerCall::Requeue { job: "job-1".into() },
        ]
    );
    h.wait_more_reports(25.0).await;
    assert_eq!(h.scheduler.calls().len(), 5, "drained, nothing more while the NIC is down");

    n1.set_findings(Vec::new());
    h.wait_event(Some("n1"), &Expect::transition("n1", NodeState::Drained, Healthy)).await;
    assert_eq!(h.scheduler.calls().last(), Some(&SchedulerCall::Undrain { node: "n1".into() }));
    assert_eq!(h.scheduler.drain_reason("n1"), None);
    assert_eq!(h.provider.calls(), []);
    let events = h.events().await;
    assert_transitions(
        &events,
        "n1",
        &[
            (Healthy, Suspect),
            (Suspect, Draining),
            (Draining, NodeState::Drained),
            (NodeState::Drained, Healthy),
        ],
    );
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::Decision).node("n1").action(RuleAction::Drain),
            Expect::kind(EventKind::RepairFinished).node("n1").reason("drained until"),
            Expect::kind(EventKind::RepairFinished).node("n1").reason("back at work"),
        ],
    );
    let decision = events.iter().find(|e| e.kind == EventKind::Decision).unwrap();
    assert_eq!(decision.actor.0, "rule:boot-transient-nic_down");
    assert_untouched(&events, &fleet, &["n1"]);
    let text = h.metrics().await;
    assert_eq!(metric(&text, "fleetmend_time_to_drain_seconds_count"), Some(1.0), "{text}");
}

// --- 7 --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleetmend_leaves_a_node_someone_else_drained_drained() {
    let h = Harness::start(|_| {}).await;
    h.scheduler.drain_as_other("n2", "maintenance");
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    agents[1].set_findings(vec![xid("79")]);
    agents[1].report().await;

    h.wait_state("n2", Quarantined).await;
    assert_eq!(h.scheduler.drain_reason("n2").as_deref(), Some("maintenance"));
    assert_eq!(h.provider.calls(), [reboot("n2")]);
    let calls = h.scheduler.calls();
    fleetmend_drain_of(&calls[0], "n2");
    assert_eq!(calls.last(), Some(&SchedulerCall::Undrain { node: "n2".into() }));
    let events = h.events().await;
    assert_transitions(
        &events,
        "n2",
        &[
            (Healthy, Draining),
            (Draining, Repairing),
            (Repairing, Validating),
            (Validating, Quarantined),
        ],
    );
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::WorkflowStep).node("n2").reason("step Undrain"),
            Expect::kind(EventKind::WorkflowStep)
                .node("n2")
                .reason("left drained: someone else drained it (maintenance)"),
            Expect::kind(EventKind::RepairFinished)
                .node("n2")
                .severity(Severity::Critical)
                .reason("drained by someone else"),
            Expect::transition("n2", Validating, Quarantined),
        ],
    );
    assert_untouched(&events, &fleet, &["n2"]);
    let text = h.metrics().await;
    assert_eq!(
        metric(&text, r#"fleetmend_repairs_total{action="reboot",outcome="quarantined"}"#),
        Some(1.0),
        "{text}"
    );
}

// --- 8 --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_reporting_is_rebooted_as_unreachable() {
    let h = Harness::start(|_| {}).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n3 = &agents[2];
    let boot_before = n3.boot_id();
    n3.stop_heartbeat();

    h.eventually("n3 to be rebooted", async || {
        h.provider.calls().contains(&reboot("n3")).then_some(())
    })
    .await;
    // The node comes back from the reboot and its agent reports again.
    n3.start_heartbeat();
    h.wait_event(Some("n3"), &Expect::transition("n3", Validating, Healthy)).await;

    assert_ne!(n3.boot_id(), boot_before);
    assert_eq!(h.provider.calls(), [reboot("n3")]);
    let calls = h.scheduler.calls();
    fleetmend_drain_of(&calls[0], "n3");
    assert_eq!(calls.last(), Some(&SchedulerCall::Undrain { node: "n3".into() }));
    let events = h.events().await;
    assert_transitions(
        &events,
        "n3",
        &[
            (Healthy, Unreachable),
            (Unreachable, Draining),
            (Draining, Repairing),
            (Repairing, Validating),
            (Validating, Healthy),
        ],
    );
    assert_in_order(
        &events,
        &[
            Expect::transition("n3", Healthy, Unreachable).reason("no report for 3 intervals"),
            Expect::kind(EventKind::Decision).node("n3").action(RuleAction::Reboot),
            Expect::transition("n3", Unreachable, Draining),
            Expect::kind(EventKind::RepairFinished).node("n3").reason("reboot repaired"),
        ],
    );
    let decision =
        events.iter().find(|e| e.kind == EventKind::Decision && e.node.as_deref() == Some("n3"));
    assert_eq!(decision.unwrap().actor.0, "rule:unreachable");
    assert_untouched(&events, &fleet, &["n3"]);
}

// --- 9 --------------------------------------------------------------------------------------------

/// A report as JSON, for tests that break it.
fn report_json(node: &str) -> serde_json::Value {
    serde_json::json!({
        "wire_version": fleetmend_proto::WIRE_VERSION,
        "node": node,
        "boot_id": "b1",
        "agent_version": "test",
        "seq": 1,
        "sent_at_ms": 1,
        "trigger": "interval",
        "verdict": "healthy",
        "checks": [],
        "findings": [],
    })
}

/// POSTs `body` to `path` with an optional bearer token; returns the status and the parsed JSON
/// error body (every refusal must be JSON naming the problem).
async fn post_raw(
    h: &Harness,
    path: &str,
    body: Vec<u8>,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut request =
        h.client.post(h.url(path)).header("content-type", "application/json").body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{path} answered {status} with a non-JSON body ({e}): {text}"));
    (status, json)
}

fn error_of(json: &serde_json::Value) -> String {
    json["error"].as_str().unwrap_or_else(|| panic!("no error field in {json}")).to_owned()
}

fn reports_counter(text: &str, outcome: &str) -> Option<f64> {
    metric(text, &format!("fleetmend_reports_received_total{{outcome=\"{outcome}\"}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reports_are_refused_with_a_reason_counted_and_change_nothing() {
    // Reports never come on their own here: no node goes unreachable while the test runs.
    let h = Harness::start(|c| {
        c.max_body_bytes = 4096;
        c.engine.report_interval = Duration::from_secs(3600);
    })
    .await;
    for node in ["n1", "n2"] {
        h.agent(node).report().await;
    }
    let nodes_before = serde_json::to_value(h.nodes().await).unwrap();
    let events_before = h.events().await.len();

    let mut missing_node = report_json("n3");
    missing_node.as_object_mut().unwrap().remove("node");
    let mut wrong_version = report_json("n3");
    wrong_version["wire_version"] = serde_json::json!(99);
    let mut oversized = report_json("n3");
    oversized["findings"] = serde_json::json!([{
        "check": "gpu", "finding": "xid", "status": "fail", "action": "reboot",
        "message": "x".repeat(5000),
    }]);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("malformed JSON", br#"{"wire_version": 1, "node": "#.to_vec(), 400, "malformed report"),
        ("missing node", missing_node.to_string().into_bytes(), 400, "missing field `node`"),
        ("wrong wire version", wrong_version.to_string().into_bytes(), 400, "wire_version 99"),
        ("bad node name", report_json("n 3").to_string().into_bytes(), 400, "node: \"n 3\""),
        ("oversized body", oversized.to_string().into_bytes(), 413, "max_body_bytes"),
    ];
    for (name, body, want_status, want_error) in &cases {
        let (status, json) = post_raw(&h, "/v1/reports", body.clone(), None).await;
        assert_eq!(status, *want_status, "{name}: {json}");
        let error = error_of(&json);
        assert!(error.contains(want_error), "{name}: {error:?} does not name {want_error:?}");
    }

    let text = h.metrics().await;
    assert_eq!(reports_counter(&text, "malformed"), Some(cases.len() as f64), "{text}");
    assert_eq!(reports_counter(&text, "ok"), Some(2.0), "{text}");
    assert_eq!(reports_counter(&text, "unauthorized"), Some(0.0), "{text}");
    assert_eq!(serde_json::to_value(h.nodes().await).unwrap(), nodes_before);
    assert_eq!(h.events().await.len(), events_before, "a refused report records nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_without_the_agent_token_are_refused_and_counted() {
    let h = Harness::start(|c| {
        c.agent_token = Some("agent-secret".to_owned());
        c.engine.report_interval = Duration::from_secs(3600);
    })
    .await;
    // The scripted agent sends the configured token.
    h.agent("n1").report().await;
    let nodes_before = serde_json::to_value(h.nodes().await).unwrap();
    let good = report_json("n2").to_string().into_bytes();

    let (status, json) = post_raw(&h, "/v1/reports", good.clone(), None).await;
    assert_eq!(status, 401, "{json}");
    assert!(error_of(&json).contains("bearer token is required"), "{json}");
    let (status, json) = post_raw(&h, "/v1/reports", good.clone(), Some("guess")).await;
    assert_eq!(status, 401, "{json}");
    assert!(error_of(&json).contains("wrong bearer token"), "{json}");
    // Unauthenticated garbage is refused for the token before anyone reads it.
    let (status, json) = post_raw(&h, "/v1/reports", b"{not json".to_vec(), None).await;
    assert_eq!(status, 401, "{json}");

    let text = h.metrics().await;
    assert_eq!(reports_counter(&text, "unauthorized"), Some(3.0), "{text}");
    assert_eq!(reports_counter(&text, "malformed"), Some(0.0), "{text}");
    assert_eq!(reports_counter(&text, "ok"), Some(1.0), "{text}");
    assert_eq!(serde_json::to_value(h.nodes().await).unwrap(), nodes_before);

    // The inbound alert webhooks take the agent token too (no alerts_token set).
    let (status, json) =
        post_raw(&h, "/v1/alerts/alertmanager", b"{}".to_vec(), Some("guess")).await;
    assert_eq!(status, 401, "{json}");
    assert_eq!(serde_json::to_value(h.nodes().await).unwrap(), nodes_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_alertmanager_webhook_is_refused_and_changes_nothing() {
    let h = Harness::start(|c| {
        c.max_body_bytes = 4096;
        c.engine.report_interval = Duration::from_secs(3600);
    })
    .await;
    h.agent("n1").report().await;
    let nodes_before = serde_json::to_value(h.nodes().await).unwrap();
    let events_before = h.events().await.len();

    for (name, body, want_status) in [
        ("not JSON", b"firing!".to_vec(), 400),
        ("wrong shape", br#"{"version":"4","alerts":"none"}"#.to_vec(), 400),
        ("oversized", format!(r#"{{"pad":"{}"}}"#, "x".repeat(5000)).into_bytes(), 413),
    ] {
        let (status, json) = post_raw(&h, "/v1/alerts/alertmanager", body, None).await;
        assert_eq!(status, want_status, "{name}: {json}");
        assert!(!error_of(&json).is_empty(), "{name}: {json}");
    }
    assert_eq!(serde_json::to_value(h.nodes().await).unwrap(), nodes_before);
    assert_eq!(h.events().await.len(), events_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_own_token_reports_for_it_alone_and_another_nodes_name_is_refused() {
    let tokens = tempfile::tempdir().unwrap();
    let hashes = tokens.path().join("node-tokens");
    let nodes = ["n1".to_owned(), "n2".to_owned()];
    let files = fleetmend_repairer::identity::issue(tokens.path(), &hashes, &nodes).unwrap();
    let token = |i: usize| std::fs::read_to_string(&files[i]).unwrap().trim().to_owned();
    let h = Harness::start(|c| {
        c.node_tokens_file = Some(hashes.clone());
        c.engine.report_interval = Duration::from_secs(3600);
    })
    .await;
    for (i, node) in nodes.iter().enumerate() {
        let body = report_json(node).to_string().into_bytes();
        let (status, json) = post_raw(&h, "/v1/reports", body, Some(&token(i))).await;
        assert_eq!(status, 200, "{node} with its own token: {json}");
    }
    let nodes_before = serde_json::to_value(h.nodes().await).unwrap();
    let n2_events = h.events_of("n2").await.len();

    // n1's token, a fatal report (and a command result) for n2: refused, n2 untouched.
    let mut fatal = report_json("n2");
    fatal["verdict"] = serde_json::json!("unhealthy");
    fatal["findings"] = serde_json::json!([{
        "check": "gpu", "finding": "xid", "subject": "GPU0", "status": "fail",
        "action": "replace", "message": "Xid 79: fallen off the bus",
    }]);
    fatal["command_results"] = serde_json::json!([{
        "id": "c-1", "kind": "deep-check", "ok": true, "message": "passed",
        "finished_at_ms": 2,
    }]);
    let body = fatal.to_string().into_bytes();
    let (status, json) = post_raw(&h, "/v1/reports", body.clone(), Some(&token(0))).await;
    assert_eq!(status, 403, "{json}");
    let error = error_of(&json);
    assert!(error.contains("node n1's") && error.contains("for node n2"), "{error}");
    // The shared token of old, or none, is no node's.
    let (status, json) = post_raw(&h, "/v1/reports", body.clone(), Some("guess")).await;
    assert_eq!((status, error_of(&json).contains("wrong bearer token")), (401, true), "{json}");
    let (status, _) = post_raw(&h, "/v1/reports", body, None).await;
    assert_eq!(status, 401);

    assert_eq!(serde_json::to_value(h.nodes().await).unwrap(), nodes_before);
    assert_eq!(h.events_of("n2").await.len(), n2_events, "nothing recorded for n2");
    let text = h.metrics().await;
    assert_eq!(reports_counter(&text, "forbidden"), Some(1.0), "{text}");
    assert_eq!(reports_counter(&text, "unauthorized"), Some(2.0), "{text}");
    assert_eq!(reports_counter(&text, "ok"), Some(2.0), "{text}");

    // A node issued a new token: the old one stops at the next look at the file.
    let old = token(0);
    fleetmend_repairer::identity::issue(tokens.path(), &hashes, &nodes[..1]).unwrap();
    let refused = async || {
        let body = report_json("n1").to_string().into_bytes();
        post_raw(&h, "/v1/reports", body, Some(&old)).await.0 == 401
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !refused().await {
        assert!(std::time::Instant::now() < deadline, "the revoked token still reports");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = report_json("n1").to_string().into_bytes();
    assert_eq!(post_raw(&h, "/v1/reports", body, Some(&token(0))).await.0, 200);
}
