//! The registry of checks: every check the agent can run, by name, in one place.
//!
//! Adding a check touches this file, the check's own file, and its fixture folder under
//! `agent/tests/fixtures/`. Nothing registers itself.
//!
//! A check is a measurement, not a crash: `run` never panics on bad input and never returns an
//! error; what it could not see becomes an `unknown` finding. The runner gives every run its own
//! timeout on a worker thread, so one check that hangs never holds up a scrape, a report or another
//! check.

pub mod disk;
pub mod gpu;
pub mod host;
pub mod kernel_log;
pub mod nic;
pub mod pcie;

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use fleetmend_proto::Finding;
use tokio::sync::Notify;

use crate::config::{AgentConfig, HostPaths, Schedule};
use crate::metrics::Sample;

/// The names of every check, in the order they run and are shown.
pub const CHECK_NAMES: [&str; 6] =
    [gpu::NAME, kernel_log::NAME, nic::NAME, pcie::NAME, disk::NAME, host::NAME];

/// One check: looks at one part of the node and says what it saw.
pub trait Check: Send {
    /// The check's name: used in config, findings and metric labels.
    fn name(&self) -> &'static str;

    /// Looks once. Blocking I/O is fine: this runs on a worker thread under the check's timeout.
    /// Returns an ok finding for every healthy subject as well, so a condition can clear.
    fn run(&mut self, ctx: &RunContext<'_>) -> Observation;
}

/// What one run of a check saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    pub findings: Vec<Finding>,
    pub samples: Vec<Sample>,
}

/// What a run may look at.
#[derive(Debug, Clone, Copy)]
pub struct RunContext<'a> {
    pub paths: &'a HostPaths,
    /// Wall-clock time of this run (for windows and ages).
    pub now: SystemTime,
    /// When the runner stops waiting for this run; probes inside a check can use it to bound
    /// their own waits.
    pub deadline: Instant,
}

/// How the agent runs: as a daemon, or once (`fleetmend agent --once`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Runs checks on their intervals and follows event streams (kernel log, GPU events).
    Daemon,
    /// Runs every check once; event streams are read as a backlog, not followed.
    Once,
}

/// Wakes a check's run loop at once, outside its interval: a kernel-log line or GPU event that
/// must be reported now. Raising it from any thread is fine.
#[derive(Debug, Clone, Default)]
pub struct EventSignal(Arc<Notify>);

impl EventSignal {
    pub fn raise(&self) {
        self.0.notify_one();
    }

    /// Waits until the signal is raised (or returns at once if it was raised since the last wait).
    pub async fn raised(&self) {
        self.0.notified().await;
    }
}

/// What a check gets when it is built.
#[derive(Debug, Clone)]
pub struct BuildContext<'a> {
    pub paths: &'a HostPaths,
    pub node: &'a str,
    pub mode: Mode,
    /// Raise to have this check run (and the agent report) at once.
    pub events: EventSignal,
}

/// A built check with its schedule and its event signal.
pub struct ScheduledCheck {
    pub check: Box<dyn Check>,
    pub schedule: Schedule,
    pub events: EventSignal,
}

impl std::fmt::Debug for ScheduledCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduledCheck")
            .field("check", &self.check.name())
            .field("schedule", &self.schedule)
            .finish()
    }
}

/// Builds every enabled check from the config. Checks whose device or library is missing still
/// build: they report `unknown` when run.
pub fn build(config: &AgentConfig, node: &str, mode: Mode) -> Vec<ScheduledCheck> {
    let checks = &config.checks;
    let mut built = Vec::new();
    let mut add = |schedule: Schedule, make: &dyn Fn(BuildContext<'_>) -> Box<dyn Check>| {
        if !schedule.enabled {
            return;
        }
        let events = EventSignal::default();
        let ctx = BuildContext { paths: &config.paths, node, mode, events: events.clone() };
        built.push(ScheduledCheck { check: make(ctx), schedule, events });
    };
    add(checks.gpu.schedule(), &|ctx| Box::new(gpu::GpuCheck::new(&checks.gpu, ctx)));
    add(checks.kernel_log.schedule(), &|ctx| {
        Box::new(kernel_log::KernelLogCheck::new(&checks.kernel_log, ctx))
    });
    add(checks.nic.schedule(), &|ctx| Box::new(nic::NicCheck::new(&checks.nic, ctx)));
    add(checks.pcie.schedule(), &|ctx| Box::new(pcie::PcieCheck::new(&checks.pcie, ctx)));
    add(checks.disk.schedule(), &|ctx| Box::new(disk::DiskCheck::new(&checks.disk, ctx)));
    add(checks.host.schedule(), &|ctx| Box::new(host::HostCheck::new(&checks.host, ctx)));
    built
}
