//! Policy: rules that map findings to actions, guard rails no rule can bypass, escalation, and the
//! pure [`decide`] that applies them to one node.
//!
//! `decide` does no I/O and reads no clock: the caller passes the node, the fleet and `now`, and
//! carries out (and records) the decision. Table tests cover every rule kind, guard rail, escalation,
//! lemon and clearing case.

mod escalation;
mod guard_rails;
mod rules;
mod share;

use fleetmend_proto::Finding;
use serde::{Deserialize, Serialize};

pub use self::escalation::Escalation;
pub use self::guard_rails::{GuardRails, Hold, breaker_trips};
pub use self::rules::{
    BOOT_GRACE, BOOT_TRANSIENTS, RuleActionSpec, RuleConfig, Rung, builtin_rules,
};
pub use self::share::FleetShare;
use crate::model::{NodeState, RuleAction, TrackedFinding};

/// How the repairer acts on its decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Decide and act.
    Enforce,
    /// Decide and record; act on nothing.
    DryRun,
    /// Decide, then wait for a person (`fleetmend approve NODE`) before acting.
    Approve,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::DryRun => "dry-run",
            Mode::Approve => "approve",
        }
    }
}

/// The whole policy (`[policy]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub mode: Mode,
    /// Use the built-in rules after the user's.
    pub builtin_rules: bool,
    /// User rules, tried in order before the built-in ones.
    pub rules: Vec<RuleConfig>,
    pub guard_rails: GuardRails,
    pub escalation: Escalation,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: Mode::Enforce,
            builtin_rules: true,
            rules: Vec::new(),
            guard_rails: GuardRails::default(),
            escalation: Escalation::default(),
        }
    }
}

impl Policy {
    /// User rules, then the built-ins not replaced by a user rule of the same name (borrowed:
    /// every decision reads them).
    pub fn effective_rules(&self) -> Vec<&RuleConfig> {
        let mut rules: Vec<&RuleConfig> = self.rules.iter().collect();
        if self.builtin_rules {
            rules.extend(
                rules::BUILTIN_RULES
                    .iter()
                    .filter(|b| !self.rules.iter().any(|r| r.name == b.name)),
            );
        }
        rules
    }

    /// Every problem with the policy as (field, message).
    pub fn problems(&self, section: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: String, message: &str| problems.push((field, message.to_owned()));
        let mut names = std::collections::BTreeSet::new();
        for (i, rule) in self.rules.iter().enumerate() {
            let at = format!("{section}.rules[{i}]");
            if rule.name.trim().is_empty() {
                push(format!("{at}.name"), "must not be empty");
            } else if !names.insert(rule.name.clone()) {
                push(format!("{at}.name"), "is used by an earlier rule");
            }
            if rule.status.is_empty() {
                push(format!("{at}.status"), "must list at least one status");
            }
            if rule.observations == 0 {
                push(format!("{at}.observations"), "must be at least 1");
            }
            if let Some(stop) = rule.stop_at
                && let Some(action) = rule.action.fixed()
                && action.weight() > stop.action().weight()
            {
                push(
                    format!("{at}.stop_at"),
                    &format!("is below the rule's own action ({action})"),
                );
            }
            if rule.drain_window.is_some_and(|w| w.is_zero()) {
                push(format!("{at}.drain_window"), "must be greater than zero");
            }
            if rule.boot_grace.is_some_and(|g| g.is_zero()) {
                push(
                    format!("{at}.boot_grace"),
                    "must be greater than zero (leave it out for none)",
                );
            }
        }
        let g = &self.guard_rails;
        if let Some(problem) = g.max_concurrent_repairs.problem() {
            push(format!("{section}.guard_rails.max_concurrent_repairs"), &problem);
        }
        for (field, value) in [
            ("max_unavailable_fraction", g.max_unavailable_fraction),
            ("breaker_fraction", g.breaker_fraction),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                push(format!("{section}.guard_rails.{field}"), "must be in (0, 1]");
            }
        }
        if g.breaker_window.is_zero() {
            push(format!("{section}.guard_rails.breaker_window"), "must be greater than zero");
        }
        if self.escalation.max_remediation_attempts == 0 {
            push(format!("{section}.escalation.max_remediation_attempts"), "must be at least 1");
        }
        problems
    }
}

/// A finished repair in a node's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepairRecord {
    pub action: RuleAction,
    pub finished_ms: u64,
    pub succeeded: bool,
}

/// What `decide` looks at for one node.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub state: NodeState,
    /// Since when it is in `state` (unix ms): a drained node's drain window counts from here.
    pub state_since_ms: u64,
    /// Every non-ok finding tracked on the node.
    pub findings: &'a [TrackedFinding],
    /// Finished repairs, oldest first.
    pub history: &'a [RepairRecord],
    /// No automatic action before this (unix ms).
    pub cooldown_until_ms: u64,
    /// An action a person approved and that has not been used yet.
    pub approved: Option<RuleAction>,
    /// When its current boot was first heard of (a report with another boot id than the one
    /// known): a rule's `boot_grace` counts from here.
    pub booted_ms: Option<u64>,
}

/// What `decide` looks at for the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetView {
    /// Nodes that are part of the fleet (not retired).
    pub members: u32,
    /// The fleet's size, what the limits given as a share of it are taken of: the inventory's
    /// nodes where there is one, else the members seen.
    pub size: u32,
    /// Of those, unavailable now.
    pub unavailable: u32,
    /// Reboots and replacements in flight.
    pub repairs_in_flight: u32,
    pub breaker_open: bool,
}

/// The action a rule chose and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub action: RuleAction,
    pub rule: String,
    pub reason: String,
    pub findings: Vec<Finding>,
    /// The rule's own drain window (else the policy's).
    pub drain_window: Option<std::time::Duration>,
    /// The rung the rule stops the ladder at; past it, a person decides.
    pub stop_at: Option<Rung>,
}

/// What to do about one node now.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Nothing,
    /// Change state without acting: healthy → suspect while a debounce runs, back to healthy when
    /// findings clear before any action, unreachable → healthy when it reports again.
    Become {
        state: NodeState,
        reason: String,
    },
    /// Send an alert about these findings (the node keeps working).
    Alert(Verdict),
    /// Start the action's workflow.
    Act(Verdict),
    /// Dry-run: record what would have been done.
    Record(Verdict),
    /// The action waits: a guard rail or an approval.
    Held {
        verdict: Verdict,
        hold: Hold,
    },
    /// A drained node's findings cleared: put it back.
    Release {
        reason: String,
    },
    /// Too many repairs: a person must look.
    Quarantine(Verdict),
}

/// Decides what to do about one node. Pure: same inputs, same decision.
pub fn decide(node: NodeView<'_>, fleet: FleetView, policy: &Policy, now_ms: u64) -> Decision {
    match node.state {
        // Workflows drive these; a quarantined node waits for a person; a retired one is history.
        NodeState::Draining
        | NodeState::Repairing
        | NodeState::Validating
        | NodeState::Quarantined
        | NodeState::Retired => return Decision::Nothing,
        NodeState::Healthy | NodeState::Suspect | NodeState::Unreachable | NodeState::Drained => {}
    }
    let (best, pending) =
        rules::best_verdict(node.findings, node.booted_ms, &policy.effective_rules(), now_ms);
    let mut verdict = match best {
        Some(verdict) if verdict.action.is_disruptive() => verdict,
        // Nothing disruptive is due: a state change first (the caller decides again right after),
        // then an alert.
        other => {
            let transition = transition_without_action(node.state, pending);
            return transition.or(other.map(Decision::Alert)).unwrap_or(Decision::Nothing);
        }
    };
    // The ladder. A rule that stops at a rung starts no higher than it.
    if let Some(stop) = verdict.stop_at
        && verdict.action.weight() > stop.action().weight()
    {
        verdict.action = stop.action();
    }
    // Drained and still failing: a reboot once the drain window has passed.
    if node.state == NodeState::Drained
        && verdict.action == RuleAction::Drain
        && !escalation::after_drain(&mut verdict, node.state_since_ms, &policy.escalation, now_ms)
    {
        return Decision::Nothing;
    }
    // A fault back soon after a reboot wants a replacement; too many repairs, a person.
    escalation::after_reboot(&mut verdict, node.history, &policy.escalation, now_ms);
    if escalation::is_lemon(&mut verdict, node.history, &policy.escalation, now_ms) {
        return Decision::Quarantine(verdict);
    }
    // Past the rung its rule stops at: a person decides.
    if let Some(stop) = verdict.stop_at
        && verdict.action.weight() > stop.action().weight()
    {
        verdict.reason = format!(
            "{}; rule {} stops the ladder at {}: a person decides",
            verdict.reason,
            verdict.rule,
            stop.action()
        );
        return Decision::Quarantine(verdict);
    }

    if let Some(hold) = guard_rails::hold(verdict.action, node, fleet, &policy.guard_rails, now_ms)
    {
        return Decision::Held { verdict, hold };
    }
    match policy.mode {
        Mode::Enforce => Decision::Act(verdict),
        Mode::DryRun => Decision::Record(verdict),
        Mode::Approve => {
            if node.approved.is_some_and(|a| a.weight() >= verdict.action.weight()) {
                Decision::Act(verdict)
            } else {
                Decision::Held { verdict, hold: Hold::AwaitingApproval }
            }
        }
    }
}

/// The earliest instant after `now_ms` at which [`decide`] could decide otherwise about `node`
/// with nothing but time changed: a finding's debounce (`for`) ending, a drained node's drain
/// window passing, the cooldown ending, a finished repair leaving the reboot or the remediation
/// window. None: only a change of the node or of the fleet can change the decision. The engine's
/// tick decides again about a node then, and not before: between these instants `decide` gives
/// the same answer (a table test holds it to that).
pub fn next_change(node: NodeView<'_>, policy: &Policy, now_ms: u64) -> Option<u64> {
    let millis = |d: std::time::Duration| d.as_millis() as u64;
    let mut next = crate::clock::Earliest::after(now_ms);
    let rules = policy.effective_rules();
    for tracked in node.findings {
        let Some(rule) = rules.iter().find(|r| r.matches(tracked)) else { continue };
        next.add_later(tracked.first_seen_ms.saturating_add(millis(rule.for_duration)));
        if let Some(ends) = rule.grace_ends(tracked, node.booted_ms) {
            next.add_later(ends);
        }
        if node.state == NodeState::Drained {
            let window = rule.drain_window.unwrap_or(policy.escalation.drain_window);
            next.add_later(node.state_since_ms.saturating_add(millis(window)));
        }
    }
    next.add_later(node.cooldown_until_ms);
    let escalation = &policy.escalation;
    for repair in node.history {
        for window in [escalation.reboot_window, escalation.remediation_window] {
            // Inside the window while `now - finished <= window`: out of it one millisecond on.
            next.add_later(repair.finished_ms.saturating_add(millis(window)).saturating_add(1));
        }
    }
    next.earliest()
}

/// The state change a node makes when no disruptive action is due: healthy → suspect while a
/// debounce runs (`pending`), and back once nothing is pending.
fn transition_without_action(state: NodeState, pending: bool) -> Option<Decision> {
    match state {
        NodeState::Healthy if pending => Some(Decision::Become {
            state: NodeState::Suspect,
            reason: "a failing finding matched a rule; waiting for its debounce".to_owned(),
        }),
        NodeState::Suspect if !pending => Some(Decision::Become {
            state: NodeState::Healthy,
            reason: "the findings cleared before any action".to_owned(),
        }),
        NodeState::Unreachable if !pending => Some(Decision::Become {
            state: NodeState::Healthy,
            reason: "the node reports again".to_owned(),
        }),
        NodeState::Drained if !pending => Some(Decision::Release {
            reason: "the findings that drained the node cleared".to_owned(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod next_change_tests;
#[cfg(test)]
mod tests;
