//! The environment every rank of a job is started with: torchrun's variables plus fleetmend's
//! (`docs/checkpoint-protocol.md`, "Environment").

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The variable names, as the queue sets them and ranks read them.
pub mod vars {
    /// This rank's index in the job, `0..WORLD_SIZE` (torchrun).
    pub const RANK: &str = "RANK";
    /// How many ranks the job has (torchrun).
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    /// This rank's index among the ranks on its node (torchrun).
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    /// The host rank 0 listens on for the rendezvous (torchrun).
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    /// The port rank 0 listens on for the rendezvous (torchrun).
    pub const MASTER_PORT: &str = "MASTER_PORT";
    /// The fleetmend job this rank belongs to.
    pub const JOB_ID: &str = "FLEETMEND_JOB_ID";
    /// Where the job's `step-<N>` checkpoint directories live.
    pub const CHECKPOINT_DIR: &str = "FLEETMEND_CHECKPOINT_DIR";
    /// How many times the job has been restarted (0 on the first run).
    pub const RESTART_COUNT: &str = "FLEETMEND_RESTART_COUNT";

    /// Every variable of the protocol, in the order [`super::ProtocolEnv::to_env`] gives them.
    pub const ALL: [&str; 8] = [
        RANK,
        WORLD_SIZE,
        LOCAL_RANK,
        MASTER_ADDR,
        MASTER_PORT,
        JOB_ID,
        CHECKPOINT_DIR,
        RESTART_COUNT,
    ];
}

/// What a rank learns from its environment under the checkpoint protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolEnv {
    /// This rank's index in the job, `0..world_size` (`RANK`).
    pub rank: u32,
    /// How many ranks the job has, at least 1 (`WORLD_SIZE`).
    pub world_size: u32,
    /// This rank's index among the ranks on its node (`LOCAL_RANK`).
    pub local_rank: u32,
    /// The host rank 0 listens on for the rendezvous (`MASTER_ADDR`).
    pub master_addr: String,
    /// The port rank 0 listens on for the rendezvous, not 0 (`MASTER_PORT`).
    pub master_port: u16,
    /// The job this rank belongs to (`FLEETMEND_JOB_ID`).
    pub job_id: String,
    /// Where the job's checkpoints live (`FLEETMEND_CHECKPOINT_DIR`).
    pub checkpoint_dir: PathBuf,
    /// How many times the job has been restarted, 0 on the first run (`FLEETMEND_RESTART_COUNT`).
    pub restart_count: u32,
}

/// One variable that is missing or holds an unusable value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvVarProblem {
    /// The variable is not set.
    #[error("{var} is not set")]
    Missing {
        /// The variable.
        var: &'static str,
    },
    /// The variable's value cannot be used.
    #[error("{var}={value:?} {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// The value found (lossily decoded when it was not UTF-8).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl EnvVarProblem {
    /// The variable the problem is about.
    pub fn var(&self) -> &'static str {
        match self {
            Self::Missing { var } | Self::Invalid { var, .. } => var,
        }
    }
}

/// Reading the protocol's environment failed; every problem found is listed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cannot read the checkpoint protocol's environment: {}", ProblemList(.problems))]
pub struct ReadProtocolEnvError {
    /// Every missing or bad variable, in [`vars::ALL`] order.
    pub problems: Vec<EnvVarProblem>,
}

struct ProblemList<'a>(&'a [EnvVarProblem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl ProtocolEnv {
    /// Reads the variables from this process's environment.
    pub fn from_process_env() -> Result<Self, ReadProtocolEnvError> {
        Self::from_lookup(|var| std::env::var_os(var))
    }

    /// Reads the variables through `lookup` (name → value, `None` when unset), so callers and
    /// tests need not touch the process environment. Reports every problem at once.
    pub fn from_lookup<F, V>(lookup: F) -> Result<Self, ReadProtocolEnvError>
    where
        F: FnMut(&str) -> Option<V>,
        V: Into<OsString>,
    {
        let mut env = EnvReader::new(lookup);
        let rank = env.number::<u32>(vars::RANK, Need::Required);
        let world_size = env.number::<u32>(vars::WORLD_SIZE, Need::Required);
        let local_rank = env.number::<u32>(vars::LOCAL_RANK, Need::Required);
        let master_addr = env.text(vars::MASTER_ADDR, Need::Required);
        let master_port = env.number::<u16>(vars::MASTER_PORT, Need::Required);
        let job_id = env.text(vars::JOB_ID, Need::Required);
        let checkpoint_dir = env.path(vars::CHECKPOINT_DIR, Need::Required);
        let restart_count = env.number::<u32>(vars::RESTART_COUNT, Need::Required);

        if world_size == Some(0) {
            env.invalid(vars::WORLD_SIZE, "0", "must be at least 1");
        }
        if master_port == Some(0) {
            env.invalid(vars::MASTER_PORT, "0", "is not a port to connect to");
        }
        if let Some(world_size) = world_size.filter(|w| *w > 0) {
            for (var, index) in [(vars::RANK, rank), (vars::LOCAL_RANK, local_rank)] {
                if let Some(index) = index.filter(|i| *i >= world_size) {
                    env.invalid(
                        var,
                        index.to_string(),
                        &format!("must be less than {}={world_size}", vars::WORLD_SIZE),
                    );
                }
            }
        }
        let problems = env.finish();

        match (
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
            job_id,
            checkpoint_dir,
            restart_count,
        ) {
            (
                Some(rank),
                Some(world_size),
                Some(local_rank),
                Some(master_addr),
                Some(master_port),
                Some(job_id),
                Some(checkpoint_dir),
                Some(restart_count),
            ) if problems.is_empty() => Ok(Self {
                rank,
                world_size,
                local_rank,
                master_addr,
                master_port,
                job_id,
                checkpoint_dir,
                restart_count,
            }),
            _ => Err(ReadProtocolEnvError { problems }),
        }
    }

    /// The variables to start a rank with, in [`vars::ALL`] order; reading them back with
    /// [`from_lookup`](Self::from_lookup) gives the same value.
    pub fn to_env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            (vars::RANK, self.rank.to_string().into()),
            (vars::WORLD_SIZE, self.world_size.to_string().into()),
            (vars::LOCAL_RANK, self.local_rank.to_string().into()),
            (vars::MASTER_ADDR, self.master_addr.clone().into()),
            (vars::MASTER_PORT, self.master_port.to_string().into()),
            (vars::JOB_ID, self.job_id.clone().into()),
            (vars::CHECKPOINT_DIR, self.checkpoint_dir.clone().into_os_string()),
            (vars::RESTART_COUNT, self.restart_count.to_string().into()),
        ]
    }
}

/// Whether a variable must be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Required,
    Optional,
}

/// Reads the protocol's variables one at a time through a lookup, keeping every problem found.
/// [`ProtocolEnv`] reads all of them, each required; the collective's `Membership` reads
/// torchrun's, some optional for a world of one. Either way a value parses the same.
pub(crate) struct EnvReader<F> {
    lookup: F,
    problems: Vec<EnvVarProblem>,
}

impl<F, V> EnvReader<F>
where
    F: FnMut(&str) -> Option<V>,
    V: Into<OsString>,
{
    pub(crate) fn new(lookup: F) -> Self {
        EnvReader { lookup, problems: Vec::new() }
    }

    /// Whether `var` is set at all.
    pub(crate) fn is_set(&mut self, var: &str) -> bool {
        (self.lookup)(var).is_some()
    }

    fn raw(&mut self, var: &'static str, need: Need) -> Option<OsString> {
        let value = (self.lookup)(var).map(Into::into);
        if value.is_none() && need == Need::Required {
            self.problems.push(EnvVarProblem::Missing { var });
        }
        value
    }

    /// A whole number (no sign, no spaces).
    pub(crate) fn number<T>(&mut self, var: &'static str, need: Need) -> Option<T>
    where
        T: std::str::FromStr<Err = std::num::ParseIntError> + Bounded,
    {
        let text = match self.raw(var, need)?.into_string() {
            Ok(text) => text,
            Err(value) => {
                self.invalid(var, &value, "is not valid UTF-8");
                return None;
            }
        };
        match text.parse() {
            Ok(number) => Some(number),
            Err(e) => {
                self.invalid(
                    var,
                    &text,
                    &format!("is not a whole number from 0 to {} ({e})", T::MAX),
                );
                None
            }
        }
    }

    /// Text that is not empty.
    pub(crate) fn text(&mut self, var: &'static str, need: Need) -> Option<String> {
        match self.raw(var, need)?.into_string() {
            Ok(text) if text.is_empty() => {
                self.invalid(var, "", "is empty");
                None
            }
            Ok(text) => Some(text),
            Err(value) => {
                self.invalid(var, &value, "is not valid UTF-8");
                None
            }
        }
    }

    /// A path that is not empty (any bytes).
    pub(crate) fn path(&mut self, var: &'static str, need: Need) -> Option<PathBuf> {
        let value = self.raw(var, need)?;
        if value.is_empty() {
            self.invalid(var, &value, "is empty");
            return None;
        }
        Some(PathBuf::from(value))
    }

    /// Records that `var`'s `value` cannot be used, and why.
    pub(crate) fn invalid(&mut self, var: &'static str, value: impl AsRef<OsStr>, reason: &str) {
        self.problems.push(EnvVarProblem::Invalid {
            var,
            value: value.as_ref().to_string_lossy().into_owned(),
            reason: reason.to_owned(),
        });
    }

    /// Every problem found, in [`vars::ALL`] order.
    pub(crate) fn finish(self) -> Vec<EnvVarProblem> {
        let mut problems = self.problems;
        problems.sort_by_key(|p| vars::ALL.iter().position(|v| *v == p.var()));
        problems
    }
}

/// The unsigned integer types the variables hold, for the range in error messages.
pub(crate) trait Bounded {
    const MAX: u64;
}

impl Bounded for u16 {
    const MAX: u64 = u16::MAX as u64;
}

impl Bounded for u32 {
    const MAX: u64 = u32::MAX as u64;
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn sample() -> ProtocolEnv {
        ProtocolEnv {
            rank: 2,
            world_size: 4,
            local_rank: 0,
            master_addr: "10.0.0.7".into(),
            master_port: 29500,
            job_id: "job-17".into(),
            checkpoint_dir: "/shared/ckpt/job-17".into(),
            restart_count: 3,
        }
    }

    fn lookup_in(env: &HashMap<&'static str, OsString>) -> impl FnMut(&str) -> Option<OsString> {
        move |var| env.get(var).cloned()
    }

    fn read_with(
        changes: &[(&'static str, Option<&str>)],
    ) -> Result<ProtocolEnv, ReadProtocolEnvError> {
        let mut env: HashMap<_, _> = sample().to_env().into_iter().collect();
        for (var, value) in changes {
            match value {
                Some(value) => env.insert(var, OsString::from(value)),
                None => env.remove(var),
            };
        }
        ProtocolEnv::from_lookup(lookup_in(&env))
    }

    #[test]
    fn the_environment_round_trips() {
        let env = sample();
        let pairs = env.to_env();
        let names: Vec<_> = pairs.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, vars::ALL);
        let map: HashMap<_, _> = pairs.into_iter().collect();
        assert_eq!(ProtocolEnv::from_lookup(lookup_in(&map)).unwrap(), env);
    }

    #[test]
    fn each_missing_variable_is_named() {
        for var in vars::ALL {
            let err = read_with(&[(var, None)]).unwrap_err();
            assert_eq!(err.problems, [EnvVarProblem::Missing { var }]);
            assert!(err.to_string().contains(&format!("{var} is not set")), "{err}");
        }
    }

    #[test]
    fn bad_values_name_the_variable_and_the_value() {
        let cases: &[(&'static str, &str, &str)] = &[
            (vars::RANK, "two", "is not a whole number"),
            (vars::RANK, "-1", "is not a whole number"),
            (vars::RANK, "4", "must be less than WORLD_SIZE=4"),
            (vars::LOCAL_RANK, "9", "must be less than WORLD_SIZE=4"),
            (vars::WORLD_SIZE, "0", "must be at least 1"),
            (vars::WORLD_SIZE, " 4", "is not a whole number"),
            (vars::MASTER_PORT, "70000", "is not a whole number from 0 to 65535"),
            (vars::MASTER_PORT, "0", "is not a port"),
            (vars::MASTER_ADDR, "", "is empty"),
            (vars::JOB_ID, "", "is empty"),
            (vars::CHECKPOINT_DIR, "", "is empty"),
            (vars::RESTART_COUNT, "1.5", "is not a whole number"),
        ];
        for (var, value, reason) in cases {
            let err = read_with(&[(var, Some(value))]).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{var}={value}: {err}");
            assert_eq!(err.problems[0].var(), *var, "{err}");
            let text = err.to_string();
            assert!(text.contains(&format!("{var}={value:?}")), "{text}");
            assert!(text.contains(reason), "{var}={value}: {text}");
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = read_with(&[
            (vars::MASTER_PORT, Some("http")),
            (vars::RANK, None),
            (vars::RESTART_COUNT, Some("")),
        ])
        .unwrap_err();
        let vars: Vec<_> = err.problems.iter().map(EnvVarProblem::var).collect();
        assert_eq!(vars, [vars::RANK, vars::MASTER_PORT, vars::RESTART_COUNT], "{err}");
    }

    #[test]
    fn non_utf8_values_are_refused_except_the_checkpoint_path() {
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(vec![b'/', b'd', 0xff]);
        let mut env: HashMap<_, _> = sample().to_env().into_iter().collect();
        env.insert(vars::CHECKPOINT_DIR, odd.clone());
        let read = ProtocolEnv::from_lookup(lookup_in(&env)).unwrap();
        assert_eq!(read.checkpoint_dir.as_os_str(), odd);
        assert_eq!(read.to_env()[6].1, odd);

        env.insert(vars::JOB_ID, odd);
        let err = ProtocolEnv::from_lookup(lookup_in(&env)).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert!(err.to_string().contains("FLEETMEND_JOB_ID") && err.to_string().contains("UTF-8"));
    }
}
