//! The engine: the three stages composed the way SPEC §3 and §9 define their interplay. Each input, and
//! everything it causes in every stage, is processed before the next input or timer (one FIFO queue of
//! internal events). Timers are state: one due strictly before an input's `at` fires before it, one due
//! exactly at it fires after it, ties in creation order. Same inputs → same outputs, byte for byte.

use crate::config::Config;
use crate::input::{Command, Input};
use crate::output::{Output, OutputBody};
use crate::partition::{input_key, route_input, InputKey, Routed};
use crate::seen::SeenIds;
use crate::stages::agent::AgentStage;
use crate::stages::merchant::MerchantStage;
use crate::stages::order::OrderStage;
use crate::stages::{Effects, Message, Timer};
use crate::time::Timestamp;
use crate::timers::TimerQueue;
use crate::wallet_sim::{ProviderTimer, WalletSim};

/// Internal events one input may cause before the engine declares a livelock (a bug, not bad input).
const CASCADE_EVENTS_MAX: usize = 1_000_000;

pub struct Engine {
    pub config: Config,
    pub orders: OrderStage,
    pub agents: AgentStage,
    pub merchants: MerchantStage,
    /// The simulated provider, when this engine answers its own crawl requests (replay, demos).
    pub provider: Option<WalletSim>,
    /// Due timers by (due, creation).
    timers: TimerQueue<Timer>,
    timers_created: u64,
    clock: Timestamp,
    seen_event_ids: SeenIds,
    outputs: Vec<Output>,
    effects: Effects,
    /// `crawl_result`s the simulated provider produced: log events in a deployment (the connector
    /// appends them), counted for throughput figures.
    provider_answers: u64,
}

impl Engine {
    pub fn new(config: Config, provider: Option<WalletSim>) -> Engine {
        Engine {
            agents: AgentStage::new(config.clone()),
            config,
            orders: OrderStage::default(),
            merchants: MerchantStage::default(),
            provider,
            timers: TimerQueue::new(),
            timers_created: 0,
            clock: Timestamp::default(),
            seen_event_ids: SeenIds::default(),
            outputs: Vec::new(),
            effects: Effects::default(),
            provider_answers: 0,
        }
    }

    /// The largest event time consumed (SPEC §3).
    pub fn clock(&self) -> Timestamp {
        self.clock
    }

    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// Hands the outputs so far to the caller (services stream them; replay keeps them).
    /// The next outputs get room for as many as were taken, so a caller that takes them regularly
    /// does not make the engine grow (and copy) the list from empty each time.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        let capacity = self.outputs.capacity();
        std::mem::replace(&mut self.outputs, Vec::with_capacity(capacity))
    }

    /// `crawl_result` answers the simulated provider produced so far.
    pub fn provider_answers(&self) -> u64 {
        self.provider_answers
    }

    /// Timers waiting (for tests and metrics).
    pub fn timers_pending(&self) -> usize {
        self.timers.len()
    }

    /// Applies one input: timers due strictly before it first, then the input and its cascade.
    #[inline]
    pub fn apply(&mut self, input: Input) {
        self.apply_found(input, None);
    }

    /// `apply`, given where the seen set found the input's id when it was announced.
    #[inline]
    fn apply_found(&mut self, input: Input, found: Option<crate::seen::NumberedSlot>) {
        self.fire_timers_before(input.at);
        self.clock = self.clock.max(input.at);
        if !self.seen_event_ids.insert_found(&input.event_id, found) {
            return; // SPEC §3: an event id already seen, applied or rejected, is ignored.
        }
        let now = self.clock;
        if let Some(message) = self.route(input) {
            self.run(now, Work::Message(message));
        }
    }

    /// Applies inputs in order, asking the CPU for what each will first read while the one before it is
    /// applied: its event id's slot in the seen set and the entry of the order, agent or card it is for
    /// (tables that outgrow the caches). The same as `apply` on each, in answers and in state.
    pub fn apply_all(&mut self, inputs: Vec<Input>) {
        let mut inputs = inputs.into_iter();
        self.apply_next(&mut inputs, usize::MAX);
    }

    /// Applies the next `count` inputs of `inputs` (fewer if it ends) as `apply_all` does. The next input
    /// is read where it lies (`as_slice`), not taken out to look at it: an input is 160 bytes, and each
    /// move is a copy.
    pub fn apply_next(&mut self, inputs: &mut std::vec::IntoIter<Input>, count: usize) {
        // Where the seen set found the next input's id when it was announced (the first input of a
        // call was not announced: it is looked up as `apply` does).
        let mut found_next = None;
        for _ in 0..count {
            let Some(input) = inputs.next() else { return };
            let found = found_next.take();
            if let Some(next) = inputs.as_slice().first() {
                found_next = self.seen_event_ids.prefetch(&next.event_id);
                self.announce(input_key(&next.command));
            }
            self.apply_found(input, found);
        }
    }

    /// Asks the CPU for the state entry `timer` will fire on (no effect on any answer).
    fn announce_timer(&self, timer: &Timer) {
        match timer {
            Timer::Order { order_id, .. } => self.announce(InputKey::Order(order_id)),
            Timer::Agent { user_id, .. } => self.announce(InputKey::Agent(user_id)),
            // An answer reads the provider's card and goes to the agent that asked.
            Timer::Provider(ProviderTimer::Answer(request)) => {
                self.announce(InputKey::Wallet(&request.card_id));
                self.announce(InputKey::Agent(&request.user_id));
            }
        }
    }

    /// Asks the CPU for the entry of the table that holds `key`'s state.
    fn announce(&self, key: InputKey) {
        match key {
            InputKey::Order(order_id) => self.orders.orders.prefetch(order_id),
            InputKey::Agent(user_id) => self.agents.agents.prefetch(user_id),
            InputKey::Wallet(card_id) => {
                if let Some(provider) = &self.provider {
                    provider.prefetch(card_id);
                }
            }
            // A few merchants, cached anyway; a tick reads no entry.
            InputKey::Merchant(_) | InputKey::Broadcast => {}
        }
    }

    /// Fires every timer due at or before `until` (the end of a replay, or a `tick`).
    pub fn advance_to(&mut self, until: Timestamp) {
        self.fire_timers(|due| due <= until);
        self.clock = self.clock.max(until);
    }

    fn fire_timers_before(&mut self, at: Timestamp) {
        self.fire_timers(|due| due < at);
    }

    /// Fires timers in (due, creation) order while `is_due(due)` (SPEC §3).
    fn fire_timers(&mut self, is_due: impl Fn(Timestamp) -> bool) {
        while let Some((due, _)) = self.timers.first_key() {
            if !is_due(due) {
                break;
            }
            self.fire_next();
        }
    }

    fn fire_next(&mut self) {
        let Some(((due, _), timer)) = self.timers.pop_first() else {
            return;
        };
        // The timer after this one is announced while this one fires. (Announcing one more ahead, and
        // the next one's sub-order, measured no better.)
        if let Some(next) = self.timers.first_value() {
            self.announce_timer(next);
        }
        // A timer acts, and stamps what it emits, at its due time (SPEC §3) — or at the clock, for one
        // that was created already overdue.
        self.clock = self.clock.max(due);
        self.run(self.clock, Work::Timer(timer));
    }

    /// Which stage an input belongs to (SPEC §5 table); wallet events feed the simulated provider.
    #[inline]
    fn route(&mut self, input: Input) -> Option<Message> {
        let at = input.at;
        match route_input(input) {
            Routed::Message(message) => Some(message),
            Routed::Broadcast => None,
            Routed::Wallet(command) => {
                if let Some(provider) = self.provider.as_mut() {
                    match command {
                        Command::WalletLine(wallet) => provider.add_line(&wallet.card_id, *wallet.line, at),
                        Command::WalletLineStatus(status) => {
                            provider.set_status(&status.card_id, &status.txn_id, status.status, at)
                        }
                        Command::WalletFault(fault) => provider.set_fault(&fault.card_id, fault.fault, at),
                        _ => {}
                    }
                }
                None
            }
        }
    }

    /// Processes one unit of work and everything it causes, FIFO (SPEC §3). The messages the stages send
    /// are the FIFO itself: a handler appends to `effects.messages` behind those still waiting, which
    /// is the order of a separate queue fed after each handler, without moving each message twice.
    fn run(&mut self, now: Timestamp, first: Work) {
        debug_assert!(self.effects.messages.is_empty());
        self.effects.now = now;
        self.effects.cause_at = now;
        match first {
            Work::Message(message) => self.deliver(message),
            Work::Timer(timer) => self.fire(timer),
        }
        self.collect_effects(now);
        let mut processed = 1usize;
        while let Some(message) = self.effects.messages.pop_front() {
            processed += 1;
            assert!(processed <= CASCADE_EVENTS_MAX, "livelock: one input caused {CASCADE_EVENTS_MAX} events");
            self.effects.now = now;
            self.effects.cause_at = now;
            self.deliver(message);
            self.collect_effects(now);
        }
    }

    /// Takes a handler's outputs and timers (its messages stay queued in `effects.messages`).
    /// Most handlers schedule nothing and emit nothing: those return at once (an empty drain and
    /// append cost ≈ 40 instructions, and this runs after every message).
    fn collect_effects(&mut self, now: Timestamp) {
        // Every message here runs at `now`, which no command that waited is later than.
        debug_assert!(self.effects.cause_raised.is_empty(), "replay never raises a message's time");
        if !self.effects.timers.is_empty() {
            for (due, timer) in self.effects.timers.drain(..) {
                self.timers_created += 1;
                self.timers.insert((due, self.timers_created), timer);
            }
        }
        if self.effects.outputs.is_empty() {
            return;
        }
        let first_new_output = self.outputs.len();
        self.outputs.append(&mut self.effects.outputs);
        self.feed_provider(first_new_output, now);
    }

    fn deliver(&mut self, message: Message) {
        let effects = &mut self.effects;
        match message {
            Message::Order { order_id, body } => self.orders.handle(&order_id, body, effects),
            Message::Agent { user_id, body } => self.agents.handle(&user_id, body, effects),
            Message::Merchant { merchant_id, body } => self.merchants.handle(&merchant_id, body, effects),
        }
    }

    fn fire(&mut self, timer: Timer) {
        let effects = &mut self.effects;
        match timer {
            Timer::Order { order_id, timer } => self.orders.on_timer(&order_id, timer, effects),
            Timer::Agent { user_id, timer } => self.agents.on_timer(&user_id, timer, effects),
            Timer::Provider(ProviderTimer::Answer(request)) => {
                let Some(provider) = self.provider.as_ref() else {
                    return;
                };
                // The answer is an ordinary input of the agent stage (SPEC §9).
                let event_id = crate::joined("provider", ':', &request.request_id);
                self.provider_answers += 1;
                if !self.seen_event_ids.insert(&event_id) {
                    return;
                }
                // It is the first message of this timer's cascade (`run` starts with none queued), so
                // it is handled at once, as it would be first out of the queue, with the page's lines
                // read in place in the provider rather than copied into a `crawl_result`.
                debug_assert!(effects.messages.is_empty());
                let view = provider.view(&request, effects.now);
                self.agents.on_provider_answer(&event_id, &request, view, effects);
            }
        }
    }

    /// The simulated provider answers each `crawl_requested` `crawl_latency` after it was asked.
    fn feed_provider(&mut self, from: usize, now: Timestamp) {
        if self.provider.is_none() {
            return;
        }
        for output in &self.outputs[from..] {
            if let OutputBody::CrawlRequested(request) = &output.body {
                self.timers_created += 1;
                let due = now.plus_seconds(self.config.crawl_latency_s);
                self.timers.insert(
                    (due, self.timers_created),
                    Timer::Provider(ProviderTimer::Answer(Box::new(request.clone()))),
                );
            }
        }
    }
}

/// Most work is messages; boxing them to shrink the rarer timer variant would add an allocation each.
#[allow(clippy::large_enum_variant)]
enum Work {
    Message(Message),
    Timer(Timer),
}
