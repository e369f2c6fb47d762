//! A list that only grows at its end and never moves what it holds: journals (R-JRN-1), which grow with
//! an agent's or a merchant's history and are read in order or by position.
//!
//! A `Vec` that outgrows its room allocates twice the room and copies every entry across. A merchant's
//! journal reaches thousands of entries of 160 bytes, so each doubling copied up to a megabyte, and the
//! copies were ≈ 1 % of the engine benchmark's instructions (callgrind: 550 doublings, ≈ 60,000
//! instructions each, for 50 merchants). Here the entries sit in segments of 4, 8, 16… entries
//! (`SEGMENT_FIRST << k` for the k-th), each allocated once at its full size and never moved: the same
//! memory as a `Vec`'s doublings, without the copies. An entry's position gives its segment and offset
//! by arithmetic (the position's highest set bit), so reading by position stays constant time.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Entries in the first segment; each later segment holds twice the one before. A power of two, as
/// `locate` needs.
const SEGMENT_FIRST: usize = 4;

/// The segment and the offset in it of the entry at `index`.
#[inline]
fn locate(index: usize) -> (usize, usize) {
    // Segment k starts at SEGMENT_FIRST × (2^k − 1): k is the highest set bit of index / SEGMENT_FIRST + 1.
    let scaled = index / SEGMENT_FIRST + 1;
    let segment = (usize::BITS - 1 - scaled.leading_zeros()) as usize;
    (segment, index - SEGMENT_FIRST * ((1 << segment) - 1))
}

/// Entries a segment holds.
fn segment_capacity(segment: usize) -> usize {
    SEGMENT_FIRST << segment
}

/// Entries in order of their pushes, never moved once pushed.
#[derive(Debug, PartialEq, Eq)]
pub struct Segmented<T> {
    /// Segment k holds `segment_capacity(k)` entries; only the last may hold fewer, and it holds one at
    /// least. The length follows from them (see `len`).
    segments: Vec<Vec<T>>,
}

impl<T> Default for Segmented<T> {
    fn default() -> Self {
        Segmented { segments: Vec::new() }
    }
}

/// A copy keeps each segment's full room, so that its pushes do not move entries either (a cloned `Vec`
/// has only the room of its entries).
impl<T: Clone> Clone for Segmented<T> {
    fn clone(&self) -> Self {
        let segments = self
            .segments
            .iter()
            .enumerate()
            .map(|(segment, entries)| {
                let mut copy = Vec::with_capacity(segment_capacity(segment));
                copy.extend_from_slice(entries);
                copy
            })
            .collect();
        Segmented { segments }
    }
}

impl<T> Segmented<T> {
    /// Entries held: the full segments before the last hold SEGMENT_FIRST × (2^k − 1), k the last's number.
    pub fn len(&self) -> usize {
        match self.segments.last() {
            Some(last) => SEGMENT_FIRST * ((1 << (self.segments.len() - 1)) - 1) + last.len(),
            None => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Appends `value`: into the last segment while it has room, else into a new segment twice its
    /// size, allocated at its full size so that it never grows (and never copies).
    pub fn push(&mut self, value: T) {
        let segment_count = self.segments.len();
        match self.segments.last_mut() {
            Some(last) if last.len() < segment_capacity(segment_count - 1) => last.push(value),
            _ => {
                let mut segment = Vec::with_capacity(segment_capacity(segment_count));
                segment.push(value);
                self.segments.push(segment);
            }
        }
    }

    /// The entry at `index`; None past the end (the last segment's length bounds it, and no segment
    /// exists after the last).
    pub fn get(&self, index: usize) -> Option<&T> {
        let (segment, offset) = locate(index);
        self.segments.get(segment).and_then(|entries| entries.get(offset))
    }

    pub fn last(&self) -> Option<&T> {
        self.segments.last().and_then(|last| last.last())
    }

    /// Every entry, in order.
    pub fn iter(&self) -> Iter<'_, T> {
        self.iter_from(0)
    }

    /// The entries from `start` on (none when `start` is past the end), in order.
    pub fn iter_from(&self, start: usize) -> Iter<'_, T> {
        let len = self.len();
        let start = start.min(len);
        let (segment, offset) = locate(start);
        let mut segments = self.segments.get(segment..).unwrap_or_default().iter();
        // The segment of `start` is entered at its offset; the ones after it are read whole.
        let current = segments.next().and_then(|entries| entries.get(offset..)).unwrap_or_default().iter();
        Iter { segments, current, remaining: len - start }
    }

    /// The first index for which `is_before` fails, given that it holds for a prefix of the entries and
    /// fails for the rest (as `slice::partition_point`).
    pub fn partition_point(&self, mut is_before: impl FnMut(&T) -> bool) -> usize {
        crate::time_ordered::first_failing(0, self.len(), |index| self.get(index).is_some_and(&mut is_before))
    }
}

/// The entries of a [`Segmented`] in order (its length known, as a slice iterator's).
pub struct Iter<'a, T> {
    /// The segments after the one being read.
    segments: std::slice::Iter<'a, Vec<T>>,
    current: std::slice::Iter<'a, T>,
    remaining: usize,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        loop {
            if let Some(entry) = self.current.next() {
                self.remaining -= 1;
                return Some(entry);
            }
            // Segments are never empty, so this loop turns at most once per call.
            self.current = self.segments.next()?.iter();
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}

impl<'a, T> IntoIterator for &'a Segmented<T> {
    type Item = &'a T;
    type IntoIter = Iter<'a, T>;

    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

impl<T> FromIterator<T> for Segmented<T> {
    fn from_iter<I: IntoIterator<Item = T>>(entries: I) -> Self {
        let mut segmented = Segmented::default();
        for entry in entries {
            segmented.push(entry);
        }
        segmented
    }
}

impl<T> std::ops::Index<usize> for Segmented<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        match self.get(index) {
            Some(entry) => entry,
            None => panic!("index {index} out of a list of {}", self.len()),
        }
    }
}

/// Written as a list, the same bytes as the `Vec` it replaced.
impl<T: Serialize> Serialize for Segmented<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// Read from a list entry by entry, straight into the segments (no whole list in between: a restored
/// journal is as large as the one written).
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Segmented<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<T>(std::marker::PhantomData<T>);

        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Entries<T> {
            type Value = Segmented<T>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a list of entries")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut entries: A) -> Result<Segmented<T>, A::Error> {
                let mut segmented = Segmented::default();
                while let Some(entry) = entries.next_element()? {
                    segmented.push(entry);
                }
                Ok(segmented)
            }
        }

        deserializer.deserialize_seq(Entries(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn positions_map_to_segments_of_doubling_size() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(3), (0, 3));
        assert_eq!(locate(4), (1, 0));
        assert_eq!(locate(11), (1, 7));
        assert_eq!(locate(12), (2, 0));
        assert_eq!(locate(27), (2, 15));
        assert_eq!(locate(28), (3, 0));
    }

    #[test]
    fn pushed_entries_are_never_moved() {
        let mut segmented = Segmented::default();
        segmented.push(0u64);
        let first: *const u64 = &segmented[0];
        for value in 1..10_000 {
            segmented.push(value);
        }
        assert!(std::ptr::eq(first, &segmented[0]), "the first entry moved");
        assert_eq!(segmented.segments.len(), 12);
        assert!(segmented
            .segments
            .iter()
            .enumerate()
            .all(|(k, entries)| entries.capacity() == segment_capacity(k) || k == segmented.segments.len() - 1));
    }

    proptest! {
        /// Against a `Vec` fed the same pushes: length, every position, iteration from every start,
        /// `partition_point`, the last entry, and the serialized bytes both ways.
        #[test]
        fn answers_like_a_vec(values in proptest::collection::vec(0u32..1_000, 0..300), probe in 0usize..320) {
            let mut segmented = Segmented::default();
            let mut vec = Vec::new();
            for value in &values {
                segmented.push(*value);
                vec.push(*value);
                prop_assert_eq!(segmented.len(), vec.len());
                prop_assert_eq!(segmented.last(), vec.last());
            }
            prop_assert_eq!(segmented.is_empty(), vec.is_empty());
            prop_assert_eq!(segmented.get(probe), vec.get(probe));
            if let Some(expected) = vec.get(probe) {
                prop_assert_eq!(segmented[probe], *expected);
            }
            // A copy holds the same entries and goes on growing as the original does.
            let mut copy = segmented.clone();
            copy.push(7);
            prop_assert_eq!(copy.iter().copied().collect::<Vec<_>>(), [vec.as_slice(), &[7]].concat());
            for start in 0..=vec.len() + 1 {
                let from = segmented.iter_from(start);
                prop_assert_eq!(from.len(), vec.len().saturating_sub(start));
                prop_assert_eq!(from.copied().collect::<Vec<_>>(), vec.get(start..).unwrap_or_default().to_vec());
            }
            let mut sorted = vec.clone();
            sorted.sort_unstable();
            let sorted_segmented: Segmented<u32> = sorted.iter().copied().collect();
            let bound = probe as u32 * 3;
            prop_assert_eq!(sorted_segmented.partition_point(|value| *value < bound), sorted.partition_point(|value| *value < bound));
            let json = serde_json::to_string(&segmented).expect("serializes");
            prop_assert_eq!(&json, &serde_json::to_string(&vec).expect("serializes"));
            prop_assert_eq!(serde_json::from_str::<Segmented<u32>>(&json).expect("reads back"), segmented);
        }
    }
}
