//! The `paisa` binary: `paisa replay FILE` prints the SPEC §9 document of a scenario; `paisa serve` runs
//! the pipeline on the embedded store behind the HTTP API; `paisa wallet-sim` serves the simulated
//! statement provider over HTTP (SPEC §10).

/// mimalloc: the stages allocate many small short-lived strings; it beats the system allocator there
/// (through its plain entry points where they suffice: `pipelines::allocator`).
#[global_allocator]
static ALLOCATOR: pipelines::allocator::Allocator = pipelines::allocator::Allocator;

mod demo;
mod http;
mod memory;

use anyhow::Context;
use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand, ValueEnum};
use connectors::embedded::{connector_loop, Embedded, EmbeddedConfig};
use connectors::runtime::ClockMode;
use connectors::statement::{StatementConfig, StatementConnector};
use connectors::wallet_sim_http::SimClock;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "paisa", version, about = "Reconciles e-wallet statements against merchant payment orders")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Clock {
    /// The server stamps `at` from the wall clock and ticks follow it.
    System,
    /// The posted `at` drives time (tests, reprocessing).
    Event,
}

/// Where the logs, offsets and small tables live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Profile {
    /// One redb file in `--data-dir` (the default: nothing to install).
    Embedded,
    /// Kafka topics and consumer-group offsets, committed in Kafka transactions (`--kafka-brokers`).
    Kafka,
}

#[derive(Subcommand)]
enum Commands {
    /// Replays a JSON-lines scenario (SPEC §9) and prints the final state as JSON.
    Replay {
        /// The scenario file.
        file: PathBuf,
    },
    /// Runs the pipeline on the embedded store (or on Kafka) behind the HTTP API.
    Serve(ServeOptions),
    /// Serves the simulated statement provider over HTTP (SPEC §10).
    WalletSim {
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: SocketAddr,
        #[arg(long, value_enum, default_value = "system")]
        clock: Clock,
        /// MiB of the allocator's arena to fault in at start, as `serve --memory-prefault-mib` does (the
        /// simulator's statement lines then grow into pages already mapped). 0 (the default): none.
        #[arg(long, default_value_t = 0)]
        memory_prefault_mib: u16,
    },
    /// Rebuilds the read model from the Kafka topics into a fresh ScyllaDB keyspace and compares it with
    /// the live one (exit 0: equal; 1: differences, listed). Processes and commits nothing: it runs
    /// beside a live instance.
    Reprocess {
        /// Rebuild from the beginning of the topics (the only mode).
        #[arg(long, required = true)]
        from_beginning: bool,
        /// Kafka bootstrap servers (`host:port,…`).
        #[arg(long)]
        kafka_brokers: String,
        /// Partitions of each stage topic (as the live instance runs with).
        #[arg(long, default_value_t = 2)]
        partitions: u32,
        /// The SPEC §8 settings file the live instance runs with.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The ScyllaDB node (`host:port`).
        #[arg(long)]
        scylla_uri: String,
        /// The live read model's keyspace.
        #[arg(long, default_value = "paisa")]
        keyspace: String,
        /// The keyspace to rebuild into (created; it should be new).
        #[arg(long)]
        into_keyspace: String,
    },
    /// Operator tasks of the Kafka profile.
    Admin {
        #[command(subcommand)]
        task: AdminTask,
    },
}

#[derive(Subcommand)]
enum AdminTask {
    /// Creates the Kafka topics that `serve --profile kafka` needs; idempotent: exits 0 when every topic
    /// already exists as wanted, fails when one exists with another partition count.
    Init {
        /// Kafka bootstrap servers (`host:port,…`).
        #[arg(long)]
        kafka_brokers: String,
        /// Partitions of each stage topic (fixed for the life of the topics).
        #[arg(long, default_value_t = 2)]
        partitions: u32,
        /// Replicas of each topic (and of the ScyllaDB keyspace, `SimpleStrategy`).
        #[arg(long, default_value_t = 1)]
        replication_factor: i32,
        /// A ScyllaDB node (`host:port`): also creates the read model's keyspace and tables.
        #[arg(long)]
        scylla_uri: Option<String>,
        /// The read model's keyspace.
        #[arg(long, default_value = "paisa")]
        keyspace: String,
    },
}

fn main() -> ExitCode {
    if let Some(message) = cpu_level_missing() {
        eprintln!("paisa: {message}");
        return ExitCode::from(1);
    }
    pipelines::allocator::configure();
    let cli = Cli::parse();
    match cli.command {
        Commands::Replay { file } => match replay(&file) {
            Ok(code) => code,
            Err(error) => {
                eprintln!("paisa replay: {error:#}");
                ExitCode::from(1)
            }
        },
        Commands::Serve(options) => {
            install_tracing();
            memory::disable_transparent_huge_pages();
            prefault_memory(options.memory_prefault_mib);
            exit_on_error("paisa serve", run_async(serve(options)))
        }
        Commands::WalletSim { listen, clock, memory_prefault_mib } => {
            install_tracing();
            memory::disable_transparent_huge_pages();
            prefault_memory(memory_prefault_mib);
            exit_on_error("paisa wallet-sim", run_async(wallet_sim(listen, clock)))
        }
        Commands::Reprocess {
            from_beginning: _,
            kafka_brokers,
            partitions,
            config,
            scylla_uri,
            keyspace,
            into_keyspace,
        } => {
            install_tracing();
            let options = ReprocessOptions { kafka_brokers, partitions, config, scylla_uri, keyspace, into_keyspace };
            match run_async(reprocess(options)) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(error) => {
                    eprintln!("paisa reprocess: {error:#}");
                    ExitCode::from(2)
                }
            }
        }
        Commands::Admin {
            task: AdminTask::Init { kafka_brokers, partitions, replication_factor, scylla_uri, keyspace },
        } => {
            install_tracing();
            let scylla = scylla_uri.map(|uri| (uri, keyspace));
            exit_on_error(
                "paisa admin init",
                run_async(admin_init(kafka_brokers, partitions, replication_factor, scylla)),
            )
        }
    }
}

/// `paisa admin init`: prints one line per topic (created or already there).
async fn admin_init(
    brokers: String,
    partitions: u32,
    replication_factor: i32,
    scylla: Option<(String, String)>,
) -> anyhow::Result<()> {
    let config = connectors::kafka::KafkaConfig::new(brokers, partitions);
    for status in connectors::kafka::admin::init_topics(&config, replication_factor).await? {
        match status {
            connectors::kafka::admin::TopicStatus::Created { topic, partitions } => {
                println!("created {topic} ({partitions} partitions)")
            }
            connectors::kafka::admin::TopicStatus::Existed { topic, partitions } => {
                println!("exists  {topic} ({partitions} partitions)")
            }
        }
    }
    if let Some((uri, keyspace)) = scylla {
        let replicas = u32::try_from(replication_factor).context("--replication-factor")?;
        let config = scylla_config(&uri, &keyspace, replicas);
        tokio::task::spawn_blocking(move || connectors::scylla::ScyllaReadModel::init(&config)).await??;
        println!("ready   ScyllaDB keyspace {keyspace} and its tables");
    }
    Ok(())
}

struct ReprocessOptions {
    kafka_brokers: String,
    partitions: u32,
    config: Option<PathBuf>,
    scylla_uri: String,
    keyspace: String,
    into_keyspace: String,
}

/// `paisa reprocess --from-beginning`: true when the rebuild equals the live read model.
async fn reprocess(options: ReprocessOptions) -> anyhow::Result<bool> {
    let mut kafka = connectors::kafka::KafkaConfig::new(options.kafka_brokers.clone(), options.partitions);
    // Reads only: no transactions, and a transactional id of its own, so the live instance is not fenced.
    kafka.transactions = false;
    kafka.transactional_id = "paisa-reprocess".to_string();
    let directory = std::env::temp_dir().join(format!("paisa-reprocess-{}", std::process::id()));
    let mut config = EmbeddedConfig::new(directory, ClockMode::Event);
    config.partitions = options.partitions;
    config.engine = engine_config(options.config.as_deref())?;
    let live = read_model(&options.scylla_uri, &options.keyspace).await?;
    let fresh = read_model(&options.scylla_uri, &options.into_keyspace).await?;
    let comparison = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let store = connectors::kafka::KafkaStore::open(kafka)?;
        let rebuilt = connectors::embedded::reprocess::rebuild(config, Box::new(store), Arc::clone(&fresh))?;
        Ok(connectors::embedded::reprocess::compare(&rebuilt, fresh.as_ref(), live.as_ref())?)
    })
    .await??;
    println!(
        "rebuilt into {}: {} rows equal, {} moved on since, {} different",
        options.into_keyspace,
        comparison.equal,
        comparison.moved_on,
        comparison.differences.len()
    );
    for difference in &comparison.differences {
        println!("differs: {difference}");
    }
    Ok(comparison.differences.is_empty())
}

fn scylla_config(uri: &str, keyspace: &str, replicas: u32) -> connectors::scylla::ScyllaConfig {
    connectors::scylla::ScyllaConfig::new(uri, keyspace, connectors::scylla::Replication::Simple { replicas })
}

/// The read model of `--scylla-uri`: ScyllaDB, or (`memory`) one in this process.
async fn read_model(uri: &str, keyspace: &str) -> anyhow::Result<Arc<dyn connectors::scylla::ReadModel>> {
    if uri == "memory" {
        return Ok(Arc::new(connectors::scylla::MemoryReadModel::new(connectors::scylla::PAGE_ITEMS_MAX)));
    }
    let config = scylla_config(uri, keyspace, 1);
    let model = tokio::task::spawn_blocking(move || connectors::scylla::ScyllaReadModel::init(&config)).await??;
    Ok(Arc::new(model))
}

/// What this CPU lacks of the level the binary was built for (`deploy/pgo` builds for x86-64-v3 where
/// it can): such a binary dies of an unknown instruction (SIGILL) wherever the compiler first used one,
/// so it says so at start instead. Only features the build enabled are asked for.
fn cpu_level_missing() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut missing: Vec<&str> = Vec::new();
        macro_rules! require {
            ($($feature:tt),*) => {$(
                if cfg!(target_feature = $feature) && !std::arch::is_x86_feature_detected!($feature) {
                    missing.push($feature);
                }
            )*};
        }
        require!(
            "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "bmi1", "bmi2", "fma", "f16c", "lzcnt",
            "movbe"
        );
        if !missing.is_empty() {
            return Some(format!(
                "this binary was built for a CPU with {}, which this one lacks; build it for this machine \
                 (PGO_TARGET_CPU=x86-64 bash deploy/pgo build, or cargo build --release)",
                missing.join(", ")
            ));
        }
    }
    None
}

fn exit_on_error(name: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name}: {error:#}");
            ExitCode::from(1)
        }
    }
}

fn run_async<T>(future: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?.block_on(future)
}

/// Faults in the first `mib` MiB of the allocator's arena before a service starts
/// (`--memory-prefault-mib`), and logs what it did; a failure is logged and the service starts anyway.
fn prefault_memory(mib: u16) {
    if mib == 0 {
        return;
    }
    let started = std::time::Instant::now();
    match memory::fault_in_arena(usize::from(mib) << 20) {
        Ok(faulted_in) => tracing::info!(
            mib,
            arena_start = %format_args!("{:#x}", faulted_in.start),
            faulted_in_mib = faulted_in.bytes >> 20,
            arena_mib = faulted_in.arena_bytes >> 20,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "memory faulted in"
        ),
        Err(error) => tracing::warn!(mib, %error, "memory not faulted in; pages fault in as first touched"),
    }
}

/// Structured logs on stderr (JSON), filtered by `RUST_LOG` (default `info`).
fn install_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().json().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn replay(file: &Path) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    match pipelines::replay::replay_to_json(&text) {
        Ok(document) => {
            println!("{document}");
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("{}: {error}", file.display());
            Ok(ExitCode::from(2))
        }
    }
}

/// The arguments of `paisa serve`.
#[derive(clap::Args)]
struct ServeOptions {
    /// The data directory (created if missing; with `--demo`, a fresh temporary one by default).
    #[arg(long, required_unless_present_any = ["demo", "kafka_brokers"])]
    data_dir: Option<PathBuf>,
    /// Where the logs live: the embedded store in `--data-dir`, or Kafka.
    #[arg(long, value_enum, default_value = "embedded")]
    profile: Profile,
    /// Kafka bootstrap servers (`host:port,…`) of `--profile kafka`; `mock` starts librdkafka's
    /// in-process mock cluster (tests, trying the profile out: nothing survives the process).
    #[arg(long, required_if_eq("profile", "kafka"))]
    kafka_brokers: Option<String>,
    /// With `--profile kafka`: the ScyllaDB node (`host:port`) of the read model the API reads from
    /// (kept up to date by a projector); `memory` keeps the read model in the process (tests). Without
    /// it the API reads the stages' state directly.
    #[arg(long, requires = "kafka_brokers")]
    scylla_uri: Option<String>,
    /// The read model's keyspace.
    #[arg(long, default_value = "paisa")]
    keyspace: String,
    /// With `--profile kafka`: a Confluent Schema Registry (`http://host:port`). The topics' value
    /// schemas are registered at start (a schema the registry finds incompatible stops the start)
    /// and records carry the ids it gave; without it, the embedded schemas' static ids.
    #[arg(long, requires = "kafka_brokers")]
    schema_registry: Option<String>,
    /// With `--profile kafka`: share the stage partitions with other `serve` instances as member ID of
    /// the consumer group `paisa.stages` (transactional id `paisa-stages-ID`, unique per instance).
    /// This instance then processes, ticks and projects only the partitions the group assigns it, and
    /// takes others over when an instance leaves. Exactly one instance ingests; the others run with
    /// `--no-ingest`.
    #[arg(long, requires = "kafka_brokers")]
    group_member: Option<String>,
    /// With `--group-member`: `session.timeout.ms` of the membership; an instance silent this long
    /// loses its partitions to the others.
    #[arg(long, requires = "group_member", default_value_t = 10_000)]
    group_session_timeout_ms: u64,
    /// With `--group-member`: refuse inputs (503) and run no statement connector; the instance that
    /// ingests runs them.
    #[arg(long, requires = "group_member")]
    no_ingest: bool,
    /// With `--no-ingest`: forward every write (`POST`) to the instance that ingests, at this base URL
    /// (`http://host:port`), with the caller's credentials, and answer with its answer (instead of 503).
    #[arg(long, requires = "no_ingest")]
    ingest_url: Option<String>,
    /// Address to listen on; port 0 picks a free port (the bound address is printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[arg(long, value_enum, default_value = "system")]
    clock: Clock,
    /// Base URL of the statement provider (SPEC §10); without it crawl requests time out (R-CHK-1).
    #[arg(long)]
    statement_provider: Option<String>,
    /// Partitions per stage (fixed when the data directory is created).
    #[arg(long, default_value_t = 2)]
    partitions: u32,
    /// A JSON file of SPEC §8 settings (the keys of a `config` line).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Async worker threads of the statement connector's runtime, which is its own, apart from the
    /// API's: 1 (the default) runs it on one thread; more suit a provider whose calls outgrow a thread.
    #[arg(long, default_value_t = connector_loop::CONNECTOR_THREADS_DEFAULT,
          value_parser = clap::value_parser!(u16).range(1..=connector_loop::CONNECTOR_THREADS_MAX as i64)
              .map(usize::from))]
    connector_threads: usize,
    /// MiB of the allocator's arena to fault in at start (at most the arena, 1 GiB): the service then
    /// grows into pages the kernel has already mapped and zeroed instead of faulting each in on first
    /// use (worth it on virtual machines, where a first touch also faults in the host). The memory
    /// stays resident. 0 (the default) faults nothing in.
    #[arg(long, default_value_t = 0)]
    memory_prefault_mib: u16,
    /// Also runs an in-process wallet simulator and synthetic traffic (short waves: closes within
    /// a minute).
    #[arg(long)]
    demo: bool,
}

/// Starts the pipeline on Kafka (`brokers` = `mock`: an in-process mock cluster, returned to be kept
/// alive as long as the pipeline runs).
async fn start_on_kafka(
    config: EmbeddedConfig,
    brokers: &str,
    read_model: Option<Arc<dyn connectors::scylla::ReadModel>>,
    schema_registry: Option<&str>,
    group: Option<(&str, u64)>,
) -> anyhow::Result<(Embedded, Option<connectors::kafka::MockCluster>)> {
    let mut kafka = connectors::kafka::KafkaConfig::new(brokers, config.partitions);
    if let Some((member, session_timeout_ms)) = group {
        kafka.group_member = true;
        kafka.transactional_id = format!("paisa-stages-{member}");
        kafka.session_timeout_ms = session_timeout_ms;
    }
    let cluster = if brokers == "mock" { Some(connectors::kafka::start_mock_cluster(&mut kafka)?) } else { None };
    if let Some(registry) = schema_registry {
        kafka.schema_ids = connectors::kafka::payload::register_schemas(registry, &kafka.avro_topics()).await?;
        tracing::info!(ids = ?kafka.schema_ids.by_topic, "value schemas registered");
    }
    let embedded = tokio::task::spawn_blocking(move || -> anyhow::Result<Embedded> {
        let store = connectors::kafka::KafkaStore::open(kafka)?.with_metrics(Arc::clone(&config.metrics));
        Ok(Embedded::start_on(config, Box::new(store), read_model)?)
    })
    .await??;
    Ok((embedded, cluster))
}

fn engine_config(path: Option<&Path>) -> anyhow::Result<pipelines::Config> {
    let Some(path) = path else {
        return Ok(pipelines::Config::default());
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let overrides = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    pipelines::Config::from_overrides(overrides).with_context(|| format!("invalid settings in {}", path.display()))
}

async fn serve(mut options: ServeOptions) -> anyhow::Result<()> {
    let clock = match options.clock {
        Clock::System => ClockMode::System,
        Clock::Event => ClockMode::Event,
    };
    if options.demo && clock == ClockMode::Event {
        anyhow::bail!("--demo runs on the system clock");
    }
    if options.no_ingest && (options.statement_provider.is_some() || options.demo) {
        anyhow::bail!(
            "--no-ingest runs no statement connector: give --statement-provider to the instance that ingests"
        );
    }
    let data_dir = match options.data_dir.take() {
        Some(data_dir) => data_dir,
        None => std::env::temp_dir().join(format!("paisa-demo-{}", std::process::id())),
    };
    let mut config = EmbeddedConfig::new(data_dir, clock);
    config.partitions = options.partitions;
    // One recorder for the API's figures and the pipeline's: a scrape of `GET /metrics` shows both.
    let metrics = Arc::new(http::Metrics::new());
    config.metrics = Arc::new(metrics.pipeline_metrics());
    tokio::spawn(run_metrics_upkeep(Arc::clone(&metrics)));
    config.engine = match (&options.config, options.demo) {
        (None, true) => demo::demo_config()?,
        (path, _) => engine_config(path.as_deref())?,
    };
    // On the event clock the connector stamps each answer `crawl_latency` after its request, so agent
    // partitions can wait for answers in flight (an instance that does not ingest runs no connector,
    // but processes partitions whose crawls the ingesting instance's connector answers).
    if clock == ClockMode::Event && (options.statement_provider.is_some() || options.no_ingest) {
        config.answer_delay_s = Some(config.engine.crawl_latency_s);
    }
    let mut read_model_in_use = None;
    let (embedded, _mock_cluster) = match options.profile {
        Profile::Embedded => (tokio::task::spawn_blocking(move || Embedded::start(config)).await??, None),
        Profile::Kafka => {
            let brokers = options.kafka_brokers.clone().context("--profile kafka needs --kafka-brokers")?;
            let model = match &options.scylla_uri {
                Some(uri) => Some(read_model(uri, &options.keyspace).await?),
                None => None,
            };
            let registry = options.schema_registry.as_deref();
            let group = options.group_member.as_deref().map(|member| (member, options.group_session_timeout_ms));
            let (embedded, cluster) = start_on_kafka(config, &brokers, model.clone(), registry, group).await?;
            if options.no_ingest {
                embedded.refuse_ingestion();
            }
            read_model_in_use = model;
            (embedded, cluster)
        }
    };
    if options.demo && options.statement_provider.is_none() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the wallet simulator")?;
        options.statement_provider = Some(format!("http://{}", listener.local_addr()?));
        tokio::spawn(connectors::wallet_sim_http::serve(listener, SimClock::System, std::future::pending()));
    }
    if let Some(base_url) = options.statement_provider.clone() {
        let connector = StatementConnector::new(&StatementConfig::new(base_url))?
            .with_metrics(Arc::clone(&embedded.config().metrics));
        // Before the API answers: until then the connector's backlog would not count in the lag, and a
        // client could see a lag of 0 with crawls still unanswered.
        embedded.attach_connector();
        // On a runtime of its own, so that the connector's tasks do not queue before the API's requests.
        connector_loop::start_on_own_runtime(embedded.clone(), Arc::new(connector), options.connector_threads)?;
    }
    let mut admin_key = std::env::var("PAISA_ADMIN_KEY").unwrap_or_default();
    if options.demo && admin_key.is_empty() {
        admin_key = DEMO_ADMIN_KEY.to_string();
    }
    if admin_key.is_empty() {
        tracing::warn!("PAISA_ADMIN_KEY is not set: admin endpoints refuse every request");
    }
    let api_clock = match clock {
        ClockMode::System => http::ClockMode::System,
        ClockMode::Event => http::ClockMode::Event,
    };
    // The API reads the read model when there is one (the Kafka + ScyllaDB profile), else the stages.
    let pipeline: Arc<dyn connectors::runtime::PipelineHandle> = match read_model_in_use {
        Some(model) => Arc::new(connectors::embedded::projector::ReadModelPipeline::new(embedded.clone(), model)),
        None => Arc::new(embedded.clone()),
    };
    let mut state = http::ApiState::new(pipeline, api_clock, &admin_key, http::Limits::default()).with_metrics(metrics);
    if let Some(ingest_url) = &options.ingest_url {
        state = state.forwarding_writes_to(ingest_url).context("--ingest-url")?;
    }
    let listener = tokio::net::TcpListener::bind(options.listen).await.context("binding the listen address")?;
    let address = listener.local_addr()?;
    println!("paisa serve listening on http://{address}");
    if options.demo {
        print_demo_help(address, &admin_key);
        let pipeline: Arc<dyn connectors::runtime::PipelineHandle> = Arc::new(embedded.clone());
        let wallet_sim = options.statement_provider.clone().unwrap_or_default();
        tokio::spawn(demo::Demo::new(pipeline, wallet_sim).run());
    }
    tracing::info!(%address, "listening");
    let failed = embedded.clone();
    let shutdown = async move {
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = watch_failure(failed) => {}
        }
    };
    axum::serve(listener, http::router(state)).with_graceful_shutdown(shutdown).await?;
    let stopping = embedded.clone();
    tokio::task::spawn_blocking(move || stopping.stop()).await?;
    match embedded.failure() {
        Some(failure) => anyhow::bail!("processing failed: {failure}"),
        None => Ok(()),
    }
}

/// Folds the figures' buffered samples into their buckets every [`http::UPKEEP_INTERVAL_MS`], for as
/// long as the service runs.
async fn run_metrics_upkeep(metrics: Arc<http::Metrics>) {
    let mut interval = tokio::time::interval(std::time::Duration::from_millis(http::UPKEEP_INTERVAL_MS));
    loop {
        interval.tick().await;
        metrics.run_upkeep();
    }
}

/// The admin key `--demo` uses when `PAISA_ADMIN_KEY` is not set.
const DEMO_ADMIN_KEY: &str = "demo-admin-key";

fn print_demo_help(address: SocketAddr, admin_key: &str) {
    println!("demo traffic started; try, within a minute:");
    println!("  curl -s -H 'Authorization: Bearer {admin_key}' http://{address}/v1/orders/demo-c0");
    println!("  curl -s -H 'Authorization: Bearer {admin_key}' http://{address}/v1/orders/demo-c4   # closed unpaid");
    println!("  curl -s -H 'Authorization: Bearer {admin_key}' http://{address}/v1/users/agent-4/balance   # banned");
    println!("  curl -s -H 'Authorization: Bearer {admin_key}' http://{address}/v1/merchants/demo-merchant/balance");
    println!("  curl -s -H 'Authorization: Bearer {admin_key}' http://{address}/v1/admin/review-queue");
}

/// Completes when processing has failed (the service then exits; a restart recovers from the log).
async fn watch_failure(embedded: Embedded) {
    while embedded.failure().is_none() {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

async fn wallet_sim(listen: SocketAddr, clock: Clock) -> anyhow::Result<()> {
    let clock = match clock {
        Clock::System => SimClock::System,
        Clock::Event => SimClock::Event,
    };
    let listener = tokio::net::TcpListener::bind(listen).await.context("binding the listen address")?;
    let address = listener.local_addr()?;
    println!("paisa wallet-sim listening on http://{address}");
    tracing::info!(%address, %clock, "wallet simulator listening");
    connectors::wallet_sim_http::serve(listener, clock, shutdown_signal()).await?;
    Ok(())
}
