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
