//! Durable repair workflows: drain → checkpoint → requeue → settle → reboot or replace → await the
//! node → validate (deep check) → undrain. Every step is written to the store before it is acted on,
//! so a repairer killed at any point resumes where it was: a reboot that was issued is awaited, not
//! issued again, and one that was lost is issued again once its timeout passes.

use std::sync::Arc;
use std::time::Duration;

use fleetmend_proto::{Finding, NodeCommand, command_kind};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, now_ms};
use crate::model::{Actor, Event, EventKind, NodeState, RuleAction, Severity};
use crate::policy::RepairRecord;
use crate::scheduler::{DRAIN_REASON_PREFIX, UndrainOutcome};
use crate::telemetry::WorkflowTrace;

/// Timeouts of the workflow's steps (`[engine.workflow]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkflowTimeouts {
    /// Longest one scheduler or provider call may take.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// After asking the jobs on the node to checkpoint, how long to let them write it before they
    /// are stopped and requeued.
    #[serde(with = "humantime_serde")]
    pub checkpoint_grace: Duration,
    /// From the reboot call to the node reporting with a new boot id.
    #[serde(with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// From the replace call to the new node reporting.
    #[serde(with = "humantime_serde")]
    pub replace_timeout: Duration,
    /// From sending the deep check to its result.
    #[serde(with = "humantime_serde")]
    pub validate_timeout: Duration,
    /// Reboot attempts before the repair counts as failed (and escalates).
    pub reboot_attempts: u32,
    /// First retry delay of a failed call; doubles up to `retry_max`, with jitter.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
}

impl Default for WorkflowTimeouts {
    fn default() -> Self {
        WorkflowTimeouts {
            call_timeout: Duration::from_secs(30),
            checkpoint_grace: Duration::from_secs(30),
            reboot_timeout: Duration::from_secs(15 * 60),
            replace_timeout: Duration::from_secs(60 * 60),
            validate_timeout: Duration::from_secs(20 * 60),
            reboot_attempts: 2,
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
        }
    }
}

/// What a workflow is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkflowKind {
    /// Drain, and reboot or replace when the action asks for it.
    Repair,
    /// Put a drained node back.
    Release,
    /// Take a node out for a person.
    Quarantine,
}

/// A workflow's step; each is written before it is acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    Drain,
    Checkpoint,
    Requeue,
    /// Waits for `settle` after the fault, and for a closed breaker, before anything destructive.
    Settle,
    /// Reboot or replace; `issued_ms` says whether the call may have been made.
    Repair,
    AwaitBoot,
    AwaitReplacement,
    Validate,
    Undrain,
    Done,
}

/// How a workflow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Repaired and validated, back at work.
    Repaired,
    /// Drained until its findings clear.
    Drained,
    /// Put back after its findings cleared.
    Released,
    /// A person must look.
    Quarantined,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Repaired => "repaired",
            Outcome::Drained => "drained",
            Outcome::Released => "released",
            Outcome::Quarantined => "quarantined",
        }
    }
}

/// One durable workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub id: i64,
    pub node: String,
    pub kind: WorkflowKind,
    pub action: RuleAction,
    pub rule: String,
    pub reason: String,
    pub findings: Vec<Finding>,
    /// When the fault that started it was first seen (for settle and time-to-repair).
    pub fault_since_ms: u64,
    pub started_ms: u64,
    pub step: Step,
    pub step_since_ms: u64,
    /// Attempt of the current repair call (1-based).
    pub attempt: u32,
    pub boot_id_before: String,
    /// Set before the provider is called: the call may have been made.
    pub issued_ms: Option<u64>,
    pub jobs: Vec<String>,
    pub checkpoint_sent_ms: Option<u64>,
    pub replacement: Option<String>,
    pub validation: Option<String>,
    pub outcome: Option<Outcome>,
    pub last_error: Option<String>,
    /// The root span of the workflow's trace (when traces are exported), so a resumed workflow
    /// continues the same trace.
    #[serde(default)]
    pub trace: Option<crate::telemetry::TraceParent>,
}

impl Workflow {
    /// A repair (drain, reboot or replace) of `node`.
    #[allow(clippy::too_many_arguments)]
    pub fn repair(
        node: &str,
        action: RuleAction,
        rule: &str,
        reason: &str,
        findings: Vec<Finding>,
        fault_since_ms: u64,
        boot_id: &str,
        now: u64,
    ) -> Workflow {
        Workflow {
            id: 0,
            node: node.to_owned(),
            kind: WorkflowKind::Repair,
            action,
            rule: rule.to_owned(),
            reason: reason.to_owned(),
            findings,
            fault_since_ms,
            started_ms: now,
            step: Step::Drain,
            step_since_ms: now,
            attempt: 1,
            boot_id_before: boot_id.to_owned(),
            issued_ms: None,
            jobs: Vec::new(),
            checkpoint_sent_ms: None,
            replacement: None,
            validation: None,
            outcome: None,
            last_error: None,
            trace: None,
        }
    }

    pub fn release(node: &str, reason: &str, now: u64) -> Workflow {
        Workflow {
            kind: WorkflowKind::Release,
            step: Step::Undrain,
            ..Workflow::repair(node, RuleAction::None, "release", reason, Vec::new(), now, "", now)
        }
    }

    pub fn quarantine(node: &str, reason: &str, now: u64) -> Workflow {
        Workflow {
            kind: WorkflowKind::Quarantine,
            ..Workflow::repair(
                node,
                RuleAction::Drain,
                "quarantine",
                reason,
                Vec::new(),
                now,
                "",
                now,
            )
        }
    }

    /// The node's state while the workflow starts.
    pub fn initial_state(&self) -> NodeState {
        match self.kind {
            WorkflowKind::Repair | WorkflowKind::Quarantine => NodeState::Draining,
            WorkflowKind::Release => NodeState::Drained,
        }
    }
}

/// What a step asks the driver to do next.
enum Next {
    Step(Step),
    Wait(Duration),
    Retry(String),
    Finish(Outcome),
}

/// Drives `workflow` to its end.
pub async fn run(engine: Arc<Engine>, mut workflow: Workflow) {
    let mut trace = WorkflowTrace::begin(engine.tracer(), &mut workflow);
    if trace.assigned_root() {
        persist(&engine, &workflow, true);
    }
    let mut failures = 0u32;
    loop {
        let next = step(&engine, &mut workflow).await;
        let now = now_ms();
        match next {
            Next::Step(step) => {
                failures = 0;
                workflow.last_error = None;
                workflow.step = step;
                workflow.step_since_ms = now;
                persist(&engine, &workflow, true);
                note_step(&engine, &workflow, &format!("step {step:?}"), Severity::Info);
                trace.step(&workflow);
            }
            Next::Wait(delay) => {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = engine.progress.notified() => {}
                }
            }
            Next::Retry(error) => {
                failures = failures.saturating_add(1);
                if workflow.last_error.as_deref() != Some(error.as_str()) {
                    note_step(
                        &engine,
                        &workflow,
                        &format!("{:?} failed, retrying: {error}", workflow.step),
                        Severity::Warning,
                    );
                    trace.retry(&workflow, &error);
                    workflow.last_error = Some(error);
                    persist(&engine, &workflow, true);
                }
                let timeouts = &engine.config.workflow;
                let capped = timeouts
                    .retry_initial
                    .saturating_mul(1 << failures.saturating_sub(1).min(16))
                    .min(timeouts.retry_max);
                tokio::time::sleep(capped / 2 + (capped / 2).mul_f64(fastrand::f64())).await;
            }
            Next::Finish(outcome) => {
                finish(&engine, &mut workflow, outcome, now);
                trace.finish(&workflow);
                return;
            }
        }
    }
}

fn persist(engine: &Engine, workflow: &Workflow, open: bool) {
    if let Err(err) = engine.store.update_workflow(workflow.id, open, workflow) {
        tracing::error!(workflow = workflow.id, error = %err, "saving the workflow failed");
    }
}

fn note_step(engine: &Engine, workflow: &Workflow, reason: &str, severity: Severity) {
    let event = Event {
        workflow: Some(workflow.id),
        action: Some(workflow.action),
        ..Event::new(
            EventKind::WorkflowStep,
            severity,
            Some(&workflow.node),
            Actor::repairer(),
            reason,
            now_ms(),
        )
    };
    if let Err(err) = engine.record(event) {
        tracing::error!(workflow = workflow.id, error = %err, "recording a workflow step failed");
    }
}

fn set_state(engine: &Engine, node: &str, state: NodeState, reason: &str) {
    let now = now_ms();
    if let Err(err) =
        engine.with_node(node, |n| engine.transition(n, state, reason, Actor::repairer(), now))
    {
        tracing::error!(node, error = %err, "changing the node's state failed");
    }
}

async fn call<T, E: std::fmt::Display>(
    engine: &Engine,
    future: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(engine.config.workflow.call_timeout, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("no answer within {:?}", engine.config.workflow.call_timeout)),
    }
}

async fn step(engine: &Arc<Engine>, wf: &mut Workflow) -> Next {
    let now = now_ms();
    let timeouts = engine.config.workflow.clone();
    match wf.step {
        Step::Drain => {
            let reason =
                format!("{DRAIN_REASON_PREFIX}{}", wf.reason.chars().take(200).collect::<String>());
            if let Err(err) = call(engine, engine.scheduler.drain(&wf.node, &reason)).await {
                return Next::Retry(err);
            }
            if wf.kind == WorkflowKind::Repair {
                engine
                    .counters
                    .time_to_drain
                    .lock()
                    .map(|mut h| {
                        h.observe(now_ms().saturating_sub(wf.fault_since_ms) as f64 / 1000.0)
                    })
                    .ok();
            }
            Next::Step(Step::Checkpoint)
        }
        Step::Checkpoint => {
            let jobs = match call(engine, engine.scheduler.jobs_on(&wf.node)).await {
                Ok(jobs) => jobs,
                Err(err) => return Next::Retry(err),
            };
            wf.jobs = jobs.into_iter().map(|j| j.id).collect();
            for job in &wf.jobs {
                if let Err(err) = call(engine, engine.scheduler.checkpoint(job)).await {
                    // A job that cannot be signalled is still requeued; its last checkpoint stands.
                    tracing::warn!(job, error = %err, "asking a job to checkpoint failed");
                }
            }
            wf.checkpoint_sent_ms = Some(now);
            Next::Step(if wf.jobs.is_empty() { after_jobs(wf) } else { Step::Requeue })
        }
        Step::Requeue => {
            let sent = wf.checkpoint_sent_ms.unwrap_or(now);
            let ready = sent + timeouts.checkpoint_grace.as_millis() as u64;
            if now < ready {
                return Next::Wait(Duration::from_millis(ready - now));
            }
            // Only the jobs still on the node: one that has left it meanwhile (its scheduler
            // stopped and restarted it elsewhere, or it ended) must not be stopped again where it
            // runs now.
            let still_on: Vec<String> = match call(engine, engine.scheduler.jobs_on(&wf.node)).await
            {
                Ok(jobs) => jobs.into_iter().map(|j| j.id).collect(),
                Err(err) => return Next::Retry(err),
            };
            for job in wf.jobs.clone() {
                if !still_on.contains(&job) {
                    tracing::info!(
                        workflow = wf.id,
                        job,
                        node = wf.node,
                        "job left the node before its requeue: left as it is"
                    );
                    continue;
                }
                if let Err(err) = call(engine, engine.scheduler.requeue(&job)).await {
                    return Next::Retry(err);
                }
            }
            Next::Step(after_jobs(wf))
        }
        Step::Settle => {
            if wf.kind == WorkflowKind::Quarantine {
                return Next::Finish(Outcome::Quarantined);
            }
            if wf.action == RuleAction::Drain {
                return Next::Finish(Outcome::Drained);
            }
            let settle_until =
                wf.fault_since_ms + engine.policy.guard_rails.settle.as_millis() as u64;
            if now < settle_until {
                return Next::Wait(Duration::from_millis(settle_until - now));
            }
            if engine.breaker_open() {
                if wf.last_error.as_deref() != Some("breaker open") {
                    wf.last_error = Some("breaker open".to_owned());
                    persist(engine, wf, true);
                    let event = Event {
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
                    };
                    let _ = engine.record(event);
                }
                return Next::Wait(Duration::from_secs(1));
            }
            set_state(engine, &wf.node, NodeState::Repairing, &format!("{} started", wf.action));
            Next::Step(Step::Repair)
        }
        Step::Repair => {
            if wf.issued_ms.is_some() && wf.action == RuleAction::Reboot {
                // Resumed after a restart: the call may have gone out. Await its effect rather than
                // repeat it; the await step issues it again when its timeout passes.
                return Next::Step(Step::AwaitBoot);
            }
            wf.issued_ms = Some(now);
            persist(engine, wf, true);
            match wf.action {
                RuleAction::Reboot => match call(engine, engine.provider.reboot(&wf.node)).await {
                    Ok(()) => Next::Step(Step::AwaitBoot),
                    Err(err) => {
                        wf.issued_ms = None;
                        Next::Retry(err)
                    }
                },
                RuleAction::Replace => {
                    match call(engine, engine.provider.replace(&wf.node)).await {
                        Ok(new_node) => {
                            wf.replacement = Some(new_node);
                            Next::Step(Step::AwaitReplacement)
                        }
                        Err(err) => {
                            wf.issued_ms = None;
                            Next::Retry(err)
                        }
                    }
                }
                other => Next::Retry(format!("{other} is not a repair")),
            }
        }
        Step::AwaitBoot => {
            let booted = engine
                .node(&wf.node)
                .is_some_and(|n| !n.boot_id.is_empty() && n.boot_id != wf.boot_id_before);
            if booted {
                return Next::Step(Step::Validate);
            }
            let deadline = wf.issued_ms.unwrap_or(now) + timeouts.reboot_timeout.as_millis() as u64;
            if now < deadline {
                return Next::Wait(Duration::from_millis((deadline - now).min(1000)));
            }
            if wf.attempt < timeouts.reboot_attempts {
                wf.attempt += 1;
                wf.issued_ms = None;
                note_step(
                    engine,
                    wf,
                    "the node did not come back from the reboot: rebooting again",
                    Severity::Warning,
                );
                return Next::Step(Step::Repair);
            }
            escalate(engine, wf, "the node did not come back from its reboots")
        }
        Step::AwaitReplacement => {
            let Some(new_node) = wf.replacement.clone() else {
                return Next::Step(Step::Repair);
            };
            if engine.node(&new_node).is_some() {
                // The new node takes no work until it is validated.
                if let Err(err) = call(
                    engine,
                    engine.scheduler.drain(
                        &new_node,
                        &format!(
                            "{DRAIN_REASON_PREFIX}validating as the replacement of {}",
                            wf.node
                        ),
                    ),
                )
                .await
                {
                    return Next::Retry(err);
                }
                return Next::Step(Step::Validate);
            }
            let deadline =
                wf.issued_ms.unwrap_or(now) + timeouts.replace_timeout.as_millis() as u64;
            if now < deadline {
                return Next::Wait(Duration::from_millis((deadline - now).min(1000)));
            }
            quarantine(wf, &format!("the replacement {new_node} never reported"))
        }
        Step::Validate => {
            let target = wf.replacement.clone().unwrap_or_else(|| wf.node.clone());
            // Unique per validation of this workflow (the action changes when a reboot escalates
            // to a replacement, whose attempts count from 1 again): results are at-least-once, so
            // a late copy of an earlier validation's result must not answer this one. Results live
            // in memory, so the id also names this repairer process: after a restart the check is
            // asked for afresh instead of waiting for a result the agent already delivered.
            let id =
                format!("deep-check-{}-{}-{}-{}", wf.id, wf.action, wf.attempt, engine.instance());
            if wf.validation.as_deref() != Some(id.as_str()) {
                wf.validation = Some(id.clone());
                wf.step_since_ms = now;
                persist(engine, wf, true);
                set_state(engine, &target, NodeState::Validating, "deep health check");
            }
            // Queued again on every pass: a restarted repairer lost its queue, and the agent runs
            // an id once.
            engine.commands.push(
                &target,
                NodeCommand {
                    id: id.clone(),
                    kind: command_kind::DEEP_CHECK.to_owned(),
                    args: Default::default(),
                },
            );
            if let Some(result) = engine.commands.result(&id) {
                engine.commands.forget(&id);
                if result.ok {
                    return Next::Step(Step::Undrain);
                }
                let why = format!("validation failed: {}", result.message);
                return escalate(engine, wf, &why);
            }
            let deadline = wf.step_since_ms + timeouts.validate_timeout.as_millis() as u64;
            if now < deadline {
                return Next::Wait(Duration::from_millis((deadline - now).min(500)));
            }
            escalate(engine, wf, "the deep check did not answer in time")
        }
        Step::Undrain => {
            let target = wf.replacement.clone().unwrap_or_else(|| wf.node.clone());
            match call(engine, engine.scheduler.undrain(&target)).await {
                Ok(UndrainOutcome::DrainedByOther(reason)) => {
                    note_step(
                        engine,
                        wf,
                        &format!("left drained: someone else drained it ({reason})"),
                        Severity::Warning,
                    );
                    quarantine(wf, "drained by someone else during the repair")
                }
                Ok(_) => Next::Finish(match wf.kind {
                    WorkflowKind::Release => Outcome::Released,
                    _ => Outcome::Repaired,
                }),
                Err(err) => Next::Retry(err),
            }
        }
        Step::Done => Next::Finish(wf.outcome.unwrap_or(Outcome::Repaired)),
    }
}

/// After the jobs are dealt with, every workflow goes to the settle step, which ends drain-only and
/// quarantine workflows and holds destructive ones for the settle time and the breaker.
fn after_jobs(_wf: &Workflow) -> Step {
    Step::Settle
}

/// A repair that did not work: a reboot becomes a replacement, a replacement a quarantine.
fn escalate(engine: &Arc<Engine>, wf: &mut Workflow, why: &str) -> Next {
    let now = now_ms();
    push_history(engine, wf, false, now);
    if wf.action == RuleAction::Reboot {
        let event = Event {
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
        };
        let _ = engine.record(event);
        count_repair(engine, RuleAction::Reboot, "escalated");
        wf.action = RuleAction::Replace;
        wf.attempt = 1;
        wf.issued_ms = None;
        wf.validation = None;
        return Next::Step(Step::Settle);
    }
    quarantine(wf, why)
}

fn quarantine(wf: &mut Workflow, why: &str) -> Next {
    wf.reason = format!("{}; {why}", wf.reason);
    Next::Finish(Outcome::Quarantined)
}

fn push_history(engine: &Engine, wf: &Workflow, succeeded: bool, now: u64) {
    if !wf.action.is_repair() {
        return;
    }
    let record = RepairRecord { action: wf.action, finished_ms: now, succeeded };
    let _ = engine.with_node(&wf.node, |n| {
        n.history.push(record);
        if n.history.len() > 32 {
            n.history.remove(0);
        }
        Ok(())
    });
}

fn count_repair(engine: &Engine, action: RuleAction, outcome: &str) {
    if let Ok(mut repairs) = engine.counters.repairs.lock() {
        *repairs.entry((action.as_str().to_owned(), outcome.to_owned())).or_default() += 1;
    }
}

fn finish(engine: &Arc<Engine>, wf: &mut Workflow, outcome: Outcome, now: u64) {
    wf.outcome = Some(outcome);
    wf.step = Step::Done;
    wf.step_since_ms = now;
    let cooldown = engine.policy.guard_rails.cooldown.as_millis() as u64;
    let target = wf.replacement.clone();
    let reason = match outcome {
        Outcome::Repaired => format!("{} repaired and validated", wf.action),
        Outcome::Drained => "drained until its findings clear".to_owned(),
        Outcome::Released => "findings cleared: back at work".to_owned(),
        Outcome::Quarantined => format!("quarantined: {}", wf.reason),
    };
    // The record first, then the state it describes.
    let severity =
        if outcome == Outcome::Quarantined { Severity::Critical } else { Severity::Info };
    let event = Event {
        workflow: Some(wf.id),
        action: Some(wf.action),
        findings: wf.findings.clone(),
        ..Event::new(
            EventKind::RepairFinished,
            severity,
            Some(&wf.node),
            Actor::repairer(),
            reason.clone(),
            now,
        )
    };
    if let Err(err) = engine.record(event) {
        tracing::error!(workflow = wf.id, error = %err, "recording the end of a workflow failed");
    }
    if outcome == Outcome::Repaired {
        push_history(engine, wf, true, now);
        engine
            .counters
            .time_to_repair
            .lock()
            .map(|mut h| h.observe(now_ms().saturating_sub(wf.fault_since_ms) as f64 / 1000.0))
            .ok();
    }
    if wf.action.is_repair() || outcome == Outcome::Quarantined {
        count_repair(engine, wf.action, outcome.as_str());
    }
    let result = engine.with_node(&wf.node, |n| {
        n.workflow = None;
        n.last_noted = None;
        let state = match (outcome, &target) {
            (Outcome::Repaired, Some(new_node)) => {
                n.replaced_by = Some(new_node.clone());
                NodeState::Retired
            }
            (Outcome::Repaired, None) | (Outcome::Released, _) => NodeState::Healthy,
            (Outcome::Drained, _) => NodeState::Drained,
            (Outcome::Quarantined, _) => NodeState::Quarantined,
        };
        if matches!(outcome, Outcome::Repaired | Outcome::Released) {
            n.cooldown_until_ms = now + cooldown;
            // A reboot or replacement starts the node's findings afresh: the next report says.
            if outcome == Outcome::Repaired {
                n.findings.clear();
                n.alerted.clear();
                n.unhealthy_since_ms = None;
            }
        }
        engine.transition(n, state, &reason, Actor::repairer(), now)
    });
    if let Err(err) = result {
        tracing::error!(workflow = wf.id, error = %err, "finishing the workflow failed");
    }
    if let (Outcome::Quarantined, Some(new_node)) = (outcome, &target)
        && engine.node(new_node).is_some()
    {
        // The replacement failed its validation or was drained by someone else: it goes to a
        // person too, rather than staying `validating` with no workflow left to finish it.
        let result = engine.with_node(new_node, |n| {
            engine.transition(
                n,
                NodeState::Quarantined,
                &format!("as the replacement of {}: {reason}", wf.node),
                Actor::repairer(),
                now,
            )
        });
        if let Err(err) = result {
            tracing::error!(
                workflow = wf.id,
                node = %new_node,
                error = %err,
                "quarantining the replacement failed"
            );
        }
    }
    if let (Outcome::Repaired, Some(new_node)) = (outcome, &target) {
        let _ = engine.with_node(new_node, |n| {
            n.cooldown_until_ms = now + cooldown;
            engine.transition(
                n,
                NodeState::Healthy,
                &format!("replaced {}", wf.node),
                Actor::repairer(),
                now,
            )
        });
    }
    persist(engine, wf, false);
}
