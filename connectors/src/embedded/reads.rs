//! Reads served from the stage partitions' materialised state (read locks; a processing thread holds
//! the write lock of its own partition only for the in-memory part of one batch).

use super::Inner;
use crate::runtime::{read_lock, record_event_time, stage_log, LagReport, Page, CONNECTOR_CONSUMER, OUTPUTS_LOG};
use pipelines::document::{merchant_view, order_is_shown, order_view, user_view};
use pipelines::partition::{partition_of, StageKind, StagePartition, StageState};
use pipelines::segmented::Segmented;
use pipelines::stages::agent::state::{Agent, SubState};
use pipelines::stages::agent::AgentStage;
use pipelines::stages::merchant::MerchantStage;
use pipelines::stages::order::OrderStage;
use pipelines::time::Timestamp;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{RwLock, RwLockReadGuard};

/// Outputs the snapshot reads at most (the document of a long-running service is for tests and audits;
/// the API pages everything else).
const SNAPSHOT_OUTPUTS_MAX: usize = 1_000_000;

type Guard<'a> = RwLockReadGuard<'a, StagePartition>;

fn guard<'a>(inner: &'a Inner, kind: StageKind, key: &str) -> Option<Guard<'a>> {
    partition_guard(inner, kind, partition_of(key, inner.config.partitions))
}

fn partition_guard(inner: &Inner, kind: StageKind, partition: u32) -> Option<Guard<'_>> {
    inner.partitions.get(&(kind, partition)).map(|lock| read_lock(lock))
}

fn all_guards(inner: &Inner, kind: StageKind) -> Vec<Guard<'_>> {
    inner.partitions.iter().filter(|((stage, _), _)| *stage == kind).map(|(_, lock)| read_lock(lock)).collect()
}

fn orders(partition: &StagePartition) -> Option<&OrderStage> {
    match partition.state() {
        StageState::Order(stage) => Some(stage),
        _ => None,
    }
}

fn agents(partition: &StagePartition) -> Option<&AgentStage> {
    match partition.state() {
        StageState::Agent(stage) => Some(stage),
        _ => None,
    }
}

fn merchants(partition: &StagePartition) -> Option<&MerchantStage> {
    match partition.state() {
        StageState::Merchant(stage) => Some(stage),
        _ => None,
    }
}

fn to_value(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_else(|error| json!({ "error": error.to_string() }))
}

/// Every agent partition's guard by partition number, so an agent is found by its key.
fn agent_guards(inner: &Inner) -> BTreeMap<u32, Guard<'_>> {
    all_guards(inner, StageKind::Agent).into_iter().map(|guard| (guard.partition(), guard)).collect()
}

fn find_agent<'a>(guards: &'a BTreeMap<u32, Guard<'_>>, partitions: u32, user_id: &str) -> Option<&'a Agent> {
    guards
        .get(&partition_of(user_id, partitions))
        .and_then(|guard| agents(guard))
        .and_then(|stage| stage.agents.get(user_id))
}

/// The guards of the agent partitions holding these agents, by partition number: a read waits only for
/// the processing threads applying those partitions, not for every agent partition.
fn agent_guards_of<'a, 'b>(inner: &'a Inner, user_ids: impl Iterator<Item = &'b str>) -> BTreeMap<u32, Guard<'a>> {
    let partitions = inner.config.partitions;
    let wanted: BTreeSet<u32> = user_ids.map(|user_id| partition_of(user_id, partitions)).collect();
    let guards = wanted
        .into_iter()
        .filter_map(|partition| Some((partition, partition_guard(inner, StageKind::Agent, partition)?)));
    guards.collect()
}

pub(super) fn order(inner: &Inner, order_id: &str) -> Option<Value> {
    let order_guard = guard(inner, StageKind::Order, order_id)?;
    let order = orders(&order_guard)?.orders.get(order_id).filter(|order| order_is_shown(order))?;
    let agent_guards = agent_guards_of(inner, order.sub_orders.iter().map(|sub_order| sub_order.user_id.as_str()));
    let view = order_view(order, |user_id| find_agent(&agent_guards, inner.config.partitions, user_id));
    let mut value = to_value(view);
    if let Value::Object(object) = &mut value {
        object.insert("order_id".to_string(), json!(order_id));
    }
    Some(value)
}

/// An order's own part of its view, for a read model whose rows each belong to one stage partition
/// (`crate::scylla::Write::Order`): the view without its sub-orders, listing the seqs of those it shows.
pub(super) fn order_part(inner: &Inner, order_id: &str) -> Option<Value> {
    let order_guard = guard(inner, StageKind::Order, order_id)?;
    let order = orders(&order_guard)?.orders.get(order_id).filter(|order| order_is_shown(order))?;
    let mut value = to_value(order_view(order, |_| None));
    if let Value::Object(object) = &mut value {
        object.insert("order_id".to_string(), json!(order_id));
        let seqs: Vec<u32> = order.sub_orders.iter().map(|reference| reference.seq).collect();
        object.insert(crate::scylla::ORDER_SUB_ORDER_SEQS.to_string(), json!(seqs));
    }
    Some(value)
}

pub(super) fn order_merchant(inner: &Inner, order_id: &str) -> Option<String> {
    let order_guard = guard(inner, StageKind::Order, order_id)?;
    orders(&order_guard)?.orders.get(order_id).map(|order| order.merchant_id.to_string())
}

pub(super) fn user(inner: &Inner, user_id: &str) -> Option<Value> {
    let agent_guard = guard(inner, StageKind::Agent, user_id)?;
    let agent = agents(&agent_guard)?.agents.get(user_id)?;
    let mut value = to_value(user_view(agent));
    if let Value::Object(object) = &mut value {
        // The journal is paged (`/journal`); the view says how long it is.
        object.remove("journal");
        object.insert("user_id".to_string(), json!(user_id));
        object.insert("journal_entries".to_string(), json!(agent.journal.len()));
        object.insert("telegram_bound".to_string(), json!(agent.telegram_bound));
    }
    Some(value)
}

fn page<T: serde::Serialize>(entries: &Segmented<T>, seq: impl Fn(&T) -> u64, after_seq: u64, limit: usize) -> Page {
    let start = entries.partition_point(|entry| seq(entry) <= after_seq);
    let end = entries.len().min(start.saturating_add(limit));
    let more = end < entries.len();
    let next_cursor = if more {
        end.checked_sub(1).and_then(|last| entries.get(last)).map(|entry| seq(entry).to_string())
    } else {
        None
    };
    Page { items: entries.iter_from(start).take(end - start).map(to_value).collect(), next_cursor }
}

pub(super) fn user_journal(inner: &Inner, user_id: &str, after_seq: u64, limit: usize) -> Option<Page> {
    let agent_guard = guard(inner, StageKind::Agent, user_id)?;
    let agent = agents(&agent_guard)?.agents.get(user_id)?;
    Some(page(&agent.journal, |entry| entry.seq, after_seq, limit))
}

/// The bill table of an agent's cards, paged; the cursor is the last item's (see `bill_cursor`).
pub(super) fn user_bill_table(inner: &Inner, user_id: &str, cursor: Option<&str>, limit: usize) -> Option<Page> {
    let agent_guard = guard(inner, StageKind::Agent, user_id)?;
    let agent = agents(&agent_guard)?.agents.get(user_id)?;
    let after = cursor.and_then(parse_bill_cursor);
    let mut items = Vec::with_capacity(limit.min(1024));
    let mut next_cursor = None;
    for (card_id, card) in &agent.cards {
        let within = match &after {
            Some((after_card, _, _)) if card_id.as_str() < after_card.as_str() => continue,
            Some((after_card, time, txn_id)) if card_id == after_card => Some((*time, txn_id.as_str())),
            _ => None,
        };
        for bill_line in card.bill.lines_after(within) {
            if items.len() == limit {
                next_cursor = items.last().and_then(|item: &Value| item["cursor"].as_str().map(str::to_string));
                return Some(Page { items, next_cursor });
            }
            items.push(bill_item(agent, card_id, bill_line));
        }
    }
    Some(Page { items, next_cursor })
}

pub(super) fn bill_item(agent: &Agent, card_id: &str, bill_line: &pipelines::stages::agent::state::BillLine) -> Value {
    let line = &bill_line.line;
    let matched_to =
        bill_line.used_by.and_then(|index| agent.subs.get(index)).map(|sub| format!("{}:{}", sub.order_id, sub.seq));
    json!({
        "cursor": bill_cursor(card_id, line.time, &line.txn_id),
        "card_id": card_id, "txn_id": line.txn_id, "utr": line.utr, "utr_supported": line.utr_supported,
        "direction": line.direction, "amount": line.amount, "status": line.status, "time": line.time,
        "counterparty": line.counterparty, "payee_ifsc": line.payee_ifsc, "matched_to": matched_to,
    })
}

/// `{time_ms}/{card id length}/{card id}{txn id}`: ids may hold any character, so the card id is
/// delimited by its length.
fn bill_cursor(card_id: &str, time: pipelines::Timestamp, txn_id: &str) -> String {
    format!("{}/{}/{card_id}{txn_id}", time.millis(), card_id.len())
}

fn parse_bill_cursor(cursor: &str) -> Option<(String, pipelines::Timestamp, String)> {
    let (time, rest) = cursor.split_once('/')?;
    let (length, ids) = rest.split_once('/')?;
    let length: usize = length.parse().ok()?;
    let (card_id, txn_id) = (ids.get(..length)?, ids.get(length..)?);
    Some((card_id.to_string(), pipelines::Timestamp::from_millis(time.parse().ok()?), txn_id.to_string()))
}

pub(super) fn merchant(inner: &Inner, merchant_id: &str) -> Option<Value> {
    let merchant_guard = guard(inner, StageKind::Merchant, merchant_id)?;
    let merchant = merchants(&merchant_guard)?.merchants.get(merchant_id)?;
    Some(json!({
        "merchant_id": merchant_id,
        "available": merchant.balances.available,
        "payout_reserve": merchant.balances.payout_reserve,
        "journal_entries": merchant.journal.len(),
    }))
}

pub(super) fn merchant_journal(inner: &Inner, merchant_id: &str, after_seq: u64, limit: usize) -> Option<Page> {
    let merchant_guard = guard(inner, StageKind::Merchant, merchant_id)?;
    let merchant = merchants(&merchant_guard)?.merchants.get(merchant_id)?;
    Some(page(&merchant.journal, |entry| entry.seq, after_seq, limit))
}

/// Sub-orders in review, ordered by (order id, seq); the cursor is the last item's `order_id:seq`.
pub(super) fn review_queue(inner: &Inner, cursor: Option<&str>, limit: usize) -> Page {
    let guards = all_guards(inner, StageKind::Agent);
    let mut waiting: BTreeMap<(String, u32), Value> = BTreeMap::new();
    for guard in &guards {
        let Some(stage) = agents(guard) else { continue };
        for agent in stage.agents.values() {
            for sub in agent.subs.iter().filter(|sub| sub.state == SubState::Reviewing) {
                waiting.insert((sub.order_id.to_string(), sub.seq), review_item(agent, sub));
            }
        }
    }
    let after = cursor.and_then(|cursor| {
        let (order_id, seq) = cursor.rsplit_once(':')?;
        Some((order_id.to_string(), seq.parse::<u32>().ok()?))
    });
    let mut selected: Vec<((String, u32), Value)> =
        waiting.into_iter().filter(|(key, _)| after.as_ref().is_none_or(|after| key > after)).take(limit + 1).collect();
    // A cursor is only given when another page exists.
    let more = selected.len() > limit;
    selected.truncate(limit);
    let next_cursor = if more { selected.last().map(|((order_id, seq), _)| format!("{order_id}:{seq}")) } else { None };
    Page { items: selected.into_iter().map(|(_, item)| item).collect(), next_cursor }
}

/// A sub-order waiting for an operator, as the review queue shows it.
pub(super) fn review_item(agent: &Agent, sub: &pipelines::stages::agent::state::SubOrder) -> Value {
    json!({
        "order_id": sub.order_id, "seq": sub.seq, "user_id": agent.user_id, "card_id": sub.card_id,
        "kind": sub.kind, "amount": sub.amount, "flags": sub.flags, "paid_total": sub.paid_total,
        "matched_txn_ids": sub.matched_txn_ids,
    })
}

/// Calls `visit` with an agent's state under its partition's read lock.
pub(super) fn with_agent(inner: &Inner, user_id: &str, visit: impl FnOnce(&Agent)) {
    if let Some(agent_guard) = guard(inner, StageKind::Agent, user_id) {
        if let Some(agent) = agents(&agent_guard).and_then(|stage| stage.agents.get(user_id)) {
            visit(agent);
        }
    }
}

/// Every key in the partitions' state, as (stage, key).
pub(super) fn all_keys(inner: &Inner) -> Vec<(StageKind, pipelines::Text)> {
    let mut keys = Vec::new();
    for lock in inner.partitions.values() {
        let partition = read_lock(lock);
        match partition.state() {
            StageState::Order(stage) => keys.extend(stage.orders.keys().map(|key| (StageKind::Order, key.clone()))),
            StageState::Agent(stage) => keys.extend(stage.agents.keys().map(|key| (StageKind::Agent, key.clone()))),
            StageState::Merchant(stage) => {
                keys.extend(stage.merchants.keys().map(|key| (StageKind::Merchant, key.clone())))
            }
        }
    }
    keys
}

pub(super) fn card_owner(inner: &Inner, card_id: &str) -> Option<String> {
    all_guards(inner, StageKind::Agent)
        .iter()
        .find_map(|guard| agents(guard).and_then(|stage| stage.card_owner.get(card_id).map(|owner| owner.to_string())))
}

/// The SPEC §9 document of every partition's state and the outputs log.
pub(super) fn snapshot(inner: &Inner) -> Value {
    let order_guards = all_guards(inner, StageKind::Order);
    let agent_guards = agent_guards(inner);
    let merchant_guards = all_guards(inner, StageKind::Merchant);
    let partitions = inner.config.partitions;
    let mut clock = pipelines::Timestamp::default();
    let mut users = BTreeMap::new();
    for guard in agent_guards.values() {
        clock = clock.max(guard.clock());
        for (id, agent) in agents(guard).map(|stage| &stage.agents).into_iter().flatten() {
            users.insert(id.as_str(), to_value(user_view(agent)));
        }
    }
    let mut merchants_out = BTreeMap::new();
    for guard in &merchant_guards {
        clock = clock.max(guard.clock());
        for (id, merchant) in merchants(guard).map(|stage| &stage.merchants).into_iter().flatten() {
            merchants_out.insert(id.as_str(), to_value(merchant_view(merchant)));
        }
    }
    let mut orders_out = BTreeMap::new();
    for guard in &order_guards {
        clock = clock.max(guard.clock());
        for (id, order) in orders(guard).map(|stage| &stage.orders).into_iter().flatten() {
            if order_is_shown(order) {
                let view = order_view(order, |user_id| find_agent(&agent_guards, partitions, user_id));
                orders_out.insert(id.as_str(), to_value(view));
            }
        }
    }
    let mut document = Map::new();
    document.insert("clock".to_string(), to_value(clock));
    document.insert("users".to_string(), to_value(users));
    document.insert("merchants".to_string(), to_value(merchants_out));
    document.insert("orders".to_string(), to_value(orders_out));
    document.insert("outputs".to_string(), Value::Array(outputs(inner)));
    Value::Object(document)
}

fn outputs(inner: &Inner) -> Vec<Value> {
    let records = inner.store.read(OUTPUTS_LOG, 0, SNAPSHOT_OUTPUTS_MAX).unwrap_or_default();
    // The stored output is already the document's JSON: taken as it is, not decoded and encoded again.
    records
        .iter()
        .filter_map(|(_, bytes)| serde_json::from_slice::<Value>(bytes).ok())
        .filter_map(|mut record| record.get_mut("output").map(Value::take))
        .collect()
}

/// What is appended and not yet processed, by log: every stage log's backlog and the connector's
/// (read together, in one transaction), with the records each agent partition holds for an answer in
/// flight, plus the partitions with a timer due that the ticker has yet to tick and the keys not yet
/// in the read model. A total of 0 means nothing more happens without new input.
pub(super) fn lag_report(inner: &Inner) -> LagReport {
    let stage_logs = stage_logs(inner);
    let pairs = consumed_pairs(inner, &stage_logs);
    // An unreadable store is not quiescent: every log's figure is unknown.
    let backlog = inner.store.backlog(&pairs).unwrap_or_else(|_| vec![u64::MAX; pairs.len()]);
    debug_assert_eq!(backlog.len(), pairs.len(), "a figure per log");
    let now_ms = super::ticker_now_ms(inner);
    let mut first_waiting = first_waiting_at(inner, &pairs, &backlog);
    let mut report = LagReport {
        logs: pairs.iter().zip(backlog).map(|((log, _), records)| (log.to_string(), records)).collect(),
        timers_due: super::partitions_due(inner, now_ms),
        // Keys committed but not yet in the read model count too: a client that saw lag 0 reads them there.
        unprojected: inner.projector.as_ref().map_or(0, |projector| projector.pending() as u64),
        lag_ms: BTreeMap::new(),
    };
    // Records an agent partition holds for an answer in flight are consumed but not applied yet (when
    // another instance's connector answers, this instance's backlog does not show that answer).
    for (index, (log, partition)) in stage_logs.iter().enumerate() {
        let (held, first_held_at) = held_for_answers(partition);
        if let Some(records) = report.logs.get_mut(log) {
            *records = records.saturating_add(held);
        }
        // The stage logs' pairs come first, in `stage_logs`' order.
        if let Some(Ok(first_in_log)) = first_waiting.as_mut().and_then(|first| first.get_mut(index)) {
            *first_in_log = (*first_in_log).into_iter().chain(first_held_at).min();
        }
    }
    if let Some(first_waiting) = first_waiting {
        let lags = first_waiting.into_iter().map(|first| lag_ms(now_ms, first));
        report.lag_ms = pairs.iter().map(|(log, _)| log.to_string()).zip(lags).collect();
    }
    report
}

/// Whether the lag report's figures by log would all be 0: every stage log and the statement
/// connector's backlog consumed and committed, and no agent partition holding records for an answer.
/// Nothing more happens then before the next input but the timers a tick fires. The ticker asks this
/// whenever a processing thread runs out of records, so it reads only those figures, not the rest of
/// the report (the first waiting records, the timers due, the read model's backlog), and the records
/// held in memory first: while a crawl is in flight they answer without a read of the store.
pub(super) fn drained(inner: &Inner) -> bool {
    let stage_logs = stage_logs(inner);
    if stage_logs.iter().any(|(_, partition)| held_for_answers(partition).0 > 0) {
        return false;
    }
    let pairs = consumed_pairs(inner, &stage_logs);
    inner.store.backlog(&pairs).is_ok_and(|backlog| backlog.iter().all(|records| *records == 0))
}

/// Every stage log with its partition, in `inner.partitions`' order.
fn stage_logs(inner: &Inner) -> Vec<(String, &RwLock<StagePartition>)> {
    inner.partitions.iter().map(|(&(kind, index), partition)| (stage_log(kind, index), &**partition)).collect()
}

/// The (log, consumer) pairs whose backlogs are the pipeline's lag: the stage logs', in `stage_logs`'
/// order (a stage log's consumer is named after its log), then the statement connector's on the
/// outputs log when one is attached.
fn consumed_pairs<'logs>(
    inner: &Inner,
    stage_logs: &'logs [(String, &RwLock<StagePartition>)],
) -> Vec<(&'logs str, &'logs str)> {
    let mut pairs: Vec<(&str, &str)> = stage_logs.iter().map(|(log, _)| (log.as_str(), log.as_str())).collect();
    if inner.connector_attached.load(std::sync::atomic::Ordering::SeqCst) {
        pairs.push((OUTPUTS_LOG, CONNECTOR_CONSUMER));
    }
    pairs
}

/// The records an agent partition holds for an answer in flight (consumed but not applied yet), and
/// the event time of the first; none for other partitions.
fn held_for_answers(partition: &RwLock<StagePartition>) -> (u64, Option<Timestamp>) {
    read_lock(partition).answer_barrier().map_or((0, None), |barrier| (barrier.held() as u64, barrier.first_held_at()))
}

/// The event time of the first record waiting in each pair's log, where the store reads them (None:
/// it does not): `Err` for a record that could not be read. Only logs with a backlog are read (on
/// Kafka each costs round trips to a broker); the others have no record waiting.
fn first_waiting_at(
    inner: &Inner,
    pairs: &[(&str, &str)],
    backlog: &[u64],
) -> Option<Vec<Result<Option<Timestamp>, ()>>> {
    debug_assert_eq!(backlog.len(), pairs.len(), "a figure per log");
    let waiting: Vec<(&str, &str)> =
        pairs.iter().zip(backlog).filter(|(_, records)| **records > 0).map(|(pair, _)| *pair).collect();
    let mut records = match inner.store.first_unconsumed(&waiting)? {
        Ok(records) => records.into_iter(),
        Err(_) => return Some(vec![Err(()); pairs.len()]),
    };
    debug_assert_eq!(records.len(), waiting.len(), "a record or none per log");
    let event_time = |(&(log, _), records_waiting): (&(&str, &str), &u64)| {
        let record = if *records_waiting > 0 { records.next().flatten() } else { None };
        record.map(|bytes| record_event_time(log, &bytes).ok_or(())).transpose()
    };
    Some(pairs.iter().zip(backlog).map(event_time).collect())
}

/// The clock's now less the first waiting record's event time: 0 when none waits (or it is stamped
/// ahead of the clock), `u64::MAX` when it could not be read.
fn lag_ms(now_ms: i64, first_waiting: Result<Option<Timestamp>, ()>) -> u64 {
    match first_waiting {
        Ok(Some(at)) => u64::try_from(now_ms.saturating_sub(at.millis())).unwrap_or(0),
        Ok(None) => 0,
        Err(()) => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Journal entries numbered 1..=count, as journals number theirs.
    fn numbered(count: u64) -> Segmented<u64> {
        (1..=count).collect()
    }

    fn shown(page: &Page) -> Vec<u64> {
        page.items.iter().map(|item| item.as_u64().expect("a number")).collect()
    }

    #[test]
    fn journal_pages_follow_their_cursor_across_segments() {
        // 30 entries span the segments of 4, 8 and 16 entries and part of the next.
        let entries = numbered(30);
        let first = page(&entries, |seq| *seq, 0, 10);
        assert_eq!(shown(&first), (1..=10).collect::<Vec<_>>());
        assert_eq!(first.next_cursor.as_deref(), Some("10"));
        let middle = page(&entries, |seq| *seq, 10, 15);
        assert_eq!(shown(&middle), (11..=25).collect::<Vec<_>>());
        assert_eq!(middle.next_cursor.as_deref(), Some("25"));
        let last = page(&entries, |seq| *seq, 25, 10);
        assert_eq!(shown(&last), (26..=30).collect::<Vec<_>>());
        assert_eq!(last.next_cursor, None, "the last page names no next one");
        let exact = page(&entries, |seq| *seq, 20, 10);
        assert_eq!(shown(&exact), (21..=30).collect::<Vec<_>>());
        assert_eq!(exact.next_cursor, None, "a page ending with the journal names no next one");
        let past = page(&entries, |seq| *seq, 30, 10);
        assert!(past.items.is_empty() && past.next_cursor.is_none());
        let empty = page(&numbered(0), |seq| *seq, 0, 10);
        assert!(empty.items.is_empty() && empty.next_cursor.is_none());
    }
}
