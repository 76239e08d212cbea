//! The host check (placeholder until implemented).

use std::time::Duration;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;

use super::{BuildContext, Check, Observation, RunContext};
use crate::config::{ConfigProblems, Schedule};

pub const NAME: &str = "host";

/// Settings of the host check (`[checks.host]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
        }
    }
}

impl HostConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
    }
}

#[derive(Debug)]
pub struct HostCheck {}

impl HostCheck {
    pub fn new(_config: &HostConfig, _ctx: BuildContext<'_>) -> Self {
        HostCheck {}
    }
}

impl Check for HostCheck {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&mut self, _ctx: &RunContext<'_>) -> Observation {
        Observation {
            findings: vec![Finding::new(
                NAME,
                NAME,
                "",
                Status::Unknown,
                RecommendedAction::None,
                "not implemented",
            )],
            samples: Vec::new(),
        }
    }
}
