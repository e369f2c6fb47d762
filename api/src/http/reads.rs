//! Reads of materialised state: 200 with the JSON value (shaped like the SPEC §9 document's parts),
//! 404 JSON when the id is unknown. Lists are paged with bounded page sizes.

use super::auth::Caller;
use super::error::{ApiError, Entity};
use super::validate::unknown;
use super::{ApiState, Limits};
use axum::extract::{Path, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use connectors::runtime::Page;
use serde_json::{json, Value};
use std::collections::HashMap;

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/orders/{order_id}", get(order))
        .route("/v1/merchants/{merchant_id}/balance", get(merchant_balance))
        .route("/v1/merchants/{merchant_id}/journal", get(merchant_journal))
        .route("/v1/users/{user_id}/balance", get(user_balance))
        .route("/v1/users/{user_id}/journal", get(user_journal))
        .route("/v1/users/{user_id}/bill-table", get(user_bill_table))
        .route("/v1/admin/review-queue", get(review_queue))
        .route("/v1/admin/snapshot", get(snapshot))
        .route("/v1/admin/lag", get(lag))
}

/// Query parameters, parsed by hand so that each bad one is named in the 400.
type RawQuery = Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

/// `?after=&limit=` of journals, or `?cursor=&limit=` of the review queue.
struct Paging {
    after: u64,
    cursor: Option<String>,
    limit: usize,
}

fn paging(query: RawQuery, allowed: &[&str], limits: &Limits) -> Result<Paging, ApiError> {
    let Query(query) =
        query.map_err(|rejection| ApiError::InvalidField { field: None, message: rejection.body_text() })?;
    if let Some(unknown) = query.keys().find(|key| !allowed.contains(&key.as_str())) {
        return Err(ApiError::invalid_field(unknown.clone(), format!("unknown query parameter `{unknown}`")));
    }
    let after = match query.get("after") {
        None => 0,
        Some(text) => {
            text.parse().map_err(|_| ApiError::invalid_field("after", "`after` must be a journal seq (u64)"))?
        }
    };
    let limit = match query.get("limit") {
        None => limits.page_items_default,
        Some(text) => {
            text.parse().ok().filter(|limit| (1..=limits.page_items_max).contains(limit)).ok_or_else(|| {
                ApiError::invalid_field("limit", format!("`limit` must be between 1 and {}", limits.page_items_max))
            })?
        }
    };
    Ok(Paging { after, cursor: query.get("cursor").cloned(), limit })
}

fn found(value: Option<Value>, entity: Entity, field: &str, id: &str) -> Result<Json<Value>, ApiError> {
    value.map(Json).ok_or_else(|| unknown(entity, field, id))
}

fn found_page(page: Option<Page>, entity: Entity, field: &str, id: &str) -> Result<Json<Page>, ApiError> {
    page.map(Json).ok_or_else(|| unknown(entity, field, id))
}

/// An order with its sub-orders and timelines: the admin, or the merchant owning it.
async fn order(
    State(state): State<ApiState>,
    caller: Caller,
    Path(order_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match state.pipeline.order_merchant(&order_id) {
        Some(merchant_id) => caller.require_merchant(&merchant_id)?,
        None => return Err(unknown(Entity::Order, "order_id", &order_id)),
    }
    found(state.pipeline.order(&order_id), Entity::Order, "order_id", &order_id)
}

async fn merchant_balance(
    State(state): State<ApiState>,
    caller: Caller,
    Path(merchant_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_merchant(&merchant_id)?;
    found(state.pipeline.merchant(&merchant_id), Entity::Merchant, "merchant_id", &merchant_id)
}

async fn merchant_journal(
    State(state): State<ApiState>,
    caller: Caller,
    Path(merchant_id): Path<String>,
    query: RawQuery,
) -> Result<Json<Page>, ApiError> {
    caller.require_merchant(&merchant_id)?;
    let paging = paging(query, &["after", "limit"], &state.limits)?;
    let page = state.pipeline.merchant_journal(&merchant_id, paging.after, paging.limit);
    found_page(page, Entity::Merchant, "merchant_id", &merchant_id)
}

async fn user_balance(
    State(state): State<ApiState>,
    caller: Caller,
    Path(user_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    found(state.pipeline.user(&user_id), Entity::User, "user_id", &user_id)
}

async fn user_journal(
    State(state): State<ApiState>,
    caller: Caller,
    Path(user_id): Path<String>,
    query: RawQuery,
) -> Result<Json<Page>, ApiError> {
    caller.require_admin()?;
    let paging = paging(query, &["after", "limit"], &state.limits)?;
    found_page(state.pipeline.user_journal(&user_id, paging.after, paging.limit), Entity::User, "user_id", &user_id)
}

async fn user_bill_table(
    State(state): State<ApiState>,
    caller: Caller,
    Path(user_id): Path<String>,
    query: RawQuery,
) -> Result<Json<Page>, ApiError> {
    caller.require_admin()?;
    let paging = paging(query, &["cursor", "limit"], &state.limits)?;
    let page = state.pipeline.user_bill_table(&user_id, paging.cursor.as_deref(), paging.limit);
    found_page(page, Entity::User, "user_id", &user_id)
}

async fn review_queue(State(state): State<ApiState>, caller: Caller, query: RawQuery) -> Result<Json<Page>, ApiError> {
    caller.require_admin()?;
    let paging = paging(query, &["cursor", "limit"], &state.limits)?;
    Ok(Json(state.pipeline.review_queue(paging.cursor.as_deref(), paging.limit)))
}

/// The SPEC §9 document. It can be large, so it is built off the async workers.
async fn snapshot(State(state): State<ApiState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    let pipeline = state.pipeline.clone();
    Ok(Json(tokio::task::spawn_blocking(move || pipeline.snapshot()).await?))
}

/// The lag report. It reads the store (on Kafka, brokers), so it is built off the async workers.
async fn lag(State(state): State<ApiState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    let pipeline = state.pipeline.clone();
    let report = tokio::task::spawn_blocking(move || pipeline.lag_report()).await?;
    Ok(Json(json!({
        "lag": report.total(),
        "logs": report.logs,
        "timers_due": report.timers_due,
        "unprojected": report.unprojected,
        "logs_lag_ms": report.lag_ms,
    })))
}
