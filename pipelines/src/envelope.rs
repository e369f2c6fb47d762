//! Inputs read straight from JSON text, without a tree of JSON values first: the fast path of the
//! services' bulk requests (`POST /v1/events` of `paisa serve`, `POST /sim/v1/events` of `paisa
//! wallet-sim`).
//!
//! Why: those requests parsed every body into `serde_json::Value`s (each object a map with its own
//! allocations, each key and string copied) and then read the input from the map. In the serve
//! benchmark that was ≈ a quarter of the simulator's CPU time and ≈ 4 % of the service's, on the
//! path every bulk request waits for.
//!
//! How: an event object is read key by key. `at` and `event_id` (the envelope) are kept wherever they
//! are; the command's tag (`type`) must come before the command's fields, as everything this system
//! writes puts it (serde writes an `Input` as `event_id`, `at`, `type`, then the fields). From the tag
//! on, the remaining entries go straight to the variant's own `Deserialize`, with the envelope's keys
//! taken out on the way ([`crate::decode`] does the same for records).
//!
//! Only the fast path: anything else (the tag after a field, a key given twice, a malformed or
//! unknown field, more events than allowed) makes [`read_envelopes`] answer `None`, and the caller
//! reads the body the way it always did, which names the faulty field and the event's index. A body is
//! read entirely one way or the other, so the answer to a request does not depend on the path.

use crate::decode::Tagged;
use crate::input::Command;
use crate::time::Timestamp;
use serde::de::{DeserializeSeed, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// One event object as given: its envelope (either part may be absent or null) and its command.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    pub at: Option<Timestamp>,
    pub event_id: Option<String>,
    pub command: Command,
}

/// Reads a body holding an array of at most `events_max` event objects (a bulk request). None when the
/// body is anything else, or does not read on the fast path (see the module's documentation). A single
/// object is left to the slow path: it is one event, and its errors are named without an index.
pub fn read_envelopes(body: &[u8], events_max: usize) -> Option<Vec<Envelope>> {
    // Text that is not UTF-8 is left to the slow path too, which names the error.
    let mut deserializer = serde_json::Deserializer::from_str(std::str::from_utf8(body).ok()?);
    let events_expected = (body.len() / EVENT_BYTES_TYPICAL).min(events_max);
    let envelopes = deserializer.deserialize_seq(BodyVisitor { events_max, events_expected }).ok()?;
    // Trailing bytes other than whitespace are malformed JSON: the slow path says so.
    deserializer.end().ok()?;
    Some(envelopes)
}

/// About the most bytes one event object of a bulk takes (most take 150–250): the body's length over it
/// is the room its events are given up front. JSON arrays carry no count, and growing the list from
/// empty moved it ≈ 8 times for a bulk of 1,000 (≈ 0.3 % of the serve benchmark's CPU, `perf`).
const EVENT_BYTES_TYPICAL: usize = 256;

/// A key of the envelope, or the command's tag.
enum EnvelopeKey {
    At,
    EventId,
    Type,
}

/// What a key was: the envelope's (the field seed handed back, unused, for the next key), or one of
/// the command's fields, read by that seed.
enum KeyRead<Field, Seed> {
    Envelope(EnvelopeKey, Seed),
    Field(Field),
}

/// The envelope's parts met so far. A part given twice is refused: JSON values would keep the last,
/// the fast path does not decide that.
#[derive(Default)]
struct Parts {
    at: Option<Option<Timestamp>>,
    event_id: Option<Option<String>>,
}

impl Parts {
    /// Reads the value of envelope key `key` from `map` (the tag is read by the caller, once).
    fn read<'de, A: MapAccess<'de>>(&mut self, key: EnvelopeKey, map: &mut A) -> Result<(), A::Error> {
        match key {
            EnvelopeKey::At if self.at.is_none() => self.at = Some(map.next_value()?),
            EnvelopeKey::EventId if self.event_id.is_none() => self.event_id = Some(map.next_value()?),
            EnvelopeKey::At => return Err(A::Error::duplicate_field("at")),
            EnvelopeKey::EventId => return Err(A::Error::duplicate_field("event_id")),
            EnvelopeKey::Type => return Err(A::Error::duplicate_field("type")),
        }
        Ok(())
    }
}

/// Reads a key without allocating: an envelope key, or (by `field`) one of the command's fields.
struct KeySeed<Seed> {
    field: Seed,
}

impl<'de, Seed: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<Seed> {
    type Value = KeyRead<Seed::Value, Seed>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, Seed: DeserializeSeed<'de>> Visitor<'de> for KeySeed<Seed> {
    type Value = KeyRead<Seed::Value, Seed>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a key")
    }

    fn visit_str<E: Error>(self, key: &str) -> Result<Self::Value, E> {
        let envelope_key = match key {
            "at" => EnvelopeKey::At,
            "event_id" => EnvelopeKey::EventId,
            "type" => EnvelopeKey::Type,
            _ => return self.field.deserialize(serde::de::value::StrDeserializer::<E>::new(key)).map(KeyRead::Field),
        };
        Ok(KeyRead::Envelope(envelope_key, self.field))
    }
}

/// The entries after the tag, as the variant reads them: the envelope's keys are taken out into
/// `parts` on the way.
struct CommandFields<'parts, A> {
    map: A,
    parts: &'parts mut Parts,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for CommandFields<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        let mut seed = seed;
        loop {
            match self.map.next_key_seed(KeySeed { field: seed })? {
                None => return Ok(None),
                Some(KeyRead::Field(field)) => return Ok(Some(field)),
                Some(KeyRead::Envelope(key, returned)) => {
                    self.parts.read(key, &mut self.map)?;
                    seed = returned;
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// One event object.
struct EnvelopeSeed;

impl<'de> DeserializeSeed<'de> for EnvelopeSeed {
    type Value = Envelope;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Envelope, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EnvelopeSeed {
    type Value = Envelope;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an event object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
        let mut parts = Parts::default();
        // The envelope's keys up to the tag; a command field before it (no field is expected yet: its
        // key is read as nothing) leaves the event to the slow path.
        loop {
            match map.next_key_seed(KeySeed { field: PhantomData::<IgnoredAny> })? {
                None => return Err(A::Error::missing_field("type")),
                Some(KeyRead::Field(_)) => return Err(A::Error::custom("a command field before `type`")),
                Some(KeyRead::Envelope(EnvelopeKey::Type, _)) => break,
                Some(KeyRead::Envelope(key, _)) => parts.read(key, &mut map)?,
            }
        }
        let index = map.next_value_seed(crate::decode::VariantSeed(Command::VARIANTS))?;
        let fields = CommandFields { map, parts: &mut parts };
        let command = Command::variant(index, serde::de::value::MapAccessDeserializer::new(fields))?;
        Ok(Envelope { at: parts.at.flatten(), event_id: parts.event_id.flatten(), command })
    }
}

/// A body: an array of at most `events_max` event objects.
struct BodyVisitor {
    events_max: usize,
    /// Room taken for events up front.
    events_expected: usize,
}

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = Vec<Envelope>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an array of event objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Envelope>, A::Error> {
        let hint = seq.size_hint().unwrap_or(self.events_expected);
        let mut envelopes = Vec::with_capacity(hint.min(self.events_max));
        while let Some(envelope) = seq.next_element_seed(EnvelopeSeed)? {
            if envelopes.len() == self.events_max {
                return Err(A::Error::custom("too many events"));
            }
            envelopes.push(envelope);
        }
        Ok(envelopes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{parse_line, Parsed};

    /// The slow path's reading of one event object (`parse_line`, as `paisa replay` reads a line).
    fn slow(text: &str) -> Option<Envelope> {
        match parse_line(text, || "default".to_string()).ok()? {
            Parsed::Input(input) => Some(Envelope {
                at: Some(input.at),
                event_id: Some(input.event_id.to_string()),
                command: input.command,
            }),
            Parsed::Config(_) => None,
        }
    }

    #[test]
    fn reads_every_workload_input_as_the_slow_path_does() {
        let inputs = crate::workload::workload(60, 3);
        let texts: Vec<String> = inputs.iter().map(|input| serde_json::to_string(input).expect("JSON")).collect();
        let body = format!("[{}]", texts.join(","));
        let envelopes = read_envelopes(body.as_bytes(), texts.len()).expect("the fast path reads the workload");
        assert_eq!(envelopes.len(), inputs.len());
        let mut types = std::collections::BTreeSet::new();
        for (text, envelope) in texts.iter().zip(&envelopes) {
            assert_eq!(Some(envelope), slow(text).as_ref(), "{text}");
            types.insert(envelope.command.type_name());
        }
        assert!(types.len() >= 10, "the workload covers many command types: {types:?}");
        // One object alone, not in an array, is the slow path's.
        assert_eq!(read_envelopes(texts[0].as_bytes(), 1), None);
        assert_eq!(read_envelopes(format!("[{}]", texts[0]).as_bytes(), 1), Some(vec![envelopes[0].clone()]));
    }

    #[test]
    fn keeps_the_envelope_wherever_it_is_and_leaves_absent_parts_absent() {
        let text = r#"{"type":"merchant_deposit","merchant_id":"m1","at":"2026-03-02T10:00:00Z","amount":"10.00"}"#;
        let envelope = &read_envelopes(format!("[{text}]").as_bytes(), 1).expect("read")[0];
        assert_eq!(envelope.at, Timestamp::parse("2026-03-02T10:00:00Z"));
        assert_eq!(envelope.event_id, None);
        assert_eq!(envelope.command.type_name(), "merchant_deposit");
        let text = r#"{"event_id":null,"at":null,"type":"merchant_deposit","merchant_id":"m1","amount":"10.00"}"#;
        let envelope = &read_envelopes(format!("[{text}]").as_bytes(), 1).expect("read")[0];
        assert_eq!((envelope.at, envelope.event_id.as_deref()), (None, None));
        let text = r#"{"type":"merchant_deposit","merchant_id":"m1","amount":"10.00","event_id":"e9"}"#;
        let envelope = &read_envelopes(format!("[{text}]").as_bytes(), 1).expect("read")[0];
        assert_eq!(envelope.event_id.as_deref(), Some("e9"));
    }

    #[test]
    fn leaves_everything_unusual_to_the_slow_path() {
        let deposit = r#""type":"merchant_deposit","merchant_id":"m1","amount":"10.00""#;
        let refused = [
            // The tag after a command field (the slow path reads it).
            r#"{"merchant_id":"m1","type":"merchant_deposit","amount":"10.00"}"#.to_string(),
            // Envelope keys given twice, and the tag twice.
            format!(r#"{{"at":"2026-03-02T10:00:00Z","at":"2026-03-02T10:00:01Z",{deposit}}}"#),
            format!(r#"{{"event_id":"a",{deposit},"event_id":"b"}}"#),
            format!(r#"{{{deposit},"type":"merchant_deposit"}}"#),
            // Malformed or mistyped parts, unknown fields and types, no tag.
            format!(r#"{{"at":"yesterday",{deposit}}}"#),
            format!(r#"{{"event_id":7,{deposit}}}"#),
            format!(r#"{{{deposit},"colour":"blue"}}"#),
            r#"{"type":"config","crawl_timeout_s":5}"#.to_string(),
            r#"{"type":"no_such_type"}"#.to_string(),
            r#"{"merchant_id":"m1"}"#.to_string(),
            // Not an event object, or not JSON.
            "1".to_string(),
            "\"text\"".to_string(),
            format!("{{{deposit}}}] trailing ["),
            format!("{{{deposit}"),
        ];
        for event in &refused {
            let body = format!("[{event}]");
            assert_eq!(read_envelopes(body.as_bytes(), 10), None, "{body}");
        }
        let two = format!("[{{{deposit}}},{{{deposit}}}]");
        assert_eq!(read_envelopes(two.as_bytes(), 2).map(|envelopes| envelopes.len()), Some(2));
        assert_eq!(read_envelopes(two.as_bytes(), 1), None, "more events than allowed");
        assert_eq!(read_envelopes(b"[]", 1), Some(Vec::new()));
    }
}
