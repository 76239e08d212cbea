//! A rank's progress posts: goodput accounting, the checkpoint interval it is told, and the
//! queue's figures for `/metrics`.

use std::collections::BTreeMap;

use fleetmend_proto::{Progress, ProgressReply};

use super::{
    CheckpointEvery, Job, JobFigures, JobQueue, JobState, QueueError, QueueMetrics, QueueState,
    interval, job, rank_of_token, reindex,
};

impl JobQueue {
    /// A rank's progress post (`token` is the bearer token it presented).
    pub fn progress(
        &self,
        id: &str,
        token: Option<&str>,
        progress: &Progress,
    ) -> Result<ProgressReply, QueueError> {
        self.wake();
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let job = state.jobs.get(id).ok_or_else(|| QueueError::UnknownJob(id.to_owned()))?;
        let Some((token_attempt, token_rank)) =
            token.and_then(|token| rank_of_token(&job.progress_token, token))
        else {
            return Err(QueueError::Unauthorized { job: id.to_owned() });
        };
        if (token_attempt, token_rank) != (progress.attempt, progress.rank) {
            return Err(QueueError::OtherRank {
                job: id.to_owned(),
                token_attempt,
                token_rank,
                attempt: progress.attempt,
                rank: progress.rank,
            });
        }
        if progress.job != id {
            return Err(QueueError::BadProgress {
                job: id.to_owned(),
                message: format!("the body is about job {:?}", progress.job),
            });
        }
        let nodes = job.spec.nodes;
        let auto = job.spec.checkpoint_every == Some(CheckpointEvery::Auto);
        let mtbf = if auto { Some(self.mtbf_seconds(&mut state, nodes, now)) } else { None };
        let Some(job) = state.jobs.get_mut(id) else {
            return Err(QueueError::UnknownJob(id.to_owned()));
        };
        let current = job.state.is_active()
            && progress.attempt == job.attempt
            && (progress.rank as usize) < job.ranks.len();
        // Posts of an old attempt (a rank that outlived its stop) change nothing.
        let mut ended = false;
        if current {
            self.account(job, progress, now);
            job.health.observe(progress.step, progress.start_step, progress.loss, now);
            let rank = &mut job.ranks[progress.rank as usize];
            let stepped = rank.progress.as_ref().is_none_or(|p| progress.step > p.step);
            if stepped && progress.step > progress.start_step {
                rank.stepped_posts += 1;
                let seconds = progress.step_seconds.filter(|s| s.is_finite() && *s > 0.0);
                if let Some(seconds) = seconds
                    && rank.stepped_posts > self.config.straggler_warmup
                {
                    let window = self.config.straggler_window.max(1) as usize;
                    if rank.step_samples.len() >= window {
                        rank.step_samples.remove(0);
                    }
                    rank.step_samples.push(seconds);
                }
            }
            rank.progress = Some(progress.clone());
            rank.heard_ms = Some(now);
            if let Some(seconds) = progress.checkpoint_write_seconds {
                job.measured.checkpoint_write_seconds = Some(seconds);
            }
            if job.state == JobState::Stopping {
                self.advance_stop(job, now);
                ended = !job.state.is_active();
            }
        }
        let checkpoint_every = match job.spec.checkpoint_every {
            Some(CheckpointEvery::Steps(n)) => Some(n),
            Some(CheckpointEvery::Auto) => {
                let steps = interval::young_daly_steps(
                    job.measured.checkpoint_write_seconds,
                    mtbf.unwrap_or(self.config.mtbf_prior.as_secs_f64()),
                    job.measured.steps_per_second,
                );
                job.checkpoint_interval = steps.or(job.checkpoint_interval);
                job.checkpoint_interval
            }
            None => None,
        };
        if current {
            let id = job.id.clone();
            state.dirty.insert(id);
        }
        // Only a job that ended gives its nodes back (the index is every active job's ranks).
        if ended {
            reindex(&mut state);
        }
        Ok(ProgressReply { checkpoint_every })
    }

    /// The observed MTBF of jobs of `nodes` ranks (the prior when none failed), cached a while:
    /// it reads every job's history.
    fn mtbf_seconds(&self, state: &mut QueueState, nodes: u32, now: u64) -> f64 {
        if let Some((at, value)) = state.mtbf.get(&nodes)
            && now.saturating_sub(*at) < 10_000
        {
            return *value;
        }
        let value = interval::observed_mtbf_seconds(state.jobs.values(), nodes, now)
            .unwrap_or(self.config.mtbf_prior.as_secs_f64());
        state.mtbf.insert(nodes, (now, value));
        value
    }

    /// Goodput accounting from the lead rank's posts (the lowest rank posting in the attempt:
    /// ranks step together, so one rank's progress is the job's).
    fn account(&self, job: &mut Job, p: &Progress, now: u64) {
        let lead = match &job.goodput.last_observation {
            Some(o) if o.attempt == p.attempt => p.rank <= o.rank,
            _ => true,
        };
        let previous_last =
            job.history.iter().rev().find(|a| a.attempt + 1 == p.attempt).and_then(|a| a.last_step);
        let failure_ms = job.goodput.failure_ms;
        let mut lost = 0;
        let mut resumed_after = None;
        let mut rate = None;
        if let Some(attempt) = job.current_attempt_mut() {
            attempt.last_step = Some(attempt.last_step.unwrap_or(0).max(p.step));
            if lead {
                if attempt.resumed_from_step.is_none() {
                    attempt.resumed_from_step = Some(p.start_step);
                    if let Some(last) = previous_last {
                        lost = last.saturating_sub(p.start_step);
                        attempt.steps_lost = Some(lost);
                    }
                }
                match attempt.rate_base {
                    None => attempt.rate_base = Some((p.step, p.at_ms)),
                    Some((step, at)) if p.step > step && p.at_ms > at => {
                        rate = Some((p.step - step) as f64 / ((p.at_ms - at) as f64 / 1000.0));
                    }
                    Some(_) => {}
                }
                if attempt.first_step_ms.is_none() && p.step > p.start_step {
                    attempt.first_step_ms = Some(now);
                    if attempt.attempt > 0
                        && let Some(failed) = failure_ms
                    {
                        let seconds = now.saturating_sub(failed) as f64 / 1000.0;
                        attempt.resume_seconds = Some(seconds);
                        resumed_after = Some(seconds);
                    }
                }
            }
        }
        if !lead {
            return;
        }
        job.goodput.steps_lost_total += lost;
        if rate.is_some() {
            job.measured.steps_per_second = rate;
        }
        if let Some(seconds) = resumed_after {
            self.resume_seconds.observe(seconds);
        }
        let high = job.goodput.high_water_step;
        if let Some(o) = &job.goodput.last_observation
            && o.attempt == p.attempt
            && o.rank == p.rank
            && p.step > o.step
        {
            // Only steps past the furthest ever reached are new work; redone ones are not.
            let advanced = p.step - o.step;
            let fresh = p.step.saturating_sub(o.step.max(high));
            let elapsed = p.at_ms.saturating_sub(o.at_ms) * fresh / advanced;
            // With a straggler flagged the job stepped at its pace: 1/ratio of the time was work
            // (a ratio above 1 keeps `slowed` at most `elapsed`).
            let slowed = job
                .health
                .straggler_ratio
                .filter(|r| *r > 1.0)
                .map_or(0, |ratio| (elapsed as f64 * (1.0 - 1.0 / ratio)).round() as u64);
            job.goodput.productive_ms += elapsed - slowed;
            job.goodput.straggler_ms += slowed;
        }
        job.goodput.high_water_step = high.max(p.step);
        let newer = job
            .goodput
            .last_observation
            .as_ref()
            .is_none_or(|o| o.attempt != p.attempt || o.rank != p.rank || p.step > o.step);
        if newer {
            job.goodput.last_observation = Some(job::Observation {
                attempt: p.attempt,
                rank: p.rank,
                step: p.step,
                at_ms: p.at_ms,
            });
        }
    }

    /// Figures for `/metrics`.
    pub fn metrics(&self) -> QueueMetrics {
        let now = self.clock.now_ms();
        let state = self.lock();
        let mut by_state: BTreeMap<JobState, u64> = JobState::ALL.iter().map(|s| (*s, 0)).collect();
        for job in state.jobs.values() {
            *by_state.entry(job.state).or_default() += 1;
        }
        let mut finished: Vec<&Job> = state.jobs.values().filter(|j| j.state.is_final()).collect();
        finished.sort_by_key(|j| std::cmp::Reverse(j.finished_ms.unwrap_or(0)));
        let shown = state
            .jobs
            .values()
            .filter(|j| !j.state.is_final())
            .chain(finished.into_iter().take(FINISHED_JOBS_IN_METRICS));
        let jobs = shown
            .map(|j| JobFigures {
                id: j.id.clone(),
                restarts: j.restarts,
                goodput_ratio: j.goodput_ratio(now),
                steps_lost: j.goodput.steps_lost_total,
                step: j.step(),
                hangs: j.health.hangs,
                hung_seconds: j.goodput.hung_ms as f64 / 1000.0,
                straggler_seconds: j.goodput.straggler_ms as f64 / 1000.0,
                slowest_rank: super::health::slowest_rank(j, self.config.straggler_window as usize)
                    .map(|s| (s.rank, s.ratio)),
                progress: j.latest_progress().cloned(),
            })
            .collect();
        let resume_seconds = self.resume_seconds.clone();
        QueueMetrics { by_state, jobs, resume_seconds }
    }
}

/// Finished jobs kept in `/metrics` (with every unfinished one): job ids are unbounded over time.
const FINISHED_JOBS_IN_METRICS: usize = 50;
