//! The simulated training jobs on the fleet: their ranks started and signalled through the
//! agents, and the jobs' own steps, checkpoints and progress posts to the repairer's queue.

use std::collections::BTreeSet;

use fleetmend_proto::jobs::PROGRESS_TOKEN_VAR;
use fleetmend_proto::{Progress, RankKey, RankSignal, RankState, RankStatus, RunRank, SignalRank};

use super::{Happening, World};
use crate::config::Interval;
use crate::job::Phase;

impl World {
    /// Starts a rank of a job on `node` (one that dies at once if the node's fault kills jobs).
    pub(super) fn run_rank(&mut self, node: &str, run: RunRank) -> bool {
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

    /// A rank started: a new attempt's first ends the last one's interruption, and the last one
    /// to start sets the job restarting.
    fn rank_started(&mut self, node: &str, key: &RankKey, token: &str, doomed: bool) {
        let now = self.now();
        let held = self.held();
        let Some(job) = self.jobs.get_mut(&key.job) else { return };
        if job.attempt.is_none_or(|a| a < key.attempt) {
            // A new attempt: the last one's interruption is over.
            job.accrue(now, held);
            let view = self.queue.as_ref().and_then(|q| q.job(&key.job));
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

    /// Signals a rank: SIGTERM and SIGKILL end it and stop its job, SIGUSR1 asks for a
    /// checkpoint. True when the rank ended (its agent reports that).
    pub(super) fn signal_rank(&mut self, node: &str, signal: &SignalRank) -> bool {
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
        let requested = match &self.queue {
            Some(queue) if first => queue.stop_requested_ms(&key.job),
            _ => None,
        };
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

    /// Schedules the job's next wake.
    pub fn plan_job(&mut self, id: &str) {
        let Some(job) = self.jobs.get_mut(id) else { return };
        job.wake_token += 1;
        let token = job.wake_token;
        if let Some(at) = job.next_wake() {
            self.schedule(at, Happening::JobWake { job: id.to_owned(), token });
        }
    }

    /// The job's own wake: it finishes restarting or writing a checkpoint, starts one, or posts
    /// its progress to the queue.
    pub(super) fn job_wake(&mut self, id: &str, token: u64) {
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
            let every = match self.queue.clone() {
                Some(queue) => match queue.progress(id, Some(&token), &progress) {
                    Ok(reply) => reply.checkpoint_every,
                    Err(err) => {
                        tracing::debug!(job = id, error = %err, "a simulated progress post was refused");
                        None
                    }
                },
                None => {
                    if let Some(seconds) = progress.checkpoint_write_seconds {
                        self.gang_checkpoint_written(id, seconds);
                    }
                    self.gang_auto_steps(id)
                }
            };
            if let (Some(every), Interval::Auto) = (every, self.config.job.checkpoint_every)
                && let Some(job) = self.jobs.get_mut(id)
            {
                job.interval_s = (every as f64 * step_s).max(step_s);
                if job.phase == Phase::Training {
                    job.next_checkpoint_s =
                        job.next_checkpoint_s.min(job.checkpoint_s + job.interval_s);
                }
            }
        }
        self.plan_job(id);
    }
}
