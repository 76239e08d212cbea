//! The node inventory: which nodes exist. Without one, every node that reports is in the fleet;
//! with one (`[inventory]`), a report from a node outside it is refused, or admitted as `unknown`
//! (shown, alerted once, never counted by a guard rail, never in service discovery, never
//! drained, rebooted or replaced). One credential shared by every agent can then no longer grow
//! the fleet with invented names, and so loosen the share-of-the-fleet guard rails.
//!
//! The inventory is the union of its sources: names and hostlist patterns in the config
//! ([`hostlist`]), a file of them (read again when it changes), and Slurm's own node list
//! ([`slurm`], read again every `slurm_refresh`; a read that fails keeps the list before, and the
//! last list read is kept in the store for a restart while Slurm is down).

pub mod hostlist;
pub mod slurm;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::clock::SharedClock;
use crate::ports::EventLog;
use crate::scheduler::slurm::SlurmConfig;
use crate::store::StoreError;
pub use hostlist::HostlistError;

/// The store setting that keeps the last node list read from Slurm.
const SLURM_LIST_KEY: &str = "inventory.slurm";

/// What a report from a node outside the inventory gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownNodes {
    /// A 403 naming the node; nothing is stored or changed.
    #[default]
    Refuse,
    /// Held as `unknown`: shown and alerted once, never counted or acted on.
    Admit,
}

/// `[inventory]`: which nodes exist. Absent: every node that reports is in the fleet.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InventoryConfig {
    /// Node names and Slurm hostlist patterns: `["gpu-[001-128]", "gpu-[200-204,210],cpu[1-3]"]`.
    pub nodes: Vec<String>,
    /// A file of names and patterns, one a line (`#` starts a comment), read again when it
    /// changes (looked at every `file_recheck`); one that stops reading well keeps the list before.
    pub file: Option<PathBuf>,
    /// How often `file` is looked at for a change.
    #[serde(with = "humantime_serde")]
    pub file_recheck: Duration,
    /// Slurm's own node list (`scontrol -o show nodes`, with the `[slurm]` settings); needs
    /// `scheduler = "slurm"`.
    pub slurm: bool,
    /// How often Slurm's list is read again.
    #[serde(with = "humantime_serde")]
    pub slurm_refresh: Duration,
    /// Longest one read of Slurm's list may take; it is not retried before the next refresh.
    #[serde(with = "humantime_serde")]
    pub slurm_timeout: Duration,
    /// A report from a node outside the inventory: `refuse` (403) or `admit` (as unknown).
    pub unknown_nodes: UnknownNodes,
    /// Most nodes held as unknown (`admit`); a report from one more is refused.
    pub max_unknown: u32,
}

impl Default for InventoryConfig {
    fn default() -> Self {
        InventoryConfig {
            nodes: Vec::new(),
            file: None,
            file_recheck: Duration::from_secs(5),
            slurm: false,
            slurm_refresh: Duration::from_secs(60),
            slurm_timeout: Duration::from_secs(10),
            unknown_nodes: UnknownNodes::Refuse,
            max_unknown: 10_000,
        }
    }
}

impl InventoryConfig {
    /// Every problem, each naming its field under `prefix`. `slurm_scheduler`: whether the
    /// repairer drives Slurm (the Slurm source needs it).
    pub fn problems(&self, prefix: &str, slurm_scheduler: bool) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: &str, message: String| {
            problems.push((format!("{prefix}.{field}"), message));
        };
        if self.nodes.is_empty() && self.file.is_none() && !self.slurm {
            push("nodes", "name at least one source of the inventory: nodes, file or slurm".into());
        }
        for (i, list) in self.nodes.iter().enumerate() {
            if let Err(err) = hostlist::expand(list) {
                push(&format!("nodes[{i}]"), err.to_string());
            }
        }
        if self.slurm && !slurm_scheduler {
            push("slurm", "Slurm's node list needs scheduler = \"slurm\" (and [slurm])".into());
        }
        for (field, value) in [
            ("file_recheck", self.file_recheck),
            ("slurm_refresh", self.slurm_refresh),
            ("slurm_timeout", self.slurm_timeout),
        ] {
            if value.is_zero() {
                push(field, "must be greater than zero".into());
            }
        }
        if self.unknown_nodes == UnknownNodes::Admit && self.max_unknown == 0 {
            push("max_unknown", "must be at least 1 with unknown_nodes = \"admit\"".into());
        }
        problems
    }
}

/// The inventory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("inventory.nodes[{index}]: {source}")]
    List { index: usize, source: HostlistError },
    #[error("reading the inventory file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("inventory file {path}, line {line}: {source}")]
    ParseFile { path: PathBuf, line: usize, source: HostlistError },
    #[error("reading Slurm's node list: {0}")]
    Slurm(String),
    #[error(
        "no node list from Slurm ({error}) and none kept from an earlier run: the repairer does not start with an empty inventory"
    )]
    NoSlurmList { error: String },
    #[error("keeping Slurm's node list: {0}")]
    Store(#[from] StoreError),
}

/// Where a node stands against the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// In the fleet: counted and acted on.
    Inventoried,
    /// Outside the inventory, and reports from such nodes are admitted as unknown.
    Unknown,
    /// Outside the inventory, and reports from such nodes are refused.
    Refused,
}

/// Reads of a source, by source and outcome (`fleetmend_inventory_refreshes_total`).
pub const SOURCES: [&str; 2] = ["file", "slurm"];
pub const OUTCOMES: [&str; 2] = ["ok", "error"];

/// What `/metrics` shows of the inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryFigures {
    /// Names in the inventory.
    pub nodes: u64,
    /// Reads of the file and of Slurm's list: (source, outcome, count), every pair of the
    /// configured sources, zeros included.
    pub refreshes: Vec<(&'static str, &'static str, u64)>,
}

/// The file source: its path, the modification time read and its names.
#[derive(Debug)]
struct FileSource {
    path: PathBuf,
    modified: Option<SystemTime>,
    names: HashSet<String>,
}

/// The inventory at run time.
#[derive(Debug)]
pub struct Inventory {
    config: InventoryConfig,
    listed: HashSet<String>,
    file: Mutex<Option<FileSource>>,
    slurm: Option<(slurm::SlurmNodeList, Mutex<HashSet<String>>)>,
    /// The union of the sources.
    names: RwLock<Arc<HashSet<String>>>,
    refreshes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    events: Arc<EventLog>,
}

impl Inventory {
    /// Reads every source once. A file that cannot be read is an error; Slurm's list that cannot
    /// be read is taken from the store (the last one read), and is an error only when there is
    /// none there either.
    pub async fn load(
        config: &InventoryConfig,
        slurm: &SlurmConfig,
        events: Arc<EventLog>,
    ) -> Result<Arc<Inventory>, InventoryError> {
        let mut listed = HashSet::new();
        for (index, list) in config.nodes.iter().enumerate() {
            let names =
                hostlist::expand(list).map_err(|source| InventoryError::List { index, source })?;
            listed.extend(names);
        }
        let file = match &config.file {
            Some(path) => {
                let (modified, names) = read_file(path)?;
                Some(FileSource { path: path.clone(), modified, names })
            }
            None => None,
        };
        let mut refreshes = BTreeMap::new();
        for (source, used) in [("file", file.is_some()), ("slurm", config.slurm)] {
            for outcome in OUTCOMES.into_iter().filter(|_| used) {
                refreshes.insert((source, outcome), 0);
            }
        }
        let slurm = if config.slurm {
            let list = slurm::SlurmNodeList::new(slurm, config.slurm_timeout);
            let names = first_slurm_list(&list, &events, &mut refreshes).await?;
            Some((list, Mutex::new(names)))
        } else {
            None
        };
        let inventory = Inventory {
            config: config.clone(),
            listed,
            file: Mutex::new(file),
            slurm,
            names: RwLock::default(),
            refreshes: Mutex::new(refreshes),
            events,
        };
        inventory.rebuild();
        Ok(Arc::new(inventory))
    }

    /// Whether `name` is in the inventory.
    pub fn contains(&self, name: &str) -> bool {
        self.current().contains(name)
    }

    /// Where `name` stands: in the fleet, or outside it and admitted or refused (by the config).
    pub fn membership(&self, name: &str) -> Membership {
        if self.contains(name) {
            Membership::Inventoried
        } else if self.config.unknown_nodes == UnknownNodes::Admit {
            Membership::Unknown
        } else {
            Membership::Refused
        }
    }

    /// Most nodes held as unknown.
    pub fn max_unknown(&self) -> u32 {
        self.config.max_unknown
    }

    /// How many names the inventory holds.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn current(&self) -> Arc<HashSet<String>> {
        self.names.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// What `/metrics` shows.
    pub fn figures(&self) -> InventoryFigures {
        let refreshes = self.refreshes.lock().unwrap_or_else(PoisonError::into_inner);
        InventoryFigures {
            nodes: self.len() as u64,
            refreshes: refreshes.iter().map(|((s, o), n)| (*s, *o, *n)).collect(),
        }
    }

    fn count(&self, source: &'static str, outcome: &'static str) {
        let mut refreshes = self.refreshes.lock().unwrap_or_else(PoisonError::into_inner);
        *refreshes.entry((source, outcome)).or_default() += 1;
    }

    /// The union of the sources, made again; true when it changed.
    fn rebuild(&self) -> bool {
        let mut names = self.listed.clone();
        if let Some(file) = &*self.file.lock().unwrap_or_else(PoisonError::into_inner) {
            names.extend(file.names.iter().cloned());
        }
        if let Some((_, slurm)) = &self.slurm {
            names.extend(slurm.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned());
        }
        let mut current = self.names.write().unwrap_or_else(PoisonError::into_inner);
        let changed = **current != names;
        *current = Arc::new(names);
        changed
    }

    /// Reads the file again if its modification time moved; true when the inventory changed. A
    /// file that cannot be read or parsed keeps the names read before (and is counted).
    pub fn reread_file(&self) -> Result<bool, InventoryError> {
        let result = {
            let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(file) = file.as_mut() else { return Ok(false) };
            let modified = std::fs::metadata(&file.path).and_then(|m| m.modified()).ok();
            if modified == file.modified {
                return Ok(false);
            }
            // Not tried again until the file changes once more.
            file.modified = modified;
            read_file(&file.path).map(|(_, names)| file.names = names)
        };
        match result {
            Ok(()) => {
                self.count("file", "ok");
                Ok(self.rebuild())
            }
            Err(err) => {
                self.count("file", "error");
                Err(err)
            }
        }
    }

    /// Reads Slurm's list again; true when the inventory changed. A read that fails keeps the
    /// list before (and is counted).
    pub async fn refresh_slurm(&self) -> Result<bool, InventoryError> {
        let Some((list, current)) = &self.slurm else { return Ok(false) };
        match list.read().await {
            Ok(names) => {
                self.count("slurm", "ok");
                let names: HashSet<String> = names.into_iter().collect();
                let moved = *current.lock().unwrap_or_else(PoisonError::into_inner) != names;
                if moved {
                    keep_slurm_list(&self.events, &names)?;
                    *current.lock().unwrap_or_else(PoisonError::into_inner) = names;
                }
                Ok(moved && self.rebuild())
            }
            Err(err) => {
                self.count("slurm", "error");
                Err(InventoryError::Slurm(err))
            }
        }
    }

    /// Keeps the inventory current until the task is dropped: the file looked at every
    /// `file_recheck`, Slurm's list read every `slurm_refresh`; `changed` runs after each change.
    pub async fn watch(self: Arc<Self>, clock: SharedClock, changed: impl Fn() + Send + 'static) {
        let has_file = self.file.lock().unwrap_or_else(PoisonError::into_inner).is_some();
        let file_every = self.config.file_recheck;
        let slurm_every = self.config.slurm_refresh;
        let mut next_file = clock.now_ms() + file_every.as_millis() as u64;
        let mut next_slurm = clock.now_ms() + slurm_every.as_millis() as u64;
        loop {
            let next = match (has_file, self.slurm.is_some()) {
                (true, true) => next_file.min(next_slurm),
                (true, false) => next_file,
                (false, true) => next_slurm,
                (false, false) => return,
            };
            let now = clock.now_ms();
            clock.sleep(Duration::from_millis(next.saturating_sub(now))).await;
            let now = clock.now_ms();
            let mut moved = false;
            if has_file && now >= next_file {
                next_file = now + file_every.as_millis() as u64;
                match self.reread_file() {
                    Ok(changed) => moved |= changed,
                    Err(err) => {
                        tracing::error!(error = %err, "the inventory file was not read again: the names read before stay")
                    }
                }
            }
            if self.slurm.is_some() && now >= next_slurm {
                next_slurm = now + slurm_every.as_millis() as u64;
                match self.refresh_slurm().await {
                    Ok(changed) => moved |= changed,
                    Err(err) => {
                        tracing::error!(error = %err, "Slurm's node list was not read again: the list read before stays")
                    }
                }
            }
            if moved {
                tracing::info!(nodes = self.len(), "the inventory changed");
                changed();
            }
        }
    }
}

/// Slurm's list at start: read now, else the one kept in the store.
async fn first_slurm_list(
    list: &slurm::SlurmNodeList,
    events: &EventLog,
    refreshes: &mut BTreeMap<(&'static str, &'static str), u64>,
) -> Result<HashSet<String>, InventoryError> {
    match list.read().await {
        Ok(names) => {
            *refreshes.entry(("slurm", "ok")).or_default() += 1;
            let names: HashSet<String> = names.into_iter().collect();
            keep_slurm_list(events, &names)?;
            Ok(names)
        }
        Err(error) => {
            *refreshes.entry(("slurm", "error")).or_default() += 1;
            let kept: Option<Vec<String>> = events.store().setting(SLURM_LIST_KEY)?;
            let kept = kept.ok_or(InventoryError::NoSlurmList { error: error.clone() })?;
            tracing::error!(%error, nodes = kept.len(), "Slurm's node list could not be read: the one kept from the last run is used");
            Ok(kept.into_iter().collect())
        }
    }
}

fn keep_slurm_list(events: &EventLog, names: &HashSet<String>) -> Result<(), StoreError> {
    let sorted: BTreeSet<&String> = names.iter().collect();
    let store = events.store();
    events.write("put_setting", store.put_setting(SLURM_LIST_KEY, &sorted))
}

/// Reads an inventory file: one name or hostlist pattern a line, `#` comments, blank lines.
fn read_file(path: &Path) -> Result<(Option<SystemTime>, HashSet<String>), InventoryError> {
    let read_err = |source| InventoryError::ReadFile { path: path.to_owned(), source };
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).map_err(read_err)?;
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    Ok((
        Some(modified),
        parse_file(&text).map_err(|(line, source)| InventoryError::ParseFile {
            path: path.to_owned(),
            line,
            source,
        })?,
    ))
}

/// The names of an inventory file's text; an error names the line (1-based).
pub fn parse_file(text: &str) -> Result<HashSet<String>, (usize, HostlistError)> {
    let mut names = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        names.extend(hostlist::expand(line).map_err(|err| (i + 1, err))?);
    }
    Ok(names)
}

#[cfg(test)]
mod tests;
