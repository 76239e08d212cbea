//! `fleetmend up`: a whole self-healing fleet on this machine — the repairer with its embedded
//! queue (in this process), one real agent process per simulated node on its own host tree, and a
//! training job over the nodes — shown live until the job ends or Ctrl-C stops everything.
//! `--scheduler slurm` runs the same fleet on a Slurm cluster (see [`slurm`]); `--repairers N`
//! runs N repairer processes on a PostgreSQL of their own, one leading (see [`ha`]).

pub mod control;
pub mod fleet;
pub mod ha;
pub mod ha_view;
pub mod slurm;
pub mod supervisor;
pub mod trainer;
pub mod view;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use fleetmend_repairer::queue::JobState;
use tokio::signal::unix::{SignalKind, signal};

pub use self::fleet::{
    FinalLine, Fleet, FleetConfig, FleetError, FleetScheduler, NodeView, repairer_config,
};
pub use self::supervisor::{Role, Supervisor};
pub use self::trainer::TrainModel;
use self::view::View;
use crate::scenario::{self, Scenario};

/// The flags of `fleetmend up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Nodes that run the job (default: 4; on Slurm 3, a dev cluster's four less the spare).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Standby nodes that replace broken ones.
    #[arg(long, default_value_t = 1)]
    pub spares: u32,
    /// Where the fleet keeps its state (node trees, the repairer's store, tokens, checkpoints).
    /// Default: $FLEETMEND_UP_DIR, else ./fleetmend-up.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Training steps of the job.
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// The job's checkpoint interval: N steps or `auto`.
    #[arg(long, default_value = "10", value_name = "N|auto")]
    pub checkpoint_every: String,
    /// The trainer's seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Restarts the job may use before it fails.
    #[arg(long, default_value_t = 10)]
    pub max_restarts: u32,
    /// The repairer's listen address (default: a free port on 127.0.0.1).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Start afresh: remove what an earlier run left in the state directory.
    #[arg(long)]
    pub fresh: bool,
    /// The agents' report interval.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    pub report_interval: Duration,
    /// How long a simulated reboot keeps a node down.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub boot_delay: Duration,
    /// How long the job's collectives wait for a silent rank before failing (the trainer's
    /// `--collective-timeout`). `600s`, PyTorch's NCCL default, shows the queue's hang
    /// detection apart from the collective's own timeout.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub collective_timeout: Duration,
    /// The model the job trains: the trainer's default, or a small one (about a tenth of the
    /// CPU per step; with --pace, for a fleet that shares its machine).
    #[arg(long, value_enum, default_value_t = TrainModel::Default)]
    pub model: TrainModel,
    /// Each training step takes at least this long (the trainer's `--pace`), standing in for a
    /// GPU's step time; 0s: as fast as the CPU computes it.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub pace: Duration,
    /// Run the fleet without a job (until Ctrl-C).
    #[arg(long, conflicts_with = "scenario")]
    pub no_job: bool,
    /// Run a scripted chaos scenario (`builtin`, or a TOML file) and end with its summary: each
    /// fault's time to detect, to drain and to the job's first step after resume, steps lost, and
    /// whether the final weights equal an uninterrupted run's. Exit 0 when every expectation held.
    #[arg(long, value_name = "builtin|FILE")]
    pub scenario: Option<String>,
    /// With --scenario: print the summary as JSON.
    #[arg(long, requires = "scenario")]
    pub json: bool,
    /// Who runs the job: the repairer's embedded queue, or Slurm (the repairer drains, requeues
    /// and follows jobs through Slurm's commands; the job is an sbatch job of
    /// deploy/slurm/resumable.sbatch).
    #[arg(long, value_enum, default_value_t = SchedulerChoice::Embedded)]
    pub scheduler: SchedulerChoice,
    /// With --scheduler slurm: the slurm.conf of a cluster whose nodes the simulated ones stand
    /// for, in sinfo's order. Without it a dev cluster (munged, slurmctld and four slurmd on this
    /// host; needs root and Debian's slurm-wlm munge) is started under the state directory and
    /// stopped with the fleet.
    #[arg(long, value_name = "FILE")]
    pub slurm_conf: Option<PathBuf>,
    /// Repairers: 1 runs in this process on SQLite; N ≥ 2 run as processes of their own sharing
    /// a PostgreSQL that `fleetmend up` starts under the state directory (needs Debian's
    /// postgresql), one leading; kill the leader to watch another take over.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repairers: u32,
    /// The job's own command instead of the bundled trainer, after `--` (`fleetmend up -- python3
    /// train.py --steps 200`; a PyTorch script on the `fleetmend` Python package, python/). Each
    /// rank runs it with the checkpoint protocol's environment (docs/checkpoint-protocol.md);
    /// --steps, --seed, --model and --pace are then the command's own. For a scenario's
    /// comparison with an uninterrupted run, every rank ends by printing a JSON line
    /// `{"event": "done", "step": N, "loss": L, "weights_sha256": "..."}`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `--scheduler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulerChoice {
    Embedded,
    Slurm,
}

/// Nodes that run the job on a Slurm dev cluster: its four less the spare.
const SLURM_DEFAULT_NODES: u32 = 3;
/// Nodes that run the job on the embedded queue.
const DEFAULT_NODES: u32 = 4;

/// Exit status when the job failed or was cancelled.
const EXIT_JOB_FAILED: u8 = 1;
/// Exit status when the fleet could not start.
const EXIT_CANNOT_RUN: u8 = 2;
/// Exit status after SIGINT (128 + 2) and SIGTERM (128 + 15), as a shell reports them.
const EXIT_SIGINT: u8 = 130;
const EXIT_SIGTERM: u8 = 143;

/// The view's pace on a terminal, and of the plain log.
const TTY_REFRESH: Duration = Duration::from_secs(1);
const LOG_REFRESH: Duration = Duration::from_millis(200);

/// Runs `fleetmend up` until the job ends or Ctrl-C.
pub fn main(args: UpArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fleetmend up: starting the async runtime: {err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    runtime.block_on(run(args))
}

/// Sends the process's stderr (the repairer's logs) to a file while the screen is redrawn, and
/// back when dropped.
struct StderrToFile {
    saved: Option<OwnedFd>,
}

impl StderrToFile {
    fn to(path: &std::path::Path) -> StderrToFile {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path);
        let saved = file.ok().and_then(|file| {
            let saved = nix::unistd::dup(std::io::stderr()).ok()?;
            nix::unistd::dup2_stderr(&file).ok()?;
            Some(saved)
        });
        StderrToFile { saved }
    }

    /// Writes `text` to the terminal's stderr (the original one).
    fn say(&self, text: &str) {
        match &self.saved {
            Some(fd) => {
                if let Ok(fd) = fd.try_clone() {
                    let mut file = std::fs::File::from(fd);
                    let _ = writeln!(file, "{text}");
                }
            }
            None => eprintln!("{text}"),
        }
    }
}

impl Drop for StderrToFile {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            let _ = nix::unistd::dup2_stderr(&saved);
        }
    }
}

/// The fleet's settings from the command line, or why they do not go together.
fn fleet_config(args: &UpArgs, state_dir: PathBuf, exe: PathBuf) -> Result<FleetConfig, String> {
    let scheduler = match (args.scheduler, &args.slurm_conf) {
        (SchedulerChoice::Embedded, None) => FleetScheduler::Embedded,
        (SchedulerChoice::Embedded, Some(_)) => {
            return Err("--slurm-conf needs --scheduler slurm".to_owned());
        }
        (SchedulerChoice::Slurm, conf) => FleetScheduler::Slurm { conf: conf.clone() },
    };
    if args.scheduler == SchedulerChoice::Slurm && args.scenario.is_some() {
        return Err("--scenario measures the embedded queue's job (its attempts and steps); \
             it does not run with --scheduler slurm"
            .to_owned());
    }
    let nodes = args.nodes.unwrap_or(match args.scheduler {
        SchedulerChoice::Embedded => DEFAULT_NODES,
        SchedulerChoice::Slurm => SLURM_DEFAULT_NODES,
    });
    Ok(FleetConfig {
        nodes,
        scheduler,
        spares: args.spares,
        job: !args.no_job,
        steps: args.steps,
        checkpoint_every: args.checkpoint_every.clone(),
        seed: args.seed,
        max_restarts: args.max_restarts,
        listen: args.listen,
        fresh: args.fresh,
        report_interval: args.report_interval,
        boot_delay: args.boot_delay,
        collective_timeout: args.collective_timeout,
        model: args.model,
        pace: args.pace,
        command: args.command.clone(),
        ..FleetConfig::new(state_dir, exe)
    })
}

/// How the main loop ended.
enum End {
    Job(JobState),
    Signal(u8, &'static str),
}

async fn run(args: UpArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("fleetmend up: finding the fleetmend executable: {err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let state_dir = FleetConfig::default_state_dir(args.state_dir.clone());
    let mut config = match fleet_config(&args, state_dir.clone(), exe) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("fleetmend up: {message}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let scenario = match args.scenario.as_deref().map(Scenario::load).transpose() {
        Ok(scenario) => scenario,
        Err(err) => {
            eprintln!("fleetmend up: {err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    if let Some(scenario) = &scenario {
        scenario.configure(&mut config);
    }
    if args.repairers != 1 {
        return run_ha(config, args.repairers, &args).await;
    }
    // Registered before anything starts: a Ctrl-C during the start is seen once it is done, and
    // stops what was started.
    let (mut sigint, mut sigterm) =
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
            (Ok(int), Ok(term)) => (int, term),
            (Err(err), _) | (_, Err(err)) => {
                eprintln!("fleetmend up: listening for signals: {err}");
                return ExitCode::from(EXIT_CANNOT_RUN);
            }
        };
    // A scenario prints its own progress lines: the plain log, not the redrawn screen.
    let tty = std::io::stdout().is_terminal() && scenario.is_none();
    let stderr = if tty {
        if let Err(err) = std::fs::create_dir_all(&state_dir) {
            eprintln!("fleetmend up: creating {}: {err}", state_dir.display());
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
        let log = state_dir.join("up.log");
        println!("fleetmend up: starting (logs in {})", log.display());
        Some(StderrToFile::to(&log))
    } else {
        None
    };
    let say = |text: &str| match &stderr {
        Some(stderr) => stderr.say(text),
        None => eprintln!("{text}"),
    };

    let fleet = match Fleet::start(config).await {
        Ok(fleet) => fleet,
        Err(err) => {
            say(&format!("fleetmend up: {err}"));
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let mut stdout = std::io::stdout();
    let banner = View::banner(&fleet);
    if tty {
        // The screen starts clean, below nothing; the banner's URLs are on it too.
        let _ = write!(stdout, "\x1b[2J\x1b[H\x1b[?25l");
    } else {
        let _ = write!(stdout, "{banner}");
    }
    let _ = stdout.flush();

    if let Some(scenario) = &scenario {
        return run_scenario(fleet, scenario, args.json, &mut sigint, &mut sigterm).await;
    }
    let mut view = View::new(tty, fleet.started_ms());
    let refresh = if tty { TTY_REFRESH } else { LOG_REFRESH };
    let end = loop {
        if let Err(err) = view.update(&fleet, &mut stdout) {
            tracing::warn!(error = %err, "writing the view failed");
        }
        if let Some(job) = fleet.job()
            && job.job.state.is_final()
        {
            break End::Job(job.job.state);
        }
        if let Some(job) = fleet.slurm_job()
            && job.is_final()
        {
            break End::Job(match job.state.as_str() {
                "COMPLETED" => JobState::Completed,
                "CANCELLED" => JobState::Cancelled,
                _ => JobState::Failed,
            });
        }
        if fleet.job_id().is_none() && fleet.config().job {
            break End::Job(JobState::Failed);
        }
        tokio::select! {
            _ = sigint.recv() => break End::Signal(EXIT_SIGINT, "SIGINT"),
            _ = sigterm.recv() => break End::Signal(EXIT_SIGTERM, "SIGTERM"),
            _ = tokio::time::sleep(refresh) => {}
        }
    };
    let _ = view.update(&fleet, &mut stdout);
    if tty {
        let _ = writeln!(stdout, "\x1b[?25h");
    }
    let final_line = fleet.final_line();
    let job = fleet.job();
    let job_id = fleet.job_id().map(str::to_owned).unwrap_or_default();
    let slurm_job = fleet.slurm_job();
    match &end {
        End::Signal(_, name) => {
            let _ = writeln!(
                stdout,
                "fleetmend up: {name}: stopping the job, the agents and the repairer"
            );
        }
        End::Job(_) => {
            let _ = writeln!(
                stdout,
                "fleetmend up: the job ended: stopping the agents and the repairer"
            );
        }
    }
    let _ = stdout.flush();
    fleet.shutdown().await;
    let _ = writeln!(
        stdout,
        "fleetmend up: everything it started is stopped (state in {})",
        state_dir.display()
    );
    let code = match end {
        End::Job(JobState::Completed) => {
            match final_line {
                Some(done) => {
                    let _ = writeln!(
                        stdout,
                        "job {job_id} completed: step {}, loss {:.4}, weights sha256 {}",
                        done.step, done.loss, done.weights_sha256
                    );
                }
                None => {
                    let _ = writeln!(
                        stdout,
                        "job {job_id} completed (its rank 0 log has no final line)"
                    );
                }
            }
            ExitCode::SUCCESS
        }
        End::Job(state) => {
            let reason = match (job, slurm_job) {
                (Some(j), _) => format!("job {} {state}: {}", j.job.id, j.job.reason),
                (None, Some(s)) => format!("Slurm job {} {}: {}", s.id, s.state, s.reason),
                (None, None) => format!("the job {state}"),
            };
            let _ = writeln!(stdout, "{reason}");
            ExitCode::from(EXIT_JOB_FAILED)
        }
        End::Signal(code, _) => ExitCode::from(code),
    };
    let _ = stdout.flush();
    drop(stderr);
    code
}

/// `fleetmend up --scenario`: runs the scenario on the started fleet, prints its summary, stops
/// everything.
async fn run_scenario(
    fleet: Fleet,
    scenario: &Scenario,
    json: bool,
    sigint: &mut tokio::signal::unix::Signal,
    sigterm: &mut tokio::signal::unix::Signal,
) -> ExitCode {
    let mut stdout = std::io::stdout();
    let outcome = {
        let mut progress = std::io::stdout();
        tokio::select! {
            summary = scenario::run(&fleet, scenario, &mut progress) => Ok(summary),
            _ = sigint.recv() => Err(EXIT_SIGINT),
            _ = sigterm.recv() => Err(EXIT_SIGTERM),
        }
    };
    let _ = writeln!(stdout, "fleetmend up: stopping the agents and the repairer");
    fleet.shutdown().await;
    match outcome {
        Ok(Ok(summary)) => {
            if json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(text) => {
                        let _ = writeln!(stdout, "{text}");
                    }
                    Err(err) => eprintln!("fleetmend up: encoding the summary: {err}"),
                }
            } else {
                let _ = write!(stdout, "{}", summary.render());
            }
            let _ = stdout.flush();
            if summary.passed { ExitCode::SUCCESS } else { ExitCode::from(EXIT_JOB_FAILED) }
        }
        Ok(Err(err)) => {
            eprintln!("fleetmend up: scenario {}: {err}", scenario.name);
            ExitCode::from(EXIT_JOB_FAILED)
        }
        Err(code) => ExitCode::from(code),
    }
}

/// Why `--repairers N` cannot run with these flags, if it cannot.
fn ha_refusal(repairers: u32, args: &UpArgs) -> Option<String> {
    if repairers == 0 {
        return Some("--repairers must be at least 1".to_owned());
    }
    if args.scenario.is_some() {
        return Some("--scenario runs with one repairer (--repairers 1)".to_owned());
    }
    if args.scheduler != SchedulerChoice::Embedded {
        return Some(
            "--repairers N runs with the embedded queue (not --scheduler slurm)".to_owned(),
        );
    }
    if fleetmend_repairer::postgres_server::postgres_bin().is_none() {
        return Some(format!(
            "--repairers {repairers} keeps the repairers' shared store in a PostgreSQL that \
             fleetmend up starts itself, and PostgreSQL is not installed: apt-get install postgresql"
        ));
    }
    None
}

/// `fleetmend up --repairers N` (N ≥ 2): runs until the job ends or Ctrl-C, printing what changes.
async fn run_ha(config: FleetConfig, repairers: u32, args: &UpArgs) -> ExitCode {
    if let Some(refusal) = ha_refusal(repairers, args) {
        eprintln!("fleetmend up: {refusal}");
        return ExitCode::from(EXIT_CANNOT_RUN);
    }
    let (mut sigint, mut sigterm) =
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
            (Ok(int), Ok(term)) => (int, term),
            (Err(err), _) | (_, Err(err)) => {
                eprintln!("fleetmend up: listening for signals: {err}");
                return ExitCode::from(EXIT_CANNOT_RUN);
            }
        };
    let state_dir = config.state_dir.clone();
    let mut stdout = std::io::stdout();
    let _ = writeln!(
        stdout,
        "fleetmend up: starting PostgreSQL, {repairers} repairers and the agents (state in {})",
        state_dir.display()
    );
    let _ = stdout.flush();
    let fleet = match ha::HaFleet::start(config, repairers).await {
        Ok(fleet) => fleet,
        Err(err) => {
            eprintln!("fleetmend up: {err}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let _ = write!(stdout, "{}", ha_view::HaLog::banner(&fleet));
    let mut log = ha_view::HaLog::default();
    let end = loop {
        for line in log.lines(&fleet) {
            let _ = writeln!(stdout, "{line}");
        }
        let _ = stdout.flush();
        if let Some(job) = fleet.job()
            && job.job.state.is_final()
        {
            break End::Job(job.job.state);
        }
        tokio::select! {
            _ = sigint.recv() => break End::Signal(EXIT_SIGINT, "SIGINT"),
            _ = sigterm.recv() => break End::Signal(EXIT_SIGTERM, "SIGTERM"),
            _ = tokio::time::sleep(LOG_REFRESH) => {}
        }
    };
    let final_line = fleet.final_line();
    let job_id = fleet.job_id().map(str::to_owned).unwrap_or_default();
    let job = fleet.job();
    let what = match &end {
        End::Signal(_, name) => {
            format!("{name}: stopping the job, the repairers, the agents and PostgreSQL")
        }
        End::Job(_) => {
            "the job ended: stopping the repairers, the agents and PostgreSQL".to_owned()
        }
    };
    let _ = writeln!(stdout, "fleetmend up: {what}");
    let _ = stdout.flush();
    fleet.shutdown().await;
    let _ = writeln!(
        stdout,
        "fleetmend up: everything it started is stopped (state in {})",
        state_dir.display()
    );
    let code = match end {
        End::Job(JobState::Completed) => {
            match final_line {
                Some(done) => {
                    let _ = writeln!(
                        stdout,
                        "job {job_id} completed: step {}, loss {:.4}, weights sha256 {}",
                        done.step, done.loss, done.weights_sha256
                    );
                }
                None => {
                    let _ = writeln!(stdout, "job {job_id} completed");
                }
            }
            ExitCode::SUCCESS
        }
        End::Job(state) => {
            let reason = job.map(|j| j.job.reason).unwrap_or_default();
            let _ = writeln!(stdout, "job {job_id} {state}: {reason}");
            ExitCode::from(EXIT_JOB_FAILED)
        }
        End::Signal(code, _) => ExitCode::from(code),
    };
    let _ = stdout.flush();
    code
}
