//! Prints the generated workload as JSON lines (SPEC §5 inputs), for load tools.
//! `cargo run --release -p pipelines --example workload_jsonl -- AGENTS ROUNDS > workload.jsonl`
fn main() {
    let arguments: Vec<usize> = std::env::args().skip(1).filter_map(|argument| argument.parse().ok()).collect();
    let (agents, rounds) = (arguments.first().copied().unwrap_or(100), arguments.get(1).copied().unwrap_or(1));
    for input in pipelines::workload::workload(agents, rounds) {
        match serde_json::to_string(&input) {
            Ok(line) => println!("{line}"),
            Err(error) => eprintln!("not serialisable: {error}"),
        }
    }
}
