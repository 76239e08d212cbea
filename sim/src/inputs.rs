//! The operator's own inputs to `fleetmend simulate`: a real repairer config
//! (`--repairer-config`), the fleet's inventory (`--inventory`) and a failure history exported
//! from a running repairer (`--replay`), laid into the settings.
//!
//! Precedence, lowest first: the simulator's repairer defaults; the repairer config's `[policy]`,
//! `[engine]` and `[queue]` (read and checked as `fleetmend repairer` reads it, every problem
//! named; the simulator's world-bound choices kept, [`RepairerSettings::from_repairer`]); the
//! settings file (`--config`, its `[repairer.*]` tables laid over key by key); the inventory's
//! size as `fleet.nodes`; the flags and `--set`. A replay then grows the fleet to the history's
//! nodes where it is smaller, and, unless `fleet.duration` was set, lasts from its first fault
//! to the end of its window (and an hour for the repairs then under way).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleetmend_repairer::config::{RepairerConfig, RepairerConfigError};
use fleetmend_repairer::history::{FaultHistory, HistoryFileError};
use fleetmend_repairer::inventory::{HostlistError, parse_file};

use crate::config::{RepairerSettings, SimConfig, SimConfigError};
use crate::recorded::{Replay, ReplayBasis, ReplayError};

/// The files the operator gave.
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnInputs<'a> {
    pub repairer_config: Option<&'a Path>,
    pub inventory: Option<&'a Path>,
    pub replay: Option<&'a Path>,
}

/// An input that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("--repairer-config: {0}")]
    RepairerConfig(#[from] RepairerConfigError),
    #[error("--inventory: reading {path}: {source}")]
    InventoryRead { path: PathBuf, source: std::io::Error },
    #[error("--inventory: {path}, line {line}: {source}")]
    InventoryParse { path: PathBuf, line: usize, source: HostlistError },
    #[error("--inventory: {path} names no node")]
    InventoryEmpty { path: PathBuf },
    #[error("--replay: reading {path}: {source}")]
    HistoryRead { path: PathBuf, source: std::io::Error },
    #[error("--replay: {path}: {source}")]
    History { path: PathBuf, source: HistoryFileError },
    #[error("--replay: {path}: {source}")]
    Replay { path: PathBuf, source: ReplayError },
    #[error(
        "--replay: the settings script faults too ([[event]]): a replay strikes the history's faults alone"
    )]
    ReplayWithEvents,
    #[error(transparent)]
    Settings(#[from] SimConfigError),
}

/// The settings of `fleetmend simulate`: `config` (a settings file) with `inputs` laid in and
/// `overrides` (the flags, then `--set`) set, in the module's order of precedence.
pub fn load(
    config: Option<&Path>,
    inputs: OwnInputs<'_>,
    overrides: &[(String, String)],
) -> Result<SimConfig, InputError> {
    let repairer = match inputs.repairer_config {
        Some(path) => RepairerSettings::from_repairer(&RepairerConfig::load(path)?),
        None => RepairerSettings::default(),
    };
    let (document, origin) = SimConfig::read_document(config)?;
    let inventory = inputs.inventory.map(read_inventory).transpose()?;
    let mut all = Vec::new();
    if let Some(names) = &inventory {
        all.push(("fleet.nodes".to_owned(), names.len().to_string()));
    }
    all.extend(overrides.iter().cloned());
    let settle = |all: &[(String, String)]| {
        SimConfig::from_table_over(document.clone(), all, &origin, &repairer)
    };
    let settings = settle(&all)?;
    let Some(path) = inputs.replay else { return Ok(settings) };
    if !settings.events.is_empty() {
        return Err(InputError::ReplayWithEvents);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|source| InputError::HistoryRead { path: path.to_owned(), source })?;
    let history = FaultHistory::parse(&text)
        .map_err(|source| InputError::History { path: path.to_owned(), source })?;
    let recorded_nodes = match &inventory {
        Some(names) => names.len(),
        None => history.faults.iter().map(|f| f.node.as_str()).collect::<BTreeSet<_>>().len(),
    };
    let grown_from =
        (recorded_nodes > settings.fleet.nodes as usize).then_some(settings.fleet.nodes);
    if grown_from.is_some() {
        all.push(("fleet.nodes".to_owned(), recorded_nodes.to_string()));
    }
    let settings = if grown_from.is_some() { settle(&all)? } else { settings };
    let catalog = settings.catalog()?;
    let engine = &settings.repairer.engine;
    let basis = ReplayBasis {
        catalog: &catalog,
        unreachable_window: engine.report_interval.saturating_mul(engine.unreachable_after),
        fleet_nodes: settings.fleet.nodes,
    };
    let origin_name = path.display().to_string();
    let mut replay = Replay::new(&origin_name, history, inventory.as_ref(), basis)
        .map_err(|source| InputError::Replay { path: path.to_owned(), source })?;
    replay.grown_from = grown_from;
    let duration_set = document.get("fleet").and_then(|f| f.get("duration")).is_some()
        || all.iter().any(|(key, _)| key == "fleet.duration");
    let mut settings = if duration_set {
        settings
    } else {
        all.push(("fleet.duration".to_owned(), format!("{}ms", replay.duration().as_millis())));
        settle(&all)?
    };
    settings.replay = Some(Arc::new(replay));
    Ok(settings)
}

/// The inventory's names: the repairer's own parser (names and hostlist patterns, one a line,
/// `#` comments).
fn read_inventory(path: &Path) -> Result<BTreeSet<String>, InputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| InputError::InventoryRead { path: path.to_owned(), source })?;
    let names = parse_file(&text).map_err(|(line, source)| InputError::InventoryParse {
        path: path.to_owned(),
        line,
        source,
    })?;
    if names.is_empty() {
        return Err(InputError::InventoryEmpty { path: path.to_owned() });
    }
    Ok(names.into_iter().collect())
}

#[cfg(test)]
mod tests;
