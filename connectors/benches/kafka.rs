//! Throughput of one pipeline instance on Kafka (librdkafka's mock cluster, in this process), with each
//! commit a Kafka transaction and without transactions (produce, flush, then commit offsets).
//!
//! Run: `cargo bench -p connectors --bench kafka` (`WORKLOAD_AGENTS`, `WORKLOAD_ROUNDS`, `PARTITIONS`
//! resize it). Prints inputs/s from the first append until every log is consumed; the inputs are the
//! generated workload's non-wallet events (no statement provider attached: crawl requests go unanswered).

use connectors::embedded::{Embedded, EmbeddedConfig};
use connectors::kafka::{start_mock_cluster, KafkaConfig, KafkaStore};
use connectors::runtime::{ClockMode, PipelineHandle};
use std::time::{Duration, Instant};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// Appends in bulks of 1,000 and waits for the lag to reach 0; returns (inputs, seconds).
fn run(transactions: bool, inputs: &[pipelines::Input], partitions: u32) -> (usize, f64) {
    let mut kafka = KafkaConfig::new("", partitions);
    kafka.transactions = transactions;
    let _cluster = start_mock_cluster(&mut kafka).expect("the mock cluster starts");
    let directory = tempfile::tempdir().expect("a temporary directory");
    let mut config = EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
    config.partitions = partitions;
    let store = KafkaStore::open(kafka).expect("the store opens");
    let pipeline = Embedded::start_on(config, Box::new(store), None).expect("the pipeline starts");
    let started = Instant::now();
    for bulk in inputs.chunks(1_000) {
        pipeline.append(bulk.to_vec()).expect("appended");
    }
    while pipeline.lag() > 0 {
        if let Some(failure) = pipeline.failure() {
            panic!("the pipeline stopped: {failure}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = started.elapsed().as_secs_f64();
    pipeline.stop();
    (inputs.len(), seconds)
}

fn main() {
    if std::env::args().any(|argument| argument == "--list") {
        return; // `cargo bench --no-run` / test harness probes
    }
    let agents = env_or("WORKLOAD_AGENTS", 2_000);
    let rounds = env_or("WORKLOAD_ROUNDS", 2);
    let partitions = env_or("PARTITIONS", 2) as u32;
    let inputs: Vec<_> = pipelines::workload::workload(agents, rounds)
        .into_iter()
        .filter(|input| !input.command.type_name().starts_with("wallet_"))
        .collect();
    println!("{agents} agents × {rounds} rounds: {} inputs, {partitions} partitions per stage", inputs.len());
    for transactions in [true, false] {
        let (count, seconds) = run(transactions, &inputs, partitions);
        let label = if transactions { "transactions on " } else { "transactions off" };
        println!("{label}: {count} inputs in {seconds:.2} s → {:.0} inputs/s", count as f64 / seconds);
    }
}
