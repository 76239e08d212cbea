//! `fleetmend simulate` runs the repairer's own code in virtual time: checked against the
//! published closed-form model, for determinism, and for the guard rails acting in a storm.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

use fleetmend_repairer::model::{EventKind, RuleAction, Severity};
use fleetmend_repairer::store::Store;
use fleetmend_sim::config::SimConfig;
use fleetmend_sim::run::{simulate, simulate_on, simulate_recorded};
use fleetmend_sim::store::MemoryStore;

fn config(overrides: &[(&str, &str)]) -> SimConfig {
    let overrides: Vec<(String, String)> =
        overrides.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    SimConfig::load(None, &overrides).unwrap()
}

/// Settings from a TOML document of scripted `[[event]]`s, then `settings` by their dotted paths.
fn scripted(events: &str, settings: &[(&str, &str)], name: &str) -> SimConfig {
    let mut document: toml::Table = toml::from_str(events).unwrap();
    for (key, value) in settings {
        fleetmend_sim::config::set_path(&mut document, key, value).unwrap();
    }
    SimConfig::from_table(document, &[], name).unwrap()
}

/// One root cause that kills the job where it strikes and leaves the node healthy: the closed
/// form's failure (every failure costs a restart and the work since the last checkpoint).
const CRASH_CATALOG: &str = r#"
source = "every failure kills the job; the node is fine"
nodes = 2048
window = "54days"

[[categories]]
name = "crash"
count = 1
check = "none"
finding = "none"
fault = "none"
reboot_clears = true
reboot_time = "10m"
replace_time = "2days"
"#;

/// Kokolis et al. (arXiv 2410.21680): E[ETTR] ≈ [1 − N·r_f·(u0 + Δt/2)] / (1 + w/Δt). With
/// N = 2,048, r_f = 6.5 per 1,000 node-days, u0 = 5 min and w = 0: ≈ 0.93 at a 5-minute interval,
/// ≈ 0.68 at 60 minutes. The simulator, set to the model's assumptions (every failure kills the
/// job, no checkpoint at the signal, no lemons), lands within ±0.03 of it. The formula reads only
/// N·r_f: the test runs 64 nodes at 32 times the rate (the same 13.3 job failures a day, a 32nd
/// of the ranks to restart in a debug build); BENCHMARKS.md has the 2,048-node run. The repairer's
/// ticks are its defaults: they run when something is due, not every second.
///
/// One test per checkpoint interval, so the three 54-day runs go side by side.
#[test]
fn the_simulated_ettr_follows_the_closed_form_model_checkpointing_every_5_minutes() {
    ettr_follows_the_model("5m", 0.9307);
}

#[test]
fn the_simulated_ettr_follows_the_closed_form_model_checkpointing_every_30_minutes() {
    ettr_follows_the_model("30m", 0.8151);
}

#[test]
fn the_simulated_ettr_follows_the_closed_form_model_checkpointing_every_60_minutes() {
    ettr_follows_the_model("60m", 0.6765);
}

fn ettr_follows_the_model(interval: &str, expected: f64) {
    let mut catalog = tempfile::NamedTempFile::new().unwrap();
    catalog.write_all(CRASH_CATALOG.as_bytes()).unwrap();
    let path = catalog.path().display().to_string();
    let config = config(&[
        ("catalog", &path),
        ("fleet.nodes", "64"),
        ("fleet.spares", "0"),
        ("fleet.duration", "54days"),
        ("fleet.seed", "12"),
        ("failures.rate_per_node_day", "0.208"),
        ("failures.lemons.fraction", "0.0"),
        ("failures.lemons.factor", "1.0"),
        ("failures.silent_repair_rate", "0.0"),
        ("job.every_fault_kills", "true"),
        ("job.checkpoint_on_signal", "false"),
        ("job.checkpoint_write", "0s"),
        ("job.restart", "5m"),
        ("job.checkpoint_every", interval),
    ]);
    let report = simulate(&config, None).unwrap();
    assert!(
        (report.model_ettr - expected).abs() < 0.002,
        "the model at {interval}: {} (expected {expected})",
        report.model_ettr
    );
    assert!(
        (report.ettr - report.model_ettr).abs() <= 0.03,
        "at {interval}: simulated {:.4}, model {:.4}\n{}",
        report.ettr,
        report.model_ettr,
        report.summary()
    );
}

/// Setting one key of a repairer table lays it over the simulator's defaults: the queue keeps hang
/// detection off and the engine keeps waiting days for a replacement.
#[test]
fn setting_one_repairer_key_keeps_the_simulators_other_repairer_defaults() {
    let defaults = config(&[]);
    let set = config(&[("repairer.queue.tick", "10s"), ("repairer.engine.tick", "10s")]);
    assert_eq!(set.repairer.queue.tick, std::time::Duration::from_secs(10));
    assert_eq!(set.repairer.queue.hang_floor, std::time::Duration::ZERO);
    assert_eq!(set.repairer.queue.hang_floor, defaults.repairer.queue.hang_floor);
    assert_eq!(
        set.repairer.engine.workflow.replace_timeout,
        defaults.repairer.engine.workflow.replace_timeout
    );
    assert!(set.repairer.engine.workflow.replace_timeout > std::time::Duration::from_secs(86_400));
    let on = config(&[("repairer.queue.hang_floor", "5m")]);
    assert_eq!(on.repairer.queue.hang_floor, std::time::Duration::from_secs(300));
}

#[test]
fn the_same_seed_gives_byte_identical_json_and_another_seed_another_run() {
    let run = |seed: &str| {
        let config = config(&[
            ("fleet.nodes", "96"),
            ("fleet.spares", "8"),
            ("fleet.duration", "4days"),
            ("fleet.seed", seed),
            ("failures.rate_per_node_day", "0.03"),
        ]);
        serde_json::to_string_pretty(&simulate(&config, None).unwrap()).unwrap()
    };
    let first = run("7");
    assert_eq!(first, run("7"), "the same seed gave another report");
    assert_ne!(first, run("8"), "another seed gave the same report");
}

/// A storm struck at once on `nodes` nodes (a scripted `[[event]]`) with the default policy: the
/// breaker opens once, and nothing is rebooted or replaced past it (nor before: the repairs wait
/// for the settle time, which the breaker beats). Asserted from the repairer's own event log.
fn storm_opens_the_breaker_once_and_repairs_nothing(name: &str, event: &str, nodes: &str) {
    let storm = scripted(
        event,
        &[
            ("fleet.nodes", nodes),
            ("fleet.spares", "16"),
            ("fleet.duration", "1day"),
            ("failures.rate_per_node_day", "0.0"),
            ("failures.silent_repair_rate", "0.0"),
        ],
        name,
    );
    assert_eq!(storm.events.len(), 1);
    let (report, events) = simulate_recorded(&storm, None).unwrap();
    let struck = report.failures.node_failures;
    assert!(struck > 0, "{name}: nothing struck:\n{}", report.summary());
    let opened: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Breaker && e.severity == Severity::Critical)
        .collect();
    assert_eq!(opened.len(), 1, "{name}: the breaker did not open once:\n{}", report.summary());
    let repairing: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Decision)
        .filter(|e| matches!(e.action, Some(RuleAction::Reboot | RuleAction::Replace)))
        .filter(|e| e.at_ms >= opened[0].at_ms)
        .collect();
    assert!(repairing.is_empty(), "{name}: repairs decided with the breaker open: {repairing:?}");
    assert_eq!(report.repairs.reboots, 0, "{name}: the provider rebooted:\n{}", report.summary());
    assert_eq!(report.repairs.replacements, 0, "{name}: replaced:\n{}", report.summary());
    assert_eq!(report.repairs.breaker_openings, 1, "{name}");
    let held = events
        .iter()
        .filter(|e| e.kind == EventKind::ActionHeld && e.reason.contains("breaker"))
        .count();
    assert!(held > 0, "{name}: no action held by the breaker:\n{}", report.summary());
}

/// 30 % of the fleet failing at once (a bad driver rollout), on the default guard rails.
#[test]
fn a_driver_rollout_breaking_30_percent_of_2048_nodes_opens_the_breaker_and_nothing_is_rebooted() {
    let event = "[[event]]\nat = \"2h\"\nfraction = 0.3\nfault = \"gpu-xid:79\"\n";
    storm_opens_the_breaker_once_and_repairs_nothing("30 % rollout", event, "2048");
}

/// 10 % of the fleet: below the old default's 20 % breaker, which let it through.
#[test]
fn a_driver_rollout_breaking_10_percent_of_2048_nodes_opens_the_breaker_and_nothing_is_rebooted() {
    let event = "[[event]]\nat = \"2h\"\nfraction = 0.1\nfault = \"gpu-xid:79\"\n";
    storm_opens_the_breaker_once_and_repairs_nothing("10 % rollout", event, "2048");
}

/// A leaf switch: the 24 nodes behind it lose their links at once (1.2 % of the fleet).
#[test]
fn a_leaf_switch_behind_24_of_2048_nodes_opens_the_breaker_and_nothing_is_rebooted() {
    let event = "[[event]]\nat = \"2h\"\nnodes = 24\ncategory = \"network-switch-cable\"\n";
    storm_opens_the_breaker_once_and_repairs_nothing("leaf switch", event, "2048");
}

/// The same storm on a small fleet (200 nodes): the breaker's floor of nodes holds there too.
#[test]
fn a_correlated_failure_of_30_percent_of_200_nodes_opens_the_breaker_and_nothing_is_rebooted() {
    let event = "[[event]]\nat = \"2h\"\nfraction = 0.3\nfault = \"gpu-xid:79\"\n";
    storm_opens_the_breaker_once_and_repairs_nothing("200 nodes", event, "200");
}

/// A fault that leaves the job running (a scratch SSD gone read-only) is drained with the
/// protocol's signal first: the job writes a checkpoint at the repairer's SIGUSR1 and, requeued
/// once it is written, loses no training to a rollback.
#[test]
fn a_drained_node_that_is_still_alive_costs_a_checkpoint_at_the_signal_not_a_rollback() {
    let config = scripted(
        r#"
        [[event]]
        at = "5h"
        nodes = 1
        category = "ssd"
        "#,
        &[("fleet.nodes", "64"), ("fleet.duration", "1day"), ("failures.rate_per_node_day", "0.0")],
        "one SSD",
    );
    let report = simulate(&config, None).unwrap();
    let job = &report.jobs[0];
    assert_eq!(job.interruptions, 1, "{}", report.summary());
    assert_eq!(job.checkpointed_at_signal, 1, "{}", report.summary());
    assert!(job.lost_hours.rollback < 0.01, "{}", report.summary());
}

/// The gang scheduler (the default) moves each attempt's ranks as one; the embedded job queue
/// moves them one by one through their agents. On the same fleet and failures they must tell the
/// same story: the same faults, the same restarts within a few, the same goodput within 0.02,
/// and the drained-but-alive node's checkpoint at the signal under both.
#[test]
fn the_gang_scheduler_and_the_embedded_queue_agree_on_the_same_failures() {
    let run = |scheduler: &str| {
        let config = config(&[
            ("fleet.nodes", "128"),
            ("fleet.spares", "4"),
            ("fleet.duration", "20days"),
            ("fleet.seed", "3"),
            ("failures.rate_per_node_day", "0.05"),
            ("job.scheduler", scheduler),
        ]);
        simulate(&config, None).unwrap()
    };
    let (gang, queue) = (run("gang"), run("queue"));
    let summaries = format!("gang:\n{}\nqueue:\n{}", gang.summary(), queue.summary());
    assert_eq!(gang.failures.node_failures, queue.failures.node_failures, "{summaries}");
    assert!(gang.failures.node_failures > 50, "too few failures to compare:\n{summaries}");
    let (g, q) = (&gang.jobs[0], &queue.jobs[0]);
    assert!(g.interruptions.abs_diff(q.interruptions) <= q.interruptions / 10 + 2, "{summaries}");
    assert!((gang.ettr - queue.ettr).abs() <= 0.02, "{summaries}");
    assert!(
        gang.sim_events * 4 < queue.sim_events,
        "the gang scheduler should need far fewer events: {} vs {}",
        gang.sim_events,
        queue.sim_events
    );
}

/// The simulator's memory store and the repairer's SQLite store hold the same audit log of the
/// same run: the store changes how fast a run goes, never what the repairer decides. Both
/// schedulers, so the embedded queue's job documents are read back too.
#[test]
fn the_memory_store_and_sqlite_give_the_same_audit_log() {
    for scheduler in ["gang", "queue"] {
        let config = config(&[
            ("fleet.nodes", "64"),
            ("fleet.spares", "2"),
            ("fleet.duration", "10days"),
            ("fleet.seed", "5"),
            ("failures.rate_per_node_day", "0.05"),
            ("job.scheduler", scheduler),
        ]);
        let memory = Store::from_backend(MemoryStore::new());
        let sqlite = Store::in_memory().unwrap();
        let (report_m, events_m) = simulate_on(&config, None, memory).unwrap();
        let (report_s, events_s) = simulate_on(&config, None, sqlite).unwrap();
        let lines = |events: &[fleetmend_repairer::model::Event]| -> Vec<String> {
            events
                .iter()
                .map(|e| {
                    format!(
                        "{} {} {:?} {:?} {:?} {}",
                        e.id, e.at_ms, e.kind, e.node, e.action, e.reason
                    )
                })
                .collect()
        };
        assert!(events_m.len() > 100, "{scheduler}: too few events to compare: {}", events_m.len());
        assert_eq!(lines(&events_m), lines(&events_s), "{scheduler}");
        assert_eq!(report_m.summary(), report_s.summary(), "{scheduler}");
    }
}
