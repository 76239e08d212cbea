//! The fleetmend node agent: runs GPU, NIC, disk, kernel-log and host checks, exports them as
//! Prometheus metrics and reports findings to the repairer.

pub mod allreduce;
pub mod checks;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod evidence;
pub mod failover;
#[doc(hidden)]
pub mod fuzzing;
pub mod gpu;
pub mod metrics;
pub mod node;
pub mod ranks;
pub mod report;
pub mod runner;
pub mod server;
pub mod slurm_drain;
pub mod xid;
