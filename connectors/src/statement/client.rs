//! HTTP/1.1 calls to the statement provider on hyper's client connections, kept in a pool of the
//! connector's own. reqwest's client did the same work through layers this connector does not use
//! (redirects, retries, proxies, a URL parsed again at each of them): measured, they were ≈ 11 % of
//! the service's CPU per event in the serve benchmark, one call per crawl (`docs/DECISIONS.md`,
//! "The statement connector calls the provider on hyper").
//!
//! What the connector needs of a client, and gets here:
//! - a deadline on each call (connection, request and whole body: `request_timeout`) and on each
//!   connection (`connect_timeout`);
//! - no hidden retries: a call is sent once. The one exception is a request never written, because
//!   the pooled connection it was queued on had closed meanwhile: it goes out once on a new
//!   connection, as the provider never saw it;
//! - no redirects followed (a redirect would be a second call);
//! - a bounded body (`RESPONSE_BYTES_MAX`), read whatever the status, so the connection is reused;
//! - bounded connections: the calls in flight are bounded by the connector's semaphores, the idle
//!   connections by `idle_connections_max`.

use super::source::RESPONSE_BYTES_MAX;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_LENGTH, HOST};
use hyper::StatusCode;
use pipelines::Timestamp;
use std::sync::Mutex;
use std::time::Duration;

/// One connection's sending half; its other half runs as a task of its own until both are dropped.
type Connection = SendRequest<Empty<Bytes>>;

/// Why a call got no answer. Every one is a failed call to the connector (the call's `failure()`).
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    #[error("connecting to {address} took longer than {timeout:?}")]
    ConnectTimeout { address: String, timeout: Duration },
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: std::io::Error },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("the request cannot be built: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("body larger than {RESPONSE_BYTES_MAX} bytes")]
    BodyTooLarge,
}

/// A provider's answer: its status and its whole body.
pub(super) struct Answered {
    pub(super) status: StatusCode,
    pub(super) body: Vec<u8>,
}

/// The provider's address, the connections to it and the deadlines of each call.
pub(super) struct ProviderClient {
    /// `host:port`, as a TCP connection is opened to it (a name is resolved at each connection).
    address: String,
    /// The `Host` header of every call: the host, and the port when it is not 80.
    host: HeaderValue,
    /// Connections answered and ready for another call, the most recently used last.
    idle: Mutex<Vec<Connection>>,
    /// At most this many idle connections are kept; one more is closed.
    idle_connections_max: usize,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl ProviderClient {
    /// A client of the provider at `base_url` (its host and port; the connector writes the path of
    /// each call), or why the URL names no host to connect to.
    pub(super) fn new(
        base_url: &reqwest::Url,
        idle_connections_max: usize,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<ProviderClient, &'static str> {
        assert!(idle_connections_max > 0, "a client keeps at least one connection");
        let host = base_url.host_str().ok_or("no host")?;
        let port = base_url.port_or_known_default().ok_or("no port")?;
        // The port is named only when it is not the scheme's, as a browser writes `Host`.
        let host_header = match base_url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        Ok(ProviderClient {
            address: format!("{host}:{port}"),
            host: HeaderValue::try_from(host_header).map_err(|_| "the host cannot be a Host header")?,
            idle: Mutex::new(Vec::with_capacity(idle_connections_max)),
            idle_connections_max,
            connect_timeout,
            request_timeout,
        })
    }

    /// `GET target` (a path and query), with the as-of header when given; the whole answer within
    /// `request_timeout`.
    pub(super) async fn get(&self, target: &str, as_of: Option<Timestamp>) -> Result<Answered, CallError> {
        let call = self.get_untimed(target, as_of);
        tokio::time::timeout(self.request_timeout, call).await.map_err(|_| CallError::Timeout(self.request_timeout))?
    }

    async fn get_untimed(&self, target: &str, as_of: Option<Timestamp>) -> Result<Answered, CallError> {
        let mut request = hyper::Request::get(target).header(HOST, self.host.clone());
        if let Some(as_of) = as_of {
            request = request.header(super::AS_OF_HEADER, as_of.to_string());
        }
        let request = request.body(Empty::new())?;
        let (mut connection, reused) = match self.take_idle().await {
            Some(connection) => (connection, true),
            None => (self.connect().await?, false),
        };
        let response = match connection.try_send_request(request).await {
            Ok(response) => response,
            Err(mut unsent) => match unsent.take_message() {
                // Never written: the idle connection closed before the call could go out on it.
                Some(request) if reused => {
                    connection = self.connect().await?;
                    connection.send_request(request).await?
                }
                _ => return Err(CallError::Http(unsent.into_error())),
            },
        };
        let status = response.status();
        let body = read_body(response).await?;
        self.keep_idle(connection);
        Ok(Answered { status, body })
    }

    /// The most recently used idle connection still open, ready for a call.
    async fn take_idle(&self) -> Option<Connection> {
        // Bounded: each turn removes one of at most `idle_connections_max` idle connections.
        loop {
            let mut connection = self.idle.lock().ok()?.pop()?;
            if !connection.is_closed() && connection.ready().await.is_ok() {
                return Some(connection);
            }
        }
    }

    /// Keeps `connection` for a later call, unless `idle_connections_max` are kept already.
    fn keep_idle(&self, connection: Connection) {
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < self.idle_connections_max {
                idle.push(connection);
            }
        }
    }

    /// A new connection, its I/O driven by a task of its own.
    async fn connect(&self) -> Result<Connection, CallError> {
        let connecting = tokio::net::TcpStream::connect(self.address.as_str());
        let stream = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| CallError::ConnectTimeout { address: self.address.clone(), timeout: self.connect_timeout })?
            .map_err(|source| CallError::Connect { address: self.address.clone(), source })?;
        // A call is one small write; waiting to coalesce it with more would only delay it.
        stream.set_nodelay(true).map_err(|source| CallError::Connect { address: self.address.clone(), source })?;
        let (connection, driver) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(error) = driver.await {
                tracing::debug!("a provider connection ended: {error}");
            }
        });
        Ok(connection)
    }
}

/// A response's whole body, at most `RESPONSE_BYTES_MAX` bytes.
async fn read_body(response: hyper::Response<hyper::body::Incoming>) -> Result<Vec<u8>, CallError> {
    let announced =
        response.headers().get(CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse::<u64>().ok()).unwrap_or(0);
    if announced > RESPONSE_BYTES_MAX as u64 {
        return Err(CallError::BodyTooLarge);
    }
    // Room for the whole body when its length is announced (a page arrives in a few frames).
    let mut body = Vec::with_capacity(announced as usize);
    let mut incoming = response.into_body();
    while let Some(frame) = incoming.frame().await {
        let Ok(chunk) = frame?.into_data() else { continue };
        if body.len() + chunk.len() > RESPONSE_BYTES_MAX {
            return Err(CallError::BodyTooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
