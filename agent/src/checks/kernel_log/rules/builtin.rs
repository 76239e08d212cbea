//! The built-in kernel-log rules, by where the lines come from: the GPU's Xid events, the host
//! (machine checks, filesystems, disks, links, memory, tasks), the fabric (NVSwitch and the RDMA
//! adapters) and the GPU driver and CUDA libraries.

use std::time::Duration;

use super::KernelLogRule;

const MINUTE: u64 = 60;
const HOUR: u64 = 3600;

fn builtin(
    name: &str,
    pattern: &str,
    finding: &str,
    status: &str,
    action: &str,
    subject: &str,
    clear_after_secs: u64,
) -> KernelLogRule {
    KernelLogRule {
        name: name.to_owned(),
        pattern: pattern.to_owned(),
        finding: finding.to_owned(),
        status: status.to_owned(),
        action: action.to_owned(),
        subject: subject.to_owned(),
        clear_after: Duration::from_secs(clear_after_secs),
        lines: 1,
        clear_pattern: String::new(),
    }
}

/// The PCI address as NVRM prints it in Xid lines: `0000:3b:00`, sometimes with a function.
const PCI: &str = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?";

/// The built-in rules, on unless `builtin_rules = false`. `docs/detection.md` lists them with
/// their sources; the line shapes come from the sources named here.
///
/// Each group's function gives the choices behind its rules; the groups are joined in a fixed
/// order (Xid, host, fabric, GPU driver), so the list keeps the order it always had.
pub fn builtin_rules() -> Vec<KernelLogRule> {
    [xid_rules(), host_rules(), fabric_rules(), gpu_driver_rules()].concat()
}

/// NVRM's Xid events.
///
/// Choices, rule by rule:
/// - `xid`: NVRM's `Xid (PCI:0000:3b:00): N, ...` (NVIDIA's Xid documentation and catalog), also
///   the legacy form without `PCI:` and the MIG form with `GPU-I:`/`GPU-CI:`. Status and action
///   from the catalog ([`crate::xid::advice`]); for the NVLink5 Xids 144–150 the line's own `Fatal` or
///   `Nonfatal` word decides ([`crate::xid::by_severity`]). The `(GPC n, TPC m` of an Xid 13 is kept as
///   labels for burst counting. Subject the GPU's PCI address. Clears after 1 h: long enough for
///   the repairer to act on it, short enough that a GPU reset that fixed the fault does not keep
///   the node sick; lasting GPU state (ECC, row remaps, a GPU gone) is the gpu check's to report.
/// - `xid_recovery_action`: Xid 154 carries the driver's recovery action; it is a state, so the
///   latest line per GPU wins and a change back to `0x0 (None)` clears it. 1 h as for `xid`.
fn xid_rules() -> Vec<KernelLogRule> {
    vec![
        builtin(
            "xid",
            &format!(
                r"NVRM: Xid \((?:PCI:)?(?P<pci>{PCI})(?: GPU-I:\d{{1,3}})?(?: GPU-CI:\d{{1,3}})?\): (?P<xid>\d{{1,5}})\b(?:.*?\(GPC (?P<gpc>\d{{1,3}}), TPC (?P<tpc>\d{{1,3}})\b)?(?:.*?\b(?P<severity>Fatal|Nonfatal|Non-fatal)\b)?"
            ),
            "xid",
            "xid-catalog",
            "xid-catalog",
            "${pci}",
            HOUR,
        ),
        builtin(
            "xid_recovery_action",
            &format!(
                r"NVRM: Xid \(PCI:(?P<pci>{PCI})\): 154\b.*recovery action changed from 0x[0-9A-Fa-f]+ \([^)]*\) to 0x(?P<recovery>[0-9A-Fa-f]{{1,4}})\b"
            ),
            "recovery_action",
            "xid-recovery-action",
            "xid-recovery-action",
            "${pci}",
            HOUR,
        ),
    ]
}

/// The host: machine checks, filesystems, disks, network links, memory and tasks.
///
/// Choices, rule by rule:
/// - `mce`: a machine check the kernel survived and logged is almost always corrected; warn so a
///   person looks, no action (uncorrected ones panic the node; EDAC rates are the host check's).
///   Clears after 24 h so a burst stays visible for a day.
/// - `ext4_error`, `xfs_shutdown`: the filesystem saw corruption or shut itself down; data is at
///   risk and a reboot does not repair a filesystem, so fail and drain for a person (fsck). 24 h.
/// - `block_io_error`, `nvme_timeout`: one I/O error or timeout is evidence, not a verdict; warn
///   with no action, the disk check's write probe decides whether the disk works. 6 h.
/// - `nic_watchdog`: a transmit timeout makes the driver reset the NIC, which usually recovers;
///   warn, no action; the nic check reports lasting link state. 1 h.
/// - `link_down`: an event; the lasting condition (link still down, flapping) is the nic check's,
///   so warn briefly (15 min, or until the interface's `Link is Up`) and take no action.
/// - `oom_kill`: the job's problem, not the node's: warn, no action, 1 h.
/// - `hung_task`: often a stuck filesystem or driver, but not by itself a reason to act: warn so a
///   person looks, no action, 1 h.
fn host_rules() -> Vec<KernelLogRule> {
    vec![
        builtin("mce", r"mce: \[Hardware Error\]", "mce", "warn", "none", "", 24 * HOUR),
        builtin(
            "ext4_error",
            r"EXT4-fs error \(device (?P<device>[A-Za-z0-9_.:-]{1,64})\)",
            "ext4_error",
            "fail",
            "drain",
            "${device}",
            24 * HOUR,
        ),
        builtin(
            "xfs_shutdown",
            r"XFS \((?P<device>[A-Za-z0-9_.:-]{1,64})\):.*Shutting down filesystem",
            "xfs_shutdown",
            "fail",
            "drain",
            "${device}",
            24 * HOUR,
        ),
        builtin(
            "block_io_error",
            r"(?:blk_update_request: )?I/O error, dev (?P<device>[A-Za-z0-9_-]{1,64})",
            "block_io_error",
            "warn",
            "none",
            "${device}",
            6 * HOUR,
        ),
        builtin(
            "nvme_timeout",
            r"nvme (?P<device>nvme\d{1,4}): I/O .*timeout",
            "nvme_timeout",
            "warn",
            "none",
            "${device}",
            6 * HOUR,
        ),
        builtin(
            "nic_watchdog",
            r"NETDEV WATCHDOG: (?P<interface>[A-Za-z0-9_.@-]{1,32})",
            "nic_watchdog",
            "warn",
            "none",
            "${interface}",
            HOUR,
        ),
        KernelLogRule {
            // The link came back: the warning is over.
            clear_pattern: r"(?P<interface>[A-Za-z0-9_.@-]{1,32}):? (?:NIC )?Link (?:is Up|up)\b"
                .to_owned(),
            ..builtin(
                "link_down",
                r"(?P<interface>[A-Za-z0-9_.@-]{1,32}):? (?:NIC )?Link (?:is Down|down)\b",
                "link_down",
                "warn",
                "none",
                "${interface}",
                15 * MINUTE,
            )
        },
        builtin(
            "oom_kill",
            r"(?i)out of memory: Killed process",
            "oom_kill",
            "warn",
            "none",
            "",
            HOUR,
        ),
        builtin(
            "hung_task",
            r"task \S+ blocked for more than \d+ seconds",
            "hung_task",
            "warn",
            "none",
            "",
            HOUR,
        ),
    ]
}

/// The fabric: NVSwitch SXids and the Mellanox RDMA adapters' health.
///
/// Choices, rule by rule:
/// - `nvswitch_fatal`, `nvswitch_error`: NVSwitch SXids, which the NVSwitch driver prints as
///   `nvidia-nvswitchN: SXid (PCI:...): CODE, Fatal|Non-fatal, ...` (NVIDIA Fabric Manager user
///   guide, "NVSwitch errors"; error_nvswitch.h). The word decides: a fatal SXid leaves the
///   fabric unusable until the GPUs and switches are reset, which on a baseboard is a reboot
///   (fail, reboot); a non-fatal one is warned about; `Correctable` and the `Severity`/`Data`
///   lines that follow carry no verdict. Subject the switch's PCI address; 1 h as for `xid`.
/// - `nic_health`: the mlx5 driver's health poller giving up on the device's firmware ("device's
///   health compromised - reached miss count", a health syndrome `synd 0x..`, "health recovery
///   flow aborted", "PCI slot is unavailable"; drivers/net/ethernet/mellanox/mlx5/core/health.c),
///   and mlx4's catastrophic "Internal error detected" (`mlx4_health`, mlx4/catas.c). The adapter
///   is gone until it is reset: fail, reboot. `nic_cmd_timeout`: a firmware command that timed out
///   ("... timeout. Will cause a leak of a command resource", "timed out while waiting for a
///   slot"; mlx5/core/cmd.c) often precedes it: warn, no action. `nic_pcie_power`: "Detected
///   insufficient power on the PCIe slot (27W)." (mlx5/core/events.c): warn, no action, 24 h —
///   some platforms print it harmlessly. Subject the adapter's PCI address; 1 h.
fn fabric_rules() -> Vec<KernelLogRule> {
    vec![
        builtin(
            "nvswitch_fatal",
            &format!(
                r"nvidia-nvswitch\d{{1,3}}: SXid \(PCI:(?P<pci>{PCI})\): (?P<sxid>\d{{1,5}}), Fatal\b"
            ),
            "nvswitch_fatal",
            "fail",
            "reboot",
            "${pci}",
            HOUR,
        ),
        builtin(
            "nvswitch_error",
            &format!(
                r"nvidia-nvswitch\d{{1,3}}: SXid \(PCI:(?P<pci>{PCI})\): (?P<sxid>\d{{1,5}}), Non-fatal\b"
            ),
            "nvswitch_error",
            "warn",
            "none",
            "${pci}",
            HOUR,
        ),
        builtin(
            "nic_health",
            &format!(
                r"mlx5_core (?P<pci>{PCI}): .*(?:health compromised|synd 0x[0-9a-f]{{1,4}}: |health recovery flow aborted|PCI slot is unavailable)"
            ),
            "nic_health",
            "fail",
            "reboot",
            "${pci}",
            HOUR,
        ),
        builtin(
            "nic_cmd_timeout",
            &format!(
                r"mlx5_core (?P<pci>{PCI}): .*(?:\) (?:Async, )?timeout\. Will cause a leak of a command resource|\) timed out while waiting for a slot)"
            ),
            "nic_cmd_timeout",
            "warn",
            "none",
            "${pci}",
            HOUR,
        ),
        builtin(
            "nic_pcie_power",
            &format!(
                r"mlx5_core (?P<pci>{PCI}): .*Detected insufficient power on the PCIe slot \((?P<watts>\d{{1,4}})W\)"
            ),
            "nic_pcie_power",
            "warn",
            "none",
            "${pci}",
            24 * HOUR,
        ),
        builtin(
            "mlx4_health",
            &format!(r"mlx4_core (?P<pci>{PCI}): Internal error (?:detected|mark was detected)"),
            "nic_health",
            "fail",
            "reboot",
            "${pci}",
            HOUR,
        ),
    ]
}

/// The GPU driver and CUDA software: a GPU lost or never brought up, GSP trouble, GPUDirect RDMA
/// and applications crashing inside CUDA libraries.
///
/// Choices, rule by rule:
/// - `gpu_fallen_off_bus`: the GPU lost from the bus without an Xid — NVRM's
///   `GPU 0000:3b:00.0: GPU has fallen off the bus.` and the three-line message of the driver's
///   probe (`The NVIDIA GPU ...` / `(PCI ID: ...) installed in this system has` / `fallen off the
///   bus and is not responding to commands.`, osapi.c in NVIDIA's open kernel modules); fail,
///   reboot as for Xid 79. `gpu_init_failed`: `RmInitAdapter failed` / `rm_init_adapter failed`,
///   the GPU could not be brought up; fail, reboot.
/// - `gpu_needs_reset`: the driver's own "The GPU likely needs to be reset." after repeated GSP
///   RPC errors; fail, reset-gpu. `gsp_timeout`: the GSP firmware stopped answering
///   (`_kgsp...: *** GSP Timeout ***`, heartbeat timeouts; the Xid 119 that follows carries the
///   catalog's action too); fail, reset-gpu. Subject the GPU number NVRM prints, where it does.
/// - `peermem_error`: nvidia-peermem's `ERROR` lines (GPUDirect RDMA registration or
///   invalidation failed; kernel-open/nvidia-peermem): the job's RDMA transfers broke; warn,
///   restart-app, 1 h.
/// - `gpu_app_crash`: a process's segfault or general protection fault inside libcuda, libnccl
///   or another CUDA library (arch/x86/mm/fault.c, traps.c): usually the application's or the
///   driver's, so warn, restart-app; subject the library, 1 h.
fn gpu_driver_rules() -> Vec<KernelLogRule> {
    vec![
        KernelLogRule {
            lines: 3,
            ..builtin(
                "gpu_fallen_off_bus",
                &format!(
                    r"NVRM: (?:The NVIDIA )?GPU (?P<pci>{PCI})(?::? GPU has fallen off the bus|\n(?:[^\n]*\n)?[^\n]*fallen off the bus and is not responding)"
                ),
                "gpu_fallen_off_bus",
                "fail",
                "reboot",
                "${pci}",
                HOUR,
            )
        },
        builtin(
            "gpu_init_failed",
            &format!(r"NVRM: GPU (?P<pci>{PCI}): (?:RmInitAdapter|rm_init_adapter) failed"),
            "gpu_init_failed",
            "fail",
            "reboot",
            "${pci}",
            HOUR,
        ),
        builtin(
            "gpu_needs_reset",
            &format!(
                r"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:(?P<pci>{PCI}) .*The GPU likely needs to be reset"
            ),
            "gpu_needs_reset",
            "fail",
            "reset-gpu",
            "${pci}",
            HOUR,
        ),
        builtin(
            "gsp_timeout",
            r"NVRM: (?:GPU(?P<gpu>\d{1,2}) )?_kgsp\w{1,40}: (?:\*+ GSP Timeout \*+|GSP RM heartbeat timed out|Heartbeat timed out)",
            "gsp_timeout",
            "fail",
            "reset-gpu",
            "${gpu}",
            HOUR,
        ),
        builtin(
            "peermem_error",
            r"nvidia-peermem (?P<function>\w{1,64}):\d{1,6} ERROR ",
            "peermem_error",
            "warn",
            "restart-app",
            "",
            HOUR,
        ),
        builtin(
            "gpu_app_crash",
            r"(?P<process>[^\s\[\]]{1,64})\[\d{1,10}\]:? (?:segfault at [0-9a-f]+ ip [0-9a-f]+ sp [0-9a-f]+ error [0-9a-f]+|general protection fault ip:[0-9a-f]+ sp:[0-9a-f]+ error:[0-9a-f]+) in (?P<library>lib(?:cuda|nccl|cudart|cublas|cublasLt|cudnn|nvidia-ml|nvrtc|nvJitLink)\b[^\s\[]{0,48})\[",
            "gpu_app_crash",
            "warn",
            "restart-app",
            "${library}",
            HOUR,
        ),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use fleetmend_proto::{RecommendedAction, Status};

    use super::*;
    use crate::checks::kernel_log::rules::{Rule, RuleMatch, compile};

    #[test]
    fn every_builtin_rule_compiles() {
        for rule in builtin_rules() {
            assert!(compile(&rule).is_ok(), "{}: {:?}", rule.name, compile(&rule).err());
        }
    }

    #[test]
    fn builtin_rules_match_the_documented_line_shapes() {
        let rules: Vec<Rule> = builtin_rules().iter().filter_map(|r| compile(r).ok()).collect();
        let hit = |line: &str| -> Vec<(String, RuleMatch)> {
            rules.iter().filter_map(|r| r.matches(line).map(|m| (r.name.clone(), m))).collect()
        };
        let m = hit("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.");
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].0, "xid");
        assert_eq!(m[0].1.subject, "0000:3b:00");
        assert_eq!((m[0].1.status, m[0].1.action), (Status::Fail, RecommendedAction::Reboot));
        assert_eq!(m[0].1.labels.get("xid").map(String::as_str), Some("79"));

        let m = hit(
            "NVRM: Xid (PCI:0000:bb:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        );
        let recovery: Vec<_> = m.iter().filter(|(name, _)| name == "xid_recovery_action").collect();
        assert_eq!(recovery.len(), 1, "{m:?}");
        assert_eq!(recovery[0].1.action, RecommendedAction::Reboot);
        assert_eq!(recovery[0].1.labels.get("recovery").map(String::as_str), Some("2"));

        let cases = [
            ("mce: [Hardware Error]: Machine check events logged", "mce", ""),
            (
                "EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2",
                "ext4_error",
                "nvme0n1p1",
            ),
            (
                "XFS (dm-0): Corruption of in-memory data detected.  Shutting down filesystem",
                "xfs_shutdown",
                "dm-0",
            ),
            (
                "blk_update_request: I/O error, dev sda, sector 2048 op 0x0:(READ)",
                "block_io_error",
                "sda",
            ),
            (
                "I/O error, dev nvme1n1, sector 0 op 0x1:(WRITE) flags 0x800",
                "block_io_error",
                "nvme1n1",
            ),
            ("nvme nvme0: I/O 123 QID 4 timeout, aborting", "nvme_timeout", "nvme0"),
            (
                "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 3 timed out",
                "nic_watchdog",
                "eth0",
            ),
            ("mlx5_core 0000:0c:00.0 ens1f0np0: Link is Down", "link_down", "ens1f0np0"),
            ("e1000e: eth1 NIC Link is Down", "link_down", "eth1"),
            // mlx5e_update_carrier's words.
            ("mlx5_core 0000:0c:00.0 ens1f0np0: Link down", "link_down", "ens1f0np0"),
            ("Out of memory: Killed process 4242 (python) total-vm:1kB", "oom_kill", ""),
            ("Memory cgroup out of memory: Killed process 4242 (python)", "oom_kill", ""),
            ("INFO: task python:4242 blocked for more than 120 seconds.", "hung_task", ""),
            (
                "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 11001, Fatal, Link 22 ingress invalid command",
                "nvswitch_fatal",
                "0000:07:00.0",
            ),
            (
                "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX Short Error Rate",
                "nvswitch_error",
                "0000:c3:00.0",
            ),
            (
                "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count",
                "nic_health",
                "0000:41:00.0",
            ),
            (
                "mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",
                "nic_health",
                "0000:41:00.0",
            ),
            (
                "mlx5_core 0000:03:00.0: wait_func:964:(pid 112): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
                "nic_cmd_timeout",
                "0000:03:00.0",
            ),
        ];
        for (line, name, subject) in cases {
            let m = hit(line);
            assert_eq!(m.len(), 1, "{line}: {m:?}");
            assert_eq!(m[0].0, name, "{line}");
            assert_eq!(m[0].1.subject, subject, "{line}");
        }
        assert!(hit("usb 1-1: new high-speed USB device number 2").is_empty());
        assert!(hit("mlx5_core 0000:0c:00.0 ens1f0np0: Link is Up").is_empty());
        // The severity line that follows an SXid is neither fatal nor non-fatal.
        assert!(
            hit("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 11001, Severity 5 Engine instance 22 Sub-engine instance 00")
                .is_empty()
        );
        let fatal = hit(
            "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 11001, Fatal, Link 22 ingress invalid command",
        );
        assert_eq!(
            (fatal[0].1.status, fatal[0].1.action),
            (Status::Fail, RecommendedAction::Reboot)
        );
    }
}
