//! The host check: memory, swap, load, online CPUs, required processes and EDAC memory errors.
//!
//! Why not the `sysinfo` crate: it always reads the live `/proc` and `/sys`, while every check here
//! reads the host's files through the injected [`HostPaths`](crate::config::HostPaths) (fixture
//! trees in tests, `--path.procfs`/`--path.sysfs` when the host is mounted into a container). So
//! this check parses the few procfs and sysfs files it needs itself, as node_exporter does: a
//! handful of small reads per run into reused buffers, which also keeps the agent's idle memory
//! small.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;

use super::{BuildContext, Check, Observation, RunContext};
use crate::config::{ConfigProblems, Schedule};
use crate::metrics::{
    HOST_CPUS, HOST_EDAC_ERRORS, HOST_LOAD, HOST_MEMORY_AVAILABLE, HOST_MEMORY_TOTAL,
    HOST_PROCESS_RUNNING, HOST_SWAP_FREE, HOST_SWAP_TOTAL, Sample,
};

pub const NAME: &str = "host";

/// Finding ids of this check. Each is reported `ok` as well, so a condition can clear.
pub mod findings {
    /// Available memory below `min_memory_available_ratio` (warn).
    pub const MEMORY_LOW: &str = "memory_low";
    /// Swap in use above `max_swap_used_ratio` (warn).
    pub const SWAP_HIGH: &str = "swap_high";
    /// 5-minute load per online CPU above `max_load_per_cpu` (warn).
    pub const LOAD_HIGH: &str = "load_high";
    /// Fewer CPUs online than `expected_cpus` (fail).
    pub const CPU_OFFLINE: &str = "cpu_offline";
    /// A required process is not running (fail); the subject is the process name.
    pub const PROCESS_MISSING: &str = "process_missing";
    /// An EDAC memory controller counted uncorrected errors (fail); the subject is `mcN`.
    pub const EDAC_UNCORRECTED: &str = "edac_uncorrected";
    /// Corrected memory errors rising faster than `edac_ce_rate_max` per hour (warn).
    pub const EDAC_CORRECTED: &str = "edac_corrected";
}

/// The window over which the corrected-error rate is measured: one hour, so a single error in a
/// 10-second interval does not read as 360 per hour.
const CE_WINDOW: Duration = Duration::from_secs(3600);
/// Keep at most one corrected-error reading per minute: ~60 per controller for the window.
const CE_SAMPLE_SPACING: Duration = Duration::from_secs(60);
/// The kernel keeps a process's `comm` to 15 bytes.
const COMM_MAX: usize = 15;

/// Settings of the host check (`[checks.host]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// CPUs that should be online. Fewer → `cpu_offline` fail, reboot: CPUs the kernel took
    /// offline after machine checks come back with a reboot; if they do not, the repairer's
    /// escalation replaces the node. Unset: not checked.
    pub expected_cpus: Option<u32>,
    /// Warn (`memory_low`) when MemAvailable over MemTotal falls below this.
    pub min_memory_available_ratio: f64,
    /// Warn (`swap_high`) when used swap over all swap rises above this (only where swap exists).
    pub max_swap_used_ratio: f64,
    /// Warn (`load_high`) when the 5-minute load per online CPU rises above this. Unset: off
    /// (training nodes run hot by design).
    pub max_load_per_cpu: Option<f64>,
    /// Processes that must run (their `comm` name, or the program's file name when longer than
    /// the 15 bytes the kernel keeps), e.g. `["slurmd", "nv-fabricmanager"]`.
    pub required_processes: Vec<String>,
    /// What to recommend when a required process is missing (`process_missing`, fail). Default
    /// `drain`: a node without its slurmd or fabric manager must not get work, and draining
    /// stops new jobs without killing running ones. Not `reboot` by default: a daemon that
    /// crashes at start would reboot-loop the node, and one stopped for maintenance would reboot
    /// it under the operator; the repairer's escalation reboots a node that stays drained. Set
    /// `reboot` where the daemon is known to come back with the node.
    pub missing_process_action: RecommendedAction,
    /// Warn (`edac_corrected`) when corrected memory errors of one controller rise faster than
    /// this many per hour (measured over the last hour).
    pub edac_ce_rate_max: f64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            expected_cpus: None,
            min_memory_available_ratio: 0.05,
            max_swap_used_ratio: 0.5,
            max_load_per_cpu: None,
            required_processes: Vec::new(),
            missing_process_action: RecommendedAction::Drain,
            edac_ce_rate_max: 100.0,
        }
    }
}

impl HostConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
        if self.expected_cpus == Some(0) {
            problems.push(format!("{section}.expected_cpus"), "must be greater than zero");
        }
        for (name, value) in [
            ("min_memory_available_ratio", self.min_memory_available_ratio),
            ("max_swap_used_ratio", self.max_swap_used_ratio),
        ] {
            if !(0.0..=1.0).contains(&value) {
                problems
                    .push(format!("{section}.{name}"), format!("{value} is not between 0 and 1"));
            }
        }
        if let Some(load) = self.max_load_per_cpu
            && !(load.is_finite() && load > 0.0)
        {
            problems.push(format!("{section}.max_load_per_cpu"), format!("{load} is not positive"));
        }
        if !(self.edac_ce_rate_max.is_finite() && self.edac_ce_rate_max >= 0.0) {
            problems.push(
                format!("{section}.edac_ce_rate_max"),
                format!("{} is not a rate of zero or more", self.edac_ce_rate_max),
            );
        }
        for (i, name) in self.required_processes.iter().enumerate() {
            let field = format!("{section}.required_processes[{i}]");
            if name.is_empty() || name.contains(['/', '\0', '\n']) {
                problems.push(field, format!("{name:?} is not a process name"));
            } else if self.required_processes[..i].contains(name) {
                problems.push(field, format!("{name:?} is listed twice"));
            }
        }
    }
}

/// Reading a host file failed.
#[derive(Debug, thiserror::Error)]
pub enum HostReadError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("parsing {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

/// `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    pub available: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// Corrected-error readings of one memory controller over the last hour.
#[derive(Debug, Default)]
struct CeHistory {
    readings: VecDeque<(SystemTime, u64)>,
}

impl CeHistory {
    /// Adds a reading and returns the corrected errors per hour over the last hour (the plain
    /// increase while less than an hour has been seen).
    fn observe(&mut self, now: SystemTime, count: u64) -> f64 {
        if let Some(&(last_time, last_count)) = self.readings.back() {
            // A count that went down (driver reloaded) or a clock that went back starts over.
            if count < last_count || now < last_time {
                self.readings.clear();
            }
        }
        let spaced = self.readings.back().is_none_or(|&(last_time, _)| {
            now.duration_since(last_time).unwrap_or_default() >= CE_SAMPLE_SPACING
        });
        if spaced {
            self.readings.push_back((now, count));
        }
        // Drop readings older than the window, keeping the newest of them as the baseline.
        while self.readings.len() >= 2
            && now.duration_since(self.readings[1].0).unwrap_or_default() >= CE_WINDOW
        {
            self.readings.pop_front();
        }
        let Some(&(base_time, base_count)) = self.readings.front() else { return 0.0 };
        let hours = now.duration_since(base_time).unwrap_or_default().as_secs_f64() / 3600.0;
        count.saturating_sub(base_count) as f64 / hours.max(1.0)
    }
}

#[derive(Debug)]
pub struct HostCheck {
    config: HostConfig,
    ce_history: HashMap<String, CeHistory>,
}

impl HostCheck {
    pub fn new(config: &HostConfig, _ctx: BuildContext<'_>) -> Self {
        HostCheck { config: config.clone(), ce_history: HashMap::new() }
    }

    fn observe_memory(&self, procfs: &Path, out: &mut Observation) {
        let path = procfs.join("meminfo");
        let info = read_text(&path).and_then(|text| parse_meminfo(&text, &path));
        let info = match info {
            Ok(info) => info,
            Err(err) => {
                for id in [findings::MEMORY_LOW, findings::SWAP_HIGH] {
                    out.findings.push(unknown(id, "", err.to_string()));
                }
                return;
            }
        };
        out.samples.push(Sample::new(&HOST_MEMORY_TOTAL, info.total as f64));
        out.samples.push(Sample::new(&HOST_MEMORY_AVAILABLE, info.available as f64));
        out.samples.push(Sample::new(&HOST_SWAP_TOTAL, info.swap_total as f64));
        out.samples.push(Sample::new(&HOST_SWAP_FREE, info.swap_free as f64));

        let ratio = info.available as f64 / info.total as f64;
        let message = format!(
            "{} of {} MiB available ({:.1}%)",
            info.available >> 20,
            info.total >> 20,
            ratio * 100.0
        );
        let finding = if ratio < self.config.min_memory_available_ratio {
            Finding::new(
                NAME,
                findings::MEMORY_LOW,
                "",
                Status::Warn,
                // Memory pressure comes from the work on the node; the OOM killer or the job's
                // owner deals with it.
                RecommendedAction::None,
                format!("{message}, below {:.1}%", self.config.min_memory_available_ratio * 100.0),
            )
        } else {
            ok_with(findings::MEMORY_LOW, "", message)
        };
        out.findings.push(finding.with_value(ratio));

        let finding = if info.swap_total == 0 {
            ok_with(findings::SWAP_HIGH, "", "no swap".to_owned())
        } else {
            let used =
                info.swap_total.saturating_sub(info.swap_free) as f64 / info.swap_total as f64;
            let message = format!("{:.1}% of swap in use", used * 100.0);
            if used > self.config.max_swap_used_ratio {
                Finding::new(
                    NAME,
                    findings::SWAP_HIGH,
                    "",
                    Status::Warn,
                    RecommendedAction::None,
                    format!("{message}, above {:.1}%", self.config.max_swap_used_ratio * 100.0),
                )
            } else {
                ok_with(findings::SWAP_HIGH, "", message)
            }
            .with_value(used)
        };
        out.findings.push(finding);
    }

    /// Online CPUs, reported as `cpu_offline`; also returned for the load per CPU.
    fn observe_cpus(&self, sysfs: &Path, out: &mut Observation) -> Option<u32> {
        let path = sysfs.join("devices/system/cpu/online");
        let online = match read_text(&path).and_then(|text| parse_cpu_list(&text, &path)) {
            Ok(online) => online,
            Err(err) => {
                out.findings.push(unknown(findings::CPU_OFFLINE, "", err.to_string()));
                return None;
            }
        };
        out.samples.push(Sample::new(&HOST_CPUS, f64::from(online)));
        let finding = match self.config.expected_cpus {
            Some(expected) if online < expected => Finding::new(
                NAME,
                findings::CPU_OFFLINE,
                "",
                Status::Fail,
                // CPUs offlined by machine-check handling come back with a reboot; a node where
                // they do not is escalated by the repairer.
                RecommendedAction::Reboot,
                format!("{online} of {expected} CPUs online"),
            ),
            Some(expected) => {
                ok_with(findings::CPU_OFFLINE, "", format!("{online} of {expected} CPUs online"))
            }
            None => ok_with(findings::CPU_OFFLINE, "", format!("{online} CPUs online")),
        };
        out.findings.push(finding.with_value(f64::from(online)));
        Some(online)
    }

    fn observe_load(&self, procfs: &Path, cpus: Option<u32>, out: &mut Observation) {
        let path = procfs.join("loadavg");
        let loads = match read_text(&path).and_then(|text| parse_loadavg(&text, &path)) {
            Ok(loads) => loads,
            Err(err) => {
                if self.config.max_load_per_cpu.is_some() {
                    out.findings.push(unknown(findings::LOAD_HIGH, "", err.to_string()));
                }
                return;
            }
        };
        for (window, load) in ["1m", "5m", "15m"].into_iter().zip(loads) {
            out.samples.push(Sample::new(&HOST_LOAD, load).label("window", window));
        }
        let Some(max) = self.config.max_load_per_cpu else { return };
        let finding = match cpus {
            None | Some(0) => unknown(
                findings::LOAD_HIGH,
                "",
                "the online CPU count is unknown, so is the load per CPU".to_owned(),
            ),
            Some(cpus) => {
                let per_cpu = loads[1] / f64::from(cpus);
                let message = format!("5-minute load {:.2} per CPU", per_cpu);
                if per_cpu > max {
                    Finding::new(
                        NAME,
                        findings::LOAD_HIGH,
                        "",
                        Status::Warn,
                        RecommendedAction::None,
                        format!("{message}, above {max}"),
                    )
                } else {
                    ok_with(findings::LOAD_HIGH, "", message)
                }
                .with_value(per_cpu)
            }
        };
        out.findings.push(finding);
    }

    fn observe_processes(&self, procfs: &Path, out: &mut Observation) {
        let wanted = &self.config.required_processes;
        if wanted.is_empty() {
            return;
        }
        let running = match find_processes(procfs, wanted) {
            Ok(running) => running,
            Err(err) => {
                let message = format!("listing {}: {err}", procfs.display());
                for name in wanted {
                    out.findings.push(unknown(findings::PROCESS_MISSING, name, message.clone()));
                }
                return;
            }
        };
        for (name, running) in wanted.iter().zip(running) {
            out.samples.push(
                Sample::new(&HOST_PROCESS_RUNNING, if running { 1.0 } else { 0.0 })
                    .label("process", name.as_str()),
            );
            out.findings.push(if running {
                Finding::ok(NAME, findings::PROCESS_MISSING, name.as_str())
            } else {
                Finding::new(
                    NAME,
                    findings::PROCESS_MISSING,
                    name.as_str(),
                    Status::Fail,
                    self.config.missing_process_action,
                    format!("required process {name} is not running"),
                )
            });
        }
    }

    fn observe_edac(&mut self, sysfs: &Path, now: SystemTime, out: &mut Observation) {
        let dir = sysfs.join("devices/system/edac/mc");
        // No EDAC directory: no memory controller driver, so nothing to report (absent is not
        // failed, and there is no condition to clear).
        let controllers = match list_controllers(&dir) {
            Ok(controllers) => controllers,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return,
            Err(err) => {
                out.findings.push(unknown(
                    findings::EDAC_UNCORRECTED,
                    "",
                    format!("listing {}: {err}", dir.display()),
                ));
                return;
            }
        };
        let mut seen = Vec::with_capacity(controllers.len());
        for controller in controllers {
            let base = dir.join(&controller);
            match read_count(&base.join("ue_count")) {
                Ok(ue) => {
                    out.samples.push(
                        Sample::new(&HOST_EDAC_ERRORS, ue as f64)
                            .label("controller", controller.as_str())
                            .label("kind", "uncorrected"),
                    );
                    out.findings.push(if ue > 0 {
                        Finding::new(
                            NAME,
                            findings::EDAC_UNCORRECTED,
                            controller.as_str(),
                            Status::Fail,
                            // A DIMM that lost data does not heal with a reboot; the node needs
                            // its memory replaced.
                            RecommendedAction::Replace,
                            format!("{controller} counted {ue} uncorrected memory errors"),
                        )
                        .with_value(ue as f64)
                    } else {
                        Finding::ok(NAME, findings::EDAC_UNCORRECTED, controller.as_str())
                            .with_value(0.0)
                    });
                }
                Err(err) => out.findings.push(unknown(
                    findings::EDAC_UNCORRECTED,
                    &controller,
                    err.to_string(),
                )),
            }
            match read_count(&base.join("ce_count")) {
                Ok(ce) => {
                    out.samples.push(
                        Sample::new(&HOST_EDAC_ERRORS, ce as f64)
                            .label("controller", controller.as_str())
                            .label("kind", "corrected"),
                    );
                    let rate =
                        self.ce_history.entry(controller.clone()).or_default().observe(now, ce);
                    let message =
                        format!("{rate:.0} corrected memory errors per hour ({ce} in all)");
                    out.findings.push(
                        if rate > self.config.edac_ce_rate_max {
                            Finding::new(
                                NAME,
                                findings::EDAC_CORRECTED,
                                controller.as_str(),
                                Status::Warn,
                                // Corrected errors are survivable; a rising rate predicts an
                                // uncorrected one, which then asks for replacement.
                                RecommendedAction::None,
                                format!(
                                    "{message}, above {} per hour",
                                    self.config.edac_ce_rate_max
                                ),
                            )
                        } else {
                            ok_with(findings::EDAC_CORRECTED, &controller, message)
                        }
                        .with_value(rate),
                    );
                }
                Err(err) => out.findings.push(unknown(
                    findings::EDAC_CORRECTED,
                    &controller,
                    err.to_string(),
                )),
            }
            seen.push(controller);
        }
        // Forget controllers that went away, so the history stays bounded.
        self.ce_history.retain(|controller, _| seen.contains(controller));
    }
}

impl Check for HostCheck {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&mut self, ctx: &RunContext<'_>) -> Observation {
        let mut out = Observation::default();
        let paths = ctx.paths;
        self.observe_memory(&paths.procfs, &mut out);
        let cpus = self.observe_cpus(&paths.sysfs, &mut out);
        self.observe_load(&paths.procfs, cpus, &mut out);
        self.observe_processes(&paths.procfs, &mut out);
        self.observe_edac(&paths.sysfs, ctx.now, &mut out);
        out
    }
}

fn unknown(id: &str, subject: &str, message: String) -> Finding {
    Finding::new(NAME, id, subject, Status::Unknown, RecommendedAction::None, message)
}

fn ok_with(id: &str, subject: &str, message: String) -> Finding {
    let mut finding = Finding::ok(NAME, id, subject);
    finding.message = message;
    finding
}

fn read_text(path: &Path) -> Result<String, HostReadError> {
    fs::read_to_string(path).map_err(|source| HostReadError::Read { path: path.to_owned(), source })
}

fn parse_error(path: &Path, reason: impl Into<String>) -> HostReadError {
    HostReadError::Parse { path: path.to_owned(), reason: reason.into() }
}

/// Parses `/proc/meminfo` (`MemTotal:  16384 kB`); MemTotal and MemAvailable are required, swap
/// lines default to 0.
pub fn parse_meminfo(text: &str, path: &Path) -> Result<MemInfo, HostReadError> {
    let (mut total, mut available, mut swap_total, mut swap_free) = (None, None, 0, 0);
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else { continue };
        let slot = match key {
            "MemTotal" => &mut total,
            "MemAvailable" => &mut available,
            "SwapTotal" | "SwapFree" => {
                let bytes = meminfo_bytes(rest)
                    .ok_or_else(|| parse_error(path, format!("{key} is {:?}", rest.trim())))?;
                if key == "SwapTotal" {
                    swap_total = bytes;
                } else {
                    swap_free = bytes;
                }
                continue;
            }
            _ => continue,
        };
        *slot = Some(
            meminfo_bytes(rest)
                .ok_or_else(|| parse_error(path, format!("{key} is {:?}", rest.trim())))?,
        );
    }
    let total = total.ok_or_else(|| parse_error(path, "no MemTotal line"))?;
    let available = available.ok_or_else(|| parse_error(path, "no MemAvailable line"))?;
    if total == 0 {
        return Err(parse_error(path, "MemTotal is 0"));
    }
    Ok(MemInfo { total, available, swap_total, swap_free })
}

/// `  16384 kB` → bytes (the kernel's "kB" is KiB).
fn meminfo_bytes(value: &str) -> Option<u64> {
    let mut parts = value.split_ascii_whitespace();
    let number: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => number.checked_mul(1024),
        None => Some(number),
        Some(_) => None,
    }
}

/// Parses `/proc/loadavg` (`0.52 0.58 0.59 1/467 12345`) into the 1, 5 and 15-minute loads.
pub fn parse_loadavg(text: &str, path: &Path) -> Result<[f64; 3], HostReadError> {
    let mut fields = text.split_ascii_whitespace();
    let mut loads = [0.0; 3];
    for load in &mut loads {
        let field = fields.next().ok_or_else(|| parse_error(path, "fewer than three loads"))?;
        *load = field
            .parse::<f64>()
            .ok()
            .filter(|value| value.is_finite() && *value >= 0.0)
            .ok_or_else(|| parse_error(path, format!("{field:?} is not a load")))?;
    }
    Ok(loads)
}

/// Counts the CPUs in a sysfs CPU list (`0-3,5,8-11`).
pub fn parse_cpu_list(text: &str, path: &Path) -> Result<u32, HostReadError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(parse_error(path, "empty CPU list"));
    }
    let mut count: u32 = 0;
    for part in text.split(',') {
        let bad = || parse_error(path, format!("{part:?} is not a CPU or CPU range"));
        let (first, last) = match part.split_once('-') {
            Some((first, last)) => (first.parse::<u32>(), last.parse::<u32>()),
            None => (part.parse::<u32>(), part.parse::<u32>()),
        };
        let (first, last) = (first.map_err(|_| bad())?, last.map_err(|_| bad())?);
        if last < first {
            return Err(bad());
        }
        count = count.saturating_add(last - first + 1);
    }
    Ok(count)
}

fn read_count(path: &Path) -> Result<u64, HostReadError> {
    let text = read_text(path)?;
    text.trim().parse().map_err(|_| parse_error(path, format!("{:?} is not a count", text.trim())))
}

/// `mcN` directories under the EDAC `mc` directory, in controller order.
fn list_controllers(dir: &Path) -> Result<Vec<String>, io::Error> {
    let mut controllers: Vec<(u32, String)> = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(number) = name.strip_prefix("mc").and_then(|n| n.parse::<u32>().ok()) {
            controllers.push((number, name));
        }
    }
    controllers.sort();
    Ok(controllers.into_iter().map(|(_, name)| name).collect())
}

/// Which of `wanted` run, by a scan of `{procfs}/<pid>/comm`. Names longer than the kernel's 15
/// bytes are matched on their truncated `comm` and confirmed by the file name of `argv[0]`. The
/// scan reuses one path and two stack buffers and stops once everything is found.
fn find_processes(procfs: &Path, wanted: &[String]) -> Result<Vec<bool>, io::Error> {
    let mut found = vec![false; wanted.len()];
    let mut path = procfs.to_path_buf();
    let mut comm_buf = [0u8; 64];
    let mut cmdline_buf = [0u8; 512];
    for entry in fs::read_dir(procfs)? {
        // An entry can vanish mid-scan (a process exiting): skip it.
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        path.push(pid);
        path.push("comm");
        let comm = read_small(&path, &mut comm_buf).map(|n| trim_newline(&comm_buf[..n]));
        path.pop();
        let Ok(comm) = comm else {
            path.pop();
            continue;
        };
        // The length of argv[0] in `cmdline_buf`, read at most once per process.
        let mut argv0_len: Option<Option<usize>> = None;
        for (i, want) in wanted.iter().enumerate() {
            if found[i] {
                continue;
            }
            let want = want.as_bytes();
            if want.len() <= COMM_MAX {
                found[i] = comm == want;
            } else if comm == &want[..COMM_MAX] {
                // Truncated comm: the program's file name decides.
                let len = *argv0_len.get_or_insert_with(|| {
                    path.push("cmdline");
                    let len = read_small(&path, &mut cmdline_buf).ok().and_then(|n| {
                        let len = cmdline_buf[..n].iter().position(|&b| b == 0).unwrap_or(n);
                        // Empty (a kernel thread, a zombie) or a buffer full without the end of
                        // argv[0]: nothing to confirm with.
                        (len > 0 && len < cmdline_buf.len()).then_some(len)
                    });
                    path.pop();
                    len
                });
                found[i] = match len {
                    Some(len) => cmdline_buf[..len].rsplit(|&b| b == b'/').next() == Some(want),
                    // No readable command line (or an unusually long one): trust the comm.
                    None => true,
                };
            }
        }
        path.pop();
        if found.iter().all(|&f| f) {
            break;
        }
    }
    Ok(found)
}

/// Reads up to `buf.len()` bytes of a small file.
fn read_small(path: &Path, buf: &mut [u8]) -> Result<usize, io::Error> {
    let mut file = File::open(path)?;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

fn trim_newline(bytes: &[u8]) -> &[u8] {
    bytes.strip_suffix(b"\n").unwrap_or(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("/fx/meminfo")
    }

    #[test]
    fn meminfo_in_bytes_with_swap_optional() {
        let info = parse_meminfo(
            "MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    8192 kB\n\
             SwapTotal:  1024 kB\nSwapFree: 512 kB\nHugePages_Total:       0\n",
            p(),
        )
        .unwrap();
        assert_eq!(
            info,
            MemInfo {
                total: 16384 * 1024,
                available: 8192 * 1024,
                swap_total: 1024 * 1024,
                swap_free: 512 * 1024
            }
        );
        let info = parse_meminfo("MemTotal: 10 kB\nMemAvailable: 5 kB\n", p()).unwrap();
        assert_eq!(info.swap_total, 0);
    }

    #[test]
    fn garbage_meminfo_names_the_file() {
        for text in ["", "MemTotal: 10 kB\n", "MemTotal: abc kB\nMemAvailable: 1 kB\n"] {
            let err = parse_meminfo(text, p()).unwrap_err();
            assert!(err.to_string().contains("/fx/meminfo"), "{err}");
        }
        assert!(parse_meminfo("MemTotal: 0 kB\nMemAvailable: 0 kB\n", p()).is_err());
    }

    #[test]
    fn loadavg_and_cpu_lists() {
        assert_eq!(parse_loadavg("0.52 1.5 3 1/467 12345\n", p()).unwrap(), [0.52, 1.5, 3.0]);
        assert!(parse_loadavg("abc", p()).is_err());
        assert!(parse_loadavg("1 2", p()).is_err());
        assert!(parse_loadavg("1 NaN 2", p()).is_err());
        assert_eq!(parse_cpu_list("0-3,5\n", p()).unwrap(), 5);
        assert_eq!(parse_cpu_list("0\n", p()).unwrap(), 1);
        assert_eq!(parse_cpu_list("0-127", p()).unwrap(), 128);
        for bad in ["", "\n", "x-y", "3-1", "0-", ",", "1,,2"] {
            assert!(parse_cpu_list(bad, p()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ce_rate_is_per_hour_over_the_last_hour() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut history = CeHistory::default();
        assert_eq!(history.observe(t0, 1000), 0.0, "the first reading is a baseline");
        // 50 more in 10 minutes: under an hour seen, the increase itself is the hourly figure.
        assert_eq!(history.observe(t0 + Duration::from_secs(600), 1050), 50.0);
        // A reading every 10 s for two hours at 60 per hour: the rate settles near 60.
        let mut rate = 0.0;
        for step in 1..=720u64 {
            let now = t0 + Duration::from_secs(600 + step * 10);
            rate = history.observe(now, 1050 + step / 6);
        }
        assert!((55.0..=65.0).contains(&rate), "{rate}");
        assert!(history.readings.len() <= 62, "{}", history.readings.len());
        // The counter went back (driver reloaded): a new baseline, not a negative rate.
        assert_eq!(history.observe(t0 + Duration::from_secs(8000), 3), 0.0);
    }

    #[test]
    fn config_problems_name_their_fields() {
        let config: HostConfig = toml::from_str(
            "expected_cpus = 0\nmin_memory_available_ratio = 1.5\nmax_load_per_cpu = -1.0\n\
             required_processes = [\"slurmd\", \"\", \"slurmd\"]\nedac_ce_rate_max = -3.0\n\
             missing_process_action = \"reboot\"\n",
        )
        .unwrap();
        let mut problems = ConfigProblems::default();
        config.validate("checks.host", &mut problems);
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        for expected in [
            "checks.host.expected_cpus",
            "checks.host.min_memory_available_ratio",
            "checks.host.max_load_per_cpu",
            "checks.host.required_processes[1]",
            "checks.host.required_processes[2]",
            "checks.host.edac_ce_rate_max",
        ] {
            assert!(fields.contains(&expected), "{expected} missing from {problems}");
        }
        assert!(toml::from_str::<HostConfig>("missing_process_action = \"explode\"").is_err());
        let mut problems = ConfigProblems::default();
        HostConfig::default().validate("checks.host", &mut problems);
        assert!(problems.is_empty(), "{problems}");
    }
}
