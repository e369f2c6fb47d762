//! `paisa serve --demo`: synthetic traffic for a newcomer. Within a minute the service shows collections
//! matched (R-MATCH-C1), one closed unpaid (R-WAVE-1, R-CLOSE-1) and then supplemented (R-POST-1/2), a
//! payout paid (R-MATCH-P1) and an agent banned for an ERRORED flood (R-ERR-1). Inputs go through the
//! same append path as the API; wallet lines go to the in-process simulated provider over HTTP.

use connectors::runtime::PipelineHandle;
use pipelines::input::*;
use pipelines::{Input, Timestamp};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Collections the demo creates at most (it stops after that: bounded traffic).
pub const DEMO_COLLECTIONS_MAX: u64 = 300;
/// Polls of the demo's wait for an order's state, and the pause between two.
const DEMO_WAIT_POLLS_MAX: u32 = 100;
const DEMO_WAIT_POLL_MS: u64 = 20;
/// Pause between two demo collections.
const DEMO_STEP_MS: u64 = 2_000;

/// The demo's engine settings: short waves so that closes happen within a minute.
pub fn demo_config() -> anyhow::Result<pipelines::Config> {
    let overrides =
        json!({ "collection_waves": [10, 20, 30], "collection_close_after": 30, "confirm_second_wave": 20 });
    Ok(pipelines::Config::from_overrides(serde_json::from_value(overrides)?)?)
}

pub struct Demo {
    pipeline: Arc<dyn PipelineHandle>,
    wallet_sim: String,
    client: reqwest::Client,
    sequence: u64,
}

impl Demo {
    pub fn new(pipeline: Arc<dyn PipelineHandle>, wallet_sim: String) -> Demo {
        Demo { pipeline, wallet_sim, client: reqwest::Client::new(), sequence: 0 }
    }

    fn append(&mut self, command: Command) {
        self.sequence += 1;
        let input = Input {
            event_id: format!("demo:{}", self.sequence).into(),
            at: connectors::embedded::system_now(),
            command,
        };
        if let Err(error) = self.pipeline.append(vec![input]) {
            tracing::warn!(%error, "demo input not appended");
        }
    }

    /// Waits (bounded) until `order_id` is visible with `state`: a dispatch racing the creation it
    /// depends on would be refused (SPEC §3: causally related inputs must not race).
    async fn wait_for_order(&self, order_id: &str, state: Option<&str>) {
        for _ in 0..DEMO_WAIT_POLLS_MAX {
            if let Some(order) = self.pipeline.order(order_id) {
                if state.is_none_or(|state| order["state"] == state) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(DEMO_WAIT_POLL_MS)).await;
        }
        tracing::warn!(order_id, "demo order did not reach the expected state in time");
    }

    async fn wallet_line(&self, card_id: &str, line: serde_json::Value) {
        let event = json!({ "type": "wallet_line", "card_id": card_id, "line": line });
        let url = format!("{}/sim/v1/events", self.wallet_sim);
        if let Err(error) = self.client.post(url).json(&event).send().await {
            tracing::warn!(%error, "demo wallet line not posted");
        }
    }

    /// Runs the demo traffic (bounded) and returns.
    pub async fn run(mut self) {
        self.set_up();
        for step in 0..DEMO_COLLECTIONS_MAX {
            self.collection(step).await;
            if (step + 3).is_multiple_of(5) {
                self.payout(step).await;
            }
            if step == 3 {
                self.errored_flood().await;
            }
            tokio::time::sleep(Duration::from_millis(DEMO_STEP_MS)).await;
        }
        tracing::info!("demo traffic finished");
    }

    fn set_up(&mut self) {
        self.append(Command::MerchantRegistered(MerchantRegistered {
            merchant_id: "demo-merchant".into(),
            collection_fee_rate: "0.02".into(),
            payout_fee_rate: "0.01".into(),
            payout_fee_fixed: "5.00".into(),
            callback_url: Some("https://merchant.example/callbacks".into()),
        }));
        self.append(Command::MerchantDeposit(MerchantDeposit {
            merchant_id: "demo-merchant".into(),
            amount: "100000.00".into(),
        }));
        for agent in 1..=4 {
            let user_id = format!("agent-{agent}");
            self.append(Command::UserRegistered(UserRegistered {
                user_id: user_id.clone().into(),
                telegram_bound: true,
            }));
            self.append(Command::CardBound(CardBound {
                user_id: user_id.clone().into(),
                card_id: format!("card-{agent}").into(),
                provider: Provider::Phonepe,
                account_last4: Some(format!("{agent:04}").into()),
                vpa: None,
            }));
            self.append(Command::UserRecharge(UserRecharge {
                user_id: user_id.into(),
                amount: "50000.00".into(),
                commission: "0.00".into(),
            }));
        }
    }

    /// A collection for agents 1–3; every fifth is never paid on time, closes, and is then supplemented
    /// with a late line.
    async fn collection(&mut self, step: u64) {
        let agent = step % 3 + 1;
        let order_id = format!("demo-c{step}");
        let utr = format!("{:012}", 400_000_000_000 + step);
        let amount = format!("{}.00", 100 + step);
        self.append(Command::CollectionCreated(CollectionCreated {
            order_id: order_id.clone().into(),
            merchant_id: "demo-merchant".into(),
            amount: amount.clone().into(),
            utr: Some(utr.clone().into()),
            expires_at: None,
        }));
        self.wait_for_order(&order_id, None).await;
        self.append(Command::CollectionDispatched(CollectionDispatched {
            order_id: order_id.clone().into(),
            user_id: format!("agent-{agent}").into(),
            card_id: format!("card-{agent}").into(),
        }));
        let line = |txn: &str| {
            json!({ "txn_id": txn, "utr": utr, "direction": "in", "amount": amount, "status": "success",
                    "time": timestamp_now(), "counterparty": { "vpa": "payer@upi" } })
        };
        if (step + 1).is_multiple_of(5) {
            // Unpaid: the supplement of a later step brings its line.
            return;
        }
        self.wallet_line(&format!("card-{agent}"), line(&format!("demo-t{step}"))).await;
        if step >= 25 && step.is_multiple_of(5) {
            // 21 steps (42 s) later: the unpaid collection has closed (30 s) by then.
            self.supplement(step - 21).await;
        }
    }

    /// A late payment of an earlier unpaid collection, found by the merchant's supplement (R-POST-1).
    async fn supplement(&mut self, unpaid_step: u64) {
        let agent = unpaid_step % 3 + 1;
        let utr = format!("{:012}", 400_000_000_000 + unpaid_step);
        let line = json!({ "txn_id": format!("demo-late-{unpaid_step}"), "utr": utr, "direction": "in",
            "amount": format!("{}.00", 100 + unpaid_step), "status": "success", "time": timestamp_now(),
            "counterparty": { "vpa": "late.payer@upi" } });
        self.wallet_line(&format!("card-{agent}"), line).await;
        self.append(Command::SupplementRequested(SupplementRequested {
            order_id: format!("demo-c{unpaid_step}").into(),
            utr: Some(utr.into()),
        }));
    }

    /// A payout grabbed by agent 1, paid from its wallet and confirmed.
    async fn payout(&mut self, step: u64) {
        let order_id = format!("demo-p{step}");
        let payee_last4 = format!("{:04}", 9000 + step % 1000);
        self.append(Command::PayoutCreated(PayoutCreated {
            order_id: order_id.clone().into(),
            merchant_id: "demo-merchant".into(),
            amount: "250.00".into(),
            payee: Box::new(Party {
                account_last4: Some(payee_last4.clone().into()),
                name: Some("Payee".into()),
                ..Party::default()
            }),
            expires_at: None,
        }));
        self.wait_for_order(&order_id, None).await;
        self.append(Command::PayoutGrabbed(PayoutGrabbed {
            order_id: order_id.clone().into(),
            user_id: "agent-1".into(),
            card_id: "card-1".into(),
        }));
        self.wait_for_order(&order_id, Some("in_progress")).await;
        let utr = format!("P{step:011}");
        let line = json!({ "txn_id": format!("demo-out-{step}"), "utr": utr, "direction": "out", "amount": "250.00",
            "status": "success", "time": timestamp_now(), "counterparty": { "account_last4": payee_last4 } });
        self.wallet_line("card-1", line).await;
        self.append(Command::PaymentConfirmed(PaymentConfirmed { order_id: order_id.into(), utr: Some(utr.into()) }));
    }

    /// Agent 4's statement fills with ERRORED lines; its next check bans it (R-ERR-1).
    async fn errored_flood(&mut self) {
        self.append(Command::CollectionCreated(CollectionCreated {
            order_id: "demo-flooded".into(),
            merchant_id: "demo-merchant".into(),
            amount: "75.00".into(),
            utr: None,
            expires_at: None,
        }));
        self.wait_for_order("demo-flooded", None).await;
        self.append(Command::CollectionDispatched(CollectionDispatched {
            order_id: "demo-flooded".into(),
            user_id: "agent-4".into(),
            card_id: "card-4".into(),
        }));
        self.wait_for_order("demo-flooded", Some("in_progress")).await;
        // Lines after the dispatch, so the collection's checks fetch them.
        for index in 0..12 {
            let line = json!({ "txn_id": format!("demo-err-{index}"), "utr": null, "direction": "in",
                "amount": "1.00", "status": "errored", "time": timestamp_now(), "counterparty": {} });
            self.wallet_line("card-4", line).await;
        }
    }
}

fn timestamp_now() -> String {
    let now: Timestamp = connectors::embedded::system_now();
    now.to_string()
}
