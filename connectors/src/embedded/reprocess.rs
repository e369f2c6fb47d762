//! `paisa reprocess --from-beginning`: rebuilds a read model from the logs alone, into a fresh store
//! (a new keyspace), and compares it with the live one. Nothing is processed or committed: every stage
//! partition is restored up to its committed offset, the way a start restores it, and every key is
//! projected once. A row the live model holds at a higher version than the rebuild's has moved on since
//! (the live pipeline kept running) and is not compared; every other row must be equal.

use super::{Embedded, EmbeddedConfig};
use crate::runtime::{Page, RuntimeError, Store};
use crate::scylla::{ReadModel, ReadModelError};
use pipelines::partition::StageKind;
use serde_json::Value;
use std::sync::Arc;

/// Journal entries and bill lines compared per key at most (pages of [`crate::scylla::PAGE_ITEMS_MAX`]).
const ITEMS_PER_KEY_MAX: usize = 100_000;

/// What a comparison found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Rows (orders, agents, merchants) compared and equal, with their journals and bill tables.
    pub equal: usize,
    /// Rows the live model holds at a higher version: written after the logs were read.
    pub moved_on: usize,
    /// What differs, one line per row.
    pub differences: Vec<String>,
}

/// Restores the stage partitions from `store`'s logs and projects every key into `fresh`.
pub fn rebuild(
    config: EmbeddedConfig,
    store: Box<dyn Store>,
    fresh: Arc<dyn ReadModel>,
) -> Result<Embedded, RuntimeError> {
    // The logs are applied as the live pipeline applied them: `restore_inner` adopts the answer barrier
    // the store was created with.
    let inner = Embedded::restore_inner(config, store, Some(fresh))?;
    if let Some(projector) = &inner.projector {
        projector.drain(&inner)?;
    }
    Ok(Embedded::restored(inner))
}

/// Compares the rows of every key of `rebuilt`'s state in `fresh` (the rebuild) and `live`.
pub fn compare(rebuilt: &Embedded, fresh: &dyn ReadModel, live: &dyn ReadModel) -> Result<Comparison, ReadModelError> {
    let mut comparison = Comparison::default();
    for (kind, key) in super::reads::all_keys(&rebuilt.inner) {
        let (fresh_row, live_row) = match kind {
            StageKind::Order => (
                fresh.order_view(&key)?.map(|row| (row.version, row.view)),
                live.order_view(&key)?.map(|row| (row.version, row.view)),
            ),
            StageKind::Agent => (
                fresh.user(&key)?.map(|row| (row.version, row.view)),
                live.user(&key)?.map(|row| (row.version, row.view)),
            ),
            StageKind::Merchant => (
                fresh.merchant(&key)?.map(|row| (row.version, row.view)),
                live.merchant(&key)?.map(|row| (row.version, row.view)),
            ),
        };
        let name = format!("{} {key}", kind.name());
        match (fresh_row, live_row) {
            (None, None) => continue, // not shown (an order the merchant stage has not accepted)
            (Some(_), None) => comparison.differences.push(format!("{name}: missing from the live model")),
            (None, Some(_)) => comparison.differences.push(format!("{name}: missing from the rebuild")),
            (Some((fresh_version, _)), Some((live_version, _))) if live_version > fresh_version => {
                comparison.moved_on += 1;
            }
            (Some((_, fresh_view)), Some((_, live_view))) => {
                let mut differs = Vec::new();
                if fresh_view != live_view {
                    differs.push("view");
                }
                if kind != StageKind::Order && !same_pages(kind, &key, fresh, live)? {
                    differs.push("journal or bill table");
                }
                if differs.is_empty() {
                    comparison.equal += 1;
                } else {
                    comparison.differences.push(format!("{name}: {} differ", differs.join(", ")));
                }
            }
        }
    }
    if all_items(|cursor| fresh.review_queue(cursor, crate::scylla::PAGE_ITEMS_MAX))?
        != all_items(|cursor| live.review_queue(cursor, crate::scylla::PAGE_ITEMS_MAX))?
    {
        comparison.differences.push("review queue differs".to_string());
    }
    Ok(comparison)
}

fn same_pages(kind: StageKind, key: &str, fresh: &dyn ReadModel, live: &dyn ReadModel) -> Result<bool, ReadModelError> {
    let limit = crate::scylla::PAGE_ITEMS_MAX;
    Ok(match kind {
        StageKind::Agent => {
            journal(|after| fresh.user_journal(key, after, limit))?
                == journal(|after| live.user_journal(key, after, limit))?
                && all_items(|cursor| fresh.bill_table(key, cursor, limit))?
                    == all_items(|cursor| live.bill_table(key, cursor, limit))?
        }
        StageKind::Merchant => {
            journal(|after| fresh.merchant_journal(key, after, limit))?
                == journal(|after| live.merchant_journal(key, after, limit))?
        }
        StageKind::Order => true,
    })
}

/// Every entry of a journal, following its pages.
fn journal(mut read: impl FnMut(u64) -> Result<Page, ReadModelError>) -> Result<Vec<Value>, ReadModelError> {
    let mut entries = Vec::new();
    let mut after = 0;
    while entries.len() < ITEMS_PER_KEY_MAX {
        let page = read(after)?;
        entries.extend(page.items);
        match page.next_cursor.and_then(|cursor| cursor.parse().ok()) {
            Some(next) => after = next,
            None => break,
        }
    }
    Ok(entries)
}

/// Every item of a cursor-paged list.
fn all_items(mut read: impl FnMut(Option<&str>) -> Result<Page, ReadModelError>) -> Result<Vec<Value>, ReadModelError> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    while items.len() < ITEMS_PER_KEY_MAX {
        let page = read(cursor.as_deref())?;
        items.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(items)
}
