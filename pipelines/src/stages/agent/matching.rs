//! The match rules (R-WIN-1..3, R-MATCH-C1..C3, R-MATCH-P1..P5): after every successful check, one pass
//! per rule over the card's open sub-orders in creation order (C1, C2, C3, then P1, P2).

use super::state::*;
use super::Context;
use crate::input::{Counterparty, Direction, LineStatus, Party, Provider};
use crate::money::Money;
use crate::output::OrderKind;
use crate::time::Timestamp;
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeMap, BTreeSet};

/// R-WIN-1 / R-WIN-2: the window of a sub-order for a check asked at `check_time`.
fn window(record: &SubOrder, check_time: Timestamp, context: &Context) -> (Timestamp, Timestamp) {
    let lower = record.created_at.plus_seconds(context.config.window_start_offset_s);
    let anchor = record.closed_at.unwrap_or(check_time);
    (lower, anchor.plus_seconds(context.config.window_slack_s))
}

/// Payee identity (R-MATCH-P1): at least one of last4 / vpa on both sides, and all shared ones equal.
pub fn payee_matches(payee: &Party, counterparty: &Counterparty) -> bool {
    let last4 = match (&payee.account_last4, &counterparty.account_last4) {
        (Some(a), Some(b)) => Some(a == b),
        _ => None,
    };
    let vpa = match (&payee.vpa, &counterparty.vpa) {
        (Some(a), Some(b)) => Some(a.eq_ignore_ascii_case(b)),
        _ => None,
    };
    match (last4, vpa) {
        (None, None) => false,
        (a, b) => a.unwrap_or(true) && b.unwrap_or(true),
    }
}

fn free(line: &BillLine) -> bool {
    line.used_by.is_none() && line.reserved_by.is_none()
}

/// The UTRs of a card's live sub-orders, each with its sub-order: a line carrying one is left out of
/// C2, C3 and P2 for every other sub-order. A card has a few live sub-orders, so a list scanned per
/// line beats a map of sets (measured: building the map allocated a set per UTR on every check).
struct UtrOwners(Vec<(Text, usize)>);

impl UtrOwners {
    fn of(agent: &Agent, card: &Card) -> UtrOwners {
        let owners =
            card.live_subs.iter().flat_map(|sub| agent.subs[*sub].utrs.iter().map(move |utr| (utr.clone(), *sub)));
        UtrOwners(owners.collect())
    }

    fn owned_by_other(&self, line: &BillLine, sub: usize) -> bool {
        line.line.utr.as_ref().is_some_and(|utr| self.0.iter().any(|(owned, owner)| owned == utr && *owner != sub))
    }
}

enum Decision {
    Collection { sub: usize, txn_id: Text, rule: &'static str, record_utr: Option<Text> },
    Payout { sub: usize, txn_ids: Vec<Text>, rule: &'static str },
    Ambiguous { sub: usize, lines: usize },
    Detail { sub: usize, txn_id: Text },
}

impl Agent {
    /// Runs the match rules on a card (all its open sub-orders, or only one for a bill-table lookup).
    pub(crate) fn run_matching(
        &mut self,
        card_id: &str,
        check_time: Timestamp,
        only: Option<usize>,
        context: &mut Context,
    ) {
        let Some(card) = self.cards.get(card_id) else {
            return;
        };
        let is_candidate =
            |sub: &usize| self.subs[*sub].open_for_matching() && crate::same_text(&self.subs[*sub].card_id, card_id);
        let candidates: Vec<usize> = match only {
            Some(sub) => std::iter::once(sub).filter(is_candidate).collect(),
            None => card.live_subs.iter().copied().filter(is_candidate).collect(),
        };
        if candidates.is_empty() {
            return;
        }
        let utr_owners = UtrOwners::of(self, card);
        let owned_by_other = |line: &BillLine, sub: usize| utr_owners.owned_by_other(line, sub);
        // One list for every pass, refilled: each pass takes the candidates of its kind still open
        // (a pass before it may have decided some), in creation order. (A list per kind and per pass
        // was ≈ 9 allocations a check.)
        let mut subs: Vec<usize> = Vec::with_capacity(candidates.len());
        for pass in [Pass::C1, Pass::C2, Pass::C3, Pass::P1, Pass::P2] {
            let kind = if matches!(pass, Pass::P1 | Pass::P2) { OrderKind::Payout } else { OrderKind::Collection };
            subs.clear();
            subs.extend(candidates.iter().copied().filter(|sub| {
                let record = &self.subs[*sub];
                record.kind == kind && record.open_for_matching()
            }));
            if subs.is_empty() {
                continue;
            }
            let Some(card) = self.cards.get(card_id) else {
                return;
            };
            let decisions = match pass {
                Pass::C1 => self.pass_c1(card, &subs, check_time, context),
                Pass::C2 => self.pass_c2(card, &subs, check_time, &owned_by_other, context),
                Pass::C3 => self.pass_c3(card, &subs, check_time, &owned_by_other, context),
                Pass::P1 => self.pass_p1(card, &subs, check_time, context),
                Pass::P2 => self.pass_p2(card, &subs, check_time, &owned_by_other, context),
            };
            for decision in decisions {
                self.apply_decision(card_id, decision, check_time, context);
            }
        }
    }

    /// R-MATCH-C1: an `in` line with the sub-order's UTR inside the window.
    fn pass_c1(&self, card: &Card, subs: &[usize], check_time: Timestamp, context: &Context) -> Vec<Decision> {
        let mut taken: Vec<Text> = Vec::new(); // a few lines per check: a list, not a set
        let mut decisions = Vec::new();
        for &sub in subs {
            let record = &self.subs[sub];
            if record.utrs.is_empty() || record.found {
                continue;
            }
            let (lower, upper) = window(record, check_time, context);
            let hit = card.bill.window(lower, upper).find(|line| {
                free(line)
                    && !taken.contains(&line.line.txn_id)
                    && line.line.direction == Direction::In
                    && line.line.status == LineStatus::Success
                    && line.line.utr.as_ref().is_some_and(|utr| record.utrs.contains(utr))
            });
            if let Some(line) = hit {
                taken.push(line.line.txn_id.clone());
                decisions.push(Decision::Collection {
                    sub,
                    txn_id: line.line.txn_id.clone(),
                    rule: "R-MATCH-C1",
                    record_utr: None,
                });
            }
        }
        decisions
    }

    /// Free, successful `in` lines inside the sub-order's window whose amount equals its amount and
    /// whose UTR belongs to no other open sub-order (R-MATCH-C2 with `without_utr_field`, R-MATCH-C3).
    fn incoming_of_amount(
        &self,
        card: &Card,
        sub: usize,
        check_time: Timestamp,
        owned_by_other: &dyn Fn(&BillLine, usize) -> bool,
        context: &Context,
        without_utr_field: bool,
    ) -> Vec<Text> {
        let record = &self.subs[sub];
        let (lower, upper) = window(record, check_time, context);
        card.bill
            .window(lower, upper)
            .filter(|line| {
                free(line)
                    && (!without_utr_field || !line.line.utr_supported)
                    && line.line.direction == Direction::In
                    && line.line.status == LineStatus::Success
                    && line.line.amount.within(record.amount, context.config.amount_tolerance)
                    && !owned_by_other(line, sub)
            })
            .map(|line| line.line.txn_id.clone())
            .collect()
    }

    /// Unfound collections with a UTR (`with_utr`, R-MATCH-C2: lines without a UTR field) or without
    /// one (R-MATCH-C3: any line), in creation order, each with the lines it could take (none → left out).
    fn amount_candidates(
        &self,
        card: &Card,
        subs: &[usize],
        check_time: Timestamp,
        owned_by_other: &dyn Fn(&BillLine, usize) -> bool,
        context: &Context,
        with_utr: bool,
    ) -> Vec<(usize, Vec<Text>)> {
        subs.iter()
            .copied()
            .filter(|sub| self.subs[*sub].utrs.is_empty() != with_utr && !self.subs[*sub].found)
            .map(|sub| (sub, self.incoming_of_amount(card, sub, check_time, owned_by_other, context, with_utr)))
            .filter(|(_, lines)| !lines.is_empty())
            .collect()
    }

    /// R-MATCH-C2: a UTR-less (`utr_supported = false`) line paired one-to-one with a sub-order by amount.
    fn pass_c2(
        &self,
        card: &Card,
        subs: &[usize],
        check_time: Timestamp,
        owned_by_other: &dyn Fn(&BillLine, usize) -> bool,
        context: &Context,
    ) -> Vec<Decision> {
        let lines_of = self.amount_candidates(card, subs, check_time, owned_by_other, context, true);
        let mut subs_of: HashMap<Text, usize> = HashMap::default();
        for txn_id in lines_of.iter().flat_map(|(_, lines)| lines) {
            *subs_of.entry(txn_id.clone()).or_default() += 1;
        }
        lines_of
            .into_iter()
            .filter(|(_, lines)| lines.len() == 1 && subs_of.get(&lines[0]) == Some(&1))
            .map(|(sub, mut lines)| Decision::Collection {
                sub,
                txn_id: lines.remove(0),
                rule: "R-MATCH-C2",
                record_utr: self.subs[sub].utrs.first().cloned(),
            })
            .collect()
    }

    /// R-MATCH-C3: no-UTR collections by amount; ambiguous when fewer lines than sub-orders could take.
    fn pass_c3(
        &self,
        card: &Card,
        subs: &[usize],
        check_time: Timestamp,
        owned_by_other: &dyn Fn(&BillLine, usize) -> bool,
        context: &Context,
    ) -> Vec<Decision> {
        let candidates = self.amount_candidates(card, subs, check_time, owned_by_other, context, false);
        // "For each amount": amounts are equal within the tolerance, so a line can be equal to two
        // different order amounts. Sub-orders are grouped by the lines they could take (connected
        // components), which keeps every line in one group and so matched at most once (R-WIN-3).
        let mut decisions = Vec::new();
        for group in equal_amount_groups(candidates) {
            let k = group.len();
            let union: BTreeSet<&Text> = group.iter().flat_map(|(_, lines)| lines.iter()).collect();
            let n = union.len();
            if n >= k {
                let mut taken: BTreeSet<Text> = BTreeSet::new();
                for (sub, lines) in &group {
                    if let Some(txn_id) = lines.iter().find(|txn_id| !taken.contains(*txn_id)) {
                        taken.insert(txn_id.clone());
                        decisions.push(Decision::Collection {
                            sub: *sub,
                            txn_id: txn_id.clone(),
                            rule: "R-MATCH-C3",
                            record_utr: None,
                        });
                    }
                }
            } else {
                decisions.extend(group.iter().map(|(sub, _)| Decision::Ambiguous { sub: *sub, lines: n }));
            }
        }
        decisions
    }

    /// R-MATCH-P1: `out` lines with one of the payout's UTRs and its payee (IFSC verified on mobikwik).
    fn pass_p1(&self, card: &Card, subs: &[usize], check_time: Timestamp, context: &Context) -> Vec<Decision> {
        let mut taken: Vec<Text> = Vec::new(); // a few lines per check: a list, not a set
        let mut decisions = Vec::new();
        for &sub in subs {
            let record = &self.subs[sub];
            let Some(payee) = record.payee.as_ref() else {
                continue;
            };
            if record.utrs.is_empty() {
                continue;
            }
            let needs_ifsc = card.provider == Provider::Mobikwik && payee.ifsc.is_some();
            let (lower, upper) = window(record, check_time, context);
            let mut txn_ids = Vec::new();
            for line in card.bill.window(lower, upper) {
                let txn_id = &line.line.txn_id;
                let candidate = free(line)
                    && !taken.contains(txn_id)
                    && line.line.direction == Direction::Out
                    && matches!(line.line.status, LineStatus::Success | LineStatus::Processing)
                    && line.line.utr.as_ref().is_some_and(|utr| record.utrs.contains(utr))
                    && payee_matches(payee, &line.line.counterparty)
                    && !record.ifsc_mismatch.contains(txn_id);
                if !candidate {
                    continue;
                }
                taken.push(txn_id.clone());
                if needs_ifsc && !record.ifsc_verified.contains(txn_id) {
                    decisions.push(Decision::Detail { sub, txn_id: txn_id.clone() });
                    break;
                }
                txn_ids.push(txn_id.clone());
            }
            if !txn_ids.is_empty() {
                decisions.push(Decision::Payout { sub, txn_ids, rule: "R-MATCH-P1" });
            }
        }
        decisions
    }

    /// R-MATCH-P2: a payout without UTR takes an `out` line with its payee and amount.
    fn pass_p2(
        &self,
        card: &Card,
        subs: &[usize],
        check_time: Timestamp,
        owned_by_other: &dyn Fn(&BillLine, usize) -> bool,
        context: &Context,
    ) -> Vec<Decision> {
        let tolerance = context.config.amount_tolerance;
        let mut taken: Vec<Text> = Vec::new(); // a few lines per check: a list, not a set
        let mut decisions = Vec::new();
        for &sub in subs {
            let record = &self.subs[sub];
            let Some(payee) = record.payee.as_ref() else {
                continue;
            };
            if !record.utrs.is_empty() || record.found {
                continue;
            }
            let (lower, upper) = window(record, check_time, context);
            let hit = card.bill.window(lower, upper).find(|line| {
                free(line)
                    && !taken.contains(&line.line.txn_id)
                    && line.line.direction == Direction::Out
                    && matches!(line.line.status, LineStatus::Success | LineStatus::Processing)
                    && line.line.amount.within(record.amount, tolerance)
                    && payee_matches(payee, &line.line.counterparty)
                    && !owned_by_other(line, sub)
            });
            if let Some(line) = hit {
                taken.push(line.line.txn_id.clone());
                decisions.push(Decision::Payout { sub, txn_ids: vec![line.line.txn_id.clone()], rule: "R-MATCH-P2" });
            }
        }
        decisions
    }

    /// R-ADMIN-1 on an ambiguous collection: the approval takes the oldest line the sub-order could take
    /// (R-MATCH-C3's candidates), so that line cannot pay a second order later (R-WIN-3).
    pub(crate) fn take_ambiguous_candidate(
        &mut self,
        sub: usize,
        context: &mut Context,
    ) -> Option<(Text, Option<Text>)> {
        let card_id = self.subs[sub].card_id.clone();
        let card = self.cards.get(&card_id)?;
        let utr_owners = UtrOwners::of(self, card);
        let owned_by_other = |line: &BillLine, sub: usize| utr_owners.owned_by_other(line, sub);
        let now = context.effects.now;
        let txn_id = self.incoming_of_amount(card, sub, now, &owned_by_other, context, false).into_iter().next()?;
        let line = self.take_line(&card_id, sub, &txn_id)?;
        Some((txn_id, line.utr))
    }

    /// Matches a free line to a sub-order; `None` if the line is gone or already used (R-WIN-3 is a
    /// guard here, not only an assertion: a line is never matched twice).
    fn take_line(&mut self, card_id: &str, sub: usize, txn_id: &str) -> Option<Line> {
        let line = self.cards.get_mut(card_id)?.bill.get_mut(txn_id)?;
        if line.used_by.is_some() || line.reserved_by.is_some_and(|holder| holder != sub) {
            debug_assert!(false, "R-WIN-3: line {txn_id} offered twice");
            return None;
        }
        line.reserved_by = None;
        line.used_by = Some(sub);
        let record = &mut self.subs[sub];
        record.matched_txn_ids.reserve_exact(1); // usually one line: no room for four
        record.matched_txn_ids.push(txn_id.into());
        record.found = true;
        record.matched_since_confirmation = true;
        Some(line.line.clone())
    }

    fn apply_decision(&mut self, card_id: &str, decision: Decision, check_time: Timestamp, context: &mut Context) {
        let now = context.effects.now;
        match decision {
            Decision::Collection { sub, txn_id, rule, record_utr } => {
                let Some(line) = self.take_line(card_id, sub, &txn_id) else {
                    return;
                };
                if let Some(utr) = record_utr.clone() {
                    // R-MATCH-C2: the order's UTR is recorded on the line.
                    if let Some(bill_line) = self.cards.get_mut(card_id).and_then(|card| card.bill.get_mut(&txn_id)) {
                        bill_line.line.utr = Some(utr);
                    }
                }
                // A pairing resolves ambiguity (SPEC §4), whatever the rule that paired the line.
                self.subs[sub].flags.remove(&Flag::Ambiguous);
                let record = &mut self.subs[sub];
                let (lower, upper) = window(record, check_time, context);
                let evidence =
                    Evidence::Line { txn_id: txn_id.clone(), amount: line.amount, time: line.time, lower, upper };
                if rule == "R-MATCH-C1" && !line.amount.within(record.amount, context.config.amount_tolerance) {
                    record.flags.insert(Flag::AmountMismatch);
                    record.paid_total = if line.status == LineStatus::Success { line.amount } else { Money::ZERO };
                    record.note(
                        now,
                        "R-MATCH-C1",
                        "amount_mismatch",
                        format!("{evidence}; order amount {}", record.amount),
                    );
                    self.set_state(sub, SubState::Reviewing);
                    return;
                }
                record.paid_total = line.amount;
                let utr_backfill = if rule == "R-MATCH-C3" { line.utr.clone() } else { None };
                if rule == "R-MATCH-C3" && record.utrs.is_empty() {
                    if let Some(utr) = &line.utr {
                        record.utrs.push(utr.clone());
                    }
                }
                let record_match = MatchRecord { rule, txn_ids: vec![txn_id], explanation: evidence };
                self.collection_success(sub, line.amount, record_match, utr_backfill, context);
            }
            Decision::Payout { sub, txn_ids, rule } => {
                for txn_id in &txn_ids {
                    self.take_line(card_id, sub, txn_id);
                }
                let (lower, upper) = window(&self.subs[sub], check_time, context);
                self.subs[sub].note(
                    now,
                    rule,
                    "lines_matched",
                    Evidence::Lines { txn_ids: txn_ids.clone(), lower, upper },
                );
                self.evaluate_payout(sub, context);
            }
            Decision::Ambiguous { sub, lines } => {
                let record = &mut self.subs[sub];
                if record.flags.insert(Flag::Ambiguous) {
                    record.note(
                        now,
                        "R-MATCH-C3",
                        "ambiguous",
                        format!("{lines} line(s) for more sub-orders of equal amount"),
                    );
                }
                self.set_state(sub, SubState::Reviewing);
            }
            Decision::Detail { sub, txn_id } => {
                if let Some(line) = self.cards.get_mut(card_id).and_then(|card| card.bill.get_mut(&txn_id)) {
                    line.reserved_by = Some(sub);
                }
                self.subs[sub].awaiting_detail = Some(txn_id.clone());
                self.subs[sub].note(now, "R-MATCH-P1", "ifsc_detail_asked", format!("txn {txn_id} reserved (R-WIN-3)"));
                self.ask_detail(card_id, &txn_id, DetailReason::Ifsc { sub }, context);
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Pass {
    C1,
    C2,
    C3,
    P1,
    P2,
}

/// Splits C3 candidates into groups of sub-orders linked by a line they could both take, each group
/// in creation order (union-find over the candidate lines).
fn equal_amount_groups(candidates: Vec<(usize, Vec<Text>)>) -> Vec<Vec<(usize, Vec<Text>)>> {
    if candidates.len() <= 1 {
        // The usual case, one sub-order: its own group (no group at all for none).
        return if candidates.is_empty() { Vec::new() } else { vec![candidates] };
    }
    let mut parent: Vec<usize> = (0..candidates.len()).collect();
    fn root(parent: &mut [usize], mut node: usize) -> usize {
        while parent[node] != node {
            parent[node] = parent[parent[node]];
            node = parent[node];
        }
        node
    }
    let mut owner_of_line: HashMap<&str, usize> = HashMap::default();
    for (index, (_, lines)) in candidates.iter().enumerate() {
        for line in lines {
            if let Some(&other) = owner_of_line.get(line.as_str()) {
                let (a, b) = (root(&mut parent, index), root(&mut parent, other));
                parent[a.max(b)] = a.min(b);
            } else {
                owner_of_line.insert(line.as_str(), index);
            }
        }
    }
    let roots: Vec<usize> = (0..candidates.len()).map(|index| root(&mut parent, index)).collect();
    let mut groups: BTreeMap<usize, Vec<(usize, Vec<Text>)>> = BTreeMap::new();
    for (index, candidate) in candidates.into_iter().enumerate() {
        groups.entry(roots[index]).or_default().push(candidate);
    }
    groups.into_values().collect()
}
