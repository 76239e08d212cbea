//! The simulated fleet: nodes whose agents report what is new (a fault, a reboot, a rank that
//! started or ended) to the repairer's own engine, take the commands waiting for them at their
//! heartbeat, and run the ranks of the simulated jobs; faults that strike them; the provider's
//! reboots and replacements carried out; and people fixing what the repairer leaves to them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use fleetmend_agent::xid;
use fleetmend_local::faults::Fault;
use fleetmend_proto::jobs::PROGRESS_TOKEN_VAR;
use fleetmend_proto::{
    CommandResult, EvidenceBundle, EvidenceItem, Finding, NodeCommand, Progress, RankKey,
    RankSignal, RankState, RankStatus, RecommendedAction, Report, ReportTrigger, RunRank,
    SignalRank, Status, Verdict, WIRE_VERSION, command_kind,
};
use fleetmend_repairer::clock::Clock;
use fleetmend_repairer::commands::CommandQueue;
use fleetmend_repairer::engine::Engine;
use fleetmend_repairer::model::NodeState;
use fleetmend_repairer::queue::JobQueue;

use crate::catalog::{AgentCheck, FaultCatalog};
use crate::config::SimConfig;
use crate::job::{Phase, SimJob};
use crate::ports::{Presence, Request, SimProvider};

/// Something that happens in the simulated world at a time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Happening {
    /// Nodes (by slot) fail with a catalog category.
    Fault { slots: Vec<u32>, category: usize, correlated: bool },
    /// A node's heartbeat: it takes the commands waiting for it.
    Heartbeat { node: String },
    /// A reboot ends.
    BootDone { node: String, boot: u32 },
    /// A replacement node joins.
    Joined { node: String, slot: u32, category: usize },
    /// A person fixes a fault the repairer left (`since_ms` names the fault).
    ManualFix { node: String, since_ms: u64 },
    /// A job has something to do by itself.
    JobWake { job: String, token: u64 },
}

/// A fault on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveFault {
    pub category: usize,
    pub since_ms: u64,
    /// A repair reported success without fixing it.
    pub latent: bool,
}

/// One simulated node and its agent.
#[derive(Debug, Clone)]
pub struct SimNode {
    pub slot: u32,
    pub up: bool,
    pub boot: u32,
    pub seq: u64,
    pub fault: Option<ActiveFault>,
    pub retired: bool,
    /// Where its heartbeats fall within the report interval.
    pub phase_ms: u64,
    pub ranks: BTreeMap<RankKey, RankStatus>,
    /// Command results to carry in the next report.
    pub results: Vec<CommandResult>,
    /// Heartbeats still to send in full while a fault is new.
    pub echoes_left: u32,
}

/// Heartbeats a node sends in full after a fault appears: enough for any rule's debounce by
/// observations (the built-in rules ask for at most 2). After them, a heartbeat that says
/// nothing new is not sent; the repairer hears of the node through `Presence`.
const ECHOES: u32 = 4;

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
    pub queue: Arc<JobQueue>,
    pub commands: Arc<CommandQueue>,
    pub presence: Arc<Presence>,
    pub provider: Arc<SimProvider>,
    pub nodes: BTreeMap<String, SimNode>,
    /// Slot → the node in it now.
    pub slots: Vec<String>,
    pub jobs: BTreeMap<String, SimJob>,
    heap: BinaryHeap<Reverse<(u64, u64, Happening)>>,
    seq: u64,
    /// Nodes with a heartbeat scheduled to take their commands.
    heartbeat_due: BTreeSet<String>,
    pub tally: Tally,
    rng: fastrand::Rng,
    /// Nodes of the previous attempt per job (to count spares used).
    last_nodes: BTreeMap<String, BTreeSet<String>>,
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
    pub queue: Arc<JobQueue>,
    pub commands: Arc<CommandQueue>,
    pub presence: Arc<Presence>,
    pub provider: Arc<SimProvider>,
}

impl World {
    pub fn new(parts: Parts) -> World {
        let interval = parts.config.repairer.engine.report_interval.as_millis().max(1) as u64;
        let seed = parts.config.fleet.seed;
        let mut nodes = BTreeMap::new();
        let mut slots = Vec::new();
        for slot in 0..parts.config.fleet.nodes {
            let name = format!("n{slot:05}");
            nodes.insert(name.clone(), SimNode::new(slot, (u64::from(slot) * 7_919) % interval));
            slots.push(name);
        }
        World {
            config: parts.config,
            catalog: parts.catalog,
            clock: parts.clock,
            engine: parts.engine,
            queue: parts.queue,
            commands: parts.commands,
            presence: parts.presence,
            provider: parts.provider,
            nodes,
            slots,
            jobs: BTreeMap::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            heartbeat_due: BTreeSet::new(),
            tally: Tally::default(),
            rng: fastrand::Rng::with_seed(seed ^ 0x5eed),
            last_nodes: BTreeMap::new(),
        }
    }

    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn schedule(&mut self, at_ms: u64, what: Happening) {
        self.seq += 1;
        self.heap.push(Reverse((at_ms, self.seq, what)));
    }

    /// When the next happening is due.
    pub fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Takes the next happening due by `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Happening> {
        if self.next_at()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse((_, _, what))| what)
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
        }
    }

    /// Schedules the heartbeat of every node that has commands waiting.
    pub fn schedule_heartbeats(&mut self) {
        for node in self.commands.newly_waiting() {
            self.schedule_heartbeat(&node);
        }
    }

    /// Schedules `node`'s next heartbeat, unless one is due already.
    fn schedule_heartbeat(&mut self, node: &str) {
        if self.heartbeat_due.contains(node) {
            return;
        }
        let now = self.now();
        let interval = self.config.repairer.engine.report_interval.as_millis().max(1) as u64;
        let Some(sim) = self.nodes.get(node) else { return };
        let offset = (sim.phase_ms + interval - now % interval) % interval;
        self.heartbeat_due.insert(node.to_owned());
        self.schedule(now + offset.max(1), Happening::Heartbeat { node: node.to_owned() });
    }

    /// A node's heartbeat: while a fault is new, the report that observes it again (the policy
    /// counts observations to debounce a finding); else only the commands waiting for it, as
    /// the reply to a report that says nothing new.
    fn heartbeat(&mut self, node: &str) {
        self.heartbeat_due.remove(node);
        let Some(sim) = self.nodes.get_mut(node).filter(|n| n.up && !n.retired) else { return };
        if sim.echoes_left > 0 && sim.fault.is_some() {
            sim.echoes_left -= 1;
            let more = sim.echoes_left > 0;
            self.report(node, ReportTrigger::Interval);
            if more {
                self.schedule_heartbeat(node);
            }
            return;
        }
        let commands = self.commands.take(node);
        if self.run_commands(node, commands) {
            self.report(node, ReportTrigger::Command);
        }
    }

    /// A fault is new on `node` (struck, or still there after a boot): its next heartbeats
    /// observe it again.
    fn echo_fault(&mut self, node: &str) {
        if let Some(sim) = self.nodes.get_mut(node).filter(|n| n.fault.is_some() && n.up) {
            sim.echoes_left = ECHOES;
            self.schedule_heartbeat(node);
        }
    }

    /// Carries out the provider calls made since the last look.
    pub fn provider_calls(&mut self) {
        for request in self.provider.take() {
            match request {
                Request::Reboot { node, at_ms } => self.reboot(&node, at_ms),
                Request::Replace { node, new_node, at_ms } => self.replace(&node, &new_node, at_ms),
            }
        }
    }

    // --- faults ----------------------------------------------------------------------------------

    fn strike(&mut self, node: &str, category: usize, latent: bool) {
        let now = self.now();
        let Some(sim) = self.nodes.get(node) else { return };
        if sim.retired || sim.fault.is_some() {
            return;
        }
        let Some(row) = self.catalog.categories.get(category).cloned() else { return };
        self.tally.node_failures += 1;
        *self.tally.by_category.entry(row.name.clone()).or_default() += 1;
        let silent = matches!(row.fault, Some(Fault::AgentKill));
        let visible = row.check != AgentCheck::None || silent;
        let kills = self.config.job.every_fault_kills || row.kills_job;
        if kills {
            self.kill_ranks(node, now, !silent && sim.up);
        }
        if visible {
            if let Some(sim) = self.nodes.get_mut(node) {
                sim.fault = Some(ActiveFault { category, since_ms: now, latent });
            }
            let fix_at = now + row.replace_time.as_millis() as u64;
            self.schedule(fix_at, Happening::ManualFix { node: node.to_owned(), since_ms: now });
        }
        if silent {
            self.go_down(node, now);
        } else if self.nodes.get(node).is_some_and(|n| n.up) {
            self.report(node, ReportTrigger::Event);
            self.echo_fault(node);
        }
    }

    /// The ranks on `node` die; the jobs they belong to stop making progress. With `reported`,
    /// the agent sees them exit.
    fn kill_ranks(&mut self, node: &str, now: u64, reported: bool) {
        let held = self.held();
        let Some(sim) = self.nodes.get_mut(node) else { return };
        let mut jobs = Vec::new();
        for status in sim.ranks.values_mut().filter(|s| s.state == RankState::Running) {
            jobs.push(status.key.clone());
            if reported {
                status.state = RankState::Exited;
                status.exit_code = Some(1);
                status.message = "a fault on the node killed the rank".to_owned();
                status.finished_at_ms = Some(now);
            }
        }
        for key in jobs {
            if let Some(job) = self.jobs.get_mut(&key.job)
                && job.attempt == Some(key.attempt)
            {
                job.accrue(now, held);
                job.kill(now);
            }
        }
    }

    fn go_down(&mut self, node: &str, now: u64) {
        self.presence.went_down(node, now);
        // Its silence comes due in the engine's tick, which a report would not tell.
        self.engine.wake();
        if let Some(sim) = self.nodes.get_mut(node) {
            sim.up = false;
            sim.ranks.clear();
            sim.results.clear();
        }
    }

    fn reboot(&mut self, node: &str, at_ms: u64) {
        self.tally.reboots += 1;
        self.kill_ranks(node, at_ms, false);
        self.go_down(node, at_ms);
        let Some(sim) = self.nodes.get_mut(node) else { return };
        sim.boot += 1;
        let boot = sim.boot;
        let reboot_time = match &sim.fault {
            Some(fault) => self.catalog.categories[fault.category].reboot_time,
            None => std::time::Duration::from_secs(600),
        };
        let at = at_ms + reboot_time.as_millis() as u64;
        self.schedule(at, Happening::BootDone { node: node.to_owned(), boot });
    }

    fn boot_done(&mut self, node: &str, boot: u32) {
        let silent_rate = self.config.failures.silent_repair_rate;
        let draw = self.rng.f64();
        let Some(sim) = self.nodes.get_mut(node) else { return };
        if sim.retired || sim.boot != boot {
            return;
        }
        let mut relapse = None;
        if let Some(fault) = sim.fault.clone() {
            let row = &self.catalog.categories[fault.category];
            let dead = matches!(row.fault, Some(Fault::AgentKill)) && !row.reboot_clears;
            if dead {
                // The host does not come back: a power supply, a chassis.
                return;
            }
            if row.reboot_clears {
                sim.fault = None;
                if draw < silent_rate {
                    relapse = Some(fault.category);
                }
            }
        }
        sim.up = true;
        self.presence.came_up(node);
        self.report(node, ReportTrigger::Startup);
        self.echo_fault(node);
        if let Some(category) = relapse {
            self.relapse(node, category);
        }
    }

    /// A repair that reported success without fixing the node: the fault strikes again within
    /// hours.
    fn relapse(&mut self, node: &str, category: usize) {
        self.tally.silent_repair_failures += 1;
        let now = self.now();
        let after = (-(1.0 - self.rng.f64()).ln() * 3_600_000.0) as u64;
        if let Some(sim) = self.nodes.get(node) {
            let slot = sim.slot;
            self.schedule(
                now + after.max(1),
                Happening::Fault { slots: vec![slot], category, correlated: false },
            );
        }
    }

    fn replace(&mut self, node: &str, new_node: &str, at_ms: u64) {
        self.tally.replacements += 1;
        self.kill_ranks(node, at_ms, false);
        let Some(sim) = self.nodes.get_mut(node) else { return };
        sim.retired = true;
        let slot = sim.slot;
        let category = sim.fault.as_ref().map_or(usize::MAX, |f| f.category);
        let replace_time = self
            .catalog
            .categories
            .get(category)
            .map_or(std::time::Duration::from_secs(2 * 86_400), |c| c.replace_time);
        self.go_down(node, at_ms);
        // Retired: the repairer does not wait to hear from it again.
        self.presence.forget(node);
        let at = at_ms + replace_time.as_millis() as u64;
        self.schedule(at, Happening::Joined { node: new_node.to_owned(), slot, category });
    }

    fn joined(&mut self, node: &str, slot: u32, category: usize) {
        let interval = self.config.repairer.engine.report_interval.as_millis().max(1) as u64;
        let silent_rate = self.config.failures.silent_repair_rate;
        let draw = self.rng.f64();
        self.nodes
            .insert(node.to_owned(), SimNode::new(slot, (u64::from(slot) * 7_919) % interval));
        if let Some(name) = self.slots.get_mut(slot as usize) {
            *name = node.to_owned();
        }
        self.report(node, ReportTrigger::Startup);
        if draw < silent_rate && category < self.catalog.categories.len() {
            self.relapse(node, category);
        }
    }

    fn manual_fix(&mut self, node: &str, since_ms: u64) {
        let Some(sim) = self.nodes.get_mut(node) else { return };
        if sim.retired || sim.fault.as_ref().is_none_or(|f| f.since_ms != since_ms) {
            return;
        }
        sim.fault = None;
        if sim.up {
            self.report(node, ReportTrigger::Event);
        } else {
            sim.boot += 1;
            sim.up = true;
            self.presence.came_up(node);
            self.report(node, ReportTrigger::Startup);
        }
    }

    // --- the agent -------------------------------------------------------------------------------

    /// What the node's agent sees.
    fn findings(&self, sim: &SimNode) -> Vec<Finding> {
        let Some(fault) = &sim.fault else { return Vec::new() };
        let row = &self.catalog.categories[fault.category];
        let finding = |check: &str, id: &str, subject: &str, status, action, message: String| {
            Finding::new(check, id, subject, status, action, message)
        };
        let (status, action, message) = match row.fault {
            Some(Fault::GpuXid(code)) => {
                let advice = xid::advice(code);
                (advice.status, advice.action, format!("Xid {code} ({}) on GPU 0", advice.meaning))
            }
            Some(Fault::GpuMissing) => {
                (Status::Fail, RecommendedAction::Reboot, "7 of 8 GPUs".to_owned())
            }
            Some(Fault::RowRemapFailure) => {
                (Status::Fail, RecommendedAction::Replace, "row remapping failed".to_owned())
            }
            Some(Fault::NvlinkDown) => {
                (Status::Fail, RecommendedAction::ResetGpu, "NVLink down".to_owned())
            }
            Some(Fault::NicDown) => {
                (Status::Fail, RecommendedAction::Drain, "ib0 is down".to_owned())
            }
            Some(Fault::IbPortDown) => {
                (Status::Fail, RecommendedAction::Drain, "InfiniBand mlx5_0/1 is down".to_owned())
            }
            Some(Fault::DiskReadonly) => {
                (Status::Fail, RecommendedAction::Drain, "/scratch is read-only".to_owned())
            }
            Some(Fault::DiskFull) => {
                (Status::Warn, RecommendedAction::None, "/scratch is full".to_owned())
            }
            Some(Fault::KernelMce) => {
                (Status::Warn, RecommendedAction::None, "machine check".to_owned())
            }
            Some(Fault::PcieDowntrained) => {
                (Status::Fail, RecommendedAction::Reboot, "PCIe link x8 of x16".to_owned())
            }
            Some(Fault::GpuThrottle) => (
                Status::Fail,
                RecommendedAction::Drain,
                "clocks slowed down (sustained)".to_owned(),
            ),
            Some(Fault::NicPcieDowntrained) => {
                (Status::Fail, RecommendedAction::Reboot, "NIC PCIe link Gen3 of Gen5".to_owned())
            }
            Some(Fault::GpuLost) => {
                (Status::Fail, RecommendedAction::Reboot, "GPU fell off the bus".to_owned())
            }
            Some(Fault::XidBurst) => (
                Status::Fail,
                RecommendedAction::Reboot,
                "Xid 13 repeated on GPC 1, TPC 2".to_owned(),
            ),
            Some(Fault::GspTimeout) => (
                Status::Fail,
                RecommendedAction::ResetGpu,
                "the GPU likely needs to be reset".to_owned(),
            ),
            Some(Fault::NvswitchFatal) => {
                (Status::Fail, RecommendedAction::Reboot, "fatal NVSwitch SXid".to_owned())
            }
            Some(Fault::Mlx5Health) => {
                (Status::Fail, RecommendedAction::Reboot, "NIC health compromised".to_owned())
            }
            // A silent agent reports nothing; job faults are refused by the catalog.
            Some(Fault::AgentKill | Fault::Hang | Fault::Nan | Fault::Slow(_)) => {
                return Vec::new();
            }
            None => {
                (Status::Warn, RecommendedAction::None, format!("{} ({})", row.finding, row.name))
            }
        };
        vec![finding(row.check.as_str(), &row.finding, "0", status, action, message)]
    }

    /// Sends the node's report with what is new, and runs the commands in the reply (which may
    /// call for another report).
    pub fn report(&mut self, node: &str, trigger: ReportTrigger) {
        let mut trigger = trigger;
        for _ in 0..8 {
            let Some(report) = self.build_report(node, trigger) else { return };
            self.tally.events += 1;
            let reply = match self.engine.ingest_report(&report) {
                Ok(reply) => reply,
                Err(err) => {
                    tracing::warn!(node, error = %err, "the repairer refused a simulated report");
                    return;
                }
            };
            // Ranks whose end has been reported are forgotten, as the agent does after a while.
            if let Some(sim) = self.nodes.get_mut(node) {
                sim.ranks.retain(|_, s| s.state == RankState::Running);
            }
            if !self.run_commands(node, reply.commands) {
                return;
            }
            trigger = ReportTrigger::Command;
        }
    }

    fn build_report(&mut self, node: &str, trigger: ReportTrigger) -> Option<Report> {
        let now = self.now();
        let findings = self.findings(self.nodes.get(node)?);
        let sim = self.nodes.get_mut(node)?;
        if !sim.up || sim.retired {
            return None;
        }
        sim.seq += 1;
        let verdict = if findings.iter().any(|f| f.status == Status::Fail) {
            Verdict::Unhealthy
        } else if findings.is_empty() {
            Verdict::Healthy
        } else {
            Verdict::Degraded
        };
        Some(Report {
            wire_version: WIRE_VERSION,
            node: node.to_owned(),
            boot_id: format!("{node}-boot-{}", sim.boot),
            agent_version: "sim".to_owned(),
            seq: sim.seq,
            sent_at_ms: now,
            trigger,
            verdict,
            checks: Vec::new(),
            findings,
            command_results: std::mem::take(&mut sim.results),
            address: None,
            ranks: sim.ranks.values().cloned().collect(),
            metrics_port: None,
        })
    }

    /// Runs commands on the node; true when something changed that its agent reports.
    fn run_commands(&mut self, node: &str, commands: Vec<NodeCommand>) -> bool {
        let mut changed = false;
        for command in commands {
            self.tally.events += 1;
            changed |= match command.kind.as_str() {
                command_kind::RUN_RANK => match command.args_as::<RunRank>() {
                    Ok(run) => self.run_rank(node, run),
                    Err(_) => false,
                },
                command_kind::SIGNAL_RANK => match command.args_as::<SignalRank>() {
                    Ok(signal) => self.signal_rank(node, &signal),
                    Err(_) => false,
                },
                command_kind::DEEP_CHECK => self.deep_check(node, &command),
                command_kind::EVIDENCE => self.evidence(node, &command),
                _ => false,
            };
        }
        changed
    }

    fn deep_check(&mut self, node: &str, command: &NodeCommand) -> bool {
        let now = self.now();
        let Some(sim) = self.nodes.get(node) else { return false };
        let findings = self.findings(sim);
        let ok = findings.iter().all(|f| f.status != Status::Fail);
        let result = CommandResult {
            id: command.id.clone(),
            kind: command.kind.clone(),
            ok,
            message: if ok { "every check passed".to_owned() } else { "a check failed".to_owned() },
            verdict: Some(if ok { Verdict::Healthy } else { Verdict::Unhealthy }),
            findings,
            evidence: None,
            allreduce: None,
            finished_at_ms: now,
        };
        if let Some(sim) = self.nodes.get_mut(node) {
            sim.results.push(result);
        }
        true
    }

    /// The bundle an agent gathers before a disruptive repair: here its findings only.
    fn evidence(&mut self, node: &str, command: &NodeCommand) -> bool {
        let now = self.now();
        let Some(sim) = self.nodes.get(node) else { return false };
        let content = serde_json::to_string(&self.findings(sim)).unwrap_or_default();
        let item = EvidenceItem::text("findings", "the simulated agent", content);
        let bundle = EvidenceBundle {
            node: node.to_owned(),
            boot_id: format!("{node}-boot-{}", sim.boot),
            collected_at_ms: now,
            took_ms: 0,
            items: vec![item],
        };
        let result = CommandResult::evidence(&command.id, bundle, now);
        if let Some(sim) = self.nodes.get_mut(node) {
            sim.results.push(result);
        }
        true
    }

    fn run_rank(&mut self, node: &str, run: RunRank) -> bool {
        let now = self.now();
        let key = run.key.clone();
        // A rank on a node whose fault kills jobs dies at once.
        let doomed = self.nodes.get(node).and_then(|n| n.fault.as_ref()).is_some_and(|f| {
            let row = &self.catalog.categories[f.category];
            self.config.job.every_fault_kills || row.kills_job
        });
        let status = RankStatus {
            key: key.clone(),
            state: if doomed { RankState::Exited } else { RankState::Running },
            pid: Some(1000 + key.rank),
            exit_code: doomed.then_some(1),
            signal: None,
            message: if doomed {
                "CUDA error: the GPU is not usable".to_owned()
            } else {
                String::new()
            },
            started_at_ms: now,
            finished_at_ms: doomed.then_some(now),
        };
        let Some(sim) = self.nodes.get_mut(node) else { return false };
        sim.ranks.insert(key.clone(), status);
        let token = run.env.get(PROGRESS_TOKEN_VAR).cloned().unwrap_or_default();
        self.rank_started(node, &key, &token, doomed);
        true
    }

    fn rank_started(&mut self, node: &str, key: &RankKey, token: &str, doomed: bool) {
        let now = self.now();
        let held = self.held();
        let Some(job) = self.jobs.get_mut(&key.job) else { return };
        if job.attempt.is_none_or(|a| a < key.attempt) {
            // A new attempt: the last one's interruption is over.
            job.accrue(now, held);
            let view = self.queue.job(&key.job);
            let (launched, ended) = view
                .as_ref()
                .map(|v| {
                    let history = &v.job.history;
                    let launched = history.last().map_or(now, |a| a.started_ms);
                    let ended =
                        history.iter().rev().nth(1).and_then(|a| a.ended_ms).unwrap_or(launched);
                    (launched, ended)
                })
                .unwrap_or((now, now));
            job.account_interruption(ended, launched, held);
            job.accrue(now, held);
            job.attempt = Some(key.attempt);
            job.ranks_started = 0;
            job.phase = Phase::Launching;
            if let Some(v) = &view {
                let nodes: BTreeSet<String> = v.job.nodes.iter().cloned().collect();
                if let Some(previous) = self.last_nodes.get(&key.job) {
                    self.tally.spares_used += nodes.difference(previous).count() as u32;
                }
                self.last_nodes.insert(key.job.clone(), nodes);
            }
        }
        // The simulated job posts as its rank 0, with that rank's own token.
        if key.rank == 0 && job.attempt == Some(key.attempt) {
            job.token = token.to_owned();
        }
        let Some(job) = self.jobs.get_mut(&key.job) else { return };
        if job.attempt != Some(key.attempt) {
            return;
        }
        if doomed {
            job.kill(now);
            return;
        }
        job.ranks_started += 1;
        if job.ranks_started == job.nodes && job.phase == Phase::Launching {
            job.phase =
                Phase::Restarting { until_ms: now + self.config.job.restart.as_millis() as u64 };
            let _ = node;
            self.plan_job(&key.job.clone());
        }
    }

    fn signal_rank(&mut self, node: &str, signal: &SignalRank) -> bool {
        let now = self.now();
        let held = self.held();
        let key = &signal.key;
        let Some(sim) = self.nodes.get_mut(node) else { return false };
        let Some(status) = sim.ranks.get_mut(key).filter(|s| s.state == RankState::Running) else {
            return false;
        };
        let ends = matches!(signal.signal, RankSignal::Term | RankSignal::Kill);
        if ends {
            status.state = RankState::Exited;
            status.signal = Some(if signal.signal == RankSignal::Term { 15 } else { 9 });
            status.finished_at_ms = Some(now);
        }
        // A stop has reached the job: its time is the stop's from the queue's request on (read
        // once per stop). A SIGUSR1 with no stop is the repairer asking for a checkpoint before
        // it requeues the job off a drained node: the job writes it and trains on.
        let first = self
            .jobs
            .get(&key.job)
            .is_some_and(|j| j.interrupted.is_none_or(|i| i.stop_requested_ms.is_none()));
        let requested = if first { self.queue.stop_requested_ms(&key.job) } else { None };
        let on_signal = self.config.job.checkpoint_on_signal;
        let write = self.config.job.checkpoint_write.as_millis() as u64;
        let Some(job) = self.jobs.get_mut(&key.job).filter(|j| j.attempt == Some(key.attempt))
        else {
            return ends;
        };
        job.accrue(now, held);
        let alive = !matches!(job.phase, Phase::Interrupted);
        if (ends || requested.is_some())
            && (job.interrupted.is_none()
                || job.interrupted.is_some_and(|i| i.stop_requested_ms.is_none()))
        {
            job.stop_reached(now, requested.unwrap_or(now));
        }
        // The ranks agree on the checkpoint at their next step (the protocol's flag, reduced
        // over the job): the first rank to get SIGUSR1 starts it, whichever node it is on.
        let writing_at_signal = matches!(job.phase, Phase::Writing { signal: true, .. });
        if ends {
            job.phase = Phase::Interrupted;
        } else if signal.signal == RankSignal::Usr1
            && alive
            && on_signal
            && !writing_at_signal
            && matches!(job.phase, Phase::Training | Phase::Writing { .. })
        {
            job.phase = Phase::Writing { until_ms: now + write, signal: true };
        }
        let id = key.job.clone();
        self.plan_job(&id);
        ends
    }

    // --- the jobs --------------------------------------------------------------------------------

    /// Schedules the job's next wake.
    pub fn plan_job(&mut self, id: &str) {
        let Some(job) = self.jobs.get_mut(id) else { return };
        job.wake_token += 1;
        let token = job.wake_token;
        if let Some(at) = job.next_wake() {
            self.schedule(at, Happening::JobWake { job: id.to_owned(), token });
        }
    }

    fn job_wake(&mut self, id: &str, token: u64) {
        let now = self.now();
        let held = self.held();
        let step_s = self.config.job.step_time.as_secs_f64();
        let write = self.config.job.checkpoint_write.as_millis() as u64;
        let progress_every = self.config.job.progress_every.as_secs_f64();
        let Some(job) = self.jobs.get_mut(id).filter(|j| j.wake_token == token) else { return };
        job.accrue(now, held);
        let mut post: Option<(bool, Option<f64>)> = None;
        match job.phase {
            Phase::Restarting { until_ms } if now >= until_ms => {
                job.phase = Phase::Training;
                job.progress_s = job.checkpoint_s;
                job.next_checkpoint_s = job.checkpoint_s + job.interval_s;
                job.next_post_s = job.progress_s + progress_every;
                post = Some((false, None));
            }
            Phase::Writing { until_ms, signal } if now >= until_ms => {
                job.checkpoint_s = job.progress_s;
                job.checkpoints += 1;
                // Written at a signal or on its interval, the job trains on (the protocol's
                // SIGUSR1); the queue's SIGTERM, once it sees the checkpoint, stops it.
                if signal {
                    job.at_signal += 1;
                }
                job.phase = Phase::Training;
                job.next_checkpoint_s = job.progress_s + job.interval_s;
                post = Some((true, Some(write as f64 / 1000.0)));
            }
            Phase::Training => {
                if job.progress_s + 1e-6 >= job.next_checkpoint_s {
                    job.phase = Phase::Writing { until_ms: now + write, signal: false };
                }
                if job.progress_s + 1e-6 >= job.next_post_s {
                    job.next_post_s = job.progress_s + progress_every;
                    post = Some((false, None));
                }
            }
            _ => {}
        }
        if let Some((checkpointed, write_seconds)) = post {
            let Some(job) = self.jobs.get(id) else { return };
            let attempt = job.attempt.unwrap_or(0);
            let steps = |s: f64| (s / step_s).floor() as u64;
            let progress = Progress {
                job: id.to_owned(),
                attempt,
                rank: 0,
                step: steps(job.progress_s),
                start_step: steps(job.checkpoint_s.min(job.progress_s)),
                loss: 2.0,
                samples_per_second: 1.0 / step_s,
                checkpoint_step: (job.checkpoints > 0).then(|| steps(job.checkpoint_s)),
                checkpoint_write_seconds: write_seconds.filter(|_| checkpointed),
                checkpoint_stall_seconds: None,
                step_seconds: None,
                waiting_for: Vec::new(),
                at_ms: now,
            };
            let token = job.token.clone();
            self.tally.events += 1;
            match self.queue.progress(id, Some(&token), &progress) {
                Ok(reply) => {
                    if let (Some(every), crate::config::Interval::Auto) =
                        (reply.checkpoint_every, self.config.job.checkpoint_every)
                        && let Some(job) = self.jobs.get_mut(id)
                    {
                        job.interval_s = (every as f64 * step_s).max(step_s);
                        if job.phase == Phase::Training {
                            job.next_checkpoint_s =
                                job.next_checkpoint_s.min(job.checkpoint_s + job.interval_s);
                        }
                    }
                }
                Err(err) => {
                    tracing::debug!(job = id, error = %err, "a simulated progress post was refused")
                }
            }
        }
        self.plan_job(id);
    }
}

impl SimNode {
    fn new(slot: u32, phase_ms: u64) -> SimNode {
        SimNode {
            slot,
            up: true,
            boot: 0,
            seq: 0,
            fault: None,
            retired: false,
            phase_ms,
            ranks: BTreeMap::new(),
            results: Vec::new(),
            echoes_left: 0,
        }
    }
}
