//! The API's first line of checks on a parsed input (R-IN-1): amounts, and the ids it names that must
//! or must not exist, read from materialised state. The stages still check everything (state may move
//! between this read and the append); this only keeps visibly bad input off the log.

use super::error::{ApiError, Entity};
use connectors::runtime::IngestionChecks;
use pipelines::input::{CardBound, Command, MerchantRegistered, Party};
use pipelines::money::{Money, Rate};
use pipelines::stages::{amount_max, non_negative_amount, positive_amount};
use pipelines::Text;
use rustc_hash::{FxHashMap, FxHashSet};

/// Materialised state plus the ids created by earlier events of the same request, so a bulk request
/// may register a merchant and create its orders together.
pub struct Known<'a> {
    /// One request's lookups (one read transaction in the embedded store).
    checks: Box<dyn IngestionChecks + 'a>,
    // Looked up several times per input of a bulk request: ids are held inline (no allocation for
    // ids up to 24 bytes) and hashed with Fx rather than SipHash.
    merchants: FxHashSet<Text>,
    users: FxHashSet<Text>,
    orders: FxHashSet<Text>,
    /// card id → the user it is bound to.
    cards: FxHashMap<Text, Text>,
}

impl<'a> Known<'a> {
    pub fn new(checks: Box<dyn IngestionChecks + 'a>) -> Known<'a> {
        Known {
            checks,
            merchants: FxHashSet::default(),
            users: FxHashSet::default(),
            orders: FxHashSet::default(),
            cards: FxHashMap::default(),
        }
    }

    // Ids found are remembered: merchants, users, orders and card bindings are never removed, so an id
    // a request's earlier input was checked against needs no second look.
    // Ids not found are not: a later input of the request may create them.

    /// Whether an input with this event id was appended before (a retry).
    pub fn appended_before(&self, event_id: &str) -> bool {
        self.checks.event_position(event_id).is_some()
    }

    fn has_merchant(&mut self, merchant_id: &str) -> bool {
        remember(&mut self.merchants, merchant_id, |id| self.checks.merchant_exists(id))
    }

    fn has_user(&mut self, user_id: &str) -> bool {
        remember(&mut self.users, user_id, |id| self.checks.user_exists(id))
    }

    fn has_order(&mut self, order_id: &str) -> bool {
        remember(&mut self.orders, order_id, |id| self.checks.order_merchant(id).is_some())
    }

    fn card_owner(&mut self, card_id: &str) -> Option<Text> {
        if let Some(owner) = self.cards.get(card_id) {
            return Some(owner.clone());
        }
        let owner = Text::from(self.checks.card_owner(card_id)?);
        self.cards.insert(card_id.into(), owner.clone());
        Some(owner)
    }

    /// Remembers the ids an accepted input creates, for the later inputs of the same request.
    pub fn record(&mut self, command: &Command) {
        match command {
            Command::MerchantRegistered(registered) => {
                self.merchants.insert(registered.merchant_id.clone());
            }
            Command::UserRegistered(registered) => {
                self.users.insert(registered.user_id.clone());
            }
            Command::CardBound(bound) => {
                self.cards.insert(bound.card_id.clone(), bound.user_id.clone());
            }
            Command::CollectionCreated(created) => {
                self.orders.insert(created.order_id.clone());
            }
            Command::PayoutCreated(created) => {
                self.orders.insert(created.order_id.clone());
            }
            _ => {}
        }
    }

    /// Amounts first (400), then ids that must exist (404), then conflicts with state (409).
    pub fn check(&mut self, command: &Command) -> Result<(), ApiError> {
        match command {
            Command::MerchantRegistered(registered) => fees(registered),
            Command::MerchantDeposit(deposit) => {
                positive(&deposit.amount, "amount")?;
                self.merchant_exists(&deposit.merchant_id)
            }
            // Re-registering a user updates `telegram_bound` (SPEC §7 edge decisions).
            Command::UserRegistered(_) | Command::Tick(_) => Ok(()),
            Command::CardBound(bound) => self.card_bindable(bound),
            Command::UserRecharge(recharge) => {
                positive(&recharge.amount, "amount")?;
                non_negative(&recharge.commission, "commission")?;
                self.user_exists(&recharge.user_id)
            }
            Command::UserAdjustment(adjustment) => {
                signed_non_zero(&adjustment.amount, "amount")?;
                self.user_exists(&adjustment.user_id)
            }
            Command::CollectionCreated(created) => {
                positive(&created.amount, "amount")?;
                self.merchant_exists(&created.merchant_id)?;
                self.order_absent(&created.order_id)
            }
            Command::PayoutCreated(created) => {
                positive(&created.amount, "amount")?;
                payee(&created.payee)?;
                self.merchant_exists(&created.merchant_id)?;
                self.order_absent(&created.order_id)
            }
            Command::CollectionDispatched(dispatch) => {
                self.assignment(&dispatch.order_id, &dispatch.user_id, &dispatch.card_id)
            }
            Command::PayoutGrabbed(grab) => self.assignment(&grab.order_id, &grab.user_id, &grab.card_id),
            Command::AdminApprove(approve) => {
                if let Some(amount) = &approve.amount {
                    positive(amount, "amount")?;
                }
                self.order_exists(&approve.order_id)
            }
            Command::CrawlResult(result) => self.user_card(&result.user_id, &result.card_id),
            Command::CardReauthenticated(reauth) => self.user_card(&reauth.user_id, &reauth.card_id),
            Command::AdminUnban(unban) => self.user_exists(&unban.user_id),
            Command::WalletLine(_) | Command::WalletLineStatus(_) | Command::WalletFault(_) => {
                Err(ApiError::TypeNotAccepted { type_name: command.type_name().to_string(), reason: "wallet event" })
            }
            Command::PaymentConfirmed(command) => self.order_exists(&command.order_id),
            Command::OrderCancelled(command) => self.order_exists(&command.order_id),
            Command::SupplementRequested(command) => self.order_exists(&command.order_id),
            Command::CollectionRetry(command) => self.order_exists(&command.order_id),
            Command::AdminReject(command) => self.order_exists(&command.order_id),
            Command::AdminCrawlRetry(command) => self.order_exists(&command.order_id),
            Command::AdminCorrectCancel(command) => self.order_exists(&command.order_id),
            Command::AdminCancelPayout(command) => self.order_exists(&command.order_id),
        }
    }

    fn merchant_exists(&mut self, merchant_id: &str) -> Result<(), ApiError> {
        require(self.has_merchant(merchant_id), Entity::Merchant, "merchant_id", merchant_id)
    }

    fn user_exists(&mut self, user_id: &str) -> Result<(), ApiError> {
        require(self.has_user(user_id), Entity::User, "user_id", user_id)
    }

    fn order_exists(&mut self, order_id: &str) -> Result<(), ApiError> {
        require(self.has_order(order_id), Entity::Order, "order_id", order_id)
    }

    /// Order ids are chosen by the merchant and name one order forever (SPEC §7 edge decisions).
    fn order_absent(&mut self, order_id: &str) -> Result<(), ApiError> {
        if !self.has_order(order_id) {
            return Ok(());
        }
        let message = format!("order `{order_id}` already exists");
        Err(ApiError::AlreadyExists { code: "order_exists", field: "order_id".to_string(), message })
    }

    /// R-DSP-1 / R-PAY-2 in their order: the order, the user, the card being the user's.
    fn assignment(&mut self, order_id: &str, user_id: &str, card_id: &str) -> Result<(), ApiError> {
        self.order_exists(order_id)?;
        self.user_card(user_id, card_id)
    }

    fn user_card(&mut self, user_id: &str, card_id: &str) -> Result<(), ApiError> {
        self.user_exists(user_id)?;
        match self.card_owner(card_id) {
            None => Err(unknown(Entity::Card, "card_id", card_id)),
            Some(owner) if owner == user_id => Ok(()),
            Some(_) => {
                let message = format!("card `{card_id}` is bound to another user");
                Err(ApiError::Conflict { code: "card_not_owned", field: "card_id".to_string(), message })
            }
        }
    }

    /// SPEC §4: a card id belongs to one agent forever, so binding it again is refused.
    fn card_bindable(&mut self, bound: &CardBound) -> Result<(), ApiError> {
        self.user_exists(&bound.user_id)?;
        if self.card_owner(&bound.card_id).is_none() {
            return Ok(());
        }
        let message = format!("card `{}` is already bound", bound.card_id);
        Err(ApiError::AlreadyExists { code: "card_already_bound", field: "card_id".to_string(), message })
    }
}

/// Whether `id` is in `found`, or `exists` says so now (then it is remembered).
fn remember(found: &mut FxHashSet<Text>, id: &str, exists: impl FnOnce(&str) -> bool) -> bool {
    if found.contains(id) {
        return true;
    }
    let exists = exists(id);
    if exists {
        found.insert(id.into());
    }
    exists
}

fn require(exists: bool, entity: Entity, field: &str, id: &str) -> Result<(), ApiError> {
    if exists {
        Ok(())
    } else {
        Err(unknown(entity, field, id))
    }
}

pub fn unknown(entity: Entity, field: &str, id: &str) -> ApiError {
    ApiError::Unknown { entity, field: field.to_string(), id: id.to_string() }
}

fn positive(text: &str, field: &str) -> Result<(), ApiError> {
    positive_amount(text, field)
        .map(drop)
        .map_err(|rejection| ApiError::InvalidAmount { field: field.to_string(), message: rejection.message })
}

fn non_negative(text: &str, field: &str) -> Result<(), ApiError> {
    non_negative_amount(text, field)
        .map(drop)
        .map_err(|rejection| ApiError::InvalidAmount { field: field.to_string(), message: rejection.message })
}

/// `user_adjustment.amount` is signed and never zero, bounded like every amount.
fn signed_non_zero(text: &str, field: &str) -> Result<(), ApiError> {
    match Money::parse(text) {
        Ok(amount) if !amount.is_zero() && amount.abs() <= amount_max() => Ok(()),
        Ok(_) => Err(invalid_amount(field, format!("`{field}` must be non-zero and at most {} in size", amount_max()))),
        Err(error) => Err(invalid_amount(field, format!("`{field}`: {error}"))),
    }
}

/// As the merchant stage parses them: rates non-negative decimals, the collection fee at most 1, the
/// fixed payout fee a non-negative amount.
fn fees(registered: &MerchantRegistered) -> Result<(), ApiError> {
    let rate = |text: &str, field: &str| {
        Rate::parse(text).map_err(|error| invalid_amount(field, format!("`{field}`: {error}")))
    };
    if rate(&registered.collection_fee_rate, "collection_fee_rate")?.above_one() {
        return Err(invalid_amount("collection_fee_rate", "`collection_fee_rate` must not exceed 1"));
    }
    rate(&registered.payout_fee_rate, "payout_fee_rate")?;
    non_negative(&registered.payout_fee_fixed, "payout_fee_fixed")
}

/// R-MATCH-P1 needs an identifier to compare with statement lines.
fn payee(payee: &Party) -> Result<(), ApiError> {
    if payee.account_last4.is_some() || payee.vpa.is_some() {
        Ok(())
    } else {
        Err(ApiError::InvalidPayee { message: "the payee needs `account_last4` or `vpa`".to_string() })
    }
}

fn invalid_amount(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidAmount { field: field.to_string(), message: message.into() }
}
