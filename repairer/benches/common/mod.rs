//! What the load generators (`ingest_load`, `soak`) share: the repairer process they start, a
//! minimal HTTP/1.1 keep-alive client, the agents' names, boot ids and fatal finding, and readings
//! of /proc. Each generator uses part of it.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every request and every wait has a deadline.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response the client accepts (the events of one node, /metrics).
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// The benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{what}: no answer within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    #[error("{what}: {message}")]
    Protocol { what: String, message: String },
    #[error("the repairer {0}")]
    Repairer(String),
}

pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LoadError {
    let what = what.into();
    move |source| LoadError::Io { what, source }
}

/// A free loopback port to listen on.
pub fn free_loopback_addr() -> Result<SocketAddr, LoadError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("finding a free loopback port"))?
        .port();
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The repairer process; killed on drop.
pub struct RepairerProcess {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
    pub store: PathBuf,
}

impl RepairerProcess {
    /// Starts `fleetmend repairer --config CONFIG` listening on `addr`, its stderr appended to
    /// `log` (a restarted repairer's lines follow the killed one's).
    pub fn spawn(
        bin: &Path,
        config: &Path,
        log: &Path,
        addr: SocketAddr,
        store: PathBuf,
    ) -> Result<RepairerProcess, LoadError> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io(format!("opening {}", log.display())))?;
        let child = Command::new(bin)
            .arg("repairer")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(io(format!("starting {}", bin.display())))?;
        Ok(RepairerProcess { child, addr, log: log.to_owned(), store })
    }

    /// SIGKILL: no shutdown of any kind, as a machine that lost power or an OOM kill.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Polls `/healthz` until it answers.
    pub async fn wait_ready(&mut self) -> Result<(), LoadError> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut conn = HttpConn::new(self.addr);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(LoadError::Repairer(format!(
                    "exited at start ({status}):\n{}",
                    self.log_tail()
                )));
            }
            if let Ok(200) = conn.request("GET", "/healthz", "", b"").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LoadError::Repairer(format!(
                    "did not answer /healthz within {STARTUP_TIMEOUT:?}:\n{}",
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within 5 s.
    pub fn stop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RepairerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// --- /proc -------------------------------------------------------------------------------------

/// CPU time of the process's live threads in seconds (ns precision, from schedstat).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let mut total_ns: u64 = 0;
    for task in tasks.flatten() {
        let path = task.path().join("schedstat");
        if let Ok(text) = std::fs::read_to_string(path)
            && let Some(ns) = text.split_whitespace().next().and_then(|v| v.parse::<u64>().ok())
        {
            total_ns += ns;
        }
    }
    total_ns as f64 / 1e9
}

/// Busy CPU seconds of the whole machine (every process, kernel included), from /proc/stat.
pub fn machine_busy_seconds() -> f64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().next() else { return 0.0 };
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user)
    let busy: u64 =
        ticks.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum();
    busy as f64 / 100.0
}

/// A `Name: value kB` field of a /proc file (`VmRSS` in `/proc/PID/status`, `MemTotal`).
pub fn proc_kib(path: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub rss_kib: u64,
    pub anon_kib: u64,
}

pub fn memory(pid: u32) -> Memory {
    let status = format!("/proc/{pid}/status");
    Memory { rss_kib: proc_kib(&status, "VmRSS"), anon_kib: proc_kib(&status, "RssAnon") }
}

pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim()))
        .unwrap_or("unknown CPU")
        .to_owned();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_gib = proc_kib("/proc/meminfo", "MemTotal") as f64 / 1024.0 / 1024.0;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({model}), {mem_gib:.0} GiB, Linux {}", kernel.trim())
}

pub fn unix_ms_f64() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

// --- a minimal HTTP/1.1 keep-alive client ------------------------------------------------------
//
// Hand-written rather than reqwest/hyper: the load generator shares two cores with the repairer,
// and every microsecond it spends per request is taken from the system under test.

pub struct HttpConn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    out: Vec<u8>,
    input: Vec<u8>,
    body: std::ops::Range<usize>,
    /// The last answer's `Retry-After`, in seconds.
    retry_after: Option<u64>,
}

impl HttpConn {
    pub fn new(addr: SocketAddr) -> HttpConn {
        HttpConn {
            addr,
            stream: None,
            out: Vec::with_capacity(4096),
            input: Vec::with_capacity(16 * 1024),
            body: 0..0,
            retry_after: None,
        }
    }

    /// A connection whose buffers grow only as needed: one per simulated agent, thousands of
    /// them, each sending small reports.
    pub fn lean(addr: SocketAddr) -> HttpConn {
        HttpConn {
            addr,
            stream: None,
            out: Vec::new(),
            input: Vec::new(),
            body: 0..0,
            retry_after: None,
        }
    }

    /// The last answer's `Retry-After` header, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// One request; returns the status. A failed or timed-out exchange drops the connection
    /// (the next request opens a new one).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        token: &str,
        body: &[u8],
    ) -> Result<u16, LoadError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path, token, body)).await
        {
            Ok(Ok(status)) => Ok(status),
            Ok(Err(err)) => {
                self.stream = None;
                Err(err)
            }
            Err(_) => {
                self.stream = None;
                Err(LoadError::Timeout {
                    what: format!("{method} {path}"),
                    timeout: REQUEST_TIMEOUT,
                })
            }
        }
    }

    pub fn body(&self) -> &[u8] {
        &self.input[self.body.clone()]
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        token: &str,
        body: &[u8],
    ) -> Result<u16, LoadError> {
        let what = || format!("{method} {path}");
        if self.stream.is_none() {
            let stream = TcpStream::connect(self.addr).await.map_err(io(what()))?;
            stream.set_nodelay(true).map_err(io(what()))?;
            self.stream = Some(stream);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(LoadError::Protocol { what: what(), message: "no connection".to_owned() });
        };
        self.out.clear();
        let _ = write!(self.out, "{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.addr);
        if !token.is_empty() {
            let _ = write!(self.out, "authorization: Bearer {token}\r\n");
        }
        if method == "POST" {
            let _ = write!(
                self.out,
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            );
        }
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(body);
        stream.write_all(&self.out).await.map_err(io(what()))?;

        self.input.clear();
        let head_end = loop {
            if stream.read_buf(&mut self.input).await.map_err(io(what()))? == 0 {
                return Err(LoadError::Protocol {
                    what: what(),
                    message: "connection closed before the answer".to_owned(),
                });
            }
            if let Some(at) = self.input.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if self.input.len() > 64 * 1024 {
                return Err(LoadError::Protocol {
                    what: what(),
                    message: "answer head over 64 KiB".to_owned(),
                });
            }
        };
        let head = std::str::from_utf8(&self.input[..head_end]).map_err(|_| {
            LoadError::Protocol { what: what(), message: "answer head is not UTF-8".to_owned() }
        })?;
        let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).ok_or_else(|| {
            LoadError::Protocol { what: what(), message: format!("bad status line in {head:?}") }
        })?;
        let mut length = None;
        let mut close = false;
        self.retry_after = None;
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else { continue };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(LoadError::Protocol {
                    what: what(),
                    message: format!("transfer-encoding {value} is not supported here"),
                });
            } else if name.eq_ignore_ascii_case("retry-after") {
                self.retry_after = value.parse().ok();
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
        let length = length.unwrap_or(0);
        if length > MAX_RESPONSE_BYTES {
            return Err(LoadError::Protocol {
                what: what(),
                message: format!("answer body of {length} bytes"),
            });
        }
        while self.input.len() < head_end + length {
            if stream.read_buf(&mut self.input).await.map_err(io(what()))? == 0 {
                return Err(LoadError::Protocol {
                    what: what(),
                    message: "connection closed in the answer body".to_owned(),
                });
            }
        }
        self.body = head_end..head_end + length;
        if close {
            self.stream = None;
        }
        Ok(status)
    }
}

// --- the reports -------------------------------------------------------------------------------

pub fn node_name(index: usize, out: &mut String) {
    out.clear();
    let _ = write!(out, "gpu-{index:06}");
}

/// A stable boot id per node (UUID-shaped, as `/proc/sys/kernel/random/boot_id`).
pub fn boot_id(index: usize, out: &mut String) {
    let mut x = (index as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b) = (next(), next());
    out.clear();
    let _ = write!(
        out,
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    );
}

/// The Xid 79 finding the agent's GPU check makes when a GPU fell off the bus.
pub fn fatal_finding() -> Finding {
    Finding::new(
        "gpu",
        "xid",
        "3",
        Status::Fail,
        RecommendedAction::Reboot,
        "Xid 79 on GPU 3 (0000:9d:00.0): GPU has fallen off the bus",
    )
    .with_label("xid", "79")
    .with_label("pci", "0000:9d:00.0")
}
