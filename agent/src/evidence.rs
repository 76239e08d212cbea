//! Evidence before a disruptive repair: the `evidence` command gathers what a reboot or a
//! replacement erases — the kernel log of the current boot, the agent's findings and check
//! results, and the output of the configured tools (`nvidia-smi -q`, `nvidia-bug-report.sh`) — into
//! one bounded [`EvidenceBundle`] the repairer keeps with the workflow.
//!
//! Every item has a timeout and a size cap, the whole bundle a time budget (the repairer's, sent with
//! the command) and a size cap below the repairer's body limit: an item that runs late is cut off
//! and says so, a tool that is not installed is left out, and the bundle always comes back. Binary
//! output too large to send (a compressed bug report) stays on the node, under `dir`, and the item
//! names its path; the newest `keep` bundles' files are kept there.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use fleetmend_proto::{EvidenceBundle, EvidenceItem, NodeCommand};
use serde::Deserialize;
use tokio::time::Instant;

use crate::checks::kernel_log::LogReader;
use crate::config::{ConfigProblems, HostPaths};
use crate::runner::{AgentState, unix_millis};

/// Records read from the kernel log between looks at the deadline.
const KMSG_BATCH: usize = 4096;

/// Gathering evidence (`[commands.evidence]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvidenceConfig {
    /// Whether `evidence` commands are carried out; off, they are answered at once without a
    /// bundle (the repair goes on).
    pub enabled: bool,
    /// Longest the agent spends on a bundle when the repairer names no budget (and the most it
    /// spends when the repairer names a longer one).
    #[serde(with = "humantime_serde")]
    pub max_time: Duration,
    /// Bytes of the kernel log kept: its newest records.
    pub kernel_log_bytes: usize,
    /// Bytes of each command's output kept.
    pub output_bytes: usize,
    /// Bytes of the whole bundle's content; must stay below the repairer's `max_body_bytes`
    /// (1 MiB by default) with room for the rest of the report.
    pub bundle_bytes: usize,
    /// Where a command's output file that is too large to send is kept.
    pub dir: PathBuf,
    /// How many bundles' kept files `dir` holds; older ones are removed.
    pub keep: usize,
    /// The tools run for a bundle, side by side; one whose program is not installed is left out.
    pub commands: Vec<EvidenceCommand>,
}

/// One tool whose output goes into the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceCommand {
    /// Names the item.
    pub name: String,
    /// The program and its arguments, no shell. It runs in a directory of its own for this bundle.
    pub argv: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// A file the program writes in its directory, kept instead of its standard output (base64,
    /// or left on the node when larger than `output_bytes`).
    #[serde(default)]
    pub output_file: Option<String>,
}

impl Default for EvidenceConfig {
    fn default() -> Self {
        EvidenceConfig {
            enabled: true,
            max_time: Duration::from_secs(80),
            kernel_log_bytes: 256 * 1024,
            output_bytes: 192 * 1024,
            bundle_bytes: 640 * 1024,
            dir: PathBuf::from("/var/lib/fleetmend/evidence"),
            keep: 8,
            commands: vec![
                EvidenceCommand {
                    name: "nvidia-smi".to_owned(),
                    argv: vec!["nvidia-smi".to_owned(), "-q".to_owned()],
                    timeout: Duration::from_secs(30),
                    output_file: None,
                },
                // Safe mode: no calls that may hang on a GPU that fell off the bus.
                EvidenceCommand {
                    name: "nvidia-bug-report".to_owned(),
                    argv: [
                        "nvidia-bug-report.sh",
                        "--safe-mode",
                        "--output-file",
                        "bug-report.log",
                    ]
                    .map(str::to_owned)
                    .to_vec(),
                    timeout: Duration::from_secs(75),
                    output_file: Some("bug-report.log.gz".to_owned()),
                },
            ],
        }
    }
}

impl EvidenceConfig {
    /// Adds every problem of this section, naming `section` (`commands.evidence`).
    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        if self.max_time.is_zero() {
            problems.push(format!("{section}.max_time"), "must be greater than zero");
        }
        for (field, value) in [
            ("kernel_log_bytes", self.kernel_log_bytes),
            ("output_bytes", self.output_bytes),
            ("bundle_bytes", self.bundle_bytes),
        ] {
            if value < 1024 {
                problems.push(format!("{section}.{field}"), "must be at least 1024");
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, command) in self.commands.iter().enumerate() {
            let at = format!("{section}.commands[{i}]");
            if command.name.trim().is_empty() {
                problems.push(format!("{at}.name"), "must not be empty");
            } else if !names.insert(command.name.as_str()) {
                problems.push(
                    format!("{at}.name"),
                    format!("{:?} names another command", command.name),
                );
            }
            if command.argv.first().is_none_or(String::is_empty) {
                problems.push(format!("{at}.argv"), "must name a program to run");
            }
            if command.timeout.is_zero() {
                problems.push(format!("{at}.timeout"), "must be greater than zero");
            }
            if command.output_file.as_deref().is_some_and(|f| f.is_empty() || f.contains('/')) {
                problems.push(format!("{at}.output_file"), "must be a plain file name");
            }
        }
    }
}

/// Gathers bundles for `evidence` commands.
#[derive(Debug)]
pub struct Evidence {
    config: EvidenceConfig,
    paths: Arc<HostPaths>,
    state: Arc<AgentState>,
}

impl Evidence {
    pub fn new(config: EvidenceConfig, paths: Arc<HostPaths>, state: Arc<AgentState>) -> Evidence {
        Evidence { config, paths, state }
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The time this bundle may take: the repairer's `budget_ms`, at most `max_time`.
    pub fn budget(&self, command: &NodeCommand) -> Duration {
        command
            .args
            .get("budget_ms")
            .and_then(serde_json::Value::as_u64)
            .map_or(self.config.max_time, |ms| Duration::from_millis(ms).min(self.config.max_time))
    }

    /// Gathers one bundle within `budget`; every item is gathered side by side.
    pub async fn gather(&self, command_id: &str, budget: Duration) -> EvidenceBundle {
        let started = Instant::now();
        let deadline = started + budget;
        let kmsg = self.paths.kmsg.clone();
        let log_cap = self.config.kernel_log_bytes;
        let kernel_log = tokio::task::spawn_blocking(move || kernel_log(&kmsg, log_cap, deadline));
        let dir = self.bundle_dir(command_id);
        let mut tools = tokio::task::JoinSet::new();
        for (index, command) in self.config.commands.iter().enumerate() {
            if !installed(&command.argv[0]) {
                tracing::debug!(tool = %command.name, "not installed: left out of the evidence");
                continue;
            }
            let (command, dir, cap) = (command.clone(), dir.clone(), self.config.output_bytes);
            tools.spawn(async move { (index, run_tool(&command, &dir, cap, deadline).await) });
        }
        let mut items = vec![self.health_item()];
        let mut ran: Vec<(usize, EvidenceItem)> = Vec::new();
        while let Some(joined) = tools.join_next().await {
            if let Ok(item) = joined {
                ran.push(item);
            }
        }
        match kernel_log.await {
            Ok(item) => items.insert(0, item),
            Err(err) => tracing::warn!(error = %err, "reading the kernel log for evidence failed"),
        }
        ran.sort_by_key(|(index, _)| *index);
        items.extend(ran.into_iter().map(|(_, item)| item));
        fit(&mut items, self.config.bundle_bytes);
        self.prune();
        let identity = &self.state.identity;
        EvidenceBundle {
            node: identity.node.clone(),
            boot_id: identity.boot_id.clone(),
            collected_at_ms: unix_millis(SystemTime::now()),
            took_ms: started.elapsed().as_millis() as u64,
            items,
        }
    }

    /// The agent's view now: verdict, check runs and findings, as `/v1/health` shows it.
    fn health_item(&self) -> EvidenceItem {
        let started = std::time::Instant::now();
        let health = self.state.health();
        let content = serde_json::to_string_pretty(&health).unwrap_or_default();
        let source = "the agent's latest check results (/v1/health)";
        EvidenceItem {
            took_ms: started.elapsed().as_millis() as u64,
            ..EvidenceItem::text("findings", source, content)
        }
    }

    fn bundle_dir(&self, command_id: &str) -> PathBuf {
        let safe: String = command_id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
            .take(96)
            .collect();
        self.config.dir.join(safe)
    }

    /// Keeps the newest `keep` bundle directories.
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.config.dir) else {
            return;
        };
        let mut dirs: Vec<(SystemTime, PathBuf)> = entries
            .flatten()
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .filter(|(_, path)| path.is_dir())
            .collect();
        dirs.sort();
        let excess = dirs.len().saturating_sub(self.config.keep);
        for (_, path) in dirs.into_iter().take(excess) {
            if let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::warn!(path = %path.display(), error = %err, "removing old evidence failed");
            }
        }
    }
}

/// Whether `program` can be run: a path that exists, or a name found on `PATH`.
fn installed(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// The newest records of the kernel log at `path` (the whole current boot of `/dev/kmsg`), at
/// most `cap` bytes, read until `deadline`.
fn kernel_log(path: &Path, cap: usize, deadline: Instant) -> EvidenceItem {
    let started = std::time::Instant::now();
    let mut lines = std::collections::VecDeque::new();
    let (mut kept, mut total) = (0usize, 0u64);
    let mut reader = LogReader::new(path, false);
    let mut error = None;
    loop {
        let mut on_record = |record: crate::checks::kernel_log::Record| {
            let line = match record.usec() {
                Some(usec) => {
                    format!("[{:>5}.{:06}] {}\n", usec / 1_000_000, usec % 1_000_000, record.text)
                }
                None => format!("{}\n", record.text),
            };
            total += line.len() as u64;
            kept += line.len();
            lines.push_back(line);
            while kept > cap {
                let Some(oldest) = lines.pop_front() else { break };
                kept -= oldest.len();
            }
        };
        match reader.read_available(KMSG_BATCH, true, &mut on_record) {
            Ok(progress) if !progress.more => break,
            Ok(_) if Instant::now() >= deadline => {
                error = Some(
                    "the evidence budget ran out while reading: the newest records may be missing"
                        .to_owned(),
                );
                break;
            }
            Ok(_) => {}
            Err(err) => {
                error = Some(err.to_string());
                break;
            }
        }
    }
    let content: String = lines.into_iter().collect();
    EvidenceItem {
        name: "kernel-log".to_owned(),
        source: path.display().to_string(),
        encoding: "text".to_owned(),
        truncated: (content.len() as u64) < total,
        bytes: total,
        content,
        took_ms: started.elapsed().as_millis() as u64,
        error,
    }
}

/// Runs one tool in `dir` until its timeout or the bundle's deadline; its output (or output
/// file), at most `cap` bytes.
async fn run_tool(
    command: &EvidenceCommand,
    dir: &Path,
    cap: usize,
    deadline: Instant,
) -> EvidenceItem {
    let started = Instant::now();
    let mut item = EvidenceItem {
        name: command.name.clone(),
        source: command.argv.join(" "),
        encoding: "text".to_owned(),
        content: String::new(),
        bytes: 0,
        truncated: false,
        took_ms: 0,
        error: None,
    };
    if let Err(err) = std::fs::create_dir_all(dir) {
        item.error = Some(format!("creating {}: {err}", dir.display()));
        return item;
    }
    let timeout = command.timeout.min(deadline.saturating_duration_since(started));
    let mut process = tokio::process::Command::new(&command.argv[0]);
    process.args(&command.argv[1..]).current_dir(dir);
    let options =
        fleetmend_process::Options { tail_bytes: cap, ..fleetmend_process::Options::new(timeout) };
    let output = match fleetmend_process::run(process, &options).await {
        Ok(output) => {
            if !output.status.success() {
                item.error = Some(format!("exited with {}", output.status));
            }
            output.stdout
        }
        Err(fleetmend_process::RunError::TimedOut { stdout, after, .. }) => {
            item.error =
                Some(format!("ran longer than {after:?} and was killed: its output so far"));
            stdout
        }
        Err(err) => {
            item.error = Some(err.to_string());
            fleetmend_process::Tail::default()
        }
    };
    match &command.output_file {
        None => {
            item.content = output.text();
            item.bytes = output.bytes().len() as u64;
            item.truncated = output.is_truncated();
        }
        Some(file) => keep_file(&mut item, &dir.join(file), cap),
    }
    item.took_ms = started.elapsed().as_millis() as u64;
    item
}

/// A tool's output file: sent (base64) when within `cap`, else left on the node and named.
fn keep_file(item: &mut EvidenceItem, path: &Path, cap: usize) {
    item.source = format!("{} → {}", item.source, path.display());
    match std::fs::read(path) {
        Ok(bytes) if base64_len(bytes.len()) <= cap => {
            item.bytes = bytes.len() as u64;
            item.encoding = "base64".to_owned();
            item.content = base64::engine::general_purpose::STANDARD.encode(&bytes);
        }
        Ok(bytes) => {
            item.bytes = bytes.len() as u64;
            item.truncated = true;
            let note = format!(
                "{} bytes, over the cap: kept on the node at {}",
                bytes.len(),
                path.display()
            );
            item.error = Some(item.error.take().map_or(note.clone(), |e| format!("{e}; {note}")));
        }
        Err(err) => {
            let note = format!("no output file {}: {err}", path.display());
            item.error = Some(item.error.take().map_or(note.clone(), |e| format!("{e}; {note}")));
        }
    }
}

fn base64_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

/// Cuts the largest items (keeping their newest part) until the bundle's content is within `cap`.
fn fit(items: &mut [EvidenceItem], cap: usize) {
    loop {
        let total: usize = items.iter().map(|i| i.content.len()).sum();
        if total <= cap {
            return;
        }
        let Some(largest) = items.iter_mut().max_by_key(|i| i.content.len()) else {
            return;
        };
        let keep = largest.content.len().saturating_sub(total - cap);
        if largest.encoding == "base64" || keep == 0 {
            largest.content.clear();
            largest
                .error
                .get_or_insert_with(|| "left out: the bundle was over its size cap".to_owned());
        } else {
            let mut from = largest.content.len() - keep;
            while !largest.content.is_char_boundary(from) {
                from += 1;
            }
            largest.content.drain(..from);
        }
        largest.truncated = true;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn item(name: &str, content: &str) -> EvidenceItem {
        EvidenceItem::text(name, "", content.to_owned())
    }

    #[test]
    fn an_oversized_bundle_loses_the_oldest_part_of_its_largest_items() {
        let mut items = vec![item("kernel-log", &"old\n".repeat(100)), item("findings", "{}")];
        items[0].content.push_str("newest\n");
        fit(&mut items, 50);
        let total: usize = items.iter().map(|i| i.content.len()).sum();
        assert!(total <= 50, "{total}");
        assert!(items[0].truncated && items[0].content.ends_with("newest\n"));
        assert_eq!(items[1].content, "{}");
    }

    #[test]
    fn the_kernel_log_keeps_its_newest_records_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("kmsg");
        let mut text = String::new();
        for i in 0..200 {
            text.push_str(&format!("6,{i},{},-;line {i}\n", i * 1000));
        }
        std::fs::write(&log, text).unwrap();
        let item = kernel_log(&log, 300, Instant::now() + Duration::from_secs(5));
        assert!(item.truncated && item.content.len() <= 300, "{}", item.content.len());
        assert!(item.content.ends_with("line 199\n"), "{}", item.content);
        assert!(item.content.contains("[    0.199000] line 199"), "{}", item.content);
        assert_eq!(item.error, None);
    }

    #[test]
    fn a_missing_log_is_an_item_saying_why() {
        let item = kernel_log(Path::new("/nonexistent/kmsg"), 300, Instant::now());
        assert!(item.content.is_empty());
        assert!(item.error.is_some_and(|e| e.contains("/nonexistent/kmsg")));
    }
}
