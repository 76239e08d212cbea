//! The ranks of jobs this agent runs: started on a `run-rank` command, signalled on `signal-rank`,
//! watched until they end, and shown in every report.
//!
//! Each rank is a child of the agent in a process group of its own (so a signal reaches the
//! launcher and everything it started, and a terminal's Ctrl-C does not), with stdin from
//! `/dev/null` and stdout and stderr appended to `<jobs.dir>/<job>/attempt-<n>/rank-<r>/rank.log`.
//! One thread per rank waits for it: an exit is recorded the moment it happens and raises
//! [`RankSupervisor::exits`], which sends a report at once (trigger `rank-exit`).
//!
//! A [`RankKey`] is started at most once per agent process: a second `run-rank` for it (the
//! repairer retrying, or a queue that lost track) gets the rank's standing state, not a second
//! process. When the agent stops, [`RankSupervisor::stop_all`] sends SIGTERM to every rank and
//! SIGKILL after `jobs.stop_grace`. An agent killed with SIGKILL cannot do that: its ranks keep
//! running, orphaned; [`RankSupervisor::stop_orphans`] finds them when the agent starts again (by
//! the [`RANK_DIR_VAR`] it gave them) and stops them the same way.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use fleetmend_proto::{RankKey, RankSignal, RankState, RankStatus, RunRank, SignalRank};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::watch;

use crate::config::JobsConfig;
use crate::runner::unix_millis;

mod orphans;

pub use orphans::rank_processes;
use orphans::{Orphan, find_orphans, process_running};

/// The file in a rank's directory that takes its stdout and stderr.
pub const LOG_FILE: &str = "rank.log";
/// Set in every rank's environment to its rank directory: how an agent that starts again finds the
/// ranks an earlier agent process left running (see [`RankSupervisor::stop_orphans`]).
pub const RANK_DIR_VAR: &str = "FLEETMEND_RANK_DIR";
/// Ranks that ended are remembered (not reported) up to this many, so a late repeat of a
/// `run-rank` still finds its key taken; the oldest are forgotten first.
pub const REMEMBERED_ENDED: usize = 1024;
/// After SIGKILL, how long a rank may take to be reaped before the agent stops waiting for it (a
/// process in uninterruptible sleep, e.g. in a hung driver call, dies only when that call returns).
const REAP_GRACE: Duration = Duration::from_secs(5);
/// How often orphans of an earlier agent process are looked at while they are being stopped
/// (they are not the agent's children, so their exit cannot be waited for).
const ORPHAN_POLL: Duration = Duration::from_millis(100);
/// The longest job name accepted: it becomes a directory name.
const MAX_JOB_NAME: usize = 200;
const _: () = assert!(MAX_JOB_NAME <= fleetmend_proto::bounds::MAX_ID_BYTES);
const _: () = assert!(REMEMBERED_ENDED < fleetmend_proto::bounds::MAX_RANKS);
/// Stack of a thread that only waits for its rank.
const WAITER_STACK: usize = 64 * 1024;

/// A `run-rank` command was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum RunRankError {
    #[error("jobs are disabled on this agent (jobs.enabled = false); rank {key} not started")]
    Disabled { key: RankKey },
    #[error("the agent is stopping; rank {key} not started")]
    Stopping { key: RankKey },
    #[error("bad run-rank for {key}: {why}")]
    BadArgs { key: RankKey, why: String },
    #[error("rank {key}: creating its directory {path}: {source}")]
    RankDir { key: RankKey, path: PathBuf, source: std::io::Error },
    #[error("rank {key}: its working directory {path}: {source}")]
    Workdir { key: RankKey, path: PathBuf, source: std::io::Error },
    #[error("rank {key}: opening its log {path}: {source}")]
    Log { key: RankKey, path: PathBuf, source: std::io::Error },
    #[error("rank {key}: starting {program:?}: {source}")]
    Spawn { key: RankKey, program: String, source: std::io::Error },
    #[error("rank {key}: starting a thread to wait for it: {source}")]
    Waiter { key: RankKey, source: std::io::Error },
}

/// A `signal-rank` command was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum SignalRankError {
    #[error("jobs are disabled on this agent (jobs.enabled = false); no signal sent to {key}")]
    Disabled { key: RankKey },
    #[error("rank {key} is unknown on this agent; no signal sent")]
    Unknown { key: RankKey },
    #[error("rank {key} is not running ({how}); no {signal} sent")]
    NotRunning { key: RankKey, signal: RankSignal, how: String },
    #[error("sending {signal} to rank {key} (process group {pgid}): {source}")]
    Send { key: RankKey, signal: RankSignal, pgid: u32, source: Errno },
}

/// What a `run-rank` command found or did.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// Started now.
    Started { pid: u32, log: PathBuf },
    /// This key was started before (by this agent process); nothing new was started.
    AlreadyStarted(RankStatus),
}

/// One rank the agent started (or tried to).
#[derive(Debug)]
struct Entry {
    status: RankStatus,
    /// When it ended (or failed to start); `None` while it runs.
    ended: Option<Instant>,
}

/// The ranks of this agent process.
#[derive(Debug)]
pub struct RankSupervisor {
    config: JobsConfig,
    address: String,
    ranks: Mutex<BTreeMap<RankKey, Entry>>,
    /// Bumped on every rank that ends: the reporter sends a report at once.
    exits: watch::Sender<u64>,
    /// The newest value of `exits` a delivered report carried.
    delivered: watch::Sender<u64>,
    /// Set by [`Self::stop_all`]: no new rank starts.
    stopping: AtomicBool,
}

impl RankSupervisor {
    pub fn new(config: JobsConfig) -> Arc<RankSupervisor> {
        let address = config.advertise_address.clone().unwrap_or_else(host_name);
        Arc::new(RankSupervisor {
            config,
            address,
            ranks: Mutex::new(BTreeMap::new()),
            exits: watch::Sender::new(0),
            delivered: watch::Sender::new(0),
            stopping: AtomicBool::new(false),
        })
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The host other nodes reach this node at (`jobs.advertise_address`, else the host name).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Changes whenever a rank ends (or an orphan was stopped).
    pub fn exits(&self) -> watch::Receiver<u64> {
        self.exits.subscribe()
    }

    /// A report built after `exits` showed `generation` reached the repairer.
    pub fn note_delivered(&self, generation: u64) {
        self.delivered.send_if_modified(|seen| {
            let newer = generation > *seen;
            if newer {
                *seen = generation;
            }
            newer
        });
    }

    /// Waits until a delivered report showed every exit so far, at most `within`; whether one did.
    /// The agent's last act before it stops, so the repairer learns how its ranks ended.
    pub async fn wait_exits_delivered(&self, within: Duration) -> bool {
        let target = *self.exits.borrow();
        let mut delivered = self.delivered.subscribe();
        let waited = tokio::time::timeout(within, delivered.wait_for(|seen| *seen >= target));
        matches!(waited.await, Ok(Ok(_)))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<RankKey, Entry>> {
        self.ranks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a report carries: every running rank and every rank that ended within
    /// `jobs.retain_exited`, in key order.
    pub fn statuses(&self) -> Vec<RankStatus> {
        let retain = self.config.retain_exited;
        self.lock()
            .values()
            .filter(|entry| entry.ended.is_none_or(|at| at.elapsed() <= retain))
            .map(|entry| entry.status.clone())
            .collect()
    }

    /// The status of one rank, also one that ended long ago (while still remembered).
    pub fn status(&self, key: &RankKey) -> Option<RankStatus> {
        self.lock().get(key).map(|entry| entry.status.clone())
    }

    /// The directory of a rank: `<jobs.dir>/<job>/attempt-<n>/rank-<r>`.
    pub fn rank_dir(&self, key: &RankKey) -> PathBuf {
        rank_dir(&self.config.dir, key)
    }

    /// Starts `run`'s rank unless its key was started before. A rank that cannot be started is
    /// recorded as failed-to-start (and so reported) as well as returned as an error.
    pub fn run(self: &Arc<Self>, run: &RunRank) -> Result<RunOutcome, RunRankError> {
        let key = run.key.clone();
        if !self.config.enabled {
            return Err(RunRankError::Disabled { key });
        }
        if let Err(why) = check_run(run) {
            return Err(RunRankError::BadArgs { key, why });
        }
        // Held from the look-up to the insert, so two `run-rank`s of one key cannot both start,
        // and a stop that begins meanwhile sees this rank (it looks under this lock after setting
        // `stopping`).
        let mut ranks = self.lock();
        if self.stopping.load(Ordering::Acquire) {
            return Err(RunRankError::Stopping { key });
        }
        if let Some(entry) = ranks.get(&key) {
            return Ok(RunOutcome::AlreadyStarted(entry.status.clone()));
        }
        let started_at_ms = unix_millis(SystemTime::now());
        match self.spawn(run) {
            Ok((child, log)) => {
                let pid = child.id();
                ranks.insert(
                    key.clone(),
                    Entry {
                        status: RankStatus {
                            key: key.clone(),
                            state: RankState::Running,
                            pid: Some(pid),
                            exit_code: None,
                            signal: None,
                            message: format!("running; output in {}", log.display()),
                            started_at_ms,
                            finished_at_ms: None,
                        },
                        ended: None,
                    },
                );
                drop(ranks);
                tracing::info!(rank = %key, pid, argv = ?run.argv, log = %log.display(), "rank started");
                let supervisor = Arc::clone(self);
                let waiter = std::thread::Builder::new()
                    .name(format!("rank-{pid}"))
                    .stack_size(WAITER_STACK)
                    .spawn({
                        let key = key.clone();
                        move || supervisor.supervise(key, child)
                    });
                match waiter {
                    Ok(_) => Ok(RunOutcome::Started { pid, log }),
                    Err(source) => {
                        // Without a waiter its exit would go unnoticed: stop it rather than run it
                        // blind. The child is gone with the closure; kill its group and record.
                        signal_group(pid, Signal::SIGKILL);
                        let err = RunRankError::Waiter { key: key.clone(), source };
                        self.end(&key, None, format!("stopped: {err}"));
                        Err(err)
                    }
                }
            }
            Err(err) => {
                tracing::warn!(rank = %key, error = %err, "rank failed to start");
                ranks.insert(
                    key.clone(),
                    Entry {
                        status: RankStatus {
                            key: key.clone(),
                            state: RankState::FailedToStart,
                            pid: None,
                            exit_code: None,
                            signal: None,
                            message: err.to_string(),
                            started_at_ms,
                            finished_at_ms: Some(started_at_ms),
                        },
                        ended: Some(Instant::now()),
                    },
                );
                forget_oldest_ended(&mut ranks);
                Err(err)
            }
        }
    }

    /// Creates the rank's directory and log and starts its process.
    fn spawn(&self, run: &RunRank) -> Result<(Child, PathBuf), RunRankError> {
        let key = &run.key;
        let dir = self.rank_dir(key);
        std::fs::create_dir_all(&dir).map_err(|source| RunRankError::RankDir {
            key: key.clone(),
            path: dir.clone(),
            source,
        })?;
        let log_path = dir.join(LOG_FILE);
        let log_error =
            |source| RunRankError::Log { key: key.clone(), path: log_path.clone(), source };
        let stdout =
            OpenOptions::new().create(true).append(true).open(&log_path).map_err(log_error)?;
        let stderr = stdout.try_clone().map_err(log_error)?;
        let workdir = run.workdir.as_ref().map(PathBuf::from).unwrap_or_else(|| dir.clone());
        // Looked at first: a missing working directory fails the spawn with the same error as a
        // missing program, and the message must say which it was.
        std::fs::read_dir(&workdir).map_err(|source| RunRankError::Workdir {
            key: key.clone(),
            path: workdir.clone(),
            source,
        })?;
        // `check_run` made sure there is a program.
        let (program, args) = run.argv.split_first().ok_or_else(|| RunRankError::BadArgs {
            key: key.clone(),
            why: "argv is empty".to_owned(),
        })?;
        let child = Command::new(program)
            .args(args)
            .envs(&run.env)
            .env(RANK_DIR_VAR, absolute(&dir))
            .current_dir(&workdir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(|source| RunRankError::Spawn {
                key: key.clone(),
                program: program.clone(),
                source,
            })?;
        Ok((child, log_path))
    }

    /// The waiter thread of one rank: waits for it, records how it ended, and raises `exits`.
    fn supervise(&self, key: RankKey, mut child: Child) {
        let pid = child.id();
        let waited = child.wait();
        // What the rank left behind in its group (helpers, data loaders) would hold GPUs and
        // ports unseen by anyone: it ends with the rank.
        signal_group(pid, Signal::SIGKILL);
        match waited {
            Ok(status) => {
                let (code, signal) = (status.code(), status.signal());
                tracing::info!(rank = %key, pid, code, signal, "rank ended: {}", describe(status));
                self.end(&key, Some(status), describe(status));
            }
            Err(err) => {
                tracing::error!(rank = %key, pid, error = %err, "waiting for a rank failed");
                self.end(&key, None, format!("waiting for it failed: {err}"));
            }
        }
    }

    /// Records that `key` ended and raises `exits`.
    fn end(&self, key: &RankKey, status: Option<ExitStatus>, message: String) {
        let mut ranks = self.lock();
        if let Some(entry) = ranks.get_mut(key) {
            entry.status.state = RankState::Exited;
            entry.status.exit_code = status.and_then(|s| s.code());
            entry.status.signal = status.and_then(|s| s.signal());
            entry.status.message = message;
            entry.status.finished_at_ms = Some(unix_millis(SystemTime::now()));
            entry.ended = Some(Instant::now());
        }
        forget_oldest_ended(&mut ranks);
        drop(ranks);
        self.exits.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Sends `signal.signal` to the rank's process group; the pid signalled.
    pub fn signal(&self, signal: &SignalRank) -> Result<u32, SignalRankError> {
        let key = signal.key.clone();
        if !self.config.enabled {
            return Err(SignalRankError::Disabled { key });
        }
        // Held while signalling: the waiter records an exit under this lock only after reaping,
        // so a running entry's group id cannot have been reused yet.
        let ranks = self.lock();
        let Some(entry) = ranks.get(&key) else {
            return Err(SignalRankError::Unknown { key });
        };
        let (RankState::Running, Some(pid)) = (entry.status.state, entry.status.pid) else {
            let how = entry.status.message.clone();
            return Err(SignalRankError::NotRunning { key, signal: signal.signal, how });
        };
        let pgid = Pid::from_raw(pid as i32);
        killpg(pgid, nix_signal(signal.signal)).map_err(|source| SignalRankError::Send {
            key: key.clone(),
            signal: signal.signal,
            pgid: pid,
            source,
        })?;
        tracing::info!(rank = %key, pid, signal = %signal.signal, "signal sent to rank");
        Ok(pid)
    }

    /// The agent is stopping: no new rank starts; every running one gets SIGTERM, then SIGKILL
    /// after `grace`. Returns once all have ended, or a short while after the SIGKILL.
    pub async fn stop_all(&self, grace: Duration) {
        self.stopping.store(true, Ordering::Release);
        let running = self.running_pids();
        if running.is_empty() {
            return;
        }
        tracing::info!(ranks = running.len(), grace = ?grace, "stopping ranks: SIGTERM");
        for pid in &running {
            signal_group(*pid, Signal::SIGTERM);
        }
        if self.wait_all_ended(grace).await {
            tracing::info!("every rank ended");
            return;
        }
        let left = self.running_pids();
        tracing::warn!(ranks = left.len(), "ranks still running after the grace period: SIGKILL");
        for pid in &left {
            signal_group(*pid, Signal::SIGKILL);
        }
        if !self.wait_all_ended(REAP_GRACE).await {
            tracing::error!(pids = ?self.running_pids(), "ranks survived SIGKILL; leaving them");
        }
    }

    fn running_pids(&self) -> Vec<u32> {
        self.lock()
            .values()
            .filter(|entry| entry.status.state == RankState::Running)
            .filter_map(|entry| entry.status.pid)
            .collect()
    }

    /// Waits until no rank runs, at most `within`; whether none does.
    async fn wait_all_ended(&self, within: Duration) -> bool {
        // Subscribed before looking, so an exit between the look and the wait is not missed.
        let mut exits = self.exits();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.running_pids().is_empty() {
                return true;
            }
            match tokio::time::timeout_at(deadline, exits.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in `self`: only the deadline ends the wait.
                Ok(Err(_)) | Err(_) => return self.running_pids().is_empty(),
            }
        }
    }

    /// Finds processes an earlier agent process started as ranks under this `jobs.dir` (by their
    /// [`RANK_DIR_VAR`], in `procfs`) and still running: that agent died without stopping them
    /// (SIGKILL, a crash). They get SIGTERM, then SIGKILL after `jobs.stop_grace`, on a thread of
    /// their own; each is reported as exited with a message saying so. Returns how many were found.
    pub fn stop_orphans(self: &Arc<Self>, procfs: &Path) -> usize {
        if !self.config.enabled {
            return 0;
        }
        let orphans = find_orphans(procfs, &absolute(&self.config.dir));
        if orphans.is_empty() {
            return 0;
        }
        let now = unix_millis(SystemTime::now());
        {
            let mut ranks = self.lock();
            for orphan in &orphans {
                tracing::warn!(
                    rank = %orphan.key,
                    pid = orphan.pid,
                    "a rank left running by an earlier agent process; stopping it"
                );
                ranks.entry(orphan.key.clone()).or_insert_with(|| Entry {
                    status: RankStatus {
                        key: orphan.key.clone(),
                        state: RankState::Running,
                        pid: Some(orphan.pid),
                        exit_code: None,
                        signal: None,
                        message: "left running by an earlier agent process; stopping it".to_owned(),
                        started_at_ms: now,
                        finished_at_ms: None,
                    },
                    ended: None,
                });
            }
        }
        let found = orphans.len();
        let supervisor = Arc::clone(self);
        let procfs = procfs.to_owned();
        let stopper = std::thread::Builder::new()
            .name("rank-orphans".to_owned())
            .stack_size(WAITER_STACK)
            .spawn(move || supervisor.stop_orphan_groups(&procfs, orphans));
        if let Err(err) = stopper {
            tracing::error!(error = %err, "cannot start a thread to stop orphaned ranks");
        }
        found
    }

    /// TERM, then KILL after the grace period, polling `procfs` until the orphans are gone; each
    /// is recorded as ended (and so reported) as soon as it is gone.
    fn stop_orphan_groups(&self, procfs: &Path, orphans: Vec<Orphan>) {
        for orphan in &orphans {
            signal_group(orphan.pgid, Signal::SIGTERM);
        }
        let end = |orphan: &Orphan, how: &str| {
            let message = format!(
                "left running by an earlier agent process (pid {}); stopped when this agent \
                 started: {how}; its exit status is unknown",
                orphan.pid
            );
            self.end(&orphan.key, None, message);
        };
        let term_deadline = Instant::now() + self.config.stop_grace;
        let mut killed = false;
        let mut left = orphans;
        loop {
            let how = if killed { "killed (SIGKILL)" } else { "ended after SIGTERM" };
            left.retain(|orphan| {
                let running = process_running(procfs, orphan.pid);
                if !running {
                    end(orphan, how);
                }
                running
            });
            if left.is_empty() {
                return;
            }
            let now = Instant::now();
            if !killed && now >= term_deadline {
                for orphan in &left {
                    signal_group(orphan.pgid, Signal::SIGKILL);
                }
                killed = true;
                continue;
            }
            if killed && now >= term_deadline + REAP_GRACE {
                for orphan in &left {
                    tracing::error!(rank = %orphan.key, pid = orphan.pid, "an orphaned rank survived SIGKILL");
                    end(orphan, "survived SIGKILL; left running");
                }
                return;
            }
            std::thread::sleep(ORPHAN_POLL);
        }
    }
}

/// `dir/<job>/attempt-<n>/rank-<r>`.
fn rank_dir(dir: &Path, key: &RankKey) -> PathBuf {
    dir.join(&key.job).join(format!("attempt-{}", key.attempt)).join(format!("rank-{}", key.rank))
}

/// The key of a rank directory under `dir` made by [`rank_dir`].
fn key_of_rank_dir(dir: &Path, rank_dir: &Path) -> Option<RankKey> {
    let relative = rank_dir.strip_prefix(dir).ok()?;
    let mut parts = relative.iter().map(|part| part.to_str());
    let (Some(Some(job)), Some(Some(attempt)), Some(Some(rank)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some(RankKey {
        job: job.to_owned(),
        attempt: attempt.strip_prefix("attempt-")?.parse().ok()?,
        rank: rank.strip_prefix("rank-")?.parse().ok()?,
    })
}

/// Why `run` cannot be carried out, if it cannot.
fn check_run(run: &RunRank) -> Result<(), String> {
    let job = &run.key.job;
    if job.is_empty() || job == "." || job == ".." {
        return Err(format!("job {job:?} is not a usable name"));
    }
    if job.len() > MAX_JOB_NAME {
        return Err(format!("the job name is longer than {MAX_JOB_NAME} bytes"));
    }
    if job.chars().any(|c| c == '/' || c.is_control()) {
        return Err(format!("job {job:?} contains '/' or a control character"));
    }
    match run.argv.first() {
        None => return Err("argv is empty: no program to run".to_owned()),
        Some(program) if program.is_empty() => return Err("argv[0] is empty".to_owned()),
        Some(_) => {}
    }
    if run.argv.iter().any(|arg| arg.contains('\0')) {
        return Err("an argument contains a NUL byte".to_owned());
    }
    for (name, value) in &run.env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(format!("environment variable {name:?} is not a valid name and value"));
        }
    }
    if run.workdir.as_ref().is_some_and(|dir| dir.is_empty()) {
        return Err("workdir is empty".to_owned());
    }
    Ok(())
}

/// Drops the ended entries beyond [`REMEMBERED_ENDED`], oldest first.
fn forget_oldest_ended(ranks: &mut BTreeMap<RankKey, Entry>) {
    let mut ended: Vec<(Instant, RankKey)> =
        ranks.iter().filter_map(|(key, entry)| entry.ended.map(|at| (at, key.clone()))).collect();
    if ended.len() <= REMEMBERED_ENDED {
        return;
    }
    ended.sort();
    let excess = ended.len() - REMEMBERED_ENDED;
    for (_, key) in ended.into_iter().take(excess) {
        ranks.remove(&key);
    }
}

/// "exited with status 7", "killed by signal 15 (SIGTERM)".
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(name) => format!("killed by signal {signal} ({name})"),
            Err(_) => format!("killed by signal {signal}"),
        },
        (None, None) => format!("ended: {status}"),
    }
}

fn nix_signal(signal: RankSignal) -> Signal {
    match signal {
        RankSignal::Usr1 => Signal::SIGUSR1,
        RankSignal::Term => Signal::SIGTERM,
        RankSignal::Kill => Signal::SIGKILL,
    }
}

/// Signals a process group, saying nothing when it is already gone.
fn signal_group(pgid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pgid) else {
        return;
    };
    if let Err(err) = killpg(Pid::from_raw(raw), signal)
        && err != Errno::ESRCH
    {
        tracing::warn!(pgid, signal = %signal, error = %err, "cannot signal a rank's process group");
    }
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `path` made absolute against the current directory (as given when that fails).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(job: &str, attempt: u32, rank: u32) -> RankKey {
        RankKey { job: job.to_owned(), attempt, rank }
    }

    fn run(job: &str, argv: &[&str]) -> RunRank {
        RunRank {
            key: key(job, 0, 0),
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            env: BTreeMap::new(),
            workdir: None,
        }
    }

    #[test]
    fn bad_runs_are_named() {
        assert!(check_run(&run("j1", &["true"])).is_ok());
        for (bad, want) in [
            (run("", &["true"]), "not a usable name"),
            (run("..", &["true"]), "not a usable name"),
            (run("a/b", &["true"]), "contains '/'"),
            (run("j1", &[]), "argv is empty"),
            (run("j1", &[""]), "argv[0] is empty"),
        ] {
            let why = check_run(&bad).unwrap_err();
            assert!(why.contains(want), "{why}");
        }
        let mut env = run("j1", &["true"]);
        env.env.insert("A=B".to_owned(), "x".to_owned());
        assert!(check_run(&env).unwrap_err().contains("\"A=B\""));
    }

    #[test]
    fn rank_dirs_round_trip_to_their_keys() {
        let dir = Path::new("/var/lib/fleetmend/jobs");
        let k = key("job-7", 3, 12);
        let path = rank_dir(dir, &k);
        assert_eq!(path, Path::new("/var/lib/fleetmend/jobs/job-7/attempt-3/rank-12"));
        assert_eq!(key_of_rank_dir(dir, &path), Some(k));
        assert_eq!(key_of_rank_dir(Path::new("/other"), &path), None);
        assert_eq!(key_of_rank_dir(dir, &dir.join("job-7/attempt-x/rank-1")), None);
        assert_eq!(key_of_rank_dir(dir, &dir.join("job-7/attempt-1")), None);
    }

    #[test]
    fn only_the_newest_ended_ranks_are_remembered() {
        let mut ranks = BTreeMap::new();
        let start = Instant::now();
        let status = |k: &RankKey| RankStatus {
            key: k.clone(),
            state: RankState::Exited,
            pid: None,
            exit_code: Some(0),
            signal: None,
            message: String::new(),
            started_at_ms: 0,
            finished_at_ms: Some(0),
        };
        for i in 0..(REMEMBERED_ENDED as u32 + 3) {
            let k = key("j", i, 0);
            let ended = Some(start + Duration::from_millis(u64::from(i)));
            ranks.insert(k.clone(), Entry { status: status(&k), ended });
        }
        let running = key("j", 0, 1);
        ranks.insert(running.clone(), Entry { status: status(&running), ended: None });
        forget_oldest_ended(&mut ranks);
        assert_eq!(ranks.len(), REMEMBERED_ENDED + 1);
        assert!(ranks.contains_key(&running));
        assert!(!ranks.contains_key(&key("j", 2, 0)));
        assert!(ranks.contains_key(&key("j", 3, 0)));
    }

    #[test]
    fn exits_are_described_with_the_signal_name() {
        assert_eq!(describe(ExitStatus::from_raw(7 << 8)), "exited with status 7");
        assert_eq!(describe(ExitStatus::from_raw(15)), "killed by signal 15 (SIGTERM)");
    }
}
