//! The fleet's repairer processes: each started as `fleetmend repairer --config`, in a process
//! group of its own, logging beside its config; one that exits is started again after
//! [`RESTART_DELAY`], as systemd's `Restart=always` would; all stopped with SIGTERM, then SIGKILL.
//! Also what a killed `fleetmend up --repairers N` left running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fleetmend_repairer::clock::unix_now_ms as now_ms;
use fleetmend_repairer::postgres_server::PostgresServer;
use serde::{Deserialize, Serialize};

use super::snapshot::Snapshot;
use crate::up::fleet::{self, FleetError};

/// How long after a repairer exited it is started again.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);
/// How long a stopped repairer gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
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

/// A repairer child and when it may start again.
pub(super) struct Slot {
    pub(super) process: RepairerProcess,
    pub(super) child: Option<Child>,
    pub(super) restart_at: Option<Instant>,
}

/// The fleet's repairer processes.
pub(super) struct Repairers {
    exe: PathBuf,
    slots: Mutex<Vec<Slot>>,
    snapshot: Mutex<Snapshot>,
    stopping: std::sync::atomic::AtomicBool,
}

impl Repairers {
    /// None yet: [`Repairers::spawn`] starts each, and the caller adds its slot.
    pub(super) fn new(exe: PathBuf) -> Repairers {
        Repairers {
            exe,
            slots: Mutex::new(Vec::new()),
            snapshot: Mutex::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(super) fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn snapshot(&self) -> MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, line: String) {
        tracing::info!("{line}");
        self.snapshot().notes.push((now_ms(), line));
    }

    pub(super) fn processes(&self) -> Vec<RepairerProcess> {
        self.slots().iter().map(|s| s.process.clone()).collect()
    }

    pub(super) fn spawn(&self, slot: &mut Slot) -> Result<(), FleetError> {
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
    pub(super) async fn stop(&self) {
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

/// Stops what a killed `fleetmend up --repairers N` on `state_dir` left running: its repairers
/// (named in `fleet.json`, checked by their command line) and its PostgreSQL.
pub(in crate::up) fn stop_stale_repairers(state_dir: &Path) {
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

/// Restarts repairers that exit; keeps `fleet.json`'s list of them current.
pub(super) async fn keep(repairers: Arc<Repairers>, state_dir: PathBuf) {
    loop {
        tokio::time::sleep(KEEP).await;
        if repairers.keep()
            && let Some(mut file) = fleet::read_fleet_file(&state_dir)
        {
            file.repairers = repairers.processes();
            fleet::write_fleet_json(&state_dir, &file);
        }
    }
}
