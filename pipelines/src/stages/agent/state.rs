//! The agent stage's state (SPEC §4): agents, cards, holds, sub-orders, bill tables, journals.

use crate::input::{Direction, LineCounterparty, LineStatus, Party, Provider, StatementLine, StaticName};
use crate::money::Money;
use crate::output::OrderKind;
use crate::time::Timestamp;
use crate::time_ordered::{TimeKeyed, TimeOrdered};
use crate::Text;
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Statement lines kept per card in the bill table; the oldest lines no sub-order uses are evicted
/// beyond it, which bounds memory per card (≈ 200 bytes a line with its indexes, ≈ 280 with a named
/// counterparty).
pub const BILL_LINES_PER_CARD_MAX: usize = 2_000;
/// Cards one agent may bind: with the bill-table cap this bounds an agent's statement memory.
pub const CARDS_PER_AGENT_MAX: usize = 16;
/// Timeline entries kept per sub-order (the oldest are dropped and counted beyond it).
pub const TIMELINE_ENTRIES_PER_SUB_ORDER_MAX: usize = 64;
/// Timeline entries a sub-order has room for at its first entry (see `Timeline::push`).
const TIMELINE_ENTRIES_FIRST: usize = 5;
/// Lines one `crawl_result` may carry (a provider page is 50; anything far above is refused).
pub const LINES_PER_RESULT_MAX: usize = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    Active,
    Banned,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CardAuth {
    Authenticated,
    Unauthenticated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldState {
    Frozen,
    Consumed,
    Released,
    Deferred,
    ConsumedAfterRelease,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubState {
    Paying,
    Reviewing,
    Success,
    PaymentTimeout,
    Cancelled,
    Rejected,
}

impl SubState {
    pub fn is_live(self) -> bool {
        matches!(self, SubState::Paying | SubState::Reviewing)
    }
}

/// Flags, declared in alphabetical order so a `BTreeSet` lists them sorted (SPEC §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flag {
    Ambiguous,
    AmountMismatch,
    AwaitReauth,
    BillPending,
    HisExhausted,
    IfscUnverified,
    Revived,
    Underpaid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balances {
    pub available: Money,
    pub frozen: Money,
    pub deferred: Money,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Sell,
    Buy,
    Income,
    Recharge,
    RechargeCommission,
    Adjustment,
    CorrectionRefund,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub seq: u64,
    pub at: Timestamp,
    pub kind: EntryKind,
    pub amount: Money,
    pub order_id: Option<Text>,
    pub before: Balances,
    pub after: Balances,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebtBatch {
    pub at: Timestamp,
    pub amount: Money,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub id: u32,
    pub order_id: Text,
    pub amount: Money,
    pub state: HoldState,
    pub remaining: Money,
    #[serde(skip)]
    pub debt_batches: Vec<DebtBatch>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusChange {
    pub at: Timestamp,
    pub from: AgentStatus,
    pub to: AgentStatus,
    pub operator: Text,
    pub reason: Text,
}

/// A statement line as the bill table keeps it (money parsed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub txn_id: Text,
    pub utr: Option<Text>,
    pub utr_supported: bool,
    pub direction: Direction,
    pub amount: Money,
    pub status: LineStatus,
    pub time: Timestamp,
    pub counterparty: LineCounterparty,
    pub payee_ifsc: Option<Text>,
}

impl Line {
    /// A provider's line with its amount already parsed (see `Money::parse`).
    pub fn from_statement(amount: Money, line: StatementLine) -> Line {
        Line {
            amount,
            txn_id: line.txn_id,
            utr: line.utr.filter(|utr| !utr.is_empty()),
            utr_supported: line.utr_supported,
            direction: line.direction,
            status: line.status,
            time: line.time,
            counterparty: line.counterparty,
            payee_ifsc: line.payee_ifsc,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BillLine {
    pub line: Line,
    /// The sub-order (agent-local index) this line is matched to, forever (R-WIN-3).
    pub used_by: Option<usize>,
    /// The sub-order waiting on a detail fetch about this line (R-WIN-3).
    pub reserved_by: Option<usize>,
}

/// The bill table of one card: every line fetched, deduplicated by txn id, ordered by (time, txn id)
/// ([`TimeOrdered`]). A check compares every line of a provider page (the latest lines, which repeat at
/// every check) with the table, and a window scan reads consecutive lines: both read neighbouring
/// memory (measured: with a slab, a hash index and an ordered index, a page check was ≈ 3.6 µs of a
/// crawl answer's ≈ 13 µs, mostly cache misses).
#[derive(Clone, Debug, Default)]
pub struct BillTable {
    lines: TimeOrdered<BillLine>,
}

impl TimeKeyed for BillLine {
    fn time(&self) -> Timestamp {
        self.line.time
    }

    fn txn_id(&self) -> &Text {
        &self.line.txn_id
    }
}

impl BillTable {
    pub fn get(&self, txn_id: &str) -> Option<&BillLine> {
        self.lines.find(txn_id)
    }

    /// The slot of the line with this time and txn id, looked for first beside `near` (the slot found
    /// for the previous line of a page: a provider lists lines in time order, so consecutive page lines
    /// are neighbours in the table), then by binary search.
    pub fn slot_at(&self, near: Option<usize>, time: Timestamp, txn_id: &str) -> Option<usize> {
        let is_key = |slot: usize| {
            self.lines
                .get(slot)
                .is_some_and(|known| known.line.time == time && crate::same_text(&known.line.txn_id, txn_id))
        };
        if let Some(near) = near {
            for slot in [near.wrapping_sub(1), near + 1, near] {
                if is_key(slot) {
                    return Some(slot);
                }
            }
        }
        // A line newer than the newest known one (a new line, the common miss) needs no search.
        let last = self.lines.back()?;
        if (last.line.time, last.line.txn_id.as_str()) < (time, txn_id) {
            return None;
        }
        self.lines.position(time, txn_id).ok()
    }

    pub fn at(&self, slot: usize) -> Option<&BillLine> {
        self.lines.get(slot)
    }

    /// The line, to change its status, UTR, IFSC or use (never its time or txn id: the order keys on
    /// them).
    pub fn get_mut(&mut self, txn_id: &str) -> Option<&mut BillLine> {
        self.lines.find_mut(txn_id)
    }

    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Adds a line not yet in the table.
    pub fn insert(&mut self, line: Line) {
        let replaced = self.lines.insert(BillLine { line, used_by: None, reserved_by: None });
        debug_assert!(replaced.is_none(), "a line the table already held was inserted again");
    }

    /// Every line, oldest first (time, then txn id), from the first one after `after` (time, txn id).
    pub fn lines_after(&self, after: Option<(Timestamp, &str)>) -> impl Iterator<Item = &BillLine> {
        let start = match after {
            Some((time, txn_id)) => self.lines.first_after(time, txn_id),
            None => 0,
        };
        self.lines.range_from(start)
    }

    /// Lines with `lower ≤ time ≤ upper`, oldest first (time, then txn id).
    pub fn window(&self, lower: Timestamp, upper: Timestamp) -> impl Iterator<Item = &BillLine> {
        let start = self.lines.first_at_or_after(lower);
        self.lines.range_from(start).take_while(move |known| known.line.time <= upper)
    }

    /// Removes the oldest line no sub-order uses or waits on; returns its (time, txn id).
    pub fn evict_oldest_unused(&mut self) -> Option<(Timestamp, Text)> {
        let slot = self.lines.iter().position(|known| known.used_by.is_none() && known.reserved_by.is_none())?;
        let evicted = self.lines.remove(slot)?;
        Some((evicted.line.time, evicted.line.txn_id))
    }
}

/// A snapshot keeps a bill table as its lines in (time, txn id) order; the txn-id index is rebuilt.
impl Serialize for BillTable {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.lines_after(None))
    }
}

impl<'de> Deserialize<'de> for BillTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<BillTable, D::Error> {
        let lines = Vec::<BillLine>::deserialize(deserializer)?;
        let mut table = BillTable::default();
        for line in lines {
            if let Some(twice) = table.lines.insert(line) {
                return Err(serde::de::Error::custom(format!("bill line {} twice", twice.line.txn_id)));
            }
        }
        Ok(table)
    }
}

/// Why a check of a card was asked; one check can count for several (R-CHK-1 coalescing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PurposeKind {
    /// R-WAVE-1 automatic wave.
    Wave,
    /// R-WAVE-1 close check.
    Close,
    /// R-WAVE-2 first wave after a confirmation.
    ConfirmFirst,
    /// R-WAVE-2 second wave.
    ConfirmSecond,
    /// R-PAY-1 final check.
    PayFinal,
    /// R-POST-1 live check of a revived collection.
    Revival,
    /// R-HIS-3 operator retry.
    OperatorRetry,
    /// R-REAUTH-1 check after re-authentication.
    Reauth,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Purpose {
    pub sub: Option<usize>,
    pub kind: PurposeKind,
    /// The confirmation generation a confirm wave belongs to (R-TIMER-1).
    pub generation: u32,
}

/// Rules whose time lapsed while the card was unauthenticated (R-REAUTH-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Lapse {
    SecondWave,
    Close,
    PayTimeout,
    Revival,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckInFlight {
    pub asked_at: Timestamp,
    /// The first page's request id (for the audit of purposes joining the check).
    pub request_id: Text,
    /// The first page's `from` (phonepe, R-CHK-2): a purpose may join the check only if its window
    /// starts no earlier.
    pub from: Option<Timestamp>,
    pub purposes: Vec<Purpose>,
    pub pages: u32,
    pub lines: Vec<Line>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckState {
    pub in_flight: Option<CheckInFlight>,
    /// Purposes that fell due while a check was outstanding or waiting for a retry (coalesced).
    pub waiting: Vec<Purpose>,
    pub retry_scheduled: bool,
    /// Identifies the pending busy retry: a retry timer of an older generation is stale (the session
    /// expired meanwhile, R-CHK-3) and does nothing.
    pub retry_generation: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DetailReason {
    /// R-MATCH-P1 IFSC verification for a sub-order.
    Ifsc { sub: usize },
    /// R-PEND-1 lookup of a matched line still processing.
    Pending,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestKind {
    OrderCheck,
    Reservoir,
    Detail { txn_id: Text, reason: DetailReason },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub kind: RequestKind,
    pub asked_at: Timestamp,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Card {
    pub card_id: Text,
    pub provider: Provider,
    pub auth: CardAuth,
    pub account_last4: Option<Text>,
    pub vpa: Option<Text>,
    /// One `reauth_required` notification per card per episode (R-CHK-3).
    pub reauth_notified: bool,
    /// Requests made so far (`request_id` = `{card_id}:{n}`).
    pub requests_made: u64,
    pub requests: BTreeMap<Text, Request>,
    pub check: CheckState,
    pub bill: BillTable,
    /// Live (paying or reviewing) sub-orders on this card, by creation.
    pub live_subs: BTreeSet<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatchRecord {
    #[serde(deserialize_with = "deserialize_rule_id")]
    pub rule: StaticName,
    pub txn_ids: Vec<Text>,
    pub explanation: Evidence,
}

/// The evidence of a decision (R-AUDIT-1), kept as data and written out only when shown: decisions
/// happen on every event, reading them is rare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evidence {
    Text(&'static str),
    Owned(String),
    /// A check asked for a purpose.
    Asked {
        request_id: Text,
        purpose: PurposeKind,
    },
    /// A check answered with nothing for a purpose.
    NothingFound {
        purpose: PurposeKind,
    },
    Dispatched {
        card_id: Text,
        amount: Money,
        hold: u32,
        close_at: Timestamp,
    },
    Grabbed {
        card_id: Text,
    },
    Confirmed {
        utr: Option<Text>,
    },
    /// A line inside a window (R-WIN-1).
    Line {
        txn_id: Text,
        amount: Money,
        time: Timestamp,
        lower: Timestamp,
        upper: Timestamp,
    },
    Lines {
        txn_ids: Vec<Text>,
        lower: Timestamp,
        upper: Timestamp,
    },
    Success {
        txn_ids: Vec<Text>,
        amount: Money,
    },
    Paid {
        paid: Money,
        amount: Money,
    },
    Ended {
        state: SubState,
        order_pending: bool,
    },
    /// A decision taken by an operator command.
    ByOperator {
        operator: Text,
        evidence: Box<Evidence>,
    },
}

impl std::fmt::Display for Evidence {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Evidence::Text(text) => formatter.write_str(text),
            Evidence::Owned(text) => formatter.write_str(text),
            Evidence::Asked { request_id, purpose } => write!(formatter, "{request_id} for {purpose:?}"),
            Evidence::NothingFound { purpose } => write!(formatter, "{purpose:?}: nothing found"),
            Evidence::Dispatched { card_id, amount, hold, close_at } => {
                write!(formatter, "card {card_id} amount {amount} hold {hold} close_at {close_at}")
            }
            Evidence::Grabbed { card_id } => write!(formatter, "card {card_id}"),
            Evidence::Confirmed { utr } => write!(formatter, "utr {}", utr.as_deref().unwrap_or("none")),
            Evidence::Line { txn_id, amount, time, lower, upper } => {
                write!(formatter, "txn {txn_id} amount {amount} time {time} window [{lower}, {upper}]")
            }
            Evidence::Lines { txn_ids, lower, upper } => {
                write!(formatter, "txns {} window [{lower}, {upper}]", txn_ids.join(","))
            }
            Evidence::Success { txn_ids, amount } => write!(formatter, "txns {} amount {amount}", txn_ids.join(",")),
            Evidence::Paid { paid, amount } => write!(formatter, "paid {paid} for {amount}"),
            Evidence::Ended { state, order_pending: true } => {
                write!(formatter, "state {state:?}, order back to pending")
            }
            Evidence::Ended { state, order_pending: false } => write!(formatter, "state {state:?}, hold released"),
            Evidence::ByOperator { operator, evidence } => write!(formatter, "by {operator}: {evidence}"),
        }
    }
}

impl Serialize for Evidence {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Evidence reads back (from a partition snapshot) as the text it was written as: it is only ever shown,
/// never inspected, so the text is all that later outputs can depend on.
impl<'de> Deserialize<'de> for Evidence {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Evidence, D::Error> {
        String::deserialize(deserializer).map(Evidence::Owned)
    }
}

impl From<String> for Evidence {
    fn from(text: String) -> Evidence {
        Evidence::Owned(text)
    }
}

impl From<&'static str> for Evidence {
    fn from(text: &'static str) -> Evidence {
        Evidence::Text(text)
    }
}

/// Every rule id a timeline entry or match record names: a partition snapshot reads them back into
/// `&'static str`s from this list (a test checks it against every `"R-…"` literal of the stages).
pub const RULE_IDS: &[&str] = &[
    "R-ADMIN-1",
    "R-ADMIN-3",
    "R-ADMIN-4",
    "R-AUDIT-1",
    "R-CHK-1",
    "R-CHK-3",
    "R-CLOSE-1",
    "R-CLOSE-2",
    "R-CLOSE-3",
    "R-DSP-1",
    "R-HIS-1",
    "R-HIS-2",
    "R-HIS-3",
    "R-MATCH-C1",
    "R-MATCH-C2",
    "R-MATCH-C3",
    "R-MATCH-P1",
    "R-MATCH-P2",
    "R-MATCH-P3",
    "R-MATCH-P4",
    "R-MATCH-P5",
    "R-PAY-1",
    "R-PAY-2",
    "R-PEND-1",
    "R-PEND-2",
    "R-POST-1",
    "R-POST-2",
    "R-REAUTH-1",
    "R-WAVE-2",
];

/// Every timeline event name (a test checks it against the events the stages pass to `note`).
pub const TIMELINE_EVENTS: &[&str] = &[
    "abandoned",
    "ambiguous",
    "amount_mismatch",
    "await_reauth",
    "bill_pending",
    "bill_pending_timeout",
    "bill_table_miss",
    "cancelled",
    "check_answered",
    "check_asked",
    "close_deferred",
    "closed",
    "corrected",
    "dispatched",
    "ended",
    "grabbed",
    "his_exhausted",
    "ifsc_detail_asked",
    "ifsc_mismatch",
    "ifsc_unverified",
    "ifsc_verified",
    "lapsed_rules",
    "line_failed",
    "line_settled",
    "line_status_changed",
    "line_taken",
    "lines_matched",
    "operator_retry",
    "pay_timeout",
    "payment_confirmed",
    "reauthenticated",
    "rejected",
    "revival_missed",
    "revived",
    "success",
    "supplement_debit",
    "underpaid",
    "underpaid_timeout",
];

fn known_name<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
    names: &'static [&'static str],
    what: &str,
) -> Result<&'static str, D::Error> {
    crate::decode::parse_str(deserializer, |name| {
        names.iter().find(|known| **known == name).copied().ok_or_else(|| format!("unknown {what} `{name}`"))
    })
}

/// Deserializes a rule id into its `&'static str` from [`RULE_IDS`].
pub fn deserialize_rule_id<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<&'static str, D::Error> {
    known_name(deserializer, RULE_IDS, "rule id")
}

/// Deserializes a timeline event name into its `&'static str` from [`TIMELINE_EVENTS`].
pub fn deserialize_timeline_event<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<&'static str, D::Error> {
    known_name(deserializer, TIMELINE_EVENTS, "timeline event")
}

/// One decision on a sub-order (R-AUDIT-1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEntry {
    pub at: Timestamp,
    #[serde(deserialize_with = "deserialize_rule_id")]
    pub rule: StaticName,
    #[serde(deserialize_with = "deserialize_timeline_event")]
    pub event: StaticName,
    pub evidence: Evidence,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Timeline {
    pub entries: VecDeque<TimelineEntry>,
    pub dropped: u64,
}

impl Timeline {
    /// Entries recorded so far, dropped ones included (a position that survives the cap).
    pub fn recorded(&self) -> u64 {
        self.dropped + self.entries.len() as u64
    }

    /// Names the operator on the first entry recorded since `recorded` (the decision of an operator
    /// command, R-AUDIT-1).
    pub fn attribute_since(&mut self, recorded: u64, operator: Text) {
        let index = recorded.saturating_sub(self.dropped) as usize;
        if let Some(entry) = self.entries.get_mut(index) {
            let evidence = std::mem::replace(&mut entry.evidence, Evidence::Text(""));
            entry.evidence = Evidence::ByOperator { operator, evidence: Box::new(evidence) };
        }
    }

    pub fn push(&mut self, entry: TimelineEntry) {
        if self.entries.capacity() == 0 {
            // Most sub-orders record two to five entries (dispatch or grab, checks, the outcome): room
            // for five at once, instead of four and then a copy into eight for the many that reach five.
            self.entries.reserve_exact(TIMELINE_ENTRIES_FIRST);
        }
        if self.entries.len() >= TIMELINE_ENTRIES_PER_SUB_ORDER_MAX {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(entry);
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubOrder {
    pub order_id: Text,
    pub seq: u32,
    pub kind: OrderKind,
    pub card_id: Text,
    pub amount: Money,
    pub created_at: Timestamp,
    /// Collections: `min(dispatched_at + collection_close_after, expires_at)` (R-WAVE-1).
    pub close_at: Option<Timestamp>,
    pub payee: Option<Box<Party>>,
    pub state: SubState,
    pub flags: BTreeSet<Flag>,
    pub utrs: Vec<Text>,
    pub matched_txn_ids: Vec<Text>,
    pub paid_total: Money,
    pub matched: Option<MatchRecord>,
    pub found: bool,
    pub hold_id: Option<u32>,
    pub closed_at: Option<Timestamp>,
    /// The state a revival came from (R-POST-1, R-HIS-3).
    pub revived_from: Option<SubState>,
    pub confirm_generation: u32,
    /// A line was matched since the last `payment_confirmed` (R-WAVE-2: no second wave then).
    pub matched_since_confirmation: bool,
    /// The second wave of the current confirmation has fallen due (asked or not, R-WAVE-2): if a line
    /// it relied on later proves to be another payee's, the user-submission rule applies then.
    pub second_wave_passed: bool,
    pub lapses: BTreeSet<Lapse>,
    pub ifsc_mismatch: BTreeSet<Text>,
    pub ifsc_verified: BTreeSet<Text>,
    pub awaiting_detail: Option<Text>,
    pub underpaid_since: Option<Timestamp>,
    pub bill_pending_since: Option<Timestamp>,
    pub timeline: Timeline,
}

impl SubOrder {
    pub fn note(&mut self, at: Timestamp, rule: &'static str, event: &'static str, evidence: impl Into<Evidence>) {
        self.timeline.push(TimelineEntry { at, rule, event, evidence: evidence.into() });
    }

    /// Open for matching (SPEC §7 "Match rules"): live and not found, plus under-paid ones.
    pub fn open_for_matching(&self) -> bool {
        self.state.is_live() && self.awaiting_detail.is_none() && (!self.found || self.flags.contains(&Flag::Underpaid))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Agent {
    pub user_id: Text,
    pub status: AgentStatus,
    pub telegram_bound: bool,
    pub available: Money,
    /// Sum of `amount` over frozen holds (kept with every hold change; checked by property tests).
    pub frozen: Money,
    /// Sum of `remaining` over deferred holds.
    pub deferred: Money,
    pub cards: BTreeMap<Text, Card>,
    /// Snapshots keep each hold's debt batches, which the user view leaves out.
    #[serde(with = "crate::snapshot::holds")]
    pub holds: Vec<Hold>,
    pub journal: crate::segmented::Segmented<JournalEntry>,
    pub status_history: Vec<StatusChange>,
    pub last_unban_at: Option<Timestamp>,
    pub subs: Vec<SubOrder>,
    #[serde(with = "crate::snapshot::sorted_map")]
    pub sub_index: HashMap<(Text, u32), usize>,
    /// ERRORED lines of every card: (time, card, txn) (R-ERR-1).
    pub errored: BTreeSet<(Timestamp, Text, Text)>,
    /// Earliest time of an ERRORED line added since the last count (R-ERR-1 counts only from there).
    pub errored_unchecked_from: Option<Timestamp>,
    pub sweep_scheduled: bool,
    /// Sub-orders known to be final, by index: derived from `subs` (not in snapshots; rebuilt by
    /// [`Agent::derive_indexes`]). See [`Agent::timer_is_idle`].
    #[serde(skip)]
    pub final_subs: crate::bits::IndexBits,
    /// Crawl requests asked and neither answered nor timed out, over all cards; None: not counted (a
    /// restored agent before [`Agent::derive_indexes`]). See [`Agent::timer_is_idle`].
    #[serde(skip)]
    pub requests_outstanding: Option<usize>,
}

impl Agent {
    pub fn new(user_id: &str, telegram_bound: bool) -> Agent {
        Agent {
            user_id: user_id.into(),
            status: AgentStatus::Active,
            telegram_bound,
            available: Money::ZERO,
            frozen: Money::ZERO,
            deferred: Money::ZERO,
            cards: BTreeMap::new(),
            holds: Vec::new(),
            journal: Default::default(),
            status_history: Vec::new(),
            last_unban_at: None,
            subs: Vec::new(),
            sub_index: HashMap::default(),
            errored: BTreeSet::new(),
            errored_unchecked_from: None,
            sweep_scheduled: false,
            final_subs: crate::bits::IndexBits::default(),
            requests_outstanding: Some(0),
        }
    }

    /// Rebuilds what is derived from the rest of the record and left out of snapshots: the final
    /// sub-orders and the count of outstanding crawl requests.
    pub fn derive_indexes(&mut self) {
        self.final_subs = crate::bits::IndexBits::default();
        for (index, record) in self.subs.iter().enumerate() {
            self.final_subs.set(index, !record.state.is_live());
        }
        self.requests_outstanding = Some(self.requests_held());
    }

    /// Crawl requests the cards hold (asked, neither answered nor timed out).
    fn requests_held(&self) -> usize {
        self.cards.values().map(|card| card.requests.len()).sum()
    }

    /// Whether the derived indexes say what the records say: a sub-order is in `final_subs` if and only
    /// if it is neither paying nor reviewing, and a known count of outstanding requests is exact.
    pub fn derived_indexes_hold(&self) -> bool {
        let finals_hold =
            self.subs.iter().enumerate().all(|(sub, record)| self.final_subs.contains(sub) != record.state.is_live());
        finals_hold && self.requests_outstanding.is_none_or(|count| count == self.requests_held())
    }

    pub fn balances(&self) -> Balances {
        Balances { available: self.available, frozen: self.frozen, deferred: self.deferred }
    }

    /// `dispatch_eligible` (SPEC §4): active and nothing deferred.
    pub fn dispatch_eligible(&self) -> bool {
        self.status == AgentStatus::Active && self.deferred.is_zero()
    }

    /// Whether every index into `subs` and `holds` is in range (a restored snapshot must not make a later
    /// handler index out of bounds): the state a snapshot decodes to is checked with it.
    pub fn check_references(&self) -> Result<(), String> {
        let user_id = &self.user_id;
        let sub_ok = |sub: usize| sub < self.subs.len();
        for (position, hold) in self.holds.iter().enumerate() {
            if hold.id as usize != position + 1 {
                return Err(format!("agent {user_id}: hold {} at position {position}", hold.id));
            }
        }
        for ((order_id, seq), &sub) in &self.sub_index {
            if self.subs.get(sub).is_none_or(|record| (&record.order_id, record.seq) != (order_id, *seq)) {
                return Err(format!("agent {user_id}: sub-order {order_id}/{seq} indexed at {sub}"));
            }
        }
        for record in &self.subs {
            if record.hold_id.is_some_and(|id| id == 0 || id as usize > self.holds.len()) {
                return Err(format!("agent {user_id}: sub-order {} names a missing hold", record.order_id));
            }
        }
        for card in self.cards.values() {
            let purposes = card.check.waiting.iter().chain(card.check.in_flight.iter().flat_map(|f| &f.purposes));
            let details = card.requests.values().filter_map(|request| match &request.kind {
                RequestKind::Detail { reason: DetailReason::Ifsc { sub }, .. } => Some(*sub),
                _ => None,
            });
            let lines = card.bill.lines_after(None).flat_map(|line| line.used_by.into_iter().chain(line.reserved_by));
            let subs = card.live_subs.iter().copied().chain(purposes.filter_map(|purpose| purpose.sub));
            if !subs.chain(details).chain(lines).all(sub_ok) {
                return Err(format!("agent {user_id}: card {} names a missing sub-order", card.card_id));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{BillTable, Flag, Line};
    use crate::input::{Direction, LineStatus};
    use crate::{Money, Text, Timestamp};
    use proptest::prelude::*;

    fn line(txn_id: &str, seconds: i64) -> Line {
        Line {
            txn_id: txn_id.into(),
            utr: None,
            utr_supported: true,
            direction: Direction::In,
            amount: Money::from_rupees(1),
            status: LineStatus::Success,
            time: Timestamp::from_millis(seconds * 1000),
            counterparty: Default::default(),
            payee_ifsc: None,
        }
    }

    proptest! {
        /// Inserts, uses and evictions in any order leave the three views of the table (lookup by txn
        /// id, window scan, ordered walk) equal to a plain ordered model of the same lines.
        #[test]
        fn the_bill_table_agrees_with_an_ordered_model(
            steps in proptest::collection::vec((0u8..3, 0u16..40, 0i64..20), 1..300)
        ) {
            let mut table = BillTable::default();
            // (time, txn id) -> used
            let mut model: std::collections::BTreeMap<(Timestamp, Text), bool> = Default::default();
            for (action, id, seconds) in steps {
                let txn_id = format!("t{id}");
                match action {
                    0 if table.get(&txn_id).is_none() => {
                        let line = line(&txn_id, seconds);
                        model.insert((line.time, line.txn_id.clone()), false);
                        table.insert(line);
                    }
                    1 => {
                        if let Some(bill_line) = table.get_mut(&txn_id) {
                            bill_line.used_by = Some(usize::from(id));
                            let key = (bill_line.line.time, bill_line.line.txn_id.clone());
                            model.insert(key, true);
                        }
                    }
                    2 => {
                        let expected = model.iter().find(|(_, used)| !**used).map(|(key, _)| key.clone());
                        prop_assert_eq!(table.evict_oldest_unused(), expected.clone());
                        if let Some(key) = expected {
                            model.remove(&key);
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(table.len(), model.len());
                let walked: Vec<_> = table.lines_after(None).map(|l| ((l.line.time, l.line.txn_id.clone()), l.used_by.is_some())).collect();
                let expected: Vec<_> = model.iter().map(|(key, used)| (key.clone(), *used)).collect();
                prop_assert_eq!(&walked, &expected);
                for (time, txn_id) in model.keys() {
                    prop_assert_eq!(table.get(txn_id).map(|l| l.line.time), Some(*time));
                }
                // A page's lookup by (time, txn id), whatever the neighbour it starts from.
                for (position, (time, txn_id)) in model.keys().enumerate() {
                    for near in [None, Some(position), Some(position.saturating_sub(1)), Some(position + 1), Some(position + 7)] {
                        prop_assert_eq!(table.slot_at(near, *time, txn_id), Some(position));
                    }
                    prop_assert_eq!(table.at(position).map(|l| &l.line.txn_id), Some(txn_id));
                    prop_assert_eq!(table.slot_at(Some(position), Timestamp::from_millis(time.millis() + 1), txn_id), None);
                }
                prop_assert_eq!(table.slot_at(Some(0), Timestamp::from_millis(0), "absent"), None);
                if let Some((time, txn_id)) = model.keys().nth(model.len() / 2) {
                    let after: Vec<_> = table.lines_after(Some((*time, txn_id))).map(|l| l.line.txn_id.clone()).collect();
                    let bound = (std::ops::Bound::Excluded((*time, txn_id.clone())), std::ops::Bound::Unbounded);
                    let expected: Vec<_> = model.range(bound).map(|((_, id), _)| id.clone()).collect();
                    prop_assert_eq!(after, expected);
                }
                let (lower, upper) = (Timestamp::from_millis(5_000), Timestamp::from_millis(12_000));
                let window: Vec<_> = table.window(lower, upper).map(|l| l.line.txn_id.clone()).collect();
                let expected: Vec<_> = model.keys().filter(|(time, _)| (lower..=upper).contains(time)).map(|(_, id)| id.clone()).collect();
                prop_assert_eq!(window, expected);
            }
        }
    }

    /// SPEC §9 lists flags sorted; a `BTreeSet<Flag>` iterates in declaration order, so the declaration
    /// must be alphabetical by the serialized name.
    #[test]
    fn flags_are_declared_in_alphabetical_order() {
        let flags = [
            Flag::Ambiguous,
            Flag::AmountMismatch,
            Flag::AwaitReauth,
            Flag::BillPending,
            Flag::HisExhausted,
            Flag::IfscUnverified,
            Flag::Revived,
            Flag::Underpaid,
        ];
        let names: Vec<String> = flags.iter().map(|flag| serde_json::to_string(flag).unwrap_or_default()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        let mut declared = flags.to_vec();
        declared.sort();
        assert_eq!(declared, flags.to_vec(), "declaration order is the listed order");
    }
}
