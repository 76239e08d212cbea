//! The provider's reboots and replacements carried out on the simulated fleet, and the repairs
//! among them that report success without fixing the node.

use fleetmend_local::faults::Fault;
use fleetmend_proto::ReportTrigger;

use super::{Happening, SimNode, World};
use crate::ports::Request;

impl World {
    /// Carries out the provider calls made since the last look.
    pub fn provider_calls(&mut self) {
        for request in self.provider.take() {
            match request {
                Request::Reboot { node, at_ms } => self.reboot(&node, at_ms),
                Request::Replace { node, new_node, at_ms } => self.replace(&node, &new_node, at_ms),
            }
        }
    }

    /// The provider reboots `node`: it goes down and boots after its fault's reboot time.
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

    /// A reboot ends: the fault is gone if a reboot clears it (though the repair may be a silent
    /// failure), and the node reports as it starts.
    pub(super) fn boot_done(&mut self, node: &str, boot: u32) {
        let silent_rate = self.config.failures.silent_repair_rate;
        let draw = self.rng.f64();
        let Some(sim) = self.nodes.get_mut(node) else { return };
        if sim.retired || sim.boot != boot {
            return;
        }
        let mut relapse = None;
        let mut cleared = false;
        if let Some(fault) = sim.fault.clone() {
            let row = &self.catalog.categories[fault.category];
            let dead = matches!(row.fault, Some(Fault::AgentKill)) && !row.reboot_clears;
            if dead {
                // The host does not come back: a power supply, a chassis.
                return;
            }
            if row.reboot_clears {
                sim.fault = None;
                self.faulted.remove(node);
                cleared = true;
                if draw < silent_rate {
                    relapse = Some(fault.category);
                }
            }
        }
        if cleared {
            self.close_span(node);
        }
        self.booted(node);
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

    /// The provider retires `node`; a new one joins its slot after the fault's replacement time.
    fn replace(&mut self, node: &str, new_node: &str, at_ms: u64) {
        self.tally.replacements += 1;
        self.kill_ranks(node, at_ms, false);
        let Some(sim) = self.nodes.get_mut(node) else { return };
        sim.retired = true;
        let slot = sim.slot;
        // Its fault leaves the fleet with it.
        self.faulted.remove(node);
        if let Some(vacant) = self.gang_vacant.get_mut(slot as usize) {
            *vacant = true;
        }
        let category = sim.fault.as_ref().map_or(usize::MAX, |f| f.category);
        self.close_span(node);
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

    /// A replacement node joins its slot (itself, at times, a silent failure of the repair).
    pub(super) fn joined(&mut self, node: &str, slot: u32, category: usize) {
        let interval = self.config.repairer.engine.report_interval.as_millis().max(1) as u64;
        let silent_rate = self.config.failures.silent_repair_rate;
        let draw = self.rng.f64();
        let mut sim = SimNode::new(slot, super::heartbeat_phase(slot, interval));
        if self.config.noise.enabled {
            sim.noise = Some(crate::noise::NodeNoise::new(self.now(), sim.phase_ms, interval));
        }
        self.nodes.insert(node.to_owned(), sim);
        if let Some(name) = self.slots.get_mut(slot as usize) {
            *name = node.to_owned();
        }
        if let Some(gang) = &self.gang {
            gang.lock().join(slot, node);
        }
        if let Some(vacant) = self.gang_vacant.get_mut(slot as usize) {
            *vacant = false;
        }
        self.report(node, ReportTrigger::Startup);
        if draw < silent_rate && category < self.catalog.categories.len() {
            self.relapse(node, category);
        }
    }
}
