//! The embedded backend: the whole pipeline in one process and one data directory.
//!
//! Every stage partition (SPEC §3: order, agent and merchant stages, each split by the hash of its key)
//! consumes one durable log in `paisa.redb`. Processing threads each own some partitions and, per round,
//! read a batch of each, apply it to the pure stage ([`crate::runtime::apply_batch_from`]) and commit the
//! produced records + outputs + offsets of all of them atomically ([`crate::runtime::commit_applied`]),
//! on a committer thread while the next round is applied ([`run_pipelined`]).
//! Working state lives in memory and is rebuilt at start by applying each log up to its committed
//! offset ([`crate::runtime::restore`]); the stages are deterministic, so it comes back byte for byte.

pub mod connector_loop;
pub mod projector;
mod reads;
pub mod reprocess;
pub mod store;

use crate::runtime::{appended_logs, push_stage_record, HandedBatch};
use crate::runtime::{
    apply_batch_from, commit_applied, for_each_record, lock, read_lock, restore, stage_log, stage_log_name, Appended,
    AssignmentListener, ClockMode, Ingested, IngestionChecks, IngestionReader, KeyOwners, KeyValueTable,
    PipelineHandle, Records, RuntimeError, Store, WriteBatch, OUTPUTS_LOG,
};
use pipelines::partition::{route_input, RecordBody, RecordId, Routed, StageKind, StagePartition, StageRecord};
use pipelines::{Config, Input, Timestamp};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;
use store::RedbStore;

/// Settings of the embedded backend.
#[derive(Clone, Debug)]
pub struct EmbeddedConfig {
    /// The data directory (created if missing).
    pub data_dir: PathBuf,
    /// Partitions per stage; fixed when the data directory is created.
    pub partitions: u32,
    /// Records one processing batch reads at most from one partition.
    pub batch_records_max: usize,
    /// Processing threads; each owns some stage partitions and commits their batches together.
    pub processing_threads: usize,
    /// How time enters (SPEC §3).
    pub clock: ClockMode,
    /// How often the ticker looks for partitions with timers due.
    pub tick_interval_ms: u64,
    /// The engine configuration (SPEC §8).
    pub engine: Config,
    /// Some(seconds) when the statement connector stamps each answer that long after its request (the
    /// event clock: `crawl_latency`): agent partitions then hold records stamped later than an answer
    /// still in flight until it arrives (`pipelines::answer_barrier`), as replay applies them. A data
    /// directory keeps the setting it was created with: a later start adopts it.
    pub answer_delay_s: Option<i64>,
    /// Where the pipeline's figures go (`crate::metrics`; by default nowhere).
    pub metrics: Arc<crate::metrics::PipelineMetrics>,
}

impl EmbeddedConfig {
    pub fn new(data_dir: PathBuf, clock: ClockMode) -> EmbeddedConfig {
        EmbeddedConfig {
            data_dir,
            partitions: 2,
            batch_records_max: 1024,
            processing_threads: 2,
            clock,
            tick_interval_ms: 100,
            engine: Config::default(),
            answer_delay_s: None,
            metrics: Arc::default(),
        }
    }
}

/// Partitions per stage at most (each is a thread).
pub const PARTITIONS_MAX: u32 = 64;

/// How long a processing thread with nothing to do waits for its doorbell before reading again.
const IDLE_WAIT_MS: u64 = 200;
/// The same, for an instance sharing the partitions: records other instances append ring nothing here,
/// so this is how soon they are seen.
const SHARED_IDLE_WAIT_MS: u64 = 20;

/// The source of the records an ingested input becomes (their offset is its ingestion position).
const INGEST_SOURCE: &str = "ingest";
/// The source of the ticker's ticks.
const TICKER_SOURCE: &str = "ticker";

/// A doorbell a producer rings after a commit so the consumer of a log wakes at once.
///
/// Ringing wakes only a consumer that sleeps on it: a condvar's notification is a system call whether
/// or not anyone waits, and the producers ring far more often than a busy consumer sleeps (in the serve
/// benchmark ≈ 38,000 futex calls a second, most of them rings nobody waited for).
#[derive(Default)]
pub struct Doorbell {
    bell: Mutex<Bell>,
    condvar: Condvar,
}

/// What the doorbell's lock guards.
#[derive(Default)]
struct Bell {
    /// Rung since the consumer last woke.
    rung: bool,
    /// Consumers inside [`Doorbell::wait`].
    waiters: usize,
}

impl Doorbell {
    pub fn ring(&self) {
        let mut bell = self.bell.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A waiter checks `rung` under this lock before it sleeps, and sleeps releasing it: with none
        // inside `wait`, or the bell already rung (its waiters notified), there is no one to wake.
        let wake = !bell.rung && bell.waiters > 0;
        bell.rung = true;
        if wake {
            self.condvar.notify_all();
        }
    }

    /// Waits until rung or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let mut bell = self.bell.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        bell.waiters += 1;
        let (mut bell, _) = self
            .condvar
            .wait_timeout_while(bell, timeout, |bell| !bell.rung)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(bell.waiters > 0, "a waiter leaves the doorbell it entered");
        bell.waiters -= 1;
        bell.rung = false;
    }
}

pub(crate) struct Inner {
    pub(crate) store: Box<dyn Store>,
    pub(crate) config: EmbeddedConfig,
    /// Stage partitions by (stage, partition).
    pub(crate) partitions: BTreeMap<(StageKind, u32), Arc<RwLock<StagePartition>>>,
    pub(crate) doorbells: BTreeMap<String, Arc<Doorbell>>,
    ready: AtomicBool,
    stopping: AtomicBool,
    failure: Mutex<Option<String>>,
    /// The largest `at` ingested (the event clock of `ClockMode::Event` ticks), in milliseconds.
    ingested_at_max_ms: AtomicI64,
    /// Whether a statement connector consumes the outputs log (it counts in the lag only then).
    pub(crate) connector_attached: AtomicBool,
    /// Crawl requests applied and not yet committed, for the attached connector to ask the provider
    /// about while their round commits ([`Embedded::take_early_crawls`]); at most [`EARLY_CRAWLS_MAX`].
    early_crawls: Mutex<Vec<(Timestamp, pipelines::output::CrawlRequested)>>,
    /// Notified whenever `early_crawls` gets new requests.
    early_crawls_added: Arc<tokio::sync::Notify>,
    /// Whether this instance takes inputs (false: one of several instances sharing the partitions, not
    /// the one that ingests; see [`Embedded::refuse_ingestion`]).
    ingests: AtomicBool,
    /// Keeps a read model up to date (the Kafka + ScyllaDB profile), when one is attached.
    pub(crate) projector: Option<Arc<projector::Projector>>,
    /// The logs this instance processes, when instances share the partitions ([`Store::join`]); None:
    /// every one. Changed only under `gate`'s write lock.
    assigned: Option<RwLock<std::collections::BTreeSet<String>>>,
    /// Held (read) by a processing round from its first read to its commit, and (write) by a change of
    /// assignment: a revocation returns only once no round is in flight.
    gate: RwLock<()>,
    /// Rung by a processing thread that runs out of records, so that on the event clock the ticker
    /// ticks as soon as the pipeline has drained instead of at its next period ([`run_ticker`]).
    ticker_bell: Doorbell,
    /// Records applied again to restore partitions the group assigned, and the records those partitions
    /// had committed (the difference came from snapshots), summed over every take-over.
    taken_over_records: Mutex<(u64, u64)>,
}

/// A running embedded pipeline.
#[derive(Clone)]
pub struct Embedded {
    pub(crate) inner: Arc<Inner>,
    threads: Arc<Mutex<Vec<std::thread::JoinHandle<()>>>>,
}

impl Embedded {
    /// Opens the data directory, restores every stage partition from its log and starts the processing
    /// threads and the ticker.
    pub fn start(config: EmbeddedConfig) -> Result<Embedded, RuntimeError> {
        let store = RedbStore::open(&config.data_dir)?.with_metrics(Arc::clone(&config.metrics));
        Embedded::start_on(config, Box::new(store), None)
    }

    /// Runs the pipeline on any [`Store`]: the embedded one, or Kafka's (`crate::kafka`), whose data
    /// directory setting is then unused. With a read model, a projector thread keeps it equal to the
    /// stages' state ([`projector`]); it starts by projecting every key.
    pub fn start_on(
        config: EmbeddedConfig,
        store: Box<dyn Store>,
        read_model: Option<Arc<dyn crate::scylla::ReadModel>>,
    ) -> Result<Embedded, RuntimeError> {
        let inner = Embedded::restore_inner(config, store, read_model)?;
        let embedded = Embedded::restored(inner);
        embedded.spawn_threads()?;
        // Sharing the partitions, ready once the group's first assignment is restored (`take_over`).
        if embedded.inner.assigned.is_none() {
            embedded.inner.ready.store(true, Ordering::SeqCst);
        }
        Ok(embedded)
    }

    /// Opens the store's settings, restores every stage partition from its log (nothing is processed or
    /// committed) and marks every key for the projector, if there is one.
    fn restore_inner(
        config: EmbeddedConfig,
        store: Box<dyn Store>,
        read_model: Option<Arc<dyn crate::scylla::ReadModel>>,
    ) -> Result<Arc<Inner>, RuntimeError> {
        if config.partitions == 0 || config.partitions > PARTITIONS_MAX {
            return Err(RuntimeError::Fatal(format!("partitions must be 1..={PARTITIONS_MAX}")));
        }
        let store: Box<dyn Store> = store;
        let config = check_settings(store.as_ref(), config)?;
        let shared = store.shares_partitions();
        let mut partitions = BTreeMap::new();
        let mut doorbells = BTreeMap::new();
        // The logs one processing thread consumes share its doorbell (assigned as `worker_partitions`).
        let mut worker_doorbells: BTreeMap<usize, Arc<Doorbell>> = BTreeMap::new();
        // The event clock of the ticks is the largest `at` ingested, recovered from the logs (whether
        // processed or not). Not the stages' clocks: those also follow the connector's answers, which
        // may be stamped later than any input, and ticking at them would fire timers a run without
        // the restart never fires.
        let mut ingested_at_max_ms = 0;
        let mut observe = |record: &StageRecord| {
            if record.id.source == INGEST_SOURCE {
                ingested_at_max_ms = ingested_at_max_ms.max(record.at.millis());
            }
        };
        for kind in StageKind::ALL {
            for index in 0..config.partitions {
                let mut partition = new_partition(&config, kind, index);
                // Shared partitions are restored when the group assigns them.
                if !shared {
                    let restored = restore(
                        store.as_ref(),
                        &mut partition,
                        &config.engine,
                        config.batch_records_max,
                        &mut observe,
                    )?;
                    tracing::info!(stage = kind.name(), partition = index, records = restored, "restored");
                    scan_pending(store.as_ref(), &stage_log(kind, index), config.batch_records_max, &mut observe)?;
                }
                let worker = partitions.len() % config.processing_threads.max(1);
                partitions.insert((kind, index), Arc::new(RwLock::new(partition)));
                let doorbell = worker_doorbells.entry(worker).or_insert_with(|| Arc::new(Doorbell::default()));
                doorbells.insert(stage_log(kind, index), Arc::clone(doorbell));
            }
        }
        doorbells.insert(OUTPUTS_LOG.to_string(), Arc::new(Doorbell::default()));
        // Records before a snapshot are not read again: the store's own record of the largest `at`.
        let ingested_at_max_ms = ingested_at_max_ms.max(store.ingested_at_max_ms()?.unwrap_or(0));
        let inner = Arc::new(Inner {
            store,
            config,
            partitions,
            doorbells,
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            failure: Mutex::new(None),
            ingested_at_max_ms: AtomicI64::new(ingested_at_max_ms),
            connector_attached: AtomicBool::new(false),
            early_crawls: Mutex::new(Vec::new()),
            early_crawls_added: Arc::new(tokio::sync::Notify::new()),
            ingests: AtomicBool::new(true),
            projector: read_model.map(|model| Arc::new(projector::Projector::new(model))),
            assigned: shared.then(|| RwLock::new(std::collections::BTreeSet::new())),
            gate: RwLock::new(()),
            ticker_bell: Doorbell::default(),
            taken_over_records: Mutex::new((0, 0)),
        });
        if let Some(projector) = &inner.projector {
            projector.mark_all(&inner);
        }
        Ok(inner)
    }

    /// A pipeline whose partitions are restored and whose threads have not started.
    fn restored(inner: Arc<Inner>) -> Embedded {
        Embedded { inner, threads: Arc::new(Mutex::new(Vec::new())) }
    }

    fn spawn_threads(&self) -> Result<(), RuntimeError> {
        let mut threads = self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (worker, owned) in self.worker_partitions().into_iter().enumerate() {
            let inner = Arc::clone(&self.inner);
            let name = format!("worker-{worker}");
            let Some(doorbell) = owned.first().and_then(|(_, log)| self.inner.doorbells.get(log)).cloned() else {
                continue;
            };
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || stop_on_panic(&inner, &name, || run_worker(&inner, &owned, &doorbell)))
                .map_err(|error| RuntimeError::Fatal(format!("spawning a processing thread: {error}")))?;
            threads.push(thread);
        }
        if let Some(projector) = self.inner.projector.clone() {
            let inner = Arc::clone(&self.inner);
            let thread = std::thread::Builder::new()
                .name("projector".to_string())
                .spawn(move || {
                    stop_on_panic(&inner, "projector", || {
                        if let Err(error) = projector.run(&inner) {
                            tracing::error!(%error, "the projector stopped");
                            fail(&inner, format!("projector: {error}"));
                        }
                    })
                })
                .map_err(|error| RuntimeError::Fatal(format!("spawning the projector: {error}")))?;
            threads.push(thread);
        }
        let listener: Arc<dyn AssignmentListener> = Arc::new(Assignments { inner: Arc::downgrade(&self.inner) });
        if let Some(member) = self.inner.store.join(listener)? {
            let inner = Arc::clone(&self.inner);
            let thread = std::thread::Builder::new()
                .name("group-member".to_string())
                .spawn(move || stop_on_panic(&inner, "group-member", || run_member(&inner, member)))
                .map_err(|error| RuntimeError::Fatal(format!("spawning the group member: {error}")))?;
            threads.push(thread);
        }
        let inner = Arc::clone(&self.inner);
        let ticker = std::thread::Builder::new()
            .name("ticker".to_string())
            .spawn(move || stop_on_panic(&inner, "ticker", || run_ticker(&inner)))
            .map_err(|error| RuntimeError::Fatal(format!("spawning the ticker: {error}")))?;
        threads.push(ticker);
        Ok(())
    }

    /// The partitions of each processing thread (round-robin), with their logs.
    fn worker_partitions(&self) -> Vec<Vec<(Arc<RwLock<StagePartition>>, String)>> {
        let workers = self.inner.config.processing_threads.clamp(1, self.inner.partitions.len().max(1));
        let mut owned = vec![Vec::new(); workers];
        for (position, (&(kind, index), partition)) in self.inner.partitions.iter().enumerate() {
            owned[position % workers].push((Arc::clone(partition), stage_log(kind, index)));
        }
        owned
    }

    /// The logs this instance processes, when instances share the stage partitions (None: every one).
    pub fn assigned_logs(&self) -> Option<Vec<String>> {
        self.inner.assigned.as_ref().map(|assigned| read_lock(assigned).iter().cloned().collect())
    }

    /// Records applied again to restore the partitions the group assigned this instance, and the records
    /// those partitions had committed (the rest came from changelog snapshots), summed over take-overs.
    pub fn taken_over_records(&self) -> (u64, u64) {
        *self.inner.taken_over_records.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The failure that stopped processing, if any (the service exits on it and a restart recovers).
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Stops the threads after their current batch.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        for doorbell in self.inner.doorbells.values() {
            doorbell.ring();
        }
        self.inner.ticker_bell.ring();
        if let Some(projector) = &self.inner.projector {
            projector.doorbell.ring();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// The store (the connector loop commits through it).
    pub fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    pub fn config(&self) -> &EmbeddedConfig {
        &self.inner.config
    }

    /// Wakes the consumers of `logs` (after a commit that appended to them).
    pub fn ring(&self, logs: impl IntoIterator<Item = impl AsRef<str>>) {
        ring(&self.inner, logs)
    }

    /// Waits (up to `timeout`) for new outputs.
    pub fn wait_for_outputs(&self, timeout: Duration) {
        if let Some(doorbell) = self.inner.doorbells.get(OUTPUTS_LOG) {
            doorbell.wait(timeout)
        }
    }

    pub fn stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// Makes this instance refuse inputs: with instances sharing the partitions, one ingests (the
    /// ingestion index — event ids, positions, keys created — is kept by the instance that writes it,
    /// and two ingesting instances would hand out the same positions).
    pub fn refuse_ingestion(&self) {
        self.inner.ingests.store(false, Ordering::SeqCst);
    }

    /// Marks the outputs log as consumed by a statement connector (so its backlog counts as lag).
    pub fn attach_connector(&self) {
        self.inner.connector_attached.store(true, Ordering::SeqCst);
    }

    /// The crawl requests applied since the last call, before their round is committed: the connector
    /// may ask the provider about them early, and still appends each answer only once it has read the
    /// request from the outputs log (committed), as it does for any other.
    pub fn take_early_crawls(&self) -> Vec<(Timestamp, pipelines::output::CrawlRequested)> {
        std::mem::take(&mut *lock(&self.inner.early_crawls))
    }

    /// Notified whenever [`Embedded::take_early_crawls`] has new requests to give.
    pub fn early_crawls_added(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.inner.early_crawls_added)
    }
}

/// Hands `crawls` over as a processing thread does after applying a round (for the connector's tests).
#[cfg(test)]
pub(crate) fn publish_early_crawls(
    embedded: &Embedded,
    mut crawls: Vec<(Timestamp, pipelines::output::CrawlRequested)>,
) {
    hand_over_early_crawls(&embedded.inner, &mut crawls);
}

/// Crawl requests waiting for the connector to take them early; beyond this, later ones are asked only
/// once committed (bounds the list while no connector runs the loop that takes them).
const EARLY_CRAWLS_MAX: usize = 4_096;

/// Hands the crawl requests a round produced to the attached connector before the round commits, and
/// wakes it: the provider round trip then overlaps the commit (answer barrier, `docs/PERFORMANCE.md`).
fn hand_over_early_crawls(inner: &Inner, crawls: &mut Vec<(Timestamp, pipelines::output::CrawlRequested)>) {
    if crawls.is_empty() || !inner.connector_attached.load(Ordering::SeqCst) {
        crawls.clear();
        return;
    }
    let mut early = lock(&inner.early_crawls);
    let room = EARLY_CRAWLS_MAX.saturating_sub(early.len());
    // Draining empties the round's list whatever is kept of it.
    early.extend(crawls.drain(..).take(room));
    drop(early);
    inner.early_crawls_added.notify_one();
}

fn ring(inner: &Inner, logs: impl IntoIterator<Item = impl AsRef<str>>) {
    for log in logs {
        if let Some(doorbell) = inner.doorbells.get(log.as_ref()) {
            doorbell.ring();
        }
    }
}

/// Shows every record of `log` after its committed offset to `observe` (records appended and not yet
/// processed when the service stopped).
fn scan_pending(
    store: &dyn Store,
    log: &str,
    records_max: usize,
    observe: &mut dyn FnMut(&StageRecord),
) -> Result<(), RuntimeError> {
    let pending = store.committed(log)?..store.head(log)?;
    for_each_record(store, log, pending, records_max, &mut |record| observe(&record))
}

/// Runs a processing thread's body; a panic (a bug: the state it was applying to is now suspect)
/// stops the service like a fatal error, instead of leaving it up with a dead consumer.
fn stop_on_panic(inner: &Inner, name: &str, body: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        tracing::error!(thread = name, "processing thread panicked");
        fail(inner, format!("{name}: the processing thread panicked"));
    }
}

/// A stage partition as this configuration runs it (agent partitions with the answer barrier, if any).
fn new_partition(config: &EmbeddedConfig, kind: StageKind, index: u32) -> StagePartition {
    let partition = StagePartition::new(kind, index, config.partitions, config.engine.clone());
    match config.answer_delay_s {
        Some(answer_delay_s) => partition.with_answer_barrier(answer_delay_s),
        None => partition,
    }
}

/// Refuses a data directory created with another partition count (keys would land elsewhere) or other
/// engine settings (SPEC §8): state is rebuilt by replaying the logs, and the same records under other
/// settings would give another state than the one already acted on. The answer barrier follows the
/// same reasoning but is not chosen by a flag (it comes with the clock and the statement provider), so
/// the data directory's setting is adopted: returns the configuration to run with.
fn check_settings(store: &dyn Store, mut config: EmbeddedConfig) -> Result<EmbeddedConfig, RuntimeError> {
    // Read before the partition count is recorded: a data directory that has it and no barrier setting
    // was created before the barrier existed, and its logs were applied without it.
    let created = store.get(KeyValueTable::Meta, "partitions")?.is_some();
    let stored = store.get(KeyValueTable::Meta, ANSWER_BARRIER_SETTING)?;
    check_setting(store, "partitions", &config.partitions.to_string())?;
    check_setting(store, "engine_config", &format!("{:?}", config.engine))?;
    let answer_delay_s = match &stored {
        Some(value) => parse_answer_barrier_setting(value)?,
        None if created => None,
        None => config.answer_delay_s,
    };
    if stored.is_none() {
        store.put(KeyValueTable::Meta, ANSWER_BARRIER_SETTING, &answer_barrier_setting(answer_delay_s))?;
    }
    if answer_delay_s != config.answer_delay_s {
        tracing::warn!(
            created_with = %answer_barrier_setting(answer_delay_s),
            options_imply = %answer_barrier_setting(config.answer_delay_s),
            "the data directory keeps the answer barrier it was created with"
        );
    }
    config.answer_delay_s = answer_delay_s;
    Ok(config)
}

/// The key of the answer barrier in the settings a data directory was created with.
const ANSWER_BARRIER_SETTING: &str = "answer_barrier";

fn answer_barrier_setting(answer_delay_s: Option<i64>) -> String {
    match answer_delay_s {
        Some(seconds) => format!("{seconds}s"),
        None => "off".to_string(),
    }
}

fn parse_answer_barrier_setting(value: &str) -> Result<Option<i64>, RuntimeError> {
    if value == "off" {
        return Ok(None);
    }
    match value.strip_suffix('s').and_then(|seconds| seconds.parse().ok()) {
        Some(seconds) if seconds >= 0 => Ok(Some(seconds)),
        _ => {
            Err(RuntimeError::Fatal(format!("the data directory has an unreadable {ANSWER_BARRIER_SETTING} = {value}")))
        }
    }
}

fn check_setting(store: &dyn Store, key: &str, value: &str) -> Result<(), RuntimeError> {
    match store.get(KeyValueTable::Meta, key)? {
        Some(existing) if existing != value => Err(RuntimeError::Fatal(format!(
            "the data directory was created with {key} = {existing}; started with {value}"
        ))),
        Some(_) => Ok(()),
        None => store.put(KeyValueTable::Meta, key, value),
    }
}

/// One processing thread: each round applies a batch of every partition it owns and commits them all
/// in one transaction (group commit: a commit's fsync is the dominant cost, and partitions exchange
/// records in small groups). A failure after a batch was applied in memory stops the service; the next
/// start rebuilds state from the logs.
fn run_worker(inner: &Inner, owned: &[(Arc<RwLock<StagePartition>>, String)], doorbell: &Doorbell) {
    let stopped = if inner.assigned.is_some() {
        run_rounds(inner, owned, doorbell)
    } else {
        run_pipelined(inner, owned, doorbell)
    };
    if let Err(error) = stopped {
        tracing::error!(%error, "processing stopped");
        fail(inner, error.to_string());
    }
}

/// Applies a round, commits it, then reads again: with instances sharing the partitions, a round holds
/// the assignment gate until its commit is in, so no partition changes hands with a batch in flight.
fn run_rounds(
    inner: &Inner,
    owned: &[(Arc<RwLock<StagePartition>>, String)],
    doorbell: &Doorbell,
) -> Result<(), RuntimeError> {
    while !inner.stopping.load(Ordering::SeqCst) {
        if process_round(inner, owned)? == 0 {
            // Commits of this instance ring the doorbell; another instance's (sharing the partitions) do not.
            doorbell.wait(Duration::from_millis(SHARED_IDLE_WAIT_MS));
        }
    }
    Ok(())
}

/// Applies one batch of every owned partition and commits them together; returns the records consumed.
fn process_round(inner: &Inner, owned: &[(Arc<RwLock<StagePartition>>, String)]) -> Result<usize, RuntimeError> {
    let _gate = read_lock(&inner.gate);
    let mut from = committed_offsets(inner, owned)?;
    let (mut batch, consumed) = apply_round(inner, owned, &mut from)?;
    if consumed > 0 {
        let touched = std::mem::take(&mut batch.touched);
        let appended = commit_applied(inner.store.as_ref(), batch)?;
        committed(inner, &appended, touched);
    }
    Ok(consumed)
}

/// Each owned partition's committed offset: where its next round starts when none is in flight.
fn committed_offsets(inner: &Inner, owned: &[(Arc<RwLock<StagePartition>>, String)]) -> Result<Vec<u64>, RuntimeError> {
    owned.iter().map(|(_, log)| inner.store.committed(log)).collect()
}

/// Applies one batch of every owned (and assigned) partition, each from its offset in `from`, which it
/// moves past the records consumed; returns the round's batch to commit and the records consumed.
fn apply_round(
    inner: &Inner,
    owned: &[(Arc<RwLock<StagePartition>>, String)],
    from: &mut [u64],
) -> Result<(WriteBatch, usize), RuntimeError> {
    assert_eq!(owned.len(), from.len(), "one offset per owned partition");
    let mut batch = WriteBatch::default();
    let mut consumed = 0;
    for ((partition, log), from) in owned.iter().zip(from.iter_mut()) {
        if !inner.is_assigned(log) {
            continue;
        }
        let records = apply_batch_from(
            inner.store.as_ref(),
            partition,
            inner.config.partitions,
            inner.config.batch_records_max,
            *from,
            &mut batch,
        )
        .map_err(|error| RuntimeError::Fatal(format!("{log}: {error}")))?;
        *from += records as u64;
        consumed += records;
    }
    inner.config.metrics.applied(&batch.applied);
    hand_over_early_crawls(inner, &mut batch.crawls);
    Ok((batch, consumed))
}

/// After a round's commit: wakes the consumers of the logs it appended to, and has the projector write
/// the views of the keys it touched.
fn committed(inner: &Inner, appended: &BTreeSet<String>, touched: Vec<(StageKind, pipelines::Text)>) {
    ring(inner, appended);
    if let Some(projector) = &inner.projector {
        projector.mark(touched);
    }
}

/// A round commits on this thread's committer while the next round is applied: the thread no longer
/// waits out each commit (its fsync, and the other committers' groups ahead of it), which took about
/// three quarters of a processing thread's time in the serve benchmark. Up to
/// [`ROUNDS_IN_FLIGHT_MAX`] rounds are in flight; each is applied from the offsets the ones in flight
/// move its logs to, and is handed over in round order, so commits stay in round order and the
/// consumer offsets only move forward (each batch names the offsets it consumed from, and the embedded
/// store refuses one whose consumer is elsewhere: a round behind a failed one fails with it). State in
/// memory runs ahead of the store by up to three rounds; a crash loses them, and the next start applies
/// their records again from the logs (nothing they produced was visible: consumers read committed
/// records only). Used when this instance owns every partition; with instances sharing them,
/// [`run_rounds`].
fn run_pipelined(
    inner: &Inner,
    owned: &[(Arc<RwLock<StagePartition>>, String)],
    doorbell: &Doorbell,
) -> Result<(), RuntimeError> {
    let mut from = committed_offsets(inner, owned)?;
    let (rounds, to_commit) = std::sync::mpsc::sync_channel::<HandedRound>(ROUNDS_IN_FLIGHT_MAX);
    let (outcomes, commit_outcomes) = std::sync::mpsc::sync_channel::<Result<(), RuntimeError>>(ROUNDS_IN_FLIGHT_MAX);
    std::thread::scope(|scope| {
        let committer = std::thread::Builder::new()
            .name("committer".to_string())
            .spawn_scoped(scope, move || commit_rounds(inner, to_commit, outcomes));
        if let Err(error) = committer {
            return Err(RuntimeError::Fatal(format!("spawning a committer thread: {error}")));
        }
        let mut in_flight = 0;
        let stopped = loop {
            if inner.stopping.load(Ordering::SeqCst) {
                break Ok(());
            }
            let (batch, consumed) = match apply_round(inner, owned, &mut from) {
                Ok(round) => round,
                Err(error) => break Err(error),
            };
            // Full, or nothing to apply while rounds commit: wait for the oldest round in flight.
            let wait = in_flight == ROUNDS_IN_FLIGHT_MAX || (consumed == 0 && in_flight > 0);
            let mut arrived = Vec::new();
            if wait {
                match commit_outcomes.recv() {
                    Ok(outcome) => arrived.push(outcome),
                    Err(_) => break Err(RuntimeError::Fatal("the committer thread stopped".to_string())),
                }
            }
            arrived.extend(commit_outcomes.try_iter().take(in_flight - arrived.len()));
            in_flight -= arrived.len();
            if let Some(error) = arrived.into_iter().find_map(Result::err) {
                break Err(error);
            }
            if consumed > 0 {
                if rounds.send(HandedRound::new(inner, batch)).is_err() {
                    break Err(RuntimeError::Fatal("the committer thread stopped".to_string()));
                }
                in_flight += 1;
            } else if !wait {
                // Nothing to apply and nothing committing: wait for a commit (of any thread) to ring.
                if inner.ticks_early() {
                    inner.ticker_bell.ring();
                }
                doorbell.wait(Duration::from_millis(IDLE_WAIT_MS));
            }
        };
        // A stop lets the rounds in flight commit, as sequential rounds would have, and reports a failure.
        drop(rounds);
        let last_commits = commit_outcomes.iter().take(in_flight).find(Result::is_err).unwrap_or(Ok(()));
        stopped.and(last_commits)
    })
}

/// Rounds a processing thread has handed to its committer and not yet seen committed. Two let a round
/// be queued in the store while the one before is written, so it joins the next group with the other
/// threads' batches instead of waiting for its turn (with the connector's four batches, ≈ 13 % more
/// events/s in the serve benchmark than one each; three rounds measured alike).
const ROUNDS_IN_FLIGHT_MAX: usize = 2;

/// A round on its way to the committer, with the logs it appends to and the keys it touched.
struct HandedRound {
    batch: HandedBatch,
    appended: BTreeSet<String>,
    touched: Vec<(StageKind, pipelines::Text)>,
}

impl HandedRound {
    fn new(inner: &Inner, mut batch: WriteBatch) -> HandedRound {
        let touched = std::mem::take(&mut batch.touched);
        let appended = appended_logs(&batch);
        HandedRound { batch: HandedBatch::new(inner.store.as_ref(), batch), appended, touched }
    }
}

/// The committer of [`run_pipelined`]: waits for each round's commit in order, then wakes the logs'
/// consumers and reports the outcome; stops at the first failure.
fn commit_rounds(
    inner: &Inner,
    rounds: std::sync::mpsc::Receiver<HandedRound>,
    outcomes: std::sync::mpsc::SyncSender<Result<(), RuntimeError>>,
) {
    for round in rounds {
        let outcome =
            round.batch.wait_applied(inner.store.as_ref()).map(|()| committed(inner, &round.appended, round.touched));
        let failed = outcome.is_err();
        if outcomes.send(outcome).is_err() || failed {
            return;
        }
    }
}

fn fail(inner: &Inner, message: String) {
    // The first failure is the cause; later ones are usually its consequences.
    inner.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(message);
    inner.ready.store(false, Ordering::SeqCst);
    inner.stopping.store(true, Ordering::SeqCst);
}

/// Serves the group until the pipeline stops, then leaves it (the partitions are revoked first).
fn run_member(inner: &Inner, mut member: Box<dyn crate::runtime::GroupMember>) {
    while !inner.stopping.load(Ordering::SeqCst) {
        if let Err(error) = member.poll(Duration::from_millis(100)) {
            tracing::error!(%error, "the group member stopped");
            fail(inner, format!("group member: {error}"));
        }
    }
    member.leave();
}

/// Applies the group's decisions about this instance's partitions (see [`AssignmentListener`]).
struct Assignments {
    inner: std::sync::Weak<Inner>,
}

impl AssignmentListener for Assignments {
    fn revoked(&self, logs: &[String]) {
        let Some(inner) = self.inner.upgrade() else { return };
        // Waits for the round in flight of every processing thread: it commits before this returns.
        let _gate = crate::runtime::write_lock(&inner.gate);
        if let Some(assigned) = &inner.assigned {
            crate::runtime::write_lock(assigned).retain(|log| !logs.contains(log));
        }
    }

    fn assigned(&self, logs: &[String]) {
        let Some(inner) = self.inner.upgrade() else { return };
        if let Err(error) = take_over(&inner, logs) {
            tracing::error!(%error, "taking over partitions");
            fail(&inner, format!("taking over partitions: {error}"));
        }
    }
}

/// Makes `logs` this instance's whole assignment: each partition restored from what was committed (by
/// whichever instance owned it), every other partition emptied (its state is another instance's).
fn take_over(inner: &Inner, logs: &[String]) -> Result<(), RuntimeError> {
    if let Some(assigned) = &inner.assigned {
        let _gate = crate::runtime::write_lock(&inner.gate);
        crate::runtime::write_lock(assigned).clear();
    }
    inner.store.forget(logs)?;
    let config = &inner.config;
    for (&(kind, index), slot) in &inner.partitions {
        let log = stage_log(kind, index);
        let mut partition = new_partition(config, kind, index);
        if logs.contains(&log) {
            let restored =
                restore(inner.store.as_ref(), &mut partition, &config.engine, config.batch_records_max, &mut |_| {})?;
            let committed = inner.store.committed(&log)?;
            tracing::info!(log, records = restored, committed, "partition taken over");
            let mut counts = inner.taken_over_records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *counts = (counts.0 + restored, counts.1 + committed);
        }
        *crate::runtime::write_lock(slot) = partition;
    }
    // Restored: ready (from the first assignment on), before the partitions are processed.
    if !inner.stopping.load(Ordering::SeqCst) {
        inner.ready.store(true, Ordering::SeqCst);
    }
    if let Some(assigned) = &inner.assigned {
        let _gate = crate::runtime::write_lock(&inner.gate);
        *crate::runtime::write_lock(assigned) = logs.iter().cloned().collect();
    }
    if let Some(projector) = &inner.projector {
        // Another instance wrote these partitions' rows meanwhile: every key is projected again.
        projector.take_over(inner);
    }
    ring(inner, logs);
    Ok(())
}

/// Appends a `tick` to every partition with a timer due (SPEC §3: timers fire on quiet partitions),
/// every `tick_interval_ms`.
///
/// On the event clock, and when this instance owns every partition, it also ticks as soon as the
/// pipeline has drained: time moves only with ingestion there, so once every record is applied the one
/// tick still owed (at the largest `at` ingested) would otherwise wait out the period, up to 100 ms in
/// which nothing else can happen (`docs/DECISIONS.md`, "Ticks"). A processing thread that runs out of
/// records rings the ticker; the ticker ticks early only with every log drained and the clock moved
/// since its last early tick, so it ticks early at most once per ingested time.
fn run_ticker(inner: &Inner) {
    // The id of the last tick appended to each partition.
    let mut last_ticks: BTreeMap<(StageKind, u32), (u64, u32)> = BTreeMap::new();
    let period = Duration::from_millis(inner.config.tick_interval_ms);
    let ticks_early = inner.ticks_early();
    let mut next_period = std::time::Instant::now() + period;
    let mut last_early_ms: Option<i64> = None;
    while !inner.stopping.load(Ordering::SeqCst) {
        let waited = next_period.saturating_duration_since(std::time::Instant::now());
        if !waited.is_zero() {
            inner.ticker_bell.wait(waited);
        }
        if inner.stopping.load(Ordering::SeqCst) {
            break;
        }
        let now_ms = ticker_now_ms(inner);
        let woken = std::time::Instant::now();
        if woken >= next_period {
            next_period = woken + period;
        } else if ticks_early && last_early_ms < Some(now_ms) && reads::drained(inner) {
            last_early_ms = Some(now_ms);
        } else {
            continue; // woken early with records still to apply, or this time already ticked early
        }
        if let Err(error) = tick(inner, now_ms, &mut last_ticks) {
            tracing::warn!(%error, "tick not appended");
        }
    }
}

/// The time the ticker ticks at: the wall clock, or (event clock) the largest `at` ingested.
pub(crate) fn ticker_now_ms(inner: &Inner) -> i64 {
    match inner.config.clock {
        ClockMode::System => system_now().millis(),
        ClockMode::Event => {
            if inner.assigned.is_some() {
                // Sharing the partitions, another instance may be the one ingesting: the store knows.
                if let Ok(Some(at_ms)) = inner.store.ingested_at_max_ms() {
                    inner.ingested_at_max_ms.fetch_max(at_ms, Ordering::SeqCst);
                }
            }
            inner.ingested_at_max_ms.load(Ordering::SeqCst)
        }
    }
}

/// The partitions with a timer due at `now_ms` (the ticker owes each a tick).
pub(crate) fn partitions_due(inner: &Inner, now_ms: i64) -> u64 {
    let due = |partition: &RwLock<StagePartition>| {
        read_lock(partition).next_timer_due().is_some_and(|due| due.millis() <= now_ms)
    };
    let assigned = |&(kind, index): &(StageKind, u32)| inner.is_assigned(&stage_log(kind, index));
    inner.partitions.iter().filter(|(key, partition)| assigned(key) && due(partition)).count() as u64
}

/// The id of the next tick for a partition that last applied tick `applied` and was last sent tick
/// `last`: after both, and at `now_ms` unless an earlier tick already carries a later time (a wall
/// clock gone back) — ids only move forward, or the partition would drop the tick as a duplicate.
fn next_tick_id(now_ms: i64, applied: Option<(u64, u32)>, last: Option<(u64, u32)>) -> (u64, u32) {
    let now = u64::try_from(now_ms).unwrap_or(0);
    match applied.max(last) {
        Some((offset, index)) if offset >= now => (offset, index + 1),
        _ => (now, 0),
    }
}

fn tick(
    inner: &Inner,
    now_ms: i64,
    last_ticks: &mut BTreeMap<(StageKind, u32), (u64, u32)>,
) -> Result<(), RuntimeError> {
    let mut batch = WriteBatch::default();
    let mut sent = Vec::new();
    for (&(kind, index), partition) in &inner.partitions {
        if !inner.is_assigned(&stage_log(kind, index)) {
            continue;
        }
        let (due, applied) = {
            let partition = read_lock(partition);
            (partition.next_timer_due(), partition.last_applied(TICKER_SOURCE))
        };
        if due.is_none_or(|due| due.millis() > now_ms) {
            continue;
        }
        let last = last_ticks.get(&(kind, index)).copied();
        // The last tick is still on its way: it fires what is due when applied.
        if last.is_some_and(|last| applied < Some(last)) {
            continue;
        }
        // Another tick at the same time is needed when a timer due by then was set after the last
        // tick was applied (by a message stamped earlier); its id must differ from the last one's.
        let id = next_tick_id(now_ms, applied, last);
        let record = StageRecord {
            id: RecordId { source: TICKER_SOURCE.into(), offset: id.0, index: id.1 },
            at: Timestamp::from_millis(now_ms),
            body: RecordBody::Tick,
        };
        batch.append_stage_record(stage_log_name(kind, index), record)?;
        sent.push(((kind, index), id));
    }
    if batch.appends.is_empty() {
        return Ok(());
    }
    let logs = appended_logs(&batch);
    inner.store.commit(batch)?;
    last_ticks.extend(sent);
    ring(inner, &logs);
    Ok(())
}

/// The ids an input creates, as (key, owner): shared keys ([`Ingested::keys`], first creation wins)
/// and keys owned forever ([`Ingested::exclusive_keys`]: a card by its agent, SPEC §4).
fn created_keys(command: &pipelines::input::Command) -> (KeyOwners, KeyOwners) {
    use pipelines::input::Command;
    let shared = match command {
        Command::CollectionCreated(created) => {
            vec![(ingestion_key("order", &created.order_id).into(), created.merchant_id.to_string())]
        }
        Command::PayoutCreated(created) => {
            vec![(ingestion_key("order", &created.order_id).into(), created.merchant_id.to_string())]
        }
        Command::UserRegistered(registered) => vec![(ingestion_key("user", &registered.user_id).into(), String::new())],
        Command::MerchantRegistered(registered) => {
            vec![(ingestion_key("merchant", &registered.merchant_id).into(), String::new())]
        }
        _ => Vec::new(),
    };
    let exclusive = match command {
        Command::CardBound(bound) => vec![(ingestion_key("card", &bound.card_id).into(), bound.user_id.to_string())],
        _ => Vec::new(),
    };
    (shared, exclusive)
}

/// `kind:id`, the key ingestion records an owner under. Built without `format!` (`pipelines::joined`),
/// inline for keys up to 24 bytes: every ingested input and every check of an id makes one.
fn ingestion_key(kind: &str, id: &str) -> pipelines::Text {
    pipelines::joined(kind, ':', id)
}

/// A key whose owner both ingestion and a partition's state record ([`Inner::owner_in`]): its kind in
/// the ingested keys (`kind:id`, as [`created_keys`] records it) paired with the partition read that
/// finds the same owner, so a lookup cannot name one and read the other.
struct OwnedKind {
    kind: &'static str,
    partition_read: fn(&Inner, &str) -> Option<String>,
}

/// An order's merchant.
const ORDER_MERCHANT: OwnedKind = OwnedKind { kind: "order", partition_read: reads::order_merchant };
/// A card's agent.
const CARD_OWNER: OwnedKind = OwnedKind { kind: "card", partition_read: reads::card_owner };

/// The wall clock as event time (only the runtime reads it; the stages never do).
pub fn system_now() -> Timestamp {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_millis(millis)
}

impl Inner {
    /// Whether the ticker also ticks as soon as the pipeline has drained ([`run_ticker`]): on the event
    /// clock, when this instance owns every partition. Only then do the processing threads ring it.
    fn ticks_early(&self) -> bool {
        self.config.clock == ClockMode::Event && self.assigned.is_none()
    }

    /// Whether this instance processes `log` (always, unless instances share the partitions).
    fn is_assigned(&self, log: &str) -> bool {
        self.assigned.as_ref().is_none_or(|assigned| read_lock(assigned).contains(log))
    }

    /// Encodes an input as the records it becomes: one for its stage partition, or a tick for every
    /// partition.
    fn ingested(&self, input: Input, position: u64) -> Result<Ingested, RuntimeError> {
        let (keys, exclusive_keys) = created_keys(&input.command);
        let at_ms = Some(input.at.millis());
        let (records, stage_records) = self.records_of(input, position)?;
        Ok(Ingested { records, stage_records, keys, exclusive_keys, at_ms })
    }

    /// A reader for one request's (or one call's) lookups; None when the store cannot open one, and
    /// then every lookup through it finds nothing, as a failed lookup does.
    fn ingestion_reader(&self) -> Option<Box<dyn IngestionReader + '_>> {
        self.store.ingestion_reader().ok()
    }

    /// The owner ingestion recorded for `kind:id`.
    fn ingested_owner_in(&self, reader: Option<&dyn IngestionReader>, kind: &str, id: &str) -> Option<String> {
        reader.and_then(|reader| reader.ingested_key(&ingestion_key(kind, id)).ok().flatten())
    }

    fn ingested_owner(&self, kind: &str, id: &str) -> Option<String> {
        self.ingested_owner_in(self.ingestion_reader().as_deref(), kind, id)
    }

    /// The owner of `owned`'s `id` (an order's merchant, a card's agent) from the keys ingestion
    /// recorded, and from the partitions' state only when there is none and `in_partitions` says so.
    /// The keys answer without the partitions' locks, which a processing thread holds while it applies
    /// a round. Both name the same owner: it is recorded once, by the input that created the order or
    /// bound the card, and never changes. The instance that ingests checks its requests against the
    /// keys alone (`in_partitions` false: [`EmbeddedChecks::partition_fallback`]).
    fn owner_in(
        &self,
        reader: Option<&dyn IngestionReader>,
        owned: &OwnedKind,
        id: &str,
        in_partitions: bool,
    ) -> Option<String> {
        let ingested = self.ingested_owner_in(reader, owned.kind, id);
        ingested.or_else(|| in_partitions.then(|| (owned.partition_read)(self, id)).flatten())
    }

    /// The stage records an input is appended as, encoded and as made.
    fn records_of(&self, input: Input, position: u64) -> Result<(Records, Vec<(usize, StageRecord)>), RuntimeError> {
        let id = |index: u32| RecordId { source: INGEST_SOURCE.into(), offset: position, index };
        let at = input.at;
        let made = match route_input(input) {
            Routed::Message(message) => {
                let (kind, key) = pipelines::partition::destination(&message);
                let log = stage_log_name(kind, pipelines::partition::partition_of(key, self.config.partitions));
                vec![(log, StageRecord { id: id(0), at, body: RecordBody::Message { message } })]
            }
            Routed::Broadcast => {
                let ticks = self.partitions.keys().enumerate().map(|(index, &(kind, partition))| {
                    (stage_log_name(kind, partition), StageRecord { id: id(index as u32), at, body: RecordBody::Tick })
                });
                ticks.collect()
            }
            Routed::Wallet(command) => {
                return Err(RuntimeError::Invalid(format!(
                    "`{}` belongs to the statement provider, not the pipeline",
                    command.type_name()
                )))
            }
        };
        let mut records = Vec::with_capacity(made.len());
        let mut stage_records = Vec::with_capacity(made.len());
        for (log, record) in made {
            push_stage_record(&mut records, &mut stage_records, log, record)?;
        }
        Ok((records, stage_records))
    }
}

/// One request's ingestion checks, from one read transaction of the store.
struct EmbeddedChecks<'a> {
    inner: &'a Inner,
    reader: Option<Box<dyn IngestionReader + 'a>>,
    /// Whether an order's merchant and a card's agent not among the ingested keys are looked for in the
    /// partitions' state too: only on an instance that does not ingest (`--no-ingest`), whose keys are
    /// the ones it read from the store and may lag another instance's ingestion. An instance that
    /// ingests recorded every key itself, with the input that created it (see
    /// [`Embedded::ingestion_checks`]).
    partition_fallback: bool,
}

impl IngestionChecks for EmbeddedChecks<'_> {
    fn event_position(&self, event_id: &str) -> Option<u64> {
        self.reader.as_ref().and_then(|reader| reader.event_position(event_id).ok().flatten())
    }

    fn order_merchant(&self, order_id: &str) -> Option<String> {
        self.inner.owner_in(self.reader.as_deref(), &ORDER_MERCHANT, order_id, self.partition_fallback)
    }

    fn user_exists(&self, user_id: &str) -> bool {
        self.inner.ingested_owner_in(self.reader.as_deref(), "user", user_id).is_some()
    }

    fn merchant_exists(&self, merchant_id: &str) -> bool {
        self.inner.ingested_owner_in(self.reader.as_deref(), "merchant", merchant_id).is_some()
    }

    fn card_owner(&self, card_id: &str) -> Option<String> {
        self.inner.owner_in(self.reader.as_deref(), &CARD_OWNER, card_id, self.partition_fallback)
    }
}

impl PipelineHandle for Embedded {
    fn append(&self, inputs: Vec<Input>) -> Result<Vec<Appended>, RuntimeError> {
        if self.stopping() {
            return Err(RuntimeError::ShuttingDown);
        }
        if !self.inner.ingests.load(Ordering::SeqCst) {
            return Err(RuntimeError::Retryable(
                "this instance does not ingest (--no-ingest): send inputs to the instance that does".to_string(),
            ));
        }
        let event_ids: Vec<pipelines::Text> = inputs.iter().map(|input| input.event_id.clone()).collect();
        let event_id_refs: Vec<&str> = event_ids.iter().map(pipelines::Text::as_str).collect();
        let ats: Vec<i64> = inputs.iter().map(|input| input.at.millis()).collect();
        // Each input is moved into its records once the store asks for it (no copy on this hot path).
        let mut pending: Vec<Option<Input>> = inputs.into_iter().map(Some).collect();
        // Each log once, however many of the request's records it got (a ring is a lock and a wake).
        let mut logs = BTreeSet::new();
        let outcomes = self.inner.store.ingest(&event_id_refs, &mut |index, position| {
            let input = pending.get_mut(index).and_then(Option::take);
            let input = input.ok_or_else(|| RuntimeError::Fatal(format!("input {index} asked for twice")))?;
            let ingested = self.inner.ingested(input, position)?;
            // Log names are inline (`LogName`): cloning one to try the insert allocates nothing.
            logs.extend(ingested.records.iter().map(|(log, _)| log.clone()));
            Ok(ingested)
        })?;
        // Only inputs appended now move the event clock: a duplicate's `at` is not in the logs, so a
        // restart, which recovers the clock from them, would not see it.
        let appended = ats.iter().zip(&outcomes).filter(|(_, outcome)| matches!(outcome, Appended::New { .. }));
        if let Some(at) = appended.map(|(at, _)| *at).max() {
            self.inner.ingested_at_max_ms.fetch_max(at, Ordering::SeqCst);
        }
        ring(&self.inner, &logs);
        Ok(outcomes)
    }

    fn event_position(&self, event_id: &str) -> Option<u64> {
        self.inner.store.event_position(event_id).ok().flatten()
    }

    fn order(&self, order_id: &str) -> Option<serde_json::Value> {
        reads::order(&self.inner, order_id)
    }

    fn ingestion_checks(&self) -> Box<dyn IngestionChecks + '_> {
        // The instance that ingests recorded the key of every order and card binding it ingested
        // (`created_keys`), with the input: its checks need no partition's lock, which a processing
        // thread holds for a whole round. A new order's id, not yet a key, used to wait for one
        // (`docs/DECISIONS.md`, "Ingestion checks a request from one read transaction").
        let partition_fallback = !self.inner.ingests.load(Ordering::SeqCst);
        Box::new(EmbeddedChecks { inner: &self.inner, reader: self.inner.ingestion_reader(), partition_fallback })
    }

    fn order_merchant(&self, order_id: &str) -> Option<String> {
        self.inner.owner_in(self.inner.ingestion_reader().as_deref(), &ORDER_MERCHANT, order_id, true)
    }

    fn user_exists(&self, user_id: &str) -> bool {
        self.inner.ingested_owner("user", user_id).is_some()
    }

    fn merchant_exists(&self, merchant_id: &str) -> bool {
        self.inner.ingested_owner("merchant", merchant_id).is_some()
    }

    fn user(&self, user_id: &str) -> Option<serde_json::Value> {
        reads::user(&self.inner, user_id)
    }

    fn user_journal(&self, user_id: &str, after_seq: u64, limit: usize) -> Option<crate::runtime::Page> {
        reads::user_journal(&self.inner, user_id, after_seq, limit)
    }

    fn user_bill_table(&self, user_id: &str, cursor: Option<&str>, limit: usize) -> Option<crate::runtime::Page> {
        reads::user_bill_table(&self.inner, user_id, cursor, limit)
    }

    fn merchant(&self, merchant_id: &str) -> Option<serde_json::Value> {
        reads::merchant(&self.inner, merchant_id)
    }

    fn merchant_journal(&self, merchant_id: &str, after_seq: u64, limit: usize) -> Option<crate::runtime::Page> {
        reads::merchant_journal(&self.inner, merchant_id, after_seq, limit)
    }

    fn review_queue(&self, cursor: Option<&str>, limit: usize) -> crate::runtime::Page {
        reads::review_queue(&self.inner, cursor, limit)
    }

    fn card_owner(&self, card_id: &str) -> Option<String> {
        self.inner.owner_in(self.inner.ingestion_reader().as_deref(), &CARD_OWNER, card_id, true)
    }

    fn snapshot(&self) -> serde_json::Value {
        reads::snapshot(&self.inner)
    }

    fn lag_report(&self) -> crate::runtime::LagReport {
        reads::lag_report(&self.inner)
    }

    fn ready(&self) -> bool {
        self.inner.ready.load(Ordering::SeqCst)
    }

    fn put_merchant_key(&self, key_sha256_hex: &str, merchant_id: &str) -> Result<(), RuntimeError> {
        self.inner.store.put(KeyValueTable::MerchantKeys, key_sha256_hex, merchant_id)
    }

    fn merchant_of_key(&self, key_sha256_hex: &str) -> Option<String> {
        self.inner.store.get(KeyValueTable::MerchantKeys, key_sha256_hex).ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiters(doorbell: &Doorbell) -> usize {
        doorbell.bell.lock().expect("the bell").waiters
    }

    #[test]
    fn a_doorbell_keeps_a_ring_nobody_waited_for_and_wakes_a_sleeping_consumer() {
        let doorbell = Arc::new(Doorbell::default());
        // Rung with no one waiting (no notification): the next wait returns at once.
        doorbell.ring();
        doorbell.ring();
        let started = std::time::Instant::now();
        doorbell.wait(Duration::from_secs(60));
        assert!(started.elapsed() < Duration::from_secs(30), "a ring before the wait was lost");
        assert_eq!(waiters(&doorbell), 0);
        // Consumed: the next wait sleeps until its timeout.
        let started = std::time::Instant::now();
        doorbell.wait(Duration::from_millis(50));
        assert!(started.elapsed() >= Duration::from_millis(50), "a ring was counted twice");
        // A consumer asleep on the bell is woken by a ring.
        let sleeper = {
            let doorbell = Arc::clone(&doorbell);
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                doorbell.wait(Duration::from_secs(60));
                started.elapsed()
            })
        };
        while waiters(&doorbell) == 0 {
            std::thread::yield_now();
        }
        doorbell.ring();
        let slept = sleeper.join().expect("the sleeper");
        assert!(slept < Duration::from_secs(30), "the sleeper was not woken: {slept:?}");
        assert_eq!(waiters(&doorbell), 0);
    }

    #[test]
    fn a_data_directory_keeps_the_answer_barrier_it_was_created_with() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = |answer_delay_s| EmbeddedConfig {
            answer_delay_s,
            ..EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event)
        };
        let open = || -> Box<dyn Store> { Box::new(store::RedbStore::open(directory.path()).expect("opens")) };
        let barriers = |inner: &Inner| -> Vec<(StageKind, Option<i64>)> {
            let delay = |partition: &RwLock<StagePartition>| read_lock(partition).answer_barrier().map(|_| 1);
            inner.partitions.iter().map(|((kind, _), partition)| (*kind, delay(partition))).collect()
        };
        let inner = Embedded::restore_inner(config(Some(1)), open(), None).expect("created");
        for (kind, delay) in barriers(&inner) {
            assert_eq!(delay.is_some(), kind == StageKind::Agent, "{kind:?}: only agent partitions ask crawls");
        }
        assert_eq!(inner.config.answer_delay_s, Some(1));
        drop(inner);
        // Applying the same logs without the barrier would give another state than the one acted on:
        // a start whose options imply none keeps the data directory's.
        let inner = Embedded::restore_inner(config(None), open(), None).expect("restarted");
        assert_eq!(inner.config.answer_delay_s, Some(1));
        assert!(barriers(&inner).iter().any(|(_, delay)| delay.is_some()));
        drop(inner);

        // A data directory created before the setting existed was applied without a barrier.
        let legacy = tempfile::tempdir().expect("a temporary directory");
        let store = store::RedbStore::open(legacy.path()).expect("opens");
        store.put(KeyValueTable::Meta, "partitions", "2").expect("written");
        let legacy_config = EmbeddedConfig {
            answer_delay_s: Some(1),
            ..EmbeddedConfig::new(legacy.path().to_path_buf(), ClockMode::Event)
        };
        let inner = Embedded::restore_inner(legacy_config, Box::new(store), None).expect("restarted");
        assert_eq!(inner.config.answer_delay_s, None);
        assert!(barriers(&inner).iter().all(|(_, delay)| delay.is_none()));
    }

    /// The workload's inputs for the pipeline (its wallet events go to the provider).
    fn pipeline_inputs(agents: usize, rounds: usize) -> Vec<Input> {
        let inputs = pipelines::workload::workload(agents, rounds).into_iter();
        inputs.filter(|input| !input.command.type_name().starts_with("wallet_")).collect()
    }

    fn wait_until_processed(embedded: &Embedded) {
        let started = std::time::Instant::now();
        while embedded.lag() > 0 {
            assert!(started.elapsed() < Duration::from_secs(60), "still {} records to process", embedded.lag());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// On the event clock the tick owed once every record is applied (timers due at or before the
    /// largest `at` ingested) comes as soon as the pipeline has drained: with the ticker's period set
    /// to an hour, the lag still reaches 0, and the partitions applied ticks.
    #[test]
    fn on_the_event_clock_the_ticker_ticks_once_drained_without_waiting_for_its_period() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = EmbeddedConfig {
            tick_interval_ms: 3_600_000,
            ..EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event)
        };
        let embedded = Embedded::start(config).expect("starts");
        embedded.append(pipeline_inputs(6, 1)).expect("appended");
        wait_until_processed(&embedded);
        let ticked =
            |partition: &Arc<RwLock<StagePartition>>| read_lock(partition).last_applied(TICKER_SOURCE).is_some();
        let partitions_ticked = embedded.inner.partitions.values().filter(|partition| ticked(partition)).count();
        assert!(partitions_ticked > 0, "timers came due by the last input, and a tick fired them");
        embedded.stop();
    }

    /// The lag names the logs records wait in: appended before any processing thread runs, each
    /// input waits in the log of its key's partition and counts in that log's figure. The outputs log
    /// counts only once a connector consumes it; once the stages have processed everything, their
    /// logs' figures are 0 and the outputs no connector has read are the whole lag.
    #[test]
    fn the_lag_is_reported_by_the_log_records_wait_in() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        let store = store::RedbStore::open(directory.path()).expect("opens");
        let inner = Embedded::restore_inner(config, Box::new(store), None).expect("restored");
        let embedded = Embedded::restored(inner);
        let inputs = pipeline_inputs(6, 1);
        embedded.append(inputs.clone()).expect("appended");

        let report = embedded.lag_report();
        let stage_logs: Vec<String> =
            embedded.inner.partitions.keys().map(|&(kind, index)| stage_log(kind, index)).collect();
        // Every stage log, and no outputs log while no connector consumes it.
        let mut expected: BTreeMap<String, u64> = stage_logs.iter().map(|log| (log.clone(), 0)).collect();
        for input in &inputs {
            let Routed::Message(message) = route_input(input.clone()) else { panic!("keyed inputs only") };
            let (kind, key) = pipelines::partition::destination(&message);
            let partition = pipelines::partition::partition_of(key, embedded.inner.config.partitions);
            *expected.entry(stage_log(kind, partition)).or_default() += 1;
        }
        assert_eq!(report.logs, expected);
        assert_eq!(report.total(), inputs.len() as u64 + report.timers_due + report.unprojected);
        // Behind the clock (the latest `at` ingested) by the time of each log's first input.
        let now_ms = inputs.iter().map(|input| input.at.millis()).max().expect("inputs");
        let mut expected_lag_ms: BTreeMap<String, u64> = stage_logs.iter().map(|log| (log.clone(), 0)).collect();
        for input in inputs.iter().rev() {
            let Routed::Message(message) = route_input(input.clone()) else { panic!("keyed inputs only") };
            let (kind, key) = pipelines::partition::destination(&message);
            let partition = pipelines::partition::partition_of(key, embedded.inner.config.partitions);
            expected_lag_ms.insert(stage_log(kind, partition), (now_ms - input.at.millis()) as u64);
        }
        assert_eq!(report.lag_ms, expected_lag_ms);
        assert!(report.lag_ms.values().any(|lag_ms| *lag_ms > 0), "inputs span time: {report:?}");

        embedded.attach_connector();
        assert_eq!(embedded.lag_report().logs.get(OUTPUTS_LOG), Some(&0), "nothing asked of the connector yet");
        embedded.spawn_threads().expect("threads");
        embedded.inner.ready.store(true, Ordering::SeqCst);
        // A deposit for a merchant nobody registered: its `command_rejected` is the one output.
        let command = pipelines::input::Command::MerchantDeposit(pipelines::input::MerchantDeposit {
            merchant_id: "nobody".into(),
            amount: "1.00".into(),
        });
        // Stamped before the clock, so that the output waiting for the connector is behind it.
        let at = inputs.first().expect("inputs").at;
        embedded.append(vec![Input { event_id: "rejected".into(), at, command }]).expect("appended");
        let started = std::time::Instant::now();
        // With a connector attached and none running, the outputs wait in the outputs log, and only there.
        let report = loop {
            let report = embedded.lag_report();
            let stages_done = report.logs.iter().all(|(log, records)| log == OUTPUTS_LOG || *records == 0);
            if stages_done && report.timers_due == 0 {
                break report;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "still waiting: {report:?}");
            std::thread::sleep(Duration::from_millis(10));
        };
        // The rejection, and the check of payout p0-0 confirmed at 00:02:40, asked at 00:02:45 (the
        // clock), as replay asks it: both wait for the connector, in the order their rounds committed.
        let outputs = embedded.store().read(OUTPUTS_LOG, 0, 10).expect("read");
        let kinds: BTreeSet<String> = outputs
            .iter()
            .map(|(_, bytes)| {
                let record: crate::runtime::OutputRecord = serde_json::from_slice(bytes).expect("an output");
                match record.output.body {
                    pipelines::output::OutputBody::CrawlRequested(request) => format!("crawl {}", request.request_id),
                    pipelines::output::OutputBody::CommandRejected { reason, .. } => format!("rejected {reason:?}"),
                    body => panic!("an output this test does not expect: {body:?}"),
                }
            })
            .collect();
        assert_eq!(
            kinds,
            BTreeSet::from(["rejected UnknownMerchant".to_string(), "crawl k0:1".to_string()]),
            "{outputs:?}"
        );
        assert_eq!(report.logs[OUTPUTS_LOG], embedded.store().head(OUTPUTS_LOG).expect("a head"));
        assert_eq!(report.logs[OUTPUTS_LOG], 2, "the outputs wait for the connector: {report:?}");
        assert_eq!(report.total(), 2);
        // Behind the clock by the time of the first unread output.
        let output_at = crate::runtime::record_event_time(OUTPUTS_LOG, &outputs[0].1).expect("an output's time");
        let output_lag_ms = (now_ms - output_at.millis()) as u64;
        assert_eq!(report.lag_ms[OUTPUTS_LOG], output_lag_ms);
        assert!(report.lag_ms.iter().all(|(log, lag_ms)| log == OUTPUTS_LOG || *lag_ms == 0), "{report:?}");
        embedded.stop();
    }

    /// A record an agent partition holds for a provider answer in flight is consumed but not applied: it
    /// counts in its log's records, and its time in the log's lag in time, while the outputs log is
    /// behind by its unread crawl request.
    #[test]
    fn a_record_held_for_an_answer_counts_in_its_logs_lag_in_time() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let mut config = EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        config.answer_delay_s = Some(1);
        let embedded = Embedded::start(config).expect("starts");
        embedded.attach_connector();
        let input = |line: &str| match pipelines::input::parse_line(line, || "generated".to_string()) {
            Ok(pipelines::input::Parsed::Input(input)) => input,
            other => panic!("an input: {other:?}"),
        };
        let deposit = |at: Timestamp, event_id: &str| {
            let line = serde_json::json!({"type": "merchant_deposit", "at": at, "merchant_id": "m1", "amount": "1.00", "event_id": event_id});
            input(&line.to_string())
        };
        let stage_logs: Vec<String> =
            embedded.inner.partitions.keys().map(|&(kind, index)| stage_log(kind, index)).collect();
        let wait_until = |done: &dyn Fn(&crate::runtime::LagReport) -> bool| {
            let started = std::time::Instant::now();
            loop {
                let report = embedded.lag_report();
                let pairs: Vec<(&str, &str)> = stage_logs.iter().map(|log| (log.as_str(), log.as_str())).collect();
                let consumed = embedded.store().backlog(&pairs).expect("backlogs").iter().all(|records| *records == 0);
                if consumed && report.timers_due == 0 && done(&report) {
                    return report;
                }
                assert!(started.elapsed() < Duration::from_secs(60), "still waiting: {report:?}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        // A collection dispatched to u1; a deposit later moves the clock past its first check's time.
        let mut setup: Vec<Input> =
            include_str!("../../../tests/service/spaced.jsonl").lines().take(10).map(input).collect();
        let dispatched_at = setup.last().expect("the dispatch").at;
        setup.push(deposit(Timestamp::from_millis(dispatched_at.millis() + 600_000), "clock-1"));
        embedded.append(setup).expect("appended");
        wait_until(&|report| report.logs[OUTPUTS_LOG] > 0);
        let (_, request) = embedded.store().read(OUTPUTS_LOG, 0, 1).expect("read").pop().expect("an output");
        assert!(String::from_utf8_lossy(&request).contains("crawl_requested"), "the check asks the provider first");
        let asked_at = crate::runtime::record_event_time(OUTPUTS_LOG, &request).expect("the request's time");
        // u1's recharge 30 s after the request waits for its answer (1 s after it); a deposit 900 s after
        // it moves the clock on.
        let recharge = serde_json::json!({"type": "user_recharge", "at": Timestamp::from_millis(asked_at.millis() + 30_000),
            "user_id": "u1", "amount": "1.00", "commission": "0.00", "event_id": "held"});
        let later =
            vec![input(&recharge.to_string()), deposit(Timestamp::from_millis(asked_at.millis() + 900_000), "clock-2")];
        embedded.append(later).expect("appended");
        let agent_log =
            stage_log(StageKind::Agent, pipelines::partition::partition_of("u1", embedded.inner.config.partitions));
        let report = wait_until(&|report| report.logs[&agent_log] > 0);
        assert_eq!(report.lag_ms[&agent_log], 870_000, "the clock less the held recharge's time: {report:?}");
        assert_eq!(report.lag_ms[OUTPUTS_LOG], 900_000, "the clock less the unread request's time: {report:?}");
        assert!(
            report
                .lag_ms
                .iter()
                .all(|(log, lag_ms)| [OUTPUTS_LOG, agent_log.as_str()].contains(&log.as_str()) || *lag_ms == 0),
            "{report:?}"
        );
        embedded.stop();
    }

    /// Rounds applied while the round before commits (`run_pipelined`) read every record once: each
    /// partition goes on from where the round in flight leaves its log (a record read twice would be
    /// dropped as a duplicate, and counted), every log is consumed and committed to its head, and the
    /// state a restart rebuilds from the logs is the state the threads built.
    #[test]
    fn a_pipelined_processing_thread_consumes_every_record_once() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        let inputs = pipeline_inputs(60, 2);
        let embedded = Embedded::start(config.clone()).expect("starts");
        // Small requests, so that the threads apply rounds while more arrive and earlier ones commit.
        for chunk in inputs.chunks(25) {
            embedded.append(chunk.to_vec()).expect("appended");
        }
        wait_until_processed(&embedded);
        assert_eq!(embedded.failure(), None);
        let mut applied = 0;
        for ((kind, index), partition) in &embedded.inner.partitions {
            let partition = read_lock(partition);
            assert_eq!(partition.duplicates_dropped(), 0, "{kind:?}-{index}: a record was read twice");
            applied += partition.records_applied();
            let log = stage_log(*kind, *index);
            let store = embedded.store();
            assert_eq!(
                store.committed(&log).expect("read"),
                store.head(&log).expect("read"),
                "{log}: not all committed"
            );
        }
        assert!(applied > inputs.len() as u64, "the inputs and the messages they caused: {applied}");
        let built = reads::snapshot(&embedded.inner);
        embedded.stop();
        drop(embedded);
        let restarted = Embedded::start(config).expect("restarts");
        assert_eq!(reads::snapshot(&restarted.inner), built);
        restarted.stop();
    }

    /// A request's checks (`ingestion_checks`, one read transaction) answer as the pipeline's own
    /// lookups do, for ids that exist and ids that do not, and an order's merchant and a card's agent
    /// are answered while processing threads hold every partition (they are the keys ingestion
    /// recorded, not partition state): those that exist, and those that do not yet (a new order's id,
    /// a card being bound), which the checks of the instance that ingests no longer look for in the
    /// partitions.
    #[test]
    fn a_request_s_checks_answer_as_the_pipeline_does_without_the_partitions() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        let inputs = pipeline_inputs(8, 1);
        let embedded = Embedded::start(config).expect("starts");
        embedded.append(inputs.clone()).expect("appended");
        wait_until_processed(&embedded);
        let checks = embedded.ingestion_checks();
        for (index, input) in inputs.iter().enumerate() {
            assert_eq!(checks.event_position(&input.event_id), Some(index as u64), "{}", input.event_id);
        }
        assert_eq!(checks.event_position("never-sent"), None);
        for id in ["m0", "u0", "u7", "c0-0", "p0-7", "k3", "m99", "u99", "c9-9", "k99"] {
            assert_eq!(checks.merchant_exists(id), embedded.merchant_exists(id), "merchant {id}");
            assert_eq!(checks.user_exists(id), embedded.user_exists(id), "user {id}");
            assert_eq!(checks.order_merchant(id), embedded.order_merchant(id), "order {id}");
            assert_eq!(checks.card_owner(id), embedded.card_owner(id), "card {id}");
        }
        assert!(checks.merchant_exists("m0") && checks.user_exists("u7") && !checks.user_exists("u99"));
        assert_eq!(checks.order_merchant("c0-0").as_deref(), Some("m0"));
        assert_eq!(checks.card_owner("k3").as_deref(), Some("u3"));
        assert_eq!(checks.card_owner("k99"), None);
        drop(checks);

        let locks: Vec<_> =
            embedded.inner.partitions.values().map(|partition| crate::runtime::write_lock(partition)).collect();
        let (answered, answer) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let checks = embedded.ingestion_checks();
                let known = (checks.order_merchant("p0-7"), checks.card_owner("k5"));
                let unknown = (checks.order_merchant("c9-9"), checks.card_owner("k99"));
                let _ = answered.send((known, unknown));
            });
            let owners = answer.recv_timeout(Duration::from_secs(10));
            drop(locks);
            let ((merchant, card_owner), unknown) = owners.expect("answered while every partition was held");
            assert_eq!(merchant.as_deref(), Some("m0"));
            assert_eq!(card_owner.as_deref(), Some("u5"));
            assert_eq!(unknown, (None, None), "a new order's id and an unbound card are unknown");
        });
        embedded.stop();
    }

    /// An instance that does not ingest (`--no-ingest`) looks for an order's merchant and a card's agent
    /// in the partitions' state when its ingested keys lack them; the instance that ingests answers from
    /// its keys alone, which hold every order and card binding it took
    /// (`EmbeddedChecks::partition_fallback`). The same data directory and missing keys, one flag apart.
    #[test]
    fn only_an_instance_that_does_not_ingest_looks_for_missing_keys_in_the_partitions() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        let embedded = Embedded::start(config.clone()).expect("starts");
        embedded.append(pipeline_inputs(8, 1)).expect("appended");
        wait_until_processed(&embedded);
        embedded.stop();
        drop(embedded);
        // The keys of an order and a card binding answered as missing, as keys behind another instance's.
        let behind = || {
            let store = RedbStore::open(directory.path()).expect("opens");
            crate::runtime::tests::AlteredStore::new(store).with_missing_keys(vec!["order:c0-0", "card:k3"])
        };

        let reading = Embedded::start_on(config.clone(), Box::new(behind()), None).expect("restarts");
        reading.refuse_ingestion();
        let checks = reading.ingestion_checks();
        assert_eq!(checks.order_merchant("c0-0").as_deref(), Some("m0"), "from the order's partition");
        assert_eq!(checks.card_owner("k3").as_deref(), Some("u3"), "from the agent partitions");
        assert_eq!(checks.order_merchant("p0-7").as_deref(), Some("m0"), "from the keys");
        assert_eq!((checks.order_merchant("c9-9"), checks.card_owner("k99")), (None, None), "unknown anywhere");
        drop(checks);
        reading.stop();
        drop(reading);

        let ingesting = Embedded::start_on(config, Box::new(behind()), None).expect("restarts");
        let checks = ingesting.ingestion_checks();
        assert_eq!(checks.order_merchant("c0-0"), None, "the keys alone");
        assert_eq!(checks.card_owner("k3"), None, "the keys alone");
        assert_eq!(checks.order_merchant("p0-7").as_deref(), Some("m0"));
        assert_eq!(checks.card_owner("k5").as_deref(), Some("u5"));
        // The reads that authorise a merchant's key look in the partitions on either instance.
        assert_eq!(ingesting.order_merchant("c0-0").as_deref(), Some("m0"));
        assert_eq!(ingesting.card_owner("k3").as_deref(), Some("u3"));
        drop(checks);
        ingesting.stop();
    }

    /// An order is read under the locks of its own partition and of its agents' partitions only: a
    /// processing thread applying another agent partition does not hold the read up.
    #[test]
    fn an_order_read_waits_only_for_the_partitions_holding_it() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        assert_eq!(config.partitions, 2, "the test holds the agent partition the order is not on");
        let embedded = Embedded::start(config).expect("starts");
        embedded.append(pipeline_inputs(8, 1)).expect("appended");
        wait_until_processed(&embedded);
        let (order_id, expected, user_id) = (0..8)
            .find_map(|agent| {
                let order_id = format!("c{agent}-0");
                let view = embedded.order(&order_id)?;
                let user_id = view["sub_orders"][0]["user_id"].as_str()?.to_string();
                Some((order_id, view, user_id))
            })
            .expect("a dispatched collection");
        let other = 1 - pipelines::partition::partition_of(&user_id, 2);
        let held = crate::runtime::write_lock(&embedded.inner.partitions[&(StageKind::Agent, other)]);
        let (answered, answer) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _ = answered.send(embedded.order(&order_id));
            });
            let view = answer.recv_timeout(Duration::from_secs(10));
            drop(held);
            let view = view.expect("answered while the other agent partition was held");
            assert_eq!(view, Some(expected), "{order_id}");
        });
        embedded.stop();
    }

    #[test]
    fn tick_ids_only_move_forward() {
        assert_eq!(next_tick_id(1_000, None, None), (1_000, 0), "a tick's id is its time");
        assert_eq!(next_tick_id(2_000, Some((1_000, 0)), Some((1_000, 0))), (2_000, 0));
        // A timer due by now was set after the tick at now: another tick at the same time, a new id.
        assert_eq!(next_tick_id(1_000, Some((1_000, 0)), Some((1_000, 0))), (1_000, 1));
        // After a restart the ticker knows only what the partition applied.
        assert_eq!(next_tick_id(1_000, Some((1_000, 3)), None), (1_000, 4));
        // A wall clock gone back: after the last id, or the tick would be dropped as a duplicate.
        assert_eq!(next_tick_id(500, Some((1_000, 0)), Some((1_000, 0))), (1_000, 1));
    }
}
