//! The merchant stage (SPEC §3), keyed by `merchant_id`: `available`, `payout_reserve`, fees and the
//! merchant journal (R-MER-1..4, R-JRN-1). It accepts or refuses a payout's reservation.

use super::{non_negative_amount, positive_amount, Effects, MerchantBody, Message, OrderBody};
use crate::input::Command;
use crate::money::{Money, Rate};
use crate::output::{Reason, Rejection};
use crate::time::Timestamp;
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MerchantEntryKind {
    Deposit,
    CollectionCredit,
    CollectionClawback,
    PayoutReserve,
    PayoutSpent,
    PayoutRefund,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MerchantBalances {
    pub available: Money,
    pub payout_reserve: Money,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MerchantEntry {
    pub seq: u64,
    pub at: Timestamp,
    pub kind: MerchantEntryKind,
    pub available_change: Money,
    pub reserve_change: Money,
    pub order_id: Option<Text>,
    pub before: MerchantBalances,
    pub after: MerchantBalances,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Merchant {
    pub merchant_id: Text,
    pub collection_fee_rate: Rate,
    pub payout_fee_rate: Rate,
    pub payout_fee_fixed: Money,
    pub callback_url: Option<Text>,
    pub balances: MerchantBalances,
    pub journal: crate::segmented::Segmented<MerchantEntry>,
    /// Net credited per successful collection, for the claw-back of R-ADMIN-3.
    #[serde(with = "crate::snapshot::sorted_map")]
    pub collection_net: HashMap<Text, Money>,
    /// Payable reserved per open payout (R-MER-3), released by R-MER-4.
    #[serde(with = "crate::snapshot::sorted_map")]
    pub payout_payable: HashMap<Text, Money>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct MerchantStage {
    #[serde(with = "crate::snapshot::sorted_map")]
    pub merchants: HashMap<Text, Merchant>,
}

struct Fees {
    collection_fee_rate: Rate,
    payout_fee_rate: Rate,
    payout_fee_fixed: Money,
}

fn parse_fees(registered: &crate::input::MerchantRegistered) -> Result<Fees, Rejection> {
    let rate = |text: &str, field: &str| {
        Rate::parse(text).map_err(|error| Rejection::new(Reason::InvalidAmount, format!("`{field}`: {error}")))
    };
    let collection_fee_rate = rate(&registered.collection_fee_rate, "collection_fee_rate")?;
    if collection_fee_rate.above_one() {
        // A fee above the amount would make a collection debit the merchant (SPEC §4: available goes
        // negative only through claw-backs).
        return Err(Rejection::new(Reason::InvalidAmount, "`collection_fee_rate` must not exceed 1"));
    }
    Ok(Fees {
        collection_fee_rate,
        payout_fee_rate: rate(&registered.payout_fee_rate, "payout_fee_rate")?,
        payout_fee_fixed: non_negative_amount(&registered.payout_fee_fixed, "payout_fee_fixed")?,
    })
}

impl Merchant {
    /// Applies a movement and writes its journal entry (R-JRN-1); zero movements write nothing (R-JRN-2).
    fn post(
        &mut self,
        kind: MerchantEntryKind,
        available_change: Money,
        reserve_change: Money,
        order_id: Option<&str>,
        at: Timestamp,
    ) -> Result<(), crate::money::MoneyError> {
        if available_change.is_zero() && reserve_change.is_zero() {
            return Ok(());
        }
        let before = self.balances;
        let after = MerchantBalances {
            available: before.available.checked_add(available_change)?,
            payout_reserve: before.payout_reserve.checked_add(reserve_change)?,
        };
        assert!(!after.payout_reserve.is_negative(), "payout reserve went negative for {}", self.merchant_id);
        self.balances = after;
        self.journal.push(MerchantEntry {
            seq: self.journal.len() as u64 + 1,
            at,
            kind,
            available_change,
            reserve_change,
            order_id: order_id.map(Text::from),
            before,
            after,
        });
        Ok(())
    }
}

impl MerchantStage {
    pub fn handle(&mut self, merchant_id: &str, body: MerchantBody, effects: &mut Effects) {
        let result = match body {
            MerchantBody::Input { event_id, command } => {
                if let Err(rejection) = self.on_input(merchant_id, &command, effects.now) {
                    effects.reject(&event_id, command.type_name(), rejection);
                }
                Ok(())
            }
            MerchantBody::ValidateCollection { order_id, event_id } => {
                let body = if self.merchants.contains_key(merchant_id) {
                    OrderBody::CreationAccepted
                } else {
                    OrderBody::CreationRefused {
                        event_id,
                        input_type: "collection_created",
                        rejection: Rejection::new(Reason::UnknownMerchant, format!("no merchant {merchant_id}")),
                    }
                };
                effects.send(Message::Order { order_id, body });
                Ok(())
            }
            MerchantBody::ReservePayout { order_id, amount, event_id } => {
                let body = match self.reserve(merchant_id, &order_id, amount, effects.now) {
                    Ok(()) => OrderBody::CreationAccepted,
                    Err(rejection) => OrderBody::CreationRefused { event_id, input_type: "payout_created", rejection },
                };
                effects.send(Message::Order { order_id, body });
                Ok(())
            }
            MerchantBody::CollectionCredit { order_id, actual } => {
                self.credit(merchant_id, &order_id, actual, effects.now)
            }
            MerchantBody::Clawback { order_id } => self.clawback(merchant_id, &order_id, effects.now),
            MerchantBody::PayoutSpent { order_id } => self.settle_payout(merchant_id, &order_id, false, effects.now),
            MerchantBody::PayoutRefund { order_id } => self.settle_payout(merchant_id, &order_id, true, effects.now),
        };
        // Internal movements come from accepted orders whose amounts were validated; an overflow here
        // is a broken invariant, not bad input.
        if let Err(error) = result {
            panic!("merchant {merchant_id}: {error}");
        }
    }

    fn on_input(&mut self, merchant_id: &str, command: &Command, at: Timestamp) -> Result<(), Rejection> {
        match command {
            Command::MerchantRegistered(registered) => {
                let fees = parse_fees(registered)?;
                let merchant = self.merchants.entry(merchant_id.into()).or_insert_with(|| Merchant {
                    merchant_id: merchant_id.into(),
                    collection_fee_rate: Rate::zero(),
                    payout_fee_rate: Rate::zero(),
                    payout_fee_fixed: Money::ZERO,
                    callback_url: None,
                    balances: MerchantBalances { available: Money::ZERO, payout_reserve: Money::ZERO },
                    journal: Default::default(),
                    collection_net: HashMap::default(),
                    payout_payable: HashMap::default(),
                });
                merchant.collection_fee_rate = fees.collection_fee_rate;
                merchant.payout_fee_rate = fees.payout_fee_rate;
                merchant.payout_fee_fixed = fees.payout_fee_fixed;
                if registered.callback_url.is_some() {
                    merchant.callback_url = registered.callback_url.clone();
                }
                Ok(())
            }
            Command::MerchantDeposit(deposit) => {
                let amount = positive_amount(&deposit.amount, "amount")?;
                let merchant = self.known(merchant_id)?;
                merchant
                    .post(MerchantEntryKind::Deposit, amount, Money::ZERO, None, at)
                    .map_err(|error| Rejection::new(Reason::InvalidAmount, error.to_string()))
            }
            other => {
                Err(Rejection::new(Reason::InvalidTransition, format!("{} is not a merchant input", other.type_name())))
            }
        }
    }

    fn known(&mut self, merchant_id: &str) -> Result<&mut Merchant, Rejection> {
        self.merchants
            .get_mut(merchant_id)
            .ok_or_else(|| Rejection::new(Reason::UnknownMerchant, format!("no merchant {merchant_id}")))
    }

    /// R-MER-3.
    fn reserve(&mut self, merchant_id: &str, order_id: &str, amount: Money, at: Timestamp) -> Result<(), Rejection> {
        let merchant = self.known(merchant_id)?;
        let overflow = |error: crate::money::MoneyError| Rejection::new(Reason::InvalidAmount, error.to_string());
        let payable = amount
            .checked_add(amount.times_rate(merchant.payout_fee_rate).map_err(overflow)?)
            .and_then(|total| total.checked_add(merchant.payout_fee_fixed))
            .map_err(overflow)?;
        if merchant.balances.available < payable {
            return Err(Rejection::new(
                Reason::InsufficientMerchantBalance,
                format!("payable {payable} exceeds available {}", merchant.balances.available),
            ));
        }
        merchant
            .post(MerchantEntryKind::PayoutReserve, payable.negated(), payable, Some(order_id), at)
            .map_err(overflow)?;
        merchant.payout_payable.insert(order_id.into(), payable);
        Ok(())
    }

    /// R-MER-2.
    fn credit(
        &mut self,
        merchant_id: &str,
        order_id: &str,
        actual: Money,
        at: Timestamp,
    ) -> Result<(), crate::money::MoneyError> {
        let Some(merchant) = self.merchants.get_mut(merchant_id) else {
            return Ok(());
        };
        let fee = actual.times_rate(merchant.collection_fee_rate)?;
        let net = actual.checked_sub(fee)?;
        merchant.collection_net.insert(order_id.into(), net);
        merchant.post(MerchantEntryKind::CollectionCredit, net, Money::ZERO, Some(order_id), at)
    }

    /// R-ADMIN-3: takes back the net the collection credited.
    fn clawback(&mut self, merchant_id: &str, order_id: &str, at: Timestamp) -> Result<(), crate::money::MoneyError> {
        let Some(merchant) = self.merchants.get_mut(merchant_id) else {
            return Ok(());
        };
        let Some(net) = merchant.collection_net.remove(order_id) else {
            return Ok(());
        };
        merchant.post(MerchantEntryKind::CollectionClawback, net.negated(), Money::ZERO, Some(order_id), at)
    }

    /// R-MER-4: spend or refund the reserved payable, once.
    fn settle_payout(
        &mut self,
        merchant_id: &str,
        order_id: &str,
        refund: bool,
        at: Timestamp,
    ) -> Result<(), crate::money::MoneyError> {
        let Some(merchant) = self.merchants.get_mut(merchant_id) else {
            return Ok(());
        };
        let Some(payable) = merchant.payout_payable.remove(order_id) else {
            return Ok(());
        };
        if refund {
            merchant.post(MerchantEntryKind::PayoutRefund, payable, payable.negated(), Some(order_id), at)
        } else {
            merchant.post(MerchantEntryKind::PayoutSpent, Money::ZERO, payable.negated(), Some(order_id), at)
        }
    }
}
