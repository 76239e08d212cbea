//! The fleetmend repairer: turns the agents' findings into repairs with no person in the loop,
//! behind guard rails that keep a bad day from getting worse.

pub mod commands;
pub mod model;
pub mod provider;
pub mod scheduler;
pub mod store;
