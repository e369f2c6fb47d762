//! How the stages' messages are written: their fields by position, without names.
//!
//! A message is written as serde writes an externally tagged enum, `{"Variant": …}`, but a variant's
//! fields (and a dispatch's) as an array in declaration order, not an object with their names:
//! `{"Order":["c0-600",{"DispatchAccepted":[1,"u600","k600"]}]}` for
//! `{"Order":{"order_id":"c0-600","body":{"DispatchAccepted":{"seq":1,"user_id":"u600","card_id":"k600"}}}}`.
//! Why: in the serve benchmark's logs the names were 48.5 % of the stage records' bytes, and a record's
//! bytes cost the service more to store than to encode (`docs/PERFORMANCE.md`, fifty-third round;
//! `docs/DECISIONS.md`).
//!
//! Reading needs nothing of its own: serde's derived `Deserialize` of a struct or struct variant reads an
//! array of its fields in declaration order as well as an object, so records written before (objects)
//! and now (arrays) both read. So the order written here is the declaration order; none of these types
//! may skip a field or flatten one (an array has no names to find a field by); and a field added to one
//! of them goes last, with `#[serde(default)]`, for the arrays written before it. Parties and rejections
//! inside a message keep their derived form (parties leave absent fields out).
//!
//! A command inside a message (a body's `Input`) is written as an array too, its type first:
//! `["collection_created","c0-0","m0","100.00",null,null]` for `{"type":"collection_created",
//! "order_id":"c0-0",…}` (fifty-fourth round: the names were a third of an input message's bytes).
//! Commands are SPEC §5 inputs, internally tagged, so serde's derived reader does not take that form:
//! the bodies read it with `crate::decode::deserialize_positional`, which takes the object form too. A
//! command given alone (an input posted to the API, a scenario's line) is still read only as an object.
//! The same rules hold for `crate::input`'s structs: no field skipped or flattened, a new one last with
//! `#[serde(default)]`.

use super::{AgentBody, DispatchRequest, MerchantBody, Message, OrderBody, SubOrderCommand, SubOutcome};
use crate::input::Command;
use serde::ser::{SerializeTuple, SerializeTupleVariant};
use serde::{Serialize, Serializer};

/// A command inside a message (`Input` of a body): `["collection_created","c0-0","m0","100.00",…]`
/// for `{"type":"collection_created","order_id":"c0-0",…}`. That form, written and read, is
/// `crate::decode`'s (`Command::serialize_positional`, `deserialize_positional`, which reads the object
/// form too); this chooses which commands take it.
///
/// A `crawl_result` keeps its object form: the connector writes its record around the provider's page
/// text, spliced in at `"lines":[]` (`connectors::embedded::connector_loop`), and its bytes are nearly
/// all that page's. Its lines written by position too, encoded from the lines read, halved the pages'
/// bytes and cost as much to encode as that saved (`docs/PERFORMANCE.md`, fifty-fourth round).
struct PositionalCommand<'a>(&'a Command);

impl Serialize for PositionalCommand<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Command::CrawlResult(_) => self.0.serialize(serializer),
            command => command.serialize_positional(serializer),
        }
    }
}

/// Writes `$variant` of `$enum` (variant index `$index`) as `{"$variant": [fields…]}`, or as the bare
/// variant name when it has no fields.
macro_rules! variant {
    ($serializer:expr, $enum:literal, $index:literal, $variant:literal) => {
        $serializer.serialize_unit_variant($enum, $index, $variant)
    };
    ($serializer:expr, $enum:literal, $index:literal, $variant:literal, $($field:expr),+) => {{
        let fields = [$(stringify!($field)),+].len();
        let mut tuple = $serializer.serialize_tuple_variant($enum, $index, $variant, fields)?;
        $( tuple.serialize_field($field)?; )+
        tuple.end()
    }};
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Message::Order { order_id, body } => variant!(serializer, "Message", 0, "Order", order_id, body),
            Message::Agent { user_id, body } => variant!(serializer, "Message", 1, "Agent", user_id, body),
            Message::Merchant { merchant_id, body } => {
                variant!(serializer, "Message", 2, "Merchant", merchant_id, body)
            }
        }
    }
}

impl Serialize for OrderBody {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            OrderBody::Input { event_id, command } => {
                variant!(serializer, "OrderBody", 0, "Input", event_id, &PositionalCommand(command))
            }
            OrderBody::CreationAccepted => variant!(serializer, "OrderBody", 1, "CreationAccepted"),
            OrderBody::CreationRefused { event_id, input_type, rejection } => {
                variant!(serializer, "OrderBody", 2, "CreationRefused", event_id, input_type, rejection)
            }
            OrderBody::DispatchAccepted { seq, user_id, card_id } => {
                variant!(serializer, "OrderBody", 3, "DispatchAccepted", seq, user_id, card_id)
            }
            OrderBody::DispatchRefused { user_id, reason } => {
                variant!(serializer, "OrderBody", 4, "DispatchRefused", user_id, reason)
            }
            OrderBody::Outcome { seq, outcome } => variant!(serializer, "OrderBody", 5, "Outcome", seq, outcome),
        }
    }
}

impl Serialize for SubOutcome {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            SubOutcome::CollectionSucceeded { actual, utr } => {
                variant!(serializer, "SubOutcome", 0, "CollectionSucceeded", actual, utr)
            }
            SubOutcome::CollectionCancelled => variant!(serializer, "SubOutcome", 1, "CollectionCancelled"),
            SubOutcome::CollectionCorrected => variant!(serializer, "SubOutcome", 2, "CollectionCorrected"),
            SubOutcome::PayoutSucceeded { paid_total } => {
                variant!(serializer, "SubOutcome", 3, "PayoutSucceeded", paid_total)
            }
            SubOutcome::PayoutReturned => variant!(serializer, "SubOutcome", 4, "PayoutReturned"),
            SubOutcome::PayoutCancelled => variant!(serializer, "SubOutcome", 5, "PayoutCancelled"),
            SubOutcome::UtrAdded { utr } => variant!(serializer, "SubOutcome", 6, "UtrAdded", utr),
        }
    }
}

impl Serialize for AgentBody {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            AgentBody::Input { event_id, command } => {
                variant!(serializer, "AgentBody", 0, "Input", event_id, &PositionalCommand(command))
            }
            AgentBody::Dispatch(request) => serializer.serialize_newtype_variant("AgentBody", 1, "Dispatch", request),
            AgentBody::SubOrder { order_id, seq, event_id, input_type, command, operator } => {
                variant!(serializer, "AgentBody", 2, "SubOrder", order_id, seq, event_id, input_type, command, operator)
            }
        }
    }
}

impl Serialize for DispatchRequest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let DispatchRequest { order_id, seq, kind, amount, card_id, order_problem, expires_at, payee, utr } = self;
        let mut tuple = serializer.serialize_tuple(9)?;
        tuple.serialize_element(order_id)?;
        tuple.serialize_element(seq)?;
        tuple.serialize_element(kind)?;
        tuple.serialize_element(amount)?;
        tuple.serialize_element(card_id)?;
        tuple.serialize_element(order_problem)?;
        tuple.serialize_element(expires_at)?;
        tuple.serialize_element(payee)?;
        tuple.serialize_element(utr)?;
        tuple.end()
    }
}

impl Serialize for SubOrderCommand {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            SubOrderCommand::PaymentConfirmed { utr } => {
                variant!(serializer, "SubOrderCommand", 0, "PaymentConfirmed", utr)
            }
            SubOrderCommand::Cancel { by } => variant!(serializer, "SubOrderCommand", 1, "Cancel", by),
            SubOrderCommand::Supplement { utr } => variant!(serializer, "SubOrderCommand", 2, "Supplement", utr),
            SubOrderCommand::Retry => variant!(serializer, "SubOrderCommand", 3, "Retry"),
            SubOrderCommand::Approve { amount } => variant!(serializer, "SubOrderCommand", 4, "Approve", amount),
            SubOrderCommand::Reject => variant!(serializer, "SubOrderCommand", 5, "Reject"),
            SubOrderCommand::CrawlRetry => variant!(serializer, "SubOrderCommand", 6, "CrawlRetry"),
            SubOrderCommand::CorrectCancel => variant!(serializer, "SubOrderCommand", 7, "CorrectCancel"),
            SubOrderCommand::CancelPayout => variant!(serializer, "SubOrderCommand", 8, "CancelPayout"),
        }
    }
}

impl Serialize for MerchantBody {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            MerchantBody::Input { event_id, command } => {
                variant!(serializer, "MerchantBody", 0, "Input", event_id, &PositionalCommand(command))
            }
            MerchantBody::ValidateCollection { order_id, event_id } => {
                variant!(serializer, "MerchantBody", 1, "ValidateCollection", order_id, event_id)
            }
            MerchantBody::ReservePayout { order_id, amount, event_id } => {
                variant!(serializer, "MerchantBody", 2, "ReservePayout", order_id, amount, event_id)
            }
            MerchantBody::CollectionCredit { order_id, actual } => {
                variant!(serializer, "MerchantBody", 3, "CollectionCredit", order_id, actual)
            }
            MerchantBody::Clawback { order_id } => variant!(serializer, "MerchantBody", 4, "Clawback", order_id),
            MerchantBody::PayoutSpent { order_id } => variant!(serializer, "MerchantBody", 5, "PayoutSpent", order_id),
            MerchantBody::PayoutRefund { order_id } => {
                variant!(serializer, "MerchantBody", 6, "PayoutRefund", order_id)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{AgentBody, Message};
    use crate::decode::Tagged;
    use crate::input::Command;

    /// One message of every variant of every type written by position, as the derived `Serialize`
    /// wrote them before (objects with field names; most taken from the serve benchmark's logs).
    const OBJECT_FORMS: &[&str] = &[
        r#"{"Order":{"order_id":"c0-0","body":{"Input":{"event_id":"w:6100","command":{"type":"collection_created","order_id":"c0-0","merchant_id":"m0","amount":"100.00","utr":"000000000000","expires_at":null}}}}}"#,
        r#"{"Order":{"order_id":"p0-0","body":{"Input":{"event_id":"w:6102","command":{"type":"payout_created","order_id":"p0-0","merchant_id":"m0","amount":"100.00","payee":{"account_last4":"4321"},"expires_at":null}}}}}"#,
        r#"{"Order":{"order_id":"c0-600","body":"CreationAccepted"}}"#,
        r#"{"Order":{"order_id":"c1","body":{"CreationRefused":{"event_id":"e1","input_type":"payout_created","rejection":{"reason":"unknown_merchant","message":"no merchant m9"}}}}}"#,
        r#"{"Order":{"order_id":"c0-600","body":{"DispatchAccepted":{"seq":1,"user_id":"u600","card_id":"k600"}}}}"#,
        r#"{"Order":{"order_id":"c1","body":{"DispatchRefused":{"user_id":"u1","reason":"order_not_pending"}}}}"#,
        r#"{"Order":{"order_id":"c0-1","body":{"Outcome":{"seq":1,"outcome":{"CollectionSucceeded":{"actual":"250.00","utr":"b000000000001"}}}}}}"#,
        r#"{"Order":{"order_id":"c0-1","body":{"Outcome":{"seq":2,"outcome":{"CollectionSucceeded":{"actual":"250.00","utr":null}}}}}}"#,
        r#"{"Order":{"order_id":"c0-1","body":{"Outcome":{"seq":1,"outcome":"CollectionCancelled"}}}}"#,
        r#"{"Order":{"order_id":"c0-1","body":{"Outcome":{"seq":1,"outcome":"CollectionCorrected"}}}}"#,
        r#"{"Order":{"order_id":"p0-0","body":{"Outcome":{"seq":1,"outcome":{"PayoutSucceeded":{"paid_total":"100.00"}}}}}}"#,
        r#"{"Order":{"order_id":"p0-0","body":{"Outcome":{"seq":1,"outcome":"PayoutReturned"}}}}"#,
        r#"{"Order":{"order_id":"p0-0","body":{"Outcome":{"seq":1,"outcome":"PayoutCancelled"}}}}"#,
        r#"{"Order":{"order_id":"p0-0","body":{"Outcome":{"seq":1,"outcome":{"UtrAdded":{"utr":"900000000000"}}}}}}"#,
        r#"{"Agent":{"user_id":"u1","body":{"Input":{"event_id":"e1","command":{"type":"card_reauthenticated","user_id":"u1","card_id":"c1"}}}}}"#,
        r#"{"Agent":{"user_id":"u600","body":{"Dispatch":{"order_id":"c0-600","seq":1,"kind":"collection","amount":"100.00","card_id":"k600","order_problem":null,"expires_at":null,"payee":null,"utr":"000000000600"}}}}"#,
        r#"{"Agent":{"user_id":"u7","body":{"Dispatch":{"order_id":"p0-7","seq":2,"kind":"payout","amount":"99.50","card_id":"k7","order_problem":"order_not_pending","expires_at":"2026-03-02T10:00:00Z","payee":{"account_last4":"4321","ifsc":"HDFC0000001"},"utr":null}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"p0-0","seq":1,"event_id":"w:6105","input_type":"payment_confirmed","command":{"PaymentConfirmed":{"utr":"900000000000"}},"operator":null}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"c0-0","seq":1,"event_id":"e2","input_type":"order_cancelled","command":{"Cancel":{"by":"merchant"}},"operator":null}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"c0-0","seq":1,"event_id":"e3","input_type":"supplement_requested","command":{"Supplement":{"utr":null}},"operator":null}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"c0-0","seq":1,"event_id":"e4","input_type":"admin_approve","command":{"Approve":{"amount":"50.00"}},"operator":"ops1"}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"c0-0","seq":1,"event_id":"e5","input_type":"admin_reject","command":"Reject","operator":"ops1"}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"c0-0","seq":1,"event_id":"e6","input_type":"collection_retry","command":"Retry","operator":"ops1"}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"c0-0","seq":1,"event_id":"e7","input_type":"admin_crawl_retry","command":"CrawlRetry","operator":"ops1"}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"c0-0","seq":1,"event_id":"e8","input_type":"admin_correct_cancel","command":"CorrectCancel","operator":"ops1"}}}}"#,
        r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"p0-0","seq":1,"event_id":"e9","input_type":"admin_cancel_payout","command":"CancelPayout","operator":"ops1"}}}}"#,
        r#"{"Merchant":{"merchant_id":"m0","body":{"Input":{"event_id":"w:1","command":{"type":"merchant_deposit","merchant_id":"m0","amount":"100000000.00"}}}}}"#,
        r#"{"Merchant":{"merchant_id":"m0","body":{"ValidateCollection":{"order_id":"c0-0","event_id":"w:6100"}}}}"#,
        r#"{"Merchant":{"merchant_id":"m0","body":{"ReservePayout":{"order_id":"p0-600","amount":"100.00","event_id":"w:11442"}}}}"#,
        r#"{"Merchant":{"merchant_id":"m1","body":{"CollectionCredit":{"order_id":"c0-1","actual":"250.00"}}}}"#,
        r#"{"Merchant":{"merchant_id":"m1","body":{"Clawback":{"order_id":"c0-1"}}}}"#,
        r#"{"Merchant":{"merchant_id":"m0","body":{"PayoutSpent":{"order_id":"p0-0"}}}}"#,
        r#"{"Merchant":{"merchant_id":"m0","body":{"PayoutRefund":{"order_id":"p0-0"}}}}"#,
    ];

    fn read(text: &str) -> Message {
        crate::decode::from_json_bytes(text.as_bytes()).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn write(message: &Message) -> String {
        serde_json::to_string(message).expect("a message serializes")
    }

    #[test]
    fn every_variant_reads_back_the_same_from_positions_as_from_names() {
        for object_form in OBJECT_FORMS {
            let from_names = read(object_form);
            let written = write(&from_names);
            let from_positions = read(&written);
            // Messages have no `PartialEq`; their `Debug` shows every field.
            assert_eq!(format!("{from_positions:?}"), format!("{from_names:?}"), "{object_form}\n{written}");
            assert_eq!(write(&from_positions), written, "written the same again");
            assert!(written.len() < object_form.len(), "shorter without names: {written}");
        }
    }

    #[test]
    fn fields_are_written_by_position_in_declaration_order() {
        let cases = [
            (
                r#"{"Order":{"order_id":"c0-600","body":{"DispatchAccepted":{"seq":1,"user_id":"u600","card_id":"k600"}}}}"#,
                r#"{"Order":["c0-600",{"DispatchAccepted":[1,"u600","k600"]}]}"#,
            ),
            (
                r#"{"Order":{"order_id":"c0-600","body":"CreationAccepted"}}"#,
                r#"{"Order":["c0-600","CreationAccepted"]}"#,
            ),
            (
                r#"{"Agent":{"user_id":"u600","body":{"Dispatch":{"order_id":"c0-600","seq":1,"kind":"collection","amount":"100.00","card_id":"k600","order_problem":null,"expires_at":null,"payee":null,"utr":"000000000600"}}}}"#,
                r#"{"Agent":["u600",{"Dispatch":["c0-600",1,"collection","100.00","k600",null,null,null,"000000000600"]}]}"#,
            ),
            (
                r#"{"Agent":{"user_id":"u0","body":{"SubOrder":{"order_id":"p0-0","seq":1,"event_id":"w:6105","input_type":"payment_confirmed","command":{"PaymentConfirmed":{"utr":"900000000000"}},"operator":null}}}}"#,
                r#"{"Agent":["u0",{"SubOrder":["p0-0",1,"w:6105","payment_confirmed",{"PaymentConfirmed":["900000000000"]},null]}]}"#,
            ),
            (
                r#"{"Merchant":{"merchant_id":"m0","body":{"Input":{"event_id":"w:1","command":{"type":"merchant_deposit","merchant_id":"m0","amount":"100000000.00"}}}}}"#,
                r#"{"Merchant":["m0",{"Input":["w:1",["merchant_deposit","m0","100000000.00"]]}]}"#,
            ),
        ];
        for (object_form, positional) in cases {
            assert_eq!(write(&read(object_form)), positional);
        }
    }

    #[test]
    fn a_missing_or_extra_position_is_refused() {
        for text in [
            r#"{"Order":["c0-600",{"DispatchAccepted":[1,"u600"]}]}"#,
            r#"{"Order":["c0-600",{"DispatchAccepted":[1,"u600","k600","extra"]}]}"#,
            r#"{"Order":["c0-600"]}"#,
        ] {
            let read: Result<Message, _> = crate::decode::from_json_bytes(text.as_bytes());
            assert!(read.is_err(), "{text} read as {read:?}");
        }
    }

    /// One command of every SPEC §5 type, in its named form (as the API takes it and as messages held
    /// it before).
    const COMMANDS: &[&str] = &[
        r#"{"type":"merchant_registered","merchant_id":"m0","collection_fee_rate":"0.02","payout_fee_rate":"0.01","payout_fee_fixed":"5.00","callback_url":"http://m0.example/callback"}"#,
        r#"{"type":"merchant_deposit","merchant_id":"m0","amount":"100000000.00"}"#,
        r#"{"type":"user_registered","user_id":"u1","telegram_bound":true}"#,
        r#"{"type":"card_bound","user_id":"u1","card_id":"k1","provider":"phonepe","account_last4":"1234","vpa":null}"#,
        r#"{"type":"user_recharge","user_id":"u1","amount":"1000.00","commission":"10.00"}"#,
        r#"{"type":"user_adjustment","user_id":"u1","amount":"-5.00","reason":"fee"}"#,
        r#"{"type":"collection_created","order_id":"c1","merchant_id":"m0","amount":"100.00","utr":null,"expires_at":"2026-03-02T10:00:00Z"}"#,
        r#"{"type":"collection_dispatched","order_id":"c1","user_id":"u1","card_id":"k1"}"#,
        r#"{"type":"payment_confirmed","order_id":"p1","utr":"900000000000"}"#,
        r#"{"type":"order_cancelled","order_id":"c1","by":"merchant"}"#,
        r#"{"type":"supplement_requested","order_id":"c1","utr":null}"#,
        r#"{"type":"collection_retry","order_id":"c1"}"#,
        r#"{"type":"payout_created","order_id":"p1","merchant_id":"m0","amount":"99.50","payee":{"account_last4":"4321","ifsc":"HDFC0000001"},"expires_at":null}"#,
        r#"{"type":"payout_grabbed","order_id":"p1","user_id":"u1","card_id":"k1"}"#,
        r#"{"type":"crawl_result","request_id":"k1:1","user_id":"u1","card_id":"k1","ok":true,"error":null,"lines":[{"txn_id":"t1","utr":"900000000000","utr_supported":true,"direction":"in","amount":"100.00","status":"success","time":"2026-03-02T09:00:00Z","counterparty":{}}],"next_from":null}"#,
        r#"{"type":"card_reauthenticated","user_id":"u1","card_id":"k1"}"#,
        r#"{"type":"admin_approve","order_id":"c1","operator":"ops1","amount":"50.00"}"#,
        r#"{"type":"admin_reject","order_id":"c1","operator":"ops1"}"#,
        r#"{"type":"admin_crawl_retry","order_id":"c1","operator":"ops1"}"#,
        r#"{"type":"admin_correct_cancel","order_id":"c1","operator":"ops1"}"#,
        r#"{"type":"admin_cancel_payout","order_id":"p1","operator":"ops1"}"#,
        r#"{"type":"admin_unban","user_id":"u1","operator":"ops1"}"#,
        r#"{"type":"tick"}"#,
        r#"{"type":"wallet_line","card_id":"k1","line":{"txn_id":"t1","utr":null,"utr_supported":false,"direction":"out","amount":"99.50","status":"processing","time":"2026-03-02T09:00:00Z","counterparty":{"account_last4":"4321"},"payee_ifsc":"HDFC0000001"}}"#,
        r#"{"type":"wallet_line_status","card_id":"k1","txn_id":"t1","status":"failed"}"#,
        r#"{"type":"wallet_fault","card_id":"k1","fault":"upstream_busy"}"#,
    ];

    fn command_of(message: &Message) -> &Command {
        match message {
            Message::Agent { body: AgentBody::Input { command, .. }, .. } => command,
            other => panic!("not an agent's input: {other:?}"),
        }
    }

    fn agent_input(command_text: &str) -> String {
        format!(r#"{{"Agent":["u1",{{"Input":["e1",{command_text}]}}]}}"#)
    }

    #[test]
    fn every_command_reads_back_the_same_from_positions_as_from_names() {
        let mut types: Vec<&str> = Vec::new();
        for named in COMMANDS {
            let command: Command = serde_json::from_str(named).unwrap_or_else(|error| panic!("{named}: {error}"));
            types.push(command.type_name());
            let before = agent_input(named);
            let from_names = read(&before);
            assert_eq!(command_of(&from_names), &command, "the named form still reads: {before}");
            let written = write(&from_names);
            assert_eq!(command_of(&read(&written)), &command, "{written}");
            assert_eq!(write(&read(&written)), written, "written the same again");
            if let Command::CrawlResult(_) = command {
                assert_eq!(written, before, "a crawl result keeps its names (`PositionalCommand`)");
            } else {
                let positional = format!(r#"["{}""#, command.type_name());
                assert!(written.contains(&positional) && written.len() < before.len(), "{written}");
            }
        }
        assert_eq!(types, Command::VARIANTS, "one command of every type, in declaration order");
    }

    #[test]
    fn a_command_is_written_as_its_type_then_its_fields_in_declaration_order() {
        let cases = [
            (COMMANDS[6], r#"["collection_created","c1","m0","100.00",null,"2026-03-02T10:00:00Z"]"#),
            (
                COMMANDS[12],
                r#"["payout_created","p1","m0","99.50",{"account_last4":"4321","ifsc":"HDFC0000001"},null]"#,
            ),
            (COMMANDS[22], r#"["tick"]"#),
        ];
        for (named, positional) in cases {
            assert_eq!(write(&read(&agent_input(named))), agent_input(positional));
        }
    }

    #[test]
    fn a_command_may_leave_off_trailing_defaults_but_nothing_else() {
        let short = read(&agent_input(r#"["payment_confirmed","p1"]"#));
        let expected: Command =
            serde_json::from_str(r#"{"type":"payment_confirmed","order_id":"p1","utr":null}"#).expect("a command");
        assert_eq!(command_of(&short), &expected);
        for (command_text, error) in [
            (r#"["payment_confirmed","p1",null,"extra"]"#, "more fields than `payment_confirmed` has"),
            (r#"["collection_dispatched","c1","u1"]"#, "invalid length 2"),
            (r#"["no_such_type","c1"]"#, "unknown variant `no_such_type`"),
            (r#"[]"#, "missing field `type`"),
            (r#"[7,"c1"]"#, "invalid type: integer `7`"),
        ] {
            let text = agent_input(command_text);
            let read: Result<Message, _> = crate::decode::from_json_bytes(text.as_bytes());
            let message = read.expect_err(command_text).to_string();
            assert!(message.contains(error), "{command_text}: {message}");
        }
    }

    #[test]
    fn a_command_given_alone_is_read_only_by_its_names() {
        // `deserialize_positional` is for commands inside messages; an input (SPEC §5) is an object.
        let alone = serde_json::from_str::<Command>(r#"["payment_confirmed","p1",null]"#);
        assert!(alone.is_err(), "{alone:?}");
    }
}
