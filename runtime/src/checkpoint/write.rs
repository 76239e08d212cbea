//! Writing a checkpoint: a temporary directory, every file hashed and fsynced as it is written,
//! the manifest last, then the rename into place ([`CheckpointWriter`]).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use thiserror::Error;
use tracing::{debug, info, warn};

use super::*;

/// [`CheckpointWriter::begin`] failed.
#[derive(Debug, Error)]
pub enum BeginCheckpointError {
    /// A checkpoint of a job with no ranks makes no sense.
    #[error("cannot begin checkpoint of step {step} in {path}: world size is 0")]
    ZeroWorldSize {
        /// The checkpoint directory.
        path: PathBuf,
        /// The step asked for.
        step: u64,
    },
    /// The job's checkpoint directory could not be created.
    #[error("cannot create checkpoint directory {path}: {source}")]
    CreateCheckpointDir {
        /// The checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The temporary directory the checkpoint is written in could not be created.
    #[error("cannot create temporary checkpoint directory {path}: {source}")]
    CreateTempDir {
        /// The temporary directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// [`CheckpointWriter::add_file`] or [`CheckpointWriter::write_file`] failed. The writer is
/// failed from then on: its commit refuses, so no checkpoint ever lacks a file meant for it.
#[derive(Debug, Error)]
pub enum AddCheckpointFileError {
    /// The name cannot be a checkpoint file name.
    #[error("cannot add {name:?} to checkpoint {path}: {reason}")]
    InvalidName {
        /// The temporary checkpoint directory.
        path: PathBuf,
        /// The name asked for.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A file of this name was added already.
    #[error("cannot add {name:?} to checkpoint {path}: it was added already")]
    Duplicate {
        /// The temporary checkpoint directory.
        path: PathBuf,
        /// The name asked for.
        name: String,
    },
    /// An earlier add failed, so this checkpoint will not be committed.
    #[error("cannot add {name:?} to checkpoint {path}: an earlier file failed ({earlier})")]
    EarlierFailure {
        /// The temporary checkpoint directory.
        path: PathBuf,
        /// The name asked for.
        name: String,
        /// The earlier error.
        earlier: String,
    },
    /// Creating or writing the file failed (including an error from the caller's writer).
    #[error("cannot write checkpoint file {path}: {source}")]
    Write {
        /// The file, inside the temporary checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file could not be flushed to disk.
    #[error("cannot fsync checkpoint file {path}: {source}")]
    Sync {
        /// The file, inside the temporary checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// [`CheckpointWriter::commit`] failed; no `step-*` directory was left behind.
#[derive(Debug, Error)]
pub enum CommitCheckpointError {
    /// An add failed earlier, so the checkpoint is incomplete.
    #[error("cannot commit checkpoint {path}: an earlier file failed ({earlier})")]
    EarlierFailure {
        /// The temporary checkpoint directory.
        path: PathBuf,
        /// The earlier error.
        earlier: String,
    },
    /// Writing or syncing `manifest.json` failed.
    #[error("cannot write checkpoint manifest {path}: {source}")]
    WriteManifest {
        /// The manifest, inside the temporary checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The temporary directory's entries could not be flushed to disk.
    #[error("cannot fsync temporary checkpoint directory {path}: {source}")]
    SyncTempDir {
        /// The temporary checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A valid checkpoint of this step exists already; it is left as it is.
    #[error("cannot commit checkpoint {path}: a valid checkpoint of this step exists already")]
    StepExists {
        /// The existing checkpoint directory.
        path: PathBuf,
    },
    /// An invalid checkpoint of this step was in the way and could not be moved aside.
    #[error("cannot move the invalid checkpoint {path} aside: {source}")]
    MoveAsideInvalid {
        /// The invalid checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The atomic rename into place failed.
    #[error("cannot rename checkpoint {from} to {to}: {source}")]
    Rename {
        /// The temporary checkpoint directory.
        from: PathBuf,
        /// The final checkpoint directory.
        to: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The rename could not be flushed to disk; the checkpoint was removed again, since a crash
    /// could lose it.
    #[error("cannot fsync checkpoint directory {path} after the rename: {source}")]
    SyncCheckpointDir {
        /// The job's checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// Writes one checkpoint: [`begin`](Self::begin), add files, [`commit`](Self::commit).
///
/// Until the commit everything lives in a temporary directory; dropping the writer without
/// committing, or any error, removes it.
#[derive(Debug)]
pub struct CheckpointWriter {
    checkpoint_dir: PathBuf,
    temp_path: PathBuf,
    step: u64,
    world_size: u32,
    job_id: String,
    files: Vec<ManifestFile>,
    /// The first add that failed: commit refuses, so a checkpoint never misses a file.
    failed: Option<String>,
    /// Whether the temporary directory is still ours to remove (false once renamed into place).
    owns_temp: bool,
}

impl CheckpointWriter {
    /// Starts the checkpoint of `step` in `checkpoint_dir` (created if missing), and removes
    /// temporary directories of earlier writers (older than this one's), which a crash left.
    pub fn begin(
        checkpoint_dir: impl AsRef<Path>,
        step: u64,
        world_size: u32,
        job_id: &str,
    ) -> Result<Self, BeginCheckpointError> {
        let checkpoint_dir = checkpoint_dir.as_ref().to_path_buf();
        if world_size == 0 {
            return Err(BeginCheckpointError::ZeroWorldSize { path: checkpoint_dir, step });
        }
        if !checkpoint_dir.is_dir() {
            fs::create_dir_all(&checkpoint_dir).map_err(|source| {
                BeginCheckpointError::CreateCheckpointDir { path: checkpoint_dir.clone(), source }
            })?;
            // The new directory's own entry must survive a crash too.
            if let Some(parent) = checkpoint_dir.parent().filter(|p| !p.as_os_str().is_empty())
                && let Err(e) = sync_dir(parent)
            {
                warn!(
                    dir = %parent.display(),
                    error = %e,
                    "cannot fsync the parent of a new checkpoint directory"
                );
            }
        }
        let temp_path = checkpoint_dir.join(temp_dir_name(step, ""));
        fs::create_dir(&temp_path).map_err(|source| BeginCheckpointError::CreateTempDir {
            path: temp_path.clone(),
            source,
        })?;
        // "Older than this writer" is judged by the filesystem's clock on both sides, which also
        // holds on network filesystems whose server clock differs from ours.
        match fs::metadata(&temp_path).and_then(|m| m.modified()) {
            Ok(started) => {
                remove_stale_temp_dirs(&checkpoint_dir, started, Some(&temp_path));
            }
            Err(e) => {
                warn!(
                    dir = %temp_path.display(),
                    error = %e,
                    "cannot read the mtime of a new temporary checkpoint directory; stale ones stay"
                );
            }
        }
        debug!(dir = %temp_path.display(), step, "checkpoint write begun");
        Ok(Self {
            checkpoint_dir,
            temp_path,
            step,
            world_size,
            job_id: job_id.to_owned(),
            files: Vec::new(),
            failed: None,
            owns_temp: true,
        })
    }

    /// The step this checkpoint is of.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The temporary directory the files are written in until the commit.
    pub fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    /// Adds the file `name` with contents `bytes`, fsynced.
    pub fn add_file(&mut self, name: &str, bytes: &[u8]) -> Result<(), AddCheckpointFileError> {
        self.write_file(name, |out| out.write_all(bytes))
    }

    /// Adds the file `name` with what `write` writes to it (streamed: the contents need not fit in
    /// memory), fsynced. An error from `write` fails the add, and the checkpoint.
    pub fn write_file<F>(&mut self, name: &str, write: F) -> Result<(), AddCheckpointFileError>
    where
        F: FnOnce(&mut dyn Write) -> io::Result<()>,
    {
        let result = self.write_file_inner(name, write);
        if let Err(e) = &result
            && self.failed.is_none()
        {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn write_file_inner<F>(&mut self, name: &str, write: F) -> Result<(), AddCheckpointFileError>
    where
        F: FnOnce(&mut dyn Write) -> io::Result<()>,
    {
        self.check_new_name(name, &[])?;
        let entry = write_new_file(&self.temp_path, name, write)?;
        self.files.push(entry);
        Ok(())
    }

    /// Adds several files at once, written side by side (up to one thread per core), each
    /// fsynced. One SHA-256 stream is about as fast as a disk: a checkpoint of several large files
    /// reaches the disk's rate only when they are hashed in parallel. Names are checked before
    /// anything is written; the first error (in the order given) is returned and fails the
    /// checkpoint.
    pub fn add_files(&mut self, files: &[(&str, &[u8])]) -> Result<(), AddCheckpointFileError> {
        let result = self.add_files_inner(files);
        if let Err(e) = &result
            && self.failed.is_none()
        {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn add_files_inner(&mut self, files: &[(&str, &[u8])]) -> Result<(), AddCheckpointFileError> {
        for (i, (name, _)) in files.iter().enumerate() {
            let earlier: Vec<&str> = files.iter().take(i).map(|(name, _)| *name).collect();
            self.check_new_name(name, &earlier)?;
        }
        let workers = thread::available_parallelism().map_or(1, |n| n.get()).min(files.len());
        let temp_path = self.temp_path.as_path();
        let write_one = |(name, bytes): &(&str, &[u8])| {
            write_new_file(temp_path, name, |out: &mut dyn Write| out.write_all(bytes))
        };
        let written: Vec<Result<ManifestFile, AddCheckpointFileError>> = if workers <= 1 {
            files.iter().map(write_one).collect()
        } else {
            let next = std::sync::atomic::AtomicUsize::new(0);
            let work = || {
                let mut done = Vec::new();
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(file) = files.get(index) else { return done };
                    done.push((index, write_one(file)));
                }
            };
            let mut done = thread::scope(|scope| {
                // This thread works too, so a failure to start helpers only makes it slower.
                let helpers: Vec<_> = (1..workers)
                    .filter_map(|_| {
                        thread::Builder::new()
                            .name("checkpoint-write".into())
                            .spawn_scoped(scope, work)
                            .ok()
                    })
                    .collect();
                let mut done = work();
                for helper in helpers {
                    done.extend(
                        helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    );
                }
                done
            });
            done.sort_by_key(|(index, _)| *index);
            done.into_iter().map(|(_, result)| result).collect()
        };
        for entry in written {
            self.files.push(entry?);
        }
        Ok(())
    }

    /// Whether `name` may be added now: no earlier failure, a valid name, not added already (nor
    /// among `also_taken`).
    fn check_new_name(
        &self,
        name: &str,
        also_taken: &[&str],
    ) -> Result<(), AddCheckpointFileError> {
        if let Some(earlier) = &self.failed {
            return Err(AddCheckpointFileError::EarlierFailure {
                path: self.temp_path.clone(),
                name: name.to_owned(),
                earlier: earlier.clone(),
            });
        }
        if let Some(reason) = file_name_problem(name) {
            return Err(AddCheckpointFileError::InvalidName {
                path: self.temp_path.clone(),
                name: name.to_owned(),
                reason,
            });
        }
        if self.files.iter().any(|f| f.name == name) || also_taken.contains(&name) {
            return Err(AddCheckpointFileError::Duplicate {
                path: self.temp_path.clone(),
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    /// Writes the manifest and renames the checkpoint into place; returns its final path
    /// (`<checkpoint_dir>/step-<N>`).
    ///
    /// An invalid checkpoint of the same step (corrupted, say) is replaced; a valid one is left as
    /// it is and [`CommitCheckpointError::StepExists`] returned.
    pub fn commit(mut self) -> Result<PathBuf, CommitCheckpointError> {
        // On error, dropping `self` removes the temporary directory.
        let final_path = self.commit_inner()?;
        info!(
            dir = %final_path.display(),
            step = self.step,
            files = self.files.len(),
            "checkpoint committed"
        );
        Ok(final_path)
    }

    fn commit_inner(&mut self) -> Result<PathBuf, CommitCheckpointError> {
        if let Some(earlier) = &self.failed {
            return Err(CommitCheckpointError::EarlierFailure {
                path: self.temp_path.clone(),
                earlier: earlier.clone(),
            });
        }
        let mut files = self.files.clone();
        files.sort_by(|a, b| a.name.cmp(&b.name));
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            step: self.step,
            world_size: self.world_size,
            job_id: self.job_id.clone(),
            created_unix_ms: unix_ms(SystemTime::now()),
            files,
        };
        let manifest_path = self.temp_path.join(MANIFEST_FILE);
        write_manifest(&manifest_path, &manifest).map_err(|source| {
            CommitCheckpointError::WriteManifest { path: manifest_path.clone(), source }
        })?;
        sync_dir(&self.temp_path).map_err(|source| CommitCheckpointError::SyncTempDir {
            path: self.temp_path.clone(),
            source,
        })?;

        let final_path = self.checkpoint_dir.join(step_dir_name(self.step));
        let moved_aside = self.move_aside_invalid(&final_path)?;
        fs::rename(&self.temp_path, &final_path).map_err(|source| {
            CommitCheckpointError::Rename {
                from: self.temp_path.clone(),
                to: final_path.clone(),
                source,
            }
        })?;
        self.owns_temp = false;
        if let Err(source) = sync_dir(&self.checkpoint_dir) {
            // Not durable, so not committed: a crash now could lose it, and a caller told it
            // failed must not find it later.
            if let Err(e) = fs::remove_dir_all(&final_path) {
                warn!(
                    dir = %final_path.display(),
                    error = %e,
                    "cannot remove a checkpoint whose rename could not be synced"
                );
            }
            return Err(CommitCheckpointError::SyncCheckpointDir {
                path: self.checkpoint_dir.clone(),
                source,
            });
        }
        if let Some(aside) = moved_aside
            && let Err(e) = fs::remove_dir_all(&aside)
        {
            warn!(
                dir = %aside.display(),
                error = %e,
                "cannot remove a replaced invalid checkpoint; the next writer will"
            );
        }
        Ok(final_path)
    }

    /// Makes room at `final_path` when an invalid checkpoint of the same step is there, by
    /// renaming it to a temporary name (readers ignore it; a crash leaves it for the next writer).
    fn move_aside_invalid(
        &self,
        final_path: &Path,
    ) -> Result<Option<PathBuf>, CommitCheckpointError> {
        if fs::symlink_metadata(final_path).is_err() {
            return Ok(None);
        }
        let reason = match verify(final_path) {
            Ok(_) => {
                return Err(CommitCheckpointError::StepExists { path: final_path.to_path_buf() });
            }
            Err(reason) => reason,
        };
        let aside = self.checkpoint_dir.join(temp_dir_name(self.step, "-replaced"));
        warn!(
            dir = %final_path.display(),
            %reason,
            "replacing an invalid checkpoint of the same step"
        );
        fs::rename(final_path, &aside).map_err(|source| {
            CommitCheckpointError::MoveAsideInvalid { path: final_path.to_path_buf(), source }
        })?;
        Ok(Some(aside))
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        if self.owns_temp {
            match fs::remove_dir_all(&self.temp_path) {
                Ok(()) => debug!(dir = %self.temp_path.display(), "unfinished checkpoint removed"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(
                        dir = %self.temp_path.display(),
                        error = %e,
                        "cannot remove an unfinished checkpoint; the next writer will"
                    )
                }
            }
        }
    }
}

/// Creates the file `name` in `dir`, fills it with what `write` writes (hashed on the way) and
/// fsyncs it; returns its manifest entry.
fn write_new_file<F>(
    dir: &Path,
    name: &str,
    write: F,
) -> Result<ManifestFile, AddCheckpointFileError>
where
    F: FnOnce(&mut dyn Write) -> io::Result<()>,
{
    let path = dir.join(name);
    let write_error = |source| AddCheckpointFileError::Write { path: path.clone(), source };
    let file = File::options().write(true).create_new(true).open(&path).map_err(write_error)?;
    // The buffer sits above the hashing, so that the hash sees large pieces it can compute
    // beside the write (see HashingWriter).
    let mut out = BufWriter::with_capacity(
        IO_BUFFER_BYTES,
        HashingWriter { inner: file, hasher: Sha256::new(), size: 0 },
    );
    write(&mut out).map_err(write_error)?;
    let HashingWriter { inner: file, hasher, size } =
        out.into_inner().map_err(|e| write_error(e.into_error()))?;
    file.sync_all()
        .map_err(|source| AddCheckpointFileError::Sync { path: path.clone(), source })?;
    Ok(ManifestFile { name: name.to_owned(), size, sha256: hex::encode(hasher.finalize()) })
}

/// Writes a checkpoint file, computing its size and SHA-256 on the way, so a file is hashed while
/// it is written rather than read back.
///
/// A large piece goes three ways at once: this thread copies it into the page cache in
/// [`IO_BUFFER_BYTES`] pieces, a second thread hashes it, and a third asks the kernel to write
/// back what is already there (`fdatasync`) while the copy goes on. SHA-256 runs at about the speed
/// of a fast disk: done one after the other, hashing, copying and the final fsync's writeback would
/// each add their time (measured: 0.4 of dd's rate; in parallel the time is about the slowest of
/// the three).
pub(super) struct HashingWriter {
    pub(super) inner: File,
    pub(super) hasher: Sha256,
    pub(super) size: u64,
}

/// Pieces at least this large are hashed beside the write; smaller ones inline (a thread costs
/// tens of microseconds, a megabyte of SHA-256 about half a millisecond).
const PARALLEL_HASH_BYTES: usize = 256 << 10;

/// While a large piece is written, writeback is started again after every this many bytes.
pub(super) const WRITE_BACK_BYTES: usize = 32 << 20;

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() < PARALLEL_HASH_BYTES {
            let n = self.inner.write(buf)?;
            let written = buf.get(..n).unwrap_or(buf);
            self.hasher.update(written);
            self.size += written.len() as u64;
            return Ok(n);
        }
        let Self { inner, hasher, .. } = self;
        let file: &File = inner;
        let (written, hashed) = thread::scope(|scope| {
            let hashing = thread::Builder::new()
                .name("checkpoint-hash".into())
                .spawn_scoped(scope, || hasher.update(buf));
            // One pending request at most: a request while a writeback runs waits for it.
            let (write_back, requests) = mpsc::sync_channel::<()>(1);
            let syncing = thread::Builder::new().name("checkpoint-sync".into()).spawn_scoped(
                scope,
                move || {
                    for () in requests {
                        // A hint: an error here shows again at the final fsync, which fails the
                        // add.
                        let _ = file.sync_data();
                    }
                },
            );
            if syncing.is_err() {
                debug!("no thread for early writeback; the final fsync does all of it");
            }
            let mut since_write_back = 0;
            // In pieces, as dd does: one huge write is slower (measured: a 256 MiB write(2)
            // copies into the page cache at a third of the rate of 1 MiB ones).
            let written = buf.chunks(IO_BUFFER_BYTES).try_for_each(|piece| -> io::Result<()> {
                (&*file).write_all(piece)?;
                since_write_back += piece.len();
                if since_write_back >= WRITE_BACK_BYTES {
                    since_write_back = 0;
                    // Full: a writeback is running and one more is queued; skip this one.
                    let _ = write_back.try_send(());
                }
                Ok(())
            });
            drop(write_back);
            match hashing.map(|handle| handle.join()) {
                Ok(Ok(())) => (written, true),
                // A panic in SHA-256 is a bug, not an I/O outcome: pass it on.
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                // No thread to be had: hash here, after the write.
                Err(_) => (written, false),
            }
        });
        if !hashed {
            self.hasher.update(buf);
        }
        // On error the hash includes bytes that may not be on disk; the add fails and the
        // checkpoint with it, so the hash is never used.
        written?;
        self.size += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn write_manifest(path: &Path, manifest: &Manifest) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(manifest).map_err(io::Error::other)?;
    bytes.push(b'\n');
    let mut file = File::options().write(true).create_new(true).open(path)?;
    file.write_all(&bytes)?;
    file.sync_all()
}

/// A temporary directory name for `step`: unique per process and call, and recognisable by
/// readers (who skip it) and writers (who remove it when stale).
pub(super) fn temp_dir_name(step: u64, suffix: &str) -> String {
    format!(
        "{TEMP_PREFIX}{step:0width$}-{pid}-{rand:016x}{suffix}",
        width = STEP_DIGITS,
        pid = std::process::id(),
        rand = fastrand::u64(..),
    )
}

fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Removes the temporary checkpoint directories in `checkpoint_dir` last modified before
/// `older_than` (except `keep`), logging what it cannot remove; returns what it removed.
pub(super) fn remove_stale_temp_dirs(
    checkpoint_dir: &Path,
    older_than: SystemTime,
    keep: Option<&Path>,
) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(checkpoint_dir) {
        Ok(entries) => entries,
        Err(e) => {
            warn!(
                dir = %checkpoint_dir.display(),
                error = %e,
                "cannot list the checkpoint directory to remove stale temporary directories"
            );
            return removed;
        }
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let path = entry.path();
        if keep == Some(path.as_path()) {
            continue;
        }
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else { continue };
        if modified >= older_than {
            continue;
        }
        let result = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match result {
            Ok(()) => {
                info!(
                    dir = %path.display(),
                    "removed a stale temporary checkpoint directory (an interrupted write)"
                );
                removed.push(path);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(
                    dir = %path.display(),
                    error = %e,
                    "cannot remove a stale temporary checkpoint directory"
                )
            }
        }
    }
    removed
}
