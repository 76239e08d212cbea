use std::collections::BTreeMap;
use std::time::Duration;

use fleetmend_proto::{RecommendedAction, Status};

use super::rules::{REASON_MESSAGE_CHARS, message_part, rule};
use super::*;
use crate::model::FindingSource;

#[test]
fn a_reason_carries_the_findings_message_on_one_line_and_cut() {
    assert_eq!(message_part(""), "");
    assert_eq!(
        message_part("Xid 79 on GPU 0\n(fell off the bus)"),
        ": Xid 79 on GPU 0 (fell off the bus)"
    );
    let long = "x".repeat(500);
    let part = message_part(&long);
    assert_eq!(part.chars().count(), 2 + REASON_MESSAGE_CHARS + 1, "{part}");
    assert!(part.ends_with('…'));
}

const NOW: u64 = 1_800_000_000_000;

fn finding(check: &str, id: &str, status: Status, action: RecommendedAction) -> Finding {
    Finding::new(check, id, "0", status, action, "")
}

fn xid(code: &str) -> Finding {
    finding("gpu", "xid", Status::Fail, RecommendedAction::Reboot).with_label("xid", code)
}

fn tracked(finding: Finding, observations: u32, age_ms: u64) -> TrackedFinding {
    TrackedFinding {
        finding,
        source: FindingSource::Agent,
        first_seen_ms: NOW - age_ms,
        last_seen_ms: NOW,
        observations,
        looked_ms: None,
    }
}

fn fleet() -> FleetView {
    FleetView { members: 20, size: 20, unavailable: 0, repairs_in_flight: 0, breaker_open: false }
}

fn node<'a>(state: NodeState, findings: &'a [TrackedFinding]) -> NodeView<'a> {
    NodeView {
        state,
        state_since_ms: NOW,
        findings,
        history: &[],
        cooldown_until_ms: 0,
        approved: None,
        booted_ms: None,
    }
}

fn action_of(decision: &Decision) -> Option<(RuleAction, &str)> {
    match decision {
        Decision::Act(v) | Decision::Record(v) | Decision::Alert(v) | Decision::Quarantine(v) => {
            Some((v.action, v.rule.as_str()))
        }
        Decision::Held { verdict, .. } => Some((verdict.action, verdict.rule.as_str())),
        _ => None,
    }
}

#[test]
fn rule_kinds_map_findings_to_actions() {
    let policy = Policy::default();
    let table: Vec<(&str, Finding, u32, RuleAction, &str)> = vec![
        ("xid 79 reboots at once", xid("79"), 1, RuleAction::Reboot, "xid-fallen-off-bus"),
        ("xid 48 reboots (gpu reset)", xid("48"), 1, RuleAction::Reboot, "xid-gpu-reset"),
        (
            "row remap failure follows the agent: replace",
            finding("gpu", "row_remap", Status::Fail, RecommendedAction::Replace),
            2,
            RuleAction::Replace,
            "agent-recommendation",
        ),
        (
            "nic down follows the agent: drain (a boot transient, no boot heard of)",
            finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain),
            2,
            RuleAction::Drain,
            "boot-transient-nic_down",
        ),
        (
            "reset-gpu becomes a reboot",
            finding("gpu", "ecc_uncorrected", Status::Fail, RecommendedAction::ResetGpu),
            2,
            RuleAction::Reboot,
            "agent-recommendation",
        ),
        (
            "a warning alerts",
            finding("gpu", "temperature", Status::Warn, RecommendedAction::None),
            1,
            RuleAction::Alert,
            "warnings",
        ),
        (
            "restart-app only alerts",
            finding("gpu", "xid13", Status::Fail, RecommendedAction::RestartApp),
            2,
            RuleAction::Alert,
            "agent-recommendation",
        ),
    ];
    for (name, f, observations, want, rule) in table {
        let findings = [tracked(f, observations, 60_000)];
        let decision = decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW);
        assert_eq!(action_of(&decision), Some((want, rule)), "{name}: {decision:?}");
    }
}

#[test]
fn an_ok_or_unknown_finding_matches_nothing() {
    let policy = Policy::default();
    for status in [Status::Ok, Status::Unknown] {
        let findings = [tracked(finding("gpu", "x", status, RecommendedAction::Reboot), 5, 0)];
        assert_eq!(
            decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW),
            Decision::Nothing
        );
    }
}

#[test]
fn a_user_rule_comes_first_and_none_silences() {
    let mut policy = Policy::default();
    policy.rules.push(RuleConfig {
        finding: Some("xid".to_owned()),
        labels: BTreeMap::from([("xid".to_owned(), vec!["79".to_owned()])]),
        ..rule("ignore-79-here", RuleActionSpec::None)
    });
    let findings = [tracked(xid("79"), 1, 0)];
    assert_eq!(
        decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW),
        Decision::Nothing
    );
    // A label that does not match leaves the built-in in charge.
    let findings = [tracked(xid("48"), 1, 0)];
    assert_eq!(
        action_of(&decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW)),
        Some((RuleAction::Reboot, "xid-gpu-reset"))
    );
}

#[test]
fn a_user_rule_replaces_the_builtin_of_the_same_name() {
    let mut policy = Policy::default();
    policy.rules.push(RuleConfig {
        finding: Some("xid".to_owned()),
        labels: BTreeMap::from([("xid".to_owned(), vec!["79".to_owned()])]),
        ..rule("xid-fallen-off-bus", RuleActionSpec::Replace)
    });
    let findings = [tracked(xid("79"), 1, 0)];
    assert_eq!(
        action_of(&decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW)),
        Some((RuleAction::Replace, "xid-fallen-off-bus"))
    );
    assert_eq!(
        policy.effective_rules().iter().filter(|r| r.name == "xid-fallen-off-bus").count(),
        1
    );
}

#[test]
fn debounce_by_observations_and_by_duration() {
    let mut policy = Policy::default();
    let nic = finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain);
    // agent-recommendation wants 2 observations: one makes the node suspect.
    let findings = [tracked(nic.clone(), 1, 0)];
    assert_eq!(
        decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW),
        Decision::Become {
            state: NodeState::Suspect,
            reason: "a failing finding matched a rule; waiting for its debounce".to_owned()
        }
    );
    assert_eq!(
        decide(node(NodeState::Suspect, &findings), fleet(), &policy, NOW),
        Decision::Nothing
    );
    let findings = [tracked(nic.clone(), 2, 0)];
    assert!(matches!(
        decide(node(NodeState::Suspect, &findings), fleet(), &policy, NOW),
        Decision::Act(_)
    ));

    policy.rules.push(RuleConfig {
        finding: Some("nic_down".to_owned()),
        for_duration: Duration::from_secs(30),
        ..rule("nic-30s", RuleActionSpec::Drain)
    });
    let young = [tracked(nic.clone(), 9, 29_000)];
    assert!(matches!(
        decide(node(NodeState::Healthy, &young), fleet(), &policy, NOW),
        Decision::Become { state: NodeState::Suspect, .. }
    ));
    let old = [tracked(nic, 9, 30_000)];
    assert_eq!(
        action_of(&decide(node(NodeState::Suspect, &old), fleet(), &policy, NOW)),
        Some((RuleAction::Drain, "nic-30s"))
    );
}

#[test]
fn the_most_disruptive_finding_wins_and_collects_its_peers() {
    let policy = Policy::default();
    let findings = [
        tracked(finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain), 3, 0),
        tracked(xid("79"), 1, 0),
        tracked(xid("79").with_label("pci", "b"), 1, 0),
    ];
    let Decision::Act(verdict) = decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW)
    else {
        panic!("expected an action");
    };
    assert_eq!(verdict.action, RuleAction::Reboot);
    assert_eq!(verdict.findings.len(), 2);
}

#[test]
fn clearing_before_action_and_after_a_drain() {
    let policy = Policy::default();
    assert!(matches!(
        decide(node(NodeState::Suspect, &[]), fleet(), &policy, NOW),
        Decision::Become { state: NodeState::Healthy, .. }
    ));
    assert!(matches!(
        decide(node(NodeState::Unreachable, &[]), fleet(), &policy, NOW),
        Decision::Become { state: NodeState::Healthy, .. }
    ));
    assert!(matches!(
        decide(node(NodeState::Drained, &[]), fleet(), &policy, NOW),
        Decision::Release { .. }
    ));
    assert_eq!(decide(node(NodeState::Healthy, &[]), fleet(), &policy, NOW), Decision::Nothing);
    // Still failing: a drained node stays drained; a worse fault escalates to a repair.
    let nic = [tracked(finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain), 5, 0)];
    assert_eq!(decide(node(NodeState::Drained, &nic), fleet(), &policy, NOW), Decision::Nothing);
    let mut f = fleet();
    f.unavailable = 1;
    let bus = [tracked(xid("79"), 1, 0)];
    assert!(matches!(decide(node(NodeState::Drained, &bus), f, &policy, NOW), Decision::Act(_)));
}

#[test]
fn nodes_in_a_workflow_or_quarantine_are_left_alone() {
    let policy = Policy::default();
    let bus = [tracked(xid("79"), 1, 0)];
    for state in [
        NodeState::Draining,
        NodeState::Repairing,
        NodeState::Validating,
        NodeState::Quarantined,
        NodeState::Retired,
    ] {
        assert_eq!(decide(node(state, &bus), fleet(), &policy, NOW), Decision::Nothing, "{state}");
    }
}

#[test]
fn guard_rails_hold_actions() {
    let policy = Policy::default();
    let bus = [tracked(xid("79"), 1, 0)];
    let hold = |view: NodeView<'_>, fleet: FleetView| match decide(view, fleet, &policy, NOW) {
        Decision::Held { hold, .. } => Some(hold),
        _ => None,
    };
    let mut f = fleet();
    f.breaker_open = true;
    assert_eq!(hold(node(NodeState::Healthy, &bus), f), Some(Hold::Breaker));

    let mut cooling = node(NodeState::Healthy, &bus);
    cooling.cooldown_until_ms = NOW + 1;
    assert_eq!(hold(cooling, fleet()), Some(Hold::Cooldown));
    cooling.cooldown_until_ms = NOW;
    assert_eq!(hold(cooling, fleet()), None);

    let mut f = fleet();
    f.repairs_in_flight = 2;
    assert_eq!(hold(node(NodeState::Healthy, &bus), f), Some(Hold::MaxConcurrentRepairs));
    // A drain is not a repair: only the unavailable fraction limits it.
    let nic = [tracked(finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain), 2, 0)];
    assert_eq!(hold(node(NodeState::Healthy, &nic), f), None);

    // 10 % of 20 = 2 unavailable at most.
    let mut f = fleet();
    f.unavailable = 2;
    assert_eq!(hold(node(NodeState::Healthy, &bus), f), Some(Hold::MaxUnavailable));
    // A node already out (unreachable) does not add to the count.
    assert_eq!(hold(node(NodeState::Unreachable, &bus), f), None);
    // At least one node may always be taken out, even in a tiny fleet.
    let tiny = FleetView {
        members: 5,
        size: 5,
        unavailable: 0,
        repairs_in_flight: 0,
        breaker_open: false,
    };
    assert_eq!(hold(node(NodeState::Healthy, &bus), tiny), None);
    let tiny = FleetView { unavailable: 1, ..tiny };
    assert_eq!(hold(node(NodeState::Healthy, &bus), tiny), Some(Hold::MaxUnavailable));
}

#[test]
fn a_reboot_that_did_not_help_escalates_to_replace() {
    let policy = Policy::default();
    let bus = [tracked(xid("79"), 1, 0)];
    let recent =
        [RepairRecord { action: RuleAction::Reboot, finished_ms: NOW - 60_000, succeeded: true }];
    let mut view = node(NodeState::Healthy, &bus);
    view.history = &recent;
    let Decision::Act(verdict) = decide(view, fleet(), &policy, NOW) else { panic!() };
    assert_eq!(verdict.action, RuleAction::Replace);
    assert!(verdict.reason.contains("escalating to replace"), "{}", verdict.reason);
    // Long after the reboot, a new fault is a new reboot.
    let old = [RepairRecord {
        action: RuleAction::Reboot,
        finished_ms: NOW - 7_200_000,
        succeeded: true,
    }];
    view.history = &old;
    assert_eq!(
        action_of(&decide(view, fleet(), &policy, NOW)).map(|a| a.0),
        Some(RuleAction::Reboot)
    );
}

#[test]
fn three_repairs_in_a_week_quarantine_a_lemon() {
    let policy = Policy::default();
    let bus = [tracked(xid("79"), 1, 0)];
    let day = 86_400_000;
    let history: Vec<RepairRecord> = [6 * day, 4 * day, 2 * day]
        .iter()
        .map(|ago| RepairRecord {
            action: RuleAction::Reboot,
            finished_ms: NOW - ago,
            succeeded: true,
        })
        .collect();
    let mut view = node(NodeState::Healthy, &bus);
    view.history = &history;
    assert!(matches!(decide(view, fleet(), &policy, NOW), Decision::Quarantine(_)));
    // Two of them older than a week: not a lemon.
    let history: Vec<RepairRecord> = [9 * day, 8 * day, 2 * day]
        .iter()
        .map(|ago| RepairRecord {
            action: RuleAction::Reboot,
            finished_ms: NOW - ago,
            succeeded: true,
        })
        .collect();
    view.history = &history;
    assert!(matches!(decide(view, fleet(), &policy, NOW), Decision::Act(_)));
}

#[test]
fn dry_run_records_and_approve_waits_for_a_person() {
    let bus = [tracked(xid("79"), 1, 0)];
    let policy = Policy { mode: Mode::DryRun, ..Policy::default() };
    assert!(matches!(
        decide(node(NodeState::Healthy, &bus), fleet(), &policy, NOW),
        Decision::Record(_)
    ));
    let policy = Policy { mode: Mode::Approve, ..Policy::default() };
    assert!(matches!(
        decide(node(NodeState::Healthy, &bus), fleet(), &policy, NOW),
        Decision::Held { hold: Hold::AwaitingApproval, .. }
    ));
    let mut view = node(NodeState::Healthy, &bus);
    view.approved = Some(RuleAction::Drain);
    assert!(
        matches!(
            decide(view, fleet(), &policy, NOW),
            Decision::Held { hold: Hold::AwaitingApproval, .. }
        ),
        "approving a drain does not approve a reboot"
    );
    view.approved = Some(RuleAction::Reboot);
    assert!(matches!(decide(view, fleet(), &policy, NOW), Decision::Act(_)));
}

#[test]
fn the_default_breaker_trips_at_a_leaf_switch_and_not_at_a_large_fleets_failure_rate() {
    let guard = GuardRails::default();
    // 2,048 nodes: 11 within the window (more than 0.5 %), the 16 behind the smallest leaf
    // switch, a 10 % rollout; not 10, more than the Llama 3 run's ~8 failures a day saw in a day.
    assert!(breaker_trips(11, 2048, &guard));
    assert!(breaker_trips(16, 2048, &guard));
    assert!(breaker_trips(205, 2048, &guard));
    assert!(!breaker_trips(10, 2048, &guard));
    // A small fleet: three at once is a storm, two is bad luck.
    assert!(breaker_trips(3, 20, &guard));
    assert!(!breaker_trips(2, 20, &guard));
    assert!(!breaker_trips(2, 5, &guard));
}

#[test]
fn the_breaker_needs_a_fraction_and_a_minimum() {
    let guard = GuardRails { breaker_fraction: 0.20, ..GuardRails::default() };
    assert!(breaker_trips(6, 20, &guard), "6 of 20 within the window");
    assert!(!breaker_trips(4, 20, &guard), "20 % is not more than 20 %");
    assert!(breaker_trips(3, 5, &guard));
    assert!(!breaker_trips(2, 5, &guard), "two faults in five nodes are not a storm");
    assert!(!breaker_trips(0, 0, &guard));
}

#[test]
fn policy_problems_name_their_fields() {
    let mut policy = Policy::default();
    policy.rules.push(RuleConfig { observations: 0, ..rule("a", RuleActionSpec::Drain) });
    policy.rules.push(rule("a", RuleActionSpec::Drain));
    policy.guard_rails.breaker_fraction = 0.0;
    let fields: Vec<String> = policy.problems("policy").into_iter().map(|p| p.0).collect();
    assert!(fields.contains(&"policy.rules[0].observations".to_owned()), "{fields:?}");
    assert!(fields.contains(&"policy.rules[1].name".to_owned()), "{fields:?}");
    assert!(fields.contains(&"policy.guard_rails.breaker_fraction".to_owned()), "{fields:?}");
}

#[test]
fn the_ladder_goes_from_drain_to_reboot_after_the_drain_window_and_stops_where_its_rule_says() {
    let minute = 60_000;
    let nic = [tracked(finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain), 9, 0)];
    let bus = [tracked(xid("79"), 1, 0)];
    let nic_rule = |window: Option<u64>, stop: Option<Rung>| RuleConfig {
        finding: Some("nic_down".to_owned()),
        drain_window: window.map(Duration::from_millis),
        stop_at: stop,
        ..rule("nic", RuleActionSpec::Drain)
    };
    let with_rule = |r: RuleConfig| Policy { rules: vec![r], ..Policy::default() };
    let reboots = |ago: &[u64]| -> Vec<RepairRecord> {
        ago.iter()
            .map(|a| RepairRecord {
                action: RuleAction::Reboot,
                finished_ms: NOW - a,
                succeeded: true,
            })
            .collect()
    };
    let three = reboots(&[3 * 86_400_000, 2 * 86_400_000, 86_400_000]);
    let just_rebooted = reboots(&[minute]);
    // (case, state, drained how long ago, findings, policy, history, expected, reason contains)
    type Row<'a> = (
        &'a str,
        NodeState,
        u64,
        &'a [TrackedFinding],
        Policy,
        &'a [RepairRecord],
        Option<(&'a str, RuleAction)>,
        &'a str,
    );
    let table: Vec<Row> = vec![
        (
            "drained 1 min ago, window 5 min: not yet",
            NodeState::Drained,
            minute,
            &nic,
            Policy::default(),
            &[],
            None,
            "",
        ),
        (
            "drained 6 min ago: the window passed, reboot",
            NodeState::Drained,
            6 * minute,
            &nic,
            Policy::default(),
            &[],
            Some(("act", RuleAction::Reboot)),
            "still there 5m after the drain, escalating to reboot",
        ),
        (
            "the rule's own window (30 s) comes first",
            NodeState::Drained,
            minute,
            &nic,
            with_rule(nic_rule(Some(30_000), None)),
            &[],
            Some(("act", RuleAction::Reboot)),
            "still there 30s after the drain",
        ),
        (
            "a rule that stops at drain: a person decides, quarantined",
            NodeState::Drained,
            6 * minute,
            &nic,
            with_rule(nic_rule(None, Some(Rung::Drain))),
            &[],
            Some(("quarantine", RuleAction::Reboot)),
            "rule nic stops the ladder at drain: a person decides",
        ),
        (
            "a rule that stops at drain starts there, whatever the finding recommends",
            NodeState::Healthy,
            0,
            &bus,
            with_rule(RuleConfig {
                stop_at: Some(Rung::Drain),
                ..rule("all", RuleActionSpec::Recommended)
            }),
            &[],
            Some(("act", RuleAction::Drain)),
            "",
        ),
        (
            "a reboot that did not help and a rule that stops at reboot: a person",
            NodeState::Healthy,
            0,
            &bus,
            with_rule(RuleConfig {
                stop_at: Some(Rung::Reboot),
                ..rule("all", RuleActionSpec::Recommended)
            }),
            &just_rebooted,
            Some(("quarantine", RuleAction::Replace)),
            "rule all stops the ladder at reboot",
        ),
        (
            "attempts exhausted: max_remediation_attempts repairs in the window quarantine",
            NodeState::Drained,
            6 * minute,
            &nic,
            Policy::default(),
            &three,
            Some(("quarantine", RuleAction::Reboot)),
            "3 repairs within 7days: a lemon (max_remediation_attempts)",
        ),
    ];
    for (case, state, ago, findings, policy, history, expected, words) in table {
        let view = NodeView { state_since_ms: NOW - ago, history, ..node(state, findings) };
        let decision = decide(view, fleet(), &policy, NOW);
        let got = match &decision {
            Decision::Act(v) => Some(("act", v.action, v.reason.as_str())),
            Decision::Quarantine(v) => Some(("quarantine", v.action, v.reason.as_str())),
            Decision::Nothing => None,
            other => panic!("{case}: {other:?}"),
        };
        assert_eq!(got.map(|(k, a, _)| (k, a)), expected, "{case}: {decision:?}");
        if let Some((_, _, reason)) = got {
            assert!(reason.contains(words), "{case}: {reason}");
        }
    }
}

#[test]
fn a_stop_below_the_rules_own_action_is_a_problem() {
    let policy = Policy {
        rules: vec![RuleConfig {
            stop_at: Some(Rung::Drain),
            drain_window: Some(Duration::ZERO),
            boot_grace: Some(Duration::ZERO),
            ..rule("xid", RuleActionSpec::Reboot)
        }],
        ..Policy::default()
    };
    let fields: Vec<String> = policy.problems("policy").into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        ["policy.rules[0].stop_at", "policy.rules[0].drain_window", "policy.rules[0].boot_grace"]
    );
}

/// Boot transients, per rule: each finding of [`rules::BOOT_TRANSIENTS`] first seen within
/// `BOOT_GRACE` of the node's boot waits until the grace ends (the node stays suspect, nothing is
/// done); the same finding seen later, on a node not just booted, or any other finding, is
/// decided as always.
#[test]
fn boot_transients_wait_out_their_grace_after_a_boot_and_nothing_else_does() {
    let policy = Policy::default();
    let grace = rules::BOOT_GRACE.as_millis() as u64;
    let min = 60_000;
    for id in rules::BOOT_TRANSIENTS {
        let transient = finding("nic", id, Status::Fail, RecommendedAction::Drain);
        // (case, booted this long ago, first seen this long ago, acted on now)
        let table: [(&str, Option<u64>, u64, bool); 5] = [
            ("seen a minute after the boot, within the grace", Some(2 * min), min, false),
            ("seen at the boot, the grace just over", Some(grace), grace, true),
            ("seen within the grace, still there after it", Some(grace + min), grace, true),
            ("seen after the grace", Some(grace + 2 * min), min, true),
            ("no boot heard of since the repairer knew the node", None, min, true),
        ];
        for (case, booted_ago, seen_ago, acts) in table {
            let findings = [tracked(transient.clone(), 3, seen_ago)];
            let view = NodeView {
                booted_ms: booted_ago.map(|ago| NOW - ago),
                ..node(NodeState::Suspect, &findings)
            };
            let decision = decide(view, fleet(), &policy, NOW);
            let rule = format!("boot-transient-{id}");
            match acts {
                true => assert_eq!(
                    action_of(&decision),
                    Some((RuleAction::Drain, rule.as_str())),
                    "{id}: {case}: {decision:?}"
                ),
                false => assert!(action_of(&decision).is_none(), "{id}: {case}: {decision:?}"),
            }
        }
    }
    // Not a transient: an Xid right after a boot is acted on at once.
    let findings = [tracked(xid("79"), 1, 0)];
    let view = NodeView { booted_ms: Some(NOW - min), ..node(NodeState::Healthy, &findings) };
    assert_eq!(
        action_of(&decide(view, fleet(), &policy, NOW)).map(|a| a.0),
        Some(RuleAction::Reboot)
    );
}
