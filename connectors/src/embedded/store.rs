//! The embedded [`Store`]: logs, offsets and small tables in one redb file. redb commits are atomic and
//! durable (`Durability::Immediate`: fsync before `commit` returns), so a batch's appends and its
//! consumer offset survive a kill -9 together or not at all.

use crate::runtime::{Appended, IngestEncoder, KeyValueTable, RuntimeError, Store, WriteBatch};
use redb::{Database, ReadableTable, TableDefinition};
use std::path::Path;

/// The records of one log by offset: a table per log (`log:{name}`), so appends compare integer keys
/// and one log's pages are not interleaved with another's.
fn log_table(log: &str) -> String {
    format!("log:{log}")
}
/// Next offset per log.
const HEADS: TableDefinition<&str, u64> = TableDefinition::new("heads");
/// Next offset to consume per consumer.
const OFFSETS: TableDefinition<&str, u64> = TableDefinition::new("offsets");
/// Ingestion position per event id (SPEC §3: an event id is applied once).
const EVENT_IDS: TableDefinition<&str, u64> = TableDefinition::new("event_ids");
const MERCHANT_KEYS: TableDefinition<&str, &str> = TableDefinition::new("merchant_keys");
/// Ids created by ingested inputs → their owner (first creation wins).
const INGESTED_KEYS: TableDefinition<&str, &str> = TableDefinition::new("ingested_keys");
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// The counter of ingestion positions, kept among the log heads.
const INGEST_HEAD: &str = "@ingest";

pub struct RedbStore {
    database: Database,
}

fn fatal(error: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Fatal(error.to_string())
}

impl RedbStore {
    /// Opens (or creates) the store in `data_dir`, creating its tables.
    pub fn open(data_dir: &Path) -> Result<RedbStore, RuntimeError> {
        std::fs::create_dir_all(data_dir).map_err(fatal)?;
        let database = Database::create(data_dir.join("paisa.redb")).map_err(fatal)?;
        let transaction = database.begin_write().map_err(fatal)?;
        {
            transaction.open_table(HEADS).map_err(fatal)?;
            transaction.open_table(OFFSETS).map_err(fatal)?;
            transaction.open_table(EVENT_IDS).map_err(fatal)?;
            transaction.open_table(MERCHANT_KEYS).map_err(fatal)?;
            transaction.open_table(META).map_err(fatal)?;
            transaction.open_table(INGESTED_KEYS).map_err(fatal)?;
        }
        transaction.commit().map_err(fatal)?;
        Ok(RedbStore { database })
    }

    /// Records appended to each (log, consumer) pair's log and not yet consumed, summed, read in one
    /// transaction: a batch that consumes from one log and appends to another moves its records
    /// between logs atomically, so the sum never misses them (separate reads could see neither).
    fn backlog_in_one_transaction(&self, pairs: &[(&str, &str)]) -> Result<u64, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let heads = transaction.open_table(HEADS).map_err(fatal)?;
        let offsets = transaction.open_table(OFFSETS).map_err(fatal)?;
        let mut backlog = 0u64;
        for (log, consumer) in pairs {
            let head = heads.get(*log).map_err(fatal)?.map_or(0, |value| value.value());
            let committed = offsets.get(*consumer).map_err(fatal)?.map_or(0, |value| value.value());
            backlog = backlog.saturating_add(head.saturating_sub(committed));
        }
        Ok(backlog)
    }

    fn read_u64(&self, table: TableDefinition<&str, u64>, key: &str) -> Result<u64, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let table = transaction.open_table(table).map_err(fatal)?;
        Ok(table.get(key).map_err(fatal)?.map_or(0, |value| value.value()))
    }
}

/// Appends within one write transaction: each log's table is opened once and its head kept in memory,
/// then written back by [`Appender::finish`].
struct Appender<'txn> {
    transaction: &'txn redb::WriteTransaction,
    tables: std::collections::BTreeMap<String, (redb::Table<'txn, u64, &'static [u8]>, u64)>,
}

impl<'txn> Appender<'txn> {
    fn new(transaction: &'txn redb::WriteTransaction) -> Appender<'txn> {
        Appender { transaction, tables: std::collections::BTreeMap::new() }
    }

    fn append(&mut self, heads: &redb::Table<&str, u64>, log: &str, bytes: &[u8]) -> Result<u64, RuntimeError> {
        if !self.tables.contains_key(log) {
            let name = log_table(log);
            let table = self.transaction.open_table(TableDefinition::<u64, &[u8]>::new(&name)).map_err(fatal)?;
            let head = heads.get(log).map_err(fatal)?.map_or(0, |value| value.value());
            self.tables.insert(log.to_string(), (table, head));
        }
        let Some((table, head)) = self.tables.get_mut(log) else {
            return Err(RuntimeError::Fatal(format!("log {log} was not opened")));
        };
        let offset = *head;
        table.insert(offset, bytes).map_err(fatal)?;
        *head += 1;
        Ok(offset)
    }

    /// Writes the new heads.
    fn finish(self, heads: &mut redb::Table<&str, u64>) -> Result<(), RuntimeError> {
        for (log, (_, head)) in &self.tables {
            heads.insert(log.as_str(), *head).map_err(fatal)?;
        }
        Ok(())
    }
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
        let mut records = Vec::with_capacity(records_max.min(4096));
        for entry in table.range(from..).map_err(fatal)?.take(records_max) {
            let (key, value) = entry.map_err(fatal)?;
            records.push((key.value(), value.value().to_vec()));
        }
        Ok(records)
    }

    fn head(&self, log: &str) -> Result<u64, RuntimeError> {
        self.read_u64(HEADS, log)
    }

    fn committed(&self, consumer: &str) -> Result<u64, RuntimeError> {
        self.read_u64(OFFSETS, consumer)
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), RuntimeError> {
        let transaction = self.database.begin_write().map_err(fatal)?;
        {
            let mut heads = transaction.open_table(HEADS).map_err(fatal)?;
            let mut appender = Appender::new(&transaction);
            for (log, bytes) in &batch.appends {
                appender.append(&heads, log, bytes)?;
            }
            appender.finish(&mut heads)?;
            let mut offsets = transaction.open_table(OFFSETS).map_err(fatal)?;
            for (consumer, next) in &batch.offsets {
                let previous = offsets.get(consumer.as_str()).map_err(fatal)?.map_or(0, |value| value.value());
                // Offsets only move forward: a stale commit would replay records twice.
                assert!(*next >= previous, "consumer {consumer} moved back from {previous} to {next}");
                offsets.insert(consumer.as_str(), *next).map_err(fatal)?;
            }
        }
        transaction.commit().map_err(fatal)
    }

    fn ingest(&self, event_ids: &[&str], encode: &mut IngestEncoder<'_>) -> Result<Vec<Appended>, RuntimeError> {
        let transaction = self.database.begin_write().map_err(fatal)?;
        let mut outcomes = Vec::with_capacity(event_ids.len());
        {
            let mut heads = transaction.open_table(HEADS).map_err(fatal)?;
            let mut appender = Appender::new(&transaction);
            let mut seen = transaction.open_table(EVENT_IDS).map_err(fatal)?;
            let mut created = transaction.open_table(INGESTED_KEYS).map_err(fatal)?;
            for (index, event_id) in event_ids.iter().enumerate() {
                if let Some(position) = seen.get(*event_id).map_err(fatal)? {
                    outcomes.push(Appended::Duplicate { position: position.value() });
                    continue;
                }
                let position = heads.get(INGEST_HEAD).map_err(fatal)?.map_or(0, |value| value.value());
                heads.insert(INGEST_HEAD, position + 1).map_err(fatal)?;
                seen.insert(*event_id, position).map_err(fatal)?;
                let ingested = encode(index, position)?;
                for (log, bytes) in ingested.records {
                    appender.append(&heads, &log, &bytes)?;
                }
                for (key, owner) in ingested.keys {
                    if created.get(key.as_str()).map_err(fatal)?.is_none() {
                        created.insert(key.as_str(), owner.as_str()).map_err(fatal)?;
                    }
                }
                for (key, owner) in ingested.exclusive_keys {
                    let existing = created.get(key.as_str()).map_err(fatal)?.map(|value| value.value().to_string());
                    match existing {
                        Some(existing) if existing != owner => {
                            // Dropping the transaction appends nothing of the request.
                            return Err(RuntimeError::Invalid(format!("`{key}` already belongs to `{existing}`")));
                        }
                        Some(_) => {}
                        None => {
                            created.insert(key.as_str(), owner.as_str()).map_err(fatal)?;
                        }
                    }
                }
                outcomes.push(Appended::New { position });
            }
            appender.finish(&mut heads)?;
        }
        // An encoding error above drops the transaction: nothing of the request is appended.
        transaction.commit().map_err(fatal)?;
        Ok(outcomes)
    }

    fn event_position(&self, event_id: &str) -> Result<Option<u64>, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let table = transaction.open_table(EVENT_IDS).map_err(fatal)?;
        Ok(table.get(event_id).map_err(fatal)?.map(|value| value.value()))
    }

    fn ingested_key(&self, key: &str) -> Result<Option<String>, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let table = transaction.open_table(INGESTED_KEYS).map_err(fatal)?;
        Ok(table.get(key).map_err(fatal)?.map(|value| value.value().to_string()))
    }

    fn get(&self, table: KeyValueTable, key: &str) -> Result<Option<String>, RuntimeError> {
        let transaction = self.database.begin_read().map_err(fatal)?;
        let table = transaction.open_table(definition(table)).map_err(fatal)?;
        Ok(table.get(key).map_err(fatal)?.map(|value| value.value().to_string()))
    }

    fn backlog(&self, pairs: &[(&str, &str)]) -> Result<u64, RuntimeError> {
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
                records: vec![("agent-0".to_string(), format!("{position}").into_bytes())],
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
}
