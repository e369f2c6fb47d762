//! An agent partition waits for the connector's answers before it moves past their time (SPEC §3,
//! R-CHK-1). Pure: what it holds and releases is a function of the partition's log.
//!
//! Why: in replay the simulated provider answers a crawl `crawl_latency` after it was asked, before any
//! input stamped later is applied. A service appends the connector's answer to the partition's log
//! behind whatever arrived meanwhile. A partition that runs behind its inputs (a burst, a reprocessing
//! run) would then apply records stamped minutes later first: the crawl's timeout fires, the check is
//! asked again, the late answer is dropped as stale, and waves and closes decide without the statement
//! they asked for. Measured in the serve benchmark: 4.6–5.8 times the crawls of replay.
//!
//! How: when the connector stamps each answer at a known time (the event clock: the request's time plus
//! `crawl_latency`), the partition notes every crawl it asks with that time. A record stamped later than
//! an awaited answer is held, and so is every record behind it (log order is kept). The answer itself is
//! applied when it arrives, then the held records, as far as the next awaited answer allows. This is the
//! watermark of stream processors: event time does not pass an answer still in flight.
//!
//! Bounded: past [`HELD_RECORDS_MAX`] held records (or [`AWAITED_ANSWERS_MAX`] awaited answers) the
//! earliest awaited answer is given up (counted); its crawl's timeout then fires as it would without the
//! barrier. A request whose answer is given up and then comes is applied like any late answer (R-CHK-1:
//! ignored when already timed out).

use crate::input::Command;
use crate::output::{Output, OutputBody};
use crate::partition::{RecordBody, StageRecord};
use crate::stages::{AgentBody, Message};
use crate::time::Timestamp;
use crate::Text;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Records one partition holds at most while it waits for an answer.
pub const HELD_RECORDS_MAX: usize = 65_536;
/// Answers one partition awaits at most (a connector that stopped answering must not grow the state).
pub const AWAITED_ANSWERS_MAX: usize = 65_536;

/// The answers an agent partition waits for, and the records it holds meanwhile.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AnswerBarrier {
    /// How long after a request the connector stamps its answer (the event clock's `crawl_latency`).
    answer_delay_s: i64,
    /// Requests asked and not answered yet: request id → the answer's time.
    awaited: BTreeMap<Text, Timestamp>,
    /// The same requests by (answer time, request id): the earliest is the barrier.
    awaited_by_time: BTreeSet<(Timestamp, Text)>,
    /// Records that arrived after the barrier's time, in log order.
    held: VecDeque<StageRecord>,
    /// Awaited answers given up because too many records were held or answers awaited.
    given_up: u64,
}

impl AnswerBarrier {
    pub fn new(answer_delay_s: i64) -> AnswerBarrier {
        assert!(answer_delay_s >= 0, "an answer cannot come before its request");
        AnswerBarrier { answer_delay_s, ..AnswerBarrier::default() }
    }

    /// Notes the crawls among a record's outputs: their answers are awaited from now on.
    pub fn await_answers(&mut self, outputs: &[Output]) {
        for output in outputs {
            if let OutputBody::CrawlRequested(request) = &output.body {
                let answer_at = output.at.plus_seconds(self.answer_delay_s);
                // Request ids are unique; one asked again would count from its new time.
                if let Some(before) = self.awaited.insert(request.request_id.clone(), answer_at) {
                    self.awaited_by_time.remove(&(before, request.request_id.clone()));
                }
                self.awaited_by_time.insert((answer_at, request.request_id.clone()));
            }
        }
        while self.awaited.len() > AWAITED_ANSWERS_MAX {
            self.give_up_first_awaited();
        }
        debug_assert_eq!(self.awaited.len(), self.awaited_by_time.len());
    }

    /// Takes an arriving record: returns it if it may be applied now, or holds it. An awaited answer
    /// always passes (it is what the held records wait for).
    pub fn admit(&mut self, record: StageRecord) -> Option<StageRecord> {
        if let Some(request_id) = answered_request(&record) {
            if let Some(answer_at) = self.awaited.remove(request_id) {
                self.awaited_by_time.remove(&(answer_at, request_id.clone()));
                return Some(record);
            }
        }
        if self.held.is_empty() && !self.blocks(record.at) {
            return Some(record);
        }
        self.held.push_back(record);
        None
    }

    /// The next held record that may be applied now (call after each record applied, until None).
    pub fn release(&mut self) -> Option<StageRecord> {
        let front_at = self.held.front()?.at;
        while self.held.len() > HELD_RECORDS_MAX && self.blocks(front_at) {
            self.give_up_first_awaited();
        }
        if self.blocks(front_at) {
            return None;
        }
        self.held.pop_front()
    }

    /// Holds, first of all held records, one whose application a timer stopped: a timer due before it
    /// asked a crawl whose answer is stamped before it too (see `StagePartition::apply`). It was next
    /// in log order (admitted with nothing held, or released from the front), so it goes back first.
    pub fn hold_first(&mut self, record: StageRecord) {
        debug_assert!(self.blocks(record.at), "held without an answer to wait for");
        self.held.push_front(record);
    }

    /// Records held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Answers awaited now.
    pub fn awaited(&self) -> usize {
        self.awaited.len()
    }

    /// Awaited answers given up so far (too many records held or answers awaited).
    pub fn given_up(&self) -> u64 {
        self.given_up
    }

    /// Whether a record stamped `at` must wait: an awaited answer is stamped before it. One stamped at
    /// the answer's time exactly goes first, as an input does before a timer due at its time (SPEC §3).
    pub fn blocks(&self, at: Timestamp) -> bool {
        self.awaited_by_time.first().is_some_and(|(answer_at, _)| *answer_at < at)
    }

    fn give_up_first_awaited(&mut self) {
        if let Some((_, request_id)) = self.awaited_by_time.pop_first() {
            self.awaited.remove(&request_id);
            self.given_up += 1;
        }
    }

    /// The awaited answers agree with their index by time, and the delay is not negative (checked on
    /// restored snapshots).
    pub fn check(&self) -> Result<(), String> {
        if self.awaited.len() != self.awaited_by_time.len()
            || self.awaited_by_time.iter().any(|(at, id)| self.awaited.get(id) != Some(at))
        {
            return Err("the awaited answers disagree with their index by time".into());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{CrawlResult, Provider};
    use crate::output::{CrawlMode, CrawlRequested};
    use crate::partition::RecordId;
    use proptest::prelude::*;

    const DELAY_S: i64 = 1;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1_000)
    }

    fn asked(request: usize, seconds: i64) -> Output {
        let request = CrawlRequested {
            request_id: format!("r{request}").into(),
            user_id: "u1".into(),
            card_id: "k1".into(),
            provider: Provider::Paytm,
            mode: CrawlMode::OrderCheck,
            order: None,
            from: None,
            limit: None,
            txn_id: None,
        };
        Output { at: at(seconds), body: OutputBody::CrawlRequested(request) }
    }

    fn answer(request: usize, seconds: i64, offset: u64) -> StageRecord {
        let result = CrawlResult {
            request_id: format!("r{request}").into(),
            user_id: "u1".into(),
            card_id: "k1".into(),
            ok: true,
            error: None,
            lines: Vec::new(),
            next_from: None,
        };
        let body =
            AgentBody::Input { event_id: format!("crawl:r{request}").into(), command: Command::CrawlResult(result) };
        StageRecord {
            id: RecordId { source: "outputs".into(), offset, index: 0 },
            at: at(seconds),
            body: RecordBody::Message { message: Message::Agent { user_id: "u1".into(), body } },
        }
    }

    fn record(seconds: i64, offset: u64) -> StageRecord {
        StageRecord {
            id: RecordId { source: "ingest".into(), offset, index: 0 },
            at: at(seconds),
            body: RecordBody::Tick,
        }
    }

    /// One step of a partition's life: a record arrives (stamped this many seconds), a record applied
    /// asks a crawl, or the connector answers the oldest unanswered crawl.
    #[derive(Clone, Debug)]
    enum Step {
        Record(i64),
        Ask,
        Answer,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![(0i64..120).prop_map(Step::Record), Just(Step::Ask), Just(Step::Answer)];
        proptest::collection::vec(step, 0..80)
    }

    proptest! {
        /// Whatever the interleaving: no record is applied past an awaited answer's time, records keep
        /// their log order, answers always pass, and once every answer is in nothing is held.
        #[test]
        fn records_wait_for_answers_in_log_order(steps in steps()) {
            let mut barrier = AnswerBarrier::new(DELAY_S);
            let mut clock = 0i64; // the partition's clock: the largest time applied
            let mut unanswered: VecDeque<(usize, i64)> = VecDeque::new();
            let mut asked_count = 0usize;
            let mut arrived = 0u64;
            let mut applied: Vec<u64> = Vec::new();
            let apply = |record: StageRecord, barrier: &AnswerBarrier, clock: &mut i64, applied: &mut Vec<u64>| {
                if record.id.source == "ingest" {
                    let first_awaited = barrier.awaited_by_time.first().map(|(time, _)| *time);
                    prop_assert!(first_awaited.is_none_or(|first| record.at <= first), "applied past an answer");
                    applied.push(record.id.offset);
                }
                *clock = (*clock).max(record.at.millis() / 1_000);
                Ok(())
            };
            for step in steps {
                match step {
                    Step::Record(seconds) => {
                        arrived += 1;
                        if let Some(record) = barrier.admit(record(seconds, arrived)) {
                            apply(record, &barrier, &mut clock, &mut applied)?;
                        }
                    }
                    Step::Ask => {
                        // A crawl asked at the partition's clock, as a stage asks it.
                        barrier.await_answers(&[asked(asked_count, clock)]);
                        unanswered.push_back((asked_count, clock + DELAY_S));
                        asked_count += 1;
                    }
                    Step::Answer => {
                        let Some((request, seconds)) = unanswered.pop_front() else { continue };
                        let passed = barrier.admit(answer(request, seconds, request as u64));
                        prop_assert!(passed.is_some(), "an awaited answer is applied on arrival");
                        if let Some(record) = passed {
                            apply(record, &barrier, &mut clock, &mut applied)?;
                        }
                    }
                }
                while let Some(record) = barrier.release() {
                    apply(record, &barrier, &mut clock, &mut applied)?;
                }
                prop_assert!(barrier.check().is_ok());
                prop_assert!(barrier.held() <= HELD_RECORDS_MAX);
            }
            while let Some((request, seconds)) = unanswered.pop_front() {
                if let Some(record) = barrier.admit(answer(request, seconds, request as u64)) {
                    apply(record, &barrier, &mut clock, &mut applied)?;
                }
                while let Some(record) = barrier.release() {
                    apply(record, &barrier, &mut clock, &mut applied)?;
                }
            }
            prop_assert_eq!(barrier.held(), 0);
            prop_assert_eq!(barrier.awaited(), 0);
            prop_assert_eq!(barrier.given_up(), 0);
            prop_assert_eq!(applied, (1..=arrived).collect::<Vec<_>>(), "every record once, in log order");
        }
    }
}
