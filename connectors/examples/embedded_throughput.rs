//! Profiling aid: the embedded runtime alone (no HTTP, no connector) on the generated workload.
//! `cargo run --release -p connectors --example embedded_throughput -- AGENTS ROUNDS`
use connectors::embedded::{Embedded, EmbeddedConfig};
use connectors::runtime::{ClockMode, PipelineHandle};
use std::time::{Duration, Instant};

fn main() {
    let arguments: Vec<usize> = std::env::args().skip(1).filter_map(|argument| argument.parse().ok()).collect();
    let (agents, rounds) = (arguments.first().copied().unwrap_or(2000), arguments.get(1).copied().unwrap_or(5));
    let inputs: Vec<_> = pipelines::workload::workload(agents, rounds)
        .into_iter()
        .filter(|input| !input.command.type_name().starts_with("wallet_"))
        .collect();
    let directory = std::env::temp_dir().join(format!("paisa-throughput-{}", std::process::id()));
    let mut config = EmbeddedConfig::new(directory.clone(), ClockMode::Event);
    if let Some(threads) = std::env::var("THREADS").ok().and_then(|value| value.parse().ok()) {
        config.processing_threads = threads;
    }
    if let Some(batch) = std::env::var("BATCH").ok().and_then(|value| value.parse().ok()) {
        config.batch_records_max = batch;
    }
    let embedded = Embedded::start(config).expect("starts");
    let started = Instant::now();
    for chunk in inputs.chunks(5_000) {
        embedded.append(chunk.to_vec()).expect("appends");
    }
    let appended = started.elapsed();
    while embedded.lag() > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    println!(
        "{} inputs: appended in {:.2} s, processed in {:.2} s → {:.0} inputs/s",
        inputs.len(),
        appended.as_secs_f64(),
        elapsed.as_secs_f64(),
        inputs.len() as f64 / elapsed.as_secs_f64()
    );
    let (mut records, mut bytes) = (0, 0);
    for log in ["order-0", "order-1", "agent-0", "agent-1", "merchant-0", "merchant-1", "outputs"] {
        let head = connectors::runtime::Store::head(embedded.store(), log).unwrap_or(0);
        let log_bytes = log_bytes(&embedded, log, head);
        println!("{log}: {head} records, {log_bytes} bytes");
        records += head;
        bytes += log_bytes;
    }
    println!("{records} records in all ({:.1} per input), {bytes} bytes", records as f64 / inputs.len() as f64);
    embedded.stop();
    let _ = std::fs::remove_dir_all(directory);
}

/// The bytes of `log`'s first `head` records, as stored: what the stages' record format costs.
fn log_bytes(embedded: &Embedded, log: &str, head: u64) -> usize {
    let (mut from, mut bytes) = (0, 0);
    while from < head {
        let records = connectors::runtime::Store::read(embedded.store(), log, from, 10_000).expect("reads");
        let Some((last, _)) = records.last() else { break };
        from = last + 1;
        bytes += records.iter().map(|(_, record)| record.len()).sum::<usize>();
    }
    bytes
}
