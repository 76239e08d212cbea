//! `<state>/fleet.json`: what other tools (`fleetmend inject`, `up-provider`, scripts) read to
//! reach a running fleet, written whole through a rename and kept current as agents come and go.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::up::ha::RepairerProcess;
use crate::up::supervisor::{NodeInfo, Role, Supervisor};

/// `<state>/fleet.json`: what other tools need to reach the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetFile {
    /// The repairer's base URL.
    pub repairer: String,
    /// The admin token's file.
    pub admin_token_file: PathBuf,
    /// The training job, once submitted.
    pub job: Option<String>,
    /// Whether `fleetmend up` runs now.
    pub running: bool,
    /// The `fleetmend up` process.
    pub pid: u32,
    /// Nodes that run the job now.
    pub nodes: Vec<String>,
    /// Standby nodes not used yet.
    pub spares: Vec<String>,
    /// Nodes replaced by a spare.
    pub retired: Vec<String>,
    /// Every node's agent: name, role, state, pid, `/metrics` URL, tree directory.
    pub agents: Vec<NodeInfo>,
    /// With several repairers (`--repairers N`): each repairer process, as last started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairers: Vec<RepairerProcess>,
}

pub(in crate::up) fn fill_nodes(file: &mut FleetFile, nodes: &[NodeInfo]) {
    let names =
        |role: Role| nodes.iter().filter(|n| n.role == role).map(|n| n.name.clone()).collect();
    file.nodes = names(Role::Worker);
    file.spares = names(Role::Spare);
    file.retired = names(Role::Retired);
    file.agents = nodes.to_vec();
}

pub(in crate::up) fn read_fleet_file(state_dir: &Path) -> Option<FleetFile> {
    serde_json::from_str(&std::fs::read_to_string(state_dir.join("fleet.json")).ok()?).ok()
}

/// Writes `value` as JSON to `path` through a temporary file and a rename (readers never see half).
fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(&tmp, path)
}

/// Writes `file` as `<state_dir>/fleet.json`; a failure is logged, and the fleet runs on.
pub(in crate::up) fn write_fleet_json(state_dir: &Path, file: &FleetFile) {
    let path = state_dir.join("fleet.json");
    if let Err(err) = write_json(&path, file) {
        tracing::warn!(path = %path.display(), error = %err, "writing fleet.json failed");
    }
}

/// Reaps agents that died by themselves and keeps `fleet.json` current.
pub(in crate::up) async fn watch_agents(supervisor: Arc<Supervisor>, state_dir: PathBuf) {
    let mut last = supervisor.nodes();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if supervisor.is_stopping() {
            return;
        }
        supervisor.reap();
        let now = supervisor.nodes();
        if now != last {
            if let Some(mut file) = read_fleet_file(&state_dir) {
                fill_nodes(&mut file, &now);
                let _ = write_json(&state_dir.join("fleet.json"), &file);
            }
            last = now;
        }
    }
}
