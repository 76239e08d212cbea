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
mod prune;
mod read;
mod write;

pub(crate) use protocol_env::{EnvReader, Need};
pub use protocol_env::{EnvVarProblem, ProtocolEnv, ReadProtocolEnvError, vars};
pub use prune::*;
pub use read::*;
pub use write::*;

use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::io::{self, Write};

    use sha2::{Digest, Sha256};

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
