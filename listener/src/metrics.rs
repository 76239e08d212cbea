//! The listener's series, the same on the agent's `/metrics` and the repairer's: names here, the
//! counts in [`ListenerStats`], each process renders them with its own exposition.

use std::sync::atomic::{AtomicU64, Ordering};

/// Connections open now (TLS handshakes included).
pub const CONNECTIONS_OPEN: &str = "fleetmend_http_connections_open";
/// The cap on open connections in force (`[listener] max_connections`, or less where the
/// descriptor limit did not allow it).
pub const CONNECTIONS_MAX: &str = "fleetmend_http_connections_max";
/// Connections closed at accept because the cap was reached.
pub const CONNECTIONS_SHED: &str = "fleetmend_http_connections_shed_total";
/// Connections closed because a client overran a deadline, by `phase`.
pub const TIMEOUTS: &str = "fleetmend_http_timeouts_total";

/// A deadline a connection can overrun: the `phase` label of [`TIMEOUTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The TLS handshake had not finished by the header deadline.
    Handshake,
    /// A request's head had not arrived by `header_timeout`.
    Header,
    /// A request's body had not arrived by `body_timeout`.
    Body,
    /// Nothing moved for `idle_timeout` between requests or on an unread response.
    Idle,
}

impl Phase {
    /// Every phase, in the order they are exported (all of them from the start, at 0).
    pub const ALL: [Phase; 4] = [Phase::Handshake, Phase::Header, Phase::Body, Phase::Idle];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Handshake => "handshake",
            Phase::Header => "header",
            Phase::Body => "body",
            Phase::Idle => "idle",
        }
    }

    fn index(self) -> usize {
        match self {
            Phase::Handshake => 0,
            Phase::Header => 1,
            Phase::Body => 2,
            Phase::Idle => 3,
        }
    }
}

/// The listener's counts, shared with the process's `/metrics`.
#[derive(Debug, Default)]
pub struct ListenerStats {
    open: AtomicU64,
    max: AtomicU64,
    shed: AtomicU64,
    timeouts: [AtomicU64; 4],
}

impl ListenerStats {
    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// The cap in force (0 before the listener started).
    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// Connections shed so far.
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Connections closed for an overrun deadline so far, by phase.
    pub fn timeouts(&self) -> [(Phase, u64); 4] {
        Phase::ALL.map(|phase| (phase, self.timeouts[phase.index()].load(Ordering::Relaxed)))
    }

    pub(crate) fn set_max(&self, max: u64) {
        self.max.store(max, Ordering::Relaxed);
    }

    pub(crate) fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn count_shed(&self) {
        self.shed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_timeout(&self, phase: Phase) {
        self.timeouts[phase.index()].fetch_add(1, Ordering::Relaxed);
    }
}
