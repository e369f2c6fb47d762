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
    /// Awaited answers given up because too many records were held.
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
                if self.awaited.insert(request.request_id.clone(), answer_at).is_none() {
                    self.awaited_by_time.insert((answer_at, request.request_id.clone()));
                }
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
        if self.held.is_empty() && !self.is_behind_barrier(record.at) {
            return Some(record);
        }
        self.held.push_back(record);
        None
    }

    /// The next held record that may be applied now (call after each record applied, until None).
    pub fn release(&mut self) -> Option<StageRecord> {
        let front_at = self.held.front()?.at;
        while self.held.len() > HELD_RECORDS_MAX && self.is_behind_barrier(front_at) {
            self.give_up_first_awaited();
        }
        if self.is_behind_barrier(front_at) {
            return None;
        }
        self.held.pop_front()
    }

    /// Records held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Answers awaited now.
    pub fn awaited(&self) -> usize {
        self.awaited.len()
    }

    /// Awaited answers given up so far (too many records held).
    pub fn given_up(&self) -> u64 {
        self.given_up
    }

    /// Whether a record stamped `at` must wait: an awaited answer is stamped before it. One stamped at
    /// the answer's time exactly goes first, as an input does before a timer due at its time (SPEC §3).
    fn is_behind_barrier(&self, at: Timestamp) -> bool {
        self.awaited_by_time.first().is_some_and(|(answer_at, _)| *answer_at < at)
    }

    fn give_up_first_awaited(&mut self) {
        if let Some((_, request_id)) = self.awaited_by_time.pop_first() {
            self.awaited.remove(&request_id);
            self.given_up += 1;
        }
    }

    /// Every held record and awaited answer is consistent with the other (for restored snapshots).
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
