//! `agent-kill`: the node's agent killed, so the node stops reporting.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::{Fault, InjectError, InjectedFault, KILL_WAIT};
use crate::tree::NodeTree;

impl NodeTree {
    /// `agent-kill`: sends SIGKILL to the pid in `agent.pid`, after checking that the process is
    /// this tree's agent (a stale pid file must not kill an unrelated process), and waits until
    /// it is gone or a zombie for its parent to reap. Records the fault; returns the pid.
    pub fn kill_agent(&self) -> Result<i32, InjectError> {
        let node = self.node().to_owned();
        let path = self.agent_pid_path();
        let text = fs::read_to_string(&path)
            .map_err(|source| InjectError::AgentPid { path: path.clone(), source })?;
        let pid = match text.trim().parse::<i32>() {
            Ok(pid) if pid > 1 => pid,
            _ => return Err(InjectError::AgentPidInvalid { path, text: text.trim().to_owned() }),
        };
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let args: Vec<String> = match fs::read(proc_dir.join("cmdline")) {
            Ok(bytes) => bytes
                .split(|b| *b == 0)
                .filter(|arg| !arg.is_empty())
                .map(|arg| String::from_utf8_lossy(arg).into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        if args.is_empty() || process_gone(&proc_dir) {
            return Err(InjectError::AgentNotRunning { node, pid });
        }
        let sysfs_flag = format!("--path.sysfs={}", self.dir().join("sys").display());
        let is_agent = args.iter().any(|arg| arg == "agent") && args.contains(&sysfs_flag);
        if !is_agent {
            return Err(InjectError::NotTheAgent { node, pid, command: args.join(" ") });
        }
        let target = nix::unistd::Pid::from_raw(pid);
        match nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL) {
            Ok(()) => {}
            Err(nix::errno::Errno::ESRCH) => {
                return Err(InjectError::AgentNotRunning { node, pid });
            }
            Err(errno) => return Err(InjectError::Kill { node, pid, errno }),
        }
        let deadline = Instant::now() + KILL_WAIT;
        while !process_gone(&proc_dir) {
            if Instant::now() >= deadline {
                return Err(InjectError::KillTimeout { node, pid, waited: KILL_WAIT });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _lock = self.lock()?;
        let mut meta = self.read_meta()?;
        meta.faults.push(InjectedFault {
            fault: Fault::AgentKill,
            at: SystemTime::now(),
            persistent: false,
        });
        self.write_meta(&meta)?;
        Ok(pid)
    }
}

/// The process of `/proc/<pid>` has exited: gone, or a zombie waiting for its parent.
fn process_gone(proc_dir: &Path) -> bool {
    match fs::read_to_string(proc_dir.join("stat")) {
        // The state follows the command name in parentheses, which may itself hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn process_state_is_read_past_the_command_name() {
        let temp = tempfile::tempdir().unwrap();
        fs::write(temp.path().join("stat"), "42 (a) b) Z 1 2 3").unwrap();
        assert!(process_gone(temp.path()));
        fs::write(temp.path().join("stat"), "42 (a) b) S 1 2 3").unwrap();
        assert!(!process_gone(temp.path()));
        assert!(process_gone(&temp.path().join("nothing")));
    }
}
