//! The reconciler: node records, report and alert ingest, decisions and their effects, the
//! breaker, unreachable nodes, and operator actions. Repair workflows live in `workflow.rs`.
//!
//! Every node lives in memory (a heartbeat touches no disk); a change that matters (a finding
//! appearing or clearing, a state change, a decision) is written to the store before it is acted
//! on, so a restarted repairer loads every node as it was and resumes every open workflow.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleetmend_proto::{Finding, Report, ReportReply, Status};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::commands::CommandQueue;
use crate::metrics::Histogram;
use crate::model::{
    Actor, Event, EventKind, FindingKey, FindingSource, NodeState, RuleAction, Severity,
    TrackedFinding,
};
use crate::policy::{self, Decision, FleetView, Hold, NodeView, Policy, RepairRecord, Verdict};
use crate::provider::Provider;
use crate::scheduler::{DRAIN_REASON_PREFIX, Scheduler, UndrainOutcome};
use crate::store::{Store, StoreError};
use crate::workflow::{self, Workflow, WorkflowTimeouts};

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Settings of the reconciler (`[engine]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// The agents' report interval.
    #[serde(with = "humantime_serde")]
    pub report_interval: Duration,
    /// A node with no report for this many intervals is unreachable.
    pub unreachable_after: u32,
    /// How often time-based decisions (debounce durations, unreachable nodes, cooldowns) run.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Timeouts of the repair workflow's steps.
    pub workflow: WorkflowTimeouts,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            report_interval: Duration::from_secs(10),
            unreachable_after: 3,
            tick: Duration::from_secs(1),
            workflow: WorkflowTimeouts::default(),
        }
    }
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
    pub approved: Option<RuleAction>,
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
}

impl NodeRecord {
    fn new(name: &str, now: u64) -> NodeRecord {
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
        }
    }

    fn has_failing(&self) -> bool {
        self.findings.iter().any(|f| f.finding.status == Status::Fail)
    }
}

/// `host:port` of the agent's `/metrics` from a report: the address it reports (the one other
/// nodes reach it at), else its node name; none when it does not tell its port.
fn metrics_target(report: &Report) -> Option<String> {
    let port = report.metrics_port?;
    let host = report.address.as_deref().filter(|a| !a.is_empty()).unwrap_or(&report.node);
    // An IPv6 literal needs brackets before the port.
    Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

/// The breaker: open stops every automatic action until a person closes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BreakerState {
    pub open: bool,
    pub opened_ms: Option<u64>,
    pub reason: String,
}

const BREAKER_KEY: &str = "breaker";

/// A repairer operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no node named {0}")]
    UnknownNode(String),
    #[error("{0}")]
    Refused(String),
}

/// Counters for `/metrics`.
#[derive(Debug)]
pub struct EngineCounters {
    pub reports_ok: AtomicU64,
    pub decisions: Mutex<BTreeMap<(String, String), u64>>,
    pub repairs: Mutex<BTreeMap<(String, String), u64>>,
    /// Seconds from the first failing finding to the drain call, and to the end of a repair.
    pub time_to_drain: Mutex<Histogram>,
    pub time_to_repair: Mutex<Histogram>,
}

impl Default for EngineCounters {
    fn default() -> Self {
        EngineCounters {
            reports_ok: AtomicU64::new(0),
            decisions: Mutex::default(),
            repairs: Mutex::default(),
            time_to_drain: Mutex::new(Histogram::new(crate::metrics::DRAIN_BUCKETS)),
            time_to_repair: Mutex::new(Histogram::new(crate::metrics::REPAIR_BUCKETS)),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The reconciler.
pub struct Engine {
    pub(crate) store: Arc<Store>,
    pub(crate) policy: Policy,
    pub(crate) config: EngineConfig,
    pub(crate) scheduler: Arc<dyn Scheduler>,
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) commands: Arc<CommandQueue>,
    nodes: Mutex<BTreeMap<String, NodeRecord>>,
    breaker: Mutex<BreakerState>,
    /// Raised on every stored event (alert sinks wake on it).
    pub event_appended: Arc<Notify>,
    /// Raised when a report may let a waiting workflow step go on.
    pub(crate) progress: Notify,
    pub counters: EngineCounters,
    /// When this process loaded the nodes: reports are not persisted, so a node's silence counts
    /// from here, not from a report a previous process received (a restart is not an outage).
    started_ms: u64,
    /// Traces of the workflows, when `[telemetry]` exports them (set before `start`).
    tracer: std::sync::OnceLock<Arc<crate::telemetry::WorkflowTracer>>,
    /// The embedded job queue (`scheduler = "embedded"`): sees every report's ranks.
    queue: std::sync::OnceLock<Arc<crate::queue::JobQueue>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("policy", &self.policy.mode).finish_non_exhaustive()
    }
}

/// A node as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeSummary {
    pub name: String,
    pub state: NodeState,
    pub state_since_ms: u64,
    pub last_report_ms: u64,
    pub boot_id: String,
    pub failing: usize,
    pub workflow: Option<i64>,
}

impl Engine {
    /// Loads every node and the breaker from the store.
    pub fn new(
        store: Arc<Store>,
        policy: Policy,
        config: EngineConfig,
        scheduler: Arc<dyn Scheduler>,
        provider: Arc<dyn Provider>,
        commands: Arc<CommandQueue>,
    ) -> Result<Arc<Engine>, EngineError> {
        let nodes: Vec<NodeRecord> = store.nodes()?;
        let breaker: BreakerState = store.setting(BREAKER_KEY)?.unwrap_or_default();
        Ok(Arc::new(Engine {
            store,
            policy,
            config,
            scheduler,
            provider,
            commands,
            nodes: Mutex::new(nodes.into_iter().map(|n| (n.name.clone(), n)).collect()),
            breaker: Mutex::new(breaker),
            event_appended: Arc::new(Notify::new()),
            progress: Notify::new(),
            counters: EngineCounters::default(),
            started_ms: now_ms(),
            tracer: std::sync::OnceLock::new(),
            queue: std::sync::OnceLock::new(),
        }))
    }

    /// Traces every workflow started or resumed from now on through `tracer` (the first one set).
    pub fn set_tracer(&self, tracer: Arc<crate::telemetry::WorkflowTracer>) {
        let _ = self.tracer.set(tracer);
    }

    /// Hands every report's ranks to `queue` from now on (the first one set).
    pub fn set_queue(&self, queue: Arc<crate::queue::JobQueue>) {
        let _ = self.queue.set(queue);
    }

    /// The embedded job queue, when the repairer runs one.
    pub fn queue(&self) -> Option<&Arc<crate::queue::JobQueue>> {
        self.queue.get()
    }

    pub(crate) fn tracer(&self) -> Option<&crate::telemetry::WorkflowTracer> {
        self.tracer.get().map(|tracer| &**tracer)
    }

    /// Starts the background work: resumes open workflows and runs the tick.
    pub fn start(self: &Arc<Self>) -> Result<(), EngineError> {
        for workflow in self.store.open_workflows::<Workflow>()? {
            tracing::info!(node = %workflow.node, id = workflow.id, step = ?workflow.step, "resuming workflow");
            self.spawn_workflow(workflow);
        }
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(engine.config.tick);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                engine.tick(now_ms());
            }
        });
        Ok(())
    }

    pub(crate) fn spawn_workflow(self: &Arc<Self>, workflow: Workflow) {
        let engine = Arc::clone(self);
        tokio::spawn(async move { workflow::run(engine, workflow).await });
    }

    /// Appends `event` to the audit log (before anything acts on it) and wakes the alert sinks.
    pub(crate) fn record(&self, event: Event) -> Result<i64, StoreError> {
        let id = self.store.append_event(&event)?;
        self.event_appended.notify_waiters();
        Ok(id)
    }

    fn save(&self, node: &NodeRecord) -> Result<(), StoreError> {
        self.store.put_node(&node.name, node.state.as_str(), node)
    }

    pub fn breaker(&self) -> BreakerState {
        lock(&self.breaker).clone()
    }

    /// Every node, by name.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        lock(&self.nodes).values().cloned().collect()
    }

    /// Every node whose agent told its metrics port, as (name, state, `host:port`), by name:
    /// Prometheus service discovery. Only these fields are copied (not every record's history),
    /// as Prometheus asks again every refresh interval.
    pub fn scrape_targets(&self) -> Vec<(String, NodeState, String)> {
        lock(&self.nodes)
            .values()
            .filter_map(|n| Some((n.name.clone(), n.state, n.metrics_target.clone()?)))
            .collect()
    }

    pub fn node(&self, name: &str) -> Option<NodeRecord> {
        lock(&self.nodes).get(name).cloned()
    }

    pub fn summaries(&self) -> Vec<NodeSummary> {
        lock(&self.nodes)
            .values()
            .map(|n| NodeSummary {
                name: n.name.clone(),
                state: n.state,
                state_since_ms: n.state_since_ms,
                last_report_ms: n.last_report_ms,
                boot_id: n.boot_id.clone(),
                failing: n.findings.iter().filter(|f| f.finding.status == Status::Fail).count(),
                workflow: n.workflow,
            })
            .collect()
    }

    /// Counts of nodes by state.
    pub fn state_counts(&self) -> BTreeMap<NodeState, u64> {
        let mut counts: BTreeMap<NodeState, u64> = NodeState::ALL.iter().map(|s| (*s, 0)).collect();
        for node in lock(&self.nodes).values() {
            *counts.entry(node.state).or_default() += 1;
        }
        counts
    }

    /// The fleet as the guard rails see it (breaker not yet filled in), and how many members
    /// turned unhealthy within `breaker_window` of `now`, in one pass: it runs under the nodes lock
    /// on every decision, and at 100,000 nodes five separate passes held the lock for ~30 ms per
    /// decision, stalling every report behind it (see BENCHMARKS.md).
    fn fleet_view(&self, nodes: &BTreeMap<String, NodeRecord>, now: u64) -> (FleetView, u32) {
        let window = self.policy.guard_rails.breaker_window.as_millis() as u64;
        let mut fleet =
            FleetView { members: 0, unavailable: 0, repairs_in_flight: 0, breaker_open: false };
        let mut recently_unhealthy = 0;
        for node in nodes.values() {
            let member = node.state.is_member();
            fleet.members += u32::from(member);
            fleet.unavailable += u32::from(node.state.is_unavailable());
            fleet.repairs_in_flight +=
                u32::from(matches!(node.state, NodeState::Repairing | NodeState::Validating));
            recently_unhealthy += u32::from(
                member && node.unhealthy_since_ms.is_some_and(|t| now.saturating_sub(t) <= window),
            );
        }
        (fleet, recently_unhealthy)
    }

    /// Takes in a report; returns the reply (commands for the node).
    pub fn ingest_report(self: &Arc<Self>, report: &Report) -> Result<ReportReply, EngineError> {
        let now = now_ms();
        self.commands.record_results(&report.command_results);
        let mut nodes = lock(&self.nodes);
        let node = match nodes.get_mut(&report.node) {
            Some(node) => node,
            None => {
                let node = NodeRecord::new(&report.node, now);
                self.record(Event::new(
                    EventKind::NodeJoined,
                    Severity::Info,
                    Some(&report.node),
                    Actor::repairer(),
                    format!(
                        "first report (agent {}, boot {})",
                        report.agent_version, report.boot_id
                    ),
                    now,
                ))?;
                nodes.entry(report.node.clone()).or_insert(node)
            }
        };
        let rebooted = !node.boot_id.is_empty() && node.boot_id != report.boot_id;
        // A new node or a new agent version is saved at once: a restarted repairer must know
        // every node, including those that never had a finding.
        let new_agent = node.agent_version.is_empty() || node.agent_version != report.agent_version;
        node.boot_id.clone_from(&report.boot_id);
        node.agent_version.clone_from(&report.agent_version);
        node.last_report_ms = now;
        node.last_seq = report.seq;
        // Saved when it moves (an agent restarted on another port), so a restarted repairer
        // serves service discovery for every node before their next reports.
        let target = metrics_target(report);
        let moved_target = target.is_some() && node.metrics_target != target;
        if moved_target {
            node.metrics_target = target;
        }
        let mut changed = rebooted;
        // The node reports: it is not unreachable.
        changed |= remove_findings(node, |t| {
            t.source == FindingSource::Repairer && t.finding.finding == "unreachable"
        });
        let incoming: Vec<&Finding> =
            report.findings.iter().filter(|f| f.status != Status::Ok).collect();
        changed |= track(node, FindingSource::Agent, &incoming, now);
        if changed || new_agent || moved_target {
            self.save(node)?;
        }
        drop(nodes);
        // Only a change that decide() reads decides again: evaluate() scans the whole fleet (guard
        // rails, breaker), so deciding on every first report made 100,000 joining nodes 100,000
        // fleet scans (a join rate falling to ~1,800/s at 20,000 nodes; see BENCHMARKS.md).
        if changed {
            self.evaluate(&report.node, now)?;
        }
        if rebooted || !report.command_results.is_empty() {
            self.progress.notify_waiters();
        }
        // The queue's commands for this node (run-rank, signal-rank) ride in this reply.
        if let Some(queue) = self.queue.get() {
            queue.observe_report(report, now);
        }
        self.counters.reports_ok.fetch_add(1, Ordering::Relaxed);
        Ok(ReportReply { commands: self.commands.take(&report.node) })
    }

    /// Takes in findings from an external alert source for `node`: `firing` ones are tracked,
    /// resolved ones cleared.
    pub fn ingest_external(
        self: &Arc<Self>,
        node_name: &str,
        source: FindingSource,
        finding: &Finding,
        firing: bool,
    ) -> Result<(), EngineError> {
        let now = now_ms();
        let mut nodes = lock(&self.nodes);
        let Some(node) = nodes.get_mut(node_name) else {
            return Err(EngineError::UnknownNode(node_name.to_owned()));
        };
        let key = FindingKey::of(finding, source);
        let changed = if firing {
            let mut current: Vec<&Finding> = node
                .findings
                .iter()
                .filter(|t| t.source == source && t.key() != key)
                .map(|t| &t.finding)
                .collect();
            let cloned = finding.clone();
            current.push(&cloned);
            let owned: Vec<Finding> = current.into_iter().cloned().collect();
            let refs: Vec<&Finding> = owned.iter().collect();
            track(node, source, &refs, now)
        } else {
            remove_findings(node, |t| t.key() == key)
        };
        if changed {
            self.record(Event {
                findings: vec![finding.clone()],
                ..Event::new(
                    EventKind::Finding,
                    Severity::Info,
                    Some(node_name),
                    Actor(format!("{source:?}").to_lowercase()),
                    format!(
                        "{} {} {}",
                        finding.check,
                        finding.finding,
                        if firing { "firing" } else { "resolved" }
                    ),
                    now,
                )
            })?;
            self.save(node)?;
        }
        drop(nodes);
        if changed {
            self.evaluate(node_name, now)?;
        }
        Ok(())
    }

    /// Time-based work: unreachable nodes, debounce durations, cooldowns ending, held actions.
    pub fn tick(self: &Arc<Self>, now: u64) {
        let deadline =
            self.config.report_interval.as_millis() as u64 * self.config.unreachable_after as u64;
        let names: Vec<String> = {
            let mut nodes = lock(&self.nodes);
            for node in nodes.values_mut() {
                let silent =
                    now.saturating_sub(node.last_report_ms.max(self.started_ms)) > deadline;
                let tracked = node.findings.iter().any(|t| t.finding.finding == "unreachable");
                if silent
                    && !tracked
                    && node.state.is_member()
                    && node.state != NodeState::Repairing
                {
                    let finding = Finding::new(
                        "repairer",
                        "unreachable",
                        "",
                        Status::Fail,
                        fleetmend_proto::RecommendedAction::Reboot,
                        format!(
                            "no report for {} s",
                            now.saturating_sub(node.last_report_ms) / 1000
                        ),
                    );
                    node.findings.push(TrackedFinding {
                        finding,
                        source: FindingSource::Repairer,
                        first_seen_ms: now,
                        last_seen_ms: now,
                        observations: 1,
                    });
                    if node.unhealthy_since_ms.is_none() {
                        node.unhealthy_since_ms = Some(now);
                    }
                    if matches!(node.state, NodeState::Healthy | NodeState::Suspect) {
                        let reason =
                            format!("no report for {} intervals", self.config.unreachable_after);
                        if let Err(err) = self.transition(
                            node,
                            NodeState::Unreachable,
                            &reason,
                            Actor::repairer(),
                            now,
                        ) {
                            tracing::error!(node = %node.name, error = %err, "recording an unreachable node failed");
                        }
                    }
                    let _ = self.save(node);
                }
            }
            // Nodes whose decision can change with time: debounce durations, cooldowns ending,
            // held actions, drained nodes waiting for their findings to clear.
            nodes
                .values()
                .filter(|n| match n.state {
                    NodeState::Healthy => !n.findings.is_empty(),
                    NodeState::Suspect | NodeState::Unreachable | NodeState::Drained => true,
                    _ => false,
                })
                .map(|n| n.name.clone())
                .collect()
        };
        for name in names {
            if let Err(err) = self.evaluate(&name, now) {
                tracing::error!(node = %name, error = %err, "evaluating a node failed");
            }
        }
    }

    /// Opens the breaker when a storm is under way (`recent` of `members` nodes turned unhealthy
    /// within the breaker window); returns whether it is open.
    fn check_breaker(&self, members: u32, recent: u32, now: u64) -> Result<bool, StoreError> {
        let mut breaker = lock(&self.breaker);
        if breaker.open {
            return Ok(true);
        }
        let guard = &self.policy.guard_rails;
        if policy::breaker_trips(recent, members, guard) {
            let reason = format!(
                "{recent} of {members} nodes turned unhealthy within {}: automatic action stopped until a person closes the breaker",
                humantime::format_duration(guard.breaker_window)
            );
            *breaker = BreakerState { open: true, opened_ms: Some(now), reason: reason.clone() };
            self.store.put_setting(BREAKER_KEY, &*breaker)?;
            self.record(Event::new(
                EventKind::Breaker,
                Severity::Critical,
                None,
                Actor::repairer(),
                reason,
                now,
            ))?;
            tracing::error!("breaker opened");
            return Ok(true);
        }
        Ok(false)
    }

    /// Decides about one node and carries out the decision.
    pub fn evaluate(self: &Arc<Self>, name: &str, now: u64) -> Result<(), EngineError> {
        let mut nodes = lock(&self.nodes);
        let Some(node) = nodes.get(name) else { return Ok(()) };
        if node.drained_by_person && node.state == NodeState::Drained {
            return Ok(());
        }
        fn view(node: &NodeRecord) -> NodeView<'_> {
            NodeView {
                state: node.state,
                findings: &node.findings,
                history: &node.history,
                cooldown_until_ms: node.cooldown_until_ms,
                approved: node.approved,
            }
        }
        // decide() reads the fleet only in its guard rails, which it reaches only with a
        // disruptive verdict (what comes out is then Act, Record or Held); any other decision is
        // the same whatever the fleet. Counting the fleet takes milliseconds at 100,000 nodes under
        // this lock, and the tick re-decides every node with a lasting warning each second, so it
        // is counted only for such a verdict, or when this node just turned unhealthy: the one
        // moment the breaker's count can rise, so a storm still opens it as it happens.
        let unknown_fleet =
            FleetView { members: 0, unavailable: 0, repairs_in_flight: 0, breaker_open: false };
        let mut decision = policy::decide(view(node), unknown_fleet, &self.policy, now);
        let turned_unhealthy = node.unhealthy_since_ms == Some(now);
        if turned_unhealthy
            || matches!(decision, Decision::Act(_) | Decision::Record(_) | Decision::Held { .. })
        {
            let (mut fleet, recently_unhealthy) = self.fleet_view(&nodes, now);
            fleet.breaker_open = self.check_breaker(fleet.members, recently_unhealthy, now)?;
            decision = policy::decide(view(node), fleet, &self.policy, now);
        }
        let Some(node) = nodes.get_mut(name) else { return Ok(()) };
        match decision {
            Decision::Nothing => {}
            Decision::Become { state, reason } => {
                self.transition(node, state, &reason, Actor::repairer(), now)?;
                if state == NodeState::Healthy {
                    node.last_noted = None;
                }
                self.save(node)?;
            }
            Decision::Alert(verdict) => {
                let fresh: Vec<Finding> = verdict
                    .findings
                    .iter()
                    .filter(|f| {
                        let key = FindingKey::of(f, source_of(node, f));
                        !node.alerted.contains(&key)
                    })
                    .cloned()
                    .collect();
                if !fresh.is_empty() {
                    for f in &fresh {
                        node.alerted.insert(FindingKey::of(f, source_of(node, f)));
                    }
                    self.note_decision("alert", &verdict);
                    self.record(Event {
                        action: Some(RuleAction::Alert),
                        findings: fresh,
                        ..Event::new(
                            EventKind::Decision,
                            Severity::Warning,
                            Some(name),
                            Actor::rule(&verdict.rule),
                            verdict.reason.clone(),
                            now,
                        )
                    })?;
                    self.save(node)?;
                }
            }
            Decision::Record(verdict) => {
                let note = format!("dry-run:{}:{}", verdict.action, verdict.rule);
                if node.last_noted.as_deref() != Some(&note) {
                    node.last_noted = Some(note);
                    self.note_decision("dry-run", &verdict);
                    self.record(Event {
                        action: Some(verdict.action),
                        findings: verdict.findings.clone(),
                        ..Event::new(
                            EventKind::Decision,
                            Severity::Info,
                            Some(name),
                            Actor::rule(&verdict.rule),
                            format!("dry-run: would {}: {}", verdict.action, verdict.reason),
                            now,
                        )
                    })?;
                    self.save(node)?;
                }
            }
            Decision::Held { verdict, hold } => {
                let note = format!("held:{}:{}", verdict.action, hold.as_str());
                if node.last_noted.as_deref() != Some(&note) {
                    node.last_noted = Some(note);
                    let severity =
                        if hold == Hold::Breaker { Severity::Critical } else { Severity::Warning };
                    self.record(Event {
                        action: Some(verdict.action),
                        findings: verdict.findings.clone(),
                        ..Event::new(
                            EventKind::ActionHeld,
                            severity,
                            Some(name),
                            Actor::rule(&verdict.rule),
                            format!(
                                "{} held ({}): {}",
                                verdict.action,
                                hold.as_str(),
                                verdict.reason
                            ),
                            now,
                        )
                    })?;
                    if node.state == NodeState::Healthy {
                        self.transition(
                            node,
                            NodeState::Suspect,
                            "a failing finding waits for its action",
                            Actor::repairer(),
                            now,
                        )?;
                    }
                    self.save(node)?;
                }
            }
            Decision::Act(verdict) => {
                node.last_noted = None;
                if node.approved.is_some() {
                    node.approved = None;
                }
                self.note_decision(self.policy.mode.as_str(), &verdict);
                let workflow =
                    self.begin_workflow(node, &verdict, Actor::rule(&verdict.rule), now)?;
                drop(nodes);
                self.spawn_workflow(workflow);
            }
            Decision::Release { reason } => {
                let workflow = Workflow::release(name, &reason, now);
                let workflow = self.persist_new_workflow(node, workflow, now)?;
                drop(nodes);
                self.spawn_workflow(workflow);
            }
            Decision::Quarantine(verdict) => {
                self.note_decision("quarantine", &verdict);
                self.record(Event {
                    action: Some(verdict.action),
                    findings: verdict.findings.clone(),
                    ..Event::new(
                        EventKind::Decision,
                        Severity::Critical,
                        Some(name),
                        Actor::rule(&verdict.rule),
                        verdict.reason.clone(),
                        now,
                    )
                })?;
                let workflow = Workflow::quarantine(name, &verdict.reason, now);
                let workflow = self.persist_new_workflow(node, workflow, now)?;
                drop(nodes);
                self.spawn_workflow(workflow);
            }
        }
        Ok(())
    }

    fn note_decision(&self, mode: &str, verdict: &Verdict) {
        *lock(&self.counters.decisions)
            .entry((verdict.action.as_str().to_owned(), mode.to_owned()))
            .or_default() += 1;
    }

    /// Records the decision, creates the workflow and moves the node to draining.
    fn begin_workflow(
        &self,
        node: &mut NodeRecord,
        verdict: &Verdict,
        actor: Actor,
        now: u64,
    ) -> Result<Workflow, StoreError> {
        let fault_since = node
            .findings
            .iter()
            .filter(|t| verdict.findings.iter().any(|f| FindingKey::of(f, t.source) == t.key()))
            .map(|t| t.first_seen_ms)
            .min()
            .unwrap_or(now);
        let workflow = Workflow::repair(
            &node.name,
            verdict.action,
            &verdict.rule,
            &verdict.reason,
            verdict.findings.clone(),
            fault_since,
            &node.boot_id,
            now,
        );
        self.record(Event {
            action: Some(verdict.action),
            findings: verdict.findings.clone(),
            ..Event::new(
                EventKind::Decision,
                Severity::Warning,
                Some(&node.name),
                actor,
                verdict.reason.clone(),
                now,
            )
        })?;
        self.persist_new_workflow(node, workflow, now)
    }

    fn persist_new_workflow(
        &self,
        node: &mut NodeRecord,
        mut workflow: Workflow,
        now: u64,
    ) -> Result<Workflow, StoreError> {
        workflow.id = self.store.insert_workflow(&node.name, &workflow)?;
        self.store.update_workflow(workflow.id, true, &workflow)?;
        node.workflow = Some(workflow.id);
        let target = workflow.initial_state();
        if node.state != target {
            let reason = format!("workflow {} ({}) started", workflow.id, workflow.action);
            self.transition(node, target, &reason, Actor::repairer(), now)?;
        }
        self.save(node)?;
        Ok(workflow)
    }

    /// Changes `node`'s state, recording it first.
    pub(crate) fn transition(
        &self,
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
        self.record(Event {
            workflow: node.workflow,
            findings: node
                .findings
                .iter()
                .filter(|t| t.finding.status == Status::Fail)
                .map(|t| t.finding.clone())
                .collect(),
            ..Event::state_change(&node.name, node.state, to, severity, actor, reason, now)
        })?;
        node.state = to;
        node.state_since_ms = now;
        Ok(())
    }

    /// Runs `f` on the node `name` under the lock, saving it afterwards.
    pub(crate) fn with_node<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut NodeRecord) -> Result<T, StoreError>,
    ) -> Result<T, EngineError> {
        let mut nodes = lock(&self.nodes);
        let node = nodes.get_mut(name).ok_or_else(|| EngineError::UnknownNode(name.to_owned()))?;
        let value = f(node)?;
        self.save(node)?;
        Ok(value)
    }

    /// Identifies this repairer process (its start time), for command ids that must not outlive it.
    pub(crate) fn instance(&self) -> u64 {
        self.started_ms
    }

    /// Whether automatic repairs may go on now (the breaker is closed).
    pub(crate) fn breaker_open(&self) -> bool {
        lock(&self.breaker).open
    }

    // --- operator actions -----------------------------------------------------------------------

    /// A person closes the breaker.
    pub fn close_breaker(self: &Arc<Self>, who: &str) -> Result<BreakerState, EngineError> {
        let now = now_ms();
        {
            let mut breaker = lock(&self.breaker);
            if !breaker.open {
                return Ok(breaker.clone());
            }
            self.record(Event::new(
                EventKind::Breaker,
                Severity::Info,
                None,
                Actor::person(who),
                "breaker closed",
                now,
            ))?;
            *breaker = BreakerState::default();
            self.store.put_setting(BREAKER_KEY, &*breaker)?;
            // Nodes that turned unhealthy during the storm must not trip it again at once.
            let mut nodes = lock(&self.nodes);
            for node in nodes.values_mut() {
                if node.unhealthy_since_ms.is_some() {
                    node.unhealthy_since_ms = Some(0);
                }
            }
        }
        self.progress.notify_waiters();
        Ok(self.breaker())
    }

    /// A person approves the action waiting on `node` (approve mode), or any action up to `action`.
    pub fn approve(
        self: &Arc<Self>,
        name: &str,
        action: RuleAction,
        who: &str,
    ) -> Result<(), EngineError> {
        let now = now_ms();
        self.with_node(name, |node| {
            node.approved = Some(action);
            node.last_noted = None;
            self.record(Event {
                action: Some(action),
                ..Event::new(
                    EventKind::Approved,
                    Severity::Info,
                    Some(name),
                    Actor::person(who),
                    format!("{action} approved"),
                    now,
                )
            })?;
            Ok(())
        })?;
        self.evaluate(name, now)
    }

    /// A person asks for `action` (drain, reboot, replace) on `name` now: recorded with the person
    /// as the actor; guard rails other than the breaker and the mode do not apply.
    pub fn request_repair(
        self: &Arc<Self>,
        name: &str,
        action: RuleAction,
        who: &str,
    ) -> Result<i64, EngineError> {
        if !action.is_disruptive() {
            return Err(EngineError::Refused(format!("{action} is not a repair")));
        }
        let now = now_ms();
        let mut nodes = lock(&self.nodes);
        let node = nodes.get_mut(name).ok_or_else(|| EngineError::UnknownNode(name.to_owned()))?;
        if let Some(id) = node.workflow {
            return Err(EngineError::Refused(format!("{name} is in workflow {id} already")));
        }
        let verdict = Verdict {
            action,
            rule: format!("person:{who}"),
            reason: format!("{who} asked for {action}"),
            findings: node.findings.iter().map(|t| t.finding.clone()).collect(),
        };
        node.drained_by_person = action == RuleAction::Drain;
        let workflow = self.begin_workflow(node, &verdict, Actor::person(who), now)?;
        let id = workflow.id;
        drop(nodes);
        self.spawn_workflow(workflow);
        Ok(id)
    }

    /// A person drains `name` through fleetmend (reason prefixed so fleetmend may undrain it).
    pub fn drain(self: &Arc<Self>, name: &str, who: &str) -> Result<i64, EngineError> {
        self.request_repair(name, RuleAction::Drain, who)
    }

    /// A person puts a drained or quarantined node back.
    pub async fn undrain(
        self: &Arc<Self>,
        name: &str,
        who: &str,
    ) -> Result<UndrainOutcome, EngineError> {
        let now = now_ms();
        let state = self.node(name).ok_or_else(|| EngineError::UnknownNode(name.to_owned()))?.state;
        if matches!(state, NodeState::Draining | NodeState::Repairing | NodeState::Validating) {
            return Err(EngineError::Refused(format!("{name} is {state}: wait for its workflow")));
        }
        let outcome =
            self.scheduler.undrain(name).await.map_err(|e| EngineError::Refused(e.to_string()))?;
        self.with_node(name, |node| {
            self.transition(
                node,
                NodeState::Healthy,
                &format!("{who} undrained it ({outcome:?})"),
                Actor::person(who),
                now,
            )?;
            node.cooldown_until_ms = now + self.policy.guard_rails.cooldown.as_millis() as u64;
            node.last_noted = None;
            node.drained_by_person = false;
            Ok(())
        })?;
        Ok(outcome)
    }

    /// The drain reason fleetmend gives the scheduler for `node`.
    pub fn drain_reason(verdict_reason: &str) -> String {
        format!("{DRAIN_REASON_PREFIX}{verdict_reason}")
    }
}

/// The source a finding on `node` was tracked from (agent unless tracked otherwise).
fn source_of(node: &NodeRecord, finding: &Finding) -> FindingSource {
    node.findings
        .iter()
        .find(|t| {
            t.finding.check == finding.check
                && t.finding.finding == finding.finding
                && t.finding.subject == finding.subject
        })
        .map(|t| t.source)
        .unwrap_or(FindingSource::Agent)
}

/// Replaces the tracked findings of `source` with `incoming`; true when the set of keys or a
/// status changed (a heartbeat with the same findings only counts observations).
fn track(node: &mut NodeRecord, source: FindingSource, incoming: &[&Finding], now: u64) -> bool {
    let mut changed = false;
    let mut kept: Vec<TrackedFinding> = Vec::with_capacity(node.findings.len());
    let mut seen: BTreeSet<FindingKey> = BTreeSet::new();
    for finding in incoming {
        let key = FindingKey::of(finding, source);
        if !seen.insert(key.clone()) {
            continue;
        }
        match node.findings.iter().find(|t| t.key() == key) {
            Some(existing) => {
                let status_changed = existing.finding.status != finding.status;
                changed |= status_changed;
                kept.push(TrackedFinding {
                    finding: (*finding).clone(),
                    source,
                    first_seen_ms: existing.first_seen_ms,
                    last_seen_ms: now,
                    observations: existing.observations.saturating_add(1),
                });
                // A second observation can satisfy a debounce: decide again.
                changed |= existing.observations == 1;
            }
            None => {
                changed = true;
                kept.push(TrackedFinding {
                    finding: (*finding).clone(),
                    source,
                    first_seen_ms: now,
                    last_seen_ms: now,
                    observations: 1,
                });
            }
        }
    }
    let before = node.findings.iter().filter(|t| t.source == source).count();
    if before != kept.len() {
        changed = true;
    }
    let had_failing = node.has_failing();
    node.findings.retain(|t| t.source != source);
    node.findings.extend(kept);
    let cleared: Vec<FindingKey> = node
        .alerted
        .iter()
        .filter(|k| !node.findings.iter().any(|t| &t.key() == *k))
        .cloned()
        .collect();
    for key in cleared {
        node.alerted.remove(&key);
    }
    if node.has_failing() {
        if !had_failing {
            node.unhealthy_since_ms = Some(now);
        }
    } else {
        node.unhealthy_since_ms = None;
    }
    changed
}

fn remove_findings(node: &mut NodeRecord, pred: impl Fn(&TrackedFinding) -> bool) -> bool {
    let before = node.findings.len();
    node.findings.retain(|t| !pred(t));
    let changed = node.findings.len() != before;
    if changed && !node.has_failing() {
        node.unhealthy_since_ms = None;
    }
    changed
}

#[cfg(test)]
mod tests {
    use fleetmend_proto::{ReportTrigger, Verdict, WIRE_VERSION};

    use super::*;

    fn report(address: Option<&str>, metrics_port: Option<u16>) -> Report {
        Report {
            wire_version: WIRE_VERSION,
            node: "gpu-a".to_owned(),
            boot_id: "b1".to_owned(),
            agent_version: "test".to_owned(),
            seq: 1,
            sent_at_ms: 0,
            trigger: ReportTrigger::Interval,
            verdict: Verdict::Healthy,
            checks: Vec::new(),
            findings: Vec::new(),
            command_results: Vec::new(),
            address: address.map(str::to_owned),
            ranks: Vec::new(),
            metrics_port,
        }
    }

    #[test]
    fn the_metrics_target_is_the_reported_address_or_the_node_name_and_the_port() {
        assert_eq!(
            metrics_target(&report(Some("10.0.0.1"), Some(9831))).as_deref(),
            Some("10.0.0.1:9831")
        );
        assert_eq!(metrics_target(&report(None, Some(9831))).as_deref(), Some("gpu-a:9831"));
        assert_eq!(metrics_target(&report(Some(""), Some(9831))).as_deref(), Some("gpu-a:9831"));
        assert_eq!(
            metrics_target(&report(Some("fd00::1"), Some(9831))).as_deref(),
            Some("[fd00::1]:9831")
        );
        // An agent older than the field: no target rather than a guessed port.
        assert_eq!(metrics_target(&report(Some("10.0.0.1"), None)), None);
    }

    #[test]
    fn records_saved_before_the_metrics_target_existed_still_load() {
        let mut record = NodeRecord::new("gpu-a", 1);
        let mut json = serde_json::to_value(&record).unwrap();
        assert!(json.get("metrics_target").is_none(), "none is not written: {json}");
        json.as_object_mut().unwrap().remove("metrics_target");
        assert_eq!(serde_json::from_value::<NodeRecord>(json).unwrap(), record);
        record.metrics_target = Some("10.0.0.1:9831".to_owned());
        let saved = serde_json::to_string(&record).unwrap();
        assert_eq!(serde_json::from_str::<NodeRecord>(&saved).unwrap(), record);
    }
}
