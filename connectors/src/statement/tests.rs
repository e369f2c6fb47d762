//! The connector against the real wallet simulator served over HTTP (and, for contract breaches the
//! simulator never commits, a deliberately misbehaving provider).

use super::source::percent_encode;
use super::{ConnectorError, StatementConfig, StatementConnector};
use crate::wallet_sim_http::{serve_state, SimClock, WalletSimState};
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use pipelines::input::{parse_input_object, Command, CrawlError, CrawlResult, Provider};
use pipelines::output::{CrawlMode, CrawlRequested, PageOrder};
use pipelines::wallet_sim::WalletSim;
use pipelines::Timestamp;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const T0: &str = "2026-03-02T09:30:00Z";

fn at(seconds: i64) -> Timestamp {
    Timestamp::parse(T0).unwrap().plus_seconds(seconds)
}

/// A running wallet simulator; dropping it shuts the server down.
struct Sim {
    base_url: String,
    state: WalletSimState,
    http: reqwest::Client,
    _shutdown: oneshot::Sender<()>,
}

async fn start_sim(clock: SimClock) -> Sim {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let state = WalletSimState::new(clock);
    let (shutdown, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve_state(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    Sim { base_url, state, http: reqwest::Client::new(), _shutdown: shutdown }
}

impl Sim {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self.http.post(format!("{}{path}", self.base_url)).json(body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn post_events(&self, events: &Value) {
        let (status, body) = self.post("/sim/v1/events", events).await;
        assert_eq!(status, 200, "events refused: {body}");
    }

    async fn set_latency(&self, card_id: &str, delay_ms: u64) {
        let (status, body) = self.post("/sim/v1/latency", &json!({"card_id": card_id, "delay_ms": delay_ms})).await;
        assert_eq!(status, 200, "latency refused: {body}");
    }

    fn connector(&self, adjust: impl FnOnce(&mut StatementConfig)) -> StatementConnector {
        let mut config = StatementConfig::new(&self.base_url);
        adjust(&mut config);
        StatementConnector::new(&config).unwrap()
    }
}

fn line_event(card_id: &str, txn_id: &str, added_s: i64, time_s: i64, ifsc: Option<&str>) -> Value {
    let mut line = json!({
        "txn_id": txn_id, "utr": format!("UTR{txn_id}"), "direction": "in", "amount": "456.00",
        "status": "success", "time": at(time_s).to_string(), "counterparty": {"vpa": "payer@upi", "name": "A"},
    });
    if let Some(ifsc) = ifsc {
        line["payee_ifsc"] = json!(ifsc);
    }
    json!({"type": "wallet_line", "at": at(added_s).to_string(), "card_id": card_id, "line": line})
}

fn fault_event(card_id: &str, added_s: i64, fault: &str) -> Value {
    json!({"type": "wallet_fault", "at": at(added_s).to_string(), "card_id": card_id, "fault": fault})
}

/// What replay's simulator holds after the same events, and its clock (the largest `at`).
fn replay_sim(events: &[Value]) -> (WalletSim, Timestamp) {
    let mut sim = WalletSim::default();
    let mut now = Timestamp::default();
    for event in events {
        let input = parse_input_object(&mut event.as_object().unwrap().clone(), || "e".to_string()).unwrap();
        match input.command {
            Command::WalletLine(event) => sim.add_line(&event.card_id, *event.line, input.at),
            Command::WalletLineStatus(event) => sim.set_status(&event.card_id, &event.txn_id, event.status, input.at),
            Command::WalletFault(event) => sim.set_fault(&event.card_id, event.fault, input.at),
            other => panic!("not a wallet event: {other:?}"),
        }
        now = now.max(input.at);
    }
    (sim, now)
}

fn list(card_id: &str, order: Option<PageOrder>, from: Option<Timestamp>, limit: Option<u32>) -> CrawlRequested {
    let mode = if order == Some(PageOrder::Asc) { CrawlMode::OrderCheck } else { CrawlMode::Reservoir };
    CrawlRequested {
        request_id: format!("{card_id}:1").into(),
        user_id: "u1".into(),
        card_id: card_id.into(),
        provider: Provider::Phonepe,
        mode,
        order,
        from,
        limit,
        txn_id: None,
    }
}

fn detail(card_id: &str, txn_id: &str) -> CrawlRequested {
    CrawlRequested { mode: CrawlMode::Detail, txn_id: Some(txn_id.into()), ..list(card_id, None, None, None) }
}

fn assert_error(result: &CrawlResult, error: CrawlError) {
    assert!(!result.ok, "expected {error:?}, got {result:?}");
    assert_eq!(result.error, Some(error));
    assert!(result.lines.is_empty() && result.next_from.is_none());
}

/// Five visible lines a minute apart, one added but dated in the future, one status change.
fn statement_events() -> Vec<Value> {
    let mut events: Vec<Value> = (0..5).map(|n| line_event("c1", &format!("t{n}"), n * 60, n * 60, None)).collect();
    events.push(line_event("c1", "future", 240, 900, None));
    events.push(json!({"type": "wallet_line_status", "at": at(240).to_string(), "card_id": "c1", "txn_id": "t3",
        "status": "failed"}));
    events
}

#[tokio::test]
async fn an_ascending_page_from_a_time_equals_replays_answer() {
    let sim = start_sim(SimClock::Event).await;
    let events = statement_events();
    sim.post_events(&Value::Array(events.clone())).await;
    let (replay, now) = replay_sim(&events);
    let connector = sim.connector(|_| {});
    let request = list("c1", Some(PageOrder::Asc), Some(at(60)), Some(2));
    let result = connector.crawl(&request).await;
    assert_eq!(result, replay.result(&request, now));
    let txn_ids: Vec<&str> = result.lines.iter().map(|line| line.txn_id.as_str()).collect();
    assert_eq!(txn_ids, ["t1", "t2"]);
    assert_eq!(result.next_from, Some(at(120)));
    assert_eq!((result.request_id.as_str(), result.user_id.as_str(), result.card_id.as_str()), ("c1:1", "u1", "c1"));
}

#[tokio::test]
async fn a_descending_page_equals_replays_answer() {
    let sim = start_sim(SimClock::Event).await;
    let events = statement_events();
    sim.post_events(&Value::Array(events.clone())).await;
    let (replay, now) = replay_sim(&events);
    let connector = sim.connector(|_| {});
    let limited = list("c1", Some(PageOrder::Desc), None, Some(3));
    let result = connector.crawl(&limited).await;
    assert_eq!(result, replay.result(&limited, now));
    let txn_ids: Vec<&str> = result.lines.iter().map(|line| line.txn_id.as_str()).collect();
    assert_eq!(txn_ids, ["t4", "t3", "t2"]);
    assert_eq!(result.lines[1].status, pipelines::input::LineStatus::Failed);
    let unlimited = list("c1", None, None, None);
    let result = connector.crawl(&unlimited).await;
    assert_eq!(result, replay.result(&unlimited, now));
    assert_eq!((result.lines.len(), result.next_from), (5, None));
}

/// On the event clock the connector asks for each answer as of its event time (`paisa-as-of`): the
/// simulator then answers as replay's provider did at that time, though later events were posted.
#[tokio::test]
async fn an_answer_as_of_an_earlier_time_equals_replays_answer_then() {
    let sim = start_sim(SimClock::Event).await;
    let events = statement_events();
    sim.post_events(&Value::Array(events.clone())).await;
    let connector = sim.connector(|_| {});
    let request = list("c1", Some(PageOrder::Desc), None, Some(50));
    let (replay, _) = replay_sim(&events[..3]);
    let result = connector.crawl_as_of(&request, Some(at(150))).await;
    assert_eq!(result, replay.result(&request, at(150)));
    let txn_ids: Vec<&str> = result.lines.iter().map(|line| line.txn_id.as_str()).collect();
    assert_eq!(txn_ids, ["t2", "t1", "t0"], "lines added after 150 s are not shown");
    let (_, now) = replay_sim(&events);
    let later = connector.crawl_as_of(&request, Some(at(3_600))).await;
    assert_eq!(later.lines.len(), 5, "never later than the clock ({now}): the future line stays hidden");
    let detail_then = connector.crawl_as_of(&detail("c1", "t4"), Some(at(150))).await;
    assert_error(&detail_then, CrawlError::DetailUnavailable);
}

#[tokio::test]
async fn only_detail_answers_carry_the_payee_ifsc() {
    let sim = start_sim(SimClock::Event).await;
    let events = vec![line_event("c1", "t1", 0, 0, Some("HDFC0001234"))];
    sim.post_events(&Value::Array(events.clone())).await;
    let (replay, now) = replay_sim(&events);
    let connector = sim.connector(|_| {});
    let result = connector.crawl(&detail("c1", "t1")).await;
    assert_eq!(result, replay.result(&detail("c1", "t1"), now));
    assert!(result.ok);
    assert_eq!(result.lines.len(), 1);
    assert_eq!(result.lines[0].payee_ifsc.as_deref(), Some("HDFC0001234"));
    let page = connector.crawl(&list("c1", Some(PageOrder::Desc), None, Some(50))).await;
    assert!(page.ok);
    assert_eq!(page.lines.len(), 1);
    assert_eq!(page.lines[0].payee_ifsc, None);
}

#[tokio::test]
async fn an_expired_session_is_reported_on_lists_and_details() {
    let sim = start_sim(SimClock::Event).await;
    sim.post_events(&json!([line_event("c1", "t1", 0, 0, None), fault_event("c1", 1, "session_expired")])).await;
    let connector = sim.connector(|_| {});
    assert_error(
        &connector.crawl(&list("c1", Some(PageOrder::Asc), Some(at(0)), Some(50))).await,
        CrawlError::SessionExpired,
    );
    assert_error(&connector.crawl(&detail("c1", "t1")).await, CrawlError::SessionExpired);
    // Clearing the fault brings the statement back.
    sim.post_events(&fault_event("c1", 2, "none")).await;
    assert!(connector.crawl(&list("c1", None, None, None)).await.ok);
}

#[tokio::test]
async fn a_busy_provider_is_reported_as_upstream_busy() {
    let sim = start_sim(SimClock::Event).await;
    sim.post_events(&json!([line_event("c1", "t1", 0, 0, None), fault_event("c1", 1, "upstream_busy")])).await;
    let connector = sim.connector(|_| {});
    assert_error(&connector.crawl(&list("c1", Some(PageOrder::Desc), None, Some(50))).await, CrawlError::UpstreamBusy);
    // SPEC §10: a detail call's 5xx is detail_unavailable (replay says upstream_busy; the agent stage
    // treats both alike for a detail).
    assert_error(&connector.crawl(&detail("c1", "t1")).await, CrawlError::DetailUnavailable);
    // One call per request, refused or not: asking again is the pipeline's decision (R-CHK-3).
    assert_eq!(sim.state.stats().card_requests, 2, "a refused call was retried");
}

#[tokio::test]
async fn the_detail_of_an_unknown_transaction_is_unavailable() {
    let sim = start_sim(SimClock::Event).await;
    sim.post_events(&line_event("c1", "t1", 0, 0, None)).await;
    let connector = sim.connector(|_| {});
    assert_error(&connector.crawl(&detail("c1", "nope")).await, CrawlError::DetailUnavailable);
    assert_error(&connector.crawl(&detail("unknown-card", "t1")).await, CrawlError::DetailUnavailable);
    assert!(connector.crawl(&detail("c1", "t1")).await.ok);
}

#[tokio::test]
async fn a_detail_unavailable_fault_spares_lists() {
    let sim = start_sim(SimClock::Event).await;
    sim.post_events(&json!([line_event("c1", "t1", 0, 0, None), fault_event("c1", 1, "detail_unavailable")])).await;
    let connector = sim.connector(|_| {});
    assert_error(&connector.crawl(&detail("c1", "t1")).await, CrawlError::DetailUnavailable);
    let page = connector.crawl(&list("c1", Some(PageOrder::Desc), None, Some(50))).await;
    assert!(page.ok);
    assert_eq!(page.lines.len(), 1);
}

#[tokio::test]
async fn an_answer_slower_than_the_request_timeout_is_a_failure() {
    let sim = start_sim(SimClock::Event).await;
    sim.post_events(&json!([line_event("slow", "t1", 0, 0, None), line_event("fast", "t2", 0, 0, None)])).await;
    sim.set_latency("slow", 2_000).await;
    let connector = sim.connector(|config| config.request_timeout_ms = 200);
    let started = Instant::now();
    assert_error(&connector.crawl(&list("slow", None, None, None)).await, CrawlError::UpstreamBusy);
    assert_error(&connector.crawl(&detail("slow", "t1")).await, CrawlError::DetailUnavailable);
    assert!(started.elapsed() < Duration::from_millis(1_500), "timed out after {:?}", started.elapsed());
    assert!(connector.crawl(&list("fast", None, None, None)).await.ok);
    // Clearing the latency makes the slow card answer again.
    sim.set_latency("slow", 0).await;
    assert!(connector.crawl(&list("slow", None, None, None)).await.ok);
}

#[tokio::test]
async fn a_bad_wallet_event_is_refused_and_nothing_is_applied() {
    let sim = start_sim(SimClock::Event).await;
    let mut bad = line_event("c1", "t2", 60, 60, None);
    bad["line"]["colour"] = json!("red");
    let (status, body) = sim.post("/sim/v1/events", &json!([line_event("c1", "t1", 0, 0, None), bad])).await;
    assert_eq!(status, 400);
    assert_eq!(
        (body["error"].as_str(), body["index"].as_u64(), body["field"].as_str()),
        (Some("invalid_event"), Some(1), Some("colour"))
    );
    let (status, body) = sim.post("/sim/v1/events", &json!({"type": "tick", "at": T0})).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("type")));
    let connector = sim.connector(|_| {});
    let page = connector.crawl(&list("c1", None, None, None)).await;
    assert!(page.ok);
    assert!(page.lines.is_empty(), "the valid half of a refused batch was applied: {page:?}");
    assert_eq!(sim.state.now(), None, "a refused batch moved the clock");
}

#[tokio::test]
async fn calls_per_provider_are_bounded() {
    let sim = start_sim(SimClock::Event).await;
    let cards = ["c1", "c2", "c3", "c4"];
    for card in cards {
        sim.post_events(&line_event(card, "t1", 0, 0, None)).await;
        sim.set_latency(card, 300).await;
    }
    let connector = sim.connector(|config| config.concurrent_requests_per_provider_max = 2);
    let requests: Vec<CrawlRequested> = cards.iter().map(|card| list(card, None, None, None)).collect();
    let results = crawl_all(connector, requests).await;
    assert!(results.iter().all(|result| result.ok && result.lines.len() == 1), "{results:?}");
    let stats = sim.state.stats();
    assert_eq!((stats.in_flight_max, stats.card_requests, stats.in_flight), (2, 4, 0));
}

#[tokio::test]
async fn each_provider_has_its_own_bound() {
    let sim = start_sim(SimClock::Event).await;
    for card in ["p1", "m1"] {
        sim.post_events(&line_event(card, "t1", 0, 0, None)).await;
        sim.set_latency(card, 300).await;
    }
    let connector = sim.connector(|config| config.concurrent_requests_per_provider_max = 1);
    let phonepe = list("p1", None, None, None);
    let mobikwik = CrawlRequested { provider: Provider::Mobikwik, ..list("m1", None, None, None) };
    let results = crawl_all(connector, vec![phonepe, mobikwik]).await;
    assert!(results.iter().all(|result| result.ok));
    assert_eq!(sim.state.stats().in_flight_max, 2, "one provider's calls waited for another's");
}

/// Runs the crawls concurrently, each on its own task (also proving the connector is `Send + Sync`).
async fn crawl_all(connector: StatementConnector, requests: Vec<CrawlRequested>) -> Vec<CrawlResult> {
    let connector = std::sync::Arc::new(connector);
    let mut tasks = tokio::task::JoinSet::new();
    for request in requests {
        let connector = std::sync::Arc::clone(&connector);
        tasks.spawn(async move { connector.crawl(&request).await });
    }
    tasks.join_all().await
}

#[tokio::test]
async fn ids_with_any_characters_reach_the_provider_intact() {
    let sim = start_sim(SimClock::Event).await;
    let connector = sim.connector(|_| {});
    let txn_id = "t/1?x=1#frag %25 ü";
    for card_id in ["a/b", "a?b#c", "100%", "sp ace", "ünï", r"a\b", "%2e%2e", "x|y^[z]{}`\"<>", "...", ".a", "+&="] {
        sim.post_events(&line_event(card_id, txn_id, 0, 0, None)).await;
        let page = connector.crawl(&list(card_id, Some(PageOrder::Asc), Some(at(0)), Some(5))).await;
        assert!(page.ok, "card {card_id:?}: {page:?}");
        assert_eq!(
            page.lines.iter().map(|line| line.txn_id.as_str()).collect::<Vec<_>>(),
            [txn_id],
            "card {card_id:?}"
        );
        let found = connector.crawl(&detail(card_id, txn_id)).await;
        assert!(found.ok && found.lines[0].txn_id == txn_id, "card {card_id:?}: {found:?}");
    }
}

#[tokio::test]
async fn ids_no_url_can_carry_are_refused_without_a_call() {
    let sim = start_sim(SimClock::Event).await;
    let connector = sim.connector(|_| {});
    for card_id in ["", ".", ".."] {
        assert_error(&connector.crawl(&list(card_id, None, None, None)).await, CrawlError::UpstreamBusy);
        assert_error(&connector.crawl(&detail(card_id, "t1")).await, CrawlError::DetailUnavailable);
    }
    assert_error(&connector.crawl(&detail("c1", "..")).await, CrawlError::DetailUnavailable);
    assert_eq!(sim.state.stats().card_requests, 0);
}

#[tokio::test]
async fn the_limit_is_lowered_to_page_limit_max() {
    let sim = start_sim(SimClock::Event).await;
    let events: Vec<Value> = (0..4).map(|n| line_event("c1", &format!("t{n}"), n, n, None)).collect();
    sim.post_events(&Value::Array(events)).await;
    let connector = sim.connector(|config| config.page_limit_max = 2);
    let page = connector.crawl(&list("c1", Some(PageOrder::Asc), Some(at(0)), Some(50))).await;
    assert!(page.ok);
    assert_eq!(page.lines.len(), 2);
    assert_eq!(page.next_from, Some(at(1)));
}

#[tokio::test]
async fn an_unreachable_provider_is_a_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let connector = StatementConnector::new(&StatementConfig::new(format!("http://{address}"))).unwrap();
    assert_error(&connector.crawl(&list("c1", None, None, None)).await, CrawlError::UpstreamBusy);
    assert_error(&connector.crawl(&detail("c1", "t1")).await, CrawlError::DetailUnavailable);
}

/// A page written with spaces, keys in another order and nulls: within the contract.
const SPACED_PAGE: &str = r#"{ "next_from" : null, "transactions" : [ {"time": "2026-03-02T09:00:00Z", "txn_id": "s1",
    "amount": "5.00", "direction": "in", "status": "success", "utr": null, "counterparty": null} ] }"#;

/// A provider that breaks the contract in the way its card id names.
async fn misbehaving(Path(path): Path<Vec<String>>) -> Response {
    let page_line = |txn_id: &str| {
        json!({"txn_id": txn_id, "utr": null, "direction": "in", "amount": "1.00", "status": "success",
            "time": T0, "counterparty": {}})
    };
    let card = path.first().map(String::as_str).unwrap_or_default();
    match card {
        "garbage" => (StatusCode::OK, "not json").into_response(),
        "extra_field" => axum::Json(json!({"transactions": [], "next_from": null, "cursor": 1})).into_response(),
        "too_many" => {
            axum::Json(json!({"transactions": [page_line("a"), page_line("b"), page_line("c")]})).into_response()
        }
        "other_txn" => axum::Json(page_line("someone-else")).into_response(),
        "bad_line" => {
            axum::Json(json!({"transactions": [page_line("a"), {"txn_id": "b", "status": "pending"}]})).into_response()
        }
        "not_a_list" => axum::Json(json!({"transactions": "t1"})).into_response(),
        "spaced" => (StatusCode::OK, SPACED_PAGE).into_response(),
        "busy" => StatusCode::TOO_MANY_REQUESTS.into_response(),
        "broken" => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        "gone" => StatusCode::NOT_FOUND.into_response(),
        "expired" => (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "session_expired"}))).into_response(),
        "moved" => (StatusCode::FOUND, [("location", "/v1/cards/garbage/transactions")]).into_response(),
        _ => axum::Json(json!({"transactions": [page_line("ok")], "next_from": null})).into_response(),
    }
}

async fn start_misbehaving() -> StatementConnector {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/v1/cards/{card}/transactions", get(|Path(card): Path<String>| misbehaving(Path(vec![card]))))
        .route(
            "/v1/cards/{card}/transactions/{txn}",
            get(|Path((card, txn)): Path<(String, String)>| misbehaving(Path(vec![card, txn]))),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    StatementConnector::new(&StatementConfig::new(base_url)).unwrap()
}

#[tokio::test]
async fn contract_breaches_map_to_the_calls_failure() {
    let connector = start_misbehaving().await;
    assert!(connector.crawl(&list("fine", None, None, None)).await.ok, "the control answer failed");
    let cases = [
        ("garbage", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
        ("extra_field", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
        ("busy", CrawlError::UpstreamBusy, CrawlError::UpstreamBusy),
        ("broken", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
        ("gone", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
        ("expired", CrawlError::SessionExpired, CrawlError::SessionExpired),
        ("moved", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
        ("other_txn", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
        ("bad_line", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
        ("not_a_list", CrawlError::UpstreamBusy, CrawlError::DetailUnavailable),
    ];
    for (card, list_error, detail_error) in cases {
        let page = connector.crawl(&list(card, None, None, Some(2))).await;
        assert_eq!(page.error, Some(list_error), "list of {card}: {page:?}");
        let line = connector.crawl(&detail(card, "t1")).await;
        assert_eq!(line.error, Some(detail_error), "detail of {card}: {line:?}");
    }
    let page = connector.crawl(&list("too_many", None, None, Some(2))).await;
    assert_error(&page, CrawlError::UpstreamBusy);
}

/// A page's answer keeps its lines' JSON array exactly as the provider wrote it, for the record
/// (`Crawled::lines_json`); the lines read from it are the answer's. Details and errors keep none.
#[tokio::test]
async fn a_page_keeps_the_providers_text_of_its_lines() {
    let connector = start_misbehaving().await;
    let page = connector.crawl_keeping_page_as_of(&list("spaced", None, None, Some(2)), None).await;
    assert!(page.result.ok, "{page:?}");
    let kept = String::from_utf8(page.lines_json.clone().expect("a page keeps its text")).expect("UTF-8");
    let array_start = SPACED_PAGE.find('[').expect("an array");
    let array_end = SPACED_PAGE.rfind(']').expect("an array") + 1;
    assert_eq!(kept, SPACED_PAGE[array_start..array_end]);
    let reread: Vec<pipelines::input::StatementLine> = serde_json::from_str(&kept).expect("lines");
    assert_eq!(reread, page.result.lines);
    assert_eq!(page.result.lines[0].txn_id, "s1");
    let line = connector.crawl_keeping_page_as_of(&detail("other_txn", "someone-else"), None).await;
    assert!(line.result.ok && line.lines_json.is_none(), "{line:?}");
    let refused = connector.crawl_keeping_page_as_of(&list("busy", None, None, None), None).await;
    assert!(!refused.result.ok && refused.lines_json.is_none(), "{refused:?}");
}

/// The text kept for a page's lines is its `transactions` array wherever it sits in the body, whatever
/// brackets its lines' strings hold, and reads back as the page's lines.
#[test]
fn a_pages_lines_text_is_its_transactions_array() {
    let line = r#"{"txn_id":"x[1]","direction":"in","amount":"1.00","status":"success","time":"2026-03-02T09:00:00Z",
        "counterparty":{"name":"] \"[ \u005d"}}"#;
    let cases = [
        ("{\"transactions\":[]}".to_string(), "[]".to_string()),
        (format!("{{\"transactions\":[{line}],\"next_from\":null}}"), format!("[{line}]")),
        (
            format!(" {{ \"next_from\" : \"2026-03-02T09:01:00Z\" ,\n \"transactions\" : [ {line} , {line} ] }} \n"),
            format!("[ {line} , {line} ]"),
        ),
        (format!("{{\"transaction\\u0073\":[{line}]}}"), format!("[{line}]")),
    ];
    for (body, array) in cases {
        let answer = super::source::parse_page(body.as_bytes(), 50).expect("a page");
        let kept = answer.lines_json.expect("a page keeps its text");
        assert_eq!(String::from_utf8(kept.clone()).expect("UTF-8"), array, "{body}");
        let reread: Vec<pipelines::input::StatementLine> = serde_json::from_slice(&kept).expect("lines");
        assert_eq!(reread, answer.lines, "{body}");
    }
    assert!(super::source::parse_page(b"{\"transactions\":[],\"x\":[1]}", 50).is_err(), "unknown fields still fail");
}

#[test]
fn construction_refuses_bad_settings() {
    let build = |adjust: &dyn Fn(&mut StatementConfig)| {
        let mut config = StatementConfig::new("http://127.0.0.1:9");
        adjust(&mut config);
        StatementConnector::new(&config)
    };
    assert!(build(&|_| {}).is_ok());
    for url in ["not a url", "https://provider.example", "ftp://provider.example", "http://h/?q=1", "http://h/#f"] {
        let result = build(&|config| config.base_url = url.to_string());
        assert!(matches!(result, Err(ConnectorError::BaseUrl { .. })), "accepted {url}");
    }
    let zero_slots = build(&|config| config.concurrent_requests_per_provider_max = 0);
    assert!(matches!(zero_slots, Err(ConnectorError::Setting { field: "concurrent_requests_per_provider_max", .. })));
    let zero_timeout = build(&|config| config.request_timeout_ms = 0);
    assert!(matches!(zero_timeout, Err(ConnectorError::Setting { field: "request_timeout_ms", .. })));
    let zero_page = build(&|config| config.page_limit_max = 0);
    assert!(matches!(zero_page, Err(ConnectorError::Setting { field: "page_limit_max", .. })));
}

#[test]
fn the_configuration_has_defaults_and_refuses_unknown_keys() {
    let config: StatementConfig = serde_json::from_value(json!({"base_url": "http://p"})).unwrap();
    assert_eq!(config, StatementConfig::new("http://p"));
    assert_eq!(
        (
            config.request_timeout_ms,
            config.connect_timeout_ms,
            config.concurrent_requests_per_provider_max,
            config.page_limit_max
        ),
        (5_000, 1_000, 8, 200)
    );
    assert!(serde_json::from_value::<StatementConfig>(json!({"base_url": "http://p", "timeout": 1})).is_err());
    assert!(serde_json::from_value::<StatementConfig>(json!({})).is_err());
}

#[test]
fn percent_encoding_keeps_only_unreserved_characters() {
    assert_eq!(percent_encode("aZ9-._~"), "aZ9-._~");
    assert_eq!(percent_encode("a/b?c#d%e f"), "a%2Fb%3Fc%23d%25e%20f");
    assert_eq!(percent_encode("ü"), "%C3%BC");
    assert_eq!(percent_encode("2026-03-02T09:30:00Z"), "2026-03-02T09%3A30%3A00Z");
}

/// Each call's URL is the base URL with its path and query set (no whole URL parsed per call): it must
/// be the URL its text parses to, the text the connector wrote before (one string, parsed whole), under
/// a base URL with a path of its own too.
#[test]
fn a_calls_url_is_the_base_url_with_the_calls_path_and_query() {
    for base in ["http://127.0.0.1:9", "http://127.0.0.1:9/", "http://provider.example/wallets/v2/"] {
        let connector = StatementConnector::new(&StatementConfig::new(base)).unwrap();
        let prefix = base.trim_end_matches('/');
        let cases = [
            (list("c1", None, None, None), format!("{prefix}/v1/cards/c1/transactions")),
            (
                list("a/b ü", Some(PageOrder::Asc), Some(at(0)), Some(5)),
                format!(
                    "{prefix}/v1/cards/a%2Fb%20%C3%BC/transactions?order=asc&from=2026-03-02T09%3A30%3A00Z&limit=5"
                ),
            ),
            (
                list("c1", Some(PageOrder::Desc), None, Some(500)),
                format!("{prefix}/v1/cards/c1/transactions?order=desc&limit=200"),
            ),
            (
                list("c1", None, Some(at(1)), None),
                format!("{prefix}/v1/cards/c1/transactions?from=2026-03-02T09%3A30%3A01Z"),
            ),
            (detail("%2e%2e", "t/1?x#y"), format!("{prefix}/v1/cards/%252e%252e/transactions/t%2F1%3Fx%23y")),
        ];
        for (request, expected) in cases {
            let url = connector.planned_url(&request).expect("a URL");
            assert_eq!(url.as_str(), expected, "base {base}");
            assert_eq!(url, reqwest::Url::parse(&expected).unwrap(), "base {base}: the URL its text parses to");
        }
        assert_eq!(connector.planned_url(&list("..", None, None, None)), None);
    }
}

/// A provider written by hand, to watch the client's connections: it counts those it accepted and
/// those that ended, answers each request with what `answer` gives for its number (from 0, over all
/// connections), holds every answer until `hold_until` requests have arrived, and closes a connection
/// after its first answer when `close_after_answer` is set.
struct RawProvider {
    address: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ended: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// What a [`RawProvider`] answers, and how (shared by its connections).
#[derive(Clone)]
struct RawAnswers {
    answer: fn(usize) -> (u16, String),
    hold_until: usize,
    close_after_answer: bool,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    arrived: std::sync::Arc<tokio::sync::Notify>,
}

async fn start_raw_provider(
    answer: fn(usize) -> (u16, String),
    hold_until: usize,
    close_after_answer: bool,
) -> RawProvider {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (accepted, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let provider = RawProvider { address, accepted: accepted.clone(), ended: ended.clone() };
    let answers =
        RawAnswers { answer, hold_until, close_after_answer, requests: Arc::default(), arrived: Arc::default() };
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            accepted.fetch_add(1, Ordering::SeqCst);
            let (answers, ended) = (answers.clone(), ended.clone());
            tokio::spawn(async move {
                serve_raw_connection(stream, answers).await;
                ended.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    provider
}

/// Answers the requests of one connection until the client closes it (or after the first answer).
async fn serve_raw_connection(mut stream: tokio::net::TcpStream, answers: RawAnswers) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        // A GET has no body: a request is everything up to its blank line.
        let Some(end) = received.windows(4).position(|window| window == b"\r\n\r\n") else {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => received.extend_from_slice(&buffer[..read]),
            }
            continue;
        };
        received.drain(..end + 4);
        let number = answers.requests.fetch_add(1, Ordering::SeqCst);
        answers.arrived.notify_waiters();
        while answers.requests.load(Ordering::SeqCst) < answers.hold_until {
            // Registered before the check, so an arrival between the two still wakes it.
            let notified = answers.arrived.notified();
            if answers.requests.load(Ordering::SeqCst) >= answers.hold_until {
                break;
            }
            notified.await;
        }
        let (status, body) = (answers.answer)(number);
        let response = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        if stream.write_all(response.as_bytes()).await.is_err() || answers.close_after_answer {
            return;
        }
    }
}

impl RawProvider {
    fn client(&self, idle_connections_max: usize) -> super::client::ProviderClient {
        let base_url = reqwest::Url::parse(&format!("http://{}", self.address)).unwrap();
        super::client::ProviderClient::new(
            &base_url,
            idle_connections_max,
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
        .unwrap()
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn ended(&self) -> usize {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits (up to 2 s) until `count` connections have ended; the count then.
    async fn ended_after_waiting_for(&self, count: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.ended() < count && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.ended()
    }
}

const EMPTY_PAGE: &str = r#"{"transactions":[],"next_from":null}"#;

/// Calls one after another share one connection, whatever their status: a refusal's body is read too,
/// so the connection is ready for the next call.
#[tokio::test]
async fn calls_in_turn_share_one_connection_whatever_their_status() {
    let provider = start_raw_provider(
        |number| if number % 2 == 0 { (429, r#"{"error":"busy"}"#.into()) } else { (200, EMPTY_PAGE.into()) },
        0,
        false,
    )
    .await;
    let client = provider.client(4);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let answered = client.get("/v1/cards/c1/transactions", None).await.expect("an answer");
        statuses.push(answered.status.as_u16());
        let expected = if answered.status == 200 { EMPTY_PAGE } else { r#"{"error":"busy"}"# };
        assert_eq!(answered.body, expected.as_bytes());
    }
    assert_eq!(statuses, [429, 200, 429, 200]);
    assert_eq!(provider.accepted(), 1, "one connection for four calls in turn");
}

/// A connection the provider closed while it was idle is not used again: the next call opens another.
#[tokio::test]
async fn a_connection_the_provider_closed_is_replaced() {
    let provider = start_raw_provider(|_| (200, EMPTY_PAGE.into()), 0, true).await;
    let client = provider.client(4);
    for call in 1..=3 {
        let answered = client.get("/v1/cards/c1/transactions", None).await.expect("an answer");
        assert_eq!(answered.status, 200, "call {call}");
        // Let the client see the close before the next call takes a connection.
        provider.ended_after_waiting_for(call).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(provider.accepted(), 3, "each call on a connection of its own");
}

/// Connections beyond `idle_connections_max` are closed once their call is answered, and a kept one
/// serves the next call.
#[tokio::test]
async fn idle_connections_beyond_the_bound_are_closed() {
    // Three calls at once: the provider answers none before all three arrived, so each has its own
    // connection.
    let provider = start_raw_provider(|_| (200, EMPTY_PAGE.into()), 3, false).await;
    let client = provider.client(1);
    let target = "/v1/cards/c1/transactions";
    let (first, second, third) =
        tokio::join!(client.get(target, None), client.get(target, None), client.get(target, None));
    for answered in [first, second, third] {
        assert_eq!(answered.expect("an answer").status, 200);
    }
    assert_eq!(provider.accepted(), 3);
    assert_eq!(provider.ended_after_waiting_for(2).await, 2, "two of the three connections closed, one kept");
    let answered = client.get("/v1/cards/c1/transactions", None).await.expect("an answer");
    assert_eq!(answered.status, 200);
    assert_eq!(provider.accepted(), 3, "the kept connection served the next call");
}

/// A body announced larger than `RESPONSE_BYTES_MAX` is refused before it is read, and the connector
/// answers the call's failure.
#[tokio::test]
async fn a_body_over_the_bound_is_a_failure() {
    let provider = start_raw_provider(|_| (200, " ".repeat(super::RESPONSE_BYTES_MAX + 1)), 0, false).await;
    let error = provider.client(1).get("/v1/cards/c1/transactions", None).await.err();
    assert!(matches!(error, Some(super::client::CallError::BodyTooLarge)), "{error:?}");
    let connector = StatementConnector::new(&StatementConfig::new(format!("http://{}", provider.address))).unwrap();
    assert_error(&connector.crawl(&list("c1", None, None, None)).await, CrawlError::UpstreamBusy);
}
