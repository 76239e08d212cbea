//! What the simulated fleet gives the repairer in place of real machines: the provider that
//! reboots and replaces nodes, and the heartbeats of nodes that have nothing new to report.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fleetmend_repairer::clock::{BoxFuture, SharedClock};
use fleetmend_repairer::ports::Heartbeats;
use fleetmend_repairer::provider::{PowerState, Provider, ProviderError};

/// Which nodes are down (their agents silent) and since when. A node not listed is up and heard
/// from at every report interval, as its agent's heartbeats would be.
#[derive(Debug)]
pub struct Presence {
    clock: SharedClock,
    down: Mutex<BTreeMap<String, u64>>,
}

impl Presence {
    pub fn new(clock: SharedClock) -> Arc<Presence> {
        Arc::new(Presence { clock, down: Mutex::new(BTreeMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, u64>> {
        self.down.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `node`'s agent went silent at `since_ms`.
    pub fn went_down(&self, node: &str, since_ms: u64) {
        self.lock().entry(node.to_owned()).or_insert(since_ms);
    }

    /// `node`'s agent reports again.
    pub fn came_up(&self, node: &str) {
        self.lock().remove(node);
    }

    /// `node` left the fleet (replaced): it is no longer anyone's to hear from.
    pub fn forget(&self, node: &str) {
        self.lock().remove(node);
    }

    /// The nodes down now, and since when.
    pub fn down(&self) -> BTreeMap<String, u64> {
        self.lock().clone()
    }

    /// Since when `node` has been down, if it is.
    pub fn down_since(&self, node: &str) -> Option<u64> {
        self.lock().get(node).copied()
    }

    pub fn is_down(&self, node: &str) -> bool {
        self.lock().contains_key(node)
    }
}

impl Heartbeats for Presence {
    fn last_heard_ms(&self, node: &str, _reported_ms: u64) -> u64 {
        match self.lock().get(node) {
            // Its heartbeats went on until it went down.
            Some(since) => *since,
            None => self.clock.now_ms(),
        }
    }

    fn maybe_silent_since(&self, since_ms: u64) -> Vec<String> {
        self.lock().iter().filter(|(_, down)| **down <= since_ms).map(|(n, _)| n.clone()).collect()
    }

    fn quiet(&self) -> Vec<(String, u64)> {
        self.lock().iter().map(|(node, since)| (node.clone(), *since)).collect()
    }
}

/// A provider call the simulated fleet carries out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Reboot { node: String, at_ms: u64 },
    Replace { node: String, new_node: String, at_ms: u64 },
}

/// The simulated provider: every call is accepted at once and queued for the fleet, which takes
/// the node down and brings it (or its replacement) back when the catalog says.
#[derive(Debug)]
pub struct SimProvider {
    clock: SharedClock,
    inbox: Mutex<Inbox>,
    presence: Arc<Presence>,
}

#[derive(Debug, Default)]
struct Inbox {
    requests: Vec<Request>,
    replaced: BTreeMap<String, u32>,
}

impl SimProvider {
    pub fn new(clock: SharedClock, presence: Arc<Presence>) -> Arc<SimProvider> {
        Arc::new(SimProvider { clock, inbox: Mutex::new(Inbox::default()), presence })
    }

    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The calls made since the last take, in order.
    pub fn take(&self) -> Vec<Request> {
        std::mem::take(&mut self.lock().requests)
    }
}

/// The base name of a node (`n17` of `n17-r2`) and the name of its `k`th replacement.
fn replacement_name(node: &str, k: u32) -> String {
    let base = node.split("-r").next().unwrap_or(node);
    format!("{base}-r{k}")
}

impl Provider for SimProvider {
    fn name(&self) -> &'static str {
        "simulated"
    }

    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        let at_ms = self.clock.now_ms();
        self.lock().requests.push(Request::Reboot { node: node.to_owned(), at_ms });
        Box::pin(std::future::ready(Ok(())))
    }

    fn replace<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<String, ProviderError>> {
        let at_ms = self.clock.now_ms();
        let mut inbox = self.lock();
        let base = node.split("-r").next().unwrap_or(node).to_owned();
        let k = inbox.replaced.entry(base).or_insert(0);
        *k += 1;
        let new_node = replacement_name(node, *k);
        inbox.requests.push(Request::Replace {
            node: node.to_owned(),
            new_node: new_node.clone(),
            at_ms,
        });
        Box::pin(std::future::ready(Ok(new_node)))
    }

    fn power_state<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<PowerState, ProviderError>> {
        let state = if self.presence.is_down(node) { PowerState::Off } else { PowerState::On };
        Box::pin(std::future::ready(Ok(state)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use fleetmend_repairer::clock::VirtualClock;

    #[test]
    fn up_nodes_are_heard_now_and_down_ones_since_they_went_down() {
        let clock = VirtualClock::new(1_000);
        let presence = Presence::new(clock.clone());
        presence.went_down("n2", 500);
        clock.advance_to(9_000);
        assert_eq!(presence.last_heard_ms("n1", 0), 9_000);
        assert_eq!(presence.last_heard_ms("n2", 800), 500);
        assert_eq!(presence.maybe_silent_since(600), ["n2"]);
        assert!(presence.maybe_silent_since(400).is_empty());
        presence.came_up("n2");
        assert_eq!(presence.last_heard_ms("n2", 800), 9_000);
    }

    #[test]
    fn replacements_are_named_after_the_original_node() {
        assert_eq!(replacement_name("n17", 1), "n17-r1");
        assert_eq!(replacement_name("n17-r1", 2), "n17-r2");
    }
}
