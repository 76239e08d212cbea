//! Faults written into a node's host tree, and `fleetmend inject`.
//!
//! Each fault is written the way the real one shows on a host, in the files the agent reads, so
//! the agent finds it with the same checks it runs on real nodes:
//!
//! | fault | what is written | what the agent reports |
//! |---|---|---|
//! | `gpu-xid:N` | the NVRM Xid line in the kernel log for GPU 3; in `gpu.json` the Xid counted, and for 79 the GPU lost, for 48 the ECC error, the pending row remap and the driver's reset advice | `xid` from the catalog (79: fail, reboot; 48: fail, reset-gpu), at once |
//! | `gpu-missing` | GPU 7 gone from `gpu.json`; the driver's init failure in the kernel log | `gpu_count` and `gpu_init_failed` fail, reboot |
//! | `row-remap-failure` | GPU 3's row remapping failed (no spare rows) in `gpu.json` | `row_remap` fail, replace |
//! | `nvlink-down` | GPU 3's NVLink 4 inactive in `gpu.json` | `nvlink_down` fail, reset-gpu |
//! | `nic-down` | eth0's `operstate` down, `carrier` 0, a carrier change; "Link is Down" in the kernel log | `nic_down` fail, drain |
//! | `ib-port-down` | InfiniBand port mlx5_0/1 `state` 1: DOWN, `phys_state` 2: Polling (no link partner), `link_downed` counted; its IPoIB interface ib0 loses carrier | `ib_port_down` and `nic_down` fail, drain |
//! | `pcie-downtrained` | GPU 3's PCIe link trained at x8 of its x16 in `gpu.json` (NVML's current and max link width) | `pcie_link` fail, reboot |
//! | `gpu-throttle` | GPU 3 held down by the hardware in `gpu.json`: clock event reasons `hw_slowdown` and `hw_thermal_slowdown` active, 94 °C, its SM clock at 1095 MHz | `throttle` warn, and fail, drain once sustained (from the first run in the local fleet) |
//! | `nvswitch-fatal` | NVSwitch 2's fatal SXid in the kernel log, as the NVSwitch driver prints it, with its severity line | `nvswitch_fatal` fail, reboot |
//! | `mlx5-health` | the mlx5 driver's health poller giving up on adapter 0000:0c:00.0 in the kernel log (miss count reached, unrecoverable hardware error) | `nic_health` fail, reboot |
//! | `nic-pcie-downtrained` | the mlx5 NIC 0000:0c:00.0's `current_link_speed` at 8.0 GT/s (Gen3) under its 32.0 GT/s maximum in `sys/bus/pci/devices` | `pcie_speed` fail, reboot |
//! | `gpu-lost` | GPU 3 gone from `gpu.json`; the driver's three-line probe message "The NVIDIA GPU ... has fallen off the bus" (one kmsg record), no Xid | `gpu_fallen_off_bus` and `gpu_count` fail, reboot |
//! | `xid-burst` | five incidents of Xid 13 on GPU 3's GPC 1, TPC 2, two seconds apart, two lines each | `xid_burst` fail, reboot (each `xid` warn, restart-app) |
//! | `gsp-timeout` | GPU 3's Xid 119 (GSP RPC timeout), the RPC buffer line and "The GPU likely needs to be reset."; in `gpu.json` Xid 119 counted | `gpu_needs_reset` and `xid` fail, reset-gpu |
//! | `disk-full` | a 1 MiB tmpfs mounted on `root/scratch` and filled (root only); the mount table shows it | `disk_full` fail, drain |
//! | `disk-readonly` | `/scratch` remounted `ro` in `proc/mounts` | `disk_readonly` fail, reboot |
//! | `kernel-mce` | a machine check in the kernel log | `mce` warn |
//! | `agent-kill` | nothing: SIGKILL to the pid in `agent.pid` | the node stops reporting |
//! | `hang` | nothing: SIGSTOP to the process group of each of the node's job ranks (found by their `FLEETMEND_RANK_DIR`) | nothing: the node is healthy, its rank stops stepping and posting, which the queue sees |
//! | `nan` | nothing: SIGUSR2 to each of the node's job ranks, the bundled trainer's fault hook (its next gradient gets a NaN) | nothing: the job's loss goes NaN, which the queue sees |
//! | `slow:PERCENT` | nothing: each of the node's job ranks moved into a CPU cgroup with PERCENT % of the CPU it used (root only) | nothing: the rank steps slower, which the queue sees as a straggler |
//!
//! A persistent fault survives [`NodeTree::reboot`] (it is written again into the new boot's tree:
//! a broken part, not a passing event); the others are gone after a reboot.

mod job;

pub use self::job::release_throttles;

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

use fleetmend_agent::gpu::{EccCounts, GpuCondition, GpuSnapshot, GpuState, RemappedRows};
use serde::{Deserialize, Serialize};

use crate::tree::{
    self, DEFAULT_STATE_DIR, GPU_FIXTURE_PATH, MOUNTS_PATH, NodeTree, STATE_DIR_ENV, TreeError,
    TreeMeta,
};

/// The GPU that GPU faults hit (PCI 0000:5d:00.0 in the template).
pub const FAULTY_GPU: u32 = 3;
/// The GPU that `gpu-missing` takes away (the last one: a GPU that fails to initialise drops out
/// of the enumeration).
pub const MISSING_GPU: u32 = 7;
/// The NVLink that `nvlink-down` takes down.
pub const DOWN_NVLINK: u32 = 4;
/// The interface that `nic-down` takes down.
pub const DOWN_NIC: &str = "eth0";
/// The InfiniBand device and port that `ib-port-down` takes down, and its IPoIB interface.
pub const DOWN_IB: (&str, u32, &str) = ("mlx5_0", 1, "ib0");
/// The mount that `disk-full` fills and `disk-readonly` makes read-only.
pub const FAULTY_MOUNT: &str = "/scratch";
/// The NIC (its PCI address) whose link `nic-pcie-downtrained` trains slower.
pub const DOWNTRAINED_NIC: &str = "0000:0c:00.0";
/// The fatal SXid `nvswitch-fatal` writes, and the severity line the driver prints after it.
const NVSWITCH_FATAL: &str =
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 11001, Fatal, Link 22 ingress invalid command";
const NVSWITCH_SEVERITY: &str = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 11001, Severity 5 Engine instance 22 Sub-engine instance 00";
/// The mlx5 health poller's lines `mlx5-health` writes (the adapter of eth0).
const MLX5_MISS_COUNT: &str = "mlx5_core 0000:0c:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count";
const MLX5_SYNDROME: &str =
    "mlx5_core 0000:0c:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error";
/// The size of the tmpfs `disk-full` mounts.
const FULL_TMPFS_OPTIONS: &str = "size=1m,mode=0755";
/// How long `agent-kill` waits for the killed agent to be gone (or a zombie for its parent).
const KILL_WAIT: Duration = Duration::from_secs(5);

/// A fault `fleetmend inject` can write into a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Fault {
    /// An Xid event of this code on GPU [`FAULTY_GPU`].
    GpuXid(u32),
    /// GPU [`MISSING_GPU`] no longer enumerates.
    GpuMissing,
    /// GPU [`FAULTY_GPU`] ran out of spare rows.
    RowRemapFailure,
    /// NVLink [`DOWN_NVLINK`] of GPU [`FAULTY_GPU`] went inactive.
    NvlinkDown,
    /// Interface [`DOWN_NIC`] lost its link.
    NicDown,
    /// InfiniBand port [`DOWN_IB`] lost its link.
    IbPortDown,
    /// GPU [`FAULTY_GPU`]'s PCIe link trained narrower than it can.
    PcieDowntrained,
    /// GPU [`FAULTY_GPU`] slowed down by the hardware (thermal slowdown).
    GpuThrottle,
    /// A fatal NVSwitch error (SXid).
    NvswitchFatal,
    /// The NIC's firmware stopped answering the mlx5 driver's health poll.
    Mlx5Health,
    /// NIC [`DOWNTRAINED_NIC`]'s PCIe link trained at Gen3 where it can run Gen5 (sysfs).
    NicPcieDowntrained,
    /// GPU [`FAULTY_GPU`] fell off the bus with no Xid: the driver's three-line probe message, and
    /// the GPU gone from NVML.
    GpuLost,
    /// Xid 13 on the same GPC and TPC of GPU [`FAULTY_GPU`], five incidents over eight seconds.
    XidBurst,
    /// GPU [`FAULTY_GPU`]'s GSP firmware stopped answering: Xid 119 and the driver's "The GPU
    /// likely needs to be reset."
    GspTimeout,
    /// [`FAULTY_MOUNT`] is full.
    DiskFull,
    /// [`FAULTY_MOUNT`] was remounted read-only.
    DiskReadonly,
    /// A machine check in the kernel log.
    KernelMce,
    /// The node's agent is killed (SIGKILL): the node stops reporting.
    AgentKill,
    /// The node's job ranks are stopped (SIGSTOP): the job hangs in its collective with no log
    /// line and no finding.
    Hang,
    /// The node's job ranks get SIGUSR2, on which the bundled trainer puts a NaN into its next
    /// gradient: the job's loss goes NaN, as after a bad batch or silent data corruption.
    Nan,
    /// The node's job ranks are moved into a CPU cgroup whose quota lets them use this
    /// percentage of the CPU they used before: a rank that steps slower than its peers.
    Slow(u32),
}

/// Every fault name, as `fleetmend inject` takes them.
pub const FAULT_NAMES: [&str; 21] = [
    "gpu-xid:N",
    "gpu-missing",
    "row-remap-failure",
    "nvlink-down",
    "nic-down",
    "ib-port-down",
    "pcie-downtrained",
    "gpu-throttle",
    "nvswitch-fatal",
    "mlx5-health",
    "nic-pcie-downtrained",
    "gpu-lost",
    "xid-burst",
    "gsp-timeout",
    "disk-full",
    "disk-readonly",
    "kernel-mce",
    "agent-kill",
    "hang",
    "nan",
    "slow:PERCENT",
];

/// The most digits an Xid code has in the driver's kernel-log line.
const MAX_XID: u32 = 99_999;

impl Fault {
    /// Whether the fault is written into the tree (all but `agent-kill` and `hang`, which signal
    /// processes).
    pub fn is_tree_fault(&self) -> bool {
        !matches!(self, Fault::AgentKill | Fault::Hang | Fault::Nan | Fault::Slow(_))
    }

    /// Whether the fault hits the job's ranks rather than the node (`hang`, `nan`): the node
    /// stays healthy and the queue, not the agent, sees it.
    pub fn is_job_fault(&self) -> bool {
        matches!(self, Fault::Hang | Fault::Nan | Fault::Slow(_))
    }

    /// Whether the fault can survive a reboot (a process fault cannot: the reboot ends the
    /// processes it hit).
    pub fn can_persist(&self) -> bool {
        self.is_tree_fault()
    }

    /// What the node's agent reports once the fault is written: (check, finding) pairs. Empty for
    /// `agent-kill`: the node goes silent, which the repairer sees, not the agent.
    pub fn agent_findings(&self) -> &'static [(&'static str, &'static str)] {
        use fleetmend_agent::checks::{disk, gpu, kernel_log, nic, pcie};
        match self {
            Fault::GpuXid(_) => &[(gpu::NAME, "xid"), (kernel_log::NAME, "xid")],
            Fault::GpuMissing => &[(gpu::NAME, "gpu_count"), (kernel_log::NAME, "gpu_init_failed")],
            Fault::RowRemapFailure => &[(gpu::NAME, "row_remap")],
            Fault::NvlinkDown => &[(gpu::NAME, "nvlink_down")],
            Fault::NicDown => &[(nic::NAME, "nic_down"), (kernel_log::NAME, "link_down")],
            Fault::IbPortDown => &[(nic::NAME, "ib_port_down"), (nic::NAME, "nic_down")],
            Fault::PcieDowntrained => &[(gpu::NAME, "pcie_link")],
            Fault::GpuThrottle => &[(gpu::NAME, "throttle")],
            Fault::NvswitchFatal => &[(kernel_log::NAME, "nvswitch_fatal")],
            Fault::Mlx5Health => &[(kernel_log::NAME, "nic_health")],
            Fault::NicPcieDowntrained => &[(pcie::NAME, "pcie_speed")],
            Fault::GpuLost => &[(kernel_log::NAME, "gpu_fallen_off_bus"), (gpu::NAME, "gpu_count")],
            Fault::XidBurst => &[(kernel_log::NAME, "xid_burst"), (kernel_log::NAME, "xid")],
            Fault::GspTimeout => &[
                (kernel_log::NAME, "gpu_needs_reset"),
                (kernel_log::NAME, "xid"),
                (gpu::NAME, "xid"),
            ],
            Fault::DiskFull => &[(disk::NAME, "disk_full")],
            Fault::DiskReadonly => &[(disk::NAME, "disk_readonly")],
            Fault::KernelMce => &[(kernel_log::NAME, "mce")],
            Fault::AgentKill | Fault::Hang | Fault::Nan | Fault::Slow(_) => &[],
        }
    }

    /// Whether the agent's own advice for the fault is a replacement (DCGM fails a GPU whose row
    /// remapping failed): a reboot cannot clear it.
    pub fn agent_advises_replace(&self) -> bool {
        matches!(self, Fault::RowRemapFailure)
    }

    /// What injecting the fault writes, in a few words (for `fleetmend inject`'s output).
    pub fn description(&self) -> String {
        match self {
            Fault::GpuXid(79) => format!(
                "kernel log: NVRM Xid 79 on GPU {FAULTY_GPU} (fallen off the bus); gpu.json: GPU {FAULTY_GPU} lost, Xid 79 counted"
            ),
            Fault::GpuXid(48) => format!(
                "kernel log: NVRM Xid 48 on GPU {FAULTY_GPU} (double-bit ECC error); gpu.json: an uncorrectable ECC error, a pending row remap, the driver asks for a GPU reset, Xid 48 counted"
            ),
            Fault::GpuXid(code) => format!(
                "kernel log: NVRM Xid {code} on GPU {FAULTY_GPU}; gpu.json: Xid {code} counted"
            ),
            Fault::GpuMissing => format!(
                "gpu.json: GPU {MISSING_GPU} no longer enumerates (7 of 8); kernel log: its RmInitAdapter failure"
            ),
            Fault::RowRemapFailure => {
                format!("gpu.json: GPU {FAULTY_GPU} row remapping failed (no spare rows left)")
            }
            Fault::NvlinkDown => {
                format!("gpu.json: GPU {FAULTY_GPU} NVLink {DOWN_NVLINK} inactive")
            }
            Fault::NicDown => format!(
                "sysfs: {DOWN_NIC} operstate down, carrier 0; kernel log: {DOWN_NIC} Link is Down"
            ),
            Fault::IbPortDown => {
                let (device, port, netdev) = DOWN_IB;
                format!(
                    "sysfs: InfiniBand {device}/{port} state 1: DOWN, phys_state 2: Polling, link_downed counted; {netdev} carrier 0"
                )
            }
            Fault::GpuThrottle => format!(
                "gpu.json: GPU {FAULTY_GPU} clock event reasons hw_slowdown, hw_thermal_slowdown; 94 °C; SM clock 1095 MHz"
            ),
            Fault::PcieDowntrained => {
                format!("gpu.json: GPU {FAULTY_GPU} PCIe link width x8 of x16")
            }
            Fault::NvswitchFatal => format!("kernel log: {NVSWITCH_FATAL}"),
            Fault::Mlx5Health => format!("kernel log: {MLX5_MISS_COUNT}"),
            Fault::NicPcieDowntrained => format!(
                "sysfs: NIC {DOWNTRAINED_NIC}'s current_link_speed 8.0 GT/s PCIe (Gen3) of its 32.0 GT/s (Gen5)"
            ),
            Fault::GpuLost => format!(
                "gpu.json: GPU {FAULTY_GPU} no longer enumerates; kernel log: NVRM's three-line \"has fallen off the bus\" probe message, no Xid"
            ),
            Fault::XidBurst => format!(
                "kernel log: Xid 13 on GPU {FAULTY_GPU}, GPC 1, TPC 2, five incidents over 8 s"
            ),
            Fault::GspTimeout => format!(
                "kernel log: Xid 119 (GSP RPC timeout) on GPU {FAULTY_GPU} and \"The GPU likely needs to be reset.\"; gpu.json: Xid 119 counted"
            ),
            Fault::DiskFull => format!(
                "a 1 MiB tmpfs mounted on {FAULTY_MOUNT} under the tree's root and filled; proc/mounts shows it"
            ),
            Fault::DiskReadonly => format!("proc/mounts: {FAULTY_MOUNT} remounted read-only"),
            Fault::KernelMce => "kernel log: mce: [Hardware Error] machine check".to_owned(),
            Fault::AgentKill => "SIGKILL to the pid in agent.pid".to_owned(),
            Fault::Hang => {
                "SIGSTOP to the process group of each of the node's job ranks".to_owned()
            }
            Fault::Nan => {
                "SIGUSR2 to each of the node's job ranks: the trainer's next gradient gets a NaN"
                    .to_owned()
            }
            Fault::Slow(percent) => format!(
                "each of the node's job ranks in a CPU cgroup with {percent} % of the CPU it used"
            ),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::GpuXid(code) => write!(f, "gpu-xid:{code}"),
            Fault::GpuMissing => f.write_str("gpu-missing"),
            Fault::RowRemapFailure => f.write_str("row-remap-failure"),
            Fault::NvlinkDown => f.write_str("nvlink-down"),
            Fault::NicDown => f.write_str("nic-down"),
            Fault::IbPortDown => f.write_str("ib-port-down"),
            Fault::PcieDowntrained => f.write_str("pcie-downtrained"),
            Fault::GpuThrottle => f.write_str("gpu-throttle"),
            Fault::NvswitchFatal => f.write_str("nvswitch-fatal"),
            Fault::Mlx5Health => f.write_str("mlx5-health"),
            Fault::NicPcieDowntrained => f.write_str("nic-pcie-downtrained"),
            Fault::GpuLost => f.write_str("gpu-lost"),
            Fault::XidBurst => f.write_str("xid-burst"),
            Fault::GspTimeout => f.write_str("gsp-timeout"),
            Fault::DiskFull => f.write_str("disk-full"),
            Fault::DiskReadonly => f.write_str("disk-readonly"),
            Fault::KernelMce => f.write_str("kernel-mce"),
            Fault::AgentKill => f.write_str("agent-kill"),
            Fault::Hang => f.write_str("hang"),
            Fault::Nan => f.write_str("nan"),
            Fault::Slow(percent) => write!(f, "slow:{percent}"),
        }
    }
}

/// A fault name that is not one of [`FAULT_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a fault: {reason} (valid faults: {})", FAULT_NAMES.join(", "))]
pub struct FaultParseError {
    pub text: String,
    pub reason: String,
}

impl FromStr for Fault {
    type Err = FaultParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |reason: String| FaultParseError { text: text.to_owned(), reason };
        if let Some(percent) = text.strip_prefix("slow:") {
            return match percent.trim_end_matches('%').parse::<u32>() {
                Ok(percent) if (1..=99).contains(&percent) => Ok(Fault::Slow(percent)),
                _ => Err(error(
                    "the percentage of its CPU a rank keeps must be 1 to 99, e.g. slow:50"
                        .to_owned(),
                )),
            };
        }
        if text == "slow" {
            return Err(error("slow needs a percentage, e.g. slow:50".to_owned()));
        }
        if let Some(code) = text.strip_prefix("gpu-xid:") {
            return match code.parse::<u32>() {
                Ok(code) if (1..=MAX_XID).contains(&code) => Ok(Fault::GpuXid(code)),
                _ => Err(error(format!(
                    "the Xid code must be a number from 1 to {MAX_XID}, e.g. gpu-xid:79"
                ))),
            };
        }
        Ok(match text {
            "gpu-xid" => return Err(error("gpu-xid needs a code, e.g. gpu-xid:79".to_owned())),
            "gpu-missing" => Fault::GpuMissing,
            "row-remap-failure" => Fault::RowRemapFailure,
            "nvlink-down" => Fault::NvlinkDown,
            "nic-down" => Fault::NicDown,
            "ib-port-down" => Fault::IbPortDown,
            "pcie-downtrained" => Fault::PcieDowntrained,
            "gpu-throttle" => Fault::GpuThrottle,
            "nvswitch-fatal" => Fault::NvswitchFatal,
            "mlx5-health" => Fault::Mlx5Health,
            "nic-pcie-downtrained" => Fault::NicPcieDowntrained,
            "gpu-lost" => Fault::GpuLost,
            "xid-burst" => Fault::XidBurst,
            "gsp-timeout" => Fault::GspTimeout,
            "disk-full" => Fault::DiskFull,
            "disk-readonly" => Fault::DiskReadonly,
            "kernel-mce" => Fault::KernelMce,
            "agent-kill" => Fault::AgentKill,
            "hang" => Fault::Hang,
            "nan" => Fault::Nan,
            _ => return Err(error("unknown name".to_owned())),
        })
    }
}

impl TryFrom<String> for Fault {
    type Error = FaultParseError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<Fault> for String {
    fn from(fault: Fault) -> String {
        fault.to_string()
    }
}

/// A fault written into a node, as `node.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectedFault {
    /// The fault.
    pub fault: Fault,
    /// When it was injected (a persistent fault keeps this time across reboots).
    pub at: SystemTime,
    /// Whether it survives a reboot.
    pub persistent: bool,
}

/// A fault could not be injected.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("agent-kill is not written into the tree: kill the agent with NodeTree::kill_agent")]
    NotATreeFault,
    #[error(
        "agent-kill cannot be persistent: a reboot starts the agent again (inject it again after the reboot)"
    )]
    PersistentAgentKill,
    #[error(
        "{fault} cannot be persistent: it signals processes, which a reboot ends (inject it again after the reboot)"
    )]
    NotPersistent { fault: Fault },
    #[error(
        "node {node} runs no job rank (none of its processes has a FLEETMEND_RANK_DIR under {}): nothing to {fault}",
        dir.display()
    )]
    NoRanks { fault: Fault, node: String, dir: PathBuf },
    #[error("{fault}: signalling rank {rank} of node {node} (pid {pid}): {errno}")]
    SignalRank { fault: Fault, node: String, rank: String, pid: u32, errno: nix::errno::Errno },
    #[error(
        "{fault} needs root: it moves the ranks into a CPU cgroup (run fleetmend inject as root)"
    )]
    ThrottleNeedsRoot { fault: Fault },
    #[error(
        "{fault}: no cgroup hierarchy here can cap CPU (neither a cgroup v2 one with the cpu controller nor cgroup v1's cpu under /sys/fs/cgroup)"
    )]
    NoCpuController { fault: Fault },
    #[error("{fault}: {what}: {source}")]
    Throttle { fault: Fault, what: String, source: io::Error },
    #[error(
        "{fault} needs root: it mounts a real 1 MiB tmpfs on {} so the agent's statvfs and write probe see a full filesystem (run fleetmend inject as root)",
        path.display()
    )]
    NeedsRoot { fault: Fault, path: PathBuf },
    #[error("mounting a tmpfs on {}: {errno}{}", path.display(), if *errno == nix::errno::Errno::EPERM { " (disk-full needs root with CAP_SYS_ADMIN)" } else { "" })]
    Mount { path: PathBuf, errno: nix::errno::Errno },
    #[error("filling {}: {message}", path.display())]
    Fill { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    Fixture { path: PathBuf, message: String },
    #[error("reading {}: {source} (is the node's agent running? fleetmend up writes it)", path.display())]
    AgentPid { path: PathBuf, source: io::Error },
    #[error("{}: {text:?} is not a process id", path.display())]
    AgentPidInvalid { path: PathBuf, text: String },
    #[error("the agent of node {node} (pid {pid}) is not running")]
    AgentNotRunning { node: String, pid: i32 },
    #[error(
        "pid {pid} in the agent.pid of node {node} is not that node's agent (command line: {command}); not killing it"
    )]
    NotTheAgent { node: String, pid: i32, command: String },
    #[error("killing the agent of node {node} (pid {pid}): {errno}")]
    Kill { node: String, pid: i32, errno: nix::errno::Errno },
    #[error(
        "the agent of node {node} (pid {pid}) was sent SIGKILL but is still running after {waited:?}"
    )]
    KillTimeout { node: String, pid: i32, waited: Duration },
}

impl NodeTree {
    /// Writes `fault` into the tree the way the real fault shows on a host (see the module doc),
    /// and records it in the tree's fault list; `persistent` ones survive [`NodeTree::reboot`].
    /// `agent-kill` is not a tree fault: [`NodeTree::kill_agent`] does it.
    pub fn inject(&self, fault: &Fault, persistent: bool) -> Result<(), InjectError> {
        if !fault.is_tree_fault() {
            return Err(InjectError::NotATreeFault);
        }
        let _lock = self.lock()?;
        let mut meta = self.read_meta()?;
        apply(self, &meta, fault)?;
        meta.faults.push(InjectedFault { fault: *fault, at: SystemTime::now(), persistent });
        self.write_meta(&meta)?;
        Ok(())
    }

    /// The faults in effect on this boot (persistent ones carried over from earlier boots too),
    /// in the order they were injected.
    pub fn faults(&self) -> Result<Vec<InjectedFault>, TreeError> {
        Ok(self.read_meta()?.faults)
    }

    /// `agent-kill`: sends SIGKILL to the pid in `agent.pid`, after checking that the process is
    /// this tree's agent (a stale pid file must not kill an unrelated process), and waits until
    /// it is gone or a zombie for its parent to reap. Records the fault; returns the pid.
    pub fn kill_agent(&self) -> Result<i32, InjectError> {
        let node = self.node().to_owned();
        let path = self.agent_pid_path();
        let text = fs::read_to_string(&path)
            .map_err(|source| InjectError::AgentPid { path: path.clone(), source })?;
        let pid = match text.trim().parse::<i32>() {
            Ok(pid) if pid > 1 => pid,
            _ => return Err(InjectError::AgentPidInvalid { path, text: text.trim().to_owned() }),
        };
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let args: Vec<String> = match fs::read(proc_dir.join("cmdline")) {
            Ok(bytes) => bytes
                .split(|b| *b == 0)
                .filter(|arg| !arg.is_empty())
                .map(|arg| String::from_utf8_lossy(arg).into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        if args.is_empty() || process_gone(&proc_dir) {
            return Err(InjectError::AgentNotRunning { node, pid });
        }
        let sysfs_flag = format!("--path.sysfs={}", self.dir().join("sys").display());
        let is_agent = args.iter().any(|arg| arg == "agent") && args.contains(&sysfs_flag);
        if !is_agent {
            return Err(InjectError::NotTheAgent { node, pid, command: args.join(" ") });
        }
        let target = nix::unistd::Pid::from_raw(pid);
        match nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL) {
            Ok(()) => {}
            Err(nix::errno::Errno::ESRCH) => {
                return Err(InjectError::AgentNotRunning { node, pid });
            }
            Err(errno) => return Err(InjectError::Kill { node, pid, errno }),
        }
        let deadline = Instant::now() + KILL_WAIT;
        while !process_gone(&proc_dir) {
            if Instant::now() >= deadline {
                return Err(InjectError::KillTimeout { node, pid, waited: KILL_WAIT });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _lock = self.lock()?;
        let mut meta = self.read_meta()?;
        meta.faults.push(InjectedFault {
            fault: Fault::AgentKill,
            at: SystemTime::now(),
            persistent: false,
        });
        self.write_meta(&meta)?;
        Ok(pid)
    }
}

/// The process of `/proc/<pid>` has exited: gone, or a zombie waiting for its parent.
fn process_gone(proc_dir: &Path) -> bool {
    match fs::read_to_string(proc_dir.join("stat")) {
        // The state follows the command name in parentheses, which may itself hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// Writes `fault` into the tree of the boot `meta` describes (the caller holds the lock and
/// records the fault).
pub(crate) fn apply(tree: &NodeTree, meta: &TreeMeta, fault: &Fault) -> Result<(), InjectError> {
    match *fault {
        Fault::GpuXid(code) => gpu_xid(tree, meta, code),
        Fault::GpuMissing => {
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
                // What the driver prints when a GPU fails to initialise at load.
                let line = format!(
                    "NVRM: GPU {}: RmInitAdapter failed! (0x26:0x56:1474)",
                    kernel_pci(&pci, true)
                );
                tree.append_kmsg(meta, &[(3, line)])?;
            }
            Ok(())
        }
        Fault::RowRemapFailure => edit_gpu(tree, FAULTY_GPU, |gpu| {
            // As on a GPU whose bank ran out of spare rows (the agent's fixture of that case).
            gpu.remapped_rows = Some(RemappedRows {
                correctable: 12,
                uncorrectable: 9,
                pending: false,
                failure: true,
            });
            let ecc = gpu.ecc.get_or_insert_with(EccCounts::default);
            ecc.aggregate_corrected = Some(ecc.aggregate_corrected.unwrap_or(0).max(212));
            ecc.aggregate_uncorrected = Some(ecc.aggregate_uncorrected.unwrap_or(0).max(9));
        }),
        Fault::NvlinkDown => edit_gpu(tree, FAULTY_GPU, |gpu| {
            for link in gpu.nvlinks.iter_mut().filter(|link| link.link == DOWN_NVLINK) {
                link.active = false;
            }
        }),
        Fault::NicDown => nic_down(tree, meta),
        Fault::IbPortDown => ib_port_down(tree),
        Fault::NvswitchFatal => tree
            .append_kmsg(meta, &[(3, NVSWITCH_FATAL.to_owned()), (3, NVSWITCH_SEVERITY.to_owned())])
            .map_err(InjectError::from),
        Fault::Mlx5Health => tree
            .append_kmsg(meta, &[(3, MLX5_MISS_COUNT.to_owned()), (3, MLX5_SYNDROME.to_owned())])
            .map_err(InjectError::from),
        Fault::PcieDowntrained => edit_gpu(tree, FAULTY_GPU, |gpu| {
            gpu.pcie_link_width_max = Some(gpu.pcie_link_width_max.unwrap_or(16).max(16));
            gpu.pcie_link_width = Some(8);
        }),
        Fault::GpuThrottle => edit_gpu(tree, FAULTY_GPU, |gpu| {
            use fleetmend_agent::gpu::ClockEventReason::{HwSlowdown, HwThermalSlowdown};
            gpu.clock_event_reasons = Some(vec![HwSlowdown, HwThermalSlowdown]);
            gpu.temperature_celsius = Some(94);
            gpu.sm_clock_mhz = Some(1095);
        }),
        Fault::DiskFull => disk_full(tree),
        Fault::DiskReadonly => edit_mount_line(tree, FAULTY_MOUNT, |fields| {
            let options: Vec<&str> =
                fields[3].split(',').filter(|o| *o != "rw" && *o != "ro").collect();
            fields[3] = std::iter::once("ro").chain(options).collect::<Vec<_>>().join(",");
        }),
        Fault::KernelMce => tree
            .append_kmsg(
                meta,
                &[
                    (3, "mce: [Hardware Error]: Machine check events logged".to_owned()),
                    (
                        3,
                        "mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: cc00008000010090"
                            .to_owned(),
                    ),
                ],
            )
            .map_err(InjectError::from),
        Fault::NicPcieDowntrained => {
            let path = tree.dir().join("sys/bus/pci/devices").join(DOWNTRAINED_NIC);
            tree::write_atomic(&path.join("current_link_speed"), b"8.0 GT/s PCIe\n")
                .map_err(InjectError::from)
        }
        Fault::GpuLost => gpu_lost(tree, meta),
        Fault::XidBurst => xid_burst(tree, meta),
        Fault::GspTimeout => gsp_timeout(tree, meta),
        Fault::AgentKill | Fault::Hang | Fault::Nan | Fault::Slow(_) => {
            Err(InjectError::NotATreeFault)
        }
    }
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
fn gpu_lost(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
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
fn xid_burst(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
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
fn gsp_timeout(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
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

fn gpu_xid(tree: &NodeTree, meta: &TreeMeta, code: u32) -> Result<(), InjectError> {
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

fn nic_down(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
    let dir = tree.dir().join("sys/class/net").join(DOWN_NIC);
    let changes_path = dir.join("carrier_changes");
    let changes: u64 = fs::read_to_string(&changes_path)
        .map_err(|source| TreeError::Read { path: changes_path.clone(), source })?
        .trim()
        .parse()
        .unwrap_or(0);
    // Only a change of state counts as a carrier change: a second nic-down changes nothing.
    let carrier_path = dir.join("carrier");
    let was_up = fs::read_to_string(&carrier_path).map(|c| c.trim() == "1").unwrap_or(true);
    tree::write_atomic(&dir.join("operstate"), b"down\n")?;
    tree::write_atomic(&carrier_path, b"0\n")?;
    // The kernel has no speed for a link that is down.
    tree::write_atomic(&dir.join("speed"), b"-1\n")?;
    if was_up {
        tree::write_atomic(&changes_path, format!("{}\n", changes + 1).as_bytes())?;
    }
    tree.append_kmsg(meta, &[(6, format!("mlx5_core 0000:0c:00.0 {DOWN_NIC}: Link is Down"))])?;
    Ok(())
}

/// The port as the mlx5 driver shows a link with no partner (a pulled cable, a dead switch port):
/// `1: DOWN` / `2: Polling`, one more `link_downed` on the way down; IPoIB drops the carrier of
/// the port's interface with it.
fn ib_port_down(tree: &NodeTree) -> Result<(), InjectError> {
    let (device, port, netdev) = DOWN_IB;
    let dir =
        tree.dir().join("sys/class/infiniband").join(device).join("ports").join(port.to_string());
    let state_path = dir.join("state");
    let was_up = fs::read_to_string(&state_path).map(|s| s.contains("ACTIVE")).unwrap_or(true);
    tree::write_atomic(&state_path, b"1: DOWN\n")?;
    tree::write_atomic(&dir.join("phys_state"), b"2: Polling\n")?;
    let netdev_dir = tree.dir().join("sys/class/net").join(netdev);
    tree::write_atomic(&netdev_dir.join("operstate"), b"down\n")?;
    tree::write_atomic(&netdev_dir.join("carrier"), b"0\n")?;
    if was_up {
        for path in [dir.join("counters/link_downed"), netdev_dir.join("carrier_changes")] {
            let count: u64 = fs::read_to_string(&path)
                .map_err(|source| TreeError::Read { path: path.clone(), source })?
                .trim()
                .parse()
                .unwrap_or(0);
            tree::write_atomic(&path, format!("{}\n", count + 1).as_bytes())?;
        }
    }
    Ok(())
}

fn disk_full(tree: &NodeTree) -> Result<(), InjectError> {
    let relative = FAULTY_MOUNT.trim_start_matches('/');
    let target = tree.dir().join("root").join(relative);
    if !nix::unistd::geteuid().is_root() {
        return Err(InjectError::NeedsRoot { fault: Fault::DiskFull, path: target });
    }
    let mounted = tree::mounts_under(&target)?.contains(&target);
    if !mounted {
        nix::mount::mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(FULL_TMPFS_OPTIONS),
        )
        .map_err(|errno| InjectError::Mount { path: target.clone(), errno })?;
    }
    let result = fill(&target).and_then(|()| {
        edit_mount_line(tree, FAULTY_MOUNT, |fields| {
            let readonly = fields[3].split(',').any(|o| o == "ro");
            fields[0] = "tmpfs".to_owned();
            fields[2] = "tmpfs".to_owned();
            fields[3] = format!("{},relatime,size=1024k", if readonly { "ro" } else { "rw" });
        })
    });
    if result.is_err() && !mounted {
        // Leave nothing mounted behind a fault that did not take.
        let _ = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH);
    }
    result
}

/// Writes into `dir` until the filesystem has no space left.
fn fill(dir: &Path) -> Result<(), InjectError> {
    let path = dir.join("fill");
    let fill_err = |message: String| InjectError::Fill { path: path.clone(), message };
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|err| fill_err(err.to_string()))?;
    let chunk = vec![0xa5u8; 64 * 1024];
    // 1 MiB of tmpfs fills in 16 chunks; the bound keeps a wrong mount from filling a real disk.
    for _ in 0..64 {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(nix::libc::ENOSPC) => return Ok(()),
            Err(err) => return Err(fill_err(err.to_string())),
        }
    }
    Err(fill_err("still not full after 4 MiB: is the tmpfs mounted?".to_owned()))
}

/// Rewrites the fields (device, mount point, type, options, dump, pass) of the line of
/// `proc/mounts` whose mount point is `mount_point`.
fn edit_mount_line(
    tree: &NodeTree,
    mount_point: &str,
    edit: impl FnOnce(&mut Vec<String>),
) -> Result<(), InjectError> {
    let path = tree.dir().join(MOUNTS_PATH);
    let text = fs::read_to_string(&path)
        .map_err(|source| TreeError::Read { path: path.clone(), source })?;
    let mut edit = Some(edit);
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        let mut fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if fields.len() >= 4
            && fields[1] == mount_point
            && let Some(edit) = edit.take()
        {
            edit(&mut fields);
            out.push_str(&fields.join(" "));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if edit.is_some() {
        return Err(InjectError::Fixture {
            path,
            message: format!("no line for {mount_point} to change"),
        });
    }
    tree::write_atomic(&path, out.as_bytes())?;
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

/// The flags of `fleetmend inject`.
#[derive(Debug, Clone, clap::Args)]
pub struct InjectArgs {
    /// The node to break (a node of the fleet `fleetmend up` runs in the state directory).
    pub node: String,
    /// The fault: gpu-xid:N (e.g. gpu-xid:79, gpu-xid:48), gpu-missing, row-remap-failure,
    /// nvlink-down, nic-down, ib-port-down, pcie-downtrained, gpu-throttle, nvswitch-fatal,
    /// mlx5-health, nic-pcie-downtrained, gpu-lost, xid-burst, gsp-timeout, disk-full (needs root), disk-readonly,
    /// kernel-mce, agent-kill, hang (SIGSTOP of the node's job ranks), nan (SIGUSR2 to them: the
    /// bundled trainer's next gradient gets a NaN), slow:PERCENT (they keep PERCENT % of their
    /// CPU, in a cgroup; needs root).
    pub fault: String,
    /// Keep the fault across reboots of the node (a broken part, not a passing event).
    #[arg(long)]
    pub persistent: bool,
    /// The state directory of `fleetmend up`.
    #[arg(long, env = STATE_DIR_ENV, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// Runs `fleetmend inject`: 0 when the fault was written (or the agent killed), 2 for a node or
/// fault that does not exist, 1 when it could not be done.
pub fn inject_main(args: InjectArgs) -> ExitCode {
    let fault = match args.fault.parse::<Fault>() {
        Ok(fault) => fault,
        Err(err) => {
            eprintln!("fleetmend inject: {err}");
            return ExitCode::from(2);
        }
    };
    if fault == Fault::AgentKill && args.persistent {
        eprintln!("fleetmend inject: {}", InjectError::PersistentAgentKill);
        return ExitCode::from(2);
    }
    if !fault.can_persist() && args.persistent {
        eprintln!("fleetmend inject: {}", InjectError::NotPersistent { fault });
        return ExitCode::from(2);
    }
    let tree = match open_node(&args.state_dir, &args.node) {
        Ok(tree) => tree,
        Err(message) => {
            eprintln!("fleetmend inject: {message}");
            return ExitCode::from(2);
        }
    };
    if fault == Fault::AgentKill {
        return match tree.kill_agent() {
            Ok(pid) => {
                println!(
                    "{}: agent-kill: killed its agent (pid {pid}) with SIGKILL; the node stops reporting until it is rebooted",
                    tree.node()
                );
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("fleetmend inject: {}: {err}", tree.node());
                ExitCode::from(1)
            }
        };
    }
    if fault.is_job_fault() {
        return match tree.signal_ranks(fault) {
            Ok(ranks) => {
                let ranks: Vec<String> =
                    ranks.iter().map(|(rank, pid)| format!("{rank} (pid {pid})")).collect();
                let what = match fault {
                    Fault::Hang => {
                        "stopped with SIGSTOP; the node stays healthy, its ranks stop stepping"
                    }
                    Fault::Slow(_) => {
                        "throttled in a CPU cgroup; they step slower than their peers"
                    }
                    _ => "sent SIGUSR2; the trainer's next gradient gets a NaN",
                };
                println!("{}: {fault}: {} {what}", tree.node(), ranks.join(", "));
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("fleetmend inject: {}: {err}", tree.node());
                ExitCode::from(1)
            }
        };
    }
    match tree.inject(&fault, args.persistent) {
        Ok(()) => {
            let kind = if args.persistent {
                "persistent: survives reboots"
            } else {
                "cleared by a reboot"
            };
            println!("{}: {fault} ({kind}): {}", tree.node(), fault.description());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("fleetmend inject: {}: {fault}: {err}", tree.node());
            ExitCode::from(1)
        }
    }
}

/// The tree of `node` in `state_dir`, or a message naming the nodes there are.
fn open_node(state_dir: &Path, node: &str) -> Result<NodeTree, String> {
    let known = tree::list_nodes(state_dir).map_err(|err| err.to_string())?;
    let valid_name = tree::validate_node_name(node).is_ok();
    if !valid_name || !known.iter().any(|known| known == node) {
        let nodes_dir = tree::nodes_dir(state_dir);
        return Err(if known.is_empty() {
            format!(
                "no node {node:?}: {} holds no nodes (start a fleet with `fleetmend up`, or name its state directory with --state-dir or {STATE_DIR_ENV})",
                nodes_dir.display()
            )
        } else {
            format!(
                "no node {node:?} in {} (known nodes: {})",
                nodes_dir.display(),
                known.join(", ")
            )
        });
    }
    NodeTree::open(&tree::node_dir(state_dir, node)).map_err(|err| err.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_list_the_valid_faults() {
        for name in [
            "gpu-xid:79",
            "gpu-xid:48",
            "gpu-missing",
            "row-remap-failure",
            "nvlink-down",
            "nic-down",
            "ib-port-down",
            "pcie-downtrained",
            "gpu-throttle",
            "nvswitch-fatal",
            "mlx5-health",
            "disk-full",
            "disk-readonly",
            "kernel-mce",
            "agent-kill",
        ] {
            let fault: Fault = name.parse().unwrap();
            assert_eq!(fault.to_string(), name);
        }
        assert_eq!("gpu-xid:79".parse::<Fault>().unwrap(), Fault::GpuXid(79));
        for bad in ["gpu-xid", "gpu-xid:", "gpu-xid:0", "gpu-xid:x", "gpu-xid:100000", "melt", ""] {
            let err = bad.parse::<Fault>().unwrap_err();
            let text = err.to_string();
            assert!(text.contains("gpu-missing") && text.contains("agent-kill"), "{text}");
        }
        let json = serde_json::to_string(&Fault::GpuXid(48)).unwrap();
        assert_eq!(json, "\"gpu-xid:48\"");
        assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), Fault::GpuXid(48));
        assert!(serde_json::from_str::<Fault>("\"melt\"").is_err());
    }

    #[test]
    fn kernel_pci_addresses_drop_the_long_domain() {
        assert_eq!(kernel_pci("00000000:5d:00.0", false), "0000:5d:00");
        assert_eq!(kernel_pci("00000000:5d:00.0", true), "0000:5d:00.0");
        assert_eq!(kernel_pci("0000:5d:00.0", false), "0000:5d:00");
    }

    #[test]
    fn process_state_is_read_past_the_command_name() {
        let temp = tempfile::tempdir().unwrap();
        fs::write(temp.path().join("stat"), "42 (a) b) Z 1 2 3").unwrap();
        assert!(process_gone(temp.path()));
        fs::write(temp.path().join("stat"), "42 (a) b) S 1 2 3").unwrap();
        assert!(!process_gone(temp.path()));
        assert!(process_gone(&temp.path().join("nothing")));
    }

    #[test]
    fn gpu_faults_rewrite_the_fixture_the_agent_reads() {
        let temp = tempfile::tempdir().unwrap();
        let tree = NodeTree::create(&temp.path().join("n1"), "n1").unwrap();
        let read = || {
            let path = tree.gpu_fixture_path();
            let text = fs::read_to_string(&path).unwrap();
            fleetmend_agent::gpu::fixture::parse_snapshot(&path, &text).unwrap()
        };
        tree.inject(&Fault::GpuXid(79), false).unwrap();
        let gpu = read().gpus.into_iter().find(|g| g.index == FAULTY_GPU).unwrap();
        assert_eq!(gpu.condition, GpuCondition::Lost);
        assert_eq!(gpu.xid_counts.get(&79), Some(&1));
        let kmsg = fs::read_to_string(tree.kmsg_path()).unwrap();
        assert!(kmsg.contains("NVRM: Xid (PCI:0000:5d:00): 79, "), "{kmsg}");

        tree.inject(&Fault::GpuMissing, false).unwrap();
        assert_eq!(read().gpus.len(), 7);
        // Twice is the same fault, not a second GPU gone.
        tree.inject(&Fault::GpuMissing, false).unwrap();
        assert_eq!(read().gpus.len(), 7);
        let faults: Vec<Fault> = tree.faults().unwrap().into_iter().map(|f| f.fault).collect();
        assert_eq!(faults, [Fault::GpuXid(79), Fault::GpuMissing, Fault::GpuMissing]);
        assert!(matches!(tree.inject(&Fault::AgentKill, false), Err(InjectError::NotATreeFault)));
    }

    #[test]
    fn readonly_rewrites_only_the_mounts_options() {
        let temp = tempfile::tempdir().unwrap();
        let tree = NodeTree::create(&temp.path().join("n1"), "n1").unwrap();
        tree.inject(&Fault::DiskReadonly, false).unwrap();
        let mounts = fs::read_to_string(tree.dir().join(MOUNTS_PATH)).unwrap();
        let scratch = mounts.lines().find(|l| l.contains(" /scratch ")).unwrap();
        assert!(scratch.starts_with("/dev/md0 /scratch xfs ro,noatime,"), "{scratch}");
        let root = mounts.lines().find(|l| l.split(' ').nth(1) == Some("/")).unwrap();
        assert!(root.contains(" rw,"), "{root}");
    }
}
