#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use fleetmend_proto::Finding;
use fleetmend_repairer::history::{
    DecisionKind, FaultDecision, FaultRepair, HISTORY_VERSION, RepairOutcome,
};

use super::*;
use crate::config::SimConfig;
use crate::replay::simulate;

const T: u64 = 1_767_225_600_000;
const MINUTE: u64 = 60_000;

fn finding(check: &str, id: &str, status: Status, action: RecommendedAction) -> Finding {
    Finding::new(check, id, "0", status, action, "")
}

fn xid(code: &str) -> Finding {
    let mut finding = finding("gpu", "xid", Status::Fail, RecommendedAction::Reboot);
    finding.labels.insert("xid".into(), code.into());
    finding
}

fn act(at_ms: u64, action: RuleAction) -> FaultDecision {
    FaultDecision { at_ms, kind: DecisionKind::Act, action, by: "rule:r".into() }
}

fn fault(node: &str, at_ms: u64, finding: Finding, decisions: Vec<FaultDecision>) -> HistoricFault {
    HistoricFault {
        at_ms,
        node: node.into(),
        finding,
        other_findings: Vec::new(),
        decisions,
        repairs: Vec::new(),
        cleared_ms: None,
    }
}

fn repair(action: RuleAction, outcome: RepairOutcome, start: u64, took: u64) -> FaultRepair {
    FaultRepair {
        action,
        outcome,
        started_ms: Some(start),
        back_ms: Some(start + took),
        finished_ms: start + took + 1_000,
    }
}

fn history(faults: Vec<HistoricFault>) -> FaultHistory {
    FaultHistory { version: HISTORY_VERSION, since_ms: T, until_ms: T + 60 * MINUTE, faults }
}

fn replay_of(history: FaultHistory, inventory: Option<&[&str]>) -> Result<Replay, ReplayError> {
    let catalog = FaultCatalog::builtin().unwrap();
    let names: Option<BTreeSet<String>> =
        inventory.map(|names| names.iter().map(|n| n.to_string()).collect());
    let basis = ReplayBasis {
        catalog: &catalog,
        unreachable_window: Duration::from_secs(30),
        fleet_nodes: 16,
    };
    Replay::new("faults.json", history, names.as_ref(), basis)
}

#[test]
fn names_sort_as_people_count() {
    let mut names = vec!["node-10", "node-2", "node-1", "gpu-b", "node-02a", "gpu-a", "node-2a"];
    names.sort_by(|a, b| natural_order(a, b));
    assert_eq!(names, ["gpu-a", "gpu-b", "node-1", "node-2", "node-2a", "node-02a", "node-10"]);
    assert_eq!(natural_order("n007", "n7"), Ordering::Greater);
    assert_eq!(natural_order("n7", "n7"), Ordering::Equal);
}

#[test]
fn nodes_take_the_slots_of_their_names_in_order() {
    let faults = vec![
        fault("node-10", T + MINUTE, xid("79"), vec![act(T + MINUTE, RuleAction::Reboot)]),
        fault("node-2", T, xid("48"), vec![act(T, RuleAction::Reboot)]),
    ];
    let replay = replay_of(history(faults.clone()), None).unwrap();
    assert_eq!(replay.names, ["node-2", "node-10"]);
    assert_eq!(replay.recorded_name("n00001"), "node-10");
    assert_eq!(replay.recorded_name("n00000-r1"), "node-2-r1");
    assert_eq!(replay.recorded_name("n00007"), "n00007", "a slot the history has no name for");
    let slots: Vec<Vec<u32>> = replay.failures.iter().map(|f| f.nodes.clone()).collect();
    assert_eq!(slots, [vec![0], vec![1]], "in time order: node-2 first");
    // The first fault strikes LEAD into the run, the others as long after it as recorded.
    let at: Vec<Duration> = replay.failures.iter().map(|f| f.at).collect();
    assert_eq!(at, [LEAD, LEAD + Duration::from_secs(60)]);
    assert_eq!(replay.zero_ms, T - LEAD.as_millis() as u64);
    assert_eq!(replay.duration(), LEAD + Duration::from_secs(3_600) + SETTLE);

    let inventory = ["node-1", "node-2", "node-3", "node-10"];
    let replay = replay_of(history(faults.clone()), Some(&inventory)).unwrap();
    assert_eq!(replay.names, ["node-1", "node-2", "node-3", "node-10"]);
    let slots: Vec<Vec<u32>> = replay.failures.iter().map(|f| f.nodes.clone()).collect();
    assert_eq!(slots, [vec![1], vec![3]]);

    let err = replay_of(history(faults), Some(&["node-1", "node-2"])).unwrap_err();
    assert_eq!(err.to_string(), "faults[0].node: node-10 is not in the inventory");
}

#[test]
fn each_finding_strikes_as_the_fault_that_stands_for_it() {
    let warn_mce = finding("kernel_log", "mce", Status::Warn, RecommendedAction::None);
    let ecc = finding("gpu", "ecc_uncorrected", Status::Fail, RecommendedAction::Replace);
    let unreachable = finding("repairer", "unreachable", Status::Fail, RecommendedAction::Reboot);
    let straggler = finding("job", "straggler", Status::Fail, RecommendedAction::Drain);
    let odd = finding("gpu", "odd", Status::Fail, RecommendedAction::RestartApp);
    let mut unlabelled = finding("kernel_log", "xid", Status::Fail, RecommendedAction::Reboot);
    unlabelled.message = "Xid 48 (double-bit ECC) on GPU 0".into();
    let decided = |at| vec![act(at, RuleAction::Reboot)];
    let faults = vec![
        fault("a", T, xid("79"), decided(T)),
        fault(
            "b",
            T,
            finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain),
            decided(T),
        ),
        fault("c", T, warn_mce, decided(T)),
        fault("d", T, ecc, decided(T)),
        fault("e", T + 5 * MINUTE, unreachable, decided(T + 5 * MINUTE)),
        fault("f", T, straggler, decided(T)),
        fault("g", T, odd, decided(T)),
        fault("h", T, unlabelled, decided(T)),
    ];
    let replay = replay_of(history(faults), None).unwrap();
    let struck: Vec<(String, String, Option<Fault>)> = replay
        .failures
        .iter()
        .map(|f| {
            let c = &replay.catalog.categories[f.category];
            (
                replay.names[f.nodes[0] as usize].clone(),
                format!("{}/{}", c.check, c.finding),
                c.fault,
            )
        })
        .collect();
    assert_eq!(
        struck,
        [
            ("a".into(), "gpu/xid".into(), Some(Fault::GpuXid(79))),
            ("b".into(), "nic/nic_down".into(), Some(Fault::NicDown)),
            ("c".into(), "kernel_log/mce".into(), Some(Fault::KernelMce)),
            ("d".into(), "gpu/ecc_uncorrected".into(), Some(Fault::RowRemapFailure)),
            ("h".into(), "kernel_log/xid".into(), Some(Fault::GpuXid(48))),
            ("e".into(), "none/none".into(), Some(Fault::AgentKill)),
        ]
    );
    // The silent node goes quiet one unreachable window before the repairer noticed.
    let silent = replay.failures.iter().find(|f| replay.names[f.nodes[0] as usize] == "e");
    assert_eq!(silent.unwrap().at, LEAD + Duration::from_secs(5 * 60 - 30));
    let skipped: Vec<usize> = replay.skipped.iter().map(|(i, _)| *i).collect();
    assert_eq!(skipped, [5, 6]);
    assert!(replay.skipped[0].1.contains("no job check"), "{:?}", replay.skipped);
    assert!(replay.skipped[1].1.contains("fail, restart-app"), "{:?}", replay.skipped);
}

#[test]
fn clearing_and_repair_times_come_from_the_history_else_the_catalog() {
    let mut escalated = fault(
        "a",
        T,
        xid("48"),
        vec![act(T, RuleAction::Reboot), act(T + 9 * MINUTE, RuleAction::Replace)],
    );
    escalated.repairs = vec![
        repair(RuleAction::Reboot, RepairOutcome::Escalated, T + MINUTE, 3 * MINUTE),
        repair(RuleAction::Replace, RepairOutcome::Repaired, T + 10 * MINUTE, 20 * MINUTE),
    ];
    let mut cleared = fault("b", T, xid("79"), vec![act(T, RuleAction::Drain)]);
    cleared.repairs = vec![FaultRepair {
        action: RuleAction::Drain,
        outcome: RepairOutcome::Drained,
        started_ms: None,
        back_ms: None,
        finished_ms: T + 1_000,
    }];
    cleared.cleared_ms = Some(T + 7 * MINUTE);
    let unknown = fault("c", T, xid("79"), vec![act(T, RuleAction::Reboot)]);
    let replay = replay_of(history(vec![escalated, cleared, unknown]), None).unwrap();
    let category = |node: &str| {
        let failure = replay.failures.iter().find(|f| replay.names[f.nodes[0] as usize] == node);
        replay.catalog.categories[failure.unwrap().category].clone()
    };
    // Xid 48 clears on a reboot in the catalog; this one did not. Its replacement takes the
    // catalog's time, not the recorded 20 minutes.
    let a = category("a");
    assert!(!a.reboot_clears);
    assert_eq!((a.reboot_time, a.replace_time), (minutes(3), minutes(2 * 24 * 60)));
    // It cleared by itself after 7 minutes: the world's "a person fixes it" time.
    let b = category("b");
    assert_eq!(b.replace_time, minutes(7));
    // Nothing recorded: the catalog's faulty-gpu row (Xid 79).
    let c = category("c");
    assert!(!c.reboot_clears);
    assert_eq!((c.reboot_time, c.replace_time), (minutes(10), minutes(2 * 24 * 60)));
    let names: Vec<&str> = replay.catalog.categories.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["replay-gpu-xid-48", "replay-gpu-xid-79", "replay-gpu-xid-79-2"]);
}

fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

#[test]
fn faults_at_one_time_in_one_category_strike_together() {
    let faults: Vec<HistoricFault> = ["n1", "n2", "n3"]
        .iter()
        .map(|node| fault(node, T, xid("79"), vec![act(T, RuleAction::Reboot)]))
        .collect();
    let replay = replay_of(history(faults), None).unwrap();
    assert_eq!(replay.failures.len(), 1);
    assert_eq!(replay.failures[0].nodes, [0, 1, 2]);
    assert!(replay.failures[0].correlated);
    assert_eq!(replay.catalog.categories[0].count, 3);
}

#[test]
fn findings_first_seen_together_on_a_node_strike_as_the_most_severe() {
    let mut link = finding("kernel_log", "link_down", Status::Warn, RecommendedAction::None);
    link.message = "eth0: Link is Down".into();
    let alert = FaultDecision {
        at_ms: T,
        kind: DecisionKind::Alert,
        action: RuleAction::Alert,
        by: "rule:warnings".into(),
    };
    let nic = finding("nic", "nic_down", Status::Fail, RecommendedAction::Drain);
    let faults = vec![
        fault("n1", T, link.clone(), vec![alert.clone()]),
        fault("n1", T + 10_000, nic, vec![act(T + 20_000, RuleAction::Drain)]),
        // Alone on its node, and on n1 again past the window: struck.
        fault("n2", T, link.clone(), vec![alert.clone()]),
        fault("n1", T + 40_000, link, vec![alert]),
    ];
    let replay = replay_of(history(faults), None).unwrap();
    let skipped: Vec<usize> = replay.skipped.iter().map(|(i, _)| *i).collect();
    assert_eq!(skipped, [0], "{:?}", replay.skipped);
    assert!(replay.skipped[0].1.starts_with("first seen on n1 with faults[1] (within 30s of it)"));
    let struck: Vec<(String, Option<Fault>)> = replay
        .failures
        .iter()
        .flat_map(|f| f.nodes.iter().map(move |n| (*n, f.category)))
        .map(|(n, c)| (replay.names[n as usize].clone(), replay.catalog.categories[c].fault))
        .collect();
    // A link-down warning strikes as a warning (a machine check's), not as the link down.
    assert_eq!(
        struck,
        [
            ("n2".into(), Some(Fault::KernelMce)),
            ("n1".into(), Some(Fault::NicDown)),
            ("n1".into(), Some(Fault::KernelMce)),
        ]
    );
}

/// A small fleet on a coarse tick, quick to simulate.
fn small(extra: &[(&str, &str)]) -> SimConfig {
    let mut overrides: Vec<(String, String)> = [
        ("fleet.nodes", "4"),
        ("fleet.spares", "1"),
        ("failures.rate_per_node_day", "0"),
        ("failures.silent_repair_rate", "0"),
        ("repairer.engine.tick", "10s"),
        ("repairer.queue.tick", "10s"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    overrides.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    SimConfig::load(None, &overrides).unwrap()
}

/// `simulated_finding` is what the simulated agent reports: every fault it has an entry for,
/// struck on a node of its own, comes to a decision (or a held one) about a finding with that
/// status and recommended action.
#[test]
fn the_simulated_agent_reports_each_fault_as_the_stand_in_table_says() {
    let faults: Vec<Fault> = FAULT_NAMES
        .iter()
        .filter_map(|name| name.parse::<Fault>().ok())
        .chain([Fault::GpuXid(79), Fault::GpuXid(48), Fault::GpuXid(13)])
        .filter(|f| simulated_finding(*f).is_some())
        .collect();
    assert!(faults.len() >= 17, "{faults:?}");
    let categories: Vec<FaultCategory> = faults
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let (check, finding) = f.agent_findings()[0];
            FaultCategory {
                name: format!("c{i}"),
                count: 1,
                check: agent_check(check).unwrap(),
                finding: finding.into(),
                fault: Some(*f),
                reboot_clears: true,
                reboot_time: minutes(10),
                replace_time: minutes(48 * 60),
                kills_job: false,
            }
        })
        .collect();
    let failures = (0..faults.len())
        .map(|i| FailureEvent {
            at: minutes(60 + i as u64),
            nodes: vec![i as u32],
            category: i,
            correlated: false,
        })
        .collect();
    let replay = Replay {
        origin: "every fault".into(),
        history: history(Vec::new()),
        names: Vec::new(),
        catalog: FaultCatalog {
            source: "every fault".into(),
            nodes: 32,
            window: minutes(60),
            categories,
        },
        failures,
        zero_ms: 0,
        skipped: Vec::new(),
        grown_from: None,
    };
    let mut config = small(&[("fleet.nodes", "32"), ("fleet.duration", "3h")]);
    config.replay = Some(Arc::new(replay));
    let (_, events) = crate::run::simulate_recorded(&config, None).unwrap();
    let decided = fleetmend_repairer::history::fold(&events, 0, u64::MAX);
    for (i, fault) in faults.iter().enumerate() {
        let node = format!("n{i:05}");
        let first = decided.iter().find(|d| d.node == node);
        let first = first.unwrap_or_else(|| panic!("{fault} on {node}: no decision: {decided:#?}"));
        assert_eq!(
            Some((first.finding.status, first.finding.action)),
            simulated_finding(*fault),
            "{fault}"
        );
    }
}

/// The simulator's own audit trail, folded as the export folds a repairer's, replayed through the
/// same settings: the same decisions on every node. This also holds the fold to the events the
/// real engine and workflows write (their reasons, their order).
#[test]
fn a_simulated_history_replayed_decides_the_same() {
    let mut recorded = small(&[("fleet.duration", "1day")]);
    recorded.events = vec![crate::config::ScriptedFault {
        at: Duration::from_secs(3_600),
        nodes: Some(1),
        fraction: None,
        category: Some("faulty-gpu".into()),
        fault: None,
    }];
    // A replacement within the day.
    let mut catalog_text = crate::catalog::DEFAULT_CATALOG_TOML.to_owned();
    catalog_text = catalog_text.replacen("replace_time = \"2days\"", "replace_time = \"3h\"", 1);
    let path = std::env::temp_dir().join(format!("fleetmend-replay-{}.toml", std::process::id()));
    std::fs::write(&path, catalog_text).unwrap();
    recorded.catalog = Some(path.clone());
    let (_, events) = crate::run::simulate_recorded(&recorded, None).unwrap();
    let faults = fleetmend_repairer::history::fold(&events, 0, u64::MAX);
    let kinds: Vec<(DecisionKind, RuleAction)> =
        faults.iter().flat_map(|f| f.decisions.iter().map(|d| (d.kind, d.action))).collect();
    assert_eq!(
        kinds,
        [(DecisionKind::Act, RuleAction::Reboot), (DecisionKind::Escalation, RuleAction::Replace)],
        "{faults:#?}"
    );
    let outcomes: Vec<(RuleAction, RepairOutcome)> =
        faults[0].repairs.iter().map(|r| (r.action, r.outcome)).collect();
    assert_eq!(
        outcomes,
        [
            (RuleAction::Reboot, RepairOutcome::Escalated),
            (RuleAction::Replace, RepairOutcome::Repaired)
        ]
    );
    // The reboot took the catalog's 10 minutes and a heartbeat or so.
    let took = faults[0].took_ms(RuleAction::Reboot).unwrap();
    assert!((600_000..=630_000).contains(&took), "{took}");

    let until = faults[0].decisions.last().unwrap().at_ms + 60_000;
    let history = FaultHistory { version: HISTORY_VERSION, since_ms: 0, until_ms: until, faults };
    let mut replayed = small(&[("fleet.duration", "1day")]);
    replayed.catalog = Some(path.clone());
    let catalog = replayed.catalog().unwrap();
    let basis = ReplayBasis {
        catalog: &catalog,
        unreachable_window: Duration::from_secs(30),
        fleet_nodes: 4,
    };
    let replay = Replay::new("recorded", history, None, basis).unwrap();
    replayed.replay = Some(Arc::new(replay));
    let (report, outcome) = simulate(&replayed, None).unwrap();
    std::fs::remove_file(&path).unwrap();
    let outcome = outcome.unwrap();
    assert_eq!(outcome.struck_faults, 1);
    assert_eq!(outcome.nodes.len(), 1, "{outcome:#?}");
    assert!(outcome.nodes[0].same, "{outcome:#?}");
    assert_eq!(outcome.same_nodes, 1);
    assert_eq!(
        report.failures.by_category.get("replay-gpu-xid-79"),
        Some(&1),
        "{:#?}",
        report.failures
    );
    assert!(report.setting.catalog.starts_with("replay of recorded"), "{}", report.setting.catalog);
    assert!(outcome.summary().contains("decisions per node: the recorded ones on 1 of 1 node(s)"));
}
