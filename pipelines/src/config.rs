//! Configuration (SPEC §8). Durations are integer seconds, money and rates decimal strings. A scenario's
//! first line may be a `config` line overriding any of these keys; unknown keys are structural errors.

use crate::money::{Money, Rate};
use serde::Deserialize;

/// Engine settings; every field has the SPEC §8 default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Seconds after a sub-order's creation where its matching window starts (R-WIN-1).
    pub window_start_offset_s: i64,
    /// Seconds added to the check time (or `closed_at`) for the window's upper bound (R-WIN-1/2).
    pub window_slack_s: i64,
    /// "Amounts equal" tolerance (SPEC §3).
    pub amount_tolerance: Money,
    /// Seconds after dispatch of the automatic collection checks (R-WAVE-1).
    pub collection_waves_s: Vec<i64>,
    /// Seconds after dispatch of the close check (R-WAVE-1, R-CLOSE-1).
    pub collection_close_after_s: i64,
    /// Seconds after `payment_confirmed` of the first confirmation wave (R-WAVE-2).
    pub confirm_first_wave_s: i64,
    /// The same on freecharge cards (R-WAVE-2).
    pub confirm_first_wave_freecharge_s: i64,
    /// Seconds after `payment_confirmed` of the second wave (R-WAVE-2).
    pub confirm_second_wave_s: i64,
    /// Seconds before a busy check is asked again (R-CHK-3).
    pub crawl_retry_s: i64,
    /// Seconds without an answer after which a request counts as busy (R-CHK-1).
    pub crawl_timeout_s: i64,
    /// Pages of one phonepe order check at most (R-CHK-2).
    pub crawl_pages_max: u32,
    /// Seconds between detail retries of an `ifsc_unverified` sub-order (R-MATCH-P1).
    pub detail_retry_s: i64,
    /// Seconds after a grab of the payout's final check (R-PAY-1).
    pub payout_pay_timeout_s: i64,
    /// Seconds an under-paid payout may wait for its top-up (R-MATCH-P4).
    pub underpaid_timeout_s: i64,
    /// Seconds between reservoir syncs of a card (R-PEND-1).
    pub reservoir_interval_s: i64,
    /// Seconds a `bill_pending` sub-order waits before it is rejected (R-PEND-2).
    pub bill_pending_timeout_s: i64,
    /// The same on freecharge cards (R-PEND-2).
    pub bill_pending_timeout_freecharge_s: i64,
    /// Seconds between deferred-debit sweeps (R-DEBT-2).
    pub debt_sweep_interval_s: i64,
    /// Width in seconds of the ERRORED counting window (R-ERR-1).
    pub errored_window_s: i64,
    /// ERRORED lines a window may hold before the agent is banned (R-ERR-1).
    pub errored_max: u32,
    /// Reward rate credited to an agent on payout success (R-MER-5).
    pub payout_reward_rate: Rate,
    /// Seconds the simulated provider takes to answer (SPEC §9).
    pub crawl_latency_s: i64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window_start_offset_s: 0,
            window_slack_s: 60,
            amount_tolerance: Money::from_paise(1),
            collection_waves_s: vec![120, 300, 480],
            collection_close_after_s: 480,
            confirm_first_wave_s: 5,
            confirm_first_wave_freecharge_s: 30,
            confirm_second_wave_s: 120,
            crawl_retry_s: 30,
            crawl_timeout_s: 60,
            crawl_pages_max: 4,
            detail_retry_s: 600,
            payout_pay_timeout_s: 600,
            underpaid_timeout_s: 86_400,
            reservoir_interval_s: 14_400,
            bill_pending_timeout_s: 259_200,
            bill_pending_timeout_freecharge_s: 432_000,
            debt_sweep_interval_s: 60,
            errored_window_s: 180,
            errored_max: 10,
            payout_reward_rate: Rate::zero(),
            crawl_latency_s: 1,
        }
    }
}

/// Longest duration a setting may name: ten years, so timer arithmetic never overflows.
const DURATION_MAX_S: i64 = 10 * 366 * 86_400;
/// Waves per collection at most (a bound on timers per sub-order).
const COLLECTION_WAVES_MAX: usize = 16;

/// The overridable keys as they appear in a `config` line or file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigOverrides {
    /// Optional stamp of the `config` line (ignored).
    pub at: Option<String>,
    /// Optional id of the `config` line (ignored).
    pub event_id: Option<String>,
    pub window_start_offset: Option<i64>,
    pub window_slack: Option<i64>,
    pub amount_tolerance: Option<String>,
    pub collection_waves: Option<Vec<i64>>,
    pub collection_close_after: Option<i64>,
    pub confirm_first_wave: Option<i64>,
    pub confirm_first_wave_freecharge: Option<i64>,
    pub confirm_second_wave: Option<i64>,
    pub crawl_retry: Option<i64>,
    pub crawl_timeout: Option<i64>,
    pub crawl_pages_max: Option<u32>,
    pub detail_retry: Option<i64>,
    pub payout_pay_timeout: Option<i64>,
    pub underpaid_timeout: Option<i64>,
    pub reservoir_interval: Option<i64>,
    pub bill_pending_timeout: Option<i64>,
    pub bill_pending_timeout_freecharge: Option<i64>,
    pub debt_sweep_interval: Option<i64>,
    pub errored_window: Option<i64>,
    pub errored_max: Option<u32>,
    pub payout_reward_rate: Option<String>,
    pub crawl_latency: Option<i64>,
}

/// A configuration that cannot run (structural: a replay stops with exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("`{key}` must be a duration between 0 and {DURATION_MAX_S} seconds, got {value}")]
    Duration { key: &'static str, value: i64 },
    #[error("`{key}` is not a valid decimal: {value}")]
    Decimal { key: &'static str, value: String },
    #[error("`crawl_timeout` ({timeout}) must exceed `crawl_latency` ({latency})")]
    TimeoutNotAboveLatency { timeout: i64, latency: i64 },
    #[error("`{key}` must be at least 1")]
    Positive { key: &'static str },
    #[error("`collection_waves` must hold at most {COLLECTION_WAVES_MAX} ascending durations")]
    Waves,
}

fn duration(key: &'static str, value: Option<i64>, target: &mut i64) -> Result<(), ConfigError> {
    if let Some(value) = value {
        if !(0..=DURATION_MAX_S).contains(&value) {
            return Err(ConfigError::Duration { key, value });
        }
        *target = value;
    }
    Ok(())
}

impl Config {
    /// Applies overrides to the defaults and checks the result.
    pub fn from_overrides(overrides: ConfigOverrides) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let o = overrides;
        duration("window_start_offset", o.window_start_offset, &mut config.window_start_offset_s)?;
        duration("window_slack", o.window_slack, &mut config.window_slack_s)?;
        duration("collection_close_after", o.collection_close_after, &mut config.collection_close_after_s)?;
        duration("confirm_first_wave", o.confirm_first_wave, &mut config.confirm_first_wave_s)?;
        duration(
            "confirm_first_wave_freecharge",
            o.confirm_first_wave_freecharge,
            &mut config.confirm_first_wave_freecharge_s,
        )?;
        duration("confirm_second_wave", o.confirm_second_wave, &mut config.confirm_second_wave_s)?;
        duration("crawl_retry", o.crawl_retry, &mut config.crawl_retry_s)?;
        duration("crawl_timeout", o.crawl_timeout, &mut config.crawl_timeout_s)?;
        duration("detail_retry", o.detail_retry, &mut config.detail_retry_s)?;
        duration("payout_pay_timeout", o.payout_pay_timeout, &mut config.payout_pay_timeout_s)?;
        duration("underpaid_timeout", o.underpaid_timeout, &mut config.underpaid_timeout_s)?;
        duration("reservoir_interval", o.reservoir_interval, &mut config.reservoir_interval_s)?;
        duration("bill_pending_timeout", o.bill_pending_timeout, &mut config.bill_pending_timeout_s)?;
        duration(
            "bill_pending_timeout_freecharge",
            o.bill_pending_timeout_freecharge,
            &mut config.bill_pending_timeout_freecharge_s,
        )?;
        duration("debt_sweep_interval", o.debt_sweep_interval, &mut config.debt_sweep_interval_s)?;
        duration("errored_window", o.errored_window, &mut config.errored_window_s)?;
        duration("crawl_latency", o.crawl_latency, &mut config.crawl_latency_s)?;
        if let Some(waves) = o.collection_waves {
            let ascending = waves.windows(2).all(|pair| pair[0] < pair[1]);
            let in_range = waves.iter().all(|wave| (0..=DURATION_MAX_S).contains(wave));
            if waves.len() > COLLECTION_WAVES_MAX || !ascending || !in_range {
                return Err(ConfigError::Waves);
            }
            config.collection_waves_s = waves;
        }
        if let Some(pages) = o.crawl_pages_max {
            if pages == 0 {
                return Err(ConfigError::Positive { key: "crawl_pages_max" });
            }
            config.crawl_pages_max = pages;
        }
        if let Some(maximum) = o.errored_max {
            config.errored_max = maximum;
        }
        if let Some(text) = o.amount_tolerance {
            config.amount_tolerance = Money::parse(&text)
                .ok()
                .filter(|tolerance| !tolerance.is_negative())
                .ok_or(ConfigError::Decimal { key: "amount_tolerance", value: text })?;
        }
        if let Some(text) = o.payout_reward_rate {
            config.payout_reward_rate =
                Rate::parse(&text).map_err(|_| ConfigError::Decimal { key: "payout_reward_rate", value: text })?;
        }
        if config.debt_sweep_interval_s == 0 {
            return Err(ConfigError::Positive { key: "debt_sweep_interval" });
        }
        if config.reservoir_interval_s == 0 {
            return Err(ConfigError::Positive { key: "reservoir_interval" });
        }
        if config.detail_retry_s == 0 {
            return Err(ConfigError::Positive { key: "detail_retry" });
        }
        if config.crawl_timeout_s <= config.crawl_latency_s {
            return Err(ConfigError::TimeoutNotAboveLatency {
                timeout: config.crawl_timeout_s,
                latency: config.crawl_latency_s,
            });
        }
        Ok(config)
    }
}
