//! Carries a workflow out: asks the machine (`machine::next`) what to do, writes what it says
//! before acting (the workflow, its events, the nodes' states), carries out the one effect through
//! the scheduler, provider or command queue with the call timeout, and feeds the answer back.
//! Retries back off exponentially with jitter; every wait has a deadline on the clock.

use std::sync::Arc;
use std::time::Duration;

use super::machine::{
    self, Answer, DeepCheck, Done, Effect, Failure, FailureKind, Limits, Note, Observation,
};
use super::progress::Progress;
use super::{KeptEvidence, Outcome, Workflow};
use crate::allreduce::Prober;
use crate::breaker::Breaker;
use crate::clock::{self, SharedClock};
use crate::commands::CommandQueue;
use crate::metrics::RepairerMetrics;
use crate::model::{Actor, Event, EventKind, RuleAction, Severity};
use crate::nodes::{NodeError, NodeRecord, Nodes};
use crate::policy::RepairRecord;
use crate::ports::EventLog;
use crate::provider::{Provider, ProviderError};
use crate::scheduler::{Scheduler, SchedulerError};
use crate::store::StoreError;
use crate::workflow::trace::{WorkflowTrace, WorkflowTracer};
use fleetmend_proto::backoff::Backoff;
use fleetmend_proto::{EvidenceBundle, NodeCommand, command_kind};

/// What a workflow is carried out with: narrow ports, not the engine.
pub struct WorkflowContext {
    pub clock: SharedClock,
    pub events: Arc<EventLog>,
    pub nodes: Arc<Nodes>,
    pub breaker: Arc<Breaker>,
    pub scheduler: Arc<dyn Scheduler>,
    pub provider: Arc<dyn Provider>,
    pub commands: Arc<CommandQueue>,
    pub metrics: Arc<RepairerMetrics>,
    pub tracer: Option<Arc<WorkflowTracer>>,
    /// The allreduce probe a validation's deep check also waits for (`[allreduce] on_validate`).
    pub prober: Option<Arc<Prober>>,
    /// Rings a node's workflows when a report may let a waiting step go on.
    pub progress: Arc<Progress>,
    pub limits: Limits,
    /// After a repair, how long before the node may be repaired again.
    pub cooldown: Duration,
    /// Names this repairer process.
    pub instance: u64,
}

impl std::fmt::Debug for WorkflowContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowContext").field("limits", &self.limits).finish_non_exhaustive()
    }
}

/// Drives `workflow` to its end.
pub async fn run(cx: Arc<WorkflowContext>, mut workflow: Workflow) {
    let mut trace = WorkflowTrace::begin(cx.tracer.as_deref(), &mut workflow, cx.clock.now_ms());
    if trace.assigned_root() {
        // Best effort: a trace id not written is a trace that starts afresh after a restart.
        let _saved = save(&cx, &workflow, true);
    }
    let mut answer: Option<Answer> = None;
    let mut failures = 0u32;
    let mut bell = bell(&cx, &workflow);
    let mut bell_for = workflow.replacement.clone();
    loop {
        if workflow.replacement != bell_for {
            bell = self::bell(&cx, &workflow);
            bell_for = workflow.replacement.clone();
        }
        // Listening before looking: a report that lands between the look and the wait still
        // wakes the wait, so a step waits for its deadline or its report, never for a poll.
        let progressed = bell.notified();
        tokio::pin!(progressed);
        progressed.as_mut().enable();
        let seen = observe(&cx, &workflow, answer.take());
        let step_before = workflow.step;
        let transition = machine::next(&workflow, &seen, &cx.limits);
        if let Err(err) = write(&cx, &workflow, &transition) {
            // Nothing was acted on: the same transition is tried again after a pause.
            tracing::error!(workflow = workflow.id, error = %err, "writing a workflow's transition failed: retrying");
            failures = failures.saturating_add(1);
            cx.clock.sleep(backoff(&cx.limits, failures)).await;
            continue;
        }
        workflow = transition.workflow;
        let finished = matches!(transition.effect, Effect::Finish { .. });
        if workflow.step != step_before && !finished {
            failures = 0;
            trace.step(&workflow);
        }
        for note in &transition.notes {
            if let Note::Retrying { error, .. } = note {
                trace.retry(&workflow, error);
            }
        }
        match transition.effect {
            Effect::Continue => {}
            Effect::WaitUntil { until_ms } => {
                let wait = Duration::from_millis(until_ms.saturating_sub(cx.clock.now_ms()));
                tokio::select! {
                    biased;
                    () = cx.clock.sleep(wait) => {}
                    () = progressed => {}
                }
            }
            Effect::Backoff => {
                failures = failures.saturating_add(1);
                cx.clock.sleep(backoff(&cx.limits, failures)).await;
            }
            Effect::Finish { outcome } => {
                finish(&cx, &workflow, outcome);
                trace.finish(&workflow);
                return;
            }
            effect => answer = Some(carry_out(&cx, &workflow, effect).await),
        }
    }
}

/// What rings when a report may let the workflow go on: one of its node, or of its replacement.
fn bell(cx: &WorkflowContext, wf: &Workflow) -> Arc<tokio::sync::Notify> {
    let nodes: Vec<&str> =
        std::iter::once(wf.node.as_str()).chain(wf.replacement.as_deref()).collect();
    cx.progress.bell(&nodes)
}

/// The result of validation `id`: the agent's deep check, and the allreduce probe's verdict where
/// the validation waits for one (both must be in; the node passes only if both passed).
fn deep_check(cx: &WorkflowContext, id: &str) -> Option<DeepCheck> {
    let result = cx.commands.result(id)?;
    let Some(prober) = &cx.prober else {
        return Some(DeepCheck { ok: result.ok, message: result.message });
    };
    let probe = prober.verdict(id)?;
    Some(DeepCheck {
        ok: result.ok && probe.ok,
        message: format!("{}; {}", result.message, probe.message),
    })
}

/// What the machine reads besides the workflow.
fn observe(cx: &WorkflowContext, wf: &Workflow, answer: Option<Answer>) -> Observation {
    let (boot_id, replacement_reported) = {
        // Read under the lock, not cloned: this runs on every pass of every workflow.
        let nodes = cx.nodes.lock();
        let boot_id = nodes.get(&wf.node).map(|n| n.boot_id.clone()).unwrap_or_default();
        (boot_id, wf.replacement.as_deref().is_some_and(|n| nodes.get(n).is_some()))
    };
    let deep_check = wf.validation.as_deref().and_then(|id| deep_check(cx, id));
    let evidence_answered = wf.evidence.as_deref().is_some_and(|id| cx.commands.has_result(id));
    let last_heard_ms = if wf.step == super::Step::Evidence {
        cx.nodes.last_heard_ms(&wf.node).unwrap_or(0)
    } else {
        0
    };
    Observation {
        now_ms: cx.clock.now_ms(),
        answer,
        boot_id,
        last_heard_ms,
        replacement_reported,
        deep_check,
        evidence_answered,
        breaker_open: cx.breaker.is_open(),
        instance: cx.instance,
    }
}

/// Writes what a transition says before its effect: its events, the workflow, the nodes' states.
fn write(
    cx: &WorkflowContext,
    before: &Workflow,
    transition: &machine::Transition,
) -> Result<(), StoreError> {
    let wf = &transition.workflow;
    for note in &transition.notes {
        note_down(cx, before, wf, note)?;
    }
    if transition.persist {
        save(cx, wf, true)?;
    }
    if !matches!(transition.effect, Effect::Finish { .. }) {
        set_states(cx, wf)?;
    }
    Ok(())
}

fn save(cx: &WorkflowContext, wf: &Workflow, open: bool) -> Result<(), StoreError> {
    let store = cx.events.store();
    cx.events.write("update_workflow", store.update_workflow(wf.id, open, wf))
}

/// Moves each node of the workflow to the state the workflow puts it in.
fn set_states(cx: &WorkflowContext, wf: &Workflow) -> Result<(), StoreError> {
    let now = cx.clock.now_ms();
    for (name, state, reason) in machine::node_states(wf) {
        if cx.nodes.lock().get(name).is_none_or(|n| n.state == state) {
            continue;
        }
        let changed = cx.nodes.with_node(name, |node, events| {
            crate::nodes::transition(events, node, state, &reason, Actor::repairer(), now)
        });
        match changed {
            Ok(()) => {}
            Err(NodeError::Store(err)) => return Err(err),
            Err(err) => tracing::warn!(node = name, error = %err, "a workflow's node is gone"),
        }
    }
    Ok(())
}

fn step_event(wf: &Workflow, severity: Severity, reason: String, now: u64) -> Event {
    Event {
        workflow: Some(wf.id),
        action: Some(wf.action),
        ..Event::new(
            EventKind::WorkflowStep,
            severity,
            Some(&wf.node),
            Actor::repairer(),
            reason,
            now,
        )
    }
}

fn note_down(
    cx: &WorkflowContext,
    before: &Workflow,
    wf: &Workflow,
    note: &Note,
) -> Result<(), StoreError> {
    let now = cx.clock.now_ms();
    match note {
        Note::Step(step) => {
            cx.events.record(&step_event(wf, Severity::Info, format!("step {step:?}"), now))?;
        }
        Note::Retrying { step, error } => {
            let reason = format!("{step:?} failed, retrying: {error}");
            cx.events.record(&step_event(wf, Severity::Warning, reason, now))?;
        }
        Note::Warning(text) => {
            cx.events.record(&step_event(wf, Severity::Warning, text.clone(), now))?;
        }
        Note::HeldByBreaker => {
            cx.events.record(&Event {
                workflow: Some(wf.id),
                action: Some(wf.action),
                ..Event::new(
                    EventKind::ActionHeld,
                    Severity::Critical,
                    Some(&wf.node),
                    Actor::repairer(),
                    format!("{} held: the breaker is open", wf.action),
                    now,
                )
            })?;
        }
        Note::Drained => {
            if wf.kind == super::WorkflowKind::Repair {
                cx.metrics.time_to_drain(seconds_since(now, wf.fault_since_ms));
            }
        }
        Note::RepairFailed(action) => remember(cx, &wf.node, *action, false, now)?,
        Note::Escalated { why } => {
            cx.events.record(&Event {
                workflow: Some(wf.id),
                action: Some(RuleAction::Replace),
                findings: wf.findings.clone(),
                ..Event::new(
                    EventKind::RepairFinished,
                    Severity::Warning,
                    Some(&wf.node),
                    Actor::repairer(),
                    format!("reboot did not help ({why}): escalating to replace"),
                    now,
                )
            })?;
            cx.metrics.repair(before.action, "escalated");
        }
        Note::ResultUsed(id) => {
            cx.commands.forget(id);
            if let Some(prober) = &cx.prober {
                prober.forget(id);
            }
        }
        Note::EvidenceAnswered(id) => keep_evidence(cx, wf, id, now)?,
    }
    Ok(())
}

/// Evidence bundles kept per node; older ones are removed.
const EVIDENCE_PER_NODE: usize = 20;

/// Keeps the bundle that answered `id` with the workflow, and says so in the audit trail.
fn keep_evidence(
    cx: &WorkflowContext,
    wf: &Workflow,
    id: &str,
    now: u64,
) -> Result<(), StoreError> {
    let Some(result) = cx.commands.result(id) else {
        return Ok(());
    };
    let (severity, reason) = match result.evidence {
        Some(bundle) => {
            let reason = describe_bundle(&bundle);
            let kept = KeptEvidence {
                workflow: wf.id,
                node: wf.node.clone(),
                action: wf.action,
                command: id.to_owned(),
                asked_ms: wf.evidence_asked_ms.unwrap_or(now),
                kept_ms: now,
                bundle,
            };
            let store = cx.events.store();
            let put = store.put_evidence(wf.id, &wf.node, id, &kept, EVIDENCE_PER_NODE);
            cx.events.write("put_evidence", put)?;
            (Severity::Info, reason)
        }
        None => (Severity::Warning, format!("the node gathered no evidence: {}", result.message)),
    };
    cx.events.record(&Event {
        workflow: Some(wf.id),
        action: Some(wf.action),
        ..Event::new(EventKind::Evidence, severity, Some(&wf.node), Actor::repairer(), reason, now)
    })?;
    cx.commands.forget(id);
    Ok(())
}

/// `evidence kept: kernel-log 212 KiB, findings 3 KiB, nvidia-smi (not complete: ...)`.
fn describe_bundle(bundle: &EvidenceBundle) -> String {
    let items: Vec<String> = bundle
        .items
        .iter()
        .map(|item| {
            let size = format!("{} KiB", item.content.len().div_ceil(1024));
            match &item.error {
                Some(error) => format!("{} {size} ({error})", item.name),
                None if item.truncated => format!("{} {size} (newest part)", item.name),
                None => format!("{} {size}", item.name),
            }
        })
        .collect();
    format!("evidence kept, gathered in {} ms: {}", bundle.took_ms, items.join(", "))
}

fn seconds_since(now: u64, since: u64) -> f64 {
    now.saturating_sub(since) as f64 / 1000.0
}

/// Adds a finished repair to the node's history.
fn remember(
    cx: &WorkflowContext,
    node: &str,
    action: RuleAction,
    succeeded: bool,
    now: u64,
) -> Result<(), StoreError> {
    if !action.is_repair() {
        return Ok(());
    }
    let record = RepairRecord { action, finished_ms: now, succeeded };
    match cx.nodes.with_node(node, |n, _| {
        n.remember(record);
        Ok(())
    }) {
        Err(NodeError::Store(err)) => Err(err),
        _ => Ok(()),
    }
}

/// The capped exponential backoff with jitter after `failures` failures in a row. The jitter
/// draws from the thread's generator, which the simulator seeds: a simulated run repeats.
fn backoff(limits: &Limits, failures: u32) -> Duration {
    let timeouts = &limits.timeouts;
    Backoff::new(timeouts.retry_initial, timeouts.retry_max).delay(failures, fastrand::f64())
}

/// Carries out one effect with the call timeout; the answer goes back to the machine.
async fn carry_out(cx: &WorkflowContext, wf: &Workflow, effect: Effect) -> Answer {
    let result = match effect {
        Effect::Drain { node, reason } => {
            call(cx, cx.scheduler.drain(&node, &reason)).await.map(|()| Done::Drained)
        }
        Effect::DrainReplacement { node, reason } => {
            call(cx, cx.scheduler.drain(&node, &reason)).await.map(|()| Done::ReplacementDrained)
        }
        Effect::ListJobs { node } => call(cx, cx.scheduler.jobs_on(&node))
            .await
            .map(|jobs| Done::Jobs(jobs.into_iter().map(|j| j.id).collect())),
        Effect::Checkpoint { jobs } => {
            for job in &jobs {
                if let Err(err) = call(cx, cx.scheduler.checkpoint(job)).await {
                    // A job that cannot be signalled is still requeued; its last checkpoint stands.
                    tracing::warn!(job, error = %err.error, "asking a job to checkpoint failed");
                }
            }
            Ok(Done::Signalled)
        }
        Effect::Requeue { jobs, left } => {
            for job in &left {
                tracing::info!(
                    workflow = wf.id,
                    job,
                    node = wf.node,
                    "job left the node before its requeue: left as it is"
                );
            }
            let mut requeued = Ok(Done::Requeued);
            for job in &jobs {
                if let Err(err) = call(cx, cx.scheduler.requeue(job)).await {
                    requeued = Err(err);
                    break;
                }
            }
            requeued
        }
        Effect::Reboot { node } => {
            call(cx, cx.provider.reboot(&node)).await.map(|()| Done::RebootIssued)
        }
        Effect::Replace { node } => {
            call(cx, cx.provider.replace(&node)).await.map(Done::Replacement)
        }
        Effect::DeepCheck { node, id } => {
            if let Some(prober) = &cx.prober {
                prober.request(&node, &id);
            }
            let kind = command_kind::DEEP_CHECK.to_owned();
            cx.commands.push(&node, NodeCommand { id, kind, args: Default::default() });
            Ok(Done::DeepCheckQueued)
        }
        Effect::GatherEvidence { node, id, budget_ms } => {
            let kind = command_kind::EVIDENCE.to_owned();
            let args = [("budget_ms".to_owned(), serde_json::Value::from(budget_ms))].into();
            cx.commands.push(&node, NodeCommand { id, kind, args });
            Ok(Done::EvidenceAsked)
        }
        Effect::Undrain { node } => {
            call(cx, cx.scheduler.undrain(&node)).await.map(Done::Undrained)
        }
        Effect::Continue | Effect::WaitUntil { .. } | Effect::Backoff | Effect::Finish { .. } => {
            Err(Failure { kind: FailureKind::Permanent, error: "not a call".to_owned() })
        }
    };
    match result {
        Ok(done) => Answer::Done(done),
        Err(failure) => Answer::Failed(failure),
    }
}

/// The answer to one scheduler or provider call, within the call timeout.
async fn call<T, E: CallError>(
    cx: &WorkflowContext,
    future: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, Failure> {
    match clock::timeout(&*cx.clock, cx.limits.timeouts.call_timeout, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(Failure { kind: err.kind(), error: err.to_string() }),
        Err(elapsed) => Err(Failure { kind: FailureKind::TimedOut, error: elapsed.to_string() }),
    }
}

/// A backend's error, as the machine weighs it.
trait CallError: std::fmt::Display {
    fn kind(&self) -> FailureKind;
}

impl CallError for SchedulerError {
    fn kind(&self) -> FailureKind {
        match self {
            SchedulerError::UnknownNode { .. } => FailureKind::Permanent,
            SchedulerError::Timeout { .. } => FailureKind::TimedOut,
            SchedulerError::UnknownJob { .. } | SchedulerError::Failed { .. } => {
                FailureKind::Retryable
            }
        }
    }
}

impl CallError for ProviderError {
    fn kind(&self) -> FailureKind {
        match self {
            ProviderError::Unsupported { .. } | ProviderError::Impossible { .. } => {
                FailureKind::Permanent
            }
            ProviderError::Timeout { .. } => FailureKind::TimedOut,
            ProviderError::Failed { .. } => FailureKind::Retryable,
        }
    }
}

/// Ends the workflow: its record first, then the states it leaves its nodes in, then the
/// workflow closed. A write that fails is retried by the next repairer: the workflow stays open.
fn finish(cx: &WorkflowContext, wf: &Workflow, outcome: Outcome) {
    if let Err(err) = finish_writes(cx, wf, outcome) {
        tracing::error!(workflow = wf.id, error = %err, "finishing the workflow failed: it is finished again after a restart");
    }
}

fn finish_writes(cx: &WorkflowContext, wf: &Workflow, outcome: Outcome) -> Result<(), StoreError> {
    let now = cx.clock.now_ms();
    let reason = machine::finish_reason(wf, outcome);
    let severity =
        if outcome == Outcome::Quarantined { Severity::Critical } else { Severity::Info };
    cx.events.record(&Event {
        workflow: Some(wf.id),
        action: Some(wf.action),
        findings: wf.findings.clone(),
        ..Event::new(
            EventKind::RepairFinished,
            severity,
            Some(&wf.node),
            Actor::repairer(),
            reason,
            now,
        )
    })?;
    if outcome == Outcome::Repaired {
        remember(cx, &wf.node, wf.action, true, now)?;
        cx.metrics.time_to_repair(seconds_since(now, wf.fault_since_ms));
    }
    if wf.action.is_repair() || outcome == Outcome::Quarantined {
        cx.metrics.repair(wf.action, outcome.as_str());
    }
    let cooldown = cx.cooldown.as_millis() as u64;
    for (name, state, reason) in machine::node_states(wf) {
        let own = name == wf.node;
        let changed = cx.nodes.with_node(name, |n, events| {
            // Worked out on a copy: the record changes only once its event is written.
            let mut closed = n.clone();
            if own {
                close_record(&mut closed, wf, outcome, now + cooldown);
            } else if outcome == Outcome::Repaired {
                closed.cooldown_until_ms = now + cooldown;
            }
            crate::nodes::transition(events, &mut closed, state, &reason, Actor::repairer(), now)?;
            *n = closed;
            Ok(())
        });
        match changed {
            Ok(()) => {}
            Err(NodeError::Store(err)) => return Err(err),
            // A replacement that never reported has no record to change.
            Err(_) => {}
        }
    }
    save(cx, wf, false)
}

/// What a finished workflow changes in its node's record besides the state.
fn close_record(n: &mut NodeRecord, wf: &Workflow, outcome: Outcome, cooldown_until_ms: u64) {
    // A record from before the repair is not repaired again when an agent reads it anew.
    n.mark_acted();
    n.workflow = None;
    n.last_noted = None;
    if let (Outcome::Repaired, Some(new_node)) = (outcome, &wf.replacement) {
        n.replaced_by = Some(new_node.clone());
    }
    if matches!(outcome, Outcome::Repaired | Outcome::Released) {
        n.cooldown_until_ms = cooldown_until_ms;
        // A reboot or replacement starts the node's findings afresh: the next report says.
        if outcome == Outcome::Repaired {
            n.findings.clear();
            n.alerted.clear();
            n.unhealthy_since_ms = None;
        }
    }
}
