//! Settings of the Kafka backend (the `--profile kafka` of `paisa serve`).

use serde::Deserialize;

/// How the runtime reaches Kafka and names what it owns there. Every topic and the consumer group are
/// prefixed with `namespace`, so several deployments (or test runs) share one cluster without meeting.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `bootstrap.servers`: a comma-separated list of brokers (`host:port`).
    pub bootstrap_servers: String,
    /// Prefix of every topic (`{namespace}.agent`, …) and of the consumer group `{namespace}.stages`.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Partitions of each stage topic (order, agent, merchant): the stage partition count of SPEC §3,
    /// fixed for the life of the topics.
    pub partitions: u32,
    /// `transactional.id` of this instance's producer. A second instance started with the same id fences
    /// the first (its next commit fails fatally), so two processes never both own the stages.
    #[serde(default = "default_transactional_id")]
    pub transactional_id: String,
    /// Whether each commit is a Kafka transaction (records and offsets atomically). Off: the records are
    /// produced by an idempotent producer and flushed, then the offsets committed, so a crash in between
    /// processes records again and every consumer drops the repeated ids. For measurement and for
    /// brokers without transactions; on by default.
    #[serde(default = "default_transactions")]
    pub transactions: bool,
    /// How long one Kafka call (a transaction commit, an offset lookup) may take before it fails as
    /// retryable.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Every how many records of a stage partition's topic its state is written to the compacted
    /// changelog topic (in the transaction of the batch that crosses the multiple), so a restart replays
    /// at most this many records per partition. 0: no snapshots (restores replay whole topics).
    #[serde(default = "default_changelog_every_records")]
    pub changelog_every_records: u64,
    /// Whether this instance shares the stage partitions with others: it joins the consumer group
    /// `{namespace}.stages` and processes only the partitions the group assigns it, restoring each from
    /// the changelog and its topic when it arrives. Every instance then needs its own
    /// `transactional_id`. Off: this instance processes every partition.
    #[serde(default)]
    pub group_member: bool,
    /// `session.timeout.ms` of the group membership: an instance silent this long loses its partitions
    /// to the others (heartbeats go every third of it).
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u64,
    /// Value schema ids from a Schema Registry (set at start by `serve --schema-registry`, not read from
    /// a file); empty: the embedded schemas' static ids.
    #[serde(skip)]
    pub schema_ids: super::payload::SchemaIds,
}

fn default_namespace() -> String {
    "paisa".to_string()
}

fn default_transactional_id() -> String {
    "paisa-stages-0".to_string()
}

fn default_changelog_every_records() -> u64 {
    10_000
}

fn default_session_timeout_ms() -> u64 {
    10_000
}

fn default_transactions() -> bool {
    true
}

fn default_request_timeout_ms() -> u64 {
    10_000
}

impl KafkaConfig {
    pub fn new(bootstrap_servers: impl Into<String>, partitions: u32) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: bootstrap_servers.into(),
            namespace: default_namespace(),
            partitions,
            transactional_id: default_transactional_id(),
            transactions: default_transactions(),
            request_timeout_ms: default_request_timeout_ms(),
            changelog_every_records: default_changelog_every_records(),
            group_member: false,
            session_timeout_ms: default_session_timeout_ms(),
            schema_ids: super::payload::SchemaIds::default(),
        }
    }

    /// The topics whose values are Avro, as (topic, is the outputs topic).
    pub fn avro_topics(&self) -> Vec<(String, bool)> {
        let mut topics: Vec<(String, bool)> = pipelines::partition::StageKind::ALL
            .iter()
            .map(|kind| (format!("{}.{}", self.namespace, kind.name()), false))
            .collect();
        topics.push((format!("{}.{}", self.namespace, crate::runtime::OUTPUTS_LOG), true));
        topics
    }

    /// The consumer group whose offsets the stages and the connector commit in their transactions.
    pub fn group_id(&self) -> String {
        format!("{}.stages", self.namespace)
    }
}
