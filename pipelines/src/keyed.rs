//! A map from id text to a stage's state whose lookups can be announced ahead of time.
//!
//! Why: the engine's state outgrows the CPU caches, and almost every unit of work (an input, a timer)
//! starts by looking up an order, an agent or a simulated card that is not in cache. The engine knows
//! the next input and the next timer while it applies the current one, so it asks the CPU to bring the
//! next one's entry meanwhile ([`KeyedMap::prefetch`]), as it already does for the seen-id table. The
//! standard map cannot say where an entry lives without reading it; `hashbrown`'s `HashTable` can.
//!
//! Same hash (FxHash of the key's text) and the same snapshot form as the maps it replaces: `[key, value]`
//! pairs sorted by key (an order that does not depend on the table's history).

use crate::Text;
use hashbrown::hash_table::{Entry, HashTable};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::hash::BuildHasher;

/// Id text → state, with [`KeyedMap::prefetch`].
#[derive(Clone, Debug)]
pub struct KeyedMap<V> {
    table: HashTable<(Text, V)>,
}

impl<V> Default for KeyedMap<V> {
    fn default() -> Self {
        KeyedMap { table: HashTable::new() }
    }
}

fn hash_of(key: &str) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(key)
}

fn rehash<V>(entry: &(Text, V)) -> u64 {
    hash_of(&entry.0)
}

impl<V> KeyedMap<V> {
    pub fn new() -> Self {
        KeyedMap::default()
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    #[inline]
    pub fn get(&self, key: &str) -> Option<&V> {
        self.table.find(hash_of(key), |(stored, _)| crate::same_text(stored, key)).map(|(_, value)| value)
    }

    #[inline]
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.table.find_mut(hash_of(key), |(stored, _)| crate::same_text(stored, key)).map(|(_, value)| value)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: Text, value: V) -> Option<V> {
        match self.table.entry(hash_of(&key), |(stored, _)| crate::same_text(stored, &key), rehash) {
            Entry::Occupied(mut occupied) => Some(std::mem::replace(&mut occupied.get_mut().1, value)),
            Entry::Vacant(vacant) => {
                vacant.insert((key, value));
                None
            }
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        match self.table.find_entry(hash_of(key), |(stored, _)| crate::same_text(stored, key)) {
            Ok(occupied) => Some(occupied.remove().0 .1),
            Err(_) => None,
        }
    }

    /// Inserts `make()` under `key` unless `key` is there (then nothing is made): true if inserted. One
    /// lookup, where `contains_key` then `insert` made two.
    pub fn insert_new(&mut self, key: &str, make: impl FnOnce() -> V) -> bool {
        match self.table.entry(hash_of(key), |(stored, _)| crate::same_text(stored, key), rehash) {
            Entry::Occupied(_) => false,
            Entry::Vacant(vacant) => {
                vacant.insert((Text::from(key), make()));
                true
            }
        }
    }

    /// The value of `key`, made with `make` first if there is none.
    pub fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        let entry = self.table.entry(hash_of(key), |(stored, _)| crate::same_text(stored, key), rehash);
        &mut entry.or_insert_with(|| (Text::from(key), make())).into_mut().1
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Text, &V)> {
        self.into_iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Text> {
        self.table.iter().map(|(key, _)| key)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|(_, value)| value)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.table.iter_mut().map(|(_, value)| value)
    }

    /// Asks the CPU to bring the cache line of `key`'s entry (no effect on any answer). Reads only the
    /// table's control bytes: the candidates' entries are not compared, just announced.
    pub fn prefetch(&self, key: &str) {
        // `find` walks the entries whose control byte matches the hash's top bits; the closure only
        // takes each one's address and answers "not this one", so no entry is read.
        let _ = self.table.find(hash_of(key), |entry| {
            crate::prefetch::lines(entry, PREFETCH_LINES_MAX);
            false
        });
    }
}

impl<'a, V> IntoIterator for &'a KeyedMap<V> {
    type Item = (&'a Text, &'a V);
    type IntoIter = std::iter::Map<hashbrown::hash_table::Iter<'a, (Text, V)>, fn(&'a (Text, V)) -> (&'a Text, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.table.iter().map(|(key, value)| (key, value))
    }
}

/// Cache lines of an entry announced at most (a large entry's first lines hold what is read first).
const PREFETCH_LINES_MAX: usize = 4;

impl<V: Serialize> Serialize for KeyedMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::snapshot::sorted_map::serialize_pairs(self.iter(), serializer)
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for KeyedMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let with_capacity = |pairs| KeyedMap { table: HashTable::with_capacity(pairs) };
        crate::snapshot::sorted_map::deserialize_pairs(deserializer, with_capacity, KeyedMap::insert)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn answers_like_an_ordered_map_through_inserts_replacements_and_removals() {
        let mut keyed = KeyedMap::new();
        let mut model = BTreeMap::new();
        for step in 0u32..2_000 {
            let key = Text::from(format!("k{}", (step * 7919) % 613));
            match step % 5 {
                0..=2 => assert_eq!(keyed.insert(key.clone(), step), model.insert(key, step)),
                3 => assert_eq!(keyed.remove(&key), model.remove(&key)),
                _ => {
                    *keyed.get_or_insert_with(&key, || step) += 1;
                    *model.entry(key).or_insert(step) += 1;
                }
            }
            keyed.prefetch("k1");
        }
        assert_eq!(keyed.len(), model.len());
        let mut pairs: Vec<(Text, u32)> = keyed.iter().map(|(key, value)| (key.clone(), *value)).collect();
        pairs.sort();
        assert_eq!(pairs, model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn serializes_sorted_and_refuses_a_key_given_twice() {
        let mut keyed = KeyedMap::new();
        for key in ["b", "c", "a"] {
            keyed.insert(Text::from(key), key.len());
        }
        let json = serde_json::to_string(&keyed).expect("serializes");
        assert_eq!(json, r#"[["a",1],["b",1],["c",1]]"#);
        let back: KeyedMap<usize> = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back.get("c"), Some(&1));
        let twice = serde_json::from_str::<KeyedMap<usize>>(r#"[["a",1],["a",2]]"#);
        assert!(twice.expect_err("a key given twice").to_string().contains("twice"));
    }
}
