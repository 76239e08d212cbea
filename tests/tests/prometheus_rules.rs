//! The shipped Prometheus and Alertmanager configs against the real tools (Debian's `prometheus`
//! and `prometheus-alertmanager`, which scripts/test installs): `promtool check config`,
//! `promtool check rules`, `promtool test rules`, `amtool check-config`; every alert has a unit
//! test; and every metric the rules use is one the agent or the repairer exports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use fleetmend_tests::{metric_names, workspace_root};

fn deploy(path: &str) -> PathBuf {
    workspace_root().join("deploy").join(path)
}

/// Runs `program args` in `dir` and asserts it exits 0, showing its output otherwise.
fn assert_succeeds(program: &str, args: &[&str], dir: &Path) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|err| panic!("running {program} (scripts/test installs it): {err}"));
    assert!(
        output.status.success(),
        "{program} {args:?} exited with {}:\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn promtool_accepts_the_prometheus_config_and_rules() {
    let prometheus = deploy("prometheus");
    // check config also checks the rule files it names.
    assert_succeeds("promtool", &["check", "config", "prometheus.yml"], &prometheus);
    assert_succeeds("promtool", &["check", "rules", "rules/fleetmend.rules.yml"], &prometheus);
}

#[test]
fn promtool_rule_tests_pass() {
    assert_succeeds(
        "promtool",
        &["test", "rules", "fleetmend.rules.test.yml"],
        &deploy("prometheus/rules"),
    );
}

#[test]
fn amtool_accepts_the_alertmanager_config() {
    assert_succeeds("amtool", &["check-config", "alertmanager.yml"], &deploy("alertmanager"));
}

/// The value after `key:` on lines that start with it (after indentation and a list dash).
fn values_of(text: &str, key: &str) -> BTreeSet<String> {
    text.lines()
        .map(|l| l.trim_start().trim_start_matches("- ").trim_start())
        .filter_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().trim_matches(['"', '\'']).to_owned())
        .collect()
}

#[test]
fn every_alert_has_a_rule_test() {
    let rules = std::fs::read_to_string(deploy("prometheus/rules/fleetmend.rules.yml")).unwrap();
    let tests =
        std::fs::read_to_string(deploy("prometheus/rules/fleetmend.rules.test.yml")).unwrap();
    let alerts = values_of(&rules, "alert:");
    assert!(alerts.len() >= 10, "too few alerts parsed: {alerts:?}");
    let tested = values_of(&tests, "alertname:");
    let untested: Vec<&String> = alerts.difference(&tested).collect();
    assert!(untested.is_empty(), "alerts without a test in fleetmend.rules.test.yml: {untested:?}");
    let unknown: Vec<&String> = tested.difference(&alerts).collect();
    assert!(unknown.is_empty(), "tests of alerts that do not exist: {unknown:?}");
}

/// The base name of a histogram or summary series.
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name)
}

/// The metric families the agent and the repairer export: the `# TYPE` lines of the agent's golden
/// `/metrics` and the repairer's metric name constants (read from its source, so a new constant
/// counts without touching this test).
fn exported() -> BTreeSet<String> {
    let root = workspace_root();
    let golden = std::fs::read_to_string(root.join("tests/golden/agent_healthy.metrics")).unwrap();
    let mut names: BTreeSet<String> = golden
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let repairer = std::fs::read_to_string(root.join("repairer/src/metrics.rs")).unwrap();
    for line in repairer.lines().filter(|l| l.starts_with("pub const ") && l.contains(": &str")) {
        names.extend(metric_names(line));
    }
    // A constant the repairer really has: guards against this parse silently finding nothing.
    assert!(names.contains(fleetmend_repairer::metrics::BREAKER_OPEN), "{names:?}");
    assert!(names.contains("fleetmend_gpu_xid_errors_total"), "{names:?}");
    names
}

fn unknown_metrics(text: &str, exported: &BTreeSet<String>) -> Vec<String> {
    metric_names(text).into_iter().filter(|n| !exported.contains(family(n))).collect()
}

#[test]
fn the_rules_use_only_exported_metrics() {
    let exported = exported();
    for file in
        ["prometheus/rules/fleetmend.rules.yml", "prometheus/rules/fleetmend.rules.test.yml"]
    {
        let text = std::fs::read_to_string(deploy(file)).unwrap();
        let used = metric_names(&text);
        assert!(used.len() >= 10, "{file}: too few metric names parsed: {used:?}");
        let unknown = unknown_metrics(&text, &exported);
        assert!(unknown.is_empty(), "{file} uses metrics nobody exports: {unknown:?}");
    }
}

#[test]
fn the_metric_check_catches_an_unknown_name() {
    let exported = exported();
    let expr = "rate(fleetmend_time_to_drain_seconds_bucket[5m]) + fleetmend:x:rate5m \
                + fleetmend_gpu_xid_error_total";
    assert_eq!(unknown_metrics(expr, &exported), ["fleetmend_gpu_xid_error_total"]);
}
