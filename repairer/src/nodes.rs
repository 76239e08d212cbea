//! Node records and what the guard rails count of them. Every node lives in memory (a heartbeat
//! touches no disk); a change that matters is written to the store before it is acted on.
//!
//! The counts the guard rails and the breaker read (members, unavailable, in repair, nodes turned
//! unhealthy within the breaker window, nodes by state) are kept as records change, not counted
//! over the fleet on each decision: every change to a record goes through [`NodesGuard::update`],
//! which takes the record's share out of the counts before and puts it back after.
//!
//! A node outside the inventory (`crate::inventory`) admitted as `unknown` has a record (it is
//! shown) whose share is nothing: no guard rail, no breaker and no job placement counts it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fleetmend_proto::{Finding, Report, Status};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::model::{Actor, Event, EventKind, FindingKey, NodeState, Severity, TrackedFinding};
use crate::policy::{FleetView, RepairRecord};
use crate::ports::{EventLog, Heartbeats, NodeHealth};
use crate::store::{Pending, StoreError};

mod acted;
mod tracking;

pub use self::acted::{ActedThrough, kmsg_seq};
pub(crate) use self::tracking::{remove_findings, source_of, track};

/// A change to a node record could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no node named {0}")]
    Unknown(String),
}

/// Everything the repairer keeps about one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub state: NodeState,
    pub state_since_ms: u64,
    pub boot_id: String,
    pub agent_version: String,
    pub last_report_ms: u64,
    pub last_seq: u64,
    /// Non-ok findings being tracked.
    pub findings: Vec<TrackedFinding>,
    /// Finished repairs, oldest first (trimmed to the lemon window's worth).
    pub history: Vec<RepairRecord>,
    pub cooldown_until_ms: u64,
    /// An action a person approved, not used yet.
    pub approved: Option<crate::model::RuleAction>,
    /// Findings an alert already went out for.
    pub alerted: BTreeSet<FindingKey>,
    /// The last held or recorded (dry-run) decision, so it is written once, not every tick.
    pub last_noted: Option<String>,
    /// When the node last gained a failing finding while it had none (for the breaker).
    pub unhealthy_since_ms: Option<u64>,
    /// The open workflow, if any.
    pub workflow: Option<i64>,
    /// Set when a replacement retired this node.
    pub replaced_by: Option<String>,
    /// A person drained it (`fleetmend drain`): it is theirs until they undrain it; no rule
    /// releases or repairs it meanwhile.
    #[serde(default)]
    pub drained_by_person: bool,
    /// Where Prometheus scrapes the node's agent (`host:port`): the reported address (or the node
    /// name) and metrics port; none until an agent that tells its port reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_target: Option<String>,
    /// The address other nodes reach it at, as its agent reports it (the allreduce probe's
    /// rendezvous); none until an agent that tells it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Not in the inventory: shown, never counted by a guard rail, never a scrape target, never
    /// decided about (so never drained, rebooted or replaced).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
    /// The newest kernel-log record a repair was begun or finished on (`nodes/acted.rs`): not
    /// taken in again when an agent reads its boot's log anew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acted_through: Option<ActedThrough>,
    /// When its current boot was first heard of: a report with a boot id other than the one
    /// known (rules' `boot_grace`). None for a node not seen to boot since it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booted_ms: Option<u64>,
}

/// How many repairs a node's history keeps.
const HISTORY_KEPT: usize = 32;

impl NodeRecord {
    pub(crate) fn new(name: &str, now: u64) -> NodeRecord {
        NodeRecord {
            name: name.to_owned(),
            state: NodeState::Healthy,
            state_since_ms: now,
            boot_id: String::new(),
            agent_version: String::new(),
            last_report_ms: now,
            last_seq: 0,
            findings: Vec::new(),
            history: Vec::new(),
            cooldown_until_ms: 0,
            approved: None,
            alerted: BTreeSet::new(),
            last_noted: None,
            unhealthy_since_ms: None,
            workflow: None,
            replaced_by: None,
            drained_by_person: false,
            metrics_target: None,
            address: None,
            unknown: false,
            acted_through: None,
            booted_ms: None,
        }
    }

    pub(crate) fn has_failing(&self) -> bool {
        self.findings.iter().any(|f| f.finding.status == Status::Fail)
    }

    /// The failing findings, as events carry them.
    pub(crate) fn failing(&self) -> Vec<Finding> {
        self.findings
            .iter()
            .filter(|t| t.finding.status == Status::Fail)
            .map(|t| t.finding.clone())
            .collect()
    }

    /// Adds a finished repair to the history, keeping the newest.
    pub(crate) fn remember(&mut self, record: RepairRecord) {
        self.history.push(record);
        if self.history.len() > HISTORY_KEPT {
            self.history.remove(0);
        }
    }

    /// What this record adds to the fleet's counts: nothing but the unknown count for a node
    /// outside the inventory.
    fn share(&self) -> Share {
        if self.unknown {
            return Share {
                state: self.state,
                unknown: true,
                member: false,
                unavailable: false,
                in_repair: false,
                unhealthy_since_ms: None,
                timed: false,
            };
        }
        let member = self.state.is_member();
        Share {
            state: self.state,
            unknown: false,
            member,
            unavailable: self.state.is_unavailable(),
            in_repair: matches!(self.state, NodeState::Repairing | NodeState::Validating),
            // Planned work a person drained it for is no storm.
            unhealthy_since_ms: self
                .unhealthy_since_ms
                .filter(|_| member && !self.drained_by_person),
            timed: self.timed(),
        }
    }

    /// Whether a decision about this node can change with time alone (debounce durations,
    /// cooldowns ending, held actions, a drained node waiting for its findings to clear): the
    /// engine's tick decides again about these, and only these.
    fn timed(&self) -> bool {
        match self.state {
            NodeState::Healthy => !self.findings.is_empty(),
            NodeState::Suspect | NodeState::Unreachable | NodeState::Drained => true,
            _ => false,
        }
    }
}

/// Changes `node`'s state, writing the event first: the one place a node's state changes.
pub(crate) fn transition(
    events: &EventLog,
    node: &mut NodeRecord,
    to: NodeState,
    reason: &str,
    actor: Actor,
    now: u64,
) -> Result<(), StoreError> {
    if node.state == to {
        return Ok(());
    }
    let severity = match to {
        NodeState::Healthy | NodeState::Suspect | NodeState::Retired => Severity::Info,
        NodeState::Quarantined => Severity::Critical,
        _ => Severity::Warning,
    };
    events.record(&Event {
        workflow: node.workflow,
        findings: node.failing(),
        ..Event::state_change(&node.name, node.state, to, severity, actor, reason, now)
    })?;
    node.state = to;
    node.state_since_ms = now;
    Ok(())
}

/// Marks `node` outside the inventory (`unknown`) or inside it, writing its `node-unknown` event
/// first: a warning when it leaves (the alert sinks raise it once), info when it comes in (they
/// clear it). True when it changed.
pub(crate) fn set_unknown(
    events: &EventLog,
    node: &mut NodeRecord,
    unknown: bool,
    reason: &str,
    now: u64,
) -> Result<bool, StoreError> {
    if node.unknown == unknown {
        return Ok(false);
    }
    let severity = if unknown { Severity::Warning } else { Severity::Info };
    events.record(&Event::new(
        EventKind::NodeUnknown,
        severity,
        Some(&node.name),
        Actor::repairer(),
        reason,
        now,
    ))?;
    node.unknown = unknown;
    Ok(true)
}

/// Why a node is shown as unknown, for its event.
pub(crate) const UNKNOWN_REASON: &str = "not in the inventory: shown as unknown, never counted by a guard rail, never a scrape target, never drained, rebooted or replaced";

/// One record's part of the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Share {
    state: NodeState,
    /// Outside the inventory: counted here alone.
    unknown: bool,
    member: bool,
    unavailable: bool,
    in_repair: bool,
    unhealthy_since_ms: Option<u64>,
    timed: bool,
}

/// The fleet's counts, kept as records change.
#[derive(Debug, Default)]
struct Counts {
    /// Inventoried nodes by state.
    by_state: BTreeMap<NodeState, u64>,
    /// Nodes held as unknown (outside the inventory).
    unknown: u32,
    members: u32,
    unavailable: u32,
    in_repair: u32,
    /// When member nodes turned unhealthy → how many did then.
    unhealthy_since: BTreeMap<u64, u32>,
    /// The nodes whose decision can change with time alone (`NodeRecord::timed`).
    timed: BTreeSet<String>,
    /// The nodes not healthy, and their states (few, in a fleet that works), less the retired.
    not_healthy: BTreeMap<String, NodeState>,
    /// The retired nodes, whose records stay for the audit trail and grow with a fleet's age:
    /// kept apart, so the nodes that can still hold or take work are read without them.
    retired: BTreeSet<String>,
    /// Moves on whenever a node joins or changes state (the job queue's tick skips its pass over
    /// the fleet while this stands still).
    generation: u64,
}

impl Counts {
    fn add(&mut self, name: &str, share: Share) {
        if share.unknown {
            self.unknown += 1;
            return;
        }
        if share.timed {
            self.timed.insert(name.to_owned());
        }
        match share.state {
            NodeState::Healthy => {}
            NodeState::Retired => {
                self.retired.insert(name.to_owned());
            }
            state => {
                self.not_healthy.insert(name.to_owned(), state);
            }
        }
        *self.by_state.entry(share.state).or_default() += 1;
        self.members += u32::from(share.member);
        self.unavailable += u32::from(share.unavailable);
        self.in_repair += u32::from(share.in_repair);
        if let Some(since) = share.unhealthy_since_ms {
            *self.unhealthy_since.entry(since).or_default() += 1;
        }
    }

    fn remove(&mut self, name: &str, share: Share) {
        if share.unknown {
            self.unknown = self.unknown.saturating_sub(1);
            return;
        }
        if share.timed {
            self.timed.remove(name);
        }
        match share.state {
            NodeState::Healthy => {}
            NodeState::Retired => {
                self.retired.remove(name);
            }
            _ => {
                self.not_healthy.remove(name);
            }
        }
        if let Some(count) = self.by_state.get_mut(&share.state) {
            *count = count.saturating_sub(1);
        }
        self.members = self.members.saturating_sub(u32::from(share.member));
        self.unavailable = self.unavailable.saturating_sub(u32::from(share.unavailable));
        self.in_repair = self.in_repair.saturating_sub(u32::from(share.in_repair));
        if let Some(since) = share.unhealthy_since_ms
            && let Some(count) = self.unhealthy_since.get_mut(&since)
        {
            *count -= 1;
            if *count == 0 {
                self.unhealthy_since.remove(&since);
            }
        }
    }
}

/// Every node the repairer knows, and the counts over them.
#[derive(Debug)]
pub struct Nodes {
    inner: Mutex<Inner>,
    events: Arc<EventLog>,
    /// Answers for the heartbeats between reports where they are not sent (the fleet simulator).
    heartbeats: Option<Arc<dyn Heartbeats>>,
    /// Raised whenever a node changes other than by a report that brought nothing new: the
    /// loops whose work a node's change may make due (the engine's, the job queue's) wait on
    /// them instead of looking every second.
    listeners: Mutex<Vec<Arc<Notify>>>,
}

#[derive(Debug, Default)]
struct Inner {
    records: BTreeMap<String, NodeRecord>,
    counts: Counts,
}

impl Nodes {
    /// Loads every node from the store.
    pub fn load(events: Arc<EventLog>) -> Result<Nodes, StoreError> {
        let mut inner = Inner::default();
        for record in events.store().nodes::<NodeRecord>()? {
            inner.counts.add(&record.name, record.share());
            inner.records.insert(record.name.clone(), record);
        }
        Ok(Nodes {
            inner: Mutex::new(inner),
            events,
            heartbeats: None,
            listeners: Mutex::new(Vec::new()),
        })
    }

    /// These nodes, with `heartbeats` answering when each was last heard from instead of its
    /// last report.
    pub fn with_heartbeats(self, heartbeats: Arc<dyn Heartbeats>) -> Nodes {
        Nodes { heartbeats: Some(heartbeats), ..self }
    }

    /// When `name` was last heard from (a report, or a heartbeat between reports).
    pub fn last_heard_ms(&self, name: &str) -> Option<u64> {
        let last_report_ms = self.lock().get(name)?.last_report_ms;
        Some(match &self.heartbeats {
            Some(heartbeats) => heartbeats.last_heard_ms(name, last_report_ms),
            None => last_report_ms,
        })
    }

    /// What answers for the heartbeats between reports, when it is not the reports themselves.
    pub fn heartbeats(&self) -> Option<&Arc<dyn Heartbeats>> {
        self.heartbeats.as_ref()
    }

    /// The nodes, locked. Hold it only for in-memory work and the writes that record it.
    pub fn lock(&self) -> NodesGuard<'_> {
        NodesGuard {
            inner: self.inner.lock().unwrap_or_else(PoisonError::into_inner),
            events: &self.events,
            listeners: &self.listeners,
            changed: false,
        }
    }

    /// Raised (`notify_one`) whenever a node joins or changes other than by a report that
    /// brought nothing new.
    pub fn subscribe(&self) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        self.listeners.lock().unwrap_or_else(PoisonError::into_inner).push(notify.clone());
        notify
    }

    /// Runs `f` on the node `name` and saves it afterwards.
    pub(crate) fn with_node<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut NodeRecord, &EventLog) -> Result<T, StoreError>,
    ) -> Result<T, NodeError> {
        let mut nodes = self.lock();
        let value = nodes.update(name, |node, events| f(node, events))?;
        nodes.save(name)?;
        Ok(value)
    }

    pub fn get(&self, name: &str) -> Option<NodeRecord> {
        self.lock().get(name).cloned()
    }

    /// Every node, by name.
    pub fn all(&self) -> Vec<NodeRecord> {
        self.lock().inner.records.values().cloned().collect()
    }

    /// How many nodes are held as unknown (outside the inventory).
    pub fn unknown_count(&self) -> u32 {
        self.lock().inner.counts.unknown
    }

    /// Marks every node outside the inventory unknown and every node inside it known (`known`
    /// says which are in; with no inventory every node is), each change with its event and
    /// saved: after the inventory changed, and at start (the config may have changed). Returns how
    /// many changed.
    pub fn apply_inventory(
        &self,
        known: impl Fn(&str) -> bool,
        now: u64,
    ) -> Result<usize, NodeError> {
        let mut nodes = self.lock();
        let moved: Vec<(String, bool)> = nodes
            .records()
            .filter(|n| n.unknown == known(&n.name))
            .map(|n| (n.name.clone(), !n.unknown))
            .collect();
        for (name, unknown) in &moved {
            let reason = if *unknown { UNKNOWN_REASON } else { "in the inventory now" };
            nodes.update(name, |node, events| set_unknown(events, node, *unknown, reason, now))?;
            nodes.save(name)?;
        }
        Ok(moved.len())
    }

    /// Counts of inventoried nodes by state (every state, zero included).
    pub fn state_counts(&self) -> BTreeMap<NodeState, u64> {
        let nodes = self.lock();
        NodeState::ALL
            .iter()
            .map(|s| (*s, nodes.inner.counts.by_state.get(s).copied().unwrap_or(0)))
            .collect()
    }
}

impl crate::ports::FleetView for Nodes {
    fn node_health(&self) -> Vec<NodeHealth> {
        let heard = |n: &NodeRecord| match &self.heartbeats {
            Some(heartbeats) => heartbeats.last_heard_ms(&n.name, n.last_report_ms),
            None => n.last_report_ms,
        };
        self.lock()
            .inner
            .records
            .values()
            .filter(|n| !n.unknown)
            .map(|n| NodeHealth { name: n.name.clone(), state: n.state, last_report_ms: heard(n) })
            .collect()
    }

    fn generation(&self) -> u64 {
        self.lock().inner.counts.generation
    }

    fn healthy(&self) -> u64 {
        self.lock().inner.counts.by_state.get(&NodeState::Healthy).copied().unwrap_or(0)
    }

    fn not_healthy(&self) -> BTreeMap<String, NodeState> {
        let nodes = self.lock();
        let counts = &nodes.inner.counts;
        let mut all = counts.not_healthy.clone();
        all.extend(counts.retired.iter().map(|name| (name.clone(), NodeState::Retired)));
        all
    }

    fn not_healthy_in_service(&self) -> BTreeMap<String, NodeState> {
        self.lock().inner.counts.not_healthy.clone()
    }

    fn members(&self) -> u32 {
        self.lock().inner.counts.members
    }

    fn subscribe(&self) -> Arc<Notify> {
        Nodes::subscribe(self)
    }
}

/// The locked nodes.
#[derive(Debug)]
pub struct NodesGuard<'a> {
    inner: MutexGuard<'a, Inner>,
    events: &'a EventLog,
    listeners: &'a Mutex<Vec<Arc<Notify>>>,
    /// A node joined or changed under this lock: the listeners are raised when it is let go.
    changed: bool,
}

impl Drop for NodesGuard<'_> {
    fn drop(&mut self) {
        if self.changed {
            for listener in self.listeners.lock().unwrap_or_else(PoisonError::into_inner).iter() {
                listener.notify_one();
            }
        }
    }
}

impl NodesGuard<'_> {
    pub fn get(&self, name: &str) -> Option<&NodeRecord> {
        self.inner.records.get(name)
    }

    pub fn records(&self) -> impl Iterator<Item = &NodeRecord> {
        self.inner.records.values()
    }

    /// The nodes whose decision can change with time alone (healthy with findings, suspect,
    /// unreachable, drained), by name: what the engine's tick decides about again.
    pub(crate) fn timed(&self) -> Vec<String> {
        self.inner.counts.timed.iter().cloned().collect()
    }

    /// Moves on whenever a node joins or changes state.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.counts.generation
    }

    /// How many nodes are held as unknown (outside the inventory).
    pub(crate) fn unknown_count(&self) -> u32 {
        self.inner.counts.unknown
    }

    /// Adds a node the repairer did not know.
    pub(crate) fn insert(&mut self, record: NodeRecord) {
        let inner = &mut *self.inner;
        if let Some(old) = inner.records.remove(&record.name) {
            inner.counts.remove(&old.name, old.share());
        }
        inner.counts.add(&record.name, record.share());
        // An unknown node is no part of the fleet the job queue places on.
        if !record.unknown {
            inner.counts.generation += 1;
        }
        inner.records.insert(record.name.clone(), record);
        self.changed = true;
    }

    /// Changes the node `name` through `f`, keeping the counts right whatever `f` changed (and
    /// whether it failed half-way); the listeners are raised when the lock is let go.
    pub(crate) fn update<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut NodeRecord, &EventLog) -> Result<T, StoreError>,
    ) -> Result<T, NodeError> {
        self.changed = true;
        self.update_quietly(name, f)
    }

    /// [`NodesGuard::update`] without raising the listeners: for a report, which raises them
    /// itself only when it brought something new (most reports are heartbeats).
    pub(crate) fn update_quietly<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut NodeRecord, &EventLog) -> Result<T, StoreError>,
    ) -> Result<T, NodeError> {
        let inner = &mut *self.inner;
        let node =
            inner.records.get_mut(name).ok_or_else(|| NodeError::Unknown(name.to_owned()))?;
        let before = node.share();
        let result = f(node, self.events);
        let after = node.share();
        if before != after {
            inner.counts.remove(name, before);
            inner.counts.add(name, after);
            if before.state != after.state || before.unknown != after.unknown {
                inner.counts.generation += 1;
            }
            self.changed = true;
        }
        Ok(result?)
    }

    /// Raises the listeners when the lock is let go: a report brought something new.
    pub(crate) fn mark_changed(&mut self) {
        self.changed = true;
    }

    /// Writes the node `name` to the store.
    pub(crate) fn save(&self, name: &str) -> Result<(), StoreError> {
        self.start_save(name).wait()
    }

    /// The fleet as the guard rails see it (breaker not filled in), and, when `breaker_window_ms`
    /// is given, how many members turned unhealthy within it of `now`. Read from the counts: no
    /// pass over the fleet.
    pub(crate) fn fleet(&self, now: u64, breaker_window_ms: Option<u64>) -> (FleetView, u32) {
        let counts = &self.inner.counts;
        let fleet = FleetView {
            members: counts.members,
            size: counts.members,
            unavailable: counts.unavailable,
            repairs_in_flight: counts.in_repair,
            breaker_open: false,
        };
        // A time to come: a boot's transients, counted only if they outlast their grace.
        let recent = breaker_window_ms.map_or(0, |window| {
            counts.unhealthy_since.range(now.saturating_sub(window)..=now).map(|(_, n)| *n).sum()
        });
        (fleet, recent)
    }

    /// Every node's turning unhealthy is forgotten by the breaker (a person closed it: nodes that
    /// turned unhealthy during the storm must not trip it again at once).
    pub(crate) fn forget_unhealthy_since(&mut self) {
        let names: Vec<String> = self
            .inner
            .records
            .values()
            .filter(|n| n.unhealthy_since_ms.is_some())
            .map(|n| n.name.clone())
            .collect();
        for name in names {
            // Only memory changes: a record that cannot be found cannot fail here.
            let _forgotten = self.update(&name, |node, _| {
                node.unhealthy_since_ms = Some(0);
                Ok(())
            });
        }
    }
}

impl<'a> NodesGuard<'a> {
    /// Starts writing the node `name` to the store, in the order of the lock, for the caller to
    /// wait for once it let the lock go (see [`crate::store::Pending`]); an ingest whose write
    /// waits on a database then holds no other report up meanwhile.
    pub(crate) fn start_save(&self, name: &str) -> Saving<'a> {
        let pending = match self.inner.records.get(name) {
            Some(node) => self.events.store().start_put_node(&node.name, node.state.as_str(), node),
            None => Pending::done(Ok(())),
        };
        Saving { pending, events: self.events }
    }
}

/// A node's write started by [`NodesGuard::start_save`].
#[must_use = "what the write records is acted on only once it was waited for"]
#[derive(Debug)]
pub(crate) struct Saving<'a> {
    pending: Pending<()>,
    events: &'a EventLog,
}

impl Saving<'_> {
    /// Waits for the write; a failure is logged and counted as every store write's is.
    pub(crate) fn wait(self) -> Result<(), StoreError> {
        self.events.write("put_node", self.pending.wait())
    }
}

/// `host:port` of the agent's `/metrics` from a report: the address it reports (the one other
/// nodes reach it at), else its node name; none when it does not tell its port.
pub(crate) fn metrics_target(report: &Report) -> Option<String> {
    let port = report.metrics_port?;
    let host = report.address.as_deref().filter(|a| !a.is_empty()).unwrap_or(&report.node);
    // An IPv6 literal needs brackets before the port.
    Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

#[cfg(test)]
#[path = "nodes_tests.rs"]
mod tests;
