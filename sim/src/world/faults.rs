//! Faults striking the simulated nodes: the ranks they kill, nodes that fall silent, and people
//! fixing what the repairer leaves to them.

use fleetmend_local::faults::Fault;
use fleetmend_proto::{RankState, ReportTrigger};

use super::{ActiveFault, Happening, World};
use crate::catalog::AgentCheck;

impl World {
    /// A fault of catalog `category` strikes `node`: its ranks die if the category kills jobs,
    /// and a person fixes it after the category's replacement time unless a repair does first.
    pub(super) fn strike(&mut self, node: &str, category: usize, latent: bool) {
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
                self.faulted.insert(node.to_owned());
                self.open_span(node, category);
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
    pub(super) fn kill_ranks(&mut self, node: &str, now: u64, reported: bool) {
        if self.gang.is_some() {
            self.gang_rank_died(node, now, reported);
            return;
        }
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

    /// The node falls silent: the repairer hears no more from it, and its ranks are gone.
    pub(super) fn go_down(&mut self, node: &str, now: u64) {
        self.presence.went_down(node, now);
        // Its silence comes due in the engine's tick, which a report would not tell.
        self.engine.wake();
        if let Some(sim) = self.nodes.get_mut(node) {
            sim.up = false;
            sim.ranks.clear();
            sim.results.clear();
        }
    }

    /// A person fixes the fault the repairer left (unless it is gone or another has struck).
    pub(super) fn manual_fix(&mut self, node: &str, since_ms: u64) {
        let Some(sim) = self.nodes.get_mut(node) else { return };
        if sim.retired || sim.fault.as_ref().is_none_or(|f| f.since_ms != since_ms) {
            return;
        }
        sim.fault = None;
        self.faulted.remove(node);
        let up = sim.up;
        self.close_span(node);
        if up {
            self.report(node, ReportTrigger::Event);
        } else {
            if let Some(sim) = self.nodes.get_mut(node) {
                sim.boot += 1;
            }
            self.booted(node);
        }
    }
}
