//! What a sub-order's end moves: success (R-MATCH-*, R-MER-5, R-POST-2, R-ADMIN-1), closes and
//! rejections (R-CLOSE-*, R-WAVE-2, R-ADMIN-1, R-ADMIN-3), and the end of a revival (R-POST-1).

use super::state::Agent;
use super::state::{EntryKind, Evidence, Flag, HoldState, MatchRecord, SubState};
use super::{AgentTimer, Context};
use crate::input::Provider;
use crate::money::Money;
use crate::output::{NotificationKind, OrderKind, OutputBody};
use crate::stages::SubOutcome;
use crate::Text;

/// Flags whose condition a success resolves; the others stay as evidence (SPEC §4).
const RESOLVED_BY_SUCCESS: [Flag; 5] =
    [Flag::Ambiguous, Flag::AwaitReauth, Flag::BillPending, Flag::IfscUnverified, Flag::Underpaid];

impl Agent {
    /// Sends a notification when the agent has bound Telegram (SPEC §6).
    pub(crate) fn notify(&self, kind: NotificationKind, text: String, context: &mut Context) {
        if self.telegram_bound {
            context.effects.emit(OutputBody::Notification {
                user_id: self.user_id.clone(),
                channel: "telegram",
                kind,
                text,
            });
        }
    }

    /// Frees a line reserved for a detail fetch that no longer matters (R-WIN-3).
    pub(crate) fn release_reservation(&mut self, sub: usize) {
        let Some(txn_id) = self.subs[sub].awaiting_detail.take() else {
            return;
        };
        let card_id = self.subs[sub].card_id.clone();
        if let Some(line) = self.cards.get_mut(&card_id).and_then(|card| card.bill.get_mut(&txn_id)) {
            if line.reserved_by == Some(sub) {
                line.reserved_by = None;
            }
        }
    }

    /// A collection ends without success: `payment_timeout` (R-CLOSE-1), `cancelled` (R-CLOSE-3,
    /// R-WAVE-2, R-REAUTH-1) or `rejected` (R-ADMIN-1). The hold is released, the order cancelled.
    pub(crate) fn close_collection(&mut self, sub: usize, state: SubState, rule: &'static str, context: &mut Context) {
        debug_assert_eq!(self.subs[sub].kind, OrderKind::Collection);
        let now = context.effects.now;
        self.release_reservation(sub);
        let record = &mut self.subs[sub];
        record.closed_at = Some(now);
        record.revived_from = None;
        record.lapses.clear();
        record.flags.remove(&Flag::Ambiguous);
        record.note(now, rule, "closed", Evidence::Ended { state, order_pending: false });
        let hold_id = record.hold_id;
        self.set_state(sub, state);
        if let Some(hold_id) = hold_id {
            if self.hold(hold_id).state == HoldState::Frozen {
                self.release(hold_id, context.effects);
            }
        }
        self.reply(sub, SubOutcome::CollectionCancelled, context);
    }

    /// A payout sub-order ends without success: the order waits for the next agent (R-MER-4).
    pub(crate) fn payout_returned(&mut self, sub: usize, state: SubState, rule: &'static str, context: &mut Context) {
        debug_assert_eq!(self.subs[sub].kind, OrderKind::Payout);
        let now = context.effects.now;
        self.release_reservation(sub);
        let record = &mut self.subs[sub];
        record.lapses.clear();
        record.note(now, rule, "ended", Evidence::Ended { state, order_pending: true });
        self.set_state(sub, state);
        self.reply(sub, SubOutcome::PayoutReturned, context);
    }

    /// A collection succeeds (R-MATCH-C*, R-ADMIN-1). A revived one is debited by R-DEBT-1 (R-POST-2).
    pub(crate) fn collection_success(
        &mut self,
        sub: usize,
        actual: Money,
        record_match: MatchRecord,
        utr: Option<Text>,
        context: &mut Context,
    ) {
        let now = context.effects.now;
        let record = &mut self.subs[sub];
        let revived = record.revived_from.take().is_some();
        for flag in RESOLVED_BY_SUCCESS {
            record.flags.remove(&flag);
        }
        record.lapses.clear();
        record.note(
            now,
            record_match.rule,
            "success",
            Evidence::Success { txn_ids: record_match.txn_ids.clone(), amount: actual },
        );
        record.matched = Some(record_match);
        let hold_id = record.hold_id;
        self.set_state(sub, SubState::Success);
        if let Some(hold_id) = hold_id {
            if revived {
                self.subs[sub].note(now, "R-POST-2", "supplement_debit", "deferred debit of a released hold");
                self.debit_released(hold_id, context.config.debt_sweep_interval_s, context.effects);
            } else {
                self.consume(hold_id, now);
            }
        }
        self.reply(sub, SubOutcome::CollectionSucceeded { actual, utr }, context);
    }

    /// A payout succeeds: the agent is credited `amount` (buy) then the reward (income) (R-MER-5).
    pub(crate) fn payout_success(&mut self, sub: usize, record_match: MatchRecord, context: &mut Context) {
        let now = context.effects.now;
        let record = &mut self.subs[sub];
        for flag in RESOLVED_BY_SUCCESS {
            record.flags.remove(&flag);
        }
        record.lapses.clear();
        record.note(
            now,
            record_match.rule,
            "success",
            Evidence::Success { txn_ids: record_match.txn_ids.clone(), amount: record.paid_total },
        );
        record.matched = Some(record_match);
        let amount = record.amount;
        let order_id = record.order_id.clone();
        let paid_total = if record.paid_total.is_zero() { amount } else { record.paid_total };
        self.set_state(sub, SubState::Success);
        let reward = amount.times_rate(context.config.payout_reward_rate).unwrap_or(Money::ZERO);
        self.credit(EntryKind::Buy, amount, Some(&order_id), now);
        self.credit(EntryKind::Income, reward, Some(&order_id), now);
        self.settle(context.effects);
        self.reply(sub, SubOutcome::PayoutSucceeded { paid_total }, context);
    }

    /// A revival that missed returns the sub-order to the state it came from (R-POST-1).
    /// `rule` and `event` say who ended it: a miss (R-POST-1 `revival_missed`) or an operator
    /// (R-ADMIN-1 `rejected`).
    pub(crate) fn end_revival(&mut self, sub: usize, rule: &'static str, event: &'static str, context: &mut Context) {
        let now = context.effects.now;
        let record = &mut self.subs[sub];
        let Some(previous) = record.revived_from.take() else {
            return;
        };
        record.flags.remove(&Flag::Revived);
        record.flags.remove(&Flag::AwaitReauth);
        record.flags.remove(&Flag::Ambiguous);
        record.lapses.clear();
        record.note(now, rule, event, format!("back to {previous:?}"));
        self.release_reservation(sub);
        self.set_state(sub, previous);
    }

    /// R-HIS-1: a check for a closed collection asked after `closed_at + window_slack` that found
    /// nothing exhausts the live history.
    pub(crate) fn mark_history_exhausted(
        &mut self,
        sub: usize,
        check_time: crate::time::Timestamp,
        context: &mut Context,
    ) {
        let slack = context.config.window_slack_s;
        let record = &mut self.subs[sub];
        if let Some(closed_at) = record.closed_at {
            if check_time > closed_at.plus_seconds(slack) && record.flags.insert(Flag::HisExhausted) {
                record.note(
                    context.effects.now,
                    "R-HIS-1",
                    "his_exhausted",
                    format!("check at {check_time} after closed_at {closed_at} + {slack}s"),
                );
            }
        }
    }

    /// R-WAVE-2's user-submission rule: the second wave found nothing.
    pub(crate) fn user_submission_missed(&mut self, sub: usize, context: &mut Context) {
        match self.subs[sub].kind {
            OrderKind::Collection => self.close_collection(sub, SubState::Cancelled, "R-WAVE-2", context),
            OrderKind::Payout => self.payout_returned(sub, SubState::Rejected, "R-WAVE-2", context),
        }
    }

    /// R-ADMIN-1 approval.
    pub(crate) fn approve(&mut self, sub: usize, amount: Option<Money>, context: &mut Context) {
        let record = &self.subs[sub];
        let mut utr_backfill = None;
        if record.kind == OrderKind::Collection && record.flags.contains(&Flag::Ambiguous) && !record.found {
            if let Some((txn_id, utr)) = self.take_ambiguous_candidate(sub, context) {
                let now = context.effects.now;
                let record = &mut self.subs[sub];
                record.note(now, "R-ADMIN-1", "line_taken", format!("txn {txn_id} of the ambiguous candidates"));
                record.paid_total = Money::ZERO;
                // As R-MATCH-C3 would: the order's UTR is back-filled from the line.
                if let Some(utr) = &utr {
                    if record.utrs.is_empty() {
                        record.utrs.push(utr.clone());
                    }
                }
                utr_backfill = utr;
                self.refresh_paid_total(sub);
            }
        }
        let record = &self.subs[sub];
        let record_match = MatchRecord {
            rule: "R-ADMIN-1",
            txn_ids: record.matched_txn_ids.clone(),
            explanation: Evidence::Text("approved by an operator"),
        };
        match record.kind {
            OrderKind::Collection => {
                let actual = amount.unwrap_or(record.amount);
                self.collection_success(sub, actual, record_match, utr_backfill, context);
            }
            OrderKind::Payout => self.payout_success(sub, record_match, context),
        }
    }

    /// R-ADMIN-1 rejection.
    pub(crate) fn operator_reject(&mut self, sub: usize, context: &mut Context) {
        let record = &self.subs[sub];
        match record.kind {
            OrderKind::Collection if record.revived_from.is_some() => {
                self.end_revival(sub, "R-ADMIN-1", "rejected", context)
            }
            OrderKind::Collection => {
                self.subs[sub].note(context.effects.now, "R-ADMIN-1", "rejected", "by an operator".to_string());
                self.close_collection(sub, SubState::Rejected, "R-ADMIN-1", context)
            }
            OrderKind::Payout => self.payout_returned(sub, SubState::Rejected, "R-ADMIN-1", context),
        }
    }

    /// R-ADMIN-3: a successful collection corrected to cancelled.
    pub(crate) fn correct_cancel(&mut self, sub: usize, context: &mut Context) {
        let Some(hold_id) = self.subs[sub].hold_id else {
            return;
        };
        let refund = self.refund_hold(hold_id, context.effects);
        let record = &mut self.subs[sub];
        record.note(context.effects.now, "R-ADMIN-3", "corrected", format!("refund {refund}"));
        // The success was a misjudgment: the sub-order is no longer `found` (a supplement may revive it
        // and match another line), its line stays used (R-WIN-3) and listed as evidence, and the
        // correction is its close (R-WIN-2).
        record.found = false;
        record.closed_at = Some(context.effects.now);
        // SPEC §4: `match` is the decision that made the sub-order succeed, else null.
        record.matched = None;
        self.set_state(sub, SubState::Cancelled);
        self.reply(sub, SubOutcome::CollectionCorrected, context);
    }

    /// R-PEND-2 / R-MATCH-P4 timeouts, by provider.
    pub(crate) fn bill_pending_timeout_s(&self, sub: usize, context: &Context) -> i64 {
        if self.provider_of(sub) == Provider::Freecharge {
            context.config.bill_pending_timeout_freecharge_s
        } else {
            context.config.bill_pending_timeout_s
        }
    }

    /// What a sub-order's matched lines say now, read once from its card's bill table (None: no card).
    fn matched_lines(&self, sub: usize) -> Option<MatchedLines> {
        use crate::input::LineStatus::{Errored, Failed, Processing, Success};
        let card = self.cards.get(&self.subs[sub].card_id)?;
        let mut summary = MatchedLines { failed: false, processing: false, paid: Money::ZERO };
        for line in self.subs[sub].matched_txn_ids.iter().filter_map(|txn_id| card.bill.get(txn_id)) {
            summary.failed |= matches!(line.line.status, Failed | Errored);
            summary.processing |= line.line.status == Processing;
            if line.line.status == Success {
                summary.paid = summary.paid.plus(line.line.amount);
            }
        }
        Some(summary)
    }

    /// SPEC §4: `paid_total` is the sum of the amounts of the matched lines whose status is `success`
    /// now (a line may change status after it was matched).
    pub(crate) fn refresh_paid_total(&mut self, sub: usize) {
        if let Some(lines) = self.matched_lines(sub) {
            self.subs[sub].paid_total = lines.paid;
        }
    }

    /// Decides a payout from its matched lines (R-MATCH-P1..P5, R-PEND-1): any failed line rejects,
    /// any processing line waits (`bill_pending`), else the paid total is compared with the amount.
    pub(crate) fn evaluate_payout(&mut self, sub: usize, context: &mut Context) {
        let now = context.effects.now;
        let Some(MatchedLines { failed, processing, paid: paid_total }) = self.matched_lines(sub) else {
            return;
        };
        let tolerance = context.config.amount_tolerance;
        if failed {
            self.subs[sub].note(now, "R-PEND-1", "line_failed", "a matched line failed".to_string());
            self.subs[sub].flags.remove(&Flag::BillPending);
            return self.payout_returned(sub, SubState::Rejected, "R-PEND-1", context);
        }
        if processing {
            self.subs[sub].paid_total = paid_total;
            let timeout = self.bill_pending_timeout_s(sub, context);
            let record = &mut self.subs[sub];
            record.found = true;
            if record.flags.insert(Flag::BillPending) {
                record.bill_pending_since = Some(now);
                record.note(
                    now,
                    "R-MATCH-P5",
                    "bill_pending",
                    format!("txns {:?} still processing", record.matched_txn_ids),
                );
                context.effects.schedule(now.plus_seconds(timeout), self.timer(AgentTimer::BillPendingTimeout { sub }));
            }
            self.set_state(sub, SubState::Reviewing);
            return;
        }
        let previous_paid = self.subs[sub].paid_total;
        let record = &mut self.subs[sub];
        record.paid_total = paid_total;
        if record.flags.remove(&Flag::BillPending) {
            record.note(now, "R-PEND-1", "line_settled", Evidence::Text("matched lines no longer processing"));
        }
        record.found = true;
        let amount = record.amount;
        if amount.minus(paid_total) <= tolerance {
            let rule = if record.flags.contains(&Flag::Underpaid) {
                "R-MATCH-P4"
            } else if paid_total.minus(amount) > tolerance {
                "R-MATCH-P3"
            } else if record.utrs.is_empty() {
                "R-MATCH-P2"
            } else {
                "R-MATCH-P1"
            };
            let record_match = MatchRecord {
                rule,
                txn_ids: record.matched_txn_ids.clone(),
                explanation: Evidence::Paid { paid: paid_total, amount },
            };
            return self.payout_success(sub, record_match, context);
        }
        // R-MATCH-P4: under-paid; each rise that stays short notifies again.
        let shortfall = amount.minus(paid_total);
        let newly_underpaid = record.flags.insert(Flag::Underpaid);
        if newly_underpaid {
            record.underpaid_since = Some(now);
            let due = now.plus_seconds(context.config.underpaid_timeout_s);
            context.effects.schedule(due, self.timer(AgentTimer::UnderpaidTimeout { sub }));
        }
        let record = &mut self.subs[sub];
        record.note(now, "R-MATCH-P4", "underpaid", format!("paid {paid_total} of {amount}, short {shortfall}"));
        let order_id = record.order_id.clone();
        self.set_state(sub, SubState::Reviewing);
        if newly_underpaid || paid_total > previous_paid {
            self.notify(
                NotificationKind::Underpaid,
                format!("Payout {order_id}: paid {paid_total} of {amount}; please pay the remaining {shortfall}."),
                context,
            );
        }
    }
}

/// A sub-order's matched lines as its payout rules read them (R-MATCH-P1..P5, R-PEND-1).
struct MatchedLines {
    /// A line failed or went ERRORED.
    failed: bool,
    /// A line is still processing.
    processing: bool,
    /// The amounts of the lines that succeeded (SPEC §4 `paid_total`).
    paid: Money,
}
