//! Kernel-log rules: their config form, the built-in set, validation and compilation.
//!
//! Rules are data (node-problem-detector's model): a regex, the finding it raises, a status and an
//! action, a subject template and a window after which the finding clears. Validation and
//! compilation share [`compile`], so a rule that passed validation compiles the same way in
//! [`super::KernelLogCheck::new`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use fleetmend_proto::{RecommendedAction, Status};
use regex_automata::meta::{self, Regex};
use regex_automata::util::captures::Captures;
use regex_automata::util::primitives::PatternID;
use regex_automata::util::syntax;
use serde::Deserialize;

use crate::xid;

/// Longest label value kept from a capture group; patterns should capture bounded values only, this
/// bounds what a careless pattern can put into a report.
const MAX_LABEL_CHARS: usize = 64;

/// Longest subject built from a template, for the same reason.
const MAX_SUBJECT_CHARS: usize = 128;
// At most four bytes a character: within the wire's bounds.
const _: () = assert!(MAX_LABEL_CHARS * 4 <= fleetmend_proto::bounds::MAX_LABEL_VALUE_BYTES);
/// Named capture groups a rule may have: the wire's labels per finding, less `rule` and `count`.
const MAX_GROUPS: usize = fleetmend_proto::bounds::MAX_LABELS - 2;
const MAX_LABEL_KEY_BYTES: usize = fleetmend_proto::bounds::MAX_LABEL_KEY_BYTES;
const _: () = assert!(MAX_SUBJECT_CHARS * 4 <= fleetmend_proto::bounds::MAX_SUBJECT_BYTES);

/// Most lines one rule may span (`lines`).
pub const MAX_LINES: usize = 4;

/// One kernel-log rule as written in config (`[[checks.kernel_log.rules]]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelLogRule {
    /// Unique name of the rule; also the `rule` label of `fleetmend_kmsg_matches_total`. A user rule
    /// with the name of a built-in rule replaces it.
    pub name: String,
    /// Regular expression searched in each kernel-log message (the kmsg prefix removed). Classes
    /// are ASCII (`\d`, `\w`, `\s` and `(?i)` as in Go's regexp). Named capture groups become the
    /// finding's labels: capture bounded values only (codes, addresses, device names), never free
    /// text.
    pub pattern: String,
    /// Finding id reported while the rule is active (short snake_case, e.g. `xid`).
    pub finding: String,
    /// `warn` or `fail`; or `xid-catalog` (from the catalog entry of the captured `xid` group), or
    /// `xid-recovery-action` (from the captured hex `recovery` group, see [`xid::recovery_action`]).
    pub status: String,
    /// `none`, `restart-app`, `reset-gpu`, `reboot`, `replace`, `drain`; or `xid-catalog` /
    /// `xid-recovery-action` as for `status`.
    pub action: String,
    /// Subject template: `${group}` is replaced by that named capture group (e.g. `"${pci}"`);
    /// empty for the node itself.
    pub subject: String,
    /// The finding clears this long after the rule's last match for the subject, so a node does not
    /// stay sick forever on one old line.
    #[serde(with = "humantime_serde")]
    pub clear_after: Duration,
    /// Lines the pattern is matched across (1 to 4): the latest messages joined with `\n`, for a
    /// message the kernel prints over several lines. A match must reach into the newest line, so
    /// the same lines count once.
    pub lines: usize,
}

impl Default for KernelLogRule {
    fn default() -> Self {
        KernelLogRule {
            name: String::new(),
            pattern: String::new(),
            finding: String::new(),
            status: "warn".to_owned(),
            action: "none".to_owned(),
            subject: String::new(),
            clear_after: Duration::from_secs(3600),
            lines: 1,
        }
    }
}

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
    }
}

/// The PCI address as NVRM prints it in Xid lines: `0000:3b:00`, sometimes with a function.
const PCI: &str = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?";

/// The built-in rules, on unless `builtin_rules = false`. `docs/detection.md` lists them with
/// their sources; the line shapes come from the sources named here.
///
/// Choices, rule by rule:
/// - `xid`: NVRM's `Xid (PCI:0000:3b:00): N, ...` (NVIDIA's Xid documentation and catalog), also
///   the legacy form without `PCI:` and the MIG form with `GPU-I:`/`GPU-CI:`. Status and action
///   from the catalog ([`xid::advice`]); for the NVLink5 Xids 144–150 the line's own `Fatal` or
///   `Nonfatal` word decides ([`xid::by_severity`]). The `(GPC n, TPC m` of an Xid 13 is kept as
///   labels for burst counting. Subject the GPU's PCI address. Clears after 1 h: long enough for
///   the repairer to act on it, short enough that a GPU reset that fixed the fault does not keep
///   the node sick; lasting GPU state (ECC, row remaps, a GPU gone) is the gpu check's to report.
/// - `xid_recovery_action`: Xid 154 carries the driver's recovery action; it is a state, so the
///   latest line per GPU wins and a change back to `0x0 (None)` clears it. 1 h as for `xid`.
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
///   so warn briefly (15 min) and take no action.
/// - `oom_kill`: the job's problem, not the node's: warn, no action, 1 h.
/// - `hung_task`: often a stuck filesystem or driver, but not by itself a reason to act: warn so a
///   person looks, no action, 1 h.
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
/// - `peermem_error`: nvidia-peermem's `ERROR` lines (GPUDirect RDMA registration or
///   invalidation failed; kernel-open/nvidia-peermem): the job's RDMA transfers broke; warn,
///   restart-app, 1 h.
/// - `gpu_app_crash`: a process's segfault or general protection fault inside libcuda, libnccl
///   or another CUDA library (arch/x86/mm/fault.c, traps.c): usually the application's or the
///   driver's, so warn, restart-app; subject the library, 1 h.
pub fn builtin_rules() -> Vec<KernelLogRule> {
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
        builtin(
            "link_down",
            r"(?P<interface>[A-Za-z0-9_.@-]{1,32}):? (?:NIC )?Link (?:is Down|down)\b",
            "link_down",
            "warn",
            "none",
            "${interface}",
            15 * MINUTE,
        ),
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

/// The rules in effect: the built-ins (when on) with same-named user rules in their place, then the
/// other user rules in order.
pub fn effective_rules(builtins: bool, user: &[KernelLogRule]) -> Vec<KernelLogRule> {
    let mut rules = if builtins { builtin_rules() } else { Vec::new() };
    for rule in user {
        match rules.iter_mut().find(|r| r.name == rule.name) {
            Some(slot) => *slot = rule.clone(),
            None => rules.push(rule.clone()),
        }
    }
    rules
}

/// Where a rule's status comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSource {
    Fixed(Status),
    XidCatalog,
    RecoveryAction,
}

/// Where a rule's action comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionSource {
    Fixed(RecommendedAction),
    XidCatalog,
    RecoveryAction,
}

/// A piece of a subject template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TemplatePart {
    Text(String),
    Group(String),
}

/// A rule ready to match.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    pub finding: String,
    regex: Regex,
    status: StatusSource,
    action: ActionSource,
    subject: Vec<TemplatePart>,
    pub clear_after: Duration,
    /// Lines matched across.
    pub lines: usize,
    /// The latest match per subject replaces the earlier ones (a state, like the driver's recovery
    /// action), instead of the worst match in the window winning.
    pub latest_wins: bool,
}

/// What one matching line means.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleMatch {
    pub subject: String,
    pub status: Status,
    pub action: RecommendedAction,
    pub labels: BTreeMap<String, String>,
}

impl Rule {
    /// The match of `text`, if the rule matches it.
    pub fn matches(&self, text: &str) -> Option<RuleMatch> {
        let mut caps = self.regex.create_captures();
        self.regex.captures(text.as_bytes(), &mut caps);
        caps.is_match().then(|| self.found(&Groups { caps: &caps, haystack: text.as_bytes() }))
    }

    /// The first match of `text` that ends after byte `from` (in the newest of joined lines).
    pub fn matches_ending_after(&self, text: &str, from: usize) -> Option<RuleMatch> {
        let caps = self
            .regex
            .captures_iter(text.as_bytes())
            .find(|caps| caps.get_match().is_some_and(|m| m.end() > from))?;
        Some(self.found(&Groups { caps: &caps, haystack: text.as_bytes() }))
    }

    fn found(&self, groups: &Groups<'_>) -> RuleMatch {
        let mut labels = BTreeMap::new();
        for name in group_names(&self.regex) {
            if let Some(text) = groups.get(name) {
                labels.insert(name.to_owned(), truncate_chars(&text, MAX_LABEL_CHARS));
            }
        }
        let (status, action) = self.resolve(groups);
        RuleMatch { subject: self.subject_of(groups), status, action, labels }
    }

    fn resolve(&self, groups: &Groups<'_>) -> (Status, RecommendedAction) {
        let catalog = || {
            // The pattern bounds the digits; a code that still does not parse is "not in the
            // catalog", which is what advice() says for any unknown code.
            let code = groups.get("xid").and_then(|text| text.parse::<u32>().ok());
            let code = code.unwrap_or(u32::MAX);
            let severity = groups.get("severity");
            match severity.and_then(|word| xid::by_severity(code, &word)) {
                Some(decided) => decided,
                None => {
                    let advice = xid::advice(code);
                    (advice.status, advice.action)
                }
            }
        };
        let recovery = || {
            groups
                .get("recovery")
                .and_then(|text| u32::from_str_radix(&text, 16).ok())
                .and_then(xid::recovery_action)
                .map(|(status, action, _)| (status, action))
                // A recovery action this catalog does not know: someone should look.
                .unwrap_or((Status::Warn, RecommendedAction::None))
        };
        let status = match self.status {
            StatusSource::Fixed(status) => status,
            StatusSource::XidCatalog => catalog().0,
            StatusSource::RecoveryAction => recovery().0,
        };
        let action = match self.action {
            ActionSource::Fixed(action) => action,
            ActionSource::XidCatalog => catalog().1,
            ActionSource::RecoveryAction => recovery().1,
        };
        (status, action)
    }

    fn subject_of(&self, groups: &Groups<'_>) -> String {
        let mut subject = String::new();
        for part in &self.subject {
            match part {
                TemplatePart::Text(text) => subject.push_str(text),
                TemplatePart::Group(name) => {
                    subject.push_str(&groups.get(name).unwrap_or_default());
                }
            }
        }
        truncate_chars(&subject, MAX_SUBJECT_CHARS)
    }
}

/// One thing wrong with a rule: the field (`name`, `pattern`, ...) and what.
pub type RuleProblem = (&'static str, String);

/// Compiles `rule`, or every problem with it.
pub fn compile(rule: &KernelLogRule) -> Result<Rule, Vec<RuleProblem>> {
    let mut problems: Vec<RuleProblem> = Vec::new();
    if rule.name.trim().is_empty() {
        problems.push(("name", "must not be empty".to_owned()));
    }
    if !is_snake_case(&rule.finding) {
        problems.push((
            "finding",
            format!("{:?} is not a snake_case finding id (a-z, 0-9, _)", rule.finding),
        ));
    }
    if rule.clear_after.is_zero() {
        problems.push(("clear_after", "must be greater than zero".to_owned()));
    }
    if !(1..=MAX_LINES).contains(&rule.lines) {
        problems.push(("lines", format!("{} is not between 1 and {MAX_LINES}", rule.lines)));
    }
    let status = match rule.status.as_str() {
        "warn" => Some(StatusSource::Fixed(Status::Warn)),
        "fail" => Some(StatusSource::Fixed(Status::Fail)),
        "xid-catalog" => Some(StatusSource::XidCatalog),
        "xid-recovery-action" => Some(StatusSource::RecoveryAction),
        other => {
            problems.push((
                "status",
                format!(
                    "unknown status {other:?} (expected warn, fail, xid-catalog or xid-recovery-action)"
                ),
            ));
            None
        }
    };
    let action = match rule.action.as_str() {
        "xid-catalog" => Some(ActionSource::XidCatalog),
        "xid-recovery-action" => Some(ActionSource::RecoveryAction),
        other => match other.parse::<RecommendedAction>() {
            Ok(action) => Some(ActionSource::Fixed(action)),
            Err(_) => {
                problems.push((
                    "action",
                    format!(
                        "unknown action {other:?} (expected none, restart-app, reset-gpu, reboot, replace, drain, xid-catalog or xid-recovery-action)"
                    ),
                ));
                None
            }
        },
    };
    let regex = if rule.pattern.is_empty() {
        problems.push(("pattern", "must not be empty".to_owned()));
        None
    } else {
        match build_regex(&rule.pattern) {
            Ok(regex) => Some(regex),
            Err(text) => {
                problems.push(("pattern", format!("not a valid regex: {text}")));
                None
            }
        }
    };
    let subject = match parse_template(&rule.subject) {
        Ok(parts) => Some(parts),
        Err(message) => {
            problems.push(("subject", message));
            None
        }
    };
    if let Some(regex) = &regex {
        // Each named group becomes a label of the finding, beside `rule` (and `count` for a
        // burst): more than the wire allows would be cut at send time, so refuse it here.
        let groups = group_names(regex).count();
        if groups > MAX_GROUPS {
            problems.push((
                "pattern",
                format!("{groups} named capture groups is more than {MAX_GROUPS} (each becomes a label of the finding)"),
            ));
        }
        if let Some(name) = group_names(regex).find(|n| n.len() > MAX_LABEL_KEY_BYTES) {
            problems.push((
                "pattern",
                format!(
                    "the capture group name {:?}... is longer than {MAX_LABEL_KEY_BYTES} bytes (it becomes a label key)",
                    truncate_chars(name, 32)
                ),
            ));
        }
        let has_group = |name: &str| group_names(regex).any(|n| n == name);
        for part in subject.iter().flatten() {
            if let TemplatePart::Group(name) = part
                && !has_group(name)
            {
                problems.push((
                    "subject",
                    format!("names the group {name:?}, which the pattern does not capture"),
                ));
            }
        }
        let needs = |field: &'static str, group: &str, uses: bool, problems: &mut Vec<_>| {
            if uses && !has_group(group) {
                problems.push((
                    field,
                    format!("takes it from the {group:?} capture group, which the pattern lacks"),
                ));
            }
        };
        needs("status", "xid", status == Some(StatusSource::XidCatalog), &mut problems);
        needs("action", "xid", action == Some(ActionSource::XidCatalog), &mut problems);
        needs("status", "recovery", status == Some(StatusSource::RecoveryAction), &mut problems);
        needs("action", "recovery", action == Some(ActionSource::RecoveryAction), &mut problems);
    }
    match (regex, status, action, subject) {
        (Some(regex), Some(status), Some(action), Some(subject)) if problems.is_empty() => {
            Ok(Rule {
                name: rule.name.clone(),
                finding: rule.finding.clone(),
                regex,
                status,
                action,
                subject,
                clear_after: rule.clear_after,
                lines: rule.lines,
                latest_wins: status == StatusSource::RecoveryAction,
            })
        }
        _ => Err(problems),
    }
}

/// A rule's pattern, matched against the line's bytes with ASCII classes (`\d`, `\w`, `\s`, `\b`
/// and case folding know ASCII only, as in node-problem-detector's Go patterns). Unicode classes
/// cost memory out of all proportion: the built-in rules' bounded repetitions (`\w{1,64}`,
/// `[^\s\[\]]{1,64}`) held ~11 MiB of compiled automata with them, more than the rest of the
/// agent; kernel-log lines are ASCII. A syntax error comes back as one line.
///
/// Built as the `regex` crate builds a `bytes::Regex` (leftmost-first, the same size limits),
/// less the one-pass DFA: it only speeds up the capture groups of a line that already matched,
/// which is rare, and it was half of the rules' compiled memory (~420 of ~820 KiB for the
/// built-in set).
fn build_regex(pattern: &str) -> Result<Regex, String> {
    let config = meta::Config::new()
        .onepass(false)
        .utf8_empty(false)
        .nfa_size_limit(Some(10 << 20))
        .hybrid_cache_capacity(2 << 20);
    Regex::builder()
        .configure(config)
        .syntax(syntax::Config::new().unicode(false).utf8(false))
        .build(pattern)
        .map_err(|err| {
            // A syntax error spans several lines with a caret; one line reads better.
            let text = err.syntax_error().map_or_else(|| err.to_string(), ToString::to_string);
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        })
}

/// The names of `regex`'s capture groups.
fn group_names(regex: &Regex) -> impl Iterator<Item = &str> {
    regex.group_info().pattern_names(PatternID::ZERO).flatten()
}

/// A match's capture groups over the text it was found in.
struct Groups<'h> {
    caps: &'h Captures,
    haystack: &'h [u8],
}

impl<'h> Groups<'h> {
    /// Group `name`'s text; a match that cut a multi-byte character keeps a replacement
    /// character.
    fn get(&self, name: &str) -> Option<Cow<'h, str>> {
        let span = self.caps.get_group_by_name(name)?;
        Some(String::from_utf8_lossy(&self.haystack[span.range()]))
    }
}

/// Every problem with the user's rules, each naming `{section}.rules[i].field`.
pub fn validate(
    section: &str,
    user: &[KernelLogRule],
    problems: &mut crate::config::ConfigProblems,
) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, rule) in user.iter().enumerate() {
        if let Err(rule_problems) = compile(rule) {
            for (field, message) in rule_problems {
                problems.push(format!("{section}.rules[{i}].{field}"), message);
            }
        }
        if !rule.name.trim().is_empty()
            && let Some(first) = seen.insert(rule.name.as_str(), i)
        {
            problems.push(
                format!("{section}.rules[{i}].name"),
                format!("{:?} is already the name of rules[{first}]", rule.name),
            );
        }
    }
}

fn is_snake_case(id: &str) -> bool {
    id.starts_with(|c: char| c.is_ascii_lowercase())
        && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Splits `${group}` references out of a subject template.
fn parse_template(template: &str) -> Result<Vec<TemplatePart>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        if start > 0 {
            parts.push(TemplatePart::Text(rest[..start].to_owned()));
        }
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("{template:?} has a \"${{\" without its \"}}\""));
        };
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "{template:?} names the group {name:?}, which is not a group name"
            ));
        }
        parts.push(TemplatePart::Group(name.to_owned()));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(TemplatePart::Text(rest.to_owned()));
    }
    Ok(parts)
}

/// `text` cut to at most `max` characters.
pub fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rule(pattern: &str) -> KernelLogRule {
        KernelLogRule {
            name: "r".into(),
            pattern: pattern.into(),
            finding: "f".into(),
            ..KernelLogRule::default()
        }
    }

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

    #[test]
    fn problems_name_their_fields() {
        let bad = KernelLogRule {
            name: String::new(),
            pattern: "(unclosed".into(),
            finding: "Bad Id".into(),
            status: "sometimes".into(),
            action: "pray".into(),
            subject: "${x".into(),
            clear_after: Duration::ZERO,
            lines: 9,
        };
        let problems = compile(&bad).err().unwrap_or_default();
        let fields: Vec<&str> = problems.iter().map(|p| p.0).collect();
        for field in
            ["name", "pattern", "finding", "status", "action", "subject", "clear_after", "lines"]
        {
            assert!(fields.contains(&field), "{field} missing from {problems:?}");
        }
        let missing_group =
            KernelLogRule { subject: "${dev}".into(), ..rule("disk (?P<disk>\\w+)") };
        let problems = compile(&missing_group).err().unwrap_or_default();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "subject");
        assert!(problems[0].1.contains("dev"), "{problems:?}");
        let catalog = KernelLogRule { action: "xid-catalog".into(), ..rule("Xid") };
        let problems = compile(&catalog).err().unwrap_or_default();
        assert_eq!(problems.iter().map(|p| p.0).collect::<Vec<_>>(), ["action"]);
    }

    #[test]
    fn more_groups_than_a_finding_has_labels_is_refused() {
        let groups = |n: usize| (0..n).map(|i| format!("(?P<g{i}>\\d)")).collect::<String>();
        assert!(compile(&rule(&groups(MAX_GROUPS))).is_ok());
        let problems = compile(&rule(&groups(MAX_GROUPS + 1))).err().unwrap_or_default();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "pattern");
        assert!(problems[0].1.contains(&format!("{} named capture groups", MAX_GROUPS + 1)));
        let long = format!("(?P<{}>x)", "k".repeat(MAX_LABEL_KEY_BYTES + 1));
        let problems = compile(&rule(&long)).err().unwrap_or_default();
        assert_eq!(problems.iter().map(|p| p.0).collect::<Vec<_>>(), ["pattern"]);
        assert!(problems[0].1.contains("longer than 128 bytes"), "{problems:?}");
    }

    #[test]
    fn templates_keep_text_and_groups() {
        let parts = parse_template("gpu-${pci}/x").unwrap();
        assert_eq!(
            parts,
            [
                TemplatePart::Text("gpu-".into()),
                TemplatePart::Group("pci".into()),
                TemplatePart::Text("/x".into())
            ]
        );
        assert!(parse_template("${}").is_err());
        assert_eq!(parse_template("").unwrap(), []);
    }

    #[test]
    fn user_rules_replace_builtins_by_name() {
        let user = KernelLogRule { name: "oom_kill".into(), status: "fail".into(), ..rule("x") };
        let rules = effective_rules(true, std::slice::from_ref(&user));
        assert_eq!(rules.len(), builtin_rules().len());
        assert_eq!(rules.iter().find(|r| r.name == "oom_kill"), Some(&user));
        assert_eq!(effective_rules(false, std::slice::from_ref(&user)), [user]);
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("hi", 5), "hi");
    }
}
