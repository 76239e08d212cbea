//! The `allreduce` probe: two nodes run the bundled collective with each other and measure its bus
//! bandwidth, which the repairer compares with the fleet's (a node behind a slow link shows up
//! against its peers, whatever the fabric's absolute speed).

use serde::{Deserialize, Serialize};

/// The arguments of an `allreduce` command: this node's part in a two-node (or larger) ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllreduceProbe {
    /// Names this probe run, the same on every node of the ring (the ranks' run id).
    pub probe: String,
    /// Rank 0's node, where the ranks meet (`MASTER_ADDR`).
    pub master_addr: String,
    pub master_port: u16,
    pub rank: u32,
    pub world_size: u32,
    /// The nodes of the ring by rank, for messages.
    pub nodes: Vec<String>,
    /// Bytes of `f32` each rank reduces per operation.
    pub bytes: u64,
    /// Timed operations, after one warm-up.
    pub iterations: u32,
    /// The whole probe, rendezvous included, within this.
    pub timeout_ms: u64,
}

/// What one rank of an `allreduce` probe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllreduceMeasurement {
    /// Bytes of `f32` per rank per operation.
    pub bytes: u64,
    pub world_size: u32,
    /// Median seconds of one operation (the slowest rank's: each starts after a barrier).
    pub seconds: f64,
    /// Bus bandwidth in GB/s (10⁹ bytes): 2(n−1)/n × bytes / seconds, what each rank moved over
    /// its link (NCCL's definition).
    pub busbw_gbps: f64,
}
