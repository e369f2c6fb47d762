//! Snapshot tests: every golden scenario driven through partitioned stages, snapshotted and restored
//! after every input, must go on exactly as without the restores; bad bytes are errors, not panics.

use super::*;
use crate::config::Config;
use crate::document::{merchant_view, order_is_shown, order_view, user_view};
use crate::input::{Command, Input};
use crate::output::{CrawlRequested, OutputBody};
use crate::partition::{
    destination, partition_of, route_input, Applied, Produced, RecordBody, RecordId, Routed, StageKind, StagePartition,
    StageRecord, StageState,
};
use crate::replay::parse_scenario;
use crate::stages::agent::state::{RULE_IDS, TIMELINE_EVENTS};
use crate::stages::{AgentBody, Message};
use crate::time::Timestamp;
use crate::wallet_sim::WalletSim;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

type Address = (StageKind, u32);

/// A small partitioned runtime in memory: `partitions` partitions per stage, records delivered FIFO,
/// the simulated provider answering crawl requests `crawl_latency` later, and a ticker that ticks a
/// partition when its next timer falls due before the next input.
struct Driver {
    partitions: BTreeMap<Address, StagePartition>,
    rest: Rest,
}

/// Everything of the driver but the partitions (cloned at a cut, so that two runs can go on).
#[derive(Clone)]
struct Rest {
    partitions: u32,
    config: Config,
    provider: WalletSim,
    answers: BTreeMap<(Timestamp, u64), CrawlRequested>,
    answers_created: u64,
    /// The next offset each producer appends at.
    offsets: BTreeMap<String, u64>,
    seen: BTreeSet<crate::Text>,
    /// Everything the partitions did, serialized: what two runs are compared on.
    log: Vec<String>,
}

impl Driver {
    fn new(config: Config, partitions: u32) -> Driver {
        let mut all = BTreeMap::new();
        for kind in StageKind::ALL {
            for partition in 0..partitions {
                all.insert((kind, partition), StagePartition::new(kind, partition, partitions, config.clone()));
            }
        }
        let rest = Rest {
            partitions,
            config,
            provider: WalletSim::default(),
            answers: BTreeMap::new(),
            answers_created: 0,
            offsets: BTreeMap::new(),
            seen: BTreeSet::new(),
            log: Vec::new(),
        };
        Driver { partitions: all, rest }
    }

    fn next_id(&mut self, source: &str) -> u64 {
        let offset = self.rest.offsets.entry(source.to_string()).or_insert(0);
        *offset += 1;
        *offset
    }

    /// One input: first what falls due before it, then the input and everything it causes.
    fn input(&mut self, input: Input) {
        self.advance(input.at, false);
        if !self.rest.seen.insert(input.event_id.clone()) {
            return;
        }
        let at = input.at;
        match route_input(input) {
            Routed::Message(message) => {
                let offset = self.next_id("ingest");
                self.deliver(at, "ingest", offset, message);
            }
            Routed::Broadcast => {
                let offset = self.next_id("ingest");
                let mut queue = VecDeque::new();
                for address in self.partitions.keys() {
                    let id = RecordId { source: "ingest".into(), offset, index: 0 };
                    queue.push_back((*address, StageRecord { id, at, body: RecordBody::Tick }));
                }
                self.drain(queue);
            }
            Routed::Wallet(command) => match command {
                Command::WalletLine(wallet) => self.rest.provider.add_line(&wallet.card_id, *wallet.line, at),
                Command::WalletLineStatus(status) => {
                    self.rest.provider.set_status(&status.card_id, &status.txn_id, status.status, at)
                }
                Command::WalletFault(fault) => self.rest.provider.set_fault(&fault.card_id, fault.fault, at),
                _ => {}
            },
        }
    }

    fn deliver(&mut self, at: Timestamp, source: &str, offset: u64, message: Message) {
        let (kind, key) = destination(&message);
        let address = (kind, partition_of(key, self.rest.partitions));
        let id = RecordId { source: source.to_string().into(), offset, index: 0 };
        self.drain(VecDeque::from([(address, StageRecord { id, at, body: RecordBody::Message { message } })]));
    }

    /// Provider answers and timers due before `until` (or at it, if `inclusive`), earliest first.
    fn advance(&mut self, until: Timestamp, inclusive: bool) {
        let due = |at: Timestamp| if inclusive { at <= until } else { at < until };
        loop {
            let answer = self.rest.answers.first_key_value().map(|(&(at, _), _)| at).filter(|at| due(*at));
            let timer = self
                .partitions
                .iter()
                .filter_map(|(address, partition)| partition.next_timer_due().map(|at| (at, *address)))
                .filter(|(at, _)| due(*at))
                .min();
            match (answer, timer) {
                (Some(answer_at), timer) if timer.is_none_or(|(timer_at, _)| answer_at <= timer_at) => {
                    let Some((_, request)) = self.rest.answers.pop_first() else { unreachable!() };
                    let result = self.rest.provider.result(&request, answer_at);
                    let event_id = crate::joined("provider", ':', &request.request_id);
                    if self.rest.seen.insert(event_id.clone()) {
                        let message = Message::Agent {
                            user_id: request.user_id.clone(),
                            body: AgentBody::Input { event_id, command: Command::CrawlResult(result) },
                        };
                        let offset = self.next_id("provider");
                        self.deliver(answer_at, "provider", offset, message);
                    }
                }
                (_, Some((at, address))) => {
                    let offset = self.next_id("ticker");
                    let id = RecordId { source: "ticker".into(), offset, index: 0 };
                    self.drain(VecDeque::from([(address, StageRecord { id, at, body: RecordBody::Tick })]));
                }
                (_, None) => break,
            }
        }
    }

    fn drain(&mut self, mut queue: VecDeque<(Address, StageRecord)>) {
        let mut produced = Produced::default();
        while let Some((address, record)) = queue.pop_front() {
            let line = format!("{}-{} {:?}", address.0.name(), address.1, record.id);
            let Some(partition) = self.partitions.get_mut(&address) else { panic!("no partition {address:?}") };
            produced.clear();
            let applied = partition.apply(record, &mut produced);
            let log = &mut self.rest.log;
            log.push(format!("{line} {applied:?} touched {:?}", produced.touched));
            if applied == Applied::Duplicate {
                continue;
            }
            let source = format!("{}-{}", address.0.name(), address.1);
            let offset = {
                let next = self.rest.offsets.entry(source.clone()).or_insert(0);
                *next += 1;
                *next
            };
            for output in &produced.outputs {
                self.rest.log.push(serde_json::to_string(output).expect("an output serializes"));
                if let OutputBody::CrawlRequested(request) = &output.body {
                    self.rest.answers_created += 1;
                    let due = output.at.plus_seconds(self.rest.config.crawl_latency_s);
                    self.rest.answers.insert((due, self.rest.answers_created), request.clone());
                }
            }
            for (index, (at, message)) in produced.messages.drain(..).enumerate() {
                self.rest.log.push(serde_json::to_string(&(at, &message)).expect("a message serializes"));
                let (kind, key) = destination(&message);
                let to = (kind, partition_of(key, self.rest.partitions));
                let id = RecordId { source: source.clone().into(), offset, index: index as u32 };
                queue.push_back((to, StageRecord { id, at, body: RecordBody::Message { message } }));
            }
        }
    }

    /// The SPEC §9 views of every user, merchant and order across the partitions (what the read model
    /// shows, including what only views read, such as debt batches).
    fn views(&self) -> String {
        let (mut users, mut merchants, mut orders) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let agent = |user_id: &str| {
            let address = (StageKind::Agent, partition_of(user_id, self.rest.partitions));
            match self.partitions.get(&address).map(StagePartition::state) {
                Some(StageState::Agent(stage)) => stage.agents.get(user_id),
                _ => None,
            }
        };
        for partition in self.partitions.values() {
            match partition.state() {
                StageState::Agent(stage) => {
                    users.extend(stage.agents.iter().map(|(id, agent)| (id.as_str(), user_view(agent))))
                }
                StageState::Merchant(stage) => merchants
                    .extend(stage.merchants.iter().map(|(id, merchant)| (id.as_str(), merchant_view(merchant)))),
                StageState::Order(stage) => orders.extend(
                    stage
                        .orders
                        .iter()
                        .filter(|(_, order)| order_is_shown(order))
                        .map(|(id, order)| (id.as_str(), order_view(order, agent))),
                ),
            }
        }
        serde_json::to_string(&(users, merchants, orders)).expect("views serialize")
    }

    fn snapshots(&self) -> BTreeMap<Address, Vec<u8>> {
        self.partitions.iter().map(|(address, partition)| (*address, partition.snapshot().expect("encodes"))).collect()
    }

    /// Replaces every partition by its restored snapshot, checking that the snapshot of the restored
    /// partition is the same bytes.
    fn restore_all(&mut self) -> BTreeMap<Address, Vec<u8>> {
        let snapshots = self.snapshots();
        for (address, bytes) in &snapshots {
            let restored = StagePartition::restore(bytes, self.rest.config.clone())
                .unwrap_or_else(|error| panic!("{address:?} does not restore: {error}"));
            assert_eq!((restored.kind(), restored.partition()), *address);
            let again = restored.snapshot().expect("encodes");
            assert!(
                again == *bytes,
                "{address:?}: snapshot(restore(snapshot)) differs:\n{}\n{}",
                text(bytes),
                text(&again)
            );
            self.partitions.insert(*address, restored);
        }
        snapshots
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Drives `inputs`; with `restore`, every partition is snapshotted and restored after every `every`
/// inputs. Returns the snapshots at each cut, the log and the final snapshots.
struct Run {
    cuts: Vec<BTreeMap<Address, Vec<u8>>>,
    /// The views after each cut and at the end.
    views: Vec<String>,
    log: Vec<String>,
    last: BTreeMap<Address, Vec<u8>>,
}

fn drive(config: &Config, inputs: &[Input], partitions: u32, every: usize, restore: bool) -> Run {
    let mut driver = Driver::new(config.clone(), partitions);
    let mut cuts = Vec::new();
    let mut views = Vec::new();
    for (index, input) in inputs.iter().enumerate() {
        driver.input(input.clone());
        if (index + 1) % every == 0 {
            cuts.push(if restore { driver.restore_all() } else { driver.snapshots() });
            views.push(driver.views());
        }
    }
    if let Some(last) = inputs.last() {
        driver.advance(last.at, true);
    }
    let last = driver.snapshots();
    views.push(driver.views());
    Run { cuts, views, log: driver.rest.log, last }
}

fn scenarios() -> Vec<(PathBuf, String)> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&directory)
        .expect("the golden scenarios")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "jsonl"))
        .collect();
    files.sort();
    files.into_iter().map(|path| (path.clone(), std::fs::read_to_string(&path).expect("a scenario"))).collect()
}

fn first_difference(a: &[String], b: &[String]) -> String {
    let index = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    format!("entry {index}: {:?} vs {:?}", a.get(index), b.get(index))
}

#[test]
fn every_golden_scenario_goes_on_identically_from_snapshots_taken_after_every_input() {
    let mut driven = 0;
    let mut with_timelines = 0;
    let mut with_debt_batches = 0;
    let mut rules_seen: BTreeSet<&str> = BTreeSet::new();
    for (path, text) in scenarios() {
        let Ok(scenario) = parse_scenario(&text) else {
            continue; // a structurally bad scenario: replay refuses it, nothing to drive
        };
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        for partitions in [1, 3] {
            let reference = drive(&scenario.config, &scenario.inputs, partitions, 1, false);
            let restored = drive(&scenario.config, &scenario.inputs, partitions, 1, true);
            assert!(
                reference.log == restored.log,
                "{name} ({partitions} partitions): what the partitions produce differs after restores: {}",
                first_difference(&reference.log, &restored.log)
            );
            for (cut, (a, b)) in reference.cuts.iter().zip(&restored.cuts).enumerate() {
                for (address, bytes) in a {
                    assert!(
                        b.get(address) == Some(bytes),
                        "{name} ({partitions} partitions): {address:?} after input {cut} differs after restores"
                    );
                }
            }
            assert_eq!(reference.last, restored.last, "{name}: final snapshots differ");
            for (cut, (a, b)) in reference.views.iter().zip(&restored.views).enumerate() {
                let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
                let around =
                    |text: &str| text.get(at.saturating_sub(200)..(at + 200).min(text.len())).map(str::to_string);
                assert!(
                    a == b,
                    "{name} ({partitions} partitions): views after cut {cut} differ at {at}:\n{:?}\n{:?}",
                    around(a),
                    around(b)
                );
            }
            if reference.views.last().is_some_and(|views| views.contains("\"debt_batches\":[{")) {
                with_debt_batches += 1;
            }
            let all = reference.last.values().map(|bytes| text_of(bytes)).collect::<String>();
            if all.contains("\"timeline\":{\"entries\":[{") {
                with_timelines += 1;
            }
            rules_seen.extend(RULE_IDS.iter().copied().filter(|rule| all.contains(&format!("\"{rule}\""))));
        }
        driven += 1;
    }
    assert!(driven >= 100, "only {driven} scenarios driven");
    assert!(with_timelines >= 50, "only {with_timelines} runs with timelines");
    assert!(with_debt_batches >= 1, "no run has debt batches");
    assert!(rules_seen.len() >= 15, "the scenarios exercise only rules {rules_seen:?}");
}

fn text_of(bytes: &[u8]) -> String {
    text(bytes)
}

/// A mid-sized agent snapshot, from the richest golden scenario.
fn agent_snapshot() -> (Vec<u8>, Config) {
    let (_, text) = scenarios()
        .into_iter()
        .find(|(path, _)| path.ends_with("d_chk2_paging_fault_on_page2_with_coalesced_wave.jsonl"))
        .expect("the scenario");
    let scenario = parse_scenario(&text).expect("parses");
    let run = drive(&scenario.config, &scenario.inputs, 1, usize::MAX, false);
    (run.last[&(StageKind::Agent, 0)].clone(), scenario.config)
}

/// Whether an agent's derived indexes say exactly what its records say, the request count known.
fn derived_indexes_are_exact(agent: &crate::stages::agent::state::Agent) -> bool {
    agent.derived_indexes_hold() && agent.requests_outstanding.is_some()
}

#[test]
fn derived_agent_indexes_are_exact_when_kept_and_when_restored() {
    // Kept step by step through a replay of the workload (sub-orders finish, requests come and go).
    let engine = crate::replay::run(crate::replay::Scenario {
        config: Config::default(),
        inputs: crate::workload::workload(40, 4),
    });
    let agents: Vec<_> = engine.agents.agents.values().collect();
    assert!(agents.iter().all(|agent| derived_indexes_are_exact(agent)));
    let finals = agents.iter().map(|agent| (0..agent.subs.len()).filter(|sub| agent.final_subs.contains(*sub)).count());
    assert!(finals.sum::<usize>() > 100, "the workload leaves few final sub-orders");
    // Rebuilt when a snapshot (which leaves them out) is restored.
    let (bytes, config) = agent_snapshot();
    let restored = StagePartition::restore(&bytes, config).expect("restores");
    let StageState::Agent(stage) = restored.state() else { panic!("an agent partition") };
    assert!(stage.agents.values().any(|agent| !agent.subs.is_empty()));
    assert!(stage.agents.values().all(derived_indexes_are_exact));
}

#[test]
fn bad_bytes_are_errors_not_panics() {
    let (bytes, config) = agent_snapshot();
    assert!(bytes.len() > 1000, "a rich snapshot: {} bytes", bytes.len());
    assert!(StagePartition::restore(&bytes, config.clone()).is_ok());

    // Truncations: every one within the header and the start of the body, then a few hundred more.
    let step = (bytes.len() / 300).max(1);
    for end in (0..200).chain((200..bytes.len()).step_by(step)) {
        let error = StagePartition::restore(&bytes[..end], config.clone()).err();
        assert!(error.is_some(), "a snapshot truncated to {end} bytes restored");
    }
    // Corrupted bytes: an error, or (a change the format cannot see, e.g. inside a string) a partition.
    for position in (0..bytes.len()).step_by(step) {
        for byte in [b'"', b'{', b'x', b'9', 0xff] {
            let mut corrupt = bytes.clone();
            corrupt[position] = byte;
            let _ = StagePartition::restore(&corrupt, config.clone());
        }
    }
    assert!(matches!(StagePartition::restore(b"", config.clone()), Err(SnapshotError::NotASnapshot(_))));
    assert!(matches!(StagePartition::restore(b"{\"a\":1}", config.clone()), Err(SnapshotError::NotASnapshot(_))));

    let header = format!("{SNAPSHOT_MAGIC}{SNAPSHOT_VERSION}\n");
    let body = &bytes[header.len()..];
    for version in ["1", "2", "3", "5", "0", "", "4.0", "99999999999999999999"] {
        let other = [format!("{SNAPSHOT_MAGIC}{version}\n").as_bytes(), body].concat();
        match StagePartition::restore(&other, config.clone()) {
            Err(SnapshotError::Version { found, expected }) => {
                assert_eq!((found.as_str(), expected), (version, SNAPSHOT_VERSION))
            }
            other => panic!("version {version}: {other:?}"),
        }
    }
    let no_newline = format!("{SNAPSHOT_MAGIC}{SNAPSHOT_VERSION}");
    assert!(matches!(
        StagePartition::restore(no_newline.as_bytes(), config.clone()),
        Err(SnapshotError::NotASnapshot(_))
    ));
    let trailing = [bytes.as_slice(), b" x"].concat();
    assert!(matches!(StagePartition::restore(&trailing, config.clone()), Err(SnapshotError::Corrupt(_))));

    // A rule id or event name this build does not know.
    let body_text = text(&bytes);
    let unknown_rule = body_text.replacen("\"R-", "\"R-NOPE-", 1);
    assert_ne!(unknown_rule, body_text);
    assert!(matches!(StagePartition::restore(unknown_rule.as_bytes(), config.clone()), Err(SnapshotError::Corrupt(_))));
    let unknown_event = body_text.replacen("\"event\":\"", "\"event\":\"nope_", 1);
    assert_ne!(unknown_event, body_text);
    assert!(matches!(
        StagePartition::restore(unknown_event.as_bytes(), config.clone()),
        Err(SnapshotError::Corrupt(_))
    ));

    // Another configuration.
    let other = Config { crawl_retry_s: config.crawl_retry_s + 1, ..config.clone() };
    assert!(matches!(StagePartition::restore(&bytes, other), Err(SnapshotError::ConfigMismatch { .. })));

    // A state that contradicts its header.
    let wrong_kind = body_text.replacen("\"kind\":\"agent\"", "\"kind\":\"order\"", 1);
    assert_ne!(wrong_kind, body_text);
    assert!(matches!(
        StagePartition::restore(wrong_kind.as_bytes(), config.clone()),
        Err(SnapshotError::Inconsistent(_))
    ));
    let wrong_partition = body_text.replacen("\"partition\":0,", "\"partition\":5,", 1);
    assert_ne!(wrong_partition, body_text);
    assert!(matches!(
        StagePartition::restore(wrong_partition.as_bytes(), config.clone()),
        Err(SnapshotError::Inconsistent(_))
    ));
}

/// Edits the JSON of a snapshot (object order is kept) and frames it again.
fn edited(bytes: &[u8], edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    let body = unframe(bytes).expect("a snapshot");
    let mut value: serde_json::Value = serde_json::from_slice(body).expect("JSON");
    edit(&mut value);
    frame(&serde_json::to_vec(&value).expect("JSON"))
}

#[test]
fn indexes_that_point_nowhere_are_refused() {
    let (bytes, config) = agent_snapshot();
    assert_eq!(edited(&bytes, |_| {}), bytes, "an edit that changes nothing gives the same bytes");
    let agent = |value: &mut serde_json::Value| value["partition"]["state"]["Agent"]["agents"][0][1].take();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 4] = [
        ("sub_index", |agent| agent["sub_index"][0][1] = 999.into()),
        ("hold id", |agent| agent["holds"][0][0]["id"] = 7.into()),
        ("sub-order hold", |agent| agent["subs"][0]["hold_id"] = 999.into()),
        ("live sub-order", |agent| {
            let cards = agent["cards"].as_object_mut().expect("cards");
            let card = cards.values_mut().next().expect("a card");
            card["live_subs"] = serde_json::json!([999]);
        }),
    ];
    for (what, edit) in edits {
        let broken = edited(&bytes, |value| {
            let mut record = agent(value);
            assert!(!record.is_null(), "an agent");
            edit(&mut record);
            value["partition"]["state"]["Agent"]["agents"][0][1] = record;
        });
        match StagePartition::restore(&broken, config.clone()) {
            Err(SnapshotError::Inconsistent(_)) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    let timer = edited(&bytes, |value| {
        let user_id = value["partition"]["state"]["Agent"]["agents"][0][0].clone();
        let timers = value["partition"]["timers"].as_array_mut().expect("timers");
        let timer = serde_json::json!({"Agent": {"user_id": user_id, "timer": {"Close": {"sub": 999}}}});
        timers.push(serde_json::json!([["2099-01-01T00:00:00Z", 999_999], timer]));
    });
    assert!(matches!(StagePartition::restore(&timer, config), Err(SnapshotError::Inconsistent(_))));
}

#[test]
fn order_and_merchant_partitions_ignore_the_configuration() {
    let order = StagePartition::new(StageKind::Order, 1, 2, Config::default());
    let bytes = order.snapshot().expect("encodes");
    let other = Config { crawl_retry_s: 1, ..Config::default() };
    let restored = StagePartition::restore(&bytes, other).expect("restores");
    assert_eq!(restored.snapshot().expect("encodes"), bytes);
    assert_eq!((restored.kind(), restored.partition(), restored.partitions()), (StageKind::Order, 1, 2));
}

/// The `&'static str` lists a snapshot reads rule ids and event names back from must hold every one the
/// stages can write: every `"R-…"` literal of the stages, and every literal passed as the event of
/// `note` or `end_revival` (the only functions taking an event name).
#[test]
fn rule_and_event_lists_hold_every_name_the_stages_use() {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/stages");
    let mut sources = Vec::new();
    let mut pending = vec![directory];
    while let Some(directory) = pending.pop() {
        for entry in std::fs::read_dir(&directory).expect("a directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                sources.push(std::fs::read_to_string(&path).expect("a source"));
            }
        }
    }
    let mut rules = BTreeSet::new();
    let mut events = BTreeSet::new();
    let mut event_parameters = 0;
    for source in &sources {
        let mut rest = source.as_str();
        while let Some(start) = rest.find("\"R-") {
            let literal = &rest[start + 1..];
            let end = literal.find('"').expect("a closed literal");
            let name = &literal[..end];
            // A rule id, not a message that starts with one.
            if name.bytes().all(|byte| byte.is_ascii_uppercase() || byte.is_ascii_digit() || byte == b'-') {
                rules.insert(name.to_string());
            }
            rest = &literal[end..];
        }
        event_parameters += source.matches("event: &'static str").count();
        for call in [".note(", "end_revival("] {
            for (start, _) in source.match_indices(call) {
                if source[..start].ends_with("fn ") {
                    continue;
                }
                let arguments = call_arguments(&source[start + call.len()..]);
                let event = arguments.get(2).expect("an event argument").trim();
                if let Some(name) = event.strip_prefix('"').and_then(|name| name.strip_suffix('"')) {
                    events.insert(name.to_string());
                } else {
                    assert_eq!(event, "event", "an event name passed through a variable other than `event`");
                }
            }
        }
    }
    assert_eq!(event_parameters, 2, "a new function takes an event name: check its callers' literals here");
    let listed_rules: BTreeSet<String> = RULE_IDS.iter().map(|rule| rule.to_string()).collect();
    assert_eq!(rules, listed_rules, "RULE_IDS must list exactly the rule ids of the stages");
    let listed_events: BTreeSet<String> = TIMELINE_EVENTS.iter().map(|event| event.to_string()).collect();
    assert_eq!(events, listed_events, "TIMELINE_EVENTS must list exactly the events of the stages");
}

/// The top-level arguments of a call, from just after its opening parenthesis.
fn call_arguments(text: &str) -> Vec<String> {
    let mut arguments = Vec::new();
    let mut current = String::new();
    let mut depth = 0;
    let mut in_string = false;
    let mut characters = text.chars();
    while let Some(character) = characters.next() {
        if in_string {
            current.push(character);
            match character {
                '\\' => current.extend(characters.next()),
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match character {
            '"' => {
                in_string = true;
                current.push(character);
            }
            '(' | '[' | '{' => {
                depth += 1;
                current.push(character);
            }
            ')' | ']' | '}' if depth == 0 => {
                arguments.push(current);
                return arguments;
            }
            ')' | ']' | '}' => {
                depth -= 1;
                current.push(character);
            }
            ',' if depth == 0 => arguments.push(std::mem::take(&mut current)),
            _ => current.push(character),
        }
    }
    arguments
}

/// Snapshot sizes after the benchmark workload, small-scaled (`cargo test -p pipelines snapshot_size --
/// --nocapture` prints them).
#[test]
fn snapshot_size_of_the_workload() {
    let inputs = crate::workload::workload(200, 2);
    let config = Config::default();
    for partitions in [1, 3] {
        let run = drive(&config, &inputs, partitions, inputs.len() / 4, true);
        let total: usize = run.last.values().map(Vec::len).sum();
        println!(
            "workload(200, 2), {} inputs, {partitions} partition(s) per stage: {total} bytes in all",
            inputs.len()
        );
        for ((kind, partition), bytes) in &run.last {
            println!("  {}-{partition}: {} bytes", kind.name(), bytes.len());
        }
        assert!(run.last[&(StageKind::Agent, 0)].len() > 10_000);
    }
}
