//! What a probe thread does for one mount (statvfs, then write, fsync, read back and delete a
//! file) and what its outcome says: `disk_mount`, `disk_full`, `disk_inodes_full` and
//! `disk_probe`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use nix::errno::Errno;

use super::{MountConfig, NAME, errno_text, findings};
use crate::checks::Observation;
use crate::metrics::{
    DISK_FREE, DISK_FREE_RATIO, DISK_INODES_FREE_RATIO, DISK_PROBE_LATENCY, DISK_SIZE, Sample,
};

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

/// What `statvfs` says about a mount.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Space {
    size_bytes: f64,
    free_bytes: f64,
    /// Available over all blocks; `None` for a filesystem that reports no size.
    free_ratio: Option<f64>,
    /// Free over all inodes; `None` for a filesystem without a fixed inode count.
    inodes_free_ratio: Option<f64>,
}

/// What a probe thread brings back about one mount.
#[derive(Debug)]
pub(super) enum MountOutcome {
    /// The mount point does not exist under the root filesystem.
    Absent,
    Measured {
        space: Result<Space, Errno>,
        /// `None`: not probed because the mount table says read-only.
        probe: Option<Result<Duration, ProbeError>>,
    },
}

/// Runs on a probe thread: statvfs, then the probe unless the mount is read-only.
pub(super) fn measure(
    dir: &Path,
    file: &Path,
    shown: &Path,
    readonly: bool,
    payload: &[u8],
) -> MountOutcome {
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

/// The findings (and metrics) of one mount's outcome; `table_says_rw` when the mount table has
/// the mount read-write.
pub(super) fn report_outcome(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
