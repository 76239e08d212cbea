//! How the nic check follows cumulative counters between runs: growth within a window
//! ([`CounterHistory`], for flaps and symbol errors), a per-second rate ([`CounterRate`]) and the
//! latest rise ([`CounterRise`]), each treating a counter that went down as reset.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::NAME;

/// Most counter change points kept per subject for counting within a window (flaps, symbol
/// errors). Each kept point is a change of at least one, so when the cap is hit the count in the
/// window is far above any sane threshold.
const MAX_FLAP_SAMPLES: usize = 256;

/// Shortest time between two samples for a rate: runs triggered close together would otherwise
/// make rates out of noise.
const MIN_RATE_SPAN: Duration = Duration::from_secs(1);

/// Change points of a cumulative counter, for "how much did it grow within the window".
#[derive(Debug, Clone, Default)]
pub(super) struct CounterHistory {
    /// (time first seen at this value, value), oldest first; the first is the baseline.
    points: VecDeque<(SystemTime, u64)>,
}

impl CounterHistory {
    /// Records `value` at `now` and returns its growth within `window` (since the agent first saw
    /// it, when that is later). A counter that went down was reset: it starts again from there.
    pub(super) fn observe(&mut self, now: SystemTime, value: u64, window: Duration) -> u64 {
        if self.points.back().is_some_and(|(_, last)| value < *last) {
            self.points.clear();
        }
        if self.points.back().map(|(_, last)| *last) != Some(value) {
            self.points.push_back((now, value));
        }
        if let Some(cutoff) = now.checked_sub(window) {
            // Keep the newest point at or before the cutoff: the value when the window began.
            while self.points.len() >= 2 && self.points[1].0 <= cutoff {
                self.points.pop_front();
            }
        }
        while self.points.len() > MAX_FLAP_SAMPLES {
            self.points.pop_front();
        }
        self.points.front().map_or(0, |(_, base)| value.saturating_sub(*base))
    }
}

/// Per-second rate of a cumulative counter between runs.
#[derive(Debug, Clone, Default)]
pub(super) struct CounterRate {
    previous: Option<(SystemTime, u64)>,
    rate: Option<f64>,
}

impl CounterRate {
    pub(super) fn observe(&mut self, now: SystemTime, value: u64) -> Option<f64> {
        match self.previous {
            Some((then, before)) => match now.duration_since(then) {
                Ok(span) if span >= MIN_RATE_SPAN => {
                    // A counter that went down was reset; no rate until the next sample.
                    self.rate =
                        (value >= before).then(|| (value - before) as f64 / span.as_secs_f64());
                    self.previous = Some((now, value));
                }
                // Too soon: keep the last rate and the older sample.
                Ok(_) => {}
                // The clock went back: start again.
                Err(_) => {
                    self.rate = None;
                    self.previous = Some((now, value));
                }
            },
            None => self.previous = Some((now, value)),
        }
        self.rate
    }
}

/// A cumulative counter's previous reading and its latest rise.
#[derive(Debug, Clone, Default)]
pub(super) struct CounterRise {
    previous: Option<u64>,
    /// When it last rose, and by how much.
    latest: Option<(SystemTime, u64)>,
}

impl CounterRise {
    /// Takes a reading and returns the rise since the previous one: zero on the first reading
    /// (what happened before the agent looked is the baseline) and when the counter went down (it
    /// was reset: the new value is the baseline).
    pub(super) fn observe(&mut self, now: SystemTime, value: u64) -> u64 {
        let rise = self.previous.map_or(0, |before| value.saturating_sub(before));
        self.previous = Some(value);
        if rise > 0 {
            self.latest = Some((now, rise));
        }
        rise
    }

    /// The latest rise and its age, when it is younger than `window`. A clock that went back
    /// counts as "just now".
    pub(super) fn within(&self, now: SystemTime, window: Duration) -> Option<(u64, Duration)> {
        let (at, rise) = self.latest?;
        match now.duration_since(at) {
            Ok(age) if age < window => Some((rise, age)),
            Ok(_) => None,
            Err(_) => Some((rise, Duration::ZERO)),
        }
    }
}

/// Warns when `flaps` reached `max` within `window`; ok otherwise (also when the counter is not
/// reported: nothing to count).
pub(super) fn flap_finding(
    finding: &str,
    subject: &str,
    flaps: Option<u64>,
    max: u64,
    window: Duration,
    what: &str,
) -> Finding {
    let window = humantime::format_duration(window);
    match flaps {
        Some(flaps) if flaps >= max => Finding::new(
            NAME,
            finding,
            subject,
            Status::Warn,
            RecommendedAction::None,
            format!("{subject} is flapping: {flaps} {what} within {window} (max {max})"),
        )
        .with_value(flaps as f64),
        Some(flaps) => Finding::ok(NAME, finding, subject).with_value(flaps as f64),
        None => Finding::ok(NAME, finding, subject),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flaps_count_within_the_window_only() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        let mut h = CounterHistory::default();
        assert_eq!(h.observe(t0, 10, hour), 0, "boot-time changes are the baseline");
        assert_eq!(h.observe(t0 + Duration::from_secs(60), 14, hour), 4);
        assert_eq!(h.observe(t0 + Duration::from_secs(120), 16, hour), 6);
        // An hour after the first change only the later one is inside the window.
        assert_eq!(h.observe(t0 + hour + Duration::from_secs(90), 16, hour), 2);
        assert_eq!(h.observe(t0 + 3 * hour, 16, hour), 0);
        // Reset (driver reload): starts again.
        assert_eq!(h.observe(t0 + 3 * hour + Duration::from_secs(1), 1, hour), 0);
        for i in 0..1000u64 {
            h.observe(t0 + 4 * hour + Duration::from_secs(i), 100 + i, hour);
        }
        assert!(h.points.len() <= MAX_FLAP_SAMPLES);
    }

    #[test]
    fn rates_need_two_samples_a_second_apart() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut r = CounterRate::default();
        assert_eq!(r.observe(t0, 100), None);
        assert_eq!(r.observe(t0 + Duration::from_millis(10), 150), None);
        assert_eq!(r.observe(t0 + Duration::from_secs(10), 200), Some(10.0));
        assert_eq!(r.observe(t0 + Duration::from_secs(20), 50), None, "reset");
        assert_eq!(r.observe(t0 + Duration::from_secs(30), 50), Some(0.0));
    }

    #[test]
    fn rises_are_against_the_previous_read_and_resets_are_baselines() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let window = Duration::from_secs(900);
        let mut r = CounterRise::default();
        assert_eq!(r.observe(at(0), 7), 0, "what came before the agent is the baseline");
        assert_eq!(r.within(at(0), window), None);
        assert_eq!(r.observe(at(10), 9), 2);
        assert_eq!(r.observe(at(20), 9), 0);
        assert_eq!(r.within(at(20), window), Some((2, Duration::from_secs(10))));
        assert_eq!(r.within(at(910), window), None);
        assert_eq!(r.within(at(5), window), Some((2, Duration::ZERO)), "clock went back");
        assert_eq!(r.observe(at(30), 1), 0, "reset");
        assert_eq!(r.observe(at(40), 2), 1);
    }
}
