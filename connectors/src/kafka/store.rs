//! The Kafka [`Store`]: each log is a topic partition, consumer offsets are the offsets of one consumer
//! group, and a commit is one Kafka transaction holding the batch's records and its consumed offsets
//! (`send_offsets_to_transaction`): the read-process-write transaction of the embedded store, on Kafka.
//!
//! The small tables (ingested event ids, keys created by ingested inputs, merchant API keys, settings)
//! live in the compacted topic `{namespace}.state`, written in the same transactions as the records
//! they describe and read back into memory when the store opens.
//!
//! Consumers read with `isolation.level=read_committed`, but nothing relies on it alone: librdkafka's
//! mock cluster hands records of aborted transactions to read_committed consumers, and brokers have had
//! transaction bugs. Every record carries an id derived from its input's position, and every consumer
//! drops ids it has applied (`StagePartition`), so a record delivered twice changes nothing.

use super::config::KafkaConfig;
use crate::runtime::{claim_keys, lock, Appended, IngestEncoder, KeyValueTable, RuntimeError, Store, WriteBatch};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Logs that are one topic with one partition (everything else is a stage topic partition).
const SINGLE_PARTITION_LOGS: [&str; 2] = [crate::runtime::OUTPUTS_LOG, crate::runtime::DEAD_LETTER_LOG];
/// The compacted topic of the small tables.
const STATE_TOPIC_SUFFIX: &str = "state";
/// The compacted topic of partition snapshots (key: the stage log).
const CHANGELOG_TOPIC_SUFFIX: &str = "changelog";
/// Records of the state topic read per poll loop at open (bounded; the loop runs to the end).
const STATE_RECORDS_PER_READ_MAX: usize = 4096;
/// How often, at most, a lookup that missed reads the state topic for what other instances wrote.
const MISS_TAIL_INTERVAL_MS: u64 = 100;
/// Attempts to enqueue one record while the producer's queue is full, polling between them.
const ENQUEUE_ATTEMPTS_MAX: usize = 1000;

/// One record to produce in a transaction.
struct Outgoing {
    topic: String,
    partition: i32,
    key: Vec<u8>,
    payload: Vec<u8>,
    headers: Vec<(&'static str, Vec<u8>)>,
}

/// What the state topic holds, in memory.
#[derive(Debug, Default)]
struct Index {
    /// Event id → ingestion position (SPEC §3: an event id is applied once).
    events: HashMap<String, u64>,
    /// Keys created by ingested inputs → owner (first creation wins).
    keys: HashMap<String, String>,
    merchant_keys: HashMap<String, String>,
    meta: HashMap<String, String>,
    /// Consumer offsets as the transactions that committed them recorded them (see [`KafkaStore::commit`]).
    offsets: HashMap<String, u64>,
    /// The largest `at` (ms) of the inputs ingested.
    at_max_ms: Option<i64>,
    /// The next ingestion position. Positions of an aborted ingestion are never reused (a consumer that
    /// saw its records despite the abort would drop a later input with the same record id).
    ingest_head: u64,
    /// The offset of the state topic read next (the index follows the topic from there).
    next_offset: u64,
}

/// A consumer reading one log, kept assigned so that librdkafka prefetches what comes next.
struct Reader {
    consumer: BaseConsumer,
    /// The offset the next poll returns (where the last read stopped).
    next: u64,
    /// Whether the last read stopped at the high watermark it learnt, before the consumer's report of
    /// the partition's end: that report is then still queued, and stale for the next read.
    end_report_queued: bool,
}

impl Reader {
    fn new(consumer: BaseConsumer) -> Reader {
        Reader { consumer, next: u64::MAX, end_report_queued: false }
    }

    /// Polls from `from` (assigning the consumer there unless the last read stopped there).
    fn poll_from(
        &mut self,
        topic: &str,
        partition: i32,
        from: u64,
        records_max: usize,
        high: u64,
        wait: Duration,
    ) -> Result<Vec<Fetched>, RuntimeError> {
        if self.next != from {
            assign(&self.consumer, topic, partition, from)?;
            self.end_report_queued = false;
        }
        let (records, stopped_at_high) = poll_records(&self.consumer, records_max, high, wait, self.end_report_queued)?;
        self.end_report_queued = stopped_at_high;
        // After a read that ended on skipped records (aborted, markers), the position is unknown: the
        // next read assigns again.
        self.next = records.last().map_or(u64::MAX, |last| last.offset + 1);
        Ok(records)
    }
}

pub struct KafkaStore {
    config: KafkaConfig,
    producer: Mutex<BaseProducer>,
    /// Owns the consumer group whose offsets transactions commit, and answers committed-offset lookups.
    group: BaseConsumer,
    readers: Mutex<HashMap<String, Reader>>,
    /// Committed offsets by consumer, as this instance committed them (the only writer of the group).
    committed: Mutex<HashMap<String, u64>>,
    index: Mutex<Index>,
    /// The changelog's latest snapshot per stage log, read at the first restore and taken one by one.
    snapshots: Mutex<Option<HashMap<String, crate::runtime::Snapshot>>>,
    /// The reader following the state topic (kept assigned between reads).
    state_reader: Mutex<Option<Reader>>,
    /// The reader of the lag report's first waiting records ([`Store::first_unconsumed`]), assigned
    /// anew for each log: the processing readers keep their positions.
    lag_reader: Mutex<Option<BaseConsumer>>,
    /// The group member, when this instance shares the stage partitions: its group metadata (generation)
    /// goes with the offsets of every transaction, so a broker fences a member the group moved on from.
    member: Mutex<Option<Arc<super::group::MemberConsumer>>>,
    /// When a lookup that missed last read the state topic.
    last_miss_tail: Mutex<Option<Instant>>,
    /// Where each transaction is timed.
    metrics: Arc<crate::metrics::PipelineMetrics>,
}

fn fatal(error: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Fatal(error.to_string())
}

/// A failed Kafka call: a transaction that can be aborted and retried, or a broker that did not answer
/// in time, is retryable; a fenced producer or any other fatal librdkafka error stops the process.
fn kafka_error(what: &str, error: &KafkaError) -> RuntimeError {
    let message = format!("{what}: {error}");
    match error {
        KafkaError::Transaction(inner) if inner.is_fatal() => RuntimeError::Fatal(message),
        KafkaError::Transaction(inner) if inner.txn_requires_abort() || inner.is_retriable() => {
            RuntimeError::Retryable(message)
        }
        other if other.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::OperationTimedOut) => {
            RuntimeError::Retryable(message)
        }
        _ => RuntimeError::Fatal(message),
    }
}

impl KafkaStore {
    /// Connects, fences any older instance with the same `transactional.id`, and reads the state topic.
    /// The topics must exist ([`KafkaStore::topics`] lists them; `paisa admin init` creates them).
    pub fn open(config: KafkaConfig) -> Result<KafkaStore, RuntimeError> {
        assert!(config.partitions > 0, "a stage needs at least one partition");
        let timeout = Duration::from_millis(config.request_timeout_ms);
        let mut producer_config = ClientConfig::new();
        producer_config
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "0")
            .set("socket.nagle.disable", "true")
            .set("message.timeout.ms", config.request_timeout_ms.to_string());
        if config.transactions {
            producer_config.set("transactional.id", &config.transactional_id).set("transaction.timeout.ms", "60000");
        }
        let producer: BaseProducer =
            producer_config.create().map_err(|error| kafka_error("creating the producer", &error))?;
        if config.transactions {
            producer.init_transactions(timeout).map_err(|error| kafka_error("initialising transactions", &error))?;
        }
        let group = consumer(&config, &config.group_id())?;
        let store = KafkaStore {
            producer: Mutex::new(producer),
            group,
            readers: Mutex::new(HashMap::new()),
            committed: Mutex::new(HashMap::new()),
            index: Mutex::new(Index::default()),
            snapshots: Mutex::new(None),
            state_reader: Mutex::new(None),
            lag_reader: Mutex::new(None),
            member: Mutex::new(None),
            last_miss_tail: Mutex::new(None),
            metrics: Arc::default(),
            config,
        };
        store.tail_index()?;
        Ok(store)
    }

    /// Times each transaction (a store commit of one batch) in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::PipelineMetrics>) -> KafkaStore {
        self.metrics = metrics;
        self
    }

    /// Every topic this store uses, as (name, partitions, compacted).
    pub fn topics(config: &KafkaConfig) -> Vec<(String, u32, bool)> {
        let mut topics: Vec<(String, u32, bool)> = pipelines::partition::StageKind::ALL
            .iter()
            .map(|kind| (format!("{}.{}", config.namespace, kind.name()), config.partitions, false))
            .collect();
        for log in SINGLE_PARTITION_LOGS {
            topics.push((format!("{}.{log}", config.namespace), 1, false));
        }
        topics.push((format!("{}.{STATE_TOPIC_SUFFIX}", config.namespace), 1, true));
        topics.push((format!("{}.{CHANGELOG_TOPIC_SUFFIX}", config.namespace), 1, true));
        topics
    }

    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// The topic partition of a log: `agent-3` → (`{namespace}.agent`, 3); `outputs` → (…`.outputs`, 0).
    fn locate(&self, log: &str) -> Result<(String, i32), RuntimeError> {
        if SINGLE_PARTITION_LOGS.contains(&log) {
            return Ok((format!("{}.{log}", self.config.namespace), 0));
        }
        let located = log.rsplit_once('-').and_then(|(kind, partition)| {
            let kind = pipelines::partition::StageKind::ALL.into_iter().find(|known| known.name() == kind)?;
            let partition = partition.parse::<u32>().ok().filter(|partition| *partition < self.config.partitions)?;
            Some((format!("{}.{}", self.config.namespace, kind.name()), partition as i32))
        });
        located.ok_or_else(|| RuntimeError::Fatal(format!("no topic partition holds the log `{log}`")))
    }

    fn high_watermark(&self, topic: &str, partition: i32) -> Result<u64, RuntimeError> {
        let (_, high) = self
            .group
            .fetch_watermarks(topic, partition, self.timeout())
            .map_err(|error| kafka_error("watermarks", &error))?;
        Ok(u64::try_from(high).unwrap_or(0))
    }

    fn changelog_topic(&self) -> String {
        format!("{}.{CHANGELOG_TOPIC_SUFFIX}", self.config.namespace)
    }

    /// Reads the changelog topic from its beginning: the latest snapshot of each stage log.
    fn load_snapshots(&self) -> Result<HashMap<String, crate::runtime::Snapshot>, RuntimeError> {
        let mut chunks = super::payload::SnapshotChunks::default();
        self.read_to_end(&self.changelog_topic(), "changelog-reader", &mut |record| chunks.add(&record.payload))?;
        Ok(chunks.latest())
    }

    fn state_topic(&self) -> String {
        format!("{}.{STATE_TOPIC_SUFFIX}", self.config.namespace)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    /// Reads the state topic into the in-memory index, from where the last read stopped to the end
    /// (at open: all of it; an instance sharing the partitions reads what the others wrote since).
    fn tail_index(&self) -> Result<(), RuntimeError> {
        let topic = self.state_topic();
        let high = self.high_watermark(&topic, 0)?;
        let mut index = lock(&self.index);
        let mut state_reader = lock(&self.state_reader);
        while index.next_offset < high {
            let reader = match state_reader.as_mut() {
                Some(reader) => reader,
                None => {
                    let consumer = consumer(&self.config, &format!("{}.state-reader", self.config.namespace))?;
                    state_reader.insert(Reader::new(consumer))
                }
            };
            let records =
                reader.poll_from(&topic, 0, index.next_offset, STATE_RECORDS_PER_READ_MAX, high, self.timeout())?;
            let Some(last) = records.last().map(|record| record.offset) else {
                break; // only transaction markers (or aborted records) remain
            };
            for record in records {
                apply_state_entry(&mut index, &record.key, &record.payload);
            }
            index.next_offset = last + 1;
        }
        Ok(())
    }

    /// Whether a lookup that missed may read the state topic now (see [`MISS_TAIL_INTERVAL_MS`]).
    fn may_tail_on_miss(&self) -> bool {
        let mut last = lock(&self.last_miss_tail);
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < Duration::from_millis(MISS_TAIL_INTERVAL_MS)) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// The next offset of a consumer as far as this instance knows: its own commits, or what the state
    /// topic says another instance committed.
    fn known_committed(&self, consumer: &str) -> Result<u64, RuntimeError> {
        let recorded = lock(&self.index).offsets.get(consumer).copied().unwrap_or(0);
        Ok(self.committed(consumer)?.max(recorded))
    }

    /// Reads a single-partition topic from its beginning to its high watermark.
    fn read_to_end(&self, topic: &str, reader: &str, visit: &mut dyn FnMut(Fetched)) -> Result<(), RuntimeError> {
        let reader = consumer(&self.config, &format!("{}.{reader}", self.config.namespace))?;
        let high = self.high_watermark(topic, 0)?;
        let mut next = 0u64;
        while next < high {
            assign(&reader, topic, 0, next)?;
            let (records, _) = poll_records(&reader, STATE_RECORDS_PER_READ_MAX, high, self.timeout(), false)?;
            let Some(last) = records.last().map(|record| record.offset) else {
                break; // only transaction markers (or aborted records) remain
            };
            records.into_iter().for_each(&mut *visit);
            next = last + 1;
        }
        Ok(())
    }

    /// The record at each pair's committed offset, in the runtime's encoding (None: the partition ends
    /// first, because the consumer has read up to the high watermark, or only transaction markers remain
    /// before it, with records of aborted transactions where the broker hides them from read_committed
    /// readers). The lag report asks only for logs whose backlog shows records, so the high watermark is
    /// not fetched again here: a log read to its end still answers None, from the partition's end.
    fn first_unconsumed_records(&self, pairs: &[(&str, &str)]) -> Result<Vec<Option<Vec<u8>>>, RuntimeError> {
        let consumers: Vec<String> = pairs.iter().map(|(_, consumer)| consumer.to_string()).collect();
        let committed = self.committed_all(&consumers)?;
        let mut lag_reader = lock(&self.lag_reader);
        let mut records = Vec::with_capacity(pairs.len());
        for ((log, _), next) in pairs.iter().zip(committed) {
            let (topic, partition) = self.locate(log)?;
            let reader = match lag_reader.as_mut() {
                Some(reader) => reader,
                None => lag_reader.insert(consumer(&self.config, &format!("{}.lag-reader", self.config.namespace))?),
            };
            let first = first_record_from(reader, &topic, partition, next, self.timeout())?;
            records.push(first.map(|record| {
                let record_id = record.record_id.as_deref();
                super::payload::from_topic(log, &topic, record.payload, record_id, &self.config.schema_ids)
            }));
        }
        debug_assert_eq!(records.len(), pairs.len(), "a record or none per pair");
        Ok(records)
    }

    /// Produces `records` as (topic, partition, key, payload) and `offsets` in one transaction.
    fn transact(&self, records: &[Outgoing], offsets: &[(String, u64)]) -> Result<(), RuntimeError> {
        let producer = lock(&self.producer);
        let started = Instant::now();
        let committed = if self.config.transactions {
            self.in_transaction(&producer, records, offsets)
        } else {
            self.produce_then_commit(&producer, records, offsets)
        };
        if committed.is_ok() {
            self.metrics.store_commit(1, started.elapsed());
        }
        committed
    }

    /// With transactions: the records and the offsets in one Kafka transaction, aborted on any failure.
    fn in_transaction(
        &self,
        producer: &BaseProducer,
        records: &[Outgoing],
        offsets: &[(String, u64)],
    ) -> Result<(), RuntimeError> {
        producer.begin_transaction().map_err(|error| kafka_error("beginning a transaction", &error))?;
        let result = self.fill_transaction(producer, records, offsets).and_then(|()| {
            producer.commit_transaction(self.timeout()).map_err(|error| kafka_error("committing a transaction", &error))
        });
        if let Err(error) = result {
            // Whatever failed (a record the producer refused, a broker error), the open transaction is
            // aborted so that the next one can begin; only a producer in a fatal state (fenced) cannot.
            producer
                .abort_transaction(self.timeout())
                .map_err(|abort| kafka_error(&format!("aborting after `{error}`"), &abort))?;
            return Err(error);
        }
        Ok(())
    }

    /// Without transactions: the records (including the state topic's offset entries) are produced and
    /// flushed, then the consumer group's offsets committed.
    fn produce_then_commit(
        &self,
        producer: &BaseProducer,
        records: &[Outgoing],
        offsets: &[(String, u64)],
    ) -> Result<(), RuntimeError> {
        self.produce(producer, records)?;
        if offsets.is_empty() {
            return Ok(());
        }
        let list = self.offset_list(offsets)?;
        self.group.commit(&list, CommitMode::Sync).map_err(|error| kafka_error("committing offsets", &error))
    }

    /// Produces the records and waits until the brokers acknowledged every one.
    fn produce(&self, producer: &BaseProducer, records: &[Outgoing]) -> Result<(), RuntimeError> {
        self.enqueue(producer, records)?;
        self.wait_delivered(producer)
    }

    /// Waits until every queued record is acknowledged. (rdkafka's `flush` polls in steps of 100 ms,
    /// which would put 100 ms under every commit.)
    fn wait_delivered(&self, producer: &BaseProducer) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + self.timeout();
        loop {
            producer.poll(Duration::ZERO);
            if producer.in_flight_count() == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RuntimeError::Retryable("records not acknowledged in time".to_string()));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn offset_list(&self, offsets: &[(String, u64)]) -> Result<TopicPartitionList, RuntimeError> {
        let mut list = TopicPartitionList::new();
        for (consumer, next) in offsets {
            let (topic, partition) = self.locate(consumer_log(consumer))?;
            let next = i64::try_from(*next).map_err(fatal)?;
            list.add_partition_offset(&topic, partition, Offset::Offset(next))
                .map_err(|error| kafka_error("an offset", &error))?;
        }
        Ok(list)
    }

    fn fill_transaction(
        &self,
        producer: &BaseProducer,
        records: &[Outgoing],
        offsets: &[(String, u64)],
    ) -> Result<(), RuntimeError> {
        self.produce(producer, records)?;
        if !offsets.is_empty() {
            let list = self.offset_list(offsets)?;
            let member = lock(&self.member).clone();
            let metadata = match &member {
                Some(member) => member.group_metadata(),
                None => self.group.group_metadata(),
            }
            .ok_or_else(|| RuntimeError::Fatal("the consumer group has no metadata".to_string()))?;
            producer
                .send_offsets_to_transaction(&list, &metadata, self.timeout())
                .map_err(|error| kafka_error("sending offsets to the transaction", &error))?;
        }
        Ok(())
    }

    /// Hands the records to the producer's queue, waiting (polling) while it is full.
    fn enqueue(&self, producer: &BaseProducer, records: &[Outgoing]) -> Result<(), RuntimeError> {
        for outgoing in records {
            let mut headers = OwnedHeaders::new_with_capacity(outgoing.headers.len());
            for (key, value) in &outgoing.headers {
                headers = headers.insert(Header { key, value: Some(value.as_slice()) });
            }
            let mut record = BaseRecord::to(&outgoing.topic)
                .partition(outgoing.partition)
                .key(outgoing.key.as_slice())
                .payload(outgoing.payload.as_slice())
                .headers(headers);
            let mut attempts = 0;
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), returned))
                        if attempts < ENQUEUE_ATTEMPTS_MAX =>
                    {
                        attempts += 1;
                        record = returned;
                        producer.poll(Duration::from_millis(10));
                    }
                    Err((error, _)) => return Err(kafka_error("producing a record", &error)),
                }
            }
        }
        Ok(())
    }

    fn state_record(&self, key: String, value: &str) -> Outgoing {
        Outgoing {
            topic: self.state_topic(),
            partition: 0,
            key: key.into_bytes(),
            payload: value.as_bytes().to_vec(),
            headers: Vec::new(),
        }
    }

    /// A record of the runtime for `log`, in the topic's format (see [`super::payload`]).
    fn outgoing(&self, log: &str, bytes: Vec<u8>) -> Result<Outgoing, RuntimeError> {
        let (topic, partition) = self.locate(log)?;
        let converted =
            super::payload::to_topic(log, &topic, bytes, &self.config.schema_ids, |source| self.locate(source))?;
        Ok(Outgoing { topic, partition, key: Vec::new(), payload: converted.payload, headers: converted.headers })
    }
}

/// The log a consumer reads: stage partitions consume their own log, the connector the outputs log.
fn consumer_log(consumer: &str) -> &str {
    if consumer == crate::runtime::CONNECTOR_CONSUMER {
        crate::runtime::OUTPUTS_LOG
    } else {
        consumer
    }
}

fn consumer(config: &KafkaConfig, group_id: &str) -> Result<BaseConsumer, RuntimeError> {
    ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        // A read waits for the records below the high watermark it learnt: the broker need not hold a
        // fetch open waiting for more (the default holds it up to 500 ms).
        .set("fetch.wait.max.ms", "5")
        .create()
        .map_err(|error| kafka_error("creating a consumer", &error))
}

struct Fetched {
    offset: u64,
    key: Vec<u8>,
    payload: Vec<u8>,
    /// The `paisa-record-id` header, on outputs.
    record_id: Option<Vec<u8>>,
}

/// Points the consumer at `from` of one topic partition (its only assignment).
fn assign(consumer: &BaseConsumer, topic: &str, partition: i32, from: u64) -> Result<(), RuntimeError> {
    let mut list = TopicPartitionList::new();
    let offset = i64::try_from(from).map_err(fatal)?;
    list.add_partition_offset(topic, partition, Offset::Offset(offset))
        .map_err(|error| kafka_error("an assignment", &error))?;
    consumer.assign(&list).map_err(|error| kafka_error("assigning a partition", &error))
}

/// The first record at or after `from` (the consumer is assigned there): None when the partition
/// ends first (only transaction markers, or hidden aborted records, are left before the high
/// watermark). A broker that sends neither within `wait` is an error: the report then says the lag is
/// unknown, never 0. What the consumer may still hold from its earlier assignment (another
/// partition's records or end report) is skipped.
fn first_record_from(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    from: u64,
    wait: Duration,
) -> Result<Option<Fetched>, RuntimeError> {
    assign(consumer, topic, partition, from)?;
    let deadline = Instant::now() + wait;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(RuntimeError::Retryable(format!(
                "no record of {topic} [{partition}] at {from} within {wait:?}"
            )));
        }
        match consumer.poll(remaining.min(Duration::from_millis(100))) {
            None => continue,
            Some(Err(KafkaError::PartitionEOF(ended))) if ended == partition => return Ok(None),
            Some(Err(KafkaError::PartitionEOF(_))) => continue,
            Some(Err(error)) => return Err(kafka_error("reading a log's first waiting record", &error)),
            Some(Ok(message)) => {
                let assigned = message.topic() == topic && message.partition() == partition;
                if assigned && u64::try_from(message.offset()).is_ok_and(|offset| offset >= from) {
                    return fetched(&message).map(Some);
                }
            }
        }
    }
}

/// A record as read: its offset, key and payload, and the record id its header carries (outputs).
fn fetched(message: &rdkafka::message::BorrowedMessage<'_>) -> Result<Fetched, RuntimeError> {
    let record_id = message.headers().and_then(|headers| {
        headers
            .iter()
            .find(|header| header.key == super::payload::RECORD_ID_HEADER)
            .and_then(|header| header.value.map(<[u8]>::to_vec))
    });
    Ok(Fetched {
        offset: u64::try_from(message.offset()).map_err(fatal)?,
        key: message.key().unwrap_or_default().to_vec(),
        payload: message.payload().unwrap_or_default().to_vec(),
        record_id,
    })
}

/// Polls the consumer's partition until `records_max` records, the record before `high`, the end of
/// the partition, or `wait` (what arrived by then is returned; the caller reads again later). Returns
/// the records and whether it stopped at `high` (an end report may then be queued behind them).
/// `end_report_queued`: the first end report, if no record came before it, is a stale one left by the
/// last read, and is skipped (taken as the end, it made a read right after a commit find nothing, and
/// every hop of a spaced input wait for the idle poll: ≈ 220 ms per input instead of ≈ 16 ms).
fn poll_records(
    consumer: &BaseConsumer,
    records_max: usize,
    high: u64,
    wait: Duration,
    end_report_queued: bool,
) -> Result<(Vec<Fetched>, bool), RuntimeError> {
    let mut records: Vec<Fetched> = Vec::new();
    let deadline = Instant::now() + wait;
    let mut stale_end_report = end_report_queued;
    while records.len() < records_max {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        match consumer.poll(remaining.min(Duration::from_millis(100))) {
            None => continue,
            Some(Err(KafkaError::PartitionEOF(_))) if records.is_empty() && stale_end_report => {
                stale_end_report = false;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(error)) => return Err(kafka_error("reading a log", &error)),
            Some(Ok(message)) => {
                let record = fetched(&message)?;
                let offset = record.offset;
                records.push(record);
                if offset + 1 >= high {
                    return Ok((records, true));
                }
            }
        }
    }
    Ok((records, false))
}

/// One entry of the state topic: `event:{id}` → position, `key:{key}` → owner, `merchant_key:{sha}` →
/// merchant, `meta:{key}` → value, `offset:{consumer}` → next offset, `head:ingest` → next position. Unknown or malformed entries are skipped (a newer writer's).
fn apply_state_entry(index: &mut Index, key: &[u8], value: &[u8]) {
    let (Ok(key), Ok(value)) = (std::str::from_utf8(key), std::str::from_utf8(value)) else {
        return;
    };
    let Some((table, name)) = key.split_once(':') else { return };
    match table {
        "event" => {
            if let Ok(position) = value.parse::<u64>() {
                index.events.entry(name.to_string()).or_insert(position);
                index.ingest_head = index.ingest_head.max(position + 1);
            }
        }
        "head" => {
            if let Ok(head) = value.parse::<u64>() {
                index.ingest_head = index.ingest_head.max(head);
            }
        }
        "key" => {
            index.keys.entry(name.to_string()).or_insert_with(|| value.to_string());
        }
        "merchant_key" => {
            index.merchant_keys.insert(name.to_string(), value.to_string());
        }
        "meta" => {
            index.meta.insert(name.to_string(), value.to_string());
        }
        "at_max" => {
            if let Ok(at) = value.parse::<i64>() {
                index.at_max_ms = Some(index.at_max_ms.map_or(at, |known| known.max(at)));
            }
        }
        "offset" => {
            if let Ok(next) = value.parse::<u64>() {
                let known = index.offsets.entry(name.to_string()).or_insert(next);
                *known = (*known).max(next);
            }
        }
        _ => {}
    }
}

impl Store for KafkaStore {
    /// Reads what the partition holds from `from` on, up to `records_max` records or the high watermark
    /// as it was when the read began (one round trip to learn it; a log with nothing new answers at once).
    fn read(&self, log: &str, from: u64, records_max: usize) -> Result<Vec<(u64, Vec<u8>)>, RuntimeError> {
        let (topic, partition) = self.locate(log)?;
        let high = self.high_watermark(&topic, partition)?;
        if from >= high || records_max == 0 {
            return Ok(Vec::new());
        }
        let mut readers = lock(&self.readers);
        let reader = match readers.entry(log.to_string()) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let consumer = consumer(&self.config, &format!("{}.reader", self.config.namespace))?;
                entry.insert(Reader::new(consumer))
            }
        };
        let fetched = reader.poll_from(&topic, partition, from, records_max, high, self.timeout())?;
        Ok(fetched
            .into_iter()
            .filter(|record| record.offset >= from)
            .map(|record| {
                let record_id = record.record_id.as_deref();
                let json = super::payload::from_topic(log, &topic, record.payload, record_id, &self.config.schema_ids);
                (record.offset, json)
            })
            .collect())
    }

    /// The high watermark. Under transactions it counts commit markers too, so a consumed log may show
    /// a lag of its markers (none on the mock cluster, which writes no markers).
    fn head(&self, log: &str) -> Result<u64, RuntimeError> {
        let (topic, partition) = self.locate(log)?;
        self.high_watermark(&topic, partition)
    }

    fn committed(&self, consumer: &str) -> Result<u64, RuntimeError> {
        if let Some(next) = lock(&self.committed).get(consumer) {
            return Ok(*next);
        }
        let recorded = lock(&self.index).offsets.get(consumer).copied().unwrap_or(0);
        let (topic, partition) = self.locate(consumer_log(consumer))?;
        let mut list = TopicPartitionList::new();
        list.add_partition(&topic, partition);
        let answer = self
            .group
            .committed_offsets(list, self.timeout())
            .map_err(|error| kafka_error("committed offsets", &error))?;
        let next = match answer.find_partition(&topic, partition).map(|element| element.offset()) {
            Some(Offset::Offset(next)) => u64::try_from(next).unwrap_or(0),
            _ => 0,
        }
        .max(recorded);
        lock(&self.committed).insert(consumer.to_string(), next);
        Ok(next)
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), RuntimeError> {
        let mut records = Vec::with_capacity(batch.appends.len() + batch.offsets.len());
        for (log, payload) in batch.appends {
            records.push(self.outgoing(&log, payload)?);
        }
        // The offsets go to the consumer group (`send_offsets_to_transaction`, what Kafka's tools read)
        // and, in the same transaction, to the state topic: the mock cluster does not keep offsets
        // committed in transactions, and a restart takes the larger of the two.
        for (consumer, next) in &batch.offsets {
            records.push(self.state_record(format!("offset:{consumer}"), &next.to_string()));
        }
        for snapshot in &batch.snapshots {
            let log = crate::runtime::stage_log(snapshot.kind, snapshot.partition);
            for (key, payload) in super::payload::snapshot_to_topic(&log, snapshot)? {
                let topic = self.changelog_topic();
                records.push(Outgoing { topic, partition: 0, key: key.into_bytes(), payload, headers: Vec::new() });
            }
        }
        {
            let committed = lock(&self.committed);
            for (consumer, next) in &batch.offsets {
                let previous = committed.get(consumer).copied().unwrap_or(0);
                // Offsets only move forward: a stale commit would replay records twice.
                assert!(*next >= previous, "consumer {consumer} moved back from {previous} to {next}");
            }
        }
        self.transact(&records, &batch.offsets)?;
        let mut committed = lock(&self.committed);
        for (consumer, next) in batch.offsets {
            committed.insert(consumer, next);
        }
        Ok(())
    }

    fn ingest(&self, event_ids: &[&str], encode: &mut IngestEncoder<'_>) -> Result<Vec<Appended>, RuntimeError> {
        let mut index = lock(&self.index);
        let mut outcomes = Vec::with_capacity(event_ids.len());
        let mut new_events: HashMap<String, u64> = HashMap::new();
        let mut new_keys: HashMap<String, String> = HashMap::new();
        let mut records = Vec::new();
        let mut head = index.ingest_head;
        let mut at_max = index.at_max_ms;
        for (request_index, event_id) in event_ids.iter().enumerate() {
            if let Some(position) = index.events.get(*event_id).or_else(|| new_events.get(*event_id)) {
                outcomes.push(Appended::Duplicate { position: *position });
                continue;
            }
            let position = head;
            head += 1;
            let ingested = encode(request_index, position)?;
            if let Some(at) = ingested.at_ms {
                at_max = Some(at_max.map_or(at, |known: i64| known.max(at)));
            }
            // The keys claimed are all in `new_keys`, written once after the loop.
            let known = |key: &str| index.keys.get(key).map(String::as_str);
            claim_keys(known, &mut new_keys, ingested.keys, ingested.exclusive_keys)?;
            for (log, payload) in ingested.records {
                records.push(self.outgoing(&log, payload)?);
            }
            records.push(self.state_record(format!("event:{event_id}"), &position.to_string()));
            new_events.insert(event_id.to_string(), position);
            outcomes.push(Appended::New { position });
        }
        for (key, owner) in &new_keys {
            records.push(self.state_record(format!("key:{key}"), owner));
        }
        if records.is_empty() {
            return Ok(outcomes);
        }
        records.push(self.state_record("head:ingest".to_string(), &head.to_string()));
        if let Some(at) = at_max.filter(|at| Some(*at) != index.at_max_ms) {
            records.push(self.state_record("at_max:ingest".to_string(), &at.to_string()));
        }
        // From the request's records ready to committed: the wait for the store's one producer, then its
        // transaction.
        let queued_at = Instant::now();
        let result = self.transact(&records, &[]);
        // Whatever the outcome, the positions handed out are not handed out again.
        index.ingest_head = head;
        result?;
        self.metrics.ingestion_waited(queued_at.elapsed());
        index.events.extend(new_events);
        index.at_max_ms = at_max;
        for (key, owner) in new_keys {
            index.keys.entry(key).or_insert(owner);
        }
        Ok(outcomes)
    }

    fn event_position(&self, event_id: &str) -> Result<Option<u64>, RuntimeError> {
        Ok(lock(&self.index).events.get(event_id).copied())
    }

    fn snapshot_every_records(&self) -> Option<u64> {
        Some(self.config.changelog_every_records).filter(|every| *every > 0)
    }

    fn take_snapshot(&self, log: &str) -> Result<Option<crate::runtime::Snapshot>, RuntimeError> {
        let mut snapshots = lock(&self.snapshots);
        if snapshots.is_none() {
            *snapshots = Some(self.load_snapshots()?);
        }
        Ok(snapshots.as_mut().and_then(|snapshots| snapshots.remove(log)))
    }

    fn ingested_at_max_ms(&self) -> Result<Option<i64>, RuntimeError> {
        if self.config.group_member {
            self.tail_index()?; // another instance may be the one ingesting
        }
        Ok(lock(&self.index).at_max_ms)
    }

    /// Sharing the partitions, the offsets of logs another instance consumes are read from the state
    /// topic (this instance's cache only knows its own commits).
    fn backlog(&self, pairs: &[(&str, &str)]) -> Result<Vec<u64>, RuntimeError> {
        let consumers: Vec<String> = pairs.iter().map(|(_, consumer)| consumer.to_string()).collect();
        let committed = self.committed_all(&consumers)?;
        pairs.iter().zip(committed).map(|((log, _), next)| Ok(self.head(log)?.saturating_sub(next))).collect()
    }

    /// Read by a reader of its own, one round trip per log asked (the lag report asks only logs with
    /// records waiting): a report (a scrape, `GET /v1/admin/lag`) moves no processing reader.
    fn first_unconsumed(&self, pairs: &[(&str, &str)]) -> Option<Result<Vec<Option<Vec<u8>>>, RuntimeError>> {
        Some(self.first_unconsumed_records(pairs))
    }

    fn committed_all(&self, consumers: &[String]) -> Result<Vec<u64>, RuntimeError> {
        if self.config.group_member {
            self.tail_index()?;
        }
        consumers.iter().map(|consumer| self.known_committed(consumer)).collect()
    }

    fn shares_partitions(&self) -> bool {
        self.config.group_member
    }

    fn join(
        &self,
        listener: Arc<dyn crate::runtime::AssignmentListener>,
    ) -> Result<Option<Box<dyn crate::runtime::GroupMember>>, RuntimeError> {
        if !self.config.group_member {
            return Ok(None);
        }
        let consumer = super::group::subscribe(&self.config, listener)?;
        *lock(&self.member) = Some(Arc::clone(&consumer));
        Ok(Some(Box::new(super::group::KafkaMember { consumer })))
    }

    /// Reads what other instances wrote to the state topic since (their offsets), and drops the
    /// committed offsets and snapshots this instance cached for the logs.
    fn forget(&self, logs: &[String]) -> Result<(), RuntimeError> {
        self.tail_index()?;
        let mut committed = lock(&self.committed);
        for log in logs {
            committed.remove(log);
        }
        *lock(&self.snapshots) = None;
        Ok(())
    }

    fn ingested_key(&self, key: &str) -> Result<Option<String>, RuntimeError> {
        Ok(lock(&self.index).keys.get(key).cloned())
    }

    fn get(&self, table: KeyValueTable, key: &str) -> Result<Option<String>, RuntimeError> {
        let lookup = || {
            let index = lock(&self.index);
            let map = match table {
                KeyValueTable::MerchantKeys => &index.merchant_keys,
                KeyValueTable::Meta => &index.meta,
            };
            map.get(key).cloned()
        };
        match lookup() {
            // Sharing the partitions, another instance may have just written it (a merchant key issued
            // through it): read what the state topic gained since, at most every MISS_TAIL_INTERVAL_MS
            // (unknown tokens must not make every request a broker round trip).
            None if self.config.group_member && self.may_tail_on_miss() => {
                self.tail_index()?;
                Ok(lookup())
            }
            found => Ok(found),
        }
    }

    fn put(&self, table: KeyValueTable, key: &str, value: &str) -> Result<(), RuntimeError> {
        let prefix = match table {
            KeyValueTable::MerchantKeys => "merchant_key",
            KeyValueTable::Meta => "meta",
        };
        let record = self.state_record(format!("{prefix}:{key}"), value);
        self.transact(&[record], &[])?;
        let mut index = lock(&self.index);
        let map = match table {
            KeyValueTable::MerchantKeys => &mut index.merchant_keys,
            KeyValueTable::Meta => &mut index.meta,
        };
        map.insert(key.to_string(), value.to_string());
        Ok(())
    }
}
