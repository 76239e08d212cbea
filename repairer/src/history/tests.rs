#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::*;
use crate::model::{Actor, Event, EventKind, NodeState, Severity};
use crate::store::Store;

fn xid(code: &str) -> Finding {
    let mut finding =
        Finding::new("gpu", "xid", "3", Status::Fail, RecommendedAction::Reboot, "Xid on GPU 3");
    finding.labels.insert("xid".to_owned(), code.to_owned());
    finding
}

fn nic_down() -> Finding {
    Finding::new("nic", "nic_down", "eth0", Status::Fail, RecommendedAction::Drain, "eth0 is down")
}

fn decision(at: u64, node: &str, action: RuleAction, rule: &str, findings: &[Finding]) -> Event {
    Event {
        action: Some(action),
        findings: findings.to_vec(),
        ..Event::new(EventKind::Decision, Severity::Warning, Some(node), Actor::rule(rule), "", at)
    }
}

fn state(at: u64, node: &str, from: NodeState, to: NodeState, workflow: Option<i64>) -> Event {
    Event {
        workflow,
        ..Event::state_change(node, from, to, Severity::Info, Actor::repairer(), "", at)
    }
}

fn step(at: u64, node: &str, workflow: i64, action: RuleAction, what: &str) -> Event {
    Event {
        workflow: Some(workflow),
        action: Some(action),
        ..Event::new(
            EventKind::WorkflowStep,
            Severity::Info,
            Some(node),
            Actor::repairer(),
            format!("step {what}"),
            at,
        )
    }
}

fn finished(at: u64, node: &str, workflow: i64, action: RuleAction, reason: &str) -> Event {
    let severity =
        if reason.starts_with("quarantined") { Severity::Critical } else { Severity::Info };
    Event {
        workflow: Some(workflow),
        action: Some(action),
        ..Event::new(EventKind::RepairFinished, severity, Some(node), Actor::repairer(), reason, at)
    }
}

const T: u64 = 1_767_225_600_000;

#[test]
fn a_reboot_that_repaired_is_one_fault_with_its_measured_repair() {
    let events = [
        decision(T, "n1", RuleAction::Reboot, "xid-fallen-off-bus", &[xid("79")]),
        state(T, "n1", NodeState::Healthy, NodeState::Draining, Some(7)),
        step(T + 1_000, "n1", 7, RuleAction::Reboot, "Repair"),
        step(T + 1_500, "n1", 7, RuleAction::Reboot, "AwaitBoot"),
        step(T + 9_000, "n1", 7, RuleAction::Reboot, "Validate"),
        finished(T + 9_500, "n1", 7, RuleAction::Reboot, "reboot repaired and validated"),
        state(T + 9_500, "n1", NodeState::Validating, NodeState::Healthy, Some(7)),
    ];
    let faults = fold(&events, T, T + 60_000);
    assert_eq!(faults.len(), 1, "{faults:#?}");
    let fault = &faults[0];
    assert_eq!((fault.at_ms, fault.node.as_str()), (T, "n1"));
    assert_eq!(fault.finding, xid("79"));
    assert_eq!(
        fault.decisions,
        [FaultDecision {
            at_ms: T,
            kind: DecisionKind::Act,
            action: RuleAction::Reboot,
            by: "rule:xid-fallen-off-bus".into()
        }]
    );
    assert_eq!(
        fault.repairs,
        [FaultRepair {
            action: RuleAction::Reboot,
            outcome: RepairOutcome::Repaired,
            started_ms: Some(T + 1_000),
            back_ms: Some(T + 9_000),
            finished_ms: T + 9_500,
        }]
    );
    assert_eq!(fault.took_ms(RuleAction::Reboot), Some(8_000));
    assert_eq!(fault.reboot_cleared(), Some(true));
    assert_eq!(fault.cleared_ms, None, "a repair cleared it, not the fault itself");
}

#[test]
fn a_debounced_fault_starts_when_its_node_turned_suspect() {
    let events = [
        state(T, "n1", NodeState::Healthy, NodeState::Suspect, None),
        decision(T + 10_000, "n1", RuleAction::Drain, "agent-recommendation", &[nic_down()]),
    ];
    let faults = fold(&events, T, T + 60_000);
    assert_eq!(faults[0].at_ms, T);
    assert_eq!(faults[0].decided_ms(), T + 10_000);
}

#[test]
fn a_reboot_that_did_not_help_escalates_in_the_same_fault() {
    let events = [
        decision(T, "n1", RuleAction::Reboot, "xid-fallen-off-bus", &[xid("79")]),
        state(T, "n1", NodeState::Healthy, NodeState::Draining, Some(3)),
        step(T + 1_000, "n1", 3, RuleAction::Reboot, "Repair"),
        step(T + 4_000, "n1", 3, RuleAction::Reboot, "Validate"),
        finished(
            T + 5_000,
            "n1",
            3,
            RuleAction::Replace,
            "reboot did not help (validation failed): escalating to replace",
        ),
        step(T + 6_000, "n1", 3, RuleAction::Replace, "Repair"),
        step(T + 20_000, "n1", 3, RuleAction::Replace, "Validate"),
        finished(T + 21_000, "n1", 3, RuleAction::Replace, "replace repaired and validated"),
        state(T + 21_000, "n1", NodeState::Repairing, NodeState::Retired, Some(3)),
    ];
    let faults = fold(&events, T, T + 60_000);
    assert_eq!(faults.len(), 1, "{faults:#?}");
    let kinds: Vec<(DecisionKind, RuleAction)> =
        faults[0].decisions.iter().map(|d| (d.kind, d.action)).collect();
    assert_eq!(
        kinds,
        [(DecisionKind::Act, RuleAction::Reboot), (DecisionKind::Escalation, RuleAction::Replace)]
    );
    let repairs: Vec<(RuleAction, RepairOutcome, Option<u64>)> =
        faults[0].repairs.iter().map(|r| (r.action, r.outcome, r.took_ms())).collect();
    assert_eq!(
        repairs,
        [
            (RuleAction::Reboot, RepairOutcome::Escalated, Some(3_000)),
            (RuleAction::Replace, RepairOutcome::Repaired, Some(14_000)),
        ]
    );
    assert_eq!(faults[0].reboot_cleared(), Some(false));
}

#[test]
fn a_drained_node_put_back_cleared_by_itself() {
    let events = [
        decision(T, "n1", RuleAction::Drain, "agent-recommendation", &[nic_down()]),
        state(T, "n1", NodeState::Healthy, NodeState::Draining, Some(1)),
        finished(T + 2_000, "n1", 1, RuleAction::Drain, "drained until its findings clear"),
        state(T + 2_000, "n1", NodeState::Draining, NodeState::Drained, Some(1)),
        state(T + 50_000, "n1", NodeState::Drained, NodeState::Drained, Some(2)),
        finished(T + 51_000, "n1", 2, RuleAction::Drain, "findings cleared: back at work"),
        state(T + 51_000, "n1", NodeState::Drained, NodeState::Healthy, Some(2)),
    ];
    let faults = fold(&events, T, T + 60_000);
    assert_eq!(faults.len(), 1, "{faults:#?}");
    let outcomes: Vec<RepairOutcome> = faults[0].repairs.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [RepairOutcome::Drained, RepairOutcome::Released]);
    assert_eq!(faults[0].cleared_ms, Some(T + 51_000));
    assert_eq!(faults[0].reboot_cleared(), None);
}

#[test]
fn held_then_acted_is_one_fault_and_an_alert_is_its_own() {
    let held = Event {
        action: Some(RuleAction::Reboot),
        findings: vec![xid("48")],
        ..Event::new(
            EventKind::ActionHeld,
            Severity::Warning,
            Some("n2"),
            Actor::rule("xid-gpu-reset"),
            "reboot held (max-concurrent-repairs): ...",
            T,
        )
    };
    let alert = |at| {
        let mut warn = nic_down();
        warn.status = Status::Warn;
        Event {
            severity: Severity::Warning,
            ..decision(at, "n2", RuleAction::Alert, "warnings", &[warn])
        }
    };
    let events = [
        held,
        state(T, "n2", NodeState::Healthy, NodeState::Suspect, None),
        decision(T + 30_000, "n2", RuleAction::Reboot, "xid-gpu-reset", &[xid("48")]),
        alert(T + 31_000),
        alert(T + 40_000),
    ];
    let faults = fold(&events, T, T + 60_000);
    assert_eq!(faults.len(), 3, "{faults:#?}");
    let kinds: Vec<DecisionKind> = faults[0].decisions.iter().map(|d| d.kind).collect();
    assert_eq!(kinds, [DecisionKind::Held, DecisionKind::Act]);
    assert_eq!(faults[0].at_ms, T);
    assert_eq!(faults[1].decisions[0].kind, DecisionKind::Alert);
    assert_eq!(faults[2].decisions[0].at_ms, T + 40_000);
}

#[test]
fn another_finding_on_a_node_in_repair_is_another_fault() {
    let events = [
        decision(T, "n1", RuleAction::Reboot, "xid-fallen-off-bus", &[xid("79")]),
        decision(T + 1_000, "n1", RuleAction::Reboot, "xid-gpu-reset", &[xid("48")]),
        decision(T + 2_000, "n2", RuleAction::Reboot, "xid-fallen-off-bus", &[xid("79")]),
    ];
    let faults = fold(&events, T, T + 60_000);
    let nodes: Vec<&str> = faults.iter().map(|f| f.node.as_str()).collect();
    assert_eq!(nodes, ["n1", "n1", "n2"]);
}

#[test]
fn only_faults_first_decided_in_the_window_are_kept() {
    let events = [
        decision(T, "n1", RuleAction::Reboot, "r", &[xid("79")]),
        decision(T + 10_000, "n2", RuleAction::Reboot, "r", &[xid("79")]),
        decision(T + 20_000, "n3", RuleAction::Reboot, "r", &[xid("79")]),
    ];
    let faults = fold(&events, T + 10_000, T + 20_000);
    let nodes: Vec<&str> = faults.iter().map(|f| f.node.as_str()).collect();
    assert_eq!(nodes, ["n2"]);
}

/// A store whose trail holds a reboot decision every minute on node `n{i}`.
fn store_with(decisions: u64) -> Store {
    let store = Store::in_memory().unwrap();
    for i in 0..decisions {
        let at = T + i * 60_000;
        store
            .append_event(&decision(at, &format!("n{i}"), RuleAction::Reboot, "r", &[xid("79")]))
            .unwrap();
    }
    store
}

#[test]
fn the_export_reads_its_window_and_refuses_past_its_limit() {
    let store = store_with(100);
    let history = export(&store, T + 30 * 60_000, T + 40 * 60_000, 10).unwrap();
    assert_eq!(history.version, HISTORY_VERSION);
    let nodes: Vec<String> = history.faults.iter().map(|f| f.node.clone()).collect();
    let wanted: Vec<String> = (30..40).map(|i| format!("n{i}")).collect();
    assert_eq!(nodes, wanted);
    let err = export(&store, T + 30 * 60_000, T + 41 * 60_000, 10).unwrap_err();
    assert!(matches!(err, HistoryError::TooManyFaults { limit: 10 }), "{err}");
    assert!(err.to_string().contains("more than 10 faults"), "{err}");
    // A window that ends before it starts holds nothing.
    assert!(export(&store, T + 31 * 60_000, T + 30 * 60_000, 10).unwrap().faults.is_empty());
    assert!(matches!(export(&store, T, T + 1, 0), Err(HistoryError::Limit { limit: 0 })));
    assert!(matches!(export(&store, T, T + 1, MAX_LIMIT + 1), Err(HistoryError::Limit { .. })));
    // An empty trail, and a window past its end.
    let empty = Store::in_memory().unwrap();
    assert!(export(&empty, T, T + 1, 10).unwrap().faults.is_empty());
    assert!(export(&store, T + 1_000 * 60_000, u64::MAX, 10).unwrap().faults.is_empty());
}

#[test]
fn the_export_starts_a_day_before_its_window_and_no_earlier() {
    // One decision a minute for two days: the binary search starts the read at `since` less a
    // day; the window's first fault is found whatever the trail's length.
    let store = store_with(2 * 24 * 60);
    let since = T + 36 * 3_600_000;
    let history = export(&store, since, since + 60_000, 10).unwrap();
    assert_eq!(history.faults.len(), 1);
    assert_eq!(history.faults[0].decided_ms(), since);
    let start = super::export::first_at_or_after(&store, since - LOOKBACK_MS).unwrap();
    let first = store.events(start, None, 1).unwrap();
    assert_eq!(first[0].at_ms, since - LOOKBACK_MS);
}

fn document() -> FaultHistory {
    let events = [
        decision(T, "n1", RuleAction::Reboot, "xid-fallen-off-bus", &[xid("79")]),
        step(T + 1_000, "n1", 7, RuleAction::Reboot, "Repair"),
    ];
    FaultHistory { version: 1, since_ms: T, until_ms: T + 60_000, faults: fold(&events, T, T + 1) }
}

#[test]
fn a_document_reads_back_as_written() {
    let history = document();
    let text = serde_json::to_string_pretty(&history).unwrap();
    assert_eq!(FaultHistory::parse(&text).unwrap(), history);
}

#[test]
fn a_bad_document_is_refused_naming_each_bad_entry() {
    let mut value = serde_json::to_value(document()).unwrap();
    let good = value["faults"][0].clone();
    let mut no_node = good.clone();
    no_node.as_object_mut().unwrap().remove("node");
    let mut colour = good.clone();
    colour["colour"] = "blue".into();
    value["faults"] = serde_json::json!([good, no_node, colour]);
    let err = FaultHistory::parse(&value.to_string()).unwrap_err().to_string();
    assert!(err.starts_with("2 problem(s)"), "{err}");
    assert!(err.contains("faults[1]: missing field `node`"), "{err}");
    assert!(err.contains("faults[2]: unknown field `colour`"), "{err}");

    let mut bad = document();
    bad.until_ms = bad.since_ms - 1;
    bad.faults[0].node = "no such/node".into();
    bad.faults[0].finding.check = String::new();
    bad.faults[0].decisions[0].at_ms = T - 1;
    bad.faults[0].cleared_ms = Some(T - 5);
    let err = FaultHistory::parse(&serde_json::to_string(&bad).unwrap()).unwrap_err().to_string();
    for wanted in [
        "until_ms: is before since_ms",
        "faults[0].node: \"no such/node\" is not a node name",
        "faults[0].finding.check: must not be empty",
        "faults[0].decisions[0].at_ms",
        "faults[0].cleared_ms",
    ] {
        assert!(err.contains(wanted), "{wanted}: {err}");
    }
    let mut empty = document();
    empty.faults[0].decisions.clear();
    let err = FaultHistory::parse(&serde_json::to_string(&empty).unwrap()).unwrap_err();
    assert!(err.to_string().contains("faults[0].decisions: must hold at least one"), "{err}");
}

#[test]
fn another_version_or_no_document_is_refused_by_name() {
    let mut value = serde_json::to_value(document()).unwrap();
    value["version"] = 2.into();
    let err = FaultHistory::parse(&value.to_string()).unwrap_err();
    assert_eq!(err.to_string(), "version 2 is not one this fleetmend reads (it reads version 1)");
    let err = FaultHistory::parse("[1, 2]").unwrap_err();
    assert!(err.to_string().starts_with("not a fault history"), "{err}");
}
