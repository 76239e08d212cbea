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

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fleetmend_repairer::client::Client;
use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::engine::NodeSummary;
use fleetmend_repairer::leadership::{LeaderView, Role as LeaderRole};
use fleetmend_repairer::postgres_server::PostgresServer;
use fleetmend_repairer::queue::JobView;
use serde::{Deserialize, Serialize};

use super::control;
use super::fleet::{
    self, FinalLine, Fleet, FleetConfig, FleetError, FleetFile, FleetScheduler, Prepared,
};
use super::supervisor::{Role, Supervisor};
use crate::provider::LocalProvider;

/// How long after a repairer exited it is started again.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);
/// The repairers' lease: a killed leader's successor leads within this (and one renewal).
pub const LEASE: Duration = Duration::from_secs(6);
/// How often the leader renews its lease.
pub const RENEW: Duration = Duration::from_secs(2);
/// The repairers' database in the PostgreSQL of the fleet.
const DATABASE: &str = "fleetmend";
/// Longest wait for every repairer to answer, and for a leader, at start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stopped repairer gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Each request of the view's reads.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the repairers are asked who leads, and the nodes and jobs read.
const POLL: Duration = Duration::from_millis(300);
/// How often the keeper looks for exited repairers.
const KEEP: Duration = Duration::from_millis(100);

/// One repairer process as `fleet.json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairerProcess {
    /// `repairer-1`..
    pub name: String,
    /// Its base URL (its `[leadership] advertise`).
    pub url: String,
    /// Its process while it runs.
    pub pid: Option<u32>,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Times it was started again after it exited.
    pub restarts: u32,
}

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

/// A repairer child and when it may start again.
struct Slot {
    process: RepairerProcess,
    child: Option<Child>,
    restart_at: Option<Instant>,
}

/// The fleet's repairer processes.
struct Repairers {
    exe: PathBuf,
    slots: Mutex<Vec<Slot>>,
    snapshot: Mutex<Snapshot>,
    stopping: std::sync::atomic::AtomicBool,
}

impl Repairers {
    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn snapshot(&self) -> MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, line: String) {
        tracing::info!("{line}");
        self.snapshot().notes.push((now_ms(), line));
    }

    fn processes(&self) -> Vec<RepairerProcess> {
        self.slots().iter().map(|s| s.process.clone()).collect()
    }

    fn spawn(&self, slot: &mut Slot) -> Result<(), FleetError> {
        let failed = |err: std::io::Error| {
            FleetError::Repairers(format!("starting {}: {err}", slot.process.name))
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&slot.process.log)
            .map_err(failed)?;
        let err = log.try_clone().map_err(failed)?;
        let mut command = Command::new(&self.exe);
        command.arg("repairer").arg("--config").arg(&slot.process.config);
        // A group of its own: the terminal's Ctrl-C reaches `fleetmend up` alone, which stops
        // the repairers after the job.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.stdin(Stdio::null()).stdout(log).stderr(err).spawn().map_err(failed)?;
        slot.process.pid = Some(child.id());
        slot.child = Some(child);
        slot.restart_at = None;
        Ok(())
    }

    /// Reaps repairers that exited and starts them again once their delay is over; whether a
    /// process changed.
    fn keep(&self) -> bool {
        let stopping = self.stopping.load(std::sync::atomic::Ordering::SeqCst);
        let mut changed = false;
        let mut notes = Vec::new();
        {
            let mut slots = self.slots();
            for slot in slots.iter_mut() {
                if let Some(child) = &mut slot.child
                    && let Ok(Some(status)) = child.try_wait()
                {
                    notes.push(format!(
                        "{} (pid {}) exited ({status}); starting it again in {:?}",
                        slot.process.name,
                        child.id(),
                        RESTART_DELAY
                    ));
                    slot.child = None;
                    slot.process.pid = None;
                    slot.restart_at = Some(Instant::now() + RESTART_DELAY);
                    changed = true;
                }
                if !stopping
                    && slot.child.is_none()
                    && slot.restart_at.is_some_and(|at| at <= Instant::now())
                {
                    slot.process.restarts += 1;
                    match self.spawn(slot) {
                        Ok(()) => notes.push(format!(
                            "{} started again: pid {}",
                            slot.process.name,
                            slot.process.pid.unwrap_or_default()
                        )),
                        Err(err) => {
                            notes.push(format!("{err}; trying again"));
                            slot.restart_at = Some(Instant::now() + RESTART_DELAY);
                        }
                    }
                    changed = true;
                }
            }
        }
        for line in notes {
            self.note(line);
        }
        changed
    }

    /// SIGTERM to every repairer, SIGKILL to those still there after [`STOP_GRACE`].
    async fn stop(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut children: Vec<Child> =
            self.slots().iter_mut().filter_map(|slot| slot.child.take()).collect();
        for child in &children {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline
            && children.iter_mut().any(|c| matches!(c.try_wait(), Ok(None)))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for child in &mut children {
            if matches!(child.try_wait(), Ok(None)) {
                tracing::warn!(pid = child.id(), "a repairer did not stop on SIGTERM: SIGKILL");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for slot in self.slots().iter_mut() {
            slot.process.pid = None;
        }
    }
}

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

/// Stops what a killed `fleetmend up --repairers N` on `state_dir` left running: its repairers
/// (named in `fleet.json`, checked by their command line) and its PostgreSQL.
pub(super) fn stop_stale_repairers(state_dir: &Path) {
    if let Some(file) = fleet::read_fleet_file(state_dir) {
        for process in file.repairers {
            let Some(pid) = process.pid.and_then(|p| i32::try_from(p).ok()) else { continue };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let config = process.config.display().to_string();
            let ours = cmdline
                .split(|b| *b == 0)
                .filter_map(|arg| std::str::from_utf8(arg).ok())
                .any(|arg| arg == config);
            if ours {
                tracing::warn!(pid, "stopping a repairer left by an earlier fleetmend up");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let postgres = state_dir.join("postgres");
    if postgres.join("data").join("postmaster.pid").exists()
        && let Ok(server) = PostgresServer::init(&postgres)
        && let Err(err) = server.stop_mode("immediate")
    {
        tracing::warn!(error = %err, "stopping the PostgreSQL an earlier fleetmend up left");
    }
}

/// The TOML config of one repairer of the fleet: the in-process repairer's settings
/// ([`Fleet::repairer_config`]), the shared store, a listen address of its own, the lease, and
/// the `command` provider calling back into `fleetmend up`.
pub fn repairer_toml(
    config: &FleetConfig,
    state_dir: &Path,
    store_url: &str,
    listen: SocketAddr,
) -> Result<String, FleetError> {
    let base = Fleet::repairer_config(
        config,
        state_dir,
        &state_dir.join("admin.token"),
        &state_dir.join("agent.token"),
        None,
    );
    let exe = config.exe.display().to_string();
    let state = state_dir.display().to_string();
    let command = |operation: &str| {
        vec![
            exe.clone(),
            "up-provider".to_owned(),
            "--state-dir".to_owned(),
            state.clone(),
            operation.to_owned(),
            "{node}".to_owned(),
        ]
    };
    let text = |value: String| toml::Value::String(value);
    let list = |argv: Vec<String>| toml::Value::Array(argv.into_iter().map(text).collect());
    let duration = |d: Duration| text(humantime::format_duration(d).to_string());
    let entries = |entries: Vec<(&str, toml::Value)>| -> toml::Table {
        entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    };
    let table = |list: Vec<(&str, toml::Value)>| toml::Value::Table(entries(list));
    let document = entries(vec![
        ("listen", text(listen.to_string())),
        ("store", text(store_url.to_owned())),
        ("agent_token_file", text(state_dir.join("agent.token").display().to_string())),
        ("admin_token_file", text(state_dir.join("admin.token").display().to_string())),
        ("scheduler", text("embedded".to_owned())),
        (
            "provider",
            table(vec![
                ("kind", text("command".to_owned())),
                ("reboot", list(command("reboot"))),
                ("replace", list(command("replace"))),
                ("power_state", list(command("power-state"))),
                ("reboot_timeout", duration(Duration::from_secs(30))),
                ("replace_timeout", duration(Duration::from_secs(60))),
                ("power_state_timeout", duration(Duration::from_secs(10))),
            ]),
        ),
        ("alerts", table(vec![("poll_interval", duration(base.alerts.poll_interval))])),
        (
            "leadership",
            table(vec![
                ("advertise", text(format!("http://{listen}"))),
                ("lease", duration(LEASE)),
                ("renew", duration(RENEW)),
            ]),
        ),
    ]);
    let mut table = document;
    let section = |name: &str, value: Result<toml::Value, toml::ser::Error>| {
        value.map_err(|err| FleetError::Repairers(format!("writing the [{name}] section: {err}")))
    };
    table.insert("engine".to_owned(), section("engine", toml::Value::try_from(&base.engine))?);
    table.insert("policy".to_owned(), section("policy", toml::Value::try_from(&base.policy))?);
    table.insert("queue".to_owned(), section("queue", toml::Value::try_from(&base.queue))?);
    toml::to_string(&table)
        .map_err(|err| FleetError::Repairers(format!("writing a repairer's config: {err}")))
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

        let exe = config.exe.clone();
        let repairers = Arc::new(Repairers {
            exe,
            slots: Mutex::new(Vec::new()),
            snapshot: Mutex::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
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
        write_fleet(&self.state_dir, &file);
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

fn write_fleet(state_dir: &Path, file: &FleetFile) {
    let path = state_dir.join("fleet.json");
    if let Err(err) = fleet::write_json(&path, file) {
        tracing::warn!(path = %path.display(), error = %err, "writing fleet.json failed");
    }
}

/// A repairer's answer to `GET /v1/leader`, or none.
async fn leader_of(http: &reqwest::Client, url: &str) -> Option<LeaderView> {
    let response = http.get(format!("{url}/v1/leader")).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// Restarts repairers that exit; keeps `fleet.json`'s list of them current.
async fn keep(repairers: Arc<Repairers>, state_dir: PathBuf) {
    loop {
        tokio::time::sleep(KEEP).await;
        if repairers.keep()
            && let Some(mut file) = fleet::read_fleet_file(&state_dir)
        {
            file.repairers = repairers.processes();
            write_fleet(&state_dir, &file);
        }
    }
}

/// Asks every repairer who leads, and reads the nodes and jobs from whichever answers.
async fn poll(repairers: Arc<Repairers>, http: reqwest::Client, client: Client) {
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
    use fleetmend_repairer::config::RepairerConfig;

    use super::*;

    #[test]
    fn each_repairer_config_has_the_fleet_settings_the_shared_store_and_the_callback() {
        let config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        let listen = SocketAddr::from(([127, 0, 0, 1], 7401));
        let text = repairer_toml(
            &config,
            Path::new("/tmp/x"),
            "postgres://postgres@127.0.0.1:5432/fleetmend",
            listen,
        )
        .unwrap();
        let value: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(value["leadership"]["advertise"].as_str(), Some("http://127.0.0.1:7401"));
        assert_eq!(value["leadership"]["lease"].as_str(), Some("6s"));
        let reboot: Vec<&str> = value["provider"]["reboot"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            reboot,
            ["/bin/fleetmend", "up-provider", "--state-dir", "/tmp/x", "reboot", "{node}"]
        );
        let parsed = RepairerConfig::parse(&text).unwrap();
        assert_eq!(parsed.problems(), Vec::new());
        assert_eq!(parsed.listen, listen);
        let base = Fleet::repairer_config(
            &config,
            Path::new("/tmp/x"),
            Path::new("/tmp/x/admin.token"),
            Path::new("/tmp/x/agent.token"),
            None,
        );
        assert_eq!(parsed.engine, base.engine);
        assert_eq!(parsed.policy, base.policy);
        // The rendezvous ports are drawn at random per config (a window below the ephemeral
        // range); the rest of the queue's settings are the fleet's.
        let mut queue = base.queue.clone();
        (queue.master_port_min, queue.master_port_max) =
            (parsed.queue.master_port_min, parsed.queue.master_port_max);
        assert_eq!(parsed.queue.master_port_max - parsed.queue.master_port_min, 199);
        assert_eq!(parsed.queue, queue);
        assert_eq!(parsed.alerts.poll_interval, base.alerts.poll_interval);
        assert_eq!(parsed.admin_token_file, base.admin_token_file);
        assert!(
            matches!(parsed.store, fleetmend_repairer::store::StoreLocation::Postgres(_)),
            "{:?}",
            parsed.store
        );
    }

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
