//! The repairer's embedded store: one SQLite file (WAL), with schema migrations.
//!
//! The event log is the audit trail and is written before anything it describes is acted on;
//! nodes and workflows are kept as JSON documents keyed by name and id, so a restarted repairer
//! finds every node in its state and every workflow at its step.
//!
//! rusqlite is synchronous: calls take a mutex around one connection and last microseconds to a
//! few milliseconds; hot paths (report ingest) touch the store only when something changed.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::Event;

/// Schema migrations, applied in order, each once; the index + 1 is the schema version. Append,
/// never edit: a store written by an older repairer is migrated forward at open.
const MIGRATIONS: &[&str] = &[
    // 1: audit log, nodes, workflows, key-value settings (breaker, ...).
    "CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        kind TEXT NOT NULL,
        node TEXT,
        body TEXT NOT NULL
     );
     CREATE INDEX events_node ON events (node, id);
     CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        body TEXT NOT NULL
     );
     CREATE TABLE workflows (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node TEXT NOT NULL,
        open INTEGER NOT NULL,
        body TEXT NOT NULL
     );
     CREATE INDEX workflows_open ON workflows (open, node);
     CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        body TEXT NOT NULL
     );",
    // 2: the embedded job queue's jobs (one JSON document per job; `seq` is submission order).
    "CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        body TEXT NOT NULL
     );
     CREATE INDEX jobs_state ON jobs (state, seq);",
    // 3: evidence bundles gathered before disruptive repairs, one JSON document each.
    "CREATE TABLE evidence (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        workflow INTEGER NOT NULL,
        node TEXT NOT NULL,
        command TEXT NOT NULL UNIQUE,
        body TEXT NOT NULL
     );
     CREATE INDEX evidence_node ON evidence (node, id);",
];

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening the store {path}: {source}")]
    Open { path: PathBuf, source: rusqlite::Error },
    #[error("migrating the store {path} to schema {version}: {source}")]
    Migrate { path: PathBuf, version: usize, source: rusqlite::Error },
    #[error("the store {path} has schema {found}, newer than this repairer's {known}")]
    TooNew { path: PathBuf, found: usize, known: usize },
    #[error("store {operation}: {source}")]
    Sql { operation: &'static str, source: rusqlite::Error },
    #[error("store {operation}: bad JSON: {source}")]
    Json { operation: &'static str, source: serde_json::Error },
}

/// The repairer's SQLite store.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
}

fn sql(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { operation, source }
}

fn json(operation: &'static str) -> impl FnOnce(serde_json::Error) -> StoreError {
    move |source| StoreError::Json { operation, source }
}

impl Store {
    /// Opens (or creates) the store at `path` and migrates it to the current schema.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open { path: path.to_owned(), source };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
        // NORMAL in WAL mode: a power loss may lose the last transactions but never corrupts;
        // a killed repairer loses nothing that was committed.
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(open_err)?;
        let store = Store { path: path.to_owned(), conn: Mutex::new(conn) };
        store.migrate()?;
        Ok(store)
    }

    /// A store in memory (tests, benchmarks).
    pub fn in_memory() -> Result<Store, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory()
            .map_err(|source| StoreError::Open { path: path.clone(), source })?;
        let store = Store { path, conn: Mutex::new(conn) };
        store.migrate()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let found: usize = conn
            .pragma_query_value(None, "user_version", |row| row.get::<_, i64>(0))
            .map_err(sql("reading the schema version"))? as usize;
        if found > MIGRATIONS.len() {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found,
                known: MIGRATIONS.len(),
            });
        }
        for (index, migration) in MIGRATIONS.iter().enumerate().skip(found) {
            let version = index + 1;
            let err = |source| StoreError::Migrate { path: self.path.clone(), version, source };
            let tx = conn.transaction().map_err(err)?;
            tx.execute_batch(migration).map_err(err)?;
            tx.pragma_update(None, "user_version", version as i64).map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(())
    }

    /// The schema version of the open store.
    pub fn schema_version(&self) -> Result<usize, StoreError> {
        let version: i64 = self
            .conn()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(sql("reading the schema version"))?;
        Ok(version as usize)
    }

    /// Appends `event` to the audit log and returns its id.
    pub fn append_event(&self, event: &Event) -> Result<i64, StoreError> {
        let body = serde_json::to_string(event).map_err(json("append event"))?;
        let conn = self.conn();
        conn.execute(
            "INSERT INTO events (at_ms, kind, node, body) VALUES (?1, ?2, ?3, ?4)",
            params![event.at_ms as i64, event.kind.as_str(), event.node, body],
        )
        .map_err(sql("append event"))?;
        Ok(conn.last_insert_rowid())
    }

    /// Events with an id above `after`, oldest first, optionally of one node, at most `limit`.
    pub fn events(
        &self,
        after: i64,
        node: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let conn = self.conn();
        let mut statement = conn
            .prepare_cached(
                "SELECT id, body FROM events WHERE id > ?1 AND (?2 IS NULL OR node = ?2)
                 ORDER BY id LIMIT ?3",
            )
            .map_err(sql("read events"))?;
        let rows = statement
            .query_map(params![after, node, limit as i64], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(sql("read events"))?;
        let mut events = Vec::new();
        for row in rows {
            let (id, body) = row.map_err(sql("read events"))?;
            let mut event: Event = serde_json::from_str(&body).map_err(json("read events"))?;
            event.id = id;
            events.push(event);
        }
        Ok(events)
    }

    /// Saves a node document under `name`.
    pub fn put_node<T: Serialize>(
        &self,
        name: &str,
        state: &str,
        node: &T,
    ) -> Result<(), StoreError> {
        let body = serde_json::to_string(node).map_err(json("save node"))?;
        self.conn()
            .execute(
                "INSERT INTO nodes (name, state, body) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET state = excluded.state, body = excluded.body",
                params![name, state, body],
            )
            .map_err(sql("save node"))?;
        Ok(())
    }

    /// Every node document.
    pub fn nodes<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        self.documents("SELECT body FROM nodes ORDER BY name", "read nodes")
    }

    /// Creates a workflow document for `node` and returns its id.
    pub fn insert_workflow<T: Serialize>(
        &self,
        node: &str,
        workflow: &T,
    ) -> Result<i64, StoreError> {
        let body = serde_json::to_string(workflow).map_err(json("create workflow"))?;
        let conn = self.conn();
        conn.execute(
            "INSERT INTO workflows (node, open, body) VALUES (?1, 1, ?2)",
            params![node, body],
        )
        .map_err(sql("create workflow"))?;
        Ok(conn.last_insert_rowid())
    }

    /// Replaces workflow `id`'s document; `open = false` once it finished.
    pub fn update_workflow<T: Serialize>(
        &self,
        id: i64,
        open: bool,
        workflow: &T,
    ) -> Result<(), StoreError> {
        let body = serde_json::to_string(workflow).map_err(json("update workflow"))?;
        self.conn()
            .execute(
                "UPDATE workflows SET open = ?2, body = ?3 WHERE id = ?1",
                params![id, open as i64, body],
            )
            .map_err(sql("update workflow"))?;
        Ok(())
    }

    /// Every workflow not finished yet, oldest first.
    pub fn open_workflows<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        self.documents("SELECT body FROM workflows WHERE open = 1 ORDER BY id", "read workflows")
    }

    /// The workflows of `node`, newest first, at most `limit`.
    pub fn workflows_of<T: DeserializeOwned>(
        &self,
        node: &str,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        self.documents_of(
            "SELECT body FROM workflows WHERE node = ?1 ORDER BY id DESC LIMIT ?2",
            node,
            limit,
            "read workflows",
        )
    }

    /// A setting (breaker state, ...), if set.
    pub fn setting<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        let body: Option<String> = self
            .conn()
            .query_row("SELECT body FROM settings WHERE key = ?1", params![key], |row| row.get(0))
            .optional()
            .map_err(sql("read setting"))?;
        body.map(|body| serde_json::from_str(&body).map_err(json("read setting"))).transpose()
    }

    pub fn put_setting<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let body = serde_json::to_string(value).map_err(json("save setting"))?;
        self.conn()
            .execute(
                "INSERT INTO settings (key, body) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET body = excluded.body",
                params![key, body],
            )
            .map_err(sql("save setting"))?;
        Ok(())
    }

    /// Saves a job document (the embedded queue's) under `id`.
    pub fn put_job<T: Serialize>(
        &self,
        id: &str,
        seq: u64,
        state: &str,
        job: &T,
    ) -> Result<(), StoreError> {
        let body = serde_json::to_string(job).map_err(json("save job"))?;
        self.conn()
            .execute(
                "INSERT INTO jobs (id, seq, state, body) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body",
                params![id, seq as i64, state, body],
            )
            .map_err(sql("save job"))?;
        Ok(())
    }

    /// Every job document, in submission order.
    pub fn jobs<T: DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        self.documents("SELECT body FROM jobs ORDER BY seq", "read jobs")
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
        let body = serde_json::to_string(evidence).map_err(json("keep evidence"))?;
        self.transaction("keep evidence", |tx| {
            tx.execute(
                "INSERT INTO evidence (workflow, node, command, body) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (command) DO NOTHING",
                params![workflow, node, command, body],
            )?;
            tx.execute(
                "DELETE FROM evidence WHERE node = ?1 AND id NOT IN
                 (SELECT id FROM evidence WHERE node = ?1 ORDER BY id DESC LIMIT ?2)",
                params![node, keep as i64],
            )?;
            Ok(())
        })
    }

    /// The evidence kept for `node`, newest first, at most `limit`.
    pub fn evidence_of<T: DeserializeOwned>(
        &self,
        node: &str,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        self.documents_of(
            "SELECT body FROM evidence WHERE node = ?1 ORDER BY id DESC LIMIT ?2",
            node,
            limit,
            "read evidence",
        )
    }

    /// Runs `f` on the connection inside one transaction (for modules with their own tables,
    /// such as the alert outbox).
    pub fn transaction<T>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, rusqlite::Error>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(sql(operation))?;
        let value = f(&tx).map_err(sql(operation))?;
        tx.commit().map_err(sql(operation))?;
        Ok(value)
    }

    /// The documents `query` selects for `node` (`?1`), at most `limit` (`?2`).
    fn documents_of<T: DeserializeOwned>(
        &self,
        query: &str,
        node: &str,
        limit: usize,
        operation: &'static str,
    ) -> Result<Vec<T>, StoreError> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(query).map_err(sql(operation))?;
        let rows = statement
            .query_map(params![node, limit as i64], |row| row.get::<_, String>(0))
            .map_err(sql(operation))?;
        let mut out = Vec::new();
        for row in rows {
            let body = row.map_err(sql(operation))?;
            out.push(serde_json::from_str(&body).map_err(json(operation))?);
        }
        Ok(out)
    }

    fn documents<T: DeserializeOwned>(
        &self,
        query: &str,
        operation: &'static str,
    ) -> Result<Vec<T>, StoreError> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(query).map_err(sql(operation))?;
        let rows =
            statement.query_map([], |row| row.get::<_, String>(0)).map_err(sql(operation))?;
        let mut out = Vec::new();
        for row in rows {
            let body = row.map_err(sql(operation))?;
            out.push(serde_json::from_str(&body).map_err(json(operation))?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Actor, EventKind, Severity};

    #[test]
    fn migrates_once_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len());
        let event = Event::new(
            EventKind::NodeJoined,
            Severity::Info,
            Some("n1"),
            Actor::repairer(),
            "first report",
            1,
        );
        assert_eq!(store.append_event(&event).unwrap(), 1);
        drop(store);
        let store = Store::open(&path).unwrap();
        let events = store.events(0, None, 10).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, 1);
        assert_eq!(events[0].reason, "first report");
        assert!(store.events(0, Some("n2"), 10).unwrap().is_empty());
    }

    #[test]
    fn refuses_a_store_from_a_newer_repairer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(Store::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 999).unwrap();
        drop(conn);
        assert!(matches!(Store::open(&path), Err(StoreError::TooNew { found: 999, .. })));
    }

    #[test]
    fn jobs_are_saved_in_submission_order() {
        let store = Store::in_memory().unwrap();
        store.put_job("j-2", 2, "queued", &serde_json::json!({"id": "j-2"})).unwrap();
        store.put_job("j-1", 1, "running", &serde_json::json!({"id": "j-1"})).unwrap();
        store
            .put_job("j-1", 1, "completed", &serde_json::json!({"id": "j-1", "done": true}))
            .unwrap();
        let jobs: Vec<serde_json::Value> = store.jobs().unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0]["id"], "j-1");
        assert_eq!(jobs[0]["done"], true);
    }

    #[test]
    fn evidence_is_kept_once_and_the_newest_per_node() {
        let store = Store::in_memory().unwrap();
        for i in 0..4 {
            let body = serde_json::json!({"n": i});
            store.put_evidence(i, "n1", &format!("evidence-{i}-reboot"), &body, 3).unwrap();
        }
        let again = serde_json::json!({"n": 99});
        store.put_evidence(3, "n1", "evidence-3-reboot", &again, 3).unwrap();
        let kept: Vec<serde_json::Value> = store.evidence_of("n1", 10).unwrap();
        let numbers: Vec<i64> = kept.iter().map(|k| k["n"].as_i64().unwrap()).collect();
        assert_eq!(numbers, [3, 2, 1]);
        assert!(store.evidence_of::<serde_json::Value>("n2", 10).unwrap().is_empty());
    }

    #[test]
    fn workflows_open_and_close() {
        let store = Store::in_memory().unwrap();
        let id = store.insert_workflow("n1", &serde_json::json!({"step": "drain"})).unwrap();
        let open: Vec<serde_json::Value> = store.open_workflows().unwrap();
        assert_eq!(open.len(), 1);
        store.update_workflow(id, false, &serde_json::json!({"step": "done"})).unwrap();
        assert!(store.open_workflows::<serde_json::Value>().unwrap().is_empty());
        let history: Vec<serde_json::Value> = store.workflows_of("n1", 5).unwrap();
        assert_eq!(history[0]["step"], "done");
    }
}
