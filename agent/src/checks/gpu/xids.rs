//! Xid events (`xid`) and the driver's own recovery advice (`recovery_action`).
//!
//! The backend counts Xids by GPU and code; an Xid keeps its finding for `xid_window` after its
//! count last rose, with the action from `xid_actions` or else from the catalog ([`crate::xid`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::{GpuConfig, NAME, Rise, gpu_finding, gpu_sample, human};
use crate::checks::Observation;
use crate::gpu::GpuState;
use crate::metrics::{self, Sample};
use crate::xid;

/// Every Xid the check has seen and what to make of it; kept across runs, and across runs on
/// which the backend could not be read.
#[derive(Debug)]
pub(super) struct Xids {
    /// Actions that override the catalog, by code.
    actions: BTreeMap<u32, RecommendedAction>,
    /// How long an Xid keeps its finding after its count last rose.
    window: Duration,
    /// Xid counts by (GPU, code).
    counts: BTreeMap<(u32, u32), Rise>,
    /// Last known PCI bus id by GPU, for Xid findings of GPUs that stopped answering.
    pci: BTreeMap<u32, String>,
}

impl Xids {
    pub(super) fn new(config: &GpuConfig) -> Self {
        Xids {
            actions: config.parsed_xid_actions(),
            window: config.xid_window,
            counts: BTreeMap::new(),
            pci: BTreeMap::new(),
        }
    }

    /// Remembers the PCI bus id of `gpu`, where it has one.
    pub(super) fn note_pci(&mut self, gpu: &GpuState) {
        if let Some(pci) = &gpu.pci_bus_id {
            self.pci.insert(gpu.index, pci.clone());
        }
    }

    /// Takes the Xid counts of `gpus` and reports every (GPU, code) ever seen: failing (or as the
    /// catalog says) within `xid_window` of the last rise, ok after. A GPU in `gpus` with no Xid
    /// gets one ok `xid` finding.
    pub(super) fn findings(&mut self, gpus: &[GpuState], now: SystemTime, out: &mut Observation) {
        for gpu in gpus {
            for (&code, &count) in &gpu.xid_counts {
                self.counts.entry((gpu.index, code)).or_default().observe(count, now);
            }
        }
        let window = self.window;
        for gpu in gpus {
            if !self.counts.keys().any(|(index, _)| *index == gpu.index) {
                let mut finding = Finding::ok(NAME, "xid", gpu.index.to_string());
                finding.message = "no Xid events".to_owned();
                if let Some(pci) = self.pci.get(&gpu.index) {
                    finding = finding.with_label("pci", pci.clone());
                }
                out.findings.push(finding);
            }
        }
        for (&(index, code), rise) in &self.counts {
            out.samples.push(
                Sample::new(&metrics::GPU_XID_ERRORS, rise.count as f64)
                    .label("gpu", index.to_string())
                    .label("xid", code.to_string()),
            );
            let advice = xid::advice(code);
            let (status, action, source) = match self.actions.get(&code) {
                Some(&action) => (status_for_action(action), action, "config"),
                None => (advice.status, advice.action, "catalog"),
            };
            let mut finding = if rise.active(now, window) {
                Finding::new(
                    NAME,
                    "xid",
                    index.to_string(),
                    status,
                    action,
                    format!(
                        "Xid {code} ({}) on GPU {index}: {} seen, last {} ago; action from the {source}",
                        advice.meaning,
                        rise.count,
                        human(rise.age(now))
                    ),
                )
            } else {
                let mut finding = Finding::ok(NAME, "xid", index.to_string());
                finding.message = format!(
                    "Xid {code} ({}) not seen for {} or more",
                    advice.meaning,
                    human(window)
                );
                finding
            }
            .with_value(f64::from(code))
            .with_label("xid", code.to_string());
            if let Some(pci) = self.pci.get(&index) {
                finding = finding.with_label("pci", pci.clone());
            }
            out.findings.push(finding);
        }
    }
}

/// The status an overriding Xid action implies.
fn status_for_action(action: RecommendedAction) -> Status {
    match action {
        RecommendedAction::None => Status::Ok,
        RecommendedAction::RestartApp => Status::Warn,
        RecommendedAction::Drain
        | RecommendedAction::ResetGpu
        | RecommendedAction::Reboot
        | RecommendedAction::Replace => Status::Fail,
    }
}

/// `recovery_action` of one GPU and its metric, where the driver reports one (r570+).
pub(super) fn observe_recovery_action(gpu: &GpuState, out: &mut Observation) {
    let Some(code) = gpu.recovery_action else { return };
    out.samples.push(gpu_sample(gpu, &metrics::GPU_RECOVERY_ACTION, f64::from(code)));
    let finding = |status: Status, action: RecommendedAction, message: String| {
        gpu_finding(gpu, "recovery_action", status, action, message)
    };
    out.findings.push(
        match xid::recovery_action(code) {
            Some((Status::Ok, _, _)) => finding(
                Status::Ok,
                RecommendedAction::None,
                "the driver asks for no recovery".to_owned(),
            ),
            Some((status, action, what)) => {
                finding(status, action, format!("the driver asks for recovery: {what}"))
            }
            None => finding(
                Status::Warn,
                RecommendedAction::None,
                format!("the driver reports recovery action {code}, unknown to this agent"),
            ),
        }
        .with_value(f64::from(code)),
    );
}
