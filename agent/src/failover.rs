//! Which of its configured repairers the reporter sends to next, and how long it waits first.
//!
//! The reporter stays on a repairer that takes its reports (no round-robin while healthy). A
//! report that cannot be delivered there (the connection fails or times out, TLS fails, a 5xx) is
//! sent to the next repairer of the list at once; a standby's 503 that names the leader, when the
//! leader is one of the configured repairers, sends it to the leader at once. A round is as many
//! attempts as there are repairers: only after a round that delivered nothing does the reporter
//! wait, with the capped, jittered backoff (or, when a standby that did not know the leader asked
//! for it, its `Retry-After`). So with one repairer every failure waits, as it always did, and a
//! pair of standbys naming each other cannot make it spin.
//!
//! A refusal that is not about this repairer being away or a standby (a 4xx: a bad token, a rate
//! limit) is the fleet's answer, not one repairer's: the reporter stays and waits.

use std::time::Duration;

/// How an attempt to deliver a report ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The repairer took it.
    Delivered,
    /// The repairer could not be reached or failed (connection, timeout, TLS, 5xx other than a
    /// standby's 503).
    Unreachable,
    /// A 503: the repairer is a standby (or cannot serve now); `leader` is its
    /// `Fleetmend-Leader` header, `retry_after` its `Retry-After`.
    Standby { leader: Option<String>, retry_after: Option<Duration> },
    /// Any other refusal (4xx), with its `Retry-After`.
    Refused { retry_after: Option<Duration> },
}

/// Why the reporter moved to another repairer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The one it used could not be reached or failed.
    Unreachable,
    /// The one it used is a standby that named the leader, one of the configured repairers.
    Leader,
    /// The one it used is a standby that did not name a configured leader.
    Standby,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Unreachable => "unreachable",
            Why::Leader => "standby named the leader",
            Why::Standby => "standby, leader unknown",
        }
    }
}

/// How long to wait before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Send at once (the next repairer of a round, or a report on the healthy schedule).
    None,
    /// A round delivered nothing: back off for failed round number `rounds` (1-based).
    Backoff { rounds: u32 },
    /// A round delivered nothing and a repairer asked to wait this long (`Retry-After`).
    Asked(Duration),
}

/// What the reporter does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The index of the repairer of the next attempt.
    pub to: usize,
    /// Why it moved; none when it stays.
    pub moved: Option<Why>,
    pub wait: Wait,
}

/// A leader named by a standby that is not one of the configured repairers: the reporter does
/// not send its token there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignLeader(pub String);

/// The reporter's place in its list of repairers.
#[derive(Debug, Clone)]
pub struct Failover {
    urls: Vec<String>,
    current: usize,
    /// Attempts made in the current round.
    tried: usize,
    /// Rounds in a row that delivered nothing.
    rounds_failed: u32,
    /// The longest `Retry-After` asked for in the current round.
    asked: Option<Duration>,
}

impl Failover {
    /// Starts on the first of `urls` (at least one, as configuration validation makes sure).
    pub fn new(urls: Vec<String>) -> Failover {
        Failover { urls, current: 0, tried: 0, rounds_failed: 0, asked: None }
    }

    /// The index of the repairer of the next attempt.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The base URL of the repairer of the next attempt.
    pub fn current_url(&self) -> &str {
        self.urls.get(self.current).map_or("", String::as_str)
    }

    /// Rounds in a row that delivered nothing.
    pub fn rounds_failed(&self) -> u32 {
        self.rounds_failed
    }

    /// Takes the outcome of an attempt at the current repairer; the next step, and the leader a
    /// standby named when it is not one of the configured repairers (not followed).
    pub fn after(&mut self, outcome: &Outcome) -> (Step, Option<ForeignLeader>) {
        let n = self.urls.len().max(1);
        let mut foreign = None;
        let (to, why) = match outcome {
            Outcome::Delivered => {
                self.tried = 0;
                self.rounds_failed = 0;
                self.asked = None;
                return (Step { to: self.current, moved: None, wait: Wait::None }, None);
            }
            Outcome::Refused { retry_after } => {
                self.tried = 0;
                self.asked = None;
                self.rounds_failed = self.rounds_failed.saturating_add(1);
                let wait = match retry_after {
                    Some(asked) => Wait::Asked(*asked),
                    None => Wait::Backoff { rounds: self.rounds_failed },
                };
                return (Step { to: self.current, moved: None, wait }, None);
            }
            Outcome::Unreachable => ((self.current + 1) % n, Why::Unreachable),
            Outcome::Standby { leader, retry_after } => {
                let at = leader
                    .as_deref()
                    .and_then(|leader| fleetmend_proto::repairers::position(&self.urls, leader));
                match at {
                    Some(at) if at != self.current => (at, Why::Leader),
                    _ => {
                        if let Some(leader) = leader.as_ref().filter(|_| at.is_none()) {
                            foreign = Some(ForeignLeader(leader.clone()));
                        }
                        // The leader is unknown here: what the standby asked for counts.
                        if let Some(asked) = retry_after {
                            self.asked = Some(self.asked.map_or(*asked, |a| a.max(*asked)));
                        }
                        ((self.current + 1) % n, Why::Standby)
                    }
                }
            }
        };
        let moved = (to != self.current).then_some(why);
        self.current = to;
        self.tried += 1;
        let wait = if self.tried < n {
            Wait::None
        } else {
            self.tried = 0;
            self.rounds_failed = self.rounds_failed.saturating_add(1);
            match self.asked.take() {
                Some(asked) => Wait::Asked(asked),
                None => Wait::Backoff { rounds: self.rounds_failed },
            }
        };
        (Step { to, moved, wait }, foreign)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failover(n: usize) -> Failover {
        Failover::new((1..=n).map(|i| format!("http://r{i}:9830")).collect())
    }

    fn standby(leader: Option<&str>, retry_after: Option<u64>) -> Outcome {
        Outcome::Standby {
            leader: leader.map(str::to_owned),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    fn step(to: usize, moved: Option<Why>, wait: Wait) -> Step {
        Step { to, moved, wait }
    }

    #[test]
    fn one_repairer_waits_after_every_failure_as_before() {
        let mut one = failover(1);
        for rounds in 1..=3 {
            let (next, _) = one.after(&Outcome::Unreachable);
            assert_eq!(next, step(0, None, Wait::Backoff { rounds }));
        }
        let (next, _) = one.after(&standby(None, Some(7)));
        assert_eq!(next, step(0, None, Wait::Asked(Duration::from_secs(7))));
        assert_eq!(one.after(&Outcome::Delivered).0, step(0, None, Wait::None));
        assert_eq!(one.rounds_failed(), 0);
        // A standby naming itself, the only repairer: nothing to follow, its wait counts.
        let (next, foreign) = one.after(&standby(Some("http://r1:9830/"), Some(3)));
        assert_eq!(next, step(0, None, Wait::Asked(Duration::from_secs(3))));
        assert_eq!(foreign, None);
    }

    #[test]
    fn a_failure_moves_to_the_next_at_once_and_a_failed_round_backs_off() {
        let mut three = failover(3);
        assert_eq!(
            three.after(&Outcome::Unreachable).0,
            step(1, Some(Why::Unreachable), Wait::None)
        );
        assert_eq!(
            three.after(&Outcome::Unreachable).0,
            step(2, Some(Why::Unreachable), Wait::None)
        );
        assert_eq!(
            three.after(&Outcome::Unreachable).0,
            step(0, Some(Why::Unreachable), Wait::Backoff { rounds: 1 })
        );
        assert_eq!(
            three.after(&Outcome::Unreachable).0,
            step(1, Some(Why::Unreachable), Wait::None)
        );
        // It stays where a report is taken: no round-robin while healthy.
        assert_eq!(three.after(&Outcome::Delivered).0, step(1, None, Wait::None));
        assert_eq!(three.after(&Outcome::Delivered).0, step(1, None, Wait::None));
        assert_eq!(three.current_url(), "http://r2:9830");
    }

    #[test]
    fn a_standby_naming_a_configured_leader_sends_there_at_once() {
        let mut three = failover(3);
        let (next, foreign) = three.after(&standby(Some("HTTP://r3:9830/"), Some(5)));
        assert_eq!(next, step(2, Some(Why::Leader), Wait::None));
        assert_eq!(foreign, None);
        assert_eq!(three.after(&Outcome::Delivered).0, step(2, None, Wait::None));
    }

    #[test]
    fn a_leader_outside_the_list_is_not_followed() {
        let mut two = failover(2);
        let (next, foreign) = two.after(&standby(Some("http://elsewhere:9830"), Some(2)));
        assert_eq!(next, step(1, Some(Why::Standby), Wait::None));
        assert_eq!(foreign, Some(ForeignLeader("http://elsewhere:9830".into())));
        // The round ends on the next failure; the standby's Retry-After is its wait.
        let (next, _) = two.after(&Outcome::Unreachable);
        assert_eq!(next, step(0, Some(Why::Unreachable), Wait::Asked(Duration::from_secs(2))));
    }

    #[test]
    fn standbys_naming_each_other_cannot_spin() {
        let mut two = failover(2);
        let (first, _) = two.after(&standby(Some("http://r2:9830"), Some(1)));
        assert_eq!(first, step(1, Some(Why::Leader), Wait::None));
        let (second, _) = two.after(&standby(Some("http://r1:9830"), Some(1)));
        assert_eq!(second, step(0, Some(Why::Leader), Wait::Backoff { rounds: 1 }));
    }

    #[test]
    fn a_refusal_stays_and_waits() {
        let mut two = failover(2);
        let (next, _) = two.after(&Outcome::Refused { retry_after: None });
        assert_eq!(next, step(0, None, Wait::Backoff { rounds: 1 }));
        let (next, _) = two.after(&Outcome::Refused { retry_after: Some(Duration::from_secs(4)) });
        assert_eq!(next, step(0, None, Wait::Asked(Duration::from_secs(4))));
    }
}
