//! How fast the stage records of the embedded runtime's logs read back (JSON, `serde_json`), through
//! `pipelines::decode::from_json_bytes` (the bytes checked as UTF-8 at once, then read as text) and
//! through `serde_json::from_slice` (each string checked as it is read).
//!
//! Runs a generated workload (`AGENTS ROUNDS`, default 500 × 4) through one partition of each stage,
//! keeping every record a partition consumes (inputs and the messages between stages) as the runtime
//! encodes it, then times decoding them all, and decoding a `crawl_result` record with a 28-line page
//! (the typical page of the benchmarks). Then the workload's inputs as bulk request bodies of 1,000
//! events, read both ways the services read them: into JSON values, then each input from its object
//! (the slow path, which names a faulty field), and straight into inputs (`pipelines::envelope`).
//! `cargo run --release -p pipelines --example record_decoding`.

use pipelines::partition::{destination, route_input, Produced, RecordBody, RecordId, Routed, StageKind};
use pipelines::partition::{StagePartition, StageRecord};
use std::collections::VecDeque;
use std::time::Instant;

const LINE: &str = r#"{"txn_id":"T000123456","utr":"412345678901","utr_supported":true,"direction":"in","amount":"1234.00","status":"success","time":"2026-03-02T10:11:12Z","counterparty":{"name":"Some Payer","vpa":"payer@ybl","account_last4":"1234"}}"#;

fn argument(index: usize, default: usize) -> usize {
    std::env::args().nth(index).and_then(|argument| argument.parse().ok()).unwrap_or(default)
}

/// Every record the stage partitions consume for the workload, encoded.
fn records(agents: usize, rounds: usize) -> Vec<Vec<u8>> {
    let config = pipelines::Config::default();
    let mut partitions: Vec<StagePartition> =
        StageKind::ALL.iter().map(|kind| StagePartition::new(*kind, 0, 1, config.clone())).collect();
    let slot = |kind: StageKind| StageKind::ALL.iter().position(|known| *known == kind).expect("a stage");
    let mut encoded = Vec::new();
    for (position, input) in pipelines::workload::workload(agents, rounds).into_iter().enumerate() {
        let at = input.at;
        let Routed::Message(message) = route_input(input) else { continue };
        let id = |source: &str, index: u32| RecordId { source: source.into(), offset: position as u64, index };
        let mut queue =
            VecDeque::from([StageRecord { id: id("ingest", 0), at, body: RecordBody::Message { message } }]);
        let mut index = 0;
        while let Some(record) = queue.pop_front() {
            encoded.push(serde_json::to_vec(&record).expect("encodes"));
            let RecordBody::Message { message } = &record.body else { continue };
            let kind = destination(message).0;
            let mut produced = Produced::default();
            partitions[slot(kind)].apply(record, &mut produced);
            for (at, message) in produced.messages.drain(..) {
                index += 1;
                queue.push_back(StageRecord { id: id(kind.name(), index), at, body: RecordBody::Message { message } });
            }
        }
    }
    encoded
}

/// Microseconds per event of reading `bodies` (bulk requests of the workload's inputs) both ways: into
/// JSON values and then each input from its object, and straight into envelopes.
fn time_bodies(bodies: &[String], events: usize) -> (f64, f64) {
    let started = Instant::now();
    let mut read = 0;
    for body in bodies {
        let serde_json::Value::Array(items) = serde_json::from_str(body).expect("JSON") else { panic!("an array") };
        for item in items {
            let serde_json::Value::Object(mut object) = item else { panic!("an object") };
            std::hint::black_box(pipelines::input::parse_input_object(&mut object, String::new).expect("an input"));
            read += 1;
        }
    }
    let slow = started.elapsed().as_secs_f64() * 1e6 / read as f64;
    let started = Instant::now();
    let read: usize = bodies
        .iter()
        .map(|body| {
            std::hint::black_box(pipelines::envelope::read_envelopes(body.as_bytes(), 1_000).expect("read")).len()
        })
        .sum();
    assert_eq!(read, events, "every input read");
    (slow, started.elapsed().as_secs_f64() * 1e6 / read as f64)
}

/// Microseconds per record of reading `records` with `read`, and per read of the `crawl` record.
fn time_records(records: &[Vec<u8>], crawl: &[u8], read: impl Fn(&[u8]) -> bool) -> (f64, f64) {
    let started = Instant::now();
    let decoded = records.iter().filter(|record| read(record)).count();
    let per_record = started.elapsed().as_secs_f64() * 1e6 / decoded as f64;
    assert_eq!(decoded, records.len(), "every record reads back");
    let started = Instant::now();
    let pages = 2_000;
    for _ in 0..pages {
        assert!(read(std::hint::black_box(crawl)), "the crawl record reads back");
    }
    (per_record, started.elapsed().as_secs_f64() * 1e6 / pages as f64)
}

fn main() {
    let (agents, rounds) = (argument(1, 500), argument(2, 4));
    let records = records(agents, rounds);
    let bytes: usize = records.iter().map(Vec::len).sum();
    println!("{agents} agents × {rounds} rounds: {} stage records, {bytes} bytes", records.len());
    let lines = vec![LINE; 28].join(",");
    let crawl = format!(
        r#"["outputs",5,0,1772446272000,{{"Agent":{{"user_id":"u1","body":{{"Input":{{"event_id":"crawl:r1","command":{{"type":"crawl_result","request_id":"r1","user_id":"u1","card_id":"c1","ok":true,"error":null,"lines":[{lines}],"next_from":null}}}}}}}}}}]"#
    );
    for _ in 0..3 {
        let (per_record, per_page) =
            time_records(&records, crawl.as_bytes(), |bytes| serde_json::from_slice::<StageRecord>(bytes).is_ok());
        let (per_record_text, per_page_text) = time_records(&records, crawl.as_bytes(), |bytes| {
            pipelines::decode::from_json_bytes::<StageRecord>(bytes).is_ok()
        });
        println!(
            "{per_record_text:.2} µs per stage record, {per_page_text:.1} µs per crawl_result record of 28 lines \
             (from_json_bytes); {per_record:.2} and {per_page:.1} µs (serde_json::from_slice)"
        );
    }
    let inputs = pipelines::workload::workload(agents, rounds);
    let texts: Vec<String> = inputs.iter().map(|input| serde_json::to_string(input).expect("JSON")).collect();
    let bodies: Vec<String> = texts.chunks(1_000).map(|chunk| format!("[{}]", chunk.join(","))).collect();
    for _ in 0..3 {
        let (slow, fast) = time_bodies(&bodies, texts.len());
        println!(
            "{} inputs in bodies of 1,000: {slow:.2} µs per input through JSON values, {fast:.2} µs straight \
             ({:.2} times)",
            texts.len(),
            slow / fast
        );
    }
}
