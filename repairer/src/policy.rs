//! Policy: rules that map findings to actions, guard rails no rule can bypass, escalation, and the
//! pure [`decide`] that applies them to one node.
//!
//! `decide` does no I/O and reads no clock: the caller passes the node, the fleet and `now`, and
//! carries out (and records) the decision. Table tests cover every rule kind, guard rail, escalation,
//! lemon and clearing case.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::{Deserialize, Serialize};

use crate::model::{FindingSource, NodeState, RuleAction, TrackedFinding};

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

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleActionSpec {
    None,
    Alert,
    Drain,
    Reboot,
    Replace,
    /// Follow the agent's recommendation on the finding (from its Xid catalog and DCGM
    /// thresholds): reset-gpu and reboot → reboot, replace → replace, drain → drain, restart-app and
    /// none → alert.
    Recommended,
}

impl RuleActionSpec {
    fn resolve(self, finding: &Finding) -> RuleAction {
        match self {
            RuleActionSpec::None => RuleAction::None,
            RuleActionSpec::Alert => RuleAction::Alert,
            RuleActionSpec::Drain => RuleAction::Drain,
            RuleActionSpec::Reboot => RuleAction::Reboot,
            RuleActionSpec::Replace => RuleAction::Replace,
            RuleActionSpec::Recommended => match finding.action {
                RecommendedAction::None | RecommendedAction::RestartApp => RuleAction::Alert,
                RecommendedAction::Drain => RuleAction::Drain,
                // No provider resets a single GPU yet; a reboot resets every GPU.
                RecommendedAction::ResetGpu | RecommendedAction::Reboot => RuleAction::Reboot,
                RecommendedAction::Replace => RuleAction::Replace,
            },
        }
    }
}

/// One rule (`[[policy.rules]]`). A finding is handled by the first rule that matches it, user
/// rules before built-in ones; a user rule with a built-in's name replaces that built-in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Unique name; events name the rule that decided.
    pub name: String,
    /// Only findings from this source (agent, alertmanager, cloudwatch, repairer).
    #[serde(default)]
    pub source: Option<FindingSource>,
    /// Only findings of this check (`gpu`, `kernel_log`, `nic`, `disk`, `host`, ...).
    #[serde(default)]
    pub check: Option<String>,
    /// Only findings with this id (`xid`, `nic_down`, ...).
    #[serde(default)]
    pub finding: Option<String>,
    /// Each named label must have one of the listed values (e.g. `{ xid = ["79"] }`).
    #[serde(default)]
    pub labels: BTreeMap<String, Vec<String>>,
    /// Statuses that match. Default: fail.
    #[serde(default = "default_statuses")]
    pub status: Vec<Status>,
    /// What to do.
    pub action: RuleActionSpec,
    /// Debounce: observations in a row before acting (default 1).
    #[serde(default = "one")]
    pub observations: u32,
    /// Debounce: how long the finding must have been present before acting (default 0s).
    #[serde(default, rename = "for", with = "humantime_serde")]
    pub for_duration: Duration,
}

fn default_statuses() -> Vec<Status> {
    vec![Status::Fail]
}

fn one() -> u32 {
    1
}

impl RuleConfig {
    fn matches(&self, tracked: &TrackedFinding) -> bool {
        let finding = &tracked.finding;
        self.source.is_none_or(|s| s == tracked.source)
            && self.check.as_deref().is_none_or(|c| c == finding.check)
            && self.finding.as_deref().is_none_or(|f| f == finding.finding)
            && self.status.contains(&finding.status)
            && self.labels.iter().all(|(key, values)| {
                finding.labels.get(key).is_some_and(|value| values.iter().any(|v| v == value))
            })
    }

    fn debounced(&self, tracked: &TrackedFinding, now_ms: u64) -> bool {
        tracked.observations >= self.observations
            && now_ms.saturating_sub(tracked.first_seen_ms) >= self.for_duration.as_millis() as u64
    }
}

fn rule(name: &str, action: RuleActionSpec) -> RuleConfig {
    RuleConfig {
        name: name.to_owned(),
        source: None,
        check: None,
        finding: None,
        labels: BTreeMap::new(),
        status: default_statuses(),
        action,
        observations: 1,
        for_duration: Duration::ZERO,
    }
}

/// The built-in rules, from the vendor's Xid catalog and DCGM's health rules. Any of them can be
/// replaced by a user rule of the same name, or all turned off with `builtin_rules = false`.
pub fn builtin_rules() -> Vec<RuleConfig> {
    let xid = |name: &str, codes: &[&str], action| RuleConfig {
        finding: Some("xid".to_owned()),
        labels: BTreeMap::from([(
            "xid".to_owned(),
            codes.iter().map(|c| (*c).to_owned()).collect(),
        )]),
        ..rule(name, action)
    };
    vec![
        // The GPU fell off the bus: only a node reboot brings it back.
        xid("xid-fallen-off-bus", &["79"], RuleActionSpec::Reboot),
        // Double-bit ECC, uncontained errors, GSP errors: a GPU reset, which a reboot also does.
        xid("xid-gpu-reset", &["48", "95", "119", "120", "140"], RuleActionSpec::Reboot),
        // A node that stopped reporting: reboot through the provider (its BMC can, its agent cannot).
        RuleConfig {
            source: Some(FindingSource::Repairer),
            finding: Some("unreachable".to_owned()),
            ..rule("unreachable", RuleActionSpec::Reboot)
        },
        // A GPU count short of expected is debounced by the agent already (after boot).
        RuleConfig {
            check: Some("gpu".to_owned()),
            finding: Some("gpu_count".to_owned()),
            ..rule("gpu-missing", RuleActionSpec::Reboot)
        },
        // External alerts (Alertmanager, CloudWatch) that fail a node take it out of work; a
        // person's rule decides more.
        RuleConfig {
            source: Some(FindingSource::Alertmanager),
            ..rule("alertmanager-fail", RuleActionSpec::Drain)
        },
        RuleConfig {
            source: Some(FindingSource::Cloudwatch),
            ..rule("cloudwatch-fail", RuleActionSpec::Drain)
        },
        // Everything else the agent fails: its recommendation. Two observations so a single
        // glitchy poll does not take a node out; events (Xid, kernel log) are caught above or
        // arrive in every report while their window lasts.
        RuleConfig {
            source: Some(FindingSource::Agent),
            observations: 2,
            ..rule("agent-recommendation", RuleActionSpec::Recommended)
        },
        // Warnings: tell someone, leave the node at work.
        RuleConfig { status: vec![Status::Warn], ..rule("warnings", RuleActionSpec::Alert) },
    ]
}

/// Limits that no rule can bypass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardRails {
    /// Most reboots and replacements in flight at once.
    pub max_concurrent_repairs: u32,
    /// Most of the fleet that may be unavailable (draining, drained, repairing, validating,
    /// unreachable, quarantined); at least one node may always be taken out.
    pub max_unavailable_fraction: f64,
    /// The breaker opens when more than this fraction of the fleet turned unhealthy within
    /// `breaker_window` (a bad driver rollout or a storage outage looks like that)...
    pub breaker_fraction: f64,
    #[serde(with = "humantime_serde")]
    pub breaker_window: Duration,
    /// ...and at least this many nodes did (two faults in a five-node fleet are bad luck, not a
    /// storm).
    pub breaker_min_nodes: u32,
    /// After a repair finishes, no automatic action on that node for this long.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    /// Reboots and replacements wait until the fault is at least this old (the drain does not),
    /// so a storm of correlated faults opens the breaker before anything is rebooted.
    #[serde(with = "humantime_serde")]
    pub settle: Duration,
}

impl Default for GuardRails {
    fn default() -> Self {
        GuardRails {
            max_concurrent_repairs: 2,
            max_unavailable_fraction: 0.10,
            breaker_fraction: 0.20,
            breaker_window: Duration::from_secs(600),
            breaker_min_nodes: 3,
            cooldown: Duration::from_secs(600),
            settle: Duration::from_secs(3),
        }
    }
}

impl GuardRails {
    /// How many nodes of `members` may be unavailable at once: at least one.
    pub fn allowed_unavailable(&self, members: u32) -> u32 {
        ((members as f64 * self.max_unavailable_fraction).floor() as u32).max(1)
    }
}

/// When a repair did not help.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Escalation {
    /// A fault that comes back within this long after a reboot escalates to replace.
    #[serde(with = "humantime_serde")]
    pub reboot_window: Duration,
    /// This many repairs within `lemon_window` make the node a lemon: quarantined for a person.
    pub lemon_repairs: u32,
    #[serde(with = "humantime_serde")]
    pub lemon_window: Duration,
}

impl Default for Escalation {
    fn default() -> Self {
        Escalation {
            reboot_window: Duration::from_secs(3600),
            lemon_repairs: 3,
            lemon_window: Duration::from_secs(7 * 24 * 3600),
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
    /// User rules, then the built-ins not replaced by a user rule of the same name.
    pub fn effective_rules(&self) -> Vec<RuleConfig> {
        let mut rules = self.rules.clone();
        if self.builtin_rules {
            rules.extend(
                builtin_rules()
                    .into_iter()
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
        }
        let g = &self.guard_rails;
        if g.max_concurrent_repairs == 0 {
            push(format!("{section}.guard_rails.max_concurrent_repairs"), "must be at least 1");
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
        if self.escalation.lemon_repairs == 0 {
            push(format!("{section}.escalation.lemon_repairs"), "must be at least 1");
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
    /// Every non-ok finding tracked on the node.
    pub findings: &'a [TrackedFinding],
    /// Finished repairs, oldest first.
    pub history: &'a [RepairRecord],
    /// No automatic action before this (unix ms).
    pub cooldown_until_ms: u64,
    /// An action a person approved and that has not been used yet.
    pub approved: Option<RuleAction>,
}

/// What `decide` looks at for the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetView {
    /// Nodes that are part of the fleet (not retired).
    pub members: u32,
    /// Of those, unavailable now.
    pub unavailable: u32,
    /// Reboots and replacements in flight.
    pub repairs_in_flight: u32,
    pub breaker_open: bool,
}

/// Why an action waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hold {
    Breaker,
    Cooldown,
    MaxConcurrentRepairs,
    MaxUnavailable,
    AwaitingApproval,
}

impl Hold {
    pub fn as_str(self) -> &'static str {
        match self {
            Hold::Breaker => "breaker",
            Hold::Cooldown => "cooldown",
            Hold::MaxConcurrentRepairs => "max-concurrent-repairs",
            Hold::MaxUnavailable => "max-unavailable",
            Hold::AwaitingApproval => "awaiting-approval",
        }
    }
}

/// The action a rule chose and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub action: RuleAction,
    pub rule: String,
    pub reason: String,
    pub findings: Vec<Finding>,
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

/// Longest part of a finding's message in a decision's reason (the reason becomes a Slurm drain
/// reason and an alert's text: what an operator reads first).
const REASON_MESSAGE_CHARS: usize = 120;

/// `": <message>"`, on one line and cut to [`REASON_MESSAGE_CHARS`]; empty for no message.
fn message_part(message: &str) -> String {
    let line: String = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() {
        return String::new();
    }
    let mut cut: String = line.chars().take(REASON_MESSAGE_CHARS).collect();
    if cut.len() < line.len() {
        cut.push('…');
    }
    format!(": {cut}")
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
    let rules = policy.effective_rules();
    let mut best: Option<Verdict> = None;
    let mut pending = false;
    for tracked in node.findings {
        // First matching rule wins for each finding.
        let Some(rule) = rules.iter().find(|r| r.matches(tracked)) else { continue };
        let action = rule.action.resolve(&tracked.finding);
        if action == RuleAction::None {
            continue;
        }
        if !rule.debounced(tracked, now_ms) {
            pending |= action.is_disruptive();
            continue;
        }
        match &mut best {
            Some(verdict) if verdict.action == action => {
                verdict.findings.push(tracked.finding.clone());
            }
            Some(verdict) if verdict.action.weight() > action.weight() => {}
            _ => {
                best = Some(Verdict {
                    action,
                    rule: rule.name.clone(),
                    reason: format!(
                        "{} {}{} is {}{} ({} observation(s))",
                        tracked.finding.check,
                        tracked.finding.finding,
                        if tracked.finding.subject.is_empty() {
                            String::new()
                        } else {
                            format!(" on {}", tracked.finding.subject)
                        },
                        tracked.finding.status,
                        message_part(&tracked.finding.message),
                        tracked.observations
                    ),
                    findings: vec![tracked.finding.clone()],
                })
            }
        }
    }

    let mut verdict = match best {
        Some(verdict) if verdict.action.is_disruptive() => verdict,
        // Nothing disruptive is due: a state change first (the caller decides again right after),
        // then an alert.
        other => {
            let transition = match node.state {
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
            };
            return transition.or(other.map(Decision::Alert)).unwrap_or(Decision::Nothing);
        }
    };
    if node.state == NodeState::Drained && verdict.action == RuleAction::Drain {
        return Decision::Nothing;
    }

    // Escalation: a fault back soon after a reboot wants a replacement; too many repairs, a person.
    if verdict.action == RuleAction::Reboot
        && let Some(last) = node.history.iter().rev().find(|r| r.action.is_repair())
        && last.action == RuleAction::Reboot
        && now_ms.saturating_sub(last.finished_ms)
            <= policy.escalation.reboot_window.as_millis() as u64
    {
        verdict.action = RuleAction::Replace;
        verdict.reason =
            format!("{}; a reboot did not clear it, escalating to replace", verdict.reason);
    }
    if verdict.action.is_repair() {
        let window = policy.escalation.lemon_window.as_millis() as u64;
        let recent = node
            .history
            .iter()
            .filter(|r| r.action.is_repair() && now_ms.saturating_sub(r.finished_ms) <= window)
            .count() as u32;
        if recent >= policy.escalation.lemon_repairs {
            verdict.reason = format!(
                "{}; {recent} repairs within {}: a lemon",
                verdict.reason,
                humantime::format_duration(policy.escalation.lemon_window)
            );
            return Decision::Quarantine(verdict);
        }
    }

    let guard = &policy.guard_rails;
    let hold = if fleet.breaker_open {
        Some(Hold::Breaker)
    } else if now_ms < node.cooldown_until_ms {
        Some(Hold::Cooldown)
    } else if verdict.action.is_repair() && fleet.repairs_in_flight >= guard.max_concurrent_repairs
    {
        Some(Hold::MaxConcurrentRepairs)
    } else if !node.state.is_unavailable()
        && fleet.unavailable + 1 > guard.allowed_unavailable(fleet.members)
    {
        Some(Hold::MaxUnavailable)
    } else {
        None
    };
    if let Some(hold) = hold {
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

/// Whether the breaker should open: more than `breaker_fraction` of the fleet, and at least
/// `breaker_min_nodes` nodes, turned unhealthy within the window.
pub fn breaker_trips(recently_unhealthy: u32, members: u32, guard: &GuardRails) -> bool {
    members > 0
        && recently_unhealthy >= guard.breaker_min_nodes
        && recently_unhealthy as f64 / members as f64 > guard.breaker_fraction
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    fn fleet() -> FleetView {
        FleetView { members: 20, unavailable: 0, repairs_in_flight: 0, breaker_open: false }
    }

    fn node<'a>(state: NodeState, findings: &'a [TrackedFinding]) -> NodeView<'a> {
        NodeView { state, findings, history: &[], cooldown_until_ms: 0, approved: None }
    }

    fn action_of(decision: &Decision) -> Option<(RuleAction, &str)> {
        match decision {
            Decision::Act(v)
            | Decision::Record(v)
            | Decision::Alert(v)
            | Decision::Quarantine(v) => Some((v.action, v.rule.as_str())),
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
                "nic down follows the agent: drain",
                finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain),
                2,
                RuleAction::Drain,
                "agent-recommendation",
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
        let Decision::Act(verdict) =
            decide(node(NodeState::Healthy, &findings), fleet(), &policy, NOW)
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
        let nic =
            [tracked(finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain), 5, 0)];
        assert_eq!(
            decide(node(NodeState::Drained, &nic), fleet(), &policy, NOW),
            Decision::Nothing
        );
        let mut f = fleet();
        f.unavailable = 1;
        let bus = [tracked(xid("79"), 1, 0)];
        assert!(matches!(
            decide(node(NodeState::Drained, &bus), f, &policy, NOW),
            Decision::Act(_)
        ));
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
            assert_eq!(
                decide(node(state, &bus), fleet(), &policy, NOW),
                Decision::Nothing,
                "{state}"
            );
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
        let nic =
            [tracked(finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain), 2, 0)];
        assert_eq!(hold(node(NodeState::Healthy, &nic), f), None);

        // 10 % of 20 = 2 unavailable at most.
        let mut f = fleet();
        f.unavailable = 2;
        assert_eq!(hold(node(NodeState::Healthy, &bus), f), Some(Hold::MaxUnavailable));
        // A node already out (unreachable) does not add to the count.
        assert_eq!(hold(node(NodeState::Unreachable, &bus), f), None);
        // At least one node may always be taken out, even in a tiny fleet.
        let tiny =
            FleetView { members: 5, unavailable: 0, repairs_in_flight: 0, breaker_open: false };
        assert_eq!(hold(node(NodeState::Healthy, &bus), tiny), None);
        let tiny = FleetView { unavailable: 1, ..tiny };
        assert_eq!(hold(node(NodeState::Healthy, &bus), tiny), Some(Hold::MaxUnavailable));
    }

    #[test]
    fn a_reboot_that_did_not_help_escalates_to_replace() {
        let policy = Policy::default();
        let bus = [tracked(xid("79"), 1, 0)];
        let recent = [RepairRecord {
            action: RuleAction::Reboot,
            finished_ms: NOW - 60_000,
            succeeded: true,
        }];
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
    fn the_breaker_needs_a_fraction_and_a_minimum() {
        let guard = GuardRails::default();
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
}
