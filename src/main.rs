//! `fleetmend`: one binary, many verbs. This file is wiring; the logic lives in the crates.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use fleetmend_agent::config::{AgentConfig, ConfigError, ConfigProblems};
use fleetmend_agent::daemon;
use fleetmend_agent::gpu::parse_backend;
use fleetmend_proto::{Finding, Verdict};
use fleetmend_repairer::scheduler::slurm::{SelfDrain, SelfDrainLimits, drain_self};

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
    /// The repairer: node state, policy, repairs, alerts, the API (one per cluster).
    Repairer(RepairerArgs),
    /// List nodes and their states.
    Nodes(ClientArgs),
    /// Show one node: findings, history, workflows, recent events.
    Node {
        #[command(flatten)]
        client: ClientArgs,
        name: String,
        /// The evidence bundles gathered before its disruptive repairs instead (kernel log,
        /// findings, nvidia-smi -q, ...), newest first.
        #[arg(long)]
        evidence: bool,
    },
    /// The audit trail.
    Events {
        #[command(flatten)]
        client: ClientArgs,
        /// Only this node's events.
        #[arg(long)]
        node: Option<String>,
        /// Events after this id.
        #[arg(long, default_value_t = 0)]
        after: i64,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Drain a node (fleetmend may undrain it later).
    Drain(NodeArgs),
    /// Put a drained or quarantined node back (only one fleetmend drained).
    Undrain(NodeArgs),
    /// Start a repair of a node now.
    Repair {
        #[command(flatten)]
        node: NodeArgs,
        /// drain, reboot or replace.
        #[arg(long, default_value = "reboot")]
        action: String,
    },
    /// Approve the action waiting on a node (approve mode).
    Approve {
        #[command(flatten)]
        node: NodeArgs,
        /// Approve at most this action (default: whatever waits).
        #[arg(long)]
        action: Option<String>,
    },
    /// Submit a job to the repairer's embedded queue: one rank per node, resumed from its newest
    /// checkpoint when a rank fails or a node is drained.
    Submit(SubmitArgs),
    /// The embedded queue's jobs.
    Jobs {
        #[command(flatten)]
        client: ClientArgs,
        /// Show one job in full (JSON).
        job: Option<String>,
    },
    /// Cancel a job: SIGTERM, then SIGKILL, to its ranks.
    Cancel {
        #[command(flatten)]
        client: ClientArgs,
        /// The job's id.
        job: String,
    },
    /// Run a whole self-healing fleet on this machine: repairer, simulated nodes, a training job.
    Up(fleetmend_local::up::UpArgs),
    /// Write a fault into a node of the fleet `fleetmend up` runs.
    Inject(fleetmend_local::faults::InjectArgs),
    /// Simulate a fleet's failures and fleetmend's repairs on the real decision code, in virtual
    /// time: goodput (ETTR) at scale.
    Simulate(fleetmend_sim::cli::SimulateArgs),
    /// Per-node identity: issue each node a token of its own.
    #[command(subcommand)]
    Token(TokenVerb),
    /// Train the bundled model (one rank; ranks meet through RANK, WORLD_SIZE, MASTER_ADDR/PORT).
    Train(fleetmend_runtime::train::TrainArgs),
    /// One rank of the allreduce probe (the agent runs it for the repairer): measures the bundled
    /// all-reduce's bus bandwidth with the ranks met through RANK, WORLD_SIZE, MASTER_ADDR/PORT.
    Allreduce(fleetmend_runtime::probe::AllreduceArgs),
    /// Show the breaker, or close it.
    Breaker {
        #[command(flatten)]
        client: ClientArgs,
        /// Close the breaker: automatic action resumes.
        #[arg(long)]
        close: bool,
    },
}

#[derive(Debug, clap::Args)]
struct RepairerArgs {
    /// Config file (TOML).
    #[arg(long, short = 'c', env = "FLEETMEND_REPAIRER_CONFIG")]
    config: Option<PathBuf>,
    /// Validate FILE and exit: 0 valid, 2 with every problem listed.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// Listen address (overrides `listen`).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// SQLite store path (overrides `store`).
    #[arg(long)]
    store: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum TokenVerb {
    /// Write a new token for each node to DIR/NODE.token (mode 0600: copy it to the node as its
    /// agent's `[report] token_file`) and its SHA-256 to the repairer's `node_tokens_file`
    /// (HASHES, created if missing; read again by the repairer when it changes). A node issued
    /// again gets a new token, and its old one stops working.
    Issue {
        /// Where the token files go.
        #[arg(long)]
        dir: PathBuf,
        /// The repairer's `node_tokens_file`.
        #[arg(long)]
        hashes: PathBuf,
        /// The nodes, as they name themselves in reports.
        #[arg(required = true)]
        nodes: Vec<String>,
    },
}

#[derive(Debug, Clone, clap::Args)]
struct ClientArgs {
    /// The repairer's base URL.
    #[arg(long, env = "FLEETMEND_REPAIRER", default_value = "http://127.0.0.1:9830")]
    repairer: String,
    /// A file holding the bearer token (read when given; wins over --token): keeps the token out
    /// of the command line, where `ps` shows it to every user of the machine.
    #[arg(long, env = "FLEETMEND_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// The bearer token itself (prefer --token-file or FLEETMEND_TOKEN).
    #[arg(long, env = "FLEETMEND_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Who you are, for the audit trail.
    #[arg(long, env = "USER", default_value = "admin")]
    user: String,
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Debug, clap::Args)]
struct SubmitArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Ranks, one per node.
    #[arg(long)]
    nodes: u32,
    /// Where the job's checkpoints live, shared by every node (made absolute here).
    #[arg(long)]
    checkpoint_dir: PathBuf,
    /// Restarts allowed before the job fails.
    #[arg(long, default_value_t = 0)]
    max_restarts: u32,
    /// Higher runs first; FIFO within a priority.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// A name for people (default: the program's file name).
    #[arg(long)]
    name: Option<String>,
    /// Checkpoint interval told to the ranks: steps, or `auto` (Young/Daly from the measured
    /// checkpoint cost and the observed failure rate).
    #[arg(long)]
    checkpoint_every: Option<String>,
    /// Extra environment of every rank, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

impl SubmitArgs {
    /// The job the flags describe.
    fn spec(&self) -> Result<fleetmend_repairer::queue::JobSpec, String> {
        let checkpoint_dir = if self.checkpoint_dir.is_absolute() {
            self.checkpoint_dir.clone()
        } else {
            std::env::current_dir()
                .map_err(|e| format!("--checkpoint-dir: resolving a relative path: {e}"))?
                .join(&self.checkpoint_dir)
        };
        let checkpoint_every = self
            .checkpoint_every
            .as_deref()
            .map(|text| text.parse().map_err(|e| format!("--checkpoint-every: {e}")))
            .transpose()?;
        let mut env = std::collections::BTreeMap::new();
        for pair in &self.env {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("--env {pair:?}: expected KEY=VALUE"))?;
            env.insert(key.to_owned(), value.to_owned());
        }
        Ok(fleetmend_repairer::queue::JobSpec {
            name: self.name.clone(),
            argv: self.command.clone(),
            nodes: self.nodes,
            priority: self.priority,
            checkpoint_dir: checkpoint_dir.to_string_lossy().into_owned(),
            max_restarts: self.max_restarts,
            checkpoint_every,
            env,
        })
    }
}

#[derive(Debug, clap::Args)]
struct NodeArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The node.
    name: String,
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
    // `fleetmend up` on a terminal moves its own stderr into up.log once it starts: its log is
    // never coloured.
    let ansi = !matches!(cli.verb, Verb::Up(_)) && colour_on_stderr();
    init_logging(cli.log_format, ansi);
    match cli.verb {
        Verb::Agent(args) => agent(args),
        Verb::Repairer(args) => repairer(args),
        Verb::Train(args) => fleetmend_runtime::train::main(args),
        Verb::Allreduce(args) => fleetmend_runtime::probe::main(args),
        Verb::Up(args) => fleetmend_local::up::main(args),
        Verb::Inject(args) => fleetmend_local::faults::inject_main(args),
        Verb::Simulate(args) => fleetmend_sim::cli::run(args),
        Verb::Token(verb) => token(verb),
        verb => client(verb),
    }
}

fn token(verb: TokenVerb) -> ExitCode {
    let TokenVerb::Issue { dir, hashes, nodes } = verb;
    match fleetmend_repairer::identity::issue(&dir, &hashes, &nodes) {
        Ok(files) => {
            for (node, file) in nodes.iter().zip(&files) {
                println!("{node}\t{}", file.display());
            }
            eprintln!("{} token(s) issued; hashes in {}", files.len(), hashes.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("fleetmend token issue: {err}");
            ExitCode::from(EXIT_CANNOT_RUN)
        }
    }
}

fn multi_thread_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(
        |err| {
            eprintln!("starting the runtime: {err}");
            ExitCode::from(EXIT_CANNOT_RUN)
        },
    )
}

/// `--check-config FILE`: "FILE: valid" and 0, or every problem and [`EXIT_CANNOT_RUN`].
fn check_config<T, E: std::fmt::Display>(
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

fn repairer(args: RepairerArgs) -> ExitCode {
    use fleetmend_repairer::config::RepairerConfig;
    if let Some(path) = &args.check_config {
        return check_config(path, RepairerConfig::load);
    }
    let (text, source) = match &args.config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => (text, path.clone()),
            Err(err) => {
                eprintln!("reading config {}: {err}", path.display());
                return ExitCode::from(EXIT_CANNOT_RUN);
            }
        },
        None => (String::new(), PathBuf::from("<defaults and flags>")),
    };
    let mut config = match RepairerConfig::parse(&text) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("parsing config {}: {message}", source.display());
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(store) = &args.store {
        config.store = store.clone();
    }
    let config = match config.validated(&source) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let runtime = match multi_thread_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        let repairer = fleetmend_repairer::service::start(config, shutdown_signal()).await?;
        repairer.wait().await
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fleetmend repairer: {err}");
            ExitCode::from(EXIT_CANNOT_RUN)
        }
    }
}

async fn shutdown_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

fn parse_action(text: &str) -> Result<fleetmend_repairer::model::RuleAction, String> {
    use fleetmend_repairer::model::RuleAction;
    match text {
        "drain" => Ok(RuleAction::Drain),
        "reboot" => Ok(RuleAction::Reboot),
        "replace" => Ok(RuleAction::Replace),
        other => Err(format!("unknown action {other:?}: drain, reboot or replace")),
    }
}

/// The client verbs: one request to the repairer's admin API, printed as a table or JSON.
fn client(verb: Verb) -> ExitCode {
    use fleetmend_repairer::client::{Client, Format, Request};
    let args = match &verb {
        Verb::Nodes(client)
        | Verb::Node { client, .. }
        | Verb::Events { client, .. }
        | Verb::Jobs { client, .. }
        | Verb::Cancel { client, .. }
        | Verb::Breaker { client, .. } => client.clone(),
        Verb::Submit(submit) => submit.client.clone(),
        Verb::Drain(node)
        | Verb::Undrain(node)
        | Verb::Repair { node, .. }
        | Verb::Approve { node, .. } => node.client.clone(),
        Verb::Agent(_)
        | Verb::Repairer(_)
        | Verb::Train(_)
        | Verb::Allreduce(_)
        | Verb::Up(_)
        | Verb::Inject(_)
        | Verb::Simulate(_)
        | Verb::Token(_) => {
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("starting the runtime: {err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let token = match &args.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) if !text.trim().is_empty() => Some(text.trim().to_owned()),
            Ok(_) => {
                eprintln!("fleetmend: the token file {} is empty", path.display());
                return ExitCode::from(EXIT_CANNOT_RUN);
            }
            Err(err) => {
                eprintln!("fleetmend: reading the token file {}: {err}", path.display());
                return ExitCode::from(EXIT_CANNOT_RUN);
            }
        },
        None => args.token.clone(),
    };
    let result: Result<String, String> = runtime.block_on(async {
        let client =
            Client::new(&args.repairer, token, &args.user, std::time::Duration::from_secs(30))
                .map_err(|e| e.to_string())?;
        let format = match args.output {
            Output::Table => Format::Table,
            Output::Json => Format::Json,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let request = match verb {
            Verb::Nodes(_) => Request::Nodes,
            Verb::Node { name, evidence: true, .. } => Request::Evidence(name),
            Verb::Node { name, .. } => Request::Node(name),
            Verb::Events { node, after, limit, .. } => Request::Events { node, after, limit },
            Verb::Drain(node) => Request::Drain(node.name),
            Verb::Undrain(node) => Request::Undrain(node.name),
            Verb::Repair { node, action } => {
                Request::Repair { node: node.name, action: parse_action(&action)? }
            }
            Verb::Approve { node, action } => Request::Approve {
                node: node.name,
                action: action.as_deref().map(parse_action).transpose()?,
            },
            Verb::Breaker { close, .. } => Request::Breaker { close },
            Verb::Submit(submit) => Request::Submit(submit.spec()?),
            Verb::Jobs { job: Some(id), .. } => Request::Job(id),
            Verb::Jobs { job: None, .. } => Request::Jobs,
            Verb::Cancel { job, .. } => Request::Cancel(job),
            Verb::Agent(_)
            | Verb::Repairer(_)
            | Verb::Train(_)
            | Verb::Allreduce(_)
            | Verb::Up(_)
            | Verb::Inject(_)
            | Verb::Simulate(_)
            | Verb::Token(_) => {
                return Ok(String::new());
            }
        };
        client.answer(request, format, now).await.map_err(|e| e.to_string())
    });
    match result {
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("fleetmend: {err}");
            ExitCode::FAILURE
        }
    }
}

fn agent(args: AgentArgs) -> ExitCode {
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
        SelfDrain::Failed { .. } | SelfDrain::TimedOut { .. } => {
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

/// Colour codes only for a person at a terminal: a log file, a pipe or the journal gets plain
/// text, and `NO_COLOR` (https://no-color.org) turns them off everywhere.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn init_logging(format: LogFormat, ansi: bool) {
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
