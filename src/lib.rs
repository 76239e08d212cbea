//! What the `fleetmend` binary and the lean `fleetmend-agent` share: the agent's command line and
//! the log setup. `fleetmend-agent` links only the agent's side, so each node runs a binary with
//! no trainer, store or simulator in it (BENCHMARKS.md: the agent's memory).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::ValueEnum;
use fleetmend_agent::config::{AgentConfig, ConfigError, ConfigProblems, RepairerUrls};
use fleetmend_agent::daemon;
use fleetmend_agent::gpu::parse_backend;
use fleetmend_agent::slurm_drain::{SelfDrain, SelfDrainLimits, drain_self};
use fleetmend_proto::{Finding, Verdict};

/// Exit code for "could not run": bad config, cannot listen.
pub const EXIT_CANNOT_RUN: u8 = 2;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How a command prints what it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
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
    /// With --once, as Slurm's HealthCheckProgram or Prolog: when unhealthy, drain this node in
    /// Slurm with the reason "fleetmend: <failing findings>" (a node already drained keeps its
    /// reason). Exit 0 healthy, 1 unhealthy and drained, 2 could not run the checks, 3 unhealthy
    /// but the drain failed. Slurm's commands come from PATH and use SLURM_CONF.
    #[arg(long, requires = "once")]
    slurm_drain: bool,
    /// The Slurm node to drain (default: SLURMD_NODENAME, which slurmd sets for its health check,
    /// prolog and epilog; else the agent's node name).
    // SLURMD_NODENAME is read by hand: as a clap `env` it would count as this flag given, and a
    // plain `--once` in a Prolog (or the daemon) would fail for want of --slurm-drain.
    #[arg(long, value_name = "NAME", requires = "slurm_drain")]
    slurm_node: Option<String>,
    /// Node name (overrides `node`).
    #[arg(long)]
    node: Option<String>,
    /// Listen address for /metrics, /healthz and /v1/health (overrides `listen`).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Repairer base URL to report to, or several comma-separated (overrides `report.repairer`).
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

/// The checks run on blocking worker threads, and glibc's malloc gives each thread that allocates
/// an arena of its own, up to 8 per core: on a GPU node's 100+ cores that is one per check, each
/// keeping the pages its check freed. The agent allocates little and seldom, so one arena holds
/// its heap without contention worth measuring (BENCHMARKS.md: 0.5 MiB less RSS on 2 cores).
/// `MALLOC_ARENA_MAX` in the environment still decides where an operator set it.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes a tunable of glibc's allocator, which it reads under its
        // own lock; the value is one glibc documents (M_ARENA_MAX, at least 1).
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// `fleetmend agent` and `fleetmend-agent`: the daemon, `--once`, `--check-config` or `--dump-gpu`.
pub fn agent(args: AgentArgs) -> ExitCode {
    if let Some(path) = &args.check_config {
        return check_config(path, AgentConfig::load);
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
    one_malloc_arena();
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
        let code = if args.slurm_drain && view.verdict == Verdict::Unhealthy {
            let node = args
                .slurm_node
                .clone()
                .or_else(|| std::env::var("SLURMD_NODENAME").ok().filter(|n| !n.is_empty()))
                .unwrap_or_else(|| view.node.clone());
            runtime.block_on(slurm_drain_self(&node, &view.findings))
        } else {
            ExitCode::from(daemon::exit_code(view.verdict) as u8)
        };
        // Leave stuck check workers behind instead of waiting for them at shutdown.
        runtime.shutdown_background();
        return code;
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

/// `--once --slurm-drain`'s exit code when the node is unhealthy but could not be drained: a
/// Prolog that passes it on makes Slurm drain the node itself and requeue the job.
const EXIT_DRAIN_FAILED: u8 = 3;

/// Drains `node` in Slurm because of the failing `findings` and says so on stderr.
async fn slurm_drain_self(node: &str, findings: &[Finding]) -> ExitCode {
    let outcome = drain_self(node, findings, SelfDrainLimits::default()).await;
    match &outcome {
        SelfDrain::Drained { .. } | SelfDrain::AlreadyDrained { .. } => eprintln!("{outcome}"),
        SelfDrain::NotANodeName { .. } => {
            eprintln!("fleetmend agent: --slurm-node/SLURMD_NODENAME {outcome}")
        }
        SelfDrain::UnknownNode { .. } | SelfDrain::Failed { .. } | SelfDrain::TimedOut { .. } => {
            eprintln!("fleetmend agent: {outcome}")
        }
    }
    if outcome.is_drained() {
        ExitCode::from(daemon::exit_code(Verdict::Unhealthy) as u8)
    } else {
        ExitCode::from(EXIT_DRAIN_FAILED)
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
        config.report.repairer = Some(RepairerUrls::from_list(repairer));
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

/// `--check-config FILE`: "FILE: valid" and 0, or every problem and [`EXIT_CANNOT_RUN`].
pub fn check_config<T, E: std::fmt::Display>(
    path: &Path,
    load: impl FnOnce(&Path) -> Result<T, E>,
) -> ExitCode {
    match load(path) {
        Ok(_) => {
            println!("{}: valid", path.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::from(EXIT_CANNOT_RUN)
        }
    }
}

/// Colour codes only for a person at a terminal: a log file, a pipe or the journal gets plain
/// text, and `NO_COLOR` (https://no-color.org) turns them off everywhere.
pub fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Logs on stderr in `format`, filtered by `FLEETMEND_LOG` (default `info`).
pub fn init_logging(format: LogFormat, ansi: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLEETMEND_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
