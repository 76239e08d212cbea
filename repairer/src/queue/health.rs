//! Job health from the ranks' progress posts: a running job whose step stops advancing is hung.
//!
//! A hang prints nothing: a rank stopped, deadlocked or stuck in a driver call leaves the other
//! ranks waiting in the collective until its timeout (PyTorch's NCCL default is 10 minutes). The
//! queue sees it sooner from the progress posts: every rank posts after its steps and, while the
//! step does not advance, repeats its post as a heartbeat naming the ranks its collective waits
//! for. A job whose step has not advanced for `max(hang_factor × its median step time,
//! hang_floor)` is declared hung ([`hang`], pure), the ranks that did not arrive are named, and the
//! job is stopped and restarted from its newest checkpoint.
//!
//! A loss that is not finite (NaN, infinity) means the weights are lost from that step on: the
//! job is stopped without a checkpoint and restarted from its newest one, which a job written to
//! the protocol did not write from non-finite state; after `nan_restarts` such restarts it fails
//! with the reason instead ([`loss_verdict`]).

use std::collections::BTreeSet;
use std::time::Duration;

use fleetmend_proto::stats::median;
use serde::{Deserialize, Serialize};

use super::{Job, JobState};

/// Step times a job's health keeps (the newest): enough for a stable median, few enough that
/// the job's document stays small.
pub const STEP_SAMPLES: usize = 32;

/// A job is hung no sooner than this many of its median gaps between posts that brought a step.
const POST_GAPS: f64 = 3.0;

/// What the queue keeps of a job's progress to judge its health (the current attempt).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobHealth {
    /// The furthest step of the current attempt and when (the repairer's clock) it was first
    /// reported; `None` until a step past the start was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advanced: Option<(u64, u64)>,
    /// Wall seconds per step between the advances of the current attempt, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_seconds: Vec<f64>,
    /// Wall seconds between the advances themselves (how often the job's posts bring a step),
    /// newest last: a job that posts every 30 minutes cannot be judged in 20 s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advance_gaps: Vec<f64>,
    /// Hangs declared over the job's life.
    #[serde(default)]
    pub hangs: u32,
    /// The first step of the current attempt whose loss was not finite (NaN or infinite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_not_finite: Option<u64>,
    /// Attempts stopped for a loss that was not finite, over the job's life.
    #[serde(default)]
    pub non_finite_losses: u32,
    /// The ratio of the job's slowest straggler while one is flagged (see `flag_stragglers`):
    /// what the goodput accounting charges to stragglers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straggler_ratio: Option<f64>,
}

impl JobHealth {
    /// A new attempt starts with nothing measured (its hangs are the job's).
    pub fn new_attempt(&mut self) {
        self.advanced = None;
        self.step_seconds.clear();
        self.advance_gaps.clear();
        self.loss_not_finite = None;
        self.straggler_ratio = None;
    }

    /// A post of `step` (started from `start_step`) with `loss`, heard at `now`.
    pub fn observe(&mut self, step: u64, start_step: u64, loss: f64, now: u64) {
        if !loss.is_finite() && self.loss_not_finite.is_none_or(|s| step < s) {
            self.loss_not_finite = Some(step);
        }
        match self.advanced {
            None if step > start_step => self.advanced = Some((step, now)),
            Some((last, at)) if step > last => {
                let gap = now.saturating_sub(at) as f64 / 1000.0;
                if self.step_seconds.len() >= STEP_SAMPLES {
                    self.step_seconds.remove(0);
                    self.advance_gaps.remove(0);
                }
                self.step_seconds.push(gap / (step - last) as f64);
                self.advance_gaps.push(gap);
                self.advanced = Some((step, now));
            }
            _ => {}
        }
    }

    /// The median wall time of a step, once one was measured.
    pub fn median_step_seconds(&self) -> Option<f64> {
        median(self.step_seconds.iter().copied())
    }
}

/// When a job counts as hung (`[queue] hang_factor`, `hang_floor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HangRule {
    /// Hung after this many median step times without a new step...
    pub factor: f64,
    /// ...and never sooner than this. Zero: hang detection is off.
    pub floor: Duration,
}

/// A job found hung.
#[derive(Debug, Clone, PartialEq)]
pub struct Hang {
    /// The step it stands at.
    pub step: u64,
    /// How long it has stood there.
    pub stalled_ms: u64,
    /// How long it was allowed to.
    pub limit_ms: u64,
    /// The ranks that did not arrive: named by a waiting rank's heartbeat, or silent themselves
    /// while the others post. Empty when no rank says (a job that posts without heartbeats).
    pub ranks: Vec<u32>,
}

impl Hang {
    /// Why the job is stopped, naming the ranks and their nodes.
    pub fn reason(&self, job: &Job) -> String {
        let stalled = Duration::from_millis(self.stalled_ms / 1000 * 1000);
        let limit = Duration::from_millis(self.limit_ms);
        let mut why = format!(
            "hung: step {} did not advance for {} (limit {})",
            self.step,
            humantime::format_duration(stalled),
            humantime::format_duration(limit)
        );
        if self.ranks.is_empty() {
            why.push_str("; no rank named the one it waits for");
        } else {
            let named: Vec<String> = self
                .ranks
                .iter()
                .map(|r| match job.ranks.get(*r as usize) {
                    Some(record) => format!("rank {r} on {}", record.node),
                    None => format!("rank {r}"),
                })
                .collect();
            why.push_str(&format!("; did not arrive: {}", named.join(", ")));
        }
        why
    }
}

/// Whether `job` is hung at `now` under `rule`: running, a step past its start reported, and no
/// newer step for `max(factor × median step time, floor)`.
pub fn hang(job: &Job, rule: &HangRule, now: u64) -> Option<Hang> {
    let (step, at, limit_ms) = hang_limit(job, rule)?;
    let stalled_ms = now.saturating_sub(at);
    if stalled_ms < limit_ms {
        return None;
    }
    // A live rank repeats its post at least every few seconds; one that has not posted for half
    // the limit while another did is not running its heartbeat either.
    let silent_after = limit_ms / 2;
    let heard: Vec<(u32, u64)> =
        job.ranks.iter().filter_map(|r| Some((r.rank, r.heard_ms?))).collect();
    let anyone_heard = heard.iter().any(|(_, h)| now.saturating_sub(*h) < silent_after);
    let mut ranks = BTreeSet::new();
    for record in &job.ranks {
        let Some(progress) = &record.progress else { continue };
        let fresh = record.heard_ms.is_some_and(|h| now.saturating_sub(h) < silent_after);
        if fresh {
            ranks.extend(progress.waiting_for.iter().copied());
        } else if anyone_heard {
            ranks.insert(record.rank);
        }
    }
    ranks.retain(|r| (*r as usize) < job.ranks.len());
    Some(Hang { step, stalled_ms, limit_ms, ranks: ranks.into_iter().collect() })
}

/// The step a running job stands at, since when, and how long it may stand there before it is
/// hung: `max(factor × median step time, floor)`, and never sooner than a few of the job's own
/// gaps between posts that brought a step. None: not running, no step yet, or detection off.
fn hang_limit(job: &Job, rule: &HangRule) -> Option<(u64, u64, u64)> {
    if job.state != JobState::Running || rule.floor.is_zero() {
        return None;
    }
    let (step, at) = job.health.advanced?;
    let floor_ms = rule.floor.as_millis() as u64;
    let by_steps = job
        .health
        .median_step_seconds()
        .map(|median| (median * rule.factor.max(0.0) * 1000.0).ceil() as u64)
        .unwrap_or(0);
    let by_posts = median(job.health.advance_gaps.iter().copied())
        .map(|gap| (gap * POST_GAPS * 1000.0).ceil() as u64)
        .unwrap_or(0);
    Some((step, at, floor_ms.max(by_steps).max(by_posts)))
}

/// When `job` turns hung if no step comes before then ([`hang`] finds it hung from then on).
pub fn hang_due(job: &Job, rule: &HangRule) -> Option<u64> {
    let (_, at, limit_ms) = hang_limit(job, rule)?;
    Some(at.saturating_add(limit_ms))
}

/// When a rank counts as a straggler (`[queue] straggler_ratio`, `straggler_window`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StragglerRule {
    /// A rank whose median step compute time is at least this many times the median of the other
    /// ranks' medians. Zero: no straggler detection.
    pub ratio: f64,
    /// Posts (each with a new step) per rank the medians are taken over; a rank with fewer since
    /// its warm-up is not judged yet.
    pub window: usize,
}

/// A rank found persistently slower than the job's others.
#[derive(Debug, Clone, PartialEq)]
pub struct Straggler {
    pub rank: u32,
    /// Its median step compute time over the others' median.
    pub ratio: f64,
    /// Its median step compute time, in seconds.
    pub seconds: f64,
}

/// The stragglers of a running job: ranks whose median step compute time over their last
/// `window` posts (warm-up excluded when the samples were taken) is at least `ratio` × the median
/// of the other ranks' medians. Medians, not means: one slow step (a checkpoint copy, a page
/// fault) moves neither side. Needs at least two ranks with a full window.
pub fn stragglers(job: &Job, rule: &StragglerRule) -> Vec<Straggler> {
    if rule.ratio <= 0.0 {
        return Vec::new();
    }
    rank_ratios(job, rule.window).into_iter().filter(|s| s.ratio >= rule.ratio).collect()
}

/// The slowest rank of a running job and its ratio (whatever it is): what `/metrics` shows.
pub fn slowest_rank(job: &Job, window: usize) -> Option<Straggler> {
    rank_ratios(job, window).into_iter().max_by(|a, b| a.ratio.total_cmp(&b.ratio))
}

/// Every judged rank's median step compute time over the median of the other ranks' medians.
fn rank_ratios(job: &Job, window: usize) -> Vec<Straggler> {
    if job.state != JobState::Running || window == 0 {
        return Vec::new();
    }
    let medians: Vec<(u32, f64)> = job
        .ranks
        .iter()
        .filter(|r| r.step_samples.len() >= window)
        .filter_map(|r| {
            let newest = &r.step_samples[r.step_samples.len() - window..];
            Some((r.rank, median(newest.iter().copied())?))
        })
        .collect();
    if medians.len() < 2 {
        return Vec::new();
    }
    medians
        .iter()
        .filter_map(|&(rank, seconds)| {
            let others = median(medians.iter().filter(|(r, _)| *r != rank).map(|(_, s)| *s))?;
            if others <= 0.0 {
                return None;
            }
            Some(Straggler { rank, ratio: seconds / others, seconds })
        })
        .collect()
}

/// What to do about a job whose loss went non-finite at `step`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossVerdict {
    /// Restart from the newest checkpoint (written before the loss went bad).
    Restart(String),
    /// Restarts for it are used up: fail the job with the reason.
    Fail(String),
}

/// The verdict on a running job's loss: `None` while it is finite.
pub fn loss_verdict(job: &Job, nan_restarts: u32) -> Option<LossVerdict> {
    if job.state != JobState::Running {
        return None;
    }
    let step = job.health.loss_not_finite?;
    let seen = job.health.non_finite_losses;
    if seen >= nan_restarts {
        return Some(LossVerdict::Fail(format!(
            "the loss was not finite at step {step}, {} time(s) in all (nan_restarts {nan_restarts})",
            seen + 1
        )));
    }
    Some(LossVerdict::Restart(format!(
        "the loss was not finite at step {step}: restart {} of nan_restarts {nan_restarts} from the newest checkpoint",
        seen + 1
    )))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fleetmend_proto::Progress;

    use super::*;
    use crate::queue::{JobSpec, RankRecord};

    const RULE: HangRule = HangRule { factor: 10.0, floor: Duration::from_secs(20) };

    fn progress(rank: u32, step: u64, waiting_for: Vec<u32>) -> Progress {
        Progress {
            job: "j-1".into(),
            attempt: 0,
            rank,
            step,
            start_step: 0,
            loss: 2.0,
            samples_per_second: 1.0,
            checkpoint_step: None,
            checkpoint_write_seconds: None,
            checkpoint_stall_seconds: None,
            step_seconds: Some(0.1),
            waiting_for,
            at_ms: 0,
        }
    }

    /// A running job of 4 ranks that reached step 50 at t = 10 s (steps of 0.2 s), every rank
    /// last heard at `heard_ms`.
    fn job(heard_ms: u64) -> Job {
        let spec = JobSpec {
            name: None,
            argv: vec!["train".into()],
            nodes: 4,
            priority: 0,
            checkpoint_dir: "/ckpt".into(),
            max_restarts: 3,
            checkpoint_every: None,
            env: BTreeMap::new(),
        };
        let mut job = Job::queued("j-1".into(), 1, spec, 0, "t".into());
        job.state = JobState::Running;
        job.ranks = (0..4)
            .map(|rank| RankRecord {
                rank,
                node: format!("node-{}", rank + 1),
                launched_ms: 0,
                status: None,
                progress: Some(progress(rank, 50, Vec::new())),
                heard_ms: Some(heard_ms),
                step_samples: Vec::new(),
                stepped_posts: 0,
            })
            .collect();
        for (step, at) in [(10, 2_000), (20, 4_000), (30, 6_000), (40, 8_000), (50, 10_000)] {
            job.health.observe(step, 0, 2.0, at);
        }
        job
    }

    #[test]
    fn a_job_within_its_limit_is_not_hung() {
        let job = job(29_000);
        assert_eq!(job.health.median_step_seconds(), Some(0.2));
        // 10 × 0.2 s = 2 s is below the 20 s floor: the floor decides.
        assert_eq!(hang(&job, &RULE, 29_999), None);
    }

    #[test]
    fn past_the_floor_the_job_is_hung_and_the_silent_rank_is_named() {
        let mut job = job(29_000);
        // Rank 2 stopped with step 50: its posts stopped too; rank 3 waits for it.
        job.ranks[2].heard_ms = Some(10_000);
        job.ranks[3].progress = Some(progress(3, 50, vec![2]));
        let hang = hang(&job, &RULE, 30_000).expect("hung");
        assert_eq!(hang.step, 50);
        assert_eq!((hang.stalled_ms, hang.limit_ms), (20_000, 20_000));
        assert_eq!(hang.ranks, [2]);
        assert!(
            hang.reason(&job).contains("did not arrive: rank 2 on node-3"),
            "{}",
            hang.reason(&job)
        );
    }

    #[test]
    fn a_slow_job_gets_its_factor_of_the_median_step() {
        let mut job = job(29_000);
        job.health = JobHealth::default();
        // Steps of 5 s: hung only after 50 s.
        for (step, at) in [(1, 5_000), (2, 10_000), (3, 15_000)] {
            job.health.observe(step, 0, 2.0, at);
        }
        assert_eq!(hang(&job, &RULE, 15_000 + 49_999), None);
        let hang = hang(&job, &RULE, 15_000 + 50_000).expect("hung");
        assert_eq!(hang.limit_ms, 50_000);
    }

    #[test]
    fn a_job_that_posts_rarely_is_judged_at_its_own_pace() {
        let mut job = job(0);
        job.health = JobHealth::default();
        // A step a second, posted every 30 minutes (the simulator's job does so).
        let half_hour = 1_800_000;
        for post in 1..=3u64 {
            job.health.observe(post * 1800, 0, 2.0, post * half_hour);
        }
        let last = 3 * half_hour;
        assert_eq!(hang(&job, &RULE, last + 2 * half_hour), None, "two gaps: not yet");
        assert!(hang(&job, &RULE, last + 3 * half_hour).is_some(), "three gaps without a step");
    }

    #[test]
    fn without_heartbeats_no_rank_is_named() {
        // Every rank last posted with its last step: nobody is fresh, nobody can be blamed.
        let job = job(10_000);
        let hang = hang(&job, &RULE, 30_000).expect("hung");
        assert_eq!(hang.ranks, Vec::<u32>::new());
        assert!(hang.reason(&job).contains("no rank named"), "{}", hang.reason(&job));
    }

    #[test]
    fn a_job_not_yet_stepping_stopping_or_with_detection_off_is_never_hung() {
        let mut fresh = job(0);
        fresh.health = JobHealth::default();
        assert_eq!(hang(&fresh, &RULE, 1_000_000), None, "no step past the start yet");
        let mut stopping = job(0);
        stopping.state = JobState::Stopping;
        assert_eq!(hang(&stopping, &RULE, 1_000_000), None);
        let off = HangRule { floor: Duration::ZERO, ..RULE };
        assert_eq!(hang(&job(0), &off, 1_000_000), None);
    }

    const STRAGGLERS: StragglerRule = StragglerRule { ratio: 1.5, window: 5 };

    #[test]
    fn a_rank_at_half_speed_is_a_straggler_with_its_ratio() {
        let mut job = job(0);
        for record in &mut job.ranks {
            record.step_samples = vec![0.10, 0.11, 0.09, 0.10, 0.12];
        }
        assert_eq!(stragglers(&job, &STRAGGLERS), Vec::new(), "equal ranks");
        let slowest = slowest_rank(&job, 5).expect("four judged ranks");
        assert!(slowest.ratio < 1.2, "{slowest:?}");
        // Rank 2 at half speed, with one fast outlier among its samples.
        job.ranks[2].step_samples = vec![0.20, 0.21, 0.05, 0.19, 0.20];
        let found = stragglers(&job, &STRAGGLERS);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rank, 2);
        assert!((found[0].ratio - 2.0).abs() < 0.01, "{found:?}");
    }

    #[test]
    fn one_slow_step_or_a_short_window_is_not_a_straggler() {
        let mut job = job(0);
        for record in &mut job.ranks {
            record.step_samples = vec![0.10; 5];
        }
        // A checkpoint copy made one post slow: the median does not move.
        job.ranks[0].step_samples = vec![0.10, 0.10, 0.90, 0.10, 0.10];
        assert_eq!(stragglers(&job, &STRAGGLERS), Vec::new());
        // 1.4x is under the ratio.
        job.ranks[1].step_samples = vec![0.14; 5];
        assert_eq!(stragglers(&job, &STRAGGLERS), Vec::new());
        // Slow, but its window is not full yet (warm-up excluded): not judged.
        job.ranks[3].step_samples = vec![0.30; 4];
        assert_eq!(stragglers(&job, &STRAGGLERS), Vec::new());
        let off = StragglerRule { ratio: 0.0, ..STRAGGLERS };
        job.ranks[3].step_samples = vec![0.30; 5];
        assert_eq!(stragglers(&job, &off), Vec::new(), "off");
        assert_eq!(stragglers(&job, &STRAGGLERS).len(), 1);
    }

    #[test]
    fn a_loss_gone_bad_restarts_the_job_then_fails_it() {
        let mut job = job(29_000);
        assert_eq!(loss_verdict(&job, 1), None, "a finite loss");
        job.health.observe(60, 0, f64::NAN, 12_000);
        job.health.observe(70, 0, f64::NAN, 14_000);
        assert_eq!(job.health.loss_not_finite, Some(60), "the first bad step is kept");
        let Some(LossVerdict::Restart(why)) = loss_verdict(&job, 1) else { panic!("no restart") };
        assert!(why.contains("step 60") && why.contains("restart 1 of nan_restarts 1"), "{why}");
        job.health.non_finite_losses = 1;
        let Some(LossVerdict::Fail(why)) = loss_verdict(&job, 1) else { panic!("no failure") };
        assert!(why.contains("2 time(s)"), "{why}");
        let Some(LossVerdict::Fail(_)) = loss_verdict(&job, 0) else { panic!("0: fail at once") };
        job.health.new_attempt();
        assert_eq!(loss_verdict(&job, 1), None, "the new attempt starts clean");
        job.health.observe(80, 0, f64::INFINITY, 16_000);
        assert!(loss_verdict(&job, 5).is_some(), "infinity is not finite either");
    }

    #[test]
    fn a_new_attempt_forgets_the_last_ones_steps_but_not_its_hangs() {
        let mut health = JobHealth { hangs: 1, ..JobHealth::default() };
        health.observe(10, 0, 2.0, 1_000);
        health.observe(20, 0, 2.0, 3_000);
        health.new_attempt();
        assert_eq!(health, JobHealth { hangs: 1, ..JobHealth::default() });
        // The first post of the new attempt at its start step is not an advance.
        health.observe(20, 20, 2.0, 5_000);
        assert_eq!(health.advanced, None);
    }
}
