//! Wakes the workflows that a change may let go on, and only those: a report with a new boot, a
//! first report or a command's result wakes the workflows of that node (or waiting for it as a
//! replacement); the breaker closing wakes every one. Waking every waiting workflow on every such
//! report made each report cost as many passes as there were open repairs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;

/// The bells of the waiting workflows, by the node names each waits on.
#[derive(Debug, Default)]
pub struct Progress {
    bells: Mutex<Bells>,
}

#[derive(Debug, Default)]
struct Bells {
    by_node: HashMap<String, Vec<Weak<Notify>>>,
    /// Entries at the last sweep of the dropped bells: the next sweep comes when they double.
    swept_at: usize,
}

impl Progress {
    pub fn new() -> Arc<Progress> {
        Arc::new(Progress::default())
    }

    fn lock(&self) -> MutexGuard<'_, Bells> {
        self.bells.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A bell that rings when something happens on any of `nodes` (or everywhere). Its waiter
    /// holds it; dropped, it is forgotten.
    pub fn bell(&self, nodes: &[&str]) -> Arc<Notify> {
        let bell = Arc::new(Notify::new());
        let mut bells = self.lock();
        for node in nodes {
            bells.by_node.entry((*node).to_owned()).or_default().push(Arc::downgrade(&bell));
        }
        let entries = bells.by_node.len();
        if entries > 2 * bells.swept_at + 64 {
            bells.by_node.retain(|_, list| {
                list.retain(|b| b.strong_count() > 0);
                !list.is_empty()
            });
            bells.swept_at = bells.by_node.len();
        }
        bell
    }

    /// Something happened on `node`: its waiters look again.
    pub fn ring(&self, node: &str) {
        let live: Vec<Arc<Notify>> = {
            let mut bells = self.lock();
            let Some(list) = bells.by_node.get_mut(node) else { return };
            list.retain(|b| b.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for bell in live {
            bell.notify_waiters();
        }
    }

    /// Something happened that any workflow may wait on (the breaker closed).
    pub fn ring_all(&self) {
        let live: Vec<Arc<Notify>> =
            self.lock().by_node.values().flatten().filter_map(Weak::upgrade).collect();
        for bell in live {
            bell.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `bell` has rung since `notified` was enabled.
    fn rang(notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::future::Future::poll(notified, &mut cx).is_ready()
    }

    #[test]
    fn a_ring_wakes_the_bells_of_its_node_only_and_ring_all_wakes_every_one() {
        let progress = Progress::new();
        let mine = progress.bell(&["node-1", "node-9"]);
        let other = progress.bell(&["node-2"]);
        let ring = |which: &dyn Fn()| {
            let (a, b) = (mine.notified(), other.notified());
            tokio::pin!(a, b);
            a.as_mut().enable();
            b.as_mut().enable();
            which();
            (rang(a), rang(b))
        };
        assert_eq!(ring(&|| progress.ring("node-1")), (true, false));
        assert_eq!(ring(&|| progress.ring("node-9")), (true, false), "the replacement's name too");
        assert_eq!(ring(&|| progress.ring("node-2")), (false, true));
        assert_eq!(ring(&|| progress.ring("node-3")), (false, false));
        assert_eq!(ring(&|| progress.ring_all()), (true, true));
    }

    #[test]
    fn dropped_bells_are_forgotten() {
        let progress = Progress::new();
        for i in 0..1_000 {
            drop(progress.bell(&[&format!("node-{i}")]));
        }
        let kept = progress.bell(&["node-kept"]);
        progress.ring("node-kept");
        let entries = progress.lock().by_node.len();
        assert!(entries < 200, "{entries} entries kept for 1 live bell");
        assert!(progress.lock().by_node.contains_key("node-kept"));
        drop(kept);
    }
}
