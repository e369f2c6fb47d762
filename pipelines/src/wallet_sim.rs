//! The simulated statement provider of SPEC §9: wallet lines, status changes and faults per card, and
//! answers to `crawl_requested` after `crawl_latency`, as ordinary `crawl_result` inputs. Pure and
//! deterministic: replay uses it, and `paisa wallet-sim` serves the same answers over HTTP (SPEC §10).

use crate::input::{CrawlError, CrawlResult, Fault, LineStatus, StatementLine};
use crate::output::{CrawlMode, CrawlRequested, PageOrder};
use crate::time::Timestamp;
use crate::time_ordered::{TimeKeyed, TimeOrdered};
use crate::Text;

/// Wallet lines kept per simulated card; the oldest are dropped beyond it.
pub const WALLET_LINES_PER_CARD_MAX: usize = 20_000;
/// Changes kept per simulated card where the provider keeps them ([`WalletSim::keeping_history`]); an
/// answer as of a time before the oldest kept change shows that change as made.
pub const WALLET_CHANGES_PER_CARD_MAX: usize = 1_000;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProviderTimer {
    /// Answer a request at its due time.
    Answer(Box<CrawlRequested>),
}

/// One wallet line as the provider keeps it: inline in its card's deque, so that a page reads one
/// card's latest lines from neighbouring memory (a check asks for a page of up to 50 lines each time).
#[derive(Clone, Debug)]
struct SimLine {
    /// When the line was added (`wallet_line.at`): it is visible from then on.
    added_at: Timestamp,
    /// The line as a list answer shows it: without the payee's IFSC (SPEC §5).
    listed: StatementLine,
    /// The payee's IFSC, which only a detail answer shows.
    payee_ifsc: Option<Text>,
    /// `listed` as JSON, written when this version of the line is made, by a provider that encodes its
    /// lines ([`WalletSim::serving_http`]); None otherwise. Why: a line is shown by many pages (a check
    /// asks the latest 50 lines), and encoding each page's lines again was ≈ 30 % of `paisa
    /// wallet-sim`'s own code in the serve benchmark (a page of 30 lines took 6.8 µs, 2.1 µs from the
    /// cached text). Shared, so that the copy of a card as it was ([`SimCard::as_of`]) copies no text.
    listed_json: Option<std::sync::Arc<str>>,
}

impl SimLine {
    fn new(mut line: StatementLine, added_at: Timestamp, encode: bool) -> SimLine {
        let payee_ifsc = line.payee_ifsc.take();
        let mut line = SimLine { added_at, listed: line, payee_ifsc, listed_json: None };
        if encode {
            line.encode();
        }
        line
    }

    /// Writes `listed_json` for the line as it is now. A line that cannot be encoded keeps none, and
    /// [`SimLine::listed_json`] then reports the error when the line is shown.
    fn encode(&mut self) {
        self.listed_json = serde_json::to_string(&self.listed).ok().map(std::sync::Arc::from);
    }

    /// Sets the line's status and, where the provider encodes its lines, its JSON; returns the status
    /// it had.
    fn set_status(&mut self, status: LineStatus, encode: bool) -> LineStatus {
        let previous = std::mem::replace(&mut self.listed.status, status);
        if previous != status {
            self.listed_json = None;
            if encode {
                self.encode();
            }
        }
        previous
    }

    /// `listed` as JSON: the text written with this version of the line, or written now.
    fn listed_json(&self) -> serde_json::Result<std::borrow::Cow<'_, str>> {
        match &self.listed_json {
            Some(json) => Ok(std::borrow::Cow::Borrowed(json)),
            None => serde_json::to_string(&self.listed).map(std::borrow::Cow::Owned),
        }
    }

    fn visible_at(&self, now: Timestamp) -> bool {
        self.added_at <= now && self.listed.time <= now
    }

    /// The line as a detail answer shows it, with the payee's IFSC.
    fn full(&self) -> StatementLine {
        StatementLine { payee_ifsc: self.payee_ifsc.clone(), ..self.listed.clone() }
    }
}

impl TimeKeyed for SimLine {
    fn time(&self) -> Timestamp {
        self.listed.time
    }

    fn txn_id(&self) -> &Text {
        &self.listed.txn_id
    }
}

#[derive(Clone, Debug, Default)]
struct SimCard {
    /// Lines ordered by (time, txn id), one per txn id; the oldest leave from the front beyond the cap.
    lines: TimeOrdered<SimLine>,
    fault: Option<Fault>,
    /// What changes overwrote, oldest first (kept only by [`WalletSim::keeping_history`]).
    changes: std::collections::VecDeque<Change>,
    /// The latest time among `changes` (an answer as of it or later shows the card as it is).
    latest_change_at: Option<Timestamp>,
}

/// A change to a card, with what it overwrote, so that the card can be shown as it was before.
#[derive(Clone, Debug)]
enum Change {
    /// `wallet_line` replaced a line of the same txn id.
    Replaced { at: Timestamp, previous: SimLine },
    /// `wallet_line_status` changed a line's status.
    Status { at: Timestamp, txn_id: Text, previous: LineStatus },
    /// `wallet_fault` changed the card's fault.
    Fault { at: Timestamp, previous: Option<Fault> },
}

impl Change {
    fn at(&self) -> Timestamp {
        match self {
            Change::Replaced { at, .. } | Change::Status { at, .. } | Change::Fault { at, .. } => *at,
        }
    }
}

impl SimCard {
    fn note(&mut self, change: Change) {
        let at = change.at();
        self.latest_change_at = Some(self.latest_change_at.map_or(at, |latest| latest.max(at)));
        self.changes.push_back(change);
        while self.changes.len() > WALLET_CHANGES_PER_CARD_MAX {
            self.changes.pop_front();
        }
    }

    /// The card as it was at `now`: what changes stamped later overwrote, put back, latest first. None
    /// when no kept change is later (the card then is the card now). `encode`: whether lines whose
    /// status is put back get their JSON written again ([`SimLine::listed_json`]).
    fn as_of(&self, now: Timestamp, encode: bool) -> Option<SimCard> {
        if self.latest_change_at.is_none_or(|latest| latest <= now) {
            return None;
        }
        let mut past = SimCard { lines: self.lines.clone(), fault: self.fault, ..SimCard::default() };
        for change in self.changes.iter().rev().filter(|change| change.at() > now) {
            match change {
                Change::Replaced { previous, .. } => {
                    past.lines.insert(previous.clone());
                }
                Change::Status { txn_id, previous, .. } => {
                    if let Some(line) = past.lines.find_mut(txn_id) {
                        line.set_status(*previous, encode);
                    }
                }
                Change::Fault { previous, .. } => past.fault = *previous,
            }
        }
        Some(past)
    }
}

/// An answer whose page lines are borrowed from the provider (see [`WalletSim::view`]).
pub type View<'a> = Shown<&'a StatementLine>;

/// An answer whose page lines are whatever the provider shows of its own lines: the lines as listed
/// ([`View`]), or the provider's records of them, which carry their JSON ([`WalletSim::body_as_of`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Shown<L> {
    Page { lines: Vec<L>, next_from: Option<Timestamp> },
    Detail(StatementLine),
    Error(CrawlError),
}

/// One provider's wallets.
#[derive(Clone, Debug, Default)]
pub struct WalletSim {
    cards: crate::keyed::KeyedMap<SimCard>,
    /// Whether each card keeps what its changes overwrote, for [`WalletSim::answer_as_of`].
    keeps_history: bool,
    /// Whether each line's JSON is written with it, for [`WalletSim::body_as_of`].
    encodes_lines: bool,
}

/// What the provider answers over HTTP (SPEC §10): a page, a detail, or an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Page { lines: Vec<StatementLine>, next_from: Option<Timestamp> },
    Detail(StatementLine),
    Error(CrawlError),
}

impl WalletSim {
    /// A provider whose cards keep what status changes, faults and replaced lines overwrote (at most
    /// [`WALLET_CHANGES_PER_CARD_MAX`] per card), so that [`WalletSim::answer_as_of`] can show a card
    /// as it was. Why: `paisa wallet-sim` on an event clock may be sent statements ahead of the
    /// pipeline, and answers each crawl as of its event time. Replay's provider keeps none: it applies
    /// each event in time order, so its cards are always as of the answer's time.
    pub fn keeping_history() -> WalletSim {
        WalletSim { keeps_history: true, ..WalletSim::default() }
    }

    /// The provider of `paisa wallet-sim`: keeping its history ([`WalletSim::keeping_history`]) and
    /// each line's JSON, written once per version of the line for every page that shows it
    /// ([`WalletSim::body_as_of`]).
    pub fn serving_http() -> WalletSim {
        WalletSim { keeps_history: true, encodes_lines: true, ..WalletSim::default() }
    }

    /// `wallet_line`: a new line, or a replacement of a known txn id.
    pub fn add_line(&mut self, card_id: &str, line: StatementLine, at: Timestamp) {
        let card = self.cards.get_or_insert_with(card_id, SimCard::default);
        let replaced = card.lines.insert(SimLine::new(line, at, self.encodes_lines));
        if let Some(previous) = replaced.filter(|_| self.keeps_history) {
            card.note(Change::Replaced { at, previous });
        }
        while card.lines.len() > WALLET_LINES_PER_CARD_MAX {
            card.lines.pop_front();
        }
    }

    /// Asks the CPU to bring the entry of `card_id` (the next input's card; no effect on any answer).
    pub fn prefetch(&self, card_id: &str) {
        self.cards.prefetch(card_id);
    }

    /// `wallet_line_status` at `at`: ignored for an unknown transaction (SPEC §7 edge decisions).
    pub fn set_status(&mut self, card_id: &str, txn_id: &str, status: LineStatus, at: Timestamp) {
        let Some(card) = self.cards.get_mut(card_id) else {
            return;
        };
        let Some(line) = card.lines.find_mut(txn_id) else {
            return;
        };
        let previous = line.set_status(status, self.encodes_lines);
        if self.keeps_history && previous != status {
            card.note(Change::Status { at, txn_id: txn_id.into(), previous });
        }
    }

    /// `wallet_fault` at `at`: lasts until the card's next fault event.
    pub fn set_fault(&mut self, card_id: &str, fault: Fault, at: Timestamp) {
        let card = self.cards.get_or_insert_with(card_id, SimCard::default);
        let previous = std::mem::replace(&mut card.fault, (fault != Fault::None).then_some(fault));
        if self.keeps_history && previous != card.fault {
            card.note(Change::Fault { at, previous });
        }
    }

    /// [`WalletSim::answer`] from the card as it was at `now`: with the status, fault and line versions
    /// of then, where the provider keeps its history ([`WalletSim::keeping_history`]; otherwise, and
    /// when nothing changed after `now`, the same as [`WalletSim::answer`]). Changes are undone latest
    /// first by the order they were made in; a change stamped before a later-undone one but made after
    /// it on the same line (events posted out of time order) is undone with it.
    pub fn answer_as_of(&self, request: &CrawlRequested, now: Timestamp) -> Answer {
        let card = self.cards.get(&request.card_id);
        let past = card.and_then(|card| card.as_of(now, false));
        card_view(past.as_ref().or(card), request, now).into()
    }

    /// [`WalletSim::answer_as_of`] as the body SPEC §10 answers it with over HTTP: a page
    /// (`{"transactions":[…],"next_from":…}`) or a detail's line as JSON, or the error. Each line's
    /// JSON is written once per version of the line where the provider encodes its lines
    /// ([`WalletSim::serving_http`]), and copied into every page that shows it.
    pub fn body_as_of(&self, request: &CrawlRequested, now: Timestamp) -> serde_json::Result<Body> {
        let card = self.cards.get(&request.card_id);
        let past = card.and_then(|card| card.as_of(now, self.encodes_lines));
        body_of(card_lines(past.as_ref().or(card), request, now, |line| line))
    }

    /// The answer to `request` at time `now`, from lines whose `at` and `time` are not later than `now`.
    pub fn answer(&self, request: &CrawlRequested, now: Timestamp) -> Answer {
        self.view(request, now).into()
    }

    /// The answer to `request` at time `now`, its page lines borrowed from the provider: replay reads
    /// them in place and copies only the lines the agent's bill table does not hold yet.
    pub fn view(&self, request: &CrawlRequested, now: Timestamp) -> View<'_> {
        card_view(self.cards.get(&request.card_id), request, now)
    }

    /// The `crawl_result` input carrying the answer.
    pub fn result(&self, request: &CrawlRequested, now: Timestamp) -> CrawlResult {
        self.answer(request, now).into_result(request)
    }
}

/// An answer as the body SPEC §10 gives it over HTTP ([`WalletSim::body_as_of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A page or a detail's line, as JSON.
    Json(Vec<u8>),
    Error(CrawlError),
}

/// The answer to `request` at time `now` from `card` (None: a card the provider does not know), its page
/// lines borrowed from the card.
fn card_view<'a>(card: Option<&'a SimCard>, request: &CrawlRequested, now: Timestamp) -> View<'a> {
    card_lines(card, request, now, |line| &line.listed)
}

/// The page's body: the JSON a derived `Serialize` of `{ transactions, next_from }` writes, each line's
/// text its cached JSON ([`SimLine::listed_json`]).
fn body_of(shown: Shown<&SimLine>) -> serde_json::Result<Body> {
    match shown {
        Shown::Page { lines, next_from } => {
            let texts = lines.iter().map(|line| line.listed_json()).collect::<serde_json::Result<Vec<_>>>()?;
            let lines_bytes: usize = texts.iter().map(|text| text.len() + 1).sum();
            let mut body = Vec::with_capacity(lines_bytes + 64);
            body.extend_from_slice(br#"{"transactions":["#);
            for (index, text) in texts.iter().enumerate() {
                if index > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(text.as_bytes());
            }
            body.extend_from_slice(br#"],"next_from":"#);
            serde_json::to_writer(&mut body, &next_from)?;
            body.push(b'}');
            Ok(Body::Json(body))
        }
        Shown::Detail(line) => Ok(Body::Json(serde_json::to_vec(&line)?)),
        Shown::Error(error) => Ok(Body::Error(error)),
    }
}

/// The answer to `request` at time `now` from `card`, each page line as `show` makes it of the card's line.
fn card_lines<'a, L>(
    card: Option<&'a SimCard>,
    request: &CrawlRequested,
    now: Timestamp,
    show: impl Fn(&'a SimLine) -> L,
) -> Shown<L> {
    match card.and_then(|card| card.fault) {
        Some(Fault::SessionExpired) => return Shown::Error(CrawlError::SessionExpired),
        Some(Fault::UpstreamBusy) => return Shown::Error(CrawlError::UpstreamBusy),
        Some(Fault::DetailUnavailable) if request.mode == CrawlMode::Detail => {
            return Shown::Error(CrawlError::DetailUnavailable)
        }
        _ => {}
    }
    let Some(card) = card else {
        return match request.mode {
            CrawlMode::Detail => Shown::Error(CrawlError::DetailUnavailable),
            _ => Shown::Page { lines: Vec::new(), next_from: None },
        };
    };
    if request.mode == CrawlMode::Detail {
        let txn_id = request.txn_id.as_deref().unwrap_or_default();
        return match card.lines.find(txn_id) {
            Some(line) if line.visible_at(now) => Shown::Detail(line.full()),
            _ => Shown::Error(CrawlError::DetailUnavailable),
        };
    }
    let limit = request.limit.unwrap_or(50) as usize;
    let visible = |line: &&SimLine| line.visible_at(now);
    // List answers do not show the payee's IFSC (only detail answers do, SPEC §5).
    // Room for the whole page at once (at most the card's lines, which are capped): filtered, the lines'
    // count is unknown to `collect`, which allocated four and grew them four times for a page of 50
    // (≈ 1.3 % of the engine benchmark's instructions, callgrind).
    let mut lines: Vec<L> = Vec::with_capacity(limit.min(card.lines.len()));
    let mut last_time = None;
    let mut shown = |line: &'a SimLine| {
        last_time = Some(line.listed.time);
        show(line)
    };
    match request.order {
        Some(PageOrder::Asc) => {
            let from = request.from.unwrap_or_default();
            let start = card.lines.first_at_or_after(from);
            lines.extend(card.lines.range_from(start).filter(visible).take(limit).map(&mut shown));
        }
        _ => lines.extend(card.lines.iter().rev().filter(visible).take(limit).map(&mut shown)),
    }
    let next_from = if lines.len() == limit { last_time } else { None };
    Shown::Page { lines, next_from }
}

impl From<View<'_>> for Answer {
    fn from(view: View<'_>) -> Answer {
        match view {
            View::Page { lines, next_from } => Answer::Page { lines: lines.into_iter().cloned().collect(), next_from },
            View::Detail(line) => Answer::Detail(line),
            View::Error(error) => Answer::Error(error),
        }
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

#[cfg(test)]
mod tests {
    //! The provider against a model: the ordered map it used to be (every line by (time, txn id), a page
    //! read by filtering and copying), under random additions, replacements, status changes and answers.

    use super::*;
    use crate::input::{Direction, Provider};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A card's lines by (time, txn id), each with the time it was added.
    type ModelCard = BTreeMap<(Timestamp, Text), (Timestamp, StatementLine)>;

    #[derive(Default)]
    struct Model {
        cards: BTreeMap<u8, ModelCard>,
    }

    impl Model {
        fn add_line(&mut self, card: u8, line: StatementLine, at: Timestamp) {
            let lines = self.cards.entry(card).or_default();
            lines.retain(|(_, txn_id), _| *txn_id != line.txn_id);
            lines.insert((line.time, line.txn_id.clone()), (at, line));
        }

        fn set_status(&mut self, card: u8, txn_id: &str, status: LineStatus) {
            let lines = self.cards.entry(card).or_default();
            for (_, line) in lines.values_mut().filter(|(_, line)| line.txn_id == txn_id) {
                line.status = status;
            }
        }

        fn answer(&self, card: u8, request: &CrawlRequested, now: Timestamp) -> Answer {
            let empty = BTreeMap::new();
            let lines = self.cards.get(&card).unwrap_or(&empty);
            let visible: Vec<&StatementLine> = lines
                .values()
                .filter(|(added_at, line)| *added_at <= now && line.time <= now)
                .map(|(_, line)| line)
                .collect();
            if request.mode == CrawlMode::Detail {
                return match visible.iter().find(|line| Some(&line.txn_id) == request.txn_id.as_ref()) {
                    Some(line) => Answer::Detail(StatementLine::clone(line)),
                    None => Answer::Error(CrawlError::DetailUnavailable),
                };
            }
            let limit = request.limit.unwrap_or(50) as usize;
            let strip = |line: &&StatementLine| StatementLine { payee_ifsc: None, ..StatementLine::clone(line) };
            let page: Vec<StatementLine> = match request.order {
                Some(PageOrder::Asc) => {
                    let from = request.from.unwrap_or_default();
                    visible.iter().filter(|line| line.time >= from).take(limit).map(strip).collect()
                }
                _ => visible.iter().rev().take(limit).map(strip).collect(),
            };
            let next_from = (page.len() == limit).then(|| page.last().map(|line| line.time)).flatten();
            Answer::Page { lines: page, next_from }
        }
    }

    #[derive(Clone, Debug)]
    enum Operation {
        Add { card: u8, txn: u8, time: i64, delay: i64, ifsc: bool },
        Status { card: u8, txn: u8, failed: bool },
        Ask { card: u8, mode: u8, from: i64, limit: u32, txn: u8, lag: i64 },
    }

    fn operation() -> impl Strategy<Value = Operation> {
        prop_oneof![
            3 => (0u8..2, 0u8..12, 0i64..30, 0i64..5, any::<bool>())
                .prop_map(|(card, txn, time, delay, ifsc)| Operation::Add { card, txn, time, delay, ifsc }),
            1 => (0u8..2, 0u8..12, any::<bool>()).prop_map(|(card, txn, failed)| Operation::Status { card, txn, failed }),
            2 => (0u8..3, 0u8..4, 0i64..30, 1u32..6, 0u8..12, -5i64..5)
                .prop_map(|(card, mode, from, limit, txn, lag)| Operation::Ask { card, mode, from, limit, txn, lag }),
        ]
    }

    /// The body `paisa wallet-sim` answered with before [`WalletSim::body_as_of`]: the answer encoded by
    /// serde, a page as a derived `{ transactions, next_from }`.
    fn body_of_answer(answer: Answer) -> Body {
        #[derive(serde::Serialize)]
        struct PageBody {
            transactions: Vec<StatementLine>,
            next_from: Option<Timestamp>,
        }
        match answer {
            Answer::Page { lines, next_from } => {
                Body::Json(serde_json::to_vec(&PageBody { transactions: lines, next_from }).expect("encodes"))
            }
            Answer::Detail(line) => Body::Json(serde_json::to_vec(&line).expect("encodes")),
            Answer::Error(error) => Body::Error(error),
        }
    }

    #[test]
    fn a_lines_json_is_written_again_once_its_status_changes() {
        let mut sim = WalletSim::serving_http();
        sim.add_line("c0", line(1, 1, true), seconds(1));
        let ask = request(0, 2, 0, 5, 1);
        let shown = |sim: &WalletSim, now: i64| match sim.body_as_of(&ask, seconds(now)).expect("encodes") {
            Body::Json(json) => String::from_utf8(json).expect("UTF-8"),
            Body::Error(error) => panic!("a page, not {error:?}"),
        };
        assert!(shown(&sim, 5).contains(r#""status":"success""#), "{}", shown(&sim, 5));
        sim.set_status("c0", "t1", LineStatus::Failed, seconds(6));
        assert!(shown(&sim, 7).contains(r#""status":"failed""#), "{}", shown(&sim, 7));
        // As of before the change, the line shows the status it had then, and now the one it has.
        assert!(shown(&sim, 5).contains(r#""status":"success""#), "{}", shown(&sim, 5));
        assert!(shown(&sim, 7).contains(r#""status":"failed""#), "{}", shown(&sim, 7));
        assert!(!shown(&sim, 7).contains("IFSC0001"), "a page does not show the payee's IFSC");
    }

    fn seconds(value: i64) -> Timestamp {
        Timestamp::from_millis(1_700_000_000_000 + value * 1000)
    }

    fn line(txn: u8, time: i64, ifsc: bool) -> StatementLine {
        StatementLine {
            txn_id: format!("t{txn}").into(),
            utr: None,
            utr_supported: true,
            direction: Direction::In,
            amount: "1.00".into(),
            status: LineStatus::Success,
            time: seconds(time),
            counterparty: Default::default(),
            payee_ifsc: ifsc.then(|| "IFSC0001".into()),
        }
    }

    fn request(card: u8, mode: u8, from: i64, limit: u32, txn: u8) -> CrawlRequested {
        let (mode, order) = match mode {
            0 => (CrawlMode::OrderCheck, None),
            1 => (CrawlMode::Reservoir, Some(PageOrder::Asc)),
            2 => (CrawlMode::OrderCheck, Some(PageOrder::Desc)),
            _ => (CrawlMode::Detail, None),
        };
        CrawlRequested {
            request_id: "r".into(),
            user_id: "u".into(),
            card_id: format!("c{card}").into(),
            provider: Provider::Phonepe,
            mode,
            order,
            from: Some(seconds(from)),
            limit: Some(limit),
            txn_id: Some(format!("t{txn}").into()),
        }
    }

    proptest! {
        #[test]
        fn answers_as_an_ordered_map_would(operations in proptest::collection::vec(operation(), 1..80)) {
            let (mut sim, mut model) = (WalletSim::default(), Model::default());
            // The same provider writing each line's JSON with it: its pages read the same.
            let mut encoding = WalletSim { encodes_lines: true, ..WalletSim::default() };
            let mut clock = 0i64;
            for operation in operations {
                clock += 1;
                match operation {
                    Operation::Add { card, txn, time, delay, ifsc } => {
                        let at = seconds(clock + delay);
                        sim.add_line(&format!("c{card}"), line(txn, time, ifsc), at);
                        encoding.add_line(&format!("c{card}"), line(txn, time, ifsc), at);
                        model.add_line(card, line(txn, time, ifsc), at);
                    }
                    Operation::Status { card, txn, failed } => {
                        let status = if failed { LineStatus::Failed } else { LineStatus::Processing };
                        sim.set_status(&format!("c{card}"), &format!("t{txn}"), status, seconds(clock));
                        encoding.set_status(&format!("c{card}"), &format!("t{txn}"), status, seconds(clock));
                        model.set_status(card, &format!("t{txn}"), status);
                    }
                    Operation::Ask { card, mode, from, limit, txn, lag } => {
                        let request = request(card, mode, from, limit, txn);
                        let now = seconds(clock + lag);
                        let expected = model.answer(card, &request, now);
                        prop_assert_eq!(sim.body_as_of(&request, now).expect("encodes"), body_of_answer(expected.clone()));
                        prop_assert_eq!(encoding.body_as_of(&request, now).expect("encodes"), body_of_answer(expected.clone()));
                        prop_assert_eq!(sim.answer(&request, now), expected);
                    }
                }
            }
        }
    }

    /// A wallet event of the history test: a line (a new one, or a replacement with another amount or
    /// time), a status change, or a fault (3: none).
    #[derive(Clone, Debug)]
    enum Event {
        Line { card: u8, txn: u8, time: i64, amount: u8 },
        Status { card: u8, txn: u8, failed: bool },
        Fault { card: u8, fault: u8 },
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            3 => (0u8..2, 0u8..6, 0i64..30, 1u8..4)
                .prop_map(|(card, txn, time, amount)| Event::Line { card, txn, time, amount }),
            2 => (0u8..2, 0u8..6, any::<bool>()).prop_map(|(card, txn, failed)| Event::Status { card, txn, failed }),
            1 => (0u8..2, 0u8..4).prop_map(|(card, fault)| Event::Fault { card, fault }),
        ]
    }

    fn apply(sim: &mut WalletSim, event: &Event, at: Timestamp) {
        match *event {
            Event::Line { card, txn, time, amount } => {
                let line = StatementLine { amount: format!("{amount}.00").into(), ..line(txn, time, true) };
                sim.add_line(&format!("c{card}"), line, at);
            }
            Event::Status { card, txn, failed } => {
                let status = if failed { LineStatus::Failed } else { LineStatus::Processing };
                sim.set_status(&format!("c{card}"), &format!("t{txn}"), status, at);
            }
            Event::Fault { card, fault } => {
                let faults = [Fault::SessionExpired, Fault::UpstreamBusy, Fault::DetailUnavailable, Fault::None];
                sim.set_fault(&format!("c{card}"), faults[usize::from(fault) % faults.len()], at);
            }
        }
    }

    proptest! {
        /// Events posted in time order, each a second after the one before: a provider keeping its
        /// history answers as of any time as a provider that was sent only the events stamped by then
        /// (replay's provider at that time), whatever status changes, faults and replacements came later.
        #[test]
        fn answers_as_of_a_time_as_if_later_events_had_not_come(
            events in proptest::collection::vec(event(), 1..40),
            asks in proptest::collection::vec((0u8..3, 0u8..4, 0i64..30, 1u32..6, 0u8..6, -1i64..42), 1..20),
        ) {
            let at = |index: usize| seconds(index as i64);
            let mut sim = WalletSim::serving_http();
            for (index, event) in events.iter().enumerate() {
                apply(&mut sim, event, at(index));
            }
            for (card, mode, from, limit, txn, now) in asks {
                let now = seconds(now);
                let mut then = WalletSim::default();
                for (index, event) in events.iter().enumerate().filter(|(index, _)| at(*index) <= now) {
                    apply(&mut then, event, at(index));
                }
                let request = request(card, mode, from, limit, txn);
                let expected = then.answer(&request, now);
                let body = sim.body_as_of(&request, now).expect("encodes");
                prop_assert_eq!(body, body_of_answer(expected.clone()), "the body as of {}", now);
                prop_assert_eq!(sim.answer_as_of(&request, now), expected, "as of {}", now);
            }
        }
    }
}
