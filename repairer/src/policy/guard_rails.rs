//! Guard rails no rule can bypass: the breaker, the cooldown, the cap on repairs in flight and on
//! the share of the fleet out of work.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{FleetShare, FleetView, NodeView};
use crate::model::RuleAction;

/// Limits that no rule can bypass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardRails {
    /// Most reboots and replacements in flight at once: a count of nodes (`32`) or a share of
    /// the fleet (`"2%"`, rounded up, at least one), the fleet being the inventory's nodes where
    /// there is an inventory, else the nodes seen.
    pub max_concurrent_repairs: FleetShare,
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
            max_concurrent_repairs: FleetShare::Percent(2.0),
            max_unavailable_fraction: 0.10,
            breaker_fraction: 0.005,
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

/// The guard rail that holds `action` on `node` now, if one does.
pub(super) fn hold(
    action: RuleAction,
    node: NodeView<'_>,
    fleet: FleetView,
    guard: &GuardRails,
    now_ms: u64,
) -> Option<Hold> {
    if fleet.breaker_open {
        Some(Hold::Breaker)
    } else if now_ms < node.cooldown_until_ms {
        Some(Hold::Cooldown)
    } else if action.is_repair()
        && fleet.repairs_in_flight >= guard.max_concurrent_repairs.of(fleet.size)
    {
        Some(Hold::MaxConcurrentRepairs)
    } else if !node.state.is_unavailable()
        && fleet.unavailable + 1 > guard.allowed_unavailable(fleet.members)
    {
        Some(Hold::MaxUnavailable)
    } else {
        None
    }
}

/// Whether the breaker should open: more than `breaker_fraction` of the fleet, and at least
/// `breaker_min_nodes` nodes, turned unhealthy within the window.
pub fn breaker_trips(recently_unhealthy: u32, members: u32, guard: &GuardRails) -> bool {
    members > 0
        && recently_unhealthy >= guard.breaker_min_nodes
        && recently_unhealthy as f64 / members as f64 > guard.breaker_fraction
}
