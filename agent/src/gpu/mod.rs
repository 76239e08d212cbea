//! GPU backends: what the gpu check reads, as one serialisable [`GpuSnapshot`].
//!
//! Two backends produce the same snapshot: [`nvml::NvmlBackend`] reads the NVIDIA driver through
//! NVML, and [`fixture::FixtureBackend`] reads a JSON file (tests, simulated nodes, and snapshots
//! saved on real machines with [`dump_snapshot`]). The check never talks to NVML itself, so every
//! rule it applies can be tested on a machine without a GPU.
//!
//! Which backend runs is named by a [`GpuBackendSpec`], written `nvml`, `nvml:LIBRARY`,
//! `fixture:PATH` or `none` in `[checks.gpu] backend` and in `fleetmend agent --gpu`.

pub mod fixture;
pub mod nvml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::checks::EventSignal;

/// Which GPU backend the gpu check reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum GpuBackendSpec {
    /// The NVIDIA driver through NVML. `library` names the NVML shared library; by default
    /// `libnvidia-ml.so.1` is found by the dynamic loader.
    Nvml { library: Option<PathBuf> },
    /// A JSON [`GpuSnapshot`] in a file, read again on every run.
    Fixture(PathBuf),
    /// No backend: the check is present but looks at nothing and reports nothing.
    None,
}

impl Default for GpuBackendSpec {
    fn default() -> Self {
        GpuBackendSpec::Nvml { library: None }
    }
}

/// Parses a backend as written in config and on the command line: `nvml`, `nvml:LIBRARY`,
/// `fixture:PATH` or `none`.
pub fn parse_backend(text: &str) -> Result<GpuBackendSpec, String> {
    let non_empty = |kind: &str, rest: &str| -> Result<PathBuf, String> {
        if rest.is_empty() {
            Err(format!("{kind}: needs a path after the colon (e.g. {kind}:/path)"))
        } else {
            Ok(PathBuf::from(rest))
        }
    };
    match text {
        "nvml" => Ok(GpuBackendSpec::Nvml { library: None }),
        "none" => Ok(GpuBackendSpec::None),
        _ => {
            if let Some(rest) = text.strip_prefix("fixture:") {
                non_empty("fixture", rest).map(GpuBackendSpec::Fixture)
            } else if let Some(rest) = text.strip_prefix("nvml:") {
                non_empty("nvml", rest)
                    .map(|library| GpuBackendSpec::Nvml { library: Some(library) })
            } else {
                Err(format!(
                    "unknown GPU backend {text:?} (expected nvml, nvml:LIBRARY, fixture:PATH or none)"
                ))
            }
        }
    }
}

impl FromStr for GpuBackendSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_backend(text)
    }
}

impl TryFrom<String> for GpuBackendSpec {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        parse_backend(&text)
    }
}

impl fmt::Display for GpuBackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuBackendSpec::Nvml { library: None } => f.write_str("nvml"),
            GpuBackendSpec::Nvml { library: Some(path) } => write!(f, "nvml:{}", path.display()),
            GpuBackendSpec::Fixture(path) => write!(f, "fixture:{}", path.display()),
            GpuBackendSpec::None => f.write_str("none"),
        }
    }
}

/// Everything the gpu check knows about the node's GPUs at one moment.
///
/// Fields a GPU or driver may not support are `Option`s: absent means "not reported", never zero.
/// Fixture files are this type as JSON; unknown fields are refused so a misspelt field in a fixture
/// fails loudly instead of reading as "not reported".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSnapshot {
    /// The driver version, e.g. `570.124.06`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Every GPU the backend enumerates, ones that did not answer included.
    #[serde(default)]
    pub gpus: Vec<GpuState>,
}

impl GpuSnapshot {
    /// Problems that make the snapshot unusable (a fixture written by hand can have them).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for gpu in &self.gpus {
            if !seen.insert(gpu.index) {
                problems.push(format!("GPU index {} appears more than once", gpu.index));
            }
            let mut links = std::collections::BTreeSet::new();
            for link in &gpu.nvlinks {
                if !links.insert(link.link) {
                    problems.push(format!(
                        "GPU {}: NVLink {} appears more than once",
                        gpu.index, link.link
                    ));
                }
            }
        }
        problems
    }
}

/// Whether a GPU answered the backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuCondition {
    /// The GPU answered (some queries may still be unsupported).
    #[default]
    Responding,
    /// The GPU has fallen off the bus or is otherwise inaccessible (NVML `GPU_IS_LOST`).
    Lost,
    /// The GPU needs a reset before it can be used again (NVML `RESET_REQUIRED`).
    ResetRequired,
    /// The GPU could not be read for another reason; `error` says which.
    Unreadable,
}

impl GpuCondition {
    pub fn is_responding(&self) -> bool {
        *self == GpuCondition::Responding
    }
}

/// One GPU as the backend saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuState {
    /// NVML index (the `gpu` label and the findings' subject).
    pub index: u32,
    /// Whether the GPU answered.
    #[serde(default, skip_serializing_if = "GpuCondition::is_responding")]
    pub condition: GpuCondition,
    /// Why the GPU could not be read, when `condition` is not `responding`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// PCI bus id, e.g. `00000000:18:00.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Core temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_celsius: Option<u32>,
    /// Power draw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<f64>,
    /// Current SM clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<u32>,
    /// Current memory clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_clock_mhz: Option<u32>,
    /// GPU utilization over the driver's last sample period, 0-100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_gpu_percent: Option<u32>,
    /// Memory-controller utilization over the driver's last sample period, 0-100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_memory_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
    /// Clock event (throttle) reasons active now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_event_reasons: Option<Vec<ClockEventReason>>,
    /// ECC error counters; absent when ECC is off or unsupported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc: Option<EccCounts>,
    /// Page retirement (pre-Ampere GPUs; row remapping replaced it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages: Option<RetiredPages>,
    /// Row remapping (Ampere and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows: Option<RemappedRows>,
    /// PCIe replay counter (cumulative since the driver loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_replays: Option<u64>,
    /// Current PCIe link generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_gen: Option<u32>,
    /// Current PCIe link width (lanes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_width: Option<u32>,
    /// The widest PCIe link the GPU and its slot can train to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_width_max: Option<u32>,
    /// NVLink links the GPU reports; empty on GPUs without NVLink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLinkState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_mode: Option<bool>,
    /// The driver's recovery action (NVML field `GPU_RECOVERY_ACTION`, r570+): 0 none, 1 GPU
    /// reset, 2 node reboot, 3 drain P2P, 4 drain and reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<u32>,
    /// Xid events seen on this GPU, by code, cumulative (they only grow, except when the backend
    /// restarts counting).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xid_counts: BTreeMap<u32, u64>,
}

/// A clock event (throttle) reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockEventReason {
    GpuIdle,
    ApplicationsClocksSetting,
    SwPowerCap,
    HwSlowdown,
    SyncBoost,
    SwThermalSlowdown,
    HwThermalSlowdown,
    HwPowerBrakeSlowdown,
    DisplayClockSetting,
}

impl ClockEventReason {
    /// Every reason, in metric order.
    pub const ALL: [ClockEventReason; 9] = [
        ClockEventReason::GpuIdle,
        ClockEventReason::ApplicationsClocksSetting,
        ClockEventReason::SwPowerCap,
        ClockEventReason::HwSlowdown,
        ClockEventReason::SyncBoost,
        ClockEventReason::SwThermalSlowdown,
        ClockEventReason::HwThermalSlowdown,
        ClockEventReason::HwPowerBrakeSlowdown,
        ClockEventReason::DisplayClockSetting,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ClockEventReason::GpuIdle => "gpu_idle",
            ClockEventReason::ApplicationsClocksSetting => "applications_clocks_setting",
            ClockEventReason::SwPowerCap => "sw_power_cap",
            ClockEventReason::HwSlowdown => "hw_slowdown",
            ClockEventReason::SyncBoost => "sync_boost",
            ClockEventReason::SwThermalSlowdown => "sw_thermal_slowdown",
            ClockEventReason::HwThermalSlowdown => "hw_thermal_slowdown",
            ClockEventReason::HwPowerBrakeSlowdown => "hw_power_brake_slowdown",
            ClockEventReason::DisplayClockSetting => "display_clock_setting",
        }
    }

    /// A slowdown that points at hardware (heat, power delivery) rather than at settings or load.
    pub fn is_slowdown(self) -> bool {
        matches!(
            self,
            ClockEventReason::HwSlowdown
                | ClockEventReason::SwThermalSlowdown
                | ClockEventReason::HwThermalSlowdown
                | ClockEventReason::HwPowerBrakeSlowdown
        )
    }
}

/// ECC error counters. Volatile counts restart at driver load or GPU reset; aggregate ones last
/// for the GPU's life.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EccCounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volatile_corrected: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volatile_uncorrected: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_corrected: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_uncorrected: Option<u64>,
}

/// Retired framebuffer pages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetiredPages {
    /// Pages retired for multiple single-bit errors.
    pub single_bit: u64,
    /// Pages retired for a double-bit error.
    pub double_bit: u64,
    /// A retirement waits for the next reset.
    pub pending: bool,
}

/// Remapped memory rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u64,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u64,
    /// A remap waits for the next reset.
    pub pending: bool,
    /// A remap failed: the GPU has no spare row left in that bank.
    pub failure: bool,
}

/// One NVLink link. Error counters are cumulative since the driver loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkState {
    pub link: u32,
    pub active: bool,
    /// Flow-control digit CRC errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_flit: Option<u64>,
    /// Data CRC errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_data: Option<u64>,
    /// Transmit replays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<u64>,
    /// Link recoveries (the link retrained after an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<u64>,
}

/// Reading a snapshot failed as a whole (one GPU failing is part of the snapshot instead).
#[derive(Debug, thiserror::Error)]
pub enum GpuBackendError {
    /// NVML could not be initialised: no library, no driver, no permission.
    #[error("NVML unavailable: {reason}")]
    NvmlUnavailable { reason: String },
    /// The NVML library and the loaded kernel driver differ in version: the driver was updated
    /// without a reboot. CUDA cannot start either, so this is a node fault, not a blind spot.
    #[error(
        "NVML unavailable: the NVML library and the loaded kernel driver differ in version (driver updated without a reboot?)"
    )]
    NvmlVersionMismatch,
    /// NVML initialised but a node-wide query failed.
    #[error("NVML query {operation} failed: {source}")]
    NvmlQuery { operation: &'static str, source: ::nvml_wrapper::error::NvmlError },
    #[error("reading GPU fixture {}: {source}", path.display())]
    FixtureRead { path: PathBuf, source: std::io::Error },
    #[error("parsing GPU fixture {}: {message}", path.display())]
    FixtureParse { path: PathBuf, message: String },
    /// The `none` backend has nothing to read.
    #[error("GPU backend is none: nothing to read")]
    Disabled,
    #[error("encoding GPU snapshot: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Something that reads the node's GPUs. Calls block (NVML is blocking FFI); the runner calls
/// the check on a worker thread under the check's timeout.
pub trait GpuBackend: Send + fmt::Debug {
    /// Reads every GPU now.
    fn snapshot(&mut self) -> Result<GpuSnapshot, GpuBackendError>;
}

/// Opens the backend `spec` names; `None` for the `none` backend. Opening never fails: NVML is
/// initialised on the first snapshot (and retried on later ones), a fixture is read on every one.
/// With `xid_events`, the NVML backend follows the driver's Xid events on its own thread and
/// raises the signal on each one (daemon mode); without, Xid counts stay empty.
pub fn open_backend(
    spec: &GpuBackendSpec,
    xid_events: Option<EventSignal>,
) -> Option<Box<dyn GpuBackend>> {
    match spec {
        GpuBackendSpec::Nvml { library } => {
            Some(Box::new(nvml::NvmlBackend::new(library.clone(), xid_events)))
        }
        GpuBackendSpec::Fixture(path) => Some(Box::new(fixture::FixtureBackend::new(path.clone()))),
        GpuBackendSpec::None => None,
    }
}

/// The current snapshot of `spec`'s backend as pretty JSON, in the fixture format: run it on a
/// real GPU machine to save what NVML reads as a fixture. Xid counts are empty (events are only
/// followed by a running agent).
pub fn dump_snapshot(spec: &GpuBackendSpec) -> Result<String, GpuBackendError> {
    let mut backend = open_backend(spec, None).ok_or(GpuBackendError::Disabled)?;
    let snapshot = backend.snapshot()?;
    let mut text = serde_json::to_string_pretty(&snapshot)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backend_specs_parse_and_print_back() {
        for text in ["nvml", "none", "fixture:/tmp/gpu.json", "nvml:/opt/nvidia/libnvidia-ml.so.1"]
        {
            let spec = parse_backend(text).unwrap();
            assert_eq!(spec.to_string(), text);
        }
        assert_eq!(parse_backend("nvml").unwrap(), GpuBackendSpec::Nvml { library: None });
        assert_eq!(
            parse_backend("fixture:rel/gpu.json").unwrap(),
            GpuBackendSpec::Fixture(PathBuf::from("rel/gpu.json"))
        );
    }

    #[test]
    fn bad_backend_specs_are_refused_with_the_forms() {
        let err = parse_backend("dcgm").unwrap_err();
        assert!(err.contains("fixture:PATH"), "{err}");
        assert!(parse_backend("fixture:").unwrap_err().contains("needs a path"));
        assert!(parse_backend("nvml:").is_err());
        assert!(parse_backend("NVML").is_err());
        assert!(parse_backend("").is_err());
    }

    #[test]
    fn snapshot_round_trips_and_skips_absent_fields() {
        let mut gpu = GpuState {
            index: 2,
            temperature_celsius: Some(41),
            clock_event_reasons: Some(vec![ClockEventReason::HwSlowdown]),
            ..GpuState::default()
        };
        gpu.xid_counts.insert(79, 1);
        let snapshot = GpuSnapshot { driver_version: Some("570.1".into()), gpus: vec![gpu] };
        let json = serde_json::to_string(&snapshot).unwrap();
        assert!(!json.contains("power_watts"), "{json}");
        assert!(!json.contains("condition"), "{json}");
        assert!(json.contains(r#""xid_counts":{"79":1}"#), "{json}");
        assert!(json.contains(r#""hw_slowdown""#), "{json}");
        let back: GpuSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snapshot);
    }

    #[test]
    fn snapshot_refuses_unknown_fields_and_reasons() {
        let err = serde_json::from_str::<GpuSnapshot>(r#"{"gpus":[{"index":0,"temprature":3}]}"#)
            .unwrap_err();
        assert!(err.to_string().contains("temprature"), "{err}");
        assert!(
            serde_json::from_str::<GpuSnapshot>(
                r#"{"gpus":[{"index":0,"clock_event_reasons":["made_up"]}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn duplicate_indices_are_problems() {
        let snapshot = GpuSnapshot {
            driver_version: None,
            gpus: vec![
                GpuState { index: 1, ..GpuState::default() },
                GpuState { index: 1, ..GpuState::default() },
            ],
        };
        assert_eq!(snapshot.problems().len(), 1);
    }
}
