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

mod agent;
mod command;
mod disk;
mod gpu;
mod job;
mod name;
mod network;

pub use self::command::{InjectArgs, inject_main};
pub use self::job::release_throttles;
pub use self::name::FaultParseError;

use std::io;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::tree::{NodeTree, TreeError, TreeMeta};

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
}

/// Writes `fault` into the tree of the boot `meta` describes (the caller holds the lock and
/// records the fault).
pub(crate) fn apply(tree: &NodeTree, meta: &TreeMeta, fault: &Fault) -> Result<(), InjectError> {
    match *fault {
        Fault::GpuXid(code) => gpu::gpu_xid(tree, meta, code),
        Fault::GpuMissing => gpu::gpu_missing(tree, meta),
        Fault::RowRemapFailure => gpu::row_remap_failure(tree),
        Fault::NvlinkDown => gpu::nvlink_down(tree),
        Fault::NicDown => network::nic_down(tree, meta),
        Fault::IbPortDown => network::ib_port_down(tree),
        Fault::NvswitchFatal => tree
            .append_kmsg(meta, &[(3, NVSWITCH_FATAL.to_owned()), (3, NVSWITCH_SEVERITY.to_owned())])
            .map_err(InjectError::from),
        Fault::Mlx5Health => tree
            .append_kmsg(meta, &[(3, MLX5_MISS_COUNT.to_owned()), (3, MLX5_SYNDROME.to_owned())])
            .map_err(InjectError::from),
        Fault::PcieDowntrained => gpu::pcie_downtrained(tree),
        Fault::GpuThrottle => gpu::gpu_throttle(tree),
        Fault::DiskFull => disk::disk_full(tree),
        Fault::DiskReadonly => disk::disk_readonly(tree),
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
        Fault::NicPcieDowntrained => network::nic_pcie_downtrained(tree),
        Fault::GpuLost => gpu::gpu_lost(tree, meta),
        Fault::XidBurst => gpu::xid_burst(tree, meta),
        Fault::GspTimeout => gpu::gsp_timeout(tree, meta),
        Fault::AgentKill | Fault::Hang | Fault::Nan | Fault::Slow(_) => {
            Err(InjectError::NotATreeFault)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::fs;

    use fleetmend_agent::gpu::GpuCondition;

    use super::*;

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
}
