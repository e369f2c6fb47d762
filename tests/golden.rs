//! Golden scenarios (`tests/scenarios/*.jsonl`): each is replayed through the engine exactly as
//! `paisa replay` does and checked against its `.expect.json`; every rule id of SPEC §7 must be cited.

use paisa_tests::check_expectation;
use pipelines::replay::{parse_scenario, replay_to_json};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

fn scenarios() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(scenario_dir())
        .expect("tests/scenarios exists")
        .map(|entry| entry.expect("readable directory").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    paths.sort();
    paths
}

fn expectation_of(path: &Path) -> Value {
    let expect_path = path.with_extension("expect.json");
    let text =
        std::fs::read_to_string(&expect_path).unwrap_or_else(|_| panic!("{} has no expectation", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", expect_path.display()))
}

#[test]
fn every_golden_scenario_matches_its_expectation() {
    let mut failures = Vec::new();
    let paths = scenarios();
    assert!(!paths.is_empty(), "no scenarios found");
    for path in &paths {
        let text = std::fs::read_to_string(path).expect("readable scenario");
        let expectation = expectation_of(path);
        let name = path.file_name().unwrap_or_default().to_string_lossy().to_string();
        if let Some(line) = expectation.get("error_line").and_then(Value::as_u64) {
            match parse_scenario(&text) {
                Err(error) if error.line() as u64 == line => {}
                Err(error) => {
                    failures.push(format!("{name}: stopped at line {} ({error}), expected {line}", error.line()))
                }
                Ok(_) => failures.push(format!("{name}: expected a structural error at line {line}")),
            }
            continue;
        }
        let first = match replay_to_json(&text) {
            Ok(document) => document,
            Err(error) => {
                failures.push(format!("{name}: {error}"));
                continue;
            }
        };
        let second = replay_to_json(&text).expect("the same text parses twice");
        if first != second {
            failures.push(format!("{name}: two replays differ"));
        }
        let document: Value = serde_json::from_str(&first).expect("the document is JSON");
        if let Err(difference) = check_expectation(&expectation, &document) {
            failures.push(format!("{name}: {difference}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} scenarios failed:\n{}", failures.len(), paths.len(), failures.join("\n"));
}

/// The rule ids of SPEC §7, as of the spec this engine implements (checked against the spec itself
/// when `../shared/SPEC.md` is beside the checkout).
const RULE_IDS: [&str; 52] = [
    "R-ADMIN-1",
    "R-ADMIN-3",
    "R-ADMIN-4",
    "R-AUDIT-1",
    "R-BAL-1",
    "R-CHK-1",
    "R-CHK-2",
    "R-CHK-3",
    "R-CLOSE-1",
    "R-CLOSE-2",
    "R-CLOSE-3",
    "R-DEBT-1",
    "R-DEBT-2",
    "R-DEBT-3",
    "R-DSP-1",
    "R-DSP-2",
    "R-ERR-1",
    "R-ERR-2",
    "R-EXP-1",
    "R-HIS-1",
    "R-HIS-2",
    "R-HIS-3",
    "R-IN-1",
    "R-JRN-1",
    "R-JRN-2",
    "R-JRN-3",
    "R-MATCH-C1",
    "R-MATCH-C2",
    "R-MATCH-C3",
    "R-MATCH-P1",
    "R-MATCH-P2",
    "R-MATCH-P3",
    "R-MATCH-P4",
    "R-MATCH-P5",
    "R-MER-1",
    "R-MER-2",
    "R-MER-3",
    "R-MER-4",
    "R-MER-5",
    "R-PAY-1",
    "R-PAY-2",
    "R-PEND-1",
    "R-PEND-2",
    "R-POST-1",
    "R-POST-2",
    "R-REAUTH-1",
    "R-TIMER-1",
    "R-WAVE-1",
    "R-WAVE-2",
    "R-WIN-1",
    "R-WIN-2",
    "R-WIN-3",
];

#[test]
fn the_rule_list_is_the_spec_s() {
    let spec = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/SPEC.md"));
    let Ok(spec) = spec else {
        eprintln!("SKIPPED: ../shared/SPEC.md is not beside the checkout; using the embedded rule list");
        return;
    };
    let section = spec.split("## 7. Rules").nth(1).and_then(|rest| rest.split("## 8.").next()).unwrap_or_default();
    let mut rules = BTreeSet::new();
    for (index, _) in section.match_indices("**R-") {
        let id: String = section[index + 2..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        rules.insert(id);
    }
    let embedded: BTreeSet<String> = RULE_IDS.iter().map(|id| id.to_string()).collect();
    assert_eq!(rules, embedded, "SPEC §7 changed: update RULE_IDS");
}

#[test]
fn every_rule_of_the_spec_is_cited_by_a_scenario() {
    let rules: BTreeSet<String> = RULE_IDS.iter().map(|id| id.to_string()).collect();
    let mut cited = BTreeSet::new();
    for path in scenarios() {
        if let Some(Value::Array(ids)) = expectation_of(&path).get("rules") {
            cited.extend(ids.iter().filter_map(Value::as_str).map(str::to_string));
        }
    }
    let missing: Vec<&String> = rules.difference(&cited).collect();
    assert!(missing.is_empty(), "rule ids no scenario cites: {missing:?}");
}

/// R-CHK-1's timeout cannot be reached through replay (the simulated provider always answers within
/// `crawl_latency` < `crawl_timeout`), so this drives the engine without a provider, as the services do,
/// and answers (or not) by hand.
#[test]
fn a_check_without_answer_counts_as_busy_and_a_late_answer_is_ignored() {
    use pipelines::input::{parse_line, Parsed};
    use pipelines::{Config, Engine};
    let mut engine = Engine::new(Config::default(), None);
    let lines = [
        r#"{"type":"merchant_registered","at":"2026-03-02T09:00:00Z","merchant_id":"m","collection_fee_rate":"0.00","payout_fee_rate":"0.00","payout_fee_fixed":"0.00"}"#,
        r#"{"type":"user_registered","at":"2026-03-02T09:00:00Z","user_id":"u","telegram_bound":false}"#,
        r#"{"type":"card_bound","at":"2026-03-02T09:00:00Z","user_id":"u","card_id":"k","provider":"paytm"}"#,
        r#"{"type":"user_recharge","at":"2026-03-02T09:00:00Z","user_id":"u","amount":"500.00","commission":"0.00"}"#,
        r#"{"type":"collection_created","at":"2026-03-02T09:00:00Z","order_id":"o","merchant_id":"m","amount":"100.00"}"#,
        r#"{"type":"collection_dispatched","at":"2026-03-02T09:00:00Z","order_id":"o","user_id":"u","card_id":"k"}"#,
        // Nobody answers k:1 (asked at 09:02:00): at 09:03:00 it counts as busy, retried at 09:03:30 as k:2.
        r#"{"type":"tick","at":"2026-03-02T09:03:40Z"}"#,
        // The late answer to k:1 is ignored; the answer to k:2 matches.
        r#"{"type":"crawl_result","at":"2026-03-02T09:03:41Z","request_id":"k:1","user_id":"u","card_id":"k","ok":true,"lines":[{"txn_id":"L0","utr":null,"direction":"in","amount":"100.00","status":"success","time":"2026-03-02T09:01:00Z","counterparty":{}}]}"#,
        r#"{"type":"crawl_result","at":"2026-03-02T09:03:42Z","request_id":"k:2","user_id":"u","card_id":"k","ok":true,"lines":[{"txn_id":"L1","utr":"777","direction":"in","amount":"100.00","status":"success","time":"2026-03-02T09:01:00Z","counterparty":{}}]}"#,
    ];
    for (index, line) in lines.iter().enumerate() {
        let Ok(Parsed::Input(input)) = parse_line(line, || format!("line:{}", index + 1)) else {
            panic!("line {} does not parse", index + 1)
        };
        engine.apply(input);
    }
    let document: Value = serde_json::to_value(engine.document()).expect("document");
    let requests: Vec<(String, String)> = document["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .filter(|output| output["type"] == "crawl_requested")
        .map(|output| {
            (
                output["request_id"].as_str().unwrap_or_default().to_string(),
                output["at"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        requests,
        vec![
            ("k:1".to_string(), "2026-03-02T09:02:00Z".to_string()),
            ("k:2".to_string(), "2026-03-02T09:03:30Z".to_string())
        ]
    );
    let sub = &document["orders"]["o"]["sub_orders"][0];
    assert_eq!(sub["state"], "success");
    assert_eq!(sub["matched_txn_ids"], serde_json::json!(["L1"]), "the late answer to k:1 changed nothing");
    assert_eq!(document["orders"]["o"]["utr"], "777");
    assert!(
        document["outputs"].as_array().expect("outputs").iter().all(|output| output["type"] != "command_rejected"),
        "an ignored answer is not a rejection"
    );
}

/// The README's replay example is the quick-start scenario and prints exactly the state it shows.
#[test]
fn the_readme_example_prints_what_the_readme_shows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let block = |fence: &str| -> String {
        let start = readme.find(fence).unwrap_or_else(|| panic!("README has no {fence} block")) + fence.len();
        let end = readme[start..].find("\n```").expect("closed block") + start;
        readme[start..end].trim_start_matches('\n').to_string()
    };
    let scenario = block("```jsonl\n");
    let quickstart = std::fs::read_to_string(root.join("examples/quickstart.jsonl")).expect("quick-start scenario");
    assert_eq!(scenario.trim_end(), quickstart.trim_end(), "README scenario differs from examples/quickstart.jsonl");
    let shown = block("```json\n");
    let printed = replay_to_json(&quickstart).expect("the quick-start replays");
    assert_eq!(
        printed.trim_end(),
        shown.trim_end(),
        "README output differs from `paisa replay examples/quickstart.jsonl`"
    );
}

/// R-AUDIT-1: an operator's decision names the operator (evidence text is not compared elsewhere).
#[test]
fn operator_decisions_name_the_operator() {
    let text = std::fs::read_to_string(scenario_dir().join("a_admin_correct_cancel.jsonl")).expect("scenario");
    let document: Value = serde_json::from_str(&replay_to_json(&text).expect("replays")).expect("JSON");
    let corrections: Vec<&Value> = document["orders"]
        .as_object()
        .expect("orders")
        .values()
        .flat_map(|order| order["sub_orders"].as_array().into_iter().flatten())
        .flat_map(|sub| sub["timeline"].as_array().into_iter().flatten())
        .filter(|entry| entry["rule"] == "R-ADMIN-3")
        .collect();
    assert!(!corrections.is_empty(), "the scenario corrects collections");
    for entry in corrections {
        let evidence = entry["evidence"].as_str().unwrap_or_default();
        assert!(evidence.starts_with("by "), "R-ADMIN-3 entry without its operator: {entry}");
    }
}
