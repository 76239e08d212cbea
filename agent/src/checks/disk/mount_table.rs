//! The host's mount table: which entry covers a watched mount, and `disk_readonly` from its
//! options.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::{NAME, errno_text, findings};
use crate::checks::Observation;
use crate::metrics::{DISK_READONLY, Sample};

/// One entry of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MountEntry {
    device: String,
    mount_point: PathBuf,
    fstype: String,
    pub(super) readonly: bool,
}

/// The mount table as read (from the file it names), or the file and why it could not be read.
pub(super) type MountTable = Result<(PathBuf, Vec<MountEntry>), (PathBuf, io::Error)>;

/// The host's mount table: `{procfs}/1/mounts` (init's view, which is the host's even when the
/// agent runs in a container of its own, as node_exporter reads it), else `{procfs}/mounts`.
pub(super) fn read_mount_table(procfs: &Path) -> MountTable {
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
pub(super) fn covering_entry<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
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

/// `disk_readonly` of one mount, from the table entry that covers it, and its metric.
pub(super) fn report_readonly(
    subject: &str,
    table: &MountTable,
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
}
