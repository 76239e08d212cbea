//! The PostgreSQL store's SQL: the schema's migrations, the advisory lock keys and the fenced
//! writes, each one statement (see the parent module's doc).

/// Schema migrations, applied in order, each once; the index + 1 is the schema version. Append,
/// never edit. The same tables and indexes as the SQLite store's; documents are JSON text.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: audit log, nodes, workflows, settings, the embedded queue's jobs, evidence bundles.
    "CREATE TABLE events (
        id BIGSERIAL PRIMARY KEY,
        at_ms BIGINT NOT NULL,
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
        id BIGSERIAL PRIMARY KEY,
        node TEXT NOT NULL,
        open BOOLEAN NOT NULL,
        body TEXT NOT NULL
     );
     CREATE INDEX workflows_open ON workflows (open, node);
     CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        body TEXT NOT NULL
     );
     CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        seq BIGINT NOT NULL,
        state TEXT NOT NULL,
        body TEXT NOT NULL
     );
     CREATE INDEX jobs_state ON jobs (state, seq);
     CREATE TABLE evidence (
        id BIGSERIAL PRIMARY KEY,
        workflow BIGINT NOT NULL,
        node TEXT NOT NULL,
        command TEXT NOT NULL UNIQUE,
        body TEXT NOT NULL
     );
     CREATE INDEX evidence_node ON evidence (node, id);",
    // 2: the leadership lease, one row; epoch 0 and no holder until someone takes it.
    "CREATE TABLE leadership (
        id BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
        holder TEXT,
        epoch BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
     );
     INSERT INTO leadership (holder, epoch, expires_at) VALUES (NULL, 0, '-infinity');",
];

/// Advisory lock keys (one 64-bit namespace per database): ASCII "fm-migr" and "fm-event".
pub(super) const MIGRATION_LOCK: i64 = 0x0066_6d2d_6d69_6772;
pub(super) const EVENT_LOCK: i64 = 0x666d_2d65_7665_6e74;

/// One statement that writes only while no newer epoch than the fence (the parameter `$fence`;
/// NULL for none) holds the lease, and answers one row: the lease's epoch and the largest `id`
/// the write returned (NULL where it wrote nothing). `lease` reads the leadership row `FOR SHARE`
/// and `allowed` (one row, or none when fenced off) is read before any row is written; the write
/// is the clause `written`, taking its rows `FROM allowed`.
macro_rules! fenced_write {
    ($fence:literal, $write:literal) => {
        concat!(
            "WITH lease AS (SELECT epoch FROM leadership FOR SHARE), ",
            "allowed AS (SELECT WHERE ",
            $fence,
            "::BIGINT IS NULL OR ",
            $fence,
            "::BIGINT >= ALL (SELECT epoch FROM lease)), ",
            "written AS (",
            $write,
            ") SELECT (SELECT max(epoch) FROM lease), (SELECT max(id) FROM written)"
        )
    };
}

/// An event appended; `$5` is [`EVENT_LOCK`], taken after the fence and before the id (module
/// doc), held to the statement's commit.
pub(super) const APPEND_EVENT: &str = fenced_write!(
    "$6",
    "INSERT INTO events (at_ms, kind, node, body)
     SELECT $1::BIGINT, $2::TEXT, $3::TEXT, $4::TEXT
     FROM (SELECT pg_advisory_xact_lock($5::BIGINT) FROM allowed) AS event_lock
     RETURNING id"
);

pub(super) const PUT_NODE: &str = fenced_write!(
    "$4",
    "INSERT INTO nodes (name, state, body) SELECT $1::TEXT, $2::TEXT, $3::TEXT FROM allowed
     ON CONFLICT (name) DO UPDATE SET state = excluded.state, body = excluded.body
     RETURNING 0::BIGINT AS id"
);

pub(super) const INSERT_WORKFLOW: &str = fenced_write!(
    "$3",
    "INSERT INTO workflows (node, open, body) SELECT $1::TEXT, TRUE, $2::TEXT FROM allowed
     RETURNING id"
);

pub(super) const UPDATE_WORKFLOW: &str = fenced_write!(
    "$4",
    "UPDATE workflows SET open = $2::BOOLEAN, body = $3::TEXT FROM allowed
     WHERE id = $1::BIGINT RETURNING id"
);

pub(super) const PUT_SETTING: &str = fenced_write!(
    "$3",
    "INSERT INTO settings (key, body) SELECT $1::TEXT, $2::TEXT FROM allowed
     ON CONFLICT (key) DO UPDATE SET body = excluded.body
     RETURNING 0::BIGINT AS id"
);

pub(super) const PUT_JOB: &str = fenced_write!(
    "$5",
    "INSERT INTO jobs (id, seq, state, body) SELECT $1::TEXT, $2::BIGINT, $3::TEXT, $4::TEXT
     FROM allowed
     ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body
     RETURNING 0::BIGINT AS id"
);

/// The lease columns, expiry in ms since the Unix epoch by the database's clock.
pub(super) const LEASE_COLUMNS: &str = "holder, epoch, (EXTRACT(EPOCH FROM expires_at) * 1000)::BIGINT, \
     expires_at <= clock_timestamp()";
