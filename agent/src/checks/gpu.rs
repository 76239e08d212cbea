//! The gpu check: per-GPU health from a GPU backend (NVML or a JSON fixture), the GPU count
//! against the expected one, and Xid events.
//!
//! The backend ([`crate::gpu`]) returns a [`GpuSnapshot`]; this file turns it into findings and
//! metrics. What needs history lives here: counter rates (PCIe replays, NVLink CRC errors) from
//! the previous run's counters, how long an Xid or an NVLink recovery keeps its finding after the
//! last time its count rose, and how many runs in a row the GPU count was short or a GPU was
//! slowed down by its hardware.
//!
//! Findings (subject = GPU index unless said otherwise; per-GPU ones carry a `pci` label where
//! known):
//! - `gpu_backend` (node): ok, or `unknown` when the backend could not read ("NVML unavailable:
//!   ...", an unreadable fixture). An NVML library that differs from the loaded driver is `fail`,
//!   `reboot`: CUDA cannot start on such a node either.
//! - `gpu_count` (node): against `expected_count`; short is `warn` until seen on `count_debounce`
//!   runs in a row with the node up longer than `boot_grace`, then `fail`, `reboot`.
//! - `gpu_access`: the GPU answered; lost → `fail`, `reboot`; reset required → `fail`, `reset-gpu`.
//! - `xid` (labels `xid`, `pci`; value = the code): one per code seen, from the Xid catalog or
//!   `xid_actions`, for `xid_window` after the count last rose; then ok.
//! - `throttle` (value = runs in a row): a hardware slowdown (`hw_slowdown`, `sw_thermal_slowdown`,
//!   `hw_thermal_slowdown`, `hw_power_brake_slowdown`) is `warn` until seen on
//!   `throttle_sustained_runs` runs in a row, then `fail`, `drain`: brief slowdowns under load are
//!   normal, one that lasts is a cooling or power-delivery fault that slows every rank of a job and
//!   that no reset or reboot fixes, so the node stops taking work and a person (or the repairer's
//!   ladder) decides. Software power capping, sync boost and idling are settings and load: ok.
//! - `nvlink_down` (value = links down): a listed link inactive, or with `expected_nvlinks` fewer
//!   links active than expected (links the driver does not list count as down; message "N of M
//!   expected NVLink links active") → `fail`, `reset-gpu`: a GPU reset retrains its links.
//! - `temperature`, `persistence_mode` (off: `warn`), `ecc_uncorrected` (volatile uncorrectable
//!   errors: `fail`, `reset-gpu`), `retired_pages`, `row_remap`, `pcie_replays` (rate: `warn`),
//!   `pcie_link` (trained narrower than its widest: `fail`, `reboot` — a boot retrains it; the
//!   generation is not judged, since an idle GPU lowers it to save power), `nvlink_errors` (CRC
//!   rate or a recent recovery: `warn`), `recovery_action` (the driver's own advice, r570+).
//!
//! With the `none` backend the check is present but reports nothing: it was switched off on
//! purpose, and an `unknown` finding on every run would only be noise on dashboards and alerts.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;

use super::{BuildContext, Check, Mode, Observation, RunContext};
use crate::config::{ConfigProblems, Schedule};
use crate::gpu::{
    ClockEventReason, GpuBackend, GpuBackendError, GpuBackendSpec, GpuCondition, GpuSnapshot,
    GpuState, open_backend,
};
use crate::metrics::{self, Sample};
use crate::xid;

pub const NAME: &str = "gpu";

/// Settings of the gpu check (`[checks.gpu]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Where GPU state comes from: `nvml`, `nvml:LIBRARY` (an NVML library at that path),
    /// `fixture:PATH` (a JSON snapshot, read on every run) or `none` (report nothing).
    /// `fleetmend agent --gpu` takes the same forms (see [`crate::gpu::parse_backend`]).
    pub backend: GpuBackendSpec,
    /// GPUs this node should have. Unset: the count is reported but not judged.
    pub expected_count: Option<u32>,
    /// Runs in a row the count must be short before it fails (GPUs can show up late after boot).
    pub count_debounce: u32,
    /// A short count does not fail before the node has been up this long.
    #[serde(with = "humantime_serde")]
    pub boot_grace: Duration,
    /// GPU temperature at which the check warns.
    pub temperature_warn_celsius: u32,
    /// How long an Xid keeps its finding after the last time it occurred.
    #[serde(with = "humantime_serde")]
    pub xid_window: Duration,
    /// Actions that override the Xid catalog, by code: `{ "13" = "none", "31" = "drain" }`.
    /// `none` makes the Xid ok, `restart-app` a warning, any other action a failure.
    pub xid_actions: BTreeMap<String, RecommendedAction>,
    /// Retired pages (single- and double-bit together) at which the GPU fails (to be replaced).
    pub retired_pages_fail: u32,
    /// Pages retired for double-bit errors at which the GPU fails (to be replaced).
    pub retired_pages_double_bit_fail: u32,
    /// Rows remapped for uncorrectable errors at which the GPU fails (to be replaced).
    pub remapped_rows_uncorrectable_fail: u32,
    /// PCIe replays per minute above which the check warns. Unset: the vendor's rate per lane for
    /// the link's generation (Gen3 0.48, Gen4 0.96, Gen5 1.92) times its width.
    pub pcie_replays_warn_per_minute: Option<f64>,
    /// NVLink CRC errors per second, per link, above which the check warns.
    pub nvlink_crc_errors_warn_per_second: f64,
    /// How long an NVLink recovery keeps its warning after the recovery count last rose.
    #[serde(with = "humantime_serde")]
    pub nvlink_error_window: Duration,
    /// NVLink links every GPU should have active (18 on an H100 or B200 SXM). Fewer active, links
    /// the driver does not list counted as down, fails `nvlink_down`. Unset: only links listed as
    /// inactive are down.
    pub expected_nvlinks: Option<u32>,
    /// Runs in a row a hardware slowdown (`hw_slowdown`, thermal, power brake) must be seen before
    /// `throttle` fails with `drain`; it warns before. Short slowdowns under load are normal.
    pub throttle_sustained_runs: u32,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            backend: GpuBackendSpec::default(),
            expected_count: None,
            count_debounce: 3,
            boot_grace: Duration::from_secs(10 * 60),
            temperature_warn_celsius: 93,
            xid_window: Duration::from_secs(60 * 60),
            xid_actions: BTreeMap::new(),
            retired_pages_fail: 63,
            retired_pages_double_bit_fail: 15,
            remapped_rows_uncorrectable_fail: 512,
            pcie_replays_warn_per_minute: None,
            nvlink_crc_errors_warn_per_second: 100.0,
            nvlink_error_window: Duration::from_secs(60 * 60),
            expected_nvlinks: None,
            throttle_sustained_runs: 3,
        }
    }
}

impl GpuConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
        let mut at_least_one = |field: &str, value: u32| {
            if value == 0 {
                problems.push(format!("{section}.{field}"), "must be at least 1");
            }
        };
        at_least_one("count_debounce", self.count_debounce);
        at_least_one("throttle_sustained_runs", self.throttle_sustained_runs);
        at_least_one("retired_pages_fail", self.retired_pages_fail);
        at_least_one("retired_pages_double_bit_fail", self.retired_pages_double_bit_fail);
        at_least_one("remapped_rows_uncorrectable_fail", self.remapped_rows_uncorrectable_fail);
        if self.expected_count == Some(0) {
            problems.push(
                format!("{section}.expected_count"),
                "must be at least 1 (leave it out to skip the count check)",
            );
        }
        if self.expected_nvlinks == Some(0) {
            problems.push(
                format!("{section}.expected_nvlinks"),
                "must be at least 1 (leave it out for GPUs without NVLink)",
            );
        }
        if !(1..=150).contains(&self.temperature_warn_celsius) {
            problems.push(format!("{section}.temperature_warn_celsius"), "must be 1 to 150");
        }
        for (field, value) in
            [("xid_window", self.xid_window), ("nvlink_error_window", self.nvlink_error_window)]
        {
            if value.is_zero() {
                problems.push(format!("{section}.{field}"), "must be greater than zero");
            }
        }
        let mut positive = |field: &str, value: f64| {
            if !(value.is_finite() && value > 0.0) {
                problems.push(format!("{section}.{field}"), "must be a number greater than zero");
            }
        };
        if let Some(rate) = self.pcie_replays_warn_per_minute {
            positive("pcie_replays_warn_per_minute", rate);
        }
        positive("nvlink_crc_errors_warn_per_second", self.nvlink_crc_errors_warn_per_second);
        for code in self.xid_actions.keys() {
            if code.parse::<u32>().is_err() {
                problems.push(
                    format!("{section}.xid_actions.{code}"),
                    format!("{code:?} is not an Xid code (a number)"),
                );
            }
        }
    }

    /// `xid_actions` with numeric keys; keys that are not numbers were reported by `validate`.
    fn parsed_xid_actions(&self) -> BTreeMap<u32, RecommendedAction> {
        self.xid_actions
            .iter()
            .filter_map(|(code, action)| code.parse().ok().map(|code| (code, *action)))
            .collect()
    }
}

/// Reads the node's GPUs through a backend and judges what it read.
#[derive(Debug)]
pub struct GpuCheck {
    /// `None` for the `none` backend.
    backend: Option<Box<dyn GpuBackend>>,
    config: GpuConfig,
    xid_actions: BTreeMap<u32, RecommendedAction>,
    history: History,
}

/// What the check remembers between runs.
#[derive(Debug, Default)]
struct History {
    /// Runs in a row on which fewer GPUs than expected were seen.
    short_count_runs: u32,
    /// Xid counts by (GPU, code).
    xids: BTreeMap<(u32, u32), Rise>,
    /// NVLink recovery counts by (GPU, link).
    nvlink_recoveries: BTreeMap<(u32, u32), Rise>,
    /// The previous run's counters, by GPU, for rates.
    counters: BTreeMap<u32, Counters>,
    /// Last known PCI bus id by GPU, for Xid findings of GPUs that stopped answering.
    pci: BTreeMap<u32, String>,
    /// The hardware slowdown each GPU is in: runs in a row and since when.
    slowdowns: BTreeMap<u32, Streak>,
}

/// A condition seen on consecutive runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Streak {
    runs: u32,
    since: SystemTime,
}

/// Counters of one GPU at one run.
#[derive(Debug, Clone, Default)]
struct Counters {
    at: Option<SystemTime>,
    pcie_replays: Option<u64>,
    /// CRC errors (flit + data) by link.
    nvlink_crc: BTreeMap<u32, u64>,
}

/// A cumulative count and when it last rose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Rise {
    count: u64,
    last_rise: Option<SystemTime>,
}

impl Rise {
    /// Takes a new reading. A count seen for the first time rose from zero; one that went down was
    /// reset (driver reload, backend restart) and keeps its last rise.
    fn observe(&mut self, count: u64, now: SystemTime) {
        if count > self.count {
            self.last_rise = Some(now);
        }
        self.count = count;
    }

    /// Rose within `window` before `now`. A clock that went backwards counts as "just now".
    fn active(&self, now: SystemTime, window: Duration) -> bool {
        self.last_rise.is_some_and(|at| now.duration_since(at).map_or(true, |age| age < window))
    }

    fn age(&self, now: SystemTime) -> Duration {
        self.last_rise.and_then(|at| now.duration_since(at).ok()).unwrap_or_default()
    }
}

/// Increase per second between two readings of a counter; `None` without an earlier reading,
/// when no time passed, or when the counter went down (it was reset).
fn rate_per_second(
    previous: Option<(SystemTime, u64)>,
    now: SystemTime,
    value: u64,
) -> Option<f64> {
    let (at, before) = previous?;
    let elapsed = now.duration_since(at).ok()?.as_secs_f64();
    if elapsed <= 0.0 || value < before {
        return None;
    }
    Some((value - before) as f64 / elapsed)
}

/// The vendor's PCIe replay warning rate for a link: replays per lane per minute by generation,
/// times the lanes. An unknown generation or width takes the most lenient figure (Gen5 x16).
pub fn pcie_replay_warn_per_minute(generation: Option<u32>, width: Option<u32>) -> f64 {
    let per_lane = match generation {
        Some(0..=3) => 0.48,
        Some(4) => 0.96,
        Some(_) | None => 1.92,
    };
    per_lane * f64::from(width.filter(|&w| w > 0).unwrap_or(16))
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

/// The node's uptime from `{procfs}/uptime`.
fn read_uptime(procfs: &Path) -> Option<Duration> {
    let text = std::fs::read_to_string(procfs.join("uptime")).ok()?;
    let seconds: f64 = text.split_whitespace().next()?.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// Whole seconds, for messages.
fn human(duration: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(duration.as_secs()))
}

fn join_links(links: &[u32]) -> String {
    links.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The most disruptive action of `reasons` and the reasons as one sentence; `None` when empty.
fn worst(reasons: &[(RecommendedAction, String)]) -> Option<(RecommendedAction, String)> {
    let action = reasons.iter().map(|(action, _)| *action).max_by_key(|a| a.weight())?;
    let text = reasons.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>().join("; ");
    Some((action, text))
}

/// A finding about `gpu`, with its `pci` label where known.
/// A sample of `desc` about `gpu` (labelled with its index).
fn gpu_sample(gpu: &GpuState, desc: &'static metrics::MetricDesc, value: f64) -> Sample {
    Sample::new(desc, value).label("gpu", gpu.index.to_string())
}

fn gpu_finding(
    gpu: &GpuState,
    id: &str,
    status: Status,
    action: RecommendedAction,
    message: String,
) -> Finding {
    let finding = Finding::new(NAME, id, gpu.index.to_string(), status, action, message);
    match &gpu.pci_bus_id {
        Some(pci) => finding.with_label("pci", pci.clone()),
        None => finding,
    }
}

/// `throttle` of one GPU from its active clock event reasons, keeping the streak of runs in a row
/// with a hardware slowdown. Software power capping, sync boost and idling are not slowdowns: they
/// are settings and load, not faults.
fn throttle_finding(
    gpu: &GpuState,
    reasons: &[ClockEventReason],
    streaks: &mut BTreeMap<u32, Streak>,
    sustained_runs: u32,
    now: SystemTime,
) -> Finding {
    let slowdowns: Vec<&str> =
        reasons.iter().filter(|r| r.is_slowdown()).map(|r| r.as_str()).collect();
    if slowdowns.is_empty() {
        streaks.remove(&gpu.index);
        return gpu_finding(
            gpu,
            "throttle",
            Status::Ok,
            RecommendedAction::None,
            "no hardware or thermal slowdown".to_owned(),
        );
    }
    let streak = streaks.entry(gpu.index).or_insert(Streak { runs: 0, since: now });
    streak.runs = streak.runs.saturating_add(1);
    let runs = streak.runs;
    // A clock that went back counts as no time.
    let lasting = human(now.duration_since(streak.since).unwrap_or_default());
    let sustained_runs = sustained_runs.max(1);
    let reasons = slowdowns.join(", ");
    let finding = if runs >= sustained_runs {
        gpu_finding(
            gpu,
            "throttle",
            Status::Fail,
            RecommendedAction::Drain,
            format!(
                "clocks held down by {reasons} on {runs} runs in a row (for {lasting}): a cooling or power fault"
            ),
        )
    } else {
        gpu_finding(
            gpu,
            "throttle",
            Status::Warn,
            RecommendedAction::None,
            format!(
                "clocks slowed down: {reasons} (on {runs} of {sustained_runs} runs in a row, for {lasting})"
            ),
        )
    };
    finding.with_value(f64::from(runs))
}

/// `nvlink_down` of one GPU: the listed links that are inactive in `down`, and, with `expected`,
/// the links the GPU should have active (links the driver does not list count as down).
fn nvlink_down_finding(gpu: &GpuState, down: &[u32], expected: Option<u32>) -> Finding {
    let listed = u32::try_from(gpu.nvlinks.len()).unwrap_or(u32::MAX);
    let active = listed.saturating_sub(u32::try_from(down.len()).unwrap_or(u32::MAX));
    let inactive =
        if down.is_empty() { String::new() } else { format!("; inactive: {}", join_links(down)) };
    let (missing, message) = match expected {
        Some(expected) => {
            let unlisted = expected.saturating_sub(listed);
            let unlisted = if unlisted > 0 {
                format!("; {unlisted} not listed by the driver")
            } else {
                String::new()
            };
            (
                expected.saturating_sub(active),
                format!("{active} of {expected} expected NVLink links active{inactive}{unlisted}"),
            )
        }
        None if down.is_empty() => (0, format!("all {listed} NVLink links active")),
        None => (
            u32::try_from(down.len()).unwrap_or(u32::MAX),
            format!("{} of {listed} NVLink links inactive: {}", down.len(), join_links(down)),
        ),
    };
    let finding = if missing == 0 {
        gpu_finding(gpu, "nvlink_down", Status::Ok, RecommendedAction::None, message)
    } else {
        gpu_finding(gpu, "nvlink_down", Status::Fail, RecommendedAction::ResetGpu, message)
    };
    let finding =
        if down.is_empty() { finding } else { finding.with_label("links", join_links(down)) };
    finding.with_value(f64::from(missing))
}

impl GpuCheck {
    pub fn new(config: &GpuConfig, ctx: BuildContext<'_>) -> Self {
        // Xid events are followed only by a running agent; `--once` reads the kernel log's backlog.
        let xid_events = (ctx.mode == Mode::Daemon).then(|| ctx.events.clone());
        GpuCheck::with_backend(config, open_backend(&config.backend, xid_events))
    }

    fn with_backend(config: &GpuConfig, backend: Option<Box<dyn GpuBackend>>) -> Self {
        GpuCheck {
            backend,
            config: config.clone(),
            xid_actions: config.parsed_xid_actions(),
            history: History::default(),
        }
    }

    /// Judges one backend reading. `uptime` is asked only when the GPU count is short.
    fn evaluate(
        &mut self,
        reading: Result<GpuSnapshot, GpuBackendError>,
        now: SystemTime,
        uptime: impl FnOnce() -> Option<Duration>,
    ) -> Observation {
        let mut out = Observation::default();
        if let Some(expected) = self.config.expected_count {
            out.samples.push(Sample::new(&metrics::GPU_EXPECTED_COUNT, f64::from(expected)));
        }
        let snapshot = match reading {
            Ok(snapshot) => snapshot,
            Err(err) => {
                let (status, action) = match err {
                    GpuBackendError::NvmlVersionMismatch => {
                        (Status::Fail, RecommendedAction::Reboot)
                    }
                    _ => (Status::Unknown, RecommendedAction::None),
                };
                out.findings.push(Finding::new(
                    NAME,
                    "gpu_backend",
                    "",
                    status,
                    action,
                    err.to_string(),
                ));
                // Xids seen earlier still hold until their window ends, whether or not the
                // backend can be read now.
                self.xid_findings(&[], now, &mut out);
                return out;
            }
        };
        let driver = snapshot.driver_version.as_deref().unwrap_or("unknown");
        out.findings.push(Finding::new(
            NAME,
            "gpu_backend",
            "",
            Status::Ok,
            RecommendedAction::None,
            format!("read {} GPU(s), driver {driver}", snapshot.gpus.len()),
        ));
        let seen = u32::try_from(snapshot.gpus.len()).unwrap_or(u32::MAX);
        out.samples.push(Sample::new(&metrics::GPU_COUNT, f64::from(seen)));
        out.findings.push(self.count_finding(seen, uptime));
        for gpu in &snapshot.gpus {
            if let Some(pci) = &gpu.pci_bus_id {
                self.history.pci.insert(gpu.index, pci.clone());
            }
            self.gpu_findings(gpu, now, &mut out);
        }
        self.history.counters.retain(|index, _| snapshot.gpus.iter().any(|g| g.index == *index));
        self.history.slowdowns.retain(|index, _| snapshot.gpus.iter().any(|g| g.index == *index));
        self.xid_findings(&snapshot.gpus, now, &mut out);
        out
    }

    fn count_finding(&mut self, seen: u32, uptime: impl FnOnce() -> Option<Duration>) -> Finding {
        let Some(expected) = self.config.expected_count else {
            self.history.short_count_runs = 0;
            return Finding::new(
                NAME,
                "gpu_count",
                "",
                Status::Ok,
                RecommendedAction::None,
                format!("{seen} GPU(s); no expected count configured"),
            )
            .with_value(f64::from(seen));
        };
        let (status, action, message) = if seen >= expected {
            self.history.short_count_runs = 0;
            if seen == expected {
                (Status::Ok, RecommendedAction::None, format!("{seen} of {expected} GPUs"))
            } else {
                (
                    Status::Warn,
                    RecommendedAction::None,
                    format!("{seen} GPUs, more than the {expected} expected (check the config)"),
                )
            }
        } else {
            let runs = self.history.short_count_runs.saturating_add(1);
            self.history.short_count_runs = runs;
            let debounce = self.config.count_debounce.max(1);
            let grace = self.config.boot_grace;
            let uptime = uptime();
            // Unknown uptime: rely on the run debounce alone rather than never failing.
            let past_grace = uptime.is_none_or(|up| up >= grace);
            let up_text = match uptime {
                Some(up) => format!("up {}", human(up)),
                None => "uptime unknown".to_owned(),
            };
            if runs >= debounce && past_grace {
                (
                    Status::Fail,
                    RecommendedAction::Reboot,
                    format!(
                        "{seen} of {expected} GPUs on {runs} runs in a row ({up_text}): a GPU is missing"
                    ),
                )
            } else {
                (
                    Status::Warn,
                    RecommendedAction::None,
                    format!(
                        "{seen} of {expected} GPUs on {runs} of {debounce} runs in a row ({up_text}, boot grace {}): waiting before failing",
                        human(grace)
                    ),
                )
            }
        };
        Finding::new(NAME, "gpu_count", "", status, action, message).with_value(f64::from(seen))
    }

    fn gpu_findings(&mut self, gpu: &GpuState, now: SystemTime, out: &mut Observation) {
        let index = gpu.index.to_string();
        let finding = |id: &str, status: Status, action: RecommendedAction, message: String| {
            gpu_finding(gpu, id, status, action, message)
        };
        let ok =
            |id: &str, message: String| finding(id, Status::Ok, RecommendedAction::None, message);
        let sample = |desc: &'static metrics::MetricDesc, value: f64| gpu_sample(gpu, desc, value);
        let cfg = &self.config;
        let findings = &mut out.findings;
        let samples = &mut out.samples;

        samples.push(
            sample(&metrics::GPU_INFO, 1.0)
                .label("pci_bus_id", gpu.pci_bus_id.clone().unwrap_or_default())
                .label("name", gpu.name.clone().unwrap_or_default())
                .label("uuid", gpu.uuid.clone().unwrap_or_default()),
        );

        let detail = gpu.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
        findings.push(match gpu.condition {
            GpuCondition::Responding => ok("gpu_access", "GPU answers".to_owned()),
            GpuCondition::Lost => finding(
                "gpu_access",
                Status::Fail,
                RecommendedAction::Reboot,
                format!("GPU {index} is lost (fallen off the bus){detail}"),
            ),
            GpuCondition::ResetRequired => finding(
                "gpu_access",
                Status::Fail,
                RecommendedAction::ResetGpu,
                format!("GPU {index} needs a reset{detail}"),
            ),
            GpuCondition::Unreadable => finding(
                "gpu_access",
                Status::Unknown,
                RecommendedAction::None,
                format!("GPU {index} could not be read{detail}"),
            ),
        });

        if let Some(celsius) = gpu.temperature_celsius {
            samples.push(sample(&metrics::GPU_TEMPERATURE, f64::from(celsius)));
            let warn_at = cfg.temperature_warn_celsius;
            let message = format!("{celsius} °C (warns at {warn_at} °C)");
            findings.push(
                if celsius >= warn_at {
                    finding("temperature", Status::Warn, RecommendedAction::None, message)
                } else {
                    ok("temperature", message)
                }
                .with_value(f64::from(celsius)),
            );
        }
        if let Some(watts) = gpu.power_watts {
            samples.push(sample(&metrics::GPU_POWER, watts));
        }
        for (clock, mhz) in [("sm", gpu.sm_clock_mhz), ("memory", gpu.memory_clock_mhz)] {
            if let Some(mhz) = mhz {
                samples
                    .push(sample(&metrics::GPU_CLOCK, f64::from(mhz) * 1e6).label("clock", clock));
            }
        }
        for (unit, percent) in
            [("gpu", gpu.utilization_gpu_percent), ("memory", gpu.utilization_memory_percent)]
        {
            if let Some(percent) = percent {
                samples.push(
                    sample(&metrics::GPU_UTILIZATION, f64::from(percent) / 100.0)
                        .label("unit", unit),
                );
            }
        }
        if let Some(used) = gpu.memory_used_bytes {
            samples.push(sample(&metrics::GPU_MEMORY_USED, used as f64));
        }
        if let Some(total) = gpu.memory_total_bytes {
            samples.push(sample(&metrics::GPU_MEMORY_TOTAL, total as f64));
        }

        if let Some(reasons) = &gpu.clock_event_reasons {
            for reason in ClockEventReason::ALL {
                let active = if reasons.contains(&reason) { 1.0 } else { 0.0 };
                samples
                    .push(sample(&metrics::GPU_THROTTLE, active).label("reason", reason.as_str()));
            }
            let streak = &mut self.history.slowdowns;
            findings.push(throttle_finding(gpu, reasons, streak, cfg.throttle_sustained_runs, now));
        } else {
            self.history.slowdowns.remove(&gpu.index);
        }

        if let (Some(width), Some(max)) = (gpu.pcie_link_width, gpu.pcie_link_width_max) {
            findings.push(if width < max {
                finding(
                    "pcie_link",
                    Status::Fail,
                    RecommendedAction::Reboot,
                    format!("PCIe link trained at x{width} of x{max}: a fraction of its bandwidth"),
                )
                .with_value(f64::from(width))
            } else {
                ok("pcie_link", format!("PCIe link x{width} of x{max}"))
            });
        }

        if let Some(on) = gpu.persistence_mode {
            samples.push(sample(&metrics::GPU_PERSISTENCE_MODE, if on { 1.0 } else { 0.0 }));
            findings.push(if on {
                ok("persistence_mode", "persistence mode on".to_owned())
            } else {
                finding(
                    "persistence_mode",
                    Status::Warn,
                    RecommendedAction::None,
                    "persistence mode is off (slow job starts; the driver may unload between jobs)"
                        .to_owned(),
                )
            });
        }

        if let Some(ecc) = &gpu.ecc {
            for (kind, count) in [
                ("volatile_corrected", ecc.volatile_corrected),
                ("volatile_uncorrected", ecc.volatile_uncorrected),
                ("aggregate_corrected", ecc.aggregate_corrected),
                ("aggregate_uncorrected", ecc.aggregate_uncorrected),
            ] {
                if let Some(count) = count {
                    samples
                        .push(sample(&metrics::GPU_ECC_ERRORS, count as f64).label("kind", kind));
                }
            }
            if let Some(dbe) = ecc.volatile_uncorrected {
                let lifetime = ecc
                    .aggregate_uncorrected
                    .map(|n| format!(" ({n} in the GPU's life)"))
                    .unwrap_or_default();
                findings.push(
                    if dbe > 0 {
                        finding(
                            "ecc_uncorrected",
                            Status::Fail,
                            RecommendedAction::ResetGpu,
                            format!(
                                "{dbe} uncorrectable (double-bit) ECC error(s) since the driver loaded{lifetime}"
                            ),
                        )
                    } else {
                        ok("ecc_uncorrected", format!("no uncorrectable ECC errors{lifetime}"))
                    }
                    .with_value(dbe as f64),
                );
            }
        }

        if let Some(pages) = &gpu.retired_pages {
            samples.push(
                sample(&metrics::GPU_RETIRED_PAGES, pages.single_bit as f64)
                    .label("cause", "single_bit"),
            );
            samples.push(
                sample(&metrics::GPU_RETIRED_PAGES, pages.double_bit as f64)
                    .label("cause", "double_bit"),
            );
            samples.push(sample(
                &metrics::GPU_RETIRED_PAGES_PENDING,
                if pages.pending { 1.0 } else { 0.0 },
            ));
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
                reasons.push((
                    RecommendedAction::Reboot,
                    "a page retirement waits for a reboot".to_owned(),
                ));
            }
            findings.push(
                match worst(&reasons) {
                    Some((action, text)) => finding("retired_pages", Status::Fail, action, text),
                    None => ok(
                        "retired_pages",
                        format!(
                            "{total} retired pages ({} double-bit), none pending",
                            pages.double_bit
                        ),
                    ),
                }
                .with_value(total as f64),
            );
        }

        if let Some(rows) = &gpu.remapped_rows {
            samples.push(
                sample(&metrics::GPU_REMAPPED_ROWS, rows.correctable as f64)
                    .label("kind", "correctable"),
            );
            samples.push(
                sample(&metrics::GPU_REMAPPED_ROWS, rows.uncorrectable as f64)
                    .label("kind", "uncorrectable"),
            );
            samples.push(sample(
                &metrics::GPU_REMAPPED_ROWS_PENDING,
                if rows.pending { 1.0 } else { 0.0 },
            ));
            samples.push(sample(
                &metrics::GPU_REMAPPED_ROWS_FAILURE,
                if rows.failure { 1.0 } else { 0.0 },
            ));
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
                reasons.push((
                    RecommendedAction::ResetGpu,
                    "a row remap waits for a GPU reset".to_owned(),
                ));
            }
            findings.push(
                match worst(&reasons) {
                    Some((action, text)) => finding("row_remap", Status::Fail, action, text),
                    None => ok(
                        "row_remap",
                        format!(
                            "{} correctable and {} uncorrectable rows remapped, none pending",
                            rows.correctable, rows.uncorrectable
                        ),
                    ),
                }
                .with_value(rows.uncorrectable as f64),
            );
        }

        if let Some(code) = gpu.recovery_action {
            samples.push(sample(&metrics::GPU_RECOVERY_ACTION, f64::from(code)));
            findings.push(
                match xid::recovery_action(code) {
                    Some((Status::Ok, _, _)) => {
                        ok("recovery_action", "the driver asks for no recovery".to_owned())
                    }
                    Some((status, action, what)) => finding(
                        "recovery_action",
                        status,
                        action,
                        format!("the driver asks for recovery: {what}"),
                    ),
                    None => finding(
                        "recovery_action",
                        Status::Warn,
                        RecommendedAction::None,
                        format!("the driver reports recovery action {code}, unknown to this agent"),
                    ),
                }
                .with_value(f64::from(code)),
            );
        }

        // Rates against the previous run's counters.
        let previous = self.history.counters.get(&gpu.index).cloned().unwrap_or_default();
        let mut current = Counters { at: Some(now), ..Counters::default() };

        if let Some(replays) = gpu.pcie_replays {
            samples.push(sample(&metrics::GPU_PCIE_REPLAYS, replays as f64));
            current.pcie_replays = Some(replays);
            let limit = cfg.pcie_replays_warn_per_minute.unwrap_or_else(|| {
                pcie_replay_warn_per_minute(gpu.pcie_link_gen, gpu.pcie_link_width)
            });
            let rate = rate_per_second(previous.at.zip(previous.pcie_replays), now, replays)
                .map(|per_second| per_second * 60.0);
            let f = match rate {
                Some(rate) if rate > limit => finding(
                    "pcie_replays",
                    Status::Warn,
                    RecommendedAction::None,
                    format!("{rate:.1} PCIe replays per minute (warns above {limit:.2})"),
                ),
                Some(rate) => ok(
                    "pcie_replays",
                    format!("{rate:.1} PCIe replays per minute (warns above {limit:.2})"),
                ),
                None => {
                    ok("pcie_replays", format!("{replays} PCIe replays; rate from the next run"))
                }
            };
            findings.push(match rate {
                Some(rate) => f.with_value(rate),
                None => f,
            });
        }

        self.nvlink_findings(gpu, now, &previous, &mut current, out);

        self.history.counters.insert(gpu.index, current);
    }

    /// `nvlink_down` and `nvlink_errors` of one GPU, with the NVLink metrics; the CRC counters go
    /// into `current` for the next run's rates.
    fn nvlink_findings(
        &mut self,
        gpu: &GpuState,
        now: SystemTime,
        previous: &Counters,
        current: &mut Counters,
        out: &mut Observation,
    ) {
        let sample = |desc: &'static metrics::MetricDesc, value: f64| gpu_sample(gpu, desc, value);
        let cfg = &self.config;
        let findings = &mut out.findings;
        let samples = &mut out.samples;
        if gpu.nvlinks.is_empty() {
            // A GPU that answers but lists no link has none up; one that does not answer is
            // `gpu_access`'s to report.
            if let Some(expected) = cfg.expected_nvlinks
                && gpu.condition.is_responding()
            {
                findings.push(nvlink_down_finding(gpu, &[], Some(expected)));
            }
            return;
        }
        let mut down = Vec::new();
        let mut fast_crc: Vec<(u32, f64)> = Vec::new();
        let mut recovering = Vec::new();
        let mut worst_crc_rate: Option<f64> = None;
        for link in &gpu.nvlinks {
            let label = link.link.to_string();
            samples.push(
                sample(&metrics::GPU_NVLINK_UP, if link.active { 1.0 } else { 0.0 })
                    .label("link", label.clone()),
            );
            for (kind, count) in [
                ("crc_flit", link.crc_flit),
                ("crc_data", link.crc_data),
                ("replay", link.replay),
                ("recovery", link.recovery),
            ] {
                if let Some(count) = count {
                    samples.push(
                        sample(&metrics::GPU_NVLINK_ERRORS, count as f64)
                            .label("link", label.clone())
                            .label("kind", kind),
                    );
                }
            }
            if !link.active {
                down.push(link.link);
            }
            if link.crc_flit.is_some() || link.crc_data.is_some() {
                let crc = link.crc_flit.unwrap_or(0).saturating_add(link.crc_data.unwrap_or(0));
                current.nvlink_crc.insert(link.link, crc);
                let before = previous.nvlink_crc.get(&link.link).copied();
                if let Some(rate) = rate_per_second(previous.at.zip(before), now, crc) {
                    worst_crc_rate = Some(worst_crc_rate.map_or(rate, |w: f64| w.max(rate)));
                    if rate > cfg.nvlink_crc_errors_warn_per_second {
                        fast_crc.push((link.link, rate));
                    }
                }
            }
            if let Some(recoveries) = link.recovery {
                let rise =
                    self.history.nvlink_recoveries.entry((gpu.index, link.link)).or_default();
                rise.observe(recoveries, now);
                if rise.active(now, cfg.nvlink_error_window) {
                    recovering.push(link.link);
                }
            }
        }
        findings.push(nvlink_down_finding(gpu, &down, cfg.expected_nvlinks));
        let mut problems = Vec::new();
        if !fast_crc.is_empty() {
            let links: Vec<String> =
                fast_crc.iter().map(|(link, rate)| format!("{link} ({rate:.0}/s)")).collect();
            problems.push(format!(
                "CRC errors above {}/s on link(s) {}",
                cfg.nvlink_crc_errors_warn_per_second,
                links.join(", ")
            ));
        }
        if !recovering.is_empty() {
            problems.push(format!(
                "link recovery within the last {} on link(s) {}",
                human(cfg.nvlink_error_window),
                join_links(&recovering)
            ));
        }
        let mut bad_links: Vec<u32> =
            fast_crc.iter().map(|(link, _)| *link).chain(recovering.iter().copied()).collect();
        bad_links.sort_unstable();
        bad_links.dedup();
        let f = if problems.is_empty() {
            let message = "no NVLink CRC bursts or recent recoveries".to_owned();
            gpu_finding(gpu, "nvlink_errors", Status::Ok, RecommendedAction::None, message)
        } else {
            let message = problems.join("; ");
            gpu_finding(gpu, "nvlink_errors", Status::Warn, RecommendedAction::None, message)
                .with_label("links", join_links(&bad_links))
        };
        findings.push(match worst_crc_rate {
            Some(rate) => f.with_value(rate),
            None => f,
        });
    }

    /// Takes the Xid counts of `gpus` and reports every (GPU, code) ever seen: failing (or as the
    /// catalog says) within `xid_window` of the last rise, ok after. A GPU in `gpus` with no Xid
    /// gets one ok `xid` finding.
    fn xid_findings(&mut self, gpus: &[GpuState], now: SystemTime, out: &mut Observation) {
        for gpu in gpus {
            for (&code, &count) in &gpu.xid_counts {
                self.history.xids.entry((gpu.index, code)).or_default().observe(count, now);
            }
        }
        let window = self.config.xid_window;
        for gpu in gpus {
            if !self.history.xids.keys().any(|(index, _)| *index == gpu.index) {
                let mut finding = Finding::ok(NAME, "xid", gpu.index.to_string());
                finding.message = "no Xid events".to_owned();
                if let Some(pci) = self.history.pci.get(&gpu.index) {
                    finding = finding.with_label("pci", pci.clone());
                }
                out.findings.push(finding);
            }
        }
        for (&(index, code), rise) in &self.history.xids {
            out.samples.push(
                Sample::new(&metrics::GPU_XID_ERRORS, rise.count as f64)
                    .label("gpu", index.to_string())
                    .label("xid", code.to_string()),
            );
            let advice = xid::advice(code);
            let (status, action, source) = match self.xid_actions.get(&code) {
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
            if let Some(pci) = self.history.pci.get(&index) {
                finding = finding.with_label("pci", pci.clone());
            }
            out.findings.push(finding);
        }
    }
}

impl Check for GpuCheck {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&mut self, ctx: &RunContext<'_>) -> Observation {
        let Some(backend) = self.backend.as_mut() else {
            return Observation::default();
        };
        let reading = backend.snapshot();
        let procfs = ctx.paths.procfs.clone();
        self.evaluate(reading, ctx.now, || read_uptime(&procfs))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;
    use crate::gpu::{EccCounts, NvLinkState, RemappedRows, RetiredPages};

    const T0: Duration = Duration::from_secs(1_800_000_000);

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(seconds)
    }

    fn check(config: GpuConfig) -> GpuCheck {
        GpuCheck::with_backend(&config, None)
    }

    fn gpu(index: u32) -> GpuState {
        GpuState {
            index,
            pci_bus_id: Some(format!("00000000:{:02x}:00.0", 0x18 + index)),
            ..GpuState::default()
        }
    }

    fn snapshot(gpus: Vec<GpuState>) -> Result<GpuSnapshot, GpuBackendError> {
        Ok(GpuSnapshot { driver_version: Some("570.124.06".into()), gpus })
    }

    fn find<'a>(out: &'a Observation, id: &str, subject: &str) -> &'a Finding {
        out.findings
            .iter()
            .find(|f| f.finding == id && f.subject == subject)
            .unwrap_or_else(|| panic!("no {id} finding for {subject:?} in {:#?}", out.findings))
    }

    fn config_from(toml: &str) -> GpuConfig {
        AgentConfig::parse(toml).unwrap().checks.gpu
    }

    fn problems_of(config: &GpuConfig) -> Vec<String> {
        let mut problems = ConfigProblems::default();
        config.validate("checks.gpu", &mut problems);
        problems.0.into_iter().map(|p| p.field).collect()
    }

    #[test]
    fn defaults_are_valid_and_follow_the_catalog() {
        let config = GpuConfig::default();
        assert!(problems_of(&config).is_empty());
        assert_eq!(config.backend, GpuBackendSpec::Nvml { library: None });
        assert_eq!(config.count_debounce, 3);
        assert_eq!(config.boot_grace, Duration::from_secs(600));
        assert_eq!(config.temperature_warn_celsius, 93);
        assert_eq!(config.retired_pages_fail, 63);
        assert_eq!(config.retired_pages_double_bit_fail, 15);
        assert_eq!(config.remapped_rows_uncorrectable_fail, 512);
    }

    #[test]
    fn config_parses_backend_actions_and_durations() {
        let config = config_from(
            "[checks.gpu]\nbackend = \"fixture:/x/gpu.json\"\nexpected_count = 8\nboot_grace = \"5m\"\n\
             [checks.gpu.xid_actions]\n13 = \"none\"\n79 = \"replace\"\n",
        );
        assert_eq!(config.backend, GpuBackendSpec::Fixture("/x/gpu.json".into()));
        assert_eq!(config.expected_count, Some(8));
        assert_eq!(config.boot_grace, Duration::from_secs(300));
        let actions = config.parsed_xid_actions();
        assert_eq!(actions[&13], RecommendedAction::None);
        assert_eq!(actions[&79], RecommendedAction::Replace);
        assert!(problems_of(&config).is_empty());
    }

    #[test]
    fn config_refuses_bad_backends_and_actions_at_parse() {
        let err = AgentConfig::parse("[checks.gpu]\nbackend = \"dcgm\"\n").unwrap_err();
        assert!(err.contains("expected nvml"), "{err}");
        let err = AgentConfig::parse("[checks.gpu.xid_actions]\n79 = \"rebot\"\n").unwrap_err();
        assert!(err.contains("rebot"), "{err}");
    }

    #[test]
    fn validate_names_every_bad_field() {
        let config = config_from(
            "[checks.gpu]\nexpected_count = 0\ncount_debounce = 0\ntemperature_warn_celsius = 0\n\
             xid_window = \"0s\"\nnvlink_crc_errors_warn_per_second = -1.0\npcie_replays_warn_per_minute = 0.0\n\
             expected_nvlinks = 0\nthrottle_sustained_runs = 0\n\
             [checks.gpu.xid_actions]\nseventy-nine = \"reboot\"\n",
        );
        let fields = problems_of(&config);
        for field in [
            "checks.gpu.expected_count",
            "checks.gpu.count_debounce",
            "checks.gpu.temperature_warn_celsius",
            "checks.gpu.xid_window",
            "checks.gpu.nvlink_crc_errors_warn_per_second",
            "checks.gpu.pcie_replays_warn_per_minute",
            "checks.gpu.xid_actions.seventy-nine",
            "checks.gpu.expected_nvlinks",
            "checks.gpu.throttle_sustained_runs",
        ] {
            assert!(fields.iter().any(|f| f == field), "{field} missing from {fields:?}");
        }
    }

    #[test]
    fn rise_tracks_new_occurrences_and_resets() {
        let mut rise = Rise::default();
        rise.observe(0, at(0));
        assert!(!rise.active(at(0), Duration::from_secs(60)));
        rise.observe(2, at(10));
        assert!(rise.active(at(69), Duration::from_secs(60)));
        assert!(!rise.active(at(70), Duration::from_secs(60)));
        rise.observe(2, at(100));
        assert_eq!(rise.last_rise, Some(at(10)), "same count is not a new occurrence");
        rise.observe(1, at(110));
        assert_eq!(rise.last_rise, Some(at(10)), "a reset keeps the last rise");
        rise.observe(2, at(120));
        assert_eq!(rise.last_rise, Some(at(120)));
        assert!(rise.active(at(100), Duration::from_secs(1)), "clock went back: just now");
    }

    #[test]
    fn rates_need_an_earlier_reading_and_time() {
        assert_eq!(rate_per_second(None, at(10), 5), None);
        assert_eq!(rate_per_second(Some((at(0), 5)), at(0), 9), None);
        assert_eq!(rate_per_second(Some((at(0), 9)), at(10), 5), None, "counter reset");
        assert_eq!(rate_per_second(Some((at(0), 5)), at(10), 105), Some(10.0));
    }

    #[test]
    fn pcie_replay_limits_follow_generation_and_width() {
        assert!((pcie_replay_warn_per_minute(Some(5), Some(16)) - 30.72).abs() < 1e-9);
        assert!((pcie_replay_warn_per_minute(Some(4), Some(16)) - 15.36).abs() < 1e-9);
        assert!((pcie_replay_warn_per_minute(Some(3), Some(8)) - 3.84).abs() < 1e-9);
        assert!((pcie_replay_warn_per_minute(None, None) - 30.72).abs() < 1e-9);
    }

    #[test]
    fn short_count_warns_then_fails_after_debounce_and_grace() {
        let mut check = check(GpuConfig { expected_count: Some(8), ..GpuConfig::default() });
        let seven = || (0..7).map(gpu).collect::<Vec<_>>();
        let up = |s| move || Some(Duration::from_secs(s));
        // Early after boot: never fails, however many runs.
        for run in 0..5 {
            let out = check.evaluate(snapshot(seven()), at(run), up(60));
            assert_eq!(find(&out, "gpu_count", "").status, Status::Warn);
        }
        check.history.short_count_runs = 0;
        for run in 1..=3 {
            let out = check.evaluate(snapshot(seven()), at(run), up(3600));
            let count = find(&out, "gpu_count", "");
            if run < 3 {
                assert_eq!((count.status, count.action), (Status::Warn, RecommendedAction::None));
            } else {
                assert_eq!((count.status, count.action), (Status::Fail, RecommendedAction::Reboot));
            }
        }
        // The GPU comes back: ok, and the debounce starts over.
        let out = check.evaluate(snapshot((0..8).map(gpu).collect()), at(10), up(3600));
        assert_eq!(find(&out, "gpu_count", "").status, Status::Ok);
        let out = check.evaluate(snapshot(seven()), at(11), up(3600));
        assert_eq!(find(&out, "gpu_count", "").status, Status::Warn);
    }

    #[test]
    fn unknown_uptime_relies_on_the_debounce() {
        let mut check =
            check(GpuConfig { expected_count: Some(2), count_debounce: 1, ..GpuConfig::default() });
        let out = check.evaluate(snapshot(vec![gpu(0)]), at(0), || None);
        let count = find(&out, "gpu_count", "");
        assert_eq!(count.status, Status::Fail);
        assert!(count.message.contains("uptime unknown"), "{}", count.message);
    }

    #[test]
    fn xid_findings_hold_for_the_window_then_clear() {
        let mut check = check(GpuConfig::default());
        let mut g = gpu(3);
        g.xid_counts.insert(79, 1);
        let out = check.evaluate(snapshot(vec![g.clone()]), at(0), || None);
        let xid = find(&out, "xid", "3");
        assert_eq!((xid.status, xid.action), (Status::Fail, RecommendedAction::Reboot));
        assert_eq!(xid.labels["xid"], "79");
        assert_eq!(xid.labels["pci"], "00000000:1b:00.0");
        assert_eq!(xid.value, Some(79.0));
        // Same count later: still within the window.
        let out = check.evaluate(snapshot(vec![g.clone()]), at(3599), || None);
        assert_eq!(find(&out, "xid", "3").status, Status::Fail);
        let out = check.evaluate(snapshot(vec![g.clone()]), at(3600), || None);
        let xid = find(&out, "xid", "3");
        assert_eq!((xid.status, xid.labels["xid"].as_str()), (Status::Ok, "79"));
        // A new occurrence opens the window again.
        g.xid_counts.insert(79, 2);
        let out = check.evaluate(snapshot(vec![g]), at(4000), || None);
        assert_eq!(find(&out, "xid", "3").status, Status::Fail);
        let xid_metric =
            out.samples.iter().find(|s| s.desc.name == metrics::GPU_XID_ERRORS.name).unwrap();
        assert_eq!(xid_metric.value, 2.0);
    }

    #[test]
    fn xid_findings_outlive_a_backend_failure() {
        let mut check = check(GpuConfig::default());
        let mut g = gpu(1);
        g.xid_counts.insert(48, 1);
        check.evaluate(snapshot(vec![g]), at(0), || None);
        let out = check.evaluate(
            Err(GpuBackendError::NvmlUnavailable { reason: "gone".into() }),
            at(10),
            || None,
        );
        assert_eq!(find(&out, "gpu_backend", "").status, Status::Unknown);
        let xid = find(&out, "xid", "1");
        assert_eq!((xid.status, xid.action), (Status::Fail, RecommendedAction::ResetGpu));
    }

    #[test]
    fn xid_actions_override_the_catalog() {
        let mut check =
            check(config_from("[checks.gpu.xid_actions]\n79 = \"replace\"\n13 = \"none\"\n"));
        let mut g = gpu(0);
        g.xid_counts.insert(79, 1);
        g.xid_counts.insert(13, 4);
        let out = check.evaluate(snapshot(vec![g]), at(0), || None);
        let by_code = |code: &str| {
            out.findings
                .iter()
                .find(|f| {
                    f.finding == "xid" && f.labels.get("xid").map(String::as_str) == Some(code)
                })
                .unwrap()
        };
        assert_eq!(
            (by_code("79").status, by_code("79").action),
            (Status::Fail, RecommendedAction::Replace)
        );
        assert_eq!(
            (by_code("13").status, by_code("13").action),
            (Status::Ok, RecommendedAction::None)
        );
    }

    #[test]
    fn a_gpu_without_xids_has_one_ok_xid_finding() {
        let mut check = check(GpuConfig::default());
        let out = check.evaluate(snapshot(vec![gpu(0), gpu(1)]), at(0), || None);
        for subject in ["0", "1"] {
            assert_eq!(find(&out, "xid", subject).status, Status::Ok);
        }
    }

    #[test]
    fn memory_thresholds() {
        let mut check = check(GpuConfig::default());
        let mut g = gpu(0);
        g.ecc = Some(EccCounts {
            volatile_uncorrected: Some(1),
            aggregate_uncorrected: Some(3),
            ..EccCounts::default()
        });
        g.retired_pages = Some(RetiredPages { single_bit: 50, double_bit: 13, pending: false });
        g.remapped_rows = Some(RemappedRows {
            correctable: 0,
            uncorrectable: 512,
            pending: true,
            failure: false,
        });
        let out = check.evaluate(snapshot(vec![g.clone()]), at(0), || None);
        let ecc = find(&out, "ecc_uncorrected", "0");
        assert_eq!((ecc.status, ecc.action), (Status::Fail, RecommendedAction::ResetGpu));
        let pages = find(&out, "retired_pages", "0");
        assert_eq!((pages.status, pages.action), (Status::Fail, RecommendedAction::Replace));
        let rows = find(&out, "row_remap", "0");
        assert_eq!((rows.status, rows.action), (Status::Fail, RecommendedAction::Replace));
        assert!(rows.message.contains("waits for a GPU reset"), "{}", rows.message);

        g.retired_pages = Some(RetiredPages { single_bit: 3, double_bit: 1, pending: true });
        g.remapped_rows =
            Some(RemappedRows { correctable: 2, uncorrectable: 1, pending: true, failure: false });
        let out = check.evaluate(snapshot(vec![g.clone()]), at(1), || None);
        let pages = find(&out, "retired_pages", "0");
        assert_eq!((pages.status, pages.action), (Status::Fail, RecommendedAction::Reboot));
        let rows = find(&out, "row_remap", "0");
        assert_eq!((rows.status, rows.action), (Status::Fail, RecommendedAction::ResetGpu));

        g.retired_pages = Some(RetiredPages { single_bit: 0, double_bit: 15, pending: false });
        g.remapped_rows = Some(RemappedRows::default());
        let out = check.evaluate(snapshot(vec![g]), at(2), || None);
        assert_eq!(find(&out, "retired_pages", "0").action, RecommendedAction::Replace);
        assert_eq!(find(&out, "row_remap", "0").status, Status::Ok);
    }

    #[test]
    fn pcie_replay_rate_warns_from_the_second_run() {
        let mut check = check(GpuConfig::default());
        let mut g = gpu(0);
        g.pcie_link_gen = Some(5);
        g.pcie_link_width = Some(16);
        g.pcie_replays = Some(100);
        let out = check.evaluate(snapshot(vec![g.clone()]), at(0), || None);
        assert_eq!(find(&out, "pcie_replays", "0").status, Status::Ok);
        // 10 replays in 60 s: under 30.72 per minute.
        g.pcie_replays = Some(110);
        let out = check.evaluate(snapshot(vec![g.clone()]), at(60), || None);
        assert_eq!(find(&out, "pcie_replays", "0").status, Status::Ok);
        // 40 in 60 s: over.
        g.pcie_replays = Some(150);
        let out = check.evaluate(snapshot(vec![g.clone()]), at(120), || None);
        let replays = find(&out, "pcie_replays", "0");
        assert_eq!(replays.status, Status::Warn);
        assert_eq!(replays.value, Some(40.0));
    }

    #[test]
    fn nvlink_crc_rate_and_recoveries_warn() {
        let mut check = check(GpuConfig::default());
        let link = |crc: u64, recovery: u64| NvLinkState {
            link: 4,
            active: true,
            crc_flit: Some(crc),
            crc_data: Some(0),
            replay: Some(0),
            recovery: Some(recovery),
        };
        let mut g = gpu(0);
        g.nvlinks = vec![link(0, 0)];
        let out = check.evaluate(snapshot(vec![g.clone()]), at(0), || None);
        assert_eq!(find(&out, "nvlink_errors", "0").status, Status::Ok);
        g.nvlinks = vec![link(5000, 0)];
        let out = check.evaluate(snapshot(vec![g.clone()]), at(10), || None);
        let errors = find(&out, "nvlink_errors", "0");
        assert_eq!(errors.status, Status::Warn);
        assert_eq!(errors.labels["links"], "4");
        g.nvlinks = vec![link(5000, 1)];
        let out = check.evaluate(snapshot(vec![g.clone()]), at(20), || None);
        let errors = find(&out, "nvlink_errors", "0");
        assert_eq!(errors.status, Status::Warn);
        assert!(errors.message.contains("recovery"), "{}", errors.message);
        let out = check.evaluate(snapshot(vec![g]), at(20 + 3600), || None);
        assert_eq!(find(&out, "nvlink_errors", "0").status, Status::Ok);
    }

    #[test]
    fn version_mismatch_fails_and_other_backend_errors_are_unknown() {
        let mut check = check(GpuConfig::default());
        let out = check.evaluate(Err(GpuBackendError::NvmlVersionMismatch), at(0), || None);
        let backend = find(&out, "gpu_backend", "");
        assert_eq!((backend.status, backend.action), (Status::Fail, RecommendedAction::Reboot));
        assert!(backend.message.starts_with("NVML unavailable"));
        let out = check.evaluate(
            Err(GpuBackendError::FixtureParse { path: "/x".into(), message: "bad".into() }),
            at(0),
            || None,
        );
        assert_eq!(out.findings.len(), 1);
        assert_eq!(out.findings[0].status, Status::Unknown);
    }

    #[test]
    fn uptime_parses_procfs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("uptime"), "3600.52 12000.00\n").unwrap();
        assert_eq!(read_uptime(dir.path()).map(|d| d.as_secs()), Some(3600));
        std::fs::write(dir.path().join("uptime"), "garbage").unwrap();
        assert_eq!(read_uptime(dir.path()), None);
        assert_eq!(read_uptime(&dir.path().join("missing")), None);
    }
}
