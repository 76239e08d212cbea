//! The embedded job queue (`scheduler = "embedded"`): FIFO with priorities, gang allocation of N
//! healthy nodes with one rank per node, ranks launched through each node's agent (the command
//! rides in the reply to the agent's report) with the checkpoint protocol's environment, and
//! auto-resume: a failed rank, a lost node or the repairer's requeue stops the job (SIGUSR1, then
//! SIGTERM, then SIGKILL), requeues it at the front of its priority, and restarts it on N healthy
//! nodes from its newest checkpoint, until its restarts run out. A drain, as in Slurm, only takes
//! the node out of placement: the repair workflow asks the job for a checkpoint and requeues it.
//!
//! It is also the repairer's [`Scheduler`]: drain, undrain, the jobs on a node, checkpoint and
//! requeue. Every job is one JSON document in the repairer's store, written on every change of
//! state (progress figures at the next tick), so a restarted repairer reloads every job and keeps
//! its running ranks: their agents go on reporting them.

pub mod config;
pub mod health;
pub mod interval;
pub mod job;
pub mod placement;

mod drains;
mod due;
mod progress;
mod reports;
mod stop;
mod tick;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fleetmend_proto::{Progress, RankKey, RankSignal};
use serde::{Deserialize, Serialize};

pub use self::config::QueueConfig;
pub use self::job::{
    AttemptRecord, CheckpointEvery, Job, JobSpec, JobState, JobView, MAX_JOB_NAME, MAX_RESTARTS,
    RESERVED_ENV, RankRecord, Stop, StopCause, StopPhase,
};
pub use self::stop::checkpoint_grace_ms;
use self::stop::phase_signal;
use crate::clock::{self, SharedClock};
use crate::commands::CommandQueue;
use crate::metrics::ResumeSeconds;
use crate::model::{Actor, Event, EventKind, Severity};
use crate::ports::{EventLog, FleetView, JobFindings};
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
    /// A rank's token on a post for another rank or attempt: each rank speaks for itself only.
    #[error(
        "progress of job {job}: this token is rank {token_rank}'s of attempt {token_attempt}: it may not post for rank {rank} of attempt {attempt}"
    )]
    OtherRank { job: String, token_attempt: u32, token_rank: u32, attempt: u32, rank: u32 },
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
    /// Nodes with a rank of an active job → those ranks (job id, rank): a report from any other
    /// node with no ranks is passed over at once (the hot path at 100,000 nodes), and a report
    /// from one of them looks at its own ranks only, not at every rank of a 2,000-rank job.
    assigned: BTreeMap<String, Vec<(String, u32)>>,
    /// Jobs whose ranks changed since the tick last moved them on (a rank that started or
    /// exited: the tick moves the job on once for all its nodes' reports; a failed rank stops
    /// its job at once).
    moved: BTreeSet<String>,
    /// The fleet's generation the tick last looked at (`FleetView::generation`).
    fleet_generation: Option<u64>,
    /// When placement last found no room for a queued job: (the fleet's generation, when).
    /// Placement is tried again when the fleet changes, a drain is lifted, a job is submitted,
    /// or `PLACEMENT_RETRY` has passed, not on every tick.
    placement_blocked: Option<(u64, u64)>,
    /// Ranks of old attempts still running, and when SIGKILL was last sent to them.
    stale_kills: BTreeMap<RankKey, u64>,
    /// Jobs whose progress figures or ranks changed since they were last saved.
    dirty: BTreeSet<String>,
    /// When the tick last saved each dirty job (a burst of changes is saved at most once every
    /// `DIRTY_SAVE_EVERY`).
    dirty_saved_ms: BTreeMap<String, u64>,
    /// Observed MTBF per job size, and when it was computed.
    mtbf: BTreeMap<u32, (u64, f64)>,
    /// Queued jobs whose wait for nodes was alerted: job → the start of the wait alerted.
    wait_alerted: BTreeMap<String, u64>,
    /// Straggler findings raised and not yet cleared: (job, rank) → the rank's node and when.
    stragglers: BTreeMap<(String, u32), (String, u64)>,
    /// When each node was named in a hang, within `hang_window` (not stored: a restarted
    /// repairer counts afresh).
    hang_named: BTreeMap<String, Vec<u64>>,
    /// Nodes whose `hang_repeated` finding is raised.
    hang_repeated: BTreeSet<String>,
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
    /// Hangs declared over its life.
    pub hangs: u32,
    /// Seconds it stood at a step before each of its hangs was declared, in all.
    pub hung_seconds: f64,
    /// Seconds lost to straggler ranks while they were flagged, in all.
    pub straggler_seconds: f64,
    /// A running job's slowest rank: (rank, its median step compute time over the others').
    pub slowest_rank: Option<(u32, f64)>,
    /// The current attempt's newest progress: loss, throughput and its newest checkpoint.
    pub progress: Option<Progress>,
}

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
    /// Where straggler findings go.
    findings: Option<JobFindings>,
    /// A node with no report for this long is not eligible (the engine's unreachable window).
    unreachable_window_ms: u64,
    state: Mutex<QueueState>,
    resume_seconds: ResumeSeconds,
    /// Raised when the tick's work may have come due: a node changed (raised by the fleet), a
    /// job was submitted, cancelled or drained, a rank started or ended, progress came in.
    wake: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue").field("config", &self.config).finish_non_exhaustive()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Rank `rank`'s token for its progress posts in `attempt`: `ATTEMPT.RANK.MAC`, the MAC an
/// HMAC-SHA256 under the job's secret. The repairer keeps only the secret; a rank's token is
/// handed to that rank alone (in its `run-rank` command, on its node), so a post for another rank
/// — or for the same rank of an attempt placed on another node — is refused.
pub fn rank_token(secret: &str, attempt: u32, rank: u32) -> String {
    format!("{attempt}.{rank}.{}", rank_mac(secret, attempt, rank))
}

fn rank_mac(secret: &str, attempt: u32, rank: u32) -> String {
    use hmac::{KeyInit, Mac};
    // HMAC takes a key of any length, so this cannot fail; a secret of old (empty) still gets a
    // MAC nobody else can make without it.
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| hmac::Hmac::<sha2::Sha256>::new(&Default::default()));
    mac.update(format!("fleetmend rank progress {attempt}.{rank}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The (attempt, rank) a rank token of `secret` stands for, or `None` for any other string.
fn rank_of_token(secret: &str, token: &str) -> Option<(u32, u32)> {
    if secret.is_empty() {
        return None;
    }
    let mut parts = token.splitn(3, '.');
    let attempt = parts.next()?.parse().ok()?;
    let rank = parts.next()?.parse().ok()?;
    let mac = parts.next()?;
    constant_time_eq(mac.as_bytes(), rank_mac(secret, attempt, rank).as_bytes())
        .then_some((attempt, rank))
}

/// A random secret for a job's progress tokens.
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
        let QueuePorts { events, commands, fleet, clock, findings } = ports;
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
        let wake = fleet.subscribe();
        Ok(Arc::new(JobQueue {
            config,
            events,
            commands,
            fleet,
            clock,
            progress_base: progress_base.trim_end_matches('/').to_owned(),
            findings,
            unreachable_window_ms: unreachable_window.as_millis() as u64,
            state: Mutex::new(state),
            resume_seconds: ResumeSeconds::new(),
            wake,
        }))
    }

    /// Sends again what a previous process may not have delivered, and starts the tick on the
    /// whole multiples of `[queue] tick` at which something is due ([`clock::when_due`]).
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
        let (clock, wake) = (self.clock.clone(), self.wake.clone());
        tokio::spawn(clock::when_due(clock, self.config.tick, wake, move |now| {
            let Some(queue) = queue.upgrade() else { return clock::Next::Stop };
            queue.tick(now)
        }));
    }

    /// Something changed that the tick may have work for.
    fn wake(&self) {
        self.wake.notify_one();
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

    // --- the API ---------------------------------------------------------------------------------

    /// Queues a job.
    pub fn submit(&self, spec: JobSpec, who: &str) -> Result<JobView, QueueError> {
        self.wake();
        let problems = spec.problems();
        if !problems.is_empty() {
            return Err(QueueError::InvalidSpec(problems));
        }
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let seq = state.next_seq;
        let id = format!("j-{seq}");
        let job = Job::queued(id.clone(), seq, spec, now, random_token());
        let saved = self.events.store().put_job(&id, seq, job.state.as_str(), &job);
        self.events
            .write("put_job", saved)
            .map_err(|source| QueueError::Store { job: id.clone(), source })?;
        state.next_seq += 1;
        state.placement_blocked = None;
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

    /// When the queue began stopping `id`'s attempt, if it is stopping it (no copy of the job).
    pub fn stop_requested_ms(&self, id: &str) -> Option<u64> {
        self.lock().jobs.get(id)?.stop.as_ref().map(|stop| stop.requested_ms)
    }

    /// A person cancels a job: a queued one at once, a running one by SIGTERM then SIGKILL.
    pub fn cancel(&self, id: &str, who: &str) -> Result<JobView, QueueError> {
        self.wake();
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

    /// Which rank of which attempt `token` belongs to, if it is one of job `id`'s rank tokens
    /// (checked before a body is judged, so a stranger learns nothing from its errors).
    pub fn check_token(&self, id: &str, token: Option<&str>) -> Result<(u32, u32), QueueError> {
        let state = self.lock();
        let job = state.jobs.get(id).ok_or_else(|| QueueError::UnknownJob(id.to_owned()))?;
        token
            .and_then(|token| rank_of_token(&job.progress_token, token))
            .ok_or_else(|| QueueError::Unauthorized { job: id.to_owned() })
    }

    /// What the queue's events say about a job: `job <id> (<name>) attempt <n>: <what>`.
    fn about(&self, job: &Job, what: &str) -> String {
        format!("job {} ({}) attempt {}: {what}", job.id, job.name, job.attempt)
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
    /// Where straggler findings go (to the engine); none: they are only logged as events.
    pub findings: Option<JobFindings>,
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

fn reindex(state: &mut QueueState) {
    let mut assigned: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
    for job in state.jobs.values().filter(|j| j.state.is_active()) {
        for rank in &job.ranks {
            assigned.entry(rank.node.clone()).or_default().push((job.id.clone(), rank.rank));
        }
    }
    state.assigned = assigned;
}

/// Stopping in order to be requeued (restarts remain): it keeps its place in the queue.
fn restarting(job: &Job) -> bool {
    job.state == JobState::Stopping
        && job.stop.as_ref().is_some_and(|stop| stop.cause == StopCause::Restart)
        && job.restarts < job.spec.max_restarts
}
