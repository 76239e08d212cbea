//! The gpu check: per-GPU health from a GPU backend (NVML or a JSON fixture), the GPU count
//! against the expected one, and Xid events.
//!
//! The backend ([`crate::gpu`]) returns a [`GpuSnapshot`]; this file turns it into findings and
//! metrics. What needs history lives here: counter rates (PCIe replays, NVLink CRC errors) from
//! the previous run's counters, how long an Xid or an NVLink recovery keeps its finding after the
//! last time its count rose, and how many runs in a row the GPU count was short or a GPU was
//! slowed down by its hardware.
//!
//! Each kind of evidence has its own file: [`telemetry`] (temperature, load, persistence mode),
//! [`throttle`], [`pcie`], [`memory`] (ECC, retired pages, row remap), [`nvlink`] and [`xids`]
//! (Xid events and the driver's recovery action); the settings are in [`config`].
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

mod config;
mod memory;
mod nvlink;
mod pcie;
mod telemetry;
mod throttle;
mod xids;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};

pub use self::config::GpuConfig;
pub use self::pcie::pcie_replay_warn_per_minute;
use self::throttle::Streak;
use self::xids::Xids;
use super::{BuildContext, Check, Mode, Observation, RunContext};
use crate::gpu::{GpuBackend, GpuBackendError, GpuCondition, GpuSnapshot, GpuState, open_backend};
use crate::metrics::{self, Sample};

pub const NAME: &str = "gpu";

/// Reads the node's GPUs through a backend and judges what it read.
#[derive(Debug)]
pub struct GpuCheck {
    /// `None` for the `none` backend.
    backend: Option<Box<dyn GpuBackend>>,
    config: GpuConfig,
    xids: Xids,
    history: History,
}

/// What the check remembers between runs (the Xids keep their own).
#[derive(Debug, Default)]
struct History {
    /// Runs in a row on which fewer GPUs than expected were seen.
    short_count_runs: u32,
    /// NVLink recovery counts by (GPU, link).
    nvlink_recoveries: BTreeMap<(u32, u32), Rise>,
    /// The previous run's counters, by GPU, for rates.
    counters: BTreeMap<u32, Counters>,
    /// The hardware slowdown each GPU is in: runs in a row and since when.
    slowdowns: BTreeMap<u32, Streak>,
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

/// A sample of `desc` about `gpu` (labelled with its index).
fn gpu_sample(gpu: &GpuState, desc: &'static metrics::MetricDesc, value: f64) -> Sample {
    Sample::new(desc, value).label("gpu", gpu.index.to_string())
}

/// A finding about `gpu`, with its `pci` label where known.
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
            xids: Xids::new(config),
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
                self.xids.findings(&[], now, &mut out);
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
            self.xids.note_pci(gpu);
            self.gpu_findings(gpu, now, &mut out);
        }
        self.history.counters.retain(|index, _| snapshot.gpus.iter().any(|g| g.index == *index));
        self.history.slowdowns.retain(|index, _| snapshot.gpus.iter().any(|g| g.index == *index));
        self.xids.findings(&snapshot.gpus, now, &mut out);
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

    /// Judges one GPU, one kind of evidence after the other (findings and samples come in this
    /// order); the counters it read are kept for the next run's rates.
    fn gpu_findings(&mut self, gpu: &GpuState, now: SystemTime, out: &mut Observation) {
        let cfg = &self.config;
        out.samples.push(info_sample(gpu));
        out.findings.push(access_finding(gpu));
        telemetry::observe_load(gpu, cfg.temperature_warn_celsius, out);
        let slowdowns = &mut self.history.slowdowns;
        throttle::observe(gpu, slowdowns, cfg.throttle_sustained_runs, now, out);
        out.findings.extend(pcie::link_finding(gpu));
        telemetry::observe_persistence_mode(gpu, out);
        memory::observe(gpu, cfg, out);
        xids::observe_recovery_action(gpu, out);

        // Rates against the previous run's counters.
        let previous = self.history.counters.get(&gpu.index).cloned().unwrap_or_default();
        let mut current = Counters { at: Some(now), ..Counters::default() };
        pcie::observe_replays(gpu, cfg, &previous, &mut current, now, out);
        let recoveries = &mut self.history.nvlink_recoveries;
        nvlink::observe(gpu, cfg, recoveries, &previous, &mut current, now, out);
        self.history.counters.insert(gpu.index, current);
    }
}

/// `gpu_info`: the GPU's PCI bus id, name and UUID as labels.
fn info_sample(gpu: &GpuState) -> Sample {
    gpu_sample(gpu, &metrics::GPU_INFO, 1.0)
        .label("pci_bus_id", gpu.pci_bus_id.clone().unwrap_or_default())
        .label("name", gpu.name.clone().unwrap_or_default())
        .label("uuid", gpu.uuid.clone().unwrap_or_default())
}

/// `gpu_access`: whether the GPU answered. Lost (fallen off the bus) needs a reboot, a GPU that
/// asks for a reset a GPU reset.
fn access_finding(gpu: &GpuState) -> Finding {
    let index = gpu.index;
    let detail = gpu.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
    let (status, action, message) = match gpu.condition {
        GpuCondition::Responding => (Status::Ok, RecommendedAction::None, "GPU answers".to_owned()),
        GpuCondition::Lost => (
            Status::Fail,
            RecommendedAction::Reboot,
            format!("GPU {index} is lost (fallen off the bus){detail}"),
        ),
        GpuCondition::ResetRequired => (
            Status::Fail,
            RecommendedAction::ResetGpu,
            format!("GPU {index} needs a reset{detail}"),
        ),
        GpuCondition::Unreadable => (
            Status::Unknown,
            RecommendedAction::None,
            format!("GPU {index} could not be read{detail}"),
        ),
    };
    gpu_finding(gpu, "gpu_access", status, action, message)
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
mod tests;
