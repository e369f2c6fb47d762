//! The simulator's own HTTP surface: query and body validation, clocks, bounds.

use super::{serve_state, SimClock, WalletSimState, BODY_BYTES_MAX, EVENTS_PER_REQUEST_MAX, SIM_CARDS_MAX};
use pipelines::Timestamp;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const T0: &str = "2026-03-02T09:30:00Z";

struct Server {
    base_url: String,
    state: WalletSimState,
    http: reqwest::Client,
    _shutdown: oneshot::Sender<()>,
}

async fn start(clock: SimClock) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let state = WalletSimState::new(clock);
    let (shutdown, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve_state(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    Server { base_url, state, http: reqwest::Client::new(), _shutdown: shutdown }
}

impl Server {
    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.http.get(format!("{}{path}", self.base_url)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let url = format!("{}{path}", self.base_url);
        let response = self.http.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    /// The txn ids of the card's statement, newest first.
    async fn txn_ids(&self, card_id: &str) -> Vec<String> {
        let (status, body) = self.get(&format!("/v1/cards/{card_id}/transactions")).await;
        assert_eq!(status, 200, "{body}");
        let lines = body["transactions"].as_array().unwrap();
        lines.iter().map(|line| line["txn_id"].as_str().unwrap().to_string()).collect()
    }
}

fn line(card_id: &str, txn_id: &str, at: &str) -> Value {
    json!({"type": "wallet_line", "at": at, "card_id": card_id, "line": {"txn_id": txn_id, "utr": null,
        "direction": "out", "amount": "10.00", "status": "processing", "time": at}})
}

#[tokio::test]
async fn health_and_unknown_routes_answer_json() {
    let server = start(SimClock::Event).await;
    assert_eq!(server.get("/healthz").await, (200, json!({"status": "ok"})));
    let (status, body) = server.get("/v2/nothing").await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn bad_query_parameters_are_refused_by_name() {
    let server = start(SimClock::Event).await;
    let cases = [
        ("order=sideways", "order"),
        ("from=yesterday", "from"),
        ("limit=ten", "limit"),
        ("limit=1001", "limit"),
        ("limit=-1", "limit"),
        ("cursor=abc", "cursor"),
        ("order=asc&order=desc", "order"),
    ];
    for (query, field) in cases {
        let (status, body) = server.get(&format!("/v1/cards/c1/transactions?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!((body["error"].as_str(), body["field"].as_str()), (Some("invalid_query"), Some(field)), "{query}");
    }
    let (status, _) = server.get(&format!("/v1/cards/c1/transactions?order=asc&from={T0}&limit=1000")).await;
    assert_eq!(status, 200);
    assert_eq!(server.state.stats().card_requests, 1, "refused queries were answered");
}

#[tokio::test]
async fn an_as_of_header_that_is_not_a_time_is_refused_by_name() {
    let server = start(SimClock::Event).await;
    for path in ["/v1/cards/c1/transactions", "/v1/cards/c1/transactions/t1"] {
        let url = format!("{}{path}", server.base_url);
        let response = server.http.get(url).header("paisa-as-of", "yesterday").send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!((body["error"].as_str(), body["field"].as_str()), (Some("invalid_header"), Some("paisa-as-of")));
    }
    assert_eq!(server.state.stats().card_requests, 0, "a refused request was answered");
}

/// Statements posted ahead of the pipeline (event clock): an answer as of an earlier time shows the
/// line's status, the card's fault and the line's version of then, not the changes posted since.
#[tokio::test]
async fn an_answer_as_of_a_time_shows_the_card_as_it_was_then() {
    let server = start(SimClock::Event).await;
    let at = |minute: u32| format!("2026-03-02T09:{minute:02}:00Z");
    let replaced = json!({"type": "wallet_line", "at": at(50), "card_id": "c1", "line": {"txn_id": "t1",
        "utr": null, "direction": "out", "amount": "12.00", "status": "success", "time": at(30)}});
    let events = json!([
        line("c1", "t1", &at(30)),
        {"type": "wallet_line_status", "at": at(40), "card_id": "c1", "txn_id": "t1", "status": "failed"},
        {"type": "wallet_fault", "at": at(45), "card_id": "c1", "fault": "upstream_busy"},
        {"type": "wallet_fault", "at": at(48), "card_id": "c1", "fault": "none"},
        replaced,
    ]);
    assert_eq!(server.post("/sim/v1/events", &events).await.0, 200);
    let as_of = |minute: u32| {
        let url = format!("{}/v1/cards/c1/transactions/t1", server.base_url);
        let request = server.http.get(url).header("paisa-as-of", at(minute));
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap())
        }
    };
    let (status, line) = as_of(35).await;
    assert_eq!((status, line["status"].as_str(), line["amount"].as_str()), (200, Some("processing"), Some("10.00")));
    let (status, line) = as_of(42).await;
    assert_eq!((status, line["status"].as_str(), line["amount"].as_str()), (200, Some("failed"), Some("10.00")));
    assert_eq!(as_of(46).await, (503, json!({"error": "upstream_busy"})), "the fault of then");
    let (status, line) = as_of(49).await;
    assert_eq!((status, line["status"].as_str(), line["amount"].as_str()), (200, Some("failed"), Some("10.00")));
    let (status, line) = as_of(55).await;
    assert_eq!((status, line["status"].as_str(), line["amount"].as_str()), (200, Some("success"), Some("12.00")));
    let (status, page) = server.get("/v1/cards/c1/transactions").await;
    assert_eq!((status, page["transactions"][0]["amount"].as_str()), (200, Some("12.00")), "without as-of: now");
}

#[tokio::test]
async fn faults_map_to_their_statuses() {
    let server = start(SimClock::Event).await;
    let fault = |fault: &str| json!({"type": "wallet_fault", "at": T0, "card_id": "c1", "fault": fault});
    server.post("/sim/v1/events", &json!([line("c1", "t1", T0)])).await;
    for (name, list_status, detail_status) in
        [("session_expired", 401, 401), ("upstream_busy", 503, 503), ("detail_unavailable", 200, 404)]
    {
        assert_eq!(server.post("/sim/v1/events", &fault(name)).await.0, 200);
        let (status, body) = server.get("/v1/cards/c1/transactions").await;
        assert_eq!(status, list_status, "{name} list: {body}");
        let (status, body) = server.get("/v1/cards/c1/transactions/t1").await;
        assert_eq!(status, detail_status, "{name} detail: {body}");
        if detail_status != 200 {
            assert_eq!(body, json!({"error": name}));
        }
    }
    let (status, body) = server.get("/v1/cards/c1/transactions/unknown").await;
    assert_eq!((status, body), (404, json!({"error": "detail_unavailable"})));
}

#[tokio::test]
async fn the_event_clock_follows_events_and_never_goes_back() {
    let server = start(SimClock::Event).await;
    assert_eq!(server.get("/sim/v1/clock").await.1, json!({"clock": "event", "at": null}));
    // A line dated later than the clock stays hidden until the clock reaches it.
    server.post("/sim/v1/events", &json!([line("c1", "t1", T0), line("c1", "late", "2026-03-02T10:00:00Z")])).await;
    let (status, body) = server
        .post(
            "/sim/v1/events",
            &json!({"type": "wallet_line_status", "at": T0, "card_id": "c1", "txn_id": "t1",
            "status": "success"}),
        )
        .await;
    assert_eq!((status, body), (200, json!({"applied": 1})));
    assert_eq!(server.state.now(), Timestamp::parse("2026-03-02T10:00:00Z"));
    let (_, body) = server.post("/sim/v1/clock", &json!({"at": "2026-03-02T09:00:00Z"})).await;
    assert_eq!(body["at"], json!("2026-03-02T10:00:00Z"), "the clock went back");
    let (_, body) = server.post("/sim/v1/clock", &json!({"at": "2026-03-02T11:00:00Z"})).await;
    assert_eq!(body["at"], json!("2026-03-02T11:00:00Z"));
    assert_eq!(server.txn_ids("c1").await, ["late", "t1"]);
    let (_, body) = server.get("/v1/cards/c1/transactions").await;
    assert_eq!(body["transactions"][1]["status"], json!("success"));
    let (status, body) = server.post("/sim/v1/clock", &json!({"at": "soon"})).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_body")));
}

#[tokio::test]
async fn the_event_clock_needs_at_and_the_system_clock_stamps_it() {
    let event = start(SimClock::Event).await;
    let mut undated = line("c1", "t1", T0);
    undated.as_object_mut().unwrap().remove("at");
    let (status, body) = event.post("/sim/v1/events", &undated).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("at")));

    let system = start(SimClock::System).await;
    assert_eq!(system.post("/sim/v1/events", &undated).await.0, 200);
    assert_eq!(system.txn_ids("c1").await, ["t1"], "a stamped line dated in the past is visible");
    let (status, body) = system.post("/sim/v1/clock", &json!({"at": T0})).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("clock_is_system")));
    assert_eq!(system.get("/sim/v1/clock").await.1["clock"], json!("system"));
}

/// A bulk whose events put `type` first is read straight into wallet events (`pipelines::envelope`);
/// one that puts it last is read through JSON values. Both must give the cards the same lines.
#[tokio::test]
async fn a_bulk_gives_the_same_lines_on_the_fast_and_the_slow_path() {
    let server = start(SimClock::Event).await;
    let lines = |card_id: &str| vec![line(card_id, "t1", T0), line(card_id, "t2", T0)];
    let fast = Value::Array(lines("c1"));
    assert!(pipelines::envelope::read_envelopes(fast.to_string().as_bytes(), 10).is_some(), "the fast path");
    let tag_last = |mut event: Value| {
        let object = event.as_object_mut().unwrap();
        let tag = object.shift_remove("type").unwrap();
        object.insert("type".to_string(), tag);
        event
    };
    let slow = Value::Array(lines("c2").into_iter().map(tag_last).collect());
    assert!(pipelines::envelope::read_envelopes(slow.to_string().as_bytes(), 10).is_none(), "the slow path");
    assert_eq!(server.post("/sim/v1/events", &fast).await, (200, json!({"applied": 2})));
    assert_eq!(server.post("/sim/v1/events", &slow).await, (200, json!({"applied": 2})));
    let (page_one, page_two) =
        (server.get("/v1/cards/c1/transactions").await, server.get("/v1/cards/c2/transactions").await);
    assert_eq!((page_one.0, page_two.0), (200, 200));
    assert_eq!(page_one.1["transactions"], page_two.1["transactions"]);
    assert_eq!(server.txn_ids("c1").await, ["t2", "t1"], "newest first");

    // Undated: the event clock refuses it by name (the slow path), the system clock stamps it.
    let mut undated = line("c3", "t3", T0);
    undated.as_object_mut().unwrap().remove("at");
    let (status, body) = server.post("/sim/v1/events", &json!([undated.clone()])).await;
    assert_eq!((status, body["field"].as_str(), body["index"].as_u64()), (400, Some("at"), Some(0)));
    let system = start(SimClock::System).await;
    assert_eq!(system.post("/sim/v1/events", &json!([undated])).await, (200, json!({"applied": 1})));
    assert_eq!(system.txn_ids("c3").await, ["t3"]);
}

#[tokio::test]
async fn malformed_and_oversized_batches_are_refused_whole() {
    let server = start(SimClock::Event).await;
    let (status, body) = server.post_raw("/sim/v1/events", "{not json").await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_body")));
    let (status, body) = server.post("/sim/v1/events", &json!([line("c1", "t1", T0), 5])).await;
    assert_eq!((status, body["index"].as_u64()), (400, Some(1)));
    let (status, body) = server.post("/sim/v1/events", &json!("wallet_line")).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_body")));
    let mut unknown = line("c1", "t2", T0);
    unknown["extra"] = json!(1);
    let (status, body) = server.post("/sim/v1/events", &unknown).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("extra")));
    let bad_enum = json!({"type": "wallet_fault", "at": T0, "card_id": "c1", "fault": "on_fire"});
    assert_eq!(server.post("/sim/v1/events", &bad_enum).await.0, 400);

    // Counted before any event is read, so even empty objects are too many.
    let many = Value::Array((0..=EVENTS_PER_REQUEST_MAX).map(|_| json!({})).collect());
    let (status, body) = server.post("/sim/v1/events", &many).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("too_many_events")));
    let huge = format!("[{}]", " ".repeat(BODY_BYTES_MAX));
    let (status, body) = server.post_raw("/sim/v1/events", huge).await;
    assert_eq!((status, body["error"].as_str()), (413, Some("body_too_large")));
    assert!(server.txn_ids("c1").await.is_empty(), "part of a refused batch was applied");
    assert_eq!(server.post("/sim/v1/events", &json!([])).await, (200, json!({"applied": 0})));
}

#[tokio::test]
async fn latency_settings_are_bounded() {
    let server = start(SimClock::Event).await;
    let (status, body) = server.post("/sim/v1/latency", &json!({"card_id": "c1", "delay_ms": 60_001})).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("delay_ms")));
    let (status, body) = server.post("/sim/v1/latency", &json!({"card_id": "c1", "delay_ms": 5, "jitter": 1})).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("jitter")));
    let (status, body) = server.post("/sim/v1/latency", &json!({"card_id": "c1", "delay_ms": 60_000})).await;
    assert_eq!((status, body), (200, json!({"card_id": "c1", "delay_ms": 60_000})));
}

#[tokio::test]
async fn the_number_of_cards_is_bounded() {
    let server = start(SimClock::Event).await;
    let batch = |offset: usize| {
        let events = (offset..offset + EVENTS_PER_REQUEST_MAX)
            .map(|n| json!({"type": "wallet_fault", "at": T0, "card_id": format!("c{n}"), "fault": "none"}));
        Value::Array(events.collect())
    };
    for offset in (0..SIM_CARDS_MAX).step_by(EVENTS_PER_REQUEST_MAX) {
        let (status, body) = server.post("/sim/v1/events", &batch(offset)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = server.post("/sim/v1/events", &json!([line("c0", "t1", T0), line("new", "t1", T0)])).await;
    assert_eq!((status, body["error"].as_str()), (422, Some("too_many_cards")));
    assert!(server.txn_ids("c0").await.is_empty(), "a refused batch was applied in part");
    assert_eq!(server.post("/sim/v1/events", &line("c0", "t1", T0)).await.0, 200, "known cards still take events");
}

#[test]
fn clock_names_parse_and_print() {
    assert_eq!("system".parse::<SimClock>(), Ok(SimClock::System));
    assert_eq!("event".parse::<SimClock>(), Ok(SimClock::Event));
    assert!("wall".parse::<SimClock>().is_err());
    assert_eq!(SimClock::Event.to_string(), "event");
}
