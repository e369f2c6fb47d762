//! An agent waits for the connector's answers before it moves past their time (SPEC §3, R-CHK-1).
//! Pure: what it holds and releases is a function of the partition's log.
//!
//! Why: in replay the simulated provider answers a crawl `crawl_latency` after it was asked, before any
//! input stamped later is applied. A service appends the connector's answer to the partition's log
//! behind whatever arrived meanwhile. A partition that runs behind its inputs (a burst, a reprocessing
//! run) would then apply records stamped minutes later first: the crawl's timeout fires, the check is
//! asked again, the late answer is dropped as stale, and waves and closes decide without the statement
//! they asked for. Measured in the serve benchmark: 4.6–5.8 times the crawls of replay.
//!
//! How: when the connector stamps each answer at a known time (the event clock: the request's time plus
//! `crawl_latency`), the partition notes every crawl it asks with that time and the agent it is for. A
//! record for that agent stamped later than the agent's earliest awaited answer is held, and so is every
//! later record for the agent (log order is kept per agent); so is a timer of the agent that falls due
//! past that answer. The answer itself is applied when it arrives, then what the agent holds, in time
//! order, as far as the agent's next awaited answer allows. This is the watermark of stream processors
//! (event time does not pass an answer still in flight) kept per key: the agent stage's state is keyed
//! by agent, so one agent waiting for its wallet holds up none of the others (a partition-wide watermark
//! applied a few records per provider round trip, and bounded the serve benchmark).
//!
//! An agent's records and timers are applied, relative to each other, in replay's order, at replay's
//! times: each agent keeps its own clock (the latest time applied to it), and its records and timers
//! run at it, not at the partition's, which answers stamped ahead of other agents' records move on.
//!
//! Bounded: past [`HELD_RECORDS_MAX`] held records (or [`AWAITED_ANSWERS_MAX`] awaited answers) in the
//! partition, the earliest awaited answer is given up (counted); its crawl's timeout then fires as it
//! would without the barrier. A request whose answer is given up and then comes is applied like any
//! late answer (R-CHK-1: ignored when already timed out).

use crate::input::Command;
use crate::keyed::KeyedMap;
use crate::output::{Output, OutputBody};
use crate::partition::{RecordBody, StageRecord};
use crate::stages::{AgentBody, Message, Timer};
use crate::time::Timestamp;
use crate::timers::TimerKey;
use crate::Text;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// Records one partition holds at most while its agents wait for answers.
pub const HELD_RECORDS_MAX: usize = 65_536;
/// Answers one partition awaits at most (a connector that stopped answering must not grow the state).
pub const AWAITED_ANSWERS_MAX: usize = 65_536;

/// The answers an agent partition's agents wait for, and what they hold meanwhile.
///
/// What is looked up by id (several times per record) is in keyed maps, not `BTreeMap`s: comparing ids
/// down the trees was ≈ 3 % of the serve process's CPU samples. Each is written into snapshots as the
/// sorted object its tree was ([`crate::snapshot::keyed_object`]), so the snapshot format is unchanged.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AnswerBarrier {
    /// How long after a request the connector stamps its answer (the event clock's `crawl_latency`).
    answer_delay_s: i64,
    /// Requests asked and not answered yet: request id → the agent asked for and the answer's time.
    #[serde(with = "crate::snapshot::keyed_object")]
    awaited: KeyedMap<(Text, Timestamp)>,
    /// The same requests by (answer time, request id): the earliest is given up first past a bound.
    awaited_by_time: BTreeSet<(Timestamp, Text)>,
    /// Agents with an answer awaited, or records held or timers deferred, by user id.
    #[serde(with = "crate::snapshot::keyed_object")]
    waiting: KeyedMap<Waiting>,
    /// Each agent's clock: the latest time applied to it. An agent's records and timers run at its own
    /// clock, not the partition's, which answers stamped ahead of other agents' records move on.
    #[serde(with = "crate::snapshot::keyed_object")]
    clocks: KeyedMap<Timestamp>,
    /// Records held, over every agent.
    held: usize,
    /// Awaited answers given up because too many records were held or answers awaited.
    given_up: u64,
}

/// One agent's wait.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Waiting {
    /// The agent's awaited answers by (answer time, request id): the earliest is its barrier.
    awaited: BTreeSet<(Timestamp, Text)>,
    /// Records for the agent that arrived past its barrier, in log order.
    held: VecDeque<StageRecord>,
    /// Timers of the agent whose time has passed while it waited, by (due, creation).
    timers: Vec<(TimerKey, Timer)>,
}

impl Waiting {
    /// A record stamped `at` waits for an answer stamped before it; one stamped at the answer's time
    /// exactly goes first, as an input does before a timer due at its time (replay's provider answers
    /// are timers, SPEC §3).
    fn blocks(&self, at: Timestamp) -> bool {
        self.awaited.first().is_some_and(|(answer_at, _)| *answer_at < at)
    }

    /// A timer due at `due` waits for an answer stamped at or before it: applied as it arrives, an
    /// answer is an input, and goes before a timer due at its time. Otherwise the order of the two would
    /// depend on whether the answer arrived before a record that fires the timer.
    fn blocks_timer(&self, due: Timestamp) -> bool {
        self.awaited.first().is_some_and(|(answer_at, _)| *answer_at <= due)
    }

    fn is_idle(&self) -> bool {
        self.awaited.is_empty() && self.held.is_empty() && self.timers.is_empty()
    }
}

/// What an agent may apply next (see [`AnswerBarrier::release`]).
#[derive(Debug)]
pub enum Released {
    Record(StageRecord),
    Timer(TimerKey, Timer),
}

impl AnswerBarrier {
    pub fn new(answer_delay_s: i64) -> AnswerBarrier {
        assert!(answer_delay_s >= 0, "an answer cannot come before its request");
        AnswerBarrier { answer_delay_s, ..AnswerBarrier::default() }
    }

    /// Notes the crawls among outputs just produced: their answers are awaited from now on, each by the
    /// agent it is for.
    pub fn await_answers(&mut self, outputs: &[Output]) {
        for output in outputs {
            if let OutputBody::CrawlRequested(request) = &output.body {
                let answer_at = output.at.plus_seconds(self.answer_delay_s);
                let user_id = &request.user_id;
                // Request ids are unique; one asked again would count from its new time.
                if let Some((before_user, before_at)) =
                    self.awaited.insert(request.request_id.clone(), (user_id.clone(), answer_at))
                {
                    self.forget_awaited(&before_user, before_at, &request.request_id);
                }
                self.awaited_by_time.insert((answer_at, request.request_id.clone()));
                self.waiting_mut(user_id).awaited.insert((answer_at, request.request_id.clone()));
            }
        }
        debug_assert_eq!(self.awaited.len(), self.awaited_by_time.len());
    }

    /// If `record` is an awaited answer: stops awaiting it and returns the agent it is for (it is
    /// applied at once, whatever the agent holds: it is what the agent waits for).
    pub fn take_answer(&mut self, record: &StageRecord) -> Option<Text> {
        let request_id = answered_request(record)?;
        let (user_id, answer_at) = self.awaited.remove(request_id)?;
        self.forget_awaited(&user_id, answer_at, request_id);
        Some(user_id)
    }

    /// Whether a record for `user_id` stamped `at` must be held: the agent holds records already (log
    /// order), or awaits an answer stamped before it.
    pub fn must_hold(&self, user_id: &str, at: Timestamp) -> bool {
        self.waiting.get(user_id).is_some_and(|waiting| !waiting.held.is_empty() || waiting.blocks(at))
    }

    /// Holds a record for `user_id` behind the ones it holds.
    pub fn hold(&mut self, user_id: &str, record: StageRecord) {
        self.waiting_mut(user_id).held.push_back(record);
        self.held += 1;
    }

    /// Holds, first of what `user_id` holds, a record whose application a timer stopped: a timer due
    /// before it asked a crawl whose answer is stamped before it too (see
    /// `StagePartition::apply_for_agent`). It was next in the agent's order, so it goes back first.
    pub fn hold_first(&mut self, user_id: &str, record: StageRecord) {
        debug_assert!(self.blocks(user_id, record.at), "held without an answer to wait for");
        self.waiting_mut(user_id).held.push_front(record);
        self.held += 1;
    }

    /// Whether a timer of `user_id` due at `due`, whose time has passed, must wait: the agent awaits an
    /// answer stamped at or before it. (A timer not blocked goes before everything the agent holds or
    /// defers, all of which is blocked, so it fires at once.)
    pub fn defers_timer(&self, user_id: &str, due: Timestamp) -> bool {
        self.waiting.get(user_id).is_some_and(|waiting| waiting.blocks_timer(due))
    }

    /// Whether `user_id` waits for an answer, or holds records or deferred timers.
    pub fn is_waiting(&self, user_id: &str) -> bool {
        self.waiting.contains_key(user_id)
    }

    /// Keeps a timer of a waiting agent, whose time has passed, until the agent may apply it.
    pub fn defer_timer(&mut self, user_id: &str, key: TimerKey, timer: Timer) {
        let timers = &mut self.waiting_mut(user_id).timers;
        let position = timers.partition_point(|(earlier, _)| *earlier < key);
        timers.insert(position, (key, timer));
    }

    /// The time a record or timer of `user_id` stamped `at` runs at: the agent's clock, moved there.
    pub fn run_at(&mut self, user_id: &str, at: Timestamp) -> Timestamp {
        let clock = self.clocks.get_or_insert_with(user_id, || at);
        *clock = (*clock).max(at);
        *clock
    }

    /// The next record or timer `user_id` may apply now, in time order (a record before a timer due at
    /// its time, SPEC §3), or None while its barrier holds it. Forgets an agent with nothing left.
    pub fn release(&mut self, user_id: &str) -> Option<Released> {
        let waiting = self.waiting.get_mut(user_id)?;
        let timer_due = waiting.timers.first().map(|((due, _), _)| *due);
        let record_at = waiting.held.front().map(|record| record.at);
        let released = match (timer_due, record_at) {
            (Some(due), at) if at.is_none_or(|at| due < at) && !waiting.blocks_timer(due) => {
                let (key, timer) = waiting.timers.remove(0);
                Some(Released::Timer(key, timer))
            }
            (due, Some(at)) if due.is_none_or(|due| due >= at) && !waiting.blocks(at) => {
                self.held -= 1;
                waiting.held.pop_front().map(Released::Record)
            }
            _ => None,
        };
        if released.is_none() && waiting.is_idle() {
            self.waiting.remove(user_id);
        }
        released
    }

    /// The first timer `user_id` deferred, if it falls due before `at` and may fire now: a record stamped
    /// `at` goes after it.
    pub fn release_timer_before(&mut self, user_id: &str, at: Timestamp) -> Option<(TimerKey, Timer)> {
        let waiting = self.waiting.get_mut(user_id)?;
        let ((due, _), _) = waiting.timers.first()?;
        if *due >= at || waiting.blocks_timer(*due) {
            return None;
        }
        Some(waiting.timers.remove(0))
    }

    /// Past a bound: gives up the earliest awaited answer and returns its agent (to release), or None
    /// within the bounds.
    pub fn give_up_past_bounds(&mut self) -> Option<Text> {
        if self.held <= HELD_RECORDS_MAX && self.awaited.len() <= AWAITED_ANSWERS_MAX {
            return None;
        }
        let (_, request_id) = self.awaited_by_time.first()?.clone();
        let (user_id, answer_at) = self.awaited.remove(&request_id)?;
        self.forget_awaited(&user_id, answer_at, &request_id);
        self.given_up += 1;
        Some(user_id)
    }

    /// Records held now, over every agent.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The earliest event time among the records at the front of each agent's held queue: how far
    /// back the oldest work this partition has consumed but not applied goes (None: nothing held).
    /// Each agent's front only, not every held record: bounded by the agents waiting, for a read
    /// made under the partition's lock at every lag report.
    pub fn first_held_at(&self) -> Option<Timestamp> {
        self.waiting.values().filter_map(|waiting| waiting.held.front().map(|record| record.at)).min()
    }

    /// Answers awaited now.
    pub fn awaited(&self) -> usize {
        self.awaited.len()
    }

    /// Agents waiting now (with an answer awaited, or records held or timers deferred).
    pub fn agents_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Awaited answers given up so far (too many records held or answers awaited).
    pub fn given_up(&self) -> u64 {
        self.given_up
    }

    /// Whether a record for `user_id` stamped `at` must wait: the agent awaits an answer stamped before
    /// it. One stamped at the answer's time exactly goes first, as an input does before a timer due at
    /// its time (SPEC §3).
    pub fn blocks(&self, user_id: &str, at: Timestamp) -> bool {
        self.waiting.get(user_id).is_some_and(|waiting| waiting.blocks(at))
    }

    fn waiting_mut(&mut self, user_id: &str) -> &mut Waiting {
        self.waiting.get_or_insert_with(user_id, Waiting::default)
    }

    /// Removes an awaited answer, already taken out of `awaited`, from its indexes by time and by agent.
    fn forget_awaited(&mut self, user_id: &str, answer_at: Timestamp, request_id: &Text) {
        self.awaited_by_time.remove(&(answer_at, request_id.clone()));
        if let Some(waiting) = self.waiting.get_mut(user_id) {
            waiting.awaited.remove(&(answer_at, request_id.clone()));
        }
    }

    /// The awaited answers agree with their indexes by time and by agent, the held count with what the
    /// agents hold, each agent's timers are in order, no idle agent is kept, and the delay is not
    /// negative (checked on restored snapshots).
    pub fn check(&self) -> Result<(), String> {
        if self.awaited.len() != self.awaited_by_time.len()
            || self.awaited_by_time.iter().any(|(at, id)| self.awaited.get(id).map(|(_, time)| time) != Some(at))
        {
            return Err("the awaited answers disagree with their index by time".into());
        }
        let by_agent: usize = self.waiting.values().map(|waiting| waiting.awaited.len()).sum();
        let agrees = |(user_id, waiting): (&Text, &Waiting)| {
            waiting.awaited.iter().all(|(at, id)| self.awaited.get(id) == Some(&(user_id.clone(), *at)))
        };
        if by_agent != self.awaited.len() || !self.waiting.iter().all(agrees) {
            return Err("the awaited answers disagree with the agents waiting for them".into());
        }
        if self.waiting.values().map(|waiting| waiting.held.len()).sum::<usize>() != self.held {
            return Err("the count of held records disagrees with what the agents hold".into());
        }
        if self.waiting.values().any(|waiting| waiting.is_idle()) {
            return Err("an agent waits for nothing".into());
        }
        if self.waiting.values().any(|waiting| waiting.timers.windows(2).any(|pair| pair[0].0 >= pair[1].0)) {
            return Err("an agent's deferred timers are out of order".into());
        }
        if self.answer_delay_s < 0 {
            return Err(format!("an answer delay of {}s", self.answer_delay_s));
        }
        Ok(())
    }
}

/// The request a record answers, if it is a `crawl_result`.
fn answered_request(record: &StageRecord) -> Option<&Text> {
    match &record.body {
        RecordBody::Message {
            message: Message::Agent { body: AgentBody::Input { command: Command::CrawlResult(result), .. }, .. },
        } => Some(&result.request_id),
        _ => None,
    }
}

/// The agent a record is for (None: a tick, which is for every key).
pub fn agent_of(record: &StageRecord) -> Option<&Text> {
    match &record.body {
        RecordBody::Message { message: Message::Agent { user_id, .. } } => Some(user_id),
        _ => None,
    }
}

/// The agent a timer belongs to (None outside the agent stage).
pub fn timer_agent(timer: &Timer) -> Option<&Text> {
    match timer {
        Timer::Agent { user_id, .. } => Some(user_id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::CrawlRequested;
    use crate::partition::RecordId;
    use crate::stages::agent::AgentTimer;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1_000)
    }

    fn asked(user_id: &str, request: &str, seconds: i64) -> Output {
        let request = CrawlRequested {
            request_id: request.into(),
            user_id: user_id.into(),
            card_id: "k1".into(),
            provider: crate::input::Provider::Paytm,
            mode: crate::output::CrawlMode::OrderCheck,
            order: None,
            from: None,
            limit: None,
            txn_id: None,
        };
        Output { at: at(seconds), body: OutputBody::CrawlRequested(request) }
    }

    fn answer(user_id: &str, request: &str, seconds: i64) -> StageRecord {
        let result = crate::input::CrawlResult {
            request_id: request.into(),
            user_id: user_id.into(),
            card_id: "k1".into(),
            ok: true,
            error: None,
            lines: Vec::new(),
            next_from: None,
        };
        let body =
            AgentBody::Input { event_id: format!("crawl:{request}").into(), command: Command::CrawlResult(result) };
        let message = Message::Agent { user_id: user_id.into(), body };
        StageRecord {
            id: RecordId { source: "outputs".into(), offset: 0, index: 0 },
            at: at(seconds),
            body: RecordBody::Message { message },
        }
    }

    fn timer(user_id: &str) -> Timer {
        Timer::Agent {
            user_id: user_id.into(),
            timer: AgentTimer::CrawlTimeout { card_id: "k1".into(), request_id: "r".into() },
        }
    }

    #[test]
    fn one_agent_waiting_holds_up_no_other() {
        let mut barrier = AnswerBarrier::new(1);
        barrier.await_answers(&[asked("u1", "k1:1", 10)]);
        assert!(barrier.must_hold("u1", at(12)), "past u1's answer (11 s)");
        assert!(!barrier.must_hold("u1", at(11)), "at the answer's time exactly a record goes first");
        assert!(!barrier.must_hold("u2", at(500)), "u2 awaits nothing");
        assert!(barrier.defers_timer("u1", at(11)), "a timer due at the answer's time waits for it");
        assert!(!barrier.defers_timer("u2", at(11)));
        barrier.check().expect("consistent");
    }

    #[test]
    fn an_agent_releases_in_time_order_and_is_forgotten_when_done() {
        let mut barrier = AnswerBarrier::new(1);
        barrier.await_answers(&[asked("u1", "k1:1", 10)]);
        barrier.hold("u1", answer("u1", "other", 20));
        barrier.defer_timer("u1", (at(15), 2), timer("u1"));
        barrier.defer_timer("u1", (at(12), 7), timer("u1"));
        assert_eq!((barrier.held(), barrier.agents_waiting()), (1, 1));
        assert_eq!(barrier.first_held_at(), Some(at(20)));
        barrier.await_answers(&[asked("u2", "k2:1", 3)]);
        barrier.hold("u2", answer("u2", "other", 9));
        barrier.hold("u2", answer("u2", "other", 5));
        assert_eq!(barrier.first_held_at(), Some(at(9)), "the earliest of the agents' first held records");
        assert_eq!(barrier.take_answer(&answer("u2", "k2:1", 4)).as_deref(), Some("u2"));
        assert_eq!(std::iter::from_fn(|| barrier.release("u2")).count(), 2);
        assert!(barrier.release("u1").is_none(), "blocked until the answer");
        barrier.check().expect("consistent");
        assert_eq!(barrier.take_answer(&answer("u1", "k1:1", 11)).as_deref(), Some("u1"));
        assert!(barrier.take_answer(&answer("u1", "k1:1", 11)).is_none(), "an answer is taken once");
        let order: Vec<i64> = std::iter::from_fn(|| barrier.release("u1"))
            .map(|released| match released {
                Released::Timer((due, _), _) => due.millis() / 1_000,
                Released::Record(record) => record.at.millis() / 1_000,
            })
            .collect();
        assert_eq!(order, vec![12, 15, 20]);
        assert_eq!((barrier.held(), barrier.awaited(), barrier.agents_waiting()), (0, 0, 0));
        barrier.check().expect("consistent");
    }

    #[test]
    fn past_the_bound_the_earliest_awaited_answer_is_given_up() {
        let mut barrier = AnswerBarrier::new(1);
        barrier.await_answers(&[asked("u1", "k1:1", 10), asked("u2", "k2:1", 5)]);
        for offset in 0..=HELD_RECORDS_MAX as i64 {
            barrier.hold("u1", answer("u1", "later", 100 + offset));
        }
        assert_eq!(barrier.give_up_past_bounds().as_deref(), Some("u2"), "the earliest awaited, whoever's");
        assert!(barrier.release("u2").is_none(), "u2 held nothing");
        assert_eq!(barrier.agents_waiting(), 1, "and is forgotten");
        assert_eq!(barrier.give_up_past_bounds().as_deref(), Some("u1"));
        assert_eq!((barrier.given_up(), barrier.awaited()), (2, 0));
        assert!(matches!(barrier.release("u1"), Some(Released::Record(_))));
        assert!(barrier.give_up_past_bounds().is_none(), "within the bounds again");
        barrier.check().expect("consistent");
    }

    /// The keyed maps are written as the `BTreeMap`s they replaced wrote them: JSON objects sorted by
    /// id, whatever order the ids came in, so snapshots keep their format (version 4); read back, the
    /// barrier writes the same bytes and refuses an id given twice.
    #[test]
    fn snapshots_write_the_maps_as_objects_sorted_by_id() {
        let mut barrier = AnswerBarrier::new(1);
        barrier.await_answers(&[asked("u3", "k3:1", 10), asked("u1", "k1:1", 12), asked("u2", "k2:1", 11)]);
        for user_id in ["u3", "u1", "u2"] {
            barrier.run_at(user_id, at(9));
        }
        let json = serde_json::to_value(&barrier).expect("encodes");
        let keys = |field: &str| -> Vec<String> {
            json[field].as_object().expect("an object").keys().cloned().collect::<Vec<String>>()
        };
        assert_eq!(keys("awaited"), ["k1:1", "k2:1", "k3:1"]);
        assert_eq!(keys("waiting"), ["u1", "u2", "u3"]);
        assert_eq!(keys("clocks"), ["u1", "u2", "u3"]);
        let bytes = serde_json::to_string(&barrier).expect("encodes");
        assert!(bytes.contains(r#""clocks":{"u1":"1970-01-01T00:00:09Z","u2""#), "{bytes}");
        let back: AnswerBarrier = serde_json::from_str(&bytes).expect("decodes");
        back.check().expect("consistent");
        assert_eq!(serde_json::to_string(&back).expect("encodes"), bytes);
        let twice = bytes.replace(r#""u2":"1970"#, r#""u1":"1970"#);
        let refused = serde_json::from_str::<AnswerBarrier>(&twice).expect_err("an id given twice");
        assert!(refused.to_string().contains("twice"), "{refused}");
    }
}
