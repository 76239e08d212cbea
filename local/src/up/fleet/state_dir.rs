//! The state directory a fleet starts on: an earlier fleet's agents stopped (or its state removed
//! with `fresh`), the tokens, the nodes' trees and roles (kept across restarts in `fleet.json`),
//! and the supervisor of their agents.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleetmend_repairer::clock::unix_now_ms as now_ms;

use super::fleet_file::FleetFile;
use super::{FleetConfig, FleetError};
use crate::tree::NodeTree;
use crate::up::supervisor::{self, AgentSettings, Role, Supervisor};

/// Random hex from /dev/urandom.
fn random_hex(bytes: usize) -> Result<String, std::io::Error> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Reads the token in `path`, or writes a new one there (mode 0600).
fn token_file(path: &Path) -> Result<String, FleetError> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let token = text.trim().to_owned();
        if !token.is_empty() {
            return Ok(token);
        }
    }
    let write_err = |source| FleetError::Write { path: path.to_owned(), source };
    let token = random_hex(24).map_err(write_err)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(write_err)?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes()).map_err(write_err)?;
    Ok(token)
}

/// Stops agents an earlier `fleetmend up` on this state directory left running (it was killed):
/// their pid files name them, and their command lines name the node's directory.
fn stop_stale_agents(nodes_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(nodes_dir) else { return };
    for entry in entries.flatten() {
        let pid_file = entry.path().join(crate::tree::AGENT_PID_FILE);
        let Some(pid) =
            std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let dir = entry.path().display().to_string();
        let ours = cmdline
            .split(|b| *b == 0)
            .filter_map(|arg| std::str::from_utf8(arg).ok())
            .any(|arg| arg.contains(&dir));
        if ours {
            tracing::warn!(pid, dir, "stopping an agent left by an earlier fleetmend up");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_file(&pid_file);
    }
    supervisor::kill_ranks_under(Path::new("/proc"), nodes_dir);
}

/// The names and roles of a new fleet: `node-1`..`node-N` work, the spares come after them.
pub fn initial_roles(nodes: u32, spares: u32) -> Vec<(String, Role)> {
    (1..=nodes.saturating_add(spares))
        .map(|i| (format!("node-{i}"), if i <= nodes { Role::Worker } else { Role::Spare }))
        .collect()
}

/// What every kind of local fleet builds before its repairers start: the state directory (an
/// earlier fleet's leftovers stopped, or its state removed with `fresh`), the tokens, the nodes'
/// trees and roles, and the supervisor of their agents.
pub(in crate::up) struct Prepared {
    pub state_dir: PathBuf,
    pub admin_token_file: PathBuf,
    pub agent_token_file: PathBuf,
    pub admin_token: String,
    pub roles: Vec<(String, Role)>,
    pub supervisor: Arc<Supervisor>,
    pub started_ms: u64,
}

pub(in crate::up) fn prepare(config: &FleetConfig) -> Result<Prepared, FleetError> {
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(FleetError::Invalid(problems));
    }
    let started_ms = now_ms();
    let dir_err = |path: &Path| {
        let path = path.to_owned();
        move |source| FleetError::StateDir { path, source }
    };
    std::fs::create_dir_all(&config.state_dir).map_err(dir_err(&config.state_dir))?;
    let state_dir = config.state_dir.canonicalize().map_err(dir_err(&config.state_dir))?;
    let nodes_dir = state_dir.join("nodes");
    stop_stale_agents(&nodes_dir);
    crate::up::ha::stop_stale_repairers(&state_dir);
    if config.fresh {
        clear(&state_dir)?;
    }
    std::fs::create_dir_all(&nodes_dir).map_err(dir_err(&nodes_dir))?;
    let admin_token_file = state_dir.join("admin.token");
    let agent_token_file = state_dir.join("agent.token");
    let admin_token = token_file(&admin_token_file)?;
    token_file(&agent_token_file)?;

    let roles = roles(&state_dir, config)?;
    let supervisor = Arc::new(Supervisor::new(AgentSettings {
        exe: config.exe.clone(),
        token_file: agent_token_file.clone(),
        report_interval: config.report_interval,
        rank_stop_grace: config.rank_stop_grace,
        boot_delay: config.boot_delay,
    }));
    for (node, role) in &roles {
        let dir = nodes_dir.join(node);
        let tree = if dir.exists() { NodeTree::open(&dir) } else { NodeTree::create(&dir, node) }
            .map_err(|source| FleetError::Tree {
            node: node.clone(),
            source: Box::new(source),
        })?;
        supervisor.add(tree, *role)?;
    }
    Ok(Prepared {
        state_dir,
        admin_token_file,
        agent_token_file,
        admin_token,
        roles,
        supervisor,
        started_ms,
    })
}

/// Removes a previous fleet's state (its trees unmounted first).
fn clear(state_dir: &Path) -> Result<(), FleetError> {
    let nodes_dir = state_dir.join("nodes");
    if let Ok(entries) = std::fs::read_dir(&nodes_dir) {
        for entry in entries.flatten() {
            if let Ok(tree) = NodeTree::open(&entry.path())
                && let Err(source) = tree.cleanup()
            {
                return Err(FleetError::Tree {
                    node: tree.node().to_owned(),
                    source: Box::new(source),
                });
            }
        }
    }
    let entries = std::fs::read_dir(state_dir)
        .map_err(|source| FleetError::StateDir { path: state_dir.to_owned(), source })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|source| FleetError::StateDir { path, source })?;
    }
    Ok(())
}

/// The nodes and their roles: from `fleet.json` when the state directory holds a fleet of the
/// same size (a spare that replaced a node stays a worker), else a new layout.
fn roles(state_dir: &Path, config: &FleetConfig) -> Result<Vec<(String, Role)>, FleetError> {
    let path = state_dir.join("fleet.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(initial_roles(config.nodes, config.spares));
    };
    let file: FleetFile = serde_json::from_str(&text)
        .map_err(|err| FleetError::Read { path: path.clone(), message: err.to_string() })?;
    let total = file.agents.len();
    let active = file.nodes.len();
    if active != config.nodes as usize || total != (config.nodes + config.spares) as usize {
        return Err(FleetError::OtherFleet {
            path: state_dir.to_owned(),
            found: format!(
                "{active} working node(s), {} spare(s), {} retired",
                file.spares.len(),
                file.retired.len()
            ),
        });
    }
    Ok(file.agents.into_iter().map(|a| (a.name, a.role)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spares_sort_after_the_working_nodes() {
        let roles = initial_roles(4, 1);
        let names: Vec<&str> = roles.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["node-1", "node-2", "node-3", "node-4", "node-5"]);
        assert_eq!(roles[4].1, Role::Spare);
        assert!(roles[..4].iter().all(|(_, r)| *r == Role::Worker));
    }
}
