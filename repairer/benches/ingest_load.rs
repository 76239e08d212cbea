//! Ingest benchmark of the repairer: a load generator that plays a fleet of agents against the
//! release `fleetmend repairer` binary on loopback.
//!
//! It starts the repairer itself (temp dir, SQLite store or the PostgreSQL database `--store`
//! names, the `memory` scheduler), then:
//! 1. join: every node sends its first report once (closed loop);
//! 2. memory: the repairer's RSS before and after the fleet joined, divided by the node count;
//! 3. max-rate: every connection sends back to back for a fixed time (closed loop): the most
//!    reports per second the repairer takes on this machine, with per-request latency;
//! 4. paced: a fixed rate (open loop: each request has a scheduled send time and its latency is
//!    measured from that time, so a slow answer is not hidden by the next request waiting), while
//!    a separate connection sends reports with a fatal finding (Xid 79) for distinct nodes spread
//!    over the phase; each fatal node's later heartbeats carry the finding too, as an agent's would;
//! 5. drain latency: for each fatal node, the time from sending the report to the drain call,
//!    from the audit log (`GET /v1/events?node=`: the first `workflow-step` event is written right
//!    after the scheduler's drain call returned) and from `fleetmend_time_to_drain_seconds`;
//! 6. storm (`--storm N`, default 1,000; 0 skips it): an idle window (no reports: the repairer's
//!    own CPU is its tick) and the paced load again, then N other nodes report the fatal finding
//!    at once, with the breaker set to open on the first of them (the paced phase's fatal nodes
//!    stay below it, so they drain as without a storm), so all N are held by the breaker and
//!    re-decided on every tick; then the idle window and the paced load again while they are
//!    held (their heartbeats carry the finding). Before/after: the tick's cost and report latency
//!    with and without a held storm. Each storm node's audit log tells whether the breaker held it.
//!
//! With `--warn N`, N other nodes carry a lasting warning in every report (a disk filling up):
//! the repairer re-decides about such nodes on every tick, which must not cost the ingest.
//!
//! The load generator and the repairer share the machine's cores: the CPU each used is read from
//! `/proc/PID/task/*/schedstat` and printed with the results.
//!
//! Built only when asked (`cargo bench`, `--benches`, `--all-targets`), never by `cargo test`:
//! `scripts/bench-repairer` builds both in release and runs it. Every phase is bounded in time.

mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fleetmend_proto::stats::nearest_rank;
use fleetmend_proto::{
    CheckRun, Finding, RecommendedAction, Report, ReportTrigger, Status, Verdict, WIRE_VERSION,
};
use tokio::task::JoinSet;

use common::{
    HttpConn, LoadError, RepairerProcess, boot_id, cpu_seconds, fatal_finding, free_loopback_addr,
    io, machine, machine_busy_seconds, memory, node_name, unix_ms_f64,
};

const AGENT_TOKEN: &str = "bench-agent-token";
const ADMIN_TOKEN: &str = "bench-admin-token";
/// How long after the paced phase the drains of the last fatal nodes may take to show.
const DRAIN_WAIT: Duration = Duration::from_secs(20);
/// Report intervals of silence before a node is unreachable, in the repairer under test (default
/// 3). The join phase sends every node's first report once, back to back; a node that joined
/// early then waits for the join to finish before it reports again, which at this machine's join
/// rate can exceed 3 intervals (30 s) — an artifact of the phase, not of a fleet whose agents
/// report every 10 s. On PostgreSQL (two committed writes per first report) the join of 100,000
/// nodes takes minutes, hence 60 intervals (10 min), for both stores alike. In every later phase
/// each node reports at least every 5 s.
const UNREACHABLE_AFTER: u32 = 60;

/// Command-line options (`--name value`); `cargo bench` adds `--bench`, which is ignored.
#[derive(Debug, Clone)]
struct Options {
    /// The `fleetmend` binary to benchmark.
    repairer_bin: PathBuf,
    /// Distinct node names.
    nodes: usize,
    /// Concurrent keep-alive HTTP/1.1 connections.
    connections: usize,
    /// Length of the max-rate and of the paced phase.
    duration: Duration,
    /// Reports per second in the paced phase.
    rate: f64,
    /// Distinct nodes that report a fatal finding during the paced phase.
    fatal: usize,
    /// Distinct nodes whose every report carries a warning (a disk filling up): the repairer
    /// re-decides about such nodes on every tick, so this shows what a fleet with some
    /// long-lived warnings costs.
    warn: usize,
    /// Distinct nodes that report a fatal finding at once after the paced phase, with the breaker
    /// set to open on the first of them: all are held while the rest of the fleet reports (0: no
    /// storm phase).
    storm: usize,
    /// Length of each idle window (no reports) in which the repairer's own CPU is measured, once
    /// before the storm and once while it is held: the cost of its tick.
    idle: Duration,
    /// Worker threads of the load generator (1: a current-thread runtime, the least CPU).
    threads: usize,
    /// Also write the results as JSON here.
    json: Option<PathBuf>,
    /// The repairer's store: a `postgres://` URL (an empty database); default a SQLite file in
    /// the temp dir.
    store: Option<String>,
}

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> Result<Options, LoadError> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target"));
        let mut options = Options {
            repairer_bin: target.join("release").join("fleetmend"),
            nodes: 100_000,
            connections: 128,
            duration: Duration::from_secs(20),
            rate: 20_000.0,
            fatal: 200,
            warn: 0,
            storm: 1_000,
            idle: Duration::from_secs(10),
            threads: 1,
            json: None,
            store: None,
        };
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            if arg == "--bench" {
                continue;
            }
            let mut value = |name: &str| {
                args.next().ok_or_else(|| LoadError::Usage(format!("{name} needs a value")))
            };
            let number = |name: &str, text: String| {
                text.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0).ok_or_else(|| {
                    LoadError::Usage(format!("{name}: {text:?} is not a number > 0"))
                })
            };
            match arg.as_str() {
                "--repairer-bin" => options.repairer_bin = PathBuf::from(value(&arg)?),
                "--nodes" => options.nodes = number(&arg, value(&arg)?)? as usize,
                "--connections" => options.connections = number(&arg, value(&arg)?)? as usize,
                "--duration" => {
                    options.duration = Duration::from_secs_f64(number(&arg, value(&arg)?)?)
                }
                "--rate" => options.rate = number(&arg, value(&arg)?)?,
                "--fatal" => options.fatal = number(&arg, value(&arg)?)? as usize,
                "--warn" => {
                    options.warn = value(&arg)?
                        .parse()
                        .map_err(|_| LoadError::Usage("--warn: not a whole number".to_owned()))?
                }
                "--storm" => {
                    options.storm = value(&arg)?
                        .parse()
                        .map_err(|_| LoadError::Usage("--storm: not a whole number".to_owned()))?
                }
                "--idle" => options.idle = Duration::from_secs_f64(number(&arg, value(&arg)?)?),
                "--threads" => options.threads = number(&arg, value(&arg)?)? as usize,
                "--json" => options.json = Some(PathBuf::from(value(&arg)?)),
                "--store" => {
                    let url = value(&arg)?;
                    if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
                        return Err(LoadError::Usage(format!(
                            "--store: {url:?} is not a postgres:// URL (without it: SQLite)"
                        )));
                    }
                    options.store = Some(url);
                }
                "-h" | "--help" => {
                    return Err(LoadError::Usage(
                        "ingest_load [--repairer-bin PATH] [--nodes 100000] [--connections 128] \
                         [--duration SECONDS(20)] [--rate 20000] [--fatal 200] [--warn 0] [--storm 1000] \
                         [--idle SECONDS(10)] [--threads 1] [--json FILE] [--store postgres://USER@HOST:PORT/DB]"
                            .to_owned(),
                    ));
                }
                other => return Err(LoadError::Usage(format!("unknown option {other:?}"))),
            }
        }
        if options.connections > options.nodes {
            return Err(LoadError::Usage("--connections must not exceed --nodes".to_owned()));
        }
        if options.fatal > options.nodes / 2 || options.warn > options.nodes / 2 {
            return Err(LoadError::Usage(
                "--fatal and --warn must each be at most half of --nodes".to_owned(),
            ));
        }
        if options.fatal + options.warn + options.storm > options.nodes {
            return Err(LoadError::Usage(
                "--fatal, --warn and --storm together must not exceed --nodes".to_owned(),
            ));
        }
        Ok(options)
    }
}

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("ingest_load: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = if options.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("ingest_load: starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // On Ctrl-C or SIGTERM the run future is dropped, and with it the repairer process.
    let outcome = runtime.block_on(async {
        tokio::select! {
            result = run(options) => result,
            signal = stopped() => Err(LoadError::Usage(format!("stopped by {signal}"))),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ingest_load: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn stopped() -> &'static str {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return "SIGINT";
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}

// --- the repairer under test -------------------------------------------------------------------

/// The breaker in the repairer's config.
#[derive(Debug, Clone, Copy)]
struct BreakerSettings {
    fraction: f64,
    min_nodes: usize,
}

impl BreakerSettings {
    /// Without a storm: the defaults (more than 20 % of the fleet, at least 3 nodes, turned
    /// unhealthy within 10 min), far above the paced phase's fatal nodes. With one: the breaker
    /// opens on the first node past the paced phase's `fatal` (those still drain, as without a
    /// storm), so the storm's first node opens it and every storm node is held. The fraction
    /// (half of `fatal`) never binds before the count does.
    fn for_run(options: &Options) -> BreakerSettings {
        if options.storm == 0 {
            return BreakerSettings { fraction: 0.20, min_nodes: 3 };
        }
        BreakerSettings {
            fraction: options.fatal.max(1) as f64 / 2.0 / options.nodes as f64,
            min_nodes: options.fatal + 1,
        }
    }
}

/// Starts the repairer under test on a free loopback port with its store in `dir`, or in the
/// PostgreSQL database `postgres` names.
fn start_repairer(
    bin: &Path,
    dir: &Path,
    postgres: Option<&str>,
    breaker: BreakerSettings,
) -> Result<RepairerProcess, LoadError> {
    let addr = free_loopback_addr()?;
    let store = postgres.map_or_else(|| dir.join("repairer.db"), PathBuf::from);
    let config = dir.join("repairer.toml");
    // Guard rails at their defaults except max_concurrent_repairs: the fatal findings here are
    // Xid 79 (reboot), and with 2 repairs at once the rest would be held before their drain.
    // 200 of 100,000 nodes is 0.2 %: far below max_unavailable_fraction (10 %). The breaker
    // (see BreakerSettings) is written out so the reader sees what it lets through.
    // unreachable_after: see UNREACHABLE_AFTER. The node rate is lifted: the generator replays
    // agents far faster than they report, and the ingest is measured, not the rate limit; so is
    // the person rate: the read-back after the storm reads 1,000 audit logs at once as the admin
    // (at the default 50/s with a burst of 500, a store that answers them fast gets the rest 429).
    let text = format!(
        "listen = \"{addr}\"\n\
         store = \"{}\"\n\
         agent_token = \"{AGENT_TOKEN}\"\n\
         admin_token = \"{ADMIN_TOKEN}\"\n\
         scheduler = \"memory\"\n\
         [policy]\n\
         mode = \"enforce\"\n\
         [policy.guard_rails]\n\
         max_concurrent_repairs = 100000\n\
         max_unavailable_fraction = 0.10\n\
         breaker_fraction = {}\n\
         breaker_min_nodes = {}\n\
         breaker_window = \"10m\"\n\
         [engine]\n\
         report_interval = \"10s\"\n\
         unreachable_after = {UNREACHABLE_AFTER}\n\
         [rate_limits]\n\
         node = {{ per_second = 1e9, burst = 1000000 }}\n\
         person = {{ per_second = 1e9, burst = 1000000 }}\n",
        store.display(),
        breaker.fraction,
        breaker.min_nodes,
    );
    std::fs::write(&config, text).map_err(io(format!("writing {}", config.display())))?;
    RepairerProcess::spawn(bin, &config, &dir.join("repairer.log"), addr, store)
}

/// The disk check's warning about a filling root file system.
fn warn_finding() -> Finding {
    Finding::new("disk", "disk_usage", "/", Status::Warn, RecommendedAction::None, "/ is 87 % full")
        .with_value(0.87)
}

/// Builds an agent's report in place (the strings keep their capacity between reports).
struct ReportWriter {
    report: Report,
    fatal: Finding,
    warn: Finding,
    body: Vec<u8>,
}

impl ReportWriter {
    fn new() -> ReportWriter {
        let check = |name: &str, seconds: f64| CheckRun {
            check: name.to_owned(),
            status: Status::Ok,
            duration_seconds: seconds,
            timed_out: false,
            finished_at_ms: 0,
        };
        ReportWriter {
            report: Report {
                wire_version: WIRE_VERSION,
                node: String::with_capacity(16),
                boot_id: String::with_capacity(40),
                agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                seq: 0,
                sent_at_ms: 0,
                trigger: ReportTrigger::Interval,
                verdict: Verdict::Healthy,
                checks: vec![
                    check("gpu", 0.0213),
                    check("kernel_log", 0.0004),
                    check("nic", 0.0011),
                    check("disk", 0.0032),
                    check("host", 0.0007),
                ],
                findings: Vec::new(),
                command_results: Vec::new(),
                address: None,
                ranks: Vec::new(),
                metrics_port: None,
            },
            fatal: fatal_finding(),
            warn: warn_finding(),
            body: Vec::with_capacity(2048),
        }
    }

    /// The report of node `index`: healthy, or carrying the Xid 79 finding, or the warning.
    fn build(
        &mut self,
        index: usize,
        seq: u64,
        fatal: bool,
        warn: bool,
        trigger: ReportTrigger,
    ) -> &[u8] {
        let now = unix_ms_f64() as u64;
        let report = &mut self.report;
        node_name(index, &mut report.node);
        boot_id(index, &mut report.boot_id);
        report.seq = seq;
        report.sent_at_ms = now;
        report.trigger = trigger;
        for (i, check) in report.checks.iter_mut().enumerate() {
            // The checks finished a little before the report, at staggered times.
            check.finished_at_ms = now.saturating_sub(50 + 700 * i as u64);
            check.status = Status::Ok;
        }
        report.findings.clear();
        report.verdict = Verdict::Healthy;
        if warn {
            report.findings.push(self.warn.clone());
            report.checks[3].status = Status::Warn;
            report.verdict = Verdict::Degraded;
        }
        if fatal {
            report.findings.push(self.fatal.clone());
            report.checks[0].status = Status::Fail;
            report.verdict = Verdict::Unhealthy;
        }
        self.body.clear();
        // Serializing a struct of strings and numbers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.body, &self.report);
        &self.body
    }
}

// --- load phases -------------------------------------------------------------------------------

struct Shared {
    addr: SocketAddr,
    /// Set once a node's fatal report was answered: its later heartbeats carry the finding.
    fatal: Vec<AtomicBool>,
    /// Nodes whose every report carries the warning.
    warn: Vec<bool>,
}

/// One connection and the nodes it reports for (node i belongs to connection i % connections).
struct Worker {
    conn: HttpConn,
    writer: ReportWriter,
    nodes: Vec<usize>,
    cursor: usize,
    /// Reports sent per node so far by this worker's rounds (the agents' `seq`).
    round: u64,
}

impl Worker {
    fn next_node(&mut self) -> (usize, u64) {
        let node = self.nodes[self.cursor];
        let seq = self.round + 1;
        self.cursor += 1;
        if self.cursor == self.nodes.len() {
            self.cursor = 0;
            self.round += 1;
        }
        (node, seq)
    }

    async fn send(&mut self, shared: &Shared) -> Result<(), LoadError> {
        let (node, seq) = self.next_node();
        let fatal = shared.fatal[node].load(Ordering::Relaxed);
        let body = self.writer.build(node, seq, fatal, shared.warn[node], ReportTrigger::Interval);
        let status = self.conn.request("POST", "/v1/reports", AGENT_TOKEN, body).await?;
        if status != 200 {
            return Err(LoadError::Protocol {
                what: "POST /v1/reports".to_owned(),
                message: format!(
                    "status {status}: {}",
                    String::from_utf8_lossy(self.conn.body()).chars().take(200).collect::<String>()
                ),
            });
        }
        Ok(())
    }
}

/// Answers slower than this are also counted per second of the phase, to show whether they come
/// in bursts (a stall) or spread out (a queue).
const SLOW: Duration = Duration::from_millis(50);

struct WorkerOutcome {
    started: Instant,
    latencies_us: Vec<u32>,
    /// Answers slower than `SLOW`, by second of the phase.
    slow_by_second: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

impl WorkerOutcome {
    fn new(started: Instant) -> WorkerOutcome {
        WorkerOutcome {
            started,
            latencies_us: Vec::new(),
            slow_by_second: Vec::new(),
            errors: 0,
            first_error: None,
        }
    }

    fn note(&mut self, result: Result<(), LoadError>, latency: Duration) {
        if latency > SLOW {
            let second = self.started.elapsed().as_secs() as usize;
            if self.slow_by_second.len() <= second {
                self.slow_by_second.resize(second + 1, 0);
            }
            self.slow_by_second[second] += 1;
        }
        match result {
            Ok(()) => self.latencies_us.push(latency.as_micros().min(u32::MAX as u128) as u32),
            Err(err) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| err.to_string());
            }
        }
    }
}

/// How a phase went, with the CPU each process used.
#[derive(Debug)]
struct PhaseResult {
    name: &'static str,
    wall_s: f64,
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    /// Sorted latencies in microseconds.
    latencies_us: Vec<u32>,
    /// Answers slower than `SLOW`, by second of the phase.
    slow_by_second: Vec<u32>,
    repairer_cpu_s: f64,
    loadgen_cpu_s: f64,
    /// Busy CPU of the whole machine (the two processes, the kernel's network stack, others).
    machine_cpu_s: f64,
}

impl PhaseResult {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.wall_s
    }

    /// The nearest-rank `q` quantile of the latencies, in milliseconds (0 when there are none).
    fn quantile_ms(&self, q: f64) -> f64 {
        nearest_rank(&self.latencies_us, q).map_or(0.0, |us| f64::from(us) / 1000.0)
    }
}

enum Pace {
    /// Every node once, back to back.
    Join,
    /// Back to back until the deadline.
    Closed { until: Instant },
    /// Request j of the phase is due at start + j / rate; connection c sends j = c, c + C, ...
    Open { start: Instant, until: Instant, rate: f64, connections: usize },
}

async fn drive(
    mut worker: Worker,
    index: usize,
    shared: Arc<Shared>,
    pace: Arc<Pace>,
    started: Instant,
) -> (Worker, WorkerOutcome) {
    let mut outcome = WorkerOutcome::new(started);
    match *pace {
        Pace::Join => {
            outcome.latencies_us.reserve(worker.nodes.len());
            for _ in 0..worker.nodes.len() {
                let sent = Instant::now();
                let result = worker.send(&shared).await;
                outcome.note(result, sent.elapsed());
            }
        }
        Pace::Closed { until } => {
            while Instant::now() < until {
                let sent = Instant::now();
                let result = worker.send(&shared).await;
                outcome.note(result, sent.elapsed());
            }
        }
        Pace::Open { start, until, rate, connections } => {
            let mut slot = index as f64;
            loop {
                let due = start + Duration::from_secs_f64(slot / rate);
                if due >= until {
                    break;
                }
                tokio::time::sleep_until(due.into()).await;
                let result = worker.send(&shared).await;
                // From the scheduled time, not from when the send began: a connection behind
                // schedule (a slow answer before) counts the wait in the latency.
                outcome.note(result, due.elapsed());
                slot += connections as f64;
            }
        }
    }
    (worker, outcome)
}

async fn run_phase(
    name: &'static str,
    workers: Vec<Worker>,
    shared: &Arc<Shared>,
    pace: Pace,
    repairer_pid: u32,
) -> (Vec<Worker>, PhaseResult) {
    let pace = Arc::new(pace);
    let cpu_repairer = cpu_seconds(repairer_pid);
    let cpu_self = cpu_seconds(std::process::id());
    let cpu_machine = machine_busy_seconds();
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (index, worker) in workers.into_iter().enumerate() {
        tasks.spawn(drive(worker, index, shared.clone(), pace.clone(), started));
    }
    let mut workers = Vec::new();
    let mut latencies = Vec::new();
    let mut slow_by_second: Vec<u32> = Vec::new();
    let (mut errors, mut first_error) = (0, None);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((worker, outcome)) => {
                workers.push(worker);
                latencies.extend(outcome.latencies_us);
                if slow_by_second.len() < outcome.slow_by_second.len() {
                    slow_by_second.resize(outcome.slow_by_second.len(), 0);
                }
                for (total, count) in slow_by_second.iter_mut().zip(&outcome.slow_by_second) {
                    *total += count;
                }
                errors += outcome.errors;
                if first_error.is_none() {
                    first_error = outcome.first_error;
                }
            }
            Err(err) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("a load task failed: {err}"));
            }
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let result = PhaseResult {
        name,
        wall_s,
        requests: latencies.len() as u64,
        errors,
        first_error,
        latencies_us: latencies,
        slow_by_second,
        repairer_cpu_s: cpu_seconds(repairer_pid) - cpu_repairer,
        loadgen_cpu_s: cpu_seconds(std::process::id()) - cpu_self,
        machine_cpu_s: machine_busy_seconds() - cpu_machine,
    };
    workers.sort_by_key(|w| w.nodes.first().copied().unwrap_or(0));
    (workers, result)
}

/// One fatal report sent during the paced phase.
#[derive(Debug, Clone)]
struct FatalSent {
    node: usize,
    sent_unix_ms: f64,
    reply_ms: f64,
    status: Option<u16>,
}

/// Sends one fatal report per node in `nodes`, spread evenly over the middle 80 % of the phase.
async fn send_fatal(
    shared: Arc<Shared>,
    nodes: Vec<usize>,
    start: Instant,
    duration: Duration,
) -> Vec<FatalSent> {
    let mut conn = HttpConn::new(shared.addr);
    let mut writer = ReportWriter::new();
    let mut sent = Vec::with_capacity(nodes.len());
    let count = nodes.len().max(1) as f64;
    for (k, node) in nodes.into_iter().enumerate() {
        let due = start + duration.mul_f64(0.1 + 0.8 * k as f64 / count);
        tokio::time::sleep_until(due.into()).await;
        // A seq far above the heartbeats' (an agent pushes kernel-log events at once).
        let warn = shared.warn[node];
        let body = writer.build(node, 1_000_000 + k as u64, true, warn, ReportTrigger::Event);
        let sent_unix_ms = unix_ms_f64();
        let began = Instant::now();
        let status = conn.request("POST", "/v1/reports", AGENT_TOKEN, body).await.ok();
        let reply_ms = began.elapsed().as_secs_f64() * 1000.0;
        shared.fatal[node].store(true, Ordering::Relaxed);
        sent.push(FatalSent { node, sent_unix_ms, reply_ms, status });
    }
    sent
}

/// For each fatal node, ms from sending its report to the node's first `workflow-step` event
/// (written right after the drain call returned), and that event's reason for one node (to show
/// what was matched). Polls until all are there or `DRAIN_WAIT` passed.
async fn drain_latencies(
    addr: SocketAddr,
    sent: &[FatalSent],
) -> (Vec<Option<f64>>, Option<String>) {
    let mut conn = HttpConn::new(addr);
    let mut found: Vec<Option<f64>> = vec![None; sent.len()];
    let mut matched = None;
    let deadline = Instant::now() + DRAIN_WAIT;
    let mut name = String::new();
    loop {
        for (slot, fatal) in found.iter_mut().zip(sent) {
            if slot.is_some() {
                continue;
            }
            node_name(fatal.node, &mut name);
            let path = format!("/v1/events?node={name}&limit=1000");
            if !matches!(conn.request("GET", &path, ADMIN_TOKEN, b"").await, Ok(200)) {
                continue;
            }
            let Ok(events) = serde_json::from_slice::<Vec<serde_json::Value>>(conn.body()) else {
                continue;
            };
            // Events come oldest first.
            let Some(step) = events.iter().find(|e| e["kind"] == "workflow-step") else {
                continue;
            };
            *slot = step["at_ms"].as_f64().map(|at| at - fatal.sent_unix_ms);
            if matched.is_none() {
                matched = step["reason"].as_str().map(|r| format!("{name}: {r:?}"));
            }
        }
        if found.iter().all(Option::is_some) || Instant::now() > deadline {
            return (found, matched);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `fleetmend_time_to_drain_seconds` from /metrics: (count, count ≤ 0.1 s, sum).
async fn drain_histogram(addr: SocketAddr) -> Option<(f64, f64, f64)> {
    let mut conn = HttpConn::new(addr);
    if conn.request("GET", "/metrics", "", b"").await.ok()? != 200 {
        return None;
    }
    let text = String::from_utf8_lossy(conn.body()).into_owned();
    let value = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    Some((
        value("fleetmend_time_to_drain_seconds_count")?,
        value("fleetmend_time_to_drain_seconds_bucket{le=\"0.1\"}")?,
        value("fleetmend_time_to_drain_seconds_sum")?,
    ))
}

// --- the storm -------------------------------------------------------------------------------

/// Connections the storm's fatal reports arrive on at once.
const STORM_CONNECTIONS: usize = 32;

/// `count` nodes spread over the fleet, none of them in `taken` (the fatal and warned nodes).
fn storm_nodes(nodes: usize, count: usize, taken: &[bool]) -> Vec<usize> {
    let mut taken = taken.to_vec();
    let stride = nodes / count.max(1);
    let mut chosen = Vec::with_capacity(count);
    for k in 0..count {
        let start = k * stride + stride / 4;
        if let Some(node) = (0..nodes).map(|i| (start + i) % nodes).find(|&i| !taken[i]) {
            taken[node] = true;
            chosen.push(node);
        }
    }
    chosen
}

/// The storm's fatal reports: every node once, over `STORM_CONNECTIONS` connections back to
/// back. Returns each answer's ms (sorted), the refused count and the wall time.
async fn send_storm(shared: Arc<Shared>, nodes: &[usize]) -> (Vec<f64>, usize, f64) {
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for c in 0..STORM_CONNECTIONS.min(nodes.len()) {
        let mine: Vec<usize> = nodes.iter().copied().skip(c).step_by(STORM_CONNECTIONS).collect();
        let shared = shared.clone();
        tasks.spawn(async move {
            let mut conn = HttpConn::new(shared.addr);
            let mut writer = ReportWriter::new();
            let mut out = Vec::with_capacity(mine.len());
            for (k, node) in mine.into_iter().enumerate() {
                let warn = shared.warn[node];
                // Above the heartbeats' seq, as an agent's event push.
                let body =
                    writer.build(node, 2_000_000 + k as u64, true, warn, ReportTrigger::Event);
                let began = Instant::now();
                let status = conn.request("POST", "/v1/reports", AGENT_TOKEN, body).await.ok();
                out.push((began.elapsed().as_secs_f64() * 1000.0, status == Some(200)));
                // Its later heartbeats carry the finding, as an agent's would.
                shared.fatal[node].store(true, Ordering::Relaxed);
            }
            out
        });
    }
    let mut replies = Vec::with_capacity(nodes.len());
    let mut refused = 0;
    while let Some(joined) = tasks.join_next().await {
        for (ms, ok) in joined.unwrap_or_default() {
            replies.push(ms);
            refused += usize::from(!ok);
        }
    }
    replies.sort_by(f64::total_cmp);
    (replies, refused, started.elapsed().as_secs_f64())
}

/// `GET /v1/breaker`: whether it is open (None: no answer).
async fn breaker_open(addr: SocketAddr) -> Option<bool> {
    let mut conn = HttpConn::new(addr);
    if conn.request("GET", "/v1/breaker", ADMIN_TOKEN, b"").await.ok()? != 200 {
        return None;
    }
    serde_json::from_slice::<serde_json::Value>(conn.body()).ok()?["open"].as_bool()
}

/// What became of the storm's nodes, from each one's audit log.
#[derive(Debug, Default, Clone, Copy)]
struct StormOutcome {
    /// An `action-held` event "held (breaker)" and no workflow.
    held_by_breaker: usize,
    /// Held by another guard rail.
    held_otherwise: usize,
    /// A workflow began (a drain): the breaker was not open yet.
    acted: usize,
    /// None of these (or the events could not be read).
    unknown: usize,
}

async fn storm_outcome(addr: SocketAddr, nodes: &[usize]) -> StormOutcome {
    let mut conn = HttpConn::new(addr);
    let mut outcome = StormOutcome::default();
    let mut name = String::new();
    for &node in nodes {
        node_name(node, &mut name);
        let path = format!("/v1/events?node={name}&limit=1000");
        let events = match conn.request("GET", &path, ADMIN_TOKEN, b"").await {
            Ok(200) => serde_json::from_slice::<Vec<serde_json::Value>>(conn.body()).ok(),
            _ => None,
        };
        let Some(events) = events else {
            outcome.unknown += 1;
            continue;
        };
        let held = |e: &&serde_json::Value| e["kind"] == "action-held";
        if events.iter().any(|e| e["kind"] == "workflow-step") {
            outcome.acted += 1;
        } else if events
            .iter()
            .filter(held)
            .any(|e| e["reason"].as_str().is_some_and(|r| r.contains("held (breaker)")))
        {
            outcome.held_by_breaker += 1;
        } else if events.iter().any(|e| held(&e)) {
            outcome.held_otherwise += 1;
        } else {
            outcome.unknown += 1;
        }
    }
    outcome
}

/// The repairer's own CPU while no report is sent: its tick, timers and background loops.
#[derive(Debug, Clone, Copy)]
struct IdleResult {
    wall_s: f64,
    repairer_cpu_s: f64,
    machine_cpu_s: f64,
}

impl IdleResult {
    fn repairer_cores(&self) -> f64 {
        self.repairer_cpu_s / self.wall_s
    }
}

async fn idle_window(pid: u32, length: Duration) -> IdleResult {
    let cpu = cpu_seconds(pid);
    let machine = machine_busy_seconds();
    let started = Instant::now();
    tokio::time::sleep(length).await;
    IdleResult {
        wall_s: started.elapsed().as_secs_f64(),
        repairer_cpu_s: cpu_seconds(pid) - cpu,
        machine_cpu_s: machine_busy_seconds() - machine,
    }
}

fn print_idle(name: &str, idle: &IdleResult) {
    println!(
        "{name:9} no reports for {:.1} s: repairer {:.4} cores ({:.1} ms of CPU per second, i.e. \
         per 1 s tick), whole machine {:.2} cores",
        idle.wall_s,
        idle.repairer_cores(),
        idle.repairer_cores() * 1000.0,
        idle.machine_cpu_s / idle.wall_s,
    );
}

/// The storm phase's results.
struct StormResult {
    nodes: usize,
    replies_ms: Vec<f64>,
    refused: usize,
    burst_s: f64,
    open_before: Option<bool>,
    open_after: Option<bool>,
    idle_calm: IdleResult,
    idle_held: IdleResult,
    calm: PhaseResult,
    held: PhaseResult,
    outcome: StormOutcome,
}

/// Without the storm, then with it held: an idle window (the tick's cost) and the paced load
/// (report latency) each time, in the same repairer after the same fatal nodes.
async fn run_storm(
    options: &Options,
    workers: Vec<Worker>,
    shared: &Arc<Shared>,
    pid: u32,
    storm: Vec<usize>,
) -> StormResult {
    let paced = |start: Instant| Pace::Open {
        start,
        until: start + options.duration,
        rate: options.rate,
        connections: options.connections,
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_calm = idle_window(pid, options.idle).await;
    print_idle("idle", &idle_calm);
    let (workers, calm) = run_phase("calm", workers, shared, paced(Instant::now()), pid).await;
    print_phase(&calm);

    let open_before = breaker_open(shared.addr).await;
    let (replies_ms, refused, burst_s) = send_storm(shared.clone(), &storm).await;
    let open_after = breaker_open(shared.addr).await;
    let q = percentile;
    println!(
        "storm: {} fatal reports over {} connections at once in {:.2} s; their answers p50 \
         {:.1} ms, p99 {:.1} ms, max {:.1} ms ({refused} refused); breaker before {}, after {}",
        storm.len(),
        STORM_CONNECTIONS.min(storm.len()),
        burst_s,
        q(&replies_ms, 0.5),
        q(&replies_ms, 0.99),
        replies_ms.last().copied().unwrap_or(f64::NAN),
        open_word(open_before),
        open_word(open_after),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_held = idle_window(pid, options.idle).await;
    print_idle("idle-held", &idle_held);
    let (_workers, held) = run_phase("held", workers, shared, paced(Instant::now()), pid).await;
    print_phase(&held);
    let outcome = storm_outcome(shared.addr, &storm).await;
    println!(
        "storm nodes: {} held by the breaker, {} held by another guard rail, {} acted on (a \
         workflow began before the breaker opened), {} neither; breaker at the end {}",
        outcome.held_by_breaker,
        outcome.held_otherwise,
        outcome.acted,
        outcome.unknown,
        open_word(breaker_open(shared.addr).await),
    );
    let delta =
        idle_held.repairer_cpu_s / idle_held.wall_s - idle_calm.repairer_cpu_s / idle_calm.wall_s;
    println!(
        "storm held vs none: report p99 {:.2} ms vs {:.2} ms ({:.2}x); repairer CPU idle {:.1} vs \
         {:.1} ms per second ({:+.1} ms per 1 s tick: {:+.1} us per held node per tick)",
        held.quantile_ms(0.99),
        calm.quantile_ms(0.99),
        held.quantile_ms(0.99) / calm.quantile_ms(0.99),
        idle_held.repairer_cores() * 1000.0,
        idle_calm.repairer_cores() * 1000.0,
        delta * 1000.0,
        delta * 1e6 / storm.len().max(1) as f64,
    );
    StormResult {
        nodes: storm.len(),
        replies_ms,
        refused,
        burst_s,
        open_before,
        open_after,
        idle_calm,
        idle_held,
        calm,
        held,
        outcome,
    }
}

fn open_word(open: Option<bool>) -> &'static str {
    match open {
        Some(true) => "open",
        Some(false) => "closed",
        None => "unknown",
    }
}

/// The nearest-rank `q` quantile of sorted values (NaN when empty).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    nearest_rank(sorted, q).unwrap_or(f64::NAN)
}

// --- the run -----------------------------------------------------------------------------------

async fn run(options: Options) -> Result<(), LoadError> {
    if !options.repairer_bin.exists() {
        return Err(LoadError::Usage(format!(
            "{} is missing: cargo build --release --bin fleetmend",
            options.repairer_bin.display()
        )));
    }
    let dir = tempfile::tempdir().map_err(io("creating a temp dir"))?;
    let breaker = BreakerSettings::for_run(&options);
    let mut repairer =
        start_repairer(&options.repairer_bin, dir.path(), options.store.as_deref(), breaker)?;
    repairer.wait_ready().await?;
    let pid = repairer.pid();
    println!("machine: {}", machine());
    println!(
        "repairer: {} (pid {pid}), store {}, listening on {}",
        options.repairer_bin.display(),
        repairer.store.display(),
        repairer.addr
    );
    println!(
        "load: {} nodes ({} with a lasting warning) over {} keep-alive HTTP/1.1 connections, \
         {} load-generator thread(s); the load generator and the repairer share the machine",
        options.nodes, options.warn, options.connections, options.threads
    );
    println!(
        "breaker: opens when at least {} nodes, and more than {} of the fleet, turned unhealthy \
         within 10 min{}",
        breaker.min_nodes,
        breaker.fraction,
        if options.storm > 0 {
            format!(
                " (the {} fatal nodes of the paced phase do not open it; the first of the {} \
                 storm nodes does)",
                options.fatal, options.storm
            )
        } else {
            String::new()
        }
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = memory(pid);

    let shared = Arc::new(Shared {
        addr: repairer.addr,
        fatal: (0..options.nodes).map(|_| AtomicBool::new(false)).collect(),
        // Spread over the fleet, never a fatal node (those sit at the middle of their stride).
        warn: {
            let mut warn = vec![false; options.nodes];
            let stride = options.nodes / options.warn.max(1);
            for k in 0..options.warn {
                warn[k * stride] = true;
            }
            warn
        },
    });
    let mut workers: Vec<Worker> = (0..options.connections)
        .map(|c| Worker {
            conn: HttpConn::new(repairer.addr),
            writer: ReportWriter::new(),
            nodes: (c..options.nodes).step_by(options.connections).collect(),
            cursor: 0,
            round: 0,
        })
        .collect();
    let sample = ReportWriter::new().build(0, 1, false, false, ReportTrigger::Interval).len();
    let fatal_sample = ReportWriter::new().build(0, 1, true, false, ReportTrigger::Event).len();
    println!("report size: healthy {sample} bytes, with the Xid 79 finding {fatal_sample} bytes");

    let (w, join) = run_phase("join", workers, &shared, Pace::Join, pid).await;
    workers = w;
    print_phase(&join);
    if join.errors > 0 {
        return Err(LoadError::Repairer(format!(
            "refused {} of the first reports: {}",
            join.errors,
            join.first_error.unwrap_or_default()
        )));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let joined = memory(pid);
    let per_node = |after: u64, before: u64| {
        after.saturating_sub(before) as f64 * 1024.0 / options.nodes as f64
    };
    println!(
        "memory: VmRSS {:.1} MiB idle -> {:.1} MiB with {} nodes: {:.0} bytes per node \
         (RssAnon {:.1} -> {:.1} MiB: {:.0} bytes per node)",
        idle.rss_kib as f64 / 1024.0,
        joined.rss_kib as f64 / 1024.0,
        options.nodes,
        per_node(joined.rss_kib, idle.rss_kib),
        idle.anon_kib as f64 / 1024.0,
        joined.anon_kib as f64 / 1024.0,
        per_node(joined.anon_kib, idle.anon_kib),
    );

    let until = Instant::now() + options.duration;
    let (w, max_rate) = run_phase("max-rate", workers, &shared, Pace::Closed { until }, pid).await;
    workers = w;
    print_phase(&max_rate);

    // The fatal nodes: spread over the fleet, none of them node 0.
    let stride = options.nodes / options.fatal.max(1);
    let fatal_nodes: Vec<usize> = (0..options.fatal).map(|k| k * stride + stride / 2).collect();
    let start = Instant::now();
    let pace = Pace::Open {
        start,
        until: start + options.duration,
        rate: options.rate,
        connections: options.connections,
    };
    let storm = {
        let mut taken = shared.warn.clone();
        for &node in &fatal_nodes {
            taken[node] = true;
        }
        storm_nodes(options.nodes, options.storm, &taken)
    };
    let fatal_task = tokio::spawn(send_fatal(shared.clone(), fatal_nodes, start, options.duration));
    let (workers, paced) = run_phase("paced", workers, &shared, pace, pid).await;
    print_phase(&paced);
    let fatal_sent = fatal_task.await.unwrap_or_default();
    let after = memory(pid);
    println!(
        "memory after the load: VmRSS {:.1} MiB, RssAnon {:.1} MiB",
        after.rss_kib as f64 / 1024.0,
        after.anon_kib as f64 / 1024.0
    );

    let (drains, matched) = drain_latencies(repairer.addr, &fatal_sent).await;
    let mut drain_ms: Vec<f64> = drains.iter().flatten().copied().collect();
    drain_ms.sort_by(f64::total_cmp);
    let mut replies: Vec<f64> = fatal_sent.iter().map(|f| f.reply_ms).collect();
    replies.sort_by(f64::total_cmp);
    let refused = fatal_sent.iter().filter(|f| f.status != Some(200)).count();
    let q = percentile;
    println!(
        "fatal finding -> drain call: {} of {} nodes drained; from sending the report to the \
         drain (audit log, ms resolution): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; the fatal \
         report's own answer: p50 {:.1} ms, p99 {:.1} ms ({} refused); drain seen as the first \
         workflow-step event, e.g. {}",
        drain_ms.len(),
        fatal_sent.len(),
        q(&drain_ms, 0.5),
        q(&drain_ms, 0.99),
        drain_ms.last().copied().unwrap_or(f64::NAN),
        q(&replies, 0.5),
        q(&replies, 0.99),
        refused,
        matched.as_deref().unwrap_or("none"),
    );
    let histogram = drain_histogram(repairer.addr).await;
    if let Some((count, fast, sum)) = histogram {
        println!(
            "fleetmend_time_to_drain_seconds (first_seen at ingest -> drain call): {count} \
             observations, {:.1} % within 0.1 s, mean {:.1} ms",
            if count > 0.0 { fast / count * 100.0 } else { f64::NAN },
            if count > 0.0 { sum / count * 1000.0 } else { f64::NAN },
        );
    }
    // The size of a SQLite store; a PostgreSQL database's is the server's business.
    let store_bytes = options.store.is_none().then(|| {
        std::fs::metadata(&repairer.store).map(|m| m.len()).unwrap_or(0)
            + std::fs::metadata(repairer.store.with_extension("db-wal"))
                .map(|m| m.len())
                .unwrap_or(0)
    });
    if let Some(bytes) = store_bytes {
        println!("store: {:.1} MiB (db + WAL)", bytes as f64 / 1048576.0);
    }
    let storm = if options.storm > 0 {
        Some(run_storm(&options, workers, &shared, pid, storm).await)
    } else {
        None
    };
    repairer.stop();

    if let Some(path) = &options.json {
        let phase = |p: &PhaseResult| {
            serde_json::json!({
                "wall_s": p.wall_s, "requests": p.requests, "errors": p.errors,
                "reports_per_s": p.rate(),
                "p50_ms": p.quantile_ms(0.5), "p99_ms": p.quantile_ms(0.99),
                "p999_ms": p.quantile_ms(0.999),
                "max_ms": p.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
                "repairer_cores": p.repairer_cpu_s / p.wall_s,
                "loadgen_cores": p.loadgen_cpu_s / p.wall_s,
                "machine_cores": p.machine_cpu_s / p.wall_s,
            })
        };
        let json = serde_json::json!({
            "machine": machine(),
            "store": if options.store.is_some() { "postgres" } else { "sqlite" },
            "nodes": options.nodes, "connections": options.connections,
            "threads": options.threads, "rate": options.rate, "warn": options.warn, "duration_s": options.duration.as_secs_f64(),
            "storm_nodes": options.storm, "idle_s": options.idle.as_secs_f64(),
            "breaker": {"fraction": breaker.fraction, "min_nodes": breaker.min_nodes},
            "report_bytes": sample,
            "memory": {
                "idle_rss_kib": idle.rss_kib, "joined_rss_kib": joined.rss_kib,
                "idle_anon_kib": idle.anon_kib, "joined_anon_kib": joined.anon_kib,
                "after_rss_kib": after.rss_kib,
                "rss_bytes_per_node": per_node(joined.rss_kib, idle.rss_kib),
            },
            "join": phase(&join), "max_rate": phase(&max_rate), "paced": phase(&paced),
            "fatal": {
                "sent": fatal_sent.len(), "drained": drain_ms.len(),
                "drain_p50_ms": q(&drain_ms, 0.5), "drain_p99_ms": q(&drain_ms, 0.99),
                "reply_p50_ms": q(&replies, 0.5), "reply_p99_ms": q(&replies, 0.99),
                "histogram": histogram.map(|(c, f, s)| serde_json::json!({"count": c, "le_0_1": f, "sum": s})),
            },
            "store_bytes": store_bytes,
            "storm": storm.as_ref().map(|s| {
                let idle = |i: &IdleResult| serde_json::json!({
                    "wall_s": i.wall_s, "repairer_cpu_s": i.repairer_cpu_s,
                    "repairer_cores": i.repairer_cores(),
                    "machine_cores": i.machine_cpu_s / i.wall_s,
                });
                serde_json::json!({
                    "nodes": s.nodes, "refused": s.refused, "burst_s": s.burst_s,
                    "reply_p50_ms": percentile(&s.replies_ms, 0.5),
                    "reply_p99_ms": percentile(&s.replies_ms, 0.99),
                    "breaker_open_before": s.open_before, "breaker_open_after": s.open_after,
                    "held_by_breaker": s.outcome.held_by_breaker,
                    "held_otherwise": s.outcome.held_otherwise,
                    "acted": s.outcome.acted, "unknown": s.outcome.unknown,
                    "idle_calm": idle(&s.idle_calm), "idle_held": idle(&s.idle_held),
                    "calm": phase(&s.calm), "held": phase(&s.held),
                })
            }),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&json).unwrap_or_default())
            .map_err(io(format!("writing {}", path.display())))?;
    }
    let storm_errors = storm.as_ref().map_or(0, |s| s.calm.errors + s.held.errors);
    if max_rate.errors + paced.errors + storm_errors > 0 {
        let storm_error = storm.and_then(|s| s.calm.first_error.or(s.held.first_error));
        return Err(LoadError::Repairer(format!(
            "refused {} reports under load: {}",
            max_rate.errors + paced.errors + storm_errors,
            max_rate.first_error.or(paced.first_error).or(storm_error).unwrap_or_default()
        )));
    }
    Ok(())
}

fn print_phase(p: &PhaseResult) {
    let mut line = String::new();
    let _ = write!(
        line,
        "{:9} {:>8} reports in {:5.1} s = {:>7.0}/s; latency p50 {:6.2} ms, p99 {:6.2} ms, \
         p999 {:6.2} ms, max {:6.1} ms; CPU: repairer {:.2} cores, load generator {:.2} cores, \
         whole machine {:.2} cores",
        p.name,
        p.requests,
        p.wall_s,
        p.rate(),
        p.quantile_ms(0.5),
        p.quantile_ms(0.99),
        p.quantile_ms(0.999),
        p.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
        p.repairer_cpu_s / p.wall_s,
        p.loadgen_cpu_s / p.wall_s,
        p.machine_cpu_s / p.wall_s,
    );
    let slow: Vec<String> = p
        .slow_by_second
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(second, n)| format!("{second}s:{n}"))
        .collect();
    if !slow.is_empty() {
        let _ = write!(
            line,
            "\n          answers over {} ms by second of the phase: {}",
            SLOW.as_millis(),
            slow.join(" ")
        );
    }
    if p.errors > 0 {
        let _ = write!(
            line,
            "; {} errors, first: {}",
            p.errors,
            p.first_error.as_deref().unwrap_or("")
        );
    }
    println!("{line}");
}
