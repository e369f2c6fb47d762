//! Helpers for the golden scenarios: a scenario's expectation file and the subset match that checks it.
//!
//! An expectation (`NAME.expect.json` beside `NAME.jsonl`) holds:
//! - `rules`: the rule ids the scenario covers (every id of SPEC §7 must be cited by one);
//! - `expect`: a subset of the SPEC §9 document: objects match key by key (keys absent from the
//!   expectation are not checked), arrays must have the same length and match element by element,
//!   scalars must be equal;
//! - `outputs` (optional): the document's outputs, filtered to the `type`s this list names, must match
//!   this list exactly (same length, each element a subset match), in order;
//! - `absent_output_types` (optional): output types that must not appear at all;
//! - `error_line` (optional): the scenario is structurally bad and must stop at this line (exit 2).

use serde_json::Value;

/// Checks `actual` against the subset `expected`; returns the first difference with its JSON path.
pub fn subset_match(expected: &Value, actual: &Value, path: &str) -> Result<(), String> {
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => {
            for (key, want_value) in want {
                let child = format!("{path}.{key}");
                match have.get(key) {
                    Some(have_value) => subset_match(want_value, have_value, &child)?,
                    None => return Err(format!("{child}: missing (expected {want_value})")),
                }
            }
            Ok(())
        }
        (Value::Array(want), Value::Array(have)) => {
            if want.len() != have.len() {
                return Err(format!("{path}: expected {} elements, got {}: {}", want.len(), have.len(), actual));
            }
            for (index, (want_value, have_value)) in want.iter().zip(have).enumerate() {
                subset_match(want_value, have_value, &format!("{path}[{index}]"))?;
            }
            Ok(())
        }
        _ if expected == actual => Ok(()),
        _ => Err(format!("{path}: expected {expected}, got {actual}")),
    }
}

/// Checks a replayed document against an expectation (see the module documentation).
pub fn check_expectation(expectation: &Value, document: &Value) -> Result<(), String> {
    if let Some(expect) = expectation.get("expect") {
        subset_match(expect, document, "$")?;
    }
    let outputs = document.get("outputs").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(Value::Array(wanted)) = expectation.get("outputs") {
        let types: Vec<&str> = wanted.iter().filter_map(|item| item.get("type").and_then(Value::as_str)).collect();
        let filtered: Vec<Value> = outputs
            .iter()
            .filter(|output| output.get("type").and_then(Value::as_str).is_some_and(|kind| types.contains(&kind)))
            .cloned()
            .collect();
        subset_match(&Value::Array(wanted.clone()), &Value::Array(filtered), "$.outputs")?;
    }
    if let Some(Value::Array(absent)) = expectation.get("absent_output_types") {
        for kind in absent.iter().filter_map(Value::as_str) {
            if let Some(found) = outputs.iter().find(|output| output.get("type").and_then(Value::as_str) == Some(kind))
            {
                return Err(format!("output type {kind} must not appear, found {found}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset_match_checks_named_keys_and_whole_arrays() {
        let actual = json!({"a": 1, "b": [{"x": 1, "y": 2}], "c": "z"});
        assert!(subset_match(&json!({"a": 1}), &actual, "$").is_ok());
        assert!(subset_match(&json!({"b": [{"x": 1}]}), &actual, "$").is_ok());
        assert!(subset_match(&json!({"a": 2}), &actual, "$").is_err());
        assert!(subset_match(&json!({"b": []}), &actual, "$").is_err());
        assert!(subset_match(&json!({"d": 1}), &actual, "$").is_err());
    }

    #[test]
    fn outputs_are_filtered_by_the_named_types() {
        let document = json!({"outputs": [
            {"type": "crawl_requested", "request_id": "k:1"},
            {"type": "merchant_callback", "status": "success"}
        ]});
        let good = json!({"outputs": [{"type": "merchant_callback", "status": "success"}]});
        assert!(check_expectation(&good, &document).is_ok());
        let wrong = json!({"outputs": [{"type": "merchant_callback", "status": "cancelled"}]});
        assert!(check_expectation(&wrong, &document).is_err());
        let absent = json!({"absent_output_types": ["dispatch_rejected"]});
        assert!(check_expectation(&absent, &document).is_ok());
        let present = json!({"absent_output_types": ["crawl_requested"]});
        assert!(check_expectation(&present, &document).is_err());
    }
}
