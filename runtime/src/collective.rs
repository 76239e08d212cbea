//! Rendezvous and deterministic collectives over TCP, for the data-parallel trainer's ranks.
//!
//! Ranks meet through rank 0 at `MASTER_ADDR:MASTER_PORT` (torchrun's variables), learn each
//! other's ring address, and connect into a ring: each rank writes only to its successor (rank + 1)
//! and reads only from its predecessor (rank − 1). On that ring a [`Communicator`] runs
//! [`all_reduce_sum`](Communicator::all_reduce_sum) and
//! [`all_reduce_mean`](Communicator::all_reduce_mean) (reduce-scatter, then all-gather, in frames
//! of at most [`CollectiveConfig::chunk_bytes`]), [`barrier`](Communicator::barrier) and
//! [`broadcast`](Communicator::broadcast).
//!
//! # Determinism
//!
//! The buffer is cut into `world_size` contiguous segments ([`ring_segments`]). Segment `c` is
//! summed around the ring starting at rank `c`: `((x[c] + x[c+1]) + x[c+2]) + … + x[c−1]` (rank
//! numbers modulo the world size), one rank per reduce-scatter step; the all-gather then copies the
//! finished segment to every rank. So every element is summed in one order that depends only on the buffer
//! length and the world size — not on timing, frame size or the rank asking — and every rank ends
//! with the same bits. The mean divides that sum by the world size.
//!
//! # Failure
//!
//! Every read and write has a deadline ([`CollectiveConfig::collective_timeout`]). A peer that
//! closes its connection fails the operation at once; one that makes no progress for the timeout
//! fails it after the timeout. While a rank waits on its predecessor it sends keepalive frames to
//! its successor, so only the direct neighbour of a silent rank times out. A rank that fails sends
//! its successor an abort frame naming the rank it blames, and keeps draining its predecessor for a
//! while, so the failure travels the ring and every rank's error names the same culprit
//! ([`CollectiveError::suspect_rank`]). A failed communicator refuses further operations: the
//! trainer exits and the job resumes from its checkpoint with a fresh rendezvous.
//!
//! # Parts
//!
//! - `membership`: who this rank is, from the launcher's environment ([`Membership`]).
//! - `rendezvous`: the meeting through rank 0 and the ring connections.
//! - `link`: one ring connection, sending and receiving frames with a deadline (`wire` has the
//!   bytes of a frame).
//! - `ops`: the all-reduce, barrier and broadcast on the ring, and how a buffer is cut
//!   ([`ring_segments`]).
//! - `watch`: keepalives, and the [`CollectiveWatch`] a heartbeat reads.
//! - `failure`: the errors, and which rank each one blames.
//! - here: the settings ([`CollectiveConfig`]) and the [`Communicator`] that runs each operation
//!   and retires the ring after a failure.

mod failure;
#[doc(hidden)]
pub mod fuzzing;
mod link;
mod membership;
mod ops;
mod rendezvous;
mod watch;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use failure::abort_notice;
pub use failure::{CollectiveError, CollectiveFailure, Op, RendezvousError, RingLink};
use link::{Link, Ring};
// For the fuzz targets (`fuzzing`), which drive a receiving link directly.
use link::RecvFailure;
pub use membership::{Membership, MembershipError};
pub use ops::ring_segments;
use ops::{OpContext, StepError, ring_all_reduce, ring_barrier, ring_broadcast};
pub use watch::CollectiveWatch;
use watch::keepalive_every;

/// Default [`CollectiveConfig::chunk_bytes`]: large enough that per-frame costs vanish next to the
/// copy, small enough that the next rank starts on a segment before all of it arrived.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

/// Largest allowed [`CollectiveConfig::chunk_bytes`].
pub const MAX_CHUNK_BYTES: usize = 256 << 20;

/// Timeouts and sizes of the rendezvous and the collectives.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CollectiveConfig {
    /// How long ranks wait for each other at the rendezvous, from when each starts. Rank 0 gives up
    /// after it and names the ranks that never came; the others retry reaching rank 0 until then.
    #[serde(with = "humantime_serde")]
    pub rendezvous_timeout: Duration,
    /// How long a collective waits for a peer to make progress (send the next frame, or take the
    /// one being sent) before failing the operation and naming the peer.
    #[serde(with = "humantime_serde")]
    pub collective_timeout: Duration,
    /// Largest payload of one frame, in bytes: a multiple of 4 (whole `f32`s).
    pub chunk_bytes: usize,
    /// IP the rendezvous (rank 0) and ring listeners bind to. Default: rank 0 binds the loopback
    /// address when `MASTER_ADDR` is one and every address otherwise; other ranks bind the address
    /// they reached rank 0 from.
    pub bind_ip: Option<std::net::IpAddr>,
    /// IP peers connect to for this rank's ring listener. Default: for rank 0 the `MASTER_ADDR`
    /// address, for the others the address they reached rank 0 from.
    pub advertise_ip: Option<std::net::IpAddr>,
    /// Port of this rank's ring listener; 0 lets the system pick a free one.
    pub ring_port: u16,
}

impl Default for CollectiveConfig {
    fn default() -> Self {
        CollectiveConfig {
            rendezvous_timeout: Duration::from_secs(300),
            collective_timeout: Duration::from_secs(30),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            bind_ip: None,
            advertise_ip: None,
            ring_port: 0,
        }
    }
}

impl CollectiveConfig {
    /// Every problem, each naming its field under `section`; empty when usable.
    pub fn validate(&self, section: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.rendezvous_timeout.is_zero() {
            problems.push(format!("{section}.rendezvous_timeout: must be more than 0"));
        }
        if self.collective_timeout < Duration::from_millis(10) {
            problems.push(format!("{section}.collective_timeout: must be at least 10ms"));
        }
        if self.chunk_bytes < 4
            || !self.chunk_bytes.is_multiple_of(4)
            || self.chunk_bytes > MAX_CHUNK_BYTES
        {
            problems.push(format!(
                "{section}.chunk_bytes: {} is not a multiple of 4 between 4 and {MAX_CHUNK_BYTES}",
                self.chunk_bytes
            ));
        }
        problems
    }
}

/// A rank's connection to the others: rendezvous done, ring connected.
#[derive(Debug)]
pub struct Communicator {
    rank: usize,
    world_size: usize,
    /// `None` for a world of one rank, or after a failure.
    ring: Option<Ring>,
    timeout: Duration,
    chunk_bytes: usize,
    next_seq: u64,
    /// The first failure, once there was one.
    broken: Option<String>,
    /// Shared with the predecessor link; `None` for a world of one rank.
    watch: Option<Arc<CollectiveWatch>>,
}

impl Communicator {
    /// Meets the other ranks, connects the ring and checks it with a barrier. Blocks until every
    /// rank arrived or [`CollectiveConfig::rendezvous_timeout`] passed.
    pub fn connect(
        membership: &Membership,
        config: &CollectiveConfig,
    ) -> Result<Communicator, RendezvousError> {
        let mut problems = membership.problems();
        problems.extend(config.validate("collective"));
        if !problems.is_empty() {
            return Err(RendezvousError::InvalidSetup { problems });
        }
        let world = membership.world_size;
        let predecessor = (membership.rank + world - 1) % world;
        let keepalive_every = keepalive_every(config.collective_timeout);
        let watch = Arc::new(CollectiveWatch::new(predecessor, keepalive_every));
        let ring = rendezvous::connect_ring(membership, config)?.map(|streams| Ring {
            successor: Link::new(streams.successor, (membership.rank + 1) % world),
            predecessor: Link::new(streams.predecessor, predecessor).watched(watch.clone()),
        });
        let watch = ring.as_ref().map(|_| watch);
        let mut communicator = Communicator {
            rank: membership.rank,
            world_size: world,
            ring,
            timeout: config.collective_timeout,
            chunk_bytes: config.chunk_bytes,
            next_seq: 0,
            broken: None,
            watch,
        };
        // Both ring connections exist on every rank once this passes: a ring that is broken
        // somewhere fails the rendezvous, not the first training step.
        communicator.barrier().map_err(RendezvousError::RingCheck)?;
        Ok(communicator)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// What this rank's collective waits for, for a heartbeat from another thread; `None` for a
    /// world of one rank.
    pub fn watch(&self) -> Option<Arc<CollectiveWatch>> {
        self.watch.clone()
    }

    /// Whether an earlier operation failed (every further one is refused).
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Replaces `values` on every rank with the element-wise sum over all ranks, in the fixed order
    /// of the module documentation. Every rank must pass a buffer of the same length.
    pub fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        self.run(Op::AllReduce, |ring, op| ring_all_reduce(ring, op, values))
    }

    /// [`all_reduce_sum`](Communicator::all_reduce_sum), then divided by the world size: the same
    /// bits on every rank.
    pub fn all_reduce_mean(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        self.all_reduce_sum(values)?;
        if self.world_size > 1 {
            let world = self.world_size as f32;
            values.iter_mut().for_each(|value| *value /= world);
        }
        Ok(())
    }

    /// Returns once every rank called it.
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.run(Op::Barrier, ring_barrier)
    }

    /// Copies `root`'s `bytes` into every rank's `bytes` (the same length on every rank), e.g. the
    /// step to resume from.
    pub fn broadcast(&mut self, root: usize, bytes: &mut [u8]) -> Result<(), CollectiveError> {
        if root >= self.world_size {
            return Err(CollectiveError {
                op: Op::Broadcast,
                seq: self.next_seq,
                rank: self.rank,
                failure: CollectiveFailure::InvalidRoot { root, world_size: self.world_size },
            });
        }
        self.run(Op::Broadcast, |ring, op| ring_broadcast(ring, op, root, bytes))
    }

    /// Runs one operation on the ring; on failure passes the word on and retires the ring.
    fn run(
        &mut self,
        op: Op,
        body: impl FnOnce(&mut Ring, &OpContext) -> Result<(), StepError>,
    ) -> Result<(), CollectiveError> {
        let seq = self.next_seq;
        if let Some(first_failure) = &self.broken {
            let failure = CollectiveFailure::Broken { first_failure: first_failure.clone() };
            return Err(CollectiveError { op, seq, rank: self.rank, failure });
        }
        self.next_seq += 1;
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        let context = OpContext {
            seq,
            rank: self.rank,
            world_size: self.world_size,
            timeout: self.timeout,
            chunk_bytes: self.chunk_bytes,
        };
        if let Some(watch) = &self.watch {
            watch.begin_op();
        }
        let outcome = body(ring, &context);
        if let Some(watch) = &self.watch {
            watch.end_op();
        }
        let Err(step) = outcome else {
            return Ok(());
        };
        let error = CollectiveError { op, seq, rank: self.rank, failure: step.failure };
        tracing::error!(%error, suspect = ?error.suspect_rank(), "collective operation failed");
        let notice = step.successor_usable.then(|| abort_notice(&error));
        self.broken = Some(error.to_string());
        if let Some(ring) = self.ring.take() {
            ring.abandon(notice, seq, self.timeout);
        }
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_names_every_bad_field() {
        let config = CollectiveConfig {
            rendezvous_timeout: Duration::ZERO,
            collective_timeout: Duration::ZERO,
            chunk_bytes: 6,
            ..CollectiveConfig::default()
        };
        let problems = config.validate("trainer.collective");
        assert_eq!(problems.len(), 3, "{problems:?}");
        for field in ["rendezvous_timeout", "collective_timeout", "chunk_bytes"] {
            assert!(problems.iter().any(|p| p.contains(&format!("trainer.collective.{field}"))));
        }
        assert!(CollectiveConfig::default().validate("c").is_empty());
    }

    #[test]
    fn config_reads_humantime_durations_and_refuses_unknown_fields() {
        let config: CollectiveConfig =
            serde_json::from_str(r#"{"collective_timeout": "2s", "chunk_bytes": 4096}"#).unwrap();
        assert_eq!(config.collective_timeout, Duration::from_secs(2));
        assert_eq!(config.rendezvous_timeout, CollectiveConfig::default().rendezvous_timeout);
        assert!(serde_json::from_str::<CollectiveConfig>(r#"{"timeout": "2s"}"#).is_err());
    }

    #[test]
    fn a_world_of_one_needs_no_network() {
        let membership = Membership {
            rank: 0,
            world_size: 1,
            master_addr: String::new(),
            master_port: 0,
            run_id: "solo#0".into(),
        };
        let mut communicator =
            Communicator::connect(&membership, &CollectiveConfig::default()).unwrap();
        let mut values = vec![1.5f32, -0.0, f32::NAN];
        communicator.all_reduce_mean(&mut values).unwrap();
        assert_eq!(values[0], 1.5);
        assert!(values[1].is_sign_negative() && values[2].is_nan());
        communicator.barrier().unwrap();
        let mut bytes = *b"step";
        communicator.broadcast(0, &mut bytes).unwrap();
        assert!(matches!(
            communicator.broadcast(1, &mut bytes).unwrap_err().failure,
            CollectiveFailure::InvalidRoot { root: 1, world_size: 1 }
        ));
    }
}
