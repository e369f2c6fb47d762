//! Paisa's reconciliation engine: pure, deterministic stages (SPEC §3) that turn input events into state
//! and outputs. No I/O, no OS clock, no randomness, no async: time arrives as event time and timers are
//! state, so replay, reprocessing and crash recovery give byte-identical results.
//!
//! Where a rule lives: `stages::order` (R-DSP-1 arbitration, R-CLOSE-3, R-EXP-1, R-POST-1 routing,
//! R-ADMIN-4), `stages::merchant` (R-MER-*), `stages::agent` (everything keyed by agent: R-DSP-1 checks,
//! R-BAL-1, R-WIN-*, R-MATCH-*, R-CHK-*, R-WAVE-*, R-CLOSE-*, R-REAUTH-1, R-PAY-1, R-PEND-*, R-HIS-*,
//! R-POST-2, R-DEBT-*, R-ERR-*, R-ADMIN-1/3, R-JRN-*, R-AUDIT-1), `input` (R-IN-1 structure),
//! `wallet_sim` (SPEC §9 provider), `engine` (SPEC §3 ordering), `replay` (SPEC §9), `partition` (SPEC §3
//! partitioned stages) and `answer_barrier` (an agent partition waits for crawl answers in flight).

pub mod allocator;
pub mod answer_barrier;
pub mod bits;
pub mod config;
pub mod decode;
pub mod document;
pub mod engine;
pub mod envelope;
pub mod input;
pub mod invariants;
pub mod keyed;
pub mod money;
pub mod output;
pub mod partition;
mod prefetch;
pub mod replay;
pub mod seen;
pub mod segmented;
pub mod snapshot;
pub mod stages;
pub mod time;
pub mod time_ordered;
pub mod timers;
pub mod wallet_sim;
pub mod workload;

pub use config::Config;
pub use engine::Engine;
pub use input::Input;
pub use money::Money;
pub use time::Timestamp;

/// The engine's short strings: ids (orders, agents, cards, merchants, transactions, requests, events),
/// UTRs and amounts as given. Up to 24 bytes they are stored inline, so cloning one into a message, a
/// timer or a map key allocates nothing and comparing one reads no second cache line; longer ones
/// (e.g. UUID event ids) go to the heap like a `String`. Serialised as a plain JSON string.
pub type Text = compact_str::CompactString;

/// Whether two texts are equal, comparing ids of up to 16 bytes (order, agent, card, txn and event
/// ids, prefixes) as two overlapping machine words instead of calling `memcmp`: the engine compares
/// such ids at every table lookup, and the call cost ≈ 20 instructions each, ≈ 3.5 % of the engine
/// benchmark's instructions (`callgrind`). Longer texts compare as `==` does.
#[inline]
pub fn same_text(first: &str, second: &str) -> bool {
    let (first, second) = (first.as_bytes(), second.as_bytes());
    if first.len() != second.len() {
        return false;
    }
    match first.len() {
        0..4 => first.iter().zip(second).all(|(left, right)| left == right),
        4..8 => {
            first.first_chunk::<4>() == second.first_chunk::<4>() && first.last_chunk::<4>() == second.last_chunk::<4>()
        }
        8..=16 => {
            first.first_chunk::<8>() == second.first_chunk::<8>() && first.last_chunk::<8>() == second.last_chunk::<8>()
        }
        _ => first == second,
    }
}

/// `"{first}{separator}{second}"` as a [`Text`], without the formatting machinery (ids built on hot
/// paths: request ids, callback ids, provider answers' event ids). An id that fits inline is assembled
/// on the stack and copied once (three `push_str`s each re-check capacity and re-encode the length).
pub fn joined(first: &str, separator: char, second: &str) -> Text {
    joined_bytes(first, separator, second.as_bytes())
}

/// `"{first}{separator}{number}"` as a [`Text`] (see [`joined`]).
pub fn numbered(first: &str, separator: char, number: u64) -> Text {
    const DIGITS_MAX: usize = 20; // u64::MAX has 20 decimal digits
    let mut digits = [0u8; DIGITS_MAX];
    let mut start = DIGITS_MAX;
    let mut rest = number;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    // The digits go in as bytes: the whole id is checked as UTF-8 once, not the digits first.
    joined_bytes(first, separator, &digits[start..])
}

/// [`joined`] with the second part as the bytes of a `str`.
fn joined_bytes(first: &str, separator: char, second: &[u8]) -> Text {
    const INLINE_BYTES_MAX: usize = std::mem::size_of::<Text>();
    let length = first.len() + separator.len_utf8() + second.len();
    if length > INLINE_BYTES_MAX {
        let mut text = Text::with_capacity(length);
        text.push_str(first);
        text.push(separator);
        text.push_str(std::str::from_utf8(second).unwrap_or_default());
        return text;
    }
    let mut buffer = [0u8; INLINE_BYTES_MAX];
    let (head, rest) = buffer.split_at_mut(first.len());
    head.copy_from_slice(first.as_bytes());
    let (middle, rest) = rest.split_at_mut(separator.len_utf8());
    separator.encode_utf8(middle);
    rest[..second.len()].copy_from_slice(second);
    // Two strings and a character, concatenated: always UTF-8.
    Text::from_utf8(&buffer[..length]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The hand-built ids equal what `format!` writes.
        #[test]
        fn ids_are_what_format_writes(first in "[a-z0-9:-]{0,30}", second in "[a-z0-9:-]{0,30}", number: u64) {
            prop_assert_eq!(super::numbered(&first, ':', number).to_string(), format!("{first}:{number}"));
            prop_assert_eq!(super::joined(&first, ':', &second).to_string(), format!("{first}:{second}"));
        }

        /// Equality, a copy, and one byte changed anywhere (in each of the word comparisons' ranges).
        #[test]
        fn same_text_is_equality(first in "[ab]{0,20}|\\PC{0,20}", second in "[ab]{0,20}|\\PC{0,20}", position: usize) {
            prop_assert_eq!(super::same_text(&first, &second), first == second);
            prop_assert!(super::same_text(&first, &first.clone()));
            let mut changed = first.clone().into_bytes();
            if !changed.is_empty() {
                let index = position % changed.len();
                changed[index] ^= 1;
                if let Ok(changed) = String::from_utf8(changed) {
                    prop_assert!(!super::same_text(&first, &changed), "{} {}", first, changed);
                }
            }
        }

        /// Around the inline size, and with characters of every UTF-8 length.
        #[test]
        fn joined_is_concatenation(first in "\\PC{0,14}", separator: char, second in "\\PC{0,14}") {
            let text = super::joined(&first, separator, &second);
            prop_assert_eq!(text.as_str(), format!("{first}{separator}{second}"));
        }
    }

    #[test]
    fn numbers_at_the_edges() {
        assert_eq!(super::numbered("k", ':', 0), "k:0");
        assert_eq!(super::numbered("k", ':', u64::MAX), format!("k:{}", u64::MAX));
    }
}

/// Everything the engine refuses, as one type for callers. The pure core does no I/O, so nothing here
/// is retryable: each variant is bad input that the same bytes will always fail (a service dead-letters
/// it, replay stops with exit 2). Retryable failures (a broker, a store, a provider) belong to the crates
/// that do I/O.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Parse(#[from] input::ParseError),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Scenario(#[from] replay::ScenarioError),
}

impl Error {
    /// Always false for the pure engine (see the type's documentation).
    pub fn is_retryable(&self) -> bool {
        false
    }
}
