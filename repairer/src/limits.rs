//! Rates per caller (`[rate_limits]`): a credential, or the peer's address for a request without
//! one, may make so many requests a second on average and so many at once above it (GCRA, from
//! the `governor` crate). Beyond its rate a request is answered 429 with `Retry-After` and
//! changes nothing; agents wait that long, with jitter, and send their newest state.
//!
//! Who the caller is comes from the API's credentials (`api/auth.rs`); this module only counts.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use serde::Deserialize;

/// `[rate_limits]`: a rate for each kind of caller.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitsConfig {
    /// Each node's agent: the requests with its own token (`node_tokens_file`), or the reports
    /// naming it (with the shared agent token, or none). A healthy agent sends a report every
    /// interval (10 s) and one at once for a kernel-log fault, a finished command or a rank exit.
    pub node: Rate,
    /// Each person's or tool's credential (`[[credentials]]`, `admin_token`).
    pub person: Rate,
    /// The alert webhooks' token (Alertmanager, SNS), one bucket for all its senders.
    pub alerts: Rate,
    /// Each rank's progress token (one post per training step, and a heartbeat every 2 s).
    pub rank: Rate,
    /// Requests without a credential the repairer knows (scrapes of `/metrics`, probes, wrong
    /// tokens), per peer address. Loopback peers are not limited: the host's own tools, or a
    /// proxy in front of the repairer, which would put every client in one bucket.
    pub peer: Rate,
}

/// A sustained rate and the burst above it.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Requests a second, on average (fractions allowed: 0.5 is one every 2 s).
    pub per_second: f64,
    /// Requests at once above that rate (the bucket's size), at least 1.
    pub burst: u32,
}

impl Default for RateLimitsConfig {
    fn default() -> Self {
        RateLimitsConfig {
            node: Rate { per_second: 10.0, burst: 100 },
            person: Rate { per_second: 50.0, burst: 500 },
            alerts: Rate { per_second: 100.0, burst: 1000 },
            rank: Rate { per_second: 100.0, burst: 1000 },
            peer: Rate { per_second: 50.0, burst: 500 },
        }
    }
}

/// Slowest rate accepted: one request a day.
const SLOWEST: f64 = 1.0 / 86_400.0;

impl RateLimitsConfig {
    /// Every problem, naming its field under `section` (`rate_limits`).
    pub fn problems(&self, section: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        for (name, rate) in self.rates() {
            if !(rate.per_second.is_finite() && rate.per_second >= SLOWEST) {
                problems.push((
                    format!("{section}.{name}.per_second"),
                    format!("must be a number of at least {SLOWEST:e} (one a day)"),
                ));
            }
            if rate.burst == 0 {
                problems.push((format!("{section}.{name}.burst"), "must be at least 1".to_owned()));
            }
        }
        problems
    }

    fn rates(&self) -> [(&'static str, Rate); 5] {
        [
            ("node", self.node),
            ("person", self.person),
            ("alerts", self.alerts),
            ("rank", self.rank),
            ("peer", self.peer),
        ]
    }
}

impl Rate {
    fn quota(self) -> Quota {
        let period = Duration::from_secs_f64(1.0 / self.per_second.max(SLOWEST));
        let burst = NonZeroU32::new(self.burst).unwrap_or(NonZeroU32::MIN);
        Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX))
            .allow_burst(burst)
    }
}

/// Whom a request is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    Node(String),
    Person(String),
    Alerts,
    Rank { job: String, attempt: u32, rank: u32 },
    Peer(IpAddr),
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Node(node) => write!(f, "node {node}"),
            Caller::Person(name) => write!(f, "credential {name}"),
            Caller::Alerts => write!(f, "the alert sources' token"),
            Caller::Rank { job, attempt, rank } => {
                write!(f, "rank {rank} of job {job} attempt {attempt}")
            }
            Caller::Peer(ip) => write!(f, "peer {ip}"),
        }
    }
}

/// A request beyond its caller's rate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    /// Whom it was counted against, for the error body.
    pub caller: String,
    /// Whole seconds until the caller may try again (at least 1): `Retry-After`.
    pub retry_after_secs: u64,
}

/// Checks between prunings of the keyed buckets that are full again (so keys that come and go,
/// peers above all, do not pile up).
const PRUNE_EVERY: u64 = 4096;

/// The buckets: one limiter per kind of caller, keyed where there are many.
#[derive(Debug)]
pub struct RateLimits {
    nodes: DefaultKeyedRateLimiter<String>,
    people: DefaultKeyedRateLimiter<String>,
    alerts: DefaultDirectRateLimiter,
    ranks: DefaultKeyedRateLimiter<(String, u32, u32)>,
    peers: DefaultKeyedRateLimiter<IpAddr>,
    clock: DefaultClock,
    checks: AtomicU64,
}

impl RateLimits {
    pub fn new(config: &RateLimitsConfig) -> RateLimits {
        RateLimits {
            nodes: DefaultKeyedRateLimiter::keyed(config.node.quota()),
            people: DefaultKeyedRateLimiter::keyed(config.person.quota()),
            alerts: DefaultDirectRateLimiter::direct(config.alerts.quota()),
            ranks: DefaultKeyedRateLimiter::keyed(config.rank.quota()),
            peers: DefaultKeyedRateLimiter::keyed(config.peer.quota()),
            clock: DefaultClock::default(),
            checks: AtomicU64::new(0),
        }
    }

    /// Counts one request of `caller`: `Err` when it is beyond the caller's rate.
    pub fn check(&self, caller: &Caller) -> Result<(), Throttled> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY == PRUNE_EVERY - 1 {
            self.prune();
        }
        let outcome = match caller {
            Caller::Node(node) => self.nodes.check_key(node),
            Caller::Person(name) => self.people.check_key(name),
            Caller::Alerts => self.alerts.check(),
            Caller::Rank { job, attempt, rank } => {
                self.ranks.check_key(&(job.clone(), *attempt, *rank))
            }
            Caller::Peer(ip) if ip.is_loopback() => Ok(()),
            Caller::Peer(ip) => self.peers.check_key(ip),
        };
        outcome.map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            Throttled {
                caller: caller.to_string(),
                retry_after_secs: (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1),
            }
        })
    }

    fn prune(&self) {
        self.nodes.retain_recent();
        self.people.retain_recent();
        self.ranks.retain_recent();
        self.peers.retain_recent();
        self.peers.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn limits(rate: Rate) -> RateLimits {
        RateLimits::new(&RateLimitsConfig {
            node: rate,
            person: rate,
            alerts: rate,
            rank: rate,
            peer: rate,
        })
    }

    #[test]
    fn a_caller_beyond_its_burst_is_throttled_alone_with_a_retry_after() {
        let limits = limits(Rate { per_second: 0.5, burst: 3 });
        let n1 = Caller::Node("n1".into());
        for _ in 0..3 {
            assert_eq!(limits.check(&n1), Ok(()));
        }
        let throttled = limits.check(&n1).unwrap_err();
        assert_eq!(throttled.caller, "node n1");
        assert!((1..=2).contains(&throttled.retry_after_secs), "{throttled:?}");
        // Another node, and a person of the same name, have buckets of their own.
        assert_eq!(limits.check(&Caller::Node("n2".into())), Ok(()));
        assert_eq!(limits.check(&Caller::Person("n1".into())), Ok(()));
    }

    #[test]
    fn peers_are_limited_by_address_and_loopback_is_not() {
        let limits = limits(Rate { per_second: 1.0, burst: 1 });
        let remote = Caller::Peer("192.0.2.7".parse().unwrap());
        assert_eq!(limits.check(&remote), Ok(()));
        assert!(limits.check(&remote).is_err());
        assert_eq!(limits.check(&Caller::Peer("192.0.2.8".parse().unwrap())), Ok(()));
        let loopback = Caller::Peer("127.0.0.1".parse().unwrap());
        for _ in 0..10 {
            assert_eq!(limits.check(&loopback), Ok(()));
        }
    }

    #[test]
    fn a_rank_is_keyed_on_its_job_attempt_and_rank() {
        let limits = limits(Rate { per_second: 1.0, burst: 1 });
        let rank = |attempt, rank| Caller::Rank { job: "j".into(), attempt, rank };
        assert_eq!(limits.check(&rank(1, 0)), Ok(()));
        assert!(limits.check(&rank(1, 0)).is_err());
        assert_eq!(limits.check(&rank(1, 1)), Ok(()));
        assert_eq!(limits.check(&rank(2, 0)), Ok(()));
        assert_eq!(limits.check(&Caller::Alerts), Ok(()));
        assert!(limits.check(&Caller::Alerts).is_err());
    }

    #[test]
    fn defaults_leave_a_healthy_agent_room_and_bad_rates_are_named() {
        let config = RateLimitsConfig::default();
        assert!(config.problems("rate_limits").is_empty());
        // A report every 10 s plus a burst of kernel-log pushes is far inside a node's rate.
        assert!(config.node.per_second >= 1.0 && config.node.burst >= 30);
        let limits = RateLimits::new(&config);
        let node = Caller::Node("n1".into());
        assert!((0..config.node.burst).all(|_| limits.check(&node).is_ok()));
        let bad = RateLimitsConfig {
            node: Rate { per_second: 0.0, burst: 0 },
            peer: Rate { per_second: f64::NAN, burst: 1 },
            ..RateLimitsConfig::default()
        };
        let fields: Vec<String> = bad.problems("rate_limits").into_iter().map(|p| p.0).collect();
        assert_eq!(
            fields,
            [
                "rate_limits.node.per_second",
                "rate_limits.node.burst",
                "rate_limits.peer.per_second"
            ]
        );
    }
}
