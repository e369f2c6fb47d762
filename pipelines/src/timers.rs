//! Due timers in firing order (SPEC §3: by due time, ties in creation order).
//!
//! A heap rather than an ordered map: the engine only ever adds a timer and takes the earliest, and a
//! heap does both without the node splits and element shifts of a B-tree (measured on the engine
//! benchmark: the B-tree's insert and `pop_first` were ≈ 9 % of the instructions per input). The heap
//! is 4-ary: a replay keeps tens of thousands of timers pending, and taking the earliest walks the
//! heap from top to bottom; with four children per node that walk is half as deep, and a node's
//! children sit in one or two cache lines (measured: `std`'s binary heap's `pop` was ≈ 5 % of the
//! benchmark's time, mostly cache misses). Snapshots still list the timers sorted, in the
//! `[[due, creation], timer]` form they always had, so a snapshot is the same bytes whichever
//! structure wrote it.

use crate::time::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The firing position of a timer: its due time, then its creation number.
pub type TimerKey = (Timestamp, u64);

/// A heap entry: the key and where the timer is kept. Small (24 bytes), so that sifting moves little:
/// timers themselves are ≈ 70 bytes and stay put in their slot.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: TimerKey,
    slot: usize,
}

/// A 4-ary min-heap of entries by key: node `i`'s children are `4i + 1 ..= 4i + 4`.
#[derive(Clone, Debug, Default)]
struct QuaternaryHeap {
    entries: Vec<Entry>,
}

impl QuaternaryHeap {
    const ARITY: usize = 4;

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn peek(&self) -> Option<&Entry> {
        self.entries.first()
    }

    fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    fn push(&mut self, entry: Entry) {
        let mut index = self.entries.len();
        self.entries.push(entry);
        // Sift up: move parents down until the new entry's place is found.
        while index > 0 {
            let parent = (index - 1) / Self::ARITY;
            if self.entries[parent].key <= entry.key {
                break;
            }
            self.entries[index] = self.entries[parent];
            index = parent;
        }
        self.entries[index] = entry;
    }

    fn pop(&mut self) -> Option<Entry> {
        let last = self.entries.pop()?;
        let Some(&top) = self.entries.first() else { return Some(last) };
        // Sift the former last entry down from the root: move the least child up while it is less.
        let length = self.entries.len();
        let mut index = 0;
        loop {
            let first_child = index * Self::ARITY + 1;
            if first_child >= length {
                break;
            }
            let children = first_child..(first_child + Self::ARITY).min(length);
            let least = children.min_by_key(|&child| self.entries[child].key).unwrap_or(first_child);
            if self.entries[least].key >= last.key {
                break;
            }
            self.entries[index] = self.entries[least];
            index = least;
        }
        self.entries[index] = last;
        Some(top)
    }
}

/// Timers by (due, creation), earliest first. Keys are unique: callers number timers as they create them.
#[derive(Clone, Debug)]
pub struct TimerQueue<T> {
    heap: QuaternaryHeap,
    /// Timers by slot; `None` for a free slot (listed in `free`).
    slots: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        TimerQueue { heap: QuaternaryHeap::default(), slots: Vec::new(), free: Vec::new() }
    }
}

impl<T> TimerQueue<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Adds a timer. Its key must be new: callers number timers as they create them, and a restored
    /// queue refuses a key given twice.
    pub fn insert(&mut self, key: TimerKey, timer: T) {
        let slot = match self.free.pop() {
            Some(slot) => {
                debug_assert!(self.slots[slot].is_none());
                self.slots[slot] = Some(timer);
                slot
            }
            None => {
                let slot = self.slots.len();
                self.slots.push(Some(timer));
                slot
            }
        };
        self.heap.push(Entry { key, slot });
        debug_assert_eq!(self.heap.len() + self.free.len(), self.slots.len());
    }

    /// The key of the timer that fires next.
    pub fn first_key(&self) -> Option<TimerKey> {
        self.heap.peek().map(|entry| entry.key)
    }

    /// Takes the timer that fires next.
    pub fn pop_first(&mut self) -> Option<(TimerKey, T)> {
        let entry = self.heap.pop()?;
        let timer = self.slots[entry.slot].take();
        debug_assert!(timer.is_some(), "a heap entry points at a free slot");
        self.free.push(entry.slot);
        if self.heap.is_empty() {
            // Nothing pending: drop the slots, so a burst of timers does not pin its memory.
            self.slots.clear();
            self.free.clear();
        }
        timer.map(|timer| (entry.key, timer))
    }

    /// Every timer, in no particular order (checks and metrics; firing goes through `pop_first`).
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// Every timer in firing order.
    pub fn sorted(&self) -> Vec<(TimerKey, &T)> {
        let mut entries: Vec<(TimerKey, &T)> = self
            .heap
            .iter()
            .filter_map(|entry| self.slots[entry.slot].as_ref().map(|timer| (entry.key, timer)))
            .collect();
        entries.sort_unstable_by_key(|(key, _)| *key);
        entries
    }
}

impl<T: Serialize> Serialize for TimerQueue<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.sorted())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TimerQueue<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut pairs = Vec::<(TimerKey, T)>::deserialize(deserializer)?;
        pairs.sort_unstable_by_key(|(key, _)| *key);
        if pairs.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return Err(serde::de::Error::custom("a timer key is given twice"));
        }
        let mut queue = TimerQueue::new();
        for (key, timer) in pairs {
            queue.insert(key, timer);
        }
        Ok(queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1000)
    }

    proptest! {
        /// Firing order equals the order of an ordered map of the same timers, whatever the insertion
        /// order and however insertions and firings interleave.
        #[test]
        fn fires_in_due_then_creation_order(steps in proptest::collection::vec((0i64..50, any::<bool>()), 1..200)) {
            let mut queue = TimerQueue::new();
            let mut model = std::collections::BTreeMap::new();
            for (created, (due, fire)) in steps.into_iter().enumerate() {
                let key = (at(due), created as u64);
                queue.insert(key, created);
                model.insert(key, created);
                if fire {
                    prop_assert_eq!(queue.pop_first(), model.pop_first());
                }
                prop_assert_eq!(queue.first_key(), model.keys().next().copied());
                prop_assert_eq!(queue.len(), model.len());
            }
            let sorted: Vec<_> = queue.sorted().into_iter().map(|(key, timer)| (key, *timer)).collect();
            let expected: Vec<_> = model.clone().into_iter().collect();
            prop_assert_eq!(&sorted, &expected);
            let json = serde_json::to_string(&queue).expect("serialize");
            prop_assert_eq!(&json, &serde_json::to_string(&expected).expect("serialize the model"));
            let mut restored: TimerQueue<usize> = serde_json::from_str(&json).expect("deserialize");
            while let Some(entry) = model.pop_first() {
                prop_assert_eq!(restored.pop_first(), Some(entry));
            }
            prop_assert!(restored.is_empty());
        }
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let json = serde_json::to_string(&[((at(1), 7u64), 1u8), ((at(1), 7u64), 2u8)]).expect("serialize");
        let error = serde_json::from_str::<TimerQueue<u8>>(&json).expect_err("duplicate key");
        assert!(error.to_string().contains("given twice"), "{error}");
    }
}
