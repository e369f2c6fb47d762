//! The Kafka backend of the runtime (issue 4): the same [`crate::runtime::Store`] the embedded backend
//! implements, on topic partitions, consumer-group offsets and Kafka transactions. The processing loops,
//! the ticker, the statement connector and the API run on it unchanged.

pub mod admin;
pub mod config;
pub mod group;
pub mod payload;
pub mod store;

pub use config::KafkaConfig;
pub use store::KafkaStore;

#[cfg(test)]
mod tests;

/// librdkafka's in-process mock cluster (brokers speaking the Kafka protocol on loopback), with the
/// store's topics created: for tests, and to try the Kafka profile without a broker. Nothing in it
/// survives the process.
pub type MockCluster = rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

/// Brokers of a mock cluster.
pub const MOCK_BROKERS: i32 = 3;

/// Starts a mock cluster, creates the topics `config` needs, and points `config` at it.
pub fn start_mock_cluster(config: &mut KafkaConfig) -> Result<MockCluster, crate::runtime::RuntimeError> {
    let fatal = |error: rdkafka::error::KafkaError| crate::runtime::RuntimeError::Fatal(error.to_string());
    let cluster = MockCluster::new(MOCK_BROKERS).map_err(fatal)?;
    config.bootstrap_servers = cluster.bootstrap_servers();
    for (topic, partitions, _) in KafkaStore::topics(config) {
        cluster.create_topic(&topic, partitions as i32, MOCK_BROKERS).map_err(fatal)?;
    }
    Ok(cluster)
}
