//! Explicit conversions between the pipelines' Rust types and Avro values (serde's derive cannot map
//! our internally tagged enums onto Avro unions). Each union of named records lists its branches in
//! schema order (`*_BRANCHES`); a test checks every list against the schemas.

use crate::catalog::SchemaName;
use crate::error::{Error, Result};
use crate::value::{
    branch, enumeration, long_u32, long_u64, money, optional, optional_enumeration, optional_money, optional_string,
    optional_timestamp, record, static_name, string, symbols, timestamp, which, Fields,
};
use apache_avro::types::Value;
use pipelines::input::{
    self, CancelledBy, Command, Counterparty, CrawlError, Direction, Fault, LineStatus, Party, Provider, StatementLine,
    INPUT_TYPE_NAMES,
};
use pipelines::output::{
    CallbackStatus, CrawlMode, CrawlRequested, NotificationKind, OrderKind, Output, OutputBody, PageOrder, Reason,
    Rejection, TELEGRAM,
};
use pipelines::partition::{destination, route_input, RecordBody, RecordId, Routed, StageKind, StageRecord};
use pipelines::stages::{AgentBody, DispatchRequest, MerchantBody, Message, OrderBody, SubOrderCommand, SubOutcome};
use pipelines::time::Timestamp;
use pipelines::Input;

/// A Rust type carried as the root record of one embedded schema.
pub trait AvroRecord: Sized {
    /// The embedded schema whose root record this type is.
    const SCHEMA: SchemaName;
    fn to_avro(&self) -> Result<Value>;
    fn from_avro(value: Value) -> Result<Self>;
}

symbols!(Provider {
    Provider::Phonepe => "phonepe", Provider::Mobikwik => "mobikwik", Provider::Freecharge => "freecharge",
    Provider::Paytm => "paytm", Provider::Other => "other",
});
symbols!(Direction { Direction::In => "in", Direction::Out => "out" });
symbols!(LineStatus {
    LineStatus::Success => "success", LineStatus::Processing => "processing", LineStatus::Failed => "failed",
    LineStatus::Errored => "errored",
});
symbols!(Fault {
    Fault::SessionExpired => "session_expired", Fault::UpstreamBusy => "upstream_busy",
    Fault::DetailUnavailable => "detail_unavailable", Fault::None => "none",
});
symbols!(CrawlError {
    CrawlError::SessionExpired => "session_expired", CrawlError::UpstreamBusy => "upstream_busy",
    CrawlError::DetailUnavailable => "detail_unavailable",
});
symbols!(CancelledBy { CancelledBy::Merchant => "merchant", CancelledBy::User => "user", CancelledBy::Cashier => "cashier" });
symbols!(CrawlMode { CrawlMode::OrderCheck => "order_check", CrawlMode::Reservoir => "reservoir", CrawlMode::Detail => "detail" });
symbols!(PageOrder { PageOrder::Asc => "asc", PageOrder::Desc => "desc" });
symbols!(OrderKind { OrderKind::Collection => "collection", OrderKind::Payout => "payout" });
symbols!(CallbackStatus { CallbackStatus::Success => "success", CallbackStatus::Cancelled => "cancelled" });
symbols!(NotificationKind {
    NotificationKind::ReauthRequired => "reauth_required", NotificationKind::Underpaid => "underpaid",
    NotificationKind::Banned => "banned",
});
symbols!(StageKind { StageKind::Order => "order", StageKind::Agent => "agent", StageKind::Merchant => "merchant" });
symbols!(Reason {
    Reason::UnknownOrder => "unknown_order", Reason::UnknownUser => "unknown_user", Reason::UnknownCard => "unknown_card",
    Reason::UnknownMerchant => "unknown_merchant", Reason::OrderNotPending => "order_not_pending",
    Reason::OrderExpired => "order_expired", Reason::UserBanned => "user_banned", Reason::DeferredDebt => "deferred_debt",
    Reason::CardUnauthenticated => "card_unauthenticated", Reason::InsufficientBalance => "insufficient_balance",
    Reason::DuplicateCard => "duplicate_card", Reason::InvalidAmount => "invalid_amount",
    Reason::InsufficientMerchantBalance => "insufficient_merchant_balance", Reason::InvalidPayee => "invalid_payee",
    Reason::NoLiveSubOrder => "no_live_sub_order", Reason::LineFound => "line_found",
    Reason::InvalidTransition => "invalid_transition",
});

/// The notification channel's only symbol (SPEC §6).
const CHANNELS: &[&str] = &[TELEGRAM];

// ---------------------------------------------------------------------------------------------------
// Inputs (SPEC §5)

pub(crate) const COMMAND_BRANCHES: &[&str] = &[
    "MerchantRegistered",
    "MerchantDeposit",
    "UserRegistered",
    "CardBound",
    "UserRecharge",
    "UserAdjustment",
    "CollectionCreated",
    "CollectionDispatched",
    "PaymentConfirmed",
    "OrderCancelled",
    "SupplementRequested",
    "CollectionRetry",
    "PayoutCreated",
    "PayoutGrabbed",
    "CrawlResult",
    "CardReauthenticated",
    "AdminApprove",
    "AdminReject",
    "AdminCrawlRetry",
    "AdminCorrectCancel",
    "AdminCancelPayout",
    "AdminUnban",
    "Tick",
    "WalletLine",
    "WalletLineStatus",
    "WalletFault",
];

fn counterparty_to(party: &Counterparty) -> Value {
    record(vec![
        ("account_last4", optional_string(&party.account_last4)),
        ("vpa", optional_string(&party.vpa)),
        ("name", optional_string(&party.name)),
    ])
}

fn counterparty_from(value: Value) -> Result<Counterparty> {
    let mut f = Fields::of(value, "Counterparty")?;
    Ok(Counterparty {
        account_last4: f.optional_string("account_last4")?,
        vpa: f.optional_string("vpa")?,
        name: f.optional_string("name")?,
    })
}

fn party_to(party: &Party) -> Value {
    record(vec![
        ("account_last4", optional_string(&party.account_last4)),
        ("vpa", optional_string(&party.vpa)),
        ("name", optional_string(&party.name)),
        ("ifsc", optional_string(&party.ifsc)),
    ])
}

fn party_from(value: Value) -> Result<Party> {
    let mut f = Fields::of(value, "Party")?;
    Ok(Party {
        account_last4: f.optional_string("account_last4")?,
        vpa: f.optional_string("vpa")?,
        name: f.optional_string("name")?,
        ifsc: f.optional_string("ifsc")?,
    })
}

fn line_to(line: &StatementLine) -> Result<Value> {
    Ok(record(vec![
        ("txn_id", string(&line.txn_id)),
        ("utr", optional_string(&line.utr)),
        ("utr_supported", Value::Boolean(line.utr_supported)),
        ("direction", enumeration(line.direction)?),
        ("amount", string(&line.amount)),
        ("status", enumeration(line.status)?),
        ("time", timestamp(line.time)),
        ("counterparty", counterparty_to(&line.counterparty)),
        ("payee_ifsc", optional_string(&line.payee_ifsc)),
    ]))
}

fn line_from(value: Value) -> Result<StatementLine> {
    let mut f = Fields::of(value, "StatementLine")?;
    Ok(StatementLine {
        txn_id: f.string("txn_id")?,
        utr: f.optional_string("utr")?,
        utr_supported: f.boolean("utr_supported")?,
        direction: f.enumeration("direction")?,
        amount: f.string("amount")?,
        status: f.enumeration("status")?,
        time: f.timestamp("time")?,
        counterparty: counterparty_from(f.take("counterparty")?)?.into(),
        payee_ifsc: f.optional_string("payee_ifsc")?,
    })
}

pub(crate) fn crawl_result_to(c: &input::CrawlResult) -> Result<Value> {
    let lines = c.lines.iter().map(line_to).collect::<Result<Vec<_>>>()?;
    Ok(record(vec![
        ("request_id", string(&c.request_id)),
        ("user_id", string(&c.user_id)),
        ("card_id", string(&c.card_id)),
        ("ok", Value::Boolean(c.ok)),
        ("error", optional_enumeration(c.error)?),
        ("lines", Value::Array(lines)),
        ("next_from", optional_timestamp(c.next_from)),
    ]))
}

pub(crate) fn crawl_result_from(value: Value) -> Result<input::CrawlResult> {
    let mut f = Fields::of(value, "CrawlResult")?;
    Ok(input::CrawlResult {
        request_id: f.string("request_id")?,
        user_id: f.string("user_id")?,
        card_id: f.string("card_id")?,
        ok: f.boolean("ok")?,
        error: f.optional_enumeration("error")?,
        lines: f.array("lines")?.into_iter().map(line_from).collect::<Result<_>>()?,
        next_from: f.optional_timestamp("next_from")?,
    })
}

/// A command as its branch of the `command` union.
pub(crate) fn command_to(command: &Command) -> Result<Value> {
    let (name, value) = match command {
        Command::MerchantRegistered(c) => (
            "MerchantRegistered",
            record(vec![
                ("merchant_id", string(&c.merchant_id)),
                ("collection_fee_rate", string(&c.collection_fee_rate)),
                ("payout_fee_rate", string(&c.payout_fee_rate)),
                ("payout_fee_fixed", string(&c.payout_fee_fixed)),
                ("callback_url", optional_string(&c.callback_url)),
            ]),
        ),
        Command::MerchantDeposit(c) => {
            ("MerchantDeposit", record(vec![("merchant_id", string(&c.merchant_id)), ("amount", string(&c.amount))]))
        }
        Command::UserRegistered(c) => (
            "UserRegistered",
            record(vec![("user_id", string(&c.user_id)), ("telegram_bound", Value::Boolean(c.telegram_bound))]),
        ),
        Command::CardBound(c) => (
            "CardBound",
            record(vec![
                ("user_id", string(&c.user_id)),
                ("card_id", string(&c.card_id)),
                ("provider", enumeration(c.provider)?),
                ("account_last4", optional_string(&c.account_last4)),
                ("vpa", optional_string(&c.vpa)),
            ]),
        ),
        Command::UserRecharge(c) => (
            "UserRecharge",
            record(vec![
                ("user_id", string(&c.user_id)),
                ("amount", string(&c.amount)),
                ("commission", string(&c.commission)),
            ]),
        ),
        Command::UserAdjustment(c) => (
            "UserAdjustment",
            record(vec![("user_id", string(&c.user_id)), ("amount", string(&c.amount)), ("reason", string(&c.reason))]),
        ),
        Command::CollectionCreated(c) => (
            "CollectionCreated",
            record(vec![
                ("order_id", string(&c.order_id)),
                ("merchant_id", string(&c.merchant_id)),
                ("amount", string(&c.amount)),
                ("utr", optional_string(&c.utr)),
                ("expires_at", optional_timestamp(c.expires_at)),
            ]),
        ),
        Command::CollectionDispatched(c) => (
            "CollectionDispatched",
            record(vec![
                ("order_id", string(&c.order_id)),
                ("user_id", string(&c.user_id)),
                ("card_id", string(&c.card_id)),
            ]),
        ),
        Command::PaymentConfirmed(c) => {
            ("PaymentConfirmed", record(vec![("order_id", string(&c.order_id)), ("utr", optional_string(&c.utr))]))
        }
        Command::OrderCancelled(c) => {
            ("OrderCancelled", record(vec![("order_id", string(&c.order_id)), ("by", enumeration(c.by)?)]))
        }
        Command::SupplementRequested(c) => {
            ("SupplementRequested", record(vec![("order_id", string(&c.order_id)), ("utr", optional_string(&c.utr))]))
        }
        Command::CollectionRetry(c) => ("CollectionRetry", record(vec![("order_id", string(&c.order_id))])),
        Command::PayoutCreated(c) => (
            "PayoutCreated",
            record(vec![
                ("order_id", string(&c.order_id)),
                ("merchant_id", string(&c.merchant_id)),
                ("amount", string(&c.amount)),
                ("payee", party_to(&c.payee)),
                ("expires_at", optional_timestamp(c.expires_at)),
            ]),
        ),
        Command::PayoutGrabbed(c) => (
            "PayoutGrabbed",
            record(vec![
                ("order_id", string(&c.order_id)),
                ("user_id", string(&c.user_id)),
                ("card_id", string(&c.card_id)),
            ]),
        ),
        Command::CrawlResult(c) => ("CrawlResult", crawl_result_to(c)?),
        Command::CardReauthenticated(c) => {
            ("CardReauthenticated", record(vec![("user_id", string(&c.user_id)), ("card_id", string(&c.card_id))]))
        }
        Command::AdminApprove(c) => (
            "AdminApprove",
            record(vec![
                ("order_id", string(&c.order_id)),
                ("operator", string(&c.operator)),
                ("amount", optional_string(&c.amount)),
            ]),
        ),
        Command::AdminReject(c) => ("AdminReject", order_operator(&c.order_id, &c.operator)),
        Command::AdminCrawlRetry(c) => ("AdminCrawlRetry", order_operator(&c.order_id, &c.operator)),
        Command::AdminCorrectCancel(c) => ("AdminCorrectCancel", order_operator(&c.order_id, &c.operator)),
        Command::AdminCancelPayout(c) => ("AdminCancelPayout", order_operator(&c.order_id, &c.operator)),
        Command::AdminUnban(c) => {
            ("AdminUnban", record(vec![("user_id", string(&c.user_id)), ("operator", string(&c.operator))]))
        }
        Command::Tick(_) => ("Tick", record(vec![])),
        Command::WalletLine(c) => {
            ("WalletLine", record(vec![("card_id", string(&c.card_id)), ("line", line_to(&c.line)?)]))
        }
        Command::WalletLineStatus(c) => (
            "WalletLineStatus",
            record(vec![
                ("card_id", string(&c.card_id)),
                ("txn_id", string(&c.txn_id)),
                ("status", enumeration(c.status)?),
            ]),
        ),
        Command::WalletFault(c) => {
            ("WalletFault", record(vec![("card_id", string(&c.card_id)), ("fault", enumeration(c.fault)?)]))
        }
    };
    branch(COMMAND_BRANCHES, name, value)
}

fn order_operator(order_id: &str, operator: &str) -> Value {
    record(vec![("order_id", string(order_id)), ("operator", string(operator))])
}

/// A command from its branch of the `command` union.
pub(crate) fn command_from(value: Value) -> Result<Command> {
    let (name, value) = which(value, COMMAND_BRANCHES, "command")?;
    if name == "CrawlResult" {
        return crawl_result_from(value).map(Command::CrawlResult);
    }
    let mut f = Fields::of(value, name)?;
    let command = match name {
        "MerchantRegistered" => Command::MerchantRegistered(input::MerchantRegistered {
            merchant_id: f.string("merchant_id")?,
            collection_fee_rate: f.string("collection_fee_rate")?,
            payout_fee_rate: f.string("payout_fee_rate")?,
            payout_fee_fixed: f.string("payout_fee_fixed")?,
            callback_url: f.optional_string("callback_url")?,
        }),
        "MerchantDeposit" => Command::MerchantDeposit(input::MerchantDeposit {
            merchant_id: f.string("merchant_id")?,
            amount: f.string("amount")?,
        }),
        "UserRegistered" => Command::UserRegistered(input::UserRegistered {
            user_id: f.string("user_id")?,
            telegram_bound: f.boolean("telegram_bound")?,
        }),
        "CardBound" => Command::CardBound(input::CardBound {
            user_id: f.string("user_id")?,
            card_id: f.string("card_id")?,
            provider: f.enumeration("provider")?,
            account_last4: f.optional_string("account_last4")?,
            vpa: f.optional_string("vpa")?,
        }),
        "UserRecharge" => Command::UserRecharge(input::UserRecharge {
            user_id: f.string("user_id")?,
            amount: f.string("amount")?,
            commission: f.string("commission")?,
        }),
        "UserAdjustment" => Command::UserAdjustment(input::UserAdjustment {
            user_id: f.string("user_id")?,
            amount: f.string("amount")?,
            reason: f.string("reason")?,
        }),
        "CollectionCreated" => Command::CollectionCreated(input::CollectionCreated {
            order_id: f.string("order_id")?,
            merchant_id: f.string("merchant_id")?,
            amount: f.string("amount")?,
            utr: f.optional_string("utr")?,
            expires_at: f.optional_timestamp("expires_at")?,
        }),
        "CollectionDispatched" => Command::CollectionDispatched(input::CollectionDispatched {
            order_id: f.string("order_id")?,
            user_id: f.string("user_id")?,
            card_id: f.string("card_id")?,
        }),
        "PaymentConfirmed" => Command::PaymentConfirmed(input::PaymentConfirmed {
            order_id: f.string("order_id")?,
            utr: f.optional_string("utr")?,
        }),
        "OrderCancelled" => {
            Command::OrderCancelled(input::OrderCancelled { order_id: f.string("order_id")?, by: f.enumeration("by")? })
        }
        "SupplementRequested" => Command::SupplementRequested(input::SupplementRequested {
            order_id: f.string("order_id")?,
            utr: f.optional_string("utr")?,
        }),
        "CollectionRetry" => Command::CollectionRetry(input::CollectionRetry { order_id: f.string("order_id")? }),
        "PayoutCreated" => Command::PayoutCreated(input::PayoutCreated {
            order_id: f.string("order_id")?,
            merchant_id: f.string("merchant_id")?,
            amount: f.string("amount")?,
            payee: Box::new(party_from(f.take("payee")?)?),
            expires_at: f.optional_timestamp("expires_at")?,
        }),
        "PayoutGrabbed" => Command::PayoutGrabbed(input::PayoutGrabbed {
            order_id: f.string("order_id")?,
            user_id: f.string("user_id")?,
            card_id: f.string("card_id")?,
        }),
        "CardReauthenticated" => Command::CardReauthenticated(input::CardReauthenticated {
            user_id: f.string("user_id")?,
            card_id: f.string("card_id")?,
        }),
        "AdminApprove" => Command::AdminApprove(input::AdminApprove {
            order_id: f.string("order_id")?,
            operator: f.string("operator")?,
            amount: f.optional_string("amount")?,
        }),
        "AdminReject" => Command::AdminReject(input::AdminReject {
            order_id: f.string("order_id")?,
            operator: f.string("operator")?,
        }),
        "AdminCrawlRetry" => Command::AdminCrawlRetry(input::AdminCrawlRetry {
            order_id: f.string("order_id")?,
            operator: f.string("operator")?,
        }),
        "AdminCorrectCancel" => Command::AdminCorrectCancel(input::AdminCorrectCancel {
            order_id: f.string("order_id")?,
            operator: f.string("operator")?,
        }),
        "AdminCancelPayout" => Command::AdminCancelPayout(input::AdminCancelPayout {
            order_id: f.string("order_id")?,
            operator: f.string("operator")?,
        }),
        "AdminUnban" => {
            Command::AdminUnban(input::AdminUnban { user_id: f.string("user_id")?, operator: f.string("operator")? })
        }
        "Tick" => Command::Tick(input::Tick {}),
        "WalletLine" => Command::WalletLine(input::WalletLine {
            card_id: f.string("card_id")?,
            line: Box::new(line_from(f.take("line")?)?),
        }),
        "WalletLineStatus" => Command::WalletLineStatus(input::WalletLineStatus {
            card_id: f.string("card_id")?,
            txn_id: f.string("txn_id")?,
            status: f.enumeration("status")?,
        }),
        "WalletFault" => {
            Command::WalletFault(input::WalletFault { card_id: f.string("card_id")?, fault: f.enumeration("fault")? })
        }
        other => return Err(Error::shape(format!("command: unhandled branch `{other}`"))),
    };
    Ok(command)
}

impl AvroRecord for Input {
    const SCHEMA: SchemaName = SchemaName::Input;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![
            ("event_id", string(&self.event_id)),
            ("at", timestamp(self.at)),
            ("command", command_to(&self.command)?),
        ]))
    }

    fn from_avro(value: Value) -> Result<Input> {
        let mut f = Fields::of(value, "Input")?;
        Ok(Input {
            event_id: f.string("event_id")?,
            at: f.timestamp("at")?,
            command: command_from(f.take("command")?)?,
        })
    }
}

/// The statement connector's answer (topic `paisa.statement-results`): a `crawl_result` input.
#[derive(Clone, Debug, PartialEq)]
pub struct StatementResult {
    pub event_id: pipelines::Text,
    pub at: Timestamp,
    pub result: input::CrawlResult,
}

impl StatementResult {
    /// The SPEC §5 input it is.
    pub fn into_input(self) -> Input {
        Input { event_id: self.event_id, at: self.at, command: Command::CrawlResult(self.result) }
    }

    /// The statement result an input carries, if it is a `crawl_result`.
    pub fn from_input(input: Input) -> Option<StatementResult> {
        match input.command {
            Command::CrawlResult(result) => Some(StatementResult { event_id: input.event_id, at: input.at, result }),
            _ => None,
        }
    }
}

impl AvroRecord for StatementResult {
    const SCHEMA: SchemaName = SchemaName::StatementResult;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![
            ("event_id", string(&self.event_id)),
            ("at", timestamp(self.at)),
            ("result", crawl_result_to(&self.result)?),
        ]))
    }

    fn from_avro(value: Value) -> Result<StatementResult> {
        let mut f = Fields::of(value, "StatementResult")?;
        Ok(StatementResult {
            event_id: f.string("event_id")?,
            at: f.timestamp("at")?,
            result: crawl_result_from(f.take("result")?)?,
        })
    }
}

// ---------------------------------------------------------------------------------------------------
// Outputs (SPEC §6)

pub(crate) const OUTPUT_BRANCHES: &[&str] =
    &["CrawlRequested", "MerchantCallback", "Notification", "SessionRevoked", "DispatchRejected", "CommandRejected"];

fn crawl_requested_to(c: &CrawlRequested) -> Result<Value> {
    Ok(record(vec![
        ("request_id", string(&c.request_id)),
        ("user_id", string(&c.user_id)),
        ("card_id", string(&c.card_id)),
        ("provider", enumeration(c.provider)?),
        ("mode", enumeration(c.mode)?),
        ("order", optional_enumeration(c.order)?),
        ("from", optional_timestamp(c.from)),
        ("limit", optional(c.limit.map(long_u32))),
        ("txn_id", optional_string(&c.txn_id)),
    ]))
}

fn crawl_requested_from(value: Value) -> Result<CrawlRequested> {
    let mut f = Fields::of(value, "CrawlRequested")?;
    Ok(CrawlRequested {
        request_id: f.string("request_id")?,
        user_id: f.string("user_id")?,
        card_id: f.string("card_id")?,
        provider: f.enumeration("provider")?,
        mode: f.enumeration("mode")?,
        order: f.optional_enumeration("order")?,
        from: f.optional_timestamp("from")?,
        limit: f.optional_u32("limit")?,
        txn_id: f.optional_string("txn_id")?,
    })
}

fn output_body_to(body: &OutputBody) -> Result<Value> {
    let (name, value) = match body {
        OutputBody::CrawlRequested(c) => ("CrawlRequested", crawl_requested_to(c)?),
        OutputBody::MerchantCallback {
            callback_id,
            merchant_id,
            order_id,
            kind,
            status,
            amount,
            actual_amount,
            utr,
        } => (
            "MerchantCallback",
            record(vec![
                ("callback_id", string(callback_id)),
                ("merchant_id", string(merchant_id)),
                ("order_id", string(order_id)),
                ("kind", enumeration(*kind)?),
                ("status", enumeration(*status)?),
                ("amount", money(*amount)?),
                ("actual_amount", optional_money(*actual_amount)?),
                ("utr", optional_string(utr)),
            ]),
        ),
        OutputBody::Notification { user_id, channel, kind, text } => (
            "Notification",
            record(vec![
                ("user_id", string(user_id)),
                ("channel", static_name(channel, CHANNELS)?),
                ("kind", enumeration(*kind)?),
                ("text", string(text)),
            ]),
        ),
        OutputBody::SessionRevoked { user_id } => ("SessionRevoked", record(vec![("user_id", string(user_id))])),
        OutputBody::DispatchRejected { order_id, user_id, reason } => (
            "DispatchRejected",
            record(vec![
                ("order_id", string(order_id)),
                ("user_id", string(user_id)),
                ("reason", enumeration(*reason)?),
            ]),
        ),
        OutputBody::CommandRejected { event_id, input_type, reason, message } => (
            "CommandRejected",
            record(vec![
                ("event_id", string(event_id)),
                ("input_type", static_name(input_type, &INPUT_TYPE_NAMES)?),
                ("reason", enumeration(*reason)?),
                ("message", string(message)),
            ]),
        ),
    };
    branch(OUTPUT_BRANCHES, name, value)
}

fn output_body_from(value: Value) -> Result<OutputBody> {
    let (name, value) = which(value, OUTPUT_BRANCHES, "Output.body")?;
    if name == "CrawlRequested" {
        return crawl_requested_from(value).map(OutputBody::CrawlRequested);
    }
    let mut f = Fields::of(value, name)?;
    Ok(match name {
        "MerchantCallback" => OutputBody::MerchantCallback {
            callback_id: f.string("callback_id")?,
            merchant_id: f.string("merchant_id")?,
            order_id: f.string("order_id")?,
            kind: f.enumeration("kind")?,
            status: f.enumeration("status")?,
            amount: f.money("amount")?,
            actual_amount: f.optional_money("actual_amount")?,
            utr: f.optional_string("utr")?,
        },
        "Notification" => OutputBody::Notification {
            user_id: f.string("user_id")?,
            channel: f.static_name("channel", CHANNELS)?,
            kind: f.enumeration("kind")?,
            text: f.string("text")?,
        },
        "SessionRevoked" => OutputBody::SessionRevoked { user_id: f.string("user_id")? },
        "DispatchRejected" => OutputBody::DispatchRejected {
            order_id: f.string("order_id")?,
            user_id: f.string("user_id")?,
            reason: f.enumeration("reason")?,
        },
        "CommandRejected" => OutputBody::CommandRejected {
            event_id: f.string("event_id")?,
            input_type: f.static_name("input_type", &INPUT_TYPE_NAMES)?,
            reason: f.enumeration("reason")?,
            message: f.string("message")?,
        },
        other => return Err(Error::shape(format!("Output.body: unhandled branch `{other}`"))),
    })
}

impl AvroRecord for Output {
    const SCHEMA: SchemaName = SchemaName::Output;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![("at", timestamp(self.at)), ("body", output_body_to(&self.body)?)]))
    }

    fn from_avro(value: Value) -> Result<Output> {
        let mut f = Fields::of(value, "Output")?;
        Ok(Output { at: f.timestamp("at")?, body: output_body_from(f.take("body")?)? })
    }
}

/// A `crawl_requested` output with its event time (topic `paisa.crawl-requests`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrawlRequest {
    pub at: Timestamp,
    pub request: CrawlRequested,
}

impl CrawlRequest {
    /// The crawl request an output carries, if it is a `crawl_requested`.
    pub fn from_output(output: Output) -> Option<CrawlRequest> {
        match output.body {
            OutputBody::CrawlRequested(request) => Some(CrawlRequest { at: output.at, request }),
            _ => None,
        }
    }

    pub fn into_output(self) -> Output {
        Output { at: self.at, body: OutputBody::CrawlRequested(self.request) }
    }
}

impl AvroRecord for CrawlRequest {
    const SCHEMA: SchemaName = SchemaName::CrawlRequest;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![("at", timestamp(self.at)), ("request", crawl_requested_to(&self.request)?)]))
    }

    fn from_avro(value: Value) -> Result<CrawlRequest> {
        let mut f = Fields::of(value, "CrawlRequest")?;
        Ok(CrawlRequest { at: f.timestamp("at")?, request: crawl_requested_from(f.take("request")?)? })
    }
}

// ---------------------------------------------------------------------------------------------------
// Stage records (the stages' input logs: routed inputs, inter-stage messages, ticks)

pub(crate) const RECORD_BODY_BRANCHES: &[&str] = &["StageTick", "OrderMessage", "AgentMessage", "MerchantMessage"];
pub(crate) const ORDER_BODY_BRANCHES: &[&str] =
    &["OrderInput", "CreationAccepted", "CreationRefused", "DispatchAccepted", "DispatchRefused", "SubOrderOutcome"];
pub(crate) const OUTCOME_BRANCHES: &[&str] = &[
    "CollectionSucceeded",
    "CollectionCancelled",
    "CollectionCorrected",
    "PayoutSucceeded",
    "PayoutReturned",
    "PayoutCancelled",
    "UtrAdded",
];
pub(crate) const AGENT_BODY_BRANCHES: &[&str] = &["AgentInput", "DispatchRequest", "SubOrderCommand"];
pub(crate) const SUB_ORDER_COMMAND_BRANCHES: &[&str] = &[
    "PaymentConfirmed",
    "Cancel",
    "Supplement",
    "Retry",
    "Approve",
    "Reject",
    "CrawlRetry",
    "CorrectCancel",
    "CancelPayout",
];
pub(crate) const MERCHANT_BODY_BRANCHES: &[&str] = &[
    "MerchantInput",
    "ValidateCollection",
    "ReservePayout",
    "CollectionCredit",
    "Clawback",
    "PayoutSpent",
    "PayoutRefund",
];

fn stage_input(event_id: &str, command: &Command) -> Result<Value> {
    Ok(record(vec![("event_id", string(event_id)), ("command", command_to(command)?)]))
}

fn rejection_to(rejection: &Rejection) -> Result<Value> {
    Ok(record(vec![("reason", enumeration(rejection.reason)?), ("message", string(&rejection.message))]))
}

fn rejection_from(value: Value) -> Result<Rejection> {
    let mut f = Fields::of(value, "Rejection")?;
    Ok(Rejection { reason: f.enumeration("reason")?, message: f.string("message")? })
}

fn outcome_to(outcome: &SubOutcome) -> Result<Value> {
    let (name, value) = match outcome {
        SubOutcome::CollectionSucceeded { actual, utr } => {
            ("CollectionSucceeded", record(vec![("actual", money(*actual)?), ("utr", optional_string(utr))]))
        }
        SubOutcome::CollectionCancelled => ("CollectionCancelled", record(vec![])),
        SubOutcome::CollectionCorrected => ("CollectionCorrected", record(vec![])),
        SubOutcome::PayoutSucceeded { paid_total } => {
            ("PayoutSucceeded", record(vec![("paid_total", money(*paid_total)?)]))
        }
        SubOutcome::PayoutReturned => ("PayoutReturned", record(vec![])),
        SubOutcome::PayoutCancelled => ("PayoutCancelled", record(vec![])),
        SubOutcome::UtrAdded { utr } => ("UtrAdded", record(vec![("utr", string(utr))])),
    };
    branch(OUTCOME_BRANCHES, name, value)
}

fn outcome_from(value: Value) -> Result<SubOutcome> {
    let (name, value) = which(value, OUTCOME_BRANCHES, "SubOrderOutcome.outcome")?;
    let mut f = Fields::of(value, name)?;
    Ok(match name {
        "CollectionSucceeded" => {
            SubOutcome::CollectionSucceeded { actual: f.money("actual")?, utr: f.optional_string("utr")? }
        }
        "CollectionCancelled" => SubOutcome::CollectionCancelled,
        "CollectionCorrected" => SubOutcome::CollectionCorrected,
        "PayoutSucceeded" => SubOutcome::PayoutSucceeded { paid_total: f.money("paid_total")? },
        "PayoutReturned" => SubOutcome::PayoutReturned,
        "PayoutCancelled" => SubOutcome::PayoutCancelled,
        "UtrAdded" => SubOutcome::UtrAdded { utr: f.string("utr")? },
        other => return Err(Error::shape(format!("outcome: unhandled branch `{other}`"))),
    })
}

fn order_body_to(body: &OrderBody) -> Result<Value> {
    let (name, value) = match body {
        OrderBody::Input { event_id, command } => ("OrderInput", stage_input(event_id, command)?),
        OrderBody::CreationAccepted => ("CreationAccepted", record(vec![])),
        OrderBody::CreationRefused { event_id, input_type, rejection } => (
            "CreationRefused",
            record(vec![
                ("event_id", string(event_id)),
                ("input_type", static_name(input_type, &INPUT_TYPE_NAMES)?),
                ("rejection", rejection_to(rejection)?),
            ]),
        ),
        OrderBody::DispatchAccepted { seq, user_id, card_id } => (
            "DispatchAccepted",
            record(vec![("seq", long_u32(*seq)), ("user_id", string(user_id)), ("card_id", string(card_id))]),
        ),
        OrderBody::DispatchRefused { user_id, reason } => {
            ("DispatchRefused", record(vec![("user_id", string(user_id)), ("reason", enumeration(*reason)?)]))
        }
        OrderBody::Outcome { seq, outcome } => {
            ("SubOrderOutcome", record(vec![("seq", long_u32(*seq)), ("outcome", outcome_to(outcome)?)]))
        }
    };
    branch(ORDER_BODY_BRANCHES, name, value)
}

fn order_body_from(value: Value) -> Result<OrderBody> {
    let (name, value) = which(value, ORDER_BODY_BRANCHES, "OrderMessage.body")?;
    let mut f = Fields::of(value, name)?;
    Ok(match name {
        "OrderInput" => {
            OrderBody::Input { event_id: f.string("event_id")?, command: command_from(f.take("command")?)? }
        }
        "CreationAccepted" => OrderBody::CreationAccepted,
        "CreationRefused" => OrderBody::CreationRefused {
            event_id: f.string("event_id")?,
            input_type: f.static_name("input_type", &INPUT_TYPE_NAMES)?,
            rejection: rejection_from(f.take("rejection")?)?,
        },
        "DispatchAccepted" => OrderBody::DispatchAccepted {
            seq: f.u32("seq")?,
            user_id: f.string("user_id")?,
            card_id: f.string("card_id")?,
        },
        "DispatchRefused" => {
            OrderBody::DispatchRefused { user_id: f.string("user_id")?, reason: f.enumeration("reason")? }
        }
        "SubOrderOutcome" => OrderBody::Outcome { seq: f.u32("seq")?, outcome: outcome_from(f.take("outcome")?)? },
        other => return Err(Error::shape(format!("OrderMessage.body: unhandled branch `{other}`"))),
    })
}

fn sub_order_command_to(command: &SubOrderCommand) -> Result<Value> {
    let (name, value) = match command {
        SubOrderCommand::PaymentConfirmed { utr } => ("PaymentConfirmed", record(vec![("utr", optional_string(utr))])),
        SubOrderCommand::Cancel { by } => ("Cancel", record(vec![("by", enumeration(*by)?)])),
        SubOrderCommand::Supplement { utr } => ("Supplement", record(vec![("utr", optional_string(utr))])),
        SubOrderCommand::Retry => ("Retry", record(vec![])),
        SubOrderCommand::Approve { amount } => ("Approve", record(vec![("amount", optional_money(*amount)?)])),
        SubOrderCommand::Reject => ("Reject", record(vec![])),
        SubOrderCommand::CrawlRetry => ("CrawlRetry", record(vec![])),
        SubOrderCommand::CorrectCancel => ("CorrectCancel", record(vec![])),
        SubOrderCommand::CancelPayout => ("CancelPayout", record(vec![])),
    };
    branch(SUB_ORDER_COMMAND_BRANCHES, name, value)
}

fn sub_order_command_from(value: Value) -> Result<SubOrderCommand> {
    let (name, value) = which(value, SUB_ORDER_COMMAND_BRANCHES, "SubOrderCommand.command")?;
    let mut f = Fields::of(value, name)?;
    Ok(match name {
        "PaymentConfirmed" => SubOrderCommand::PaymentConfirmed { utr: f.optional_string("utr")? },
        "Cancel" => SubOrderCommand::Cancel { by: f.enumeration("by")? },
        "Supplement" => SubOrderCommand::Supplement { utr: f.optional_string("utr")? },
        "Retry" => SubOrderCommand::Retry,
        "Approve" => SubOrderCommand::Approve { amount: f.optional_money("amount")? },
        "Reject" => SubOrderCommand::Reject,
        "CrawlRetry" => SubOrderCommand::CrawlRetry,
        "CorrectCancel" => SubOrderCommand::CorrectCancel,
        "CancelPayout" => SubOrderCommand::CancelPayout,
        other => return Err(Error::shape(format!("SubOrderCommand.command: unhandled branch `{other}`"))),
    })
}

fn agent_body_to(body: &AgentBody) -> Result<Value> {
    let (name, value) = match body {
        AgentBody::Input { event_id, command } => ("AgentInput", stage_input(event_id, command)?),
        AgentBody::Dispatch(d) => (
            "DispatchRequest",
            record(vec![
                ("order_id", string(&d.order_id)),
                ("seq", long_u32(d.seq)),
                ("kind", enumeration(d.kind)?),
                ("amount", money(d.amount)?),
                ("card_id", string(&d.card_id)),
                ("order_problem", optional_enumeration(d.order_problem)?),
                ("expires_at", optional_timestamp(d.expires_at)),
                ("payee", optional(d.payee.as_deref().map(party_to))),
                ("utr", optional_string(&d.utr)),
            ]),
        ),
        AgentBody::SubOrder { order_id, seq, event_id, input_type, command, operator } => (
            "SubOrderCommand",
            record(vec![
                ("order_id", string(order_id)),
                ("seq", long_u32(*seq)),
                ("event_id", string(event_id)),
                ("input_type", static_name(input_type, &INPUT_TYPE_NAMES)?),
                ("command", sub_order_command_to(command)?),
                ("operator", optional_string(operator)),
            ]),
        ),
    };
    branch(AGENT_BODY_BRANCHES, name, value)
}

fn agent_body_from(value: Value) -> Result<AgentBody> {
    let (name, value) = which(value, AGENT_BODY_BRANCHES, "AgentMessage.body")?;
    let mut f = Fields::of(value, name)?;
    Ok(match name {
        "AgentInput" => {
            AgentBody::Input { event_id: f.string("event_id")?, command: command_from(f.take("command")?)? }
        }
        "DispatchRequest" => AgentBody::Dispatch(DispatchRequest {
            order_id: f.string("order_id")?,
            seq: f.u32("seq")?,
            kind: f.enumeration("kind")?,
            amount: f.money("amount")?,
            card_id: f.string("card_id")?,
            order_problem: f.optional_enumeration("order_problem")?,
            expires_at: f.optional_timestamp("expires_at")?,
            payee: f.optional("payee")?.map(party_from).transpose()?.map(Box::new),
            utr: f.optional_string("utr")?,
        }),
        "SubOrderCommand" => AgentBody::SubOrder {
            order_id: f.string("order_id")?,
            seq: f.u32("seq")?,
            event_id: f.string("event_id")?,
            input_type: f.static_name("input_type", &INPUT_TYPE_NAMES)?,
            command: sub_order_command_from(f.take("command")?)?,
            operator: f.optional_string("operator")?,
        },
        other => return Err(Error::shape(format!("AgentMessage.body: unhandled branch `{other}`"))),
    })
}

fn merchant_body_to(body: &MerchantBody) -> Result<Value> {
    let order = |order_id: &str| record(vec![("order_id", string(order_id))]);
    let (name, value) = match body {
        MerchantBody::Input { event_id, command } => ("MerchantInput", stage_input(event_id, command)?),
        MerchantBody::ValidateCollection { order_id, event_id } => {
            ("ValidateCollection", record(vec![("order_id", string(order_id)), ("event_id", string(event_id))]))
        }
        MerchantBody::ReservePayout { order_id, amount, event_id } => (
            "ReservePayout",
            record(vec![("order_id", string(order_id)), ("amount", money(*amount)?), ("event_id", string(event_id))]),
        ),
        MerchantBody::CollectionCredit { order_id, actual } => {
            ("CollectionCredit", record(vec![("order_id", string(order_id)), ("actual", money(*actual)?)]))
        }
        MerchantBody::Clawback { order_id } => ("Clawback", order(order_id)),
        MerchantBody::PayoutSpent { order_id } => ("PayoutSpent", order(order_id)),
        MerchantBody::PayoutRefund { order_id } => ("PayoutRefund", order(order_id)),
    };
    branch(MERCHANT_BODY_BRANCHES, name, value)
}

fn merchant_body_from(value: Value) -> Result<MerchantBody> {
    let (name, value) = which(value, MERCHANT_BODY_BRANCHES, "MerchantMessage.body")?;
    let mut f = Fields::of(value, name)?;
    Ok(match name {
        "MerchantInput" => {
            MerchantBody::Input { event_id: f.string("event_id")?, command: command_from(f.take("command")?)? }
        }
        "ValidateCollection" => {
            MerchantBody::ValidateCollection { order_id: f.string("order_id")?, event_id: f.string("event_id")? }
        }
        "ReservePayout" => MerchantBody::ReservePayout {
            order_id: f.string("order_id")?,
            amount: f.money("amount")?,
            event_id: f.string("event_id")?,
        },
        "CollectionCredit" => {
            MerchantBody::CollectionCredit { order_id: f.string("order_id")?, actual: f.money("actual")? }
        }
        "Clawback" => MerchantBody::Clawback { order_id: f.string("order_id")? },
        "PayoutSpent" => MerchantBody::PayoutSpent { order_id: f.string("order_id")? },
        "PayoutRefund" => MerchantBody::PayoutRefund { order_id: f.string("order_id")? },
        other => return Err(Error::shape(format!("MerchantMessage.body: unhandled branch `{other}`"))),
    })
}

/// A message as its branch of `StageRecord.body`.
pub(crate) fn message_to(message: &Message) -> Result<Value> {
    let (name, value) = match message {
        Message::Order { order_id, body } => {
            ("OrderMessage", record(vec![("order_id", string(order_id)), ("body", order_body_to(body)?)]))
        }
        Message::Agent { user_id, body } => {
            ("AgentMessage", record(vec![("user_id", string(user_id)), ("body", agent_body_to(body)?)]))
        }
        Message::Merchant { merchant_id, body } => {
            ("MerchantMessage", record(vec![("merchant_id", string(merchant_id)), ("body", merchant_body_to(body)?)]))
        }
    };
    branch(RECORD_BODY_BRANCHES, name, value)
}

impl AvroRecord for StageRecord {
    const SCHEMA: SchemaName = SchemaName::StageRecord;

    fn to_avro(&self) -> Result<Value> {
        let id = record(vec![
            ("source", string(&self.id.source)),
            ("offset", long_u64(self.id.offset, "RecordId.offset")?),
            ("index", long_u32(self.id.index)),
        ]);
        let body = match &self.body {
            RecordBody::Tick => branch(RECORD_BODY_BRANCHES, "StageTick", record(vec![]))?,
            RecordBody::Message { message } => message_to(message)?,
        };
        Ok(record(vec![("id", id), ("at", timestamp(self.at)), ("body", body)]))
    }

    fn from_avro(value: Value) -> Result<StageRecord> {
        let mut f = Fields::of(value, "StageRecord")?;
        let mut id = Fields::of(f.take("id")?, "RecordId")?;
        let id = RecordId { source: id.string("source")?, offset: id.u64("offset")?, index: id.u32("index")? };
        let at = f.timestamp("at")?;
        let (name, value) = which(f.take("body")?, RECORD_BODY_BRANCHES, "StageRecord.body")?;
        let body = match name {
            "StageTick" => RecordBody::Tick,
            "OrderMessage" => {
                let mut m = Fields::of(value, name)?;
                let message =
                    Message::Order { order_id: m.string("order_id")?, body: order_body_from(m.take("body")?)? };
                RecordBody::Message { message }
            }
            "AgentMessage" => {
                let mut m = Fields::of(value, name)?;
                let message = Message::Agent { user_id: m.string("user_id")?, body: agent_body_from(m.take("body")?)? };
                RecordBody::Message { message }
            }
            "MerchantMessage" => {
                let mut m = Fields::of(value, name)?;
                let message = Message::Merchant {
                    merchant_id: m.string("merchant_id")?,
                    body: merchant_body_from(m.take("body")?)?,
                };
                RecordBody::Message { message }
            }
            other => return Err(Error::shape(format!("StageRecord.body: unhandled branch `{other}`"))),
        };
        Ok(StageRecord { id, at, body })
    }
}

// ---------------------------------------------------------------------------------------------------
// Ticks and the changelog

/// A tick for one stage partition (topic `paisa.ticks`): every timer due at or before `at` fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockTick {
    pub at: Timestamp,
}

impl AvroRecord for ClockTick {
    const SCHEMA: SchemaName = SchemaName::ClockTick;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![("at", timestamp(self.at))]))
    }

    fn from_avro(value: Value) -> Result<ClockTick> {
        let mut f = Fields::of(value, "ClockTick")?;
        Ok(ClockTick { at: f.timestamp("at")? })
    }
}

/// A stage's keyed state after a record (topic `paisa.changelog`, compacted): `state` holds the key's
/// serialized state (its encoding belongs to the state store), `None` when the key was removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangelogEntry {
    pub stage: StageKind,
    pub partition: u32,
    pub key: String,
    /// Offset of the last stage record applied to this state.
    pub version: u64,
    pub state: Option<Vec<u8>>,
}

impl AvroRecord for ChangelogEntry {
    const SCHEMA: SchemaName = SchemaName::ChangelogEntry;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![
            ("stage", enumeration(self.stage)?),
            ("partition", long_u32(self.partition)),
            ("key", string(&self.key)),
            ("version", long_u64(self.version, "ChangelogEntry.version")?),
            ("state", optional(self.state.clone().map(Value::Bytes))),
        ]))
    }

    fn from_avro(value: Value) -> Result<ChangelogEntry> {
        let mut f = Fields::of(value, "ChangelogEntry")?;
        Ok(ChangelogEntry {
            stage: f.enumeration("stage")?,
            partition: f.u32("partition")?,
            key: f.string("key")?,
            version: f.u64("version")?,
            state: f.bytes_or_null("state")?,
        })
    }
}

// ---------------------------------------------------------------------------------------------------
// Keys

/// Key of `paisa.commands`: the stage and id an input is routed to (SPEC §5 table); a tick (broadcast)
/// has no stage and an empty id, a simulated-wallet event no stage and its card id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandKey {
    pub stage: Option<StageKind>,
    pub id: pipelines::Text,
}

impl CommandKey {
    /// The key of an input, by the pipelines' own routing.
    pub fn for_input(input: &Input) -> CommandKey {
        match route_input(input.clone()) {
            Routed::Message(message) => {
                let (stage, id) = destination(&message);
                CommandKey { stage: Some(stage), id: id.to_owned().into() }
            }
            Routed::Broadcast => CommandKey { stage: None, id: String::new().into() },
            Routed::Wallet(command) => {
                let card_id = match &command {
                    Command::WalletLine(c) => c.card_id.clone(),
                    Command::WalletLineStatus(c) => c.card_id.clone(),
                    Command::WalletFault(c) => c.card_id.clone(),
                    _ => String::new().into(),
                };
                CommandKey { stage: None, id: card_id }
            }
        }
    }
}

impl AvroRecord for CommandKey {
    const SCHEMA: SchemaName = SchemaName::CommandKey;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![("stage", optional_enumeration(self.stage)?), ("id", string(&self.id))]))
    }

    fn from_avro(value: Value) -> Result<CommandKey> {
        let mut f = Fields::of(value, "CommandKey")?;
        Ok(CommandKey { stage: f.optional_enumeration("stage")?, id: f.string("id")? })
    }
}

macro_rules! string_key {
    ($(#[$meta:meta])* $name:ident { $field:ident }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub struct $name {
            pub $field: String,
        }

        impl AvroRecord for $name {
            const SCHEMA: SchemaName = SchemaName::$name;

            fn to_avro(&self) -> Result<Value> {
                Ok(record(vec![(stringify!($field), string(&self.$field))]))
            }

            fn from_avro(value: Value) -> Result<$name> {
                let mut f = Fields::of(value, stringify!($name))?;
                Ok($name { $field: f.string(stringify!($field))? })
            }
        }
    };
}

string_key!(
    /// Key of `paisa.order-stage`.
    OrderKey { order_id }
);
string_key!(
    /// Key of `paisa.agent-stage`, `paisa.statement-results` and `paisa.crawl-requests`.
    AgentKey { user_id }
);
string_key!(
    /// Key of `paisa.merchant-stage`.
    MerchantKey { merchant_id }
);
string_key!(
    /// Key of `paisa.outputs`: see [`OutputKey::for_output`].
    OutputKey { id }
);

impl OutputKey {
    /// Outputs about one agent, merchant or order share a key, so they stay in order: the agent for
    /// crawl requests, notifications and revoked sessions, the merchant for callbacks, the order for a
    /// rejected dispatch, the event for a rejected command.
    pub fn for_output(output: &Output) -> OutputKey {
        let id = match &output.body {
            OutputBody::CrawlRequested(c) => &c.user_id,
            OutputBody::MerchantCallback { merchant_id, .. } => merchant_id,
            OutputBody::Notification { user_id, .. } | OutputBody::SessionRevoked { user_id } => user_id,
            OutputBody::DispatchRejected { order_id, .. } => order_id,
            OutputBody::CommandRejected { event_id, .. } => event_id,
        };
        OutputKey { id: id.to_string() }
    }
}

/// Key of `paisa.ticks`: the stage partition a tick is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TickKey {
    pub stage: StageKind,
    pub partition: u32,
}

impl AvroRecord for TickKey {
    const SCHEMA: SchemaName = SchemaName::TickKey;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![("stage", enumeration(self.stage)?), ("partition", long_u32(self.partition))]))
    }

    fn from_avro(value: Value) -> Result<TickKey> {
        let mut f = Fields::of(value, "TickKey")?;
        Ok(TickKey { stage: f.enumeration("stage")?, partition: f.u32("partition")? })
    }
}

/// Key of `paisa.changelog`: one stage key in one partition (compaction keeps its latest state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangelogKey {
    pub stage: StageKind,
    pub partition: u32,
    pub key: String,
}

impl AvroRecord for ChangelogKey {
    const SCHEMA: SchemaName = SchemaName::ChangelogKey;

    fn to_avro(&self) -> Result<Value> {
        Ok(record(vec![
            ("stage", enumeration(self.stage)?),
            ("partition", long_u32(self.partition)),
            ("key", string(&self.key)),
        ]))
    }

    fn from_avro(value: Value) -> Result<ChangelogKey> {
        let mut f = Fields::of(value, "ChangelogKey")?;
        Ok(ChangelogKey { stage: f.enumeration("stage")?, partition: f.u32("partition")?, key: f.string("key")? })
    }
}
