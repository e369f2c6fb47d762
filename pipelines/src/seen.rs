//! The event ids the engine has seen (SPEC §3: an input whose `event_id` was already seen, applied or
//! rejected, is ignored), remembered for the whole replay.
//!
//! A `HashSet` of the ids themselves is a table of 24-byte strings that outgrows the caches, and every
//! input makes a random access into it (measured on the engine benchmark: without any set the replay of
//! 1.2 million ids is ≈ 14 % faster, almost all of it cache and TLB misses, not hashing). Here the ids
//! are appended to chunks that never move, and the hash table holds 8-byte entries: 32 bits of the
//! id's hash and its position. The table is a third of the size, an id is read only when those 32 bits
//! match (a repeat, or one new id in four billion per entry compared), and growing the table rehashes
//! the stored bits without reading an id.
//!
//! Exact and deterministic: the answers are those of a set of strings.

use crate::Text;
use std::hash::Hasher;

/// Ids per chunk of stored ids.
const IDS_PER_CHUNK: usize = 1 << 16;
/// Ids the set holds at most (positions are `u32`).
pub const SEEN_IDS_MAX: usize = u32::MAX as usize;

/// 32 bits of an id's hash, and the id's position in the chunks.
#[derive(Clone, Copy, Debug)]
struct Entry {
    hash: u32,
    position: u32,
}

/// Every event id seen so far.
#[derive(Clone, Debug, Default)]
pub struct SeenIds {
    table: hashbrown::HashTable<Entry>,
    /// Every id, in arrival order.
    ids: Vec<Vec<Text>>,
}

impl SeenIds {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Remembers `id`; true if it was not seen before.
    pub fn insert(&mut self, id: &str) -> bool {
        let hash = hash32(id);
        if self.find(id, hash) {
            return false;
        }
        let position = self.table.len();
        assert!(position < SEEN_IDS_MAX, "more than {SEEN_IDS_MAX} event ids");
        match self.ids.last_mut() {
            Some(chunk) if chunk.len() < IDS_PER_CHUNK => chunk.push(Text::from(id)),
            _ => {
                let mut chunk = Vec::with_capacity(IDS_PER_CHUNK);
                chunk.push(Text::from(id));
                self.ids.push(chunk);
            }
        }
        self.table.insert_unique(spread(hash), Entry { hash, position: position as u32 }, |entry| spread(entry.hash));
        debug_assert_eq!(self.table.len(), self.ids.iter().map(Vec::len).sum::<usize>());
        true
    }

    pub fn contains(&self, id: &str) -> bool {
        self.find(id, hash32(id))
    }

    fn find(&self, id: &str, hash: u32) -> bool {
        self.table.find(spread(hash), |entry| entry.hash == hash && self.id_at(entry.position) == id).is_some()
    }

    fn id_at(&self, position: u32) -> &str {
        let position = position as usize;
        self.ids[position / IDS_PER_CHUNK][position % IDS_PER_CHUNK].as_str()
    }
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
