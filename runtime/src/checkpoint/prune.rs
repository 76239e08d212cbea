//! Retention: removing the checkpoints past the newest `keep` valid ones.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;
use tracing::{debug, info, warn};

use super::*;

/// [`prune`] failed.
#[derive(Debug, Error)]
pub enum PruneCheckpointsError {
    /// Listing the checkpoint directory failed.
    #[error(transparent)]
    List(#[from] ListCheckpointsError),
    /// Removing an old checkpoint failed.
    #[error("cannot remove old checkpoint {path}: {source}")]
    Remove {
        /// The checkpoint directory that stays.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// What [`prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneOutcome {
    /// The valid checkpoints kept, newest first.
    pub kept: Vec<PathBuf>,
    /// The checkpoints removed (valid or not), newest first.
    pub removed: Vec<PathBuf>,
    /// Checkpoints neither kept nor removed because they are not older than the oldest kept one
    /// (invalid ones newer than it, a second directory of a kept step), or because no checkpoint
    /// is valid.
    pub left_alone: Vec<PathBuf>,
    /// Stale temporary directories removed.
    pub removed_temp_dirs: Vec<PathBuf>,
}

/// Keeps the newest `keep_last` valid checkpoints in `checkpoint_dir` (at least one: `0` counts
/// as `1`, so the newest valid checkpoint is never removed) and removes every checkpoint older
/// than the oldest kept one, valid or not. Invalid checkpoints newer than that stay (they are not
/// known to be older), and nothing is removed when no checkpoint is valid. Temporary directories
/// older than the newest valid checkpoint are removed too (left by interrupted writes).
///
/// Verifies (reads) checkpoints from the newest until `keep_last` valid ones are found.
pub fn prune(
    checkpoint_dir: impl AsRef<Path>,
    keep_last: usize,
) -> Result<PruneOutcome, PruneCheckpointsError> {
    let checkpoint_dir = checkpoint_dir.as_ref();
    let keep_last = keep_last.max(1);
    let dirs = step_dirs(checkpoint_dir)?;
    let mut outcome = PruneOutcome::default();
    let mut kept_steps = Vec::new();
    let mut others = Vec::new();
    for dir in dirs {
        if kept_steps.len() < keep_last {
            match verify(&dir.path) {
                Ok(valid) => {
                    kept_steps.push(valid.step);
                    outcome.kept.push(valid.path);
                    continue;
                }
                Err(reason) => {
                    debug!(
                        checkpoint = %dir.path.display(),
                        %reason,
                        "invalid checkpoint seen while pruning"
                    );
                }
            }
        }
        others.push(dir);
    }
    let Some(&oldest_kept_step) = kept_steps.last() else {
        outcome.left_alone = others.into_iter().map(|d| d.path).collect();
        return Ok(outcome);
    };
    for dir in others {
        // Not older: an invalid one newer than a kept one, or a second directory of a kept step
        // (`step-12` beside `step-00000012`).
        if dir.step >= oldest_kept_step {
            outcome.left_alone.push(dir.path);
            continue;
        }
        remove_checkpoint(checkpoint_dir, &dir)?;
        outcome.removed.push(dir.path);
    }
    if let Some(newest) = outcome.kept.first() {
        match fs::metadata(newest.join(MANIFEST_FILE)).and_then(|m| m.modified()) {
            Ok(committed) => {
                outcome.removed_temp_dirs = remove_stale_temp_dirs(checkpoint_dir, committed, None);
            }
            Err(e) => {
                warn!(
                    checkpoint = %newest.display(),
                    error = %e,
                    "cannot read the manifest's mtime; not removing stale temporary directories"
                );
            }
        }
    }
    Ok(outcome)
}

/// Removes a checkpoint by first renaming it to a temporary name, so that a crash half way through
/// never leaves a partial `step-*` directory.
fn remove_checkpoint(checkpoint_dir: &Path, dir: &StepDir) -> Result<(), PruneCheckpointsError> {
    let aside = checkpoint_dir.join(temp_dir_name(dir.step, "-pruned"));
    fs::rename(&dir.path, &aside)
        .map_err(|source| PruneCheckpointsError::Remove { path: dir.path.clone(), source })?;
    if let Err(e) = fs::remove_dir_all(&aside) {
        warn!(
            dir = %aside.display(),
            error = %e,
            "cannot remove a pruned checkpoint; the next writer will"
        );
    }
    info!(checkpoint = %dir.path.display(), "old checkpoint pruned");
    Ok(())
}
