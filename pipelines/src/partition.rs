//! One partition of one stage (SPEC §3), the unit a partitioned runtime runs: the embedded backend runs
//! one per (stage, partition) over a durable log, the Kafka profile one per assigned topic partition.
//!
//! A stage partition consumes one totally ordered log of [`StageRecord`]s: inputs routed to it, messages
//! from other stages and ticks. Its state (the stage's keyed state, its timers, its clock and the
//! producers' high-water marks) is a pure function of that log, so a runtime restores it by applying the
//! log again from the start, and the partition produces the same messages and outputs byte for byte. Or
//! from a snapshot ([`StagePartition::snapshot`], [`StagePartition::restore`], see [`crate::snapshot`]) of
//! the state at some position of the log, applying only the records after it.
//! Still pure: no I/O, no OS clock.

use crate::answer_barrier::{agent_of, timer_agent, AnswerBarrier, Released};
use crate::config::Config;
use crate::input::{Command, Input};
use crate::output::Output;
use crate::snapshot::SnapshotError;
use crate::stages::agent::{AgentStage, AgentTimer};
use crate::stages::merchant::MerchantStage;
use crate::stages::order::OrderStage;
use crate::stages::{AgentBody, Effects, MerchantBody, Message, OrderBody, Timer};
use crate::time::Timestamp;
use crate::timers::TimerQueue;
use crate::Text;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Internal events one record may cause inside its partition before it is declared a livelock.
const LOCAL_EVENTS_MAX: usize = 1_000_000;

/// The three stages of SPEC §3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    Order,
    Agent,
    Merchant,
}

impl StageKind {
    pub const ALL: [StageKind; 3] = [StageKind::Order, StageKind::Agent, StageKind::Merchant];

    pub fn name(self) -> &'static str {
        match self {
            StageKind::Order => "order",
            StageKind::Agent => "agent",
            StageKind::Merchant => "merchant",
        }
    }
}

/// The partition a key belongs to: CRC-32 of the key modulo the partition count (librdkafka's
/// `consistent` partitioner), stable across processes, versions and restarts.
pub fn partition_of(key: &str, partitions: u32) -> u32 {
    assert!(partitions > 0, "a stage has at least one partition");
    crc32fast::hash(key.as_bytes()) % partitions
}

/// The key a timer belongs to (none for the simulated provider's, which no partition runs).
pub fn timer_key(timer: &Timer) -> Option<&str> {
    match timer {
        Timer::Order { order_id, .. } => Some(order_id),
        Timer::Agent { user_id, .. } => Some(user_id),
        Timer::Provider(_) => None,
    }
}

/// The stage and key a message is addressed to.
pub fn destination(message: &Message) -> (StageKind, &str) {
    match message {
        Message::Order { order_id, .. } => (StageKind::Order, order_id),
        Message::Agent { user_id, .. } => (StageKind::Agent, user_id),
        Message::Merchant { merchant_id, .. } => (StageKind::Merchant, merchant_id),
    }
}

/// Where an input goes (SPEC §5 table).
#[derive(Clone, Debug)]
pub enum Routed {
    /// To one stage, keyed.
    Message(Message),
    /// `tick`: to every partition of every stage (it only advances clocks).
    Broadcast,
    /// A simulated-wallet event: only the simulated provider consumes it.
    Wallet(Command),
}

/// Routes an input to the stage that owns it (SPEC §5 table).
#[inline]
pub fn route_input(input: Input) -> Routed {
    let Input { event_id, command, .. } = input;
    // The key is copied (inline for short ids) before the command moves into the message.
    let message = match input_key(&command) {
        InputKey::Broadcast => return Routed::Broadcast,
        InputKey::Wallet(_) => return Routed::Wallet(command),
        InputKey::Merchant(id) => {
            let merchant_id = id.clone();
            Message::Merchant { merchant_id, body: MerchantBody::Input { event_id, command } }
        }
        InputKey::Agent(id) => {
            let user_id = id.clone();
            Message::Agent { user_id, body: AgentBody::Input { event_id, command } }
        }
        InputKey::Order(id) => {
            let order_id = id.clone();
            Message::Order { order_id, body: OrderBody::Input { event_id, command } }
        }
    };
    Routed::Message(message)
}

/// Whose state an input is for (SPEC §5 table): what [`route_input`] routes by, and what the engine
/// announces to the CPU ahead of applying the input.
pub enum InputKey<'a> {
    /// `tick`: every partition.
    Broadcast,
    /// A simulated-wallet event, by card.
    Wallet(&'a Text),
    Merchant(&'a Text),
    Agent(&'a Text),
    Order(&'a Text),
}

/// The key of the state `command` is for (SPEC §5 table).
pub fn input_key(command: &Command) -> InputKey<'_> {
    match command {
        Command::Tick(_) => InputKey::Broadcast,
        Command::WalletLine(c) => InputKey::Wallet(&c.card_id),
        Command::WalletLineStatus(c) => InputKey::Wallet(&c.card_id),
        Command::WalletFault(c) => InputKey::Wallet(&c.card_id),
        Command::MerchantRegistered(c) => InputKey::Merchant(&c.merchant_id),
        Command::MerchantDeposit(c) => InputKey::Merchant(&c.merchant_id),
        Command::UserRegistered(c) => InputKey::Agent(&c.user_id),
        Command::CardBound(c) => InputKey::Agent(&c.user_id),
        Command::UserRecharge(c) => InputKey::Agent(&c.user_id),
        Command::UserAdjustment(c) => InputKey::Agent(&c.user_id),
        Command::CrawlResult(c) => InputKey::Agent(&c.user_id),
        Command::CardReauthenticated(c) => InputKey::Agent(&c.user_id),
        Command::AdminUnban(c) => InputKey::Agent(&c.user_id),
        Command::CollectionCreated(c) => InputKey::Order(&c.order_id),
        Command::CollectionDispatched(c) => InputKey::Order(&c.order_id),
        Command::PaymentConfirmed(c) => InputKey::Order(&c.order_id),
        Command::OrderCancelled(c) => InputKey::Order(&c.order_id),
        Command::SupplementRequested(c) => InputKey::Order(&c.order_id),
        Command::CollectionRetry(c) => InputKey::Order(&c.order_id),
        Command::PayoutCreated(c) => InputKey::Order(&c.order_id),
        Command::PayoutGrabbed(c) => InputKey::Order(&c.order_id),
        Command::AdminApprove(c) => InputKey::Order(&c.order_id),
        Command::AdminReject(c) => InputKey::Order(&c.order_id),
        Command::AdminCrawlRetry(c) => InputKey::Order(&c.order_id),
        Command::AdminCorrectCancel(c) => InputKey::Order(&c.order_id),
        Command::AdminCancelPayout(c) => InputKey::Order(&c.order_id),
    }
}

/// The id of a record: the position of what produced it (a log and offset, and the index among the
/// records that one position produced). Producers append in position order, so a consumer drops any
/// record at or below the last id it applied from the same source, whatever delivered it twice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RecordId {
    pub source: Text,
    pub offset: u64,
    pub index: u32,
}

/// One record of a stage partition's input log.
///
/// Encoded as a JSON array, `[source, offset, index, at, message]` (`at` in milliseconds since the
/// epoch; a tick has no message), by [`StageRecord`]'s own `Serialize`. The envelope as an object
/// (`{"id":{"source":…,"offset":…,"index":…},"at":"…","body":{"kind":"message","message":…}}`) took
/// ≈ 110 of a typical record's ≈ 320 bytes, the array ≈ 30 (the serve benchmark's stage logs: a quarter
/// fewer bytes to copy, write and sync), and its timestamp text was the one part that cost to write.
/// Both forms are read (`Deserialize`): logs written before hold objects.
#[derive(Clone, Debug)]
pub struct StageRecord {
    pub id: RecordId,
    /// Event time: an input's `at`, or the time at which a stage produced the message.
    pub at: Timestamp,
    pub body: RecordBody,
}

impl StageRecord {
    /// The event time of a stage record's JSON, in either form, without reading its message (a lag
    /// report asks it of the first record waiting in each log). None for bytes that are neither form.
    pub fn event_time_of(bytes: &[u8]) -> Option<Timestamp> {
        crate::decode::from_json_bytes::<RecordTime>(bytes).ok().map(|RecordTime(at)| at)
    }
}

/// A stage record's time, the rest of the record skipped: its fourth element, or its `at` key.
struct RecordTime(Timestamp);

impl<'de> Deserialize<'de> for RecordTime {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RecordTimeVisitor)
    }
}

struct RecordTimeVisitor;

impl<'de> serde::de::Visitor<'de> for RecordTimeVisitor {
    type Value = RecordTime;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        StageRecordVisitor.expecting(formatter)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut elements: A) -> Result<RecordTime, A::Error> {
        use serde::de::{Error, IgnoredAny};
        for index in 0..3 {
            elements.next_element::<IgnoredAny>()?.ok_or_else(|| A::Error::invalid_length(index, &self))?;
        }
        let at_millis: i64 = elements.next_element()?.ok_or_else(|| A::Error::invalid_length(3, &self))?;
        while elements.next_element::<IgnoredAny>()?.is_some() {}
        Ok(RecordTime(Timestamp::from_millis(at_millis)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, fields: A) -> Result<RecordTime, A::Error> {
        #[derive(Deserialize)]
        struct Stamped {
            at: Timestamp,
        }
        let Stamped { at } = Stamped::deserialize(serde::de::value::MapAccessDeserializer::new(fields))?;
        Ok(RecordTime(at))
    }
}

impl Serialize for StageRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let message = match &self.body {
            RecordBody::Message { message } => Some(message),
            RecordBody::Tick => None,
        };
        let mut tuple = serializer.serialize_tuple(if message.is_some() { 5 } else { 4 })?;
        tuple.serialize_element(self.id.source.as_str())?;
        tuple.serialize_element(&self.id.offset)?;
        tuple.serialize_element(&self.id.index)?;
        tuple.serialize_element(&self.at.millis())?;
        if let Some(message) = message {
            tuple.serialize_element(message)?;
        }
        tuple.end()
    }
}

impl<'de> Deserialize<'de> for StageRecord {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StageRecordVisitor)
    }
}

/// Reads a [`StageRecord`] in either form: the array written now, or the object written before.
struct StageRecordVisitor;

impl<'de> serde::de::Visitor<'de> for StageRecordVisitor {
    type Value = StageRecord;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a stage record: [source, offset, index, at, message?] or its object form")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut elements: A) -> Result<StageRecord, A::Error> {
        use serde::de::Error;
        let missing = |index: usize| A::Error::invalid_length(index, &self);
        let source: Text = elements.next_element()?.ok_or_else(|| missing(0))?;
        let offset: u64 = elements.next_element()?.ok_or_else(|| missing(1))?;
        let index: u32 = elements.next_element()?.ok_or_else(|| missing(2))?;
        let at_millis: i64 = elements.next_element()?.ok_or_else(|| missing(3))?;
        let body = match elements.next_element::<Message>()? {
            Some(message) => RecordBody::Message { message },
            None => RecordBody::Tick,
        };
        if elements.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(A::Error::invalid_length(6, &self));
        }
        Ok(StageRecord { id: RecordId { source, offset, index }, at: Timestamp::from_millis(at_millis), body })
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, fields: A) -> Result<StageRecord, A::Error> {
        /// The object form, as `#[derive(Deserialize)]` read it before the array form.
        #[derive(Deserialize)]
        struct ObjectForm {
            id: RecordId,
            at: Timestamp,
            body: RecordBody,
        }
        let ObjectForm { id, at, body } =
            ObjectForm::deserialize(serde::de::value::MapAccessDeserializer::new(fields))?;
        Ok(StageRecord { id, at, body })
    }
}

/// Nearly every record is a message; boxing it to shrink the tick would cost an allocation each.
/// Read with [`crate::decode`]: the tag first, no buffering of the message.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RecordBody {
    Message {
        message: Message,
    },
    /// Advances the clock: every timer due at or before `at` fires.
    Tick,
}

impl crate::decode::Tagged for RecordBody {
    const TAG: &'static str = "kind";
    const VARIANTS: &'static [&'static str] = &["message", "tick"];

    fn variant<'de, D: serde::Deserializer<'de>>(index: usize, fields: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct MessageFields {
            message: Message,
        }
        #[derive(Deserialize)]
        struct TickFields {}
        if index == 0 {
            let MessageFields { message } = MessageFields::deserialize(fields)?;
            Ok(RecordBody::Message { message })
        } else {
            TickFields::deserialize(fields)?;
            Ok(RecordBody::Tick)
        }
    }
}

impl<'de> Deserialize<'de> for RecordBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::decode::deserialize(deserializer)
    }
}

/// What applying records produced: messages for other partitions (with their event time) and outputs.
#[derive(Debug, Default)]
pub struct Produced {
    pub messages: Vec<(Timestamp, Message)>,
    pub outputs: Vec<Output>,
    /// Keys of this partition whose state a message or timer may have changed, in handling order (with
    /// repeats): what a read model must project again.
    pub touched: Vec<Text>,
}

impl Produced {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.outputs.is_empty()
    }

    pub fn clear(&mut self) {
        self.messages.clear();
        self.outputs.clear();
        self.touched.clear();
    }
}

/// Whether a record changed anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Applied,
    /// At or below the high-water mark of its source: delivered twice, ignored.
    Duplicate,
}

/// The state of one stage's partition (one per partition, so its size does not matter).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
pub enum StageState {
    Order(OrderStage),
    Agent(AgentStage),
    Merchant(MerchantStage),
}

/// Everything here is in a snapshot (see [`StagePartition::snapshot`]), in this order.
#[derive(Debug, Serialize, Deserialize)]
pub struct StagePartition {
    kind: StageKind,
    partition: u32,
    partitions: u32,
    state: StageState,
    /// Due timers by (due, creation).
    timers: TimerQueue<Timer>,
    timers_created: u64,
    clock: Timestamp,
    /// Last record id applied per source (exactly-once across redeliveries).
    high_water: BTreeMap<Text, (u64, u32)>,
    /// Empty between records (drained after every handler); kept in snapshots all the same.
    effects: Effects,
    /// Empty between records too; each with the time of its cause.
    local: VecDeque<(Work, Timestamp)>,
    records_applied: u64,
    duplicates_dropped: u64,
    /// An agent partition whose crawls are answered at a known time waits for the answers (see
    /// [`AnswerBarrier`]); None: records are applied as they arrive.
    answer_barrier: Option<AnswerBarrier>,
}

/// What a snapshot encodes: the partition and, for the agent stage (the only one that reads it), the
/// fingerprint of its configuration.
#[derive(Serialize)]
struct SnapshotRef<'a> {
    config: Option<u32>,
    partition: &'a StagePartition,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Snapshot {
    config: Option<u32>,
    partition: StagePartition,
}

/// CRC-32 of the configuration's `Debug` form: equal configurations, equal fingerprints (within a build;
/// a build that formats it differently refuses older snapshots, and the runtime applies the log instead).
fn config_fingerprint(config: &Config) -> u32 {
    crc32fast::hash(format!("{config:?}").as_bytes())
}

/// Most work is messages; boxing them to shrink the rarer timer variant would add an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
enum Work {
    Message(Message),
    Timer(Timer),
}

impl StagePartition {
    pub fn new(kind: StageKind, partition: u32, partitions: u32, config: Config) -> StagePartition {
        assert!(partition < partitions, "partition {partition} of {partitions}");
        let state = match kind {
            StageKind::Order => StageState::Order(OrderStage::default()),
            StageKind::Agent => StageState::Agent(AgentStage::new(config)),
            StageKind::Merchant => StageState::Merchant(MerchantStage::default()),
        };
        StagePartition {
            kind,
            partition,
            partitions,
            state,
            timers: TimerQueue::new(),
            timers_created: 0,
            clock: Timestamp::default(),
            high_water: BTreeMap::new(),
            effects: Effects::default(),
            local: VecDeque::new(),
            records_applied: 0,
            duplicates_dropped: 0,
            answer_barrier: None,
        }
    }

    /// Makes this agent partition wait for each crawl's answer, stamped `answer_delay_s` after the
    /// request, before it applies records stamped later (see [`AnswerBarrier`]). For a runtime whose
    /// connector stamps answers so (the event clock). Part of the state: a log applied again with the
    /// barrier must be applied with the same one. No effect on other stages (they ask no crawls).
    pub fn with_answer_barrier(mut self, answer_delay_s: i64) -> StagePartition {
        if self.kind == StageKind::Agent {
            self.answer_barrier = Some(AnswerBarrier::new(answer_delay_s));
        }
        self
    }

    /// The barrier, if this partition waits for answers.
    pub fn answer_barrier(&self) -> Option<&AnswerBarrier> {
        self.answer_barrier.as_ref()
    }

    pub fn kind(&self) -> StageKind {
        self.kind
    }

    /// Whether the agent state's indexes, and the agent timers', point at what exists (see `restore`).
    fn check_references(&self) -> Result<(), String> {
        let StageState::Agent(stage) = &self.state else {
            return Ok(());
        };
        for agent in stage.agents.values() {
            agent.check_references()?;
        }
        for timer in self.timers.values().chain(self.effects.timers.iter().map(|(_, timer)| timer)) {
            let Timer::Agent { user_id, timer } = timer else {
                continue;
            };
            let sub = match timer {
                AgentTimer::CollectionWave { sub }
                | AgentTimer::Close { sub }
                | AgentTimer::ConfirmWave { sub, .. }
                | AgentTimer::PayTimeout { sub }
                | AgentTimer::UnderpaidTimeout { sub }
                | AgentTimer::BillPendingTimeout { sub }
                | AgentTimer::DetailRetry { sub } => *sub,
                AgentTimer::CrawlTimeout { .. }
                | AgentTimer::CrawlRetry { .. }
                | AgentTimer::Reservoir { .. }
                | AgentTimer::DebtSweep => continue,
            };
            if stage.agents.get(user_id).is_some_and(|agent| sub >= agent.subs.len()) {
                return Err(format!("a timer names sub-order {sub} of agent {user_id}, which has fewer"));
            }
        }
        Ok(())
    }

    /// The number of partitions of this partition's stage.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The partition's complete state as bytes (see [`crate::snapshot`] for the encoding): restoring them
    /// with [`StagePartition::restore`] gives a partition that applies the rest of its log exactly as
    /// this one would, and whose snapshot is these bytes again. Deterministic: equal states give equal
    /// bytes. The configuration is not in it (only its fingerprint): `restore` takes it.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let config = match &self.state {
            StageState::Agent(stage) => Some(config_fingerprint(&stage.config)),
            StageState::Order(_) | StageState::Merchant(_) => None,
        };
        let body = SnapshotRef { config, partition: self };
        let json = serde_json::to_vec(&body).map_err(|error| SnapshotError::Encode(error.to_string()))?;
        Ok(crate::snapshot::frame(&json))
    }

    /// Restores a partition from [`StagePartition::snapshot`] bytes. `config` is the configuration the
    /// partition runs with; an agent partition's snapshot taken under another one is refused
    /// ([`SnapshotError::ConfigMismatch`]), as are another format version, corrupt or truncated bytes and
    /// a state that contradicts itself. Never panics on bad bytes.
    pub fn restore(bytes: &[u8], config: Config) -> Result<StagePartition, SnapshotError> {
        let body = crate::snapshot::unframe(bytes)?;
        let Snapshot { config: fingerprint, partition: mut restored } =
            serde_json::from_slice(body).map_err(|error| SnapshotError::Corrupt(error.to_string()))?;
        if restored.partitions == 0 || restored.partition >= restored.partitions {
            let (partition, partitions) = (restored.partition, restored.partitions);
            return Err(SnapshotError::Inconsistent(format!("partition {partition} of {partitions}")));
        }
        let kind = match &restored.state {
            StageState::Order(_) => StageKind::Order,
            StageState::Agent(_) => StageKind::Agent,
            StageState::Merchant(_) => StageKind::Merchant,
        };
        if kind != restored.kind {
            let (expected, found) = (restored.kind.name(), kind.name());
            return Err(SnapshotError::Inconsistent(format!("a {expected} partition with {found} state")));
        }
        restored.check_references().map_err(SnapshotError::Inconsistent)?;
        if let StageState::Agent(stage) = &mut restored.state {
            stage.agents.values_mut().for_each(crate::stages::agent::state::Agent::derive_indexes);
        }
        if let Some(barrier) = &restored.answer_barrier {
            barrier.check().map_err(SnapshotError::Inconsistent)?;
        }
        let expected = config_fingerprint(&config);
        match (&mut restored.state, fingerprint) {
            (StageState::Agent(stage), Some(found)) => {
                if found != expected {
                    return Err(SnapshotError::ConfigMismatch { found, expected });
                }
                stage.config = config;
            }
            (StageState::Agent(_), None) => {
                return Err(SnapshotError::Inconsistent("an agent partition without its configuration".into()))
            }
            (_, _) => {}
        }
        Ok(restored)
    }

    pub fn partition(&self) -> u32 {
        self.partition
    }

    pub fn state(&self) -> &StageState {
        &self.state
    }

    /// The largest event time consumed (SPEC §3).
    pub fn clock(&self) -> Timestamp {
        self.clock
    }

    /// When the next timer falls due (the ticker appends a tick only to partitions that need one). The
    /// timers of agents waiting for an answer are not among them once their time has passed: the answer
    /// fires them.
    pub fn next_timer_due(&self) -> Option<Timestamp> {
        self.timers.first_key().map(|(due, _)| due)
    }

    pub fn records_applied(&self) -> u64 {
        self.records_applied
    }

    pub fn duplicates_dropped(&self) -> u64 {
        self.duplicates_dropped
    }

    /// The id (offset, index) of the last record applied from `source`, if any: a producer that
    /// appends again must use a larger one, or the record is dropped as a duplicate.
    pub fn last_applied(&self, source: &str) -> Option<(u64, u32)> {
        self.high_water.get(source).copied()
    }

    /// Applies one record of this partition's log; what it produced is appended to `produced`. With an
    /// answer barrier a record for an agent may be held instead, and what the agent held before may be
    /// applied with it (what that produces is appended too, so it takes ids from this record's position).
    pub fn apply(&mut self, record: StageRecord, produced: &mut Produced) -> Applied {
        let position = (record.id.offset, record.id.index);
        match self.high_water.get_mut(&record.id.source) {
            Some(last) if *last >= position => {
                self.duplicates_dropped += 1;
                return Applied::Duplicate;
            }
            Some(last) => *last = position,
            None => {
                self.high_water.insert(record.id.source.clone(), position);
            }
        }
        self.records_applied += 1;
        let user_id = match &self.answer_barrier {
            Some(_) => agent_of(&record).cloned(),
            None => None,
        };
        match user_id {
            Some(user_id) => self.admit(&user_id, record, produced),
            // Without a barrier nothing stops a record; a tick (for every key) is never held, and the
            // timers it fires for agents waiting past their time are deferred instead.
            None => {
                let stopped = self.apply_now(record, None, produced);
                debug_assert!(stopped.is_none(), "only a record for a waiting agent stops");
            }
        }
        while let Some(user_id) = self.answer_barrier.as_mut().and_then(AnswerBarrier::give_up_past_bounds) {
            self.release(&user_id, produced);
        }
        Applied::Applied
    }

    /// A record for an agent, with the barrier: applied now (an awaited answer always is), or held
    /// behind what the agent waits for; then whatever the agent may apply after it.
    fn admit(&mut self, user_id: &Text, record: StageRecord, produced: &mut Produced) {
        let to_apply = match self.answer_barrier.as_mut() {
            Some(barrier) => {
                let answer = barrier.take_answer(&record).is_some();
                if !answer && barrier.must_hold(user_id, record.at) {
                    barrier.hold(user_id, record);
                    None
                } else {
                    Some(record)
                }
            }
            None => Some(record),
        };
        if let Some(record) = to_apply {
            self.apply_for_agent(user_id, record, produced);
        }
        self.release(user_id, produced);
    }

    /// Applies, while the barrier lets it, what `user_id` holds and the timers it deferred, in time order.
    fn release(&mut self, user_id: &Text, produced: &mut Produced) {
        while let Some(released) = self.answer_barrier.as_mut().and_then(|barrier| barrier.release(user_id)) {
            match released {
                Released::Timer(key, timer) => self.fire_timer(key, timer, produced),
                Released::Record(record) => self.apply_for_agent(user_id, record, produced),
            }
        }
    }

    /// Applies a record for `user_id` after the timers it deferred that fall due before it, unless one of
    /// them (or of those the record fires) asks a crawl whose answer is stamped before the record too: in
    /// replay that answer comes first (and before the crawl's timeout, another timer due before the
    /// record), so the record is held, first of what the agent holds.
    fn apply_for_agent(&mut self, user_id: &Text, record: StageRecord, produced: &mut Produced) {
        self.fire_deferred_before(user_id, record.at, produced);
        let stopped = match &self.answer_barrier {
            Some(barrier) if barrier.blocks(user_id, record.at) => Some(record),
            _ => self.apply_now(record, Some(user_id), produced),
        };
        if let (Some(stopped), Some(barrier)) = (stopped, self.answer_barrier.as_mut()) {
            barrier.hold_first(user_id, stopped);
        }
    }

    /// Fires the timers `user_id` deferred that fall due before `at` and may fire now, in order.
    fn fire_deferred_before(&mut self, user_id: &Text, at: Timestamp, produced: &mut Produced) {
        while let Some((key, timer)) =
            self.answer_barrier.as_mut().and_then(|barrier| barrier.release_timer_before(user_id, at))
        {
            self.fire_timer(key, timer, produced);
        }
    }

    /// Applies a record past the duplicate check and the barrier (`user_id`: the agent it is for, with
    /// a barrier). Returns it unapplied when a timer of that agent due before it asked a crawl whose
    /// answer is stamped before it too (see [`StagePartition::apply_for_agent`]). Timers fired before
    /// the stop stay fired.
    fn apply_now(
        &mut self,
        record: StageRecord,
        user_id: Option<&Text>,
        produced: &mut Produced,
    ) -> Option<StageRecord> {
        let at = record.at;
        // A tick fires the timers due at its time too; an input goes before them (SPEC §3).
        let fires_due_at = matches!(record.body, RecordBody::Tick);
        if !self.fire_timers(at, fires_due_at, user_id, produced) {
            return Some(record);
        }
        let now = match (user_id, self.answer_barrier.as_mut()) {
            (Some(user_id), Some(barrier)) => barrier.run_at(user_id, at),
            _ => self.clock.max(at),
        };
        self.clock = self.clock.max(at);
        let first_output = produced.outputs.len();
        if let RecordBody::Message { message } = record.body {
            debug_assert_eq!(self.owner_of(&message), (self.kind, self.partition), "misrouted record");
            self.run(Work::Message(message), now, at, produced);
        }
        if let Some(barrier) = self.answer_barrier.as_mut() {
            barrier.await_answers(&produced.outputs[first_output..]);
        }
        None
    }

    fn owner_of(&self, message: &Message) -> (StageKind, u32) {
        let (kind, key) = destination(message);
        (kind, partition_of(key, self.partitions))
    }

    /// Fires, in (due, creation) order (SPEC §3), the timers due before a record stamped `record_at`
    /// (and those due at it, if `fires_due_at`); with an answer barrier, a timer of an agent that waits
    /// for an answer stamped at or before its due time is deferred to the agent instead. Stops (returns false) once a
    /// timer of `user_id` (the agent the record is for) has asked a crawl whose answer the record must
    /// wait for.
    fn fire_timers(
        &mut self,
        record_at: Timestamp,
        fires_due_at: bool,
        user_id: Option<&Text>,
        produced: &mut Produced,
    ) -> bool {
        while let Some((due, _)) = self.timers.first_key() {
            if due > record_at || (due == record_at && !fires_due_at) {
                break;
            }
            let Some((key, timer)) = self.timers.pop_first() else {
                break;
            };
            // The agent the timer belongs to, where a barrier may defer it.
            let owner = self.answer_barrier.as_ref().and_then(|_| timer_agent(&timer).cloned());
            let Some(owner) = owner else {
                self.fire_timer(key, timer, produced);
                continue;
            };
            if let Some(barrier) = self.answer_barrier.as_mut().filter(|barrier| barrier.defers_timer(&owner, due)) {
                barrier.defer_timer(&owner, key, timer);
                continue;
            }
            self.fire_timer(key, timer, produced);
            if user_id == Some(&owner) {
                self.fire_deferred_before(&owner, record_at, produced);
                if self.answer_barrier.as_ref().is_some_and(|barrier| barrier.blocks(&owner, record_at)) {
                    return false;
                }
            } else {
                // The timer may have set timers whose time has passed (deferred to the agent): they fire
                // now, as they would have in replay.
                self.release(&owner, produced);
            }
        }
        true
    }

    /// Fires one timer. A timer acts, and stamps what it emits, at its due time (or at the clock if
    /// overdue): the partition's clock, or with an answer barrier the agent's own.
    fn fire_timer(&mut self, key: crate::timers::TimerKey, timer: Timer, produced: &mut Produced) {
        let (due, _) = key;
        let now = match (timer_agent(&timer), self.answer_barrier.as_mut()) {
            (Some(user_id), Some(barrier)) => barrier.run_at(user_id, due),
            _ => self.clock.max(due),
        };
        self.clock = self.clock.max(due);
        let first_output = produced.outputs.len();
        self.run(Work::Timer(timer), now, due, produced);
        if let Some(barrier) = self.answer_barrier.as_mut() {
            barrier.await_answers(&produced.outputs[first_output..]);
        }
    }

    /// Processes one unit of work and what it causes in this partition, FIFO; messages for other
    /// partitions leave through `produced`.
    fn run(&mut self, first: Work, now: Timestamp, cause_at: Timestamp, produced: &mut Produced) {
        let mut local = std::mem::take(&mut self.local);
        debug_assert!(local.is_empty());
        local.push_back((first, cause_at));
        let mut processed = 0usize;
        while let Some((work, cause_at)) = local.pop_front() {
            processed += 1;
            assert!(processed <= LOCAL_EVENTS_MAX, "livelock: one record caused {LOCAL_EVENTS_MAX} events");
            self.effects.now = now;
            self.effects.cause_at = cause_at;
            match work {
                Work::Message(message) => {
                    produced.touched.push(destination(&message).1.into());
                    self.deliver(message)
                }
                Work::Timer(timer) => {
                    if let Some(key) = timer_key(&timer) {
                        produced.touched.push(key.into());
                    }
                    self.fire(timer)
                }
            }
            produced.outputs.append(&mut self.effects.outputs);
            // Each message carries the time in effect when it was sent (a handler applying commands that
            // waited raises it command by command).
            for (index, message) in self.effects.messages.drain(..).enumerate() {
                let sent_at = crate::stages::sent_at(&self.effects.cause_raised, index, cause_at);
                let (kind, key) = destination(&message);
                if kind == self.kind && partition_of(key, self.partitions) == self.partition {
                    local.push_back((Work::Message(message), sent_at));
                } else {
                    produced.messages.push((sent_at, message));
                }
            }
            self.effects.cause_raised.clear();
            for (due, timer) in self.effects.timers.drain(..) {
                self.timers_created += 1;
                let key = (due, self.timers_created);
                // A waiting agent's timer whose time has passed (the agent runs behind the partition's
                // clock) joins the timers it deferred: released with them, in time order, before what
                // the agent holds that is stamped later. The partition's queue would fire it only with
                // the next record or tick, after them.
                match (self.answer_barrier.as_mut(), timer_agent(&timer)) {
                    (Some(barrier), Some(user_id)) if due < self.clock && barrier.is_waiting(user_id) => {
                        let user_id = user_id.clone();
                        barrier.defer_timer(&user_id, key, timer);
                    }
                    _ => self.timers.insert(key, timer),
                }
            }
        }
        self.local = local;
    }

    fn deliver(&mut self, message: Message) {
        let effects = &mut self.effects;
        match (&mut self.state, message) {
            (StageState::Order(stage), Message::Order { order_id, body }) => stage.handle(&order_id, body, effects),
            (StageState::Agent(stage), Message::Agent { user_id, body }) => stage.handle(&user_id, body, effects),
            (StageState::Merchant(stage), Message::Merchant { merchant_id, body }) => {
                stage.handle(&merchant_id, body, effects)
            }
            (_, message) => debug_assert!(false, "a {} partition got {message:?}", self.kind.name()),
        }
    }

    fn fire(&mut self, timer: Timer) {
        let effects = &mut self.effects;
        match (&mut self.state, timer) {
            (StageState::Order(stage), Timer::Order { order_id, timer }) => stage.on_timer(&order_id, timer, effects),
            (StageState::Agent(stage), Timer::Agent { user_id, timer }) => stage.on_timer(&user_id, timer, effects),
            // Provider timers belong to the simulated provider of replay, which a runtime does not run.
            (_, timer) => debug_assert!(false, "a {} partition got timer {timer:?}", self.kind.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{parse_line, Parsed};
    use crate::stages::agent::state::Agent;

    fn input(line: &str, event_id: &str) -> Input {
        match parse_line(line, || event_id.to_string()) {
            Ok(Parsed::Input(input)) => input,
            other => panic!("not an input: {other:?}"),
        }
    }

    fn record(line: &str, offset: u64) -> StageRecord {
        let input = input(line, &format!("line:{offset}"));
        let at = input.at;
        let Routed::Message(message) = route_input(input) else { panic!("not routed to a stage") };
        StageRecord {
            id: RecordId { source: "ingest".into(), offset, index: 0 },
            at,
            body: RecordBody::Message { message },
        }
    }

    fn agent<'a>(partition: &'a StagePartition, user_id: &str) -> &'a Agent {
        match partition.state() {
            StageState::Agent(stage) => stage.agents.get(user_id).expect("the agent exists"),
            other => panic!("not an agent partition: {other:?}"),
        }
    }

    const REGISTERED: &str =
        r#"{"type":"user_registered","at":"2026-03-02T09:00:00Z","user_id":"u1","telegram_bound":false}"#;
    const RECHARGED: &str =
        r#"{"type":"user_recharge","at":"2026-03-02T09:00:01Z","user_id":"u1","amount":"500.00","commission":"0.00"}"#;

    /// The merchant stage's acceptance of an order's creation, stamped `at`, at `offset` of its log.
    fn creation_accepted(order_id: &str, at: &str, offset: u64) -> StageRecord {
        StageRecord {
            id: RecordId { source: "merchant-0".into(), offset, index: 0 },
            at: Timestamp::parse(at).expect("a time"),
            body: RecordBody::Message {
                message: Message::Order { order_id: order_id.into(), body: OrderBody::CreationAccepted },
            },
        }
    }

    #[test]
    fn a_record_delivered_twice_is_applied_once() {
        let mut partition = StagePartition::new(StageKind::Agent, 0, 1, Config::default());
        let mut produced = Produced::default();
        assert_eq!(partition.apply(record(REGISTERED, 0), &mut produced), Applied::Applied);
        assert_eq!(partition.apply(record(RECHARGED, 1), &mut produced), Applied::Applied);
        assert_eq!(partition.apply(record(RECHARGED, 1), &mut produced), Applied::Duplicate);
        assert_eq!(partition.apply(record(REGISTERED, 0), &mut produced), Applied::Duplicate);
        assert_eq!(agent(&partition, "u1").available.to_string(), "500.00");
        assert_eq!(agent(&partition, "u1").journal.len(), 1);
        assert_eq!(partition.duplicates_dropped(), 2);
    }

    #[test]
    fn records_survive_the_log_byte_for_byte() {
        let original = record(RECHARGED, 7);
        let bytes = serde_json::to_vec(&original).expect("serializes");
        let decoded: StageRecord = serde_json::from_slice(&bytes).expect("deserializes");
        assert_eq!(serde_json::to_vec(&decoded).expect("serializes"), bytes);
        assert_eq!(decoded.id, original.id);
    }

    #[test]
    fn partitions_are_stable_across_versions() {
        // CRC-32 (IEEE) of the key: these values must never change, or keys would move partitions.
        assert_eq!(crc32fast::hash(b"u1"), 1_112_514_422);
        assert_eq!(partition_of("u1", 4), 1_112_514_422 % 4);
        assert_eq!(partition_of("u1", 1), 0);
        let spread: std::collections::BTreeSet<u32> = (0..64).map(|n| partition_of(&format!("user-{n}"), 4)).collect();
        assert_eq!(spread.len(), 4, "keys spread over every partition");
    }

    #[test]
    fn a_tick_fires_the_timers_due_at_or_before_it() {
        let mut partition = StagePartition::new(StageKind::Order, 0, 1, Config::default());
        let mut produced = Produced::default();
        let created = r#"{"type":"collection_created","at":"2026-03-02T09:00:00Z","order_id":"o1","merchant_id":"m1","amount":"10.00","expires_at":"2026-03-02T09:10:00Z"}"#;
        partition.apply(record(created, 0), &mut produced);
        assert!(produced.messages.iter().any(|(_, message)| matches!(message, Message::Merchant { .. })));
        partition.apply(creation_accepted("o1", "2026-03-02T09:00:00Z", 0), &mut produced);
        let due = Timestamp::parse("2026-03-02T09:10:00Z").expect("a time");
        assert_eq!(partition.next_timer_due(), Some(due), "R-EXP-1 expiry timer");
        produced.clear();
        partition.apply(tick(Timestamp::parse("2026-03-02T09:09:59Z").expect("a time"), 1), &mut produced);
        assert_eq!(partition.next_timer_due(), Some(due), "not due yet");
        partition.apply(tick(due, 2), &mut produced);
        assert_eq!(partition.next_timer_due(), None, "a tick fires timers due at its time");
        assert!(produced.outputs.iter().any(|output| output.at == due), "the expiry acts at its due time");
        partition.apply(tick(Timestamp::parse("2026-03-02T09:20:00Z").expect("a time"), 3), &mut produced);
        assert_eq!(partition.clock(), Timestamp::parse("2026-03-02T09:20:00Z").expect("a time"));
    }

    #[test]
    fn a_dispatch_that_overtakes_its_creation_waits_for_it() {
        // In a partitioned run the dispatch reaches the order stage before the merchant stage has
        // accepted the creation; it must wait, not be refused (replay never shows this state).
        let mut partition = StagePartition::new(StageKind::Order, 0, 1, Config::default());
        let mut produced = Produced::default();
        let created = r#"{"type":"collection_created","at":"2026-03-02T09:00:00Z","order_id":"o1","merchant_id":"m1","amount":"10.00"}"#;
        let dispatched = r#"{"type":"collection_dispatched","at":"2026-03-02T09:00:00Z","order_id":"o1","user_id":"u1","card_id":"k1"}"#;
        partition.apply(record(created, 0), &mut produced);
        partition.apply(record(dispatched, 1), &mut produced);
        let to_agents = |produced: &Produced| {
            produced.messages.iter().filter(|(_, message)| matches!(message, Message::Agent { .. })).count()
        };
        assert_eq!(to_agents(&produced), 0, "nothing is dispatched before the order exists");
        assert!(produced.outputs.is_empty(), "and nothing is refused: {:?}", produced.outputs);
        partition.apply(creation_accepted("o1", "2026-03-02T09:00:00Z", 0), &mut produced);
        assert_eq!(to_agents(&produced), 1, "the waiting dispatch goes to the agent stage");
    }

    /// A message carries the time of what caused it, not the partition's clock: a partitioned run's
    /// partition may have applied later records of other keys first, where replay runs every message
    /// at its input's time (SPEC §3). A command that waited for another stage's answer sends at its own
    /// time, not the answer's.
    #[test]
    fn messages_carry_the_time_of_their_cause_not_the_partitions_clock() {
        let mut partition = StagePartition::new(StageKind::Order, 0, 1, Config::default());
        let mut produced = Produced::default();
        let created = |order_id: &str, at: &str| {
            format!(
                r#"{{"type":"collection_created","at":"{at}","order_id":"{order_id}","merchant_id":"m1","amount":"10.00"}}"#
            )
        };
        let dispatched = r#"{"type":"collection_dispatched","at":"2026-03-02T09:00:01Z","order_id":"o1","user_id":"u1","card_id":"k1"}"#;
        partition.apply(record(&created("o1", "2026-03-02T09:00:00Z"), 0), &mut produced);
        partition.apply(record(dispatched, 1), &mut produced);
        partition.apply(record(&created("o2", "2026-03-02T09:05:00Z"), 2), &mut produced);
        assert_eq!(partition.clock(), Timestamp::parse("2026-03-02T09:05:00Z").expect("a time"));
        let stamps = |produced: &Produced, to_agent: bool| -> Vec<String> {
            let wanted = |message: &Message| matches!(message, Message::Agent { .. }) == to_agent;
            produced.messages.iter().filter(|(_, message)| wanted(message)).map(|(at, _)| at.to_string()).collect()
        };
        assert_eq!(stamps(&produced, false), ["2026-03-02T09:00:00Z", "2026-03-02T09:05:00Z"]);
        produced.clear();
        // The merchant stage answers o1's creation at the creation's time, after the clock moved on.
        partition.apply(creation_accepted("o1", "2026-03-02T09:00:00Z", 0), &mut produced);
        assert_eq!(
            stamps(&produced, true),
            ["2026-03-02T09:00:01Z"],
            "the dispatch that waited goes to the agent at its own time: not the clock's 09:05, not the answer's 09:00"
        );
    }

    /// An agent with a card whose re-authentication asks a check at 09:00:01 (R-REAUTH-1).
    const BOUND: &str =
        r#"{"type":"card_bound","at":"2026-03-02T09:00:00Z","user_id":"u1","card_id":"k1","provider":"paytm"}"#;
    const REAUTHENTICATED: &str =
        r#"{"type":"card_reauthenticated","at":"2026-03-02T09:00:01Z","user_id":"u1","card_id":"k1"}"#;
    /// Stamped minutes after the check was asked: past its `crawl_timeout`.
    const RECHARGED_LATER: &str =
        r#"{"type":"user_recharge","at":"2026-03-02T09:05:00Z","user_id":"u1","amount":"500.00","commission":"0.00"}"#;

    /// Commands released together (they waited for the order's creation) each send at their own time:
    /// before, every message of the handler carried the last one's time, so a grab reached the agent
    /// stamped with the confirmation that waited behind it, and the payout's statement window started
    /// after the agent's line (≈ 1,700 payouts rejected in the serve benchmark where replay has none).
    #[test]
    fn commands_released_together_send_at_their_own_times() {
        let mut partition = StagePartition::new(StageKind::Order, 0, 1, Config::default());
        let mut produced = Produced::default();
        let created = r#"{"type":"payout_created","at":"2026-03-02T09:00:00Z","order_id":"p1","merchant_id":"m1","amount":"10.00","payee":{"account_last4":"4321"}}"#;
        let grabbed =
            r#"{"type":"payout_grabbed","at":"2026-03-02T09:00:01Z","order_id":"p1","user_id":"u1","card_id":"k1"}"#;
        let confirmed =
            r#"{"type":"payment_confirmed","at":"2026-03-02T09:00:40Z","order_id":"p1","utr":"900000000001"}"#;
        partition.apply(record(created, 0), &mut produced);
        partition.apply(record(grabbed, 1), &mut produced);
        partition.apply(record(confirmed, 2), &mut produced);
        produced.clear();
        // The merchant stage answers after both commands came: the grab goes on, the confirmation waits
        // again (for the agent's answer to the grab), having raised the time of what it would send.
        partition.apply(creation_accepted("p1", "2026-03-02T09:00:00Z", 0), &mut produced);
        let to_agent: Vec<String> = produced
            .messages
            .iter()
            .filter(|(_, message)| matches!(message, Message::Agent { .. }))
            .map(|(at, _)| at.to_string())
            .collect();
        assert_eq!(to_agent, ["2026-03-02T09:00:01Z"], "the grab at its own time, not the confirmation's 09:00:40");
    }

    /// A dispatch applied after the agent's clock moved past it (a lagging order partition's) starts its
    /// sub-order's statement window at the dispatch's own time, as replay does; the timeline still
    /// records it at the clock (outputs never go back in time).
    #[test]
    fn a_late_dispatch_starts_its_window_at_its_own_time() {
        let mut partition = StagePartition::new(StageKind::Agent, 0, 1, Config::default());
        let mut produced = Produced::default();
        for (offset, line) in [REGISTERED, BOUND, RECHARGED_LATER].into_iter().enumerate() {
            partition.apply(record(line, offset as u64), &mut produced);
        }
        assert_eq!(partition.clock(), Timestamp::parse("2026-03-02T09:05:00Z").expect("a time"));
        let grabbed_at = Timestamp::parse("2026-03-02T09:00:01Z").expect("a time");
        let request = crate::stages::DispatchRequest {
            order_id: "p1".into(),
            seq: 1,
            kind: crate::output::OrderKind::Payout,
            amount: crate::money::Money::parse("10.00").expect("an amount"),
            card_id: "k1".into(),
            order_problem: None,
            expires_at: None,
            payee: Some(Box::new(crate::input::Party { account_last4: Some("4321".into()), ..Default::default() })),
            utr: None,
        };
        let dispatch = StageRecord {
            id: RecordId { source: "order-0".into(), offset: 0, index: 0 },
            at: grabbed_at,
            body: RecordBody::Message {
                message: Message::Agent { user_id: "u1".into(), body: AgentBody::Dispatch(request) },
            },
        };
        partition.apply(dispatch, &mut produced);
        let sub = agent(&partition, "u1").subs.first().expect("the payout's sub-order");
        assert_eq!(sub.created_at, grabbed_at, "the window starts at the grab, not at the clock's 09:05");
        let noted_at = sub.timeline.entries.front().map(|entry| entry.at.to_string());
        assert_eq!(noted_at.as_deref(), Some("2026-03-02T09:05:00Z"), "noted at the clock");
    }

    /// The connector's answer to `request`, stamped `crawl_latency` after it (the event clock).
    fn answer(request: &crate::output::CrawlRequested, asked_at: Timestamp, offset: u64) -> StageRecord {
        answer_with(request, asked_at, offset, None)
    }

    /// An answer that is `error` (None: an empty page).
    fn answer_with(
        request: &crate::output::CrawlRequested,
        asked_at: Timestamp,
        offset: u64,
        error: Option<crate::input::CrawlError>,
    ) -> StageRecord {
        answer_from(RecordId { source: "outputs".into(), offset, index: 0 }, request, asked_at, error)
    }

    /// An answer to `request` that is `error` (None: an empty page), with the record id `id`, stamped
    /// `crawl_latency` after the request (the event clock).
    fn answer_from(
        id: RecordId,
        request: &crate::output::CrawlRequested,
        asked_at: Timestamp,
        error: Option<crate::input::CrawlError>,
    ) -> StageRecord {
        let result = crate::input::CrawlResult {
            request_id: request.request_id.clone(),
            user_id: request.user_id.clone(),
            card_id: request.card_id.clone(),
            ok: error.is_none(),
            error,
            lines: Vec::new(),
            next_from: None,
        };
        let body = AgentBody::Input {
            event_id: crate::joined("crawl", ':', &request.request_id),
            command: Command::CrawlResult(result),
        };
        StageRecord {
            id,
            at: asked_at.plus_seconds(Config::default().crawl_latency_s),
            body: RecordBody::Message { message: Message::Agent { user_id: request.user_id.clone(), body } },
        }
    }

    fn crawl_requests(outputs: &[Output]) -> Vec<(Timestamp, crate::output::CrawlRequested)> {
        outputs
            .iter()
            .filter_map(|output| match &output.body {
                crate::output::OutputBody::CrawlRequested(request) => Some((output.at, request.clone())),
                _ => None,
            })
            .collect()
    }

    /// Applies the set-up and returns the check it asks.
    fn asked_check(partition: &mut StagePartition) -> (Timestamp, crate::output::CrawlRequested) {
        let mut produced = Produced::default();
        for (offset, line) in [REGISTERED, BOUND, REAUTHENTICATED].into_iter().enumerate() {
            partition.apply(record(line, offset as u64), &mut produced);
        }
        let mut requests = crawl_requests(&produced.outputs);
        assert_eq!(requests.len(), 1, "one check asked: {:?}", produced.outputs);
        requests.remove(0)
    }

    fn outputs_text(outputs: &[Output]) -> Vec<String> {
        outputs.iter().map(|output| serde_json::to_string(output).expect("serializes")).collect()
    }

    fn tick(at: Timestamp, offset: u64) -> StageRecord {
        StageRecord { id: RecordId { source: "ticker".into(), offset, index: 0 }, at, body: RecordBody::Tick }
    }

    fn state_text(partition: &StagePartition) -> String {
        serde_json::to_string(partition.state()).expect("serializes")
    }

    /// The recharge is held for one awaited answer.
    fn assert_waits_for_one_answer(waiting: &StagePartition) {
        assert_eq!(agent(waiting, "u1").available.to_string(), "0.00", "the recharge is not applied yet");
        let barrier = waiting.answer_barrier().expect("a barrier");
        assert_eq!((barrier.held(), barrier.awaited()), (1, 1));
    }

    /// `waiting` ended as `in_order` (replay's order): the same outputs and state, the recharge applied,
    /// nothing held or awaited, no answer given up.
    fn assert_ends_as(waiting: &StagePartition, produced: &Produced, in_order: &StagePartition, expected: &Produced) {
        assert_eq!(outputs_text(&produced.outputs), outputs_text(&expected.outputs));
        assert_eq!(agent(waiting, "u1").available.to_string(), "500.00");
        let barrier = waiting.answer_barrier().expect("a barrier");
        assert_eq!((barrier.held(), barrier.awaited(), barrier.given_up()), (0, 0, 0));
        assert_eq!(state_text(waiting), state_text(in_order), "the same state as in replay's order");
    }

    #[test]
    fn a_partition_with_the_answer_barrier_waits_for_the_answer_in_flight() {
        // In log order (answer first) without a barrier: what replay does.
        let mut in_order = StagePartition::new(StageKind::Agent, 0, 1, Config::default());
        let (asked_at, request) = asked_check(&mut in_order);
        let mut expected = Produced::default();
        in_order.apply(answer(&request, asked_at, 0), &mut expected);
        in_order.apply(record(RECHARGED_LATER, 3), &mut expected);
        assert!(crawl_requests(&expected.outputs).is_empty(), "answered in time: no check asked again");

        // The later input overtakes the answer in the log. With the barrier it waits for the answer.
        let mut waiting = StagePartition::new(StageKind::Agent, 0, 1, Config::default()).with_answer_barrier(1);
        let (asked_at, request) = asked_check(&mut waiting);
        let mut produced = Produced::default();
        assert_eq!(waiting.apply(record(RECHARGED_LATER, 3), &mut produced), Applied::Applied);
        assert!(produced.outputs.is_empty(), "held, so no timeout fired: {:?}", produced.outputs);
        assert_waits_for_one_answer(&waiting);
        // A tick past the crawl's timeout does not fire it either: the timer waits with the agent.
        let timeout_at = waiting.next_timer_due().expect("the crawl's timeout");
        waiting.apply(tick(timeout_at, 0), &mut produced);
        assert!(produced.outputs.is_empty(), "the timeout waits for the answer: {:?}", produced.outputs);
        assert!(waiting.next_timer_due() > Some(timeout_at), "deferred to the agent: no tick is asked for it");
        assert_waits_for_one_answer(&waiting);
        waiting.apply(answer(&request, asked_at, 0), &mut produced);
        assert_ends_as(&waiting, &produced, &in_order, &expected);
        assert_eq!(waiting.next_timer_due(), in_order.next_timer_due());

        // Without the barrier the timeout fires first, the check is asked again and the answer is stale.
        let mut racing = StagePartition::new(StageKind::Agent, 0, 1, Config::default());
        let (asked_at, request) = asked_check(&mut racing);
        let mut produced = Produced::default();
        racing.apply(record(RECHARGED_LATER, 3), &mut produced);
        racing.apply(answer(&request, asked_at, 0), &mut produced);
        assert!(!crawl_requests(&produced.outputs).is_empty(), "asked again after the timeout (R-CHK-3)");
    }

    #[test]
    fn a_record_waits_for_the_answer_to_a_check_a_timer_asked_before_it() {
        // A busy answer makes R-CHK-3 ask again 30 s later, by a timer. A record stamped minutes later
        // fires that timer when it is applied; in replay the check's answer (1 s after) comes before
        // the check's timeout and before the record, so the record must wait for it.
        let busy = Some(crate::input::CrawlError::UpstreamBusy);

        // Replay's order: a tick at the retry's time asks the check, its answer, then the record.
        let mut in_order = StagePartition::new(StageKind::Agent, 0, 1, Config::default());
        let (asked_at, request) = asked_check(&mut in_order);
        let mut expected = Produced::default();
        in_order.apply(answer_with(&request, asked_at, 0, busy), &mut expected);
        let retry_at = in_order.next_timer_due().expect("the retry timer");
        in_order.apply(tick(retry_at, 0), &mut expected);
        let retries = crawl_requests(&expected.outputs);
        assert_eq!(retries.len(), 1, "R-CHK-3 asked again: {:?}", expected.outputs);
        let (retried_at, retry) = retries[0].clone();
        in_order.apply(answer(&retry, retried_at, 1), &mut expected);
        in_order.apply(record(RECHARGED_LATER, 3), &mut expected);
        assert_eq!(crawl_requests(&expected.outputs).len(), 1, "answered in time: not asked a third time");

        // With the barrier and no tick: the record itself fires the retry, stops there and waits.
        let mut waiting = StagePartition::new(StageKind::Agent, 0, 1, Config::default()).with_answer_barrier(1);
        let (asked_at, request) = asked_check(&mut waiting);
        let mut produced = Produced::default();
        waiting.apply(answer_with(&request, asked_at, 0, busy), &mut produced);
        waiting.apply(record(RECHARGED_LATER, 3), &mut produced);
        assert_eq!(crawl_requests(&produced.outputs), retries, "the retry is asked, its timeout not fired");
        assert_waits_for_one_answer(&waiting);
        waiting.apply(answer(&retry, retried_at, 1), &mut produced);
        assert_ends_as(&waiting, &produced, &in_order, &expected);
    }

    #[test]
    fn records_held_for_an_answer_survive_a_snapshot() {
        let mut partition = StagePartition::new(StageKind::Agent, 0, 1, Config::default()).with_answer_barrier(1);
        let (asked_at, request) = asked_check(&mut partition);
        let mut produced = Produced::default();
        partition.apply(record(RECHARGED_LATER, 3), &mut produced);
        let bytes = partition.snapshot().expect("encodes");
        let mut restored = StagePartition::restore(&bytes, Config::default()).expect("restores");
        assert_eq!(restored.answer_barrier().map(AnswerBarrier::held), Some(1));
        let mut after_restore = Produced::default();
        restored.apply(answer(&request, asked_at, 0), &mut after_restore);
        partition.apply(answer(&request, asked_at, 0), &mut produced);
        assert_eq!(outputs_text(&after_restore.outputs), outputs_text(&produced.outputs));
        assert_eq!(restored.snapshot().ok(), partition.snapshot().ok());
        assert_eq!(agent(&restored, "u1").available.to_string(), "500.00");
    }

    #[test]
    fn an_answer_that_never_comes_is_given_up_past_the_bound() {
        let mut partition = StagePartition::new(StageKind::Agent, 0, 1, Config::default()).with_answer_barrier(1);
        asked_check(&mut partition);
        let mut produced = Produced::default();
        let start = Timestamp::parse("2026-03-02T09:05:00Z").expect("a time");
        let recharge_at = |offset: usize| {
            let at = start.plus_seconds(offset as i64);
            let line = RECHARGED_LATER.replace("2026-03-02T09:05:00Z", &at.to_string());
            record(&line, 3 + offset as u64)
        };
        for offset in 0..crate::answer_barrier::HELD_RECORDS_MAX {
            partition.apply(recharge_at(offset), &mut produced);
        }
        assert_eq!(partition.answer_barrier().map(AnswerBarrier::held), Some(crate::answer_barrier::HELD_RECORDS_MAX));
        assert!(produced.outputs.is_empty());
        partition.apply(recharge_at(crate::answer_barrier::HELD_RECORDS_MAX), &mut produced);
        let barrier = partition.answer_barrier().expect("a barrier");
        assert!(barrier.held() <= crate::answer_barrier::HELD_RECORDS_MAX, "bounded");
        // The first recharge released fired the crawl's timeout, as without the barrier (R-CHK-1), and
        // the retry asked the check again (R-CHK-3). A retry's answer is stamped before the recharges,
        // so they wait again; past the bound that answer is given up in turn, until the recharges
        // held are within the bound and the rest wait for the last check asked.
        let asked_again = crawl_requests(&produced.outputs);
        assert!(!asked_again.is_empty(), "R-CHK-1 timeout, R-CHK-3 retry");
        assert!(barrier.given_up() >= 1);
        assert_eq!(barrier.awaited(), 1, "the recharges still held wait for the last check asked");
        assert_eq!(
            asked_again.len() as u64,
            barrier.given_up() - 1 + barrier.awaited() as u64,
            "every check asked again is given up or still awaited"
        );
    }

    /// The keyed barrier (SPEC §3, R-CHK-1): however late the connector's answers come, each agent ends
    /// as it does when every answer comes in its place in time (replay's order), and emits the same
    /// outputs in the same order.
    mod answers_in_any_order {
        use super::*;
        use proptest::prelude::*;

        const AGENTS: [&str; 3] = ["ua", "ub", "uc"];

        #[derive(Clone, Debug)]
        enum Event {
            /// Asks a check (R-CHK-1); its answer may be busy and asked again (R-CHK-3).
            Reauthenticate,
            Recharge(u32),
        }

        fn start() -> Timestamp {
            Timestamp::parse("2026-03-02T09:00:00Z").expect("a time")
        }

        /// The log, in time order. Every record has its own millisecond within the second, so no two
        /// records, and no record and an answer or timer another record led to, fall at the same instant.
        fn log(agent_events: &[Vec<(u32, Event)>], ticks: &[u32]) -> Vec<StageRecord> {
            let mut timed: Vec<(Timestamp, Option<String>)> = Vec::new();
            let mut records = 0i64;
            let mut instant = |seconds: u32| {
                records += 1;
                Timestamp::from_millis(start().millis() + i64::from(seconds) * 1_000 + records)
            };
            for (agent, events) in AGENTS.iter().zip(agent_events) {
                let at = instant(0);
                let registered =
                    format!(r#"{{"type":"user_registered","at":"{at}","user_id":"{agent}","telegram_bound":false}}"#);
                timed.push((at, Some(registered)));
                let at = instant(1);
                let bound = format!(
                    r#"{{"type":"card_bound","at":"{at}","user_id":"{agent}","card_id":"k{agent}","provider":"paytm"}}"#
                );
                timed.push((at, Some(bound)));
                for (seconds, event) in events {
                    let at = instant(10 + seconds);
                    let line = match event {
                        Event::Reauthenticate => format!(
                            r#"{{"type":"card_reauthenticated","at":"{at}","user_id":"{agent}","card_id":"k{agent}"}}"#
                        ),
                        Event::Recharge(amount) => format!(
                            r#"{{"type":"user_recharge","at":"{at}","user_id":"{agent}","amount":"{amount}.00","commission":"0.00"}}"#
                        ),
                    };
                    timed.push((at, Some(line)));
                }
            }
            for seconds in ticks {
                let at = instant(10 + seconds);
                timed.push((at, None));
            }
            // Late ticks fire what is left (timeouts, retries) once every input is in.
            for hours in [2, 4, 8] {
                let at = instant(hours * 3_600);
                timed.push((at, None));
            }
            timed.sort_by_key(|(at, _)| *at);
            timed
                .into_iter()
                .enumerate()
                .map(|(offset, (at, line))| match line {
                    Some(line) => record(&line, offset as u64),
                    None => tick(at, offset as u64),
                })
                .collect()
        }

        /// The provider's answer to `request` (busy for about a third of them), stamped `crawl_latency`
        /// after it; each from its own source, so answers may arrive in any order.
        fn answer_to(request: &crate::output::CrawlRequested, asked_at: Timestamp, number: usize) -> StageRecord {
            let busy = crc32fast::hash(request.request_id.as_bytes()).is_multiple_of(3);
            let id = RecordId { source: format!("answer-{number}").into(), offset: 0, index: 0 };
            answer_from(id, request, asked_at, busy.then_some(crate::input::CrawlError::UpstreamBusy))
        }

        /// Applies the log; each crawl's answer joins the log `delays[n]` records after its place in time
        /// (the n-th crawl asked; cycled; 0: where replay applies it). Snapshots and restores the
        /// partition after `restore_after` records.
        fn run(log: &[StageRecord], delays: &[usize], restore_after: usize) -> (StagePartition, Vec<Output>) {
            let mut partition = StagePartition::new(StageKind::Agent, 0, 1, Config::default()).with_answer_barrier(1);
            let mut pending: VecDeque<StageRecord> = log.iter().cloned().collect();
            let mut outputs = Vec::new();
            let (mut asked, mut applied) = (0usize, 0usize);
            while let Some(record) = pending.pop_front() {
                applied += 1;
                assert!(applied < 100_000, "answers keep coming");
                let mut produced = Produced::default();
                partition.apply(record, &mut produced);
                let barrier = partition.answer_barrier().expect("a barrier");
                barrier.check().expect("the barrier's books agree");
                for (asked_at, request) in crawl_requests(&produced.outputs) {
                    let answer = answer_to(&request, asked_at, asked);
                    // Replay's place for the answer: before the first record stamped after it.
                    let in_time = pending.iter().position(|record| record.at > answer.at).unwrap_or(pending.len());
                    let delay = delays.get(asked % delays.len().max(1)).copied().unwrap_or(0);
                    pending.insert((in_time + delay).min(pending.len()), answer);
                    asked += 1;
                }
                outputs.extend(produced.outputs);
                if applied == restore_after {
                    let bytes = partition.snapshot().expect("encodes");
                    partition = StagePartition::restore(&bytes, Config::default()).expect("restores");
                }
            }
            (partition, outputs)
        }

        fn agent_outputs(outputs: &[Output], user_id: &str) -> Vec<String> {
            let tag = format!(r#""user_id":"{user_id}""#);
            outputs_text(outputs).into_iter().filter(|text| text.contains(&tag)).collect()
        }

        fn events() -> impl Strategy<Value = Vec<(u32, Event)>> {
            let event = prop_oneof![Just(Event::Reauthenticate), (1u32..900).prop_map(Event::Recharge)];
            proptest::collection::vec((0u32..400, event), 0..8)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn each_agent_ends_as_with_answers_in_time(
                agent_events in proptest::collection::vec(events(), AGENTS.len()),
                ticks in proptest::collection::vec(0u32..600, 0..6),
                delays in proptest::collection::vec(0usize..12, 1..16),
                restore_after in 0usize..200,
            ) {
                let log = log(&agent_events, &ticks);
                let (in_time, expected) = run(&log, &[0], usize::MAX);
                let (late, outputs) = run(&log, &delays, restore_after);
                for partition in [&in_time, &late] {
                    let barrier = partition.answer_barrier().expect("a barrier");
                    prop_assert_eq!((barrier.held(), barrier.awaited(), barrier.agents_waiting()), (0, 0, 0));
                    prop_assert_eq!(barrier.given_up(), 0);
                }
                for user_id in AGENTS {
                    let agent_state =
                        |partition: &StagePartition| serde_json::to_string(agent(partition, user_id)).expect("JSON");
                    prop_assert_eq!(agent_state(&late), agent_state(&in_time), "{}'s state", user_id);
                    let (got, wanted) = (agent_outputs(&outputs, user_id), agent_outputs(&expected, user_id));
                    prop_assert_eq!(got, wanted, "{}'s outputs", user_id);
                }
                let mut all = outputs_text(&outputs);
                let mut all_expected = outputs_text(&expected);
                all.sort();
                all_expected.sort();
                prop_assert_eq!(all, all_expected);
            }
        }
    }
}
