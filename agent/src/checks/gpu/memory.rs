//! The GPU's memory health: ECC errors (`ecc_uncorrected`), retired pages (`retired_pages`) and
//! remapped rows (`row_remap`), with their metrics.

use fleetmend_proto::{RecommendedAction, Status};

use super::{GpuConfig, gpu_finding, gpu_sample};
use crate::checks::Observation;
use crate::gpu::{EccCounts, GpuState, RemappedRows, RetiredPages};
use crate::metrics;

/// The memory findings and metrics of one GPU, each where the backend reports it.
pub(super) fn observe(gpu: &GpuState, cfg: &GpuConfig, out: &mut Observation) {
    if let Some(ecc) = &gpu.ecc {
        observe_ecc(gpu, ecc, out);
    }
    if let Some(pages) = &gpu.retired_pages {
        observe_retired_pages(gpu, pages, cfg, out);
    }
    if let Some(rows) = &gpu.remapped_rows {
        observe_remapped_rows(gpu, rows, cfg, out);
    }
}

/// The most disruptive action of `reasons` and the reasons as one sentence; `None` when empty.
fn worst(reasons: &[(RecommendedAction, String)]) -> Option<(RecommendedAction, String)> {
    let action = reasons.iter().map(|(action, _)| *action).max_by_key(|a| a.weight())?;
    let text = reasons.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>().join("; ");
    Some((action, text))
}

/// `ecc_uncorrected`: volatile uncorrectable errors fail with `reset-gpu`.
fn observe_ecc(gpu: &GpuState, ecc: &EccCounts, out: &mut Observation) {
    for (kind, count) in [
        ("volatile_corrected", ecc.volatile_corrected),
        ("volatile_uncorrected", ecc.volatile_uncorrected),
        ("aggregate_corrected", ecc.aggregate_corrected),
        ("aggregate_uncorrected", ecc.aggregate_uncorrected),
    ] {
        if let Some(count) = count {
            out.samples
                .push(gpu_sample(gpu, &metrics::GPU_ECC_ERRORS, count as f64).label("kind", kind));
        }
    }
    let Some(dbe) = ecc.volatile_uncorrected else { return };
    let lifetime =
        ecc.aggregate_uncorrected.map(|n| format!(" ({n} in the GPU's life)")).unwrap_or_default();
    out.findings.push(
        if dbe > 0 {
            gpu_finding(
                gpu,
                "ecc_uncorrected",
                Status::Fail,
                RecommendedAction::ResetGpu,
                format!(
                    "{dbe} uncorrectable (double-bit) ECC error(s) since the driver loaded{lifetime}"
                ),
            )
        } else {
            gpu_finding(
                gpu,
                "ecc_uncorrected",
                Status::Ok,
                RecommendedAction::None,
                format!("no uncorrectable ECC errors{lifetime}"),
            )
        }
        .with_value(dbe as f64),
    );
}

/// `retired_pages`: past either limit the GPU is to be replaced; a pending retirement waits for a
/// reboot.
fn observe_retired_pages(
    gpu: &GpuState,
    pages: &RetiredPages,
    cfg: &GpuConfig,
    out: &mut Observation,
) {
    let sample = |desc: &'static metrics::MetricDesc, value: f64| gpu_sample(gpu, desc, value);
    out.samples.push(
        sample(&metrics::GPU_RETIRED_PAGES, pages.single_bit as f64).label("cause", "single_bit"),
    );
    out.samples.push(
        sample(&metrics::GPU_RETIRED_PAGES, pages.double_bit as f64).label("cause", "double_bit"),
    );
    out.samples
        .push(sample(&metrics::GPU_RETIRED_PAGES_PENDING, if pages.pending { 1.0 } else { 0.0 }));
    let total = pages.single_bit.saturating_add(pages.double_bit);
    let mut reasons = Vec::new();
    if total >= u64::from(cfg.retired_pages_fail) {
        reasons.push((
            RecommendedAction::Replace,
            format!("{total} retired pages (limit {})", cfg.retired_pages_fail),
        ));
    }
    if pages.double_bit >= u64::from(cfg.retired_pages_double_bit_fail) {
        reasons.push((
            RecommendedAction::Replace,
            format!(
                "{} pages retired for double-bit errors (limit {})",
                pages.double_bit, cfg.retired_pages_double_bit_fail
            ),
        ));
    }
    if pages.pending {
        reasons
            .push((RecommendedAction::Reboot, "a page retirement waits for a reboot".to_owned()));
    }
    out.findings.push(
        match worst(&reasons) {
            Some((action, text)) => gpu_finding(gpu, "retired_pages", Status::Fail, action, text),
            None => gpu_finding(
                gpu,
                "retired_pages",
                Status::Ok,
                RecommendedAction::None,
                format!("{total} retired pages ({} double-bit), none pending", pages.double_bit),
            ),
        }
        .with_value(total as f64),
    );
}

/// `row_remap`: a failed remap or too many uncorrectable rows is a GPU to replace; a pending remap
/// waits for a GPU reset.
fn observe_remapped_rows(
    gpu: &GpuState,
    rows: &RemappedRows,
    cfg: &GpuConfig,
    out: &mut Observation,
) {
    let sample = |desc: &'static metrics::MetricDesc, value: f64| gpu_sample(gpu, desc, value);
    out.samples.push(
        sample(&metrics::GPU_REMAPPED_ROWS, rows.correctable as f64).label("kind", "correctable"),
    );
    out.samples.push(
        sample(&metrics::GPU_REMAPPED_ROWS, rows.uncorrectable as f64)
            .label("kind", "uncorrectable"),
    );
    out.samples
        .push(sample(&metrics::GPU_REMAPPED_ROWS_PENDING, if rows.pending { 1.0 } else { 0.0 }));
    out.samples
        .push(sample(&metrics::GPU_REMAPPED_ROWS_FAILURE, if rows.failure { 1.0 } else { 0.0 }));
    let mut reasons = Vec::new();
    if rows.failure {
        reasons.push((
            RecommendedAction::Replace,
            "a row remap failed: no spare rows left".to_owned(),
        ));
    }
    if rows.uncorrectable >= u64::from(cfg.remapped_rows_uncorrectable_fail) {
        reasons.push((
            RecommendedAction::Replace,
            format!(
                "{} rows remapped for uncorrectable errors (limit {})",
                rows.uncorrectable, cfg.remapped_rows_uncorrectable_fail
            ),
        ));
    }
    if rows.pending {
        reasons.push((RecommendedAction::ResetGpu, "a row remap waits for a GPU reset".to_owned()));
    }
    out.findings.push(
        match worst(&reasons) {
            Some((action, text)) => gpu_finding(gpu, "row_remap", Status::Fail, action, text),
            None => gpu_finding(
                gpu,
                "row_remap",
                Status::Ok,
                RecommendedAction::None,
                format!(
                    "{} correctable and {} uncorrectable rows remapped, none pending",
                    rows.correctable, rows.uncorrectable
                ),
            ),
        }
        .with_value(rows.uncorrectable as f64),
    );
}
