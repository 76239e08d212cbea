//! The host check against fixture procfs/sysfs trees, and once against this machine's own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use fleetmend_agent::checks::host::{HostCheck, HostConfig, findings};
use fleetmend_agent::checks::{Mode, Observation};
use fleetmend_agent::config::HostPaths;
use fleetmend_proto::{RecommendedAction, Status};
use support::{assert_finding, build_context, find, fixture, run, run_at, sample};

fn host_paths(procfs: PathBuf, sysfs: PathBuf) -> HostPaths {
    HostPaths { procfs, sysfs, ..HostPaths::default() }
}

/// The healthy fixture node: 192 CPUs, slurmd and the fabric manager running.
fn node_config() -> HostConfig {
    HostConfig {
        expected_cpus: Some(192),
        max_load_per_cpu: Some(1.0),
        required_processes: vec!["slurmd".to_owned(), "nv-fabricmanager".to_owned()],
        ..HostConfig::default()
    }
}

fn build(config: &HostConfig, paths: &HostPaths) -> HostCheck {
    HostCheck::new(config, build_context(paths, Mode::Once))
}

fn run_once(config: &HostConfig, paths: &HostPaths) -> Observation {
    run(&mut build(config, paths), paths)
}

#[test]
fn healthy_node_is_all_ok() {
    let paths = host_paths(fixture("healthy/proc"), fixture("healthy/sys"));
    let obs = run_once(&node_config(), &paths);

    for f in &obs.findings {
        assert_eq!(f.status, Status::Ok, "{f:#?}");
    }
    for (id, subject) in [
        (findings::MEMORY_LOW, ""),
        (findings::SWAP_HIGH, ""),
        (findings::LOAD_HIGH, ""),
        (findings::CPU_OFFLINE, ""),
        (findings::PROCESS_MISSING, "slurmd"),
        // comm is truncated to "nv-fabricmanage"; the command line confirms the full name.
        (findings::PROCESS_MISSING, "nv-fabricmanager"),
        (findings::EDAC_UNCORRECTED, "mc0"),
        (findings::EDAC_UNCORRECTED, "mc1"),
        (findings::EDAC_CORRECTED, "mc0"),
        (findings::EDAC_CORRECTED, "mc1"),
    ] {
        find(&obs, id, subject);
    }
    let total = 2_113_655_536.0 * 1024.0;
    assert_eq!(sample(&obs, "fleetmend_host_memory_total_bytes", &[]), Some(total));
    assert_eq!(
        sample(&obs, "fleetmend_host_memory_available_bytes", &[]),
        Some(1_987_654_321.0 * 1024.0)
    );
    assert_eq!(sample(&obs, "fleetmend_host_swap_total_bytes", &[]), Some(0.0));
    assert_eq!(sample(&obs, "fleetmend_host_cpus", &[]), Some(192.0));
    assert_eq!(sample(&obs, "fleetmend_host_load_average", &[("window", "5m")]), Some(11.87));
    assert_eq!(
        sample(&obs, "fleetmend_host_process_running", &[("process", "nv-fabricmanager")]),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &obs,
            "fleetmend_host_edac_errors_total",
            &[("controller", "mc1"), ("kind", "corrected")]
        ),
        Some(3.0)
    );
    assert_eq!(find(&obs, findings::CPU_OFFLINE, "").value, Some(192.0));
}

#[test]
fn uncorrected_edac_errors_fail_with_replace() {
    let paths = host_paths(fixture("healthy/proc"), fixture("edac_uncorrected/sys"));
    let obs = run_once(&node_config(), &paths);

    let ue = find(&obs, findings::EDAC_UNCORRECTED, "mc1");
    assert_finding(ue, Status::Fail, RecommendedAction::Replace);
    assert_eq!(ue.value, Some(2.0));
    assert_finding(
        find(&obs, findings::EDAC_UNCORRECTED, "mc0"),
        Status::Ok,
        RecommendedAction::None,
    );
    assert_eq!(
        sample(
            &obs,
            "fleetmend_host_edac_errors_total",
            &[("controller", "mc1"), ("kind", "uncorrected")]
        ),
        Some(2.0)
    );
}

#[test]
fn missing_required_process_fails_with_the_configured_action() {
    let paths = host_paths(fixture("healthy/proc"), fixture("healthy/sys"));
    let config = HostConfig {
        required_processes: vec!["slurmd".to_owned(), "nvidia-persistenced".to_owned()],
        ..node_config()
    };
    let obs = run_once(&config, &paths);
    let missing = find(&obs, findings::PROCESS_MISSING, "nvidia-persistenced");
    assert_finding(missing, Status::Fail, RecommendedAction::Drain);
    assert_finding(
        find(&obs, findings::PROCESS_MISSING, "slurmd"),
        Status::Ok,
        RecommendedAction::None,
    );
    assert_eq!(
        sample(&obs, "fleetmend_host_process_running", &[("process", "nvidia-persistenced")]),
        Some(0.0)
    );

    let config = HostConfig { missing_process_action: RecommendedAction::Reboot, ..config };
    let obs = run_once(&config, &paths);
    assert_finding(
        find(&obs, findings::PROCESS_MISSING, "nvidia-persistenced"),
        Status::Fail,
        RecommendedAction::Reboot,
    );
}

#[test]
fn truncated_comm_needs_the_command_line_to_agree() {
    let procfs = tempfile::tempdir().unwrap();
    let process = |pid: &str, comm: &str, cmdline: Option<&[u8]>| {
        let dir = procfs.path().join(pid);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        if let Some(cmdline) = cmdline {
            fs::write(dir.join("cmdline"), cmdline).unwrap();
        }
    };
    // Same 15-byte comm, another program.
    process("10", "nv-fabricmanage", Some(b"/opt/nv-fabricmanager-old\0-c\0"));
    let paths = host_paths(procfs.path().to_owned(), fixture("healthy/sys"));
    let config = HostConfig {
        required_processes: vec!["nv-fabricmanager".to_owned()],
        ..HostConfig::default()
    };
    let obs = run_once(&config, &paths);
    assert_eq!(find(&obs, findings::PROCESS_MISSING, "nv-fabricmanager").status, Status::Fail);

    process("11", "nv-fabricmanage", Some(b"/usr/bin/nv-fabricmanager\0-c\0x.cfg\0"));
    let obs = run_once(&config, &paths);
    assert_eq!(find(&obs, findings::PROCESS_MISSING, "nv-fabricmanager").status, Status::Ok);
}

#[test]
fn fewer_cpus_than_expected_fail_with_reboot() {
    let paths = host_paths(fixture("healthy/proc"), fixture("host_cpus_offline/sys"));
    let obs = run_once(&node_config(), &paths);
    let cpus = find(&obs, findings::CPU_OFFLINE, "");
    assert_finding(cpus, Status::Fail, RecommendedAction::Reboot);
    assert_eq!(cpus.value, Some(191.0));
    assert!(cpus.message.contains("191 of 192"), "{}", cpus.message);
    // No EDAC directory in this tree: absent, so no EDAC findings at all.
    assert!(obs.findings.iter().all(|f| !f.finding.starts_with("edac")), "{:#?}", obs.findings);
}

#[test]
fn garbage_files_are_unknown_findings_naming_the_file() {
    let paths = host_paths(fixture("host_garbage/proc"), fixture("host_garbage/sys"));
    let obs = run_once(&node_config(), &paths);

    for (id, subject, file) in [
        (findings::MEMORY_LOW, "", "meminfo"),
        (findings::SWAP_HIGH, "", "meminfo"),
        (findings::CPU_OFFLINE, "", "cpu/online"),
        (findings::LOAD_HIGH, "", "loadavg"),
        (findings::EDAC_CORRECTED, "mc0", "ce_count"),
        (findings::EDAC_UNCORRECTED, "mc0", "ue_count"),
    ] {
        let f = find(&obs, id, subject);
        assert_finding(f, Status::Unknown, RecommendedAction::None);
        assert!(f.message.contains(file), "{id}: {}", f.message);
    }
    assert_eq!(sample(&obs, "fleetmend_host_memory_total_bytes", &[]), None);
}

#[test]
fn corrected_errors_rising_fast_warn() {
    let sysfs = tempfile::tempdir().unwrap();
    let mc0 = sysfs.path().join("devices/system/edac/mc/mc0");
    fs::create_dir_all(&mc0).unwrap();
    fs::write(mc0.join("ue_count"), "0\n").unwrap();
    fs::write(mc0.join("ce_count"), "7\n").unwrap();
    let paths = host_paths(fixture("healthy/proc"), sysfs.path().to_owned());
    let config = HostConfig::default();
    let mut check = build(&config, &paths);
    let t0 = SystemTime::now();

    let obs = run_at(&mut check, &paths, t0);
    assert_eq!(find(&obs, findings::EDAC_CORRECTED, "mc0").status, Status::Ok);
    // 50 in ten minutes: under the default 100 per hour.
    fs::write(mc0.join("ce_count"), "57\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(600));
    assert_eq!(find(&obs, findings::EDAC_CORRECTED, "mc0").status, Status::Ok);
    // 150 more ten minutes later: 200 within the hour.
    fs::write(mc0.join("ce_count"), "207\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(1200));
    let ce = find(&obs, findings::EDAC_CORRECTED, "mc0");
    assert_finding(ce, Status::Warn, RecommendedAction::None);
    assert_eq!(ce.value, Some(200.0));
    // Corrected errors alone never fail the node.
    assert_eq!(find(&obs, findings::EDAC_UNCORRECTED, "mc0").status, Status::Ok);
}

#[test]
fn live_proc_and_sys_of_this_machine() {
    let paths = HostPaths::default();
    let obs = run_once(&HostConfig::default(), &paths);
    let total = sample(&obs, "fleetmend_host_memory_total_bytes", &[]).expect("memory total");
    assert!(total > 0.0, "{total}");
    assert_ne!(find(&obs, findings::MEMORY_LOW, "").status, Status::Unknown);
    assert!(sample(&obs, "fleetmend_host_cpus", &[]).unwrap() >= 1.0);
    assert!(sample(&obs, "fleetmend_host_load_average", &[("window", "1m")]).is_some());
    // A scan of the live process table finds this test's own process by its comm.
    let comm = fs::read_to_string("/proc/self/comm").unwrap().trim().to_owned();
    let config = HostConfig { required_processes: vec![comm.clone()], ..HostConfig::default() };
    let obs = run_once(&config, &paths);
    assert_eq!(find(&obs, findings::PROCESS_MISSING, &comm).status, Status::Ok);
}
