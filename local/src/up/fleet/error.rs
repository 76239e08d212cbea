//! What goes wrong when a local fleet starts or is asked to act: [`FleetError`], and the agent
//! that never reported ([`JoinFailure`]) with the end of its log.

use std::path::{Path, PathBuf};

use fleetmend_repairer::service;

use crate::up::slurm::SlurmUpError;
use crate::up::supervisor::SupervisorError;

/// The fleet could not start or do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("the fleet's settings have {} problem(s): {}", .0.len(), .0.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<(String, String)>),
    #[error("preparing the state directory {path}: {source}")]
    StateDir { path: PathBuf, source: std::io::Error },
    #[error(
        "the state directory {path} holds another fleet ({found}); start with --fresh to replace it"
    )]
    OtherFleet { path: PathBuf, found: String },
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("node tree of {node}: {source}")]
    Tree { node: String, source: Box<crate::tree::TreeError> },
    #[error(transparent)]
    Supervisor(Box<SupervisorError>),
    #[error("the repairer's config: {}", .0.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    RepairerConfig(Vec<(String, String)>),
    #[error("starting the repairer: {0}")]
    Repairer(#[from] Box<service::ServiceError>),
    #[error("the repairer runs no embedded queue")]
    NoQueue,
    #[error("setting the spare {node} aside: {message}")]
    Spare { node: String, message: String },
    #[error("{0}")]
    Join(Box<JoinFailure>),
    #[error("submitting the training job: {0}")]
    Submit(String),
    #[error("the fleet runs no job")]
    NoJob,
    #[error("opening the event log: {0}")]
    Events(Box<fleetmend_repairer::store::StoreError>),
    #[error("Slurm: {0}")]
    Slurm(#[from] SlurmUpError),
    #[error("the repairers' PostgreSQL: {0}")]
    Postgres(#[from] fleetmend_repairer::postgres_server::PostgresServerError),
    #[error("the repairers: {0}")]
    Repairers(String),
}

impl From<SupervisorError> for FleetError {
    fn from(err: SupervisorError) -> Self {
        FleetError::Supervisor(Box::new(err))
    }
}

/// An agent that did not report at start.
#[derive(Debug, thiserror::Error)]
#[error("the agent of {node} did not report within {seconds} s ({why}); its log {log}:\n{tail}")]
pub struct JoinFailure {
    pub node: String,
    pub seconds: u64,
    pub why: String,
    pub log: PathBuf,
    pub tail: String,
}

/// The last `lines` lines of the file at `path`.
pub(in crate::up) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
