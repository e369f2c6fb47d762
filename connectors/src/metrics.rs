//! The pipeline's figures for an operator's scraper: calls to the statement provider by wallet provider
//! and outcome, how long they took, how long the store's commits take and how many batches each
//! carries, how long a request's inputs wait to be durable, inputs rejected by reason, and records
//! dead-lettered.
//!
//! Handles of the `metrics` facade, registered once with the recorder of whoever exports them (the
//! HTTP API's `GET /metrics`) and kept here: recording is an atomic add, from any thread, and the
//! runtime knows nothing of the exporter. Without a recorder ([`PipelineMetrics::default`]) every
//! handle is a no-op. Label sets are bounded: providers, outcomes and reasons are enums.
//!
//! Counted when they happen in this process: a counter starts at zero at each start (Prometheus'
//! `rate` expects it). Rejections and dead letters are counted when their batch is applied; a batch
//! whose commit then fails stops the service, and its records are applied again after the restart.

use metrics::{Counter, Histogram};
use pipelines::input::{CrawlError, Provider};
use pipelines::output::Reason;
use std::time::Duration;

/// Provider calls by wallet provider and outcome, counted once answered (a call abandoned mid-way, as
/// the service stops, is not).
pub const CRAWL_CALLS: &str = "paisa_crawl_calls_total";
/// A provider call's duration, by wallet provider: from the request sent to the answer read (a wait
/// for the provider's concurrency bound is not in it).
pub const CRAWL_CALL_DURATION: &str = "paisa_crawl_call_duration_seconds";
/// A store commit's duration: one transaction and its sync to disk, whatever the batches it carries.
pub const STORE_COMMIT_DURATION: &str = "paisa_store_commit_duration_seconds";
/// The batches one store commit carries (group commit: processing rounds, connector batches and
/// requests' ingestions that queued while the one before was written).
pub const STORE_COMMIT_BATCHES: &str = "paisa_store_commit_batches";
/// How long a request waits, once its inputs are ready to be written, until they are durable: on the
/// embedded store the group commit in flight, then the one that writes them (the largest part of a
/// bulk request's answer time, `docs/PERFORMANCE.md`), and for a request whose inputs were all
/// ingested before, the last ingestion queued; on Kafka the request's transaction (none without new
/// inputs).
pub const STORE_INGESTION_WAIT: &str = "paisa_store_ingestion_wait_seconds";
/// Inputs the stages refused (`command_rejected`), by reason code (SPEC §7).
pub const COMMANDS_REJECTED: &str = "paisa_commands_rejected_total";
/// Records no stage could decode, moved to the dead-letter log.
pub const DEAD_LETTERS: &str = "paisa_dead_letters_total";

/// A call's outcomes: a page (or a detail line), then each error a call can end in.
const OUTCOMES: [&str; 4] = ["page", "session_expired", "upstream_busy", "detail_unavailable"];

/// The registered handles (see the module's comment).
pub struct PipelineMetrics {
    /// By `provider as usize` (the index in [`Provider::ALL`]), then [`outcome_index`].
    crawl_calls: [[Counter; OUTCOMES.len()]; Provider::ALL.len()],
    /// By `provider as usize`.
    crawl_call_duration: [Histogram; Provider::ALL.len()],
    store_commit_duration: Histogram,
    store_commit_batches: Histogram,
    store_ingestion_wait: Histogram,
    /// By `reason as usize` (the index in [`Reason::ALL`]).
    commands_rejected: [Counter; Reason::ALL.len()],
    dead_letters: Counter,
}

impl PipelineMetrics {
    /// Registers every series with the recorder in scope (`metrics::with_local_recorder`, or the global
    /// one), each label set up front: a series appears at zero before its first event.
    pub fn register() -> PipelineMetrics {
        describe();
        PipelineMetrics {
            crawl_calls: Provider::ALL.map(|provider| {
                OUTCOMES.map(
                    |outcome| metrics::counter!(CRAWL_CALLS, "provider" => serde_name(provider), "outcome" => outcome),
                )
            }),
            crawl_call_duration: Provider::ALL
                .map(|provider| metrics::histogram!(CRAWL_CALL_DURATION, "provider" => serde_name(provider))),
            store_commit_duration: metrics::histogram!(STORE_COMMIT_DURATION),
            store_commit_batches: metrics::histogram!(STORE_COMMIT_BATCHES),
            store_ingestion_wait: metrics::histogram!(STORE_INGESTION_WAIT),
            commands_rejected: Reason::ALL
                .map(|reason| metrics::counter!(COMMANDS_REJECTED, "reason" => serde_name(reason))),
            dead_letters: metrics::counter!(DEAD_LETTERS),
        }
    }

    /// A provider call that ended with `outcome` (Ok: a page or a line) after `duration`.
    pub fn crawl_call(&self, provider: Provider, outcome: Result<(), CrawlError>, duration: Duration) {
        self.count_call(provider, outcome);
        if let Some(histogram) = self.crawl_call_duration.get(provider as usize) {
            histogram.record(duration.as_secs_f64());
        }
    }

    /// A request refused without a call (its ids cannot be a URL): counted by outcome, not timed.
    pub fn crawl_refused(&self, provider: Provider, error: CrawlError) {
        self.count_call(provider, Err(error));
    }

    fn count_call(&self, provider: Provider, outcome: Result<(), CrawlError>) {
        // Every provider is in `Provider::ALL` at its own index (tested below).
        if let Some(calls) = self.crawl_calls.get(provider as usize) {
            calls[outcome_index(outcome)].increment(1);
        }
    }

    /// A store commit of `batches` batches that took `duration`.
    pub fn store_commit(&self, batches: usize, duration: Duration) {
        debug_assert!(batches > 0, "a commit carries a batch at least");
        self.store_commit_duration.record(duration.as_secs_f64());
        // A group has at most a few dozen batches: exact as an f64.
        self.store_commit_batches.record(batches as f64);
    }

    /// A request's new inputs, once queued (for a group commit, or a Kafka transaction), were durable
    /// after `duration`.
    pub fn ingestion_waited(&self, duration: Duration) {
        self.store_ingestion_wait.record(duration.as_secs_f64());
    }

    /// What a processing round applied: its rejections and dead letters.
    pub fn applied(&self, counts: &crate::runtime::AppliedCounts) {
        for &reason in &counts.rejected {
            // Every reason is in `Reason::ALL` at its own index (tested below).
            if let Some(counter) = self.commands_rejected.get(reason as usize) {
                counter.increment(1);
            }
        }
        self.dead_letters.increment(counts.dead_letters);
    }
}

/// What each series is, for a scrape's `# HELP` lines.
fn describe() {
    metrics::describe_counter!(CRAWL_CALLS, "Calls to the statement provider, by wallet provider and outcome.");
    metrics::describe_histogram!(
        CRAWL_CALL_DURATION,
        "Statement provider calls, from the request sent to the answer read, by wallet provider."
    );
    metrics::describe_histogram!(STORE_COMMIT_DURATION, "Store commits: one transaction and its sync to disk.");
    metrics::describe_histogram!(STORE_COMMIT_BATCHES, "Batches one store commit carries (group commit).");
    metrics::describe_histogram!(
        STORE_INGESTION_WAIT,
        "A request's new inputs, from queued to durable (a group commit, or a Kafka transaction)."
    );
    metrics::describe_counter!(COMMANDS_REJECTED, "Inputs the stages refused (command_rejected), by reason code.");
    metrics::describe_counter!(DEAD_LETTERS, "Records no stage could decode, moved to the dead-letter log.");
}

/// No recorder: every handle does nothing.
impl Default for PipelineMetrics {
    fn default() -> PipelineMetrics {
        PipelineMetrics {
            crawl_calls: std::array::from_fn(|_| std::array::from_fn(|_| Counter::noop())),
            crawl_call_duration: std::array::from_fn(|_| Histogram::noop()),
            store_commit_duration: Histogram::noop(),
            store_commit_batches: Histogram::noop(),
            store_ingestion_wait: Histogram::noop(),
            commands_rejected: std::array::from_fn(|_| Counter::noop()),
            dead_letters: Counter::noop(),
        }
    }
}

impl std::fmt::Debug for PipelineMetrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("PipelineMetrics")
    }
}

fn outcome_index(outcome: Result<(), CrawlError>) -> usize {
    match outcome {
        Ok(()) => 0,
        Err(CrawlError::SessionExpired) => 1,
        Err(CrawlError::UpstreamBusy) => 2,
        Err(CrawlError::DetailUnavailable) => 3,
    }
}

/// A provider's or reason's name as the SPEC and the records write it (its serde name).
fn serde_name<T: serde::Serialize + std::fmt::Debug>(value: T) -> String {
    match serde_json::to_value(&value) {
        Ok(serde_json::Value::String(name)) => name,
        // A unit variant always serializes as its name; this is not reached.
        _ => format!("{value:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    /// The value of a series in Prometheus' text, or None.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn every_reason_and_provider_is_at_its_own_index_and_outcomes_are_the_errors_names() {
        for (index, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, index, "{reason:?}");
        }
        for (index, provider) in Provider::ALL.into_iter().enumerate() {
            assert_eq!(provider as usize, index, "{provider:?}");
        }
        assert_eq!(serde_name(Reason::InsufficientMerchantBalance), "insufficient_merchant_balance");
        assert_eq!(serde_name(Provider::Phonepe), "phonepe");
        let errors = [CrawlError::SessionExpired, CrawlError::UpstreamBusy, CrawlError::DetailUnavailable];
        for error in errors {
            assert_eq!(OUTCOMES[outcome_index(Err(error))], serde_name(error));
        }
    }

    /// Each event lands in its own series, and every series is there (at zero) from registration on.
    #[test]
    fn each_event_counts_in_its_series_and_unseen_series_show_zero() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let pipeline = metrics::with_local_recorder(&recorder, PipelineMetrics::register);
        pipeline.crawl_call(Provider::Paytm, Ok(()), Duration::from_millis(3));
        pipeline.crawl_call(Provider::Paytm, Err(CrawlError::UpstreamBusy), Duration::from_millis(5));
        pipeline.crawl_refused(Provider::Phonepe, CrawlError::DetailUnavailable);
        pipeline.store_commit(3, Duration::from_millis(2));
        pipeline.store_commit(1, Duration::from_millis(4));
        pipeline.ingestion_waited(Duration::from_millis(3));
        let counts =
            crate::runtime::AppliedCounts { rejected: vec![Reason::UserBanned, Reason::UserBanned], dead_letters: 1 };
        pipeline.applied(&counts);
        pipeline.applied(&counts);
        let text = handle.render();
        let calls = |provider: &str, outcome: &str| {
            value(&text, &format!(r#"{CRAWL_CALLS}{{provider="{provider}",outcome="{outcome}"}}"#))
        };
        assert_eq!(calls("paytm", "page"), Some(1.0), "{text}");
        assert_eq!(calls("paytm", "upstream_busy"), Some(1.0), "{text}");
        assert_eq!(calls("phonepe", "detail_unavailable"), Some(1.0), "{text}");
        assert_eq!(calls("mobikwik", "session_expired"), Some(0.0), "{text}");
        // Without buckets configured the exporter writes a summary: its count and sum are enough here.
        assert_eq!(value(&text, &format!(r#"{CRAWL_CALL_DURATION}_count{{provider="paytm"}}"#)), Some(2.0), "{text}");
        assert_eq!(value(&text, &format!("{STORE_COMMIT_BATCHES}_count")), Some(2.0), "{text}");
        assert_eq!(value(&text, &format!("{STORE_COMMIT_BATCHES}_sum")), Some(4.0), "{text}");
        assert_eq!(value(&text, &format!("{STORE_INGESTION_WAIT}_count")), Some(1.0), "{text}");
        assert_eq!(value(&text, &format!("{STORE_INGESTION_WAIT}_sum")), Some(0.003), "{text}");
        assert_eq!(value(&text, &format!(r#"{COMMANDS_REJECTED}{{reason="user_banned"}}"#)), Some(4.0), "{text}");
        assert_eq!(value(&text, &format!(r#"{COMMANDS_REJECTED}{{reason="unknown_order"}}"#)), Some(0.0), "{text}");
        assert_eq!(value(&text, DEAD_LETTERS), Some(2.0), "{text}");
        let help = format!("# HELP {DEAD_LETTERS} Records no stage could decode, moved to the dead-letter log.");
        assert!(text.lines().any(|line| line == help), "{text}");
    }
}
