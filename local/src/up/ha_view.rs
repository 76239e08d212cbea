//! What `fleetmend up --repairers N` prints: a banner with every repairer's URL and PID, then a
//! line for each change: a repairer's role (from its `GET /v1/leader`), its exit and restart, a
//! node's state, the job's state, the supervisor's notes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use fleetmend_repairer::leadership::{LeaderView, Role as LeaderRole};

use super::ha::{HaFleet, RepairerProcess};

/// The lines already printed, to print only what changed.
#[derive(Debug, Default)]
pub struct HaLog {
    repairers: BTreeMap<String, String>,
    nodes: BTreeMap<String, String>,
    job: String,
    notes: usize,
    supervisor_note: u64,
}

/// One repairer as a line: name, URL, PID, role.
pub fn repairer_line(process: &RepairerProcess, answer: Option<&LeaderView>) -> String {
    let pid = process.pid.map_or_else(|| "-".to_owned(), |pid| pid.to_string());
    let role = match (process.pid, answer) {
        (None, _) => "not running".to_owned(),
        (Some(_), None) => "not answering".to_owned(),
        (Some(_), Some(a)) if a.role == LeaderRole::Leader => format!("leader (epoch {})", a.epoch),
        (Some(_), Some(a)) => match &a.leader {
            Some(leader) => format!("standby (leader {leader}, epoch {})", a.epoch),
            None => "standby (no leader)".to_owned(),
        },
    };
    format!("{} {} pid {pid}: {role}", process.name, process.url)
}

impl HaLog {
    /// Where everything is: state, PostgreSQL, the repairers, the token, the nodes.
    pub fn banner(fleet: &HaFleet) -> String {
        let mut text = String::new();
        let _ = writeln!(text, "fleetmend up: state in {}", fleet.state_dir().display());
        let _ = writeln!(text, "store: PostgreSQL {}", fleet.store_url());
        for (process, answer) in fleet.snapshot().repairers {
            let _ = writeln!(text, "{}", repairer_line(&process, answer.as_ref()));
        }
        let _ = writeln!(
            text,
            "CLI: FLEETMEND_REPAIRER={} FLEETMEND_TOKEN_FILE={} fleetmend nodes",
            fleet.urls().join(","),
            fleet.admin_token_file().display()
        );
        let _ = writeln!(text, "kill the leader (kill -9 PID) to watch a standby take over");
        text
    }

    /// The lines for what changed since the last call.
    pub fn lines(&mut self, fleet: &HaFleet) -> Vec<String> {
        let snapshot = fleet.snapshot();
        let mut lines = Vec::new();
        for (_, note) in snapshot.notes.iter().skip(self.notes) {
            lines.push(note.clone());
        }
        self.notes = snapshot.notes.len();
        for note in fleet.supervisor().notes(self.supervisor_note) {
            self.supervisor_note = note.seq;
            lines.push(format!("{}: {}", note.node, note.what));
        }
        for (process, answer) in &snapshot.repairers {
            let line = repairer_line(process, answer.as_ref());
            if self.repairers.get(&process.name) != Some(&line) {
                self.repairers.insert(process.name.clone(), line.clone());
                lines.push(line);
            }
        }
        for node in &snapshot.nodes {
            let state = node.state.to_string();
            if self.nodes.get(&node.name) != Some(&state) {
                self.nodes.insert(node.name.clone(), state.clone());
                lines.push(format!("{}: {state}", node.name));
            }
        }
        if let Some(job) = fleet.job() {
            let line = format!(
                "job {}: {} (attempt {}, nodes {})",
                job.job.id,
                job.job.state,
                job.job.attempt,
                job.job.nodes.join(",")
            );
            if line != self.job {
                self.job = line.clone();
                lines.push(line);
            }
        }
        lines
    }
}
