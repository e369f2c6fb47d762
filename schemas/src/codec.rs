//! Keys and values of a topic to and from Confluent-framed Avro bytes, with schema ids from a
//! [`SchemaResolver`]. Writers use the embedded schema of the Rust type; readers resolve the writer's
//! schema (found by the id in the message) to it, so a consumer reads data written under any earlier
//! BACKWARD-compatible version.

use crate::catalog::{embedded, subject, SchemaName, Topic};
use crate::convert::AvroRecord;
use crate::error::{Error, Result};
use crate::resolver::SchemaResolver;
use crate::wire;
use std::collections::HashMap;
use std::sync::Mutex;

/// Writer schemas remembered as equal (or not) to a reader's: beyond this many, the memo starts over.
const SAME_SCHEMA_MEMO_MAX: usize = 4_096;

pub struct TopicCodec<R> {
    resolver: R,
    /// (key subject, value subject) of each topic, in [`Topic::ALL`] order, in this codec's namespace.
    subjects: Vec<(String, String)>,
    /// (writer id, reader schema) → whether the writer schema is the reader's, so that reading what
    /// the current version wrote skips schema resolution (which copies every value).
    same: Mutex<HashMap<(u32, SchemaName), bool>>,
}

impl<R: SchemaResolver> TopicCodec<R> {
    /// A codec for the topics of the default namespace (`paisa.*`).
    pub fn new(resolver: R) -> TopicCodec<R> {
        TopicCodec::with_namespace(resolver, crate::catalog::TOPIC_NAMESPACE)
    }

    /// A codec for the topics `{namespace}.{suffix}` (the Kafka backend's `KafkaConfig::namespace`):
    /// subjects are `{namespace}.{suffix}-key` and `-value` (TopicNameStrategy).
    pub fn with_namespace(resolver: R, namespace: &str) -> TopicCodec<R> {
        let subjects = Topic::ALL
            .iter()
            .map(|topic| {
                let name = format!("{namespace}.{}", topic.suffix());
                (subject(&name, true), subject(&name, false))
            })
            .collect();
        TopicCodec { resolver, subjects, same: Mutex::new(HashMap::new()) }
    }

    /// The (key, value) subjects of a topic in this codec's namespace.
    pub fn subjects(&self, topic: Topic) -> (&str, &str) {
        Topic::ALL
            .iter()
            .position(|known| *known == topic)
            .and_then(|index| self.subjects.get(index))
            .map_or(("", ""), |(key, value)| (key.as_str(), value.as_str()))
    }

    pub fn resolver(&self) -> &R {
        &self.resolver
    }

    pub async fn encode_key<T: AvroRecord>(&self, topic: Topic, key: &T) -> Result<Vec<u8>> {
        self.encode(topic, self.subjects(topic).0, topic.key_schema(), key).await
    }

    pub async fn encode_value<T: AvroRecord>(&self, topic: Topic, value: &T) -> Result<Vec<u8>> {
        self.encode(topic, self.subjects(topic).1, topic.value_schema(), value).await
    }

    pub async fn decode_key<T: AvroRecord>(&self, topic: Topic, bytes: &[u8]) -> Result<T> {
        self.decode(topic, topic.key_schema(), bytes).await
    }

    pub async fn decode_value<T: AvroRecord>(&self, topic: Topic, bytes: &[u8]) -> Result<T> {
        self.decode(topic, topic.value_schema(), bytes).await
    }

    async fn encode<T: AvroRecord>(
        &self,
        topic: Topic,
        subject: &str,
        expected: SchemaName,
        value: &T,
    ) -> Result<Vec<u8>> {
        check_topic::<T>(topic, expected)?;
        let def = embedded(T::SCHEMA)?;
        let id = self.resolver.id_for(subject, def).await?;
        wire::encode(id, def.schema(), T::SCHEMA.full_name(), value.to_avro()?)
    }

    async fn decode<T: AvroRecord>(&self, topic: Topic, expected: SchemaName, bytes: &[u8]) -> Result<T> {
        check_topic::<T>(topic, expected)?;
        let reader = embedded(T::SCHEMA)?;
        let (id, body) = wire::unframe(bytes)?;
        let writer = self.resolver.schema_for(id).await?;
        let memo = self.same.lock().ok().and_then(|same| same.get(&(id, T::SCHEMA)).copied());
        let same = match memo {
            Some(same) => same,
            None => {
                let same = *writer == *reader.schema();
                if let Ok(mut memo) = self.same.lock() {
                    if memo.len() >= SAME_SCHEMA_MEMO_MAX {
                        memo.clear();
                    }
                    memo.insert((id, T::SCHEMA), same);
                }
                same
            }
        };
        let value = wire::decode_body(id, body, &writer, if same { None } else { Some(reader.schema()) })?;
        T::from_avro(value)
    }
}

fn check_topic<T: AvroRecord>(topic: Topic, expected: SchemaName) -> Result<()> {
    if T::SCHEMA == expected {
        Ok(())
    } else {
        Err(Error::WrongTopic { topic: topic.name(), expected: expected.full_name(), got: T::SCHEMA.full_name() })
    }
}
