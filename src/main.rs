//! `fleetmend`: one binary, many verbs. This file is wiring; the logic lives in the crates.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fleetmend::{
    AgentArgs, EXIT_CANNOT_RUN, LogFormat, Output, agent, check_config, colour_on_stderr,
    init_logging,
};

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
    /// Export the failure history as JSON: every fault that reached a decision in a window, with
    /// its time, node, finding, the decisions and the repairs that followed (`fleetmend simulate
    /// --replay FILE` replays it through a policy).
    ExportFaults {
        #[command(flatten)]
        client: ClientArgs,
        /// The window's start: a duration ago (30d, 12h) or an RFC 3339 time.
        #[arg(long, default_value = "30d", value_name = "AGO|TIME")]
        since: String,
        /// The window's end: a duration ago or an RFC 3339 time (default: now).
        #[arg(long, value_name = "AGO|TIME")]
        until: Option<String>,
        /// At most this many faults (up to 100000): a window with more is refused, not cut.
        #[arg(long, default_value_t = 10_000)]
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
    /// The `command` provider of the repairers `fleetmend up --repairers N` runs: asks the
    /// running `fleetmend up` to reboot or replace one of its nodes, or for its power state.
    #[command(hide = true)]
    UpProvider(fleetmend_local::up::control::ProviderArgs),
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
    /// The store (overrides `store`): a SQLite file path, or a PostgreSQL URL
    /// (`postgres://USER@HOST:PORT/DB`).
    #[arg(long)]
    store: Option<fleetmend_repairer::store::StoreLocation>,
    /// Serve plain HTTP (and allow no tokens) on a non-loopback address: a lab, never
    /// production (sets `insecure`).
    #[arg(long)]
    insecure: bool,
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
    /// Write a new token for a person or tool to DIR/NAME.token (mode 0600) and print the
    /// `[[credentials]]` entry (its SHA-256 and role) to add to the repairer's config.
    New {
        /// Who it is for: the audit trail names every action taken with it.
        name: String,
        /// What it may do: read (nodes, events, jobs, service discovery), operator (and drain,
        /// undrain, repair, approve, the breaker, jobs), admin (everything).
        #[arg(long, value_parser = ["read", "operator", "admin"])]
        role: String,
        /// Where the token file goes.
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(Debug, Clone, clap::Args)]
struct ClientArgs {
    /// The repairer's base URL, or several comma-separated: a request goes to the first that
    /// answers, and a write follows a standby to the leader when the leader is among them.
    #[arg(long, env = "FLEETMEND_REPAIRER", default_value = "http://127.0.0.1:9830")]
    repairer: String,
    /// A file holding the bearer token (read when given; wins over --token): keeps the token out
    /// of the command line, where `ps` shows it to every user of the machine.
    #[arg(long, env = "FLEETMEND_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// The bearer token itself (prefer --token-file or FLEETMEND_TOKEN).
    #[arg(long, env = "FLEETMEND_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM file of the CA(s) that signed an `https://` repairer's certificate (else the system's
    /// roots).
    #[arg(long, env = "FLEETMEND_CA_FILE")]
    ca_file: Option<PathBuf>,
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
        Verb::UpProvider(args) => fleetmend_local::up::control::provider_main(args),
        Verb::Inject(args) => fleetmend_local::faults::inject_main(args),
        Verb::Simulate(args) => fleetmend_sim::cli::run(args),
        Verb::Token(verb) => token(verb),
        verb => client(verb),
    }
}

fn token(verb: TokenVerb) -> ExitCode {
    let (dir, hashes, nodes) = match verb {
        TokenVerb::Issue { dir, hashes, nodes } => (dir, hashes, nodes),
        TokenVerb::New { name, role, dir } => {
            return match fleetmend_repairer::identity::issue_credential(&dir, &name) {
                Ok((file, sha256)) => {
                    println!(
                        "[[credentials]]\nname = {name:?}\nrole = {role:?}\nsha256 = \"{sha256}\""
                    );
                    eprintln!(
                        "token written to {}; add the entry above to the repairer's config",
                        file.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("fleetmend token new: {err}");
                    ExitCode::from(EXIT_CANNOT_RUN)
                }
            };
        }
    };
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
    config.insecure |= args.insecure;
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
            ExitCode::from(err.exit_status())
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
    use fleetmend_repairer::client::{Client, Format, Request, parse_moment};
    let args = match &verb {
        Verb::Nodes(client)
        | Verb::Node { client, .. }
        | Verb::Events { client, .. }
        | Verb::ExportFaults { client, .. }
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
        | Verb::UpProvider(_)
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
    let ca = args.ca_file.as_deref();
    let result: Result<String, String> = runtime.block_on(async {
        let client = Client::new(&args.repairer, token, &args.user, Duration::from_secs(30), ca)
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
            Verb::ExportFaults { since, until, limit, .. } => {
                let since_ms = parse_moment(&since, now)?;
                let until_ms =
                    until.as_deref().map_or(Ok(now), |until| parse_moment(until, now))?;
                if since_ms >= until_ms {
                    return Err(format!("--since {since} is not before --until: an empty window"));
                }
                Request::ExportFaults { since_ms, until_ms, limit }
            }
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
            | Verb::UpProvider(_)
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
