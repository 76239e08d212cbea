//! The simulator's store: the repairer's documents and audit log held in memory, by the same
//! rules as its SQLite store (ids in order, upserts by key, evidence kept to its limit per node),
//! without SQL. A simulated run writes ~10,000 audit events and as many node and workflow
//! documents per 2,048 nodes and 54 days, and reads them back only for its report: parsing and
//! executing SQL for each was a quarter of the run. The decisions are the repairer's either way
//! (`simulate`'s tests compare the two stores' audit logs).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use fleetmend_repairer::store::{EventRow, EvidenceRow, Fence, Lease, StoreBackend, StoreError};

/// Documents in memory, one process's.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Event i has id i + 1: its node and body.
    events: Vec<(Option<String>, String)>,
    nodes: BTreeMap<String, String>,
    /// Workflow i has id i + 1: its node, whether it is open, its body.
    workflows: Vec<(String, bool, String)>,
    settings: BTreeMap<String, String>,
    /// By submission order: seq → (id, body); and id → seq.
    jobs: BTreeMap<u64, (String, String)>,
    job_seq: BTreeMap<String, u64>,
    /// Per node, oldest first: (command, body).
    evidence: BTreeMap<String, Vec<(String, String)>>,
    lease: Option<Lease>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The newest `limit` of `rows` (oldest first), newest first.
fn newest<T: Clone>(rows: impl DoubleEndedIterator<Item = T>, limit: usize) -> Vec<T> {
    rows.rev().take(limit).collect()
}

impl StoreBackend for MemoryStore {
    fn location(&self) -> String {
        "memory (the simulator's)".to_owned()
    }

    fn schema_version(&self) -> Result<usize, StoreError> {
        Ok(1)
    }

    fn append_event(&self, event: EventRow<'_>, _fence: Fence) -> Result<i64, StoreError> {
        let mut state = self.lock();
        state.events.push((event.node.map(str::to_owned), event.body.to_owned()));
        Ok(state.events.len() as i64)
    }

    fn events(
        &self,
        after: i64,
        node: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let state = self.lock();
        let from = usize::try_from(after.max(0)).unwrap_or(usize::MAX);
        Ok(state
            .events
            .iter()
            .enumerate()
            .skip(from)
            .filter(|(_, (at, _))| node.is_none_or(|n| at.as_deref() == Some(n)))
            .take(limit)
            .map(|(i, (_, body))| (i as i64 + 1, body.clone()))
            .collect())
    }

    fn newest_event_id(&self) -> Result<i64, StoreError> {
        Ok(self.lock().events.len() as i64)
    }

    fn put_node(
        &self,
        name: &str,
        _state: &str,
        body: &str,
        _fence: Fence,
    ) -> Result<(), StoreError> {
        self.lock().nodes.insert(name.to_owned(), body.to_owned());
        Ok(())
    }

    fn nodes(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.lock().nodes.values().cloned().collect())
    }

    fn insert_workflow(&self, node: &str, body: &str, _fence: Fence) -> Result<i64, StoreError> {
        let mut state = self.lock();
        state.workflows.push((node.to_owned(), true, body.to_owned()));
        Ok(state.workflows.len() as i64)
    }

    fn update_workflow(
        &self,
        id: i64,
        open: bool,
        body: &str,
        _fence: Fence,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let at = usize::try_from(id - 1).ok();
        if let Some(workflow) = at.and_then(|at| state.workflows.get_mut(at)) {
            workflow.1 = open;
            workflow.2 = body.to_owned();
        }
        Ok(())
    }

    fn open_workflows(&self) -> Result<Vec<String>, StoreError> {
        let state = self.lock();
        Ok(state.workflows.iter().filter(|w| w.1).map(|w| w.2.clone()).collect())
    }

    fn workflows_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let state = self.lock();
        let of = state.workflows.iter().filter(|w| w.0 == node).map(|w| w.2.clone());
        Ok(newest(of, limit))
    }

    fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.lock().settings.get(key).cloned())
    }

    fn put_setting(&self, key: &str, body: &str, _fence: Fence) -> Result<(), StoreError> {
        self.lock().settings.insert(key.to_owned(), body.to_owned());
        Ok(())
    }

    fn put_job(
        &self,
        id: &str,
        seq: u64,
        _state: &str,
        body: &str,
        _fence: Fence,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        // A job keeps the seq it was first saved with.
        let seq = *state.job_seq.entry(id.to_owned()).or_insert(seq);
        state.jobs.insert(seq, (id.to_owned(), body.to_owned()));
        Ok(())
    }

    fn jobs(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.lock().jobs.values().map(|(_, body)| body.clone()).collect())
    }

    fn put_evidence(&self, evidence: EvidenceRow<'_>, _fence: Fence) -> Result<(), StoreError> {
        let mut state = self.lock();
        let kept = state.evidence.entry(evidence.node.to_owned()).or_default();
        if !kept.iter().any(|(command, _)| command == evidence.command) {
            kept.push((evidence.command.to_owned(), evidence.body.to_owned()));
        }
        let over = kept.len().saturating_sub(evidence.keep);
        kept.drain(..over);
        Ok(())
    }

    fn evidence_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let state = self.lock();
        let kept = state.evidence.get(node).map(Vec::as_slice).unwrap_or_default();
        Ok(newest(kept.iter().map(|(_, body)| body.clone()), limit))
    }

    fn acquire(&self, holder: &str, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let lease = Lease {
            holder: holder.to_owned(),
            epoch: 1,
            expires_at_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            expired: false,
        };
        self.lock().lease = Some(lease.clone());
        Ok(Some(lease))
    }

    fn release(&self, holder: &str) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.lease.as_ref().is_some_and(|l| l.holder == holder) {
            state.lease = None;
        }
        Ok(())
    }

    fn current(&self) -> Result<Option<Lease>, StoreError> {
        Ok(self.lock().lease.clone())
    }
}
