//! `fleetmend up --repairers N` (N ≥ 2): the local fleet with several repairers sharing one
//! PostgreSQL, one of them leading, so that killing the leader (`kill -9 PID`) shows another
//! take over.
//!
//! - PostgreSQL: Debian's `postgresql` package run by us, its cluster in `<state>/postgres`
//!   (initdb once), on a free loopback port, stopped with the fleet.
//! - Repairers: `fleetmend repairer --config <state>/repairers/repairer-I.toml` child processes,
//!   each on a loopback port of its own, logging to `repairer-I.log` beside its config. One that
//!   exits (killed, or a leader that lost its lease and exits with status 75) is started again
//!   after [`RESTART_DELAY`], as systemd's `Restart=always` would; it comes back as a standby.
//! - Their provider is the stock `command` provider calling back into this process
//!   (`fleetmend up-provider`, see [`super::control`]); the agents stay this process's children.
//! - Agents get every repairer's URL and follow a standby's pointer to the leader; the training
//!   job is submitted through the API, and what is shown is read from whichever repairer answers.
//!
//! The spares are set aside here (a replacement takes one), but they report as ordinary nodes:
//! the embedded queue of a repairer in another process does not hold them drained.
//!
//! The repairer processes are in `repairers`, their configs in `repairer_toml`, and what the
//! view reads from them in `snapshot`.

mod repairer_toml;
mod repairers;
mod snapshot;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetmend_repairer::client::Client;
use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::leadership::Role as LeaderRole;
use fleetmend_repairer::postgres_server::PostgresServer;
use fleetmend_repairer::queue::JobView;

pub use self::repairer_toml::{LEASE, RENEW, repairer_toml};
pub(super) use self::repairers::stop_stale_repairers;
pub use self::repairers::{RESTART_DELAY, RepairerProcess};
use self::repairers::{Repairers, Slot, keep};
pub use self::snapshot::Snapshot;
use self::snapshot::{leader_of, poll};
use super::control;
use super::fleet::{self, FinalLine, FleetConfig, FleetError, FleetFile, FleetScheduler, Prepared};
use super::supervisor::{Role, Supervisor};
use crate::provider::LocalProvider;

/// The repairers' database in the PostgreSQL of the fleet.
const DATABASE: &str = "fleetmend";
/// Longest wait for every repairer to answer, and for a leader, at start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Each request of the view's reads.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A running local fleet with several repairers.
pub struct HaFleet {
    config: FleetConfig,
    state_dir: PathBuf,
    supervisor: Arc<Supervisor>,
    postgres: Option<PostgresServer>,
    store_url: String,
    repairers: Arc<Repairers>,
    client: Client,
    urls: Vec<String>,
    admin_token_file: PathBuf,
    job_id: Option<String>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started_ms: u64,
}

impl std::fmt::Debug for HaFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaFleet")
            .field("state_dir", &self.state_dir)
            .field("repairers", &self.urls)
            .finish_non_exhaustive()
    }
}

fn free_port() -> Result<u16, FleetError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|err| FleetError::Repairers(format!("finding a free loopback port: {err}")))
}

impl HaFleet {
    /// Starts PostgreSQL, `repairers` repairer processes and every agent, waits for a leader and
    /// the agents' first reports, and submits the job.
    pub async fn start(config: FleetConfig, count: u32) -> Result<HaFleet, FleetError> {
        if config.scheduler != FleetScheduler::Embedded {
            return Err(FleetError::Repairers(
                "several repairers run with the embedded queue only (not --scheduler slurm)"
                    .to_owned(),
            ));
        }
        if !config.alert_sinks.is_empty() {
            return Err(FleetError::Repairers(
                "several repairers are started without alert sinks".to_owned(),
            ));
        }
        let Prepared {
            state_dir,
            admin_token_file,
            admin_token,
            roles,
            supervisor,
            started_ms,
            ..
        } = fleet::prepare(&config)?;
        let pg_dir = state_dir.join("postgres");
        let started = tokio::task::spawn_blocking(move || {
            let mut server = PostgresServer::init(&pg_dir)?;
            server.start()?;
            match server.database(DATABASE) {
                Ok(url) => Ok((server, url)),
                Err(err) => {
                    let _ = server.stop_mode("immediate");
                    Err(err)
                }
            }
        })
        .await
        .map_err(|err| FleetError::Repairers(format!("starting PostgreSQL: {err}")))?;
        let (postgres, store_url) = started?;

        let repairers = Arc::new(Repairers::new(config.exe.clone()));
        let mut fleet = HaFleet {
            config,
            state_dir,
            supervisor,
            postgres: Some(postgres),
            store_url,
            repairers,
            // Replaced once the repairers' URLs are known.
            client: Client::new("http://127.0.0.1:1", None, "fleetmend-up", READ_TIMEOUT, None)
                .map_err(|err| FleetError::Repairers(err.to_string()))?,
            urls: Vec::new(),
            admin_token_file,
            job_id: None,
            tasks: Vec::new(),
            started_ms,
        };
        if let Err(err) = fleet.bring_up(count.max(2), &admin_token, &roles).await {
            fleet.shutdown().await;
            return Err(err);
        }
        Ok(fleet)
    }

    async fn bring_up(
        &mut self,
        count: u32,
        admin_token: &str,
        roles: &[(String, Role)],
    ) -> Result<(), FleetError> {
        // The callback of the repairers' provider.
        let socket = self.state_dir.join(control::SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).map_err(|err| {
            FleetError::Repairers(format!("listening on {}: {err}", socket.display()))
        })?;
        let provider = LocalProvider::new(self.supervisor.clone());
        self.tasks.push(tokio::spawn(control::serve(listener, provider)));

        let dir = self.state_dir.join("repairers");
        std::fs::create_dir_all(&dir)
            .map_err(|source| FleetError::StateDir { path: dir.clone(), source })?;
        for i in 1..=count {
            let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let name = format!("repairer-{i}");
            let config = dir.join(format!("{name}.toml"));
            let text = repairer_toml(&self.config, &self.state_dir, &self.store_url, listen)?;
            std::fs::write(&config, text)
                .map_err(|source| FleetError::Write { path: config.clone(), source })?;
            let mut slot = Slot {
                process: RepairerProcess {
                    url: format!("http://{listen}"),
                    pid: None,
                    log: dir.join(format!("{name}.log")),
                    config,
                    name,
                    restarts: 0,
                },
                child: None,
                restart_at: None,
            };
            self.repairers.spawn(&mut slot)?;
            self.urls.push(slot.process.url.clone());
            self.repairers.slots().push(slot);
        }
        self.client = Client::new(
            &self.urls.join(","),
            Some(admin_token.to_owned()),
            "fleetmend-up",
            READ_TIMEOUT,
            None,
        )
        .map_err(|err| FleetError::Repairers(err.to_string()))?;
        let http = reqwest::Client::builder()
            .timeout(READ_TIMEOUT)
            .build()
            .map_err(|err| FleetError::Repairers(format!("an HTTP client: {err}")))?;
        self.wait_for_leader(&http).await?;
        self.tasks.push(tokio::spawn(keep(self.repairers.clone(), self.state_dir.clone())));
        self.tasks.push(tokio::spawn(poll(self.repairers.clone(), http, self.client.clone())));
        let agents = fleet::watch_agents(self.supervisor.clone(), self.state_dir.clone());
        self.tasks.push(tokio::spawn(agents));

        self.supervisor.set_repairer_urls(&self.urls);
        let since = now_ms();
        for (node, role) in roles {
            if *role != Role::Retired {
                self.supervisor.start_agent(node)?;
            }
        }
        self.write_fleet_file(true);
        self.wait_for_reports(roles, since).await?;
        if self.config.job {
            self.job_id = Some(self.submit_job().await?);
            self.write_fleet_file(true);
        }
        Ok(())
    }

    /// Waits until every repairer answers and one of them leads; a repairer that exits meanwhile
    /// fails the start with its log's end.
    async fn wait_for_leader(&self, http: &reqwest::Client) -> Result<(), FleetError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut answers = Vec::new();
            for process in self.repairers.processes() {
                answers.push((process.clone(), leader_of(http, &process.url).await));
            }
            let all = answers.iter().all(|(_, a)| a.is_some());
            if all
                && answers
                    .iter()
                    .any(|(_, a)| a.as_ref().is_some_and(|a| a.role == LeaderRole::Leader))
            {
                self.repairers.snapshot().repairers = answers;
                return Ok(());
            }
            for slot in self.repairers.slots().iter_mut() {
                if let Some(child) = &mut slot.child
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Err(FleetError::Repairers(format!(
                        "{} exited at start ({status}); its log {}:\n{}",
                        slot.process.name,
                        slot.process.log.display(),
                        fleet::tail(&slot.process.log, 15)
                    )));
                }
            }
            if Instant::now() >= deadline {
                let silent: Vec<String> = answers
                    .iter()
                    .filter(|(_, a)| a.is_none())
                    .map(|(p, _)| format!("{} ({})", p.name, p.log.display()))
                    .collect();
                return Err(FleetError::Repairers(format!(
                    "no leader within {} s; not answering: {}",
                    START_TIMEOUT.as_secs(),
                    if silent.is_empty() { "none".to_owned() } else { silent.join(", ") }
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_for_reports(
        &self,
        roles: &[(String, Role)],
        since: u64,
    ) -> Result<(), FleetError> {
        let deadline = Instant::now() + self.config.join_timeout;
        let mut waiting: Vec<&String> =
            roles.iter().filter(|(_, r)| *r != Role::Retired).map(|(n, _)| n).collect();
        loop {
            if let Ok(nodes) = self.client.nodes().await {
                waiting.retain(|name| {
                    !nodes.iter().any(|n| &n.name == *name && n.last_report_ms >= since)
                });
            }
            let Some(node) = waiting.first() else { return Ok(()) };
            let dead = self.supervisor.reap().contains(node);
            if dead || Instant::now() >= deadline {
                let log = self.state_dir.join("nodes").join(node).join("agent.log");
                return Err(FleetError::Join(Box::new(fleet::JoinFailure {
                    node: (*node).clone(),
                    seconds: self.config.join_timeout.as_secs(),
                    why: if dead { "its agent exited".to_owned() } else { "timed out".to_owned() },
                    tail: fleet::tail(&log, 15),
                    log,
                })));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn submit_job(&self) -> Result<String, FleetError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let answer = match self.client.jobs().await {
                // A fleet restarted on its state directory follows its unfinished job.
                Ok(jobs) => match jobs.into_iter().rev().find(|j| !j.job.state.is_final()) {
                    Some(job) => Ok(job.job.id),
                    None => self
                        .client
                        .submit(&fleet::job_spec(&self.config, &self.state_dir))
                        .await
                        .map(|view| view.job.id),
                },
                Err(err) => Err(err),
            };
            match answer {
                Ok(id) => return Ok(id),
                // A leader being elected answers 503 for a moment.
                Err(err) if Instant::now() >= deadline => {
                    return Err(FleetError::Submit(err.to_string()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn write_fleet_file(&self, running: bool) {
        let mut file = FleetFile {
            repairer: self.urls.join(","),
            admin_token_file: self.admin_token_file.clone(),
            job: self.job_id.clone(),
            running,
            pid: std::process::id(),
            nodes: Vec::new(),
            spares: Vec::new(),
            retired: Vec::new(),
            agents: Vec::new(),
            repairers: self.repairers.processes(),
        };
        fleet::fill_nodes(&mut file, &self.supervisor.nodes());
        fleet::write_fleet_json(&self.state_dir, &file);
    }

    // --- what `fleetmend up` shows -------------------------------------------------------------

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    /// The repairers' shared store (a PostgreSQL URL).
    pub fn store_url(&self) -> &str {
        &self.store_url
    }

    /// Every repairer's base URL.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    pub fn admin_token_file(&self) -> &Path {
        &self.admin_token_file
    }

    pub fn job_id(&self) -> Option<&str> {
        self.job_id.as_deref()
    }

    pub fn supervisor(&self) -> &Arc<Supervisor> {
        &self.supervisor
    }

    /// The repairers, the nodes and the jobs as last read.
    pub fn snapshot(&self) -> Snapshot {
        self.repairers.snapshot().clone()
    }

    /// The job as last read from the repairers.
    pub fn job(&self) -> Option<JobView> {
        let id = self.job_id.as_deref()?;
        self.repairers.snapshot().jobs.iter().find(|j| j.job.id == id).cloned()
    }

    /// The `done` line of the job's last attempt, once it completed.
    pub fn final_line(&self) -> Option<FinalLine> {
        fleet::final_line_of(&self.state_dir, &self.job()?)
    }

    /// Stops everything it started: the job cancelled (its ranks checkpoint), the repairers, the
    /// agents, PostgreSQL.
    pub async fn shutdown(mut self) {
        self.supervisor.begin_stop();
        if let Some(id) = self.job_id.clone()
            && self.job().is_some_and(|j| !j.job.state.is_final())
        {
            if let Err(err) = self.client.cancel(&id).await {
                tracing::warn!(job = %id, error = %err, "cancelling the job failed");
            }
            let limit = self.config.report_interval * 4 + self.config.rank_stop_grace;
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline && self.job().is_some_and(|j| !j.job.state.is_final()) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
        self.repairers.stop().await;
        self.supervisor.stop_all(&self.state_dir.join("nodes")).await;
        if let Some(postgres) = self.postgres.take() {
            let stopped = tokio::task::spawn_blocking(move || postgres.stop_mode("fast")).await;
            match stopped {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(error = %err, "stopping PostgreSQL failed"),
                Err(err) => tracing::warn!(error = %err, "stopping PostgreSQL failed"),
            }
        }
        let _ = std::fs::remove_file(self.state_dir.join(control::SOCKET));
        self.write_fleet_file(false);
    }
}
