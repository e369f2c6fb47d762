//! The crate's tests (one test binary): schemas, conversions, wire format, resolvers, evolution.

use crate::catalog::{embedded, SchemaDef, SchemaName, Topic};
use crate::convert::{
    self, AvroRecord, ChangelogEntry, ChangelogKey, ClockTick, CommandKey, CrawlRequest, OutputKey, StatementResult,
    TickKey,
};
use crate::error::Error;
use crate::resolver::{RegistryResolver, SchemaResolver, StaticResolver};
use crate::value::Symbols;
use crate::{wire, TopicCodec};
use apache_avro::schema_compatibility::SchemaCompatibility;
use apache_avro::types::Value;
use pipelines::input::{
    parse_line, CancelledBy, Command, CrawlError, Direction, Fault, LineStatus, Parsed, Party, Provider,
    INPUT_TYPE_NAMES,
};
use pipelines::output::{
    CallbackStatus, CrawlMode, CrawlRequested, NotificationKind, OrderKind, Output, OutputBody, PageOrder, Reason,
    Rejection,
};
use pipelines::partition::{
    route_input, Produced, RecordBody, RecordId, Routed, StageKind, StagePartition, StageRecord,
};
use pipelines::stages::{AgentBody, DispatchRequest, MerchantBody, Message, OrderBody, SubOrderCommand, SubOutcome};
use pipelines::{Config, Input, Money, Timestamp};
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

fn at(text: &str) -> Timestamp {
    Timestamp::parse(text).expect("a time")
}

fn codec() -> TopicCodec<StaticResolver> {
    TopicCodec::new(StaticResolver::new().expect("embedded schemas parse"))
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime").block_on(future)
}

/// Rust value → Avro bytes (Confluent-framed, static ids) → Rust value.
fn round_trip<T: AvroRecord>(topic: Topic, value: &T) -> T {
    let codec = codec();
    block_on(async {
        let bytes = codec.encode_value(topic, value).await.expect("encodes");
        assert_eq!(bytes[0], 0, "magic byte");
        assert_eq!(u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]), T::SCHEMA.static_id());
        codec.decode_value(topic, &bytes).await.expect("decodes")
    })
}

fn round_trip_key<T: AvroRecord>(topic: Topic, key: &T) -> T {
    let codec = codec();
    block_on(async {
        let bytes = codec.encode_key(topic, key).await.expect("encodes");
        codec.decode_key(topic, &bytes).await.expect("decodes")
    })
}

fn scenarios() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/scenarios")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "jsonl"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| (path.display().to_string(), std::fs::read_to_string(&path).expect("a scenario")))
        .collect()
}

/// Every input of every golden scenario that parses (some scenarios test structural errors).
fn scenario_inputs() -> Vec<Input> {
    let mut inputs = Vec::new();
    for (_, text) in scenarios() {
        for (index, line) in text.lines().enumerate() {
            if let Ok(Parsed::Input(input)) = parse_line(line, || format!("line:{}", index + 1)) {
                inputs.push(input);
            }
        }
    }
    inputs
}

// ---------------------------------------------------------------------------------------------------
// The schemas themselves

/// Every named type defined in a schema JSON: full name → definition.
fn named_types(json: &Json, namespace: &str, found: &mut Vec<(String, Json)>) {
    match json {
        Json::Array(items) => items.iter().for_each(|item| named_types(item, namespace, found)),
        Json::Object(object) => {
            let kind = object.get("type").and_then(Json::as_str);
            let mut inner_namespace = namespace.to_string();
            if let (Some("record" | "enum" | "fixed"), Some(name)) = (kind, object.get("name").and_then(Json::as_str)) {
                let own = object.get("namespace").and_then(Json::as_str).unwrap_or(namespace);
                inner_namespace = own.to_string();
                found.push((format!("{own}.{name}"), json.clone()));
            }
            if let Some(Json::Array(fields)) = object.get("fields") {
                fields.iter().for_each(|field| named_types(&field["type"], &inner_namespace, found));
            }
            if let Some(items) = object.get("items") {
                named_types(items, &inner_namespace, found);
            }
            if let Some(Json::Object(_) | Json::Array(_)) = object.get("type") {
                named_types(&object["type"], &inner_namespace, found);
            }
        }
        _ => {}
    }
}

fn all_named_types() -> BTreeMap<String, Vec<(SchemaName, Json)>> {
    let mut all: BTreeMap<String, Vec<(SchemaName, Json)>> = BTreeMap::new();
    for name in SchemaName::ALL {
        let json: Json = serde_json::from_str(name.text()).expect("JSON");
        let mut found = Vec::new();
        named_types(&json, "", &mut found);
        for (full, definition) in found {
            all.entry(full).or_default().push((*name, definition));
        }
    }
    all
}

#[test]
fn every_embedded_schema_parses_and_is_named_after_its_file() {
    for name in SchemaName::ALL {
        let def = embedded(*name).expect("parses");
        let apache_avro::Schema::Record(record) = def.schema() else { panic!("{name:?} is not a record") };
        assert_eq!(record.name.fullname(None), name.full_name());
        assert_eq!(name.file(), format!("{}.avsc", record.name.name));
    }
    let ids: std::collections::BTreeSet<u32> = SchemaName::ALL.iter().map(|name| name.static_id()).collect();
    assert_eq!(ids.len(), SchemaName::ALL.len(), "static ids are unique");
    let other = TopicCodec::with_namespace(StaticResolver::new().expect("parses"), "test-7");
    for topic in Topic::ALL {
        assert_eq!(topic.name(), format!("paisa.{}", topic.suffix()));
        assert_eq!(topic.key_subject(), format!("{}-key", topic.name()));
        assert_eq!(topic.value_subject(), format!("{}-value", topic.name()));
        assert_eq!(codec().subjects(*topic), (topic.key_subject(), topic.value_subject()));
        let value = format!("test-7.{}-value", topic.suffix());
        assert_eq!(other.subjects(*topic).1, value);
    }
    assert_eq!(Topic::stage(StageKind::Agent).name(), "paisa.agent", "the Kafka backend's stage topics");
}

/// Files are self-contained (what a registry stores without references), so shared types are written
/// in several files: they must not drift apart.
#[test]
fn a_type_defined_in_several_files_is_defined_identically() {
    let all = all_named_types();
    assert!(all.len() > 60, "found {} named types", all.len());
    for (full, definitions) in &all {
        let (first_file, first) = &definitions[0];
        for (file, definition) in &definitions[1..] {
            assert_eq!(definition, first, "{full} differs between {first_file:?} and {file:?}");
        }
    }
    assert_eq!(all["in.paisa.v1.StatementLine"].len(), 3, "Input, StatementResult, StageRecord");
}

fn union_names(record: &str, field: &str) -> Vec<String> {
    let all = all_named_types();
    let definition = &all.get(record).unwrap_or_else(|| panic!("no {record}"))[0].1;
    let fields = definition["fields"].as_array().expect("fields");
    let field = fields.iter().find(|candidate| candidate["name"] == field).expect("the field");
    field["type"]
        .as_array()
        .expect("a union")
        .iter()
        .map(|branch| match branch {
            Json::String(reference) => reference.rsplit('.').next().unwrap_or_default().to_string(),
            other => other["name"].as_str().expect("a named branch").to_string(),
        })
        .collect()
}

#[test]
fn union_branch_lists_follow_the_schemas() {
    for (record, field, branches) in [
        ("in.paisa.v1.Input", "command", convert::COMMAND_BRANCHES),
        ("in.paisa.v1.OrderInput", "command", convert::COMMAND_BRANCHES),
        ("in.paisa.v1.AgentInput", "command", convert::COMMAND_BRANCHES),
        ("in.paisa.v1.MerchantInput", "command", convert::COMMAND_BRANCHES),
        ("in.paisa.v1.Output", "body", convert::OUTPUT_BRANCHES),
        ("in.paisa.v1.StageRecord", "body", convert::RECORD_BODY_BRANCHES),
        ("in.paisa.v1.OrderMessage", "body", convert::ORDER_BODY_BRANCHES),
        ("in.paisa.v1.SubOrderOutcome", "outcome", convert::OUTCOME_BRANCHES),
        ("in.paisa.v1.AgentMessage", "body", convert::AGENT_BODY_BRANCHES),
        ("in.paisa.v1.SubOrderCommand", "command", convert::SUB_ORDER_COMMAND_BRANCHES),
        ("in.paisa.v1.MerchantMessage", "body", convert::MERCHANT_BODY_BRANCHES),
    ] {
        assert_eq!(union_names(record, field), branches, "{record}.{field}");
    }
    // One branch per SPEC §5 input type but `config`.
    assert_eq!(convert::COMMAND_BRANCHES.len(), INPUT_TYPE_NAMES.len() - 1);
}

fn check_symbols<E: Symbols + serde::Serialize>(schema_name: &str) {
    let all = all_named_types();
    let definition = &all.get(schema_name).unwrap_or_else(|| panic!("no {schema_name}"))[0].1;
    let symbols: Vec<&str> =
        definition["symbols"].as_array().expect("symbols").iter().filter_map(Json::as_str).collect();
    assert_eq!(symbols, E::SYMBOLS, "{schema_name}");
    assert_eq!(E::ALL.len(), E::SYMBOLS.len(), "{schema_name}");
    for (value, symbol) in E::ALL.iter().zip(E::SYMBOLS) {
        assert_eq!(value.symbol(), *symbol);
        assert_eq!(serde_json::to_value(value).expect("serializes"), Json::String((*symbol).to_string()), "serde name");
    }
}

#[test]
fn enum_symbols_are_the_spec_names() {
    check_symbols::<Provider>("in.paisa.v1.Provider");
    check_symbols::<Direction>("in.paisa.v1.Direction");
    check_symbols::<LineStatus>("in.paisa.v1.LineStatus");
    check_symbols::<Fault>("in.paisa.v1.Fault");
    check_symbols::<CrawlError>("in.paisa.v1.CrawlError");
    check_symbols::<CancelledBy>("in.paisa.v1.CancelledBy");
    check_symbols::<CrawlMode>("in.paisa.v1.CrawlMode");
    check_symbols::<PageOrder>("in.paisa.v1.PageOrder");
    check_symbols::<OrderKind>("in.paisa.v1.OrderKind");
    check_symbols::<CallbackStatus>("in.paisa.v1.CallbackStatus");
    check_symbols::<NotificationKind>("in.paisa.v1.NotificationKind");
    check_symbols::<Reason>("in.paisa.v1.Reason");
    check_symbols::<StageKind>("in.paisa.v1.StageKind");
    let all = all_named_types();
    let input_types: Vec<&str> = all["in.paisa.v1.InputType"][0].1["symbols"]
        .as_array()
        .expect("symbols")
        .iter()
        .filter_map(Json::as_str)
        .collect();
    assert_eq!(input_types, INPUT_TYPE_NAMES);
}

// ---------------------------------------------------------------------------------------------------
// Round trips

/// One input of every SPEC §5 type, with optional fields both present and absent.
const EVERY_INPUT: &[&str] = &[
    r#"{"type":"merchant_registered","at":"2026-03-02T09:00:00Z","merchant_id":"m1","collection_fee_rate":"0.02","payout_fee_rate":"0.00","payout_fee_fixed":"2.00"}"#,
    r#"{"type":"merchant_registered","at":"2026-03-02T09:00:00Z","merchant_id":"m1","collection_fee_rate":"0.025","payout_fee_rate":"0.01","payout_fee_fixed":"2","callback_url":"https://m.example/cb"}"#,
    r#"{"type":"merchant_deposit","at":"2026-03-02T09:00:00Z","merchant_id":"m1","amount":"1000.00"}"#,
    r#"{"type":"user_registered","at":"2026-03-02T09:00:00Z","user_id":"u1","telegram_bound":true}"#,
    r#"{"type":"card_bound","at":"2026-03-02T09:00:00Z","user_id":"u1","card_id":"k1","provider":"paytm"}"#,
    r#"{"type":"card_bound","at":"2026-03-02T09:00:00Z","user_id":"u1","card_id":"k2","provider":"other","account_last4":"1234","vpa":"u1@upi"}"#,
    r#"{"type":"user_recharge","at":"2026-03-02T09:00:00Z","user_id":"u1","amount":"500.00","commission":"0.00"}"#,
    r#"{"type":"user_adjustment","at":"2026-03-02T09:00:00Z","user_id":"u1","amount":"-1.005","reason":"typo kept as written"}"#,
    r#"{"type":"collection_created","at":"2026-03-02T09:00:00.123Z","order_id":"o1","merchant_id":"m1","amount":"456"}"#,
    r#"{"type":"collection_created","at":"2026-03-02T09:00:00Z","order_id":"o2","merchant_id":"m1","amount":"10.00","utr":"U1","expires_at":"2026-03-02T09:10:00Z"}"#,
    r#"{"type":"collection_dispatched","at":"2026-03-02T09:00:00Z","order_id":"o1","user_id":"u1","card_id":"k1"}"#,
    r#"{"type":"payment_confirmed","at":"2026-03-02T09:00:00Z","order_id":"o1"}"#,
    r#"{"type":"payment_confirmed","at":"2026-03-02T09:00:00Z","order_id":"o1","utr":"123456789012"}"#,
    r#"{"type":"order_cancelled","at":"2026-03-02T09:00:00Z","order_id":"o1","by":"cashier"}"#,
    r#"{"type":"supplement_requested","at":"2026-03-02T09:00:00Z","order_id":"o1","utr":null}"#,
    r#"{"type":"collection_retry","at":"2026-03-02T09:00:00Z","order_id":"o1"}"#,
    r#"{"type":"payout_created","at":"2026-03-02T09:00:00Z","order_id":"p1","merchant_id":"m1","amount":"100.00","payee":{"account_last4":"4444"}}"#,
    r#"{"type":"payout_created","at":"2026-03-02T09:00:00Z","order_id":"p2","merchant_id":"m1","amount":"100.00","payee":{"vpa":"x@y","name":"X","ifsc":"HDFC0001"},"expires_at":"2026-03-02T10:00:00Z"}"#,
    r#"{"type":"payout_grabbed","at":"2026-03-02T09:00:00Z","order_id":"p1","user_id":"u1","card_id":"k1"}"#,
    r#"{"type":"crawl_result","at":"2026-03-02T09:00:00Z","request_id":"k1:1","user_id":"u1","card_id":"k1","ok":false,"error":"session_expired","lines":[]}"#,
    r#"{"type":"crawl_result","at":"2026-03-02T09:00:00Z","request_id":"k1:2","user_id":"u1","card_id":"k1","ok":true,"lines":[{"txn_id":"t1","utr":"U1","direction":"in","amount":"456.00","status":"success","time":"2026-03-02T08:59:00Z","counterparty":{"name":"Payer"}},{"txn_id":"t2","utr":null,"utr_supported":false,"direction":"out","amount":"1.5","status":"errored","time":"2026-03-02T08:59:30.5Z","payee_ifsc":"HDFC0001"}],"next_from":"2026-03-02T08:59:30Z"}"#,
    r#"{"type":"card_reauthenticated","at":"2026-03-02T09:00:00Z","user_id":"u1","card_id":"k1"}"#,
    r#"{"type":"admin_approve","at":"2026-03-02T09:00:00Z","order_id":"o1","operator":"ops"}"#,
    r#"{"type":"admin_approve","at":"2026-03-02T09:00:00Z","order_id":"o1","operator":"ops","amount":"455.00"}"#,
    r#"{"type":"admin_reject","at":"2026-03-02T09:00:00Z","order_id":"o1","operator":"ops"}"#,
    r#"{"type":"admin_crawl_retry","at":"2026-03-02T09:00:00Z","order_id":"o1","operator":"ops"}"#,
    r#"{"type":"admin_correct_cancel","at":"2026-03-02T09:00:00Z","order_id":"o1","operator":"ops"}"#,
    r#"{"type":"admin_cancel_payout","at":"2026-03-02T09:00:00Z","order_id":"p1","operator":"ops"}"#,
    r#"{"type":"admin_unban","at":"2026-03-02T09:00:00Z","user_id":"u1","operator":"ops"}"#,
    r#"{"type":"tick","at":"2026-03-02T09:00:00Z"}"#,
    r#"{"type":"wallet_line","at":"2026-03-02T09:00:00Z","card_id":"k1","line":{"txn_id":"t1","utr":"U1","direction":"in","amount":"456.00","status":"processing","time":"2026-03-02T08:59:00Z","counterparty":{"account_last4":"9999","vpa":"p@upi"}}}"#,
    r#"{"type":"wallet_line_status","at":"2026-03-02T09:00:00Z","card_id":"k1","txn_id":"t1","status":"failed"}"#,
    r#"{"type":"wallet_fault","at":"2026-03-02T09:00:00Z","card_id":"k1","fault":"upstream_busy"}"#,
    r#"{"type":"wallet_fault","at":"1969-12-31T23:59:59.999Z","card_id":"k1","fault":"none"}"#,
];

fn every_input() -> Vec<Input> {
    EVERY_INPUT
        .iter()
        .enumerate()
        .map(|(index, line)| match parse_line(line, || format!("line:{index}")) {
            Ok(Parsed::Input(input)) => input,
            other => panic!("not an input: {line}: {other:?}"),
        })
        .collect()
}

#[test]
fn every_input_type_round_trips() {
    let inputs = every_input();
    let types: std::collections::BTreeSet<&str> = inputs.iter().map(|input| input.command.type_name()).collect();
    assert_eq!(types.len(), INPUT_TYPE_NAMES.len() - 1, "every type but config");
    for input in &inputs {
        assert_eq!(&round_trip(Topic::Commands, input), input);
        let key = CommandKey::for_input(input);
        assert_eq!(round_trip_key(Topic::Commands, &key), key);
    }
}

#[test]
fn every_golden_scenario_input_round_trips() {
    let inputs = scenario_inputs();
    assert!(inputs.len() > 1_000, "{} inputs", inputs.len());
    for input in &inputs {
        assert_eq!(&round_trip(Topic::Commands, input), input);
    }
}

#[test]
fn command_keys_follow_the_routing() {
    let inputs = every_input();
    let key = |type_name: &str| {
        let input = inputs.iter().find(|input| input.command.type_name() == type_name).expect("an input");
        CommandKey::for_input(input)
    };
    assert_eq!(key("merchant_deposit"), CommandKey { stage: Some(StageKind::Merchant), id: "m1".into() });
    assert_eq!(key("crawl_result"), CommandKey { stage: Some(StageKind::Agent), id: "u1".into() });
    assert_eq!(key("payout_created"), CommandKey { stage: Some(StageKind::Order), id: "p1".into() });
    assert_eq!(key("tick"), CommandKey { stage: None, id: String::new().into() });
    assert_eq!(key("wallet_fault"), CommandKey { stage: None, id: "k1".into() });
}

#[test]
fn statement_results_round_trip_and_are_crawl_result_inputs() {
    for input in every_input().into_iter().chain(scenario_inputs()) {
        let Some(result) = StatementResult::from_input(input.clone()) else { continue };
        assert_eq!(round_trip(Topic::StatementResults, &result), result);
        assert_eq!(result.into_input(), input);
    }
}

fn every_output() -> Vec<Output> {
    let time = at("2026-03-02T09:00:00Z");
    let crawl = CrawlRequested {
        request_id: "k1:1".into(),
        user_id: "u1".into(),
        card_id: "k1".into(),
        provider: Provider::Phonepe,
        mode: CrawlMode::Detail,
        order: Some(PageOrder::Desc),
        from: Some(at("2026-03-02T08:00:00Z")),
        limit: Some(u32::MAX),
        txn_id: Some("t1".into()),
    };
    let bodies = vec![
        OutputBody::CrawlRequested(crawl.clone()),
        OutputBody::CrawlRequested(CrawlRequested {
            mode: CrawlMode::OrderCheck,
            order: None,
            from: None,
            limit: None,
            txn_id: None,
            ..crawl
        }),
        OutputBody::MerchantCallback {
            callback_id: "o1:1".into(),
            merchant_id: "m1".into(),
            order_id: "o1".into(),
            kind: OrderKind::Collection,
            status: CallbackStatus::Success,
            amount: Money::from_paise(45_600),
            actual_amount: Some(Money::from_paise(45_599)),
            utr: Some("U1".into()),
        },
        OutputBody::MerchantCallback {
            callback_id: "p1:1".into(),
            merchant_id: "m1".into(),
            order_id: "p1".into(),
            kind: OrderKind::Payout,
            status: CallbackStatus::Cancelled,
            amount: Money::from_rupees(1_000_000_000_000),
            actual_amount: None,
            utr: None,
        },
        OutputBody::Notification {
            user_id: "u1".into(),
            channel: pipelines::output::TELEGRAM,
            kind: NotificationKind::Underpaid,
            text: "₹ underpaid".into(),
        },
        OutputBody::SessionRevoked { user_id: "u1".into() },
        OutputBody::DispatchRejected { order_id: "o1".into(), user_id: "u1".into(), reason: Reason::UserBanned },
        OutputBody::CommandRejected {
            event_id: "line:7".into(),
            input_type: "admin_unban",
            reason: Reason::InvalidTransition,
            message: "not banned".into(),
        },
    ];
    bodies.into_iter().map(|body| Output { at: time, body }).collect()
}

#[test]
fn every_output_type_round_trips() {
    for output in every_output() {
        assert_eq!(round_trip(Topic::Outputs, &output), output);
        let key = OutputKey::for_output(&output);
        assert_eq!(round_trip_key(Topic::Outputs, &key), key);
        if let Some(request) = CrawlRequest::from_output(output.clone()) {
            assert_eq!(round_trip(Topic::CrawlRequests, &request), request);
            assert_eq!(request.into_output(), output);
        }
    }
}

#[test]
fn every_golden_scenario_output_round_trips() {
    let mut outputs = 0;
    let mut types = std::collections::HashSet::new();
    for (path, text) in scenarios() {
        let Ok(scenario) = pipelines::replay::parse_scenario(&text) else { continue };
        let engine = pipelines::replay::run(scenario);
        for output in engine.outputs() {
            assert_eq!(&round_trip(Topic::Outputs, output), output, "{path}");
            types.insert(std::mem::discriminant(&output.body));
            outputs += 1;
        }
    }
    assert!(outputs > 500, "{outputs} outputs");
    assert_eq!(types.len(), 6, "every output type appears in the golden scenarios");
}

/// The JSON the pipelines write for a record (`StageRecord` has no `PartialEq`).
fn json<T: serde::Serialize>(value: &T) -> Json {
    serde_json::to_value(value).expect("serializes")
}

fn stage_record(source: &str, offset: u64, message: Message) -> StageRecord {
    StageRecord {
        id: RecordId { source: source.into(), offset, index: 3 },
        at: at("2026-03-02T09:00:00Z"),
        body: RecordBody::Message { message },
    }
}

fn every_message() -> Vec<Message> {
    let order = |body| Message::Order { order_id: "o1".into(), body };
    let agent = |body| Message::Agent { user_id: "u1".into(), body };
    let merchant = |body| Message::Merchant { merchant_id: "m1".into(), body };
    let command = every_input().swap_remove(20).command; // a crawl_result with lines
    let sub_order = |command, operator: Option<&str>| {
        agent(AgentBody::SubOrder {
            order_id: "o1".into(),
            seq: 2,
            event_id: "e9".into(),
            input_type: "admin_approve",
            command,
            operator: operator.map(pipelines::Text::from),
        })
    };
    let mut messages = vec![
        order(OrderBody::Input { event_id: "e1".into(), command: command.clone() }),
        order(OrderBody::CreationAccepted),
        order(OrderBody::CreationRefused {
            event_id: "e2".into(),
            input_type: "payout_created",
            rejection: Rejection::new(Reason::InsufficientMerchantBalance, "payable 10.00 < 100.00"),
        }),
        order(OrderBody::DispatchAccepted { seq: u32::MAX, user_id: "u1".into(), card_id: "k1".into() }),
        order(OrderBody::DispatchRefused { user_id: "u1".into(), reason: Reason::DeferredDebt }),
        agent(AgentBody::Input { event_id: "e3".into(), command: command.clone() }),
        agent(AgentBody::Dispatch(DispatchRequest {
            order_id: "o1".into(),
            seq: 1,
            kind: OrderKind::Collection,
            amount: Money::from_paise(1),
            card_id: "k1".into(),
            order_problem: None,
            expires_at: None,
            payee: None,
            utr: None,
        })),
        agent(AgentBody::Dispatch(DispatchRequest {
            order_id: "p1".into(),
            seq: 4,
            kind: OrderKind::Payout,
            amount: Money::from_paise(-12_345),
            card_id: "k1".into(),
            order_problem: Some(Reason::OrderExpired),
            expires_at: Some(at("2026-03-02T10:00:00Z")),
            payee: Some(Box::new(Party { vpa: Some("x@y".into()), ..Party::default() })),
            utr: Some("U".into()),
        })),
        merchant(MerchantBody::Input { event_id: "e4".into(), command }),
        merchant(MerchantBody::ValidateCollection { order_id: "o1".into(), event_id: "e5".into() }),
        merchant(MerchantBody::ReservePayout {
            order_id: "p1".into(),
            amount: Money::from_rupees(100),
            event_id: "e6".into(),
        }),
        merchant(MerchantBody::CollectionCredit { order_id: "o1".into(), actual: Money::from_paise(45_600) }),
        merchant(MerchantBody::Clawback { order_id: "o1".into() }),
        merchant(MerchantBody::PayoutSpent { order_id: "p1".into() }),
        merchant(MerchantBody::PayoutRefund { order_id: "p1".into() }),
    ];
    for outcome in [
        SubOutcome::CollectionSucceeded { actual: Money::from_paise(100), utr: Some("U".into()) },
        SubOutcome::CollectionSucceeded { actual: Money::ZERO, utr: None },
        SubOutcome::CollectionCancelled,
        SubOutcome::CollectionCorrected,
        SubOutcome::PayoutSucceeded { paid_total: Money::from_rupees(99) },
        SubOutcome::PayoutReturned,
        SubOutcome::PayoutCancelled,
        SubOutcome::UtrAdded { utr: "U2".into() },
    ] {
        messages.push(order(OrderBody::Outcome { seq: 1, outcome }));
    }
    for (command, operator) in [
        (SubOrderCommand::PaymentConfirmed { utr: None }, None),
        (SubOrderCommand::PaymentConfirmed { utr: Some("U".into()) }, None),
        (SubOrderCommand::Cancel { by: CancelledBy::Merchant }, None),
        (SubOrderCommand::Supplement { utr: Some("U".into()) }, None),
        (SubOrderCommand::Retry, None),
        (SubOrderCommand::Approve { amount: None }, Some("ops")),
        (SubOrderCommand::Approve { amount: Some(Money::from_paise(45_500)) }, Some("ops")),
        (SubOrderCommand::Reject, Some("ops")),
        (SubOrderCommand::CrawlRetry, Some("ops")),
        (SubOrderCommand::CorrectCancel, Some("ops")),
        (SubOrderCommand::CancelPayout, Some("ops")),
    ] {
        messages.push(sub_order(command, operator));
    }
    messages
}

#[test]
fn every_stage_message_type_round_trips() {
    let mut records: Vec<StageRecord> = every_message()
        .into_iter()
        .enumerate()
        .map(|(offset, message)| stage_record("order-0", offset as u64, message))
        .collect();
    records.push(StageRecord {
        id: RecordId { source: "ticker".into(), offset: i64::MAX as u64, index: u32::MAX },
        at: at("2026-03-02T09:00:00Z"),
        body: RecordBody::Tick,
    });
    for record in &records {
        let topic = match &record.body {
            RecordBody::Message { message } => Topic::stage(pipelines::partition::destination(message).0),
            RecordBody::Tick => Topic::AgentStage,
        };
        assert_eq!(json(&round_trip(topic, record)), json(record));
    }
}

/// Drives the golden scenarios' inputs through one partition of each stage and round-trips every
/// record a stage consumes (routed inputs, the messages the stages send each other, ticks).
#[test]
fn every_record_the_stages_exchange_in_the_golden_scenarios_round_trips() {
    let mut checked = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for input in [scenario_inputs()].concat().chunks(20_000) {
        let mut partitions: Vec<StagePartition> =
            StageKind::ALL.iter().map(|kind| StagePartition::new(*kind, 0, 1, Config::default())).collect();
        let mut offsets: HashMap<String, u64> = HashMap::new();
        let mut next_id = |source: &str| {
            let offset = offsets.entry(source.to_string()).or_insert(0);
            *offset += 1;
            RecordId { source: source.into(), offset: *offset, index: 0 }
        };
        let mut queue = std::collections::VecDeque::new();
        for input in input.iter().cloned() {
            let time = input.at;
            match route_input(input) {
                Routed::Message(message) => queue.push_back(StageRecord {
                    id: next_id("ingest"),
                    at: time,
                    body: RecordBody::Message { message },
                }),
                Routed::Broadcast => {
                    queue.push_back(StageRecord { id: next_id("ticker"), at: time, body: RecordBody::Tick })
                }
                Routed::Wallet(_) => {}
            }
            while let Some(record) = queue.pop_front() {
                let stage = match &record.body {
                    RecordBody::Message { message } => pipelines::partition::destination(message).0,
                    RecordBody::Tick => StageKind::Agent,
                };
                let topic = Topic::stage(stage);
                let decoded = round_trip(topic, &record);
                assert_eq!(json(&decoded), json(&record));
                checked += 1;
                if let RecordBody::Message { message } = &record.body {
                    // The body's variant name, from the typed message (how a message lays out its key and
                    // body in JSON is `pipelines::stages::positional`'s business, not this count's).
                    let body = match message {
                        Message::Order { body, .. } => json(body),
                        Message::Agent { body, .. } => json(body),
                        Message::Merchant { body, .. } => json(body),
                    };
                    kinds.insert(match &body {
                        Json::String(name) => name.clone(),
                        Json::Object(object) => object.keys().next().cloned().unwrap_or_default(),
                        _ => String::new(),
                    });
                }
                let index = StageKind::ALL.iter().position(|kind| *kind == stage).expect("a stage");
                let mut produced = Produced::default();
                partitions[index].apply(decoded, &mut produced);
                for (time, message) in produced.messages {
                    queue.push_back(StageRecord {
                        id: next_id(stage.name()),
                        at: time,
                        body: RecordBody::Message { message },
                    });
                }
            }
        }
    }
    assert!(checked > 1_000, "{checked} records");
    assert!(kinds.len() >= 8, "message kinds seen: {kinds:?}");
}

#[test]
fn ticks_changelog_and_keys_round_trip() {
    let tick = ClockTick { at: at("2026-03-02T09:00:00.001Z") };
    assert_eq!(round_trip(Topic::Ticks, &tick), tick);
    let key = TickKey { stage: StageKind::Merchant, partition: 63 };
    assert_eq!(round_trip_key(Topic::Ticks, &key), key);
    for state in [Some(vec![0, 1, 2, 255]), Some(Vec::new()), None] {
        let entry = ChangelogEntry { stage: StageKind::Agent, partition: 3, key: "u1".into(), version: 42, state };
        assert_eq!(round_trip(Topic::Changelog, &entry), entry);
    }
    let key = ChangelogKey { stage: StageKind::Order, partition: 0, key: "o1".into() };
    assert_eq!(round_trip_key(Topic::Changelog, &key), key);
    let order = crate::OrderKey { order_id: "o1".into() };
    assert_eq!(round_trip_key(Topic::OrderStage, &order), order);
    let agent = crate::AgentKey { user_id: "u1".into() };
    assert_eq!(round_trip_key(Topic::AgentStage, &agent), agent);
    assert_eq!(round_trip_key(Topic::StatementResults, &agent), agent);
    assert_eq!(round_trip_key(Topic::CrawlRequests, &agent), agent);
    let merchant = crate::MerchantKey { merchant_id: "m1".into() };
    assert_eq!(round_trip_key(Topic::MerchantStage, &merchant), merchant);
}

#[test]
fn money_is_a_two_decimal_avro_decimal() {
    let money = |paise: i64| {
        let Value::Decimal(decimal) = crate::value::money(Money::from_paise(paise)).expect("fits") else {
            panic!("not a decimal")
        };
        <Vec<u8>>::try_from(&decimal).expect("bytes")
    };
    assert_eq!(money(0), vec![0x00]);
    assert_eq!(money(1), vec![0x01]);
    assert_eq!(money(127), vec![0x7F]);
    assert_eq!(money(128), vec![0x00, 0x80]);
    assert_eq!(money(-1), vec![0xFF]);
    assert_eq!(money(-128), vec![0x80]);
    assert_eq!(money(-129), vec![0xFF, 0x7F]);
    assert_eq!(money(45_600), vec![0x00, 0xB2, 0x20]);
    // The schema says decimal(18, 2): one more digit is refused both ways.
    let largest = Money::from_paise(999_999_999_999_999_999);
    assert!(crate::value::money(largest).is_ok());
    assert!(matches!(crate::value::money(largest.plus(Money::from_paise(1))), Err(Error::OutOfRange(_))));
    let mut fields = crate::value::Fields::of(
        Value::Record(vec![(
            "amount".into(),
            Value::Decimal(apache_avro::Decimal::from(1_000_000_000_000_000_000_i128.to_be_bytes())),
        )]),
        "Test",
    )
    .expect("a record");
    assert!(matches!(fields.money("amount"), Err(Error::OutOfRange(_))));
    // Round trips keep the value and the two decimals.
    for paise in [0, 1, -1, 99, 100, -45_600, 100_000_000_000_000, -999_999_999_999_999_999] {
        let output = Output {
            at: Timestamp::from_millis(0),
            body: OutputBody::MerchantCallback {
                callback_id: "c".into(),
                merchant_id: "m".into(),
                order_id: "o".into(),
                kind: OrderKind::Collection,
                status: CallbackStatus::Success,
                amount: Money::from_paise(paise),
                actual_amount: Some(Money::from_paise(paise)),
                utr: None,
            },
        };
        let decoded = round_trip(Topic::Outputs, &output);
        assert_eq!(decoded, output);
        assert_eq!(json(&decoded), json(&output), "written with two decimals");
    }
}

// ---------------------------------------------------------------------------------------------------
// Wire format

#[test]
fn the_wire_format_is_magic_id_body() {
    let def = embedded(SchemaName::ClockTick).expect("embedded");
    let tick = ClockTick { at: Timestamp::from_millis(1) };
    let bytes = wire::encode(0x0102_0304, def.schema(), "tick", tick.to_avro().expect("a value")).expect("encodes");
    // timestamp 1 ms: zig-zag varint 2.
    assert_eq!(bytes, vec![0, 1, 2, 3, 4, 2]);
    let (id, value) = wire::decode(&bytes, |id| (id == 0x0102_0304).then(|| def.schema()), None).expect("decodes");
    assert_eq!(id, 0x0102_0304);
    assert_eq!(ClockTick::from_avro(value).expect("a tick"), tick);
}

#[test]
fn bad_bytes_are_refused_with_clear_fatal_errors() {
    let codec = codec();
    let tick = ClockTick { at: Timestamp::from_millis(1_000) };
    let good = block_on(codec.encode_value(Topic::Ticks, &tick)).expect("encodes");
    let decode = |bytes: &[u8]| block_on(codec.decode_value::<ClockTick>(Topic::Ticks, bytes));

    let mut bad_magic = good.clone();
    bad_magic[0] = 1;
    assert!(matches!(decode(&bad_magic), Err(Error::BadMagic(1))));
    assert!(matches!(decode(&good[..4]), Err(Error::Truncated(4))));
    assert!(matches!(decode(&[]), Err(Error::Truncated(0))));

    let mut unknown = good.clone();
    unknown[1..5].copy_from_slice(&999_u32.to_be_bytes());
    assert!(matches!(decode(&unknown), Err(Error::UnknownSchemaId(999))));

    let mut trailing = good.clone();
    trailing.push(0);
    assert!(matches!(decode(&trailing), Err(Error::BodyMismatch { id: 6, .. })));
    assert!(matches!(decode(&good[..5]), Err(Error::BodyMismatch { id: 6, .. })), "empty body");

    // A body written with another schema than its id says: a union index out of range.
    let mut wrong = wire::frame(SchemaName::Output.static_id(), &[0x02, 0x7E]);
    assert!(matches!(
        block_on(codec.decode_value::<Output>(Topic::Outputs, &wrong)),
        Err(Error::BodyMismatch { id: 5, .. })
    ));
    wrong.truncate(5);

    // Keys and values of another topic's schema.
    assert!(matches!(
        block_on(codec.encode_value(Topic::Outputs, &tick)),
        Err(Error::WrongTopic { topic: "paisa.outputs", .. })
    ));
    assert!(matches!(
        decode(
            &block_on(codec.encode_key(Topic::Ticks, &TickKey { stage: StageKind::Order, partition: 0 }))
                .expect("encodes")
        ),
        Err(Error::WrongTopic { .. }) | Err(Error::BodyMismatch { .. }) | Err(Error::Shape(_))
    ));

    for error in [
        decode(&bad_magic).expect_err("bad"),
        decode(&good[..4]).expect_err("bad"),
        decode(&unknown).expect_err("bad"),
        decode(&trailing).expect_err("bad"),
    ] {
        assert!(!error.is_retryable(), "{error} is fatal");
        assert!(!error.to_string().is_empty());
    }
}

#[test]
fn out_of_range_values_are_refused_when_encoding() {
    let record = StageRecord {
        id: RecordId { source: "s".into(), offset: u64::MAX, index: 0 },
        at: Timestamp::from_millis(0),
        body: RecordBody::Tick,
    };
    assert!(matches!(record.to_avro(), Err(Error::OutOfRange(_))));
    let rejected = Output {
        at: Timestamp::from_millis(0),
        body: OutputBody::CommandRejected {
            event_id: "e".into(),
            input_type: "not_an_input",
            reason: Reason::InvalidTransition,
            message: String::new(),
        },
    };
    assert!(matches!(rejected.to_avro(), Err(Error::Shape(_))));
}

// ---------------------------------------------------------------------------------------------------
// Schema evolution under BACKWARD compatibility

/// Input.avsc with one more field in `collection_created`, as the next version of the schema would add.
fn evolved_input(field: Json) -> SchemaDef {
    fn add(json: &mut Json, field: &Json) -> bool {
        match json {
            Json::Object(object) if object.get("name") == Some(&Json::from("CollectionCreated")) => {
                object.get_mut("fields").and_then(Json::as_array_mut).map(|fields| fields.push(field.clone())).is_some()
            }
            Json::Object(object) => object.values_mut().any(|value| add(value, field)),
            Json::Array(items) => items.iter_mut().any(|item| add(item, field)),
            _ => false,
        }
    }
    let mut json: Json = serde_json::from_str(SchemaName::Input.text()).expect("JSON");
    assert!(add(&mut json, &field), "CollectionCreated is in Input.avsc");
    SchemaDef::parse(serde_json::to_string_pretty(&json).expect("JSON")).expect("the evolved schema parses")
}

fn optional_field() -> SchemaDef {
    evolved_input(serde_json::json!({"name": "channel", "type": ["null", "string"], "default": null}))
}

fn required_field() -> SchemaDef {
    evolved_input(serde_json::json!({"name": "channel", "type": "string"}))
}

#[test]
fn adding_an_optional_field_with_a_default_is_backward_compatible() {
    let old = embedded(SchemaName::Input).expect("embedded");
    let new = optional_field();
    // BACKWARD: the new schema reads what the old one wrote.
    SchemaCompatibility::can_read(old.schema(), new.schema()).expect("backward compatible");
    // And here FORWARD too: the old reader ignores the new field.
    SchemaCompatibility::can_read(new.schema(), old.schema()).expect("forward compatible");
}

#[test]
fn adding_a_required_field_without_a_default_is_refused() {
    let old = embedded(SchemaName::Input).expect("embedded");
    let new = required_field();
    assert!(SchemaCompatibility::can_read(old.schema(), new.schema()).is_err(), "old data lacks the field");
}

#[test]
fn old_writer_bytes_decode_with_the_new_reader_schema() {
    let old = embedded(SchemaName::Input).expect("embedded");
    let new = optional_field();
    let inputs = every_input();
    for input in &inputs {
        let bytes = wire::encode(1, old.schema(), "old", input.to_avro().expect("a value")).expect("encodes");
        let (_, value) = wire::decode(&bytes, |_| Some(old.schema()), Some(new.schema())).expect("resolves");
        if let Command::CollectionCreated(_) = input.command {
            let Value::Record(fields) = &value else { panic!("a record") };
            let Some((_, Value::Union(_, command))) = fields.iter().find(|(name, _)| name == "command") else {
                panic!("a command")
            };
            let Value::Record(fields) = command.as_ref() else { panic!("a record") };
            let channel = fields.iter().find(|(name, _)| name == "channel").map(|(_, value)| value.clone());
            assert_eq!(channel, Some(Value::Union(0, Box::new(Value::Null))), "the reader's default fills it");
        }
        assert_eq!(&Input::from_avro(value).expect("converts"), input);
    }
    // A consumer on the new version reads the old producer's messages through the codec too: a static
    // resolver that knows the old schema under id 1 and a reader that is "the new version".
    let required = required_field();
    let bytes = wire::encode(1, old.schema(), "old", inputs[8].to_avro().expect("a value")).expect("encodes");
    assert!(
        wire::decode(&bytes, |_| Some(old.schema()), Some(required.schema())).is_err(),
        "without a default the old data cannot be read"
    );
}

// ---------------------------------------------------------------------------------------------------
// Schema Registry (a fake one over real HTTP on loopback)

#[derive(Default)]
struct FakeRegistry {
    /// Schema texts by id − 1.
    schemas: Vec<String>,
    /// Ids registered under each subject, oldest first.
    subjects: HashMap<String, Vec<u32>>,
    requests: usize,
    /// Answer the next requests with 503.
    failing: usize,
}

type Shared = Arc<Mutex<FakeRegistry>>;

fn registry_error(status: u16, code: i64, message: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = axum::http::StatusCode::from_u16(status).expect("a status");
    (status, axum::Json(serde_json::json!({"error_code": code, "message": message}))).into_response()
}

fn schema_of(body: &[u8]) -> Result<(String, apache_avro::Schema), Box<axum::response::Response>> {
    let refuse = |message: &str| Box::new(registry_error(422, 42201, message));
    let request: Json = serde_json::from_slice(body).map_err(|_| refuse("not JSON"))?;
    let text = request["schema"].as_str().ok_or_else(|| refuse("no schema"))?.to_string();
    let schema = apache_avro::Schema::parse_str(&text).map_err(|error| refuse(&error.to_string()))?;
    Ok((text, schema))
}

async fn register(
    axum::extract::State(state): axum::extract::State<Shared>,
    axum::extract::Path(subject): axum::extract::Path<String>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut registry = state.lock().expect("the fake registry");
    registry.requests += 1;
    if registry.failing > 0 {
        registry.failing -= 1;
        return registry_error(503, 50003, "try again");
    }
    let (text, schema) = match schema_of(&body) {
        Ok(parsed) => parsed,
        Err(response) => return *response,
    };
    // The same schema has one id, whatever the subject (as Confluent's registry does).
    let existing = registry.schemas.iter().position(|known| *known == text).map(|index| index as u32 + 1);
    let versions = registry.subjects.get(&subject).cloned().unwrap_or_default();
    if let Some(id) = existing.filter(|id| versions.contains(id)) {
        return axum::Json(serde_json::json!({"id": id})).into_response();
    }
    // BACKWARD (the default level): the new schema must read data of the latest version.
    if let Some(latest) = versions.last() {
        let writer = apache_avro::Schema::parse_str(&registry.schemas[*latest as usize - 1]).expect("stored");
        if let Err(error) = SchemaCompatibility::can_read(&writer, &schema) {
            return registry_error(409, 409, &format!("incompatible with the latest version: {error}"));
        }
    }
    let id = match existing {
        Some(id) => id,
        None => {
            registry.schemas.push(text);
            registry.schemas.len() as u32
        }
    };
    registry.subjects.entry(subject).or_default().push(id);
    axum::Json(serde_json::json!({"id": id})).into_response()
}

async fn schema_by_id(
    axum::extract::State(state): axum::extract::State<Shared>,
    axum::extract::Path(id): axum::extract::Path<u32>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut registry = state.lock().expect("the fake registry");
    registry.requests += 1;
    match registry.schemas.get((id as usize).wrapping_sub(1)) {
        Some(text) => axum::Json(serde_json::json!({"schema": text})).into_response(),
        None => registry_error(404, 40403, "Schema not found"),
    }
}

async fn compatibility(
    axum::extract::State(state): axum::extract::State<Shared>,
    axum::extract::Path(subject): axum::extract::Path<String>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut registry = state.lock().expect("the fake registry");
    registry.requests += 1;
    let (_, schema) = match schema_of(&body) {
        Ok(parsed) => parsed,
        Err(response) => return *response,
    };
    let Some(latest) = registry.subjects.get(&subject).and_then(|versions| versions.last()) else {
        return registry_error(404, 40401, "Subject not found");
    };
    let writer = apache_avro::Schema::parse_str(&registry.schemas[*latest as usize - 1]).expect("stored");
    let compatible = SchemaCompatibility::can_read(&writer, &schema).is_ok();
    axum::Json(serde_json::json!({"is_compatible": compatible})).into_response()
}

/// Starts the fake registry on a loopback port; answers its base URL.
async fn fake_registry(state: Shared) -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route("/subjects/{subject}/versions", post(register))
        .route("/schemas/ids/{id}", get(schema_by_id))
        .route("/compatibility/subjects/{subject}/versions/latest", post(compatibility))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

#[tokio::test]
async fn the_registry_resolver_registers_fetches_and_caches() {
    let state = Shared::default();
    let base = fake_registry(Arc::clone(&state)).await;
    let codec = TopicCodec::new(RegistryResolver::new(&base).expect("a client"));

    let inputs = every_input();
    let mut encoded = Vec::new();
    for input in &inputs {
        encoded.push(codec.encode_value(Topic::Commands, input).await.expect("encodes"));
    }
    let key = CommandKey::for_input(&inputs[0]);
    let key_bytes = codec.encode_key(Topic::Commands, &key).await.expect("encodes");
    assert_eq!(state.lock().expect("state").requests, 2, "one registration per subject, then cached");
    {
        let registry = state.lock().expect("state");
        assert_eq!(registry.subjects["paisa.commands-value"], vec![1]);
        assert_eq!(registry.subjects["paisa.commands-key"], vec![2]);
    }
    for (bytes, input) in encoded.iter().zip(&inputs) {
        assert_eq!(&codec.decode_value::<Input>(Topic::Commands, bytes).await.expect("decodes"), input);
    }
    assert_eq!(codec.decode_key::<CommandKey>(Topic::Commands, &key_bytes).await.expect("decodes"), key);
    assert_eq!(state.lock().expect("state").requests, 4, "each schema fetched once");
    assert_eq!(codec.resolver().cached(), (2, 2));

    // The same schema under another subject has the same id (a registration, no new schema).
    let resolver = codec.resolver();
    let agent_key = embedded(SchemaName::AgentKey).expect("embedded");
    let first = resolver.id_for(Topic::AgentStage.key_subject(), agent_key).await.expect("registers");
    let second = resolver.id_for(Topic::StatementResults.key_subject(), agent_key).await.expect("registers");
    assert_eq!(first, second);

    // An id the registry does not know: fatal.
    let error = resolver.schema_for(77).await.expect_err("unknown");
    assert!(matches!(error, Error::UnknownSchemaId(77)), "{error}");
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn the_registry_refuses_an_incompatible_schema_and_accepts_a_compatible_one() {
    let state = Shared::default();
    let base = fake_registry(Arc::clone(&state)).await;
    let resolver = RegistryResolver::new(&base).expect("a client");
    let subject = Topic::Commands.value_subject();
    let old = embedded(SchemaName::Input).expect("embedded");
    let old_id = resolver.id_for(subject, old).await.expect("registers");

    let required = required_field();
    assert!(!resolver.is_compatible(subject, &required).await.expect("answers"));
    let error = resolver.id_for(subject, &required).await.expect_err("refused");
    assert!(matches!(error, Error::Incompatible { .. }), "{error}");
    assert!(!error.is_retryable(), "an incompatible schema is fatal");

    let optional = optional_field();
    assert!(resolver.is_compatible(subject, &optional).await.expect("answers"));
    assert!(resolver.is_compatible("no-such-subject", &optional).await.expect("answers"), "nothing to break");
    let new_id = resolver.id_for(subject, &optional).await.expect("registers");
    assert_ne!(new_id, old_id);

    // A producer still on the old version and a consumer on the new one: the consumer reads through
    // the old writer schema fetched by id and resolves it to its own.
    let input = &every_input()[8];
    let bytes = wire::encode(old_id, old.schema(), "old", input.to_avro().expect("a value")).expect("encodes");
    let (id, body) = wire::unframe(&bytes).expect("framed");
    let writer = resolver.schema_for(id).await.expect("fetched");
    let value = wire::decode_body(id, body, &writer, Some(optional.schema())).expect("resolves");
    assert_eq!(&Input::from_avro(value).expect("converts"), input);
}

#[tokio::test]
async fn registry_outages_are_retryable() {
    let state = Shared::default();
    let base = fake_registry(Arc::clone(&state)).await;
    let resolver = RegistryResolver::new(&base).expect("a client");
    let def = embedded(SchemaName::ClockTick).expect("embedded");
    state.lock().expect("state").failing = 1;
    let error = resolver.id_for("paisa.ticks-value", def).await.expect_err("503");
    assert!(matches!(error, Error::RegistryUnavailable { status: 503, .. }), "{error}");
    assert!(error.is_retryable());
    assert_eq!(resolver.id_for("paisa.ticks-value", def).await.expect("the retry succeeds"), 1);

    // Nobody listening: a port that was just free.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("an address");
    drop(listener);
    let resolver = RegistryResolver::with_options(&format!("http://{address}"), 8, std::time::Duration::from_secs(2))
        .expect("a client");
    let error = resolver.id_for("paisa.ticks-value", def).await.expect_err("unreachable");
    assert!(matches!(error, Error::RegistryUnreachable(_)), "{error}");
    assert!(error.is_retryable());
    let error = resolver.schema_for(1).await.expect_err("unreachable");
    assert!(error.is_retryable());
}

#[tokio::test]
async fn the_registry_caches_are_bounded() {
    let state = Shared::default();
    let base = fake_registry(Arc::clone(&state)).await;
    let resolver = RegistryResolver::with_options(&base, 3, std::time::Duration::from_secs(5)).expect("a client");
    for topic in Topic::ALL {
        let def = embedded(topic.value_schema()).expect("embedded");
        let id = resolver.id_for(topic.value_subject(), def).await.expect("registers");
        resolver.schema_for(id).await.expect("fetches");
    }
    assert_eq!(resolver.cached(), (3, 3));
    // An evicted entry is asked again and still gets its id.
    let def = embedded(SchemaName::Input).expect("embedded");
    assert_eq!(resolver.id_for(Topic::Commands.value_subject(), def).await.expect("registers"), 1);
}

#[test]
fn the_static_resolver_knows_only_its_schemas() {
    let resolver = StaticResolver::new().expect("parses");
    let optional = optional_field();
    let error = block_on(resolver.id_for("paisa.commands-value", &optional)).expect_err("not embedded");
    assert!(matches!(error, Error::NotRegistered { .. }));
    let resolver = resolver.with_schema(100, &optional);
    assert_eq!(block_on(resolver.id_for("paisa.commands-value", &optional)).expect("added"), 100);
    assert!(block_on(resolver.schema_for(100)).is_ok());
    assert!(matches!(block_on(resolver.schema_for(101)), Err(Error::UnknownSchemaId(101))));
}

/// Sizes of the golden scenarios' inputs as Avro (framed) and as SPEC §5 JSON, printed for the README.
#[test]
fn avro_is_smaller_than_json() {
    let inputs = scenario_inputs();
    let codec = codec();
    let (mut avro, mut json_bytes) = (0usize, 0usize);
    for input in &inputs {
        avro += block_on(codec.encode_value(Topic::Commands, input)).expect("encodes").len();
        json_bytes += serde_json::to_vec(input).expect("serializes").len();
    }
    println!("{} inputs: {avro} bytes as framed Avro, {json_bytes} as JSON", inputs.len());
    assert!(avro < json_bytes);
}

/// Why `resolve` exists: apache-avro 0.21 resolves a union value to the first reader branch it fits,
/// not to the branch of the same name. If this starts failing, upstream fixed it and `resolve` may go.
#[test]
fn apache_avro_resolves_union_branches_by_shape_not_by_name() {
    let old = embedded(SchemaName::Input).expect("embedded");
    let new = optional_field();
    let input = &every_input()[8];
    assert!(matches!(input.command, Command::CollectionCreated(_)));
    let body = apache_avro::to_avro_datum(old.schema(), input.to_avro().expect("a value")).expect("encodes");
    let upstream =
        apache_avro::from_avro_datum(old.schema(), &mut body.as_slice(), Some(new.schema())).expect("resolves");
    let upstream = Input::from_avro(upstream).expect("converts");
    assert!(matches!(upstream.command, Command::MerchantDeposit(_)), "upstream picked {:?}", upstream.command);
    let (_, ours) = wire::decode(&wire::frame(1, &body), |_| Some(old.schema()), Some(new.schema())).expect("resolves");
    assert_eq!(&Input::from_avro(ours).expect("converts"), input);
}

/// A producer already on the next version (an optional field more) and a consumer still on this one:
/// the codec resolves the writer's schema, found by id, to its own and drops the field it does not know.
#[test]
fn the_codec_reads_a_newer_writer_through_its_own_schema() {
    let new = optional_field();
    let codec = TopicCodec::new(StaticResolver::new().expect("parses").with_schema(100, &new));
    for input in every_input() {
        let mut value = input.to_avro().expect("a value");
        if let Value::Record(fields) = &mut value {
            if let Some((_, Value::Union(_, command))) = fields.iter_mut().find(|(name, _)| name == "command") {
                if let (Command::CollectionCreated(_), Value::Record(command)) = (&input.command, command.as_mut()) {
                    command.push(("channel".into(), Value::Union(1, Box::new(Value::String("web".into())))));
                }
            }
        }
        let bytes = wire::encode(100, new.schema(), "new", value).expect("encodes with the new schema");
        assert_eq!(block_on(codec.decode_value::<Input>(Topic::Commands, &bytes)).expect("decodes"), input);
    }
}
