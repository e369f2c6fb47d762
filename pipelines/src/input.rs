//! Inputs (SPEC §5): one JSON object per event with `type`, `event_id`, `at` and the fields of its type.
//! Structural problems (not JSON, unknown type or field, wrong JSON type, missing field, malformed
//! time, unknown enumeration value) are [`ParseError`]s; semantic ones are answered by the stages with
//! `command_rejected` (R-IN-1). Money stays a string here so a bad amount is a semantic error.

use crate::time::Timestamp;
use crate::Text;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Phonepe,
    Mobikwik,
    Freecharge,
    Paytm,
    Other,
}

impl Provider {
    /// Every provider, in declaration order (`provider as usize` is its index here): what a service
    /// keeps a bound or a figure per provider by. A new provider goes here too.
    pub const ALL: [Provider; 5] =
        [Provider::Phonepe, Provider::Mobikwik, Provider::Freecharge, Provider::Paytm, Provider::Other];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    In,
    Out,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LineStatus {
    Success,
    Processing,
    Failed,
    Errored,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    SessionExpired,
    UpstreamBusy,
    DetailUnavailable,
    None,
}

/// Errors a statement provider reports in a `crawl_result` (SPEC §10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CrawlError {
    SessionExpired,
    UpstreamBusy,
    DetailUnavailable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelledBy {
    Merchant,
    User,
    Cashier,
}

/// Who is on the other side of a statement line, or a payout's payee.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Party {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_last4: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpa: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Text>,
    /// Only on payees: the bank's IFSC (R-MATCH-P1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifsc: Option<Text>,
}

/// The other side of a statement line (SPEC §5): shown, and matched against payees (R-MATCH-P1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Counterparty {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_last4: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpa: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Text>,
}

/// The counterparty a statement line names, as lines are kept: most name none, so an empty one is a
/// null pointer and a named one lives in its own allocation. Lines are read on every check of a card (a
/// provider page repeats the latest ones), so a line of two cache lines rather than three is fewer misses;
/// the counterparty itself is read only when a payout's payee is compared (R-MATCH-P1). Reads and writes
/// exactly as a [`Counterparty`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LineCounterparty(Option<Box<Counterparty>>);

static NO_COUNTERPARTY: Counterparty = Counterparty { account_last4: None, vpa: None, name: None };

impl From<Counterparty> for LineCounterparty {
    fn from(counterparty: Counterparty) -> LineCounterparty {
        // Only named counterparties are boxed, so two equal counterparties are equal representations.
        LineCounterparty((counterparty != NO_COUNTERPARTY).then(|| Box::new(counterparty)))
    }
}

impl std::ops::Deref for LineCounterparty {
    type Target = Counterparty;

    fn deref(&self) -> &Counterparty {
        self.0.as_deref().unwrap_or(&NO_COUNTERPARTY)
    }
}

impl Serialize for LineCounterparty {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Counterparty::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for LineCounterparty {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<LineCounterparty, D::Error> {
        Counterparty::deserialize(deserializer).map(LineCounterparty::from)
    }
}

fn default_true() -> bool {
    true
}

/// SPEC §3: optional fields may be absent or `null`; `utr_supported` defaults to true either way.
fn true_when_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(deserializer)?.unwrap_or(true))
}

/// SPEC §3: an optional object given as `null` is the same as an absent one.
fn default_when_null<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// One wallet transaction as a provider reports it (SPEC §5).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StatementLine {
    pub txn_id: Text,
    #[serde(default)]
    pub utr: Option<Text>,
    #[serde(default = "default_true", deserialize_with = "true_when_null")]
    pub utr_supported: bool,
    pub direction: Direction,
    pub amount: Text,
    pub status: LineStatus,
    pub time: Timestamp,
    #[serde(default, deserialize_with = "default_when_null")]
    pub counterparty: LineCounterparty,
    /// Present only in detail answers (and on `wallet_line` events, for the simulated provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payee_ifsc: Option<Text>,
}

/// The command structs: each reads and writes by its field names (SPEC §5), and writes its fields by
/// position too, in declaration order, for a command inside a stage message
/// (`decode::PositionalFields`, `stages::positional`). So a field is never skipped or flattened here,
/// and a new one goes last with `#[serde(default)]`: messages written before it leave it off, and
/// `decode::deserialize_positional` then takes the default.
macro_rules! input_structs {
    ($( $(#[$meta:meta])* $name:ident { $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)? } )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
            #[serde(deny_unknown_fields)]
            pub struct $name { $( $(#[$fmeta])* pub $field: $ty ),* }

            impl $crate::decode::PositionalFields for $name {
                const COUNT: usize = <[&str]>::len(&[$(stringify!($field)),*]);

                // `_tuple`: `Tick` has no fields to write into it.
                fn serialize_fields<T: serde::ser::SerializeTuple>(&self, _tuple: &mut T) -> Result<(), T::Error> {
                    $( _tuple.serialize_element(&self.$field)?; )*
                    Ok(())
                }
            }
        )*
    };
}

input_structs! {
    MerchantRegistered { merchant_id: Text, collection_fee_rate: Text, payout_fee_rate: Text,
        payout_fee_fixed: Text, #[serde(default)] callback_url: Option<Text> }
    MerchantDeposit { merchant_id: Text, amount: Text }
    UserRegistered { user_id: Text, telegram_bound: bool }
    CardBound { user_id: Text, card_id: Text, provider: Provider,
        #[serde(default)] account_last4: Option<Text>, #[serde(default)] vpa: Option<Text> }
    UserRecharge { user_id: Text, amount: Text, commission: Text }
    UserAdjustment { user_id: Text, amount: Text, reason: Text }
    CollectionCreated { order_id: Text, merchant_id: Text, amount: Text,
        #[serde(default)] utr: Option<Text>, #[serde(default)] expires_at: Option<Timestamp> }
    CollectionDispatched { order_id: Text, user_id: Text, card_id: Text }
    PaymentConfirmed { order_id: Text, #[serde(default)] utr: Option<Text> }
    OrderCancelled { order_id: Text, by: CancelledBy }
    SupplementRequested { order_id: Text, #[serde(default)] utr: Option<Text> }
    CollectionRetry { order_id: Text }
    PayoutCreated { order_id: Text, merchant_id: Text, amount: Text, payee: Box<Party>,
        #[serde(default)] expires_at: Option<Timestamp> }
    PayoutGrabbed { order_id: Text, user_id: Text, card_id: Text }
    CrawlResult { request_id: Text, user_id: Text, card_id: Text, ok: bool,
        #[serde(default)] error: Option<CrawlError>, lines: Vec<StatementLine>,
        #[serde(default)] next_from: Option<Timestamp> }
    CardReauthenticated { user_id: Text, card_id: Text }
    AdminApprove { order_id: Text, operator: Text, #[serde(default)] amount: Option<Text> }
    AdminReject { order_id: Text, operator: Text }
    AdminCrawlRetry { order_id: Text, operator: Text }
    AdminCorrectCancel { order_id: Text, operator: Text }
    AdminCancelPayout { order_id: Text, operator: Text }
    AdminUnban { user_id: Text, operator: Text }
    Tick {}
    WalletLine { card_id: Text, line: Box<StatementLine> }
    WalletLineStatus { card_id: Text, txn_id: Text, status: LineStatus }
    WalletFault { card_id: Text, fault: Fault }
}

/// Every input type of SPEC §5 except `config`, which only a scenario's first line may carry. Read
/// with [`crate::decode`] (the tag first: no buffering).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    MerchantRegistered(MerchantRegistered),
    MerchantDeposit(MerchantDeposit),
    UserRegistered(UserRegistered),
    CardBound(CardBound),
    UserRecharge(UserRecharge),
    UserAdjustment(UserAdjustment),
    CollectionCreated(CollectionCreated),
    CollectionDispatched(CollectionDispatched),
    PaymentConfirmed(PaymentConfirmed),
    OrderCancelled(OrderCancelled),
    SupplementRequested(SupplementRequested),
    CollectionRetry(CollectionRetry),
    PayoutCreated(PayoutCreated),
    PayoutGrabbed(PayoutGrabbed),
    CrawlResult(CrawlResult),
    CardReauthenticated(CardReauthenticated),
    AdminApprove(AdminApprove),
    AdminReject(AdminReject),
    AdminCrawlRetry(AdminCrawlRetry),
    AdminCorrectCancel(AdminCorrectCancel),
    AdminCancelPayout(AdminCancelPayout),
    AdminUnban(AdminUnban),
    Tick(Tick),
    WalletLine(WalletLine),
    WalletLineStatus(WalletLineStatus),
    WalletFault(WalletFault),
}

// `type_name`: the input's `type`, as `command_rejected.input_type` names it.
crate::tagged_newtype_enum!(Command, "type", type_name, {
    "merchant_registered" => MerchantRegistered,
    "merchant_deposit" => MerchantDeposit,
    "user_registered" => UserRegistered,
    "card_bound" => CardBound,
    "user_recharge" => UserRecharge,
    "user_adjustment" => UserAdjustment,
    "collection_created" => CollectionCreated,
    "collection_dispatched" => CollectionDispatched,
    "payment_confirmed" => PaymentConfirmed,
    "order_cancelled" => OrderCancelled,
    "supplement_requested" => SupplementRequested,
    "collection_retry" => CollectionRetry,
    "payout_created" => PayoutCreated,
    "payout_grabbed" => PayoutGrabbed,
    "crawl_result" => CrawlResult,
    "card_reauthenticated" => CardReauthenticated,
    "admin_approve" => AdminApprove,
    "admin_reject" => AdminReject,
    "admin_crawl_retry" => AdminCrawlRetry,
    "admin_correct_cancel" => AdminCorrectCancel,
    "admin_cancel_payout" => AdminCancelPayout,
    "admin_unban" => AdminUnban,
    "tick" => Tick,
    "wallet_line" => WalletLine,
    "wallet_line_status" => WalletLineStatus,
    "wallet_fault" => WalletFault,
});

/// Every input `type` name (SPEC §5), so a name read back from a log maps to the `&'static str` the
/// stages use.
pub const INPUT_TYPE_NAMES: [&str; 27] = [
    "config",
    "merchant_registered",
    "merchant_deposit",
    "user_registered",
    "card_bound",
    "user_recharge",
    "user_adjustment",
    "collection_created",
    "collection_dispatched",
    "payment_confirmed",
    "order_cancelled",
    "supplement_requested",
    "collection_retry",
    "payout_created",
    "payout_grabbed",
    "crawl_result",
    "card_reauthenticated",
    "admin_approve",
    "admin_reject",
    "admin_crawl_retry",
    "admin_correct_cancel",
    "admin_cancel_payout",
    "admin_unban",
    "tick",
    "wallet_line",
    "wallet_line_status",
    "wallet_fault",
];

/// A name from a fixed list. Fields of this type read back from logs with `deserialize_with`; the alias
/// also keeps serde's derive from tying the deserializer's lifetime to `'static`.
pub type StaticName = &'static str;

/// Deserializes an input type name into its `&'static str` (for messages and outputs read from logs).
pub fn deserialize_type_name<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<&'static str, D::Error> {
    crate::decode::parse_str(deserializer, |name| {
        INPUT_TYPE_NAMES
            .iter()
            .find(|known| **known == name)
            .copied()
            .ok_or_else(|| format!("unknown input type `{name}`"))
    })
}

/// One input with its envelope.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Input {
    pub event_id: Text,
    pub at: Timestamp,
    #[serde(flatten)]
    pub command: Command,
}

/// A structurally bad input (R-IN-1): dead-lettered by services, fatal to a replay (SPEC §9).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("not a JSON object: {0}")]
    NotJson(String),
    #[error("missing `type`")]
    MissingType,
    #[error("`config` is only allowed on the first line")]
    ConfigNotFirst,
    #[error("missing or malformed `at`: {0}")]
    BadTime(String),
    #[error("`event_id` must be a string")]
    BadEventId,
    #[error("{0}")]
    Schema(String),
}

/// What a JSON line holds: a configuration or an input.
#[derive(Debug)]
pub enum Parsed {
    /// Boxed: a scenario has one, inputs are many (and now much smaller than the overrides).
    Config(Box<crate::config::ConfigOverrides>),
    Input(Input),
}

/// Parses one JSON line. `default_event_id` is used when the line has none (`line:N` in scenarios).
pub fn parse_line(text: &str, default_event_id: impl FnOnce() -> String) -> Result<Parsed, ParseError> {
    let value: Value = serde_json::from_str(text).map_err(|error| ParseError::NotJson(error.to_string()))?;
    let Value::Object(mut object) = value else {
        return Err(ParseError::NotJson("not an object".to_string()));
    };
    let type_name = match object.get("type") {
        Some(Value::String(name)) => name.clone(),
        Some(_) => return Err(ParseError::Schema("`type` must be a string".to_string())),
        None => return Err(ParseError::MissingType),
    };
    if type_name == "config" {
        object.remove("type");
        let overrides =
            serde_json::from_value(Value::Object(object)).map_err(|error| ParseError::Schema(error.to_string()))?;
        return Ok(Parsed::Config(Box::new(overrides)));
    }
    parse_input_object(&mut object, default_event_id).map(Parsed::Input)
}

/// Parses an input that is known not to be `config` (the services' `POST /v1/events`).
///
/// The envelope (`at`, `event_id`) is taken out of `object` and the command is read from what is left,
/// without copying it: a caller that must name the field a schema error is about still has the
/// command's fields.
pub fn parse_input_object(
    object: &mut Map<String, Value>,
    default_event_id: impl FnOnce() -> String,
) -> Result<Input, ParseError> {
    let at = match object.remove("at") {
        Some(Value::String(text)) => Timestamp::parse(&text).ok_or(ParseError::BadTime(text))?,
        Some(other) => return Err(ParseError::BadTime(other.to_string())),
        None => return Err(ParseError::BadTime("missing".to_string())),
    };
    let event_id = match object.remove("event_id") {
        Some(Value::String(id)) => id,
        None | Some(Value::Null) => default_event_id(),
        Some(_) => return Err(ParseError::BadEventId),
    };
    if object.get("type").and_then(Value::as_str) == Some("config") {
        return Err(ParseError::ConfigNotFirst);
    }
    // The tag first, so the command is read without collecting its fields first (`crate::decode`):
    // removing `at` and `event_id` above moved the last fields into their places.
    if let Some(tag) = object.shift_remove("type") {
        object.shift_insert(0, "type".to_string(), tag);
    }
    let command = Command::deserialize(&*object).map_err(|error| ParseError::Schema(error.to_string()))?;
    Ok(Input { event_id: event_id.into(), at, command })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Parsed, ParseError> {
        parse_line(text, || "line:1".to_string())
    }

    #[test]
    fn a_line_counterparty_reads_and_writes_as_a_counterparty_and_boxes_only_a_named_one() {
        for text in [r#"{}"#, r#"{"vpa":"payer@upi"}"#, r#"{"account_last4":"1234","name":"A"}"#] {
            let plain: Counterparty = serde_json::from_str(text).unwrap();
            let compact: LineCounterparty = serde_json::from_str(text).unwrap();
            assert_eq!(*compact, plain);
            assert_eq!(compact.0.is_some(), plain != Counterparty::default(), "{text}");
            assert_eq!(serde_json::to_string(&compact).unwrap(), serde_json::to_string(&plain).unwrap());
            assert_eq!(compact, LineCounterparty::from(plain));
        }
        assert!(serde_json::from_str::<LineCounterparty>(r#"{"iban":"x"}"#).is_err(), "unknown fields refused");
        assert_eq!(std::mem::size_of::<LineCounterparty>(), std::mem::size_of::<usize>());
    }

    #[test]
    fn parses_an_input_with_a_default_event_id() {
        let parsed = parse(r#"{"type":"tick","at":"2026-03-02T09:30:00Z"}"#).unwrap();
        let Parsed::Input(input) = parsed else { panic!("not an input") };
        assert_eq!(input.event_id, "line:1");
        assert_eq!(input.command, Command::Tick(Tick {}));
    }

    #[test]
    fn structural_errors_are_refused() {
        let at = r#""at":"2026-03-02T09:30:00Z""#;
        for bad in [
            "{".to_string(),
            format!(r#"{{{at}}}"#),
            format!(r#"{{"type":"nope",{at}}}"#),
            format!(r#"{{"type":"tick",{at},"extra":1}}"#),
            format!(r#"{{"type":"merchant_deposit",{at},"merchant_id":"m"}}"#),
            format!(r#"{{"type":"merchant_deposit",{at},"merchant_id":"m","amount":100}}"#),
            format!(r#"{{"type":"card_bound",{at},"user_id":"u","card_id":"c","provider":"gpay"}}"#),
            r#"{"type":"tick","at":"not a time"}"#.to_string(),
        ] {
            assert!(parse(&bad).is_err(), "accepted {bad}");
        }
    }
}
