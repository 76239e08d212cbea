//! Escalation: when a repair did not help, a stronger one; when a node keeps needing repairs, a
//! person.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{RepairRecord, Verdict};
use crate::model::RuleAction;

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

/// Whether a repair verdict finds the node a lemon (`lemon_repairs` repairs within
/// `lemon_window`); if so the verdict's reason says so.
pub(super) fn is_lemon(
    verdict: &mut Verdict,
    history: &[RepairRecord],
    escalation: &Escalation,
    now_ms: u64,
) -> bool {
    if !verdict.action.is_repair() {
        return false;
    }
    let window = escalation.lemon_window.as_millis() as u64;
    let recent = history
        .iter()
        .filter(|r| r.action.is_repair() && now_ms.saturating_sub(r.finished_ms) <= window)
        .count() as u32;
    if recent < escalation.lemon_repairs {
        return false;
    }
    verdict.reason = format!(
        "{}; {recent} repairs within {}: a lemon",
        verdict.reason,
        humantime::format_duration(escalation.lemon_window)
    );
    true
}
