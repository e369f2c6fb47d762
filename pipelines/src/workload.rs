//! A deterministic synthetic workload: thousands of agents with collections and payouts that their
//! wallets pay (some never paid, so they close), ERRORED noise and a few floods that ban agents. Used by
//! the benchmark, profiling and demos; pure like the rest of the crate.

use crate::input::*;
use crate::Text;
use crate::{Input, Timestamp};

struct Generator {
    inputs: Vec<Input>,
    start: Timestamp,
}

impl Generator {
    fn push(&mut self, seconds: i64, command: Command) {
        let at = self.start.plus_seconds(seconds);
        let event_id = format!("w:{}", self.inputs.len());
        self.inputs.push(Input { event_id: event_id.into(), at, command });
    }
}

fn line(
    txn_id: String,
    utr: Option<Text>,
    direction: Direction,
    amount: &str,
    status: LineStatus,
    time: Timestamp,
    last4: Option<&str>,
) -> Box<StatementLine> {
    Box::new(StatementLine {
        txn_id: txn_id.into(),
        utr,
        utr_supported: true,
        direction,
        amount: amount.into(),
        status,
        time,
        counterparty: Counterparty { account_last4: last4.map(Text::from), ..Counterparty::default() }.into(),
        payee_ifsc: None,
    })
}

/// A deterministic workload of about `agents × rounds × 9` input events.
pub fn workload(agents: usize, rounds: usize) -> Vec<Input> {
    let start = Timestamp::parse("2026-03-02T00:00:00Z").unwrap_or_default();
    let mut generator = Generator { inputs: Vec::with_capacity(agents * rounds * 10), start };
    let merchants = (agents / 40).max(1);
    for merchant in 0..merchants {
        let merchant_id = format!("m{merchant}");
        generator.push(
            0,
            Command::MerchantRegistered(MerchantRegistered {
                merchant_id: merchant_id.clone().into(),
                collection_fee_rate: "0.025".into(),
                payout_fee_rate: "0.01".into(),
                payout_fee_fixed: "3.00".into(),
                callback_url: None,
            }),
        );
        generator.push(
            0,
            Command::MerchantDeposit(MerchantDeposit {
                merchant_id: merchant_id.into(),
                amount: "100000000.00".into(),
            }),
        );
    }
    let providers = [Provider::Paytm, Provider::Phonepe, Provider::Mobikwik, Provider::Freecharge];
    for agent in 0..agents {
        let user_id = format!("u{agent}");
        generator.push(
            0,
            Command::UserRegistered(UserRegistered { user_id: user_id.clone().into(), telegram_bound: agent % 2 == 0 }),
        );
        generator.push(
            0,
            Command::CardBound(CardBound {
                user_id: user_id.clone().into(),
                card_id: format!("k{agent}").into(),
                provider: providers[agent % 4],
                account_last4: None,
                vpa: None,
            }),
        );
        generator.push(
            0,
            Command::UserRecharge(UserRecharge {
                user_id: user_id.into(),
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
            let utr = (agent % 2 == 0).then(|| compact_str::format_compact!("{round:04}{agent:08}"));
            generator.push(
                offset,
                Command::CollectionCreated(CollectionCreated {
                    order_id: order_id.clone().into(),
                    merchant_id: merchant_id.clone().into(),
                    amount: amount.into(),
                    utr: utr.clone(),
                    expires_at: None,
                }),
            );
            generator.push(
                offset,
                Command::CollectionDispatched(CollectionDispatched {
                    order_id: order_id.clone().into(),
                    user_id: user_id.clone().into(),
                    card_id: card_id.clone().into(),
                }),
            );
            if (agent + round) % 10 != 0 {
                let paid_at = start.plus_seconds(offset + 40);
                generator.push(
                    offset + 45,
                    Command::WalletLine(WalletLine {
                        card_id: card_id.clone().into(),
                        line: line(
                            format!("in{round}-{agent}"),
                            utr.or_else(|| Some(compact_str::format_compact!("b{round:04}{agent:08}"))),
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
            let payout_utr = compact_str::format_compact!("9{round:04}{agent:07}");
            generator.push(
                offset + 60,
                Command::PayoutCreated(PayoutCreated {
                    order_id: payout_id.clone().into(),
                    merchant_id: merchant_id.into(),
                    amount: amount.into(),
                    payee: Box::new(Party { account_last4: Some("4321".into()), ..Party::default() }),
                    expires_at: None,
                }),
            );
            generator.push(
                offset + 61,
                Command::PayoutGrabbed(PayoutGrabbed {
                    order_id: payout_id.clone().into(),
                    user_id: user_id.clone().into(),
                    card_id: card_id.clone().into(),
                }),
            );
            let paid_at = start.plus_seconds(offset + 90);
            generator.push(
                offset + 95,
                Command::WalletLine(WalletLine {
                    card_id: card_id.clone().into(),
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
                Command::PaymentConfirmed(PaymentConfirmed { order_id: payout_id.into(), utr: Some(payout_utr) }),
            );
            // ERRORED noise: a couple of lines per round; one agent in 500 floods and is banned.
            let noise = if agent % 500 == 7 && round == 1 { 12 } else { 2 };
            for index in 0..noise {
                generator.push(
                    offset + 110,
                    Command::WalletLine(WalletLine {
                        card_id: card_id.clone().into(),
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
