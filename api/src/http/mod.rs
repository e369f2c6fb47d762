//! The HTTP API of `paisa serve`: SPEC §5 inputs in, SPEC §9 state out, over a running pipeline
//! ([`PipelineHandle`]). Every write becomes §5 inputs appended with [`PipelineHandle::append`]. The API
//! first checks what it can see (structure, amounts, ids that must or must not exist) so that bad input
//! is answered 4xx and never reaches the log; the stages stay the authority and still answer anything
//! the API cannot see with `command_rejected` (R-IN-1).

mod auth;
mod error;
mod events;
mod metrics;
mod reads;
#[cfg(test)]
mod tests;
mod typed;
mod validate;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use connectors::runtime::PipelineHandle;
use pipelines::Timestamp;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};

pub use error::ApiError;
pub use metrics::{Metrics, UPKEEP_INTERVAL_MS};

/// Where the `at` of accepted inputs comes from (SPEC §3): the runtime's own setting, so that the API
/// and the runtime's ticks agree. `System`: the server stamps `at` and refuses a client's; `Event`: the
/// client's `at` is required and drives time.
pub use connectors::runtime::ClockMode;

/// Bounds on what one request may ask for, so that no client can make a request unboundedly costly.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body accepted (413 above).
    pub body_bytes_max: usize,
    /// Largest bulk array of `POST /v1/events` (413 above).
    pub events_per_request_max: usize,
    /// Page size when a read asks for none.
    pub page_items_default: usize,
    /// Largest page size a read may ask for (400 above).
    pub page_items_max: usize,
    /// Longest `event_id` accepted: ids are stored for deduplication, so they are bounded.
    pub event_id_bytes_max: usize,
    /// Longest bearer token looked at (longer ones cannot be valid).
    pub token_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            body_bytes_max: 1024 * 1024,
            events_per_request_max: 10_000,
            page_items_default: 100,
            page_items_max: 1000,
            event_id_bytes_max: 256,
            token_bytes_max: 512,
        }
    }
}

/// What every handler shares: the pipeline, the clock mode, the admin credential and the limits.
#[derive(Clone)]
pub struct ApiState {
    pipeline: Arc<dyn PipelineHandle>,
    clock: ClockMode,
    /// SHA-256 of the admin key, so comparisons are constant-time over a fixed length; None disables
    /// admin access (an empty key must not let an empty token in).
    admin_key_sha256: Option<[u8; 32]>,
    limits: Limits,
    /// The last `at` stamped in [`ClockMode::System`], so stamped times never go backwards even if the
    /// wall clock does.
    last_stamp_millis: Arc<AtomicI64>,
    /// Where writes go when this instance does not ingest (`--ingest-url`), see [`forward_writes`].
    forward_writes_to: Option<Forwarder>,
    /// What `GET /metrics` shows (requests by route, their durations).
    metrics: Arc<metrics::Metrics>,
}

/// The instance that ingests, as a `--no-ingest` instance forwards writes to it.
#[derive(Clone)]
struct Forwarder {
    base_url: String,
    client: reqwest::Client,
}

/// How long a forwarded write may take before it is answered 503 (the client retries; event ids make a
/// retry harmless).
const FORWARD_TIMEOUT_MS: u64 = 10_000;

impl ApiState {
    /// `admin_key` is `PAISA_ADMIN_KEY`; an empty key disables every admin endpoint.
    pub fn new(pipeline: Arc<dyn PipelineHandle>, clock: ClockMode, admin_key: &str, limits: Limits) -> ApiState {
        let admin_key_sha256 = (!admin_key.is_empty()).then(|| Sha256::digest(admin_key.as_bytes()).into());
        ApiState {
            pipeline,
            clock,
            admin_key_sha256,
            limits,
            last_stamp_millis: Arc::new(AtomicI64::new(0)),
            forward_writes_to: None,
            metrics: Arc::new(metrics::Metrics::new()),
        }
    }

    /// Forwards every write (`POST`) to the instance at `base_url` (the one that ingests) with the
    /// caller's credentials, and answers with its answer; reads stay here.
    pub fn forwarding_writes_to(mut self, base_url: &str) -> Result<ApiState, reqwest::Error> {
        let client =
            reqwest::Client::builder().timeout(std::time::Duration::from_millis(FORWARD_TIMEOUT_MS)).build()?;
        self.forward_writes_to = Some(Forwarder { base_url: base_url.trim_end_matches('/').to_string(), client });
        Ok(self)
    }

    /// Records into `metrics` (the one whose handles the pipeline records into) instead of a recorder
    /// of its own.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> ApiState {
        self.metrics = metrics;
        self
    }

    /// The wall clock as event time, never earlier than a time stamped before.
    fn stamp(&self) -> Timestamp {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let previous = self.last_stamp_millis.fetch_max(wall, Ordering::SeqCst);
        Timestamp::from_millis(previous.max(wall))
    }
}

/// The whole API. Logs each request through `tracing` (main installs the subscriber).
pub fn router(state: ApiState) -> Router {
    let body_bytes_max = state.limits.body_bytes_max;
    let v1 = Router::new()
        .route("/v1/events", post(events::post_events))
        .merge(typed::routes())
        .merge(reads::routes())
        .route("/v1/admin/merchants/{merchant_id}/keys", post(auth::issue_merchant_key))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), require_ready))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), forward_writes));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::scrape))
        .merge(v1)
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(body_bytes_max))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::record_request))
        .layer(
            // One span and one response event per request at INFO, so the default filter shows them.
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO))
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .with_state(state)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(state): State<ApiState>) -> Response {
    if state.pipeline.ready() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        ApiError::NotReady.into_response()
    }
}

/// On an instance that does not ingest (`--no-ingest --ingest-url`), a write is sent as it came (path,
/// query, `Authorization`, `Content-Type`, body) to the instance that does, and its answer returned:
/// the checks a write needs (ids in flight, card ownership) are that instance's to make.
async fn forward_writes(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let Some(forwarder) = state.forward_writes_to.clone() else {
        return next.run(request).await;
    };
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    match forward(&forwarder, request, state.limits.body_bytes_max).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn forward(forwarder: &Forwarder, request: Request, body_bytes_max: usize) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |path| path.as_str());
    let body = axum::body::to_bytes(body, body_bytes_max).await.map_err(|_| ApiError::BodyTooLarge(body_bytes_max))?;
    let mut outgoing = forwarder.client.post(format!("{}{path}", forwarder.base_url)).body(body);
    for name in [axum::http::header::AUTHORIZATION, axum::http::header::CONTENT_TYPE] {
        if let Some(value) = parts.headers.get(&name) {
            outgoing = outgoing.header(name.as_str(), value.as_bytes());
        }
    }
    let unavailable = |error: reqwest::Error| ApiError::Unavailable(format!("the instance that ingests: {error}"));
    let answer = outgoing.send().await.map_err(unavailable)?;
    let status = axum::http::StatusCode::from_u16(answer.status().as_u16())
        .map_err(|error| ApiError::Unavailable(format!("the instance that ingests: {error}")))?;
    let content_type = answer.headers().get(reqwest::header::CONTENT_TYPE).map(|value| value.as_bytes().to_vec());
    let bytes = answer.bytes().await.map_err(unavailable)?;
    let mut response = (status, bytes).into_response();
    if let Some(value) = content_type.and_then(|value| axum::http::HeaderValue::from_bytes(&value).ok()) {
        response.headers_mut().insert(axum::http::header::CONTENT_TYPE, value);
    }
    Ok(response)
}

/// Before state is restored, existence checks would answer false 404s and reads would be stale, so
/// `/v1` answers 503 until the pipeline is ready.
async fn require_ready(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if state.pipeline.ready() {
        next.run(request).await
    } else {
        ApiError::NotReady.into_response()
    }
}
