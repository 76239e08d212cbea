//! `throttle`: clocks held down by the hardware. Brief slowdowns under load are normal; one seen
//! on `throttle_sustained_runs` runs in a row is a cooling or power-delivery fault.

use std::collections::BTreeMap;
use std::time::SystemTime;

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::{gpu_finding, gpu_sample, human};
use crate::checks::Observation;
use crate::gpu::{ClockEventReason, GpuState};
use crate::metrics;

/// A hardware slowdown seen on consecutive runs: how many, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Streak {
    runs: u32,
    since: SystemTime,
}

/// The throttle metric of every clock event reason and the `throttle` finding of one GPU, where
/// the backend reports its reasons; `streaks` keeps each GPU's hardware slowdown across runs.
pub(super) fn observe(
    gpu: &GpuState,
    streaks: &mut BTreeMap<u32, Streak>,
    sustained_runs: u32,
    now: SystemTime,
    out: &mut Observation,
) {
    let Some(reasons) = &gpu.clock_event_reasons else {
        streaks.remove(&gpu.index);
        return;
    };
    for reason in ClockEventReason::ALL {
        let active = if reasons.contains(&reason) { 1.0 } else { 0.0 };
        out.samples
            .push(gpu_sample(gpu, &metrics::GPU_THROTTLE, active).label("reason", reason.as_str()));
    }
    out.findings.push(throttle_finding(gpu, reasons, streaks, sustained_runs, now));
}

/// `throttle` of one GPU from its active clock event reasons, keeping the streak of runs in a row
/// with a hardware slowdown. Software power capping, sync boost and idling are not slowdowns: they
/// are settings and load, not faults.
fn throttle_finding(
    gpu: &GpuState,
    reasons: &[ClockEventReason],
    streaks: &mut BTreeMap<u32, Streak>,
    sustained_runs: u32,
    now: SystemTime,
) -> Finding {
    let slowdowns: Vec<&str> =
        reasons.iter().filter(|r| r.is_slowdown()).map(|r| r.as_str()).collect();
    if slowdowns.is_empty() {
        streaks.remove(&gpu.index);
        return gpu_finding(
            gpu,
            "throttle",
            Status::Ok,
            RecommendedAction::None,
            "no hardware or thermal slowdown".to_owned(),
        );
    }
    let streak = streaks.entry(gpu.index).or_insert(Streak { runs: 0, since: now });
    streak.runs = streak.runs.saturating_add(1);
    let runs = streak.runs;
    // A clock that went back counts as no time.
    let lasting = human(now.duration_since(streak.since).unwrap_or_default());
    let sustained_runs = sustained_runs.max(1);
    let reasons = slowdowns.join(", ");
    let finding = if runs >= sustained_runs {
        gpu_finding(
            gpu,
            "throttle",
            Status::Fail,
            RecommendedAction::Drain,
            format!(
                "clocks held down by {reasons} on {runs} runs in a row (for {lasting}): a cooling or power fault"
            ),
        )
    } else {
        gpu_finding(
            gpu,
            "throttle",
            Status::Warn,
            RecommendedAction::None,
            format!(
                "clocks slowed down: {reasons} (on {runs} of {sustained_runs} runs in a row, for {lasting})"
            ),
        )
    };
    finding.with_value(f64::from(runs))
}
