//! A real PostgreSQL for tests: a throwaway cluster (initdb into a temporary folder, a server on a
//! free loopback port with its socket in that folder), a database per test, stopped and removed
//! when dropped. Used by the store's own tests and by the system tests (feature `testing`).
//!
//! Without PostgreSQL installed (`/usr/lib/postgresql/*/bin/initdb`), [`PostgresCluster::start`]
//! returns `None` after printing why, and the test skips; with `FLEETMEND_REQUIRE_POSTGRES=1`
//! (scripts/test installs PostgreSQL and sets it) a missing PostgreSQL fails the test instead.
//! PostgreSQL refuses to run as root: as root, every server command runs as the `postgres` user.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::postgres_server::PostgresServer;

/// A running PostgreSQL cluster, stopped and removed at drop.
#[derive(Debug)]
pub struct PostgresCluster {
    server: PostgresServer,
    /// Holds the cluster's folder; removed after the server stopped (field order: dropped last).
    _dir: tempfile::TempDir,
}

pub use crate::postgres_server::postgres_bin;

impl PostgresCluster {
    /// Starts a cluster, or returns `None` (printing why) where PostgreSQL is not installed and
    /// not required.
    pub fn start() -> Option<PostgresCluster> {
        PostgresCluster::start_listening_also(None)
    }

    /// [`PostgresCluster::start`], listening on `also` too (an address and the CIDR block of the
    /// clients it trusts there; see [`PostgresServer::listen_also`]).
    pub fn start_listening_also(also: Option<(std::net::IpAddr, &str)>) -> Option<PostgresCluster> {
        if postgres_bin().is_none() {
            assert!(
                std::env::var_os("FLEETMEND_REQUIRE_POSTGRES").is_none(),
                "FLEETMEND_REQUIRE_POSTGRES is set but PostgreSQL is not installed \
                 (apt-get install postgresql)"
            );
            println!("SKIPPED: PostgreSQL is not installed (apt-get install postgresql)");
            return None;
        }
        let dir = tempfile::Builder::new().prefix("fleetmend-pg").tempdir().expect("temp dir");
        let mut server = PostgresServer::init(dir.path()).expect("initdb");
        if let Some((address, clients)) = also {
            server.listen_also(address, clients).expect("add a listen address");
        }
        if let Err(err) = server.start() {
            panic!("PostgreSQL did not start: {err}");
        }
        Some(PostgresCluster { server, _dir: dir })
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Creates database `name` and returns its URL.
    pub fn database(&self, name: &str) -> String {
        self.server.database(name).unwrap_or_else(|err| panic!("createdb {name}: {err}"))
    }

    /// A database with a name no other call in this process got.
    pub fn fresh_database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        self.database(&format!("fleetmend_{}", NEXT.fetch_add(1, Ordering::Relaxed)))
    }

    /// The URL of database `name` (trust authentication on loopback).
    pub fn url(&self, name: &str) -> String {
        self.server.url(name)
    }

    /// Stops the server (fast shutdown: sessions are ended).
    pub fn stop(&self) {
        if let Err(err) = self.server.stop_mode("fast") {
            panic!("stopping PostgreSQL: {err}");
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&self) {
        if let Err(err) = self.server.restart() {
            panic!("PostgreSQL did not start again: {err}: {}", self.server_log());
        }
    }

    /// The server's log (for failure messages).
    pub fn server_log(&self) -> String {
        self.server.server_log()
    }
}

impl Drop for PostgresCluster {
    fn drop(&mut self) {
        if let Err(err) = self.server.stop_mode("immediate") {
            eprintln!("stopping the test PostgreSQL: {err}");
        }
    }
}
