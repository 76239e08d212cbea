//! GPU faults: what NVML shows in the GPU fixture (`gpu.json`) and what the NVIDIA driver prints
//! in the kernel log.

use std::fs;
use std::time::Duration;

use fleetmend_agent::gpu::{EccCounts, GpuCondition, GpuSnapshot, GpuState, RemappedRows};

use super::{DOWN_NVLINK, FAULTY_GPU, InjectError, MISSING_GPU};
use crate::tree::{self, GPU_FIXTURE_PATH, NodeTree, TreeError, TreeMeta};

/// `gpu-missing`: GPU [`MISSING_GPU`] gone from the fixture, and what the driver prints when a
/// GPU fails to initialise at load.
pub(super) fn gpu_missing(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
    let mut pci = None;
    edit_gpus(tree, |snapshot| {
        pci = snapshot
            .gpus
            .iter()
            .find(|gpu| gpu.index == MISSING_GPU)
            .and_then(|gpu| gpu.pci_bus_id.clone());
        snapshot.gpus.retain(|gpu| gpu.index != MISSING_GPU);
    })?;
    if let Some(pci) = pci {
        let line =
            format!("NVRM: GPU {}: RmInitAdapter failed! (0x26:0x56:1474)", kernel_pci(&pci, true));
        tree.append_kmsg(meta, &[(3, line)])?;
    }
    Ok(())
}

/// `row-remap-failure`: as on a GPU whose bank ran out of spare rows (the agent's fixture of that
/// case).
pub(super) fn row_remap_failure(tree: &NodeTree) -> Result<(), InjectError> {
    edit_gpu(tree, FAULTY_GPU, |gpu| {
        gpu.remapped_rows =
            Some(RemappedRows { correctable: 12, uncorrectable: 9, pending: false, failure: true });
        let ecc = gpu.ecc.get_or_insert_with(EccCounts::default);
        ecc.aggregate_corrected = Some(ecc.aggregate_corrected.unwrap_or(0).max(212));
        ecc.aggregate_uncorrected = Some(ecc.aggregate_uncorrected.unwrap_or(0).max(9));
    })
}

/// `nvlink-down`: NVLink [`DOWN_NVLINK`] of GPU [`FAULTY_GPU`] inactive.
pub(super) fn nvlink_down(tree: &NodeTree) -> Result<(), InjectError> {
    edit_gpu(tree, FAULTY_GPU, |gpu| {
        for link in gpu.nvlinks.iter_mut().filter(|link| link.link == DOWN_NVLINK) {
            link.active = false;
        }
    })
}

/// `pcie-downtrained`: GPU [`FAULTY_GPU`]'s link trained at x8 of its x16.
pub(super) fn pcie_downtrained(tree: &NodeTree) -> Result<(), InjectError> {
    edit_gpu(tree, FAULTY_GPU, |gpu| {
        gpu.pcie_link_width_max = Some(gpu.pcie_link_width_max.unwrap_or(16).max(16));
        gpu.pcie_link_width = Some(8);
    })
}

/// `gpu-throttle`: GPU [`FAULTY_GPU`] held down by the hardware, hot, its SM clock low.
pub(super) fn gpu_throttle(tree: &NodeTree) -> Result<(), InjectError> {
    edit_gpu(tree, FAULTY_GPU, |gpu| {
        use fleetmend_agent::gpu::ClockEventReason::{HwSlowdown, HwThermalSlowdown};
        gpu.clock_event_reasons = Some(vec![HwSlowdown, HwThermalSlowdown]);
        gpu.temperature_celsius = Some(94);
        gpu.sm_clock_mhz = Some(1095);
    })
}

/// The kernel-log address of GPU [`FAULTY_GPU`] (`0000:5d:00`, or with its function).
fn faulty_gpu_pci(tree: &NodeTree, with_function: bool) -> Result<String, InjectError> {
    let mut pci = None;
    edit_gpu(tree, FAULTY_GPU, |gpu| pci = gpu.pci_bus_id.clone())?;
    Ok(pci.map_or_else(|| "0000:5d:00.0".to_owned(), |pci| kernel_pci(&pci, true)))
        .map(|pci| if with_function { pci } else { kernel_pci(&pci, false) })
}

/// What the driver prints when it probes a GPU that is off the bus (osapi.c,
/// `rm_is_supported_device`): one record of three lines, no Xid; NVML then lists the GPU no more.
pub(super) fn gpu_lost(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
    let pci = faulty_gpu_pci(tree, true)?;
    edit_gpus(tree, |snapshot| snapshot.gpus.retain(|gpu| gpu.index != FAULTY_GPU))?;
    // /dev/kmsg escapes the record's newlines as \x0a.
    let message = format!(
        "NVRM: The NVIDIA GPU {pci}\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands."
    );
    tree.append_kmsg(
        meta,
        &[(3, message), (3, "NVRM: The NVIDIA probe routine failed for 1 device(s).".to_owned())],
    )
    .map_err(InjectError::from)
}

/// Five incidents of Xid 13 on one GPC and TPC, two seconds apart, each printing its two lines
/// at once (the pattern NVIDIA's catalog calls a hardware fault).
pub(super) fn xid_burst(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
    let pci = faulty_gpu_pci(tree, false)?;
    let mut lines = Vec::new();
    for incident in (0..5u64).rev() {
        let ago = Duration::from_secs(incident * 2);
        for what in ["Warp Exception", "Global Exception"] {
            lines.push((
                4,
                ago,
                format!(
                    "NVRM: Xid (PCI:{pci}): 13, pid=4242, name=python3, Graphics SM {what} on (GPC 1, TPC 2, SM 0): Out Of Range Address"
                ),
            ));
        }
    }
    tree.append_kmsg_ago(meta, &lines).map_err(InjectError::from)
}

/// A GSP RPC timeout as drivers since 550 print it, and the driver's verdict on the GPU.
pub(super) fn gsp_timeout(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
    let pci = faulty_gpu_pci(tree, false)?;
    edit_gpu(tree, FAULTY_GPU, |gpu| *gpu.xid_counts.entry(119).or_insert(0) += 1)?;
    let lines = [
        format!(
            "NVRM: Xid (PCI:{pci}): 119, pid=123417, name=nv-hostengine, Timeout after 6s of waiting for RPC response from GPU{FAULTY_GPU} GSP! Expected function 10 (FREE) (0xc0000005 0x0)."
        ),
        format!(
            "NVRM: GPU{FAULTY_GPU} GSP RPC buffer contains function 10 (FREE) and data 0x00000000c0000005 0x0000000000000000."
        ),
        format!(
            "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:{pci} (printing 1 of every 30).  The GPU likely needs to be reset."
        ),
    ];
    tree.append_kmsg(meta, &lines.map(|line| (4, line))).map_err(InjectError::from)
}

/// The PCI address as the kernel log prints it: NVML's `00000000:5d:00.0` as `0000:5d:00` (Xid
/// lines) or `0000:5d:00.0` (`with_function`).
fn kernel_pci(nvml: &str, with_function: bool) -> String {
    let short = match nvml.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => nvml.to_owned(),
    };
    if with_function {
        short
    } else {
        short.split_once('.').map_or(short.clone(), |(address, _)| address.to_owned())
    }
}

pub(super) fn gpu_xid(tree: &NodeTree, meta: &TreeMeta, code: u32) -> Result<(), InjectError> {
    let mut pci = None;
    edit_gpu(tree, FAULTY_GPU, |gpu| {
        pci = gpu.pci_bus_id.clone();
        match code {
            79 => {
                // A GPU off the bus answers nothing: NVML fails its first query, GPU_IS_LOST.
                let kept = GpuState {
                    index: gpu.index,
                    condition: GpuCondition::Lost,
                    error: Some("temperature: GPU is lost".to_owned()),
                    pci_bus_id: gpu.pci_bus_id.clone(),
                    name: gpu.name.clone(),
                    uuid: gpu.uuid.clone(),
                    xid_counts: std::mem::take(&mut gpu.xid_counts),
                    ..GpuState::default()
                };
                *gpu = kept;
            }
            48 => {
                let ecc = gpu.ecc.get_or_insert_with(EccCounts::default);
                ecc.volatile_uncorrected = Some(ecc.volatile_uncorrected.unwrap_or(0) + 1);
                ecc.aggregate_uncorrected = Some(ecc.aggregate_uncorrected.unwrap_or(0) + 1);
                let rows = gpu.remapped_rows.get_or_insert_with(RemappedRows::default);
                rows.uncorrectable += 1;
                rows.pending = true;
                // r570 drivers advise a GPU reset after a DBE.
                gpu.recovery_action = Some(1);
            }
            _ => {}
        }
        *gpu.xid_counts.entry(code).or_insert(0) += 1;
    })?;
    let pci = pci.map_or_else(|| "0000:5d:00".to_owned(), |pci| kernel_pci(&pci, false));
    let line = match code {
        79 => format!(
            "NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
        ),
        48 => format!(
            "NVRM: Xid (PCI:{pci}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."
        ),
        // NVLink5 errors as GB200 drivers print them: no pid, the word says how bad.
        144..=150 => format!(
            "NVRM: Xid (PCI:{pci}): {code}, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
        ),
        _ => format!(
            "NVRM: Xid (PCI:{pci}): {code}, pid='<unknown>', name=<unknown>, {}",
            fleetmend_agent::xid::advice(code).meaning
        ),
    };
    let mut lines = vec![(4, line)];
    if code == 79 {
        lines.push((4, format!("NVRM: GPU {pci}.0: GPU has fallen off the bus.")));
    }
    tree.append_kmsg(meta, &lines)?;
    Ok(())
}

/// Reads the GPU fixture, lets `edit` change it, checks it as the agent will and writes it back
/// in one rename (the agent reads it on every run).
fn edit_gpus(tree: &NodeTree, edit: impl FnOnce(&mut GpuSnapshot)) -> Result<(), InjectError> {
    let path = tree.dir().join(GPU_FIXTURE_PATH);
    let fixture_err = |message: String| InjectError::Fixture { path: path.clone(), message };
    let text = fs::read_to_string(&path)
        .map_err(|source| TreeError::Read { path: path.clone(), source })?;
    let mut snapshot = fleetmend_agent::gpu::fixture::parse_snapshot(&path, &text)
        .map_err(|err| fixture_err(err.to_string()))?;
    edit(&mut snapshot);
    let problems = snapshot.problems();
    if !problems.is_empty() {
        return Err(fixture_err(problems.join("; ")));
    }
    let json =
        serde_json::to_string_pretty(&snapshot).map_err(|err| fixture_err(err.to_string()))?;
    tree::write_atomic(&path, format!("{json}\n").as_bytes())?;
    Ok(())
}

/// [`edit_gpus`] for the GPU with `index`; an error when the fixture has no such GPU.
fn edit_gpu(
    tree: &NodeTree,
    index: u32,
    edit: impl FnOnce(&mut GpuState),
) -> Result<(), InjectError> {
    let mut found = false;
    edit_gpus(tree, |snapshot| {
        if let Some(gpu) = snapshot.gpus.iter_mut().find(|gpu| gpu.index == index) {
            found = true;
            edit(gpu);
        }
    })?;
    if found {
        Ok(())
    } else {
        Err(InjectError::Fixture {
            path: tree.dir().join(GPU_FIXTURE_PATH),
            message: format!("no GPU {index} (taken away by gpu-missing?)"),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn kernel_pci_addresses_drop_the_long_domain() {
        assert_eq!(kernel_pci("00000000:5d:00.0", false), "0000:5d:00");
        assert_eq!(kernel_pci("00000000:5d:00.0", true), "0000:5d:00.0");
        assert_eq!(kernel_pci("0000:5d:00.0", false), "0000:5d:00");
    }
}
