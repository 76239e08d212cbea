//! The simulated fleet: nodes whose agents report what is new (a fault, a reboot, a rank that
//! started or ended) to the repairer's own engine, take the commands waiting for them at their
//! heartbeat, and run the ranks of the simulated jobs; faults that strike them; the provider's
//! reboots and replacements carried out; and people fixing what the repairer leaves to them.
//!
//! [`World`] holds it all and carries out each [`Happening`]; by concern:
//!
//! - `agenda.rs`: the happenings still to come, in time order;
//! - `node.rs`: one node, what its agent sees of its fault, and the report it sends;
//! - `agent.rs`: the agents' reports, heartbeats and the commands they run;
//! - `faults.rs`: faults striking, the ranks they kill, and people fixing them;
//! - `provider.rs`: the provider's reboots and replacements, and the silent failures of repairs;
//! - `jobs.rs`: the jobs' ranks and signals, and the jobs' own steps and progress posts;
//! - `gang.rs`: the jobs' attempts under the gang scheduler (`crate::gang`), moved as one.

mod agenda;
mod agent;
mod faults;
mod gang;
mod jobs;
mod node;
mod noise;
mod not_healthy;
mod provider;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fleetmend_proto::ReportTrigger;
use fleetmend_repairer::clock::Clock;
use fleetmend_repairer::commands::CommandQueue;
use fleetmend_repairer::engine::Engine;
use fleetmend_repairer::model::NodeState;
use fleetmend_repairer::ports::FleetView;
use fleetmend_repairer::queue::JobQueue;

use self::agenda::Agenda;
pub use self::agenda::Happening;
pub use self::gang::GangJob;
pub use self::node::{ActiveFault, SimNode};
pub use self::noise::{Noise, NoiseTally, Step};
use self::not_healthy::NotHealthy;
use crate::catalog::FaultCatalog;
use crate::config::SimConfig;
use crate::gang::GangScheduler;
use crate::job::SimJob;
use crate::ports::{Presence, SimProvider};

/// Where the heartbeats of the node in `slot` fall within the report interval (spread over it,
/// the same for a node and its replacement).
pub(crate) fn heartbeat_phase(slot: u32, interval_ms: u64) -> u64 {
    (u64::from(slot) * 7_919) % interval_ms.max(1)
}

/// Tallies for the report.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub node_failures: u32,
    pub by_category: BTreeMap<String, u32>,
    pub correlated_events: u32,
    pub silent_repair_failures: u32,
    pub reboots: u32,
    pub replacements: u32,
    pub spares_used: u32,
    pub events: u64,
}

/// The simulated world, driven by `run.rs`.
pub struct World {
    pub config: SimConfig,
    pub catalog: FaultCatalog,
    pub clock: Arc<dyn Clock>,
    pub engine: Arc<Engine>,
    /// The embedded job queue (`job.scheduler = "queue"`), else none.
    pub queue: Option<Arc<JobQueue>>,
    /// The gang scheduler (`job.scheduler = "gang"`), else none.
    pub gang: Option<Arc<GangScheduler>>,
    /// The engine's nodes as placement sees them.
    pub fleet: Arc<dyn FleetView>,
    pub commands: Arc<CommandQueue>,
    pub presence: Arc<Presence>,
    pub provider: Arc<SimProvider>,
    pub nodes: BTreeMap<String, SimNode>,
    /// Slot → the node in it now.
    pub slots: Vec<String>,
    pub jobs: BTreeMap<String, SimJob>,
    agenda: Agenda,
    /// Nodes with a heartbeat scheduled to take their commands.
    heartbeat_due: BTreeSet<String>,
    pub tally: Tally,
    rng: fastrand::Rng,
    /// Nodes of the previous attempt per job (to count spares used).
    last_nodes: BTreeMap<String, BTreeSet<String>>,
    /// The jobs' attempts under the gang scheduler.
    pub gangs: BTreeMap<String, GangJob>,
    /// The fleet's generation the gang scheduler last looked at.
    gang_generation: u64,
    gang_attempts: self::gang::AttemptTallies,
    /// Slot → whether no job's rank holds it (under the gang scheduler): placement's candidates.
    gang_idle: Vec<bool>,
    /// Slot → whether its node was retired and its replacement has not joined yet.
    gang_vacant: Vec<bool>,
    /// The nodes carrying a fault now (a few, against the fleet).
    faulted: BTreeSet<String>,
    /// How long a node may go unheard before placement passes it over.
    unreachable_window_ms: u64,
    /// The engine's nodes not healthy, less the retired, read once per fleet generation.
    not_healthy: std::cell::RefCell<Arc<NotHealthy>>,
    /// Every fault struck, with when it ended (for the noise run's accounting).
    pub spans: Vec<FaultSpan>,
    /// Node → its open span in `spans`.
    open_spans: BTreeMap<String, usize>,
    /// The noise's own generator (drawing noise leaves the faults' draws as they were).
    noise_rng: fastrand::Rng,
    pub noise_tally: NoiseTally,
    /// Nodes rebooted on the new driver by the rolling upgrade.
    upgraded: BTreeSet<String>,
}

/// A fault on a node from when it struck until it ended (fixed, cleared by a reboot, or its node
/// retired); `until_ms` none: still there at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpan {
    pub node: String,
    pub category: usize,
    pub since_ms: u64,
    pub until_ms: Option<u64>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("nodes", &self.nodes.len()).finish_non_exhaustive()
    }
}

/// Ports and settings a world is built from.
#[allow(missing_debug_implementations)]
pub struct Parts {
    pub config: SimConfig,
    pub catalog: FaultCatalog,
    pub clock: Arc<dyn Clock>,
    pub engine: Arc<Engine>,
    pub queue: Option<Arc<JobQueue>>,
    pub gang: Option<Arc<GangScheduler>>,
    pub fleet: Arc<dyn FleetView>,
    pub commands: Arc<CommandQueue>,
    pub presence: Arc<Presence>,
    pub provider: Arc<SimProvider>,
}

impl World {
    pub fn new(parts: Parts) -> World {
        let interval = parts.config.repairer.engine.report_interval.as_millis().max(1) as u64;
        let seed = parts.config.fleet.seed;
        let engine = &parts.config.repairer.engine;
        let unreachable_window_ms =
            engine.report_interval.saturating_mul(engine.unreachable_after).as_millis() as u64;
        let mut nodes = BTreeMap::new();
        let mut slots = Vec::new();
        for slot in 0..parts.config.fleet.nodes {
            let name = format!("n{slot:05}");
            nodes.insert(name.clone(), SimNode::new(slot, heartbeat_phase(slot, interval)));
            slots.push(name);
        }
        let gang_idle = match &parts.gang {
            Some(gang) => {
                let mut book = gang.lock();
                for (slot, name) in slots.iter().enumerate() {
                    book.join(slot as u32, name);
                }
                vec![true; slots.len()]
            }
            None => Vec::new(),
        };
        World {
            config: parts.config,
            catalog: parts.catalog,
            clock: parts.clock,
            engine: parts.engine,
            queue: parts.queue,
            gang: parts.gang,
            fleet: parts.fleet,
            commands: parts.commands,
            presence: parts.presence,
            provider: parts.provider,
            nodes,
            slots,
            jobs: BTreeMap::new(),
            agenda: Agenda::default(),
            heartbeat_due: BTreeSet::new(),
            tally: Tally::default(),
            rng: fastrand::Rng::with_seed(seed ^ 0x5eed),
            last_nodes: BTreeMap::new(),
            gangs: BTreeMap::new(),
            gang_generation: u64::MAX,
            gang_attempts: BTreeMap::new(),
            gang_vacant: vec![false; gang_idle.len()],
            gang_idle,
            faulted: BTreeSet::new(),
            unreachable_window_ms,
            not_healthy: std::cell::RefCell::new(Arc::new(NotHealthy::unread())),
            spans: Vec::new(),
            open_spans: BTreeMap::new(),
            noise_rng: fastrand::Rng::with_seed(seed ^ 0x0015e),
            noise_tally: NoiseTally::default(),
            upgraded: BTreeSet::new(),
        }
    }

    /// A fault of `category` struck `node` now.
    fn open_span(&mut self, node: &str, category: usize) {
        let since_ms = self.now();
        self.open_spans.insert(node.to_owned(), self.spans.len());
        self.spans.push(FaultSpan { node: node.to_owned(), category, since_ms, until_ms: None });
    }

    /// `node`'s fault ended now.
    fn close_span(&mut self, node: &str) {
        let now = self.now();
        if let Some(span) = self.open_spans.remove(node).and_then(|i| self.spans.get_mut(i)) {
            span.until_ms = Some(now);
        }
    }

    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn schedule(&mut self, at_ms: u64, what: Happening) {
        self.agenda.schedule(at_ms, what);
    }

    /// When the next happening is due.
    pub fn next_at(&self) -> Option<u64> {
        self.agenda.next_at()
    }

    /// Takes the next happening due by `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Happening> {
        self.agenda.pop_due(now)
    }

    /// How many of the fleet's nodes are out of service now: not healthy (nor merely suspect)
    /// in the repairer's eyes, or retired and not yet replaced.
    pub fn out_of_service(&self) -> u32 {
        let counts = self.engine.state_counts();
        let serving: u64 = [NodeState::Healthy, NodeState::Suspect]
            .iter()
            .map(|state| counts.get(state).copied().unwrap_or(0))
            .sum();
        self.config.fleet.nodes.saturating_sub(u32::try_from(serving).unwrap_or(u32::MAX))
    }

    /// Whether a guard rail holds nodes back now (for the accounting of waiting time).
    pub fn held(&self) -> bool {
        self.engine.breaker().open
    }

    /// Every node's first report: the fleet joins.
    pub fn join_all(&mut self) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            self.report(&name, ReportTrigger::Startup);
        }
    }

    /// Carries out what happened.
    pub fn handle(&mut self, what: Happening) {
        self.tally.events += 1;
        match what {
            Happening::Fault { slots, category, correlated } => {
                if correlated {
                    self.tally.correlated_events += 1;
                }
                for slot in slots {
                    if let Some(node) = self.slots.get(slot as usize).cloned() {
                        self.strike(&node, category, false);
                    }
                }
            }
            Happening::Heartbeat { node } => self.heartbeat(&node),
            Happening::BootDone { node, boot } => self.boot_done(&node, boot),
            Happening::Joined { node, slot, category } => self.joined(&node, slot, category),
            Happening::ManualFix { node, since_ms } => self.manual_fix(&node, since_ms),
            Happening::JobWake { job, token } => self.job_wake(&job, token),
            Happening::GangStep { job, token } => self.gang_step(&job, token),
            Happening::Noise(what) => self.noise(what),
        }
    }
}
