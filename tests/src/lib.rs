//! Helpers for fleetmend's system tests: the real binary, started as a real process, against fixture
//! trees and real components.

// Test support: a failure to set up is a test failure, so panicking here is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod netns;
pub mod slurm;

use std::collections::BTreeSet;
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_owned).unwrap_or_default()
}

/// A fixture case of the agent (`agent/tests/fixtures/<case>`).
pub fn fixture(case: &str) -> PathBuf {
    workspace_root().join("agent/tests/fixtures").join(case)
}

/// The `fleetmend` binary: `$FLEETMEND_BIN`, else the one cargo built next to this test.
///
/// The test command builds it first (`cargo build --bin fleetmend`); a missing binary is a clear
/// failure, not a skip.
pub fn fleetmend_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("FLEETMEND_BIN") {
        return PathBuf::from(path);
    }
    // target/<profile>/deps/<test binary> → target/<profile>/fleetmend
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe.parent().and_then(Path::parent).map(Path::to_owned).unwrap_or_default();
    let bin = profile_dir.join("fleetmend");
    assert!(
        bin.exists(),
        "{} does not exist: build it first with `cargo build --bin fleetmend` (same profile) or set FLEETMEND_BIN",
        bin.display()
    );
    bin
}

/// A free TCP port on 127.0.0.1 (bound then released; fine for tests that start a server on it at
/// once).
/// The Python with torch that `scripts/test` installs (`FLEETMEND_TORCH_PYTHON`, else
/// `~/.cache/fleetmend-torch/bin/python`); the torch tests are never skipped for its absence.
pub fn torch_python() -> PathBuf {
    let path = std::env::var_os("FLEETMEND_TORCH_PYTHON").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/fleetmend-torch/bin/python")
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "no Python with torch at {} (scripts/test installs it; or set FLEETMEND_TORCH_PYTHON)",
        path.display()
    );
    path
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn poll_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
pub struct Running {
    pub child: Child,
    pub stderr_path: PathBuf,
}

impl Running {
    /// What the process wrote to stderr so far (for failure messages).
    pub fn stderr(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.stderr_path) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `fleetmend agent ARGS` listening on `listen`, stderr to a file in `dir`, and waits until
/// `/healthz` answers.
pub fn start_agent(dir: &Path, listen: SocketAddr, args: &[&str]) -> Running {
    let stderr_path = dir.join(format!("agent-{}.stderr", listen.port()));
    let stderr = std::fs::File::create(&stderr_path).expect("create stderr file");
    let child = Command::new(fleetmend_bin())
        .arg("agent")
        .arg("--listen")
        .arg(listen.to_string())
        .args(args)
        .env("FLEETMEND_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn fleetmend agent");
    let mut running = Running { child, stderr_path };
    let up = poll_until(Duration::from_secs(20), || {
        if let Ok(Some(status)) = running.child.try_wait() {
            panic!("agent exited early ({status}):\n{}", running.stderr());
        }
        http_get(listen, "/healthz").is_some_and(|(status, _)| status == 200)
    });
    assert!(up, "agent did not answer /healthz within 20 s:\n{}", running.stderr());
    running
}

/// The healthy fixture's host-path flags.
pub fn fixture_flags(case_dir: &Path) -> Vec<String> {
    vec![
        format!("--path.sysfs={}", case_dir.join("sys").display()),
        format!("--path.procfs={}", case_dir.join("proc").display()),
        format!("--path.rootfs={}", case_dir.join("root").display()),
        format!("--kmsg={}", case_dir.join("kmsg").display()),
        format!("--gpu=fixture:{}", case_dir.join("gpu.json").display()),
    ]
}

/// A minimal blocking HTTP/1.1 GET (no client library needed in the tests): status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    read_response(stream)
}

/// Reads a whole `Connection: close` HTTP/1.1 response: status and (de-chunked) body.
fn read_response(mut stream: std::net::TcpStream) -> Option<(u16, String)> {
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Runs a command to completion with a timeout; panics with its output when it cannot be run or
/// outlives `timeout`. Output is drained on threads so a chatty child never blocks on a full pipe.
pub fn run_with_timeout(command: &mut Command, timeout: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("spawn {command:?}: {err}"));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} did not finish within {timeout:?}\nstderr: {}",
                String::from_utf8_lossy(&stderr.join().unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// A minimal blocking HTTP/1.1 POST of a JSON body: status and body, or `None` when the server
/// could not be reached or answered nothing parseable (a test polling a restarting server retries).
pub fn http_post_json(addr: SocketAddr, path: &str, json: &str) -> Option<(u16, String)> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    )
    .ok()?;
    read_response(stream)
}

/// A minimal blocking HTTP/1.1 request with a bearer token: `GET` when `json` is `None`, else a
/// `POST` of it. Status and body, or `None` when the server could not be reached.
pub fn http_with_token(
    addr: SocketAddr,
    path: &str,
    token: &str,
    json: Option<&str>,
) -> Option<(u16, String)> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let (method, body) = match json {
        Some(json) => ("POST", json),
        None => ("GET", ""),
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    read_response(stream)
}

/// Starts `fleetmend repairer --config CONFIG`, stderr to `stderr_path` (appended, so a restarted
/// repairer's log follows the killed one's), and waits until `/healthz` on `listen` answers.
///
/// A port just freed by a killed repairer can take a moment to bind again: a start that exits
/// early is retried until `timeout`.
pub fn start_repairer(
    config: &Path,
    listen: SocketAddr,
    stderr_path: &Path,
    timeout: Duration,
) -> Running {
    start_repairer_in(None, config, listen, stderr_path, timeout)
}

/// [`start_repairer`] inside network namespace `netns` (`ip netns exec`, which becomes the
/// repairer: its pid and exit status are the repairer's), or in this one.
pub fn start_repairer_in(
    netns: Option<&str>,
    config: &Path,
    listen: SocketAddr,
    stderr_path: &Path,
    timeout: Duration,
) -> Running {
    let deadline = Instant::now() + timeout;
    loop {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stderr_path)
            .expect("open the repairer's stderr file");
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]).arg(fleetmend_bin());
                command
            }
            None => Command::new(fleetmend_bin()),
        };
        let child = command
            .arg("repairer")
            .arg("--config")
            .arg(config)
            .env("FLEETMEND_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn fleetmend repairer");
        let mut running = Running { child, stderr_path: stderr_path.to_owned() };
        let mut exited = None;
        let up = poll_until(deadline.saturating_duration_since(Instant::now()), || {
            if let Ok(Some(status)) = running.child.try_wait() {
                exited = Some(status);
                return true;
            }
            http_get(listen, "/healthz").is_some_and(|(status, _)| status == 200)
        });
        match exited {
            None if up => return running,
            None => panic!(
                "repairer did not answer /healthz on {listen} within {timeout:?}:\n{}",
                running.stderr()
            ),
            Some(status) if Instant::now() >= deadline => {
                panic!("repairer exited ({status}) and did not start again:\n{}", running.stderr())
            }
            Some(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A repairer of its own in `dir`: `dir/repairer.toml` holds a free loopback `listen`, a store in
/// `dir` and `settings` (TOML: top-level keys first, then tables); stderr goes to
/// `dir/repairer.stderr`. Returns its address and the process, up and answering.
pub fn repairer_in(dir: &Path, settings: &str) -> (SocketAddr, Running) {
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.join("repairer.toml");
    let store = serde_json::to_string(&dir.join("repairer.db").display().to_string())
        .expect("a path serialises");
    std::fs::write(&config, format!("listen = \"{listen}\"\nstore = {store}\n{settings}"))
        .expect("write the repairer's config");
    let running =
        start_repairer(&config, listen, &dir.join("repairer.stderr"), Duration::from_secs(20));
    (listen, running)
}

/// [`poll_until`] for async tests: polls `condition` every 20 ms without blocking the runtime,
/// until it holds or `limit` passes.
pub async fn poll_until_async(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every `fleetmend_[a-z0-9_]+` in `text` (metric names; recording rules are `fleetmend:...`).
pub fn metric_names(text: &str) -> BTreeSet<String> {
    const PREFIX: &str = "fleetmend_";
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find(PREFIX) {
        // Part of a longer identifier (e.g. `x_fleetmend_y`): not a name of ours.
        let preceded = text.len() - rest.len() + start;
        let inside_word = text[..preceded]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !inside_word {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The weights hash `ranks` ranks of `argv` (a `fleetmend train` command) end with when nothing
/// interrupts them: the scenario runner's reference run, in `dir`.
pub fn uninterrupted_hash(dir: &Path, argv: Vec<String>, ranks: u32, timeout: Duration) -> String {
    let spec = fleetmend_repairer::queue::JobSpec {
        name: None,
        argv,
        nodes: ranks,
        priority: 0,
        checkpoint_dir: dir.join("checkpoints").display().to_string(),
        max_restarts: 0,
        checkpoint_every: None,
        env: Default::default(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime
        .block_on(fleetmend_local::scenario::uninterrupted_hash("reference", &spec, dir, timeout))
        .unwrap()
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

/// `fleetmend up` as a child process, stdout (not a terminal) and stderr in files under a
/// directory. Dropped while it runs: SIGINT, so it stops what it started, then SIGKILL after
/// [`Up::STOP_LIMIT`].
#[derive(Debug)]
pub struct Up {
    pub child: Child,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl Up {
    /// How long `up` may take to stop everything after SIGINT.
    pub const STOP_LIMIT: Duration = Duration::from_secs(30);

    /// `fleetmend up --state-dir STATE ARGS`, its output in `dir/up.stdout` and `dir/up.stderr`.
    pub fn start(dir: &Path, state: &Path, args: &[&str]) -> Up {
        let stdout = dir.join("up.stdout");
        let stderr = dir.join("up.stderr");
        let child = Command::new(fleetmend_bin())
            .arg("up")
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .env("FLEETMEND_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("create up.stdout"))
            .stderr(std::fs::File::create(&stderr).expect("create up.stderr"))
            .spawn()
            .expect("spawn fleetmend up");
        Up { child, stdout, stderr }
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// `fleetmend inject NODE FAULT` into the fleet of `state`; what it said.
    pub fn inject(state: &Path, node: &str, fault: &str) -> String {
        let injected = run_with_timeout(
            Command::new(fleetmend_bin())
                .arg("inject")
                .arg("--state-dir")
                .arg(state)
                .args([node, fault]),
            Duration::from_secs(20),
        );
        let said = String::from_utf8_lossy(&injected.stdout).into_owned();
        assert!(injected.status.success(), "{said}{}", String::from_utf8_lossy(&injected.stderr));
        said
    }

    /// Waits up to `limit` for `up` to exit 0, its job completed with the weights `straight`
    /// and every `expected` text in its output; returns the output.
    pub fn completes_with(&mut self, limit: Duration, straight: &str, expected: &[&str]) -> String {
        let status = self.wait(limit);
        let status =
            status.unwrap_or_else(|| panic!("fleetmend up did not finish:\n{}", self.output()));
        assert!(status.success(), "fleetmend up: {status}\n{}", self.output());
        let text = self.stdout();
        for expected in expected {
            assert!(text.contains(expected), "no {expected:?} in:\n{}", self.output());
        }
        let done = text.lines().find(|l| l.contains("completed: step")).unwrap_or_default();
        assert!(done.ends_with(&format!("weights sha256 {straight}")), "{done}\n{}", self.output());
        text
    }

    /// Stdout and the last lines of stderr, for a failure message.
    pub fn output(&self) -> String {
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        format!(
            "fleetmend up stdout:\n{}\nstderr (last lines):\n{}",
            self.stdout(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    /// Sends signal `name` (`INT`, `TERM`...).
    pub fn signal(&self, name: &str) {
        let _ =
            Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status();
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its exit status, waiting at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut status = None;
        poll_until(limit, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        status
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.running() {
            self.signal("INT");
            if self.wait(Up::STOP_LIMIT).is_none() {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

/// One kept-alive HTTP/1.1 connection, for asking a server while new connections are refused or
/// shed (as Prometheus and an agent keep theirs): each request waits at most 5 s for its answer.
#[derive(Debug)]
pub struct KeepAlive {
    stream: std::net::TcpStream,
    host: String,
}

impl KeepAlive {
    pub fn connect(addr: SocketAddr) -> KeepAlive {
        let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|err| panic!("connecting to {addr}: {err}"));
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        KeepAlive { stream, host: addr.to_string() }
    }

    /// `GET path` on this connection: status and body (the answer must carry a content-length),
    /// or `None` when the connection failed.
    pub fn get(&mut self, path: &str) -> Option<(u16, String)> {
        use std::io::Write;
        write!(self.stream, "GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host).ok()?;
        let mut got = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = self.stream.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            got.extend_from_slice(&buf[..n]);
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let length: usize = head.lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
            })?;
            if got.len() >= end + 4 + length {
                let status = head.split_whitespace().nth(1)?.parse().ok()?;
                let body = String::from_utf8_lossy(&got[end + 4..end + 4 + length]).into_owned();
                return Some((status, body));
            }
        }
    }
}

/// Descriptors process `pid` holds open now.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Raises this process's descriptor limit (children inherit it) to at least `want` where the
/// hard limit allows or root may raise it, else to the hard limit; returns the new soft limit.
pub fn raise_fd_limit(want: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    // Root may raise the hard limit too (up to fs.nr_open); a runner started with a low one
    // would otherwise fail the test for its own setting.
    if hard < want && setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok() {
        return want;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
        .expect("raising RLIMIT_NOFILE to the hard limit");
    hard
}

/// The value of the sample written exactly `series` (name and labels) in a `/metrics` body.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
