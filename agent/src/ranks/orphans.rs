//! Finding the ranks an earlier agent process started and left running (it was killed with
//! SIGKILL): every process under `/proc` whose environment names one of this agent's rank
//! directories and that leads its own process group.

use std::path::Path;

use fleetmend_proto::RankKey;

use super::{RANK_DIR_VAR, absolute, key_of_rank_dir};

/// A process an earlier agent process started as a rank.
#[derive(Debug, Clone)]
pub(super) struct Orphan {
    pub(super) key: RankKey,
    pub(super) pid: u32,
    pub(super) pgid: u32,
}

/// Every running process in `procfs` whose [`RANK_DIR_VAR`] names a rank directory under `dir`
/// and that leads its own process group (a rank's launcher; what it started goes with its group).
pub(super) fn find_orphans(procfs: &Path, dir: &Path) -> Vec<Orphan> {
    let Ok(entries) = std::fs::read_dir(procfs) else {
        return Vec::new();
    };
    let own = std::process::id();
    let needle = format!("{RANK_DIR_VAR}=");
    let mut orphans = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        if pid == own {
            continue;
        }
        // Other users' processes cannot be read; they are not this agent's ranks either.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let Some(rank_dir) = environ
            .split(|b| *b == 0)
            .filter_map(|var| std::str::from_utf8(var).ok())
            .find_map(|var| var.strip_prefix(&needle))
        else {
            continue;
        };
        let Some(key) = key_of_rank_dir(dir, Path::new(rank_dir)) else {
            continue;
        };
        match process_group(procfs, pid) {
            Some(pgid) if pgid == pid => orphans.push(Orphan { key, pid, pgid }),
            _ => {}
        }
    }
    orphans
}

/// The rank launchers running in `procfs` that an agent keeping its ranks under `dir` started
/// (found by their [`RANK_DIR_VAR`], as [`super::RankSupervisor::stop_orphans`] finds them), with their
/// pids; each leads its own process group.
pub fn rank_processes(procfs: &Path, dir: &Path) -> Vec<(RankKey, u32)> {
    find_orphans(procfs, &absolute(dir)).into_iter().map(|o| (o.key, o.pid)).collect()
}

/// The fields of `/proc/<pid>/stat` after the command name: state first.
fn stat_fields(procfs: &Path, pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(procfs.join(pid.to_string()).join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The process group of `pid` (a process that is not a zombie).
fn process_group(procfs: &Path, pid: u32) -> Option<u32> {
    let fields = stat_fields(procfs, pid)?;
    // state, ppid, pgrp
    if fields.first().is_some_and(|state| state == "Z") {
        return None;
    }
    fields.get(2)?.parse().ok()
}

/// Whether `pid` exists and is not a zombie.
pub(super) fn process_running(procfs: &Path, pid: u32) -> bool {
    stat_fields(procfs, pid).is_some_and(|fields| fields.first().is_some_and(|s| s != "Z"))
}
