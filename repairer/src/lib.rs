//! The fleetmend repairer: turns the agents' findings into repairs with no person in the loop,
//! behind guard rails that keep a bad day from getting worse.

pub mod access;
pub mod alerts;
pub mod allreduce;
pub mod api;
pub mod breaker;
pub mod client;
pub mod clock;
pub mod commands;
pub mod config;
pub mod engine;
pub mod exposition;
#[doc(hidden)]
pub mod fuzzing;
pub mod history;
pub mod identity;
pub mod inbound;
pub mod inventory;
pub mod leadership;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod nodes;
pub mod policy;
pub mod ports;
pub mod postgres_server;
pub mod provider;
pub mod queue;
pub mod scheduler;
pub mod service;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod workflow;
