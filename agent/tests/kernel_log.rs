//! The kernel_log check against fixture logs (once mode) and a growing temp file (daemon mode).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use fleetmend_agent::checks::kernel_log::{KernelLogCheck, KernelLogConfig, KernelLogRule};
use fleetmend_agent::checks::{EventSignal, Mode, Observation};
use fleetmend_agent::config::{AgentConfig, HostPaths};
use fleetmend_agent::metrics;
use fleetmend_proto::{RecommendedAction, Status};
use support::{
    assert_finding, build_context, eventually, find, fixture, not_ok, run, run_at, sample,
};

fn build(config: &KernelLogConfig, paths: &HostPaths, mode: Mode) -> (KernelLogCheck, EventSignal) {
    let ctx = build_context(paths, mode);
    let events = ctx.events.clone();
    (KernelLogCheck::new(config, ctx), events)
}

fn once(case: &str) -> Observation {
    let paths = HostPaths::tree(&fixture(case));
    let (mut check, _) = build(&KernelLogConfig::default(), &paths, Mode::Once);
    run(&mut check, &paths)
}

const XID79_LINE: &str = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.";

#[test]
fn healthy_log_has_nothing_wrong() {
    let obs = once("healthy");
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
    let log = find(&obs, "kernel_log", "");
    assert_eq!(log.status, Status::Ok);
    assert_eq!(sample(&obs, metrics::KMSG_LINES.name, &[]), Some(7.0));
    assert_eq!(sample(&obs, metrics::KMSG_MATCHES.name, &[("rule", "xid")]), Some(0.0));
}

#[test]
fn xid79_fails_with_reboot_for_that_gpu_only() {
    let obs = once("kmsg_xid79");
    let xid = find(&obs, "xid", "0000:3b:00");
    assert_eq!(xid.status, Status::Fail);
    assert_eq!(xid.action, RecommendedAction::Reboot);
    assert_eq!(xid.labels.get("xid").map(String::as_str), Some("79"));
    assert_eq!(xid.labels.get("pci").map(String::as_str), Some("0000:3b:00"));
    assert!(xid.message.contains("fallen off the bus"), "{}", xid.message);
    // The same Xid on another GPU two hours ago (kmsg timestamp vs proc/uptime) is outside the
    // window: it does not count.
    assert!(obs.findings.iter().all(|f| f.subject != "0000:18:00"), "{:#?}", obs.findings);
    // The driver's own line after it says the same about the GPU's function.
    let lost = find(&obs, "gpu_fallen_off_bus", "0000:3b:00.0");
    assert_finding(lost, Status::Fail, RecommendedAction::Reboot);
    assert_eq!(not_ok(&obs).len(), 2, "{:#?}", not_ok(&obs));
    assert_eq!(sample(&obs, metrics::KMSG_MATCHES.name, &[("rule", "xid")]), Some(2.0));
    assert_eq!(sample(&obs, metrics::KMSG_LINES.name, &[]), Some(11.0));
}

#[test]
fn xid48_fails_with_gpu_reset() {
    let obs = once("kmsg_xid48");
    let xid = find(&obs, "xid", "0000:18:00");
    assert_finding(xid, Status::Fail, RecommendedAction::ResetGpu);
    assert_eq!(xid.labels.get("xid").map(String::as_str), Some("48"));
}

#[test]
fn xid154_reports_the_drivers_recovery_action() {
    let obs = once("kmsg_xid154");
    let recovery = find(&obs, "recovery_action", "0000:bb:00");
    assert_finding(recovery, Status::Fail, RecommendedAction::Reboot);
    assert_eq!(recovery.labels.get("recovery").map(String::as_str), Some("2"));
    // The Xid itself is informational in the catalog: the recovery action speaks for it.
    assert!(obs.findings.iter().all(|f| f.finding != "xid"), "{:#?}", obs.findings);
}

#[test]
fn machine_check_warns_without_action() {
    let obs = once("kmsg_mce");
    let mce = find(&obs, "mce", "");
    assert_finding(mce, Status::Warn, RecommendedAction::None);
    assert_eq!(mce.value, Some(2.0));
    assert!(mce.message.starts_with("mce: [Hardware Error]"), "{}", mce.message);
}

#[test]
fn absent_log_is_unknown_naming_the_path_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    let (mut check, _) = build(&KernelLogConfig::default(), &paths, Mode::Once);
    let obs = run(&mut check, &paths);
    let log = find(&obs, "kernel_log", "");
    assert_eq!(log.status, Status::Unknown);
    assert!(log.message.contains(&paths.kmsg.display().to_string()), "{}", log.message);
    std::fs::write(&paths.kmsg, format!("{XID79_LINE}\n")).unwrap();
    let obs = run(&mut check, &paths);
    assert_eq!(find(&obs, "kernel_log", "").status, Status::Ok);
    assert_eq!(find(&obs, "xid", "0000:3b:00").status, Status::Fail);
}

fn append(path: &Path, bytes: &[u8]) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_raises_the_event_and_clears_after_the_window() {
    let dir = tempfile::tempdir().unwrap();
    // Start from a log that already holds an Xid: without read_existing daemon mode reads from
    // the end, so it is not reported.
    std::fs::copy(fixture("kmsg_xid79").join("kmsg"), dir.path().join("kmsg")).unwrap();
    let paths = HostPaths::tree(dir.path());
    let clear_after = Duration::from_secs(30);
    let config = KernelLogConfig {
        rules: vec![KernelLogRule {
            name: "xid".into(),
            pattern: r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f:.]+)\): (?P<xid>\d+),".into(),
            finding: "xid".into(),
            status: "xid-catalog".into(),
            action: "xid-catalog".into(),
            subject: "${pci}".into(),
            clear_after,
            lines: 1,
            clear_pattern: String::new(),
        }],
        // Only new records: the backlog is another test's.
        read_existing: false,
        ..KernelLogConfig::default()
    };
    let (mut check, events) = build(&config, &paths, Mode::Daemon);
    let obs = run(&mut check, &paths);
    assert!(not_ok(&obs).is_empty(), "backlog was read: {:#?}", not_ok(&obs));

    append(&paths.kmsg, format!("4,1000,7190000000,-;{XID79_LINE}\n").as_bytes());
    tokio::time::timeout(Duration::from_secs(1), events.raised())
        .await
        .expect("no event within 1 s of the Xid line");
    let obs = run(&mut check, &paths);
    let xid = find(&obs, "xid", "0000:3b:00");
    assert_finding(xid, Status::Fail, RecommendedAction::Reboot);

    // Past the window the condition clears, and says so for that GPU.
    let later = SystemTime::now() + clear_after + Duration::from_secs(1);
    let obs = run_at(&mut check, &paths, later);
    let xid = find(&obs, "xid", "0000:3b:00");
    assert_eq!(xid.status, Status::Ok, "{xid:?}");
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));

    // A cut log (rotation) is read again from its start.
    std::fs::write(&paths.kmsg, "mce: [Hardware Error]: Machine check events logged\n").unwrap();
    tokio::time::timeout(Duration::from_secs(1), events.raised())
        .await
        .expect("no event after the log was cut");
    let obs = run(&mut check, &paths);
    assert_eq!(find(&obs, "mce", "").status, Status::Warn);
    drop(check);
}

#[test]
fn daemon_follows_a_log_that_appears_later() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    let config =
        KernelLogConfig { poll_interval: Duration::from_millis(20), ..KernelLogConfig::default() };
    let (mut check, _events) = build(&config, &paths, Mode::Daemon);
    assert_eq!(find(&run(&mut check, &paths), "kernel_log", "").status, Status::Unknown);
    std::fs::write(&paths.kmsg, format!("{XID79_LINE}\n")).unwrap();
    // Reopened within about a second; everything in a log that appeared is new.
    let seen = eventually(Duration::from_secs(3), || {
        let obs = run(&mut check, &paths);
        obs.findings.iter().any(|f| f.finding == "xid" && f.status == Status::Fail)
            && find(&obs, "kernel_log", "").status == Status::Ok
    });
    assert!(seen, "{:#?}", run(&mut check, &paths).findings);
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(0x5eed_f1ee7);
    let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
    // A very long line without a newline, and kmsg-looking prefixes with garbage after them.
    bytes.extend(std::iter::repeat_n(b'a', 1 << 20));
    bytes.extend_from_slice(
        b"\n4,1,99999999999999999999999,-;\xff\xfe\n;;;,,,\n[99999999999999999999.1] x\n",
    );
    bytes
}

#[test]
fn random_bytes_never_panic_or_match() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    std::fs::write(&paths.kmsg, random_bytes(256 * 1024)).unwrap();
    let (mut check, _) = build(&KernelLogConfig::default(), &paths, Mode::Once);
    let obs = run(&mut check, &paths);
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
    assert!(sample(&obs, metrics::KMSG_LINES.name, &[]).expect("kmsg lines") > 100.0);
    let matches: f64 = obs
        .samples
        .iter()
        .filter(|s| s.desc.name == metrics::KMSG_MATCHES.name)
        .map(|s| s.value)
        .sum();
    assert_eq!(matches, 0.0);
    assert!(obs.findings.iter().all(|f| f.message.chars().count() <= 300));
}

#[test]
fn random_bytes_in_daemon_mode_leave_the_follower_working() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    std::fs::write(&paths.kmsg, b"").unwrap();
    let config =
        KernelLogConfig { poll_interval: Duration::from_millis(20), ..KernelLogConfig::default() };
    let (mut check, _events) = build(&config, &paths, Mode::Daemon);
    append(&paths.kmsg, &random_bytes(64 * 1024));
    append(&paths.kmsg, format!("\n{XID79_LINE}\n").as_bytes());
    let seen = eventually(Duration::from_secs(3), || {
        run(&mut check, &paths).findings.iter().any(|f| f.finding == "xid")
    });
    assert!(seen, "the Xid after the garbage was not seen");
}

#[test]
fn bad_rules_are_refused_naming_each_field() {
    let config = AgentConfig::parse(
        r#"
[[checks.kernel_log.rules]]
name = "broken_regex"
pattern = "Xid (unclosed"
finding = "xid_custom"

[[checks.kernel_log.rules]]
name = "bad_status"
pattern = "something"
finding = "something"
status = "catastrophic"
action = "pray"

[[checks.kernel_log.rules]]
name = ""
pattern = "disk (?P<disk>sd[a-z]+) failed"
finding = "disk_failed"
subject = "${device}"

[[checks.kernel_log.rules]]
name = "bad_status"
pattern = "x"
finding = "x"
"#,
    )
    .unwrap();
    let problems = config.validate();
    let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
    for field in [
        "checks.kernel_log.rules[0].pattern",
        "checks.kernel_log.rules[1].status",
        "checks.kernel_log.rules[1].action",
        "checks.kernel_log.rules[2].name",
        "checks.kernel_log.rules[2].subject",
        "checks.kernel_log.rules[3].name",
    ] {
        assert!(fields.contains(&field), "{field} missing from\n{problems}");
    }
    assert_eq!(problems.0.len(), 6, "{problems}");
    let subject = problems.0.iter().find(|p| p.field.ends_with("[2].subject")).unwrap();
    assert!(subject.message.contains("device"), "{}", subject.message);

    let good = AgentConfig::parse(
        r#"
[checks.kernel_log]
poll_interval = "50ms"

[[checks.kernel_log.rules]]
name = "gpu_lost"
pattern = "GPU (?P<pci>[0-9a-f:.]+): GPU has fallen off the bus"
finding = "gpu_lost"
status = "fail"
action = "reboot"
subject = "${pci}"
clear_after = "30m"
"#,
    )
    .unwrap();
    assert!(good.validate().is_empty(), "{}", good.validate());
}

#[test]
fn a_rule_that_does_not_compile_is_an_unknown_finding() {
    // Validation would refuse it; a check built without validation must still not panic.
    let config = KernelLogConfig {
        rules: vec![KernelLogRule {
            name: "broken".into(),
            pattern: "(".into(),
            finding: "broken".into(),
            ..KernelLogRule::default()
        }],
        ..KernelLogConfig::default()
    };
    let paths = HostPaths::tree(&fixture("kmsg_xid48"));
    let (mut check, _) = build(&config, &paths, Mode::Once);
    let obs = run(&mut check, &paths);
    assert_eq!(find(&obs, "kernel_log_rule", "broken").status, Status::Unknown);
    assert_eq!(find(&obs, "xid", "0000:18:00").status, Status::Fail);
}

#[test]
fn builtin_rules_can_be_turned_off() {
    let config = KernelLogConfig { builtin_rules: false, ..KernelLogConfig::default() };
    let paths = HostPaths::tree(&fixture("kmsg_xid79"));
    let (mut check, _) = build(&config, &paths, Mode::Once);
    let obs = run(&mut check, &paths);
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
}

/// The real kernel log of this machine, where it can be read: records parse and nothing breaks.
#[test]
fn reads_the_real_kmsg_backlog_when_readable() {
    let kmsg = Path::new("/dev/kmsg");
    if std::fs::File::open(kmsg).is_err() {
        // Not readable here (no permission, no device): the check must say so, not fail.
        let paths = HostPaths { kmsg: kmsg.to_owned(), ..HostPaths::default() };
        let (mut check, _) = build(&KernelLogConfig::default(), &paths, Mode::Once);
        assert_eq!(find(&run(&mut check, &paths), "kernel_log", "").status, Status::Unknown);
        return;
    }
    let paths = HostPaths::default();
    let (mut check, _) = build(&KernelLogConfig::default(), &paths, Mode::Once);
    let obs = run(&mut check, &paths);
    assert_eq!(find(&obs, "kernel_log", "").status, Status::Ok, "{:#?}", obs.findings);
    assert!(sample(&obs, metrics::KMSG_LINES.name, &[]).expect("kmsg lines") > 0.0);
}
