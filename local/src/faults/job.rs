//! Job faults: they hit a node's job ranks, not its host tree, and the node stays healthy.
//!
//! - `hang`: SIGSTOP to each rank's process group: the rank neither steps nor posts.
//! - `nan`: SIGUSR2 to each rank, the bundled trainer's fault hook: its next gradient gets a NaN.
//! - `slow:PERCENT`: each rank's processes moved into a CPU cgroup whose quota lets them use
//!   PERCENT % of the CPU they used in the second before (real CFS throttling): cgroup v2's
//!   `cpu.max` where a unified hierarchy has the cpu controller, else cgroup v1's
//!   `cpu.cfs_quota_us`. Needs root.
//!
//! The ranks are found in /proc by the rank directory their agent gave them
//! (`fleetmend_agent::ranks::rank_processes`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{Signal, kill, killpg};

use super::{Fault, InjectError, InjectedFault, KILL_WAIT};
use crate::tree::NodeTree;

/// The CFS period the throttle's quota is a share of.
const CFS_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel takes.
const MIN_QUOTA_US: u64 = 1_000;
/// How long the ranks' CPU use is measured before `slow` sets their quota.
const MEASURE: Duration = Duration::from_secs(1);

impl NodeTree {
    /// A job fault (`hang`, `nan`, `slow:PERCENT`) on each job rank the node's agent runs.
    /// Records the fault; returns the ranks and their pids.
    pub fn signal_ranks(&self, fault: Fault) -> Result<Vec<(String, u32)>, InjectError> {
        let node = self.node().to_owned();
        let dir = self.dir().join("jobs");
        let ranks = fleetmend_agent::ranks::rank_processes(Path::new("/proc"), &dir);
        if ranks.is_empty() {
            return Err(InjectError::NoRanks { fault, node, dir });
        }
        let ranks: Vec<(String, u32)> =
            ranks.into_iter().map(|(key, pid)| (key.to_string(), pid)).collect();
        match fault {
            Fault::Slow(percent) => throttle(&node, &ranks, percent)?,
            _ => signal(&node, fault, &ranks)?,
        }
        let _lock = self.lock()?;
        let mut meta = self.read_meta()?;
        meta.faults.push(InjectedFault { fault, at: SystemTime::now(), persistent: false });
        self.write_meta(&meta)?;
        Ok(ranks)
    }
}

/// `hang` (SIGSTOP to each rank's group, then waits until each shows as stopped) or `nan`
/// (SIGUSR2 to each rank).
fn signal(node: &str, fault: Fault, ranks: &[(String, u32)]) -> Result<(), InjectError> {
    for (rank, pid) in ranks {
        let target = nix::unistd::Pid::from_raw(*pid as i32);
        let sent = match fault {
            Fault::Hang => killpg(target, Signal::SIGSTOP),
            _ => kill(target, Signal::SIGUSR2),
        };
        if let Err(errno) = sent {
            let (node, rank, pid) = (node.to_owned(), rank.clone(), *pid);
            return Err(InjectError::SignalRank { fault, node, rank, pid, errno });
        }
    }
    if fault != Fault::Hang {
        return Ok(());
    }
    let deadline = Instant::now() + KILL_WAIT;
    for (_, pid) in ranks {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        while !matches!(process_state(&proc_dir), Some('T' | 't') | None) {
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// Where the throttle's cgroups are made, and how their quota is written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CpuHierarchy {
    /// A cgroup v2 hierarchy with the cpu controller: `cpu.max` = `QUOTA PERIOD`.
    V2(PathBuf),
    /// cgroup v1's cpu controller: `cpu.cfs_period_us`, `cpu.cfs_quota_us`.
    V1(PathBuf),
}

/// The hierarchy that can throttle CPU under `cgroup_root` (`/sys/fs/cgroup`).
fn cpu_hierarchy(cgroup_root: &Path) -> Option<CpuHierarchy> {
    let has_cpu = |dir: &Path| {
        fs::read_to_string(dir.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|name| name == "cpu"))
    };
    for dir in [cgroup_root.to_owned(), cgroup_root.join("unified")] {
        if has_cpu(&dir) {
            return Some(CpuHierarchy::V2(dir));
        }
    }
    let v1 = cgroup_root.join("cpu");
    v1.join("cpu.cfs_quota_us").exists().then_some(CpuHierarchy::V1(v1))
}

/// CPU time (user + system) of `pid` and its threads so far, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    // After the state: utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The processes of process group `pgid` (a rank's launcher and what it started).
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
                let fields: Vec<&str> = stat
                    .rsplit_once(") ")
                    .map(|(_, rest)| rest.split_whitespace().collect())
                    .unwrap_or_default();
                fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid)
            })
        })
        .collect()
}

/// The quota, in microseconds per [`CFS_PERIOD_US`], that lets a process that used `used`
/// seconds of CPU in `over` seconds of wall time use `percent` % of that.
fn quota_us(used: f64, over: f64, percent: u32) -> u64 {
    let share = if over > 0.0 { used / over } else { 1.0 };
    let quota = share * f64::from(percent) / 100.0 * CFS_PERIOD_US as f64;
    (quota.round() as u64).max(MIN_QUOTA_US)
}

/// The cgroup of `slow` for a rank of `node`.
fn throttle_group(node: &str, rank: &str) -> String {
    format!("{}{}", throttle_prefix(node), rank.replace(['/', ' ', '#'], "-"))
}

fn throttle_prefix(node: &str) -> String {
    format!("fleetmend-slow-{node}-")
}

/// Removes the cgroups `slow` made for `node`'s ranks (once the ranks are gone; a cgroup that
/// still holds a process stays).
pub fn release_throttles(node: &str) {
    let Some(hierarchy) = cpu_hierarchy(Path::new("/sys/fs/cgroup")) else { return };
    let root = match hierarchy {
        CpuHierarchy::V2(root) | CpuHierarchy::V1(root) => root,
    };
    let Ok(entries) = fs::read_dir(&root) else { return };
    let prefix = throttle_prefix(node);
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))
            && let Err(err) = fs::remove_dir(entry.path())
        {
            tracing::warn!(path = %entry.path().display(), error = %err, "removing a throttle cgroup failed");
        }
    }
}

/// `slow:PERCENT`: measures each rank's CPU use for a second, then moves its process group into
/// a cgroup of its own whose quota is PERCENT % of that.
fn throttle(node: &str, ranks: &[(String, u32)], percent: u32) -> Result<(), InjectError> {
    let fault = Fault::Slow(percent);
    if !nix::unistd::geteuid().is_root() {
        return Err(InjectError::ThrottleNeedsRoot { fault });
    }
    let hierarchy =
        cpu_hierarchy(Path::new("/sys/fs/cgroup")).ok_or(InjectError::NoCpuController { fault })?;
    // Clock ticks per second: 100 on Linux for /proc/<pid>/stat.
    const TICKS: f64 = 100.0;
    let before: Vec<Option<u64>> = ranks.iter().map(|(_, pid)| cpu_ticks(*pid)).collect();
    let started = Instant::now();
    std::thread::sleep(MEASURE);
    let over = started.elapsed().as_secs_f64();
    for ((rank, pid), before) in ranks.iter().zip(before) {
        let used = match (before, cpu_ticks(*pid)) {
            (Some(before), Some(after)) => after.saturating_sub(before) as f64 / TICKS,
            _ => over,
        };
        let quota = quota_us(used, over, percent);
        let name = throttle_group(node, rank);
        let failed = |what: &str, path: &Path, source: std::io::Error| InjectError::Throttle {
            fault,
            what: format!("{what} {}", path.display()),
            source,
        };
        let (dir, writes): (PathBuf, Vec<(&str, String)>) = match &hierarchy {
            CpuHierarchy::V2(root) => {
                (root.join(&name), vec![("cpu.max", format!("{quota} {CFS_PERIOD_US}"))])
            }
            CpuHierarchy::V1(root) => (
                root.join(&name),
                vec![
                    ("cpu.cfs_period_us", CFS_PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ],
            ),
        };
        fs::create_dir_all(&dir).map_err(|e| failed("making", &dir, e))?;
        for (file, value) in writes {
            let path = dir.join(file);
            fs::write(&path, value).map_err(|e| failed("writing", &path, e))?;
        }
        let procs = dir.join("cgroup.procs");
        for member in group_members(*pid) {
            // A process that ended meanwhile is not an error.
            if let Err(e) = fs::write(&procs, member.to_string())
                && Path::new(&format!("/proc/{member}")).exists()
            {
                return Err(failed("moving a process into", &procs, e));
            }
        }
        tracing::info!(%node, %rank, quota_us = quota, "rank throttled");
    }
    Ok(())
}

/// The state letter of the process of `/proc/<pid>` (`R`, `S`, `T`, `Z`, ...); `None` when gone.
fn process_state(proc_dir: &Path) -> Option<char> {
    let stat = fs::read_to_string(proc_dir.join("stat")).ok()?;
    // The state follows the command name in parentheses, which may itself hold spaces.
    stat.rsplit_once(')')?.1.split_whitespace().next()?.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_is_the_percent_of_what_the_rank_used() {
        // Used half a CPU for a second: 50 % of it is a quarter CPU.
        assert_eq!(quota_us(0.5, 1.0, 50), 25_000);
        assert_eq!(quota_us(1.0, 1.0, 100), 100_000);
        // A rank that used nothing still gets the kernel's smallest quota.
        assert_eq!(quota_us(0.0, 1.0, 50), MIN_QUOTA_US);
    }

    #[test]
    fn the_cpu_hierarchy_is_v2_where_it_has_the_cpu_controller_else_v1() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(cpu_hierarchy(root.path()), None);
        fs::create_dir_all(root.path().join("cpu")).unwrap();
        fs::write(root.path().join("cpu/cpu.cfs_quota_us"), "-1\n").unwrap();
        assert_eq!(cpu_hierarchy(root.path()), Some(CpuHierarchy::V1(root.path().join("cpu"))));
        // A unified hierarchy without the cpu controller (as beside v1's) does not count...
        fs::create_dir_all(root.path().join("unified")).unwrap();
        fs::write(root.path().join("unified/cgroup.controllers"), "memory pids\n").unwrap();
        assert_eq!(cpu_hierarchy(root.path()), Some(CpuHierarchy::V1(root.path().join("cpu"))));
        // ...one with it does.
        fs::write(root.path().join("unified/cgroup.controllers"), "cpu memory pids\n").unwrap();
        assert_eq!(cpu_hierarchy(root.path()), Some(CpuHierarchy::V2(root.path().join("unified"))));
    }
}
