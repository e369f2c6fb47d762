//! The order stage (SPEC §3), keyed by `order_id`: main orders and their lifecycle (SPEC §4), the
//! arbitration of dispatches and grabs (at most one live sub-order per order), the routing of order
//! commands to the agent of the live (or last) sub-order, and merchant movements and callbacks.

use super::{
    positive_amount, AgentBody, DispatchRequest, Effects, MerchantBody, Message, OrderBody, SubOrderCommand,
    SubOutcome, Timer,
};
use crate::input::{Command, Party};
use crate::money::Money;
use crate::output::{CallbackStatus, OrderKind, OutputBody, Reason, Rejection};
use crate::time::Timestamp;
use crate::Text;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    Pending,
    InProgress,
    Success,
    Cancelled,
}

/// Timers the order stage sets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderTimer {
    /// R-EXP-1.
    Expiry,
}

/// The sub-orders the order stage knows of: who holds them (their state lives in the agent stage).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubOrderRef {
    pub seq: u32,
    pub user_id: Text,
    pub card_id: Text,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MainOrder {
    pub order_id: Text,
    pub kind: OrderKind,
    pub merchant_id: Text,
    pub amount: Money,
    pub state: OrderState,
    /// The first UTR the order ever had (SPEC §4).
    pub utr: Option<Text>,
    pub expires_at: Option<Timestamp>,
    pub payee: Option<Box<Party>>,
    pub sub_orders: Vec<SubOrderRef>,
    /// Waiting for the merchant stage to accept the creation; invisible until then.
    pub creating: bool,
    /// A dispatch or grab waiting for the agent stage's answer (arbitration, SPEC §3).
    pub dispatch_in_flight: bool,
    /// What the merchant was credited for on success (R-MER-2) or paid out (R-MER-4), for audits.
    pub actual_amount: Option<Money>,
    /// Callbacks sent so far (`callback_id` = `{order_id}:{n}`).
    pub callbacks_sent: u32,
    /// Commands that arrived while the order waited for another stage's answer (its creation, or a
    /// dispatch), applied in arrival order when the answer comes, with the time each was caused at
    /// (what the messages it sends then carry). In a partitioned run a merchant's next command can
    /// overtake the creation it depends on; replay never shows this state (SPEC §3).
    pub waiting: Vec<(Text, Command, Timestamp)>,
}

/// Commands that may wait for one order at most (more are refused: bounded state).
pub const ORDER_WAITING_COMMANDS_MAX: usize = 64;

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct OrderStage {
    /// Boxed: the table moves 32-byte entries when it grows, not 280-byte orders.
    pub orders: crate::keyed::KeyedMap<Box<MainOrder>>,
}

fn refuse(effects: &mut Effects, event_id: &str, command: &Command, reason: Reason, message: impl Into<String>) {
    effects.reject(event_id, command.type_name(), Rejection::new(reason, message));
}

impl OrderStage {
    pub fn handle(&mut self, order_id: &str, body: OrderBody, effects: &mut Effects) {
        match body {
            OrderBody::Input { event_id, command } => self.on_input(order_id, &event_id, command, effects),
            OrderBody::CreationAccepted => {
                self.on_creation_accepted(order_id, effects);
                self.release_waiting(order_id, effects);
            }
            OrderBody::CreationRefused { event_id, input_type, rejection } => {
                let waiting = self.orders.remove(order_id).map(|order| order.waiting).unwrap_or_default();
                effects.reject(&event_id, input_type, rejection);
                // The order never existed: what waited for it is refused as for an unknown order.
                self.apply_waiting(order_id, waiting, effects);
            }
            OrderBody::DispatchAccepted { seq, user_id, card_id } => {
                if let Some(order) = self.orders.get_mut(order_id) {
                    order.dispatch_in_flight = false;
                    order.state = OrderState::InProgress;
                    order.sub_orders.reserve_exact(1); // most orders have one sub-order: no room for four
                    order.sub_orders.push(SubOrderRef { seq, user_id, card_id });
                }
                self.release_waiting(order_id, effects);
            }
            OrderBody::DispatchRefused { user_id, reason } => {
                if let Some(order) = self.orders.get_mut(order_id) {
                    order.dispatch_in_flight = false;
                }
                effects.emit(OutputBody::DispatchRejected { order_id: order_id.into(), user_id, reason });
                self.release_waiting(order_id, effects);
            }
            OrderBody::Outcome { seq, outcome } => self.on_outcome(order_id, seq, outcome, effects),
        }
    }

    pub fn on_timer(&mut self, order_id: &str, timer: OrderTimer, effects: &mut Effects) {
        let OrderTimer::Expiry = timer;
        let Some(order) = self.orders.get_mut(order_id) else {
            return;
        };
        // R-EXP-1, R-TIMER-1: only an order still pending expires.
        if order.state == OrderState::Pending && !order.dispatch_in_flight && !order.creating {
            cancel_pending(order, effects);
        }
    }

    /// The order exists from here on; its expiry timer too (a refused creation leaves nothing behind,
    /// R-IN-1, so a later order reusing the id is not cancelled by it).
    fn on_creation_accepted(&mut self, order_id: &str, effects: &mut Effects) {
        if let Some(order) = self.orders.get_mut(order_id) {
            order.creating = false;
            if let Some(expires_at) = order.expires_at {
                effects.schedule(expires_at, Timer::Order { order_id: order_id.into(), timer: OrderTimer::Expiry });
            }
        }
    }

    /// Applies, in arrival order, the commands that waited for the answer that just came.
    fn release_waiting(&mut self, order_id: &str, effects: &mut Effects) {
        let waiting = self.orders.get_mut(order_id).map(|order| std::mem::take(&mut order.waiting)).unwrap_or_default();
        self.apply_waiting(order_id, waiting, effects);
    }

    /// Applies commands that waited, in arrival order.
    fn apply_waiting(&mut self, order_id: &str, waiting: Vec<(Text, Command, Timestamp)>, effects: &mut Effects) {
        for (event_id, command, caused_at) in waiting {
            // What it sends is stamped no earlier than the command itself, whatever answer released it.
            effects.raise_cause_at(caused_at);
            self.on_input(order_id, &event_id, command, effects);
        }
    }

    /// Whether `command` must wait for the order's pending answer, and whether it may (bounded).
    fn park(&mut self, order_id: &str, event_id: &str, command: Command, effects: &mut Effects) -> Option<Command> {
        let Some(order) = self.orders.get_mut(order_id) else {
            return Some(command);
        };
        let creates = matches!(command, Command::CollectionCreated(_) | Command::PayoutCreated(_));
        let dispatches = matches!(command, Command::CollectionDispatched(_) | Command::PayoutGrabbed(_));
        // A dispatch racing another dispatch is arbitrated at once (R-DSP-1: order_not_pending).
        let must_wait = !creates && (order.creating || (order.dispatch_in_flight && !dispatches));
        if !must_wait {
            return Some(command);
        }
        if order.waiting.len() >= ORDER_WAITING_COMMANDS_MAX {
            let message = format!("{ORDER_WAITING_COMMANDS_MAX} commands already wait for order {order_id}");
            refuse(effects, event_id, &command, Reason::InvalidTransition, message);
            return None;
        }
        order.waiting.push((event_id.into(), command, effects.cause_at));
        None
    }

    fn on_input(&mut self, order_id: &str, event_id: &str, command: Command, effects: &mut Effects) {
        let Some(command) = self.park(order_id, event_id, command, effects) else {
            return;
        };
        match &command {
            Command::CollectionCreated(created) => {
                let amount = match positive_amount(&created.amount, "amount") {
                    Ok(amount) => amount,
                    Err(rejection) => return effects.reject(event_id, command.type_name(), rejection),
                };
                let utr = created.utr.clone().filter(|utr| !utr.is_empty());
                self.create(
                    order_id,
                    event_id,
                    &command,
                    OrderKind::Collection,
                    &created.merchant_id,
                    amount,
                    utr,
                    created.expires_at,
                    None,
                    effects,
                );
            }
            Command::PayoutCreated(created) => {
                let amount = match positive_amount(&created.amount, "amount") {
                    Ok(amount) => amount,
                    Err(rejection) => return effects.reject(event_id, command.type_name(), rejection),
                };
                let payee = &created.payee;
                let has_last4 = payee.account_last4.as_deref().is_some_and(|last4| !last4.is_empty());
                let has_vpa = payee.vpa.as_deref().is_some_and(|vpa| !vpa.is_empty());
                if !has_last4 && !has_vpa {
                    return refuse(
                        effects,
                        event_id,
                        &command,
                        Reason::InvalidPayee,
                        "a payee needs `account_last4` or `vpa`",
                    );
                }
                self.create(
                    order_id,
                    event_id,
                    &command,
                    OrderKind::Payout,
                    &created.merchant_id,
                    amount,
                    None,
                    created.expires_at,
                    Some(payee.clone()),
                    effects,
                );
            }
            Command::CollectionDispatched(dispatch) => {
                self.dispatch(order_id, OrderKind::Collection, &dispatch.user_id, &dispatch.card_id, effects)
            }
            Command::PayoutGrabbed(grab) => {
                self.dispatch(order_id, OrderKind::Payout, &grab.user_id, &grab.card_id, effects)
            }
            _ => self.route(order_id, event_id, command, effects),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        order_id: &str,
        event_id: &str,
        command: &Command,
        kind: OrderKind,
        merchant_id: &str,
        amount: Money,
        utr: Option<Text>,
        expires_at: Option<Timestamp>,
        payee: Option<Box<Party>>,
        effects: &mut Effects,
    ) {
        let created = self.orders.insert_new(order_id, || {
            Box::new(MainOrder {
                order_id: order_id.into(),
                kind,
                merchant_id: merchant_id.into(),
                amount,
                state: OrderState::Pending,
                utr,
                expires_at,
                payee,
                sub_orders: Vec::new(),
                creating: true,
                dispatch_in_flight: false,
                callbacks_sent: 0,
                actual_amount: None,
                waiting: Vec::new(),
            })
        });
        if !created {
            return refuse(
                effects,
                event_id,
                command,
                Reason::InvalidTransition,
                format!("order {order_id} already exists"),
            );
        }
        let body = match kind {
            OrderKind::Collection => {
                MerchantBody::ValidateCollection { order_id: order_id.into(), event_id: event_id.into() }
            }
            OrderKind::Payout => {
                MerchantBody::ReservePayout { order_id: order_id.into(), amount, event_id: event_id.into() }
            }
        };
        effects.send(Message::Merchant { merchant_id: merchant_id.into(), body });
    }

    /// R-DSP-1 / R-PAY-2: the order-level checks; the agent stage does the rest, in the rule's order.
    fn dispatch(&mut self, order_id: &str, kind: OrderKind, user_id: &str, card_id: &str, effects: &mut Effects) {
        let order = match self.orders.get_mut(order_id) {
            Some(order) if !order.creating && order.kind == kind => order,
            _ => {
                return effects.emit(OutputBody::DispatchRejected {
                    order_id: order_id.into(),
                    user_id: user_id.into(),
                    reason: Reason::UnknownOrder,
                })
            }
        };
        let order_problem = if order.state != OrderState::Pending || order.dispatch_in_flight {
            Some(Reason::OrderNotPending)
        } else if order.expires_at.is_some_and(|expires_at| effects.now >= expires_at) {
            Some(Reason::OrderExpired)
        } else {
            None
        };
        if order_problem.is_none() {
            order.dispatch_in_flight = true;
        }
        let request = DispatchRequest {
            order_id: order_id.into(),
            seq: order.sub_orders.len() as u32 + 1,
            kind,
            amount: order.amount,
            card_id: card_id.into(),
            order_problem,
            expires_at: order.expires_at,
            payee: order.payee.clone(),
            // A collection's sub-orders inherit the order's UTR; a payout's come only from its own
            // payment_confirmed events (SPEC §4).
            utr: if kind == OrderKind::Collection { order.utr.clone() } else { None },
        };
        effects.send(Message::Agent { user_id: user_id.into(), body: AgentBody::Dispatch(request) });
    }

    /// Order commands: handled here when the order alone decides, else routed to the sub-order's agent.
    fn route(&mut self, order_id: &str, event_id: &str, command: Command, effects: &mut Effects) {
        let Some(order) = self.orders.get_mut(order_id).filter(|order| !order.creating) else {
            return refuse(effects, event_id, &command, Reason::UnknownOrder, format!("no order {order_id}"));
        };
        let sub_command = match order_command(order, &command) {
            Ok(Routing::Forward(sub_command)) => sub_command,
            Ok(Routing::CancelPending) => return cancel_pending(order, effects),
            Err(rejection) => return effects.reject(event_id, command.type_name(), rejection),
        };
        let Some(last) = order.sub_orders.last() else {
            return refuse(
                effects,
                event_id,
                &command,
                Reason::NoLiveSubOrder,
                format!("order {order_id} has no sub-order"),
            );
        };
        effects.send(Message::Agent {
            user_id: last.user_id.clone(),
            body: AgentBody::SubOrder {
                order_id: order_id.into(),
                seq: last.seq,
                event_id: event_id.into(),
                input_type: command.type_name(),
                command: sub_command,
                operator: operator_of(&command),
            },
        });
    }

    fn on_outcome(&mut self, order_id: &str, seq: u32, outcome: SubOutcome, effects: &mut Effects) {
        let Some(order) = self.orders.get_mut(order_id) else {
            return;
        };
        debug_assert!(order.sub_orders.iter().any(|sub| sub.seq == seq), "outcome of an unknown sub-order");
        let merchant = |body| Message::Merchant { merchant_id: order.merchant_id.clone(), body };
        match outcome {
            SubOutcome::UtrAdded { utr } => {
                order.utr.get_or_insert(utr);
            }
            SubOutcome::CollectionSucceeded { actual, utr } => {
                if order.utr.is_none() {
                    order.utr = utr;
                }
                effects.send(merchant(MerchantBody::CollectionCredit { order_id: order_id.into(), actual }));
                order.state = OrderState::Success;
                order.actual_amount = Some(actual);
                callback(order, CallbackStatus::Success, Some(actual), effects);
            }
            SubOutcome::CollectionCancelled => {
                order.state = OrderState::Cancelled;
                callback(order, CallbackStatus::Cancelled, None, effects);
            }
            SubOutcome::CollectionCorrected => {
                order.actual_amount = None;
                effects.send(merchant(MerchantBody::Clawback { order_id: order_id.into() }));
                order.state = OrderState::Cancelled;
                callback(order, CallbackStatus::Cancelled, None, effects);
            }
            SubOutcome::PayoutSucceeded { paid_total } => {
                effects.send(merchant(MerchantBody::PayoutSpent { order_id: order_id.into() }));
                order.state = OrderState::Success;
                order.actual_amount = Some(paid_total);
                callback(order, CallbackStatus::Success, Some(paid_total), effects);
            }
            SubOutcome::PayoutReturned => {
                order.state = OrderState::Pending;
                // R-EXP-1: a payout returning to pending after its expiry is cancelled.
                if order.expires_at.is_some_and(|expires_at| effects.now >= expires_at) {
                    cancel_pending(order, effects);
                }
            }
            SubOutcome::PayoutCancelled => {
                effects.send(merchant(MerchantBody::PayoutRefund { order_id: order_id.into() }));
                order.state = OrderState::Cancelled;
                callback(order, CallbackStatus::Cancelled, None, effects);
            }
        }
    }
}

enum Routing {
    Forward(SubOrderCommand),
    CancelPending,
}

fn invalid(order: &MainOrder, command: &Command) -> Rejection {
    Rejection::new(
        Reason::InvalidTransition,
        format!(
            "{} does not apply to {:?} order {} in state {:?}",
            command.type_name(),
            order.kind,
            order.order_id,
            order.state
        ),
    )
}

/// Decides what an order command means for this order (R-WAVE-2, R-CLOSE-3, R-POST-1, R-ADMIN-*).
fn order_command(order: &MainOrder, command: &Command) -> Result<Routing, Rejection> {
    use OrderKind::{Collection, Payout};
    use OrderState::{Cancelled, InProgress, Pending, Success};
    let no_live = || Rejection::new(Reason::NoLiveSubOrder, format!("order {} has no live sub-order", order.order_id));
    match command {
        Command::PaymentConfirmed(confirmed) => match order.state {
            InProgress if !order.dispatch_in_flight => Ok(Routing::Forward(SubOrderCommand::PaymentConfirmed {
                utr: confirmed.utr.clone().filter(|u| !u.is_empty()),
            })),
            _ => Err(no_live()),
        },
        Command::OrderCancelled(cancel) => match (order.kind, order.state) {
            (_, Pending) if !order.dispatch_in_flight => Ok(Routing::CancelPending),
            (Collection, InProgress) => Ok(Routing::Forward(SubOrderCommand::Cancel { by: cancel.by })),
            (Payout, InProgress) if cancel.by == crate::input::CancelledBy::User => {
                Ok(Routing::Forward(SubOrderCommand::Cancel { by: cancel.by }))
            }
            _ => Err(invalid(order, command)),
        },
        Command::SupplementRequested(supplement) => match (order.kind, order.state) {
            (Collection, Cancelled) if order.sub_orders.is_empty() => Err(no_live()),
            (Collection, Cancelled) => Ok(Routing::Forward(SubOrderCommand::Supplement {
                utr: supplement.utr.clone().filter(|u| !u.is_empty()),
            })),
            _ => Err(invalid(order, command)),
        },
        Command::CollectionRetry(_) => match (order.kind, order.state) {
            (Collection, Cancelled) if order.sub_orders.is_empty() => Err(no_live()),
            (Collection, Cancelled) => Ok(Routing::Forward(SubOrderCommand::Retry)),
            _ => Err(invalid(order, command)),
        },
        Command::AdminApprove(approve) => {
            let amount = match (&approve.amount, order.kind) {
                (None, _) => None,
                (Some(_), Payout) => {
                    return Err(Rejection::new(Reason::InvalidAmount, "`amount` applies only to collections"))
                }
                (Some(text), Collection) => Some(positive_amount(text, "amount")?),
            };
            if order.sub_orders.is_empty() {
                return Err(no_live());
            }
            Ok(Routing::Forward(SubOrderCommand::Approve { amount }))
        }
        Command::AdminReject(_) if order.sub_orders.is_empty() => Err(no_live()),
        Command::AdminReject(_) => Ok(Routing::Forward(SubOrderCommand::Reject)),
        Command::AdminCrawlRetry(_) => match order.state {
            _ if order.sub_orders.is_empty() => Err(no_live()),
            InProgress | Cancelled if order.kind == Collection || order.state == InProgress => {
                Ok(Routing::Forward(SubOrderCommand::CrawlRetry))
            }
            _ => Err(invalid(order, command)),
        },
        Command::AdminCorrectCancel(_) => match (order.kind, order.state) {
            (Collection, Success) => Ok(Routing::Forward(SubOrderCommand::CorrectCancel)),
            _ => Err(invalid(order, command)),
        },
        Command::AdminCancelPayout(_) => match (order.kind, order.state) {
            (Payout, Pending) if !order.dispatch_in_flight => Ok(Routing::CancelPending),
            (Payout, InProgress) => Ok(Routing::Forward(SubOrderCommand::CancelPayout)),
            _ => Err(invalid(order, command)),
        },
        _ => Err(invalid(order, command)),
    }
}

/// A pending order cancelled by the merchant, an operator or its expiry (R-CLOSE-3, R-EXP-1, R-ADMIN-4).
fn cancel_pending(order: &mut MainOrder, effects: &mut Effects) {
    debug_assert_eq!(order.state, OrderState::Pending);
    order.state = OrderState::Cancelled;
    if order.kind == OrderKind::Payout {
        effects.send(Message::Merchant {
            merchant_id: order.merchant_id.clone(),
            body: MerchantBody::PayoutRefund { order_id: order.order_id.clone() },
        });
    }
    callback(order, CallbackStatus::Cancelled, None, effects);
}

fn callback(order: &mut MainOrder, status: CallbackStatus, actual_amount: Option<Money>, effects: &mut Effects) {
    order.callbacks_sent += 1;
    effects.emit(OutputBody::MerchantCallback {
        callback_id: crate::numbered(&order.order_id, ':', u64::from(order.callbacks_sent)),
        merchant_id: order.merchant_id.clone(),
        order_id: order.order_id.clone(),
        kind: order.kind,
        status,
        amount: order.amount,
        actual_amount,
        utr: order.utr.clone(),
    });
}

/// The operator named by an operator command (R-AUDIT-1 records it with the decision).
fn operator_of(command: &Command) -> Option<Text> {
    match command {
        Command::AdminApprove(c) => Some(c.operator.clone()),
        Command::AdminReject(c) => Some(c.operator.clone()),
        Command::AdminCrawlRetry(c) => Some(c.operator.clone()),
        Command::AdminCorrectCancel(c) => Some(c.operator.clone()),
        Command::AdminCancelPayout(c) => Some(c.operator.clone()),
        _ => None,
    }
}
