//! `paisa admin init` for Kafka: creates the topics the store needs, idempotently. A topic that exists
//! with the expected partition count is left alone; one with another count is an error (the stage
//! partition count is fixed for the life of the topics: keys would move between partitions).

use super::{KafkaConfig, KafkaStore};
use crate::runtime::RuntimeError;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;

/// What `init` found or did for one topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicStatus {
    Created { topic: String, partitions: u32 },
    Existed { topic: String, partitions: u32 },
}

/// Creates every topic of [`KafkaStore::topics`] with `replication_factor` replicas; the state topic is
/// compacted (its latest value per key is what a restart reads).
pub async fn init_topics(config: &KafkaConfig, replication_factor: i32) -> Result<Vec<TopicStatus>, RuntimeError> {
    let fatal = |what: &str, error: rdkafka::error::KafkaError| RuntimeError::Fatal(format!("{what}: {error}"));
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .create()
        .map_err(|error| fatal("creating the admin client", error))?;
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let metadata =
        admin.inner().fetch_metadata(None, timeout).map_err(|error| fatal("reading the cluster's topics", error))?;
    let mut statuses = Vec::new();
    let mut missing = Vec::new();
    for (name, partitions, compacted) in KafkaStore::topics(config) {
        let existing = metadata.topics().iter().find(|topic| topic.name() == name && topic.error().is_none());
        match existing.map(|topic| topic.partitions().len()) {
            Some(count) if count == partitions as usize => {
                statuses.push(TopicStatus::Existed { topic: name, partitions })
            }
            Some(count) => {
                return Err(RuntimeError::Fatal(format!(
                    "topic {name} exists with {count} partitions, not {partitions}: the partition count is fixed"
                )))
            }
            None => missing.push((name, partitions, compacted)),
        }
    }
    if missing.is_empty() {
        return Ok(statuses);
    }
    let new_topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|(name, partitions, compacted)| {
            let topic = NewTopic::new(name, *partitions as i32, TopicReplication::Fixed(replication_factor));
            if *compacted {
                topic.set("cleanup.policy", "compact")
            } else {
                topic
            }
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(timeout)).request_timeout(Some(timeout));
    let results = admin.create_topics(&new_topics, &options).await.map_err(|error| fatal("creating topics", error))?;
    for ((name, partitions, _), result) in missing.iter().zip(results) {
        match result {
            // Created by a concurrent `init` in between: its count is checked by the next run.
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                statuses.push(TopicStatus::Created { topic: name.clone(), partitions: *partitions })
            }
            Err((_, code)) => return Err(RuntimeError::Fatal(format!("creating topic {name}: {code}"))),
        }
    }
    Ok(statuses)
}
