//! The event ids the engine has seen (SPEC §3: an input whose `event_id` was already seen, applied or
//! rejected, is ignored), remembered for the whole replay.
//!
//! A `HashSet` of the ids themselves is a table of 24-byte strings that outgrows the caches, and every
//! input makes a random access into it (measured on the engine benchmark: without any set the replay of
//! 1.2 million ids is ≈ 14 % faster, almost all of it cache and TLB misses, not hashing). Here the ids
//! are appended to chunks that never move, and the hash table holds 8-byte entries: 32 bits of the
//! id's hash and its position. The table is a third of the size, an id is read only when those 32 bits
//! match (a repeat, or one new id in four billion per entry compared), and growing the table rehashes
//! the stored bits without reading an id. A replay prefetches the next input's slot while it applies
//! the current input.
//!
//! Exact and deterministic: the answers are those of a set of strings.

use crate::Text;
use std::hash::Hasher;

/// Ids per chunk of stored ids.
const IDS_PER_CHUNK: usize = 1 << 16;
/// Ids the set holds at most (positions are stored plus one in 32 bits).
pub const SEEN_IDS_MAX: usize = u32::MAX as usize - 1;
/// Slots of the first table (a power of two).
const SLOTS_MIN: usize = 1 << 10;

/// Every event id seen so far.
///
/// The table is open addressing with linear probing over 8-byte slots: 0 for an empty slot, else the
/// id's 32 hash bits above its position plus one: a third of a hash set of the ids themselves, so
/// fewer cache and TLB misses. The table can say which cache line an id's probe starts at, so a replay
/// asks for it one input ahead ([`SeenIds::prefetch`]) and the miss into a table that outgrows the
/// caches overlaps the previous input's work.
#[derive(Clone, Debug)]
pub struct SeenIds {
    slots: Vec<u64>,
    /// Occupied slots (= ids stored).
    len: usize,
    /// Every id, in arrival order.
    ids: Vec<Vec<Text>>,
}

impl Default for SeenIds {
    fn default() -> Self {
        SeenIds { slots: vec![0; SLOTS_MIN], len: 0, ids: Vec::new() }
    }
}

impl SeenIds {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Remembers `id`; true if it was not seen before.
    pub fn insert(&mut self, id: &str) -> bool {
        let hash = hash32(id);
        let slot = match self.probe(id, hash) {
            Probe::Found => return false,
            Probe::Empty(slot) => slot,
        };
        let position = self.len;
        assert!(position < SEEN_IDS_MAX, "more than {SEEN_IDS_MAX} event ids");
        match self.ids.last_mut() {
            Some(chunk) if chunk.len() < IDS_PER_CHUNK => chunk.push(Text::from(id)),
            _ => {
                let mut chunk = Vec::with_capacity(IDS_PER_CHUNK);
                chunk.push(Text::from(id));
                self.ids.push(chunk);
            }
        }
        self.slots[slot] = pack(hash, position);
        self.len += 1;
        // At most three quarters full, so that a probe for a new id (the common case) stays short.
        if self.len * 4 > self.slots.len() * 3 {
            self.grow();
        }
        debug_assert_eq!(self.len, self.ids.iter().map(Vec::len).sum::<usize>());
        true
    }

    pub fn contains(&self, id: &str) -> bool {
        matches!(self.probe(id, hash32(id)), Probe::Found)
    }

    /// Asks the CPU to bring the cache line where `id`'s probe starts (no effect on the answers).
    pub fn prefetch(&self, id: &str) {
        let home = self.home(hash32(id));
        crate::prefetch::value(&self.slots[home]);
    }

    /// Walks `id`'s probe sequence to the slot holding it or to the first empty slot.
    fn probe(&self, id: &str, hash: u32) -> Probe {
        let mask = self.slots.len() - 1;
        let mut slot = self.home(hash);
        // The table is never full (grown at three quarters), so an empty slot ends every walk; the
        // bound is the table's size all the same.
        for _ in 0..self.slots.len() {
            let entry = self.slots[slot];
            if entry == 0 {
                return Probe::Empty(slot);
            }
            if (entry >> 32) as u32 == hash && self.id_at(entry) == id {
                return Probe::Found;
            }
            slot = (slot + 1) & mask;
        }
        unreachable!("a seen-id table with no empty slot")
    }

    /// The first slot of a probe: the top bits of the spread hash (the table's size is a power of two).
    fn home(&self, hash: u32) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (spread(hash) >> (64 - bits)) as usize
    }

    /// Doubles the table, placing entries by their stored hash bits (no id is read).
    fn grow(&mut self) {
        let doubled = vec![0; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        let mask = self.slots.len() - 1;
        for entry in old.into_iter().filter(|entry| *entry != 0) {
            let mut slot = self.home((entry >> 32) as u32);
            while self.slots[slot] != 0 {
                slot = (slot + 1) & mask;
            }
            self.slots[slot] = entry;
        }
    }

    fn id_at(&self, entry: u64) -> &str {
        let position = (entry as u32 - 1) as usize;
        self.ids[position / IDS_PER_CHUNK][position % IDS_PER_CHUNK].as_str()
    }
}

enum Probe {
    Found,
    Empty(usize),
}

/// A slot's value: never 0, the mark of an empty slot.
fn pack(hash: u32, position: usize) -> u64 {
    (u64::from(hash) << 32) | (position as u64 + 1)
}

/// 32 bits of a well-mixed 64-bit hash of the id (FxHash, then MurmurHash3's finaliser).
fn hash32(id: &str) -> u32 {
    let mut hasher = rustc_hash::FxHasher::default();
    hasher.write(id.as_bytes());
    (mix(hasher.finish() ^ id.len() as u64) >> 32) as u32
}

/// The table's 64-bit hash of an entry's 32 bits: the table takes buckets from the low bits and tags
/// from the high ones, so the 32 bits are spread over all 64.
fn spread(hash: u32) -> u64 {
    mix(u64::from(hash))
}

/// MurmurHash3's 64-bit finaliser: every input bit affects every output bit.
fn mix(mut value: u64) -> u64 {
    value ^= value >> 33;
    value = value.wrapping_mul(0xff51_afd7_ed55_8ccd);
    value ^= value >> 33;
    value = value.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    value ^ (value >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Answers as a hash set of the same ids.
        #[test]
        fn answers_as_a_set(ids in proptest::collection::vec("[a-c]{0,3}|[0-9]{1,4}|[a-z:]{20,30}", 1..800)) {
            let mut seen = SeenIds::default();
            let mut model = std::collections::HashSet::new();
            for id in &ids {
                prop_assert_eq!(seen.insert(id), model.insert(id.clone()), "{}", id);
                prop_assert!(seen.contains(id));
                prop_assert_eq!(seen.len(), model.len());
            }
            for id in &ids {
                prop_assert!(seen.contains(id));
            }
            prop_assert!(!seen.contains("never inserted: the strategies have no spaces"));
        }
    }

    /// Across many doublings of the table every id stays found, a repeat is refused, and a prefetch
    /// (of a stored id or a new one) changes no answer.
    #[test]
    fn growing_keeps_every_id() {
        let mut seen = SeenIds::default();
        let ids: Vec<String> = (0..100_000u32).map(|number| format!("event:{number}")).collect();
        for id in &ids {
            seen.prefetch(id);
            assert!(seen.insert(id), "{id} is new");
        }
        assert!(seen.slots.len() >= 100_000 * 4 / 3 && seen.slots.len().is_power_of_two());
        assert_eq!(seen.slots.iter().filter(|slot| **slot != 0).count(), ids.len());
        for id in &ids {
            seen.prefetch(id);
            assert!(!seen.insert(id), "{id} is a repeat");
        }
        assert_eq!(seen.len(), ids.len());
        assert!(!seen.contains("event:100000"));
    }

    /// Ids whose 32 hash bits collide are still told apart by the stored id.
    #[test]
    fn equal_hash_bits_are_not_equal_ids() {
        let mut seen = SeenIds::default();
        let mut by_bits = std::collections::HashMap::new();
        let colliding = (0..2_000_000u32).map(|number| format!("id-{number}")).find_map(|id| {
            let other = by_bits.insert(hash32(&id), id.clone())?;
            Some((other, id))
        });
        let (first, second) = colliding.expect("a 32-bit collision among two million ids (birthday bound)");
        assert_eq!(hash32(&first), hash32(&second));
        assert!(seen.insert(&first));
        assert!(seen.insert(&second));
        assert!(!seen.insert(&first) && !seen.insert(&second));
        assert_eq!(seen.len(), 2);
    }
}
