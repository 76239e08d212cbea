//! The gpu check against fixture cases under `tests/fixtures/`: each case is a node whose GPU state
//! is a `gpu.json` snapshot (and `proc/` where the case needs an uptime). Tests that change what
//! the node shows copy the snapshot to a temporary directory and rewrite it between runs, as a
//! simulated node does.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::time::{Duration, SystemTime};

use fleetmend_agent::checks::gpu::{GpuCheck, GpuConfig};
use fleetmend_agent::checks::{Mode, Observation};
use fleetmend_agent::config::HostPaths;
use fleetmend_agent::gpu::{
    ClockEventReason, GpuBackendSpec, GpuSnapshot, dump_snapshot, parse_backend,
};
use fleetmend_agent::metrics;
use fleetmend_proto::{RecommendedAction, Status};
use support::{assert_finding, build_context, find, fixture, not_ok, run_at};

/// The config of an 8-GPU node reading `dir/gpu.json`.
fn config(dir: &Path) -> GpuConfig {
    GpuConfig {
        backend: GpuBackendSpec::Fixture(dir.join("gpu.json")),
        expected_count: Some(8),
        ..GpuConfig::default()
    }
}

/// A check and the host it looks at; `now` moves only when a test moves it.
struct Node {
    check: GpuCheck,
    paths: HostPaths,
    now: SystemTime,
}

impl Node {
    fn new(config: &GpuConfig, dir: &Path) -> Node {
        let paths = HostPaths::tree(dir);
        let check = GpuCheck::new(config, build_context(&paths, Mode::Once));
        Node { check, paths, now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) }
    }

    fn run(&mut self) -> Observation {
        run_at(&mut self.check, &self.paths, self.now)
    }

    fn run_after(&mut self, elapsed: Duration) -> Observation {
        self.now += elapsed;
        self.run()
    }
}

/// A copy of a case's `gpu.json` in a temporary directory, to rewrite between runs.
fn scratch_copy(name: &str) -> (tempfile::TempDir, GpuSnapshot) {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture(name).join("gpu.json")).unwrap();
    std::fs::write(dir.path().join("gpu.json"), &text).unwrap();
    (dir, serde_json::from_str(&text).unwrap())
}

fn rewrite(dir: &Path, snapshot: &GpuSnapshot) {
    // Write then rename, as a simulated node should, so a run never reads half a file.
    let tmp = dir.join("gpu.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(snapshot).unwrap()).unwrap();
    std::fs::rename(tmp, dir.join("gpu.json")).unwrap();
}

const PER_GPU_FINDINGS: [&str; 11] = [
    "gpu_access",
    "temperature",
    "throttle",
    "persistence_mode",
    "ecc_uncorrected",
    "row_remap",
    "pcie_replays",
    "nvlink_down",
    "nvlink_errors",
    "recovery_action",
    "xid",
];

#[test]
fn healthy_node_reports_every_finding_ok() {
    let dir = fixture("healthy");
    let mut node = Node::new(&config(&dir), &dir);
    // The second run has rates to judge as well.
    for out in [node.run(), node.run_after(Duration::from_secs(10))] {
        assert!(not_ok(&out).is_empty(), "{:#?}", not_ok(&out));
        let count = find(&out, "gpu_count", "");
        assert_eq!(count.value, Some(8.0));
        assert_eq!(find(&out, "gpu_backend", "").status, Status::Ok);
        for gpu in 0..8 {
            for id in PER_GPU_FINDINGS {
                find(&out, id, &gpu.to_string());
            }
        }
        assert_eq!(find(&out, "nvlink_down", "7").message, "all 18 NVLink links active");
        assert_eq!(find(&out, "xid", "0").labels["pci"], "00000000:18:00.0");
    }

    let out = node.run();
    let links_up = out
        .samples
        .iter()
        .filter(|s| s.desc.name == metrics::GPU_NVLINK_UP.name && s.value == 1.0)
        .count();
    assert_eq!(links_up, 8 * 18);
    let text = metrics::encode(&out.samples);
    for line in [
        "fleetmend_gpu_devices 8",
        "fleetmend_gpu_devices_expected 8",
        "fleetmend_gpu_memory_total_bytes{gpu=\"0\"} 85520809984",
        "fleetmend_gpu_temperature_celsius{gpu=\"3\"} 43",
        "fleetmend_gpu_clock_hertz{gpu=\"0\",clock=\"memory\"} 2619000000",
        "fleetmend_gpu_ecc_errors_total{gpu=\"7\",kind=\"aggregate_uncorrected\"} 0",
        "fleetmend_gpu_throttle_active{gpu=\"1\",reason=\"gpu_idle\"} 1",
        "fleetmend_gpu_persistence_mode{gpu=\"5\"} 1",
        "fleetmend_gpu_remapped_rows_failure{gpu=\"2\"} 0",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    // GPU 0 once saw Xid 43 (an application's fault, "ignore" in the catalog): counted, not a fault.
    assert!(text.contains("fleetmend_gpu_xid_errors_total{gpu=\"0\",xid=\"43\"} 2"), "{text}");
    assert_eq!(text.matches("fleetmend_gpu_xid_errors_total{").count(), 1, "{text}");
}

#[test]
fn xid_79_fails_the_gpu_and_asks_for_a_reboot() {
    let dir = fixture("gpu_xid79");
    let mut node = Node::new(&config(&dir), &dir);
    let out = node.run();
    let xid = find(&out, "xid", "3");
    assert_finding(xid, Status::Fail, RecommendedAction::Reboot);
    assert_eq!(xid.labels["xid"], "79");
    assert_eq!(xid.labels["pci"], "00000000:5d:00.0");
    assert_eq!(xid.value, Some(79.0));
    let access = find(&out, "gpu_access", "3");
    assert_finding(access, Status::Fail, RecommendedAction::Reboot);
    assert!(access.message.contains("lost"), "{}", access.message);
    // The other seven are fine, and the count still sees 8 (the lost GPU is enumerated).
    assert_eq!(find(&out, "xid", "2").status, Status::Ok);
    assert_eq!(find(&out, "gpu_count", "").status, Status::Ok);
    let failing: Vec<&str> = not_ok(&out).iter().map(|f| f.finding.as_str()).collect();
    assert_eq!(failing, ["gpu_access", "xid"]);
    let text = metrics::encode(&out.samples);
    assert!(text.contains("fleetmend_gpu_xid_errors_total{gpu=\"3\",xid=\"79\"} 1"), "{text}");
}

#[test]
fn xid_48_with_a_double_bit_error_asks_for_a_gpu_reset() {
    let dir = fixture("gpu_xid48_dbe");
    let mut node = Node::new(&config(&dir), &dir);
    let out = node.run();
    let xid = find(&out, "xid", "5");
    assert_finding(xid, Status::Fail, RecommendedAction::ResetGpu);
    assert_eq!(xid.labels["xid"], "48");
    let ecc = find(&out, "ecc_uncorrected", "5");
    assert_finding(ecc, Status::Fail, RecommendedAction::ResetGpu);
    assert_eq!(ecc.value, Some(1.0));
    assert_eq!(ecc.labels["pci"], "00000000:ab:00.0");
    let remap = find(&out, "row_remap", "5");
    assert_finding(remap, Status::Fail, RecommendedAction::ResetGpu);
    let recovery = find(&out, "recovery_action", "5");
    assert_finding(recovery, Status::Fail, RecommendedAction::ResetGpu);
    // Only GPU 5 is affected.
    assert!(not_ok(&out).iter().all(|f| f.subject == "5"), "{:#?}", not_ok(&out));
    let text = metrics::encode(&out.samples);
    assert!(
        text.contains("fleetmend_gpu_ecc_errors_total{gpu=\"5\",kind=\"volatile_uncorrected\"} 1"),
        "{text}"
    );
}

#[test]
fn row_remap_failure_asks_for_replacement() {
    let dir = fixture("gpu_row_remap_failure");
    let mut node = Node::new(&config(&dir), &dir);
    let out = node.run();
    let remap = find(&out, "row_remap", "2");
    assert_finding(remap, Status::Fail, RecommendedAction::Replace);
    assert!(remap.message.contains("no spare rows"), "{}", remap.message);
    assert_eq!(find(&out, "row_remap", "1").status, Status::Ok);
    // The old uncorrectable errors alone (aggregate) do not ask for a reset.
    assert_eq!(find(&out, "ecc_uncorrected", "2").status, Status::Ok);
    assert_eq!(not_ok(&out).len(), 1, "{:#?}", not_ok(&out));
}

#[test]
fn missing_gpu_warns_first_then_fails_after_the_debounce() {
    let dir = fixture("gpu_missing"); // proc/uptime: up two hours, past the boot grace
    let mut node = Node::new(&config(&dir), &dir);
    for run in 1..=3 {
        let out = node.run_after(Duration::from_secs(10));
        let count = find(&out, "gpu_count", "");
        assert_eq!(count.value, Some(7.0));
        if run < 3 {
            let expected = (Status::Warn, RecommendedAction::None);
            assert_eq!((count.status, count.action), expected, "run {run}");
        } else {
            let expected = (Status::Fail, RecommendedAction::Reboot);
            assert_eq!((count.status, count.action), expected, "run {run}");
            assert!(count.message.contains("7 of 8"), "{}", count.message);
        }
        // No Xid explains the missing GPU: the count alone fails, nothing else.
        let failing: Vec<&str> = not_ok(&out).iter().map(|f| f.finding.as_str()).collect();
        assert_eq!(failing, ["gpu_count"], "run {run}");
        assert!(out.findings.iter().any(|f| f.finding == "xid"), "{:#?}", out.findings);
    }
}

#[test]
fn missing_gpu_within_the_boot_grace_only_warns() {
    let (dir, snapshot) = scratch_copy("gpu_missing");
    std::fs::create_dir_all(dir.path().join("proc")).unwrap();
    std::fs::write(dir.path().join("proc/uptime"), "95.20 700.10\n").unwrap();
    let mut node = Node::new(&config(dir.path()), dir.path());
    for _ in 0..5 {
        let out = node.run_after(Duration::from_secs(10));
        assert_finding(find(&out, "gpu_count", ""), Status::Warn, RecommendedAction::None);
    }
    // Past the grace, the runs already counted are enough.
    std::fs::write(dir.path().join("proc/uptime"), "601.00 4000.00\n").unwrap();
    let out = node.run_after(Duration::from_secs(10));
    assert_finding(find(&out, "gpu_count", ""), Status::Fail, RecommendedAction::Reboot);
    // The GPU shows up again: the count clears.
    let mut full = snapshot.clone();
    let mut eighth = full.gpus[6].clone();
    eighth.index = 7;
    eighth.pci_bus_id = Some("00000000:db:00.0".into());
    full.gpus.push(eighth);
    rewrite(dir.path(), &full);
    let out = node.run_after(Duration::from_secs(10));
    assert_eq!(find(&out, "gpu_count", "").status, Status::Ok);
}

#[test]
fn nvlink_down_and_nvlink_errors() {
    let dir = fixture("gpu_nvlink_errors");
    let mut node = Node::new(&config(&dir), &dir);
    let out = node.run();
    let down = find(&out, "nvlink_down", "1");
    assert_finding(down, Status::Fail, RecommendedAction::ResetGpu);
    assert_eq!(down.labels["links"], "7");
    assert_eq!(down.value, Some(1.0));
    let errors = find(&out, "nvlink_errors", "6");
    assert_finding(errors, Status::Warn, RecommendedAction::None);
    assert_eq!(errors.labels["links"], "11");
    assert!(errors.message.contains("recovery"), "{}", errors.message);
    assert_eq!(find(&out, "nvlink_errors", "1").status, Status::Ok);
    assert_eq!(find(&out, "nvlink_down", "6").status, Status::Ok);
    let mut failing: Vec<(&str, &str)> =
        not_ok(&out).iter().map(|f| (f.finding.as_str(), f.subject.as_str())).collect();
    failing.sort();
    assert_eq!(failing, [("nvlink_down", "1"), ("nvlink_errors", "6")]);
    let text = metrics::encode(&out.samples);
    assert!(text.contains("fleetmend_gpu_nvlink_up{gpu=\"1\",link=\"7\"} 0"), "{text}");
    assert!(
        text.contains(
            "fleetmend_gpu_nvlink_errors_total{gpu=\"6\",link=\"11\",kind=\"recovery\"} 3"
        ),
        "{text}"
    );
}

#[test]
fn nvlinks_fewer_than_expected_are_down_even_when_the_driver_does_not_list_them() {
    let (dir, mut snapshot) = scratch_copy("healthy");
    let expecting = GpuConfig { expected_nvlinks: Some(18), ..config(dir.path()) };
    let mut node = Node::new(&expecting, dir.path());
    let out = node.run();
    assert!(not_ok(&out).is_empty(), "{:#?}", not_ok(&out));
    let down = find(&out, "nvlink_down", "2");
    assert_eq!(down.message, "18 of 18 expected NVLink links active");
    assert_eq!(down.value, Some(0.0));

    // GPU 2 lists 16 links (two trained so badly the driver stopped listing them) and GPU 5 none.
    snapshot.gpus[2].nvlinks.truncate(16);
    snapshot.gpus[5].nvlinks.clear();
    rewrite(dir.path(), &snapshot);
    let out = node.run_after(Duration::from_secs(10));
    let down = find(&out, "nvlink_down", "2");
    assert_finding(down, Status::Fail, RecommendedAction::ResetGpu);
    assert_eq!(down.message, "16 of 18 expected NVLink links active; 2 not listed by the driver");
    assert_eq!(down.value, Some(2.0));
    let none = find(&out, "nvlink_down", "5");
    assert_finding(none, Status::Fail, RecommendedAction::ResetGpu);
    assert!(none.message.starts_with("0 of 18 expected"), "{}", none.message);

    // Without expected_nvlinks, a GPU that lists fewer links is not judged by the count.
    let mut plain = Node::new(&config(dir.path()), dir.path());
    let out = plain.run();
    assert!(not_ok(&out).is_empty(), "{:#?}", not_ok(&out));
}

#[test]
fn expected_nvlinks_name_the_inactive_links_and_skip_lost_gpus() {
    let dir = fixture("gpu_nvlink_errors");
    let expecting = GpuConfig { expected_nvlinks: Some(18), ..config(&dir) };
    let out = Node::new(&expecting, &dir).run();
    let down = find(&out, "nvlink_down", "1");
    assert_finding(down, Status::Fail, RecommendedAction::ResetGpu);
    assert_eq!(down.message, "17 of 18 expected NVLink links active; inactive: 7");
    assert_eq!(down.labels["links"], "7");

    // A lost GPU lists no links: gpu_access reports it, not nvlink_down.
    let dir = fixture("gpu_xid79");
    let expecting = GpuConfig { expected_nvlinks: Some(18), ..config(&dir) };
    let out = Node::new(&expecting, &dir).run();
    assert!(out.findings.iter().all(|f| !(f.finding == "nvlink_down" && f.subject == "3")));
    let failing: Vec<&str> = not_ok(&out).iter().map(|f| f.finding.as_str()).collect();
    assert_eq!(failing, ["gpu_access", "xid"]);
}

#[test]
fn a_sustained_hardware_slowdown_fails_with_drain_and_power_capping_does_not() {
    let (dir, mut snapshot) = scratch_copy("healthy");
    let mut node = Node::new(&config(dir.path()), dir.path());
    assert_eq!(find(&node.run(), "throttle", "3").status, Status::Ok);

    snapshot.gpus[3].clock_event_reasons =
        Some(vec![ClockEventReason::HwSlowdown, ClockEventReason::HwThermalSlowdown]);
    rewrite(dir.path(), &snapshot);
    for run in 1..=2 {
        let out = node.run_after(Duration::from_secs(10));
        let throttle = find(&out, "throttle", "3");
        assert_finding(throttle, Status::Warn, RecommendedAction::None);
        assert!(throttle.message.contains(&format!("{run} of 3 runs")), "{}", throttle.message);
        assert!(throttle.message.contains("hw_thermal_slowdown"), "{}", throttle.message);
    }
    let out = node.run_after(Duration::from_secs(10));
    let throttle = find(&out, "throttle", "3");
    assert_finding(throttle, Status::Fail, RecommendedAction::Drain);
    assert!(
        throttle.message.contains("hw_slowdown, hw_thermal_slowdown on 3 runs in a row (for 20s)"),
        "{}",
        throttle.message
    );
    assert_eq!(throttle.value, Some(3.0));
    assert_eq!(throttle.labels["pci"], "00000000:5d:00.0");
    assert!(not_ok(&out).iter().all(|f| f.subject == "3"), "{:#?}", not_ok(&out));

    // Software power capping is a setting, not a fault: ok, and the streak ends.
    snapshot.gpus[3].clock_event_reasons = Some(vec![ClockEventReason::SwPowerCap]);
    rewrite(dir.path(), &snapshot);
    let out = node.run_after(Duration::from_secs(10));
    assert_eq!(find(&out, "throttle", "3").status, Status::Ok);
    snapshot.gpus[3].clock_event_reasons = Some(vec![ClockEventReason::HwPowerBrakeSlowdown]);
    rewrite(dir.path(), &snapshot);
    let out = node.run_after(Duration::from_secs(10));
    let throttle = find(&out, "throttle", "3");
    assert_finding(throttle, Status::Warn, RecommendedAction::None);
    assert!(throttle.message.contains("1 of 3 runs"), "{}", throttle.message);
}

#[test]
fn throttle_sustained_runs_and_expected_nvlinks_come_from_toml() {
    let config = fleetmend_agent::config::AgentConfig::parse(
        "[checks.gpu]\nexpected_nvlinks = 18\nthrottle_sustained_runs = 5\n",
    )
    .unwrap();
    assert!(config.validate().is_empty(), "{}", config.validate());
    assert_eq!(config.checks.gpu.expected_nvlinks, Some(18));
    assert_eq!(config.checks.gpu.throttle_sustained_runs, 5);
    let defaults = GpuConfig::default();
    assert_eq!((defaults.expected_nvlinks, defaults.throttle_sustained_runs), (None, 3));
    let bad = fleetmend_agent::config::AgentConfig::parse(
        "[checks.gpu]\nexpected_nvlinks = 0\nthrottle_sustained_runs = 0\n",
    )
    .unwrap();
    let problems = bad.validate();
    assert!(problems.names("checks.gpu.expected_nvlinks"), "{problems}");
    assert!(problems.names("checks.gpu.throttle_sustained_runs"), "{problems}");
}

#[test]
fn nvlink_crc_burst_warns_and_clears() {
    let (dir, mut snapshot) = scratch_copy("healthy");
    let mut node = Node::new(&config(dir.path()), dir.path());
    assert!(not_ok(&node.run()).is_empty());
    // 5000 CRC errors on GPU 0 link 2 within 10 s: 500/s, above 100/s.
    snapshot.gpus[0].nvlinks[2].crc_flit = Some(5000);
    rewrite(dir.path(), &snapshot);
    let out = node.run_after(Duration::from_secs(10));
    let errors = find(&out, "nvlink_errors", "0");
    assert_finding(errors, Status::Warn, RecommendedAction::None);
    assert_eq!(errors.labels["links"], "2");
    assert_eq!(errors.value, Some(500.0));
    // No new errors in the next interval: the rate is zero again.
    let out = node.run_after(Duration::from_secs(10));
    assert_eq!(find(&out, "nvlink_errors", "0").status, Status::Ok);
}

#[test]
fn xid_appears_on_rewrite_and_clears_after_the_window() {
    let (dir, mut snapshot) = scratch_copy("healthy");
    let mut config = config(dir.path());
    config.xid_window = Duration::from_secs(600);
    let mut node = Node::new(&config, dir.path());
    assert_eq!(find(&node.run(), "xid", "4").status, Status::Ok);

    snapshot.gpus[4].xid_counts.insert(79, 1);
    rewrite(dir.path(), &snapshot);
    let out = node.run_after(Duration::from_secs(10));
    assert_finding(find(&out, "xid", "4"), Status::Fail, RecommendedAction::Reboot);

    let out = node.run_after(Duration::from_secs(590));
    assert_eq!(find(&out, "xid", "4").status, Status::Fail, "still within the window");
    let out = node.run_after(Duration::from_secs(10));
    let xid = find(&out, "xid", "4");
    assert_finding(xid, Status::Ok, RecommendedAction::None);
    assert_eq!(xid.labels["xid"], "79", "the cleared finding names the code it clears");

    snapshot.gpus[4].xid_counts.insert(79, 2);
    rewrite(dir.path(), &snapshot);
    let out = node.run_after(Duration::from_secs(10));
    assert_eq!(find(&out, "xid", "4").status, Status::Fail, "a new occurrence");
}

#[test]
fn xid_actions_in_config_override_the_catalog() {
    let dir = fixture("gpu_xid79");
    let mut config = config(&dir);
    config.xid_actions.insert("79".into(), RecommendedAction::Replace);
    let mut node = Node::new(&config, &dir);
    let out = node.run();
    assert_finding(find(&out, "xid", "3"), Status::Fail, RecommendedAction::Replace);
}

#[test]
fn malformed_fixture_is_unknown_not_a_panic() {
    let dir = fixture("gpu_malformed");
    let mut node = Node::new(&config(&dir), &dir);
    let out = node.run();
    assert_eq!(out.findings.len(), 1, "{:#?}", out.findings);
    let backend = find(&out, "gpu_backend", "");
    assert_finding(backend, Status::Unknown, RecommendedAction::None);
    assert!(backend.message.starts_with("parsing GPU fixture"), "{}", backend.message);
    assert!(backend.message.contains("gpu_malformed/gpu.json"), "{}", backend.message);
}

#[test]
fn wrong_types_and_a_missing_file_are_unknown_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::new(&config(dir.path()), dir.path());

    let out = node.run();
    let backend = find(&out, "gpu_backend", "");
    assert_eq!(backend.status, Status::Unknown);
    assert!(backend.message.starts_with("reading GPU fixture"), "{}", backend.message);
    assert!(backend.message.contains("No such file"), "{}", backend.message);

    std::fs::write(
        dir.path().join("gpu.json"),
        r#"{"gpus":[{"index":0,"temperature_celsius":"hot"}]}"#,
    )
    .unwrap();
    let out = node.run();
    let backend = find(&out, "gpu_backend", "");
    assert_eq!(backend.status, Status::Unknown);
    assert!(backend.message.contains("invalid type"), "{}", backend.message);

    std::fs::write(dir.path().join("gpu.json"), "[1, 2, 3]").unwrap();
    assert_eq!(find(&node.run(), "gpu_backend", "").status, Status::Unknown);

    // Fixed: read on the next run.
    std::fs::copy(fixture("healthy").join("gpu.json"), dir.path().join("gpu.json")).unwrap();
    let out = node.run();
    assert!(not_ok(&out).is_empty(), "{:#?}", not_ok(&out));
}

#[test]
fn nvml_library_missing_is_unknown_nvml_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let config = GpuConfig {
        backend: parse_backend("nvml:/nonexistent/libnvidia-ml.so.1").unwrap(),
        expected_count: Some(8),
        ..GpuConfig::default()
    };
    let mut node = Node::new(&config, dir.path());
    for _ in 0..2 {
        // Init is retried on every run and fails the same way each time.
        let out = node.run_after(Duration::from_secs(10));
        assert_eq!(out.findings.len(), 1, "{:#?}", out.findings);
        let backend = find(&out, "gpu_backend", "");
        assert_finding(backend, Status::Unknown, RecommendedAction::None);
        assert!(backend.message.starts_with("NVML unavailable"), "{}", backend.message);
    }
}

#[test]
fn default_nvml_backend_never_crashes() {
    // On a machine without the NVIDIA driver (CI, this one) this is "NVML unavailable"; on a GPU
    // machine the backend must read GPUs and report them.
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::new(&GpuConfig::default(), dir.path());
    let out = node.run();
    let backend = find(&out, "gpu_backend", "");
    match backend.status {
        Status::Unknown => {
            assert!(backend.message.starts_with("NVML unavailable"), "{}", backend.message)
        }
        Status::Ok => assert!(find(&out, "gpu_count", "").value.is_some()),
        other => panic!("unexpected {other}: {}", backend.message),
    }
}

#[test]
fn none_backend_reports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = GpuConfig { backend: parse_backend("none").unwrap(), ..GpuConfig::default() };
    let mut node = Node::new(&config, dir.path());
    assert_eq!(node.run(), Observation::default());
}

#[test]
fn dump_snapshot_writes_the_fixture_format() {
    let spec = parse_backend(&format!("fixture:{}", fixture("healthy").join("gpu.json").display()))
        .unwrap();
    let text = dump_snapshot(&spec).unwrap();
    let dumped: GpuSnapshot = serde_json::from_str(&text).unwrap();
    let original: GpuSnapshot = serde_json::from_str(
        &std::fs::read_to_string(fixture("healthy").join("gpu.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(dumped, original);
    assert!(dump_snapshot(&GpuBackendSpec::None).is_err());
    let err =
        dump_snapshot(&parse_backend("nvml:/nonexistent/libnvidia-ml.so.1").unwrap()).unwrap_err();
    assert!(err.to_string().starts_with("NVML unavailable"), "{err}");
}

/// What NVML read on a real NVIDIA H200 (driver 580.159.04; `fleetmend agent --dump-gpu` on a
/// one-GPU machine without NVLink): the check finds it healthy and exports what NVML said.
#[test]
fn a_real_h200_snapshot_is_healthy() {
    let dir = fixture("real_h200");
    let config = GpuConfig { expected_count: Some(1), ..config(&dir) };
    let mut node = Node::new(&config, &dir);
    for out in [node.run(), node.run_after(Duration::from_secs(10))] {
        assert!(not_ok(&out).is_empty(), "{:#?}", not_ok(&out));
        assert_eq!(find(&out, "gpu_count", "").value, Some(1.0));
        assert_eq!(find(&out, "pcie_link", "0").message, "PCIe link x16 of x16");
        assert_eq!(find(&out, "xid", "0").labels["pci"], "00000000:00:06.0");
    }
    let text = metrics::encode(&node.run().samples);
    for line in [
        "fleetmend_gpu_memory_total_bytes{gpu=\"0\"} 150754820096",
        "fleetmend_gpu_clock_hertz{gpu=\"0\",clock=\"memory\"} 3201000000",
        "fleetmend_gpu_throttle_active{gpu=\"0\",reason=\"gpu_idle\"} 1",
        "fleetmend_gpu_pcie_replays_total{gpu=\"0\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    assert!(text.contains("name=\"NVIDIA H200\""), "{text}");
}
