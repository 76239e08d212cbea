//! The breaker: when many nodes turn unhealthy together (a bad driver rollout, a storage outage),
//! it opens and stops every automatic action until a person closes it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use crate::model::{Actor, Event, EventKind, Severity};
use crate::policy::{self, GuardRails};
use crate::ports::EventLog;
use crate::store::StoreError;

/// The breaker as stored and shown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BreakerState {
    pub open: bool,
    pub opened_ms: Option<u64>,
    pub reason: String,
}

const BREAKER_KEY: &str = "breaker";

/// The breaker, kept in the store.
#[derive(Debug)]
pub struct Breaker {
    state: Mutex<BreakerState>,
    events: Arc<EventLog>,
}

impl Breaker {
    pub fn load(events: Arc<EventLog>) -> Result<Breaker, StoreError> {
        let state = events.store().setting(BREAKER_KEY)?.unwrap_or_default();
        Ok(Breaker { state: Mutex::new(state), events })
    }

    fn lock(&self) -> MutexGuard<'_, BreakerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn state(&self) -> BreakerState {
        self.lock().clone()
    }

    pub fn is_open(&self) -> bool {
        self.lock().open
    }

    /// Opens the breaker when a storm is under way (`recent` of `members` nodes turned unhealthy
    /// within the window); returns whether it is open. The event is written before it opens.
    pub fn check(
        &self,
        members: u32,
        recent: u32,
        guard: &GuardRails,
        now: u64,
    ) -> Result<bool, StoreError> {
        let mut breaker = self.lock();
        if breaker.open {
            return Ok(true);
        }
        if !policy::breaker_trips(recent, members, guard) {
            return Ok(false);
        }
        let reason = format!(
            "{recent} of {members} nodes turned unhealthy within {}: automatic action stopped until a person closes the breaker",
            humantime::format_duration(guard.breaker_window)
        );
        let opened = BreakerState { open: true, opened_ms: Some(now), reason: reason.clone() };
        self.events.record(&Event::new(
            EventKind::Breaker,
            Severity::Critical,
            None,
            Actor::repairer(),
            reason,
            now,
        ))?;
        let store = self.events.store();
        self.events.write("put_setting", store.put_setting(BREAKER_KEY, &opened))?;
        *breaker = opened;
        tracing::error!("breaker opened");
        Ok(true)
    }

    /// A person closes the breaker; false when it was not open.
    pub fn close(&self, who: &str, now: u64) -> Result<bool, StoreError> {
        let mut breaker = self.lock();
        if !breaker.open {
            return Ok(false);
        }
        self.events.record(&Event::new(
            EventKind::Breaker,
            Severity::Info,
            None,
            Actor::person(who),
            "breaker closed",
            now,
        ))?;
        let closed = BreakerState::default();
        let store = self.events.store();
        self.events.write("put_setting", store.put_setting(BREAKER_KEY, &closed))?;
        *breaker = closed;
        Ok(true)
    }
}
