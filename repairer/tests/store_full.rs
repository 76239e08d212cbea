//! A store that cannot be written loses nothing and acts on nothing: with the repairer's SQLite
//! store on a real tmpfs filled to the last byte, a fatal finding is decided but not acted on (its
//! decision could not be written), every failed write is counted in
//! `fleetmend_store_errors_total`, and once the disk has room again the drain happens, once. The
//! same holds on PostgreSQL when its server is down: nothing is acted on until it is back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use fleetmend_repairer::model::{EventKind, NodeState};
use fleetmend_repairer::scheduler::SchedulerCall;
use fleetmend_repairer::testing::PostgresCluster;
use support::{Expect, Harness, count, describe, xid};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a tmpfs failed (the test needs root): {status}");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Fills the filesystem at `dir` to its last byte; returns the filler's path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc_enospc()) => break,
            Err(err) => panic!("filling {}: {err}", dir.display()),
        }
    }
    // Smaller writes take the last partial block.
    for size in [4096usize, 512, 1] {
        while file.write(&block[..size]).is_ok_and(|n| n > 0) {}
    }
    path
}

fn libc_enospc() -> i32 {
    nix::errno::Errno::ENOSPC as i32
}

fn store_errors(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("fleetmend_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_that_cannot_be_written_is_not_acted_on_and_happens_once_the_disk_has_room() {
    let uid = Command::new("id").arg("-u").output().expect("running id").stdout;
    let uid = String::from_utf8_lossy(&uid).trim().to_owned();
    assert_eq!(uid, "0", "mounting a tmpfs needs root (scripts/test runs as root)");
    let tmpfs = Tmpfs::mount("8m");
    let store = tmpfs.path().join("repairer.db");
    let h = Harness::start(|config| config.store = store.clone().into()).await;
    let n1 = h.agent("n1");
    n1.start_heartbeat();
    h.wait_state("n1", NodeState::Healthy).await;
    let before = store_errors(&h.metrics().await);
    assert_eq!(before, 0.0, "no store error before the disk is full");

    let filler = fill(tmpfs.path());
    n1.set_findings(vec![xid("79")]);
    // Every report and tick that tries to write fails: the errors are counted...
    h.eventually("store errors counted", async || {
        let errors = store_errors(&h.metrics().await);
        (errors >= 5.0).then_some(errors)
    })
    .await;
    // ...and nothing was acted on: no drain, the node's state unchanged.
    let drains = |calls: Vec<SchedulerCall>| {
        calls.into_iter().filter(|c| matches!(c, SchedulerCall::Drain { .. })).count()
    };
    assert_eq!(drains(h.scheduler.calls()), 0, "drained although its decision was not written");
    assert_eq!(h.state("n1").await, Some(NodeState::Healthy));

    // Room again: the decision is written and carried out, once.
    std::fs::remove_file(&filler).unwrap();
    h.wait_event(Some("n1"), &Expect::transition("n1", NodeState::Healthy, NodeState::Draining))
        .await;
    h.eventually("the drain", async || (drains(h.scheduler.calls()) >= 1).then_some(())).await;
    let events = h.events_of("n1").await;
    assert_eq!(
        count(&events, &Expect::kind(EventKind::Decision).node("n1")),
        1,
        "one decision, written once: {}",
        describe(&events)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_that_cannot_be_written_to_postgres_is_not_acted_on_until_the_server_is_back() {
    let Some(cluster) = PostgresCluster::start() else { return };
    let url = cluster.fresh_database();
    let h = Harness::start(|config| config.store = url.parse().unwrap()).await;
    let n1 = h.agent("n1");
    n1.start_heartbeat();
    h.wait_state("n1", NodeState::Healthy).await;
    assert_eq!(store_errors(&h.metrics().await), 0.0, "no store error while the server is up");

    cluster.stop();
    n1.set_findings(vec![xid("79")]);
    h.eventually("store errors counted", async || {
        let errors = store_errors(&h.metrics().await);
        (errors >= 5.0).then_some(errors)
    })
    .await;
    let drains = |calls: Vec<SchedulerCall>| {
        calls.into_iter().filter(|c| matches!(c, SchedulerCall::Drain { .. })).count()
    };
    assert_eq!(drains(h.scheduler.calls()), 0, "drained although its decision was not written");
    assert_eq!(h.state("n1").await, Some(NodeState::Healthy));

    cluster.restart();
    h.wait_event(Some("n1"), &Expect::transition("n1", NodeState::Healthy, NodeState::Draining))
        .await;
    h.eventually("the drain", async || (drains(h.scheduler.calls()) >= 1).then_some(())).await;
    let events = h.events_of("n1").await;
    assert_eq!(
        count(&events, &Expect::kind(EventKind::Decision).node("n1")),
        1,
        "one decision, written once: {}",
        describe(&events)
    );
}
