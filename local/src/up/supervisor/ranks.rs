//! The ranks an agent started, found in `/proc` by the rank directory the agent gives each of
//! them: those left running by agents that were killed are stopped with the fleet.

use std::path::Path;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// SIGKILLs every process group led by a rank whose rank directory lies under `nodes_dir`
/// (found by the variable the agent gives its ranks); returns how many.
pub fn kill_ranks_under(procfs: &Path, nodes_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(procfs) else { return 0 };
    let needle = format!("{}=", fleetmend_agent::ranks::RANK_DIR_VAR);
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        let under = environ
            .split(|b| *b == 0)
            .filter_map(|var| std::str::from_utf8(var).ok())
            .filter_map(|var| var.strip_prefix(&needle))
            .any(|dir| Path::new(dir).starts_with(nodes_dir));
        if !under {
            continue;
        }
        // The rank leads its own group; its children (if any) go with it.
        if killpg(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
            || kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Pids of processes whose rank directory lies under `nodes_dir` (tests, the stop's check).
pub fn ranks_under(procfs: &Path, nodes_dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(procfs) else { return Vec::new() };
    let needle = format!("{}=", fleetmend_agent::ranks::RANK_DIR_VAR);
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // A zombie is gone for every purpose but its parent's wait.
            if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')) {
                return None;
            }
            environ
                .split(|b| *b == 0)
                .filter_map(|var| std::str::from_utf8(var).ok())
                .filter_map(|var| var.strip_prefix(&needle))
                .any(|dir| Path::new(dir).starts_with(nodes_dir))
                .then_some(pid)
        })
        .collect()
}
