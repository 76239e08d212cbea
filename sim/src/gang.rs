//! The gang scheduler (`job.scheduler = "gang"`, the default): the repairer's `Scheduler` port
//! for a fleet whose jobs move each attempt's ranks as one.
//!
//! The repairer's engine, policy, workflows and guard rails run as they do under `queue`; what
//! changes is who schedules the ranks. Under `queue` the embedded job queue launches, signals and
//! stops every one of a 2,032-node job's ranks through its node's agent, one command and one
//! report each: a restart is ~16,000 events and a save of the job's document per report, and 54
//! days of 2,048 nodes take ~40 s. Here a restart is a few events: the world (`world/gang.rs`)
//! works out when the slowest node's agent would have taken each command (its heartbeat phase)
//! and moves the attempt on then, following the queue's own rules: placement by the queue's
//! [`placement::place`], a stop asking for a checkpoint and waiting `checkpoint_grace` (or for the
//! checkpoint), SIGTERM, SIGKILL after `stop_grace`, a rank lost when its node turns unusable,
//! hot spares kept to `spare_pool` and taken by a job short of nodes.
//!
//! This type holds what the engine reads and asks for: the drains, which job has a live rank on
//! which node (by slot), and the checkpoint and requeue requests, which the world carries out after the
//! engine's tasks settle (as it does the provider's calls).
//!
//! [`placement::place`]: fleetmend_repairer::queue::placement::place

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fleetmend_repairer::clock::{BoxFuture, SharedClock};
use fleetmend_repairer::policy::FleetShare;
use fleetmend_repairer::ports::FleetView;
use fleetmend_repairer::scheduler::{
    DRAIN_REASON_PREFIX, JobRef, SPARE_REASON, Scheduler, SchedulerError, UndrainOutcome, is_spare,
};

const NAME: &str = "gang";

/// A request of the repairer's workflows, carried out by the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// SIGUSR1 to the job's ranks: write a checkpoint.
    Checkpoint { job: String, at_ms: u64 },
    /// Stop the job's attempt (after the checkpoint asked for) and requeue it.
    Requeue { job: String },
    /// A node went back to placement: a waiting job may fit now.
    Undrained,
}

/// What the scheduler knows: drains, which job has a live rank in which slot of the fleet, and
/// the requests not carried out yet. Nodes are kept by slot (the place in the fleet a node and
/// its replacement take in turn), so moving a 2,000-rank attempt touches integers, not names.
#[derive(Debug, Default)]
pub struct Book {
    /// Drained nodes and their reasons (fleetmend's, an admin's, a hot spare's).
    drained: BTreeMap<String, String>,
    /// The same drains by slot (those of nodes in a slot now): whether each holds a hot spare.
    drained_slots: BTreeMap<u32, bool>,
    /// Slot → the node in it now.
    pub names: Vec<String>,
    /// Node → its slot (every node in the fleet now), hashed fast: placement looks up each
    /// node that is not plain healthy and idle.
    pub slot_of: HashMap<String, u32, foldhash::fast::FixedState>,
    /// Slot → the job (its index in `jobs`) with a live rank there.
    pub holder: Vec<Option<usize>>,
    /// The jobs in the order they were submitted: id, and the slots of the attempt, rank i in
    /// the i-th (empty while it waits).
    pub jobs: Vec<(String, Vec<u32>)>,
    requests: Vec<Request>,
}

impl Book {
    /// The hot spares held now.
    pub fn spares(&self) -> usize {
        self.drained.values().filter(|r| is_spare(r)).count()
    }

    /// `node`'s drain, if it is drained.
    pub fn drain_of(&self, node: &str) -> Option<&str> {
        self.drained.get(node).map(String::as_str)
    }

    /// The drained nodes in a slot now, by slot, and whether each is a hot spare.
    pub fn drained_slots(&self) -> impl Iterator<Item = (u32, bool)> + '_ {
        self.drained_slots.iter().map(|(slot, spare)| (*slot, *spare))
    }

    /// Drains `node` for `reason` (over any drain it had).
    pub fn set_drain(&mut self, node: &str, reason: &str) {
        if let Some(slot) = self.slot(node) {
            self.drained_slots.insert(slot, is_spare(reason));
        }
        self.drained.insert(node.to_owned(), reason.to_owned());
    }

    /// Lifts `node`'s drain.
    pub fn lift_drain(&mut self, node: &str) {
        if let Some(slot) = self.slot(node) {
            self.drained_slots.remove(&slot);
        }
        self.drained.remove(node);
    }

    /// `node`'s slot, if it is the node in it now.
    pub fn slot(&self, node: &str) -> Option<u32> {
        let slot = *self.slot_of.get(node)?;
        (self.names.get(slot as usize)? == node).then_some(slot)
    }

    /// A node joins `slot` (the fleet's first nodes, or a replacement).
    pub fn join(&mut self, slot: u32, node: &str) {
        let at = slot as usize;
        if self.names.len() <= at {
            self.names.resize(at + 1, String::new());
            self.holder.resize(at + 1, None);
        }
        // The node it replaces left the fleet, and with it the scheduler's drain of it.
        let left = self.names[at].clone();
        if !left.is_empty() {
            self.lift_drain(&left);
            self.slot_of.remove(&left);
        }
        self.names[at] = node.to_owned();
        self.slot_of.insert(node.to_owned(), slot);
    }

    /// The index of job `id`.
    pub fn job_index(&self, id: &str) -> Option<usize> {
        self.jobs.iter().position(|(job, _)| job == id)
    }
}

/// The repairer's scheduler port over the [`Book`].
pub struct GangScheduler {
    clock: SharedClock,
    fleet: Arc<dyn FleetView>,
    spare_pool: FleetShare,
    book: Mutex<Book>,
}

impl std::fmt::Debug for GangScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GangScheduler").finish_non_exhaustive()
    }
}

impl GangScheduler {
    pub fn new(
        clock: SharedClock,
        fleet: Arc<dyn FleetView>,
        spare_pool: FleetShare,
    ) -> Arc<GangScheduler> {
        Arc::new(GangScheduler { clock, fleet, spare_pool, book: Mutex::new(Book::default()) })
    }

    pub fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The requests made since the last look, oldest first.
    pub fn take(&self) -> Vec<Request> {
        std::mem::take(&mut self.lock().requests)
    }

    fn known(&self, job: &str) -> Result<(), SchedulerError> {
        if self.lock().job_index(job).is_some() {
            Ok(())
        } else {
            Err(SchedulerError::UnknownJob { scheduler: NAME, job: job.to_owned() })
        }
    }
}

impl Scheduler for GangScheduler {
    fn name(&self) -> &'static str {
        NAME
    }

    /// As the embedded queue's drain: an admin's drain stays theirs, a hot spare's is taken over.
    fn drain<'a>(
        &'a self,
        node: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            let mut book = self.lock();
            let drain = book.drain_of(node);
            if drain.is_none_or(is_spare) {
                book.set_drain(node, reason);
            }
            Ok(())
        })
    }

    /// As the embedded queue's undrain: a repaired node rejoins the hot spares while fewer than
    /// `spare_pool` are held, else it goes back to work.
    fn undrain<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<UndrainOutcome, SchedulerError>> {
        Box::pin(async move {
            let pool = self.spare_pool.of(self.fleet.members()) as usize;
            let mut book = self.lock();
            let outcome = match book.drain_of(node).map(str::to_owned) {
                None => UndrainOutcome::NotDrained,
                Some(reason) if !reason.starts_with(DRAIN_REASON_PREFIX) => {
                    UndrainOutcome::DrainedByOther(reason)
                }
                Some(reason) => {
                    if !is_spare(&reason) && book.spares() < pool {
                        let spare = format!("{SPARE_REASON}: rejoined the pool after its repair");
                        book.set_drain(node, &spare);
                    } else {
                        book.lift_drain(node);
                    }
                    book.requests.push(Request::Undrained);
                    UndrainOutcome::Undrained
                }
            };
            Ok(outcome)
        })
    }

    fn jobs_on<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Vec<JobRef>, SchedulerError>> {
        Box::pin(async move {
            let book = self.lock();
            let held = book.slot(node).and_then(|slot| book.holder[slot as usize]);
            Ok(held
                .and_then(|index| book.jobs.get(index))
                .map(|(id, slots)| JobRef {
                    id: id.clone(),
                    nodes: slots.iter().map(|s| book.names[*s as usize].clone()).collect(),
                })
                .into_iter()
                .collect())
        })
    }

    fn checkpoint<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            self.known(job)?;
            let at_ms = self.clock.now_ms();
            self.lock().requests.push(Request::Checkpoint { job: job.to_owned(), at_ms });
            Ok(())
        })
    }

    fn requeue<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<(), SchedulerError>> {
        Box::pin(async move {
            self.known(job)?;
            self.lock().requests.push(Request::Requeue { job: job.to_owned() });
            Ok(())
        })
    }
}
