//! The three stateful stages of SPEC §3 and the events that join them. Each stage owns its state, keyed
//! by its id, and talks to the others only through [`Message`]s, so each can be a partitioned consumer.
//! Handlers are pure: they read the stage's state, the message and the event time in [`Effects`], and
//! write state, outputs, messages and timers.

pub mod agent;
pub mod merchant;
pub mod order;
/// `Serialize` of the messages below and their parts: fields by position, not by name.
mod positional;

use crate::input::{CancelledBy, Command, Party};
use crate::money::Money;
use crate::output::{OrderKind, Output, OutputBody, Reason, Rejection};
use crate::time::Timestamp;
use crate::Text;
use serde::{Deserialize, Serialize};

/// An event between stages (or from the log to a stage), routed by its key. Written with its fields by
/// position (`positional`, as are the bodies, outcomes, sub-order commands and dispatch requests below,
/// and the commands of the bodies' `Input`s); the derived `Deserialize` reads that form and the objects
/// written before (the commands through `crate::decode::deserialize_positional`).
#[derive(Clone, Debug, Deserialize)]
pub enum Message {
    Order { order_id: Text, body: OrderBody },
    Agent { user_id: Text, body: AgentBody },
    Merchant { merchant_id: Text, body: MerchantBody },
}

/// What the order stage consumes.
#[derive(Clone, Debug, Deserialize)]
pub enum OrderBody {
    /// An input of the order stage (SPEC §5 table).
    Input {
        event_id: Text,
        #[serde(deserialize_with = "crate::decode::deserialize_positional")]
        command: Command,
    },
    /// The merchant stage accepted a new order (and reserved a payout's funds, R-MER-3).
    CreationAccepted,
    /// The merchant stage refused a new order.
    CreationRefused {
        event_id: Text,
        #[serde(deserialize_with = "crate::input::deserialize_type_name")]
        input_type: crate::input::StaticName,
        rejection: Rejection,
    },
    /// The agent stage accepted a dispatch or grab (R-DSP-1, R-PAY-2).
    DispatchAccepted { seq: u32, user_id: Text, card_id: Text },
    /// The agent stage refused a dispatch or grab.
    DispatchRefused { user_id: Text, reason: Reason },
    /// A sub-order reached an outcome that concerns the main order.
    Outcome { seq: u32, outcome: SubOutcome },
}

/// Sub-order outcomes the order stage turns into main-order states, merchant movements and callbacks.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub enum SubOutcome {
    /// R-MER-2: `actual` is the matched line's amount (or the operator's); `utr` back-fills the order.
    CollectionSucceeded { actual: Money, utr: Option<Text> },
    /// Closed, cancelled, timed out or rejected (R-CLOSE-1, R-CLOSE-3, R-WAVE-2, R-ADMIN-1, R-REAUTH-1).
    CollectionCancelled,
    /// R-ADMIN-3: a success corrected to cancelled.
    CollectionCorrected,
    /// R-MER-4: `paid_total` is the callback's `actual_amount`.
    PayoutSucceeded { paid_total: Money },
    /// A payout sub-order timed out, was rejected or abandoned: the order waits for the next agent.
    PayoutReturned,
    /// R-ADMIN-4: the whole payout is cancelled.
    PayoutCancelled,
    /// A supplement's UTR, which becomes the order's if it had none (R-POST-1).
    UtrAdded { utr: Text },
}

/// What the agent stage consumes.
#[derive(Clone, Debug, Deserialize)]
pub enum AgentBody {
    /// An input of the agent stage (SPEC §5 table).
    Input {
        event_id: Text,
        #[serde(deserialize_with = "crate::decode::deserialize_positional")]
        command: Command,
    },
    /// A dispatch (collection) or grab (payout) the order stage passed on (R-DSP-1, R-PAY-2).
    Dispatch(DispatchRequest),
    /// An order command routed to the live (or last) sub-order.
    SubOrder {
        order_id: Text,
        seq: u32,
        event_id: Text,
        #[serde(deserialize_with = "crate::input::deserialize_type_name")]
        input_type: crate::input::StaticName,
        command: SubOrderCommand,
        /// The operator of an `admin_*` command, recorded with its decision (R-AUDIT-1).
        operator: Option<Text>,
    },
}

#[derive(Clone, Debug, Deserialize)]
pub struct DispatchRequest {
    pub order_id: Text,
    pub seq: u32,
    pub kind: OrderKind,
    pub amount: Money,
    pub card_id: Text,
    /// The order-level check that failed (order_not_pending, order_expired), reported in R-DSP-1 order.
    pub order_problem: Option<Reason>,
    pub expires_at: Option<Timestamp>,
    pub payee: Option<Box<Party>>,
    /// The order's UTR, which a collection's sub-order inherits.
    pub utr: Option<Text>,
}

#[derive(Clone, Debug, Deserialize)]
pub enum SubOrderCommand {
    PaymentConfirmed { utr: Option<Text> },
    Cancel { by: CancelledBy },
    Supplement { utr: Option<Text> },
    Retry,
    Approve { amount: Option<Money> },
    Reject,
    CrawlRetry,
    CorrectCancel,
    CancelPayout,
}

/// What the merchant stage consumes.
#[derive(Clone, Debug, Deserialize)]
pub enum MerchantBody {
    Input {
        event_id: Text,
        #[serde(deserialize_with = "crate::decode::deserialize_positional")]
        command: Command,
    },
    /// Does the merchant exist? (a new collection, R-MER-1: nothing is reserved)
    ValidateCollection { order_id: Text, event_id: Text },
    /// R-MER-3: reserve a new payout's payable or refuse it.
    ReservePayout { order_id: Text, amount: Money, event_id: Text },
    /// R-MER-2.
    CollectionCredit { order_id: Text, actual: Money },
    /// R-ADMIN-3.
    Clawback { order_id: Text },
    /// R-MER-4 success.
    PayoutSpent { order_id: Text },
    /// R-MER-4 cancel.
    PayoutRefund { order_id: Text },
}

/// A timer: state of the stage that set it, fired deterministically at its due time (SPEC §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Timer {
    Order { order_id: Text, timer: order::OrderTimer },
    Agent { user_id: Text, timer: agent::AgentTimer },
    Provider(crate::wallet_sim::ProviderTimer),
}

/// Everything one handler produces. The runtime drains it after each handler.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Effects {
    /// Event time of what is being processed.
    pub now: Timestamp,
    /// The event time the messages sent while processing it carry (SPEC §3): the time of the record or
    /// timer that caused them, which a partitioned run's partition clock may be past (it applied later
    /// records of other keys first). A handler that applies a command which waited raises it to the
    /// command's own time. Replay's engine runs every message at once, at the time it sets here too,
    /// and stamps nothing with it.
    pub cause_at: Timestamp,
    /// Where a handler raised `cause_at` ([`Effects::raise_cause_at`]), as (number of messages sent
    /// before, the time from then on): a message carries the time in effect when it was sent, not the
    /// last one. Only a partitioned run raises it (replay's engine runs every message at its own time).
    #[serde(skip)]
    pub cause_raised: Vec<(usize, Timestamp)>,
    pub outputs: Vec<Output>,
    /// Messages to other stages, oldest first (the engine runs them as its FIFO, SPEC §3).
    pub messages: std::collections::VecDeque<Message>,
    pub timers: Vec<(Timestamp, Timer)>,
}

/// The time the `index`-th message a handler sent carries, given where it raised its `cause_at`
/// ([`Effects::cause_raised`]) and the `cause_at` it started with.
pub fn sent_at(cause_raised: &[(usize, Timestamp)], index: usize, started_at: Timestamp) -> Timestamp {
    let raised = cause_raised.iter().rev().find(|(sent_before, _)| *sent_before <= index);
    raised.map_or(started_at, |(_, at)| *at)
}

impl Effects {
    pub fn emit(&mut self, body: OutputBody) {
        self.outputs.push(Output { at: self.now, body });
    }

    pub fn send(&mut self, message: Message) {
        self.messages.push_back(message);
    }

    /// Stamps what is sent from now on no earlier than `at` (a command that waited is applied: what it
    /// sends carries its own time, whatever answer released it). Messages sent before keep their time:
    /// two commands released together must not both carry the later one's time.
    pub fn raise_cause_at(&mut self, at: Timestamp) {
        if at > self.cause_at {
            self.cause_at = at;
            self.cause_raised.push((self.messages.len(), at));
        }
    }

    /// Schedules a timer. One already overdue keeps its due time as its place in the order (so it fires
    /// before the next input, SPEC §3) and acts at the clock when it fires (outputs never go back).
    pub fn schedule(&mut self, due: Timestamp, timer: Timer) {
        self.timers.push((due, timer));
    }

    /// R-IN-1: answers a bad input with `command_rejected`; the caller changes nothing.
    pub fn reject(&mut self, event_id: &str, input_type: &'static str, rejection: Rejection) {
        self.emit(OutputBody::CommandRejected {
            event_id: event_id.into(),
            input_type,
            reason: rejection.reason,
            message: rejection.message,
        });
    }
}

/// Largest amount one input may carry (₹1,000,000,000,000): sums of any realistic number of inputs stay
/// far below `Decimal`'s range, so stage arithmetic on accepted amounts cannot overflow.
pub fn amount_max() -> Money {
    // In paise: exact and without the rounding `from_rupees` does (this is asked for every amount).
    Money::from_paise(1_000_000_000_000 * 100)
}

/// Parses a positive money amount or answers `invalid_amount` (R-IN-1).
pub fn positive_amount(text: &str, field: &str) -> Result<Money, Rejection> {
    match Money::parse(text) {
        Ok(amount) if amount > amount_max() => {
            Err(Rejection::new(Reason::InvalidAmount, format!("`{field}` exceeds {}", amount_max())))
        }
        Ok(amount) if amount.is_positive() => Ok(amount),
        Ok(_) => Err(Rejection::new(Reason::InvalidAmount, format!("`{field}` must be positive, got {text}"))),
        Err(error) => Err(Rejection::new(Reason::InvalidAmount, format!("`{field}`: {error}"))),
    }
}

/// Parses a non-negative money amount or answers `invalid_amount`.
pub fn non_negative_amount(text: &str, field: &str) -> Result<Money, Rejection> {
    match Money::parse(text) {
        Ok(amount) if amount > amount_max() => {
            Err(Rejection::new(Reason::InvalidAmount, format!("`{field}` exceeds {}", amount_max())))
        }
        Ok(amount) if !amount.is_negative() => Ok(amount),
        Ok(_) => Err(Rejection::new(Reason::InvalidAmount, format!("`{field}` must not be negative, got {text}"))),
        Err(error) => Err(Rejection::new(Reason::InvalidAmount, format!("`{field}`: {error}"))),
    }
}
