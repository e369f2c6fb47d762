//! The run a profile-guided build of the engine learns from (`deploy/pgo`): replays every scenario file
//! given (the golden scenarios: every rule's path, rare ones included), then a generated workload.
//!
//! `cargo run --release -p pipelines --example pgo_train -- AGENTS ROUNDS [SCENARIO.jsonl ...]`
//!
//! Built with `-Cprofile-generate`, it writes the counts that `-Cprofile-use` then optimizes for. The
//! workload should not be the benchmark's own (5,000 × 23): `deploy/pgo` trains on a smaller one, so the
//! benchmark measures how the profile carries over to a run it was not taken from.

#[global_allocator]
static ALLOCATOR: pipelines::allocator::Allocator = pipelines::allocator::Allocator;

use pipelines::{Config, Engine};

fn main() -> std::process::ExitCode {
    pipelines::allocator::configure();
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let (Some(agents), Some(rounds)) = (
        arguments.first().and_then(|argument| argument.parse::<usize>().ok()),
        arguments.get(1).and_then(|argument| argument.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: pgo_train AGENTS ROUNDS [SCENARIO.jsonl ...]");
        return std::process::ExitCode::from(2);
    };
    let mut replayed = 0usize;
    for path in &arguments[2..] {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("{path}: {error}");
                return std::process::ExitCode::FAILURE;
            }
        };
        // Malformed scenarios are part of the golden set (they pin exit 2): their error path is trained too.
        if pipelines::replay::replay_to_json(&text).is_ok() {
            replayed += 1;
        }
    }
    let workload = pipelines::workload::workload(agents, rounds);
    let events = workload.len();
    let scenario = pipelines::replay::Scenario { config: Config::default(), inputs: workload };
    let mut outputs = 0usize;
    let engine: Engine = pipelines::replay::run_streaming(scenario, |taken| outputs += taken.len());
    println!(
        "trained on {replayed} of {} scenario files and a workload of {events} input events ({outputs} outputs, {} provider answers)",
        arguments.len() - 2,
        engine.provider_answers()
    );
    std::process::ExitCode::SUCCESS
}
