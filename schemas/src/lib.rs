//! Avro schemas for every topic of Paisa's Kafka profile (issue 4), the conversions between them and
//! the pipelines' types (SPEC §5 inputs, SPEC §6 outputs, the stages' records), the Confluent wire format
//! and schema resolvers (fixed ids, or a Confluent Schema Registry).
//!
//! - [`catalog`]: the `.avsc` files (compiled in), their topics and subjects (TopicNameStrategy);
//! - [`convert`]: [`AvroRecord`] for `Input`, `Output`, `StageRecord` and the topic-specific records;
//! - [`wire`]: magic byte 0, 4-byte big-endian schema id, Avro binary body;
//! - [`resolver`]: [`SchemaResolver`], [`StaticResolver`], [`RegistryResolver`];
//! - [`codec`]: [`TopicCodec`], a topic's keys and values to and from bytes.
//!
//! Money is `decimal(18, 2)` where the Rust type is [`pipelines::Money`]; where an input carries an
//! amount as written (a string, so that a malformed amount is a stage's `invalid_amount`, R-IN-1), the
//! schema carries the string. Times are `timestamp-millis`, as [`pipelines::Timestamp`] is.

pub mod catalog;
pub mod codec;
pub mod convert;
pub mod error;
pub mod resolve;
pub mod resolver;
mod value;
pub mod wire;

pub use catalog::{embedded, SchemaDef, SchemaName, Topic};
pub use codec::TopicCodec;
pub use convert::{
    AgentKey, AvroRecord, ChangelogEntry, ChangelogKey, ClockTick, CommandKey, CrawlRequest, MerchantKey, OrderKey,
    OutputKey, StatementResult, TickKey,
};
pub use error::{Error, Result};
pub use resolver::{RegistryResolver, SchemaResolver, StaticResolver};

#[cfg(test)]
mod tests;
