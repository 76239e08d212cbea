//! The disk check: free space and inodes, read-only remounts, a write-fsync-read-delete probe per
//! mount, hung mounts, and the I/O error counters of block devices.
//!
//! A mount on a dead NFS server or behind a wedged NVMe controller blocks `statvfs` and `open` in
//! the kernel, uninterruptibly: nothing can cancel such a call. So each mount's statvfs and probe
//! run on a thread of their own and the run waits for them only until `probe_timeout` (never past
//! the run's deadline). A thread that does not come back in time is left behind and its mount is
//! reported `disk_hung`; while it stays stuck the mount is not probed again (a dead mount would
//! otherwise collect one stuck thread per run), and once it returns the next run probes afresh.
//!
//! The settings are in [`config`], the probe thread and what its outcome says in [`probe`], the
//! mount table in [`mount_table`] and block devices' error counters in [`io_errors`].

mod config;
mod io_errors;
mod mount_table;
mod probe;

use std::io;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use nix::errno::Errno;

pub use self::config::{DiskConfig, MountConfig};
use self::io_errors::IoErrorWatch;
use self::mount_table::{covering_entry, read_mount_table, report_readonly};
use self::probe::{MountOutcome, measure, report_outcome};
pub use self::probe::{ProbeError, ProbeStep};
use super::{BuildContext, Check, Observation, RunContext};
use crate::config::HostPaths;

pub const NAME: &str = "disk";

/// Finding ids of this check, with the action each recommends and why. Each is reported `ok` as
/// well, so a condition can clear.
pub mod findings {
    /// The configured mount point does not exist under the root filesystem: `unknown` (a missing
    /// directory is a config or deployment matter, not a failed disk).
    pub const MOUNT: &str = "disk_mount";
    /// Free bytes below `warn_free_ratio` (warn) or `min_free_ratio` (fail, `drain`): a reboot
    /// frees no space; a person or a cleanup job does, and the node takes no work meanwhile.
    pub const FULL: &str = "disk_full";
    /// Free inodes below `min_free_inodes_ratio` (fail, `drain`): as for space.
    pub const INODES_FULL: &str = "disk_inodes_full";
    /// The mount table says the filesystem is mounted read-only (fail, `reboot`): the kernel
    /// remounts a filesystem read-only after errors, and the fsck at boot repairs it.
    pub const READONLY: &str = "disk_readonly";
    /// The write-fsync-read-delete probe failed (fail, `reboot` for I/O errors and data that did
    /// not read back as written: a reboot resets the device and its controller, and repeated
    /// faults escalate; `drain` for ENOSPC/EDQUOT; `unknown` where the agent may not write).
    /// Its value is the probe's latency in seconds when it worked.
    pub const PROBE: &str = "disk_probe";
    /// statvfs and the probe did not return within `probe_timeout` (fail, `reboot`): calls stuck
    /// in the kernel on a dead mount cannot be cancelled, and they hold every process that
    /// touches the mount; only a reboot clears them.
    pub const HUNG: &str = "disk_hung";
    /// A block device's I/O error counter rose since the previous run (warn, no action: one
    /// error is no verdict on a device; the repairer's policy decides on a rising series).
    pub const IO_ERRORS: &str = "disk_io_errors";
}

/// Stack of a probe thread: it only walks a path and formats an error.
const PROBE_STACK_BYTES: usize = 128 * 1024;

/// An I/O error with its errno name first (`EIO: I/O error`), so a finding says which kind.
fn errno_text(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => Errno::from_raw(code).to_string(),
        None => err.to_string(),
    }
}

/// A probe thread that has not come back yet.
#[derive(Debug)]
struct InFlight {
    since: Instant,
    outcome: mpsc::Receiver<MountOutcome>,
}

#[derive(Debug)]
struct WatchedMount {
    config: MountConfig,
    /// The mount point as shown in findings and metric labels.
    subject: String,
    in_flight: Option<InFlight>,
}

#[derive(Debug)]
pub struct DiskCheck {
    mounts: Vec<WatchedMount>,
    probe_timeout: Duration,
    probe_file: String,
    io_errors: IoErrorWatch,
    probe_threads_started: u64,
    probes_run: u64,
}

impl DiskCheck {
    pub fn new(config: &DiskConfig, ctx: BuildContext<'_>) -> Self {
        DiskCheck {
            mounts: config
                .mounts
                .iter()
                .map(|mount| WatchedMount {
                    config: mount.clone(),
                    subject: mount.path.display().to_string(),
                    in_flight: None,
                })
                .collect(),
            probe_timeout: config.probe_timeout,
            probe_file: format!(
                "{}.{}.{}",
                config.probe_file,
                ctx.node.replace('/', "_"),
                std::process::id()
            ),
            io_errors: IoErrorWatch::new(&config.devices),
            probe_threads_started: 0,
            probes_run: 0,
        }
    }

    /// Probe threads started since the check was built (one per mount and run at most, none for a
    /// mount whose previous thread is still stuck).
    pub fn probe_threads_started(&self) -> u64 {
        self.probe_threads_started
    }

    /// Mounts whose probe thread has not come back.
    pub fn probes_stuck(&self) -> usize {
        self.mounts.iter().filter(|mount| mount.in_flight.is_some()).count()
    }

    fn start_probe(
        &mut self,
        index: usize,
        paths: &HostPaths,
        readonly: bool,
    ) -> Result<(), io::Error> {
        self.probes_run += 1;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        let payload = format!("fleetmend disk probe {} {nanos}\n", self.probes_run).into_bytes();
        let mount = &mut self.mounts[index];
        let dir = paths.under_rootfs(&mount.config.path);
        let shown = mount.config.path.join(&self.probe_file);
        let file = dir.join(&self.probe_file);
        let (sender, receiver) = mpsc::channel();
        thread::Builder::new().name(format!("{NAME}-probe")).stack_size(PROBE_STACK_BYTES).spawn(
            move || {
                let outcome = measure(&dir, &file, &shown, readonly, &payload);
                // The receiver is gone only when the check was dropped; nobody is left to tell.
                let _ = sender.send(outcome);
            },
        )?;
        mount.in_flight = Some(InFlight { since: Instant::now(), outcome: receiver });
        self.probe_threads_started += 1;
        Ok(())
    }
}

impl Check for DiskCheck {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&mut self, ctx: &RunContext<'_>) -> Observation {
        let started = Instant::now();
        // Leave a tenth of the run's time for reporting, so a hung mount is reported, not the run
        // timed out.
        let budget = ctx.deadline.saturating_duration_since(started);
        let probe_deadline = started + self.probe_timeout.min(budget.mul_f64(0.9));
        let mut out = Observation::default();
        let table = read_mount_table(&ctx.paths.procfs);

        // Start every mount's probe first so they run side by side; a mount still stuck from an
        // earlier run gets no second thread.
        let mut covering = Vec::with_capacity(self.mounts.len());
        let mut start_errors: Vec<Option<io::Error>> = Vec::with_capacity(self.mounts.len());
        for index in 0..self.mounts.len() {
            let mount = &mut self.mounts[index];
            let entry = match &table {
                Ok((_, entries)) => covering_entry(entries, &mount.config.path).cloned(),
                Err(_) => None,
            };
            let still_stuck = match &mount.in_flight {
                Some(in_flight) => match in_flight.outcome.try_recv() {
                    Err(TryRecvError::Empty) => true,
                    // It came back after its run gave up: the news is stale, probe afresh.
                    Ok(_) | Err(TryRecvError::Disconnected) => false,
                },
                None => false,
            };
            let mut start_error = None;
            if !still_stuck {
                mount.in_flight = None;
                let skip_write =
                    !mount.config.probe || entry.as_ref().is_some_and(|entry| entry.readonly);
                start_error = self.start_probe(index, ctx.paths, skip_write).err();
            }
            covering.push(entry);
            start_errors.push(start_error);
        }

        for (index, (entry, start_error)) in covering.into_iter().zip(start_errors).enumerate() {
            let mount = &mut self.mounts[index];
            let subject = mount.subject.clone();
            report_readonly(&subject, &table, entry.as_ref(), &mut out);
            if let Some(err) = start_error {
                out.findings.push(Finding::new(
                    NAME,
                    findings::HUNG,
                    subject.as_str(),
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("could not start a probe thread: {err}"),
                ));
                continue;
            }
            let Some(in_flight) = &mount.in_flight else { continue };
            let wait = probe_deadline.saturating_duration_since(Instant::now());
            match in_flight.outcome.recv_timeout(wait) {
                Ok(outcome) => {
                    mount.in_flight = None;
                    out.findings.push(Finding::ok(NAME, findings::HUNG, subject.as_str()));
                    let table_says_rw = entry.as_ref().is_some_and(|entry| !entry.readonly);
                    report_outcome(&mount.config, &subject, outcome, table_says_rw, &mut out);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let stuck = in_flight.since.elapsed();
                    out.findings.push(
                        Finding::new(
                            NAME,
                            findings::HUNG,
                            subject.as_str(),
                            Status::Fail,
                            // A mount stuck in the kernel holds every process that touches it; only
                            // a reboot gets rid of the stuck calls.
                            RecommendedAction::Reboot,
                            format!(
                                "statvfs and probe of {subject} did not return within {} (stuck for \
                                 {:.1} s): the mount is hung",
                                humantime::format_duration(self.probe_timeout),
                                stuck.as_secs_f64()
                            ),
                        )
                        .with_value(stuck.as_secs_f64()),
                    );
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The probe thread died without an answer (it panicked): not a disk fault.
                    mount.in_flight = None;
                    out.findings.push(Finding::new(
                        NAME,
                        findings::PROBE,
                        subject.as_str(),
                        Status::Unknown,
                        RecommendedAction::None,
                        "the probe thread ended without an answer",
                    ));
                }
            }
        }

        self.io_errors.observe(&ctx.paths.sysfs, &mut out);
        out
    }
}
