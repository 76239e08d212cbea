//! The embedded queue end to end with real processes: a repairer (`scheduler = "embedded"`), five
//! real agents running ranks, and the real trainer. Two jobs with priorities on the fleet; a person
//! drains the node under rank 0 of the running job → it checkpoints, is requeued at the front,
//! resumes on healthy nodes (the spare among them) from its checkpoint, completes, and its final
//! weights hash equals an uninterrupted run's, bit for bit. Then the second job runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleetmend_local::up::fleet::rendezvous_ports;
use fleetmend_tests::{
    Running, fixture, fixture_flags, fleetmend_bin, free_port, poll_until, run_with_timeout,
    start_agent, uninterrupted_hash,
};
use serde_json::Value;

const ADMIN: &str = "admin-secret";
const AGENT: &str = "agent-secret";
/// Steps of the big job: long enough to drain a node in the middle of it.
const STEPS: u64 = 40;
const SEED: u64 = 11;
/// Longest any run or phase of this test may take on two loaded cores (debug build): well inside
/// the test's own time limit, so that a phase that hangs says where.
const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// The queued jobs' pace: the small model computes a step in a few milliseconds, and the drain
/// must find the big job running (40 steps, ~8 s).
const PACE: &str = "200ms";

/// The trainer's arguments, the same for the uninterrupted run and the queued one but for the
/// pace, which changes no number the job computes.
fn train_argv(steps: u64, paced: bool) -> Vec<String> {
    let mut argv: Vec<String> = [
        fleetmend_bin().display().to_string(),
        "train".to_owned(),
        "--steps".to_owned(),
        steps.to_string(),
        "--seed".to_owned(),
        SEED.to_string(),
        "--checkpoint-every".to_owned(),
        "5".to_owned(),
        "--collective-timeout".to_owned(),
        "10s".to_owned(),
    ]
    .to_vec();
    argv.extend(
        ["--model-dim", "32", "--layers", "1", "--batch-size", "4", "--context", "32"]
            .map(str::to_owned),
    );
    if paced {
        argv.extend(["--pace".to_owned(), PACE.to_owned()]);
    }
    argv
}

/// The `done` line's weights hash in a trainer's output.
fn done_hash(output: &str) -> Option<String> {
    let last: Value =
        output.lines().rev().find_map(|line| serde_json::from_str::<Value>(line).ok())?;
    (last["event"] == "done").then(|| last["weights_sha256"].as_str().unwrap_or("").to_owned())
}

fn cli(repairer: SocketAddr, args: &[&str]) -> (Option<i32>, String, String) {
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(args)
            .env("FLEETMEND_REPAIRER", format!("http://{repairer}"))
            .env("FLEETMEND_TOKEN", ADMIN)
            .env("USER", "alice"),
        Duration::from_secs(20),
    );
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn job(repairer: SocketAddr, id: &str) -> Value {
    let (_, out, _) = cli(repairer, &["jobs", id, "--output", "json"]);
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

fn submit(
    repairer: SocketAddr,
    dir: &Path,
    name: &str,
    nodes: u32,
    priority: i32,
    steps: u64,
) -> String {
    let checkpoints = dir.join(format!("{name}-checkpoints"));
    let (nodes, priority) = (nodes.to_string(), priority.to_string());
    let mut args = vec![
        "submit",
        "--output",
        "json",
        "--name",
        name,
        "--nodes",
        &nodes,
        "--priority",
        &priority,
        "--max-restarts",
        "3",
        "--checkpoint-dir",
        checkpoints.to_str().unwrap(),
        "--",
    ];
    let argv = train_argv(steps, true);
    args.extend(argv.iter().map(String::as_str));
    let (code, out, err) = cli(repairer, &args);
    assert_eq!(code, Some(0), "{out}{err}");
    let job: Value = serde_json::from_str(&out).unwrap();
    job["id"].as_str().unwrap().to_owned()
}

struct Fleet {
    dir: PathBuf,
    repairer_addr: SocketAddr,
    repairer: Running,
    agents: Vec<Running>,
}

impl Fleet {
    fn start(dir: &Path) -> Fleet {
        // Rank 0's ports below the ephemeral range, where the suite's other listeners and
        // connections take theirs (a port taken there fails the attempt with "address in use").
        let (port_min, port_max) = rendezvous_ports(Path::new("/proc"));
        // The drain's workflow waits its checkpoint grace before it requeues; by then the queue
        // has stopped the job and restarted it elsewhere, and the restarted attempt must be left
        // running (3 s makes that ordering the usual one, not a rare one).
        let (repairer_addr, repairer) = fleetmend_tests::repairer_in(
            dir,
            &format!(
                "agent_token = \"{AGENT}\"\nadmin_token = \"{ADMIN}\"\nscheduler = \"embedded\"\n\
                 [engine]\ntick = \"100ms\"\n[engine.workflow]\ncheckpoint_grace = \"3s\"\n\
                 [queue]\ntick = \"100ms\"\nstart_timeout = \"60s\"\ncheckpoint_grace = \"20s\"\n\
                 stop_grace = \"20s\"\nmaster_port_min = {port_min}\nmaster_port_max = {port_max}\n",
            ),
        );
        Fleet { dir: dir.to_owned(), repairer_addr, repairer, agents: Vec::new() }
    }

    fn jobs_dir(&self, node: &str) -> PathBuf {
        self.dir.join(format!("jobs-{node}"))
    }

    fn start_agent(&mut self, node: &str) {
        let case = fixture("healthy");
        let config = self.dir.join(format!("agent-{node}.toml"));
        std::fs::write(
            &config,
            format!(
                "{}\n[report]\nrepairer = \"http://{}\"\ntoken = \"{AGENT}\"\ninterval = \"300ms\"\n\
                 [jobs]\nenabled = true\ndir = \"{}\"\nadvertise_address = \"127.0.0.1\"\nstop_grace = \"10s\"\n",
                std::fs::read_to_string(case.join("agent.toml")).unwrap(),
                self.repairer_addr,
                self.jobs_dir(node).display(),
            ),
        )
        .unwrap();
        let mut flags = fixture_flags(&case);
        flags.push(format!("--config={}", config.display()));
        flags.push(format!("--node={node}"));
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        self.agents.push(start_agent(&self.dir, listen, &args));
    }

    fn diagnostics(&self) -> String {
        let (_, events, _) = cli(self.repairer_addr, &["events", "--limit", "60"]);
        let mut text =
            format!("audit trail:\n{events}\nrepairer stderr:\n{}\n", self.repairer.stderr());
        for agent in &self.agents {
            let stderr = agent.stderr();
            let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
            text.push_str(&format!(
                "agent:\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        text
    }

    /// rank.log of `rank` of `attempt` of `job` on `node`.
    fn rank_log(&self, node: &str, job: &str, attempt: u64, rank: u64) -> String {
        let path = self
            .jobs_dir(node)
            .join(job)
            .join(format!("attempt-{attempt}"))
            .join(format!("rank-{rank}"))
            .join("rank.log");
        std::fs::read_to_string(&path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
    }
}

fn nodes_of(job: &Value) -> Vec<String> {
    job["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_owned()).collect()
}

#[test]
fn a_drained_node_under_a_running_job_costs_no_work_and_no_bits() {
    let dir = tempfile::tempdir().unwrap();
    let straight =
        uninterrupted_hash(&dir.path().join("straight"), train_argv(STEPS, false), 4, PHASE_LIMIT);

    let mut fleet = Fleet::start(dir.path());
    let addr = fleet.repairer_addr;
    // Both jobs wait for nodes: the low-priority one was submitted first, the big one must run
    // first all the same.
    let small = submit(addr, dir.path(), "small", 2, 0, 6);
    let big = submit(addr, dir.path(), "big", 4, 10, STEPS);
    assert_eq!(job(addr, &small)["state"], "queued");
    assert_eq!(job(addr, &big)["state"], "queued");
    for node in ["node-1", "node-2", "node-3", "node-4", "node-5"] {
        fleet.start_agent(node);
    }

    let running_past = |id: &str, step: u64| {
        let job = job(addr, id);
        job["state"] == "running" && job["step"].as_u64().is_some_and(|s| s >= step)
    };
    assert!(
        poll_until(PHASE_LIMIT, || running_past(&big, 12)),
        "the big job did not get past step 12: {:#}\n{}",
        job(addr, &big),
        fleet.diagnostics()
    );
    // Gang allocation with no backfill: one node is free, the small job needs two and waits.
    assert_eq!(job(addr, &small)["state"], "queued", "{:#}", job(addr, &small));
    let first = job(addr, &big);
    let first_nodes = nodes_of(&first);
    assert_eq!(first_nodes.len(), 4);

    // A person drains the node under rank 0 (it hosts the rendezvous and writes the checkpoints).
    let victim = first_nodes[0].clone();
    let (code, out, err) = cli(addr, &["drain", &victim]);
    assert_eq!(code, Some(0), "{out}{err}");

    assert!(
        poll_until(PHASE_LIMIT, || {
            let job = job(addr, &big);
            job["attempt"] == 1 && job["state"] == "running"
        }),
        "the big job was not resumed: {:#}\n{}",
        job(addr, &big),
        fleet.diagnostics()
    );
    let resumed = job(addr, &big);
    let resumed_nodes = nodes_of(&resumed);
    assert!(!resumed_nodes.contains(&victim), "resumed on the drained node: {resumed_nodes:?}");
    assert_eq!(resumed["restarts"], 1);

    assert!(
        poll_until(PHASE_LIMIT, || job(addr, &big)["state"] == "completed"),
        "the big job did not complete: {:#}\n{}",
        job(addr, &big),
        fleet.diagnostics()
    );
    let done = job(addr, &big);
    // The first attempt was stopped by SIGTERM after a checkpoint at its last step: the second
    // resumed exactly there and lost nothing.
    let (first_attempt, second_attempt) = (&done["history"][0], &done["history"][1]);
    let last_step = first_attempt["last_step"].as_u64().unwrap();
    assert!(last_step >= 12, "{:#}", done["history"]);
    assert_eq!(second_attempt["resumed_from_step"], last_step, "{:#}", done["history"]);
    assert_eq!(second_attempt["steps_lost"], 0, "{:#}", done["history"]);
    let log = fleet.rank_log(&resumed_nodes[0], &big, 1, 0);
    assert!(log.contains("resum"), "the second attempt did not resume from a checkpoint:\n{log}");
    assert_eq!(
        done_hash(&log).as_deref(),
        Some(straight.as_str()),
        "the resumed run's weights differ from the uninterrupted run's:\n{log}"
    );

    // The small job ran once the big one was done.
    assert!(
        poll_until(PHASE_LIMIT, || job(addr, &small)["state"] == "completed"),
        "the small job did not complete: {:#}\n{}",
        job(addr, &small),
        fleet.diagnostics()
    );
    let small_started = job(addr, &small)["history"][0]["started_ms"].as_u64().unwrap();
    let big_finished = done["finished_ms"].as_u64().unwrap();
    assert!(small_started >= big_finished, "the small job started before the big one finished");

    // The audit trail tells the story in order.
    let (_, events, _) = cli(addr, &["events", "--limit", "1000", "--output", "json"]);
    let events: Vec<Value> = serde_json::from_str(&events).unwrap();
    let story: Vec<&str> = events
        .iter()
        .filter(|e| e["reason"].as_str().is_some_and(|r| r.starts_with(&format!("job {big} "))))
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    let expected = [
        "job-submitted",
        "job-started",
        "job-checkpoint-requested",
        "job-requeued",
        "job-started",
        "job-completed",
    ];
    let mut rest = story.iter();
    for kind in expected {
        assert!(rest.any(|k| *k == kind), "{kind} missing or out of order in {story:?}");
    }
    let drained = events.iter().any(|e| e["node"] == victim.as_str() && e["to_state"] == "drained");
    let (_, nodes, _) = cli(addr, &["nodes", "--output", "json"]);
    assert!(drained || nodes.contains("drained"), "the drained node is not shown drained: {nodes}");

    for agent in &mut fleet.agents {
        agent.terminate(Duration::from_secs(20));
    }
}
