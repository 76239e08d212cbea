//! The simulated agents' side of the conversation with the repairer: a node's reports, its
//! heartbeats while a fault is new or commands wait for it, and the commands it runs.

use fleetmend_proto::{
    CommandResult, EvidenceBundle, EvidenceItem, NodeCommand, RankState, Report, ReportTrigger,
    RunRank, SignalRank, Status, Verdict, command_kind,
};

use super::{Happening, World};

/// Heartbeats a node sends in full after a fault appears: enough for any rule's debounce by
/// observations (the built-in rules ask for at most 2). After them, a heartbeat that says
/// nothing new is not sent; the repairer hears of the node through `Presence`.
const ECHOES: u32 = 4;

impl World {
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
    pub(super) fn heartbeat(&mut self, node: &str) {
        self.heartbeat_due.remove(node);
        let Some(sim) = self.nodes.get_mut(node).filter(|n| n.up && !n.retired) else { return };
        let now = self.clock.now_ms();
        let noisy = sim.noise.as_mut().is_some_and(|n| n.active(now));
        if sim.echoes_left > 0 && (sim.fault.is_some() || noisy) {
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
    pub(super) fn echo_fault(&mut self, node: &str) {
        if let Some(sim) = self.nodes.get_mut(node).filter(|n| n.fault.is_some() && n.up) {
            sim.echoes_left = ECHOES;
            self.schedule_heartbeat(node);
        }
    }

    /// The node's agent sees something of the noise: its next heartbeats observe it again.
    pub(super) fn echo_noise(&mut self, node: &str) {
        let now = self.now();
        let Some(sim) = self.nodes.get_mut(node).filter(|n| n.up) else { return };
        if sim.noise.as_mut().is_some_and(|n| n.active(now)) {
            sim.echoes_left = ECHOES;
            self.schedule_heartbeat(node);
        }
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
        self.nodes.get_mut(node)?.report(node, &self.catalog, trigger, now)
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

    /// A deep check: here the node's findings, which fail it while it carries a fault.
    fn deep_check(&mut self, node: &str, command: &NodeCommand) -> bool {
        let now = self.now();
        let Some(sim) = self.nodes.get(node) else { return false };
        let findings = sim.findings(&self.catalog);
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
        let content = serde_json::to_string(&sim.findings(&self.catalog)).unwrap_or_default();
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
}
