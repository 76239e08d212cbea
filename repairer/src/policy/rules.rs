//! Rules: which findings they match, when a match is due (debounce), the built-in rules, and the
//! verdict the matching findings of one node come to.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::{Deserialize, Serialize};

use super::Verdict;
use crate::model::{FindingSource, RuleAction, TrackedFinding};

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

/// A rung of the remediation ladder a rule can stop at (`stop_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rung {
    /// Drain only: a person decides the rest.
    Drain,
    /// Drain, then reboot; no replacement without a person.
    Reboot,
    /// The whole ladder (the default).
    Replace,
}

impl Rung {
    pub fn action(self) -> RuleAction {
        match self {
            Rung::Drain => RuleAction::Drain,
            Rung::Reboot => RuleAction::Reboot,
            Rung::Replace => RuleAction::Replace,
        }
    }
}

impl RuleActionSpec {
    /// The action, when it does not depend on the finding.
    pub(super) fn fixed(self) -> Option<RuleAction> {
        match self {
            RuleActionSpec::None => Some(RuleAction::None),
            RuleActionSpec::Alert => Some(RuleAction::Alert),
            RuleActionSpec::Drain => Some(RuleAction::Drain),
            RuleActionSpec::Reboot => Some(RuleAction::Reboot),
            RuleActionSpec::Replace => Some(RuleAction::Replace),
            RuleActionSpec::Recommended => None,
        }
    }

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
    /// Only findings of this check (`gpu`, `kernel_log`, `nic`, `pcie`, `disk`, `host`, ...).
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
    /// The ladder: a node this rule drained, still failing this long after the drain, is
    /// rebooted (default `[policy.escalation] drain_window`).
    #[serde(default, with = "humantime_serde")]
    pub drain_window: Option<Duration>,
    /// The rung the ladder stops at for this rule (`drain`, `reboot`, `replace`; default the
    /// whole ladder): going further quarantines the node with a critical alert, a person decides.
    #[serde(default)]
    pub stop_at: Option<Rung>,
    /// Boot transients: a finding first seen within this long after the node booted (its first
    /// report with another boot id than the one known) waits until this long after the boot, and
    /// is dropped if it clears by then: links training, NVLink and InfiniBand ports coming up,
    /// PCIe retraining.
    #[serde(default, with = "humantime_serde")]
    pub boot_grace: Option<Duration>,
}

fn default_statuses() -> Vec<Status> {
    vec![Status::Fail]
}

fn one() -> u32 {
    1
}

impl RuleConfig {
    pub(super) fn matches(&self, tracked: &TrackedFinding) -> bool {
        let finding = &tracked.finding;
        self.source.is_none_or(|s| s == tracked.source)
            && self.check.as_deref().is_none_or(|c| c == finding.check)
            && self.finding.as_deref().is_none_or(|f| f == finding.finding)
            && self.status.contains(&finding.status)
            && self.labels.iter().all(|(key, values)| {
                finding.labels.get(key).is_some_and(|value| values.iter().any(|v| v == value))
            })
    }

    fn debounced(&self, tracked: &TrackedFinding, booted_ms: Option<u64>, now_ms: u64) -> bool {
        tracked.observations >= self.observations
            && now_ms.saturating_sub(tracked.first_seen_ms) >= self.for_duration.as_millis() as u64
            && self.grace_ends(tracked, booted_ms).is_none_or(|ends| now_ms >= ends)
    }

    /// When the boot grace of `tracked` ends, if it was first seen within it.
    pub(super) fn grace_ends(
        &self,
        tracked: &TrackedFinding,
        booted_ms: Option<u64>,
    ) -> Option<u64> {
        let ends = booted_ms?.saturating_add(self.boot_grace?.as_millis() as u64);
        (tracked.first_seen_ms < ends).then_some(ends)
    }
}

pub(super) fn rule(name: &str, action: RuleActionSpec) -> RuleConfig {
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
        drain_window: None,
        stop_at: None,
        boot_grace: None,
    }
}

/// The agent's findings that a boot brings about and clears by itself within minutes: a link
/// still training, an InfiniBand port waiting for its subnet manager, an NVLink not up yet, a PCIe
/// link retraining to its width or speed.
pub const BOOT_TRANSIENTS: &[&str] =
    &["nic_down", "ib_port_down", "nvlink_down", "pcie_link", "pcie_width", "pcie_speed"];

/// How long after a boot the built-in rules hold [`BOOT_TRANSIENTS`].
pub const BOOT_GRACE: Duration = Duration::from_secs(5 * 60);

/// The built-in rules, built once (every decision reads them).
pub(super) static BUILTIN_RULES: std::sync::LazyLock<Vec<RuleConfig>> =
    std::sync::LazyLock::new(builtin_rules);

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
    // A boot's transients: held for `BOOT_GRACE` after the node's boot and dropped if they clear
    // in it (a planned reboot's links do not drain the node); past it, the agent's
    // recommendation, as below.
    let boot_transient = |finding: &str| RuleConfig {
        source: Some(FindingSource::Agent),
        finding: Some(finding.to_owned()),
        observations: 2,
        boot_grace: Some(BOOT_GRACE),
        ..rule(&format!("boot-transient-{finding}"), RuleActionSpec::Recommended)
    };
    let transients = BOOT_TRANSIENTS.iter().map(|f| boot_transient(f));
    let mut rules = vec![
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
        // What a job shows of its node (a straggler rank): the queue's recommendation, drain
        // when a spare or free node can take the rank's place at the checkpoint the drain asks
        // for, else a warning.
        RuleConfig {
            source: Some(FindingSource::Job),
            ..rule("job-health", RuleActionSpec::Recommended)
        },
        // A node the allreduce probe measured slow against two peers: out of work until it
        // measures well again.
        RuleConfig {
            source: Some(FindingSource::Probe),
            ..rule("allreduce-probe", RuleActionSpec::Recommended)
        },
    ];
    rules.extend(transients);
    rules.extend([
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
    ]);
    rules
}

/// Longest part of a finding's message in a decision's reason (the reason becomes a Slurm drain
/// reason and an alert's text: what an operator reads first).
pub(super) const REASON_MESSAGE_CHARS: usize = 120;

/// `": <message>"`, on one line and cut to [`REASON_MESSAGE_CHARS`]; empty for no message.
pub(super) fn message_part(message: &str) -> String {
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

/// The verdict of the most disruptive rule due on any finding (collecting the findings that lead
/// to the same action), and whether a disruptive rule matched but waits for its debounce.
pub(super) fn best_verdict(
    findings: &[TrackedFinding],
    booted_ms: Option<u64>,
    rules: &[&RuleConfig],
    now_ms: u64,
) -> (Option<Verdict>, bool) {
    let mut best: Option<Verdict> = None;
    let mut pending = false;
    for tracked in findings {
        // First matching rule wins for each finding.
        let Some(rule) = rules.iter().find(|r| r.matches(tracked)) else { continue };
        let action = rule.action.resolve(&tracked.finding);
        if action == RuleAction::None {
            continue;
        }
        if !rule.debounced(tracked, booted_ms, now_ms) {
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
                    drain_window: rule.drain_window,
                    stop_at: rule.stop_at,
                })
            }
        }
    }
    (best, pending)
}
