//! Invariants of the whole engine state, checked by property tests after every event (and usable as a
//! runtime audit): R-BAL-1, hold totals, journal arithmetic, R-WIN-3, the merchant reserve against open
//! payouts, and the conservation of money across agents, merchants and the platform.

use crate::engine::Engine;
use crate::money::Money;
use crate::output::OrderKind;
use crate::stages::agent::state::{EntryKind, HoldState};
use crate::stages::merchant::MerchantEntryKind;
use crate::stages::order::OrderState;
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use rustc_hash::FxHashSet as HashSet;

/// The platform's books, derived from the journals and orders (not from the balances they check).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Books {
    /// Money that entered from outside: recharges, commissions, adjustments, merchant deposits.
    pub external_in: Money,
    /// Fees the platform keeps: collection fees of successful collections and payout fees of paid ones.
    pub fees: Money,
    /// Payout rewards paid to agents (R-MER-5).
    pub rewards: Money,
    /// Σ (actual − amount) over successful collections: what customers paid beyond the order amounts.
    pub collection_surplus: Money,
}

/// Checks every invariant; the error names the first one broken.
pub fn check(engine: &Engine) -> Result<Books, String> {
    let mut books = Books::default();
    let mut balances_total = Money::ZERO;
    for (user_id, agent) in &engine.agents.agents {
        let mut agent_sold: HashMap<Text, Money> = HashMap::default();
        if agent.available.is_negative() {
            return Err(format!("R-BAL-1: {user_id} available {}", agent.available));
        }
        let frozen =
            agent.holds.iter().filter(|h| h.state == HoldState::Frozen).fold(Money::ZERO, |s, h| s.plus(h.amount));
        let deferred =
            agent.holds.iter().filter(|h| h.state == HoldState::Deferred).fold(Money::ZERO, |s, h| s.plus(h.remaining));
        if frozen != agent.frozen || deferred != agent.deferred {
            return Err(format!(
                "{user_id}: frozen {} / deferred {} disagree with holds {frozen} / {deferred}",
                agent.frozen, agent.deferred
            ));
        }
        for hold in &agent.holds {
            if (hold.state == HoldState::Deferred) != hold.remaining.is_positive() {
                return Err(format!(
                    "{user_id}: hold {} is {:?} with remaining {}",
                    hold.id, hold.state, hold.remaining
                ));
            }
        }
        let mut journal_sum = Money::ZERO;
        for (index, entry) in agent.journal.iter().enumerate() {
            if entry.seq != index as u64 + 1 || entry.amount.is_zero() {
                return Err(format!("{user_id}: journal entry {index} has seq {} amount {}", entry.seq, entry.amount));
            }
            let moved =
                entry.after.available.plus(entry.after.frozen).minus(entry.before.available.plus(entry.before.frozen));
            if moved != entry.amount {
                return Err(format!("R-JRN-1: {user_id} entry {} of {} moved {moved}", entry.seq, entry.amount));
            }
            journal_sum = journal_sum.plus(entry.amount);
            match entry.kind {
                EntryKind::Recharge | EntryKind::RechargeCommission | EntryKind::Adjustment => {
                    books.external_in = books.external_in.plus(entry.amount)
                }
                EntryKind::Income => books.rewards = books.rewards.plus(entry.amount),
                EntryKind::Sell | EntryKind::CorrectionRefund => {
                    if let Some(order_id) = &entry.order_id {
                        let sold = agent_sold.entry(order_id.clone()).or_default();
                        *sold = sold.minus(entry.amount);
                    }
                }
                EntryKind::Buy => {}
            }
        }
        if journal_sum != agent.available.plus(agent.frozen) {
            return Err(format!(
                "{user_id}: available+frozen {} ≠ journal sum {journal_sum}",
                agent.available.plus(agent.frozen)
            ));
        }
        // What the agent was debited for each collection matches its hold (R-DEBT-1/2, R-ADMIN-3).
        for hold in &agent.holds {
            let sold = agent_sold.get(&hold.order_id).copied().unwrap_or(Money::ZERO);
            let expected = match hold.state {
                HoldState::Frozen | HoldState::Released => Money::ZERO,
                HoldState::Consumed | HoldState::ConsumedAfterRelease | HoldState::Deferred => {
                    hold.amount.minus(hold.remaining)
                }
            };
            if sold != expected {
                return Err(format!("{user_id}: hold {} ({:?}) sold {sold}, expected {expected}", hold.id, hold.state));
            }
        }
        balances_total = balances_total.plus(agent.available).plus(agent.frozen).minus(agent.deferred);
        // R-WIN-3: a line is matched to at most one sub-order, ever.
        let mut used: HashSet<(&str, &str)> = HashSet::default();
        for (index, sub) in agent.subs.iter().enumerate() {
            for txn_id in &sub.matched_txn_ids {
                if !used.insert((sub.card_id.as_str(), txn_id.as_str())) {
                    return Err(format!("R-WIN-3: {user_id} line {}/{txn_id} matched twice", sub.card_id));
                }
                let line = agent.cards.get(&sub.card_id).and_then(|card| card.bill.get(txn_id));
                if line.and_then(|line| line.used_by) != Some(index) {
                    return Err(format!("R-WIN-3: {user_id} line {txn_id} not marked as used by its sub-order"));
                }
            }
        }
    }
    let mut open_payables: HashMap<&str, Money> = HashMap::default();
    for (merchant_id, merchant) in &engine.merchants.merchants {
        let mut sum = Money::ZERO;
        for entry in &merchant.journal {
            sum = sum.plus(entry.available_change).plus(entry.reserve_change);
            match entry.kind {
                MerchantEntryKind::Deposit => books.external_in = books.external_in.plus(entry.available_change),
                MerchantEntryKind::PayoutSpent => {
                    let order = entry.order_id.as_ref().and_then(|id| engine.orders.orders.get(id));
                    let amount = order.map_or(Money::ZERO, |order| order.amount);
                    books.fees = books.fees.plus(entry.reserve_change.negated().minus(amount));
                }
                _ => {}
            }
        }
        let total = merchant.balances.available.plus(merchant.balances.payout_reserve);
        if sum != total {
            return Err(format!("{merchant_id}: balances {total} ≠ journal sum {sum}"));
        }
        if merchant.balances.payout_reserve.is_negative() {
            return Err(format!("{merchant_id}: negative payout reserve"));
        }
        let reserved = merchant.payout_payable.values().fold(Money::ZERO, |s, p| s.plus(*p));
        if reserved != merchant.balances.payout_reserve {
            return Err(format!(
                "{merchant_id}: reserve {} ≠ open payables {reserved}",
                merchant.balances.payout_reserve
            ));
        }
        open_payables.insert(merchant_id, reserved);
        balances_total = balances_total.plus(total);
    }
    for (order_id, order) in &engine.orders.orders {
        let open_payout =
            order.kind == OrderKind::Payout && matches!(order.state, OrderState::Pending | OrderState::InProgress);
        let merchant = engine.merchants.merchants.get(&order.merchant_id);
        let reserved = merchant.is_some_and(|m| m.payout_payable.contains_key(order_id));
        if !order.creating && open_payout != reserved {
            return Err(format!("R-MER-3/4: payout {order_id} in {:?} has reserve {reserved}", order.state));
        }
        if order.kind == OrderKind::Collection && order.state == OrderState::Success {
            let actual = order.actual_amount.ok_or(format!("{order_id}: success without actual"))?;
            let net = merchant
                .and_then(|m| m.collection_net.get(order_id))
                .copied()
                .ok_or(format!("R-MER-2: {order_id} not credited"))?;
            books.fees = books.fees.plus(actual.minus(net));
            books.collection_surplus = books.collection_surplus.plus(actual.minus(order.amount));
        }
    }
    // Conservation: everything on the books equals what came in plus what customers paid beyond orders.
    let left = balances_total.plus(books.fees).minus(books.rewards);
    let right = books.external_in.plus(books.collection_surplus);
    if left != right {
        return Err(format!("conservation: balances+fees−rewards {left} ≠ external+surplus {right} ({books:?})"));
    }
    Ok(books)
}

#[cfg(test)]
mod tests {
    //! Property test: random valid (and some invalid) event sequences over a small universe; after every
    //! event the invariants hold, and replaying the same text twice gives byte-identical documents.

    use super::check;
    use crate::engine::Engine;
    use crate::input::{parse_line, Parsed};
    use crate::replay::{parse_scenario, replay_to_json};
    use crate::wallet_sim::WalletSim;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const USERS: [&str; 3] = ["u1", "u2", "u3"];
    const CARDS: [(&str, &str, &str); 4] =
        [("k1", "u1", "phonepe"), ("k2", "u2", "mobikwik"), ("k3", "u3", "freecharge"), ("k4", "u1", "paytm")];
    const AMOUNTS: [&str; 4] = ["100.00", "250.00", "500.00", "1000.00"];
    const UTRS: [&str; 4] = ["111100001111", "222200002222", "333300003333", "444400004444"];
    const LAST4: [&str; 2] = ["1111", "2222"];

    fn time(seconds: i64) -> String {
        crate::time::Timestamp::parse("2026-03-02T09:00:00Z")
            .map(|t| t.plus_seconds(seconds).to_string())
            .unwrap_or_default()
    }

    /// Turns generated choices into scenario lines (JSON values).
    fn scenario(steps: &[(u8, u16, u8, u8)]) -> String {
        let mut lines: Vec<Value> =
            vec![json!({"type": "config", "reservoir_interval": 900, "payout_reward_rate": "0.01"})];
        let at0 = time(0);
        for merchant in ["m1", "m2"] {
            lines.push(json!({"type":"merchant_registered","at":at0,"merchant_id":merchant,"collection_fee_rate":"0.025","payout_fee_rate":"0.01","payout_fee_fixed":"3.00"}));
            lines.push(json!({"type":"merchant_deposit","at":at0,"merchant_id":merchant,"amount":"5000.00"}));
        }
        for user in USERS {
            lines.push(json!({"type":"user_registered","at":at0,"user_id":user,"telegram_bound":true}));
            lines.push(json!({"type":"user_recharge","at":at0,"user_id":user,"amount":"1500.00","commission":"15.00"}));
        }
        for (card, user, provider) in CARDS {
            lines.push(json!({"type":"card_bound","at":at0,"user_id":user,"card_id":card,"provider":provider}));
        }
        let mut now = 0i64;
        let (mut collections, mut payouts, mut txns) = (0usize, 0usize, 0usize);
        // The latest order of each kind and where it went, so generated lines often pay for it.
        let mut last_collection: (String, Value, String) = ("100.00".into(), Value::Null, "k1".into());
        let mut last_payout: (String, String, String) = ("100.00".into(), "1111".into(), "k2".into());
        for &(kind, dt, a, b) in steps {
            now += i64::from(dt % 240);
            let at = time(now);
            let user = USERS[a as usize % 3];
            let (card, card_user, _) = CARDS[b as usize % 4];
            let amount = AMOUNTS[b as usize % 4];
            let utr = UTRS[a as usize % 4];
            let collection =
                format!("o{}", if a % 2 == 0 { collections.max(1) } else { (a as usize) % collections.max(1) + 1 });
            let payout = format!("p{}", if a % 2 == 0 { payouts.max(1) } else { (a as usize) % payouts.max(1) + 1 });
            let event = match kind % 20 {
                0 => {
                    json!({"type":"user_recharge","at":at,"user_id":user,"amount":AMOUNTS[a as usize % 4],"commission":"0.00"})
                }
                1 => {
                    json!({"type":"user_adjustment","at":at,"user_id":user,"amount":if b % 2 == 0 {"-150.00"} else {"150.00"},"reason":"test"})
                }
                2 | 3 => {
                    collections += 1;
                    let utr = if a % 3 == 0 { Value::Null } else { json!(utr) };
                    last_collection = (amount.to_string(), utr.clone(), last_collection.2.clone());
                    json!({"type":"collection_created","at":at,"order_id":format!("o{collections}"),"merchant_id":if a % 2 == 0 {"m1"} else {"m2"},"amount":amount,"utr":utr})
                }
                4 => {
                    last_collection.2 = card.to_string();
                    lines.push(json!({"type":"collection_dispatched","at":at,"order_id":format!("o{}", collections.max(1)),"user_id":card_user,"card_id":card}));
                    // Usually the customer pays, a little later (the line shows once its time has come).
                    txns += 1;
                    let status = if a % 5 == 0 { "processing" } else { "success" };
                    json!({"type":"wallet_line","at":at,"card_id":card,"line":{"txn_id":format!("T{txns}"),"utr":last_collection.1.clone(),"direction":"in","amount":last_collection.0.clone(),"status":status,"time":time(now + i64::from(b % 200)),"counterparty":{}}})
                }
                5 | 6 => {
                    txns += 1;
                    let status = ["success", "success", "success", "processing", "failed", "errored"][a as usize % 6];
                    let incoming = kind % 20 == 5;
                    let related = b % 3 != 0;
                    let (line_card, line_amount, line_utr, last4) = match (incoming, related) {
                        (true, true) => (
                            last_collection.2.clone(),
                            last_collection.0.clone(),
                            if a % 4 == 0 { json!(utr) } else { last_collection.1.clone() },
                            "1111".to_string(),
                        ),
                        (false, true) => {
                            (last_payout.2.clone(), last_payout.0.clone(), json!(utr), last_payout.1.clone())
                        }
                        _ => (
                            card.to_string(),
                            AMOUNTS[a as usize % 4].to_string(),
                            json!(utr),
                            LAST4[b as usize % 2].to_string(),
                        ),
                    };
                    let direction = if incoming { "in" } else { "out" };
                    json!({"type":"wallet_line","at":at,"card_id":line_card,"line":{"txn_id":format!("T{txns}"),"utr":line_utr,"utr_supported":a % 7 != 0,"direction":direction,"amount":line_amount,"status":status,"time":time(now - i64::from(b % 30)),"counterparty":{"account_last4":last4},"payee_ifsc":"IFSC0001"}})
                }
                7 => {
                    json!({"type":"wallet_line_status","at":at,"card_id":card,"txn_id":format!("T{}", (a as usize) % txns.max(1) + 1),"status":(["success","failed","errored","processing"][b as usize % 4])})
                }
                8 => {
                    json!({"type":"wallet_fault","at":at,"card_id":card,"fault":(["session_expired","upstream_busy","detail_unavailable","none","none"][a as usize % 5])})
                }
                9 => {
                    json!({"type":"payment_confirmed","at":at,"order_id":if b % 2 == 0 {collection} else {payout},"utr":utr})
                }
                10 => {
                    json!({"type":"order_cancelled","at":at,"order_id":if b % 2 == 0 {collection} else {payout},"by":(["merchant","user","cashier"][a as usize % 3])})
                }
                11 => {
                    json!({"type":"supplement_requested","at":at,"order_id":collection,"utr":utr})
                }
                12 => json!({"type":"collection_retry","at":at,"order_id":collection}),
                13 => {
                    payouts += 1;
                    let ifsc = if a % 2 == 0 { json!("IFSC0001") } else { json!("IFSC0002") };
                    last_payout = (amount.to_string(), LAST4[a as usize % 2].to_string(), last_payout.2.clone());
                    json!({"type":"payout_created","at":at,"order_id":format!("p{payouts}"),"merchant_id":if a % 2 == 0 {"m1"} else {"m2"},"amount":amount,"payee":{"account_last4":LAST4[a as usize % 2],"ifsc":ifsc}})
                }
                14 => {
                    last_payout.2 = card.to_string();
                    lines.push(json!({"type":"payout_grabbed","at":at,"order_id":format!("p{}", payouts.max(1)),"user_id":card_user,"card_id":card}));
                    // Usually the agent pays the payee (sometimes short) and confirms with the UTR.
                    txns += 1;
                    let paid = if a % 4 == 0 { "50.00".to_string() } else { last_payout.0.clone() };
                    let status = ["success", "success", "processing"][a as usize % 3];
                    lines.push(json!({"type":"wallet_line","at":at,"card_id":card,"line":{"txn_id":format!("T{txns}"),"utr":utr,"direction":"out","amount":paid,"status":status,"time":at,"counterparty":{"account_last4":last_payout.1.clone()},"payee_ifsc":"IFSC0001"}}));
                    json!({"type":"payment_confirmed","at":at,"order_id":format!("p{}", payouts.max(1)),"utr":utr})
                }
                15 => {
                    let order = if b % 2 == 0 { collection } else { payout };
                    match a % 5 {
                        0 => {
                            json!({"type":"admin_approve","at":at,"order_id":order,"operator":"op"})
                        }
                        1 => {
                            json!({"type":"admin_reject","at":at,"order_id":order,"operator":"op"})
                        }
                        2 => {
                            json!({"type":"admin_crawl_retry","at":at,"order_id":order,"operator":"op"})
                        }
                        3 => {
                            json!({"type":"admin_correct_cancel","at":at,"order_id":order,"operator":"op"})
                        }
                        _ => {
                            json!({"type":"admin_cancel_payout","at":at,"order_id":order,"operator":"op"})
                        }
                    }
                }
                16 => {
                    json!({"type":"card_reauthenticated","at":at,"user_id":card_user,"card_id":card})
                }
                17 => json!({"type":"admin_unban","at":at,"user_id":user,"operator":"op"}),
                18 if a % 2 == 0 => {
                    // An ERRORED burst (R-ERR-1 noise), sometimes just under the limit.
                    for index in 0..(8 + i64::from(b % 5)) {
                        txns += 1;
                        lines.push(json!({"type":"wallet_line","at":at,"card_id":card,"line":{"txn_id":format!("T{txns}"),"utr":null,"direction":"in","amount":"10.00","status":"errored","time":time(now - 60 + index),"counterparty":{}}}));
                    }
                    json!({"type":"tick","at":at})
                }
                _ => json!({"type":"tick","at":at}),
            };
            lines.push(event);
        }
        lines.push(json!({"type":"tick","at":time(now + 1200)}));
        lines.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(96),
            ..ProptestConfig::default()
        })]

        #[test]
        fn invariants_hold_after_every_event(steps in proptest::collection::vec((0u8..40, 0u16..400, 0u8..=255, 0u8..=255), 1..120)) {
            let text = scenario(&steps);
            let parsed = parse_scenario(&text).map_err(|error| TestCaseError::fail(error.to_string()))?;
            let mut engine = Engine::new(parsed.config, Some(WalletSim::default()));
            let mut last_at = None;
            for (index, raw) in text.lines().enumerate().skip(1) {
                let Ok(Parsed::Input(input)) = parse_line(raw, || format!("line:{}", index + 1)) else {
                    return Err(TestCaseError::fail(format!("line {} does not parse", index + 1)));
                };
                last_at = Some(input.at);
                engine.apply(input);
                if let Err(broken) = check(&engine) {
                    return Err(TestCaseError::fail(format!("after line {}: {broken}\n{text}", index + 1)));
                }
            }
            if let Some(at) = last_at {
                engine.advance_to(at);
            }
            prop_assert!(check(&engine).is_ok(), "at the end: {:?}", check(&engine));
            let first = replay_to_json(&text).map_err(|error| TestCaseError::fail(error.to_string()))?;
            let second = replay_to_json(&text).map_err(|error| TestCaseError::fail(error.to_string()))?;
            prop_assert_eq!(first, second, "replaying the same input twice must give byte-identical output");
        }
    }

    #[test]
    fn the_generator_reaches_the_interesting_paths() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
        let strategy = proptest::collection::vec((0u8..40, 0u16..400, 0u8..=255, 0u8..=255), 60..120);
        let mut runner =
            TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]));
        let (mut collections, mut payouts, mut closed, mut banned, mut rejected) = (0, 0, 0, 0, 0);
        for _ in 0..40 {
            let steps = strategy.new_tree(&mut runner).map(|tree| tree.current()).unwrap_or_default();
            let document: Value =
                serde_json::from_str(&replay_to_json(&scenario(&steps)).unwrap_or_default()).unwrap_or(Value::Null);
            for order in document["orders"].as_object().into_iter().flat_map(|orders| orders.values()) {
                let success = order["state"] == "success";
                collections += usize::from(success && order["kind"] == "collection");
                payouts += usize::from(success && order["kind"] == "payout");
                closed += order["sub_orders"]
                    .as_array()
                    .map_or(0, |subs| subs.iter().filter(|s| s["state"] == "payment_timeout").count());
            }
            banned += document["users"]
                .as_object()
                .map_or(0, |users| users.values().filter(|u| u["status"] == "banned").count());
            rejected += document["outputs"]
                .as_array()
                .map_or(0, |outputs| outputs.iter().filter(|o| o["type"] == "command_rejected").count());
            if std::env::var("REACH_DEBUG").is_ok() {
                for output in document["outputs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|o| o["type"] == "dispatch_rejected" || o["type"] == "command_rejected")
                {
                    println!("{} {}", output["type"], output["reason"]);
                }
            }
        }
        println!("successful collections {collections}, payouts {payouts}, closes {closed}, bans {banned}, rejections {rejected}");
        assert!(collections > 0 && payouts > 0 && closed > 0 && banned > 0 && rejected > 0);
    }
}
