//! Several instances sharing the stage partitions (`KafkaConfig::group_member`): each joins the consumer
//! group `{namespace}.stages`, subscribed to the three stage topics, and processes the partitions the
//! group assigns it. The member consumer reads nothing itself (its partitions are paused; the runtime's
//! readers read the logs): it holds the assignment, heartbeats, and hands each rebalance to the
//! runtime's [`AssignmentListener`] while it is polled.
//!
//! The eager protocol (`range` assignor) is used on purpose: every rebalance revokes every partition of
//! every member before any is assigned again, so a partition is never processed by two members that
//! both follow the protocol, and a revocation returns only after the batches applied to its partitions
//! are committed. A member that stops following it (a process frozen past its session) is a zombie:
//! its transactions carry the group generation it last knew (`send_offsets_to_transaction` with this
//! consumer's group metadata, KIP-447), which a broker refuses; and whatever it still commits carries
//! the record ids the new owner derives too, so consumers drop it as a duplicate.

use super::config::KafkaConfig;
use crate::runtime::{AssignmentListener, GroupMember, RuntimeError};
use pipelines::partition::StageKind;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::ClientContext;
use std::sync::Arc;
use std::time::Duration;

/// Polls a leaving member makes at most while its partitions are revoked and the group left.
const LEAVE_POLLS_MAX: usize = 600;

/// The member consumer's callbacks: rebalances go to the runtime.
pub struct MemberContext {
    listener: Arc<dyn AssignmentListener>,
    namespace: String,
}

impl MemberContext {
    /// The runtime's logs of a list of stage topic partitions (`{namespace}.agent` 3 → `agent-3`).
    fn logs(&self, list: &TopicPartitionList) -> Vec<String> {
        let mut logs: Vec<String> = list
            .elements()
            .iter()
            .filter_map(|element| {
                let name = element.topic().strip_prefix(&self.namespace)?.strip_prefix('.')?;
                let kind = StageKind::ALL.into_iter().find(|kind| kind.name() == name)?;
                let partition = u32::try_from(element.partition()).ok()?;
                Some(crate::runtime::stage_log(kind, partition))
            })
            .collect();
        logs.sort();
        logs
    }
}

impl ClientContext for MemberContext {}

impl ConsumerContext for MemberContext {
    /// Revocations are handled before librdkafka gives the partitions up: the listener returns once
    /// what was applied to them is committed, so the next owner restores all of it.
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let logs = self.logs(list);
            tracing::info!(?logs, "stage partitions revoked");
            self.listener.revoked(&logs);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                // The member holds the assignment; it does not fetch the records (the runtime does).
                if let Err(error) = consumer.pause(list) {
                    tracing::warn!(%error, "pausing the member's partitions");
                }
                let logs = self.logs(list);
                tracing::info!(?logs, "stage partitions assigned");
                self.listener.assigned(&logs);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance failed"),
        }
    }
}

/// The consumer of a member, subscribed to the stage topics.
pub type MemberConsumer = BaseConsumer<MemberContext>;

/// Creates the member consumer and subscribes it (the group assigns partitions at a later poll).
pub(super) fn subscribe(
    config: &KafkaConfig,
    listener: Arc<dyn AssignmentListener>,
) -> Result<Arc<MemberConsumer>, RuntimeError> {
    let fatal = |what: &str, error: rdkafka::error::KafkaError| RuntimeError::Fatal(format!("{what}: {error}"));
    let session_timeout_ms = config.session_timeout_ms.max(3);
    let context = MemberContext { listener, namespace: config.namespace.clone() };
    let consumer: MemberConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", config.group_id())
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("partition.assignment.strategy", "range")
        .set("session.timeout.ms", session_timeout_ms.to_string())
        .set("heartbeat.interval.ms", (session_timeout_ms / 3).to_string())
        .create_with_context(context)
        .map_err(|error| fatal("creating the group member", error))?;
    let topics: Vec<String> =
        StageKind::ALL.iter().map(|kind| format!("{}.{}", config.namespace, kind.name())).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).map_err(|error| fatal("subscribing to the stage topics", error))?;
    Ok(Arc::new(consumer))
}

/// This instance's membership (see the module documentation).
pub struct KafkaMember {
    pub(super) consumer: Arc<MemberConsumer>,
}

impl GroupMember for KafkaMember {
    fn poll(&mut self, timeout: Duration) -> Result<(), RuntimeError> {
        match self.consumer.poll(timeout) {
            // A record fetched before its partition was paused: the runtime reads it from the log.
            None | Some(Ok(_)) => Ok(()),
            // Errors a consumer reports while it retries on its own (a broker gone, a coordinator
            // moving); a lost membership comes back as a revocation and a new assignment.
            Some(Err(error)) => {
                tracing::warn!(%error, "group member");
                Ok(())
            }
        }
    }

    fn leave(self: Box<Self>) {
        if let Err(error) = self.consumer.close_queue() {
            tracing::warn!(%error, "leaving the group");
            return;
        }
        for _ in 0..LEAVE_POLLS_MAX {
            if self.consumer.closed() {
                return;
            }
            let _ = self.consumer.poll(Duration::from_millis(100));
        }
        tracing::warn!("the group member did not close in time");
    }
}
