//! A simulated node's host tree: the sysfs, procfs, root, kernel log and GPU fixture its agent
//! reads (`--path.sysfs`, `--path.procfs`, `--path.rootfs`, `--kmsg`, `--gpu fixture:`).
//!
//! Layout of `<state>/nodes/<node>/`:
//! - `sys/`, `proc/`, `root/`, `kmsg`, `gpu.json`: the host as the agent sees it, rebuilt from the
//!   healthy template ([`template::HEALTHY`]) on every simulated boot;
//! - `node.json`: the node's name, boot id, boot time and the faults in effect (it marks the
//!   directory as a node tree);
//! - `agent.toml`: the agent's config for this node ([`NodeTree::agent_config`]);
//! - `agent.pid`: written by `fleetmend up` for the agent it runs on the tree;
//! - `.lock`: serialises `fleetmend inject` and `fleetmend up` on one tree.
//!
//! Anything else in the directory (agent logs, rank directories) is left alone by reboots.
//!
//! The tree's clock: `proc/uptime` is the time since the simulated boot (plus [`BOOT_UPTIME`]),
//! written at each boot and each time a fault is injected, and kernel-log lines carry it as their
//! timestamp, so the agent dates each line to the moment it was written.

mod template;

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::faults::{self, InjectError, InjectedFault};

/// The environment variable naming the state directory of `fleetmend up` and `fleetmend inject`.
pub const STATE_DIR_ENV: &str = "FLEETMEND_UP_DIR";
/// The state directory when neither `--state-dir` nor [`STATE_DIR_ENV`] names one.
pub const DEFAULT_STATE_DIR: &str = "fleetmend-up";

/// Marks a directory as a node tree and holds its state.
pub const META_FILE: &str = "node.json";
/// The agent's config, written by [`NodeTree::agent_config`].
pub const AGENT_CONFIG_FILE: &str = "agent.toml";
/// The pid of the agent running on the tree (written by `fleetmend up`).
pub const AGENT_PID_FILE: &str = "agent.pid";
const LOCK_FILE: &str = ".lock";

/// The parts of the tree a simulated boot rebuilds.
const HOST_PARTS: [&str; 5] = ["sys", "proc", "root", "kmsg", "gpu.json"];
const BOOT_ID_PATH: &str = "proc/sys/kernel/random/boot_id";
const UPTIME_PATH: &str = "proc/uptime";
pub(crate) const KMSG_PATH: &str = "kmsg";
pub(crate) const GPU_FIXTURE_PATH: &str = "gpu.json";
pub(crate) const MOUNTS_PATH: &str = "proc/mounts";

/// The uptime at which a simulated boot hands over to the agent: the template's kernel log (the
/// boot's own lines) ends at 15.3 s.
pub const BOOT_UPTIME: Duration = Duration::from_secs(20);

/// Longest wait for another process (`fleetmend inject`, `fleetmend up`) to finish with the tree.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
const LOCK_POLL: Duration = Duration::from_millis(10);

/// Layout version written in `node.json`.
const FORMAT: u32 = 1;

/// Where `fleetmend up` keeps its node trees.
pub fn nodes_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("nodes")
}

/// The tree of `node` in `state_dir`.
pub fn node_dir(state_dir: &Path, node: &str) -> PathBuf {
    nodes_dir(state_dir).join(node)
}

/// The nodes with a tree in `state_dir`, sorted; none when there is no `nodes/` directory.
pub fn list_nodes(state_dir: &Path) -> Result<Vec<String>, TreeError> {
    let dir = nodes_dir(state_dir);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(TreeError::Read { path: dir, source }),
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| TreeError::Read { path: dir.clone(), source })?;
        if entry.path().join(META_FILE).is_file()
            && let Some(name) = entry.file_name().to_str()
        {
            nodes.push(name.to_owned());
        }
    }
    nodes.sort();
    Ok(nodes)
}

/// A node name is a directory name and a TOML string: letters, digits, `.`, `_`, `-`, at most 64,
/// not starting with `.`.
pub fn validate_node_name(node: &str) -> Result<(), TreeError> {
    let reason = if node.is_empty() {
        Some("it is empty")
    } else if node.len() > 64 {
        Some("it is longer than 64 characters")
    } else if node.starts_with('.') {
        Some("it starts with '.'")
    } else if !node.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        Some("only letters, digits, '.', '_' and '-' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(TreeError::InvalidNodeName { node: node.to_owned(), reason }),
        None => Ok(()),
    }
}

/// A node tree could not be created, read, rebooted or cleaned up.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("{node:?} is not a usable node name: {reason}")]
    InvalidNodeName { node: String, reason: &'static str },
    #[error("{} exists and is not a node tree (no {META_FILE} in it); not touching it", dir.display())]
    NotANodeTree { dir: PathBuf },
    #[error("reading {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("writing {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("removing {}: {source}", path.display())]
    Remove { path: PathBuf, source: io::Error },
    #[error("{}: {message}", path.display())]
    Corrupt { path: PathBuf, message: String },
    #[error("locking {}: {source}", path.display())]
    Lock { path: PathBuf, source: io::Error },
    #[error("locking {}: another process still holds it after {timeout:?}", path.display())]
    LockTimeout { path: PathBuf, timeout: Duration },
    #[error("unmounting {}: {errno}", path.display())]
    Unmount { path: PathBuf, errno: nix::errno::Errno },
    #[error("the agent config {}: {message}", path.display())]
    AgentConfig { path: PathBuf, message: String },
    #[error("node {node}: re-applying persistent fault {fault} after the reboot: {source}")]
    Reapply { node: String, fault: String, source: Box<InjectError> },
}

/// What `node.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TreeMeta {
    /// Layout version of the tree.
    pub format: u32,
    /// The node's name.
    pub node: String,
    /// The boot id of the current simulated boot (also in `proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// When the current simulated boot began (its uptime was [`BOOT_UPTIME`] then).
    pub booted_at: SystemTime,
    /// The faults in effect on this boot, in the order they were injected.
    pub faults: Vec<InjectedFault>,
}

impl TreeMeta {
    /// The simulated uptime at `now`.
    pub fn uptime(&self, now: SystemTime) -> Duration {
        BOOT_UPTIME + now.duration_since(self.booted_at).unwrap_or_default()
    }
}

/// One simulated node: `<state>/nodes/<node>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTree {
    /// Absolute: the agent is given paths inside it, and mounts are found by it.
    dir: PathBuf,
    node: String,
}

/// Holds the tree's lock until dropped.
#[derive(Debug)]
pub(crate) struct TreeLock {
    _file: fs::File,
}

impl NodeTree {
    /// Creates `dir` with a healthy 8-GPU node's host tree (sys/, proc/, root/, kmsg, gpu.json),
    /// its agent config and a new boot id; fails if `dir` exists and is not a node tree. An
    /// existing node tree is rebuilt as a new, healthy node (its faults, persistent ones too, are
    /// gone; what it mounted is unmounted).
    pub fn create(dir: &Path, node: &str) -> Result<NodeTree, TreeError> {
        validate_node_name(node)?;
        fs::create_dir_all(dir)
            .map_err(|source| TreeError::Write { path: dir.to_owned(), source })?;
        let dir = absolute(dir)?;
        if !dir.join(META_FILE).is_file() {
            let entries = fs::read_dir(&dir)
                .map_err(|source| TreeError::Read { path: dir.clone(), source })?;
            // A create that stopped between taking the lock and writing node.json leaves the lock.
            let foreign =
                entries.filter_map(Result::ok).any(|entry| entry.file_name() != LOCK_FILE);
            if foreign {
                return Err(TreeError::NotANodeTree { dir });
            }
        }
        let tree = NodeTree { dir, node: node.to_owned() };
        let _lock = tree.lock()?;
        // node.json first: from here on the directory is a node tree, and a create that stops
        // half-way is finished by the next one.
        let meta = TreeMeta {
            format: FORMAT,
            node: node.to_owned(),
            boot_id: new_boot_id(),
            booted_at: SystemTime::now(),
            faults: Vec::new(),
        };
        tree.write_meta(&meta)?;
        tree.boot(Vec::new())?;
        tree.agent_config("")?;
        Ok(tree)
    }

    /// Opens an existing node tree.
    pub fn open(dir: &Path) -> Result<NodeTree, TreeError> {
        let meta_path = dir.join(META_FILE);
        if !meta_path.is_file() {
            return Err(TreeError::NotANodeTree { dir: dir.to_owned() });
        }
        let dir = absolute(dir)?;
        let meta = read_meta_at(&dir.join(META_FILE))?;
        Ok(NodeTree { dir, node: meta.node })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The agent's config file ([`NodeTree::agent_config`] writes it).
    pub fn agent_config_path(&self) -> PathBuf {
        self.dir.join(AGENT_CONFIG_FILE)
    }

    /// Where `fleetmend up` writes the pid of the tree's agent (`fleetmend inject NODE agent-kill`
    /// kills that process).
    pub fn agent_pid_path(&self) -> PathBuf {
        self.dir.join(AGENT_PID_FILE)
    }

    /// The kernel log the agent follows.
    pub fn kmsg_path(&self) -> PathBuf {
        self.dir.join(KMSG_PATH)
    }

    /// The GPU fixture the agent reads.
    pub fn gpu_fixture_path(&self) -> PathBuf {
        self.dir.join(GPU_FIXTURE_PATH)
    }

    /// The `fleetmend agent` flags that point the agent at this tree: its config (checks for this
    /// node: 8 GPUs, the required NICs and mounts), node name, host paths, kernel log and GPU
    /// fixture. Each flag is one `--name=value` argument.
    pub fn agent_flags(&self) -> Vec<String> {
        let at = |part: &str| self.dir.join(part).display().to_string();
        vec![
            format!("--config={}", self.agent_config_path().display()),
            format!("--node={}", self.node),
            format!("--path.sysfs={}", at("sys")),
            format!("--path.procfs={}", at("proc")),
            format!("--path.rootfs={}", at("root")),
            format!("--kmsg={}", at(KMSG_PATH)),
            format!("--gpu=fixture:{}", at(GPU_FIXTURE_PATH)),
        ]
    }

    /// Writes the agent's config — the checks of this simulated node (see [`checks_config`]) with
    /// `extra` TOML appended (e.g. `[report]` and `[jobs]`; no `[checks.*]` or top-level keys) —
    /// after validating it as the agent will, and returns its path.
    pub fn agent_config(&self, extra: &str) -> Result<PathBuf, TreeError> {
        let path = self.agent_config_path();
        let mut text = checks_config(&self.node);
        if !extra.trim().is_empty() {
            text.push_str("\n# Added by fleetmend up.\n");
            text.push_str(extra);
            if !extra.ends_with('\n') {
                text.push('\n');
            }
        }
        let config = fleetmend_agent::config::AgentConfig::parse(&text)
            .map_err(|message| TreeError::AgentConfig { path: path.clone(), message })?;
        config.validated(&path).map_err(|err| TreeError::AgentConfig {
            path: path.clone(),
            message: err.to_string(),
        })?;
        write_atomic(&path, text.as_bytes())?;
        Ok(path)
    }

    /// A simulated reboot: unmounts what faults mounted, rebuilds the host parts from the healthy
    /// template, writes a new boot id and a new kernel log (the boot's own lines only), re-applies
    /// the persistent faults and drops the others. Returns the new boot id. The agent must be
    /// stopped before and started again after by the caller (it reads the boot id at start).
    pub fn reboot(&self) -> Result<String, TreeError> {
        let _lock = self.lock()?;
        let meta = self.read_meta()?;
        let persistent =
            meta.faults.into_iter().filter(|f| f.persistent && f.fault.is_tree_fault()).collect();
        self.boot(persistent)
    }

    /// The boot id the agent sees (`proc/sys/kernel/random/boot_id`).
    pub fn boot_id(&self) -> Result<String, TreeError> {
        let path = self.dir.join(BOOT_ID_PATH);
        let text = fs::read_to_string(&path)
            .map_err(|source| TreeError::Read { path: path.clone(), source })?;
        Ok(text.trim().to_owned())
    }

    /// Unmounts everything mounted inside the tree (the tmpfs of `disk-full`). `fleetmend up`
    /// calls it for every node when it stops; the tree itself stays (a later `create` rebuilds it).
    pub fn cleanup(&self) -> Result<(), TreeError> {
        unmount_under(&self.dir)
    }

    /// Rebuilds the host parts for a new boot and re-applies `persistent`. The caller holds the
    /// lock.
    fn boot(&self, persistent: Vec<InjectedFault>) -> Result<String, TreeError> {
        unmount_under(&self.dir)?;
        for part in HOST_PARTS {
            remove_any(&self.dir.join(part))?;
        }
        for (relative, contents) in template::HEALTHY {
            let path = self.dir.join(relative);
            create_parent(&path)?;
            fs::write(&path, contents).map_err(|source| TreeError::Write { path, source })?;
        }
        let mut meta = self.read_meta()?;
        meta.format = FORMAT;
        meta.boot_id = new_boot_id();
        meta.booted_at = SystemTime::now();
        meta.faults = Vec::new();
        let boot_id_path = self.dir.join(BOOT_ID_PATH);
        create_parent(&boot_id_path)?;
        write_atomic(&boot_id_path, format!("{}\n", meta.boot_id).as_bytes())?;
        self.write_uptime(&meta, meta.booted_at)?;
        for injected in persistent {
            faults::apply(self, &meta, &injected.fault).map_err(|source| TreeError::Reapply {
                node: self.node.clone(),
                fault: injected.fault.to_string(),
                source: Box::new(source),
            })?;
            meta.faults.push(injected);
        }
        self.write_meta(&meta)?;
        Ok(meta.boot_id)
    }

    /// Takes the tree's lock, waiting up to [`LOCK_TIMEOUT`] for another process to let go.
    pub(crate) fn lock(&self) -> Result<TreeLock, TreeError> {
        let path = self.dir.join(LOCK_FILE);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| TreeError::Lock { path: path.clone(), source })?;
        let deadline = Instant::now() + LOCK_TIMEOUT;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(TreeLock { _file: file }),
                Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(LOCK_POLL);
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(TreeError::LockTimeout { path, timeout: LOCK_TIMEOUT });
                }
                Err(fs::TryLockError::Error(source)) => {
                    return Err(TreeError::Lock { path, source });
                }
            }
        }
    }

    pub(crate) fn read_meta(&self) -> Result<TreeMeta, TreeError> {
        read_meta_at(&self.dir.join(META_FILE))
    }

    pub(crate) fn write_meta(&self, meta: &TreeMeta) -> Result<(), TreeError> {
        let path = self.dir.join(META_FILE);
        let text = serde_json::to_string_pretty(meta)
            .map_err(|err| TreeError::Corrupt { path: path.clone(), message: err.to_string() })?;
        write_atomic(&path, format!("{text}\n").as_bytes())
    }

    /// Writes `proc/uptime` for `now`; returns the uptime written.
    pub(crate) fn write_uptime(
        &self,
        meta: &TreeMeta,
        now: SystemTime,
    ) -> Result<Duration, TreeError> {
        let uptime = meta.uptime(now);
        // The second field is idle time summed over CPUs; nothing reads it, but it looks real.
        let seconds = uptime.as_secs_f64();
        let text = format!("{seconds:.2} {:.2}\n", seconds * 190.0);
        write_atomic(&self.dir.join(UPTIME_PATH), text.as_bytes())?;
        Ok(uptime)
    }

    /// Appends `(priority, message)` lines to the kernel log the way `/dev/kmsg` shows them
    /// (`PRIO,SEQ,USEC,-;message`), stamped with the tree's uptime now (written first, so the
    /// agent dates the lines to now).
    pub(crate) fn append_kmsg(
        &self,
        meta: &TreeMeta,
        lines: &[(u8, String)],
    ) -> Result<(), TreeError> {
        let lines: Vec<(u8, Duration, String)> = lines
            .iter()
            .map(|(priority, line)| (*priority, Duration::ZERO, line.clone()))
            .collect();
        self.append_kmsg_ago(meta, &lines)
    }

    /// Appends `(priority, ago, message)` lines as [`Self::append_kmsg`] does, each stamped `ago`
    /// before now (a burst logged over the last seconds).
    pub(crate) fn append_kmsg_ago(
        &self,
        meta: &TreeMeta,
        lines: &[(u8, Duration, String)],
    ) -> Result<(), TreeError> {
        let uptime = self.write_uptime(meta, SystemTime::now())?;
        let path = self.dir.join(KMSG_PATH);
        let mut existing = String::new();
        if let Ok(mut file) = fs::File::open(&path) {
            file.read_to_string(&mut existing)
                .map_err(|source| TreeError::Read { path: path.clone(), source })?;
        }
        let last_seq = existing
            .lines()
            .filter_map(|line| line.split(',').nth(1)?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let mut text = String::new();
        if !existing.is_empty() && !existing.ends_with('\n') {
            text.push('\n');
        }
        for (offset, (priority, ago, message)) in (1u64..).zip(lines) {
            let usec = uptime.saturating_sub(*ago).as_micros();
            text.push_str(&format!("{priority},{},{usec},-;{message}\n", last_seq + offset));
        }
        // One write with O_APPEND: the follower never sees half a batch.
        let mut file = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|source| TreeError::Write { path: path.clone(), source })?;
        file.write_all(text.as_bytes()).map_err(|source| TreeError::Write { path, source })
    }
}

/// The agent config of a simulated node: the healthy fixture's checks (8 GPUs, eth0 and ib0 with
/// their speed and MTU, the InfiniBand port, `/` and `/scratch`, 192 CPUs, slurmd and the fabric
/// manager) on short intervals, so a fault written into the tree is reported within a second.
pub fn checks_config(node: &str) -> String {
    format!(
        r#"# The agent of simulated node {node}, written by fleetmend up: the checks of the healthy
# 8-GPU fixture node, on short intervals so a fault written into the tree (fleetmend inject) is
# reported within a second. Host paths come from the command line.
node = "{node}"

[checks.gpu]
interval = "500ms"
timeout = "400ms"
expected_count = 8
# Fixture GPUs never show up late after a boot: one missing fails on the first run.
count_debounce = 1
boot_grace = "0s"
# Nor do their clocks recover by themselves: a hardware slowdown is sustained from its first run.
throttle_sustained_runs = 1

[checks.kernel_log]
interval = "2s"
timeout = "1s"
poll_interval = "50ms"
# The tree's kernel log holds this boot's lines only, as /dev/kmsg would.
read_existing = true

[checks.pcie]
interval = "500ms"
timeout = "400ms"
# Fixture links do not retrain by themselves: a slower one fails on its first run.
debounce = 1

[checks.nic]
interval = "500ms"
timeout = "400ms"
required = ["eth0", "ib0"]
expected_speed_mbps = {{ eth0 = 100000 }}
expected_mtu = {{ eth0 = 9000, ib0 = 4092 }}
required_ib = ["mlx5_0/1"]

[checks.disk]
interval = "1s"
timeout = "900ms"
probe_timeout = "600ms"

# The tree's mounts are directories on this machine's disk: only a truly full one fails (the
# disk-full fault mounts a real tmpfs and fills it). Nor are they write-probed: every node's fsync
# lands on this one disk, which stalls for seconds while the machine is busy (a build, the test
# suite, the job's own checkpoints), and such a stall hits every node at once and opened the
# breaker; it is not a node's hung disk. (The probe itself: agent/tests/disk.rs.)
[[checks.disk.mounts]]
path = "/"
min_free_ratio = 0.002
warn_free_ratio = 0.004
probe = false

[[checks.disk.mounts]]
path = "/scratch"
min_free_ratio = 0.002
warn_free_ratio = 0.004
probe = false

[checks.host]
interval = "2s"
timeout = "1s"
expected_cpus = 192
required_processes = ["slurmd", "nv-fabricmanager"]
"#
    )
}

fn read_meta_at(path: &Path) -> Result<TreeMeta, TreeError> {
    let text = fs::read_to_string(path)
        .map_err(|source| TreeError::Read { path: path.to_owned(), source })?;
    let meta: TreeMeta = serde_json::from_str(&text)
        .map_err(|err| TreeError::Corrupt { path: path.to_owned(), message: err.to_string() })?;
    if meta.format != FORMAT {
        return Err(TreeError::Corrupt {
            path: path.to_owned(),
            message: format!("layout version {} (this fleetmend writes {FORMAT})", meta.format),
        });
    }
    Ok(meta)
}

/// `dir` as an absolute path without symlinks (the kernel's mount table shows it that way).
fn absolute(dir: &Path) -> Result<PathBuf, TreeError> {
    dir.canonicalize().map_err(|source| TreeError::Read { path: dir.to_owned(), source })
}

fn create_parent(path: &Path) -> Result<(), TreeError> {
    match path.parent() {
        Some(parent) => fs::create_dir_all(parent)
            .map_err(|source| TreeError::Write { path: parent.to_owned(), source }),
        None => Ok(()),
    }
}

/// Removes a file or a directory tree; absent is fine.
fn remove_any(path: &Path) -> Result<(), TreeError> {
    let result = match fs::symlink_metadata(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(TreeError::Remove { path: path.to_owned(), source }),
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    result.map_err(|source| TreeError::Remove { path: path.to_owned(), source })
}

/// Writes `path` through a temporary file and a rename, so a reader (the agent) sees the old file
/// or the new one, never half of one.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), TreeError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = fs::write(&temp, contents).and_then(|()| fs::rename(&temp, path));
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result.map_err(|source| TreeError::Write { path: path.to_owned(), source })
}

/// A new boot id in the kernel's format (a random UUID).
fn new_boot_id() -> String {
    let bits = fastrand::u128(..);
    let hex = format!("{bits:032x}");
    // Version 4, variant 10xx, as /proc/sys/kernel/random/boot_id is.
    let variant = ['8', '9', 'a', 'b'][usize::from(hex.as_bytes()[16] % 4)];
    format!(
        "{}-{}-4{}-{variant}{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// Mount points at or below `dir` in this process's mount table, deepest first.
pub(crate) fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>, TreeError> {
    let table = Path::new("/proc/self/mounts");
    let text = fs::read_to_string(table)
        .map_err(|source| TreeError::Read { path: table.to_owned(), source })?;
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .map(|point| PathBuf::from(unescape_mount_field(point)))
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    points.dedup();
    Ok(points)
}

/// Unmounts everything mounted at or below `dir` (detaching: an agent probing the mount must not
/// keep a reboot from going on).
fn unmount_under(dir: &Path) -> Result<(), TreeError> {
    for point in mounts_under(dir)? {
        match nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
            // Gone meanwhile (another cleanup): what was wanted.
            Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
            Err(errno) => return Err(TreeError::Unmount { path: point, errno }),
        }
    }
    Ok(())
}

/// The kernel writes space, tab, newline and backslash in mount-table fields as `\ooo`.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let digit = |at: usize| u32::from(bytes[at] - b'0');
            let value = digit(i + 1) * 64 + digit(i + 2) * 8 + digit(i + 3);
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn healthy_fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fixtures/healthy")
    }

    fn files_under(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files_under(root, &path, out);
            } else {
                out.insert(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }

    #[test]
    fn the_template_is_the_whole_healthy_fixture() {
        let root = healthy_fixture();
        let mut on_disk = BTreeSet::new();
        files_under(&root, &root, &mut on_disk);
        on_disk.remove("agent.toml");
        let embedded: BTreeSet<String> =
            template::HEALTHY.iter().map(|(path, _)| (*path).to_owned()).collect();
        assert_eq!(embedded, on_disk, "regenerate local/src/tree/template.rs");
        for (path, contents) in template::HEALTHY {
            assert_eq!(fs::read_to_string(root.join(path)).unwrap(), *contents, "{path}");
        }
    }

    #[test]
    fn node_names_are_plain_directory_names() {
        for good in ["node-1", "gpu_017", "a.b"] {
            assert!(validate_node_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".hidden", "../x", "a/b", "a b", "x\"y", &"n".repeat(65)] {
            let err = validate_node_name(bad).unwrap_err();
            assert!(matches!(err, TreeError::InvalidNodeName { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn boot_ids_look_like_the_kernels_and_differ() {
        let a = new_boot_id();
        let b = new_boot_id();
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(unescape_mount_field(r"/a\040b\011c\134d\040"), "/a b\tc\\d ");
        assert_eq!(unescape_mount_field(r"/plain\04"), r"/plain\04");
    }

    #[test]
    fn create_writes_a_tree_the_agent_config_accepts_and_refuses_foreign_dirs() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("nodes/n1");
        let tree = NodeTree::create(&dir, "n1").unwrap();
        assert_eq!(tree.node(), "n1");
        for part in HOST_PARTS {
            assert!(tree.dir().join(part).exists(), "{part}");
        }
        let boot = tree.boot_id().unwrap();
        assert_eq!(boot, tree.read_meta().unwrap().boot_id);
        let uptime: f64 = fs::read_to_string(tree.dir().join(UPTIME_PATH))
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((20.0..25.0).contains(&uptime), "{uptime}");
        assert_eq!(list_nodes(temp.path()).unwrap(), ["n1"]);
        assert_eq!(NodeTree::open(&dir).unwrap(), tree);

        let path = tree.agent_config("[report]\ninterval = \"1s\"\n").unwrap();
        assert!(fs::read_to_string(&path).unwrap().contains("[report]"));
        let err = tree.agent_config("[report]\nbogus = 1\n").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        // The bad config was not written.
        assert!(fs::read_to_string(&path).unwrap().contains("interval = \"1s\""));

        // Creating again over a node tree rebuilds it with a new boot.
        let again = NodeTree::create(&dir, "n1").unwrap();
        assert_ne!(again.boot_id().unwrap(), boot);

        let foreign = temp.path().join("foreign");
        fs::create_dir_all(&foreign).unwrap();
        fs::write(foreign.join("precious"), "keep").unwrap();
        let err = NodeTree::create(&foreign, "n2").unwrap_err();
        assert!(matches!(err, TreeError::NotANodeTree { .. }), "{err}");
        assert_eq!(fs::read_to_string(foreign.join("precious")).unwrap(), "keep");
        assert!(matches!(NodeTree::open(&foreign), Err(TreeError::NotANodeTree { .. })));
    }

    #[test]
    fn kernel_log_lines_continue_the_sequence_at_the_trees_uptime() {
        let temp = tempfile::tempdir().unwrap();
        let tree = NodeTree::create(&temp.path().join("n1"), "n1").unwrap();
        let meta = tree.read_meta().unwrap();
        tree.append_kmsg(&meta, &[(4, "first".to_owned()), (3, "second".to_owned())]).unwrap();
        let text = fs::read_to_string(tree.kmsg_path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let first: Vec<&str> = lines[lines.len() - 2].splitn(4, [',', ';']).collect();
        let second: Vec<&str> = lines[lines.len() - 1].splitn(4, [',', ';']).collect();
        assert_eq!((first[0], first[1], first[3]), ("4", "881", "-;first"));
        assert_eq!((second[0], second[1]), ("3", "882"));
        let usec: u64 = first[2].parse().unwrap();
        let uptime: f64 = fs::read_to_string(tree.dir().join(UPTIME_PATH))
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((usec as f64 / 1e6 - uptime).abs() < 0.01, "{usec} vs {uptime}");
    }
}
