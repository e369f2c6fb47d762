//! The read model on ScyllaDB (the `scylla` driver): the tables of `schema.cql`, prepared statements,
//! every write `USING TIMESTAMP <version>`, pages by clustering-key cursors with `LIMIT`.

use super::{
    bill_cursor, page_of, parse_bill_cursor, parse_review_cursor, review_cursor, to_i64, validate, BillLineKey,
    OrderRow, ReadModel, ReadModelError, Row, Write, PAGE_ITEMS_MAX,
};
use crate::runtime::Page;
use ::scylla::client::execution_profile::ExecutionProfile;
use ::scylla::client::session::Session;
use ::scylla::client::session_builder::SessionBuilder;
use ::scylla::errors::{
    DbError, ExecutionError, IntoRowsResultError, MaybeFirstRowError, NewSessionError, PrepareError,
    RequestAttemptError, RowsError, UseKeyspaceError,
};
use ::scylla::response::query_result::QueryResult;
use ::scylla::statement::prepared::PreparedStatement;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The keyspace `paisa serve` and `paisa admin init` use (deploy/README.md).
pub const KEYSPACE_DEFAULT: &str = "paisa";

/// The CQL of the read model's tables (the keyspace is created by [`ScyllaReadModel::init`]).
pub const SCHEMA_CQL: &str = include_str!("schema.cql");

/// Entries per journal partition (`journals.seq_bucket = seq / JOURNAL_BUCKET_ENTRIES`); part of the
/// data layout: changing it needs a new keyspace.
pub(super) const JOURNAL_BUCKET_ENTRIES: u64 = 16_384;
/// Journal partitions one page reads at most (a sparse journal gives a cursor past the last one read).
const JOURNAL_BUCKETS_PER_PAGE_MAX: u64 = 8;
/// Partitions of the review queue (`review_queue.bucket`); part of the data layout.
pub(super) const REVIEW_BUCKETS: u32 = 16;

/// The statements of `schema.cql`, without comments.
pub fn schema_statements() -> Vec<String> {
    let text: String = SCHEMA_CQL
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .map(|line| format!("{line}\n"))
        .collect();
    text.split(';').map(str::trim).filter(|statement| !statement.is_empty()).map(str::to_string).collect()
}

/// The replication of the keyspace, as `CREATE KEYSPACE` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replication {
    /// `SimpleStrategy` with this many replicas (one data centre: tests, development).
    Simple { replicas: u32 },
    /// `NetworkTopologyStrategy` with (data centre, replicas) pairs (production).
    NetworkTopology { replicas_per_dc: Vec<(String, u32)> },
}

impl Replication {
    /// The CQL map of the `replication` option.
    pub fn cql(&self) -> Result<String, ReadModelError> {
        match self {
            Replication::Simple { replicas } => {
                Ok(format!("{{'class': 'SimpleStrategy', 'replication_factor': {replicas}}}"))
            }
            Replication::NetworkTopology { replicas_per_dc } => {
                let mut map = String::from("{'class': 'NetworkTopologyStrategy'");
                for (dc, replicas) in replicas_per_dc {
                    let plain = !dc.is_empty()
                        && dc.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
                    if !plain {
                        return Err(ReadModelError::Invalid(format!("data centre name `{dc}`")));
                    }
                    map.push_str(&format!(", '{dc}': {replicas}"));
                }
                map.push('}');
                Ok(map)
            }
        }
    }
}

/// Where and how to reach ScyllaDB.
#[derive(Clone, Debug)]
pub struct ScyllaConfig {
    /// Contact points, `host:port` separated by commas (`127.0.0.1:9042`); `SCYLLA_URI` in tests.
    pub uri: String,
    /// The keyspace, created if missing: a lower-case letter, then lower-case letters, digits or `_`,
    /// 48 characters at most.
    pub keyspace: String,
    /// The keyspace's replication (used only when the keyspace is created).
    pub replication: Replication,
    /// How long connecting to the contact points may take.
    pub connect_timeout_ms: u64,
    /// How long one request may take (the driver's client-side timeout; beyond it the call fails as
    /// retryable).
    pub request_timeout_ms: u64,
    /// Items one page holds at most, whatever the caller asks.
    pub page_items_max: usize,
    /// Writes of one [`ReadModel::write`] call in flight at once.
    pub writes_in_flight_max: usize,
    /// Threads of the tokio runtime the model owns for the driver.
    pub driver_threads: usize,
}

impl ScyllaConfig {
    pub fn new(uri: &str, keyspace: &str, replication: Replication) -> Self {
        Self {
            uri: uri.to_string(),
            keyspace: keyspace.to_string(),
            replication,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 5_000,
            page_items_max: PAGE_ITEMS_MAX,
            writes_in_flight_max: 64,
            driver_threads: 2,
        }
    }
}

fn check_keyspace(keyspace: &str) -> Result<(), ReadModelError> {
    let mut chars = keyspace.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && keyspace.len() <= 48 {
        Ok(())
    } else {
        Err(ReadModelError::Invalid(format!("keyspace name `{keyspace}`")))
    }
}

/// The read model on ScyllaDB. Owns a tokio runtime for the driver (the trait is sync).
pub struct ScyllaReadModel {
    /// `Some` until dropped (a runtime is shut down in the background, so dropping the model inside an
    /// async context is allowed).
    runtime: Option<tokio::runtime::Runtime>,
    statements: Arc<Statements>,
    page_items_max: usize,
    writes_in_flight_max: usize,
}

impl Drop for ScyllaReadModel {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The session and every prepared statement.
struct Statements {
    session: Session,
    insert_order: PreparedStatement,
    select_order: PreparedStatement,
    insert_sub_order: PreparedStatement,
    select_sub_orders: PreparedStatement,
    insert_user: PreparedStatement,
    select_user: PreparedStatement,
    insert_merchant: PreparedStatement,
    select_merchant: PreparedStatement,
    insert_journal: PreparedStatement,
    select_journal: PreparedStatement,
    insert_journal_head: PreparedStatement,
    select_journal_head: PreparedStatement,
    insert_bill_line: PreparedStatement,
    delete_bill_line: PreparedStatement,
    select_bill_first: PreparedStatement,
    select_bill_after: PreparedStatement,
    insert_review: PreparedStatement,
    delete_review: PreparedStatement,
    select_review_first: PreparedStatement,
    select_review_after: PreparedStatement,
    insert_card_owner: PreparedStatement,
    select_card_owner: PreparedStatement,
    insert_progress: PreparedStatement,
    select_progress: PreparedStatement,
}

/// Every statement the model runs. Each read restricts a whole partition key; writes name a full
/// primary key and carry their version as the write timestamp (bound last for `INSERT`, first for
/// `DELETE`).
pub(super) mod cql {
    pub const INSERT_ORDER: &str =
        "INSERT INTO orders (order_id, merchant_id, version, view) VALUES (?, ?, ?, ?) USING TIMESTAMP ?";
    pub const SELECT_ORDER: &str = "SELECT merchant_id, version, view FROM orders WHERE order_id = ?";
    pub const INSERT_SUB_ORDER: &str =
        "INSERT INTO sub_orders (order_id, seq, version, view) VALUES (?, ?, ?, ?) USING TIMESTAMP ?";
    pub const SELECT_SUB_ORDERS: &str = "SELECT seq, version, view FROM sub_orders WHERE order_id = ?";
    pub const INSERT_USER: &str = "INSERT INTO users (user_id, version, view) VALUES (?, ?, ?) USING TIMESTAMP ?";
    pub const SELECT_USER: &str = "SELECT version, view FROM users WHERE user_id = ?";
    pub const INSERT_MERCHANT: &str =
        "INSERT INTO merchants (merchant_id, version, view) VALUES (?, ?, ?) USING TIMESTAMP ?";
    pub const SELECT_MERCHANT: &str = "SELECT version, view FROM merchants WHERE merchant_id = ?";
    pub const INSERT_JOURNAL: &str = "INSERT INTO journals (owner_kind, owner_id, seq_bucket, seq, entry) \
         VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?";
    pub const SELECT_JOURNAL: &str = "SELECT seq, entry FROM journals \
         WHERE owner_kind = ? AND owner_id = ? AND seq_bucket = ? AND seq > ? LIMIT ?";
    pub const INSERT_JOURNAL_HEAD: &str =
        "INSERT INTO journal_heads (owner_kind, owner_id, last_seq) VALUES (?, ?, ?) USING TIMESTAMP ?";
    pub const SELECT_JOURNAL_HEAD: &str = "SELECT last_seq FROM journal_heads WHERE owner_kind = ? AND owner_id = ?";
    pub const INSERT_BILL_LINE: &str = "INSERT INTO bill_lines (user_id, card_id, time_ms, txn_id, version, view) \
         VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?";
    pub const DELETE_BILL_LINE: &str = "DELETE FROM bill_lines USING TIMESTAMP ? \
         WHERE user_id = ? AND card_id = ? AND time_ms = ? AND txn_id = ?";
    pub const SELECT_BILL_FIRST: &str =
        "SELECT card_id, time_ms, txn_id, view FROM bill_lines WHERE user_id = ? LIMIT ?";
    pub const SELECT_BILL_AFTER: &str = "SELECT card_id, time_ms, txn_id, view FROM bill_lines \
         WHERE user_id = ? AND (card_id, time_ms, txn_id) > (?, ?, ?) LIMIT ?";
    pub const INSERT_REVIEW: &str = "INSERT INTO review_queue (bucket, order_id, seq, version, view) \
         VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?";
    pub const DELETE_REVIEW: &str =
        "DELETE FROM review_queue USING TIMESTAMP ? WHERE bucket = ? AND order_id = ? AND seq = ?";
    pub const SELECT_REVIEW_FIRST: &str = "SELECT order_id, seq, view FROM review_queue WHERE bucket = ? LIMIT ?";
    pub const SELECT_REVIEW_AFTER: &str = "SELECT order_id, seq, view FROM review_queue \
         WHERE bucket = ? AND (order_id, seq) > (?, ?) LIMIT ?";
    pub const INSERT_CARD_OWNER: &str =
        "INSERT INTO card_owners (card_id, user_id, version) VALUES (?, ?, ?) USING TIMESTAMP ?";
    pub const SELECT_CARD_OWNER: &str = "SELECT user_id FROM card_owners WHERE card_id = ?";
    pub const INSERT_PROGRESS: &str = "INSERT INTO progress (consumer, next_offset) VALUES (?, ?) USING TIMESTAMP ?";
    pub const SELECT_PROGRESS: &str = "SELECT next_offset FROM progress WHERE consumer = ?";

    /// Every statement, for the tests that check their shape.
    #[cfg(test)]
    pub const ALL: &[&str] = &[
        INSERT_ORDER,
        SELECT_ORDER,
        INSERT_USER,
        SELECT_USER,
        INSERT_MERCHANT,
        SELECT_MERCHANT,
        INSERT_JOURNAL,
        SELECT_JOURNAL,
        INSERT_JOURNAL_HEAD,
        SELECT_JOURNAL_HEAD,
        INSERT_BILL_LINE,
        DELETE_BILL_LINE,
        SELECT_BILL_FIRST,
        SELECT_BILL_AFTER,
        INSERT_REVIEW,
        DELETE_REVIEW,
        SELECT_REVIEW_FIRST,
        SELECT_REVIEW_AFTER,
        INSERT_CARD_OWNER,
        SELECT_CARD_OWNER,
        INSERT_PROGRESS,
        SELECT_PROGRESS,
    ];
}

// ---- errors ----------------------------------------------------------------------------------------

fn db_error_is_transient(error: &DbError) -> bool {
    matches!(
        error,
        DbError::Unavailable { .. }
            | DbError::Overloaded
            | DbError::IsBootstrapping
            | DbError::ReadTimeout { .. }
            | DbError::WriteTimeout { .. }
            | DbError::RateLimitReached { .. }
    )
}

fn attempt_is_transient(error: &RequestAttemptError) -> bool {
    match error {
        RequestAttemptError::DbError(db_error, _) => db_error_is_transient(db_error),
        RequestAttemptError::BrokenConnectionError(_) | RequestAttemptError::UnableToAllocStreamId => true,
        _ => false,
    }
}

fn classify(transient: bool, what: &str, error: &dyn std::fmt::Display) -> ReadModelError {
    if transient {
        ReadModelError::Retryable(format!("{what}: {error}"))
    } else {
        ReadModelError::Fatal(format!("{what}: {error}"))
    }
}

fn execution_error(what: &str, error: ExecutionError) -> ReadModelError {
    let transient = match &error {
        ExecutionError::RequestTimeout(_)
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::SchemaAgreementError(_)
        | ExecutionError::MetadataError(_) => true,
        ExecutionError::LastAttemptError(attempt) => attempt_is_transient(attempt),
        ExecutionError::PrepareError(prepare) => prepare_is_transient(prepare),
        _ => false,
    };
    classify(transient, what, &error)
}

fn prepare_is_transient(error: &PrepareError) -> bool {
    match error {
        PrepareError::ConnectionPoolError(_) => true,
        PrepareError::AllAttemptsFailed { first_attempt } => attempt_is_transient(first_attempt),
        _ => false,
    }
}

fn prepare_error(what: &str, error: PrepareError) -> ReadModelError {
    classify(prepare_is_transient(&error), what, &error)
}

fn session_error(error: NewSessionError) -> ReadModelError {
    // Unresolvable or unreachable contact points may come up (a cluster starting): retryable.
    let transient = matches!(error, NewSessionError::FailedToResolveAnyHostname(_) | NewSessionError::MetadataError(_));
    classify(transient, "connecting to ScyllaDB", &error)
}

fn use_keyspace_error(error: UseKeyspaceError) -> ReadModelError {
    let transient = match &error {
        UseKeyspaceError::RequestError(attempt) => attempt_is_transient(attempt),
        UseKeyspaceError::RequestTimeout(_) => true,
        _ => false,
    };
    classify(transient, "USE keyspace", &error)
}

/// A row that does not decode is not going to decode on a retry.
fn corrupt(what: &str, error: impl std::fmt::Display) -> ReadModelError {
    ReadModelError::Fatal(format!("{what}: {error}"))
}

fn rows_error(what: &str, error: IntoRowsResultError) -> ReadModelError {
    corrupt(what, error)
}

fn decode_view(what: &str, text: &str) -> Result<Value, ReadModelError> {
    serde_json::from_str(text).map_err(|error| corrupt(what, error))
}

fn encode_view(view: &Value) -> Result<String, ReadModelError> {
    serde_json::to_string(view).map_err(|error| ReadModelError::Invalid(format!("encoding a view: {error}")))
}

fn version_of(what: &str, version: i64) -> Result<u64, ReadModelError> {
    u64::try_from(version).map_err(|_| corrupt(what, format!("negative version {version}")))
}

/// The first row of a result, typed.
fn first_row<R>(what: &str, result: QueryResult) -> Result<Option<R>, ReadModelError>
where
    R: for<'frame, 'metadata> ::scylla::deserialize::row::DeserializeRow<'frame, 'metadata>,
{
    let rows = result.into_rows_result().map_err(|error| rows_error(what, error))?;
    rows.maybe_first_row::<R>().map_err(|error: MaybeFirstRowError| corrupt(what, error))
}

/// Every row of a result, typed.
fn all_rows<R>(what: &str, result: QueryResult) -> Result<Vec<R>, ReadModelError>
where
    R: for<'frame, 'metadata> ::scylla::deserialize::row::DeserializeRow<'frame, 'metadata>,
{
    let rows = result.into_rows_result().map_err(|error| rows_error(what, error))?;
    let typed = rows.rows::<R>().map_err(|error: RowsError| corrupt(what, error))?;
    typed.map(|row| row.map_err(|error| corrupt(what, error))).collect()
}

/// A page size as CQL's `LIMIT` (an `int`).
fn cql_limit(limit: usize) -> i32 {
    i32::try_from(limit).unwrap_or(i32::MAX)
}

fn review_bucket(order_id: &str) -> i32 {
    // REVIEW_BUCKETS is 16: the remainder always fits.
    (crc32fast::hash(order_id.as_bytes()) % REVIEW_BUCKETS) as i32
}

const USER: &str = "user";
const MERCHANT: &str = "merchant";

// ---- writes ----------------------------------------------------------------------------------------

/// One CQL write, with its values already converted (so that nothing is written when any is invalid).
enum Op {
    Order { order_id: String, merchant_id: String, version: i64, view: String },
    SubOrder { order_id: String, seq: i64, version: i64, view: String },
    User { user_id: String, version: i64, view: String },
    Merchant { merchant_id: String, version: i64, view: String },
    JournalEntry { kind: &'static str, owner_id: String, seq: i64, entry: String },
    JournalHead { kind: &'static str, owner_id: String, last_seq: i64 },
    BillLine { key: BillLineKey, version: i64, view: Option<String> },
    Review { order_id: String, seq: i64, version: i64, view: Option<String> },
    CardOwner { card_id: String, user_id: String, version: i64 },
    Progress { consumer: String, next_offset: i64 },
}

fn journal_ops(
    kind: &'static str,
    owner_id: String,
    entries: Vec<(u64, Value)>,
    ops: &mut Vec<Op>,
) -> Result<(), ReadModelError> {
    let mut last_seq = None;
    for (seq, entry) in entries {
        let seq = to_i64("journal seq", seq)?;
        last_seq = last_seq.max(Some(seq));
        ops.push(Op::JournalEntry { kind, owner_id: owner_id.clone(), seq, entry: encode_view(&entry)? });
    }
    if let Some(last_seq) = last_seq {
        ops.push(Op::JournalHead { kind, owner_id, last_seq });
    }
    Ok(())
}

/// The CQL writes of a batch: (everything but progress, progress).
fn ops_of(writes: Vec<Write>) -> Result<(Vec<Op>, Vec<Op>), ReadModelError> {
    validate(&writes)?;
    let (mut ops, mut progress) = (Vec::with_capacity(writes.len()), Vec::new());
    for write in writes {
        match write {
            Write::Order { order_id, merchant_id, version, view } => {
                let (version, view) = (to_i64("version", version)?, encode_view(&view)?);
                ops.push(Op::Order { order_id, merchant_id, version, view });
            }
            Write::SubOrder { order_id, seq, version, view } => {
                let (version, view) = (to_i64("version", version)?, encode_view(&view)?);
                ops.push(Op::SubOrder { order_id, seq: i64::from(seq), version, view });
            }
            Write::User { user_id, version, view } => {
                ops.push(Op::User { user_id, version: to_i64("version", version)?, view: encode_view(&view)? });
            }
            Write::Merchant { merchant_id, version, view } => {
                let (version, view) = (to_i64("version", version)?, encode_view(&view)?);
                ops.push(Op::Merchant { merchant_id, version, view });
            }
            Write::UserJournal { user_id, entries } => journal_ops(USER, user_id, entries, &mut ops)?,
            Write::MerchantJournal { merchant_id, entries } => journal_ops(MERCHANT, merchant_id, entries, &mut ops)?,
            Write::BillLine { key, version, view } => {
                let view = view.as_ref().map(encode_view).transpose()?;
                ops.push(Op::BillLine { key, version: to_i64("version", version)?, view });
            }
            Write::Review { order_id, seq, version, view } => {
                let view = view.as_ref().map(encode_view).transpose()?;
                ops.push(Op::Review { order_id, seq: i64::from(seq), version: to_i64("version", version)?, view });
            }
            Write::CardOwner { card_id, user_id, version } => {
                ops.push(Op::CardOwner { card_id, user_id, version: to_i64("version", version)? });
            }
            Write::Progress { consumer, next_offset } => {
                progress.push(Op::Progress { consumer, next_offset: to_i64("offset", next_offset)? });
            }
        }
    }
    Ok((ops, progress))
}

impl Statements {
    async fn execute(&self, op: Op) -> Result<(), ReadModelError> {
        let session = &self.session;
        let result = match op {
            Op::Order { order_id, merchant_id, version, view } => {
                session.execute_unpaged(&self.insert_order, (order_id, merchant_id, version, view, version)).await
            }
            Op::SubOrder { order_id, seq, version, view } => {
                session.execute_unpaged(&self.insert_sub_order, (order_id, seq, version, view, version)).await
            }
            Op::User { user_id, version, view } => {
                session.execute_unpaged(&self.insert_user, (user_id, version, view, version)).await
            }
            Op::Merchant { merchant_id, version, view } => {
                session.execute_unpaged(&self.insert_merchant, (merchant_id, version, view, version)).await
            }
            Op::JournalEntry { kind, owner_id, seq, entry } => {
                let bucket = seq / JOURNAL_BUCKET_ENTRIES as i64;
                session.execute_unpaged(&self.insert_journal, (kind, owner_id, bucket, seq, entry, seq)).await
            }
            Op::JournalHead { kind, owner_id, last_seq } => {
                session.execute_unpaged(&self.insert_journal_head, (kind, owner_id, last_seq, last_seq)).await
            }
            Op::BillLine { key, version, view: Some(view) } => {
                let BillLineKey { user_id, card_id, time_ms, txn_id } = key;
                let values = (user_id, card_id, time_ms, txn_id, version, view, version);
                session.execute_unpaged(&self.insert_bill_line, values).await
            }
            Op::BillLine { key, version, view: None } => {
                let BillLineKey { user_id, card_id, time_ms, txn_id } = key;
                session.execute_unpaged(&self.delete_bill_line, (version, user_id, card_id, time_ms, txn_id)).await
            }
            Op::Review { order_id, seq, version, view: Some(view) } => {
                let bucket = review_bucket(&order_id);
                session.execute_unpaged(&self.insert_review, (bucket, order_id, seq, version, view, version)).await
            }
            Op::Review { order_id, seq, version, view: None } => {
                let bucket = review_bucket(&order_id);
                session.execute_unpaged(&self.delete_review, (version, bucket, order_id, seq)).await
            }
            Op::CardOwner { card_id, user_id, version } => {
                session.execute_unpaged(&self.insert_card_owner, (card_id, user_id, version, version)).await
            }
            Op::Progress { consumer, next_offset } => {
                session.execute_unpaged(&self.insert_progress, (consumer, next_offset, next_offset)).await
            }
        };
        result.map(|_| ()).map_err(|error| execution_error("write", error))
    }

    /// Runs writes concurrently, at most `in_flight_max` at once; the first error is returned after
    /// the writes in flight finish (the caller retries the whole batch: every write is idempotent).
    async fn execute_all(self: &Arc<Self>, ops: Vec<Op>, in_flight_max: usize) -> Result<(), ReadModelError> {
        let mut running = tokio::task::JoinSet::new();
        let mut first_error = None;
        for op in ops {
            while running.len() >= in_flight_max.max(1) {
                if let Some(done) = running.join_next().await {
                    note(&mut first_error, done);
                }
            }
            let statements = Arc::clone(self);
            running.spawn(async move { statements.execute(op).await });
        }
        while let Some(done) = running.join_next().await {
            note(&mut first_error, done);
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn select_one(&self, statement: &PreparedStatement, key: &str) -> Result<QueryResult, ReadModelError> {
        self.session.execute_unpaged(statement, (key,)).await.map_err(|error| execution_error("read", error))
    }

    async fn journal(&self, kind: &str, owner_id: &str, after_seq: u64, limit: usize) -> Result<Page, ReadModelError> {
        let head = self
            .session
            .execute_unpaged(&self.select_journal_head, (kind, owner_id))
            .await
            .map_err(|error| execution_error("journal head", error))?;
        let Some((last_seq,)) = first_row::<(i64,)>("journal head", head)? else {
            return Ok(Page { items: Vec::new(), next_cursor: None });
        };
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let last_bucket = last_seq / JOURNAL_BUCKET_ENTRIES as i64;
        let mut bucket = after.saturating_add(1) / JOURNAL_BUCKET_ENTRIES as i64;
        let mut selected: Vec<(u64, Value)> = Vec::new();
        let mut buckets_read = 0;
        while selected.len() <= limit && bucket <= last_bucket && buckets_read < JOURNAL_BUCKETS_PER_PAGE_MAX {
            let wanted = cql_limit(limit + 1 - selected.len());
            let result = self
                .session
                .execute_unpaged(&self.select_journal, (kind, owner_id, bucket, after, wanted))
                .await
                .map_err(|error| execution_error("journal", error))?;
            for (seq, entry) in all_rows::<(i64, String)>("journal", result)? {
                selected.push((version_of("journal seq", seq)?, decode_view("journal entry", &entry)?));
            }
            bucket += 1;
            buckets_read += 1;
        }
        if selected.len() <= limit && bucket <= last_bucket {
            // Stopped by the bound on partitions read: the next page starts after the last one read.
            let next_cursor = Some((bucket * JOURNAL_BUCKET_ENTRIES as i64 - 1).to_string());
            return Ok(Page { items: selected.into_iter().map(|(_, entry)| entry).collect(), next_cursor });
        }
        Ok(page_of(selected, limit, u64::to_string))
    }

    async fn bill_table(
        &self,
        user_id: &str,
        after: Option<(String, i64, String)>,
        limit: usize,
    ) -> Result<Page, ReadModelError> {
        let wanted = cql_limit(limit.saturating_add(1));
        let result = match after {
            None => self.session.execute_unpaged(&self.select_bill_first, (user_id, wanted)).await,
            Some((card_id, time_ms, txn_id)) => {
                let values = (user_id, card_id, time_ms, txn_id, wanted);
                self.session.execute_unpaged(&self.select_bill_after, values).await
            }
        }
        .map_err(|error| execution_error("bill table", error))?;
        let mut selected = Vec::new();
        for (card_id, time_ms, txn_id, view) in all_rows::<(String, i64, String, String)>("bill table", result)? {
            selected.push(((card_id, time_ms, txn_id), decode_view("bill line", &view)?));
        }
        Ok(page_of(selected, limit, |(card_id, time_ms, txn_id)| bill_cursor(card_id, *time_ms, txn_id)))
    }

    async fn review_bucket_page(
        self: Arc<Self>,
        bucket: i32,
        after: Option<(String, i64)>,
        wanted: i32,
    ) -> Result<Vec<((String, u32), Value)>, ReadModelError> {
        let result = match after {
            None => self.session.execute_unpaged(&self.select_review_first, (bucket, wanted)).await,
            Some((order_id, seq)) => {
                self.session.execute_unpaged(&self.select_review_after, (bucket, order_id, seq, wanted)).await
            }
        }
        .map_err(|error| execution_error("review queue", error))?;
        let mut items = Vec::new();
        for (order_id, seq, view) in all_rows::<(String, i64, String)>("review queue", result)? {
            let seq = u32::try_from(seq).map_err(|_| corrupt("review queue", format!("seq {seq}")))?;
            items.push(((order_id, seq), decode_view("review item", &view)?));
        }
        Ok(items)
    }

    /// Every bucket's first `limit + 1` items after the cursor, merged: the smallest `limit + 1` of
    /// the union are among them.
    async fn review_queue(
        self: &Arc<Self>,
        after: Option<(String, u32)>,
        limit: usize,
    ) -> Result<Page, ReadModelError> {
        let wanted = cql_limit(limit.saturating_add(1));
        let after = after.map(|(order_id, seq)| (order_id, i64::from(seq)));
        let mut reads = tokio::task::JoinSet::new();
        for bucket in 0..REVIEW_BUCKETS as i32 {
            reads.spawn(Arc::clone(self).review_bucket_page(bucket, after.clone(), wanted));
        }
        let mut selected = Vec::new();
        let mut first_error = None;
        while let Some(done) = reads.join_next().await {
            match done {
                Ok(Ok(items)) => selected.extend(items),
                Ok(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                Err(join) => {
                    first_error.get_or_insert(ReadModelError::Fatal(format!("a review-queue read failed: {join}")));
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        selected.sort_by(|(left, _), (right, _)| left.cmp(right));
        selected.truncate(limit.saturating_add(1));
        Ok(page_of(selected, limit, |(order_id, seq)| review_cursor(order_id, *seq)))
    }
}

fn note(first_error: &mut Option<ReadModelError>, done: Result<Result<(), ReadModelError>, tokio::task::JoinError>) {
    let error = match done {
        Ok(Ok(())) => return,
        Ok(Err(error)) => error,
        Err(join) => ReadModelError::Fatal(format!("a write task failed: {join}")),
    };
    first_error.get_or_insert(error);
}

// ---- set-up ----------------------------------------------------------------------------------------

async fn connect(config: &ScyllaConfig) -> Result<Statements, ReadModelError> {
    check_keyspace(&config.keyspace)?;
    let replication = config.replication.cql()?;
    let profile = ExecutionProfile::builder()
        .request_timeout(Some(Duration::from_millis(config.request_timeout_ms)))
        .build()
        .into_handle();
    let nodes: Vec<&str> = config.uri.split(',').map(str::trim).filter(|node| !node.is_empty()).collect();
    let session = SessionBuilder::new()
        .known_nodes(nodes)
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
        .default_execution_profile_handle(profile)
        .build()
        .await
        .map_err(session_error)?;
    let keyspace = &config.keyspace;
    let create_keyspace = format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}");
    session.query_unpaged(create_keyspace, ()).await.map_err(|error| execution_error("CREATE KEYSPACE", error))?;
    session.use_keyspace(keyspace.as_str(), false).await.map_err(use_keyspace_error)?;
    for statement in schema_statements() {
        session.query_unpaged(statement, ()).await.map_err(|error| execution_error("CREATE TABLE", error))?;
    }
    let prepare = |statement: &'static str| {
        let session = &session;
        async move { session.prepare(statement).await.map_err(|error| prepare_error(statement, error)) }
    };
    Ok(Statements {
        insert_order: prepare(cql::INSERT_ORDER).await?,
        select_order: prepare(cql::SELECT_ORDER).await?,
        insert_sub_order: prepare(cql::INSERT_SUB_ORDER).await?,
        select_sub_orders: prepare(cql::SELECT_SUB_ORDERS).await?,
        insert_user: prepare(cql::INSERT_USER).await?,
        select_user: prepare(cql::SELECT_USER).await?,
        insert_merchant: prepare(cql::INSERT_MERCHANT).await?,
        select_merchant: prepare(cql::SELECT_MERCHANT).await?,
        insert_journal: prepare(cql::INSERT_JOURNAL).await?,
        select_journal: prepare(cql::SELECT_JOURNAL).await?,
        insert_journal_head: prepare(cql::INSERT_JOURNAL_HEAD).await?,
        select_journal_head: prepare(cql::SELECT_JOURNAL_HEAD).await?,
        insert_bill_line: prepare(cql::INSERT_BILL_LINE).await?,
        delete_bill_line: prepare(cql::DELETE_BILL_LINE).await?,
        select_bill_first: prepare(cql::SELECT_BILL_FIRST).await?,
        select_bill_after: prepare(cql::SELECT_BILL_AFTER).await?,
        insert_review: prepare(cql::INSERT_REVIEW).await?,
        delete_review: prepare(cql::DELETE_REVIEW).await?,
        select_review_first: prepare(cql::SELECT_REVIEW_FIRST).await?,
        select_review_after: prepare(cql::SELECT_REVIEW_AFTER).await?,
        insert_card_owner: prepare(cql::INSERT_CARD_OWNER).await?,
        select_card_owner: prepare(cql::SELECT_CARD_OWNER).await?,
        insert_progress: prepare(cql::INSERT_PROGRESS).await?,
        select_progress: prepare(cql::SELECT_PROGRESS).await?,
        session,
    })
}

impl ScyllaReadModel {
    /// Connects, creates the keyspace and the tables if missing (`IF NOT EXISTS`: safe on every start
    /// and from several instances) and prepares the statements.
    pub fn init(config: &ScyllaConfig) -> Result<Self, ReadModelError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.driver_threads.max(1))
            .thread_name("scylla-driver")
            .enable_all()
            .build()
            .map_err(|error| ReadModelError::Fatal(format!("starting the driver's runtime: {error}")))?;
        let owned = config.clone();
        let statements = match wait(&runtime, async move { connect(&owned).await }) {
            Ok(statements) => statements,
            Err(error) => {
                // Dropping a runtime blocks, which an async caller may not do: shut it down instead.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        Ok(Self {
            runtime: Some(runtime),
            statements: Arc::new(statements),
            page_items_max: config.page_items_max,
            writes_in_flight_max: config.writes_in_flight_max,
        })
    }

    /// A (version, view) row read by its key with the statement `select` picks (users, merchants).
    fn row(
        &self,
        what: &'static str,
        select: fn(&Statements) -> &PreparedStatement,
        key: &str,
    ) -> Result<Option<Row>, ReadModelError> {
        let (statements, key) = (Arc::clone(&self.statements), key.to_string());
        self.block(async move {
            let result = statements.select_one(select(&statements), &key).await?;
            let Some((version, view)) = first_row::<(i64, String)>(what, result)? else { return Ok(None) };
            Ok(Some(Row { version: version_of(what, version)?, view: decode_view(what, &view)? }))
        })
    }

    /// Runs a future on the model's runtime and waits for it.
    fn block<T, F>(&self, future: F) -> Result<T, ReadModelError>
    where
        F: Future<Output = Result<T, ReadModelError>> + Send + 'static,
        T: Send + 'static,
    {
        let runtime =
            self.runtime.as_ref().ok_or_else(|| ReadModelError::Fatal("the read model is shut down".to_string()))?;
        wait(runtime, future)
    }

    /// Drops a keyspace (tests: each run makes its own).
    pub fn drop_keyspace(&self, keyspace: &str) -> Result<(), ReadModelError> {
        check_keyspace(keyspace)?;
        let statements = Arc::clone(&self.statements);
        let statement = format!("DROP KEYSPACE IF EXISTS {keyspace}");
        self.block(async move {
            statements
                .session
                .query_unpaged(statement, ())
                .await
                .map_err(|error| execution_error("DROP KEYSPACE", error))?;
            Ok(())
        })
    }
}

/// Runs `future` on `runtime` and waits for its result on this thread. On a multi-threaded tokio
/// runtime's worker (an API handler) the wait is inside `block_in_place`, so that runtime's other
/// tasks move to other workers; elsewhere the thread just blocks.
fn wait<T, F>(runtime: &tokio::runtime::Runtime, future: F) -> Result<T, ReadModelError>
where
    F: Future<Output = Result<T, ReadModelError>> + Send + 'static,
    T: Send + 'static,
{
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        // The receiver only goes away with the caller's thread.
        let _ = sender.send(future.await);
    });
    let receive = move || {
        receiver
            .recv()
            .unwrap_or_else(|_| Err(ReadModelError::Fatal("a read-model task stopped without an answer".to_string())))
    };
    if crate::runtime::may_block_in_place() {
        tokio::task::block_in_place(receive)
    } else {
        receive()
    }
}

impl ReadModel for ScyllaReadModel {
    fn write(&self, writes: Vec<Write>) -> Result<(), ReadModelError> {
        let (ops, progress) = ops_of(writes)?;
        let statements = Arc::clone(&self.statements);
        let in_flight_max = self.writes_in_flight_max;
        self.block(async move {
            statements.execute_all(ops, in_flight_max).await?;
            // Progress last: a projector's offset never runs ahead of the views it stands for.
            statements.execute_all(progress, in_flight_max).await
        })
    }

    fn order(&self, order_id: &str) -> Result<Option<OrderRow>, ReadModelError> {
        let (statements, order_id) = (Arc::clone(&self.statements), order_id.to_string());
        self.block(async move {
            let result = statements.select_one(&statements.select_order, &order_id).await?;
            let Some((merchant_id, version, view)) = first_row::<(String, i64, String)>("order", result)? else {
                return Ok(None);
            };
            Ok(Some(OrderRow {
                merchant_id,
                version: version_of("order", version)?,
                view: decode_view("order", &view)?,
            }))
        })
    }

    fn sub_orders(&self, order_id: &str) -> Result<Vec<(u32, Row)>, ReadModelError> {
        let (statements, order_id) = (Arc::clone(&self.statements), order_id.to_string());
        self.block(async move {
            let result = statements.select_one(&statements.select_sub_orders, &order_id).await?;
            let mut parts = Vec::new();
            for (seq, version, view) in all_rows::<(i64, i64, String)>("sub-order", result)? {
                let seq = u32::try_from(seq).map_err(|_| corrupt("sub-order", format!("seq {seq}")))?;
                let row = Row { version: version_of("sub-order", version)?, view: decode_view("sub-order", &view)? };
                parts.push((seq, row));
            }
            Ok(parts)
        })
    }

    fn user(&self, user_id: &str) -> Result<Option<Row>, ReadModelError> {
        self.row("user", |statements| &statements.select_user, user_id)
    }

    fn user_journal(&self, user_id: &str, after_seq: u64, limit: usize) -> Result<Page, ReadModelError> {
        let (statements, user_id) = (Arc::clone(&self.statements), user_id.to_string());
        let limit = limit.min(self.page_items_max);
        self.block(async move { statements.journal(USER, &user_id, after_seq, limit).await })
    }

    fn merchant(&self, merchant_id: &str) -> Result<Option<Row>, ReadModelError> {
        self.row("merchant", |statements| &statements.select_merchant, merchant_id)
    }

    fn merchant_journal(&self, merchant_id: &str, after_seq: u64, limit: usize) -> Result<Page, ReadModelError> {
        let (statements, merchant_id) = (Arc::clone(&self.statements), merchant_id.to_string());
        let limit = limit.min(self.page_items_max);
        self.block(async move { statements.journal(MERCHANT, &merchant_id, after_seq, limit).await })
    }

    fn bill_table(&self, user_id: &str, cursor: Option<&str>, limit: usize) -> Result<Page, ReadModelError> {
        let after = cursor.map(parse_bill_cursor).transpose()?;
        let (statements, user_id) = (Arc::clone(&self.statements), user_id.to_string());
        let limit = limit.min(self.page_items_max);
        self.block(async move { statements.bill_table(&user_id, after, limit).await })
    }

    fn review_queue(&self, cursor: Option<&str>, limit: usize) -> Result<Page, ReadModelError> {
        let after = cursor.map(parse_review_cursor).transpose()?;
        let statements = Arc::clone(&self.statements);
        let limit = limit.min(self.page_items_max);
        self.block(async move { statements.review_queue(after, limit).await })
    }

    fn card_owner(&self, card_id: &str) -> Result<Option<String>, ReadModelError> {
        let (statements, card_id) = (Arc::clone(&self.statements), card_id.to_string());
        self.block(async move {
            let result = statements.select_one(&statements.select_card_owner, &card_id).await?;
            Ok(first_row::<(String,)>("card owner", result)?.map(|(user_id,)| user_id))
        })
    }

    fn progress(&self, consumer: &str) -> Result<Option<u64>, ReadModelError> {
        let (statements, consumer) = (Arc::clone(&self.statements), consumer.to_string());
        self.block(async move {
            let result = statements.select_one(&statements.select_progress, &consumer).await?;
            first_row::<(i64,)>("progress", result)?.map(|(offset,)| version_of("progress", offset)).transpose()
        })
    }
}
