//! Due timers in firing order (SPEC §3: by due time, ties in creation order).
//!
//! Timers sit in buckets of one second of due time. Only the earliest bucket is kept sorted (ascending,
//! in a deque, so the next timer is at its front) and it is held apart; a later bucket is a plain list
//! in a hash map by second, sorted once when it becomes the earliest, and a min-heap of the later
//! seconds says which one that is. The engine only ever adds a timer and takes the earliest: adding is a
//! hash lookup and a push onto a bucket that is usually in cache, taking is a pop from the front of the
//! earliest bucket, and timers stay inline in their bucket, read in the order they fire. A timer added
//! to the earliest bucket is inserted at its place; the deque shifts the shorter side, and a new timer
//! usually falls due after most of the bucket's, so that is near the back. (A binary heap per bucket,
//! logarithmic whatever the order, measured ≈ 3 % slower on the benchmark.)
//!
//! Measured on the engine benchmark: the 4-ary heap over a slab this replaced spent ≈ 7 % of the time in
//! its sift-down and the slab's random slot reads; an ordered map of single timers (the first version)
//! ≈ 9 % of the instructions per input; an ordered map of the buckets (the version before this one)
//! ≈ 340 instructions per insertion, walking the tree to the bucket. Snapshots list the timers sorted,
//! in the `[[due, creation], timer]` form they always had, so a snapshot is the same bytes whichever
//! structure wrote it.

use crate::time::Timestamp;
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// The firing position of a timer: its due time, then its creation number.
pub type TimerKey = (Timestamp, u64);

/// Due time covered by one bucket. Timers fall due at event times spread over seconds to hours; a
/// second keeps buckets short (tens of timers on the benchmark) and their number in the thousands.
const BUCKET_MS: i64 = 1_000;

/// Room a later bucket starts with: a bucket holds tens of timers on the benchmark, so it is not grown
/// (and copied) from four at a time, and a bucket of a few timers wastes at most this many slots.
const LATER_BUCKET_TIMERS_FIRST: usize = 16;

fn bucket_of(due: Timestamp) -> i64 {
    due.millis().div_euclid(BUCKET_MS)
}

/// The earliest bucket: its second and its timers, sorted by key.
#[derive(Clone, Debug)]
struct First<T> {
    second: i64,
    entries: VecDeque<(TimerKey, T)>,
}

impl<T> First<T> {
    /// The bucket of a later second, which becomes the earliest: sorted now.
    fn from_later(second: i64, mut entries: Vec<(TimerKey, T)>) -> First<T> {
        // Keys are unique, so an unstable sort is deterministic.
        entries.sort_unstable_by_key(|(key, _)| *key);
        First { second, entries: VecDeque::from(entries) }
    }

    /// Adds an entry at its place. A deque shifts the shorter side; a new timer usually falls due after
    /// most of the bucket's, so it goes in at or near the back.
    fn add(&mut self, key: TimerKey, timer: T) {
        let position = self.entries.partition_point(|(other, _)| *other < key);
        self.entries.insert(position, (key, timer));
    }
}

/// Timers by (due, creation), earliest first. Keys are unique: callers number timers as they create them.
#[derive(Clone, Debug)]
pub struct TimerQueue<T> {
    /// The earliest bucket; never empty. None when there is no timer.
    first: Option<First<T>>,
    /// Every later bucket by second, unsorted; none is empty.
    later: HashMap<i64, Vec<(TimerKey, T)>>,
    /// The seconds of `later`'s buckets, earliest on top.
    later_seconds: BinaryHeap<Reverse<i64>>,
    len: usize,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        TimerQueue { first: None, later: HashMap::default(), later_seconds: BinaryHeap::new(), len: 0 }
    }
}

impl<T> TimerQueue<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a timer. Its key must be new: callers number timers as they create them, and a restored
    /// queue refuses a key given twice.
    pub fn insert(&mut self, key: TimerKey, timer: T) {
        let second = bucket_of(key.0);
        self.len += 1;
        match &mut self.first {
            Some(first) if first.second == second => first.add(key, timer),
            Some(first) if first.second < second => self.add_later(second, key, timer),
            _ => {
                // An earlier second than every bucket's (or the first timer): its bucket is the earliest
                // now, and the one that was goes back among the later ones, as a plain list.
                let new_first = First { second, entries: VecDeque::from([(key, timer)]) };
                if let Some(previous) = self.first.replace(new_first) {
                    self.later_seconds.push(Reverse(previous.second));
                    self.later.insert(previous.second, Vec::from(previous.entries));
                }
            }
        }
        debug_assert_eq!(self.later.len(), self.later_seconds.len());
    }

    fn add_later(&mut self, second: i64, key: TimerKey, timer: T) {
        let bucket = self.later.entry(second).or_insert_with(|| {
            self.later_seconds.push(Reverse(second));
            Vec::with_capacity(LATER_BUCKET_TIMERS_FIRST)
        });
        bucket.push((key, timer));
    }

    /// The key of the timer that fires next.
    pub fn first_key(&self) -> Option<TimerKey> {
        self.first.as_ref().and_then(|first| first.entries.front()).map(|(key, _)| *key)
    }

    /// The timer that fires next.
    pub fn first_value(&self) -> Option<&T> {
        self.first.as_ref().and_then(|first| first.entries.front()).map(|(_, timer)| timer)
    }

    /// Takes the timer that fires next.
    pub fn pop_first(&mut self) -> Option<(TimerKey, T)> {
        let first = self.first.as_mut()?;
        let entry = first.entries.pop_front();
        debug_assert!(entry.is_some(), "an empty earliest bucket was kept");
        if first.entries.is_empty() {
            self.first = self.later_seconds.pop().map(|Reverse(second)| {
                let entries = self.later.remove(&second).unwrap_or_default();
                debug_assert!(!entries.is_empty(), "a later second without its bucket");
                First::from_later(second, entries)
            });
        }
        self.len -= 1;
        entry
    }

    /// Every timer, in no particular order (checks and metrics; firing goes through `pop_first`).
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.entries().map(|(_, timer)| timer)
    }

    /// Every timer in firing order.
    pub fn sorted(&self) -> Vec<(TimerKey, &T)> {
        let mut entries: Vec<(TimerKey, &T)> = self.entries().map(|(key, timer)| (*key, timer)).collect();
        entries.sort_unstable_by_key(|(key, _)| *key);
        entries
    }

    /// Every entry, the earliest bucket's first, then the later buckets' in no particular order.
    fn entries(&self) -> impl Iterator<Item = &(TimerKey, T)> {
        let first = self.first.iter().flat_map(|first| first.entries.iter());
        first.chain(self.later.values().flatten())
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
        /// order and however insertions and firings interleave. Due times are tenths of a second, so
        /// a bucket holds several due times and a timer may land before, in or after the bucket
        /// being drained.
        #[test]
        fn fires_in_due_then_creation_order(steps in proptest::collection::vec((0i64..50, any::<bool>()), 1..200)) {
            check_against_ordered_map(steps)?;
        }

        /// The same over a minute of due times (sixty buckets): a timer may land in a later bucket, in
        /// the earliest one, or before every bucket, which then becomes the earliest.
        #[test]
        fn fires_in_order_across_many_buckets(steps in proptest::collection::vec((0i64..600, any::<bool>()), 1..300)) {
            check_against_ordered_map(steps)?;
        }
    }

    /// Inserts a timer due at each step's tenth of a second (firing one when the step says so) into the
    /// queue and into an ordered map; both must agree at every step, in snapshots and after a restore.
    fn check_against_ordered_map(steps: Vec<(i64, bool)>) -> Result<(), TestCaseError> {
        let mut queue = TimerQueue::new();
        let mut model = std::collections::BTreeMap::new();
        for (created, (tenths, fire)) in steps.into_iter().enumerate() {
            let key = (Timestamp::from_millis(tenths * 100), created as u64);
            queue.insert(key, created);
            model.insert(key, created);
            if fire {
                prop_assert_eq!(queue.pop_first(), model.pop_first());
            }
            prop_assert_eq!(queue.first_key(), model.keys().next().copied());
            prop_assert_eq!(queue.first_value(), model.values().next());
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
        Ok(())
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let json = serde_json::to_string(&[((at(1), 7u64), 1u8), ((at(1), 7u64), 2u8)]).expect("serialize");
        let error = serde_json::from_str::<TimerQueue<u8>>(&json).expect_err("duplicate key");
        assert!(error.to_string().contains("given twice"), "{error}");
    }
}
