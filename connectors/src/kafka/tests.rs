//! The Kafka store against librdkafka's mock cluster (in-process brokers speaking the Kafka protocol):
//! the same contract the embedded store keeps, transactions that abort, and recovery from the topics.

use super::*;
use crate::runtime::{process_batch, stage_log, Appended, Ingested, OutputRecord, RuntimeError, Store, WriteBatch};
use crate::runtime::{KeyValueTable, OUTPUTS_LOG};
use pipelines::input::{parse_line, Parsed};
use pipelines::partition::{route_input, RecordBody, RecordId, Routed, StageKind, StagePartition, StageRecord};
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

fn ingest_one(store: &KafkaStore, event_id: &str, card: Option<(&str, &str)>) -> Result<Vec<Appended>, RuntimeError> {
    store.ingest(&[event_id], &mut |_, position| {
        Ok(Ingested {
            records: vec![("agent-0".to_string(), format!("input {position}").into_bytes())],
            keys: vec![(format!("order:{event_id}"), "m1".to_string())],
            exclusive_keys: card.map(|(card, user)| (format!("card:{card}"), user.to_string())).into_iter().collect(),
        })
    })
}

#[test]
fn a_batch_and_its_offsets_commit_together_and_survive_a_restart() {
    let (config, _cluster) = mock(2);
    let store = KafkaStore::open(config.clone()).expect("the store opens");
    let appends = vec![("agent-1".to_string(), b"one".to_vec()), ("outputs".to_string(), b"two".to_vec())];
    store.commit(WriteBatch { appends, offsets: Vec::new() }).expect("committed");
    assert_eq!(read_all(&store, "agent-1"), vec![(0, b"one".to_vec())]);
    assert_eq!(read_all(&store, OUTPUTS_LOG), vec![(0, b"two".to_vec())]);
    let offsets = vec![("agent-1".to_string(), 1), (crate::runtime::CONNECTOR_CONSUMER.to_string(), 1)];
    store
        .commit(WriteBatch { appends: vec![("merchant-0".to_string(), b"three".to_vec())], offsets })
        .expect("committed");
    store.put(KeyValueTable::Meta, "partitions", "2").expect("put");
    drop(store);
    // A new instance (same transactional id: it fences the old one) reads its offsets from the
    // consumer group and its tables from the state topic.
    let store = KafkaStore::open(config).expect("the store reopens");
    assert_eq!(store.committed("agent-1").expect("an offset"), 1);
    assert_eq!(store.committed(crate::runtime::CONNECTOR_CONSUMER).expect("an offset"), 1);
    assert_eq!(store.committed("agent-0").expect("an offset"), 0, "never committed");
    assert_eq!(read_all(&store, "merchant-0"), vec![(0, b"three".to_vec())]);
    assert_eq!(store.get(KeyValueTable::Meta, "partitions").expect("a get"), Some("2".to_string()));
    assert!(store.read("agent-7", 0, 1).is_err(), "a log beyond the partition count is refused");
}

#[test]
fn ingestion_deduplicates_event_ids_and_guards_cards_across_restarts() {
    let (config, _cluster) = mock(1);
    let store = KafkaStore::open(config.clone()).expect("the store opens");
    let outcomes = store
        .ingest(&["e1", "e2", "e1"], &mut |_, position| {
            Ok(Ingested { records: vec![("agent-0".to_string(), vec![position as u8])], ..Ingested::default() })
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

/// A recharge of an unknown user: the agent stage answers it with one `command_rejected`.
fn rejected_recharge() -> StageRecord {
    let line = r#"{"type":"user_recharge","at":"2026-03-02T09:00:00Z","user_id":"nobody","amount":"5.00","commission":"0.00"}"#;
    let Ok(Parsed::Input(input)) = parse_line(line, || "e1".to_string()) else { panic!("an input") };
    let at = input.at;
    let Routed::Message(message) = route_input(input) else { panic!("routed to a stage") };
    StageRecord {
        id: RecordId { source: "ingest".to_string(), offset: 0, index: 0 },
        at,
        body: RecordBody::Message { message },
    }
}

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
    store.commit(WriteBatch { appends: vec![(log.clone(), record)], offsets: Vec::new() }).expect("appended");
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
    // The store itself stays usable (the transaction was aborted, not left open).
    drop(store);
    let store = KafkaStore::open(config).expect("the store reopens");
    assert_eq!(store.committed(&log).expect("an offset"), 0, "the aborted offset is not in the group");
    let partition = RwLock::new(StagePartition::new(StageKind::Agent, 0, 1, pipelines::Config::default()));
    assert_eq!(process_batch(&store, &partition, 1, 16).expect("processed").consumed, 1);
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
        crate::embedded::Embedded::start_on(config.clone(), Box::new(store)).expect("the pipeline starts")
    };
    let pipeline = start();
    let inputs = scenario_inputs();
    let appended = pipeline.append(inputs.clone()).expect("appended");
    assert!(appended.iter().all(|outcome| matches!(outcome, Appended::New { .. })));
    wait_quiescent(&pipeline);
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
