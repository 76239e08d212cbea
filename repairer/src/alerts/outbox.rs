//! The outbox is the audit event log itself: each sink keeps a cursor (the id of the last event it
//! delivered or skipped) in the store's settings and reads the events after it in id order. An
//! event is in the log before anything acts on it, so a repairer killed at any point loses no
//! alert; a crash between a delivery and its cursor update re-sends that one event, under the same
//! idempotency key.

use crate::model::Event;
use crate::store::{Store, StoreError};

/// The settings key of `sink`'s cursor.
pub fn cursor_key(sink: &str) -> String {
    format!("alerts.cursor.{sink}")
}

/// The cursor of `sink`, if it has one.
pub fn cursor(store: &Store, sink: &str) -> Result<Option<i64>, StoreError> {
    store.setting::<i64>(&cursor_key(sink))
}

/// Moves `sink`'s cursor to `event_id` (delivered or skipped).
pub fn advance(store: &Store, sink: &str, event_id: i64) -> Result<(), StoreError> {
    store.put_setting(&cursor_key(sink), &event_id)
}

/// The id of the newest event in the log (0 when it is empty).
pub fn newest_event_id(store: &Store) -> Result<i64, StoreError> {
    store.newest_event_id()
}

/// The cursor of `sink`, creating it when the sink is new: at the start of the log when
/// `from_start`, else at its current end (a sink added to a repairer with a year of history
/// should not page for all of it). Saved at once, so events appended before the first delivery
/// loop runs are not skipped.
pub fn open_cursor(store: &Store, sink: &str, from_start: bool) -> Result<i64, StoreError> {
    if let Some(cursor) = cursor(store, sink)? {
        return Ok(cursor);
    }
    let start = if from_start { 0 } else { newest_event_id(store)? };
    advance(store, sink, start)?;
    Ok(start)
}

/// The next events after `cursor`, oldest first, at most `batch`.
pub fn next_events(store: &Store, cursor: i64, batch: usize) -> Result<Vec<Event>, StoreError> {
    store.events(cursor, None, batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Actor, EventKind, Severity};

    fn event(reason: &str) -> Event {
        Event::new(
            EventKind::StateChanged,
            Severity::Warning,
            Some("n1"),
            Actor::repairer(),
            reason,
            1,
        )
    }

    #[test]
    fn a_new_sink_starts_at_the_end_unless_told_to_start_at_the_beginning() {
        let store = Store::in_memory().unwrap();
        assert_eq!(newest_event_id(&store).unwrap(), 0);
        store.append_event(&event("a")).unwrap();
        let last = store.append_event(&event("b")).unwrap();
        assert_eq!(newest_event_id(&store).unwrap(), last);
        assert_eq!(open_cursor(&store, "late", false).unwrap(), last);
        assert_eq!(open_cursor(&store, "replay", true).unwrap(), 0);
        // Opening again keeps the saved cursor.
        store.append_event(&event("c")).unwrap();
        assert_eq!(open_cursor(&store, "late", false).unwrap(), last);
        advance(&store, "late", last + 1).unwrap();
        assert_eq!(cursor(&store, "late").unwrap(), Some(last + 1));
        assert!(next_events(&store, last + 1, 10).unwrap().is_empty());
        assert_eq!(next_events(&store, 0, 10).unwrap().len(), 3);
    }
}
