//! What happens in the simulated world and when: the happenings still to come, in time order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Something that happens in the simulated world at a time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Happening {
    /// Nodes (by slot) fail with a catalog category.
    Fault { slots: Vec<u32>, category: usize, correlated: bool },
    /// A node's heartbeat: it takes the commands waiting for it.
    Heartbeat { node: String },
    /// A reboot ends.
    BootDone { node: String, boot: u32 },
    /// A replacement node joins.
    Joined { node: String, slot: u32, category: usize },
    /// A person fixes a fault the repairer left (`since_ms` names the fault).
    ManualFix { node: String, since_ms: u64 },
    /// A job has something to do by itself.
    JobWake { job: String, token: u64 },
    /// A timed step of a job's attempt under the gang scheduler.
    GangStep { job: String, token: u64 },
    /// Benign noise (`[noise]`).
    Noise(super::noise::Noise),
}

/// The happenings still to come, earliest first; those due at the same time in the order they
/// were scheduled.
#[derive(Debug, Default)]
pub(super) struct Agenda {
    heap: BinaryHeap<Reverse<(u64, u64, Happening)>>,
    seq: u64,
}

impl Agenda {
    pub(super) fn schedule(&mut self, at_ms: u64, what: Happening) {
        self.seq += 1;
        self.heap.push(Reverse((at_ms, self.seq, what)));
    }

    /// When the next happening is due.
    pub(super) fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Takes the next happening due by `now`.
    pub(super) fn pop_due(&mut self, now: u64) -> Option<Happening> {
        if self.next_at()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse((_, _, what))| what)
    }
}
