//! Disk faults: the scratch mount full (a real tmpfs, filled) or read-only, as the mount table
//! shows them.

use std::fs;
use std::io::Write;
use std::path::Path;

use super::{FAULTY_MOUNT, Fault, InjectError};
use crate::tree::{self, MOUNTS_PATH, NodeTree, TreeError};

/// The size of the tmpfs `disk-full` mounts.
const FULL_TMPFS_OPTIONS: &str = "size=1m,mode=0755";

pub(super) fn disk_full(tree: &NodeTree) -> Result<(), InjectError> {
    let relative = FAULTY_MOUNT.trim_start_matches('/');
    let target = tree.dir().join("root").join(relative);
    if !nix::unistd::geteuid().is_root() {
        return Err(InjectError::NeedsRoot { fault: Fault::DiskFull, path: target });
    }
    let mounted = tree::mounts_under(&target)?.contains(&target);
    if !mounted {
        nix::mount::mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(FULL_TMPFS_OPTIONS),
        )
        .map_err(|errno| InjectError::Mount { path: target.clone(), errno })?;
    }
    let result = fill(&target).and_then(|()| {
        edit_mount_line(tree, FAULTY_MOUNT, |fields| {
            let readonly = fields[3].split(',').any(|o| o == "ro");
            fields[0] = "tmpfs".to_owned();
            fields[2] = "tmpfs".to_owned();
            fields[3] = format!("{},relatime,size=1024k", if readonly { "ro" } else { "rw" });
        })
    });
    if result.is_err() && !mounted {
        // Leave nothing mounted behind a fault that did not take.
        let _ = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH);
    }
    result
}

/// `disk-readonly`: [`FAULTY_MOUNT`]'s options in the mount table begin with `ro`.
pub(super) fn disk_readonly(tree: &NodeTree) -> Result<(), InjectError> {
    edit_mount_line(tree, FAULTY_MOUNT, |fields| {
        let options: Vec<&str> =
            fields[3].split(',').filter(|o| *o != "rw" && *o != "ro").collect();
        fields[3] = std::iter::once("ro").chain(options).collect::<Vec<_>>().join(",");
    })
}

/// Writes into `dir` until the filesystem has no space left.
fn fill(dir: &Path) -> Result<(), InjectError> {
    let path = dir.join("fill");
    let fill_err = |message: String| InjectError::Fill { path: path.clone(), message };
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|err| fill_err(err.to_string()))?;
    let chunk = vec![0xa5u8; 64 * 1024];
    // 1 MiB of tmpfs fills in 16 chunks; the bound keeps a wrong mount from filling a real disk.
    for _ in 0..64 {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(nix::libc::ENOSPC) => return Ok(()),
            Err(err) => return Err(fill_err(err.to_string())),
        }
    }
    Err(fill_err("still not full after 4 MiB: is the tmpfs mounted?".to_owned()))
}

/// Rewrites the fields (device, mount point, type, options, dump, pass) of the line of
/// `proc/mounts` whose mount point is `mount_point`.
fn edit_mount_line(
    tree: &NodeTree,
    mount_point: &str,
    edit: impl FnOnce(&mut Vec<String>),
) -> Result<(), InjectError> {
    let path = tree.dir().join(MOUNTS_PATH);
    let text = fs::read_to_string(&path)
        .map_err(|source| TreeError::Read { path: path.clone(), source })?;
    let mut edit = Some(edit);
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        let mut fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if fields.len() >= 4
            && fields[1] == mount_point
            && let Some(edit) = edit.take()
        {
            edit(&mut fields);
            out.push_str(&fields.join(" "));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if edit.is_some() {
        return Err(InjectError::Fixture {
            path,
            message: format!("no line for {mount_point} to change"),
        });
    }
    tree::write_atomic(&path, out.as_bytes())?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn readonly_rewrites_only_the_mounts_options() {
        let temp = tempfile::tempdir().unwrap();
        let tree = NodeTree::create(&temp.path().join("n1"), "n1").unwrap();
        tree.inject(&Fault::DiskReadonly, false).unwrap();
        let mounts = fs::read_to_string(tree.dir().join(MOUNTS_PATH)).unwrap();
        let scratch = mounts.lines().find(|l| l.contains(" /scratch ")).unwrap();
        assert!(scratch.starts_with("/dev/md0 /scratch xfs ro,noatime,"), "{scratch}");
        let root = mounts.lines().find(|l| l.split(' ').nth(1) == Some("/")).unwrap();
        assert!(root.contains(" rw,"), "{root}");
    }
}
