//! Ingestion: request bodies become SPEC §5 inputs, checked, then appended all or nothing.
//! `POST /v1/events` takes any §5 event (or an array of them); the typed endpoints build one and come
//! through [`ingest`] the same way.

use super::auth::{hex, Caller};
use super::error::ApiError;
use super::validate::Known;
use super::{ApiState, ClockMode};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use connectors::runtime::Appended;
use pipelines::envelope::Envelope;
use pipelines::input::{parse_input_object, Command, ParseError};
use pipelines::{Input, Timestamp};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// A request body as the handlers receive it: the rejection carries the body-limit case (413).
pub type Body = Result<Bytes, BytesRejection>;

pub type Accepted = (StatusCode, Json<AcceptedBody>);

#[derive(Debug, Serialize)]
pub struct AcceptedBody {
    pub accepted: Vec<AcceptedEvent>,
}

#[derive(Debug, Serialize)]
pub struct AcceptedEvent {
    pub event_id: String,
    pub position: u64,
    pub duplicate: bool,
}

/// Types `POST /v1/events` refuses, and why.
fn refusal(type_name: &str) -> Option<&'static str> {
    match type_name {
        "config" => Some("configuration is fixed when the service starts"),
        "wallet_line" | "wallet_line_status" | "wallet_fault" => {
            Some("simulated-wallet events go to `paisa wallet-sim`, not to the pipeline")
        }
        _ => None,
    }
}

/// `POST /v1/events` (admin): one §5 event object, or an array of them validated together.
pub async fn post_events(State(state): State<ApiState>, caller: Caller, body: Body) -> Result<Accepted, ApiError> {
    caller.require_admin()?;
    let bytes = read_bytes(&state, body)?;
    // The body is parsed where it is checked and appended ([`run_blocking`]), not among an async
    // worker's tasks: a bulk body (up to 1,000 events, ≈ 500 KiB) takes a millisecond or more to parse,
    // which would hold up the reads queued on that worker.
    let accepted = run_blocking(move || {
        if let Some(inputs) = read_bulk(&state, &caller, &bytes) {
            let inputs =
                check_all(&state, inputs.into_iter().map(Ok)).map_err(|(index, error)| error.in_event(index))?;
            return append(&state, inputs);
        }
        match parse_json(&bytes)? {
            Value::Object(object) => check_and_append(&state, &caller, vec![object], |_, error| error),
            Value::Array(items) => {
                let objects = objects_of(items, state.limits.events_per_request_max)?;
                check_and_append(&state, &caller, objects, |index, error| error.in_event(index))
            }
            _ => Err(ApiError::MalformedJson("expected an event object or an array of event objects".to_string())),
        }
    })
    .await??;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

/// Runs `work`, which blocks (it checks against materialised state and waits for a durable commit), off
/// the async workers' task queues. On the multi-threaded runtime the service runs on it stays on this
/// thread (`block_in_place`): the worker's other tasks move to another thread, and the request is not
/// handed to a blocking thread and back, two wake-ups that each waited for a core on the serve
/// benchmark's busy 2 cores (≈ 0.2 ms to take a bulk request, more to return it; `docs/PERFORMANCE.md`,
/// fifty-eighth round). Elsewhere (tests on a current-thread runtime, where `block_in_place` is not
/// allowed) it runs on the blocking pool.
async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if connectors::runtime::may_block_in_place() {
        Ok(tokio::task::block_in_place(work))
    } else {
        tokio::task::spawn_blocking(work).await
    }
}

/// The fast path of a bulk request: its events read straight into inputs (`pipelines::envelope`,
/// ≈ 3.5 times faster than through JSON values), when every one of them is an event this endpoint
/// takes as given. None otherwise: the body is then read the slow way, which makes the same inputs of
/// good events (the checks and the append are the same code) and names the faulty field of a bad one.
fn read_bulk(state: &ApiState, caller: &Caller, bytes: &[u8]) -> Option<Vec<Input>> {
    let envelopes = pipelines::envelope::read_envelopes(bytes, state.limits.events_per_request_max)?;
    let now = (state.clock == ClockMode::System).then(|| state.stamp());
    let event_id_bytes_max = state.limits.event_id_bytes_max;
    envelopes.into_iter().map(|envelope| input_of(envelope, caller, now, event_id_bytes_max)).collect()
}

/// The input `prepare` makes of the same event, or None where `prepare` refuses it.
fn input_of(envelope: Envelope, caller: &Caller, now: Option<Timestamp>, event_id_bytes_max: usize) -> Option<Input> {
    if refusal(envelope.command.type_name()).is_some() {
        return None;
    }
    // As `set_time`: the server's stamp on the system clock (no `at` given), the event's on the event clock.
    let at = match (now, envelope.at) {
        (Some(now), None) => now,
        (None, Some(at)) => at,
        _ => return None,
    };
    // As `set_event_id`.
    let event_id = match envelope.event_id {
        None => generated_event_id(),
        Some(id) if !event_id_fits(&id, event_id_bytes_max) => return None,
        Some(id) => caller_event_id(caller, id),
    };
    Some(Input { event_id: event_id.into(), at, command: envelope.command })
}

fn objects_of(items: Vec<Value>, events_per_request_max: usize) -> Result<Vec<Map<String, Value>>, ApiError> {
    if items.len() > events_per_request_max {
        return Err(ApiError::TooManyEvents { count: items.len(), max: events_per_request_max });
    }
    let objects = items.into_iter().enumerate().map(|(index, item)| match item {
        Value::Object(object) => Ok(object),
        _ => Err(ApiError::MalformedJson("an event must be a JSON object".to_string()).in_event(index)),
    });
    objects.collect()
}

/// The body as JSON. An empty body is refused here; typed endpoints treat it as `{}` themselves.
fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    pipelines::decode::from_json_bytes(bytes).map_err(|error| ApiError::MalformedJson(error.to_string()))
}

pub fn read_bytes(state: &ApiState, body: Body) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge(state.limits.body_bytes_max)
        } else {
            ApiError::MalformedJson(rejection.body_text())
        }
    })
}

/// Checks and appends a single event (errors name its fields without an index).
pub async fn ingest(state: &ApiState, caller: &Caller, objects: Vec<Map<String, Value>>) -> Result<Accepted, ApiError> {
    let (state, caller) = (state.clone(), caller.clone());
    // Checks read materialised state and appending is a durable commit: both may block ([`run_blocking`]).
    let accepted = run_blocking(move || check_and_append(&state, &caller, objects, |_, error| error)).await??;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

/// Checks every object, then appends them all or none (blocking: run off the async workers). `locate`
/// names the failing event in an error (`[3].amount` in a bulk request).
fn check_and_append(
    state: &ApiState,
    caller: &Caller,
    objects: Vec<Map<String, Value>>,
    locate: fn(usize, ApiError) -> ApiError,
) -> Result<AcceptedBody, ApiError> {
    let inputs = prepare_all(state, caller, objects).map_err(|(index, error)| locate(index, error))?;
    append(state, inputs)
}

/// Turns every object into a checked input before anything is appended (all or nothing).
fn prepare_all(
    state: &ApiState,
    caller: &Caller,
    objects: Vec<Map<String, Value>>,
) -> Result<Vec<Input>, (usize, ApiError)> {
    // One stamp per request: the events of a bulk request happen together.
    let now = (state.clock == ClockMode::System).then(|| state.stamp());
    check_all(state, objects.into_iter().map(|object| prepare(state, caller, object, now)))
}

/// Checks every input in turn, failing at the first that could not be made or does not pass. Ids
/// created by earlier events of the same request count as known to later ones.
fn check_all(
    state: &ApiState,
    prepared: impl ExactSizeIterator<Item = Result<Input, ApiError>>,
) -> Result<Vec<Input>, (usize, ApiError)> {
    let mut known = Known::new(state.pipeline.ingestion_checks());
    let mut inputs = Vec::with_capacity(prepared.len());
    for (index, input) in prepared.enumerate() {
        let input = input.map_err(|error| (index, error))?;
        // A retry of an event appended before is answered `duplicate: true` by the append, whatever the
        // state now says (the checks below would call a retried creation a conflict).
        if !known.appended_before(&input.event_id) {
            known.check(&input.command).map_err(|error| (index, error))?;
        }
        known.record(&input.command);
        inputs.push(input);
    }
    Ok(inputs)
}

fn prepare(
    state: &ApiState,
    caller: &Caller,
    mut object: Map<String, Value>,
    now: Option<Timestamp>,
) -> Result<Input, ApiError> {
    refuse_type(&object)?;
    set_time(&mut object, now)?;
    set_event_id(&mut object, caller, state.limits.event_id_bytes_max)?;
    // The parser takes the envelope out and leaves the command's fields, which name a faulty field.
    parse_input_object(&mut object, generated_event_id).map_err(|error| parse_error(error, &object))
}

fn refuse_type(object: &Map<String, Value>) -> Result<(), ApiError> {
    match object.get("type") {
        None => Err(ApiError::invalid_field("type", "missing field `type`")),
        Some(Value::String(type_name)) => match refusal(type_name) {
            Some(reason) => Err(ApiError::TypeNotAccepted { type_name: type_name.clone(), reason }),
            None => Ok(()),
        },
        Some(_) => Err(ApiError::invalid_field("type", "`type` must be a string")),
    }
}

/// System clock: the server stamps `now`, a client's `at` is refused. Event clock: the client's `at`
/// is required (and parsed with the rest).
fn set_time(object: &mut Map<String, Value>, now: Option<Timestamp>) -> Result<(), ApiError> {
    let given = object.get("at").is_some_and(|at| !at.is_null());
    match now {
        Some(_) if given => Err(ApiError::invalid_field("at", "the server stamps `at` with its clock; do not send it")),
        Some(now) => {
            object.insert("at".to_string(), Value::String(now.to_string()));
            Ok(())
        }
        None if given => Ok(()),
        None => Err(ApiError::invalid_field("at", "`at` is required: the server runs on event time")),
    }
}

/// Gives the event an id when it has none. A merchant's ids are namespaced with its id, so a merchant
/// cannot make another merchant's events count as duplicates by reusing their ids.
fn set_event_id(object: &mut Map<String, Value>, caller: &Caller, event_id_bytes_max: usize) -> Result<(), ApiError> {
    let event_id = match object.get("event_id") {
        None | Some(Value::Null) => generated_event_id(),
        Some(Value::String(id)) if !event_id_fits(id, event_id_bytes_max) => {
            let message = format!("`event_id` must have 1 to {event_id_bytes_max} bytes");
            return Err(ApiError::invalid_field("event_id", message));
        }
        Some(Value::String(id)) => caller_event_id(caller, id.clone()),
        Some(_) => return Err(ApiError::invalid_field("event_id", "`event_id` must be a string")),
    };
    object.insert("event_id".to_string(), Value::String(event_id));
    Ok(())
}

fn event_id_fits(id: &str, event_id_bytes_max: usize) -> bool {
    (1..=event_id_bytes_max).contains(&id.len())
}

/// A given event id as the log keeps it: a merchant's in its merchant's namespace.
fn caller_event_id(caller: &Caller, id: String) -> String {
    match caller.merchant() {
        Some(merchant_id) => format!("merchant:{merchant_id}:{id}"),
        None => id,
    }
}

/// `api:` and 128 random bits: unique without coordination between servers.
fn generated_event_id() -> String {
    format!("api:{}", hex(&rand::random::<[u8; 16]>()))
}

fn parse_error(error: ParseError, object: &Map<String, Value>) -> ApiError {
    match error {
        ParseError::NotJson(message) => ApiError::MalformedJson(message),
        ParseError::MissingType => ApiError::invalid_field("type", "missing field `type`"),
        ParseError::ConfigNotFirst => {
            ApiError::TypeNotAccepted { type_name: "config".to_string(), reason: "configuration is fixed at start" }
        }
        ParseError::BadTime(text) => ApiError::invalid_field("at", format!("`at` is not an RFC 3339 time: {text}")),
        ParseError::BadEventId => ApiError::invalid_field("event_id", "`event_id` must be a string"),
        ParseError::Schema(message) => ApiError::InvalidField { field: field_of::<Command>(object, &message), message },
    }
}

/// Names the field a serde error is about. serde's messages name unknown and missing fields but not
/// the field holding a wrong type, a bad enumeration value or a malformed time; for those the object
/// is parsed again without each field in turn, and the field whose removal cures the error is named.
pub fn field_of<T: DeserializeOwned>(object: &Map<String, Value>, message: &str) -> Option<String> {
    for prefix in ["unknown field `", "missing field `"] {
        if let Some(rest) = message.strip_prefix(prefix) {
            return rest.split('`').next().map(str::to_string);
        }
    }
    let type_name = object.get("type").and_then(Value::as_str).unwrap_or_default();
    if message.starts_with(&format!("unknown variant `{type_name}`")) {
        return Some("type".to_string());
    }
    // Without `type` an event always fails the same way, so removing it proves nothing.
    object.keys().filter(|key| *key != "type").find(|key| removal_cures::<T>(object, key)).cloned()
}

fn removal_cures<T: DeserializeOwned>(object: &Map<String, Value>, key: &str) -> bool {
    let mut without = object.clone();
    without.remove(key);
    match serde_json::from_value::<T>(Value::Object(without)) {
        Ok(_) => true,
        // serde reports a missing field only once every present field deserialized.
        Err(error) => error.to_string() == format!("missing field `{key}`"),
    }
}

/// Appends checked inputs in one call (one durable commit) and lists where each landed.
fn append(state: &ApiState, inputs: Vec<Input>) -> Result<AcceptedBody, ApiError> {
    if inputs.is_empty() {
        return Ok(AcceptedBody { accepted: Vec::new() });
    }
    let event_ids: Vec<pipelines::Text> = inputs.iter().map(|input| input.event_id.clone()).collect();
    let appended = state.pipeline.append(inputs)?;
    if appended.len() != event_ids.len() {
        let message = format!("{} inputs appended as {} records", event_ids.len(), appended.len());
        return Err(ApiError::Internal(message));
    }
    let accepted =
        event_ids.into_iter().zip(appended).map(|(event_id, outcome)| accepted_event(event_id.to_string(), outcome));
    let accepted: Vec<AcceptedEvent> = accepted.collect();
    tracing::debug!(count = accepted.len(), "inputs appended");
    Ok(AcceptedBody { accepted })
}

fn accepted_event(event_id: String, outcome: Appended) -> AcceptedEvent {
    match outcome {
        Appended::New { position } => AcceptedEvent { event_id, position, duplicate: false },
        Appended::Duplicate { position } => AcceptedEvent { event_id, position, duplicate: true },
    }
}
