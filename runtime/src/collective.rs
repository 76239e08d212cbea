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

#[doc(hidden)]
pub mod fuzzing;
mod rendezvous;
mod wire;

use std::fmt;
use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, SocketAddr};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::checkpoint::{EnvReader, Need, vars};
use wire::{AbortNotice, FrameHeader, FrameKind, LinkFailure, MAX_ABORT_PAYLOAD};

/// Default [`CollectiveConfig::chunk_bytes`]: large enough that per-frame costs vanish next to the
/// copy, small enough that the next rank starts on a segment before all of it arrived.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

/// Largest allowed [`CollectiveConfig::chunk_bytes`].
pub const MAX_CHUNK_BYTES: usize = 256 << 20;

/// Longest wait for sending an abort frame to a successor that is no longer reading.
const ABORT_SEND_LIMIT: Duration = Duration::from_secs(5);

/// Longest reason text carried in an abort frame.
const MAX_REASON_CHARS: usize = 4096;

/// Longest pause between keepalives while a rank waits on its predecessor, whatever the
/// collective timeout: a waiting rank's heartbeat tells a silent predecessor from a waiting one
/// within a few of them (see [`CollectiveWatch`]).
const MAX_KEEPALIVE_EVERY: Duration = Duration::from_secs(1);

/// Keepalive periods without a frame from the predecessor after which a waiting rank names it.
const SILENT_KEEPALIVES: u32 = 3;

/// What this rank's collective is doing, read by the progress heartbeat from another thread:
/// whether an operation is under way and when a frame (data or keepalive) last came from the
/// predecessor. A predecessor that itself waits sends keepalives; one that is computing, stopped
/// or hung sends nothing: it has not reached the collective.
#[derive(Debug)]
pub struct CollectiveWatch {
    epoch: Instant,
    predecessor: usize,
    keepalive_every: Duration,
    /// Milliseconds since `epoch` at which the current operation began; `u64::MAX` between them.
    op_since_ms: AtomicU64,
    /// Milliseconds since `epoch` of the last frame from the predecessor (or the operation's start).
    heard_ms: AtomicU64,
}

impl CollectiveWatch {
    fn new(predecessor: usize, keepalive_every: Duration) -> CollectiveWatch {
        CollectiveWatch {
            epoch: Instant::now(),
            predecessor,
            keepalive_every,
            op_since_ms: AtomicU64::new(u64::MAX),
            heard_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn begin_op(&self) {
        let now = self.now_ms();
        self.heard_ms.store(now, Ordering::Relaxed);
        self.op_since_ms.store(now, Ordering::Relaxed);
    }

    fn end_op(&self) {
        self.op_since_ms.store(u64::MAX, Ordering::Relaxed);
    }

    fn heard(&self) {
        self.heard_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The rank this one waits for inside an operation without hearing from it (not even a
    /// keepalive) for [`SILENT_KEEPALIVES`] keepalive periods: it did not reach the collective.
    pub fn waiting_for(&self) -> Option<usize> {
        if self.op_since_ms.load(Ordering::Relaxed) == u64::MAX {
            return None;
        }
        let silent = self.now_ms().saturating_sub(self.heard_ms.load(Ordering::Relaxed));
        let limit = (self.keepalive_every * SILENT_KEEPALIVES).as_millis() as u64;
        (silent > limit).then_some(self.predecessor)
    }
}

/// Who this rank is and where the ranks meet (the job launcher's environment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// This rank, `0..world_size` (`RANK`).
    pub rank: usize,
    /// Number of ranks in the job (`WORLD_SIZE`).
    pub world_size: usize,
    /// Host of rank 0's rendezvous (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port of rank 0's rendezvous (`MASTER_PORT`).
    pub master_port: u16,
    /// One incarnation of one job (`FLEETMEND_JOB_ID#FLEETMEND_RESTART_COUNT`): rank 0 turns away
    /// ranks of another job or of an earlier restart that are still knocking.
    pub run_id: String,
}

/// The launcher's environment was missing or wrong; every problem is listed.
#[derive(Debug, thiserror::Error)]
#[error("reading the rank's environment: {}", .problems.join("; "))]
pub struct MembershipError {
    /// One line per variable, naming it.
    pub problems: Vec<String>,
}

impl Membership {
    /// A run of one: no rendezvous, no peers.
    pub fn alone() -> Membership {
        Membership {
            rank: 0,
            world_size: 1,
            master_addr: "127.0.0.1".to_string(),
            master_port: 0,
            run_id: "local#0".to_string(),
        }
    }

    /// Reads `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (both optional for a world of one),
    /// `FLEETMEND_JOB_ID` (default `local`) and `FLEETMEND_RESTART_COUNT` (default 0), parsed as
    /// the checkpoint protocol's [`ProtocolEnv`](crate::checkpoint::ProtocolEnv) parses them.
    /// Without `RANK` and `WORLD_SIZE` this is a run of one ([`Membership::alone`]).
    pub fn from_env() -> Result<Membership, MembershipError> {
        Membership::from_vars(|name| std::env::var_os(name))
    }

    /// [`Membership::from_env`] with the variables looked up through `var`.
    pub fn from_vars<V: Into<std::ffi::OsString>>(
        var: impl FnMut(&str) -> Option<V>,
    ) -> Result<Membership, MembershipError> {
        let mut env = EnvReader::new(var);
        if !env.is_set(vars::RANK) && !env.is_set(vars::WORLD_SIZE) {
            return Ok(Membership::alone());
        }
        let rank = env.number::<u32>(vars::RANK, Need::Required);
        let world_size = env.number::<u32>(vars::WORLD_SIZE, Need::Required);
        let peers = if world_size == Some(1) { Need::Optional } else { Need::Required };
        let master_addr = env.text(vars::MASTER_ADDR, peers);
        let master_port = env.number::<u16>(vars::MASTER_PORT, peers);
        let job_id = env.text(vars::JOB_ID, Need::Optional);
        let restart = env.number::<u32>(vars::RESTART_COUNT, Need::Optional);
        let problems = env.finish();
        if !problems.is_empty() {
            return Err(MembershipError {
                problems: problems.iter().map(ToString::to_string).collect(),
            });
        }
        let to_usize = |value: Option<u32>| value.and_then(|v| usize::try_from(v).ok());
        let membership = Membership {
            rank: to_usize(rank).unwrap_or(0),
            world_size: to_usize(world_size).unwrap_or(0),
            master_addr: master_addr.unwrap_or_else(|| "127.0.0.1".to_string()),
            master_port: master_port.unwrap_or(0),
            run_id: format!("{}#{}", job_id.as_deref().unwrap_or("local"), restart.unwrap_or(0)),
        };
        let problems = membership.problems();
        if problems.is_empty() { Ok(membership) } else { Err(MembershipError { problems }) }
    }

    /// Every problem with these values, each naming its field; empty when usable.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.world_size == 0 {
            problems.push("world_size: must be at least 1".to_string());
        } else if self.rank >= self.world_size {
            problems.push(format!(
                "rank: {} is not a rank of a world of {}",
                self.rank, self.world_size
            ));
        }
        if self.world_size > 1 {
            if self.master_addr.trim().is_empty() {
                problems.push("master_addr: empty".to_string());
            }
            if self.master_port == 0 {
                problems.push("master_port: must not be 0".to_string());
            }
        }
        if self.run_id.is_empty() {
            problems.push("run_id: empty".to_string());
        }
        problems
    }

    fn master_endpoint(&self) -> String {
        if self.master_addr.contains(':') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

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

/// The rendezvous or the ring setup failed.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("invalid collective setup: {}", .problems.join("; "))]
    InvalidSetup { problems: Vec<String> },
    #[error("resolving the rendezvous address {addr}: {source}")]
    Resolve { addr: String, source: io::Error },
    #[error("binding the {what} listener on {addr}: {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: io::Error },
    #[error("{what}: {source}")]
    Socket { what: &'static str, source: io::Error },
    #[error(
        "rank 0's rendezvous at {addr} could not be reached within {}: {source}",
        seconds(*.waited)
    )]
    MasterUnreachable { addr: String, waited: Duration, source: io::Error },
    #[error("talking to rank 0 at {addr}: {detail}")]
    Exchange { addr: String, detail: String },
    #[error("rank 0 at {addr} refused this rank: {reason}")]
    Refused { addr: String, reason: String },
    #[error(
        "the rendezvous gave up after {}: rank(s) {} of {world_size} never arrived",
        seconds(*.waited),
        rank_list(.missing)
    )]
    Incomplete { missing: Vec<usize>, world_size: usize, waited: Duration },
    #[error(
        "rank 0 at {addr} gave no verdict within {} (some rank did not arrive; rank 0 names it)",
        seconds(*.waited)
    )]
    NoVerdict { addr: String, waited: Duration },
    #[error("rank 0 at {addr} closed the rendezvous before answering (it exited or was killed)")]
    MasterLost { addr: String },
    #[error(
        "connecting to ring successor rank {peer} at {addr} for {}: {source}",
        seconds(*.waited)
    )]
    RingConnect { peer: usize, addr: SocketAddr, waited: Duration, source: io::Error },
    #[error("introducing this rank to ring successor rank {peer}: {detail}")]
    RingHandshake { peer: usize, detail: String },
    #[error("ring predecessor rank {peer} did not connect within {}", seconds(*.waited))]
    RingAccept { peer: usize, waited: Duration },
    #[error("checking the new ring: {0}")]
    RingCheck(#[source] CollectiveError),
}

impl RendezvousError {
    /// The ranks that never arrived, when that is why the rendezvous failed.
    pub fn missing_ranks(&self) -> Option<&[usize]> {
        match self {
            RendezvousError::Incomplete { missing, .. } => Some(missing),
            _ => None,
        }
    }
}

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    AllReduce,
    Barrier,
    Broadcast,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::AllReduce => "all-reduce",
            Op::Barrier => "barrier",
            Op::Broadcast => "broadcast",
        })
    }
}

/// Which of a rank's two ring connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingLink {
    /// Rank − 1: this rank reads from it.
    Predecessor,
    /// Rank + 1: this rank writes to it.
    Successor,
}

impl fmt::Display for RingLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RingLink::Predecessor => "predecessor",
            RingLink::Successor => "successor",
        })
    }
}

/// A collective operation failed; the communicator cannot be used again.
#[derive(Debug, thiserror::Error)]
#[error("{op} #{seq} on rank {rank} failed: {failure}")]
pub struct CollectiveError {
    /// The operation.
    pub op: Op,
    /// Its sequence number on this communicator (the same on every rank).
    pub seq: u64,
    /// The rank that reports it.
    pub rank: usize,
    /// What happened.
    pub failure: CollectiveFailure,
}

impl CollectiveError {
    /// The rank most likely at fault: the peer that closed, hung or sent garbage, or, when the
    /// failure came along the ring, the rank that the first rank to notice blamed.
    pub fn suspect_rank(&self) -> Option<usize> {
        self.failure.suspect_rank()
    }
}

/// What went wrong in a collective operation.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveFailure {
    #[error(
        "rank {peer} (ring {link}) {} the connection: it exited, was killed or lost its network",
        if *.reset { "reset" } else { "closed" }
    )]
    PeerClosed { peer: usize, link: RingLink, reset: bool },
    #[error(
        "rank {peer} (ring {link}) made no progress for {} (the collective timeout): it hangs, is not in this collective, or is unreachable",
        seconds(*.waited)
    )]
    PeerSilent { peer: usize, link: RingLink, waited: Duration },
    #[error("talking to rank {peer} (ring {link}): {source}")]
    PeerIo { peer: usize, link: RingLink, source: io::Error },
    #[error("rank {peer} (ring predecessor) is out of step: {detail}")]
    OutOfStep { peer: usize, detail: String },
    #[error(
        "rank {peer} (ring predecessor) abandoned it; the first failure, seen on rank {origin}: {reason}"
    )]
    PeerAborted { peer: usize, origin: usize, suspect: Option<usize>, reason: String },
    #[error("root rank {root} is not a rank of this world of {world_size}")]
    InvalidRoot { root: usize, world_size: usize },
    #[error(
        "this communicator failed earlier and cannot be used again (first failure: {first_failure})"
    )]
    Broken { first_failure: String },
    #[error("starting the thread that sends to the ring successor: {0}")]
    Thread(#[source] io::Error),
}

impl CollectiveFailure {
    /// See [`CollectiveError::suspect_rank`].
    pub fn suspect_rank(&self) -> Option<usize> {
        match self {
            CollectiveFailure::PeerClosed { peer, .. }
            | CollectiveFailure::PeerSilent { peer, .. }
            | CollectiveFailure::PeerIo { peer, .. }
            | CollectiveFailure::OutOfStep { peer, .. } => Some(*peer),
            CollectiveFailure::PeerAborted { suspect, .. } => *suspect,
            CollectiveFailure::InvalidRoot { .. }
            | CollectiveFailure::Broken { .. }
            | CollectiveFailure::Thread(_) => None,
        }
    }

    fn from_link(failure: LinkFailure, peer: usize, link: RingLink, timeout: Duration) -> Self {
        match failure {
            LinkFailure::Closed => CollectiveFailure::PeerClosed { peer, link, reset: false },
            LinkFailure::Reset(_) => CollectiveFailure::PeerClosed { peer, link, reset: true },
            LinkFailure::TimedOut => CollectiveFailure::PeerSilent { peer, link, waited: timeout },
            LinkFailure::Io(source) => CollectiveFailure::PeerIo { peer, link, source },
        }
    }
}

/// The contiguous segments a buffer of `len` elements is cut into for a ring of `world_size`
/// ranks: as equal as possible, the first `len % world_size` one element longer. Segment `c` is
/// summed starting at rank `c` (see the module documentation).
pub fn ring_segments(len: usize, world_size: usize) -> Vec<Range<usize>> {
    let world = world_size.max(1);
    let (base, extra) = (len / world, len % world);
    let mut start = 0;
    (0..world)
        .map(|segment| {
            let end = start + base + usize::from(segment < extra);
            let range = start..end;
            start = end;
            range
        })
        .collect()
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

fn abort_notice(error: &CollectiveError) -> AbortNotice {
    match &error.failure {
        // Pass the first report on unchanged, so every rank names the same culprit.
        CollectiveFailure::PeerAborted { origin, suspect, reason, .. } => {
            AbortNotice { origin: *origin, suspect: *suspect, reason: reason.clone() }
        }
        failure => AbortNotice {
            origin: error.rank,
            suspect: failure.suspect_rank(),
            reason: failure.to_string().chars().take(MAX_REASON_CHARS).collect(),
        },
    }
}

/// What one operation needs to know.
#[derive(Debug)]
struct OpContext {
    seq: u64,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    chunk_bytes: usize,
}

impl OpContext {
    fn keepalive_every(&self) -> Duration {
        keepalive_every(self.timeout)
    }
}

/// Often enough that a successor never waits a whole timeout without hearing from a live rank,
/// and at least every [`MAX_KEEPALIVE_EVERY`].
fn keepalive_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(1), MAX_KEEPALIVE_EVERY)
}

/// Why one step of an operation failed, and whether the successor can still be told.
#[derive(Debug)]
struct StepError {
    failure: CollectiveFailure,
    successor_usable: bool,
}

/// Why receiving from the predecessor failed.
#[derive(Debug)]
enum RecvFailure {
    Link(LinkFailure),
    OutOfStep(String),
    Aborted(AbortNotice),
}

impl RecvFailure {
    fn blame(self, peer: usize, timeout: Duration) -> CollectiveFailure {
        match self {
            RecvFailure::Link(failure) => {
                CollectiveFailure::from_link(failure, peer, RingLink::Predecessor, timeout)
            }
            RecvFailure::OutOfStep(detail) => CollectiveFailure::OutOfStep { peer, detail },
            RecvFailure::Aborted(AbortNotice { origin, suspect, reason }) => {
                CollectiveFailure::PeerAborted { peer, origin, suspect, reason }
            }
        }
    }
}

/// A rank's two ring connections.
#[derive(Debug)]
struct Ring {
    successor: Link,
    predecessor: Link,
}

impl Ring {
    /// After a failure: tell the successor (when it can still be reached), then keep reading from
    /// the predecessor in the background until it closes or a timeout passed, so the predecessor's
    /// writes do not fail before the abort travelling the ring reaches it (it would blame this
    /// rank instead of the culprit).
    fn abandon(self, notice: Option<AbortNotice>, seq: u64, timeout: Duration) {
        let Ring { mut successor, predecessor } = self;
        if let Some(notice) = notice
            && let Err(error) = successor.send_abort(seq, &notice, timeout.min(ABORT_SEND_LIMIT))
        {
            tracing::debug!(%error, peer = successor.peer, "could not pass the abort on");
        }
        let _ = successor.stream.shutdown(Shutdown::Write);
        drop(successor);
        let drain = thread::Builder::new()
            .name("collective-drain".into())
            .spawn(move || predecessor.drain(timeout));
        if let Err(error) = drain {
            tracing::debug!(%error, "could not start draining the ring predecessor");
        }
    }
}

/// One ring connection.
#[derive(Debug)]
struct Link {
    stream: std::net::TcpStream,
    peer: usize,
    /// Payloads that cannot go straight between the socket and the caller's buffer (abort
    /// notices, big-endian conversions), reused across frames.
    scratch: Vec<u8>,
    /// Arriving all-reduce frames that are added to the buffer rather than stored in it, reused
    /// across frames and operations.
    arrivals: Vec<f32>,
    /// Told of every frame that arrives (the predecessor link).
    watch: Option<Arc<CollectiveWatch>>,
}

/// The wire carries `f32`s little-endian; on a little-endian target that is their memory layout,
/// so frames go between the socket and the buffer without a conversion (or any copy of ours).
const NATIVE_IS_WIRE_ORDER: bool = cfg!(target_endian = "little");

impl Link {
    fn new(stream: std::net::TcpStream, peer: usize) -> Link {
        Link { stream, peer, scratch: Vec::new(), arrivals: Vec::new(), watch: None }
    }

    fn watched(self, watch: Arc<CollectiveWatch>) -> Link {
        Link { watch: Some(watch), ..self }
    }

    fn send_frame(
        &mut self,
        header: FrameHeader,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), LinkFailure> {
        let head = header.encode();
        let mut bufs = [IoSlice::new(&head), IoSlice::new(payload)];
        wire::write_all_vectored_until(&mut self.stream, &mut bufs, Instant::now() + timeout)
    }

    fn send_f32s(
        &mut self,
        header: FrameHeader,
        values: &[f32],
        timeout: Duration,
    ) -> Result<(), LinkFailure> {
        if NATIVE_IS_WIRE_ORDER {
            return self.send_frame(header, bytemuck::cast_slice(values), timeout);
        }
        let mut payload = std::mem::take(&mut self.scratch);
        f32s_to_le_bytes(values, &mut payload);
        let sent = self.send_frame(header, &payload, timeout);
        self.scratch = payload;
        sent
    }

    fn send_keepalive(&mut self, seq: u64, timeout: Duration) -> Result<(), LinkFailure> {
        let header = FrameHeader {
            kind: FrameKind::Keepalive,
            seq,
            step: 0,
            chunk: 0,
            payload_len: 0,
            total: 0,
        };
        self.send_frame(header, &[], timeout)
    }

    fn send_abort(
        &mut self,
        seq: u64,
        notice: &AbortNotice,
        timeout: Duration,
    ) -> Result<(), LinkFailure> {
        let payload =
            serde_json::to_vec(notice).map_err(|e| LinkFailure::Io(io::Error::other(e)))?;
        let header = FrameHeader {
            kind: FrameKind::Abort,
            seq,
            step: 0,
            chunk: 0,
            payload_len: frame_len(payload.len()),
            total: 0,
        };
        self.send_frame(header, &payload, timeout)
    }

    /// Reads the next frame's header, which must be `expected` (keepalives are skipped); its
    /// payload, `expected.payload_len` bytes, is next on the stream.
    fn recv_header(&mut self, expected: FrameHeader, timeout: Duration) -> Result<(), RecvFailure> {
        loop {
            let mut raw = [0u8; wire::FRAME_HEADER_LEN];
            wire::read_exact_until(&mut self.stream, &mut raw, Instant::now() + timeout)
                .map_err(RecvFailure::Link)?;
            if let Some(watch) = &self.watch {
                watch.heard();
            }
            let header = FrameHeader::decode(&raw).map_err(RecvFailure::OutOfStep)?;
            let len = header.payload_len as usize;
            match header.kind {
                FrameKind::Keepalive if len == 0 => continue,
                FrameKind::Abort if len <= MAX_ABORT_PAYLOAD => {
                    self.read_payload(len, timeout)?;
                    let notice = serde_json::from_slice(&self.scratch).map_err(|e| {
                        RecvFailure::OutOfStep(format!("received an unreadable abort notice: {e}"))
                    })?;
                    return Err(RecvFailure::Aborted(notice));
                }
                _ if header == expected => return Ok(()),
                _ => return Err(RecvFailure::OutOfStep(describe_mismatch(&expected, &header))),
            }
        }
    }

    /// Reads the next frame, which must carry `expected`'s header, and returns its payload.
    fn recv_expected(
        &mut self,
        expected: FrameHeader,
        timeout: Duration,
    ) -> Result<&[u8], RecvFailure> {
        self.recv_header(expected, timeout)?;
        self.read_payload(expected.payload_len as usize, timeout)?;
        Ok(&self.scratch)
    }

    /// Reads the next frame, which must carry `expected`'s header, straight into `into`: exactly
    /// its payload length (the caller built `expected` from it).
    fn recv_into(
        &mut self,
        expected: FrameHeader,
        into: &mut [u8],
        timeout: Duration,
    ) -> Result<(), RecvFailure> {
        debug_assert_eq!(into.len(), expected.payload_len as usize);
        self.recv_header(expected, timeout)?;
        wire::read_exact_until(&mut self.stream, into, Instant::now() + timeout)
            .map_err(RecvFailure::Link)
    }

    /// [`recv_into`](Link::recv_into) for a frame of little-endian `f32`s.
    fn recv_f32s_into(
        &mut self,
        expected: FrameHeader,
        into: &mut [f32],
        timeout: Duration,
    ) -> Result<(), RecvFailure> {
        if NATIVE_IS_WIRE_ORDER {
            return self.recv_into(expected, bytemuck::cast_slice_mut(into), timeout);
        }
        let payload = self.recv_expected(expected, timeout)?;
        f32s_from_le_bytes(payload, into);
        Ok(())
    }

    /// Reads the next frame of `f32`s, which must carry `expected`'s header, and adds it into
    /// `part` with the arriving value on the left (the documented summation order).
    fn recv_f32s_add(
        &mut self,
        expected: FrameHeader,
        part: &mut [f32],
        timeout: Duration,
    ) -> Result<(), RecvFailure> {
        let mut arrivals = std::mem::take(&mut self.arrivals);
        arrivals.resize(part.len(), 0.0);
        let received = self.recv_f32s_into(expected, &mut arrivals, timeout);
        if received.is_ok() {
            part.iter_mut().zip(&arrivals).for_each(|(value, arrived)| {
                // Not `+=`: the upstream sum stays the left operand.
                let sum = *arrived + *value;
                *value = sum;
            });
        }
        self.arrivals = arrivals;
        received
    }

    fn read_payload(&mut self, len: usize, timeout: Duration) -> Result<(), RecvFailure> {
        self.scratch.resize(len, 0);
        wire::read_exact_until(&mut self.stream, &mut self.scratch, Instant::now() + timeout)
            .map_err(RecvFailure::Link)
    }

    /// Reads and discards until the peer closes, or `limit` passed.
    fn drain(mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut sink = vec![0u8; 64 * 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stream.set_read_timeout(Some(left)).is_err() {
                return;
            }
            match self.stream.read(&mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

fn describe_mismatch(expected: &FrameHeader, got: &FrameHeader) -> String {
    let why = if expected.kind != got.kind || expected.seq != got.seq {
        "the ranks are not calling the same collectives in the same order"
    } else if expected.total != got.total {
        "the ranks passed buffers of different lengths"
    } else {
        "the ranks disagree on the frame layout (different chunk_bytes?)"
    };
    format!("expected {expected}, received {got}: {why}")
}

/// `values` as the wire's little-endian bytes, into `out` (for targets whose memory order is not
/// the wire's). A sized buffer filled in fixed-size chunks compiles to a vectorised loop.
fn f32s_to_le_bytes(values: &[f32], out: &mut Vec<u8>) {
    out.resize(values.len() * 4, 0);
    for (bytes, value) in out.chunks_exact_mut(4).zip(values) {
        bytes.copy_from_slice(&value.to_le_bytes());
    }
}

/// The wire's little-endian bytes back into `f32`s (the other direction of [`f32s_to_le_bytes`]).
fn f32s_from_le_bytes(bytes: &[u8], out: &mut [f32]) {
    for (value, bytes) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *value = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
}

/// Frame payload lengths fit in `u32`: [`CollectiveConfig::validate`] caps `chunk_bytes`.
fn frame_len(bytes: usize) -> u32 {
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// Number of frames for `len` items at most `per_frame` per frame; at least one, so that every step
/// of every operation exchanges a frame and the ranks stay in lockstep even on empty buffers.
fn frame_count(len: usize, per_frame: usize) -> usize {
    len.div_ceil(per_frame).max(1)
}

fn frame_range(frame: usize, per_frame: usize, len: usize) -> Range<usize> {
    (frame * per_frame).min(len)..((frame + 1) * per_frame).min(len)
}

/// One step: send to the successor on a helper thread while receiving from the predecessor here.
/// After its own frames the sender keeps the successor informed with keepalives until the receive
/// is done. The two directions run together because with every rank writing before reading, large
/// frames would fill the socket buffers all around the ring and deadlock it.
fn exchange<S, R>(ring: &mut Ring, op: &OpContext, send: S, recv: R) -> Result<(), StepError>
where
    S: FnOnce(&mut Link) -> Result<(), LinkFailure> + Send,
    R: FnOnce(&mut Link) -> Result<(), RecvFailure>,
{
    let Ring { successor, predecessor } = ring;
    let (successor_rank, predecessor_rank) = (successor.peer, predecessor.peer);
    let (seq, timeout, keepalive_every) = (op.seq, op.timeout, op.keepalive_every());
    let outcome = thread::scope(|scope| {
        let (done, wait_done) = mpsc::channel::<()>();
        let sender = thread::Builder::new().name("collective-send".into()).spawn_scoped(
            scope,
            move || -> Result<(), LinkFailure> {
                send(&mut *successor)?;
                loop {
                    match wait_done.recv_timeout(keepalive_every) {
                        Err(RecvTimeoutError::Timeout) => successor.send_keepalive(seq, timeout)?,
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return Ok(()),
                    }
                }
            },
        )?;
        let received = recv(predecessor);
        drop(done);
        let sent = sender.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Ok((sent, received))
    });
    let (sent, received) = outcome.map_err(|error| StepError {
        failure: CollectiveFailure::Thread(error),
        successor_usable: false,
    })?;
    match (received, sent) {
        (Ok(()), Ok(())) => Ok(()),
        // What this rank saw itself comes first; an abort from upstream only when nothing else
        // went wrong here.
        (Err(failure @ (RecvFailure::Link(_) | RecvFailure::OutOfStep(_))), sent) => {
            Err(StepError {
                failure: failure.blame(predecessor_rank, timeout),
                successor_usable: sent.is_ok(),
            })
        }
        (_, Err(failure)) => Err(StepError {
            failure: CollectiveFailure::from_link(
                failure,
                successor_rank,
                RingLink::Successor,
                timeout,
            ),
            successor_usable: false,
        }),
        (Err(aborted), Ok(())) => Err(StepError {
            failure: aborted.blame(predecessor_rank, timeout),
            successor_usable: true,
        }),
    }
}

/// Whether a received segment is added to the local one (reduce-scatter) or replaces it
/// (all-gather).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Combine {
    Add,
    Copy,
}

fn ring_all_reduce(ring: &mut Ring, op: &OpContext, values: &mut [f32]) -> Result<(), StepError> {
    let (rank, world) = (op.rank, op.world_size);
    let segments = ring_segments(values.len(), world);
    let per_frame = op.chunk_bytes / 4;
    // In every header, so that ranks passing buffers of different lengths are told so.
    let total = values.len() as u64;
    for step in 0..2 * (world - 1) {
        // Reduce-scatter: pass on the segment finished one step ago, add the arriving one, so
        // segment c travels c → c+1 → … and rank c−1 ends with all of it. All-gather: pass on the
        // finished segment, copy the arriving one.
        let (send_segment, recv_segment, combine) = if step < world - 1 {
            ((rank + world - step) % world, (rank + 2 * world - step - 1) % world, Combine::Add)
        } else {
            let step = step - (world - 1);
            ((rank + 1 + world - step) % world, (rank + world - step) % world, Combine::Copy)
        };
        let (outgoing, incoming) = disjoint_segments(
            values,
            segments[send_segment].clone(),
            segments[recv_segment].clone(),
        );
        let header = FrameHeader {
            kind: FrameKind::AllReduce,
            seq: op.seq,
            step: step as u32,
            chunk: 0,
            payload_len: 0,
            total,
        };
        exchange(
            ring,
            op,
            |successor| {
                for frame in 0..frame_count(outgoing.len(), per_frame) {
                    let part = &outgoing[frame_range(frame, per_frame, outgoing.len())];
                    let header = FrameHeader {
                        chunk: frame as u32,
                        payload_len: frame_len(part.len() * 4),
                        ..header
                    };
                    successor.send_f32s(header, part, op.timeout)?;
                }
                Ok(())
            },
            |predecessor| {
                let len = incoming.len();
                for frame in 0..frame_count(len, per_frame) {
                    let part = &mut incoming[frame_range(frame, per_frame, len)];
                    let expected = FrameHeader {
                        chunk: frame as u32,
                        payload_len: frame_len(part.len() * 4),
                        ..header
                    };
                    match combine {
                        Combine::Add => predecessor.recv_f32s_add(expected, part, op.timeout)?,
                        // Straight from the socket into the buffer.
                        Combine::Copy => predecessor.recv_f32s_into(expected, part, op.timeout)?,
                    }
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// The segment to send (shared) and the one to receive into (mutable), from one buffer.
fn disjoint_segments(
    values: &mut [f32],
    outgoing: Range<usize>,
    incoming: Range<usize>,
) -> (&[f32], &mut [f32]) {
    if outgoing.end <= incoming.start {
        let (before, after) = values.split_at_mut(incoming.start);
        (&before[outgoing], &mut after[..incoming.end - incoming.start])
    } else {
        let (before, after) = values.split_at_mut(outgoing.start);
        (&after[..outgoing.end - outgoing.start], &mut before[incoming])
    }
}

/// `world_size − 1` token passes: the token a rank receives in the last step left rank + 1 after
/// that rank entered the barrier, and by induction every rank did.
fn ring_barrier(ring: &mut Ring, op: &OpContext) -> Result<(), StepError> {
    for step in 0..op.world_size - 1 {
        let token = FrameHeader {
            kind: FrameKind::Barrier,
            seq: op.seq,
            step: step as u32,
            chunk: 0,
            payload_len: 0,
            total: 0,
        };
        exchange(
            ring,
            op,
            |successor| successor.send_frame(token, &[], op.timeout),
            |predecessor| predecessor.recv_expected(token, op.timeout).map(|_| ()),
        )?;
    }
    Ok(())
}

/// A pipeline along the ring from `root`: each rank stores every frame it receives and forwards it
/// to its successor, except the last rank before `root`.
fn ring_broadcast(
    ring: &mut Ring,
    op: &OpContext,
    root: usize,
    bytes: &mut [u8],
) -> Result<(), StepError> {
    let world = op.world_size;
    let distance = (op.rank + world - root) % world;
    let len = bytes.len();
    let per_frame = op.chunk_bytes;
    let frames = frame_count(len, per_frame);
    let header = |frame: usize| FrameHeader {
        kind: FrameKind::Broadcast,
        seq: op.seq,
        step: 0,
        chunk: frame as u32,
        payload_len: frame_len(frame_range(frame, per_frame, len).len()),
        total: len as u64,
    };
    if distance == 0 {
        let bytes = &*bytes;
        return exchange(
            ring,
            op,
            |successor| {
                (0..frames).try_for_each(|frame| {
                    let part = &bytes[frame_range(frame, per_frame, len)];
                    successor.send_frame(header(frame), part, op.timeout)
                })
            },
            |_| Ok(()),
        );
    }
    let forward = distance < world - 1;
    let (to_forward, forwarded) = mpsc::channel::<(usize, Vec<u8>)>();
    let keepalive_every = op.keepalive_every();
    exchange(
        ring,
        op,
        move |successor| {
            if !forward {
                return Ok(());
            }
            loop {
                match forwarded.recv_timeout(keepalive_every) {
                    Ok((frame, part)) => successor.send_frame(header(frame), &part, op.timeout)?,
                    Err(RecvTimeoutError::Timeout) => {
                        successor.send_keepalive(op.seq, op.timeout)?
                    }
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
        },
        move |predecessor| {
            for frame in 0..frames {
                let part = &mut bytes[frame_range(frame, per_frame, len)];
                predecessor.recv_into(header(frame), part, op.timeout)?;
                if forward {
                    // The sender thread only stops early when its link failed; that error wins.
                    let _ = to_forward.send((frame, part.to_vec()));
                }
            }
            Ok(())
        },
    )
}

/// Seconds with one decimal, for messages.
fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

fn rank_list(ranks: &[usize]) -> String {
    ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer_and_differ_by_at_most_one() {
        for (len, world) in [(0, 1), (0, 3), (2, 4), (10, 3), (10_007, 4), (12, 4)] {
            let segments = ring_segments(len, world);
            assert_eq!(segments.len(), world);
            assert_eq!(segments.first().map(|s| s.start), Some(0));
            assert_eq!(segments.last().map(|s| s.end), Some(len));
            for pair in segments.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(pair[0].len() == pair[1].len() || pair[0].len() == pair[1].len() + 1);
            }
        }
        assert_eq!(ring_segments(10, 3), vec![0..4, 4..7, 7..10]);
    }

    #[test]
    fn disjoint_segments_handles_empty_segments_either_side() {
        let mut values: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let (out, inc) = disjoint_segments(&mut values, 0..2, 2..6);
        assert_eq!((out.len(), inc.len()), (2, 4));
        let (out, inc) = disjoint_segments(&mut values, 4..6, 0..4);
        assert_eq!((out, inc.len()), (&[4.0, 5.0][..], 4));
        // An empty segment sits at the start of the next one.
        let (out, inc) = disjoint_segments(&mut values, 3..3, 3..6);
        assert_eq!((out.len(), inc.len()), (0, 3));
        let (out, inc) = disjoint_segments(&mut values, 3..6, 3..3);
        assert_eq!((out.len(), inc.len()), (3, 0));
        let (out, inc) = disjoint_segments(&mut values, 6..6, 6..6);
        assert_eq!((out.len(), inc.len()), (0, 0));
    }

    #[test]
    fn frames_cover_each_segment_and_empty_ones_still_get_one() {
        assert_eq!(frame_count(0, 4), 1);
        assert_eq!(frame_count(9, 4), 3);
        assert_eq!(frame_range(2, 4, 9), 8..9);
        assert_eq!(frame_range(0, 4, 0), 0..0);
    }

    #[test]
    fn the_wire_order_conversion_round_trips_every_bit_pattern_kind() {
        let values = [1.5f32, -0.0, f32::NAN, f32::INFINITY, f32::MIN_POSITIVE / 2.0, -3.25e-7];
        let mut bytes = Vec::new();
        f32s_to_le_bytes(&values, &mut bytes);
        let expected: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(bytes, expected);
        if NATIVE_IS_WIRE_ORDER {
            // What the zero-copy path sends is what the conversion would have produced.
            assert_eq!(bytemuck::cast_slice::<f32, u8>(&values), &expected[..]);
        }
        let mut back = [0f32; 6];
        f32s_from_le_bytes(&bytes, &mut back);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&values));
    }

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
    fn membership_reads_the_launcher_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let membership = Membership::from_vars(vars(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("FLEETMEND_JOB_ID", "job-7"),
            ("FLEETMEND_RESTART_COUNT", "3"),
        ]))
        .unwrap();
        assert_eq!(
            membership,
            Membership {
                rank: 2,
                world_size: 4,
                master_addr: "10.0.0.1".into(),
                master_port: 29500,
                run_id: "job-7#3".into(),
            }
        );
        let alone = Membership::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap();
        assert_eq!((alone.world_size, alone.run_id.as_str()), (1, "local#0"));
        assert_eq!(Membership::from_vars(vars(&[])).unwrap(), Membership::alone());

        let error = Membership::from_vars(vars(&[
            ("RANK", "x"),
            ("WORLD_SIZE", "4"),
            ("MASTER_PORT", "70000"),
        ]))
        .unwrap_err();
        let text = error.to_string();
        for var in ["RANK", "MASTER_ADDR", "MASTER_PORT"] {
            assert!(text.contains(var), "{text}");
        }
        let error = Membership::from_vars(vars(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err();
        assert!(error.to_string().contains("rank: 4 is not a rank of a world of 4"), "{error}");
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
