//! What one simulation found: per job ETTR and where the lost time went, the repairs and guard
//! rails, and the closed-form model's figure for the same setting. Serialized as `--json`
//! (deterministic: the same seed gives the same bytes) and rendered as a text summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// One simulation's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    pub setting: Setting,
    /// Mean ETTR over the jobs.
    pub ettr: f64,
    pub jobs: Vec<JobResult>,
    /// Kokolis et al.'s closed form for the same fleet, rate, restart and interval.
    pub model_ettr: f64,
    pub failures: FailureFigures,
    pub repairs: RepairFigures,
    /// Nodes out of service at once, and the hot spares that would have covered them.
    pub spares: crate::spares::SpareFigures,
    /// Mean time between interruptions of the job(s), hours.
    pub mtbi_hours: Option<f64>,
    /// Discrete events the simulation processed (reports, commands, faults, clock jumps).
    pub sim_events: u64,
    /// The repairer's actions on healthy nodes under benign noise (`--noise`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise: Option<crate::noise::NoiseFigures>,
}

/// The setting simulated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub days: f64,
    pub spares: u32,
    pub seed: u64,
    pub jobs: u32,
    pub checkpoint_every: String,
    pub checkpoint_write_seconds: f64,
    pub restart_seconds: f64,
    pub failures_per_node_day: f64,
    pub catalog: String,
}

/// One job's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobResult {
    pub id: String,
    pub nodes: u32,
    /// Productive time (new training) / wall time.
    pub ettr: f64,
    pub wall_hours: f64,
    pub productive_hours: f64,
    /// Lost time by cause, hours.
    pub lost_hours: LostTime,
    pub interruptions: u32,
    /// Restarts the queue made.
    pub restarts: u32,
    pub checkpoints: u64,
    /// Checkpoints the job wrote at a SIGUSR1: the repairer's request before it requeues the job
    /// off a drained node, and the queue's before it stops the job.
    pub checkpointed_at_signal: u32,
    /// Checkpoint interval the job ended with, seconds (auto: the queue's Young/Daly).
    pub checkpoint_interval_seconds: f64,
}

/// Where the time that was not new training went, hours.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LostTime {
    /// From the fault until the queue began stopping the job.
    pub detection: f64,
    /// The stop sequence: the checkpoint at the signal, SIGTERM, the ranks' exit.
    pub drain_and_checkpoint: f64,
    /// Training again over steps done before the last checkpoint was lost.
    pub rollback: f64,
    /// From launch to the first step: rank start, rendezvous, loading the checkpoint.
    pub restart: f64,
    /// Queued for nodes.
    pub waiting_for_nodes: f64,
    /// Queued while a guard rail held a node back (the breaker open or repairs at their limit).
    pub held_by_guard_rail: f64,
    /// Writing periodic checkpoints.
    pub checkpoint_writes: f64,
}

impl LostTime {
    pub fn total(&self) -> f64 {
        self.detection
            + self.drain_and_checkpoint
            + self.rollback
            + self.restart
            + self.waiting_for_nodes
            + self.held_by_guard_rail
            + self.checkpoint_writes
    }
}

/// The failures that struck.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FailureFigures {
    /// Node failures (a correlated event counts each node).
    pub node_failures: u32,
    pub by_category: BTreeMap<String, u32>,
    pub correlated_events: u32,
    pub lemon_nodes: u32,
    /// Repairs that reported success without fixing the node.
    pub silent_repair_failures: u32,
}

/// What the repairer did, read from its event log.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RepairFigures {
    /// Workflows by action and outcome.
    pub workflows: BTreeMap<String, BTreeMap<String, u32>>,
    pub decisions: BTreeMap<String, u32>,
    pub actions_held: u32,
    pub breaker_openings: u32,
    pub quarantined: u32,
    pub quarantined_lemons: u32,
    pub replacements: u32,
    /// Times a spare (a node outside the job) took a failed node's place.
    pub spares_used: u32,
    pub reboots: u32,
}

impl Setting {
    /// The setting's two summary lines (fleet, then job(s) and failures), the fleet's ending with
    /// `seeds` (`seed 7`, or the seeds of several runs).
    pub fn summary(&self, seeds: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "fleet: {} nodes x {} GPUs ({} GPUs), {} spare(s), {:.1} days, {seeds}",
            self.nodes,
            self.gpus_per_node,
            u64::from(self.nodes) * u64::from(self.gpus_per_node),
            self.spares,
            self.days,
        );
        let _ = writeln!(
            out,
            "job(s): {}, checkpoint every {}, write {:.0} s, restart {:.0} s; failures {:.4} per node-day ({})",
            self.jobs,
            self.checkpoint_every,
            self.checkpoint_write_seconds,
            self.restart_seconds,
            self.failures_per_node_day,
            self.catalog
        );
        out
    }
}

impl SimReport {
    /// The text summary.
    pub fn summary(&self) -> String {
        let mut out = self.setting.summary(&format!("seed {}", self.setting.seed));
        let _ = writeln!(
            out,
            "ETTR {:.3} (closed-form model {:.3}); MTBI {}",
            self.ettr,
            self.model_ettr,
            self.mtbi_hours.map_or("-".to_owned(), |h| format!("{h:.2} h"))
        );
        for job in &self.jobs {
            let l = &job.lost_hours;
            let _ = writeln!(
                out,
                "  {} on {} nodes: ETTR {:.3}, {:.0} h productive of {:.0} h; {} interruption(s), {} restart(s), {} checkpoint(s) ({} at the signal), interval {:.0} s",
                job.id,
                job.nodes,
                job.ettr,
                job.productive_hours,
                job.wall_hours,
                job.interruptions,
                job.restarts,
                job.checkpoints,
                job.checkpointed_at_signal,
                job.checkpoint_interval_seconds
            );
            let _ = writeln!(
                out,
                "    lost (h): detection {:.1}, drain+checkpoint {:.1}, rollback {:.1}, restart {:.1}, waiting for nodes {:.1}, held by guard rail {:.1}, checkpoint writes {:.1}",
                l.detection,
                l.drain_and_checkpoint,
                l.rollback,
                l.restart,
                l.waiting_for_nodes,
                l.held_by_guard_rail,
                l.checkpoint_writes
            );
        }
        let f = &self.failures;
        let _ = writeln!(
            out,
            "failures: {} node failure(s), {} correlated event(s), {} lemon node(s), {} silent repair failure(s)",
            f.node_failures, f.correlated_events, f.lemon_nodes, f.silent_repair_failures
        );
        let categories: Vec<String> =
            f.by_category.iter().map(|(name, n)| format!("{name} {n}")).collect();
        let _ = writeln!(out, "  by category: {}", categories.join(", "));
        let r = &self.repairs;
        let _ = writeln!(
            out,
            "repairs: {} reboot(s), {} replacement(s), {} spare(s) used, {} action(s) held, {} breaker opening(s), {} quarantined ({} lemons)",
            r.reboots,
            r.replacements,
            r.spares_used,
            r.actions_held,
            r.breaker_openings,
            r.quarantined,
            r.quarantined_lemons
        );
        for (action, outcomes) in &r.workflows {
            let parts: Vec<String> = outcomes.iter().map(|(o, n)| format!("{o} {n}")).collect();
            let _ = writeln!(out, "  {action}: {}", parts.join(", "));
        }
        let sp = &self.spares;
        let _ = writeln!(
            out,
            "spares: {} recommended ({} held); nodes out of service at once: mean {:.2}, 99 % of the time at most {}, at most {}",
            sp.recommended, self.setting.spares, sp.out_mean, sp.out_p99, sp.out_max
        );
        if let Some(noise) = &self.noise {
            out.push_str(&noise.summary());
        }
        out
    }
}
