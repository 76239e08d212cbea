//! The NVML backend: reads the NVIDIA driver through `nvml-wrapper`.
//!
//! NVML is initialised lazily, on the first snapshot, and again on later ones after a failure: the
//! driver may load after the agent, and an agent on a node without the library must keep running
//! (it reports `NVML unavailable`). Every call is blocking FFI; the check runs on a worker thread
//! under its timeout.
//!
//! A query a GPU or driver does not support leaves its field absent. A GPU that answers
//! `GPU_IS_LOST` or `RESET_REQUIRED` is marked so in the snapshot and not queried further this run.
//!
//! Xid events come through an NVML event set. `EventSet::wait` blocks and the set is not `Sync`, so
//! it lives on its own thread (daemon mode only), waits with a bounded timeout in a loop so it can
//! stop, adds each Xid to a shared count map that snapshots copy, and raises the check's event
//! signal so the agent runs the check and reports at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC,
};
use nvml_wrapper::{Device, EventSet, Nvml};

use super::{
    ClockEventReason, EccCounts, GpuBackend, GpuBackendError, GpuCondition, GpuSnapshot, GpuState,
    NvLinkState, RemappedRows, RetiredPages,
};
use crate::checks::EventSignal;

/// NVML's `NVML_NVLINK_MAX_LINKS`: links are probed up to this when the driver does not say how
/// many a GPU has.
const MAX_NVLINKS: u32 = 18;

/// How long one wait on the event set may block; bounds how long the event thread takes to stop.
const EVENT_WAIT: Duration = Duration::from_secs(1);

/// Pause after an event-set error other than a timeout, so a GPU that keeps failing does not spin
/// the thread.
const EVENT_ERROR_PAUSE: Duration = Duration::from_secs(5);

/// Xid counts per GPU index and code, shared between the event thread and snapshots.
type XidCounts = BTreeMap<u32, BTreeMap<u32, u64>>;

/// Reads GPUs through NVML.
#[derive(Debug)]
pub struct NvmlBackend {
    /// The NVML library to load; `None` for the loader's `libnvidia-ml.so.1`.
    library: Option<PathBuf>,
    /// Raised on every Xid; `None` when Xid events are not followed (`--once`, dumps).
    xid_events: Option<EventSignal>,
    /// Set once NVML initialised; cleared when a node-wide query fails so the next run starts over.
    session: Option<Session>,
    xid_counts: Arc<Mutex<XidCounts>>,
}

/// An initialised NVML and, in daemon mode, the thread that follows its Xid events.
#[derive(Debug)]
struct Session {
    nvml: Arc<Nvml>,
    /// Tells the event thread to stop; it holds its own `Arc<Nvml>` until it does.
    stop: Arc<AtomicBool>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl NvmlBackend {
    pub fn new(library: Option<PathBuf>, xid_events: Option<EventSignal>) -> Self {
        NvmlBackend { library, xid_events, session: None, xid_counts: Arc::default() }
    }

    fn init(&self) -> Result<Nvml, GpuBackendError> {
        let result = match &self.library {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::init(),
        };
        result.map_err(init_error)
    }

    fn session(&mut self) -> Result<&Session, GpuBackendError> {
        if self.session.is_none() {
            let nvml = Arc::new(self.init()?);
            let stop = Arc::new(AtomicBool::new(false));
            if let Some(signal) = &self.xid_events {
                start_xid_thread(
                    Arc::clone(&nvml),
                    Arc::clone(&self.xid_counts),
                    signal.clone(),
                    Arc::clone(&stop),
                );
            }
            self.session = Some(Session { nvml, stop });
        }
        // Just set above when it was empty.
        self.session.as_ref().ok_or_else(|| GpuBackendError::NvmlUnavailable {
            reason: "not initialised".to_owned(),
        })
    }
}

/// What an init error means for the node.
fn init_error(err: NvmlError) -> GpuBackendError {
    let reason = match err {
        NvmlError::LibRmVersionMismatch => return GpuBackendError::NvmlVersionMismatch,
        NvmlError::LibloadingError(err) => format!("library not loadable ({err})"),
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_owned(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_owned(),
        NvmlError::FailedToLoadSymbol(symbol) => {
            format!("the NVML library lacks a needed function ({symbol})")
        }
        other => format!("initialisation failed ({other})"),
    };
    GpuBackendError::NvmlUnavailable { reason }
}

impl GpuBackend for NvmlBackend {
    fn snapshot(&mut self) -> Result<GpuSnapshot, GpuBackendError> {
        let session = self.session()?;
        let nvml = Arc::clone(&session.nvml);
        let count = match nvml.device_count() {
            Ok(count) => count,
            Err(source) => {
                // The driver may have gone away; start over on the next run.
                self.session = None;
                return Err(GpuBackendError::NvmlQuery { operation: "device_count", source });
            }
        };
        let xid_counts = self.xid_counts.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let gpus = (0..count)
            .map(|index| {
                let mut gpu = read_gpu(&nvml, index);
                if let Some(counts) = xid_counts.get(&index) {
                    gpu.xid_counts = counts.clone();
                }
                gpu
            })
            .collect();
        Ok(GpuSnapshot { driver_version: nvml.sys_driver_version().ok(), gpus })
    }
}

/// Runs queries on one GPU until it turns out lost or in need of a reset.
struct Probe {
    condition: GpuCondition,
    error: Option<String>,
}

impl Probe {
    /// The value of `query`, or `None` when it is unsupported, failed, or the GPU stopped answering.
    fn get<T>(&mut self, what: &str, query: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        if !self.condition.is_responding() {
            return None;
        }
        match query() {
            Ok(value) => Some(value),
            Err(err) => {
                self.note(what, err);
                None
            }
        }
    }

    /// Records what an error says about the GPU; unsupported queries say nothing.
    fn note(&mut self, what: &str, err: NvmlError) {
        match err {
            NvmlError::GpuLost => {
                self.condition = GpuCondition::Lost;
                self.error = Some(format!("{what}: GPU is lost"));
            }
            NvmlError::ResetRequired => {
                self.condition = GpuCondition::ResetRequired;
                self.error = Some(format!("{what}: GPU reset required"));
            }
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound
            | NvmlError::NoData
            | NvmlError::NoPermission
            | NvmlError::InvalidArg
            | NvmlError::NotFound => {}
            other => tracing::debug!(query = what, error = %other, "NVML query failed"),
        }
    }
}

fn read_gpu(nvml: &Nvml, index: u32) -> GpuState {
    let mut gpu = GpuState { index, ..GpuState::default() };
    let device = match nvml.device_by_index(index) {
        Ok(device) => device,
        Err(err) => {
            let mut probe = Probe { condition: GpuCondition::Responding, error: None };
            probe.note("device_by_index", err);
            if probe.condition.is_responding() {
                // Not lost, not reset: we cannot tell what state it is in.
                probe.condition = GpuCondition::Unreadable;
                probe.error = Some("device_by_index failed".to_owned());
            }
            gpu.condition = probe.condition;
            gpu.error = probe.error;
            return gpu;
        }
    };
    let mut probe = Probe { condition: GpuCondition::Responding, error: None };
    let p = &mut probe;
    gpu.pci_bus_id = p.get("pci_info", || device.pci_info()).map(|pci| pci.bus_id);
    gpu.name = p.get("name", || device.name());
    gpu.uuid = p.get("uuid", || device.uuid());
    gpu.temperature_celsius = p.get("temperature", || device.temperature(TemperatureSensor::Gpu));
    gpu.power_watts =
        p.get("power_usage", || device.power_usage()).map(|mw| f64::from(mw) / 1000.0);
    gpu.sm_clock_mhz = p.get("clock_info sm", || device.clock_info(Clock::SM));
    gpu.memory_clock_mhz = p.get("clock_info memory", || device.clock_info(Clock::Memory));
    if let Some(util) = p.get("utilization_rates", || device.utilization_rates()) {
        gpu.utilization_gpu_percent = Some(util.gpu);
        gpu.utilization_memory_percent = Some(util.memory);
    }
    if let Some(memory) = p.get("memory_info", || device.memory_info()) {
        gpu.memory_used_bytes = Some(memory.used);
        gpu.memory_total_bytes = Some(memory.total);
    }
    gpu.clock_event_reasons = p
        .get("current_throttle_reasons", || device.current_throttle_reasons())
        .map(clock_event_reasons);
    gpu.ecc = read_ecc(p, &device);
    gpu.retired_pages = read_retired_pages(p, &device);
    gpu.pcie_replays = p.get("pcie_replay_counter", || device.pcie_replay_counter()).map(u64::from);
    gpu.pcie_link_gen = p.get("current_pcie_link_gen", || device.current_pcie_link_gen());
    gpu.pcie_link_width = p.get("current_pcie_link_width", || device.current_pcie_link_width());
    gpu.pcie_link_width_max = p.get("max_pcie_link_width", || device.max_pcie_link_width());
    gpu.persistence_mode = p.get("is_in_persistent_mode", || device.is_in_persistent_mode());

    // Row remapping has no wrapper in nvml-wrapper 0.13; its field values give the same counts
    // without unsafe code. One batched call also fetches the recovery action and link count.
    let fields = [
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
        NVML_FI_DEV_NVLINK_LINK_COUNT,
    ];
    let values = read_fields(p, &device, &fields);
    if let [Some(correctable), Some(uncorrectable), Some(pending), Some(failure), ..] = values[..] {
        gpu.remapped_rows = Some(RemappedRows {
            correctable,
            uncorrectable,
            pending: pending != 0,
            failure: failure != 0,
        });
    }
    gpu.recovery_action = values[4].and_then(|code| u32::try_from(code).ok());
    let link_count = values[5].and_then(|count| u32::try_from(count).ok());
    gpu.nvlinks = read_nvlinks(p, &device, link_count);

    gpu.condition = probe.condition;
    gpu.error = probe.error;
    gpu
}

fn clock_event_reasons(reasons: ThrottleReasons) -> Vec<ClockEventReason> {
    [
        (ThrottleReasons::GPU_IDLE, ClockEventReason::GpuIdle),
        (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, ClockEventReason::ApplicationsClocksSetting),
        (ThrottleReasons::SW_POWER_CAP, ClockEventReason::SwPowerCap),
        (ThrottleReasons::HW_SLOWDOWN, ClockEventReason::HwSlowdown),
        (ThrottleReasons::SYNC_BOOST, ClockEventReason::SyncBoost),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, ClockEventReason::SwThermalSlowdown),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, ClockEventReason::HwThermalSlowdown),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, ClockEventReason::HwPowerBrakeSlowdown),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, ClockEventReason::DisplayClockSetting),
    ]
    .into_iter()
    .filter(|(bit, _)| reasons.contains(*bit))
    .map(|(_, reason)| reason)
    .collect()
}

fn read_ecc(p: &mut Probe, device: &Device<'_>) -> Option<EccCounts> {
    let mut count = |what, error, counter| p.get(what, || device.total_ecc_errors(error, counter));
    let ecc = EccCounts {
        volatile_corrected: count(
            "ecc volatile corrected",
            MemoryError::Corrected,
            EccCounter::Volatile,
        ),
        volatile_uncorrected: count(
            "ecc volatile uncorrected",
            MemoryError::Uncorrected,
            EccCounter::Volatile,
        ),
        aggregate_corrected: count(
            "ecc aggregate corrected",
            MemoryError::Corrected,
            EccCounter::Aggregate,
        ),
        aggregate_uncorrected: count(
            "ecc aggregate uncorrected",
            MemoryError::Uncorrected,
            EccCounter::Aggregate,
        ),
    };
    (ecc != EccCounts::default()).then_some(ecc)
}

fn read_retired_pages(p: &mut Probe, device: &Device<'_>) -> Option<RetiredPages> {
    let single_bit = p.get("retired_pages single bit", || {
        device.retired_pages(RetirementCause::MultipleSingleBitEccErrors)
    })?;
    let double_bit = p.get("retired_pages double bit", || {
        device.retired_pages(RetirementCause::DoubleBitEccError)
    })?;
    let pending = p.get("are_pages_pending_retired", || device.are_pages_pending_retired())?;
    Some(RetiredPages {
        single_bit: single_bit.len() as u64,
        double_bit: double_bit.len() as u64,
        pending,
    })
}

/// Field values as integers, `None` where one is unsupported or failed.
fn read_fields(p: &mut Probe, device: &Device<'_>, ids: &[u32]) -> Vec<Option<u64>> {
    let field_ids: Vec<FieldId> = ids.iter().map(|&id| FieldId(id)).collect();
    let Some(samples) = p.get("field_values", || device.field_values_for(&field_ids)) else {
        return vec![None; ids.len()];
    };
    let mut values = vec![None; ids.len()];
    for sample in samples {
        let sample = match sample {
            Ok(sample) => sample,
            Err(err) => {
                p.note("field value", err);
                continue;
            }
        };
        // The driver answers in the order asked, but match on the id so a reordering cannot
        // swap two counts. (Ids above 250 are renumbered by the wrapper; ours are not.)
        let Some(slot) = ids.iter().position(|&id| id == sample.field.0) else { continue };
        match sample.value {
            Ok(value) => values[slot] = sample_u64(value),
            Err(err) => p.note("field value", err),
        }
    }
    values
}

fn sample_u64(value: SampleValue) -> Option<u64> {
    match value {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(v) if v.is_finite() && v >= 0.0 => Some(v as u64),
        SampleValue::F64(_) => None,
    }
}

fn read_nvlinks(p: &mut Probe, device: &Device<'_>, count: Option<u32>) -> Vec<NvLinkState> {
    let mut links = Vec::new();
    for link in 0..count.unwrap_or(MAX_NVLINKS).min(MAX_NVLINKS) {
        let wrapper = device.link_wrapper_for(link);
        // Without a link count from the driver, the first link that does not answer ends the
        // list: GPUs number their links from 0.
        let Some(active) = p.get("nvlink state", || wrapper.is_active()) else { break };
        let mut counter = |what, kind| p.get(what, || wrapper.error_counter(kind));
        links.push(NvLinkState {
            link,
            active,
            crc_flit: counter("nvlink crc flit", ErrorCounter::DlCrcFlit),
            crc_data: counter("nvlink crc data", ErrorCounter::DlCrcData),
            replay: counter("nvlink replay", ErrorCounter::DlReplay),
            recovery: counter("nvlink recovery", ErrorCounter::DlRecovery),
        });
    }
    links
}

fn start_xid_thread(
    nvml: Arc<Nvml>,
    counts: Arc<Mutex<XidCounts>>,
    signal: EventSignal,
    stop: Arc<AtomicBool>,
) {
    let spawned = std::thread::Builder::new()
        .name("fleetmend-gpu-xid".to_owned())
        .spawn(move || follow_xid_events(&nvml, &counts, &signal, &stop));
    if let Err(err) = spawned {
        tracing::error!(error = %err, "cannot start the GPU Xid event thread; Xids come only from the kernel log");
    }
}

/// Builds an event set for Xid events on every GPU that supports them. A failed registration
/// frees the set (NVML's rule), so the set is rebuilt without the GPU that failed.
fn xid_event_set(nvml: &Nvml) -> Result<EventSet<'_>, NvmlError> {
    let count = nvml.device_count()?;
    let mut indices: Vec<u32> = (0..count)
        .filter(|&index| {
            nvml.device_by_index(index)
                .and_then(|device| device.supported_event_types())
                .map(|types| types.contains(EventTypes::CRITICAL_XID_ERROR))
                .unwrap_or(false)
        })
        .collect();
    'rebuild: loop {
        let mut set = nvml.create_event_set()?;
        for (position, &index) in indices.iter().enumerate() {
            let device = nvml.device_by_index(index)?;
            set = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => set,
                Err(err) => {
                    tracing::warn!(gpu = index, error = %err, "cannot follow Xid events of this GPU");
                    indices.remove(position);
                    continue 'rebuild;
                }
            };
        }
        if indices.is_empty() {
            tracing::info!(
                "no GPU reports Xid events through NVML; Xids come only from the kernel log"
            );
        }
        return Ok(set);
    }
}

fn follow_xid_events(
    nvml: &Nvml,
    counts: &Mutex<XidCounts>,
    signal: &EventSignal,
    stop: &AtomicBool,
) {
    let set = match xid_event_set(nvml) {
        Ok(set) => set,
        Err(err) => {
            tracing::warn!(error = %err, "cannot follow GPU Xid events; Xids come only from the kernel log");
            return;
        }
    };
    let wait_ms = u32::try_from(EVENT_WAIT.as_millis()).unwrap_or(u32::MAX);
    let mut last_error: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(wait_ms) {
            Ok(event) => {
                last_error = None;
                if !event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    continue;
                }
                let code = match event.event_data {
                    Some(XidError::Value(code)) => u32::try_from(code).unwrap_or(u32::MAX),
                    Some(XidError::Unknown) | None => {
                        tracing::warn!("NVML reported an Xid event without a code");
                        continue;
                    }
                };
                match event.device.index() {
                    Ok(index) => {
                        let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
                        *counts.entry(index).or_default().entry(code).or_default() += 1;
                        drop(counts);
                        tracing::warn!(gpu = index, xid = code, "GPU Xid event");
                        signal.raise();
                    }
                    Err(err) => {
                        tracing::warn!(xid = code, error = %err, "Xid event on a GPU whose index cannot be read");
                        signal.raise();
                    }
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(err) => {
                // Log a changed error once, not on every wait.
                let text = err.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "waiting for GPU events failed");
                    if matches!(err, NvmlError::GpuLost) {
                        signal.raise();
                    }
                    last_error = Some(text);
                }
                std::thread::sleep(EVENT_ERROR_PAUSE);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_library_that_is_not_there_is_unavailable_not_a_crash() {
        let mut backend =
            NvmlBackend::new(Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1")), None);
        for _ in 0..2 {
            let err = backend.snapshot().unwrap_err();
            assert!(err.to_string().starts_with("NVML unavailable"), "{err}");
        }
    }

    #[test]
    fn init_errors_keep_their_meaning() {
        assert!(matches!(
            init_error(NvmlError::LibRmVersionMismatch),
            GpuBackendError::NvmlVersionMismatch
        ));
        let err = init_error(NvmlError::DriverNotLoaded).to_string();
        assert!(err.starts_with("NVML unavailable: the NVIDIA kernel driver"), "{err}");
    }

    #[test]
    fn lost_gpus_stop_further_queries() {
        let mut probe = Probe { condition: GpuCondition::Responding, error: None };
        assert_eq!(probe.get("a", || Err::<u32, _>(NvmlError::NotSupported)), None);
        assert!(probe.condition.is_responding());
        assert_eq!(probe.get("b", || Err::<u32, _>(NvmlError::GpuLost)), None);
        assert_eq!(probe.condition, GpuCondition::Lost);
        let mut asked = false;
        assert_eq!(
            probe.get("c", || {
                asked = true;
                Ok(1)
            }),
            None
        );
        assert!(!asked);
    }

    #[test]
    fn throttle_bits_map_to_reasons() {
        let reasons =
            clock_event_reasons(ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::SW_POWER_CAP);
        assert_eq!(reasons, vec![ClockEventReason::SwPowerCap, ClockEventReason::HwSlowdown]);
    }

    #[test]
    fn field_samples_become_counts() {
        assert_eq!(sample_u64(SampleValue::U32(7)), Some(7));
        assert_eq!(sample_u64(SampleValue::I64(-1)), None);
        assert_eq!(sample_u64(SampleValue::F64(f64::NAN)), None);
    }
}
