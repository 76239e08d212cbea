//! Bounds on every collection and string of the wire types, in one place: the repairer refuses a
//! body past one of them (naming the field), and the agent cuts what it sends to them, so the two
//! never disagree.
//!
//! The limits are far above what a real agent sends (an 8-GPU node with NVLink and NIC findings
//! carries a few dozen findings of at most seven labels, names of a few dozen bytes, messages of at
//! most a few hundred): they exist so that one careless or hostile client cannot make the repairer
//! store and serve tens of thousands of labels on one finding, not to police real agents. Strings are
//! measured in bytes of UTF-8. The body limit (`max_body_bytes`) bounds what is not listed here
//! (an evidence item's `content`, which is the payload itself).

use std::collections::BTreeMap;

use crate::jobs::{Progress, RankStatus};
use crate::{CheckRun, CommandResult, EvidenceBundle, EvidenceItem, Finding, Report};

/// Findings one report, or one deep check's result, may carry. A report carries only the findings
/// that are not ok: a few dozen on a sick node, 256 per kernel-log rule at the very most.
pub const MAX_FINDINGS: usize = 10_000;
/// Check runs one report may carry: one per check of the agent (six today).
pub const MAX_CHECKS: usize = 256;
/// Labels on one finding: the agent's checks put at most seven (a PCIe link's), a kernel-log rule
/// one per named capture group.
pub const MAX_LABELS: usize = 64;
/// A label's key: a capture group's name or a fixed word (`pci`, `xid`, `links`).
pub const MAX_LABEL_KEY_BYTES: usize = 128;
/// A label's value: the agent cuts captured values to 64 characters (256 bytes at most); a PCI
/// address or a list of NVLink numbers is far shorter.
pub const MAX_LABEL_VALUE_BYTES: usize = 1024;
/// A check's or a finding's name, a command's kind, an evidence item's name or encoding: machine
/// words of a few dozen bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// A finding's subject: a GPU index, an interface, a PCI address, a mount point (a path, so
/// `PATH_MAX`).
pub const MAX_SUBJECT_BYTES: usize = 4096;
/// A human sentence: a finding's, a command result's or a rank's message, an evidence item's
/// error. The kernel-log check cuts its messages to 300 characters; a deep check's names eight
/// problems and a probe's carries 1 KiB of its output.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// An identifier: a boot id, an agent version, a command id, a job id (the agent takes job names
/// of at most 200 bytes, the queue makes `j-<n>`).
pub const MAX_ID_BYTES: usize = 256;
/// The host other nodes reach a node at: a DNS name (253) or an IP address.
pub const MAX_ADDRESS_BYTES: usize = 255;
/// Command results one report may carry: what finished since the last delivered report (a few).
pub const MAX_COMMAND_RESULTS: usize = 1024;
/// Ranks one report may carry: the running ones and those that ended within the retention window
/// (the agent remembers 1024 ended ranks at most).
pub const MAX_RANKS: usize = 4096;
/// Items of one evidence bundle: the kernel log, the agent's state and each configured tool.
pub const MAX_EVIDENCE_ITEMS: usize = 256;
/// Where an evidence item came from: a path or a command line.
pub const MAX_SOURCE_BYTES: usize = 4096;
/// Ranks of one job, and so the ranks one progress post may be waiting for.
pub const MAX_JOB_RANKS: u32 = 100_000;
/// Arguments of a job's program.
pub const MAX_ARGS: usize = 1024;
/// One argument, or one `KEY=value` of the environment: the kernel's own limit on one string of a
/// new program's arguments or environment (`MAX_ARG_STRLEN`).
pub const MAX_ARG_BYTES: usize = 128 * 1024;
/// Variables a job adds to its ranks' environment.
pub const MAX_ENV: usize = 256;
/// A path (a checkpoint directory): `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;

/// A field past its bound: `findings[3].labels: 30000 labels is more than 64`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct OutOfBounds {
    /// The field's path in the body: `findings[3].labels`, `command_results[0].message`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// `items` has at most `max` entries (`what` names one: "labels").
pub fn check_count(
    len: usize,
    max: usize,
    what: &str,
    field: impl FnOnce() -> String,
) -> Result<(), OutOfBounds> {
    if len <= max {
        return Ok(());
    }
    Err(OutOfBounds { field: field(), problem: format!("{len} {what} is more than {max}") })
}

/// `text` is at most `max` bytes long.
pub fn check_text(
    text: &str,
    max: usize,
    field: impl FnOnce() -> String,
) -> Result<(), OutOfBounds> {
    if text.len() <= max {
        return Ok(());
    }
    Err(OutOfBounds { field: field(), problem: format!("{} bytes is more than {max}", text.len()) })
}

/// Every bound of a report, its findings, command results and ranks; the first field past one.
pub fn check_report(report: &Report) -> Result<(), OutOfBounds> {
    check_text(&report.boot_id, MAX_ID_BYTES, || "boot_id".to_owned())?;
    check_text(&report.agent_version, MAX_ID_BYTES, || "agent_version".to_owned())?;
    if let Some(address) = &report.address {
        check_text(address, MAX_ADDRESS_BYTES, || "address".to_owned())?;
    }
    check_count(report.checks.len(), MAX_CHECKS, "checks", || "checks".to_owned())?;
    for (i, run) in report.checks.iter().enumerate() {
        check_check_run(run, &|| format!("checks[{i}]"))?;
    }
    check_findings(&report.findings, &|| "findings".to_owned())?;
    check_count(report.command_results.len(), MAX_COMMAND_RESULTS, "command results", || {
        "command_results".to_owned()
    })?;
    for (i, result) in report.command_results.iter().enumerate() {
        check_command_result(result, &|| format!("command_results[{i}]"))?;
    }
    check_count(report.ranks.len(), MAX_RANKS, "ranks", || "ranks".to_owned())?;
    for (i, rank) in report.ranks.iter().enumerate() {
        check_rank_status(rank, &|| format!("ranks[{i}]"))?;
    }
    Ok(())
}

/// Every bound of a rank's progress post.
pub fn check_progress(progress: &Progress) -> Result<(), OutOfBounds> {
    check_text(&progress.job, MAX_ID_BYTES, || "job".to_owned())?;
    check_count(progress.waiting_for.len(), MAX_JOB_RANKS as usize, "ranks", || {
        "waiting_for".to_owned()
    })
}

fn check_check_run(run: &CheckRun, at: &dyn Fn() -> String) -> Result<(), OutOfBounds> {
    check_text(&run.check, MAX_NAME_BYTES, || format!("{}.check", at()))
}

fn check_findings(findings: &[Finding], at: &dyn Fn() -> String) -> Result<(), OutOfBounds> {
    check_count(findings.len(), MAX_FINDINGS, "findings", at)?;
    for (i, finding) in findings.iter().enumerate() {
        check_finding(finding, &|| format!("{}[{i}]", at()))?;
    }
    Ok(())
}

fn check_finding(finding: &Finding, at: &dyn Fn() -> String) -> Result<(), OutOfBounds> {
    // A finding names its check and itself, wherever it is (a report's or a command result's).
    for (name, field) in [(&finding.check, "check"), (&finding.finding, "finding")] {
        if name.is_empty() {
            let problem = "must not be empty".to_owned();
            return Err(OutOfBounds { field: format!("{}.{field}", at()), problem });
        }
        check_text(name, MAX_NAME_BYTES, || format!("{}.{field}", at()))?;
    }
    check_text(&finding.subject, MAX_SUBJECT_BYTES, || format!("{}.subject", at()))?;
    check_text(&finding.message, MAX_MESSAGE_BYTES, || format!("{}.message", at()))?;
    check_count(finding.labels.len(), MAX_LABELS, "labels", || format!("{}.labels", at()))?;
    for (key, value) in &finding.labels {
        // The key may be the long part: its first bytes name it.
        check_text(key, MAX_LABEL_KEY_BYTES, || {
            format!("{}.labels key {:?}…", at(), cut_str(key, 32))
        })?;
        check_text(value, MAX_LABEL_VALUE_BYTES, || format!("{}.labels.{key}", at()))?;
    }
    Ok(())
}

fn check_command_result(
    result: &CommandResult,
    at: &dyn Fn() -> String,
) -> Result<(), OutOfBounds> {
    check_text(&result.id, MAX_ID_BYTES, || format!("{}.id", at()))?;
    check_text(&result.kind, MAX_NAME_BYTES, || format!("{}.kind", at()))?;
    check_text(&result.message, MAX_MESSAGE_BYTES, || format!("{}.message", at()))?;
    check_findings(&result.findings, &|| format!("{}.findings", at()))?;
    if let Some(bundle) = &result.evidence {
        check_evidence(bundle, &|| format!("{}.evidence", at()))?;
    }
    Ok(())
}

fn check_evidence(bundle: &EvidenceBundle, at: &dyn Fn() -> String) -> Result<(), OutOfBounds> {
    check_text(&bundle.node, MAX_ADDRESS_BYTES, || format!("{}.node", at()))?;
    check_text(&bundle.boot_id, MAX_ID_BYTES, || format!("{}.boot_id", at()))?;
    check_count(bundle.items.len(), MAX_EVIDENCE_ITEMS, "items", || format!("{}.items", at()))?;
    for (i, item) in bundle.items.iter().enumerate() {
        check_evidence_item(item, &|| format!("{}.items[{i}]", at()))?;
    }
    Ok(())
}

fn check_evidence_item(item: &EvidenceItem, at: &dyn Fn() -> String) -> Result<(), OutOfBounds> {
    check_text(&item.name, MAX_NAME_BYTES, || format!("{}.name", at()))?;
    check_text(&item.source, MAX_SOURCE_BYTES, || format!("{}.source", at()))?;
    check_text(&item.encoding, MAX_NAME_BYTES, || format!("{}.encoding", at()))?;
    if let Some(error) = &item.error {
        check_text(error, MAX_MESSAGE_BYTES, || format!("{}.error", at()))?;
    }
    Ok(())
}

fn check_rank_status(rank: &RankStatus, at: &dyn Fn() -> String) -> Result<(), OutOfBounds> {
    check_text(&rank.key.job, MAX_ID_BYTES, || format!("{}.job", at()))?;
    check_text(&rank.message, MAX_MESSAGE_BYTES, || format!("{}.message", at()))
}

/// Cuts `report` to the bounds: strings to their length (at a character boundary), lists to their
/// count. Returns how many fields it cut; 0 for anything a real agent builds.
pub fn fit_report(report: &mut Report) -> usize {
    let mut cut = 0;
    cut += fit_text(&mut report.boot_id, MAX_ID_BYTES);
    cut += fit_text(&mut report.agent_version, MAX_ID_BYTES);
    if let Some(address) = &mut report.address {
        cut += fit_text(address, MAX_ADDRESS_BYTES);
    }
    cut += fit_count(&mut report.checks, MAX_CHECKS);
    for run in &mut report.checks {
        cut += fit_text(&mut run.check, MAX_NAME_BYTES);
    }
    cut += fit_findings(&mut report.findings);
    cut += fit_count(&mut report.command_results, MAX_COMMAND_RESULTS);
    for result in &mut report.command_results {
        cut += fit_command_result(result);
    }
    cut += fit_count(&mut report.ranks, MAX_RANKS);
    for rank in &mut report.ranks {
        cut += fit_text(&mut rank.key.job, MAX_ID_BYTES);
        cut += fit_text(&mut rank.message, MAX_MESSAGE_BYTES);
    }
    cut
}

/// Cuts one command result to the bounds (see [`fit_report`]); how many fields it cut.
pub fn fit_command_result(result: &mut CommandResult) -> usize {
    let mut cut = fit_text(&mut result.id, MAX_ID_BYTES);
    cut += fit_text(&mut result.kind, MAX_NAME_BYTES);
    cut += fit_text(&mut result.message, MAX_MESSAGE_BYTES);
    cut += fit_findings(&mut result.findings);
    if let Some(bundle) = &mut result.evidence {
        cut += fit_text(&mut bundle.node, MAX_ADDRESS_BYTES);
        cut += fit_text(&mut bundle.boot_id, MAX_ID_BYTES);
        cut += fit_count(&mut bundle.items, MAX_EVIDENCE_ITEMS);
        for item in &mut bundle.items {
            cut += fit_text(&mut item.name, MAX_NAME_BYTES);
            cut += fit_text(&mut item.source, MAX_SOURCE_BYTES);
            cut += fit_text(&mut item.encoding, MAX_NAME_BYTES);
            if let Some(error) = &mut item.error {
                cut += fit_text(error, MAX_MESSAGE_BYTES);
            }
        }
    }
    cut
}

fn fit_findings(findings: &mut Vec<Finding>) -> usize {
    let mut cut = fit_count(findings, MAX_FINDINGS);
    for finding in findings {
        cut += fit_text(&mut finding.check, MAX_NAME_BYTES);
        cut += fit_text(&mut finding.finding, MAX_NAME_BYTES);
        cut += fit_text(&mut finding.subject, MAX_SUBJECT_BYTES);
        cut += fit_text(&mut finding.message, MAX_MESSAGE_BYTES);
        let fits = finding.labels.len() <= MAX_LABELS
            && finding.labels.iter().all(|(key, value)| {
                key.len() <= MAX_LABEL_KEY_BYTES && value.len() <= MAX_LABEL_VALUE_BYTES
            });
        if !fits {
            cut += 1;
            let labels = std::mem::take(&mut finding.labels);
            finding.labels = labels
                .into_iter()
                .take(MAX_LABELS)
                .map(|(key, value)| {
                    let key = cut_str(&key, MAX_LABEL_KEY_BYTES).to_owned();
                    (key, cut_str(&value, MAX_LABEL_VALUE_BYTES).to_owned())
                })
                .collect::<BTreeMap<_, _>>();
        }
    }
    cut
}

fn fit_count<T>(items: &mut Vec<T>, max: usize) -> usize {
    if items.len() <= max {
        return 0;
    }
    items.truncate(max);
    1
}

fn fit_text(text: &mut String, max: usize) -> usize {
    if text.len() <= max {
        return 0;
    }
    let keep = cut_str(text, max).len();
    text.truncate(keep);
    1
}

/// The longest start of `text` of at most `max` bytes that ends at a character boundary.
fn cut_str(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{RankKey, RankState};
    use crate::{RecommendedAction, ReportTrigger, Status, Verdict, WIRE_VERSION};

    fn finding(labels: usize) -> Finding {
        let mut finding =
            Finding::new("gpu", "xid", "0", Status::Fail, RecommendedAction::Reboot, "Xid 79");
        for i in 0..labels {
            finding.labels.insert(format!("k{i}"), "v".to_owned());
        }
        finding
    }

    fn report() -> Report {
        Report {
            wire_version: WIRE_VERSION,
            node: "n1".to_owned(),
            boot_id: "b1".to_owned(),
            agent_version: "1".to_owned(),
            seq: 1,
            sent_at_ms: 1,
            trigger: ReportTrigger::Interval,
            verdict: Verdict::Unhealthy,
            checks: Vec::new(),
            findings: vec![finding(1)],
            command_results: Vec::new(),
            address: None,
            ranks: Vec::new(),
            metrics_port: None,
        }
    }

    fn rank(job: &str, message: &str) -> RankStatus {
        RankStatus {
            key: RankKey { job: job.to_owned(), attempt: 0, rank: 0 },
            state: RankState::FailedToStart,
            pid: None,
            exit_code: None,
            signal: None,
            message: message.to_owned(),
            started_at_ms: 1,
            finished_at_ms: None,
        }
    }

    fn result(message: &str, findings: Vec<Finding>) -> CommandResult {
        CommandResult {
            id: "c1".to_owned(),
            kind: crate::command_kind::DEEP_CHECK.to_owned(),
            ok: false,
            message: message.to_owned(),
            verdict: None,
            findings,
            evidence: None,
            allreduce: None,
            finished_at_ms: 1,
        }
    }

    /// A report with every bounded field at its bound plus `over` bytes or entries. The first of
    /// each list carries the long strings, the rest are small (the test stays light).
    fn report_at(over: usize) -> Report {
        let text = |max: usize| "é".repeat(max / 2) + &"x".repeat(max % 2 + over);
        let mut labelled = finding(MAX_LABELS + over);
        labelled.check = text(MAX_NAME_BYTES);
        labelled.finding = text(MAX_NAME_BYTES);
        labelled.subject = text(MAX_SUBJECT_BYTES);
        labelled.message = text(MAX_MESSAGE_BYTES);
        labelled.labels.insert(text(MAX_LABEL_KEY_BYTES), text(MAX_LABEL_VALUE_BYTES));
        labelled.labels.pop_first();
        let mut evidence =
            EvidenceItem::text(&text(MAX_NAME_BYTES), &text(MAX_SOURCE_BYTES), "x".repeat(1000));
        evidence.encoding = text(MAX_NAME_BYTES);
        evidence.error = Some(text(MAX_MESSAGE_BYTES));
        let mut command = result(&text(MAX_MESSAGE_BYTES), vec![labelled.clone(); 2]);
        command.id = text(MAX_ID_BYTES);
        command.kind = text(MAX_NAME_BYTES);
        command.evidence = Some(EvidenceBundle {
            node: text(MAX_ADDRESS_BYTES),
            boot_id: text(MAX_ID_BYTES),
            collected_at_ms: 1,
            took_ms: 1,
            items: vec![evidence; MAX_EVIDENCE_ITEMS + over],
        });
        let run = CheckRun {
            check: text(MAX_NAME_BYTES),
            status: Status::Fail,
            duration_seconds: 1.0,
            timed_out: false,
            finished_at_ms: 1,
        };
        Report {
            boot_id: text(MAX_ID_BYTES),
            agent_version: text(MAX_ID_BYTES),
            address: Some(text(MAX_ADDRESS_BYTES)),
            checks: vec![run; MAX_CHECKS + over],
            findings: [vec![labelled], vec![finding(0); MAX_FINDINGS - 1 + over]].concat(),
            command_results: [
                vec![command],
                vec![result("", Vec::new()); MAX_COMMAND_RESULTS - 1 + over],
            ]
            .concat(),
            ranks: [
                vec![rank(&text(MAX_ID_BYTES), &text(MAX_MESSAGE_BYTES))],
                vec![rank("j-1", ""); MAX_RANKS - 1 + over],
            ]
            .concat(),
            ..report()
        }
    }

    #[test]
    fn a_report_at_every_bound_passes() {
        assert_eq!(check_report(&report()), Ok(()));
        let mut at = report_at(0);
        assert_eq!(check_report(&at), Ok(()));
        assert_eq!(fit_report(&mut at), 0, "fitting cuts nothing that is within the bounds");
    }

    #[test]
    fn each_bound_names_its_field() {
        let refused = |change: &dyn Fn(&mut Report)| {
            let mut report = report();
            change(&mut report);
            check_report(&report).unwrap_err().to_string()
        };
        let long = |n: usize| "x".repeat(n + 1);
        type Change<'a> = Box<dyn Fn(&mut Report) + 'a>;
        let cases: Vec<(&str, Change<'_>)> = vec![
            (
                "findings[0].labels: 30000 labels is more than 64",
                Box::new(|r| r.findings[0] = finding(30_000)),
            ),
            (
                "findings[0].labels.k: 1025 bytes is more than 1024",
                Box::new(|r| {
                    r.findings[0].labels.insert("k".into(), long(MAX_LABEL_VALUE_BYTES));
                }),
            ),
            (
                "findings[0].labels key \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"…: 129 bytes is more than 128",
                Box::new(|r| {
                    r.findings[0].labels.insert(long(MAX_LABEL_KEY_BYTES), "v".into());
                }),
            ),
            (
                "findings[0].message: 16385 bytes is more than 16384",
                Box::new(|r| r.findings[0].message = long(MAX_MESSAGE_BYTES)),
            ),
            (
                "findings[0].check: 129 bytes is more than 128",
                Box::new(|r| r.findings[0].check = long(MAX_NAME_BYTES)),
            ),
            (
                "findings[0].finding: 129 bytes",
                Box::new(|r| r.findings[0].finding = long(MAX_NAME_BYTES)),
            ),
            (
                "findings[0].subject: 4097 bytes",
                Box::new(|r| r.findings[0].subject = long(MAX_SUBJECT_BYTES)),
            ),
            (
                "findings: 10001 findings is more than 10000",
                Box::new(|r| r.findings = vec![finding(0); MAX_FINDINGS + 1]),
            ),
            (
                "checks: 257 checks is more than 256",
                Box::new(|r| {
                    r.checks = vec![
                        CheckRun {
                            check: "gpu".into(),
                            status: Status::Ok,
                            duration_seconds: 0.1,
                            timed_out: false,
                            finished_at_ms: 1,
                        };
                        MAX_CHECKS + 1
                    ]
                }),
            ),
            (
                "ranks: 4097 ranks is more than 4096",
                Box::new(|r| r.ranks = vec![rank("j-1", ""); MAX_RANKS + 1]),
            ),
            (
                "ranks[0].job: 257 bytes",
                Box::new(|r| r.ranks = vec![rank(&long(MAX_ID_BYTES), "")]),
            ),
            (
                "ranks[0].message: 16385 bytes",
                Box::new(|r| r.ranks = vec![rank("j-1", &long(MAX_MESSAGE_BYTES))]),
            ),
            (
                "command_results: 1025 command results is more than 1024",
                Box::new(|r| {
                    r.command_results = vec![result("", Vec::new()); MAX_COMMAND_RESULTS + 1]
                }),
            ),
            (
                "findings[0].check: must not be empty",
                Box::new(|r| r.findings = vec![Finding { check: String::new(), ..finding(0) }]),
            ),
            (
                // Schemathesis found a command result's nameless finding taken.
                "command_results[0].findings[1].finding: must not be empty",
                Box::new(|r| {
                    let nameless = Finding { finding: String::new(), ..finding(0) };
                    r.command_results = vec![result("", vec![finding(0), nameless])]
                }),
            ),
            (
                "command_results[0].findings[1].labels: 65 labels is more than 64",
                Box::new(|r| r.command_results = vec![result("", vec![finding(1), finding(65)])]),
            ),
            (
                "command_results[0].message: 16385 bytes",
                Box::new(|r| {
                    r.command_results = vec![result(&long(MAX_MESSAGE_BYTES), Vec::new())]
                }),
            ),
            (
                "command_results[0].evidence.items: 257 items is more than 256",
                Box::new(|r| {
                    let mut result = result("", Vec::new());
                    result.evidence = Some(EvidenceBundle {
                        node: "n1".into(),
                        boot_id: "b1".into(),
                        collected_at_ms: 1,
                        took_ms: 1,
                        items: vec![EvidenceItem::text("a", "b", String::new()); 257],
                    });
                    r.command_results = vec![result];
                }),
            ),
            ("address: 256 bytes", Box::new(|r| r.address = Some(long(MAX_ADDRESS_BYTES)))),
            ("boot_id: 257 bytes", Box::new(|r| r.boot_id = long(MAX_ID_BYTES))),
            ("agent_version: 257 bytes", Box::new(|r| r.agent_version = long(MAX_ID_BYTES))),
        ];
        for (want, change) in &cases {
            let error = refused(change.as_ref());
            assert!(error.starts_with(want), "{error:?} is not {want:?}");
        }
    }

    #[test]
    fn a_report_past_every_bound_is_fitted_to_them() {
        let mut over = report_at(3);
        assert!(check_report(&over).is_err());
        assert!(fit_report(&mut over) > 0);
        assert_eq!(check_report(&over), Ok(()));
        assert_eq!(over.findings.len(), MAX_FINDINGS);
        assert!(over.findings[0].message.ends_with('é'), "cut at a character boundary");
        assert_eq!(fit_report(&mut over), 0, "a fitted report fits");
    }

    #[test]
    fn progress_is_bounded_too() {
        let mut progress: Progress = serde_json::from_str(
            r#"{"job":"j","attempt":0,"rank":0,"step":5,"loss":1.0,"samples_per_second":1.0,"at_ms":1}"#,
        )
        .unwrap();
        progress.waiting_for = (0..MAX_JOB_RANKS).collect();
        assert_eq!(check_progress(&progress), Ok(()));
        progress.waiting_for.push(0);
        let error = check_progress(&progress).unwrap_err().to_string();
        assert_eq!(error, "waiting_for: 100001 ranks is more than 100000");
        progress.job = "j".repeat(MAX_ID_BYTES + 1);
        assert!(check_progress(&progress).unwrap_err().to_string().starts_with("job: 257 bytes"));
    }
}
