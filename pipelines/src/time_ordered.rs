//! Statement lines kept in (time, txn id) order, one per txn id: a card's statement as the simulated
//! provider keeps it, and as an agent's bill table keeps it (R-CHK-1).
//!
//! The lines sit inline in one deque in that order, and a hash map gives each txn id's time, so a line
//! is found by id with one lookup and a binary search. A statement mostly grows at its end, so a new
//! line is usually appended; the oldest leave from the front. Reading a page of the latest lines, or a
//! time window, reads neighbouring memory.
//!
//! The lines' times are kept once more, alone, in a deque beside them: searches by time read that dense
//! array (eight bytes a line) rather than one line of a hundred bytes or more per step, and compare txn
//! ids only among lines of the same time. A table is usually cold when a check reads it, so each step of
//! a search over the lines themselves was a cache miss (measured on the engine benchmark: a search's key
//! reads were ≈ 3 % of the replay's time).

use crate::time::Timestamp;
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// Txn ids a new table's index has room for. A hash map grows 3, 7, 14, 28… by rehashing every key
/// (reading each txn id again), and a card's tables reach tens of lines after a few checks: starting at
/// 32 skipped those rehashes, ≈ 1 % of the engine benchmark's instructions and ≈ 3–4 % of its time
/// (twelve paired runs), for ≈ 2 KB per table from the card's creation on. (Reserving the room at the
/// first line instead measured ≈ 1 % slower, and giving the deques the same head start ≈ 2 % slower:
/// more memory to touch for fewer copies.)
const INDEX_LINES_FIRST: usize = 32;

/// What a line is ordered and identified by. Neither may change while the line is kept.
pub trait TimeKeyed {
    fn time(&self) -> Timestamp;
    fn txn_id(&self) -> &Text;
}

/// Lines in (time, txn id) order, at most one per txn id.
#[derive(Clone, Debug)]
pub struct TimeOrdered<T> {
    lines: VecDeque<T>,
    /// `times[slot]` is `lines[slot].time()`.
    times: VecDeque<Timestamp>,
    time_of: HashMap<Text, Timestamp>,
}

impl<T> Default for TimeOrdered<T> {
    fn default() -> Self {
        TimeOrdered {
            lines: VecDeque::new(),
            times: VecDeque::new(),
            time_of: HashMap::with_capacity_and_hasher(INDEX_LINES_FIRST, Default::default()),
        }
    }
}

fn key<T: TimeKeyed>(line: &T) -> (Timestamp, &str) {
    (line.time(), line.txn_id().as_str())
}

/// The first index in `lower..upper` for which `is_before` fails, given that it holds for a prefix of
/// that range and fails for the rest (a binary search over indexes, for a range of a deque or of a
/// [`crate::segmented::Segmented`] list).
pub(crate) fn first_failing(mut lower: usize, mut upper: usize, mut is_before: impl FnMut(usize) -> bool) -> usize {
    while lower < upper {
        let middle = lower + (upper - lower) / 2;
        if is_before(middle) {
            lower = middle + 1;
        } else {
            upper = middle;
        }
    }
    lower
}

impl<T: TimeKeyed> TimeOrdered<T> {
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Where the line keyed (`time`, `txn_id`) is, or would be inserted.
    pub fn position(&self, time: Timestamp, txn_id: &str) -> Result<usize, usize> {
        let slot = self.first_after_key_before(time, txn_id);
        match self.lines.get(slot) {
            Some(line) if self.times[slot] == time && crate::same_text(line.txn_id(), txn_id) => Ok(slot),
            _ => Err(slot),
        }
    }

    /// The first slot whose key is not below (`time`, `txn_id`): txn ids are compared only among the
    /// lines of that time.
    fn first_after_key_before(&self, time: Timestamp, txn_id: &str) -> usize {
        let first_of_time = self.first_at_or_after(time);
        if self.times.get(first_of_time) != Some(&time) {
            return first_of_time;
        }
        let after_time = first_failing(first_of_time, self.times.len(), |slot| self.times[slot] <= time);
        first_failing(first_of_time, after_time, |slot| self.lines[slot].txn_id().as_str() < txn_id)
    }

    /// The first slot whose line's time is `time` or later.
    pub fn first_at_or_after(&self, time: Timestamp) -> usize {
        self.times.partition_point(|known| *known < time)
    }

    /// The first slot whose key is above (`time`, `txn_id`).
    pub fn first_after(&self, time: Timestamp, txn_id: &str) -> usize {
        match self.position(time, txn_id) {
            Ok(slot) => slot + 1,
            Err(slot) => slot,
        }
    }

    /// The line with this txn id.
    pub fn find(&self, txn_id: &str) -> Option<&T> {
        self.slot_of(txn_id).and_then(|slot| self.lines.get(slot))
    }

    /// The line with this txn id, to change anything but its time and txn id.
    pub fn find_mut(&mut self, txn_id: &str) -> Option<&mut T> {
        self.slot_of(txn_id).and_then(|slot| self.lines.get_mut(slot))
    }

    fn slot_of(&self, txn_id: &str) -> Option<usize> {
        let time = *self.time_of.get(txn_id)?;
        let slot = self.position(time, txn_id).ok();
        debug_assert!(slot.is_some(), "txn {txn_id} has a time but no line");
        slot
    }

    pub fn get(&self, slot: usize) -> Option<&T> {
        self.lines.get(slot)
    }

    /// The newest line.
    pub fn back(&self) -> Option<&T> {
        self.lines.back()
    }

    /// Every line, oldest first.
    pub fn iter(&self) -> std::collections::vec_deque::Iter<'_, T> {
        self.lines.iter()
    }

    /// Every line from `slot` on, oldest first.
    pub fn range_from(&self, slot: usize) -> std::collections::vec_deque::Iter<'_, T> {
        self.lines.range(slot..)
    }

    /// Adds `line` at its place, replacing the line with the same txn id (whatever its time); returns
    /// the replaced line.
    pub fn insert(&mut self, line: T) -> Option<T> {
        let replaced = match self.time_of.insert(line.txn_id().clone(), line.time()) {
            Some(time) => self.position(time, line.txn_id()).ok().and_then(|slot| self.remove_slot(slot)),
            None => None,
        };
        let time = line.time();
        if self.lines.back().is_none_or(|last| key(last) < key(&line)) {
            self.lines.push_back(line);
            self.times.push_back(time);
        } else {
            // No other line has this txn id any more, so the key is not in the deque.
            let position = self.position(time, line.txn_id());
            debug_assert!(position.is_err(), "two lines with one txn id");
            let (Ok(slot) | Err(slot)) = position;
            self.lines.insert(slot, line);
            self.times.insert(slot, time);
        }
        debug_assert_eq!(self.lines.len(), self.time_of.len());
        debug_assert_eq!(self.lines.len(), self.times.len());
        replaced
    }

    /// Removes the line in `slot`.
    pub fn remove(&mut self, slot: usize) -> Option<T> {
        let line = self.remove_slot(slot)?;
        self.time_of.remove(line.txn_id().as_str());
        debug_assert_eq!(self.lines.len(), self.time_of.len());
        Some(line)
    }

    /// Takes the line in `slot` out of the deques (its txn id stays in `time_of`).
    fn remove_slot(&mut self, slot: usize) -> Option<T> {
        let line = self.lines.remove(slot)?;
        let time = self.times.remove(slot);
        debug_assert_eq!(time, Some(line.time()));
        Some(line)
    }

    /// Removes the oldest line.
    pub fn pop_front(&mut self) -> Option<T> {
        self.remove(0)
    }
}

#[cfg(test)]
mod tests {
    //! The ordered deque against a model: a map from (time, txn id) to the line, with at most one key per
    //! txn id, under random insertions (new txn ids, re-timed ones, many lines of one time) and removals.

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Clone, Debug, PartialEq)]
    struct Line {
        time: Timestamp,
        txn_id: Text,
        version: u32,
    }

    impl TimeKeyed for Line {
        fn time(&self) -> Timestamp {
            self.time
        }

        fn txn_id(&self) -> &Text {
            &self.txn_id
        }
    }

    #[derive(Clone, Debug)]
    enum Operation {
        Insert { time: i64, txn: u8 },
        Remove { slot: usize },
    }

    fn operation() -> impl Strategy<Value = Operation> {
        // Few times and txn ids, so that lines share a time and txn ids come back re-timed.
        prop_oneof![
            4 => (0i64..6, 0u8..16).prop_map(|(time, txn)| Operation::Insert { time, txn }),
            1 => (0usize..20).prop_map(|slot| Operation::Remove { slot }),
        ]
    }

    proptest! {
        #[test]
        fn searches_agree_with_an_ordered_map(operations in proptest::collection::vec(operation(), 1..80)) {
            let mut table = TimeOrdered::<Line>::default();
            let mut model: BTreeMap<(Timestamp, Text), Line> = BTreeMap::new();
            for (version, operation) in (0u32..).zip(operations) {
                match operation {
                    Operation::Insert { time, txn } => {
                        let line = Line { time: Timestamp::from_millis(time), txn_id: format!("t{txn}").into(), version };
                        let expected = model.keys().find(|(_, id)| *id == line.txn_id).cloned();
                        let expected = expected.and_then(|key| model.remove(&key));
                        model.insert((line.time, line.txn_id.clone()), line.clone());
                        prop_assert_eq!(table.insert(line), expected);
                    }
                    Operation::Remove { slot } => {
                        let expected = model.keys().nth(slot).cloned().and_then(|key| model.remove(&key));
                        prop_assert_eq!(table.remove(slot), expected);
                    }
                }
                let lines: Vec<&Line> = table.iter().collect();
                let expected: Vec<&Line> = model.values().collect();
                prop_assert_eq!(lines, expected);
                for time in -1i64..7 {
                    let time = Timestamp::from_millis(time);
                    let at_or_after = model.keys().filter(|(known, _)| *known < time).count();
                    prop_assert_eq!(table.first_at_or_after(time), at_or_after);
                    for txn in 0u8..17 {
                        let txn_id = format!("t{txn}");
                        let below = model.keys().filter(|(known, id)| (*known, id.as_str()) < (time, txn_id.as_str())).count();
                        let found = model.contains_key(&(time, Text::from(txn_id.as_str())));
                        let expected = if found { Ok(below) } else { Err(below) };
                        prop_assert_eq!(table.position(time, &txn_id), expected);
                        prop_assert_eq!(table.first_after(time, &txn_id), below + usize::from(found));
                    }
                }
                for (txn, line) in model.values().map(|line| (line.txn_id.clone(), line)) {
                    prop_assert_eq!(table.find(&txn), Some(line));
                }
            }
        }
    }
}
