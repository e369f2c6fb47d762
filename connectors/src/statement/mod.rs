//! The statement-provider connector (SPEC §10): the pipeline's `crawl_requested` outputs become HTTP
//! calls to the provider, and its answers become `crawl_result` inputs.
//!
//! - `config`: [`StatementConfig`], the deployment's settings (base URL, timeouts, bounds).
//! - `source`: [`StatementConnector`], one call per request, failures mapped to [`CrawlError`]s:
//!
//! | answer | list (`order_check`, `reservoir`) | detail |
//! |---|---|---|
//! | 200 + valid body | `ok`, lines, `next_from` | `ok`, one line |
//! | 401 | `session_expired` | `session_expired` |
//! | 429 | `upstream_busy` | `upstream_busy` |
//! | 404 | `upstream_busy` | `detail_unavailable` |
//! | 5xx, timeout, unreachable, malformed 200 | `upstream_busy` | `detail_unavailable` |
//!
//! [`CrawlError`]: pipelines::input::CrawlError

mod config;
mod source;

pub use config::StatementConfig;
pub use source::{ConnectorError, StatementConnector, RESPONSE_BYTES_MAX};

#[cfg(test)]
mod tests;
