//! What a GPU reports about its load and settings: temperature (judged against the configured
//! limit), power, clocks, utilization and memory in use (metrics only), and persistence mode.

use fleetmend_proto::{RecommendedAction, Status};

use super::{gpu_finding, gpu_sample};
use crate::checks::Observation;
use crate::gpu::GpuState;
use crate::metrics;

/// `temperature` (`warn` from `warn_at`), with the temperature, power, clock, utilization and
/// memory metrics.
pub(super) fn observe_load(gpu: &GpuState, warn_at: u32, out: &mut Observation) {
    let sample = |desc: &'static metrics::MetricDesc, value: f64| gpu_sample(gpu, desc, value);
    let samples = &mut out.samples;
    if let Some(celsius) = gpu.temperature_celsius {
        samples.push(sample(&metrics::GPU_TEMPERATURE, f64::from(celsius)));
        let message = format!("{celsius} °C (warns at {warn_at} °C)");
        let status = if celsius >= warn_at { Status::Warn } else { Status::Ok };
        out.findings.push(
            gpu_finding(gpu, "temperature", status, RecommendedAction::None, message)
                .with_value(f64::from(celsius)),
        );
    }
    if let Some(watts) = gpu.power_watts {
        samples.push(sample(&metrics::GPU_POWER, watts));
    }
    for (clock, mhz) in [("sm", gpu.sm_clock_mhz), ("memory", gpu.memory_clock_mhz)] {
        if let Some(mhz) = mhz {
            samples.push(sample(&metrics::GPU_CLOCK, f64::from(mhz) * 1e6).label("clock", clock));
        }
    }
    for (unit, percent) in
        [("gpu", gpu.utilization_gpu_percent), ("memory", gpu.utilization_memory_percent)]
    {
        if let Some(percent) = percent {
            samples.push(
                sample(&metrics::GPU_UTILIZATION, f64::from(percent) / 100.0).label("unit", unit),
            );
        }
    }
    if let Some(used) = gpu.memory_used_bytes {
        samples.push(sample(&metrics::GPU_MEMORY_USED, used as f64));
    }
    if let Some(total) = gpu.memory_total_bytes {
        samples.push(sample(&metrics::GPU_MEMORY_TOTAL, total as f64));
    }
}

/// `persistence_mode` (off: `warn`) and its metric, where the backend reports it.
pub(super) fn observe_persistence_mode(gpu: &GpuState, out: &mut Observation) {
    let Some(on) = gpu.persistence_mode else { return };
    out.samples.push(gpu_sample(gpu, &metrics::GPU_PERSISTENCE_MODE, if on { 1.0 } else { 0.0 }));
    out.findings.push(if on {
        let message = "persistence mode on".to_owned();
        gpu_finding(gpu, "persistence_mode", Status::Ok, RecommendedAction::None, message)
    } else {
        gpu_finding(
            gpu,
            "persistence_mode",
            Status::Warn,
            RecommendedAction::None,
            "persistence mode is off (slow job starts; the driver may unload between jobs)"
                .to_owned(),
        )
    });
}
