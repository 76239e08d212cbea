//! What `fleetmend simulate` runs: every combination of the swept settings' values (the first
//! `--sweep`'s values the outer loop), each under `--seeds` consecutive seeds, as one list of
//! simulations for the parallel runner; and the reports gathered back per combination.

use std::num::NonZeroU32;
use std::path::Path;

use serde::Serialize;

use super::runner::{self, ProgressFeed};
use super::{SimulateError, Sweep};
use crate::config::SimConfig;
use crate::inputs::{self, OwnInputs};
use crate::plot;
use crate::replications::Replications;
use crate::report::SimReport;

/// The highest seed the settings take (TOML's integers are signed 64-bit): no run gets a seed
/// past it, so that each can be rerun alone with `--seed`.
const LAST_SEED: u64 = i64::MAX as u64;

/// The settings swept: none (one setting), one, or two as a grid.
#[derive(Debug, Clone, Copy)]
pub(super) enum Swept<'a> {
    Nothing,
    One(&'a Sweep),
    Two(&'a Sweep, &'a Sweep),
}

impl<'a> Swept<'a> {
    /// The `--sweep` flags as a sweep: at most two, each of a different setting.
    pub(super) fn of(sweeps: &'a [Sweep]) -> Result<Swept<'a>, SimulateError> {
        match sweeps {
            [] => Ok(Swept::Nothing),
            [one] => Ok(Swept::One(one)),
            [first, second] if first.key == second.key => {
                Err(SimulateError::SweptTwice { key: first.key.clone() })
            }
            [first, second] => Ok(Swept::Two(first, second)),
            more => Err(SimulateError::TooManySweeps {
                keys: more.iter().map(|sweep| sweep.key.clone()).collect(),
            }),
        }
    }

    /// The swept settings, in the order of the flags.
    pub(super) fn sweeps(&self) -> Vec<&'a Sweep> {
        match *self {
            Swept::Nothing => Vec::new(),
            Swept::One(sweep) => vec![sweep],
            Swept::Two(first, second) => vec![first, second],
        }
    }

    /// Every combination of the swept values, the first setting's the outer loop; one empty
    /// combination when nothing is swept.
    pub(super) fn combinations(&self) -> Vec<Vec<&'a str>> {
        self.sweeps().iter().fold(vec![Vec::new()], |combinations, sweep| {
            combinations
                .iter()
                .flat_map(|combination| {
                    sweep.values.iter().map(move |value| {
                        let mut longer = combination.clone();
                        longer.push(value.as_str());
                        longer
                    })
                })
                .collect()
        })
    }
}

/// The simulations to run: each combination of swept values under each seed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan<'a> {
    pub swept: Swept<'a>,
    /// Replications of each combination, under consecutive seeds from `fleet.seed`.
    pub seeds: NonZeroU32,
}

/// One combination of swept values and what its runs found.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GridPoint {
    /// Each swept setting's value, in the order of the `--sweep` flags.
    pub values: Vec<String>,
    pub outcome: Outcome,
    /// The runs' checkpoint interval, minutes (for `auto`, the mean of the intervals the first
    /// jobs ended with): where a chart marks them.
    pub interval_minutes: Option<f64>,
}

/// What the runs of one combination found: one report, or the summary of several seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Outcome {
    Report(SimReport),
    Replications(Replications),
}

impl Outcome {
    /// The ETTR: the run's, or the seeds' mean.
    pub(super) fn ettr(&self) -> f64 {
        match self {
            Outcome::Report(report) => report.ettr,
            Outcome::Replications(summary) => summary.ettr.mean,
        }
    }

    /// Half the 95 % interval around [`Outcome::ettr`]; none for one run.
    pub(super) fn half_width(&self) -> Option<f64> {
        match self {
            Outcome::Report(_) => None,
            Outcome::Replications(summary) => Some(summary.ettr.half_width),
        }
    }

    /// The closed-form model's ETTR (the seeds' mean).
    pub(super) fn model_ettr(&self) -> f64 {
        match self {
            Outcome::Report(report) => report.model_ettr,
            Outcome::Replications(summary) => summary.model_ettr,
        }
    }
}

/// The discrete events `runs` processed.
fn events(runs: &[SimReport]) -> u64 {
    runs.iter().map(|report| report.sim_events).sum()
}

impl Plan<'_> {
    /// The settings of every run: per combination (in [`Swept::combinations`]' order) its seeds
    /// in order, `fleet.seed` first. `base` are the flags' overrides, the swept values go after.
    pub(super) fn configs(
        &self,
        file: Option<&Path>,
        own: OwnInputs<'_>,
        base: &[(String, String)],
    ) -> Result<Vec<SimConfig>, SimulateError> {
        let sweeps = self.swept.sweeps();
        let mut configs = Vec::new();
        for combination in self.swept.combinations() {
            let point = named(&sweeps, &combination);
            let mut overrides = base.to_vec();
            overrides.extend(point.iter().cloned());
            let config = inputs::load(file, own, &overrides).map_err(|source| {
                let source = Box::new(source);
                if point.is_empty() {
                    SimulateError::Settings(source)
                } else {
                    SimulateError::SweepSettings { point: point.clone(), source }
                }
            })?;
            let first = config.fleet.seed;
            for replication in 0..self.seeds.get() {
                let seed = first
                    .checked_add(u64::from(replication))
                    .filter(|&seed| seed <= LAST_SEED)
                    .ok_or(SimulateError::SeedsPastTheLast { first, seeds: self.seeds })?;
                let mut seeded = config.clone();
                seeded.fleet.seed = seed;
                configs.push(seeded);
            }
        }
        Ok(configs)
    }

    /// Runs `configs` (from [`Plan::configs`]) on up to `threads` threads and gathers the reports
    /// per combination; a failed run is named by its swept values and, with several seeds, its
    /// seed.
    pub(super) fn run(
        &self,
        configs: &[SimConfig],
        threads: usize,
        bar: Option<&ProgressFeed>,
    ) -> Result<(Vec<GridPoint>, u64), SimulateError> {
        let sweeps = self.swept.sweeps();
        let combinations = self.swept.combinations();
        let seeds = self.seeds.get() as usize;
        let reports = runner::simulate_all(configs, threads, bar).map_err(|(index, source)| {
            let mut point = combinations
                .get(index / seeds)
                .map(|combination| named(&sweeps, combination))
                .unwrap_or_default();
            if seeds > 1
                && let Some(config) = configs.get(index)
            {
                point.push(("fleet.seed".to_owned(), config.fleet.seed.to_string()));
            }
            SimulateError::Run { point, source }
        })?;
        let events = events(&reports);
        let mut runs = reports.into_iter();
        let mut points = Vec::with_capacity(combinations.len());
        for combination in combinations {
            let reports: Vec<SimReport> = runs.by_ref().take(seeds).collect();
            points.push(GridPoint {
                values: combination.iter().map(|value| (*value).to_owned()).collect(),
                interval_minutes: mean_interval_minutes(&reports),
                outcome: outcome(reports)?,
            });
        }
        Ok((points, events))
    }
}

/// One report as it is; several as replications.
fn outcome(mut reports: Vec<SimReport>) -> Result<Outcome, SimulateError> {
    if reports.len() == 1
        && let Some(report) = reports.pop()
    {
        return Ok(Outcome::Report(report));
    }
    Ok(Outcome::Replications(Replications::of(&reports)?))
}

/// The mean of the runs' checkpoint intervals in minutes; none if a run has none.
fn mean_interval_minutes(reports: &[SimReport]) -> Option<f64> {
    let minutes: Option<Vec<f64>> = reports.iter().map(plot::simulated_interval_minutes).collect();
    let minutes = minutes.filter(|minutes| !minutes.is_empty())?;
    Some(minutes.iter().sum::<f64>() / minutes.len() as f64)
}

/// `combination`'s values paired with the keys of `sweeps`.
fn named(sweeps: &[&Sweep], combination: &[&str]) -> Vec<(String, String)> {
    sweeps
        .iter()
        .zip(combination)
        .map(|(sweep, value)| (sweep.key.clone(), (*value).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::config::Interval;
    use crate::run;

    fn sweep(key: &str, values: &[&str]) -> Sweep {
        Sweep { key: key.to_owned(), values: values.iter().map(|v| (*v).to_owned()).collect() }
    }

    fn seeds(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    /// A fleet small enough to simulate in a test, failing often.
    fn small() -> Vec<(String, String)> {
        [
            ("fleet.nodes", "4"),
            ("fleet.spares", "1"),
            ("fleet.duration", "6h"),
            ("failures.rate_per_node_day", "2"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    #[test]
    fn at_most_two_different_settings_are_swept() {
        let a = sweep("fleet.spares", &["1", "2"]);
        let b = sweep("job.checkpoint_every", &["10m"]);
        let c = sweep("fleet.nodes", &["8"]);
        assert!(matches!(Swept::of(&[]).unwrap(), Swept::Nothing));
        assert!(matches!(Swept::of(std::slice::from_ref(&a)).unwrap(), Swept::One(_)));
        assert!(matches!(Swept::of(&[a.clone(), b.clone()]).unwrap(), Swept::Two(_, _)));
        let err = Swept::of(&[a.clone(), b, c]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--sweep: at most two settings (a grid), got 3: fleet.spares, \
             job.checkpoint_every, fleet.nodes"
        );
        let err = Swept::of(&[a.clone(), sweep("fleet.spares", &["3"])]).unwrap_err();
        assert!(err.to_string().contains("--sweep fleet.spares is given twice"), "{err}");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn a_grid_runs_the_first_keys_values_as_rows_and_each_seed_in_turn() {
        let sweeps =
            [sweep("fleet.spares", &["1", "2"]), sweep("job.checkpoint_every", &["10m", "1h"])];
        let plan = Plan { swept: Swept::of(&sweeps).unwrap(), seeds: seeds(2) };
        assert_eq!(
            plan.swept.combinations(),
            [["1", "10m"], ["1", "1h"], ["2", "10m"], ["2", "1h"]]
        );
        let mut base = small();
        base.push(("fleet.seed".to_owned(), "41".to_owned()));
        let configs = plan.configs(None, OwnInputs::default(), &base).unwrap();
        let minutes = |m: u64| Interval::Every(std::time::Duration::from_secs(m * 60));
        let runs: Vec<(u32, Interval, u64)> = configs
            .iter()
            .map(|c| (c.fleet.spares, c.job.checkpoint_every, c.fleet.seed))
            .collect();
        assert_eq!(
            runs,
            [
                (1, minutes(10), 41),
                (1, minutes(10), 42),
                (1, minutes(60), 41),
                (1, minutes(60), 42),
                (2, minutes(10), 41),
                (2, minutes(10), 42),
                (2, minutes(60), 41),
                (2, minutes(60), 42),
            ]
        );
    }

    #[test]
    fn one_seed_runs_the_setting_as_it_is() {
        let plan = Plan { swept: Swept::Nothing, seeds: seeds(1) };
        assert_eq!(plan.swept.combinations(), [Vec::<&str>::new()]);
        let configs = plan.configs(None, OwnInputs::default(), &small()).unwrap();
        assert_eq!(configs, [SimConfig::load(None, &small()).unwrap()]);
    }

    #[test]
    fn seeds_past_the_last_the_settings_take_are_refused() {
        let mut base = small();
        base.push(("fleet.seed".to_owned(), (i64::MAX - 1).to_string()));
        let plan = Plan { swept: Swept::Nothing, seeds: seeds(2) };
        let last: Vec<u64> = plan
            .configs(None, OwnInputs::default(), &base)
            .unwrap()
            .iter()
            .map(|c| c.fleet.seed)
            .collect();
        assert_eq!(last, [LAST_SEED - 1, LAST_SEED]);
        let plan = Plan { swept: Swept::Nothing, seeds: seeds(3) };
        let err = plan.configs(None, OwnInputs::default(), &base).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert_eq!(
            err.to_string(),
            format!(
                "--seeds 3 from fleet.seed {}: the seeds would pass 2^63 - 1, the highest fleet.seed takes",
                i64::MAX - 1
            )
        );
    }

    #[test]
    fn a_bad_combination_is_named_by_every_swept_value() {
        let sweeps = [sweep("fleet.nodes", &["4"]), sweep("fleet.spares", &["1", "9"])];
        let plan = Plan { swept: Swept::of(&sweeps).unwrap(), seeds: seeds(1) };
        let err = plan.configs(None, OwnInputs::default(), &[]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let message = err.to_string();
        assert!(
            message.starts_with("settings with --sweep fleet.nodes=4 --sweep fleet.spares=9: "),
            "{message}"
        );
    }

    #[test]
    fn seeds_run_in_parallel_report_what_one_at_a_time_does() {
        let plan = Plan { swept: Swept::Nothing, seeds: seeds(3) };
        let configs = plan.configs(None, OwnInputs::default(), &small()).unwrap();
        let (points, all_events) = plan.run(&configs, 3, None).unwrap();
        let one_by_one: Vec<SimReport> = (1..=3)
            .map(|seed| {
                let mut overrides = small();
                overrides.push(("fleet.seed".to_owned(), seed.to_string()));
                run::simulate(&SimConfig::load(None, &overrides).unwrap(), None).unwrap()
            })
            .collect();
        assert_eq!(points.len(), 1);
        assert_eq!(
            points[0].outcome,
            Outcome::Replications(Replications::of(&one_by_one).unwrap())
        );
        assert_eq!(all_events, events(&one_by_one));
        let ettrs: Vec<f64> = one_by_one.iter().map(|report| report.ettr).collect();
        assert!(ettrs.windows(2).any(|pair| pair[0] != pair[1]), "the seeds agree: {ettrs:?}");
    }

    #[test]
    fn a_parallel_grid_reports_what_one_run_at_a_time_does() {
        let sweeps =
            [sweep("fleet.seed", &["1", "2"]), sweep("job.checkpoint_every", &["10m", "1h"])];
        let plan = Plan { swept: Swept::of(&sweeps).unwrap(), seeds: seeds(1) };
        let configs = plan.configs(None, OwnInputs::default(), &small()).unwrap();
        let (points, _) = plan.run(&configs, 4, None).unwrap();
        let values: Vec<Vec<&str>> =
            points.iter().map(|p| p.values.iter().map(String::as_str).collect()).collect();
        assert_eq!(values, [["1", "10m"], ["1", "1h"], ["2", "10m"], ["2", "1h"]]);
        for (point, config) in points.iter().zip(&configs) {
            let alone = run::simulate(config, None).unwrap();
            assert_eq!(point.outcome, Outcome::Report(alone));
        }
        let Outcome::Report(last) = &points[3].outcome else { panic!("one seed, one report") };
        assert_eq!((last.setting.seed, last.setting.checkpoint_every.as_str()), (2, "1h"));
        assert_eq!(points[3].interval_minutes, Some(60.0));
        assert!(
            points
                .iter()
                .any(|p| matches!(&p.outcome, Outcome::Report(r) if r.failures.node_failures > 0)),
            "no failure struck"
        );
    }
}
