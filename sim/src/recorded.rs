//! A failure history exported from a running repairer (`fleetmend export-faults`,
//! `GET /v1/history/faults`) made ready to strike: a [`Replay`], which the settings carry
//! (`--replay`, laid in by [`crate::inputs`]) and whose failures the run strikes instead of the
//! random failure stream; [`crate::replay`] runs it and compares the decisions.
//!
//! How a recorded fault becomes a simulated one:
//!
//! - **Node**: by name. The simulated fleet's slots are the inventory's names (`--inventory`) in
//!   natural order (`node-2` before `node-10`), else the history's own node names in that order;
//!   a fault on a node outside the inventory is refused, and a history with more nodes than the
//!   fleet (`--nodes`) grows the fleet to them (the report says so).
//! - **Time**: its `at_ms` relative to the first fault, which strikes [`LEAD`] into the run (the
//!   simulated job is training by then). A simulated node carries one fault at a time: of the
//!   faults first seen on one node within one unreachable window of each other (a link down is
//!   a `nic_down` failure and a kernel-log warning), the most severe finding is struck (then the
//!   most disruptive decision) and the others are left out, named in the report. A node that went silent (the repairer's `unreachable`
//!   finding) is silenced one unreachable window (report interval × unreachable_after) before the
//!   recorded time, so that the replayed repairer notices it when the recorded one did.
//! - **Finding**: the simulated agent reports the recorded check and finding id, with the status
//!   and recommended action its agent gives the `fleetmend inject` fault that stands for it: the
//!   Xid of the finding's `xid` label (or the `Xid N` of its message); else the fault that makes the agent report that check and
//!   finding (`nic`/`nic_down`: `nic-down`); else one with the same status and recommended action
//!   (fail/reboot: `pcie-downtrained`, fail/drain: `nic-down`, ...); an unreachable node:
//!   `agent-kill`. A finding none stands for (a job's, an alert source's) is not replayed; the
//!   report names it.
//! - **Clearing and repair times**: the history's own where it has them: a reboot that repaired
//!   it clears it on a reboot, one that did not help (escalated) does not; a reboot takes as long
//!   as the recorded one took (from the provider's call to the node back for validation); a
//!   fault that cleared with no repair clears after as long as it took then. Where the history
//!   does not say: the catalog's first category with that fault (built in, or `catalog`), else a
//!   reboot clears it unless the agent advises a replacement, a reboot takes 10 minutes and a
//!   replacement 2 days. A replacement always takes the catalog's time (or the recorded
//!   clearing's): the simulated world has a person fix a fault the repairer left after that same
//!   time, and a recorded replacement by a hot spare (seconds) would have the fault fixed before
//!   the replayed repairer decided about it. A fault kills the job's rank on its node as its
//!   catalog category says (by default it does), a warning never: the node stays at work, and a
//!   job killed there would start there again and die until the fault was fixed.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fleetmend_local::faults::{FAULT_NAMES, Fault};
use fleetmend_proto::{RecommendedAction, Status};
use fleetmend_repairer::history::{FaultHistory, HistoricFault};
use fleetmend_repairer::model::RuleAction;

use crate::catalog::{AgentCheck, FaultCatalog, FaultCategory};
use crate::failures::FailureEvent;

/// How far into the run the first recorded fault strikes.
pub const LEAD: Duration = Duration::from_secs(10 * 60);
/// How long the run goes on after the history's window (or its last fault) for the repairs then
/// under way, unless its duration is set.
pub const SETTLE: Duration = Duration::from_secs(60 * 60);
/// The finding the repairer raises on a node that stopped reporting.
const UNREACHABLE: (&str, &str) = ("repairer", "unreachable");
/// Where neither the history nor the catalog says.
const DEFAULT_REBOOT: Duration = Duration::from_secs(10 * 60);
const DEFAULT_REPLACE: Duration = Duration::from_secs(2 * 86_400);

/// A history made ready to strike: its own fault catalog (one category per kind of recorded
/// fault) and the failures in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// Where the history came from (its file), for the report.
    pub origin: String,
    pub history: FaultHistory,
    /// The simulated node's name in slot i: `names[i]` (the inventory's or the history's).
    pub names: Vec<String>,
    pub catalog: FaultCatalog,
    /// Sorted by time.
    pub failures: Vec<FailureEvent>,
    /// The unix ms that the run's start stands for.
    pub zero_ms: u64,
    /// Recorded faults left out: (index in the history, why).
    pub skipped: Vec<(usize, String)>,
    /// The fleet's size before it grew to the history's nodes, if it had to.
    pub grown_from: Option<u32>,
}

/// A history that cannot be replayed on this fleet.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("faults[{index}].node: {node} is not in the inventory")]
    NotInInventory { index: usize, node: String },
}

/// What the replay needs of the settings: the catalog to take times from, and the unreachable
/// window of the replayed repairer.
#[derive(Debug, Clone, Copy)]
pub struct ReplayBasis<'a> {
    pub catalog: &'a FaultCatalog,
    pub unreachable_window: Duration,
    /// Nodes in the simulated fleet (for the replayed catalog's rate per node-day).
    pub fleet_nodes: u32,
}

impl Replay {
    /// `history`'s faults on the nodes `inventory` names (or the history's own), mapped as the
    /// module's documentation says.
    pub fn new(
        origin: &str,
        history: FaultHistory,
        inventory: Option<&BTreeSet<String>>,
        basis: ReplayBasis<'_>,
    ) -> Result<Replay, ReplayError> {
        let names = node_names(&history, inventory)?;
        let slots: BTreeMap<&str, u32> =
            names.iter().enumerate().map(|(slot, name)| (name.as_str(), slot as u32)).collect();
        let first = history.faults.iter().map(|f| f.at_ms).min().unwrap_or(history.since_ms);
        let zero_ms = first.saturating_sub(LEAD.as_millis() as u64);
        let mut skipped = Vec::new();
        let mut stand_ins = BTreeMap::new();
        for (index, fault) in history.faults.iter().enumerate() {
            match stand_in(fault) {
                Ok(stand_in) => {
                    stand_ins.insert(index, stand_in);
                }
                Err(why) => skipped.push((index, why)),
            }
        }
        let together = basis.unreachable_window.as_millis() as u64;
        for (kept, others) in incidents(&history.faults, stand_ins.keys().copied(), together) {
            for other in others {
                stand_ins.remove(&other);
                let why = format!(
                    "first seen on {} with faults[{kept}] (within {} of it), which is struck: a simulated node carries one fault at a time",
                    history.faults[other].node,
                    humantime::format_duration(basis.unreachable_window)
                );
                skipped.push((other, why));
            }
        }
        skipped.sort_by_key(|(index, _)| *index);
        let mut categories: Vec<FaultCategory> = Vec::new();
        let mut struck: BTreeMap<(u64, usize), Vec<u32>> = BTreeMap::new();
        for (index, stand_in) in stand_ins {
            let fault = &history.faults[index];
            let Some(&slot) = slots.get(fault.node.as_str()) else { continue };
            let category = category_for(fault, stand_in, basis.catalog);
            let at = match category.fault {
                Some(Fault::AgentKill) => fault.at_ms.saturating_sub(together),
                _ => fault.at_ms,
            };
            let index = same_category(&mut categories, category);
            struck.entry((at.saturating_sub(zero_ms), index)).or_default().push(slot);
        }
        let failures = struck
            .into_iter()
            .map(|((at, category), mut nodes)| {
                nodes.sort_unstable();
                nodes.dedup();
                FailureEvent {
                    at: Duration::from_millis(at),
                    correlated: nodes.len() > 1,
                    nodes,
                    category,
                }
            })
            .collect();
        let catalog = FaultCatalog {
            source: format!("replay of {origin}: {} recorded fault(s)", history.faults.len()),
            nodes: basis.fleet_nodes.max(names.len() as u32).max(1),
            window: Duration::from_millis(history.until_ms.saturating_sub(history.since_ms))
                .max(Duration::from_secs(1)),
            categories,
        };
        Ok(Replay {
            origin: origin.to_owned(),
            history,
            names,
            catalog,
            failures,
            zero_ms,
            skipped,
            grown_from: None,
        })
    }

    /// How long the run lasts unless set: from its start to the end of the history's window (or
    /// its last fault), and [`SETTLE`] more.
    pub fn duration(&self) -> Duration {
        let last = self.history.faults.iter().map(|f| f.at_ms).max().unwrap_or(0);
        let end = self.history.until_ms.max(last);
        Duration::from_millis(end.saturating_sub(self.zero_ms)) + SETTLE
    }

    /// The simulated node in `slot`'s recorded name; a replacement (`n00001-r1`) is named after
    /// the node it replaced (`node-2-r1`).
    pub fn recorded_name(&self, simulated: &str) -> String {
        let (base, suffix) = match simulated.split_once('-') {
            Some((base, rest)) => (base, format!("-{rest}")),
            None => (simulated, String::new()),
        };
        let slot = base.strip_prefix('n').and_then(|digits| digits.parse::<usize>().ok());
        match slot.and_then(|slot| self.names.get(slot)) {
            Some(name) => format!("{name}{suffix}"),
            None => simulated.to_owned(),
        }
    }
}

/// The faults of `indices` that one simulated node carries as one: on the same node, each first
/// seen within `together_ms` of the first of them. Per such incident with more than one fault,
/// the one struck (the most severe finding, then the most disruptive decision, then the first)
/// and the others.
fn incidents(
    faults: &[HistoricFault],
    indices: impl Iterator<Item = usize>,
    together_ms: u64,
) -> Vec<(usize, Vec<usize>)> {
    let mut by_node: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for index in indices {
        by_node.entry(faults[index].node.as_str()).or_default().push(index);
    }
    let severity = |index: &usize| {
        let fault = &faults[*index];
        let status = match fault.finding.status {
            Status::Fail => 2,
            Status::Warn => 1,
            _ => 0,
        };
        let action = fault.decisions.iter().map(|d| d.action.weight()).max().unwrap_or(0);
        (status, action, std::cmp::Reverse(*index))
    };
    let mut merged = Vec::new();
    for (_, mut indices) in by_node {
        indices.sort_by_key(|index| (faults[*index].at_ms, *index));
        let mut group: Vec<usize> = Vec::new();
        for index in indices.into_iter().chain([usize::MAX]) {
            let starts_another = group.first().is_none_or(|first| {
                index == usize::MAX
                    || faults[index].at_ms >= faults[*first].at_ms.saturating_add(together_ms)
            });
            if starts_another && group.len() > 1 {
                let kept = group.iter().copied().max_by_key(|i| severity(i)).unwrap_or(group[0]);
                merged.push((kept, group.iter().copied().filter(|i| *i != kept).collect()));
            }
            if starts_another {
                group.clear();
            }
            group.push(index);
        }
    }
    merged
}

/// The fleet's names in slot order: the inventory's, or the history's own.
fn node_names(
    history: &FaultHistory,
    inventory: Option<&BTreeSet<String>>,
) -> Result<Vec<String>, ReplayError> {
    let mut names: Vec<String> = match inventory {
        Some(inventory) => {
            if let Some((index, fault)) =
                history.faults.iter().enumerate().find(|(_, f)| !inventory.contains(&f.node))
            {
                return Err(ReplayError::NotInInventory { index, node: fault.node.clone() });
            }
            inventory.iter().cloned().collect()
        }
        None => {
            let seen: BTreeSet<&str> = history.faults.iter().map(|f| f.node.as_str()).collect();
            seen.into_iter().map(str::to_owned).collect()
        }
    };
    names.sort_by(|a, b| natural_order(a, b));
    Ok(names)
}

/// `node-2` before `node-10`: runs of digits compared as numbers, the rest as text.
pub fn natural_order(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.is_empty(), b.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let digits = |s: &str| s.chars().next().is_some_and(|c| c.is_ascii_digit());
        let (a_digits, b_digits) = (digits(a), digits(b));
        let run = |s: &str, numeric: bool| {
            s.find(|c: char| c.is_ascii_digit() != numeric).unwrap_or(s.len())
        };
        let (ra, rb) = (run(a, a_digits), run(b, b_digits));
        let order = if a_digits && b_digits {
            let (ta, tb) = (a[..ra].trim_start_matches('0'), b[..rb].trim_start_matches('0'));
            ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb)).then_with(|| ra.cmp(&rb))
        } else {
            a[..ra].cmp(&b[..rb])
        };
        if order != Ordering::Equal {
            return order;
        }
        (a, b) = (&a[ra..], &b[rb..]);
    }
}

/// The check the simulated agent reports the fault under, and the inject fault that stands for
/// it; or why none does.
fn stand_in(fault: &HistoricFault) -> Result<(AgentCheck, Fault), String> {
    let finding = &fault.finding;
    if (finding.check.as_str(), finding.finding.as_str()) == UNREACHABLE {
        return Ok((AgentCheck::None, Fault::AgentKill));
    }
    let check = agent_check(&finding.check).ok_or_else(|| {
        format!(
            "{} {} on {}: the simulated agents have no {} check (a job's, an alert source's or the repairer's own finding)",
            finding.check, finding.finding, fault.node, finding.check
        )
    })?;
    if finding.finding == "xid"
        && let Some(code) = xid_code(finding)
    {
        return Ok((check, Fault::GpuXid(code)));
    }
    let recorded = (finding.status, finding.action);
    let raising: Vec<Fault> = FAULT_NAMES
        .iter()
        .filter_map(|name| name.parse::<Fault>().ok())
        .filter(|f| {
            f.agent_findings().contains(&(finding.check.as_str(), finding.finding.as_str()))
        })
        .filter(|f| simulated_finding(*f).is_some())
        .collect();
    let chosen = raising
        .iter()
        .copied()
        .find(|f| simulated_finding(*f) == Some(recorded))
        .or_else(|| like_it(recorded))
        .or_else(|| raising.first().copied());
    chosen.map(|f| (check, f)).ok_or_else(|| {
        format!(
            "{} {} on {} ({}, {}): no fault of the simulator gives that status and recommended action",
            finding.check, finding.finding, fault.node, finding.status, finding.action
        )
    })
}

/// An Xid finding's code: its `xid` label, else the first `Xid N` of its message.
fn xid_code(finding: &fleetmend_proto::Finding) -> Option<u32> {
    if let Some(label) = finding.labels.get("xid") {
        return label.parse().ok();
    }
    let (_, after) = finding.message.split_once("Xid ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The simulator's agent checks by name.
fn agent_check(name: &str) -> Option<AgentCheck> {
    [
        AgentCheck::Gpu,
        AgentCheck::KernelLog,
        AgentCheck::Nic,
        AgentCheck::Pcie,
        AgentCheck::Disk,
        AgentCheck::Host,
    ]
    .into_iter()
    .find(|check| check.as_str() == name)
}

/// The status and recommended action the simulated agent reports a fault with (`world/node.rs`,
/// `SimNode::findings`; held to it by a test that strikes each); none for a fault it reports
/// nothing of.
pub fn simulated_finding(fault: Fault) -> Option<(Status, RecommendedAction)> {
    use RecommendedAction::{Drain, None as Nothing, Reboot, Replace, ResetGpu};
    use Status::{Fail, Warn};
    Some(match fault {
        Fault::GpuXid(code) => {
            let advice = fleetmend_agent::xid::advice(code);
            (advice.status, advice.action)
        }
        Fault::GpuMissing
        | Fault::PcieDowntrained
        | Fault::NicPcieDowntrained
        | Fault::GpuLost
        | Fault::XidBurst
        | Fault::NvswitchFatal
        | Fault::Mlx5Health => (Fail, Reboot),
        Fault::RowRemapFailure => (Fail, Replace),
        Fault::NvlinkDown | Fault::GspTimeout => (Fail, ResetGpu),
        Fault::NicDown | Fault::IbPortDown | Fault::DiskReadonly | Fault::GpuThrottle => {
            (Fail, Drain)
        }
        Fault::DiskFull | Fault::KernelMce => (Warn, Nothing),
        Fault::AgentKill | Fault::Hang | Fault::Nan | Fault::Slow(_) => return None,
    })
}

/// Faults that stand in for a finding no fault raises, by the status and action it has.
const STAND_INS: [Fault; 5] = [
    Fault::PcieDowntrained,
    Fault::RowRemapFailure,
    Fault::NvlinkDown,
    Fault::NicDown,
    Fault::KernelMce,
];

/// A fault the simulated agent reports with this status and recommended action: one of
/// [`STAND_INS`], else an Xid whose advice it is.
fn like_it(recorded: (Status, RecommendedAction)) -> Option<Fault> {
    STAND_INS
        .into_iter()
        .chain((1..=MAX_STAND_IN_XID).map(Fault::GpuXid))
        .find(|f| simulated_finding(*f) == Some(recorded))
}

/// The Xid codes looked through for a stand-in.
const MAX_STAND_IN_XID: u32 = 200;

/// The category a recorded fault strikes as: what the history says of it, else its catalog
/// category's, else the defaults.
fn category_for(
    fault: &HistoricFault,
    (check, stand_in): (AgentCheck, Fault),
    catalog: &FaultCatalog,
) -> FaultCategory {
    let listed = catalog.categories.iter().find(|c| c.fault == Some(stand_in));
    let reboot_clears = fault
        .reboot_cleared()
        .or(listed.map(|c| c.reboot_clears))
        .unwrap_or(!stand_in.agent_advises_replace());
    let reboot_time = fault.took_ms(RuleAction::Reboot).map(|ms| Duration::from_millis(ms.max(1)));
    let reboot_time = reboot_time.or(listed.map(|c| c.reboot_time)).unwrap_or(DEFAULT_REBOOT);
    let repaired = fault
        .repairs
        .iter()
        .any(|r| r.outcome == fleetmend_repairer::history::RepairOutcome::Repaired);
    let cleared_after = fault
        .cleared_ms
        .filter(|_| !repaired)
        .map(|cleared| Duration::from_millis(cleared.saturating_sub(fault.at_ms).max(1)));
    // Not the recorded replacement's time: the simulated world also has a person fix a fault
    // the repairer left after this long, and a recorded spare that took over in a second would
    // clear the fault before the replayed repairer came to its decisions.
    let replace_time = cleared_after.or(listed.map(|c| c.replace_time)).unwrap_or(DEFAULT_REPLACE);
    let (check, finding) = match stand_in {
        Fault::AgentKill => (AgentCheck::None, "none".to_owned()),
        _ => (check, fault.finding.finding.clone()),
    };
    FaultCategory {
        name: format!("replay-{}", stand_in.to_string().replace(':', "-")),
        count: 1,
        check,
        finding,
        fault: Some(stand_in),
        reboot_clears,
        reboot_time,
        replace_time,
        // A warning leaves the node at work: a job its fault killed would start there again and
        // die, over and over, until the fault is fixed.
        kills_job: fault.finding.status == Status::Fail && listed.is_none_or(|c| c.kills_job),
    }
}

/// The index of the category like `category` in `categories` (its count raised), or of it added
/// under a name of its own.
fn same_category(categories: &mut Vec<FaultCategory>, category: FaultCategory) -> usize {
    let alike = |c: &FaultCategory| {
        FaultCategory { name: category.name.clone(), count: category.count, ..c.clone() }
            == category
    };
    if let Some(index) = categories.iter().position(alike) {
        categories[index].count += 1;
        return index;
    }
    let variant = format!("{}-", category.name);
    let taken = categories
        .iter()
        .filter(|c| c.name == category.name || c.name.starts_with(&variant))
        .count();
    let name =
        if taken == 0 { category.name.clone() } else { format!("{}-{}", category.name, taken + 1) };
    categories.push(FaultCategory { name, ..category });
    categories.len() - 1
}

#[cfg(test)]
mod tests;
