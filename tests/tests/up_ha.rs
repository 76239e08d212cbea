//! `fleetmend up --repairers 2` on the PostgreSQL it starts: both repairers agree on one leader;
//! SIGKILL to the leader's process hands the lease to the other within the lease and a margin,
//! and `fleetmend up` starts the killed one again, which comes back as a standby; Ctrl-C (SIGINT)
//! stops everything, PostgreSQL included. Skipped where PostgreSQL is not installed, unless
//! `FLEETMEND_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleetmend_local::up::ha::LEASE;
use fleetmend_repairer::postgres_server::{PostgresServer, postgres_bin};
use fleetmend_tests::{fleetmend_bin, http_get, poll_until};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// Start: PostgreSQL's initdb, two repairers electing a leader, the agents' first reports.
const START: Duration = Duration::from_secs(120);
/// A standby's takeover: the killed leader's lease running out, and a margin for a loaded machine.
const TAKEOVER_MARGIN: Duration = Duration::from_secs(20);
/// `fleetmend up` restarting the killed repairer and it answering as a standby.
const RESTART: Duration = Duration::from_secs(60);
/// Ctrl-C to exit: the repairers, the agents and PostgreSQL stopped.
const STOP: Duration = Duration::from_secs(60);

/// `fleetmend up` running on a state directory; on drop (a failed test) it is stopped and what it
/// may have left running is stopped too.
struct Up {
    child: Child,
    state: PathBuf,
    log: PathBuf,
}

impl Up {
    fn fleet(&self) -> Value {
        std::fs::read_to_string(self.state.join("fleet.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null)
    }

    /// The repairers of `fleet.json`: (url, pid).
    fn repairers(&self) -> Vec<(String, Option<i32>)> {
        self.fleet()["repairers"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|r| {
                        (
                            r["url"].as_str().unwrap_or_default().to_owned(),
                            r["pid"].as_i64().map(|p| p as i32),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn describe(&self) -> String {
        let mut text = format!(
            "fleetmend up's output:\n{}\n",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
        for i in 1..=2 {
            let log = self.state.join("repairers").join(format!("repairer-{i}.log"));
            let repairer = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = repairer.lines().collect();
            text += &format!(
                "repairer-{i}.log (end):\n{}\n",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
        text
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
            let stopped = poll_until(STOP, || matches!(self.child.try_wait(), Ok(Some(_))));
            if !stopped {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        for (_, pid) in self.repairers() {
            if let Some(pid) = pid {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        let postgres = self.state.join("postgres");
        if postgres.join("data/postmaster.pid").exists()
            && let Ok(server) = PostgresServer::init(&postgres)
        {
            let _ = server.stop_mode("immediate");
        }
    }
}

/// What a repairer says at `GET /v1/leader`.
fn leader_of(url: &str) -> Option<Value> {
    let addr: SocketAddr = url.trim_start_matches("http://").parse().ok()?;
    let (status, body) = http_get(addr, "/v1/leader")?;
    (status == 200).then(|| serde_json::from_str(&body).ok()).flatten()
}

/// Processes whose command line names `needle`.
fn processes_naming(needle: &Path) -> Vec<(i32, String)> {
    let needle = needle.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            text.contains(&needle).then_some((pid, text))
        })
        .collect()
}

#[test]
fn killing_the_leader_hands_the_lease_to_the_standby_and_the_killed_one_returns_as_standby() {
    if postgres_bin().is_none() {
        assert!(
            std::env::var_os("FLEETMEND_REQUIRE_POSTGRES").is_none(),
            "FLEETMEND_REQUIRE_POSTGRES is set but PostgreSQL is not installed \
             (apt-get install postgresql)"
        );
        println!("SKIPPED: PostgreSQL is not installed (apt-get install postgresql)");
        return;
    }
    // Not under /root or another folder the `postgres` user cannot enter: a root run hands the
    // cluster's folder to that user.
    let dir = tempfile::Builder::new().prefix("fleetmend-up-ha").tempdir_in("/tmp").unwrap();
    let open = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    std::fs::set_permissions(dir.path(), open).unwrap();
    let state = dir.path().join("state");
    let log = dir.path().join("up.out");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(fleetmend_bin())
        .args(["up", "--repairers", "2", "--no-job", "--nodes", "2", "--spares", "0", "--fresh"])
        .arg("--state-dir")
        .arg(&state)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let mut up = Up { child, state: state.clone(), log };

    // Both repairers answer and agree on one leader, which says it leads.
    let mut agreed: Option<(String, i64)> = None;
    let started = poll_until(START, || {
        let repairers = up.repairers();
        if repairers.len() != 2 || up.fleet()["running"] != true {
            return false;
        }
        let answers: Vec<Value> = repairers.iter().filter_map(|(url, _)| leader_of(url)).collect();
        if answers.len() != 2 {
            return false;
        }
        let leader = answers[0]["leader"].as_str().unwrap_or_default().to_owned();
        let one_leader = answers.iter().filter(|a| a["role"] == "leader").count() == 1;
        let same = answers.iter().all(|a| a["leader"].as_str() == Some(leader.as_str()));
        let says_so = answers.iter().any(|a| a["role"] == "leader" && a["this"] == leader);
        if one_leader && same && says_so {
            agreed = Some((leader, answers[0]["epoch"].as_i64().unwrap_or_default()));
        }
        agreed.is_some()
    });
    assert!(started, "no agreed leader within {START:?}\n{}", up.describe());
    let (leader, epoch) = agreed.unwrap();
    let repairers = up.repairers();
    let (killed_url, killed_pid) = repairers.iter().find(|(url, _)| *url == leader).unwrap();
    let (standby_url, _) = repairers.iter().find(|(url, _)| *url != leader).unwrap();
    let killed_pid = killed_pid.unwrap();

    kill(Pid::from_raw(killed_pid), Signal::SIGKILL).unwrap();
    let killed_at = Instant::now();
    let took_over = poll_until(LEASE + TAKEOVER_MARGIN, || {
        leader_of(standby_url).is_some_and(|a| {
            a["role"] == "leader"
                && a["this"] == standby_url.as_str()
                && a["epoch"].as_i64().is_some_and(|e| e > epoch)
        })
    });
    assert!(
        took_over,
        "{standby_url} did not lead within {:?} of the leader's SIGKILL\n{}",
        LEASE + TAKEOVER_MARGIN,
        up.describe()
    );
    println!("the standby led {:?} after the leader's SIGKILL", killed_at.elapsed());

    // `fleetmend up` started the killed one again, under a new pid, and it is a standby now.
    let returned = poll_until(RESTART, || {
        let pid = up.repairers().into_iter().find(|(url, _)| url == killed_url).and_then(|r| r.1);
        pid.is_some_and(|pid| pid != killed_pid)
            && leader_of(killed_url).is_some_and(|a| {
                a["role"] == "standby" && a["leader"].as_str() == Some(standby_url.as_str())
            })
    });
    assert!(returned, "{killed_url} did not come back as a standby\n{}", up.describe());
    let pids: Vec<i32> = up.repairers().into_iter().filter_map(|(_, pid)| pid).collect();

    // Ctrl-C: everything stops, PostgreSQL too.
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).unwrap();
    let exited = poll_until(STOP, || matches!(up.child.try_wait(), Ok(Some(_))));
    assert!(exited, "fleetmend up did not exit within {STOP:?} of SIGINT\n{}", up.describe());
    let status = up.child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{}", up.describe());
    let postgres = processes_naming(&state.join("postgres"));
    assert!(postgres.is_empty(), "PostgreSQL left running: {postgres:?}\n{}", up.describe());
    for pid in pids {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "));
        assert!(!alive, "repairer pid {pid} left running\n{}", up.describe());
    }
    assert_eq!(up.fleet()["running"], false, "{}", up.describe());
}
