//! The fleetmend runtime: what runs a training job and lets it survive losing a node.
//!
//! - [`checkpoint`]: the checkpoint protocol any job can speak (`docs/checkpoint-protocol.md`):
//!   the environment each rank is started with ([`checkpoint::ProtocolEnv`]), writing a checkpoint
//!   directory that appears atomically and complete ([`checkpoint::CheckpointWriter`]), finding the
//!   newest one that verifies ([`checkpoint::newest_valid`]) and keeping the last few
//!   ([`checkpoint::prune`]).
//! - [`collective`]: ranks meet through `MASTER_ADDR`/`MASTER_PORT` and average gradients with a
//!   deterministic ring all-reduce over TCP ([`collective::Communicator`]); a dead or silent peer
//!   fails every rank within the collective timeout, naming it.
//!
//! - `probe` (feature `trainer`): one rank of the `allreduce` probe (`fleetmend allreduce`), which
//!   measures the ring's bus bandwidth between nodes for the repairer.
//! - `train` (feature `trainer`): the bundled data-parallel trainer (`fleetmend train`), built on
//!   both. The bundled job queue that places its ranks lives in the repairer.

pub mod checkpoint;
pub mod collective;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "trainer")]
pub mod probe;
#[cfg(feature = "trainer")]
pub mod train;
