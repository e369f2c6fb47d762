//! Throughput of the pure engine on a generated workload: thousands of agents, collections and payouts
//! matched through the simulated provider's statements, ERRORED noise and some floods that ban agents.
//!
//! Run: `cargo bench -p pipelines --bench engine` (criterion reports the time per replay of the whole
//! workload and, as throughput, input events per second). `WORKLOAD_AGENTS` and `WORKLOAD_ROUNDS`
//! resize the workload.

/// The allocator the `paisa` binary uses too: glibc's malloc fragments under millions of small,
/// long-lived strings and spends a third of the time in malloc/free.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pipelines::input::*;
use pipelines::wallet_sim::WalletSim;
use pipelines::{Config, Engine, Input, Timestamp};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

struct Generator {
    inputs: Vec<Input>,
    start: Timestamp,
}

impl Generator {
    fn push(&mut self, seconds: i64, command: Command) {
        let at = self.start.plus_seconds(seconds);
        let event_id = format!("w:{}", self.inputs.len());
        self.inputs.push(Input {
            event_id,
            at,
            command,
        });
    }
}

fn line(
    txn_id: String,
    utr: Option<String>,
    direction: Direction,
    amount: &str,
    status: LineStatus,
    time: Timestamp,
    last4: Option<&str>,
) -> StatementLine {
    StatementLine {
        txn_id,
        utr,
        utr_supported: true,
        direction,
        amount: amount.to_string(),
        status,
        time,
        counterparty: Party {
            account_last4: last4.map(str::to_string),
            ..Party::default()
        },
        payee_ifsc: None,
    }
}

/// A deterministic workload of about `agents × rounds × 9` input events.
fn workload(agents: usize, rounds: usize) -> Vec<Input> {
    let start = Timestamp::parse("2026-03-02T00:00:00Z").unwrap_or_default();
    let mut generator = Generator {
        inputs: Vec::with_capacity(agents * rounds * 10),
        start,
    };
    let merchants = (agents / 40).max(1);
    for merchant in 0..merchants {
        let merchant_id = format!("m{merchant}");
        generator.push(
            0,
            Command::MerchantRegistered(MerchantRegistered {
                merchant_id: merchant_id.clone(),
                collection_fee_rate: "0.025".into(),
                payout_fee_rate: "0.01".into(),
                payout_fee_fixed: "3.00".into(),
                callback_url: None,
            }),
        );
        generator.push(
            0,
            Command::MerchantDeposit(MerchantDeposit {
                merchant_id,
                amount: "100000000.00".into(),
            }),
        );
    }
    let providers = [
        Provider::Paytm,
        Provider::Phonepe,
        Provider::Mobikwik,
        Provider::Freecharge,
    ];
    for agent in 0..agents {
        let user_id = format!("u{agent}");
        generator.push(
            0,
            Command::UserRegistered(UserRegistered {
                user_id: user_id.clone(),
                telegram_bound: agent % 2 == 0,
            }),
        );
        generator.push(
            0,
            Command::CardBound(CardBound {
                user_id: user_id.clone(),
                card_id: format!("k{agent}"),
                provider: providers[agent % 4],
                account_last4: None,
                vpa: None,
            }),
        );
        generator.push(
            0,
            Command::UserRecharge(UserRecharge {
                user_id,
                amount: "50000.00".into(),
                commission: "10.00".into(),
            }),
        );
    }
    let amounts = ["100.00", "250.00", "500.00", "1000.00", "2000.00"];
    let round_s = 900i64;
    for round in 0..rounds {
        let base = 60 + round as i64 * round_s;
        for agent in 0..agents {
            let user_id = format!("u{agent}");
            let card_id = format!("k{agent}");
            let merchant_id = format!("m{}", agent % merchants);
            let offset = base + (agent as i64 % 300);
            let amount = amounts[(agent + round) % amounts.len()];
            // A collection, half of them with a UTR, paid a little later (some never paid → closed).
            let order_id = format!("c{round}-{agent}");
            let utr = (agent % 2 == 0).then(|| format!("{round:04}{agent:08}"));
            generator.push(
                offset,
                Command::CollectionCreated(CollectionCreated {
                    order_id: order_id.clone(),
                    merchant_id: merchant_id.clone(),
                    amount: amount.into(),
                    utr: utr.clone(),
                    expires_at: None,
                }),
            );
            generator.push(
                offset,
                Command::CollectionDispatched(CollectionDispatched {
                    order_id: order_id.clone(),
                    user_id: user_id.clone(),
                    card_id: card_id.clone(),
                }),
            );
            if (agent + round) % 10 != 0 {
                let paid_at = start.plus_seconds(offset + 40);
                generator.push(
                    offset + 45,
                    Command::WalletLine(WalletLine {
                        card_id: card_id.clone(),
                        line: line(
                            format!("in{round}-{agent}"),
                            utr.or_else(|| Some(format!("b{round:04}{agent:08}"))),
                            Direction::In,
                            amount,
                            LineStatus::Success,
                            paid_at,
                            None,
                        ),
                    }),
                );
            }
            // A payout, grabbed, paid and confirmed with its UTR.
            let payout_id = format!("p{round}-{agent}");
            let payout_utr = format!("9{round:04}{agent:07}");
            generator.push(
                offset + 60,
                Command::PayoutCreated(PayoutCreated {
                    order_id: payout_id.clone(),
                    merchant_id,
                    amount: amount.into(),
                    payee: Party {
                        account_last4: Some("4321".into()),
                        ..Party::default()
                    },
                    expires_at: None,
                }),
            );
            generator.push(
                offset + 61,
                Command::PayoutGrabbed(PayoutGrabbed {
                    order_id: payout_id.clone(),
                    user_id: user_id.clone(),
                    card_id: card_id.clone(),
                }),
            );
            let paid_at = start.plus_seconds(offset + 90);
            generator.push(
                offset + 95,
                Command::WalletLine(WalletLine {
                    card_id: card_id.clone(),
                    line: line(
                        format!("out{round}-{agent}"),
                        Some(payout_utr.clone()),
                        Direction::Out,
                        amount,
                        LineStatus::Success,
                        paid_at,
                        Some("4321"),
                    ),
                }),
            );
            generator.push(
                offset + 100,
                Command::PaymentConfirmed(PaymentConfirmed {
                    order_id: payout_id,
                    utr: Some(payout_utr),
                }),
            );
            // ERRORED noise: a couple of lines per round; one agent in 500 floods and is banned.
            let noise = if agent % 500 == 7 && round == 1 {
                12
            } else {
                2
            };
            for index in 0..noise {
                generator.push(
                    offset + 110,
                    Command::WalletLine(WalletLine {
                        card_id: card_id.clone(),
                        line: line(
                            format!("e{round}-{agent}-{index}"),
                            None,
                            Direction::In,
                            "1.00",
                            LineStatus::Errored,
                            start.plus_seconds(offset + 100 + index),
                            None,
                        ),
                    }),
                );
            }
        }
    }
    generator.inputs.sort_by_key(|input| input.at);
    generator.inputs
}

/// Replays the workload; returns the engine so that criterion drops it outside the timed section (a
/// running engine is never torn down).
fn replay(inputs: Vec<Input>) -> (Engine, usize) {
    let mut engine = Engine::new(Config::default(), Some(WalletSim::default()));
    let last = inputs.last().map(|input| input.at);
    let mut outputs = 0;
    for (index, input) in inputs.into_iter().enumerate() {
        engine.apply(input);
        if index % 4096 == 0 {
            outputs += engine.take_outputs().len(); // a service streams outputs away
        }
    }
    if let Some(last) = last {
        engine.advance_to(last);
    }
    let outputs = outputs + engine.take_outputs().len();
    (engine, outputs)
}

/// What the workload did, to show it exercises matching, closes and bans (printed once).
fn describe(inputs: Vec<Input>) -> String {
    let mut engine = Engine::new(Config::default(), Some(WalletSim::default()));
    let last = inputs.last().map(|input| input.at);
    for input in inputs {
        engine.apply(input);
    }
    if let Some(last) = last {
        engine.advance_to(last);
    }
    let mut states = std::collections::BTreeMap::new();
    for order in engine.orders.orders.values() {
        *states
            .entry(format!("{:?} {:?}", order.kind, order.state))
            .or_insert(0usize) += 1;
    }
    let banned = engine
        .agents
        .agents
        .values()
        .filter(|agent| agent.status == pipelines::stages::agent::state::AgentStatus::Banned)
        .count();
    format!(
        "orders {states:?}, banned agents {banned}, outputs {}",
        engine.outputs().len()
    )
}

fn bench(criterion: &mut Criterion) {
    let agents = env_or("WORKLOAD_AGENTS", 5_000);
    let rounds = env_or("WORKLOAD_ROUNDS", 20);
    let inputs = workload(agents, rounds);
    let events = inputs.len();
    eprintln!("workload: {agents} agents, {rounds} rounds, {events} input events");
    eprintln!("{}", describe(inputs.clone()));
    let mut group = criterion.benchmark_group("engine");
    group.sample_size(10);
    group.throughput(Throughput::Elements(events as u64));
    group.bench_function(format!("replay_{events}_events"), |bencher| {
        bencher.iter_batched(|| inputs.clone(), replay, BatchSize::LargeInput)
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
