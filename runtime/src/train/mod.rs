//! `fleetmend train`: the bundled data-parallel trainer (a small GPT-style byte-level language
//! model on candle), speaking the checkpoint protocol.

use std::process::ExitCode;

/// The flags of `fleetmend train`.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// Steps to train in all.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
}

/// Runs the trainer; the exit code follows the checkpoint protocol (0 = done or stopped cleanly).
pub fn main(args: TrainArgs) -> ExitCode {
    eprintln!("fleetmend train: not built yet ({} steps asked)", args.steps);
    ExitCode::from(2)
}
