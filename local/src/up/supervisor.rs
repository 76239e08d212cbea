//! The simulated nodes' agents: one real `fleetmend agent` process per node, started, stopped and
//! rebooted here, and watched for deaths it did not cause (the `agent-kill` fault). The `local`
//! provider and `fleetmend up` share one [`Supervisor`] behind an `Arc`.
//!
//! How the agents are run and their config are in `settings`, the ranks they leave behind in
//! `ranks`.

mod ranks;
mod settings;

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fleetmend_repairer::clock::unix_now_ms as now_ms;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::faults::Fault;
use crate::tree::NodeTree;

pub use self::ranks::{kill_ranks_under, ranks_under};
pub use self::settings::AgentSettings;

/// What a node is for in the local fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Takes job ranks.
    Worker,
    /// Running, drained in the queue: waits to replace a worker.
    Spare,
    /// Replaced by a spare; its agent is stopped.
    Retired,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Spare => "spare",
            Role::Retired => "retired",
        }
    }
}

/// Where a node's agent stands, as the supervisor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentState {
    Running,
    /// Stopped by the supervisor (a reboot under way, a retired node, the fleet stopping).
    Stopped,
    /// Simulated boot: the tree was rebuilt, the agent starts after the boot delay.
    Booting,
    /// Died without being asked (killed, crashed): not restarted; only a reboot brings it back.
    Dead,
}

impl AgentState {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Running => "running",
            AgentState::Stopped => "stopped",
            AgentState::Booting => "booting",
            AgentState::Dead => "dead",
        }
    }
}

/// A supervisor operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("{node} is not a node of this fleet")]
    UnknownNode { node: String },
    #[error("the fleet is stopping: {operation} of {node} refused")]
    Stopping { operation: &'static str, node: String },
    #[error("starting the agent of {node} ({exe}): {source}")]
    Spawn { node: String, exe: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("no free port for the agent of {node}: {source}")]
    Port { node: String, source: std::io::Error },
    #[error("{operation} of {node}: {source}")]
    Tree { operation: &'static str, node: String, source: crate::tree::TreeError },
    #[error("injecting {fault} into {node}: {source}")]
    Inject { fault: String, node: String, source: crate::faults::InjectError },
    #[error("signalling the agent of {node} (pid {pid}): {source}")]
    Signal { node: String, pid: u32, source: nix::Error },
    #[error("{node} has no running agent")]
    NoAgent { node: String },
    #[error("no spare left to replace {node}: every spare of the fleet is in use")]
    NoSpare { node: String },
    #[error("rebooting {node}: the tree's rebuild did not finish: {message}")]
    Task { node: String, message: String },
    #[error("{node} is retired (replaced by a spare): it is not rebooted")]
    Retired { node: String },
}

/// Something the supervisor did or saw, for the view and the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    /// Increasing from 1 in this process.
    pub seq: u64,
    pub at_ms: u64,
    pub node: String,
    pub what: String,
}

/// One node as the supervisor shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub role: Role,
    pub agent: AgentState,
    pub pid: Option<u32>,
    /// The agent's `/metrics`.
    pub metrics_url: String,
    pub dir: PathBuf,
    /// The spare that replaced it (retired nodes).
    pub replaced_by: Option<String>,
}

#[derive(Debug)]
struct AgentProcess {
    child: Child,
    pid: u32,
}

#[derive(Debug)]
struct Slot {
    tree: NodeTree,
    role: Role,
    agent: Option<AgentProcess>,
    state: AgentState,
    listen: SocketAddr,
    replaced_by: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: BTreeMap<String, Slot>,
    /// The repairer the agents report to (known once it listens).
    repairer_urls: Vec<String>,
    stopping: bool,
    notes: VecDeque<Note>,
    notes_written: u64,
}

/// Notes kept for the view.
const NOTES_KEPT: usize = 200;

/// The agents of the local fleet.
#[derive(Debug)]
pub struct Supervisor {
    settings: AgentSettings,
    inner: Mutex<Inner>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A free port that no node of `slots` was given: a port is free again the moment it is probed,
/// and the kernel may hand it out twice before the first agent binds it.
fn unused_port(slots: &BTreeMap<String, Slot>) -> std::io::Result<u16> {
    let mut port = free_port()?;
    for _ in 0..64 {
        if !slots.values().any(|slot| slot.listen.port() == port) {
            break;
        }
        port = free_port()?;
    }
    Ok(port)
}

impl Supervisor {
    pub fn new(settings: AgentSettings) -> Supervisor {
        Supervisor { settings, inner: Mutex::new(Inner::default()) }
    }

    /// Sets the repairer the agents started from now on report to.
    pub fn set_repairer_url(&self, url: &str) {
        self.set_repairer_urls(&[url.to_owned()]);
    }

    /// Sets the repairers (several: the leader and its standbys) the agents started from now on
    /// report to.
    pub fn set_repairer_urls(&self, urls: &[String]) {
        self.lock().repairer_urls = urls.to_vec();
    }

    pub fn settings(&self) -> &AgentSettings {
        &self.settings
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(inner: &mut Inner, node: &str, what: String) {
        tracing::info!(node, "{what}");
        inner.notes_written += 1;
        let seq = inner.notes_written;
        inner.notes.push_back(Note { seq, at_ms: now_ms(), node: node.to_owned(), what });
        while inner.notes.len() > NOTES_KEPT {
            inner.notes.pop_front();
        }
    }

    /// Records `what` about `node` for the view.
    pub fn record(&self, node: &str, what: impl Into<String>) {
        Self::note(&mut self.lock(), node, what.into());
    }

    /// The notes kept with a `seq` above `after`, oldest first.
    pub fn notes(&self, after: u64) -> Vec<Note> {
        self.lock().notes.iter().filter(|n| n.seq > after).cloned().collect()
    }

    /// Adds a node (its agent not started yet); the agent gets a port of its own.
    pub fn add(&self, tree: NodeTree, role: Role) -> Result<(), SupervisorError> {
        let node = tree.node().to_owned();
        let mut inner = self.lock();
        let port = unused_port(&inner.slots)
            .map_err(|source| SupervisorError::Port { node: node.clone(), source })?;
        let slot = Slot {
            tree,
            role,
            agent: None,
            state: AgentState::Stopped,
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            replaced_by: None,
        };
        inner.slots.insert(node, slot);
        Ok(())
    }

    /// Every node, by name.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.lock()
            .slots
            .iter()
            .map(|(name, slot)| NodeInfo {
                name: name.clone(),
                role: slot.role,
                agent: slot.state,
                pid: slot.agent.as_ref().map(|a| a.pid),
                metrics_url: format!("http://{}/metrics", slot.listen),
                dir: slot.tree.dir().to_owned(),
                replaced_by: slot.replaced_by.clone(),
            })
            .collect()
    }

    pub fn node(&self, node: &str) -> Option<NodeInfo> {
        self.nodes().into_iter().find(|n| n.name == node)
    }

    /// The node's boot id, read from its tree.
    pub fn boot_id(&self, node: &str) -> Result<String, SupervisorError> {
        let inner = self.lock();
        let slot = inner
            .slots
            .get(node)
            .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
        slot.tree.boot_id().map_err(|source| SupervisorError::Tree {
            operation: "reading the boot id",
            node: node.to_owned(),
            source,
        })
    }

    /// Starts `node`'s agent (a no-op when it runs).
    pub fn start_agent(&self, node: &str) -> Result<u32, SupervisorError> {
        let mut inner = self.lock();
        if inner.stopping {
            return Err(SupervisorError::Stopping {
                operation: "starting the agent",
                node: node.to_owned(),
            });
        }
        let settings = &self.settings;
        let inner_urls = inner.repairer_urls.clone();
        let slot = inner
            .slots
            .get(node)
            .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
        if let Some(agent) = &slot.agent {
            return Ok(agent.pid);
        }
        // The same port across restarts keeps the node's /metrics URL; one taken meanwhile by
        // another process is given up for a new one.
        let listen = if TcpListener::bind(slot.listen).is_err() {
            let port = unused_port(&inner.slots)
                .map_err(|source| SupervisorError::Port { node: node.to_owned(), source })?;
            Some(SocketAddr::from(([127, 0, 0, 1], port)))
        } else {
            None
        };
        let slot = inner
            .slots
            .get_mut(node)
            .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
        if let Some(listen) = listen {
            slot.listen = listen;
        }
        let dir = slot.tree.dir().to_owned();
        let jobs = dir.join("jobs");
        let extra = settings.agent_toml(&inner_urls, &jobs);
        slot.tree.agent_config(&extra).map_err(|source| SupervisorError::Tree {
            operation: "writing the agent config",
            node: node.to_owned(),
            source,
        })?;
        let log_path = dir.join("agent.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| SupervisorError::Write { path: log_path.clone(), source })?;
        let log_err = log
            .try_clone()
            .map_err(|source| SupervisorError::Write { path: log_path.clone(), source })?;
        let child = Command::new(&settings.exe)
            .arg("agent")
            .args(slot.tree.agent_flags())
            .arg("--listen")
            .arg(slot.listen.to_string())
            .env(
                "FLEETMEND_LOG",
                std::env::var("FLEETMEND_AGENT_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group: a Ctrl-C in the terminal reaches `fleetmend up` alone, which
            // stops the agents in order (a job's ranks first).
            .process_group(0)
            .spawn()
            .map_err(|source| SupervisorError::Spawn {
                node: node.to_owned(),
                exe: settings.exe.clone(),
                source,
            })?;
        let pid = child.id();
        let pid_path = slot.tree.agent_pid_path();
        let written = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o644)
            .open(&pid_path)
            .and_then(|mut f| writeln!(f, "{pid}"));
        slot.agent = Some(AgentProcess { child, pid });
        slot.state = AgentState::Running;
        let listen = slot.listen;
        if let Err(source) = written {
            // The agent runs; only `fleetmend inject NODE agent-kill` needs the file.
            tracing::warn!(node, path = %pid_path.display(), error = %source, "writing the agent's pid failed");
        }
        Self::note(
            &mut inner,
            node,
            format!("agent started (pid {pid}, metrics http://{listen}/metrics)"),
        );
        Ok(pid)
    }

    /// Stops `node`'s agent: SIGTERM (it stops its ranks: SIGTERM, then SIGKILL after the rank
    /// stop grace), then SIGKILL if it is still there after the grace and a margin.
    pub async fn stop_agent(&self, node: &str, why: &str) -> Result<(), SupervisorError> {
        let (agent, pid_path) = {
            let mut inner = self.lock();
            let slot = inner
                .slots
                .get_mut(node)
                .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
            let agent = slot.agent.take();
            if slot.state == AgentState::Running {
                slot.state = AgentState::Stopped;
            }
            (agent, slot.tree.agent_pid_path())
        };
        let Some(mut agent) = agent else { return Ok(()) };
        let pid = Pid::from_raw(agent.pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let limit = self.settings.rank_stop_grace + Duration::from_secs(5);
        let deadline = Instant::now() + limit;
        let status = loop {
            match agent.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Ok(None) | Err(_) => break None,
            }
        };
        let how = match status {
            Some(status) => describe(status),
            None => {
                let _ = kill(pid, Signal::SIGKILL);
                let _ = tokio::task::spawn_blocking(move || agent.child.wait()).await;
                format!("killed: still running {} after SIGTERM", humantime::format_duration(limit))
            }
        };
        let _ = std::fs::remove_file(&pid_path);
        self.record(node, format!("agent stopped ({why}): {how}"));
        Ok(())
    }

    /// SIGKILLs `node`'s agent, as the `agent-kill` fault does (it is not restarted).
    pub fn kill_agent(&self, node: &str) -> Result<(), SupervisorError> {
        let inner = self.lock();
        let slot = inner
            .slots
            .get(node)
            .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
        let agent = slot
            .agent
            .as_ref()
            .ok_or_else(|| SupervisorError::NoAgent { node: node.to_owned() })?;
        kill(Pid::from_raw(agent.pid as i32), Signal::SIGKILL).map_err(|source| {
            SupervisorError::Signal { node: node.to_owned(), pid: agent.pid, source }
        })
    }

    /// Reaps agents that ended without being asked; returns the nodes whose agent died now.
    pub fn reap(&self) -> Vec<String> {
        let mut inner = self.lock();
        let mut dead = Vec::new();
        for (name, slot) in inner.slots.iter_mut() {
            let Some(agent) = slot.agent.as_mut() else { continue };
            if let Ok(Some(status)) = agent.child.try_wait() {
                slot.agent = None;
                slot.state = AgentState::Dead;
                let _ = std::fs::remove_file(slot.tree.agent_pid_path());
                dead.push((name.clone(), describe(status)));
            }
        }
        for (node, how) in &dead {
            Self::note(
                &mut inner,
                node,
                format!(
                    "agent died ({how}): not restarted, the node stops reporting until a reboot"
                ),
            );
        }
        dead.into_iter().map(|(node, _)| node).collect()
    }

    /// Writes `fault` into `node`'s tree.
    pub fn inject(
        &self,
        node: &str,
        fault: &Fault,
        persistent: bool,
    ) -> Result<(), SupervisorError> {
        if matches!(fault, Fault::AgentKill) {
            self.kill_agent(node)?;
        } else if fault.is_job_fault() {
            let tree = self.tree(node)?;
            tree.signal_ranks(*fault).map_err(|source| SupervisorError::Inject {
                fault: fault.to_string(),
                node: node.to_owned(),
                source,
            })?;
        } else {
            // The tree has its own lock (shared with `fleetmend inject`): not taken under ours.
            let tree = self.tree(node)?;
            tree.inject(fault, persistent).map_err(|source| SupervisorError::Inject {
                fault: fault.to_string(),
                node: node.to_owned(),
                source,
            })?;
        }
        let kind = if persistent { "persistent " } else { "" };
        self.record(node, format!("{kind}fault injected: {fault}"));
        Ok(())
    }

    /// `node`'s tree.
    fn tree(&self, node: &str) -> Result<NodeTree, SupervisorError> {
        let inner = self.lock();
        let slot = inner
            .slots
            .get(node)
            .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
        Ok(slot.tree.clone())
    }

    /// Whether `node` may be rebooted now: a node of the fleet, not retired, the fleet not stopping.
    pub fn check_rebootable(&self, node: &str) -> Result<(), SupervisorError> {
        let inner = self.lock();
        if inner.stopping {
            return Err(SupervisorError::Stopping { operation: "reboot", node: node.to_owned() });
        }
        let slot = inner
            .slots
            .get(node)
            .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
        if slot.role == Role::Retired {
            return Err(SupervisorError::Retired { node: node.to_owned() });
        }
        Ok(())
    }

    /// A simulated reboot, from the call on: the agent is stopped, the tree rebuilt (faults that
    /// are not persistent cleared, a new boot id), and the agent started after the boot delay.
    pub async fn reboot(&self, node: &str) -> Result<String, SupervisorError> {
        self.check_rebootable(node)?;
        self.stop_agent(node, "rebooting").await?;
        let tree = {
            let mut inner = self.lock();
            let slot = inner
                .slots
                .get_mut(node)
                .ok_or_else(|| SupervisorError::UnknownNode { node: node.to_owned() })?;
            slot.state = AgentState::Booting;
            slot.tree.clone()
        };
        // Rebuilding the tree is file work (and may wait for the tree's lock): off the runtime.
        let rebuilt = tokio::task::spawn_blocking(move || tree.reboot()).await;
        let boot_id = match rebuilt {
            Ok(result) => result.map_err(|source| SupervisorError::Tree {
                operation: "rebooting",
                node: node.to_owned(),
                source,
            })?,
            Err(err) => {
                return Err(SupervisorError::Task {
                    node: node.to_owned(),
                    message: err.to_string(),
                });
            }
        };
        self.record(node, format!("rebooting: new boot id {boot_id}"));
        tokio::time::sleep(self.settings.boot_delay).await;
        self.start_agent(node)?;
        Ok(boot_id)
    }

    /// Takes the first spare to replace `node`: the spare becomes a worker, `node` is retired
    /// (its agent is stopped by [`Supervisor::retire`]). With `standby`, the spares are the nodes
    /// the scheduler still holds as hot spares (a spare a waiting job took is at work; a repaired
    /// node that rejoined the pool is a spare again); without, those set aside at start.
    pub fn take_spare(
        &self,
        node: &str,
        standby: Option<&[String]>,
    ) -> Result<String, SupervisorError> {
        let mut inner = self.lock();
        if inner.stopping {
            return Err(SupervisorError::Stopping { operation: "replace", node: node.to_owned() });
        }
        if !inner.slots.contains_key(node) {
            return Err(SupervisorError::UnknownNode { node: node.to_owned() });
        }
        // A replacement asked again (a repairer restarted after the call) gets the same spare.
        if let Some(spare) = inner.slots.get(node).and_then(|s| s.replaced_by.clone()) {
            return Ok(spare);
        }
        let is_spare = |name: &String, slot: &Slot| match standby {
            Some(standby) => name != node && slot.role != Role::Retired && standby.contains(name),
            None => slot.role == Role::Spare,
        };
        let spare = inner
            .slots
            .iter()
            .find(|(name, slot)| is_spare(name, slot))
            .map(|(name, _)| name.clone())
            .ok_or_else(|| SupervisorError::NoSpare { node: node.to_owned() })?;
        if let Some(slot) = inner.slots.get_mut(&spare) {
            slot.role = Role::Worker;
        }
        if let Some(slot) = inner.slots.get_mut(node) {
            slot.role = Role::Retired;
            slot.replaced_by = Some(spare.clone());
        }
        Self::note(&mut inner, node, format!("replaced by the spare {spare}"));
        Ok(spare)
    }

    /// Stops a retired node's agent and unmounts its tree.
    pub async fn retire(&self, node: &str) -> Result<(), SupervisorError> {
        self.stop_agent(node, "retired").await?;
        let inner = self.lock();
        if let Some(slot) = inner.slots.get(node)
            && let Err(err) = slot.tree.cleanup()
        {
            tracing::warn!(node, error = %err, "unmounting the retired node's tree failed");
        }
        Ok(())
    }

    /// Refuses every start, reboot and replacement from now on.
    pub fn begin_stop(&self) {
        self.lock().stopping = true;
    }

    pub fn is_stopping(&self) -> bool {
        self.lock().stopping
    }

    /// Stops every agent (side by side), kills any rank left under `nodes_dir` (ranks of agents
    /// that were killed), and unmounts every tree.
    pub async fn stop_all(&self, nodes_dir: &Path) {
        self.begin_stop();
        let names: Vec<String> = self.lock().slots.keys().cloned().collect();
        let stops = names.iter().map(|node| self.stop_agent(node, "the fleet is stopping"));
        for result in futures_join_all(stops).await {
            if let Err(err) = result {
                tracing::warn!(error = %err, "stopping an agent failed");
            }
        }
        let left = kill_ranks_under(Path::new("/proc"), nodes_dir);
        if left > 0 {
            self.record("-", format!("killed {left} rank process group(s) left by killed agents"));
        }
        let inner = self.lock();
        for (node, slot) in &inner.slots {
            if let Err(err) = slot.tree.cleanup() {
                tracing::warn!(node, error = %err, "unmounting the node's tree failed");
            }
            crate::faults::release_throttles(node);
        }
    }

    /// The node's role.
    pub fn role(&self, node: &str) -> Option<Role> {
        self.lock().slots.get(node).map(|s| s.role)
    }

    /// Whether `node`'s agent process runs.
    pub fn agent_state(&self, node: &str) -> Option<AgentState> {
        self.lock().slots.get(node).map(|s| s.state)
    }
}

/// Runs `futures` side by side and collects their results in order.
async fn futures_join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut results: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, result) in pinned.iter_mut().zip(results.iter_mut()) {
            if result.is_some() {
                continue;
            }
            match future.as_mut().poll(cx) {
                std::task::Poll::Ready(value) => *result = Some(value),
                std::task::Poll::Pending => pending = true,
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    results.into_iter().flatten().collect()
}

/// An exit status in words.
fn describe(status: std::process::ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("killed by {signal}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        (None, None) => "ended".to_owned(),
    }
}
