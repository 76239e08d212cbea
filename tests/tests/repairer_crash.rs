//! The real repairer killed with SIGKILL at each step of a reboot workflow, then started again on
//! the same store and port: the workflow finishes exactly once, the node is rebooted exactly once
//! (a reboot that was done is not repeated, one in flight is not lost), and the restart disturbs
//! no other node.
//!
//! The same with two repairers sharing a PostgreSQL store (`failover_*`): the leader is killed at
//! each step and the standby takes the lead, resumes the workflow from the store and finishes it
//! exactly once; the takeover time is printed. The scripted agent reports to whichever repairer
//! leads, following a standby's 503 to the next repairer as real agents do. Skipped where
//! PostgreSQL is not installed, unless `FLEETMEND_REQUIRE_POSTGRES=1`.
//!
//! The repairer drives the `command` provider, whose reboot command appends the node's name to a
//! file, and the `memory` scheduler. A scripted agent in this test reports for four nodes every
//! 200 ms over plain HTTP, turns a node's boot id over once the reboot file names it, and answers
//! deep checks in its next report. To land a kill at a chosen step, the agent (or the reboot
//! command) holds back the one thing the workflow waits for at that step until the kill is done.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleetmend_proto::{
    CommandResult, EvidenceBundle, EvidenceItem, Finding, RecommendedAction, Report, ReportReply,
    ReportTrigger, Status, Verdict, WIRE_VERSION, command_kind,
};
use fleetmend_repairer::testing::PostgresCluster;
use fleetmend_tests::{
    Running, free_port, http_get, http_post_json, poll_until, start_repairer_in,
};
use serde_json::Value;

const NODES: [&str; 4] = ["n1", "n2", "n3", "n4"];
/// The node that gets the fault.
const SICK: &str = "n1";
const REPORT_INTERVAL: Duration = Duration::from_millis(200);
/// Generous: the test machine is shared and loaded.
const STEP_DEADLINE: Duration = Duration::from_secs(60);
const FINISH_DEADLINE: Duration = Duration::from_secs(120);
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Where in the workflow the repairer is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillPoint {
    /// The decision is recorded and the node is draining.
    AfterDecision,
    /// The drain call returned (the checkpoint step was written); the workflow waits in settle.
    AfterDrain,
    /// The reboot command is running: it wrote its line and has not returned.
    RebootInFlight,
    /// The reboot command returned and the workflow awaits the node's new boot id.
    AwaitingBoot,
    /// The deep check was delivered to the agent, which has not answered.
    Validating,
}

impl KillPoint {
    /// The reboot command blocks (after writing its line) until the test lets it return.
    fn reboot_blocks(self) -> bool {
        self == KillPoint::RebootInFlight
    }

    /// The agent keeps its old boot id, though rebooted, until the kill.
    fn holds_reboot(self) -> bool {
        matches!(self, KillPoint::RebootInFlight | KillPoint::AwaitingBoot)
    }

    /// The agent withholds its deep-check answer until the kill.
    fn holds_deep_check(self) -> bool {
        self == KillPoint::Validating
    }

    fn reached(self, fleet: &Fleet, agent: &ScriptedAgent) -> bool {
        let events = fleet.events();
        let has_step = |step: &str| {
            events.iter().any(|e| {
                kind(e) == "workflow-step"
                    && node(e) == SICK
                    && e["reason"] == format!("step {step}")
            })
        };
        match self {
            KillPoint::AfterDecision => events.iter().any(|e| {
                kind(e) == "state-changed" && node(e) == SICK && e["to_state"] == "draining"
            }),
            KillPoint::AfterDrain => has_step("Checkpoint"),
            KillPoint::RebootInFlight => fleet.reboots().iter().any(|n| n == SICK),
            KillPoint::AwaitingBoot => has_step("AwaitBoot"),
            KillPoint::Validating => agent.deep_checks_delivered(SICK) > 0,
        }
    }
}

fn kind(event: &Value) -> &str {
    event["kind"].as_str().unwrap_or_default()
}

fn node(event: &Value) -> &str {
    event["node"].as_str().unwrap_or_default()
}

/// One repairer, or two on a shared store: what is killed and what takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One repairer on SQLite, started again on the same store and port.
    Restart,
    /// Two repairers on PostgreSQL; the leader is killed and the standby takes over.
    Failover,
    /// [`Mode::Failover`] with the first repairer in a network namespace of its own, reaching
    /// PostgreSQL over a veth pair that the test can cut ([`PartitionNet`]).
    Partition,
}

/// A network namespace for the first repairer: a veth pair whose outer end carries this
/// namespace's address and the address PostgreSQL listens on for it. Cutting blackholes the
/// route to PostgreSQL's address inside the namespace; agents and the test still reach the
/// repairer. Removed on drop. Needs root and iproute2.
struct PartitionNet {
    netns: String,
    outer: String,
    /// The repairer's address (inside).
    inner_address: std::net::Ipv4Addr,
    /// PostgreSQL's address (outside).
    store_address: std::net::Ipv4Addr,
}

impl PartitionNet {
    fn create() -> PartitionNet {
        let tag = std::process::id() % 250;
        let subnet = |host: u8| std::net::Ipv4Addr::new(10, 241, tag as u8, host);
        let net = PartitionNet {
            netns: format!("fmpart-{tag}"),
            outer: format!("fp{tag}o"),
            inner_address: subnet(2),
            store_address: subnet(9),
        };
        let inner = format!("fp{tag}i");
        let _ = std::process::Command::new("ip").args(["netns", "del", &net.netns]).status();
        let _ = std::process::Command::new("ip").args(["link", "del", &net.outer]).status();
        for args in [
            vec!["netns".to_owned(), "add".to_owned(), net.netns.clone()],
            ["-n", &net.netns, "link", "set", "lo", "up"].map(str::to_owned).to_vec(),
            ["link", "add", &net.outer, "type", "veth", "peer", "name", &inner]
                .map(str::to_owned)
                .to_vec(),
            ["link", "set", &inner, "netns", &net.netns].map(str::to_owned).to_vec(),
            vec![
                "addr".into(),
                "add".into(),
                format!("{}/24", subnet(1)),
                "dev".into(),
                net.outer.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{}/24", net.store_address),
                "dev".into(),
                net.outer.clone(),
            ],
            ["link", "set", &net.outer, "up"].map(str::to_owned).to_vec(),
            vec![
                "-n".into(),
                net.netns.clone(),
                "addr".into(),
                "add".into(),
                format!("{}/24", net.inner_address),
                "dev".into(),
                inner.clone(),
            ],
            ["-n", &net.netns, "link", "set", &inner, "up"].map(str::to_owned).to_vec(),
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            fleetmend_tests::netns::ip(&args);
        }
        net
    }

    /// The CIDR block of the namespace's link, which PostgreSQL trusts.
    fn clients(&self) -> String {
        let [a, b, c, _] = self.store_address.octets();
        format!("{a}.{b}.{c}.0/24")
    }

    fn route(&self, verb: &str) {
        let store = format!("{}/32", self.store_address);
        fleetmend_tests::netns::ip(&["-n", &self.netns, "route", verb, "blackhole", &store]);
    }

    /// Cuts the namespace from PostgreSQL (only): its packets to the server are dropped.
    fn cut(&self) {
        self.route("add");
    }

    fn heal(&self) {
        self.route("del");
    }
}

impl Drop for PartitionNet {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", &self.outer]).status();
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

/// The repairers' world: configs, store, reboot file, ports.
struct Fleet {
    dir: tempfile::TempDir,
    /// Each repairer's address; the first leads at the start.
    listens: Vec<SocketAddr>,
    configs: Vec<PathBuf>,
    reboots: PathBuf,
    /// The reboot command waits for this file when the kill point needs a reboot in flight.
    reboot_gate: PathBuf,
    /// The shared store's server (failover).
    _postgres: Option<PostgresCluster>,
    /// The first repairer's namespace (partition); dropped after the server.
    net: Option<PartitionNet>,
}

/// How long a failover leader's lease lasts unrenewed.
const LEASE: Duration = Duration::from_secs(3);

impl Fleet {
    /// `None` when the mode needs PostgreSQL and it is not installed (and not required).
    fn new(kill: KillPoint, mode: Mode) -> Option<Fleet> {
        let dir = tempfile::tempdir().expect("temp dir");
        let net = (mode == Mode::Partition).then(PartitionNet::create);
        let postgres = match (mode, &net) {
            (Mode::Restart, _) => None,
            (_, Some(net)) => Some(PostgresCluster::start_listening_also(Some((
                net.store_address.into(),
                &net.clients(),
            )))?),
            (_, None) => Some(PostgresCluster::start()?),
        };
        let count = if mode == Mode::Restart { 1 } else { 2 };
        let mut listens: Vec<SocketAddr> =
            (0..count).map(|_| SocketAddr::from(([127, 0, 0, 1], free_port()))).collect();
        if let Some(net) = &net {
            listens[0] = SocketAddr::from((net.inner_address, free_port()));
        }
        let reboots = dir.path().join("reboots");
        let reboot_gate = dir.path().join("reboot-returns");
        // The node name is substituted by the provider (it refuses names that are not plain);
        // the paths are quoted for the shell.
        let mut reboot = format!("echo {{node}} >> '{}'", reboots.display());
        if kill.reboot_blocks() {
            // Stops waiting if the directory goes away, so no shell outlives a failed test.
            reboot.push_str(&format!(
                "; while [ -d '{}' ] && [ ! -e '{}' ]; do sleep 0.05; done",
                dir.path().display(),
                reboot_gate.display()
            ));
        }
        let (store, leadership) = match &postgres {
            None => (dir.path().join("repairer.db").display().to_string(), String::new()),
            Some(postgres) => {
                let mut url = postgres.fresh_database();
                if let Some(net) = &net {
                    url = url.replace("127.0.0.1", &net.store_address.to_string());
                }
                let lease = format!("lease = \"{}s\"\npoll = \"200ms\"\n", LEASE.as_secs());
                (url, format!("[leadership]\n{lease}"))
            }
        };
        let mut configs = Vec::new();
        for (i, listen) in listens.iter().enumerate() {
            // Each repairer also notes the reboots it issued itself.
            let reboot = format!(
                "echo {{node}} >> '{}'; {reboot}",
                dir.path().join(format!("reboots-by-{i}")).display()
            );
            let config = dir.path().join(format!("repairer-{i}.toml"));
            let text = format!(
                r#"listen = "{listen}"
store = "{store}"
scheduler = "memory"
{insecure}

[engine]
tick = "50ms"
report_interval = "{interval}ms"
unreachable_after = 5

[engine.workflow]
call_timeout = "20s"
checkpoint_grace = "0s"
reboot_timeout = "10s"
validate_timeout = "30s"
retry_initial = "100ms"
retry_max = "1s"

[policy.guard_rails]
# A settle window holds the workflow after the drain, so the kills before the reboot land there.
settle = "2s"
cooldown = "1m"

[provider]
kind = "command"
reboot = ["sh", "-c", {reboot}]
reboot_timeout = "2m"

{leadership}"#,
                // The namespace's address is not loopback: a lab's plain HTTP, no tokens.
                insecure = if net.is_some() { "insecure = true" } else { "" },
                interval = REPORT_INTERVAL.as_millis(),
                reboot = toml_string(&reboot),
            );
            std::fs::write(&config, text).expect("write the repairer config");
            configs.push(config);
        }
        Some(Fleet { dir, listens, configs, reboots, reboot_gate, _postgres: postgres, net })
    }

    /// Starts repairer `i` (stderr to `repairer-I.stderr`) and waits until it answers; the first
    /// one in its namespace where there is one.
    fn start_repairer(&self, i: usize) -> Running {
        let netns = self.net.as_ref().filter(|_| i == 0).map(|net| net.netns.as_str());
        start_repairer_in(
            netns,
            &self.configs[i],
            self.listens[i],
            &self.dir.path().join(format!("repairer-{i}.stderr")),
            START_DEADLINE,
        )
    }

    /// `GET /v1/leader` of repairer `i`.
    fn leader_view(&self, i: usize) -> Option<Value> {
        http_get(self.listens[i], "/v1/leader")
            .filter(|(status, _)| *status == 200)
            .and_then(|(_, body)| serde_json::from_str(&body).ok())
    }

    fn leads(&self, i: usize) -> bool {
        self.leader_view(i).is_some_and(|view| view["role"] == "leader")
    }

    /// A read from the first repairer that answers it (a standby serves reads from the store).
    fn read(&self, path: &str) -> Vec<Value> {
        self.listens
            .iter()
            .find_map(|listen| {
                http_get(*listen, path)
                    .filter(|(status, _)| *status == 200)
                    .and_then(|(_, body)| serde_json::from_str::<Vec<Value>>(&body).ok())
            })
            .unwrap_or_default()
    }

    /// Lines of the reboot file: one node name per reboot issued.
    fn reboots(&self) -> Vec<String> {
        std::fs::read_to_string(&self.reboots)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The reboots repairer `i` issued.
    fn reboots_by(&self, i: usize) -> Vec<String> {
        let path = self.dir.path().join(format!("reboots-by-{i}"));
        std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
    }

    fn let_reboot_return(&self) {
        std::fs::write(&self.reboot_gate, b"").expect("write the reboot gate");
    }

    /// Every event so far (empty while the repairer does not answer).
    fn events(&self) -> Vec<Value> {
        self.read("/v1/events?limit=10000")
    }

    /// Node name → state.
    fn states(&self) -> Vec<(String, String)> {
        self.read("/v1/nodes")
            .iter()
            .map(|n| {
                (
                    n["name"].as_str().unwrap_or_default().to_owned(),
                    n["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    fn state_of(&self, name: &str) -> Option<String> {
        self.states().into_iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// The last workflow step recorded for the sick node (for failure messages).
    fn last_step(&self) -> String {
        self.events()
            .iter()
            .rev()
            .find(|e| kind(e) == "workflow-step" && node(e) == SICK)
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_else(|| "no step yet".to_owned())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A reboot command left blocked by a failed test returns now.
        let _ = std::fs::write(&self.reboot_gate, b"");
    }
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What the test tells the scripted agent.
#[derive(Debug, Default)]
struct AgentControl {
    /// The sick node reports Xid 79 (until it reboots).
    xid: bool,
    /// Rebooted nodes keep their old boot id until released.
    hold_reboot: bool,
    /// Deep checks are run but their answers are withheld until released.
    hold_deep_check: bool,
    stop: bool,
}

/// One simulated node.
#[derive(Debug)]
struct SimulatedNode {
    name: &'static str,
    /// How many boots since the test started; part of the boot id.
    boots: usize,
    seq: u64,
    /// Command ids received (an agent runs an id once).
    seen: BTreeSet<String>,
    /// Results to carry in every report until one is accepted.
    results: Vec<CommandResult>,
    /// Answers held back while `hold_deep_check`.
    withheld: Vec<CommandResult>,
    deep_checks_delivered: usize,
}

#[derive(Debug, Default)]
struct AgentShared {
    control: AgentControl,
    /// Report rounds sent (each: one report per node, answered or not).
    rounds: u64,
    /// Per node: deep-check commands delivered.
    deep_checks: Vec<(&'static str, usize)>,
}

/// Reports for every node every [`REPORT_INTERVAL`] from its own thread, across repairer restarts.
struct ScriptedAgent {
    shared: Arc<Mutex<AgentShared>>,
    thread: Option<JoinHandle<()>>,
}

impl ScriptedAgent {
    fn start(repairers: Vec<SocketAddr>, reboots: PathBuf) -> ScriptedAgent {
        let shared = Arc::new(Mutex::new(AgentShared::default()));
        let thread = {
            let shared = shared.clone();
            std::thread::spawn(move || agent_loop(&repairers, &reboots, &shared))
        };
        ScriptedAgent { shared, thread: Some(thread) }
    }

    fn shared(&self) -> MutexGuard<'_, AgentShared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn control(&self, f: impl FnOnce(&mut AgentControl)) {
        f(&mut self.shared().control);
    }

    fn rounds(&self) -> u64 {
        self.shared().rounds
    }

    fn deep_checks_delivered(&self, name: &str) -> usize {
        self.shared().deep_checks.iter().find(|(n, _)| *n == name).map_or(0, |(_, c)| *c)
    }

    /// Waits until the agent sent `rounds` more report rounds (time for the repairer to act on
    /// them, measured in reports rather than slept).
    fn wait_rounds(&self, rounds: u64) {
        let target = self.rounds() + rounds;
        assert!(
            poll_until(STEP_DEADLINE, || self.rounds() >= target),
            "the scripted agent stopped reporting"
        );
    }
}

impl Drop for ScriptedAgent {
    fn drop(&mut self) {
        self.control(|c| c.stop = true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn agent_loop(repairers: &[SocketAddr], reboots: &Path, shared: &Mutex<AgentShared>) {
    let lock = || shared.lock().unwrap_or_else(PoisonError::into_inner);
    // The repairer reports go to; a failed post (down, or a standby's 503) moves to the next.
    let mut current = 0;
    let mut nodes: Vec<SimulatedNode> = NODES
        .iter()
        .map(|name| SimulatedNode {
            name,
            boots: 0,
            seq: 0,
            seen: BTreeSet::new(),
            results: Vec::new(),
            withheld: Vec::new(),
            deep_checks_delivered: 0,
        })
        .collect();
    // The report cadence: the agent's interval, not a wait for anything.
    let mut next = Instant::now();
    loop {
        let (xid, hold_reboot, hold_deep_check) = {
            let shared = lock();
            if shared.control.stop {
                return;
            }
            let c = &shared.control;
            (c.xid, c.hold_reboot, c.hold_deep_check)
        };
        let reboot_lines = std::fs::read_to_string(reboots).unwrap_or_default();
        for node in &mut nodes {
            let reboots_issued = reboot_lines.lines().filter(|l| *l == node.name).count();
            if !hold_reboot && reboots_issued > node.boots {
                // The node went down and came back: a new boot id, and the fault is gone.
                node.boots = reboots_issued;
            }
            if !hold_deep_check {
                node.results.append(&mut node.withheld);
            }
            node.seq += 1;
            let mut findings = Vec::new();
            if xid && node.name == SICK && node.boots == 0 {
                findings.push(
                    Finding::new(
                        "gpu",
                        "xid",
                        "0",
                        Status::Fail,
                        RecommendedAction::Reboot,
                        "Xid 79: GPU has fallen off the bus",
                    )
                    .with_label("xid", "79"),
                );
            }
            let boot_id = format!("{}-boot-{}", node.name, node.boots);
            let report = Report {
                wire_version: WIRE_VERSION,
                node: node.name.to_owned(),
                boot_id: boot_id.clone(),
                agent_version: "scripted".to_owned(),
                seq: node.seq,
                sent_at_ms: now_ms(),
                trigger: if node.results.is_empty() {
                    ReportTrigger::Interval
                } else {
                    ReportTrigger::Command
                },
                verdict: Verdict::of(&findings),
                checks: Vec::new(),
                findings,
                command_results: node.results.clone(),
                address: None,
                ranks: Vec::new(),
                metrics_port: None,
            };
            let body = serde_json::to_string(&report).expect("serialize a report");
            let Some((200, reply)) = http_post_json(repairers[current], "/v1/reports", &body)
            else {
                // The repairer is down, a standby or refused it: the results travel in the next
                // report, to the next repairer.
                current = (current + 1) % repairers.len();
                continue;
            };
            node.results.clear();
            let reply: ReportReply = serde_json::from_str(&reply).expect("parse the report reply");
            for command in reply.commands {
                if !node.seen.insert(command.id.clone()) {
                    continue;
                }
                if command.kind == command_kind::EVIDENCE {
                    // Like a real agent: a small bundle, answered at once.
                    let bundle = EvidenceBundle {
                        node: node.name.to_owned(),
                        boot_id: boot_id.clone(),
                        collected_at_ms: now_ms(),
                        took_ms: 1,
                        items: vec![EvidenceItem::text(
                            "findings",
                            "stand-in agent",
                            "none".to_owned(),
                        )],
                    };
                    node.results.push(CommandResult::evidence(&command.id, bundle, now_ms()));
                    continue;
                }
                if command.kind != command_kind::DEEP_CHECK {
                    continue;
                }
                node.deep_checks_delivered += 1;
                let result = CommandResult {
                    id: command.id,
                    kind: command.kind,
                    ok: true,
                    message: "healthy".to_owned(),
                    verdict: Some(Verdict::Healthy),
                    findings: Vec::new(),
                    evidence: None,
                    allreduce: None,
                    finished_at_ms: now_ms(),
                };
                if hold_deep_check {
                    node.withheld.push(result);
                } else {
                    node.results.push(result);
                }
            }
        }
        {
            let mut shared = lock();
            shared.rounds += 1;
            shared.deep_checks = nodes.iter().map(|n| (n.name, n.deep_checks_delivered)).collect();
        }
        next += REPORT_INTERVAL;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

/// Runs the reboot workflow for Xid 79 on n1, kills the repairer (the leader) with SIGKILL at
/// `kill`, starts it again on the same store and port (or lets the standby take over), and checks
/// the workflow finished once with one reboot.
fn kill_and_resume(kill: KillPoint, mode: Mode) {
    let Some(fleet) = Fleet::new(kill, mode) else { return };
    let mut repairer = fleet.start_repairer(0);
    let standby = (mode != Mode::Restart).then(|| {
        assert!(
            poll_until(START_DEADLINE, || fleet.leads(0)),
            "the first repairer did not take the lead: {:?}\n{}",
            fleet.leader_view(0),
            repairer.stderr()
        );
        let standby = fleet.start_repairer(1);
        let view = fleet.leader_view(1).expect("the standby answers /v1/leader");
        assert_eq!(view["role"], "standby", "{view:#}");
        assert_eq!(view["leader"], format!("http://{}", fleet.listens[0]), "{view:#}");
        standby
    });
    let agent = ScriptedAgent::start(fleet.listens.clone(), fleet.reboots.clone());

    // The fleet as it is before the fault: every node known and healthy for a while.
    assert!(
        poll_until(STEP_DEADLINE, || {
            let states = fleet.states();
            states.len() == NODES.len() && states.iter().all(|(_, s)| s == "healthy")
        }),
        "the four nodes did not show up healthy: {:?}\n{}",
        fleet.states(),
        repairer.stderr()
    );
    agent.wait_rounds(10);

    agent.control(|c| {
        c.hold_reboot = kill.holds_reboot();
        c.hold_deep_check = kill.holds_deep_check();
        c.xid = true;
    });
    assert!(
        poll_until(STEP_DEADLINE, || kill.reached(&fleet, &agent)),
        "the workflow did not reach {kill:?} (last step: {})\nreboots: {:?}\n{}",
        fleet.last_step(),
        fleet.reboots(),
        repairer.stderr()
    );
    let step_at_kill = fleet.last_step();
    repairer.child.kill().expect("SIGKILL the repairer");
    let killed_at = Instant::now();
    repairer.child.wait().expect("reap the repairer");
    let reboots_at_kill = fleet.reboots();
    match kill {
        KillPoint::AfterDecision | KillPoint::AfterDrain => assert!(
            reboots_at_kill.is_empty(),
            "{kill:?}: the kill was meant to land before the reboot, but it was issued already \
             (last step {step_at_kill})"
        ),
        _ => assert_eq!(reboots_at_kill, [SICK], "{kill:?}: one reboot before the kill"),
    }

    // What the workflow waited on happens while the repairer is down.
    fleet.let_reboot_return();
    agent.control(|c| {
        c.hold_reboot = false;
        c.hold_deep_check = false;
    });
    let repairer = match standby {
        None => fleet.start_repairer(0),
        Some(standby) => {
            // Within the lease, with a margin for a loaded machine.
            let limit = LEASE * 2 + Duration::from_secs(5);
            assert!(
                poll_until(limit, || fleet.leads(1)),
                "{kill:?}: the standby did not take the lead within {limit:?}: {:?}\n{}",
                fleet.leader_view(1),
                standby.stderr()
            );
            println!(
                "{kill:?}: the standby leads {:.2} s after the leader was killed (lease {LEASE:?})",
                killed_at.elapsed().as_secs_f64()
            );
            standby
        }
    };

    let finished = |events: &[Value]| {
        events
            .iter()
            .filter(|e| kind(e) == "repair-finished" && node(e) == SICK)
            .cloned()
            .collect::<Vec<_>>()
    };
    let done = poll_until(FINISH_DEADLINE, || {
        !finished(&fleet.events()).is_empty() && fleet.state_of(SICK).as_deref() == Some("healthy")
    });
    assert!(
        done,
        "{kill:?} (killed at {step_at_kill:?}): the workflow did not finish after the restart \
         (last step {:?}, {SICK} is {:?}, reboots {:?})\n{}",
        fleet.last_step(),
        fleet.state_of(SICK),
        fleet.reboots(),
        repairer.stderr()
    );
    // Time for a repeated reboot or a second finish to show, counted in report rounds.
    agent.wait_rounds(15);

    let events = fleet.events();
    let finished = finished(&events);
    assert_eq!(
        finished.len(),
        1,
        "{kill:?}: exactly one repair-finished for {SICK}: {finished:#?}"
    );
    let workflow = &finished[0]["workflow"];
    assert!(workflow.is_i64(), "the repair-finished event names its workflow: {:#}", finished[0]);
    assert_eq!(
        finished[0]["reason"], "reboot repaired and validated",
        "{kill:?}: {:#}",
        finished[0]
    );
    let decisions: Vec<&Value> =
        events.iter().filter(|e| kind(e) == "decision" && node(e) == SICK).collect();
    assert_eq!(decisions.len(), 1, "{kill:?}: one decision, one workflow: {decisions:#?}");
    let finishes_of_workflow = events
        .iter()
        .filter(|e| kind(e) == "repair-finished" && &e["workflow"] == workflow)
        .count();
    assert_eq!(finishes_of_workflow, 1, "{kill:?}: one finish of workflow {workflow}");
    assert_eq!(
        fleet.reboots(),
        [SICK],
        "{kill:?} (killed at {step_at_kill:?}): {SICK} rebooted exactly once"
    );
    assert_eq!(fleet.state_of(SICK).as_deref(), Some("healthy"));

    // The restart itself must neither forget the fleet (a node that died while the repairer was
    // down must still be missed) nor disturb it: the repairer was not listening, so silence while
    // it was down says nothing about the nodes.
    for name in NODES {
        let joined: Vec<&Value> =
            events.iter().filter(|e| kind(e) == "node-joined" && node(e) == name).collect();
        assert_eq!(
            joined.len(),
            1,
            "{kill:?}: {name} joined once; the restarted repairer must remember it: {joined:#?}"
        );
    }
    let disturbed: Vec<&Value> = events
        .iter()
        .filter(|e| (kind(e) == "state-changed" && node(e) != SICK) || kind(e) == "breaker")
        .collect();
    assert!(
        disturbed.is_empty(),
        "{kill:?}: the restart changed other nodes or the breaker: {disturbed:#?}"
    );
    for (name, state) in fleet.states() {
        assert_eq!(state, "healthy", "{kill:?}: {name} after the repair");
    }
    if mode != Mode::Restart {
        assert_epochs_do_not_interleave(&events, kill);
    }
}

/// Every event of a shared store names the epoch it was written under; epochs only grow along the
/// log (no write of an older leader after a newer one's), and the takeover is one
/// `leader-changed` event per epoch.
fn assert_epochs_do_not_interleave(events: &[Value], kill: KillPoint) {
    let epochs: Vec<i64> = events
        .iter()
        .map(|e| {
            e["epoch"]
                .as_i64()
                .unwrap_or_else(|| panic!("{kill:?}: an event without its epoch: {e:#}"))
        })
        .collect();
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1]),
        "{kill:?}: epochs interleave in the log: {epochs:?}"
    );
    let changes: Vec<i64> = events
        .iter()
        .filter(|e| kind(e) == "leader-changed")
        .map(|e| e["epoch"].as_i64().unwrap())
        .collect();
    assert_eq!(changes, [1, 2], "{kill:?}: one leader-changed per epoch");
}

#[test]
fn killed_right_after_the_decision_the_workflow_completes_once() {
    kill_and_resume(KillPoint::AfterDecision, Mode::Restart);
}

#[test]
fn killed_after_the_drain_the_workflow_completes_once() {
    kill_and_resume(KillPoint::AfterDrain, Mode::Restart);
}

#[test]
fn killed_while_the_reboot_command_runs_the_reboot_is_awaited_not_repeated() {
    kill_and_resume(KillPoint::RebootInFlight, Mode::Restart);
}

#[test]
fn killed_while_awaiting_the_boot_the_reboot_is_not_repeated() {
    kill_and_resume(KillPoint::AwaitingBoot, Mode::Restart);
}

#[test]
fn killed_while_the_deep_check_is_unanswered_validation_completes_once() {
    kill_and_resume(KillPoint::Validating, Mode::Restart);
}

#[test]
fn failover_leader_killed_right_after_the_decision_the_standby_completes_once() {
    kill_and_resume(KillPoint::AfterDecision, Mode::Failover);
}

#[test]
fn failover_leader_killed_after_the_drain_the_standby_completes_once() {
    kill_and_resume(KillPoint::AfterDrain, Mode::Failover);
}

#[test]
fn failover_leader_killed_while_the_reboot_command_runs_the_reboot_is_not_repeated() {
    kill_and_resume(KillPoint::RebootInFlight, Mode::Failover);
}

#[test]
fn failover_leader_killed_while_awaiting_the_boot_the_reboot_is_not_repeated() {
    kill_and_resume(KillPoint::AwaitingBoot, Mode::Failover);
}

#[test]
fn failover_leader_killed_while_the_deep_check_is_unanswered_validation_completes_once() {
    kill_and_resume(KillPoint::Validating, Mode::Failover);
}

/// Sends `signal` (`STOP`, `CONT`) to `process`.
fn signal(process: &Running, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(process.child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} failed");
}

/// The leader stopped (SIGSTOP) past its lease while its workflow waits in the settle window: the
/// standby takes the lead and finishes the repair; the old leader, continued (SIGCONT), has its
/// writes refused, steps down and exits with status 75, and the node was rebooted once.
#[test]
fn failover_a_paused_leader_is_fenced_when_it_wakes_and_steps_down() {
    let kill = KillPoint::AfterDrain;
    let Some(fleet) = Fleet::new(kill, Mode::Failover) else { return };
    let mut leader = fleet.start_repairer(0);
    assert!(poll_until(START_DEADLINE, || fleet.leads(0)), "no leader:\n{}", leader.stderr());
    let standby = fleet.start_repairer(1);
    let agent = ScriptedAgent::start(fleet.listens.clone(), fleet.reboots.clone());
    assert!(
        poll_until(STEP_DEADLINE, || fleet.states().iter().filter(|(_, s)| s == "healthy").count()
            == NODES.len()),
        "the four nodes did not show up healthy: {:?}",
        fleet.states()
    );
    agent.control(|c| c.xid = true);
    assert!(
        poll_until(STEP_DEADLINE, || kill.reached(&fleet, &agent)),
        "the workflow did not reach the settle window (last step {})\n{}",
        fleet.last_step(),
        leader.stderr()
    );
    signal(&leader, "STOP");
    let stopped_at = Instant::now();
    let limit = LEASE * 2 + Duration::from_secs(5);
    assert!(
        poll_until(limit, || fleet.leads(1)),
        "the standby did not take the lead from the stopped leader within {limit:?}\n{}",
        standby.stderr()
    );
    println!(
        "the standby leads {:.2} s after the leader stopped",
        stopped_at.elapsed().as_secs_f64()
    );
    let finished = || {
        fleet.events().iter().filter(|e| kind(e) == "repair-finished" && node(e) == SICK).count()
    };
    assert!(
        poll_until(FINISH_DEADLINE, || finished() == 1
            && fleet.state_of(SICK).as_deref() == Some("healthy")),
        "the new leader did not finish the repair (last step {})\n{}",
        fleet.last_step(),
        standby.stderr()
    );

    // The old leader wakes with its workflow past the settle window and its lease long gone.
    signal(&leader, "CONT");
    let mut exited = None;
    assert!(
        poll_until(STEP_DEADLINE, || {
            exited = leader.child.try_wait().ok().flatten();
            exited.is_some()
        }),
        "the woken leader did not step down\n{}",
        leader.stderr()
    );
    assert_eq!(exited.and_then(|s| s.code()), Some(75), "{}", leader.stderr());
    assert!(leader.stderr().contains("no longer leads"), "{}", leader.stderr());
    agent.wait_rounds(15);
    assert_eq!(fleet.reboots(), [SICK], "rebooted once, by the new leader only");
    assert_eq!(finished(), 1, "one repair-finished");
    let events = fleet.events();
    let decisions = events.iter().filter(|e| kind(e) == "decision" && node(e) == SICK).count();
    assert_eq!(decisions, 1, "one decision");
    assert_epochs_do_not_interleave(&events, kill);
    assert!(fleet.leads(1), "the standby still leads");
}

/// The leader runs in a network namespace of its own and is cut from PostgreSQL (only: agents
/// still reach it) while its workflow waits in the settle window: its writes close and it steps
/// down within its lease, acting no more; the standby takes the lead, finishes the repair and is
/// the one that reboots the node, once; no two epochs' events interleave. Healed, the old leader
/// comes back as a standby.
#[test]
fn partition_a_leader_cut_from_postgres_stops_acting_within_its_lease() {
    let kill = KillPoint::AfterDrain;
    let Some(fleet) = Fleet::new(kill, Mode::Partition) else { return };
    let net = fleet.net.as_ref().expect("the partition's namespace");
    let mut leader = fleet.start_repairer(0);
    assert!(poll_until(START_DEADLINE, || fleet.leads(0)), "no leader:\n{}", leader.stderr());
    let standby = fleet.start_repairer(1);
    let agent = ScriptedAgent::start(fleet.listens.clone(), fleet.reboots.clone());
    assert!(
        poll_until(STEP_DEADLINE, || fleet.states().iter().filter(|(_, s)| s == "healthy").count()
            == NODES.len()),
        "the four nodes did not show up healthy: {:?}\n{}",
        fleet.states(),
        leader.stderr()
    );
    agent.control(|c| c.xid = true);
    assert!(
        poll_until(STEP_DEADLINE, || kill.reached(&fleet, &agent)),
        "the workflow did not reach the settle window (last step {})\n{}",
        fleet.last_step(),
        leader.stderr()
    );
    net.cut();
    let cut_at = Instant::now();
    let cut_at_ms = now_ms();
    assert!(fleet.reboots().is_empty(), "the cut was meant to land before the reboot");

    // The lease lapses unrenewed: the standby leads.
    let limit = LEASE * 2 + Duration::from_secs(5);
    assert!(
        poll_until(limit, || fleet.leads(1)),
        "the standby did not take the lead within {limit:?} of the cut\n{}",
        standby.stderr()
    );
    println!("the standby leads {:.2} s after the cut", cut_at.elapsed().as_secs_f64());

    // Its writes close 0.8 × the lease after its last renewal, so it acts no more; it steps down
    // once its store calls in flight time out (connect + statement timeouts, 12 s by default).
    let limit = LEASE + Duration::from_secs(20);
    assert!(
        poll_until(limit, || leader.stderr().contains("no longer leads")),
        "the leader cut from PostgreSQL did not step down within {limit:?}\n{}",
        leader.stderr()
    );
    println!(
        "cut from PostgreSQL, the leader stepped down after {:.2} s (lease {LEASE:?})",
        cut_at.elapsed().as_secs_f64()
    );
    let mut exited = None;
    assert!(
        poll_until(STEP_DEADLINE, || {
            exited = leader.child.try_wait().ok().flatten();
            exited.is_some()
        }),
        "the leader that stepped down did not exit\n{}",
        leader.stderr()
    );
    assert_eq!(exited.and_then(|s| s.code()), Some(75), "{}", leader.stderr());
    let finished = || {
        fleet.events().iter().filter(|e| kind(e) == "repair-finished" && node(e) == SICK).count()
    };
    assert!(
        poll_until(FINISH_DEADLINE, || finished() == 1
            && fleet.state_of(SICK).as_deref() == Some("healthy")),
        "the new leader did not finish the repair (last step {})\n{}",
        fleet.last_step(),
        standby.stderr()
    );
    agent.wait_rounds(15);
    assert_eq!(fleet.reboots(), [SICK], "rebooted once");
    assert_eq!(fleet.reboots_by(0), Vec::<String>::new(), "the cut leader rebooted nothing");
    assert_eq!(fleet.reboots_by(1), [SICK], "the new leader rebooted it");
    assert_eq!(finished(), 1, "one repair-finished");
    let events = fleet.events();
    let decisions = events.iter().filter(|e| kind(e) == "decision" && node(e) == SICK).count();
    assert_eq!(decisions, 1, "one decision");
    assert_epochs_do_not_interleave(&events, kill);
    let late: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["epoch"] == 1
                && e["at_ms"].as_u64().unwrap_or(0) > cut_at_ms + LEASE.as_millis() as u64
        })
        .collect();
    assert!(late.is_empty(), "the cut leader wrote after its lease: {late:#?}");

    // The partition healed, the old leader's host runs its repairer again: a standby.
    net.heal();
    let back = fleet.start_repairer(0);
    let view = fleet.leader_view(0).expect("the returned repairer answers /v1/leader");
    assert_eq!(view["role"], "standby", "{view:#}\n{}", back.stderr());
    assert_eq!(view["leader"], format!("http://{}", fleet.listens[1]), "{view:#}");
    assert!(fleet.leads(1), "the standby still leads");
}
