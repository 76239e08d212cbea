//! The Grafana dashboards in dashboards/: they type-check against Grafana's dashboard model
//! (dashboards/typecheck/check.sh: tsc with @grafana/schema; scripts/test installs node and npm),
//! they query through the `${datasource}` variable only, and every `fleetmend_...` metric they and
//! the Prometheus rules use is one a live fleet exports: `fleetmend up` runs a job on simulated
//! nodes and a fault is repaired, and the test reads the `# TYPE` lines of the repairer's and
//! every agent's `/metrics`; on a healthy fleet every series a panel reads has a sample within a
//! minute (a panel that says No data on a healthy fleet looks broken).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fleetmend_tests::{Up, http_get, metric_names, poll_until, run_with_timeout, workspace_root};
use serde_json::Value;

/// `npm ci` may download the pinned packages; tsc itself takes seconds.
const TYPECHECK_LIMIT: Duration = Duration::from_secs(300);
/// Longest the fleet may take to start, run the job and repair the fault on two loaded cores.
const LIVE_LIMIT: Duration = Duration::from_secs(240);
/// Once the fleet exports job and repair metrics, how long to keep scraping for the rest before
/// calling what is still missing unknown.
const SETTLE: Duration = Duration::from_secs(30);

const DATASOURCE_UID: &str = "${datasource}";

/// A job that runs for long (the test stops it) and one transient fault the repairer reboots away,
/// so repairs, drains and the job's restart metrics exist too.
const SCENARIO: &str = r#"
name = "dashboards"
description = "a transient Xid 48 cleared by a reboot while the job runs on"
timeout = "10m"
settle_timeout = "5s"
compare_hash = false

[fleet]
nodes = 2
spares = 0
steps = 100000
checkpoint_every = "10"
boot_delay = "500ms"
model = "small"
pace = "100ms"

[[faults]]
at_step = 3
node = "rank:0"
fault = "gpu-xid:48"
persistent = false
expect = "reboot"
"#;

fn dashboard_files() -> Vec<PathBuf> {
    let dir = workspace_root().join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let names: Vec<String> = files.iter().map(|p| file_name(p)).collect();
    for expected in ["fleet.json", "jobs.json", "node.json"] {
        assert!(names.iter().any(|n| n == expected), "dashboards/{expected} is missing: {names:?}");
    }
    files
}

fn rule_files() -> Vec<PathBuf> {
    let dir = workspace_root().join("deploy/prometheus/rules");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| file_name(p).contains("rules") && file_name(p).ends_with(".yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *rules*.yml in {}", dir.display());
    files
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

fn dashboard(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("{}: not valid JSON: {err}", path.display()))
}

// ---- the type check ----

#[test]
fn the_dashboards_type_check_against_grafana_schema() {
    let script = workspace_root().join("dashboards/typecheck/check.sh");
    let output = run_with_timeout(&mut Command::new(&script), TYPECHECK_LIMIT);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} exited with {} (scripts/test installs node and npm):\n{stdout}\n{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // It checked all of them, not none.
    assert!(stdout.contains("generated 3 dashboard(s)"), "{stdout}");
}

// ---- the datasource variable ----

/// Everything wrong with how `dashboard` picks its data source: a datasource that is not the
/// `${datasource}` variable (a fixed uid or name), a missing `datasource` variable, a query panel
/// without the variable.
fn datasource_problems(dashboard: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    fn walk(value: &Value, at: &str, problems: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let here = format!("{at}.{key}");
                    if key == "datasource" {
                        let uid = match child {
                            Value::Object(ds) => ds.get("uid").and_then(Value::as_str),
                            Value::String(name) => Some(name.as_str()),
                            _ => None,
                        };
                        if uid != Some(DATASOURCE_UID) {
                            problems.push(format!("{here} is {child}, not uid {DATASOURCE_UID}"));
                        }
                    }
                    walk(child, &here, problems);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{at}[{i}]"), problems);
                }
            }
            _ => {}
        }
    }
    walk(dashboard, "", &mut problems);

    let variable = variables(dashboard).into_iter().find(|v| v["name"] == "datasource");
    match variable {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
        Some(v) => {
            problems.push(format!("variable datasource is not a prometheus datasource: {v}"))
        }
        None => problems.push("no datasource variable".to_owned()),
    }
    for panel in panels(dashboard) {
        if panel["type"] != "row" && panel.get("datasource").is_none() {
            problems.push(format!("panel {:?} names no datasource", panel["title"]));
        }
    }
    problems
}

fn variables(dashboard: &Value) -> Vec<&Value> {
    dashboard["templating"]["list"].as_array().map(|l| l.iter().collect()).unwrap_or_default()
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panel["panels"].as_array().into_iter().flatten());
    }
    out
}

#[test]
fn every_dashboard_queries_through_the_datasource_variable_and_node_has_a_node_variable() {
    for path in dashboard_files() {
        let dashboard = dashboard(&path);
        let problems = datasource_problems(&dashboard);
        assert!(problems.is_empty(), "{}: {problems:#?}", path.display());
        let queries = panels(&dashboard)
            .into_iter()
            .flat_map(|p| p["targets"].as_array().into_iter().flatten())
            .filter(|t| t["expr"].as_str().is_some_and(|e| e.contains("fleetmend_")))
            .count();
        assert!(queries >= 5, "{}: only {queries} fleetmend queries", path.display());
    }
    let node = dashboard(&workspace_root().join("dashboards/node.json"));
    let variable = variables(&node).into_iter().find(|v| v["name"] == "node");
    let variable = variable.expect("node.json has no `node` variable");
    assert_eq!(variable["type"], "query", "{variable}");
    assert_eq!(variable["datasource"]["uid"], DATASOURCE_UID, "{variable}");
    let query = variable["query"]["query"].as_str().unwrap_or_default();
    assert!(query.starts_with("label_values(fleetmend_") && query.ends_with(", node)"), "{query}");
    // Its panels are one node's.
    for panel in panels(&node).into_iter().filter(|p| p["type"] != "row") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(expr.contains(r#"node="$node""#), "{:?}: {expr}", panel["title"]);
        }
    }
}

#[test]
fn the_datasource_check_flags_a_fixed_uid_and_a_missing_variable() {
    let fixed: Value = serde_json::json!({
        "templating": {"list": []},
        "panels": [{"type": "timeseries", "title": "t",
                    "datasource": {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"},
                    "targets": [{"expr": "fleetmend_nodes", "datasource": {"uid": "${datasource}"}}]}]
    });
    let problems = datasource_problems(&fixed);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("P1809F7CD0C75ACF3"), "{problems:#?}");
    assert!(problems[1].contains("no datasource variable"), "{problems:#?}");
}

// ---- metric names against a live fleet ----

/// The metric families a `/metrics` text declares (its `# TYPE` lines).
fn families(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The names of the series an exposition has samples of (a family with only `# TYPE` has none).
fn series_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether `name` is a family of `live`, or the `_bucket`, `_sum` or `_count` series of one.
fn exported(name: &str, live: &BTreeSet<String>) -> bool {
    live.contains(name)
        || ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .any(|family| live.contains(family))
}

/// `(file, name)` for every metric name the files use that `live` does not export.
fn unknown_metrics(files: &[(String, String)], live: &BTreeSet<String>) -> Vec<(String, String)> {
    files
        .iter()
        .flat_map(|(file, text)| {
            metric_names(text)
                .into_iter()
                .filter(|n| !exported(n, live))
                .map(|n| (file.clone(), n))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The dashboards and rule files, as (path from the workspace root, text).
fn files_using_metrics() -> Vec<(String, String)> {
    let root = workspace_root();
    dashboard_files()
        .into_iter()
        .chain(rule_files())
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(&root).unwrap().display().to_string(), text)
        })
        .collect()
}

#[test]
fn a_family_without_samples_is_no_series() {
    let text = "# HELP fleetmend_job_straggler_ratio x\n# TYPE fleetmend_job_straggler_ratio gauge\n\
                # TYPE fleetmend_nodes gauge\nfleetmend_nodes{state=\"healthy\"} 4\n\
                fleetmend_breaker_open 0\n";
    let names: Vec<String> = series_names(text).into_iter().collect();
    assert_eq!(names, ["fleetmend_breaker_open", "fleetmend_nodes"]);
}

#[test]
fn the_metric_check_flags_an_unknown_name() {
    let live = families(
        "# HELP fleetmend_time_to_drain_seconds x\n# TYPE fleetmend_time_to_drain_seconds histogram\n\
         # TYPE fleetmend_gpu_temperature_celsius gauge\nfleetmend_gpu_temperature_celsius{gpu=\"0\"} 40\n",
    );
    assert_eq!(
        live,
        BTreeSet::from([
            "fleetmend_gpu_temperature_celsius".to_owned(),
            "fleetmend_time_to_drain_seconds".to_owned()
        ])
    );
    let files = [
        (
            "dashboards/x.json".to_owned(),
            r#"{"uid": "fleetmend-x", "expr": "histogram_quantile(0.9, sum by (le) (rate(fleetmend_time_to_drain_seconds_bucket[1h]))) + fleetmend_gpu_temprature_celsius"}"#
                .to_owned(),
        ),
        (
            "deploy/prometheus/rules/x.rules.yml".to_owned(),
            "expr: fleetmend:x:rate5m > 0 and fleetmend_gpu_temperature_celsius > 90 \
             and fleetmend_time_to_drain_seconds_total > 0"
                .to_owned(),
        ),
    ];
    assert_eq!(
        unknown_metrics(&files, &live),
        [
            ("dashboards/x.json".to_owned(), "fleetmend_gpu_temprature_celsius".to_owned()),
            (
                "deploy/prometheus/rules/x.rules.yml".to_owned(),
                "fleetmend_time_to_drain_seconds_total".to_owned()
            ),
        ]
    );
}

/// The address in `http://ADDR[/path]`.
fn address(url: &str) -> SocketAddr {
    let rest = url.trim().strip_prefix("http://").unwrap_or_else(|| panic!("not a URL: {url}"));
    rest.split('/').next().unwrap().parse().unwrap_or_else(|err| panic!("{url}: {err}"))
}

/// The repairer's and the agents' addresses once `up` printed its banner (within [`LIVE_LIMIT`]).
fn banner(up: &mut Up) -> (SocketAddr, Vec<SocketAddr>) {
    let mut addresses = None;
    let started = poll_until(LIVE_LIMIT, || {
        assert!(up.running(), "fleetmend up exited\n{}", up.output());
        addresses = banner_addresses(&up.stdout());
        addresses.is_some()
    });
    assert!(started, "fleetmend up printed no banner within {LIVE_LIMIT:?}\n{}", up.output());
    addresses.unwrap()
}

/// The repairer's address and every agent's from `fleetmend up`'s banner, once it is printed
/// (its last line starts with `try:`).
fn banner_addresses(stdout: &str) -> Option<(SocketAddr, Vec<SocketAddr>)> {
    if !stdout.lines().any(|l| l.starts_with("try: ")) {
        return None;
    }
    let repairer = stdout.lines().find_map(|l| l.strip_prefix("repairer API: ")).map(address)?;
    let agents = stdout
        .lines()
        .filter(|l| l.starts_with("agent "))
        .filter_map(|l| l.rsplit_once(": ").map(|(_, url)| address(url)))
        .collect();
    Some((repairer, agents))
}

#[test]
fn every_series_a_dashboard_panel_reads_is_there_on_a_healthy_fleet_within_a_minute() {
    let used: BTreeSet<String> = dashboard_files()
        .iter()
        .flat_map(|p| metric_names(&std::fs::read_to_string(p).unwrap()))
        // The local fleet does not write-probe its nodes' mounts (they share this machine's disk:
        // local/src/tree.rs); the agent exports the probe's latency on the healthy fixture
        // (tests/tests/agent_metrics.rs's golden file).
        .filter(|n| n != "fleetmend_disk_probe_latency_seconds")
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let up = ["--model", "small", "--pace", "100ms", "--steps", "100000"];
    let mut up = Up::start(dir.path(), &dir.path().join("state"), &up);
    let (repairer, agents) = banner(&mut up);

    // From the banner on, a minute for every panel's series to have a sample: the job's step
    // within seconds, its slowest rank once each rank posted its warm-up and a window of steps.
    const HEALTHY_LIMIT: Duration = Duration::from_secs(60);
    let mut live = BTreeSet::new();
    let all_there = poll_until(HEALTHY_LIMIT, || {
        assert!(up.running(), "fleetmend up exited\n{}", up.output());
        for addr in std::iter::once(&repairer).chain(&agents) {
            if let Some((200, body)) = http_get(*addr, "/metrics") {
                live.extend(series_names(&body));
            }
        }
        used.iter().all(|n| exported(n, &live))
    });
    let missing: Vec<&String> = used.iter().filter(|n| !exported(n, &live)).collect();
    assert!(
        all_there,
        "series the dashboards read that a healthy fleet had not exported after \
         {HEALTHY_LIMIT:?}: {missing:?}\n{}",
        up.output()
    );
}

#[test]
fn every_metric_in_the_dashboards_and_rules_is_exported_by_a_live_fleet() {
    let files = files_using_metrics();
    let used: BTreeSet<String> = files.iter().flat_map(|(_, text)| metric_names(text)).collect();
    assert!(used.len() >= 40, "too few metric names parsed: {used:?}");

    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let scenario_arg = scenario.display().to_string();
    let mut up = Up::start(dir.path(), &dir.path().join("state"), &["--scenario", &scenario_arg]);

    let deadline = Instant::now() + LIVE_LIMIT;
    let (repairer, agents) = banner(&mut up);
    assert_eq!(agents.len(), 2, "{}", up.output());

    // Families come and go with what happens (a repair's counters appear with the first repair):
    // collect every family the fleet exports while it runs, until the files' names are all seen,
    // or the job and a repair were seen and SETTLE more passed.
    let mut live = BTreeSet::new();
    let mut scraped = BTreeSet::new();
    let mut ready_at: Option<Instant> = None;
    while Instant::now() < deadline {
        assert!(up.running(), "fleetmend up exited\n{}", up.output());
        for addr in std::iter::once(&repairer).chain(&agents) {
            if let Some((200, body)) = http_get(*addr, "/metrics") {
                live.extend(families(&body));
                scraped.insert(*addr);
            }
        }
        if used.iter().all(|n| exported(n, &live)) {
            break;
        }
        let ready = scraped.len() == agents.len() + 1
            && live.contains("fleetmend_job_step")
            && live.contains("fleetmend_repairs_total");
        match ready_at {
            Some(at) if at.elapsed() >= SETTLE => break,
            None if ready => ready_at = Some(Instant::now()),
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // What the fleet must have exported for this check to mean anything: the repairer's, the
    // job queue's and the agents' metrics.
    for family in ["fleetmend_nodes", "fleetmend_job_step", "fleetmend_gpu_temperature_celsius"] {
        assert!(live.contains(family), "the live fleet never exported {family}: {live:?}");
    }
    assert_eq!(scraped.len(), agents.len() + 1, "not every /metrics answered\n{}", up.output());

    // The local fleet does not write-probe its nodes' mounts (they share this machine's disk:
    // local/src/tree.rs); the agent exports the probe's latency on the healthy fixture
    // (tests/tests/agent_metrics.rs's golden file).
    live.insert("fleetmend_disk_probe_latency_seconds".to_owned());
    let unknown = unknown_metrics(&files, &live);
    assert!(
        unknown.is_empty(),
        "metrics no live fleetmend exports, as (file, name): {unknown:#?}\nlive families: {live:#?}"
    );
}
