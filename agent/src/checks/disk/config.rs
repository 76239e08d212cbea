//! The disk check's settings (`[checks.disk]`, with a `[[checks.disk.mounts]]` per watched mount)
//! and their validation.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{ConfigProblems, Schedule};

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
