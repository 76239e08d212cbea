//! The checkpoint protocol (`docs/checkpoint-protocol.md`): how any job saves its state
//! so that it can be stopped on one node and go on from the same step on another.
//!
//! A checkpoint is a directory `step-<N>/` (N zero-padded so names sort like steps) inside the
//! job's checkpoint directory (`FLEETMEND_CHECKPOINT_DIR`). Its `manifest.json` lists the size and
//! sha256 of every other file and is written last; the whole directory is written under a
//! temporary name (`.tmp-step-<N>-<pid>-<rand>`) beside it, every file fsynced, then renamed into
//! place and the parent fsynced. So a `step-*` directory either does not exist or is complete:
//! a writer killed at any point leaves only a `.tmp-*` directory, which readers ignore and the next
//! writer removes.
//!
//! Readers ([`newest_valid`]) still verify every file, because disks and people corrupt files after
//! the fact: the newest directory whose manifest parses and whose files all match is used, and each
//! one refused on the way is logged with the reason.
//!
//! One writer at a time per checkpoint directory (in a data-parallel job, rank 0): a writer that
//! begins removes the temporary directories older than its own, which would make an older writer
//! that is still running fail its commit (cleanly: no `step-*` directory appears).

#[doc(hidden)]
pub mod fuzzing;
mod protocol_env;

pub(crate) use protocol_env::{EnvReader, Need};
pub use protocol_env::{EnvVarProblem, ProtocolEnv, ReadProtocolEnvError, vars};

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tracing::{debug, info, warn};

/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The manifest format this code writes, and the newest one it reads.
pub const FORMAT_VERSION: u32 = 1;

const STEP_PREFIX: &str = "step-";
const TEMP_PREFIX: &str = ".tmp-step-";
/// Enough digits that names sort like steps for any realistic run; a larger step gets a longer
/// name, and readers order by the parsed number anyway.
const STEP_DIGITS: usize = 8;
/// Large sequential writes and reads: checkpoint files are megabytes to gigabytes.
const IO_BUFFER_BYTES: usize = 1 << 20;

/// The directory name of the checkpoint of `step`: `step-00000120`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:0width$}", width = STEP_DIGITS)
}

/// The step of a checkpoint directory name (`step-<digits>`), or `None` for any other name.
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `manifest.json`: what a complete checkpoint holds. Written last, so its presence with matching
/// files is what makes a checkpoint valid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format version ([`FORMAT_VERSION`]); readers refuse newer ones.
    pub format_version: u32,
    /// The training step the checkpoint was taken at; equals the `N` of `step-<N>`.
    pub step: u64,
    /// How many ranks the job had when it wrote the checkpoint; whether another world size may
    /// resume from it is the job's decision.
    pub world_size: u32,
    /// The job that wrote it (`FLEETMEND_JOB_ID`).
    pub job_id: String,
    /// When the checkpoint was committed, in milliseconds since the Unix epoch (writer's clock).
    pub created_unix_ms: u64,
    /// Every other file of the checkpoint, sorted by name.
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// The entry for the file called `name`, if the checkpoint has one.
    pub fn file(&self, name: &str) -> Option<&ManifestFile> {
        self.files.iter().find(|f| f.name == name)
    }
}

/// One file of a checkpoint as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// File name inside the checkpoint directory (one path component, never `manifest.json`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the contents, lowercase hex.
    pub sha256: String,
}

/// Why a file name cannot be part of a checkpoint, or `None` when it can.
fn file_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("the name is empty")
    } else if name == MANIFEST_FILE {
        Some("the manifest's name is reserved")
    } else if name.starts_with('.') {
        // Also rules out "." and "..".
        Some("names starting with '.' are reserved")
    } else if name.contains(['/', '\\', '\0']) {
        Some("a name is one path component")
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Writing

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
struct HashingWriter {
    inner: File,
    hasher: Sha256,
    size: u64,
}

/// Pieces at least this large are hashed beside the write; smaller ones inline (a thread costs
/// tens of microseconds, a megabyte of SHA-256 about half a millisecond).
const PARALLEL_HASH_BYTES: usize = 256 << 10;

/// While a large piece is written, writeback is started again after every this many bytes.
const WRITE_BACK_BYTES: usize = 32 << 20;

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
fn temp_dir_name(step: u64, suffix: &str) -> String {
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
fn remove_stale_temp_dirs(
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

// ---------------------------------------------------------------------------------------------
// Reading

/// Listing a checkpoint directory failed.
#[derive(Debug, Error)]
#[error("cannot list checkpoint directory {path}: {source}")]
pub struct ListCheckpointsError {
    /// The job's checkpoint directory.
    pub path: PathBuf,
    /// The I/O error.
    pub source: io::Error,
}

/// Why a checkpoint directory was refused by [`verify`]. Every variant names the directory.
#[derive(Debug, Error)]
pub enum VerifyCheckpointError {
    /// The directory's name is not `step-<N>`.
    #[error("checkpoint {path}: the directory name is not step-<N>")]
    NotAStepDir {
        /// The directory.
        path: PathBuf,
    },
    /// No manifest: the write never finished, or someone made the directory by hand.
    #[error("checkpoint {path}: no {MANIFEST_FILE} (an unfinished write)")]
    ManifestMissing {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// The manifest exists but cannot be read.
    #[error("checkpoint {path}: cannot read {MANIFEST_FILE}: {source}")]
    ReadManifest {
        /// The checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("checkpoint {path}: {MANIFEST_FILE} does not parse: {source}")]
    ParseManifest {
        /// The checkpoint directory.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The manifest was written by a newer format this code does not know.
    #[error(
        "checkpoint {path}: manifest format version {found} is newer than the supported {supported}"
    )]
    UnsupportedVersion {
        /// The checkpoint directory.
        path: PathBuf,
        /// The version in the manifest.
        found: u32,
        /// [`FORMAT_VERSION`].
        supported: u32,
    },
    /// The manifest belongs to another step than the directory's name says.
    #[error(
        "checkpoint {path}: the manifest says step {manifest_step}, the directory name {dir_step}"
    )]
    StepMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// The step from the directory name.
        dir_step: u64,
        /// The step in the manifest.
        manifest_step: u64,
    },
    /// The manifest says the job had no ranks, which no writer records (it refuses to begin).
    #[error("checkpoint {path}: the manifest says world size 0")]
    ZeroWorldSize {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// The manifest lists a name that is not a plain file name (it could point outside).
    #[error("checkpoint {path}: the manifest lists a bad file name {name:?}: {reason}")]
    BadFileName {
        /// The checkpoint directory.
        path: PathBuf,
        /// The name listed.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The manifest lists a name twice.
    #[error("checkpoint {path}: the manifest lists {name:?} twice")]
    DuplicateFile {
        /// The checkpoint directory.
        path: PathBuf,
        /// The name listed twice.
        name: String,
    },
    /// A file the manifest lists is not there.
    #[error("checkpoint {path}: {name:?} is missing")]
    FileMissing {
        /// The checkpoint directory.
        path: PathBuf,
        /// The missing file.
        name: String,
    },
    /// A file the manifest lists cannot be read.
    #[error("checkpoint {path}: cannot read {name:?}: {source}")]
    ReadFile {
        /// The checkpoint directory.
        path: PathBuf,
        /// The file.
        name: String,
        /// The I/O error.
        source: io::Error,
    },
    /// A file has another size than the manifest says: truncated or partly written.
    #[error(
        "checkpoint {path}: {name:?} is {actual} bytes but the manifest says {expected} \
         (truncated or overwritten)"
    )]
    SizeMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// The file.
        name: String,
        /// Size from the manifest.
        expected: u64,
        /// Size found.
        actual: u64,
    },
    /// A file's contents do not match the manifest's hash: corrupted.
    #[error(
        "checkpoint {path}: {name:?} has sha256 {actual} but the manifest says {expected} \
         (corrupted)"
    )]
    HashMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// The file.
        name: String,
        /// Hash from the manifest.
        expected: String,
        /// Hash computed.
        actual: String,
    },
}

/// A checkpoint directory by its name, not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepDir {
    /// The step from the directory name.
    pub step: u64,
    /// The directory.
    pub path: PathBuf,
}

/// Every `step-<N>` directory in `checkpoint_dir`, newest step first, unverified. Temporary
/// directories and other names are left out. A missing `checkpoint_dir` has none.
pub fn step_dirs(checkpoint_dir: impl AsRef<Path>) -> Result<Vec<StepDir>, ListCheckpointsError> {
    let checkpoint_dir = checkpoint_dir.as_ref();
    let list_error = |source| ListCheckpointsError { path: checkpoint_dir.to_path_buf(), source };
    let entries = match fs::read_dir(checkpoint_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(list_error(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(list_error)?;
        let Some(step) = entry.file_name().to_str().and_then(parse_step_dir_name) else {
            continue;
        };
        let path = entry.path();
        // Follows symlinks: a checkpoint linked in from elsewhere counts.
        if path.is_dir() {
            dirs.push(StepDir { step, path });
        }
    }
    dirs.sort_by(|a, b| b.step.cmp(&a.step).then_with(|| b.path.cmp(&a.path)));
    Ok(dirs)
}

/// A checkpoint whose manifest parsed and whose every file matched it when it was verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidCheckpoint {
    /// The step it was taken at.
    pub step: u64,
    /// Its directory.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// [`ValidCheckpoint::read_file`] failed.
#[derive(Debug, Error)]
pub enum ReadCheckpointFileError {
    /// The checkpoint has no file of that name.
    #[error("checkpoint {path} has no file {name:?}")]
    NotInManifest {
        /// The checkpoint directory.
        path: PathBuf,
        /// The name asked for.
        name: String,
    },
    /// Reading failed.
    #[error("cannot read checkpoint file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file changed since the checkpoint was verified.
    #[error("checkpoint file {path} no longer matches the manifest: {reason}")]
    Changed {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
}

impl ValidCheckpoint {
    /// The world size the checkpoint was written with. Whether a job of another size may resume
    /// from it is the caller's decision.
    pub fn world_size(&self) -> u32 {
        self.manifest.world_size
    }

    /// The names of its files (without the manifest), sorted.
    pub fn file_names(&self) -> impl Iterator<Item = &str> {
        self.manifest.files.iter().map(|f| f.name.as_str())
    }

    /// The path of the file `name`, if the checkpoint has one (for readers that want to stream or
    /// map it; [`read_file`](Self::read_file) checks the contents again).
    pub fn file_path(&self, name: &str) -> Option<PathBuf> {
        self.manifest.file(name).map(|f| self.path.join(&f.name))
    }

    /// Reads the file `name` whole, checking its size and sha256 against the manifest again (the
    /// file may have changed since [`verify`]). To restore, [`load`] or [`newest_loaded`] verify
    /// and read in one pass instead of two.
    pub fn read_file(&self, name: &str) -> Result<Vec<u8>, ReadCheckpointFileError> {
        let Some(entry) = self.manifest.file(name) else {
            return Err(ReadCheckpointFileError::NotInManifest {
                path: self.path.clone(),
                name: name.to_owned(),
            });
        };
        let path = self.path.join(&entry.name);
        let bytes = fs::read(&path)
            .map_err(|source| ReadCheckpointFileError::Read { path: path.clone(), source })?;
        if bytes.len() as u64 != entry.size {
            return Err(ReadCheckpointFileError::Changed {
                path,
                reason: format!("{} bytes, the manifest says {}", bytes.len(), entry.size),
            });
        }
        let actual = hex::encode(Sha256::digest(&bytes));
        if !actual.eq_ignore_ascii_case(&entry.sha256) {
            return Err(ReadCheckpointFileError::Changed {
                path,
                reason: format!("sha256 {actual}, the manifest says {}", entry.sha256),
            });
        }
        Ok(bytes)
    }
}

/// Verifies the checkpoint directory `path`: its name is `step-<N>`, its manifest parses, is of a
/// known format and of step N, and every file it lists exists with the listed size and sha256.
/// Reads every file (and keeps none: to restore from it, [`load`] reads each byte once).
pub fn verify(path: impl AsRef<Path>) -> Result<ValidCheckpoint, VerifyCheckpointError> {
    check_checkpoint(path.as_ref(), Contents::Discard).map(|(valid, _)| valid)
}

/// Verifies the checkpoint directory `path` as [`verify`] does and returns the contents of its
/// files, read in the same pass: each byte is read from disk once and hashed while it is still in
/// the CPU cache. This is the restore path: [`verify`] followed by
/// [`ValidCheckpoint::read_file`] reads and hashes everything twice.
///
/// Every file is held in memory at once; a job whose checkpoint does not fit streams it through
/// [`ValidCheckpoint::file_path`] instead.
pub fn load(path: impl AsRef<Path>) -> Result<LoadedCheckpoint, VerifyCheckpointError> {
    let (checkpoint, files) = check_checkpoint(path.as_ref(), Contents::Keep)?;
    Ok(LoadedCheckpoint { checkpoint, files })
}

/// A checkpoint verified and read into memory by [`load`] or [`newest_loaded`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedCheckpoint {
    /// The checkpoint (step, directory, manifest).
    pub checkpoint: ValidCheckpoint,
    /// The contents of every file the manifest lists, by name, as verified.
    pub files: BTreeMap<String, Vec<u8>>,
}

impl LoadedCheckpoint {
    /// The step it was taken at.
    pub fn step(&self) -> u64 {
        self.checkpoint.step
    }

    /// The contents of the file `name`, if the checkpoint has one.
    pub fn file(&self, name: &str) -> Option<&[u8]> {
        self.files.get(name).map(Vec::as_slice)
    }

    /// Takes the contents of the file `name` out (no copy), if the checkpoint has one.
    pub fn take_file(&mut self, name: &str) -> Option<Vec<u8>> {
        self.files.remove(name)
    }
}

/// Whether [`check_checkpoint`] keeps what it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contents {
    Discard,
    Keep,
}

fn check_checkpoint(
    path: &Path,
    contents: Contents,
) -> Result<(ValidCheckpoint, BTreeMap<String, Vec<u8>>), VerifyCheckpointError> {
    let path = path.to_path_buf();
    let Some(dir_step) = path.file_name().and_then(|n| n.to_str()).and_then(parse_step_dir_name)
    else {
        return Err(VerifyCheckpointError::NotAStepDir { path });
    };
    let manifest_bytes = match fs::read(path.join(MANIFEST_FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(VerifyCheckpointError::ManifestMissing { path });
        }
        Err(source) => return Err(VerifyCheckpointError::ReadManifest { path, source }),
    };
    let manifest: Manifest = match serde_json::from_slice(&manifest_bytes) {
        Ok(manifest) => manifest,
        Err(source) => return Err(VerifyCheckpointError::ParseManifest { path, source }),
    };
    if manifest.format_version > FORMAT_VERSION {
        return Err(VerifyCheckpointError::UnsupportedVersion {
            path,
            found: manifest.format_version,
            supported: FORMAT_VERSION,
        });
    }
    if manifest.step != dir_step {
        return Err(VerifyCheckpointError::StepMismatch {
            path,
            dir_step,
            manifest_step: manifest.step,
        });
    }
    if manifest.world_size == 0 {
        return Err(VerifyCheckpointError::ZeroWorldSize { path });
    }
    for (i, file) in manifest.files.iter().enumerate() {
        if let Some(reason) = file_name_problem(&file.name) {
            return Err(VerifyCheckpointError::BadFileName {
                path,
                name: file.name.clone(),
                reason,
            });
        }
        if manifest.files.iter().take(i).any(|f| f.name == file.name) {
            return Err(VerifyCheckpointError::DuplicateFile { path, name: file.name.clone() });
        }
    }
    // Sizes first: a truncated file is found without hashing gigabytes of the others.
    for file in &manifest.files {
        let file_path = path.join(&file.name);
        let actual = match fs::metadata(&file_path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(VerifyCheckpointError::FileMissing { path, name: file.name.clone() });
            }
            Err(source) => {
                return Err(VerifyCheckpointError::ReadFile {
                    path,
                    name: file.name.clone(),
                    source,
                });
            }
        };
        if actual != file.size {
            return Err(VerifyCheckpointError::SizeMismatch {
                path,
                name: file.name.clone(),
                expected: file.size,
                actual,
            });
        }
    }
    let mut kept = BTreeMap::new();
    let hashed_files = hash_files(&path, &manifest.files, contents);
    for (file, hashed) in manifest.files.iter().zip(hashed_files) {
        let hashed = hashed.map(|(size, hash, bytes)| {
            if let Some(bytes) = bytes {
                kept.insert(file.name.clone(), bytes);
            }
            (size, hash)
        });
        let (size, sha256) = match hashed {
            Ok(hashed) => hashed,
            Err(source) => {
                return Err(VerifyCheckpointError::ReadFile {
                    path,
                    name: file.name.clone(),
                    source,
                });
            }
        };
        if size != file.size {
            return Err(VerifyCheckpointError::SizeMismatch {
                path,
                name: file.name.clone(),
                expected: file.size,
                actual: size,
            });
        }
        if !sha256.eq_ignore_ascii_case(&file.sha256) {
            return Err(VerifyCheckpointError::HashMismatch {
                path,
                name: file.name.clone(),
                expected: file.sha256.clone(),
                actual: sha256,
            });
        }
    }
    Ok((ValidCheckpoint { step: dir_step, path, manifest }, kept))
}

/// What hashing one file found: its size, its SHA-256 and, when kept, its contents.
type HashedFile = (u64, String, Option<Vec<u8>>);

/// Hashes (and with [`Contents::Keep`] reads into memory) every file of `files` in `dir`; the
/// results in the same order. Files are spread over up to one thread per core: one SHA-256 stream
/// is about as fast as a disk, so a checkpoint of several files is read at the disk's rate only
/// when they are hashed side by side.
fn hash_files(
    dir: &Path,
    files: &[ManifestFile],
    contents: Contents,
) -> Vec<io::Result<HashedFile>> {
    let hash_one = |file: &ManifestFile, buffer: &mut Vec<u8>| -> io::Result<HashedFile> {
        let path = dir.join(&file.name);
        match contents {
            Contents::Discard => {
                if buffer.is_empty() {
                    buffer.resize(IO_BUFFER_BYTES, 0);
                }
                hash_file(&path, buffer).map(|(size, hash)| (size, hash, None))
            }
            Contents::Keep => read_and_hash_file(&path, file.size)
                .map(|(size, hash, bytes)| (size, hash, Some(bytes))),
        }
    };
    let workers = thread::available_parallelism().map_or(1, |n| n.get()).min(files.len());
    if workers <= 1 {
        let mut buffer = Vec::new();
        return files.iter().map(|file| hash_one(file, &mut buffer)).collect();
    }
    // Each worker takes the next file not yet taken; this thread works too, so a failure to start
    // helpers only makes it slower.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut buffer = Vec::new();
        let mut done = Vec::new();
        loop {
            let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(file) = files.get(index) else { return done };
            done.push((index, hash_one(file, &mut buffer)));
        }
    };
    let mut results: Vec<Option<io::Result<HashedFile>>> = files.iter().map(|_| None).collect();
    thread::scope(|scope| {
        let helpers: Vec<_> = (1..workers)
            .filter_map(|_| {
                thread::Builder::new()
                    .name("checkpoint-verify".into())
                    .spawn_scoped(scope, work)
                    .ok()
            })
            .collect();
        let mut done = work();
        for helper in helpers {
            done.extend(helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        }
        for (index, result) in done {
            if let Some(slot) = results.get_mut(index) {
                *slot = Some(result);
            }
        }
    });
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err(io::Error::other("file was not hashed"))))
        .collect()
}

/// Reads the file at `path`, expected to hold `expected_size` bytes, into memory and hashes it.
/// Returns the size actually found (larger or smaller when the file changed since its size was
/// checked), the SHA-256 of what was read and the contents.
///
/// A helper thread reads the next pieces while this one hashes the last: SHA-256 runs at about
/// the speed of a fast disk, and one after the other would halve the restore rate.
fn read_and_hash_file(path: &Path, expected_size: u64) -> io::Result<(u64, String, Vec<u8>)> {
    let mut file = File::open(path)?;
    let capacity = usize::try_from(expected_size).map_err(io::Error::other)?;
    // An error, not an abort, for a file larger than memory can hold; then zeroed memory, which
    // the allocator gets from the kernel already zeroed (no pass over it here).
    Vec::<u8>::new().try_reserve_exact(capacity).map_err(io::Error::other)?;
    let mut bytes = vec![0u8; capacity];
    let mut hasher = Sha256::new();
    let pipelined = thread::scope(|scope| {
        let (pieces, arriving) = mpsc::sync_channel::<&[u8]>(READ_AHEAD_PIECES);
        let reader =
            thread::Builder::new().name("checkpoint-read".into()).spawn_scoped(scope, || {
                read_pieces(&mut file, &mut bytes, move |piece| pieces.send(piece).is_ok())
            });
        let reader = reader.ok()?;
        // Ends when the reader is done (it drops the sender).
        for piece in arriving {
            hasher.update(piece);
        }
        Some(reader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    let (filled, beyond) = match pipelined {
        Some(read) => read?,
        // No thread to be had: read and hash in turn.
        None => read_pieces(&mut file, &mut bytes, |piece| {
            hasher.update(piece);
            true
        })?,
    };
    bytes.truncate(filled);
    Ok((filled as u64 + beyond, hex::encode(hasher.finalize()), bytes))
}

/// How many pieces the reader of [`read_and_hash_file`] may be ahead of the hashing.
const READ_AHEAD_PIECES: usize = 4;

/// Fills `bytes` from `file` in pieces of [`IO_BUFFER_BYTES`], handing each full piece (or the
/// last, partial one) to `each` (which returns false to stop). Returns how many bytes were read
/// and, when `bytes` filled up, how many more the file holds (counted, not kept: a file that grew
/// is as wrong as one that shrank).
fn read_pieces<'a>(
    file: &mut File,
    bytes: &'a mut [u8],
    mut each: impl FnMut(&'a [u8]) -> bool,
) -> io::Result<(usize, u64)> {
    let capacity = bytes.len();
    let mut filled = 0;
    for piece in bytes.chunks_mut(IO_BUFFER_BYTES) {
        let mut got = 0;
        while got < piece.len() {
            match file.read(piece.get_mut(got..).unwrap_or_default()) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        filled += got;
        let short = got < piece.len();
        let (read, _) = piece.split_at(got);
        if !each(read) || short {
            return Ok((filled, 0));
        }
    }
    let mut beyond = 0u64;
    if filled == capacity {
        let mut rest = [0u8; 8192];
        loop {
            match file.read(&mut rest) {
                Ok(0) => break,
                Ok(n) => beyond += n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok((filled, beyond))
}

fn hash_file(path: &Path, buffer: &mut [u8]) -> io::Result<(u64, String)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let n = match file.read(buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let chunk = buffer.get(..n).unwrap_or(buffer);
        hasher.update(chunk);
        size += chunk.len() as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// The newest checkpoint in `checkpoint_dir` that [`verify`] accepts, or `None` when there is
/// none (or no such directory). Each newer one refused on the way is logged (`warn`) with the
/// directory and the reason.
pub fn newest_valid(
    checkpoint_dir: impl AsRef<Path>,
) -> Result<Option<ValidCheckpoint>, ListCheckpointsError> {
    newest_accepted(checkpoint_dir, |path| verify(path))
}

/// The newest checkpoint in `checkpoint_dir` that [`load`] accepts, with its files in memory, or
/// `None` when there is none (or no such directory): [`newest_valid`] for a restore, reading each
/// byte of the chosen checkpoint once. Each newer one refused on the way is logged (`warn`) with
/// the directory and the reason.
pub fn newest_loaded(
    checkpoint_dir: impl AsRef<Path>,
) -> Result<Option<LoadedCheckpoint>, ListCheckpointsError> {
    newest_accepted(checkpoint_dir, |path| load(path))
}

/// The newest step directory `accept` takes, newest first; each refused one is logged (`warn`).
fn newest_accepted<T>(
    checkpoint_dir: impl AsRef<Path>,
    accept: impl Fn(&Path) -> Result<T, VerifyCheckpointError>,
) -> Result<Option<T>, ListCheckpointsError> {
    for dir in step_dirs(checkpoint_dir)? {
        match accept(&dir.path) {
            Ok(accepted) => return Ok(Some(accepted)),
            Err(reason) => {
                warn!(
                    checkpoint = %dir.path.display(),
                    %reason,
                    "checkpoint refused; trying the previous one"
                );
            }
        }
    }
    Ok(None)
}

// ---------------------------------------------------------------------------------------------
// Retention

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_dir_names_are_zero_padded_and_parse_back() {
        assert_eq!(step_dir_name(120), "step-00000120");
        assert_eq!(step_dir_name(123_456_789_012), "step-123456789012");
        assert_eq!(parse_step_dir_name("step-00000120"), Some(120));
        assert_eq!(parse_step_dir_name("step-7"), Some(7));
        assert_eq!(parse_step_dir_name(&step_dir_name(u64::MAX)), Some(u64::MAX));
        for bad in ["step-", "step-12a", "step--1", "step-+1", ".tmp-step-00000001-1-0", "steps-1"]
        {
            assert_eq!(parse_step_dir_name(bad), None, "{bad}");
        }
        let mut names: Vec<String> = [100, 9, 20].into_iter().map(step_dir_name).collect();
        names.sort();
        assert_eq!(names, ["step-00000009", "step-00000020", "step-00000100"]);
    }

    #[test]
    fn temp_dir_names_are_not_step_dirs_and_differ() {
        let a = temp_dir_name(5, "");
        let b = temp_dir_name(5, "");
        assert!(a.starts_with(".tmp-step-00000005-"), "{a}");
        assert_ne!(a, b);
        assert_eq!(parse_step_dir_name(&a), None);
    }

    #[test]
    fn file_names_must_be_one_plain_component() {
        for bad in ["", "manifest.json", ".hidden", ".", "..", "a/b", "../x", "a\\b", "a\0b"] {
            assert!(file_name_problem(bad).is_some(), "{bad:?} accepted");
        }
        for good in ["model.safetensors", "state.json", "rank-0.bin"] {
            assert_eq!(file_name_problem(good), None, "{good:?} refused");
        }
    }

    #[test]
    fn hashing_writer_matches_a_one_shot_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let file = File::options().write(true).create_new(true).open(&path).unwrap();
        let mut out = HashingWriter { inner: file, hasher: Sha256::new(), size: 0 };
        out.write_all(b"hello ").unwrap();
        out.write_all(b"world").unwrap();
        // Large pieces are hashed on a second thread and written in pieces (with writeback
        // started on the way): same bytes, same hash.
        let big: Vec<u8> =
            (0..WRITE_BACK_BYTES + 3 * IO_BUFFER_BYTES + 5).map(|i| (i % 251) as u8).collect();
        out.write_all(&big).unwrap();
        out.write_all(b"tail").unwrap();
        let mut expected = b"hello world".to_vec();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(b"tail");
        assert_eq!(out.size, expected.len() as u64);
        assert_eq!(hex::encode(out.hasher.finalize()), hex::encode(Sha256::digest(&expected)));
        assert!(fs::read(&path).unwrap() == expected, "the bytes written differ");
    }

    #[test]
    fn manifest_json_round_trips() {
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            step: 42,
            world_size: 4,
            job_id: "job-1".into(),
            created_unix_ms: 1_700_000_000_000,
            files: vec![ManifestFile { name: "a".into(), size: 3, sha256: "ab".into() }],
        };
        let json = serde_json::to_string(&manifest).unwrap();
        assert!(json.contains("\"world_size\":4"), "{json}");
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), manifest);
    }

    #[test]
    fn a_failed_add_fails_the_commit_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut writer = CheckpointWriter::begin(tmp.path(), 3, 1, "job").unwrap();
        writer.add_file("good", b"ok").unwrap();
        let err = writer
            .write_file("bad", |out| {
                out.write_all(b"partial")?;
                Err(io::Error::other("serialiser broke"))
            })
            .unwrap_err();
        assert!(matches!(err, AddCheckpointFileError::Write { .. }), "{err}");
        let later = writer.add_file("later", b"x").unwrap_err();
        assert!(matches!(later, AddCheckpointFileError::EarlierFailure { .. }), "{later}");
        let commit = writer.commit().unwrap_err();
        assert!(commit.to_string().contains("serialiser broke"), "{commit}");
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0, "something was left behind");
    }

    #[test]
    fn add_files_writes_side_by_side_and_checks_every_name_first() {
        let tmp = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..3 * IO_BUFFER_BYTES + 7).map(|i| (i % 241) as u8).collect();
        let mut writer = CheckpointWriter::begin(tmp.path(), 4, 2, "job").unwrap();
        writer.add_file("first", b"1").unwrap();
        writer
            .add_files(&[("b.bin", &big), ("a.bin", b"small"), ("c.bin", b""), ("d.bin", &big)])
            .unwrap();
        let path = writer.commit().unwrap();
        let loaded = load(&path).unwrap();
        let names: Vec<&str> = loaded.checkpoint.file_names().collect();
        assert_eq!(names, ["a.bin", "b.bin", "c.bin", "d.bin", "first"]);
        assert!(loaded.file("b.bin") == Some(&big[..]) && loaded.file("d.bin") == Some(&big[..]));
        assert_eq!(loaded.file("a.bin"), Some(&b"small"[..]));

        // A duplicate within the list, or of an earlier file, or a bad name: nothing is written
        // and the checkpoint fails.
        for files in [
            vec![("x", &b"1"[..]), ("x", &b"2"[..])],
            vec![("y", &b"1"[..]), ("first", &b"2"[..])],
            vec![("z", &b"1"[..]), ("manifest.json", &b"{}"[..])],
        ] {
            let mut writer = CheckpointWriter::begin(tmp.path(), 5, 1, "job").unwrap();
            writer.add_file("first", b"1").unwrap();
            let temp = writer.temp_path().to_path_buf();
            assert!(writer.add_files(&files).is_err(), "{files:?} accepted");
            assert!(!temp.join(files[0].0).exists(), "{files:?}: a file was written");
            assert!(writer.commit().is_err());
        }
    }

    #[test]
    fn bad_and_duplicate_names_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut writer = CheckpointWriter::begin(tmp.path(), 1, 1, "job").unwrap();
        let err = writer.add_file("manifest.json", b"{}").unwrap_err();
        assert!(matches!(err, AddCheckpointFileError::InvalidName { .. }), "{err}");
        let mut writer = CheckpointWriter::begin(tmp.path(), 1, 1, "job").unwrap();
        writer.add_file("a", b"1").unwrap();
        let err = writer.add_file("a", b"2").unwrap_err();
        assert!(matches!(err, AddCheckpointFileError::Duplicate { .. }), "{err}");
    }

    #[test]
    fn zero_world_size_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let err = CheckpointWriter::begin(tmp.path(), 1, 0, "job").unwrap_err();
        assert!(matches!(err, BeginCheckpointError::ZeroWorldSize { .. }), "{err}");
    }

    #[test]
    fn a_dropped_writer_removes_its_temp_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let mut writer = CheckpointWriter::begin(tmp.path(), 1, 1, "job").unwrap();
        writer.add_file("a", b"1").unwrap();
        let temp = writer.temp_path().to_path_buf();
        assert!(temp.is_dir());
        drop(writer);
        assert!(!temp.exists());
    }

    #[test]
    fn load_returns_the_verified_contents_in_one_pass() {
        let tmp = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..IO_BUFFER_BYTES * 2 + 17).map(|i| (i % 253) as u8).collect();
        let mut writer = CheckpointWriter::begin(tmp.path(), 9, 2, "job").unwrap();
        writer.add_file("big.bin", &big).unwrap();
        writer.add_file("empty", b"").unwrap();
        writer.add_file("state.json", b"{\"step\":9}").unwrap();
        let path = writer.commit().unwrap();

        let mut loaded = load(&path).unwrap();
        assert_eq!(loaded.checkpoint, verify(&path).unwrap());
        assert_eq!(loaded.step(), 9);
        assert_eq!(loaded.files.len(), 3);
        assert_eq!(loaded.file("state.json"), Some(&b"{\"step\":9}"[..]));
        assert_eq!(loaded.file("empty"), Some(&b""[..]));
        assert_eq!(loaded.take_file("big.bin").unwrap(), big);
        assert_eq!(loaded.file("big.bin"), None);
        assert_eq!(
            newest_loaded(tmp.path()).unwrap().unwrap().file("state.json").map(<[u8]>::len),
            Some(10)
        );
    }

    #[test]
    fn load_refuses_what_verify_refuses_and_newest_loaded_falls_back() {
        let tmp = tempfile::tempdir().unwrap();
        for step in [1, 2] {
            let mut writer = CheckpointWriter::begin(tmp.path(), step, 1, "job").unwrap();
            writer.add_file("w", &vec![step as u8; 4096]).unwrap();
            writer.commit().unwrap();
        }
        // Same size, other bytes: only the hash can tell.
        let newest = tmp.path().join(step_dir_name(2));
        fs::write(newest.join("w"), vec![7u8; 4096]).unwrap();
        let err = load(&newest).unwrap_err();
        assert!(matches!(err, VerifyCheckpointError::HashMismatch { .. }), "{err}");
        let loaded = newest_loaded(tmp.path()).unwrap().unwrap();
        assert_eq!(loaded.step(), 1);
        assert_eq!(loaded.file("w"), Some(&vec![1u8; 4096][..]));

        fs::write(newest.join("w"), vec![2u8; 10]).unwrap();
        let err = load(&newest).unwrap_err();
        assert!(matches!(err, VerifyCheckpointError::SizeMismatch { .. }), "{err}");
    }

    #[test]
    fn read_and_hash_file_reports_growth_and_shrinking() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        fs::write(&path, b"hello world").unwrap();
        let (size, hash, bytes) = read_and_hash_file(&path, 11).unwrap();
        assert_eq!((size, bytes.as_slice()), (11, &b"hello world"[..]));
        assert_eq!(hash, hex::encode(Sha256::digest(b"hello world")));
        // The manifest said 5 bytes but there are 11: the size tells, and only 5 are kept.
        let (size, _, bytes) = read_and_hash_file(&path, 5).unwrap();
        assert_eq!((size, bytes.len()), (11, 5));
        let (size, _, bytes) = read_and_hash_file(&path, 20).unwrap();
        assert_eq!((size, bytes.len()), (11, 11));
    }

    #[test]
    fn verify_refuses_names_that_escape_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-00000001");
        fs::create_dir(&dir).unwrap();
        fs::write(tmp.path().join("outside"), b"x").unwrap();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            step: 1,
            world_size: 1,
            job_id: "job".into(),
            created_unix_ms: 0,
            files: vec![ManifestFile {
                name: "../outside".into(),
                size: 1,
                sha256: hex::encode(Sha256::digest(b"x")),
            }],
        };
        fs::write(dir.join(MANIFEST_FILE), serde_json::to_vec(&manifest).unwrap()).unwrap();
        let err = verify(&dir).unwrap_err();
        assert!(matches!(err, VerifyCheckpointError::BadFileName { .. }), "{err}");
    }

    /// Found by the checkpoint_manifest fuzz target (fuzz/regressions/checkpoint_manifest/):
    /// a manifest of world size 0, which no writer produces, was accepted.
    #[test]
    fn verify_refuses_a_manifest_of_world_size_zero() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-00000001");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("model.bin"), b"weights").unwrap();
        let mut manifest = Manifest {
            format_version: FORMAT_VERSION,
            step: 1,
            world_size: 0,
            job_id: "job".into(),
            created_unix_ms: 0,
            files: vec![ManifestFile {
                name: "model.bin".into(),
                size: 7,
                sha256: hex::encode(Sha256::digest(b"weights")),
            }],
        };
        fs::write(dir.join(MANIFEST_FILE), serde_json::to_vec(&manifest).unwrap()).unwrap();
        let err = verify(&dir).unwrap_err();
        assert!(matches!(err, VerifyCheckpointError::ZeroWorldSize { .. }), "{err}");
        manifest.world_size = 1;
        fs::write(dir.join(MANIFEST_FILE), serde_json::to_vec(&manifest).unwrap()).unwrap();
        assert_eq!(verify(&dir).unwrap().world_size(), 1);
    }
}
