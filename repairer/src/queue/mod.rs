//! The embedded job queue (`scheduler = "embedded"`): FIFO with priorities, gang allocation of N
//! healthy nodes with one rank per node, ranks launched through each node's agent (the command
//! rides in the reply to the agent's report) with the checkpoint protocol's environment, and
//! auto-resume: a failed rank or a drained node stops the job (SIGUSR1, then SIGTERM, then
//! SIGKILL), requeues it at the front of its priority, and restarts it on N healthy nodes from its
//! newest checkpoint, until its restarts run out.
//!
//! It is also the repairer's [`Scheduler`]: drain, undrain, the jobs on a node, checkpoint and
//! requeue. Every job is one JSON document in the repairer's store, written on every change of
//! state (progress figures at the next tick), so a restarted repairer reloads every job and keeps
//! its running ranks: their agents go on reporting them.

pub mod config;
pub mod interval;
pub mod job;
pub mod placement;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fleetmend_proto::jobs::{PROGRESS_TOKEN_VAR, PROGRESS_URL_VAR, command_with_args};
use fleetmend_proto::{
    NodeCommand, Progress, ProgressReply, RankKey, RankSignal, RankState, Report, ReportTrigger,
    RunRank, SignalRank, command_kind,
};
use fleetmend_runtime::checkpoint::ProtocolEnv;
use serde::{Deserialize, Serialize};

pub use self::config::QueueConfig;
pub use self::job::{
    AttemptRecord, CheckpointEvery, Job, JobSpec, JobState, JobView, RankRecord, Stop, StopCause,
    StopPhase,
};
use self::placement::{Candidate, Placement, Waiting};
use crate::clock::{self, SharedClock};
use crate::commands::CommandQueue;
use crate::metrics::ResumeSeconds;
use crate::model::{Actor, Event, EventKind, NodeState, Severity};
use crate::ports::{EventLog, FleetView, ReportObserver};
use crate::scheduler::{DRAIN_REASON_PREFIX, JobRef, SchedulerError, UndrainOutcome};
use crate::store::StoreError;

/// The settings key of the nodes drained in the queue.
const DRAINED_KEY: &str = "queue.drained";
/// The scheduler's name in errors.
pub(crate) const NAME: &str = "embedded";

/// A node drained in the queue, and by whom (a reason starting with [`DRAIN_REASON_PREFIX`] is
/// fleetmend's own; any other is an admin's, which fleetmend never undrains).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueDrain {
    pub reason: String,
    pub since_ms: u64,
}

/// A queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("no job {0}")]
    UnknownJob(String),
    #[error("the job is not valid: {}", .0.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    InvalidSpec(Vec<(String, String)>),
    #[error("job {job}: {message}")]
    Conflict { job: String, message: String },
    #[error("progress of job {job}: wrong or missing bearer token")]
    Unauthorized { job: String },
    #[error("progress of job {job}: {message}")]
    BadProgress { job: String, message: String },
    #[error("job {job}: {source}")]
    Store { job: String, source: StoreError },
    #[error("loading the job queue: {0}")]
    Load(#[from] StoreError),
}

/// What the queue last heard from a node.
#[derive(Debug, Clone, Default)]
struct NodeSeen {
    address: Option<String>,
    boot_id: String,
    seq: u64,
    /// Ranks (of any job) its latest report lists as running.
    live: BTreeSet<RankKey>,
}

#[derive(Debug, Default)]
struct QueueState {
    jobs: BTreeMap<String, Job>,
    next_seq: u64,
    drained: BTreeMap<String, QueueDrain>,
    nodes: BTreeMap<String, NodeSeen>,
    /// Nodes with a rank of an active job: a report from any other node with no ranks is
    /// passed over at once (the hot path at 100,000 nodes).
    assigned: BTreeSet<String>,
    /// Ranks of old attempts still running, and when SIGKILL was last sent to them.
    stale_kills: BTreeMap<RankKey, u64>,
    /// Jobs whose progress figures changed since they were last saved.
    dirty: BTreeSet<String>,
    /// Observed MTBF per job size, and when it was computed.
    mtbf: BTreeMap<u32, (u64, f64)>,
}

/// Figures for `/metrics`.
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    pub by_state: BTreeMap<JobState, u64>,
    /// Per job: id, restarts, goodput ratio, steps lost, newest step.
    pub jobs: Vec<JobFigures>,
    pub resume_seconds: ResumeSeconds,
}

/// One job's figures for `/metrics`.
#[derive(Debug, Clone)]
pub struct JobFigures {
    pub id: String,
    pub restarts: u32,
    pub goodput_ratio: f64,
    pub steps_lost: u64,
    pub step: Option<u64>,
    /// The current attempt's newest progress: loss, throughput and its newest checkpoint.
    pub progress: Option<Progress>,
}

/// Finished jobs kept in `/metrics` (with every unfinished one): job ids are unbounded over time.
const FINISHED_JOBS_IN_METRICS: usize = 50;

/// The embedded job queue.
pub struct JobQueue {
    config: QueueConfig,
    events: Arc<EventLog>,
    commands: Arc<CommandQueue>,
    /// The nodes' states and last reports, as placement reads them.
    fleet: Arc<dyn FleetView>,
    clock: SharedClock,
    /// `<base>/v1/jobs/<id>/progress`: the URL ranks reach the repairer at.
    progress_base: String,
    /// A node with no report for this long is not eligible (the engine's unreachable window).
    unreachable_window_ms: u64,
    state: Mutex<QueueState>,
    resume_seconds: ResumeSeconds,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue").field("config", &self.config).finish_non_exhaustive()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A random token for a job's progress posts.
fn random_token() -> String {
    let mut bytes = [0u8; 24];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if let Err(err) = read {
        // Not a secret of the cluster (it guards progress figures only): a weaker source will do.
        tracing::warn!(error = %err, "reading /dev/urandom failed: using a weaker random source");
        for byte in &mut bytes {
            *byte = fastrand::u8(..);
        }
    }
    hex::encode(bytes)
}

impl JobQueue {
    /// Loads every job and the queue's drains from the store; ranks post their progress to
    /// `progress_base`.
    pub fn load(
        config: QueueConfig,
        ports: QueuePorts,
        unreachable_window: std::time::Duration,
        progress_base: &str,
    ) -> Result<Arc<JobQueue>, QueueError> {
        let QueuePorts { events, commands, fleet, clock } = ports;
        let jobs: Vec<Job> = events.store().jobs()?;
        let drained: BTreeMap<String, QueueDrain> =
            events.store().setting(DRAINED_KEY)?.unwrap_or_default();
        let now = clock.now_ms();
        let mut state = QueueState {
            next_seq: jobs.iter().map(|j| j.seq).max().unwrap_or(0) + 1,
            drained,
            ..QueueState::default()
        };
        for mut job in jobs {
            // Ranks not seen yet get a fresh start timeout: their run-rank commands waited in the
            // previous process's memory and are sent again at start.
            for rank in job.ranks.iter_mut().filter(|r| r.status.is_none()) {
                rank.launched_ms = now;
            }
            state.jobs.insert(job.id.clone(), job);
        }
        reindex(&mut state);
        Ok(Arc::new(JobQueue {
            config,
            events,
            commands,
            fleet,
            clock,
            progress_base: progress_base.trim_end_matches('/').to_owned(),
            unreachable_window_ms: unreachable_window.as_millis() as u64,
            state: Mutex::new(state),
            resume_seconds: ResumeSeconds::new(),
        }))
    }

    /// Sends again what a previous process may not have delivered, and starts the tick.
    pub fn start(self: &Arc<Self>) {
        {
            let state = self.lock();
            for job in state.jobs.values() {
                match (job.state, &job.stop) {
                    (JobState::Starting | JobState::Running, _) => {
                        for rank in job.ranks.iter().filter(|r| r.status.is_none()) {
                            self.commands.push(&rank.node, self.run_rank_command(job, rank));
                        }
                    }
                    (JobState::Stopping, Some(stop)) => {
                        self.signal_live(job, phase_signal(stop.phase));
                    }
                    _ => {}
                }
            }
        }
        let queue = Arc::downgrade(self);
        tokio::spawn(clock::every(self.clock.clone(), self.config.tick, move |now| {
            let Some(queue) = queue.upgrade() else { return false };
            queue.tick(now);
            true
        }));
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn event(&self, kind: EventKind, severity: Severity, node: Option<&str>, reason: String) {
        let now = self.clock.now_ms();
        let event = Event::new(kind, severity, node, Actor("queue".to_owned()), reason, now);
        // Logged and counted by the event log.
        let _recorded = self.events.record(&event);
    }

    fn save(&self, job: &Job) {
        let saved = self.events.store().put_job(&job.id, job.seq, job.state.as_str(), job);
        if let Err(err) = self.events.write("put_job", saved) {
            tracing::error!(job = %job.id, error = %err, "saving the job failed");
        }
    }

    fn save_drains(&self, drained: &BTreeMap<String, QueueDrain>) -> Result<(), SchedulerError> {
        let saved = self.events.store().put_setting(DRAINED_KEY, drained);
        self.events.write("put_setting", saved).map_err(|err| SchedulerError::Failed {
            scheduler: NAME,
            operation: "drain",
            message: err.to_string(),
        })
    }

    // --- the API ---------------------------------------------------------------------------------

    /// Queues a job.
    pub fn submit(&self, spec: JobSpec, who: &str) -> Result<JobView, QueueError> {
        let problems = spec.problems();
        if !problems.is_empty() {
            return Err(QueueError::InvalidSpec(problems));
        }
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let seq = state.next_seq;
        let id = format!("j-{seq}");
        let job = Job {
            id: id.clone(),
            seq,
            name: spec.display_name(),
            submitted_ms: now,
            state: JobState::Queued,
            state_since_ms: now,
            reason: format!("waits for {} node(s)", spec.nodes),
            attempt: 0,
            restarts: 0,
            nodes: Vec::new(),
            master_addr: None,
            master_port: None,
            progress_token: random_token(),
            ranks: Vec::new(),
            stop: None,
            history: Vec::new(),
            goodput: Default::default(),
            measured: Default::default(),
            checkpoint_interval: None,
            finished_ms: None,
            spec,
        };
        let saved = self.events.store().put_job(&id, seq, job.state.as_str(), &job);
        self.events
            .write("put_job", saved)
            .map_err(|source| QueueError::Store { job: id.clone(), source })?;
        state.next_seq += 1;
        self.event(
            EventKind::JobSubmitted,
            Severity::Info,
            None,
            format!(
                "job {id} ({}) submitted by {who}: {} node(s), priority {}, max_restarts {}",
                job.name, job.spec.nodes, job.spec.priority, job.spec.max_restarts
            ),
        );
        let view = job.view(now);
        state.jobs.insert(id, job);
        Ok(view)
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Vec<JobView> {
        let now = self.clock.now_ms();
        let state = self.lock();
        let mut jobs: Vec<&Job> = state.jobs.values().collect();
        jobs.sort_by_key(|j| j.seq);
        jobs.into_iter().map(|j| j.view(now)).collect()
    }

    pub fn job(&self, id: &str) -> Option<JobView> {
        self.lock().jobs.get(id).map(|j| j.view(self.clock.now_ms()))
    }

    /// A person cancels a job: a queued one at once, a running one by SIGTERM then SIGKILL.
    pub fn cancel(&self, id: &str, who: &str) -> Result<JobView, QueueError> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let job = state.jobs.get_mut(id).ok_or_else(|| QueueError::UnknownJob(id.to_owned()))?;
        let reason = format!("cancelled by {who}");
        match job.state {
            JobState::Queued => {
                job.finished_ms = Some(now);
                set_state(job, JobState::Cancelled, &reason, now);
                self.event(EventKind::JobCancelled, Severity::Info, None, self.about(job, &reason));
                self.save(job);
            }
            JobState::Starting | JobState::Running => {
                self.begin_stop(job, StopCause::Cancel, &reason, now);
            }
            JobState::Stopping => {
                if let Some(stop) = job.stop.as_mut()
                    && stop.cause != StopCause::Cancel
                {
                    stop.cause = StopCause::Cancel;
                    stop.reason = reason;
                    if stop.phase == StopPhase::Checkpoint {
                        stop.phase = StopPhase::Term;
                        stop.phase_since_ms = now;
                        self.signal_live(job, RankSignal::Term);
                    }
                    self.save(job);
                }
            }
            state => {
                return Err(QueueError::Conflict {
                    job: id.to_owned(),
                    message: format!("is {state} already"),
                });
            }
        }
        let view = job.view(now);
        reindex(&mut state);
        Ok(view)
    }

    /// Whether `token` is job `id`'s progress token (checked before a body is judged, so a
    /// stranger learns nothing from its errors).
    pub fn check_token(&self, id: &str, token: Option<&str>) -> Result<(), QueueError> {
        let state = self.lock();
        let job = state.jobs.get(id).ok_or_else(|| QueueError::UnknownJob(id.to_owned()))?;
        match token {
            Some(token) if constant_time_eq(token.as_bytes(), job.progress_token.as_bytes()) => {
                Ok(())
            }
            _ => Err(QueueError::Unauthorized { job: id.to_owned() }),
        }
    }

    /// A rank's progress post (`token` is the bearer token it presented).
    pub fn progress(
        &self,
        id: &str,
        token: Option<&str>,
        progress: &Progress,
    ) -> Result<ProgressReply, QueueError> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let job = state.jobs.get(id).ok_or_else(|| QueueError::UnknownJob(id.to_owned()))?;
        match token {
            Some(token) if constant_time_eq(token.as_bytes(), job.progress_token.as_bytes()) => {}
            _ => return Err(QueueError::Unauthorized { job: id.to_owned() }),
        }
        if progress.job != id {
            return Err(QueueError::BadProgress {
                job: id.to_owned(),
                message: format!("the body is about job {:?}", progress.job),
            });
        }
        let nodes = job.spec.nodes;
        let auto = job.spec.checkpoint_every == Some(CheckpointEvery::Auto);
        let mtbf = if auto { Some(self.mtbf_seconds(&mut state, nodes, now)) } else { None };
        let Some(job) = state.jobs.get_mut(id) else {
            return Err(QueueError::UnknownJob(id.to_owned()));
        };
        let current = job.state.is_active()
            && progress.attempt == job.attempt
            && (progress.rank as usize) < job.ranks.len();
        // Posts of an old attempt (a rank that outlived its stop) change nothing.
        if current {
            self.account(job, progress, now);
            job.ranks[progress.rank as usize].progress = Some(progress.clone());
            if let Some(seconds) = progress.checkpoint_write_seconds {
                job.measured.checkpoint_write_seconds = Some(seconds);
            }
            if job.state == JobState::Stopping {
                self.advance_stop(job, now);
            }
        }
        let checkpoint_every = match job.spec.checkpoint_every {
            Some(CheckpointEvery::Steps(n)) => Some(n),
            Some(CheckpointEvery::Auto) => {
                let steps = interval::young_daly_steps(
                    job.measured.checkpoint_write_seconds,
                    mtbf.unwrap_or(self.config.mtbf_prior.as_secs_f64()),
                    job.measured.steps_per_second,
                );
                job.checkpoint_interval = steps.or(job.checkpoint_interval);
                job.checkpoint_interval
            }
            None => None,
        };
        if current {
            let id = job.id.clone();
            state.dirty.insert(id);
        }
        reindex(&mut state);
        Ok(ProgressReply { checkpoint_every })
    }

    /// The observed MTBF of jobs of `nodes` ranks (the prior when none failed), cached a while:
    /// it reads every job's history.
    fn mtbf_seconds(&self, state: &mut QueueState, nodes: u32, now: u64) -> f64 {
        if let Some((at, value)) = state.mtbf.get(&nodes)
            && now.saturating_sub(*at) < 10_000
        {
            return *value;
        }
        let value = interval::observed_mtbf_seconds(state.jobs.values(), nodes, now)
            .unwrap_or(self.config.mtbf_prior.as_secs_f64());
        state.mtbf.insert(nodes, (now, value));
        value
    }

    /// Goodput accounting from the lead rank's posts (the lowest rank posting in the attempt:
    /// ranks step together, so one rank's progress is the job's).
    fn account(&self, job: &mut Job, p: &Progress, now: u64) {
        let lead = match &job.goodput.last_observation {
            Some(o) if o.attempt == p.attempt => p.rank <= o.rank,
            _ => true,
        };
        let previous_last =
            job.history.iter().rev().find(|a| a.attempt + 1 == p.attempt).and_then(|a| a.last_step);
        let failure_ms = job.goodput.failure_ms;
        let mut lost = 0;
        let mut resumed_after = None;
        let mut rate = None;
        if let Some(attempt) = job.current_attempt_mut() {
            attempt.last_step = Some(attempt.last_step.unwrap_or(0).max(p.step));
            if lead {
                if attempt.resumed_from_step.is_none() {
                    attempt.resumed_from_step = Some(p.start_step);
                    if let Some(last) = previous_last {
                        lost = last.saturating_sub(p.start_step);
                        attempt.steps_lost = Some(lost);
                    }
                }
                match attempt.rate_base {
                    None => attempt.rate_base = Some((p.step, p.at_ms)),
                    Some((step, at)) if p.step > step && p.at_ms > at => {
                        rate = Some((p.step - step) as f64 / ((p.at_ms - at) as f64 / 1000.0));
                    }
                    Some(_) => {}
                }
                if attempt.first_step_ms.is_none() && p.step > p.start_step {
                    attempt.first_step_ms = Some(now);
                    if attempt.attempt > 0
                        && let Some(failed) = failure_ms
                    {
                        let seconds = now.saturating_sub(failed) as f64 / 1000.0;
                        attempt.resume_seconds = Some(seconds);
                        resumed_after = Some(seconds);
                    }
                }
            }
        }
        if !lead {
            return;
        }
        job.goodput.steps_lost_total += lost;
        if rate.is_some() {
            job.measured.steps_per_second = rate;
        }
        if let Some(seconds) = resumed_after {
            self.resume_seconds.observe(seconds);
        }
        let high = job.goodput.high_water_step;
        if let Some(o) = &job.goodput.last_observation
            && o.attempt == p.attempt
            && o.rank == p.rank
            && p.step > o.step
        {
            // Only steps past the furthest ever reached are new work; redone ones are not.
            let advanced = p.step - o.step;
            let fresh = p.step.saturating_sub(o.step.max(high));
            let elapsed = p.at_ms.saturating_sub(o.at_ms);
            job.goodput.productive_ms += elapsed * fresh / advanced;
        }
        job.goodput.high_water_step = high.max(p.step);
        let newer = job
            .goodput
            .last_observation
            .as_ref()
            .is_none_or(|o| o.attempt != p.attempt || o.rank != p.rank || p.step > o.step);
        if newer {
            job.goodput.last_observation = Some(job::Observation {
                attempt: p.attempt,
                rank: p.rank,
                step: p.step,
                at_ms: p.at_ms,
            });
        }
    }

    /// Figures for `/metrics`.
    pub fn metrics(&self) -> QueueMetrics {
        let now = self.clock.now_ms();
        let state = self.lock();
        let mut by_state: BTreeMap<JobState, u64> = JobState::ALL.iter().map(|s| (*s, 0)).collect();
        for job in state.jobs.values() {
            *by_state.entry(job.state).or_default() += 1;
        }
        let mut finished: Vec<&Job> = state.jobs.values().filter(|j| j.state.is_final()).collect();
        finished.sort_by_key(|j| std::cmp::Reverse(j.finished_ms.unwrap_or(0)));
        let shown = state
            .jobs
            .values()
            .filter(|j| !j.state.is_final())
            .chain(finished.into_iter().take(FINISHED_JOBS_IN_METRICS));
        let jobs = shown
            .map(|j| JobFigures {
                id: j.id.clone(),
                restarts: j.restarts,
                goodput_ratio: j.goodput_ratio(now),
                steps_lost: j.goodput.steps_lost_total,
                step: j.step(),
                progress: j.latest_progress().cloned(),
            })
            .collect();
        let resume_seconds = self.resume_seconds.clone();
        QueueMetrics { by_state, jobs, resume_seconds }
    }

    /// Drains `node` as an admin would outside fleetmend (the reason is not fleetmend's, so
    /// fleetmend never undrains it).
    pub fn admin_drain(&self, node: &str, reason: &str) -> Result<(), SchedulerError> {
        self.drain_node(node, reason)
    }

    /// The nodes drained in the queue, with their reasons.
    pub fn drained(&self) -> BTreeMap<String, QueueDrain> {
        self.lock().drained.clone()
    }

    // --- reports and time --------------------------------------------------------------------------

    /// Takes in the ranks a node's agent reports (called with every report, before the reply's
    /// commands are taken, so the queue's commands for the node ride in the same reply).
    pub fn observe_report(&self, report: &Report, now: u64) {
        let mut state = self.lock();
        let seen = state.nodes.entry(report.node.clone()).or_default();
        // Reports of one agent may arrive out of order; an older snapshot of its ranks must not
        // undo a newer one. An agent process restart starts its sequence again.
        let stale = seen.boot_id == report.boot_id
            && report.seq < seen.seq
            && report.trigger != ReportTrigger::Startup;
        if stale {
            return;
        }
        seen.boot_id.clone_from(&report.boot_id);
        seen.seq = report.seq;
        if report.address.is_some() {
            seen.address.clone_from(&report.address);
        }
        let had_live = !seen.live.is_empty();
        seen.live = report
            .ranks
            .iter()
            .filter(|r| r.state == RankState::Running)
            .map(|r| r.key.clone())
            .collect();
        if report.ranks.is_empty() && !had_live && !state.assigned.contains(&report.node) {
            return;
        }
        let mut touched: BTreeSet<String> = BTreeSet::new();
        let mut stale_running: Vec<RankKey> = Vec::new();
        for status in &report.ranks {
            match state.jobs.get_mut(&status.key.job) {
                Some(job) if job.state.is_active() && job.attempt == status.key.attempt => {
                    if let Some(rank) = job.ranks.get_mut(status.key.rank as usize)
                        && rank.node == report.node
                        && rank.status.as_ref() != Some(status)
                    {
                        rank.status = Some(status.clone());
                        touched.insert(job.id.clone());
                    }
                }
                Some(_) if status.state == RankState::Running => {
                    stale_running.push(status.key.clone());
                }
                _ => {}
            }
        }
        if state.assigned.contains(&report.node) {
            // A rank seen running that its node no longer reports is gone: the agent restarted
            // or the node rebooted.
            for job in state.jobs.values_mut().filter(|j| j.state.is_active()) {
                let attempt = job.attempt;
                for rank in job.ranks.iter_mut().filter(|r| r.node == report.node) {
                    let listed = report.ranks.iter().any(|s| {
                        s.key.job == job.id && s.key.attempt == attempt && s.key.rank == rank.rank
                    });
                    if let Some(status) = rank.status.as_mut()
                        && status.state == RankState::Running
                        && !listed
                    {
                        status.state = RankState::Exited;
                        status.message =
                            "no longer in its node's reports (the agent restarted or the node rebooted)"
                                .to_owned();
                        status.finished_at_ms = Some(now);
                        touched.insert(job.id.clone());
                    }
                }
            }
        }
        for key in stale_running {
            let due = state.stale_kills.get(&key).is_none_or(|sent| {
                now.saturating_sub(*sent) >= self.config.stop_grace.as_millis() as u64
            });
            if due {
                tracing::info!(rank = %key, node = %report.node, "killing a rank of an old attempt");
                self.commands.push(&report.node, signal_command(&key, RankSignal::Kill));
                state.stale_kills.insert(key, now);
            }
        }
        for id in &touched {
            if let Some(job) = state.jobs.get_mut(id) {
                self.advance(job, now, None);
                self.save(job);
            }
        }
        if !touched.is_empty() {
            reindex(&mut state);
        }
    }

    /// Time-based work: start timeouts, lost nodes, the stop sequence, placement, saving progress.
    pub fn tick(&self, now: u64) {
        // The engine's lock is taken before the queue's, never inside it.
        let health: BTreeMap<String, (NodeState, u64)> = self
            .fleet
            .node_health()
            .into_iter()
            .map(|n| (n.name, (n.state, n.last_report_ms)))
            .collect();
        let mut state = self.lock();
        let drained = state.drained.clone();
        let unusable = |node: &str| -> Option<String> {
            if let Some(drain) = drained.get(node) {
                return Some(format!("its node was drained ({})", drain.reason));
            }
            match health.get(node) {
                Some((NodeState::Healthy | NodeState::Suspect, _)) | None => None,
                Some((state, _)) => Some(format!("its node is {state}")),
            }
        };
        let active: Vec<String> =
            state.jobs.values().filter(|j| j.state.is_active()).map(|j| j.id.clone()).collect();
        for id in &active {
            if let Some(job) = state.jobs.get_mut(id) {
                self.advance(job, now, Some(&unusable));
            }
        }
        reindex(&mut state);
        self.place_waiting(&mut state, &health, now);
        reindex(&mut state);
        let dirty = std::mem::take(&mut state.dirty);
        for id in dirty {
            if let Some(job) = state.jobs.get(&id) {
                self.save(job);
            }
        }
        let grace = self.config.stop_grace.as_millis() as u64 * 4;
        state.stale_kills.retain(|_, sent| now.saturating_sub(*sent) < grace);
    }

    fn place_waiting(
        &self,
        state: &mut QueueState,
        health: &BTreeMap<String, (NodeState, u64)>,
        now: u64,
    ) {
        let waiting: Vec<Waiting<'_>> = state
            .jobs
            .values()
            .filter(|j| j.state == JobState::Queued || restarting(j))
            .map(|j| Waiting {
                id: &j.id,
                nodes: j.spec.nodes,
                priority: j.spec.priority,
                requeued: j.restarts > 0,
                seq: j.seq,
                previous_port: j.master_port,
                stopping: restarting(j),
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        let mut busy: BTreeSet<&str> = BTreeSet::new();
        let mut ports: BTreeSet<u16> = BTreeSet::new();
        for job in state.jobs.values().filter(|j| j.state.is_active()) {
            // A starting or running job holds its whole allocation until it ends, as a gang
            // does: a rank that finished early keeps its node (the job may yet restart on it).
            // A stopping one frees each node as its rank goes, so a lost rank on a dead node
            // does not hold the queue.
            let holds = |r: &&RankRecord| job.state != JobState::Stopping || r.live();
            busy.extend(job.ranks.iter().filter(holds).map(|r| r.node.as_str()));
            ports.extend(job.master_port);
        }
        for (name, seen) in &state.nodes {
            if !seen.live.is_empty() {
                busy.insert(name);
            }
        }
        let candidates: Vec<Candidate<'_>> = health
            .iter()
            .map(|(name, (node_state, last_report_ms))| Candidate {
                name,
                state: *node_state,
                last_report_ms: *last_report_ms,
                address: state.nodes.get(name).and_then(|n| n.address.as_deref()),
                drained: state.drained.contains_key(name),
                busy: busy.contains(name.as_str()),
            })
            .collect();
        let (placements, blocked) = placement::place(
            &waiting,
            &candidates,
            &ports,
            self.config.master_port_min..=self.config.master_port_max,
            now,
            self.unreachable_window_ms,
        );
        for placement in placements {
            if let Some(job) = state.jobs.get_mut(&placement.job) {
                self.launch(job, placement, now);
            }
        }
        if let Some(blocked) = blocked
            && let Some(job) = state.jobs.get_mut(&blocked.job)
            && job.reason != blocked.why
        {
            job.reason = blocked.why;
            self.save(job);
        }
    }

    // --- a job's life --------------------------------------------------------------------------------

    fn about(&self, job: &Job, what: &str) -> String {
        format!("job {} ({}) attempt {}: {what}", job.id, job.name, job.attempt)
    }

    fn launch(&self, job: &mut Job, placement: Placement, now: u64) {
        job.nodes = placement.nodes;
        job.master_addr = Some(placement.master_addr);
        job.master_port = Some(placement.master_port);
        job.stop = None;
        job.ranks = job
            .nodes
            .iter()
            .enumerate()
            .map(|(rank, node)| RankRecord {
                rank: rank as u32,
                node: node.clone(),
                launched_ms: now,
                status: None,
                progress: None,
            })
            .collect();
        job.history.push(AttemptRecord {
            attempt: job.attempt,
            nodes: job.nodes.clone(),
            started_ms: now,
            ..AttemptRecord::default()
        });
        job.measured.steps_per_second = None;
        let what = format!(
            "started on {} (MASTER_ADDR={} MASTER_PORT={})",
            job.nodes.join(", "),
            job.master_addr.as_deref().unwrap_or(""),
            placement.master_port
        );
        set_state(job, JobState::Starting, &what, now);
        self.event(EventKind::JobStarted, Severity::Info, None, self.about(job, &what));
        for rank in &job.ranks {
            self.commands.push(&rank.node, self.run_rank_command(job, rank));
        }
        self.save(job);
    }

    fn run_rank_command(&self, job: &Job, rank: &RankRecord) -> NodeCommand {
        let protocol = ProtocolEnv {
            rank: rank.rank,
            world_size: job.ranks.len() as u32,
            local_rank: 0,
            master_addr: job.master_addr.clone().unwrap_or_else(|| job.nodes[0].clone()),
            master_port: job.master_port.unwrap_or(self.config.master_port_min),
            job_id: job.id.clone(),
            checkpoint_dir: PathBuf::from(&job.spec.checkpoint_dir),
            restart_count: job.attempt,
        };
        let mut env = job.spec.env.clone();
        for (var, value) in protocol.to_env() {
            env.insert(var.to_owned(), value.to_string_lossy().into_owned());
        }
        let base = &self.progress_base;
        env.insert(PROGRESS_URL_VAR.to_owned(), format!("{base}/v1/jobs/{}/progress", job.id));
        env.insert(PROGRESS_TOKEN_VAR.to_owned(), job.progress_token.clone());
        let run = RunRank {
            key: RankKey { job: job.id.clone(), attempt: job.attempt, rank: rank.rank },
            argv: job.spec.argv.clone(),
            env,
            workdir: None,
        };
        command_with_args(
            format!("run-rank-{}-{}-{}", job.id, job.attempt, rank.rank),
            command_kind::RUN_RANK,
            &run,
        )
    }

    /// Sends `signal` to every rank of the current attempt not known to have ended.
    fn signal_live(&self, job: &Job, signal: RankSignal) -> Vec<u32> {
        let mut sent = Vec::new();
        for rank in job.ranks.iter().filter(|r| r.live()) {
            let key = RankKey { job: job.id.clone(), attempt: job.attempt, rank: rank.rank };
            self.commands.push(&rank.node, signal_command(&key, signal));
            sent.push(rank.rank);
        }
        sent
    }

    /// Moves a job on: failures stop it, all ranks done completes it, the stop sequence goes on.
    /// `unusable` says why a node can no longer run a rank (the tick's view of the nodes).
    fn advance(&self, job: &mut Job, now: u64, unusable: Option<&Unusable<'_>>) {
        match job.state {
            JobState::Starting | JobState::Running => {
                let start_timeout = self.config.start_timeout.as_millis() as u64;
                let failure = job
                    .ranks
                    .iter()
                    .find_map(|r| r.failure().map(|why| (r.node.clone(), why)))
                    .or_else(|| {
                        job.ranks
                            .iter()
                            .find(|r| {
                                r.status.is_none()
                                    && now.saturating_sub(r.launched_ms) > start_timeout
                            })
                            .map(|r| {
                                let why = format!(
                                    "rank {} on {} did not start within {}",
                                    r.rank,
                                    r.node,
                                    humantime::format_duration(self.config.start_timeout)
                                );
                                (r.node.clone(), why)
                            })
                    })
                    .or_else(|| {
                        let unusable = unusable?;
                        job.ranks.iter().filter(|r| r.live()).find_map(|r| {
                            let why = unusable(&r.node)?;
                            Some((r.node.clone(), format!("rank {} on {}: {why}", r.rank, r.node)))
                        })
                    });
                if let Some((node, why)) = failure {
                    self.event(
                        EventKind::JobRankFailed,
                        Severity::Warning,
                        Some(&node),
                        self.about(job, &why),
                    );
                    self.begin_stop(job, StopCause::Restart, &why, now);
                    return;
                }
                if !job.ranks.is_empty() && job.ranks.iter().all(RankRecord::succeeded) {
                    self.complete(job, now);
                    return;
                }
                if job.state == JobState::Starting && job.ranks.iter().all(|r| r.status.is_some()) {
                    set_state(job, JobState::Running, "every rank is running", now);
                    self.save(job);
                }
            }
            JobState::Stopping => self.advance_stop(job, now),
            _ => {}
        }
    }

    fn begin_stop(&self, job: &mut Job, cause: StopCause, reason: &str, now: u64) {
        if cause == StopCause::Restart {
            job.goodput.failure_ms = Some(now);
        }
        let phase = match cause {
            StopCause::Restart => StopPhase::Checkpoint,
            StopCause::Cancel => StopPhase::Term,
        };
        job.stop = Some(Stop {
            cause,
            reason: reason.to_owned(),
            requested_ms: now,
            phase,
            phase_since_ms: now,
            checkpoint_step_before: job.newest_checkpoint_step(),
        });
        set_state(job, JobState::Stopping, reason, now);
        let sent = self.signal_live(job, phase_signal(phase));
        if !sent.is_empty() {
            let (kind, what) = match phase {
                StopPhase::Checkpoint => (
                    EventKind::JobCheckpointRequested,
                    format!("SIGUSR1 to ranks {sent:?}: checkpoint, then stop ({reason})"),
                ),
                _ => (EventKind::JobStopping, format!("SIGTERM to ranks {sent:?} ({reason})")),
            };
            self.event(kind, Severity::Info, None, self.about(job, &what));
        }
        self.save(job);
        self.advance_stop(job, now);
    }

    fn advance_stop(&self, job: &mut Job, now: u64) {
        let Some(stop) = job.stop.clone() else { return };
        if !job.ranks.iter().any(RankRecord::live) {
            self.finish_stop(job, now);
            return;
        }
        let elapsed = now.saturating_sub(stop.phase_since_ms);
        let next = match stop.phase {
            StopPhase::Checkpoint => {
                let newest = job.newest_checkpoint_step();
                let written = match (newest, stop.checkpoint_step_before) {
                    (Some(newest), Some(before)) => newest > before,
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if written {
                    Some((
                        StopPhase::Term,
                        format!("checkpoint step {} written", newest.unwrap_or(0)),
                    ))
                } else if elapsed >= self.config.checkpoint_grace.as_millis() as u64 {
                    Some((StopPhase::Term, "no new checkpoint within checkpoint_grace".to_owned()))
                } else {
                    None
                }
            }
            StopPhase::Term if elapsed >= self.config.stop_grace.as_millis() as u64 => {
                Some((StopPhase::Kill, "ranks still running after stop_grace".to_owned()))
            }
            StopPhase::Kill if elapsed >= self.config.stop_grace.as_millis() as u64 => {
                let lost: Vec<String> = job
                    .ranks
                    .iter()
                    .filter(|r| r.live())
                    .map(|r| format!("rank {} on {}", r.rank, r.node))
                    .collect();
                self.event(
                    EventKind::JobStopping,
                    Severity::Warning,
                    None,
                    self.about(
                        job,
                        &format!(
                            "no exit reported after SIGKILL, given up on: {}",
                            lost.join(", ")
                        ),
                    ),
                );
                self.finish_stop(job, now);
                return;
            }
            _ => None,
        };
        if let Some((phase, why)) = next {
            if let Some(stop) = job.stop.as_mut() {
                stop.phase = phase;
                stop.phase_since_ms = now;
            }
            let signal = phase_signal(phase);
            let sent = self.signal_live(job, signal);
            self.event(
                EventKind::JobStopping,
                Severity::Info,
                None,
                self.about(job, &format!("SIG{signal} to ranks {sent:?}: {why}")),
            );
            self.save(job);
        }
    }

    fn end_attempt(&self, job: &mut Job, now: u64, reason: &str, failed: bool) {
        if let Some(attempt) = job.current_attempt_mut()
            && attempt.ended_ms.is_none()
        {
            attempt.ended_ms = Some(now);
            attempt.end_reason = Some(reason.to_owned());
            attempt.failed = failed;
        }
    }

    fn complete(&self, job: &mut Job, now: u64) {
        job.stop = None;
        self.end_attempt(job, now, "every rank exited 0", false);
        job.finished_ms = Some(now);
        set_state(job, JobState::Completed, "every rank exited 0", now);
        self.event(
            EventKind::JobCompleted,
            Severity::Info,
            None,
            self.about(
                job,
                &format!(
                    "completed after {} restart(s), goodput {:.2}",
                    job.restarts,
                    job.goodput_ratio(now)
                ),
            ),
        );
        self.save(job);
    }

    fn finish_stop(&self, job: &mut Job, now: u64) {
        let Some(stop) = job.stop.take() else { return };
        // The ranks finished by themselves before anyone asked them to stop.
        if stop.cause == StopCause::Restart
            && stop.phase == StopPhase::Checkpoint
            && job.ranks.iter().all(RankRecord::succeeded)
        {
            self.complete(job, now);
            return;
        }
        let failed = stop.cause == StopCause::Restart;
        self.end_attempt(job, now, &stop.reason, failed);
        match stop.cause {
            StopCause::Cancel => {
                job.finished_ms = Some(now);
                set_state(job, JobState::Cancelled, &stop.reason, now);
                self.event(
                    EventKind::JobCancelled,
                    Severity::Info,
                    None,
                    self.about(job, &stop.reason),
                );
            }
            StopCause::Restart if job.restarts < job.spec.max_restarts => {
                job.restarts += 1;
                job.attempt += 1;
                job.ranks.clear();
                let why = format!(
                    "requeued at the front (restart {} of {}) after: {}",
                    job.restarts, job.spec.max_restarts, stop.reason
                );
                set_state(job, JobState::Queued, &why, now);
                self.event(EventKind::JobRequeued, Severity::Warning, None, self.about(job, &why));
            }
            StopCause::Restart => {
                job.finished_ms = Some(now);
                let why = format!(
                    "failed: restarts exhausted ({} of max_restarts {}); last failure: {}",
                    job.restarts, job.spec.max_restarts, stop.reason
                );
                set_state(job, JobState::Failed, &why, now);
                self.event(EventKind::JobFailed, Severity::Critical, None, self.about(job, &why));
            }
        }
        self.save(job);
    }

    // --- the scheduler ---------------------------------------------------------------------------

    pub(crate) fn drain_node(&self, node: &str, reason: &str) -> Result<(), SchedulerError> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        if !state.drained.contains_key(node) {
            // An admin's drain stays theirs: a later fleetmend drain does not take it over.
            let mut drained = state.drained.clone();
            drained
                .insert(node.to_owned(), QueueDrain { reason: reason.to_owned(), since_ms: now });
            self.save_drains(&drained)?;
            state.drained = drained;
        }
        let on_node: Vec<String> = state
            .jobs
            .values()
            .filter(|j| matches!(j.state, JobState::Starting | JobState::Running))
            .filter(|j| j.ranks.iter().any(|r| r.node == node && r.live()))
            .map(|j| j.id.clone())
            .collect();
        for id in on_node {
            if let Some(job) = state.jobs.get_mut(&id) {
                let rank = job.ranks.iter().find(|r| r.node == node).map_or(0, |r| r.rank);
                let why = format!("rank {rank} on {node}: its node was drained ({reason})");
                self.event(
                    EventKind::JobRankFailed,
                    Severity::Warning,
                    Some(node),
                    self.about(job, &why),
                );
                self.begin_stop(job, StopCause::Restart, &why, now);
            }
        }
        reindex(&mut state);
        Ok(())
    }

    /// Puts `node` back in the queue's placement, only if fleetmend drained it.
    pub(crate) fn undrain_node(&self, node: &str) -> Result<UndrainOutcome, SchedulerError> {
        let mut state = self.lock();
        Ok(match state.drained.get(node) {
            None => UndrainOutcome::NotDrained,
            Some(drain) if !drain.reason.starts_with(DRAIN_REASON_PREFIX) => {
                UndrainOutcome::DrainedByOther(drain.reason.clone())
            }
            Some(_) => {
                let mut drained = state.drained.clone();
                drained.remove(node);
                self.save_drains(&drained).map_err(|err| match err {
                    SchedulerError::Failed { message, .. } => {
                        SchedulerError::Failed { scheduler: NAME, operation: "undrain", message }
                    }
                    other => other,
                })?;
                state.drained = drained;
                UndrainOutcome::Undrained
            }
        })
    }

    /// The active jobs with a live rank on `node`.
    pub(crate) fn jobs_on_node(&self, node: &str) -> Vec<JobRef> {
        self.lock()
            .jobs
            .values()
            .filter(|j| j.state.is_active())
            .filter(|j| j.ranks.iter().any(|r| r.node == node && r.live()))
            .map(|j| JobRef { id: j.id.clone(), nodes: j.nodes.clone() })
            .collect()
    }

    /// SIGUSR1 to the live ranks of `job` (a job already stopping was asked when its stop began).
    pub(crate) fn request_checkpoint(&self, job: &str) -> Result<(), SchedulerError> {
        let mut state = self.lock();
        let job = Self::job_or_unknown(&mut state, job)?;
        if matches!(job.state, JobState::Starting | JobState::Running) {
            let sent = self.signal_live(job, RankSignal::Usr1);
            self.event(
                EventKind::JobCheckpointRequested,
                Severity::Info,
                None,
                self.about(job, &format!("SIGUSR1 to ranks {sent:?} (the repairer asked)")),
            );
        }
        Ok(())
    }

    /// Stops `job` to restart it from its newest checkpoint. Idempotent: a job stopping, queued or
    /// done is left as it is.
    pub(crate) fn requeue_job(&self, job: &str) -> Result<(), SchedulerError> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let job = Self::job_or_unknown(&mut state, job)?;
        if matches!(job.state, JobState::Starting | JobState::Running) {
            self.begin_stop(job, StopCause::Restart, "requeued by the repairer", now);
        }
        reindex(&mut state);
        Ok(())
    }

    fn job_or_unknown<'a>(
        state: &'a mut QueueState,
        job: &str,
    ) -> Result<&'a mut Job, SchedulerError> {
        state
            .jobs
            .get_mut(job)
            .ok_or_else(|| SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() })
    }
}

impl ReportObserver for JobQueue {
    fn observe_report(&self, report: &Report, now: u64) {
        JobQueue::observe_report(self, report, now);
    }
}

/// What the queue is wired to: the event log (and the store behind it), the command queue its
/// rank commands ride in, the fleet it places jobs on, and the clock.
#[derive(Clone)]
pub struct QueuePorts {
    pub events: Arc<EventLog>,
    pub commands: Arc<CommandQueue>,
    pub fleet: Arc<dyn FleetView>,
    pub clock: SharedClock,
}

impl std::fmt::Debug for QueuePorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePorts").finish_non_exhaustive()
    }
}

/// Why a node can no longer run a rank, if it cannot (the tick's view of the nodes).
type Unusable<'a> = dyn Fn(&str) -> Option<String> + 'a;

fn set_state(job: &mut Job, state: JobState, reason: &str, now: u64) {
    job.state = state;
    job.state_since_ms = now;
    job.reason = reason.to_owned();
}

fn phase_signal(phase: StopPhase) -> RankSignal {
    match phase {
        StopPhase::Checkpoint => RankSignal::Usr1,
        StopPhase::Term => RankSignal::Term,
        StopPhase::Kill => RankSignal::Kill,
    }
}

/// A `signal-rank` command; its id names the rank and the signal, so an agent that runs an id
/// once does not act twice on the same request sent again.
fn signal_command(key: &RankKey, signal: RankSignal) -> NodeCommand {
    command_with_args(
        format!("signal-rank-{}-{}-{}-{}", key.job, key.attempt, key.rank, signal.as_str()),
        command_kind::SIGNAL_RANK,
        &SignalRank { key: key.clone(), signal },
    )
}

fn reindex(state: &mut QueueState) {
    state.assigned = state
        .jobs
        .values()
        .filter(|j| j.state.is_active())
        .flat_map(|j| j.ranks.iter().map(|r| r.node.clone()))
        .collect();
}

/// Stopping in order to be requeued (restarts remain): it keeps its place in the queue.
fn restarting(job: &Job) -> bool {
    job.state == JobState::Stopping
        && job.stop.as_ref().is_some_and(|stop| stop.cause == StopCause::Restart)
        && job.restarts < job.spec.max_restarts
}
