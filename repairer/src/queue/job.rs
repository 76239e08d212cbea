//! A job of the embedded queue: what was submitted ([`JobSpec`]), where it stands ([`Job`]), and
//! how it is shown ([`JobView`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use fleetmend_proto::bounds;
use fleetmend_proto::{Progress, RankState, RankStatus};
use serde::{Deserialize, Serialize};

use super::health::JobHealth;

/// Where a job stands.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for nodes (new, or requeued after a failure).
    Queued,
    /// Its ranks were sent to their nodes; not all of them reported running yet.
    Starting,
    /// Every rank reported running.
    Running,
    /// Being stopped: asked to checkpoint (SIGUSR1), then SIGTERM, then SIGKILL.
    Stopping,
    /// Every rank exited 0.
    Completed,
    /// Restarts exhausted: `reason` says what failed last.
    Failed,
    /// A person cancelled it.
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Queued,
        JobState::Starting,
        JobState::Running,
        JobState::Stopping,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Stopping => "stopping",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Has ranks on nodes (or may have).
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Starting | JobState::Running | JobState::Stopping)
    }

    /// Over for good.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Completed | JobState::Failed | JobState::Cancelled)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How often a job checkpoints: a fixed number of steps, or `auto` (Young/Daly from its measured
/// checkpoint cost and the observed failure rate). JSON: a number or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointEvery {
    Steps(u64),
    Auto,
}

impl fmt::Display for CheckpointEvery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointEvery::Steps(n) => write!(f, "{n}"),
            CheckpointEvery::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for CheckpointEvery {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(CheckpointEvery::Auto);
        }
        match s.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(CheckpointEvery::Steps(n)),
            _ => Err(format!("{s:?} is neither a number of steps (at least 1) nor \"auto\"")),
        }
    }
}

impl Serialize for CheckpointEvery {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CheckpointEvery::Steps(n) => serializer.serialize_u64(*n),
            CheckpointEvery::Auto => serializer.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for CheckpointEvery {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        // As the OpenAPI document says: a number, or the one word "auto" (not a number's digits
        // in a string, which the command line's `--checkpoint-every 5` parses instead).
        match Raw::deserialize(deserializer)? {
            Raw::Number(n) => n.to_string().parse(),
            Raw::Text(text) if text == "auto" => Ok(CheckpointEvery::Auto),
            Raw::Text(text) => Err(format!(
                "{text:?} is neither \"auto\" nor a number of steps (give it as a number)"
            )),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// The OpenAPI schema of [`CheckpointEvery`]: a number of steps (at least 1) or `"auto"`; `null`
/// is read as absent (the job's own interval), as serde reads an `Option`.
fn checkpoint_every_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
    let one_of = OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(u64::MAX)),
        )
        .item(ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["auto"])))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "steps between checkpoints, or \"auto\" (Young/Daly); null or absent: the job's own",
        ))
        .build();
    utoipa::openapi::RefOr::T(Schema::OneOf(one_of))
}

/// `POST /v1/jobs`: what to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// A name for people (default: the program's file name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Program and arguments of every rank.
    pub argv: Vec<String>,
    /// Ranks, one per node.
    pub nodes: u32,
    /// Higher runs first; FIFO within a priority.
    #[serde(default)]
    pub priority: i32,
    /// Where the job's `step-<N>` checkpoints live (absolute; shared by every node).
    pub checkpoint_dir: String,
    /// Restarts allowed before the job fails.
    #[serde(default)]
    pub max_restarts: u32,
    /// The checkpoint interval told to the ranks (unset: the job's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = checkpoint_every_schema)]
    pub checkpoint_every: Option<CheckpointEvery>,
    /// Extra environment of every rank (the protocol's variables cannot be overridden).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Longest job name, in bytes.
pub const MAX_JOB_NAME: usize = 128;

/// Variables the queue sets itself.
pub const RESERVED_ENV: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "FLEETMEND_JOB_ID",
    "FLEETMEND_CHECKPOINT_DIR",
    "FLEETMEND_RESTART_COUNT",
    fleetmend_proto::jobs::PROGRESS_URL_VAR,
    fleetmend_proto::jobs::PROGRESS_TOKEN_VAR,
];

/// Most ranks one job may ask for (each rank's progress names the ranks it waits for: the bound
/// of that list is this).
pub const MAX_NODES: u32 = bounds::MAX_JOB_RANKS;

/// Most restarts a job may be allowed (a job that needs more is failing, not unlucky); also what
/// keeps the count inside the document's 32-bit signed integers.
pub const MAX_RESTARTS: u32 = 1_000_000;

impl JobSpec {
    /// Every problem, naming its field.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: &str, message: String| problems.push((field.to_owned(), message));
        if self.nodes < 1 {
            push("nodes", "must be at least 1".to_owned());
        } else if self.nodes > MAX_NODES {
            push("nodes", format!("must be at most {MAX_NODES}"));
        }
        if self.max_restarts > MAX_RESTARTS {
            push("max_restarts", format!("must be at most {MAX_RESTARTS}"));
        }
        if self.argv.is_empty() {
            push("argv", "must name a program to run".to_owned());
        } else if self.argv[0].trim().is_empty() {
            push("argv[0]", "must not be empty".to_owned());
        }
        if self.argv.len() > bounds::MAX_ARGS {
            let count = self.argv.len();
            push("argv", format!("{count} arguments is more than {}", bounds::MAX_ARGS));
        }
        for (i, arg) in self.argv.iter().enumerate().take(bounds::MAX_ARGS) {
            if arg.len() > bounds::MAX_ARG_BYTES {
                let size = arg.len();
                push(
                    &format!("argv[{i}]"),
                    format!("{size} bytes is more than {}", bounds::MAX_ARG_BYTES),
                );
            }
        }
        if self.checkpoint_dir.len() > bounds::MAX_PATH_BYTES {
            let size = self.checkpoint_dir.len();
            push("checkpoint_dir", format!("{size} bytes is more than {}", bounds::MAX_PATH_BYTES));
        } else if !Path::new(&self.checkpoint_dir).is_absolute() {
            push("checkpoint_dir", format!("{:?} is not an absolute path", self.checkpoint_dir));
        }
        if let Some(name) = &self.name
            && (name.is_empty() || name.len() > MAX_JOB_NAME || name.chars().any(char::is_control))
        {
            push("name", format!("must be 1 to {MAX_JOB_NAME} printable characters"));
        }
        if self.env.len() > bounds::MAX_ENV {
            let count = self.env.len();
            push("env", format!("{count} variables is more than {}", bounds::MAX_ENV));
        }
        for (key, value) in self.env.iter().take(bounds::MAX_ENV) {
            // The kernel's bound is on the whole `KEY=value` string.
            let size = key.len() + 1 + value.len();
            if size > bounds::MAX_ARG_BYTES {
                let shown: String = key.chars().take(64).collect();
                push(
                    &format!("env.{shown}"),
                    format!("{size} bytes is more than {}", bounds::MAX_ARG_BYTES),
                );
                continue;
            }
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                push(&format!("env.{key}"), "is not an environment variable name".to_owned());
            } else if RESERVED_ENV.contains(&key.as_str()) {
                push(&format!("env.{key}"), "is set by the queue".to_owned());
            }
        }
        problems
    }

    /// The name shown for the job.
    pub fn display_name(&self) -> String {
        match &self.name {
            Some(name) => name.clone(),
            None => self
                .argv
                .first()
                .map(|p| Path::new(p).file_name().map_or(p.clone(), |f| f.to_string_lossy().into()))
                .unwrap_or_default(),
        }
    }
}

/// One rank of the current attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankRecord {
    pub rank: u32,
    pub node: String,
    /// When its `run-rank` command was queued (or requeued after a repairer restart).
    pub launched_ms: u64,
    /// The agent's latest account of it; `None` until its node reports it.
    #[serde(default)]
    pub status: Option<RankStatus>,
    /// Its latest progress post.
    #[serde(default)]
    pub progress: Option<Progress>,
    /// When (the repairer's clock) its latest progress post came in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heard_ms: Option<u64>,
    /// Its step compute times (`step_seconds`) of the posts that brought a new step, after its
    /// warm-up, newest last: what straggler detection compares. Not stored: a restarted
    /// repairer measures afresh.
    #[serde(skip)]
    pub step_samples: Vec<f64>,
    /// Its posts that brought a new step in this attempt (the first `straggler_warmup` give no
    /// sample: start-up, compilation, caches).
    #[serde(skip)]
    pub stepped_posts: u32,
}

impl RankRecord {
    /// Not known to have ended: may be running, or about to start.
    pub fn live(&self) -> bool {
        self.status.as_ref().is_none_or(|s| s.state == RankState::Running)
    }

    /// Ended with exit status 0.
    pub fn succeeded(&self) -> bool {
        self.status.as_ref().is_some_and(RankStatus::succeeded)
    }

    /// Why it failed, if it ended any other way than exit 0.
    pub fn failure(&self) -> Option<String> {
        let status = self.status.as_ref()?;
        // Asked of every rank on every tick: the words are built only for a failure.
        let at = || format!("rank {} on {}", self.rank, self.node);
        match status.state {
            RankState::Running => None,
            RankState::FailedToStart => {
                Some(format!("{} failed to start: {}", at(), status.message).trim_end().to_owned())
            }
            RankState::Exited => match (status.exit_code, status.signal) {
                (Some(0), _) => None,
                (_, Some(signal)) => Some(format!("{} was killed by signal {signal}", at())),
                (Some(code), None) => Some(format!("{} exited with status {code}", at())),
                (None, None) => Some(format!("{} ended: {}", at(), status.message)),
            },
        }
    }
}

/// Why a job is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopCause {
    /// A rank failed or a node was lost or drained: requeue while restarts remain.
    Restart,
    /// A person cancelled it.
    Cancel,
    /// It cannot go on (its loss went bad again): it fails with the reason, whatever restarts
    /// remain.
    Fail,
}

/// Where a stop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopPhase {
    /// SIGUSR1 sent: waiting for a newer checkpoint or `checkpoint_grace`.
    Checkpoint,
    /// SIGTERM sent: waiting for the ranks to exit or `stop_grace`.
    Term,
    /// SIGKILL sent: waiting for the exits or `stop_grace`.
    Kill,
}

/// The repairer asked the current attempt for a checkpoint (before it requeues the job off a
/// drained node). SIGUSR1 reaches a rank once per attempt, so the stop that follows waits for
/// this checkpoint rather than asking again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointAsked {
    pub at_ms: u64,
    /// The newest checkpoint step reported when it was asked for.
    pub step_before: Option<u64>,
}

/// A stop under way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stop {
    pub cause: StopCause,
    pub reason: String,
    pub requested_ms: u64,
    pub phase: StopPhase,
    pub phase_since_ms: u64,
    /// The newest checkpoint step reported when the checkpoint was asked for.
    pub checkpoint_step_before: Option<u64>,
}

/// One run of a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// 0 for the first run (equals `FLEETMEND_RESTART_COUNT`).
    pub attempt: u32,
    /// Rank i ran on `nodes[i]`.
    pub nodes: Vec<String>,
    pub started_ms: u64,
    /// The step it resumed from (its ranks' `start_step`).
    #[serde(default)]
    pub resumed_from_step: Option<u64>,
    /// When the first step after the (re)start was reported.
    #[serde(default)]
    pub first_step_ms: Option<u64>,
    /// The newest step reported.
    #[serde(default)]
    pub last_step: Option<u64>,
    #[serde(default)]
    pub ended_ms: Option<u64>,
    #[serde(default)]
    pub end_reason: Option<String>,
    /// Ended by a failure (a rank failed, a node was lost or drained): counts for the MTBF.
    #[serde(default)]
    pub failed: bool,
    /// Steps done again: the previous attempt's last step − this attempt's start step.
    #[serde(default)]
    pub steps_lost: Option<u64>,
    /// Seconds from the previous attempt's failure to this attempt's first step.
    #[serde(default)]
    pub resume_seconds: Option<f64>,
    /// The first progress of the lead rank, for the step rate: (step, at_ms).
    #[serde(default)]
    pub rate_base: Option<(u64, u64)>,
}

/// The lead rank's last progress, for productive time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    pub attempt: u32,
    pub rank: u32,
    pub step: u64,
    pub at_ms: u64,
}

/// Productive time and lost work.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    /// Time ranks spent stepping forward past steps already done before, at the pace the job
    /// would have had without a straggler (the rest of that time is `straggler_ms`).
    pub productive_ms: u64,
    /// Time the job stood at a step before it was declared hung: from its last step to the
    /// decision.
    #[serde(default)]
    pub hung_ms: u64,
    /// Time lost to a straggler rank while one was flagged: the ranks step together at the
    /// slowest one's pace, so of each stretch of new steps at ratio `r`, `1 − 1/r` was lost.
    #[serde(default)]
    pub straggler_ms: u64,
    /// The furthest step ever reached.
    pub high_water_step: u64,
    pub steps_lost_total: u64,
    /// When the latest stop for a restart began (the failure, for the resume time).
    #[serde(default)]
    pub failure_ms: Option<u64>,
    #[serde(default)]
    pub last_observation: Option<Observation>,
}

/// What the queue measured of a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Seconds its newest checkpoint took to write.
    pub checkpoint_write_seconds: Option<f64>,
    /// Steps per second of the current attempt.
    pub steps_per_second: Option<f64>,
}

/// A job and everything the queue keeps about it (stored as one JSON document).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Job {
    /// `j-<seq>`.
    pub id: String,
    /// Submission order (FIFO within a priority).
    pub seq: u64,
    pub name: String,
    pub spec: JobSpec,
    pub submitted_ms: u64,
    pub state: JobState,
    pub state_since_ms: u64,
    /// Why it is in its state: what it waits for, what failed, how it ended.
    pub reason: String,
    /// The current (or last) run: 0 first, +1 on every restart.
    pub attempt: u32,
    pub restarts: u32,
    /// The nodes of the current (or last) attempt: rank i on `nodes[i]`.
    pub nodes: Vec<String>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    /// The bearer token of the job's progress posts (never shown by the API).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schema(ignore)]
    pub progress_token: String,
    /// The ranks of the current attempt.
    #[schema(value_type = Vec<Object>)]
    pub ranks: Vec<RankRecord>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub stop: Option<Stop>,
    /// The repairer's checkpoint request to the current attempt, if it made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub checkpoint_asked: Option<CheckpointAsked>,
    #[schema(value_type = Vec<Object>)]
    pub history: Vec<AttemptRecord>,
    #[schema(value_type = Object)]
    pub goodput: Goodput,
    #[schema(value_type = Object)]
    pub measured: Measured,
    /// The checkpoint interval in steps the queue last told the ranks.
    #[serde(default)]
    pub checkpoint_interval: Option<u64>,
    #[serde(default)]
    pub finished_ms: Option<u64>,
    /// What its progress says of its health (hangs).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub health: JobHealth,
}

impl Job {
    /// A job just submitted, waiting for nodes.
    pub fn queued(id: String, seq: u64, spec: JobSpec, now: u64, progress_token: String) -> Job {
        Job {
            id,
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
            progress_token,
            ranks: Vec::new(),
            stop: None,
            checkpoint_asked: None,
            history: Vec::new(),
            goodput: Goodput::default(),
            measured: Measured::default(),
            checkpoint_interval: None,
            finished_ms: None,
            health: JobHealth::default(),
            spec,
        }
    }

    /// Productive time over wall time since submission (to the end, once finished).
    pub fn goodput_ratio(&self, now: u64) -> f64 {
        let end = self.finished_ms.unwrap_or(now);
        let wall = end.saturating_sub(self.submitted_ms);
        if wall == 0 {
            return 0.0;
        }
        (self.goodput.productive_ms as f64 / wall as f64).clamp(0.0, 1.0)
    }

    /// The newest step any rank of the current attempt reported, and its loss.
    pub fn latest_progress(&self) -> Option<&Progress> {
        self.ranks
            .iter()
            .filter_map(|r| r.progress.as_ref())
            .max_by(|a, b| a.step.cmp(&b.step).then(b.rank.cmp(&a.rank)))
    }

    /// The newest step reported: by the current attempt, else by the last one that reported.
    pub fn step(&self) -> Option<u64> {
        self.latest_progress()
            .map(|p| p.step)
            .or_else(|| self.history.iter().rev().find_map(|a| a.last_step))
    }

    /// The newest checkpoint step the ranks of the current attempt reported.
    pub fn newest_checkpoint_step(&self) -> Option<u64> {
        self.ranks.iter().filter_map(|r| r.progress.as_ref()?.checkpoint_step).max()
    }

    /// The current attempt's record.
    pub fn current_attempt_mut(&mut self) -> Option<&mut AttemptRecord> {
        let attempt = self.attempt;
        self.history.iter_mut().rev().find(|a| a.attempt == attempt)
    }

    /// As the API shows it: without its token, with the figures people read.
    pub fn view(&self, now: u64) -> JobView {
        let mut job = self.clone();
        job.progress_token.clear();
        let latest = self.latest_progress();
        JobView {
            step: latest
                .map(|p| p.step)
                .or_else(|| self.history.iter().rev().find_map(|a| a.last_step)),
            loss: latest.map(|p| p.loss),
            goodput_ratio: self.goodput_ratio(now),
            job,
        }
    }
}

/// A job as `GET /v1/jobs` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobView {
    #[serde(flatten)]
    pub job: Job,
    /// The newest step reported.
    pub step: Option<u64>,
    /// The loss at that step.
    pub loss: Option<f64>,
    /// Productive time over wall time since submission.
    pub goodput_ratio: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            name: None,
            argv: vec!["/usr/bin/fleetmend".into(), "train".into()],
            nodes: 4,
            priority: 0,
            checkpoint_dir: "/shared/ckpt".into(),
            max_restarts: 3,
            checkpoint_every: None,
            env: BTreeMap::new(),
        }
    }

    #[test]
    fn a_bad_spec_names_every_field() {
        assert_eq!(spec().problems(), Vec::new());
        assert_eq!(spec().display_name(), "fleetmend");
        let bad = JobSpec {
            nodes: 0,
            max_restarts: MAX_RESTARTS + 1,
            argv: Vec::new(),
            checkpoint_dir: "ckpt".into(),
            env: BTreeMap::from([("RANK".into(), "1".into()), ("A=B".into(), "x".into())]),
            ..spec()
        };
        let fields: Vec<String> = bad.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            ["nodes", "max_restarts", "argv", "checkpoint_dir", "env.A=B", "env.RANK"]
        );
        let most = JobSpec { max_restarts: MAX_RESTARTS, ..spec() };
        assert_eq!(most.problems(), Vec::new());
    }

    #[test]
    fn checkpoint_every_is_a_number_or_auto() {
        let json = |s: &str| serde_json::from_str::<CheckpointEvery>(s);
        assert_eq!(json("25").unwrap(), CheckpointEvery::Steps(25));
        assert_eq!(json("\"auto\"").unwrap(), CheckpointEvery::Auto);
        // A number's digits in a string are refused, as the OpenAPI document has it.
        let digits = json("\"7\"").unwrap_err().to_string();
        assert!(digits.contains("give it as a number"), "{digits}");
        assert!(json("0").is_err());
        assert!(json("\"often\"").is_err());
        assert_eq!(serde_json::to_string(&CheckpointEvery::Auto).unwrap(), "\"auto\"");
        assert_eq!(serde_json::to_string(&CheckpointEvery::Steps(3)).unwrap(), "3");
    }
}
