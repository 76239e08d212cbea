//! Liveness inside a collective: how often a waiting rank sends keepalives to its successor, and
//! the watch a progress heartbeat reads to tell a predecessor that never reached the collective
//! from one that waits in it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    pub(super) fn new(predecessor: usize, keepalive_every: Duration) -> CollectiveWatch {
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

    pub(super) fn begin_op(&self) {
        let now = self.now_ms();
        self.heard_ms.store(now, Ordering::Relaxed);
        self.op_since_ms.store(now, Ordering::Relaxed);
    }

    pub(super) fn end_op(&self) {
        self.op_since_ms.store(u64::MAX, Ordering::Relaxed);
    }

    pub(super) fn heard(&self) {
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

/// Often enough that a successor never waits a whole timeout without hearing from a live rank,
/// and at least every [`MAX_KEEPALIVE_EVERY`].
pub(super) fn keepalive_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(1), MAX_KEEPALIVE_EVERY)
}
