//! The built-in kernel-log rules against lines as public sources print them (NVIDIA's Xid
//! documentation and catalog, NVIDIA's open kernel modules, the NVSwitch driver, the mlx5/mlx4
//! drivers, nvidia-peermem, the kernel's fault reporting, and logs quoted in public bug reports),
//! each with near misses that must not match; then every log format a user feeds the agent, the
//! boot backlog with its lookback, and Xid bursts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::{Duration, SystemTime};

use fleetmend_agent::checks::kernel_log::{KernelLogCheck, KernelLogConfig};
use fleetmend_agent::checks::{Mode, Observation};
use fleetmend_agent::config::HostPaths;
use fleetmend_proto::{RecommendedAction, Status};
use support::{build_context, find, not_ok, run, run_at};

use RecommendedAction::{None as NoAction, Reboot, ResetGpu, RestartApp};
use Status::{Fail, Warn};

/// One line a rule must match, and what it must report.
struct Case {
    line: &'static str,
    finding: &'static str,
    subject: &'static str,
    status: Status,
    action: RecommendedAction,
    labels: &'static [(&'static str, &'static str)],
}

const fn case(
    line: &'static str,
    finding: &'static str,
    subject: &'static str,
    (status, action): (Status, RecommendedAction),
    labels: &'static [(&'static str, &'static str)],
) -> Case {
    Case { line, finding, subject, status, action, labels }
}

const CASES: &[Case] = &[
    // Xid, NVIDIA's Xid documentation and logs quoted in public reports.
    case(
        "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "xid",
        "0000:05:00",
        (Fail, Reboot),
        &[("xid", "79"), ("pci", "0000:05:00")],
    ),
    case(
        "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
        "xid",
        "0000:44:00",
        (Fail, Reboot),
        &[("xid", "79")],
    ),
    // The legacy form without `PCI:` (older drivers).
    case(
        "NVRM: Xid (0000:01:00): 8, Channel 00000000",
        "xid",
        "0000:01:00",
        (Warn, RestartApp),
        &[("xid", "8")],
    ),
    // MIG: the GPU instance inside the parentheses (krcReportXid's format).
    case(
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 31, pid=12345, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC1 GPCCLIENT_T1_0 faulted @ 0x7f60_d72f8000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "xid",
        "0000:3b:00",
        (Warn, RestartApp),
        &[("xid", "31")],
    ),
    case(
        "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
        "xid",
        "0000:cb:00",
        (Warn, RestartApp),
        &[("xid", "13"), ("gpc", "7"), ("tpc", "7")],
    ),
    case(
        "NVRM: Xid (PCI:0000:07:00): 119, pid=2357, name=nv-hostengine, Timeout waiting for RPC from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x90cc0301 0xc).",
        "xid",
        "0000:07:00",
        (Fail, ResetGpu),
        &[("xid", "119")],
    ),
    // NVLink5 Xids: the word in the line decides (NVIDIA's catalog, WORKFLOW_NVLINK5_ERR).
    case(
        "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
        "xid",
        "0000:01:00",
        (Warn, NoAction),
        &[("xid", "144"), ("severity", "Nonfatal")],
    ),
    case(
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        "xid",
        "0019:01:00",
        (Fail, ResetGpu),
        &[("xid", "149"), ("severity", "Fatal")],
    ),
    case(
        "NVRM: Xid (PCI:0001:00:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)",
        "xid",
        "0001:00:00",
        (Fail, ResetGpu),
        &[("xid", "145")],
    ),
    case(
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
        "xid",
        "0018:01:00",
        (Warn, NoAction),
        &[("xid", "145")],
    ),
    case(
        "NVRM: Xid (PCI:0000:2a:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        "recovery_action",
        "0000:2a:00",
        (Fail, ResetGpu),
        &[("recovery", "1")],
    ),
    // A GPU lost without an Xid (osHandleGpuLost; the probe's message has its own case below).
    case(
        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        "gpu_fallen_off_bus",
        "0000:01:00.0",
        (Fail, Reboot),
        &[("pci", "0000:01:00.0")],
    ),
    case(
        "NVRM: GPU 0000:41:00.0: RmInitAdapter failed! (0x62:0x40:2404)",
        "gpu_init_failed",
        "0000:41:00.0",
        (Fail, Reboot),
        &[],
    ),
    case(
        "NVRM: GPU 0000:04:00.0: rm_init_adapter failed, device minor number 0",
        "gpu_init_failed",
        "0000:04:00.0",
        (Fail, Reboot),
        &[],
    ),
    // GSP (kernel_gsp.c).
    case(
        "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:07:00 (printing 1 of every 30).  The GPU likely needs to be reset.",
        "gpu_needs_reset",
        "0000:07:00",
        (Fail, ResetGpu),
        &[],
    ),
    case(
        "NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout **********************************",
        "gsp_timeout",
        "6",
        (Fail, ResetGpu),
        &[("gpu", "6")],
    ),
    case(
        "NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out",
        "gsp_timeout",
        "0",
        (Fail, ResetGpu),
        &[],
    ),
    case(
        "NVRM: _kgspLogXid119: ********************************* GSP Timeout **********************************",
        "gsp_timeout",
        "",
        (Fail, ResetGpu),
        &[],
    ),
    // NVSwitch SXids (error_nvswitch.h / intr_nvswitch.h; lines from public reports).
    case(
        "nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
        "nvswitch_fatal",
        "0000:a9:00.0",
        (Fail, Reboot),
        &[("sxid", "20034")],
    ),
    case(
        "nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 22013, Non-fatal, Link 60 Minion Link DLREQ interrupt",
        "nvswitch_error",
        "0000:08:00.0",
        (Warn, NoAction),
        &[("sxid", "22013")],
    ),
    case(
        "nvidia-nvswitch0: SXid (PCI:0000:00:07.0): 11004, Non-fatal, Link 40 ingress invalid ACL (First)",
        "nvswitch_error",
        "0000:00:07.0",
        (Warn, NoAction),
        &[],
    ),
    // mlx5 (health.c, cmd.c, events.c) and mlx4 (catas.c).
    case(
        "mlx5_core 0000:0d:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count",
        "nic_health",
        "0000:0d:00.0",
        (Fail, Reboot),
        &[("pci", "0000:0d:00.0")],
    ),
    case(
        "mlx5_core 0000:0d:00.0: print_health_info:447:(pid 0): synd 0x1: firmware internal error",
        "nic_health",
        "0000:0d:00.0",
        (Fail, Reboot),
        &[],
    ),
    case(
        "mlx5_core 0001:00:00.0: mlx5_health_try_recover:313:(pid 3174): health recovery flow aborted, PCI reads still not working",
        "nic_health",
        "0001:00:00.0",
        (Fail, Reboot),
        &[],
    ),
    case(
        "mlx5_core 0000:18:00.0: wait_func:1155:(pid 1967079): TEARDOWN_HCA(0x103) timeout. Will cause a leak of a command resource",
        "nic_cmd_timeout",
        "0000:18:00.0",
        (Warn, NoAction),
        &[],
    ),
    case(
        "mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W).",
        "nic_pcie_power",
        "0000:5c:00.0",
        (Warn, NoAction),
        &[("watts", "27")],
    ),
    case(
        "mlx4_core 0000:82:00.0: Internal error detected:",
        "nic_health",
        "0000:82:00.0",
        (Fail, Reboot),
        &[],
    ),
    // nvidia-peermem's peer_err().
    case(
        "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
        "peermem_error",
        "",
        (Warn, RestartApp),
        &[("function", "nv_get_p2p_free_callback")],
    ),
    // A process dying inside a CUDA library (show_signal_msg, traps.c).
    case(
        "pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in libnccl.so.2[7f7c7ac00000+d3d3000]",
        "gpu_app_crash",
        "libnccl.so.2",
        (Warn, RestartApp),
        &[("process", "pt_main_thread")],
    ),
    case(
        "llama-server[16980]: segfault at 20d803fdc ip 00007dbe270a3e47 sp 00007ffff184bf00 error 4 in libcuda.so.570.133.20[4a3e47,7dbe26d79000+d1c000] likely on CPU 29 (core 14, socket 0)",
        "gpu_app_crash",
        "libcuda.so.570.133.20",
        (Warn, RestartApp),
        &[],
    ),
    case(
        "traps: python[4242] general protection fault ip:7f1c2a3b4c5d sp:7ffc11223340 error:0 in libcuda.so.550.54.15[2f4c5d,7f1c2a100000+1a00000]",
        "gpu_app_crash",
        "libcuda.so.550.54.15",
        (Warn, RestartApp),
        &[("process", "python")],
    ),
    // Storage and the rest, as before.
    case(
        "EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2",
        "ext4_error",
        "nvme0n1p1",
        (Fail, RecommendedAction::Drain),
        &[],
    ),
    case(
        "nvme nvme0: I/O 123 QID 4 timeout, aborting",
        "nvme_timeout",
        "nvme0",
        (Warn, NoAction),
        &[],
    ),
    case(
        "XFS (dm-0): Corruption of in-memory data (0x8) detected at xfs_trans_cancel+0x12d/0x160 [xfs] (fs/xfs/xfs_trans.c:1098).  Shutting down filesystem.",
        "xfs_shutdown",
        "dm-0",
        (Fail, RecommendedAction::Drain),
        &[],
    ),
    case(
        "I/O error, dev nvme1n1, sector 0 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 2",
        "block_io_error",
        "nvme1n1",
        (Warn, NoAction),
        &[],
    ),
    case("mce: [Hardware Error]: Machine check events logged", "mce", "", (Warn, NoAction), &[]),
    case(
        "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out 5120 ms",
        "nic_watchdog",
        "ens1f0np0",
        (Warn, NoAction),
        &[],
    ),
    case(
        "mlx5_core 0000:0c:00.0 ens1f0np0: Link down",
        "link_down",
        "ens1f0np0",
        (Warn, NoAction),
        &[],
    ),
    case("e1000e: eth1 NIC Link is Down", "link_down", "eth1", (Warn, NoAction), &[]),
    case(
        "Out of memory: Killed process 4242 (python3) total-vm:102400kB, anon-rss:51200kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:200kB oom_score_adj:0",
        "oom_kill",
        "",
        (Warn, NoAction),
        &[],
    ),
    case(
        "INFO: task python3:4242 blocked for more than 122 seconds.",
        "hung_task",
        "",
        (Warn, NoAction),
        &[],
    ),
];

/// Lines close to each rule's that must not raise anything: (rule, line).
const NEAR_MISSES: &[(&str, &str)] = &[
    // Informational Xids and lines that name a GPU without a fault.
    (
        "xid",
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, Row Remapper: New row marked for remapping, reset gpu to activate",
    ),
    ("xid", "NVRM: GPU at PCI:0000:07:00: GPU-c9696075-b0f8-0e72-1ab7-13e7bdf9b678"),
    ("xid", "Xid (PCI:0000:01:00): 79, GPU has fallen off the bus. (quoted by a person, no NVRM)"),
    (
        "xid_recovery_action",
        "NVRM: Xid (PCI:0000:2a:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
    ),
    ("gpu_fallen_off_bus", "NVRM: The NVIDIA probe routine failed for 1 device(s)."),
    ("gpu_fallen_off_bus", "NVRM: The NVIDIA GPU 0000:b3:00.0"),
    (
        "gpu_init_failed",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build",
    ),
    (
        "gpu_needs_reset",
        "NVRM: GPU0 GSP RPC buffer contains function 76 (GSP_RM_CONTROL) and data 0x0000000090cc0301 0x000000000000000c.",
    ),
    ("gsp_timeout", "NVRM: GPU0 RPC history (CPU -> GSP):"),
    ("gsp_timeout", "NVRM: Note: Please also check logs above."),
    // SXid companion lines carry no verdict; correctable errors are corrected.
    (
        "nvswitch_fatal",
        "nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Severity 1 Engine instance 30 Sub-engine instance 00",
    ),
    (
        "nvswitch_error",
        "nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Data {0x50610002, 0x10100030, 0x00000000, 0x10100030, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
    ),
    (
        "nvswitch_error",
        "nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, Correctable, Link 12 RX CRC error",
    ),
    // mlx5 and mlx4 lines that are not their health failing.
    ("nic_health", "mlx5_core 0000:0d:00.0: print_health_info:440:(pid 0): fw_ver 22.44.1036"),
    (
        "nic_cmd_timeout",
        "mlx5_core 0000:56:00.0: mlx5_cmd_comp_handler:1709:(pid 0): Command completion arrived after timeout (entry idx = 0).",
    ),
    (
        "nic_pcie_power",
        "mlx5_core 0000:5c:00.0: mlx5_pcie_event:302:(pid 268269): PCIe slot advertised sufficient power (75W).",
    ),
    ("mlx4_health", "mlx4_core 0000:82:00.0: device was reset successfully"),
    ("link_down", "mlx5_core 0000:0c:00.0 ens1f0np0: Link is Up"),
    ("link_down", "mlx5_core 0000:0c:00.0 ens1f0np0: Link up"),
    ("nic_watchdog", "e1000e 0000:00:1f.6 eth0: Reset adapter unexpectedly"),
    // peermem loading, a segfault outside CUDA, a process crash without a library.
    ("peermem_error", "nvidia-peermem: module loaded"),
    (
        "gpu_app_crash",
        "python[4242]: segfault at 0 ip 00007f0000000000 sp 00007ffd00000000 error 4",
    ),
    (
        "gpu_app_crash",
        "bash[812]: segfault at 8 ip 000055d1c0ffee00 sp 00007ffc0badf00d error 4 in bash[55d1c0f00000+100000]",
    ),
    // Storage, memory and the scheduler, as they log normal life.
    ("mce", "mce: CPU supports 32 MCE banks"),
    (
        "ext4_error",
        "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
    ),
    ("xfs_shutdown", "XFS (dm-0): Mounting V5 Filesystem"),
    (
        "block_io_error",
        "blk_update_request: operation not supported error, dev loop0, sector 0 op 0x9:(WRITE_ZEROES)",
    ),
    ("nvme_timeout", "nvme nvme0: 32/0/0 default/read/poll queues"),
    (
        "oom_kill",
        "oom_reaper: reaped process 4242 (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
    ),
    ("hung_task", "\"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message."),
    ("usb", "usb 1-1: new high-speed USB device number 2"),
];

fn once_over(dir: &Path, text: &str, config: &KernelLogConfig) -> Observation {
    let paths = HostPaths::tree(dir);
    std::fs::write(&paths.kmsg, text).unwrap();
    let mut check = KernelLogCheck::new(config, build_context(&paths, Mode::Once));
    run(&mut check, &paths)
}

fn once(text: &str) -> Observation {
    let dir = tempfile::tempdir().unwrap();
    once_over(dir.path(), text, &KernelLogConfig::default())
}

#[test]
fn every_rule_reports_its_public_examples_with_status_action_and_labels() {
    for case in CASES {
        let obs = once(&format!("{}\n", case.line));
        let found = find(&obs, case.finding, case.subject);
        assert_eq!((found.status, found.action), (case.status, case.action), "{}", case.line);
        for (key, value) in case.labels {
            assert_eq!(found.labels.get(*key).map(String::as_str), Some(*value), "{}", case.line);
        }
        // Exactly one rule speaks about each line.
        assert_eq!(not_ok(&obs).len(), 1, "{}: {:#?}", case.line, not_ok(&obs));
    }
}

#[test]
fn near_misses_raise_nothing() {
    for (rule, line) in NEAR_MISSES {
        let obs = once(&format!("{line}\n"));
        assert!(not_ok(&obs).is_empty(), "{rule}: {line}: {:#?}", not_ok(&obs));
    }
}

/// Every built-in rule has a public example above and a near miss.
#[test]
fn every_builtin_rule_has_examples_and_near_misses() {
    for rule in fleetmend_agent::checks::kernel_log::builtin_rules() {
        assert!(
            CASES.iter().any(|c| c.finding == rule.finding),
            "no example of {} ({})",
            rule.name,
            rule.finding
        );
        assert!(
            NEAR_MISSES.iter().any(|(name, _)| *name == rule.name),
            "no near miss of {}",
            rule.name
        );
    }
}

/// The probe's three-line message (osapi.c), as each transport shows it.
#[test]
fn the_three_line_fallen_off_the_bus_message_is_one_finding_in_every_format() {
    let lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ];
    let forms = [
        // /dev/kmsg: one record, its newlines escaped.
        format!("3,1234,1843308145,-;{}\n", lines.join("\\x0a")),
        // dmesg: the next lines indented, with no stamp.
        format!(
            "[ 1843.308145] {}\n               {}\n               {}\n",
            lines[0], lines[1], lines[2]
        ),
        // syslog: every line with its own prefix.
        lines
            .iter()
            .map(|l| format!("Dec  1 10:00:00 gpu-7 kernel: [ 1843.308145] {l}\n"))
            .collect(),
        // Bare lines.
        lines.iter().map(|l| format!("{l}\n")).collect(),
    ];
    for text in &forms {
        let dir = tempfile::tempdir().unwrap();
        write_uptime(dir.path(), 1900.0);
        // The syslog stamp is a day of this or last year: the lookback and window are widened.
        let config = KernelLogConfig { lookback: Duration::from_secs(400 * 86_400), ..wide() };
        let obs = once_over(dir.path(), text, &config);
        let lost = find(&obs, "gpu_fallen_off_bus", "0000:b3:00.0");
        assert_eq!((lost.status, lost.action), (Fail, Reboot), "{text}");
        assert_eq!(lost.value, Some(1.0), "counted once: {text}");
        assert_eq!(not_ok(&obs).len(), 1, "{text}: {:#?}", not_ok(&obs));
    }
}

/// Rules whose windows are wide enough for a syslog line of any day this year.
fn wide() -> KernelLogConfig {
    let rules = fleetmend_agent::checks::kernel_log::builtin_rules()
        .into_iter()
        .map(|mut rule| {
            rule.clear_after = Duration::from_secs(400 * 86_400);
            rule
        })
        .collect();
    KernelLogConfig { rules, ..KernelLogConfig::default() }
}

fn write_uptime(dir: &Path, secs: f64) {
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    std::fs::write(dir.join("proc/uptime"), format!("{secs:.2} 100.00\n")).unwrap();
}

/// `at` in the machine's time zone, as `dmesg -T` prints it.
fn ctime(at: SystemTime) -> String {
    let zoned = jiff::Timestamp::try_from(at).unwrap().to_zoned(jiff::tz::TimeZone::system());
    zoned.strftime("%a %b %e %H:%M:%S %Y").to_string()
}

/// `at` as syslog prints it (local time, day padded with a space).
fn syslog(at: SystemTime) -> String {
    let zoned = jiff::Timestamp::try_from(at).unwrap().to_zoned(jiff::tz::TimeZone::system());
    zoned.strftime("%b %e %H:%M:%S").to_string()
}

fn iso(at: SystemTime, format: &str) -> String {
    let zoned = jiff::Timestamp::try_from(at).unwrap().to_zoned(jiff::tz::TimeZone::UTC);
    zoned.strftime(format).to_string()
}

const XID79: &str =
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=9962, name=python, GPU has fallen off the bus.";

/// The same Xid 79 a minute ago in every format, and three hours ago (outside the lookback and
/// the rule's window) in the same format: only the recent one counts.
#[test]
fn every_log_format_dates_its_lines() {
    let now = SystemTime::now();
    let recent = now - Duration::from_secs(60);
    let old = now - Duration::from_secs(3 * 3600);
    let uptime = 5.0 * 3600.0;
    let boot = move |at: SystemTime| uptime - now.duration_since(at).unwrap().as_secs_f64();
    type Format = Box<dyn Fn(SystemTime) -> String>;
    let formats: Vec<(&str, Format)> = vec![
        ("kmsg", Box::new(move |at| format!("4,951,{:.0},-;{XID79}", boot(at) * 1e6))),
        ("dmesg", Box::new(move |at| format!("[{:>12.6}] {XID79}", boot(at)))),
        ("dmesg -T", Box::new(|at| format!("[{}] {XID79}", ctime(at)))),
        (
            "dmesg --time-format iso",
            Box::new(|at| format!("{} {XID79}", iso(at, "%Y-%m-%dT%H:%M:%S,%6f+00:00"))),
        ),
        ("syslog", Box::new(|at| format!("{} gpu-7 kernel: [ 1412.890184] {XID79}", syslog(at)))),
        ("journalctl", Box::new(|at| format!("{} gpu-7 kernel: {XID79}", syslog(at)))),
        (
            "journalctl -o short-iso",
            Box::new(|at| format!("{} gpu-7 kernel: {XID79}", iso(at, "%Y-%m-%dT%H:%M:%S+0000"))),
        ),
    ];
    for (name, line) in &formats {
        let dir = tempfile::tempdir().unwrap();
        write_uptime(dir.path(), uptime);
        let text = format!("{}\n", line(recent));
        let obs = once_over(dir.path(), &text, &KernelLogConfig::default());
        assert_eq!(find(&obs, "xid", "0000:3b:00").status, Fail, "{name}: {text}");
        let text = format!("{}\n", line(old));
        let obs = once_over(dir.path(), &text, &KernelLogConfig::default());
        assert!(not_ok(&obs).is_empty(), "{name}, 3 h old: {text}\n{:#?}", not_ok(&obs));
    }
}

#[test]
fn other_programs_lines_in_a_journal_match_nothing() {
    let now = syslog(SystemTime::now());
    let text = format!(
        "{now} gpu-7 NetworkManager[900]: <info> eth0: Link is Down\n\
         {now} gpu-7 sshd[812]: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n\
         {now} gpu-7 kernel: mlx5_core 0000:0c:00.0 ens1f0np0: Link is Down\n"
    );
    let obs = once(&text);
    let not_ok = not_ok(&obs);
    assert_eq!(not_ok.len(), 1, "{not_ok:#?}");
    assert_eq!(
        (not_ok[0].finding.as_str(), not_ok[0].subject.as_str()),
        ("link_down", "ens1f0np0")
    );
}

/// An agent started after an Xid 79 and an mlx5 health failure were logged — during boot, or
/// while it was being restarted — reports both on its first run.
#[test]
fn the_boot_backlog_is_acted_on_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    write_uptime(dir.path(), 300.0);
    std::fs::write(
        &paths.kmsg,
        "6,1,0,-;Linux version 6.8.0-51-generic\n\
         4,640,120000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n\
         3,641,121000000,-;mlx5_core 0000:0d:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count\n \
         SUBSYSTEM=pci\n DEVICE=+pci:0000:0d:00.0\n",
    )
    .unwrap();
    // Daemon mode, as the agent runs: the backlog is read before the first run.
    let mut check =
        KernelLogCheck::new(&KernelLogConfig::default(), build_context(&paths, Mode::Daemon));
    let obs = run(&mut check, &paths);
    assert_eq!(find(&obs, "xid", "0000:3b:00").status, Fail, "{:#?}", obs.findings);
    assert_eq!(find(&obs, "nic_health", "0000:0d:00.0").status, Fail);
    assert_eq!(not_ok(&obs).len(), 2, "{:#?}", not_ok(&obs));
}

/// An agent restarted 20 minutes after an Xid 13 (dealt with: the job restarted) and after a
/// recovery action that went back to none does not raise either again.
#[test]
fn an_agent_restarted_after_a_cleared_condition_does_not_raise_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    write_uptime(dir.path(), 3000.0);
    std::fs::write(
        &paths.kmsg,
        "4,10,1800000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address\n\
         4,11,2900000000,-;NVRM: Xid (PCI:0000:bb:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n\
         4,12,2950000000,-;NVRM: Xid (PCI:0000:bb:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)\n",
    )
    .unwrap();
    let mut check =
        KernelLogCheck::new(&KernelLogConfig::default(), build_context(&paths, Mode::Daemon));
    let obs = run(&mut check, &paths);
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
    // With a lookback long enough to reach the Xid 13, it would be raised: the lookback decides.
    let config =
        KernelLogConfig { lookback: Duration::from_secs(3600), ..KernelLogConfig::default() };
    let mut check = KernelLogCheck::new(&config, build_context(&paths, Mode::Daemon));
    let obs = run(&mut check, &paths);
    assert_eq!(find(&obs, "xid", "0000:3b:00").status, Warn);
}

/// NVIDIA's catalog: an Xid 13 that keeps coming back on the same GPC and TPC is the hardware's.
#[test]
fn a_burst_of_xid_13_on_one_tpc_escalates_to_a_reboot() {
    let line = |gpc: u32, tpc: u32| {
        format!(
            "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC {gpc}, TPC {tpc}, SM 0): Illegal Instruction Parameter"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let uptime = 10_000.0;
    write_uptime(dir.path(), uptime);
    let mut text = String::new();
    // Five incidents a minute apart on GPC 7, TPC 7 (each printing two lines at once), and four
    // on other TPCs.
    for i in 0..5u32 {
        let usec = (uptime as u64 - 600 + u64::from(i) * 60) * 1_000_000;
        text.push_str(&format!("4,{},{usec},-;{}\n", 2 * i, line(7, 7)));
        text.push_str(&format!("4,{},{},-;{}\n", 2 * i + 1, usec + 100, line(7, 7)));
        if i < 4 {
            text.push_str(&format!("4,{},{usec},-;{}\n", 100 + i, line(i, 0)));
        }
    }
    let obs = once_over(dir.path(), &text, &KernelLogConfig::default());
    let burst = find(&obs, "xid_burst", "0000:cb:00");
    assert_eq!((burst.status, burst.action), (Fail, Reboot), "{burst:#?}");
    assert_eq!(burst.labels.get("count").map(String::as_str), Some("5"));
    assert!(burst.message.contains("GPC 7, TPC 7"), "{}", burst.message);
    // Four incidents are not a burst.
    let four: String = text
        .lines()
        .filter(|l| !l.starts_with("4,8,") && !l.starts_with("4,9,"))
        .map(|l| format!("{l}\n"))
        .collect();
    let obs = once_over(dir.path(), &four, &KernelLogConfig::default());
    assert!(obs.findings.iter().all(|f| f.finding != "xid_burst"), "{:#?}", obs.findings);
    // An hour later the burst has cleared.
    let paths = HostPaths::tree(dir.path());
    std::fs::write(&paths.kmsg, &text).unwrap();
    let mut check =
        KernelLogCheck::new(&KernelLogConfig::default(), build_context(&paths, Mode::Once));
    assert_eq!(find(&run(&mut check, &paths), "xid_burst", "0000:cb:00").status, Fail);
    let later = SystemTime::now() + Duration::from_secs(3700);
    let obs = run_at(&mut check, &paths, later);
    assert_eq!(find(&obs, "xid_burst", "0000:cb:00").status, Status::Ok);
}

#[test]
fn bad_bursts_and_lookback_are_refused_naming_each_field() {
    let config = fleetmend_agent::config::AgentConfig::parse(
        r#"
[checks.kernel_log]
lookback = "0s"

[checks.kernel_log.xid_bursts.thirteen]
count = 5

[checks.kernel_log.xid_bursts.31]
count = 1
window = "0s"
status = "ok"
"#,
    )
    .unwrap();
    let problems = config.validate();
    let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
    for field in [
        "checks.kernel_log.lookback",
        "checks.kernel_log.xid_bursts.thirteen",
        "checks.kernel_log.xid_bursts.31.count",
        "checks.kernel_log.xid_bursts.31.window",
        "checks.kernel_log.xid_bursts.31.status",
    ] {
        assert!(fields.contains(&field), "{field} missing from\n{problems}");
    }
}

/// docs/detection.md is the catalog a user reads: every built-in rule is in it.
#[test]
fn every_builtin_rule_is_in_the_detection_catalog() {
    let docs = include_str!("../../docs/detection.md");
    for rule in fleetmend_agent::checks::kernel_log::builtin_rules() {
        assert!(
            docs.contains(&format!("| `{}` |", rule.name)),
            "{} is not in docs/detection.md",
            rule.name
        );
    }
}
