//! The API over real HTTP (127.0.0.1:0, reqwest) against an in-memory pipeline that records appended
//! inputs and serves reads from seeded maps. End-to-end tests with the real backend live elsewhere.

use super::auth::sha256_hex;
use super::{router, ApiState, ClockMode, Limits};
use connectors::runtime::{Appended, LagReport, Page, PipelineHandle, RuntimeError};
use pipelines::input::{Command, Party};
use pipelines::{Input, Timestamp};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const ADMIN: &str = "admin-secret";
const M1_TOKEN: &str = "m1-token";
const T0: &str = "2026-03-02T09:30:00Z";

/// Seeded state: merchants m1, m2; users u1 (card c1), u2 (card c2); orders o1 (m1), o2 (m2).
struct FakePipeline {
    appended: Mutex<Vec<Input>>,
    positions: Mutex<HashMap<String, u64>>,
    keys: Mutex<HashMap<String, String>>,
    orders: HashMap<String, (String, Value)>,
    users: HashMap<String, Value>,
    merchants: HashMap<String, Value>,
    cards: HashMap<String, String>,
    ready: AtomicBool,
    busy: AtomicBool,
    /// Reads of seeded state by id (orders, users, merchants, cards): what request checks cost.
    lookups: AtomicUsize,
}

impl FakePipeline {
    fn seeded() -> FakePipeline {
        let order = |merchant: &str| (merchant.to_string(), json!({"kind": "collection", "merchant_id": merchant}));
        let balance = |available: &str| json!({"available": available, "payout_reserve": "0.00"});
        FakePipeline {
            appended: Mutex::default(),
            // The events that created the seeded state, as an earlier run appended them.
            positions: Mutex::new(HashMap::from([("seed:o1".to_string(), 99), ("seed:c1".to_string(), 98)])),
            keys: Mutex::new(HashMap::from([(sha256_hex(M1_TOKEN), "m1".to_string())])),
            orders: HashMap::from([("o1".to_string(), order("m1")), ("o2".to_string(), order("m2"))]),
            users: HashMap::from([
                ("u1".to_string(), json!({"available": "100.00"})),
                ("u2".to_string(), json!({"available": "0.00"})),
            ]),
            merchants: HashMap::from([("m1".to_string(), balance("10.00")), ("m2".to_string(), balance("20.00"))]),
            cards: HashMap::from([("c1".to_string(), "u1".to_string()), ("c2".to_string(), "u2".to_string())]),
            ready: AtomicBool::new(true),
            busy: AtomicBool::new(false),
            lookups: AtomicUsize::new(0),
        }
    }

    fn appended(&self) -> Vec<Input> {
        self.appended.lock().unwrap().clone()
    }
}

/// Three journal entries, seq 1..=3, for any known id.
fn journal(after_seq: u64, limit: usize) -> Page {
    let items = (after_seq + 1..=3).take(limit).map(|seq| json!({"seq": seq})).collect();
    Page { items, next_cursor: None }
}

impl PipelineHandle for FakePipeline {
    fn append(&self, inputs: Vec<Input>) -> Result<Vec<Appended>, RuntimeError> {
        if self.busy.load(Ordering::SeqCst) {
            return Err(RuntimeError::Retryable("store busy".to_string()));
        }
        let mut appended = self.appended.lock().unwrap();
        let mut positions = self.positions.lock().unwrap();
        let mut outcomes = Vec::new();
        for input in inputs {
            if let Some(&position) = positions.get(input.event_id.as_str()) {
                outcomes.push(Appended::Duplicate { position });
                continue;
            }
            let position = appended.len() as u64;
            positions.insert(input.event_id.to_string(), position);
            appended.push(input);
            outcomes.push(Appended::New { position });
        }
        Ok(outcomes)
    }
    fn event_position(&self, event_id: &str) -> Option<u64> {
        self.positions.lock().unwrap().get(event_id).copied()
    }
    fn order(&self, order_id: &str) -> Option<Value> {
        self.orders.get(order_id).map(|(_, order)| order.clone())
    }
    fn order_merchant(&self, order_id: &str) -> Option<String> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.orders.get(order_id).map(|(merchant, _)| merchant.clone())
    }
    fn user(&self, user_id: &str) -> Option<Value> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.users.get(user_id).cloned()
    }
    fn user_journal(&self, user_id: &str, after_seq: u64, limit: usize) -> Option<Page> {
        self.users.contains_key(user_id).then(|| journal(after_seq, limit))
    }
    fn merchant(&self, merchant_id: &str) -> Option<Value> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.merchants.get(merchant_id).cloned()
    }
    fn merchant_journal(&self, merchant_id: &str, after_seq: u64, limit: usize) -> Option<Page> {
        self.merchants.contains_key(merchant_id).then(|| journal(after_seq, limit))
    }
    fn review_queue(&self, cursor: Option<&str>, limit: usize) -> Page {
        Page { items: vec![json!({"cursor": cursor, "limit": limit})], next_cursor: None }
    }
    fn card_owner(&self, card_id: &str) -> Option<String> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.cards.get(card_id).cloned()
    }
    fn snapshot(&self) -> Value {
        json!({"clock": T0, "users": {}, "merchants": {}, "orders": {}, "outputs": []})
    }
    fn lag_report(&self) -> LagReport {
        let logs = [("agent-0", 4), ("outputs", 1)].map(|(log, records)| (log.to_string(), records));
        let lag_ms = [("agent-0", 2_500), ("outputs", u64::MAX)].map(|(log, lag_ms)| (log.to_string(), lag_ms));
        LagReport {
            logs: logs.into_iter().collect(),
            timers_due: 1,
            unprojected: 1,
            lag_ms: lag_ms.into_iter().collect(),
        }
    }
    fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
    fn put_merchant_key(&self, key_sha256_hex: &str, merchant_id: &str) -> Result<(), RuntimeError> {
        self.keys.lock().unwrap().insert(key_sha256_hex.to_string(), merchant_id.to_string());
        Ok(())
    }
    fn merchant_of_key(&self, key_sha256_hex: &str) -> Option<String> {
        self.keys.lock().unwrap().get(key_sha256_hex).cloned()
    }
}

struct Server {
    base: String,
    pipeline: Arc<FakePipeline>,
    client: reqwest::Client,
}

async fn start(clock: ClockMode) -> Server {
    start_with(clock, Limits::default()).await
}

async fn start_with(clock: ClockMode, limits: Limits) -> Server {
    let pipeline = Arc::new(FakePipeline::seeded());
    let state = ApiState::new(pipeline.clone(), clock, ADMIN, limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    Server { base: format!("http://{address}"), pipeline, client: reqwest::Client::new() }
}

/// A response's status and JSON body.
struct Answer {
    status: u16,
    body: Value,
    www_authenticate: bool,
}

impl Server {
    async fn send(&self, request: reqwest::RequestBuilder, token: Option<&str>) -> Answer {
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let www_authenticate = response.headers().contains_key("www-authenticate");
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("status {status}: not JSON: {text:?}"));
        Answer { status, body, www_authenticate }
    }

    async fn post(&self, path: &str, token: Option<&str>, body: Value) -> Answer {
        self.send(self.client.post(format!("{}{path}", self.base)).json(&body), token).await
    }

    async fn post_raw(&self, path: &str, token: Option<&str>, body: impl Into<reqwest::Body>) -> Answer {
        self.send(self.client.post(format!("{}{path}", self.base)).body(body), token).await
    }

    async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.send(self.client.get(format!("{}{path}", self.base)), token).await
    }

    async fn admin_post(&self, path: &str, body: Value) -> Answer {
        self.post(path, Some(ADMIN), body).await
    }

    fn appended_count(&self) -> usize {
        self.pipeline.appended().len()
    }
}

impl Answer {
    /// Asserts an error answer: status, code and (when given) field.
    #[track_caller]
    fn refused(&self, status: u16, code: &str, field: Option<&str>) {
        assert_eq!(self.status, status, "body {}", self.body);
        assert_eq!(self.body["error"], code, "body {}", self.body);
        assert_eq!(self.body.get("field").and_then(Value::as_str), field, "body {}", self.body);
        assert!(self.body["message"].as_str().is_some_and(|message| !message.is_empty()), "body {}", self.body);
    }

    #[track_caller]
    fn accepted(&self) -> &Vec<Value> {
        assert_eq!(self.status, 202, "body {}", self.body);
        self.body["accepted"].as_array().unwrap()
    }
}

fn deposit(amount: Value) -> Value {
    json!({"type": "merchant_deposit", "merchant_id": "m1", "amount": amount})
}

#[tokio::test]
async fn health_is_always_ok_and_readiness_follows_the_pipeline() {
    let server = start(ClockMode::System).await;
    let health = server.get("/healthz", None).await;
    assert_eq!((health.status, health.body.clone()), (200, json!({"status": "ok"})));
    assert_eq!(server.get("/readyz", None).await.status, 200);

    server.pipeline.ready.store(false, Ordering::SeqCst);
    assert_eq!(server.get("/readyz", None).await.status, 503);
    assert_eq!(server.get("/healthz", None).await.status, 200);
    server.admin_post("/v1/events", deposit(json!("1.00"))).await.refused(503, "not_ready", None);
    assert_eq!(server.appended_count(), 0);
}

#[tokio::test]
async fn malformed_json_is_refused() {
    let server = start(ClockMode::System).await;
    server.post_raw("/v1/events", Some(ADMIN), "{\"type\":").await.refused(400, "malformed_json", None);
    server.post_raw("/v1/events", Some(ADMIN), "42").await.refused(400, "malformed_json", None);
    server.post_raw("/v1/merchants/m1/collections", Some(ADMIN), "{oops").await.refused(400, "malformed_json", None);
    server.post_raw("/v1/merchants/m1/collections", Some(ADMIN), "[]").await.refused(400, "malformed_json", None);
    assert_eq!(server.appended_count(), 0);
}

#[tokio::test]
async fn unknown_and_missing_fields_are_named() {
    let server = start(ClockMode::System).await;
    let mut unknown = deposit(json!("1.00"));
    unknown["foo"] = json!(1);
    server.admin_post("/v1/events", unknown).await.refused(400, "invalid_field", Some("foo"));
    let missing = json!({"type": "merchant_deposit", "merchant_id": "m1"});
    server.admin_post("/v1/events", missing).await.refused(400, "invalid_field", Some("amount"));
    server.admin_post("/v1/events", json!({"merchant_id": "m1"})).await.refused(400, "invalid_field", Some("type"));

    let typed = json!({"order_id": "o9", "amount": "1.00", "foo": true});
    server.admin_post("/v1/merchants/m1/collections", typed).await.refused(400, "invalid_field", Some("foo"));
    let typed = json!({"order_id": "o9"});
    server.admin_post("/v1/merchants/m1/collections", typed).await.refused(400, "invalid_field", Some("amount"));
    // Path ids are not body fields.
    let typed = json!({"order_id": "o9", "amount": "1.00", "merchant_id": "m2"});
    server.admin_post("/v1/merchants/m1/collections", typed).await.refused(400, "invalid_field", Some("merchant_id"));
    assert_eq!(server.appended_count(), 0);
}

#[tokio::test]
async fn wrong_types_bad_enumerations_and_bad_times_are_named() {
    let server = start(ClockMode::System).await;
    server.admin_post("/v1/events", deposit(json!(100))).await.refused(400, "invalid_field", Some("amount"));
    let card = json!({"type": "card_bound", "user_id": "u1", "card_id": "c9", "provider": "gpay"});
    server.admin_post("/v1/events", card).await.refused(400, "invalid_field", Some("provider"));
    let nope = json!({"type": "nope", "order_id": "o1"});
    server.admin_post("/v1/events", nope).await.refused(400, "invalid_field", Some("type"));
    let expiry = json!({"type": "collection_created", "order_id": "o9", "merchant_id": "m1", "amount": "1.00",
        "expires_at": "tomorrow"});
    server.admin_post("/v1/events", expiry).await.refused(400, "invalid_field", Some("expires_at"));
    let event_id = json!({"type": "tick", "event_id": 5});
    server.admin_post("/v1/events", event_id).await.refused(400, "invalid_field", Some("event_id"));

    let typed = json!({"order_id": "o9", "amount": 1});
    server.admin_post("/v1/merchants/m1/collections", typed).await.refused(400, "invalid_field", Some("amount"));
    let typed = json!({"card_id": "c9", "provider": "gpay"});
    server.admin_post("/v1/admin/users/u1/cards", typed).await.refused(400, "invalid_field", Some("provider"));
    let typed = json!({"by": "nobody"});
    server.admin_post("/v1/orders/o1/cancel", typed).await.refused(400, "invalid_field", Some("by"));
    assert_eq!(server.appended_count(), 0);
}

#[tokio::test]
async fn bad_amounts_are_refused_with_their_field() {
    let server = start(ClockMode::System).await;
    server.admin_post("/v1/events", deposit(json!("-5.00"))).await.refused(400, "invalid_amount", Some("amount"));
    server.admin_post("/v1/events", deposit(json!("1.005"))).await.refused(400, "invalid_amount", Some("amount"));
    server.admin_post("/v1/events", deposit(json!("0"))).await.refused(400, "invalid_amount", Some("amount"));
    let recharge = json!({"amount": "10.00", "commission": "-1.00"});
    server.admin_post("/v1/admin/users/u1/recharge", recharge).await.refused(400, "invalid_amount", Some("commission"));
    let adjust = json!({"amount": "0.00", "reason": "typo"});
    server.admin_post("/v1/admin/users/u1/adjust", adjust).await.refused(400, "invalid_amount", Some("amount"));
    let merchant = json!({"merchant_id": "m9", "collection_fee_rate": "1.5", "payout_fee_rate": "0.01",
        "payout_fee_fixed": "0.00"});
    server.admin_post("/v1/admin/merchants", merchant).await.refused(
        400,
        "invalid_amount",
        Some("collection_fee_rate"),
    );
    let approve = json!({"operator": "ops", "amount": "12.345"});
    server.admin_post("/v1/admin/orders/o1/approve", approve).await.refused(400, "invalid_amount", Some("amount"));
    assert_eq!(server.appended_count(), 0);

    // A negative adjustment is legitimate; a fee rate may have more than two decimals.
    let adjust = json!({"amount": "-10.00", "reason": "refund"});
    assert_eq!(server.admin_post("/v1/admin/users/u1/adjust", adjust).await.accepted().len(), 1);
    let merchant = json!({"merchant_id": "m1", "collection_fee_rate": "0.025", "payout_fee_rate": "0.01",
        "payout_fee_fixed": "5"});
    assert_eq!(server.admin_post("/v1/admin/merchants", merchant).await.accepted().len(), 1);
    assert_eq!(server.appended_count(), 2);
}

#[tokio::test]
async fn unknown_ids_are_404_and_conflicts_409() {
    let server = start(ClockMode::System).await;
    let mut unknown_merchant = deposit(json!("1.00"));
    unknown_merchant["merchant_id"] = json!("m9");
    server.admin_post("/v1/events", unknown_merchant).await.refused(404, "unknown_merchant", Some("merchant_id"));
    let dispatch = |user: &str, card: &str| json!({"user_id": user, "card_id": card});
    server.admin_post("/v1/admin/orders/o9/dispatch", dispatch("u1", "c1")).await.refused(
        404,
        "unknown_order",
        Some("order_id"),
    );
    server.admin_post("/v1/admin/orders/o1/dispatch", dispatch("u9", "c1")).await.refused(
        404,
        "unknown_user",
        Some("user_id"),
    );
    server.admin_post("/v1/admin/orders/o1/dispatch", dispatch("u1", "c9")).await.refused(
        404,
        "unknown_card",
        Some("card_id"),
    );
    server.admin_post("/v1/admin/orders/o1/grab", dispatch("u1", "c2")).await.refused(
        409,
        "card_not_owned",
        Some("card_id"),
    );
    server.admin_post("/v1/orders/o9/confirm", json!({})).await.refused(404, "unknown_order", Some("order_id"));
    server.admin_post("/v1/admin/users/u9/unban", json!({"operator": "ops"})).await.refused(
        404,
        "unknown_user",
        Some("user_id"),
    );
    server.get("/v1/orders/o9", Some(ADMIN)).await.refused(404, "unknown_order", Some("order_id"));
    server.get("/v1/users/u9/balance", Some(ADMIN)).await.refused(404, "unknown_user", Some("user_id"));
    server.get("/v1/merchants/m9/balance", Some(ADMIN)).await.refused(404, "unknown_merchant", Some("merchant_id"));

    let existing = json!({"order_id": "o1", "amount": "5.00"});
    server.admin_post("/v1/merchants/m1/collections", existing).await.refused(409, "order_exists", Some("order_id"));
    let bound = json!({"card_id": "c2", "provider": "phonepe"});
    server.admin_post("/v1/admin/users/u1/cards", bound).await.refused(409, "card_already_bound", Some("card_id"));
    let user = json!({"user_id": "u1", "telegram_bound": true});
    server.admin_post("/v1/admin/users", user).await.refused(409, "user_exists", Some("user_id"));
    assert_eq!(server.appended_count(), 0);

    // A retry (the client's event id of the event that created the id) is a duplicate, not a conflict.
    let retried = json!({"order_id": "o1", "amount": "5.00", "event_id": "seed:o1"});
    let retried = server.admin_post("/v1/merchants/m1/collections", retried).await;
    assert_eq!(retried.accepted(), &vec![json!({"event_id": "seed:o1", "position": 99, "duplicate": true})]);
    let rebound = json!({"type": "card_bound", "user_id": "u1", "card_id": "c1", "provider": "phonepe",
        "event_id": "seed:c1"});
    assert_eq!(server.admin_post("/v1/events", rebound).await.accepted()[0]["duplicate"], true);
    assert_eq!(server.appended_count(), 0);

    // SPEC §7: a re-registration through the §5 event updates `telegram_bound`.
    let again = json!({"type": "user_registered", "user_id": "u1", "telegram_bound": true});
    assert_eq!(server.admin_post("/v1/events", again).await.accepted().len(), 1);
    assert_eq!(server.appended_count(), 1);
}

#[tokio::test]
async fn oversized_bodies_and_bulks_are_413() {
    let server = start(ClockMode::System).await;
    let padding = "x".repeat(1024 * 1024 + 16);
    let body = format!(r#"{{"type":"tick","event_id":"{padding}"}}"#);
    server.post_raw("/v1/events", Some(ADMIN), body).await.refused(413, "body_too_large", None);

    let small = start_with(ClockMode::System, Limits { events_per_request_max: 2, ..Limits::default() }).await;
    let bulk = json!([{"type": "tick"}, {"type": "tick"}, {"type": "tick"}]);
    small.admin_post("/v1/events", bulk).await.refused(413, "too_many_events", None);
    assert_eq!(server.appended_count() + small.appended_count(), 0);
}

#[tokio::test]
async fn config_and_simulated_wallet_events_are_refused() {
    let server = start(ClockMode::System).await;
    let refused = [
        json!({"type": "config", "window_slack": 60}),
        json!({"type": "wallet_fault", "card_id": "c1", "fault": "session_expired"}),
        json!({"type": "wallet_line_status", "card_id": "c1", "txn_id": "t1", "status": "success"}),
        json!({"type": "wallet_line", "card_id": "c1", "line": {}}),
    ];
    for event in refused {
        server.admin_post("/v1/events", event).await.refused(400, "type_not_accepted", Some("type"));
    }
    assert_eq!(server.appended_count(), 0);
    assert_eq!(server.admin_post("/v1/events", json!({"type": "tick"})).await.accepted().len(), 1);
}

#[tokio::test]
async fn system_clock_stamps_time_and_refuses_a_clients() {
    let server = start(ClockMode::System).await;
    let mut timed = deposit(json!("1.00"));
    timed["at"] = json!(T0);
    server.admin_post("/v1/events", timed).await.refused(400, "invalid_field", Some("at"));
    let typed = json!({"amount": "1.00", "at": T0});
    server.admin_post("/v1/admin/merchants/m1/deposit", typed).await.refused(400, "invalid_field", Some("at"));
    assert_eq!(server.appended_count(), 0);

    let before = Timestamp::from_millis(wall_millis());
    server.admin_post("/v1/events", deposit(json!("1.00"))).await.accepted();
    server.admin_post("/v1/admin/merchants/m1/deposit", json!({"amount": "2.00"})).await.accepted();
    let after = Timestamp::from_millis(wall_millis());
    let appended = server.pipeline.appended();
    assert_eq!(appended.len(), 2);
    assert!(before <= appended[0].at && appended[0].at <= appended[1].at && appended[1].at <= after);
}

fn wall_millis() -> i64 {
    let elapsed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(elapsed.as_millis()).unwrap()
}

#[tokio::test]
async fn event_clock_requires_at_and_uses_it() {
    let server = start(ClockMode::Event).await;
    server.admin_post("/v1/events", deposit(json!("1.00"))).await.refused(400, "invalid_field", Some("at"));
    let mut malformed = deposit(json!("1.00"));
    malformed["at"] = json!("yesterday");
    server.admin_post("/v1/events", malformed).await.refused(400, "invalid_field", Some("at"));
    server.admin_post("/v1/orders/o1/confirm", json!({"utr": "U1"})).await.refused(400, "invalid_field", Some("at"));
    assert_eq!(server.appended_count(), 0);

    let mut timed = deposit(json!("1.00"));
    timed["at"] = json!(T0);
    server.admin_post("/v1/events", timed).await.accepted();
    server.admin_post("/v1/orders/o1/confirm", json!({"utr": "U1", "at": "2026-03-02T09:31:00Z"})).await.accepted();
    let appended = server.pipeline.appended();
    assert_eq!(appended[0].at, Timestamp::parse(T0).unwrap());
    assert_eq!(appended[1].at, Timestamp::parse("2026-03-02T09:31:00Z").unwrap());
}

#[tokio::test]
async fn valid_events_get_positions_and_duplicates_are_reported() {
    let server = start(ClockMode::System).await;
    let mut first = deposit(json!("1.00"));
    first["event_id"] = json!("e1");
    let answer = server.admin_post("/v1/events", first.clone()).await;
    assert_eq!(answer.accepted(), &vec![json!({"event_id": "e1", "position": 0, "duplicate": false})]);
    let again = server.admin_post("/v1/events", first).await;
    assert_eq!(again.accepted(), &vec![json!({"event_id": "e1", "position": 0, "duplicate": true})]);

    let bulk = json!([{"type": "tick"}, {"type": "merchant_deposit", "event_id": "e2", "merchant_id": "m2",
        "amount": "100"}]);
    let accepted = server.admin_post("/v1/events", bulk).await.accepted().clone();
    assert_eq!(accepted.len(), 2);
    assert_eq!((accepted[0]["position"].clone(), accepted[0]["duplicate"].clone()), (json!(1), json!(false)));
    assert_eq!(accepted[1], json!({"event_id": "e2", "position": 2, "duplicate": false}));
    // Generated ids: `api:` and 32 hex digits.
    let generated = accepted[0]["event_id"].as_str().unwrap();
    assert!(generated.starts_with("api:") && generated.len() == 36, "{generated}");
    assert_eq!(server.pipeline.appended()[1].event_id, generated);
    assert_eq!(server.appended_count(), 3);
}

#[tokio::test]
async fn a_bulk_is_all_or_nothing_and_sees_its_own_new_ids() {
    let server = start(ClockMode::System).await;
    let bad = json!([deposit(json!("1.00")), deposit(json!("-1.00"))]);
    server.admin_post("/v1/events", bad).await.refused(400, "invalid_amount", Some("[1].amount"));
    let not_object = json!([deposit(json!("1.00")), 5]);
    server.admin_post("/v1/events", not_object).await.refused(400, "malformed_json", Some("[1]"));
    assert_eq!(server.appended_count(), 0);
    assert!(server.admin_post("/v1/events", json!([])).await.accepted().is_empty());

    let together = json!([
        {"type": "merchant_registered", "merchant_id": "m7", "collection_fee_rate": "0.02", "payout_fee_rate": "0",
            "payout_fee_fixed": "0"},
        {"type": "collection_created", "order_id": "o7", "merchant_id": "m7", "amount": "500.00"},
        {"type": "user_registered", "user_id": "u7", "telegram_bound": false},
        {"type": "card_bound", "user_id": "u7", "card_id": "c7", "provider": "mobikwik"},
        {"type": "collection_dispatched", "order_id": "o7", "user_id": "u7", "card_id": "c7"},
    ]);
    assert_eq!(server.admin_post("/v1/events", together).await.accepted().len(), 5);
    let twice = json!([
        {"type": "collection_created", "order_id": "o8", "merchant_id": "m1", "amount": "1.00"},
        {"type": "collection_created", "order_id": "o8", "merchant_id": "m1", "amount": "2.00"},
    ]);
    server.admin_post("/v1/events", twice).await.refused(409, "order_exists", Some("[1].order_id"));
    assert_eq!(server.appended_count(), 5);
}

/// The service runs on the multi-threaded runtime, where a request that checks and appends stays on its
/// worker's thread (`block_in_place`); the other tests run on a current-thread runtime, where it goes
/// to the blocking pool. Both answer alike: here a refused bulk, an accepted one, a typed event, and
/// requests sent together, each appended once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_append_are_answered_alike_on_the_multi_threaded_runtime() {
    let server = start(ClockMode::System).await;
    let bad = json!([deposit(json!("1.00")), deposit(json!("-1.00"))]);
    server.admin_post("/v1/events", bad).await.refused(400, "invalid_amount", Some("[1].amount"));
    assert_eq!(server.appended_count(), 0);
    let good = json!([deposit(json!("1.00")), deposit(json!("2.00"))]);
    assert_eq!(server.admin_post("/v1/events", good).await.accepted().len(), 2);
    let typed = json!({"order_id": "o9", "amount": "1.00"});
    assert_eq!(server.admin_post("/v1/merchants/m1/collections", typed).await.accepted().len(), 1);
    let mut together = tokio::task::JoinSet::new();
    for amount in 1..=8 {
        let (client, url) = (server.client.clone(), format!("{}/v1/events", server.base));
        let body = deposit(json!(format!("{amount}.00")));
        together.spawn(async move { client.post(url).bearer_auth(ADMIN).json(&body).send().await.unwrap().status() });
    }
    while let Some(status) = together.join_next().await {
        assert_eq!(status.unwrap().as_u16(), 202);
    }
    assert_eq!(server.appended_count(), 11);
}

/// A bulk whose events put `type` first is read straight into inputs (`pipelines::envelope`); one that
/// puts it last is read through JSON values. Both must append the same inputs.
#[tokio::test]
async fn a_bulk_appends_the_same_inputs_on_the_fast_and_the_slow_path() {
    let server = start(ClockMode::Event).await;
    let events = [
        ("e1", json!({"merchant_id": "m1", "amount": "10.50"}), "merchant_deposit"),
        ("e2", json!({"user_id": "u1", "amount": "1.00", "commission": "0.00"}), "user_recharge"),
        ("e3", json!({"order_id": "o9", "merchant_id": "m1", "amount": "500.00"}), "collection_created"),
        ("e4", json!({}), "tick"),
    ];
    // `serde_json` keeps the order keys are inserted in: the tag first, or after every field.
    let bulk = |prefix: &str, tag_first: bool| {
        let objects = events.iter().map(|(event_id, fields, type_name)| {
            let mut object = serde_json::Map::new();
            if tag_first {
                object.insert("type".to_string(), json!(type_name));
            }
            object.insert("event_id".to_string(), json!(format!("{prefix}{event_id}")));
            object.extend(fields.as_object().unwrap().clone());
            object.insert("at".to_string(), json!(T0));
            if !tag_first {
                object.insert("type".to_string(), json!(type_name));
            }
            Value::Object(object)
        });
        Value::Array(objects.collect())
    };
    let fast_body = bulk("fast-", true).to_string();
    assert!(pipelines::envelope::read_envelopes(fast_body.as_bytes(), 10).is_some(), "the fast path reads it");
    assert!(pipelines::envelope::read_envelopes(bulk("slow-", false).to_string().as_bytes(), 10).is_none());
    assert_eq!(server.admin_post("/v1/events", bulk("fast-", true)).await.accepted().len(), 4);
    // The slow path's order ids must not exist yet: the same creation twice would be a conflict.
    let slow = bulk("slow-", false).to_string().replace("\"o9\"", "\"o10\"");
    let slow: Value = serde_json::from_str(&slow).unwrap();
    assert_eq!(server.admin_post("/v1/events", slow).await.accepted().len(), 4);
    let appended = server.pipeline.appended();
    let (fast, slow) = appended.split_at(4);
    for (fast, slow) in fast.iter().zip(slow) {
        assert_eq!(fast.event_id.replace("fast-", ""), slow.event_id.replace("slow-", ""));
        assert_eq!(fast.at, slow.at);
        let slow_command = serde_json::to_string(&slow.command).unwrap().replace("\"o10\"", "\"o9\"");
        assert_eq!(serde_json::to_string(&fast.command).unwrap(), slow_command);
    }
    // A check fails the same way on either path, naming the event by its index.
    let twice = json!([{"type": "collection_created", "at": T0, "order_id": "o11", "merchant_id": "m1",
        "amount": "1.00"}, {"type": "collection_created", "at": T0, "order_id": "o11", "merchant_id": "m1",
        "amount": "2.00"}]);
    server.admin_post("/v1/events", twice).await.refused(409, "order_exists", Some("[1].order_id"));
    // Without `at` on the event clock the slow path answers, naming the field.
    let undated = json!([{"type": "tick", "at": T0}, {"type": "tick"}]);
    server.admin_post("/v1/events", undated).await.refused(400, "invalid_field", Some("[1].at"));
    assert_eq!(server.appended_count(), 8);
}

/// On the system clock the fast path stamps a bulk's events as the slow path does, and refuses a given
/// `at` the same way.
#[tokio::test]
async fn a_bulk_on_the_system_clock_is_stamped_on_the_fast_path() {
    let server = start(ClockMode::System).await;
    let before = wall_millis();
    let bulk = json!([{"type": "tick"}, {"type": "merchant_deposit", "merchant_id": "m1", "amount": "2.00"}]);
    assert!(pipelines::envelope::read_envelopes(bulk.to_string().as_bytes(), 10).is_some());
    assert_eq!(server.admin_post("/v1/events", bulk).await.accepted().len(), 2);
    let appended = server.pipeline.appended();
    assert_eq!(appended[0].at, appended[1].at, "one stamp per request");
    assert!((before..=wall_millis()).contains(&appended[0].at.millis()), "stamped from the wall clock");
    let dated = json!([{"type": "tick"}, {"type": "tick", "at": T0}]);
    server.admin_post("/v1/events", dated).await.refused(400, "invalid_field", Some("[1].at"));
    assert_eq!(server.appended_count(), 2);
}

/// Ids are never removed, so a bulk request looks each one up in the pipeline's state once.
#[tokio::test]
async fn a_bulk_looks_each_existing_id_up_once() {
    let server = start(ClockMode::System).await;
    let recharge = json!({"type": "user_recharge", "user_id": "u1", "amount": "1.00", "commission": "0.00"});
    let reauthenticated = json!({"type": "card_reauthenticated", "user_id": "u1", "card_id": "c1"});
    let confirmed = json!({"type": "payment_confirmed", "order_id": "o1"});
    let bulk = json!([recharge, reauthenticated, recharge, confirmed, reauthenticated, confirmed]);
    let before = server.pipeline.lookups.load(Ordering::SeqCst);
    assert_eq!(server.admin_post("/v1/events", bulk).await.accepted().len(), 6);
    let lookups = server.pipeline.lookups.load(Ordering::SeqCst) - before;
    assert_eq!(lookups, 3, "u1, its card c1 and o1, once each");
}

#[tokio::test]
async fn requests_without_a_valid_token_are_401() {
    let server = start(ClockMode::System).await;
    let none = server.post("/v1/events", None, deposit(json!("1.00"))).await;
    none.refused(401, "unauthorized", None);
    assert!(none.www_authenticate);
    server.post("/v1/events", Some("guess"), deposit(json!("1.00"))).await.refused(401, "unauthorized", None);
    server.get("/v1/orders/o1", Some("")).await.refused(401, "unauthorized", None);
    let basic = server.client.get(format!("{}/v1/admin/lag", server.base)).basic_auth("admin", Some(ADMIN));
    server.send(basic, None).await.refused(401, "unauthorized", None);
    assert_eq!(server.appended_count(), 0);
}

#[tokio::test]
async fn a_merchant_key_is_confined_to_its_merchant() {
    let server = start(ClockMode::System).await;
    let m1 = Some(M1_TOKEN);
    server.get("/v1/orders/o2", m1).await.refused(403, "forbidden", None);
    server.get("/v1/merchants/m2/balance", m1).await.refused(403, "forbidden", None);
    server.get("/v1/merchants/m2/journal", m1).await.refused(403, "forbidden", None);
    let collection = json!({"order_id": "o5", "amount": "10.00"});
    server.post("/v1/merchants/m2/collections", m1, collection.clone()).await.refused(403, "forbidden", None);
    server.post("/v1/orders/o2/cancel", m1, json!({"by": "merchant"})).await.refused(403, "forbidden", None);
    server.post("/v1/orders/o2/supplement", m1, json!({"utr": "U"})).await.refused(403, "forbidden", None);
    // Admin endpoints.
    server.post("/v1/events", m1, json!({"type": "tick"})).await.refused(403, "forbidden", None);
    server.post("/v1/admin/merchants/m1/keys", m1, json!({})).await.refused(403, "forbidden", None);
    server.post("/v1/admin/orders/o1/approve", m1, json!({"operator": "me"})).await.refused(403, "forbidden", None);
    server.get("/v1/users/u1/balance", m1).await.refused(403, "forbidden", None);
    server.get("/v1/admin/snapshot", m1).await.refused(403, "forbidden", None);
    // The agent's side of a cancellation is not the merchant's to claim.
    server.post("/v1/orders/o1/cancel", m1, json!({"by": "user"})).await.refused(403, "forbidden", None);
    assert_eq!(server.appended_count(), 0);

    let order = server.get("/v1/orders/o1", m1).await;
    assert_eq!((order.status, order.body["merchant_id"].clone()), (200, json!("m1")));
    let balance = server.get("/v1/merchants/m1/balance", m1).await;
    assert_eq!((balance.status, balance.body["available"].clone()), (200, json!("10.00")));
    let created = server.post("/v1/merchants/m1/collections", m1, collection).await;
    assert_eq!(created.accepted().len(), 1);
    server.post("/v1/orders/o1/cancel", m1, json!({"by": "merchant"})).await.accepted();
    let appended = server.pipeline.appended();
    let Command::CollectionCreated(created) = &appended[0].command else { panic!("{:?}", appended[0]) };
    assert_eq!((created.merchant_id.as_str(), created.order_id.as_str()), ("m1", "o5"));
    assert!(matches!(&appended[1].command, Command::OrderCancelled(cancel) if cancel.order_id == "o1"));
}

#[tokio::test]
async fn a_merchants_event_ids_are_namespaced() {
    let server = start(ClockMode::System).await;
    let body = json!({"order_id": "o5", "amount": "10.00", "event_id": "x1"});
    let merchant = server.post("/v1/merchants/m1/collections", Some(M1_TOKEN), body.clone()).await;
    assert_eq!(merchant.accepted()[0]["event_id"], "merchant:m1:x1");
    let mut admin_body = body;
    admin_body["order_id"] = json!("o6");
    let admin = server.admin_post("/v1/merchants/m1/collections", admin_body).await;
    assert_eq!(admin.accepted()[0]["event_id"], "x1");
}

#[tokio::test]
async fn an_issued_key_works_for_its_merchant_only() {
    let server = start(ClockMode::System).await;
    let issued = server.admin_post("/v1/admin/merchants/m2/keys", json!({})).await;
    assert_eq!(issued.status, 201, "{}", issued.body);
    assert_eq!(issued.body["merchant_id"], "m2");
    let token = issued.body["token"].as_str().unwrap().to_string();
    assert!(token.len() == 64 && token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    let stored = server.pipeline.keys.lock().unwrap().clone();
    assert_eq!(stored.get(&sha256_hex(&token)).map(String::as_str), Some("m2"));
    assert!(!stored.contains_key(&token), "the token itself must not be stored");

    assert_eq!(server.get("/v1/merchants/m2/balance", Some(&token)).await.body["available"], "20.00");
    server.get("/v1/merchants/m1/balance", Some(&token)).await.refused(403, "forbidden", None);
    let other = server.admin_post("/v1/admin/merchants/m2/keys", json!({})).await;
    assert_ne!(other.body["token"], json!(token));
    server.admin_post("/v1/admin/merchants/m9/keys", json!({})).await.refused(
        404,
        "unknown_merchant",
        Some("merchant_id"),
    );
}

#[tokio::test]
async fn typed_endpoints_build_their_events() {
    let server = start(ClockMode::System).await;
    let posts = [
        ("/v1/admin/orders/o1/approve", json!({"operator": "ops", "amount": "99.50"})),
        ("/v1/admin/orders/o1/reject", json!({"operator": "ops"})),
        ("/v1/admin/orders/o2/cancel-payout", json!({"operator": "ops"})),
        ("/v1/orders/o1/confirm", json!({})),
        ("/v1/merchants/m2/payouts", json!({"order_id": "p1", "amount": "50.00", "payee": {"vpa": "a@b"}})),
        ("/v1/admin/users/u1/reauthenticated", json!({"card_id": "c1"})),
    ];
    for (path, body) in posts {
        server.admin_post(path, body).await.accepted();
    }
    let appended = server.pipeline.appended();
    let Command::AdminApprove(approve) = &appended[0].command else { panic!("{:?}", appended[0]) };
    assert_eq!((approve.order_id.as_str(), approve.amount.as_deref()), ("o1", Some("99.50")));
    assert!(matches!(&appended[1].command, Command::AdminReject(reject) if reject.operator == "ops"));
    assert!(matches!(&appended[2].command, Command::AdminCancelPayout(cancel) if cancel.order_id == "o2"));
    assert!(matches!(&appended[3].command, Command::PaymentConfirmed(confirm) if confirm.utr.is_none()));
    let Command::PayoutCreated(payout) = &appended[4].command else { panic!("{:?}", appended[4]) };
    assert_eq!(*payout.payee, Party { vpa: Some("a@b".into()), ..Party::default() });
    assert!(matches!(&appended[5].command, Command::CardReauthenticated(reauth) if reauth.user_id == "u1"));

    let nameless = json!({"order_id": "p2", "amount": "50.00", "payee": {"name": "A"}});
    server.admin_post("/v1/merchants/m2/payouts", nameless).await.refused(400, "invalid_payee", Some("payee"));
    assert_eq!(server.appended_count(), 6);
}

#[tokio::test]
async fn reads_answer_json_and_pages_are_bounded() {
    let server = start(ClockMode::System).await;
    let page = server.get("/v1/merchants/m1/journal?after=1&limit=1", Some(M1_TOKEN)).await;
    assert_eq!((page.status, page.body["items"].clone()), (200, json!([{"seq": 2}])));
    let page = server.get("/v1/users/u1/journal", Some(ADMIN)).await;
    assert_eq!(page.body["items"].as_array().map(Vec::len), Some(3));
    server.get("/v1/users/u1/journal?limit=1001", Some(ADMIN)).await.refused(400, "invalid_field", Some("limit"));
    server.get("/v1/users/u1/journal?limit=0", Some(ADMIN)).await.refused(400, "invalid_field", Some("limit"));
    server.get("/v1/users/u1/journal?after=-1", Some(ADMIN)).await.refused(400, "invalid_field", Some("after"));
    server.get("/v1/users/u1/journal?page=2", Some(ADMIN)).await.refused(400, "invalid_field", Some("page"));
    let queue = server.get("/v1/admin/review-queue?cursor=abc&limit=5", Some(ADMIN)).await;
    assert_eq!(queue.body["items"], json!([{"cursor": "abc", "limit": 5}]));
    let queue = server.get("/v1/admin/review-queue", Some(ADMIN)).await;
    assert_eq!(queue.body["items"], json!([{"cursor": null, "limit": 100}]));

    let logs_lag_ms = json!({"agent-0": 2_500, "outputs": u64::MAX});
    let lag = json!({"lag": 7, "logs": {"agent-0": 4, "outputs": 1}, "timers_due": 1, "unprojected": 1, "logs_lag_ms": logs_lag_ms});
    assert_eq!(server.get("/v1/admin/lag", Some(ADMIN)).await.body, lag);
    assert_eq!(server.get("/v1/admin/snapshot", Some(ADMIN)).await.body["clock"], T0);
    assert_eq!(server.get("/v1/users/u1/balance", Some(ADMIN)).await.body, json!({"available": "100.00"}));
}

#[tokio::test]
async fn wrong_methods_unknown_routes_and_busy_pipelines_answer_json() {
    let server = start(ClockMode::System).await;
    server.get("/v1/events", Some(ADMIN)).await.refused(405, "method_not_allowed", None);
    server.post("/v1/admin/lag", Some(ADMIN), json!({})).await.refused(405, "method_not_allowed", None);
    server.get("/v1/nothing-here", Some(ADMIN)).await.refused(404, "not_found", None);

    server.pipeline.busy.store(true, Ordering::SeqCst);
    server.admin_post("/v1/events", deposit(json!("1.00"))).await.refused(503, "unavailable", None);
    assert_eq!(server.appended_count(), 0);
}

#[tokio::test]
async fn metrics_count_and_time_requests_by_route_template_for_the_admin_only() {
    let server = start(ClockMode::System).await;
    assert_eq!(server.get("/v1/orders/o1", Some(ADMIN)).await.status, 200);
    assert_eq!(server.get("/v1/orders/o2", Some(ADMIN)).await.status, 200);
    server.get("/v1/orders/o9", Some(ADMIN)).await.refused(404, "unknown_order", Some("order_id"));
    server.get("/v1/nothing-here/o1", Some(ADMIN)).await.refused(404, "not_found", None);
    let custom_method = reqwest::Method::from_bytes(b"FETCH").unwrap();
    server.send(server.client.request(custom_method, format!("{}/v1/orders/o1", server.base)), Some(ADMIN)).await;

    let scrape = |token: Option<&'static str>| {
        let request = server.client.get(format!("{}/metrics", server.base));
        async move {
            let response = match token {
                Some(token) => request.bearer_auth(token),
                None => request,
            }
            .send()
            .await
            .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    assert_eq!(scrape(None).await.0, 401);
    assert_eq!(scrape(Some(M1_TOKEN)).await.0, 403);
    let (status, text) = scrape(Some(ADMIN)).await;
    assert_eq!(status, 200);
    let line = |start: &str| {
        let found: Vec<&str> = text.lines().filter(|line| line.starts_with(start)).collect();
        assert_eq!(found.len(), 1, "one line starting {start:?} in:\n{text}");
        found[0].rsplit(' ').next().unwrap().to_string()
    };
    let order = r#"method="GET",route="/v1/orders/{order_id}""#;
    assert_eq!(line(&format!("paisa_http_requests_total{{{order},status=\"200\"}}")), "2");
    assert_eq!(line(&format!("paisa_http_requests_total{{{order},status=\"404\"}}")), "1");
    assert_eq!(line(r#"paisa_http_requests_total{method="GET",route="unmatched",status="404"}"#), "1");
    assert_eq!(line(r#"paisa_http_requests_total{method="other",route="/v1/orders/{order_id}",status="405"}"#), "1");
    // The scrapes refused before this one were requests too.
    assert_eq!(line(r#"paisa_http_requests_total{method="GET",route="/metrics",status="401"}"#), "1");
    // Three reads timed, in cumulative buckets (Prometheus' histogram): one per bound, then +Inf.
    assert_eq!(line(&format!("paisa_http_request_duration_seconds_count{{{order}}}")), "3");
    let bucket_start = format!("paisa_http_request_duration_seconds_bucket{{{order},le=");
    let buckets: Vec<u64> = text
        .lines()
        .filter(|line| line.starts_with(&bucket_start))
        .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(buckets.len(), 16, "{text}");
    assert!(buckets.windows(2).all(|pair| pair[0] <= pair[1]), "{buckets:?}");
    assert_eq!(buckets.last(), Some(&3));
    assert_eq!(line("paisa_pipeline_lag_records"), "7");
    // The lag by where it waits: a series per log, labelled with the log's name.
    assert_eq!(line(r#"paisa_pipeline_log_lag_records{log="agent-0"}"#), "4");
    assert_eq!(line(r#"paisa_pipeline_log_lag_records{log="outputs"}"#), "1");
    // And how far behind the clock each log is, in seconds; unknown is never 0.
    assert_eq!(line(r#"paisa_pipeline_log_lag_seconds{log="agent-0"}"#), "2.5");
    let unknown: f64 = line(r#"paisa_pipeline_log_lag_seconds{log="outputs"}"#).parse().unwrap();
    assert_eq!(unknown, u64::MAX as f64 / 1_000.0);
    assert_eq!(line("paisa_pipeline_timers_due_partitions"), "1");
    assert_eq!(line("paisa_read_model_unprojected_keys"), "1");
    // Ids never become labels: only route templates do.
    assert!(!text.contains("/v1/orders/o1") && !text.contains("nothing-here"), "{text}");
}
