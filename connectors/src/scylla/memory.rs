//! The read model in memory: ordered maps behind one lock. The reference the ScyllaDB model is checked
//! against (same conformance suite), and the model of tests.

use super::{
    bill_cursor, page_of, parse_bill_cursor, parse_review_cursor, review_cursor, validate, BillLineKey, OrderRow,
    ReadModel, ReadModelError, Row, Write, PAGE_ITEMS_MAX,
};
use crate::runtime::Page;
use serde_json::Value;
use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Mutex;

/// A versioned slot; `view: None` is a removal, remembered with its version so that an older write
/// arriving later cannot bring the row back (as a ScyllaDB tombstone does).
#[derive(Clone, Debug)]
struct Slot<T> {
    version: u64,
    value: Option<T>,
}

impl<T> Slot<T> {
    /// Whether a write at `version` (a removal if `removing`) replaces this slot: a higher version
    /// always does; at the same version only a removal does (ScyllaDB: a tombstone wins a tie).
    fn yields_to(&self, version: u64, removing: bool) -> bool {
        version > self.version || (version == self.version && removing && self.value.is_some())
    }
}

fn put_slot<K: Ord, T>(map: &mut BTreeMap<K, Slot<T>>, key: K, version: u64, value: Option<T>) {
    match map.get_mut(&key) {
        Some(slot) if !slot.yields_to(version, value.is_none()) => {}
        Some(slot) => *slot = Slot { version, value },
        None => {
            map.insert(key, Slot { version, value });
        }
    }
}

#[derive(Default)]
struct Tables {
    orders: BTreeMap<String, Slot<(String, Value)>>,
    /// (order id, seq) → part.
    sub_orders: BTreeMap<(String, u32), Slot<Value>>,
    users: BTreeMap<String, Slot<Value>>,
    merchants: BTreeMap<String, Slot<Value>>,
    /// (user id, seq) → entry.
    user_journal: BTreeMap<(String, u64), Value>,
    /// (merchant id, seq) → entry.
    merchant_journal: BTreeMap<(String, u64), Value>,
    /// (user id, card id, time, txn id) → item.
    bill_lines: BTreeMap<(String, String, i64, String), Slot<Value>>,
    /// (order id, seq) → item.
    review: BTreeMap<(String, u32), Slot<Value>>,
    card_owners: BTreeMap<String, Slot<String>>,
    progress: BTreeMap<String, u64>,
}

/// The read model in memory.
pub struct MemoryReadModel {
    tables: Mutex<Tables>,
    /// Items one page holds at most, whatever the caller asks.
    page_items_max: usize,
}

impl Default for MemoryReadModel {
    fn default() -> Self {
        Self::new(PAGE_ITEMS_MAX)
    }
}

impl MemoryReadModel {
    pub fn new(page_items_max: usize) -> Self {
        Self { tables: Mutex::new(Tables::default()), page_items_max }
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        // Every write leaves the maps consistent between statements: a panic elsewhere cannot leave
        // half a row.
        self.tables.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn journal_page(journal: &BTreeMap<(String, u64), Value>, owner: &str, after_seq: u64, limit: usize) -> Page {
    let selected: Vec<(u64, Value)> = journal
        .range((Excluded((owner.to_string(), after_seq)), Unbounded))
        .take_while(|((id, _), _)| id == owner)
        .take(limit.saturating_add(1))
        .map(|((_, seq), entry)| (*seq, entry.clone()))
        .collect();
    page_of(selected, limit, u64::to_string)
}

fn live<T: Clone>(slot: Option<&Slot<T>>) -> Option<(u64, T)> {
    slot.and_then(|slot| slot.value.clone().map(|value| (slot.version, value)))
}

impl ReadModel for MemoryReadModel {
    fn write(&self, writes: Vec<Write>) -> Result<(), ReadModelError> {
        validate(&writes)?;
        let mut tables = self.tables();
        let mut progress = Vec::new();
        for write in writes {
            match write {
                Write::Order { order_id, merchant_id, version, view } => {
                    put_slot(&mut tables.orders, order_id, version, Some((merchant_id, view)));
                }
                Write::SubOrder { order_id, seq, version, view } => {
                    put_slot(&mut tables.sub_orders, (order_id, seq), version, Some(view));
                }
                Write::User { user_id, version, view } => put_slot(&mut tables.users, user_id, version, Some(view)),
                Write::Merchant { merchant_id, version, view } => {
                    put_slot(&mut tables.merchants, merchant_id, version, Some(view));
                }
                Write::UserJournal { user_id, entries } => {
                    for (seq, entry) in entries {
                        tables.user_journal.entry((user_id.clone(), seq)).or_insert(entry);
                    }
                }
                Write::MerchantJournal { merchant_id, entries } => {
                    for (seq, entry) in entries {
                        tables.merchant_journal.entry((merchant_id.clone(), seq)).or_insert(entry);
                    }
                }
                Write::BillLine { key, version, view } => {
                    let BillLineKey { user_id, card_id, time_ms, txn_id } = key;
                    put_slot(&mut tables.bill_lines, (user_id, card_id, time_ms, txn_id), version, view);
                }
                Write::Review { order_id, seq, version, view } => {
                    put_slot(&mut tables.review, (order_id, seq), version, view);
                }
                Write::CardOwner { card_id, user_id, version } => {
                    put_slot(&mut tables.card_owners, card_id, version, Some(user_id));
                }
                Write::Progress { consumer, next_offset } => progress.push((consumer, next_offset)),
            }
        }
        for (consumer, next_offset) in progress {
            let stored = tables.progress.entry(consumer).or_insert(next_offset);
            *stored = (*stored).max(next_offset);
        }
        Ok(())
    }

    fn order(&self, order_id: &str) -> Result<Option<OrderRow>, ReadModelError> {
        let tables = self.tables();
        Ok(live(tables.orders.get(order_id)).map(|(version, (merchant_id, view))| OrderRow {
            merchant_id,
            version,
            view,
        }))
    }

    fn sub_orders(&self, order_id: &str) -> Result<Vec<(u32, Row)>, ReadModelError> {
        let tables = self.tables();
        Ok(tables
            .sub_orders
            .range((order_id.to_string(), 0)..=(order_id.to_string(), u32::MAX))
            .filter_map(|((_, seq), slot)| live(Some(slot)).map(|(version, view)| (*seq, Row { version, view })))
            .collect())
    }

    fn user(&self, user_id: &str) -> Result<Option<Row>, ReadModelError> {
        Ok(live(self.tables().users.get(user_id)).map(|(version, view)| Row { version, view }))
    }

    fn user_journal(&self, user_id: &str, after_seq: u64, limit: usize) -> Result<Page, ReadModelError> {
        Ok(journal_page(&self.tables().user_journal, user_id, after_seq, limit.min(self.page_items_max)))
    }

    fn merchant(&self, merchant_id: &str) -> Result<Option<Row>, ReadModelError> {
        Ok(live(self.tables().merchants.get(merchant_id)).map(|(version, view)| Row { version, view }))
    }

    fn merchant_journal(&self, merchant_id: &str, after_seq: u64, limit: usize) -> Result<Page, ReadModelError> {
        Ok(journal_page(&self.tables().merchant_journal, merchant_id, after_seq, limit.min(self.page_items_max)))
    }

    fn bill_table(&self, user_id: &str, cursor: Option<&str>, limit: usize) -> Result<Page, ReadModelError> {
        let limit = limit.min(self.page_items_max);
        let start = match cursor {
            Some(cursor) => {
                let (card_id, time_ms, txn_id) = parse_bill_cursor(cursor)?;
                Excluded((user_id.to_string(), card_id, time_ms, txn_id))
            }
            // The smallest key of this user: every (card, time, txn) is above ("", MIN, "").
            None => std::ops::Bound::Included((user_id.to_string(), String::new(), i64::MIN, String::new())),
        };
        let tables = self.tables();
        let selected: Vec<((String, i64, String), Value)> = tables
            .bill_lines
            .range((start, Unbounded))
            .take_while(|((id, _, _, _), _)| id == user_id)
            .filter_map(|((_, card_id, time_ms, txn_id), slot)| {
                slot.value.clone().map(|view| ((card_id.clone(), *time_ms, txn_id.clone()), view))
            })
            .take(limit.saturating_add(1))
            .collect();
        Ok(page_of(selected, limit, |(card_id, time_ms, txn_id)| bill_cursor(card_id, *time_ms, txn_id)))
    }

    fn review_queue(&self, cursor: Option<&str>, limit: usize) -> Result<Page, ReadModelError> {
        let limit = limit.min(self.page_items_max);
        let start = match cursor {
            Some(cursor) => Excluded(parse_review_cursor(cursor)?),
            None => Unbounded,
        };
        let tables = self.tables();
        let selected: Vec<((String, u32), Value)> = tables
            .review
            .range((start, Unbounded))
            .filter_map(|(key, slot)| slot.value.clone().map(|view| (key.clone(), view)))
            .take(limit.saturating_add(1))
            .collect();
        Ok(page_of(selected, limit, |(order_id, seq)| review_cursor(order_id, *seq)))
    }

    fn card_owner(&self, card_id: &str) -> Result<Option<String>, ReadModelError> {
        Ok(live(self.tables().card_owners.get(card_id)).map(|(_, user_id)| user_id))
    }

    fn progress(&self, consumer: &str) -> Result<Option<u64>, ReadModelError> {
        Ok(self.tables().progress.get(consumer).copied())
    }
}
