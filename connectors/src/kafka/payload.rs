//! What the records look like on the topics: Confluent-framed Avro (the `schemas` crate) for the stage
//! topics and the outputs topic, raw bytes for the dead-letter and state topics. The runtime hands the
//! store JSON-encoded records (the embedded store keeps those); the Kafka store converts at its
//! boundary, so the same processing code runs on both.
//!
//! An output's record id (the position that produced it, which consumers deduplicate on) is not part of
//! the SPEC §6 output: it travels in the `paisa-record-id` header.

use crate::runtime::{OutputRecord, RuntimeError, DEAD_LETTER_LOG, OUTPUTS_LOG};
use pipelines::output::Output;
use pipelines::partition::{RecordId, StageRecord};
use schemas::convert::AvroRecord;

/// The header carrying an output's record id (JSON `{"source","offset","index"}`).
pub const RECORD_ID_HEADER: &str = "paisa-record-id";

/// Headers of a dead letter: where the record came from and why it could not be processed.
pub const DEAD_LETTER_HEADERS: [&str; 4] = ["source-topic", "source-partition", "source-offset", "error"];

/// How one log's records are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    StageRecord,
    Output,
    /// The poison record's own bytes, with headers saying where it came from and why.
    DeadLetter,
}

fn layout(log: &str) -> Layout {
    match log {
        OUTPUTS_LOG => Layout::Output,
        DEAD_LETTER_LOG => Layout::DeadLetter,
        _ => Layout::StageRecord,
    }
}

/// Schema ids from a Confluent Schema Registry, by topic (`serve --schema-registry`). Without them the
/// embedded schemas' static ids are written (`schemas::StaticResolver`); either way a reader accepts
/// both for the schema this version writes, and with a registry it fetches any other writer schema by
/// its id and resolves what it wrote to this version's schema (BACKWARD evolution).
#[derive(Clone, Debug, Default)]
pub struct SchemaIds {
    /// Topic name → the id its value schema got.
    pub by_topic: std::collections::BTreeMap<String, u32>,
    /// Writer schemas fetched from the registry.
    pub writers: Option<std::sync::Arc<WriterSchemas>>,
}

impl SchemaIds {
    fn id(&self, topic: &str, name: schemas::SchemaName) -> u32 {
        self.by_topic.get(topic).copied().unwrap_or(name.static_id())
    }

    fn accepts(&self, topic: &str, name: schemas::SchemaName, id: u32) -> bool {
        id == name.static_id() || self.by_topic.get(topic) == Some(&id)
    }
}

/// Writer schemas other versions registered, fetched by id from the registry when a record names one
/// (rare: during a rolling upgrade), cached.
#[derive(Debug)]
pub struct WriterSchemas {
    registry_url: String,
    cache: std::sync::Mutex<std::collections::HashMap<u32, std::sync::Arc<apache_avro::Schema>>>,
}

/// Writer schemas cached at most (the cache starts over beyond: schemas are few).
const WRITER_SCHEMAS_MAX: usize = 256;

impl WriterSchemas {
    pub fn new(registry_url: &str) -> WriterSchemas {
        WriterSchemas { registry_url: registry_url.to_string(), cache: std::sync::Mutex::new(Default::default()) }
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, std::sync::Arc<apache_avro::Schema>>> {
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The schema registered under `id`. The fetch runs on a thread of its own with its own runtime, as
    /// readers run both on plain threads and inside the connector's tokio tasks.
    fn get(&self, id: u32) -> Result<std::sync::Arc<apache_avro::Schema>, String> {
        if let Some(schema) = self.cached().get(&id) {
            return Ok(std::sync::Arc::clone(schema));
        }
        let url = self.registry_url.clone();
        let fetched = std::thread::spawn(move || -> Result<apache_avro::Schema, String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| error.to_string())?;
            runtime.block_on(async move {
                let registry = schemas::RegistryResolver::new(&url).map_err(|error| error.to_string())?;
                registry.fetch(id).await.map_err(|error| error.to_string())
            })
        })
        .join()
        .map_err(|_| "the schema fetch panicked".to_string())??;
        let schema = std::sync::Arc::new(fetched);
        let mut cache = self.cached();
        if cache.len() >= WRITER_SCHEMAS_MAX {
            cache.clear();
        }
        cache.insert(id, std::sync::Arc::clone(&schema));
        Ok(schema)
    }
}

/// Registers the value schemas of the stage and outputs topics (TopicNameStrategy subjects
/// `{topic}-value`) and returns their ids. A registry that refuses a schema as incompatible stops the
/// start: this version would write what older readers cannot read.
pub async fn register_schemas(registry_url: &str, topics: &[(String, bool)]) -> Result<SchemaIds, RuntimeError> {
    let fail = |error: schemas::Error| {
        if error.is_retryable() {
            RuntimeError::Retryable(format!("schema registry: {error}"))
        } else {
            RuntimeError::Fatal(format!("schema registry: {error}"))
        }
    };
    let registry = schemas::RegistryResolver::new(registry_url).map_err(fail)?;
    let mut ids =
        SchemaIds { writers: Some(std::sync::Arc::new(WriterSchemas::new(registry_url))), ..SchemaIds::default() };
    for (topic, is_outputs) in topics {
        let name = if *is_outputs { schemas::SchemaName::Output } else { schemas::SchemaName::StageRecord };
        let definition = schemas::embedded(name).map_err(fail)?;
        let id = registry.register(&schemas::catalog::subject(topic, false), definition).await.map_err(fail)?;
        ids.by_topic.insert(topic.clone(), id);
    }
    Ok(ids)
}

/// A record as produced to a topic: its value and headers.
pub struct TopicRecord {
    pub payload: Vec<u8>,
    pub headers: Vec<(&'static str, Vec<u8>)>,
}

fn encoding(error: impl std::fmt::Display) -> RuntimeError {
    // The runtime encoded these records itself: failing to convert one is a bug, not bad input.
    RuntimeError::Fatal(format!("encoding a record for Kafka: {error}"))
}

fn avro<T: AvroRecord>(value: &T, schema_id: u32) -> Result<Vec<u8>, RuntimeError> {
    let definition = schemas::embedded(T::SCHEMA).map_err(encoding)?;
    let avro = value.to_avro().map_err(encoding)?;
    schemas::wire::encode(schema_id, definition.schema(), T::SCHEMA.full_name(), avro).map_err(encoding)
}

/// Converts a record the runtime encoded (JSON) into what the log's topic holds.
/// `locate` gives the topic partition of a log (a dead letter names its source by log).
pub fn to_topic(
    log: &str,
    topic: &str,
    json: Vec<u8>,
    ids: &SchemaIds,
    locate: impl Fn(&str) -> Result<(String, i32), RuntimeError>,
) -> Result<TopicRecord, RuntimeError> {
    match layout(log) {
        Layout::DeadLetter => dead_letter_to_topic(json, locate),
        Layout::StageRecord => {
            let record: StageRecord = pipelines::decode::from_json_bytes(&json).map_err(encoding)?;
            let id = ids.id(topic, StageRecord::SCHEMA);
            Ok(TopicRecord { payload: avro(&record, id)?, headers: Vec::new() })
        }
        Layout::Output => {
            let record: OutputRecord = pipelines::decode::from_json_bytes(&json).map_err(encoding)?;
            let record_id = serde_json::to_vec(&record.id).map_err(encoding)?;
            let id = ids.id(topic, Output::SCHEMA);
            Ok(TopicRecord { payload: avro(&record.output, id)?, headers: vec![(RECORD_ID_HEADER, record_id)] })
        }
    }
}

/// A dead letter of the runtime (JSON, the poison record in hex) as its own bytes with its origin in
/// headers; a letter that does not decode is kept as it is.
fn dead_letter_to_topic(
    json: Vec<u8>,
    locate: impl Fn(&str) -> Result<(String, i32), RuntimeError>,
) -> Result<TopicRecord, RuntimeError> {
    let Ok(letter) = serde_json::from_slice::<crate::runtime::DeadLetter>(&json) else {
        return Ok(TopicRecord { payload: json, headers: Vec::new() });
    };
    let (source_topic, source_partition) = locate(&letter.log)?;
    let values = [
        source_topic.into_bytes(),
        source_partition.to_string().into_bytes(),
        letter.offset.to_string().into_bytes(),
        letter.error.into_bytes(),
    ];
    let headers = DEAD_LETTER_HEADERS.into_iter().zip(values).collect();
    Ok(TopicRecord { payload: from_hex(&letter.payload_hex), headers })
}

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2).filter_map(|index| u8::from_str_radix(hex.get(index * 2..index * 2 + 2)?, 16).ok()).collect()
}

fn from_avro<T: AvroRecord>(payload: &[u8], topic: &str, ids: &SchemaIds) -> Result<T, String> {
    let definition = schemas::embedded(T::SCHEMA).map_err(|error| error.to_string())?;
    let (id, body) = schemas::wire::unframe(payload).map_err(|error| error.to_string())?;
    let value = if ids.accepts(topic, T::SCHEMA, id) {
        schemas::wire::decode_body(id, body, definition.schema(), None)
    } else if let Some(writers) = &ids.writers {
        let writer = writers.get(id)?;
        schemas::wire::decode_body(id, body, &writer, Some(definition.schema()))
    } else {
        return Err(format!("schema id {id} is not this version's and no registry is configured"));
    }
    .map_err(|error| error.to_string())?;
    T::from_avro(value).map_err(|error| error.to_string())
}

/// Converts what a topic holds back into the runtime's encoding. A record that does not convert (a
/// poison message another producer wrote, or a schema id this version does not know) is handed over as
/// it is: the runtime cannot decode it either and moves it to the dead-letter log.
pub fn from_topic(log: &str, topic: &str, payload: Vec<u8>, record_id: Option<&[u8]>, ids: &SchemaIds) -> Vec<u8> {
    let converted = match layout(log) {
        Layout::DeadLetter => return payload,
        Layout::StageRecord => from_avro::<StageRecord>(&payload, topic, ids)
            .and_then(|record| serde_json::to_vec(&record).map_err(|error| error.to_string())),
        Layout::Output => output_from_topic(&payload, topic, record_id, ids),
    };
    match converted {
        Ok(json) => json,
        Err(error) => {
            tracing::warn!(log, %error, "a record on Kafka is not what this version writes");
            payload
        }
    }
}

fn output_from_topic(
    payload: &[u8],
    topic: &str,
    record_id: Option<&[u8]>,
    ids: &SchemaIds,
) -> Result<Vec<u8>, String> {
    let output = from_avro::<Output>(payload, topic, ids)?;
    let id: RecordId =
        serde_json::from_slice(record_id.ok_or("no record id header")?).map_err(|error| error.to_string())?;
    serde_json::to_vec(&OutputRecord { id, output }).map_err(|error| error.to_string())
}

/// Bytes of a snapshot per changelog record at most: a partition's state outgrows Kafka's message
/// size limit (1 MB by default), so a snapshot is written as numbered chunks.
pub const SNAPSHOT_CHUNK_BYTES_MAX: usize = 512 * 1024;

/// A partition snapshot as the changelog topic holds it: Avro `ChangelogEntry` records, one per chunk,
/// as (record key, value). The record key `{log}#{chunk}` is what compaction keeps the latest of; the
/// entry's `key` field says `{log}#{chunk}/{chunks}` and its `version` the snapshot's last offset, so
/// chunks of different snapshots are never mixed.
pub fn snapshot_to_topic(
    log: &str,
    snapshot: &crate::runtime::Snapshot,
) -> Result<Vec<(String, Vec<u8>)>, RuntimeError> {
    let pieces: Vec<&[u8]> = snapshot.state.chunks(SNAPSHOT_CHUNK_BYTES_MAX).collect();
    let total = pieces.len().max(1);
    let mut records = Vec::with_capacity(total);
    for index in 0..total {
        let entry = schemas::convert::ChangelogEntry {
            stage: snapshot.kind,
            partition: snapshot.partition,
            key: format!("{log}#{index}/{total}"),
            version: snapshot.last_offset,
            state: Some(pieces.get(index).map_or_else(Vec::new, |piece| piece.to_vec())),
        };
        let payload = avro(&entry, schemas::convert::ChangelogEntry::SCHEMA.static_id())?;
        records.push((format!("{log}#{index}"), payload));
    }
    Ok(records)
}

/// Changelog records gathered while reading the topic: per log, per snapshot (last offset), its chunks.
#[derive(Default)]
pub struct SnapshotChunks {
    by_log: std::collections::HashMap<String, std::collections::BTreeMap<u64, SnapshotParts>>,
}

struct SnapshotParts {
    kind: pipelines::partition::StageKind,
    partition: u32,
    total: usize,
    chunks: std::collections::BTreeMap<usize, Vec<u8>>,
}

impl SnapshotChunks {
    /// Adds one changelog record; tombstones and records this version cannot read are skipped.
    pub fn add(&mut self, payload: &[u8]) {
        let Ok(entry) = from_avro::<schemas::convert::ChangelogEntry>(payload, "", &SchemaIds::default()) else {
            return;
        };
        let Some(state) = entry.state else { return };
        let Some((log, numbering)) = entry.key.rsplit_once('#') else { return };
        let Some((index, total)) = numbering.split_once('/') else { return };
        let (Ok(index), Ok(total)) = (index.parse::<usize>(), total.parse::<usize>()) else { return };
        if index >= total {
            return;
        }
        let parts = self.by_log.entry(log.to_string()).or_default().entry(entry.version).or_insert(SnapshotParts {
            kind: entry.stage,
            partition: entry.partition,
            total,
            chunks: std::collections::BTreeMap::new(),
        });
        if parts.total == total {
            parts.chunks.insert(index, state);
        }
    }

    /// The latest complete snapshot of each log.
    pub fn latest(self) -> std::collections::HashMap<String, crate::runtime::Snapshot> {
        let mut latest = std::collections::HashMap::new();
        for (log, versions) in self.by_log {
            let complete = versions.into_iter().rev().find(|(_, parts)| parts.chunks.len() == parts.total);
            if let Some((last_offset, parts)) = complete {
                let state = parts.chunks.into_values().flatten().collect();
                let snapshot =
                    crate::runtime::Snapshot { kind: parts.kind, partition: parts.partition, last_offset, state };
                latest.insert(log, snapshot);
            }
        }
        latest
    }
}
