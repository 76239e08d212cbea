//! The agent's command executor in process, on the healthy fixture: deep checks with and without
//! failing probes, probes that hang or cannot start, reboots that wait for their "reboot started"
//! to be delivered, refused and unknown commands, and repeated ids. (The system test
//! `tests/tests/agent_commands.rs` runs the same commands through the real binary and a stand-in
//! repairer.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use fleetmend_agent::checks::{self, Mode};
use fleetmend_agent::commands::{Commands, DEEP_CHECK, PROBE_FAILED};
use fleetmend_agent::config::{
    AgentConfig, CommandsConfig, EvidenceCommand, EvidenceConfig, HostPaths, ProbeConfig,
};
use fleetmend_agent::gpu::GpuBackendSpec;
use fleetmend_agent::node::NodeIdentity;
use fleetmend_agent::runner::{AgentState, CheckSlot};
use fleetmend_proto::{
    CommandResult, NodeCommand, RecommendedAction, Status, Verdict, command_kind,
};
use support::fixture;

/// An agent on the healthy fixture with its executor running; nothing delivers reports, so tests
/// call `outbox().delivered` themselves where a delivery matters.
struct Agent {
    commands: Arc<Commands>,
    state: Arc<AgentState>,
}

impl Agent {
    fn start(node: &str, commands: CommandsConfig) -> Agent {
        let case = fixture("healthy");
        let text = std::fs::read_to_string(case.join("agent.toml")).unwrap();
        let mut config = AgentConfig::parse(&text).unwrap();
        config.paths = HostPaths::tree(&case);
        config.checks.gpu.backend = GpuBackendSpec::Fixture(case.join("gpu.json"));
        config.commands = commands;
        assert!(config.validate().is_empty(), "{}", config.validate());
        let paths = Arc::new(config.paths.clone());
        let slots: Vec<Arc<CheckSlot>> = checks::build(&config, node, Mode::Once)
            .into_iter()
            .map(|scheduled| Arc::new(CheckSlot::new(scheduled)))
            .collect();
        let state = Arc::new(AgentState::new(NodeIdentity::discover(Some(node), &paths)));
        let (commands, executor) =
            Commands::new(config.commands.clone(), slots, paths, Arc::clone(&state));
        tokio::spawn(executor.run());
        Agent { commands, state }
    }

    fn submit(&self, id: &str, kind: &str) {
        self.commands.submit(NodeCommand {
            id: id.to_owned(),
            kind: kind.to_owned(),
            args: Default::default(),
        });
    }

    /// Polls the outbox until `count` results for `id` wait there; panics after `within`.
    async fn results(&self, id: &str, count: usize, within: Duration) -> Vec<CommandResult> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let results: Vec<CommandResult> =
                self.commands.outbox().pending().into_iter().filter(|r| r.id == id).collect();
            if results.len() >= count {
                return results;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{count} result(s) for {id} not within {within:?}; outbox: {:#?}",
                self.commands.outbox().pending()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn result(&self, id: &str) -> CommandResult {
        self.results(id, 1, Duration::from_secs(30)).await.remove(0)
    }
}

fn probe(name: &str, argv: &[&str], timeout: Duration) -> ProbeConfig {
    ProbeConfig {
        name: name.to_owned(),
        argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        timeout,
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deep_check_on_the_healthy_fixture_passes_and_refreshes_the_state() {
    let agent = Agent::start("cmd-healthy", CommandsConfig::default());
    assert!(agent.state.results().is_empty());
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let result = agent.result("dc-1").await;
    assert!(result.ok, "{result:#?}");
    assert_eq!(result.kind, command_kind::DEEP_CHECK);
    assert_eq!(result.verdict, Some(Verdict::Healthy), "{result:#?}");
    assert!(result.findings.iter().all(|f| f.status != Status::Ok), "{result:#?}");
    assert!(result.message.starts_with("healthy: 6 checks and 0 probes"), "{}", result.message);
    // The fresh runs are the agent's state now: /metrics and the next report show them.
    let recorded: Vec<&str> = agent.state.results().iter().map(|r| r.check).collect();
    assert_eq!(recorded, ["gpu", "kernel_log", "nic", "pcie", "disk", "host"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_probe_fails_the_deep_check_with_a_probe_failed_finding() {
    let commands = CommandsConfig {
        deep_check_probes: vec![
            probe("always-fails", &["false"], Duration::from_secs(10)),
            probe("passes", &["true"], Duration::from_secs(10)),
            probe(
                "loud",
                &["sh", "-c", "echo ok >&2; echo 'link 3: 11 GB/s' >&2; exit 3"],
                Duration::from_secs(10),
            ),
        ],
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-probe", commands);
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let result = agent.result("dc-1").await;
    assert!(!result.ok, "{result:#?}");
    assert_eq!(result.verdict, Some(Verdict::Unhealthy));
    let failed: Vec<_> = result.findings.iter().filter(|f| f.finding == PROBE_FAILED).collect();
    let subjects: Vec<&str> = failed.iter().map(|f| f.subject.as_str()).collect();
    assert_eq!(subjects, ["always-fails", "loud"], "{result:#?}");
    for finding in &failed {
        assert_eq!(finding.check, DEEP_CHECK);
        assert_eq!((finding.status, finding.action), (Status::Fail, RecommendedAction::Drain));
    }
    assert!(failed[0].message.contains("exited with status 1"), "{}", failed[0].message);
    // The end of stderr says why.
    assert!(failed[1].message.contains("exited with status 3"), "{}", failed[1].message);
    assert!(failed[1].message.ends_with("ok\nlink 3: 11 GB/s"), "{}", failed[1].message);
    assert!(
        result.message.contains("deep_check/probe_failed always-fails (fail)"),
        "{}",
        result.message
    );
    // Probe findings belong to the command, not to the node's standing state.
    assert!(agent.state.results().iter().all(|r| r.check != DEEP_CHECK));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_probe_is_killed_with_its_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("helper.pid");
    let script = format!(
        "sleep 300 & echo $! > {}; echo 'waiting for the fabric' >&2; wait",
        pidfile.display()
    );
    let commands = CommandsConfig {
        deep_check_probes: vec![ProbeConfig {
            name: "hangs".to_owned(),
            argv: sh(&script),
            timeout: Duration::from_millis(500),
        }],
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-hang", commands);
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let result = agent.result("dc-1").await;
    assert!(!result.ok);
    let finding = result.findings.iter().find(|f| f.finding == PROBE_FAILED).unwrap();
    assert!(finding.message.contains("timed out after 500ms"), "{}", finding.message);
    assert!(finding.message.contains("waiting for the fabric"), "{}", finding.message);
    // The helper the probe started in the background went with it.
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(
        support::eventually(Duration::from_secs(5), || !process_alive(pid)),
        "the probe's helper {pid} outlived it"
    );
}

/// Whether `pid` runs (a zombie waiting for its reaper does not).
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn probes_share_the_deep_check_timeout_and_a_missing_program_fails() {
    let commands = CommandsConfig {
        deep_check_timeout: Duration::from_secs(2),
        deep_check_probes: vec![
            probe("no-such-tool", &["/nonexistent/dcgmi", "diag"], Duration::from_secs(10)),
            probe("slow", &["sleep", "30"], Duration::from_secs(60)),
            probe("never-reached", &["true"], Duration::from_secs(10)),
        ],
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-budget", commands);
    let started = std::time::Instant::now();
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let result = agent.result("dc-1").await;
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(!result.ok);
    let message = |subject: &str| {
        result
            .findings
            .iter()
            .find(|f| f.finding == PROBE_FAILED && f.subject == subject)
            .unwrap_or_else(|| panic!("no probe_failed for {subject}: {result:#?}"))
            .message
            .clone()
    };
    assert!(message("no-such-tool").contains("could not run"), "{}", message("no-such-tool"));
    assert!(message("slow").contains("the deep check's time ran out"), "{}", message("slow"));
    assert!(message("never-reached").contains("not run"), "{}", message("never-reached"));
}

#[tokio::test(flavor = "multi_thread")]
async fn reboot_says_started_waits_for_the_delivery_then_runs_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("rebooted");
    let commands = CommandsConfig {
        reboot: sh(&format!("echo rebooted > {}", marker.display())),
        // Far longer than the test: only the delivery can let the reboot run this soon.
        reboot_delay: Duration::from_secs(600),
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-reboot", commands);
    agent.submit("rb-1", command_kind::REBOOT);
    let started = agent.result("rb-1").await;
    assert!(started.ok);
    assert_eq!(started.message, "reboot started");
    assert!(!marker.exists(), "the reboot ran before its result was delivered");
    agent.commands.outbox().delivered(&agent.commands.outbox().pending());
    assert!(
        support::eventually(Duration::from_secs(10), || marker.exists()),
        "the reboot command did not run after the delivery"
    );
    // It succeeded: no further result.
    assert!(agent.commands.outbox().is_empty(), "{:#?}", agent.commands.outbox().pending());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_undelivered_reboot_runs_after_the_delay_and_a_failure_is_reported() {
    let commands = CommandsConfig {
        reboot: sh("echo 'Failed to reboot: Access denied' >&2; exit 1"),
        reboot_delay: Duration::from_millis(200),
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-reboot-fails", commands);
    agent.submit("rb-1", command_kind::REBOOT);
    let results = agent.results("rb-1", 2, Duration::from_secs(10)).await;
    assert!(results[0].ok && results[0].message == "reboot started", "{results:#?}");
    assert!(!results[1].ok);
    assert!(results[1].message.contains("exited with status 1"), "{}", results[1].message);
    assert!(results[1].message.ends_with("Access denied"), "{}", results[1].message);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_reboot_command_refuses_reboots() {
    let commands = CommandsConfig { reboot: Vec::new(), ..CommandsConfig::default() };
    let agent = Agent::start("cmd-no-reboot", commands);
    agent.submit("rb-1", command_kind::REBOOT);
    let result = agent.result("rb-1").await;
    assert!(!result.ok);
    assert!(result.message.starts_with("reboot refused"), "{}", result.message);
    assert_eq!(agent.commands.outbox().pending().len(), 1, "no 'reboot started' may precede it");
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_kinds_and_missing_ids_get_a_failed_result() {
    let agent = Agent::start("cmd-unknown", CommandsConfig::default());
    agent.submit("x-1", "format-disks");
    let result = agent.result("x-1").await;
    assert!(!result.ok);
    assert!(
        result.message.starts_with("unsupported command kind \"format-disks\""),
        "{}",
        result.message
    );
    agent.submit("", command_kind::REBOOT);
    let result = agent.result("").await;
    assert!(!result.ok);
    assert!(result.message.contains("no id"), "{}", result.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_id_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let commands = CommandsConfig {
        deep_check_probes: vec![ProbeConfig {
            name: "count".to_owned(),
            argv: sh(&format!("echo run >> {}", runs.display())),
            timeout: Duration::from_secs(10),
        }],
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-repeat", commands);
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let first = agent.result("dc-1").await;
    assert!(first.ok, "{first:#?}");
    // Delivered, then sent again (a repairer retrying): still not run again. dc-2 runs after it
    // would have, so once dc-2 is done a second dc-1 run would show.
    agent.commands.outbox().delivered(&agent.commands.outbox().pending());
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    agent.submit("dc-2", command_kind::DEEP_CHECK);
    agent.result("dc-2").await;
    assert!(agent.commands.outbox().pending().iter().all(|r| r.id != "dc-1"));
    let lines = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(lines.lines().count(), 2, "dc-1 once and dc-2 once: {lines:?}");
}

/// A check that takes `takes` per run and counts its runs.
struct SlowCheck {
    takes: Duration,
    runs: Arc<std::sync::atomic::AtomicUsize>,
}

impl fleetmend_agent::checks::Check for SlowCheck {
    fn name(&self) -> &'static str {
        "slow"
    }

    fn run(&mut self, _ctx: &fleetmend_agent::checks::RunContext<'_>) -> checks::Observation {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(self.takes);
        checks::Observation {
            findings: vec![fleetmend_proto::Finding::ok("slow", "slow", "")],
            samples: Vec::new(),
        }
    }
}

fn slow_slot(takes: Duration, runs: &Arc<std::sync::atomic::AtomicUsize>) -> Arc<CheckSlot> {
    Arc::new(CheckSlot::new(checks::ScheduledCheck {
        check: Box::new(SlowCheck { takes, runs: Arc::clone(runs) }),
        schedule: fleetmend_agent::config::Schedule {
            enabled: true,
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(30),
        },
        events: checks::EventSignal::default(),
    }))
}

/// The executor over one slow check that its own loop is running right now.
async fn busy_agent(
    takes: Duration,
    commands: CommandsConfig,
) -> (Arc<Commands>, Arc<AgentState>, Arc<std::sync::atomic::AtomicUsize>) {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let slot = slow_slot(takes, &runs);
    let paths = Arc::new(HostPaths::tree(&fixture("healthy")));
    let state = Arc::new(AgentState::new(NodeIdentity::discover(Some("cmd-busy"), &paths)));
    let looping = (Arc::clone(&slot), Arc::clone(&paths));
    tokio::spawn(async move { looping.0.run(&looping.1).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runs.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the loop's run did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (handle, executor) = Commands::new(commands, vec![slot], paths, Arc::clone(&state));
    tokio::spawn(executor.run());
    (handle, state, runs)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deep_check_waits_for_a_check_its_loop_is_running_then_runs_it_afresh() {
    let (commands, state, runs) =
        busy_agent(Duration::from_millis(400), CommandsConfig::default()).await;
    let agent = Agent { commands, state };
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let result = agent.result("dc-1").await;
    assert!(result.ok, "{result:#?}");
    assert!(result.findings.is_empty(), "a busy check is not a timeout: {result:#?}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    let recorded = agent.state.results();
    assert_eq!(recorded.len(), 1);
    assert!(!recorded[0].timed_out);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_check_that_outlasts_the_deep_check_is_named_and_not_recorded() {
    let commands = CommandsConfig {
        deep_check_timeout: Duration::from_millis(500),
        ..CommandsConfig::default()
    };
    let (commands, state, _runs) = busy_agent(Duration::from_secs(3), commands).await;
    let agent = Agent { commands, state };
    let started = std::time::Instant::now();
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let result = agent.result("dc-1").await;
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    let timeout = result.findings.iter().find(|f| f.finding == "check_timeout").unwrap();
    assert_eq!((timeout.check.as_str(), timeout.status), ("slow", Status::Unknown));
    // An unknown is no failure: the verdict, and so the command, still pass.
    assert!(result.ok, "{result:#?}");
    assert_eq!(result.verdict, Some(Verdict::Healthy));
    assert!(agent.state.results().is_empty(), "{:#?}", agent.state.results());
}

fn tool(name: &str, script: &str, timeout: Duration, output_file: Option<&str>) -> EvidenceCommand {
    EvidenceCommand {
        name: name.to_owned(),
        argv: sh(script),
        timeout,
        output_file: output_file.map(str::to_owned),
    }
}

/// An evidence bundle comes back within its budget while a long deep check runs: every item
/// bounded (output cut to its cap, a late tool cut off with what it printed, a large output file
/// left on the node and named, a small one sent), a tool that is not installed left out.
#[tokio::test(flavor = "multi_thread")]
async fn an_evidence_bundle_is_bounded_and_never_waits_behind_a_deep_check() {
    let dir = tempfile::tempdir().unwrap();
    let evidence = EvidenceConfig {
        dir: dir.path().to_owned(),
        output_bytes: 2048,
        commands: vec![
            tool(
                "smi",
                "echo 'GPU 00000000:03:00.0'; echo '    Product Name : H200'",
                Duration::from_secs(10),
                None,
            ),
            tool(
                "big-report",
                "head -c 4000 /dev/urandom > report.bin",
                Duration::from_secs(10),
                Some("report.bin"),
            ),
            tool(
                "small-report",
                "printf 'abc' > small.bin",
                Duration::from_secs(10),
                Some("small.bin"),
            ),
            tool("slow", "echo started; exec sleep 30", Duration::from_secs(1), None),
            EvidenceCommand {
                name: "absent".to_owned(),
                argv: vec!["fleetmend-no-such-tool".to_owned()],
                timeout: Duration::from_secs(1),
                output_file: None,
            },
        ],
        ..EvidenceConfig::default()
    };
    let commands = CommandsConfig {
        deep_check_probes: vec![probe("long", &["sleep", "20"], Duration::from_secs(30))],
        evidence,
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-evidence", commands);
    agent.submit("dc-1", command_kind::DEEP_CHECK);
    let started = std::time::Instant::now();
    agent.commands.submit(NodeCommand {
        id: "ev-1".to_owned(),
        kind: command_kind::EVIDENCE.to_owned(),
        args: [("budget_ms".to_owned(), serde_json::Value::from(5_000))].into(),
    });
    let result = agent.result("ev-1").await;
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(
        agent.commands.outbox().pending().iter().all(|r| r.id != "dc-1"),
        "the deep check still runs"
    );
    assert!(result.ok, "{result:?}");
    let bundle = result.evidence.expect("a bundle");
    assert_eq!(bundle.node, "cmd-evidence");
    let names: Vec<&str> = bundle.items.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["kernel-log", "findings", "smi", "big-report", "small-report", "slow"]);
    let item = |name: &str| bundle.items.iter().find(|i| i.name == name).unwrap();
    assert!(item("smi").content.contains("Product Name : H200"));
    assert_eq!(item("smi").error, None);
    let big = item("big-report");
    assert!(big.truncated && big.content.is_empty() && big.bytes == 4000, "{big:?}");
    let kept_at = dir.path().join("ev-1").join("report.bin");
    assert!(big.error.as_deref().unwrap().contains(&kept_at.display().to_string()), "{big:?}");
    assert_eq!(std::fs::metadata(&kept_at).unwrap().len(), 4000);
    let small = item("small-report");
    assert_eq!((small.encoding.as_str(), small.content.as_str()), ("base64", "YWJj"));
    let slow = item("slow");
    assert_eq!(slow.content, "started\n");
    assert!(slow.error.as_deref().unwrap().contains("ran longer"), "{slow:?}");
    assert!(item("findings").content.contains("\"node\": \"cmd-evidence\""));
}

#[tokio::test(flavor = "multi_thread")]
async fn evidence_turned_off_answers_at_once_without_a_bundle() {
    let commands = CommandsConfig {
        evidence: EvidenceConfig { enabled: false, ..EvidenceConfig::default() },
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-no-evidence", commands);
    agent.submit("ev-1", command_kind::EVIDENCE);
    let result = agent.result("ev-1").await;
    assert!(!result.ok && result.evidence.is_none(), "{result:?}");
    assert!(result.message.contains("commands.evidence.enabled"), "{}", result.message);
}

fn allreduce_command(id: &str, rank: u32) -> NodeCommand {
    let probe = fleetmend_proto::probes::AllreduceProbe {
        probe: "allreduce-1".to_owned(),
        master_addr: "10.0.0.7".to_owned(),
        master_port: 29_400,
        rank,
        world_size: 2,
        nodes: vec!["peer".to_owned(), "cmd-allreduce".to_owned()],
        bytes: 4096,
        iterations: 2,
        timeout_ms: 5000,
    };
    fleetmend_proto::jobs::command_with_args(id.to_owned(), command_kind::ALLREDUCE, &probe)
}

/// The probe's program gets the ring's environment and its sizes as flags, and its JSON line
/// comes back as the measurement; one that prints none, or a bad command, fails with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn an_allreduce_command_runs_the_probe_with_the_rings_environment() {
    let script = "[ \"$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $FLEETMEND_JOB_ID $*\" = \
                  '1 2 10.0.0.7 29400 allreduce-1 --bytes=4096 --iterations=2 --timeout=5000ms' ] \
                  || { echo \"wrong: $RANK $MASTER_ADDR $*\" >&2; exit 3; }; \
                  echo '{\"bytes\":4096,\"world_size\":2,\"seconds\":0.5,\"busbw_gbps\":1.25}'";
    let mut argv = sh(script);
    argv.push("probe".to_owned());
    let commands = CommandsConfig { allreduce: argv, ..CommandsConfig::default() };
    let agent = Agent::start("cmd-allreduce", commands);
    agent.commands.submit(allreduce_command("ar-1", 1));
    let result = agent.result("ar-1").await;
    assert!(result.ok, "{result:#?}");
    assert_eq!(result.kind, command_kind::ALLREDUCE);
    let measured = result.allreduce.expect("a measurement");
    assert_eq!((measured.bytes, measured.busbw_gbps), (4096, 1.25));
    assert!(result.message.contains("1.250 GB/s"), "{}", result.message);

    let commands = CommandsConfig {
        allreduce: sh("echo 'rank 1 could not reach rank 0' >&2; exit 1"),
        ..CommandsConfig::default()
    };
    let agent = Agent::start("cmd-allreduce-fails", commands);
    agent.commands.submit(allreduce_command("ar-2", 1));
    let result = agent.result("ar-2").await;
    assert!(!result.ok && result.allreduce.is_none(), "{result:#?}");
    assert!(result.message.contains("could not reach rank 0"), "{}", result.message);

    agent.submit("ar-3", command_kind::ALLREDUCE);
    let result = agent.result("ar-3").await;
    assert!(!result.ok && result.message.starts_with("refused: "), "{}", result.message);
}
