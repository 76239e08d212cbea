//! The remediation ladder: drain → reboot → replace → a person. A drained node whose finding is
//! still there after its rule's drain window is rebooted; a fault back soon after a reboot wants a
//! replacement; a node that keeps needing repairs, or a rule that stops the ladder at a rung, goes
//! to a person (quarantined, with a critical alert).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{RepairRecord, Verdict};
use crate::model::RuleAction;

/// When a repair did not help.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Escalation {
    /// A drained node whose finding is still there this long after the drain is rebooted (a
    /// rule's own `drain_window` comes first).
    #[serde(with = "humantime_serde")]
    pub drain_window: Duration,
    /// A fault that comes back within this long after a reboot escalates to replace.
    #[serde(with = "humantime_serde")]
    pub reboot_window: Duration,
    /// This many repairs within `remediation_window` make the node a lemon: quarantined for a
    /// person, so that no node loops through repairs.
    #[serde(alias = "lemon_repairs")]
    pub max_remediation_attempts: u32,
    #[serde(alias = "lemon_window", with = "humantime_serde")]
    pub remediation_window: Duration,
}

impl Default for Escalation {
    fn default() -> Self {
        Escalation {
            drain_window: Duration::from_secs(5 * 60),
            reboot_window: Duration::from_secs(3600),
            max_remediation_attempts: 3,
            remediation_window: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// A drained node still failing: once the drain window (the rule's, else `drain_window`) has
/// passed since it was drained, the drain verdict becomes a reboot and true is returned; before
/// that, false (nothing to do yet).
pub(super) fn after_drain(
    verdict: &mut Verdict,
    drained_since_ms: u64,
    escalation: &Escalation,
    now_ms: u64,
) -> bool {
    let window = verdict.drain_window.unwrap_or(escalation.drain_window);
    if now_ms.saturating_sub(drained_since_ms) < window.as_millis() as u64 {
        return false;
    }
    verdict.action = RuleAction::Reboot;
    verdict.reason = format!(
        "{}; still there {} after the drain, escalating to reboot",
        verdict.reason,
        humantime::format_duration(window)
    );
    true
}

/// A reboot wanted again within `reboot_window` of the last repair, itself a reboot, becomes a
/// replacement.
pub(super) fn after_reboot(
    verdict: &mut Verdict,
    history: &[RepairRecord],
    escalation: &Escalation,
    now_ms: u64,
) {
    if verdict.action == RuleAction::Reboot
        && let Some(last) = history.iter().rev().find(|r| r.action.is_repair())
        && last.action == RuleAction::Reboot
        && now_ms.saturating_sub(last.finished_ms) <= escalation.reboot_window.as_millis() as u64
    {
        verdict.action = RuleAction::Replace;
        verdict.reason =
            format!("{}; a reboot did not clear it, escalating to replace", verdict.reason);
    }
}

/// Whether a repair verdict finds the node a lemon (`max_remediation_attempts` repairs within
/// `remediation_window`); if so the verdict's reason says so.
pub(super) fn is_lemon(
    verdict: &mut Verdict,
    history: &[RepairRecord],
    escalation: &Escalation,
    now_ms: u64,
) -> bool {
    if !verdict.action.is_repair() {
        return false;
    }
    let window = escalation.remediation_window.as_millis() as u64;
    let recent = history
        .iter()
        .filter(|r| r.action.is_repair() && now_ms.saturating_sub(r.finished_ms) <= window)
        .count() as u32;
    if recent < escalation.max_remediation_attempts {
        return false;
    }
    verdict.reason = format!(
        "{}; {recent} repairs within {}: a lemon (max_remediation_attempts)",
        verdict.reason,
        humantime::format_duration(escalation.remediation_window)
    );
    true
}
