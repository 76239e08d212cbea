//! The disk check: free space and inodes, read-only remounts, a write-fsync-read-delete probe per
//! mount, hung mounts, and the I/O error counters of block devices.
//!
//! A mount on a dead NFS server or behind a wedged NVMe controller blocks `statvfs` and `open` in
//! the kernel, uninterruptibly: nothing can cancel such a call. So each mount's statvfs and probe
//! run on a thread of their own and the run waits for them only until `probe_timeout` (never past
//! the run's deadline). A thread that does not come back in time is left behind and its mount is
//! reported `disk_hung`; while it stays stuck the mount is not probed again (a dead mount would
//! otherwise collect one stuck thread per run), and once it returns the next run probes afresh.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use nix::errno::Errno;
use serde::Deserialize;

use super::{BuildContext, Check, Observation, RunContext};
use crate::config::{ConfigProblems, HostPaths, Schedule};
use crate::metrics::{
    DISK_FREE, DISK_FREE_RATIO, DISK_INODES_FREE_RATIO, DISK_IO_ERRORS, DISK_PROBE_LATENCY,
    DISK_READONLY, DISK_SIZE, Sample,
};

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

/// Name prefixes of block devices left out of the I/O error watch by default: virtual devices
/// whose errors say nothing about the hardware.
const VIRTUAL_DEVICE_PREFIXES: [&str; 4] = ["loop", "ram", "zram", "dm-"];

/// Stack of a probe thread: it only walks a path and formats an error.
const PROBE_STACK_BYTES: usize = 128 * 1024;

/// Settings of the disk check (`[checks.disk]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out. Longer than `probe_timeout`, so
    /// a hung mount is reported as `disk_hung` rather than as a timed-out run.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Mounts to watch (`[[checks.disk.mounts]]`). Default: `/` alone.
    pub mounts: Vec<MountConfig>,
    /// Longest one mount's statvfs and probe may take before the mount is reported hung.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// Name of the file the probe writes, reads back and deletes in each mount's top directory;
    /// the node name and the agent's process id are appended (`.fleetmend-probe.gpu-node-017.4711`)
    /// so the agents of many nodes can probe one shared filesystem without touching each other's
    /// file, nor can two agents started with one node name (a local fleet's, a test's).
    pub probe_file: String,
    /// Block devices (names under `{sysfs}/block`) whose I/O error counters are watched. Empty:
    /// every device except `loop*`, `ram*`, `zram*` and `dm-*` (devices without an `ioerr_cnt`,
    /// such as NVMe and virtio disks, are then skipped; a device named here must have one).
    pub devices: Vec<String>,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(8),
            mounts: vec![MountConfig::default()],
            probe_timeout: Duration::from_secs(5),
            probe_file: ".fleetmend-probe".to_owned(),
            devices: Vec::new(),
        }
    }
}

/// One watched mount (`[[checks.disk.mounts]]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MountConfig {
    /// The mount point as the host sees it, e.g. `/` or `/scratch`; read below `paths.rootfs`.
    pub path: PathBuf,
    /// Fail (`disk_full`, drain) when available bytes over size fall below this.
    pub min_free_ratio: f64,
    /// Warn (`disk_full`) when available bytes over size fall below this.
    pub warn_free_ratio: f64,
    /// Fail (`disk_inodes_full`, drain) when free inodes over all inodes fall below this.
    pub min_free_inodes_ratio: f64,
    /// Write, fsync, read back and delete a probe file (off: statvfs and the mount table only,
    /// for a mount where a write is unwelcome or whose fsync stalls are not the node's).
    pub probe: bool,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            path: PathBuf::from("/"),
            min_free_ratio: 0.05,
            warn_free_ratio: 0.10,
            min_free_inodes_ratio: 0.05,
            probe: true,
        }
    }
}

impl DiskConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
        if self.probe_timeout.is_zero() {
            problems.push(format!("{section}.probe_timeout"), "must be greater than zero");
        } else if self.probe_timeout >= self.timeout {
            problems.push(
                format!("{section}.probe_timeout"),
                format!(
                    "{} is not shorter than {section}.timeout {}: a hung mount would time the \
                     whole run out instead of being reported",
                    humantime::format_duration(self.probe_timeout),
                    humantime::format_duration(self.timeout)
                ),
            );
        }
        let name = self.probe_file.as_str();
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            problems.push(
                format!("{section}.probe_file"),
                format!("{name:?} is not a plain file name"),
            );
        }
        for (i, mount) in self.mounts.iter().enumerate() {
            let field = |name: &str| format!("{section}.mounts[{i}].{name}");
            if !mount.path.is_absolute() {
                problems.push(
                    field("path"),
                    format!("{:?} is not an absolute path", mount.path.display().to_string()),
                );
            }
            if self.mounts[..i].iter().any(|earlier| earlier.path == mount.path) {
                problems.push(field("path"), format!("{} is listed twice", mount.path.display()));
            }
            for (name, value) in [
                ("min_free_ratio", mount.min_free_ratio),
                ("warn_free_ratio", mount.warn_free_ratio),
                ("min_free_inodes_ratio", mount.min_free_inodes_ratio),
            ] {
                if !(0.0..=1.0).contains(&value) {
                    problems.push(field(name), format!("{value} is not between 0 and 1"));
                }
            }
            if mount.min_free_ratio > mount.warn_free_ratio {
                problems.push(
                    field("warn_free_ratio"),
                    format!(
                        "{} is below min_free_ratio {}: the warning would never come first",
                        mount.warn_free_ratio, mount.min_free_ratio
                    ),
                );
            }
        }
        for (i, device) in self.devices.iter().enumerate() {
            if device.is_empty() || device.contains(['/', '\0']) || device == "." || device == ".."
            {
                problems.push(
                    format!("{section}.devices[{i}]"),
                    format!("{device:?} is not a block device name (e.g. \"sda\")"),
                );
            }
        }
    }
}

/// A step of the probe, named in its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStep {
    Create,
    Write,
    Fsync,
    Read,
    Remove,
}

impl std::fmt::Display for ProbeStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProbeStep::Create => "creating",
            ProbeStep::Write => "writing",
            ProbeStep::Fsync => "syncing",
            ProbeStep::Read => "reading back",
            ProbeStep::Remove => "removing",
        })
    }
}

/// The write-fsync-read-delete probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{step} {path}: {}", errno_text(.source))]
    Io { step: ProbeStep, path: PathBuf, source: io::Error },
    #[error("read back {read} bytes from {path} that differ from the {written} written")]
    Mismatch { path: PathBuf, written: usize, read: usize },
}

impl ProbeError {
    fn errno(&self) -> Option<Errno> {
        match self {
            ProbeError::Io { source, .. } => source.raw_os_error().map(Errno::from_raw),
            ProbeError::Mismatch { .. } => None,
        }
    }
}

/// An I/O error with its errno name first (`EIO: I/O error`), so a finding says which kind.
fn errno_text(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => Errno::from_raw(code).to_string(),
        None => err.to_string(),
    }
}

/// What `statvfs` says about a mount.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Space {
    size_bytes: f64,
    free_bytes: f64,
    /// Available over all blocks; `None` for a filesystem that reports no size.
    free_ratio: Option<f64>,
    /// Free over all inodes; `None` for a filesystem without a fixed inode count.
    inodes_free_ratio: Option<f64>,
}

/// What a probe thread brings back about one mount.
#[derive(Debug)]
enum MountOutcome {
    /// The mount point does not exist under the root filesystem.
    Absent,
    Measured {
        space: Result<Space, Errno>,
        /// `None`: not probed because the mount table says read-only.
        probe: Option<Result<Duration, ProbeError>>,
    },
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

/// One entry of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry {
    device: String,
    mount_point: PathBuf,
    fstype: String,
    readonly: bool,
}

#[derive(Debug)]
pub struct DiskCheck {
    mounts: Vec<WatchedMount>,
    probe_timeout: Duration,
    probe_file: String,
    devices: Vec<String>,
    /// I/O error counts of the previous run, by device.
    io_errors: HashMap<String, u64>,
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
            devices: config.devices.clone(),
            io_errors: HashMap::new(),
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

    fn observe_io_errors(&mut self, sysfs: &Path, out: &mut Observation) {
        let block = sysfs.join("block");
        let devices = if self.devices.is_empty() {
            match list_devices(&block) {
                Ok(devices) => devices,
                // No block directory: no block devices to watch (absent, not failed).
                Err(err) if err.kind() == io::ErrorKind::NotFound => return,
                Err(err) => {
                    out.findings.push(Finding::new(
                        NAME,
                        findings::IO_ERRORS,
                        "",
                        Status::Unknown,
                        RecommendedAction::None,
                        format!("listing {}: {}", block.display(), errno_text(&err)),
                    ));
                    return;
                }
            }
        } else {
            self.devices.clone()
        };
        let explicit = !self.devices.is_empty();
        for device in devices {
            let path = block.join(&device).join("device").join("ioerr_cnt");
            let text = match fs::read_to_string(&path) {
                Ok(text) => text,
                // Only SCSI-like devices count errors here; others are skipped unless named.
                Err(err) if err.kind() == io::ErrorKind::NotFound && !explicit => continue,
                Err(err) => {
                    out.findings.push(Finding::new(
                        NAME,
                        findings::IO_ERRORS,
                        device.as_str(),
                        Status::Unknown,
                        RecommendedAction::None,
                        format!("reading {}: {}", path.display(), errno_text(&err)),
                    ));
                    continue;
                }
            };
            let Some(count) = parse_hex_count(&text) else {
                out.findings.push(Finding::new(
                    NAME,
                    findings::IO_ERRORS,
                    device.as_str(),
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("{} holds {:?}, not a hex count", path.display(), text.trim()),
                ));
                continue;
            };
            out.samples.push(Sample::new(&DISK_IO_ERRORS, count as f64).label("device", &device));
            // A count lower than before means the device was reset or replaced: a new baseline.
            let previous = self.io_errors.insert(device.clone(), count);
            let finding = match previous {
                Some(previous) if count > previous => Finding::new(
                    NAME,
                    findings::IO_ERRORS,
                    device.as_str(),
                    Status::Warn,
                    RecommendedAction::None,
                    format!(
                        "{} new I/O errors since the last run ({count} in all)",
                        count - previous
                    ),
                )
                .with_value((count - previous) as f64),
                _ => Finding::ok(NAME, findings::IO_ERRORS, device.as_str()).with_value(0.0),
            };
            out.findings.push(finding);
        }
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

        self.observe_io_errors(&ctx.paths.sysfs, &mut out);
        out
    }
}

/// Runs on a probe thread: statvfs, then the probe unless the mount is read-only.
fn measure(dir: &Path, file: &Path, shown: &Path, readonly: bool, payload: &[u8]) -> MountOutcome {
    let space = match nix::sys::statvfs::statvfs(dir) {
        Err(Errno::ENOENT | Errno::ENOTDIR) => return MountOutcome::Absent,
        Err(errno) => Err(errno),
        Ok(stat) => {
            let fragment = stat.fragment_size() as f64;
            let blocks = stat.blocks() as f64;
            let available = stat.blocks_available() as f64;
            let files = stat.files() as f64;
            Ok(Space {
                size_bytes: blocks * fragment,
                free_bytes: available * fragment,
                free_ratio: (blocks > 0.0).then(|| available / blocks),
                inodes_free_ratio: (files > 0.0).then(|| stat.files_free() as f64 / files),
            })
        }
    };
    let probe = (!readonly).then(|| {
        let started = Instant::now();
        probe(file, shown, payload).map(|()| started.elapsed())
    });
    MountOutcome::Measured { space, probe }
}

/// Writes `payload` to `file`, syncs it, reads it back, removes it and compares.
fn probe(file: &Path, shown: &Path, payload: &[u8]) -> Result<(), ProbeError> {
    let io_error = |step| move |source| ProbeError::Io { step, path: shown.to_owned(), source };
    let result = (|| {
        // Not create_new: a probe file left by a killed agent must not fail every later probe.
        let mut handle = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(file)
            .map_err(io_error(ProbeStep::Create))?;
        handle.write_all(payload).map_err(io_error(ProbeStep::Write))?;
        handle.sync_all().map_err(io_error(ProbeStep::Fsync))?;
        drop(handle);
        let mut back = Vec::with_capacity(payload.len() + 1);
        File::open(file)
            .and_then(|handle| handle.take(payload.len() as u64 + 1).read_to_end(&mut back))
            .map_err(io_error(ProbeStep::Read))?;
        Ok(back)
    })();
    match result {
        Ok(back) => {
            fs::remove_file(file).map_err(io_error(ProbeStep::Remove))?;
            if back != payload {
                return Err(ProbeError::Mismatch {
                    path: shown.to_owned(),
                    written: payload.len(),
                    read: back.len(),
                });
            }
            Ok(())
        }
        Err(err) => {
            // Best effort: a failed probe should not leave its file behind.
            let _ = fs::remove_file(file);
            Err(err)
        }
    }
}

fn report_readonly(
    subject: &str,
    table: &Result<(PathBuf, Vec<MountEntry>), (PathBuf, io::Error)>,
    entry: Option<&MountEntry>,
    out: &mut Observation,
) {
    let finding = match (table, entry) {
        (Err((path, err)), _) => Finding::new(
            NAME,
            findings::READONLY,
            subject,
            Status::Unknown,
            RecommendedAction::None,
            format!("reading {}: {}", path.display(), errno_text(err)),
        ),
        (Ok((path, _)), None) => Finding::new(
            NAME,
            findings::READONLY,
            subject,
            Status::Unknown,
            RecommendedAction::None,
            format!("no entry of {} covers {subject}", path.display()),
        ),
        (Ok(_), Some(entry)) => {
            out.samples.push(
                Sample::new(&DISK_READONLY, if entry.readonly { 1.0 } else { 0.0 })
                    .label("mount", subject),
            );
            if entry.readonly {
                Finding::new(
                    NAME,
                    findings::READONLY,
                    subject,
                    Status::Fail,
                    // The kernel remounts a filesystem read-only after errors; the fsck at boot
                    // repairs it and the mount comes back read-write.
                    RecommendedAction::Reboot,
                    format!(
                        "{} ({} on {}) is mounted read-only",
                        entry.mount_point.display(),
                        entry.device,
                        entry.fstype
                    ),
                )
                .with_value(1.0)
            } else {
                Finding::ok(NAME, findings::READONLY, subject).with_value(0.0)
            }
        }
    };
    out.findings.push(finding);
}

fn report_outcome(
    config: &MountConfig,
    subject: &str,
    outcome: MountOutcome,
    table_says_rw: bool,
    out: &mut Observation,
) {
    let (space, probe) = match outcome {
        MountOutcome::Absent => {
            out.findings.push(Finding::new(
                NAME,
                findings::MOUNT,
                subject,
                Status::Unknown,
                RecommendedAction::None,
                format!("mount absent: {subject} does not exist under the root filesystem"),
            ));
            return;
        }
        MountOutcome::Measured { space, probe } => (space, probe),
    };
    out.findings.push(Finding::ok(NAME, findings::MOUNT, subject));
    match space {
        Ok(space) => report_space(config, subject, space, out),
        Err(errno) => {
            for id in [findings::FULL, findings::INODES_FULL] {
                out.findings.push(Finding::new(
                    NAME,
                    id,
                    subject,
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("statvfs {subject}: {errno}"),
                ));
            }
        }
    }
    let finding = match probe {
        // Not written to by configuration (`probe = false`): nothing to say of a probe.
        None if !config.probe => return,
        None => Finding::new(
            NAME,
            findings::PROBE,
            subject,
            Status::Unknown,
            RecommendedAction::None,
            "not probed: the mount is read-only",
        ),
        Some(Ok(latency)) => {
            out.samples.push(
                Sample::new(&DISK_PROBE_LATENCY, latency.as_secs_f64()).label("mount", subject),
            );
            let mut finding = Finding::ok(NAME, findings::PROBE, subject);
            finding.message = format!(
                "wrote, synced, read back and removed a file in {:.1} ms",
                latency.as_secs_f64() * 1000.0
            );
            finding.with_value(latency.as_secs_f64())
        }
        Some(Err(err)) => {
            let (status, action) = probe_failure(err.errno(), table_says_rw);
            Finding::new(NAME, findings::PROBE, subject, status, action, err.to_string())
        }
    };
    out.findings.push(finding);
}

/// How bad a failed probe is, by its errno.
fn probe_failure(errno: Option<Errno>, table_says_rw: bool) -> (Status, RecommendedAction) {
    match errno {
        // Out of space or quota: a reboot frees nothing; `disk_full` says the rest.
        Some(Errno::ENOSPC | Errno::EDQUOT) => (Status::Fail, RecommendedAction::Drain),
        // Read-only to us while the host mounts it read-write: the agent's own view is read-only
        // (a container given the root filesystem read-only), not a disk fault.
        Some(Errno::EROFS) if table_says_rw => (Status::Unknown, RecommendedAction::None),
        // Remounted read-only after errors: cleared by the fsck at boot.
        Some(Errno::EROFS) => (Status::Fail, RecommendedAction::Reboot),
        // The agent may not write there: a deployment problem, not a disk fault.
        Some(Errno::EACCES | Errno::EPERM) => (Status::Unknown, RecommendedAction::None),
        // EIO and the rest, and data that did not read back as written: the device or its
        // controller is failing; a reboot resets the controller, and repeated faults escalate.
        _ => (Status::Fail, RecommendedAction::Reboot),
    }
}

fn report_space(config: &MountConfig, subject: &str, space: Space, out: &mut Observation) {
    out.samples.push(Sample::new(&DISK_SIZE, space.size_bytes).label("mount", subject));
    out.samples.push(Sample::new(&DISK_FREE, space.free_bytes).label("mount", subject));
    let finding = match space.free_ratio {
        None => Finding::new(
            NAME,
            findings::FULL,
            subject,
            Status::Unknown,
            RecommendedAction::None,
            "the filesystem reports no size",
        ),
        Some(ratio) => {
            out.samples.push(Sample::new(&DISK_FREE_RATIO, ratio).label("mount", subject));
            let message = format!(
                "{:.0} of {:.0} bytes available ({:.1}%)",
                space.free_bytes,
                space.size_bytes,
                ratio * 100.0
            );
            if ratio < config.min_free_ratio {
                Finding::new(
                    NAME,
                    findings::FULL,
                    subject,
                    Status::Fail,
                    // A reboot frees no space; a person or a cleanup job does. Keep work off the
                    // node meanwhile.
                    RecommendedAction::Drain,
                    format!("{message}, below the {:.1}% floor", config.min_free_ratio * 100.0),
                )
            } else if ratio < config.warn_free_ratio {
                Finding::new(
                    NAME,
                    findings::FULL,
                    subject,
                    Status::Warn,
                    RecommendedAction::None,
                    format!("{message}, below {:.1}%", config.warn_free_ratio * 100.0),
                )
            } else {
                let mut finding = Finding::ok(NAME, findings::FULL, subject);
                finding.message = message;
                finding
            }
            .with_value(ratio)
        }
    };
    out.findings.push(finding);
    let finding = match space.inodes_free_ratio {
        None => {
            let mut finding = Finding::ok(NAME, findings::INODES_FULL, subject);
            finding.message = "the filesystem has no fixed inode count".to_owned();
            finding
        }
        Some(ratio) => {
            out.samples.push(Sample::new(&DISK_INODES_FREE_RATIO, ratio).label("mount", subject));
            if ratio < config.min_free_inodes_ratio {
                Finding::new(
                    NAME,
                    findings::INODES_FULL,
                    subject,
                    Status::Fail,
                    // Like space: only deleting files frees inodes.
                    RecommendedAction::Drain,
                    format!(
                        "{:.1}% of inodes free, below the {:.1}% floor",
                        ratio * 100.0,
                        config.min_free_inodes_ratio * 100.0
                    ),
                )
            } else {
                Finding::ok(NAME, findings::INODES_FULL, subject)
            }
            .with_value(ratio)
        }
    };
    out.findings.push(finding);
}

/// The host's mount table: `{procfs}/1/mounts` (init's view, which is the host's even when the
/// agent runs in a container of its own, as node_exporter reads it), else `{procfs}/mounts`.
#[allow(clippy::type_complexity)]
fn read_mount_table(procfs: &Path) -> Result<(PathBuf, Vec<MountEntry>), (PathBuf, io::Error)> {
    let init = procfs.join("1").join("mounts");
    let path = match fs::metadata(&init) {
        Ok(_) => init,
        Err(_) => procfs.join("mounts"),
    };
    match fs::read_to_string(&path) {
        Ok(text) => Ok((path, parse_mounts(&text))),
        Err(err) => Err((path, err)),
    }
}

/// Parses `/proc/mounts` lines (`device mount_point fstype options dump pass`); lines with fewer
/// than four fields are skipped.
fn parse_mounts(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let device = fields.next()?;
            let mount_point = fields.next()?;
            let fstype = fields.next()?;
            let options = fields.next()?;
            Some(MountEntry {
                device: unescape_mount_field(device),
                mount_point: PathBuf::from(unescape_mount_field(mount_point)),
                fstype: fstype.to_owned(),
                readonly: options.split(',').any(|option| option == "ro"),
            })
        })
        .collect()
}

/// Undoes the kernel's octal escapes in mount fields (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The entry whose mount point is the longest prefix of `path` (by components); of equal ones the
/// last, since a later mount hides an earlier one on the same point.
fn covering_entry<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let mut best: Option<&MountEntry> = None;
    for entry in entries {
        if !path.starts_with(&entry.mount_point) {
            continue;
        }
        let longer = best.is_none_or(|best| {
            entry.mount_point.components().count() >= best.mount_point.components().count()
        });
        if longer {
            best = Some(entry);
        }
    }
    best
}

/// Every block device under `block` except virtual ones, sorted.
fn list_devices(block: &Path) -> Result<Vec<String>, io::Error> {
    let mut devices = Vec::new();
    for entry in fs::read_dir(block)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !VIRTUAL_DEVICE_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
            devices.push(name);
        }
    }
    devices.sort();
    Ok(devices)
}

/// Parses `ioerr_cnt`: hex with a `0x` prefix (`0x1a`), or without one.
fn parse_hex_count(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    u64::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_mount_lines_with_escapes_and_options() {
        let entries = parse_mounts(
            "/dev/vda / ext4 rw,relatime 0 0\n\
             /dev/sdb /mnt/my\\040disk xfs ro,noatime 0 0\n\
             garbage\n\
             \n",
        );
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].mount_point, PathBuf::from("/mnt/my disk"));
        assert!(entries[1].readonly);
        assert!(!entries[0].readonly);
        // "rosomething" is not "ro".
        let entries = parse_mounts("x / ext4 rw,errors=remount-ro 0 0\n");
        assert!(!entries[0].readonly);
    }

    #[test]
    fn longest_prefix_wins_and_later_mounts_hide_earlier_ones() {
        let entries = parse_mounts(
            "a / ext4 rw 0 0\n\
             b /scratch ext4 rw 0 0\n\
             c /scratch ext4 ro 0 0\n\
             d /scr ext4 ro 0 0\n",
        );
        assert_eq!(covering_entry(&entries, Path::new("/scratch/x")).unwrap().device, "c");
        assert_eq!(covering_entry(&entries, Path::new("/scratchy")).unwrap().device, "a");
        assert_eq!(covering_entry(&entries, Path::new("/")).unwrap().device, "a");
        assert!(covering_entry(&[], Path::new("/")).is_none());
    }

    #[test]
    fn hex_counts() {
        assert_eq!(parse_hex_count("0x1a\n"), Some(26));
        assert_eq!(parse_hex_count("ff"), Some(255));
        assert_eq!(parse_hex_count("0x"), None);
        assert_eq!(parse_hex_count("zz"), None);
    }

    #[test]
    fn probe_errors_name_the_errno() {
        let err = ProbeError::Io {
            step: ProbeStep::Write,
            path: PathBuf::from("/scratch/.fleetmend-probe"),
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        let text = err.to_string();
        assert!(text.starts_with("writing /scratch/.fleetmend-probe: EIO"), "{text}");
        assert_eq!(probe_failure(err.errno(), true), (Status::Fail, RecommendedAction::Reboot));
        assert_eq!(
            probe_failure(Some(Errno::ENOSPC), true),
            (Status::Fail, RecommendedAction::Drain)
        );
        assert_eq!(
            probe_failure(Some(Errno::EROFS), false),
            (Status::Fail, RecommendedAction::Reboot)
        );
        assert_eq!(probe_failure(Some(Errno::EROFS), true).0, Status::Unknown);
    }

    #[test]
    fn config_problems_name_their_fields() {
        let config: DiskConfig = toml::from_str(
            "probe_timeout = \"9s\"\nprobe_file = \"a/b\"\ndevices = [\"\"]\n\
             [[mounts]]\npath = \"relative\"\nmin_free_ratio = 0.5\nwarn_free_ratio = 0.2\n\
             [[mounts]]\npath = \"/x\"\nmin_free_inodes_ratio = 2.0\n\
             [[mounts]]\npath = \"/x\"\n",
        )
        .unwrap();
        let mut problems = ConfigProblems::default();
        config.validate("checks.disk", &mut problems);
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        for expected in [
            "checks.disk.probe_timeout",
            "checks.disk.probe_file",
            "checks.disk.devices[0]",
            "checks.disk.mounts[0].path",
            "checks.disk.mounts[0].warn_free_ratio",
            "checks.disk.mounts[1].min_free_inodes_ratio",
            "checks.disk.mounts[2].path",
        ] {
            assert!(fields.contains(&expected), "{expected} missing from {problems}");
        }
        let mut problems = ConfigProblems::default();
        DiskConfig::default().validate("checks.disk", &mut problems);
        assert!(problems.is_empty(), "{problems}");
    }
}
