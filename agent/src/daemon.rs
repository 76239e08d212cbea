//! `fleetmend agent` as a daemon, and `fleetmend agent --once`.

use std::net::SocketAddr;
use std::sync::Arc;

use fleetmend_proto::{HealthView, Verdict};

use crate::checks::{self, Mode};
use crate::commands::Commands;
use crate::config::AgentConfig;
use crate::node::NodeIdentity;
use crate::ranks::RankSupervisor;
use crate::report::{ReportError, Reporter};
use crate::runner::{self, AgentState, CheckSlot};
use crate::server;

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("listening on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("serving HTTP: {0}")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// A started agent: its state and the address it serves on.
#[derive(Debug)]
pub struct RunningAgent {
    pub state: Arc<AgentState>,
    pub local_addr: SocketAddr,
    /// The ranks of jobs this agent runs (none without a repairer: commands come only from it).
    pub ranks: Option<Arc<RankSupervisor>>,
    stop_grace: std::time::Duration,
    /// How long the last report may take (`report.timeout`).
    report_timeout: std::time::Duration,
    tasks: tokio::task::JoinSet<Result<(), AgentError>>,
}

impl RunningAgent {
    /// Waits until the process is asked to stop (SIGTERM, Ctrl-C) or serving fails, then stops
    /// (see [`RunningAgent::stop`]). The check loops, the reporter and the command executor never
    /// end on their own, so the first task to end is the server.
    pub async fn wait(mut self) -> Result<(), AgentError> {
        let first = self.tasks.join_next().await;
        self.stop().await;
        match first {
            Some(Ok(result)) => result,
            Some(Err(_)) | None => Ok(()),
        }
    }

    /// Stops the agent: its ranks get SIGTERM, then SIGKILL after `jobs.stop_grace` (a rank must
    /// not outlive its supervisor unseen), then every task ends. The reporter runs until the
    /// ranks are gone and a report showing how they ended was delivered (waiting at most
    /// `report.timeout` for that), so the repairer learns of it from this agent.
    pub async fn stop(&mut self) {
        if let Some(ranks) = &self.ranks {
            ranks.stop_all(self.stop_grace).await;
            // Bounded: a repairer that is away does not hold up the stop.
            if !ranks.wait_exits_delivered(self.report_timeout).await {
                tracing::warn!(
                    "the ranks' exits did not reach the repairer before the agent stopped"
                );
            }
        }
        self.tasks.abort_all();
    }
}

/// Starts the agent: binds the listener, runs every check once, sends the startup report, then runs
/// each check on its interval. Returns once the first results are in, so `/metrics` is never empty.
pub async fn start(config: AgentConfig) -> Result<RunningAgent, AgentError> {
    let paths = Arc::new(config.paths.clone());
    let identity = NodeIdentity::discover(config.node.as_deref(), &paths);
    let reporter = Reporter::new(&config.report)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| AgentError::Listen { addr: config.listen, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| AgentError::Listen { addr: config.listen, source })?;
    let slots: Vec<Arc<CheckSlot>> = checks::build(&config, &identity.node, Mode::Daemon)
        .into_iter()
        .map(|scheduled| Arc::new(CheckSlot::new(scheduled)))
        .collect();
    let state = Arc::new(AgentState::new(identity));
    for result in runner::run_all(&slots, &paths).await {
        state.record(result);
    }
    tracing::info!(
        node = %state.identity.node,
        listen = %local_addr,
        checks = slots.len(),
        repairer = %config.report.repairer.as_ref().map_or_else(|| "none".to_owned(), |r| r.to_string()),
        jobs = config.jobs.enabled,
        "agent started"
    );

    let mut tasks = tokio::task::JoinSet::new();
    let mut ranks = None;
    for slot in &slots {
        let (state, slot, paths) = (Arc::clone(&state), Arc::clone(slot), Arc::clone(&paths));
        tasks.spawn(async move {
            runner::check_loop(state, slot, paths).await;
            Ok(())
        });
    }
    if let Some(reporter) = reporter {
        // Commands arrive only in the repairer's replies, so without a repairer there is no
        // executor. It ends only when the reporter (holding `commands`) does.
        let supervisor = RankSupervisor::new(config.jobs.clone());
        // Ranks an earlier agent process left running (it was killed with SIGKILL or crashed)
        // have no supervisor: they are stopped and reported. The real /proc, not the configured
        // procfs: these are this agent's own children's children, in its own pid namespace.
        let orphans = supervisor.stop_orphans(std::path::Path::new("/proc"));
        if orphans > 0 {
            tracing::warn!(orphans, "stopping ranks an earlier agent process left running");
        }
        ranks = Some(Arc::clone(&supervisor));
        let (commands, executor) = Commands::with_ranks(
            config.commands.clone(),
            slots,
            Arc::clone(&paths),
            Arc::clone(&state),
            Some(supervisor),
        );
        tasks.spawn(async move {
            executor.run().await;
            Ok(())
        });
        let reporter = reporter.with_commands(commands).with_metrics_port(local_addr.port());
        let state = Arc::clone(&state);
        tasks.spawn(async move {
            reporter.run(state).await;
            Ok(())
        });
    }
    let app = server::router(Arc::clone(&state));
    let (limits, stats) = (config.listener, Arc::clone(&state.listener));
    tasks.spawn(async move {
        fleetmend_listener::serve(
            listener,
            app,
            fleetmend_listener::Plain,
            limits,
            stats,
            shutdown_signal(),
        )
        .await
        .map_err(AgentError::Serve)
    });
    Ok(RunningAgent {
        state,
        local_addr,
        ranks,
        stop_grace: config.jobs.stop_grace,
        report_timeout: config.report.timeout,
        tasks,
    })
}

/// Runs every check once (`--once`) and returns what they saw.
pub async fn once(config: &AgentConfig) -> HealthView {
    let paths = Arc::new(config.paths.clone());
    let identity = NodeIdentity::discover(config.node.as_deref(), &paths);
    let slots: Vec<Arc<CheckSlot>> = checks::build(config, &identity.node, Mode::Once)
        .into_iter()
        .map(|scheduled| Arc::new(CheckSlot::new(scheduled)))
        .collect();
    let state = AgentState::new(identity);
    for result in runner::run_all(&slots, &paths).await {
        state.record(result);
    }
    state.health()
}

/// `--once`'s exit code: 0 healthy (or only warnings), 1 unhealthy. (2, could not run, is the
/// caller's for a config it could not load.)
pub fn exit_code(verdict: Verdict) -> i32 {
    match verdict {
        Verdict::Healthy | Verdict::Degraded => 0,
        Verdict::Unhealthy => 1,
    }
}

/// The findings as an aligned table, worst first within each check.
pub fn render_table(view: &HealthView) -> String {
    let mut rows = vec![[
        "CHECK".to_owned(),
        "SUBJECT".to_owned(),
        "FINDING".to_owned(),
        "STATUS".to_owned(),
        "ACTION".to_owned(),
        "MESSAGE".to_owned(),
    ]];
    for finding in &view.findings {
        rows.push([
            finding.check.clone(),
            if finding.subject.is_empty() { "-".to_owned() } else { finding.subject.clone() },
            finding.finding.clone(),
            finding.status.to_string(),
            finding.action.to_string(),
            finding.message.replace(['\n', '\r'], " "),
        ]);
    }
    let mut widths = [0usize; 5];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row.iter()) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        for (cell, width) in row.iter().zip(widths) {
            out.push_str(cell);
            out.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 2));
        }
        out.push_str(&row[5]);
        out.push('\n');
    }
    let timed_out: Vec<&str> =
        view.checks.iter().filter(|c| c.timed_out).map(|c| c.check.as_str()).collect();
    if !timed_out.is_empty() {
        out.push_str(&format!("timed out: {}\n", timed_out.join(", ")));
    }
    out.push_str(&format!("node {} is {}\n", view.node, view.verdict));
    out
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("stopping");
}
