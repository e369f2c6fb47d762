//! The bill table (R-CHK-1 merge) and ERRORED floods (R-ERR-1, R-ERR-2).

use super::state::*;
use super::Context;
use crate::input::LineStatus;
use crate::output::{NotificationKind, OutputBody};
use crate::Text;

impl Agent {
    /// Merges fetched lines into the card's bill table; status updates of known lines overwrite.
    /// Returns the txn ids of matched lines whose status changed.
    pub(crate) fn merge(&mut self, card_id: &str, lines: Vec<Line>) -> Vec<Text> {
        let Some(card) = self.cards.get_mut(card_id) else {
            return Vec::new();
        };
        let mut changed = Vec::new();
        for line in lines {
            let errored_key = |time, txn: &str| (time, Text::from(card_id), Text::from(txn));
            if let Some(existing) = card.bill.get_mut(&line.txn_id) {
                if existing.line.status != line.status {
                    self.errored.remove(&errored_key(existing.line.time, &line.txn_id));
                    existing.line.status = line.status;
                    if line.status == LineStatus::Errored {
                        self.errored.insert(errored_key(existing.line.time, &line.txn_id));
                        note_new_errored(&mut self.errored_unchecked_from, existing.line.time);
                    }
                    if existing.used_by.is_some() {
                        changed.push(line.txn_id.clone());
                    }
                }
                if existing.line.utr.is_none() && line.utr.is_some() {
                    existing.line.utr = line.utr;
                }
                if line.payee_ifsc.is_some() {
                    existing.line.payee_ifsc = line.payee_ifsc;
                }
                continue;
            }
            if line.status == LineStatus::Errored {
                self.errored.insert(errored_key(line.time, &line.txn_id));
                note_new_errored(&mut self.errored_unchecked_from, line.time);
            }
            card.bill.insert(line);
        }
        // Bound the table: evict the oldest lines no sub-order uses or waits on.
        while card.bill.len() > BILL_LINES_PER_CARD_MAX {
            let Some((time, txn_id)) = card.bill.evict_oldest_unused() else { break };
            self.errored.remove(&(time, card_id.into(), txn_id));
        }
        changed
    }

    /// Matched lines whose status changed: a `bill_pending` payout resolves (R-PEND-1); a final
    /// sub-order only records it for an operator (R-AUDIT-1).
    pub(crate) fn resolve_changed_lines(&mut self, card_id: &str, changed: Vec<Text>, context: &mut Context) {
        for txn_id in changed {
            let Some(line) = self.cards.get(card_id).and_then(|card| card.bill.get(&txn_id)) else {
                continue;
            };
            let Some(sub) = line.used_by else { continue };
            let status = line.line.status;
            self.refresh_paid_total(sub);
            let record = &mut self.subs[sub];
            let live_payout = record.state.is_live() && record.kind == crate::output::OrderKind::Payout;
            if live_payout
                && record.found
                && record.flags.iter().any(|flag| matches!(flag, Flag::BillPending | Flag::Underpaid))
            {
                // R-PEND-1 / R-MATCH-P4: the payout is decided again from its lines' statuses.
                self.evaluate_payout(sub, context);
            } else if record.state.is_live() {
                record.note(
                    context.effects.now,
                    "R-AUDIT-1",
                    "line_status_changed",
                    format!("txn {txn_id} is now {status:?}"),
                );
            } else {
                record.note(
                    context.effects.now,
                    "R-AUDIT-1",
                    "line_status_changed",
                    format!("txn {txn_id} is now {status:?}; left to an operator"),
                );
            }
        }
    }

    /// R-ERR-1: more than `errored_max` ERRORED lines (all cards, since the last unban) in any half-open
    /// window of `errored_window` bans the agent permanently. Idempotent. Only windows that can hold a
    /// line added since the last count are scanned: every other window was counted before and held no
    /// more lines then (statuses only leave ERRORED, and an unban only excludes lines).
    pub(crate) fn count_errored(&mut self, context: &mut Context) {
        let Some(first_new) = self.errored_unchecked_from.take() else { return };
        if self.status == AgentStatus::Banned {
            return;
        }
        let width = context.config.errored_window_s;
        let scan_from = first_new.plus_seconds(-width);
        let since = self.last_unban_at;
        let lower = since.map_or(scan_from, |since| scan_from.max(since));
        let times: Vec<_> = self
            .errored
            .range((lower, Text::const_new(""), Text::const_new(""))..)
            .map(|(time, _, _)| *time)
            .filter(|time| since.is_none_or(|since| *time > since))
            .collect();
        let limit = context.config.errored_max as usize;
        if times.len() <= limit {
            return;
        }
        let mut end = 0;
        for start in 0..times.len() {
            let window_end = times[start].plus_seconds(width);
            end = end.max(start);
            while end < times.len() && times[end] < window_end {
                end += 1;
            }
            let count = end - start;
            if count > limit {
                return self.ban(count, times[start], window_end, context);
            }
        }
    }

    fn ban(&mut self, count: usize, start: crate::time::Timestamp, end: crate::time::Timestamp, context: &mut Context) {
        self.status = AgentStatus::Banned;
        self.status_history.push(StatusChange {
            at: context.effects.now,
            from: AgentStatus::Active,
            to: AgentStatus::Banned,
            operator: "system".into(),
            reason: format!("errored_flood count={count} window=[{start},{end})").into(),
        });
        context.effects.emit(OutputBody::SessionRevoked { user_id: self.user_id.clone() });
        self.notify(
            NotificationKind::Banned,
            format!(
                "Your account is banned: {count} ERRORED transactions within {}s.",
                context.config.errored_window_s
            ),
            context,
        );
    }
}

/// Remembers the earliest ERRORED line added since the last count (R-ERR-1).
fn note_new_errored(unchecked_from: &mut Option<crate::time::Timestamp>, time: crate::time::Timestamp) {
    *unchecked_from = Some(unchecked_from.map_or(time, |from| from.min(time)));
}
