//! The repairer looking after a real Slurm 22.05 cluster end to end: the real `fleetmend
//! repairer` (scheduler and provider `slurm`), a real `fleetmend agent` per Slurm node on a
//! simulated node tree, and `deploy/slurm/dev-cluster.sh`'s cluster (munged, slurmctld, four
//! slurmd on this host).
//!
//! A reboot goes through Slurm (`scontrol reboot`): the dev cluster's RebootProgram restarts the
//! node's slurmd as rebooted and writes the node a new boot id. This test plays the machine that
//! reboots: when a node's boot id changes, its agent is stopped, its tree rebuilt as a fresh boot
//! and the agent started again, so the repairer sees the new boot as it would on real hardware.
//!
//! Needs root and Debian's `slurm-wlm munge` (see tests/src/slurm.rs for when it is skipped).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleetmend_local::faults::Fault;
use fleetmend_local::tree::{NodeTree, node_dir};
use fleetmend_tests::slurm::{DevCluster, can_run, train_events};
use fleetmend_tests::{
    Running, fleetmend_bin, free_port, http_get, poll_until, start_agent, start_repairer,
    uninterrupted_hash,
};
use serde_json::Value;

const NODES: [&str; 4] = ["node1", "node2", "node3", "node4"];
const REPORT_INTERVAL: Duration = Duration::from_millis(300);
/// What the issue promises: a fault to the node drained in Slurm.
const DRAIN_WITHIN: Duration = Duration::from_secs(2);
/// Generous limits for the slower phases on a loaded machine.
const PHASE: Duration = Duration::from_secs(60);

/// One node: its simulated tree and the agent running on it.
struct Machine {
    tree: NodeTree,
    listen: SocketAddr,
    agent: Option<Running>,
    /// The dev cluster's boot id of the node when the agent was last started.
    boot_id: String,
    /// Reboots seen (boot id changes).
    reboots: u32,
}

/// The repairer, the agents and the cluster; everything stopped when dropped.
struct World {
    // Field order is drop order: the machines' watcher and agents, the repairer, then Slurm.
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
    machines: Arc<Mutex<BTreeMap<String, Machine>>>,
    repairer: Running,
    listen: SocketAddr,
    cluster: DevCluster,
    _dir: tempfile::TempDir,
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        let mut machines = self.machines.lock().unwrap_or_else(PoisonError::into_inner);
        for machine in machines.values_mut() {
            machine.agent = None;
            let _ = machine.tree.cleanup();
        }
    }
}

fn toml_path(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).unwrap()
}

/// The dev cluster's boot id of `node` (written at start and by its RebootProgram).
fn cluster_boot_id(cluster_dir: &Path, node: &str) -> String {
    let path = cluster_dir.join("nodes").join(node).join("boot_id");
    std::fs::read_to_string(path).unwrap_or_default().trim().to_owned()
}

fn agent_args(tree: &NodeTree, repairer: SocketAddr) -> Vec<String> {
    let mut args = tree.agent_flags();
    args.push(format!("--repairer=http://{repairer}"));
    args
}

impl World {
    /// A cluster with `prepare` applied (e.g. an admin's drain) before the repairer starts.
    fn start(prepare: impl FnOnce(&DevCluster)) -> World {
        let cluster = DevCluster::start();
        prepare(&cluster);
        let dir = tempfile::tempdir().unwrap();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let config = dir.path().join("repairer.toml");
        std::fs::write(
            &config,
            format!(
                r#"listen = "{listen}"
store = {store}
scheduler = "slurm"

[slurm]
slurm_conf = {conf}
command_timeout = "15s"
# Short enough that an unreachable slurmctld shows in the events within seconds; the workflow
# retries the step until it is back.
controller_retry_for = "2s"
controller_retry_max_backoff = "500ms"

[engine]
tick = "50ms"
report_interval = "{interval}ms"
unreachable_after = 10

[engine.workflow]
call_timeout = "30s"
checkpoint_grace = "3s"
reboot_timeout = "60s"
validate_timeout = "30s"
retry_initial = "200ms"
retry_max = "1s"

[policy.guard_rails]
max_unavailable_fraction = 0.5
settle = "0s"
cooldown = "1m"

[provider]
kind = "slurm"
"#,
                store = toml_path(&dir.path().join("repairer.db")),
                conf = toml_path(&cluster.conf()),
                interval = REPORT_INTERVAL.as_millis(),
            ),
        )
        .unwrap();
        let repairer = start_repairer(
            &config,
            listen,
            &dir.path().join("repairer.stderr"),
            Duration::from_secs(30),
        );
        let mut machines = BTreeMap::new();
        let interval = humantime_ms(REPORT_INTERVAL);
        for node in NODES {
            let tree = NodeTree::create(&node_dir(dir.path(), node), node).unwrap();
            tree.agent_config(&format!("[report]\ninterval = \"{interval}\"\n")).unwrap();
            let agent_listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let args = agent_args(&tree, listen);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let agent = start_agent(dir.path(), agent_listen, &args);
            machines.insert(
                node.to_owned(),
                Machine {
                    boot_id: cluster_boot_id(cluster.path(), node),
                    tree,
                    listen: agent_listen,
                    agent: Some(agent),
                    reboots: 0,
                },
            );
        }
        let machines = Arc::new(Mutex::new(machines));
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = std::thread::spawn({
            let (machines, stop) = (machines.clone(), stop.clone());
            let (cluster_dir, log_dir) = (cluster.path().to_owned(), dir.path().to_owned());
            move || reboot_machines(&machines, &stop, &cluster_dir, &log_dir, listen)
        });
        let world =
            World { stop, watcher: Some(watcher), machines, repairer, listen, cluster, _dir: dir };
        assert!(
            poll_until(PHASE, || NODES.iter().all(|n| world.state(n) == "healthy")),
            "the nodes did not all report healthy: {:?}\n{}",
            NODES.map(|n| world.state(n)),
            world.diagnostics()
        );
        world
    }

    /// The repairer's state of `node` (`healthy`, `draining`...; empty when unknown).
    fn state(&self, node: &str) -> String {
        http_get(self.listen, &format!("/v1/nodes/{node}"))
            .filter(|(status, _)| *status == 200)
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v["node"]["state"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    fn events(&self) -> Vec<Value> {
        http_get(self.listen, "/v1/events?limit=10000")
            .filter(|(status, _)| *status == 200)
            .and_then(|(_, body)| serde_json::from_str::<Vec<Value>>(&body).ok())
            .unwrap_or_default()
    }

    fn events_of(&self, node: &str) -> Vec<Value> {
        self.events().into_iter().filter(|e| e["node"] == node).collect()
    }

    /// The reason `sinfo -R` gives for `node`, if it lists it.
    fn slurm_reason(&self, node: &str) -> Option<String> {
        self.cluster.reasons().into_iter().find(|(n, _)| n == node).map(|(_, r)| r)
    }

    fn inject(&self, node: &str, fault: Fault) {
        let machines = self.machines.lock().unwrap();
        machines[node].tree.inject(&fault, false).unwrap();
    }

    fn reboots(&self, node: &str) -> u32 {
        self.machines.lock().unwrap()[node].reboots
    }

    /// Whether `node`'s repair workflow finished, and how (`repaired`, `quarantined`...).
    fn finished_repair(&self, node: &str) -> Option<String> {
        self.events_of(node)
            .iter()
            .rev()
            .find(|e| e["kind"] == "repair-finished")
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
    }

    fn diagnostics(&self) -> String {
        let events: Vec<String> = self
            .events()
            .iter()
            .map(|e| {
                format!(
                    "  {} {} {} -> {} {}",
                    e["kind"].as_str().unwrap_or_default(),
                    e["node"].as_str().unwrap_or("-"),
                    e["from_state"].as_str().unwrap_or(""),
                    e["to_state"].as_str().unwrap_or(""),
                    e["reason"].as_str().unwrap_or_default()
                )
            })
            .collect();
        let sinfo = self
            .cluster
            .slurm("sinfo", &["-N", "-o", "%N %T %E"])
            .lines()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n");
        format!(
            "events:\n{}\nsinfo:\n{sinfo}\nrepairer stderr (tail):\n{}",
            events.join("\n"),
            tail(&self.repairer.stderr(), 30)
        )
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn humantime_ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The machines' side of a reboot: a node whose boot id changed in the dev cluster (its
/// RebootProgram ran) gets its agent stopped, its tree rebuilt as the new boot, and its agent
/// started again.
fn reboot_machines(
    machines: &Mutex<BTreeMap<String, Machine>>,
    stop: &AtomicBool,
    cluster_dir: &Path,
    log_dir: &Path,
    repairer: SocketAddr,
) {
    while !stop.load(Ordering::SeqCst) {
        {
            let mut machines = machines.lock().unwrap_or_else(PoisonError::into_inner);
            for (node, machine) in machines.iter_mut() {
                let now = cluster_boot_id(cluster_dir, node);
                if now.is_empty() || now == machine.boot_id {
                    continue;
                }
                machine.agent = None;
                machine.tree.reboot().unwrap();
                let args = agent_args(&machine.tree, repairer);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                machine.agent = Some(start_agent(log_dir, machine.listen, &args));
                machine.boot_id = now;
                machine.reboots += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_faulty_node_is_drained_in_slurm_within_2_s_rebooted_and_returned_idle() {
    if !can_run() {
        return;
    }
    let world = World::start(|_| {});

    world.inject("node2", Fault::GpuXid(79));
    let injected = Instant::now();
    let drained = poll_until(PHASE, || {
        world.slurm_reason("node2").is_some_and(|r| r.starts_with("fleetmend: "))
    });
    let took = injected.elapsed();
    assert!(drained, "node2 was not drained in Slurm:\n{}", world.diagnostics());
    println!("fault → drained in Slurm (sinfo -R): {:.2} s", took.as_secs_f64());
    assert!(took < DRAIN_WITHIN, "drained after {took:?}:\n{}", world.diagnostics());
    let reason = world.slurm_reason("node2").unwrap();
    assert!(reason.contains("79"), "the drain reason does not name the Xid: {reason}");

    // Rebooted through Slurm, validated, undrained: idle in Slurm, healthy in fleetmend.
    assert!(
        poll_until(PHASE, || world.finished_repair("node2").is_some()),
        "node2's repair did not finish:\n{}",
        world.diagnostics()
    );
    let outcome = world.finished_repair("node2").unwrap();
    assert!(outcome.contains("repaired and validated"), "{outcome}\n{}", world.diagnostics());
    assert_eq!(world.reboots("node2"), 1, "node2 was not rebooted exactly once");
    assert!(
        poll_until(PHASE, || world.cluster.node_state("node2") == "idle"),
        "node2 is not idle in Slurm: {}\n{}",
        world.cluster.node_state("node2"),
        world.diagnostics()
    );
    assert_eq!(world.slurm_reason("node2"), None);
    assert_eq!(world.state("node2"), "healthy");
    // Nobody else was touched.
    for node in ["node1", "node3", "node4"] {
        assert_eq!(world.cluster.node_state(node), "idle", "{node}");
        assert_eq!(world.reboots(node), 0, "{node}");
    }
}

#[test]
fn an_admins_drain_is_never_undone_and_a_repair_of_that_node_leaves_it_to_the_admin() {
    if !can_run() {
        return;
    }
    let world = World::start(|cluster| {
        cluster
            .slurm("scontrol", &["update", "NodeName=node3", "State=DRAIN", "Reason=maintenance"]);
    });

    // A fault on the admin-drained node: fleetmend repairs it, but the node stays drained with
    // the admin's reason, and fleetmend says so.
    world.inject("node3", Fault::GpuXid(79));
    assert!(
        poll_until(PHASE, || world.finished_repair("node3").is_some()),
        "node3's repair did not finish:\n{}",
        world.diagnostics()
    );
    // Slurm notes the reboot after the admin's words (`maintenance : reboot issued ...`): the
    // reason stays the admin's and the node stays out of service.
    let reason = world.slurm_reason("node3").unwrap_or_default();
    assert!(reason.starts_with("maintenance"), "{reason}\n{}", world.diagnostics());
    let out_of_service = |state: &str| state == "drained" || state == "down";
    assert!(
        poll_until(PHASE, || out_of_service(&world.cluster.node_state("node3"))),
        "node3 is {} after its reboot\n{}",
        world.cluster.node_state("node3"),
        world.diagnostics()
    );
    let reason = world.slurm_reason("node3").unwrap_or_default();
    assert!(reason.starts_with("maintenance"), "{reason}\n{}", world.diagnostics());
    let left = world.events_of("node3").iter().any(|e| {
        e["reason"].as_str().is_some_and(|r| r.contains("someone else drained it (maintenance"))
    });
    assert!(left, "no event says node3 was left to its admin:\n{}", world.diagnostics());
}

#[test]
fn a_drain_while_slurmctld_is_down_is_retried_with_a_clear_error_and_done_when_it_is_back() {
    if !can_run() {
        return;
    }
    let world = World::start(|_| {});
    world.cluster.stop_controller();

    world.inject("node2", Fault::GpuXid(79));
    let failed = |world: &World| {
        world.events_of("node2").into_iter().find(|e| {
            e["kind"] == "workflow-step"
                && e["reason"].as_str().is_some_and(|r| r.starts_with("Drain failed, retrying"))
        })
    };
    assert!(
        poll_until(PHASE, || failed(&world).is_some()),
        "no retry of the drain in the events:\n{}",
        world.diagnostics()
    );
    let error = failed(&world).unwrap()["reason"].as_str().unwrap().to_owned();
    assert!(error.contains("slurmctld") || error.contains("controller"), "unclear: {error}");
    assert_eq!(world.state("node2"), "draining");

    // slurmctld back: the drain is done, the repair goes on to the end.
    world.cluster.start_controller();
    let back = Instant::now();
    assert!(
        poll_until(PHASE, || {
            world.slurm_reason("node2").is_some_and(|r| r.starts_with("fleetmend: "))
        }),
        "node2 was not drained once slurmctld was back:\n{}",
        world.diagnostics()
    );
    println!("slurmctld back → node2 drained: {:.2} s", back.elapsed().as_secs_f64());
    assert!(
        poll_until(PHASE, || world.finished_repair("node2").is_some()),
        "node2's repair did not finish:\n{}",
        world.diagnostics()
    );
    assert!(
        poll_until(PHASE, || world.cluster.node_state("node2") == "idle"),
        "node2 is not idle: {}\n{}",
        world.cluster.node_state("node2"),
        world.diagnostics()
    );
    // Exactly one workflow, one reboot: nothing lost, nothing repeated.
    assert_eq!(world.reboots("node2"), 1);
    let finished =
        world.events_of("node2").iter().filter(|e| e["kind"] == "repair-finished").count();
    assert_eq!(finished, 1, "{}", world.diagnostics());
}

#[test]
fn a_training_job_on_a_faulty_node_is_checkpointed_requeued_and_resumed_bit_exact() {
    if !can_run() {
        return;
    }
    const STEPS: u64 = 150;
    const EVERY: u64 = 10;
    // `fleetmend up`'s small model at a GPU's pace: the job waits on Slurm and the repair, not
    // on the CPU the tests beside it share.
    let model = fleetmend_local::up::TrainModel::Small.args();
    // The uninterrupted run's weights, for the same trainer flags (the pace changes no number).
    let reference = tempfile::tempdir().unwrap();
    let argv = [fleetmend_bin().display().to_string(), "train".to_owned()]
        .into_iter()
        .chain(
            ["--steps", &STEPS.to_string(), "--checkpoint-every", &EVERY.to_string()]
                .map(str::to_owned),
        )
        .chain(model.iter().map(|a| (*a).to_owned()))
        .collect();
    let straight = uninterrupted_hash(reference.path(), argv, 2, PHASE);

    let world = World::start(|_| {});
    let checkpoints = world.cluster.path().join("checkpoints");
    let train_args = format!("{} --pace 100ms", model.join(" "));
    let (job, out) = world.cluster.submit_resumable(&checkpoints, STEPS, EVERY, &train_args);
    let output = || std::fs::read_to_string(&out).unwrap_or_default();
    // Training, with a checkpoint or two behind it.
    assert!(
        poll_until(PHASE, || {
            train_events(&out, "checkpoint").iter().any(|c| c["step"].as_u64() >= Some(2 * EVERY))
        }),
        "the job did not get going: {}\n{}",
        world.cluster.job_state(&job),
        output()
    );
    let nodes = world.cluster.slurm("scontrol", &["show", "hostnames", &job_nodes(&world, &job)]);
    let nodes: Vec<&str> = nodes.lines().collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let victim = nodes[1].to_owned();

    // A fault on the node of rank 1: drained, the job asked to checkpoint and requeued.
    world.inject(&victim, Fault::GpuXid(79));
    assert!(
        poll_until(PHASE, || world
            .slurm_reason(&victim)
            .is_some_and(|r| r.starts_with("fleetmend: "))),
        "{victim} was not drained:\n{}",
        world.diagnostics()
    );
    let restarted = |world: &World| {
        let line = world.cluster.slurm("scontrol", &["show", "job", "-o", &job]);
        restarts_of(&line) >= 1
    };
    assert!(
        poll_until(PHASE, || restarted(&world)),
        "the job was not requeued: {}\n{}\n{}",
        world.cluster.job_state(&job),
        output(),
        world.diagnostics()
    );
    let requeued = Instant::now();
    let banner = format!("fleetmend-train: job {job} restart 1 on ");
    assert!(
        poll_until(PHASE, || output().contains(&banner)),
        "the requeued job did not run again: {}\n{}",
        world.cluster.job_state(&job),
        output()
    );
    let took = requeued.elapsed();
    println!("requeue → running again: {:.2} s", took.as_secs_f64());
    assert!(took < Duration::from_secs(10), "ran again only after {took:?}");

    // Resumed from the newest checkpoint, on healthy nodes, to the uninterrupted run's weights.
    assert!(
        poll_until(PHASE, || world.cluster.job_state(&job) == "COMPLETED"),
        "the job did not complete: {}\n{}",
        world.cluster.job_state(&job),
        output()
    );
    // The output holds every attempt, the second after its banner.
    let text = output();
    let (first, second) = text.split_at(text.find(&banner).unwrap());
    let events_in = |part: &str, kind: &str| -> Vec<Value> {
        part.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == kind)
            .collect()
    };
    // The repairer's SIGUSR1 reached the ranks: a checkpoint it asked for, before the requeue.
    let asked = events_in(first, "checkpoint").iter().any(|c| c["trigger"] == "sigusr1");
    assert!(asked, "no checkpoint on SIGUSR1 in the first attempt:\n{first}");
    let newest = events_in(first, "checkpoint").iter().filter_map(|c| c["step"].as_u64()).max();
    let resumed = events_in(second, "start");
    assert_eq!(resumed.len(), 2, "{text}");
    for start in &resumed {
        assert_eq!(start["start_step"].as_u64(), newest, "{text}");
    }
    let done = train_events(&out, "done");
    let last = done.last().unwrap();
    assert_eq!(last["step"].as_u64(), Some(STEPS));
    assert_eq!(last["weights_sha256"].as_str(), Some(straight.as_str()), "{}", output());
    assert!(!output().contains(&format!("restart 1 on {victim}")), "restarted on the drained node");
}

/// The `NodeList` of a running job (`node[1-2]`).
fn job_nodes(world: &World, job: &str) -> String {
    world.cluster.slurm("squeue", &["-h", "-j", job, "-o", "%N"]).trim().to_owned()
}

/// Slurm's `Restarts=` of a job's `scontrol show job -o` line.
fn restarts_of(line: &str) -> u32 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("Restarts="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
