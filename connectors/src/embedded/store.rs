//! The embedded [`Store`]: logs, offsets and small tables in one redb file. redb commits are atomic and
//! durable (`Durability::Immediate`: fsync before `commit` returns), so a batch's appends and its
//! consumer offset survive a kill -9 together or not at all.

use crate::runtime::{
    claim_keys, Appended, IngestEncoder, KeyValueTable, LogName, Records, RuntimeError, Store, Submission, WriteBatch,
};
use pipelines::partition::StageRecord;
use redb::{Database, ReadableTable, TableDefinition};
use std::path::Path;

/// The records of one log by offset: a table per log (`log:{name}`), so appends compare integer keys
/// and one log's pages are not interleaved with another's. A value is a segment: consecutive records one
/// commit appended to the log (a commit's records are cut into segments that fill their pages, see
/// [`PAGE_BYTES`]), keyed by the offset of the first (see [`SEGMENT_TAG`]).
fn log_table(log: &str) -> String {
    format!("log:{log}")
}
/// The first byte of a segment value, followed by each record as (length: u32 little-endian, bytes).
/// Inserting one value per log and commit instead of one per record makes an append a copy, not a
/// B-tree insertion (measured: redb's inserts were ≈ 18 % of `paisa serve`'s CPU time). A value that
/// does not start with it is one record, as data directories written before segments hold them (every
/// record is JSON, which never starts with a zero byte).
const SEGMENT_TAG: u8 = 0;
/// redb stores a segment in a leaf page of its own (a value larger than a page never shares one), laid
/// out as a 4-byte header, the value's 4-byte end and the 8-byte key before the value, in an allocation
/// of a 4 KiB page doubled as often as needed (its buddy allocator). Every byte of the allocation is
/// written, copied into the OS's cache and synced at commit, used or not, so segments are cut to fill
/// their allocations (see [`segment_bytes_for`]): cut only at 64 KiB, they left 72.6 MB of allocated
/// pages empty beside 62.0 MB stored in the serve benchmark's bulk phase (redb's statistics).
const PAGE_BYTES: usize = 4096;
/// A one-value leaf's bytes besides the value (see [`PAGE_BYTES`]).
const LEAF_OVERHEAD_BYTES: usize = 16;
/// The most bytes a segment holds unless its one record is larger: its leaf then fills 64 KiB exactly.
/// A reader starting inside a segment decodes at most this much before its first record.
const SEGMENT_BYTES_MAX: usize = 64 * 1024 - LEAF_OVERHEAD_BYTES;
/// The memory redb caches pages in (its default is 1 GiB; bounded like every other buffer). Every page
/// a transaction writes becomes a cache entry; while the cache grows, each is memory the process has
/// not touched before, which the kernel faults in and zeroes. Capped, the cache evicts old pages and
/// the allocator reuses their memory. Measured in the serve benchmark with 10,000 agents × 1 round: the
/// kernel's page clearing fell from ≈ 11 % to ≈ 2 % of the service's CPU samples, and four interleaved
/// pairs gave 44,400 events/s on average against 40,800 (the default workload: 22,300 against 22,200,
/// no change). The process's peak memory over the whole benchmark was the same (≈ 0.85 GB). What the
/// processing threads and the connector read was appended moments before, well within 64 MiB of
/// pages; older pages (a restart's replay of the logs) are read from the file, through the OS's cache.
const CACHE_BYTES_MAX: usize = 64 << 20;
/// Next offset per log.
const HEADS: TableDefinition<&str, u64> = TableDefinition::new("heads");
/// Next offset to consume per consumer.
const OFFSETS: TableDefinition<&str, u64> = TableDefinition::new("offsets");
/// Ingestion position per event id, as data directories written before the ingestion journal hold
/// them (read at open, never written now).
const EVENT_IDS: TableDefinition<&str, u64> = TableDefinition::new("event_ids");
const MERCHANT_KEYS: TableDefinition<&str, &str> = TableDefinition::new("merchant_keys");
/// Ids created by ingested inputs → their owner, as data directories written before the ingestion
/// journal hold them (read at open, never written now).
const INGESTED_KEYS: TableDefinition<&str, &str> = TableDefinition::new("ingested_keys");
/// What each ingesting request added to the ingestion index ([`IngestionIndex`]), keyed by the first
/// ingestion position it assigned: one value per request, appended at the table's end in the
/// transaction that appends its records.
/// Kept as random-key B-tree tables (event id → position, key → owner), the index cost an ingesting
/// transaction about half of its CPU time (≈ 3 of ≈ 6 ms per 1,000 inputs), all of it holding redb's
/// only writer, which every processing round and statement answer waits for (serve benchmark: the
/// writer was busy ≈ 85–90 % of the run; with the journal, ≈ 14 % more events/s: `docs/DECISIONS.md`).
const INGESTION_JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("ingestion_journal");
/// The first byte of an ingestion journal value (its format).
const JOURNAL_FORMAT: u8 = 1;
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// The counter of ingestion positions, kept among the log heads.
const INGEST_HEAD: &str = "@ingest";

pub struct RedbStore {
    database: Database,
    group: GroupCommit,
    /// Event ids and ingested keys, rebuilt at open from the journal (and the tables older data
    /// directories hold). A request's inputs are merged when they are queued for a group commit, before
    /// it is written: the next request is checked against them (see [`Store::ingest`]).
    ingestion: std::sync::RwLock<IngestionIndex>,
    /// Held while a request is checked against the index, queued and merged (two racing requests cannot
    /// both take an event id or a card); holds the ticket of the last ingestion queued (0: none).
    ingesting: std::sync::Mutex<u64>,
    /// Stage records committed by this process and not yet taken by their log's consumer.
    committed_records: std::sync::Mutex<CommittedRecords>,
    /// Where each group's commit is timed and its batches counted.
    metrics: std::sync::Arc<crate::metrics::PipelineMetrics>,
}

/// Committed stage records as their producers made them, by log and offset, until the log's consumer
/// takes them ([`Store::take_committed_records`]). Why: a processing thread spent more time decoding the
/// JSON of records this process had just encoded than applying them (≈ 11 % of the service's CPU
/// samples in the serve benchmark against ≈ 15 % applying, `perf`). The bytes are still what is
/// durable: a consumer that finds nothing here (after a restart, or behind the bound) reads the log,
/// and both give the same record (the service's state equals `paisa replay`'s, which never encodes).
///
/// Per log they are a queue in offset order, not a sorted map: a log's offsets are committed in order,
/// so keeping one is a push at the back and taking one a pop at the front. The `BTreeMap` this replaced
/// moved whole records within its nodes on every insert and removal (≈ 2 % of the service's CPU
/// samples in the serve benchmark, `perf`, thirty-first round).
#[derive(Debug, Default)]
struct CommittedRecords {
    /// Per log, in increasing offset order (with gaps where a record was not kept). Looked up once per
    /// record committed, so hashed with Fx rather than SipHash (this lookup was ≈ 0.3 % of the serve
    /// benchmark's samples with SipHash, `perf`): the keys are the runtime's own log names.
    by_log: rustc_hash::FxHashMap<LogName, std::collections::VecDeque<KeptRecord>>,
    /// The encoded lengths of the records kept, summed.
    bytes_kept: usize,
}

/// One committed record kept for its consumer.
#[derive(Debug)]
struct KeptRecord {
    offset: u64,
    record: StageRecord,
    /// Its encoded length: what it counts against the bound.
    encoded_bytes: usize,
}

/// The encoded bytes of the records kept, summed over every log, at most: past it a record is not kept,
/// and its consumer reads it from the log. The encoded length stands for a record's size in memory (a
/// crawl answer with a page of lines is tens of times a message). 32 MiB holds tens of thousands of
/// messages, more than the processing threads' batches have in flight, whatever the partition count.
const COMMITTED_RECORD_BYTES_MAX: usize = 32 << 20;

impl CommittedRecords {
    fn keep(&mut self, log: &str, offset: u64, record: StageRecord, encoded_bytes: usize) {
        if self.bytes_kept + encoded_bytes > COMMITTED_RECORD_BYTES_MAX {
            return;
        }
        // A `LogName` key is inline: building one for the lookup allocates nothing.
        let kept = self.by_log.entry(log.into()).or_default();
        let kept_record = KeptRecord { offset, record, encoded_bytes };
        if kept.back().is_none_or(|last| last.offset < offset) {
            kept.push_back(kept_record);
        } else {
            // Not reached while offsets are committed in order; kept in order all the same.
            let index = kept.partition_point(|earlier| earlier.offset < offset);
            match kept.get_mut(index).filter(|found| found.offset == offset) {
                // An offset is committed once; counted once all the same.
                Some(found) => self.bytes_kept -= std::mem::replace(found, kept_record).encoded_bytes,
                None => kept.insert(index, kept_record),
            }
        }
        self.bytes_kept += encoded_bytes;
    }

    /// Takes the records of `log` from `from` on while their offsets follow each other, and forgets the
    /// ones before `from` (the consumer is past them: it read them from the log).
    fn take(&mut self, log: &str, from: u64, records_max: usize) -> Vec<(u64, StageRecord)> {
        let Some(kept) = self.by_log.get_mut(log) else {
            return Vec::new();
        };
        let mut bytes_released = 0;
        while kept.front().is_some_and(|first| first.offset < from) {
            bytes_released += kept.pop_front().map_or(0, |forgotten| forgotten.encoded_bytes);
        }
        let mut taken = Vec::with_capacity(kept.len().min(records_max));
        while taken.len() < records_max && kept.front().is_some_and(|first| first.offset == from + taken.len() as u64) {
            if let Some(KeptRecord { offset, record, encoded_bytes }) = kept.pop_front() {
                bytes_released += encoded_bytes;
                taken.push((offset, record));
            }
        }
        self.bytes_kept -= bytes_released;
        taken
    }
}

/// Every event id ingested, with its ingestion position (SPEC §3: an event id is applied once), and
/// every key an ingested input created, with its first owner. It grows with every input ever
/// ingested, as the stage partitions' own sets of seen ids do (≈ 40 bytes per event id in memory).
#[derive(Debug, Default)]
struct IngestionIndex {
    positions: rustc_hash::FxHashMap<pipelines::Text, u64>,
    owners: rustc_hash::FxHashMap<pipelines::Text, pipelines::Text>,
    /// The position the next new input gets (the durable `INGEST_HEAD`, checked at each write).
    next_position: u64,
}

impl IngestionIndex {
    /// Adds what one journal value records: the first position and owner of each stay, and the next
    /// position moves past its inputs.
    fn merge(&mut self, first_position: u64, entries: Vec<JournalEntry>) {
        self.next_position = self.next_position.max(first_position + entries.len() as u64);
        for (position, entry) in (first_position..).zip(entries) {
            let first = *self.positions.entry(entry.event_id.as_str().into()).or_insert(position);
            debug_assert_eq!(first, position, "event id {} journaled twice", entry.event_id);
            for (key, owner) in entry.keys {
                self.owners.entry(key.into()).or_insert_with(|| owner.into());
            }
        }
    }
}

/// A request's ingestion, encoded and not yet written.
struct PreparedIngestion {
    /// The position of its first new input; the others follow.
    first_position: u64,
    /// Per input of the request, in order.
    outcomes: Vec<Appended>,
    /// (log, record) of its new inputs, in order.
    records: Records,
    /// The stage records among `records`, as made (index in `records`, record).
    stage_records: Vec<(usize, StageRecord)>,
    /// Its new inputs, in position order.
    journal: Vec<JournalEntry>,
}

/// One input an ingesting request took: its event id and the keys it created (key, owner).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct JournalEntry {
    event_id: String,
    keys: Vec<(String, String)>,
}

/// A journal value: [`JOURNAL_FORMAT`], then per entry its event id, its key count (u32 little-endian)
/// and each key and owner; every string as (u32 little-endian length, UTF-8 bytes).
fn encode_journal(entries: &[JournalEntry]) -> Result<Vec<u8>, RuntimeError> {
    fn put(bytes: &mut Vec<u8>, length: usize) -> Result<(), RuntimeError> {
        let length = u32::try_from(length).map_err(|_| fatal(format!("a journal field of {length} bytes")))?;
        bytes.extend_from_slice(&length.to_le_bytes());
        Ok(())
    }
    let mut bytes = vec![JOURNAL_FORMAT];
    for entry in entries {
        put(&mut bytes, entry.event_id.len())?;
        bytes.extend_from_slice(entry.event_id.as_bytes());
        put(&mut bytes, entry.keys.len())?;
        for text in entry.keys.iter().flat_map(|(key, owner)| [key, owner]) {
            put(&mut bytes, text.len())?;
            bytes.extend_from_slice(text.as_bytes());
        }
    }
    Ok(bytes)
}

fn decode_journal(bytes: &[u8]) -> Result<Vec<JournalEntry>, RuntimeError> {
    let corrupt = || fatal("an ingestion journal value is corrupt");
    let Some((&JOURNAL_FORMAT, mut rest)) = bytes.split_first() else {
        return Err(corrupt());
    };
    let number = |rest: &mut &[u8]| -> Result<usize, RuntimeError> {
        let (length, after) = rest.split_first_chunk::<4>().ok_or_else(corrupt)?;
        *rest = after;
        Ok(u32::from_le_bytes(*length) as usize)
    };
    let text = |rest: &mut &[u8], length: usize| -> Result<String, RuntimeError> {
        if rest.len() < length {
            return Err(corrupt());
        }
        let (text, after) = rest.split_at(length);
        *rest = after;
        String::from_utf8(text.to_vec()).map_err(|_| corrupt())
    };
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let length = number(&mut rest)?;
        let event_id = text(&mut rest, length)?;
        let count = number(&mut rest)?;
        // Each key takes at least 8 bytes: a corrupt count cannot make this reserve much.
        let mut keys = Vec::with_capacity(count.min(rest.len() / 8));
        for _ in 0..count {
            let length = number(&mut rest)?;
            let key = text(&mut rest, length)?;
            let length = number(&mut rest)?;
            keys.push((key, text(&mut rest, length)?));
        }
        entries.push(JournalEntry { event_id, keys });
    }
    Ok(entries)
}

/// Write batches committed together (group commit). redb has one writer: committers that arrive while
/// a transaction is open queue their batches, and the next leader writes all of them in one
/// transaction with one fsync. Measured before (serve benchmark): each of the three committers — two
/// processing threads and the statement connector — spent about half of its commit time waiting for
/// the writer, ≈ 1 s each over the run. Every batch is still all-or-nothing (a group is one
/// transaction), and batches are applied in arrival order, so one committer's batches keep theirs.
/// A committer may queue batches without waiting (`Store::submit`), so that its next batch joins the
/// group formed while its last one is written; each batch names the offsets it consumed from, and a
/// batch queued behind a failed one of its consumer fails with it (`WriteBatch::expected_offsets`).
/// A request's ingestion joins the groups too ([`Queued::ingestion`]), so concurrent requests share
/// commits: 16 clients posting one event per request, ≈ 4,100–4,400 events/s against ≈ 850–1,050 when
/// each request committed a transaction of its own under the ingestion lock (serve benchmark).
#[derive(Default)]
struct GroupCommit {
    state: std::sync::Mutex<GroupState>,
    written: std::sync::Condvar,
}

/// A batch waiting for its group.
struct Queued {
    ticket: u64,
    batch: WriteBatch,
    /// What a request's ingestion writes beside its records (None: a processing round's batch).
    ingestion: Option<IngestionWrite>,
}

/// The ingestion journal value of a request's new inputs and the ingestion head it moves to, written in
/// the transaction that appends their records.
struct IngestionWrite {
    /// The position of the request's first new input: the ingestion head the transaction must find.
    first_position: u64,
    /// The journal value ([`encode_journal`]), keyed by `first_position`.
    journal: Vec<u8>,
    /// The ingestion head after the request's new inputs.
    next_position: u64,
}

#[derive(Default)]
struct GroupState {
    /// Batches waiting for the next group, by ticket.
    queue: Vec<Queued>,
    /// The last ticket handed out.
    last_ticket: u64,
    /// Every ticket up to this one is written (or failed).
    written_through: u64,
    /// A leader is writing a group.
    writing: bool,
    /// Groups that failed, as (first ticket, last ticket, error), the latest [`FAILED_GROUPS_MAX`].
    failed: std::collections::VecDeque<(u64, u64, String)>,
    /// The ticket of the first ingestion whose group failed. From it on the index holds inputs that are
    /// not durable, and no ingestion can commit (each must find the ingestion head where it left it).
    ingestion_failed_from: Option<u64>,
}

impl GroupState {
    /// How the group that wrote `ticket` ended.
    fn outcome(&self, ticket: u64) -> Result<(), RuntimeError> {
        debug_assert!(ticket <= self.written_through, "asked before the ticket's group was written");
        match self.failed.iter().find(|(first, last, _)| (*first..=*last).contains(&ticket)) {
            Some((_, _, error)) => Err(RuntimeError::Fatal(error.clone())),
            None => Ok(()),
        }
    }
}

/// Failed groups remembered for their waiting committers (a failure stops the service).
const FAILED_GROUPS_MAX: usize = 16;
/// Batches one group takes at most (the rest wait for the next).
const GROUP_BATCHES_MAX: usize = 64;

fn lock(group: &GroupCommit) -> std::sync::MutexGuard<'_, GroupState> {
    group.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fatal(error: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Fatal(error.to_string())
}

impl RedbStore {
    /// Opens (or creates) the store in `data_dir`, creating its tables.
    pub fn open(data_dir: &Path) -> Result<RedbStore, RuntimeError> {
        std::fs::create_dir_all(data_dir).map_err(fatal)?;
        let database =
            Database::builder().set_cache_size(CACHE_BYTES_MAX).create(data_dir.join("paisa.redb")).map_err(fatal)?;
        let transaction = database.begin_write().map_err(fatal)?;
        {
            transaction.open_table(HEADS).map_err(fatal)?;
            transaction.open_table(OFFSETS).map_err(fatal)?;
            transaction.open_table(EVENT_IDS).map_err(fatal)?;
            transaction.open_table(MERCHANT_KEYS).map_err(fatal)?;
            transaction.open_table(META).map_err(fatal)?;
            transaction.open_table(INGESTED_KEYS).map_err(fatal)?;
            transaction.open_table(INGESTION_JOURNAL).map_err(fatal)?;
        }
        transaction.commit().map_err(fatal)?;
        let ingestion = std::sync::RwLock::new(Self::load_ingestion_index(&database)?);
        Ok(RedbStore {
            database,
            group: GroupCommit::default(),
            ingestion,
            ingesting: std::sync::Mutex::new(0),
            committed_records: std::sync::Mutex::default(),
            metrics: std::sync::Arc::default(),
        })
    }

    /// Times each group commit and counts its batches in `metrics`, and times each ingestion's wait.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::PipelineMetrics>) -> RedbStore {
        self.metrics = metrics;
        self
    }

    /// The ingestion index as the data directory records it: the tables of directories written before
    /// the journal, then the journal in position order.
    fn load_ingestion_index(database: &Database) -> Result<IngestionIndex, RuntimeError> {
        let transaction = database.begin_read().map_err(fatal)?;
        let mut index = IngestionIndex::default();
        for entry in transaction.open_table(EVENT_IDS).map_err(fatal)?.iter().map_err(fatal)? {
            let (event_id, position) = entry.map_err(fatal)?;
            index.positions.insert(event_id.value().into(), position.value());
        }
        for entry in transaction.open_table(INGESTED_KEYS).map_err(fatal)?.iter().map_err(fatal)? {
            let (key, owner) = entry.map_err(fatal)?;
            index.owners.insert(key.value().into(), owner.value().into());
        }
        for entry in transaction.open_table(INGESTION_JOURNAL).map_err(fatal)?.iter().map_err(fatal)? {
            let (first_position, value) = entry.map_err(fatal)?;
            index.merge(first_position.value(), decode_journal(value.value())?);
        }
        let head = transaction.open_table(HEADS).map_err(fatal)?.get(INGEST_HEAD).map_err(fatal)?;
        let head = head.map_or(0, |value| value.value());
        if head < index.next_position {
            return Err(fatal(format!("the ingestion head {head} is behind the journal ({})", index.next_position)));
        }
        index.next_position = head;
        Ok(index)
    }

    fn ingestion_index(&self) -> std::sync::RwLockReadGuard<'_, IngestionIndex> {
        self.ingestion.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Assigns positions to the request's new inputs and encodes them, checked against the index and
    /// the request's own earlier inputs (an event id may repeat within a request). Nothing is written.
    /// The caller holds [`RedbStore::ingesting`], so the index cannot change before the request is
    /// written and merged.
    fn prepare_ingestion(
        &self,
        event_ids: &[&str],
        encode: &mut IngestEncoder<'_>,
    ) -> Result<PreparedIngestion, RuntimeError> {
        let index = self.ingestion_index();
        let mut prepared = PreparedIngestion {
            first_position: index.next_position,
            // An input is one record, and most inputs are new: room for them all up front.
            outcomes: Vec::with_capacity(event_ids.len()),
            records: Vec::with_capacity(event_ids.len()),
            stage_records: Vec::with_capacity(event_ids.len()),
            journal: Vec::with_capacity(event_ids.len()),
        };
        let mut new_positions: rustc_hash::FxHashMap<&str, u64> = Default::default();
        let mut new_owners: rustc_hash::FxHashMap<String, String> = Default::default();
        for (request_index, event_id) in event_ids.iter().enumerate() {
            if let Some(earlier) = index.positions.get(*event_id).or_else(|| new_positions.get(*event_id)) {
                prepared.outcomes.push(Appended::Duplicate { position: *earlier });
                continue;
            }
            let position = prepared.first_position + prepared.journal.len() as u64;
            let ingested = encode(request_index, position)?;
            let first_record = prepared.records.len();
            prepared
                .stage_records
                .extend(ingested.stage_records.into_iter().map(|(index, record)| (first_record + index, record)));
            prepared.records.extend(ingested.records);
            // A refusal returns before anything of the request is written.
            let owner_of = |key: &str| index.owners.get(key).map(|owner| owner.as_str());
            let created = claim_keys(owner_of, &mut new_owners, ingested.keys, ingested.exclusive_keys)?;
            new_positions.insert(event_id, position);
            prepared.journal.push(JournalEntry { event_id: event_id.to_string(), keys: created });
            prepared.outcomes.push(Appended::New { position });
        }
        Ok(prepared)
    }

    /// Writes the queued batches (at most [`GROUP_BATCHES_MAX`]) as one group, without the lock
    /// meanwhile, then wakes the committers waiting for them. The caller's batch is among them: it
    /// waited behind at most earlier groups' batches, which were written first.
    fn lead_group<'a>(
        &'a self,
        mut state: std::sync::MutexGuard<'a, GroupState>,
    ) -> std::sync::MutexGuard<'a, GroupState> {
        state.writing = true;
        let taken = state.queue.len().min(GROUP_BATCHES_MAX);
        let group: Vec<Queued> = state.queue.drain(..taken).collect();
        drop(state);
        let (first, last) = (group[0].ticket, group[group.len() - 1].ticket);
        let first_ingestion = group.iter().find(|queued| queued.ingestion.is_some()).map(|queued| queued.ticket);
        debug_assert!(group.windows(2).all(|pair| pair[0].ticket < pair[1].ticket), "tickets in order");
        let started = std::time::Instant::now();
        // A panic (a bug) must still release the committers waiting for this group.
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.write_group(group)))
            .unwrap_or_else(|_| Err(fatal("writing a group of batches panicked")));
        if written.is_ok() {
            self.metrics.store_commit(taken, started.elapsed());
        }
        let mut state = lock(&self.group);
        state.writing = false;
        state.written_through = last;
        if let Err(error) = written {
            if let Some(ticket) = first_ingestion {
                state.ingestion_failed_from.get_or_insert(ticket);
            }
            state.failed.push_back((first, last, error.to_string()));
            if state.failed.len() > FAILED_GROUPS_MAX {
                state.failed.pop_front();
            }
        }
        self.group.written.notify_all();
        state
    }

    /// Writes batches in one transaction, in order: each batch's appends, then its ingestion journal
    /// value or its consumer offsets.
    fn write_group(&self, group: Vec<Queued>) -> Result<(), RuntimeError> {
        // Kept until the transaction is written: the appender borrows their records.
        let (batches, ingestions): (Vec<WriteBatch>, Vec<Option<IngestionWrite>>) =
            group.into_iter().map(|queued| (queued.batch, queued.ingestion)).unzip();
        // The offset of each append, the batches' appends in order.
        let mut offsets_appended = Vec::with_capacity(batches.iter().map(|batch| batch.appends.len()).sum());
        let transaction = self.database.begin_write().map_err(fatal)?;
        {
            let mut heads = transaction.open_table(HEADS).map_err(fatal)?;
            let mut offsets = transaction.open_table(OFFSETS).map_err(fatal)?;
            let mut appender = Appender::new(&transaction);
            for (batch, ingestion) in batches.iter().zip(&ingestions) {
                for (log, bytes) in &batch.appends {
                    offsets_appended.push(appender.append(&heads, log, bytes)?);
                }
                if let Some(ingestion) = ingestion {
                    write_ingestion(&transaction, &mut heads, ingestion)?;
                }
                debug_assert!(
                    batch
                        .expected_offsets
                        .iter()
                        .all(|(expected, _)| batch.offsets.iter().any(|(moved, _)| moved == expected)),
                    "an expected offset names a consumer the batch does not move"
                );
                for (consumer, next) in &batch.offsets {
                    // Read after the group's earlier batches set theirs: a consumer's batches follow
                    // each other in one group as across groups.
                    let previous = offsets.get(consumer.as_str()).map_err(fatal)?.map_or(0, |value| value.value());
                    let expected = batch.expected_offsets.iter().find(|(expected, _)| expected == consumer);
                    if let Some((_, from)) = expected.filter(|(_, from)| *from != previous) {
                        return Err(fatal(format!(
                            "consumer {consumer} is at {previous}; the batch consumed from {from} (one before it failed?)"
                        )));
                    }
                    // Offsets only move forward: a stale commit would replay records twice. An error,
                    // not a panic: a leader that panicked would leave the group's other committers waiting.
                    if *next < previous {
                        return Err(fatal(format!("consumer {consumer} moved back from {previous} to {next}")));
                    }
                    offsets.insert(consumer.as_str(), *next).map_err(fatal)?;
                }
            }
            appender.finish(&mut heads)?;
        }
        transaction.commit().map_err(fatal)?;
        self.keep_committed_records(batches, &offsets_appended);
        Ok(())
    }

    /// Takes a ticket and queues the batch (with what it writes as an ingestion, if it is one).
    fn queue_ticket(&self, batch: WriteBatch, ingestion: Option<IngestionWrite>) -> u64 {
        let mut state = lock(&self.group);
        state.last_ticket += 1;
        let ticket = state.last_ticket;
        state.queue.push(Queued { ticket, batch, ingestion });
        ticket
    }

    /// An error if the ingestion of `ticket` or one before it failed to commit (any ticket: None). The
    /// index then holds inputs that are not durable, and only a restart, which rebuilds it from the
    /// journal, brings the two together again, so no ingestion is taken until then.
    fn refuse_after_failed_ingestion(&self, ticket: Option<u64>) -> Result<(), RuntimeError> {
        match lock(&self.group).ingestion_failed_from {
            Some(failed) if ticket.is_none_or(|ticket| failed <= ticket) => Err(fatal(format!(
                "the ingestion of ticket {failed} failed to commit: restart the service to ingest again"
            ))),
            _ => Ok(()),
        }
    }

    /// Keeps the batches' stage records, now committed, for their logs' consumers.
    fn keep_committed_records(&self, batches: Vec<WriteBatch>, offsets_appended: &[u64]) {
        let mut first_append = 0;
        for batch in batches {
            let offsets = offsets_appended.get(first_append..).unwrap_or_default();
            self.keep_committed(&batch.appends, offsets, batch.stage_records);
            first_append += batch.appends.len();
        }
    }

    /// Keeps committed stage records for their logs' consumers: `stage_records` index `appends`, whose
    /// offsets are `offsets` (as many or more).
    fn keep_committed(&self, appends: &Records, offsets: &[u64], stage_records: Vec<(usize, StageRecord)>) {
        if stage_records.is_empty() {
            return;
        }
        debug_assert!(offsets.len() >= appends.len(), "an offset per append");
        let mut committed = self.committed_records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (index, record) in stage_records {
            // Every index names an append (`WriteBatch::append_stage_record`, `Ingested::stage_records`).
            if let (Some((log, bytes)), Some(&offset)) = (appends.get(index), offsets.get(index)) {
                committed.keep(log, offset, record, bytes.len());
            }
        }
    }

    /// Records appended to each (log, consumer) pair's log and not yet consumed, read in one
    /// transaction: a batch that consumes from one log and appends to another moves its records
    /// between logs atomically, so the figures never miss them (separate reads could see neither).
    fn backlog_in_one_transaction(&self, pairs: &[(&str, &str)]) -> Result<Vec<u64>, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let heads = transaction.open_table(HEADS).map_err(fatal)?;
        let offsets = transaction.open_table(OFFSETS).map_err(fatal)?;
        let backlog_of = |(log, consumer): &(&str, &str)| {
            let head = heads.get(*log).map_err(fatal)?.map_or(0, |value| value.value());
            let committed = offsets.get(*consumer).map_err(fatal)?.map_or(0, |value| value.value());
            Ok(head.saturating_sub(committed))
        };
        pairs.iter().map(backlog_of).collect()
    }

    /// The first record not yet consumed of each (log, consumer) pair's log, read in one transaction.
    fn first_unconsumed_in_one_transaction(
        &self,
        pairs: &[(&str, &str)],
    ) -> Result<Vec<Option<Vec<u8>>>, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let heads = transaction.open_table(HEADS).map_err(fatal)?;
        let offsets = transaction.open_table(OFFSETS).map_err(fatal)?;
        let first_of = |(log, consumer): &(&str, &str)| {
            let head = heads.get(*log).map_err(fatal)?.map_or(0, |value| value.value());
            let committed = offsets.get(*consumer).map_err(fatal)?.map_or(0, |value| value.value());
            if committed >= head {
                return Ok(None);
            }
            let table = transaction.open_table(TableDefinition::<u64, &[u8]>::new(&log_table(log))).map_err(fatal)?;
            record_at(&table, committed)
        };
        pairs.iter().map(first_of).collect()
    }

    fn read_u64(&self, table: TableDefinition<&str, u64>, key: &str) -> Result<u64, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let table = transaction.open_table(table).map_err(fatal)?;
        Ok(table.get(key).map_err(fatal)?.map_or(0, |value| value.value()))
    }
}

/// Appends within one write transaction: each log's table is opened once, its head kept in memory and
/// its records gathered into segments; [`Appender::finish`] writes the segments and the new heads.
/// The records are borrowed until then: each segment is written once, straight into the page redb
/// reserves for it (`insert_reserve`), not assembled in a buffer first. Why: a growing buffer per log
/// and commit took fresh memory at every doubling, which the kernel faulted in and zeroed (≈ 5 % of the
/// service's CPU samples in the serve benchmark, `perf`), and its bytes were copied twice.
struct Appender<'txn, 'records> {
    transaction: &'txn redb::WriteTransaction,
    logs: std::collections::BTreeMap<String, OpenLog<'txn, 'records>>,
}

/// A log being appended to in a write transaction.
struct OpenLog<'txn, 'records> {
    table: redb::Table<'txn, u64, &'static [u8]>,
    /// The offset the next record gets.
    head: u64,
    /// The offset of the open segment's first record.
    segment_first: u64,
    /// The open segment's length once written: its tag and each record with its length (0: none open).
    segment_bytes: usize,
    /// The open segment's records, in order.
    segment_records: Vec<&'records [u8]>,
}

impl OpenLog<'_, '_> {
    /// Writes the pending records as segments that fill their pages ([`segment_bytes_for`]).
    fn close_segments(&mut self) -> Result<(), RuntimeError> {
        let all = std::mem::take(&mut self.segment_records);
        // What the records not yet written would take as one segment: kept while appending, then
        // lowered by each segment written (its records; the tag stays counted once).
        let mut pending_bytes = self.segment_bytes;
        debug_assert_eq!(pending_bytes, if all.is_empty() { 0 } else { segment_length(&all) });
        let mut start = 0;
        while start < all.len() {
            let pending = all.get(start..).unwrap_or_default();
            let capacity = segment_bytes_for(pending_bytes);
            // At least one record, however large; then as many as fit.
            let mut length = segment_length(pending.get(..1).unwrap_or_default());
            let mut count = 1;
            for record in pending.iter().skip(1) {
                if length + 4 + record.len() > capacity {
                    break;
                }
                length += 4 + record.len();
                count += 1;
            }
            let records = pending.get(..count).unwrap_or_default();
            self.write_segment_at(self.segment_first + start as u64, records, length)?;
            start += count;
            pending_bytes -= length - 1;
        }
        debug_assert!(all.is_empty() || pending_bytes == 1, "only the tag is left counted");
        // The emptied vector is kept for its capacity.
        self.segment_records = all;
        self.segment_records.clear();
        self.segment_bytes = 0;
        Ok(())
    }

    fn write_segment_at(&mut self, first: u64, records: &[&[u8]], length: usize) -> Result<(), RuntimeError> {
        let reserved = u32::try_from(length).map_err(|_| fatal(format!("a segment of {length} bytes")))?;
        let mut value = self.table.insert_reserve(first, reserved).map_err(fatal)?;
        let written = write_segment(value.as_mut(), records);
        // The length reserved is the length computed from the records: a mismatch would leave bytes
        // of the page unwritten, which readers would decode as records.
        if written != length {
            return Err(fatal(format!("a segment of {length} bytes wrote {written}")));
        }
        Ok(())
    }
}

/// A segment's length once written: its tag, then each record after its 4-byte length.
fn segment_length(records: &[&[u8]]) -> usize {
    1 + records.iter().map(|record| 4 + record.len()).sum::<usize>()
}

/// The most bytes the next segment of `pending` bytes of records should hold. All of them when they
/// fill the smallest leaf that holds them (at most [`SEGMENT_BYTES_MAX`]) to at least 7/8; otherwise
/// the leaf half that size, which they fill, and the rest goes to the next segments. So a commit's
/// 20 KiB of records become segments of ≈ 16 and ≈ 4 KiB in leaves of 16 and 4 KiB, not one segment in
/// a leaf of 32 KiB.
fn segment_bytes_for(pending: usize) -> usize {
    let one_page = PAGE_BYTES - LEAF_OVERHEAD_BYTES;
    if pending <= one_page {
        return pending;
    }
    let mut leaf = PAGE_BYTES;
    while leaf - LEAF_OVERHEAD_BYTES < pending.min(SEGMENT_BYTES_MAX) {
        leaf *= 2;
    }
    let holds_all = leaf - LEAF_OVERHEAD_BYTES;
    if pending * 8 >= holds_all * 7 {
        holds_all
    } else {
        leaf / 2 - LEAF_OVERHEAD_BYTES
    }
}

/// Writes a request's ingestion journal value and moves the ingestion head past its inputs, after
/// checking the head is where the request's positions start (one request is prepared at a time, so
/// only a bug makes them differ; an error fails the whole group, as any write error does).
fn write_ingestion(
    transaction: &redb::WriteTransaction,
    heads: &mut redb::Table<&str, u64>,
    ingestion: &IngestionWrite,
) -> Result<(), RuntimeError> {
    debug_assert!(ingestion.next_position > ingestion.first_position, "an ingestion writes new inputs");
    let durable_head = heads.get(INGEST_HEAD).map_err(fatal)?.map_or(0, |value| value.value());
    if durable_head != ingestion.first_position {
        return Err(fatal(format!(
            "the ingestion head is {durable_head}, the index expected {}",
            ingestion.first_position
        )));
    }
    let mut journal_table = transaction.open_table(INGESTION_JOURNAL).map_err(fatal)?;
    journal_table.insert(ingestion.first_position, ingestion.journal.as_slice()).map_err(fatal)?;
    heads.insert(INGEST_HEAD, ingestion.next_position).map_err(fatal)?;
    Ok(())
}

/// Writes a segment (its tag, then each record after its length) into `out`; returns the bytes written.
fn write_segment(out: &mut [u8], records: &[&[u8]]) -> usize {
    let mut written = 0;
    let mut put = |bytes: &[u8]| {
        if let Some(place) = out.get_mut(written..written + bytes.len()) {
            place.copy_from_slice(bytes);
        }
        written += bytes.len();
    };
    put(&[SEGMENT_TAG]);
    for record in records {
        // Lengths were checked to fit in a u32 when the record was appended.
        put(&(record.len() as u32).to_le_bytes());
        put(record);
    }
    written
}

impl<'txn, 'records> Appender<'txn, 'records> {
    fn new(transaction: &'txn redb::WriteTransaction) -> Appender<'txn, 'records> {
        Appender { transaction, logs: std::collections::BTreeMap::new() }
    }

    fn append(
        &mut self,
        heads: &redb::Table<&str, u64>,
        log: &str,
        bytes: &'records [u8],
    ) -> Result<u64, RuntimeError> {
        if u32::try_from(bytes.len()).is_err() {
            return Err(fatal(format!("a record of {} bytes", bytes.len())));
        }
        if !self.logs.contains_key(log) {
            let name = log_table(log);
            let table = self.transaction.open_table(TableDefinition::<u64, &[u8]>::new(&name)).map_err(fatal)?;
            let head = heads.get(log).map_err(fatal)?.map_or(0, |value| value.value());
            let open = OpenLog { table, head, segment_first: head, segment_bytes: 0, segment_records: Vec::new() };
            self.logs.insert(log.to_string(), open);
        }
        let Some(open) = self.logs.get_mut(log) else {
            return Err(RuntimeError::Fatal(format!("log {log} was not opened")));
        };
        // A segment full to SEGMENT_BYTES_MAX is written now; the rest wait for `finish` to be cut.
        if open.segment_bytes > 0 && open.segment_bytes + 4 + bytes.len() > SEGMENT_BYTES_MAX {
            open.close_segments()?;
        }
        if open.segment_bytes == 0 {
            open.segment_first = open.head;
            open.segment_bytes = 1;
        }
        open.segment_bytes += 4 + bytes.len();
        open.segment_records.push(bytes);
        let offset = open.head;
        open.head += 1;
        Ok(offset)
    }

    /// Writes the open segments and the new heads.
    fn finish(mut self, heads: &mut redb::Table<&str, u64>) -> Result<(), RuntimeError> {
        for (log, open) in &mut self.logs {
            open.close_segments()?;
            heads.insert(log.as_str(), open.head).map_err(fatal)?;
        }
        Ok(())
    }
}

/// The records of a stored value (a segment, or one record written before segments), in order.
fn records_of(value: &[u8]) -> Result<Vec<&[u8]>, RuntimeError> {
    let Some((&SEGMENT_TAG, mut rest)) = value.split_first() else {
        return Ok(vec![value]);
    };
    let mut records = Vec::new();
    while !rest.is_empty() {
        let corrupt = || fatal("a log segment is truncated");
        let (length, after) = rest.split_first_chunk::<4>().ok_or_else(corrupt)?;
        let length = u32::from_le_bytes(*length) as usize;
        if after.len() < length {
            return Err(corrupt());
        }
        let (record, after) = after.split_at(length);
        records.push(record);
        rest = after;
    }
    Ok(records)
}

/// The record at `offset` of a log's table, if it holds one: in the last segment starting at or before it.
fn record_at(table: &impl ReadableTable<u64, &'static [u8]>, offset: u64) -> Result<Option<Vec<u8>>, RuntimeError> {
    let Some(entry) = table.range(..=offset).map_err(fatal)?.next_back() else {
        return Ok(None);
    };
    let (key, value) = entry.map_err(fatal)?;
    let index = usize::try_from(offset - key.value()).map_err(fatal)?;
    Ok(records_of(value.value())?.get(index).map(|record| record.to_vec()))
}

impl Store for RedbStore {
    fn read(&self, log: &str, from: u64, records_max: usize) -> Result<Vec<(u64, Vec<u8>)>, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let name = log_table(log);
        let table = match transaction.open_table(TableDefinition::<u64, &[u8]>::new(&name)) {
            Ok(table) => table,
            // Nothing was ever appended to this log.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(fatal(error)),
        };
        // The segment holding `from` is the last one starting at or before it.
        let first_segment = match table.range(..=from).map_err(fatal)?.next_back() {
            Some(entry) => entry.map_err(fatal)?.0.value(),
            None => from,
        };
        let mut records = Vec::with_capacity(records_max.min(4096));
        for entry in table.range(first_segment..).map_err(fatal)? {
            if records.len() >= records_max {
                break;
            }
            let (key, value) = entry.map_err(fatal)?;
            let segment_first = key.value();
            for (index, record) in records_of(value.value())?.into_iter().enumerate() {
                let offset = segment_first + index as u64;
                if offset >= from && records.len() < records_max {
                    records.push((offset, record.to_vec()));
                }
            }
        }
        Ok(records)
    }

    fn take_committed_records(&self, log: &str, from: u64, records_max: usize) -> Vec<(u64, StageRecord)> {
        let mut committed = self.committed_records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        committed.take(log, from, records_max)
    }

    fn head(&self, log: &str) -> Result<u64, RuntimeError> {
        self.read_u64(HEADS, log)
    }

    fn committed(&self, consumer: &str) -> Result<u64, RuntimeError> {
        self.read_u64(OFFSETS, consumer)
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), RuntimeError> {
        let submission = self.submit(batch);
        self.wait_for(submission)
    }

    fn queues_commits(&self) -> bool {
        true
    }

    /// Takes a ticket and queues the batch; whoever waits for a ticket not yet written leads the next
    /// group if no one is writing.
    fn submit(&self, batch: WriteBatch) -> Submission {
        Submission::Queued { ticket: self.queue_ticket(batch, None) }
    }

    fn wait_for(&self, submission: Submission) -> Result<(), RuntimeError> {
        let ticket = match submission {
            Submission::Queued { ticket } => ticket,
            Submission::Done(outcome) => return outcome,
        };
        let mut state = lock(&self.group);
        if ticket > state.last_ticket {
            return Err(fatal(format!("ticket {ticket} was never handed out")));
        }
        while state.written_through < ticket {
            state = if state.writing {
                self.group.written.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner)
            } else {
                self.lead_group(state)
            };
        }
        state.outcome(ticket)
    }

    /// Encodes the request's new inputs holding only the ingestion lock, queues them for the next group
    /// commit and merges them into the index, then waits, without the lock, until they are durable. So
    /// concurrent requests share commits instead of taking one each, and redb's writer, which every
    /// processing round and statement answer queues for, is not held while inputs are encoded.
    ///
    /// The next request is checked against inputs queued and not yet written: they are written first
    /// (tickets are written in order), and if their group fails, every later ingestion fails too. A
    /// request whose inputs were all ingested before waits for the last ingestion queued, so that it
    /// never answers `duplicate` for an input that is not durable.
    fn ingest(&self, event_ids: &[&str], encode: &mut IngestEncoder<'_>) -> Result<Vec<Appended>, RuntimeError> {
        let (ticket, outcomes) = {
            let mut last_ingestion = self.ingesting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.refuse_after_failed_ingestion(None)?;
            let prepared = self.prepare_ingestion(event_ids, encode)?;
            if !prepared.journal.is_empty() {
                let ingestion = IngestionWrite {
                    first_position: prepared.first_position,
                    journal: encode_journal(&prepared.journal)?,
                    next_position: prepared.first_position + prepared.journal.len() as u64,
                };
                let appends = prepared.records;
                let batch = WriteBatch { appends, stage_records: prepared.stage_records, ..WriteBatch::default() };
                *last_ingestion = self.queue_ticket(batch, Some(ingestion));
                let mut index = self.ingestion.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                index.merge(prepared.first_position, prepared.journal);
            }
            (*last_ingestion, prepared.outcomes)
        };
        if ticket == 0 {
            // Nothing was queued since the store opened: every input was ingested before, durably.
            return Ok(outcomes);
        }
        let queued_at = std::time::Instant::now();
        self.wait_for(Submission::Queued { ticket })?;
        self.metrics.ingestion_waited(queued_at.elapsed());
        self.refuse_after_failed_ingestion(Some(ticket))?;
        Ok(outcomes)
    }

    // No `ingestion_reader` of its own: the default looks each id up under the lock, one at a time. The
    // index only grows and a key's first owner stays, so a later lookup sees all an earlier one saw; a
    // reader holding the lock through a request would deadlock an ingestion on the same thread.
    fn event_position(&self, event_id: &str) -> Result<Option<u64>, RuntimeError> {
        Ok(self.ingestion_index().positions.get(event_id).copied())
    }

    fn ingested_key(&self, key: &str) -> Result<Option<String>, RuntimeError> {
        Ok(self.ingestion_index().owners.get(key).map(|owner| owner.to_string()))
    }

    fn get(&self, table: KeyValueTable, key: &str) -> Result<Option<String>, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let table = transaction.open_table(definition(table)).map_err(fatal)?;
        Ok(table.get(key).map_err(fatal)?.map(|value| value.value().to_string()))
    }

    fn first_unconsumed(&self, pairs: &[(&str, &str)]) -> Option<Result<Vec<Option<Vec<u8>>>, RuntimeError>> {
        Some(self.first_unconsumed_in_one_transaction(pairs))
    }

    fn backlog(&self, pairs: &[(&str, &str)]) -> Result<Vec<u64>, RuntimeError> {
        self.backlog_in_one_transaction(pairs)
    }

    fn put(&self, table: KeyValueTable, key: &str, value: &str) -> Result<(), RuntimeError> {
        let transaction = self.database.begin_write().map_err(fatal)?;
        {
            let mut table = transaction.open_table(definition(table)).map_err(fatal)?;
            table.insert(key, value).map_err(fatal)?;
        }
        transaction.commit().map_err(fatal)
    }
}

fn definition(table: KeyValueTable) -> TableDefinition<'static, &'static str, &'static str> {
    match table {
        KeyValueTable::MerchantKeys => MERCHANT_KEYS,
        KeyValueTable::Meta => META,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Ingested;

    fn bind(store: &RedbStore, event_id: &str, card: &str, user: &str) -> Result<Vec<Appended>, RuntimeError> {
        store.ingest(&[event_id], &mut |_, position| {
            Ok(Ingested {
                records: vec![("agent-0".into(), format!("{position}").into_bytes())],
                stage_records: Vec::new(),
                keys: Vec::new(),
                exclusive_keys: vec![(format!("card:{card}"), user.to_string())],
                at_ms: None,
            })
        })
    }

    #[test]
    fn a_card_belongs_to_one_agent_even_when_requests_race() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        assert_eq!(bind(&store, "e1", "k1", "u1").expect("bound"), vec![Appended::New { position: 0 }]);
        let refused = bind(&store, "e2", "k1", "u2");
        assert!(matches!(refused, Err(RuntimeError::Invalid(_))), "{refused:?}");
        assert_eq!(store.head("agent-0").expect("a head"), 1, "nothing of the refused request was appended");
        assert_eq!(store.event_position("e2").expect("a lookup"), None, "its event id is not taken either");
        // The same agent binding the card again is the stage's to answer (duplicate_card), not a conflict.
        assert_eq!(bind(&store, "e3", "k1", "u1").expect("appended"), vec![Appended::New { position: 1 }]);
    }

    /// A retried event id keeps its first position and appends nothing, within a request and across
    /// requests; a key created again keeps its first owner; the one-transaction reader agrees.
    #[test]
    fn an_event_id_ingested_again_keeps_its_first_position_and_a_key_its_first_owner() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let order = |store: &RedbStore, event_ids: &[&str], merchant: &str| {
            store.ingest(event_ids, &mut |_, position| {
                Ok(Ingested {
                    records: vec![("order-0".into(), format!("{position}").into_bytes())],
                    stage_records: Vec::new(),
                    keys: vec![("order:o1".to_string(), merchant.to_string())],
                    exclusive_keys: Vec::new(),
                    at_ms: None,
                })
            })
        };
        let outcomes = order(&store, &["e1", "e2", "e1"], "m1").expect("ingested");
        assert_eq!(
            outcomes,
            vec![Appended::New { position: 0 }, Appended::New { position: 1 }, Appended::Duplicate { position: 0 }]
        );
        let outcomes = order(&store, &["e2", "e3"], "m2").expect("ingested");
        assert_eq!(outcomes, vec![Appended::Duplicate { position: 1 }, Appended::New { position: 2 }]);
        assert_eq!(store.head("order-0").expect("a head"), 3, "one record per new event id");
        let positions: Vec<_> =
            store.read("order-0", 0, 10).expect("read").into_iter().map(|(_, bytes)| bytes).collect();
        assert_eq!(positions, vec![b"0".to_vec(), b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(store.ingested_key("order:o1").expect("a lookup").as_deref(), Some("m1"), "the first owner stays");
        let reader = store.ingestion_reader().expect("a reader");
        for (event_id, position) in [("e1", Some(0)), ("e2", Some(1)), ("e3", Some(2)), ("e4", None)] {
            assert_eq!(reader.event_position(event_id).expect("a lookup"), position, "{event_id}");
            assert_eq!(store.event_position(event_id).expect("a lookup"), position, "{event_id}");
        }
        assert_eq!(reader.ingested_key("order:o1").expect("a lookup").as_deref(), Some("m1"));
        assert_eq!(reader.ingested_key("order:o2").expect("a lookup"), None);
    }

    /// The index comes back from the journal at open: positions, first owners, duplicates and the next
    /// position as before; a refused request left nothing in it to come back.
    #[test]
    fn event_ids_and_keys_come_back_when_the_store_opens_again() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let create = |store: &RedbStore, event_ids: &[&str], merchant: &str| {
            store.ingest(event_ids, &mut |index, position| {
                Ok(Ingested {
                    records: vec![("order-0".into(), format!("{position}").into_bytes())],
                    stage_records: Vec::new(),
                    keys: vec![(format!("order:o{index}"), merchant.to_string())],
                    exclusive_keys: vec![("card:k1".to_string(), "u1".to_string())],
                    at_ms: None,
                })
            })
        };
        {
            let store = RedbStore::open(directory.path()).expect("the store opens");
            create(&store, &["e1", "e2"], "m1").expect("ingested");
            create(&store, &["e2", "e3"], "m2").expect("ingested");
            assert!(matches!(bind(&store, "e4", "k1", "u2"), Err(RuntimeError::Invalid(_))));
        }
        let store = RedbStore::open(directory.path()).expect("the store opens again");
        for (event_id, position) in [("e1", Some(0)), ("e2", Some(1)), ("e3", Some(2)), ("e4", None)] {
            assert_eq!(store.event_position(event_id).expect("a lookup"), position, "{event_id}");
        }
        assert_eq!(store.ingested_key("order:o0").expect("a lookup").as_deref(), Some("m1"));
        assert_eq!(store.ingested_key("order:o1").expect("a lookup").as_deref(), Some("m1"), "first owner");
        assert_eq!(store.ingested_key("card:k1").expect("a lookup").as_deref(), Some("u1"));
        assert!(matches!(bind(&store, "e5", "k1", "u2"), Err(RuntimeError::Invalid(_))), "still u1's card");
        let outcomes = create(&store, &["e3", "e6"], "m3").expect("ingested");
        assert_eq!(outcomes, vec![Appended::Duplicate { position: 2 }, Appended::New { position: 3 }]);
        assert_eq!(store.head("order-0").expect("a head"), 4);
    }

    /// Requests racing from several threads over the same event ids and cards, while rounds commit
    /// beside them: each event id gets one position, positions are dense, each record is appended once
    /// (its bytes name its position), each card keeps one agent, and all of it comes back at open.
    #[test]
    fn racing_ingestions_take_each_event_id_and_card_once() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let (threads, requests, ids) = (4usize, 30usize, 40usize);
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let mut owners = std::collections::BTreeMap::new();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|thread| {
                    let store = &store;
                    scope.spawn(move || {
                        let mut bound = Vec::new();
                        for request in 0..requests {
                            // Overlapping windows of ids: most are taken by another thread first.
                            let event_ids: Vec<String> =
                                (0..5).map(|step| format!("e{}", (request * 3 + step * 7 + thread) % ids)).collect();
                            let refs: Vec<&str> = event_ids.iter().map(String::as_str).collect();
                            let card = format!("card:k{}", (request + thread) % 6);
                            let outcome = store.ingest(&refs, &mut |_, position| {
                                Ok(Ingested {
                                    records: vec![("agent-0".into(), format!("{position}").into_bytes())],
                                    stage_records: Vec::new(),
                                    keys: Vec::new(),
                                    exclusive_keys: vec![(card.clone(), format!("u{thread}"))],
                                    at_ms: None,
                                })
                            });
                            match outcome {
                                // A request whose ids were all taken before binds nothing.
                                Ok(outcomes)
                                    if outcomes.iter().any(|outcome| matches!(outcome, Appended::New { .. })) =>
                                {
                                    bound.push((card, format!("u{thread}")))
                                }
                                Ok(_) => {}
                                Err(RuntimeError::Invalid(_)) => {}
                                Err(error) => panic!("ingestion failed: {error}"),
                            }
                            let mut round = WriteBatch::default();
                            round.appends.push(("outputs".into(), b"round".to_vec()));
                            store.commit(round).expect("a round commits");
                        }
                        bound
                    })
                })
                .collect();
            for handle in handles {
                for (card, owner) in handle.join().expect("a thread") {
                    let first = owners.entry(card.clone()).or_insert_with(|| owner.clone());
                    assert_eq!(*first, owner, "{card} went to two agents");
                }
            }
        });
        let taken: Vec<u64> =
            (0..ids).filter_map(|id| store.event_position(&format!("e{id}")).expect("a lookup")).collect();
        let head = store.head("agent-0").expect("a head");
        let mut sorted = taken.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..head).collect::<Vec<_>>(), "one dense position per event id taken");
        let records: Vec<Vec<u8>> =
            store.read("agent-0", 0, 10_000).expect("read").into_iter().map(|(_, r)| r).collect();
        let expected: Vec<Vec<u8>> = (0..head).map(|position| format!("{position}").into_bytes()).collect();
        assert_eq!(records, expected, "each position's record once, in position order");
        for (card, owner) in &owners {
            assert_eq!(store.ingested_key(card).expect("a lookup").as_ref(), Some(owner), "{card}");
        }
        drop(store);
        let store = RedbStore::open(directory.path()).expect("the store opens again");
        let again: Vec<u64> =
            (0..ids).filter_map(|id| store.event_position(&format!("e{id}")).expect("a lookup")).collect();
        assert_eq!(again, taken);
        for (card, owner) in &owners {
            assert_eq!(store.ingested_key(card).expect("a lookup").as_ref(), Some(owner), "{card} after opening");
        }
    }

    /// A data directory written before the journal keeps its event ids and keys in two tables: they
    /// answer as before, and new inputs go to the journal beside them.
    #[test]
    fn a_data_directory_written_before_the_journal_keeps_its_event_ids_and_keys() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        {
            let store = RedbStore::open(directory.path()).expect("the store opens");
            let transaction = store.database.begin_write().expect("a write transaction");
            {
                let mut event_ids = transaction.open_table(EVENT_IDS).expect("the table");
                event_ids.insert("old-1", 0).expect("inserted");
                event_ids.insert("old-2", 1).expect("inserted");
                transaction.open_table(INGESTED_KEYS).expect("the table").insert("card:k1", "u1").expect("inserted");
                transaction.open_table(HEADS).expect("the table").insert(INGEST_HEAD, 2).expect("inserted");
            }
            transaction.commit().expect("committed");
        }
        let store = RedbStore::open(directory.path()).expect("the store opens again");
        assert_eq!(store.event_position("old-2").expect("a lookup"), Some(1));
        assert!(matches!(bind(&store, "new-1", "k1", "u2"), Err(RuntimeError::Invalid(_))), "u1's card");
        assert_eq!(bind(&store, "old-1", "k1", "u1").expect("a duplicate"), vec![Appended::Duplicate { position: 0 }]);
        assert_eq!(bind(&store, "new-2", "k2", "u2").expect("appended"), vec![Appended::New { position: 2 }]);
        drop(store);
        let store = RedbStore::open(directory.path()).expect("the store opens a third time");
        assert_eq!(store.event_position("new-2").expect("a lookup"), Some(2));
        assert_eq!(store.ingested_key("card:k2").expect("a lookup").as_deref(), Some("u2"));
    }

    #[test]
    fn a_journal_value_decodes_to_what_was_encoded_and_a_damaged_one_is_an_error() {
        let entries = vec![
            JournalEntry { event_id: String::new(), keys: Vec::new() },
            JournalEntry {
                event_id: "é:1".to_string(),
                keys: vec![("order:o1".to_string(), "m1".to_string()), ("card:".to_string(), String::new())],
            },
        ];
        let bytes = encode_journal(&entries).expect("encoded");
        assert_eq!(decode_journal(&bytes).expect("decoded"), entries);
        for cut in 0..bytes.len() {
            let decoded = decode_journal(&bytes[..cut]);
            // Some prefixes end between entries and decode to fewer of them; none decodes to all.
            assert!(decoded.as_ref().map_or(true, |decoded| decoded.len() < entries.len()), "{cut}: {decoded:?}");
        }
        let mut other_format = bytes.clone();
        other_format[0] = JOURNAL_FORMAT + 1;
        assert!(decode_journal(&other_format).is_err());
    }

    /// Records of varied sizes appended over several commits (some spanning several segments), with
    /// records written one per value (as before segments) in between.
    fn appended_log(store: &RedbStore) -> Vec<Vec<u8>> {
        let mut expected = Vec::new();
        let record = |number: usize| {
            let size = [2, 40, 700, 9_000, 70_000][number % 5];
            let mut bytes = format!("{{\"n\":{number}}}").into_bytes();
            bytes.resize(size.max(bytes.len()), b' ');
            bytes
        };
        for commit in 0..6 {
            if commit == 3 {
                // One record per value, as a data directory written before segments holds them.
                let transaction = store.database.begin_write().expect("a transaction");
                {
                    let mut table = transaction
                        .open_table(TableDefinition::<u64, &[u8]>::new(&log_table("agent-0")))
                        .expect("the log table");
                    let mut heads = transaction.open_table(HEADS).expect("heads");
                    for _ in 0..3 {
                        let bytes = record(expected.len());
                        table.insert(expected.len() as u64, bytes.as_slice()).expect("inserted");
                        expected.push(bytes);
                    }
                    heads.insert("agent-0", expected.len() as u64).expect("head");
                }
                transaction.commit().expect("committed");
                continue;
            }
            let mut batch = WriteBatch::default();
            for _ in 0..(commit * 7 + 1) {
                let bytes = record(expected.len());
                batch.appends.push(("agent-0".into(), bytes.clone()));
                batch.appends.push(("other".into(), b"{}".to_vec()));
                expected.push(bytes);
            }
            store.commit(batch).expect("committed");
        }
        expected
    }

    #[test]
    fn a_segment_fills_its_leaf_or_takes_everything_pending() {
        let one_page = PAGE_BYTES - LEAF_OVERHEAD_BYTES;
        for pending in (1..200_000).step_by(7) {
            let bytes = segment_bytes_for(pending);
            if pending <= one_page {
                assert_eq!(bytes, pending, "what fits in one page is one segment");
                continue;
            }
            let leaf = bytes + LEAF_OVERHEAD_BYTES;
            assert!(leaf.is_power_of_two() && leaf >= PAGE_BYTES, "{pending}: a leaf of {leaf} bytes");
            assert!(bytes <= SEGMENT_BYTES_MAX, "{pending}: {bytes}");
            if bytes >= pending {
                // All of it in one leaf, filled to 7/8 at least.
                assert!(pending * 8 >= bytes * 7, "{pending} in {bytes}");
            } else {
                // The largest leaf the pending records fill, unless 64 KiB caps it.
                assert!(bytes == SEGMENT_BYTES_MAX || 2 * leaf - LEAF_OVERHEAD_BYTES > pending, "{pending}: {bytes}");
            }
        }
    }

    /// Commits of records the sizes of the serve benchmark's (a few hundred bytes to a few KiB, tens
    /// of KiB per log and commit) leave little of their log's leaves empty: each leaf's bytes are
    /// written and synced, used or not.
    #[test]
    fn log_leaves_are_filled() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let mut appended = Vec::new();
        for commit in 0..60_usize {
            let mut batch = WriteBatch::default();
            for number in 0..(20 + commit * 7 % 90) {
                let size = [180, 420, 950, 2_600, 310][(commit + number) % 5];
                // Each record names its offset, so the read below checks order, not only count.
                let mut bytes = format!("{}:", appended.len()).into_bytes();
                bytes.resize(size, b'x');
                batch.appends.push(("agent-0".into(), bytes.clone()));
                appended.push(bytes);
            }
            store.commit(batch).expect("committed");
        }
        let transaction = store.database.begin_read().expect("a read transaction");
        let table =
            transaction.open_table(TableDefinition::<u64, &[u8]>::new(&log_table("agent-0"))).expect("the log table");
        let stats = redb::ReadableTableMetadata::stats(&table).expect("stats");
        assert!(
            stats.fragmented_bytes() * 10 < stats.stored_bytes(),
            "{} bytes empty in leaves holding {}",
            stats.fragmented_bytes(),
            stats.stored_bytes()
        );
        let read: Vec<Vec<u8>> =
            store.read("agent-0", 0, usize::MAX).expect("read").into_iter().map(|(_, bytes)| bytes).collect();
        assert!(read == appended, "{} records read of {}", read.len(), appended.len());
    }

    #[test]
    fn a_log_reads_the_same_from_every_offset_whatever_its_segments() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let expected = appended_log(&store);
        assert_eq!(store.head("agent-0").expect("a head"), expected.len() as u64);
        assert_eq!(store.head("other").expect("a head"), (expected.len() - 3) as u64);
        for from in 0..=expected.len() + 1 {
            for records_max in [1, 2, 5, 1_000] {
                let read = store.read("agent-0", from as u64, records_max).expect("read");
                let wanted: Vec<(u64, Vec<u8>)> = expected
                    .iter()
                    .enumerate()
                    .skip(from)
                    .take(records_max)
                    .map(|(offset, bytes)| (offset as u64, bytes.clone()))
                    .collect();
                assert!(read == wanted, "from {from}, at most {records_max}: {} records", read.len());
            }
        }
        assert!(store.read("never-appended", 0, 10).expect("read").is_empty());
    }

    /// The first record a consumer has not consumed is the one at its offset, whatever segment holds it,
    /// and none once the consumer reached the head.
    #[test]
    fn the_first_unconsumed_record_is_the_one_at_the_consumers_offset() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let expected = appended_log(&store);
        let first = |consumer: &str| store.first_unconsumed(&[("agent-0", consumer)]).expect("read").expect("read");
        assert_eq!(first("agent-0"), vec![expected.first().cloned()], "a consumer that never committed");
        for next in 1..=expected.len() as u64 {
            let consumption = WriteBatch {
                offsets: vec![("agent-0".to_string(), next)],
                expected_offsets: vec![("agent-0".to_string(), next - 1)],
                ..WriteBatch::default()
            };
            store.commit(consumption).expect("committed");
            assert_eq!(first("agent-0"), vec![expected.get(next as usize).cloned()], "after consuming {next}");
        }
        let pairs = [("never-appended", "agent-0"), ("agent-0", "agent-0")];
        assert_eq!(store.first_unconsumed(&pairs).expect("read").expect("read"), vec![None, None]);
    }

    #[test]
    fn concurrent_commits_keep_each_committers_order_and_lose_nothing() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let (committers, batches) = (4usize, 60usize);
        std::thread::scope(|scope| {
            for committer in 0..committers {
                let store = &store;
                scope.spawn(move || {
                    for batch_number in 0..batches {
                        let mut batch = WriteBatch::default();
                        for record in 0..2 {
                            let bytes = format!("{committer}:{batch_number}:{record}").into_bytes();
                            batch.appends.push((format!("own-{committer}").into(), bytes));
                        }
                        batch.appends.push(("shared".into(), format!("{committer}:{batch_number}").into_bytes()));
                        batch.offsets.push((format!("consumer-{committer}"), batch_number as u64 + 1));
                        store.commit(batch).expect("committed");
                    }
                });
            }
        });
        let text = |records: Vec<(u64, Vec<u8>)>| -> Vec<String> {
            records.into_iter().map(|(_, bytes)| String::from_utf8(bytes).expect("UTF-8")).collect()
        };
        for committer in 0..committers {
            let own = text(store.read(&format!("own-{committer}"), 0, 10_000).expect("read"));
            let expected: Vec<String> = (0..batches)
                .flat_map(|batch_number| (0..2).map(move |record| format!("{committer}:{batch_number}:{record}")))
                .collect();
            assert_eq!(own, expected, "committer {committer}'s log");
            assert_eq!(store.committed(&format!("consumer-{committer}")).expect("an offset"), batches as u64);
        }
        let shared = text(store.read("shared", 0, 10_000).expect("read"));
        assert_eq!(shared.len(), committers * batches);
        for committer in 0..committers {
            let mine: Vec<&String> =
                shared.iter().filter(|record| record.starts_with(&format!("{committer}:"))).collect();
            let expected: Vec<String> =
                (0..batches).map(|batch_number| format!("{committer}:{batch_number}")).collect();
            assert_eq!(mine, expected.iter().collect::<Vec<_>>(), "committer {committer}'s order in the shared log");
        }
    }

    #[test]
    fn a_failed_commit_appends_nothing_and_the_next_one_goes_through() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let batch = |log: &str, offset: u64| WriteBatch {
            appends: vec![(log.into(), b"{}".to_vec())],
            offsets: vec![("consumer".to_string(), offset)],
            ..WriteBatch::default()
        };
        store.commit(batch("first", 10)).expect("committed");
        let moved_back = store.commit(batch("second", 5));
        assert!(
            matches!(&moved_back, Err(RuntimeError::Fatal(message)) if message.contains("moved back")),
            "{moved_back:?}"
        );
        assert_eq!(store.head("second").expect("a head"), 0, "nothing of the failed batch was appended");
        assert_eq!(store.committed("consumer").expect("an offset"), 10);
        store.commit(batch("third", 11)).expect("the store still commits");
        assert_eq!((store.head("third").expect("a head"), store.committed("consumer").expect("an offset")), (1, 11));
    }

    /// A batch consumed from `from` to `next` of the log "input", appending one record to "output".
    fn consumed(from: u64, next: u64) -> WriteBatch {
        WriteBatch {
            appends: vec![("output".into(), format!("{{\"from\":{from}}}").into_bytes())],
            offsets: vec![("consumer".to_string(), next)],
            expected_offsets: vec![("consumer".to_string(), from)],
            ..WriteBatch::default()
        }
    }

    #[test]
    fn a_batch_consumed_from_another_offset_than_the_committed_one_is_refused() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        store.commit(consumed(0, 3)).expect("committed");
        for stale in [consumed(0, 5), consumed(4, 5)] {
            let refused = store.commit(stale);
            assert!(
                matches!(&refused, Err(RuntimeError::Fatal(message)) if message.contains("is at 3")),
                "{refused:?}"
            );
        }
        assert_eq!((store.head("output").expect("a head"), store.committed("consumer").expect("an offset")), (1, 3));
        store.commit(consumed(3, 5)).expect("the batch that follows commits");
        assert_eq!((store.head("output").expect("a head"), store.committed("consumer").expect("an offset")), (2, 5));
    }

    /// Submitted without waiting, batches commit in submission order (in one group or several), and a
    /// batch submitted behind a failed one of its consumer fails too instead of skipping its records.
    #[test]
    fn batches_queued_behind_a_failed_one_fail_with_it() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        assert!(store.queues_commits());
        let submissions: Vec<Submission> = (0..4).map(|batch| store.submit(consumed(batch, batch + 1))).collect();
        for submission in submissions {
            store.wait_for(submission).expect("committed in order");
        }
        let records: Vec<String> = store
            .read("output", 0, 10)
            .expect("read")
            .into_iter()
            .map(|(_, bytes)| String::from_utf8(bytes).expect("UTF-8"))
            .collect();
        assert_eq!(records, ["{\"from\":0}", "{\"from\":1}", "{\"from\":2}", "{\"from\":3}"]);

        // The first of two fails (its consumer is at 4, not 9): queued together, both fail.
        let (failing, behind) = (store.submit(consumed(9, 10)), store.submit(consumed(10, 11)));
        assert!(store.wait_for(failing).is_err());
        assert!(store.wait_for(behind).is_err(), "the batch behind the failed one skipped its records");
        // The same when the one behind reaches the store after the failure is written.
        let failing = store.submit(consumed(9, 10));
        assert!(store.wait_for(failing).is_err());
        assert!(store.commit(consumed(10, 11)).is_err());
        assert_eq!((store.head("output").expect("a head"), store.committed("consumer").expect("an offset")), (4, 4));
        store.commit(consumed(4, 5)).expect("the consumer's next batch from where it is commits");
    }

    /// A request's ingestion is written in the group it queues into, with processing rounds' batches:
    /// committed with them, or, when the group fails, not at all; then no ingestion is taken until the
    /// store opens again, and its positions go to the next inputs.
    #[test]
    fn an_ingestion_commits_in_a_group_with_processing_batches_or_not_at_all() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let ingest = |store: &RedbStore, event_ids: &[&str]| {
            store.ingest(event_ids, &mut |index, position| {
                Ok(Ingested {
                    records: vec![("order-0".into(), format!("{position}").into_bytes())],
                    keys: vec![(format!("order:{}", event_ids[index]), "m1".to_string())],
                    ..Ingested::default()
                })
            })
        };
        // Queued first and not waited for: the ingestion leads the group that writes both.
        let processing = store.submit(consumed(0, 1));
        assert_eq!(ingest(&store, &["e1"]).expect("ingested"), vec![Appended::New { position: 0 }]);
        assert_eq!(lock(&store.group).written_through, 2, "the ingestion's group wrote the batch before it");
        store.wait_for(processing).expect("the batch committed with it");
        assert_eq!((store.head("output").expect("a head"), store.committed("consumer").expect("an offset")), (1, 1));

        // A batch that fails (its consumer is at 1, not 5) fails the ingestion in its group.
        let failing = store.submit(consumed(5, 6));
        let failed = ingest(&store, &["e2"]);
        assert!(matches!(&failed, Err(RuntimeError::Fatal(message)) if message.contains("is at 1")), "{failed:?}");
        assert!(store.wait_for(failing).is_err());
        assert_eq!(store.head("order-0").expect("a head"), 1, "nothing of the failed ingestion was appended");
        // Its inputs were merged into the index when queued: no ingestion is taken until a restart.
        let refused = ingest(&store, &["e3"]);
        assert!(matches!(&refused, Err(RuntimeError::Fatal(message)) if message.contains("restart")), "{refused:?}");
        assert_eq!(store.head("order-0").expect("a head"), 1);
        store.commit(consumed(1, 2)).expect("processing batches still commit");

        // Reopened, the store has the index of what committed; e2's position goes to the next input.
        drop(store);
        let store = RedbStore::open(directory.path()).expect("the store opens again");
        let ingested = ingest(&store, &["e3", "e1"]);
        assert_eq!(ingested.expect("ingested"), [Appended::New { position: 1 }, Appended::Duplicate { position: 0 }]);
        let positions: Vec<Option<u64>> =
            ["e1", "e2", "e3"].iter().map(|event_id| store.event_position(event_id).expect("a lookup")).collect();
        assert_eq!(positions, [Some(0), None, Some(1)]);
        assert_eq!(store.ingested_key("order:e2").expect("a lookup"), None);
        let records: Vec<Vec<u8>> =
            store.read("order-0", 0, 10).expect("read").into_iter().map(|(_, bytes)| bytes).collect();
        assert_eq!(records, [b"0".to_vec(), b"1".to_vec()]);
    }

    /// A request is checked against inputs queued and not yet written, without waiting for them; one
    /// that finds all its inputs among them answers `duplicate` only once they are durable.
    #[test]
    fn a_duplicate_of_an_input_not_yet_written_is_answered_once_it_is_durable() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        // As if a leader were writing a group: nothing queued is written until it is released.
        lock(&store.group).writing = true;
        let durable_records = |store: &RedbStore| store.read("agent-0", 0, 10).expect("read").len();
        std::thread::scope(|scope| {
            let (sender, answers) = std::sync::mpsc::channel();
            for (name, event_id, card, user) in [("first", "e1", "k1", "u1"), ("retry", "e1", "k1", "u1")] {
                let sender = sender.clone();
                let store = &store;
                scope.spawn(move || {
                    let outcome = bind(store, event_id, card, user);
                    sender.send((name, outcome, durable_records(store))).expect("sent");
                });
                // The first is queued (and merged) before the retry is checked.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while name == "first" && store.event_position("e1").expect("a lookup").is_none() {
                    assert!(std::time::Instant::now() < deadline, "the first binding was never queued");
                    std::thread::yield_now();
                }
            }
            // Another agent's binding of the queued card is refused without waiting for it.
            let refused = bind(&store, "e2", "k1", "u2");
            assert!(matches!(refused, Err(RuntimeError::Invalid(_))), "{refused:?}");
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(answers.try_recv().is_err(), "an answer came before the input was written");
            assert_eq!(durable_records(&store), 0);
            let mut state = lock(&store.group);
            state.writing = false;
            store.group.written.notify_all();
            drop(state);
            let mut answered: Vec<_> = (0..2).map(|_| answers.recv().expect("an answer")).collect();
            answered.sort_by_key(|(name, _, _)| *name);
            assert_eq!(answered[0].0, "first");
            assert_eq!(answered[0].1.as_ref().expect("ingested"), &[Appended::New { position: 0 }]);
            assert_eq!(answered[1].1.as_ref().expect("answered"), &[Appended::Duplicate { position: 0 }]);
            assert!(answered.iter().all(|(_, _, durable)| *durable == 1), "each answered after the write");
        });
    }

    #[test]
    fn a_truncated_segment_is_an_error_not_a_panic() {
        assert!(records_of(&[SEGMENT_TAG, 5, 0, 0, 0, b'{']).is_err());
        assert!(records_of(&[SEGMENT_TAG, 1, 0]).is_err());
        assert_eq!(records_of(&[SEGMENT_TAG]).expect("empty"), Vec::<&[u8]>::new());
        assert_eq!(records_of(b"{}").expect("one record"), vec![b"{}".as_slice()]);
    }

    fn stage_record(offset: u64) -> StageRecord {
        use pipelines::partition::{RecordBody, RecordId};
        let at = pipelines::Timestamp::from_millis(1_000 + offset as i64);
        StageRecord { id: RecordId { source: "commands".into(), offset, index: 0 }, at, body: RecordBody::Tick }
    }

    fn offsets(records: &[(u64, StageRecord)]) -> Vec<u64> {
        records.iter().map(|(offset, _)| *offset).collect()
    }

    /// A consumer takes kept records only from its own offset on and while they follow each other, each
    /// once; records before its offset (it read them from the log) are forgotten; the store keeps at
    /// most its bound of encoded bytes over all logs, and what is taken or forgotten frees its share.
    #[test]
    fn kept_records_are_taken_from_the_consumers_offset_in_order_once() {
        let mut kept = CommittedRecords::default();
        for offset in [3, 4, 5, 6, 8] {
            kept.keep("agent-0", offset, stage_record(offset), 100);
        }
        assert_eq!(kept.bytes_kept, 500);
        assert!(kept.take("agent-0", 2, 10).is_empty(), "offset 2 is not kept: the consumer reads the log");
        assert_eq!(offsets(&kept.take("agent-0", 4, 2)), vec![4, 5], "from its offset, at most 2");
        assert_eq!(kept.bytes_kept, 200, "offset 3 was forgotten, 4 and 5 taken");
        assert_eq!(offsets(&kept.take("agent-0", 6, 10)), vec![6], "offset 7 is missing: it stops before");
        assert!(kept.take("agent-0", 7, 10).is_empty());
        assert_eq!(offsets(&kept.take("agent-0", 8, 10)), vec![8]);
        assert!(kept.take("agent-0", 9, 10).is_empty(), "taken once");
        assert_eq!(kept.bytes_kept, 0);
        assert!(kept.take("order-0", 0, 10).is_empty(), "another log keeps nothing");

        let record_bytes = COMMITTED_RECORD_BYTES_MAX / 4;
        for offset in 0..6 {
            kept.keep(if offset % 2 == 0 { "order-0" } else { "order-1" }, offset, stage_record(offset), record_bytes);
        }
        assert_eq!(kept.bytes_kept, COMMITTED_RECORD_BYTES_MAX, "four records fill the bound; two were not kept");
        assert_eq!(offsets(&kept.take("order-0", 0, 10)), vec![0], "offset 1 is in the other log");
        assert_eq!(offsets(&kept.take("order-0", 2, 10)), vec![2], "offset 4 came past the bound");
        kept.keep("order-0", 6, stage_record(6), record_bytes);
        assert_eq!(offsets(&kept.take("order-1", 1, 10)), vec![1]);
        assert_eq!(offsets(&kept.take("order-1", 3, 10)), vec![3], "offset 5 came past the bound");
        assert_eq!(offsets(&kept.take("order-0", 6, 10)), vec![6], "kept once the bound had room");
        assert_eq!(kept.bytes_kept, 0);
    }

    /// Offsets are committed in order, but a record kept out of order is still taken in offset order, and
    /// one kept twice counts once.
    #[test]
    fn kept_records_stay_in_offset_order_whatever_order_they_are_kept_in() {
        let mut kept = CommittedRecords::default();
        for (offset, bytes) in [(5, 100), (3, 100), (4, 100), (4, 50), (7, 100)] {
            kept.keep("agent-0", offset, stage_record(offset), bytes);
        }
        assert_eq!(kept.bytes_kept, 350, "offset 4 counts once, with its last length");
        assert_eq!(offsets(&kept.take("agent-0", 3, 10)), vec![3, 4, 5], "in offset order, up to the gap at 6");
        kept.keep("agent-0", 6, stage_record(6), 100);
        assert_eq!(offsets(&kept.take("agent-0", 6, 10)), vec![6, 7]);
        assert_eq!(kept.bytes_kept, 0);
    }

    /// What a consumer takes from memory is what the log holds at the same offsets, for records
    /// committed by a batch and by an ingestion, among appends kept only as bytes.
    #[test]
    fn kept_records_are_the_committed_records_at_their_offsets() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = RedbStore::open(directory.path()).expect("the store opens");
        let ingested = store
            .ingest(&["e1"], &mut |_, position| {
                let record = stage_record(position);
                let bytes = crate::runtime::encode(&record).expect("encodes");
                Ok(Ingested {
                    records: vec![("order-0".into(), b"{}".to_vec()), ("agent-0".into(), bytes)],
                    stage_records: vec![(1, record)],
                    ..Ingested::default()
                })
            })
            .expect("ingested");
        assert_eq!(ingested, vec![Appended::New { position: 0 }]);
        let mut batch = WriteBatch::default();
        batch.appends.push(("agent-0".into(), b"{\"not\":\"kept\"}".to_vec()));
        for offset in [10, 11] {
            batch.append_stage_record("agent-0".into(), stage_record(offset)).expect("appended");
        }
        batch.append_stage_record("merchant-0".into(), stage_record(12)).expect("appended");
        store.commit(batch).expect("committed");

        let stored = store.read("agent-0", 0, 10).expect("read");
        assert_eq!(stored.len(), 4);
        let encoded = |records: Vec<(u64, StageRecord)>| -> Vec<(u64, Vec<u8>)> {
            records
                .into_iter()
                .map(|(offset, record)| (offset, crate::runtime::encode(&record).expect("encodes")))
                .collect()
        };
        assert_eq!(encoded(store.take_committed_records("agent-0", 0, 10)), stored[..1].to_vec(), "the ingested one");
        assert!(store.take_committed_records("agent-0", 1, 10).is_empty(), "offset 1 was kept only as bytes");
        assert_eq!(encoded(store.take_committed_records("agent-0", 2, 10)), stored[2..].to_vec(), "the batch's two");
        let merchant = store.read("merchant-0", 0, 10).expect("read");
        assert_eq!(encoded(store.take_committed_records("merchant-0", 0, 10)), merchant);
        assert!(store.take_committed_records("order-0", 0, 10).is_empty(), "kept only as bytes");
    }
}
