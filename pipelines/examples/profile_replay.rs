//! Replays the synthetic workload and prints events/s: a target for `perf record` and callgrind.
//! `cargo run --release -p pipelines --example profile_replay -- AGENTS ROUNDS` (`RUNS=N`: N replays in
//! one process; `STATS=1`: the final state's sizes; `SIZES=1`: record sizes; `TYPES=1`: one more replay
//! timing each input type apart from the timers that fire before it, instead of `STATS`).

#[global_allocator]
static ALLOCATOR: pipelines::allocator::Allocator = pipelines::allocator::Allocator;

use pipelines::{Config, Engine};

fn main() {
    pipelines::allocator::configure();
    let mut args = std::env::args().skip(1).map(|arg| arg.parse::<usize>().unwrap_or(0));
    let agents = args.next().filter(|n| *n > 0).unwrap_or(5_000);
    let rounds = args.next().filter(|n| *n > 0).unwrap_or(20);
    if std::env::var("SIZES").is_ok() {
        sizes();
    }
    let workload = pipelines::workload::workload(agents, rounds);
    let events = workload.len();
    // `RUNS=N` replays it N times in this process: the first on fresh memory, as a new process has it,
    // the next on the memory the allocator kept (`pipelines::allocator::configure`), as a running engine
    // has it.
    let runs = std::env::var("RUNS").ok().and_then(|runs| runs.parse::<usize>().ok()).unwrap_or(1).max(1);
    let mut engine = None;
    for _ in 0..runs {
        drop(engine.take());
        let inputs = workload.clone();
        let started = std::time::Instant::now();
        let replayed = replay(inputs);
        let elapsed = started.elapsed();
        let answers = replayed.provider_answers() as usize;
        println!(
            "{events} input events ({} with the provider's crawl_result answers) in {elapsed:?}: {:.0} inputs/s, {:.0} log events/s",
            events + answers,
            events as f64 / elapsed.as_secs_f64(),
            (events + answers) as f64 / elapsed.as_secs_f64()
        );
        engine = Some(replayed);
    }
    if std::env::var("TYPES").is_ok() {
        // On the memory the last replay frees, as the later replays above run.
        drop(engine.take());
        by_type(workload.clone());
    }
    let Some(engine) = engine else { return };
    if std::env::var("STATS").is_ok() {
        let agents = &engine.agents.agents;
        let cards: Vec<_> = agents.values().flat_map(|agent| agent.cards.values()).collect();
        let live: usize = cards.iter().map(|card| card.live_subs.len()).sum();
        let bill: usize = cards.iter().map(|card| card.bill.len()).sum();
        let subs: usize = agents.values().map(|agent| agent.subs.len()).sum();
        let timeline: usize =
            agents.values().flat_map(|agent| agent.subs.iter()).map(|sub| sub.timeline.entries.len()).sum();
        eprintln!(
            "cards {} live subs {live} bill lines {bill} subs {subs} timeline entries {timeline} timers {}",
            cards.len(),
            engine.timers_pending()
        );
    }
    std::mem::forget(engine);
}

/// Replays `inputs` as the engine benchmark does: outputs streamed away.
fn replay(inputs: Vec<pipelines::Input>) -> Engine {
    pipelines::replay::run_streaming(pipelines::replay::Scenario { config: Config::default(), inputs }, drop)
}

/// Replays `inputs` timing each input apart from the timers due before it, and prints the time by
/// input type. The timers are fired first by advancing the clock to the millisecond before the input:
/// the timers `Engine::apply` fires first (due before the input). They include the simulated
/// provider's answers and the checks they finish. A diagnostic: two clock reads per input add
/// ≈ 50 ns each.
fn by_type(inputs: Vec<pipelines::Input>) {
    let mut engine = Engine::new(Config::default(), Some(pipelines::wallet_sim::WalletSim::default()));
    let mut by_type: std::collections::BTreeMap<&'static str, (u64, std::time::Duration)> = Default::default();
    let started = std::time::Instant::now();
    for (position, input) in inputs.into_iter().enumerate() {
        let timers_started = std::time::Instant::now();
        engine.advance_to(pipelines::Timestamp::from_millis(input.at.millis() - 1));
        let timers = by_type.entry("(timers due before an input)").or_default();
        timers.0 += 1;
        timers.1 += timers_started.elapsed();
        let name = input.command.type_name();
        let input_started = std::time::Instant::now();
        engine.apply(input);
        let entry = by_type.entry(name).or_default();
        entry.0 += 1;
        entry.1 += input_started.elapsed();
        if position % 4096 == 0 {
            drop(engine.take_outputs()); // streamed away, as the benchmark does
        }
    }
    let total = started.elapsed();
    for (name, (count, time)) in &by_type {
        println!(
            "{name:30} {count:>9} {:>9.1} ms {:>6.0} ns each {:>5.1} %",
            time.as_secs_f64() * 1e3,
            time.as_nanos() as f64 / *count as f64,
            100.0 * time.as_secs_f64() / total.as_secs_f64()
        );
    }
    println!("total {total:?}");
}

#[allow(dead_code)]
fn sizes() {
    use pipelines::stages::agent::state::*;
    eprintln!("SubOrder {} BillLine {} Line {} TimelineEntry {} JournalEntry {} Hold {} MainOrder {} StatementLine {} Command {} Timer {} Output {}",
        std::mem::size_of::<SubOrder>(), std::mem::size_of::<BillLine>(), std::mem::size_of::<Line>(), std::mem::size_of::<TimelineEntry>(),
        std::mem::size_of::<JournalEntry>(), std::mem::size_of::<Hold>(), std::mem::size_of::<pipelines::stages::order::MainOrder>(),
        std::mem::size_of::<pipelines::input::StatementLine>(), std::mem::size_of::<pipelines::input::Command>(), std::mem::size_of::<pipelines::stages::Timer>(), std::mem::size_of::<pipelines::output::Output>());
}
