//! Commands from the repairer, carried out on the node: `deep-check`, `reboot`, `run-rank`,
//! `signal-rank` and `evidence`.
//!
//! Commands arrive in the replies to reports ([`Commands::submit`]). Deep checks and reboots run
//! one at a time, in arrival order, on a task of their own ([`CommandExecutor::run`]): a deep check
//! that takes ten minutes never holds up a report or a scrape. `run-rank` and `signal-rank` take
//! milliseconds and must not wait behind a deep check (a checkpoint signal is urgent), so
//! [`Commands::submit`] carries them out at once through the [`RankSupervisor`]. `evidence` runs on
//! a task of its own ([`crate::evidence`]): it comes before a reboot and must not wait behind
//! anything either. Each result waits in the [`CommandOutbox`] until a
//! report carrying it is accepted, and its arrival asks the reporter for a report at once.
//!
//! A command id is run at most once (the last [`REMEMBERED_IDS`] ids are kept), and every command
//! gets a result, also an unknown or refused one, so the repairer never waits for nothing.
//!
//! The outbox is in [`outbox`], running a probe's or the reboot command's process in [`process`].

mod outbox;
mod process;

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use fleetmend_proto::{
    CommandResult, Finding, NodeCommand, RecommendedAction, Status, Verdict, command_kind,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use self::outbox::CommandOutbox;
pub use self::process::{ProcessEnd, ProcessRun, run_process};
use crate::allreduce::AllreduceRunner;
use crate::checks::Observation;
use crate::config::{CommandsConfig, HostPaths, ProbeConfig};
use crate::evidence::Evidence;
use crate::ranks::{RankSupervisor, RunOutcome};
use crate::runner::{AgentState, CheckResult, CheckSlot, unix_millis};

/// How many command ids an agent remembers, to run a repeated command only once.
pub const REMEMBERED_IDS: usize = 256;
/// Commands that may wait behind the running one; more are refused with a result saying so.
pub const QUEUE_CAPACITY: usize = 32;
/// The `check` of the findings a deep check's probes make.
pub const DEEP_CHECK: &str = "deep_check";
/// The finding of a probe that did not pass (subject: the probe's name).
pub const PROBE_FAILED: &str = "probe_failed";

/// How long a check that its own loop is running is polled for before a deep check runs it.
const BUSY_POLL: Duration = Duration::from_millis(50);
/// Problems named in a deep check's message; the findings list carries them all.
const MESSAGE_PROBLEMS: usize = 8;

/// The last few command ids seen, oldest dropped first.
#[derive(Debug, Default)]
struct RecentIds {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl RecentIds {
    /// Remembers `id`; false when it was seen before.
    fn insert(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        if self.order.len() >= REMEMBERED_IDS
            && let Some(oldest) = self.order.pop_front()
        {
            self.set.remove(&oldest);
        }
        self.order.push_back(id.to_owned());
        self.set.insert(id.to_owned());
        true
    }

    /// Forgets `id`, so that the repairer may send it again (it was refused, not run).
    fn forget(&mut self, id: &str) {
        if self.set.remove(id) {
            self.order.retain(|seen| seen != id);
        }
    }
}

/// The reporter's side: takes commands from replies and holds their results for reports.
#[derive(Debug)]
pub struct Commands {
    queue: mpsc::Sender<NodeCommand>,
    seen: Mutex<RecentIds>,
    outbox: Arc<CommandOutbox>,
    /// Runs `run-rank` and `signal-rank`; none: they are refused.
    ranks: Option<Arc<RankSupervisor>>,
    evidence: Arc<Evidence>,
    allreduce: Arc<AllreduceRunner>,
}

impl Commands {
    /// The reporter's handle and the executor that runs the commands (spawn
    /// [`CommandExecutor::run`]). `slots` are the daemon's checks, run by a deep check.
    pub fn new(
        config: CommandsConfig,
        slots: Vec<Arc<CheckSlot>>,
        paths: Arc<HostPaths>,
        state: Arc<AgentState>,
    ) -> (Arc<Commands>, CommandExecutor) {
        Commands::with_ranks(config, slots, paths, state, None)
    }

    /// As [`Commands::new`], with `ranks` carrying out `run-rank` and `signal-rank`.
    pub fn with_ranks(
        config: CommandsConfig,
        slots: Vec<Arc<CheckSlot>>,
        paths: Arc<HostPaths>,
        state: Arc<AgentState>,
        ranks: Option<Arc<RankSupervisor>>,
    ) -> (Arc<Commands>, CommandExecutor) {
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let outbox = Arc::new(CommandOutbox::default());
        let allreduce = Arc::new(AllreduceRunner::new(config.allreduce.clone()));
        let evidence = Arc::new(Evidence::new(
            config.evidence.clone(),
            Arc::clone(&paths),
            Arc::clone(&state),
        ));
        let executor = CommandExecutor {
            config,
            slots,
            paths,
            state,
            outbox: Arc::clone(&outbox),
            queue: receiver,
        };
        let seen = Mutex::new(RecentIds::default());
        let commands = Commands { queue, seen, outbox, ranks, evidence, allreduce };
        (Arc::new(commands), executor)
    }

    pub fn outbox(&self) -> &CommandOutbox {
        &self.outbox
    }

    /// The rank supervisor, where this agent has one.
    pub fn ranks(&self) -> Option<&Arc<RankSupervisor>> {
        self.ranks.as_ref()
    }

    /// Queues `command` to run after the ones before it; a repeated id is dropped, and a command
    /// that cannot run gets its failed result at once.
    pub fn submit(&self, command: NodeCommand) {
        if command.id.is_empty() {
            tracing::warn!(kind = %command.kind, "a command without an id; refusing it");
            self.outbox.push(result_of(&command, false, "refused: the command has no id"));
            return;
        }
        if !self.seen.lock().unwrap_or_else(PoisonError::into_inner).insert(&command.id) {
            tracing::info!(id = %command.id, kind = %command.kind, "command seen before; not run again");
            return;
        }
        if command.kind == command_kind::RUN_RANK || command.kind == command_kind::SIGNAL_RANK {
            let result = self.rank_command(&command);
            tracing::info!(id = %command.id, kind = %command.kind, ok = result.ok, "{}", result.message);
            self.outbox.push(result);
            return;
        }
        if command.kind == command_kind::EVIDENCE {
            self.gather_evidence(command);
            return;
        }
        if command.kind == command_kind::ALLREDUCE {
            self.allreduce.start(command, Arc::clone(&self.outbox));
            return;
        }
        if !is_supported(&command.kind) {
            tracing::warn!(id = %command.id, kind = %command.kind, "unsupported command kind");
            self.outbox.push(unsupported(&command));
            return;
        }
        tracing::info!(id = %command.id, kind = %command.kind, "command queued");
        let refused = match self.queue.try_send(command) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(command)) => (
                command,
                format!("refused: {QUEUE_CAPACITY} commands are already waiting on this agent"),
            ),
            Err(mpsc::error::TrySendError::Closed(command)) => {
                (command, "refused: this agent's command executor has stopped".to_owned())
            }
        };
        let (command, message) = refused;
        tracing::warn!(id = %command.id, kind = %command.kind, "{message}");
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).forget(&command.id);
        self.outbox.push(result_of(&command, false, message));
    }
}

impl Commands {
    /// Gathers a bundle on a task of its own; its result goes to the outbox when done.
    fn gather_evidence(&self, command: NodeCommand) {
        if !self.evidence.enabled() {
            let message = "no evidence gathered: commands.evidence.enabled is off on this agent";
            self.outbox.push(result_of(&command, false, message));
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.outbox.push(result_of(
                &command,
                false,
                "refused: no runtime to gather evidence on",
            ));
            return;
        };
        let (evidence, outbox) = (Arc::clone(&self.evidence), Arc::clone(&self.outbox));
        runtime.spawn(async move {
            let budget = evidence.budget(&command);
            let bundle = evidence.gather(&command.id, budget).await;
            let bytes: usize = bundle.items.iter().map(|i| i.content.len()).sum();
            let names: Vec<&str> = bundle.items.iter().map(|i| i.name.as_str()).collect();
            let message = format!(
                "evidence: {} in {}, {} KiB",
                names.join(", "),
                short_duration(Duration::from_millis(bundle.took_ms)),
                bytes.div_ceil(1024)
            );
            tracing::info!(id = %command.id, "{message}");
            outbox.push(CommandResult {
                evidence: Some(bundle),
                ..result_of(&command, true, message)
            });
        });
    }

    /// Carries out a `run-rank` or `signal-rank` now; its result.
    fn rank_command(&self, command: &NodeCommand) -> CommandResult {
        let Some(ranks) = &self.ranks else {
            return result_of(
                command,
                false,
                format!("refused: this agent runs no jobs ({} not carried out)", command.kind),
            );
        };
        if command.kind == command_kind::RUN_RANK {
            let run = match command.args_as::<fleetmend_proto::RunRank>() {
                Ok(run) => run,
                Err(err) => return result_of(command, false, format!("refused: {err}")),
            };
            match ranks.run(&run) {
                Ok(RunOutcome::Started { pid, log }) => result_of(
                    command,
                    true,
                    format!("started rank {} (pid {pid}); output in {}", run.key, log.display()),
                ),
                // Idempotent: the rank stands as it was. Running counts as done; one that ended
                // (or never started) is not started again, and the result says so.
                Ok(RunOutcome::AlreadyStarted(status)) => {
                    let running = status.state == fleetmend_proto::RankState::Running;
                    let pid = status.pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default();
                    let state = match status.state {
                        fleetmend_proto::RankState::Running => "running",
                        fleetmend_proto::RankState::Exited => "exited",
                        fleetmend_proto::RankState::FailedToStart => "failed to start",
                    };
                    result_of(
                        command,
                        running,
                        format!(
                            "rank {} was started before{pid} and is {state}: {}; not started again",
                            run.key, status.message
                        ),
                    )
                }
                Err(err) => result_of(command, false, err.to_string()),
            }
        } else {
            let signal = match command.args_as::<fleetmend_proto::SignalRank>() {
                Ok(signal) => signal,
                Err(err) => return result_of(command, false, format!("refused: {err}")),
            };
            match ranks.signal(&signal) {
                Ok(pid) => result_of(
                    command,
                    true,
                    format!("sent {} to rank {} (process group {pid})", signal.signal, signal.key),
                ),
                Err(err) => result_of(command, false, err.to_string()),
            }
        }
    }
}

fn is_supported(kind: &str) -> bool {
    kind == command_kind::DEEP_CHECK || kind == command_kind::REBOOT
}

fn unsupported(command: &NodeCommand) -> CommandResult {
    result_of(
        command,
        false,
        format!(
            "unsupported command kind {:?} (this agent runs {:?}, {:?}, {:?}, {:?}, {:?} and {:?})",
            command.kind,
            command_kind::DEEP_CHECK,
            command_kind::REBOOT,
            command_kind::RUN_RANK,
            command_kind::SIGNAL_RANK,
            command_kind::EVIDENCE,
            command_kind::ALLREDUCE,
        ),
    )
}

pub(crate) fn result_of(
    command: &NodeCommand,
    ok: bool,
    message: impl Into<String>,
) -> CommandResult {
    CommandResult {
        id: command.id.clone(),
        kind: command.kind.clone(),
        ok,
        message: message.into(),
        verdict: None,
        findings: Vec::new(),
        evidence: None,
        allreduce: None,
        finished_at_ms: unix_millis(SystemTime::now()),
    }
}

/// Runs the queued commands, one at a time.
#[derive(Debug)]
pub struct CommandExecutor {
    config: CommandsConfig,
    slots: Vec<Arc<CheckSlot>>,
    paths: Arc<HostPaths>,
    state: Arc<AgentState>,
    outbox: Arc<CommandOutbox>,
    queue: mpsc::Receiver<NodeCommand>,
}

impl CommandExecutor {
    /// Runs commands until the [`Commands`] handle is dropped.
    pub async fn run(mut self) {
        while let Some(command) = self.queue.recv().await {
            tracing::info!(id = %command.id, kind = %command.kind, "running command");
            match command.kind.as_str() {
                command_kind::DEEP_CHECK => {
                    let result = self.deep_check(&command).await;
                    tracing::info!(id = %command.id, ok = result.ok, "{}", result.message);
                    self.outbox.push(result);
                }
                command_kind::REBOOT => self.reboot(&command).await,
                // `submit` answers these itself; kept so no command ever goes unanswered.
                _ => self.outbox.push(unsupported(&command)),
            }
        }
    }

    /// Every enabled check once, now, then every probe in turn, all within `deep_check_timeout`.
    async fn deep_check(&self, command: &NodeCommand) -> CommandResult {
        let started = Instant::now();
        let budget = self.config.deep_check_timeout;
        let deadline = started + budget;

        let mut runs = tokio::task::JoinSet::new();
        for (index, slot) in self.slots.iter().enumerate() {
            let (slot, paths) = (Arc::clone(slot), Arc::clone(&self.paths));
            runs.spawn(
                async move { (index, run_check_now(&slot, &paths, deadline, budget).await) },
            );
        }
        let mut checks: Vec<Option<(CheckResult, bool)>> = vec![None; self.slots.len()];
        while let Some(joined) = runs.join_next().await {
            // A join error is a cancelled runtime; that check is then simply missing.
            if let Ok((index, run)) = joined {
                checks[index] = Some(run);
            }
        }
        let mut findings = Vec::new();
        let mut changed = false;
        for (result, fresh) in checks.into_iter().flatten() {
            findings.extend(result.observation.findings.iter().cloned());
            if fresh {
                changed |= self.state.record(result);
            }
        }
        if changed {
            self.state.request_report();
        }

        let mut probes_failed = 0usize;
        for probe in &self.config.deep_check_probes {
            if let Some(failure) = self.run_probe(probe, deadline, budget).await {
                probes_failed += 1;
                findings.push(failure);
            }
        }

        let verdict = Verdict::of(&findings);
        let ok = verdict != Verdict::Unhealthy && probes_failed == 0;
        let problems: Vec<Finding> =
            findings.into_iter().filter(|f| f.status != Status::Ok).collect();
        let mut message = format!(
            "{verdict}: {} checks and {} probes ({probes_failed} failed) in {}",
            self.slots.len(),
            self.config.deep_check_probes.len(),
            short_duration(started.elapsed()),
        );
        if !problems.is_empty() {
            let named: Vec<String> = problems
                .iter()
                .take(MESSAGE_PROBLEMS)
                .map(|f| {
                    let subject = if f.subject.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", f.subject)
                    };
                    format!("{}/{}{subject} ({})", f.check, f.finding, f.status)
                })
                .collect();
            message.push_str(&format!("; {} not ok: {}", problems.len(), named.join(", ")));
            if problems.len() > MESSAGE_PROBLEMS {
                message.push_str(&format!(", and {} more", problems.len() - MESSAGE_PROBLEMS));
            }
        }
        CommandResult {
            verdict: Some(verdict),
            findings: problems,
            ..result_of(command, ok, message)
        }
    }

    /// Runs one probe within what is left of the deep check; its failure finding, if it failed.
    async fn run_probe(
        &self,
        probe: &ProbeConfig,
        deadline: Instant,
        budget: Duration,
    ) -> Option<Finding> {
        let left = deadline.saturating_duration_since(Instant::now());
        let failed = |message: String| {
            Finding::new(
                DEEP_CHECK,
                PROBE_FAILED,
                probe.name.clone(),
                Status::Fail,
                RecommendedAction::Drain,
                message,
            )
        };
        if left.is_zero() {
            return Some(failed(format!(
                "probe {} not run: the deep check's {} (commands.deep_check_timeout) ran out",
                probe.name,
                short_duration(budget)
            )));
        }
        let run = run_process(&probe.argv, probe.timeout.min(left)).await;
        tracing::info!(probe = %probe.name, passed = run.passed(), "deep-check probe {}", run.describe());
        if run.passed() {
            return None;
        }
        let mut message =
            format!("probe {} (`{}`) {}", probe.name, probe.argv.join(" "), run.describe());
        if matches!(run.end, ProcessEnd::TimedOut) && probe.timeout > left {
            message.push_str(" (the deep check's time ran out)");
        }
        Some(failed(message).with_value(run.duration.as_secs_f64()))
    }

    /// Says "reboot started", lets that reach the repairer, then runs the reboot command.
    async fn reboot(&self, command: &NodeCommand) {
        let argv = &self.config.reboot;
        if argv.is_empty() {
            tracing::warn!(id = %command.id, "reboot refused: commands.reboot is empty");
            self.outbox.push(result_of(
                command,
                false,
                "reboot refused: this agent's commands.reboot is empty",
            ));
            return;
        }
        let started = result_of(command, true, "reboot started");
        self.outbox.push(started.clone());
        let delivered = self.outbox.wait_delivered(&started, self.config.reboot_delay).await;
        tracing::warn!(id = %command.id, delivered, argv = ?argv, "rebooting the node");
        let run = run_process(argv, self.config.reboot_timeout).await;
        if run.passed() {
            tracing::warn!(id = %command.id, "the reboot command {}", run.describe());
            return;
        }
        let message = format!("reboot command `{}` {}", argv.join(" "), run.describe());
        tracing::error!(id = %command.id, "{message}");
        self.outbox.push(result_of(command, false, message));
    }
}

/// Runs `slot` now. While its own loop is running it, waits for that run to end first (polling,
/// within `deadline`). The flag says whether the result is a fresh run worth recording.
async fn run_check_now(
    slot: &CheckSlot,
    paths: &Arc<HostPaths>,
    deadline: Instant,
    budget: Duration,
) -> (CheckResult, bool) {
    loop {
        let attempt = std::time::Instant::now();
        let Ok(result) = tokio::time::timeout_at(deadline, slot.run(paths)).await else {
            return (out_of_time(slot.name(), budget), false);
        };
        // `CheckSlot::run` answers a slot that is still busy at once with a timed-out result that
        // claims the full timeout; a real timeout never comes back sooner than it claims.
        let busy = result.timed_out && attempt.elapsed() < result.duration;
        if !busy {
            return (result, true);
        }
        if Instant::now() + BUSY_POLL >= deadline {
            return (result, false);
        }
        tokio::time::sleep(BUSY_POLL).await;
    }
}

fn out_of_time(check: &'static str, budget: Duration) -> CheckResult {
    let finding = Finding::new(
        check,
        "check_timeout",
        "",
        Status::Unknown,
        RecommendedAction::None,
        format!(
            "the {check} check did not finish within the deep check's {} (commands.deep_check_timeout)",
            short_duration(budget)
        ),
    );
    CheckResult {
        check,
        observation: Observation { findings: vec![finding], samples: Vec::new() },
        duration: budget,
        timed_out: true,
        finished_at: SystemTime::now(),
    }
}

/// A duration for a message: whole seconds above ten seconds, milliseconds below.
pub(crate) fn short_duration(duration: Duration) -> String {
    let rounded = if duration >= Duration::from_secs(10) {
        Duration::from_secs(duration.as_secs())
    } else {
        Duration::from_millis(duration.as_millis() as u64)
    };
    humantime::format_duration(rounded).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_ids_forget_the_oldest_beyond_the_limit() {
        let mut ids = RecentIds::default();
        assert!(ids.insert("a"));
        assert!(!ids.insert("a"));
        for i in 0..REMEMBERED_IDS {
            assert!(ids.insert(&format!("x{i}")));
        }
        assert!(ids.insert("a"), "the oldest id should have been forgotten");
        assert_eq!(ids.order.len(), REMEMBERED_IDS);
        assert_eq!(ids.set.len(), REMEMBERED_IDS);
        ids.forget("a");
        assert!(ids.insert("a"));
    }
}
