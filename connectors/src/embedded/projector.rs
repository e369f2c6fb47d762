//! The projector: keeps a [`ReadModel`] (ScyllaDB in the Kafka profile) equal to the stage partitions'
//! state. Processing threads mark the keys a committed batch touched; the projector thread writes their
//! views again, each with one version for the whole projection: the sum of the stage logs' committed
//! offsets when it began. That sum only grows (offsets never move back, across restarts too), so a view
//! written later never loses to an older one, and a projection repeated after a restart writes the same
//! version with the same content (the stages are deterministic).
//!
//! An agent's views are the costly ones (journal, bill table, sub-orders): the projector remembers what
//! it wrote (journal heads, a fingerprint per bill line and per sub-order) and writes what changed. Each
//! row holds the state of one stage partition: an order's row is the order stage's part of its view, and
//! each sub-order's part (the agent stage's) is a row of its own, joined to it when read
//! (`crate::scylla::join_order`).

use super::reads;
use super::{Doorbell, Inner};
use crate::runtime::{lock, stage_log, RuntimeError};
use crate::scylla::{BillLineKey, ReadModel, Write};
use pipelines::partition::StageKind;
use pipelines::stages::agent::state::{Agent, SubOrder, SubState};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

/// Keys projected per read-model write (bounds one write batch; the rest follow in the next ones).
const KEYS_PER_PROJECTION_MAX: usize = 512;
/// Journal entries per write.
const JOURNAL_ENTRIES_PER_WRITE_MAX: usize = 1_000;
/// How long the projector waits after a retryable read-model failure.
const RETRY_BACKOFF_MS: u64 = 500;

/// What the projector last wrote, to write only what changed.
#[derive(Default)]
struct Written {
    user_journal_seq: HashMap<pipelines::Text, u64>,
    merchant_journal_seq: HashMap<pipelines::Text, u64>,
    /// Per agent: bill line key → fingerprint of the item written.
    bill_lines: HashMap<pipelines::Text, BTreeMap<BillLineKey, u64>>,
    /// (order id, seq) → fingerprint of the sub-order's part of its order's view.
    sub_orders: HashMap<(pipelines::Text, u32), u64>,
    /// Per agent: sub-orders written to the review queue.
    reviewing: HashMap<pipelines::Text, BTreeSet<(pipelines::Text, u32)>>,
    card_owners: BTreeSet<pipelines::Text>,
}

pub struct Projector {
    model: std::sync::Arc<dyn ReadModel>,
    touched: Mutex<BTreeSet<(StageKind, pipelines::Text)>>,
    pub(super) doorbell: Doorbell,
    written: Mutex<Written>,
    /// Keys taken for the projection being written (they count as pending until it is).
    in_flight: std::sync::atomic::AtomicUsize,
}

fn fingerprint(value: &impl Hash) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

impl Projector {
    pub fn new(model: std::sync::Arc<dyn ReadModel>) -> Projector {
        Projector {
            model,
            touched: Mutex::new(BTreeSet::new()),
            doorbell: Doorbell::default(),
            written: Mutex::new(Written::default()),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub fn model(&self) -> &std::sync::Arc<dyn ReadModel> {
        &self.model
    }

    /// Keys a committed batch touched.
    pub(super) fn mark(&self, keys: impl IntoIterator<Item = (StageKind, pipelines::Text)>) {
        let mut touched = lock(&self.touched);
        let before = touched.len();
        touched.extend(keys);
        if touched.len() > before {
            drop(touched);
            self.doorbell.ring();
        }
    }

    /// Every key in the partitions' state (at start: the read model may be behind).
    pub(super) fn mark_all(&self, inner: &Inner) {
        self.mark(reads::all_keys(inner));
    }

    /// The instance took partitions over (instances sharing the partitions): another instance wrote their
    /// rows meanwhile, so what this one remembers writing is forgotten and every key projected again.
    pub(super) fn take_over(&self, inner: &Inner) {
        *lock(&self.written) = Written::default();
        self.mark_all(inner);
    }

    /// Keys marked and not yet projected (0: the read model shows every committed batch).
    pub fn pending(&self) -> usize {
        let touched = lock(&self.touched);
        touched.len() + self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The projector thread: projects what was marked until the pipeline stops.
    pub(super) fn run(&self, inner: &Inner) -> Result<(), RuntimeError> {
        while !inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            match self.step(inner) {
                Ok(true) => {}
                Ok(false) => self.doorbell.wait(Duration::from_millis(100)),
                Err(error) if error.is_retryable() => {
                    tracing::warn!(%error, "read model write failed; retrying");
                    std::thread::sleep(Duration::from_millis(RETRY_BACKOFF_MS));
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Projects until nothing is marked (reprocessing: no processing runs meanwhile).
    pub(super) fn drain(&self, inner: &Inner) -> Result<(), RuntimeError> {
        while self.step(inner)? {}
        Ok(())
    }

    /// Projects up to [`KEYS_PER_PROJECTION_MAX`] marked keys; false when none were marked. Keys of a
    /// projection that failed retryably are marked again.
    fn step(&self, inner: &Inner) -> Result<bool, RuntimeError> {
        let keys: Vec<(StageKind, pipelines::Text)> = {
            let mut touched = lock(&self.touched);
            let taken: Vec<_> = touched.iter().take(KEYS_PER_PROJECTION_MAX).cloned().collect();
            for key in &taken {
                touched.remove(key);
            }
            self.in_flight.store(taken.len(), std::sync::atomic::Ordering::SeqCst);
            taken
        };
        if keys.is_empty() {
            return Ok(false);
        }
        let result = self.project(inner, &keys);
        if let Err(error) = &result {
            if error.is_retryable() {
                // What the failed write carried is not in the model: forget having written it, so the
                // retry writes these keys' journals, bill lines, sub-orders and reviews again.
                self.forget(&keys);
                self.mark(keys);
            }
        }
        self.in_flight.store(0, std::sync::atomic::Ordering::SeqCst);
        result.map(|()| true)
    }

    fn forget(&self, keys: &[(StageKind, pipelines::Text)]) {
        let mut written = lock(&self.written);
        for (kind, key) in keys {
            match kind {
                StageKind::Agent => {
                    written.user_journal_seq.remove(key);
                    written.bill_lines.remove(key);
                    written.reviewing.remove(key);
                }
                StageKind::Merchant => {
                    written.merchant_journal_seq.remove(key);
                }
                StageKind::Order => {}
            }
        }
        // Which sub-orders and cards the failed write covered is not kept per key: all are written
        // again when their agents are next projected.
        written.sub_orders.clear();
        written.card_owners.clear();
    }

    /// The version of a projection starting now (see the module's comment). Sharing the partitions, the
    /// offsets other instances committed count too, as the store last read them: an instance taking a
    /// partition over has read every commit its previous owner made, so its versions are not lower.
    fn version(inner: &Inner) -> Result<u64, RuntimeError> {
        let logs: Vec<String> = inner.partitions.keys().map(|&(kind, partition)| stage_log(kind, partition)).collect();
        let offsets = inner.store.committed_all(&logs)?;
        Ok(offsets.into_iter().fold(1u64, u64::saturating_add))
    }

    fn project(&self, inner: &Inner, keys: &[(StageKind, pipelines::Text)]) -> Result<(), RuntimeError> {
        // Sharing the partitions, a projection and a change of assignment exclude each other: no row of
        // a partition is written once it is revoked (its next owner projects every key again).
        let _gate = crate::runtime::read_lock(&inner.gate);
        let partitions = inner.config.partitions;
        let owned = |(kind, key): &&(StageKind, pipelines::Text)| {
            inner.is_assigned(&stage_log(*kind, pipelines::partition::partition_of(key, partitions)))
        };
        let keys: Vec<&(StageKind, pipelines::Text)> = keys.iter().filter(owned).collect();
        let version = Self::version(inner)?;
        let mut writes = Vec::new();
        let mut written = lock(&self.written);
        for (kind, key) in keys {
            match kind {
                StageKind::Order => {
                    let (Some(view), Some(merchant_id)) =
                        (reads::order_part(inner, key), reads::order_merchant(inner, key))
                    else {
                        continue; // not shown yet (a creation the merchant stage has not accepted)
                    };
                    writes.push(Write::Order { order_id: key.to_string(), merchant_id, version, view });
                }
                StageKind::Merchant => self.merchant_writes(inner, key, version, &mut written, &mut writes),
                StageKind::Agent => self.agent_writes(inner, key, version, &mut written, &mut writes),
            }
        }
        if writes.is_empty() {
            return Ok(());
        }
        self.model.write(writes).map_err(RuntimeError::from)
    }

    fn merchant_writes(
        &self,
        inner: &Inner,
        merchant_id: &str,
        version: u64,
        written: &mut Written,
        writes: &mut Vec<Write>,
    ) {
        let Some(view) = reads::merchant(inner, merchant_id) else { return };
        writes.push(Write::Merchant { merchant_id: merchant_id.to_string(), version, view });
        let page = |after| reads::merchant_journal(inner, merchant_id, after, JOURNAL_ENTRIES_PER_WRITE_MAX);
        if let Some((entries, more)) = new_journal_entries(&mut written.merchant_journal_seq, merchant_id, page) {
            writes.push(Write::MerchantJournal { merchant_id: merchant_id.to_string(), entries });
            if more {
                self.mark([(StageKind::Merchant, pipelines::Text::from(merchant_id))]);
            }
        }
    }

    fn agent_writes(&self, inner: &Inner, user_id: &str, version: u64, written: &mut Written, writes: &mut Vec<Write>) {
        let Some(view) = reads::user(inner, user_id) else { return };
        writes.push(Write::User { user_id: user_id.to_string(), version, view });
        let page = |after| reads::user_journal(inner, user_id, after, JOURNAL_ENTRIES_PER_WRITE_MAX);
        if let Some((entries, more)) = new_journal_entries(&mut written.user_journal_seq, user_id, page) {
            writes.push(Write::UserJournal { user_id: user_id.to_string(), entries });
            if more {
                self.mark([(StageKind::Agent, pipelines::Text::from(user_id))]);
            }
        }
        reads::with_agent(inner, user_id, |agent| {
            bill_writes(agent, version, written, writes);
            sub_order_writes(agent, version, written, writes);
            for card_id in agent.cards.keys() {
                if written.card_owners.insert(card_id.clone()) {
                    writes.push(Write::CardOwner {
                        card_id: card_id.to_string(),
                        user_id: user_id.to_string(),
                        version,
                    });
                }
            }
        });
    }
}

/// The journal entries of `owner` after the last one written, as (seq, entry), and whether more follow;
/// remembers the last one. None when there are none.
fn new_journal_entries(
    written_seq: &mut HashMap<pipelines::Text, u64>,
    owner: &str,
    page: impl FnOnce(u64) -> Option<crate::runtime::Page>,
) -> Option<(Vec<(u64, Value)>, bool)> {
    let after = written_seq.get(owner).copied().unwrap_or(0);
    let page = page(after)?;
    let entries: Vec<(u64, Value)> =
        page.items.into_iter().filter_map(|item| item["seq"].as_u64().map(|seq| (seq, item))).collect();
    let last = entries.last()?.0;
    written_seq.insert(owner.into(), last);
    Some((entries, page.next_cursor.is_some()))
}

/// Bill lines whose item changed, and removals of lines no longer in the table.
fn bill_writes(agent: &Agent, version: u64, written: &mut Written, writes: &mut Vec<Write>) {
    let before = written.bill_lines.remove(&agent.user_id).unwrap_or_default();
    let mut now = BTreeMap::new();
    for (card_id, card) in &agent.cards {
        for bill_line in card.bill.lines_after(None) {
            let item = reads::bill_item(agent, card_id, bill_line);
            let key = BillLineKey {
                user_id: agent.user_id.to_string(),
                card_id: card_id.to_string(),
                time_ms: bill_line.line.time.millis(),
                txn_id: bill_line.line.txn_id.to_string(),
            };
            let print = fingerprint(&item.to_string());
            if before.get(&key) != Some(&print) {
                writes.push(Write::BillLine { key: key.clone(), version, view: Some(item) });
            }
            now.insert(key, print);
        }
    }
    for key in before.into_keys().filter(|key| !now.contains_key(key)) {
        writes.push(Write::BillLine { key, version, view: None });
    }
    written.bill_lines.insert(agent.user_id.clone(), now);
}

/// The sub-orders whose part of their order's view changed, and the review queue entries of this agent.
fn sub_order_writes(agent: &Agent, version: u64, written: &mut Written, writes: &mut Vec<Write>) {
    let mut reviewing = BTreeSet::new();
    for sub in &agent.subs {
        let key = (sub.order_id.clone(), sub.seq);
        if let Some(part) = pipelines::document::sub_order_part(agent, &sub.order_id, sub.seq) {
            let view = serde_json::to_value(&part).unwrap_or(Value::Null);
            let print = fingerprint(&view.to_string());
            if written.sub_orders.get(&key) != Some(&print) {
                written.sub_orders.insert(key.clone(), print);
                writes.push(Write::SubOrder { order_id: key.0.to_string(), seq: key.1, version, view });
            }
        }
        if sub.state == SubState::Reviewing {
            writes.push(Write::Review {
                order_id: key.0.to_string(),
                seq: key.1,
                version,
                view: Some(review_item(agent, sub)),
            });
            reviewing.insert(key);
        }
    }
    let before = written.reviewing.remove(&agent.user_id).unwrap_or_default();
    for (order_id, seq) in before.difference(&reviewing) {
        writes.push(Write::Review { order_id: order_id.to_string(), seq: *seq, version, view: None });
    }
    written.reviewing.insert(agent.user_id.clone(), reviewing);
}

fn review_item(agent: &Agent, sub: &SubOrder) -> Value {
    reads::review_item(agent, sub)
}

/// The API's view of a pipeline whose reads come from its read model (the Kafka + ScyllaDB profile):
/// orders, balances, journals, bill tables and the review queue are read from the model; writes,
/// authorisation lookups of ids still in flight, the lag and the SPEC §9 snapshot from the pipeline.
#[derive(Clone)]
pub struct ReadModelPipeline {
    pipeline: super::Embedded,
    model: std::sync::Arc<dyn ReadModel>,
}

impl ReadModelPipeline {
    pub fn new(pipeline: super::Embedded, model: std::sync::Arc<dyn ReadModel>) -> ReadModelPipeline {
        ReadModelPipeline { pipeline, model }
    }
}

/// A read-model failure answers as "not found" (the API's reads return options); it is logged.
fn logged<T>(what: &str, result: Result<T, crate::scylla::ReadModelError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            tracing::error!(%error, what, "read model read failed");
            None
        }
    }
}

impl crate::runtime::PipelineHandle for ReadModelPipeline {
    fn append(&self, inputs: Vec<pipelines::Input>) -> Result<Vec<crate::runtime::Appended>, RuntimeError> {
        self.pipeline.append(inputs)
    }
    fn event_position(&self, event_id: &str) -> Option<u64> {
        self.pipeline.event_position(event_id)
    }
    fn order(&self, order_id: &str) -> Option<Value> {
        logged("order", self.model.order_view(order_id)).flatten().map(|row| row.view)
    }
    fn order_merchant(&self, order_id: &str) -> Option<String> {
        logged("order", self.model.order(order_id))
            .flatten()
            .map(|row| row.merchant_id)
            .or_else(|| self.pipeline.order_merchant(order_id))
    }
    fn user_exists(&self, user_id: &str) -> bool {
        self.pipeline.user_exists(user_id)
    }
    fn merchant_exists(&self, merchant_id: &str) -> bool {
        self.pipeline.merchant_exists(merchant_id)
    }
    fn user(&self, user_id: &str) -> Option<Value> {
        logged("user", self.model.user(user_id)).flatten().map(|row| row.view)
    }
    fn user_journal(&self, user_id: &str, after_seq: u64, limit: usize) -> Option<crate::runtime::Page> {
        self.user(user_id)?;
        logged("user journal", self.model.user_journal(user_id, after_seq, limit))
    }
    fn user_bill_table(&self, user_id: &str, cursor: Option<&str>, limit: usize) -> Option<crate::runtime::Page> {
        self.user(user_id)?;
        logged("bill table", self.model.bill_table(user_id, cursor, limit))
    }
    fn merchant(&self, merchant_id: &str) -> Option<Value> {
        logged("merchant", self.model.merchant(merchant_id)).flatten().map(|row| row.view)
    }
    fn merchant_journal(&self, merchant_id: &str, after_seq: u64, limit: usize) -> Option<crate::runtime::Page> {
        self.merchant(merchant_id)?;
        logged("merchant journal", self.model.merchant_journal(merchant_id, after_seq, limit))
    }
    fn review_queue(&self, cursor: Option<&str>, limit: usize) -> crate::runtime::Page {
        logged("review queue", self.model.review_queue(cursor, limit))
            .unwrap_or(crate::runtime::Page { items: Vec::new(), next_cursor: None })
    }
    fn card_owner(&self, card_id: &str) -> Option<String> {
        logged("card owner", self.model.card_owner(card_id)).flatten().or_else(|| self.pipeline.card_owner(card_id))
    }
    fn snapshot(&self) -> Value {
        self.pipeline.snapshot()
    }
    fn lag_report(&self) -> crate::runtime::LagReport {
        self.pipeline.lag_report()
    }
    fn ready(&self) -> bool {
        self.pipeline.ready()
    }
    fn put_merchant_key(&self, key_sha256_hex: &str, merchant_id: &str) -> Result<(), RuntimeError> {
        self.pipeline.put_merchant_key(key_sha256_hex, merchant_id)
    }
    fn merchant_of_key(&self, key_sha256_hex: &str) -> Option<String> {
        self.pipeline.merchant_of_key(key_sha256_hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ClockMode, PipelineHandle};
    use crate::scylla::{MemoryReadModel, OrderRow, ReadModelError, Row, PAGE_ITEMS_MAX};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The in-memory model, whose every third write fails as retryable (a ScyllaDB timeout) before
    /// writing anything.
    struct Flaky {
        model: MemoryReadModel,
        writes: AtomicUsize,
        failed: AtomicUsize,
    }

    impl ReadModel for Flaky {
        fn write(&self, writes: Vec<Write>) -> Result<(), ReadModelError> {
            if self.writes.fetch_add(1, Ordering::SeqCst) % 3 == 1 {
                self.failed.fetch_add(1, Ordering::SeqCst);
                return Err(ReadModelError::Retryable("timed out".to_string()));
            }
            self.model.write(writes)
        }
        fn order(&self, order_id: &str) -> Result<Option<OrderRow>, ReadModelError> {
            self.model.order(order_id)
        }
        fn sub_orders(&self, order_id: &str) -> Result<Vec<(u32, Row)>, ReadModelError> {
            self.model.sub_orders(order_id)
        }
        fn user(&self, user_id: &str) -> Result<Option<Row>, ReadModelError> {
            self.model.user(user_id)
        }
        fn user_journal(
            &self,
            user_id: &str,
            after: u64,
            limit: usize,
        ) -> Result<crate::runtime::Page, ReadModelError> {
            self.model.user_journal(user_id, after, limit)
        }
        fn merchant(&self, merchant_id: &str) -> Result<Option<Row>, ReadModelError> {
            self.model.merchant(merchant_id)
        }
        fn merchant_journal(
            &self,
            merchant_id: &str,
            after: u64,
            limit: usize,
        ) -> Result<crate::runtime::Page, ReadModelError> {
            self.model.merchant_journal(merchant_id, after, limit)
        }
        fn bill_table(
            &self,
            user_id: &str,
            cursor: Option<&str>,
            limit: usize,
        ) -> Result<crate::runtime::Page, ReadModelError> {
            self.model.bill_table(user_id, cursor, limit)
        }
        fn review_queue(&self, cursor: Option<&str>, limit: usize) -> Result<crate::runtime::Page, ReadModelError> {
            self.model.review_queue(cursor, limit)
        }
        fn card_owner(&self, card_id: &str) -> Result<Option<String>, ReadModelError> {
            self.model.card_owner(card_id)
        }
        fn progress(&self, consumer: &str) -> Result<Option<u64>, ReadModelError> {
            self.model.progress(consumer)
        }
    }

    fn inputs() -> Vec<pipelines::Input> {
        pipelines::workload::workload(20, 2)
            .into_iter()
            .filter(|input| !input.command.type_name().starts_with("wallet_"))
            .collect()
    }

    /// Writes that fail retryably are retried whole: the model ends equal to the stages' own reads.
    #[test]
    fn failed_read_model_writes_are_written_again() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = super::super::EmbeddedConfig::new(directory.path().to_path_buf(), ClockMode::Event);
        let store = crate::embedded::store::RedbStore::open(directory.path()).expect("the store opens");
        let flaky = Arc::new(Flaky {
            model: MemoryReadModel::new(PAGE_ITEMS_MAX),
            writes: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
        });
        let model: Arc<dyn ReadModel> = flaky.clone();
        let pipeline = super::super::Embedded::start_on(config, Box::new(store), Some(Arc::clone(&model)))
            .expect("the pipeline starts");
        let inputs = inputs();
        for bulk in inputs.chunks(50) {
            pipeline.append(bulk.to_vec()).expect("appended");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while pipeline.lag() > 0 {
            assert!(std::time::Instant::now() < deadline, "the pipeline did not become quiescent");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(flaky.failed.load(Ordering::SeqCst) > 0, "some writes failed");
        let served = ReadModelPipeline::new(pipeline.clone(), model);
        let snapshot = pipeline.snapshot();
        let mut compared = 0;
        for order_id in snapshot["orders"].as_object().expect("orders").keys() {
            assert_eq!(served.order(order_id), pipeline.order(order_id), "order {order_id}");
            compared += 1;
        }
        for user_id in snapshot["users"].as_object().expect("users").keys() {
            assert_eq!(served.user(user_id), pipeline.user(user_id), "user {user_id}");
            assert_eq!(served.user_journal(user_id, 0, 1_000), pipeline.user_journal(user_id, 0, 1_000));
            assert_eq!(served.user_bill_table(user_id, None, 1_000), pipeline.user_bill_table(user_id, None, 1_000));
            compared += 1;
        }
        for merchant_id in snapshot["merchants"].as_object().expect("merchants").keys() {
            assert_eq!(served.merchant(merchant_id), pipeline.merchant(merchant_id));
            assert_eq!(
                served.merchant_journal(merchant_id, 0, 1_000),
                pipeline.merchant_journal(merchant_id, 0, 1_000)
            );
        }
        assert_eq!(served.review_queue(None, 1_000), pipeline.review_queue(None, 1_000));
        assert!(compared > 40, "the workload has orders and agents: {compared}");
        pipeline.stop();
    }
}
