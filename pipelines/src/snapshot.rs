//! Snapshots of a stage partition's complete state (see `StagePartition::snapshot`), so that a runtime
//! can restore a partition from a compacted changelog instead of applying its whole log again.
//!
//! Encoding: a header line `paisa-partition-snapshot v{N}\n` followed by compact JSON (serde_json). The
//! header is read before anything else, so a snapshot of another format version is refused clearly,
//! whatever its body looks like. The JSON is deterministic: struct fields in declaration order, `BTreeMap`
//! and `BTreeSet` fields in key order, and every hash map written sorted by key (the helpers below): as a
//! sequence of `[key, value]` pairs, or, where a keyed map replaced a `BTreeMap`, as the object the tree
//! wrote. Equal states give equal bytes.
//!
//! Pure: no I/O. Encoding and decoding are functions of their arguments.

use crate::stages::agent::state::{DebtBatch, Hold};
use serde::de::Deserializer;
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// The format version this build writes and the only one it reads. Bump it with any change to what a
/// snapshot contains or how it is encoded.
pub const SNAPSHOT_VERSION: u32 = 4;

/// What every snapshot starts with, followed by its version and a newline.
pub const SNAPSHOT_MAGIC: &str = "paisa-partition-snapshot v";

/// Why a snapshot could not be written or restored. Nothing here is retryable: the same bytes always fail
/// the same way; a runtime falls back to applying the partition's log from the start.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The state did not encode (not expected: every map is written with string keys or as pairs).
    #[error("the partition state does not encode: {0}")]
    Encode(String),
    /// Not a partition snapshot at all (no header).
    #[error("not a partition snapshot: {0}")]
    NotASnapshot(String),
    /// A snapshot of another format version.
    #[error("partition snapshot format version {found}, this build reads only version {expected}")]
    Version { found: String, expected: u32 },
    /// The right header, but the body does not decode (truncated or corrupt).
    #[error("corrupt partition snapshot: {0}")]
    Corrupt(String),
    /// Taken under another engine configuration: the state would not be what applying the log under
    /// this one gives.
    #[error("partition snapshot taken with another configuration (fingerprint {found:08x}, expected {expected:08x})")]
    ConfigMismatch { found: u32, expected: u32 },
    /// It decodes, but does not describe a possible partition.
    #[error("inconsistent partition snapshot: {0}")]
    Inconsistent(String),
}

/// Prepends the header to an encoded body.
pub(crate) fn frame(body: &[u8]) -> Vec<u8> {
    let header = format!("{SNAPSHOT_MAGIC}{SNAPSHOT_VERSION}\n");
    let mut bytes = Vec::with_capacity(header.len() + body.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Checks the header and returns the body.
pub(crate) fn unframe(bytes: &[u8]) -> Result<&[u8], SnapshotError> {
    let magic = SNAPSHOT_MAGIC.as_bytes();
    let Some(rest) = bytes.strip_prefix(magic) else {
        return Err(SnapshotError::NotASnapshot(format!("no `{SNAPSHOT_MAGIC}` header")));
    };
    let Some(end) = rest.iter().position(|byte| *byte == b'\n') else {
        return Err(SnapshotError::NotASnapshot("the header line does not end".to_string()));
    };
    let version = &rest[..end];
    if version != SNAPSHOT_VERSION.to_string().as_bytes() {
        let found: String = String::from_utf8_lossy(version).chars().take(32).collect();
        return Err(SnapshotError::Version { found, expected: SNAPSHOT_VERSION });
    }
    Ok(&rest[end + 1..])
}

/// A hash map written as `[key, value]` pairs sorted by key (hash maps iterate in an order that depends on
/// their history; a snapshot must not). Read back into a map, refusing a key given twice.
pub mod sorted_map {
    use super::*;

    pub fn serialize<K, V, H, S>(map: &HashMap<K, V, H>, serializer: S) -> Result<S::Ok, S::Error>
    where
        K: Ord + Serialize,
        V: Serialize,
        S: Serializer,
    {
        serialize_pairs(map.iter(), serializer)
    }

    pub fn deserialize<'de, K, V, H, D>(deserializer: D) -> Result<HashMap<K, V, H>, D::Error>
    where
        K: Eq + Hash + Deserialize<'de>,
        V: Deserialize<'de>,
        H: BuildHasher + Default,
        D: Deserializer<'de>,
    {
        deserialize_pairs(deserializer, |pairs| HashMap::with_capacity_and_hasher(pairs, H::default()), HashMap::insert)
    }

    /// Writes any map's `(key, value)` pairs sorted by key (the keyed maps use it too).
    pub(crate) fn serialize_pairs<'a, K, V, S>(
        pairs: impl Iterator<Item = (&'a K, &'a V)>,
        serializer: S,
    ) -> Result<S::Ok, S::Error>
    where
        K: Ord + Serialize + 'a,
        V: Serialize + 'a,
        S: Serializer,
    {
        let mut pairs: Vec<(&K, &V)> = pairs.collect();
        pairs.sort_unstable_by(|a, b| a.0.cmp(b.0));
        serializer.collect_seq(pairs)
    }

    /// Reads pairs into the map `with_capacity` makes, through `insert` (which returns the value a key
    /// already had), refusing a key given twice.
    pub(crate) fn deserialize_pairs<'de, K, V, M, D>(
        deserializer: D,
        with_capacity: impl FnOnce(usize) -> M,
        mut insert: impl FnMut(&mut M, K, V) -> Option<V>,
    ) -> Result<M, D::Error>
    where
        K: Deserialize<'de>,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        let pairs = Vec::<(K, V)>::deserialize(deserializer)?;
        let mut map = with_capacity(pairs.len());
        for (key, value) in pairs {
            if insert(&mut map, key, value).is_some() {
                return Err(serde::de::Error::custom("a map key is given twice"));
            }
        }
        Ok(map)
    }
}

/// A [`KeyedMap`](crate::keyed::KeyedMap) written as a JSON object sorted by key: the bytes of the
/// `BTreeMap` it replaced, so the snapshot's format is unchanged. Read back refusing a key given twice.
pub mod keyed_object {
    use super::*;
    use crate::keyed::KeyedMap;
    use crate::Text;

    pub fn serialize<V: Serialize, S: Serializer>(map: &KeyedMap<V>, serializer: S) -> Result<S::Ok, S::Error> {
        let mut pairs: Vec<(&Text, &V)> = map.iter().collect();
        pairs.sort_unstable_by(|a, b| a.0.cmp(b.0));
        serializer.collect_map(pairs)
    }

    pub fn deserialize<'de, V: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<KeyedMap<V>, D::Error> {
        deserializer.deserialize_map(ObjectVisitor(std::marker::PhantomData))
    }

    struct ObjectVisitor<V>(std::marker::PhantomData<V>);

    impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for ObjectVisitor<V> {
        type Value = KeyedMap<V>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("an object keyed by id")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<KeyedMap<V>, A::Error> {
            let mut map = KeyedMap::new();
            while let Some((key, value)) = access.next_entry::<Text, V>()? {
                if map.insert(key, value).is_some() {
                    return Err(serde::de::Error::custom("a map key is given twice"));
                }
            }
            Ok(map)
        }
    }
}

/// An agent's holds with their debt batches (which the holds' own serialization, the user view of SPEC
/// §9, leaves out): `[hold, debt_batches]` pairs in order.
pub mod holds {
    use super::*;

    pub fn serialize<S: Serializer>(holds: &[Hold], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(holds.iter().map(|hold| (hold, &hold.debt_batches)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Hold>, D::Error> {
        let pairs = Vec::<(Hold, Vec<DebtBatch>)>::deserialize(deserializer)?;
        Ok(pairs
            .into_iter()
            .map(|(mut hold, debt_batches)| {
                hold.debt_batches = debt_batches;
                hold
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
