//! Throughput of the pure engine on a generated workload: thousands of agents, collections and payouts
//! matched through the simulated provider's statements, ERRORED noise and some floods that ban agents.
//!
//! Run: `cargo bench -p pipelines --bench engine` (criterion reports the time per replay of the whole
//! workload and, as throughput, input events per second, twice: with the memory earlier samples freed
//! kept mapped, and with every sample's state in fresh pages). `WORKLOAD_AGENTS` and `WORKLOAD_ROUNDS`
//! resize the workload.

/// The allocator the `paisa` binary uses too, configured as it is (`pipelines::allocator::configure`):
/// glibc's malloc fragments under millions of small, long-lived strings and spends a third of the time
/// in malloc/free.
#[global_allocator]
static ALLOCATOR: pipelines::allocator::Allocator = pipelines::allocator::Allocator;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pipelines::workload::workload;
use pipelines::{Config, Engine, Input};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// Replays the workload, streaming its outputs away as a service does; returns the engine so that
/// criterion drops it outside the timed section (a running engine is never torn down).
fn replay(inputs: Vec<Input>) -> (Engine, usize) {
    let mut outputs = 0;
    let scenario = pipelines::replay::Scenario { config: Config::default(), inputs };
    let engine = pipelines::replay::run_streaming(scenario, |taken| outputs += taken.len());
    (engine, outputs)
}

/// What the workload did, to show it exercises matching, closes and bans (printed once).
fn describe(inputs: Vec<Input>) -> String {
    let engine = pipelines::replay::run(pipelines::replay::Scenario { config: Config::default(), inputs });
    let mut states = std::collections::BTreeMap::new();
    for order in engine.orders.orders.values() {
        *states.entry(format!("{:?} {:?}", order.kind, order.state)).or_insert(0usize) += 1;
    }
    let banned = engine
        .agents
        .agents
        .values()
        .filter(|agent| agent.status == pipelines::stages::agent::state::AgentStatus::Banned)
        .count();
    format!(
        "orders {states:?}, banned agents {banned}, outputs {}, provider answers (crawl_result log events) {}",
        engine.outputs().len(),
        engine.provider_answers()
    )
}

fn bench(criterion: &mut Criterion) {
    // As the `paisa` binary runs it: memory once mapped is kept, with transparent huge pages
    // (`MIMALLOC_ALLOW_THP=0`: without them).
    pipelines::allocator::configure();
    let agents = env_or("WORKLOAD_AGENTS", 5_000);
    let rounds = env_or("WORKLOAD_ROUNDS", 23);
    let inputs = workload(agents, rounds);
    let events = inputs.len();
    eprintln!("workload: {agents} agents, {rounds} rounds, {events} input events");
    eprintln!("{}", describe(inputs.clone()));
    let mut group = criterion.benchmark_group(format!("engine_replay_{events}_events"));
    group.sample_size(10);
    group.throughput(Throughput::Elements(events as u64));
    // Each sample's state reuses the pages the one before freed, as a running engine reuses its own.
    group.bench_function("memory_kept", |bencher| {
        bencher.iter_batched(|| inputs.clone(), replay, BatchSize::LargeInput)
    });
    // Freed memory goes back to the OS at once, so each sample's state grows into fresh pages, each
    // faulted in and zeroed by the kernel, as a new process's state does (and a running engine's,
    // where its state grows past what it ever held).
    pipelines::allocator::set_purge_delay_ms(Some(0));
    group.bench_function("fresh_memory", |bencher| {
        bencher.iter_batched(|| inputs.clone(), replay, BatchSize::LargeInput)
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
