//! The GPU's NVLink links: `nvlink_down` (links inactive, or fewer active than expected) and
//! `nvlink_errors` (a CRC error rate above the limit, or a link recovery within the window), with
//! the link metrics.

use std::collections::BTreeMap;
use std::time::SystemTime;

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::{Counters, GpuConfig, Rise, gpu_finding, gpu_sample, human, rate_per_second};
use crate::checks::Observation;
use crate::gpu::GpuState;
use crate::metrics;

/// What the links of one GPU showed on this run.
#[derive(Debug, Default)]
struct LinkErrors {
    /// Links listed as inactive.
    down: Vec<u32>,
    /// Links whose CRC error rate is above the limit, with the rate.
    fast_crc: Vec<(u32, f64)>,
    /// Links whose recovery count rose within the window.
    recovering: Vec<u32>,
    /// The highest CRC error rate of any link, once there is an earlier reading.
    worst_crc_rate: Option<f64>,
}

/// `nvlink_down` and `nvlink_errors` of one GPU, with the NVLink metrics. The CRC counters go
/// into `current` for the next run's rates; `recoveries` keeps the recovery counts by (GPU, link).
pub(super) fn observe(
    gpu: &GpuState,
    cfg: &GpuConfig,
    recoveries: &mut BTreeMap<(u32, u32), Rise>,
    previous: &Counters,
    current: &mut Counters,
    now: SystemTime,
    out: &mut Observation,
) {
    if gpu.nvlinks.is_empty() {
        // A GPU that answers but lists no link has none up; one that does not answer is
        // `gpu_access`'s to report.
        if let Some(expected) = cfg.expected_nvlinks
            && gpu.condition.is_responding()
        {
            out.findings.push(nvlink_down_finding(gpu, &[], Some(expected)));
        }
        return;
    }
    let sample = |desc: &'static metrics::MetricDesc, value: f64| gpu_sample(gpu, desc, value);
    let mut seen = LinkErrors::default();
    for link in &gpu.nvlinks {
        let label = link.link.to_string();
        out.samples.push(
            sample(&metrics::GPU_NVLINK_UP, if link.active { 1.0 } else { 0.0 })
                .label("link", label.clone()),
        );
        for (kind, count) in [
            ("crc_flit", link.crc_flit),
            ("crc_data", link.crc_data),
            ("replay", link.replay),
            ("recovery", link.recovery),
        ] {
            if let Some(count) = count {
                out.samples.push(
                    sample(&metrics::GPU_NVLINK_ERRORS, count as f64)
                        .label("link", label.clone())
                        .label("kind", kind),
                );
            }
        }
        if !link.active {
            seen.down.push(link.link);
        }
        if link.crc_flit.is_some() || link.crc_data.is_some() {
            let crc = link.crc_flit.unwrap_or(0).saturating_add(link.crc_data.unwrap_or(0));
            current.nvlink_crc.insert(link.link, crc);
            let before = previous.nvlink_crc.get(&link.link).copied();
            if let Some(rate) = rate_per_second(previous.at.zip(before), now, crc) {
                seen.worst_crc_rate = Some(seen.worst_crc_rate.map_or(rate, |w: f64| w.max(rate)));
                if rate > cfg.nvlink_crc_errors_warn_per_second {
                    seen.fast_crc.push((link.link, rate));
                }
            }
        }
        if let Some(count) = link.recovery {
            let rise = recoveries.entry((gpu.index, link.link)).or_default();
            rise.observe(count, now);
            if rise.active(now, cfg.nvlink_error_window) {
                seen.recovering.push(link.link);
            }
        }
    }
    out.findings.push(nvlink_down_finding(gpu, &seen.down, cfg.expected_nvlinks));
    out.findings.push(nvlink_errors_finding(gpu, cfg, &seen));
}

fn join_links(links: &[u32]) -> String {
    links.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// `nvlink_down` of one GPU: the listed links that are inactive in `down`, and, with `expected`,
/// the links the GPU should have active (links the driver does not list count as down).
fn nvlink_down_finding(gpu: &GpuState, down: &[u32], expected: Option<u32>) -> Finding {
    let listed = u32::try_from(gpu.nvlinks.len()).unwrap_or(u32::MAX);
    let active = listed.saturating_sub(u32::try_from(down.len()).unwrap_or(u32::MAX));
    let inactive =
        if down.is_empty() { String::new() } else { format!("; inactive: {}", join_links(down)) };
    let (missing, message) = match expected {
        Some(expected) => {
            let unlisted = expected.saturating_sub(listed);
            let unlisted = if unlisted > 0 {
                format!("; {unlisted} not listed by the driver")
            } else {
                String::new()
            };
            (
                expected.saturating_sub(active),
                format!("{active} of {expected} expected NVLink links active{inactive}{unlisted}"),
            )
        }
        None if down.is_empty() => (0, format!("all {listed} NVLink links active")),
        None => (
            u32::try_from(down.len()).unwrap_or(u32::MAX),
            format!("{} of {listed} NVLink links inactive: {}", down.len(), join_links(down)),
        ),
    };
    let finding = if missing == 0 {
        gpu_finding(gpu, "nvlink_down", Status::Ok, RecommendedAction::None, message)
    } else {
        gpu_finding(gpu, "nvlink_down", Status::Fail, RecommendedAction::ResetGpu, message)
    };
    let finding =
        if down.is_empty() { finding } else { finding.with_label("links", join_links(down)) };
    finding.with_value(f64::from(missing))
}

/// `nvlink_errors` of one GPU: `warn` for CRC bursts and recent recoveries, naming the links.
fn nvlink_errors_finding(gpu: &GpuState, cfg: &GpuConfig, seen: &LinkErrors) -> Finding {
    let mut problems = Vec::new();
    if !seen.fast_crc.is_empty() {
        let links: Vec<String> =
            seen.fast_crc.iter().map(|(link, rate)| format!("{link} ({rate:.0}/s)")).collect();
        problems.push(format!(
            "CRC errors above {}/s on link(s) {}",
            cfg.nvlink_crc_errors_warn_per_second,
            links.join(", ")
        ));
    }
    if !seen.recovering.is_empty() {
        problems.push(format!(
            "link recovery within the last {} on link(s) {}",
            human(cfg.nvlink_error_window),
            join_links(&seen.recovering)
        ));
    }
    let mut bad_links: Vec<u32> = seen
        .fast_crc
        .iter()
        .map(|(link, _)| *link)
        .chain(seen.recovering.iter().copied())
        .collect();
    bad_links.sort_unstable();
    bad_links.dedup();
    let finding = if problems.is_empty() {
        let message = "no NVLink CRC bursts or recent recoveries".to_owned();
        gpu_finding(gpu, "nvlink_errors", Status::Ok, RecommendedAction::None, message)
    } else {
        let message = problems.join("; ");
        gpu_finding(gpu, "nvlink_errors", Status::Warn, RecommendedAction::None, message)
            .with_label("links", join_links(&bad_links))
    };
    match seen.worst_crc_rate {
        Some(rate) => finding.with_value(rate),
        None => finding,
    }
}
