//! End-to-end tests of `paisa serve` and `paisa wallet-sim` as real processes on loopback: a scenario
//! driven through the HTTP API must leave the state `paisa replay` computes for the same events (SPEC §3:
//! inputs spaced apart), also when the server is killed with SIGKILL mid-stream, and clients posting at
//! once across kills have each input applied once; bad input over HTTP gets a 4xx and changes nothing;
//! merchant keys see only their own merchant.

use pipelines::partition::partition_of;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ADMIN_KEY: &str = "test-admin-key";
/// How long a test waits for the pipeline to become quiescent before failing.
const QUIESCENCE_TIMEOUT: Duration = Duration::from_secs(30);

fn scenario_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/service/spaced.jsonl")
}

/// A child process that is killed when dropped.
struct Process {
    child: Child,
    base: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `paisa ARGS` and reads the address it prints ("… listening on http://ADDR").
fn start(args: &[&str]) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_paisa"))
        .args(args)
        .env("PAISA_ADMIN_KEY", ADMIN_KEY)
        .env("RUST_LOG", "warn")
        // The services' own default for transparent huge pages, whatever the test runner's environment.
        .env_remove("MIMALLOC_ALLOW_THP")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("paisa starts");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("paisa prints its address");
    let base = line.trim().rsplit(' ').next().expect("an address").to_string();
    assert!(base.starts_with("http://"), "unexpected first line {line:?}");
    Process { child, base }
}

/// With a little memory faulted in at start, as the serve benchmark starts it (below).
fn start_wallet_sim() -> Process {
    start(&["wallet-sim", "--listen", "127.0.0.1:0", "--clock", "event", "--memory-prefault-mib", "16"])
}

/// With a little memory faulted in at start (`--memory-prefault-mib`), so that the end-to-end tests run
/// the service with the flag the serve benchmark passes.
fn start_serve(data_dir: &Path, provider: &str) -> Process {
    start_serve_with(data_dir, &["--statement-provider", provider, "--memory-prefault-mib", "16"])
}

/// `paisa serve` on the event clock with extra arguments (`--config`, `--statement-provider`, …).
fn start_serve_with(data_dir: &Path, extra: &[&str]) -> Process {
    let data_dir = data_dir.to_str().expect("a UTF-8 path");
    let mut args = vec!["serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0", "--clock", "event"];
    args.extend_from_slice(extra);
    let server = start(&args);
    wait_ready(&server.base);
    server
}

/// Writes SPEC §8 settings as a `--config` file in `dir`.
fn config_file(dir: &Path, settings: &Value) -> String {
    let path = dir.join("config.json");
    std::fs::write(&path, settings.to_string()).expect("the config file is written");
    path.to_str().expect("a UTF-8 path").to_string()
}

/// Registers merchant m1 with a deposit, and each (user, card) with a phonepe card and a recharge.
fn setup_events(at: &str, users: &[(&str, &str)]) -> Vec<Value> {
    let mut events = vec![
        json!({"type":"merchant_registered","at":at,"merchant_id":"m1","collection_fee_rate":"0.02",
            "payout_fee_rate":"0.01","payout_fee_fixed":"5.00","event_id":"setup:m1"}),
        json!({"type":"merchant_deposit","at":at,"merchant_id":"m1","amount":"5000.00","event_id":"setup:m1:deposit"}),
    ];
    for (user, card) in users {
        events.push(json!({"type":"user_registered","at":at,"user_id":user,"telegram_bound":true,
            "event_id":format!("setup:{user}")}));
        events.push(json!({"type":"card_bound","at":at,"user_id":user,"card_id":card,"provider":"phonepe",
            "event_id":format!("setup:{card}")}));
        events.push(json!({"type":"user_recharge","at":at,"user_id":user,"amount":"2000.00","commission":"0.00",
            "event_id":format!("setup:{user}:recharge")}));
    }
    events
}

/// A collection of 300.00 from m1 created and dispatched to (user, card) at `at`.
fn collection_events(order_id: &str, at: &str, user: &str, card: &str) -> Vec<Value> {
    vec![
        json!({"type":"collection_created","at":at,"order_id":order_id,"merchant_id":"m1","amount":"300.00",
            "event_id":format!("{order_id}:created")}),
        json!({"type":"collection_dispatched","at":at,"order_id":order_id,"user_id":user,"card_id":card,
            "event_id":format!("{order_id}:dispatched")}),
    ]
}

fn outputs_of_type(document: &Value, kind: &str) -> usize {
    document["outputs"].as_array().expect("outputs").iter().filter(|output| output["type"] == kind).count()
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().expect("a client")
}

fn wait_ready(base: &str) {
    let deadline = Instant::now() + QUIESCENCE_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(response) = client().get(format!("{base}/readyz")).send() {
            if response.status().is_success() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{base} never became ready");
}

fn admin_get(base: &str, path: &str) -> Value {
    let response = client().get(format!("{base}{path}")).bearer_auth(ADMIN_KEY).send().expect("GET answers");
    assert!(response.status().is_success(), "GET {path}: {}", response.status());
    response.json().expect("JSON")
}

/// Waits until every log is consumed (no record appended and unprocessed, no crawl unanswered).
fn wait_quiescent(base: &str) {
    let deadline = Instant::now() + QUIESCENCE_TIMEOUT;
    let mut zero_in_a_row = 0;
    while Instant::now() < deadline {
        let lag = admin_get(base, "/v1/admin/lag")["lag"].as_u64().expect("a lag");
        zero_in_a_row = if lag == 0 { zero_in_a_row + 1 } else { 0 };
        // Twice in a row: a batch commits its outputs and its offset together, but the connector
        // reads the outputs log after that commit.
        if zero_in_a_row == 2 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the pipeline did not become quiescent");
}

/// Whether the event is the simulated provider's (posted to `paisa wallet-sim`, not to the service).
fn is_wallet_event(event: &Value) -> bool {
    event["type"].as_str().is_some_and(|kind| kind.starts_with("wallet_"))
}

fn post_event(serve: &str, wallet_sim: &str, event: &Value) {
    let (url, request) = if is_wallet_event(event) {
        (format!("{wallet_sim}/sim/v1/events"), client().post(format!("{wallet_sim}/sim/v1/events")))
    } else {
        (format!("{serve}/v1/events"), client().post(format!("{serve}/v1/events")).bearer_auth(ADMIN_KEY))
    };
    let response = request.json(event).send().unwrap_or_else(|error| panic!("POST {url}: {error}"));
    let status = response.status();
    assert!(status.is_success(), "POST {url} {event}: {status} {}", response.text().unwrap_or_default());
}

fn scenario_events() -> Vec<Value> {
    events_of(&scenario_path())
}

fn events_of(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("the scenario");
    text.lines().filter(|line| !line.trim().is_empty()).map(|line| serde_json::from_str(line).expect("JSON")).collect()
}

fn replay_document() -> Value {
    replay_of(&scenario_path())
}

fn replay_of(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the scenario");
    let document = pipelines::replay::replay_to_json(&text).expect("the scenario replays");
    serde_json::from_str(&document).expect("JSON")
}

/// The document with its outputs sorted: stages emit concurrently, so their interleaving in the
/// outputs log may differ from replay's single queue while each output is the same.
fn comparable(mut document: Value) -> Value {
    if let Some(outputs) = document.get_mut("outputs").and_then(Value::as_array_mut) {
        outputs.sort_by_key(|output| output.to_string());
    }
    document
}

fn assert_same_state(served: Value, replayed: Value) {
    let served = comparable(served);
    let replayed = comparable(replayed);
    for key in ["clock", "users", "merchants", "orders", "outputs"] {
        assert_eq!(served[key], replayed[key], "`{key}` differs from replay");
    }
}

/// u1's bill table of the spaced scenario, a line per page: T1 paid o1, T2 paid p1, and no third page.
fn assert_bill_table_pages(base: &str) {
    let first = admin_get(base, "/v1/users/u1/bill-table?limit=1");
    assert_eq!(first["items"][0]["txn_id"], "T1");
    assert_eq!(first["items"][0]["matched_to"], "o1:1");
    let cursor = first["next_cursor"].as_str().expect("a second page");
    let second = admin_get(base, &format!("/v1/users/u1/bill-table?limit=1&cursor={cursor}"));
    assert_eq!(second["items"][0]["txn_id"], "T2");
    assert_eq!(second["items"][0]["matched_to"], "p1:1");
    assert_eq!(second["next_cursor"], Value::Null);
}

#[test]
fn the_api_answers_what_replay_computes() {
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let serve = start_serve(data_dir.path(), &wallet_sim.base);
    for event in scenario_events() {
        post_event(&serve.base, &wallet_sim.base, &event);
        wait_quiescent(&serve.base);
    }
    let replayed = replay_document();
    assert_same_state(admin_get(&serve.base, "/v1/admin/snapshot"), replayed.clone());
    // The typed reads agree with the document too.
    let order = admin_get(&serve.base, "/v1/orders/o1");
    assert_eq!(order["state"], replayed["orders"]["o1"]["state"]);
    assert_eq!(order["sub_orders"], replayed["orders"]["o1"]["sub_orders"]);
    let balance = admin_get(&serve.base, "/v1/users/u1/balance");
    assert_eq!(balance["available"], replayed["users"]["u1"]["available"]);
    assert_eq!(balance["frozen"], replayed["users"]["u1"]["frozen"]);
    // The bill table: every line fetched, with the sub-order it paid, paged by cursor.
    assert_bill_table_pages(&serve.base);
    let merchant = admin_get(&serve.base, "/v1/merchants/m1/balance");
    assert_eq!(merchant["available"], replayed["merchants"]["m1"]["available"]);
    assert_eq!(merchant["payout_reserve"], replayed["merchants"]["m1"]["payout_reserve"]);
    // The service's figures count what this test sent, by route template.
    let posted = scenario_events().iter().filter(|event| !is_wallet_event(event)).count();
    let text = metrics_text(&serve.base);
    let value =
        |series: &str| text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')).map(str::to_string);
    let events = r#"paisa_http_requests_total{method="POST",route="/v1/events",status="202"}"#;
    assert_eq!(value(events), Some(posted.to_string()), "{text}");
    let order_reads = r#"paisa_http_request_duration_seconds_count{method="GET",route="/v1/orders/{order_id}"}"#;
    assert_eq!(value(order_reads).as_deref(), Some("1"), "{text}");
    assert_eq!(value("paisa_pipeline_lag_records").as_deref(), Some("0"), "{text}");
    // And by log: every stage partition's and the connector's, each 0.
    let logs: Vec<&str> =
        text.lines().filter_map(|line| line.strip_prefix("paisa_pipeline_log_lag_records{log=\"")).collect();
    let named = |log: &str| logs.iter().any(|line| line.starts_with(&format!("{log}\"")));
    assert!(["agent-0", "order-0", "merchant-0", "outputs"].iter().all(|log| named(log)), "{text}");
    assert!(logs.iter().all(|line| line.ends_with("} 0")), "{text}");
    let lag = admin_get(&serve.base, "/v1/admin/lag");
    assert_eq!(lag["logs"].as_object().map(|logs| logs.len()), Some(logs.len()), "{lag}");
    // Nothing waits, so no log is behind the clock.
    let lag_seconds: Vec<&str> =
        text.lines().filter_map(|line| line.strip_prefix("paisa_pipeline_log_lag_seconds{log=\"")).collect();
    assert_eq!(lag_seconds.len(), logs.len(), "{text}");
    assert!(lag_seconds.iter().all(|line| line.ends_with("} 0")), "{text}");
    let logs_lag_ms = lag["logs_lag_ms"].as_object().expect("the embedded store reads the lag in time");
    assert!(logs_lag_ms.len() == logs.len() && logs_lag_ms.values().all(|lag_ms| lag_ms == 0), "{lag}");
    assert_pipeline_figures(&text, &replayed, &wallet_sim.base);
}

/// The service's `GET /metrics`.
fn metrics_text(base: &str) -> String {
    let metrics = client().get(format!("{base}/metrics")).bearer_auth(ADMIN_KEY).send().expect("metrics");
    assert!(metrics.status().is_success(), "GET /metrics: {}", metrics.status());
    metrics.text().expect("text")
}

/// The pipeline's figures in a scrape agree with what happened: every provider call the simulator
/// answered was counted and timed, every rejection of replay's document counted under its reason, and
/// the store's commits timed, with no dead letter.
fn assert_pipeline_figures(text: &str, replayed: &Value, wallet_sim: &str) {
    let sum = |prefix: &str| -> f64 {
        let values = text.lines().filter_map(|line| line.strip_prefix(prefix)?.rsplit(' ').next()?.parse::<f64>().ok());
        values.sum()
    };
    let stats: Value = client().get(format!("{wallet_sim}/sim/v1/stats")).send().expect("stats").json().expect("JSON");
    let card_requests = stats["card_requests"].as_f64().expect("a count");
    let outputs = replayed["outputs"].as_array().expect("outputs");
    let crawls = outputs.iter().filter(|output| output["type"] == "crawl_requested").count() as f64;
    assert!(card_requests >= crawls, "the simulator answered {card_requests} calls for {crawls} crawls");
    assert_eq!(sum("paisa_crawl_calls_total{"), card_requests, "{text}");
    assert_eq!(sum("paisa_crawl_call_duration_seconds_count{"), card_requests, "{text}");
    let rejections: Vec<&Value> = outputs.iter().filter(|output| output["type"] == "command_rejected").collect();
    assert!(!rejections.is_empty(), "the scenario has a rejection to count");
    for rejection in &rejections {
        let reason = rejection["reason"].as_str().expect("a reason");
        let expected = rejections.iter().filter(|other| other["reason"] == reason).count() as f64;
        assert_eq!(sum(&format!(r#"paisa_commands_rejected_total{{reason="{reason}"}}"#)), expected, "{text}");
    }
    assert_eq!(sum("paisa_commands_rejected_total{"), rejections.len() as f64, "{text}");
    let commits = sum("paisa_store_commit_duration_seconds_count");
    assert!(commits >= 1.0, "{text}");
    assert_eq!(sum("paisa_store_commit_batches_count"), commits, "{text}");
    assert!(sum("paisa_store_commit_batches_sum") >= commits, "{text}");
    // Each request with new inputs waited for its commit (the scenario is posted in requests).
    assert!(sum("paisa_store_ingestion_wait_seconds_count") >= 1.0, "{text}");
    assert_eq!(sum("paisa_dead_letters_total"), 0.0, "{text}");
}

/// The simulator's wallet events all posted first, so its event clock starts at the scenario's end. The
/// connector asks each answer as of its event time (the `paisa-as-of` header), so the state is still
/// replay's: o1's check at 09:02:10 must not see p1's payment (09:02:30, posted at 09:02:40), or p1
/// would succeed before its `payment_confirmed`, which would then be refused (checked: it fails so
/// without the header).
#[test]
fn answers_as_of_their_event_time_when_the_statements_are_posted_first() {
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/service/statements_first.jsonl");
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let serve = start_serve(data_dir.path(), &wallet_sim.base);
    let (wallet, others): (Vec<Value>, Vec<Value>) = events_of(&scenario)
        .into_iter()
        .partition(|event| event["type"].as_str().is_some_and(|kind| kind.starts_with("wallet_")));
    assert!(!wallet.is_empty() && !others.is_empty(), "the scenario has both kinds of events");
    for event in wallet.iter().chain(&others) {
        post_event(&serve.base, &wallet_sim.base, event);
        wait_quiescent(&serve.base);
    }
    let replayed = replay_of(&scenario);
    assert_eq!(replayed["orders"]["p1"]["state"], "success", "the scenario pays p1 after its confirmation");
    assert_same_state(admin_get(&serve.base, "/v1/admin/snapshot"), replayed);
}

/// Issue 4: the same pipeline on Kafka (librdkafka's mock cluster, in the server's process): every
/// batch is a Kafka transaction with its consumed offsets, and the state still equals replay. The API
/// reads from the read model (`--scylla-uri memory`: the ScyllaDB model's in-process twin), which the
/// projector keeps equal to the stages: every order, balance and journal it serves is replay's.
#[test]
fn on_kafka_the_api_answers_what_replay_computes() {
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let kafka = [
        "--profile",
        "kafka",
        "--kafka-brokers",
        "mock",
        "--scylla-uri",
        "memory",
        "--statement-provider",
        &wallet_sim.base,
        // The other end-to-end tests run the connector on its default one-thread runtime; this one on a
        // multi-threaded runtime of two workers.
        "--connector-threads",
        "2",
    ];
    let serve = start_serve_with(data_dir.path(), &kafka);
    for event in scenario_events() {
        post_event(&serve.base, &wallet_sim.base, &event);
        wait_quiescent(&serve.base);
    }
    let replayed = replay_document();
    assert_same_state(admin_get(&serve.base, "/v1/admin/snapshot"), replayed.clone());
    let orders = replayed["orders"].as_object().expect("orders");
    assert!(orders.len() >= 2, "the scenario has orders");
    for (order_id, expected) in orders {
        let served = admin_get(&serve.base, &format!("/v1/orders/{order_id}"));
        for (key, value) in expected.as_object().expect("an order") {
            assert_eq!(&served[key], value, "order {order_id}: `{key}` from the read model");
        }
    }
    for (user_id, expected) in replayed["users"].as_object().expect("users") {
        let served = admin_get(&serve.base, &format!("/v1/users/{user_id}/balance"));
        for key in ["status", "available", "frozen", "deferred", "holds", "cards", "status_history"] {
            assert_eq!(served[key], expected[key], "user {user_id}: `{key}` from the read model");
        }
        let journal = admin_get(&serve.base, &format!("/v1/users/{user_id}/journal?limit=1000"));
        assert_eq!(journal["items"], expected["journal"], "user {user_id}: journal from the read model");
    }
    for (merchant_id, expected) in replayed["merchants"].as_object().expect("merchants") {
        let served = admin_get(&serve.base, &format!("/v1/merchants/{merchant_id}/balance"));
        assert_eq!(served["available"], expected["available"]);
        assert_eq!(served["payout_reserve"], expected["payout_reserve"]);
        let journal = admin_get(&serve.base, &format!("/v1/merchants/{merchant_id}/journal?limit=1000"));
        assert_eq!(journal["items"], expected["journal"], "merchant {merchant_id}: journal from the read model");
    }
    // The bill table, paged by cursor, from the read model.
    assert_bill_table_pages(&serve.base);
    // The figures: on Kafka a store commit is a transaction.
    assert_pipeline_figures(&metrics_text(&serve.base), &replayed, &wallet_sim.base);
}

/// Merges the SPEC §9 documents of instances that each hold some stage partitions: each shows the
/// users, merchants and orders of its own partitions; the outputs log is shared.
fn merged(documents: &[Value]) -> Value {
    let mut merged = documents[0].clone();
    for document in &documents[1..] {
        for key in ["users", "merchants", "orders"] {
            let into = merged[key].as_object_mut().expect("an object");
            for (id, view) in document[key].as_object().expect("an object") {
                assert!(into.insert(id.clone(), view.clone()).is_none(), "{key} {id} held by two instances");
            }
        }
        if document["clock"].as_str() > merged["clock"].as_str() {
            merged["clock"] = document["clock"].clone();
        }
    }
    merged
}

/// Two `paisa serve` processes share the stage partitions (`--group-member`) on one Kafka cluster (the
/// test's own mock cluster, on loopback): the first ingests and runs the statement connector, the second
/// ingests nothing (`--no-ingest`), forwards the writes it gets to the first (`--ingest-url`) and
/// processes the partitions the group gives it. Driven through both APIs in turn, the two together hold
/// replay's state, each partition's keys on one of them.
#[test]
fn two_serve_instances_share_the_stage_partitions() {
    let mut kafka = connectors::kafka::KafkaConfig::new("", 2);
    let _cluster = connectors::kafka::start_mock_cluster(&mut kafka).expect("the mock cluster starts");
    let wallet_sim = start_wallet_sim();
    let (first_dir, second_dir) =
        (tempfile::tempdir().expect("a directory"), tempfile::tempdir().expect("a directory"));
    let shared = |member: &'static str| {
        vec![
            "--profile".to_string(),
            "kafka".to_string(),
            "--kafka-brokers".to_string(),
            kafka.bootstrap_servers.clone(),
            "--scylla-uri".to_string(),
            "memory".to_string(),
            "--group-member".to_string(),
            member.to_string(),
            "--group-session-timeout-ms".to_string(),
            "3000".to_string(),
        ]
    };
    let mut first_args = shared("0");
    first_args.extend(["--statement-provider".to_string(), wallet_sim.base.clone()]);
    let first_args: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let first = start_serve_with(first_dir.path(), &first_args);
    let mut second_args = shared("1");
    second_args.extend(["--no-ingest".to_string(), "--ingest-url".to_string(), first.base.clone()]);
    let second_args: Vec<&str> = second_args.iter().map(String::as_str).collect();
    let second = start_serve_with(second_dir.path(), &second_args);

    for (index, event) in scenario_events().iter().enumerate() {
        // Every other write through the second instance, which forwards it to the first.
        let api = if index % 2 == 0 { &first.base } else { &second.base };
        post_event(api, &wallet_sim.base, event);
        wait_quiescent(&first.base);
        wait_quiescent(&second.base);
    }
    let documents = [admin_get(&first.base, "/v1/admin/snapshot"), admin_get(&second.base, "/v1/admin/snapshot")];
    let held = |document: &Value| {
        ["users", "orders"].iter().map(|key| document[key].as_object().map_or(0, |map| map.len())).sum::<usize>()
    };
    assert!(held(&documents[1]) > 0, "the second instance holds partitions: {}", documents[1]);
    assert!(held(&documents[0]) > 0, "the first instance holds partitions: {}", documents[0]);
    // An order's sub-orders live in the agent stage: an instance's document shows those of its own agent
    // partitions only (the read model joins them: `kafka::tests`, one model shared by two instances).
    let without_sub_orders = |mut document: Value| {
        for order in document["orders"].as_object_mut().expect("orders").values_mut() {
            for key in ["sub_orders", "settled", "debt_batches"] {
                order.as_object_mut().expect("an order").remove(key);
            }
        }
        document
    };
    assert_same_state(without_sub_orders(merged(&documents)), without_sub_orders(replay_document()));
}

#[test]
fn sigkill_mid_stream_loses_nothing_and_applies_nothing_twice() {
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let mut serve = start_serve(data_dir.path(), &wallet_sim.base);
    let events = scenario_events();
    let mut kills = 0;
    for (index, event) in events.iter().enumerate() {
        post_event(&serve.base, &wallet_sim.base, event);
        if index % 5 == 3 {
            // Kill while the event (and what it causes) may still be in flight, then post it again:
            // the client did not necessarily see an answer, and the event id makes the retry safe.
            std::thread::sleep(Duration::from_millis((index as u64 * 7) % 25));
            drop(serve);
            kills += 1;
            serve = start_serve(data_dir.path(), &wallet_sim.base);
            post_event(&serve.base, &wallet_sim.base, event);
        }
        wait_quiescent(&serve.base);
    }
    assert!(kills >= 4, "the test kills the server several times");
    let served = admin_get(&serve.base, "/v1/admin/snapshot");
    let callbacks = served["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .filter(|output| output["type"] == "merchant_callback")
        .count();
    assert_eq!(callbacks, 3, "one callback per finished order, none twice");
    assert_same_state(served, replay_document());
}

/// Posts `event` until the server answers 2xx, to whichever server `base` names at each try (a killed
/// server answers nothing; the one started after it has another address). Returns the failed tries.
fn post_until_accepted(base: &std::sync::Mutex<String>, event: &Value) -> usize {
    let deadline = Instant::now() + QUIESCENCE_TIMEOUT;
    let mut failed_tries = 0;
    while Instant::now() < deadline {
        let serve = base.lock().expect("the address").clone();
        let response = client().post(format!("{serve}/v1/events")).bearer_auth(ADMIN_KEY).json(event).send();
        match response {
            Ok(response) if response.status().is_success() => return failed_tries,
            Ok(response) if response.status().is_client_error() => {
                panic!("{event}: {} {}", response.status(), response.text().unwrap_or_default())
            }
            _ => failed_tries += 1,
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{event} was never accepted");
}

/// Clients posting at once share the service's commits (`RedbStore::ingest`): each request is answered
/// only once durable, and a retry of one that was not answered is applied once. Four clients register
/// agents and recharge them, each retrying until answered, while the server is killed four times.
#[test]
fn concurrent_posts_across_sigkills_are_each_applied_once() {
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let serve = start_serve(data_dir.path(), &wallet_sim.base);
    let base = std::sync::Mutex::new(serve.base.clone());
    let at = "2026-01-01T00:00:00Z";
    let events_of_client = |client: usize| -> Vec<Value> {
        (0..12)
            .flat_map(|agent| {
                let user = format!("u{client}-{agent}");
                let register = json!({"type": "user_registered", "event_id": format!("register-{user}"), "at": at,
                    "user_id": user, "telegram_bound": true});
                let recharges = (0..3).map(move |recharge| {
                    json!({"type": "user_recharge", "event_id": format!("recharge-{user}-{recharge}"), "at": at,
                        "user_id": user, "amount": "10.00", "commission": "0.50"})
                });
                std::iter::once(register).chain(recharges)
            })
            .collect()
    };
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    let (serve, failed_tries) = std::thread::scope(|scope| {
        let mut serve = serve;
        let posters: Vec<_> = (0..4)
            .map(|client| {
                let (base, accepted, events) = (&base, &accepted, events_of_client(client));
                scope.spawn(move || {
                    let mut failed_tries = 0;
                    for event in &events {
                        failed_tries += post_until_accepted(base, event);
                        accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    failed_tries
                })
            })
            .collect();
        // Killed when a sixth, two, three and four sixths of the 192 events are answered: mid-stream.
        let deadline = Instant::now() + QUIESCENCE_TIMEOUT;
        for sixths in 1..=4 {
            while accepted.load(std::sync::atomic::Ordering::SeqCst) < 192 * sixths / 6 {
                // A poster that stopped (done, or failed: its panic is reported when the scope joins
                // it) ends the wait, so that the test cannot hang.
                if Instant::now() > deadline || posters.iter().any(|poster| poster.is_finished()) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(serve);
            serve = start_serve(data_dir.path(), &wallet_sim.base);
            *base.lock().expect("the address") = serve.base.clone();
        }
        let failed_tries: usize = posters.into_iter().map(|poster| poster.join().expect("a poster")).sum();
        (serve, failed_tries)
    });
    assert!(failed_tries > 0, "no request met a killed server: the kills were not mid-stream");
    wait_quiescent(&serve.base);
    let served = admin_get(&serve.base, "/v1/admin/snapshot");
    let lines: Vec<String> = (0..4).flat_map(events_of_client).map(|event| event.to_string()).collect();
    let scenario = data_dir.path().join("posted.jsonl");
    std::fs::write(&scenario, lines.join("\n") + "\n").expect("the scenario written");
    let replayed = replay_of(&scenario);
    // Each agent's state is its own events' alone, whatever the order across clients.
    assert_eq!(served["users"], replayed["users"], "an input lost or applied twice");
    assert_eq!(served["users"].as_object().map(|users| users.len()), Some(48));
    assert_eq!(served["users"]["u3-11"]["available"], "31.50", "three recharges and their commission, once");
}

#[test]
fn bad_input_over_http_gets_a_4xx_and_changes_nothing() {
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let serve = start_serve(data_dir.path(), &wallet_sim.base);
    for event in scenario_events().iter().take(10) {
        post_event(&serve.base, &wallet_sim.base, event);
    }
    wait_quiescent(&serve.base);
    let before = admin_get(&serve.base, "/v1/admin/snapshot");
    let at = "2026-03-02T09:00:20Z";
    let oversized = json!({"type": "user_registered", "at": at, "user_id": "x".repeat(2 * 1024 * 1024),
        "telegram_bound": false});
    let cases: Vec<(&str, String, u16)> = vec![
        ("malformed JSON", "{\"type\":".to_string(), 400),
        ("unknown field", json!({"type":"tick","at":at,"surprise":1}).to_string(), 400),
        ("missing field", json!({"type":"merchant_deposit","at":at,"merchant_id":"m1"}).to_string(), 400),
        (
            "negative amount",
            json!({"type":"merchant_deposit","at":at,"merchant_id":"m1","amount":"-5.00"}).to_string(),
            400,
        ),
        (
            "three decimals",
            json!({"type":"user_recharge","at":at,"user_id":"u1","amount":"1.005","commission":"0"}).to_string(),
            400,
        ),
        (
            "unknown merchant",
            json!({"type":"merchant_deposit","at":at,"merchant_id":"nobody","amount":"5.00"}).to_string(),
            404,
        ),
        (
            "unknown user",
            json!({"type":"user_recharge","at":at,"user_id":"nobody","amount":"5.00","commission":"0.00"}).to_string(),
            404,
        ),
        ("unknown order", json!({"type":"order_cancelled","at":at,"order_id":"nope","by":"merchant"}).to_string(), 404),
        ("oversized body", oversized.to_string(), 413),
    ];
    for (name, body, status) in cases {
        let response = client()
            .post(format!("{}/v1/events", serve.base))
            .bearer_auth(ADMIN_KEY)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .expect("an answer");
        assert_eq!(response.status().as_u16(), status, "{name}");
        let error: Value = response.json().unwrap_or(Value::Null);
        assert!(error["error"].is_string(), "{name}: the answer names the error: {error}");
    }
    wait_quiescent(&serve.base);
    assert_eq!(admin_get(&serve.base, "/v1/admin/snapshot"), before, "bad input changed the state");
}

#[test]
fn a_merchant_key_reads_and_writes_only_its_own_merchant() {
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let serve = start_serve(data_dir.path(), &wallet_sim.base);
    for event in scenario_events().iter().take(10) {
        post_event(&serve.base, &wallet_sim.base, event);
    }
    let at = "2026-03-02T09:00:30Z";
    let register = json!({"type":"merchant_registered","at":at,"merchant_id":"m2","collection_fee_rate":"0.01",
        "payout_fee_rate":"0.00","payout_fee_fixed":"0.00"});
    post_event(&serve.base, &wallet_sim.base, &register);
    wait_quiescent(&serve.base);
    let issued: Value = client()
        .post(format!("{}/v1/admin/merchants/m2/keys", serve.base))
        .bearer_auth(ADMIN_KEY)
        .send()
        .expect("an answer")
        .json()
        .expect("JSON");
    let token = issued["token"].as_str().expect("a token").to_string();
    let get = |path: &str, token: Option<&str>| {
        let request = client().get(format!("{}{path}", serve.base));
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        request.send().expect("an answer").status().as_u16()
    };
    assert_eq!(get("/v1/merchants/m2/balance", Some(&token)), 200);
    assert_eq!(get("/v1/merchants/m1/balance", Some(&token)), 403);
    assert_eq!(get("/v1/orders/o1", Some(&token)), 403, "o1 belongs to m1");
    assert_eq!(get("/v1/merchants/m2/balance", None), 401);
    assert_eq!(get("/v1/merchants/m2/balance", Some("not-a-key")), 401);
    assert_eq!(get("/v1/admin/snapshot", Some(&token)), 403);
    let create = |merchant: &str| {
        client()
            .post(format!("{}/v1/merchants/{merchant}/collections", serve.base))
            .bearer_auth(&token)
            .json(&json!({"order_id": format!("{merchant}-order"), "amount": "10.00", "at": at}))
            .send()
            .expect("an answer")
            .status()
            .as_u16()
    };
    assert_eq!(create("m1"), 403);
    assert_eq!(create("m2"), 202);
    wait_quiescent(&serve.base);
    assert_eq!(get("/v1/orders/m2-order", Some(&token)), 200);
}

#[test]
fn a_restart_with_nothing_in_flight_changes_nothing() {
    // u1 and u4 live in different agent partitions (CRC-32 mod 2), so u4's partition sees neither u1's
    // crawl nor its answer. The answer is stamped `crawl_latency` after the request, later than any
    // input: after a restart the ticks must still follow the largest `at` ingested, not the stages'
    // clocks, or u4's first wave (09:02:20) fires although no input has reached it.
    assert_ne!(partition_of("u1", 2), partition_of("u4", 2), "the users share a partition");
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let config = config_file(data_dir.path(), &json!({"crawl_latency": 30}));
    let args = ["--config", config.as_str(), "--statement-provider", wallet_sim.base.as_str()];
    let serve = start_serve_with(data_dir.path(), &args);
    let mut events = setup_events("2026-03-02T09:00:00Z", &[("u1", "k1"), ("u4", "k4")]);
    events.extend(collection_events("o1", "2026-03-02T09:00:10Z", "u1", "k1"));
    events.extend(collection_events("o2", "2026-03-02T09:00:20Z", "u4", "k4"));
    events.push(json!({"type":"tick","at":"2026-03-02T09:02:15Z","event_id":"tick:1"}));
    for event in &events {
        post_event(&serve.base, &wallet_sim.base, event);
        wait_quiescent(&serve.base);
    }
    let before = admin_get(&serve.base, "/v1/admin/snapshot");
    assert_eq!(outputs_of_type(&before, "crawl_requested"), 1, "only u1's first wave is due: {before}");
    assert_eq!(before["clock"], "2026-03-02T09:02:40Z", "the answer is stamped after the last input");
    drop(serve);
    let serve = start_serve_with(data_dir.path(), &args);
    wait_quiescent(&serve.base);
    assert_eq!(admin_get(&serve.base, "/v1/admin/snapshot"), before, "the restart changed the state");
}

/// The `THP_enabled` line of a process's status (Linux 5.0 and later).
fn huge_pages_enabled(process: &Process) -> String {
    let status = std::fs::read_to_string(format!("/proc/{}/status", process.child.id())).expect("the status");
    let line = status.lines().find(|line| line.starts_with("THP_enabled:")).expect("a THP_enabled line");
    line.trim_start_matches("THP_enabled:").trim().to_string()
}

#[test]
fn the_services_run_without_transparent_huge_pages() {
    // docs/DECISIONS.md, "Services run without transparent huge pages". This test process keeps them
    // (the flag is per process), so a service showing 0 turned them off itself.
    let test_process = std::fs::read_to_string("/proc/self/status").expect("the status");
    assert!(
        test_process.contains("THP_enabled:\t1"),
        "this test process has THP_enabled 0 (a kernel without transparent huge pages, or a parent that \
         turned them off), so it cannot tell whether the services turn them off"
    );
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let serve = start_serve(data_dir.path(), &wallet_sim.base);
    assert_eq!(huge_pages_enabled(&wallet_sim), "0", "paisa wallet-sim");
    assert_eq!(huge_pages_enabled(&serve), "0", "paisa serve");
}

#[test]
fn a_timer_set_at_the_time_of_the_last_tick_still_fires() {
    // With a wave at 0 s, a dispatch sets a timer due at its own time. The ticker ticks u1's partition
    // at 09:00:10 for o1's wave; o2's dispatch at 09:00:10 then sets another timer due at 09:00:10 in
    // the same partition, which needs a second tick at the same time (replay fires it: every timer due
    // by the last `at` has fired).
    assert_eq!(partition_of("u1", 2), partition_of("u2", 2), "the users are in different partitions");
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let settings = json!({"collection_waves": [0, 120]});
    let config = config_file(data_dir.path(), &settings);
    // No statement provider: the crawls stay unanswered, so nothing moves the clock past 09:00:10.
    let serve = start_serve_with(data_dir.path(), &["--config", config.as_str()]);
    let mut events = setup_events("2026-03-02T09:00:00Z", &[("u1", "k1"), ("u2", "k2")]);
    events.extend(collection_events("o1", "2026-03-02T09:00:10Z", "u1", "k1"));
    events.extend(collection_events("o2", "2026-03-02T09:00:10Z", "u2", "k2"));
    for event in &events {
        post_event(&serve.base, "", event);
        wait_quiescent(&serve.base);
    }
    let served = admin_get(&serve.base, "/v1/admin/snapshot");
    assert_eq!(outputs_of_type(&served, "crawl_requested"), 2, "both first waves fired: {served}");
    let mut scenario = json!({"type": "config", "collection_waves": [0, 120]}).to_string();
    for event in &events {
        scenario.push('\n');
        scenario.push_str(&event.to_string());
    }
    let replayed = pipelines::replay::replay_to_json(&scenario).expect("the scenario replays");
    assert_same_state(served, serde_json::from_str(&replayed).expect("JSON"));
}

#[test]
fn on_the_system_clock_the_server_stamps_time_and_ticks_fire_timers() {
    // Short waves and close (SPEC §8 settings) so that a collection nobody pays closes within seconds,
    // with no input after its dispatch: only the ticker can fire its timers (SPEC §3).
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let settings = json!({"collection_waves": [1, 2], "collection_close_after": 3});
    let config = config_file(data_dir.path(), &settings);
    let data = data_dir.path().join("data");
    let data = data.to_str().expect("a UTF-8 path");
    let wallet_sim = start(&["wallet-sim", "--listen", "127.0.0.1:0"]);
    let provider = wallet_sim.base.as_str();
    let args =
        ["serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--config", &config, "--statement-provider", provider];
    let serve = start(&args);
    wait_ready(&serve.base);
    let events = [
        json!({"type":"merchant_registered","merchant_id":"m1","collection_fee_rate":"0.02","payout_fee_rate":"0.00",
            "payout_fee_fixed":"0.00"}),
        json!({"type":"user_registered","user_id":"u1","telegram_bound":false}),
        json!({"type":"card_bound","user_id":"u1","card_id":"k1","provider":"phonepe"}),
        json!({"type":"user_recharge","user_id":"u1","amount":"500.00","commission":"0.00"}),
        json!({"type":"collection_created","order_id":"o1","merchant_id":"m1","amount":"100.00"}),
        json!({"type":"collection_dispatched","order_id":"o1","user_id":"u1","card_id":"k1"}),
    ];
    for event in &events {
        let response = client().post(format!("{}/v1/events", serve.base)).bearer_auth(ADMIN_KEY).json(event).send();
        let status = response.expect("an answer").status();
        assert_eq!(status.as_u16(), 202, "{event}");
    }
    // A client may not choose `at` on the system clock.
    let stamped = json!({"type":"tick","at":"2026-03-02T09:00:00Z"});
    let refused = client().post(format!("{}/v1/events", serve.base)).bearer_auth(ADMIN_KEY).json(&stamped).send();
    assert_eq!(refused.expect("an answer").status().as_u16(), 400);
    let deadline = Instant::now() + QUIESCENCE_TIMEOUT;
    loop {
        let order = admin_get(&serve.base, "/v1/orders/o1");
        if order["state"] == "cancelled" {
            assert_eq!(order["sub_orders"][0]["state"], "payment_timeout", "R-CLOSE-1 closed it: {order}");
            break;
        }
        assert!(Instant::now() < deadline, "the close never fired: {order}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let balance = admin_get(&serve.base, "/v1/users/u1/balance");
    assert_eq!(balance["frozen"], "0.00", "the hold was released");
    assert_eq!(balance["available"], "500.00");
}

/// SPEC §3, R-CHK-1: inputs posted at once, one stamped minutes after a crawl is asked. The agent
/// partition would apply it before the connector's answer is in its log, fire the crawl's timeout and
/// ask again; it waits for the answer instead (the answer barrier of the event clock), so the service
/// ends where replay does, with one crawl. Two agents of the same agent partition (`u1` and `u2`; `u3`
/// asks nothing) each wait for their own answer only, and end where replay does too.
#[test]
fn a_later_input_waits_for_the_answer_in_flight() {
    let scenario = [
        json!({"type":"user_registered","at":"2026-03-02T09:00:00Z","user_id":"u1","telegram_bound":false}),
        json!({"type":"user_registered","at":"2026-03-02T09:00:00Z","user_id":"u2","telegram_bound":false}),
        json!({"type":"user_registered","at":"2026-03-02T09:00:00Z","user_id":"u3","telegram_bound":false}),
        json!({"type":"card_bound","at":"2026-03-02T09:00:00Z","user_id":"u1","card_id":"k1","provider":"paytm"}),
        json!({"type":"card_bound","at":"2026-03-02T09:00:00Z","user_id":"u2","card_id":"k2","provider":"paytm"}),
        json!({"type":"card_reauthenticated","at":"2026-03-02T09:00:01Z","user_id":"u1","card_id":"k1"}),
        json!({"type":"card_reauthenticated","at":"2026-03-02T09:00:30Z","user_id":"u2","card_id":"k2"}),
        json!({"type":"user_recharge","at":"2026-03-02T09:03:00Z","user_id":"u3","amount":"70.00",
            "commission":"0.00"}),
        json!({"type":"user_recharge","at":"2026-03-02T09:04:00Z","user_id":"u2","amount":"300.00",
            "commission":"0.00"}),
        json!({"type":"user_recharge","at":"2026-03-02T09:05:00Z","user_id":"u1","amount":"500.00",
            "commission":"0.00"}),
    ];
    let wallet_sim = start_wallet_sim();
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let serve = start_serve(data_dir.path(), &wallet_sim.base);
    let response = client()
        .post(format!("{}/v1/events", serve.base))
        .bearer_auth(ADMIN_KEY)
        .json(&scenario)
        .send()
        .expect("POST answers");
    assert!(response.status().is_success(), "{}", response.status());
    wait_quiescent(&serve.base);
    let text: String = scenario.iter().map(|event| format!("{event}\n")).collect();
    let replayed: Value =
        serde_json::from_str(&pipelines::replay::replay_to_json(&text).expect("replays")).expect("JSON");
    assert_eq!(outputs_of_type(&replayed, "crawl_requested"), 2, "one check per reauthenticated card");
    assert_same_state(admin_get(&serve.base, "/v1/admin/snapshot"), replayed);
}

#[test]
fn a_data_directory_refuses_other_settings() {
    // State is rebuilt by replaying the logs: other partitions or SPEC §8 settings would rebuild another
    // state than the one already acted on, so the service refuses to start.
    let data_dir = tempfile::tempdir().expect("a temporary directory");
    let data = data_dir.path().join("data");
    let data = data.to_str().expect("a UTF-8 path");
    drop(start(&["serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--clock", "event"]));
    let config = config_file(data_dir.path(), &json!({"collection_close_after": 60}));
    for extra in [vec!["--partitions", "3"], vec!["--config", config.as_str()]] {
        let mut args = vec!["serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--clock", "event"];
        args.extend(extra.iter().copied());
        let output = Command::new(env!("CARGO_BIN_EXE_paisa")).args(&args).output().expect("paisa runs");
        assert!(!output.status.success(), "started with {extra:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("the data directory was created with"), "{extra:?}: {stderr}");
    }
}
