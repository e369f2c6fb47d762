//! The statement-provider connector (SPEC §10): the pipeline's `crawl_requested` outputs become HTTP
//! calls to the provider, and its answers become `crawl_result` inputs.
//!
//! - `config`: [`StatementConfig`], the deployment's settings (base URL, timeouts, bounds).
//! - `client`: the HTTP/1.1 calls themselves (hyper connections, deadlines, bounded bodies).
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
//! A page's answer also keeps its lines' JSON text as the provider sent it ([`Crawled::lines_json`]),
//! which the embedded runtime writes into the `crawl_result` record unchanged.
//!
//! [`CrawlError`]: pipelines::input::CrawlError

mod client;
mod config;
mod source;

pub use config::StatementConfig;

/// Request header naming the event time a provider answer stands for (RFC 3339), sent only on the
/// event clock: `paisa wallet-sim` then answers as of that time at the latest, as replay's provider
/// does (SPEC §9), however far ahead of the pipeline its wallet events were posted. Not part of SPEC
/// §10: a real provider ignores a header it does not know and answers as of its own clock.
pub const AS_OF_HEADER: &str = "paisa-as-of";
pub use source::{ConnectorError, Crawled, StatementConnector, RESPONSE_BYTES_MAX};

#[cfg(test)]
mod tests;
