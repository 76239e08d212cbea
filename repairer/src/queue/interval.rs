//! `--checkpoint-every auto`: the Young/Daly interval √(2·C·M), where C is the job's measured
//! checkpoint cost and M the observed mean time between failures of jobs of its size.

use super::job::Job;

/// The Young/Daly checkpoint interval in steps: √(2·C·M) seconds at `steps_per_second`, at
/// least 1. `None` until the cost and the step rate have been measured.
pub fn young_daly_steps(
    checkpoint_seconds: Option<f64>,
    mtbf_seconds: f64,
    steps_per_second: Option<f64>,
) -> Option<u64> {
    let cost = checkpoint_seconds.filter(|c| c.is_finite() && *c >= 0.0)?;
    let rate = steps_per_second.filter(|r| r.is_finite() && *r > 0.0)?;
    if !mtbf_seconds.is_finite() || mtbf_seconds <= 0.0 {
        return None;
    }
    let seconds = (2.0 * cost * mtbf_seconds).sqrt();
    let steps = (seconds * rate).round();
    Some(if steps < 1.0 { 1 } else { steps.min(u64::MAX as f64) as u64 })
}

/// The observed mean time between failures, in seconds, of jobs of `nodes` ranks: their attempts'
/// running time over the attempts that ended in a failure; `None` when none failed yet.
pub fn observed_mtbf_seconds<'a>(
    jobs: impl IntoIterator<Item = &'a Job>,
    nodes: u32,
    now: u64,
) -> Option<f64> {
    let mut running_ms: u64 = 0;
    let mut failures: u64 = 0;
    for job in jobs.into_iter().filter(|j| j.spec.nodes == nodes) {
        for attempt in &job.history {
            running_ms += attempt.ended_ms.unwrap_or(now).saturating_sub(attempt.started_ms);
            failures += u64::from(attempt.failed);
        }
    }
    (failures > 0).then(|| running_ms as f64 / 1000.0 / failures as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn young_daly_is_the_square_root_of_twice_cost_times_mtbf_in_steps() {
        // C = 2 s, M = 1 h: √(2·2·3600) = 120 s; at 0.5 steps/s that is 60 steps.
        assert_eq!(young_daly_steps(Some(2.0), 3600.0, Some(0.5)), Some(60));
        // C = 8 s, M = 4 h: √(2·8·14400) = 480 s; at 10 steps/s, 4,800 steps.
        assert_eq!(young_daly_steps(Some(8.0), 14_400.0, Some(10.0)), Some(4800));
        // Quadrupling M doubles the interval.
        assert_eq!(young_daly_steps(Some(2.0), 4.0 * 3600.0, Some(0.5)), Some(120));
        // A cheap checkpoint on a slow job still checkpoints at least every step.
        assert_eq!(young_daly_steps(Some(0.0001), 1.0, Some(0.01)), Some(1));
        // Nothing measured yet: no interval.
        assert_eq!(young_daly_steps(None, 3600.0, Some(1.0)), None);
        assert_eq!(young_daly_steps(Some(1.0), 3600.0, None), None);
        assert_eq!(young_daly_steps(Some(1.0), 3600.0, Some(0.0)), None);
    }
}
