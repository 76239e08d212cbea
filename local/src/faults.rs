//! Faults written into a node's host tree, and `fleetmend inject`.

use std::process::ExitCode;

/// The flags of `fleetmend inject`.
#[derive(Debug, Clone, clap::Args)]
pub struct InjectArgs {
    /// The node to break.
    pub node: String,
    /// The fault.
    pub fault: String,
}

/// Runs `fleetmend inject`.
pub fn inject_main(args: InjectArgs) -> ExitCode {
    eprintln!("fleetmend inject {} {}: not built yet", args.node, args.fault);
    ExitCode::from(2)
}
