//! A set of small indexes as bits, one `u64` word per 64 indexes: the seen-id set's numbered ids
//! (`crate::seen`) and an agent's final sub-orders (`crate::stages::agent::state::Agent::final_subs`).

/// Indexes as bits; the words reach the highest index added (or what [`IndexBits::grow_to`] asked).
#[derive(Clone, Debug, Default)]
pub struct IndexBits {
    words: Vec<u64>,
}

fn word_and_bit(index: usize) -> (usize, u64) {
    (index / 64, 1 << (index % 64))
}

impl IndexBits {
    pub fn contains(&self, index: usize) -> bool {
        let (word, bit) = word_and_bit(index);
        self.words.get(word).is_some_and(|bits| bits & bit != 0)
    }

    /// Adds `index`; true if it was not in the set.
    pub fn insert(&mut self, index: usize) -> bool {
        let (word, bit) = word_and_bit(index);
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let new = self.words[word] & bit == 0;
        self.words[word] |= bit;
        new
    }

    pub fn remove(&mut self, index: usize) {
        let (word, bit) = word_and_bit(index);
        if let Some(bits) = self.words.get_mut(word) {
            *bits &= !bit;
        }
    }

    /// Adds or removes `index`.
    pub fn set(&mut self, index: usize, member: bool) {
        if member {
            self.insert(index);
        } else {
            self.remove(index);
        }
    }

    /// Words held.
    pub fn words(&self) -> usize {
        self.words.len()
    }

    /// Grows the words to `words` (a caller's growth policy); never shrinks.
    pub fn grow_to(&mut self, words: usize) {
        if words > self.words.len() {
            self.words.resize(words, 0);
        }
    }

    /// Asks the CPU for the word of `index`, if held (no effect on any answer).
    pub fn prefetch(&self, index: usize) {
        if let Some(word) = self.words.get(index / 64) {
            crate::prefetch::value(word);
        }
    }
}
