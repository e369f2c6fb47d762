//! `paisa replay` (SPEC §9): a JSON-lines scenario through the same stage code as production, with the
//! simulated statement provider, into the final-state document.

use crate::config::{Config, ConfigError};
use crate::engine::Engine;
use crate::input::{parse_line, Input, ParseError, Parsed};
use crate::time::Timestamp;
use crate::wallet_sim::WalletSim;

/// A scenario that cannot be replayed (exit 2, naming the line).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("line {line}: {error}")]
    Parse { line: usize, error: ParseError },
    #[error("line {line}: invalid config: {error}")]
    Config { line: usize, error: ConfigError },
    #[error("line {line}: `at` {at} is earlier than the line before ({previous})")]
    TimeWentBack { line: usize, at: Timestamp, previous: Timestamp },
}

impl ScenarioError {
    pub fn line(&self) -> usize {
        match self {
            ScenarioError::Parse { line, .. }
            | ScenarioError::Config { line, .. }
            | ScenarioError::TimeWentBack { line, .. } => *line,
        }
    }
}

/// A parsed scenario: its configuration and inputs.
pub struct Scenario {
    pub config: Config,
    pub inputs: Vec<Input>,
}

/// Parses a scenario; every structural problem names its 1-based line number.
pub fn parse_scenario(text: &str) -> Result<Scenario, ScenarioError> {
    let mut config = Config::default();
    let mut inputs = Vec::new();
    let mut previous_at: Option<Timestamp> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let parsed =
            parse_line(raw, || format!("line:{line}")).map_err(|error| ScenarioError::Parse { line, error })?;
        match parsed {
            Parsed::Config(overrides) => {
                if !inputs.is_empty() || line != first_content_line(text) {
                    return Err(ScenarioError::Parse { line, error: ParseError::ConfigNotFirst });
                }
                if let Some(at) = overrides.at.as_deref() {
                    if Timestamp::parse(at).is_none() {
                        return Err(ScenarioError::Parse { line, error: ParseError::BadTime(at.to_string()) });
                    }
                }
                config = Config::from_overrides(*overrides).map_err(|error| ScenarioError::Config { line, error })?;
            }
            Parsed::Input(input) => {
                if let Some(previous) = previous_at {
                    if input.at < previous {
                        return Err(ScenarioError::TimeWentBack { line, at: input.at, previous });
                    }
                }
                previous_at = Some(input.at);
                inputs.push(input);
            }
        }
    }
    Ok(Scenario { config, inputs })
}

fn first_content_line(text: &str) -> usize {
    text.lines().position(|line| !line.trim().is_empty()).map_or(1, |index| index + 1)
}

/// Runs a parsed scenario to its end: every timer due at or before the last `at` has fired.
pub fn run(scenario: Scenario) -> Engine {
    let mut engine = Engine::new(scenario.config, Some(WalletSim::default()));
    let last_at = scenario.inputs.last().map(|input| input.at);
    engine.apply_all(scenario.inputs);
    if let Some(last_at) = last_at {
        engine.advance_to(last_at);
    }
    engine
}

/// Inputs a streaming run applies between two hand-overs of its outputs.
const STREAM_SLICE_INPUTS: usize = 4096;

/// Runs a scenario as a service runs its inputs: the outputs are handed to `take` every
/// `STREAM_SLICE_INPUTS` inputs and at the end instead of piling up in the engine (the engine
/// benchmark and the profiling example). Never inlined: `deploy/instructions` counts the instructions
/// run inside it by its name, which link-time optimisation would otherwise fold into its caller.
#[inline(never)]
pub fn run_streaming(scenario: Scenario, mut take: impl FnMut(Vec<crate::output::Output>)) -> Engine {
    let mut engine = Engine::new(scenario.config, Some(WalletSim::default()));
    let last_at = scenario.inputs.last().map(|input| input.at);
    let mut inputs = scenario.inputs.into_iter();
    while inputs.len() > 0 {
        engine.apply_next(&mut inputs, STREAM_SLICE_INPUTS);
        take(engine.take_outputs());
    }
    if let Some(last_at) = last_at {
        engine.advance_to(last_at);
    }
    take(engine.take_outputs());
    engine
}

/// Replays scenario text into the SPEC §9 document (pretty JSON).
pub fn replay_to_json(text: &str) -> Result<String, ScenarioError> {
    let engine = run(parse_scenario(text)?);
    let document = engine.document();
    Ok(serde_json::to_string_pretty(&document).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}")))
}
