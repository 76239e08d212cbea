//! The engine's nodes that are not healthy (less the retired), read once per fleet generation
//! and kept by slot as well as by name: the gang scheduler reads them on every change of the
//! fleet and every placement, and a 100,000-node fleet changes ~2,500 times a day.

use std::collections::BTreeMap;
use std::sync::Arc;

use fleetmend_repairer::model::NodeState;

use super::World;

/// One generation's not-healthy nodes.
#[derive(Debug, Default)]
pub struct NotHealthy {
    generation: u64,
    by_name: BTreeMap<String, NodeState>,
    /// The slot of each node of `by_name`, in its order: none for a node no longer in one.
    slots: Vec<Option<u32>>,
}

impl NotHealthy {
    /// Read at no generation yet.
    pub fn unread() -> NotHealthy {
        NotHealthy { generation: u64::MAX, ..NotHealthy::default() }
    }

    /// The nodes in a slot now, by slot, and their states.
    pub fn in_slots(&self) -> impl Iterator<Item = (u32, NodeState)> + '_ {
        self.slots
            .iter()
            .zip(self.by_name.values())
            .filter_map(|(slot, state)| Some(((*slot)?, *state)))
    }
}

impl World {
    /// [`FleetView::not_healthy_in_service`], read again only when the fleet's generation moved.
    /// A node's slot is looked up only when it was not among the last generation's (a node
    /// leaves its slot for good when it is replaced).
    ///
    /// [`FleetView::not_healthy_in_service`]: fleetmend_repairer::ports::FleetView
    pub(super) fn not_healthy(&self) -> Arc<NotHealthy> {
        let generation = self.fleet.generation();
        let mut cached = self.not_healthy.borrow_mut();
        if cached.generation == generation {
            return cached.clone();
        }
        let by_name = self.fleet.not_healthy_in_service();
        let mut before = cached.by_name.keys().zip(&cached.slots).peekable();
        let slots = by_name
            .keys()
            .map(|name| {
                while before.next_if(|(known, _)| known.as_str() < name.as_str()).is_some() {}
                let current = |slot: u32| self.slots.get(slot as usize).is_some_and(|n| n == name);
                match before.next_if(|(known, _)| *known == name) {
                    Some((_, slot)) => slot.filter(|s| current(*s)),
                    None => self.nodes.get(name).map(|n| n.slot).filter(|s| current(*s)),
                }
            })
            .collect();
        *cached = Arc::new(NotHealthy { generation, by_name, slots });
        cached.clone()
    }
}
