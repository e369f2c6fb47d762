//! The agent stage (SPEC §3), keyed by `user_id`: cards, sub-orders, holds, deferred debits, balance,
//! journal, bill table, checks, ERRORED counting, bans and notifications.
//!
//! - `state`: the data (SPEC §4).
//! - `ledger`: holds, journal and deferred debits (R-DSP-2, R-JRN-*, R-DEBT-*).
//! - `checks`: asking checks and applying their answers (R-CHK-*, R-WAVE-*, R-CLOSE-*, R-REAUTH-1,
//!   R-PEND-1, R-PAY-1).
//! - `matching`: the match rules (R-WIN-*, R-MATCH-*).
//! - `outcomes`: what a sub-order's success, close or rejection moves (R-MER-5, R-POST-2, R-ADMIN-*).
//! - `errored`: ERRORED floods and bans (R-ERR-1, R-ERR-2).

mod checks;
mod errored;
mod ledger;
mod matching;
mod outcomes;
pub mod state;

use self::state::*;
use super::{
    non_negative_amount, positive_amount, AgentBody, DispatchRequest, Effects, Message, OrderBody, SubOrderCommand,
    SubOutcome, Timer,
};
use crate::config::Config;
use crate::input::{Command, Provider};
use crate::money::Money;
use crate::output::{OrderKind, Reason, Rejection};
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Timers the agent stage sets. `sub` is the agent-local index of a sub-order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentTimer {
    /// R-WAVE-1 automatic check.
    CollectionWave { sub: usize },
    /// R-WAVE-1 close check.
    Close { sub: usize },
    /// R-WAVE-2 waves of one confirmation.
    ConfirmWave { sub: usize, generation: u32, second: bool },
    /// R-PAY-1 final check.
    PayTimeout { sub: usize },
    /// R-MATCH-P4.
    UnderpaidTimeout { sub: usize },
    /// R-PEND-2.
    BillPendingTimeout { sub: usize },
    /// R-MATCH-P1 detail retry.
    DetailRetry { sub: usize },
    /// R-CHK-1: no answer within `crawl_timeout` counts as busy.
    CrawlTimeout { card_id: Text, request_id: Text },
    /// R-CHK-3: a busy check is asked again.
    CrawlRetry { card_id: Text, generation: u32 },
    /// R-PEND-1.
    Reservoir { card_id: Text },
    /// R-DEBT-2.
    DebtSweep,
}

/// A snapshot leaves the configuration out: the runtime passes it to `StagePartition::restore`.
#[derive(Debug, Serialize, Deserialize)]
pub struct AgentStage {
    #[serde(skip)]
    pub config: Config,
    pub agents: crate::keyed::KeyedMap<Agent>,
    /// A card id belongs to one agent forever (SPEC §4). In a partitioned deployment this index is
    /// its own card-keyed partition; here it sits beside the agents it guards.
    #[serde(with = "crate::snapshot::sorted_map")]
    pub card_owner: HashMap<Text, Text>,
}

/// The context every agent handler works in.
pub(crate) struct Context<'a> {
    pub config: &'a Config,
    pub effects: &'a mut Effects,
}

impl AgentStage {
    pub fn new(config: Config) -> AgentStage {
        AgentStage { config, agents: crate::keyed::KeyedMap::new(), card_owner: HashMap::default() }
    }

    pub fn handle(&mut self, user_id: &str, body: AgentBody, effects: &mut Effects) {
        match body {
            AgentBody::Input { event_id, command } => {
                let input_type = command.type_name();
                if let Err(rejection) = self.on_input(user_id, command, effects) {
                    effects.reject(&event_id, input_type, rejection);
                }
            }
            AgentBody::Dispatch(request) => {
                let order_id = request.order_id.clone();
                let body = match self.dispatch(user_id, request, effects) {
                    Ok((seq, card_id)) => OrderBody::DispatchAccepted { seq, user_id: user_id.into(), card_id },
                    Err(reason) => OrderBody::DispatchRefused { user_id: user_id.into(), reason },
                };
                effects.send(Message::Order { order_id, body });
            }
            AgentBody::SubOrder { order_id, seq, event_id, input_type, command, operator } => {
                let mut context = Context { config: &self.config, effects };
                let result = match self.agents.get_mut(user_id) {
                    Some(agent) => match agent.sub_index.get(&(order_id.clone(), seq)).copied() {
                        Some(sub) => {
                            let recorded = agent.subs[sub].timeline.recorded();
                            let result = agent.on_sub_order_command(sub, command, &mut context);
                            if let (Ok(()), Some(operator)) = (&result, operator) {
                                agent.subs[sub].timeline.attribute_since(recorded, operator);
                            }
                            result
                        }
                        None => Err(Rejection::new(Reason::NoLiveSubOrder, "no such sub-order")),
                    },
                    None => Err(Rejection::new(Reason::UnknownUser, format!("no user {user_id}"))),
                };
                if let Err(rejection) = result {
                    effects.reject(&event_id, input_type, rejection);
                }
            }
        }
    }

    /// The simulated provider's answer to `request` as the `crawl_result` input `event_id`, its page
    /// lines borrowed from the provider (replay): the same handling as that input, without copying the
    /// lines the bill table already holds.
    pub fn on_provider_answer(
        &mut self,
        event_id: &str,
        request: &crate::output::CrawlRequested,
        view: crate::wallet_sim::View<'_>,
        effects: &mut Effects,
    ) {
        let Some(agent) = self.agents.get_mut(&request.user_id) else {
            let rejection = Rejection::new(Reason::UnknownUser, format!("no user {}", request.user_id));
            return effects.reject(event_id, "crawl_result", rejection);
        };
        let mut context = Context { config: &self.config, effects };
        let detail;
        let (ok, error, lines, next_from) = match view {
            crate::wallet_sim::View::Page { lines, next_from } => (true, None, lines, next_from),
            crate::wallet_sim::View::Detail(line) => {
                detail = line;
                (true, None, vec![&detail], None)
            }
            crate::wallet_sim::View::Error(error) => (false, Some(error), Vec::new(), None),
        };
        let header =
            checks::AnswerHeader { request_id: &request.request_id, card_id: &request.card_id, ok, error, next_from };
        let lines = lines.into_iter().map(std::borrow::Cow::Borrowed);
        if let Err(rejection) = agent.on_crawl_answer(header, lines, &mut context) {
            context.effects.reject(event_id, "crawl_result", rejection);
        }
    }

    pub fn on_timer(&mut self, user_id: &str, timer: AgentTimer, effects: &mut Effects) {
        let Some(agent) = self.agents.get_mut(user_id) else {
            return;
        };
        let mut context = Context { config: &self.config, effects };
        agent.on_timer(timer, &mut context);
    }

    fn on_input(&mut self, user_id: &str, command: Command, effects: &mut Effects) -> Result<(), Rejection> {
        if let Command::UserRegistered(registered) = &command {
            // Re-registering only updates `telegram_bound` (SPEC §7 edge decisions).
            self.agents.get_or_insert_with(user_id, || Agent::new(user_id, registered.telegram_bound)).telegram_bound =
                registered.telegram_bound;
            return Ok(());
        }
        let Some(agent) = self.agents.get_mut(user_id) else {
            return Err(Rejection::new(Reason::UnknownUser, format!("no user {user_id}")));
        };
        let mut context = Context { config: &self.config, effects };
        match command {
            Command::CardBound(bound) => {
                if self.card_owner.contains_key(&bound.card_id) {
                    return Err(Rejection::new(
                        Reason::DuplicateCard,
                        format!("card {} is already bound", bound.card_id),
                    ));
                }
                if agent.cards.len() >= CARDS_PER_AGENT_MAX {
                    return Err(Rejection::new(
                        Reason::InvalidTransition,
                        format!("an agent binds at most {CARDS_PER_AGENT_MAX} cards"),
                    ));
                }
                self.card_owner.insert(bound.card_id.clone(), user_id.into());
                agent.bind_card(&bound, &mut context);
                Ok(())
            }
            Command::UserRecharge(recharge) => {
                let amount = positive_amount(&recharge.amount, "amount")?;
                let commission = non_negative_amount(&recharge.commission, "commission")?;
                // R-JRN-3: recharge then recharge_commission, then settlement (R-DEBT-2).
                agent.credit(EntryKind::Recharge, amount, None, context.effects.now);
                agent.credit(EntryKind::RechargeCommission, commission, None, context.effects.now);
                agent.settle(context.effects);
                Ok(())
            }
            Command::UserAdjustment(adjustment) => {
                let amount = Money::parse(&adjustment.amount)
                    .ok()
                    .filter(|amount| !amount.is_zero() && amount.abs() <= super::amount_max())
                    .ok_or_else(|| {
                        Rejection::new(Reason::InvalidAmount, "`amount` must be a non-zero 2-decimal amount")
                    })?;
                if agent.available.plus(amount).is_negative() {
                    return Err(Rejection::new(
                        Reason::InsufficientBalance,
                        "the adjustment would make available negative",
                    ));
                }
                agent.credit(EntryKind::Adjustment, amount, None, context.effects.now);
                if amount.is_positive() {
                    agent.settle(context.effects);
                }
                Ok(())
            }
            Command::CrawlResult(result) => agent.on_crawl_result(result, &mut context),
            Command::CardReauthenticated(reauth) => agent.on_reauthenticated(&reauth.card_id, &mut context),
            Command::AdminUnban(unban) => agent.unban(&unban.operator, context.effects.now),
            other => {
                Err(Rejection::new(Reason::InvalidTransition, format!("{} is not an agent input", other.type_name())))
            }
        }
    }

    /// R-DSP-1 / R-PAY-2, checks in the rule's order.
    fn dispatch(
        &mut self,
        user_id: &str,
        request: DispatchRequest,
        effects: &mut Effects,
    ) -> Result<(u32, Text), Reason> {
        let agent = self.agents.get_mut(user_id).ok_or(Reason::UnknownUser)?;
        let card = agent.cards.get(&request.card_id).ok_or(Reason::UnknownCard)?;
        if let Some(problem) = request.order_problem {
            return Err(problem);
        }
        if agent.status == AgentStatus::Banned {
            return Err(Reason::UserBanned);
        }
        let collection = request.kind == OrderKind::Collection;
        if collection && !agent.deferred.is_zero() {
            return Err(Reason::DeferredDebt);
        }
        if card.auth == CardAuth::Unauthenticated {
            return Err(Reason::CardUnauthenticated);
        }
        if collection && agent.available < request.amount {
            return Err(Reason::InsufficientBalance);
        }
        let mut context = Context { config: &self.config, effects };
        let card_id = request.card_id.clone();
        let seq = request.seq;
        agent.start_sub_order(request, &mut context);
        Ok((seq, card_id))
    }
}

impl Agent {
    fn bind_card(&mut self, bound: &crate::input::CardBound, context: &mut Context) {
        self.cards.insert(
            bound.card_id.clone(),
            Card {
                card_id: bound.card_id.clone(),
                provider: bound.provider,
                auth: CardAuth::Authenticated,
                account_last4: bound.account_last4.clone(),
                vpa: bound.vpa.clone(),
                reauth_notified: false,
                requests_made: 0,
                requests: Default::default(),
                check: CheckState::default(),
                bill: BillTable::default(),
                live_subs: BTreeSet::new(),
            },
        );
        // R-PEND-1: the first reservoir sync one interval after binding.
        let due = context.effects.now.plus_seconds(context.config.reservoir_interval_s);
        context.effects.schedule(
            due,
            Timer::Agent {
                user_id: self.user_id.clone(),
                timer: AgentTimer::Reservoir { card_id: bound.card_id.clone() },
            },
        );
    }

    fn unban(&mut self, operator: &str, at: crate::time::Timestamp) -> Result<(), Rejection> {
        if self.status != AgentStatus::Banned {
            return Err(Rejection::new(Reason::InvalidTransition, format!("user {} is not banned", self.user_id)));
        }
        // R-ERR-2: only an operator lifts a ban; lines before it no longer count.
        self.status = AgentStatus::Active;
        self.status_history.push(StatusChange {
            at,
            from: AgentStatus::Banned,
            to: AgentStatus::Active,
            operator: operator.into(),
            reason: "admin_unban".into(),
        });
        self.last_unban_at = Some(at);
        Ok(())
    }

    pub(crate) fn timer(&self, timer: AgentTimer) -> Timer {
        Timer::Agent { user_id: self.user_id.clone(), timer }
    }

    /// An accepted dispatch or grab: hold, sub-order, waves and close (R-DSP-1, R-PAY-2, R-WAVE-1, R-PAY-1).
    fn start_sub_order(&mut self, request: DispatchRequest, context: &mut Context) {
        let now = context.effects.now;
        let config = context.config;
        let index = self.subs.len();
        let (hold_id, close_at) = match request.kind {
            OrderKind::Collection => {
                let close_after = now.plus_seconds(config.collection_close_after_s);
                let close_at = request.expires_at.map_or(close_after, |expires_at| close_after.min(expires_at));
                (Some(self.freeze(&request.order_id, request.amount)), Some(close_at))
            }
            OrderKind::Payout => (None, None),
        };
        let mut sub = SubOrder {
            order_id: request.order_id.clone(),
            seq: request.seq,
            kind: request.kind,
            card_id: request.card_id.clone(),
            amount: request.amount,
            // The dispatch's own time, where its statement window starts (R-MATCH-P1, R-MATCH-C1), even
            // if the agent's clock is past it: in a partitioned run an agent partition may have applied
            // later records before a lagging order partition's dispatch reached it (replay: the same).
            created_at: context.effects.cause_at.min(now),
            close_at,
            payee: request.payee,
            state: SubState::Paying,
            flags: BTreeSet::new(),
            utrs: request.utr.into_iter().collect(),
            matched_txn_ids: Vec::new(),
            paid_total: Money::ZERO,
            matched: None,
            found: false,
            hold_id,
            closed_at: None,
            revived_from: None,
            confirm_generation: 0,
            matched_since_confirmation: false,
            second_wave_passed: false,
            lapses: BTreeSet::new(),
            ifsc_mismatch: BTreeSet::new(),
            ifsc_verified: BTreeSet::new(),
            awaiting_detail: None,
            underpaid_since: None,
            bill_pending_since: None,
            timeline: Timeline::default(),
        };
        match request.kind {
            OrderKind::Collection => {
                let close_at = close_at.unwrap_or(now);
                sub.note(
                    now,
                    "R-DSP-1",
                    "dispatched",
                    Evidence::Dispatched {
                        card_id: request.card_id.clone(),
                        amount: request.amount,
                        hold: hold_id.unwrap_or_default(),
                        close_at,
                    },
                );
                for wave in &config.collection_waves_s {
                    let due = now.plus_seconds(*wave);
                    if due < close_at {
                        context.effects.schedule(due, self.timer(AgentTimer::CollectionWave { sub: index }));
                    }
                }
                context.effects.schedule(close_at, self.timer(AgentTimer::Close { sub: index }));
            }
            OrderKind::Payout => {
                sub.note(now, "R-PAY-2", "grabbed", Evidence::Grabbed { card_id: request.card_id.clone() });
                let due = now.plus_seconds(config.payout_pay_timeout_s);
                context.effects.schedule(due, self.timer(AgentTimer::PayTimeout { sub: index }));
            }
        }
        self.sub_index.insert((request.order_id, request.seq), index);
        self.subs.push(sub);
        self.final_subs.set(index, false);
        if let Some(card) = self.cards.get_mut(&request.card_id) {
            card.live_subs.insert(index);
        }
    }

    /// Moves a sub-order to `state`, keeping the card's live set in step.
    pub(crate) fn set_state(&mut self, sub: usize, state: SubState) {
        let card_id = self.subs[sub].card_id.clone();
        self.subs[sub].state = state;
        self.final_subs.set(sub, !state.is_live());
        if let Some(card) = self.cards.get_mut(&card_id) {
            if state.is_live() {
                card.live_subs.insert(sub);
            } else {
                card.live_subs.remove(&sub);
            }
        }
    }

    pub(crate) fn provider_of(&self, sub: usize) -> Provider {
        self.cards.get(&self.subs[sub].card_id).map_or(Provider::Other, |card| card.provider)
    }

    pub(crate) fn card_authenticated(&self, card_id: &str) -> bool {
        self.cards.get(card_id).is_some_and(|card| card.auth == CardAuth::Authenticated)
    }

    pub(crate) fn reply(&self, sub: usize, outcome: SubOutcome, context: &mut Context) {
        let sub = &self.subs[sub];
        context.effects.send(Message::Order {
            order_id: sub.order_id.clone(),
            body: OrderBody::Outcome { seq: sub.seq, outcome },
        });
    }

    fn on_sub_order_command(
        &mut self,
        sub: usize,
        command: SubOrderCommand,
        context: &mut Context,
    ) -> Result<(), Rejection> {
        let now = context.effects.now;
        let state = self.subs[sub].state;
        let kind = self.subs[sub].kind;
        let invalid = || Rejection::new(Reason::InvalidTransition, format!("the sub-order is {state:?}"));
        match command {
            SubOrderCommand::PaymentConfirmed { utr } => {
                if !state.is_live() {
                    return Err(Rejection::new(Reason::NoLiveSubOrder, "the sub-order is final"));
                }
                self.confirm_payment(sub, utr, context);
                Ok(())
            }
            SubOrderCommand::Cancel { by } => match kind {
                OrderKind::Collection if self.subs[sub].found => {
                    Err(Rejection::new(Reason::LineFound, "a statement line was matched: an operator decides"))
                }
                OrderKind::Collection if state.is_live() => {
                    self.subs[sub].note(now, "R-CLOSE-3", "cancelled", format!("by {by:?}"));
                    self.close_collection(sub, SubState::Cancelled, "R-CLOSE-3", context);
                    Ok(())
                }
                OrderKind::Payout if state == SubState::Paying => {
                    self.subs[sub].note(now, "R-CLOSE-3", "abandoned", "agent cancelled the grab".to_string());
                    self.set_state(sub, SubState::Cancelled);
                    self.reply(sub, SubOutcome::PayoutReturned, context);
                    Ok(())
                }
                _ => Err(invalid()),
            },
            SubOrderCommand::Supplement { utr } => self.revive(sub, utr, "R-POST-1", PurposeKind::Revival, context),
            SubOrderCommand::Retry => self.revive(sub, None, "R-POST-1", PurposeKind::Revival, context),
            SubOrderCommand::CrawlRetry => {
                if state == SubState::Reviewing {
                    self.subs[sub].note(now, "R-HIS-3", "operator_retry", "bill table, then a live check".to_string());
                    self.look_then_check(sub, PurposeKind::OperatorRetry, context);
                    Ok(())
                } else {
                    self.revive(sub, None, "R-HIS-3", PurposeKind::OperatorRetry, context)
                }
            }
            SubOrderCommand::Approve { amount } => {
                if state != SubState::Reviewing {
                    return Err(invalid());
                }
                self.approve(sub, amount, context);
                Ok(())
            }
            SubOrderCommand::Reject => {
                if state != SubState::Reviewing {
                    return Err(invalid());
                }
                self.operator_reject(sub, context);
                Ok(())
            }
            SubOrderCommand::CorrectCancel => {
                if state != SubState::Success || kind != OrderKind::Collection {
                    return Err(invalid());
                }
                self.correct_cancel(sub, context);
                Ok(())
            }
            SubOrderCommand::CancelPayout => {
                if self.subs[sub].found {
                    return Err(Rejection::new(
                        Reason::LineFound,
                        "a statement line was matched to the live sub-order",
                    ));
                }
                if state.is_live() {
                    self.subs[sub].note(now, "R-ADMIN-4", "rejected", "whole payout cancelled".to_string());
                    self.release_reservation(sub);
                    self.set_state(sub, SubState::Rejected);
                }
                self.reply(sub, SubOutcome::PayoutCancelled, context);
                Ok(())
            }
        }
    }

    /// R-WAVE-2.
    fn confirm_payment(&mut self, sub: usize, utr: Option<Text>, context: &mut Context) {
        let now = context.effects.now;
        let config = context.config;
        let record = &mut self.subs[sub];
        let underpaid = record.flags.contains(&Flag::Underpaid);
        if let Some(utr) = utr.clone() {
            if underpaid {
                if !record.utrs.contains(&utr) {
                    record.utrs.push(utr);
                }
            } else if !record.found {
                record.utrs = vec![utr];
            }
        }
        record.confirm_generation += 1;
        record.matched_since_confirmation = false;
        record.second_wave_passed = false;
        let generation = record.confirm_generation;
        record.note(now, "R-WAVE-2", "payment_confirmed", Evidence::Confirmed { utr: utr.clone() });
        if record.state == SubState::Paying {
            self.set_state(sub, SubState::Reviewing);
        }
        if let Some(utr) = utr {
            self.reply(sub, SubOutcome::UtrAdded { utr }, context);
        }
        let first = if self.provider_of(sub) == Provider::Freecharge {
            config.confirm_first_wave_freecharge_s
        } else {
            config.confirm_first_wave_s
        };
        for (offset, second) in [(first, false), (config.confirm_second_wave_s, true)] {
            let timer = self.timer(AgentTimer::ConfirmWave { sub, generation, second });
            context.effects.schedule(now.plus_seconds(offset), timer);
        }
    }

    /// R-POST-1 / R-HIS-3: revives a cancelled or timed-out collection into review.
    fn revive(
        &mut self,
        sub: usize,
        utr: Option<Text>,
        rule: &'static str,
        purpose: PurposeKind,
        context: &mut Context,
    ) -> Result<(), Rejection> {
        let record = &self.subs[sub];
        if record.kind != OrderKind::Collection
            || !matches!(record.state, SubState::Cancelled | SubState::PaymentTimeout)
        {
            return Err(Rejection::new(
                Reason::InvalidTransition,
                format!("only a cancelled or timed-out collection is revived; the sub-order is {:?}", record.state),
            ));
        }
        let now = context.effects.now;
        let previous = record.state;
        if let Some(utr) = utr {
            if !self.subs[sub].utrs.contains(&utr) {
                self.subs[sub].utrs.push(utr.clone());
            }
            self.reply(sub, SubOutcome::UtrAdded { utr }, context);
        }
        let record = &mut self.subs[sub];
        // Waves of an earlier confirmation belong to the state the sub-order left (R-TIMER-1).
        record.confirm_generation += 1;
        record.revived_from = Some(previous);
        record.flags.insert(Flag::Revived);
        record.note(now, rule, "revived", format!("from {previous:?}, utrs {:?}", record.utrs));
        self.set_state(sub, SubState::Reviewing);
        self.look_then_check(sub, purpose, context);
        Ok(())
    }
}
