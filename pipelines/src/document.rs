//! The final-state document of SPEC §9, materialised from the three stages (and what the API serves).

use crate::engine::Engine;
use crate::input::Provider;
use crate::money::Money;
use crate::output::{OrderKind, Output};
use crate::stages::agent::state::{
    Agent, Balances, CardAuth, DebtBatch, Flag, Hold, HoldState, JournalEntry, MatchRecord, StatusChange, SubState,
    TimelineEntry,
};
use crate::stages::merchant::{Merchant, MerchantEntry};
use crate::stages::order::{MainOrder, OrderState};
use crate::time::Timestamp;
use crate::Text;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Serialize)]
pub struct Document<'a> {
    pub clock: Timestamp,
    pub users: BTreeMap<&'a str, UserView<'a>>,
    pub merchants: BTreeMap<&'a str, MerchantView<'a>>,
    pub orders: BTreeMap<&'a str, OrderView<'a>>,
    pub outputs: &'a [Output],
}

#[derive(Debug, Serialize)]
pub struct CardView {
    pub provider: Provider,
    pub auth: CardAuth,
}

#[derive(Debug, Serialize)]
pub struct UserView<'a> {
    pub status: crate::stages::agent::state::AgentStatus,
    pub available: Money,
    pub frozen: Money,
    pub deferred: Money,
    pub reconciliation_total: Money,
    pub dispatch_eligible: bool,
    pub cards: BTreeMap<&'a str, CardView>,
    pub holds: &'a [Hold],
    pub journal: &'a crate::segmented::Segmented<JournalEntry>,
    pub status_history: &'a [StatusChange],
}

#[derive(Debug, Serialize)]
pub struct MerchantView<'a> {
    pub available: Money,
    pub payout_reserve: Money,
    pub journal: &'a crate::segmented::Segmented<MerchantEntry>,
}

#[derive(Debug, Serialize)]
pub struct SubOrderView<'a> {
    pub seq: u32,
    pub user_id: &'a str,
    pub card_id: &'a str,
    pub state: SubState,
    pub flags: Vec<Flag>,
    pub utrs: &'a [Text],
    pub matched_txn_ids: &'a [Text],
    pub paid_total: Money,
    #[serde(rename = "match")]
    pub matched: Option<&'a MatchRecord>,
    /// R-AUDIT-1: the decisions on this sub-order, with rule ids and evidence.
    pub timeline: Vec<&'a TimelineEntry>,
}

#[derive(Debug, Serialize)]
pub struct OrderView<'a> {
    pub kind: OrderKind,
    pub merchant_id: &'a str,
    pub amount: Money,
    pub state: OrderState,
    pub utr: Option<&'a str>,
    pub settled: bool,
    pub debt_batches: Vec<&'a DebtBatch>,
    pub sub_orders: Vec<SubOrderView<'a>>,
}

/// The user view of an agent.
pub fn user_view(agent: &Agent) -> UserView<'_> {
    let Balances { available, frozen, deferred } = agent.balances();
    UserView {
        status: agent.status,
        available,
        frozen,
        deferred,
        reconciliation_total: available.plus(frozen),
        dispatch_eligible: agent.dispatch_eligible(),
        cards: agent
            .cards
            .iter()
            .map(|(id, card)| (id.as_str(), CardView { provider: card.provider, auth: card.auth }))
            .collect(),
        holds: &agent.holds,
        journal: &agent.journal,
        status_history: &agent.status_history,
    }
}

/// The order view, joining the order stage's order with the agent stage's sub-orders and holds. `agent`
/// finds the agent that holds a sub-order (in one engine, or in whichever partition owns it).
pub fn order_view<'a>(order: &'a MainOrder, agent: impl Fn(&str) -> Option<&'a Agent>) -> OrderView<'a> {
    let mut sub_orders = Vec::with_capacity(order.sub_orders.len());
    let mut debt_batches = Vec::new();
    let mut settled = true;
    for reference in &order.sub_orders {
        let Some(part) =
            agent(&reference.user_id).and_then(|agent| sub_order_part(agent, &order.order_id, reference.seq))
        else {
            continue;
        };
        debt_batches.extend(part.debt_batches);
        settled &= part.settled;
        sub_orders.push(part.view);
    }
    OrderView {
        kind: order.kind,
        merchant_id: &order.merchant_id,
        amount: order.amount,
        state: order.state,
        utr: order.utr.as_deref(),
        settled,
        debt_batches,
        sub_orders,
    }
}

/// What one sub-order adds to its order's view: everything the agent stage holds about it. A read model
/// whose rows each belong to one stage partition keeps it as a row of its own and joins it to the
/// order's row when read (see [`order_view`], which joins them in memory).
#[derive(Debug, Serialize)]
pub struct SubOrderPart<'a> {
    pub view: SubOrderView<'a>,
    /// Its hold's deferred-debit batches (R-DEBT-2).
    pub debt_batches: Vec<&'a DebtBatch>,
    /// Whether its hold owes nothing deferred.
    pub settled: bool,
}

/// The part of order `order_id`'s view that sub-order `seq`, held by `agent`, contributes; None if the
/// agent holds no such sub-order.
pub fn sub_order_part<'a>(agent: &'a Agent, order_id: &str, seq: u32) -> Option<SubOrderPart<'a>> {
    let &index = agent.sub_index.get(&(order_id.into(), seq))?;
    let sub = &agent.subs[index];
    let (debt_batches, settled) = match sub.hold_id {
        Some(hold_id) => {
            let hold = agent.hold(hold_id);
            (hold.debt_batches.iter().collect(), hold.state != HoldState::Deferred)
        }
        None => (Vec::new(), true),
    };
    let view = SubOrderView {
        seq: sub.seq,
        user_id: &agent.user_id,
        card_id: &sub.card_id,
        state: sub.state,
        flags: sub.flags.iter().copied().collect(),
        utrs: &sub.utrs,
        matched_txn_ids: &sub.matched_txn_ids,
        paid_total: sub.paid_total,
        matched: sub.matched.as_ref(),
        timeline: sub.timeline.entries.iter().collect(),
    };
    Some(SubOrderPart { view, debt_batches, settled })
}

/// The merchant view.
pub fn merchant_view(merchant: &Merchant) -> MerchantView<'_> {
    MerchantView {
        available: merchant.balances.available,
        payout_reserve: merchant.balances.payout_reserve,
        journal: &merchant.journal,
    }
}

/// Whether an order is shown: one whose creation the merchant stage has not yet accepted is not.
pub fn order_is_shown(order: &MainOrder) -> bool {
    !order.creating
}

impl Engine {
    /// The SPEC §9 document of the current state.
    pub fn document(&self) -> Document<'_> {
        Document {
            clock: self.clock(),
            users: self.agents.agents.iter().map(|(id, agent)| (id.as_str(), user_view(agent))).collect(),
            merchants: self
                .merchants
                .merchants
                .iter()
                .map(|(id, merchant)| (id.as_str(), merchant_view(merchant)))
                .collect(),
            orders: self
                .orders
                .orders
                .iter()
                .filter(|(_, order)| order_is_shown(order))
                .map(|(id, order)| (id.as_str(), order_view(order, |user_id| self.agents.agents.get(user_id))))
                .collect(),
            outputs: self.outputs(),
        }
    }
}
