//! The read model of the Kafka + ScyllaDB profile (issue 4): the materialised views the HTTP API
//! serves, as JSON documents keyed by id, written by a projector after each processing batch and read
//! by the API. One trait, [`ReadModel`], two implementations: [`MemoryReadModel`] (the reference, used
//! by tests) and [`ScyllaReadModel`] (the `scylla` driver; CQL in `schema.cql`). Both pass the same
//! conformance suite (`tests.rs`).
//!
//! **Versions never regress.** Every keyed row is written with a `version` (u64, at most [`VERSION_MAX`]):
//! the caller derives it from the position of the record that produced the row, monotonic per row
//! (for a row owned by one stage partition: its log offset + 1). A write with a lower version than the
//! stored one changes nothing; the same version written again changes nothing, so replays and retries
//! are harmless. ScyllaDB gets this from `USING TIMESTAMP <version>` on every write (last write wins by
//! timestamp, per cell, without lightweight transactions); the memory model compares versions.
//! Contract: one version of a row has one content (a deterministic replay reproduces it). Two
//! different contents under one version are a caller's bug and the backends may keep either.
//! A removal (`None` view) at version v hides every write of that row at versions ≤ v (ScyllaDB: a
//! tombstone wins a timestamp tie); a later write with a higher version brings the row back.
//!
//! **Sync trait.** The runtime's processing loops are threads and [`crate::runtime::PipelineHandle`]
//! is sync, so the trait is sync too. [`ScyllaReadModel`] owns a small tokio runtime and waits for its
//! own futures; called from a multi-threaded tokio runtime (the API's handlers), it waits inside
//! `block_in_place`, so the caller's runtime keeps its other tasks moving.

mod memory;
mod store;
#[cfg(test)]
mod tests;

pub use memory::MemoryReadModel;
pub use store::{Replication, ScyllaConfig, ScyllaReadModel, KEYSPACE_DEFAULT, SCHEMA_CQL};

use crate::runtime::{Page, RuntimeError};
use serde_json::Value;

/// Items one page holds at most by default (the API's bound, README "Bounds").
pub const PAGE_ITEMS_MAX: usize = 1_000;

/// Failures of a read model. `Retryable` ones (a timeout, an unavailable or overloaded replica, a
/// broken connection) may succeed if the same call is made again — every write is idempotent, so a
/// retried write batch is safe. `Fatal` ones (a bad schema, refused credentials, a corrupt row) will
/// not. `Invalid` is a caller's mistake (a version above [`VERSION_MAX`], a malformed cursor).
#[derive(Debug, thiserror::Error)]
pub enum ReadModelError {
    #[error("read model, retryable: {0}")]
    Retryable(String),
    #[error("read model, fatal: {0}")]
    Fatal(String),
    #[error("read model, invalid request: {0}")]
    Invalid(String),
}

impl ReadModelError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ReadModelError::Retryable(_))
    }
}

impl From<ReadModelError> for RuntimeError {
    fn from(error: ReadModelError) -> Self {
        match error {
            ReadModelError::Retryable(message) => RuntimeError::Retryable(message),
            ReadModelError::Fatal(message) => RuntimeError::Fatal(message),
            ReadModelError::Invalid(message) => RuntimeError::Invalid(message),
        }
    }
}

/// A stored view and the version that wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub version: u64,
    pub view: Value,
}

/// A stored order: its view, its version and the merchant it belongs to (for authorisation).
#[derive(Clone, Debug, PartialEq)]
pub struct OrderRow {
    pub merchant_id: String,
    pub version: u64,
    pub view: Value,
}

/// Where a bill line sits in an agent's bill table: pages are ordered by (card, time, txn id).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BillLineKey {
    pub user_id: String,
    pub card_id: String,
    /// The statement line's time, in milliseconds since the epoch.
    pub time_ms: i64,
    pub txn_id: String,
}

/// One write to the read model. Rows carry their version; journal entries are immutable and keyed by
/// (owner, seq), so appending one twice changes nothing; progress only moves forward.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// An order's own part of its view (`GET /v1/orders/{id}`), written from the order stage: the view
    /// without its sub-orders, and in [`ORDER_SUB_ORDER_SEQS`] the seqs of the sub-orders it shows.
    Order { order_id: String, merchant_id: String, version: u64, view: Value },
    /// A sub-order's part of its order's view, written from the agent stage that holds it
    /// ([`pipelines::document::SubOrderPart`]). Joined to the order's row when read ([`join_order`]).
    SubOrder { order_id: String, seq: u32, version: u64, view: Value },
    /// An agent's view (`GET /v1/users/{id}/balance`).
    User { user_id: String, version: u64, view: Value },
    /// Entries of an agent's journal, as (seq, entry).
    UserJournal { user_id: String, entries: Vec<(u64, Value)> },
    /// A merchant's view (`GET /v1/merchants/{id}/balance`).
    Merchant { merchant_id: String, version: u64, view: Value },
    /// Entries of a merchant's journal, as (seq, entry).
    MerchantJournal { merchant_id: String, entries: Vec<(u64, Value)> },
    /// A bill line's item (`GET /v1/users/{id}/bill-table`); `None` removes it (an evicted line).
    BillLine { key: BillLineKey, version: u64, view: Option<Value> },
    /// A sub-order waiting for an operator (`GET /v1/admin/review-queue`); `None` removes it.
    Review { order_id: String, seq: u32, version: u64, view: Option<Value> },
    /// The agent a card is bound to (a card belongs to one agent forever, SPEC §4).
    CardOwner { card_id: String, user_id: String, version: u64 },
    /// How far a projector has consumed: the next offset of `consumer`'s input it has not applied.
    /// Never goes backwards. Applied after every other write of the same call.
    Progress { consumer: String, next_offset: u64 },
}

/// The materialised views the API serves, whatever the backend.
///
/// Writes go through [`ReadModel::write`], which applies a batch of independent, idempotent writes
/// (every write, or an error: a retry of the whole batch is always safe), progress last. Pages hold at
/// most `min(limit, page_items_max)` items and give a `next_cursor` only when another page exists;
/// cursors are the embedded runtime's: a journal's is the last seq, the bill table's
/// `{time_ms}/{card id length}/{card id}{txn id}`, the review queue's `{order_id}:{seq}`.
pub trait ReadModel: Send + Sync {
    /// Applies writes: those whose version is not above the stored one change nothing; progress
    /// writes are made after all others succeeded.
    fn write(&self, writes: Vec<Write>) -> Result<(), ReadModelError>;
    /// An order's stored row: its own part of the view (see [`Write::Order`]).
    fn order(&self, order_id: &str) -> Result<Option<OrderRow>, ReadModelError>;
    /// The stored sub-order parts of an order, as (seq, row), by seq.
    fn sub_orders(&self, order_id: &str) -> Result<Vec<(u32, Row)>, ReadModelError>;
    /// An order's view as the API shows it: its row joined with its sub-orders' rows ([`join_order`]).
    fn order_view(&self, order_id: &str) -> Result<Option<OrderRow>, ReadModelError> {
        let Some(row) = self.order(order_id)? else { return Ok(None) };
        Ok(Some(join_order(row, self.sub_orders(order_id)?)))
    }
    /// An agent's stored view.
    fn user(&self, user_id: &str) -> Result<Option<Row>, ReadModelError>;
    /// An agent's journal entries with `seq` > `after_seq`, in seq order (empty for an unknown agent).
    fn user_journal(&self, user_id: &str, after_seq: u64, limit: usize) -> Result<Page, ReadModelError>;
    /// A merchant's stored view.
    fn merchant(&self, merchant_id: &str) -> Result<Option<Row>, ReadModelError>;
    /// A merchant's journal entries with `seq` > `after_seq`, in seq order.
    fn merchant_journal(&self, merchant_id: &str, after_seq: u64, limit: usize) -> Result<Page, ReadModelError>;
    /// An agent's bill lines ordered by (card, time, txn id), after `cursor`.
    fn bill_table(&self, user_id: &str, cursor: Option<&str>, limit: usize) -> Result<Page, ReadModelError>;
    /// Sub-orders in review ordered by (order id, seq), after `cursor`.
    fn review_queue(&self, cursor: Option<&str>, limit: usize) -> Result<Page, ReadModelError>;
    /// The agent a card is bound to.
    fn card_owner(&self, card_id: &str) -> Result<Option<String>, ReadModelError>;
    /// The next offset `consumer` has not applied, if it ever wrote its progress.
    fn progress(&self, consumer: &str) -> Result<Option<u64>, ReadModelError>;

    fn put_order(&self, order_id: &str, merchant_id: &str, version: u64, view: Value) -> Result<(), ReadModelError> {
        let (order_id, merchant_id) = (order_id.to_string(), merchant_id.to_string());
        self.write(vec![Write::Order { order_id, merchant_id, version, view }])
    }
    fn put_user(&self, user_id: &str, version: u64, view: Value) -> Result<(), ReadModelError> {
        self.write(vec![Write::User { user_id: user_id.to_string(), version, view }])
    }
    fn append_user_journal(&self, user_id: &str, entries: Vec<(u64, Value)>) -> Result<(), ReadModelError> {
        self.write(vec![Write::UserJournal { user_id: user_id.to_string(), entries }])
    }
    fn put_merchant(&self, merchant_id: &str, version: u64, view: Value) -> Result<(), ReadModelError> {
        self.write(vec![Write::Merchant { merchant_id: merchant_id.to_string(), version, view }])
    }
    fn append_merchant_journal(&self, merchant_id: &str, entries: Vec<(u64, Value)>) -> Result<(), ReadModelError> {
        self.write(vec![Write::MerchantJournal { merchant_id: merchant_id.to_string(), entries }])
    }
    fn put_bill_line(&self, key: BillLineKey, version: u64, view: Option<Value>) -> Result<(), ReadModelError> {
        self.write(vec![Write::BillLine { key, version, view }])
    }
    fn put_review(&self, order_id: &str, seq: u32, version: u64, view: Option<Value>) -> Result<(), ReadModelError> {
        self.write(vec![Write::Review { order_id: order_id.to_string(), seq, version, view }])
    }
    fn put_card_owner(&self, card_id: &str, user_id: &str, version: u64) -> Result<(), ReadModelError> {
        self.write(vec![Write::CardOwner { card_id: card_id.to_string(), user_id: user_id.to_string(), version }])
    }
    fn put_progress(&self, consumer: &str, next_offset: u64) -> Result<(), ReadModelError> {
        self.write(vec![Write::Progress { consumer: consumer.to_string(), next_offset }])
    }
}

/// The largest version, journal seq or offset a write may carry: 2^50. Each becomes a ScyllaDB write
/// timestamp, read as microseconds since the epoch, and ScyllaDB refuses timestamps more than three days
/// ahead of its clock (`restrict_future_timestamp`, on by default); 2^50 µs is September 2005, so it is
/// always accepted, and 10^15 offsets are more than any log will hold. Both backends refuse larger
/// values, so they agree.
pub const VERSION_MAX: u64 = 1 << 50;

/// A version, seq or offset as a CQL `bigint` (and write timestamp): at most [`VERSION_MAX`].
fn to_i64(what: &str, value: u64) -> Result<i64, ReadModelError> {
    if value > VERSION_MAX {
        return Err(ReadModelError::Invalid(format!("{what} {value} is above {VERSION_MAX}")));
    }
    i64::try_from(value).map_err(|_| ReadModelError::Invalid(format!("{what} {value} is above i64::MAX")))
}

/// Checks every number of a write batch before anything is written.
fn validate(writes: &[Write]) -> Result<(), ReadModelError> {
    for write in writes {
        match write {
            Write::Order { version, .. }
            | Write::SubOrder { version, .. }
            | Write::User { version, .. }
            | Write::Merchant { version, .. }
            | Write::BillLine { version, .. }
            | Write::Review { version, .. }
            | Write::CardOwner { version, .. } => {
                to_i64("version", *version)?;
            }
            Write::UserJournal { entries, .. } | Write::MerchantJournal { entries, .. } => {
                for (seq, _) in entries {
                    to_i64("journal seq", *seq)?;
                }
            }
            Write::Progress { next_offset, .. } => {
                to_i64("offset", *next_offset)?;
            }
        }
    }
    Ok(())
}

/// The field of an order's row listing the seqs of the sub-orders its view shows, in order (removed
/// when the row is joined with its sub-orders' rows).
pub const ORDER_SUB_ORDER_SEQS: &str = "sub_order_seqs";

/// Joins an order's row with its sub-orders' rows into the view the API shows, the one
/// `pipelines::document::order_view` gives in memory: the sub-orders the order lists, in its order (one
/// whose row is not written yet is left out, as in memory when its agent is not found), their holds'
/// debt batches, and `settled` unless one of those holds has a deferred debit. The version is the
/// largest of the rows'.
pub fn join_order(mut row: OrderRow, sub_orders: Vec<(u32, Row)>) -> OrderRow {
    let Value::Object(view) = &mut row.view else { return row };
    let seqs: Vec<u64> =
        view.remove(ORDER_SUB_ORDER_SEQS).and_then(|seqs| serde_json::from_value(seqs).ok()).unwrap_or_default();
    let parts: std::collections::BTreeMap<u64, Row> =
        sub_orders.into_iter().map(|(seq, part)| (u64::from(seq), part)).collect();
    let (mut shown, mut debt_batches, mut settled) = (Vec::new(), Vec::new(), true);
    for seq in seqs {
        let Some(part) = parts.get(&seq) else { continue };
        row.version = row.version.max(part.version);
        shown.push(part.view["view"].clone());
        debt_batches.extend(part.view["debt_batches"].as_array().into_iter().flatten().cloned());
        settled &= part.view["settled"].as_bool().unwrap_or(true);
    }
    view.insert("sub_orders".to_string(), Value::Array(shown));
    view.insert("debt_batches".to_string(), Value::Array(debt_batches));
    view.insert("settled".to_string(), Value::Bool(settled));
    row
}

/// The bill table's cursor, as the embedded runtime writes it: `{time_ms}/{card id length}/{card id}{txn
/// id}` (ids may hold any character, so the card id is delimited by its length).
pub fn bill_cursor(card_id: &str, time_ms: i64, txn_id: &str) -> String {
    format!("{time_ms}/{}/{card_id}{txn_id}", card_id.len())
}

/// The (card id, time, txn id) a bill cursor names.
pub fn parse_bill_cursor(cursor: &str) -> Result<(String, i64, String), ReadModelError> {
    let invalid = || ReadModelError::Invalid(format!("malformed bill-table cursor `{cursor}`"));
    let (time, rest) = cursor.split_once('/').ok_or_else(invalid)?;
    let (length, ids) = rest.split_once('/').ok_or_else(invalid)?;
    let length: usize = length.parse().map_err(|_| invalid())?;
    let (card_id, txn_id) = (ids.get(..length).ok_or_else(invalid)?, ids.get(length..).ok_or_else(invalid)?);
    let time_ms: i64 = time.parse().map_err(|_| invalid())?;
    Ok((card_id.to_string(), time_ms, txn_id.to_string()))
}

/// The review queue's cursor: `{order_id}:{seq}`.
pub fn review_cursor(order_id: &str, seq: u32) -> String {
    format!("{order_id}:{seq}")
}

/// The (order id, seq) a review cursor names (order ids may hold `:`, the seq is after the last one).
pub fn parse_review_cursor(cursor: &str) -> Result<(String, u32), ReadModelError> {
    let invalid = || ReadModelError::Invalid(format!("malformed review-queue cursor `{cursor}`"));
    let (order_id, seq) = cursor.rsplit_once(':').ok_or_else(invalid)?;
    Ok((order_id.to_string(), seq.parse().map_err(|_| invalid())?))
}

/// Builds a page from up to `limit + 1` (key, item) pairs in order: the extra one only says that
/// another page exists, and the cursor is the last shown item's.
fn page_of<K>(mut selected: Vec<(K, Value)>, limit: usize, cursor: impl Fn(&K) -> String) -> Page {
    let more = selected.len() > limit;
    selected.truncate(limit);
    let next_cursor = if more { selected.last().map(|(key, _)| cursor(key)) } else { None };
    Page { items: selected.into_iter().map(|(_, item)| item).collect(), next_cursor }
}
