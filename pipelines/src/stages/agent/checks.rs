//! Checks of a card's statement and what their answers do (R-CHK-1..3, R-WAVE-1..2, R-CLOSE-1..2,
//! R-PAY-1, R-REAUTH-1, R-PEND-1..2, R-TIMER-1) and the agent's timers.

use super::state::*;
use super::{AgentTimer, Context};
use crate::input::{CrawlError, CrawlResult, LineStatus, Provider, StatementLine};
use crate::output::{CrawlMode, CrawlRequested, NotificationKind, OrderKind, OutputBody, PageOrder, Reason, Rejection};
use crate::time::Timestamp;
use crate::Text;
use std::borrow::Cow;

/// Lines per provider page (R-CHK-2).
pub const PAGE_LIMIT: u32 = 50;

impl Agent {
    pub(crate) fn on_timer(&mut self, timer: AgentTimer, context: &mut Context) {
        if self.timer_is_idle(&timer) {
            return;
        }
        let now = context.effects.now;
        match timer {
            AgentTimer::CollectionWave { sub } => self.sub_check_due(sub, PurposeKind::Wave, 0, context),
            AgentTimer::Close { sub } => self.sub_check_due(sub, PurposeKind::Close, 0, context),
            AgentTimer::ConfirmWave { sub, generation, second } => {
                if second && generation == self.subs[sub].confirm_generation {
                    self.subs[sub].second_wave_passed = true;
                }
                let kind = if second { PurposeKind::ConfirmSecond } else { PurposeKind::ConfirmFirst };
                self.sub_check_due(sub, kind, generation, context)
            }
            AgentTimer::PayTimeout { sub } => self.sub_check_due(sub, PurposeKind::PayFinal, 0, context),
            AgentTimer::UnderpaidTimeout { sub } => {
                let record = &self.subs[sub];
                if record.state.is_live() && record.flags.contains(&Flag::IfscUnverified) {
                    // R-MATCH-P1: an unverified line is never an automatic rejection; look again later.
                    let due = now.plus_seconds(context.config.detail_retry_s);
                    context.effects.schedule(due, self.timer(AgentTimer::UnderpaidTimeout { sub }));
                } else if record.state.is_live() && record.flags.contains(&Flag::Underpaid) {
                    self.subs[sub].note(
                        now,
                        "R-MATCH-P4",
                        "underpaid_timeout",
                        "top-up not complete in time".to_string(),
                    );
                    self.payout_returned(sub, SubState::Rejected, "R-MATCH-P4", context);
                }
            }
            AgentTimer::BillPendingTimeout { sub } => {
                let timeout = self.bill_pending_timeout_s(sub, context);
                let record = &self.subs[sub];
                let due = record.bill_pending_since.map(|since| since.plus_seconds(timeout));
                if record.state.is_live()
                    && record.flags.contains(&Flag::BillPending)
                    && due.is_some_and(|due| due <= now)
                {
                    self.subs[sub].note(now, "R-PEND-2", "bill_pending_timeout", "line still processing".to_string());
                    self.payout_returned(sub, SubState::Rejected, "R-PEND-2", context);
                }
            }
            AgentTimer::DetailRetry { sub } => self.detail_retry_due(sub, context),
            AgentTimer::CrawlTimeout { card_id, request_id } => {
                let Some(card) = self.cards.get_mut(&card_id) else {
                    return;
                };
                if let Some(request) = card.requests.remove(&request_id) {
                    self.forget_request();
                    // R-CHK-1: no answer within crawl_timeout counts as upstream_busy.
                    self.on_answer(&card_id, request, Some(CrawlError::UpstreamBusy), Page::empty(), None, context);
                }
            }
            AgentTimer::CrawlRetry { card_id, generation } => {
                let Some(card) = self.cards.get_mut(&card_id) else {
                    return;
                };
                if !card.check.retry_scheduled || card.check.retry_generation != generation {
                    return; // stale: the session expired (and maybe a new check started) meanwhile
                }
                card.check.retry_scheduled = false;
                if card.check.in_flight.is_some() {
                    return; // the waiting purposes are asked when that check is answered
                }
                let purposes = std::mem::take(&mut card.check.waiting);
                self.ask_check(&card_id, purposes, context);
            }
            AgentTimer::Reservoir { card_id } => self.reservoir_due(&card_id, context),
            AgentTimer::DebtSweep => self.on_sweep(context.config.debt_sweep_interval_s, context.effects),
        }
    }

    /// Whether `timer` would change nothing and emit nothing, told from the agent's own record: most
    /// timers outlive their purpose (a wave, close or pay timeout of a sub-order already final, a crawl
    /// timeout of an answered request; ≈ 68 % of the engine benchmark's agent timers), and reading the
    /// cold sub-order or card to find that out cost ≈ 0.1–0.4 µs each. Only exact answers: a second
    /// confirmation wave is never idle here (it records that it passed, R-WAVE-2, even on a final
    /// sub-order), and a crawl timeout is idle only while no request of any card is outstanding.
    fn timer_is_idle(&self, timer: &AgentTimer) -> bool {
        let idle = match timer {
            AgentTimer::CollectionWave { sub }
            | AgentTimer::Close { sub }
            | AgentTimer::PayTimeout { sub }
            | AgentTimer::ConfirmWave { sub, second: false, .. } => self.final_subs.contains(*sub),
            AgentTimer::CrawlTimeout { .. } => self.requests_outstanding == Some(0),
            _ => false,
        };
        debug_assert!(self.derived_indexes_hold(), "agent {}: derived indexes out of step", self.user_id);
        idle
    }

    /// Counts an outstanding request less (answered or timed out). A count that would go below zero
    /// becomes unknown: never idle then, rather than wrong.
    fn forget_request(&mut self) {
        self.requests_outstanding = self.requests_outstanding.and_then(|count| count.checked_sub(1));
    }

    /// Does the sub-order still need a check for this purpose (R-TIMER-1, R-CHK-1)?
    fn purpose_needed(&self, purpose: &Purpose) -> bool {
        let Some(sub) = purpose.sub else { return true };
        let record = &self.subs[sub];
        let reviewing = record.state == SubState::Reviewing;
        match purpose.kind {
            PurposeKind::Wave | PurposeKind::Close => {
                !record.found
                    && (record.state == SubState::Paying || (reviewing && record.flags.contains(&Flag::Ambiguous)))
            }
            PurposeKind::ConfirmFirst => {
                purpose.generation == record.confirm_generation
                    && reviewing
                    && (!record.found || record.flags.contains(&Flag::Underpaid))
            }
            // R-WAVE-2: "if the first finds the line, the second is not asked".
            PurposeKind::ConfirmSecond => {
                purpose.generation == record.confirm_generation
                    && reviewing
                    && !record.matched_since_confirmation
                    && (!record.found || record.flags.contains(&Flag::Underpaid))
            }
            PurposeKind::PayFinal => record.state == SubState::Paying,
            PurposeKind::Revival => reviewing && record.revived_from.is_some() && !record.found,
            PurposeKind::OperatorRetry => reviewing && !record.found,
            PurposeKind::Reauth => true,
        }
    }

    fn sub_check_due(&mut self, sub: usize, kind: PurposeKind, generation: u32, context: &mut Context) {
        let purpose = Purpose { sub: Some(sub), kind, generation };
        if self.purpose_needed(&purpose) {
            let card_id = self.subs[sub].card_id.clone();
            self.request_check(&card_id, purpose, context);
        }
    }

    /// Asks a check now, or coalesces it into the outstanding one (R-CHK-1), or skips it while the card
    /// is unauthenticated (R-CHK-3).
    pub(crate) fn request_check(&mut self, card_id: &str, purpose: Purpose, context: &mut Context) {
        let window_start =
            purpose.sub.map(|sub| self.subs[sub].created_at.plus_seconds(context.config.window_start_offset_s));
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        if card.auth == CardAuth::Unauthenticated {
            return self.skipped(purpose, context);
        }
        // A purpose falling due at the very instant a check was asked joins it: the check's window is the
        // same, so it counts for both (R-CHK-1). Later ones wait for the answer (coalesced).
        let now = context.effects.now;
        let covers = |flight: &CheckInFlight| match (flight.from, window_start) {
            (Some(from), Some(start)) => start >= from,
            (Some(_), None) => false,
            (None, _) => true,
        };
        if let Some(flight) =
            card.check.in_flight.as_mut().filter(|flight| flight.asked_at == now && flight.pages == 1 && covers(flight))
        {
            if !flight.purposes.contains(&purpose) {
                flight.purposes.push(purpose);
                let request_id = flight.request_id.clone();
                if let Some(sub) = purpose.sub {
                    self.subs[sub].note(
                        now,
                        "R-CHK-1",
                        "check_asked",
                        Evidence::Asked { request_id, purpose: purpose.kind },
                    );
                }
            }
            return;
        }
        if card.check.in_flight.is_some() || card.check.retry_scheduled {
            card.check.waiting.push(purpose);
            return;
        }
        self.ask_check(card_id, vec![purpose], context);
    }

    /// Sends one order_check counting for every purpose still needed (R-CHK-1, R-CHK-2).
    fn ask_check(&mut self, card_id: &str, purposes: Vec<Purpose>, context: &mut Context) {
        if !self.card_authenticated(card_id) {
            for purpose in purposes {
                self.skipped(purpose, context);
            }
            return;
        }
        let mut needed: Vec<Purpose> = Vec::with_capacity(purposes.len());
        for purpose in purposes {
            if self.purpose_needed(&purpose) && !needed.contains(&purpose) {
                needed.push(purpose);
            }
        }
        if needed.is_empty() {
            return;
        }
        let now = context.effects.now;
        let offset = context.config.window_start_offset_s;
        let Some(card) = self.cards.get(card_id) else {
            return;
        };
        let from = (card.provider == Provider::Phonepe)
            .then(|| card.live_subs.iter().map(|sub| self.subs[*sub].created_at.plus_seconds(offset)).min())
            .flatten();
        let request_id = self.send_request(card_id, CrawlMode::OrderCheck, from, None, context);
        for purpose in &needed {
            if let Some(sub) = purpose.sub {
                self.subs[sub].note(
                    now,
                    "R-CHK-1",
                    "check_asked",
                    Evidence::Asked { request_id: request_id.clone(), purpose: purpose.kind },
                );
            }
        }
        if let Some(card) = self.cards.get_mut(card_id) {
            card.check.in_flight = Some(CheckInFlight {
                asked_at: now,
                request_id: request_id.clone(),
                from,
                purposes: needed,
                pages: 1,
                lines: Vec::new(),
            });
        }
    }

    /// Emits a `crawl_requested` with a fresh request id and arms its timeout (R-CHK-1).
    fn send_request(
        &mut self,
        card_id: &str,
        mode: CrawlMode,
        from: Option<Timestamp>,
        txn_id: Option<Text>,
        context: &mut Context,
    ) -> Text {
        let now = context.effects.now;
        let Some(card) = self.cards.get_mut(card_id) else {
            return Text::default();
        };
        card.requests_made += 1;
        let request_id = crate::numbered(card_id, ':', card.requests_made);
        let (order, limit) = match mode {
            CrawlMode::Detail => (None, None),
            CrawlMode::OrderCheck if card.provider == Provider::Phonepe => (Some(PageOrder::Asc), Some(PAGE_LIMIT)),
            CrawlMode::OrderCheck | CrawlMode::Reservoir => (Some(PageOrder::Desc), Some(PAGE_LIMIT)),
        };
        let kind = match (mode, txn_id.clone()) {
            (CrawlMode::OrderCheck, _) => RequestKind::OrderCheck,
            (CrawlMode::Reservoir, _) => RequestKind::Reservoir,
            (CrawlMode::Detail, txn) => {
                RequestKind::Detail { txn_id: txn.unwrap_or_default(), reason: DetailReason::Pending }
            }
        };
        if card.requests.insert(request_id.clone(), Request { kind, asked_at: now }).is_none() {
            self.requests_outstanding = self.requests_outstanding.map(|count| count + 1);
        }
        context.effects.emit(OutputBody::CrawlRequested(CrawlRequested {
            request_id: request_id.clone(),
            user_id: self.user_id.clone(),
            card_id: card_id.into(),
            provider: card.provider,
            mode,
            order,
            from: if order == Some(PageOrder::Asc) { from } else { None },
            limit,
            txn_id,
        }));
        let due = now.plus_seconds(context.config.crawl_timeout_s);
        let timer = self.timer(AgentTimer::CrawlTimeout { card_id: card_id.into(), request_id: request_id.clone() });
        context.effects.schedule(due, timer);
        request_id
    }

    /// Asks a detail fetch about one line (R-MATCH-P1, R-PEND-1).
    pub(crate) fn ask_detail(&mut self, card_id: &str, txn_id: &str, reason: DetailReason, context: &mut Context) {
        if !self.card_authenticated(card_id) {
            // R-CHK-3: nothing is asked of an unauthenticated card. An IFSC check cannot be done now,
            // which is a failed detail (R-MATCH-P1); a pending-line lookup waits for the next sync.
            if let DetailReason::Ifsc { sub } = reason {
                self.release_reservation(sub);
                self.ifsc_unverified(card_id, sub, txn_id, context);
            }
            return;
        }
        let request_id = self.send_request(card_id, CrawlMode::Detail, None, Some(txn_id.into()), context);
        if let Some(request) = self.cards.get_mut(card_id).and_then(|card| card.requests.get_mut(&request_id)) {
            request.kind = RequestKind::Detail { txn_id: txn_id.into(), reason };
        }
    }

    /// A check that could not be asked, or answered `session_expired`: remember the rules whose time
    /// lapsed (R-CLOSE-2, R-REAUTH-1).
    fn skipped(&mut self, purpose: Purpose, context: &mut Context) {
        let Some(sub) = purpose.sub else { return };
        if !self.purpose_needed(&purpose) {
            return;
        }
        let now = context.effects.now;
        let record = &mut self.subs[sub];
        let ambiguous = record.flags.contains(&Flag::Ambiguous);
        match purpose.kind {
            // R-MATCH-C3: a close check leaves an ambiguous sub-order in review; a skipped one too.
            PurposeKind::Close if ambiguous => {}
            PurposeKind::ConfirmSecond if ambiguous => {}
            PurposeKind::Close => {
                record.flags.insert(Flag::AwaitReauth);
                record.lapses.insert(Lapse::Close);
                record.note(
                    now,
                    "R-CLOSE-2",
                    "close_deferred",
                    "card unauthenticated: review, hold stays frozen".to_string(),
                );
                self.set_state(sub, SubState::Reviewing);
            }
            PurposeKind::ConfirmSecond => {
                record.lapses.insert(Lapse::SecondWave);
            }
            PurposeKind::PayFinal => {
                record.lapses.insert(Lapse::PayTimeout);
            }
            PurposeKind::Revival | PurposeKind::OperatorRetry => {
                if purpose.kind == PurposeKind::Revival {
                    record.lapses.insert(Lapse::Revival);
                }
                if record.flags.insert(Flag::AwaitReauth) {
                    record.note(now, "R-CHK-3", "await_reauth", "card unauthenticated: waits for re-authentication");
                }
            }
            PurposeKind::Wave | PurposeKind::ConfirmFirst | PurposeKind::Reauth => {}
        }
    }

    pub(crate) fn on_crawl_result(&mut self, result: CrawlResult, context: &mut Context) -> Result<(), Rejection> {
        let CrawlResult { request_id, card_id, ok, error, lines, next_from, .. } = result;
        let header = AnswerHeader { request_id: &request_id, card_id: &card_id, ok, error, next_from };
        let lines = lines.into_iter().map(Cow::Owned);
        self.on_crawl_answer(header, lines, context)
    }

    /// A `crawl_result`, its lines owned (an input) or borrowed (the simulated provider's, read in place).
    pub(crate) fn on_crawl_answer<'a>(
        &mut self,
        header: AnswerHeader<'_>,
        lines: impl ExactSizeIterator<Item = Cow<'a, StatementLine>>,
        context: &mut Context,
    ) -> Result<(), Rejection> {
        let AnswerHeader { request_id, card_id, ok, error, next_from } = header;
        let Some(card) = self.cards.get_mut(card_id) else {
            return Err(Rejection::new(Reason::UnknownCard, format!("card {card_id} is not the user's")));
        };
        if lines.len() > LINES_PER_RESULT_MAX {
            return Err(Rejection::new(Reason::InvalidTransition, format!("more than {LINES_PER_RESULT_MAX} lines")));
        }
        // R-CHK-1: answers with an unknown or already answered request id are ignored.
        let Some(kind) = card.requests.get(request_id).map(|request| request.kind.clone()) else { return Ok(()) };
        let page = Page::new(&card.bill, lines, &kind)?;
        let Some(request) = card.requests.remove(request_id) else { return Ok(()) };
        self.forget_request();
        let error = if ok { None } else { Some(error.unwrap_or(CrawlError::UpstreamBusy)) };
        self.on_answer(card_id, request, error, page, next_from, context);
        Ok(())
    }

    fn on_answer(
        &mut self,
        card_id: &str,
        request: Request,
        error: Option<CrawlError>,
        page: Page,
        next_from: Option<Timestamp>,
        context: &mut Context,
    ) {
        if error == Some(CrawlError::SessionExpired) {
            self.session_expired(card_id, context);
        }
        match request.kind {
            RequestKind::OrderCheck => self.on_check_answer(card_id, error, page, next_from, context),
            RequestKind::Reservoir => {
                if error.is_none() {
                    self.on_reservoir_answer(card_id, request.asked_at, page, context);
                }
                // R-CHK-3 / SPEC §7: a busy reservoir sync is skipped until the next interval.
            }
            RequestKind::Detail { txn_id, reason } => {
                let line = if error.is_none() { page.detail.filter(|line| line.txn_id == txn_id) } else { None };
                self.on_detail_answer(card_id, &txn_id, reason, line, request.asked_at, context);
            }
        }
    }

    fn on_check_answer(
        &mut self,
        card_id: &str,
        error: Option<CrawlError>,
        page: Page,
        next_from: Option<Timestamp>,
        context: &mut Context,
    ) {
        let now = context.effects.now;
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        let Some(mut flight) = card.check.in_flight.take() else {
            return;
        };
        if let Some(error) = error {
            for purpose in &flight.purposes {
                if let Some(sub) = purpose.sub {
                    let evidence = format!("{:?}: {error:?}", purpose.kind);
                    self.subs[sub].note(now, "R-CHK-3", "check_answered", evidence);
                }
            }
        }
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        match error {
            Some(CrawlError::SessionExpired) => {
                for purpose in flight.purposes {
                    self.skipped(purpose, context);
                }
                return;
            }
            Some(_) => {
                // R-CHK-3: busy (or a later page busy): the whole check is asked again after crawl_retry.
                let mut purposes = flight.purposes;
                purposes.append(&mut card.check.waiting);
                card.check.waiting = purposes;
                card.check.retry_scheduled = true;
                card.check.retry_generation += 1;
                let generation = card.check.retry_generation;
                let due = now.plus_seconds(context.config.crawl_retry_s);
                let timer = self.timer(AgentTimer::CrawlRetry { card_id: card_id.into(), generation });
                context.effects.schedule(due, timer);
                return;
            }
            None => {}
        }
        let page_full = page.count as u32 >= PAGE_LIMIT;
        let last_time = page.last_time;
        flight.lines.extend(page.lines);
        let upper = flight.asked_at.plus_seconds(context.config.window_slack_s);
        let more = card.provider == Provider::Phonepe
            && page_full
            && flight.pages < context.config.crawl_pages_max
            && last_time.is_some_and(|time| time <= upper);
        if let (true, Some(from)) = (more, next_from) {
            // R-CHK-2: the next page from next_from (inclusive); the check is processed once, at the end.
            flight.pages += 1;
            card.check.in_flight = Some(flight);
            self.send_request(card_id, CrawlMode::OrderCheck, Some(from), None, context);
            return;
        }
        let asked_at = flight.asked_at;
        self.apply_statement(card_id, flight.lines, asked_at, context);
        for purpose in &flight.purposes {
            self.after_check(card_id, *purpose, asked_at, context);
        }
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        if !card.check.waiting.is_empty() && !card.check.retry_scheduled && card.check.in_flight.is_none() {
            let waiting = std::mem::take(&mut card.check.waiting);
            self.ask_check(card_id, waiting, context);
        }
    }

    /// Merge, count ERRORED lines, match, then resolve pending lines (R-CHK-1, R-ERR-1, R-PEND-1).
    fn apply_statement(&mut self, card_id: &str, lines: Vec<Line>, check_time: Timestamp, context: &mut Context) {
        let changed = self.merge(card_id, lines);
        self.count_errored(context);
        self.run_matching(card_id, check_time, None, context);
        self.resolve_changed_lines(card_id, changed, context);
    }

    /// What a successful check that found nothing means for each purpose it counted for.
    fn after_check(&mut self, card_id: &str, purpose: Purpose, check_time: Timestamp, context: &mut Context) {
        let now = context.effects.now;
        if purpose.kind == PurposeKind::Reauth {
            return self.apply_lapses(card_id, check_time, context);
        }
        let Some(sub) = purpose.sub else { return };
        if !self.purpose_needed(&purpose) {
            return;
        }
        let record = &mut self.subs[sub];
        record.note(now, "R-CHK-1", "check_answered", Evidence::NothingFound { purpose: purpose.kind });
        match purpose.kind {
            PurposeKind::Close if record.state == SubState::Paying => {
                self.close_collection(sub, SubState::PaymentTimeout, "R-CLOSE-1", context);
            }
            // A found (under-paid) sub-order is past the user-submission rule and follows its flag's rule.
            // A found (or ambiguous: its lines are there, only undecided, R-MATCH-C3) sub-order is past the
            // user-submission rule.
            PurposeKind::ConfirmSecond if !self.subs[sub].found && !self.subs[sub].flags.contains(&Flag::Ambiguous) => {
                self.second_wave_found_nothing(sub, context)
            }
            PurposeKind::PayFinal => {
                self.subs[sub].note(now, "R-PAY-1", "pay_timeout", "final check found nothing".to_string());
                self.payout_returned(sub, SubState::PaymentTimeout, "R-PAY-1", context);
            }
            PurposeKind::Revival => {
                self.mark_history_exhausted(sub, check_time, context);
                self.end_revival(sub, "R-POST-1", "revival_missed", context);
            }
            PurposeKind::OperatorRetry => {
                // R-HIS-3: a miss leaves the sub-order in review.
                self.mark_history_exhausted(sub, check_time, context);
            }
            _ => {}
        }
    }

    /// R-WAVE-2's user-submission rule, unless a line found by the wave still waits for its IFSC detail
    /// (R-MATCH-P1): then the detail decides (another payee → the rule applies).
    fn second_wave_found_nothing(&mut self, sub: usize, context: &mut Context) {
        if self.subs[sub].awaiting_detail.is_some() {
            return; // the detail answer applies the rule if the line is another payee's
        }
        self.user_submission_missed(sub, context);
    }

    /// R-REAUTH-1: rules whose time lapsed while the card was unauthenticated apply as if their check had
    /// just found nothing; the user-submission rule wins over the pay timeout.
    fn apply_lapses(&mut self, card_id: &str, check_time: Timestamp, context: &mut Context) {
        let Some(card) = self.cards.get(card_id) else {
            return;
        };
        let lapsed: Vec<usize> =
            card.live_subs.iter().copied().filter(|sub| !self.subs[*sub].lapses.is_empty()).collect();
        for sub in lapsed {
            let record = &mut self.subs[sub];
            let lapses = std::mem::take(&mut record.lapses);
            if !record.state.is_live() || (record.found && !record.flags.contains(&Flag::Underpaid)) {
                continue;
            }
            record.note(context.effects.now, "R-REAUTH-1", "lapsed_rules", format!("{lapses:?}"));
            let ambiguous = record.flags.contains(&Flag::Ambiguous);
            if ambiguous && record.revived_from.is_none() {
                // R-MATCH-C3: an ambiguous sub-order stays in review; later checks re-evaluate it.
                continue;
            }
            if lapses.contains(&Lapse::SecondWave) && record.state == SubState::Reviewing && !record.found {
                self.second_wave_found_nothing(sub, context);
            } else if lapses.contains(&Lapse::Close) && record.kind == OrderKind::Collection && !record.found {
                if record.revived_from.is_some() {
                    self.end_revival(sub, "R-POST-1", "revival_missed", context);
                } else {
                    self.close_collection(sub, SubState::Cancelled, "R-REAUTH-1", context);
                }
            } else if lapses.contains(&Lapse::PayTimeout) && record.state == SubState::Paying {
                self.payout_returned(sub, SubState::PaymentTimeout, "R-REAUTH-1", context);
            } else if lapses.contains(&Lapse::Revival) && record.revived_from.is_some() {
                self.mark_history_exhausted(sub, check_time, context);
                self.end_revival(sub, "R-POST-1", "revival_missed", context);
            }
        }
    }

    /// R-CHK-3: the card becomes unauthenticated, one notification per episode, reviewing sub-orders
    /// wait with `await_reauth`, and checks falling due meanwhile are skipped.
    fn session_expired(&mut self, card_id: &str, context: &mut Context) {
        let now = context.effects.now;
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        card.auth = CardAuth::Unauthenticated;
        // A pending busy retry is void: no check is asked until re-authentication, which asks at once.
        card.check.retry_scheduled = false;
        let notify = !card.reauth_notified;
        card.reauth_notified = true;
        let waiting = std::mem::take(&mut card.check.waiting);
        let live: Vec<usize> = card.live_subs.iter().copied().collect();
        if notify {
            self.notify(
                NotificationKind::ReauthRequired,
                format!("Your wallet session for card {card_id} expired: please sign in to the wallet again."),
                context,
            );
        }
        for sub in live {
            let record = &mut self.subs[sub];
            if record.state == SubState::Reviewing && record.flags.insert(Flag::AwaitReauth) {
                record.note(now, "R-CHK-3", "await_reauth", format!("card {card_id} session expired"));
            }
        }
        for purpose in waiting {
            self.skipped(purpose, context);
        }
    }

    pub(crate) fn on_reauthenticated(&mut self, card_id: &str, context: &mut Context) -> Result<(), Rejection> {
        let now = context.effects.now;
        let Some(card) = self.cards.get_mut(card_id) else {
            return Err(Rejection::new(Reason::UnknownCard, format!("card {card_id} is not the user's")));
        };
        card.auth = CardAuth::Authenticated;
        card.reauth_notified = false;
        // Every sub-order of the card, final ones included (R-REAUTH-1: "await_reauth flags on it are
        // cleared"); re-authentication is rare, so scanning the agent's sub-orders is fine.
        for sub in 0..self.subs.len() {
            if self.subs[sub].card_id == card_id && self.subs[sub].flags.remove(&Flag::AwaitReauth) {
                self.subs[sub].note(now, "R-REAUTH-1", "reauthenticated", "await_reauth cleared".to_string());
            }
        }
        self.request_check(card_id, Purpose { sub: None, kind: PurposeKind::Reauth, generation: 0 }, context);
        Ok(())
    }

    /// R-PEND-1: a reservoir sync every interval, skipped while unauthenticated.
    fn reservoir_due(&mut self, card_id: &str, context: &mut Context) {
        let due = context.effects.now.plus_seconds(context.config.reservoir_interval_s);
        let timer = self.timer(AgentTimer::Reservoir { card_id: card_id.into() });
        context.effects.schedule(due, timer);
        let Some(card) = self.cards.get(card_id) else {
            return;
        };
        let outstanding = card.requests.values().any(|request| request.kind == RequestKind::Reservoir);
        if card.auth == CardAuth::Authenticated && !outstanding {
            self.send_request(card_id, CrawlMode::Reservoir, None, None, context);
        }
    }

    fn on_reservoir_answer(&mut self, card_id: &str, asked_at: Timestamp, page: Page, context: &mut Context) {
        let Page { lines, txn_ids, .. } = page;
        let page: rustc_hash::FxHashSet<Text> = txn_ids.into_iter().collect();
        self.apply_statement(card_id, lines, asked_at, context);
        // Matched lines still processing that the latest-50 page does not contain: one detail each.
        let Some(card) = self.cards.get(card_id) else {
            return;
        };
        let mut lookups = Vec::new();
        for sub in card.live_subs.iter().copied().filter(|sub| self.subs[*sub].flags.contains(&Flag::BillPending)) {
            for txn_id in &self.subs[sub].matched_txn_ids {
                let processing = card.bill.get(txn_id).is_some_and(|line| line.line.status == LineStatus::Processing);
                if processing && !page.contains(txn_id) {
                    lookups.push(txn_id.clone());
                }
            }
        }
        for txn_id in lookups {
            self.ask_detail(card_id, &txn_id, DetailReason::Pending, context);
        }
    }

    fn on_detail_answer(
        &mut self,
        card_id: &str,
        txn_id: &str,
        reason: DetailReason,
        line: Option<Line>,
        asked_at: Timestamp,
        context: &mut Context,
    ) {
        match reason {
            DetailReason::Pending => {
                if let Some(line) = line {
                    let changed = self.merge(card_id, vec![line]);
                    self.resolve_changed_lines(card_id, changed, context);
                }
            }
            DetailReason::Ifsc { sub } => self.on_ifsc_detail(card_id, sub, txn_id, line, asked_at, context),
        }
    }

    /// R-MATCH-P1 on a mobikwik card: the payee's IFSC against the line's detail.
    fn on_ifsc_detail(
        &mut self,
        card_id: &str,
        sub: usize,
        txn_id: &str,
        line: Option<Line>,
        asked_at: Timestamp,
        context: &mut Context,
    ) {
        let now = context.effects.now;
        if self.subs[sub].awaiting_detail.as_deref() == Some(txn_id) {
            self.release_reservation(sub);
        }
        // A detail without the payee's IFSC cannot verify it: the same as a failed detail.
        let Some(line) = line.filter(|line| line.payee_ifsc.is_some()) else {
            return self.ifsc_unverified(card_id, sub, txn_id, context);
        };
        let line_ifsc = line.payee_ifsc.clone();
        let changed = self.merge(card_id, vec![line]);
        let payee_ifsc = self.subs[sub].payee.as_ref().and_then(|payee| payee.ifsc.clone());
        let equal = match (payee_ifsc, line_ifsc) {
            (Some(payee), Some(line)) => payee.eq_ignore_ascii_case(&line),
            _ => false,
        };
        let used_by_sub =
            self.cards.get(card_id).and_then(|card| card.bill.get(txn_id)).and_then(|line| line.used_by) == Some(sub);
        let record = &mut self.subs[sub];
        record.flags.remove(&Flag::IfscUnverified);
        if equal {
            record.ifsc_verified.insert(txn_id.into());
            record.note(now, "R-MATCH-P1", "ifsc_verified", format!("txn {txn_id}"));
            if used_by_sub {
                self.evaluate_payout(sub, context);
            } else if record.state.is_live() {
                self.run_matching(card_id, asked_at, Some(sub), context);
            }
        } else {
            record.ifsc_mismatch.insert(txn_id.into());
            record.note(now, "R-MATCH-P1", "ifsc_mismatch", format!("txn {txn_id}: not this payee"));
            if used_by_sub {
                record.matched_txn_ids.retain(|txn| txn != txn_id);
                record.found = !record.matched_txn_ids.is_empty();
                if let Some(line) = self.cards.get_mut(card_id).and_then(|card| card.bill.get_mut(txn_id)) {
                    line.used_by = None;
                }
                self.refresh_paid_total(sub);
            }
            // The second wave found nothing but this line, which turned out not to be the payee's (or it
            // passed while the line stood unverified): the user-submission rule applies now (R-WAVE-2).
            let record = &mut self.subs[sub];
            if record.second_wave_passed && !record.found && record.state == SubState::Reviewing {
                self.user_submission_missed(sub, context);
            }
        }
        self.resolve_changed_lines(card_id, changed, context);
    }

    /// A failed detail: `found`, review with `ifsc_unverified`, retried every detail_retry (R-MATCH-P1).
    fn ifsc_unverified(&mut self, card_id: &str, sub: usize, txn_id: &str, context: &mut Context) {
        let now = context.effects.now;
        if !self.subs[sub].state.is_live() {
            return;
        }
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        let Some(line) = card.bill.get_mut(txn_id) else {
            return;
        };
        if line.used_by.is_none() {
            line.used_by = Some(sub);
            self.subs[sub].matched_txn_ids.push(txn_id.into());
        } else if line.used_by != Some(sub) {
            return;
        }
        // SPEC §4: paid_total sums the matched lines with status success, verified or not.
        self.refresh_paid_total(sub);
        let record = &mut self.subs[sub];
        record.found = true;
        record.flags.insert(Flag::IfscUnverified);
        record.note(now, "R-MATCH-P1", "ifsc_unverified", format!("txn {txn_id}: detail unavailable"));
        self.set_state(sub, SubState::Reviewing);
        let due = now.plus_seconds(context.config.detail_retry_s);
        context.effects.schedule(due, self.timer(AgentTimer::DetailRetry { sub }));
    }

    fn detail_retry_due(&mut self, sub: usize, context: &mut Context) {
        let record = &self.subs[sub];
        if !record.state.is_live() || !record.flags.contains(&Flag::IfscUnverified) {
            return;
        }
        let card_id = record.card_id.clone();
        let unverified = record.matched_txn_ids.iter().rev().find(|txn| !record.ifsc_verified.contains(*txn)).cloned();
        let Some(txn_id) = unverified else { return };
        if self.card_authenticated(&card_id) {
            self.ask_detail(&card_id, &txn_id, DetailReason::Ifsc { sub }, context);
        } else {
            let due = context.effects.now.plus_seconds(context.config.detail_retry_s);
            context.effects.schedule(due, self.timer(AgentTimer::DetailRetry { sub }));
        }
    }

    /// Bill-table lookup first, then a live check unless the history is exhausted (R-POST-1, R-HIS-2,
    /// R-HIS-3).
    pub(crate) fn look_then_check(&mut self, sub: usize, purpose: PurposeKind, context: &mut Context) {
        let now = context.effects.now;
        let card_id = self.subs[sub].card_id.clone();
        // The lookup runs the match rules over every open sub-order of the card, so that C3's counts
        // (k, n) include the others and a revival cannot take a line they are ambiguous about.
        self.run_matching(&card_id, now, None, context);
        let record = &mut self.subs[sub];
        if record.found || !record.state.is_live() {
            return;
        }
        if purpose == PurposeKind::Revival && record.flags.contains(&Flag::HisExhausted) {
            record.note(now, "R-HIS-2", "bill_table_miss", "history exhausted: no live check".to_string());
            return self.end_revival(sub, "R-POST-1", "revival_missed", context);
        }
        self.request_check(&card_id, Purpose { sub: Some(sub), kind: purpose, generation: 0 }, context);
    }
}

/// What a `crawl_result` says besides its lines.
pub(crate) struct AnswerHeader<'a> {
    pub request_id: &'a str,
    pub card_id: &'a str,
    pub ok: bool,
    pub error: Option<CrawlError>,
    pub next_from: Option<Timestamp>,
}

/// One provider answer, reduced to what the bill table needs: lines it does not know yet or whose
/// status (or UTR, or IFSC) is new. A provider page repeats the same latest lines at every check, so this
/// keeps a check's cost proportional to what changed.
pub(crate) struct Page {
    /// New or changed lines, in the provider's order.
    pub lines: Vec<Line>,
    /// Lines the provider returned (R-CHK-2 paging decides on the full page).
    pub count: usize,
    /// Time of the provider's last line (R-CHK-2).
    pub last_time: Option<Timestamp>,
    /// Every txn id of the page, for reservoir syncs (R-PEND-1 detail lookups).
    pub txn_ids: Vec<Text>,
    /// The line of a detail answer.
    pub detail: Option<Line>,
}

impl Page {
    fn empty() -> Page {
        Page { lines: Vec::new(), count: 0, last_time: None, txn_ids: Vec::new(), detail: None }
    }

    /// Keeps the lines the bill table does not know in this state; a malformed amount among them refuses
    /// the whole answer (R-IN-1). Lines the table already holds unchanged are not parsed again.
    fn new<'a>(
        bill: &BillTable,
        mut raw: impl ExactSizeIterator<Item = Cow<'a, StatementLine>>,
        kind: &RequestKind,
    ) -> Result<Page, Rejection> {
        let parse = |line: &StatementLine| match crate::money::Money::parse(&line.amount) {
            Ok(amount) if !amount.is_negative() && amount <= crate::stages::amount_max() => Ok(amount),
            _ => Err(Rejection::new(
                Reason::InvalidAmount,
                format!("line {}: `{}` is not a valid amount", line.txn_id, line.amount),
            )),
        };
        let count = raw.len();
        if matches!(kind, RequestKind::Detail { .. }) {
            let Some(line) = raw.next() else { return Ok(Page::empty()) };
            let last_time = raw.last().map_or(line.time, |last| last.time);
            let detail = Some(Line::from_statement(parse(&line)?, line.into_owned()));
            return Ok(Page { detail, count, last_time: Some(last_time), ..Page::empty() });
        }
        let reservoir = matches!(kind, RequestKind::Reservoir);
        let mut txn_ids = Vec::new();
        let mut lines = Vec::new();
        let mut last_time = None;
        let mut near = None;
        for line in raw {
            last_time = Some(line.time);
            if reservoir {
                txn_ids.push(line.txn_id.clone());
            }
            // By (time, txn id) first, beside the previous line's slot: a page's lines are the table's
            // latest, found without a hash lookup; a txn id the provider re-timed is still found by id.
            let slot = bill.slot_at(near, line.time, &line.txn_id);
            near = slot.or(near);
            let known = slot.and_then(|slot| bill.at(slot)).or_else(|| bill.get(&line.txn_id));
            let unchanged = known.is_some_and(|known| {
                known.line.status == line.status
                    && !(known.line.utr.is_none() && line.utr.as_deref().is_some_and(|utr| !utr.is_empty()))
                    && line.payee_ifsc.is_none()
            });
            if !unchanged {
                let amount = parse(&line)?;
                lines.push(Line::from_statement(amount, line.into_owned()));
            }
        }
        Ok(Page { lines, count, last_time, txn_ids, detail: None })
    }
}

#[cfg(test)]
mod tests {
    //! A page check against the definition it optimises: a page line is kept unless the bill table holds
    //! its txn id with the same status and nothing new (UTR, IFSC), whichever way the lines arrive
    //! (borrowed from the simulated provider or owned by a `crawl_result`) and whatever their order.

    use super::*;
    use crate::input::Direction;
    use crate::money::Money;
    use proptest::prelude::*;

    fn seconds(value: i64) -> Timestamp {
        Timestamp::from_millis(1_700_000_000_000 + value * 1000)
    }

    fn statement_line(txn: u8, time: i64, status: LineStatus, utr: Option<&str>, ifsc: bool) -> StatementLine {
        StatementLine {
            txn_id: format!("t{txn}").into(),
            utr: utr.map(Text::from),
            utr_supported: true,
            direction: Direction::In,
            amount: "1.00".into(),
            status,
            time: seconds(time),
            // Some lines name their counterparty: a kept line carries it whether lent or owned.
            counterparty: crate::input::Counterparty {
                name: txn.is_multiple_of(3).then(|| format!("payer {txn}").into()),
                ..Default::default()
            }
            .into(),
            payee_ifsc: ifsc.then(|| "IFSC0001".into()),
        }
    }

    fn status(code: u8) -> LineStatus {
        [LineStatus::Success, LineStatus::Processing, LineStatus::Failed, LineStatus::Errored][usize::from(code % 4)]
    }

    /// The definition: by txn id alone.
    fn kept_by_definition(bill: &BillTable, line: &StatementLine) -> bool {
        !bill.get(&line.txn_id).is_some_and(|known| {
            known.line.status == line.status
                && !(known.line.utr.is_none() && line.utr.as_deref().is_some_and(|utr| !utr.is_empty()))
                && line.payee_ifsc.is_none()
        })
    }

    proptest! {
        #[test]
        fn a_page_keeps_exactly_the_new_and_changed_lines(
            known in proptest::collection::btree_map(0u8..60, (0i64..40, 0u8..4, any::<bool>()), 0..40),
            page in proptest::collection::vec((0u8..70, 0i64..45, 0u8..4, 0u8..3, any::<bool>()), 0..50),
            descending in any::<bool>(),
        ) {
            let mut bill = BillTable::default();
            for (txn, (time, code, with_utr)) in &known {
                let line = statement_line(*txn, *time, status(*code), with_utr.then_some("U1"), false);
                bill.insert(Line::from_statement(Money::from_rupees(1), line));
            }
            // Some known lines change in place after they were inserted, as a merge changes them.
            for (txn, (_, code, with_utr)) in known.iter().filter(|(txn, _)| *txn % 4 == 1) {
                if let Some(changed) = bill.get_mut(&format!("t{txn}")) {
                    changed.line.status = status(code + 1);
                    if !with_utr {
                        changed.line.utr = Some("U3".into());
                    }
                }
            }
            // A page: known lines (some re-timed, some changed), new lines; each txn id once.
            let mut seen = std::collections::BTreeSet::new();
            let mut raw: Vec<StatementLine> = page
                .into_iter()
                .filter(|(txn, ..)| seen.insert(*txn))
                .map(|(txn, time, code, utr, ifsc)| {
                    let time = match known.get(&txn) {
                        Some((known_time, ..)) if time % 5 != 0 => *known_time,
                        _ => time,
                    };
                    let utr = [None, Some(""), Some("U2")][usize::from(utr)];
                    statement_line(txn, time, status(code), utr, ifsc && code == 0)
                })
                .collect();
            raw.sort_by(|a, b| (a.time, &a.txn_id).cmp(&(b.time, &b.txn_id)));
            if descending {
                raw.reverse();
            }
            let expected: Vec<&StatementLine> = raw.iter().filter(|line| kept_by_definition(&bill, line)).collect();
            for kind in [RequestKind::OrderCheck, RequestKind::Reservoir] {
                let borrowed = Page::new(&bill, raw.iter().map(Cow::Borrowed), &kind).map_err(|r| TestCaseError::fail(format!("{r:?}")))?;
                let owned = Page::new(&bill, raw.clone().into_iter().map(Cow::Owned), &kind).map_err(|r| TestCaseError::fail(format!("{r:?}")))?;
                let kept: Vec<&Text> = borrowed.lines.iter().map(|line| &line.txn_id).collect();
                prop_assert_eq!(kept, expected.iter().map(|line| &line.txn_id).collect::<Vec<_>>());
                prop_assert_eq!(&borrowed.lines, &owned.lines);
                prop_assert_eq!(borrowed.count, raw.len());
                prop_assert_eq!((borrowed.count, borrowed.last_time), (owned.count, owned.last_time));
                prop_assert_eq!(borrowed.last_time, raw.last().map(|line| line.time));
                let txn_ids: Vec<Text> = match kind {
                    RequestKind::Reservoir => raw.iter().map(|line| line.txn_id.clone()).collect(),
                    _ => Vec::new(),
                };
                prop_assert_eq!(&borrowed.txn_ids, &txn_ids);
                prop_assert_eq!(&owned.txn_ids, &txn_ids);
            }
        }
    }
}
