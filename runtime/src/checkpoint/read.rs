//! Reading checkpoints: listing the step directories, verifying a checkpoint against its manifest
//! and loading it, and finding the newest one that verifies.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use sha2::{Digest, Sha256};
use thiserror::Error;
use tracing::warn;

use super::*;

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
pub(super) fn read_and_hash_file(
    path: &Path,
    expected_size: u64,
) -> io::Result<(u64, String, Vec<u8>)> {
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
