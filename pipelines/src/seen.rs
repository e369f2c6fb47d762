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
//! Numbered ids (`{prefix}:{n}`, what scenario files default to, `line:N`, and what a log's positions
//! give) are remembered as one bit per number instead, under their prefix: a replay of a million such ids
//! touches a 128 KiB bitmap, not a table of megabytes. Ids of any other form (the API's random ones)
//! use the table. Measured on the engine benchmark (its ids are `w:N`): see `docs/DECISIONS.md`,
//! "Numbered event ids are remembered as bits".
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
/// Prefixes whose numbered ids are kept as bits; ids under further prefixes go to the table.
const NUMBERED_PREFIXES_MAX: usize = 4;
/// Numbers a prefix's bits cover (32 MiB of bits at most per prefix); larger ones go to the table.
const NUMBERS_PER_PREFIX_MAX: u64 = 1 << 28;
/// Digits of the largest number kept as a bit (`NUMBERS_PER_PREFIX_MAX` has 9).
const NUMBER_DIGITS_MAX: usize = 9;

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
    /// Occupied slots (= ids stored in the table).
    len: usize,
    /// Every id in the table, in arrival order.
    ids: Vec<Vec<Text>>,
    /// Numbered ids, as bits by prefix.
    numbered: NumberedIds,
}

impl Default for SeenIds {
    fn default() -> Self {
        SeenIds { slots: vec![0; SLOTS_MIN], len: 0, ids: Vec::new(), numbered: NumberedIds::default() }
    }
}

impl SeenIds {
    pub fn len(&self) -> usize {
        self.len + self.numbered.len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remembers `id`; true if it was not seen before.
    pub fn insert(&mut self, id: &str) -> bool {
        if let Some((index, number)) = self.numbered.find(id) {
            return self.numbered.insert_at(index, number);
        }
        match split_numbered(id).and_then(|(prefix, number)| self.numbered.insert_under_new_prefix(prefix, number)) {
            Some(new) => new,
            None => self.insert_in_table(id),
        }
    }

    fn insert_in_table(&mut self, id: &str) -> bool {
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
        match self.numbered.find(id) {
            Some((run, number)) => self.numbered.runs[run].1.contains(number),
            None => matches!(self.probe(id, hash32(id)), Probe::Found),
        }
    }

    /// Asks the CPU to bring the cache line where `id`'s probe starts (no effect on the answers), and
    /// answers where `id` is kept when it is a numbered id under a kept prefix, for
    /// [`SeenIds::insert_found`]: the replay announces each input's id one input ahead, and finding it
    /// again at its insertion cost ≈ 85 instructions an input.
    pub fn prefetch(&self, id: &str) -> Option<NumberedSlot> {
        match self.numbered.find(id) {
            Some((run, number)) => {
                self.numbered.runs[run].1.prefetch(number);
                Some(NumberedSlot { run, number })
            }
            None => {
                crate::prefetch::value(&self.slots[self.home(hash32(id))]);
                None
            }
        }
    }

    /// [`SeenIds::insert`], given what [`SeenIds::prefetch`] answered for `id` (any time before: a
    /// kept prefix stays kept, so a slot it found stays right; None means look).
    pub fn insert_found(&mut self, id: &str, found: Option<NumberedSlot>) -> bool {
        match found {
            Some(NumberedSlot { run, number }) => {
                debug_assert_eq!(self.numbered.find(id), Some((run, number)), "{id} is not where it was found");
                self.numbered.insert_at(run, number)
            }
            None => self.insert(id),
        }
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
            if (entry >> 32) as u32 == hash && crate::same_text(self.id_at(entry), id) {
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

/// Where a numbered id under a kept prefix is kept: its prefix's bits and its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumberedSlot {
    run: usize,
    number: u64,
}

enum Probe {
    Found,
    Empty(usize),
}

/// Numbered ids by prefix, one bit per number.
#[derive(Clone, Debug, Default)]
struct NumberedIds {
    /// (prefix through its `:`, the bits of its numbers), at most [`NUMBERED_PREFIXES_MAX`].
    runs: Vec<(Text, NumberBits)>,
    /// Bits set, over every prefix.
    len: usize,
}

impl NumberedIds {
    /// The kept prefix `id` is a numbered id under (its index), and its number: `id` is a kept prefix
    /// followed by a canonical number. That is `split_numbered`'s answer whenever its prefix is kept
    /// (the digits hold no `:`, so the prefix ends at the id's last one), found without searching the
    /// id for its last `:` (every input's id is looked up here when the replay announces it). None
    /// also for a numbered id under a prefix not kept: such an id was never put in bits, as prefixes
    /// are kept from their first numbered id on, or never (once [`NUMBERED_PREFIXES_MAX`] are kept).
    fn find(&self, id: &str) -> Option<(usize, u64)> {
        self.runs.iter().enumerate().find_map(|(index, (prefix, _))| {
            let digits = id.as_bytes().get(prefix.len()..)?;
            let head = id.get(..prefix.len())?;
            crate::same_text(head, prefix).then(|| canonical_number(digits)).flatten().map(|number| (index, number))
        })
    }

    /// Sets the bit of `number` under the kept prefix at `index`; true if the id is new.
    fn insert_at(&mut self, index: usize, number: u64) -> bool {
        let new = self.runs[index].1.insert(number);
        self.len += usize::from(new);
        new
    }

    /// Keeps `prefix` (not kept yet) from now on with `number`'s bit set, if there is room for another
    /// prefix; None if not (the id goes to the table).
    fn insert_under_new_prefix(&mut self, prefix: &str, number: u64) -> Option<bool> {
        debug_assert!(self.runs.iter().all(|(kept, _)| kept.as_str() != prefix), "prefix {prefix} is kept");
        if self.runs.len() >= NUMBERED_PREFIXES_MAX {
            return None;
        }
        self.runs.push((Text::from(prefix), NumberBits::default()));
        Some(self.insert_at(self.runs.len() - 1, number))
    }
}

/// A set of numbers below [`NUMBERS_PER_PREFIX_MAX`], one bit each, growing with the largest.
#[derive(Clone, Debug, Default)]
struct NumberBits {
    bits: crate::bits::IndexBits,
}

impl NumberBits {
    /// Sets `number`'s bit; true if it was not set.
    fn insert(&mut self, number: u64) -> bool {
        assert!(number < NUMBERS_PER_PREFIX_MAX, "number {number} beyond the bits");
        let word = (number / 64) as usize;
        if word >= self.bits.words() {
            // Doubling: a run of increasing numbers grows the bits a logarithmic number of times, up to
            // the words every number below the bound needs.
            let words_max = (NUMBERS_PER_PREFIX_MAX / 64) as usize;
            self.bits.grow_to((word + 1).max(self.bits.words() * 2).min(words_max));
        }
        self.bits.insert(number as usize)
    }

    fn contains(&self, number: u64) -> bool {
        self.bits.contains(number as usize)
    }

    fn prefetch(&self, number: u64) {
        self.bits.prefetch(number as usize);
    }
}

/// `id` as (its prefix through the last `:`, its number) when what follows that `:` is a number
/// written in one way only (decimal digits, no leading zero but in `0` itself: `line:07` is another
/// id than `line:7`) below [`NUMBERS_PER_PREFIX_MAX`].
///
/// `split_numbered_by_definition` (tests) is the definition this must agree with.
fn split_numbered(id: &str) -> Option<(&str, u64)> {
    let colon = id.bytes().rposition(|byte| byte == b':')?;
    let number = canonical_number(id.as_bytes().get(colon + 1..)?)?;
    // The prefix ends with the ASCII `:`, so on a character boundary: `get` cannot miss.
    Some((id.get(..=colon)?, number))
}

/// `digits` as a number when they are decimal digits written in one way only (no leading zero but in
/// `0` itself), at most [`NUMBER_DIGITS_MAX`] of them, below [`NUMBERS_PER_PREFIX_MAX`].
fn canonical_number(digits: &[u8]) -> Option<u64> {
    let canonical = match digits {
        [] => false,
        [b'0'] => true,
        [first, ..] => *first != b'0' && digits.len() <= NUMBER_DIGITS_MAX,
    };
    if !canonical {
        return None;
    }
    let mut number = 0u64;
    for digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        number = number * 10 + u64::from(digit - b'0');
    }
    (number < NUMBERS_PER_PREFIX_MAX).then_some(number)
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
        fn answers_as_a_set(ids in proptest::collection::vec(
            "[a-c]{0,3}|[0-9]{1,4}|[a-z:]{20,30}|[a-f]{0,2}:(0|[1-9][0-9]{0,2}|0[0-9]{1,2}|[1-9][0-9]{8,9}|-1|\\+1)?",
            1..800,
        )) {
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

    proptest! {
        /// Inserting with what `prefetch` found one id ahead (as the replay does) answers as `insert`:
        /// prefixes kept by the ids in between (`a:1` then `a:2`, found before `a:` was kept) included.
        #[test]
        fn insert_found_one_ahead_is_insert(ids in proptest::collection::vec(
            "[ab]:(0|[1-9][0-9]{0,2}|0[0-9])|[c-f]{1,2}:[1-9]|[a-z:]{1,6}",
            1..300,
        )) {
            let (mut ahead, mut plain) = (SeenIds::default(), SeenIds::default());
            let mut found_next = ahead.prefetch(&ids[0]);
            for (index, id) in ids.iter().enumerate() {
                let found = found_next.take();
                if let Some(next) = ids.get(index + 1) {
                    found_next = ahead.prefetch(next);
                }
                prop_assert_eq!(ahead.insert_found(id, found), plain.insert(id), "{}", id);
                prop_assert_eq!(ahead.len(), plain.len());
            }
            for id in &ids {
                prop_assert!(ahead.contains(id));
            }
        }
    }

    /// The definition `split_numbered` walks in one pass: the text after the last `:`, canonical
    /// decimal digits, at most nine of them, below the bound.
    fn split_numbered_by_definition(id: &str) -> Option<(&str, u64)> {
        let colon = id.rfind(':')?;
        let digits = &id[colon + 1..];
        let canonical = digits == "0" || (!digits.is_empty() && !digits.starts_with('0'));
        if !canonical || digits.len() > NUMBER_DIGITS_MAX || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        let number: u64 = digits.parse().ok()?;
        (number < NUMBERS_PER_PREFIX_MAX).then_some((&id[..=colon], number))
    }

    proptest! {
        /// The one-pass split agrees with its definition on ids near and far from numbered ones.
        #[test]
        fn split_numbered_is_its_definition(
            id in "[a-zé:]{0,4}:?(0|[1-9][0-9]{0,9}|[12][0-9]{8}|0[0-9]{1,3}|[0-9]{0,12}|:|[a-z]{0,2}[0-9]{0,3})"
        ) {
            prop_assert_eq!(split_numbered(&id), split_numbered_by_definition(&id), "{}", id);
        }
    }

    #[test]
    fn split_numbered_examples() {
        assert_eq!(split_numbered("w:0"), Some(("w:", 0)));
        assert_eq!(split_numbered("line:7"), Some(("line:", 7)));
        assert_eq!(split_numbered("a:b:268435455"), Some(("a:b:", 268_435_455)));
        assert_eq!(split_numbered("a:268435456"), None, "the bound");
        assert_eq!(split_numbered("a:1234567890"), None, "ten digits");
        assert_eq!(split_numbered("line:07"), None, "a leading zero");
        assert_eq!(split_numbered("line:"), None);
        assert_eq!(split_numbered("7"), None, "no colon");
        assert_eq!(split_numbered(":7"), Some((":", 7)));
        assert_eq!(split_numbered("a:7b"), None);
        assert_eq!(split_numbered("é:7"), Some(("é:", 7)));
    }

    /// An id that starts with a kept prefix but has another `:` after it is numbered under the longer
    /// prefix (or not at all), never under the kept one.
    #[test]
    fn a_kept_prefix_followed_by_more_than_a_number_is_another_id() {
        let mut seen = SeenIds::default();
        assert!(seen.insert("a:5"));
        assert_eq!(seen.numbered.find("a:5"), Some((0, 5)));
        assert_eq!(seen.numbered.find("a:b:5"), None);
        assert_eq!(seen.numbered.find("a:05"), None);
        assert_eq!(seen.numbered.find("a:"), None);
        assert_eq!(seen.numbered.find("a"), None);
        for id in ["a:b:5", "a::5", "a:05", "a:", "a:5:", "a:5x"] {
            assert!(!seen.contains(id), "{id}");
            assert!(seen.insert(id), "{id}");
            assert!(!seen.insert(id), "{id}");
            assert!(seen.contains(id), "{id}");
        }
        assert_eq!(seen.numbered.runs.len(), 3, "a:, a:b: and a:: are kept");
        assert!(!seen.insert("a:5"));
        assert_eq!(seen.len(), 7);
    }

    /// Numbered ids under at most four prefixes are bits, the others (a fifth prefix, a number written
    /// in another way or too large) go to the table; each is found, once, wherever it is.
    #[test]
    fn numbered_ids_are_bits_under_the_first_prefixes() {
        let mut seen = SeenIds::default();
        let numbered: Vec<String> = (0..100_000u32)
            .map(|number| format!("{}:{number}", ["w", "line", "a:b", "x"][number as usize % 4]))
            .collect();
        let others = ["v:1", "w:01", "w:-1", "w:", "w", "w:268435456", "line:1x", "line:١"];
        for id in &numbered {
            seen.prefetch(id);
            assert!(seen.insert(id), "{id} is new");
        }
        for id in others {
            assert!(!seen.contains(id), "{id} was never inserted");
            assert!(seen.insert(id), "{id} is new");
        }
        assert_eq!(seen.numbered.runs.len(), NUMBERED_PREFIXES_MAX);
        assert_eq!((seen.numbered.len, seen.len), (numbered.len(), others.len()), "bits, table");
        for id in numbered.iter().map(String::as_str).chain(others) {
            seen.prefetch(id);
            assert!(seen.contains(id) && !seen.insert(id), "{id} is a repeat");
        }
        assert_eq!(seen.len(), numbered.len() + others.len());
        assert!(!seen.contains("w:100000") && !seen.contains("x:4"), "numbers never inserted");
    }

    /// A prefix's bits grow to cover the largest number kept, never past the bound (32 MiB).
    #[test]
    fn a_prefixs_bits_stop_at_the_bound() {
        let mut seen = SeenIds::default();
        let words_max = (NUMBERS_PER_PREFIX_MAX / 64) as usize;
        for id in ["w:3", "w:150000000", "w:268435455", "w:200000000"] {
            assert!(seen.insert(id), "{id} is new");
            assert!(seen.numbered.runs[0].1.bits.words() <= words_max, "{id} grew the bits past the bound");
        }
        assert_eq!(seen.numbered.runs[0].1.bits.words(), words_max);
        assert!(seen.contains("w:268435455") && !seen.contains("w:268435454"));
        assert_eq!((seen.numbered.len, seen.len), (4, 0));
    }

    /// Across many doublings of the table every id stays found, a repeat is refused, and a prefetch
    /// (of a stored id or a new one) changes no answer.
    #[test]
    fn growing_keeps_every_id() {
        let mut seen = SeenIds::default();
        // Not numbered (`event:N` would be bits): these go to the table.
        let ids: Vec<String> = (0..100_000u32).map(|number| format!("event-{number}")).collect();
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
        assert!(!seen.contains("event-100000"));
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
