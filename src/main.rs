//! `fleetmend`: one binary, many verbs. This file is wiring; the logic lives in the crates.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use fleetmend_agent::config::{AgentConfig, ConfigError, ConfigProblems};
use fleetmend_agent::daemon;
use fleetmend_agent::gpu::parse_backend;

#[derive(Debug, Parser)]
#[command(
    name = "fleetmend",
    version,
    about = "Keeps long GPU training runs alive through hardware faults"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// The node agent: runs checks, serves /metrics, reports to the repairer.
    Agent(AgentArgs),
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// Config file (TOML). Without one the built-in defaults apply.
    #[arg(long, short = 'c', env = "FLEETMEND_AGENT_CONFIG")]
    config: Option<PathBuf>,
    /// Validate FILE and exit: 0 valid, 2 with every problem listed.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// Run every check once, print the findings and exit: 0 healthy, 1 unhealthy, 2 could not run.
    #[arg(long)]
    once: bool,
    /// Output of --once.
    #[arg(long, value_enum, default_value_t = Output::Table, requires = "once")]
    output: Output,
    /// Node name (overrides `node`).
    #[arg(long)]
    node: Option<String>,
    /// Listen address for /metrics, /healthz and /v1/health (overrides `listen`).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Repairer base URL to report to (overrides `report.repairer`).
    #[arg(long, env = "FLEETMEND_REPAIRER")]
    repairer: Option<String>,
    /// sysfs mount point (overrides `paths.sysfs`).
    #[arg(long = "path.sysfs", value_name = "PATH")]
    path_sysfs: Option<PathBuf>,
    /// procfs mount point (overrides `paths.procfs`).
    #[arg(long = "path.procfs", value_name = "PATH")]
    path_procfs: Option<PathBuf>,
    /// Root filesystem that configured mounts are read under (overrides `paths.rootfs`).
    #[arg(long = "path.rootfs", value_name = "PATH")]
    path_rootfs: Option<PathBuf>,
    /// Kernel log to follow: /dev/kmsg or a plain file (overrides `paths.kmsg`).
    #[arg(long, value_name = "PATH")]
    kmsg: Option<PathBuf>,
    /// GPU backend: nvml, nvml:LIBRARY, fixture:FILE or none (overrides `checks.gpu.backend`).
    #[arg(long, value_name = "BACKEND")]
    gpu: Option<String>,
    /// Print what the GPU backend reads now as fixture JSON and exit (to keep a real GPU's
    /// readings as a test fixture).
    #[arg(long, conflicts_with_all = ["once", "check_config"])]
    dump_gpu: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

/// Exit code for "could not run": bad config, cannot listen.
const EXIT_CANNOT_RUN: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.verb {
        Verb::Agent(args) => agent(args),
    }
}

fn agent(args: AgentArgs) -> ExitCode {
    if let Some(path) = &args.check_config {
        return match AgentConfig::load(path) {
            Ok(_) => {
                println!("{}: valid", path.display());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("{err}");
                ExitCode::from(EXIT_CANNOT_RUN)
            }
        };
    }
    let config = match agent_config(&args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    if args.dump_gpu {
        return match fleetmend_agent::gpu::dump_snapshot(&config.checks.gpu.backend) {
            Ok(json) => {
                print!("{json}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("reading the GPUs: {err}");
                ExitCode::from(EXIT_CANNOT_RUN)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Each check holds at most one worker (a stuck one is not restarted), so this bounds threads.
        .max_blocking_threads(16)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("starting the runtime: {err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    if args.once {
        let view = runtime.block_on(daemon::once(&config));
        match args.output {
            Output::Table => print!("{}", daemon::render_table(&view)),
            Output::Json => match serde_json::to_string_pretty(&view) {
                Ok(json) => println!("{json}"),
                Err(err) => {
                    eprintln!("encoding the findings: {err}");
                    return ExitCode::from(EXIT_CANNOT_RUN);
                }
            },
        }
        // Leave stuck check workers behind instead of waiting for them at shutdown.
        runtime.shutdown_background();
        return ExitCode::from(daemon::exit_code(view.verdict) as u8);
    }
    let result = runtime.block_on(async {
        let agent = daemon::start(config).await?;
        agent.wait().await
    });
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fleetmend agent: {err}");
            ExitCode::from(EXIT_CANNOT_RUN)
        }
    }
}

/// The config file (or defaults) with the flags applied, validated.
fn agent_config(args: &AgentArgs) -> Result<AgentConfig, ConfigError> {
    let (mut config, source) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read { path: path.clone(), source })?;
            let config = AgentConfig::parse(&text)
                .map_err(|message| ConfigError::Parse { path: path.clone(), message })?;
            (config, path.clone())
        }
        None => (AgentConfig::default(), PathBuf::from("<defaults and flags>")),
    };
    if let Some(node) = &args.node {
        config.node = Some(node.clone());
    }
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(repairer) = &args.repairer {
        config.report.repairer = Some(repairer.clone());
    }
    if let Some(path) = &args.path_sysfs {
        config.paths.sysfs = path.clone();
    }
    if let Some(path) = &args.path_procfs {
        config.paths.procfs = path.clone();
    }
    if let Some(path) = &args.path_rootfs {
        config.paths.rootfs = path.clone();
    }
    if let Some(path) = &args.kmsg {
        config.paths.kmsg = path.clone();
    }
    if let Some(gpu) = &args.gpu {
        config.checks.gpu.backend = parse_backend(gpu).map_err(|message| {
            let mut problems = ConfigProblems::default();
            problems.push("--gpu", message);
            ConfigError::Invalid { path: source.clone(), problems }
        })?;
    }
    config.validated(&source)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLEETMEND_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
