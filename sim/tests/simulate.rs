//! `fleetmend simulate` runs the repairer's own code in virtual time: checked against the
//! published closed-form model, for determinism, and for the guard rails acting in a storm.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

use fleetmend_repairer::model::{EventKind, RuleAction, Severity};
use fleetmend_sim::config::SimConfig;
use fleetmend_sim::run::{simulate, simulate_recorded};

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
/// N·r_f: the test runs 256 nodes at 8 times the rate (the same 13.3 job failures a day, an eighth
/// of the ranks to restart in a debug build); BENCHMARKS.md has the 2,048-node run.
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
        ("fleet.nodes", "256"),
        ("fleet.spares", "0"),
        ("fleet.duration", "54days"),
        ("fleet.seed", "12"),
        ("failures.rate_per_node_day", "0.052"),
        ("failures.lemons.fraction", "0.0"),
        ("failures.lemons.factor", "1.0"),
        ("failures.silent_repair_rate", "0.0"),
        ("job.every_fault_kills", "true"),
        ("job.checkpoint_on_signal", "false"),
        ("job.checkpoint_write", "0s"),
        ("job.restart", "5m"),
        ("job.checkpoint_every", interval),
        // Ticks of 10 s instead of 1 s: a tenth of the wakes in a debug build; each adds at
        // most a few ticks to a restart (under 0.005 of ETTR here).
        ("repairer.engine.tick", "10s"),
        ("repairer.queue.tick", "10s"),
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

/// 30 % of the fleet failing at once (a bad driver rollout) opens the breaker, and no node is
/// rebooted: asserted from the repairer's own event log.
#[test]
fn a_correlated_failure_of_30_percent_opens_the_breaker_and_nothing_is_rebooted() {
    let storm = scripted(
        r#"
        [[event]]
        at = "2h"
        fraction = 0.3
        fault = "gpu-xid:79"
        "#,
        &[
            ("fleet.nodes", "200"),
            ("fleet.spares", "8"),
            ("fleet.duration", "1day"),
            ("failures.rate_per_node_day", "0.0"),
            ("failures.silent_repair_rate", "0.0"),
        ],
        "the storm",
    );
    assert_eq!(storm.events.len(), 1);
    let (report, events) = simulate_recorded(&storm, None).unwrap();
    assert_eq!(report.failures.node_failures, 60, "{}", report.summary());
    let opened: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Breaker && e.severity == Severity::Critical)
        .collect();
    assert_eq!(opened.len(), 1, "the breaker did not open once:\n{}", report.summary());
    let rebooting: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Decision && e.action == Some(RuleAction::Reboot))
        .filter(|e| e.at_ms >= opened[0].at_ms)
        .collect();
    assert!(rebooting.is_empty(), "reboots decided with the breaker open: {rebooting:?}");
    let held = events
        .iter()
        .filter(|e| e.kind == EventKind::ActionHeld && e.reason.contains("breaker"))
        .count();
    assert!(held >= 50, "only {held} reboots held by the breaker:\n{}", report.summary());
    assert_eq!(report.repairs.reboots, 0, "the provider rebooted:\n{}", report.summary());
    assert_eq!(report.repairs.breaker_openings, 1);
}

/// A fault that leaves the job running (a scratch SSD gone read-only) is drained with the
/// protocol's signal first: the job writes a checkpoint at SIGUSR1 and loses no training to a
/// rollback.
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
