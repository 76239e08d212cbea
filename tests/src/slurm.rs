//! A Slurm dev cluster for system tests (`deploy/slurm/dev-cluster.sh`): munged, slurmctld and
//! four slurmd on this host, in a temp dir, stopped when dropped. Reboots through Slurm run the
//! cluster's fake RebootProgram (a new [`DevCluster::boot_id`], the node's slurmd restarted), and
//! the controller can be stopped and started alone.
//!
//! Needs root and Debian's `slurm-wlm munge`. [`can_run`] says whether this machine can run such a
//! test (printing why not): without root it cannot; without Slurm it cannot either, unless
//! `FLEETMEND_REQUIRE_SLURM=1` (set where Slurm is installed for the tests), which turns a missing
//! Slurm into a failure.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleetmend_repairer::provider::slurm::SlurmProvider;
use fleetmend_repairer::scheduler::slurm::{
    SlurmConfig, SlurmNode, SlurmScheduler, parse_show_node,
};

use crate::{fleetmend_bin, is_root, run_with_timeout, workspace_root};

/// A dev cluster in a temp dir; stopped (every daemon it started) when dropped, even on a failed
/// assertion.
#[derive(Debug)]
pub struct DevCluster {
    dir: tempfile::TempDir,
}

impl DevCluster {
    pub fn script() -> PathBuf {
        workspace_root().join("deploy/slurm/dev-cluster.sh")
    }

    pub fn start() -> DevCluster {
        let dir = tempfile::Builder::new().prefix("fm-slurm-").tempdir().unwrap();
        let (ctld, nodes) = free_ports();
        let output = run_with_timeout(
            Command::new(Self::script())
                .arg("start")
                .arg(dir.path())
                .env("FLEETMEND_SLURM_CTLD_PORT", ctld.to_string())
                .env("FLEETMEND_SLURM_NODE_PORT", nodes.to_string()),
            Duration::from_secs(60),
        );
        let cluster = DevCluster { dir };
        assert!(
            output.status.success(),
            "dev-cluster.sh start failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs a Slurm client command against this cluster; stdout, or a panic with stderr.
    pub fn slurm(&self, program: &str, args: &[&str]) -> String {
        let output = run_with_timeout(
            Command::new(program).args(args).env("SLURM_CONF", self.conf()),
            Duration::from_secs(20),
        );
        assert!(
            output.status.success(),
            "{program} {args:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `sinfo`'s state of one node (`idle`, `drained`, `idle*`...).
    pub fn node_state(&self, node: &str) -> String {
        self.slurm("sinfo", &["-h", "-N", "-n", node, "-o", "%T"]).trim().to_owned()
    }

    /// `sinfo -R`: node → reason.
    pub fn reasons(&self) -> Vec<(String, String)> {
        self.slurm("sinfo", &["-R", "-h", "-N", "-o", "%N|%E"])
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(n, r)| (n.trim().to_owned(), r.trim().to_owned()))
            .collect()
    }

    /// The `[slurm]` settings that reach this cluster (tests change the retries).
    pub fn slurm_config(&self) -> SlurmConfig {
        SlurmConfig {
            slurm_conf: Some(self.conf()),
            command_timeout: Duration::from_secs(10),
            ..SlurmConfig::default()
        }
    }

    pub fn scheduler(&self) -> SlurmScheduler {
        SlurmScheduler::new(self.slurm_config())
    }

    /// The `slurm` provider for this cluster (reboots run the cluster's fake RebootProgram).
    pub fn provider(&self) -> SlurmProvider {
        SlurmProvider::new(self.slurm_config())
    }

    /// Runs `dev-cluster.sh VERB DIR`; panics with its output when it fails.
    fn run_script(&self, verb: &str, timeout: Duration) {
        let output =
            run_with_timeout(Command::new(Self::script()).arg(verb).arg(self.path()), timeout);
        assert!(
            output.status.success(),
            "dev-cluster.sh {verb} failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Submits `deploy/slurm/resumable.sbatch` on two nodes running this build's `fleetmend
    /// train` for `steps` steps, a checkpoint every `every` (0: only when asked), checkpoints in
    /// `checkpoints` and `train_args` added to the trainer's flags; its job id and output file.
    pub fn submit_resumable(
        &self,
        checkpoints: &Path,
        steps: u64,
        every: u64,
        train_args: &str,
    ) -> (String, PathBuf) {
        let out = self.path().join("train.out");
        let output = run_with_timeout(
            Command::new("sbatch")
                .args(["--parsable", "--nodes=2", "-o"])
                .arg(&out)
                .arg(workspace_root().join("deploy/slurm/resumable.sbatch"))
                .current_dir(self.path())
                .env("SLURM_CONF", self.conf())
                .env("FLEETMEND", fleetmend_bin())
                .env("FLEETMEND_CHECKPOINT_DIR", checkpoints)
                .env("FLEETMEND_TRAIN_STEPS", steps.to_string())
                .env("FLEETMEND_CHECKPOINT_EVERY", every.to_string())
                .env("FLEETMEND_TRAIN_ARGS", train_args)
                .env("FLEETMEND_MASTER_PORT_BASE", master_port_base().to_string()),
            Duration::from_secs(20),
        );
        assert!(output.status.success(), "sbatch: {}", String::from_utf8_lossy(&output.stderr));
        (String::from_utf8_lossy(&output.stdout).trim().to_owned(), out)
    }

    /// `squeue`'s state of `job` (`RUNNING`, `COMPLETED`...; empty once Slurm forgot it).
    pub fn job_state(&self, job: &str) -> String {
        self.slurm("squeue", &["-h", "-t", "all", "-j", job, "-o", "%T"]).trim().to_owned()
    }

    /// Stops slurmctld only: slurmd and jobs stay, Slurm's clients cannot reach the controller.
    pub fn stop_controller(&self) {
        self.run_script("stop-controller", Duration::from_secs(30));
    }

    /// Starts slurmctld again on its kept state; returns once `scontrol ping` says it is up.
    pub fn start_controller(&self) {
        self.run_script("start-controller", Duration::from_secs(60));
    }

    /// The node's boot id (`DIR/nodes/NODE/boot_id`): a fresh one at start and after every reboot
    /// through the cluster's RebootProgram.
    pub fn boot_id(&self, node: &str) -> String {
        let path = self.path().join("nodes").join(node).join("boot_id");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
            .trim()
            .to_owned()
    }

    /// The pid of the node's running slurmd (from its pid file), if it runs.
    pub fn slurmd_pid(&self, node: &str) -> Option<u32> {
        let path = self.path().join("run").join(format!("slurmd-{node}.pid"));
        let pid: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// `scontrol show node NODE` parsed (state and reason).
    pub fn show_node(&self, node: &str) -> SlurmNode {
        let text = self.slurm("scontrol", &["show", "node", node]);
        parse_show_node(&text).unwrap_or_else(|| panic!("scontrol show node {node}: {text}"))
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let stopped = Command::new(Self::script()).arg("stop").arg(self.dir.path()).status();
        if !matches!(stopped, Ok(s) if s.success()) {
            eprintln!("dev-cluster.sh stop {}: {stopped:?}", self.dir.path().display());
        }
    }
}

/// `resumable.sbatch`'s `FLEETMEND_MASTER_PORT_BASE` for a fresh dev cluster: its first jobs'
/// rank 0 listens on a port free now, not on the same port as another cluster's job of the same
/// id (job ids start at 1 in every cluster).
pub fn master_port_base() -> u16 {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    port.saturating_sub(1)
}

/// A free port for slurmctld and the first of four consecutive free ports for the slurmd.
pub fn free_ports() -> (u16, u16) {
    let bindable = |port: u16| TcpListener::bind(("0.0.0.0", port)).is_ok();
    let pid = u16::try_from(std::process::id() % 2000).unwrap();
    for attempt in 0..200u16 {
        let base = 21_000 + (pid * 5 + attempt * 7) % 9_000;
        if (base..base + 5).all(bindable) {
            return (base + 4, base);
        }
    }
    panic!("no five consecutive free ports between 21000 and 30000");
}

pub fn slurm_installed() -> bool {
    ["/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch"]
        .iter()
        .all(|p| Path::new(p).exists())
}

/// Whether this machine can run the test; prints why not.
pub fn can_run() -> bool {
    if !is_root() {
        println!("SKIPPED: the Slurm system test needs root (slurmd runs jobs as their users)");
        return false;
    }
    if !slurm_installed() {
        assert!(
            std::env::var_os("FLEETMEND_REQUIRE_SLURM").is_none(),
            "FLEETMEND_REQUIRE_SLURM is set but Slurm is not installed (apt-get install slurm-wlm munge)"
        );
        println!("SKIPPED: Slurm is not installed (apt-get install slurm-wlm munge)");
        return false;
    }
    true
}

/// The trainer's JSON lines of kind `kind` (`start`, `progress`, `checkpoint`, `done`...) in a
/// job's output file.
pub fn train_events(out: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == kind)
        .collect()
}
