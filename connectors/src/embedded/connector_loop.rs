//! The statement connector's processing loop on the embedded store: consumes `crawl_requested` from the
//! outputs log, asks the provider (concurrently within a batch, bounded per provider by the connector),
//! and commits the `crawl_result` inputs together with its consumer offset, so a crash re-asks the
//! provider (reads are idempotent) but never appends an answer twice.

use super::{system_now, Embedded};
use crate::runtime::{
    appended_logs, lock, stage_log_name, ClockMode, HandedBatch, LogName, OutputRecord, RuntimeError,
};
use crate::runtime::{encode, WriteBatch, CONNECTOR_CONSUMER, OUTPUTS_LOG};
use crate::statement::{Crawled, StatementConnector};
use pipelines::input::Command;
use pipelines::output::{CrawlRequested, OutputBody};
use pipelines::partition::{partition_of, RecordBody, RecordId, StageKind, StageRecord};
use pipelines::stages::{AgentBody, Message};
use pipelines::Timestamp;
use serde::de::{Error as _, MapAccess, Visitor};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// Outputs one connector batch reads at most (each crawl in it may take up to the request timeout).
pub const CONNECTOR_BATCH_RECORDS_MAX: usize = 1024;

/// Runs until the pipeline stops; a store failure stops the loop and is returned. The caller attaches
/// the connector ([`Embedded::attach_connector`]) before the API answers, so its backlog counts in the
/// lag from the start.
///
/// Pipelined: while batches' answers commit, the next batch is read and asked. A commit (waiting for
/// the store's one writer and its fsync) took ≈ 2/3 of a batch's time in the serve benchmark, and the
/// crawls that arrive meanwhile join the next batch instead of waiting for it. Where the store queues
/// commits, up to [`CONNECTOR_COMMITS_IN_FLIGHT_MAX`] batches are submitted, in order, without waiting
/// for the ones before (each joins the next group); elsewhere the next commit starts only once the one
/// before has returned. Either way the consumer offset only moves forward: each batch names the offset
/// it consumed from, and a batch behind a failed one fails with it.
async fn run(embedded: Embedded, connector: Arc<StatementConnector>) -> Result<(), RuntimeError> {
    let mut next = embedded.store().committed(CONNECTOR_CONSUMER)?;
    let mut committing: std::collections::VecDeque<Commit> = std::collections::VecDeque::new();
    let in_flight_max = if embedded.store().queues_commits() { CONNECTOR_COMMITS_IN_FLIGHT_MAX } else { 1 };
    let early = EarlyAnswers::start(&embedded, &connector);
    while !embedded.stopping() {
        let asked = ask_batch(&embedded, &connector, next, &early).await?;
        while committing.len() >= in_flight_max || committing.front().is_some_and(Commit::is_finished) {
            if let Some(commit) = committing.pop_front() {
                finish(commit).await?;
            }
        }
        match asked {
            Some((last_offset, batch)) => {
                next = last_offset + 1;
                committing.push_back(start_commit(&embedded, batch));
            }
            None => {
                let waiter = embedded.clone();
                let _ = tokio::task::spawn_blocking(move || waiter.wait_for_outputs(Duration::from_millis(100))).await;
            }
        }
    }
    while let Some(commit) = committing.pop_front() {
        finish(commit).await?;
    }
    Ok(())
}

/// Async worker threads of the statement connector's own runtime unless `paisa serve
/// --connector-threads` says otherwise: one, a current-thread runtime (see [`start_on_own_runtime`]).
pub const CONNECTOR_THREADS_DEFAULT: usize = 1;

/// Async worker threads the statement connector's runtime may be given, at most.
pub const CONNECTOR_THREADS_MAX: usize = 64;

/// The name of the statement connector's threads (the one driving its runtime and any workers).
const CONNECTOR_THREAD_NAME: &str = "connector";

/// Starts [`run`] on a tokio runtime of its own, driven by a thread of its own ([`CONNECTOR_THREAD_NAME`]),
/// which ends when the loop does; a failure is logged, as the service goes on serving reads. The thread is
/// not joined (`docs/DECISIONS.md`): the loop stops with the pipeline.
///
/// Why not on the API's runtime: the connector's many short tasks (a provider call each, their
/// connections, the commits' waits) then queue on the same workers as the API's requests, and a bulk
/// request waits for a worker behind them twice per request on 2 busy cores. On a runtime of its own the
/// connector's tasks stay on one thread and the API's workers take requests as they come (the serve
/// benchmark, fifty-ninth round: events/s 1.05 times, the service's CPU per event 0.95 times; see
/// `docs/PERFORMANCE.md`). `threads` above 1 gives a multi-threaded runtime of that many workers, for a
/// provider whose calls outgrow one thread.
pub fn start_on_own_runtime(
    embedded: Embedded,
    connector: Arc<StatementConnector>,
    threads: usize,
) -> Result<(), RuntimeError> {
    let runtime = connector_runtime(threads)?;
    std::thread::Builder::new()
        .name(CONNECTOR_THREAD_NAME.to_string())
        .spawn(move || {
            if let Err(error) = runtime.block_on(run(embedded, connector)) {
                tracing::error!(%error, "the statement connector stopped");
            }
        })
        .map(|_detached| ())
        .map_err(|error| RuntimeError::Fatal(format!("starting the connector's thread: {error}")))
}

/// A current-thread runtime for one thread (the thread that calls `block_on` drives it), else a
/// multi-threaded one with `threads` workers; 0 or more than [`CONNECTOR_THREADS_MAX`] is refused.
fn connector_runtime(threads: usize) -> Result<tokio::runtime::Runtime, RuntimeError> {
    if !(1..=CONNECTOR_THREADS_MAX).contains(&threads) {
        return Err(RuntimeError::Invalid(format!(
            "the connector's threads must be 1..={CONNECTOR_THREADS_MAX}, not {threads}"
        )));
    }
    let built = if threads == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(CONNECTOR_THREAD_NAME)
            .enable_all()
            .build()
    };
    built.map_err(|error| RuntimeError::Fatal(format!("starting the connector's runtime: {error}")))
}

/// Connector batches submitted and not yet seen committed, at most, where the store queues commits.
pub const CONNECTOR_COMMITS_IN_FLIGHT_MAX: usize = 4;

/// A batch's commit in flight (the consumers of the logs it appends to are woken once it is in).
struct Commit {
    task: tokio::task::JoinHandle<Result<(), RuntimeError>>,
}

impl Commit {
    fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// The agent partitions waiting for these answers are woken as soon as the commit is in, by the commit
/// task itself: `finish` runs only after the next batch's crawls, a whole provider round trip later.
/// A store that queues commits gets the batch here, in the loop's order (submitting only queues it); a
/// store that commits as it is handed a batch gets it on the blocking thread.
fn start_commit(embedded: &Embedded, batch: WriteBatch) -> Commit {
    let logs = appended_logs(&batch);
    let handed = HandedBatch::new(embedded.store(), batch);
    let committer = embedded.clone();
    let task = tokio::task::spawn_blocking(move || {
        handed.wait(committer.store())?;
        committer.ring(&logs);
        Ok(())
    });
    Commit { task }
}

async fn finish(commit: Commit) -> Result<(), RuntimeError> {
    commit.task.await.map_err(|error| RuntimeError::Fatal(format!("the commit task failed: {error}")))?
}

/// Reads the outputs from offset `from` on (at most a batch), asks the provider for every crawl among
/// them, and returns the last offset read with the batch to commit: the answers and the consumer's
/// new offset. None when there is nothing to read.
async fn ask_batch(
    embedded: &Embedded,
    connector: &Arc<StatementConnector>,
    from: u64,
    early: &EarlyAnswers,
) -> Result<Option<(u64, WriteBatch)>, RuntimeError> {
    let records = embedded.store().read(OUTPUTS_LOG, from, CONNECTOR_BATCH_RECORDS_MAX)?;
    let Some(&(last_offset, _)) = records.last() else {
        return Ok(None);
    };
    debug_assert_eq!(records.first().map(|(offset, _)| *offset), Some(from), "the outputs log has no gaps");
    let mut requests = Vec::new();
    for (offset, bytes) in records.iter().filter(|(_, bytes)| may_be_crawl_request(bytes)) {
        if let Some((requested_at, request)) = read_crawl_request(bytes) {
            requests.push((*offset, requested_at, request));
            continue;
        }
        match pipelines::decode::from_json_bytes::<OutputRecord>(bytes) {
            Ok(OutputRecord { output, .. }) => {
                if let OutputBody::CrawlRequested(request) = output.body {
                    requests.push((*offset, output.at, request));
                }
            }
            Err(error) => tracing::error!(offset, %error, "undecodable output skipped by the connector"),
        }
    }
    let results = answers(embedded, connector, &requests, early).await?;
    let mut batch = WriteBatch::default();
    let partitions = embedded.config().partitions;
    for ((offset, requested_at, request), crawled) in requests.iter().zip(results) {
        let Some(crawled) = crawled else { continue };
        let log = stage_log_name(StageKind::Agent, partition_of(&request.user_id, partitions));
        append_answer(
            &mut batch,
            log,
            answer_record_id(*offset),
            answer_time(embedded, *requested_at),
            request,
            crawled,
        )?;
    }
    batch.expected_offsets.push((CONNECTOR_CONSUMER.to_string(), from));
    batch.offsets.push((CONNECTOR_CONSUMER.to_string(), last_offset + 1));
    Ok(Some((last_offset, batch)))
}

/// The answer to each of `requests`, in their order. A request asked early takes its early call's
/// answer: that call already runs in a task of its own, so it is awaited here rather than through a
/// task per request (spawning and joining one for each of the ≈ 12,000 crawls of the serve benchmark
/// was ≈ 0.8 % of its CPU samples, `perf`). A request not asked early, or whose early call did not finish (its task
/// failed or was aborted), is asked now, concurrently with the others.
async fn answers(
    embedded: &Embedded,
    connector: &Arc<StatementConnector>,
    requests: &[(u64, Timestamp, CrawlRequested)],
    early: &EarlyAnswers,
) -> Result<Vec<Option<Crawled>>, RuntimeError> {
    let mut results: Vec<Option<Crawled>> = vec![None; requests.len()];
    let mut calls = tokio::task::JoinSet::new();
    let mut ask = |index: usize, requested_at: Timestamp, request: &CrawlRequested| {
        let connector = Arc::clone(connector);
        let request = request.clone();
        // On the event clock the provider answers as of the answer's event time (replay's answer).
        let as_of = event_answer_time(embedded, requested_at);
        calls.spawn(async move { (index, connector.crawl_keeping_page_as_of(&request, as_of).await) });
    };
    let mut asked_early = Vec::new();
    for (index, (_, requested_at, request)) in requests.iter().enumerate() {
        match early.take(&request.request_id) {
            Some(call) => asked_early.push((index, call)),
            None => ask(index, *requested_at, request),
        }
    }
    for (index, call) in asked_early {
        match call.await {
            Ok(answer) => results[index] = Some(answer),
            Err(_) => {
                let (_, requested_at, request) = &requests[index];
                ask(index, *requested_at, request);
            }
        }
    }
    while let Some(joined) = calls.join_next().await {
        let (index, result) = joined.map_err(|error| RuntimeError::Fatal(format!("a crawl task failed: {error}")))?;
        results[index] = Some(result);
    }
    Ok(results)
}

/// Calls to the provider started before their request was committed (`Embedded::take_early_crawls`):
/// the round that made the request commits meanwhile, so the provider round trip is off the answer
/// barrier's critical path. Only the call is early: an answer is still appended when the request is read
/// from the outputs log, as the same record it would have been. On the event clock the call asks as of
/// the same event time, so it gets the same answer; on the system clock, as of a few milliseconds
/// earlier, as a connector batch's first answers already were. A task starts the calls as soon as a
/// processing thread hands requests over; at most [`EARLY_ANSWERS_MAX`] are kept. A call nobody takes
/// (its round failed to commit, and the service stops; or, rarely, it started only after the connector
/// had read the request and called itself) is dropped with the rest when the bound is reached.
struct EarlyAnswers {
    calls: Arc<std::sync::Mutex<EarlyCalls>>,
    starter: tokio::task::JoinHandle<()>,
}

type EarlyCalls = std::collections::HashMap<pipelines::Text, tokio::task::JoinHandle<Crawled>>;

/// Early calls kept at most (a few batches' worth).
const EARLY_ANSWERS_MAX: usize = 4 * CONNECTOR_BATCH_RECORDS_MAX;

impl EarlyAnswers {
    /// Starts the task that starts a call for every request handed over.
    fn start(embedded: &Embedded, connector: &Arc<StatementConnector>) -> EarlyAnswers {
        let calls: Arc<std::sync::Mutex<EarlyCalls>> = Arc::default();
        let (embedded, connector, shared) = (embedded.clone(), Arc::clone(connector), Arc::clone(&calls));
        let added = embedded.early_crawls_added();
        let starter = tokio::spawn(async move {
            loop {
                added.notified().await;
                let crawls = embedded.take_early_crawls();
                let mut calls = lock(&shared);
                for (requested_at, request) in crawls {
                    if calls.len() >= EARLY_ANSWERS_MAX {
                        calls.drain().for_each(|(_, call)| call.abort());
                    }
                    let as_of = event_answer_time(&embedded, requested_at);
                    let (connector, request_id) = (Arc::clone(&connector), request.request_id.clone());
                    let call = tokio::spawn(async move { connector.crawl_keeping_page_as_of(&request, as_of).await });
                    if let Some(replaced) = calls.insert(request_id, call) {
                        replaced.abort();
                    }
                }
            }
        });
        EarlyAnswers { calls, starter }
    }

    /// The early call for `request_id`, if one was started.
    fn take(&self, request_id: &str) -> Option<tokio::task::JoinHandle<Crawled>> {
        lock(&self.calls).remove(request_id)
    }
}

/// The loop ends (stopped, or failed): no call is started or awaited any more.
impl Drop for EarlyAnswers {
    fn drop(&mut self) {
        self.starter.abort();
        lock(&self.calls).drain().for_each(|(_, call)| call.abort());
    }
}

/// Whether an outputs-log record may be a `crawl_requested`: its JSON has the type's tag, as the
/// runtime writes it (compact, `type` a plain string). Most outputs are callbacks, rejections and
/// notifications; reading each fully only to drop it was ≈ 1.5 % of the serve process's CPU time.
/// A false positive (the text inside another field) is read and dropped like before.
fn may_be_crawl_request(bytes: &[u8]) -> bool {
    const TAG: &[u8] = br#""type":"crawl_requested""#;
    bytes.windows(TAG.len()).any(|window| window == TAG)
}

/// Reads a crawl request from an outputs-log record whose output is in the shape the runtime writes
/// it, `{"at":…,"type":"crawl_requested",…the request's fields}`, straight into the request. serde's
/// derived reader of [`pipelines::output::Output`] (its body a flattened, internally tagged enum) copies
/// every entry into a tree of its own before reading it: ≈ 0.8 % of the serve benchmark's CPU samples
/// (`perf`), one record per crawl. None for a record of any other type or shape, which the caller reads
/// the general way.
fn read_crawl_request(bytes: &[u8]) -> Option<(Timestamp, CrawlRequested)> {
    let record: CrawlRequestRecord = pipelines::decode::from_json_bytes(bytes).ok()?;
    Some((record.output.at, record.output.request))
}

/// An outputs-log record holding a crawl request (its `id` is not needed).
#[derive(Deserialize)]
struct CrawlRequestRecord {
    output: CrawlRequestOutput,
}

/// A `crawl_requested` output read as `at`, then `type`, then the rest of the map as the request.
struct CrawlRequestOutput {
    at: Timestamp,
    request: CrawlRequested,
}

impl<'de> Deserialize<'de> for CrawlRequestOutput {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(CrawlRequestOutputVisitor)
    }
}

struct CrawlRequestOutputVisitor;

impl<'de> Visitor<'de> for CrawlRequestOutputVisitor {
    type Value = CrawlRequestOutput;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a crawl_requested output")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        expect_key(&mut map, "at")?;
        let at: Timestamp = map.next_value()?;
        expect_key(&mut map, "type")?;
        let kind: &str = map.next_value()?;
        if kind != "crawl_requested" {
            return Err(A::Error::unknown_variant(kind, &["crawl_requested"]));
        }
        let request = CrawlRequested::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        Ok(CrawlRequestOutput { at, request })
    }
}

/// The next key of `map`, which must be `expected`.
fn expect_key<'de, A: MapAccess<'de>>(map: &mut A, expected: &'static str) -> Result<(), A::Error> {
    match map.next_key::<&str>()? {
        Some(key) if key == expected => Ok(()),
        Some(key) => Err(A::Error::custom(format!("`{key}` where `{expected}` was expected"))),
        None => Err(A::Error::missing_field(expected)),
    }
}

/// When the answer happened: the wall clock, or (event clock) the request's time plus the configured
/// provider latency, so an event-clock run answers at the same event time as replay (SPEC §9).
fn answer_time(embedded: &Embedded, requested_at: Timestamp) -> Timestamp {
    event_answer_time(embedded, requested_at).unwrap_or_else(|| system_now().max(requested_at))
}

/// The answer's event time on the event clock (known before the call); None on the system clock.
fn event_answer_time(embedded: &Embedded, requested_at: Timestamp) -> Option<Timestamp> {
    let config = embedded.config();
    (config.clock == ClockMode::Event).then(|| requested_at.plus_seconds(config.engine.crawl_latency_s))
}

/// Appends the `crawl_result` record answering `request` to `log`. A page's record carries its lines as
/// the provider sent them (already read into the result): encoding them again was ≈ 6 % of the
/// service's CPU in the serve benchmark.
fn append_answer(
    batch: &mut WriteBatch,
    log: LogName,
    id: RecordId,
    at: Timestamp,
    request: &CrawlRequested,
    crawled: Crawled,
) -> Result<(), RuntimeError> {
    let Crawled { mut result, lines_json } = crawled;
    let encoded = match lines_json {
        Some(lines_json) => {
            let lines = std::mem::take(&mut result.lines);
            let without_lines = encode(&answer_record(id.clone(), at, request, result.clone()))?;
            result.lines = lines;
            with_lines_json(without_lines, &lines_json)
        }
        None => None,
    };
    let record = answer_record(id, at, request, result);
    match encoded {
        Some(bytes) => batch.append_encoded_stage_record(log, record, bytes),
        None => batch.append_stage_record(log, record)?,
    }
    Ok(())
}

/// An answer's record id: the position of the request it answers in the outputs log.
fn answer_record_id(offset: u64) -> RecordId {
    RecordId { source: OUTPUTS_LOG.into(), offset, index: 0 }
}

/// `encoded` (a `crawl_result` record encoded with no lines) with `lines_json` (a JSON array) in place
/// of its empty `lines` array. None if the encoding does not hold exactly one `"lines":[]`; it always
/// does, as the record's other keys are not `lines` and no JSON string holds an unescaped `"`.
fn with_lines_json(encoded: Vec<u8>, lines_json: &[u8]) -> Option<Vec<u8>> {
    const EMPTY_LINES: &[u8] = br#""lines":[]"#;
    let find = |bytes: &[u8]| bytes.windows(EMPTY_LINES.len()).position(|window| window == EMPTY_LINES);
    let start = find(&encoded)?;
    let end = start + EMPTY_LINES.len();
    if find(encoded.get(end..)?).is_some() {
        return None;
    }
    let array_start = end - "[]".len();
    let mut spliced = Vec::with_capacity(encoded.len() + lines_json.len());
    spliced.extend_from_slice(encoded.get(..array_start)?);
    spliced.extend_from_slice(lines_json);
    spliced.extend_from_slice(encoded.get(end..)?);
    Some(spliced)
}

fn answer_record(
    id: RecordId,
    at: Timestamp,
    request: &CrawlRequested,
    result: pipelines::input::CrawlResult,
) -> StageRecord {
    let message = Message::Agent {
        user_id: request.user_id.clone(),
        body: AgentBody::Input {
            event_id: pipelines::joined("crawl", ':', &request.request_id),
            command: Command::CrawlResult(result),
        },
    };
    StageRecord { id, at, body: RecordBody::Message { message } }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::EmbeddedConfig;
    use crate::statement::StatementConfig;
    use crate::wallet_sim_http::{serve_state, SimClock, WalletSimState};
    use pipelines::input::StatementLine;
    use pipelines::output::{CrawlMode, Output};
    use pipelines::partition::{RecordId, StageRecord};

    fn crawl_request(card_id: &str, number: u32) -> CrawlRequested {
        CrawlRequested {
            request_id: format!("{card_id}:{number}").into(),
            user_id: "u1".into(),
            card_id: card_id.into(),
            provider: pipelines::input::Provider::Paytm,
            mode: CrawlMode::OrderCheck,
            order: Some(pipelines::output::PageOrder::Desc),
            from: None,
            limit: Some(50),
            txn_id: None,
        }
    }

    /// A simulator on loopback holding one line on card `k1`, and an embedded runtime (event clock)
    /// whose connector asks it.
    struct Setup {
        sim: WalletSimState,
        embedded: Embedded,
        connector: Arc<StatementConnector>,
        at: Timestamp,
        _directory: tempfile::TempDir,
        _shutdown: tokio::sync::oneshot::Sender<()>,
    }

    async fn set_up() -> Setup {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let base_url = format!("http://{}", listener.local_addr().expect("an address"));
        let sim = WalletSimState::new(SimClock::Event);
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_state(listener, sim.clone(), async move {
            let _ = stopped.await;
        }));
        let at = Timestamp::parse("2026-03-02T09:30:00Z").expect("a time");
        let line = serde_json::json!({"type": "wallet_line", "at": at.to_string(), "card_id": "k1", "line": {
            "txn_id": "t1", "utr": "UTR1", "direction": "in", "amount": "456.00", "status": "success",
            "time": at.to_string()}});
        let posted = reqwest::Client::new()
            .post(format!("{base_url}/sim/v1/events"))
            .json(&serde_json::json!([line]))
            .send()
            .await
            .expect("posted");
        assert!(posted.status().is_success());

        let directory = tempfile::tempdir().expect("a temporary directory");
        let config = EmbeddedConfig::new(directory.path().to_path_buf(), crate::runtime::ClockMode::Event);
        let embedded = tokio::task::spawn_blocking(move || Embedded::start(config)).await.expect("joined");
        let embedded = embedded.expect("starts");
        embedded.attach_connector();
        let connector = Arc::new(StatementConnector::new(&StatementConfig::new(&base_url)).expect("a connector"));
        Setup { sim, embedded, connector, at, _directory: directory, _shutdown: shutdown }
    }

    /// A request handed over before its round commits is asked of the provider then, once: the answer
    /// the connector takes for it is the one a call made when the request is read would get.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_handed_over_early_is_asked_once_with_the_same_answer() {
        let Setup { sim, embedded, connector, at, _directory, _shutdown } = set_up().await;
        let early = EarlyAnswers::start(&embedded, &connector);
        let request = crawl_request("k1", 1);
        let requested_at = at.plus_seconds(60);
        crate::embedded::publish_early_crawls(&embedded, vec![(requested_at, request.clone())]);
        let started = std::time::Instant::now();
        let call = loop {
            if let Some(call) = early.take(&request.request_id) {
                break call;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "the early call was never started");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let answered_early = call.await.expect("the early call finished");
        assert_eq!(sim.stats().card_requests, 1, "asked once");
        assert!(early.take(&request.request_id).is_none(), "an early answer is taken once");
        let answered_late = connector.crawl_as_of(&request, event_answer_time(&embedded, requested_at)).await;
        assert_eq!(answered_early.result, answered_late);
        let lines_json = answered_early.lines_json.as_deref().expect("a page keeps its text");
        let lines: Vec<StatementLine> = serde_json::from_slice(lines_json).expect("the page's lines");
        assert_eq!(lines, answered_late.lines);
        let answered_early = answered_early.result;
        match &answered_early {
            pipelines::input::CrawlResult { ok: true, lines, .. } => assert_eq!(lines.len(), 1, "{answered_early:?}"),
            other => panic!("not a page: {other:?}"),
        }
        drop(early);
        tokio::task::spawn_blocking(move || embedded.stop()).await.expect("stopped");
    }

    /// Every request of a batch is answered, in order: from its early call when that call finished, by a
    /// call of its own when it was not asked early or its early call was aborted. The provider is asked
    /// once per request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_takes_early_answers_and_asks_the_rest() {
        let Setup { sim, embedded, connector, at, _directory, _shutdown } = set_up().await;
        let requested_at = at.plus_seconds(60);
        let as_of = event_answer_time(&embedded, requested_at);
        let requests: Vec<(u64, Timestamp, CrawlRequested)> =
            (1..=3).map(|number| (u64::from(number), requested_at, crawl_request("k1", number))).collect();
        let early = EarlyAnswers { calls: Arc::default(), starter: tokio::spawn(async {}) };
        let finished = {
            let (connector, request) = (Arc::clone(&connector), requests[0].2.clone());
            tokio::spawn(async move { connector.crawl_keeping_page_as_of(&request, as_of).await })
        };
        let aborted = tokio::spawn(std::future::pending::<Crawled>());
        aborted.abort();
        lock(&early.calls).insert(requests[0].2.request_id.clone(), finished);
        lock(&early.calls).insert(requests[2].2.request_id.clone(), aborted);

        let results = answers(&embedded, &connector, &requests, &early).await.expect("answered");
        assert_eq!(results.len(), 3);
        for ((_, _, request), result) in requests.iter().zip(&results) {
            let result = &result.as_ref().expect("every request answered").result;
            assert_eq!(result.request_id, request.request_id, "answers in the requests' order");
            assert!(result.ok && result.lines.len() == 1, "{result:?}");
        }
        assert_eq!(sim.stats().card_requests, 3, "one call per request");
        assert!(lock(&early.calls).is_empty(), "both early calls taken");
        drop(early);
        tokio::task::spawn_blocking(move || embedded.stop()).await.expect("stopped");
    }

    /// One thread gives a current-thread runtime, more a multi-threaded one with that many workers,
    /// and a count outside 1..=max is refused; the end-to-end tests run the connector on one thread and
    /// on two (`tests/service.rs`).
    #[test]
    fn the_connectors_runtime_has_the_threads_asked_for() {
        let one = connector_runtime(1).expect("a runtime");
        assert_eq!(one.handle().runtime_flavor(), tokio::runtime::RuntimeFlavor::CurrentThread);
        assert_eq!(one.metrics().num_workers(), 1);
        let three = connector_runtime(3).expect("a runtime");
        assert_eq!(three.handle().runtime_flavor(), tokio::runtime::RuntimeFlavor::MultiThread);
        assert_eq!(three.metrics().num_workers(), 3);
        for refused in [0, CONNECTOR_THREADS_MAX + 1] {
            match connector_runtime(refused) {
                Err(RuntimeError::Invalid(message)) => assert!(message.contains("1..=64"), "{message}"),
                Err(other) => panic!("{refused} threads: not refused as invalid: {other}"),
                Ok(_) => panic!("{refused} threads: not refused"),
            }
        }
    }

    /// The record `append_answer` writes for `crawled`, its bytes, and the record kept for consumers.
    fn appended(request: &CrawlRequested, crawled: Crawled) -> (Vec<u8>, StageRecord) {
        let mut batch = WriteBatch::default();
        let at = Timestamp::parse("2026-03-02T09:31:00Z").expect("a time");
        append_answer(&mut batch, "agent-0".into(), answer_record_id(41), at, request, crawled).expect("appended");
        assert_eq!(batch.appends.len(), 1);
        assert_eq!(batch.stage_records.len(), 1);
        let (log, bytes) = batch.appends.remove(0);
        assert_eq!(log, "agent-0");
        let (index, record) = batch.stage_records.remove(0);
        assert_eq!(index, 0);
        (bytes, record)
    }

    fn page_result(request: &CrawlRequested, lines_json: &str) -> Crawled {
        let lines: Vec<StatementLine> = serde_json::from_str(lines_json).expect("lines");
        let page = pipelines::wallet_sim::Answer::Page { lines, next_from: Some(Timestamp::from_millis(1_000)) };
        Crawled { result: page.into_result(request), lines_json: Some(lines_json.as_bytes().to_vec()) }
    }

    /// A page's lines reach the log as the provider wrote them (spacing, key order, nulls and all), and
    /// the record reads back as the one the agent partition is handed from memory. With the runtime's
    /// own spelling of the lines the bytes are exactly those of encoding the record.
    #[test]
    fn a_page_is_written_as_the_provider_sent_it_and_reads_back_as_the_same_record() {
        let request = crawl_request("k1", 1);
        let provider_text = r#"[ {"time":"2026-03-02T09:30:00Z", "txn_id":"t\"1", "direction":"in", "amount":"456.00",
            "status":"success", "utr":null, "utr_supported":null, "counterparty":null},
            {"txn_id":"t2","utr":"U2","direction":"out","amount":"10.50","status":"processing",
             "time":"2026-03-02T09:30:01.250Z","counterparty":{"name":"Ravi \u00e9","vpa":"r@ybl"}} ]"#;
        let (bytes, record) = appended(&request, page_result(&request, provider_text));
        let text = String::from_utf8(bytes.clone()).expect("UTF-8");
        assert!(text.contains(&format!(r#""lines":{provider_text}"#)), "{text}");
        let decoded: StageRecord = serde_json::from_slice(&bytes).expect("the record reads back");
        assert_eq!(encode(&decoded).expect("encodes"), encode(&record).expect("encodes"));
        let RecordBody::Message { message: Message::Agent { body: AgentBody::Input { command, .. }, .. } } =
            &record.body
        else {
            panic!("not an agent input: {record:?}");
        };
        let Command::CrawlResult(result) = command else { panic!("not a crawl result: {command:?}") };
        assert_eq!(result.lines.len(), 2);
        assert_eq!(result.lines[0].txn_id, "t\"1");
        assert!(result.lines[0].utr_supported, "null reads as the default");

        let canonical = String::from_utf8(serde_json::to_vec(&result.lines).expect("encodes")).expect("UTF-8");
        let (bytes, record) = appended(&request, page_result(&request, &canonical));
        assert_eq!(bytes, encode(&record).expect("encodes"));
    }

    /// Answers without a page's text (details, errors) are encoded as records always were.
    #[test]
    fn an_answer_without_a_page_text_is_encoded_whole() {
        let request = crawl_request("k1", 2);
        let mut crawled = page_result(
            &request,
            r#"[{"txn_id":"t1","direction":"in","amount":"1.00","status":"success","time":"2026-03-02T09:30:00Z"}]"#,
        );
        crawled.lines_json = None;
        let (bytes, record) = appended(&request, crawled);
        assert_eq!(bytes, encode(&record).expect("encodes"));
        assert!(String::from_utf8_lossy(&bytes).contains(r#""txn_id":"t1""#));
    }

    #[test]
    fn lines_are_spliced_only_into_exactly_one_empty_lines_array() {
        let splice = |encoded: &str| with_lines_json(encoded.as_bytes().to_vec(), b"[1]").map(String::from_utf8);
        assert_eq!(splice(r#"{"a":"x","lines":[],"b":2}"#), Some(Ok(r#"{"a":"x","lines":[1],"b":2}"#.to_string())));
        assert_eq!(splice(r#"{"lines":[],"b":{"lines":[]}}"#), None, "two empty arrays: which one is unknown");
        assert_eq!(splice(r#"{"lines":[2]}"#), None, "no empty array");
        assert_eq!(
            splice(r#"{"a":"\"lines\":[]","lines":[]}"#),
            Some(Ok(r#"{"a":"\"lines\":[]","lines":[1]}"#.into()))
        );
    }

    #[test]
    fn every_crawl_request_the_runtime_writes_is_recognised() {
        let request = crawl_request("k1", 1);
        let at = Timestamp::from_millis(0);
        let record = |body| OutputRecord {
            id: RecordId { source: "agent-0".into(), offset: 7, index: 1 },
            output: Output { at, body },
        };
        let bytes = encode(&record(OutputBody::CrawlRequested(request))).expect("encodes");
        assert!(may_be_crawl_request(&bytes), "{}", String::from_utf8_lossy(&bytes));
        let revoked = encode(&record(OutputBody::SessionRevoked { user_id: "u1".into() })).expect("encodes");
        assert!(!may_be_crawl_request(&revoked));
    }

    /// Every crawl request the runtime writes reads back as the general decoding reads it; a record of
    /// another type, or whose output has its keys in another order, is left to the general decoding.
    #[test]
    fn crawl_requests_are_read_as_the_general_decoding_reads_them() {
        let at = Timestamp::parse("2026-03-02T09:30:00.250Z").expect("a time");
        let record = |body| OutputRecord {
            id: RecordId { source: "agent-0".into(), offset: 7, index: 1 },
            output: Output { at, body },
        };
        let list = crawl_request("k \"1\"", 1);
        let bare = CrawlRequested { order: None, from: None, limit: None, ..crawl_request("k2", 2) };
        let from = CrawlRequested { from: Some(at), ..crawl_request("k3", 3) };
        let detail = CrawlRequested { mode: CrawlMode::Detail, txn_id: Some("t/1".into()), ..bare.clone() };
        for request in [list, bare, from, detail] {
            let bytes = encode(&record(OutputBody::CrawlRequested(request.clone()))).expect("encodes");
            let general: OutputRecord = pipelines::decode::from_json_bytes(&bytes).expect("decodes");
            assert_eq!(general.output.body, OutputBody::CrawlRequested(request.clone()));
            assert_eq!(read_crawl_request(&bytes), Some((at, request)), "{}", String::from_utf8_lossy(&bytes));
        }
        let revoked = encode(&record(OutputBody::SessionRevoked { user_id: "u1".into() })).expect("encodes");
        assert_eq!(read_crawl_request(&revoked), None);
        let bytes = encode(&record(OutputBody::CrawlRequested(crawl_request("k1", 1)))).expect("encodes");
        let text = String::from_utf8(bytes.clone()).expect("UTF-8");
        let at_entry = format!(r#""at":{},"#, serde_json::to_string(&at).expect("encodes"));
        let tag_entry = r#""type":"crawl_requested","#;
        let reordered = text.replacen(&format!("{at_entry}{tag_entry}"), &format!("{tag_entry}{at_entry}"), 1);
        assert_ne!(reordered, text, "the tag moved before the time");
        let reordered = reordered.into_bytes();
        assert!(pipelines::decode::from_json_bytes::<OutputRecord>(&reordered).is_ok());
        assert_eq!(read_crawl_request(&reordered), None, "left to the general decoding");
        assert_eq!(read_crawl_request(&bytes[..bytes.len() - 1]), None, "a cut record");
    }
}
