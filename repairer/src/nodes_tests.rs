#![allow(clippy::unwrap_used)]

use fleetmend_proto::{CheckRun, RecommendedAction, ReportTrigger, Verdict, WIRE_VERSION};

use super::*;
use crate::model::FindingSource;

fn report(address: Option<&str>, metrics_port: Option<u16>) -> Report {
    Report {
        wire_version: WIRE_VERSION,
        node: "gpu-a".to_owned(),
        boot_id: "b1".to_owned(),
        agent_version: "test".to_owned(),
        seq: 1,
        sent_at_ms: 0,
        trigger: ReportTrigger::Interval,
        verdict: Verdict::Healthy,
        checks: Vec::new(),
        findings: Vec::new(),
        command_results: Vec::new(),
        address: address.map(str::to_owned),
        ranks: Vec::new(),
        metrics_port,
    }
}

#[test]
fn the_metrics_target_is_the_reported_address_or_the_node_name_and_the_port() {
    assert_eq!(
        metrics_target(&report(Some("10.0.0.1"), Some(9831))).as_deref(),
        Some("10.0.0.1:9831")
    );
    assert_eq!(metrics_target(&report(None, Some(9831))).as_deref(), Some("gpu-a:9831"));
    assert_eq!(metrics_target(&report(Some(""), Some(9831))).as_deref(), Some("gpu-a:9831"));
    assert_eq!(
        metrics_target(&report(Some("fd00::1"), Some(9831))).as_deref(),
        Some("[fd00::1]:9831")
    );
    // An agent older than the field: no target rather than a guessed port.
    assert_eq!(metrics_target(&report(Some("10.0.0.1"), None)), None);
}

#[test]
fn records_saved_before_the_metrics_target_existed_still_load() {
    let mut record = NodeRecord::new("gpu-a", 1);
    let mut json = serde_json::to_value(&record).unwrap();
    assert!(json.get("metrics_target").is_none(), "none is not written: {json}");
    json.as_object_mut().unwrap().remove("metrics_target");
    assert_eq!(serde_json::from_value::<NodeRecord>(json).unwrap(), record);
    record.metrics_target = Some("10.0.0.1:9831".to_owned());
    let saved = serde_json::to_string(&record).unwrap();
    assert_eq!(serde_json::from_str::<NodeRecord>(&saved).unwrap(), record);
}

fn nodes() -> (tempfile::TempDir, Nodes) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::store::Store::open(&dir.path().join("r.db")).unwrap());
    let metrics = Arc::new(crate::metrics::RepairerMetrics::new());
    let nodes = Nodes::load(Arc::new(EventLog::new(store, metrics))).unwrap();
    (dir, nodes)
}

/// The counts kept as records change equal a count over the fleet, whatever changed; a node
/// outside the inventory (unknown) counts in none of them but the unknown count.
#[test]
fn the_counts_follow_every_change_of_a_record() {
    let (_dir, nodes) = nodes();
    let mut guard = nodes.lock();
    for i in 0..50u64 {
        guard.insert(NodeRecord::new(&format!("n{i}"), 0));
    }
    let states = NodeState::ALL;
    let mut rng = fastrand::Rng::with_seed(7);
    for step in 0..2_000u64 {
        let name = format!("n{}", rng.u64(0..50));
        let to = states[rng.usize(0..states.len())];
        let since = if rng.bool() { Some(rng.u64(0..1_000)) } else { None };
        let finding = rng
            .bool()
            .then(|| Finding::new("gpu", "xid", "0", Status::Fail, RecommendedAction::Reboot, ""));
        let unknown = rng.u8(0..4) == 0;
        let by_person = rng.u8(0..8) == 0;
        guard
            .update(&name, |node, events| {
                set_unknown(events, node, unknown, "test", step)?;
                node.drained_by_person = by_person;
                node.unhealthy_since_ms = since;
                node.findings.clear();
                if let Some(finding) = &finding {
                    track(node, FindingSource::Agent, &[finding], &[], step);
                }
                transition(events, node, to, "test", Actor::repairer(), step)
            })
            .unwrap();
        if step % 97 == 0 {
            guard.forget_unhealthy_since();
        }
        let now = 1_000;
        let window = 300;
        let (fleet, recent) = guard.fleet(now, Some(window));
        let unknown = guard.records().filter(|n| n.unknown).count() as u32;
        assert_eq!(guard.unknown_count(), unknown, "after change {step}");
        let records: Vec<&NodeRecord> = guard.records().filter(|n| !n.unknown).collect();
        let members = records.iter().filter(|n| n.state.is_member()).count() as u32;
        let unavailable = records.iter().filter(|n| n.state.is_unavailable()).count() as u32;
        let in_repair = records
            .iter()
            .filter(|n| matches!(n.state, NodeState::Repairing | NodeState::Validating))
            .count() as u32;
        let counted_recent = records
            .iter()
            .filter(|n| {
                // A time to come (a boot's grace) and a person's drain are no storm.
                n.state.is_member()
                    && !n.drained_by_person
                    && n.unhealthy_since_ms.is_some_and(|t| t <= now && now - t <= window)
            })
            .count() as u32;
        assert_eq!(
            (fleet.members, fleet.unavailable, fleet.repairs_in_flight, recent),
            (members, unavailable, in_repair, counted_recent),
            "after change {step}"
        );
        let timed: Vec<String> =
            records.iter().filter(|n| n.timed()).map(|n| n.name.clone()).collect();
        assert_eq!(guard.timed(), timed, "after change {step}");
    }
    let known = guard.records().filter(|n| !n.unknown).count() as u64;
    drop(guard);
    let by_state = nodes.state_counts();
    assert_eq!(by_state.values().sum::<u64>(), known, "by state: the inventoried nodes");
    assert_eq!(known + u64::from(nodes.unknown_count()), 50);
    assert!(known < 50 && known > 0, "both kinds were exercised: {known}");
}

#[test]
fn applying_the_inventory_marks_nodes_in_and_out_with_one_event_each() {
    let (_dir, nodes) = nodes();
    {
        let mut guard = nodes.lock();
        for name in ["a", "b", "c"] {
            guard.insert(NodeRecord::new(name, 0));
            guard.save(name).unwrap();
        }
    }
    let events = |nodes: &Nodes| nodes.events.store().events(0, None, 100).unwrap();
    assert_eq!(nodes.apply_inventory(|n| n != "c", 5).unwrap(), 1);
    assert_eq!(nodes.unknown_count(), 1);
    assert_eq!(nodes.lock().fleet(5, None).0.members, 2);
    assert_eq!(nodes.apply_inventory(|n| n != "c", 6).unwrap(), 0, "nothing new: no event");
    assert_eq!(nodes.apply_inventory(|_| true, 7).unwrap(), 1);
    let kinds: Vec<(EventKind, Severity, Option<String>)> =
        events(&nodes).into_iter().map(|e| (e.kind, e.severity, e.node)).collect();
    assert_eq!(
        kinds,
        [
            (EventKind::NodeUnknown, Severity::Warning, Some("c".to_owned())),
            (EventKind::NodeUnknown, Severity::Info, Some("c".to_owned())),
        ]
    );
    assert_eq!((nodes.unknown_count(), nodes.lock().fleet(7, None).0.members), (0, 3));
    // Saved: a restarted repairer loads the mark.
    nodes.apply_inventory(|n| n == "a", 8).unwrap();
    let reloaded = Nodes::load(nodes.events.clone()).unwrap();
    assert_eq!(reloaded.unknown_count(), 2);
    assert!(reloaded.get("b").unwrap().unknown && !reloaded.get("a").unwrap().unknown);
}

/// A fresh boot's transient (a link still training) turns the node unhealthy for the breaker
/// only when the boot grace ends; a failing finding of another kind, at once.
#[test]
fn a_boot_transient_counts_toward_the_breaker_only_past_its_grace() {
    let grace = crate::policy::BOOT_GRACE.as_millis() as u64;
    let link = Finding::new("nic", "nic_down", "eth0", Status::Fail, RecommendedAction::Drain, "");
    let xid = Finding::new("gpu", "xid", "79", Status::Fail, RecommendedAction::Reboot, "");
    let mut node = NodeRecord::new("n1", 0);
    node.booted_ms = Some(1_000);
    track(&mut node, FindingSource::Agent, &[&link], &[], 2_000);
    assert_eq!(node.unhealthy_since_ms, Some(1_000 + grace));
    // Reported again within the grace: still from its end.
    track(&mut node, FindingSource::Agent, &[&link], &[], 3_000);
    assert_eq!(node.unhealthy_since_ms, Some(1_000 + grace));
    // An Xid beside it: unhealthy now.
    track(&mut node, FindingSource::Agent, &[&link, &xid], &[], 4_000);
    assert_eq!(node.unhealthy_since_ms, Some(4_000));
    // A node that did not just boot: unhealthy when the link went down.
    let mut other = NodeRecord::new("n2", 0);
    track(&mut other, FindingSource::Agent, &[&link], &[], 2_000);
    assert_eq!(other.unhealthy_since_ms, Some(2_000));

    // The breaker's count takes in a time to come only once it came.
    let (_dir, nodes) = nodes();
    let mut guard = nodes.lock();
    let mut booted = NodeRecord::new("n1", 0);
    booted.booted_ms = Some(1_000);
    track(&mut booted, FindingSource::Agent, &[&link], &[], 2_000);
    guard.insert(booted);
    let window = 600_000;
    assert_eq!(guard.fleet(2_000, Some(window)).1, 0);
    assert_eq!(guard.fleet(1_000 + grace, Some(window)).1, 1);
}

/// Observations are looks of the check: a report carrying the check's same run again adds none.
#[test]
fn a_check_run_carried_again_is_not_another_observation() {
    let link = Finding::new("nic", "nic_down", "eth0", Status::Fail, RecommendedAction::Drain, "");
    let run = |at: u64| CheckRun {
        check: "nic".to_owned(),
        status: Status::Fail,
        duration_seconds: 0.0,
        timed_out: false,
        finished_at_ms: at,
    };
    let mut node = NodeRecord::new("n1", 0);
    for now in [1_000, 2_000, 3_000] {
        track(&mut node, FindingSource::Agent, &[&link], &[run(500)], now);
    }
    assert_eq!(node.findings[0].observations, 1);
    assert!(track(&mut node, FindingSource::Agent, &[&link], &[run(10_500)], 11_000));
    assert_eq!(node.findings[0].observations, 2);
    // A report naming no run of the check counts, as from agents before check runs were named.
    track(&mut node, FindingSource::Agent, &[&link], &[], 12_000);
    assert_eq!(node.findings[0].observations, 3);
}
