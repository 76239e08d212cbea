//! The fleetmend repairer: turns the agents' findings into repairs with no person in the loop,
//! behind guard rails that keep a bad day from getting worse.

pub mod alerts;
pub mod commands;
pub mod engine;
pub mod inbound;
pub mod model;
pub mod policy;
pub mod provider;
pub mod scheduler;
pub mod store;
pub mod workflow;
