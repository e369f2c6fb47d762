//! Who is calling: the admin (bearer token = `PAISA_ADMIN_KEY`) or a merchant (a token issued by
//! `POST /v1/admin/merchants/{merchant_id}/keys`, of which only the SHA-256 is stored). A merchant key
//! reads and writes only its own merchant's orders and balance.

use super::error::{ApiError, Entity};
use super::ApiState;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Merchant(String),
}

impl Caller {
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Merchant(_) => Err(ApiError::forbidden("this endpoint needs the admin key")),
        }
    }

    /// The admin, or the merchant itself.
    pub fn require_merchant(&self, merchant_id: &str) -> Result<(), ApiError> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Merchant(own) if own == merchant_id => Ok(()),
            Caller::Merchant(_) => Err(ApiError::forbidden("this merchant key belongs to another merchant")),
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }

    /// The merchant a merchant key belongs to; None for the admin.
    pub fn merchant(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Merchant(merchant_id) => Some(merchant_id),
        }
    }
}

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Caller, ApiError> {
        authenticate(state, &parts.headers)
    }
}

fn authenticate(state: &ApiState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let token = bearer_token(headers, state.limits.token_bytes_max).ok_or(ApiError::Unauthenticated)?;
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    if state.admin_key_sha256.is_some_and(|admin| constant_time_eq(&digest, &admin)) {
        return Ok(Caller::Admin);
    }
    state.pipeline.merchant_of_key(&hex(&digest)).map(Caller::Merchant).ok_or(ApiError::Unauthenticated)
}

fn bearer_token(headers: &HeaderMap, token_bytes_max: usize) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    let plausible = scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= token_bytes_max;
    plausible.then_some(token)
}

/// Compares digests without an early exit, so response timing says nothing about the admin key.
fn constant_time_eq(left: &[u8; 32], right: &[u8; 32]) -> bool {
    left.iter().zip(right).fold(0u8, |difference, (a, b)| difference | (a ^ b)) == 0
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

pub fn sha256_hex(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// `POST /v1/admin/merchants/{merchant_id}/keys` → 201 `{"merchant_id","token"}`. The token is shown
/// once; only its SHA-256 is stored, so a leaked store does not leak usable keys.
pub async fn issue_merchant_key(
    State(state): State<ApiState>,
    caller: Caller,
    Path(merchant_id): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require_admin()?;
    if !state.pipeline.merchant_exists(&merchant_id) {
        return Err(ApiError::Unknown { entity: Entity::Merchant, field: "merchant_id".to_string(), id: merchant_id });
    }
    // rand's thread generator is a CSPRNG reseeded from the OS: 256 bits cannot be guessed.
    let token = hex(&rand::random::<[u8; 32]>());
    let key_sha256 = sha256_hex(&token);
    let pipeline = state.pipeline.clone();
    let owner = merchant_id.clone();
    // The key store is durable storage: keep its I/O off the async workers.
    tokio::task::spawn_blocking(move || pipeline.put_merchant_key(&key_sha256, &owner)).await??;
    tracing::info!(merchant_id = %merchant_id, "merchant key issued");
    Ok((StatusCode::CREATED, Json(json!({"merchant_id": merchant_id, "token": token}))))
}
