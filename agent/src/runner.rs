//! Runs the checks: each on its own interval, each run on a worker thread under the check's
//! timeout, and keeps the newest result of every check for scrapes, `/v1/health` and reports.
//!
//! A run that does not finish in time is recorded as timed out (naming the check) and the worker
//! is left to finish on its own; while it is still stuck the check is not started again, so a hung
//! probe costs one thread, not one per interval.
//!
//! A check whose query hangs is often the fault itself: NVML stuck in a GPU that stopped
//! answering the driver, a disk whose I/O never completes, a NIC driver that holds its lock. After
//! [`UNRESPONSIVE_AFTER`] timed-out runs in a row the GPU, disk and NIC checks fail with
//! `gpu_unresponsive`, `disk_unresponsive` or `nic_unresponsive` and recommend what clears such a
//! hang, so the fault that stalls the monitor is the fault reported (one timeout alone is an
//! `unknown` `check_timeout`: a slow run, not yet a fault).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_proto::{CheckRun, Finding, HealthView, RecommendedAction, Status, Verdict};
use tokio::sync::Notify;

use crate::checks::{CHECK_NAMES, Check, EventSignal, Observation, RunContext, ScheduledCheck};
use crate::config::{HostPaths, Schedule};
use crate::metrics::{self, Sample};
use crate::node::NodeIdentity;

/// The newest run of one check.
#[derive(Debug, Clone)]
pub struct CheckResult {
    pub check: &'static str,
    pub observation: Observation,
    pub duration: Duration,
    pub timed_out: bool,
    pub finished_at: SystemTime,
}

impl CheckResult {
    /// Worst status over the run's findings (`unknown` for a run with none).
    pub fn status(&self) -> Status {
        let mut findings = self.observation.findings.iter();
        let Some(first) = findings.next() else {
            return Status::Unknown;
        };
        findings.fold(first.status, |worst, finding| worst.worst(finding.status))
    }

    pub fn summary(&self) -> CheckRun {
        CheckRun {
            check: self.check.to_owned(),
            status: self.status(),
            duration_seconds: self.duration.as_secs_f64(),
            timed_out: self.timed_out,
            finished_at_ms: unix_millis(self.finished_at),
        }
    }

    /// The (finding, subject, status) of every non-ok finding: what a change worth reporting at once
    /// is measured against.
    fn problems(&self) -> BTreeSet<(String, String, Status)> {
        self.observation
            .findings
            .iter()
            .filter(|f| f.status != Status::Ok)
            .map(|f| (f.finding.clone(), f.subject.clone(), f.status))
            .collect()
    }
}

/// Timed-out runs in a row after which a hung GPU, disk or NIC check is a failure of its own.
pub const UNRESPONSIVE_AFTER: u32 = 3;

/// What a check that keeps hanging says about the node: its finding's id, the action that clears
/// such a hang, and why.
fn unresponsive(check: &str) -> Option<(&'static str, RecommendedAction, &'static str)> {
    use crate::checks::{disk, gpu, nic};
    match check {
        gpu::NAME => Some((
            "gpu_unresponsive",
            RecommendedAction::Reboot,
            "a GPU query (NVML) does not return: the driver or a GPU is hung, which a reboot resets",
        )),
        disk::NAME => Some((
            "disk_unresponsive",
            RecommendedAction::Reboot,
            "a disk probe does not return: I/O to a device is hung (tasks in D state clear only \
             with a reboot)",
        )),
        nic::NAME => Some((
            "nic_unresponsive",
            RecommendedAction::Drain,
            "a NIC query does not return: the network driver is hung",
        )),
        _ => None,
    }
}

/// One check, ready to run repeatedly.
pub struct CheckSlot {
    name: &'static str,
    check: Arc<Mutex<Box<dyn Check>>>,
    in_flight: Arc<AtomicBool>,
    /// Runs in a row that timed out.
    timeouts_in_a_row: AtomicU32,
    schedule: Schedule,
    events: EventSignal,
}

impl std::fmt::Debug for CheckSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckSlot").field("name", &self.name).finish_non_exhaustive()
    }
}

impl CheckSlot {
    pub fn new(scheduled: ScheduledCheck) -> CheckSlot {
        CheckSlot {
            name: scheduled.check.name(),
            check: Arc::new(Mutex::new(scheduled.check)),
            in_flight: Arc::new(AtomicBool::new(false)),
            timeouts_in_a_row: AtomicU32::new(0),
            schedule: scheduled.schedule,
            events: scheduled.events,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the check once on a blocking worker, waiting at most the check's timeout.
    pub async fn run(&self, paths: &Arc<HostPaths>) -> CheckResult {
        let name = self.name;
        let timeout = self.schedule.timeout;
        let started = Instant::now();
        if self.in_flight.swap(true, Ordering::AcqRel) {
            let in_a_row = self.timeouts_in_a_row.fetch_add(1, Ordering::AcqRel) + 1;
            return timed_out(name, timeout, "its previous run has not finished yet", in_a_row);
        }
        let check = Arc::clone(&self.check);
        let in_flight = Arc::clone(&self.in_flight);
        let paths = Arc::clone(paths);
        let deadline = started + timeout;
        let worker = tokio::task::spawn_blocking(move || {
            let ctx = RunContext { paths: &paths, now: SystemTime::now(), deadline };
            // A check that panicked earlier poisoned the lock; its state is still the best we have.
            let observation = check.lock().unwrap_or_else(PoisonError::into_inner).run(&ctx);
            in_flight.store(false, Ordering::Release);
            observation
        });
        match tokio::time::timeout(timeout, worker).await {
            Ok(Ok(observation)) => {
                self.timeouts_in_a_row.store(0, Ordering::Release);
                CheckResult {
                    check: name,
                    observation,
                    duration: started.elapsed(),
                    timed_out: false,
                    finished_at: SystemTime::now(),
                }
            }
            Ok(Err(join_error)) => {
                self.in_flight.store(false, Ordering::Release);
                let why = if join_error.is_panic() { "panicked" } else { "was cancelled" };
                tracing::error!(check = name, "check {why}");
                let finding = Finding::new(
                    name,
                    "check_failed",
                    "",
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("the {name} check {why}"),
                );
                CheckResult {
                    check: name,
                    observation: Observation { findings: vec![finding], samples: Vec::new() },
                    duration: started.elapsed(),
                    timed_out: false,
                    finished_at: SystemTime::now(),
                }
            }
            Err(_elapsed) => {
                let in_a_row = self.timeouts_in_a_row.fetch_add(1, Ordering::AcqRel) + 1;
                tracing::warn!(check = name, timeout = ?timeout, in_a_row, "check timed out");
                timed_out(name, timeout, "it did not finish in time", in_a_row)
            }
        }
    }
}

/// The result of a run that timed out, the `in_a_row`-th in a row: `check_timeout` (unknown), or
/// past [`UNRESPONSIVE_AFTER`] the check's own `*_unresponsive` failure where it has one.
fn timed_out(name: &'static str, timeout: Duration, why: &str, in_a_row: u32) -> CheckResult {
    let took = humantime::format_duration(Duration::from_millis(timeout.as_millis() as u64));
    let finding = match unresponsive(name).filter(|_| in_a_row >= UNRESPONSIVE_AFTER) {
        Some((id, action, meaning)) => Finding::new(
            name,
            id,
            "",
            Status::Fail,
            action,
            format!("{meaning}: {in_a_row} runs in a row timed out after {took} each ({why})"),
        ),
        None => Finding::new(
            name,
            "check_timeout",
            "",
            Status::Unknown,
            RecommendedAction::None,
            format!("the {name} check timed out after {took}: {why}"),
        ),
    };
    CheckResult {
        check: name,
        observation: Observation { findings: vec![finding], samples: Vec::new() },
        duration: timeout,
        timed_out: true,
        finished_at: SystemTime::now(),
    }
}

/// Everything the agent knows now; shared by the check loops, the HTTP server and the reporter.
#[derive(Debug)]
pub struct AgentState {
    pub identity: NodeIdentity,
    started_at: SystemTime,
    results: RwLock<BTreeMap<&'static str, CheckResult>>,
    timeouts: Mutex<BTreeMap<&'static str, u64>>,
    reports_ok: AtomicU64,
    reports_failed: AtomicU64,
    last_report_ok_ms: AtomicU64,
    /// The repairer reports go to now (its configured base URL).
    repairer: Mutex<Option<String>>,
    repairer_switches: AtomicU64,
    /// Raised when something worth reporting at once happened.
    report_now: Notify,
    /// The listener's connection counts, for `/metrics`.
    pub listener: Arc<fleetmend_listener::ListenerStats>,
}

impl AgentState {
    pub fn new(identity: NodeIdentity) -> AgentState {
        AgentState {
            identity,
            started_at: SystemTime::now(),
            results: RwLock::new(BTreeMap::new()),
            timeouts: Mutex::new(BTreeMap::new()),
            reports_ok: AtomicU64::new(0),
            reports_failed: AtomicU64::new(0),
            last_report_ok_ms: AtomicU64::new(0),
            repairer: Mutex::new(None),
            repairer_switches: AtomicU64::new(0),
            report_now: Notify::new(),
            listener: Arc::default(),
        }
    }

    /// Keeps `result` as its check's newest; true when the set of problems changed.
    pub fn record(&self, result: CheckResult) -> bool {
        if result.timed_out {
            *self
                .timeouts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(result.check)
                .or_default() += 1;
        }
        let mut results = self.results.write().unwrap_or_else(PoisonError::into_inner);
        let changed = match results.get(result.check) {
            Some(previous) => previous.problems() != result.problems(),
            None => true,
        };
        results.insert(result.check, result);
        changed
    }

    /// The newest result of every check, in the registry's order.
    pub fn results(&self) -> Vec<CheckResult> {
        let results = self.results.read().unwrap_or_else(PoisonError::into_inner);
        let mut ordered: Vec<CheckResult> = results.values().cloned().collect();
        ordered.sort_by_key(|r| CHECK_NAMES.iter().position(|n| *n == r.check));
        ordered
    }

    pub fn health(&self) -> HealthView {
        let results = self.results();
        let findings: Vec<Finding> =
            results.iter().flat_map(|r| r.observation.findings.iter().cloned()).collect();
        HealthView {
            node: self.identity.node.clone(),
            boot_id: self.identity.boot_id.clone(),
            agent_version: self.identity.agent_version.clone(),
            verdict: Verdict::of(&findings),
            checks: results.iter().map(CheckResult::summary).collect(),
            findings,
        }
    }

    pub fn note_report(&self, delivered: bool) {
        if delivered {
            self.reports_ok.fetch_add(1, Ordering::Relaxed);
            self.last_report_ok_ms.store(unix_millis(SystemTime::now()), Ordering::Relaxed);
        } else {
            self.reports_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reports go to `url` now; `switched`: it moved there from another repairer.
    pub fn note_repairer(&self, url: &str, switched: bool) {
        *self.repairer.lock().unwrap_or_else(PoisonError::into_inner) = Some(url.to_owned());
        if switched {
            self.repairer_switches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The repairer reports go to now, and how many times they moved.
    pub fn repairer(&self) -> (Option<String>, u64) {
        let url = self.repairer.lock().unwrap_or_else(PoisonError::into_inner).clone();
        (url, self.repairer_switches.load(Ordering::Relaxed))
    }

    pub fn request_report(&self) {
        self.report_now.notify_one();
    }

    pub async fn report_requested(&self) {
        self.report_now.notified().await;
    }

    /// Every sample for `/metrics`: the agent's own, each check's run and status, then each check's.
    pub fn samples(&self) -> Vec<Sample> {
        let id = &self.identity;
        let mut samples = vec![
            Sample::new(&metrics::AGENT_INFO, 1.0)
                .label("version", id.agent_version.clone())
                .label("node", id.node.clone()),
            Sample::new(&metrics::AGENT_START_TIME, unix_seconds(self.started_at)),
            Sample::new(&metrics::AGENT_REPORTS, self.reports_ok.load(Ordering::Relaxed) as f64)
                .label("result", "ok"),
            Sample::new(
                &metrics::AGENT_REPORTS,
                self.reports_failed.load(Ordering::Relaxed) as f64,
            )
            .label("result", "error"),
        ];
        let (repairer, switches) = self.repairer();
        samples.push(Sample::new(&metrics::AGENT_REPAIRER_SWITCHES, switches as f64));
        if let Some(url) = repairer {
            samples.push(Sample::new(&metrics::AGENT_REPAIRER, 1.0).label("url", url));
        }
        samples.extend(listener_samples(&self.listener));
        let last_ok = self.last_report_ok_ms.load(Ordering::Relaxed);
        if last_ok > 0 {
            samples.push(Sample::new(&metrics::AGENT_LAST_REPORT, last_ok as f64 / 1000.0));
        }
        let timeouts = self.timeouts.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let results = self.results();
        for result in &results {
            let check = result.check;
            samples.push(
                Sample::new(&metrics::CHECK_DURATION, result.duration.as_secs_f64())
                    .label("check", check),
            );
            samples.push(
                Sample::new(&metrics::CHECK_SUCCESS, if result.timed_out { 0.0 } else { 1.0 })
                    .label("check", check),
            );
            samples.push(
                Sample::new(
                    &metrics::CHECK_TIMEOUTS,
                    timeouts.get(check).copied().unwrap_or(0) as f64,
                )
                .label("check", check),
            );
            samples.push(
                Sample::new(&metrics::CHECK_LAST_RUN, unix_seconds(result.finished_at))
                    .label("check", check),
            );
            let mut worst: BTreeMap<&str, Status> = BTreeMap::new();
            for finding in &result.observation.findings {
                worst
                    .entry(finding.subject.as_str())
                    .and_modify(|s| *s = s.worst(finding.status))
                    .or_insert(finding.status);
            }
            for (subject, status) in worst {
                samples.push(
                    Sample::new(&metrics::CHECK_STATUS, status.metric_value())
                        .label("check", check)
                        .label("subject", subject),
                );
            }
        }
        for result in results {
            samples.extend(result.observation.samples);
        }
        samples
    }
}

/// Runs every check once, concurrently, each under its own timeout; results in the slots' order.
pub async fn run_all(slots: &[Arc<CheckSlot>], paths: &Arc<HostPaths>) -> Vec<CheckResult> {
    let mut set = tokio::task::JoinSet::new();
    for (index, slot) in slots.iter().enumerate() {
        let slot = Arc::clone(slot);
        let paths = Arc::clone(paths);
        set.spawn(async move { (index, slot.run(&paths).await) });
    }
    let mut results: Vec<Option<CheckResult>> = vec![None; slots.len()];
    while let Some(joined) = set.join_next().await {
        // `CheckSlot::run` does not panic (a check's panic is caught on its worker), so a join error
        // can only be a cancelled runtime; that check's result is then simply missing.
        if let Ok((index, result)) = joined {
            results[index] = Some(result);
        }
    }
    results.into_iter().flatten().collect()
}

/// The daemon loop of one check: runs on every interval tick and whenever the check raises its
/// event signal; asks for a report at once on an event or when the check's problems changed.
pub async fn check_loop(state: Arc<AgentState>, slot: Arc<CheckSlot>, paths: Arc<HostPaths>) {
    let period = slot.schedule.interval;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let event = tokio::select! {
            _ = ticker.tick() => false,
            _ = slot.events.raised() => true,
        };
        let result = slot.run(&paths).await;
        if state.record(result) || event {
            state.request_report();
        }
    }
}

pub fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The listener's series: open connections, the cap, shed connections, deadlines overrun by phase.
fn listener_samples(stats: &fleetmend_listener::ListenerStats) -> Vec<Sample> {
    let mut samples = vec![
        Sample::new(&metrics::HTTP_CONNECTIONS_OPEN, stats.open() as f64),
        Sample::new(&metrics::HTTP_CONNECTIONS_MAX, stats.max() as f64),
        Sample::new(&metrics::HTTP_CONNECTIONS_SHED, stats.shed() as f64),
    ];
    for (phase, count) in stats.timeouts() {
        samples.push(
            Sample::new(&metrics::HTTP_TIMEOUTS, count as f64).label("phase", phase.as_str()),
        );
    }
    samples
}
