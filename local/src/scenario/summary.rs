//! What a scenario measured: per fault, from the repairer's event log and the queue's attempt
//! records; over the faults, the percentiles the targets are stated in.

use std::fmt::Write as _;

use fleetmend_proto::stats::{nearest_rank, sorted_finite};
use fleetmend_repairer::model::{Event, EventKind, NodeState, Severity};
use fleetmend_repairer::queue::{AttemptRecord, JobState, JobView};
use serde::{Deserialize, Serialize};

use super::{Expect, FaultPlan, Scenario};
use crate::faults::Fault;

/// A fault as the runner injected it (or why it did not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Injection {
    /// Its place in the scenario (0-based).
    pub index: usize,
    /// The node it went to, once injected.
    pub node: Option<String>,
    /// The rank of the job that node ran then.
    pub rank: Option<u32>,
    /// When the fault was written (Unix ms, taken just before the write).
    pub at_ms: Option<u64>,
    /// The job's step then.
    pub step: Option<u64>,
    /// Why it was not injected.
    pub skipped: Option<String>,
}

/// The performance targets.
const DRAIN_P50_LIMIT_S: f64 = 1.0;
const DRAIN_P99_LIMIT_S: f64 = 2.0;
const RESUME_LIMIT_S: f64 = 15.0;

/// What the loop did about one fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultSummary {
    /// 1-based, as people count.
    pub number: usize,
    pub fault: Fault,
    pub persistent: bool,
    /// The node as the scenario named it (`rank:1`, `any-healthy`, a name).
    pub target: String,
    pub node: Option<String>,
    pub rank: Option<u32>,
    /// Seconds from the scenario's start to the fault.
    pub injected_at_s: Option<f64>,
    /// The job's step when the fault was written.
    pub at_step: Option<u64>,
    /// Why it was not injected.
    pub not_injected: Option<String>,
    /// Fault written → the repairer's first event about the node.
    pub detect_s: Option<f64>,
    /// Fault written → the node out of the scheduler (the workflow's drain done; else the
    /// draining or drained state).
    pub drain_s: Option<f64>,
    /// Whether the fault stopped the job (an attempt ended by a failure after it).
    pub job_restarted: bool,
    /// Restarts between this fault and the next (more than one: a resumed attempt failed again).
    pub restarts: u32,
    /// Fault written → the job's first step after its resume, wall clock.
    pub resume_total_s: Option<f64>,
    /// Of that, the time the job waited in the queue for nodes (reboots, validation, the spare).
    pub waiting_for_nodes_s: Option<f64>,
    /// Fault → first step after resume, not counting the wait for nodes.
    pub resume_s: Option<f64>,
    /// The step the job resumed from, and the last step before it stopped.
    pub resumed_from_step: Option<u64>,
    pub last_step_before: Option<u64>,
    /// Steps done again after the resume.
    pub steps_lost: Option<u64>,
    /// The repair actions in order (`reboot`, then `replace` when the reboot did not help).
    pub actions: Vec<String>,
    /// A reboot was issued to the provider.
    pub rebooted: bool,
    /// The spare that replaced the node.
    pub replaced_by: Option<String>,
    /// How the repair ended: repaired, drained, released, quarantined.
    pub outcome: Option<String>,
    /// The repairer's words for it.
    pub outcome_reason: Option<String>,
    /// The first hold on the node's action (breaker, cooldown, max unavailable...).
    pub held: Option<String>,
    /// The breaker opened after this fault.
    pub breaker_opened: bool,
    pub expect: Option<Expect>,
    /// Whether the repairer did what was expected (unset: nothing was expected).
    pub expectation_met: Option<bool>,
}

/// Percentiles of one measure over the faults that have it (nearest rank).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub count: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Stats {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Stats {
        let values = sorted_finite(values);
        Stats {
            count: values.len(),
            p50: nearest_rank(&values, 0.50),
            p99: nearest_rank(&values, 0.99),
            max: values.last().copied(),
        }
    }
}

/// One of the performance targets and whether this run met it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub name: String,
    /// The target, in words.
    pub limit: String,
    /// What this run measured, in words.
    pub measured: String,
    /// Unset when there was nothing to measure.
    pub met: Option<bool>,
}

/// The end of a scenario, for people ([`Summary::render`]) and as JSON (serde).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub scenario: String,
    pub description: String,
    /// When the scenario began (Unix ms) and how long it ran.
    pub started_ms: u64,
    pub wall_s: f64,
    pub job: Option<String>,
    pub job_state: Option<String>,
    pub restarts: u32,
    pub steps: u64,
    pub final_step: Option<u64>,
    /// The job's final weights hash (rank 0's `done` line).
    pub weights_sha256: Option<String>,
    /// An uninterrupted run's, and whether they are equal.
    pub reference_sha256: Option<String>,
    pub hash_matches: Option<bool>,
    pub reference_error: Option<String>,
    pub faults: Vec<FaultSummary>,
    pub detect: Stats,
    pub drain: Stats,
    pub resume: Stats,
    pub steps_lost_total: u64,
    pub targets: Vec<Target>,
    /// What went wrong: faults not injected, expectations not met, the job not completed, the
    /// weights differing.
    pub problems: Vec<String>,
    /// No problem.
    pub passed: bool,
}

/// Everything [`summarize`] reads.
#[derive(Debug)]
pub struct Observed<'a> {
    pub scenario: &'a Scenario,
    pub started_ms: u64,
    pub ended_ms: u64,
    pub injections: &'a [Injection],
    /// The repairer's event log, oldest first.
    pub events: &'a [Event],
    pub job: Option<&'a JobView>,
    pub weights_sha256: Option<String>,
    pub reference: Option<Result<String, String>>,
}

fn seconds(from_ms: u64, to_ms: u64) -> f64 {
    to_ms.saturating_sub(from_ms) as f64 / 1000.0
}

/// Sums up a scenario from what it observed. Pure: tests feed it recorded events.
pub fn summarize(observed: &Observed<'_>) -> Summary {
    let scenario = observed.scenario;
    let job_id = observed.job.map(|j| j.job.id.clone());
    let next_at: Vec<Option<u64>> = (0..observed.injections.len())
        .map(|i| observed.injections[i + 1..].iter().find_map(|n| n.at_ms))
        .collect();
    let faults: Vec<FaultSummary> = observed
        .injections
        .iter()
        .zip(&scenario.faults)
        .zip(next_at)
        .map(|((injection, plan), next)| {
            fault_summary(observed, injection, plan, next.unwrap_or(u64::MAX))
        })
        .collect();

    let detect = Stats::of(faults.iter().filter_map(|f| f.detect_s));
    let drain = Stats::of(faults.iter().filter_map(|f| f.drain_s));
    let resume = Stats::of(faults.iter().filter_map(|f| f.resume_s));
    let steps_lost_total = faults.iter().filter_map(|f| f.steps_lost).sum();

    let mut targets = Vec::new();
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2} s"));
    targets.push(Target {
        name: "fault → node drained".to_owned(),
        limit: format!("p50 < {DRAIN_P50_LIMIT_S} s, p99 < {DRAIN_P99_LIMIT_S} s"),
        measured: format!(
            "p50 {}, p99 {} over {} fault(s)",
            fmt(drain.p50),
            fmt(drain.p99),
            drain.count
        ),
        met: drain
            .p50
            .zip(drain.p99)
            .map(|(p50, p99)| p50 < DRAIN_P50_LIMIT_S && p99 < DRAIN_P99_LIMIT_S),
    });
    targets.push(Target {
        name: "fault → job's first step after resume, without reboot or provisioning".to_owned(),
        limit: format!("< {RESUME_LIMIT_S} s"),
        measured: format!(
            "p50 {}, max {} over {} restart(s)",
            fmt(resume.p50),
            fmt(resume.max),
            resume.count
        ),
        met: resume.max.map(|max| max < RESUME_LIMIT_S),
    });
    // Every fault here leaves the node's ranks running (they can still checkpoint), except a
    // killed agent, which takes nothing down but its reports.
    let lost: Vec<u64> = faults
        .iter()
        .filter(|f| f.fault != Fault::AgentKill)
        .filter_map(|f| f.steps_lost)
        .collect();
    targets.push(Target {
        name: "steps lost per fault when the node can still checkpoint".to_owned(),
        limit: "0".to_owned(),
        measured: format!("{lost:?}"),
        met: (!lost.is_empty()).then(|| lost.iter().all(|l| *l == 0)),
    });

    let mut problems = Vec::new();
    for fault in &faults {
        if let Some(why) = &fault.not_injected {
            problems
                .push(format!("fault {} ({}) was not injected: {why}", fault.number, fault.fault));
        }
        if fault.expectation_met == Some(false) {
            problems.push(format!(
                "fault {} ({} on {}): expected {}, got {}",
                fault.number,
                fault.fault,
                fault.node.as_deref().unwrap_or("?"),
                fault.expect.map_or("", Expect::as_str),
                describe_repair(fault),
            ));
        }
    }
    let job_state = observed.job.map(|j| j.job.state.to_string());
    match observed.job {
        Some(job) if job.job.state == JobState::Completed => {}
        Some(job) => problems.push(format!(
            "job {} did not complete: {} ({})",
            job.job.id, job.job.state, job.job.reason
        )),
        None => problems.push("the fleet runs no job".to_owned()),
    }
    let (reference_sha256, reference_error) = match &observed.reference {
        Some(Ok(hash)) => (Some(hash.clone()), None),
        Some(Err(err)) => (None, Some(err.clone())),
        None => (None, None),
    };
    let hash_matches = match (&observed.weights_sha256, &reference_sha256) {
        (Some(got), Some(want)) => Some(got == want),
        _ => None,
    };
    if scenario.compare_hash {
        match (hash_matches, &reference_error) {
            (Some(true), _) => {}
            (Some(false), _) => problems
                .push("the job's final weights differ from the uninterrupted run's".to_owned()),
            (None, Some(err)) => problems.push(format!("no reference hash: {err}")),
            (None, None) if observed.weights_sha256.is_none() && job_state.is_some() => {
                problems.push("the job's rank 0 log has no final weights hash".to_owned())
            }
            (None, None) => {}
        }
    }
    let passed = problems.is_empty();
    Summary {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        started_ms: observed.started_ms,
        wall_s: seconds(observed.started_ms, observed.ended_ms),
        job: job_id,
        job_state,
        restarts: observed.job.map_or(0, |j| j.job.restarts),
        steps: observed.job.map_or(0, |j| steps_of(&j.job.spec.argv)),
        final_step: observed.job.and_then(|j| j.step),
        weights_sha256: observed.weights_sha256.clone(),
        reference_sha256,
        hash_matches,
        reference_error,
        faults,
        detect,
        drain,
        resume,
        steps_lost_total,
        targets,
        problems,
        passed,
    }
}

/// The `--steps` of a trainer command line.
fn steps_of(argv: &[String]) -> u64 {
    argv.windows(2).find(|w| w[0] == "--steps").and_then(|w| w[1].parse().ok()).unwrap_or_default()
}

fn fault_summary(
    observed: &Observed<'_>,
    injection: &Injection,
    plan: &FaultPlan,
    next_at_ms: u64,
) -> FaultSummary {
    let mut summary = FaultSummary {
        number: injection.index + 1,
        fault: plan.fault,
        persistent: plan.persistent,
        target: plan.node.to_string(),
        node: injection.node.clone(),
        rank: injection.rank,
        injected_at_s: injection.at_ms.map(|at| seconds(observed.started_ms, at)),
        at_step: injection.step,
        not_injected: injection.skipped.clone(),
        detect_s: None,
        drain_s: None,
        job_restarted: false,
        restarts: 0,
        resume_total_s: None,
        waiting_for_nodes_s: None,
        resume_s: None,
        resumed_from_step: None,
        last_step_before: None,
        steps_lost: None,
        actions: Vec::new(),
        rebooted: false,
        replaced_by: None,
        outcome: None,
        outcome_reason: None,
        held: None,
        breaker_opened: false,
        expect: plan.expect,
        expectation_met: None,
    };
    let (Some(node), Some(at)) = (injection.node.as_deref(), injection.at_ms) else {
        summary.expectation_met = plan.expect.map(|_| false);
        return summary;
    };
    let after: Vec<&Event> = observed.events.iter().filter(|e| e.at_ms >= at).collect();
    let on_node: Vec<&Event> =
        after.iter().copied().filter(|e| e.node.as_deref() == Some(node)).collect();

    summary.detect_s = on_node
        .iter()
        .find(|e| {
            matches!(
                e.kind,
                EventKind::Finding
                    | EventKind::Decision
                    | EventKind::StateChanged
                    | EventKind::ActionHeld
                    | EventKind::WorkflowStep
            )
        })
        .map(|e| seconds(at, e.at_ms));
    let workflow = on_node
        .iter()
        .find(|e| e.kind == EventKind::StateChanged && e.workflow.is_some())
        .or_else(|| on_node.iter().find(|e| e.workflow.is_some()))
        .and_then(|e| e.workflow);
    // The ladder may take several workflows (a drain, then a reboot once the drain window
    // passed): all of the node's from the first on.
    let of_workflow: Vec<&Event> = match workflow {
        Some(id) => {
            on_node.iter().copied().filter(|e| e.workflow.is_some_and(|w| w >= id)).collect()
        }
        None => Vec::new(),
    };
    // The drain call returned: the workflow went on to its checkpoint step.
    let drained = of_workflow
        .iter()
        .find(|e| e.kind == EventKind::WorkflowStep && e.reason == "step Checkpoint")
        .or_else(|| {
            on_node.iter().find(|e| {
                e.kind == EventKind::StateChanged
                    && matches!(e.to_state, Some(NodeState::Drained | NodeState::Draining))
            })
        });
    summary.drain_s = drained.map(|e| seconds(at, e.at_ms));
    for event in &of_workflow {
        if let Some(action) = event.action
            && matches!(event.kind, EventKind::WorkflowStep | EventKind::RepairFinished)
            && summary.actions.last().map(String::as_str) != Some(action.as_str())
        {
            summary.actions.push(action.as_str().to_owned());
        }
    }
    summary.rebooted = of_workflow
        .iter()
        .any(|e| e.kind == EventKind::WorkflowStep && e.reason == "step AwaitBoot");
    let finished = of_workflow
        .iter()
        .rfind(|e| e.kind == EventKind::RepairFinished && !e.reason.contains("escalating"));
    if let Some(event) = finished {
        let reason = &event.reason;
        let outcome = if reason.ends_with("repaired and validated") {
            "repaired"
        } else if reason.starts_with("drained") {
            "drained"
        } else if reason.starts_with("quarantined") {
            "quarantined"
        } else if reason.starts_with("findings cleared") {
            "released"
        } else {
            "ended"
        };
        summary.outcome = Some(outcome.to_owned());
        summary.outcome_reason = Some(reason.clone());
    }
    let replaced = format!("replaced {node}");
    summary.replaced_by = after
        .iter()
        .find(|e| e.kind == EventKind::StateChanged && e.reason == replaced)
        .and_then(|e| e.node.clone());
    summary.held =
        on_node.iter().find(|e| e.kind == EventKind::ActionHeld).map(|e| e.reason.clone());
    summary.breaker_opened =
        after.iter().any(|e| e.kind == EventKind::Breaker && e.severity == Severity::Critical);

    if let Some(job) = observed.job {
        // The restarts this fault caused: attempts ended by a failure between it and the next
        // fault. Usually one; more when a restarted attempt failed again before it stepped.
        let history = &job.job.history;
        let restarts: Vec<(&AttemptRecord, &AttemptRecord)> = history
            .iter()
            .filter_map(|attempt| {
                let previous = history.iter().find(|p| p.attempt + 1 == attempt.attempt)?;
                let ended = previous.ended_ms?;
                (previous.failed && ended >= at && ended < next_at_ms)
                    .then_some((previous, attempt))
            })
            .collect();
        resume_figures(&mut summary, at, &restarts);
    }

    summary.expectation_met = plan.expect.map(|expect| {
        let repaired = summary.outcome.as_deref() == Some("repaired");
        match expect {
            Expect::None => workflow.is_none() && summary.held.is_none(),
            Expect::Alert => {
                workflow.is_none()
                    && on_node.iter().any(|e| {
                        e.kind == EventKind::Decision
                            && e.action.is_some_and(|a| a.as_str() == "alert")
                    })
            }
            // The ladder's first rung (what follows depends on whether the fault clears).
            Expect::Drain => summary.actions.first().map(String::as_str) == Some("drain"),
            Expect::Reboot => repaired && summary.rebooted && summary.actions == ["reboot"],
            Expect::Replace => repaired && summary.replaced_by.is_some(),
            Expect::Breaker => {
                summary.breaker_opened && !summary.rebooted && summary.replaced_by.is_none()
            }
        }
    });
    summary
}

fn resume_figures(
    summary: &mut FaultSummary,
    at: u64,
    restarts: &[(&AttemptRecord, &AttemptRecord)],
) {
    let Some((stopped, _)) = restarts.first() else { return };
    summary.job_restarted = true;
    summary.restarts = restarts.len() as u32;
    summary.last_step_before = stopped.last_step;
    // The first attempt that stepped again is the resume; the restarts before it count in its
    // time, all but their waits for nodes.
    let Some(index) = restarts.iter().position(|(_, a)| a.first_step_ms.is_some()) else {
        return;
    };
    let resumed = restarts[index].1;
    summary.resumed_from_step = resumed.resumed_from_step;
    summary.steps_lost = match (stopped.last_step, resumed.resumed_from_step) {
        (Some(last), Some(from)) => Some(last.saturating_sub(from)),
        _ => resumed.steps_lost,
    };
    if let Some(first) = resumed.first_step_ms {
        let total = seconds(at, first);
        // Between a requeue (the previous attempt's end) and the next attempt's start the job
        // waited for nodes: the reboot, the validation, the spare. The target leaves that out.
        let waiting: f64 = restarts[..=index]
            .iter()
            .map(|(previous, attempt)| seconds(previous.ended_ms.unwrap_or(at), attempt.started_ms))
            .sum();
        summary.resume_total_s = Some(total);
        summary.waiting_for_nodes_s = Some(waiting);
        summary.resume_s = Some((total - waiting).max(0.0));
    }
}

fn describe_repair(fault: &FaultSummary) -> String {
    let mut text =
        if fault.actions.is_empty() { "no repair".to_owned() } else { fault.actions.join(" → ") };
    if let Some(outcome) = &fault.outcome {
        text.push_str(&format!(", {outcome}"));
    }
    if let Some(spare) = &fault.replaced_by {
        text.push_str(&format!(" (replaced by {spare})"));
    }
    if let Some(held) = &fault.held {
        text.push_str(&format!("; held: {held}"));
    }
    if fault.breaker_opened {
        text.push_str("; the breaker opened");
    }
    text
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.2} s"))
}

impl Summary {
    /// The summary for people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "scenario {}: {}", self.scenario, self.description);
        for f in &self.faults {
            let persistent = if f.persistent { " (persistent)" } else { "" };
            let _ = write!(out, "fault {}: {}{persistent}", f.number, f.fault);
            if let Some(why) = &f.not_injected {
                let _ = writeln!(out, " on {}: not injected: {why}", f.target);
                continue;
            }
            let rank = f.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
            let _ = writeln!(
                out,
                " on {}{rank} at step {} (+{})",
                f.node.as_deref().unwrap_or("?"),
                f.at_step.map_or("-".to_owned(), |s| s.to_string()),
                secs(f.injected_at_s)
            );
            let _ = writeln!(
                out,
                "  detected after {}, drained after {}",
                secs(f.detect_s),
                secs(f.drain_s)
            );
            if f.job_restarted {
                let _ = writeln!(
                    out,
                    "  job's first step after resume: {} after the fault ({} without {} waiting for nodes); \
                     resumed from step {} (last step before: {}), {} step(s) lost, {} restart(s)",
                    secs(f.resume_total_s),
                    secs(f.resume_s),
                    secs(f.waiting_for_nodes_s),
                    f.resumed_from_step.map_or("-".to_owned(), |s| s.to_string()),
                    f.last_step_before.map_or("-".to_owned(), |s| s.to_string()),
                    f.steps_lost.map_or("-".to_owned(), |s| s.to_string()),
                    f.restarts,
                );
            } else {
                let _ = writeln!(out, "  the job was not restarted for it");
            }
            let _ = write!(out, "  repair: {}", describe_repair(f));
            match (f.expect, f.expectation_met) {
                (Some(expect), Some(met)) => {
                    let _ = writeln!(
                        out,
                        "; expected {}: {}",
                        expect.as_str(),
                        if met { "yes" } else { "NO" }
                    );
                }
                _ => {
                    let _ = writeln!(out);
                }
            }
        }
        let _ = writeln!(
            out,
            "fault → detected: p50 {}, p99 {}; fault → drained: p50 {}, p99 {}",
            secs(self.detect.p50),
            secs(self.detect.p99),
            secs(self.drain.p50),
            secs(self.drain.p99)
        );
        for target in &self.targets {
            let verdict = match target.met {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "not measured",
            };
            let _ = writeln!(
                out,
                "target: {} {}: {} ({verdict})",
                target.name, target.limit, target.measured
            );
        }
        let job = self.job.as_deref().unwrap_or("-");
        let _ = writeln!(
            out,
            "job {job}: {} at step {} of {} after {} restart(s), {} step(s) lost in all",
            self.job_state.as_deref().unwrap_or("-"),
            self.final_step.map_or("-".to_owned(), |s| s.to_string()),
            self.steps,
            self.restarts,
            self.steps_lost_total
        );
        let hash = self.weights_sha256.as_deref().unwrap_or("-");
        match (self.hash_matches, &self.reference_error) {
            (Some(true), _) => {
                let _ = writeln!(out, "weights sha256 {hash}: equal to an uninterrupted run's");
            }
            (Some(false), _) => {
                let _ = writeln!(
                    out,
                    "weights sha256 {hash}: DIFFERS from an uninterrupted run's ({})",
                    self.reference_sha256.as_deref().unwrap_or("-")
                );
            }
            (None, Some(err)) => {
                let _ = writeln!(out, "weights sha256 {hash}: no reference ({err})");
            }
            (None, None) => {
                let _ = writeln!(out, "weights sha256 {hash}: not compared");
            }
        }
        for problem in &self.problems {
            let _ = writeln!(out, "problem: {problem}");
        }
        let _ = writeln!(
            out,
            "scenario {} {} in {:.1} s",
            self.scenario,
            if self.passed { "passed" } else { "FAILED" },
            self.wall_s
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use fleetmend_repairer::model::{Actor, RuleAction};

    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let stats = Stats::of([0.3, 0.1, 0.2]);
        assert_eq!(
            (stats.count, stats.p50, stats.p99, stats.max),
            (3, Some(0.2), Some(0.3), Some(0.3))
        );
        let one = Stats::of([1.5]);
        assert_eq!((one.p50, one.p99), (Some(1.5), Some(1.5)));
        assert_eq!(Stats::of([]).p50, None);
        let hundred = Stats::of((1..=100).map(f64::from));
        assert_eq!((hundred.p50, hundred.p99), (Some(50.0), Some(99.0)));
    }

    fn event(id: i64, at_ms: u64, kind: EventKind, node: Option<&str>, reason: &str) -> Event {
        Event { id, ..Event::new(kind, Severity::Info, node, Actor::repairer(), reason, at_ms) }
    }

    /// The event log of a persistent Xid 79 on node-2: reboot, validation failed, replaced by
    /// node-5; and the job's attempts around it.
    #[test]
    fn a_replaced_node_is_summed_up_from_the_event_log() {
        let scenario = Scenario::builtin();
        let t = 1_000_000;
        let wf = Some(7);
        let step = |id, at, reason: &str, action| Event {
            workflow: wf,
            action: Some(action),
            ..event(id, at, EventKind::WorkflowStep, Some("node-2"), reason)
        };
        let mut events = vec![
            event(1, t - 5_000, EventKind::StateChanged, Some("node-2"), "old news"),
            Event {
                action: Some(RuleAction::Reboot),
                ..event(2, t + 300, EventKind::Decision, Some("node-2"), "gpu xid is fail")
            },
            Event {
                workflow: wf,
                from_state: Some(NodeState::Healthy),
                to_state: Some(NodeState::Draining),
                ..event(
                    3,
                    t + 300,
                    EventKind::StateChanged,
                    Some("node-2"),
                    "workflow 7 (reboot) started",
                )
            },
            step(4, t + 420, "step Checkpoint", RuleAction::Reboot),
            step(5, t + 3_100, "step AwaitBoot", RuleAction::Reboot),
            Event {
                workflow: wf,
                action: Some(RuleAction::Replace),
                ..event(
                    6,
                    t + 9_000,
                    EventKind::RepairFinished,
                    Some("node-2"),
                    "reboot did not help (validation failed): escalating to replace",
                )
            },
            step(7, t + 9_100, "step AwaitReplacement", RuleAction::Replace),
            Event {
                workflow: wf,
                action: Some(RuleAction::Replace),
                ..event(
                    8,
                    t + 20_000,
                    EventKind::RepairFinished,
                    Some("node-2"),
                    "replace repaired and validated",
                )
            },
            Event {
                to_state: Some(NodeState::Healthy),
                ..event(9, t + 20_000, EventKind::StateChanged, Some("node-5"), "replaced node-2")
            },
        ];
        events.sort_by_key(|e| e.id);
        let mut view: JobView = serde_json::from_value(serde_json::json!({
            "id": "j-1", "seq": 1, "name": "train",
            "spec": {"argv": ["fleetmend", "train", "--steps", "60"], "nodes": 4, "checkpoint_dir": "/c", "max_restarts": 10},
            "submitted_ms": t - 20_000, "state": "completed", "state_since_ms": t + 60_000, "reason": "every rank exited 0",
            "attempt": 1, "restarts": 1, "nodes": ["node-1", "node-3", "node-4", "node-5"],
            "master_addr": null, "master_port": null, "ranks": [], "history": [],
            "goodput": {"productive_ms": 0, "high_water_step": 60, "steps_lost_total": 0},
            "measured": {"steps_per_second": null},
            "step": 60, "loss": 1.0, "goodput_ratio": 0.5
        }))
        .unwrap();
        view.job.history = vec![
            AttemptRecord {
                attempt: 0,
                started_ms: t - 15_000,
                last_step: Some(31),
                ended_ms: Some(t + 2_000),
                failed: true,
                ..AttemptRecord::default()
            },
            AttemptRecord {
                attempt: 1,
                started_ms: t + 20_500,
                resumed_from_step: Some(31),
                first_step_ms: Some(t + 24_000),
                steps_lost: Some(0),
                ..AttemptRecord::default()
            },
        ];
        let injections = [
            Injection {
                index: 0,
                node: Some("node-2".into()),
                rank: Some(1),
                at_ms: Some(t),
                step: Some(30),
                skipped: None,
            },
            Injection {
                index: 1,
                node: None,
                rank: None,
                at_ms: None,
                step: None,
                skipped: Some("the job ended".into()),
            },
        ];
        let summary = summarize(&Observed {
            scenario: &scenario,
            started_ms: t - 20_000,
            ended_ms: t + 70_000,
            injections: &injections,
            events: &events,
            job: Some(&view),
            weights_sha256: Some("abc".into()),
            reference: Some(Ok("abc".into())),
        });
        let first = &summary.faults[0];
        assert_eq!(first.detect_s, Some(0.3));
        assert_eq!(first.drain_s, Some(0.42));
        assert_eq!(first.actions, ["reboot", "replace"]);
        assert!(first.rebooted);
        assert_eq!(first.replaced_by.as_deref(), Some("node-5"));
        assert_eq!(first.outcome.as_deref(), Some("repaired"));
        assert_eq!(first.expectation_met, Some(true));
        assert!(first.job_restarted);
        assert_eq!(first.resume_total_s, Some(24.0));
        assert_eq!(first.waiting_for_nodes_s, Some(18.5));
        assert_eq!(first.resume_s, Some(5.5));
        assert_eq!(first.steps_lost, Some(0));
        assert_eq!(summary.steps, 60);
        assert_eq!(summary.hash_matches, Some(true));
        // The second fault never came: a problem, and the scenario did not pass.
        assert_eq!(summary.faults[1].expectation_met, Some(false));
        assert!(!summary.passed);
        assert!(
            summary.problems[0].contains("fault 2 (gpu-xid:48) was not injected"),
            "{:?}",
            summary.problems
        );
        assert_eq!(
            summary.targets.iter().map(|t| t.met).collect::<Vec<_>>(),
            [Some(true), Some(true), Some(true)]
        );
        let text = summary.render();
        assert!(
            text.contains(
                "repair: reboot → replace, repaired (replaced by node-5); expected replace: yes"
            ),
            "{text}"
        );
        assert!(text.contains("equal to an uninterrupted run's"), "{text}");
        assert!(text.contains("scenario builtin FAILED"), "{text}");
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["faults"][0]["fault"], "gpu-xid:79");
    }
}
