//! The store's behaviour on both backends: each test runs on SQLite and, where PostgreSQL is
//! installed (required under `FLEETMEND_REQUIRE_POSTGRES=1`), on a real PostgreSQL.

use std::time::{Duration, Instant};

use super::*;
use crate::model::{Actor, EventKind, Severity};
use crate::testing::PostgresCluster;

fn event(node: &str, reason: &str) -> Event {
    Event::new(EventKind::NodeJoined, Severity::Info, Some(node), Actor::repairer(), reason, 1)
}

fn postgres(url: &str, timeouts: PostgresTimeouts) -> Result<Store, StoreError> {
    let location = PostgresLocation::parse(url).unwrap();
    Ok(Store::from_backend(PostgresStore::open(&location, timeouts)?))
}

/// Runs `test` on a fresh SQLite store, then on a fresh PostgreSQL database where there is one.
/// `reopen` opens the same store again (a restarted repairer).
fn on_each_backend(test: impl Fn(&dyn Fn() -> Store)) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    test(&|| Store::open(&path).unwrap());
    if let Some(cluster) = PostgresCluster::start() {
        let url = cluster.fresh_database();
        test(&|| postgres(&url, PostgresTimeouts::default()).unwrap());
    }
}

#[test]
fn migrates_once_and_survives_reopen() {
    on_each_backend(|open| {
        let store = open();
        assert!(store.schema_version().unwrap() >= 1);
        assert_eq!(store.newest_event_id().unwrap(), 0);
        assert_eq!(store.append_event(&event("n1", "first report")).unwrap(), 1);
        drop(store);
        let store = open();
        let events = store.events(0, None, 10).unwrap();
        assert_eq!(events.len(), 1, "{}", store.location());
        assert_eq!(events[0].id, 1);
        assert_eq!(events[0].reason, "first report");
        assert!(store.events(0, Some("n2"), 10).unwrap().is_empty());
    });
}

#[test]
fn events_page_by_id_and_node() {
    on_each_backend(|open| {
        let store = open();
        let mut ids = Vec::new();
        for i in 0..6 {
            let node = if i % 2 == 0 { "n1" } else { "n2" };
            ids.push(store.append_event(&event(node, &format!("e{i}"))).unwrap());
        }
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
        assert_eq!(store.newest_event_id().unwrap(), ids[5]);
        let page: Vec<String> =
            store.events(ids[1], None, 2).unwrap().into_iter().map(|e| e.reason).collect();
        assert_eq!(page, ["e2", "e3"]);
        let n2: Vec<String> =
            store.events(0, Some("n2"), 10).unwrap().into_iter().map(|e| e.reason).collect();
        assert_eq!(n2, ["e1", "e3", "e5"]);
    });
}

#[test]
fn nodes_and_settings_are_saved_and_replaced() {
    on_each_backend(|open| {
        let store = open();
        store.put_node("n2", "healthy", &serde_json::json!({"name": "n2"})).unwrap();
        store.put_node("n1", "healthy", &serde_json::json!({"name": "n1"})).unwrap();
        store.put_node("n1", "draining", &serde_json::json!({"name": "n1", "d": true})).unwrap();
        let nodes: Vec<serde_json::Value> = store.nodes().unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0]["d"], true);
        assert_eq!(store.setting::<i64>("k").unwrap(), None);
        store.put_setting("k", &1).unwrap();
        store.put_setting("k", &2).unwrap();
        assert_eq!(store.setting::<i64>("k").unwrap(), Some(2));
    });
}

#[test]
fn node_saves_started_in_order_are_made_in_order_whenever_they_are_waited_for() {
    on_each_backend(|open| {
        let store = open();
        let saves: Vec<Pending<()>> = (0..50)
            .map(|i| store.start_put_node("n1", "healthy", &serde_json::json!({"i": i})))
            .collect();
        // Waited for newest first: the order they are made in is the order they were started.
        for save in saves.into_iter().rev() {
            save.wait().unwrap();
        }
        let nodes: Vec<serde_json::Value> = store.nodes().unwrap();
        assert_eq!(nodes, [serde_json::json!({"i": 49})]);
        // One started and never waited for is made all the same.
        drop(store.start_put_node("n2", "healthy", &serde_json::json!({"i": 0})));
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.nodes::<serde_json::Value>().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "the dropped save was not made");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A standby's gate refuses it before it reaches the store.
        store.close_writes();
        let refused = store.start_put_node("n3", "healthy", &serde_json::json!({})).wait();
        assert!(matches!(refused, Err(StoreError::NotLeader { .. })), "{refused:?}");
    });
}

#[test]
fn jobs_are_saved_in_submission_order() {
    on_each_backend(|open| {
        let store = open();
        store.put_job("j-2", 2, "queued", &serde_json::json!({"id": "j-2"})).unwrap();
        store.put_job("j-1", 1, "running", &serde_json::json!({"id": "j-1"})).unwrap();
        store
            .put_job("j-1", 1, "completed", &serde_json::json!({"id": "j-1", "done": true}))
            .unwrap();
        let jobs: Vec<serde_json::Value> = store.jobs().unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0]["id"], "j-1");
        assert_eq!(jobs[0]["done"], true);
    });
}

#[test]
fn evidence_is_kept_once_and_the_newest_per_node() {
    on_each_backend(|open| {
        let store = open();
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
    });
}

#[test]
fn workflows_open_and_close() {
    on_each_backend(|open| {
        let store = open();
        let id = store.insert_workflow("n1", &serde_json::json!({"step": "drain"})).unwrap();
        let open_now: Vec<serde_json::Value> = store.open_workflows().unwrap();
        assert_eq!(open_now.len(), 1);
        store.update_workflow(id, false, &serde_json::json!({"step": "done"})).unwrap();
        assert!(store.open_workflows::<serde_json::Value>().unwrap().is_empty());
        let history: Vec<serde_json::Value> = store.workflows_of("n1", 5).unwrap();
        assert_eq!(history[0]["step"], "done");
    });
}

/// A plain client on the test's own thread, for what the store does not expose.
fn admin(url: &str) -> ::postgres::Client {
    ::postgres::Client::connect(url, ::postgres::NoTls).unwrap()
}

#[test]
fn postgres_migrates_an_empty_database_and_refuses_a_newer_schema() {
    let Some(cluster) = PostgresCluster::start() else { return };
    let url = cluster.fresh_database();
    let store = postgres(&url, PostgresTimeouts::default()).unwrap();
    let version = store.schema_version().unwrap();
    assert!(version >= 1);
    drop(store);
    let mut client = admin(&url);
    let tables: Vec<String> = client
        .query("SELECT tablename::TEXT FROM pg_tables WHERE schemaname = 'public' ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    for table in [
        "events",
        "evidence",
        "jobs",
        "leadership",
        "nodes",
        "schema_version",
        "settings",
        "workflows",
    ] {
        assert!(tables.iter().any(|t| t == table), "{table} missing from {tables:?}");
    }
    // Opening again migrates nothing.
    drop(postgres(&url, PostgresTimeouts::default()).unwrap());
    let rows = client.query("SELECT version FROM schema_version", &[]).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i32>(0) as usize, version);
    client.execute("UPDATE schema_version SET version = 999", &[]).unwrap();
    let err = postgres(&url, PostgresTimeouts::default()).unwrap_err();
    assert!(matches!(err, StoreError::TooNew { found: 999, .. }), "{err}");
}

#[test]
fn postgres_reconnects_after_the_server_restarts() {
    let Some(cluster) = PostgresCluster::start() else { return };
    let url = cluster.fresh_database();
    let timeouts =
        PostgresTimeouts { connect: Duration::from_secs(2), statement: Duration::from_secs(2) };
    let store = postgres(&url, timeouts).unwrap();
    let first = store.append_event(&event("n1", "before")).unwrap();

    cluster.stop();
    let started = Instant::now();
    let err = store.append_event(&event("n1", "during")).unwrap_err();
    assert!(
        matches!(err, StoreError::Postgres { .. } | StoreError::Timeout { .. }),
        "a clear error during the outage: {err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "failed within its deadline");
    assert!(err.to_string().contains("append event"), "names the operation: {err}");

    cluster.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        match store.append_event(&event("n1", "after")) {
            Ok(id) => break id,
            Err(err) if Instant::now() < deadline => {
                eprintln!("not yet: {err}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(err) => panic!("no reconnect within 30 s: {err}"),
        }
    };
    assert!(after > first);
    let reasons: Vec<String> =
        store.events(0, None, 10).unwrap().into_iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["before", "after"], "nothing of the failed call was written");
}

#[test]
fn postgres_bounds_a_statement_and_writes_nothing_of_it() {
    let Some(cluster) = PostgresCluster::start() else { return };
    let url = cluster.fresh_database();
    let timeouts =
        PostgresTimeouts { connect: Duration::from_secs(2), statement: Duration::from_millis(300) };
    let store = postgres(&url, timeouts).unwrap();
    store.append_event(&event("n1", "before")).unwrap();

    // Another session holds the events table: the append waits on the lock until its timeout.
    let mut blocker = admin(&url);
    let mut tx = blocker.transaction().unwrap();
    tx.batch_execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE").unwrap();
    let started = Instant::now();
    let err = store.append_event(&event("n1", "blocked")).unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(&err, StoreError::Postgres { code: Some(code), .. } if code == "57014"),
        "a statement timeout: {err:?}"
    );
    assert!(waited < Duration::from_secs(3), "bounded by the statement timeout: {waited:?}");
    tx.rollback().unwrap();

    store.append_event(&event("n1", "after")).unwrap();
    let reasons: Vec<String> =
        store.events(0, None, 10).unwrap().into_iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["before", "after"]);
}

#[test]
fn postgres_keeps_the_password_out_of_errors() {
    let secret = "hunter2-not-for-logs";
    // Nothing listens on port 1: the connection fails.
    let url = format!("postgres://fleetmend:{secret}@127.0.0.1:1/fleet");
    let timeouts =
        PostgresTimeouts { connect: Duration::from_secs(2), statement: Duration::from_secs(2) };
    let err = postgres(&url, timeouts).unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("postgres://fleetmend@127.0.0.1:1/fleet"), "names where: {shown}");
    let location: StoreLocation = url.parse().unwrap();
    assert!(!format!("{location} {location:?}").contains(secret));
}

#[test]
fn postgres_event_ids_commit_in_order_under_concurrent_writers() {
    let Some(cluster) = PostgresCluster::start() else { return };
    let url = cluster.fresh_database();
    const WRITERS: usize = 3;
    const EACH: usize = 100;
    let reader = postgres(&url, PostgresTimeouts::default()).unwrap();
    let writers: Vec<Store> =
        (0..WRITERS).map(|_| postgres(&url, PostgresTimeouts::default()).unwrap()).collect();
    let seen = std::thread::scope(|scope| {
        for (w, store) in writers.iter().enumerate() {
            scope.spawn(move || {
                for i in 0..EACH {
                    store.append_event(&event("n1", &format!("w{w}-{i}"))).unwrap();
                }
            });
        }
        // A reader paging by id, as the outbox does, must see every event exactly once.
        let mut cursor = 0;
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.len() < WRITERS * EACH {
            assert!(Instant::now() < deadline, "saw {} events", seen.len());
            let page = reader.events(cursor, None, 7).unwrap();
            if page.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
            for event in page {
                cursor = event.id;
                seen.push(event.reason);
            }
        }
        seen
    });
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), WRITERS * EACH, "no event skipped or seen twice");
}

/// Polls until the database says the lease lapsed (its clock, not ours).
fn wait_lapsed(store: &Store) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.current_lease().unwrap().is_some_and(|lease| lease.expired) {
        assert!(Instant::now() < deadline, "the lease did not lapse");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn postgres_lease_passes_on_expiry_and_fences_the_old_holder() {
    let Some(cluster) = PostgresCluster::start() else { return };
    let url = cluster.fresh_database();
    let a = postgres(&url, PostgresTimeouts::default()).unwrap();
    let b = postgres(&url, PostgresTimeouts::default()).unwrap();
    assert_eq!(a.current_lease().unwrap(), None);

    let first = a.acquire("a", Duration::from_millis(500)).unwrap().expect("a free lease");
    assert_eq!((first.holder.as_str(), first.epoch, first.expired), ("a", 1, false));
    assert_eq!(a.fence(), Some(1));
    assert_eq!(b.acquire("b", Duration::from_secs(60)).unwrap(), None, "a holds it");
    let renewed = a.acquire("a", Duration::from_millis(500)).unwrap().unwrap();
    assert_eq!(renewed.epoch, 1, "renewing keeps the epoch");
    assert!(renewed.expires_at_ms >= first.expires_at_ms);
    a.append_event(&event("n1", "by a")).unwrap();

    wait_lapsed(&a);
    let second = b.acquire("b", Duration::from_secs(60)).unwrap().expect("a lapsed lease");
    assert_eq!((second.holder.as_str(), second.epoch), ("b", 2));
    assert_eq!(a.current_lease().unwrap().map(|l| l.holder), Some("b".to_owned()));

    // Every write of a's that records or starts an action is refused, and nothing of it stored.
    // Each write is let through a's own gate (as a leader's that has not yet seen its lease
    // lapse would), so that the database's fence is what refuses it; each refusal closes the gate.
    let far = || Instant::now() + Duration::from_secs(60);
    let fenced = |write: &dyn Fn() -> Result<(), StoreError>| {
        a.allow_writes_until(far());
        match write() {
            Err(StoreError::Fenced { epoch: 1, newer: 2, .. }) => {}
            other => panic!("not fenced: {other:?}"),
        }
        assert!(!a.writes_open(), "a fenced write closes the gate");
    };
    let doc = serde_json::json!({"by": "a"});
    fenced(&|| a.append_event(&event("n1", "stale")).map(drop));
    fenced(&|| a.put_node("n1", "draining", &doc));
    fenced(&|| a.insert_workflow("n1", &doc).map(drop));
    fenced(&|| a.update_workflow(1, false, &doc));
    fenced(&|| a.put_setting("k", &doc));
    fenced(&|| a.put_job("j-1", 1, "queued", &doc));
    fenced(&|| a.put_evidence(1, "n1", "evidence-1-reboot", &doc, 3));
    let closed = a.append_event(&event("n1", "gate closed")).unwrap_err();
    assert!(matches!(closed, StoreError::NotLeader { .. }), "{closed:?}");
    let reasons: Vec<String> =
        b.events(0, None, 10).unwrap().into_iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["by a"]);
    assert!(b.nodes::<serde_json::Value>().unwrap().is_empty());
    assert!(b.open_workflows::<serde_json::Value>().unwrap().is_empty());
    assert_eq!(b.setting::<serde_json::Value>("k").unwrap(), None);
    assert!(b.jobs::<serde_json::Value>().unwrap().is_empty());
    assert!(b.evidence_of::<serde_json::Value>("n1", 10).unwrap().is_empty());
    // Reads still work for the fenced store; the new holder writes.
    assert_eq!(a.events(0, None, 10).unwrap().len(), 1);
    b.append_event(&event("n1", "by b")).unwrap();
    b.put_node("n1", "draining", &serde_json::json!({"by": "b"})).unwrap();

    // Given up, the lease is free: the next holder gets a higher epoch.
    b.release("b").unwrap();
    assert_eq!(b.current_lease().unwrap(), None);
    let third = a.acquire("a", Duration::from_secs(60)).unwrap().expect("a released lease");
    assert_eq!(third.epoch, 3);
    a.allow_writes_until(far());
    a.append_event(&event("n1", "by a again")).unwrap();
    let err = b.append_event(&event("n1", "stale b")).unwrap_err();
    assert!(matches!(err, StoreError::Fenced { epoch: 2, newer: 3, .. }), "{err:?}");
}

#[test]
fn sqlite_lease_is_always_its_own() {
    let store = Store::in_memory().unwrap();
    let lease = store.acquire("only", Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!((lease.holder.as_str(), lease.epoch), ("only", 1));
    assert_eq!(store.acquire("other", Duration::from_secs(10)).unwrap().unwrap().epoch, 1);
    store.append_event(&event("n1", "written")).unwrap();
    store.release("other").unwrap();
    assert_eq!(store.current_lease().unwrap(), None);
}
