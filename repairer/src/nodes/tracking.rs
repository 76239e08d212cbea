//! A node's tracked findings: what a report, an alert or the repairer's own look at the node
//! brings in replaces what its source said before, and when the node turned unhealthy for the
//! breaker.

use std::collections::BTreeSet;

use fleetmend_proto::{CheckRun, Finding, Status};

use super::NodeRecord;
use crate::model::{FindingKey, FindingSource, TrackedFinding};
use crate::policy::{BOOT_GRACE, BOOT_TRANSIENTS};

/// The source a finding on `node` was tracked from (agent unless tracked otherwise).
pub(crate) fn source_of(node: &NodeRecord, finding: &Finding) -> FindingSource {
    node.findings
        .iter()
        .find(|t| {
            t.finding.check == finding.check
                && t.finding.finding == finding.finding
                && t.finding.subject == finding.subject
        })
        .map(|t| t.source)
        .unwrap_or(FindingSource::Agent)
}

/// Replaces the tracked findings of `source` with `incoming`; true when the set of keys or a
/// status changed (a heartbeat with the same findings only counts observations). `runs` are the
/// report's check runs: a finding whose check has not run again since its last observation (a
/// report sent for a kernel line, a command's result or a rank's exit, carrying the check's
/// result from before) is not observed again.
pub(crate) fn track(
    node: &mut NodeRecord,
    source: FindingSource,
    incoming: &[&Finding],
    runs: &[CheckRun],
    now: u64,
) -> bool {
    let looked = |check: &str| runs.iter().find(|r| r.check == check).map(|r| r.finished_at_ms);
    let mut changed = false;
    let mut kept: Vec<TrackedFinding> = Vec::with_capacity(node.findings.len());
    let mut seen: BTreeSet<FindingKey> = BTreeSet::new();
    for finding in incoming {
        let key = FindingKey::of(finding, source);
        if !seen.insert(key.clone()) {
            continue;
        }
        match node.findings.iter().find(|t| t.key() == key) {
            Some(existing) => {
                let status_changed = existing.finding.status != finding.status;
                changed |= status_changed;
                let looked_ms = looked(&finding.check);
                let again = looked_ms.is_none() || looked_ms != existing.looked_ms;
                kept.push(TrackedFinding {
                    finding: (*finding).clone(),
                    source,
                    first_seen_ms: existing.first_seen_ms,
                    last_seen_ms: now,
                    observations: existing.observations.saturating_add(u32::from(again)),
                    looked_ms,
                });
                // A second observation can satisfy a debounce: decide again.
                changed |= again && existing.observations == 1;
            }
            None => {
                changed = true;
                kept.push(TrackedFinding {
                    finding: (*finding).clone(),
                    source,
                    first_seen_ms: now,
                    last_seen_ms: now,
                    observations: 1,
                    looked_ms: looked(&finding.check),
                });
            }
        }
    }
    let before = node.findings.iter().filter(|t| t.source == source).count();
    if before != kept.len() {
        changed = true;
    }
    let had_failing = node.has_failing();
    node.findings.retain(|t| t.source != source);
    node.findings.extend(kept);
    let cleared: Vec<FindingKey> = node
        .alerted
        .iter()
        .filter(|k| !node.findings.iter().any(|t| &t.key() == *k))
        .cloned()
        .collect();
    for key in cleared {
        node.alerted.remove(&key);
    }
    if node.has_failing() {
        let from = unhealthy_from(node, now);
        node.unhealthy_since_ms = Some(match node.unhealthy_since_ms {
            Some(since) if had_failing && since <= now => since,
            Some(since) if had_failing => since.min(from),
            _ => from,
        });
    } else {
        node.unhealthy_since_ms = None;
    }
    changed
}

/// When `node`, failing at `now`, turned unhealthy for the breaker: now; or, while every failing
/// finding is a fresh boot's transient within its grace (the built-in [`BOOT_TRANSIENTS`]), when
/// that grace ends. A fleet rebooted for planned work is no storm unless its links stay down.
fn unhealthy_from(node: &NodeRecord, now: u64) -> u64 {
    let Some(booted) = node.booted_ms else { return now };
    let grace_end = booted.saturating_add(BOOT_GRACE.as_millis() as u64);
    let transient = |t: &TrackedFinding| {
        t.source == FindingSource::Agent
            && BOOT_TRANSIENTS.contains(&t.finding.finding.as_str())
            && t.first_seen_ms < grace_end
    };
    let failing = node.findings.iter().filter(|t| t.finding.status == Status::Fail);
    if now < grace_end && failing.clone().all(transient) { grace_end } else { now }
}

pub(crate) fn remove_findings(
    node: &mut NodeRecord,
    pred: impl Fn(&TrackedFinding) -> bool,
) -> bool {
    let before = node.findings.len();
    node.findings.retain(|t| !pred(t));
    let changed = node.findings.len() != before;
    if changed && !node.has_failing() {
        node.unhealthy_since_ms = None;
    }
    changed
}
