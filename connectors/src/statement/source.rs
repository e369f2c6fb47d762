//! The statement connector: turns one `crawl_requested` into one HTTP call to the statement provider
//! (SPEC §10) and its answer into a `crawl_result`. It never fails and never retries: every failure is
//! an error answer, and the agent stage decides when to ask again (R-CHK-3, R-PEND-1).

use super::client::{Answered, ProviderClient};
use super::config::StatementConfig;
use hyper::StatusCode;
use pipelines::input::{CrawlError, CrawlResult, Provider, StatementLine};
use pipelines::output::{CrawlMode, CrawlRequested, PageOrder};
use pipelines::Timestamp;
use serde::Deserialize;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Largest response body read from the provider; a bigger one is malformed (a full page of the largest
/// allowed limit is well under it).
pub const RESPONSE_BYTES_MAX: usize = 8 << 20;

/// Why a connector could not be built. Only construction can fail; `crawl` answers every request.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    #[error("invalid statement provider base URL `{url}`: {reason}")]
    BaseUrl { url: String, reason: String },
    #[error("invalid statement connector setting `{field}`: {reason}")]
    Setting { field: &'static str, reason: String },
}

/// The two kinds of provider call; they map failures differently (SPEC §10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    List,
    Detail,
}

impl Call {
    /// What a timeout, an unreachable provider or a malformed answer means for this call.
    fn failure(self) -> CrawlError {
        match self {
            Call::List => CrawlError::UpstreamBusy,
            Call::Detail => CrawlError::DetailUnavailable,
        }
    }

    /// The error a non-200 status means. 401 is always an expired session; a detail call's 429 is the
    /// provider asking us to slow down, not a statement without detail.
    fn status_error(self, status: StatusCode) -> CrawlError {
        match (self, status) {
            (_, StatusCode::UNAUTHORIZED) => CrawlError::SessionExpired,
            (Call::Detail, StatusCode::TOO_MANY_REQUESTS) => CrawlError::UpstreamBusy,
            _ => self.failure(),
        }
    }

    /// Statuses SPEC §10 names for this call; anything else is logged as a contract breach.
    fn status_expected(self, status: StatusCode) -> bool {
        match self {
            Call::List => matches!(status.as_u16(), 401 | 429 | 503),
            Call::Detail => matches!(status.as_u16(), 401 | 404 | 429) || status.is_server_error(),
        }
    }
}

/// A list answer's body (SPEC §10). Its `transactions` array is the only value in it that may hold a
/// `[` or a `]`: the keys are these two names, `next_from` is null or an RFC 3339 time, and no JSON
/// escape is written with a bracket (`\uXXXX` is hex digits). So once a body is read as a page, the
/// array's text runs from its first `[` to its last `]` ([`lines_text`]); a field added here must keep
/// that true.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PageBody {
    transactions: Vec<StatementLine>,
    #[serde(default)]
    next_from: Option<Timestamp>,
}

/// What a successful call yields: the lines, for lists where the next page starts, and for lists the
/// lines' JSON array as the provider sent it.
pub(super) struct Answer {
    pub(super) lines: Vec<StatementLine>,
    pub(super) next_from: Option<Timestamp>,
    pub(super) lines_json: Option<Vec<u8>>,
}

/// A crawl's answer, and for a page the JSON text its lines were read from.
#[derive(Clone, Debug)]
pub struct Crawled {
    pub result: CrawlResult,
    /// The page's `transactions` array exactly as the provider sent it (validated: `result.lines` was
    /// read from the body holding it), so the embedded runtime writes it into the `crawl_result` record as it is instead
    /// of encoding the lines again: decoding that record reads the same text with the same code, so it
    /// gives the same lines. None for a detail answer and for an error.
    pub lines_json: Option<Vec<u8>>,
}

/// A planned call: its kind, its request target (the URL's path and query) and the most lines its
/// answer may carry.
struct Plan {
    call: Call,
    target: String,
    lines_max: usize,
}

/// The statement-provider connector: one HTTP client (its connections shared by every card) and a
/// bound on concurrent calls per wallet provider.
pub struct StatementConnector {
    /// The provider's base URL, parsed once: each call's target is its path with the call's own path
    /// and query after it.
    base_url: reqwest::Url,
    client: ProviderClient,
    /// One semaphore per `Provider`, indexed by `provider as usize`.
    slots: [Semaphore; Provider::ALL.len()],
    page_limit_max: u32,
    /// Where each call's outcome and duration are counted.
    metrics: std::sync::Arc<crate::metrics::PipelineMetrics>,
}

impl StatementConnector {
    pub fn new(config: &StatementConfig) -> Result<StatementConnector, ConnectorError> {
        if let Some((field, reason)) = config.invalid_field() {
            return Err(ConnectorError::Setting { field, reason });
        }
        let base_url = base_url(&config.base_url)?;
        let permits = config.concurrent_requests_per_provider_max as usize;
        // A connection is busy with one call at a time, so as many stay open as calls may be in flight.
        let client = ProviderClient::new(
            &base_url,
            permits * Provider::ALL.len(),
            Duration::from_millis(config.connect_timeout_ms),
            Duration::from_millis(config.request_timeout_ms),
        )
        .map_err(|reason| ConnectorError::BaseUrl { url: config.base_url.clone(), reason: reason.to_string() })?;
        Ok(StatementConnector {
            base_url,
            client,
            slots: std::array::from_fn(|_| Semaphore::new(permits)),
            page_limit_max: config.page_limit_max,
            metrics: std::sync::Arc::default(),
        })
    }

    /// Counts every call's outcome and times it in `metrics`.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::PipelineMetrics>) -> StatementConnector {
        self.metrics = metrics;
        self
    }

    /// Asks the provider once and answers with a `crawl_result` for `request`; never fails.
    pub async fn crawl(&self, request: &CrawlRequested) -> CrawlResult {
        self.crawl_as_of(request, None).await
    }

    /// The same, asking for the answer as of `as_of` at the latest ([`super::AS_OF_HEADER`], event
    /// clock only).
    pub async fn crawl_as_of(&self, request: &CrawlRequested, as_of: Option<Timestamp>) -> CrawlResult {
        self.crawl_keeping_page_as_of(request, as_of).await.result
    }

    /// The same, with a page's lines as the provider sent them ([`Crawled::lines_json`]).
    pub async fn crawl_keeping_page_as_of(&self, request: &CrawlRequested, as_of: Option<Timestamp>) -> Crawled {
        let (answer, lines_json) = match self.answer(request, as_of).await {
            Ok(Answer { lines, next_from, lines_json }) => {
                (pipelines::wallet_sim::Answer::Page { lines, next_from }, lines_json)
            }
            Err(error) => (pipelines::wallet_sim::Answer::Error(error), None),
        };
        Crawled { result: answer.into_result(request), lines_json }
    }

    async fn answer(&self, request: &CrawlRequested, as_of: Option<Timestamp>) -> Result<Answer, CrawlError> {
        let refused = |error: CrawlError| {
            self.metrics.crawl_refused(request.provider, error);
            error
        };
        let plan = self.plan(request).map_err(refused)?;
        // Every provider has a slot (`Provider::ALL`, tested) and the semaphore is never closed, so
        // neither fails unless that invariant is broken.
        let slot = self.slots.get(request.provider as usize).ok_or_else(|| refused(plan.call.failure()))?;
        let _permit = slot.acquire().await.map_err(|_| refused(plan.call.failure()))?;
        let started = std::time::Instant::now();
        let answer = self.fetch(&plan, request, as_of).await.and_then(|body| parse_answer(&plan, request, &body));
        let outcome = answer.as_ref().map(|_| ()).map_err(|error| *error);
        self.metrics.crawl_call(request.provider, outcome, started.elapsed());
        answer
    }

    /// The call `request` needs, or the error to answer without calling. Its target is written from the
    /// base URL's path and the request's fields, percent-encoded; no URL is parsed per call.
    fn plan(&self, request: &CrawlRequested) -> Result<Plan, CrawlError> {
        let call = if request.mode == CrawlMode::Detail { Call::Detail } else { Call::List };
        let unreachable = |what: &str, id: &str| {
            tracing::warn!(request_id = %request.request_id, "{what} {id:?} cannot be a URL path segment");
            call.failure()
        };
        let txn_id = request.txn_id.as_deref().unwrap_or_default();
        if !is_path_segment(&request.card_id) {
            return Err(unreachable("card id", &request.card_id));
        }
        if call == Call::Detail && !is_path_segment(txn_id) {
            return Err(unreachable("txn id", txn_id));
        }
        // Each call's path starts with the base URL's, without its trailing `/`; room for the call's
        // own path and its query after it.
        let base_path = self.base_url.path().trim_end_matches('/');
        let mut target = String::with_capacity(base_path.len() + 2 * URL_PATH_AND_QUERY_BYTES_TYPICAL);
        target.push_str(base_path);
        target.push_str("/v1/cards/");
        push_percent_encoded(&mut target, &request.card_id);
        target.push_str("/transactions");
        if call == Call::Detail {
            target.push('/');
            push_percent_encoded(&mut target, txn_id);
        }
        let lines_max = match call {
            Call::Detail => 1,
            Call::List => {
                let limit = request.limit.map(|limit| limit.min(self.page_limit_max));
                push_list_query(&mut target, request.order, request.from, limit);
                limit.unwrap_or(self.page_limit_max) as usize
            }
        };
        Ok(Plan { call, target, lines_max })
    }

    /// The URL [`Self::plan`] calls for `request` (what the tests check), None where it refuses.
    #[cfg(test)]
    pub(super) fn planned_url(&self, request: &CrawlRequested) -> Option<reqwest::Url> {
        let plan = self.plan(request).ok()?;
        self.base_url.join(&plan.target).ok()
    }

    /// One GET; the body of a 200, or the error its status or failure means.
    async fn fetch(
        &self,
        plan: &Plan,
        request: &CrawlRequested,
        as_of: Option<Timestamp>,
    ) -> Result<Vec<u8>, CrawlError> {
        let request_id = &request.request_id;
        let target = &plan.target;
        let Answered { status, body } = self.client.get(target, as_of).await.map_err(|error| {
            tracing::warn!(%request_id, %target, "provider call failed: {error}");
            plan.call.failure()
        })?;
        if status == StatusCode::OK {
            return Ok(body);
        }
        if plan.call.status_expected(status) {
            tracing::debug!(%request_id, %target, %status, "provider refused");
        } else {
            tracing::warn!(%request_id, %target, %status, "provider answered an unexpected status");
        }
        Err(plan.call.status_error(status))
    }
}

/// Validates the base URL: `http`, a host, no query and no fragment.
fn base_url(text: &str) -> Result<reqwest::Url, ConnectorError> {
    let refuse = |reason: &str| ConnectorError::BaseUrl { url: text.to_string(), reason: reason.to_string() };
    let url = reqwest::Url::parse(text).map_err(|error| refuse(&error.to_string()))?;
    match url.scheme() {
        "http" => {}
        // The connector speaks plain HTTP/1.1; failing here beats failing every call later.
        "https" => return Err(refuse("https is not supported by this build (the connector has no TLS)")),
        _ => return Err(refuse("the scheme must be http")),
    }
    if url.host_str().is_none() {
        return Err(refuse("no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refuse("a base URL takes no query or fragment"));
    }
    Ok(url)
}

/// Appends a list call's query (SPEC §10) to `target`: `order`, `from` and `limit`, each only when
/// asked, percent-encoded, after a `?`; nothing when none is asked.
fn push_list_query(target: &mut String, order: Option<PageOrder>, from: Option<Timestamp>, limit: Option<u32>) {
    let mut separator = '?';
    let mut parameter = |target: &mut String, name: &str| {
        target.push(separator);
        separator = '&';
        target.push_str(name);
        target.push('=');
    };
    if let Some(order) = order {
        parameter(target, "order");
        target.push_str(if order == PageOrder::Asc { "asc" } else { "desc" });
    }
    if let Some(from) = from {
        parameter(target, "from");
        push_percent_encoded(target, &from.to_string());
    }
    if let Some(limit) = limit {
        parameter(target, "limit");
        target.push_str(&limit.to_string());
    }
}

/// A 200's body as the statement page or line the call expects; anything else is a failed call.
fn parse_answer(plan: &Plan, request: &CrawlRequested, body: &[u8]) -> Result<Answer, CrawlError> {
    let parsed = match plan.call {
        Call::List => parse_page(body, plan.lines_max),
        Call::Detail => parse_detail(body, request.txn_id.as_deref().unwrap_or_default()),
    };
    parsed.map_err(|reason| {
        tracing::warn!(request_id = %request.request_id, target = %plan.target, "malformed provider answer: {reason}");
        plan.call.failure()
    })
}

pub(super) fn parse_page(body: &[u8], lines_max: usize) -> Result<Answer, String> {
    let page: PageBody =
        pipelines::decode::from_json_bytes(body).map_err(|error| format!("not a statement page: {error}"))?;
    if page.transactions.len() > lines_max {
        return Err(format!("{} lines where at most {lines_max} were asked for", page.transactions.len()));
    }
    let lines_json = lines_text(body).map(<[u8]>::to_vec);
    debug_assert!(
        lines_json.as_deref().is_some_and(|text| {
            serde_json::from_slice::<Vec<StatementLine>>(text).is_ok_and(|lines| lines == page.transactions)
        }),
        "a page's lines text is its transactions array"
    );
    Ok(Answer { lines: page.transactions, next_from: page.next_from, lines_json })
}

/// The text of the `transactions` array of a body already read as a [`PageBody`]: from its first `[` to
/// its last `]` (why that is the array: [`PageBody`]). Found from both ends of the body rather than by
/// reading it a second time (as a `serde_json` raw value, ≈ a fifth of reading a page).
fn lines_text(body: &[u8]) -> Option<&[u8]> {
    let start = body.iter().position(|byte| *byte == b'[')?;
    let end = body.iter().rposition(|byte| *byte == b']')?;
    body.get(start..=end)
}

fn parse_detail(body: &[u8], txn_id: &str) -> Result<Answer, String> {
    let line: StatementLine =
        pipelines::decode::from_json_bytes(body).map_err(|error| format!("not a statement line: {error}"))?;
    if line.txn_id != txn_id {
        return Err(format!("the detail of {:?} where {txn_id:?} was asked for", line.txn_id));
    }
    Ok(Answer { lines: vec![line], next_from: None, lines_json: None })
}

/// Whether an id can be one URL path segment: URL parsers resolve `.` and `..` as dot segments (even
/// percent-encoded), and an empty segment would name another route.
fn is_path_segment(id: &str) -> bool {
    !matches!(id, "" | "." | "..")
}

/// Bytes a call's path or query takes after the base URL's path, about (a card; a time and a limit).
const URL_PATH_AND_QUERY_BYTES_TYPICAL: usize = 128;

/// [`push_percent_encoded`] into a string of its own (what the tests check).
#[cfg(test)]
pub(crate) fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    push_percent_encoded(&mut encoded, text);
    encoded
}

/// Percent-encodes `text` onto the end of `encoded`: every byte but RFC 3986's unreserved characters,
/// so ids may contain anything (`/`, `?`, `#`, `%`, spaces, non-ASCII) and reach the provider unchanged.
fn push_percent_encoded(encoded: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
}
