//! The real agent runs the commands a stand-in repairer sends in its replies: a deep check on the
//! healthy fixture, one with a failing probe, a reboot whose command writes a marker file (not a
//! real reboot), an unknown kind, and a repeated id.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use fleetmend_proto::{
    CommandResult, NodeCommand, Report, ReportReply, ReportTrigger, Status, Verdict, command_kind,
};
use fleetmend_tests::{Running, fixture, fixture_flags, free_port, poll_until, start_agent};

/// A stand-in repairer: keeps every report with its arrival time and answers each with the next
/// batch of commands it was given (one batch per reply, in order). It also writes
/// `<results>/<id>.result` for every command result received, so a process on the node can tell
/// whether a result reached it.
#[derive(Clone)]
struct Repairer {
    reports: Arc<Mutex<Vec<(Instant, Report)>>>,
    batches: Arc<Mutex<VecDeque<Vec<NodeCommand>>>>,
    results: Arc<tempfile::TempDir>,
}

impl Repairer {
    fn reports(&self) -> Vec<(Instant, Report)> {
        self.reports.lock().unwrap().clone()
    }

    /// Every command result received, in arrival order, with the report that carried it.
    fn results(&self) -> Vec<(Instant, ReportTrigger, CommandResult)> {
        self.reports()
            .into_iter()
            .flat_map(|(at, report)| {
                report.command_results.into_iter().map(move |r| (at, report.trigger, r))
            })
            .collect()
    }

    fn results_for(&self, id: &str) -> Vec<CommandResult> {
        self.results().into_iter().map(|(_, _, r)| r).filter(|r| r.id == id).collect()
    }

    fn then_send(&self, commands: Vec<NodeCommand>) {
        self.batches.lock().unwrap().push_back(commands);
    }
}

async fn receive(
    State(repairer): State<Repairer>,
    body: axum::body::Bytes,
) -> (StatusCode, Json<ReportReply>) {
    let Ok(report) = serde_json::from_slice::<Report>(&body) else {
        return (StatusCode::BAD_REQUEST, Json(ReportReply::default()));
    };
    // Kept before the reply leaves: whatever the agent does once the report is delivered happens
    // after it is on this list and its result files exist.
    for result in &report.command_results {
        let file = repairer.results.path().join(format!("{}.result", result.id));
        std::fs::write(file, &result.message).unwrap();
    }
    repairer.reports.lock().unwrap().push((Instant::now(), report));
    let commands = repairer.batches.lock().unwrap().pop_front().unwrap_or_default();
    (StatusCode::OK, Json(ReportReply { commands }))
}

/// Serves a stand-in repairer on a free port in a background thread until the process ends.
fn serve_repairer() -> (Repairer, u16) {
    let repairer = Repairer {
        reports: Arc::default(),
        batches: Arc::default(),
        results: Arc::new(tempfile::tempdir().unwrap()),
    };
    let port = free_port();
    let state = repairer.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
            ready_tx.send(()).unwrap();
            let app = axum::Router::new().route("/v1/reports", post(receive)).with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).expect("stand-in repairer listening");
    (repairer, port)
}

fn command(id: &str, kind: &str) -> NodeCommand {
    NodeCommand { id: id.to_owned(), kind: kind.to_owned(), args: Default::default() }
}

/// Starts the agent on the healthy fixture, reporting to `port`, with `commands` appended to the
/// fixture's config. The report interval is a minute: every report in a test is a startup, an
/// event or a command report.
fn start(dir: &Path, node: &str, port: u16, commands: &str) -> Running {
    let case = fixture("healthy");
    let base = std::fs::read_to_string(case.join("agent.toml")).unwrap();
    let config = format!(
        "{base}\n[report]\nrepairer = \"http://127.0.0.1:{port}\"\ninterval = \"60s\"\nbackoff_initial = \"100ms\"\nbackoff_max = \"400ms\"\n\n{commands}\n"
    );
    let path: PathBuf = dir.join("agent.toml");
    std::fs::write(&path, config).unwrap();
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", path.display()));
    flags.push(format!("--node={node}"));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    start_agent(dir, SocketAddr::from(([127, 0, 0, 1], free_port())), &args)
}

#[test]
fn deep_checks_unknown_kinds_and_repeated_ids() {
    let dir = tempfile::tempdir().unwrap();
    let (repairer, port) = serve_repairer();
    // The reply to the startup report carries the first batch, the reply to the next report the
    // second: dc-1 again (a repeat, not run) and dc-2 (run after where a second dc-1 would be).
    repairer.then_send(vec![
        command("dc-1", command_kind::DEEP_CHECK),
        command("dc-1", command_kind::DEEP_CHECK),
        command("x-1", "format-disks"),
    ]);
    repairer.then_send(vec![
        command("dc-1", command_kind::DEEP_CHECK),
        command("dc-2", command_kind::DEEP_CHECK),
    ]);
    let agent = start(dir.path(), "cmd-node-1", port, "");

    assert!(
        poll_until(Duration::from_secs(30), || !repairer.results_for("dc-2").is_empty()),
        "no result for dc-2; results so far: {:#?}\n{}",
        repairer.results(),
        agent.stderr()
    );
    let reports = repairer.reports();
    assert_eq!(reports[0].1.trigger, ReportTrigger::Startup);

    let dc1 = repairer.results_for("dc-1");
    assert_eq!(dc1.len(), 1, "dc-1 ran more than once: {dc1:#?}");
    let dc1 = &dc1[0];
    assert_eq!(dc1.kind, command_kind::DEEP_CHECK);
    assert!(dc1.ok, "{dc1:#?}");
    assert_eq!(dc1.verdict, Some(Verdict::Healthy));
    assert!(dc1.findings.iter().all(|f| f.status != Status::Ok), "{dc1:#?}");
    let (_, trigger, _) = repairer.results().into_iter().find(|(_, _, r)| r.id == "dc-1").unwrap();
    assert_eq!(trigger, ReportTrigger::Command);

    let unknown = repairer.results_for("x-1");
    assert_eq!(unknown.len(), 1, "{unknown:#?}");
    assert!(!unknown[0].ok);
    assert!(unknown[0].message.contains("unsupported command kind"), "{}", unknown[0].message);

    // Each result travelled in exactly one report: the stand-in accepted every one.
    assert_eq!(repairer.results_for("dc-2").len(), 1);
    // The deep check's runs are the agent's state: the report carrying the result shows them.
    let (_, carrying) =
        reports.iter().find(|(_, r)| r.command_results.iter().any(|c| c.id == "dc-2")).unwrap();
    assert_eq!(carrying.verdict, Verdict::Healthy);
    assert_eq!(carrying.checks.len(), 6, "{:#?}", carrying.checks);
}

#[test]
fn a_failing_probe_fails_the_deep_check() {
    let dir = tempfile::tempdir().unwrap();
    let (repairer, port) = serve_repairer();
    repairer.then_send(vec![command("dc-1", command_kind::DEEP_CHECK)]);
    let probes = "[commands]\n\
        [[commands.deep_check_probes]]\nname = \"passes\"\nargv = [\"true\"]\ntimeout = \"10s\"\n\
        [[commands.deep_check_probes]]\nname = \"always-fails\"\nargv = [\"false\"]\ntimeout = \"10s\"\n";
    let agent = start(dir.path(), "cmd-node-2", port, probes);

    assert!(
        poll_until(Duration::from_secs(30), || !repairer.results_for("dc-1").is_empty()),
        "no result for dc-1:\n{}",
        agent.stderr()
    );
    let result = &repairer.results_for("dc-1")[0];
    assert!(!result.ok, "{result:#?}");
    assert_eq!(result.verdict, Some(Verdict::Unhealthy));
    let failed: Vec<_> = result.findings.iter().filter(|f| f.finding == "probe_failed").collect();
    assert_eq!(failed.len(), 1, "{result:#?}");
    assert_eq!(
        (failed[0].check.as_str(), failed[0].subject.as_str(), failed[0].status),
        ("deep_check", "always-fails", Status::Fail)
    );
    assert_eq!(failed[0].action, fleetmend_proto::RecommendedAction::Drain);
}

#[test]
fn reboot_reports_started_then_runs_the_configured_command() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("rebooted");
    let (repairer, port) = serve_repairer();
    repairer.then_send(vec![command("rb-1", command_kind::REBOOT)]);
    // The "reboot" notes whether the repairer had the "reboot started" result when it ran. And
    // reboot_delay is far longer than the test may take: the command can only run this soon
    // because that report was delivered.
    let seen = repairer.results.path().join("rb-1.result");
    let script = format!(
        "if [ -e '{}' ]; then echo rebooted > '{}'; else echo too-early > '{}'; fi",
        seen.display(),
        marker.display(),
        marker.display()
    );
    let commands =
        format!("[commands]\nreboot = [\"sh\", \"-c\", {script:?}]\nreboot_delay = \"10m\"\n");
    let agent = start(dir.path(), "cmd-node-3", port, &commands);

    assert!(
        poll_until(Duration::from_secs(20), || marker.exists()),
        "the reboot command did not run; results: {:#?}\n{}",
        repairer.results(),
        agent.stderr()
    );
    assert!(
        poll_until(Duration::from_secs(5), || std::fs::read_to_string(&marker)
            .is_ok_and(|text| text.ends_with('\n'))),
        "the marker was not written whole"
    );
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "rebooted\n",
        "the reboot ran before the repairer had its \"reboot started\""
    );
    let results = repairer.results_for("rb-1");
    assert_eq!(results.len(), 1, "{results:#?}");
    assert!(results[0].ok);
    assert_eq!(results[0].message, "reboot started");
}
