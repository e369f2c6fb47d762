//! An agent's money: holds (R-DSP-1, R-DSP-2), the journal (R-JRN-1..3) and deferred debits
//! (R-DEBT-1..3). Every change of `available` but a freeze or release writes a journal entry whose
//! `before` is the previous entry's `after`.

use super::state::{Agent, DebtBatch, EntryKind, Hold, HoldState, JournalEntry};
use super::AgentTimer;
use crate::money::Money;
use crate::stages::{Effects, Timer};
use crate::time::Timestamp;
use crate::Text;

impl Agent {
    /// Runs `change` and journals it when `amount` is not zero (R-JRN-1, R-JRN-2).
    fn journaled(
        &mut self,
        kind: EntryKind,
        amount: Money,
        order_id: Option<&str>,
        at: Timestamp,
        change: impl FnOnce(&mut Agent),
    ) {
        let before = self.balances();
        change(self);
        self.assert_balances();
        if amount.is_zero() {
            return;
        }
        let after = self.balances();
        self.journal.push(JournalEntry {
            seq: self.journal.len() as u64 + 1,
            at,
            kind,
            amount,
            order_id: order_id.map(Text::from),
            before,
            after,
        });
    }

    /// R-BAL-1: `available` never goes below zero; cached totals match the holds.
    pub fn assert_balances(&self) {
        assert!(!self.available.is_negative(), "R-BAL-1: available of {} is negative", self.user_id);
        assert!(!self.frozen.is_negative() && !self.deferred.is_negative(), "negative hold totals");
    }

    /// Credits `available` (recharge, commission, adjustment, buy, income, correction refund).
    pub fn credit(&mut self, kind: EntryKind, amount: Money, order_id: Option<&str>, at: Timestamp) {
        let new_available = self.available.plus(amount);
        assert!(!new_available.is_negative(), "R-BAL-1: a debit larger than available was not refused");
        self.journaled(kind, amount, order_id, at, |agent| agent.available = new_available);
    }

    /// R-DSP-1: freezes a new hold; no journal entry (R-DSP-2).
    pub fn freeze(&mut self, order_id: &str, amount: Money) -> u32 {
        assert!(self.available >= amount, "R-DSP-1 checked the balance");
        let id = self.holds.len() as u32 + 1;
        self.available = self.available.minus(amount);
        self.frozen = self.frozen.plus(amount);
        self.holds.push(Hold {
            id,
            order_id: order_id.into(),
            amount,
            state: HoldState::Frozen,
            remaining: Money::ZERO,
            debt_batches: Vec::new(),
        });
        self.assert_balances();
        id
    }

    pub fn hold(&self, id: u32) -> &Hold {
        &self.holds[id as usize - 1]
    }

    fn hold_mut(&mut self, id: u32) -> &mut Hold {
        &mut self.holds[id as usize - 1]
    }

    /// A frozen hold returns to `available` (closed, cancelled, rejected); no journal entry (R-DSP-2).
    /// Settlement (R-DEBT-2) follows, as after every credit.
    pub fn release(&mut self, id: u32, effects: &mut Effects) {
        let hold = self.hold(id).clone();
        assert_eq!(hold.state, HoldState::Frozen, "only a frozen hold is released");
        self.frozen = self.frozen.minus(hold.amount);
        self.available = self.available.plus(hold.amount);
        self.hold_mut(id).state = HoldState::Released;
        self.assert_balances();
        self.settle(effects);
    }

    /// A normal collection success: `sell −amount`, frozen falls, available unchanged (R-JRN-1).
    pub fn consume(&mut self, id: u32, at: Timestamp) {
        let hold = self.hold(id).clone();
        assert_eq!(hold.state, HoldState::Frozen, "only a frozen hold is consumed");
        let order_id = hold.order_id.clone();
        self.journaled(EntryKind::Sell, hold.amount.negated(), Some(&order_id), at, |agent| {
            agent.frozen = agent.frozen.minus(hold.amount);
            agent.hold_mut(id).state = HoldState::Consumed;
        });
    }

    /// R-DEBT-1 / R-POST-2: the first batch of a supplement success on a released hold.
    pub fn debit_released(&mut self, id: u32, sweep_interval_s: i64, effects: &mut Effects) {
        let hold = self.hold(id).clone();
        assert_eq!(hold.state, HoldState::Released, "R-POST-2 debits a released hold");
        let due = hold.amount;
        let take = if self.available >= due { due } else { self.available.floor_hundreds() };
        let remaining = due.minus(take);
        let was_deferring = !self.deferred.is_zero();
        self.journaled(EntryKind::Sell, take.negated(), Some(&hold.order_id), effects.now, |agent| {
            agent.available = agent.available.minus(take);
            agent.deferred = agent.deferred.plus(remaining);
            let hold = agent.hold_mut(id);
            hold.remaining = remaining;
            hold.state = if remaining.is_zero() { HoldState::ConsumedAfterRelease } else { HoldState::Deferred };
            if take.is_positive() {
                hold.debt_batches.push(DebtBatch { at: effects.now, amount: take });
            }
        });
        if !was_deferring && !self.deferred.is_zero() {
            self.schedule_sweep(sweep_interval_s, effects);
        }
    }

    /// R-DEBT-2: deferred holds by ascending id take all their remaining if `available` covers it,
    /// else the largest multiple of 100; stop at the first hold that can take neither.
    pub fn settle(&mut self, effects: &mut Effects) {
        if self.deferred.is_zero() {
            return;
        }
        let deferred_ids: Vec<u32> =
            self.holds.iter().filter(|hold| hold.state == HoldState::Deferred).map(|hold| hold.id).collect();
        for id in deferred_ids {
            let hold = self.hold(id).clone();
            let take = if self.available >= hold.remaining { hold.remaining } else { self.available.floor_hundreds() };
            if take.is_zero() {
                break;
            }
            self.journaled(EntryKind::Sell, take.negated(), Some(&hold.order_id), effects.now, |agent| {
                agent.available = agent.available.minus(take);
                agent.deferred = agent.deferred.minus(take);
                let hold = agent.hold_mut(id);
                hold.remaining = hold.remaining.minus(take);
                hold.debt_batches.push(DebtBatch { at: effects.now, amount: take });
                if hold.remaining.is_zero() {
                    hold.state = HoldState::ConsumedAfterRelease;
                }
            });
        }
    }

    /// The sweep every `debt_sweep_interval` from the first deferral while `deferred > 0` (R-DEBT-2).
    pub fn schedule_sweep(&mut self, interval_s: i64, effects: &mut Effects) {
        if self.sweep_scheduled {
            return;
        }
        self.sweep_scheduled = true;
        let due = effects.now.plus_seconds(interval_s);
        effects.schedule(due, Timer::Agent { user_id: self.user_id.clone(), timer: AgentTimer::DebtSweep });
    }

    pub fn on_sweep(&mut self, interval_s: i64, effects: &mut Effects) {
        self.sweep_scheduled = false;
        self.settle(effects);
        if !self.deferred.is_zero() {
            self.schedule_sweep(interval_s, effects);
        }
    }

    /// R-ADMIN-3: gives back what a successful collection actually took; returns the refund.
    pub fn refund_hold(&mut self, id: u32, effects: &mut Effects) -> Money {
        let hold = self.hold(id).clone();
        let taken = match hold.state {
            HoldState::Consumed | HoldState::ConsumedAfterRelease => hold.amount,
            HoldState::Deferred => hold.amount.minus(hold.remaining),
            HoldState::Frozen | HoldState::Released => {
                unreachable!("R-ADMIN-3 applies only to a successful collection's hold")
            }
        };
        self.journaled(EntryKind::CorrectionRefund, taken, Some(&hold.order_id), effects.now, |agent| {
            agent.available = agent.available.plus(taken);
            agent.deferred = agent.deferred.minus(hold.remaining);
            let hold = agent.hold_mut(id);
            hold.remaining = Money::ZERO;
            hold.state = HoldState::Released;
        });
        self.settle(effects);
        taken
    }
}
