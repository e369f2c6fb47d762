//! redb vs fjall for the embedded runtime's store, on the runtime's access pattern and the generated
//! workload of `pipelines::workload` (each input serialised as its JSON envelope: 120–300 bytes).
//!
//! For each store and batch size B a child process (this binary, re-executed) runs, on a fresh data
//! directory:
//! 1. append: the inputs are appended to the `commands/0` log in durable commits of B records;
//! 2. process: from the committed offset, read up to B records of `commands/0`, then in ONE durable
//!    commit append 1.5 produced records per consumed one to the 8 partitions of `events` (by entity),
//!    write B/4 views (key: entity id, value ~1 KiB JSON) and the consumer offset. Meanwhile another
//!    thread does point reads of views (paced by a 50 µs sleep, ~7k/s: the HTTP API under write load);
//! 3. crash: a tail of more inputs is processed in batches of 64 by a thread and the process exits in
//!    the middle of it, without closing the store (`std::process::exit` runs no destructor).
//!
//! The parent then reopens the directory (crash recovery), checks that the committed offset and the
//! produced records agree (the commit is atomic across partitions), scans every log sequentially,
//! closes, reopens cleanly, and prints a table per store. Commits are durable: redb's default
//! `Durability::Immediate`; fjall's cross-partition `Batch` with `durability(Some(PersistMode::SyncAll))`.
//! Both stores get the same 64 MiB cache.
//!
//! Run: `cargo bench -p connectors --bench store` (about 20 s on an idle 2-core machine).
//! `STORE_AGENTS` / `STORE_ROUNDS` resize the workload (default 5000 × 4, about 193k inputs: enough
//! for fjall to flush memtables during the run), `STORE_BATCHES` sets the batch sizes (default
//! `256,2048`), `STORE_ONLY` runs one store (`redb` or `fjall`).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Logs: index 0 is `commands/0`, 1..=EVENT_PARTITIONS are `events/0..`.
const EVENT_PARTITIONS: usize = 8;
const LOGS: usize = 1 + EVENT_PARTITIONS;
const COMMANDS: usize = 0;
const CONSUMER: &str = "engine/commands/0";
const CACHE_BYTES: usize = 64 << 20;
const VIEW_BYTES: usize = 1024;
const TAIL_BATCH: usize = 64;
const CHILD_ENV: &str = "STORE_BENCH_CHILD";

fn log_name(log: usize) -> String {
    if log == COMMANDS {
        "commands/0".to_string()
    } else {
        format!("events/{}", log - 1)
    }
}

/// One durable commit: log appends (log, offset, value), views (key, value) and the consumer offset.
#[derive(Default)]
struct Commit {
    appends: Vec<(usize, u64, Vec<u8>)>,
    views: Vec<(String, Vec<u8>)>,
    offset: Option<u64>,
}

/// What the benchmark needs from a store; every `commit` is atomic and durable when it returns.
trait Store: Send + Sync + Sized + 'static {
    const NAME: &'static str;
    const DURABILITY: &'static str;
    fn open(dir: &Path) -> Res<Self>;
    fn commit(&self, commit: &Commit) -> Res<()>;
    /// Up to `max` records of `log` from offset `from`, in order.
    fn read(&self, log: usize, from: u64, max: usize) -> Res<Vec<Vec<u8>>>;
    /// The length of a view's value, if it exists (a point read by an API call).
    fn view(&self, key: &str) -> Res<Option<usize>>;
    fn committed_offset(&self) -> Res<Option<u64>>;
    /// Reads the whole log in order; returns (records, bytes).
    fn scan(&self, log: usize) -> Res<(u64, u64)>;
}

mod redb_store {
    use super::*;
    use redb::{Database, ReadableTable, TableDefinition};

    const VIEWS: TableDefinition<&str, &[u8]> = TableDefinition::new("views");
    const OFFSETS: TableDefinition<&str, u64> = TableDefinition::new("offsets");

    pub struct Redb {
        db: Database,
        names: Vec<String>,
    }

    impl Redb {
        fn log(&self, log: usize) -> TableDefinition<'_, u64, &'static [u8]> {
            TableDefinition::new(&self.names[log])
        }
    }

    impl Store for Redb {
        const NAME: &'static str = "redb";
        const DURABILITY: &'static str = "one write transaction per commit, Durability::Immediate (default)";

        fn open(dir: &Path) -> Res<Self> {
            let db = redb::Builder::new().set_cache_size(CACHE_BYTES).create(dir.join("paisa.redb"))?;
            let names = (0..LOGS).map(|log| format!("log/{}", log_name(log))).collect();
            let store = Redb { db, names };
            // Tables exist from the start (a read transaction cannot open a missing table).
            let txn = store.db.begin_write()?;
            for log in 0..LOGS {
                txn.open_table(store.log(log))?;
            }
            txn.open_table(VIEWS)?;
            txn.open_table(OFFSETS)?;
            txn.commit()?;
            Ok(store)
        }

        fn commit(&self, commit: &Commit) -> Res<()> {
            let txn = self.db.begin_write()?;
            {
                let mut tables: Vec<Option<redb::Table<u64, &[u8]>>> = (0..LOGS).map(|_| None).collect();
                for (log, offset, value) in &commit.appends {
                    if tables[*log].is_none() {
                        tables[*log] = Some(txn.open_table(self.log(*log))?);
                    }
                    if let Some(table) = tables[*log].as_mut() {
                        table.insert(*offset, value.as_slice())?;
                    }
                }
                if !commit.views.is_empty() {
                    let mut views = txn.open_table(VIEWS)?;
                    for (key, value) in &commit.views {
                        views.insert(key.as_str(), value.as_slice())?;
                    }
                }
                if let Some(offset) = commit.offset {
                    txn.open_table(OFFSETS)?.insert(CONSUMER, offset)?;
                }
            }
            txn.commit()?;
            Ok(())
        }

        fn read(&self, log: usize, from: u64, max: usize) -> Res<Vec<Vec<u8>>> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(self.log(log))?;
            let mut records = Vec::with_capacity(max);
            for entry in table.range(from..from + max as u64)? {
                records.push(entry?.1.value().to_vec());
            }
            Ok(records)
        }

        fn view(&self, key: &str) -> Res<Option<usize>> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(VIEWS)?;
            Ok(table.get(key)?.map(|value| value.value().len()))
        }

        fn committed_offset(&self) -> Res<Option<u64>> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(OFFSETS)?;
            Ok(table.get(CONSUMER)?.map(|value| value.value()))
        }

        fn scan(&self, log: usize) -> Res<(u64, u64)> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(self.log(log))?;
            let (mut records, mut bytes) = (0, 0);
            for entry in table.iter()? {
                let (_, value) = entry?;
                records += 1;
                bytes += value.value().len() as u64;
            }
            Ok((records, bytes))
        }
    }
}

mod fjall_store {
    use super::*;
    use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};

    pub struct Fjall {
        keyspace: Keyspace,
        logs: Vec<PartitionHandle>,
        views: PartitionHandle,
        offsets: PartitionHandle,
    }

    impl Store for Fjall {
        const NAME: &'static str = "fjall";
        const DURABILITY: &'static str =
            "one cross-partition keyspace Batch per commit, durability(Some(PersistMode::SyncAll))";

        fn open(dir: &Path) -> Res<Self> {
            let keyspace = Config::new(dir.join("paisa.fjall")).cache_size(CACHE_BYTES as u64).open()?;
            let options = PartitionCreateOptions::default;
            let logs = (0..LOGS)
                .map(|log| keyspace.open_partition(&format!("log.{}", log_name(log).replace('/', ".")), options()))
                .collect::<Result<_, _>>()?;
            let views = keyspace.open_partition("views", options())?;
            let offsets = keyspace.open_partition("offsets", options())?;
            Ok(Fjall { keyspace, logs, views, offsets })
        }

        fn commit(&self, commit: &Commit) -> Res<()> {
            let mut batch = self.keyspace.batch().durability(Some(PersistMode::SyncAll));
            for (log, offset, value) in &commit.appends {
                batch.insert(&self.logs[*log], offset.to_be_bytes(), value.as_slice());
            }
            for (key, value) in &commit.views {
                batch.insert(&self.views, key.as_str(), value.as_slice());
            }
            if let Some(offset) = commit.offset {
                batch.insert(&self.offsets, CONSUMER, offset.to_be_bytes());
            }
            batch.commit()?;
            Ok(())
        }

        fn read(&self, log: usize, from: u64, max: usize) -> Res<Vec<Vec<u8>>> {
            let range = from.to_be_bytes()..(from + max as u64).to_be_bytes();
            let mut records = Vec::with_capacity(max);
            for entry in self.logs[log].range(range) {
                records.push(entry?.1.to_vec());
            }
            Ok(records)
        }

        fn view(&self, key: &str) -> Res<Option<usize>> {
            Ok(self.views.get(key)?.map(|value| value.len()))
        }

        fn committed_offset(&self) -> Res<Option<u64>> {
            let Some(value) = self.offsets.get(CONSUMER)? else { return Ok(None) };
            Ok(Some(u64::from_be_bytes(value.as_ref().try_into()?)))
        }

        fn scan(&self, log: usize) -> Res<(u64, u64)> {
            let (mut records, mut bytes) = (0, 0);
            for entry in self.logs[log].iter() {
                let (_, value) = entry?;
                records += 1;
                bytes += value.len() as u64;
            }
            Ok((records, bytes))
        }
    }
}

/// The workload: each input's JSON envelope and the entity it is about (its view key).
struct Workload {
    records: Vec<Vec<u8>>,
    keys: Vec<String>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    event_id: &'a str,
    at: pipelines::Timestamp,
    command: &'a pipelines::input::Command,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn workload() -> Res<Workload> {
    let inputs = pipelines::workload::workload(env_or("STORE_AGENTS", 5000), env_or("STORE_ROUNDS", 4));
    let mut records = Vec::with_capacity(inputs.len());
    let mut keys = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let command = serde_json::to_value(&input.command)?;
        let key = ["order_id", "card_id", "user_id", "merchant_id"]
            .iter()
            .find_map(|field| command.get(*field).and_then(|id| id.as_str()).map(|id| format!("{field}:{id}")))
            .unwrap_or_else(|| format!("type:{}", command["type"]));
        records.push(serde_json::to_vec(&Envelope {
            event_id: &input.event_id,
            at: input.at,
            command: &input.command,
        })?);
        keys.push(key);
    }
    Ok(Workload { records, keys })
}

/// A view of about 1 KiB of JSON: the entity, a version and the last event, padded.
fn view_value(key: &str, version: u64, last_event: &[u8]) -> Vec<u8> {
    let mut value = format!(r#"{{"id":"{key}","version":{version},"last_event":"#).into_bytes();
    value.extend_from_slice(last_event);
    value.extend_from_slice(br#","history":""#);
    value.resize(value.len().max(VIEW_BYTES - 2), b'x');
    value.extend_from_slice(br#""}"#);
    value
}

/// The events partition of an entity (FNV-1a, stable across runs).
fn partition_of(key: &str) -> usize {
    let hash =
        key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ byte as u64).wrapping_mul(0x100_0000_01b3));
    (hash % EVENT_PARTITIONS as u64) as usize
}

/// The processing loop's state: the next offset of each events partition.
struct Processor {
    next: [u64; EVENT_PARTITIONS],
}

impl Processor {
    /// Builds the commit for `records` consumed from `offset` (1.5 produced records each, B/4 views).
    fn step(&mut self, workload: &Workload, offset: u64, records: Vec<Vec<u8>>) -> Commit {
        let mut commit = Commit { offset: Some(offset + records.len() as u64), ..Commit::default() };
        for (index, record) in records.into_iter().enumerate() {
            let position = offset + index as u64;
            let key = &workload.keys[position as usize % workload.keys.len()];
            if position.is_multiple_of(4) {
                commit.views.push((key.clone(), view_value(key, position, &record)));
            }
            let first = partition_of(key);
            let produced = if position % 2 == 1 { 2 } else { 1 };
            for partition in (0..produced).map(|extra| (first + extra) % EVENT_PARTITIONS) {
                commit.appends.push((1 + partition, self.next[partition], record.clone()));
                self.next[partition] += 1;
            }
        }
        commit
    }
}

/// Produced records for the first `consumed` inputs: 1 each, 2 for odd positions.
fn produced_for(consumed: u64) -> u64 {
    consumed + consumed / 2
}

/// What the child measured.
#[derive(Serialize, Deserialize)]
struct Measured {
    inputs: u64,
    record_bytes_avg: f64,
    record_bytes_min: usize,
    record_bytes_max: usize,
    append_per_s: f64,
    consume_per_s: f64,
    commits: usize,
    commit_p50_ms: f64,
    commit_p99_ms: f64,
    commit_max_ms: f64,
    reads: usize,
    reads_per_s: f64,
    read_p50_us: f64,
    read_p99_us: f64,
    read_hits: usize,
    payload_mib: f64,
    tail_inputs: u64,
    tail_committed_before_exit: u64,
}

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// The child: runs append, process and crash on `dir`, prints its figures and exits without closing.
fn child<S: Store>(dir: &Path, batch: usize) -> Res<()> {
    let workload = Arc::new(workload()?);
    let inputs = workload.records.len() as u64;
    let store = Arc::new(S::open(dir)?);

    // The views exist before the measured phases (the API reads existing entities).
    let mut distinct: Vec<&String> = workload.keys.iter().collect();
    distinct.sort();
    distinct.dedup();
    let view_keys: Arc<Vec<String>> = Arc::new(distinct.into_iter().cloned().collect());
    for chunk in view_keys.chunks(4096) {
        let views = chunk.iter().map(|key| (key.clone(), view_value(key, 0, b"null"))).collect();
        store.commit(&Commit { views, ..Commit::default() })?;
    }

    // 1. Append the inputs in durable commits of `batch` records.
    let started = Instant::now();
    for (chunk_index, chunk) in workload.records.chunks(batch).enumerate() {
        let first = (chunk_index * batch) as u64;
        let appends =
            chunk.iter().enumerate().map(|(index, record)| (COMMANDS, first + index as u64, record.clone())).collect();
        store.commit(&Commit { appends, ..Commit::default() })?;
    }
    let append_per_s = inputs as f64 / started.elapsed().as_secs_f64();

    // 2. The processing loop, with a reader doing point reads of views meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, stop, view_keys) = (store.clone(), stop.clone(), view_keys.clone());
        std::thread::spawn(move || -> Res<(Vec<f64>, usize)> {
            let (mut latencies, mut hits, mut state) = (Vec::new(), 0, 0x9e37_79b9_7f4a_7c15u64);
            while !stop.load(Ordering::Relaxed) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let key = &view_keys[(state % view_keys.len() as u64) as usize];
                let started = Instant::now();
                hits += usize::from(store.view(key)?.is_some());
                latencies.push(started.elapsed().as_secs_f64() * 1e6);
                std::thread::sleep(Duration::from_micros(50));
            }
            Ok((latencies, hits))
        })
    };
    let mut processor = Processor { next: [0; EVENT_PARTITIONS] };
    let mut commit_ms = Vec::new();
    let mut payload = workload.records.iter().map(Vec::len).sum::<usize>() as f64;
    let started = Instant::now();
    let mut offset = store.committed_offset()?.unwrap_or(0);
    loop {
        let records = store.read(COMMANDS, offset, batch)?;
        if records.is_empty() {
            break;
        }
        let consumed = records.len() as u64;
        let commit = processor.step(&workload, offset, records);
        payload += commit.appends.iter().map(|(_, _, value)| value.len()).sum::<usize>() as f64;
        let committing = Instant::now();
        store.commit(&commit)?;
        commit_ms.push(committing.elapsed().as_secs_f64() * 1e3);
        offset += consumed;
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (read_us, read_hits) = reader.join().map_err(|_| "reader panicked")??;
    assert_eq!(offset, inputs, "the loop consumed every input");

    // 3. A tail processed in small batches by a thread; the process exits in the middle of it.
    let tail_inputs = inputs / 5;
    let appends = (0..tail_inputs)
        .map(|index| (COMMANDS, inputs + index, workload.records[index as usize].clone()))
        .collect::<Vec<_>>();
    store.commit(&Commit { appends, ..Commit::default() })?;
    let tail_committed = Arc::new(AtomicU64::new(0));
    {
        let (store, workload, tail_committed) = (store.clone(), workload.clone(), tail_committed.clone());
        std::thread::spawn(move || -> Res<()> {
            let mut offset = offset;
            loop {
                let records = store.read(COMMANDS, offset, TAIL_BATCH)?;
                if records.is_empty() {
                    return Ok(());
                }
                let consumed = records.len() as u64;
                let commit = processor.step(&workload, offset, records);
                store.commit(&commit)?;
                offset += consumed;
                tail_committed.store(offset - inputs, Ordering::Release);
            }
        });
    }
    std::thread::sleep(Duration::from_millis(40));

    let (min, max) =
        workload.records.iter().fold((usize::MAX, 0), |(min, max), r| (min.min(r.len()), max.max(r.len())));
    let commit_ms = sorted(commit_ms);
    let read_us = sorted(read_us);
    payload += view_keys.len() as f64 * VIEW_BYTES as f64;
    let measured = Measured {
        inputs,
        record_bytes_avg: workload.records.iter().map(Vec::len).sum::<usize>() as f64 / inputs as f64,
        record_bytes_min: min,
        record_bytes_max: max,
        append_per_s,
        consume_per_s: inputs as f64 / elapsed,
        commits: commit_ms.len(),
        commit_p50_ms: percentile(&commit_ms, 0.5),
        commit_p99_ms: percentile(&commit_ms, 0.99),
        commit_max_ms: percentile(&commit_ms, 1.0),
        reads: read_us.len(),
        reads_per_s: read_us.len() as f64 / elapsed,
        read_p50_us: percentile(&read_us, 0.5),
        read_p99_us: percentile(&read_us, 0.99),
        read_hits,
        payload_mib: payload / (1 << 20) as f64,
        tail_inputs,
        tail_committed_before_exit: tail_committed.load(Ordering::Acquire),
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", serde_json::to_string(&measured)?)?;
    stdout.flush()?;
    // A crash as far as the store can tell: no destructor runs, buffered writes are lost.
    std::process::exit(0)
}

/// The 1-minute load average, to tell a quiet machine from a busy one.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().unwrap_or("?").to_string()
}

/// (apparent bytes, allocated bytes, files) under `dir`.
fn disk_usage(dir: &Path) -> Res<(u64, u64, usize)> {
    let mut totals = (0, 0, 0);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        if metadata.is_dir() {
            let (apparent, allocated, files) = disk_usage(&entry.path())?;
            totals = (totals.0 + apparent, totals.1 + allocated, totals.2 + files);
        } else {
            totals = (totals.0 + metadata.len(), totals.1 + metadata.blocks() * 512, totals.2 + 1);
        }
    }
    Ok(totals)
}

/// Everything reported for one store and batch size.
struct Run {
    batch: usize,
    /// The 1-minute load average before and after the measured phases (the machine is shared).
    load: String,
    measured: Measured,
    crash_reopen_ms: f64,
    crash_check: String,
    scan_per_s: f64,
    scanned: u64,
    clean_reopen_ms: f64,
    disk: (u64, u64, usize),
}

fn run<S: Store>(batch: usize) -> Res<Run> {
    let dir = tempfile::tempdir()?;
    let load_before = load_average();
    let output = std::process::Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, format!("{}:{batch}:{}", S::NAME, dir.path().display()))
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(format!("{} B={batch}: child failed with {}", S::NAME, output.status).into());
    }
    let measured: Measured = serde_json::from_slice(&output.stdout)?;
    let load = format!("{load_before} → {}", load_average());
    let disk = disk_usage(dir.path())?;

    // Crash recovery, then the atomicity check and a sequential scan of every log.
    let started = Instant::now();
    let store = S::open(dir.path())?;
    let crash_reopen_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let mut counts = Vec::with_capacity(LOGS);
    for log in 0..LOGS {
        counts.push(store.scan(log)?.0);
    }
    let scan_s = started.elapsed().as_secs_f64();
    let scanned: u64 = counts.iter().sum();
    let offset = store.committed_offset()?.unwrap_or(0);
    let produced: u64 = counts[1..].iter().sum();
    let consistent = produced == produced_for(offset) && counts[COMMANDS] == measured.inputs + measured.tail_inputs;
    let acknowledged = measured.inputs + measured.tail_committed_before_exit;
    let crash_check = format!(
        "{} ({offset} ≥ {acknowledged} acked)",
        if consistent && offset >= acknowledged { "ok" } else { "FAILED" }
    );
    drop(store);
    let started = Instant::now();
    let store = S::open(dir.path())?;
    let clean_reopen_ms = started.elapsed().as_secs_f64() * 1e3;
    drop(store);
    Ok(Run {
        batch,
        load,
        measured,
        crash_reopen_ms,
        crash_check,
        scan_per_s: scanned as f64 / scan_s,
        scanned,
        clean_reopen_ms,
        disk,
    })
}

/// One cell of a table row, from a run.
type Cell = Box<dyn Fn(&Run) -> String>;

fn print_table<S: Store>(runs: &[Run]) {
    let Some(first) = runs.first() else { return };
    let m = &first.measured;
    println!();
    println!("== {} == {}", S::NAME, S::DURABILITY);
    println!(
        "   {} inputs of {:.0} B avg ({}–{} B), 1.5 produced records per input to {EVENT_PARTITIONS} partitions, \
         B/4 views of {VIEW_BYTES} B; cache {} MiB",
        m.inputs,
        m.record_bytes_avg,
        m.record_bytes_min,
        m.record_bytes_max,
        CACHE_BYTES >> 20
    );
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let rows: Vec<(&str, Cell)> = vec![
        ("append records/s (commit per B)", Box::new(|r| format!("{:.0}", r.measured.append_per_s))),
        ("consumed records/s (read+commit)", Box::new(|r| format!("{:.0}", r.measured.consume_per_s))),
        ("commits in loop", Box::new(|r| format!("{}", r.measured.commits))),
        (
            "commit p50 / p99 / max (ms)",
            Box::new(|r| {
                format!(
                    "{:.2} / {:.2} / {:.2}",
                    r.measured.commit_p50_ms, r.measured.commit_p99_ms, r.measured.commit_max_ms
                )
            }),
        ),
        (
            "point read p50 / p99 (µs) under load",
            Box::new(|r| format!("{:.1} / {:.1}", r.measured.read_p50_us, r.measured.read_p99_us)),
        ),
        (
            "point reads (reads/s, hits)",
            Box::new(|r| {
                format!("{} ({:.0}/s, {} hit)", r.measured.reads, r.measured.reads_per_s, r.measured.read_hits)
            }),
        ),
        ("reopen after crash (ms)", Box::new(|r| format!("{:.1}", r.crash_reopen_ms))),
        ("crash check", Box::new(|r| r.crash_check.clone())),
        ("sequential scan records/s", Box::new(|r| format!("{:.0} ({} records)", r.scan_per_s, r.scanned))),
        ("clean reopen (ms)", Box::new(|r| format!("{:.1}", r.clean_reopen_ms))),
        (
            "on disk MiB (allocated / apparent)",
            Box::new(move |r| format!("{:.1} / {:.1}", mib(r.disk.1), mib(r.disk.0))),
        ),
        ("payload written MiB (live)", Box::new(|r| format!("{:.1}", r.measured.payload_mib))),
        ("files", Box::new(|r| format!("{}", r.disk.2))),
        ("load average (1 min) before → after", Box::new(|r| r.load.clone())),
    ];
    let cells: Vec<Vec<String>> = rows.iter().map(|(_, cell)| runs.iter().map(cell).collect()).collect();
    let width = cells.iter().flatten().map(|cell| cell.chars().count()).max().unwrap_or(0).max(8);
    print!("{:<38}", "metric");
    for run in runs {
        print!(" | {:>width$}", format!("B={}", run.batch));
    }
    println!();
    println!("{}", "-".repeat(38 + runs.len() * (width + 3)));
    for ((name, _), row) in rows.iter().zip(&cells) {
        print!("{name:<38}");
        for cell in row {
            print!(" | {cell:>width$}");
        }
        println!();
    }
}

fn bench<S: Store>(batches: &[usize]) -> Res<()> {
    let mut runs = Vec::new();
    for &batch in batches {
        let started = Instant::now();
        runs.push(run::<S>(batch)?);
        eprintln!("{} B={batch}: {:.1} s", S::NAME, started.elapsed().as_secs_f64());
    }
    print_table::<S>(&runs);
    Ok(())
}

fn main() -> Res<()> {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let mut parts = spec.splitn(3, ':');
        let (store, batch, dir) = (parts.next(), parts.next().and_then(|b| b.parse().ok()), parts.next());
        return match (store, batch, dir) {
            (Some("redb"), Some(batch), Some(dir)) => child::<redb_store::Redb>(Path::new(dir), batch),
            (Some("fjall"), Some(batch), Some(dir)) => child::<fjall_store::Fjall>(Path::new(dir), batch),
            _ => Err(format!("bad {CHILD_ENV}: {spec}").into()),
        };
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` passes no such flag: keep that run short.
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("store bench: run with `cargo bench -p connectors --bench store`");
        return Ok(());
    }
    let batches: Vec<usize> = std::env::var("STORE_BATCHES")
        .unwrap_or_else(|_| "256,2048".into())
        .split(',')
        .filter_map(|batch| batch.trim().parse().ok())
        .collect();
    let only = std::env::var("STORE_ONLY").ok();
    if !matches!(only.as_deref(), Some(name) if name != "redb") {
        bench::<redb_store::Redb>(&batches)?;
    }
    if !matches!(only.as_deref(), Some(name) if name != "fjall") {
        bench::<fjall_store::Fjall>(&batches)?;
    }
    Ok(())
}
