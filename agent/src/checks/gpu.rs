//! The gpu check (placeholder until implemented).

use std::time::Duration;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;

use super::{BuildContext, Check, Observation, RunContext};
use crate::config::{ConfigProblems, Schedule};

pub const NAME: &str = "gpu";

/// Settings of the gpu check (`[checks.gpu]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
        }
    }
}

impl GpuConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
    }
}

#[derive(Debug)]
pub struct GpuCheck {}

impl GpuCheck {
    pub fn new(_config: &GpuConfig, _ctx: BuildContext<'_>) -> Self {
        GpuCheck {}
    }
}

impl Check for GpuCheck {
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
