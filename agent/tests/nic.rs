//! The nic check against fixture sysfs trees (and, lightly, this machine's real /sys).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::{Duration, SystemTime};

use fleetmend_agent::checks::nic::{NicCheck, NicConfig};
use fleetmend_agent::checks::{Mode, Observation};
use fleetmend_agent::config::HostPaths;
use fleetmend_agent::metrics;
use fleetmend_proto::{RecommendedAction, Status};
use support::{
    assert_finding, build_context, copy_case, find, fixture, not_ok, run, run_at, sample,
};

fn build(config: &NicConfig, paths: &HostPaths) -> NicCheck {
    NicCheck::new(config, build_context(paths, Mode::Daemon))
}

fn once(case: &str, config: &NicConfig) -> Observation {
    let paths = HostPaths::tree(&fixture(case));
    run(&mut build(config, &paths), &paths)
}

#[test]
fn healthy_node_is_all_ok() {
    let config = NicConfig {
        required: vec!["eth0".into(), "ib0".into()],
        expected_speed_mbps: [("eth0".to_owned(), 100_000)].into(),
        expected_mtu: [("eth0".to_owned(), 9000)].into(),
        ..NicConfig::default()
    };
    let obs = once("healthy", &config);
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
    for finding in ["nic_down", "nic_missing", "nic_speed", "nic_mtu", "nic_flapping", "nic_errors"]
    {
        find(&obs, finding, "eth0");
    }
    find(&obs, "ib_port_down", "mlx5_0/1");
    // Ignored interfaces are not looked at at all.
    assert!(obs.findings.iter().all(|f| f.subject != "lo" && f.subject != "docker0"));
    let eth0 = [("device", "eth0")];
    assert_eq!(sample(&obs, metrics::NIC_UP.name, &eth0), Some(1.0));
    assert_eq!(sample(&obs, metrics::NIC_SPEED.name, &eth0), Some(100_000.0 * 125_000.0));
    assert_eq!(sample(&obs, metrics::NIC_MTU.name, &eth0), Some(9000.0));
    assert_eq!(sample(&obs, metrics::NIC_CARRIER_CHANGES.name, &eth0), Some(2.0));
    assert_eq!(
        sample(&obs, metrics::NIC_ERRORS.name, &[("device", "eth0"), ("direction", "tx")]),
        Some(0.0)
    );
    let port = [("device", "mlx5_0"), ("port", "1")];
    assert_eq!(sample(&obs, metrics::IB_PORT_UP.name, &port), Some(1.0));
    assert_eq!(sample(&obs, metrics::IB_PORT_RATE.name, &port), Some(50e9));
    assert_eq!(sample(&obs, metrics::IB_LINK_DOWNED.name, &port), Some(0.0));
}

#[test]
fn required_interface_down_fails_with_drain() {
    let config = NicConfig { required: vec!["ens1".into()], ..NicConfig::default() };
    let obs = once("nic_down", &config);
    let down = find(&obs, "nic_down", "ens1");
    assert_finding(down, Status::Fail, RecommendedAction::Drain);
    assert!(down.message.contains("operstate=down"), "{}", down.message);
    assert_eq!(not_ok(&obs).len(), 1, "{:#?}", not_ok(&obs));
    assert_eq!(sample(&obs, metrics::NIC_UP.name, &[("device", "ens1")]), Some(0.0));
    // speed -1: absent, not garbage.
    assert_eq!(sample(&obs, metrics::NIC_SPEED.name, &[("device", "ens1")]), None);
    assert_eq!(find(&obs, "nic_unreadable", "ens1").status, Status::Ok);
}

#[test]
fn unrequired_interface_down_is_ok() {
    let obs = once("nic_down", &NicConfig::default());
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
    assert_eq!(find(&obs, "nic_down", "ens1").status, Status::Ok);
    assert_eq!(sample(&obs, metrics::NIC_UP.name, &[("device", "ens1")]), Some(0.0));
}

#[test]
fn required_interface_is_looked_at_even_when_ignored() {
    let config = NicConfig { required: vec!["docker0".into()], ..NicConfig::default() };
    let obs = once("nic_down", &config);
    assert_eq!(find(&obs, "nic_down", "docker0").status, Status::Fail);
    let all = NicConfig { ignore: String::new(), ..NicConfig::default() };
    let obs = once("nic_down", &all);
    assert_eq!(find(&obs, "nic_down", "docker0").status, Status::Ok);
}

#[test]
fn required_interface_missing_fails() {
    let config = NicConfig { required: vec!["eth0".into(), "ens9".into()], ..NicConfig::default() };
    let obs = once("healthy", &config);
    let missing = find(&obs, "nic_missing", "ens9");
    assert_finding(missing, Status::Fail, RecommendedAction::Drain);
    assert_eq!(find(&obs, "nic_missing", "eth0").status, Status::Ok);
    assert_eq!(not_ok(&obs).len(), 1, "{:#?}", not_ok(&obs));
}

#[test]
fn wrong_speed_and_mtu_warn() {
    let config = NicConfig {
        expected_speed_mbps: [("eth0".to_owned(), 200_000)].into(),
        expected_mtu: [("eth0".to_owned(), 4200)].into(),
        ..NicConfig::default()
    };
    let obs = once("healthy", &config);
    assert_eq!(find(&obs, "nic_speed", "eth0").status, Status::Warn);
    assert_eq!(find(&obs, "nic_mtu", "eth0").status, Status::Warn);
}

#[test]
fn carrier_flaps_within_the_window_warn_and_clear() {
    let dir = copy_case("nic_flapping");
    let paths = HostPaths::tree(dir.path());
    let mut check = build(&NicConfig::default(), &paths);
    let t0 = SystemTime::now();
    let obs = run_at(&mut check, &paths, t0);
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));

    let eth0 = dir.path().join("sys/class/net/eth0");
    std::fs::write(eth0.join("carrier_changes"), "5\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(60));
    assert_eq!(find(&obs, "nic_flapping", "eth0").status, Status::Ok, "3 changes are below 5");
    std::fs::write(eth0.join("carrier_changes"), "8\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(120));
    let flapping = find(&obs, "nic_flapping", "eth0");
    assert_finding(flapping, Status::Warn, RecommendedAction::None);
    assert_eq!(flapping.value, Some(6.0));
    // A day later with no further changes the window holds none.
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(24 * 3600 + 121));
    assert_eq!(find(&obs, "nic_flapping", "eth0").status, Status::Ok);

    let port = dir.path().join("sys/class/infiniband/mlx5_0/ports/1/counters/link_downed");
    std::fs::write(&port, "4\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(24 * 3600 + 200));
    assert_eq!(find(&obs, "ib_flapping", "mlx5_0/1").status, Status::Warn);
}

#[test]
fn error_rates_warn() {
    let dir = copy_case("healthy");
    let paths = HostPaths::tree(dir.path());
    let mut check = build(&NicConfig::default(), &paths);
    let t0 = SystemTime::now();
    run_at(&mut check, &paths, t0);
    std::fs::write(dir.path().join("sys/class/net/eth0/statistics/rx_errors"), "100\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(10));
    let errors = find(&obs, "nic_errors", "eth0");
    assert_eq!(errors.status, Status::Warn, "{errors:?}");
    assert!(errors.message.contains("rx_errors 10.0/s"), "{}", errors.message);
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(20));
    assert_eq!(find(&obs, "nic_errors", "eth0").status, Status::Ok);
}

/// A copy of the healthy case and a check on it: (dir, paths, check, counters dir of mlx5_0/1).
fn ib_case() -> (tempfile::TempDir, HostPaths, NicCheck, std::path::PathBuf) {
    let dir = copy_case("healthy");
    let paths = HostPaths::tree(dir.path());
    let check = build(&NicConfig::default(), &paths);
    let counters = dir.path().join("sys/class/infiniband/mlx5_0/ports/1/counters");
    (dir, paths, check, counters)
}

#[test]
fn ib_link_downed_warns_after_a_rise_for_the_window_then_clears() {
    let (_dir, paths, mut check, counters) = ib_case();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let obs = run_at(&mut check, &paths, t0);
    assert_eq!(find(&obs, "ib_link_downed", "mlx5_0/1").status, Status::Ok);

    std::fs::write(counters.join("link_downed"), "2\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(10));
    let downed = find(&obs, "ib_link_downed", "mlx5_0/1");
    assert_finding(downed, Status::Warn, RecommendedAction::None);
    assert!(
        downed.message.contains("went down 2 time(s) since the last read"),
        "{}",
        downed.message
    );
    assert_eq!(downed.value, Some(2.0));
    // The port is up again: only the drop is reported.
    assert_eq!(find(&obs, "ib_port_down", "mlx5_0/1").status, Status::Ok);

    // No further rise: still warning within 15 minutes of the rise, ok after.
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(10 + 14 * 60));
    let downed = find(&obs, "ib_link_downed", "mlx5_0/1");
    assert_eq!(downed.status, Status::Warn);
    assert!(downed.message.contains("14m ago"), "{}", downed.message);
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(10 + 15 * 60));
    assert_eq!(find(&obs, "ib_link_downed", "mlx5_0/1").status, Status::Ok);

    // A counter that went back (driver reload) is a new baseline, not a drop.
    std::fs::write(counters.join("link_downed"), "0\n").unwrap();
    let obs = run_at(&mut check, &paths, t0 + Duration::from_secs(20 * 60));
    assert_eq!(find(&obs, "ib_link_downed", "mlx5_0/1").status, Status::Ok);
}

#[test]
fn ib_symbol_errors_are_judged_per_hour_not_by_their_total() {
    let (_dir, paths, mut check, counters) = ib_case();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let minutes = |m: u64| t0 + Duration::from_secs(m * 60);
    // Thousands from before the agent looked are the baseline.
    std::fs::write(counters.join("symbol_error"), "4000\n").unwrap();
    let obs = run_at(&mut check, &paths, t0);
    assert_eq!(find(&obs, "ib_symbol_errors", "mlx5_0/1").status, Status::Ok);

    std::fs::write(counters.join("symbol_error"), "4005\n").unwrap();
    let obs = run_at(&mut check, &paths, minutes(30));
    let symbols = find(&obs, "ib_symbol_errors", "mlx5_0/1");
    assert_eq!((symbols.status, symbols.value), (Status::Ok, Some(5.0)), "{symbols:#?}");
    let obs = run_at(&mut check, &paths, minutes(60));
    assert_eq!(find(&obs, "ib_symbol_errors", "mlx5_0/1").status, Status::Ok);

    std::fs::write(counters.join("symbol_error"), "4105\n").unwrap();
    let obs = run_at(&mut check, &paths, minutes(120));
    let symbols = find(&obs, "ib_symbol_errors", "mlx5_0/1");
    assert_finding(symbols, Status::Warn, RecommendedAction::None);
    assert_eq!(symbols.value, Some(100.0), "the 5 of the first hour are out of the window");
    assert!(
        symbols.message.contains("100 symbol error(s) within the last hour"),
        "{}",
        symbols.message
    );

    // An hour without new errors clears it.
    let obs = run_at(&mut check, &paths, minutes(181));
    assert_eq!(find(&obs, "ib_symbol_errors", "mlx5_0/1").status, Status::Ok);
}

#[test]
fn ib_receive_errors_are_a_rate_and_a_reset_is_not_one() {
    let (_dir, paths, mut check, counters) = ib_case();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let seconds = |s: u64| t0 + Duration::from_secs(s);
    std::fs::write(counters.join("port_rcv_errors"), "1000\n").unwrap();
    let obs = run_at(&mut check, &paths, t0);
    assert_eq!(find(&obs, "ib_receive_errors", "mlx5_0/1").status, Status::Ok);

    std::fs::write(counters.join("port_rcv_errors"), "1050\n").unwrap();
    let obs = run_at(&mut check, &paths, seconds(10));
    let receive = find(&obs, "ib_receive_errors", "mlx5_0/1");
    assert_finding(receive, Status::Warn, RecommendedAction::None);
    assert_eq!(receive.value, Some(5.0));

    let obs = run_at(&mut check, &paths, seconds(20));
    assert_eq!(find(&obs, "ib_receive_errors", "mlx5_0/1").status, Status::Ok);
    std::fs::write(counters.join("port_rcv_errors"), "3\n").unwrap();
    let obs = run_at(&mut check, &paths, seconds(30));
    let receive = find(&obs, "ib_receive_errors", "mlx5_0/1");
    assert_eq!((receive.status, receive.value), (Status::Ok, None), "{receive:#?}");
}

#[test]
fn ib_port_down_fails_with_drain() {
    let obs = once("ib_port_down", &NicConfig::default());
    let down = find(&obs, "ib_port_down", "mlx5_1/1");
    assert_finding(down, Status::Fail, RecommendedAction::Drain);
    assert_eq!(find(&obs, "ib_port_down", "mlx5_0/1").status, Status::Ok);
    assert_eq!(not_ok(&obs).len(), 1, "{:#?}", not_ok(&obs));
    let port = [("device", "mlx5_1"), ("port", "1")];
    assert_eq!(sample(&obs, metrics::IB_PORT_UP.name, &port), Some(0.0));
    assert_eq!(sample(&obs, metrics::IB_LINK_DOWNED.name, &port), Some(2.0));

    // Only the listed ports must be up; a listed one that is not there fails.
    let config =
        NicConfig { required_ib: vec!["mlx5_0/1".into(), "mlx5_2".into()], ..NicConfig::default() };
    let obs = once("ib_port_down", &config);
    assert_eq!(find(&obs, "ib_port_down", "mlx5_1/1").status, Status::Ok);
    let missing = find(&obs, "ib_port_missing", "mlx5_2");
    assert_finding(missing, Status::Fail, RecommendedAction::Drain);
}

#[test]
fn truncated_files_are_unknown_and_the_rest_is_reported() {
    let config = NicConfig { required: vec!["eth0".into()], ..NicConfig::default() };
    let obs = once("nic_truncated", &config);
    let unreadable = find(&obs, "nic_unreadable", "eth0");
    assert_eq!(unreadable.status, Status::Unknown);
    for file in ["speed", "mtu", "statistics/rx_errors"] {
        assert!(unreadable.message.contains(file), "{file} not named: {}", unreadable.message);
    }
    assert_eq!(find(&obs, "nic_down", "eth0").status, Status::Ok);
    let eth0 = [("device", "eth0")];
    assert_eq!(sample(&obs, metrics::NIC_SPEED.name, &eth0), None);
    assert_eq!(sample(&obs, metrics::NIC_MTU.name, &eth0), None);
    assert_eq!(sample(&obs, metrics::NIC_UP.name, &eth0), Some(1.0));
    assert_eq!(
        sample(&obs, metrics::NIC_ERRORS.name, &[("device", "eth0"), ("direction", "tx")]),
        Some(0.0)
    );
    let ib = find(&obs, "ib_unreadable", "mlx5_0/1");
    assert_eq!(ib.status, Status::Unknown);
    assert!(
        ib.message.contains("rate") && ib.message.contains("counters/symbol_error"),
        "{}",
        ib.message
    );
    assert_eq!(find(&obs, "ib_port_down", "mlx5_0/1").status, Status::Ok);
    assert!(obs.findings.iter().all(|f| f.status != Status::Fail), "{:#?}", not_ok(&obs));
}

#[test]
fn absent_sysfs_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    let obs = run(&mut build(&NicConfig::default(), &paths), &paths);
    assert_eq!(find(&obs, "nic_unreadable", "").status, Status::Unknown);
    assert!(obs.findings.iter().all(|f| f.status != Status::Fail));
}

/// This machine's /sys: loopback is always there and up (operstate "unknown", carrier 1, and
/// `speed` refused with EINVAL).
#[test]
fn real_sysfs_loopback_is_up() {
    let paths = HostPaths::default();
    if !Path::new("/sys/class/net/lo").exists() {
        return;
    }
    let config = NicConfig { required: vec!["lo".into()], ..NicConfig::default() };
    let obs = run(&mut build(&config, &paths), &paths);
    assert_eq!(find(&obs, "nic_down", "lo").status, Status::Ok, "{:#?}", obs.findings);
    assert_eq!(find(&obs, "nic_unreadable", "lo").status, Status::Ok);
    assert_eq!(sample(&obs, metrics::NIC_UP.name, &[("device", "lo")]), Some(1.0));
}

#[test]
fn config_reads_from_toml_and_bad_values_name_their_fields() {
    let config = fleetmend_agent::config::AgentConfig::parse(
        r#"
[checks.nic]
required = ["eth0"]
ignore = "^(lo|docker0)$"
expected_speed_mbps = { eth0 = 100000 }
expected_mtu = { eth0 = 9000 }
flap_window = "12h"
flap_max = 4
max_errors_per_second = 0.5
max_drops_per_second = 50
required_ib = ["mlx5_0/1", "mlx5_1"]
ib_flap_window = "1h"
ib_flap_max = 2
ib_link_downed_window = "30m"
ib_symbol_errors_warn_per_hour = 50
ib_receive_errors_warn_per_second = 0.5
"#,
    )
    .unwrap();
    assert!(config.validate().is_empty(), "{}", config.validate());
    assert_eq!(config.checks.nic.flap_window, Duration::from_secs(12 * 3600));
    assert_eq!(config.checks.nic.expected_speed_mbps.get("eth0"), Some(&100_000));
    assert_eq!(config.checks.nic.ib_link_downed_window, Duration::from_secs(30 * 60));
    assert_eq!(config.checks.nic.ib_symbol_errors_warn_per_hour, 50.0);
    let defaults = NicConfig::default();
    assert_eq!(defaults.ib_link_downed_window, Duration::from_secs(15 * 60));
    assert_eq!(defaults.ib_symbol_errors_warn_per_hour, 10.0);
    assert_eq!(defaults.ib_receive_errors_warn_per_second, 1.0);

    let bad = fleetmend_agent::config::AgentConfig::parse(
        "[checks.nic]\nignore = \"(\"\nflap_window = \"0s\"\nrequired_ib = [\"mlx5_0/x\"]\n\
         ib_link_downed_window = \"0s\"\nib_symbol_errors_warn_per_hour = -1\n",
    )
    .unwrap();
    let problems = bad.validate();
    let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "checks.nic.ignore",
            "checks.nic.flap_window",
            "checks.nic.ib_link_downed_window",
            "checks.nic.ib_symbol_errors_warn_per_hour",
            "checks.nic.required_ib[0]"
        ],
        "{problems}"
    );
}
