//! `fleetmend-agent`: the node agent alone, the binary a cluster installs on every node. It is
//! `fleetmend agent` without the trainer, the repairer's store and the simulator linked in, so
//! its resident memory stays small beside the training job.

use std::process::ExitCode;

use clap::Parser;
use fleetmend::{AgentArgs, LogFormat, agent, colour_on_stderr, init_logging};

#[derive(Debug, Parser)]
#[command(
    name = "fleetmend-agent",
    version,
    about = "The fleetmend node agent: runs checks, serves /metrics, reports to the repairer"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    agent: AgentArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, colour_on_stderr());
    agent(cli.agent)
}
