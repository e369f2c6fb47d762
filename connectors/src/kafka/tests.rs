//! The Kafka store against librdkafka's mock cluster (in-process brokers speaking the Kafka protocol):
//! the same contract the embedded store keeps, transactions that abort, and recovery from the topics.

use super::*;
use crate::runtime::{process_batch, stage_log, Appended, Ingested, OutputRecord, RuntimeError, Store, WriteBatch};
use crate::runtime::{KeyValueTable, OUTPUTS_LOG};
use pipelines::input::{parse_line, Parsed};
use pipelines::partition::{RecordBody, RecordId, StageKind, StagePartition, StageRecord};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use std::sync::RwLock;

fn mock(partitions: u32) -> (KafkaConfig, MockCluster) {
    let mut config = KafkaConfig::new("", partitions);
    config.request_timeout_ms = 5_000;
    let cluster = start_mock_cluster(&mut config).expect("the mock cluster starts");
    (config, cluster)
}

/// Reads a log from `from` to its end.
fn read_all(store: &KafkaStore, log: &str) -> Vec<(u64, Vec<u8>)> {
    let mut records = Vec::new();
    let mut next = 0;
    loop {
        let batch = store.read(log, next, 100).expect("a read");
        let Some(&(last, _)) = batch.last() else { return records };
        next = last + 1;
        records.extend(batch);
    }
}

/// A tick record of the runtime (JSON, as the runtime hands records to a store), from `source` at `offset`.
fn tick(source: &str, offset: u64) -> Vec<u8> {
    let at = pipelines::Timestamp::parse("2026-03-02T09:00:00Z").expect("a time");
    let record = StageRecord { id: RecordId { source: source.into(), offset, index: 0 }, at, body: RecordBody::Tick };
    crate::runtime::encode(&record).expect("encodes")
}

/// An output record of the runtime: a notification caused by `source` at `offset`.
fn output(source: &str, offset: u64) -> Vec<u8> {
    let at = pipelines::Timestamp::parse("2026-03-02T09:00:00Z").expect("a time");
    let body = pipelines::output::OutputBody::SessionRevoked { user_id: "u1".into() };
    let record = OutputRecord {
        id: RecordId { source: source.into(), offset, index: 0 },
        output: pipelines::output::Output { at, body },
    };
    crate::runtime::encode(&record).expect("encodes")
}

fn ingest_one(store: &KafkaStore, event_id: &str, card: Option<(&str, &str)>) -> Result<Vec<Appended>, RuntimeError> {
    store.ingest(&[event_id], &mut |_, position| {
        Ok(Ingested {
            records: vec![("agent-0".into(), tick("ingest", position))],
            stage_records: Vec::new(),
            keys: vec![(format!("order:{event_id}"), "m1".to_string())],
            exclusive_keys: card.map(|(card, user)| (format!("card:{card}"), user.to_string())).into_iter().collect(),
            at_ms: Some(1_000),
        })
    })
}

#[test]
fn a_batch_and_its_offsets_commit_together_and_survive_a_restart() {
    let (config, _cluster) = mock(2);
    let store = KafkaStore::open(config.clone()).expect("the store opens");
    let appends = vec![("agent-1".into(), tick("ingest", 1)), ("outputs".into(), output("agent-1", 7))];
    store.commit(WriteBatch { appends, offsets: Vec::new(), ..WriteBatch::default() }).expect("committed");
    // Avro on the topics; the runtime's own encoding back from the store (an output's record id
    // travels in a header).
    assert_eq!(read_all(&store, "agent-1"), vec![(0, tick("ingest", 1))]);
    assert_eq!(read_all(&store, OUTPUTS_LOG), vec![(0, output("agent-1", 7))]);
    let (payload, _) = first_raw(&config, "paisa.agent", 1);
    assert_eq!(payload[..5], [0, 0, 0, 0, 4], "Confluent framing, schema id 4 (StageRecord)");
    let (payload, record_id) = first_raw(&config, "paisa.outputs", 0);
    assert_eq!(payload[..5], [0, 0, 0, 0, 5], "Confluent framing, schema id 5 (Output)");
    assert_eq!(record_id.as_deref(), Some(&br#"{"source":"agent-1","offset":7,"index":0}"#[..]));
    let offsets = vec![("agent-1".to_string(), 1), (crate::runtime::CONNECTOR_CONSUMER.to_string(), 1)];
    let appends = vec![("merchant-0".into(), tick("order-0", 3))];
    store.commit(WriteBatch { appends, offsets, ..WriteBatch::default() }).expect("committed");
    store.put(KeyValueTable::Meta, "partitions", "2").expect("put");
    drop(store);
    // A new instance (same transactional id: it fences the old one) reads its offsets from the
    // consumer group and its tables from the state topic.
    let store = KafkaStore::open(config).expect("the store reopens");
    assert_eq!(store.committed("agent-1").expect("an offset"), 1);
    assert_eq!(store.committed(crate::runtime::CONNECTOR_CONSUMER).expect("an offset"), 1);
    assert_eq!(store.committed("agent-0").expect("an offset"), 0, "never committed");
    assert_eq!(read_all(&store, "merchant-0"), vec![(0, tick("order-0", 3))]);
    assert_eq!(store.get(KeyValueTable::Meta, "partitions").expect("a get"), Some("2".to_string()));
    assert!(store.read("agent-7", 0, 1).is_err(), "a log beyond the partition count is refused");
}

#[test]
fn the_first_unconsumed_record_is_read_at_the_committed_offset_and_moves_no_processing_reader() {
    let (config, _cluster) = mock(2);
    let store = KafkaStore::open(config).expect("the store opens");
    let records: Vec<Vec<u8>> = (0..3).map(|offset| tick("ingest", offset)).collect();
    let appends = records.iter().map(|record| ("agent-1".into(), record.clone())).collect();
    store.commit(WriteBatch { appends, ..WriteBatch::default() }).expect("appended");
    let first = |pair: (&str, &str)| store.first_unconsumed(&[pair]).expect("read").expect("read");
    assert_eq!(first(("agent-1", "agent-1")), vec![Some(records[0].clone())], "a consumer that never committed");
    // The processing reader stops after the first record; reports in between do not move it.
    assert_eq!(store.read("agent-1", 0, 1).expect("a read"), vec![(0, records[0].clone())]);
    for next in 1..=records.len() as u64 {
        let offsets = vec![("agent-1".to_string(), next)];
        store.commit(WriteBatch { offsets, ..WriteBatch::default() }).expect("committed");
        assert_eq!(first(("agent-1", "agent-1")), vec![records.get(next as usize).cloned()], "after consuming {next}");
    }
    let rest: Vec<(u64, Vec<u8>)> =
        records.iter().cloned().enumerate().skip(1).map(|(offset, record)| (offset as u64, record)).collect();
    assert_eq!(store.read("agent-1", 1, 10).expect("a read"), rest, "the processing reader reads on from 1");
    // An output waits for the connector: read back in the runtime's encoding, its record id from the header.
    let appends = vec![(OUTPUTS_LOG.into(), output("agent-1", 7))];
    store.commit(WriteBatch { appends, ..WriteBatch::default() }).expect("appended");
    let pairs = [("agent-0", "agent-0"), ("agent-1", "agent-1"), (OUTPUTS_LOG, crate::runtime::CONNECTOR_CONSUMER)];
    let firsts = store.first_unconsumed(&pairs).expect("read").expect("read");
    assert_eq!(firsts, vec![None, None, Some(output("agent-1", 7))]);
    let at = crate::runtime::record_event_time(OUTPUTS_LOG, firsts[2].as_deref().expect("a record"));
    assert_eq!(at, Some(pipelines::Timestamp::parse("2026-03-02T09:00:00Z").expect("a time")));
}

#[test]
fn ingestion_deduplicates_event_ids_and_guards_cards_across_restarts() {
    let (config, _cluster) = mock(1);
    let store = KafkaStore::open(config.clone()).expect("the store opens");
    let outcomes = store
        .ingest(&["e1", "e2", "e1"], &mut |_, position| {
            Ok(Ingested { records: vec![("agent-0".into(), tick("ingest", position))], ..Ingested::default() })
        })
        .expect("ingested");
    assert_eq!(
        outcomes,
        vec![Appended::New { position: 0 }, Appended::New { position: 1 }, Appended::Duplicate { position: 0 }]
    );
    assert_eq!(ingest_one(&store, "e3", Some(("k1", "u1"))).expect("bound"), vec![Appended::New { position: 2 }]);
    let refused = ingest_one(&store, "e4", Some(("k1", "u2")));
    assert!(matches!(refused, Err(RuntimeError::Invalid(_))), "{refused:?}");
    assert_eq!(read_all(&store, "agent-0").len(), 3, "nothing of the refused request was appended");
    drop(store);
    let store = KafkaStore::open(config).expect("the store reopens");
    assert_eq!(store.event_position("e2").expect("a lookup"), Some(1));
    assert_eq!(store.event_position("e4").expect("a lookup"), None);
    assert_eq!(store.ingested_key("order:e3").expect("a lookup"), Some("m1".to_string()));
    assert_eq!(ingest_one(&store, "e1", None).expect("a duplicate"), vec![Appended::Duplicate { position: 0 }]);
    let refused = ingest_one(&store, "e5", Some(("k1", "u2")));
    assert!(matches!(refused, Err(RuntimeError::Invalid(_))), "the card's owner survived the restart: {refused:?}");
    // Positions continue after the restored head (the refused e4 took none).
    assert_eq!(ingest_one(&store, "e6", None).expect("ingested"), vec![Appended::New { position: 3 }]);
}

use crate::runtime::tests::rejected_recharge;

/// Outputs of the outputs log, with those whose id was seen before dropped (what every consumer does).
fn distinct_outputs(store: &KafkaStore) -> Vec<OutputRecord> {
    let mut seen = std::collections::BTreeSet::new();
    read_all(store, OUTPUTS_LOG)
        .into_iter()
        .filter_map(|(_, bytes)| serde_json::from_slice::<OutputRecord>(&bytes).ok())
        .filter(|record| seen.insert((record.id.source.clone(), record.id.offset, record.id.index)))
        .collect()
}

#[test]
fn a_transaction_aborted_mid_batch_commits_nothing_and_the_retry_emits_once() {
    let (config, cluster) = mock(1);
    let store = KafkaStore::open(config.clone()).expect("the store opens");
    let log = stage_log(StageKind::Agent, 0);
    let record = crate::runtime::encode(&rejected_recharge()).expect("encodes");
    store
        .commit(WriteBatch {
            appends: vec![(log.as_str().into(), record)],
            offsets: Vec::new(),
            ..WriteBatch::default()
        })
        .expect("appended");
    // The records of the batch are produced, then adding its offsets to the transaction is refused:
    // the transaction must be aborted.
    cluster.request_errors(
        RDKafkaApiKey::AddOffsetsToTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED],
    );
    let partition = RwLock::new(StagePartition::new(StageKind::Agent, 0, 1, pipelines::Config::default()));
    let error = process_batch(&store, &partition, 1, 16).expect_err("the commit fails");
    assert!(!error.is_retryable(), "a commit after apply stops the partition: {error}");
    assert_eq!(store.committed(&log).expect("an offset"), 0, "the offset did not move");
    // A new instance. A broker that hides aborted transactions from read_committed readers shows
    // neither the batch's output nor its offset entry, and the record is processed again. librdkafka's
    // mock cluster shows both: the record counts as consumed, and its output is there. Either way the
    // state and the outputs come out the same.
    drop(store);
    let store = KafkaStore::open(config).expect("the store reopens");
    let partition = RwLock::new(StagePartition::new(StageKind::Agent, 0, 1, pipelines::Config::default()));
    if store.committed(&log).expect("an offset") == 0 {
        assert_eq!(process_batch(&store, &partition, 1, 16).expect("processed").consumed, 1);
    }
    assert_eq!(store.committed(&log).expect("an offset"), 1);
    // Whether or not the broker shows the aborted copy to read_committed readers (the mock cluster may),
    // consumers that drop seen ids see one rejection.
    let outputs = distinct_outputs(&store);
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    assert!(matches!(outputs[0].output.body, pipelines::output::OutputBody::CommandRejected { .. }));
}

/// The non-wallet inputs of the service scenario up to its first wallet line (setup, a collection and a
/// dispatch: crawl requests go out, nothing answers them).
fn scenario_inputs() -> Vec<pipelines::Input> {
    let text = include_str!("../../../tests/service/spaced.jsonl");
    text.lines()
        .take_while(|line| !line.contains("\"wallet_line\""))
        .map(|line| match parse_line(line, || "generated".to_string()) {
            Ok(Parsed::Input(input)) => input,
            other => panic!("an input: {other:?}"),
        })
        .collect()
}

fn wait_quiescent(pipeline: &crate::embedded::Embedded) {
    use crate::runtime::PipelineHandle;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pipeline.lag() != 0 {
        assert!(std::time::Instant::now() < deadline, "the pipeline did not become quiescent");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn the_pipeline_on_kafka_restarts_from_its_topics_with_the_same_state() {
    use crate::runtime::{ClockMode, PipelineHandle};
    let (kafka, _cluster) = mock(2);
    let directory = tempfile::tempdir().expect("a temporary directory");
    let config = crate::embedded::EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
    let start = || {
        let store = KafkaStore::open(kafka.clone()).expect("the store opens");
        crate::embedded::Embedded::start_on(config.clone(), Box::new(store), None).expect("the pipeline starts")
    };
    let pipeline = start();
    let inputs = scenario_inputs();
    let appended = pipeline.append(inputs.clone()).expect("appended");
    assert!(appended.iter().all(|outcome| matches!(outcome, Appended::New { .. })));
    wait_quiescent(&pipeline);
    // Quiescent: every log is read to its end, so nothing is behind in time either.
    let report = pipeline.lag_report();
    assert!(report.lag_ms.keys().eq(report.logs.keys()), "a lag in time per log: {report:?}");
    assert!(report.lag_ms.values().all(|lag| *lag == 0), "{report:?}");
    let before = pipeline.snapshot();
    assert_eq!(before["orders"]["o1"]["sub_orders"][0]["user_id"], "u1", "the dispatch was applied: {before}");
    assert_eq!(before["users"]["u1"]["frozen"], "300.00", "the collection's hold: {before}");
    pipeline.stop();
    drop(pipeline);
    // A new process (a rebalance moving every partition to it) rebuilds each stage partition from its
    // topic partition up to the committed offset: the same state, and appending again changes nothing.
    let pipeline = start();
    wait_quiescent(&pipeline);
    assert_eq!(pipeline.snapshot(), before);
    let again = pipeline.append(inputs).expect("appended");
    assert!(again.iter().all(|outcome| matches!(outcome, Appended::Duplicate { .. })), "{again:?}");
    wait_quiescent(&pipeline);
    assert_eq!(pipeline.snapshot(), before);
    pipeline.stop();
}

/// librdkafka's mock cluster does not implement CreateTopics: the topics are created through its own
/// API, and `init` must find them, create nothing, and refuse a different partition count. (Creation
/// itself runs against a real broker: `deploy/docker-compose.yml`.)
#[test]
fn admin_init_accepts_existing_topics_and_refuses_another_partition_count() {
    use super::admin::{init_topics, TopicStatus};
    let (mut config, _cluster) = mock(3);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let statuses = runtime.block_on(init_topics(&config, 1)).expect("init finds every topic");
    assert_eq!(statuses.len(), KafkaStore::topics(&config).len());
    assert!(
        statuses.contains(&TopicStatus::Existed { topic: "paisa.agent".to_string(), partitions: 3 }),
        "{statuses:?}"
    );
    assert!(statuses.iter().all(|status| matches!(status, TopicStatus::Existed { .. })), "{statuses:?}");
    config.partitions = 4;
    let refused = runtime.block_on(init_topics(&config, 1));
    assert!(
        matches!(refused, Err(RuntimeError::Fatal(ref message)) if message.contains("partition count")),
        "{refused:?}"
    );
}

/// The first record of a topic partition as stored: its value and its `paisa-record-id` header.
fn first_raw(config: &KafkaConfig, topic: &str, partition: i32) -> (Vec<u8>, Option<Vec<u8>>) {
    use rdkafka::message::{Headers, Message};
    let message = first_message(config, topic, partition);
    let header = message.headers().and_then(|headers| {
        headers
            .iter()
            .find(|header| header.key == payload::RECORD_ID_HEADER)
            .and_then(|header| header.value.map(<[u8]>::to_vec))
    });
    (message.payload().unwrap_or_default().to_vec(), header)
}

/// The first record of a topic partition, read by a plain consumer.
fn first_message(config: &KafkaConfig, topic: &str, partition: i32) -> rdkafka::message::OwnedMessage {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", "inspect")
        .create()
        .expect("a consumer");
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition_offset(topic, partition, rdkafka::Offset::Beginning).expect("an assignment");
    consumer.assign(&list).expect("assigned");
    match consumer.poll(std::time::Duration::from_secs(5)) {
        Some(Ok(message)) => message.detach(),
        other => panic!("no record on {topic}: {:?}", other.map(|result| result.map(|message| message.offset()))),
    }
}

/// A record this version cannot read, produced straight to the agent topic by another producer.
fn produce_poison(config: &KafkaConfig) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .create()
        .expect("a plain producer");
    producer
        .send(BaseRecord::<(), [u8]>::to("paisa.agent").partition(0).payload(b"\x00\x00\x00\x00\x63garbage"))
        .expect("sent");
    producer.flush(std::time::Duration::from_secs(5)).expect("flushed");
}

#[test]
fn a_poison_record_goes_to_the_dead_letter_topic_with_its_origin_and_the_partition_goes_on() {
    use rdkafka::message::{Headers, Message};
    let (config, _cluster) = mock(1);
    let store = KafkaStore::open(config.clone()).expect("the store opens");
    produce_poison(&config);
    let log = stage_log(StageKind::Agent, 0);
    let record = crate::runtime::encode(&rejected_recharge()).expect("encodes");
    store
        .commit(WriteBatch {
            appends: vec![(log.as_str().into(), record)],
            offsets: Vec::new(),
            ..WriteBatch::default()
        })
        .expect("appended");
    let partition = RwLock::new(StagePartition::new(StageKind::Agent, 0, 1, pipelines::Config::default()));
    let mut consumed = 0;
    while consumed < 2 {
        consumed += process_batch(&store, &partition, 1, 16).expect("processed").consumed;
    }
    assert_eq!(store.committed(&log).expect("an offset"), 2, "the poison record did not stop the partition");
    assert_eq!(distinct_outputs(&store).len(), 1, "the record after it was processed");
    // The dead letter: the poison record's bytes, with where it came from and why.
    let letter = first_message(&config, "paisa.dead-letters", 0);
    assert_eq!(letter.payload(), Some(&b"\x00\x00\x00\x00\x63garbage"[..]));
    let headers = letter.headers().expect("headers");
    let header = |name: &str| {
        headers
            .iter()
            .find(|header| header.key == name)
            .and_then(|header| header.value)
            .map(|value| String::from_utf8_lossy(value).to_string())
    };
    assert_eq!(header("source-topic").as_deref(), Some("paisa.agent"));
    assert_eq!(header("source-partition").as_deref(), Some("0"));
    assert_eq!(header("source-offset").as_deref(), Some("0"));
    assert!(header("error").is_some_and(|error| !error.is_empty()));
}

/// `paisa reprocess --from-beginning`: a read model rebuilt from the topics alone, by another process
/// that processes and commits nothing, equals the one the live pipeline's projector wrote; compared
/// with an empty model, every row is reported missing.
#[test]
fn a_read_model_rebuilt_from_the_topics_equals_the_live_one() {
    use crate::embedded::reprocess::{compare, rebuild};
    use crate::runtime::{ClockMode, PipelineHandle};
    use crate::scylla::{MemoryReadModel, ReadModel, PAGE_ITEMS_MAX};
    use std::sync::Arc;
    let (kafka, _cluster) = mock(2);
    let directory = tempfile::tempdir().expect("a temporary directory");
    let config = crate::embedded::EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
    let live: Arc<dyn ReadModel> = Arc::new(MemoryReadModel::new(PAGE_ITEMS_MAX));
    let store = KafkaStore::open(kafka.clone()).expect("the store opens");
    let pipeline = crate::embedded::Embedded::start_on(config.clone(), Box::new(store), Some(Arc::clone(&live)))
        .expect("the pipeline starts");
    pipeline.append(scenario_inputs()).expect("appended");
    wait_quiescent(&pipeline);
    assert!(live.order("o1").expect("a read").is_some(), "the projector wrote the live model");
    // The rebuild runs beside the live instance: its own transactional id (none is used: it writes
    // nothing), so it fences nobody.
    let mut reader = kafka.clone();
    reader.transactional_id = "paisa-reprocess".to_string();
    reader.transactions = false;
    let fresh: Arc<dyn ReadModel> = Arc::new(MemoryReadModel::new(PAGE_ITEMS_MAX));
    let rebuilt =
        rebuild(config.clone(), Box::new(KafkaStore::open(reader.clone()).expect("opens")), Arc::clone(&fresh))
            .expect("rebuilt");
    let comparison = compare(&rebuilt, fresh.as_ref(), live.as_ref()).expect("compared");
    assert!(comparison.differences.is_empty(), "{comparison:?}");
    assert!(comparison.equal >= 4, "orders, agents and the merchant were compared: {comparison:?}");
    let empty = MemoryReadModel::new(PAGE_ITEMS_MAX);
    let against_empty = compare(&rebuilt, fresh.as_ref(), &empty).expect("compared");
    assert_eq!(against_empty.equal, 0);
    assert!(
        against_empty.differences.iter().any(|line| line.contains("missing from the live model")),
        "{against_empty:?}"
    );
    // The live pipeline was not fenced: it still commits.
    let more = scenario_inputs().into_iter().take(1).map(|mut input| {
        input.event_id = "after-reprocess".into();
        input
    });
    assert!(pipeline.append(more.collect()).is_ok());
    wait_quiescent(&pipeline);
    pipeline.stop();
}

/// A Schema Registry on loopback answering `POST /subjects/{subject}/versions` with an id per schema
/// (`StageRecord` 101, `Output` 102), counting registrations.
async fn fake_registry(registered: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/subjects/{subject}/versions",
            post(move |axum::extract::Path(subject): axum::extract::Path<String>, body: String| {
                let registered = std::sync::Arc::clone(&registered);
                async move {
                    registered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let id =
                        if body.contains("in.paisa.v1") && subject.ends_with(".outputs-value") { 102 } else { 101 };
                    axum::Json(serde_json::json!({ "id": id }))
                }
            }),
        )
        .route(
            "/schemas/ids/{id}",
            get(|axum::extract::Path(id): axum::extract::Path<u32>| async move {
                match id {
                    EVOLVED_STAGE_RECORD_ID => Ok(axum::Json(serde_json::json!({ "schema": evolved_stage_record() }))),
                    _ => Err(axum::http::StatusCode::NOT_FOUND),
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// The id a newer version's `StageRecord` schema got in the fake registry.
const EVOLVED_STAGE_RECORD_ID: u32 = 200;

/// `StageRecord` as a newer version writes it: one more field, optional with a default (BACKWARD).
fn evolved_stage_record() -> String {
    let mut schema: serde_json::Value =
        serde_json::from_str(schemas::SchemaName::StageRecord.text()).expect("the embedded schema is JSON");
    let field = serde_json::json!({"name": "trace_id", "type": ["null", "string"], "default": null});
    schema["fields"].as_array_mut().expect("a record's fields").push(field);
    schema.to_string()
}

/// A tick record framed with the evolved schema's id, as a newer version writes it.
fn evolved_tick(offset: u64) -> Vec<u8> {
    use schemas::convert::AvroRecord;
    let record: StageRecord = serde_json::from_slice(&tick("ingest", offset)).expect("a record");
    let apache_avro::types::Value::Record(mut fields) = record.to_avro().expect("to Avro") else { panic!("a record") };
    let trace = apache_avro::types::Value::Union(1, Box::new(apache_avro::types::Value::String("t-1".to_string())));
    fields.push(("trace_id".to_string(), trace));
    let schema = apache_avro::Schema::parse_str(&evolved_stage_record()).expect("the evolved schema parses");
    let body = apache_avro::to_avro_datum(&schema, apache_avro::types::Value::Record(fields)).expect("encodes");
    schemas::wire::frame(EVOLVED_STAGE_RECORD_ID, &body)
}

#[test]
fn with_a_schema_registry_records_carry_its_ids_and_still_read_back() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let registered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let registry = runtime.block_on(fake_registry(std::sync::Arc::clone(&registered)));
    let (mut config, _cluster) = mock(1);
    config.schema_ids =
        runtime.block_on(payload::register_schemas(&registry, &config.avro_topics())).expect("registered");
    assert_eq!(registered.load(std::sync::atomic::Ordering::SeqCst), 4, "the three stage topics and the outputs");
    assert_eq!(config.schema_ids.by_topic.get("paisa.agent"), Some(&101));
    assert_eq!(config.schema_ids.by_topic.get("paisa.outputs"), Some(&102));
    let store = KafkaStore::open(config.clone()).expect("the store opens");
    let appends = vec![("agent-0".into(), tick("ingest", 1)), ("outputs".into(), output("agent-0", 4))];
    store.commit(WriteBatch { appends, offsets: Vec::new(), ..WriteBatch::default() }).expect("committed");
    assert_eq!(first_raw(&config, "paisa.agent", 0).0[..5], [0, 0, 0, 0, 101]);
    assert_eq!(first_raw(&config, "paisa.outputs", 0).0[..5], [0, 0, 0, 0, 102]);
    assert_eq!(read_all(&store, "agent-0"), vec![(0, tick("ingest", 1))]);
    assert_eq!(read_all(&store, OUTPUTS_LOG), vec![(0, output("agent-0", 4))]);
    // Records written before the registry (static ids) still read.
    let mut without = config.clone();
    without.schema_ids = payload::SchemaIds::default();
    drop(store);
    let store = KafkaStore::open(without).expect("reopens without the registry");
    store
        .commit(WriteBatch { appends: vec![("agent-0".into(), tick("ingest", 2))], ..WriteBatch::default() })
        .expect("committed");
    drop(store);
    let store = KafkaStore::open(config).expect("reopens with the registry");
    assert_eq!(read_all(&store, "agent-0"), vec![(0, tick("ingest", 1)), (1, tick("ingest", 2))]);
}

/// The changelog: partitions write snapshots of their state in the transactions of their batches, and a
/// restart restores each partition from its latest snapshot plus the records after it, to the same state
/// as applying the whole log.
#[test]
fn partitions_restore_from_the_changelog_to_the_same_state() {
    use crate::runtime::{restore, ClockMode, PipelineHandle};
    let (mut kafka, _cluster) = mock(2);
    kafka.changelog_every_records = 3;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let config = crate::embedded::EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
    let store = KafkaStore::open(kafka.clone()).expect("the store opens");
    let pipeline = crate::embedded::Embedded::start_on(config.clone(), Box::new(store), None).expect("starts");
    pipeline.append(scenario_inputs()).expect("appended");
    wait_quiescent(&pipeline);
    let before: Vec<((StageKind, u32), Vec<u8>)> = pipeline
        .inner
        .partitions
        .iter()
        .map(|(key, lock)| (*key, crate::runtime::read_lock(lock).snapshot().expect("a snapshot")))
        .collect();
    let document = pipeline.snapshot();
    pipeline.stop();
    drop(pipeline);
    let store = KafkaStore::open(kafka.clone()).expect("the store reopens");
    let (mut replayed, mut committed) = (0, 0);
    for ((kind, index), expected) in &before {
        let log = stage_log(*kind, *index);
        let mut partition = StagePartition::new(*kind, *index, 2, pipelines::Config::default());
        replayed += restore(&store, &mut partition, &pipelines::Config::default(), 16, &mut |_| {}).expect("restored");
        committed += store.committed(&log).expect("an offset");
        assert_eq!(&partition.snapshot().expect("a snapshot"), expected, "{log} restored to another state");
    }
    assert!(replayed < committed, "snapshots were used: {replayed} of {committed} records applied again");
    drop(store);
    let store = KafkaStore::open(kafka).expect("the store reopens");
    let pipeline = crate::embedded::Embedded::start_on(config, Box::new(store), None).expect("restarts");
    wait_quiescent(&pipeline);
    assert_eq!(pipeline.snapshot(), document);
    pipeline.stop();
}

/// Brokers answering with retriable errors (a leader that moved, a coordinator loading) while the
/// pipeline runs: librdkafka's idempotent, transactional producer retries them, and the state is the one
/// a run without errors reaches — nothing lost, nothing applied twice.
#[test]
fn retriable_broker_errors_mid_stream_change_nothing() {
    use crate::runtime::{ClockMode, PipelineHandle};
    let run = |inject: bool| {
        let (kafka, cluster) = mock(2);
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = crate::embedded::EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        let store = KafkaStore::open(kafka).expect("the store opens");
        let pipeline = crate::embedded::Embedded::start_on(config, Box::new(store), None).expect("starts");
        let inputs = scenario_inputs();
        let (first, rest) = inputs.split_at(inputs.len() / 2);
        pipeline.append(first.to_vec()).expect("appended");
        if inject {
            use RDKafkaRespErr::*;
            cluster.request_errors(
                RDKafkaApiKey::Produce,
                &[RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT],
            );
            cluster.request_errors(RDKafkaApiKey::EndTxn, &[RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS]);
            cluster.request_errors(RDKafkaApiKey::Fetch, &[RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION]);
        }
        pipeline.append(rest.to_vec()).expect("appended despite the errors");
        wait_quiescent(&pipeline);
        assert_eq!(pipeline.failure(), None, "the pipeline kept running");
        let document = pipeline.snapshot();
        pipeline.stop();
        document
    };
    assert_eq!(run(true), run(false));
}

/// A snapshot larger than Kafka's message limit is written as chunks and read back whole; chunks of an
/// incomplete later snapshot never mix with a complete earlier one.
#[test]
fn snapshots_are_chunked_and_reassembled() {
    use crate::runtime::Snapshot;
    let state: Vec<u8> = (0..(payload::SNAPSHOT_CHUNK_BYTES_MAX * 2 + 1000)).map(|byte| (byte % 251) as u8).collect();
    let snapshot = Snapshot { kind: StageKind::Agent, partition: 1, last_offset: 41, state: state.clone() };
    let records = payload::snapshot_to_topic("agent-1", &snapshot).expect("encoded");
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|(_, value)| value.len() < 1_000_000), "each chunk fits a Kafka message");
    let later = Snapshot { last_offset: 90, ..snapshot.clone() };
    let later_records = payload::snapshot_to_topic("agent-1", &later).expect("encoded");
    let mut chunks = payload::SnapshotChunks::default();
    for (_, value) in records.iter().chain(later_records.iter().take(2)) {
        chunks.add(value);
    }
    let latest = chunks.latest();
    assert_eq!(latest.get("agent-1"), Some(&snapshot), "the incomplete later snapshot is not used");
    let mut chunks = payload::SnapshotChunks::default();
    for (_, value) in records.iter().chain(later_records.iter()) {
        chunks.add(value);
    }
    assert_eq!(chunks.latest().get("agent-1"), Some(&later));
}

/// A record the producer refuses (larger than the message limit) fails its commit, the transaction is
/// aborted, and the next commit goes through.
#[test]
fn a_refused_record_aborts_its_transaction_and_the_store_goes_on() {
    let (config, _cluster) = mock(1);
    let store = KafkaStore::open(config).expect("the store opens");
    let letter = crate::runtime::DeadLetter {
        log: "agent-0".to_string(),
        offset: 0,
        error: "too big".to_string(),
        payload_hex: "ab".repeat(2_000_000),
    };
    let appends = vec![(crate::runtime::DEAD_LETTER_LOG.into(), serde_json::to_vec(&letter).expect("json"))];
    assert!(store.commit(WriteBatch { appends, ..WriteBatch::default() }).is_err());
    let appends = vec![("agent-0".into(), tick("ingest", 1))];
    store.commit(WriteBatch { appends, ..WriteBatch::default() }).expect("the next transaction commits");
    assert_eq!(read_all(&store, "agent-0"), vec![(0, tick("ingest", 1))]);
}

/// A record written by a newer version (a schema id this version never registered) is read by fetching
/// the writer's schema from the registry and resolving it to this version's; without a registry the
/// same record is dead-lettered as unreadable.
#[test]
fn a_record_of_a_newer_schema_is_read_through_the_registry() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let registered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let registry = runtime.block_on(fake_registry(registered));
    let (mut config, _cluster) = mock(1);
    let producer: BaseProducer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", &config.bootstrap_servers).create().expect("a producer");
    producer.send(BaseRecord::<(), [u8]>::to("paisa.agent").partition(0).payload(&evolved_tick(5))).expect("sent");
    producer.flush(std::time::Duration::from_secs(5)).expect("flushed");
    let without = KafkaStore::open(config.clone()).expect("the store opens");
    let unread = read_all(&without, "agent-0");
    assert!(serde_json::from_slice::<StageRecord>(&unread[0].1).is_err(), "no registry: not readable");
    drop(without);
    config.schema_ids =
        runtime.block_on(payload::register_schemas(&registry, &config.avro_topics())).expect("registered");
    let store = KafkaStore::open(config).expect("the store opens");
    assert_eq!(read_all(&store, "agent-0"), vec![(0, tick("ingest", 5))], "resolved to this version's schema");
}

/// The non-wallet inputs of a generated workload (agents, merchants, collections, payouts; no provider
/// answers them, so checks go unanswered and timers close what they close).
fn workload_inputs(agents: usize, rounds: usize) -> Vec<pipelines::Input> {
    pipelines::workload::workload(agents, rounds)
        .into_iter()
        .filter(|input| !input.command.type_name().starts_with("wallet_"))
        .collect()
}

/// What `paisa replay` computes for the inputs without a statement provider: the SPEC §9 document.
fn replayed(inputs: &[pipelines::Input]) -> serde_json::Value {
    let mut engine = pipelines::Engine::new(pipelines::Config::default(), None);
    for input in inputs {
        engine.apply(input.clone());
    }
    if let Some(last) = inputs.last() {
        engine.advance_to(last.at);
    }
    serde_json::to_value(engine.document()).expect("a document")
}

/// Waits until the instances' assignments are disjoint, none is empty, and together they hold every
/// stage partition; returns them.
fn wait_for_assignment(instances: &[&crate::embedded::Embedded], partitions: u32) -> Vec<Vec<String>> {
    let every: std::collections::BTreeSet<String> =
        StageKind::ALL.into_iter().flat_map(|kind| (0..partitions).map(move |index| stage_log(kind, index))).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let assignments: Vec<Vec<String>> =
            instances.iter().map(|instance| instance.assigned_logs().expect("a shared store")).collect();
        let union: std::collections::BTreeSet<String> = assignments.iter().flatten().cloned().collect();
        let total: usize = assignments.iter().map(Vec::len).sum();
        if union == every && total == every.len() && assignments.iter().all(|logs| !logs.is_empty()) {
            return assignments;
        }
        assert!(std::time::Instant::now() < deadline, "no complete assignment: {assignments:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The document with its outputs in a canonical order: stage partitions emit concurrently, so the
/// outputs log holds them in commit order, not replay's.
fn comparable(mut document: serde_json::Value) -> serde_json::Value {
    if let Some(outputs) = document.get_mut("outputs").and_then(serde_json::Value::as_array_mut) {
        outputs.sort_by_cached_key(|output| output.to_string());
    }
    document
}

/// Appends the inputs one at a time through the first instance, each once every instance is quiescent
/// (SPEC §3: a consumer of several logs interleaves them by timing; spaced inputs leave it one order).
fn feed(instances: &[&crate::embedded::Embedded], inputs: &[pipelines::Input]) {
    use crate::runtime::PipelineHandle;
    for input in inputs {
        instances[0].append(vec![input.clone()]).expect("appended");
        for instance in instances {
            wait_quiescent(instance);
        }
    }
}

/// Checks that the read model serves what replay computes: every order (joined with its sub-orders),
/// every agent's balances, holds, cards and journal length, every merchant's balances and journal.
fn assert_model_serves(model: &dyn crate::scylla::ReadModel, expected: &serde_json::Value) {
    for (order_id, order) in expected["orders"].as_object().expect("orders") {
        let mut served = model.order_view(order_id).expect("reads").expect("the order is in the model").view;
        served.as_object_mut().expect("an object").remove("order_id");
        assert_eq!(&served, order, "order {order_id}");
    }
    for (user_id, user) in expected["users"].as_object().expect("users") {
        let served = model.user(user_id).expect("reads").expect("the agent is in the model").view;
        for field in ["status", "available", "frozen", "deferred", "holds", "cards", "status_history"] {
            assert_eq!(served[field], user[field], "agent {user_id}: {field}");
        }
        let journal = user["journal"].as_array().expect("a journal");
        assert_eq!(served["journal_entries"], journal.len(), "agent {user_id}");
        let page = model.user_journal(user_id, 0, journal.len() + 1).expect("reads");
        assert_eq!(&page.items, journal, "agent {user_id}: journal");
    }
    for (merchant_id, merchant) in expected["merchants"].as_object().expect("merchants") {
        let served = model.merchant(merchant_id).expect("reads").expect("the merchant is in the model").view;
        for field in ["available", "payout_reserve"] {
            assert_eq!(served[field], merchant[field], "merchant {merchant_id}: {field}");
        }
        let journal = merchant["journal"].as_array().expect("a journal");
        let page = model.merchant_journal(merchant_id, 0, journal.len() + 1).expect("reads");
        assert_eq!(&page.items, journal, "merchant {merchant_id}: journal");
    }
}

/// A mock cluster whose instances share `partitions` stage partitions (`group_member`, the given session
/// timeout), and the event-clock runtime settings they run with in `directory`.
fn sharing(
    partitions: u32,
    session_timeout_ms: u64,
    directory: &std::path::Path,
) -> (KafkaConfig, MockCluster, crate::embedded::EmbeddedConfig) {
    let (mut kafka, cluster) = mock(partitions);
    kafka.group_member = true;
    kafka.session_timeout_ms = session_timeout_ms;
    let mut config = crate::embedded::EmbeddedConfig::new(directory.to_path_buf(), crate::runtime::ClockMode::Event);
    config.partitions = partitions;
    config.tick_interval_ms = 10;
    (kafka, cluster, config)
}

/// Starts an instance on `kafka` as `transactional_id` (a group member of its own).
fn start_member(
    kafka: &KafkaConfig,
    config: &crate::embedded::EmbeddedConfig,
    transactional_id: &str,
    model: Option<std::sync::Arc<dyn crate::scylla::ReadModel>>,
) -> crate::embedded::Embedded {
    let mut kafka = kafka.clone();
    kafka.transactional_id = transactional_id.to_string();
    let store = KafkaStore::open(kafka).expect("the store opens");
    crate::embedded::Embedded::start_on(config.clone(), Box::new(store), model).expect("the instance starts")
}

/// Two instances share the stage partitions through the consumer group `paisa.stages`. The second one
/// joining takes some of them over (restored from the changelog and their topics) and processes them;
/// leaving, it hands them back (revoked after its last commit) and the first restores them in turn. The
/// state at the end is the one replay computes, and the two instances never held the same agent. Both
/// project their own partitions' rows into one read model, which serves replay's views throughout.
#[test]
fn instances_share_the_partitions_and_rebalances_restore_them_from_the_changelog() {
    use crate::runtime::PipelineHandle;
    let partitions = 3;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let (mut kafka, _cluster, config) = sharing(partitions, 3_000, directory.path());
    kafka.changelog_every_records = 7;
    let model: std::sync::Arc<dyn crate::scylla::ReadModel> =
        std::sync::Arc::new(crate::scylla::MemoryReadModel::default());
    let start = |transactional_id: &str| start_member(&kafka, &config, transactional_id, Some(model.clone()));
    let inputs = workload_inputs(8, 2);
    let third = inputs.len() / 3;
    let first = start("paisa-stages-a");
    wait_for_assignment(&[&first], partitions);
    assert!(first.ready(), "ready once its first assignment is restored");
    feed(&[&first], &inputs[..third]);

    let second = start("paisa-stages-b");
    assert!(!second.ready(), "not ready before the group assigned it partitions");
    // A merchant key issued through one instance authenticates on the other.
    first.put_merchant_key("feedface", "m0").expect("a key is stored");
    assert_eq!(second.merchant_of_key("feedface").as_deref(), Some("m0"));
    second.refuse_ingestion();
    let refused = second.append(inputs[..1].to_vec()).expect_err("an instance that does not ingest refuses inputs");
    assert!(refused.to_string().contains("--no-ingest"), "{refused}");
    let assignments = wait_for_assignment(&[&first, &second], partitions);
    let (replayed_records, committed_records) = second.taken_over_records();
    assert!(
        replayed_records < committed_records,
        "the partitions came from the changelog: {replayed_records} of {committed_records} records applied again"
    );
    feed(&[&first, &second], &inputs[third..2 * third]);
    // Each instance holds the agents of its own agent partitions, and only those.
    let users = |instance: &crate::embedded::Embedded| -> std::collections::BTreeSet<String> {
        instance.snapshot()["users"].as_object().expect("users").keys().cloned().collect()
    };
    let (users_first, users_second) = (users(&first), users(&second));
    assert!(
        !users_first.is_empty() && !users_second.is_empty(),
        "both instances hold agents: {assignments:?} {users_first:?} {users_second:?}"
    );
    assert!(users_first.is_disjoint(&users_second), "an agent held twice: {users_first:?} {users_second:?}");
    assert_model_serves(model.as_ref(), &comparable(replayed(&inputs[..2 * third])));

    second.stop();
    drop(second);
    wait_for_assignment(&[&first], partitions);
    feed(&[&first], &inputs[2 * third..]);
    let (actual, expected) = (comparable(first.snapshot()), comparable(replayed(&inputs)));
    assert_eq!(actual, expected, "the state after two rebalances is replay's");
    assert_model_serves(model.as_ref(), &expected);
    first.stop();
}

/// The record ids in `log`, with how many times each appears.
fn record_id_counts(store: &KafkaStore, log: &str) -> std::collections::BTreeMap<(pipelines::Text, u64, u32), usize> {
    let mut counts = std::collections::BTreeMap::new();
    for (_, bytes) in read_all(store, log) {
        let id = if log == OUTPUTS_LOG {
            serde_json::from_slice::<OutputRecord>(&bytes).expect("an output").id
        } else {
            serde_json::from_slice::<StageRecord>(&bytes).expect("a stage record").id
        };
        *counts.entry((id.source, id.offset, id.index)).or_insert(0) += 1;
    }
    counts
}

/// A rebalance while the first instance is busy, with brokers answering slowly (each commit takes
/// several 150 ms round trips): its partitions are revoked only after the batches it applied are
/// committed, so the instance taking them over processes no record again and no log holds a record id
/// twice. (A revocation that does not wait would show up here only if the new owner read the offsets
/// before the old owner's commit landed; in two runs with the wait removed it did not, so this checks
/// the outcome, not the race.)
#[test]
fn a_rebalance_in_the_middle_of_processing_repeats_nothing() {
    use crate::runtime::PipelineHandle;
    let partitions = 3;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let (mut kafka, cluster, mut config) = sharing(partitions, 6_000, directory.path());
    kafka.request_timeout_ms = 30_000;
    kafka.changelog_every_records = 11;
    config.batch_records_max = 8;
    let start = |transactional_id: &str| start_member(&kafka, &config, transactional_id, None);
    let slow = |delay_ms: u64| {
        for broker in 1..=MOCK_BROKERS {
            cluster.broker_round_trip_time(broker, std::time::Duration::from_millis(delay_ms)).expect("a broker");
        }
    };
    let inputs = workload_inputs(24, 3);
    let first = start("paisa-stages-a");
    wait_for_assignment(&[&first], partitions);
    first.append(inputs.clone()).expect("appended");
    slow(150);
    let second = start("paisa-stages-b");
    wait_for_assignment(&[&first, &second], partitions);
    slow(0);
    wait_quiescent(&first);
    wait_quiescent(&second);
    let (_, committed) = second.taken_over_records();
    assert!(committed > 0, "the second instance took over partitions with records");
    second.stop();
    first.stop();
    let store = KafkaStore::open(kafka.clone()).expect("the store opens");
    let mut logs: Vec<String> =
        StageKind::ALL.into_iter().flat_map(|kind| (0..partitions).map(move |index| stage_log(kind, index))).collect();
    logs.push(OUTPUTS_LOG.to_string());
    let mut records = 0;
    for log in logs {
        let counts = record_id_counts(&store, &log);
        records += counts.len();
        // Ticks are the exception: an instance that takes a partition over ticks it from the ticks it has
        // applied, and may send one the previous owner sent too (same time, same id: dropped when applied).
        let repeated: Vec<_> =
            counts.iter().filter(|((source, _, _), count)| **count > 1 && source != "ticker").collect();
        assert!(repeated.is_empty(), "{log} holds record ids more than once: {repeated:?}");
    }
    assert!(records > inputs.len(), "the inputs and the messages they caused: {records} records");
}
