//! The wire types of running jobs: the commands that start and signal a job's ranks on a node
//! (carried in a [`crate::ReportReply`]), the state of those ranks (carried in a
//! [`crate::Report`]), and the progress a rank posts to the queue.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::NodeCommand;

/// Identifies one rank of one run of a job: a job restarts as a new `attempt`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RankKey {
    pub job: String,
    /// 0 on the first run, +1 on every restart (equals `FLEETMEND_RESTART_COUNT`).
    pub attempt: u32,
    pub rank: u32,
}

impl fmt::Display for RankKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/attempt-{}/rank-{}", self.job, self.attempt, self.rank)
    }
}

/// Arguments of a `run-rank` command: start one rank as a child process of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRank {
    #[serde(flatten)]
    pub key: RankKey,
    /// Program and arguments; `argv[0]` is looked up in `PATH` when it has no slash.
    pub argv: Vec<String>,
    /// Environment added to the agent's own: the checkpoint protocol's variables and the job's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; the agent's job directory for this rank when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// A signal the queue forwards to a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RankSignal {
    /// Checkpoint at the next step boundary and go on.
    Usr1,
    /// Checkpoint if possible, then exit 0.
    Term,
    /// Stop now.
    Kill,
}

impl RankSignal {
    pub fn as_str(self) -> &'static str {
        match self {
            RankSignal::Usr1 => "USR1",
            RankSignal::Term => "TERM",
            RankSignal::Kill => "KILL",
        }
    }
}

impl fmt::Display for RankSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RankSignal {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim_start_matches("SIG") {
            "USR1" => Ok(RankSignal::Usr1),
            "TERM" => Ok(RankSignal::Term),
            "KILL" => Ok(RankSignal::Kill),
            other => Err(format!("unknown signal {other:?} (expected USR1, TERM or KILL)")),
        }
    }
}

/// Arguments of a `signal-rank` command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRank {
    #[serde(flatten)]
    pub key: RankKey,
    pub signal: RankSignal,
}

/// A command's arguments could not be read.
#[derive(Debug, thiserror::Error)]
#[error("command {id} ({kind}): bad arguments: {source}")]
pub struct CommandArgsError {
    pub id: String,
    pub kind: String,
    #[source]
    pub source: serde_json::Error,
}

/// Builds a command of `kind` whose arguments are `args`' fields.
pub fn command_with_args<T: Serialize>(id: String, kind: &str, args: &T) -> NodeCommand {
    let args = match serde_json::to_value(args) {
        Ok(serde_json::Value::Object(map)) => map.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    NodeCommand { id, kind: kind.to_owned(), args }
}

impl NodeCommand {
    /// Reads this command's arguments as `T`.
    pub fn args_as<T: for<'de> Deserialize<'de>>(&self) -> Result<T, CommandArgsError> {
        let map: serde_json::Map<String, serde_json::Value> =
            self.args.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        serde_json::from_value(serde_json::Value::Object(map)).map_err(|source| CommandArgsError {
            id: self.id.clone(),
            kind: self.kind.clone(),
            source,
        })
    }
}

/// Where a rank the agent was asked to run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum RankState {
    Running,
    /// Exited by itself or by a signal (`exit_code` / `signal`).
    Exited,
    /// Could not be started (`message` says why).
    FailedToStart,
}

/// One rank as the agent on its node reports it: every running rank, and every rank that ended
/// within the agent's retention window, in every report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RankStatus {
    #[serde(flatten)]
    pub key: RankKey,
    pub state: RankState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub message: String,
    pub started_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
}

impl RankStatus {
    /// Ended with exit status 0.
    pub fn succeeded(&self) -> bool {
        self.state == RankState::Exited && self.exit_code == Some(0)
    }
}

/// The environment variable naming where a rank posts its [`Progress`] (the queue sets it).
pub const PROGRESS_URL_VAR: &str = "FLEETMEND_PROGRESS_URL";
/// The bearer token for [`PROGRESS_URL_VAR`] (one per job, set by the queue).
pub const PROGRESS_TOKEN_VAR: &str = "FLEETMEND_PROGRESS_TOKEN";

/// What a rank posts to `FLEETMEND_PROGRESS_URL` (and prints as a JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    pub job: String,
    pub attempt: u32,
    pub rank: u32,
    /// Steps completed.
    pub step: u64,
    /// The step the run started from (0, or the checkpoint it resumed).
    #[serde(default)]
    pub start_step: u64,
    /// The step's loss. JSON has no NaN or infinity: a loss that is not finite goes as `null`
    /// (or the strings `"NaN"`, `"Infinity"`, `"-Infinity"`) and reads back as NaN or infinity.
    #[serde(with = "loss_json")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, required = true))]
    pub loss: f64,
    pub samples_per_second: f64,
    /// The newest complete checkpoint's step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_step: Option<u64>,
    /// Seconds the newest checkpoint took to write (background).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_write_seconds: Option<f64>,
    /// Seconds training stood still for the newest checkpoint (the in-memory copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_stall_seconds: Option<f64>,
    /// Seconds this rank computed per step (forward, backward, update; not the collective) over
    /// the steps since its previous post: what a straggler is measured by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seconds: Option<f64>,
    /// The ranks this rank's collective is waiting for and has not heard from (not even a
    /// keepalive) for a while: the ranks that did not reach the step. A heartbeat (a post repeated
    /// while the step does not advance) carries it; empty while the rank is not waiting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<u32>,
    /// Unix time in milliseconds.
    pub at_ms: u64,
}

/// A loss on the wire: a number, or `null` / a string for what JSON cannot carry.
mod loss_json {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(loss: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        if loss.is_finite() { serializer.serialize_f64(*loss) } else { serializer.serialize_none() }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Option::<Raw>::deserialize(deserializer)? {
            Some(Raw::Number(loss)) => Ok(loss),
            None => Ok(f64::NAN),
            Some(Raw::Text(text)) => match text.to_ascii_lowercase().as_str() {
                "nan" => Ok(f64::NAN),
                "inf" | "infinity" | "+inf" | "+infinity" => Ok(f64::INFINITY),
                "-inf" | "-infinity" => Ok(f64::NEG_INFINITY),
                _ => Err(serde::de::Error::custom(format!(
                    "loss {text:?} is neither a number nor NaN or infinity"
                ))),
            },
        }
    }
}

/// The queue's answer to a [`Progress`] post.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProgressReply {
    /// The checkpoint interval in steps the queue wants (`--checkpoint-every auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_rank_round_trips_through_a_command() {
        let run = RunRank {
            key: RankKey { job: "j1".into(), attempt: 2, rank: 3 },
            argv: vec!["fleetmend".into(), "train".into()],
            env: BTreeMap::from([("RANK".into(), "3".into())]),
            workdir: None,
        };
        let command = command_with_args("c1".into(), crate::command_kind::RUN_RANK, &run);
        let json = serde_json::to_string(&command).unwrap();
        let back: NodeCommand = serde_json::from_str(&json).unwrap();
        assert_eq!(back.args_as::<RunRank>().unwrap(), run);
        let bad = NodeCommand { id: "c2".into(), kind: "run-rank".into(), args: BTreeMap::new() };
        let err = bad.args_as::<RunRank>().unwrap_err().to_string();
        assert!(err.contains("c2") && err.contains("missing field"), "{err}");
    }

    #[test]
    fn a_loss_that_is_not_finite_goes_as_null_and_comes_back() {
        let progress = |loss: &str| {
            let json = format!(
                r#"{{"job":"j","attempt":0,"rank":0,"step":5,"loss":{loss},"samples_per_second":1.0,"at_ms":1}}"#
            );
            serde_json::from_str::<Progress>(&json).map(|p| p.loss)
        };
        assert_eq!(progress("2.5").unwrap(), 2.5);
        assert!(progress("null").unwrap().is_nan());
        assert!(progress("\"NaN\"").unwrap().is_nan());
        assert_eq!(progress("\"-Infinity\"").unwrap(), f64::NEG_INFINITY);
        let err = progress("\"lots\"").unwrap_err().to_string();
        assert!(err.contains("lots"), "{err}");
        let mut sent: Progress = serde_json::from_str(
            r#"{"job":"j","attempt":0,"rank":0,"step":5,"loss":1.0,"samples_per_second":1.0,"at_ms":1}"#,
        )
        .unwrap();
        sent.loss = f64::NAN;
        let text = serde_json::to_string(&sent).unwrap();
        assert!(text.contains(r#""loss":null"#), "{text}");
        assert!(serde_json::from_str::<Progress>(&text).unwrap().loss.is_nan());
    }

    #[test]
    fn signals_parse_with_or_without_sig() {
        assert_eq!("SIGUSR1".parse::<RankSignal>().unwrap(), RankSignal::Usr1);
        assert_eq!("TERM".parse::<RankSignal>().unwrap(), RankSignal::Term);
        assert!("HUP".parse::<RankSignal>().is_err());
    }
}
