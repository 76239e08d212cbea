//! Leadership among repairers that share a PostgreSQL store.
//!
//! Each repairer holds the store's lease or waits for it ([`Store::acquire`]: a holder, an epoch
//! and an expiry kept by the database's clock). The leader renews it every `renew`; a standby
//! tries to take it every `poll`, which it can once the leader gave it up (a clean stop) or let it
//! lapse (killed, paused, cut off from the database). Only the leader acts; a standby serves
//! reads from the store and answers writes with the leader's address.
//!
//! The leader stops acting by itself before its lease can lapse: a renewal that succeeds lets the
//! store write until `lease × 0.8` after the renewal was *sent* (the database's expiry counts from
//! its commit, later), and past that the store refuses every write. An action is never taken
//! before its event is written, so nothing more is done. A renewal that finds the lease taken, a
//! renewal that cannot reach the database until that moment, or a write refused for a newer
//! epoch ends the repairer ([`Leadership::lost`]): it starts again as a standby and, when it leads
//! again, recovers from the store as after a crash.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::store::{Lease, Store, StoreError};

/// `[leadership]`: how repairers sharing a PostgreSQL store take turns (unused on SQLite).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeadershipConfig {
    /// The URL agents, the CLI and the other repairers reach this repairer at (standbys name the
    /// leader by it). Default: `http[s]://HOST:PORT` of the listen address, the host's name when
    /// it listens on every address.
    pub advertise: Option<String>,
    /// How long a lease lasts unrenewed: the longest a standby waits after the leader died.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// How often the leader renews (default: a third of the lease).
    #[serde(with = "humantime_serde::option")]
    pub renew: Option<Duration>,
    /// How often a standby tries to take the lease and reads the store again for its answers.
    #[serde(with = "humantime_serde")]
    pub poll: Duration,
}

impl Default for LeadershipConfig {
    fn default() -> Self {
        LeadershipConfig {
            advertise: None,
            lease: Duration::from_secs(10),
            renew: None,
            poll: Duration::from_secs(1),
        }
    }
}

impl LeadershipConfig {
    pub fn renew_every(&self) -> Duration {
        self.renew.unwrap_or(self.lease / 3)
    }

    /// Every problem, naming its field.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: &str, message: String| {
            problems.push((format!("leadership.{field}"), message));
        };
        if self.lease < Duration::from_secs(2) {
            push("lease", format!("{:?} is too short: at least 2s", self.lease));
        }
        // Two renewals fit in the part of the lease the leader writes in.
        if self.renew_every().is_zero() || self.renew_every() * 2 > self.lease * 4 / 5 {
            push(
                "renew",
                format!(
                    "{:?} must be above zero and at most 40% of the lease ({:?})",
                    self.renew_every(),
                    self.lease
                ),
            );
        }
        if self.poll.is_zero() || self.poll > self.lease {
            push("poll", format!("{:?} must be above zero and at most the lease", self.poll));
        }
        if let Some(url) = &self.advertise
            && let Err(err) = fleetmend_proto::repairers::normalise(url)
        {
            push("advertise", err);
        }
        problems
    }
}

/// Whether this repairer leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Leader,
    Standby,
}

/// `GET /v1/leader`: who leads the store this repairer uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaderView {
    /// The leader's URL; `null` while nobody holds the lease.
    pub leader: Option<String>,
    /// The lease's epoch (0 before anyone led).
    pub epoch: i64,
    /// When the leader's lease lapses unless renewed (ms since the Unix epoch, database clock).
    pub lease_until_ms: Option<i64>,
    /// This repairer's URL.
    pub this: String,
    pub role: Role,
}

impl LeaderView {
    /// A repairer on its own store (SQLite): it leads, always, at epoch 1.
    pub fn alone(this: String) -> LeaderView {
        LeaderView {
            leader: Some(this.clone()),
            epoch: 1,
            lease_until_ms: None,
            this,
            role: Role::Leader,
        }
    }
}

/// Why this repairer stopped leading.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LostLeadership {
    #[error("the lease was taken by {holder} (epoch {epoch})")]
    Taken { holder: String, epoch: i64 },
    #[error("the lease could not be renewed in time: {0}")]
    NotRenewed(String),
    #[error("a write was refused: {0}")]
    Fenced(String),
}

/// This repairer's place among those sharing its store.
#[derive(Debug)]
pub struct Leadership {
    store: Store,
    config: LeadershipConfig,
    /// This repairer's URL.
    this: String,
    /// The lease holder's name: the URL and what tells this process from an earlier one there.
    holder: String,
    state: Mutex<Known>,
    lost: watch::Sender<Option<LostLeadership>>,
}

/// What this repairer last read of the lease.
#[derive(Debug, Clone)]
struct Known {
    role: Role,
    lease: Option<Lease>,
    /// The epoch this repairer leads under.
    epoch: i64,
}

/// The URL part of a holder's name.
pub fn holder_url(holder: &str) -> &str {
    holder.split_once('#').map_or(holder, |(url, _)| url)
}

impl Leadership {
    pub fn new(store: Store, config: LeadershipConfig, this: String) -> Arc<Leadership> {
        let instance = format!("{}-{}", std::process::id(), crate::clock::unix_now_ms());
        let holder = format!("{this}#{instance}");
        // A standby until it takes the lease: nothing it builds may write.
        store.close_writes();
        Arc::new(Leadership {
            store,
            config,
            this,
            holder,
            state: Mutex::new(Known { role: Role::Standby, lease: None, epoch: 0 }),
            lost: watch::channel(None).0,
        })
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn config(&self) -> &LeadershipConfig {
        &self.config
    }

    pub fn role(&self) -> Role {
        self.known().role
    }

    /// The epoch this repairer leads under (0 on a standby).
    pub fn epoch(&self) -> i64 {
        self.known().epoch
    }

    /// The leader's URL as last read, if anyone holds the lease and it is not this repairer.
    pub fn leader_elsewhere(&self) -> Option<String> {
        let known = self.known();
        if known.role == Role::Leader {
            return None;
        }
        known
            .lease
            .as_ref()
            .filter(|lease| !lease.expired)
            .map(|lease| holder_url(&lease.holder).to_owned())
    }

    pub fn view(&self) -> LeaderView {
        let known = self.known();
        LeaderView {
            leader: known
                .lease
                .as_ref()
                .filter(|lease| !lease.expired)
                .map(|lease| holder_url(&lease.holder).to_owned()),
            epoch: known.lease.as_ref().map_or(known.epoch, |lease| lease.epoch),
            lease_until_ms: known.lease.as_ref().map(|lease| lease.expires_at_ms),
            this: self.this.clone(),
            role: known.role,
        }
    }

    /// Tries once to take the lease; on success this repairer leads and its store writes under
    /// the new epoch. Returns the lease taken, with the one it replaced.
    pub async fn try_lead(self: &Arc<Self>) -> Result<Option<(Lease, Option<Lease>)>, StoreError> {
        let sent = Instant::now();
        let this = self.clone();
        let (previous, taken) = blocking(move || {
            let previous = this.store.current_lease()?;
            let taken = this.store.acquire(&this.holder, this.config.lease)?;
            Ok((previous, taken))
        })
        .await?;
        let mut known = self.known();
        match taken {
            Some(lease) => {
                self.store.allow_writes_until(self.write_deadline(sent));
                *known =
                    Known { role: Role::Leader, lease: Some(lease.clone()), epoch: lease.epoch };
                Ok(Some((lease, previous)))
            }
            None => {
                known.lease = previous;
                Ok(None)
            }
        }
    }

    /// Reads the lease again (a standby, for its answers).
    pub async fn refresh(self: &Arc<Self>) -> Result<(), StoreError> {
        let this = self.clone();
        let lease = blocking(move || this.store.current_lease()).await?;
        self.known().lease = lease;
        Ok(())
    }

    /// When the leader's writes stop if the renewal sent at `sent` is the last.
    fn write_deadline(&self, sent: Instant) -> Instant {
        sent + self.config.lease * 4 / 5
    }

    /// Renews the lease every `renew` until it is lost; then closes the store's writes and says
    /// why on [`Leadership::lost`]. Runs on the leader.
    pub async fn keep(self: Arc<Self>) {
        let mut until = Instant::now() + self.config.lease * 4 / 5;
        loop {
            // The next renewal, and after a failed one no later than the write deadline: a
            // leader cut from the store steps down as its writes close, not a period later.
            let next =
                self.config.renew_every().min(until.saturating_duration_since(Instant::now()));
            tokio::select! {
                () = tokio::time::sleep(next) => {}
                why = self.store.fenced() => {
                    self.step_down(LostLeadership::Fenced(why.to_string()));
                    return;
                }
            }
            let sent = Instant::now();
            let this = self.clone();
            // A store that does not answer (packets dropped) is waited on no longer than the
            // write deadline, or one renewal period once that has passed.
            let wait = until.saturating_duration_since(sent).max(self.config.renew_every());
            let renewal = blocking(move || this.store.acquire(&this.holder, this.config.lease));
            let renewed = tokio::time::timeout(wait, renewal).await.unwrap_or_else(|_| {
                Err(StoreError::Timeout {
                    operation: "renew the lease",
                    location: "the shared store".to_owned(),
                    after: wait,
                })
            });
            let epoch = self.epoch();
            let outcome = match renewed {
                Ok(Some(lease)) if lease.epoch == epoch => {
                    until = self.write_deadline(sent);
                    self.store.allow_writes_until(until);
                    self.known().lease = Some(lease);
                    continue;
                }
                // Taken again under a new epoch: it had lapsed, so another may have led between.
                Ok(Some(lease)) => LostLeadership::NotRenewed(format!(
                    "it lapsed (epoch {epoch} became {})",
                    lease.epoch
                )),
                Ok(None) => match self.store.current_lease() {
                    Ok(Some(lease)) => LostLeadership::Taken {
                        holder: holder_url(&lease.holder).to_owned(),
                        epoch: lease.epoch,
                    },
                    _ => LostLeadership::Taken { holder: "another repairer".to_owned(), epoch },
                },
                Err(StoreError::Fenced { epoch, newer, .. }) => LostLeadership::Taken {
                    holder: format!("a repairer at epoch {newer} (this one led at {epoch})"),
                    epoch: newer,
                },
                Err(err) if Instant::now() < until => {
                    tracing::warn!(error = %err, "renewing the leadership lease failed; trying again");
                    continue;
                }
                Err(err) => LostLeadership::NotRenewed(err.to_string()),
            };
            self.step_down(outcome);
            return;
        }
    }

    /// Stops this repairer's writes and says why (once).
    pub fn step_down(&self, why: LostLeadership) {
        self.store.close_writes();
        self.known().role = Role::Standby;
        tracing::error!(reason = %why, epoch = self.epoch(), "this repairer no longer leads: stopping");
        self.lost.send_if_modified(|lost| {
            if lost.is_some() {
                return false;
            }
            *lost = Some(why);
            true
        });
    }

    /// Resolves with the reason once this repairer stopped leading.
    pub async fn lost(&self) -> LostLeadership {
        let mut lost = self.lost.subscribe();
        loop {
            if let Some(why) = lost.borrow_and_update().clone() {
                return why;
            }
            if lost.changed().await.is_err() {
                // The sender lives as long as `self`.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Gives the lease up (a clean stop: a standby takes over at its next poll).
    pub fn release(&self) {
        if self.role() != Role::Leader {
            return;
        }
        self.store.close_writes();
        match self.store.release(&self.holder) {
            Ok(()) => tracing::info!("leadership lease released"),
            Err(err) => {
                tracing::warn!(error = %err, "releasing the leadership lease failed: a standby takes over once it lapses")
            }
        }
    }
}

/// Runs a store call off the async workers (a database that does not answer holds the call up
/// to its deadlines).
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(call).await.unwrap_or_else(|err| {
        tracing::error!(error = %err, "a leadership call did not finish");
        Err(StoreError::NotLeader { operation: "leadership call" })
    })
}
