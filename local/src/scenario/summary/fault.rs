//! What the loop did about one fault: from the repairer's event log after it (detection, drain,
//! the repair and how it ended) and the job's attempt records (the restarts it caused, the
//! resume and the steps lost).

use fleetmend_repairer::model::{Event, EventKind, NodeState, Severity};
use fleetmend_repairer::queue::{AttemptRecord, JobView};

use super::{FaultSummary, Injection, Observed, seconds};
use crate::scenario::{Expect, FaultPlan};

/// What the loop did about the fault `injection` wrote, until the next fault (`next_at_ms`).
pub(super) fn fault_summary(
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
    let workflow = repair_figures(&mut summary, node, at, &after, &on_node);
    if let Some(job) = observed.job {
        resume_figures(&mut summary, at, &restarts_after(job, at, next_at_ms));
    }
    summary.expectation_met =
        plan.expect.map(|expect| expectation_met(expect, &summary, workflow, &on_node));
    summary
}

/// Detection, drain and the repair, from the events after the fault (`after`) and those of them
/// about its node (`on_node`). Returns the node's first workflow.
fn repair_figures(
    summary: &mut FaultSummary,
    node: &str,
    at: u64,
    after: &[&Event],
    on_node: &[&Event],
) -> Option<i64> {
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
        summary.outcome = Some(outcome_of(&event.reason).to_owned());
        summary.outcome_reason = Some(event.reason.clone());
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
    workflow
}

/// How a repair ended, from the reason of its last `RepairFinished` event.
fn outcome_of(reason: &str) -> &'static str {
    if reason.ends_with("repaired and validated") {
        "repaired"
    } else if reason.starts_with("drained") {
        "drained"
    } else if reason.starts_with("quarantined") {
        "quarantined"
    } else if reason.starts_with("findings cleared") {
        "released"
    } else {
        "ended"
    }
}

/// The restarts a fault at `at` caused: attempts ended by a failure between it and the next
/// fault, each with the attempt that followed. Usually one; more when a restarted attempt failed
/// again before it stepped.
fn restarts_after(
    job: &JobView,
    at: u64,
    next_at_ms: u64,
) -> Vec<(&AttemptRecord, &AttemptRecord)> {
    let history = &job.job.history;
    history
        .iter()
        .filter_map(|attempt| {
            let previous = history.iter().find(|p| p.attempt + 1 == attempt.attempt)?;
            let ended = previous.ended_ms?;
            (previous.failed && ended >= at && ended < next_at_ms).then_some((previous, attempt))
        })
        .collect()
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

/// Whether the repairer did what the scenario expected of it for this fault.
fn expectation_met(
    expect: Expect,
    summary: &FaultSummary,
    workflow: Option<i64>,
    on_node: &[&Event],
) -> bool {
    let repaired = summary.outcome.as_deref() == Some("repaired");
    match expect {
        Expect::None => workflow.is_none() && summary.held.is_none(),
        Expect::Alert => {
            workflow.is_none()
                && on_node.iter().any(|e| {
                    e.kind == EventKind::Decision && e.action.is_some_and(|a| a.as_str() == "alert")
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
}

#[cfg(test)]
mod tests {
    use fleetmend_repairer::model::{Actor, RuleAction};

    use super::super::summarize;
    use super::*;
    use crate::scenario::Scenario;

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
