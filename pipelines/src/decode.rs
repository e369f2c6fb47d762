//! Reading records without needless copies: internally tagged enums (`{"type": "…", …fields}`) without
//! buffering them first, and strings parsed in place.
//!
//! serde's derived `Deserialize` for an internally tagged enum cannot know where the tag is, so it
//! copies every entry into its own in-memory tree (`Content`) before looking for it, and reads the
//! variant from that copy; a tagged enum inside another one is copied again. For a log record holding a
//! statement page that was half the time of reading it. Everything this system writes has the tag
//! first (serde's derived `Serialize` writes it first), so here the first key is checked: if it is the
//! tag, the variant is known at once and the remaining entries go straight to the variant's own
//! `Deserialize`. Input written by others may put the tag anywhere: then the entries are collected as
//! JSON values and the variant is read from them, with the same errors (unknown fields, missing
//! fields, unknown variants).
//!
//! Bytes are read as JSON through [`from_json_bytes`]: checked as UTF-8 once, as a whole, then read as
//! text. `serde_json::from_slice` checks each string it reads on its own instead, which made reading a
//! statement page ≈ 40 % slower (0.50 against 0.36 µs a line, the serve workload's lines).

use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;
use std::marker::PhantomData;

/// Reads `T` from JSON bytes: the same values and errors as `serde_json::from_slice`, faster (module
/// documentation). Bytes that are not UTF-8 are an error naming where they stop being so: JSON text is
/// UTF-8 (RFC 8259 §8.1), and `from_slice` refuses them too wherever it reads a value.
pub fn from_json_bytes<'de, T: serde::Deserialize<'de>>(bytes: &'de [u8]) -> serde_json::Result<T> {
    let text = std::str::from_utf8(bytes).map_err(|error| {
        serde_json::Error::custom(format!("invalid UTF-8 at byte {} of the JSON text", error.valid_up_to()))
    })?;
    serde_json::from_str(text)
}

/// An enum whose variants are read from a map holding the tag `TAG` beside the variant's fields.
pub trait Tagged: Sized {
    /// The tag's key (`type`).
    const TAG: &'static str;
    /// The variants' tag values, by index.
    const VARIANTS: &'static [&'static str];
    /// Reads variant `index` of [`Tagged::VARIANTS`] from the rest of the map (the tag taken out).
    fn variant<'de, D: Deserializer<'de>>(index: usize, fields: D) -> Result<Self, D::Error>;
}

/// Reads `T` from a map: without buffering when the tag is the first key.
pub fn deserialize<'de, T: Tagged, D: Deserializer<'de>>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_map(TaggedVisitor::<T>(PhantomData))
}

/// Reads `T` from entries already collected as JSON values (the tag anywhere among them).
fn from_object<T: Tagged, E: Error>(mut object: Map<String, Value>) -> Result<T, E> {
    let index = match object.remove(T::TAG) {
        Some(Value::String(name)) => variant_index(&name, T::VARIANTS)?,
        Some(other) => return Err(E::custom(format!("`{}` must be a string, not {other}", T::TAG))),
        None => return Err(E::missing_field(T::TAG)),
    };
    T::variant(index, Value::Object(object)).map_err(E::custom)
}

/// Adds the remaining entries of `map` to `object` (a key given twice is refused, as serde_json does
/// for the structs it reads).
fn collect_rest<'de, A: MapAccess<'de>>(object: &mut Map<String, Value>, mut map: A) -> Result<(), A::Error> {
    while let Some(key) = map.next_key::<String>()? {
        let value: Value = map.next_value()?;
        if object.contains_key(&key) {
            return Err(A::Error::custom(format!("duplicate field `{key}`")));
        }
        object.insert(key, value);
    }
    Ok(())
}

fn variant_index<E: Error>(name: &str, variants: &'static [&'static str]) -> Result<usize, E> {
    variants.iter().position(|variant| *variant == name).ok_or_else(|| E::unknown_variant(name, variants))
}

/// A key of a tagged map: the tag, or another key (kept, for the slow path).
enum Key {
    Tag,
    Other(String),
}

/// Reads a key, telling the tag from the others without allocating for the tag.
struct KeySeed(&'static str);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        parse_str(deserializer, |key| Ok(if key == self.0 { Key::Tag } else { Key::Other(key.to_string()) }))
    }
}

/// Reads a tag value as the index of its variant, without allocating.
pub(crate) struct VariantSeed(pub(crate) &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for VariantSeed {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for VariantSeed {
    type Value = usize;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a variant name")
    }

    fn visit_str<E: Error>(self, name: &str) -> Result<usize, E> {
        variant_index(name, self.0)
    }
}

struct TaggedVisitor<T>(PhantomData<T>);

impl<'de, T: Tagged> Visitor<'de> for TaggedVisitor<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        write!(formatter, "an object with `{}`", T::TAG)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        match map.next_key_seed(KeySeed(T::TAG))? {
            Some(Key::Tag) => {
                let index = map.next_value_seed(VariantSeed(T::VARIANTS))?;
                T::variant(index, serde::de::value::MapAccessDeserializer::new(map))
            }
            Some(Key::Other(key)) => {
                let value: Value = map.next_value()?;
                let mut object = Map::new();
                object.insert(key, value);
                collect_rest(&mut object, map)?;
                from_object::<T, A::Error>(object)
            }
            None => Err(A::Error::missing_field(T::TAG)),
        }
    }
}

/// A tagged enum's variant struct whose fields can be written by position: `[tag, fields…]`, the form
/// [`deserialize_positional`] reads (`crate::input`'s structs; their macro implements it).
pub trait PositionalFields {
    /// How many fields the struct has.
    const COUNT: usize;
    /// Writes every field, in declaration order.
    fn serialize_fields<T: serde::ser::SerializeTuple>(&self, tuple: &mut T) -> Result<(), T::Error>;
}

/// Writes `[tag, fields…]`: a variant as the `serialize_positional` of [`tagged_newtype_enum`]
/// writes it.
pub fn tagged_tuple<S: serde::Serializer, F: PositionalFields>(
    serializer: S,
    tag: &'static str,
    fields: &F,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeTuple;
    let mut tuple = serializer.serialize_tuple(1 + F::COUNT)?;
    tuple.serialize_element(tag)?;
    fields.serialize_fields(&mut tuple)?;
    tuple.end()
}

/// Reads `T` from a map (as [`deserialize`]) or from an array holding the tag's value first and the
/// variant's fields after it in declaration order, as [`tagged_tuple`] writes it (a command inside a
/// message, `crate::stages::positional`). Fields the variant reads with a default may be left off the
/// end; a field more than the variant has is refused.
pub fn deserialize_positional<'de, T: Tagged, D: Deserializer<'de>>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(PositionalVisitor::<T>(PhantomData))
}

struct PositionalVisitor<T>(PhantomData<T>);

impl<'de, T: Tagged> Visitor<'de> for PositionalVisitor<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        write!(formatter, "an object with `{}`, or an array of its value and the fields", T::TAG)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        TaggedVisitor::<T>(PhantomData).visit_map(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut elements: A) -> Result<T, A::Error> {
        let index =
            elements.next_element_seed(VariantSeed(T::VARIANTS))?.ok_or_else(|| A::Error::missing_field(T::TAG))?;
        let value = T::variant(index, serde::de::value::SeqAccessDeserializer::new(&mut elements))?;
        // A struct's derived reader stops after its last field; anything behind it is not a field.
        if elements.next_element::<serde::de::IgnoredAny>()?.is_some() {
            let name = T::VARIANTS.get(index).copied().unwrap_or_default();
            return Err(A::Error::custom(format!("more fields than `{name}` has")));
        }
        Ok(value)
    }
}

/// Implements [`Tagged`] and `Deserialize` for an enum whose variants each hold one struct, and names
/// each variant's tag value with the method `$name_method` (one list for reading and naming). The
/// structs implement [`PositionalFields`]: `serialize_positional` writes a variant as
/// `[tag, fields…]`, which [`deserialize_positional`] reads.
#[macro_export]
macro_rules! tagged_newtype_enum {
    ($enum:ident, $tag:literal, $name_method:ident, { $( $name:literal => $variant:ident ),* $(,)? }) => {
        impl $enum {
            /// The variant's tag value (as the enum is written and read).
            pub fn $name_method(&self) -> &'static str {
                match self {
                    $( $enum::$variant(_) => $name, )*
                }
            }
        }

        impl $enum {
            /// Writes the variant as an array: its tag value, then its fields in declaration order.
            pub(crate) fn serialize_positional<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self {
                    $( $enum::$variant(fields) => $crate::decode::tagged_tuple(serializer, $name, fields), )*
                }
            }
        }

        impl $crate::decode::Tagged for $enum {
            const TAG: &'static str = $tag;
            const VARIANTS: &'static [&'static str] = &[$( $name ),*];
            fn variant<'de, D: serde::Deserializer<'de>>(index: usize, fields: D) -> Result<Self, D::Error> {
                match Self::VARIANTS.get(index).copied() {
                    $( Some($name) => Ok($enum::$variant(serde::Deserialize::deserialize(fields)?)), )*
                    _ => Err(<D::Error as serde::de::Error>::custom(format!("no variant {index}"))),
                }
            }
        }

        impl<'de> serde::Deserialize<'de> for $enum {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::decode::deserialize(deserializer)
            }
        }
    };
}

/// Reads a string and parses it in place (serde's `Cow<str>` always allocates an owned copy).
pub fn parse_str<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error> {
    struct StrVisitor<F>(F);
    impl<T, F: FnOnce(&str) -> Result<T, String>> Visitor<'_> for StrVisitor<F> {
        type Value = T;
        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            formatter.write_str("a string")
        }
        fn visit_str<E: Error>(self, text: &str) -> Result<T, E> {
            (self.0)(text).map_err(E::custom)
        }
    }
    deserializer.deserialize_str(StrVisitor(parse))
}

#[cfg(test)]
mod tests {
    use crate::input::Command;
    use crate::partition::{RecordBody, StageRecord};
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    /// Every command type the generated workload holds, as it serializes (tag first).
    fn commands() -> Vec<Command> {
        let mut seen = std::collections::BTreeSet::new();
        let inputs = crate::workload::workload(40, 2);
        inputs.into_iter().map(|input| input.command).filter(|command| seen.insert(command.type_name())).collect()
    }

    /// `value` with the keys of each object shuffled by `seed`.
    fn reorder(value: &Value, seed: &mut u64) -> Value {
        match value {
            Value::Object(object) => {
                let mut entries: Vec<(&String, &Value)> = object.iter().collect();
                for index in (1..entries.len()).rev() {
                    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    entries.swap(index, (*seed >> 33) as usize % (index + 1));
                }
                let reordered: Map<String, Value> =
                    entries.into_iter().map(|(key, value)| (key.clone(), reorder(value, seed))).collect();
                Value::Object(reordered)
            }
            Value::Array(items) => Value::Array(items.iter().map(|item| reorder(item, seed)).collect()),
            other => other.clone(),
        }
    }

    #[test]
    fn the_workload_has_many_command_types() {
        assert!(commands().len() >= 8, "{:?}", commands().iter().map(Command::type_name).collect::<Vec<_>>());
    }

    proptest! {
        /// The tag first (fast path) or anywhere (collected first): the same command, from text or from a
        /// JSON value.
        #[test]
        fn a_command_reads_the_same_whatever_its_key_order(seed in any::<u64>()) {
            for command in commands() {
                let value = serde_json::to_value(&command).expect("serializes");
                let reordered = reorder(&value, &mut seed.clone());
                let text = serde_json::to_string(&reordered).expect("serializes");
                let from_text: Command = serde_json::from_str(&text).expect("reads back");
                prop_assert_eq!(&from_text, &command, "{}", text);
                let from_value: Command = serde_json::from_value(reordered).expect("reads back");
                prop_assert_eq!(&from_value, &command);
            }
        }
    }

    fn error_of(text: &str) -> String {
        serde_json::from_str::<Command>(text).expect_err("refused").to_string()
    }

    #[test]
    fn errors_name_the_problem_in_either_order() {
        for (text, expected) in [
            (r#"{"type":"nope","order_id":"o1"}"#, "unknown variant `nope`"),
            (r#"{"order_id":"o1","type":"nope"}"#, "unknown variant `nope`"),
            (r#"{"order_id":"o1"}"#, "missing field `type`"),
            (r#"{}"#, "missing field `type`"),
            (r#"{"type":"collection_retry","order_id":"o1","extra":1}"#, "unknown field `extra`"),
            (r#"{"extra":1,"type":"collection_retry","order_id":"o1"}"#, "unknown field `extra`"),
            (r#"{"type":"collection_retry"}"#, "missing field `order_id`"),
            (r#"{"order_id":"o1","order_id":"o2","type":"collection_retry"}"#, "duplicate field `order_id`"),
            (r#"{"order_id":"o1","type":7}"#, "`type` must be a string"),
            (r#"{"type":7,"order_id":"o1"}"#, "invalid type: integer `7`"),
        ] {
            let error = error_of(text);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn a_record_body_reads_back_in_either_order() {
        let tick: StageRecord = serde_json::from_str(
            r#"{"id":{"source":"ticker","offset":5,"index":0},"at":"2026-03-02T09:00:00Z","body":{"kind":"tick"}}"#,
        )
        .expect("a tick");
        assert!(matches!(tick.body, RecordBody::Tick));
        let message = r#"{"Agent":{"user_id":"u1","body":{"Input":{"event_id":"e1","command":{"type":"card_reauthenticated","user_id":"u1","card_id":"c1"}}}}}"#;
        for body in [
            format!(r#"{{"kind":"message","message":{message}}}"#),
            format!(r#"{{"message":{message},"kind":"message"}}"#),
        ] {
            let text = format!(
                r#"{{"id":{{"source":"ingest","offset":1,"index":0}},"at":"2026-03-02T09:00:00Z","body":{body}}}"#
            );
            let record: StageRecord = serde_json::from_str(&text).expect("a message");
            let again = serde_json::to_string(&record).expect("serializes");
            // Written again in the array form (see `StageRecord`), the time in milliseconds, the message's
            // fields and its command's by position (`stages::positional`).
            let at = crate::time::Timestamp::parse("2026-03-02T09:00:00Z").expect("a time").millis();
            let positional = r#"{"Agent":["u1",{"Input":["e1",["card_reauthenticated","u1","c1"]]}]}"#;
            assert_eq!(again, format!(r#"["ingest",1,0,{at},{positional}]"#));
        }
        let error = serde_json::from_str::<RecordBody>(r#"{"kind":"nope"}"#).expect_err("refused").to_string();
        assert!(error.contains("unknown variant `nope`"), "{error}");
    }

    /// A stage record is written as `[source, offset, index, at, message]` (a tick without the message)
    /// and reads back to itself; an array of any other length or shape is refused, naming why.
    #[test]
    fn a_stage_record_is_written_as_an_array_and_reads_back() {
        let message = r#"{"Agent":["u1",{"Input":["e1",["card_reauthenticated","u1","c1"]]}]}"#;
        let before_the_epoch = crate::time::Timestamp::from_millis(-1_500);
        for (text, at) in [
            (r#"["ticker",5,0,1772442000000]"#.to_string(), 1_772_442_000_000),
            (format!(r#"["ingest",18446744073709551615,4294967295,-1500,{message}]"#), before_the_epoch.millis()),
        ] {
            let record: StageRecord = super::from_json_bytes(text.as_bytes()).expect("reads");
            assert_eq!(record.at.millis(), at);
            assert_eq!(serde_json::to_string(&record).expect("serializes"), text);
        }
        let tick: StageRecord = serde_json::from_str(r#"["ticker",5,0,7]"#).expect("a tick");
        assert!(matches!(tick.body, RecordBody::Tick));
        assert_eq!((tick.id.source.as_str(), tick.id.offset, tick.id.index), ("ticker", 5, 0));
        for (text, expected) in [
            (r#"["ticker",5,0]"#.to_string(), "invalid length 3"),
            (r#"[]"#.to_string(), "invalid length 0"),
            (format!(r#"["ingest",1,0,7,{message},1]"#), "invalid length 6"),
            (r#"["ticker",5,0,"2026-03-02T09:00:00Z"]"#.to_string(), "invalid type: string"),
            (r#"["ticker",-5,0,7]"#.to_string(), "invalid value: integer `-5`"),
            (r#""ticker""#.to_string(), "a stage record"),
        ] {
            let error = serde_json::from_str::<StageRecord>(&text).expect_err("refused").to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    /// Bytes read through `from_json_bytes` give what `from_slice` gives: the same commands, the same
    /// errors for malformed JSON; bytes that are not UTF-8 are refused, inside a string or not.
    #[test]
    fn json_bytes_read_as_from_slice_reads_them() {
        for command in commands() {
            let bytes = serde_json::to_vec(&command).expect("serializes");
            let read: Command = super::from_json_bytes(&bytes).expect("reads back");
            assert_eq!(read, command);
        }
        for text in [&br#"{"type":"collection_retry"}"#[..], b"[1,", b"{\"a\":1} x", b""] {
            let ours = super::from_json_bytes::<Command>(text).expect_err("refused").to_string();
            let theirs = serde_json::from_slice::<Command>(text).expect_err("refused").to_string();
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(text));
        }
        for text in [&b"{\"type\":\"collection_retry\",\"order_id\":\"o\xff\"}"[..], b"\xc3"] {
            let error = super::from_json_bytes::<Command>(text).expect_err("refused").to_string();
            assert!(error.starts_with("invalid UTF-8 at byte"), "{error}");
            assert!(serde_json::from_slice::<Command>(text).is_err(), "from_slice refuses it too");
        }
        let error = super::from_json_bytes::<Value>(b"[\"ok\", \"\xe2\x82\"]").expect_err("refused").to_string();
        assert_eq!(error, "invalid UTF-8 at byte 8 of the JSON text");
    }
}
