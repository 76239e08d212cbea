//! Soak of the repairer: a fleet of simulated agents against the release `fleetmend repairer` on
//! loopback for minutes, with faults throughout, the repairer killed with SIGKILL half-way and
//! restarted on the same store, and the store's filesystem full for a while.
//!
//! Every agent keeps its own keep-alive connection and reports as the real agent does: a report
//! every interval (10 s, the agent's default) with a little jitter, starts spread over the first
//! interval; a refused or failed report is retried with capped exponential backoff and jitter, or
//! after `Retry-After` when the answer names one, and the retry carries the newest state. Agents
//! act on the commands in the replies: `reboot` takes the node down for `REBOOT_DOWN` and it comes
//! back with a new boot id and the fault gone; `deep-check` is answered with a passing result.
//!
//! Faults: `--faults` distinct nodes, spread over the middle of the run, each sends an Xid 79
//! ("GPU has fallen off the bus") report at once and carries the finding until it reboots.
//!
//! Timeline (T = `--minutes`): warm-up until min(2 min, T/5); the store's filesystem full (a filler
//! file written by this program into `--store-dir`, which the caller mounted as a small
//! filesystem of its own) from T/5 for min(1 min, T/4); SIGKILL at T/2 and a restart at once on
//! the same store and port; the end at T. Then, with the load stopped, the event log is read whole
//! (`GET /v1/events`, paged) and checked:
//! - no event lost: every action the agents saw (a reboot command; the fatal report accepted) is
//!   in the log, and the event ids have no gaps;
//! - each faulted node acted on exactly once: one repair workflow, one drain;
//! - the repairer's RSS grew less than 5 % after warm-up, in each of its two lives (mean of the
//!   first 15 s after warm-up against the mean of the last 15 s; the second life's warm-up is as
//!   long as the first's, from the restart);
//! - report latency p99 (per second, from the agents' own timing) back under 50 ms within 30 s of
//!   the SIGKILL, and staying there for 10 s.
//!
//! Prints a summary table and exits non-zero when a check fails. Built only when asked (`cargo
//! bench`), never by `cargo test`: `scripts/soak` builds it and the repairer in release and runs
//! it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fleetmend_proto::backoff::Backoff;
use fleetmend_proto::stats::nearest_rank;
use fleetmend_proto::{
    CheckRun, CommandResult, Report, ReportReply, ReportTrigger, Status, Verdict, WIRE_VERSION,
    command_kind,
};
use fleetmend_repairer::model::{Event, EventKind, NodeState};

use common::{
    HttpConn, LoadError, RepairerProcess, boot_id, fatal_finding, free_loopback_addr, io, machine,
    memory, node_name, unix_ms_f64,
};

const AGENT_TOKEN: &str = "soak-agent-token";
const ADMIN_TOKEN: &str = "soak-admin-token";
/// The agent's defaults (`[report] interval`, `backoff_initial`, `backoff_max`).
const INTERVAL: Duration = Duration::from_secs(10);
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a rebooting node is silent (below the repairer's 3 intervals of silence before a
/// node is unreachable).
const REBOOT_DOWN: Duration = Duration::from_secs(20);
/// How long a deep check takes on the node.
const DEEP_CHECK_TIME: Duration = Duration::from_secs(2);
/// The latency goal after the restart, and how long it must hold to count as recovered.
const P99_GOAL_MS: f64 = 50.0;
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);
const RECOVERY_HOLD_S: usize = 10;
/// RSS growth allowed after warm-up, and the averaging window at each end.
const RSS_GROWTH_LIMIT: f64 = 0.05;
const RSS_WINDOW: Duration = Duration::from_secs(15);
/// After the load stopped, how long the last faults' repairs may take to show in the log.
const SETTLE_WAIT: Duration = Duration::from_secs(90);

/// Command-line options (`--name value`); `cargo bench` adds `--bench`, which is ignored.
#[derive(Debug, Clone)]
struct Options {
    repairer_bin: PathBuf,
    /// The directory of the store: on a small filesystem of its own, filled for the disk-full
    /// window.
    store_dir: PathBuf,
    nodes: usize,
    duration: Duration,
    faults: usize,
    json: Option<PathBuf>,
}

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> Result<Options, LoadError> {
        let mut options = Options {
            repairer_bin: PathBuf::new(),
            store_dir: PathBuf::new(),
            nodes: 10_000,
            duration: Duration::from_secs(600),
            faults: 300,
            json: None,
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
                "--store-dir" => options.store_dir = PathBuf::from(value(&arg)?),
                "--nodes" => options.nodes = number(&arg, value(&arg)?)? as usize,
                "--minutes" => {
                    options.duration = Duration::from_secs_f64(number(&arg, value(&arg)?)? * 60.0)
                }
                "--faults" => options.faults = number(&arg, value(&arg)?)? as usize,
                "--json" => options.json = Some(PathBuf::from(value(&arg)?)),
                "-h" | "--help" => {
                    return Err(LoadError::Usage(
                        "soak --repairer-bin PATH --store-dir DIR [--nodes 10000] [--minutes 10] \
                         [--faults 300] [--json FILE]"
                            .to_owned(),
                    ));
                }
                other => return Err(LoadError::Usage(format!("unknown option {other:?}"))),
            }
        }
        if options.repairer_bin.as_os_str().is_empty() || options.store_dir.as_os_str().is_empty() {
            return Err(LoadError::Usage("--repairer-bin and --store-dir are needed".to_owned()));
        }
        if options.faults > options.nodes / 10 {
            return Err(LoadError::Usage("--faults must be at most a tenth of --nodes".to_owned()));
        }
        if options.duration < Duration::from_secs(60) {
            return Err(LoadError::Usage("--minutes must be at least 1".to_owned()));
        }
        Ok(options)
    }
}

/// When things happen, from the start of the load.
#[derive(Debug, Clone, Copy)]
struct Timeline {
    warm_up: Duration,
    full_from: Duration,
    full_until: Duration,
    kill_at: Duration,
    end: Duration,
}

impl Timeline {
    fn of(total: Duration) -> Timeline {
        let warm_up = (total / 5).min(Duration::from_secs(120));
        let full_from = total / 5;
        Timeline {
            warm_up,
            full_from,
            full_until: full_from + (total / 4).min(Duration::from_secs(60)),
            kill_at: total / 2,
            end: total,
        }
    }

    fn phases(&self, restart_window: Duration) -> Vec<(&'static str, Duration, Duration)> {
        vec![
            ("warm-up", Duration::ZERO, self.warm_up),
            ("steady", self.warm_up, self.full_from),
            ("disk full", self.full_from, self.full_until),
            ("after full", self.full_until, self.kill_at),
            ("restart", self.kill_at, self.kill_at + restart_window),
            ("after restart", self.kill_at + restart_window, self.end),
        ]
    }
}

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("soak: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("soak: starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            result = run(options) => result,
            signal = stopped() => Err(LoadError::Usage(format!("stopped by {signal}"))),
        }
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("soak: a check failed");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("soak: {err}");
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

/// Raises the soft limit on open descriptors to the hard one: one socket per agent.
fn raise_nofile(needed: u64) -> Result<(), LoadError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| LoadError::Usage(format!("reading RLIMIT_NOFILE: {e}")))?;
    if soft < needed {
        if hard < needed {
            return Err(LoadError::Usage(format!(
                "{needed} descriptors are needed (one socket per agent) and the hard limit is \
                 {hard}: raise it (ulimit -Hn) or use fewer --nodes"
            )));
        }
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
            .map_err(|e| LoadError::Usage(format!("raising RLIMIT_NOFILE to {hard}: {e}")))?;
    }
    Ok(())
}

fn repairer_config(addr: std::net::SocketAddr, store: &Path, nodes: usize) -> String {
    // Guard rails so that every injected fault is acted on: repairs at once and the unavailable
    // share far above the few faulted nodes in flight at a time; the breaker only past a tenth of
    // the fleet turning unhealthy in its window (the faults are a few percent over the whole
    // run). Evidence is not asked for (the simulated agents gather none). The rate limit per
    // node is the shipped default: agents at their real cadence stay far below it.
    format!(
        "listen = \"{addr}\"\n\
         store = \"{}\"\n\
         agent_token = \"{AGENT_TOKEN}\"\n\
         admin_token = \"{ADMIN_TOKEN}\"\n\
         scheduler = \"memory\"\n\
         [listener]\n\
         max_connections = {}\n\
         [policy]\n\
         mode = \"enforce\"\n\
         [policy.guard_rails]\n\
         max_concurrent_repairs = 100000\n\
         max_unavailable_fraction = 0.10\n\
         breaker_fraction = 0.10\n\
         breaker_min_nodes = 100000\n\
         breaker_window = \"10m\"\n\
         [engine]\n\
         report_interval = \"10s\"\n\
         [engine.workflow]\n\
         evidence_timeout = \"0s\"\n",
        store.display(),
        nodes + 1024,
    )
}

// --- the agents --------------------------------------------------------------------------------

/// One request's outcome, by when it finished.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// ms from the start of the load to the answer.
    at_ms: u32,
    latency_us: u32,
    /// 200: accepted; 0: no answer (refused connection, reset, timeout); else the status.
    status: u16,
}

/// What an agent saw the repairer do, for the check against the event log.
#[derive(Debug, Clone)]
struct Seen {
    node: usize,
    what: SeenKind,
    at_unix_ms: f64,
}

#[derive(Debug, Clone, PartialEq)]
enum SeenKind {
    /// The first accepted report carrying the fatal finding.
    FatalAccepted,
    /// A reboot command arrived.
    Reboot,
    /// A deep-check command arrived.
    DeepCheck,
}

struct Shared {
    addr: std::net::SocketAddr,
    start: Instant,
    end: Instant,
    samples: Mutex<Vec<Sample>>,
    seen: Mutex<Vec<Seen>>,
    /// Fatal reports refused or unanswered before one was accepted.
    fatal_retries: AtomicU32,
}

impl Shared {
    fn note(&self, sample: Sample) {
        self.samples.lock().unwrap_or_else(PoisonError::into_inner).push(sample);
    }

    fn saw(&self, node: usize, what: SeenKind) {
        let seen = Seen { node, what, at_unix_ms: unix_ms_f64() };
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).push(seen);
    }
}

fn checks() -> Vec<CheckRun> {
    let check = |name: &str, seconds: f64| CheckRun {
        check: name.to_owned(),
        status: Status::Ok,
        duration_seconds: seconds,
        timed_out: false,
        finished_at_ms: 0,
    };
    vec![
        check("gpu", 0.0213),
        check("kernel_log", 0.0004),
        check("nic", 0.0011),
        check("disk", 0.0032),
        check("host", 0.0007),
    ]
}

/// The agent's retry delays: doubling from `BACKOFF_INITIAL` up to `BACKOFF_MAX`, half of each
/// fixed, half random; after a refusal, at least what it asked for.
const BACKOFF: Backoff = Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX);

/// One simulated agent until the end of the load.
async fn agent(index: usize, fault_at: Option<Instant>, shared: Arc<Shared>) {
    let mut conn = HttpConn::lean(shared.addr);
    let mut report = Report {
        wire_version: WIRE_VERSION,
        node: String::new(),
        boot_id: String::new(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        seq: 0,
        sent_at_ms: 0,
        trigger: ReportTrigger::Startup,
        verdict: Verdict::Healthy,
        checks: checks(),
        findings: Vec::new(),
        command_results: Vec::new(),
        address: None,
        ranks: Vec::new(),
        metrics_port: None,
    };
    node_name(index, &mut report.node);
    let mut boots = 0usize;
    boot_id(index, &mut report.boot_id);
    let mut body = Vec::new();
    let mut fault_pending = fault_at;
    let mut faulty = false;
    let mut fatal_accepted = false;
    let mut reboot_at: Option<Instant> = None;
    let mut done_ids: BTreeSet<String> = BTreeSet::new();
    let mut failures = 0u32;
    // Starts spread over the first interval.
    let mut next = shared.start + INTERVAL.mul_f64(fastrand::f64());
    loop {
        // The next report: on the interval, at once for a fault, after a reboot.
        let mut due = next;
        if let Some(at) = fault_pending {
            due = due.min(at);
        }
        if let Some(at) = reboot_at {
            due = due.max(at);
        }
        if due >= shared.end {
            return;
        }
        tokio::time::sleep_until(due.into()).await;
        if let Some(at) = reboot_at
            && Instant::now() >= at
        {
            // Back from the reboot: a new boot, the GPU back on the bus, a new agent process.
            reboot_at = None;
            boots += 1;
            boot_id(index + boots * 1_000_000_007, &mut report.boot_id);
            faulty = false;
            report.seq = 0;
            report.trigger = ReportTrigger::Startup;
            conn = HttpConn::lean(shared.addr);
        }
        if let Some(at) = fault_pending
            && Instant::now() >= at
        {
            fault_pending = None;
            faulty = true;
            report.trigger = ReportTrigger::Event;
        }
        report.seq += 1;
        let now_ms = unix_ms_f64() as u64;
        report.sent_at_ms = now_ms;
        for (i, check) in report.checks.iter_mut().enumerate() {
            check.finished_at_ms = now_ms.saturating_sub(50 + 700 * i as u64);
            check.status = Status::Ok;
        }
        report.findings.clear();
        report.verdict = Verdict::Healthy;
        if faulty {
            report.findings.push(fatal_finding());
            report.checks[0].status = Status::Fail;
            report.verdict = Verdict::Unhealthy;
        }
        body.clear();
        // Serializing a struct of strings and numbers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut body, &report);
        let began = Instant::now();
        let result = conn.request("POST", "/v1/reports", AGENT_TOKEN, &body).await;
        let latency = began.elapsed();
        let status = *result.as_ref().unwrap_or(&0);
        shared.note(Sample {
            at_ms: shared.start.elapsed().as_millis().min(u32::MAX as u128) as u32,
            latency_us: latency.as_micros().min(u32::MAX as u128) as u32,
            status,
        });
        if status != 200 {
            if faulty && !fatal_accepted {
                shared.fatal_retries.fetch_add(1, Ordering::Relaxed);
            }
            failures += 1;
            let wait = match conn.retry_after() {
                Some(secs) if status != 0 => {
                    BACKOFF.after_asked(Duration::from_secs(secs), fastrand::f64())
                }
                _ => BACKOFF.delay(failures, fastrand::f64()),
            };
            next = Instant::now() + wait;
            continue;
        }
        failures = 0;
        if faulty && !fatal_accepted {
            fatal_accepted = true;
            shared.saw(index, SeenKind::FatalAccepted);
        }
        report.command_results.clear();
        report.trigger = ReportTrigger::Interval;
        // Every interval, with the drift of a timer that restarts after each answer.
        next = Instant::now() + INTERVAL.mul_f64(0.98 + 0.04 * fastrand::f64());
        let reply: ReportReply = serde_json::from_slice(conn.body()).unwrap_or_default();
        for command in reply.commands {
            // The agent runs a command id once.
            if !done_ids.insert(command.id.clone()) {
                continue;
            }
            match command.kind.as_str() {
                command_kind::REBOOT => {
                    shared.saw(index, SeenKind::Reboot);
                    reboot_at = Some(Instant::now() + REBOOT_DOWN);
                }
                command_kind::DEEP_CHECK => {
                    shared.saw(index, SeenKind::DeepCheck);
                    report.command_results.push(CommandResult {
                        id: command.id,
                        kind: command.kind,
                        ok: true,
                        message: "healthy".to_owned(),
                        verdict: Some(Verdict::Healthy),
                        findings: Vec::new(),
                        evidence: None,
                        allreduce: None,
                        finished_at_ms: unix_ms_f64() as u64,
                    });
                    report.trigger = ReportTrigger::Command;
                    next = next.min(Instant::now() + DEEP_CHECK_TIME);
                }
                _ => {
                    report.command_results.push(CommandResult {
                        id: command.id,
                        kind: command.kind,
                        ok: false,
                        message: "not run by the soak's agents".to_owned(),
                        verdict: None,
                        findings: Vec::new(),
                        evidence: None,
                        allreduce: None,
                        finished_at_ms: unix_ms_f64() as u64,
                    });
                    report.trigger = ReportTrigger::Command;
                    next = Instant::now();
                }
            }
        }
    }
}

// --- the store's filesystem --------------------------------------------------------------------

/// Fills the filesystem at `dir` to its last byte; returns the filler's path.
fn fill(dir: &Path) -> Result<PathBuf, LoadError> {
    let path = dir.join("soak-filler");
    let mut file =
        std::fs::File::create(&path).map_err(io(format!("creating {}", path.display())))?;
    let block = vec![0u8; 1 << 20];
    for size in [1 << 20, 64 * 1024, 4096, 512, 1] {
        loop {
            match file.write(&block[..size]) {
                Ok(0) => break,
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32) => break,
                Err(err) => return Err(io(format!("filling {}", dir.display()))(err)),
            }
        }
    }
    Ok(path)
}

/// Free bytes of the filesystem at `dir`.
fn free_bytes(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir).map(|s| s.blocks_available() * s.fragment_size()).unwrap_or(0)
}

// --- the run -----------------------------------------------------------------------------------

/// A reading of the repairer's RSS.
#[derive(Debug, Clone, Copy)]
struct RssSample {
    at: Duration,
    /// 0: the first process, 1: the one started after the SIGKILL.
    life: usize,
    kib: u64,
}

async fn run(options: Options) -> Result<bool, LoadError> {
    if !options.repairer_bin.exists() {
        return Err(LoadError::Usage(format!(
            "{} is missing: cargo build --release --bin fleetmend",
            options.repairer_bin.display()
        )));
    }
    raise_nofile(options.nodes as u64 + 1024)?;
    let work = tempfile::tempdir().map_err(io("creating a temp dir"))?;
    let store = options.store_dir.join("repairer.db");
    let addr = free_loopback_addr()?;
    let config = work.path().join("repairer.toml");
    std::fs::write(&config, repairer_config(addr, &store, options.nodes))
        .map_err(io(format!("writing {}", config.display())))?;
    let log = options
        .json
        .as_ref()
        .map(|j| j.with_extension("repairer.log"))
        .unwrap_or_else(|| work.path().join("repairer.log"));
    let mut repairer =
        RepairerProcess::spawn(&options.repairer_bin, &config, &log, addr, store.clone())?;
    repairer.wait_ready().await?;
    let timeline = Timeline::of(options.duration);
    println!("machine: {}", machine());
    println!(
        "repairer: {} (pid {}), store {} ({:.0} MiB free on its filesystem), log {}",
        options.repairer_bin.display(),
        repairer.pid(),
        store.display(),
        free_bytes(&options.store_dir) as f64 / 1048576.0,
        log.display()
    );
    let secs = |d: Duration| d.as_secs_f64();
    println!(
        "load: {} agents, one keep-alive connection each, a report every {} s (jitter 2 %, \
         backoff {}..{} s, Retry-After honoured); {} Xid 79 faults on distinct nodes from {:.0} s to \
         {:.0} s",
        options.nodes,
        INTERVAL.as_secs(),
        secs(BACKOFF_INITIAL),
        secs(BACKOFF_MAX),
        options.faults,
        secs(options.duration.mul_f64(0.05)),
        secs(options.duration.mul_f64(0.75)),
    );
    println!(
        "timeline: warm-up to {:.0} s; store's filesystem full {:.0}..{:.0} s; SIGKILL and restart \
         at {:.0} s; end at {:.0} s",
        secs(timeline.warm_up),
        secs(timeline.full_from),
        secs(timeline.full_until),
        secs(timeline.kill_at),
        secs(timeline.end)
    );

    let start = Instant::now() + Duration::from_millis(200);
    let shared = Arc::new(Shared {
        addr,
        start,
        end: start + options.duration,
        samples: Mutex::new(Vec::with_capacity(options.nodes * 70)),
        seen: Mutex::new(Vec::new()),
        fatal_retries: AtomicU32::new(0),
    });
    let stride = options.nodes / options.faults.max(1);
    let faults: BTreeMap<usize, Duration> = (0..options.faults)
        .map(|k| {
            let at = options.duration.mul_f64(0.05 + 0.70 * k as f64 / options.faults as f64);
            (k * stride + stride / 2, at)
        })
        .collect();
    let mut agents = tokio::task::JoinSet::new();
    for index in 0..options.nodes {
        let fault_at = faults.get(&index).map(|at| start + *at);
        agents.spawn(agent(index, fault_at, shared.clone()));
    }

    // The conductor: RSS every second, the filler, the SIGKILL.
    let mut rss: Vec<RssSample> = Vec::new();
    let mut life = 0;
    let mut filler: Option<PathBuf> = None;
    let mut filled_bytes = 0u64;
    let mut restart: Option<(Duration, Duration)> = None;
    let mut tick = tokio::time::interval_at(start.into(), Duration::from_secs(1));
    loop {
        tick.tick().await;
        let at = start.elapsed();
        if at >= timeline.end {
            break;
        }
        rss.push(RssSample { at, life, kib: memory(repairer.pid()).rss_kib });
        if filler.is_none() && filled_bytes == 0 && at >= timeline.full_from {
            let free = free_bytes(&options.store_dir);
            let dir = options.store_dir.clone();
            let path = tokio::task::spawn_blocking(move || fill(&dir))
                .await
                .map_err(|e| LoadError::Usage(format!("the filler failed: {e}")))??;
            filled_bytes = free;
            println!(
                "{:6.1} s: the store's filesystem filled ({:.0} MiB written, {} bytes free)",
                secs(start.elapsed()),
                free as f64 / 1048576.0,
                free_bytes(&options.store_dir)
            );
            filler = Some(path);
        }
        if let Some(path) = &filler
            && at >= timeline.full_until
        {
            std::fs::remove_file(path).map_err(io(format!("removing {}", path.display())))?;
            println!("{:6.1} s: the filler removed", secs(start.elapsed()));
            filler = None;
        }
        if restart.is_none() && at >= timeline.kill_at {
            repairer.kill();
            let killed = start.elapsed();
            repairer =
                RepairerProcess::spawn(&options.repairer_bin, &config, &log, addr, store.clone())?;
            repairer.wait_ready().await?;
            let ready = start.elapsed();
            life = 1;
            println!(
                "{:6.1} s: SIGKILL; the new repairer (pid {}) answered /healthz {:.2} s later",
                secs(killed),
                repairer.pid(),
                secs(ready - killed)
            );
            restart = Some((killed, ready));
        }
    }
    // The agents stop at the end; a request under way finishes within its timeout.
    let joined = tokio::time::timeout(common::REQUEST_TIMEOUT * 2, async {
        while agents.join_next().await.is_some() {}
    })
    .await;
    if joined.is_err() {
        agents.abort_all();
        println!("some agents were still sending {:?} after the end", common::REQUEST_TIMEOUT * 2);
    }
    let (killed, ready) = restart.unwrap_or((timeline.kill_at, timeline.kill_at));

    let seen = shared.seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let fatal_nodes: BTreeSet<usize> =
        seen.iter().filter(|s| s.what == SeenKind::FatalAccepted).map(|s| s.node).collect();
    let events = settled_events(addr, &fatal_nodes).await?;
    let mut samples =
        std::mem::take(&mut *shared.samples.lock().unwrap_or_else(PoisonError::into_inner));
    samples.sort_by_key(|s| s.at_ms);

    let mut verdicts: Vec<(String, bool, String)> = Vec::new();
    summarize_load(&samples, &timeline, killed, options.nodes);
    verdicts.push(check_events(&events));
    verdicts.push(check_seen(&events, &seen));
    verdicts.push(check_faults(
        &events,
        &faults,
        &fatal_nodes,
        shared.fatal_retries.load(Ordering::Relaxed),
    ));
    verdicts.extend(check_rss(&rss, &timeline, ready));
    verdicts.push(check_recovery(&samples, killed, ready));
    println!();
    println!("{:10} {:7} detail", "check", "verdict");
    let mut all = true;
    for (name, ok, detail) in &verdicts {
        all &= ok;
        println!("{name:10} {:7} {detail}", if *ok { "ok" } else { "FAILED" });
    }
    if let Some(path) = &options.json {
        let json = serde_json::json!({
            "machine": machine(),
            "nodes": options.nodes,
            "minutes": options.duration.as_secs_f64() / 60.0,
            "faults": options.faults,
            "killed_s": killed.as_secs_f64(),
            "ready_s": ready.as_secs_f64(),
            "rss": rss.iter().map(|r| serde_json::json!([r.at.as_secs_f64(), r.life, r.kib])).collect::<Vec<_>>(),
            "checks": verdicts.iter().map(|(n, ok, d)| serde_json::json!({"check": n, "ok": ok, "detail": d})).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&json).unwrap_or_default())
            .map_err(io(format!("writing {}", path.display())))?;
    }
    repairer.stop();
    Ok(all)
}

// --- the event log -----------------------------------------------------------------------------

/// The whole event log, read in pages (`GET /v1/events?after=ID`).
async fn read_events(conn: &mut HttpConn) -> Result<Vec<Event>, LoadError> {
    const PAGE: usize = 5000;
    let mut events: Vec<Event> = Vec::new();
    loop {
        let after = events.last().map_or(0, |e| e.id);
        let path = format!("/v1/events?after={after}&limit={PAGE}");
        let status = conn.request("GET", &path, ADMIN_TOKEN, b"").await?;
        if status != 200 {
            return Err(LoadError::Protocol {
                what: format!("GET {path}"),
                message: format!("status {status}: {}", String::from_utf8_lossy(conn.body())),
            });
        }
        let page: Vec<Event> = serde_json::from_slice(conn.body()).map_err(|e| {
            LoadError::Protocol { what: format!("GET {path}"), message: e.to_string() }
        })?;
        let full = page.len() == PAGE;
        events.extend(page);
        if !full {
            return Ok(events);
        }
    }
}

fn drained(events: &[Event], node: &str) -> usize {
    events
        .iter()
        .filter(|e| {
            e.kind == EventKind::StateChanged
                && e.node.as_deref() == Some(node)
                && e.to_state == Some(NodeState::Draining)
        })
        .count()
}

/// The event log once every node whose fatal report was accepted has its drain in it (or
/// `SETTLE_WAIT` passed).
async fn settled_events(
    addr: std::net::SocketAddr,
    fatal: &BTreeSet<usize>,
) -> Result<Vec<Event>, LoadError> {
    let mut conn = HttpConn::new(addr);
    let deadline = Instant::now() + SETTLE_WAIT;
    let mut name = String::new();
    loop {
        let events = read_events(&mut conn).await?;
        let missing = fatal
            .iter()
            .filter(|&&node| {
                node_name(node, &mut name);
                drained(&events, &name) == 0
            })
            .count();
        if missing == 0 || Instant::now() > deadline {
            return Ok(events);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

type Verdict3 = (String, bool, String);

/// Event ids have no gaps.
fn check_events(events: &[Event]) -> Verdict3 {
    let mut gaps = Vec::new();
    for pair in events.windows(2) {
        if pair[1].id != pair[0].id + 1 {
            gaps.push(format!("{}..{}", pair[0].id, pair[1].id));
        }
    }
    let first = events.first().map_or(0, |e| e.id);
    let last = events.last().map_or(0, |e| e.id);
    let ok = gaps.is_empty() && first == 1;
    let mut detail = format!("{} events, ids {first}..{last}", events.len());
    if !gaps.is_empty() {
        let _ = write!(
            detail,
            "; gaps after {}",
            gaps.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
        );
    }
    ("event ids".to_owned(), ok, detail)
}

/// Every action an agent saw is in the log: an accepted fatal report its decision, a
/// reboot command its workflow's `step AwaitBoot`, a deep check its `step Validate`.
fn check_seen(events: &[Event], seen: &[Seen]) -> Verdict3 {
    let mut by_node: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for event in events {
        if let Some(node) = &event.node {
            by_node.entry(node.as_str()).or_default().push(event);
        }
    }
    let mut name = String::new();
    let mut missing = Vec::new();
    let mut counts = [0usize; 3];
    for s in seen {
        node_name(s.node, &mut name);
        let of_node = by_node.get(name.as_str()).map(Vec::as_slice).unwrap_or_default();
        let (slot, found) = match s.what {
            SeenKind::FatalAccepted => (0, of_node.iter().any(|e| e.kind == EventKind::Decision)),
            SeenKind::Reboot => (
                1,
                of_node
                    .iter()
                    .any(|e| e.kind == EventKind::WorkflowStep && e.reason == "step AwaitBoot"),
            ),
            SeenKind::DeepCheck => (
                2,
                of_node
                    .iter()
                    .any(|e| e.kind == EventKind::WorkflowStep && e.reason == "step Validate"),
            ),
        };
        counts[slot] += 1;
        if !found {
            missing.push(format!("{name} {:?} at {:.0}", s.what, s.at_unix_ms));
        }
    }
    let mut detail = format!(
        "seen by the agents: {} fatal reports accepted, {} reboot commands, {} deep checks; \
         missing from the log: {}",
        counts[0],
        counts[1],
        counts[2],
        missing.len()
    );
    if !missing.is_empty() {
        let _ =
            write!(detail, " ({})", missing.iter().take(5).cloned().collect::<Vec<_>>().join("; "));
    }
    ("no loss".to_owned(), missing.is_empty(), detail)
}

/// Each faulted node: its fatal report accepted, one repair workflow, one drain; no other node
/// drained.
fn check_faults(
    events: &[Event],
    faults: &BTreeMap<usize, Duration>,
    accepted: &BTreeSet<usize>,
    fatal_retries: u32,
) -> Verdict3 {
    let mut workflows: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    let mut drains: BTreeMap<&str, usize> = BTreeMap::new();
    let mut finished: BTreeMap<&str, usize> = BTreeMap::new();
    for event in events {
        let Some(node) = event.node.as_deref() else { continue };
        if let Some(id) = event.workflow {
            workflows.entry(node).or_default().insert(id);
        }
        if event.kind == EventKind::StateChanged && event.to_state == Some(NodeState::Draining) {
            *drains.entry(node).or_default() += 1;
        }
        if event.kind == EventKind::RepairFinished {
            *finished.entry(node).or_default() += 1;
        }
    }
    let mut name = String::new();
    let mut problems = Vec::new();
    let mut repaired = 0;
    let mut once = 0;
    for node in faults.keys() {
        node_name(*node, &mut name);
        let w = workflows.get(name.as_str()).map_or(0, BTreeSet::len);
        let d = drains.get(name.as_str()).copied().unwrap_or(0);
        repaired += finished.get(name.as_str()).copied().unwrap_or(0).min(1);
        if accepted.contains(node) && w == 1 && d == 1 {
            once += 1;
        } else {
            problems.push(format!(
                "{name}: fatal report {}, {w} workflows, {d} drains",
                if accepted.contains(node) { "accepted" } else { "never accepted" }
            ));
        }
    }
    let faulted: BTreeSet<String> = faults
        .keys()
        .map(|n| {
            node_name(*n, &mut name);
            name.clone()
        })
        .collect();
    let others: Vec<&&str> = drains.keys().filter(|n| !faulted.contains(**n)).collect();
    for node in others.iter().take(5) {
        problems.push(format!("{node}: drained without a fault"));
    }
    let mut detail = format!(
        "{} faulted nodes: {} fatal reports accepted ({fatal_retries} refused or unanswered \
         first and retried), each exactly one workflow and one drain: {}; repairs finished {repaired}; \
         other nodes drained {}",
        faults.len(),
        accepted.len(),
        once,
        others.len()
    );
    if !problems.is_empty() {
        let _ = write!(
            detail,
            " ({})",
            problems.iter().take(8).cloned().collect::<Vec<_>>().join("; ")
        );
    }
    ("once".to_owned(), problems.is_empty(), detail)
}

// --- latency and memory ------------------------------------------------------------------------

/// The nearest-rank `q` quantile of sorted microseconds, in milliseconds (NaN when empty).
fn percentile_ms(sorted_us: &[u32], q: f64) -> f64 {
    nearest_rank(sorted_us, q).map_or(f64::NAN, |us| f64::from(us) / 1000.0)
}

/// The samples that finished in `[from, to)` (sorted by time).
fn window(samples: &[Sample], from: Duration, to: Duration) -> &[Sample] {
    let (from, to) = (from.as_millis() as u32, to.as_millis() as u32);
    let a = samples.partition_point(|s| s.at_ms < from);
    let b = samples.partition_point(|s| s.at_ms < to);
    &samples[a..b.max(a)]
}

fn accepted_sorted(samples: &[Sample]) -> Vec<u32> {
    let mut v: Vec<u32> =
        samples.iter().filter(|s| s.status == 200).map(|s| s.latency_us).collect();
    v.sort_unstable();
    v
}

fn summarize_load(samples: &[Sample], timeline: &Timeline, killed: Duration, nodes: usize) {
    println!();
    println!(
        "{:14} {:>9} {:>10} {:>9} {:>11} {:>10} {:>8} {:>8} {:>8}",
        "phase",
        "from s",
        "reports",
        "accepted",
        "refused",
        "no answer",
        "per s",
        "p50 ms",
        "p99 ms"
    );
    let mut phases = timeline.phases(RECOVERY_LIMIT);
    // The restart phase starts at the SIGKILL as it happened.
    phases[3].2 = killed;
    phases[4].1 = killed;
    phases[4].2 = killed + RECOVERY_LIMIT;
    phases[5].1 = killed + RECOVERY_LIMIT;
    let mut totals = [0usize; 4];
    for (name, from, to) in phases {
        let w = window(samples, from, to);
        let ok = accepted_sorted(w);
        let refused = w.iter().filter(|s| s.status != 200 && s.status != 0).count();
        let lost = w.iter().filter(|s| s.status == 0).count();
        let secs = (to.saturating_sub(from)).as_secs_f64().max(1e-9);
        println!(
            "{name:14} {:>9.0} {:>10} {:>9} {:>11} {:>10} {:>8.0} {:>8.2} {:>8.2}",
            from.as_secs_f64(),
            w.len(),
            ok.len(),
            refused,
            lost,
            w.len() as f64 / secs,
            percentile_ms(&ok, 0.5),
            percentile_ms(&ok, 0.99),
        );
        totals[0] += w.len();
        totals[1] += ok.len();
        totals[2] += refused;
        totals[3] += lost;
    }
    let all = accepted_sorted(samples);
    println!(
        "{:14} {:>9} {:>10} {:>9} {:>11} {:>10} {:>8.0} {:>8.2} {:>8.2}",
        "all",
        "",
        totals[0],
        totals[1],
        totals[2],
        totals[3],
        totals[0] as f64 / timeline.end.as_secs_f64(),
        percentile_ms(&all, 0.5),
        percentile_ms(&all, 0.99),
    );
    println!(
        "({nodes} agents; refused: answered other than 200; no answer: connection refused, reset or timed out)"
    );
}

/// The RSS growth of each life of the repairer after its warm-up.
fn check_rss(rss: &[RssSample], timeline: &Timeline, ready: Duration) -> Vec<Verdict3> {
    println!();
    let minute: Vec<String> = rss
        .iter()
        .filter(|r| r.at.as_secs() % 60 == 0 || r.at.as_secs() % 60 == 59)
        .map(|r| format!("{:.0}s:{:.1}", r.at.as_secs_f64(), r.kib as f64 / 1024.0))
        .collect();
    println!("RSS MiB around each minute: {}", minute.join(" "));
    let lives =
        [(0, timeline.warm_up, timeline.kill_at), (1, ready + timeline.warm_up, timeline.end)];
    let mut verdicts = Vec::new();
    for (life, from, to) in lives {
        let of_life: Vec<&RssSample> = rss.iter().filter(|r| r.life == life && r.kib > 0).collect();
        let mean = |a: Duration, b: Duration| {
            let v: Vec<f64> =
                of_life.iter().filter(|r| r.at >= a && r.at < b).map(|r| r.kib as f64).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let name = format!("rss life {}", life + 1);
        if to.saturating_sub(from) < RSS_WINDOW * 2 {
            verdicts.push((name, false, format!("too short after warm-up ({from:?}..{to:?})")));
            continue;
        }
        let (Some(base), Some(last)) = (mean(from, from + RSS_WINDOW), mean(to - RSS_WINDOW, to))
        else {
            verdicts.push((name, false, "no RSS samples".to_owned()));
            continue;
        };
        let max = of_life.iter().map(|r| r.kib).max().unwrap_or(0);
        let growth = last / base - 1.0;
        verdicts.push((
            name,
            growth < RSS_GROWTH_LIMIT,
            format!(
                "{:.0}..{:.0} s: {:.1} MiB (mean of the first 15 s after warm-up) -> {:.1} MiB \
                 (last 15 s): {:+.1} % (limit {:.0} %); max of the life {:.1} MiB",
                from.as_secs_f64(),
                to.as_secs_f64(),
                base / 1024.0,
                last / 1024.0,
                growth * 100.0,
                RSS_GROWTH_LIMIT * 100.0,
                max as f64 / 1024.0
            ),
        ));
    }
    verdicts
}

/// Report p99 per second after the SIGKILL: when it is back under the goal for good.
fn check_recovery(samples: &[Sample], killed: Duration, ready: Duration) -> Verdict3 {
    let second = Duration::from_secs(1);
    let first = Duration::from_secs(killed.as_secs());
    let mut p99s: Vec<(Duration, f64, usize)> = Vec::new();
    let mut at = first;
    while let Some(last) = samples.last()
        && at.as_millis() as u32 <= last.at_ms
    {
        let w = window(samples, at, at + second);
        let ok = accepted_sorted(w);
        let unanswered = w.iter().filter(|s| s.status != 200).count();
        p99s.push((at, percentile_ms(&ok, 0.99), unanswered));
        at += second;
    }
    let good = |&(_, p99, bad): &(Duration, f64, usize)| p99 < P99_GOAL_MS && bad == 0;
    let recovered = (0..p99s.len()).find(|&i| {
        p99s.len() >= i + RECOVERY_HOLD_S && p99s[i..i + RECOVERY_HOLD_S].iter().all(good)
    });
    let shown: Vec<String> = p99s
        .iter()
        .take(45)
        .map(|(at, p99, bad)| {
            let mut s = format!("{:.0}:{p99:.0}", at.as_secs_f64());
            if *bad > 0 {
                let _ = write!(s, "({bad}x)");
            }
            s
        })
        .collect();
    println!(
        "report p99 ms per second from the SIGKILL (second:p99, (Nx): N not accepted): {}",
        shown.join(" ")
    );
    match recovered {
        Some(i) => {
            let back = p99s[i].0.saturating_sub(killed);
            let worst_after = p99s[i..].iter().map(|p| p.1).fold(0.0, f64::max);
            (
                "recovery".to_owned(),
                back <= RECOVERY_LIMIT,
                format!(
                    "p99 under {P99_GOAL_MS:.0} ms with every report accepted, for {RECOVERY_HOLD_S} s \
                     running, from {:.1} s after the SIGKILL (the new repairer answered /healthz \
                     {:.2} s after it; limit {:.0} s); worst 1-s p99 after that {worst_after:.1} ms",
                    back.as_secs_f64(),
                    (ready - killed).as_secs_f64(),
                    RECOVERY_LIMIT.as_secs_f64()
                ),
            )
        }
        None => ("recovery".to_owned(), false, "p99 never back under the goal".to_owned()),
    }
}
