//! `next_change` against `decide`: between now and the instant it names, `decide` answers the same
//! at every moment; at that instant, where a case is built to turn, it answers otherwise. Cases
//! cover every clock `decide` reads: a debounce, a drain window (the rule's and the policy's), a
//! cooldown, the reboot and the remediation windows.

use std::time::Duration;

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::rules::rule;
use super::*;
use crate::model::{FindingSource, RuleAction};

const NOW: u64 = 1_800_000_000_000;
const MIN: u64 = 60_000;

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

fn slow_link() -> Finding {
    Finding::new("nic", "link_slow", "eth0", Status::Fail, RecommendedAction::Reboot, "")
}

fn xid79() -> Finding {
    Finding::new("gpu", "xid", "0", Status::Fail, RecommendedAction::Reboot, "")
        .with_label("xid", "79")
}

/// The built-in rules and one that reboots a slow link only after 5 minutes, drains a hot GPU
/// with its own 2-minute drain window.
fn policy() -> Policy {
    let mut slow = rule("slow-link", RuleActionSpec::Reboot);
    slow.finding = Some("link_slow".to_owned());
    slow.for_duration = Duration::from_secs(300);
    let mut hot = rule("hot-gpu", RuleActionSpec::Drain);
    hot.finding = Some("hot".to_owned());
    hot.drain_window = Some(Duration::from_secs(120));
    Policy { rules: vec![slow, hot], ..Policy::default() }
}

fn fleet() -> FleetView {
    FleetView { members: 50, size: 50, unavailable: 0, repairs_in_flight: 0, breaker_open: false }
}

struct Case {
    name: &'static str,
    state: NodeState,
    state_since_ms: u64,
    findings: Vec<TrackedFinding>,
    history: Vec<RepairRecord>,
    cooldown_until_ms: u64,
    booted_ms: Option<u64>,
    /// When the decision turns, as `next_change` must say (None: never with time alone).
    turns_at: Option<u64>,
}

fn cases() -> Vec<Case> {
    let base = Case {
        name: "",
        state: NodeState::Healthy,
        state_since_ms: NOW - MIN,
        findings: Vec::new(),
        history: Vec::new(),
        cooldown_until_ms: 0,
        booted_ms: None,
        turns_at: None,
    };
    let reboot =
        |finished_ms| RepairRecord { action: RuleAction::Reboot, finished_ms, succeeded: true };
    let hot = Finding::new("gpu", "hot", "0", Status::Fail, RecommendedAction::Drain, "");
    vec![
        Case {
            name: "a debounce of 5 minutes ends",
            state: NodeState::Suspect,
            findings: vec![tracked(slow_link(), 3, 2 * MIN)],
            turns_at: Some(NOW + 3 * MIN),
            ..base.clone()
        },
        Case {
            name: "a drained node's policy drain window passes",
            state: NodeState::Drained,
            state_since_ms: NOW - MIN,
            findings: vec![tracked(
                Finding::new("nic", "nic_down", "eth0", Status::Fail, RecommendedAction::Drain, ""),
                3,
                10 * MIN,
            )],
            turns_at: Some(NOW - MIN + 5 * MIN),
            ..base.clone()
        },
        Case {
            name: "a drained node's rule drain window passes",
            state: NodeState::Drained,
            state_since_ms: NOW - MIN,
            findings: vec![tracked(hot, 3, 10 * MIN)],
            turns_at: Some(NOW + MIN),
            ..base.clone()
        },
        Case {
            name: "a cooldown ends",
            state: NodeState::Suspect,
            findings: vec![tracked(xid79(), 1, 0)],
            cooldown_until_ms: NOW + 7 * MIN,
            turns_at: Some(NOW + 7 * MIN),
            ..base.clone()
        },
        Case {
            name: "a reboot leaves the reboot window",
            state: NodeState::Suspect,
            findings: vec![tracked(xid79(), 1, 0)],
            history: vec![reboot(NOW - 50 * MIN)],
            turns_at: Some(NOW - 50 * MIN + 60 * MIN + 1),
            ..base.clone()
        },
        Case {
            name: "a lemon's oldest repair leaves the remediation window",
            state: NodeState::Suspect,
            findings: vec![tracked(xid79(), 1, 0)],
            history: vec![
                reboot(NOW - 7 * 24 * 60 * MIN + 2 * MIN),
                reboot(NOW - 3 * 24 * 60 * MIN),
                reboot(NOW - 2 * 24 * 60 * MIN),
            ],
            turns_at: Some(NOW + 2 * MIN + 1),
            ..base.clone()
        },
        Case {
            name: "a boot transient's grace ends",
            state: NodeState::Suspect,
            findings: vec![tracked(
                Finding::new("nic", "nic_down", "eth0", Status::Fail, RecommendedAction::Drain, ""),
                3,
                MIN,
            )],
            booted_ms: Some(NOW - 2 * MIN),
            turns_at: Some(NOW - 2 * MIN + 5 * MIN),
            ..base.clone()
        },
        Case {
            name: "an alert never changes with time",
            state: NodeState::Healthy,
            findings: vec![tracked(
                Finding::new("gpu", "temperature", "0", Status::Warn, RecommendedAction::None, ""),
                1,
                0,
            )],
            ..base.clone()
        },
        Case {
            name: "observations, not time, finish this debounce",
            state: NodeState::Suspect,
            findings: vec![tracked(
                Finding::new("gpu", "row_remap", "0", Status::Fail, RecommendedAction::Replace, ""),
                1,
                0,
            )],
            ..base
        },
    ]
}

impl Clone for Case {
    fn clone(&self) -> Case {
        Case {
            name: self.name,
            state: self.state,
            state_since_ms: self.state_since_ms,
            findings: self.findings.clone(),
            history: self.history.clone(),
            cooldown_until_ms: self.cooldown_until_ms,
            booted_ms: self.booted_ms,
            turns_at: self.turns_at,
        }
    }
}

#[test]
fn decide_answers_the_same_until_next_change_and_otherwise_at_it() {
    let policy = policy();
    let mut rng = fastrand::Rng::with_seed(7);
    for case in cases() {
        let view = NodeView {
            state: case.state,
            state_since_ms: case.state_since_ms,
            findings: &case.findings,
            history: &case.history,
            cooldown_until_ms: case.cooldown_until_ms,
            approved: None,
            booted_ms: case.booted_ms,
        };
        let next = next_change(view, &policy, NOW);
        let until = next.unwrap_or(NOW + 30 * 24 * 60 * MIN);
        let first = decide(view, fleet(), &policy, NOW);
        let mut moments: Vec<u64> = (0..200).map(|_| rng.u64(NOW..until)).collect();
        moments.push(until - 1);
        for at in moments {
            assert_eq!(
                decide(view, fleet(), &policy, at),
                first,
                "{}: decided otherwise at +{} ms, before next_change (+{} ms)",
                case.name,
                at - NOW,
                until - NOW
            );
        }
        if let Some(turns_at) = case.turns_at {
            assert!(
                next.is_some_and(|n| n <= turns_at),
                "{}: next_change {next:?} is after the turn at {turns_at}",
                case.name
            );
            assert_ne!(
                decide(view, fleet(), &policy, turns_at),
                first,
                "{}: the decision did not turn at +{} ms",
                case.name,
                turns_at - NOW
            );
        } else {
            assert_eq!(next, None, "{}: nothing turns with time alone", case.name);
        }
    }
}

#[test]
fn instants_already_past_are_not_named_again() {
    let policy = policy();
    let findings = [tracked(slow_link(), 3, 10 * MIN)];
    let view = NodeView {
        state: NodeState::Suspect,
        state_since_ms: NOW,
        findings: &findings,
        history: &[],
        cooldown_until_ms: NOW - 1,
        approved: None,
        booted_ms: None,
    };
    assert_eq!(next_change(view, &policy, NOW), None);
}
