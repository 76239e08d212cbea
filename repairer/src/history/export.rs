//! The export: a store's audit trail over a time window, folded into its faults, bounded.
//!
//! The events are read in id order from the first one written at `since - LOOKBACK_MS` (found by
//! a binary search over the ids: the trail is written in time order) until the first one written
//! at `until` or later. The look-back finds the start of a fault decided about early in the
//! window (its node turned suspect before). Reading stops with an error past [`MAX_SCANNED`]
//! events, and a window with more than the limit's faults is refused rather than cut short: a
//! replay of part of a window would price the wrong month.

use super::{FaultHistory, HISTORY_VERSION, fold::Fold};
use crate::store::{Store, StoreError};

/// Faults an export holds unless asked for fewer or more.
pub const DEFAULT_LIMIT: usize = 10_000;
/// The most faults one export holds.
pub const MAX_LIMIT: usize = 100_000;
/// How long before `since` the export reads, for the start of the window's first faults: a day.
pub const LOOKBACK_MS: u64 = 86_400_000;
/// The most events one export reads.
pub const MAX_SCANNED: usize = 5_000_000;
/// Events read per query.
const PAGE: usize = 10_000;

/// The export could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("limit {limit} is not 1 to {MAX_LIMIT}")]
    Limit { limit: usize },
    #[error(
        "the window holds more than {limit} faults (the limit): export a shorter window (since, until) or raise the limit (at most {MAX_LIMIT})"
    )]
    TooManyFaults { limit: usize },
    #[error(
        "the window holds more than {MAX_SCANNED} events of the audit trail to read: export a shorter window (since, until)"
    )]
    TooManyEvents,
    #[error("reading the audit trail: {0}")]
    Store(#[from] StoreError),
}

/// The faults of `store`'s audit trail first decided about in `[since_ms, until_ms)`, at most
/// `limit` of them.
pub fn export(
    store: &Store,
    since_ms: u64,
    until_ms: u64,
    limit: usize,
) -> Result<FaultHistory, HistoryError> {
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(HistoryError::Limit { limit });
    }
    // A window that ends before it starts holds nothing.
    if since_ms >= until_ms {
        return Ok(FaultHistory {
            version: HISTORY_VERSION,
            since_ms,
            until_ms,
            faults: Vec::new(),
        });
    }
    let mut after = first_at_or_after(store, since_ms.saturating_sub(LOOKBACK_MS))?;
    let mut fold = Fold::default();
    let mut scanned = 0usize;
    'pages: loop {
        let events = store.events(after, None, PAGE)?;
        let Some(last) = events.last() else { break };
        after = last.id;
        for event in &events {
            if event.at_ms >= until_ms {
                break 'pages;
            }
            scanned += 1;
            if scanned > MAX_SCANNED {
                return Err(HistoryError::TooManyEvents);
            }
            fold.take(event);
        }
    }
    let faults = fold.finish(since_ms, until_ms);
    if faults.len() > limit {
        return Err(HistoryError::TooManyFaults { limit });
    }
    Ok(FaultHistory { version: HISTORY_VERSION, since_ms, until_ms, faults })
}

/// The id to read after for the first event written at `at_ms` or later: a binary search over
/// the ids (which may have gaps), taking the trail to be written in time order.
pub(super) fn first_at_or_after(store: &Store, at_ms: u64) -> Result<i64, StoreError> {
    let newest = store.newest_event_id()?;
    // The smallest id whose first event at or after it is written at `at_ms` or later.
    let (mut low, mut high) = (1i64, newest.saturating_add(1));
    while low < high {
        let middle = low + (high - low) / 2;
        let written = store.events(middle - 1, None, 1)?.first().map(|e| e.at_ms);
        match written {
            Some(written) if written < at_ms => low = middle + 1,
            _ => high = middle,
        }
    }
    Ok(low - 1)
}
