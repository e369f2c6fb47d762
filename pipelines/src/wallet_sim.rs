//! The simulated statement provider of SPEC §9: wallet lines, status changes and faults per card, and
//! answers to `crawl_requested` after `crawl_latency`, as ordinary `crawl_result` inputs. Pure and
//! deterministic: replay uses it, and `paisa wallet-sim` serves the same answers over HTTP (SPEC §10).

use crate::input::{CrawlError, CrawlResult, Fault, LineStatus, StatementLine};
use crate::output::{CrawlMode, CrawlRequested, PageOrder};
use crate::time::Timestamp;
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Wallet lines kept per simulated card; the oldest are dropped beyond it.
pub const WALLET_LINES_PER_CARD_MAX: usize = 20_000;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProviderTimer {
    /// Answer a request at its due time.
    Answer(Box<CrawlRequested>),
}

#[derive(Clone, Debug, Default)]
struct SimCard {
    /// Lines by (time, txn id), with the time they were added (`wallet_line.at`).
    lines: BTreeMap<(Timestamp, Text), (Timestamp, Arc<StatementLine>)>,
    time_of: HashMap<Text, Timestamp>,
    fault: Option<Fault>,
}

/// One provider's wallets.
#[derive(Clone, Debug, Default)]
pub struct WalletSim {
    cards: HashMap<Text, SimCard>,
}

/// What the provider answers over HTTP (SPEC §10): a page, a detail, or an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Page { lines: Vec<Arc<StatementLine>>, next_from: Option<Timestamp> },
    Detail(Arc<StatementLine>),
    Error(CrawlError),
}

impl WalletSim {
    /// `wallet_line`: a new line, or a replacement of a known txn id.
    pub fn add_line(&mut self, card_id: &str, line: StatementLine, at: Timestamp) {
        let card = self.cards.entry(card_id.into()).or_default();
        if let Some(time) = card.time_of.remove(&line.txn_id) {
            card.lines.remove(&(time, line.txn_id.clone()));
        }
        card.time_of.insert(line.txn_id.clone(), line.time);
        card.lines.insert((line.time, line.txn_id.clone()), (at, Arc::new(line)));
        while card.lines.len() > WALLET_LINES_PER_CARD_MAX {
            if let Some(((_, txn_id), _)) = card.lines.pop_first() {
                card.time_of.remove(&txn_id);
            }
        }
    }

    /// `wallet_line_status`: ignored for an unknown transaction (SPEC §7 edge decisions).
    pub fn set_status(&mut self, card_id: &str, txn_id: &str, status: LineStatus) {
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        let Some(time) = card.time_of.get(txn_id) else {
            return;
        };
        if let Some((_, line)) = card.lines.get_mut(&(*time, txn_id.into())) {
            Arc::make_mut(line).status = status;
        }
    }

    /// `wallet_fault`: lasts until the card's next fault event.
    pub fn set_fault(&mut self, card_id: &str, fault: Fault) {
        self.cards.entry(card_id.into()).or_default().fault = (fault != Fault::None).then_some(fault);
    }

    /// The answer to `request` at time `now`, from lines whose `at` and `time` are not later than `now`.
    pub fn answer(&self, request: &CrawlRequested, now: Timestamp) -> Answer {
        let card = self.cards.get(&request.card_id);
        match card.and_then(|card| card.fault) {
            Some(Fault::SessionExpired) => return Answer::Error(CrawlError::SessionExpired),
            Some(Fault::UpstreamBusy) => return Answer::Error(CrawlError::UpstreamBusy),
            Some(Fault::DetailUnavailable) if request.mode == CrawlMode::Detail => {
                return Answer::Error(CrawlError::DetailUnavailable)
            }
            _ => {}
        }
        let visible = card
            .into_iter()
            .flat_map(|card| card.lines.values())
            .filter(move |(added_at, line)| *added_at <= now && line.time <= now)
            .map(|(_, line)| line);
        if request.mode == CrawlMode::Detail {
            let txn_id = request.txn_id.as_deref().unwrap_or_default();
            return match visible.into_iter().find(|line| line.txn_id == txn_id) {
                Some(line) => Answer::Detail(line.clone()),
                None => Answer::Error(CrawlError::DetailUnavailable),
            };
        }
        let limit = request.limit.unwrap_or(50) as usize;
        // List answers do not show the payee's IFSC (only detail answers do, SPEC §5).
        let strip = |line: &Arc<StatementLine>| match line.payee_ifsc {
            Some(_) => Arc::new(StatementLine { payee_ifsc: None, ..StatementLine::clone(line) }),
            None => Arc::clone(line),
        };
        let lines: Vec<Arc<StatementLine>> = match request.order {
            Some(PageOrder::Asc) => {
                let from = request.from.unwrap_or_default();
                card.into_iter()
                    .flat_map(|card| card.lines.range((from, Text::const_new(""))..).map(|(_, entry)| entry))
                    .filter(|(added_at, line)| *added_at <= now && line.time <= now)
                    .map(|(_, line)| line)
                    .take(limit)
                    .map(strip)
                    .collect()
            }
            _ => visible.rev().take(limit).map(strip).collect(),
        };
        let next_from = (lines.len() == limit).then(|| lines.last().map(|line| line.time)).flatten();
        Answer::Page { lines, next_from }
    }

    /// The `crawl_result` input carrying the answer.
    pub fn result(&self, request: &CrawlRequested, now: Timestamp) -> CrawlResult {
        self.answer(request, now).into_result(request)
    }
}

impl Answer {
    /// The `crawl_result` input carrying this answer to `request` (replay's provider and the HTTP
    /// connector both answer through it).
    pub fn into_result(self, request: &CrawlRequested) -> CrawlResult {
        let (ok, error, lines, next_from) = match self {
            Answer::Page { lines, next_from } => (true, None, lines, next_from),
            Answer::Detail(line) => (true, None, vec![line], None),
            Answer::Error(error) => (false, Some(error), Vec::new(), None),
        };
        CrawlResult {
            request_id: request.request_id.clone(),
            user_id: request.user_id.clone(),
            card_id: request.card_id.clone(),
            ok,
            error,
            lines,
            next_from,
        }
    }
}
