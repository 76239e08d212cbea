//! `fleetmend simulate --replay FILE`: a failure history exported from a running repairer
//! (`fleetmend export-faults`, `GET /v1/history/faults`) struck again, fault by fault, instead of
//! the random failure stream, so the same month can be priced under another policy.
//!
//! How a recorded fault becomes a simulated one is [`crate::recorded`]'s, where the history made
//! ready to strike ([`Replay`]) lives: the settings carry it, and the run strikes it. The report
//! then folds the simulated repairer's audit trail the way the export folds the real one, and
//! compares the decisions per node with the recorded ones.

mod outcome;

pub use self::outcome::{Decided, LeftOut, NodeDecisions, ReplayOutcome, ReplayReport, simulate};
pub use crate::recorded::{
    LEAD, Replay, ReplayBasis, ReplayError, SETTLE, natural_order, simulated_finding,
};
