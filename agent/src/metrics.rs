//! Every metric the agent exports, in one place, and the Prometheus text encoding of a snapshot.
//!
//! Checks do not touch a metrics registry: each run returns [`Sample`]s that the runner keeps with
//! the run's findings, and a scrape encodes the newest samples of every check (node_exporter's
//! collect-at-scrape model, without re-running checks on the scrape path). A subject that disappears
//! (a GPU lost, an interface removed) disappears from `/metrics` with the next run.
//!
//! Names follow `fleetmend_<subsystem>_<what>_<unit>`, counters end in `_total`, and labels come only
//! from bounded sets (GPU index, interface, PCI address, mount, check name), never from error text.

use std::collections::BTreeMap;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// A metric family: name, help and type.
#[derive(Debug, PartialEq, Eq)]
pub struct MetricDesc {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Gauge,
    /// A monotonic count; its name ends in `_total`.
    Counter,
}

const fn gauge(name: &'static str, help: &'static str) -> MetricDesc {
    MetricDesc { name, help, kind: MetricKind::Gauge }
}

const fn counter(name: &'static str, help: &'static str) -> MetricDesc {
    MetricDesc { name, help, kind: MetricKind::Counter }
}

/// One value of one family with its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub desc: &'static MetricDesc,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

impl Sample {
    pub fn new(desc: &'static MetricDesc, value: f64) -> Self {
        Sample { desc, labels: Vec::new(), value }
    }

    pub fn label(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.labels.push((key, value.into()));
        self
    }
}

// --- agent and checks -------------------------------------------------------------------------

pub static AGENT_INFO: MetricDesc =
    gauge("fleetmend_agent_info", "Agent build and node identity; always 1.");
pub static AGENT_START_TIME: MetricDesc =
    gauge("fleetmend_agent_start_time_seconds", "Unix time at which this agent process started.");
pub static AGENT_REPORTS: MetricDesc = counter(
    "fleetmend_agent_reports_total",
    "Reports sent to the repairer, by result (ok, error).",
);
pub static AGENT_LAST_REPORT: MetricDesc = gauge(
    "fleetmend_agent_last_report_success_timestamp_seconds",
    "Unix time of the last report the repairer accepted.",
);
pub static AGENT_REPAIRER_SWITCHES: MetricDesc = counter(
    "fleetmend_agent_repairer_switches_total",
    "Times the agent moved its reports to another of its configured repairers.",
);
pub static AGENT_REPAIRER: MetricDesc = gauge(
    "fleetmend_agent_repairer_info",
    "The configured repairer the agent reports to now, by url; always 1.",
);
// --- listener (`/metrics`, `/healthz`, `/v1/health`; names shared with the repairer) -----------

pub static HTTP_CONNECTIONS_OPEN: MetricDesc = gauge(
    fleetmend_listener::metrics::CONNECTIONS_OPEN,
    "Connections open on the agent's listener, TLS handshakes included.",
);
pub static HTTP_CONNECTIONS_MAX: MetricDesc = gauge(
    fleetmend_listener::metrics::CONNECTIONS_MAX,
    "The cap on open connections in force ([listener] max_connections, or less where the descriptor limit did not hold it).",
);
pub static HTTP_CONNECTIONS_SHED: MetricDesc = counter(
    fleetmend_listener::metrics::CONNECTIONS_SHED,
    "Connections closed at accept because the cap was reached.",
);
pub static HTTP_TIMEOUTS: MetricDesc = counter(
    fleetmend_listener::metrics::TIMEOUTS,
    "Connections closed because the client overran a deadline, by phase (handshake, header, body, idle).",
);
pub static CHECK_STATUS: MetricDesc = gauge(
    "fleetmend_check_status",
    "Worst status per check and subject: 0 ok, 1 warn, 2 fail, 3 unknown.",
);
pub static CHECK_DURATION: MetricDesc = gauge(
    "fleetmend_check_duration_seconds",
    "Wall time of the check's latest run (its timeout when it timed out).",
);
pub static CHECK_SUCCESS: MetricDesc = gauge(
    "fleetmend_check_success",
    "1 when the check's latest run finished within its timeout, else 0.",
);
pub static CHECK_TIMEOUTS: MetricDesc = counter(
    "fleetmend_check_timeouts_total",
    "Runs of the check that did not finish within its timeout.",
);
pub static CHECK_LAST_RUN: MetricDesc = gauge(
    "fleetmend_check_last_run_timestamp_seconds",
    "Unix time at which the check's latest run finished or timed out.",
);

// --- gpu --------------------------------------------------------------------------------------

pub static GPU_COUNT: MetricDesc = gauge("fleetmend_gpu_devices", "GPUs the backend sees.");
pub static GPU_EXPECTED_COUNT: MetricDesc =
    gauge("fleetmend_gpu_devices_expected", "GPUs this node should have (config).");
pub static GPU_INFO: MetricDesc =
    gauge("fleetmend_gpu_info", "GPU identity (index, PCI bus id, name, UUID); always 1.");
pub static GPU_TEMPERATURE: MetricDesc =
    gauge("fleetmend_gpu_temperature_celsius", "GPU core temperature.");
pub static GPU_POWER: MetricDesc = gauge("fleetmend_gpu_power_watts", "GPU power draw.");
pub static GPU_CLOCK: MetricDesc =
    gauge("fleetmend_gpu_clock_hertz", "Current GPU clock, by clock (sm, memory).");
pub static GPU_UTILIZATION: MetricDesc = gauge(
    "fleetmend_gpu_utilization_ratio",
    "GPU utilization over the last sample period, by unit (gpu, memory); 0 to 1.",
);
pub static GPU_MEMORY_USED: MetricDesc =
    gauge("fleetmend_gpu_memory_used_bytes", "GPU framebuffer memory in use.");
pub static GPU_MEMORY_TOTAL: MetricDesc =
    gauge("fleetmend_gpu_memory_total_bytes", "GPU framebuffer memory in all.");
pub static GPU_THROTTLE: MetricDesc = gauge(
    "fleetmend_gpu_throttle_active",
    "1 while a clock event (throttle) reason is active, by reason.",
);
pub static GPU_ECC_ERRORS: MetricDesc = counter(
    "fleetmend_gpu_ecc_errors_total",
    "ECC errors by kind (volatile_corrected, volatile_uncorrected, aggregate_corrected, aggregate_uncorrected).",
);
pub static GPU_RETIRED_PAGES: MetricDesc = gauge(
    "fleetmend_gpu_retired_pages",
    "Retired framebuffer pages by cause (single_bit, double_bit).",
);
pub static GPU_RETIRED_PAGES_PENDING: MetricDesc = gauge(
    "fleetmend_gpu_retired_pages_pending",
    "1 when a page retirement waits for the next reset.",
);
pub static GPU_REMAPPED_ROWS: MetricDesc = gauge(
    "fleetmend_gpu_remapped_rows",
    "Remapped memory rows by kind (correctable, uncorrectable).",
);
pub static GPU_REMAPPED_ROWS_PENDING: MetricDesc =
    gauge("fleetmend_gpu_remapped_rows_pending", "1 when a row remap waits for the next reset.");
pub static GPU_REMAPPED_ROWS_FAILURE: MetricDesc = gauge(
    "fleetmend_gpu_remapped_rows_failure",
    "1 when a row remap failed (the GPU ran out of spare rows).",
);
pub static GPU_PCIE_REPLAYS: MetricDesc =
    counter("fleetmend_gpu_pcie_replays_total", "PCIe replay counter.");
pub static GPU_NVLINK_UP: MetricDesc =
    gauge("fleetmend_gpu_nvlink_up", "1 when the NVLink link is active, by link.");
pub static GPU_NVLINK_ERRORS: MetricDesc = counter(
    "fleetmend_gpu_nvlink_errors_total",
    "NVLink error counters by link and kind (crc_flit, crc_data, replay, recovery).",
);
pub static GPU_PERSISTENCE_MODE: MetricDesc =
    gauge("fleetmend_gpu_persistence_mode", "1 when persistence mode is on.");
pub static GPU_RECOVERY_ACTION: MetricDesc = gauge(
    "fleetmend_gpu_recovery_action",
    "Driver-reported recovery action: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.",
);
pub static GPU_XID_ERRORS: MetricDesc =
    counter("fleetmend_gpu_xid_errors_total", "Xid events seen, by GPU and Xid code.");

// --- kernel log -------------------------------------------------------------------------------

pub static KMSG_LINES: MetricDesc =
    counter("fleetmend_kmsg_lines_total", "Kernel log records read.");
pub static KMSG_MATCHES: MetricDesc =
    counter("fleetmend_kmsg_matches_total", "Kernel log records matched, by rule.");

// --- nic --------------------------------------------------------------------------------------

pub static NIC_UP: MetricDesc =
    gauge("fleetmend_nic_up", "1 when the interface is operationally up with carrier.");
pub static NIC_CARRIER_CHANGES: MetricDesc = counter(
    "fleetmend_nic_carrier_changes_total",
    "Carrier changes of the interface (link flaps).",
);
pub static NIC_SPEED: MetricDesc =
    gauge("fleetmend_nic_speed_bytes_per_second", "Negotiated link speed.");
pub static NIC_MTU: MetricDesc = gauge("fleetmend_nic_mtu_bytes", "Interface MTU.");
pub static NIC_ERRORS: MetricDesc =
    counter("fleetmend_nic_errors_total", "Interface errors by direction (rx, tx).");
pub static NIC_DROPS: MetricDesc =
    counter("fleetmend_nic_drops_total", "Dropped packets by direction (rx, tx).");
pub static IB_PORT_UP: MetricDesc =
    gauge("fleetmend_ib_port_up", "1 when the InfiniBand/EFA port is ACTIVE and LinkUp.");
pub static IB_PORT_RATE: MetricDesc =
    gauge("fleetmend_ib_port_rate_bytes_per_second", "InfiniBand/EFA port rate.");
pub static IB_LINK_DOWNED: MetricDesc =
    counter("fleetmend_ib_link_downed_total", "Times the InfiniBand port link went down.");
pub static IB_SYMBOL_ERRORS: MetricDesc =
    counter("fleetmend_ib_symbol_errors_total", "InfiniBand port symbol errors.");
pub static IB_RECEIVE_ERRORS: MetricDesc =
    counter("fleetmend_ib_receive_errors_total", "InfiniBand port receive errors.");

// --- pcie -------------------------------------------------------------------------------------

pub static PCIE_LINK_WIDTH: MetricDesc = gauge(
    "fleetmend_pcie_link_width",
    "Lanes the PCIe link of a GPU or NIC trained at, by device (PCI address) and kind (gpu, nic).",
);
pub static PCIE_LINK_WIDTH_MAX: MetricDesc = gauge(
    "fleetmend_pcie_link_width_max",
    "Most lanes the PCIe link can train at: the lower of the device's and its port's.",
);
pub static PCIE_LINK_SPEED: MetricDesc = gauge(
    "fleetmend_pcie_link_speed_gts",
    "Speed the PCIe link trained at, in GT/s per lane (idle GPUs lower it to save power).",
);
pub static PCIE_LINK_SPEED_MAX: MetricDesc = gauge(
    "fleetmend_pcie_link_speed_gts_max",
    "Highest speed the PCIe link can train at, in GT/s per lane: the lower of the device's and its port's.",
);

// --- disk -------------------------------------------------------------------------------------

pub static DISK_SIZE: MetricDesc = gauge("fleetmend_disk_size_bytes", "Filesystem size.");
pub static DISK_FREE: MetricDesc =
    gauge("fleetmend_disk_free_bytes", "Bytes available to unprivileged users.");
pub static DISK_FREE_RATIO: MetricDesc =
    gauge("fleetmend_disk_free_ratio", "Available bytes over filesystem size.");
pub static DISK_INODES_FREE_RATIO: MetricDesc =
    gauge("fleetmend_disk_inodes_free_ratio", "Free inodes over all inodes.");
pub static DISK_READONLY: MetricDesc =
    gauge("fleetmend_disk_readonly", "1 when the mount is read-only.");
pub static DISK_PROBE_LATENCY: MetricDesc =
    gauge("fleetmend_disk_probe_latency_seconds", "Time of the write-fsync-read-delete probe.");
pub static DISK_IO_ERRORS: MetricDesc =
    counter("fleetmend_disk_io_errors_total", "I/O errors of the block device.");

// --- host -------------------------------------------------------------------------------------

pub static HOST_MEMORY_TOTAL: MetricDesc =
    gauge("fleetmend_host_memory_total_bytes", "Physical memory.");
pub static HOST_MEMORY_AVAILABLE: MetricDesc =
    gauge("fleetmend_host_memory_available_bytes", "Memory available for new work.");
pub static HOST_SWAP_TOTAL: MetricDesc = gauge("fleetmend_host_swap_total_bytes", "Swap space.");
pub static HOST_SWAP_FREE: MetricDesc = gauge("fleetmend_host_swap_free_bytes", "Free swap.");
pub static HOST_LOAD: MetricDesc =
    gauge("fleetmend_host_load_average", "Load average by window (1m, 5m, 15m).");
pub static HOST_CPUS: MetricDesc = gauge("fleetmend_host_cpus", "Online CPUs.");
pub static HOST_EDAC_ERRORS: MetricDesc = counter(
    "fleetmend_host_edac_errors_total",
    "EDAC memory errors by controller and kind (corrected, uncorrected).",
);
pub static HOST_PROCESS_RUNNING: MetricDesc =
    gauge("fleetmend_host_process_running", "1 when a required process is running.");

/// Prometheus text format (0.0.4) of `samples`, grouped into families in name order so the output
/// is stable (golden tests diff it). Samples of one family keep the order they were given in.
pub fn encode(samples: &[Sample]) -> String {
    let mut families: BTreeMap<&'static str, MetricFamily> = BTreeMap::new();
    for sample in samples {
        let family = families.entry(sample.desc.name).or_insert_with(|| {
            let mut family = MetricFamily::default();
            family.set_name(sample.desc.name.to_owned());
            family.set_help(sample.desc.help.to_owned());
            family.set_field_type(match sample.desc.kind {
                MetricKind::Gauge => MetricType::GAUGE,
                MetricKind::Counter => MetricType::COUNTER,
            });
            family
        });
        let mut metric = Metric::default();
        metric.set_label(
            sample
                .labels
                .iter()
                .map(|(name, value)| {
                    let mut pair = LabelPair::default();
                    pair.set_name((*name).to_owned());
                    pair.set_value(value.clone());
                    pair
                })
                .collect(),
        );
        match sample.desc.kind {
            MetricKind::Gauge => {
                let mut gauge = Gauge::default();
                gauge.set_value(sample.value);
                metric.set_gauge(gauge);
            }
            MetricKind::Counter => {
                let mut counter = Counter::default();
                counter.set_value(sample.value);
                metric.set_counter(counter);
            }
        }
        family.mut_metric().push(metric);
    }
    let families: Vec<MetricFamily> = families.into_values().collect();
    let mut out = String::with_capacity(samples.len() * 96);
    // The encoder fails only on a family with no metrics or no name; neither can be built above.
    if let Err(err) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
        tracing::error!(error = %err, "encoding metrics failed");
    }
    out
}

/// Every family, for tests and documentation.
pub static ALL: &[&MetricDesc] = &[
    &AGENT_INFO,
    &AGENT_START_TIME,
    &AGENT_REPORTS,
    &AGENT_LAST_REPORT,
    &AGENT_REPAIRER_SWITCHES,
    &AGENT_REPAIRER,
    &CHECK_STATUS,
    &CHECK_DURATION,
    &CHECK_SUCCESS,
    &CHECK_TIMEOUTS,
    &CHECK_LAST_RUN,
    &GPU_COUNT,
    &GPU_EXPECTED_COUNT,
    &GPU_INFO,
    &GPU_TEMPERATURE,
    &GPU_POWER,
    &GPU_CLOCK,
    &GPU_UTILIZATION,
    &GPU_MEMORY_USED,
    &GPU_MEMORY_TOTAL,
    &GPU_THROTTLE,
    &GPU_ECC_ERRORS,
    &GPU_RETIRED_PAGES,
    &GPU_RETIRED_PAGES_PENDING,
    &GPU_REMAPPED_ROWS,
    &GPU_REMAPPED_ROWS_PENDING,
    &GPU_REMAPPED_ROWS_FAILURE,
    &GPU_PCIE_REPLAYS,
    &GPU_NVLINK_UP,
    &GPU_NVLINK_ERRORS,
    &GPU_PERSISTENCE_MODE,
    &GPU_RECOVERY_ACTION,
    &GPU_XID_ERRORS,
    &KMSG_LINES,
    &KMSG_MATCHES,
    &NIC_UP,
    &NIC_CARRIER_CHANGES,
    &NIC_SPEED,
    &NIC_MTU,
    &NIC_ERRORS,
    &NIC_DROPS,
    &IB_PORT_UP,
    &IB_PORT_RATE,
    &IB_LINK_DOWNED,
    &IB_SYMBOL_ERRORS,
    &IB_RECEIVE_ERRORS,
    &PCIE_LINK_WIDTH,
    &PCIE_LINK_WIDTH_MAX,
    &PCIE_LINK_SPEED,
    &PCIE_LINK_SPEED_MAX,
    &DISK_SIZE,
    &DISK_FREE,
    &DISK_FREE_RATIO,
    &DISK_INODES_FREE_RATIO,
    &DISK_READONLY,
    &DISK_PROBE_LATENCY,
    &DISK_IO_ERRORS,
    &HOST_MEMORY_TOTAL,
    &HOST_MEMORY_AVAILABLE,
    &HOST_SWAP_TOTAL,
    &HOST_SWAP_FREE,
    &HOST_LOAD,
    &HOST_CPUS,
    &HOST_EDAC_ERRORS,
    &HOST_PROCESS_RUNNING,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_families_once_with_help_and_type() {
        let samples = vec![
            Sample::new(&GPU_TEMPERATURE, 41.0).label("gpu", "0"),
            Sample::new(&CHECK_TIMEOUTS, 2.0).label("check", "disk"),
            Sample::new(&GPU_TEMPERATURE, 43.5).label("gpu", "1"),
        ];
        let text = encode(&samples);
        assert_eq!(text.matches("# TYPE fleetmend_gpu_temperature_celsius gauge").count(), 1);
        assert!(text.contains("# TYPE fleetmend_check_timeouts_total counter"));
        assert!(text.contains("fleetmend_gpu_temperature_celsius{gpu=\"1\"} 43.5"));
        assert!(text.contains("fleetmend_check_timeouts_total{check=\"disk\"} 2"));
    }

    #[test]
    fn escapes_label_values() {
        let text = encode(&[Sample::new(&DISK_READONLY, 1.0).label("mount", "/a\"b\\c\nd")]);
        assert!(text.contains(r#"mount="/a\"b\\c\nd""#), "{text}");
    }

    #[test]
    fn counter_names_end_in_total_and_gauges_do_not() {
        for desc in ALL {
            assert!(desc.name.starts_with("fleetmend_"), "{}", desc.name);
            match desc.kind {
                MetricKind::Counter => assert!(desc.name.ends_with("_total"), "{}", desc.name),
                MetricKind::Gauge => assert!(!desc.name.ends_with("_total"), "{}", desc.name),
            }
        }
    }
}
