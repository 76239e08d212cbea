//! One setting simulated under several seeds (`fleetmend simulate --seeds N`): ETTR's mean with
//! its 95 % confidence interval (Student's t), the means of the other headline figures, and each
//! seed's ETTR. A single seed's ETTR is one draw of the failures; the interval says how far the
//! mean of N draws may sit from the setting's true ETTR.

use std::fmt::Write as _;

use serde::Serialize;

use crate::report::{JobResult, LostTime, Setting, SimReport};
use crate::stats::{IntervalError, MeanInterval};

/// The confidence of the interval reported around the mean ETTR.
pub const CONFIDENCE: f64 = 0.95;

/// Runs could not be summarised as replications of one setting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplicationsError {
    #[error("summarising {runs} run(s) as replications: {source}")]
    Interval { runs: usize, source: IntervalError },
}

/// The runs of one setting under consecutive seeds, summarised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replications {
    /// The setting simulated; its `seed` is the first seed's.
    pub setting: Setting,
    /// The mean ETTR over the seeds and its 95 % confidence interval.
    pub ettr: MeanInterval,
    /// The closed-form model's ETTR, averaged over the seeds.
    pub model_ettr: f64,
    /// The other headline figures, each the mean over the seeds.
    pub mean: MeanFigures,
    /// Each seed's ETTR, in the order the seeds ran.
    pub seeds: Vec<SeedEttr>,
}

/// Headline figures of one run, averaged over the seeds; per run they are summed over its jobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MeanFigures {
    pub interruptions: f64,
    /// Restarts the queue made.
    pub restarts: f64,
    /// Lost time by cause, hours.
    pub lost_hours: LostTime,
    /// Node failures (a correlated event counts each node).
    pub node_failures: f64,
    pub reboots: f64,
    pub replacements: f64,
    /// Times a spare took a failed node's place.
    pub spares_used: f64,
    /// Repairs a guard rail held back.
    pub actions_held: f64,
}

/// One seed's ETTR.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeedEttr {
    pub seed: u64,
    pub ettr: f64,
}

impl Replications {
    /// Summarises `runs`, the reports of one setting under different seeds (two or more).
    pub fn of(runs: &[SimReport]) -> Result<Replications, ReplicationsError> {
        let Some(first) = runs.first() else {
            let source = IntervalError::TooFewSamples { samples: 0 };
            return Err(ReplicationsError::Interval { runs: 0, source });
        };
        let ettrs: Vec<f64> = runs.iter().map(|report| report.ettr).collect();
        let ettr = MeanInterval::student_t(&ettrs, CONFIDENCE)
            .map_err(|source| ReplicationsError::Interval { runs: runs.len(), source })?;
        let n = runs.len() as f64;
        let mean = |figure: &dyn Fn(&SimReport) -> f64| runs.iter().map(figure).sum::<f64>() / n;
        let jobs = |report: &SimReport, figure: fn(&JobResult) -> f64| {
            report.jobs.iter().map(figure).sum::<f64>()
        };
        let lost = |part: fn(&LostTime) -> f64| {
            mean(&|report| report.jobs.iter().map(|job| part(&job.lost_hours)).sum())
        };
        Ok(Replications {
            setting: first.setting.clone(),
            ettr,
            model_ettr: mean(&|report| report.model_ettr),
            mean: MeanFigures {
                interruptions: mean(&|report| jobs(report, |job| f64::from(job.interruptions))),
                restarts: mean(&|report| jobs(report, |job| f64::from(job.restarts))),
                lost_hours: LostTime {
                    detection: lost(|l| l.detection),
                    drain_and_checkpoint: lost(|l| l.drain_and_checkpoint),
                    rollback: lost(|l| l.rollback),
                    restart: lost(|l| l.restart),
                    waiting_for_nodes: lost(|l| l.waiting_for_nodes),
                    held_by_guard_rail: lost(|l| l.held_by_guard_rail),
                    checkpoint_writes: lost(|l| l.checkpoint_writes),
                },
                node_failures: mean(&|report| f64::from(report.failures.node_failures)),
                reboots: mean(&|report| f64::from(report.repairs.reboots)),
                replacements: mean(&|report| f64::from(report.repairs.replacements)),
                spares_used: mean(&|report| f64::from(report.repairs.spares_used)),
                actions_held: mean(&|report| f64::from(report.repairs.actions_held)),
            },
            seeds: runs
                .iter()
                .map(|report| SeedEttr { seed: report.setting.seed, ettr: report.ettr })
                .collect(),
        })
    }

    /// The text summary: the setting, the mean ETTR with its interval, each seed's ETTR and the
    /// mean figures.
    pub fn summary(&self) -> String {
        let mut out = self.setting.summary(&seed_list(&self.seeds));
        let e = &self.ettr;
        let _ = writeln!(
            out,
            "ETTR {:.3} ± {:.3} over {} seeds ({:.0} % confidence interval {:.3} to {:.3}, Student's t with {} degrees of freedom); closed-form model {:.3}",
            e.mean,
            e.half_width,
            self.seeds.len(),
            e.confidence * 100.0,
            e.low,
            e.high,
            e.degrees_of_freedom,
            self.model_ettr
        );
        let per_seed: Vec<String> =
            self.seeds.iter().map(|s| format!("{} {:.3}", s.seed, s.ettr)).collect();
        let _ = writeln!(out, "  ETTR per seed: {}", per_seed.join(", "));
        let m = &self.mean;
        let _ = writeln!(
            out,
            "mean per seed: {:.1} interruption(s), {:.1} restart(s), {:.1} node failure(s), {:.1} reboot(s), {:.1} replacement(s), {:.1} spare(s) used, {:.1} action(s) held",
            m.interruptions,
            m.restarts,
            m.node_failures,
            m.reboots,
            m.replacements,
            m.spares_used,
            m.actions_held
        );
        let l = &m.lost_hours;
        let _ = writeln!(
            out,
            "  lost (h, summed over the jobs): detection {:.1}, drain+checkpoint {:.1}, rollback {:.1}, restart {:.1}, waiting for nodes {:.1}, held by guard rail {:.1}, checkpoint writes {:.1}",
            l.detection,
            l.drain_and_checkpoint,
            l.rollback,
            l.restart,
            l.waiting_for_nodes,
            l.held_by_guard_rail,
            l.checkpoint_writes
        );
        out
    }
}

/// `seeds 1 to 5` for consecutive seeds, else `seeds 1, 4, 9`.
fn seed_list(seeds: &[SeedEttr]) -> String {
    let consecutive =
        seeds.windows(2).all(|pair| pair[0].seed.checked_add(1) == Some(pair[1].seed));
    match (seeds.first(), seeds.last()) {
        (Some(first), Some(last)) if consecutive && seeds.len() > 1 => {
            format!("seeds {} to {}", first.seed, last.seed)
        }
        _ => {
            let list: Vec<String> = seeds.iter().map(|s| s.seed.to_string()).collect();
            format!("seeds {}", list.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::plot::tests::report;

    /// Three runs of the test report under seeds 7, 8, 9 with the ETTRs given.
    fn runs(ettrs: &[f64]) -> Vec<SimReport> {
        ettrs
            .iter()
            .enumerate()
            .map(|(index, &ettr)| {
                let mut run = report("30m", ettr, 0.96);
                run.setting.seed = 7 + index as u64;
                run.jobs[0].interruptions = 2 + index as u32;
                run.repairs.reboots = index as u32;
                run
            })
            .collect()
    }

    #[test]
    fn the_mean_interval_and_figures_of_three_seeds() {
        let summary = Replications::of(&runs(&[0.90, 0.93, 0.96])).unwrap();
        assert!((summary.ettr.mean - 0.93).abs() < 1e-12);
        // s = 0.03; t(0.975, 2) = 4.302653; 4.302653 * 0.03 / sqrt(3) = 0.074524.
        assert!((summary.ettr.half_width - 0.074_524).abs() < 1e-6, "{:?}", summary.ettr);
        assert_eq!(summary.ettr.degrees_of_freedom, 2);
        assert_eq!(summary.model_ettr, 0.96);
        assert_eq!(summary.mean.interruptions, 3.0);
        assert_eq!(summary.mean.reboots, 1.0);
        assert_eq!(summary.mean.node_failures, 3.0);
        assert!((summary.mean.lost_hours.rollback - 0.4).abs() < 1e-12);
        assert_eq!(summary.setting.seed, 7);
        let seeds: Vec<(u64, f64)> = summary.seeds.iter().map(|s| (s.seed, s.ettr)).collect();
        assert_eq!(seeds, [(7, 0.90), (8, 0.93), (9, 0.96)]);
    }

    #[test]
    fn one_run_is_not_replications() {
        let err = Replications::of(&runs(&[0.9])).unwrap_err();
        assert!(err.to_string().contains("at least two samples, got 1"), "{err}");
        assert!(Replications::of(&[]).is_err());
    }

    #[test]
    fn the_summary_names_the_seeds_the_interval_and_its_method() {
        let text = Replications::of(&runs(&[0.90, 0.93, 0.96])).unwrap().summary();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with(", 2.0 days, seeds 7 to 9"), "{text}");
        assert!(lines[1].starts_with("job(s): 1, checkpoint every 30m"), "{text}");
        assert_eq!(
            lines[2],
            "ETTR 0.930 ± 0.075 over 3 seeds (95 % confidence interval 0.855 to 1.005, \
             Student's t with 2 degrees of freedom); closed-form model 0.960"
        );
        assert_eq!(lines[3], "  ETTR per seed: 7 0.900, 8 0.930, 9 0.960");
        assert!(
            lines[4].starts_with("mean per seed: 3.0 interruption(s), 3.0 restart(s)"),
            "{text}"
        );
        assert!(lines[5].contains("rollback 0.4"), "{text}");
        assert_eq!(lines.len(), 6, "{text}");
    }

    #[test]
    fn seeds_that_are_not_consecutive_are_listed() {
        let seeds = |list: &[u64]| -> Vec<SeedEttr> {
            list.iter().map(|&seed| SeedEttr { seed, ettr: 0.9 }).collect()
        };
        assert_eq!(seed_list(&seeds(&[3, 4, 5])), "seeds 3 to 5");
        assert_eq!(seed_list(&seeds(&[3, 5])), "seeds 3, 5");
        assert_eq!(seed_list(&seeds(&[u64::MAX, 0])), format!("seeds {}, 0", u64::MAX));
    }
}
