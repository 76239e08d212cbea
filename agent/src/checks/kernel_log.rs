//! The kernel_log check: follows the kernel log and turns lines that match rules into findings.
//!
//! In daemon mode a follower thread reads new records as they arrive (polling every
//! `poll_interval`), records matches with their time and raises the check's [`EventSignal`] so the
//! agent runs this check and reports at once; `run` only evaluates what was recorded. In once mode
//! `run` reads the backlog itself without blocking. Either way a match counts for its rule's
//! `clear_after` window and then clears: a kernel-log line is an event, and a node must not stay
//! sick forever on one old line.
//!
//! Findings: one per (rule, subject) seen, with the worst status and action matched within the
//! window (ok once it cleared), plus `kernel_log` for the log itself: ok while it can be read,
//! `unknown` (naming the path) while it cannot. A rule that fails to compile is an `unknown`
//! `kernel_log_rule` finding.

mod bursts;
#[doc(hidden)]
pub mod fuzzing;
mod judge;
mod rules;
mod source;
mod stamp;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use fleetmend_proto::{Finding, KMSG_SEQ_LABEL, RecommendedAction, Status};
use serde::Deserialize;

use self::bursts::XidBursts;
pub use self::bursts::{XidBurstRule, default_bursts};
pub use self::judge::KernelLogJudge;
pub use self::rules::{KernelLogRule, builtin_rules};
use self::rules::{MAX_LINES, Rule, RuleMatch, truncate_chars};
pub use self::source::{LogReader, Record};
pub use self::stamp::{Joint, Stamp};
use super::{BuildContext, Check, EventSignal, Mode, Observation, RunContext};
use crate::config::{ConfigProblems, Schedule};
use crate::metrics::{self, Sample};

pub const NAME: &str = "kernel_log";

/// Longest finding message (the matched log line, cut).
const MAX_MESSAGE_CHARS: usize = 300;
// At most four bytes a character: within the wire's bound.
const _: () = assert!(MAX_MESSAGE_CHARS * 4 <= fleetmend_proto::bounds::MAX_MESSAGE_BYTES);

/// Most (rule, subject) pairs remembered; beyond it the one seen longest ago is forgotten, so a log
/// full of distinct subjects cannot grow the agent without bound.
pub(crate) const MAX_SUBJECTS: usize = 256;

/// Records read between looks at the stop flag or the run's deadline.
const BATCH: usize = 512;

/// Longest the daemon spends reading an existing backlog before its first run
/// (`read_existing = true`); the follower reads whatever is left.
const BACKLOG_READ_LIMIT: Duration = Duration::from_secs(2);

/// Least time between attempts to open a log that could not be opened.
const REOPEN_INTERVAL: Duration = Duration::from_secs(1);

/// Settings of the kernel_log check (`[checks.kernel_log]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelLogConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs (matches are reported at once in daemon mode, whatever the interval).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// How often the follower looks for new records (daemon mode). Bounds the delay from a line to
    /// its report, and how long stopping the follower takes.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// In daemon mode, read what the log already holds when the agent starts — on `/dev/kmsg`
    /// everything since boot — and act on what is within `lookback`. Off: only new records.
    pub read_existing: bool,
    /// Lines logged longer ago than this are not acted on (node-problem-detector's lookback): at
    /// start, so an agent restarted after a condition was dealt with does not raise it again; and
    /// a line older than its rule's `clear_after` never counts either.
    #[serde(with = "humantime_serde")]
    pub lookback: Duration,
    /// Use the built-in rules (docs/detection.md: Xid, recovery action, GPU off the bus, GSP,
    /// NVSwitch, mlx5/mlx4, peermem, CUDA crashes, MCE, filesystem, block I/O, NVMe, NIC, OOM, hung
    /// task). A user rule with a built-in's name replaces that one either way.
    pub builtin_rules: bool,
    /// Extra rules (`[[checks.kernel_log.rules]]`).
    pub rules: Vec<KernelLogRule>,
    /// Repeats of a non-fatal Xid that escalate, by code (`[checks.kernel_log.xid_bursts.13]`);
    /// built in: 13 and 31, 5 incidents within 1 h → fail, reboot. Setting the table replaces the
    /// built-in set (name 13 and 31 again to keep them); `xid_bursts = {}` turns bursts off.
    pub xid_bursts: BTreeMap<String, XidBurstRule>,
}

impl Default for KernelLogConfig {
    fn default() -> Self {
        KernelLogConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(100),
            read_existing: true,
            lookback: Duration::from_secs(10 * 60),
            builtin_rules: true,
            rules: Vec::new(),
            xid_bursts: default_bursts(),
        }
    }
}

impl KernelLogConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
        if self.poll_interval.is_zero() {
            problems.push(format!("{section}.poll_interval"), "must be greater than zero");
        }
        if self.lookback.is_zero() {
            problems.push(format!("{section}.lookback"), "must be greater than zero");
        }
        rules::validate(section, &self.rules, problems);
        bursts::validate(section, &self.xid_bursts, problems);
    }
}

/// One match kept for a (rule, subject): the latest line with this status and action.
#[derive(Debug, Clone)]
struct Hit {
    status: Status,
    action: RecommendedAction,
    at: SystemTime,
    message: String,
    labels: BTreeMap<String, String>,
    count: u64,
    /// The kmsg sequence number of the latest line (`kmsg_seq` on the finding).
    seq: Option<u64>,
}

/// What is known about one (rule, subject).
#[derive(Debug, Clone)]
struct Entry {
    /// At most one hit per (status, action): bounded, and the worst is never hidden by a later,
    /// milder line.
    hits: Vec<Hit>,
    last_seen: SystemTime,
}

/// What the log has shown so far; shared by the follower and `run`.
#[derive(Debug)]
struct Ledger {
    entries: BTreeMap<(usize, String), Entry>,
    lines: u64,
    /// Matches per rule (index into the rules).
    matches: Vec<u64>,
    /// Why the log cannot be read now.
    read_error: Option<String>,
    /// The latest kernel messages, newest last (at most [`MAX_LINES`]), for rules that span
    /// several lines and for continuation fragments.
    recent: VecDeque<String>,
    /// The latest record was a kmsg fragment: the next one goes on with its line.
    fragment_open: bool,
    lookback: Duration,
    bursts: XidBursts,
}

impl Ledger {
    fn new(rules: usize, config: &KernelLogConfig) -> Self {
        Ledger {
            entries: BTreeMap::new(),
            lines: 0,
            matches: vec![0; rules],
            read_error: None,
            recent: VecDeque::with_capacity(MAX_LINES),
            fragment_open: false,
            lookback: config.lookback,
            bursts: XidBursts::new(&config.xid_bursts),
        }
    }

    /// Takes in one record read at `now`; `uptime` converts a since-boot timestamp to a time.
    /// Returns whether any rule matched.
    fn record(
        &mut self,
        rules: &[Rule],
        record: &Record,
        uptime: Option<Duration>,
        now: SystemTime,
    ) -> bool {
        self.lines += 1;
        if !record.kernel {
            return false;
        }
        let at = record_time(record.stamp, uptime, now);
        // A continuation completes the message before it; what matched that one already is not
        // counted again.
        let joint = if self.fragment_open { Some(Joint::Fragment) } else { record.continued };
        self.fragment_open = record.fragment;
        let previous = match (self.recent.back_mut(), joint) {
            (Some(last), Some(joint)) => {
                let before = last.clone();
                if joint == Joint::Line {
                    last.push('\n');
                }
                last.push_str(&record.text);
                truncate_in_place(last, source::MAX_LINE_BYTES * 2);
                Some(before)
            }
            _ => {
                if self.recent.len() == MAX_LINES {
                    self.recent.pop_front();
                }
                self.recent.push_back(record.text.clone());
                None
            }
        };
        let text = self.recent.back().cloned().unwrap_or_default();
        let mut matched = false;
        for (index, rule) in rules.iter().enumerate() {
            let found = match_newest(rule, &self.recent, None);
            let found = found.filter(|_| {
                previous.is_none()
                    || match_newest(rule, &self.recent, previous.as_deref()).is_none()
            });
            let Some(found) = found else { continue };
            matched = true;
            if let Some(count) = self.matches.get_mut(index) {
                *count += 1;
            }
            // A match older than the lookback or its window (an old backlog line) does not count.
            let age = age(now, at);
            if age > rule.clear_after || age > self.lookback {
                continue;
            }
            self.bursts.observe(&found, at, &text);
            self.note(index, rule, found, (at, record.seq), &text);
        }
        // A line that says a condition is over clears what was seen of it before the line.
        for (index, rule) in rules.iter().enumerate() {
            let Some(subject) = rule.clears(&text) else { continue };
            if let Some(entry) = self.entries.get_mut(&(index, subject)) {
                entry.hits.retain(|hit| hit.at > at);
            }
        }
        matched
    }

    /// Keeps a match of the line logged at `at` (with its kmsg sequence number, if any).
    fn note(
        &mut self,
        index: usize,
        rule: &Rule,
        found: RuleMatch,
        (at, seq): (SystemTime, Option<u64>),
        line: &str,
    ) {
        let key = (index, found.subject);
        if !self.entries.contains_key(&key) {
            if found.status == Status::Ok {
                // Informational (an Xid the catalog ignores, a recovery action of none) about a
                // subject with nothing to clear.
                return;
            }
            if self.entries.len() >= MAX_SUBJECTS {
                let oldest =
                    self.entries.iter().min_by_key(|(_, e)| e.last_seen).map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    self.entries.remove(&oldest);
                }
            }
            self.entries.insert(key.clone(), Entry { hits: Vec::new(), last_seen: at });
        }
        let Some(entry) = self.entries.get_mut(&key) else { return };
        let hit = Hit {
            status: found.status,
            action: found.action,
            at,
            message: truncate_chars(line, MAX_MESSAGE_CHARS),
            labels: found.labels,
            count: 1,
            seq,
        };
        if rule.latest_wins {
            // A state (the driver's recovery action): the latest line is the truth, including a
            // change back to none, which clears it.
            if at >= entry.last_seen || entry.hits.is_empty() {
                entry.hits.clear();
                if hit.status != Status::Ok {
                    entry.hits.push(hit);
                }
                entry.last_seen = at;
            }
            return;
        }
        if hit.status == Status::Ok {
            // An informational line neither raises nor clears a condition.
            return;
        }
        entry.last_seen = entry.last_seen.max(at);
        match entry.hits.iter_mut().find(|h| h.status == hit.status && h.action == hit.action) {
            Some(same) => {
                same.count += 1;
                if at >= same.at {
                    same.at = at;
                    same.message = hit.message;
                    same.labels = hit.labels;
                    same.seq = hit.seq;
                }
            }
            None => entry.hits.push(hit),
        }
    }

    /// The findings at `now`, dropping hits whose window has passed.
    fn findings(&mut self, rules: &[Rule], now: SystemTime) -> Vec<Finding> {
        let mut findings = Vec::with_capacity(self.entries.len());
        for ((index, subject), entry) in &mut self.entries {
            let Some(rule) = rules.get(*index) else { continue };
            entry.hits.retain(|h| age(now, h.at) <= rule.clear_after);
            let worst =
                entry.hits.iter().max_by_key(|h| (h.status.severity(), h.action.weight(), h.at));
            let finding = match worst {
                Some(hit) => {
                    let count: u64 = entry.hits.iter().map(|h| h.count).sum();
                    let mut finding = Finding::new(
                        NAME,
                        &rule.finding,
                        subject.clone(),
                        hit.status,
                        hit.action,
                        hit.message.clone(),
                    )
                    .with_value(count as f64);
                    finding.labels = hit.labels.clone();
                    if let Some(seq) = hit.seq {
                        finding.labels.insert(KMSG_SEQ_LABEL.to_owned(), seq.to_string());
                    }
                    finding
                }
                None => Finding::new(
                    NAME,
                    &rule.finding,
                    subject.clone(),
                    Status::Ok,
                    RecommendedAction::None,
                    format!(
                        "cleared: no worse match in the last {}",
                        humantime::format_duration(rule.clear_after)
                    ),
                ),
            };
            findings.push(finding.with_label("rule", rule.name.clone()));
        }
        self.bursts.findings(now, &mut findings);
        findings
    }
}

/// `rule`'s match of the newest message — with `newest` in its place where given — and, for a
/// rule of several lines, the messages before it joined with `\n`; only a match that reaches into
/// the newest message counts.
fn match_newest(rule: &Rule, recent: &VecDeque<String>, newest: Option<&str>) -> Option<RuleMatch> {
    let last = newest.or(recent.back().map(String::as_str))?;
    if rule.lines <= 1 {
        return rule.matches(last);
    }
    let before = recent.len().saturating_sub(1);
    let mut joined: String = recent
        .iter()
        .take(before)
        .skip(before.saturating_sub(rule.lines - 1))
        .flat_map(|line| [line.as_str(), "\n"])
        .collect();
    let from = joined.len();
    joined.push_str(last);
    rule.matches_ending_after(&joined, from)
}

/// Cuts `text` to at most `max` bytes, at a character boundary.
fn truncate_in_place(text: &mut String, max: usize) {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
}

/// How long before `now` `at` was (zero for a time after `now`).
pub(crate) fn age(now: SystemTime, at: SystemTime) -> Duration {
    now.duration_since(at).unwrap_or(Duration::ZERO)
}

/// When a record was logged: a wall-clock stamp as it is; a since-boot one from the uptime read
/// at `now`; a record without a timestamp, or with no uptime to compare with, counts as `now`.
fn record_time(stamp: Stamp, uptime: Option<Duration>, now: SystemTime) -> SystemTime {
    match (stamp, uptime) {
        (Stamp::Wall(at), _) => at,
        (Stamp::SinceBoot(usec), Some(uptime)) => {
            let ago = uptime.saturating_sub(Duration::from_micros(usec));
            now.checked_sub(ago).unwrap_or(now)
        }
        _ => now,
    }
}

/// Seconds since boot from `{procfs}/uptime`; `None` when it cannot be read or makes no sense.
fn read_uptime(procfs: &Path) -> Option<Duration> {
    let text = std::fs::read_to_string(procfs.join("uptime")).ok()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    Duration::try_from_secs_f64(secs).ok()
}

/// Reads what the log holds now into the ledger; stops at `deadline`. Returns whether any record
/// matched.
fn read_into(
    reader: &mut LogReader,
    rules: &[Rule],
    ledger: &Mutex<Ledger>,
    procfs: &Path,
    flush_partial: bool,
    now: impl Fn() -> SystemTime,
    deadline: Option<Instant>,
) -> ReadOutcome {
    let mut matched = false;
    loop {
        let mut batch = Vec::new();
        let result = reader.read_available(BATCH, flush_partial, &mut |r| batch.push(r));
        // Uptime is read once per batch, and only when some record carries a timestamp.
        let uptime =
            if batch.iter().any(|r| r.usec().is_some()) { read_uptime(procfs) } else { None };
        let now = now();
        let mut ledger = lock(ledger);
        for record in &batch {
            matched |= ledger.record(rules, record, uptime, now);
        }
        match result {
            Ok(progress) => {
                ledger.read_error = None;
                drop(ledger);
                let out_of_time = deadline.is_some_and(|d| Instant::now() >= d);
                if !progress.more || out_of_time {
                    return ReadOutcome { matched, more: progress.more, failed: false };
                }
            }
            Err(err) => {
                ledger.read_error = Some(err.to_string());
                return ReadOutcome { matched, more: false, failed: true };
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct ReadOutcome {
    matched: bool,
    more: bool,
    failed: bool,
}

/// The ledger, also after a panic elsewhere poisoned the lock (its data stays consistent: every
/// change to it is a single step).
fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The daemon-mode thread that follows the log; stopped and joined when dropped.
#[derive(Debug)]
struct Follower {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            // Wakes it from its poll wait; it then sees the flag before reading again.
            handle.thread().unpark();
            if handle.join().is_err() {
                tracing::error!(check = NAME, "kernel-log follower thread panicked");
            }
        }
    }
}

struct FollowerTask {
    reader: LogReader,
    rules: Arc<[Rule]>,
    ledger: Arc<Mutex<Ledger>>,
    events: EventSignal,
    stop: Arc<AtomicBool>,
    poll_interval: Duration,
    procfs: PathBuf,
}

impl FollowerTask {
    fn run(mut self) {
        let mut failing = false;
        while !self.stop.load(Ordering::Relaxed) {
            let outcome = read_into(
                &mut self.reader,
                &self.rules,
                &self.ledger,
                &self.procfs,
                false,
                SystemTime::now,
                None,
            );
            if outcome.matched {
                // Once per batch rather than per line: the signal holds one wake-up anyway.
                self.events.raise();
            }
            if outcome.failed != failing {
                failing = outcome.failed;
                match lock(&self.ledger).read_error.as_deref() {
                    Some(err) if failing => {
                        tracing::warn!(check = NAME, error = %err, "kernel log unreadable; retrying")
                    }
                    _ => {
                        tracing::info!(check = NAME, path = %self.reader.path().display(), "reading kernel log")
                    }
                }
            }
            if outcome.more {
                continue;
            }
            let wait =
                if failing { self.poll_interval.max(REOPEN_INTERVAL) } else { self.poll_interval };
            // Unparked early when the check is dropped.
            std::thread::park_timeout(wait);
        }
    }
}

/// The kernel_log check.
#[derive(Debug)]
pub struct KernelLogCheck {
    rules: Arc<[Rule]>,
    /// Rules that did not compile: (name, why).
    broken: Vec<(String, String)>,
    ledger: Arc<Mutex<Ledger>>,
    /// The reader, when `run` reads itself (once mode, or no follower thread could start).
    reader: Option<LogReader>,
    path: PathBuf,
    procfs: PathBuf,
    follower: Option<Follower>,
}

/// The effective rules of `config` compiled, and those that did not compile: (name, why).
fn compile_rules(config: &KernelLogConfig) -> (Vec<Rule>, Vec<(String, String)>) {
    let mut compiled = Vec::new();
    let mut broken = Vec::new();
    for rule in rules::effective_rules(config.builtin_rules, &config.rules) {
        match rules::compile(&rule) {
            Ok(rule) => compiled.push(rule),
            Err(problems) => {
                let why: Vec<String> =
                    problems.iter().map(|(field, msg)| format!("{field}: {msg}")).collect();
                broken.push((rule.name.clone(), why.join("; ")));
            }
        }
    }
    (compiled, broken)
}

impl KernelLogCheck {
    pub fn new(config: &KernelLogConfig, ctx: BuildContext<'_>) -> Self {
        let (compiled, broken) = compile_rules(config);
        let rules: Arc<[Rule]> = compiled.into();
        let ledger = Arc::new(Mutex::new(Ledger::new(rules.len(), config)));
        let paths = ctx.paths;
        let mut check = KernelLogCheck {
            rules: rules.clone(),
            broken,
            ledger: ledger.clone(),
            reader: None,
            path: paths.kmsg.clone(),
            procfs: paths.procfs.clone(),
            follower: None,
        };
        if ctx.mode == Mode::Once {
            check.reader = Some(LogReader::new(&paths.kmsg, false));
            return check;
        }
        let mut reader = LogReader::new(&paths.kmsg, !config.read_existing);
        // Opened here, not in the thread, so "from the end" is the end when the check was built.
        if let Err(err) = reader.ensure_open() {
            lock(&ledger).read_error = Some(err.to_string());
        } else if config.read_existing {
            // The backlog is read before the first run, so the agent's first results (and its
            // startup report) already hold what the log says; bounded for a huge plain file.
            read_into(
                &mut reader,
                &rules,
                &ledger,
                &paths.procfs,
                false,
                SystemTime::now,
                Some(Instant::now() + BACKLOG_READ_LIMIT),
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let task = FollowerTask {
            reader,
            rules,
            ledger,
            events: ctx.events.clone(),
            stop: stop.clone(),
            poll_interval: config.poll_interval,
            procfs: paths.procfs.clone(),
        };
        match std::thread::Builder::new().name("kmsg-follower".into()).spawn(move || task.run()) {
            Ok(handle) => check.follower = Some(Follower { stop, handle: Some(handle) }),
            Err(err) => {
                // Still works, only without reporting at once: runs read the log themselves.
                tracing::warn!(check = NAME, error = %err, "cannot start the kernel-log follower; reading on each run");
                check.reader = Some(LogReader::new(&paths.kmsg, !config.read_existing));
            }
        }
        check
    }
}

impl Check for KernelLogCheck {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&mut self, ctx: &RunContext<'_>) -> Observation {
        if let Some(reader) = self.reader.as_mut() {
            let now = ctx.now;
            read_into(
                reader,
                &self.rules,
                &self.ledger,
                &self.procfs,
                true,
                || now,
                Some(ctx.deadline),
            );
        }
        let mut ledger = lock(&self.ledger);
        let mut findings = ledger.findings(&self.rules, ctx.now);
        let active = findings.iter().filter(|f| f.status != Status::Ok).count();
        let path = self.path.display().to_string();
        findings.push(
            match &ledger.read_error {
                Some(err) => Finding::new(
                    NAME,
                    NAME,
                    "",
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("cannot read the kernel log: {err}"),
                ),
                None => Finding::new(
                    NAME,
                    NAME,
                    "",
                    Status::Ok,
                    RecommendedAction::None,
                    format!("reading the kernel log; {active} rule finding(s) active"),
                ),
            }
            .with_label("path", path.clone()),
        );
        for (name, why) in &self.broken {
            findings.push(Finding::new(
                NAME,
                "kernel_log_rule",
                name.clone(),
                Status::Unknown,
                RecommendedAction::None,
                format!("rule not in effect: {why}"),
            ));
        }
        let mut samples = vec![Sample::new(&metrics::KMSG_LINES, ledger.lines as f64)];
        for (rule, count) in self.rules.iter().zip(&ledger.matches) {
            samples.push(
                Sample::new(&metrics::KMSG_MATCHES, *count as f64).label("rule", rule.name.clone()),
            );
        }
        Observation { findings, samples }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
