//! The PostgreSQL backend: one database that several repairers can share, so that losing a
//! repairer's host loses nothing.
//!
//! Threading. The store's API is synchronous and is called from async code. The synchronous
//! `postgres` client drives its own single-threaded runtime and panics when called from inside a
//! tokio runtime, so one dedicated thread owns the connection and runs each call, sent to it over
//! a channel as a closure; the caller waits for the answer with a deadline (the connect timeout
//! plus the statement timeout plus a margin) and gets [`StoreError::Timeout`] past it. The
//! server bounds each statement itself (`statement_timeout`, which also bounds lock waits). Calls
//! are short and, as with SQLite's mutex, run one at a time; one connection per repairer is plenty
//! for its write rate and keeps the design small.
//!
//! Round trips. Each call's statements are prepared once per connection and kept, so running one
//! is a single round trip (Bind, Execute, Sync) instead of two (Parse and Describe first). Every
//! write of one row is one statement, committed on its own (an implicit transaction): the fence
//! check, the event lock and the write are parts of it (`WITH` clauses), so a write costs one round
//! trip and one WAL flush, where `BEGIN`, a check, the write and `COMMIT` took four to eight round
//! trips. Each round trip is a switch to the server's process and back: on a busy machine the
//! switches, not the statements, are what a write waits for, and a write made with the fleet's
//! nodes lock held makes every report wait with it.
//!
//! Reconnection. The connection is opened on the first call and again on the first call after it
//! broke (the server restarted, the network dropped): a call that meets a broken connection fails
//! with a clear error, and every call is one transaction, so nothing is half-written. A call whose
//! answer came too late may still have committed; like a call that meets a dropped connection
//! during COMMIT, its outcome is unknown to the caller, who treats it as failed and does not act
//! (an event in the log that was not acted on is a record of a decision, never of an action
//! taken without one).
//!
//! Event ids. `events.id` is a BIGSERIAL: a sequence value is taken at INSERT and becomes visible
//! at COMMIT, so two writers could take 5 and 6 and commit 6 first, and a reader paging by id
//! (the API, the alert outbox) that saw 6 would skip 5 forever. Every append therefore takes a
//! transaction-scoped advisory lock before its INSERT and holds it to COMMIT: appends are
//! serialised across every connection to the database, and ids are committed in the order they
//! were taken. A gap (an append rolled back) skips nothing.
//!
//! Leadership and fencing. One `leadership` row holds the lease: holder, epoch and expiry, the
//! expiry computed by the database's clock (`clock_timestamp()`), never a caller's. Taking it
//! when it is free or lapsed increments the epoch; its holder renews it in place. A write fenced
//! with epoch E first reads the row `FOR SHARE` in its own transaction (its statement's `lease`
//! clause, which the write's condition reads before any row is written) and is refused
//! ([`StoreError::Fenced`], nothing stored) when the row's epoch is above E. The
//! share lock conflicts with the row lock an acquire's UPDATE takes, so a write and a change of
//! holder are ordered: a write that passed the check commits before the new epoch does, and a
//! write that starts after it sees the new epoch.
//!
//! Migrations are versioned like SQLite's: an append-only list, a `schema_version` table, each
//! migration applied in its own transaction under an advisory lock (two repairers starting at
//! once migrate once), and a schema newer than this repairer's is refused.

use std::collections::HashMap;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use super::location::PostgresLocation;
use super::{EventRow, EvidenceRow, Fence, Lease, Pending, StoreBackend, StoreError};

mod sql;

use sql::{
    APPEND_EVENT, EVENT_LOCK, INSERT_WORKFLOW, LEASE_COLUMNS, MIGRATION_LOCK, MIGRATIONS, PUT_JOB,
    PUT_NODE, PUT_SETTING, UPDATE_WORKFLOW,
};

/// How long the store waits on PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostgresTimeouts {
    /// Opening a connection (unless the connection string sets `connect_timeout`).
    pub connect: Duration,
    /// One statement, lock waits included (the server's `statement_timeout`).
    pub statement: Duration,
}

impl Default for PostgresTimeouts {
    fn default() -> Self {
        PostgresTimeouts { connect: Duration::from_secs(5), statement: Duration::from_secs(5) }
    }
}

impl PostgresTimeouts {
    /// How long a caller waits for an answer: a connect and a statement, and a margin.
    fn reply_deadline(&self) -> Duration {
        self.connect + self.statement + Duration::from_secs(2)
    }
}

/// Why a call on the connection's thread failed.
enum CallError {
    Postgres(postgres::Error),
    /// A fenced write met a newer epoch (`newer` above the write's `epoch`).
    Fenced {
        epoch: i64,
        newer: i64,
    },
}

impl From<postgres::Error> for CallError {
    fn from(err: postgres::Error) -> CallError {
        CallError::Postgres(err)
    }
}

/// A call run on the connection's thread.
type Job = Box<dyn FnOnce(&mut Session) + Send>;

/// Parameters of one statement, as the driver takes them.
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// The PostgreSQL store.
#[derive(Debug)]
pub struct PostgresStore {
    place: Arc<Place>,
    jobs: mpsc::Sender<Job>,
    reply_deadline: Duration,
}

/// What the store's errors name: where it is (never with the password), and the password to
/// scrub from the driver's messages.
#[derive(Debug)]
struct Place {
    location: String,
    password: Option<String>,
}

impl Place {
    fn failure(&self, operation: &'static str, message: String) -> StoreError {
        StoreError::Postgres { operation, location: self.location.clone(), message, code: None }
    }

    /// The driver's error as a store error, the password scrubbed from its text.
    fn error(&self, operation: &'static str, err: &postgres::Error) -> StoreError {
        let mut message = err.to_string();
        if let Some(db) = err.as_db_error()
            && let Some(detail) = db.detail()
        {
            message = format!("{message} ({detail})");
        }
        if let Some(password) = &self.password {
            message = message.replace(password.as_str(), "***");
        }
        StoreError::Postgres {
            operation,
            location: self.location.clone(),
            message,
            code: err.code().map(|c| c.code().to_owned()),
        }
    }

    /// A call's answer, or what kept it from coming within `deadline`, as the store tells it.
    fn answer<T>(
        &self,
        operation: &'static str,
        answer: Result<Result<T, CallError>, mpsc::RecvTimeoutError>,
        deadline: Duration,
    ) -> Result<T, StoreError> {
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(CallError::Postgres(err))) => Err(self.error(operation, &err)),
            Ok(Err(CallError::Fenced { epoch, newer })) => {
                Err(StoreError::Fenced { operation, epoch, newer })
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Err(StoreError::Timeout {
                operation,
                location: self.location.clone(),
                after: deadline,
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(self.failure(operation, "the connection thread stopped".into()))
            }
        }
    }
}

/// The connection thread's state: the settings and the connection, when one is open.
struct Session {
    config: postgres::Config,
    statement_timeout: Duration,
    connection: Option<Connection>,
}

/// An open connection and the statements prepared on it (they live as long as it does).
struct Connection {
    client: Client,
    prepared: HashMap<&'static str, Statement>,
}

impl Connection {
    /// `sql` prepared on this connection, once.
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.prepared.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.prepared.insert(sql, statement.clone());
        Ok(statement)
    }

    fn query(&mut self, sql: &'static str, params: Params<'_>) -> Result<Vec<Row>, CallError> {
        let statement = self.statement(sql)?;
        Ok(self.client.query(&statement, params)?)
    }

    fn query_one(&mut self, sql: &'static str, params: Params<'_>) -> Result<Row, CallError> {
        let statement = self.statement(sql)?;
        Ok(self.client.query_one(&statement, params)?)
    }

    fn query_opt(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Option<Row>, CallError> {
        let statement = self.statement(sql)?;
        Ok(self.client.query_opt(&statement, params)?)
    }

    /// Runs a fenced write: `sql` is one statement (see `sql.rs`) answering one row,
    /// the lease's epoch and what the write returned (none when the fence held it back). Refused
    /// when a newer epoch than `fence` holds the lease.
    fn fenced(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
        fence: Fence,
    ) -> Result<Option<i64>, CallError> {
        let row = self.query_one(sql, params)?;
        let newer: Option<i64> = row.get(0);
        if let (Some(epoch), Some(newer)) = (fence, newer)
            && newer > epoch
        {
            return Err(CallError::Fenced { epoch, newer });
        }
        Ok(row.get(1))
    }
}

impl Session {
    fn connection(&mut self) -> Result<&mut Connection, postgres::Error> {
        if self.connection.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.connection = None;
        }
        match &mut self.connection {
            Some(connection) => Ok(connection),
            slot => {
                let mut client = self.config.connect(NoTls)?;
                client.batch_execute(&format!(
                    "SET statement_timeout = {}; SET idle_in_transaction_session_timeout = {}",
                    self.statement_timeout.as_millis(),
                    self.statement_timeout.as_millis() * 2,
                ))?;
                Ok(slot.insert(Connection { client, prepared: HashMap::new() }))
            }
        }
    }

    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        let result = match self.connection() {
            Ok(connection) => f(connection),
            Err(err) => Err(CallError::Postgres(err)),
        };
        if let Err(CallError::Postgres(err)) = &result
            && connection_lost(err)
        {
            // The next call opens a new connection (and prepares its statements again).
            self.connection = None;
        }
        result
    }
}

/// Whether `err` leaves the connection unusable: no answer from the server (I/O, closed), or the
/// server ending the session (SQLSTATE class 08, connection exception; 57P, operator
/// intervention such as a shutdown).
fn connection_lost(err: &postgres::Error) -> bool {
    match err.code() {
        None => true,
        Some(code) => {
            let code = code.code();
            code.starts_with("08") || code.starts_with("57P")
        }
    }
}

/// What one migration step found.
enum Migrated {
    Done,
    TooNew(usize),
}

impl PostgresStore {
    /// Connects to `location`, migrates the database to the current schema, and keeps the
    /// connection (reopened as needed) on a thread of its own.
    pub fn open(
        location: &PostgresLocation,
        timeouts: PostgresTimeouts,
    ) -> Result<PostgresStore, StoreError> {
        let mut config = location.config()?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(timeouts.connect);
        }
        // A peer that vanished fails the connection instead of leaving writes unacknowledged.
        config.tcp_user_timeout(timeouts.connect + timeouts.statement);
        config.keepalives_idle(Duration::from_secs(10));
        if config.get_application_name().is_none() {
            config.application_name("fleetmend-repairer");
        }
        let (jobs, queue) = mpsc::channel::<Job>();
        let mut session =
            Session { config, statement_timeout: timeouts.statement, connection: None };
        let place = Place {
            location: location.redacted().to_owned(),
            password: location.password().filter(|p| !p.is_empty()),
        };
        let store = PostgresStore {
            place: Arc::new(place),
            jobs,
            reply_deadline: timeouts.reply_deadline(),
        };
        std::thread::Builder::new()
            .name("store-postgres".into())
            .spawn(move || {
                // Ends when the store (every sender) is dropped; the connection closes with it.
                for job in queue {
                    job(&mut session);
                }
            })
            .map_err(|err| store.failure("start the connection thread", err.to_string()))?;
        store.migrate()?;
        Ok(store)
    }

    fn failure(&self, operation: &'static str, message: String) -> StoreError {
        self.place.failure(operation, message)
    }

    /// Runs `f` on the connection's thread and waits for its answer, at most the reply deadline.
    fn call<T: Send + 'static>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T, CallError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.start(operation, f).wait()
    }

    /// Sends `f` to the connection's thread, which runs the calls in the order they were sent;
    /// the answer is waited for, at most the reply deadline, in [`Pending::wait`].
    fn start<T: Send + 'static>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T, CallError> + Send + 'static,
    ) -> Pending<T> {
        let (reply, answer) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |session: &mut Session| {
            // The caller may have stopped waiting (deadline): then nobody needs the answer.
            let _ = reply.send(session.run(f));
        });
        if self.jobs.send(job).is_err() {
            return Pending::done(Err(
                self.failure(operation, "the connection thread stopped".into())
            ));
        }
        let (place, deadline) = (self.place.clone(), self.reply_deadline);
        Pending(Box::new(move || place.answer(operation, answer.recv_timeout(deadline), deadline)))
    }

    fn migrate(&self) -> Result<(), StoreError> {
        for version in 1..=MIGRATIONS.len() {
            let step = self.call("migrate", move |connection| {
                Ok(migrate_to(&mut connection.client, version)?)
            });
            match step {
                Ok(Migrated::Done) => {}
                Ok(Migrated::TooNew(found)) => {
                    return Err(StoreError::TooNew {
                        location: self.place.location.clone(),
                        found,
                        known: MIGRATIONS.len(),
                    });
                }
                Err(
                    err @ (StoreError::Timeout { .. } | StoreError::Postgres { code: None, .. }),
                ) => {
                    // Not reachable: say so plainly, not as a failed migration.
                    return Err(err);
                }
                Err(err) => {
                    return Err(StoreError::Migrate {
                        location: self.place.location.clone(),
                        version,
                        source: Box::new(err),
                    });
                }
            }
        }
        Ok(())
    }

    /// Documents selected by `query` with no parameters.
    fn documents(
        &self,
        operation: &'static str,
        query: &'static str,
    ) -> Result<Vec<String>, StoreError> {
        self.call(operation, move |connection| {
            Ok(connection.query(query, &[])?.iter().map(|row| row.get(0)).collect())
        })
    }

    /// Documents selected by `query` for a node (`$1`), at most `limit` (`$2`).
    fn documents_of(
        &self,
        operation: &'static str,
        query: &'static str,
        node: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let node = node.to_owned();
        let limit = limit as i64;
        self.call(operation, move |connection| {
            Ok(connection.query(query, &[&node, &limit])?.iter().map(|row| row.get(0)).collect())
        })
    }

    /// Runs the fenced write `statement` (see `sql.rs`) with owned parameters, the
    /// fence last; returns what it wrote (none where it wrote no row).
    fn write(
        &self,
        operation: &'static str,
        statement: &'static str,
        params: Vec<Box<dyn ToSql + Send + Sync>>,
        fence: Fence,
    ) -> Result<Option<i64>, StoreError> {
        self.start_write(operation, statement, params, fence).wait()
    }

    /// Starts [`PostgresStore::write`]; the answer is waited for in [`Pending::wait`].
    fn start_write(
        &self,
        operation: &'static str,
        statement: &'static str,
        params: Vec<Box<dyn ToSql + Send + Sync>>,
        fence: Fence,
    ) -> Pending<Option<i64>> {
        self.start(operation, move |connection| {
            let mut params: Vec<&(dyn ToSql + Sync)> =
                params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
            params.push(&fence);
            connection.fenced(statement, &params, fence)
        })
    }
}

/// Refuses the transaction's write when a newer epoch than `fence` holds the lease; the share
/// lock on the leadership row orders this write against a change of holder (module doc). For a
/// write of several statements; a write of one statement carries the check itself (`sql.rs`).
fn check_fence(tx: &mut postgres::Transaction<'_>, fence: Fence) -> Result<(), CallError> {
    let Some(epoch) = fence else { return Ok(()) };
    let newer: i64 = tx.query_one("SELECT epoch FROM leadership FOR SHARE", &[])?.get(0);
    if newer > epoch {
        return Err(CallError::Fenced { epoch, newer });
    }
    Ok(())
}

fn lease(row: &postgres::Row) -> Lease {
    Lease { holder: row.get(0), epoch: row.get(1), expires_at_ms: row.get(2), expired: row.get(3) }
}

/// Applies migration `version` unless the database has it already; one transaction, under the
/// migration lock.
fn migrate_to(client: &mut Client, version: usize) -> Result<Migrated, postgres::Error> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let found = tx
        .query_opt("SELECT version FROM schema_version", &[])?
        .map(|row| row.get::<_, i32>(0))
        .unwrap_or(0)
        .max(0) as usize;
    if found > MIGRATIONS.len() {
        return Ok(Migrated::TooNew(found));
    }
    if found < version {
        tx.batch_execute(MIGRATIONS[version - 1])?;
        tx.execute("DELETE FROM schema_version", &[])?;
        tx.execute("INSERT INTO schema_version (version) VALUES ($1)", &[&(version as i32)])?;
    }
    tx.commit()?;
    Ok(Migrated::Done)
}

impl StoreBackend for PostgresStore {
    fn location(&self) -> String {
        self.place.location.clone()
    }

    fn schema_version(&self) -> Result<usize, StoreError> {
        self.call("read the schema version", |connection| {
            let row = connection.query_opt("SELECT version FROM schema_version", &[])?;
            Ok(row.map(|row| row.get::<_, i32>(0)).unwrap_or(0).max(0) as usize)
        })
    }

    fn append_event(&self, event: EventRow<'_>, fence: Fence) -> Result<i64, StoreError> {
        let id = self.write(
            "append event",
            APPEND_EVENT,
            vec![
                Box::new(event.at_ms),
                Box::new(event.kind.to_owned()),
                Box::new(event.node.map(str::to_owned)),
                Box::new(event.body.to_owned()),
                Box::new(EVENT_LOCK),
            ],
            fence,
        )?;
        id.ok_or_else(|| self.failure("append event", "the write returned no id".into()))
    }

    fn events(
        &self,
        after: i64,
        node: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let node = node.map(str::to_owned);
        let limit = limit as i64;
        self.call("read events", move |connection| {
            let rows = connection.query(
                "SELECT id, body FROM events WHERE id > $1 AND ($2::TEXT IS NULL OR node = $2)
                 ORDER BY id LIMIT $3",
                &[&after, &node, &limit],
            )?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
    }

    fn newest_event_id(&self) -> Result<i64, StoreError> {
        self.call("read the newest event id", |connection| {
            let row = connection.query_one("SELECT MAX(id) FROM events", &[])?;
            Ok(row.get::<_, Option<i64>>(0).unwrap_or(0))
        })
    }

    fn put_node(
        &self,
        name: &str,
        state: &str,
        body: &str,
        fence: Fence,
    ) -> Result<(), StoreError> {
        self.start_put_node(name, state, body, fence).wait()
    }

    fn start_put_node(&self, name: &str, state: &str, body: &str, fence: Fence) -> Pending<()> {
        let params: Vec<Box<dyn ToSql + Send + Sync>> =
            vec![Box::new(name.to_owned()), Box::new(state.to_owned()), Box::new(body.to_owned())];
        let saving = self.start_write("save node", PUT_NODE, params, fence);
        Pending(Box::new(move || saving.wait().map(drop)))
    }

    fn nodes(&self) -> Result<Vec<String>, StoreError> {
        self.documents("read nodes", "SELECT body FROM nodes ORDER BY name")
    }

    fn insert_workflow(&self, node: &str, body: &str, fence: Fence) -> Result<i64, StoreError> {
        let id = self.write(
            "create workflow",
            INSERT_WORKFLOW,
            vec![Box::new(node.to_owned()), Box::new(body.to_owned())],
            fence,
        )?;
        id.ok_or_else(|| self.failure("create workflow", "the write returned no id".into()))
    }

    fn update_workflow(
        &self,
        id: i64,
        open: bool,
        body: &str,
        fence: Fence,
    ) -> Result<(), StoreError> {
        self.write(
            "update workflow",
            UPDATE_WORKFLOW,
            vec![Box::new(id), Box::new(open), Box::new(body.to_owned())],
            fence,
        )?;
        Ok(())
    }

    fn open_workflows(&self) -> Result<Vec<String>, StoreError> {
        self.documents("read workflows", "SELECT body FROM workflows WHERE open ORDER BY id")
    }

    fn workflows_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        self.documents_of(
            "read workflows",
            "SELECT body FROM workflows WHERE node = $1 ORDER BY id DESC LIMIT $2",
            node,
            limit,
        )
    }

    fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_owned();
        self.call("read setting", move |connection| {
            let row = connection.query_opt("SELECT body FROM settings WHERE key = $1", &[&key])?;
            Ok(row.map(|row| row.get(0)))
        })
    }

    fn put_setting(&self, key: &str, body: &str, fence: Fence) -> Result<(), StoreError> {
        self.write(
            "save setting",
            PUT_SETTING,
            vec![Box::new(key.to_owned()), Box::new(body.to_owned())],
            fence,
        )?;
        Ok(())
    }

    fn put_job(
        &self,
        id: &str,
        seq: u64,
        state: &str,
        body: &str,
        fence: Fence,
    ) -> Result<(), StoreError> {
        self.write(
            "save job",
            PUT_JOB,
            vec![
                Box::new(id.to_owned()),
                Box::new(seq as i64),
                Box::new(state.to_owned()),
                Box::new(body.to_owned()),
            ],
            fence,
        )?;
        Ok(())
    }

    fn jobs(&self) -> Result<Vec<String>, StoreError> {
        self.documents("read jobs", "SELECT body FROM jobs ORDER BY seq")
    }

    fn put_evidence(&self, evidence: EvidenceRow<'_>, fence: Fence) -> Result<(), StoreError> {
        let (workflow, node, command, body, keep) = (
            evidence.workflow,
            evidence.node.to_owned(),
            evidence.command.to_owned(),
            evidence.body.to_owned(),
            evidence.keep as i64,
        );
        self.call("keep evidence", move |connection| {
            let mut tx = connection.client.transaction()?;
            check_fence(&mut tx, fence)?;
            tx.execute(
                "INSERT INTO evidence (workflow, node, command, body) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (command) DO NOTHING",
                &[&workflow, &node, &command, &body],
            )?;
            tx.execute(
                "DELETE FROM evidence WHERE node = $1 AND id NOT IN
                 (SELECT id FROM evidence WHERE node = $1 ORDER BY id DESC LIMIT $2)",
                &[&node, &keep],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    fn evidence_of(&self, node: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        self.documents_of(
            "read evidence",
            "SELECT body FROM evidence WHERE node = $1 ORDER BY id DESC LIMIT $2",
            node,
            limit,
        )
    }

    fn acquire(&self, holder: &str, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let holder = holder.to_owned();
        let ttl_ms = ttl.as_millis() as i64;
        self.call("acquire the lease", move |connection| {
            // Free, lapsed or already ours: taken (a new epoch unless ours and live) or renewed.
            let query = format!(
                "UPDATE leadership SET
                    epoch = CASE WHEN holder = $1 AND expires_at > clock_timestamp()
                            THEN epoch ELSE epoch + 1 END,
                    holder = $1,
                    expires_at = clock_timestamp() + $2::BIGINT * INTERVAL '1 millisecond'
                 WHERE holder IS NULL OR holder = $1 OR expires_at <= clock_timestamp()
                 RETURNING {LEASE_COLUMNS}"
            );
            Ok(connection.client.query_opt(&query, &[&holder, &ttl_ms])?.as_ref().map(lease))
        })
    }

    fn release(&self, holder: &str) -> Result<(), StoreError> {
        let holder = holder.to_owned();
        self.call("release the lease", move |connection| {
            connection.client.execute(
                "UPDATE leadership SET holder = NULL, expires_at = '-infinity' WHERE holder = $1",
                &[&holder],
            )?;
            Ok(())
        })
    }

    fn current(&self) -> Result<Option<Lease>, StoreError> {
        self.call("read the lease", |connection| {
            let query = format!("SELECT {LEASE_COLUMNS} FROM leadership WHERE holder IS NOT NULL");
            Ok(connection.client.query_opt(&query, &[])?.as_ref().map(lease))
        })
    }
}
