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
//! of them goes last, with `#[serde(default)]`, for the arrays written before it. Commands, parties and
//! rejections inside a message keep their derived form: commands are SPEC §5 inputs read by their tag
//! (`crate::decode`), and parties leave absent fields out.

use super::{AgentBody, DispatchRequest, MerchantBody, Message, OrderBody, SubOrderCommand, SubOutcome};
use serde::ser::{SerializeTuple, SerializeTupleVariant};
use serde::{Serialize, Serializer};

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
            OrderBody::Input { event_id, command } => variant!(serializer, "OrderBody", 0, "Input", event_id, command),
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
            AgentBody::Input { event_id, command } => variant!(serializer, "AgentBody", 0, "Input", event_id, command),
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
                variant!(serializer, "MerchantBody", 0, "Input", event_id, command)
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
    use super::super::Message;

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
                r#"{"Merchant":["m0",{"Input":["w:1",{"type":"merchant_deposit","merchant_id":"m0","amount":"100000000.00"}]}]}"#,
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
}
