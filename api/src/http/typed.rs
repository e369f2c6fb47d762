//! Typed endpoints: each takes a small body (unknown fields refused), builds one SPEC §5 event from it
//! and the ids in its path, and appends it like `POST /v1/events`. Every body may also carry
//! `event_id` (generated when absent) and `at` (see [`super::ClockMode`]).

use super::auth::Caller;
use super::error::{ApiError, Entity};
use super::events::{field_of, ingest, read_bytes, Accepted, Body};
use super::validate::unknown;
use super::ApiState;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::Router;
use pipelines::input::{CancelledBy, Party, Provider};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Declares body structs with the envelope fields every typed body may carry.
macro_rules! bodies {
    ($( $(#[$meta:meta])* $name:ident { $( $field:ident : $ty:ty ),* $(,)? } )*) => {
        $(
            $(#[$meta])*
            #[derive(Debug, Deserialize, Serialize)]
            #[serde(deny_unknown_fields)]
            pub struct $name {
                $( $field: $ty, )*
                event_id: Option<String>,
                at: Option<String>,
            }
        )*
    };
}

bodies! {
    /// `merchant_registered`.
    NewMerchant { merchant_id: String, collection_fee_rate: String, payout_fee_rate: String,
        payout_fee_fixed: String, callback_url: Option<String> }
    /// `merchant_deposit`.
    Deposit { amount: String }
    /// `user_registered`.
    NewUser { user_id: String, telegram_bound: bool }
    /// `card_bound`.
    NewCard { card_id: String, provider: Provider, account_last4: Option<String>, vpa: Option<String> }
    /// `collection_created`.
    NewCollection { order_id: String, amount: String, utr: Option<String>, expires_at: Option<String> }
    /// `payout_created`.
    NewPayout { order_id: String, amount: String, payee: Party, expires_at: Option<String> }
    /// `order_cancelled`.
    Cancel { by: CancelledBy }
    /// `supplement_requested`, `payment_confirmed`.
    WithUtr { utr: Option<String> }
    /// `collection_retry`.
    Nothing {}
    /// `collection_dispatched`, `payout_grabbed`.
    Assignment { user_id: String, card_id: String }
    /// `admin_approve`.
    Approve { operator: String, amount: Option<String> }
    /// `admin_reject`, `admin_crawl_retry`, `admin_correct_cancel`, `admin_cancel_payout`, `admin_unban`.
    ByOperator { operator: String }
    /// `user_recharge`.
    Recharge { amount: String, commission: String }
    /// `user_adjustment`.
    Adjust { amount: String, reason: String }
    /// `card_reauthenticated`.
    CardRef { card_id: String }
}

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/merchants/{merchant_id}/collections", post(create_collection))
        .route("/v1/merchants/{merchant_id}/payouts", post(create_payout))
        .route("/v1/orders/{order_id}/cancel", post(cancel_order))
        .route("/v1/orders/{order_id}/supplement", post(request_supplement))
        .route("/v1/orders/{order_id}/confirm", post(confirm_payment))
        .route("/v1/admin/merchants", post(register_merchant))
        .route("/v1/admin/merchants/{merchant_id}/deposit", post(deposit))
        .route("/v1/admin/users", post(register_user))
        .route("/v1/admin/users/{user_id}/cards", post(bind_card))
        .route("/v1/admin/users/{user_id}/unban", post(unban))
        .route("/v1/admin/users/{user_id}/recharge", post(recharge))
        .route("/v1/admin/users/{user_id}/adjust", post(adjust))
        .route("/v1/admin/users/{user_id}/reauthenticated", post(reauthenticated))
        .route("/v1/admin/orders/{order_id}/dispatch", post(dispatch))
        .route("/v1/admin/orders/{order_id}/grab", post(grab))
        .route("/v1/admin/orders/{order_id}/retry", post(retry))
        .route("/v1/admin/orders/{order_id}/approve", post(approve))
        .route("/v1/admin/orders/{order_id}/reject", post(reject))
        .route("/v1/admin/orders/{order_id}/crawl-retry", post(crawl_retry))
        .route("/v1/admin/orders/{order_id}/correct-cancel", post(correct_cancel))
        .route("/v1/admin/orders/{order_id}/cancel-payout", post(cancel_payout))
}

/// Parses a typed body; an empty body counts as `{}` so that all-optional bodies may be omitted.
fn parse_body<T: DeserializeOwned>(state: &ApiState, body: Body) -> Result<T, ApiError> {
    let bytes = read_bytes(state, body)?;
    let value = if bytes.is_empty() {
        Value::Object(Map::new())
    } else {
        pipelines::decode::from_json_bytes(&bytes).map_err(|error| ApiError::MalformedJson(error.to_string()))?
    };
    let Value::Object(object) = value else {
        return Err(ApiError::MalformedJson("expected a JSON object".to_string()));
    };
    serde_json::from_value(Value::Object(object.clone())).map_err(|error| {
        let message = error.to_string();
        ApiError::InvalidField { field: field_of::<T>(&object, &message), message }
    })
}

/// Builds the §5 event from a typed body and its path ids, and ingests it.
async fn submit<T: Serialize>(
    state: &ApiState,
    caller: &Caller,
    body: &T,
    type_name: &str,
    path_ids: &[(&str, &str)],
) -> Result<Accepted, ApiError> {
    let Value::Object(mut object) =
        serde_json::to_value(body).map_err(|error| ApiError::Internal(format!("encoding a body: {error}")))?
    else {
        return Err(ApiError::Internal("a typed body did not encode as an object".to_string()));
    };
    object.insert("type".to_string(), Value::String(type_name.to_string()));
    for (field, id) in path_ids {
        object.insert(field.to_string(), Value::String(id.to_string()));
    }
    ingest(state, caller, vec![object]).await
}

/// The admin, or the merchant owning the order (404 for an unknown order, 403 for another's).
fn authorize_order(state: &ApiState, caller: &Caller, order_id: &str) -> Result<(), ApiError> {
    match state.pipeline.order_merchant(order_id) {
        Some(merchant_id) => caller.require_merchant(&merchant_id),
        None => Err(unknown(Entity::Order, "order_id", order_id)),
    }
}

async fn create_collection(
    State(state): State<ApiState>,
    caller: Caller,
    Path(merchant_id): Path<String>,
    body: Body,
) -> Result<Accepted, ApiError> {
    caller.require_merchant(&merchant_id)?;
    let body: NewCollection = parse_body(&state, body)?;
    submit(&state, &caller, &body, "collection_created", &[("merchant_id", &merchant_id)]).await
}

async fn create_payout(
    State(state): State<ApiState>,
    caller: Caller,
    Path(merchant_id): Path<String>,
    body: Body,
) -> Result<Accepted, ApiError> {
    caller.require_merchant(&merchant_id)?;
    let body: NewPayout = parse_body(&state, body)?;
    submit(&state, &caller, &body, "payout_created", &[("merchant_id", &merchant_id)]).await
}

async fn cancel_order(
    State(state): State<ApiState>,
    caller: Caller,
    Path(order_id): Path<String>,
    body: Body,
) -> Result<Accepted, ApiError> {
    authorize_order(&state, &caller, &order_id)?;
    let body: Cancel = parse_body(&state, body)?;
    // `by: user` is the agent abandoning its payout (R-CLOSE-3): a merchant cannot speak for the agent.
    if body.by == CancelledBy::User && !caller.is_admin() {
        return Err(ApiError::forbidden("only the admin may cancel on the agent's behalf (`by: user`)"));
    }
    submit(&state, &caller, &body, "order_cancelled", &[("order_id", &order_id)]).await
}

async fn request_supplement(
    State(state): State<ApiState>,
    caller: Caller,
    Path(order_id): Path<String>,
    body: Body,
) -> Result<Accepted, ApiError> {
    authorize_order(&state, &caller, &order_id)?;
    let body: WithUtr = parse_body(&state, body)?;
    submit(&state, &caller, &body, "supplement_requested", &[("order_id", &order_id)]).await
}

async fn confirm_payment(
    State(state): State<ApiState>,
    caller: Caller,
    Path(order_id): Path<String>,
    body: Body,
) -> Result<Accepted, ApiError> {
    authorize_order(&state, &caller, &order_id)?;
    let body: WithUtr = parse_body(&state, body)?;
    submit(&state, &caller, &body, "payment_confirmed", &[("order_id", &order_id)]).await
}

async fn register_merchant(State(state): State<ApiState>, caller: Caller, body: Body) -> Result<Accepted, ApiError> {
    caller.require_admin()?;
    let body: NewMerchant = parse_body(&state, body)?;
    submit(&state, &caller, &body, "merchant_registered", &[]).await
}

/// Creates a user; an existing one is a conflict here. (`POST /v1/events` still carries a
/// re-registration, which updates `telegram_bound` as SPEC §7 allows.) With a client's `event_id` the
/// request may be a retry, which must answer `duplicate: true`, so the append decides.
async fn register_user(State(state): State<ApiState>, caller: Caller, body: Body) -> Result<Accepted, ApiError> {
    caller.require_admin()?;
    let body: NewUser = parse_body(&state, body)?;
    if body.event_id.is_none() && state.pipeline.user_exists(&body.user_id) {
        let message = format!("user `{}` already exists", body.user_id);
        return Err(ApiError::AlreadyExists { code: "user_exists", field: "user_id".to_string(), message });
    }
    submit(&state, &caller, &body, "user_registered", &[]).await
}

/// Handlers of admin endpoints whose path names one id: check the caller, parse, submit.
macro_rules! admin_handlers {
    ($( $handler:ident: $body:ty => $type_name:literal, $field:literal; )*) => {
        $(
            async fn $handler(
                State(state): State<ApiState>,
                caller: Caller,
                Path(id): Path<String>,
                body: Body,
            ) -> Result<Accepted, ApiError> {
                caller.require_admin()?;
                let body: $body = parse_body(&state, body)?;
                submit(&state, &caller, &body, $type_name, &[($field, &id)]).await
            }
        )*
    };
}

admin_handlers! {
    deposit: Deposit => "merchant_deposit", "merchant_id";
    bind_card: NewCard => "card_bound", "user_id";
    unban: ByOperator => "admin_unban", "user_id";
    recharge: Recharge => "user_recharge", "user_id";
    adjust: Adjust => "user_adjustment", "user_id";
    reauthenticated: CardRef => "card_reauthenticated", "user_id";
    dispatch: Assignment => "collection_dispatched", "order_id";
    grab: Assignment => "payout_grabbed", "order_id";
    retry: Nothing => "collection_retry", "order_id";
    approve: Approve => "admin_approve", "order_id";
    reject: ByOperator => "admin_reject", "order_id";
    crawl_retry: ByOperator => "admin_crawl_retry", "order_id";
    correct_cancel: ByOperator => "admin_correct_cancel", "order_id";
    cancel_payout: ByOperator => "admin_cancel_payout", "order_id";
}
