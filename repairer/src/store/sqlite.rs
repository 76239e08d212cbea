//! The SQLite backend: one file (WAL), one repairer. The embedded default.
//!
//! SQLite does not support several repairers on one store: its lease is always its own (taken at
//! once, epoch 1, kept in memory) and its writes are never fenced.
//!
//! rusqlite is synchronous: calls take a mutex around one connection and last microseconds to a
//! few milliseconds; hot paths (report ingest) touch the store only when something changed. One
//! connection behind a mutex also makes event ids (AUTOINCREMENT) increase in commit order.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OptionalExtension, params};

use super::{EventRow, EvidenceRow, Fence, Lease, StoreBackend, StoreError};

/// Schema migrations, applied in order, each once; the index + 1 is the schema version. Append,
/// never edit: a store written by an older repairer is migrated forward at open.
pub(super) const MIGRATIONS: &[&str] = &[
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

/// The SQLite store.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// The lease this (only) repairer took.
    lease: Mutex<Option<Lease>>,
}

fn sql(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { operation, source }
}

/// Runs one of the store's writes through the connection's statement cache: the same few
/// statements run for every event and node change, and parsing each again cost more than the
/// write itself.
fn write(
    conn: &Connection,
    statement: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(statement)?.execute(params)
}

impl SqliteStore {
    /// Opens (or creates) the store at `path` and migrates it to the current schema.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let open_err = |source| StoreError::Open { path: path.to_owned(), source };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
        // NORMAL in WAL mode: a power loss may lose the last transactions but never corrupts;
        // a killed repairer loses nothing that was committed.
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(open_err)?;
        let store =
            SqliteStore { path: path.to_owned(), conn: Mutex::new(conn), lease: Mutex::new(None) };
        store.migrate()?;
        Ok(store)
    }

    /// A store in memory (tests, benchmarks).
    pub fn in_memory() -> Result<SqliteStore, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory()
            .map_err(|source| StoreError::Open { path: path.clone(), source })?;
        let store = SqliteStore { path, conn: Mutex::new(conn), lease: Mutex::new(None) };
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
                location: self.location(),
                found,
                known: MIGRATIONS.len(),
            });
        }
        for (index, migration) in MIGRATIONS.iter().enumerate().skip(found) {
            let version = index + 1;
            let err = |source: rusqlite::Error| StoreError::Migrate {
                location: self.location(),
                version,
                source: Box::new(source),
            };
            let tx = conn.transaction().map_err(err)?;
            tx.execute_batch(migration).map_err(err)?;
            tx.pragma_update(None, "user_version", version as i64).map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(())
    }

    /// The documents `query` selects for `node` (`?1`), at most `limit` (`?2`).
    fn documents_of(
        &self,
        query: &str,
        node: &str,
        limit: usize,
        operation: &'static str,
    ) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(query).map_err(sql(operation))?;
        let rows = statement
            .query_map(params![node, limit as i64], |row| row.get::<_, String>(0))
            .map_err(sql(operation))?;
        rows.collect::<Result<_, _>>().map_err(sql(operation))
    }

    fn documents(&self, query: &str, operation: &'static str) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(query).map_err(sql(operation))?;
        let rows =
            statement.query_map([], |row| row.get::<_, String>(0)).map_err(sql(operation))?;
        rows.collect::<Result<_, _>>().map_err(sql(operation))
    }
}

impl StoreBackend for SqliteStore {
    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn schema_version(&self) -> Result<usize, StoreError> {
        let version: i64 = self
            .conn()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(sql("reading the schema version"))?;
        Ok(version as usize)
    }

    fn append_event(&self, event: EventRow<'_>, _fence: Fence) -> Result<i64, StoreError> {
        let conn = self.conn();
        write(
            &conn,
            "INSERT INTO events (at_ms, kind, node, body) VALUES (?1, ?2, ?3, ?4)",
            params![event.at_ms, event.kind, event.node, event.body],
        )
        .map_err(sql("append event"))?;
        Ok(conn.last_insert_rowid())
    }

    fn events(
        &self,
        after: i64,
        node: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let conn = self.conn();
        let mut statement = conn
            .prepare_cached(
                "SELECT id, body FROM events WHERE id > ?1 AND (?2 IS NULL OR node = ?2)
                 ORDER BY id LIMIT ?3",
            )
            .map_err(sql("read events"))?;
        let rows = statement
            .query_map(params![after, node, limit as i64], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(sql("read events"))?;
        rows.collect::<Result<_, _>>().map_err(sql("read events"))
    }

    fn newest_event_id(&self) -> Result<i64, StoreError> {
        let id: Option<i64> = self
            .conn()
            .query_row("SELECT MAX(id) FROM events", [], |row| row.get(0))
            .optional()
            .map_err(sql("read the newest event id"))?
            .flatten();
        Ok(id.unwrap_or(0))
    }

    fn put_node(
        &self,
        name: &str,
        state: &str,
        body: &str,
        _fence: Fence,
    ) -> Result<(), StoreError> {
        write(
            &self.conn(),
            "INSERT INTO nodes (name, state, body) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET state = excluded.state, body = excluded.body",
            params![name, state, body],
        )
        .map_err(sql("save node"))?;
        Ok(())
    }

    fn nodes(&self) -> Result<Vec<String>, StoreError> {
        self.documents("SELECT body FROM nodes ORDER BY name", "read nodes")
    }

    fn insert_workflow(&self, node: &str, body: &str, _fence: Fence) -> Result<i64, StoreError> {
        let conn = self.conn();
        write(
            &conn,
            "INSERT INTO workflows (node, open, body) VALUES (?1, 1, ?2)",
            params![node, body],
        )
        .map_err(sql("create workflow"))?;
        Ok(conn.last_insert_rowid())
    }

    fn update_workflow(
        &self,
        id: i64,
        open: bool,
        body: &str,
        _fence: Fence,
    ) -> Result<(), StoreError> {
        write(
            &self.conn(),
            "UPDATE workflows SET open = ?2, body = ?3 WHERE id = ?1",
            params![id, open as i64, body],
        )
        .map_err(sql("update workflow"))?;
        Ok(())
    }

    fn open_workflows(&self) -> Result<Vec<String>, StoreError> {
        self.documents("SELECT body FROM workflows WHERE open = 1 ORDER BY id", "read workflows")
    }

    fn workflows_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        self.documents_of(
            "SELECT body FROM workflows WHERE node = ?1 ORDER BY id DESC LIMIT ?2",
            node,
            limit,
            "read workflows",
        )
    }

    fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn()
            .query_row("SELECT body FROM settings WHERE key = ?1", params![key], |row| row.get(0))
            .optional()
            .map_err(sql("read setting"))
    }

    fn put_setting(&self, key: &str, body: &str, _fence: Fence) -> Result<(), StoreError> {
        write(
            &self.conn(),
            "INSERT INTO settings (key, body) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET body = excluded.body",
            params![key, body],
        )
        .map_err(sql("save setting"))?;
        Ok(())
    }

    fn put_job(
        &self,
        id: &str,
        seq: u64,
        state: &str,
        body: &str,
        _fence: Fence,
    ) -> Result<(), StoreError> {
        write(
            &self.conn(),
            "INSERT INTO jobs (id, seq, state, body) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body",
            params![id, seq as i64, state, body],
        )
        .map_err(sql("save job"))?;
        Ok(())
    }

    fn jobs(&self) -> Result<Vec<String>, StoreError> {
        self.documents("SELECT body FROM jobs ORDER BY seq", "read jobs")
    }

    fn put_evidence(&self, evidence: EvidenceRow<'_>, _fence: Fence) -> Result<(), StoreError> {
        let operation = "keep evidence";
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(sql(operation))?;
        tx.execute(
            "INSERT INTO evidence (workflow, node, command, body) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (command) DO NOTHING",
            params![evidence.workflow, evidence.node, evidence.command, evidence.body],
        )
        .map_err(sql(operation))?;
        tx.execute(
            "DELETE FROM evidence WHERE node = ?1 AND id NOT IN
             (SELECT id FROM evidence WHERE node = ?1 ORDER BY id DESC LIMIT ?2)",
            params![evidence.node, evidence.keep as i64],
        )
        .map_err(sql(operation))?;
        tx.commit().map_err(sql(operation))
    }

    fn evidence_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        self.documents_of(
            "SELECT body FROM evidence WHERE node = ?1 ORDER BY id DESC LIMIT ?2",
            node,
            limit,
            "read evidence",
        )
    }

    fn acquire(&self, holder: &str, ttl: std::time::Duration) -> Result<Option<Lease>, StoreError> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let lease = Lease {
            holder: holder.to_owned(),
            epoch: 1,
            expires_at_ms: now_ms.saturating_add(ttl.as_millis() as i64),
            expired: false,
        };
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease.clone());
        Ok(Some(lease))
    }

    fn release(&self, holder: &str) -> Result<(), StoreError> {
        let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        if lease.as_ref().is_some_and(|l| l.holder == holder) {
            *lease = None;
        }
        Ok(())
    }

    fn current(&self) -> Result<Option<Lease>, StoreError> {
        Ok(self.lease.lock().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

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
}
