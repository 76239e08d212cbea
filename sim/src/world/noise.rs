//! Benign noise on the simulated nodes (`crate::noise`): the kernel lines, checks' findings,
//! planned reboots, agent restarts and the rolling driver upgrade carried out, and the agents'
//! reports of what their rules make of them.

use fleetmend_proto::ReportTrigger;
use fleetmend_repairer::model::NodeState;

use super::{Happening, World};
use crate::noise::{self, Lines, NodeNoise, NoiseKind};

/// How long after a rule-matching line the agent looks again: the built-in rules' windows (15
/// minutes, 1, 6 and 24 hours), each a second later, when what they matched clears.
const LOOKS_AFTER_MS: [u64; 4] = [901_000, 3_601_000, 21_601_000, 86_401_000];

/// How long a planned reboot keeps the node down, and how long after it is back a person puts
/// it back to work.
const PLANNED_DOWN_MS: u64 = 5 * 60_000;
const UNDRAIN_AFTER_MS: u64 = 5 * 60_000;
/// How often a person looks whether a node drained for maintenance is drained yet, and for how
/// long before giving up on it.
const DRAIN_POLL_MS: u64 = 60_000;
const DRAIN_GIVE_UP_MS: u64 = 12 * 3_600_000;

const OLD_DRIVER: &str = "550.90.07";
const NEW_DRIVER: &str = "550.127.05";

/// A piece of noise in the world's agenda.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Noise {
    /// A kind of noise strikes the node in `slot` (then the next one of the kind is drawn,
    /// unless this is a repeat).
    Strike { slot: u32, kind: NoiseKind, repeat: bool },
    /// The kernel of `node` logs a line (in boot `boot`).
    Line { node: String, boot: u32, level: u8, text: String },
    /// The agent of `node` looks again: a report if what it sees changed.
    Look { node: String },
    /// The nic check of `node` sees `iface` down in its run now; its result stands until its
    /// next run.
    LinkSeenDown { node: String, boot: u32, iface: String },
    /// A step of a person's planned reboot of `node` (started at `since_ms`).
    Maintenance { node: String, boot: u32, step: Step, since_ms: u64, upgrade: bool },
    /// A batch of the rolling driver upgrade.
    Upgrade { batch: u32 },
}

/// The steps of a planned reboot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// Waiting for the drain a person asked for.
    Drained,
    /// The node boots again.
    Boot,
    /// A person puts it back.
    Undrain,
}

/// Noise counts of a run.
#[derive(Debug, Default)]
pub struct NoiseTally {
    pub injected: std::collections::BTreeMap<String, u64>,
}

impl World {
    /// Draws the first of every kind of noise on every slot, and plans the driver upgrade.
    pub fn start_noise(&mut self) {
        let config = self.config.noise.clone();
        if !config.enabled {
            return;
        }
        let now = self.now();
        let interval = self.config.repairer.engine.report_interval.as_millis() as u64;
        for sim in self.nodes.values_mut() {
            sim.noise = Some(NodeNoise::new(now, sim.phase_ms, interval));
        }
        for slot in 0..self.config.fleet.nodes {
            for (kind, _) in config.rates() {
                self.next_noise(slot, kind, now);
            }
        }
        if let Some(at) = config.driver_upgrade_at {
            self.schedule(
                now + at.as_millis() as u64,
                Happening::Noise(Noise::Upgrade { batch: 0 }),
            );
        }
    }

    /// Draws when the next noise of `kind` strikes `slot` after `from`.
    fn next_noise(&mut self, slot: u32, kind: NoiseKind, from: u64) {
        let rate = self.config.noise.rates().iter().find(|(k, _)| *k == kind).map_or(0.0, |r| r.1);
        if rate <= 0.0 {
            return;
        }
        let mean_ms = 86_400_000.0 / rate;
        let after = (-(1.0 - self.noise_rng.f64()).ln() * mean_ms) as u64;
        let what = Noise::Strike { slot, kind, repeat: false };
        self.schedule(from + after.max(1), Happening::Noise(what));
    }

    pub(super) fn noise(&mut self, what: Noise) {
        match what {
            Noise::Strike { slot, kind, repeat } => {
                let now = self.now();
                if !repeat {
                    self.next_noise(slot, kind, now);
                }
                let Some(node) = self.slots.get(slot as usize).cloned() else { return };
                if self.nodes.get(&node).is_some_and(|n| n.up && !n.retired && n.noise.is_some()) {
                    *self.noise_tally.injected.entry(kind.as_str().to_owned()).or_default() += 1;
                    self.strike_noise(&node, slot, kind, repeat);
                }
            }
            Noise::Line { node, boot, level, text } => {
                if self.nodes.get(&node).is_some_and(|n| n.boot == boot && n.up) {
                    self.log_lines(&node, &[(level, text)]);
                }
            }
            Noise::Look { node } => self.look(&node),
            Noise::LinkSeenDown { node, boot, iface } => {
                let now = self.now();
                let Some(sim) = self.nodes.get_mut(&node).filter(|n| n.boot == boot) else {
                    return;
                };
                let Some(noise) = sim.noise.as_mut() else { return };
                noise.show_once(noise::nic_down(&iface), now);
                let until = noise.next_run(now);
                self.look(&node);
                self.look_at(&node, until + 1);
            }
            Noise::Maintenance { node, boot, step, since_ms, upgrade } => {
                self.maintenance(&node, boot, step, since_ms, upgrade);
            }
            Noise::Upgrade { batch } => self.upgrade(batch),
        }
    }

    fn strike_noise(&mut self, node: &str, slot: u32, kind: NoiseKind, repeat: bool) {
        let now = self.now();
        match kind {
            NoiseKind::AppXid => {
                let crash = Lines { rng: &mut self.noise_rng }.app_crash();
                // One crash in three comes back after the job's restart, once or twice.
                let again = self.noise_rng.u8(..6);
                self.log_lines(node, &crash);
                if again < 2 && !repeat {
                    for i in 0..=u64::from(again) {
                        let at = now + (i + 1) * self.noise_rng.u64(300_000..1_200_000);
                        let what = Noise::Strike { slot, kind, repeat: true };
                        self.schedule(at, Happening::Noise(what));
                    }
                }
            }
            NoiseKind::OomKill => {
                let found = Lines { rng: &mut self.noise_rng }.oom_kill();
                self.log_lines(node, &found);
            }
            NoiseKind::Segfault => {
                let found = Lines { rng: &mut self.noise_rng }.segfault();
                self.log_lines(node, &found);
            }
            NoiseKind::EdacCorrected => {
                let found = Lines { rng: &mut self.noise_rng }.edac_corrected();
                let burst = self.noise_rng.u8(..20) == 0;
                if burst && let Some(noise) = self.node_noise(node) {
                    noise.show(noise::edac_burst(), now + 3_600_000);
                }
                self.log_lines(node, &found);
                if burst {
                    self.look_at(node, now + 3_600_001);
                }
            }
            NoiseKind::LinkFlap => self.link_flap(node, now),
            NoiseKind::PlannedReboot => self.plan_reboot(node, false),
            NoiseKind::AgentRestart => {
                let boot_id_same = self.node_noise(node).map(|n| n.restart_agent(now)).is_some();
                if boot_id_same {
                    self.report(node, ReportTrigger::Startup);
                    self.echo_noise(node);
                }
            }
            NoiseKind::DriverUpgrade => self.plan_reboot(node, true),
        }
    }

    /// A link goes down and comes back within 1 to 10 s. When the nic check runs within the
    /// flap, its result says the link is down until its next run.
    fn link_flap(&mut self, node: &str, now: u64) {
        let (iface, down, up) = Lines { rng: &mut self.noise_rng }.link_flap();
        let flap_ms = self.noise_rng.u64(1_000..10_000);
        let Some(boot) = self.nodes.get(node).map(|n| n.boot) else { return };
        let run = self.node_noise(node).map(|n| n.next_run(now));
        self.log_lines(node, &[(6, down)]);
        let what = Noise::Line { node: node.to_owned(), boot, level: 6, text: up };
        self.schedule(now + flap_ms, Happening::Noise(what));
        if let Some(run) = run.filter(|run| *run < now + flap_ms) {
            let what = Noise::LinkSeenDown { node: node.to_owned(), boot, iface };
            self.schedule(run, Happening::Noise(what));
        }
    }

    /// The kernel logs `lines` now; the agent reports what its rules made of them.
    fn log_lines(&mut self, node: &str, lines: &[(u8, String)]) {
        let now = self.now();
        let Some(noise) = self.node_noise(node) else { return };
        let mut matched = false;
        for (level, text) in lines {
            matched |= noise.log(*level, text, now);
        }
        if matched {
            for after in LOOKS_AFTER_MS {
                self.look_at(node, now + after);
            }
        }
        self.look(node);
    }

    fn look_at(&mut self, node: &str, at: u64) {
        self.schedule(at, Happening::Noise(Noise::Look { node: node.to_owned() }));
    }

    /// The agent looks: a report when what it sees of the noise changed, repeated while a
    /// finding is active (the policy counts observations).
    fn look(&mut self, node: &str) {
        let now = self.now();
        let Some(sim) = self.nodes.get_mut(node).filter(|n| n.up && !n.retired) else { return };
        let Some(noise) = sim.noise.as_mut() else { return };
        let findings = noise.findings(now);
        if noise.changed(&findings) {
            self.report(node, ReportTrigger::Event);
            self.echo_noise(node);
        }
    }

    pub(super) fn node_noise(&mut self, node: &str) -> Option<&mut NodeNoise> {
        self.nodes.get_mut(node).and_then(|n| n.noise.as_mut())
    }

    /// The node is up again after a boot (a repair's, a person's, a planned one): the repairer
    /// hears from it, its agent's first report goes with what the fresh boot shows.
    pub(super) fn booted(&mut self, node: &str) {
        if let Some(sim) = self.nodes.get_mut(node) {
            sim.up = true;
        }
        self.presence.came_up(node);
        self.noise_booted(node);
        self.report(node, ReportTrigger::Startup);
        self.echo_noise(node);
    }

    /// The node booted: a new log with the boot's lines (on the driver it has now), and the links
    /// of a fresh boot still coming up.
    fn noise_booted(&mut self, node: &str) {
        let now = self.now();
        let driver = self.driver_of(node);
        let Some(sim) = self.nodes.get_mut(node) else { return };
        let boot = sim.boot;
        let Some(noise) = sim.noise.as_mut() else { return };
        noise.boot(now);
        let mut clear_at = Vec::new();
        for (finding, after) in noise::boot_transients() {
            noise.show(finding, now + after);
            clear_at.push(now + after + 1);
        }
        for at in clear_at {
            self.look_at(node, at);
        }
        for (after, level, text) in (Lines { rng: &mut self.noise_rng }).boot(driver) {
            let what = Noise::Line { node: node.to_owned(), boot, level, text };
            self.schedule(now + after, Happening::Noise(what));
        }
    }

    /// The driver a node boots on now.
    fn driver_of(&self, node: &str) -> &'static str {
        if self.upgraded.contains(node) { NEW_DRIVER } else { OLD_DRIVER }
    }

    /// A person drains `node` through fleetmend to reboot it; nothing when it is in a workflow.
    fn plan_reboot(&mut self, node: &str, upgrade: bool) {
        let now = self.now();
        let Some(boot) = self.nodes.get(node).filter(|n| n.up && !n.retired).map(|n| n.boot) else {
            return;
        };
        if let Err(err) = self.engine.drain(node, "maintenance") {
            tracing::debug!(node, error = %err, "a planned reboot waits for another day");
            return;
        }
        let step = Step::Drained;
        let what = Noise::Maintenance { node: node.to_owned(), boot, step, since_ms: now, upgrade };
        self.schedule(now + DRAIN_POLL_MS, Happening::Noise(what));
    }

    fn maintenance(&mut self, node: &str, boot: u32, step: Step, since_ms: u64, upgrade: bool) {
        let now = self.now();
        if !self.nodes.get(node).is_some_and(|n| n.boot == boot && !n.retired) {
            return;
        }
        let next =
            |step| Noise::Maintenance { node: node.to_owned(), boot, step, since_ms, upgrade };
        match step {
            Step::Drained => {
                let state = self.engine.node(node).map(|r| r.state);
                if state == Some(NodeState::Drained) {
                    self.kill_ranks(node, now, false);
                    self.go_down(node, now);
                    let boot = self.nodes.get_mut(node).map(|n| {
                        n.boot += 1;
                        n.boot
                    });
                    let Some(boot) = boot else { return };
                    let what = Noise::Maintenance {
                        node: node.to_owned(),
                        boot,
                        step: Step::Boot,
                        since_ms,
                        upgrade,
                    };
                    self.schedule(now + PLANNED_DOWN_MS, Happening::Noise(what));
                } else if state == Some(NodeState::Draining) && now < since_ms + DRAIN_GIVE_UP_MS {
                    self.schedule(now + DRAIN_POLL_MS, Happening::Noise(next(Step::Drained)));
                }
            }
            Step::Boot => {
                if upgrade {
                    self.upgraded.insert(node.to_owned());
                }
                self.booted(node);
                self.echo_fault(node);
                self.schedule(now + UNDRAIN_AFTER_MS, Happening::Noise(next(Step::Undrain)));
            }
            Step::Undrain => {
                let engine = self.engine.clone();
                let node = node.to_owned();
                tokio::spawn(async move {
                    if let Err(err) = engine.undrain(&node, "maintenance").await {
                        tracing::debug!(node, error = %err, "putting a node back after maintenance");
                    }
                });
            }
        }
    }

    /// A batch of the rolling driver upgrade: its slots drained, rebooted on the new driver and
    /// put back; the next batch an hour later.
    fn upgrade(&mut self, batch: u32) {
        let now = self.now();
        let nodes = self.config.fleet.nodes;
        let size = ((f64::from(nodes) * self.config.noise.upgrade_batch).ceil() as u32).max(1);
        let first = batch.saturating_mul(size);
        if first >= nodes {
            return;
        }
        for slot in first..(first + size).min(nodes) {
            if let Some(node) = self.slots.get(slot as usize).cloned() {
                *self
                    .noise_tally
                    .injected
                    .entry(NoiseKind::DriverUpgrade.as_str().to_owned())
                    .or_default() += 1;
                self.plan_reboot(&node, true);
            }
        }
        self.schedule(now + 3_600_000, Happening::Noise(Noise::Upgrade { batch: batch + 1 }));
    }
}
