//! The narrow ports the repairer's parts are wired through, instead of one struct every part
//! reaches into: the event log (every decision is written here before it is acted on), the fleet
//! view the job queue places jobs by, and the observer that sees every report. They are built
//! before the parts that use them, so the wiring is one pass with no back-pointers.

use std::sync::Arc;

use fleetmend_proto::{Finding, Report};
use tokio::sync::Notify;

use crate::metrics::RepairerMetrics;
use crate::model::{Event, NodeState};
use crate::store::{Store, StoreError};

/// The audit log and the store's writes: a write that fails is logged and counted
/// (`fleetmend_store_errors_total`), and handed back to the caller, which must then not act.
#[derive(Debug)]
pub struct EventLog {
    store: Arc<Store>,
    metrics: Arc<RepairerMetrics>,
    /// Raised on every stored event (alert sinks wake on it).
    appended: Arc<Notify>,
}

impl EventLog {
    pub fn new(store: Arc<Store>, metrics: Arc<RepairerMetrics>) -> EventLog {
        EventLog { store, metrics, appended: Arc::new(Notify::new()) }
    }

    /// Appends `event`; returns its id. Callers act on what it describes only once this is `Ok`.
    pub fn record(&self, event: &Event) -> Result<i64, StoreError> {
        let id = self.write("append_event", self.store.append_event(event))?;
        self.appended.notify_waiters();
        Ok(id)
    }

    /// Passes `result` of a store write on, logging and counting it when it failed.
    pub fn write<T>(
        &self,
        operation: &'static str,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Err(err) = &result {
            self.metrics.store_error(operation);
            tracing::error!(operation, error = %err, "a store write failed: what it records does not happen");
        }
        result
    }

    /// The store behind the log (reads, and writes passed through [`EventLog::write`]).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Raised on every appended event.
    pub fn appended(&self) -> Arc<Notify> {
        self.appended.clone()
    }
}

/// One node as the job queue sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    pub name: String,
    pub state: NodeState,
    pub last_report_ms: u64,
}

/// The fleet as the job queue places jobs by: each node's state and when it last reported.
pub trait FleetView: Send + Sync {
    fn node_health(&self) -> Vec<NodeHealth>;
    /// A number that moves on whenever a node joins or changes state: while it stands still,
    /// what `node_health` says of every node's state stands still too.
    fn generation(&self) -> u64;
    /// How many nodes are healthy: no job needing more can be placed (read without a pass over
    /// the fleet).
    fn healthy(&self) -> u64;
    /// The nodes that are not healthy, and their states (read without a pass over the fleet).
    fn not_healthy(&self) -> std::collections::BTreeMap<String, NodeState>;
    /// [`FleetView::not_healthy`] less the retired nodes, whose records stay for the audit
    /// trail and grow with a fleet's age: what can still hold or take work.
    fn not_healthy_in_service(&self) -> std::collections::BTreeMap<String, NodeState> {
        let mut nodes = self.not_healthy();
        nodes.retain(|_, state| *state != NodeState::Retired);
        nodes
    }
    /// The nodes in the fleet (not retired, not outside the inventory): what a share of the fleet
    /// is taken of.
    fn members(&self) -> u32;
    /// Raised (`notify_one`) whenever a node joins or changes.
    fn subscribe(&self) -> std::sync::Arc<tokio::sync::Notify>;
}

/// The heartbeats between reports, where the reports themselves are not sent. An agent reports
/// every `report_interval` whether or not anything changed, and the engine sees a silent node by
/// the age of its last report. The fleet simulator's nodes report only what is new (2,048 nodes'
/// heartbeats over 54 days would be ~955 million reports that change nothing) and answer here
/// for the rest: which nodes are up, and so heard from now.
pub trait Heartbeats: Send + Sync + std::fmt::Debug {
    /// When `node` was last heard from, its last report having come at `reported_ms`.
    fn last_heard_ms(&self, node: &str, reported_ms: u64) -> u64;
    /// The nodes that may not have been heard from since `since_ms` (each is checked again with
    /// [`Heartbeats::last_heard_ms`]).
    fn maybe_silent_since(&self, since_ms: u64) -> Vec<String>;
    /// Every node not heard from now, and since when: where the engine's tick looks for the
    /// next node to turn unreachable. Whoever answers here wakes the engine
    /// ([`crate::engine::Engine::wake`]) when a node falls silent.
    fn quiet(&self) -> Vec<(String, u64)>;
}

/// Sees every report the repairer takes in (the job queue follows its ranks through them).
pub trait ReportObserver: Send + Sync {
    fn observe_report(&self, report: &Report, now: u64);
}

/// A finding the job queue raises (or clears) on a node from what a job shows, such as a
/// straggler rank. The queue is the engine's scheduler, so it never calls the engine: it sends
/// these down a channel that a task of the service hands to the engine's ingest.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFinding {
    pub node: String,
    pub finding: Finding,
    /// Raised (true) or cleared (false).
    pub firing: bool,
}

/// Where the queue sends its [`JobFinding`]s.
pub type JobFindings = tokio::sync::mpsc::UnboundedSender<JobFinding>;
