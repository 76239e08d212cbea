//! The agent daemon runs the ranks of jobs a stand-in repairer asks for in its replies: started as
//! real processes in their own process groups with the environment sent, signalled (USR1 reaches a
//! trap, TERM ends it), their exits reported at once; a repeated `run-rank` starts nothing new; a
//! missing program fails to start with the OS error; jobs turned off start nothing; stopping the
//! agent stops its ranks; ranks an earlier agent process left running are stopped at start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use fleetmend_agent::config::{AgentConfig, HostPaths};
use fleetmend_agent::daemon::{self, RunningAgent};
use fleetmend_agent::gpu::GpuBackendSpec;
use fleetmend_agent::ranks::{LOG_FILE, RANK_DIR_VAR};
use fleetmend_proto::{
    CommandResult, NodeCommand, RankKey, RankSignal, RankState, RankStatus, Report, ReportReply,
    ReportTrigger, RunRank, SignalRank, command_kind, jobs::command_with_args,
};
use support::fixture;

/// How long any one condition in these tests may take to come true.
const WITHIN: Duration = Duration::from_secs(20);

/// A stand-in repairer: keeps every report and answers each with the commands queued so far.
#[derive(Clone, Default)]
struct Repairer {
    reports: Arc<Mutex<Vec<Report>>>,
    outgoing: Arc<Mutex<Vec<NodeCommand>>>,
}

impl Repairer {
    fn reports(&self) -> Vec<Report> {
        self.reports.lock().unwrap().clone()
    }

    fn send(&self, command: NodeCommand) {
        self.outgoing.lock().unwrap().push(command);
    }

    fn results_for(&self, id: &str) -> Vec<CommandResult> {
        self.reports().into_iter().flat_map(|r| r.command_results).filter(|r| r.id == id).collect()
    }

    /// The first result for `id`, waiting for it.
    async fn result(&self, id: &str) -> CommandResult {
        let found = poll(WITHIN, || self.results_for(id).into_iter().next()).await;
        found.unwrap_or_else(|| panic!("no result for {id}; reports: {:#?}", self.reports()))
    }

    /// The first report, in arrival order, whose status of `key` satisfies `want`.
    async fn report_where(
        &self,
        key: &RankKey,
        what: &str,
        want: impl Fn(&Report, &RankStatus) -> bool,
    ) -> (Report, RankStatus) {
        let found = poll(WITHIN, || {
            self.reports().into_iter().find_map(|report| {
                let status = report.ranks.iter().find(|s| &s.key == key)?.clone();
                want(&report, &status).then_some((report, status))
            })
        })
        .await;
        found
            .unwrap_or_else(|| panic!("no report {what} for {key}; reports: {:#?}", self.reports()))
    }
}

async fn receive(
    State(repairer): State<Repairer>,
    Json(report): Json<Report>,
) -> Json<ReportReply> {
    repairer.reports.lock().unwrap().push(report);
    let commands = std::mem::take(&mut *repairer.outgoing.lock().unwrap());
    Json(ReportReply { commands })
}

/// Polls `look` every 10 ms until it finds something or `within` passes.
async fn poll<T>(within: Duration, mut look: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = look() {
            return Some(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `cond` holds within [`WITHIN`].
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    poll(WITHIN, || cond().then_some(())).await.is_some()
}

/// The agent daemon on the healthy fixture, reporting to a stand-in repairer every 100 ms (so the
/// repairer's commands reach it quickly), with `jobs` as its `[jobs]` section body.
struct Node {
    repairer: Repairer,
    agent: RunningAgent,
    jobs_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(node: &str, jobs: &str) -> Node {
        Node::start_in(None, node, jobs).await
    }

    /// With `jobs_dir` as `jobs.dir` (default: a fresh one).
    async fn start_in(jobs_dir: Option<&Path>, node: &str, jobs: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = jobs_dir.map_or_else(|| dir.path().join("jobs"), Path::to_owned);
        let repairer = Repairer::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app =
            axum::Router::new().route("/v1/reports", post(receive)).with_state(repairer.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });

        let case = fixture("healthy");
        let base = std::fs::read_to_string(case.join("agent.toml")).unwrap();
        let text = format!(
            "{base}\n[report]\nrepairer = \"http://127.0.0.1:{port}\"\ninterval = \"100ms\"\n\
             backoff_initial = \"50ms\"\nbackoff_max = \"200ms\"\n\
             [jobs]\ndir = {:?}\n{jobs}\n",
            jobs_dir.display().to_string()
        );
        let mut config = AgentConfig::parse(&text).unwrap();
        config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        config.node = Some(node.to_owned());
        config.paths = HostPaths::tree(&case);
        config.checks.gpu.backend = GpuBackendSpec::Fixture(case.join("gpu.json"));
        assert!(config.validate().is_empty(), "{}", config.validate());
        let agent = daemon::start(config).await.unwrap();
        Node { repairer, agent, jobs_dir, _dir: dir }
    }

    fn rank_dir(&self, key: &RankKey) -> PathBuf {
        self.jobs_dir
            .join(&key.job)
            .join(format!("attempt-{}", key.attempt))
            .join(format!("rank-{}", key.rank))
    }
}

fn key(job: &str, rank: u32) -> RankKey {
    RankKey { job: job.to_owned(), attempt: 0, rank }
}

fn run_rank(id: &str, key: &RankKey, argv: &[&str], env: &[(&str, &str)]) -> NodeCommand {
    let run = RunRank {
        key: key.clone(),
        argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        workdir: None,
    };
    command_with_args(id.to_owned(), command_kind::RUN_RANK, &run)
}

fn signal_rank(id: &str, key: &RankKey, signal: RankSignal) -> NodeCommand {
    let signal = SignalRank { key: key.clone(), signal };
    command_with_args(id.to_owned(), command_kind::SIGNAL_RANK, &signal)
}

/// Whether `pid` runs (a zombie waiting for its reaper does not).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// A rank that notes each start, writes `ready` (in its working directory) once its traps are
/// set, writes `usr1` on SIGUSR1 and goes on, and exits 7 on SIGTERM. `sleep & wait` so a trap
/// runs at once rather than after a foreground `sleep`.
const TRAPPING_RANK: &str = r#"
echo start >> starts
echo "hello from rank $RANK with $FLEETMEND_TEST_VALUE"
echo "an error line" >&2
trap 'echo usr1 > usr1' USR1
trap 'exit 7' TERM
echo ready > ready
while :; do sleep 5 & wait $!; done
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_rank_runs_takes_usr1_and_its_term_exit_is_reported_at_once() {
    let node = Node::start("ranks-1", "enabled = true\nadvertise_address = \"10.1.2.3\"\n").await;
    let rank = key("job-a", 0);
    let dir = node.rank_dir(&rank);
    let env = [("RANK", "0"), ("FLEETMEND_TEST_VALUE", "value-123")];
    node.repairer.send(run_rank("r1", &rank, &["sh", "-c", TRAPPING_RANK], &env));

    let started = node.repairer.result("r1").await;
    assert!(started.ok, "{started:#?}");
    assert!(
        started.message.starts_with("started rank job-a/attempt-0/rank-0 (pid "),
        "{}",
        started.message
    );
    let (report, running) = node
        .repairer
        .report_where(&rank, "showing it running", |_, s| s.state == RankState::Running)
        .await;
    assert_eq!(report.address.as_deref(), Some("10.1.2.3"));
    let pid = running.pid.expect("a running rank has a pid");
    assert!(process_alive(pid), "pid {pid} is not running");
    assert!(running.started_at_ms > 0 && running.finished_at_ms.is_none(), "{running:#?}");
    // Its own process group, so a signal reaches everything it started and nothing else.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let pgrp: u32 =
        stat.rsplit_once(") ").unwrap().1.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert_eq!(pgrp, pid);
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.split('\0').any(|v| v == "FLEETMEND_TEST_VALUE=value-123"), "{environ}");
    assert!(environ.split('\0').any(|v| v == format!("{RANK_DIR_VAR}={}", dir.display())));
    // The agent's own environment is passed on as well.
    assert!(environ.split('\0').any(|v| v.starts_with("PATH=")), "{environ}");
    assert!(eventually(|| dir.join("ready").exists()).await, "the rank never got ready");

    // The same rank again, under a new command id: no second process.
    node.repairer.send(run_rank("r2", &rank, &["sh", "-c", TRAPPING_RANK], &env));
    let again = node.repairer.result("r2").await;
    assert!(again.ok, "{again:#?}");
    assert!(again.message.contains("not started again"), "{}", again.message);
    assert!(again.message.contains(&format!("(pid {pid})")), "{}", again.message);

    node.repairer.send(signal_rank("s1", &rank, RankSignal::Usr1));
    let sent = node.repairer.result("s1").await;
    assert!(sent.ok, "{sent:#?}");
    assert!(eventually(|| dir.join("usr1").exists()).await, "USR1 did not reach the rank's trap");
    assert!(process_alive(pid), "USR1 ended the rank");

    node.repairer.send(signal_rank("s2", &rank, RankSignal::Term));
    // Reported at once: by a report the exit itself triggered, or by the one that carries the
    // TERM command's result when the rank was already gone as it was built (the exit is seen
    // then, and triggers nothing more) — never left for the next interval.
    let (report, exited) = node
        .repairer
        .report_where(&rank, "showing it exited", |_, s| s.state == RankState::Exited)
        .await;
    assert!(
        matches!(report.trigger, ReportTrigger::RankExit | ReportTrigger::Command),
        "the exit waited for a {:?} report",
        report.trigger
    );
    assert_eq!(exited.exit_code, Some(7), "{exited:#?}");
    assert_eq!((exited.signal, exited.pid), (None, Some(pid)), "{exited:#?}");
    assert!(exited.finished_at_ms.is_some_and(|at| at >= exited.started_at_ms), "{exited:#?}");
    assert_eq!(exited.message, "exited with status 7");
    assert_eq!(report.address.as_deref(), Some("10.1.2.3"));
    assert!(eventually(|| !process_alive(pid)).await, "pid {pid} still runs");
    // No report before the exit was recorded may show it exited under any other trigger first
    // and then go quiet: the rank-exit report is the one sent at once, and it is there.
    let s2 = node.repairer.result("s2").await;
    assert!(s2.ok && s2.message.starts_with("sent TERM to rank job-a/attempt-0/rank-0"), "{s2:#?}");

    // A signal for a rank that ended is refused; so is one for a rank never started.
    node.repairer.send(signal_rank("s3", &rank, RankSignal::Usr1));
    let late = node.repairer.result("s3").await;
    assert!(!late.ok && late.message.contains("not running"), "{late:#?}");
    node.repairer.send(signal_rank("s4", &key("job-a", 9), RankSignal::Term));
    let unknown = node.repairer.result("s4").await;
    assert!(!unknown.ok && unknown.message.contains("unknown"), "{unknown:#?}");
    // And a run of the ended rank starts nothing either.
    node.repairer.send(run_rank("r3", &rank, &["sh", "-c", TRAPPING_RANK], &env));
    let rerun = node.repairer.result("r3").await;
    assert!(!rerun.ok && rerun.message.contains("exited with status 7"), "{rerun:#?}");

    let starts = std::fs::read_to_string(dir.join("starts")).unwrap();
    assert_eq!(starts, "start\n", "the rank was started more than once");
    let log = std::fs::read_to_string(dir.join(LOG_FILE)).unwrap();
    assert!(log.contains("hello from rank 0 with value-123\n"), "{log}");
    assert!(log.contains("an error line\n"), "stderr goes to the log too: {log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_program_fails_to_start_with_the_os_error_and_ages_out_of_reports() {
    let node = Node::start("ranks-2", "enabled = true\nretain_exited = \"1s\"\n").await;
    let rank = key("job-b", 1);
    node.repairer.send(run_rank("r1", &rank, &["/nonexistent/fleetmend-trainer", "train"], &[]));
    let result = node.repairer.result("r1").await;
    assert!(!result.ok, "{result:#?}");
    assert!(result.message.contains("No such file or directory"), "{}", result.message);
    let (report, failed) = node
        .repairer
        .report_where(&rank, "showing it failed", |_, s| s.state == RankState::FailedToStart)
        .await;
    assert!(failed.message.contains("/nonexistent/fleetmend-trainer"), "{failed:#?}");
    assert!(failed.message.contains("No such file or directory"), "{failed:#?}");
    assert_eq!(failed.pid, None);
    // Without an advertised address, the host name.
    assert!(report.address.as_deref().is_some_and(|a| !a.is_empty()), "{report:#?}");

    // After retain_exited it is no longer reported, but still remembered: not started again.
    let seen = node.repairer.reports().len();
    assert!(
        eventually(|| node.repairer.reports().iter().skip(seen).any(|r| r.ranks.is_empty())).await,
        "the failed rank is still reported after retain_exited"
    );
    node.repairer.send(run_rank("r2", &rank, &["true"], &[]));
    let again = node.repairer.result("r2").await;
    assert!(!again.ok && again.message.contains("not started again"), "{again:#?}");

    // A working directory that does not exist is named as such.
    let mut elsewhere = run_rank("r5", &key("job-b", 2), &["true"], &[]);
    elsewhere.args.insert("workdir".to_owned(), serde_json::json!("/nonexistent/workdir"));
    node.repairer.send(elsewhere);
    let result = node.repairer.result("r5").await;
    assert!(!result.ok, "{result:#?}");
    assert!(
        result.message.contains("working directory /nonexistent/workdir"),
        "{}",
        result.message
    );

    // Bad arguments are refused and recorded nowhere.
    let bad = NodeCommand {
        id: "r3".to_owned(),
        kind: command_kind::RUN_RANK.to_owned(),
        args: BTreeMap::from([("job".to_owned(), serde_json::json!("j"))]),
    };
    node.repairer.send(bad);
    let refused = node.repairer.result("r3").await;
    assert!(!refused.ok && refused.message.contains("missing field"), "{refused:#?}");
    node.repairer.send(run_rank("r4", &key("../escape", 0), &["true"], &[]));
    let refused = node.repairer.result("r4").await;
    assert!(!refused.ok && refused.message.contains("contains '/'"), "{refused:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_jobs_disabled_run_rank_is_refused_and_nothing_starts() {
    let node = Node::start("ranks-3", "enabled = false\n").await;
    let marker = node._dir.path().join("ran");
    let rank = key("job-c", 0);
    let script = format!("echo ran > {}", marker.display());
    node.repairer.send(run_rank("r1", &rank, &["sh", "-c", &script], &[]));
    let result = node.repairer.result("r1").await;
    assert!(!result.ok, "{result:#?}");
    assert!(result.message.contains("jobs.enabled = false"), "{}", result.message);
    node.repairer.send(signal_rank("s1", &rank, RankSignal::Kill));
    let signal = node.repairer.result("s1").await;
    assert!(!signal.ok && signal.message.contains("jobs.enabled = false"), "{signal:#?}");
    // Refused before anything was made: no rank directory, no process, no rank in any report.
    assert!(!node.rank_dir(&rank).exists());
    assert!(!marker.exists());
    assert!(node.repairer.reports().iter().all(|r| r.ranks.is_empty()));
}

#[tokio::test(flavor = "multi_thread")]
async fn stopping_the_agent_terms_its_ranks_then_kills_the_stubborn_ones() {
    let mut node = Node::start("ranks-4", "enabled = true\nstop_grace = \"1s\"\n").await;
    let polite = key("job-d", 0);
    let stubborn = key("job-d", 1);
    node.repairer.send(run_rank("r1", &polite, &["sh", "-c", TRAPPING_RANK], &[]));
    let ignores_term = "trap '' TERM; echo ready > ready; while :; do sleep 5 & wait $!; done";
    node.repairer.send(run_rank("r2", &stubborn, &["sh", "-c", ignores_term], &[]));
    for (id, rank) in [("r1", &polite), ("r2", &stubborn)] {
        assert!(node.repairer.result(id).await.ok);
        let dir = node.rank_dir(rank);
        assert!(eventually(|| dir.join("ready").exists()).await, "{rank} never got ready");
    }
    let ranks = Arc::clone(node.agent.ranks.as_ref().unwrap());
    let pids: Vec<u32> =
        [&polite, &stubborn].iter().map(|k| ranks.status(k).unwrap().pid.unwrap()).collect();

    let started = std::time::Instant::now();
    node.agent.stop().await;
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(1), "SIGKILL came before the grace period: {took:?}");
    assert!(took < Duration::from_secs(15), "stopping took {took:?}");
    let polite = ranks.status(&polite).unwrap();
    assert_eq!((polite.state, polite.exit_code), (RankState::Exited, Some(7)), "{polite:#?}");
    let stubborn = ranks.status(&stubborn).unwrap();
    assert_eq!((stubborn.state, stubborn.signal), (RankState::Exited, Some(9)), "{stubborn:#?}");
    for pid in pids {
        assert!(!process_alive(pid), "pid {pid} outlived the agent");
    }
    // The stop waited for a report showing both ends to reach the repairer.
    let last = node.repairer.reports().pop().unwrap();
    let states: Vec<RankState> = last.ranks.iter().map(|s| s.state).collect();
    assert_eq!(states, [RankState::Exited, RankState::Exited], "{last:#?}");
    // A stopping agent starts nothing new.
    let run = RunRank {
        key: key("job-d", 2),
        argv: vec!["true".into()],
        env: BTreeMap::new(),
        workdir: None,
    };
    let err = ranks.run(&run).unwrap_err().to_string();
    assert!(err.contains("stopping"), "{err}");
}

/// Starts what an agent killed with SIGKILL leaves behind: a rank in its own process group, its
/// rank directory in its environment (running `script`); returns once it wrote `ready`.
async fn orphan(jobs_dir: &Path, key: &RankKey, script: &str) -> std::process::Child {
    let dir = jobs_dir
        .join(&key.job)
        .join(format!("attempt-{}", key.attempt))
        .join(format!("rank-{}", key.rank));
    std::fs::create_dir_all(&dir).unwrap();
    let child = std::process::Command::new("sh")
        .args(["-c", &format!("{script}; echo ready > ready; while :; do sleep 5 & wait $!; done")])
        .env(RANK_DIR_VAR, &dir)
        .current_dir(&dir)
        .process_group(0)
        // Not the test's pipes: a `sleep` left in the group must not hold them open.
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(|| dir.join("ready").exists()).await, "the orphan never got ready");
    child
}

#[tokio::test(flavor = "multi_thread")]
async fn ranks_left_by_an_agent_that_was_killed_are_stopped_and_reported_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let jobs_dir = dir.path().join("jobs");
    let (polite, stubborn) = (key("job-e", 3), key("job-e", 4));
    let mut polite_child = orphan(&jobs_dir, &polite, "true").await;
    let mut stubborn_child = orphan(&jobs_dir, &stubborn, "trap '' TERM").await;
    // One elsewhere: not this agent's (another agent's jobs.dir), so left alone.
    let other_dir = dir.path().join("other-jobs");
    let mut other_child = orphan(&other_dir, &key("job-e", 5), "true").await;

    let node =
        Node::start_in(Some(&jobs_dir), "ranks-5", "enabled = true\nstop_grace = \"2s\"\n").await;
    let message = |report: &Report, key: &RankKey| {
        report
            .ranks
            .iter()
            .find(|s| &s.key == key && s.state == RankState::Exited)
            .map(|s| s.message.clone())
    };
    let (report, _) = node
        .repairer
        .report_where(&stubborn, "showing the orphans stopped", |report, _| {
            message(report, &polite).is_some() && message(report, &stubborn).is_some()
        })
        .await;
    let (polite_message, stubborn_message) =
        (message(&report, &polite).unwrap(), message(&report, &stubborn).unwrap());
    assert!(
        polite_message.contains("left running by an earlier agent process"),
        "{polite_message}"
    );
    assert!(polite_message.contains("ended after SIGTERM"), "{polite_message}");
    assert!(stubborn_message.contains("killed (SIGKILL)"), "{stubborn_message}");
    assert_eq!(polite_child.wait().unwrap().signal(), Some(15));
    assert_eq!(stubborn_child.wait().unwrap().signal(), Some(9));
    assert_eq!(other_child.try_wait().unwrap(), None, "another directory's rank was stopped");
    assert!(report.ranks.iter().all(|s| s.key.rank != 5), "{report:#?}");
    // The whole group: its shell and the `sleep` it waits on.
    let group = nix::unistd::Pid::from_raw(-i32::try_from(other_child.id()).unwrap());
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    other_child.wait().unwrap();
}
