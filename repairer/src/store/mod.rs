//! The repairer's store: the audit event log, node and workflow documents, settings, jobs and
//! evidence, behind one [`StoreBackend`] trait with two implementations: SQLite (one file, the
//! embedded default, one repairer) and PostgreSQL (a database several repairers can share).
//!
//! The event log is the audit trail and is written before anything it describes is acted on;
//! nodes and workflows are kept as JSON documents keyed by name and id, so a restarted repairer
//! finds every node in its state and every workflow at its step. Both backends keep event ids
//! strictly increasing in commit order: readers (the API, the alert outbox) page by id.
//!
//! Leadership. Several repairers sharing a PostgreSQL store take turns under a lease
//! ([`Store::acquire`]): a holder, an epoch and an expiry kept by the database's own clock. A
//! store that holds a lease fences its writes with the lease's epoch: the database refuses, in
//! the write's own transaction, every write that records or starts an action once a newer epoch
//! exists ([`StoreError::Fenced`]), so a repairer that lost its lease (paused, partitioned) cannot
//! act on a stale view. SQLite serves one repairer: its lease is always its own.
//!
//! [`Store`] is the facade everyone calls: typed (serde) documents on top of the backend's JSON
//! strings. The calls are synchronous and short (microseconds to a few milliseconds); each
//! backend bounds them (SQLite's busy timeout, PostgreSQL's statement timeout and reply deadline).

mod location;
mod postgres;
mod sqlite;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::Event;

pub use location::{LocationError, PostgresLocation, StoreLocation};
pub use postgres::{PostgresStore, PostgresTimeouts};
pub use sqlite::SqliteStore;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening the store {path}: {source}")]
    Open { path: std::path::PathBuf, source: rusqlite::Error },
    #[error("migrating the store {location} to schema {version}: {source}")]
    Migrate { location: String, version: usize, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("the store {location} has schema {found}, newer than this repairer's {known}")]
    TooNew { location: String, found: usize, known: usize },
    #[error("store {operation}: {source}")]
    Sql { operation: &'static str, source: rusqlite::Error },
    #[error("store {operation} on {location}: {message}")]
    Postgres {
        operation: &'static str,
        location: String,
        /// The driver's error text, the password scrubbed out.
        message: String,
        /// The SQLSTATE when the server answered (e.g. `57014`: statement timeout).
        code: Option<String>,
    },
    #[error("store {operation} on {location}: no answer within {after:?}")]
    Timeout { operation: &'static str, location: String, after: Duration },
    #[error("store {operation}: bad JSON: {source}")]
    Json { operation: &'static str, source: serde_json::Error },
    #[error(
        "store {operation} refused: this repairer's lease (epoch {epoch}) was superseded by epoch \
         {newer}"
    )]
    Fenced { operation: &'static str, epoch: i64, newer: i64 },
    #[error(
        "store {operation} refused: this repairer does not lead (a standby, or its lease was not \
         renewed in time)"
    )]
    NotLeader { operation: &'static str },
    #[error("store location: {0}")]
    Location(#[from] LocationError),
}

/// One event to append: the indexed columns and the JSON document.
#[derive(Debug, Clone, Copy)]
pub struct EventRow<'a> {
    pub at_ms: i64,
    pub kind: &'a str,
    pub node: Option<&'a str>,
    pub body: &'a str,
}

/// An evidence bundle to keep (see [`Store::put_evidence`]).
#[derive(Debug, Clone, Copy)]
pub struct EvidenceRow<'a> {
    pub workflow: i64,
    pub node: &'a str,
    pub command: &'a str,
    pub body: &'a str,
    pub keep: usize,
}

/// A lease on leadership of a shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    /// Incremented each time the lease changes hands (or is taken again after it lapsed); the
    /// fencing token of the holder's writes.
    pub epoch: i64,
    /// When it lapses unless renewed, by the database's clock (ms since the Unix epoch).
    pub expires_at_ms: i64,
    /// Whether it had lapsed when read (by the database's clock).
    pub expired: bool,
}

/// The epoch a write is fenced with: `None` for a store that holds no lease (one repairer).
pub type Fence = Option<i64>;

/// A write started and not waited for yet ([`Store::start_put_node`]): [`Pending::wait`] answers
/// whether it was made. It lets a caller holding a lock start a write in the lock's order and
/// wait for it after letting the lock go.
#[must_use = "what a write records is acted on only once it was waited for"]
pub struct Pending<T>(Box<dyn FnOnce() -> Result<T, StoreError> + Send>);

impl<T: Send + 'static> Pending<T> {
    /// A write already made or refused.
    pub fn done(result: Result<T, StoreError>) -> Pending<T> {
        Pending(Box::new(move || result))
    }

    /// Waits for the write's outcome (at most the backend's own bound on a call).
    pub fn wait(self) -> Result<T, StoreError> {
        (self.0)()
    }
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// What a store backend does; documents are JSON strings. Every call is one transaction: it
/// happens whole or not at all.
pub trait StoreBackend: Send + Sync + std::fmt::Debug {
    /// Where the store lives, for logs and errors (never with a password).
    fn location(&self) -> String;
    /// The schema version of the open store.
    fn schema_version(&self) -> Result<usize, StoreError>;
    /// Appends an event; returns its id, higher than every id committed before it.
    fn append_event(&self, event: EventRow<'_>, fence: Fence) -> Result<i64, StoreError>;
    /// `(id, body)` of the events with an id above `after`, oldest first, at most `limit`.
    fn events(
        &self,
        after: i64,
        node: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError>;
    /// The id of the newest event (0 when the log is empty).
    fn newest_event_id(&self) -> Result<i64, StoreError>;
    fn put_node(&self, name: &str, state: &str, body: &str, fence: Fence)
    -> Result<(), StoreError>;
    /// Every node document, by name.
    /// Starts saving a node document: the write is made after every write this store started
    /// before it and before every write started after it. By default it is made at once (a
    /// backend whose writes take microseconds); a backend that waits on a server returns first.
    fn start_put_node(&self, name: &str, state: &str, body: &str, fence: Fence) -> Pending<()> {
        Pending::done(self.put_node(name, state, body, fence))
    }
    fn nodes(&self) -> Result<Vec<String>, StoreError>;
    fn insert_workflow(&self, node: &str, body: &str, fence: Fence) -> Result<i64, StoreError>;
    fn update_workflow(
        &self,
        id: i64,
        open: bool,
        body: &str,
        fence: Fence,
    ) -> Result<(), StoreError>;
    /// Every open workflow document, oldest first.
    fn open_workflows(&self) -> Result<Vec<String>, StoreError>;
    /// The workflow documents of `node`, newest first, at most `limit`.
    fn workflows_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError>;
    fn setting(&self, key: &str) -> Result<Option<String>, StoreError>;
    fn put_setting(&self, key: &str, body: &str, fence: Fence) -> Result<(), StoreError>;
    fn put_job(
        &self,
        id: &str,
        seq: u64,
        state: &str,
        body: &str,
        fence: Fence,
    ) -> Result<(), StoreError>;
    /// Every job document, in submission order.
    fn jobs(&self) -> Result<Vec<String>, StoreError>;
    fn put_evidence(&self, evidence: EvidenceRow<'_>, fence: Fence) -> Result<(), StoreError>;
    /// The evidence documents of `node`, newest first, at most `limit`.
    fn evidence_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError>;
    /// Takes the lease for `holder` when it is free or lapsed (a new epoch), or renews it when
    /// `holder` has it; `None` when another holder has it.
    fn acquire(&self, holder: &str, ttl: Duration) -> Result<Option<Lease>, StoreError>;
    /// Gives the lease up, if `holder` has it (the epoch stays: the next holder's is higher).
    fn release(&self, holder: &str) -> Result<(), StoreError>;
    /// The lease, if anyone holds it (lapsed or not).
    fn current(&self) -> Result<Option<Lease>, StoreError>;
}

/// The repairer's store: typed documents over a [`StoreBackend`].
#[derive(Debug, Clone)]
pub struct Store {
    backend: Arc<dyn StoreBackend>,
    /// The epoch this store's writes are fenced with; 0 for none (epochs start at 1).
    fence: Arc<AtomicI64>,
    /// Whether this repairer may write at all, and until when (see [`Store::allow_writes_until`]).
    writes: Arc<WriteGate>,
}

/// This repairer's own check before a write reaches the database: a standby writes nothing, and
/// a leader nothing past the moment its lease could have lapsed unrenewed.
#[derive(Debug, Default)]
struct WriteGate {
    /// Set on a standby and on a leader stepping down.
    closed: AtomicBool,
    /// The leader's writes stop at this instant (monotonic: a process stopped with SIGSTOP finds
    /// it passed when it runs again). `None`: no deadline (one repairer on its own store).
    until: Mutex<Option<Instant>>,
    /// The first write the database refused for a newer epoch.
    fenced: tokio::sync::watch::Sender<Option<String>>,
}

impl WriteGate {
    /// Passes a write's result on; a refusal for a newer epoch closes the gate and is told to
    /// whoever waits in [`Store::fenced`]. A write that returns after the deadline (a store that
    /// answered late) counts as refused: the lease may have lapsed meanwhile and another
    /// repairer may lead, so what it records must not be acted on here; whoever leads next reads
    /// it from the store and resumes from it.
    fn passed<T>(
        &self,
        operation: &'static str,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Err(err @ StoreError::Fenced { .. }) = &result {
            self.closed.store(true, Ordering::SeqCst);
            let text = err.to_string();
            self.fenced.send_if_modified(|first| first.is_none() && first.replace(text).is_none());
        }
        let value = result?;
        self.check(operation)?;
        Ok(value)
    }

    fn check(&self, operation: &'static str) -> Result<(), StoreError> {
        let lapsed = || {
            self.until
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|until| Instant::now() >= until)
        };
        if self.closed.load(Ordering::SeqCst) || lapsed() {
            return Err(StoreError::NotLeader { operation });
        }
        Ok(())
    }
}

fn json(operation: &'static str) -> impl FnOnce(serde_json::Error) -> StoreError {
    move |source| StoreError::Json { operation, source }
}

fn decode<T: DeserializeOwned>(
    bodies: Vec<String>,
    operation: &'static str,
) -> Result<Vec<T>, StoreError> {
    bodies.iter().map(|body| serde_json::from_str(body).map_err(json(operation))).collect()
}

impl Store {
    /// Opens the store at `location` (SQLite file or PostgreSQL database) and migrates it to the
    /// current schema.
    pub fn connect(location: &StoreLocation) -> Result<Store, StoreError> {
        match location {
            StoreLocation::Sqlite(path) => Store::open(path),
            StoreLocation::Postgres(pg) => {
                Ok(Store::from_backend(PostgresStore::open(pg, PostgresTimeouts::default())?))
            }
        }
    }

    /// Opens (or creates) the SQLite store at `path` and migrates it to the current schema.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Ok(Store::from_backend(SqliteStore::open(path)?))
    }

    /// A SQLite store in memory (tests, benchmarks, the simulator).
    pub fn in_memory() -> Result<Store, StoreError> {
        Ok(Store::from_backend(SqliteStore::in_memory()?))
    }

    pub fn from_backend(backend: impl StoreBackend + 'static) -> Store {
        Store {
            backend: Arc::new(backend),
            fence: Arc::new(AtomicI64::new(0)),
            writes: Arc::default(),
        }
    }

    /// Refuses every write from now on ([`StoreError::NotLeader`]): a standby's store, or a
    /// leader's that steps down. Reads go on.
    pub fn close_writes(&self) {
        self.writes.closed.store(true, Ordering::SeqCst);
    }

    /// Lets writes through until `until` (a leader's lease, renewed), and none after it.
    pub fn allow_writes_until(&self, until: Instant) {
        *self.writes.until.lock().unwrap_or_else(PoisonError::into_inner) = Some(until);
        self.writes.closed.store(false, Ordering::SeqCst);
    }

    /// Resolves once the database refused one of this store's writes for a newer epoch (another
    /// repairer leads), with the refusal's text.
    pub async fn fenced(&self) -> String {
        let mut fenced = self.writes.fenced.subscribe();
        loop {
            if let Some(text) = fenced.borrow_and_update().clone() {
                return text;
            }
            if fenced.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether a write would be let through now (by this repairer; the database may still refuse
    /// it for a newer epoch).
    pub fn writes_open(&self) -> bool {
        self.writes.check("check").is_ok()
    }

    /// The epoch this store's writes are fenced with, if any.
    pub fn fence(&self) -> Fence {
        Some(self.fence.load(Ordering::SeqCst)).filter(|epoch| *epoch > 0)
    }

    /// Fences this store's writes with `epoch` (a lease taken elsewhere).
    pub fn fence_with(&self, epoch: i64) {
        self.fence.store(epoch, Ordering::SeqCst);
    }

    /// Takes or renews the lease for `holder` (see [`StoreBackend::acquire`]); once taken, this
    /// store's writes are fenced with its epoch.
    pub fn acquire(&self, holder: &str, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let lease = self.backend.acquire(holder, ttl)?;
        if let Some(lease) = &lease {
            self.fence_with(lease.epoch);
        }
        Ok(lease)
    }

    /// Gives `holder`'s lease up.
    pub fn release(&self, holder: &str) -> Result<(), StoreError> {
        self.backend.release(holder)
    }

    /// The lease, if anyone holds it.
    pub fn current_lease(&self) -> Result<Option<Lease>, StoreError> {
        self.backend.current()
    }

    /// Where the store lives (never with a password).
    pub fn location(&self) -> String {
        self.backend.location()
    }

    /// The schema version of the open store.
    pub fn schema_version(&self) -> Result<usize, StoreError> {
        self.backend.schema_version()
    }

    /// Appends `event` to the audit log and returns its id.
    pub fn append_event(&self, event: &Event) -> Result<i64, StoreError> {
        self.writes.check("append event")?;
        // The event names the epoch it was written under (the audit trail shows which leader did
        // what); the database checks the same epoch.
        let fenced;
        let event = match self.fence() {
            Some(epoch) => {
                fenced = Event { epoch: Some(epoch), ..event.clone() };
                &fenced
            }
            None => event,
        };
        let body = serde_json::to_string(event).map_err(json("append event"))?;
        let row = EventRow {
            at_ms: event.at_ms as i64,
            kind: event.kind.as_str(),
            node: event.node.as_deref(),
            body: &body,
        };
        self.writes.passed("append event", self.backend.append_event(row, self.fence()))
    }

    /// Events with an id above `after`, oldest first, optionally of one node, at most `limit`.
    pub fn events(
        &self,
        after: i64,
        node: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let rows = self.backend.events(after, node, limit)?;
        let mut events = Vec::with_capacity(rows.len());
        for (id, body) in rows {
            let mut event: Event = serde_json::from_str(&body).map_err(json("read events"))?;
            event.id = id;
            events.push(event);
        }
        Ok(events)
    }

    /// The id of the newest event in the log (0 when it is empty).
    pub fn newest_event_id(&self) -> Result<i64, StoreError> {
        self.backend.newest_event_id()
    }

    /// Saves a node document under `name`.
    pub fn put_node<T: Serialize>(
        &self,
        name: &str,
        state: &str,
        node: &T,
    ) -> Result<(), StoreError> {
        self.start_put_node(name, state, node).wait()
    }

    /// Starts saving a node document (see [`StoreBackend::start_put_node`]): wait for it before
    /// acting on what it records.
    pub fn start_put_node<T: Serialize>(&self, name: &str, state: &str, node: &T) -> Pending<()> {
        if let Err(err) = self.writes.check("save node") {
            return Pending::done(Err(err));
        }
        let body = match serde_json::to_string(node) {
            Ok(body) => body,
            Err(err) => return Pending::done(Err(json("save node")(err))),
        };
        let pending = self.backend.start_put_node(name, state, &body, self.fence());
        let writes = self.writes.clone();
        Pending(Box::new(move || writes.passed("save node", pending.wait())))
    }

    /// Every node document.
    pub fn nodes<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        decode(self.backend.nodes()?, "read nodes")
    }

    /// Creates a workflow document for `node` and returns its id.
    pub fn insert_workflow<T: Serialize>(
        &self,
        node: &str,
        workflow: &T,
    ) -> Result<i64, StoreError> {
        self.writes.check("create workflow")?;
        let body = serde_json::to_string(workflow).map_err(json("create workflow"))?;
        self.writes
            .passed("create workflow", self.backend.insert_workflow(node, &body, self.fence()))
    }

    /// Replaces workflow `id`'s document; `open = false` once it finished.
    pub fn update_workflow<T: Serialize>(
        &self,
        id: i64,
        open: bool,
        workflow: &T,
    ) -> Result<(), StoreError> {
        self.writes.check("update workflow")?;
        let body = serde_json::to_string(workflow).map_err(json("update workflow"))?;
        self.writes
            .passed("update workflow", self.backend.update_workflow(id, open, &body, self.fence()))
    }

    /// Every workflow not finished yet, oldest first.
    pub fn open_workflows<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        decode(self.backend.open_workflows()?, "read workflows")
    }

    /// The workflows of `node`, newest first, at most `limit`.
    pub fn workflows_of<T: DeserializeOwned>(
        &self,
        node: &str,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        decode(self.backend.workflows_of(node, limit)?, "read workflows")
    }

    /// A setting (breaker state, ...), if set.
    pub fn setting<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        self.backend
            .setting(key)?
            .map(|body| serde_json::from_str(&body).map_err(json("read setting")))
            .transpose()
    }

    pub fn put_setting<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        self.writes.check("save setting")?;
        let body = serde_json::to_string(value).map_err(json("save setting"))?;
        self.writes.passed("save setting", self.backend.put_setting(key, &body, self.fence()))
    }

    /// Saves a job document (the embedded queue's) under `id`.
    pub fn put_job<T: Serialize>(
        &self,
        id: &str,
        seq: u64,
        state: &str,
        job: &T,
    ) -> Result<(), StoreError> {
        self.writes.check("save job")?;
        let body = serde_json::to_string(job).map_err(json("save job"))?;
        self.writes.passed("save job", self.backend.put_job(id, seq, state, &body, self.fence()))
    }

    /// Every job document, in submission order.
    pub fn jobs<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        decode(self.backend.jobs()?, "read jobs")
    }

    /// Keeps the evidence bundle that answered `command` for `workflow` on `node` (once: a second
    /// copy of the same answer changes nothing), and the newest `keep` of the node's bundles.
    pub fn put_evidence<T: Serialize>(
        &self,
        workflow: i64,
        node: &str,
        command: &str,
        evidence: &T,
        keep: usize,
    ) -> Result<(), StoreError> {
        self.writes.check("keep evidence")?;
        let body = serde_json::to_string(evidence).map_err(json("keep evidence"))?;
        let row = EvidenceRow { workflow, node, command, body: &body, keep };
        self.writes.passed("keep evidence", self.backend.put_evidence(row, self.fence()))
    }

    /// The evidence kept for `node`, newest first, at most `limit`.
    pub fn evidence_of<T: DeserializeOwned>(
        &self,
        node: &str,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        decode(self.backend.evidence_of(node, limit)?, "read evidence")
    }
}

#[cfg(test)]
mod tests;
