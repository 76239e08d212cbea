//! Table tests of the workflow machine: every step × outcome (done, retryable error, permanent
//! error, timeout, a restart of the repairer mid-step), with the step, effect and node state that
//! follow.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;

const NOW: u64 = 100_000_000;
const INSTANCE: u64 = 7;

fn limits() -> Limits {
    Limits {
        timeouts: WorkflowTimeouts {
            checkpoint_grace: Duration::from_secs(30),
            reboot_timeout: Duration::from_secs(600),
            replace_timeout: Duration::from_secs(3600),
            validate_timeout: Duration::from_secs(1200),
            reboot_attempts: 2,
            ..WorkflowTimeouts::default()
        },
        settle: Duration::from_secs(60),
        silent_after: Duration::from_secs(90),
    }
}

/// A reboot workflow of `n1` (id 3) at `step`, its fault long settled.
fn at(step: Step) -> Workflow {
    let mut wf = Workflow::repair(
        "n1",
        RuleAction::Reboot,
        "xid-79",
        "Xid 79: fell off the bus",
        Vec::new(),
        NOW - 3_600_000,
        "boot-1",
        NOW - 10_000,
    );
    wf.id = 3;
    wf.step = step;
    wf.step_since_ms = NOW - 1_000;
    // Asked for when it settled; the rows of the evidence step say what happens before that.
    wf.evidence = Some(EVIDENCE_ID.to_owned());
    wf.evidence_asked_ms = Some(NOW - 20_000);
    wf
}

const EVIDENCE_ID: &str = "evidence-3-reboot";

#[path = "machine_evidence_tests.rs"]
mod evidence;

fn replace_at(step: Step) -> Workflow {
    Workflow { action: RuleAction::Replace, replacement: Some("n1-r1".to_owned()), ..at(step) }
}

fn seen() -> Observation {
    Observation {
        now_ms: NOW,
        boot_id: "boot-1".to_owned(),
        last_heard_ms: NOW - 1_000,
        instance: INSTANCE,
        ..Observation::default()
    }
}

fn answered(done: Done) -> Observation {
    Observation { answer: Some(Answer::Done(done)), ..seen() }
}

fn failing(kind: FailureKind) -> Observation {
    let error = match kind {
        FailureKind::TimedOut => "no answer within 30s",
        _ => "slurm: drain failed: Unable to contact slurm controller",
    };
    Observation {
        answer: Some(Answer::Failed(Failure { kind, error: error.to_owned() })),
        ..seen()
    }
}

fn deep_check_id(wf: &Workflow) -> String {
    format!("deep-check-{}-{}-{}-{INSTANCE}", wf.id, wf.action, wf.attempt)
}

/// One row: the workflow and what was seen → the step, effect and state of the node after.
struct Row {
    name: &'static str,
    workflow: Workflow,
    seen: Observation,
    step: Step,
    effect: Effect,
    state: NodeState,
}

fn check(rows: Vec<Row>) {
    let mut wrong = Vec::new();
    for row in rows {
        let t = next(&row.workflow, &row.seen, &limits());
        let state = node_states(&t.workflow)[0].1;
        if t.workflow.step != row.step || t.effect != row.effect || state != row.state {
            wrong.push(format!(
                "{}: got {:?} / {:?} / {state:?}, want {:?} / {:?} / {:?}",
                row.name, t.workflow.step, t.effect, row.step, row.effect, row.state
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn drain_effect() -> Effect {
    Effect::Drain {
        node: "n1".to_owned(),
        reason: "fleetmend: Xid 79: fell off the bus".to_owned(),
    }
}

fn list_jobs() -> Effect {
    Effect::ListJobs { node: "n1".to_owned() }
}

#[test]
fn drain_checkpoint_and_requeue_steps() {
    use NodeState::Draining;
    let jobs = vec!["j-1".to_owned(), "j-2".to_owned()];
    let sent = Workflow {
        jobs: jobs.clone(),
        checkpoint_sent_ms: Some(NOW - 40_000),
        ..at(Step::Requeue)
    };
    check(vec![
        Row {
            name: "drain: entered",
            workflow: at(Step::Drain),
            seen: seen(),
            step: Step::Drain,
            effect: drain_effect(),
            state: Draining,
        },
        Row {
            name: "drain: done",
            workflow: at(Step::Drain),
            seen: answered(Done::Drained),
            step: Step::Checkpoint,
            effect: Effect::Continue,
            state: Draining,
        },
        Row {
            name: "drain: retryable",
            workflow: at(Step::Drain),
            seen: failing(FailureKind::Retryable),
            step: Step::Drain,
            effect: Effect::Backoff,
            state: Draining,
        },
        Row {
            name: "drain: timed out",
            workflow: at(Step::Drain),
            seen: failing(FailureKind::TimedOut),
            step: Step::Drain,
            effect: Effect::Backoff,
            state: Draining,
        },
        Row {
            name: "drain: permanent",
            workflow: at(Step::Drain),
            seen: failing(FailureKind::Permanent),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
        Row {
            name: "checkpoint: entered (or resumed)",
            workflow: at(Step::Checkpoint),
            seen: seen(),
            step: Step::Checkpoint,
            effect: list_jobs(),
            state: Draining,
        },
        Row {
            name: "checkpoint: jobs found",
            workflow: at(Step::Checkpoint),
            seen: answered(Done::Jobs(jobs.clone())),
            step: Step::Checkpoint,
            effect: Effect::Checkpoint { jobs: jobs.clone() },
            state: Draining,
        },
        Row {
            name: "checkpoint: no jobs",
            workflow: at(Step::Checkpoint),
            seen: answered(Done::Jobs(Vec::new())),
            step: Step::Settle,
            effect: Effect::Continue,
            state: Draining,
        },
        Row {
            name: "checkpoint: signalled",
            workflow: at(Step::Checkpoint),
            seen: answered(Done::Signalled),
            step: Step::Requeue,
            effect: Effect::Continue,
            state: Draining,
        },
        Row {
            name: "checkpoint: listing failed",
            workflow: at(Step::Checkpoint),
            seen: failing(FailureKind::Retryable),
            step: Step::Checkpoint,
            effect: Effect::Backoff,
            state: Draining,
        },
        Row {
            name: "requeue: within the grace",
            workflow: Workflow { checkpoint_sent_ms: Some(NOW - 10_000), ..sent.clone() },
            seen: seen(),
            step: Step::Requeue,
            effect: Effect::WaitUntil { until_ms: NOW + 20_000 },
            state: Draining,
        },
        Row {
            name: "requeue: grace over",
            workflow: sent.clone(),
            seen: seen(),
            step: Step::Requeue,
            effect: list_jobs(),
            state: Draining,
        },
        Row {
            name: "requeue: one job left the node",
            workflow: sent.clone(),
            seen: answered(Done::Jobs(vec!["j-2".to_owned()])),
            step: Step::Requeue,
            effect: Effect::Requeue { jobs: vec!["j-2".to_owned()], left: vec!["j-1".to_owned()] },
            state: Draining,
        },
        Row {
            name: "requeue: done",
            workflow: sent.clone(),
            seen: answered(Done::Requeued),
            step: Step::Settle,
            effect: Effect::Continue,
            state: Draining,
        },
        Row {
            name: "requeue: failed",
            workflow: sent.clone(),
            seen: failing(FailureKind::TimedOut),
            step: Step::Requeue,
            effect: Effect::Backoff,
            state: Draining,
        },
        Row {
            name: "requeue: permanent",
            workflow: sent,
            seen: failing(FailureKind::Permanent),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
    ]);
}

#[test]
fn settle_holds_destructive_steps_and_ends_drains_and_quarantines() {
    let fresh = Workflow { fault_since_ms: NOW - 20_000, ..at(Step::Settle) };
    let drain = Workflow { action: RuleAction::Drain, ..at(Step::Settle) };
    let quarantine = Workflow { kind: WorkflowKind::Quarantine, ..at(Step::Settle) };
    let breaker = Observation { breaker_open: true, ..seen() };
    check(vec![
        Row {
            name: "within the settle time",
            workflow: fresh,
            seen: seen(),
            step: Step::Settle,
            effect: Effect::WaitUntil { until_ms: NOW + 40_000 },
            state: NodeState::Draining,
        },
        Row {
            name: "breaker open: waits until closing it wakes every workflow",
            workflow: at(Step::Settle),
            seen: breaker.clone(),
            step: Step::Settle,
            effect: Effect::WaitUntil { until_ms: u64::MAX },
            state: NodeState::Draining,
        },
        Row {
            name: "settled",
            workflow: at(Step::Settle),
            seen: seen(),
            step: Step::Evidence,
            effect: Effect::Continue,
            state: NodeState::Draining,
        },
        Row {
            name: "drain only",
            workflow: drain,
            seen: seen(),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Drained },
            state: NodeState::Drained,
        },
        Row {
            name: "quarantine",
            workflow: quarantine,
            seen: seen(),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
    ]);
    // The hold is written and told once, not on every look.
    let first = next(&at(Step::Settle), &breaker, &limits());
    assert!(first.persist);
    assert_eq!(first.notes, [Note::HeldByBreaker]);
    let again = next(&first.workflow, &breaker, &limits());
    assert!(!again.persist && again.notes.is_empty(), "{again:?}");
    // Closing the breaker lets it go on, and the step note clears the hold.
    let closed = next(&again.workflow, &seen(), &limits());
    assert_eq!(closed.workflow.step, Step::Evidence);
    assert_eq!(closed.workflow.last_error, None);
}

#[test]
fn repair_steps_issue_once_and_await_their_effect() {
    let issued = Workflow { issued_ms: Some(NOW - 5_000), ..at(Step::Repair) };
    let awaiting = Workflow { issued_ms: Some(NOW - 5_000), ..at(Step::AwaitBoot) };
    let late = Workflow { issued_ms: Some(NOW - 601_000), ..at(Step::AwaitBoot) };
    let late_last = Workflow { attempt: 2, ..late.clone() };
    let replacing = Workflow { action: RuleAction::Replace, ..at(Step::Repair) };
    let rebooted = Observation { boot_id: "boot-2".to_owned(), ..seen() };
    check(vec![
        Row {
            name: "repair: reboot issued",
            workflow: at(Step::Repair),
            seen: seen(),
            step: Step::Repair,
            effect: Effect::Reboot { node: "n1".to_owned() },
            state: NodeState::Repairing,
        },
        Row {
            name: "repair: reboot accepted",
            workflow: issued.clone(),
            seen: answered(Done::RebootIssued),
            step: Step::AwaitBoot,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "repair: restart after the call may have gone out",
            workflow: issued.clone(),
            seen: seen(),
            step: Step::AwaitBoot,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "repair: reboot failed",
            workflow: issued.clone(),
            seen: failing(FailureKind::Retryable),
            step: Step::Repair,
            effect: Effect::Backoff,
            state: NodeState::Repairing,
        },
        Row {
            name: "repair: reboot timed out",
            workflow: issued.clone(),
            seen: failing(FailureKind::TimedOut),
            step: Step::Repair,
            effect: Effect::Backoff,
            state: NodeState::Repairing,
        },
        Row {
            name: "repair: cannot reboot",
            workflow: issued,
            seen: failing(FailureKind::Permanent),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
        Row {
            name: "repair: replace issued",
            workflow: replacing.clone(),
            seen: seen(),
            step: Step::Repair,
            effect: Effect::Replace { node: "n1".to_owned() },
            state: NodeState::Repairing,
        },
        Row {
            name: "repair: replacement named",
            workflow: replacing,
            seen: answered(Done::Replacement("n1-r1".to_owned())),
            step: Step::AwaitReplacement,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "await boot: not yet: waits for the new boot's report or the reboot timeout",
            workflow: awaiting.clone(),
            seen: seen(),
            step: Step::AwaitBoot,
            effect: Effect::WaitUntil { until_ms: NOW + 595_000 },
            state: NodeState::Repairing,
        },
        Row {
            name: "await boot: new boot id",
            workflow: awaiting,
            seen: rebooted,
            step: Step::Validate,
            effect: Effect::Continue,
            state: NodeState::Validating,
        },
        Row {
            name: "await boot: timed out, attempts left",
            workflow: late,
            seen: seen(),
            step: Step::Repair,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "await boot: timed out, none left",
            workflow: late_last,
            seen: seen(),
            step: Step::Settle,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
    ]);
    // The call is written as issued before it is made; a failed call is not.
    let t = next(&at(Step::Repair), &seen(), &limits());
    assert!(t.persist && t.workflow.issued_ms == Some(NOW));
    let t = next(&t.workflow, &failing(FailureKind::Retryable), &limits());
    assert_eq!(t.workflow.issued_ms, None);
}

#[test]
fn a_replacement_is_awaited_drained_and_validated() {
    let awaiting = Workflow { issued_ms: Some(NOW - 60_000), ..replace_at(Step::AwaitReplacement) };
    let never = Workflow { issued_ms: Some(NOW - 3_601_000), ..awaiting.clone() };
    let reported = Observation { replacement_reported: true, ..seen() };
    let drain = Effect::DrainReplacement {
        node: "n1-r1".to_owned(),
        reason: "fleetmend: validating as the replacement of n1".to_owned(),
    };
    check(vec![
        Row {
            name: "not reported yet: waits for its report or the replace timeout (1 h)",
            workflow: Workflow { issued_ms: Some(NOW - 5_000), ..awaiting.clone() },
            seen: seen(),
            step: Step::AwaitReplacement,
            effect: Effect::WaitUntil { until_ms: NOW - 5_000 + 3_600_000 },
            state: NodeState::Repairing,
        },
        Row {
            name: "not reported a minute on: no poll, its first report wakes it",
            workflow: awaiting.clone(),
            seen: seen(),
            step: Step::AwaitReplacement,
            effect: Effect::WaitUntil { until_ms: NOW - 60_000 + 3_600_000 },
            state: NodeState::Repairing,
        },
        Row {
            name: "reported",
            workflow: awaiting.clone(),
            seen: reported,
            step: Step::AwaitReplacement,
            effect: drain,
            state: NodeState::Repairing,
        },
        Row {
            name: "drained",
            workflow: awaiting.clone(),
            seen: answered(Done::ReplacementDrained),
            step: Step::Validate,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "drain failed",
            workflow: awaiting,
            seen: failing(FailureKind::Retryable),
            step: Step::AwaitReplacement,
            effect: Effect::Backoff,
            state: NodeState::Repairing,
        },
        Row {
            name: "never reported",
            workflow: never,
            seen: seen(),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
    ]);
    let workflow = replace_at(Step::Validate);
    let validating = node_states(&workflow);
    assert_eq!(
        validating.iter().map(|(n, s, _)| (*n, *s)).collect::<Vec<_>>(),
        [("n1", NodeState::Repairing), ("n1-r1", NodeState::Validating)]
    );
}

#[test]
fn validation_asks_once_per_process_waits_and_escalates() {
    let fresh = at(Step::Validate);
    let id = deep_check_id(&fresh);
    let asked = Workflow { validation: Some(id.clone()), ..at(Step::Validate) };
    let out_of_time = Workflow { step_since_ms: NOW - 1_200_001, ..asked.clone() };
    let other_process = Workflow { validation: Some(format!("{id}-0")), ..asked.clone() };
    let passed = Observation {
        deep_check: Some(DeepCheck { ok: true, message: "ok".to_owned() }),
        ..seen()
    };
    let failed = Observation {
        deep_check: Some(DeepCheck {
            ok: false,
            message: "the active GPU probe failed".to_owned(),
        }),
        ..seen()
    };
    let ask = Effect::DeepCheck { node: "n1".to_owned(), id: id.clone() };
    check(vec![
        Row {
            name: "entered",
            workflow: fresh,
            seen: seen(),
            step: Step::Validate,
            effect: ask.clone(),
            state: NodeState::Validating,
        },
        Row {
            name: "resumed by another process",
            workflow: other_process,
            seen: seen(),
            step: Step::Validate,
            effect: ask.clone(),
            state: NodeState::Validating,
        },
        Row {
            name: "asked again on every pass",
            workflow: asked.clone(),
            seen: seen(),
            step: Step::Validate,
            effect: ask,
            state: NodeState::Validating,
        },
        Row {
            name: "queued: waits for the result's report or the validate timeout",
            workflow: asked.clone(),
            seen: answered(Done::DeepCheckQueued),
            step: Step::Validate,
            effect: Effect::WaitUntil { until_ms: NOW + 1_199_000 },
            state: NodeState::Validating,
        },
        Row {
            name: "passed",
            workflow: asked.clone(),
            seen: passed,
            step: Step::Undrain,
            effect: Effect::Continue,
            state: NodeState::Validating,
        },
        Row {
            name: "failed: the reboot escalates",
            workflow: asked.clone(),
            seen: failed.clone(),
            step: Step::Settle,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "no answer in time",
            workflow: out_of_time,
            seen: answered(Done::DeepCheckQueued),
            step: Step::Settle,
            effect: Effect::Continue,
            state: NodeState::Repairing,
        },
        Row {
            name: "failed, and the rule stops the ladder at reboot: a person",
            workflow: Workflow { stop_at: Some(Rung::Reboot), ..asked.clone() },
            seen: failed.clone(),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
        Row {
            name: "a replacement failing it is quarantined",
            workflow: Workflow {
                validation: Some(deep_check_id(&replace_at(Step::Validate))),
                ..replace_at(Step::Validate)
            },
            seen: failed.clone(),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
    ]);
    // The escalation: history, the event, a replacement counting its attempts from 1, the result
    // forgotten.
    let t = next(&asked, &failed, &limits());
    assert_eq!(t.workflow.action, RuleAction::Replace);
    assert_eq!((t.workflow.attempt, t.workflow.validation.clone()), (1, None));
    assert_eq!(t.workflow.escalated_from, Some(RuleAction::Reboot));
    assert_eq!(t.workflow.evidence, None, "the replacement gathers its own evidence");
    assert!(
        matches!(&t.notes[..], [
        Note::RepairFailed(RuleAction::Reboot),
        Note::Escalated { why },
        Note::Step(Step::Settle),
        Note::ResultUsed(used),
    ] if why == "validation failed: the active GPU probe failed" && *used == id),
        "{:?}",
        t.notes
    );
}

#[test]
fn undrain_finishes_or_leaves_an_admins_drain_to_a_person() {
    let release = Workflow::release("n1", "findings cleared", NOW);
    check(vec![
        Row {
            name: "entered",
            workflow: at(Step::Undrain),
            seen: seen(),
            step: Step::Undrain,
            effect: Effect::Undrain { node: "n1".to_owned() },
            state: NodeState::Validating,
        },
        Row {
            name: "undrained",
            workflow: at(Step::Undrain),
            seen: answered(Done::Undrained(UndrainOutcome::Undrained)),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Repaired },
            state: NodeState::Healthy,
        },
        Row {
            name: "was not drained",
            workflow: at(Step::Undrain),
            seen: answered(Done::Undrained(UndrainOutcome::NotDrained)),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Repaired },
            state: NodeState::Healthy,
        },
        Row {
            name: "someone else's drain",
            workflow: at(Step::Undrain),
            seen: answered(Done::Undrained(UndrainOutcome::DrainedByOther(
                "maintenance".to_owned(),
            ))),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Quarantined },
            state: NodeState::Quarantined,
        },
        Row {
            name: "failed",
            workflow: at(Step::Undrain),
            seen: failing(FailureKind::Retryable),
            step: Step::Undrain,
            effect: Effect::Backoff,
            state: NodeState::Validating,
        },
        Row {
            name: "release: entered",
            workflow: release.clone(),
            seen: seen(),
            step: Step::Undrain,
            effect: Effect::Undrain { node: "n1".to_owned() },
            state: NodeState::Drained,
        },
        Row {
            name: "release: done",
            workflow: release,
            seen: answered(Done::Undrained(UndrainOutcome::Undrained)),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Released },
            state: NodeState::Healthy,
        },
        Row {
            name: "replacement undrained",
            workflow: replace_at(Step::Undrain),
            seen: answered(Done::Undrained(UndrainOutcome::Undrained)),
            step: Step::Done,
            effect: Effect::Finish { outcome: Outcome::Repaired },
            state: NodeState::Retired,
        },
    ]);
    let t = next(&replace_at(Step::Undrain), &seen(), &limits());
    assert_eq!(
        t.effect,
        Effect::Undrain { node: "n1-r1".to_owned() },
        "the replacement is the one undrained"
    );
}

#[test]
fn a_retry_is_told_once_per_distinct_error_and_a_step_change_clears_it() {
    let first = next(&at(Step::Drain), &failing(FailureKind::Retryable), &limits());
    assert!(first.persist);
    assert!(matches!(&first.notes[..], [Note::Retrying { step: Step::Drain, .. }]));
    let again = next(&first.workflow, &failing(FailureKind::Retryable), &limits());
    assert!(again.notes.is_empty() && !again.persist);
    let other = next(&again.workflow, &failing(FailureKind::TimedOut), &limits());
    assert_eq!(other.notes.len(), 1, "a different error is told");
    let done = next(&other.workflow, &answered(Done::Drained), &limits());
    assert_eq!(done.workflow.last_error, None);
    assert_eq!(done.notes, [Note::Step(Step::Checkpoint), Note::Drained]);
}

/// Every step, resumed by a restarted repairer (no answer known), asks for its own call again or
/// waits, and never finishes or moves on by itself, except where what it awaits has happened.
#[test]
fn a_restart_mid_step_repeats_only_what_is_safe_to_repeat() {
    let steps = [
        Step::Drain,
        Step::Checkpoint,
        Step::Requeue,
        Step::Settle,
        Step::Evidence,
        Step::Repair,
        Step::AwaitBoot,
        Step::AwaitReplacement,
        Step::Validate,
        Step::Undrain,
    ];
    for step in steps {
        let mut wf = at(step);
        wf.issued_ms = Some(NOW - 1_000);
        wf.checkpoint_sent_ms = Some(NOW - 1_000);
        wf.replacement = (step == Step::AwaitReplacement).then(|| "n1-r1".to_owned());
        let t = next(&wf, &seen(), &limits());
        let repeated = match &t.effect {
            Effect::Reboot { .. } | Effect::Replace { .. } => true,
            Effect::Finish { .. } => panic!("{step:?} finished by itself on a restart: {t:?}"),
            _ => false,
        };
        assert!(!repeated, "{step:?} issued its repair again at once on a restart: {t:?}");
    }
}

#[test]
fn finishing_leaves_each_node_in_its_final_state() {
    let finished = |wf: Workflow, outcome| {
        let t =
            next(&Workflow { step: Step::Done, outcome: Some(outcome), ..wf }, &seen(), &limits());
        node_states(&t.workflow).into_iter().map(|(n, s, _)| (n.to_owned(), s)).collect::<Vec<_>>()
    };
    let own = |s: &str| s.to_owned();
    assert_eq!(finished(at(Step::Undrain), Outcome::Repaired), [(own("n1"), NodeState::Healthy)]);
    assert_eq!(
        finished(replace_at(Step::Undrain), Outcome::Repaired),
        [(own("n1"), NodeState::Retired), (own("n1-r1"), NodeState::Healthy)]
    );
    assert_eq!(
        finished(replace_at(Step::Validate), Outcome::Quarantined),
        [(own("n1"), NodeState::Quarantined), (own("n1-r1"), NodeState::Quarantined)]
    );
    assert_eq!(finished(at(Step::Settle), Outcome::Drained), [(own("n1"), NodeState::Drained)]);
}
