//! The repair workflow as a pure state machine: [`next`] reads the workflow as it was written, what
//! the driver observed since (the answer to the last call, the node's boot id, a deep check's
//! result, the breaker) and the time, and says what to do next: the workflow as it is to be written,
//! the events to write first, and the one effect to carry out. It performs no I/O and reads no
//! clock, so every step × outcome is a table test, and the driver (`driver.rs`) is a small loop.
//!
//! The node's state during a workflow is derived from the workflow alone ([`node_states`]).

use std::time::Duration;

use super::{Outcome, Step, Workflow, WorkflowKind, WorkflowTimeouts};
use crate::model::{NodeState, RuleAction};
use crate::policy::Rung;
use crate::scheduler::{DRAIN_REASON_PREFIX, UndrainOutcome};

/// What a step that waits for something only a report or a person brings (a new boot, a
/// replacement's first report, a deep check's result, the breaker closed) waits until when it has
/// no deadline: it is woken by what it waits for (the driver listens before it looks, so no
/// wake-up is missed), never by a poll.
const UNTIL_WOKEN: u64 = u64::MAX;
/// The workflow's own reason is cut to this many characters in a drain reason.
const DRAIN_REASON_CHARS: usize = 200;

/// The limits the machine works under.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub timeouts: WorkflowTimeouts,
    /// How long after a fault before anything destructive (`[policy.guard_rails] settle`).
    pub settle: Duration,
    /// A node not heard from for this long is unreachable (`report_interval ×
    /// unreachable_after`): no evidence is waited for from it.
    pub silent_after: Duration,
}

/// What the driver saw since the last transition.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    pub now_ms: u64,
    /// The answer to the effect the driver carried out last; `None` when the step was just entered,
    /// a wait ended, or the workflow was resumed after a restart (nothing is known then of a call
    /// that was under way).
    pub answer: Option<Answer>,
    /// The boot id the workflow's node reports now (empty: none yet).
    pub boot_id: String,
    /// When the workflow's node was last heard from.
    pub last_heard_ms: u64,
    /// Whether the replacement named in the workflow has reported.
    pub replacement_reported: bool,
    /// The result of the deep check named in `workflow.validation`, once it arrived.
    pub deep_check: Option<DeepCheck>,
    /// The node answered the `evidence` command named in `workflow.evidence` (with a bundle or
    /// without one).
    pub evidence_answered: bool,
    /// The breaker stops every automatic action.
    pub breaker_open: bool,
    /// Names this repairer process (deep check ids must not outlive it).
    pub instance: u64,
}

/// A deep check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeepCheck {
    pub ok: bool,
    pub message: String,
}

/// How the effect the driver carried out ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Done(Done),
    Failed(Failure),
}

/// An effect that succeeded, with what it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    Drained,
    /// The jobs with a rank on the node.
    Jobs(Vec<String>),
    /// Every job was asked to checkpoint (a job that could not be asked keeps its last one).
    Signalled,
    Requeued,
    /// The provider accepted the reboot.
    RebootIssued,
    /// The provider is replacing the node with the one named.
    Replacement(String),
    ReplacementDrained,
    DeepCheckQueued,
    EvidenceAsked,
    Undrained(UndrainOutcome),
}

/// A call that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub error: String,
}

/// Whether trying again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The call failed; the same call may work later (a scheduler that is down, a BMC busy).
    Retryable,
    /// No answer within the call timeout: it may or may not have happened; retried.
    TimedOut,
    /// It can never work (an unknown node, an operation the backend does not have): a person
    /// must look.
    Permanent,
}

/// What the driver carries out next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Nothing: the step changed, ask again at once.
    Continue,
    Drain {
        node: String,
        reason: String,
    },
    ListJobs {
        node: String,
    },
    Checkpoint {
        jobs: Vec<String>,
    },
    /// Requeue `jobs`; `left` are the jobs that left the node meanwhile and are left alone.
    Requeue {
        jobs: Vec<String>,
        left: Vec<String>,
    },
    Reboot {
        node: String,
    },
    Replace {
        node: String,
    },
    /// The replacement takes no work until it is validated.
    DrainReplacement {
        node: String,
        reason: String,
    },
    /// Queue deep check `id` for `node` (again on every pass: the agent runs an id once).
    DeepCheck {
        node: String,
        id: String,
    },
    /// Ask `node` for an evidence bundle within `budget_ms` (again on every pass, as a deep check).
    GatherEvidence {
        node: String,
        id: String,
        budget_ms: u64,
    },
    Undrain {
        node: String,
    },
    /// Sleep until `until_ms`, or until a report may have changed what is observed.
    WaitUntil {
        until_ms: u64,
    },
    /// The call failed: back off before the step tries again.
    Backoff,
    /// The workflow ends with `outcome`.
    Finish {
        outcome: Outcome,
    },
}

/// What the driver writes to the event log (and counts) before it carries out the effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The workflow moved to a new step.
    Step(Step),
    /// The step's call failed (written once per distinct error).
    Retrying { step: Step, error: String },
    /// A step worth telling (the node did not come back, someone else drained it).
    Warning(String),
    /// The destructive step waits for the breaker (written once).
    HeldByBreaker,
    /// The node was drained: time to drain is measured here.
    Drained,
    /// A repair did not work: it goes into the node's history as failed.
    RepairFailed(RuleAction),
    /// A reboot that did not help becomes a replacement.
    Escalated { why: String },
    /// The deep check's result was used: the driver forgets it.
    ResultUsed(String),
    /// The node answered the evidence command `id`: the driver keeps the bundle with the
    /// workflow (and forgets the result).
    EvidenceAnswered(String),
}

/// The machine's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The workflow as it is to be written (before the effect, when `persist`).
    pub workflow: Workflow,
    /// Whether `workflow` must be written before the effect is carried out.
    pub persist: bool,
    pub notes: Vec<Note>,
    pub effect: Effect,
}

impl Transition {
    fn stay(workflow: Workflow, effect: Effect) -> Transition {
        Transition { workflow, persist: false, notes: Vec::new(), effect }
    }

    fn written(workflow: Workflow, effect: Effect) -> Transition {
        Transition { workflow, persist: true, notes: Vec::new(), effect }
    }

    fn note(mut self, note: Note) -> Transition {
        self.notes.push(note);
        self
    }
}

/// What to do next with `workflow`, given what was observed.
pub fn next(workflow: &Workflow, seen: &Observation, limits: &Limits) -> Transition {
    let wf = workflow.clone();
    let now = seen.now_ms;
    let done = match &seen.answer {
        Some(Answer::Failed(failure)) => return failed(wf, failure, now),
        Some(Answer::Done(done)) => Some(done),
        None => None,
    };
    match wf.step {
        Step::Drain => drain(wf, done, now),
        Step::Checkpoint => checkpoint(wf, done, now),
        Step::Requeue => requeue(wf, done, now, limits),
        Step::Settle => settle(wf, seen, limits),
        Step::Evidence => evidence(wf, seen, done, limits),
        Step::Repair => repair(wf, done, now),
        Step::AwaitBoot => await_boot(wf, seen, limits),
        Step::AwaitReplacement => await_replacement(wf, seen, done, limits),
        Step::Validate => validate(wf, seen, done, limits),
        Step::Undrain => undrain(wf, done, now),
        Step::Done => {
            let outcome = wf.outcome.unwrap_or(Outcome::Repaired);
            finish(wf, outcome, now)
        }
    }
}

fn drain(wf: Workflow, done: Option<&Done>, now: u64) -> Transition {
    if matches!(done, Some(Done::Drained)) {
        return goto(wf, Step::Checkpoint, now).note(Note::Drained);
    }
    let why: String = wf.reason.chars().take(DRAIN_REASON_CHARS).collect();
    let effect =
        Effect::Drain { node: wf.node.clone(), reason: format!("{DRAIN_REASON_PREFIX}{why}") };
    Transition::stay(wf, effect)
}

/// Finds the jobs on the node and asks each to checkpoint.
fn checkpoint(mut wf: Workflow, done: Option<&Done>, now: u64) -> Transition {
    match done {
        Some(Done::Jobs(jobs)) => {
            wf.jobs.clone_from(jobs);
            wf.checkpoint_sent_ms = Some(now);
            if jobs.is_empty() {
                return goto(wf, Step::Settle, now);
            }
            let effect = Effect::Checkpoint { jobs: jobs.clone() };
            Transition::stay(wf, effect)
        }
        Some(Done::Signalled) => goto(wf, Step::Requeue, now),
        _ => {
            let effect = Effect::ListJobs { node: wf.node.clone() };
            Transition::stay(wf, effect)
        }
    }
}

/// After the checkpoint grace, requeues the jobs still on the node.
fn requeue(wf: Workflow, done: Option<&Done>, now: u64, limits: &Limits) -> Transition {
    let grace = millis(limits.timeouts.checkpoint_grace);
    let ready = wf.checkpoint_sent_ms.unwrap_or(now) + grace;
    match done {
        Some(Done::Requeued) => goto(wf, Step::Settle, now),
        Some(Done::Jobs(still_on)) => {
            // Only the jobs still on the node: one that left it meanwhile (its scheduler
            // restarted it elsewhere, or it ended) must not be stopped where it runs now.
            let (jobs, left) = wf.jobs.iter().cloned().partition(|j| still_on.contains(j));
            Transition::stay(wf, Effect::Requeue { jobs, left })
        }
        _ if now < ready => Transition::stay(wf, Effect::WaitUntil { until_ms: ready }),
        _ => {
            let effect = Effect::ListJobs { node: wf.node.clone() };
            Transition::stay(wf, effect)
        }
    }
}

/// Waits for the node to report a new boot id; reboots again, or escalates, when it does not.
fn await_boot(mut wf: Workflow, seen: &Observation, limits: &Limits) -> Transition {
    let now = seen.now_ms;
    if !seen.boot_id.is_empty() && seen.boot_id != wf.boot_id_before {
        return goto(wf, Step::Validate, now);
    }
    let issued = wf.issued_ms.unwrap_or(now);
    let deadline = issued + millis(limits.timeouts.reboot_timeout);
    if now < deadline {
        return Transition::stay(wf, Effect::WaitUntil { until_ms: deadline });
    }
    if wf.attempt < limits.timeouts.reboot_attempts {
        wf.attempt += 1;
        wf.issued_ms = None;
        let warning = "the node did not come back from the reboot: rebooting again";
        return goto(wf, Step::Repair, now).note(Note::Warning(warning.to_owned()));
    }
    escalate(wf, "the node did not come back from its reboots", now)
}

/// Waits for the replacement to report, then takes it out of work until it is validated.
fn await_replacement(
    wf: Workflow,
    seen: &Observation,
    done: Option<&Done>,
    limits: &Limits,
) -> Transition {
    let now = seen.now_ms;
    let Some(new_node) = wf.replacement.clone() else {
        return goto(wf, Step::Repair, now);
    };
    if matches!(done, Some(Done::ReplacementDrained)) {
        return goto(wf, Step::Validate, now);
    }
    if seen.replacement_reported {
        let reason = format!("{DRAIN_REASON_PREFIX}validating as the replacement of {}", wf.node);
        return Transition::stay(wf, Effect::DrainReplacement { node: new_node, reason });
    }
    let issued = wf.issued_ms.unwrap_or(now);
    let deadline = issued + millis(limits.timeouts.replace_timeout);
    if now < deadline {
        return Transition::stay(wf, Effect::WaitUntil { until_ms: deadline });
    }
    quarantine(wf, &format!("the replacement {new_node} never reported"), now)
}

/// Puts the node (or its replacement) back, unless someone else drained it meanwhile.
fn undrain(wf: Workflow, done: Option<&Done>, now: u64) -> Transition {
    match done {
        Some(Done::Undrained(UndrainOutcome::DrainedByOther(reason))) => {
            let warning = format!("left drained: someone else drained it ({reason})");
            quarantine(wf, "drained by someone else during the repair", now)
                .note(Note::Warning(warning))
        }
        Some(Done::Undrained(_)) => {
            let outcome = match wf.kind {
                WorkflowKind::Release => Outcome::Released,
                _ => Outcome::Repaired,
            };
            finish(wf, outcome, now)
        }
        _ => {
            let effect = Effect::Undrain { node: wf.target().to_owned() };
            Transition::stay(wf, effect)
        }
    }
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// Moves to `step`: written, with a step note.
fn goto(mut wf: Workflow, step: Step, now: u64) -> Transition {
    wf.step = step;
    wf.step_since_ms = now;
    wf.last_error = None;
    Transition::written(wf, Effect::Continue).note(Note::Step(step))
}

/// The step's call failed: retried with a backoff, or, when it can never work, a person must look.
fn failed(mut wf: Workflow, failure: &Failure, now: u64) -> Transition {
    if failure.kind == FailureKind::Permanent {
        let why = format!("{:?} cannot be done: {}", wf.step, failure.error);
        return quarantine(wf, &why, now);
    }
    if wf.step == Step::Repair {
        // The call did not go through: a resumed workflow must issue it again, not await it.
        wf.issued_ms = None;
    }
    if wf.last_error.as_deref() == Some(failure.error.as_str()) {
        return Transition::stay(wf, Effect::Backoff);
    }
    wf.last_error = Some(failure.error.clone());
    let note = Note::Retrying { step: wf.step, error: failure.error.clone() };
    Transition::written(wf, Effect::Backoff).note(note)
}

/// Ends drain-only and quarantine workflows; holds destructive ones for the settle time and for a
/// closed breaker.
fn settle(mut wf: Workflow, seen: &Observation, limits: &Limits) -> Transition {
    let now = seen.now_ms;
    if wf.kind == WorkflowKind::Quarantine {
        return finish(wf, Outcome::Quarantined, now);
    }
    if wf.action == RuleAction::Drain {
        return finish(wf, Outcome::Drained, now);
    }
    let evidence_timeout = millis(limits.timeouts.evidence_timeout);
    if wf.evidence.is_none() && evidence_timeout > 0 {
        // Asked for first, so the node gathers it while the workflow settles.
        let id = format!("evidence-{}-{}", wf.id, wf.action);
        wf.evidence = Some(id.clone());
        wf.evidence_asked_ms = Some(now);
        let effect = gather_evidence(&wf, id, evidence_timeout);
        return Transition::written(wf, effect);
    }
    let settle_until = wf.fault_since_ms + millis(limits.settle);
    if now < settle_until {
        return Transition::stay(wf, Effect::WaitUntil { until_ms: settle_until });
    }
    if seen.breaker_open {
        // Closing the breaker wakes every workflow.
        let until_ms = UNTIL_WOKEN;
        if wf.last_error.as_deref() == Some(BREAKER_OPEN) {
            return Transition::stay(wf, Effect::WaitUntil { until_ms });
        }
        wf.last_error = Some(BREAKER_OPEN.to_owned());
        return Transition::written(wf, Effect::WaitUntil { until_ms }).note(Note::HeldByBreaker);
    }
    let step = if wf.evidence.is_some() { Step::Evidence } else { Step::Repair };
    goto(wf, step, now)
}

/// Time left for the node's own delivery of the bundle: a tenth of the box, within 1–10 s.
fn gather_evidence(wf: &Workflow, id: String, timeout_ms: u64) -> Effect {
    let margin = (timeout_ms / 10).clamp(1000, 10_000).min(timeout_ms / 2);
    Effect::GatherEvidence { node: wf.node.clone(), id, budget_ms: timeout_ms - margin }
}

/// Waits for the evidence bundle until the time box ends; a missing bundle never holds a repair.
fn evidence(wf: Workflow, seen: &Observation, done: Option<&Done>, limits: &Limits) -> Transition {
    let now = seen.now_ms;
    let Some(id) = wf.evidence.clone() else {
        return goto(wf, Step::Repair, now);
    };
    if seen.evidence_answered {
        return goto(wf, Step::Repair, now).note(Note::EvidenceAnswered(id));
    }
    let silent = now.saturating_sub(seen.last_heard_ms);
    if silent > millis(limits.silent_after) {
        let warning = format!(
            "no evidence: {} has not reported for {}",
            wf.node,
            humantime::format_duration(Duration::from_secs(silent / 1000))
        );
        return goto(wf, Step::Repair, now).note(Note::Warning(warning));
    }
    let timeout = millis(limits.timeouts.evidence_timeout);
    let deadline = wf.evidence_asked_ms.unwrap_or(now).saturating_add(timeout);
    if now >= deadline {
        let warning = format!(
            "no evidence from {} within {}: going on without it",
            wf.node,
            humantime::format_duration(limits.timeouts.evidence_timeout)
        );
        return goto(wf, Step::Repair, now).note(Note::Warning(warning));
    }
    if !matches!(done, Some(Done::EvidenceAsked)) {
        let effect = gather_evidence(&wf, id, timeout);
        return Transition::stay(wf, effect);
    }
    // The bundle comes in a report, which wakes the step; a node that falls silent meanwhile is
    // looked at once its silence would count.
    let silent_at =
        seen.last_heard_ms.saturating_add(millis(limits.silent_after)).saturating_add(1);
    Transition::stay(wf, Effect::WaitUntil { until_ms: deadline.min(silent_at) })
}

const BREAKER_OPEN: &str = "breaker open";

fn repair(mut wf: Workflow, done: Option<&Done>, now: u64) -> Transition {
    match done {
        Some(Done::RebootIssued) => return goto(wf, Step::AwaitBoot, now),
        Some(Done::Replacement(new_node)) => {
            wf.replacement = Some(new_node.clone());
            return goto(wf, Step::AwaitReplacement, now);
        }
        _ => {}
    }
    if wf.issued_ms.is_some() && wf.action == RuleAction::Reboot {
        // Resumed after a restart: the call may have gone out. Await its effect rather than repeat
        // it; the await step issues it again when its timeout passes.
        return goto(wf, Step::AwaitBoot, now);
    }
    let node = wf.node.clone();
    let effect = match wf.action {
        RuleAction::Reboot => Effect::Reboot { node },
        RuleAction::Replace => Effect::Replace { node },
        other => return quarantine(wf, &format!("{other} is not a repair"), now),
    };
    // Written before the call: after a restart the call may have been made.
    wf.issued_ms = Some(now);
    Transition::written(wf, effect)
}

fn validate(
    mut wf: Workflow,
    seen: &Observation,
    done: Option<&Done>,
    limits: &Limits,
) -> Transition {
    let now = seen.now_ms;
    // Unique per validation of this workflow (the action changes when a reboot escalates to a
    // replacement, whose attempts count from 1 again): results are at-least-once, so a late copy
    // of an earlier validation's result must not answer this one. Results live in memory, so the
    // id also names this repairer process: after a restart the check is asked for afresh.
    let id = format!("deep-check-{}-{}-{}-{}", wf.id, wf.action, wf.attempt, seen.instance);
    if wf.validation.as_deref() != Some(id.as_str()) {
        wf.validation = Some(id.clone());
        wf.step_since_ms = now;
        let effect = Effect::DeepCheck { node: wf.target().to_owned(), id };
        return Transition::written(wf, effect);
    }
    if let Some(result) = &seen.deep_check {
        let used = Note::ResultUsed(id);
        if result.ok {
            return goto(wf, Step::Undrain, now).note(used);
        }
        let why = format!("validation failed: {}", result.message);
        return escalate(wf, &why, now).note(used);
    }
    if !matches!(done, Some(Done::DeepCheckQueued)) {
        return Transition::stay(
            wf.clone(),
            Effect::DeepCheck { node: wf.target().to_owned(), id },
        );
    }
    let deadline = wf.step_since_ms + millis(limits.timeouts.validate_timeout);
    if now < deadline {
        // The deep check's result comes in a report and the allreduce probe's verdict with a
        // wake of its own: both end the wait.
        return Transition::stay(wf, Effect::WaitUntil { until_ms: deadline });
    }
    escalate(wf, "the deep check did not answer in time", now)
}

/// A repair that did not work: a reboot becomes a replacement, a replacement a quarantine.
fn escalate(mut wf: Workflow, why: &str, now: u64) -> Transition {
    let failed = Note::RepairFailed(wf.action);
    if wf.action != RuleAction::Reboot {
        return quarantine(wf, why, now).note(failed);
    }
    if wf.stop_at == Some(Rung::Reboot) {
        let why = format!("{why}; rule {} stops the ladder at reboot: a person decides", wf.rule);
        return quarantine(wf, &why, now).note(failed);
    }
    wf.action = RuleAction::Replace;
    wf.escalated_from = Some(RuleAction::Reboot);
    wf.attempt = 1;
    wf.issued_ms = None;
    wf.validation = None;
    // The replacement gets its own bundle: the node as the reboot left it.
    wf.evidence = None;
    wf.evidence_asked_ms = None;
    let escalated = Note::Escalated { why: why.to_owned() };
    let mut transition = goto(wf, Step::Settle, now);
    transition.notes.splice(0..0, [failed, escalated]);
    transition
}

fn quarantine(mut wf: Workflow, why: &str, now: u64) -> Transition {
    wf.reason = format!("{}; {why}", wf.reason);
    finish(wf, Outcome::Quarantined, now)
}

/// Ends the workflow: written (closed) by the driver once it has recorded the end.
fn finish(mut wf: Workflow, outcome: Outcome, now: u64) -> Transition {
    wf.outcome = Some(outcome);
    wf.step = Step::Done;
    wf.step_since_ms = now;
    Transition::stay(wf, Effect::Finish { outcome })
}

/// The state each node of the workflow is in, and why, derived from the workflow alone: the
/// workflow's node, then its replacement (once there is one to validate).
pub fn node_states(wf: &Workflow) -> Vec<(&str, NodeState, String)> {
    let node = wf.node.as_str();
    if let (Step::Done, Some(outcome)) = (wf.step, wf.outcome) {
        return final_states(wf, outcome);
    }
    let in_repair = (NodeState::Repairing, format!("{} started", wf.action));
    let validating = (NodeState::Validating, "deep health check".to_owned());
    let (state, reason) = match (wf.kind, wf.step) {
        (WorkflowKind::Release, _) => {
            (NodeState::Drained, format!("workflow {} (release) started", wf.id))
        }
        // A replacement after a reboot that did not help: the node stays in repair.
        (_, Step::Settle | Step::Evidence) if wf.escalated_from.is_some() => in_repair,
        (_, Step::Drain | Step::Checkpoint | Step::Requeue | Step::Settle | Step::Evidence) => {
            (NodeState::Draining, format!("workflow {} ({}) started", wf.id, wf.action))
        }
        (_, Step::Repair | Step::AwaitBoot | Step::AwaitReplacement) => in_repair,
        (_, Step::Validate | Step::Undrain | Step::Done) => match &wf.replacement {
            // The replacement is validated while the node it replaces stays in repair.
            Some(new_node) => {
                let (state, reason) = validating;
                return vec![(node, in_repair.0, in_repair.1), (new_node.as_str(), state, reason)];
            }
            None => validating,
        },
    };
    vec![(node, state, reason)]
}

/// The states a finished workflow leaves its nodes in.
fn final_states(wf: &Workflow, outcome: Outcome) -> Vec<(&str, NodeState, String)> {
    let node = wf.node.as_str();
    let reason = finish_reason(wf, outcome);
    match (outcome, &wf.replacement) {
        (Outcome::Repaired, Some(new_node)) => vec![
            (node, NodeState::Retired, reason),
            (new_node.as_str(), NodeState::Healthy, format!("replaced {node}")),
        ],
        (Outcome::Repaired, None) | (Outcome::Released, _) => {
            vec![(node, NodeState::Healthy, reason)]
        }
        (Outcome::Drained, _) => vec![(node, NodeState::Drained, reason)],
        (Outcome::Quarantined, Some(new_node)) => vec![
            (node, NodeState::Quarantined, reason.clone()),
            // The replacement failed its validation or was drained by someone else: it goes to a
            // person too, rather than staying `validating` with no workflow left to finish it.
            (
                new_node.as_str(),
                NodeState::Quarantined,
                format!("as the replacement of {node}: {reason}"),
            ),
        ],
        (Outcome::Quarantined, None) => vec![(node, NodeState::Quarantined, reason)],
    }
}

/// Why a workflow ended, as its last event says.
pub fn finish_reason(wf: &Workflow, outcome: Outcome) -> String {
    match outcome {
        Outcome::Repaired => format!("{} repaired and validated", wf.action),
        Outcome::Drained => "drained until its findings clear".to_owned(),
        Outcome::Released => "findings cleared: back at work".to_owned(),
        Outcome::Quarantined => format!("quarantined: {}", wf.reason),
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
