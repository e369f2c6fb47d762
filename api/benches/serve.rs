//! Throughput of `paisa serve` on the embedded store, and the order endpoint's read latency under load.
//!
//! Starts `paisa wallet-sim` and `paisa serve` (event clock, 2 partitions per stage by default) as real processes
//! on loopback, posts a generated workload (`pipelines::workload`) through `POST /v1/events` in bulk
//! requests (its wallet events go to the simulator before each phase: [`statements_first`]), and
//! measures the time until every log is consumed (`GET /v1/admin/lag` = 0). Then it reads
//! `GET /v1/orders/{id}` from concurrent clients while more events are being posted, and prints the
//! latency percentiles its clients measured, then those the service measured itself (the histogram of
//! `GET /metrics`, from routing to the response's head: the difference is the clients' and the
//! service's wait for a core).
//!
//! Sizes: `BENCH_AGENTS` (default 2000) × `BENCH_ROUNDS` (default 5); readers: `BENCH_READERS`
//! (default 4); read phase: `BENCH_READ_SECONDS` (default 5); `BENCH_TRACE=1` prints the lag while the
//! pipeline drains; `BENCH_PACED=1` posts each bulk request only once the previous one is
//! processed (event time then moves in steps of one bulk, see `docs/PERFORMANCE.md`); `BENCH_SERVE_CONFIG=FILE`
//! passes `--config FILE` (SPEC §8 settings) to `paisa serve`; `BENCH_PARTITIONS=N` runs it with `N`
//! partitions per stage (default 2); `BENCH_PAISA=PATH` runs that `paisa` binary instead of this
//! build's (e.g. `target/pgo/release/paisa` from `deploy/pgo build`); `BENCH_WARMUP_ROUNDS=N` first
//! posts `N` earlier rounds of the same agents, untimed, and waits until they are processed, so that the
//! timed phase measures a running service (its state and memory already grown) instead of a fresh one;
//! `BENCH_CLIENT=reqwest` sends the timed phases' requests (the bulk posts, the lag polls, the order
//! reads and the one-event posts) with reqwest's blocking client, as the rounds before the twenty-ninth
//! did for all of them and those up to the fifty-fifth for the bulk posts and lag polls (default `ureq`,
//! see [`Requests`]);
//! `BENCH_PREFAULT_MIB=N` starts `paisa serve` with `--memory-prefault-mib N` (see [`PREFAULT_MIB`]),
//! `BENCH_SIM_PREFAULT_MIB=N` `paisa wallet-sim` (see [`SIM_PREFAULT_MIB`]);
//! `BENCH_BULK_INPUTS=N` posts chunks of `N` inputs instead of 1,000 (see [`BULK_INPUTS`]);
//! `BENCH_SIM_THREADS=N` gives the simulator `N` async worker threads instead of 1 (see [`SIM_THREADS`]);
//! `BENCH_STATEMENTS_DURING=1` posts each phase's wallet events to the simulator during the phase,
//! beside the service's events, instead of before it (see [`statements_first`]);
//! `BENCH_DUMP=DIRECTORY` writes the service's final SPEC §9 document (`service.json`) and every input
//! (`inputs.jsonl`, for `paisa replay`) there.
//!
//! Last, once the outputs are compared, `BENCH_POSTERS` clients (default 16) each post
//! `BENCH_POSTS_PER_CLIENT` (default 250) events one per request, at the same time, as merchants and
//! agents do: the events/s and latency of concurrent small requests, whose commits the service shares
//! (`user_registered` of new agents, so that no order of arrival changes what they mean).
//!
//! It also prints how long the posting requests took, to the simulator and to the service (two threads,
//! one request in flight each; `BENCH_SERIAL=1` posts both streams from one thread, one request at a
//! time, as the rounds up to the thirty-ninth did: see [`post_all`]), the CPU time each process spent
//! in the throughput phase (and per event posted, beside the 20 µs per event that 2 cores allow at the
//! target's 100,000 events/s, and the events/s the service's alone would fit: [`cpu_per_event`]; as
//! shares of the 2 cores' time, with the share none of them used: [`share_of_cores`]) and the service's
//! by thread name (Linux: `/proc`), and the service's outputs by type (rejections by reason, callbacks
//! by order kind and status) beside those of `paisa replay` of the same events (computed in-process):
//! with the event clock and bulk posting, one stage's partitions run ahead of another's results (SPEC
//! §3 gives parity only for spaced inputs), so the service does more crawls than replay and decides
//! some orders otherwise (see `docs/PERFORMANCE.md`).

use pipelines::input::Command;
use pipelines::Input;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ADMIN_KEY: &str = "bench-admin-key";
/// Inputs per bulk request unless `BENCH_BULK_INPUTS` says otherwise (the API accepts up to 10,000;
/// bodies above ~512 KiB cost the allocator a fresh mapping each, so 1,000 measured faster than 5,000).
/// Since the forty-first round 2,000 measures faster (fewer commit waits), but the service then runs
/// further ahead of replay (`docs/PERFORMANCE.md`), so the default stays.
const BULK_INPUTS: usize = 1_000;
/// MiB of memory `paisa serve` faults in at start unless `BENCH_PREFAULT_MIB` says otherwise: more than
/// the service grows by in the timed phase (≈ 250 MB resident on 2,000 × 5), so the phase measures a
/// service whose memory is mapped, as a long-running one's is, instead of one paying a first-touch
/// fault per page (`docs/DECISIONS.md`, "A service can fault its memory in at start").
const PREFAULT_MIB: usize = 768;
/// MiB of memory `paisa wallet-sim` faults in at start unless `BENCH_SIM_PREFAULT_MIB` says otherwise:
/// more than the simulator holds at the end (≈ 35 MB resident on 2,000 × 5). It stands for a provider
/// on other machines, so the pages its statement lines grow into should not cost the shared 2 cores
/// ≈ 5,000 first-touch faults in the phase (`docs/PERFORMANCE.md`, forty-seventh round).
const SIM_PREFAULT_MIB: usize = 64;
/// Async worker threads of the simulated provider unless `BENCH_SIM_THREADS` says otherwise (tokio
/// reads `TOKIO_WORKER_THREADS`; by default it starts one per core). The simulator stands for a provider
/// that runs on other machines; here it shares the service's 2 cores, and one worker answers its
/// ≈ 17,000 calls/s with less CPU than two, since its connections' wakeups stay on one thread
/// (`docs/PERFORMANCE.md`, forty-fifth round).
const SIM_THREADS: usize = 1;
/// The issue's throughput target: with [`CORES`], the CPU budget per event printed ([`cpu_per_event`]).
const TARGET_EVENTS_PER_SECOND: f64 = 100_000.0;
/// The cores the target is set for (the issue's 2), not those of the machine the benchmark runs on.
const CORES: f64 = 2.0;

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `paisa` binary the benchmark runs: `BENCH_PAISA`, or this build's.
fn paisa_binary() -> String {
    std::env::var("BENCH_PAISA").unwrap_or_else(|_| env!("CARGO_BIN_EXE_paisa").to_string())
}

fn start(args: &[&str], environment: &[(&str, &str)]) -> Server {
    let mut child = Process::new(paisa_binary())
        .args(args)
        .envs(environment.iter().copied())
        .env("PAISA_ADMIN_KEY", ADMIN_KEY)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("paisa starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).expect("an address line");
    let base = line.trim().rsplit(' ').next().expect("an address").to_string();
    Server { child, base }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().expect("a client")
}

fn is_wallet(input: &Input) -> bool {
    matches!(input.command, Command::WalletLine(_) | Command::WalletLineStatus(_) | Command::WalletFault(_))
}

/// Whether a phase's wallet events reach the simulator before the phase (the default) or during it,
/// beside the service's events (`BENCH_STATEMENTS_DURING=1`, as every round up to the fifty-seventh
/// measured). They are the outside world's work — agents paying through their wallets, kept by a
/// provider on other machines — not the service's. The simulator answers every call as of its event
/// time (`paisa-as-of`), so lines and changes it holds from later are not shown early: each answer is
/// what a provider holding only the events stamped by then would give. Posted during the phase, an
/// answer could show less, when the simulator's own clock trailed the call's time (`docs/DECISIONS.md`,
/// "The serve benchmark's statements reach the simulator before each phase").
fn statements_first() -> bool {
    std::env::var("BENCH_STATEMENTS_DURING").is_err()
}

/// Posts a phase's wallet events to the simulator ahead of the phase, when they go first
/// ([`statements_first`]; otherwise [`post_all`] posts them in the phase), in chunks of the bulk size,
/// and says how many and how long (outside every timed phase).
fn post_statements_ahead(endpoints: &Endpoints, inputs: &[Input]) {
    if !statements_first() {
        return;
    }
    let started = Instant::now();
    let wallet: Vec<&Input> = inputs.iter().filter(|input| is_wallet(input)).collect();
    for chunk in wallet.chunks(bulk_inputs()) {
        if let Some(body) = body_of(chunk) {
            endpoints.post_wallet_lines(body);
        }
    }
    println!(
        "statements at the provider before the phase: {} wallet events in {:.2} s (untimed)",
        wallet.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Posts inputs in chunks of [`BULK_INPUTS`]: each chunk's events to the service in one request, and,
/// unless they reached the simulator before the phase ([`statements_first`]), its wallet events to the
/// simulator in another. By default two threads post the two streams at once, each in order, and the
/// service's request for a chunk is sent only once the simulator has answered the same chunk's
/// request, so every line the scenario puts before an event is at the provider before the service can
/// ask for it (the simulator answers as of the crawl's event time, so the later lines it may already
/// hold are not shown early). The requests are those of one thread posting both in one sequence
/// (`BENCH_SERIAL=1`; `BENCH_PACED=1` posts that way too), which every round up to the thirty-ninth
/// measured: there the simulator's requests — the outside world's statement lines, not the service's
/// work — counted against the service's throughput while the service waited for its next request.
fn post_all(endpoints: &Endpoints, inputs: &[Input]) -> usize {
    let statements_posted = statements_first();
    // Each chunk split once into (wallet events still to post, the service's events).
    let chunks: Vec<(Vec<&Input>, Vec<&Input>)> = inputs
        .chunks(bulk_inputs())
        .map(|chunk| {
            chunk.iter().filter(|input| !statements_posted || !is_wallet(input)).partition(|input| is_wallet(input))
        })
        .collect();
    let serial = std::env::var("BENCH_SERIAL").is_ok() || std::env::var("BENCH_PACED").is_ok();
    let posting = if serial { endpoints.post_serially(&chunks) } else { endpoints.post_at_once(&chunks) };
    println!(
        "posting ({}): {:.2} s in the simulator's requests, {:.2} s in the service's",
        match (statements_posted, serial) {
            (true, _) => "the service's events; the statements were at the provider before",
            (false, true) => "one sequence",
            (false, false) => "two streams at once",
        },
        posting.sim_time.as_secs_f64(),
        posting.serve_time.as_secs_f64()
    );
    chunks.iter().map(|(_, events)| events.len()).sum()
}

/// Inputs per bulk request: `BENCH_BULK_INPUTS`, else [`BULK_INPUTS`] (at least 1).
fn bulk_inputs() -> usize {
    env_usize("BENCH_BULK_INPUTS", BULK_INPUTS).max(1)
}

/// What posting took: the time in each process's requests.
struct Posting {
    sim_time: Duration,
    serve_time: Duration,
}

/// Where posting sends its requests: the simulator's wallet lines and the service's events.
struct Endpoints<'a> {
    requests: &'a Requests,
    serve: &'a str,
    wallet_sim: &'a str,
}

impl Endpoints<'_> {
    /// Posts the two streams from two threads; the service's request for a chunk waits until the
    /// simulator has answered that chunk's (see [`post_all`]). Each stream's bodies are encoded one
    /// ahead ([`encode_ahead`]). Without wallet events (posted ahead: [`statements_first`]) only the
    /// service's stream runs.
    fn post_at_once(&self, chunks: &[(Vec<&Input>, Vec<&Input>)]) -> Posting {
        // The simulator's thread sends the number of chunks it has answered after each; at most one
        // message per chunk, so the channel never blocks it. When that thread ends — done, or panicking
        // on a failed request — the channel disconnects and the service's thread stops waiting; the
        // scope's join then reports the panic.
        // With the statements posted ahead there is no simulator stream: its sender is dropped unused,
        // so the service's thread never waits.
        let (answered_sender, answered) = std::sync::mpsc::sync_channel::<usize>(chunks.len().max(1));
        let has_statements = chunks.iter().any(|(wallet, _)| !wallet.is_empty());
        std::thread::scope(|scope| {
            let service_bodies = encode_ahead(scope, chunks.iter().map(|(_, events)| events.as_slice()));
            let simulator = has_statements.then(|| {
                let wallet_bodies = encode_ahead(scope, chunks.iter().map(|(wallet, _)| wallet.as_slice()));
                scope.spawn(move || {
                    let mut sim_time = Duration::ZERO;
                    for (chunk_number, body) in wallet_bodies.iter().enumerate() {
                        if let Some(body) = body {
                            sim_time += self.post_wallet_lines(body);
                        }
                        let _ = answered_sender.send(chunk_number + 1);
                    }
                    sim_time
                })
            });
            let (mut serve_time, mut chunks_answered) = (Duration::ZERO, 0);
            for (chunk_number, body) in service_bodies.iter().enumerate() {
                let Some(body) = body else { continue };
                while chunks_answered <= chunk_number {
                    chunks_answered = answered.recv().unwrap_or(usize::MAX);
                }
                serve_time += self.post_events(body);
            }
            let sim_time = simulator.map_or(Duration::ZERO, |poster| poster.join().expect("the simulator's poster"));
            Posting { sim_time, serve_time }
        })
    }

    /// Posts inputs in one sequence, one request in flight, each body encoded in turn: each chunk's
    /// wallet events to the simulator, then its other events to the service (with `BENCH_PACED`, once
    /// the service has processed the last).
    fn post_serially(&self, chunks: &[(Vec<&Input>, Vec<&Input>)]) -> Posting {
        let paced = std::env::var("BENCH_PACED").is_ok();
        let mut posting = Posting { sim_time: Duration::ZERO, serve_time: Duration::ZERO };
        for (wallet, events) in chunks {
            if let Some(body) = body_of(wallet) {
                posting.sim_time += self.post_wallet_lines(body);
            }
            if let Some(body) = body_of(events) {
                posting.serve_time += self.post_events(body);
                if paced {
                    wait_quiescent(self.requests, self.serve);
                }
            }
        }
        posting
    }

    /// Posts wallet lines to the simulator; how long the request took.
    fn post_wallet_lines(&self, body: Vec<u8>) -> Duration {
        self.requests.post_bulk(&format!("{}/sim/v1/events", self.wallet_sim), body, "wallet events")
    }

    /// Posts events to the service; how long the request took.
    fn post_events(&self, body: Vec<u8>) -> Duration {
        self.requests.post_bulk(&format!("{}/v1/events", self.serve), body, "events")
    }
}

/// A chunk's request body: its inputs as a JSON array, None for an empty chunk (no request).
fn body_of(chunk: &[&Input]) -> Option<Vec<u8>> {
    (!chunk.is_empty()).then(|| serde_json::to_vec(chunk).expect("JSON"))
}

/// Request bodies encoded one ahead of the poster, on a thread of their own ([`body_of`]): the client
/// encodes the next body while its last request is in flight, as a client with its batch ready would,
/// instead of between the service's answer and its next request. The encoding stays in the timed phase
/// and on the same cores; only its place on the posting path changes.
fn encode_ahead<'scope, 'chunks: 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    chunks: impl Iterator<Item = &'chunks [&'chunks Input]> + Send + 'scope,
) -> std::sync::mpsc::Receiver<Option<Vec<u8>>> {
    let (bodies, encoded) = std::sync::mpsc::sync_channel(1);
    scope.spawn(move || {
        for chunk in chunks {
            if bodies.send(body_of(chunk)).is_err() {
                return; // the poster stopped (a failed request): its panic is reported by the scope
            }
        }
    });
    encoded
}

fn lag(requests: &Requests, serve: &str) -> u64 {
    let answer: Value = serde_json::from_str(&requests.get(&format!("{serve}/v1/admin/lag"))).expect("JSON");
    answer["lag"].as_u64().expect("a number")
}

/// `--memory-prefault-mib N` for `process`, N from `variable` (else `default_mib`), printed. None when N
/// is 0, so that binaries from before the flag still run with the variable at 0.
fn prefault_arguments(process: &str, variable: &str, default_mib: usize) -> Vec<String> {
    let mib = env_usize(variable, default_mib);
    println!("{process}'s memory faulted in at start (--memory-prefault-mib): {mib} MiB");
    if mib == 0 {
        return Vec::new();
    }
    vec!["--memory-prefault-mib".to_string(), mib.to_string()]
}

/// How often [`wait_quiescent`] asks the lag: the phase ends up to this long after the pipeline drained
/// (half of it on average), so it is short beside the ≈ 0.5 s phase; each ask is a store read in the
/// service, so not much shorter. Until the forty-seventh round 20 ms: ≈ 2 % of the phase on average.
const QUIESCENT_POLL_MS: u64 = 5;

fn wait_quiescent(requests: &Requests, serve: &str) {
    let trace = std::env::var("BENCH_TRACE").is_ok();
    let started = Instant::now();
    loop {
        let lag = lag(requests, serve);
        if trace {
            println!("  {:>6.2} s: lag {lag}", started.elapsed().as_secs_f64());
        }
        if lag == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(if trace { 200 } else { QUIESCENT_POLL_MS }));
    }
}

/// A task's name and the CPU seconds (user + system) it has used so far, from its `/proc/…/stat` text.
fn name_and_cpu_seconds(stat: &str) -> Option<(String, f64)> {
    // The name may hold spaces and parentheses: it runs from the first `(` to the last `)`, and the
    // fields after it start past the space that follows.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let name = stat.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some((name, ticks / 100.0)) // USER_HZ is 100 on Linux
}

/// CPU seconds (user + system) a process has used so far, from `/proc/PID/stat` (None elsewhere).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    name_and_cpu_seconds(&stat).map(|(_, seconds)| seconds)
}

/// Each thread of a process by id, with its name and the CPU seconds it has used so far
/// (`/proc/PID/task`; None elsewhere).
fn cpu_by_thread(pid: u32) -> Option<std::collections::BTreeMap<String, (String, f64)>> {
    let mut threads = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // A thread that ended since the directory was listed has no stat any more: it is skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        if let Some(name_and_seconds) = name_and_cpu_seconds(&stat) {
            threads.insert(task.file_name().to_string_lossy().into_owned(), name_and_seconds);
        }
    }
    Some(threads)
}

/// The CPU seconds the threads of each name used between two readings, largest first: which part of
/// the service spends its CPU (the API's and the connector's async workers, the stage workers, the
/// committer). A thread is matched by id, so one that ended in between is left out (the parts may add up
/// to less than the process's figure) and one that started counts whole.
fn cpu_by_thread_name_between(
    before: &std::collections::BTreeMap<String, (String, f64)>,
    after: &std::collections::BTreeMap<String, (String, f64)>,
) -> String {
    let mut by_name: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
    for (thread_id, (name, seconds)) in after {
        let earlier = before.get(thread_id).map_or(0.0, |(_, seconds)| *seconds);
        *by_name.entry(name).or_insert(0.0) += seconds - earlier;
    }
    let mut spent: Vec<(&str, f64)> = by_name.into_iter().filter(|(_, seconds)| *seconds > 0.0).collect();
    spent.sort_by(|left, right| right.1.total_cmp(&left.1));
    let parts: Vec<String> = spent.iter().map(|(name, seconds)| format!("{name} {seconds:.2} s")).collect();
    parts.join(", ")
}

/// The processes whose CPU time [`cpu_of`] reads, in its order.
const PROCESSES: [&str; 3] = ["serve", "wallet-sim", "bench client"];

/// CPU seconds of the service, the simulator and this client (the readers are not running yet).
fn cpu_of(serve: &Server, wallet_sim: &Server) -> [Option<f64>; 3] {
    [cpu_seconds(serve.child.id()), cpu_seconds(wallet_sim.child.id()), cpu_seconds(std::process::id())]
}

/// The phase's CPU time per event posted, the service's and that of the three processes together,
/// beside what the cores allow per event at the target rate: the three share the cores, so whenever
/// their sum is above the allowance the target cannot be reached however the work is scheduled. Also
/// the events/s the service's CPU per event would fit if the cores were its alone, a figure for
/// comparison only: the throughput claimed is the sustained one, with the simulator and the client on
/// the same cores (`docs/PERFORMANCE.md`, sixty-third round).
fn cpu_per_event(spent: &[Option<f64>; 3], posted: usize) -> Option<String> {
    if posted == 0 {
        return None;
    }
    let per_event_us = |seconds: f64| seconds * 1e6 / posted as f64;
    let serve = per_event_us(spent[0]?);
    let all = per_event_us(spent.iter().copied().sum::<Option<f64>>()?);
    let allowed = CORES * 1e6 / TARGET_EVENTS_PER_SECOND;
    let serve_alone = if serve > 0.0 {
        format!("; serve's CPU per event alone would fit {:.0} events/s", CORES * 1e6 / serve)
    } else {
        String::new()
    };
    Some(format!(
        "CPU per event: serve {serve:.1} µs, the three processes {all:.1} µs (at {TARGET_EVENTS_PER_SECOND:.0} \
         events/s the {CORES:.0} cores allow {allowed:.1} µs){serve_alone}"
    ))
}

/// The [`CORES`]' time in the phase split between the three processes and what none of them used
/// (idle, or other processes): where the gap between the service's own CPU per event and the
/// events/s the phase measured goes (`docs/PERFORMANCE.md`, sixty-third round).
fn share_of_cores(spent: &[Option<f64>; 3], elapsed_seconds: f64) -> Option<String> {
    let cores_seconds = CORES * elapsed_seconds;
    if cores_seconds <= 0.0 {
        return None;
    }
    let [serve, wallet_sim, client] = *spent;
    let seconds = [serve?, wallet_sim?, client?];
    let percent = |value: f64| 100.0 * value / cores_seconds;
    let shares: Vec<String> =
        PROCESSES.iter().zip(seconds).map(|(name, used)| format!("{name} {:.0} %", percent(used))).collect();
    let unused = (cores_seconds - seconds.iter().sum::<f64>()).max(0.0);
    Some(format!(
        "  the {CORES:.0} cores' time in that phase: {}, none of them (idle or other processes) {:.0} %",
        shares.join(", "),
        percent(unused)
    ))
}

/// Outputs by type in a SPEC §9 document's `outputs`.
fn outputs_by_type(outputs: &[Value]) -> std::collections::BTreeMap<String, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for output in outputs {
        let kind = output["type"].as_str().unwrap_or("?");
        // Rejections by reason and callbacks by order kind and status: where a service that runs ahead
        // of its answers differs from replay.
        let key = match (output["reason"].as_str(), output["kind"].as_str(), output["status"].as_str()) {
            (Some(reason), _, _) if kind == "command_rejected" => format!("{kind}:{reason}"),
            (_, Some(order_kind), Some(status)) if kind == "merchant_callback" => {
                format!("{kind}:{order_kind}:{status}")
            }
            _ => kind.to_string(),
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// The outputs of `paisa replay` of `inputs` (the engine and the simulated provider, in-process).
fn replay_outputs(inputs: &[Input]) -> std::collections::BTreeMap<String, u64> {
    let scenario = pipelines::replay::Scenario { config: pipelines::Config::default(), inputs: inputs.to_vec() };
    let engine = pipelines::replay::run(scenario);
    let outputs: Vec<Value> =
        engine.outputs().iter().map(|output| serde_json::to_value(output).expect("JSON")).collect();
    outputs_by_type(&outputs)
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn main() {
    if std::env::args().any(|argument| argument == "--list") {
        return; // `cargo bench -- --list` and test discovery
    }
    let agents = env_usize("BENCH_AGENTS", 2000);
    let rounds = env_usize("BENCH_ROUNDS", 5);
    let readers = env_usize("BENCH_READERS", 4);
    let read_seconds = env_usize("BENCH_READ_SECONDS", 5) as u64;
    let warmup_rounds = env_usize("BENCH_WARMUP_ROUNDS", 0);
    let inputs = pipelines::workload::workload(agents, warmup_rounds + rounds);
    // The workload is in time order, round after round: the warm-up is its first rounds' share.
    let (warmup, timed) = inputs.split_at(inputs.len() * warmup_rounds / (warmup_rounds + rounds).max(1));
    // The last fifth is posted during the read phase, as concurrent write load.
    let split = timed.len() * 4 / 5;
    let (first, rest) = timed.split_at(split);
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    println!("paisa binary: {}", paisa_binary());
    let serve_prefault = prefault_arguments("serve", "BENCH_PREFAULT_MIB", PREFAULT_MIB);
    let sim_prefault = prefault_arguments("the simulator", "BENCH_SIM_PREFAULT_MIB", SIM_PREFAULT_MIB);
    let sim_threads = env_usize("BENCH_SIM_THREADS", SIM_THREADS).max(1).to_string();
    println!("the simulator's async worker threads (TOKIO_WORKER_THREADS): {sim_threads}");
    let mut sim_args = vec!["wallet-sim", "--listen", "127.0.0.1:0", "--clock", "event"];
    sim_args.extend(sim_prefault.iter().map(String::as_str));
    let wallet_sim = start(&sim_args, &[("TOKIO_WORKER_THREADS", sim_threads.as_str())]);
    let serve_args = [
        "serve",
        "--data-dir",
        data_dir.path().to_str().expect("UTF-8"),
        "--listen",
        "127.0.0.1:0",
        "--clock",
        "event",
        "--statement-provider",
        &wallet_sim.base,
    ];
    let settings = std::env::var("BENCH_SERVE_CONFIG").ok();
    let partitions = env_usize("BENCH_PARTITIONS", 2).to_string();
    let mut serve_args: Vec<&str> = serve_args.to_vec();
    serve_args.extend(["--partitions", &partitions]);
    if let Some(path) = settings.as_deref() {
        serve_args.extend(["--config", path]);
    }
    serve_args.extend(serve_prefault.iter().map(String::as_str));
    let serve = start(&serve_args, &[]);
    let client = http_client();
    let requests = Requests::new();
    let endpoints = Endpoints { requests: &requests, serve: &serve.base, wallet_sim: &wallet_sim.base };
    if !warmup.is_empty() {
        post_statements_ahead(&endpoints, warmup);
        let started = Instant::now();
        let posted = post_all(&endpoints, warmup);
        wait_quiescent(&requests, &serve.base);
        println!(
            "warm-up: {warmup_rounds} rounds, {posted} events through the API in {:.2} s (untimed)",
            started.elapsed().as_secs_f64()
        );
    }

    post_statements_ahead(&endpoints, first);
    let cpu_before = cpu_of(&serve, &wallet_sim);
    let serve_threads_before = cpu_by_thread(serve.child.id());
    let figures_before = scrape(&client, &serve.base);
    let started = Instant::now();
    let posted = post_all(&endpoints, first);
    let posted_after = started.elapsed();
    wait_quiescent(&requests, &serve.base);
    let elapsed = started.elapsed();
    let cpu_after = cpu_of(&serve, &wallet_sim);
    let serve_threads_after = cpu_by_thread(serve.child.id());
    println!("workload: {agents} agents × {rounds} rounds; {posted} events through the API (+ wallet events)");
    println!(
        "ingest + process: {:.2} s → {:.0} events/s sustained (posting alone took {:.2} s)",
        elapsed.as_secs_f64(),
        posted as f64 / elapsed.as_secs_f64(),
        posted_after.as_secs_f64()
    );
    let spent: [Option<f64>; 3] = std::array::from_fn(|index| Some(cpu_after[index]? - cpu_before[index]?));
    let cpu: Vec<String> = PROCESSES
        .iter()
        .zip(&spent)
        .filter_map(|(name, seconds)| Some(format!("{name} {:.2} s", (*seconds)?)))
        .collect();
    println!("CPU time in that phase ({CORES:.0} cores = {:.2} s): {}", CORES * elapsed.as_secs_f64(), cpu.join(", "));
    if let Some(line) = cpu_per_event(&spent, posted) {
        println!("{line}");
    }
    if let Some(line) = share_of_cores(&spent, elapsed.as_secs_f64()) {
        println!("{line}");
    }
    if let (Some(before), Some(after)) = (&serve_threads_before, &serve_threads_after) {
        println!("  serve's CPU by thread: {}", cpu_by_thread_name_between(before, after));
    }
    println!("{}", pipeline_figures(&figures_before, &scrape(&client, &serve.base), elapsed));
    let order_ids: Vec<String> = first
        .iter()
        .filter_map(|input| match &input.command {
            Command::CollectionCreated(created) => Some(created.order_id.to_string()),
            _ => None,
        })
        .collect();
    post_statements_ahead(&endpoints, rest);
    let done = Arc::new(AtomicBool::new(false));
    let reader_threads: Vec<_> = (0..readers)
        .map(|reader_number| {
            let (base, ids, done) = (serve.base.clone(), order_ids.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                let reader = Requests::new();
                let mut latencies = Vec::new();
                let mut index = reader_number * 7919;
                while !done.load(Ordering::SeqCst) {
                    let id = &ids[index % ids.len()];
                    index += 13;
                    let start = Instant::now();
                    reader.get(&format!("{base}/v1/orders/{id}"));
                    latencies.push(start.elapsed());
                }
                latencies
            })
        })
        .collect();
    let write_started = Instant::now();
    let posted_during_reads = post_all(&endpoints, rest);
    while write_started.elapsed() < Duration::from_secs(read_seconds) {
        std::thread::sleep(Duration::from_millis(50));
    }
    done.store(true, Ordering::SeqCst);
    let mut latencies: Vec<Duration> =
        reader_threads.into_iter().flat_map(|thread| thread.join().expect("a reader")).collect();
    latencies.sort();
    println!(
        "GET /v1/orders/{{id}}: {} reads by {readers} clients while {posted_during_reads} events were posted: \
         p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!("{}", service_read_latency(&client, &serve.base));
    wait_quiescent(&requests, &serve.base);
    let snapshot: Value = client
        .get(format!("{}/v1/admin/snapshot", serve.base))
        .bearer_auth(ADMIN_KEY)
        .send()
        .expect("snapshot")
        .json()
        .expect("JSON");
    println!("outputs of the service: {:?}", outputs_by_type(snapshot["outputs"].as_array().expect("outputs")));
    // Every crawl is one call: a call started early and asked again, or a retry, would show here.
    let stats: Value =
        client.get(format!("{}/sim/v1/stats", wallet_sim.base)).send().expect("stats").json().expect("JSON");
    println!("card requests the simulator answered: {}", stats["card_requests"]);
    if let Ok(directory) = std::env::var("BENCH_DUMP") {
        // For comparing decisions with `paisa replay DIRECTORY/inputs.jsonl` (timelines carry rule ids).
        std::fs::write(format!("{directory}/service.json"), snapshot.to_string()).expect("the document written");
        let lines: Vec<String> = inputs.iter().map(|input| serde_json::to_string(input).expect("JSON")).collect();
        std::fs::write(format!("{directory}/inputs.jsonl"), lines.join("\n") + "\n").expect("the inputs written");
    }
    println!("outputs of paisa replay of the same events: {:?}", replay_outputs(&inputs));
    post_concurrently(&serve.base, inputs.last().map(|input| input.at));
}

/// The HTTP client of the timed phases: the bulk posts and the lag polls of the throughput phase, the
/// order reads, the one-event posts. `ureq` by default: it sends each request from the calling thread,
/// so a request costs the client one wake-up. reqwest's blocking client (`BENCH_CLIENT=reqwest`)
/// hands each request to a runtime thread of its own and back, which on 2 shared cores adds two waits
/// for a core to every request: the twenty-ninth round measured it on the small requests, the
/// fifty-sixth on the bulk posts, where it slowed the throughput phase (`docs/PERFORMANCE.md`). The
/// setup and the figures read around the phases use reqwest ([`http_client`]).
enum Requests {
    /// The agent answers any status (each call checks it, as reqwest's branch does), with the admin's
    /// `authorization` value made once.
    Ureq {
        agent: ureq::Agent,
        authorization: String,
    },
    Reqwest(reqwest::blocking::Client),
}

impl Requests {
    fn new() -> Requests {
        match std::env::var("BENCH_CLIENT").as_deref() {
            Ok("reqwest") => Requests::Reqwest(http_client()),
            Ok("ureq") | Err(_) => Requests::Ureq {
                // A stuck service fails the benchmark after two minutes, as reqwest's client does. Only
                // the wait for the answer is bounded: with a global deadline, ureq resolves the host
                // on a thread of its own for every request.
                agent: ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_recv_response(Some(Duration::from_secs(120)))
                    .build()
                    .into(),
                authorization: format!("Bearer {ADMIN_KEY}"),
            },
            Ok(other) => panic!("BENCH_CLIENT={other}: ureq or reqwest"),
        }
    }

    /// GETs `url` as the admin and returns the whole answer, which must be a success.
    fn get(&self, url: &str) -> String {
        let (status, answer) = match self {
            Requests::Ureq { agent, authorization } => {
                let mut response = agent.get(url).header("authorization", authorization).call().expect("GET");
                (response.status().as_u16(), response.body_mut().read_to_string().expect("the body"))
            }
            Requests::Reqwest(client) => {
                let response = client.get(url).bearer_auth(ADMIN_KEY).send().expect("GET");
                (response.status().as_u16(), response.text().expect("the body"))
            }
        };
        assert!((200..300).contains(&status), "GET {url}: {status} {answer}");
        answer
    }

    /// POSTs a JSON `body` as the admin, fails the benchmark on any answer but a success, and returns
    /// how long the request took (sending to the answer read).
    fn post_bulk(&self, url: &str, body: Vec<u8>, what: &str) -> Duration {
        let request_started = Instant::now();
        let (status, answer) = self.post_bytes(url, body);
        assert!((200..300).contains(&status), "{what}: {status} {answer}");
        request_started.elapsed()
    }

    /// POSTs `body` as the admin, and returns the status and the answer.
    fn post(&self, url: &str, body: &Value) -> (u16, String) {
        self.post_bytes(url, body.to_string().into_bytes())
    }

    /// POSTs the JSON text `body` as the admin, and returns the status and the answer.
    fn post_bytes(&self, url: &str, body: Vec<u8>) -> (u16, String) {
        match self {
            Requests::Ureq { agent, authorization } => {
                let mut response = agent
                    .post(url)
                    .header("authorization", authorization)
                    .header("content-type", "application/json")
                    .send(&body[..])
                    .expect("POST");
                (response.status().as_u16(), response.body_mut().read_to_string().expect("the answer"))
            }
            Requests::Reqwest(client) => {
                let request = client.post(url).bearer_auth(ADMIN_KEY).header("content-type", "application/json");
                let response = request.body(body).send().expect("POST");
                (response.status().as_u16(), response.text().unwrap_or_default())
            }
        }
    }
}

/// The text of the service's `GET /metrics`.
fn scrape(client: &reqwest::blocking::Client, serve: &str) -> String {
    client.get(format!("{serve}/metrics")).bearer_auth(ADMIN_KEY).send().expect("metrics").text().expect("text")
}

/// One histogram of a `/metrics` scrape: cumulative counts by upper bound, in the order rendered
/// (ascending, `+Inf` last), and the sum of its samples.
#[derive(Default)]
struct Buckets {
    counts: Vec<(String, u64)>,
    sum: f64,
}

impl Buckets {
    /// The histogram `name` with the labels `labels` (`method="GET",route="…",`; empty for none).
    fn of(text: &str, name: &str, labels: &str) -> Buckets {
        let prefix = format!("{name}_bucket{{{labels}le=\"");
        let counts = text
            .lines()
            .filter_map(|line| line.strip_prefix(prefix.as_str()))
            .filter_map(|rest| {
                let (bound, count) = rest.split_once("\"} ")?;
                Some((bound.to_string(), count.parse().ok()?))
            })
            .collect();
        let sum_series = match labels.strip_suffix(',') {
            Some(labels) => format!("{name}_sum{{{labels}}} "),
            None => format!("{name}_sum "),
        };
        let sum = text.lines().find_map(|line| line.strip_prefix(sum_series.as_str())?.parse().ok()).unwrap_or(0.0);
        Buckets { counts, sum }
    }

    /// What was recorded between `earlier` (a scrape before) and this one.
    fn since(&self, earlier: &Buckets) -> Buckets {
        let before =
            |bound: &str| earlier.counts.iter().find(|(other, _)| other == bound).map_or(0, |(_, count)| *count);
        let counts = self.counts.iter().map(|(bound, count)| (bound.clone(), count - before(bound))).collect();
        Buckets { counts, sum: self.sum - earlier.sum }
    }

    /// Both histograms' samples in one (the same bounds).
    fn plus(mut self, other: Buckets) -> Buckets {
        for ((bound, count), (other_bound, other_count)) in self.counts.iter_mut().zip(other.counts) {
            assert_eq!(*bound, other_bound, "histograms with the same bounds");
            *count += other_count;
        }
        self.sum += other.sum;
        self
    }

    fn total(&self) -> u64 {
        self.counts.last().map_or(0, |(_, count)| *count)
    }

    /// The upper bound the `fraction` quantile falls under, in milliseconds (every histogram read here
    /// is of seconds).
    fn bound_of(&self, fraction: f64) -> String {
        let wanted = (fraction * self.total() as f64).ceil() as u64;
        let Some((bound, _)) = self.counts.iter().find(|(_, count)| *count >= wanted) else {
            return "?".to_string();
        };
        match bound.parse::<f64>() {
            Ok(seconds) => format!("{:.2} ms", seconds * 1e3),
            Err(_) => bound.clone(),
        }
    }
}

/// The order reads' latency inside the service, from its `GET /metrics` histogram: the bucket bounds
/// that p50 and p99 fall under. The client's figures add its own queueing, which on a machine shared
/// with the service and the simulator is most of a slow read's time.
fn service_read_latency(client: &reqwest::blocking::Client, serve: &str) -> String {
    let text = scrape(client, serve);
    let labels = r#"method="GET",route="/v1/orders/{order_id}","#;
    let reads = Buckets::of(&text, "paisa_http_request_duration_seconds", labels);
    let total = reads.total();
    if total == 0 {
        return "  the same reads inside the service: not measured (no order reads in its /metrics: a paisa \
                before the twenty-ninth round?)"
            .to_string();
    }
    format!(
        "  the same reads inside the service (its /metrics histogram, {total} reads): p50 ≤ {}, p99 ≤ {}",
        reads.bound_of(0.50),
        reads.bound_of(0.99)
    )
}

/// The pipeline's figures of a phase, from two scrapes of `/metrics` (before and after): the store's
/// commits (how many, batches each, their durations) and the calls to the provider.
fn pipeline_figures(before: &str, after: &str, elapsed: Duration) -> String {
    let phase = |name: &str, labels: &str| Buckets::of(after, name, labels).since(&Buckets::of(before, name, labels));
    let commits = phase("paisa_store_commit_duration_seconds", "");
    if commits.total() == 0 {
        return "pipeline figures: not measured (no store commits in its /metrics: a paisa before the \
                thirtieth round?)"
            .to_string();
    }
    let batches = phase("paisa_store_commit_batches", "");
    // Every provider's calls in one histogram (the label is the provider's name as SPEC §10 spells it).
    let calls = pipelines::input::Provider::ALL
        .map(|provider| {
            let name = serde_json::to_value(provider).expect("a provider's name");
            phase("paisa_crawl_call_duration_seconds", &format!("provider={name},"))
        })
        .into_iter()
        .reduce(Buckets::plus)
        .unwrap_or_default();
    let seconds = elapsed.as_secs_f64();
    let ingestions = phase("paisa_store_ingestion_wait_seconds", "");
    // Absent from a paisa before the thirty-eighth round.
    let ingestion_waits = if ingestions.total() == 0 {
        String::new()
    } else {
        format!(
            "\n  requests' ingestions: {}, each waiting for its commit p50 ≤ {}, p99 ≤ {} (the group in flight, \
             then its own)",
            ingestions.total(),
            ingestions.bound_of(0.50),
            ingestions.bound_of(0.99)
        )
    };
    format!(
        "store commits in that phase: {} ({:.0}/s, busy {:.0} % of the time), {:.2} batches each, p50 ≤ {}, \
         p99 ≤ {}; provider calls: {} ({:.0}/s), p50 ≤ {}, p99 ≤ {}{ingestion_waits}",
        commits.total(),
        commits.total() as f64 / seconds,
        100.0 * commits.sum / seconds,
        batches.sum / batches.total().max(1) as f64,
        commits.bound_of(0.50),
        commits.bound_of(0.99),
        calls.total(),
        calls.total() as f64 / seconds,
        calls.bound_of(0.50),
        calls.bound_of(0.99),
    )
}

/// Posts `user_registered` events one per request from concurrent clients, and prints the events/s and
/// the requests' latency percentiles.
fn post_concurrently(serve: &str, at: Option<pipelines::Timestamp>) {
    let posters = env_usize("BENCH_POSTERS", 16);
    let per_poster = env_usize("BENCH_POSTS_PER_CLIENT", 250);
    let barrier = Arc::new(std::sync::Barrier::new(posters + 1));
    let threads: Vec<_> = (0..posters)
        .map(|poster| {
            let (serve, barrier) = (serve.to_string(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let client = Requests::new();
                barrier.wait();
                let mut latencies = Vec::with_capacity(per_poster);
                for index in 0..per_poster {
                    let id = format!("concurrent-{poster}-{index}");
                    let event = serde_json::json!({
                        "type": "user_registered", "event_id": id, "at": at, "user_id": id, "telegram_bound": true
                    });
                    let start = Instant::now();
                    let (status, answer) = client.post(&format!("{serve}/v1/events"), &event);
                    assert_eq!(status, 202, "{answer}");
                    latencies.push(start.elapsed());
                }
                latencies
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let mut latencies: Vec<Duration> =
        threads.into_iter().flat_map(|thread| thread.join().expect("a poster")).collect();
    let elapsed = started.elapsed();
    wait_quiescent(&Requests::new(), serve);
    let processed = started.elapsed();
    latencies.sort();
    println!(
        "POST /v1/events one event per request, {posters} clients at once: {} events in {:.2} s → {:.0} events/s, \
         p50 {:.2} ms, p99 {:.2} ms; all processed {:.2} s after the first request",
        latencies.len(),
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        processed.as_secs_f64()
    );
}
