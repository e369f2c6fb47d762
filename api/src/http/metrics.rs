//! `GET /metrics`: the service's figures in the Prometheus text format, for an operator's scraper.
//! Admin key required, as for every admin read: request volumes by route are business figures.
//!
//! Recorded: each request's count by method, route and status (`paisa_http_requests_total`), its
//! duration by method and route (`paisa_http_request_duration_seconds`, a histogram whose buckets are
//! fine below 10 ms, where the order read's target lies), and the pipeline's lag, read when scraped:
//! in all (`paisa_pipeline_lag_records`) and by where it waits, so an operator sees which partition
//! falls behind (`paisa_pipeline_log_lag_records{log}`, `paisa_pipeline_timers_due_partitions`,
//! `paisa_read_model_unprojected_keys`), and how stale each log's results are: the pipeline's clock
//! less the event time of the first record waiting (`paisa_pipeline_log_lag_seconds{log}`, on the
//! embedded store). A duration is the time from routing to the response's head, inside the service:
//! a client also sees its own queueing and the network.
//!
//! Label sets stay bounded: a route is the router's template (`/v1/orders/{order_id}`), never the ids
//! of a request's path (an unrouted request counts under `unmatched`), and a method outside the
//! standard ones counts as `other`.
//!
//! The pipeline's figures (provider calls, store commits, rejections, dead letters:
//! `connectors::metrics`) are recorded by the pipeline itself into handles registered here
//! ([`Metrics::pipeline_metrics`]), and come out in the same scrape.

use super::auth::Caller;
use super::{ApiError, ApiState};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use connectors::runtime::LagReport;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const REQUESTS: &str = "paisa_http_requests_total";
const DURATION: &str = "paisa_http_request_duration_seconds";
const LAG: &str = "paisa_pipeline_lag_records";
const LOG_LAG: &str = "paisa_pipeline_log_lag_records";
const LOG_LAG_SECONDS: &str = "paisa_pipeline_log_lag_seconds";
const TIMERS_DUE: &str = "paisa_pipeline_timers_due_partitions";
const UNPROJECTED: &str = "paisa_read_model_unprojected_keys";

/// Upper bounds of the duration buckets, in seconds: of every `…_seconds` histogram (requests,
/// provider calls, store commits).
const DURATION_BUCKETS_S: [f64; 15] =
    [0.00025, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0];

/// Upper bounds of the buckets of batches per store commit (a group takes 64 at most).
const COMMIT_BATCHES_BUCKETS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// How often a service folds buffered samples into the buckets when nobody scrapes it (the
/// pipeline's samples arrive without requests, so the per-request upkeep alone would not bound them).
pub const UPKEEP_INTERVAL_MS: u64 = 5_000;

/// Durations recorded between two upkeeps at most. The recorder buffers each sample until an upkeep
/// (or a scrape) folds it into the buckets: without upkeeps a service nobody scrapes would buffer
/// every request it ever answered.
const SAMPLES_PER_UPKEEP_MAX: u64 = 1024;

/// The service's own recorder (not the process-wide one: each router has its figures, as tests run
/// several in one process).
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Durations recorded so far, to run an upkeep every [`SAMPLES_PER_UPKEEP_MAX`].
    samples: AtomicU64,
}

impl Metrics {
    pub fn new() -> Metrics {
        // Start-up, with constant buckets: the builder refuses only an empty list.
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_string()), &DURATION_BUCKETS_S)
            .and_then(|builder| {
                let batches = connectors::metrics::STORE_COMMIT_BATCHES.to_string();
                builder.set_buckets_for_metric(Matcher::Full(batches), &COMMIT_BATCHES_BUCKETS)
            })
            .expect("the buckets are not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::describe_counter!(REQUESTS, "HTTP requests answered, by method, route template and status.");
            metrics::describe_histogram!(DURATION, "HTTP requests, from routing to the response's head.");
            metrics::describe_gauge!(
                LAG,
                "Everything not yet processed: the sum of the log lags, timers due and unprojected keys."
            );
            metrics::describe_gauge!(LOG_LAG, "Records appended to a log and not yet applied by its consumer, by log.");
            metrics::describe_gauge!(TIMERS_DUE, "Partitions with a timer due that the ticker has yet to tick for.");
            metrics::describe_gauge!(UNPROJECTED, "Keys committed and not yet written to the read model.");
        });
        Metrics { recorder, handle, samples: AtomicU64::new(0) }
    }

    fn record_request(&self, method: &'static str, route: String, status: u16, duration: Duration) {
        metrics::with_local_recorder(&self.recorder, || {
            let status = status.to_string();
            metrics::counter!(REQUESTS, "method" => method, "route" => route.clone(), "status" => status).increment(1);
            metrics::histogram!(DURATION, "method" => method, "route" => route).record(duration.as_secs_f64());
        });
        if self.samples.fetch_add(1, Ordering::Relaxed) % SAMPLES_PER_UPKEEP_MAX == SAMPLES_PER_UPKEEP_MAX - 1 {
            self.handle.run_upkeep();
        }
    }

    /// Handles for the pipeline to record its figures into this service's scrape.
    pub fn pipeline_metrics(&self) -> connectors::metrics::PipelineMetrics {
        metrics::with_local_recorder(&self.recorder, connectors::metrics::PipelineMetrics::register)
    }

    /// Folds the samples recorded since the last upkeep into the buckets (see [`UPKEEP_INTERVAL_MS`]).
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The text a scrape gets, with the lag as of now. The logs are the same at every scrape (every
    /// stage partition's, and the connector's once attached), so no log's series goes stale.
    fn render(&self, lag: &LagReport) -> String {
        // A gauge holds an f64: exact for any figure below 2^53.
        metrics::with_local_recorder(&self.recorder, || {
            metrics::gauge!(LAG).set(lag.total() as f64);
            for (log, records) in &lag.logs {
                metrics::gauge!(LOG_LAG, "log" => log.clone()).set(*records as f64);
            }
            // Unknown is `u64::MAX` milliseconds, as unknown records are `u64::MAX` records: never 0.
            for (log, lag_ms) in &lag.lag_ms {
                metrics::gauge!(LOG_LAG_SECONDS, "log" => log.clone()).set(*lag_ms as f64 / 1_000.0);
            }
            metrics::gauge!(TIMERS_DUE).set(lag.timers_due as f64);
            metrics::gauge!(UNPROJECTED).set(lag.unprojected as f64);
        });
        self.handle.render()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// The method as a label: the standard ones by name, any other as `other` (a client may send any
/// token as a method, and each would be a new series).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Middleware around every route and the fallbacks: counts and times each request.
pub(super) async fn record_request(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_string();
    let response = next.run(request).await;
    state.metrics.record_request(method, route, response.status().as_u16(), started.elapsed());
    response
}

/// `GET /metrics`. The lag report reads the store (on Kafka, brokers): it is built off the async workers.
pub(super) async fn scrape(State(state): State<ApiState>, caller: Caller) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let pipeline = state.pipeline.clone();
    let report = tokio::task::spawn_blocking(move || pipeline.lag_report()).await?;
    let text = state.metrics.render(&report);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upkeeps fold buffered samples into the buckets: none is lost or counted twice across them.
    #[test]
    fn every_duration_is_counted_once_across_upkeeps() {
        let metrics = Metrics::new();
        let recorded = 3 * SAMPLES_PER_UPKEEP_MAX + 5;
        for index in 0..recorded {
            let route = if index % 2 == 0 { "/a" } else { "/b" };
            metrics.record_request("GET", route.to_string(), 200, Duration::from_micros(index * 37 % 7_000));
        }
        let text = metrics.render(&LagReport::default());
        let value = |start: &str| -> u64 {
            let line = text.lines().find(|line| line.starts_with(start)).unwrap_or_else(|| panic!("{start} in {text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let count_a = value(r#"paisa_http_request_duration_seconds_count{method="GET",route="/a"}"#);
        let count_b = value(r#"paisa_http_request_duration_seconds_count{method="GET",route="/b"}"#);
        assert_eq!((count_a, count_b), (recorded.div_ceil(2), recorded / 2));
        // Durations up to 6.999 ms: all below the 7.5 ms bound, and some above 5 ms.
        let a = r#"method="GET",route="/a",le="#;
        assert_eq!(value(&format!("paisa_http_request_duration_seconds_bucket{{{a}\"0.0075\"}}")), count_a);
        assert!(value(&format!("paisa_http_request_duration_seconds_bucket{{{a}\"0.005\"}}")) < count_a);
        let requests = value(r#"paisa_http_requests_total{method="GET",route="/a",status="200"}"#);
        assert_eq!(requests, count_a);
    }
}
