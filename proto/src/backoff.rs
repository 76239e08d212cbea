//! Capped exponential backoff with jitter: how every retry loop of fleetmend waits (the agent's
//! reports, the repairer's workflow steps and alert deliveries, Slurm commands while slurmctld is
//! away, a rank knocking on rank 0's rendezvous).
//!
//! The random part is passed in (`unit`, a draw in `[0, 1)`) rather than drawn here, so each caller
//! keeps its own source: the simulator seeds the generator the repairer's workflows draw from, and
//! a run repeats; a test pins the draw to see the exact bounds.

use std::time::Duration;

/// Waits that double from `initial` up to `max`, each with "equal jitter" (half of the step
/// fixed, half at random): peers that failed together (a fleet that lost its repairer, ranks
/// restarted together) spread their retries out, and none comes back sooner than half its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The step of the first retry.
    pub initial: Duration,
    /// The largest step, however many retries failed.
    pub max: Duration,
}

impl Backoff {
    /// Steps from `initial`, doubling, up to `max`.
    pub const fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max }
    }

    /// The step of retry number `retry` (1-based), before jitter: `initial * 2^(retry - 1)`, at
    /// most `max`.
    pub fn step(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// The wait before retry number `retry` (1-based): from half of its [`Backoff::step`] (`unit`
    /// 0) to all of it (`unit` 1). `unit` is a random draw in `[0, 1)`; outside, it is clamped.
    pub fn delay(&self, retry: u32, unit: f64) -> Duration {
        let half = self.step(retry) / 2;
        half + half.mul_f64(fraction(unit))
    }

    /// The wait after a peer refused and asked to be called again after `asked` (`Retry-After`):
    /// not sooner, but at most `max` (a proxy's hour-long `Retry-After` must not silence the caller
    /// for an hour), plus up to half as long again (at least half of `initial`) by `unit`, so
    /// callers refused in the same second do not all come back in the same second.
    pub fn after_asked(&self, asked: Duration, unit: f64) -> Duration {
        let floor = asked.min(self.max);
        floor + floor.max(self.initial).mul_f64(0.5 * fraction(unit))
    }
}

/// `unit` within `[0, 1]` (a NaN counts as 0: `Duration::mul_f64` panics on one).
fn fraction(unit: f64) -> f64 {
    if unit.is_nan() { 0.0 } else { unit.clamp(0.0, 1.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn backoff() -> Backoff {
        Backoff::new(100 * MS, 2000 * MS)
    }

    #[test]
    fn steps_double_from_initial_up_to_the_cap() {
        let steps: Vec<Duration> = (1..=7).map(|retry| backoff().step(retry)).collect();
        let millis = [100, 200, 400, 800, 1600, 2000, 2000];
        assert_eq!(steps, millis.map(|m| m * MS));
        // Retry 0 (a caller counting from zero by mistake) is the first step, not half of it.
        assert_eq!(backoff().step(0), 100 * MS);
    }

    #[test]
    fn the_step_never_overflows_and_stays_at_the_cap() {
        let long = Backoff::new(Duration::from_secs(3600), Duration::MAX);
        assert_eq!(long.step(u32::MAX), Duration::from_secs(3600).saturating_mul(1 << 31));
        assert_eq!(backoff().step(u32::MAX), 2000 * MS);
        assert_eq!(backoff().delay(u32::MAX, 0.999), 1000 * MS + (1000 * MS).mul_f64(0.999));
    }

    #[test]
    fn a_first_step_above_the_cap_is_the_cap() {
        let inverted = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(inverted.step(1), Duration::from_secs(1));
        assert_eq!(inverted.delay(1, 1.0), Duration::from_secs(1));
    }

    #[test]
    fn the_jitter_spans_the_upper_half_of_the_step() {
        for retry in 1..=8 {
            let step = backoff().step(retry);
            assert_eq!(backoff().delay(retry, 0.0), step / 2, "retry {retry}");
            assert_eq!(backoff().delay(retry, 1.0), step, "retry {retry}");
            assert_eq!(backoff().delay(retry, 0.5), step / 2 + step / 4, "retry {retry}");
        }
    }

    #[test]
    fn delays_with_the_same_draw_grow_with_each_retry_until_the_cap() {
        for unit in [0.0, 0.3, 0.999] {
            let delays: Vec<Duration> = (1..=10).map(|r| backoff().delay(r, unit)).collect();
            assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{unit}: {delays:?}");
            assert!(delays[..5].windows(2).all(|w| w[0] < w[1]), "{unit}: {delays:?}");
            assert_eq!(delays[5], delays[9], "{unit}: capped");
        }
    }

    #[test]
    fn draws_across_the_unit_interval_stay_within_bounds_and_spread() {
        let draws: Vec<Duration> =
            (0..200).map(|i| backoff().delay(3, f64::from(i) / 200.0)).collect();
        assert!(draws.iter().all(|d| (200 * MS..400 * MS).contains(d)), "{draws:?}");
        let (low, high) = (draws.iter().min(), draws.iter().max());
        assert!(high.zip(low).is_some_and(|(h, l)| *h - *l > 190 * MS), "{low:?}..{high:?}");
    }

    #[test]
    fn a_draw_outside_the_unit_interval_is_clamped() {
        assert_eq!(backoff().delay(1, -3.0), 50 * MS);
        assert_eq!(backoff().delay(1, 7.0), 100 * MS);
        assert_eq!(backoff().delay(1, f64::NAN), 50 * MS);
        assert_eq!(backoff().after_asked(Duration::ZERO, f64::INFINITY), 50 * MS);
    }

    #[test]
    fn a_refusal_is_waited_out_with_jitter_and_capped() {
        let backoff = Backoff::new(500 * MS, Duration::from_secs(30));
        let asked = Duration::from_secs(2);
        assert_eq!(backoff.after_asked(asked, 0.0), asked);
        assert_eq!(backoff.after_asked(asked, 1.0), Duration::from_secs(3));
        // Asked for an hour: the cap, and up to half of it again.
        let hour = Duration::from_secs(3600);
        assert_eq!(backoff.after_asked(hour, 0.0), Duration::from_secs(30));
        assert_eq!(backoff.after_asked(hour, 1.0), Duration::from_secs(45));
        // Asked for nothing: up to half of the first step, so refused callers still spread.
        assert_eq!(backoff.after_asked(Duration::ZERO, 0.0), Duration::ZERO);
        assert_eq!(backoff.after_asked(Duration::ZERO, 1.0), 250 * MS);
    }
}
