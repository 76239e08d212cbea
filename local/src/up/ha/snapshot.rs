//! What `fleetmend up --repairers N` shows: every repairer's answer to who leads, and the nodes
//! and jobs as whichever repairer answers sees them, read in the background.

use std::sync::Arc;
use std::time::Duration;

use fleetmend_repairer::client::Client;
use fleetmend_repairer::engine::NodeSummary;
use fleetmend_repairer::leadership::{LeaderView, Role as LeaderRole};
use fleetmend_repairer::queue::JobView;

use super::repairers::{RepairerProcess, Repairers};

/// How often the repairers are asked who leads, and the nodes and jobs read.
const POLL: Duration = Duration::from_millis(300);

/// What the view shows: every repairer with its answer, and the fleet as one of them sees it.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Each repairer and its answer to `GET /v1/leader` (none: it did not answer).
    pub repairers: Vec<(RepairerProcess, Option<LeaderView>)>,
    pub nodes: Vec<NodeSummary>,
    pub jobs: Vec<JobView>,
    /// What happened to the repairer processes, oldest first: (Unix ms, line).
    pub notes: Vec<(u64, String)>,
}

impl Snapshot {
    /// The leader's URL as the repairers say it.
    pub fn leader(&self) -> Option<&str> {
        let answers = || self.repairers.iter().filter_map(|(_, a)| a.as_ref());
        answers()
            .find(|a| a.role == LeaderRole::Leader)
            .map(|a| a.this.as_str())
            .or_else(|| answers().find_map(|a| a.leader.as_deref()))
    }
}

/// A repairer's answer to `GET /v1/leader`, or none.
pub(super) async fn leader_of(http: &reqwest::Client, url: &str) -> Option<LeaderView> {
    let response = http.get(format!("{url}/v1/leader")).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// Asks every repairer who leads, and reads the nodes and jobs from whichever answers.
pub(super) async fn poll(repairers: Arc<Repairers>, http: reqwest::Client, client: Client) {
    loop {
        let mut answers = Vec::new();
        for process in repairers.processes() {
            let answer = match process.pid {
                Some(_) => leader_of(&http, &process.url).await,
                None => None,
            };
            answers.push((process, answer));
        }
        let nodes = client.nodes().await.ok();
        let jobs = client.jobs().await.ok();
        {
            let mut snapshot = repairers.snapshot();
            snapshot.repairers = answers;
            if let Some(nodes) = nodes {
                snapshot.nodes = nodes;
            }
            if let Some(jobs) = jobs {
                snapshot.jobs = jobs;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_leader_is_the_one_that_says_so_or_the_one_the_others_name() {
        let process = |name: &str| RepairerProcess {
            name: name.to_owned(),
            url: format!("http://{name}"),
            pid: Some(1),
            config: PathBuf::new(),
            log: PathBuf::new(),
            restarts: 0,
        };
        let answer = |this: &str, role: LeaderRole, leader: Option<&str>| LeaderView {
            leader: leader.map(str::to_owned),
            epoch: 2,
            lease_until_ms: None,
            this: this.to_owned(),
            role,
        };
        let mut snapshot = Snapshot {
            repairers: vec![
                (process("a"), Some(answer("http://a", LeaderRole::Standby, Some("http://b")))),
                (process("b"), None),
            ],
            ..Snapshot::default()
        };
        assert_eq!(snapshot.leader(), Some("http://b"));
        snapshot.repairers[1].1 = Some(answer("http://b", LeaderRole::Leader, Some("http://b")));
        assert_eq!(snapshot.leader(), Some("http://b"));
        snapshot.repairers = Vec::new();
        assert_eq!(snapshot.leader(), None);
    }
}
