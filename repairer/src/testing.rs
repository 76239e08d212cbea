//! A real PostgreSQL for tests: a throwaway cluster (initdb into a temporary folder, a server on a
//! free loopback port with its socket in that folder), a database per test, stopped and removed
//! when dropped. Used by the store's own tests and by the system tests (feature `testing`).
//!
//! Without PostgreSQL installed (`/usr/lib/postgresql/*/bin/initdb`), [`PostgresCluster::start`]
//! returns `None` after printing why, and the test skips; with `FLEETMEND_REQUIRE_POSTGRES=1`
//! (scripts/test installs PostgreSQL and sets it) a missing PostgreSQL fails the test instead.
//! PostgreSQL refuses to run as root: as root, every server command runs as the `postgres` user.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long one server command (initdb, pg_ctl, createdb) may take on a loaded machine.
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

/// A running PostgreSQL cluster, stopped and removed at drop.
#[derive(Debug)]
pub struct PostgresCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// Run server commands as `postgres` (we are root).
    as_postgres: bool,
}

/// The newest installed PostgreSQL's bin folder.
pub fn postgres_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// Whether we run as root (`/proc/self` belongs to the process's effective user).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

impl PostgresCluster {
    /// Starts a cluster, or returns `None` (printing why) where PostgreSQL is not installed and
    /// not required.
    pub fn start() -> Option<PostgresCluster> {
        let Some(bin) = postgres_bin() else {
            assert!(
                std::env::var_os("FLEETMEND_REQUIRE_POSTGRES").is_none(),
                "FLEETMEND_REQUIRE_POSTGRES is set but PostgreSQL is not installed \
                 (apt-get install postgresql)"
            );
            println!("SKIPPED: PostgreSQL is not installed (apt-get install postgresql)");
            return None;
        };
        let as_postgres = is_root();
        let dir = tempfile::Builder::new().prefix("fleetmend-pg").tempdir().expect("temp dir");
        if as_postgres {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("running chown");
            assert!(status.success(), "chown postgres {}: {status}", dir.path().display());
        }
        let mut cluster = PostgresCluster { bin, dir, port: 0, as_postgres };
        let data = cluster.data();
        cluster.server_command(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
        );
        // A port taken between our probe and the server's bind fails the start: try again.
        for attempt in 0.. {
            cluster.port = free_port();
            if cluster.try_start() {
                break;
            }
            assert!(attempt < 3, "PostgreSQL did not start: {}", cluster.server_log());
        }
        Some(cluster)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates database `name` and returns its URL.
    pub fn database(&self, name: &str) -> String {
        let port = self.port.to_string();
        let createdb = self.bin.join("createdb");
        let mut command = Command::new(&createdb);
        command.args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", name]);
        run(command, &self.dir.path().join(format!("createdb-{name}.out")), COMMAND_DEADLINE);
        self.url(name)
    }

    /// A database with a name no other call in this process got.
    pub fn fresh_database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        self.database(&format!("fleetmend_{}", NEXT.fetch_add(1, Ordering::Relaxed)))
    }

    /// The URL of database `name` (trust authentication on loopback).
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Stops the server (fast shutdown: sessions are ended).
    pub fn stop(&self) {
        let data = self.data();
        self.server_command("pg_ctl", &["-D", &data, "-m", "fast", "-w", "-t", "30", "stop"]);
    }

    /// Starts the server again on the same port.
    pub fn restart(&self) {
        assert!(self.try_start(), "PostgreSQL did not start again: {}", self.server_log());
    }

    /// The server's log (for failure messages).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn try_start(&self) -> bool {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        let data = self.data();
        self.try_server_command(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "-t", "30", "start"],
        )
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        command.args(args).current_dir(self.dir.path());
        command
    }

    fn server_command(&self, program: &str, args: &[&str]) {
        assert!(self.try_server_command(program, args), "{program} failed: {}", self.server_log());
    }

    fn try_server_command(&self, program: &str, args: &[&str]) -> bool {
        let out = self.dir.path().join(format!("{program}.out"));
        let ok = try_run(self.command(program, args), &out, COMMAND_DEADLINE);
        if !ok {
            eprintln!("{program}: {}", std::fs::read_to_string(&out).unwrap_or_default());
        }
        ok
    }
}

impl Drop for PostgresCluster {
    fn drop(&mut self) {
        let data = self.data();
        let out = self.dir.path().join("pg_ctl-stop.out");
        try_run(
            self.command("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "-t", "30", "stop"]),
            &out,
            COMMAND_DEADLINE,
        );
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

fn run(command: Command, out: &Path, deadline: Duration) {
    let program = format!("{command:?}");
    assert!(
        try_run(command, out, deadline),
        "{program} failed: {}",
        std::fs::read_to_string(out).unwrap_or_default()
    );
}

/// Runs `command` with its output in the file `out`, killed past `deadline`; whether it
/// succeeded. (A file, not a pipe: pg_ctl's server keeps inherited descriptors open.)
fn try_run(mut command: Command, out: &Path, deadline: Duration) -> bool {
    let file = File::create(out).expect("create the command's output file");
    let err = file.try_clone().expect("clone the output file");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    let until = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a command") {
            return status.success();
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("{command:?} timed out after {deadline:?}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
