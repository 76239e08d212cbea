//! The kernel_log check's ledger: matches, windows, identities, floods and clearing lines.

use super::*;

fn compiled() -> Vec<Rule> {
    builtin_rules().iter().filter_map(|r| rules::compile(r).ok()).collect()
}

fn line(text: &str) -> Record {
    Record::now(text)
}

fn ledger(rules: &[Rule]) -> Ledger {
    Ledger::new(rules.len(), &KernelLogConfig::default())
}

const XID79: &str = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.";
const XID13: &str = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception";

#[test]
fn the_worst_match_wins_and_clears_after_its_window() {
    let rules = compiled();
    let mut ledger = ledger(&rules);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    assert!(ledger.record(&rules, &line(XID79), None, t0));
    assert!(ledger.record(&rules, &line(XID13), None, t0 + Duration::from_secs(60)));
    let findings = ledger.findings(&rules, t0 + Duration::from_secs(120));
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].action, RecommendedAction::Reboot);
    assert_eq!(findings[0].value, Some(2.0));
    let later = ledger.findings(&rules, t0 + Duration::from_secs(3600 + 30));
    assert_eq!(later[0].action, RecommendedAction::RestartApp, "{later:?}");
    let cleared = ledger.findings(&rules, t0 + Duration::from_secs(7200));
    assert_eq!(cleared[0].status, Status::Ok, "{cleared:?}");
    assert_eq!(cleared[0].finding, "xid");
}

#[test]
fn recovery_action_is_a_state_that_can_go_back_to_none() {
    let rules = compiled();
    let mut ledger = ledger(&rules);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let to = |code: &str| {
        line(&format!(
            "NVRM: Xid (PCI:0000:bb:00): 154, GPU recovery action changed from 0x0 (None) to 0x{code} (x)"
        ))
    };
    ledger.record(&rules, &to("2"), None, t0);
    let f = ledger.findings(&rules, t0);
    let recovery = f.iter().find(|f| f.finding == "recovery_action").unwrap();
    assert_eq!((recovery.status, recovery.action), (Status::Fail, RecommendedAction::Reboot));
    ledger.record(&rules, &to("0"), None, t0 + Duration::from_secs(5));
    let f = ledger.findings(&rules, t0 + Duration::from_secs(6));
    let recovery = f.iter().find(|f| f.finding == "recovery_action").unwrap();
    assert_eq!(recovery.status, Status::Ok);
}

#[test]
fn timestamps_place_records_in_time() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let since_boot = |usec| Stamp::SinceBoot(usec);
    let at = record_time(since_boot(100_000_000), Some(Duration::from_secs(400)), now);
    assert_eq!(age(now, at), Duration::from_secs(300));
    assert_eq!(record_time(since_boot(1), None, now), now);
    assert_eq!(record_time(since_boot(10_000_000_000), Some(Duration::from_secs(1)), now), now);
    let wall = now - Duration::from_secs(5);
    assert_eq!(record_time(Stamp::Wall(wall), None, now), wall);
}

#[test]
fn old_backlog_matches_do_not_count() {
    let rules = compiled();
    let mut ledger = ledger(&rules);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let old = Record { stamp: Stamp::SinceBoot(1_000_000), ..Record::now(XID79) };
    assert!(ledger.record(&rules, &old, Some(Duration::from_secs(3 * 86_400)), now));
    assert!(ledger.findings(&rules, now).is_empty());
    assert_eq!(ledger.matches.iter().sum::<u64>(), 1);
}

/// A kmsg record's sequence number rides on the finding (`kmsg_seq`): with the boot id, the
/// identity by which the repairer knows a line read again after an agent restart.
#[test]
fn a_finding_names_the_kmsg_sequence_number_of_its_latest_line() {
    let rules = compiled();
    let mut ledger = ledger(&rules);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let kmsg = |seq: u64| source::parse_record(format!("3,{seq},5000000,-;{XID79}").as_bytes());
    assert_eq!(kmsg(4242).seq, Some(4242));
    ledger.record(&rules, &kmsg(4242), None, now);
    ledger.record(&rules, &kmsg(4250), None, now + Duration::from_secs(1));
    let findings = ledger.findings(&rules, now + Duration::from_secs(2));
    let xid = findings.iter().find(|f| f.finding == "xid").unwrap();
    assert_eq!(xid.labels.get(KMSG_SEQ_LABEL).map(String::as_str), Some("4250"), "{xid:?}");
    assert_eq!(xid.labels.get("xid").map(String::as_str), Some("79"));
    let mut plain = self::ledger(&rules);
    plain.record(&rules, &line(XID79), None, now);
    let findings = plain.findings(&rules, now);
    assert!(!findings[0].labels.contains_key(KMSG_SEQ_LABEL), "no kmsg record, no identity");
}

/// A line that says the condition is over clears it at once (`clear_pattern`): a link that
/// came back up is no longer reported down, on that interface only; a later down counts again.
#[test]
fn link_up_clears_the_matching_link_down() {
    let rules = compiled();
    let mut ledger = ledger(&rules);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let at = |s: u64| now + Duration::from_secs(s);
    let link = |text: &str, s: u64, ledger: &mut Ledger| {
        ledger.record(&rules, &line(text), None, at(s));
    };
    let down = |ledger: &mut Ledger, s: u64| -> Vec<String> {
        let findings = ledger.findings(&rules, at(s));
        let down = findings.iter().filter(|f| f.finding == "link_down");
        down.filter(|f| f.status != Status::Ok).map(|f| f.subject.clone()).collect()
    };
    link("mlx5_core 0000:0c:00.0 ens1f0np0: Link down", 0, &mut ledger);
    link("e1000e: eth1 NIC Link is Down", 1, &mut ledger);
    assert_eq!(down(&mut ledger, 2), ["ens1f0np0", "eth1"]);
    link("mlx5_core 0000:0c:00.0 ens1f0np0: Link up", 3, &mut ledger);
    assert_eq!(down(&mut ledger, 4), ["eth1"], "only the interface that came up");
    link("e1000e: eth1 NIC Link is Up 1000 Mbps Full Duplex", 5, &mut ledger);
    assert!(down(&mut ledger, 6).is_empty());
    link("mlx5_core 0000:0c:00.0 ens1f0np0: Link down", 7, &mut ledger);
    assert_eq!(down(&mut ledger, 8), ["ens1f0np0"], "down again");
}

/// A flood: the same line 100,000 times is one finding that counts them, in bounded memory.
#[test]
fn a_line_repeated_100_000_times_is_one_finding_that_counts_them() {
    let rules = compiled();
    let mut ledger = ledger(&rules);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    for i in 0..100_000u64 {
        ledger.record(&rules, &line(XID79), None, now + Duration::from_millis(i));
    }
    let findings = ledger.findings(&rules, now + Duration::from_secs(101));
    let xid: Vec<&Finding> = findings.iter().filter(|f| f.finding == "xid").collect();
    assert_eq!(xid.len(), 1, "{findings:?}");
    assert_eq!(xid[0].value, Some(100_000.0));
    assert!(ledger.recent.len() <= MAX_LINES);
    assert!(ledger.entries.values().all(|e| e.hits.len() == 1), "one hit per condition");
}

#[test]
fn subjects_are_bounded() {
    let rules = compiled();
    let mut ledger = ledger(&rules);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    for i in 0..(MAX_SUBJECTS + 50) {
        let text = format!("NETDEV WATCHDOG: eth{i} (x): transmit queue 0 timed out");
        ledger.record(&rules, &line(&text), None, now + Duration::from_secs(i as u64));
    }
    assert_eq!(ledger.entries.len(), MAX_SUBJECTS);
}
