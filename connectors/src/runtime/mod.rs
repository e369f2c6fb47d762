//! The runtime: what runs the pure stages of `pipelines` against durable logs and a state store, and
//! what the HTTP API asks of a running pipeline. The embedded backend (`crate::embedded`) implements it
//! in one process and one data directory; the Kafka + ScyllaDB profile implements the same traits.

use pipelines::Input;
use serde_json::Value;

/// Failures of the runtime. `Retryable` ones (a busy store, an I/O hiccup) may succeed if the same call
/// is made again; `Fatal` ones (a corrupt data directory, a bug) stop the process.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("retryable: {0}")]
    Retryable(String),
    #[error("fatal: {0}")]
    Fatal(String),
    /// The input cannot go into the pipeline (a caller's mistake; nothing was appended).
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("the pipeline is shutting down")]
    ShuttingDown,
}

impl RuntimeError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, RuntimeError::Retryable(_))
    }
}

/// The outcome of appending one input to the commands log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Appended {
    /// Appended at this position of the commands log (the id returned to the client).
    New { position: u64 },
    /// An input with this `event_id` was appended before (SPEC §3: ignored); its position.
    Duplicate { position: u64 },
}

/// One page of a cursor-paged list: `next_cursor` is given back to read the following page.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Page {
    pub items: Vec<Value>,
    pub next_cursor: Option<String>,
}

/// What a pipeline has not yet processed, by where it waits, so an operator sees which partition
/// falls behind (a hot agent, a slow provider), not only that something does. The logs' backlogs come
/// from one read of the store; a backlog that could not be read is `u64::MAX` (unknown is not
/// quiescent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LagReport {
    /// Records appended to each log and not yet applied by its consumer, by log name: every stage
    /// log (records an agent partition holds for a provider answer in flight count as not applied),
    /// and the outputs log while a statement connector consumes it (outputs it has not yet read).
    pub logs: std::collections::BTreeMap<String, u64>,
    /// Partitions with a timer due that the ticker has yet to tick for.
    pub timers_due: u64,
    /// Keys committed and not yet written to the read model (a client that sees lag 0 reads them there).
    pub unprojected: u64,
    /// How far behind the pipeline's clock each log's consumer is, in milliseconds of event time: the
    /// clock's now less the event time of the first record waiting in the log, or held by an agent
    /// partition for an answer in flight, whichever is earlier. 0 when none waits, `u64::MAX` when the
    /// record could not be read. Records tell how much work waits; this tells how stale the results
    /// are (with the system clock, how many milliseconds behind real time). Same logs as
    /// [`LagReport::logs`]; empty when the store does not read records for a report.
    pub lag_ms: std::collections::BTreeMap<String, u64>,
}

/// The event time of a record as a log stores it: a stage record's `at` (in either of its forms,
/// [`pipelines::partition::StageRecord::event_time_of`]), or the `at` of the output an outputs-log
/// record carries. None for bytes that are neither (a record the consumer will dead-letter).
pub fn record_event_time(log: &str, bytes: &[u8]) -> Option<pipelines::time::Timestamp> {
    /// Only the time is read; serde skips the rest of the record.
    #[derive(serde::Deserialize)]
    struct Stamped {
        at: pipelines::time::Timestamp,
    }
    #[derive(serde::Deserialize)]
    struct StampedOutput {
        output: Stamped,
    }
    if log == OUTPUTS_LOG {
        pipelines::decode::from_json_bytes::<StampedOutput>(bytes).ok().map(|record| record.output.at)
    } else {
        pipelines::partition::StageRecord::event_time_of(bytes)
    }
}

impl LagReport {
    /// Every figure added up, saturating: 0 means nothing more happens without new input.
    pub fn total(&self) -> u64 {
        self.logs
            .values()
            .fold(self.timers_due.saturating_add(self.unprojected), |total, records| total.saturating_add(*records))
    }
}

/// What the HTTP API needs from a running pipeline, whatever its backend. Reads are served from
/// materialised state; every value is JSON shaped like the SPEC §9 document's parts.
pub trait PipelineHandle: Send + Sync + 'static {
    /// Appends inputs to the commands log, in order, all or nothing (one durable commit). Inputs whose
    /// `event_id` was appended before are not appended again.
    fn append(&self, inputs: Vec<Input>) -> Result<Vec<Appended>, RuntimeError>;
    /// The ingestion position of an event id appended before (a retried request is a duplicate, whatever
    /// the state now says about it).
    fn event_position(&self, event_id: &str) -> Option<u64> {
        let _ = event_id;
        None
    }
    /// The lookups that check one request's inputs, answered from one view where the backend has one
    /// (see [`IngestionChecks`]); by default, one at a time through the methods below.
    fn ingestion_checks(&self) -> Box<dyn IngestionChecks + '_> {
        Box::new(ChecksOneByOne(self))
    }
    /// An order with its sub-orders and their decision timelines (rule ids and evidence), or None.
    fn order(&self, order_id: &str) -> Option<Value>;
    /// The merchant an order belongs to (for authorisation), or None if the order is unknown (neither
    /// created by an appended input nor in materialised state).
    fn order_merchant(&self, order_id: &str) -> Option<String>;
    /// Whether a user is known: registered by an appended input or in materialised state.
    fn user_exists(&self, user_id: &str) -> bool {
        self.user(user_id).is_some()
    }
    /// Whether a merchant is known: registered by an appended input or in materialised state.
    fn merchant_exists(&self, merchant_id: &str) -> bool {
        self.merchant(merchant_id).is_some()
    }
    /// An agent's balances, holds, cards, bill table and status history, or None.
    fn user(&self, user_id: &str) -> Option<Value>;
    /// An agent's journal entries with `seq` > `after_seq`, at most `limit` of them.
    fn user_journal(&self, user_id: &str, after_seq: u64, limit: usize) -> Option<Page>;
    /// An agent's bill table (SPEC §4): every statement line fetched per card, ordered by card, then
    /// time and txn id, after `cursor`, at most `limit` of them, each with the sub-order it is matched to.
    fn user_bill_table(&self, user_id: &str, cursor: Option<&str>, limit: usize) -> Option<Page> {
        let _ = (user_id, cursor, limit);
        None
    }
    /// A merchant's balances, or None.
    fn merchant(&self, merchant_id: &str) -> Option<Value>;
    /// A merchant's journal entries with `seq` > `after_seq`, at most `limit` of them.
    fn merchant_journal(&self, merchant_id: &str, after_seq: u64, limit: usize) -> Option<Page>;
    /// Sub-orders waiting for an operator (state `reviewing`) with their flags, after `cursor`.
    fn review_queue(&self, cursor: Option<&str>, limit: usize) -> Page;
    /// The agent a card is bound to, if any (SPEC §4: a card id belongs to one agent forever).
    fn card_owner(&self, card_id: &str) -> Option<String>;
    /// The SPEC §9 document of the current state.
    fn snapshot(&self) -> Value;
    /// What is appended and not yet processed, log by log (all 0 = quiescent).
    fn lag_report(&self) -> LagReport;
    /// Records appended to any log and not yet processed: [`LagReport::total`] (0 = quiescent; tests
    /// wait for it).
    fn lag(&self) -> u64 {
        self.lag_report().total()
    }
    /// Whether state has been restored and the processing loops run.
    fn ready(&self) -> bool;
    /// Stores a merchant API key, given as the hex SHA-256 of the token (tokens are never stored).
    fn put_merchant_key(&self, key_sha256_hex: &str, merchant_id: &str) -> Result<(), RuntimeError>;
    /// The merchant a key (hex SHA-256 of the token) belongs to.
    fn merchant_of_key(&self, key_sha256_hex: &str) -> Option<String>;
}

/// What ingestion checks before it appends a request's inputs: whether each event id was appended
/// before, and whether the ids the inputs name exist. A bulk request asks these a few times per input;
/// the embedded backend answers all of one request's questions from one read transaction (a
/// transaction per lookup cost ≈ 2–3 µs each, 2–4 lookups per input, in the serve benchmark).
pub trait IngestionChecks {
    /// As [`PipelineHandle::event_position`].
    fn event_position(&self, event_id: &str) -> Option<u64>;
    /// As [`PipelineHandle::order_merchant`].
    fn order_merchant(&self, order_id: &str) -> Option<String>;
    /// As [`PipelineHandle::user_exists`].
    fn user_exists(&self, user_id: &str) -> bool;
    /// As [`PipelineHandle::merchant_exists`].
    fn merchant_exists(&self, merchant_id: &str) -> bool;
    /// As [`PipelineHandle::card_owner`].
    fn card_owner(&self, card_id: &str) -> Option<String>;
}

/// Checks that ask the pipeline one lookup at a time (backends whose lookups are already in memory).
struct ChecksOneByOne<'a, P: ?Sized>(&'a P);

impl<P: PipelineHandle + ?Sized> IngestionChecks for ChecksOneByOne<'_, P> {
    fn event_position(&self, event_id: &str) -> Option<u64> {
        self.0.event_position(event_id)
    }
    fn order_merchant(&self, order_id: &str) -> Option<String> {
        self.0.order_merchant(order_id)
    }
    fn user_exists(&self, user_id: &str) -> bool {
        self.0.user_exists(user_id)
    }
    fn merchant_exists(&self, merchant_id: &str) -> bool {
        self.0.merchant_exists(merchant_id)
    }
    fn card_owner(&self, card_id: &str) -> Option<String> {
        self.0.card_owner(card_id)
    }
}

/// Event ids' positions and ingested keys' owners from one consistent view of the store.
pub trait IngestionReader {
    /// As [`Store::event_position`].
    fn event_position(&self, event_id: &str) -> Result<Option<u64>, RuntimeError>;
    /// As [`Store::ingested_key`].
    fn ingested_key(&self, key: &str) -> Result<Option<String>, RuntimeError>;
}

/// A store's own lookups, one at a time (stores without a cheaper consistent view).
struct LookupsOneByOne<'a, S: ?Sized>(&'a S);

impl<S: Store + ?Sized> IngestionReader for LookupsOneByOne<'_, S> {
    fn event_position(&self, event_id: &str) -> Result<Option<u64>, RuntimeError> {
        self.0.event_position(event_id)
    }
    fn ingested_key(&self, key: &str) -> Result<Option<String>, RuntimeError> {
        self.0.ingested_key(key)
    }
}

/// The durable side of a runtime: partitioned append-only logs, consumer offsets and a small key-value
/// store, with atomic commits. The embedded backend keeps them in one redb file; the Kafka profile maps
/// logs to topic partitions, offsets to consumer-group offsets and commits to transactions.
pub trait Store: Send + Sync + 'static {
    /// Records of `log` from offset `from` on, at most `records_max` of them, as (offset, bytes).
    fn read(&self, log: &str, from: u64, records_max: usize) -> Result<Vec<(u64, Vec<u8>)>, RuntimeError>;
    /// Committed records of `log` from offset `from` on, contiguous, at most `records_max`, as their
    /// producers made them ([`WriteBatch::stage_records`]), taken from memory: none where the store
    /// keeps none from `from` (then [`Store::read`] has them). A log's one consumer takes each once.
    fn take_committed_records(
        &self,
        _log: &str,
        _from: u64,
        _records_max: usize,
    ) -> Vec<(u64, pipelines::partition::StageRecord)> {
        Vec::new()
    }
    /// The offset the next record of `log` will get (the number of records ever appended).
    fn head(&self, log: &str) -> Result<u64, RuntimeError>;
    /// The next offset `consumer` has not yet consumed (0 if it never committed).
    fn committed(&self, consumer: &str) -> Result<u64, RuntimeError>;
    /// Applies a write batch atomically and durably: every append and offset, or none.
    fn commit(&self, batch: WriteBatch) -> Result<(), RuntimeError>;
    /// Whether [`Store::submit`] queues a batch and returns at once (false: it commits it first).
    fn queues_commits(&self) -> bool {
        false
    }
    /// Hands a batch over to be committed after every batch handed over before it; where the store
    /// queues commits ([`Store::queues_commits`]) it returns at once, so a caller may have several
    /// batches in flight, and batches submitted meanwhile join one transaction. [`Store::wait_for`]
    /// returns the outcome. By default the batch is committed here.
    fn submit(&self, batch: WriteBatch) -> Submission {
        Submission::Done(self.commit(batch))
    }
    /// Waits until a submitted batch is committed (or failed).
    fn wait_for(&self, submission: Submission) -> Result<(), RuntimeError> {
        match submission {
            Submission::Done(outcome) => outcome,
            Submission::Queued { ticket } => {
                Err(RuntimeError::Fatal(format!("ticket {ticket} was not queued by this store")))
            }
        }
    }
    /// Ingests inputs atomically: for each event id not ingested before, assigns the next ingestion
    /// position and appends the records `encode(index, position)` returns; event ids seen before get
    /// their first position back and nothing is appended. Returns once the inputs are durable (for an
    /// event id seen before, once its first ingestion is).
    fn ingest(&self, event_ids: &[&str], encode: &mut IngestEncoder<'_>) -> Result<Vec<Appended>, RuntimeError>;
    /// The ingestion position of an event id ingested before.
    fn event_position(&self, event_id: &str) -> Result<Option<u64>, RuntimeError>;
    /// The owner recorded for a key an ingested input created (see [`Ingested::keys`]).
    fn ingested_key(&self, key: &str) -> Result<Option<String>, RuntimeError>;
    /// A reader of event ids and ingested keys that sees one state of the store for all its lookups;
    /// by default, [`Store::event_position`] and [`Store::ingested_key`] one at a time.
    fn ingestion_reader(&self) -> Result<Box<dyn IngestionReader + '_>, RuntimeError> {
        Ok(Box::new(LookupsOneByOne(self)))
    }
    /// Reads a key of a small table (API keys, metadata).
    fn get(&self, table: KeyValueTable, key: &str) -> Result<Option<String>, RuntimeError>;
    /// Writes a key of a small table, durably.
    fn put(&self, table: KeyValueTable, key: &str, value: &str) -> Result<(), RuntimeError>;
    /// Every how many records of a stage log a snapshot of the partition's state goes into the batch
    /// that crosses the multiple (None: the store keeps no snapshots; restores replay whole logs).
    fn snapshot_every_records(&self) -> Option<u64> {
        None
    }
    /// The latest snapshot of the partition consuming `log`, if the store keeps snapshots. Taken once,
    /// at restore.
    fn take_snapshot(&self, log: &str) -> Result<Option<Snapshot>, RuntimeError> {
        let _ = log;
        Ok(None)
    }
    /// The largest `at` (milliseconds) of the inputs ingested, if the store records it (records before
    /// a snapshot are not read again at restore, so the runtime cannot observe it from them).
    fn ingested_at_max_ms(&self) -> Result<Option<i64>, RuntimeError> {
        Ok(None)
    }
    /// Records appended to each (log, consumer) pair's log and not yet consumed, one figure per pair in
    /// their order. A store that can read every head and offset in one snapshot overrides this (a batch
    /// moving records between two logs is then never missed by the figures).
    fn backlog(&self, pairs: &[(&str, &str)]) -> Result<Vec<u64>, RuntimeError> {
        pairs.iter().map(|(log, consumer)| Ok(self.head(log)?.saturating_sub(self.committed(consumer)?))).collect()
    }
    /// The first record of each (log, consumer) pair's log that its consumer has not consumed (None:
    /// none waits), one per pair in their order, for the lag in time ([`LagReport::lag_ms`]). None when
    /// the store does not read them for a report, the default: a store must read them without moving
    /// the position its processing reads from (the Kafka store has a reader of its own for them).
    fn first_unconsumed(&self, pairs: &[(&str, &str)]) -> Option<Result<Vec<Option<Vec<u8>>>, RuntimeError>> {
        let _ = pairs;
        None
    }
    /// The next offsets of `consumers` as far as this instance knows, including what other instances
    /// sharing the partitions committed (a shared store reads their commits first). Never lower than an
    /// answer given before.
    fn committed_all(&self, consumers: &[String]) -> Result<Vec<u64>, RuntimeError> {
        consumers.iter().map(|consumer| self.committed(consumer)).collect()
    }
    /// Whether several instances share the stage partitions through this store, each processing only
    /// the partitions [`Store::join`] assigns it (false: this instance processes every partition).
    fn shares_partitions(&self) -> bool {
        false
    }
    /// Joins the group of instances sharing the stage partitions. The member tells `listener` of every
    /// change of this instance's partitions while it is polled. None when the store is not shared.
    fn join(
        &self,
        listener: std::sync::Arc<dyn AssignmentListener>,
    ) -> Result<Option<Box<dyn GroupMember>>, RuntimeError> {
        let _ = listener;
        Ok(None)
    }
    /// Logs this instance is about to take over: what the store remembers of them (committed offsets,
    /// snapshots) may have been written by another instance since, and is read again.
    fn forget(&self, logs: &[String]) -> Result<(), RuntimeError> {
        let _ = logs;
        Ok(())
    }
}

/// What a shared store's group tells the runtime about this instance's stage partitions (by log).
/// Called from [`GroupMember::poll`], before it returns.
pub trait AssignmentListener: Send + Sync {
    /// The logs go to another instance: stop processing them, and return only once every batch applied
    /// to them is committed (the next owner restores from what was committed).
    fn revoked(&self, logs: &[String]);
    /// The logs are this instance's now (the whole assignment; logs not in it are not): restore their
    /// partitions from what was committed and process them.
    fn assigned(&self, logs: &[String]);
}

/// This instance's membership in a shared store's group.
pub trait GroupMember: Send {
    /// Serves the group for up to `timeout` (a rebalance runs the listener's calls within it).
    fn poll(&mut self, timeout: std::time::Duration) -> Result<(), RuntimeError>;
    /// Leaves the group, giving the partitions back first (the listener's `revoked` runs).
    fn leave(self: Box<Self>);
}

/// A stage partition's state after applying its log up to `last_offset` (inclusive), written in the
/// same commit as that offset (Kafka: to the compacted changelog topic).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub kind: pipelines::partition::StageKind,
    pub partition: u32,
    pub last_offset: u64,
    /// [`pipelines::partition::StagePartition::snapshot`].
    pub state: Vec<u8>,
}

/// Records as (log, bytes).
pub type Records = Vec<(LogName, Vec<u8>)>;

/// A log's name as a record to append names it. Held inline up to 24 bytes, which every log name of
/// the runtime fits (`agent-17`, `outputs`, `dead-letters`): naming each appended record's log
/// allocates nothing, where a `String` cost an allocation and a free per record (≈ 4 records per
/// input).
pub type LogName = pipelines::Text;

/// Keys an input creates, with their owners, as (key, owner).
pub type KeyOwners = Vec<(String, String)>;

/// What one ingested input becomes: its records, and the ids it creates as (key, owner) — e.g.
/// (`order:o1`, merchant id) — remembered so that commands appended right after it are not refused as
/// naming unknown ids while the creation is still in flight.
#[derive(Debug, Default)]
pub struct Ingested {
    pub records: Records,
    /// The stage records among `records` as made, as (index in `records`, record): what a store may
    /// keep for their consumers, as [`WriteBatch::stage_records`].
    pub stage_records: Vec<(usize, pipelines::partition::StageRecord)>,
    pub keys: KeyOwners,
    /// Keys that belong to one owner forever (a card to its agent, SPEC §4): if one is recorded with
    /// another owner, the whole ingestion fails with [`RuntimeError::Invalid`] and nothing is appended.
    /// Checked as the ingestion is prepared, one request at a time, so two requests racing for one card
    /// cannot both pass.
    pub exclusive_keys: KeyOwners,
    /// The input's `at` in milliseconds (stores that record the largest one, see
    /// [`Store::ingested_at_max_ms`]).
    pub at_ms: Option<i64>,
}

/// The keys one ingested input creates that no input before it created, recorded in `new_owners` (the
/// request's earlier inputs) and returned; `known` gives the owner recorded before the request. A key
/// keeps its first owner; an exclusive key ([`Ingested::exclusive_keys`]) recorded with another owner
/// refuses the whole request with [`RuntimeError::Invalid`]. Shared by the stores' `ingest`.
pub fn claim_keys<'k, S: std::hash::BuildHasher>(
    known: impl Fn(&str) -> Option<&'k str>,
    new_owners: &mut std::collections::HashMap<String, String, S>,
    keys: KeyOwners,
    exclusive_keys: KeyOwners,
) -> Result<KeyOwners, RuntimeError> {
    let mut created = Vec::new();
    for (key, owner) in keys {
        // The first owner stays (a user registered again keeps its key).
        if known(&key).is_none() && !new_owners.contains_key(&key) {
            new_owners.insert(key.clone(), owner.clone());
            created.push((key, owner));
        }
    }
    for (key, owner) in exclusive_keys {
        match known(&key).or_else(|| new_owners.get(&key).map(String::as_str)) {
            Some(existing) if existing != owner => {
                return Err(RuntimeError::Invalid(format!("`{key}` already belongs to `{existing}`")));
            }
            Some(_) => {}
            None => {
                new_owners.insert(key.clone(), owner.clone());
                created.push((key, owner));
            }
        }
    }
    Ok(created)
}

/// What [`Store::ingest`] calls for each new input: (index in the request, ingestion position) → what
/// the input becomes.
pub type IngestEncoder<'a> = dyn FnMut(usize, u64) -> Result<Ingested, RuntimeError> + 'a;

/// The small key-value tables beside the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyValueTable {
    /// SHA-256 (hex) of a merchant API token → merchant id.
    MerchantKeys,
    /// Settings a data directory was created with (partition count), checked at start.
    Meta,
}

/// One atomic commit of a processing loop: what a batch produced, and how far its input was consumed.
#[derive(Debug, Default)]
pub struct WriteBatch {
    /// Records to append, as (log, bytes), in order.
    pub appends: Records,
    /// Consumer offsets to set, as (consumer, next offset to consume).
    pub offsets: Vec<(String, u64)>,
    /// The offsets the batch consumed from, as (consumer, first offset consumed), for consumers it
    /// moves in `offsets`: a store that queues commits ([`Store::submit`]) refuses the batch unless
    /// each consumer's committed offset is this one, so that a batch queued behind a failed one of the same consumer fails too instead of
    /// skipping the records that one consumed (and losing what it produced). Not checked when empty.
    pub expected_offsets: Vec<(String, u64)>,
    /// Keys whose state the batch may have changed (not stored: what a read model projects again once
    /// the batch is committed).
    pub touched: Vec<(pipelines::partition::StageKind, pipelines::Text)>,
    /// Partition snapshots, each as of the offset committed with it.
    pub snapshots: Vec<Snapshot>,
    /// The `crawl_requested` outputs among the appends, with their event time (not stored: what the
    /// embedded runtime hands the statement connector before the commit, so that it can ask the
    /// provider meanwhile).
    pub crawls: Vec<(pipelines::Timestamp, pipelines::output::CrawlRequested)>,
    /// Stage records among the appends as the producer made them, as (index in `appends`, record)
    /// (not stored: their bytes are). A store may hand them to their log's consumer once committed
    /// ([`Store::take_committed_records`]), which then neither reads nor decodes the bytes.
    pub stage_records: Vec<(usize, pipelines::partition::StageRecord)>,
    /// What the batch's records came to, for the pipeline's figures (not stored).
    pub applied: AppliedCounts,
}

/// Rejections and dead letters among what a batch applied (`crate::metrics` counts them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppliedCounts {
    /// The reason of each `command_rejected` output (few: a list costs nothing while there are none,
    /// where a count per reason would widen every batch).
    pub rejected: Vec<pipelines::output::Reason>,
    /// Records moved to the dead-letter log.
    pub dead_letters: u64,
}

impl WriteBatch {
    /// Appends a stage record to `log`: its bytes, and the record itself for [`WriteBatch::stage_records`].
    pub fn append_stage_record(
        &mut self,
        log: LogName,
        record: pipelines::partition::StageRecord,
    ) -> Result<(), RuntimeError> {
        push_stage_record(&mut self.appends, &mut self.stage_records, log, record)
    }

    /// The same for a record already encoded: `bytes` must decode to `record`.
    pub fn append_encoded_stage_record(
        &mut self,
        log: LogName,
        record: pipelines::partition::StageRecord,
        bytes: Vec<u8>,
    ) {
        debug_assert!(
            serde_json::from_slice::<pipelines::partition::StageRecord>(&bytes)
                .is_ok_and(|decoded| serde_json::to_vec(&decoded).ok() == serde_json::to_vec(&record).ok()),
            "the bytes of a stage record decode to it"
        );
        push_encoded_stage_record(&mut self.appends, &mut self.stage_records, log, record, bytes);
    }
}

/// Appends a stage record's bytes to `appends`, and the record itself, by its index there, to `made`
/// (what [`WriteBatch::stage_records`] and [`Ingested::stage_records`] hold).
pub fn push_stage_record(
    appends: &mut Records,
    made: &mut Vec<(usize, pipelines::partition::StageRecord)>,
    log: LogName,
    record: pipelines::partition::StageRecord,
) -> Result<(), RuntimeError> {
    let bytes = encode(&record)?;
    push_encoded_stage_record(appends, made, log, record, bytes);
    Ok(())
}

/// The same for a record and its bytes.
fn push_encoded_stage_record(
    appends: &mut Records,
    made: &mut Vec<(usize, pipelines::partition::StageRecord)>,
    log: LogName,
    record: pipelines::partition::StageRecord,
    bytes: Vec<u8>,
) {
    appends.push((log, bytes));
    made.push((appends.len() - 1, record));
}

/// A batch handed to [`Store::submit`].
#[derive(Debug)]
pub enum Submission {
    /// Queued behind the batches submitted before it: [`Store::wait_for`] waits for its commit.
    Queued { ticket: u64 },
    /// Already committed, or refused.
    Done(Result<(), RuntimeError>),
}

/// The log a stage partition consumes, as a `String`: for reads, figures and restores. Records to
/// append name their log with [`stage_log_name`], which allocates nothing.
pub fn stage_log(kind: pipelines::partition::StageKind, partition: u32) -> String {
    stage_log_name(kind, partition).into()
}

/// The log a stage partition consumes, as a [`LogName`]. Named for every record a round produces, so
/// built without `format!` (≈ 0.6 % of the serve benchmark's CPU samples went to its formatting
/// machinery, `perf`) and without a heap allocation.
pub fn stage_log_name(kind: pipelines::partition::StageKind, partition: u32) -> LogName {
    pipelines::numbered(kind.name(), '-', u64::from(partition))
}

/// The log of every SPEC §6 output, in commit order (the outbox the connector and sinks consume).
pub const OUTPUTS_LOG: &str = "outputs";
/// The consumer name of the statement connector.
pub const CONNECTOR_CONSUMER: &str = "connector";

/// How time enters a running service (SPEC §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockMode {
    /// The server stamps `at` from the wall clock, and ticks follow it.
    System,
    /// The posted `at` drives time (tests, reprocessing); ticks follow the largest `at` ingested.
    Event,
}

/// One output in the outputs log, with the id of the record that caused it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct OutputRecord {
    pub id: pipelines::partition::RecordId,
    pub output: pipelines::output::Output,
}

/// What one processing batch did.
#[derive(Debug, Default)]
pub struct BatchReport {
    /// Records consumed from the partition's log.
    pub consumed: usize,
    /// Logs appended to (whose consumers have work).
    pub appended_logs: std::collections::BTreeSet<String>,
}

/// The log name and an undecodable record's error, kept in the dead-letter log.
pub const DEAD_LETTER_LOG: &str = "dead-letters";

/// Reads a lock even if a panicking thread poisoned it: the state it guards is only written by the
/// processing loop, which stops the service when it fails.
pub fn read_lock<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn write_lock<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Locks a mutex even if a panicking thread poisoned it (see [`read_lock`]).
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether blocking work may run here in `tokio::task::block_in_place`: on a thread of a
/// multi-threaded tokio runtime, which then moves the worker's other tasks to another thread. Not on a
/// current-thread runtime, where `block_in_place` panics, nor outside any runtime.
pub fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// The read-process-write step of one stage partition: reads up to `records_max` records after the
/// committed offset, applies them to the pure stage, and commits what they produced together with the
/// new offset in one atomic batch. State in memory runs ahead of the commit only by this batch; if the
/// commit fails the caller must stop (state is rebuilt from the log at the next start).
pub fn process_batch<S: Store + ?Sized>(
    store: &S,
    partition: &std::sync::RwLock<pipelines::partition::StagePartition>,
    partitions: u32,
    records_max: usize,
) -> Result<BatchReport, RuntimeError> {
    let mut batch = WriteBatch::default();
    let consumed = apply_batch(store, partition, partitions, records_max, &mut batch)?;
    if consumed == 0 {
        return Ok(BatchReport::default());
    }
    let appended_logs = commit_applied(store, batch)?;
    Ok(BatchReport { consumed, appended_logs })
}

/// Records applied under one hold of a partition's write lock.
const RECORDS_PER_LOCK_MAX: usize = 64;

/// The read-process half of [`process_batch`]: reads up to `records_max` records of one partition after
/// its committed offset, applies them, and adds what they produced and the new offset to `batch`.
/// Several partitions' batches may go into one commit (group commit); none of them may read its log
/// again before that commit. Returns the records consumed.
pub fn apply_batch<S: Store + ?Sized>(
    store: &S,
    partition: &std::sync::RwLock<pipelines::partition::StagePartition>,
    partitions: u32,
    records_max: usize,
    batch: &mut WriteBatch,
) -> Result<usize, RuntimeError> {
    let log = {
        let state = read_lock(partition);
        stage_log(state.kind(), state.partition())
    };
    let from = store.committed(&log)?;
    apply_batch_from(store, partition, partitions, records_max, from, batch)
}

/// [`apply_batch`] from offset `from` of the partition's log: its committed offset, or, while the
/// batch before is still committing, the offset that batch moves it to (a processing thread that
/// applies its next batch during the commit of the last, `crate::embedded`). Returns the records
/// consumed; the batch's new offset for the log is `from` plus that.
pub fn apply_batch_from<S: Store + ?Sized>(
    store: &S,
    partition: &std::sync::RwLock<pipelines::partition::StagePartition>,
    partitions: u32,
    records_max: usize,
    from: u64,
    batch: &mut WriteBatch,
) -> Result<usize, RuntimeError> {
    let (kind, index) = {
        let state = read_lock(partition);
        (state.kind(), state.partition())
    };
    let log = stage_log(kind, index);
    let records = fetch(store, &log, from, records_max)?;
    let Some(&(last_offset, _)) = records.last() else {
        return Ok(0);
    };
    let consumed = records.len();
    // A log has no gaps, and the batch consumes `from..=last_offset`, each record once: the caller's next
    // offset (`from` plus the records consumed) depends on it.
    if records.first().map(|(offset, _)| *offset) != Some(from) || last_offset + 1 - from != consumed as u64 {
        return Err(RuntimeError::Fatal(format!("{log}: the records read from {from} are not contiguous")));
    }
    // Most records produce a stage record or more: the batch takes room for one each now rather than
    // doubling, and copying what it holds (stage records are a few hundred bytes), as it fills.
    batch.appends.reserve(consumed);
    batch.stage_records.reserve(consumed);
    let mut produced = pipelines::partition::Produced::default();
    let mut pending = records.into_iter();
    // The write lock is taken per chunk, so that readers of this partition's state (the API) wait for
    // a few records at most, not a whole batch.
    loop {
        let decoded: Vec<_> =
            pending.by_ref().take(RECORDS_PER_LOCK_MAX).map(|(offset, record)| (offset, record.decode())).collect();
        if decoded.is_empty() {
            break;
        }
        let mut state = write_lock(partition);
        for (offset, record) in decoded {
            match record {
                Ok(record) => {
                    state.apply(record, &mut produced);
                    batch.touched.extend(produced.touched.drain(..).map(|key| (kind, key)));
                    encode_produced(&log, offset, &mut produced, partitions, batch)?;
                }
                Err((error, bytes)) => dead_letter(&log, offset, &bytes, &error, batch),
            }
        }
    }
    if let Some(every) = store.snapshot_every_records().filter(|every| *every > 0) {
        // Stateless rule: a snapshot whenever the batch crosses a multiple of `every` offsets.
        if from / every != (last_offset + 1) / every {
            let state = read_lock(partition)
                .snapshot()
                .map_err(|error| RuntimeError::Fatal(format!("{log}: snapshot: {error}")))?;
            batch.snapshots.push(Snapshot { kind, partition: index, last_offset, state });
        }
    }
    batch.expected_offsets.push((log.clone(), from));
    batch.offsets.push((log, last_offset + 1));
    Ok(consumed)
}

/// A record of a stage log as a batch gets it: as its producer made it, or as stored. Nearly every
/// record comes made while the service keeps up; boxing it would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Fetched {
    Made(pipelines::partition::StageRecord),
    Stored(Vec<u8>),
}

impl Fetched {
    /// The record, or why its bytes do not decode, with the bytes (for the dead-letter log).
    fn decode(self) -> Result<pipelines::partition::StageRecord, (String, Vec<u8>)> {
        match self {
            Fetched::Made(record) => Ok(record),
            Fetched::Stored(bytes) => {
                pipelines::decode::from_json_bytes(&bytes).map_err(|error| (error.to_string(), bytes))
            }
        }
    }
}

/// Records of `log` from `from` on: those the store still holds as made, else read from the log.
fn fetch<S: Store + ?Sized>(
    store: &S,
    log: &str,
    from: u64,
    records_max: usize,
) -> Result<Vec<(u64, Fetched)>, RuntimeError> {
    let made = store.take_committed_records(log, from, records_max);
    if !made.is_empty() {
        return Ok(made.into_iter().map(|(offset, record)| (offset, Fetched::Made(record))).collect());
    }
    let stored = store.read(log, from, records_max)?;
    Ok(stored.into_iter().map(|(offset, bytes)| (offset, Fetched::Stored(bytes))).collect())
}

/// Commits batches already applied in memory; returns the logs appended to (whose consumers have work).
pub fn commit_applied<S: Store + ?Sized>(
    store: &S,
    batch: WriteBatch,
) -> Result<std::collections::BTreeSet<String>, RuntimeError> {
    let appended_logs = appended_logs(&batch);
    HandedBatch::Batch(batch).wait_applied(store)?;
    Ok(appended_logs)
}

/// The logs a batch appends to (whose consumers have work once it is committed).
pub fn appended_logs(batch: &WriteBatch) -> std::collections::BTreeSet<String> {
    // A batch holds thousands of appends to a handful of logs: each name is copied once, not per append.
    let names: std::collections::BTreeSet<&str> = batch.appends.iter().map(|(log, _)| log.as_str()).collect();
    names.into_iter().map(str::to_string).collect()
}

/// A batch on its way from the thread that made it to the one that waits for its commit. Where the
/// store queues commits it is submitted by the maker, so batches reach the store in the maker's order
/// while the waiter may still be waiting for an earlier one; elsewhere the waiter commits it.
#[derive(Debug)]
pub enum HandedBatch {
    Submitted(Submission),
    Batch(WriteBatch),
}

impl HandedBatch {
    pub fn new<S: Store + ?Sized>(store: &S, batch: WriteBatch) -> HandedBatch {
        if store.queues_commits() {
            HandedBatch::Submitted(store.submit(batch))
        } else {
            HandedBatch::Batch(batch)
        }
    }

    /// Commits the batch if it was not submitted yet, and waits for its outcome.
    pub fn wait<S: Store + ?Sized>(self, store: &S) -> Result<(), RuntimeError> {
        let submission = match self {
            HandedBatch::Submitted(submission) => submission,
            HandedBatch::Batch(batch) => store.submit(batch),
        };
        store.wait_for(submission)
    }

    /// [`HandedBatch::wait`] for a batch already applied in memory: a retry would read the same records
    /// again and drop them as duplicates, losing what they produced. Whatever the store says, the caller
    /// must stop (the next start rebuilds state from the log).
    pub fn wait_applied<S: Store + ?Sized>(self, store: &S) -> Result<(), RuntimeError> {
        self.wait(store).map_err(|error| match error {
            RuntimeError::Retryable(message) => RuntimeError::Fatal(format!("commit failed after apply: {message}")),
            other => other,
        })
    }
}

/// Applies a partition's log up to its committed offset, discarding what it produces (it was
/// committed when the records were first processed). `observe` sees each record before it is applied
/// (the runtime recovers what it derives from the log, such as the largest ingested `at`). Returns the
/// records applied.
pub fn restore<S: Store + ?Sized>(
    store: &S,
    partition: &mut pipelines::partition::StagePartition,
    config: &pipelines::Config,
    records_max: usize,
    observe: &mut dyn FnMut(&pipelines::partition::StageRecord),
) -> Result<u64, RuntimeError> {
    let log = stage_log(partition.kind(), partition.partition());
    let committed = store.committed(&log)?;
    let mut start = 0;
    // A snapshot is used only if it is within the committed range (a store that shows an aborted
    // transaction's records would show its snapshot and its offset together, never one alone).
    if let Some(snapshot) = store.take_snapshot(&log)?.filter(|snapshot| snapshot.last_offset < committed) {
        match pipelines::partition::StagePartition::restore(&snapshot.state, config.clone()) {
            Ok(restored) if restored.kind() == partition.kind() && restored.partition() == partition.partition() => {
                *partition = restored;
                start = snapshot.last_offset + 1;
            }
            Ok(_) => tracing::warn!(log, "a snapshot of another partition; replaying the whole log"),
            Err(error) => tracing::warn!(log, %error, "an unreadable snapshot; replaying the whole log"),
        }
    }
    let mut produced = pipelines::partition::Produced::default();
    for_each_record(store, &log, start..committed, records_max, &mut |record| {
        observe(&record);
        partition.apply(record, &mut produced);
        produced.clear();
    })?;
    Ok(committed - start)
}

/// Decodes the records of `log` at `offsets`, in order, reading `records_max` at a time; undecodable
/// records are skipped (processing dead-letters them), missing ones are a fatal error.
pub fn for_each_record<S: Store + ?Sized>(
    store: &S,
    log: &str,
    offsets: std::ops::Range<u64>,
    records_max: usize,
    visit: &mut dyn FnMut(pipelines::partition::StageRecord),
) -> Result<(), RuntimeError> {
    let mut next = offsets.start;
    while next < offsets.end {
        let wanted = records_max.min(usize::try_from(offsets.end - next).unwrap_or(usize::MAX));
        let records = store.read(log, next, wanted)?;
        let Some(&(last_offset, _)) = records.last() else {
            // Kafka's logs have offsets without records (transaction markers): a read past the last
            // record of the range finds none although the log goes further. A log that ends before
            // the range does has lost records.
            if store.head(log)? > next {
                return Ok(());
            }
            return Err(RuntimeError::Fatal(format!("{log}: records {next}..{} are missing", offsets.end)));
        };
        for (offset, bytes) in records {
            if offset >= offsets.end {
                return Ok(()); // beyond the range (a log with offset gaps returns what comes next)
            }
            if let Ok(record) = pipelines::decode::from_json_bytes::<pipelines::partition::StageRecord>(&bytes) {
                visit(record);
            }
        }
        next = last_offset + 1;
    }
    Ok(())
}

/// Turns what one record produced into appends: messages to their stage partitions, outputs to the
/// outputs log, each with an id derived from the record's position (log, offset, index).
fn encode_produced(
    log: &str,
    offset: u64,
    produced: &mut pipelines::partition::Produced,
    partitions: u32,
    batch: &mut WriteBatch,
) -> Result<(), RuntimeError> {
    use pipelines::partition::{destination, partition_of, RecordBody, RecordId, StageRecord};
    let id = |index: usize| RecordId { source: log.into(), offset, index: index as u32 };
    let first_output = produced.messages.len();
    for (index, (at, message)) in produced.messages.drain(..).enumerate() {
        let (kind, key) = destination(&message);
        let target = stage_log_name(kind, partition_of(key, partitions));
        let record = StageRecord { id: id(index), at, body: RecordBody::Message { message } };
        batch.append_stage_record(target, record)?;
    }
    for (index, output) in produced.outputs.drain(..).enumerate() {
        match &output.body {
            pipelines::output::OutputBody::CrawlRequested(request) => batch.crawls.push((output.at, request.clone())),
            pipelines::output::OutputBody::CommandRejected { reason, .. } => batch.applied.rejected.push(*reason),
            _ => {}
        }
        let record = OutputRecord { id: id(first_output + index), output };
        batch.appends.push((LogName::const_new(OUTPUTS_LOG), encode(&record)?));
    }
    Ok(())
}

/// Encodes a record for a log. Our own types always serialize; a failure is a bug, reported as fatal.
pub fn encode<T: serde::Serialize>(record: &T) -> Result<Vec<u8>, RuntimeError> {
    let mut bytes = Vec::with_capacity(RECORD_BYTES_TYPICAL);
    serde_json::to_writer(&mut bytes, record)
        .map_err(|error| RuntimeError::Fatal(format!("encoding a record: {error}")))?;
    Ok(bytes)
}

/// The buffer a record is encoded into from the start. Stage messages and outputs take 110–350 bytes
/// of JSON in the serve benchmark's logs; `serde_json::to_vec` starts at 128 bytes and grew each of them
/// once or twice on the way (the copies and reallocations ≈ 2 % of the service's CPU samples, `perf`).
const RECORD_BYTES_TYPICAL: usize = 512;

/// A dead letter: where the record was, why it could not be processed, and its bytes (hex).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct DeadLetter {
    pub log: String,
    pub offset: u64,
    pub error: String,
    pub payload_hex: String,
}

fn dead_letter(log: &str, offset: u64, payload: &[u8], error: &str, batch: &mut WriteBatch) {
    tracing::error!(log, offset, error, "undecodable record moved to the dead-letter log");
    let payload_hex = payload.iter().map(|byte| format!("{byte:02x}")).collect();
    let letter = DeadLetter { log: log.to_string(), offset, error: error.to_string(), payload_hex };
    let bytes = serde_json::to_vec(&letter).unwrap_or_default();
    batch.appends.push((LogName::const_new(DEAD_LETTER_LOG), bytes));
    batch.applied.dead_letters += 1;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::embedded::store::RedbStore;
    use pipelines::input::{parse_line, Parsed};
    use pipelines::partition::{route_input, RecordBody, RecordId, Routed, StageKind, StagePartition, StageRecord};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::RwLock;

    /// The embedded store, altered as a test asks: a commit that fails as retryable when asked to, and
    /// ingested keys it answers as missing (as the keys of an instance that does not ingest lack another
    /// instance's latest ingestion until it has read it). The logs, offsets and keys are the store's;
    /// what it does not delegate is the trait's default: batches committed one at a time, no records
    /// kept in memory, and an ingestion reader that asks [`Store::ingested_key`] below, so the missing
    /// keys stay missing there too.
    pub(crate) struct AlteredStore {
        store: RedbStore,
        fail_next_commit: AtomicBool,
        /// Ingested keys (`kind:id`) answered as unknown.
        missing_keys: Vec<&'static str>,
    }

    impl AlteredStore {
        pub(crate) fn new(store: RedbStore) -> AlteredStore {
            AlteredStore { store, fail_next_commit: AtomicBool::new(false), missing_keys: Vec::new() }
        }

        /// The store answering `keys` (`kind:id`) as never ingested.
        pub(crate) fn with_missing_keys(self, keys: Vec<&'static str>) -> AlteredStore {
            AlteredStore { missing_keys: keys, ..self }
        }
    }

    impl Store for AlteredStore {
        fn read(&self, log: &str, from: u64, records_max: usize) -> Result<Vec<(u64, Vec<u8>)>, RuntimeError> {
            self.store.read(log, from, records_max)
        }
        fn head(&self, log: &str) -> Result<u64, RuntimeError> {
            self.store.head(log)
        }
        fn committed(&self, consumer: &str) -> Result<u64, RuntimeError> {
            self.store.committed(consumer)
        }
        fn commit(&self, batch: WriteBatch) -> Result<(), RuntimeError> {
            if self.fail_next_commit.swap(false, Ordering::SeqCst) {
                return Err(RuntimeError::Retryable("the store is busy".to_string()));
            }
            self.store.commit(batch)
        }
        fn ingest(&self, event_ids: &[&str], encode: &mut IngestEncoder<'_>) -> Result<Vec<Appended>, RuntimeError> {
            self.store.ingest(event_ids, encode)
        }
        fn event_position(&self, event_id: &str) -> Result<Option<u64>, RuntimeError> {
            self.store.event_position(event_id)
        }
        fn ingested_key(&self, key: &str) -> Result<Option<String>, RuntimeError> {
            if self.missing_keys.contains(&key) {
                return Ok(None);
            }
            self.store.ingested_key(key)
        }
        fn get(&self, table: KeyValueTable, key: &str) -> Result<Option<String>, RuntimeError> {
            self.store.get(table, key)
        }
        fn put(&self, table: KeyValueTable, key: &str, value: &str) -> Result<(), RuntimeError> {
            self.store.put(table, key, value)
        }
    }

    /// A recharge of an unknown user: the agent stage answers it with `command_rejected`.
    pub(crate) fn rejected_recharge() -> StageRecord {
        let line = r#"{"type":"user_recharge","at":"2026-03-02T09:00:00Z","user_id":"nobody","amount":"5.00","commission":"0.00"}"#;
        let Ok(Parsed::Input(input)) = parse_line(line, || "e1".to_string()) else { panic!("an input") };
        let at = input.at;
        let Routed::Message(message) = route_input(input) else { panic!("routed to a stage") };
        StageRecord {
            id: RecordId { source: "ingest".into(), offset: 0, index: 0 },
            at,
            body: RecordBody::Message { message },
        }
    }

    /// The lag report reads a waiting record's time from its bytes: a stage record written now (an
    /// array) or by an earlier version (an object), and nothing from bytes that are neither.
    #[test]
    fn a_stage_records_time_is_read_in_either_form() {
        let record = rejected_recharge();
        let log = stage_log(StageKind::Agent, 0);
        let array = encode(&record).expect("encodes");
        assert_eq!(array.first(), Some(&b'['));
        assert_eq!(record_event_time(&log, &array), Some(record.at));
        let RecordBody::Message { message } = &record.body else { panic!("a message") };
        let object = format!(
            r#"{{"id":{{"source":"ingest","offset":0,"index":0}},"at":"{}","body":{{"kind":"message","message":{}}}}}"#,
            record.at,
            serde_json::to_string(message).expect("serializes")
        );
        assert_eq!(record_event_time(&log, object.as_bytes()), Some(record.at));
        let decoded: StageRecord =
            pipelines::decode::from_json_bytes(object.as_bytes()).expect("the object form reads");
        assert_eq!(encode(&decoded).expect("encodes"), array, "read in the old form, written in the new");
        assert_eq!(record_event_time(&log, b"[\"ingest\",0]"), None);
    }

    #[test]
    fn a_commit_that_fails_after_apply_stops_the_partition() {
        let data_dir = tempfile::tempdir().expect("a temporary directory");
        let store = AlteredStore::new(RedbStore::open(data_dir.path()).expect("the store opens"));
        let log = stage_log(StageKind::Agent, 0);
        let record = encode(&rejected_recharge()).expect("encodes");
        store
            .commit(WriteBatch {
                appends: vec![(log.as_str().into(), record)],
                offsets: Vec::new(),
                ..WriteBatch::default()
            })
            .expect("appended");
        let partition = RwLock::new(StagePartition::new(StageKind::Agent, 0, 1, pipelines::Config::default()));
        store.fail_next_commit.store(true, Ordering::SeqCst);
        let error = process_batch(&store, &partition, 1, 16).expect_err("the commit fails");
        // Retrying would apply the record again, drop it as a duplicate and commit its offset without
        // its `command_rejected`: the failure must stop the partition instead.
        assert!(!error.is_retryable(), "{error}");
        assert_eq!(store.committed(&log).expect("an offset"), 0, "nothing was committed");
        assert_eq!(store.head(OUTPUTS_LOG).expect("a head"), 0);
        // A restart rebuilds the partition from the log and produces the output once.
        let partition = RwLock::new(StagePartition::new(StageKind::Agent, 0, 1, pipelines::Config::default()));
        assert_eq!(process_batch(&store, &partition, 1, 16).expect("processed").consumed, 1);
        assert_eq!(store.head(OUTPUTS_LOG).expect("a head"), 1, "the rejection is emitted once");
    }

    /// A record encodes as `serde_json` writes it, shorter or longer than the buffer it starts in; a
    /// batch names each log it appends to once.
    #[test]
    fn records_encode_as_json_and_a_batch_names_each_log_once() {
        let short = rejected_recharge();
        let mut long = rejected_recharge();
        long.id.source = "s".repeat(4 * RECORD_BYTES_TYPICAL).into();
        for record in [&short, &long] {
            let bytes = encode(record).expect("encodes");
            assert_eq!(bytes, serde_json::to_vec(record).expect("serializes"));
            let decoded: StageRecord = serde_json::from_slice(&bytes).expect("reads back");
            assert_eq!(decoded.id.source, record.id.source);
        }
        assert!(encode(&long).expect("encodes").len() > RECORD_BYTES_TYPICAL, "the long record outgrew the buffer");
        let appends = ["agent-1", "order-0", "agent-1", "outputs", "order-0", "agent-1"]
            .into_iter()
            .map(|log| (log.into(), Vec::new()))
            .collect();
        let logs = appended_logs(&WriteBatch { appends, ..WriteBatch::default() });
        assert_eq!(logs.into_iter().collect::<Vec<_>>(), ["agent-1", "order-0", "outputs"]);
    }

    /// A batch counts the rejections and dead letters it applied, and the store times each commit and
    /// counts its batches (`crate::metrics`).
    #[test]
    fn a_batch_counts_its_rejections_and_dead_letters_and_each_commit_is_timed() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let figures =
            std::sync::Arc::new(metrics::with_local_recorder(&recorder, crate::metrics::PipelineMetrics::register));
        let data_dir = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(data_dir.path()).expect("the store opens").with_metrics(figures.clone());
        let log = stage_log(StageKind::Agent, 0);
        let rejected = encode(&rejected_recharge()).expect("encodes");
        let appends = vec![(log.as_str().into(), b"not a record".to_vec()), (log.as_str().into(), rejected)];
        store.commit(WriteBatch { appends, ..WriteBatch::default() }).expect("appended");
        let partition = RwLock::new(StagePartition::new(StageKind::Agent, 0, 1, pipelines::Config::default()));
        let mut batch = WriteBatch::default();
        assert_eq!(apply_batch(&store, &partition, 1, 16, &mut batch).expect("applied"), 2);
        let expected = AppliedCounts { rejected: vec![pipelines::output::Reason::UnknownUser], dead_letters: 1 };
        assert_eq!(batch.applied, expected);
        figures.applied(&batch.applied);
        commit_applied(&store, batch).expect("committed");
        let text = handle.render();
        let value = |series: &str| text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' '));
        assert_eq!(value(r#"paisa_commands_rejected_total{reason="unknown_user"}"#), Some("1"), "{text}");
        assert_eq!(value("paisa_dead_letters_total"), Some("1"), "{text}");
        // Two commits, one after the other: a group of one batch each.
        assert_eq!(value("paisa_store_commit_batches_count"), Some("2"), "{text}");
        assert_eq!(value("paisa_store_commit_batches_sum"), Some("2"), "{text}");
        assert_eq!(value("paisa_store_commit_duration_seconds_count"), Some("2"), "{text}");
    }
}
