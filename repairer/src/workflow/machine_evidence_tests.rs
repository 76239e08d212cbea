//! Table tests of the workflow machine's evidence step.

use super::*;

/// The bundle is asked for when the workflow settles (so it is gathered meanwhile) and waited for
/// within the time box only; a missing one never holds the repair.
#[test]
fn evidence_is_asked_for_when_settling_and_never_holds_the_repair() {
    let unasked = Workflow { evidence: None, evidence_asked_ms: None, ..at(Step::Settle) };
    let asked = at(Step::Evidence);
    let late = Workflow { evidence_asked_ms: Some(NOW - 90_000), ..at(Step::Evidence) };
    let answered_now = Observation { evidence_answered: true, ..seen() };
    let ask = Effect::GatherEvidence {
        node: "n1".to_owned(),
        id: EVIDENCE_ID.to_owned(),
        budget_ms: 81_000,
    };
    let drain_only = Workflow { action: RuleAction::Drain, ..unasked.clone() };
    check(vec![
        Row {
            name: "settling: asked first",
            workflow: unasked.clone(),
            seen: seen(),
            step: Step::Settle,
            effect: ask.clone(),
            state: NodeState::Draining,
        },
        Row {
            name: "a drain gathers none",
            workflow: drain_only,
            seen: seen(),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Drained },
            state: NodeState::Drained,
        },
        Row {
            name: "resumed: asked again (the agent runs an id once)",
            workflow: asked.clone(),
            seen: seen(),
            step: Step::Evidence,
            effect: ask,
            state: NodeState::Draining,
        },
        Row {
            name: "asked: waits for the bundle's report, the box, or the node's silence to count",
            workflow: asked.clone(),
            seen: answered(Done::EvidenceAsked),
            step: Step::Evidence,
            effect: Effect::WaitUntil { until_ms: NOW + 70_000 },
            state: NodeState::Draining,
        },
        Row {
            name: "answered: the repair goes on",
            workflow: asked.clone(),
            seen: answered_now.clone(),
            step: Step::Repair,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "the node is silent: the repair goes on without it",
            workflow: asked.clone(),
            seen: Observation { last_heard_ms: NOW - 120_000, ..answered(Done::EvidenceAsked) },
            step: Step::Repair,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "the box ran out: the repair goes on without it",
            workflow: late.clone(),
            seen: answered(Done::EvidenceAsked),
            step: Step::Repair,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
    ]);
    let first = next(&unasked, &seen(), &limits());
    assert!(first.persist, "the ask is written before it is sent");
    assert_eq!(first.workflow.evidence.as_deref(), Some(EVIDENCE_ID));
    let kept = next(&asked, &answered_now, &limits());
    assert_eq!(kept.notes, [Note::Step(Step::Repair), Note::EvidenceAnswered(EVIDENCE_ID.into())]);
    let missing = next(&late, &seen(), &limits());
    assert!(
        matches!(&missing.notes[..], [Note::Step(Step::Repair), Note::Warning(w)] if w.contains("without it")),
        "{:?}",
        missing.notes
    );
    let off = Limits {
        timeouts: WorkflowTimeouts { evidence_timeout: Duration::ZERO, ..limits().timeouts },
        ..limits()
    };
    let settled = next(&unasked, &seen(), &off);
    assert_eq!(settled.workflow.step, Step::Repair, "no evidence asked when it is off");
}
