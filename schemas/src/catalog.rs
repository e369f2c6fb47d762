//! The embedded schemas (the `.avsc` files under `schemas/avro/`, compiled into the binary) and the
//! topics that use them. Subjects follow Confluent's TopicNameStrategy: `{topic}-key`, `{topic}-value`.

use crate::error::{Error, Result};
use apache_avro::Schema;
use pipelines::partition::StageKind;
use std::sync::OnceLock;

/// Namespace of every schema (major version in the name: a breaking change is a new namespace and new
/// topics, never a new version of a subject).
pub const NAMESPACE: &str = "in.paisa.v1";

macro_rules! schema_names {
    ($($name:ident = $id:literal, $file:literal;)+) => {
        /// One embedded schema, named after its root record.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum SchemaName { $($name),+ }

        impl SchemaName {
            pub const ALL: &'static [SchemaName] = &[$(SchemaName::$name),+];

            /// The `.avsc` text compiled into the binary.
            pub fn text(self) -> &'static str {
                match self { $(SchemaName::$name => include_str!(concat!("../avro/", $file))),+ }
            }

            /// The file under `schemas/avro/`.
            pub fn file(self) -> &'static str {
                match self { $(SchemaName::$name => $file),+ }
            }

            /// The root record's full name.
            pub fn full_name(self) -> &'static str {
                match self { $(SchemaName::$name => concat!("in.paisa.v1.", stringify!($name))),+ }
            }

            /// The id [`crate::StaticResolver`] gives it (fixed forever: never reuse or renumber).
            pub fn static_id(self) -> u32 {
                match self { $(SchemaName::$name => $id),+ }
            }
        }
    };
}

schema_names! {
    Input = 1, "Input.avsc";
    StatementResult = 2, "StatementResult.avsc";
    CrawlRequest = 3, "CrawlRequest.avsc";
    StageRecord = 4, "StageRecord.avsc";
    Output = 5, "Output.avsc";
    ClockTick = 6, "ClockTick.avsc";
    ChangelogEntry = 7, "ChangelogEntry.avsc";
    CommandKey = 8, "CommandKey.avsc";
    OrderKey = 9, "OrderKey.avsc";
    AgentKey = 10, "AgentKey.avsc";
    MerchantKey = 11, "MerchantKey.avsc";
    OutputKey = 12, "OutputKey.avsc";
    TickKey = 13, "TickKey.avsc";
    ChangelogKey = 14, "ChangelogKey.avsc";
}

/// A parsed schema with the text it was parsed from (what a registry stores) and a fingerprint of that
/// text, so caches key on 8 bytes instead of hashing tens of kilobytes per message.
#[derive(Clone, Debug)]
pub struct SchemaDef {
    text: String,
    schema: Schema,
    fingerprint: u64,
}

impl SchemaDef {
    pub fn parse(text: impl Into<String>) -> Result<SchemaDef> {
        let text = text.into();
        let schema = Schema::parse_str(&text).map_err(|error| Error::InvalidSchema(error.to_string()))?;
        let fingerprint = fnv1a(text.as_bytes());
        Ok(SchemaDef { text, schema, fingerprint })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// FNV-1a (64 bits) of the text: identifies the text in caches (with the subject), not a security
    /// hash.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// The embedded schemas, parsed once.
fn parsed() -> &'static std::result::Result<Vec<SchemaDef>, String> {
    static PARSED: OnceLock<std::result::Result<Vec<SchemaDef>, String>> = OnceLock::new();
    PARSED.get_or_init(|| {
        SchemaName::ALL
            .iter()
            .map(|name| SchemaDef::parse(name.text()).map_err(|error| format!("{}: {error}", name.file())))
            .collect()
    })
}

/// An embedded schema, parsed (once, on first use).
pub fn embedded(name: SchemaName) -> Result<&'static SchemaDef> {
    match parsed() {
        Ok(all) => SchemaName::ALL
            .iter()
            .position(|known| *known == name)
            .and_then(|index| all.get(index))
            .ok_or_else(|| Error::InvalidSchema(format!("{name:?} is not embedded"))),
        Err(error) => Err(Error::InvalidSchema(error.clone())),
    }
}

/// The default topic namespace, as the Kafka backend's (`KafkaConfig::namespace`).
pub const TOPIC_NAMESPACE: &str = "paisa";

macro_rules! topics {
    ($($variant:ident = $suffix:literal, $key:ident, $value:ident, $doc:literal;)+) => {
        /// Every Kafka topic of the Kafka profile and the schemas of its keys and values. A topic is
        /// `{namespace}.{suffix}`; [`Topic::name`] and the subjects use the default namespace `paisa`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Topic { $(#[doc = $doc] $variant),+ }

        impl Topic {
            pub const ALL: &'static [Topic] = &[$(Topic::$variant),+];

            /// The name without its namespace (`agent`: the stage logs are named after their stage, as
            /// the Kafka backend's topics are).
            pub fn suffix(self) -> &'static str {
                match self { $(Topic::$variant => $suffix),+ }
            }

            /// The name in the default namespace: `paisa.{suffix}`.
            pub fn name(self) -> &'static str {
                match self { $(Topic::$variant => concat!("paisa.", $suffix)),+ }
            }

            pub fn key_schema(self) -> SchemaName {
                match self { $(Topic::$variant => SchemaName::$key),+ }
            }

            pub fn value_schema(self) -> SchemaName {
                match self { $(Topic::$variant => SchemaName::$value),+ }
            }

            /// TopicNameStrategy subject of the key in the default namespace: `paisa.{suffix}-key`.
            pub fn key_subject(self) -> &'static str {
                match self { $(Topic::$variant => concat!("paisa.", $suffix, "-key")),+ }
            }

            /// TopicNameStrategy subject of the value in the default namespace: `paisa.{suffix}-value`.
            pub fn value_subject(self) -> &'static str {
                match self { $(Topic::$variant => concat!("paisa.", $suffix, "-value")),+ }
            }
        }
    };
}

topics! {
    Commands = "commands", CommandKey, Input,
        "SPEC §5 inputs as the API accepted them, keyed by the stage and id they are routed to.";
    StatementResults = "statement-results", AgentKey, StatementResult,
        "The statement connector's answers (`crawl_result`), keyed by agent.";
    CrawlRequests = "crawl-requests", AgentKey, CrawlRequest,
        "`crawl_requested` outputs for the statement connector, keyed by agent.";
    OrderStage = "order", OrderKey, StageRecord,
        "The order stage's input log: routed inputs, other stages' messages, ticks.";
    AgentStage = "agent", AgentKey, StageRecord,
        "The agent stage's input log (the order and merchant stages' outputs to it among them).";
    MerchantStage = "merchant", MerchantKey, StageRecord,
        "The merchant stage's input log (the order stage's outputs to it among them).";
    Outputs = "outputs", OutputKey, Output,
        "SPEC §6 outputs (callbacks, notifications, rejections, crawl requests).";
    Ticks = "ticks", TickKey, ClockTick,
        "Ticks the runtime appends so timers fire on quiet partitions (SPEC §3).";
    Changelog = "changelog", ChangelogKey, ChangelogEntry,
        "Compacted changelog of the stages' keyed state.";
}

impl Topic {
    /// The input log of a stage.
    pub fn stage(kind: StageKind) -> Topic {
        match kind {
            StageKind::Order => Topic::OrderStage,
            StageKind::Agent => Topic::AgentStage,
            StageKind::Merchant => Topic::MerchantStage,
        }
    }
}

/// TopicNameStrategy for a topic name not in [`Topic`] (a prefixed deployment, a test topic).
pub fn subject(topic: &str, is_key: bool) -> String {
    format!("{topic}-{}", if is_key { "key" } else { "value" })
}
