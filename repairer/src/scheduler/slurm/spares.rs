//! Hot spares on Slurm: healthy nodes held out of work, drained with fleetmend's spare reason
//! ([`SPARE_REASON`]), and resumed at once for a pending job that is short of nodes — instead of
//! the job waiting for the repair of the node it lost. With `[slurm] spare_pool = N` the pool is
//! refilled from idle nodes fleetmend holds healthy (a repaired node rejoins it) while no job
//! waits for nodes.
//!
//! One pass every `spare_poll`: `sinfo` for the nodes, and `squeue` for the pending jobs only when
//! there are spares to hand out. Every release and hold is written to the audit trail first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{NAME, SlurmScheduler, listing_error};
use crate::clock::SharedClock;
use crate::model::{Actor, Event, EventKind, NodeState, Severity};
use crate::nodes::Nodes;
use crate::ports::EventLog;
use crate::scheduler::{SPARE_REASON, SchedulerError, is_spare};

/// Pending-job reasons that mean "not enough nodes": a spare helps these. (`squeue %r` prints
/// `Nodes required for job are DOWN, DRAINED or reserved ...` with spaces, `scontrol` with `_`.)
const SHORT_OF_NODES: &[&str] =
    &["Resources", "ReqNodeNotAvail", "Nodes required for job", "Nodes_required_for_job"];

/// A node as `sinfo -N -o '%N|%T|%E'` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLine {
    pub name: String,
    /// Long state, lower case: `idle`, `drained`, `allocated`, `mixed`, `down*`...
    pub state: String,
    pub reason: String,
}

impl NodeLine {
    /// Drained with fleetmend's spare reason.
    pub fn is_spare(&self) -> bool {
        matches!(self.state.as_str(), "drained" | "draining" | "drain") && is_spare(&self.reason)
    }

    fn is_idle(&self) -> bool {
        self.state == "idle"
    }
}

/// Parses `sinfo -h -N -o '%N|%T|%E'`; a node in several partitions is listed once.
pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    let mut nodes: BTreeMap<String, NodeLine> = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.trim().splitn(3, '|');
        let (Some(name), Some(state)) = (fields.next(), fields.next()) else { continue };
        if name.is_empty() {
            continue;
        }
        let reason = fields.next().unwrap_or_default().trim();
        let reason = if reason == "none" { "" } else { reason };
        nodes.entry(name.to_owned()).or_insert_with(|| NodeLine {
            name: name.to_owned(),
            state: state.trim().to_lowercase(),
            reason: reason.to_owned(),
        });
    }
    nodes.into_values().collect()
}

/// A pending job as `squeue -h -t PD -o '%i|%D|%r'` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    pub id: String,
    pub nodes: usize,
    pub reason: String,
}

/// Parses `squeue -h -t PD -o '%i|%D|%r'`, in squeue's order (by priority).
pub fn parse_pending(text: &str) -> Vec<PendingJob> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.trim().splitn(3, '|');
            let id = fields.next()?.trim().to_owned();
            let nodes = fields.next()?.trim().parse().ok()?;
            let reason = fields.next().unwrap_or_default().trim().to_owned();
            Some(PendingJob { id, nodes, reason })
        })
        .collect()
}

/// What one pass decides: the spares to resume for a job, or the idle nodes to hold as spares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SparePlan {
    /// `(spare, job)`: resume the spare for the job.
    pub release: Vec<(String, String)>,
    /// Idle nodes to drain as spares.
    pub hold: Vec<String>,
    /// Why, in words.
    pub why: String,
}

/// The first pending job short of nodes takes as many spares as it lacks; with none short, idle
/// `healthy` nodes refill the pool to `pool`. A job is short of nodes when Slurm's reason says so
/// or when fleetmend `requeued` it (it lost a node; Slurm gives the reason only after its next
/// scheduling pass, seconds later), and it needs more nodes than are idle.
pub fn plan(
    nodes: &[NodeLine],
    pending: &[PendingJob],
    requeued: &BTreeSet<String>,
    pool: usize,
    healthy: impl Fn(&str) -> bool,
) -> SparePlan {
    let spares: Vec<&NodeLine> = nodes.iter().filter(|n| n.is_spare()).collect();
    let idle = nodes.iter().filter(|n| n.is_idle()).count();
    let short = pending.iter().find(|job| {
        job.nodes > idle
            && (requeued.contains(&job.id)
                || SHORT_OF_NODES.iter().any(|r| job.reason.starts_with(r)))
    });
    if let Some(job) = short {
        let lacking = job.nodes - idle;
        let release: Vec<(String, String)> =
            spares.iter().take(lacking).map(|s| (s.name.clone(), job.id.clone())).collect();
        let why = format!(
            "Slurm job {} waits for {} node(s) with {idle} idle ({}): {} spare(s) released",
            job.id,
            job.nodes,
            job.reason,
            release.len()
        );
        return SparePlan { release, hold: Vec::new(), why };
    }
    if !pending.is_empty() || spares.len() >= pool {
        return SparePlan::default();
    }
    let hold: Vec<String> = nodes
        .iter()
        .filter(|n| n.is_idle() && healthy(&n.name))
        .take(pool - spares.len())
        .map(|n| n.name.clone())
        .collect();
    let why = format!("held out as a hot spare ({} of spare_pool {pool})", spares.len() + 1);
    SparePlan { release: Vec::new(), hold, why }
}

/// Keeps the spares of a Slurm cluster (see the module's documentation).
#[derive(Clone)]
pub struct SlurmSpares {
    pub scheduler: Arc<SlurmScheduler>,
    pub events: Arc<EventLog>,
    pub nodes: Arc<Nodes>,
    pub clock: SharedClock,
}

impl std::fmt::Debug for SlurmSpares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlurmSpares").field("scheduler", &self.scheduler).finish_non_exhaustive()
    }
}

impl SlurmSpares {
    /// Runs a pass every `spare_poll` until the task is dropped.
    pub async fn run(self) {
        let every = self.scheduler.config().spare_poll;
        let mut last_error = String::new();
        loop {
            match self.pass().await {
                Ok(()) => last_error.clear(),
                Err(err) => {
                    let text = err.to_string();
                    if text != last_error {
                        tracing::warn!(error = %text, "the Slurm spare keeper's pass failed");
                        last_error = text;
                    }
                }
            }
            self.clock.sleep(every).await;
        }
    }

    /// One pass: reads Slurm, plans, writes each step's event, then carries it out.
    pub async fn pass(&self) -> Result<(), SchedulerError> {
        let scheduler = &self.scheduler;
        let operation = "spares";
        let slurm = scheduler.commands();
        let listing = slurm.node_states(operation).await.map_err(listing_error(operation))?;
        let nodes = parse_nodes(&listing);
        let pool = scheduler.config().spare_pool as usize;
        if !nodes.iter().any(NodeLine::is_spare) && pool == 0 {
            return Ok(());
        }
        let pending = slurm.pending_jobs(operation).await.map_err(listing_error(operation))?;
        let pending = parse_pending(&pending);
        let healthy = |slurm_name: &str| {
            let name = scheduler.fleetmend_name(slurm_name);
            self.nodes.lock().get(name).is_some_and(|n| {
                n.state == NodeState::Healthy && n.workflow.is_none() && !n.unknown
            })
        };
        let now = self.clock.now_ms();
        let plan = plan(&nodes, &pending, &scheduler.recently_requeued(now), pool, healthy);
        for (spare, job) in &plan.release {
            let node = scheduler.fleetmend_name(spare).to_owned();
            let reason = format!("spare {node} put to work: {}", plan.why);
            self.record(EventKind::SpareTaken, &node, reason, now)?;
            tracing::info!(node, job, "releasing a hot spare for a Slurm job short of nodes");
            slurm.resume(operation, spare).await.map_err(listing_error(operation))?;
        }
        for idle in &plan.hold {
            let node = scheduler.fleetmend_name(idle).to_owned();
            self.record(EventKind::SpareHeld, &node, plan.why.clone(), now)?;
            slurm.drain(operation, idle, SPARE_REASON).await.map_err(listing_error(operation))?;
        }
        Ok(())
    }

    fn record(
        &self,
        kind: EventKind,
        node: &str,
        reason: String,
        now: u64,
    ) -> Result<(), SchedulerError> {
        let event = Event::new(kind, Severity::Info, Some(node), Actor::repairer(), reason, now);
        self.events.record(&event).map(|_| ()).map_err(|err| SchedulerError::Failed {
            scheduler: NAME,
            operation: "spares",
            message: format!("writing the event failed, nothing done: {err}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<NodeLine> {
        parse_nodes(
            "node1|allocated|none\nnode2|drained|fleetmend: nic down\nnode3|allocated|none\n\
             node4|drained|fleetmend: spare: standby of fleetmend up\nnode5|idle|none\n\
             node5|idle|none\nnode6|drained|maintenance\n",
        )
    }

    #[test]
    fn sinfo_and_squeue_lines_are_read() {
        let nodes = nodes();
        assert_eq!(nodes.len(), 6, "a node in two partitions is listed once");
        assert!(nodes[3].is_spare() && !nodes[1].is_spare() && !nodes[5].is_spare());
        assert!(nodes[4].is_idle());
        let pending = parse_pending(
            "12|3|Nodes required for job are DOWN, DRAINED or reserved for jobs in higher \
             priority partitions\n13|1|Priority\nbad line\n",
        );
        assert_eq!(pending.len(), 2);
        assert_eq!((pending[0].id.as_str(), pending[0].nodes), ("12", 3));
    }

    #[test]
    fn a_job_short_of_nodes_takes_as_many_spares_as_it_lacks() {
        let pending = parse_pending(
            "12|3|Nodes required for job are DOWN, DRAINED or reserved for jobs in higher \
             priority partitions\n",
        );
        let plan = plan(&nodes(), &pending, &BTreeSet::new(), 1, |_| true);
        assert_eq!(plan.release, [("node4".to_owned(), "12".to_owned())], "1 idle + 1 spare");
        assert!(plan.hold.is_empty());
        // A job waiting for another reason (a dependency, its begin time) takes none.
        let waiting = parse_pending("12|3|Dependency\n");
        assert_eq!(plan_release(&waiting, &[]), 0);
        // Enough idle nodes: none.
        assert_eq!(plan_release(&parse_pending("12|1|Resources\n"), &[]), 0);
    }

    #[test]
    fn a_job_fleetmend_requeued_takes_a_spare_before_slurm_gives_its_reason() {
        // Just requeued: Slurm's scheduler has not looked at it yet.
        let pending = parse_pending("12|3|None\n");
        assert_eq!(plan_release(&pending, &[]), 0, "not known to be short");
        assert_eq!(plan_release(&pending, &["12"]), 1, "it lost a node to a drain");
        assert_eq!(plan_release(&parse_pending("12|1|None\n"), &["12"]), 0, "1 idle is enough");
    }

    fn plan_release(pending: &[PendingJob], requeued: &[&str]) -> usize {
        let requeued: BTreeSet<String> = requeued.iter().map(|j| (*j).to_owned()).collect();
        plan(&nodes(), pending, &requeued, 1, |_| true).release.len()
    }

    #[test]
    fn the_pool_is_refilled_from_healthy_idle_nodes_only_while_no_job_waits() {
        let mut nodes = nodes();
        nodes.retain(|n| n.name != "node4");
        let plan_for = |pending: &[PendingJob], healthy: bool| {
            plan(&nodes, pending, &BTreeSet::new(), 1, |_| healthy)
        };
        assert_eq!(plan_for(&[], true).hold, ["node5"]);
        assert!(plan_for(&[], false).hold.is_empty(), "a node fleetmend does not hold healthy");
        let waiting = parse_pending("12|9|Priority\n");
        assert!(plan_for(&waiting, true).hold.is_empty(), "a job waits: nothing held back");
    }
}
