//! Time-based work: start timeouts, lost nodes, placement of waiting jobs, launching their ranks
//! and saving progress.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use fleetmend_proto::jobs::{PROGRESS_TOKEN_VAR, PROGRESS_URL_VAR, command_with_args};
use fleetmend_proto::{NodeCommand, RankKey, RunRank, command_kind};
use fleetmend_runtime::checkpoint::ProtocolEnv;

use super::health::{self, HangRule, LossVerdict, StragglerRule};
use super::placement::{self, Candidate, Placement, Waiting};
use super::{
    AttemptRecord, Job, JobQueue, JobState, QueueState, RankRecord, StopCause, StopPhase, Unusable,
    reindex, restarting, set_state,
};
use crate::clock::{Earliest, Next};
use crate::model::{EventKind, NodeState, Severity};
use crate::ports::JobFinding;
use crate::scheduler::is_spare;

/// How long placement that found no room waits before trying again with an unchanged fleet (a
/// node whose silence ended without a change of state is eligible again).
pub(super) const PLACEMENT_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// How often the tick saves a job whose progress figures or ranks keep changing. The first
/// change after a quiet spell is saved at the next tick; the rest of a burst (the 2,000 ranks of a
/// restart reporting over one report interval) at most this often: each save writes every rank.
/// A restarted repairer loses at most this much of the progress figures (the ranks' states come
/// back with the agents' reports).
pub(super) const DIRTY_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a straggler finding stays after its job stopped (see `flag_stragglers`).
pub(super) const STRAGGLER_HOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// Attempts whose node lists a job's history keeps (the newest).
const ATTEMPTS_WITH_NODES: usize = 16;

/// What the index of assigned nodes is built from: each active job's attempt and ranks. The
/// index is rebuilt only when this changed.
fn shape(state: &QueueState) -> Vec<(u64, u32, usize)> {
    state
        .jobs
        .values()
        .filter(|j| j.state.is_active())
        .map(|j| (j.seq, j.attempt, j.ranks.len()))
        .collect()
}

/// A waiting job's reason without the nodes that are out (which the wait alert adds).
fn waiting_reason(reason: &str) -> &str {
    reason.split("; out: ").next().unwrap_or(reason)
}

impl JobQueue {
    /// Time-based work: start timeouts, lost nodes, the stop sequence, placement, saving progress.
    /// Returns when it may next find work with time alone.
    pub fn tick(&self, now: u64) -> Next {
        // What needs the pass over the fleet: a node that changed state (a rank's node may have
        // become unusable) or a job waiting for nodes. With neither, and nothing starting,
        // stopping or with changed ranks, the tick only saves progress figures (one tick a second
        // for 54 simulated days of a 2,048-node job).
        let generation = self.fleet.generation();
        let healthy = self.fleet.healthy();
        let (fleet_changed, smallest, alert_due) = {
            let mut state = self.lock();
            let fleet_changed = state.fleet_generation != Some(generation);
            // A queued job for which there was no room waits for the fleet to change.
            let retry = state.placement_blocked.is_none_or(|(blocked_generation, at)| {
                blocked_generation != generation
                    || now.saturating_sub(at) >= PLACEMENT_RETRY.as_millis() as u64
            });
            let settled = |j: &Job| {
                j.state == JobState::Running
                    || j.state.is_final()
                    || (j.state == JobState::Queued && !retry)
            };
            self.stop_hung(&mut state, now);
            self.stop_bad_loss(&mut state, now);
            self.flag_stragglers(&mut state, now);
            let alert_due = self.wait_alert_due(&state, now);
            let quiet = !fleet_changed
                && !alert_due
                && state.moved.is_empty()
                && state.stale_kills.is_empty()
                && state.jobs.values().all(settled);
            if quiet {
                self.save_dirty(&mut state, now);
                return Earliest::after(now).with(self.next_due(&state, now)).next();
            }
            state.fleet_generation = Some(generation);
            state.moved.clear();
            // Only a queued job can be placed (one still stopping cannot start yet, and holds
            // the jobs behind it).
            let smallest = state
                .jobs
                .values()
                .filter(|j| j.state == JobState::Queued)
                .map(|j| u64::from(j.spec.nodes))
                .min()
                .filter(|_| retry);
            (fleet_changed, smallest, alert_due)
        };
        // The engine's lock is taken before the queue's, never inside it. A running job's rank
        // is lost only on a node that is not healthy: those few are read, not the whole fleet.
        let not_healthy = if fleet_changed || smallest.is_some() || alert_due {
            self.fleet.not_healthy()
        } else {
            BTreeMap::new()
        };
        let waiting = smallest.is_some_and(|nodes| {
            self.room_to_place(nodes, healthy, &not_healthy, (generation, now))
        });
        let health: BTreeMap<String, (NodeState, u64)> = if waiting {
            self.fleet
                .node_health()
                .into_iter()
                .map(|n| (n.name, (n.state, n.last_report_ms)))
                .collect()
        } else {
            BTreeMap::new()
        };
        let mut state = self.lock();
        // A rank is lost on a node that can no longer run it. A drained or draining node still
        // can: the repair workflow checkpoints and requeues its jobs, the one owner of stopping a
        // job for a drain.
        let unusable = |node: &str| -> Option<String> {
            match not_healthy.get(node)? {
                state @ (NodeState::Unreachable
                | NodeState::Repairing
                | NodeState::Validating
                | NodeState::Quarantined
                | NodeState::Retired) => Some(format!("its node is {state}")),
                NodeState::Healthy
                | NodeState::Suspect
                | NodeState::Draining
                | NodeState::Drained => None,
            }
        };
        // Nodes turn unusable only with a change of state.
        let unusable: Option<&Unusable<'_>> = if fleet_changed { Some(&unusable) } else { None };
        let shape = shape(&state);
        let active: Vec<String> =
            state.jobs.values().filter(|j| j.state.is_active()).map(|j| j.id.clone()).collect();
        for id in &active {
            if let Some(job) = state.jobs.get_mut(id) {
                self.advance(job, now, unusable);
            }
        }
        if shape != self::shape(&state) {
            reindex(&mut state);
            // A job ended or was requeued: its nodes may be free for a queued job (placed at the
            // next tick, which reads the fleet first).
            state.placement_blocked = None;
        }
        if waiting {
            let shape = self::shape(&state);
            self.place_waiting(&mut state, &health, now);
            let still_queued = state.jobs.values().any(|j| j.state == JobState::Queued);
            state.placement_blocked = still_queued.then_some((generation, now));
            if shape != self::shape(&state) {
                reindex(&mut state);
            }
        }
        if alert_due || fleet_changed {
            self.alert_waits(&mut state, &not_healthy, now);
        }
        self.save_dirty(&mut state, now);
        let grace = self.config.stop_grace.as_millis() as u64 * 4;
        state.stale_kills.retain(|_, sent| now.saturating_sub(*sent) < grace);
        Earliest::after(now).with(self.next_due(&state, now)).next()
    }

    /// Whether a queued job of `nodes` nodes may fit. Placement reads the whole fleet, so it is
    /// tried only when there may be room: at most the healthy nodes that no starting or running
    /// job holds are free (a job of 2,000 nodes waiting two days for a replacement would
    /// otherwise read 100,000 nodes at every change). Without room the queued jobs say why and
    /// wait for the fleet to change.
    fn room_to_place(
        &self,
        nodes: u64,
        healthy: u64,
        not_healthy: &BTreeMap<String, NodeState>,
        (generation, now): (u64, u64),
    ) -> bool {
        let mut state = self.lock();
        // A stopping job frees its nodes rank by rank: no bound without reading them.
        if state.jobs.values().any(|j| j.state == JobState::Stopping) {
            return true;
        }
        let held_not_healthy =
            not_healthy.keys().filter(|n| state.assigned.contains_key(*n)).count();
        let held_healthy = state.assigned.len().saturating_sub(held_not_healthy) as u64;
        let free = healthy.saturating_sub(held_healthy);
        if nodes <= free {
            return true;
        }
        let QueueState { jobs, dirty, .. } = &mut *state;
        for job in jobs.values_mut().filter(|j| j.state == JobState::Queued) {
            // Placement's own words: `free` counts the healthy nodes no job holds, which is
            // what placement finds unless some of them are drained or silent.
            let why = format!("waits for {} eligible node(s): {free} free", job.spec.nodes);
            if waiting_reason(&job.reason) != why {
                job.reason = why;
                dirty.insert(job.id.clone());
            }
        }
        state.placement_blocked = Some((generation, now));
        false
    }

    /// Saves the jobs whose progress figures or ranks changed since they were last saved, each at
    /// most once every `DIRTY_SAVE_EVERY`.
    fn save_dirty(&self, state: &mut QueueState, now: u64) {
        let every = DIRTY_SAVE_EVERY.as_millis() as u64;
        let QueueState { jobs, dirty, dirty_saved_ms, .. } = state;
        dirty_saved_ms.retain(|_, at| now.saturating_sub(*at) < every);
        dirty.retain(|id| {
            if dirty_saved_ms.contains_key(id) {
                return true;
            }
            if let Some(job) = jobs.get(id) {
                self.save(job);
                dirty_saved_ms.insert(id.clone(), now);
            }
            false
        });
    }

    fn place_waiting(
        &self,
        state: &mut QueueState,
        health: &BTreeMap<String, (NodeState, u64)>,
        now: u64,
    ) {
        let waiting: Vec<Waiting<'_>> = state
            .jobs
            .values()
            .filter(|j| j.state == JobState::Queued || restarting(j))
            .map(|j| Waiting {
                id: &j.id,
                nodes: j.spec.nodes,
                priority: j.spec.priority,
                requeued: j.restarts > 0,
                seq: j.seq,
                previous_port: j.master_port,
                stopping: restarting(j),
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        let mut busy: BTreeSet<&str> = BTreeSet::new();
        let mut ports: BTreeSet<u16> = BTreeSet::new();
        for job in state.jobs.values().filter(|j| j.state.is_active()) {
            // A starting or running job holds its whole allocation until it ends, as a gang
            // does: a rank that finished early keeps its node (the job may yet restart on it).
            // A stopping one frees each node as its rank goes, so a lost rank on a dead node
            // does not hold the queue.
            let holds = |r: &&RankRecord| job.state != JobState::Stopping || r.live();
            busy.extend(job.ranks.iter().filter(holds).map(|r| r.node.as_str()));
            ports.extend(job.master_port);
        }
        for (name, seen) in &state.nodes {
            if !seen.live.is_empty() {
                busy.insert(name);
            }
        }
        let candidates: Vec<Candidate<'_>> = health
            .iter()
            .map(|(name, (node_state, last_report_ms))| Candidate {
                name,
                state: *node_state,
                last_report_ms: *last_report_ms,
                address: state.nodes.get(name).and_then(|n| n.address.as_deref()),
                drained: state.drained.contains_key(name),
                spare: state.drained.get(name).is_some_and(|d| is_spare(&d.reason)),
                busy: busy.contains(name.as_str()),
            })
            .collect();
        let (placements, blocked) = placement::place(
            &waiting,
            &candidates,
            &ports,
            self.config.master_port_min..=self.config.master_port_max,
            now,
            self.unreachable_window_ms,
        );
        for placement in placements {
            if !placement.spares.is_empty() && !self.take_spares(state, &placement) {
                continue;
            }
            if let Some(job) = state.jobs.get_mut(&placement.job) {
                self.launch(job, placement, now);
            }
        }
        if let Some(blocked) = blocked
            && let Some(job) = state.jobs.get_mut(&blocked.job)
            && waiting_reason(&job.reason) != blocked.why
        {
            job.reason = blocked.why;
            self.save(job);
        }
    }

    /// Stops every running job that is hung ([`health::hang`]): a `job-hung` warning naming the
    /// ranks that did not arrive, then SIGTERM and SIGKILL (a hung collective cannot write a
    /// checkpoint, so none is asked for) and a restart from the newest checkpoint.
    fn stop_hung(&self, state: &mut QueueState, now: u64) {
        let rule = HangRule { factor: self.config.hang_factor, floor: self.config.hang_floor };
        if rule.floor.is_zero() {
            return;
        }
        let window = self.config.hang_window.as_millis() as u64;
        let QueueState { jobs, hang_named, hang_repeated, .. } = state;
        for job in jobs.values_mut().filter(|j| j.state == JobState::Running) {
            let Some(hang) = health::hang(job, &rule, now) else { continue };
            let why = hang.reason(job);
            job.health.hangs += 1;
            job.goodput.hung_ms += hang.stalled_ms;
            let named: Vec<String> = hang
                .ranks
                .iter()
                .filter_map(|r| job.ranks.get(*r as usize).map(|record| record.node.clone()))
                .collect();
            let node = named.first().cloned();
            self.event(
                EventKind::JobHung,
                Severity::Warning,
                node.as_deref(),
                self.about(job, &why),
            );
            self.begin_stop_at(job, StopCause::Restart, StopPhase::Term, &why, now);
            for node in named {
                let times = hang_named.entry(node.clone()).or_default();
                times.push(now);
                if times.len() >= 2 && hang_repeated.insert(node.clone()) {
                    let finding =
                        hang_repeated_finding(&job.id, times.len(), self.config.hang_window);
                    self.send_finding(JobFinding { node, finding, firing: true });
                }
            }
        }
        // Hangs older than the window are forgotten; a node under two clears its finding.
        hang_named.retain(|_, times| {
            times.retain(|at| now.saturating_sub(*at) < window);
            !times.is_empty()
        });
        let cleared: Vec<String> = hang_repeated
            .iter()
            .filter(|node| hang_named.get(*node).is_none_or(|times| times.len() < 2))
            .cloned()
            .collect();
        for node in cleared {
            hang_repeated.remove(&node);
            let mut finding = hang_repeated_finding("", 0, self.config.hang_window);
            finding.status = fleetmend_proto::Status::Ok;
            finding.action = fleetmend_proto::RecommendedAction::None;
            self.send_finding(JobFinding { node, finding, firing: false });
        }
    }

    /// Stops every running job whose loss went NaN or infinite ([`health::loss_verdict`]): a
    /// `job-loss-not-finite` warning, SIGTERM (no checkpoint is asked for: the state is lost), and
    /// a restart from the newest checkpoint, or, past `nan_restarts`, the job fails.
    fn stop_bad_loss(&self, state: &mut QueueState, now: u64) {
        for job in state.jobs.values_mut().filter(|j| j.state == JobState::Running) {
            let Some(verdict) = health::loss_verdict(job, self.config.nan_restarts) else {
                continue;
            };
            job.health.non_finite_losses += 1;
            let (cause, why) = match verdict {
                LossVerdict::Restart(why) => (StopCause::Restart, why),
                LossVerdict::Fail(why) => (StopCause::Fail, why),
            };
            self.event(EventKind::JobLossNotFinite, Severity::Warning, None, self.about(job, &why));
            self.begin_stop_at(job, cause, StopPhase::Term, &why, now);
        }
    }

    /// Raises a `straggler` finding on the node of every rank persistently slower than its job's
    /// others ([`health::stragglers`]) and clears those that no longer are (or whose job is no
    /// longer running). Drain is advised while a spare or a free node can take its place;
    /// otherwise it is a warning.
    fn flag_stragglers(&self, state: &mut QueueState, now: u64) {
        let rule = StragglerRule {
            ratio: self.config.straggler_ratio,
            window: self.config.straggler_window as usize,
        };
        if rule.ratio <= 0.0 {
            return;
        }
        let mut found: BTreeMap<(String, u32), (String, health::Straggler)> = BTreeMap::new();
        for job in state.jobs.values_mut().filter(|j| j.state == JobState::Running) {
            let stragglers = health::stragglers(job, &rule);
            job.health.straggler_ratio =
                stragglers.iter().map(|s| s.ratio).max_by(|a, b| a.total_cmp(b));
            for straggler in stragglers {
                let Some(record) = job.ranks.get(straggler.rank as usize) else { continue };
                found.insert((job.id.clone(), straggler.rank), (record.node.clone(), straggler));
            }
        }
        if found.is_empty() && state.stragglers.is_empty() {
            return;
        }
        let replaceable = state.drained.values().any(|d| is_spare(&d.reason))
            || self.fleet.healthy() > state.assigned.len() as u64;
        // A rank measured again and no longer slower clears at once. One whose job stopped (the
        // drain the finding asked for) is held for STRAGGLER_HOLD: cleared at once, the drained
        // node would be undrained before the restart and get the rank back instead of the spare.
        let hold = STRAGGLER_HOLD.as_millis() as u64;
        let gone: Vec<(String, u32)> = state
            .stragglers
            .iter()
            .filter(|(k, (_, raised))| {
                let judged = state.jobs.get(&k.0).is_some_and(|j| {
                    j.state == JobState::Running
                        && j.ranks.get(k.1 as usize).is_some_and(|r| {
                            r.step_samples.len() >= rule.window
                                && state.stragglers.get(*k).is_some_and(|(n, _)| *n == r.node)
                        })
                });
                !found.contains_key(*k) && (judged || now.saturating_sub(*raised) >= hold)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            if let Some((node, _)) = state.stragglers.remove(&key) {
                let finding = straggler_finding(&key.0, key.1, None, replaceable);
                self.send_finding(JobFinding { node, finding, firing: false });
            }
        }
        for (key, (node, straggler)) in found {
            if state.stragglers.contains_key(&key) {
                continue;
            }
            let finding = straggler_finding(&key.0, key.1, Some(&straggler), replaceable);
            if let Some(job) = state.jobs.get(&key.0) {
                let why = format!("{} on {node}: {}", finding.subject, finding.message);
                self.event(
                    EventKind::JobStraggler,
                    Severity::Warning,
                    Some(&node),
                    self.about(job, &why),
                );
            }
            self.send_finding(JobFinding { node: node.clone(), finding, firing: true });
            state.stragglers.insert(key, (node, now));
        }
    }

    fn send_finding(&self, finding: JobFinding) {
        let Some(findings) = &self.findings else { return };
        if findings.send(finding).is_err() {
            tracing::warn!("the engine no longer takes the queue's findings");
        }
    }

    /// Whether a queued job has waited for nodes longer than `wait_alert` without its alert.
    fn wait_alert_due(&self, state: &QueueState, now: u64) -> bool {
        state.jobs.values().any(|j| {
            self.waited_past_alert(j, now)
                && state.wait_alerted.get(&j.id) != Some(&j.state_since_ms)
        })
    }

    /// Queued for longer than `wait_alert`.
    fn waited_past_alert(&self, job: &Job, now: u64) -> bool {
        job.state == JobState::Queued
            && now.saturating_sub(job.state_since_ms) >= self.config.wait_alert.as_millis() as u64
    }

    /// A `job-waiting` warning for each job waiting for nodes longer than `wait_alert`: how many
    /// it needs, and which nodes are out and why (once per wait; `fleetmend jobs` shows the
    /// same in the job's reason).
    fn alert_waits(
        &self,
        state: &mut QueueState,
        not_healthy: &BTreeMap<String, NodeState>,
        now: u64,
    ) {
        const NAMED: usize = 8;
        let long_waits: Vec<String> = state
            .jobs
            .values()
            .filter(|j| self.waited_past_alert(j, now))
            .map(|j| j.id.clone())
            .collect();
        if long_waits.is_empty() {
            return;
        }
        let mut out: Vec<String> =
            not_healthy.iter().map(|(node, node_state)| format!("{node} ({node_state})")).collect();
        out.extend(
            state
                .drained
                .iter()
                .filter(|(node, d)| !is_spare(&d.reason) && !not_healthy.contains_key(*node))
                .map(|(node, d)| format!("{node} (drained: {})", d.reason)),
        );
        let more = out.len().saturating_sub(NAMED);
        out.truncate(NAMED);
        let mut out = if out.is_empty() { "none".to_owned() } else { out.join(", ") };
        if more > 0 {
            out.push_str(&format!(" and {more} more"));
        }
        for id in long_waits {
            let Some(job) = state.jobs.get_mut(&id) else { continue };
            let reason = format!("{}; out: {out}", waiting_reason(&job.reason));
            if state.wait_alerted.get(&id) != Some(&job.state_since_ms) {
                let waited = now.saturating_sub(job.state_since_ms) / 1000;
                let waited = humantime::format_duration(std::time::Duration::from_secs(waited));
                let why = format!("waiting {waited} for nodes: {reason}");
                self.event(EventKind::JobWaiting, Severity::Warning, None, self.about(job, &why));
                state.wait_alerted.insert(id, job.state_since_ms);
            }
            if job.reason != reason {
                job.reason = reason;
                self.save(job);
            }
        }
    }

    /// Lifts the spare drains of the hot spares a placement takes, written first: a spare whose
    /// drain could not be lifted stays a spare, and the job waits for the next placement.
    fn take_spares(&self, state: &mut QueueState, placement: &Placement) -> bool {
        let mut drained = state.drained.clone();
        for spare in &placement.spares {
            drained.remove(spare);
        }
        if let Err(err) = self.save_drains(&drained) {
            tracing::error!(job = %placement.job, error = %err, "putting hot spares to work failed");
            return false;
        }
        state.drained = drained;
        if let Some(job) = state.jobs.get(&placement.job) {
            let free = placement.nodes.len() - placement.spares.len();
            for spare in &placement.spares {
                let why = format!(
                    "hot spare {spare} put to work: the job needs {} node(s), {free} free",
                    placement.nodes.len()
                );
                self.event(
                    EventKind::SpareTaken,
                    Severity::Info,
                    Some(spare),
                    self.about(job, &why),
                );
            }
        }
        true
    }

    fn launch(&self, job: &mut Job, placement: Placement, now: u64) {
        job.nodes = placement.nodes;
        job.master_addr = Some(placement.master_addr);
        job.master_port = Some(placement.master_port);
        job.stop = None;
        job.checkpoint_asked = None;
        job.ranks = job
            .nodes
            .iter()
            .enumerate()
            .map(|(rank, node)| RankRecord {
                rank: rank as u32,
                node: node.clone(),
                launched_ms: now,
                status: None,
                progress: None,
                heard_ms: None,
                step_samples: Vec::new(),
                stepped_posts: 0,
            })
            .collect();
        job.health.new_attempt();
        job.history.push(AttemptRecord {
            attempt: job.attempt,
            nodes: job.nodes.clone(),
            started_ms: now,
            ..AttemptRecord::default()
        });
        // The job's document is saved on every change: older attempts keep their times, not
        // their node lists (a 2,000-node job restarted 400 times would carry 800,000 names).
        let older = job.history.len().saturating_sub(ATTEMPTS_WITH_NODES);
        for attempt in &mut job.history[..older] {
            attempt.nodes = Vec::new();
        }
        job.measured.steps_per_second = None;
        let what = format!(
            "started on {} (MASTER_ADDR={} MASTER_PORT={})",
            job.nodes.join(", "),
            job.master_addr.as_deref().unwrap_or(""),
            placement.master_port
        );
        set_state(job, JobState::Starting, &what, now);
        self.event(EventKind::JobStarted, Severity::Info, None, self.about(job, &what));
        for rank in &job.ranks {
            self.commands.push(&rank.node, self.run_rank_command(job, rank));
        }
        self.save(job);
    }

    pub(super) fn run_rank_command(&self, job: &Job, rank: &RankRecord) -> NodeCommand {
        let protocol = ProtocolEnv {
            rank: rank.rank,
            world_size: job.ranks.len() as u32,
            local_rank: 0,
            master_addr: job.master_addr.clone().unwrap_or_else(|| job.nodes[0].clone()),
            master_port: job.master_port.unwrap_or(self.config.master_port_min),
            job_id: job.id.clone(),
            checkpoint_dir: PathBuf::from(&job.spec.checkpoint_dir),
            restart_count: job.attempt,
        };
        let mut env = job.spec.env.clone();
        for (var, value) in protocol.to_env() {
            env.insert(var.to_owned(), value.to_string_lossy().into_owned());
        }
        let base = &self.progress_base;
        env.insert(PROGRESS_URL_VAR.to_owned(), format!("{base}/v1/jobs/{}/progress", job.id));
        let token = super::rank_token(&job.progress_token, job.attempt, rank.rank);
        env.insert(PROGRESS_TOKEN_VAR.to_owned(), token);
        let run = RunRank {
            key: RankKey { job: job.id.clone(), attempt: job.attempt, rank: rank.rank },
            argv: job.spec.argv.clone(),
            env,
            workdir: None,
        };
        command_with_args(
            format!("run-rank-{}-{}-{}", job.id, job.attempt, rank.rank),
            command_kind::RUN_RANK,
            &run,
        )
    }

    /// Moves a job on: failures stop it, all ranks done completes it, the stop sequence goes on.
    /// `unusable` says why a node can no longer run a rank (the tick's view of the nodes).
    pub(super) fn advance(&self, job: &mut Job, now: u64, unusable: Option<&Unusable<'_>>) {
        match job.state {
            JobState::Starting | JobState::Running => {
                let start_timeout = self.config.start_timeout.as_millis() as u64;
                let failure = job
                    .ranks
                    .iter()
                    .find_map(|r| r.failure().map(|why| (r.node.clone(), why)))
                    .or_else(|| {
                        job.ranks
                            .iter()
                            .find(|r| {
                                r.status.is_none()
                                    && now.saturating_sub(r.launched_ms) > start_timeout
                            })
                            .map(|r| {
                                let why = format!(
                                    "rank {} on {} did not start within {}",
                                    r.rank,
                                    r.node,
                                    humantime::format_duration(self.config.start_timeout)
                                );
                                (r.node.clone(), why)
                            })
                    })
                    .or_else(|| {
                        let unusable = unusable?;
                        job.ranks.iter().filter(|r| r.live()).find_map(|r| {
                            let why = unusable(&r.node)?;
                            Some((r.node.clone(), format!("rank {} on {}: {why}", r.rank, r.node)))
                        })
                    });
                if let Some((node, why)) = failure {
                    self.event(
                        EventKind::JobRankFailed,
                        Severity::Warning,
                        Some(&node),
                        self.about(job, &why),
                    );
                    self.begin_stop(job, StopCause::Restart, &why, now);
                    return;
                }
                if !job.ranks.is_empty() && job.ranks.iter().all(RankRecord::succeeded) {
                    self.complete(job, now);
                    return;
                }
                if job.state == JobState::Starting && job.ranks.iter().all(|r| r.status.is_some()) {
                    set_state(job, JobState::Running, "every rank is running", now);
                    self.save(job);
                }
            }
            JobState::Stopping => self.advance_stop(job, now),
            _ => {}
        }
    }
}

/// The `straggler` finding of `rank` of `job` (`straggler` is `None` when it is cleared).
fn straggler_finding(
    job: &str,
    rank: u32,
    straggler: Option<&health::Straggler>,
    replaceable: bool,
) -> fleetmend_proto::Finding {
    use fleetmend_proto::{Finding, RecommendedAction, Status};
    let subject = format!("{job} rank {rank}");
    let Some(straggler) = straggler else {
        return Finding::new("job", "straggler", subject, Status::Ok, RecommendedAction::None, "");
    };
    let (status, action, then) = if replaceable {
        (Status::Fail, RecommendedAction::Drain, "drain: a spare takes its place at the checkpoint")
    } else {
        (Status::Warn, RecommendedAction::None, "no spare or free node to take its place")
    };
    let message = format!(
        "steps {:.2}x slower than the job's other ranks (median {:.3} s of compute); {then}",
        straggler.ratio, straggler.seconds
    );
    let mut finding = Finding::new("job", "straggler", subject, status, action, message);
    finding.value = Some((straggler.ratio * 100.0).round() / 100.0);
    finding.labels.insert("job".to_owned(), job.to_owned());
    finding.labels.insert("rank".to_owned(), rank.to_string());
    finding
}

/// The `hang_repeated` finding of a node named in `count` hangs within `window` (the newest in
/// `job`).
fn hang_repeated_finding(
    job: &str,
    count: usize,
    window: std::time::Duration,
) -> fleetmend_proto::Finding {
    use fleetmend_proto::{Finding, RecommendedAction, Status};
    let message = format!(
        "its rank did not arrive in {count} hangs within {} (the newest of job {job}): drain",
        humantime::format_duration(window)
    );
    let mut finding =
        Finding::new("job", "hang_repeated", "", Status::Fail, RecommendedAction::Drain, message);
    finding.value = Some(count as f64);
    finding
}
