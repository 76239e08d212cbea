//! How the rendezvous and the collectives fail, and which rank each failure blames: the errors
//! callers see, and the abort notice that carries the first rank's verdict around the ring.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::wire::{AbortNotice, LinkFailure};

/// Longest reason text carried in an abort frame.
const MAX_REASON_CHARS: usize = 4096;

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

    pub(super) fn from_link(
        failure: LinkFailure,
        peer: usize,
        link: RingLink,
        timeout: Duration,
    ) -> Self {
        match failure {
            LinkFailure::Closed => CollectiveFailure::PeerClosed { peer, link, reset: false },
            LinkFailure::Reset(_) => CollectiveFailure::PeerClosed { peer, link, reset: true },
            LinkFailure::TimedOut => CollectiveFailure::PeerSilent { peer, link, waited: timeout },
            LinkFailure::Io(source) => CollectiveFailure::PeerIo { peer, link, source },
        }
    }
}

/// The notice a failed rank sends its successor: its own verdict, or the one it received.
pub(super) fn abort_notice(error: &CollectiveError) -> AbortNotice {
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

/// Seconds with one decimal, for messages.
fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

fn rank_list(ranks: &[usize]) -> String {
    ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}
