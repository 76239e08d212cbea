//! A set of node slots as bits: an attempt's 2,000 ranks are looked up, removed and counted
//! without a tree.

/// Slots, one bit each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotSet {
    words: Vec<u64>,
    len: usize,
}

impl SlotSet {
    pub fn from_slots(slots: &[u32]) -> SlotSet {
        let mut set = SlotSet::default();
        for slot in slots {
            set.insert(*slot);
        }
        set
    }

    pub fn insert(&mut self, slot: u32) {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        if self.words[word] & bit == 0 {
            self.words[word] |= bit;
            self.len += 1;
        }
    }

    pub fn remove(&mut self, slot: u32) -> bool {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        match self.words.get_mut(word) {
            Some(w) if *w & bit != 0 => {
                *w &= !bit;
                self.len -= 1;
                true
            }
            _ => false,
        }
    }

    pub fn contains(&self, slot: u32) -> bool {
        self.words.get(slot as usize / 64).is_some_and(|w| w & (1u64 << (slot % 64)) != 0)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.words.clear();
        self.len = 0;
    }

    /// The slots in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, word)| {
            let mut rest = *word;
            std::iter::from_fn(move || {
                (rest != 0).then(|| {
                    let bit = rest.trailing_zeros();
                    rest &= rest - 1;
                    i as u32 * 64 + bit
                })
            })
        })
    }

    /// How many of these slots `other` lacks.
    pub fn count_not_in(&self, other: &SlotSet) -> usize {
        self.words
            .iter()
            .enumerate()
            .map(|(i, w)| (w & !other.words.get(i).copied().unwrap_or(0)).count_ones() as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_set_holds_inserts_and_removals_and_counts_what_another_lacks() {
        let mut set = SlotSet::from_slots(&[3, 64, 1000, 3]);
        assert_eq!(set.len(), 3);
        assert!(set.contains(64) && set.contains(1000) && !set.contains(65));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![3, 64, 1000]);
        assert!(set.remove(64));
        assert!(!set.remove(64), "removed once");
        assert!(!set.remove(100_000), "beyond the last word");
        assert_eq!(set.len(), 2);
        let other = SlotSet::from_slots(&[3, 7]);
        assert_eq!(set.count_not_in(&other), 1);
        assert_eq!(other.count_not_in(&set), 1);
        set.clear();
        assert!(set.is_empty() && set.iter().next().is_none());
    }
}
