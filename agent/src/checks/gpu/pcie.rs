//! The GPU's PCIe link: `pcie_link` (trained narrower than its widest) and `pcie_replays` (the
//! replay rate against the vendor's figure for the link, or the configured one).

use std::time::SystemTime;

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::{Counters, GpuConfig, gpu_finding, gpu_sample, rate_per_second};
use crate::checks::Observation;
use crate::gpu::GpuState;
use crate::metrics;

/// The vendor's PCIe replay warning rate for a link: replays per lane per minute by generation,
/// times the lanes. An unknown generation or width takes the most lenient figure (Gen5 x16).
pub fn pcie_replay_warn_per_minute(generation: Option<u32>, width: Option<u32>) -> f64 {
    let per_lane = match generation {
        Some(0..=3) => 0.48,
        Some(4) => 0.96,
        Some(_) | None => 1.92,
    };
    per_lane * f64::from(width.filter(|&w| w > 0).unwrap_or(16))
}

/// `pcie_link` of one GPU, where the backend reports its width: narrower than its widest fails
/// with `reboot` (a boot retrains it). The generation is not judged, since an idle GPU lowers it
/// to save power.
pub(super) fn link_finding(gpu: &GpuState) -> Option<Finding> {
    let (width, max) = gpu.pcie_link_width.zip(gpu.pcie_link_width_max)?;
    Some(if width < max {
        gpu_finding(
            gpu,
            "pcie_link",
            Status::Fail,
            RecommendedAction::Reboot,
            format!("PCIe link trained at x{width} of x{max}: a fraction of its bandwidth"),
        )
        .with_value(f64::from(width))
    } else {
        let message = format!("PCIe link x{width} of x{max}");
        gpu_finding(gpu, "pcie_link", Status::Ok, RecommendedAction::None, message)
    })
}

/// `pcie_replays` of one GPU and its metric, where the backend reports the count: the rate
/// against `previous`, warning above the limit; the count goes into `current` for the next run.
pub(super) fn observe_replays(
    gpu: &GpuState,
    cfg: &GpuConfig,
    previous: &Counters,
    current: &mut Counters,
    now: SystemTime,
    out: &mut Observation,
) {
    let Some(replays) = gpu.pcie_replays else { return };
    out.samples.push(gpu_sample(gpu, &metrics::GPU_PCIE_REPLAYS, replays as f64));
    current.pcie_replays = Some(replays);
    let limit = cfg
        .pcie_replays_warn_per_minute
        .unwrap_or_else(|| pcie_replay_warn_per_minute(gpu.pcie_link_gen, gpu.pcie_link_width));
    let rate = rate_per_second(previous.at.zip(previous.pcie_replays), now, replays)
        .map(|per_second| per_second * 60.0);
    let ok = |message: String| {
        gpu_finding(gpu, "pcie_replays", Status::Ok, RecommendedAction::None, message)
    };
    let finding = match rate {
        Some(rate) if rate > limit => gpu_finding(
            gpu,
            "pcie_replays",
            Status::Warn,
            RecommendedAction::None,
            format!("{rate:.1} PCIe replays per minute (warns above {limit:.2})"),
        ),
        Some(rate) => ok(format!("{rate:.1} PCIe replays per minute (warns above {limit:.2})")),
        None => ok(format!("{replays} PCIe replays; rate from the next run")),
    };
    out.findings.push(match rate {
        Some(rate) => finding.with_value(rate),
        None => finding,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_replay_limits_follow_generation_and_width() {
        assert!((pcie_replay_warn_per_minute(Some(5), Some(16)) - 30.72).abs() < 1e-9);
        assert!((pcie_replay_warn_per_minute(Some(4), Some(16)) - 15.36).abs() < 1e-9);
        assert!((pcie_replay_warn_per_minute(Some(3), Some(8)) - 3.84).abs() < 1e-9);
        assert!((pcie_replay_warn_per_minute(None, None) - 30.72).abs() < 1e-9);
    }
}
