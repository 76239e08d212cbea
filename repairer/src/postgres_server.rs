//! A PostgreSQL server run by fleetmend itself, from Debian's `postgresql` package
//! (`/usr/lib/postgresql/*/bin`): a cluster in a folder of ours (initdb once), a server on a
//! loopback port with its socket in that folder, trust authentication on loopback. `fleetmend up
//! --repairers N` keeps its repairers' shared store in one; the test harness
//! ([`crate::testing::PostgresCluster`]) runs a throwaway one per test.
//!
//! PostgreSQL refuses to run as root: as root, every server command runs as the `postgres` user
//! (`runuser`), and the folder is given to that user.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one server command (initdb, pg_ctl, createdb) may take on a loaded machine.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

/// How often a start is tried on a new port (a port taken between our probe and the server's bind
/// fails the start).
const START_ATTEMPTS: u32 = 4;

/// Where the installed PostgreSQL is looked for.
const INSTALL_ROOT: &str = "/usr/lib/postgresql";

/// A server command failed, or PostgreSQL is not there.
#[derive(Debug, thiserror::Error)]
pub enum PostgresServerError {
    #[error(
        "PostgreSQL is not installed (no {INSTALL_ROOT}/*/bin/initdb): apt-get install postgresql"
    )]
    NotInstalled,
    #[error("preparing {path}: {source}")]
    Folder { path: PathBuf, source: std::io::Error },
    #[error("{program} failed: {output}")]
    Command { program: String, output: String },
    #[error("{program} did not finish within {seconds} s")]
    Timeout { program: String, seconds: u64 },
    #[error("PostgreSQL did not start ({attempts} attempts); its log: {log}")]
    Start { attempts: u32, log: String },
    #[error("finding a free loopback port: {0}")]
    Port(std::io::Error),
    #[error(
        "PostgreSQL runs as the postgres user, which cannot enter {folder} (mode {mode:o}): \
         keep the cluster under a folder others may enter (e.g. /var/tmp), or chmod o+x {folder}"
    )]
    Unreachable { folder: PathBuf, mode: u32 },
}

/// The newest installed PostgreSQL's bin folder.
pub fn postgres_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(INSTALL_ROOT)
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

/// One PostgreSQL cluster in a folder: `data/` (the cluster), `server.log`, the socket, and the
/// output of each server command (`initdb.out`, `pg_ctl.out`, ...).
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Run server commands as `postgres` (we are root).
    as_postgres: bool,
    /// Addresses it listens on besides loopback ([`PostgresServer::listen_also`]).
    also: Vec<std::net::IpAddr>,
}

impl PostgresServer {
    /// The cluster in `dir` (created, and initialised with initdb, unless it holds one already).
    /// Starts nothing.
    pub fn init(dir: &Path) -> Result<PostgresServer, PostgresServerError> {
        let bin = postgres_bin().ok_or(PostgresServerError::NotInstalled)?;
        let folder = |source| PostgresServerError::Folder { path: dir.to_owned(), source };
        std::fs::create_dir_all(dir).map_err(folder)?;
        let dir = dir.canonicalize().map_err(folder)?;
        let as_postgres = is_root();
        let server = PostgresServer { bin, dir, port: 0, as_postgres, also: Vec::new() };
        if as_postgres {
            reachable_by_others(&server.dir)?;
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres:postgres"]).arg(&server.dir);
            run_to_file(chown, "chown", &server.dir.join("chown.out"), COMMAND_DEADLINE)?;
        }
        if !server.data().join("PG_VERSION").exists() {
            let data = server.data().display().to_string();
            server.server_command(
                "initdb",
                &["-D", &data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
            )?;
        }
        Ok(server)
    }

    /// Starts the server on a free loopback port (stopping first one a killed owner left running
    /// on this cluster).
    pub fn start(&mut self) -> Result<(), PostgresServerError> {
        if self.data().join("postmaster.pid").exists() {
            // Left by an owner that was killed: stopped, so it comes back on a port we know.
            let _ = self.stop_mode("immediate");
        }
        for _ in 0..START_ATTEMPTS {
            self.port = free_port()?;
            if self.start_on_port().is_ok() {
                return Ok(());
            }
        }
        Err(PostgresServerError::Start { attempts: START_ATTEMPTS, log: self.server_log_tail() })
    }

    /// Starts the server again on the port it had.
    pub fn restart(&self) -> Result<(), PostgresServerError> {
        self.start_on_port()
    }

    /// Listens on `address` too from the next start, trusting clients from `clients` (a CIDR
    /// block, e.g. `10.0.0.0/24`): for repairers in other network namespaces.
    pub fn listen_also(
        &mut self,
        address: std::net::IpAddr,
        clients: &str,
    ) -> Result<(), PostgresServerError> {
        let hba = self.data().join("pg_hba.conf");
        let folder = |source| PostgresServerError::Folder { path: hba.clone(), source };
        let mut text = std::fs::read_to_string(&hba).map_err(folder)?;
        let line = format!("host all all {clients} trust\n");
        if !text.contains(&line) {
            text.push_str(&line);
            std::fs::write(&hba, text).map_err(folder)?;
        }
        self.also.push(address);
        Ok(())
    }

    fn start_on_port(&self) -> Result<(), PostgresServerError> {
        let listen: Vec<String> = std::iter::once("127.0.0.1".to_owned())
            .chain(self.also.iter().map(ToString::to_string))
            .collect();
        let options = format!(
            "-p {} -k {} -c listen_addresses={} -c fsync=off -c max_connections=100",
            self.port,
            self.dir.display(),
            listen.join(",")
        );
        let log = self.dir.join("server.log").display().to_string();
        let data = self.data().display().to_string();
        self.server_command(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "-t", "30", "start"],
        )
    }

    /// The port it listens on (0 before [`PostgresServer::start`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates database `name` unless it exists; its URL.
    pub fn database(&self, name: &str) -> Result<String, PostgresServerError> {
        let port = self.port.to_string();
        let mut command = Command::new(self.bin.join("createdb"));
        command.args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", name]);
        let out = self.dir.join(format!("createdb-{name}.out"));
        match run_to_file(command, "createdb", &out, COMMAND_DEADLINE) {
            Ok(()) => {}
            Err(PostgresServerError::Command { output, .. })
                if output.contains("already exists") => {}
            Err(err) => return Err(err),
        }
        Ok(self.url(name))
    }

    /// The URL of database `name` (trust authentication on loopback).
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Stops the server: `fast` ends the sessions and shuts down cleanly, `immediate` does not
    /// wait for them (the next start recovers).
    pub fn stop_mode(&self, mode: &str) -> Result<(), PostgresServerError> {
        let data = self.data().display().to_string();
        self.server_command("pg_ctl", &["-D", &data, "-m", mode, "-w", "-t", "30", "stop"])
    }

    /// The server's log.
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn server_log_tail(&self) -> String {
        let log = self.server_log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
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
        command.args(args).current_dir(&self.dir);
        command
    }

    fn server_command(&self, program: &str, args: &[&str]) -> Result<(), PostgresServerError> {
        let out = self.dir.join(format!("{program}.out"));
        run_to_file(self.command(program, args), program, &out, COMMAND_DEADLINE)
    }
}

/// Every folder above `dir` lets others (the `postgres` user) pass through it.
fn reachable_by_others(dir: &Path) -> Result<(), PostgresServerError> {
    use std::os::unix::fs::PermissionsExt;
    for folder in dir.ancestors().skip(1) {
        let Ok(metadata) = std::fs::metadata(folder) else { continue };
        let mode = metadata.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            return Err(PostgresServerError::Unreachable { folder: folder.to_owned(), mode });
        }
    }
    Ok(())
}

fn free_port() -> Result<u16, PostgresServerError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(PostgresServerError::Port)?;
    Ok(listener.local_addr().map_err(PostgresServerError::Port)?.port())
}

/// Runs `command` with its output in the file `out`, killed past `deadline`. A file, not a pipe:
/// the server pg_ctl starts keeps the descriptors it inherited open, and a pipe would never end.
fn run_to_file(
    mut command: Command,
    program: &str,
    out: &Path,
    deadline: Duration,
) -> Result<(), PostgresServerError> {
    let io = |source| PostgresServerError::Folder { path: out.to_owned(), source };
    let file = File::create(out).map_err(io)?;
    let err = file.try_clone().map_err(io)?;
    let failed =
        |output: String| PostgresServerError::Command { program: program.to_owned(), output };
    // A group of its own: a terminal's Ctrl-C meant for our process does not reach the server
    // (its owner stops it, in order).
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| failed(format!("starting it: {e}")))?;
    let until = Instant::now() + deadline;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let output = std::fs::read_to_string(out).unwrap_or_default();
                return Err(failed(format!("{status}: {}", output.trim())));
            }
            Ok(None) => {}
            Err(e) => return Err(failed(format!("waiting for it: {e}"))),
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            return Err(PostgresServerError::Timeout {
                program: program.to_owned(),
                seconds: deadline.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
