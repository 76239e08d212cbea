//! Benign noise on a healthy fleet (`[noise]`): what real nodes log and do every day without being
//! sick — applications' Xids, OOM kills and segfaults of user processes, corrected memory errors,
//! link flaps that recover within seconds, planned reboots, agent restarts, a rolling driver
//! upgrade. Every node's kernel log goes through the agent's own kernel-log rules
//! ([`KernelLogJudge`]) and what they find reaches the real repairer in the agent's reports, so a
//! run counts the actions the repairer takes on nodes with nothing wrong
//! (`fleetmend simulate --noise`, [`NoiseFigures`]).
//!
//! What the agent's other checks would report is modelled by the finding they report: the nic
//! check's `nic_down` while a flap happens to span its look, the link, InfiniBand port and NVLink
//! of a fresh boot not up yet, the host check's `edac_corrected` during a burst of corrected
//! memory errors. Corrected GPU ECC errors make metrics, not findings, so they are not modelled.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use fleetmend_agent::checks::kernel_log::{KernelLogConfig, KernelLogJudge};
use fleetmend_agent::checks::{gpu, host, nic};
use fleetmend_agent::config::ConfigProblems;
use fleetmend_proto::{CheckRun, Finding, RecommendedAction, Status};
use serde::{Deserialize, Serialize};

/// Most kernel records a node keeps for this boot (what a restarted agent reads again); the
/// kernel's own ring buffer holds about as many.
const KMSG_KEEP: usize = 4_096;

/// The GPUs' PCI addresses on a node (an 8-GPU HGX board).
const GPU_PCI: [&str; 8] = [
    "0000:18:00",
    "0000:2a:00",
    "0000:3a:00",
    "0000:5d:00",
    "0000:9a:00",
    "0000:ab:00",
    "0000:ba:00",
    "0000:db:00",
];

/// The noise's rates (per node per day) and the driver upgrade's plan.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NoiseConfig {
    /// Run the noise (`--noise`); off, nothing below happens.
    pub enabled: bool,
    /// A job's crash on the node: Xid 13 or 31 on its GPUs and 43/45 as the driver cleans up;
    /// one in three crashes again once or twice after its restart.
    pub app_xids: f64,
    /// The kernel's OOM killer ends a user process.
    pub oom_kills: f64,
    /// A user process segfaults (half of them inside libcuda or NCCL).
    pub segfaults: f64,
    /// A corrected memory error (EDAC); one in twenty is a burst above the host check's rate.
    pub edac_corrected: f64,
    /// A link goes down and comes back within 1 to 10 seconds.
    pub link_flaps: f64,
    /// A person drains the node through fleetmend, reboots it and puts it back.
    pub planned_reboots: f64,
    /// The agent restarts (an upgrade, a config change) and reads this boot's log again.
    pub agent_restarts: f64,
    /// When a rolling driver upgrade starts: batches of `upgrade_batch` of the fleet, one an
    /// hour, each drained, rebooted on the new driver and put back; none: no upgrade.
    #[serde(with = "humantime_serde")]
    pub driver_upgrade_at: Option<Duration>,
    pub upgrade_batch: f64,
}

impl Default for NoiseConfig {
    fn default() -> Self {
        NoiseConfig {
            enabled: false,
            app_xids: 0.3,
            oom_kills: 0.2,
            segfaults: 0.3,
            edac_corrected: 1.0,
            link_flaps: 0.1,
            planned_reboots: 0.01,
            agent_restarts: 0.1,
            driver_upgrade_at: Some(Duration::from_secs(86_400)),
            upgrade_batch: 0.05,
        }
    }
}

impl NoiseConfig {
    pub fn problems(&self, section: &str, problems: &mut ConfigProblems) {
        let rates = [
            ("app_xids", self.app_xids),
            ("oom_kills", self.oom_kills),
            ("segfaults", self.segfaults),
            ("edac_corrected", self.edac_corrected),
            ("link_flaps", self.link_flaps),
            ("planned_reboots", self.planned_reboots),
            ("agent_restarts", self.agent_restarts),
        ];
        for (field, rate) in rates {
            if !(rate.is_finite() && rate >= 0.0) {
                problems.push(
                    format!("{section}.{field}"),
                    format!("{rate} is not a rate of 0 or more"),
                );
            }
        }
        if !(self.upgrade_batch > 0.0 && self.upgrade_batch <= 1.0) {
            problems.push(format!("{section}.upgrade_batch"), "must be above 0 and at most 1");
        }
    }

    /// The Poisson kinds and their rates per node per day.
    pub fn rates(&self) -> [(NoiseKind, f64); 7] {
        [
            (NoiseKind::AppXid, self.app_xids),
            (NoiseKind::OomKill, self.oom_kills),
            (NoiseKind::Segfault, self.segfaults),
            (NoiseKind::EdacCorrected, self.edac_corrected),
            (NoiseKind::LinkFlap, self.link_flaps),
            (NoiseKind::PlannedReboot, self.planned_reboots),
            (NoiseKind::AgentRestart, self.agent_restarts),
        ]
    }
}

/// One kind of benign noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoiseKind {
    AppXid,
    OomKill,
    Segfault,
    EdacCorrected,
    LinkFlap,
    PlannedReboot,
    AgentRestart,
    DriverUpgrade,
}

impl NoiseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NoiseKind::AppXid => "app_xid",
            NoiseKind::OomKill => "oom_kill",
            NoiseKind::Segfault => "segfault",
            NoiseKind::EdacCorrected => "edac_corrected",
            NoiseKind::LinkFlap => "link_flap",
            NoiseKind::PlannedReboot => "planned_reboot",
            NoiseKind::AgentRestart => "agent_restart",
            NoiseKind::DriverUpgrade => "driver_upgrade",
        }
    }
}

/// What a noise run found: the repairer's actions on nodes with no fault, and the real faults it
/// acted on.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NoiseFigures {
    pub node_days: f64,
    /// Noise happenings by kind.
    pub injected: std::collections::BTreeMap<String, u64>,
    /// Kernel-log lines the agents' rules read.
    pub kernel_lines: u64,
    /// Drains, reboots, replacements and quarantines a rule decided on a node with no fault.
    pub false_actions: Vec<FalseAction>,
    pub false_actions_per_1000_node_days: f64,
    /// Alerts a rule raised on a node with no fault (no action on the node), and by the
    /// `check/finding` they were raised for.
    pub alerts_on_healthy: u64,
    pub alerts_by_finding: std::collections::BTreeMap<String, u64>,
    /// Real faults whose finding asks for an action, and how many of them a rule acted on.
    pub real_faults: u32,
    pub real_faults_acted_on: u32,
    /// Those not acted on, as `node category since_ms`.
    pub real_faults_missed: Vec<String>,
}

/// One action on a healthy node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FalseAction {
    pub at_ms: u64,
    pub node: String,
    pub action: String,
    pub rule: String,
    pub reason: String,
}

/// A finding of another check on show.
#[derive(Debug, Clone)]
struct Shown {
    finding: Finding,
    until_ms: u64,
    looked_ms: Option<u64>,
}

/// One node's noise: its kernel log this boot through the agent's rules, and the findings its
/// other checks show for a while.
#[derive(Debug)]
pub struct NodeNoise {
    judge: KernelLogJudge,
    /// This boot's records, oldest first (`PRIORITY,SEQ,USEC,-;text`).
    kmsg: VecDeque<String>,
    next_seq: u64,
    boot_ms: u64,
    /// Findings of the other checks, until when they show, and when their check saw them (none:
    /// at each of its runs).
    shown: Vec<Shown>,
    /// When the node's checks run: every `interval_ms`, at `phase_ms` into it.
    phase_ms: u64,
    interval_ms: u64,
    /// What the last report said, to report again only on a change.
    last_said: Vec<(String, String, Status)>,
    pub lines: u64,
}

/// A new agent's judge of the built-in rules, compiled once for every node.
fn judge() -> KernelLogJudge {
    static BUILT_IN: std::sync::OnceLock<KernelLogJudge> = std::sync::OnceLock::new();
    BUILT_IN
        .get_or_init(|| {
            // The built-in rules always compile (a unit test of the agent holds them to it).
            KernelLogJudge::new(&KernelLogConfig::default())
                .unwrap_or_else(|err| panic!("the agent's built-in kernel-log rules: {err}"))
        })
        .fresh()
}

fn wall(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

impl NodeNoise {
    /// A node booted at `boot_ms` whose checks run every `interval_ms` at `phase_ms` into it.
    pub fn new(boot_ms: u64, phase_ms: u64, interval_ms: u64) -> NodeNoise {
        NodeNoise {
            judge: judge(),
            kmsg: VecDeque::new(),
            next_seq: 1,
            boot_ms,
            shown: Vec::new(),
            phase_ms,
            interval_ms: interval_ms.max(1),
            last_said: Vec::new(),
            lines: 0,
        }
    }

    /// When the checks last ran by `now_ms`.
    fn last_run(&self, now_ms: u64) -> u64 {
        now_ms - (now_ms + self.interval_ms - self.phase_ms % self.interval_ms) % self.interval_ms
    }

    /// When the checks run next after `now_ms`.
    pub fn next_run(&self, now_ms: u64) -> u64 {
        self.last_run(now_ms) + self.interval_ms
    }

    /// The kernel logs `text` at `now_ms` (priority `level`); true when a rule matched it.
    pub fn log(&mut self, level: u8, text: &str, now_ms: u64) -> bool {
        let uptime = Duration::from_millis(now_ms.saturating_sub(self.boot_ms));
        let record = format!("{level},{},{},-;{text}", self.next_seq, uptime.as_micros());
        self.next_seq += 1;
        self.lines += 1;
        let matched = self.judge.take_kmsg(&record, uptime, wall(now_ms));
        if self.kmsg.len() == KMSG_KEEP {
            self.kmsg.pop_front();
        }
        self.kmsg.push_back(record);
        matched
    }

    /// The agent restarts at `now_ms`: a new process reads this boot's log from its start
    /// (`read_existing`), with the same boot id and sequence numbers.
    pub fn restart_agent(&mut self, now_ms: u64) {
        self.judge = judge();
        let uptime = Duration::from_millis(now_ms.saturating_sub(self.boot_ms));
        for record in &self.kmsg {
            self.judge.take_kmsg(record, uptime, wall(now_ms));
        }
        self.shown.clear();
        self.last_said.clear();
    }

    /// The node booted at `now_ms`: a new log, a new agent.
    pub fn boot(&mut self, now_ms: u64) {
        let (phase_ms, interval_ms, lines) = (self.phase_ms, self.interval_ms, self.lines);
        *self = NodeNoise { lines, ..NodeNoise::new(now_ms, phase_ms, interval_ms) };
    }

    /// Another check sees `finding` at each of its runs until `until_ms`.
    pub fn show(&mut self, finding: Finding, until_ms: u64) {
        self.shown.push(Shown { finding, until_ms, looked_ms: None });
    }

    /// Another check saw `finding` in its run at `looked_ms`; its result stands until its next
    /// run.
    pub fn show_once(&mut self, finding: Finding, looked_ms: u64) {
        let until_ms = looked_ms + self.interval_ms;
        self.shown.push(Shown { finding, until_ms, looked_ms: Some(looked_ms) });
    }

    /// What the agent's checks report at `now_ms` of the noise.
    pub fn findings(&mut self, now_ms: u64) -> Vec<Finding> {
        self.shown.retain(|s| s.until_ms > now_ms);
        let mut findings = self.judge.findings(wall(now_ms));
        findings.extend(self.shown.iter().map(|s| s.finding.clone()));
        findings
    }

    /// The runs of the checks behind the findings shown at `now_ms` (the report's `checks`), so
    /// a report carrying a run's result again is not taken for another look.
    pub fn runs(&self, now_ms: u64) -> Vec<CheckRun> {
        let mut runs: Vec<CheckRun> = Vec::new();
        for shown in self.shown.iter().filter(|s| s.until_ms > now_ms) {
            let at = shown.looked_ms.unwrap_or_else(|| self.last_run(now_ms));
            match runs.iter_mut().find(|r| r.check == shown.finding.check) {
                Some(run) => {
                    run.finished_at_ms = run.finished_at_ms.max(at);
                    run.status = run.status.worst(shown.finding.status);
                }
                None => runs.push(CheckRun {
                    check: shown.finding.check.clone(),
                    status: shown.finding.status,
                    duration_seconds: 0.0,
                    timed_out: false,
                    finished_at_ms: at,
                }),
            }
        }
        runs
    }

    /// Whether `findings` say something the last report did not (and remembers them).
    pub fn changed(&mut self, findings: &[Finding]) -> bool {
        let said: Vec<(String, String, Status)> =
            findings.iter().map(|f| (f.finding.clone(), f.subject.clone(), f.status)).collect();
        let changed = said != self.last_said;
        self.last_said = said;
        changed
    }

    /// Whether anything shows that is not ok.
    pub fn active(&mut self, now_ms: u64) -> bool {
        self.findings(now_ms).iter().any(|f| f.status != Status::Ok)
    }
}

/// Draws the lines of one piece of noise.
#[derive(Debug)]
pub struct Lines<'a> {
    pub rng: &'a mut fastrand::Rng,
}

impl Lines<'_> {
    fn pid(&mut self) -> u32 {
        self.rng.u32(1_000..4_000_000)
    }

    /// A job's crash: (priority, line) in order.
    pub fn app_crash(&mut self) -> Vec<(u8, String)> {
        let pid = self.pid();
        let gpus = self.rng.usize(1..=GPU_PCI.len());
        let first = self.rng.usize(..GPU_PCI.len());
        let on: Vec<&str> = (0..gpus).map(|i| GPU_PCI[(first + i) % GPU_PCI.len()]).collect();
        let mut lines = Vec::new();
        let kind = self.rng.u8(..10);
        for pci in &on {
            let head = format!("NVRM: Xid (PCI:{pci}): ");
            match kind {
                0..5 => {
                    let (gpc, tpc) = (self.rng.u8(..8), self.rng.u8(..9));
                    lines.push(format!(
                        "{head}13, pid={pid}, name=python3, Graphics SM Warp Exception on (GPC {gpc}, TPC {tpc}, SM 0): Out Of Range Address"
                    ));
                    lines.push(format!(
                        "{head}13, pid={pid}, name=python3, Graphics Exception: ESR 0x51{gpc}e30=0x10{tpc}0e 0x51de34=0x0 0x51de28=0x0 0x51de2c=0x0"
                    ));
                }
                5..8 => lines.push(format!(
                    "{head}31, pid={pid}, name=python3, Ch 00000018, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_{} faulted @ 0x7f3c_{:08x}. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
                    self.rng.u8(..16),
                    self.rng.u32(..) & 0xffff_f000,
                )),
                _ => {}
            }
        }
        for pci in &on {
            let code = if kind >= 8 { 45 } else { 43 };
            lines.push(format!(
                "NVRM: Xid (PCI:{pci}): {code}, pid={pid}, name=python3, Ch 00000008"
            ));
        }
        lines.into_iter().map(|l| (4, l)).collect()
    }

    pub fn oom_kill(&mut self) -> Vec<(u8, String)> {
        let pid = self.pid();
        let rss = self.rng.u64(100_000_000..900_000_000);
        vec![
            (4, "python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0".to_owned()),
            (3, format!("Out of memory: Killed process {pid} (python3) total-vm:{}kB, anon-rss:{rss}kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:987654kB oom_score_adj:0", rss + 12_345_678)),
            (6, format!("oom_reaper: reaped process {pid} (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB")),
        ]
    }

    pub fn segfault(&mut self) -> Vec<(u8, String)> {
        let pid = self.pid();
        let library = if self.rng.bool() {
            "libcuda.so.550.90.07[7f3c7a000000+1e00000]"
        } else {
            "libc.so.6[7f3c8a028000+195000]"
        };
        vec![(
            6,
            format!(
                "python3[{pid}]: segfault at {:x} ip 00007f3c8a1b2c3d sp 00007ffd1e2f3a40 error 4 in {library} likely on CPU {} (core 5, socket 0)",
                self.rng.u32(..4096),
                self.rng.u8(..96),
            ),
        )]
    }

    pub fn edac_corrected(&mut self) -> Vec<(u8, String)> {
        let (chan, dimm) = (self.rng.u8(..8), self.rng.u8(..2));
        vec![(
            4,
            format!(
                "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#{chan}_DIMM#{dimm} (channel:{chan} slot:{dimm} page:0x{:x} offset:0x100 grain:32 syndrome:0x0 - area:DRAM err_code:0001:0090 socket:0 ha:0 channel_mask:2 rank:0)",
                self.rng.u32(..0xf_ffff),
            ),
        )]
    }

    /// A link's down and up lines: (interface, down, up).
    pub fn link_flap(&mut self) -> (String, String, String) {
        if self.rng.bool() {
            let iface = format!("eth{}", self.rng.u8(..2));
            let dev = format!("mlx5_core 0000:17:00.0 {iface}");
            (iface, format!("{dev}: Link down"), format!("{dev}: Link up"))
        } else {
            let iface = "eth1".to_owned();
            let dev = format!("bnxt_en 0000:c1:00.0 {iface}");
            (
                iface,
                format!("{dev}: NIC Link is Down"),
                format!(
                    "{dev}: NIC Link is Up, 100000 Mbps full duplex, Flow control: ON - receive & transmit"
                ),
            )
        }
    }

    /// A boot's first kernel lines (the link training among them), at ms after the boot.
    pub fn boot(&mut self, driver: &str) -> Vec<(u64, u8, String)> {
        let link = "mlx5_core 0000:17:00.0 eth0";
        vec![
            (0, 5, "Linux version 6.8.0-49-generic (buildd@lcy02-amd64-027) (x86_64-linux-gnu-gcc-13) #49-Ubuntu SMP PREEMPT_DYNAMIC".to_owned()),
            (9_000, 4, format!("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {driver}")),
            (11_000, 6, format!("{link}: Link down")),
            (24_000, 6, format!("{link}: Link up")),
        ]
    }
}

/// The nic check's finding for a link it saw down.
pub fn nic_down(iface: &str) -> Finding {
    Finding::new(
        nic::NAME,
        "nic_down",
        iface,
        Status::Fail,
        RecommendedAction::Drain,
        format!("{iface} is down"),
    )
}

/// What a fresh boot's checks see for a minute or two: the Ethernet link and the InfiniBand port
/// still coming up, NVLink waiting for the fabric manager; (finding, ms after the boot it clears).
pub fn boot_transients() -> Vec<(Finding, u64)> {
    let ib = Finding::new(
        nic::NAME,
        "ib_port_down",
        "mlx5_0/1",
        Status::Fail,
        RecommendedAction::Drain,
        "mlx5_0 port 1 is INIT (no subnet manager answer yet)",
    );
    let nvlink = Finding::new(
        gpu::NAME,
        "nvlink_down",
        "0",
        Status::Fail,
        RecommendedAction::ResetGpu,
        "GPU 0: 18 of 18 NVLinks inactive",
    );
    vec![(nic_down("eth0"), 40_000), (ib, 90_000), (nvlink, 60_000)]
}

/// The host check's finding during a burst of corrected memory errors.
pub fn edac_burst() -> Finding {
    Finding::new(
        host::NAME,
        host::findings::EDAC_CORRECTED,
        "mc0",
        Status::Warn,
        RecommendedAction::None,
        "240 corrected memory errors per hour (1310 in all), above 100 per hour",
    )
}

impl NoiseFigures {
    /// The text summary's lines.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let injected: Vec<String> =
            self.injected.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        let _ = writeln!(
            out,
            "noise: {:.0} node-days; {}; {} kernel line(s) through the agent's rules",
            self.node_days,
            injected.join(", "),
            self.kernel_lines
        );
        let _ = writeln!(
            out,
            "  false actions: {} ({:.3} per 1,000 node-days); alerts on healthy nodes: {}",
            self.false_actions.len(),
            self.false_actions_per_1000_node_days,
            self.alerts_on_healthy
        );
        let by: Vec<String> =
            self.alerts_by_finding.iter().map(|(finding, n)| format!("{finding} {n}")).collect();
        let _ = writeln!(out, "    alerts by finding: {}", by.join(", "));
        for action in self.false_actions.iter().take(20) {
            let _ = writeln!(
                out,
                "    {} at {} ms: {} by {}: {}",
                action.node, action.at_ms, action.action, action.rule, action.reason
            );
        }
        let _ = writeln!(
            out,
            "  real faults asking for an action: {}, acted on: {}",
            self.real_faults, self.real_faults_acted_on
        );
        for missed in self.real_faults_missed.iter().take(20) {
            let _ = writeln!(out, "    missed: {missed}");
        }
        out
    }
}
