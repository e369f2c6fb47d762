//! Statement lines kept in (time, txn id) order, one per txn id: a card's statement as the simulated
//! provider keeps it, and as an agent's bill table keeps it (R-CHK-1).
//!
//! The lines sit inline in one deque in that order, and a hash map gives each txn id's time, so a line
//! is found by id with one lookup and a binary search. A statement mostly grows at its end, so a new
//! line is usually appended; the oldest leave from the front. Reading a page of the latest lines, or a
//! time window, reads neighbouring memory.

use crate::time::Timestamp;
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// What a line is ordered and identified by. Neither may change while the line is kept.
pub trait TimeKeyed {
    fn time(&self) -> Timestamp;
    fn txn_id(&self) -> &Text;
}

/// Lines in (time, txn id) order, at most one per txn id.
#[derive(Clone, Debug)]
pub struct TimeOrdered<T> {
    lines: VecDeque<T>,
    time_of: HashMap<Text, Timestamp>,
}

impl<T> Default for TimeOrdered<T> {
    fn default() -> Self {
        TimeOrdered { lines: VecDeque::new(), time_of: HashMap::default() }
    }
}

fn key<T: TimeKeyed>(line: &T) -> (Timestamp, &str) {
    (line.time(), line.txn_id().as_str())
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
        self.lines.binary_search_by(|line| key(line).cmp(&(time, txn_id)))
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

    /// The first slot whose line fails `is_before` (lines for which it holds come first).
    pub fn partition_point(&self, is_before: impl FnMut(&T) -> bool) -> usize {
        self.lines.partition_point(is_before)
    }

    /// Adds `line` at its place, replacing the line with the same txn id (whatever its time); returns
    /// the replaced line.
    pub fn insert(&mut self, line: T) -> Option<T> {
        let replaced = match self.time_of.insert(line.txn_id().clone(), line.time()) {
            Some(time) => self.position(time, line.txn_id()).ok().and_then(|slot| self.lines.remove(slot)),
            None => None,
        };
        if self.lines.back().is_none_or(|last| key(last) < key(&line)) {
            self.lines.push_back(line);
        } else {
            // No other line has this txn id any more, so the key is not in the deque.
            let position = self.position(line.time(), line.txn_id());
            debug_assert!(position.is_err(), "two lines with one txn id");
            let (Ok(slot) | Err(slot)) = position;
            self.lines.insert(slot, line);
        }
        debug_assert_eq!(self.lines.len(), self.time_of.len());
        replaced
    }

    /// Removes the line in `slot`.
    pub fn remove(&mut self, slot: usize) -> Option<T> {
        let line = self.lines.remove(slot)?;
        self.time_of.remove(line.txn_id().as_str());
        debug_assert_eq!(self.lines.len(), self.time_of.len());
        Some(line)
    }

    /// Removes the oldest line.
    pub fn pop_front(&mut self) -> Option<T> {
        self.remove(0)
    }
}
