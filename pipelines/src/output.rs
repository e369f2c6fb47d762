//! Outputs (SPEC §6): what the stages tell the connector, merchants, agents and operators.

use crate::input::Provider;
use crate::money::Money;
use crate::time::Timestamp;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CrawlMode {
    OrderCheck,
    Reservoir,
    Detail,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageOrder {
    Asc,
    Desc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderKind {
    Collection,
    Payout,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackStatus {
    Success,
    Cancelled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationKind {
    ReauthRequired,
    Underpaid,
    Banned,
}

/// A request to the statement connector (R-CHK-1, R-CHK-2, R-PEND-1, R-MATCH-P1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CrawlRequested {
    pub request_id: String,
    pub user_id: String,
    pub card_id: String,
    pub provider: Provider,
    pub mode: CrawlMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<PageOrder>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub txn_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBody {
    CrawlRequested(CrawlRequested),
    MerchantCallback {
        callback_id: String,
        merchant_id: String,
        order_id: String,
        kind: OrderKind,
        status: CallbackStatus,
        amount: Money,
        #[serde(skip_serializing_if = "Option::is_none")]
        actual_amount: Option<Money>,
        #[serde(skip_serializing_if = "Option::is_none")]
        utr: Option<String>,
    },
    Notification {
        user_id: String,
        channel: &'static str,
        kind: NotificationKind,
        text: String,
    },
    SessionRevoked {
        user_id: String,
    },
    DispatchRejected {
        order_id: String,
        user_id: String,
        reason: Reason,
    },
    CommandRejected {
        event_id: String,
        input_type: &'static str,
        reason: Reason,
        message: String,
    },
}

/// One output, stamped with the event time of what caused it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Output {
    pub at: Timestamp,
    #[serde(flatten)]
    pub body: OutputBody,
}

/// Rejection reasons of SPEC §7 ("Rejection reasons"). Tests compare these codes, never messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    UnknownOrder,
    UnknownUser,
    UnknownCard,
    UnknownMerchant,
    OrderNotPending,
    OrderExpired,
    UserBanned,
    DeferredDebt,
    CardUnauthenticated,
    InsufficientBalance,
    DuplicateCard,
    InvalidAmount,
    InsufficientMerchantBalance,
    InvalidPayee,
    NoLiveSubOrder,
    LineFound,
    InvalidTransition,
}

/// A refused input: its reason code and a sentence for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: Reason,
    pub message: String,
}

impl Rejection {
    pub fn new(reason: Reason, message: impl Into<String>) -> Rejection {
        Rejection { reason, message: message.into() }
    }
}
