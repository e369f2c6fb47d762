//! `paisa wallet-sim`: the simulated statement provider of SPEC §9 (`pipelines::wallet_sim::WalletSim`)
//! served over the HTTP contract of SPEC §10, for demos, end-to-end tests and load. Answers come from
//! `WalletSim::answer`, so a card's answer over HTTP equals the one replay computes at the same time.
//!
//! Routes (all bodies JSON):
//! - `GET /v1/cards/{card_id}/transactions?order=asc|desc&from=RFC3339&limit=N` and
//!   `GET /v1/cards/{card_id}/transactions/{txn_id}`: the provider contract. Faults answer
//!   `401 {"error":"session_expired"}`, `503 {"error":"upstream_busy"}`,
//!   `404 {"error":"detail_unavailable"}`; a bad query parameter `400` naming it.
//! - `POST /sim/v1/events`: one SPEC §5 wallet event or an array of them (all or nothing), `{"applied": n}`.
//! - `GET|POST /sim/v1/clock`: the answer time; `POST {"at": RFC3339}` moves the event clock forward.
//! - `POST /sim/v1/latency {"card_id", "delay_ms"}`: delays that card's answers (0 clears).
//! - `GET /sim/v1/stats`: card requests in flight, the most ever in flight, and the total.
//! - `GET /healthz`.

mod server;

pub use server::{
    router, run, serve, serve_state, SimStats, WalletSimState, BODY_BYTES_MAX, DELAY_MS_MAX, EVENTS_PER_REQUEST_MAX,
    LIST_LIMIT_MAX, SIM_CARDS_MAX,
};

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// Which time the simulator answers at ("now" of `WalletSim::answer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SimClock {
    /// The wall clock: lines show up once their `at` and `time` have passed. Events posted without
    /// `at` are stamped with the wall clock.
    System,
    /// The largest `at` of the wallet events posted so far (or set through `POST /sim/v1/clock`);
    /// never goes back. Deterministic, for tests that compare with replay.
    Event,
}

impl std::str::FromStr for SimClock {
    type Err = String;

    fn from_str(text: &str) -> Result<SimClock, String> {
        match text {
            "system" => Ok(SimClock::System),
            "event" => Ok(SimClock::Event),
            other => Err(format!("unknown clock `{other}` (expected `system` or `event`)")),
        }
    }
}

impl std::fmt::Display for SimClock {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            SimClock::System => "system",
            SimClock::Event => "event",
        })
    }
}

/// Settings of `paisa wallet-sim`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WalletSimServerConfig {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Which time the simulator answers at.
    pub clock: SimClock,
}

#[cfg(test)]
mod tests;
