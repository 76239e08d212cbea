//! `fleetmend up`: one machine runs a whole self-healing fleet — the repairer with its embedded
//! queue, simulated nodes (each a real agent process on its own fixture host tree), and a training
//! job — plus `fleetmend inject`, which writes real faults into a node's tree, and scripted chaos
//! scenarios that measure the loop end to end.

pub mod faults;
#[doc(hidden)]
pub mod fuzzing;
pub mod provider;
pub mod scenario;
pub mod tree;
pub mod up;
