//! Configuration of the statement-provider connector (SPEC §10). Every field but `base_url` has a
//! default; unknown keys are refused so a misspelt setting fails at start-up instead of being ignored.

use serde::{Deserialize, Serialize};

/// How the connector reaches the statement provider and how hard it may press on it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StatementConfig {
    /// The provider's base URL (`http://host:port` or with a path prefix); one provider API serves
    /// every card of this deployment, whatever wallet the card belongs to.
    pub base_url: String,
    /// Deadline of one HTTP call, connection and body included. A list call past it is
    /// `upstream_busy`, a detail call `detail_unavailable` (SPEC §10).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Deadline of establishing the TCP connection (within `request_timeout_ms`).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Calls in flight at once per wallet provider (phonepe, mobikwik, …); further calls wait for a
    /// slot, so one slow wallet cannot starve the others.
    #[serde(default = "default_concurrent_requests_per_provider_max")]
    pub concurrent_requests_per_provider_max: u32,
    /// Upper bound of a list call's `limit`: a larger requested limit is lowered to it, and a page
    /// with more lines than the limit asked for is refused as malformed.
    #[serde(default = "default_page_limit_max")]
    pub page_limit_max: u32,
}

fn default_request_timeout_ms() -> u64 {
    5_000
}

fn default_connect_timeout_ms() -> u64 {
    1_000
}

fn default_concurrent_requests_per_provider_max() -> u32 {
    8
}

fn default_page_limit_max() -> u32 {
    200
}

/// Bounds on the configuration itself, so a typo cannot configure an unbounded connector.
pub(crate) const TIMEOUT_MS_MAX: u64 = 600_000;
pub(crate) const CONCURRENT_REQUESTS_PER_PROVIDER_LIMIT: u32 = 1_024;
pub(crate) const PAGE_LIMIT_LIMIT: u32 = 10_000;

impl StatementConfig {
    /// The defaults, talking to `base_url`.
    pub fn new(base_url: impl Into<String>) -> StatementConfig {
        StatementConfig {
            base_url: base_url.into(),
            request_timeout_ms: default_request_timeout_ms(),
            connect_timeout_ms: default_connect_timeout_ms(),
            concurrent_requests_per_provider_max: default_concurrent_requests_per_provider_max(),
            page_limit_max: default_page_limit_max(),
        }
    }

    /// The first field outside its bounds, with why.
    pub(crate) fn invalid_field(&self) -> Option<(&'static str, String)> {
        let timeout_ok = |value: u64| (1..=TIMEOUT_MS_MAX).contains(&value);
        if !timeout_ok(self.request_timeout_ms) {
            return Some(("request_timeout_ms", format!("must be 1..={TIMEOUT_MS_MAX}")));
        }
        if !timeout_ok(self.connect_timeout_ms) {
            return Some(("connect_timeout_ms", format!("must be 1..={TIMEOUT_MS_MAX}")));
        }
        if !(1..=CONCURRENT_REQUESTS_PER_PROVIDER_LIMIT).contains(&self.concurrent_requests_per_provider_max) {
            let reason = format!("must be 1..={CONCURRENT_REQUESTS_PER_PROVIDER_LIMIT}");
            return Some(("concurrent_requests_per_provider_max", reason));
        }
        if !(1..=PAGE_LIMIT_LIMIT).contains(&self.page_limit_max) {
            return Some(("page_limit_max", format!("must be 1..={PAGE_LIMIT_LIMIT}")));
        }
        None
    }
}
