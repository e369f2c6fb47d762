//! Every way a request fails, and the JSON it is answered with:
//! `{"error": "<snake_case code>", "field": "<field path>"?, "message": "<for a person>"}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use connectors::runtime::RuntimeError;
use serde_json::{json, Map, Value};
use std::fmt;

/// The kinds of id a request may name that must exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entity {
    Order,
    User,
    Merchant,
    Card,
}

impl Entity {
    fn code(self) -> &'static str {
        match self {
            Entity::Order => "unknown_order",
            Entity::User => "unknown_user",
            Entity::Merchant => "unknown_merchant",
            Entity::Card => "unknown_card",
        }
    }
}

impl fmt::Display for Entity {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Entity::Order => "order",
            Entity::User => "user",
            Entity::Merchant => "merchant",
            Entity::Card => "card",
        };
        formatter.write_str(name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the body is not JSON of the expected shape: {0}")]
    MalformedJson(String),
    #[error("{message}")]
    InvalidField { field: Option<String>, message: String },
    #[error("{message}")]
    InvalidAmount { field: String, message: String },
    #[error("{message}")]
    InvalidPayee { message: String },
    /// The pipeline refused the input itself (nothing was appended).
    #[error("the pipeline refused the input: {0}")]
    InvalidInput(String),
    #[error("`{type_name}` events are not accepted here: {reason}")]
    TypeNotAccepted { type_name: String, reason: &'static str },
    #[error("no {entity} `{id}`")]
    Unknown { entity: Entity, field: String, id: String },
    /// The request contradicts current state (a card of someone else).
    #[error("{message}")]
    Conflict { code: &'static str, field: String, message: String },
    /// An id the event would create exists already (not answered to a retry of an appended event id,
    /// which is a duplicate).
    #[error("{message}")]
    AlreadyExists { code: &'static str, field: String, message: String },
    #[error("a valid `Authorization: Bearer <token>` header is required")]
    Unauthenticated,
    #[error("{0}")]
    Forbidden(String),
    #[error("the body exceeds {0} bytes")]
    BodyTooLarge(usize),
    #[error("{count} events exceed the limit of {max} per request")]
    TooManyEvents { count: usize, max: usize },
    #[error("no such endpoint")]
    RouteNotFound,
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    #[error("the pipeline is not ready yet")]
    NotReady,
    #[error("the pipeline is busy; retry: {0}")]
    Unavailable(String),
    #[error("the pipeline is shutting down")]
    ShuttingDown,
    /// Details are logged, not sent: they may describe the server's internals.
    #[error("internal error")]
    Internal(String),
    /// A failure of one event of a bulk request; `field` is prefixed with `[index]`.
    #[error("event [{index}]: {source}")]
    InEvent { index: usize, source: Box<ApiError> },
}

impl ApiError {
    pub fn invalid_field(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::InvalidField { field: Some(field.into()), message: message.into() }
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::Forbidden(message.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MalformedJson(_)
            | ApiError::InvalidField { .. }
            | ApiError::InvalidAmount { .. }
            | ApiError::InvalidPayee { .. }
            | ApiError::InvalidInput(_)
            | ApiError::TypeNotAccepted { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unknown { .. } | ApiError::RouteNotFound => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } | ApiError::AlreadyExists { .. } => StatusCode::CONFLICT,
            ApiError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::BodyTooLarge(_) | ApiError::TooManyEvents { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::NotReady | ApiError::Unavailable(_) | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::InEvent { source, .. } => source.status(),
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::MalformedJson(_) => "malformed_json",
            ApiError::InvalidField { .. } => "invalid_field",
            ApiError::InvalidAmount { .. } => "invalid_amount",
            ApiError::InvalidPayee { .. } => "invalid_payee",
            ApiError::InvalidInput(_) => "invalid_input",
            ApiError::TypeNotAccepted { .. } => "type_not_accepted",
            ApiError::Unknown { entity, .. } => entity.code(),
            ApiError::Conflict { code, .. } | ApiError::AlreadyExists { code, .. } => code,
            ApiError::Unauthenticated => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::BodyTooLarge(_) => "body_too_large",
            ApiError::TooManyEvents { .. } => "too_many_events",
            ApiError::RouteNotFound => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::NotReady => "not_ready",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::Internal(_) => "internal",
            ApiError::InEvent { source, .. } => source.code(),
        }
    }

    /// The path of the field the error is about, if one is.
    pub fn field(&self) -> Option<String> {
        match self {
            ApiError::InvalidField { field, .. } => field.clone(),
            ApiError::InvalidAmount { field, .. }
            | ApiError::Unknown { field, .. }
            | ApiError::Conflict { field, .. }
            | ApiError::AlreadyExists { field, .. } => Some(field.clone()),
            ApiError::InvalidPayee { .. } => Some("payee".to_string()),
            ApiError::TypeNotAccepted { .. } => Some("type".to_string()),
            ApiError::InEvent { index, source } => match source.field() {
                Some(field) => Some(format!("[{index}].{field}")),
                None => Some(format!("[{index}]")),
            },
            _ => None,
        }
    }

    /// Wraps the error of the `index`th event of a bulk request.
    pub fn in_event(self, index: usize) -> ApiError {
        ApiError::InEvent { index, source: Box::new(self) }
    }

    fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("error".to_string(), json!(self.code()));
        if let Some(field) = self.field() {
            body.insert("field".to_string(), json!(field));
        }
        body.insert("message".to_string(), json!(self.to_string()));
        Value::Object(body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = ?self, "request failed");
        } else {
            tracing::debug!(code = self.code(), field = ?self.field(), "request refused");
        }
        let mut response = (status, Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<RuntimeError> for ApiError {
    fn from(error: RuntimeError) -> ApiError {
        match error {
            RuntimeError::Retryable(message) => ApiError::Unavailable(message),
            RuntimeError::ShuttingDown => ApiError::ShuttingDown,
            RuntimeError::Fatal(message) => ApiError::Internal(message),
            RuntimeError::Invalid(message) => ApiError::InvalidInput(message),
        }
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(error: tokio::task::JoinError) -> ApiError {
        ApiError::Internal(format!("pipeline call failed: {error}"))
    }
}
