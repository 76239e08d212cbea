//! `fleetmend up`.

use std::process::ExitCode;

/// The flags of `fleetmend up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Nodes that run the job.
    #[arg(long, default_value_t = 4)]
    pub nodes: u32,
}

/// Runs `fleetmend up` until Ctrl-C (or the scenario's end).
pub fn main(args: UpArgs) -> ExitCode {
    eprintln!("fleetmend up: not built yet ({} nodes)", args.nodes);
    ExitCode::from(2)
}
