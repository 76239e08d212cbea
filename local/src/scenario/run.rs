//! Drives a scenario on a running fleet: each fault waits for its step or time, goes to its node,
//! then the job is followed to its end and the repairs to theirs, and the summary is made.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use fleetmend_proto::Status;
use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::model::{Event, NodeState};
use fleetmend_repairer::queue::{JobState, JobView};

use super::summary::{Injection, Observed, summarize};
use super::{FaultPlan, NodeTarget, Scenario, ScenarioError, Summary, uninterrupted_hash};
use crate::up::Fleet;
use crate::up::supervisor::{AgentState, Role};

/// How often the runner looks at the job and the nodes.
const POLL: Duration = Duration::from_millis(25);
/// Events read from the store at a time.
const EVENT_PAGE: usize = 1000;

/// Runs `scenario` on `fleet` (which must run a job): injects its faults as they come due,
/// writes a line to `out` as each one goes in, waits for the job to end and the repairs to
/// settle, runs the job's command again uninterrupted (when the scenario compares hashes), and
/// returns the summary. `out` gets progress lines only; print [`Summary::render`] or the JSON of
/// the summary after it.
pub async fn run(
    fleet: &Fleet,
    scenario: &Scenario,
    out: &mut dyn Write,
) -> Result<Summary, ScenarioError> {
    if fleet.job_id().is_none() {
        return Err(ScenarioError::NoJob { scenario: scenario.name.clone() });
    }
    let started_ms = now_ms();
    let started = Instant::now();
    let deadline = started + scenario.timeout;
    writeln!(
        out,
        "scenario {}: {} fault(s){}",
        scenario.name,
        scenario.faults.len(),
        if scenario.description.is_empty() {
            String::new()
        } else {
            format!(": {}", scenario.description)
        }
    )?;

    let mut injections = Vec::new();
    let mut hit = BTreeSet::new();
    for (index, plan) in scenario.faults.iter().enumerate() {
        let injection = inject_when_due(fleet, plan, index, started, deadline, &hit).await?;
        match (&injection.node, &injection.skipped) {
            (Some(node), _) => {
                hit.insert(node.clone());
                writeln!(
                    out,
                    "scenario {}: +{:.1} s fault {}: {}{} into {node}{}{}",
                    scenario.name,
                    started.elapsed().as_secs_f64(),
                    index + 1,
                    plan.fault,
                    if plan.persistent { " (persistent)" } else { "" },
                    injection.rank.map(|r| format!(" (rank {r})")).unwrap_or_default(),
                    injection.step.map(|s| format!(" at step {s}")).unwrap_or_default(),
                )?;
            }
            (None, Some(why)) => {
                writeln!(
                    out,
                    "scenario {}: fault {} not injected: {why}",
                    scenario.name,
                    index + 1
                )?;
            }
            (None, None) => {}
        }
        injections.push(injection);
    }

    let job = wait_for_job(fleet, deadline).await;
    if let Some(job) = &job {
        writeln!(
            out,
            "scenario {}: +{:.1} s job {} {} at step {}",
            scenario.name,
            started.elapsed().as_secs_f64(),
            job.job.id,
            job.job.state,
            job.step.map_or("-".to_owned(), |s| s.to_string())
        )?;
    }
    // The job may end while a repair is still under way (a node it no longer needs): wait for
    // them, so each fault's outcome is in the summary.
    let settle_deadline = Instant::now() + scenario.settle_timeout;
    while !settled(fleet, &injections) && Instant::now() < settle_deadline {
        tokio::time::sleep(POLL * 4).await;
    }
    let ended_ms = now_ms();
    let events = all_events(fleet)?;
    let final_line = fleet.final_line();

    let reference = match &job {
        Some(job) if scenario.compare_hash && job.job.state == JobState::Completed => {
            writeln!(
                out,
                "scenario {}: running the job's command again, uninterrupted, for the reference hash",
                scenario.name
            )?;
            let dir = fleet.state_dir().join("scenario").join(format!("reference-{}", now_ms()));
            // The reference gets at least the time the job itself took to train.
            let limit = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(ended_ms.saturating_sub(job.job.submitted_ms)))
                .max(Duration::from_secs(60));
            Some(
                uninterrupted_hash(&job.job.id, &job.job.spec, &dir, limit)
                    .await
                    .map_err(|err| err.to_string()),
            )
        }
        _ => None,
    };

    Ok(summarize(&Observed {
        scenario,
        started_ms,
        ended_ms,
        injections: &injections,
        events: &events,
        job: job.as_ref(),
        weights_sha256: final_line.map(|l| l.weights_sha256),
        reference,
    }))
}

/// Waits for `plan`'s trigger and a node to put it in, and writes the fault. A fault that cannot
/// come due (the job ended first, the scenario's time ran out) is returned as skipped.
async fn inject_when_due(
    fleet: &Fleet,
    plan: &FaultPlan,
    index: usize,
    started: Instant,
    deadline: Instant,
    hit: &BTreeSet<String>,
) -> Result<Injection, ScenarioError> {
    let skipped = |why: String| Injection {
        index,
        node: None,
        rank: None,
        at_ms: None,
        step: None,
        skipped: Some(why),
    };
    if let NodeTarget::Named(node) = &plan.node
        && !fleet.nodes().iter().any(|n| &n.info.name == node)
    {
        return Err(ScenarioError::Target {
            index: index + 1,
            fault: plan.fault.to_string(),
            message: format!("{node} is not a node of this fleet"),
        });
    }
    let mut waiting_for = String::from("its trigger");
    loop {
        let job = fleet.job();
        if let Some(job) = &job
            && job.job.state.is_final()
        {
            return Ok(skipped(format!(
                "the job ended ({}) at step {} while the fault waited for {waiting_for}",
                job.job.state,
                job.step.map_or("-".to_owned(), |s| s.to_string())
            )));
        }
        if Instant::now() >= deadline {
            return Ok(skipped(format!(
                "the scenario's timeout passed while the fault waited for {waiting_for}"
            )));
        }
        // Starting counts: the attempt's nodes are known, and its ranks step before every one of
        // them is reported running.
        let running =
            job.as_ref().filter(|j| matches!(j.job.state, JobState::Starting | JobState::Running));
        let due = match (plan.at_step, plan.at) {
            (Some(step), _) => {
                waiting_for = format!("step {step}");
                // The current attempt's own progress, past its first step: a restarted job shows
                // its previous attempt's step until then, and a fault before the resumed job's
                // first step would leave that resume unmeasured.
                running
                    .and_then(|j| j.job.latest_progress())
                    .is_some_and(|p| p.step >= step && p.step > p.start_step)
            }
            (None, Some(at)) => {
                waiting_for = format!("+{}", humantime::format_duration(at));
                started.elapsed() >= at
            }
            (None, None) => true,
        };
        if due {
            match resolve(fleet, &plan.node, job.as_ref(), hit) {
                Ok((node, rank)) => {
                    let at_ms = now_ms();
                    let step = job.as_ref().and_then(|j| j.step);
                    fleet.inject(&node, &plan.fault, plan.persistent).map_err(|source| {
                        ScenarioError::Inject {
                            index: index + 1,
                            fault: plan.fault.to_string(),
                            node: node.clone(),
                            source,
                        }
                    })?;
                    return Ok(Injection {
                        index,
                        node: Some(node),
                        rank,
                        at_ms: Some(at_ms),
                        step,
                        skipped: None,
                    });
                }
                Err(why) => waiting_for = why,
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The node `target` names now, and its rank in the job; or what it waits for.
fn resolve(
    fleet: &Fleet,
    target: &NodeTarget,
    job: Option<&JobView>,
    hit: &BTreeSet<String>,
) -> Result<(String, Option<u32>), String> {
    let running = job.filter(|j| matches!(j.job.state, JobState::Starting | JobState::Running));
    let rank_of = |node: &str| {
        running.and_then(|j| j.job.nodes.iter().position(|n| n == node)).map(|r| r as u32)
    };
    match target {
        NodeTarget::Named(node) => Ok((node.clone(), rank_of(node))),
        NodeTarget::Rank(rank) => {
            let job = running.ok_or_else(|| "the job to run".to_owned())?;
            let node =
                job.job.nodes.get(*rank as usize).ok_or_else(|| {
                    format!("a rank {rank} (the job has {})", job.job.nodes.len())
                })?;
            Ok((node.clone(), Some(*rank)))
        }
        NodeTarget::AnyHealthy => {
            let job = running.ok_or_else(|| "the job to run".to_owned())?;
            let now = now_ms();
            let nodes = fleet.nodes();
            job.job
                .nodes
                .iter()
                .enumerate()
                .find(|(_, name)| {
                    let agent_runs = nodes.iter().any(|n| {
                        &n.info.name == *name
                            && n.info.role == Role::Worker
                            && n.info.agent == AgentState::Running
                    });
                    let healthy = fleet.engine().node(name).is_some_and(|r| {
                        r.state == NodeState::Healthy
                            && !r.findings.iter().any(|t| t.finding.status == Status::Fail)
                            && r.workflow.is_none()
                            && r.cooldown_until_ms <= now
                    });
                    agent_runs && healthy && !hit.contains(*name)
                })
                .map(|(rank, name)| (name.clone(), Some(rank as u32)))
                .ok_or_else(|| {
                    "a healthy node of the job, not hit before and out of cooldown".to_owned()
                })
        }
    }
}

/// Waits for the job to end or `deadline`; the job as it stands then.
async fn wait_for_job(fleet: &Fleet, deadline: Instant) -> Option<JobView> {
    loop {
        let job = fleet.job();
        if job.as_ref().is_none_or(|j| j.job.state.is_final()) || Instant::now() >= deadline {
            return job;
        }
        tokio::time::sleep(POLL * 4).await;
    }
}

/// Every node a fault went to is done with its repair, or the breaker holds every repair. A
/// node fleetmend drained is not done: the ladder goes on from there once its drain window
/// passed (unless a person drained it).
fn settled(fleet: &Fleet, injections: &[Injection]) -> bool {
    if fleet.engine().breaker().open {
        return true;
    }
    injections.iter().filter_map(|i| i.node.as_deref()).all(|node| {
        fleet.engine().node(node).is_none_or(|record| {
            record.workflow.is_none()
                && (record.state != NodeState::Drained || record.drained_by_person)
                && !matches!(
                    record.state,
                    NodeState::Suspect
                        | NodeState::Draining
                        | NodeState::Repairing
                        | NodeState::Validating
                )
        })
    })
}

/// The whole event log, oldest first.
fn all_events(fleet: &Fleet) -> Result<Vec<Event>, ScenarioError> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = fleet.events(after, EVENT_PAGE).map_err(ScenarioError::Events)?;
        let Some(last) = page.last() else { break };
        after = last.id;
        let full = page.len() == EVENT_PAGE;
        events.extend(page);
        if !full {
            break;
        }
    }
    Ok(events)
}
