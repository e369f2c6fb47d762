//! The `paisa` binary. `paisa replay FILE` prints the SPEC §9 document of a scenario.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "paisa", version, about = "Reconciles e-wallet statements against merchant payment orders")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Replays a JSON-lines scenario (SPEC §9) and prints the final state as JSON.
    Replay {
        /// The scenario file.
        file: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Commands::Replay { file } => match replay(&file) {
            Ok(code) => code,
            Err(error) => {
                eprintln!("paisa replay: {error:#}");
                ExitCode::from(1)
            }
        },
    }
}

fn replay(file: &std::path::Path) -> anyhow::Result<ExitCode> {
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
