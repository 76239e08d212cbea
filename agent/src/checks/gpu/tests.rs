//! The gpu check's judgement of whole backend readings, run after run.

#![allow(clippy::unwrap_used)]

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
            .find(|f| f.finding == "xid" && f.labels.get("xid").map(String::as_str) == Some(code))
            .unwrap()
    };
    assert_eq!(
        (by_code("79").status, by_code("79").action),
        (Status::Fail, RecommendedAction::Replace)
    );
    assert_eq!((by_code("13").status, by_code("13").action), (Status::Ok, RecommendedAction::None));
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
    g.remapped_rows =
        Some(RemappedRows { correctable: 0, uncorrectable: 512, pending: true, failure: false });
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
