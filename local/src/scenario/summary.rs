//! What a scenario measured: per fault, from the repairer's event log and the queue's attempt
//! records (`fault.rs`); over the faults, the percentiles the targets are stated in and
//! what went wrong; for people, [`Summary::render`] (`render.rs`).

mod fault;
mod render;

use fleetmend_proto::stats::{nearest_rank, sorted_finite};
use fleetmend_repairer::model::Event;
use fleetmend_repairer::queue::{JobState, JobView};
use serde::{Deserialize, Serialize};

use super::{Expect, Scenario};
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
            fault::fault_summary(observed, injection, plan, next.unwrap_or(u64::MAX))
        })
        .collect();

    let detect = Stats::of(faults.iter().filter_map(|f| f.detect_s));
    let drain = Stats::of(faults.iter().filter_map(|f| f.drain_s));
    let resume = Stats::of(faults.iter().filter_map(|f| f.resume_s));
    let steps_lost_total = faults.iter().filter_map(|f| f.steps_lost).sum();
    let targets = targets(&faults, &drain, &resume);

    let job_state = observed.job.map(|j| j.job.state.to_string());
    let (reference_sha256, reference_error) = match &observed.reference {
        Some(Ok(hash)) => (Some(hash.clone()), None),
        Some(Err(err)) => (None, Some(err.clone())),
        None => (None, None),
    };
    let hash_matches = match (&observed.weights_sha256, &reference_sha256) {
        (Some(got), Some(want)) => Some(got == want),
        _ => None,
    };
    let problems =
        problems(observed, &faults, hash_matches, reference_error.as_deref(), job_state.is_some());
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

/// The performance targets and whether this run met them.
fn targets(faults: &[FaultSummary], drain: &Stats, resume: &Stats) -> Vec<Target> {
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
    targets
}

/// What went wrong: faults not injected, expectations not met, the job not completed, the
/// weights differing (when the scenario compares them).
fn problems(
    observed: &Observed<'_>,
    faults: &[FaultSummary],
    hash_matches: Option<bool>,
    reference_error: Option<&str>,
    has_job: bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for fault in faults {
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
                render::describe_repair(fault),
            ));
        }
    }
    match observed.job {
        Some(job) if job.job.state == JobState::Completed => {}
        Some(job) => problems.push(format!(
            "job {} did not complete: {} ({})",
            job.job.id, job.job.state, job.job.reason
        )),
        None => problems.push("the fleet runs no job".to_owned()),
    }
    if observed.scenario.compare_hash {
        match (hash_matches, reference_error) {
            (Some(true), _) => {}
            (Some(false), _) => problems
                .push("the job's final weights differ from the uninterrupted run's".to_owned()),
            (None, Some(err)) => problems.push(format!("no reference hash: {err}")),
            (None, None) if observed.weights_sha256.is_none() && has_job => {
                problems.push("the job's rank 0 log has no final weights hash".to_owned())
            }
            (None, None) => {}
        }
    }
    problems
}

#[cfg(test)]
mod tests {
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
}
