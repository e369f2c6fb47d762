//! Outputs (SPEC §6): what the stages tell the connector, merchants, agents and operators.

use crate::input::Provider;
use crate::money::Money;
use crate::time::Timestamp;
use crate::Text;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrawlMode {
    OrderCheck,
    Reservoir,
    Detail,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageOrder {
    Asc,
    Desc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderKind {
    Collection,
    Payout,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackStatus {
    Success,
    Cancelled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationKind {
    ReauthRequired,
    Underpaid,
    Banned,
}

/// A request to the statement connector (R-CHK-1, R-CHK-2, R-PEND-1, R-MATCH-P1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrawlRequested {
    pub request_id: Text,
    pub user_id: Text,
    pub card_id: Text,
    pub provider: Provider,
    pub mode: CrawlMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<PageOrder>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub txn_id: Option<Text>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBody {
    CrawlRequested(CrawlRequested),
    MerchantCallback {
        callback_id: Text,
        merchant_id: Text,
        order_id: Text,
        kind: OrderKind,
        status: CallbackStatus,
        amount: Money,
        #[serde(skip_serializing_if = "Option::is_none")]
        actual_amount: Option<Money>,
        #[serde(skip_serializing_if = "Option::is_none")]
        utr: Option<Text>,
    },
    Notification {
        user_id: Text,
        #[serde(deserialize_with = "deserialize_channel")]
        channel: crate::input::StaticName,
        kind: NotificationKind,
        text: String,
    },
    SessionRevoked {
        user_id: Text,
    },
    DispatchRejected {
        order_id: Text,
        user_id: Text,
        reason: Reason,
    },
    CommandRejected {
        event_id: Text,
        #[serde(deserialize_with = "crate::input::deserialize_type_name")]
        input_type: crate::input::StaticName,
        reason: Reason,
        message: String,
    },
}

/// The only notification channel (SPEC §6).
pub const TELEGRAM: &str = "telegram";

fn deserialize_channel<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<&'static str, D::Error> {
    crate::decode::parse_str(deserializer, |name| {
        if name == TELEGRAM {
            Ok(TELEGRAM)
        } else {
            Err(format!("unknown notification channel `{name}`"))
        }
    })
}

/// One output, stamped with the event time of what caused it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub at: Timestamp,
    #[serde(flatten)]
    pub body: OutputBody,
}

/// Rejection reasons of SPEC §7 ("Rejection reasons"). Tests compare these codes, never messages. A
/// new reason goes into [`Reason::ALL`] too (services count rejections by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

impl Reason {
    /// Every reason, in declaration order (`reason as usize` is its index here): what a service counts
    /// rejections by.
    pub const ALL: [Reason; 17] = [
        Reason::UnknownOrder,
        Reason::UnknownUser,
        Reason::UnknownCard,
        Reason::UnknownMerchant,
        Reason::OrderNotPending,
        Reason::OrderExpired,
        Reason::UserBanned,
        Reason::DeferredDebt,
        Reason::CardUnauthenticated,
        Reason::InsufficientBalance,
        Reason::DuplicateCard,
        Reason::InvalidAmount,
        Reason::InsufficientMerchantBalance,
        Reason::InvalidPayee,
        Reason::NoLiveSubOrder,
        Reason::LineFound,
        Reason::InvalidTransition,
    ];
}

/// A refused input: its reason code and a sentence for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub reason: Reason,
    pub message: String,
}

impl Rejection {
    pub fn new(reason: Reason, message: impl Into<String>) -> Rejection {
        Rejection { reason, message: message.into() }
    }
}
