//! The noise soak (`fleetmend simulate --noise`): a healthy fleet under benign noise, every
//! node's kernel log through the agent's own rules and the findings into the real repairer, takes
//! no action on a healthy node; with real faults mixed in it still acts on every one that asks
//! for an action.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleetmend_sim::config::SimConfig;
use fleetmend_sim::noise::NoiseFigures;
use fleetmend_sim::run::simulate;

fn noise_run(settings: &[(&str, &str)]) -> (fleetmend_sim::report::SimReport, NoiseFigures) {
    let mut overrides: Vec<(String, String)> = vec![
        ("noise.enabled".into(), "true".into()),
        ("fleet.nodes".into(), "100".into()),
        ("fleet.duration".into(), "10days".into()),
        ("fleet.spares".into(), "8".into()),
        ("job.jobs".into(), "1".into()),
        // The upgrade after a day, 10 batches of 10 nodes.
        ("noise.upgrade_batch".into(), "0.1".into()),
    ];
    overrides.extend(settings.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let config = SimConfig::load(None, &overrides).unwrap();
    let report = simulate(&config, None).unwrap();
    let noise = report.noise.clone().expect("a noise run reports its figures");
    (report, noise)
}

#[test]
fn a_healthy_fleet_under_a_thousand_node_days_of_noise_sees_no_action() {
    let (report, noise) = noise_run(&[("failures.rate_per_node_day", "0")]);
    assert_eq!(noise.node_days, 1000.0);
    assert!(noise.false_actions.is_empty(), "{}", noise.summary());
    assert_eq!(noise.false_actions_per_1000_node_days, 0.0);
    assert_eq!(report.repairs.breaker_openings, 0, "{}", report.summary());
    assert_eq!((report.repairs.reboots, report.repairs.replacements), (0, 0));
    // Every kind of noise happened, and the agents' rules read every line.
    for kind in [
        "app_xid",
        "oom_kill",
        "segfault",
        "edac_corrected",
        "link_flap",
        "planned_reboot",
        "agent_restart",
        "driver_upgrade",
    ] {
        assert!(noise.injected.get(kind).is_some_and(|n| *n > 0), "no {kind}: {}", noise.summary());
    }
    assert_eq!(noise.injected["driver_upgrade"], 100, "every node upgraded once");
    assert!(noise.kernel_lines > 2_000, "{}", noise.summary());
    // The noise is seen: application Xids, OOM kills and the like are alerts, not actions.
    assert!(noise.alerts_on_healthy > 0, "{}", noise.summary());
    assert_eq!(noise.real_faults, 0);
}

#[test]
fn real_faults_mixed_into_the_noise_are_each_acted_on() {
    // Eight times the catalog's rate: about 30 faults in the 1,000 node-days, a few at a time
    // (at twenty times, three strike within the breaker's window and it holds them for a person,
    // as it should).
    let (report, noise) = noise_run(&[("failures.rate_per_node_day", "0.03")]);
    assert!(noise.real_faults >= 10, "{}", noise.summary());
    assert_eq!(noise.real_faults_acted_on, noise.real_faults, "{}", noise.summary());
    assert!(noise.false_actions.is_empty(), "{}", noise.summary());
    assert_eq!(report.repairs.breaker_openings, 0, "{}", report.summary());
}

#[test]
fn the_same_seed_makes_the_same_noise() {
    let settings = [("fleet.duration", "2days"), ("failures.rate_per_node_day", "0.02")];
    let (first, _) = noise_run(&settings);
    let (second, _) = noise_run(&settings);
    assert_eq!(first, second);
}
