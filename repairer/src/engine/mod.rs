//! The reconciler: takes in reports and alerts (`ingest.rs`), decides about each node with the
//! pure `policy::decide` and carries the decision out (`apply.rs`), and takes a person's actions
//! (`operator.rs`). Node records and the counts the guard rails read live in `nodes.rs`, the
//! breaker in `breaker.rs`; repair workflows run in `crate::workflow`.
//!
//! Every node lives in memory (a heartbeat touches no disk); a change that matters (a finding
//! appearing or clearing, a state change, a decision) is written to the store before it is acted
//! on, so a restarted repairer loads every node as it was and resumes every open workflow.

mod apply;
mod ingest;
mod operator;
mod tick;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleetmend_proto::Status;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::allreduce::Prober;
pub use crate::breaker::{Breaker, BreakerState};
use crate::clock::{self, SharedClock};
use crate::commands::CommandQueue;
use crate::inventory::Inventory;
use crate::metrics::RepairerMetrics;
use crate::model::NodeState;
pub use crate::nodes::{NodeRecord, Nodes};
use crate::policy::Policy;
use crate::ports::{EventLog, ReportObserver};
use crate::provider::Provider;
use crate::scheduler::{DRAIN_REASON_PREFIX, Scheduler};
use crate::store::{Store, StoreError};
use crate::workflow::trace::WorkflowTracer;
use crate::workflow::{self, Progress, Workflow, WorkflowContext, WorkflowTimeouts};

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

/// A repairer operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no node named {0}")]
    UnknownNode(String),
    #[error("{0}")]
    Refused(String),
    /// A report or finding for a node outside the inventory, where such are refused.
    #[error("node {0} is not in the inventory: its reports are refused")]
    NotInInventory(String),
    /// A report from one more node outside the inventory than `max_unknown` holds.
    #[error(
        "node {node} is not in the inventory and {max} unknown nodes are held already (inventory.max_unknown): its reports are refused"
    )]
    TooManyUnknown { node: String, max: u32 },
}

impl From<crate::nodes::NodeError> for EngineError {
    fn from(err: crate::nodes::NodeError) -> EngineError {
        match err {
            crate::nodes::NodeError::Store(err) => EngineError::Store(err),
            crate::nodes::NodeError::Unknown(name) => EngineError::UnknownNode(name),
        }
    }
}

/// A node as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeSummary {
    pub name: String,
    pub state: NodeState,
    pub state_since_ms: u64,
    pub last_report_ms: u64,
    pub boot_id: String,
    #[schema(value_type = u64)] // a usize, which the derive gives no format nor range
    pub failing: usize,
    pub workflow: Option<i64>,
    /// Not in the inventory: shown only, never counted or acted on.
    #[serde(default)]
    pub unknown: bool,
}

/// What the engine is built from: the ports and backends, made before it.
#[derive(Clone)]
pub struct EngineParts {
    pub clock: SharedClock,
    pub events: Arc<EventLog>,
    pub nodes: Arc<Nodes>,
    pub metrics: Arc<RepairerMetrics>,
    pub policy: Policy,
    pub config: EngineConfig,
    pub scheduler: Arc<dyn Scheduler>,
    pub provider: Arc<dyn Provider>,
    pub commands: Arc<CommandQueue>,
    /// Sees every report (the embedded job queue).
    pub observer: Option<Arc<dyn ReportObserver>>,
    /// Traces the workflows (when `[telemetry]` exports them).
    pub tracer: Option<Arc<WorkflowTracer>>,
    /// The allreduce probe, which a validation's deep check may wait for.
    pub prober: Option<Arc<Prober>>,
    /// Which nodes exist; none: every node that reports is in the fleet.
    pub inventory: Option<Arc<Inventory>>,
}

impl std::fmt::Debug for EngineParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineParts").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The reconciler.
pub struct Engine {
    clock: SharedClock,
    events: Arc<EventLog>,
    nodes: Arc<Nodes>,
    breaker: Arc<Breaker>,
    policy: Policy,
    config: EngineConfig,
    scheduler: Arc<dyn Scheduler>,
    commands: Arc<CommandQueue>,
    pub metrics: Arc<RepairerMetrics>,
    observer: Option<Arc<dyn ReportObserver>>,
    /// Which nodes exist (none: every node that reports).
    inventory: Option<Arc<Inventory>>,
    /// Rings a node's workflows when a report may let a waiting step go on.
    progress: Arc<Progress>,
    /// What every workflow is driven with.
    workflows: Arc<WorkflowContext>,
    /// When this process loaded the nodes: reports are not persisted, so a node's silence counts
    /// from here, not from a report a previous process received (a restart is not an outage).
    started_ms: u64,
    /// The fleet's generation and the breaker's state at the last tick (see `tick`).
    tick_version: std::sync::Mutex<Option<(u64, bool)>>,
    /// Raised when something may have made the tick's work due: a node changed (raised by the
    /// nodes themselves), the breaker closed, a node went silent where heartbeats are not
    /// reports (the simulator's).
    wake: Arc<Notify>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("policy", &self.policy.mode).finish_non_exhaustive()
    }
}

impl Engine {
    /// Loads the breaker and builds the engine over `parts`.
    pub fn new(parts: EngineParts) -> Result<Arc<Engine>, EngineError> {
        let breaker = Arc::new(Breaker::load(parts.events.clone())?);
        let started_ms = parts.clock.now_ms();
        let progress = Progress::new();
        let wake = parts.nodes.subscribe();
        if let Some(prober) = &parts.prober {
            let progress = progress.clone();
            prober.tell_verdicts_to(Box::new(move |node: &str| progress.ring(node)));
        }
        let workflows = Arc::new(WorkflowContext {
            clock: parts.clock.clone(),
            events: parts.events.clone(),
            nodes: parts.nodes.clone(),
            breaker: breaker.clone(),
            scheduler: parts.scheduler.clone(),
            provider: parts.provider,
            commands: parts.commands.clone(),
            metrics: parts.metrics.clone(),
            tracer: parts.tracer,
            prober: parts.prober.filter(|p| p.on_validate()),
            progress: progress.clone(),
            limits: workflow::Limits {
                timeouts: parts.config.workflow.clone(),
                settle: parts.policy.guard_rails.settle,
                silent_after: parts
                    .config
                    .report_interval
                    .saturating_mul(parts.config.unreachable_after),
            },
            cooldown: parts.policy.guard_rails.cooldown,
            instance: started_ms,
        });
        parts.metrics.expect_decisions(parts.policy.mode.as_str());
        Ok(Arc::new(Engine {
            clock: parts.clock,
            events: parts.events,
            nodes: parts.nodes,
            breaker,
            policy: parts.policy,
            config: parts.config,
            scheduler: parts.scheduler,
            commands: parts.commands,
            metrics: parts.metrics,
            observer: parts.observer,
            inventory: parts.inventory,
            progress,
            workflows,
            started_ms,
            tick_version: std::sync::Mutex::new(None),
            wake,
        }))
    }

    /// Starts the background work: resumes open workflows and runs the tick, on the whole
    /// multiples of `[engine] tick` at which something is due (see [`clock::when_due`]).
    pub fn start(self: &Arc<Self>) -> Result<(), EngineError> {
        for workflow in self.events.store().open_workflows::<Workflow>()? {
            tracing::info!(node = %workflow.node, id = workflow.id, step = ?workflow.step, "resuming workflow");
            self.spawn_workflow(workflow);
        }
        let engine = Arc::downgrade(self);
        let clock = self.clock.clone();
        tokio::spawn(clock::when_due(clock, self.config.tick, self.wake.clone(), move |now| {
            let Some(engine) = engine.upgrade() else { return clock::Next::Stop };
            engine.tick(now)
        }));
        Ok(())
    }

    /// Something outside the nodes' records may have made the tick's work due: a node's
    /// heartbeats stopped where they are not reports (the simulator's `Heartbeats`).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn spawn_workflow(&self, workflow: Workflow) {
        tokio::spawn(workflow::run(self.workflows.clone(), workflow));
    }

    /// The store behind the event log (the API reads events from it).
    pub fn store(&self) -> &Arc<Store> {
        self.events.store()
    }

    /// The event log (audit records written from outside the engine: the API's).
    pub fn events(&self) -> &Arc<EventLog> {
        &self.events
    }

    /// Raised on every stored event (alert sinks wake on it).
    pub fn event_appended(&self) -> Arc<Notify> {
        self.events.appended()
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Which nodes exist, when an inventory is configured.
    pub fn inventory(&self) -> Option<&Arc<Inventory>> {
        self.inventory.as_ref()
    }

    /// How many nodes are held as unknown (outside the inventory).
    pub fn unknown_count(&self) -> u32 {
        self.nodes.unknown_count()
    }

    pub fn breaker(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Every node, by name.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        self.nodes.all()
    }

    /// Every inventoried node whose agent told its metrics port, as (name, state, `host:port`), by
    /// name: Prometheus service discovery (a node outside the inventory is never a target). Only
    /// these fields are copied (not every record's history), as Prometheus asks again every
    /// refresh interval.
    pub fn scrape_targets(&self) -> Vec<(String, NodeState, String)> {
        self.nodes
            .lock()
            .records()
            .filter(|n| !n.unknown)
            .filter_map(|n| Some((n.name.clone(), n.state, n.metrics_target.clone()?)))
            .collect()
    }

    pub fn node(&self, name: &str) -> Option<NodeRecord> {
        self.nodes.get(name)
    }

    pub fn summaries(&self) -> Vec<NodeSummary> {
        self.nodes
            .lock()
            .records()
            .map(|n| NodeSummary {
                name: n.name.clone(),
                state: n.state,
                state_since_ms: n.state_since_ms,
                last_report_ms: n.last_report_ms,
                boot_id: n.boot_id.clone(),
                failing: n.findings.iter().filter(|f| f.finding.status == Status::Fail).count(),
                workflow: n.workflow,
                unknown: n.unknown,
            })
            .collect()
    }

    /// Counts of nodes by state.
    pub fn state_counts(&self) -> BTreeMap<NodeState, u64> {
        self.nodes.state_counts()
    }

    /// The drain reason fleetmend gives the scheduler for `node`.
    pub fn drain_reason(verdict_reason: &str) -> String {
        format!("{DRAIN_REASON_PREFIX}{verdict_reason}")
    }
}
