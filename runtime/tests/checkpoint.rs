//! The checkpoint protocol's directories on a real filesystem: writing, choosing the newest valid
//! checkpoint past corrupted, truncated and unfinished ones, retention, and a writer killed with
//! SIGKILL (a child process of this test binary).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fleetmend_runtime::checkpoint::{
    self, CheckpointWriter, CommitCheckpointError, ProtocolEnv, ReadCheckpointFileError,
    ValidCheckpoint, newest_valid, prune, step_dirs,
};

const JOB: &str = "job-7";

/// Deterministic contents for file `name` of the checkpoint of `step`.
fn contents(step: u64, name: &str, len: usize) -> Vec<u8> {
    let seed = step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ name.len() as u64;
    (0..len).map(|i| (seed.wrapping_add(i as u64).wrapping_mul(31) >> 3) as u8).collect()
}

fn write_checkpoint(dir: &Path, step: u64) -> PathBuf {
    let mut writer = CheckpointWriter::begin(dir, step, 4, JOB).unwrap();
    writer
        .add_file("weights.safetensors", &contents(step, "weights.safetensors", 64 * 1024))
        .unwrap();
    writer.add_file("state.json", format!("{{\"step\":{step}}}").as_bytes()).unwrap();
    writer.commit().unwrap()
}

fn assert_is_checkpoint_of(checkpoint: &ValidCheckpoint, step: u64) {
    assert_eq!(checkpoint.step, step);
    assert_eq!(checkpoint.manifest.step, step);
    assert_eq!(
        checkpoint.read_file("weights.safetensors").unwrap(),
        contents(step, "weights.safetensors", 64 * 1024)
    );
    assert_eq!(
        checkpoint.read_file("state.json").unwrap(),
        format!("{{\"step\":{step}}}").as_bytes()
    );
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// Runs `f` with a tracing subscriber that records what is logged; returns the log text too.
fn with_captured_log<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (out, log)
}

/// The WARN lines of `log` that mention `needle`.
fn warnings_about<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains("WARN") && l.contains(needle)).collect()
}

fn set_mtime(path: &Path, time: SystemTime) {
    File::open(path).unwrap().set_modified(time).unwrap();
}

#[test]
fn a_checkpoint_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let mut writer = CheckpointWriter::begin(&dir, 120, 4, JOB).unwrap();
    let big = contents(120, "optimizer.safetensors", 3 * 1024 * 1024 + 17);
    writer.add_file("state.json", b"{\"cursor\":9}").unwrap();
    writer
        .write_file("optimizer.safetensors", |out| {
            for chunk in big.chunks(100_000) {
                out.write_all(chunk)?;
            }
            Ok(())
        })
        .unwrap();
    writer.add_file("empty", b"").unwrap();
    let before_commit = names_in(&dir);
    assert_eq!(before_commit.len(), 1);
    assert!(before_commit[0].starts_with(".tmp-step-00000120-"), "{before_commit:?}");
    let path = writer.commit().unwrap();

    assert_eq!(path, dir.join("step-00000120"));
    assert_eq!(names_in(&dir), ["step-00000120"], "the temporary directory is gone");
    assert_eq!(names_in(&path), ["empty", "manifest.json", "optimizer.safetensors", "state.json"]);

    let checkpoint = newest_valid(&dir).unwrap().unwrap();
    assert_eq!(checkpoint.step, 120);
    assert_eq!(checkpoint.path, path);
    assert_eq!(checkpoint.world_size(), 4);
    assert_eq!(checkpoint.manifest.job_id, JOB);
    assert_eq!(checkpoint.manifest.format_version, checkpoint::FORMAT_VERSION);
    assert!(checkpoint.manifest.created_unix_ms > 1_600_000_000_000);
    assert_eq!(
        checkpoint.file_names().collect::<Vec<_>>(),
        ["empty", "optimizer.safetensors", "state.json"]
    );
    assert_eq!(checkpoint.manifest.file("optimizer.safetensors").unwrap().size, big.len() as u64);
    assert_eq!(checkpoint.read_file("optimizer.safetensors").unwrap(), big);
    assert_eq!(checkpoint.read_file("state.json").unwrap(), b"{\"cursor\":9}");
    assert_eq!(checkpoint.read_file("empty").unwrap(), b"");
    assert_eq!(checkpoint.file_path("state.json"), Some(path.join("state.json")));
    assert!(matches!(
        checkpoint.read_file("manifest.json"),
        Err(ReadCheckpointFileError::NotInManifest { .. })
    ));

    // The manifest is plain JSON other tools (a PyTorch job) can read and write.
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(path.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["step"], 120);
    assert_eq!(manifest["world_size"], 4);
    assert_eq!(manifest["files"][2]["name"], "state.json");
    assert_eq!(manifest["files"][2]["size"], 12);
}

#[test]
fn no_directory_or_no_checkpoint_gives_none() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(newest_valid(tmp.path().join("never-made")).unwrap().is_none());
    assert!(newest_valid(tmp.path()).unwrap().is_none());
}

#[test]
fn the_newest_of_three_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    for step in [20, 300, 100] {
        write_checkpoint(tmp.path(), step);
    }
    assert_is_checkpoint_of(&newest_valid(tmp.path()).unwrap().unwrap(), 300);
    let steps: Vec<u64> = step_dirs(tmp.path()).unwrap().iter().map(|d| d.step).collect();
    assert_eq!(steps, [300, 100, 20]);
}

#[test]
fn a_corrupted_byte_in_the_newest_falls_back_to_the_previous_with_the_reason_logged() {
    let tmp = tempfile::tempdir().unwrap();
    for step in [10, 20, 30] {
        write_checkpoint(tmp.path(), step);
    }
    let victim = tmp.path().join("step-00000030/weights.safetensors");
    let mut file = OpenOptions::new().read(true).write(true).open(&victim).unwrap();
    file.seek(SeekFrom::Start(40_000)).unwrap();
    let mut byte = [0u8];
    file.read_exact(&mut byte).unwrap();
    file.seek(SeekFrom::Start(40_000)).unwrap();
    file.write_all(&[byte[0] ^ 0x01]).unwrap();
    drop(file);

    let (newest, log) = with_captured_log(|| newest_valid(tmp.path()).unwrap().unwrap());
    assert_is_checkpoint_of(&newest, 20);
    let warnings = warnings_about(&log, "step-00000030");
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("weights.safetensors"), "{log}");
    assert!(warnings[0].contains("sha256") && warnings[0].contains("corrupted"), "{log}");
    assert!(warnings_about(&log, "step-00000020").is_empty(), "{log}");

    let err = checkpoint::verify(tmp.path().join("step-00000030")).unwrap_err();
    assert!(matches!(err, checkpoint::VerifyCheckpointError::HashMismatch { .. }), "{err}");
}

#[test]
fn a_truncated_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for step in [10, 20] {
        write_checkpoint(tmp.path(), step);
    }
    let victim = tmp.path().join("step-00000020/weights.safetensors");
    OpenOptions::new().write(true).open(&victim).unwrap().set_len(1000).unwrap();

    let (newest, log) = with_captured_log(|| newest_valid(tmp.path()).unwrap().unwrap());
    assert_is_checkpoint_of(&newest, 10);
    let warnings = warnings_about(&log, "step-00000020");
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("is 1000 bytes but the manifest says 65536"), "{log}");
}

#[test]
fn a_missing_file_or_a_bad_manifest_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for step in [1, 2, 3, 4] {
        write_checkpoint(tmp.path(), step);
    }
    fs::remove_file(tmp.path().join("step-00000004/state.json")).unwrap();
    fs::write(tmp.path().join("step-00000003/manifest.json"), b"{\"step\": 3, \"fil").unwrap();
    // A manifest copied from another step.
    fs::copy(
        tmp.path().join("step-00000001/manifest.json"),
        tmp.path().join("step-00000002/manifest.json"),
    )
    .unwrap();

    let (newest, log) = with_captured_log(|| newest_valid(tmp.path()).unwrap().unwrap());
    assert_is_checkpoint_of(&newest, 1);
    assert!(
        warnings_about(&log, "step-00000004")[0].contains("\"state.json\" is missing"),
        "{log}"
    );
    assert!(warnings_about(&log, "step-00000003")[0].contains("does not parse"), "{log}");
    assert!(warnings_about(&log, "step-00000002")[0].contains("the manifest says step 1"), "{log}");
}

#[test]
fn unfinished_writes_are_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), 10);

    // A crash before the rename leaves only the temporary directory: simulated by a writer that
    // never commits nor drops.
    let mut crashed = CheckpointWriter::begin(tmp.path(), 20, 4, JOB).unwrap();
    crashed.add_file("weights.safetensors", &contents(20, "weights.safetensors", 4096)).unwrap();
    let crashed_temp = crashed.temp_path().to_path_buf();
    std::mem::forget(crashed);

    // A step directory without a manifest (made by hand, or by a writer that ignores the protocol).
    let no_manifest = tmp.path().join("step-00000030");
    fs::create_dir(&no_manifest).unwrap();
    fs::write(no_manifest.join("weights.safetensors"), b"half").unwrap();

    let (newest, log) = with_captured_log(|| newest_valid(tmp.path()).unwrap().unwrap());
    assert_is_checkpoint_of(&newest, 10);
    assert!(crashed_temp.is_dir());
    assert!(!log.contains(".tmp-step"), "temporary directories are not even looked at: {log}");
    let warnings = warnings_about(&log, "step-00000030");
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("no manifest.json"), "{log}");
}

#[test]
fn a_failed_or_abandoned_write_leaves_no_step_directory() {
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), 1);

    let mut writer = CheckpointWriter::begin(tmp.path(), 2, 4, JOB).unwrap();
    writer.add_file("weights.safetensors", b"fine").unwrap();
    writer
        .write_file("optimizer.safetensors", |out| {
            out.write_all(b"some")?;
            Err(std::io::Error::other("out of memory while serialising"))
        })
        .unwrap_err();
    let err = writer.commit().unwrap_err();
    assert!(matches!(err, CommitCheckpointError::EarlierFailure { .. }), "{err}");

    let abandoned = CheckpointWriter::begin(tmp.path(), 3, 4, JOB).unwrap();
    drop(abandoned);

    assert_eq!(names_in(tmp.path()), ["step-00000001"]);
    assert_is_checkpoint_of(&newest_valid(tmp.path()).unwrap().unwrap(), 1);
}

#[test]
fn a_valid_checkpoint_of_the_same_step_is_kept_and_an_invalid_one_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let first = write_checkpoint(tmp.path(), 5);
    let mut again = CheckpointWriter::begin(tmp.path(), 5, 4, JOB).unwrap();
    again.add_file("weights.safetensors", b"other").unwrap();
    let err = again.commit().unwrap_err();
    assert!(
        matches!(err, CommitCheckpointError::StepExists { ref path } if *path == first),
        "{err}"
    );
    assert_is_checkpoint_of(&newest_valid(tmp.path()).unwrap().unwrap(), 5);
    assert_eq!(names_in(tmp.path()), ["step-00000005"]);

    fs::remove_file(first.join("state.json")).unwrap();
    let path = write_checkpoint(tmp.path(), 5);
    assert_eq!(path, first);
    assert_is_checkpoint_of(&newest_valid(tmp.path()).unwrap().unwrap(), 5);
    assert_eq!(names_in(tmp.path()), ["step-00000005"], "the replaced one is removed");
}

#[test]
fn the_world_size_is_exposed_for_the_caller_to_judge() {
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), 8);
    let checkpoint = newest_valid(tmp.path()).unwrap().unwrap();
    assert_eq!(checkpoint.world_size(), 4);
    assert_ne!(checkpoint.world_size(), 8, "a job of 8 ranks sees the mismatch");
}

#[test]
fn a_file_changed_after_verification_is_refused_on_read() {
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), 1);
    let checkpoint = newest_valid(tmp.path()).unwrap().unwrap();
    fs::write(checkpoint.path.join("state.json"), b"{\"step\":9}").unwrap();
    let err = checkpoint.read_file("state.json").unwrap_err();
    assert!(matches!(err, ReadCheckpointFileError::Changed { .. }), "{err}");
    assert!(err.to_string().contains("sha256"), "{err}");
}

#[test]
fn prune_keeps_the_newest_k_valid_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    for step in [10, 20, 30, 40, 50, 60] {
        write_checkpoint(tmp.path(), step);
    }
    // The newest is corrupted (not known to be older than anything: it stays), one old one too
    // (older than the kept ones: it goes).
    fs::remove_file(tmp.path().join("step-00000060/state.json")).unwrap();
    fs::remove_file(tmp.path().join("step-00000020/manifest.json")).unwrap();
    // A directory that is not a checkpoint is never touched.
    fs::create_dir(tmp.path().join("notes")).unwrap();

    let outcome = prune(tmp.path(), 2).unwrap();
    let at = |step: u64| tmp.path().join(checkpoint::step_dir_name(step));
    assert_eq!(outcome.kept, [at(50), at(40)]);
    assert_eq!(outcome.removed, [at(30), at(20), at(10)]);
    assert_eq!(outcome.left_alone, [at(60)]);
    assert_eq!(names_in(tmp.path()), ["notes", "step-00000040", "step-00000050", "step-00000060"]);
    assert_is_checkpoint_of(&newest_valid(tmp.path()).unwrap().unwrap(), 50);

    // Keeping 0 still keeps the newest valid one.
    let outcome = prune(tmp.path(), 0).unwrap();
    assert_eq!(outcome.kept, [at(50)]);
    assert_eq!(outcome.removed, [at(40)]);
    assert_is_checkpoint_of(&newest_valid(tmp.path()).unwrap().unwrap(), 50);

    // With no valid checkpoint nothing is removed.
    let other = tempfile::tempdir().unwrap();
    fs::create_dir(other.path().join("step-00000001")).unwrap();
    let outcome = prune(other.path(), 1).unwrap();
    assert!(outcome.kept.is_empty() && outcome.removed.is_empty());
    assert_eq!(outcome.left_alone, [other.path().join("step-00000001")]);
    assert_eq!(names_in(other.path()), ["step-00000001"]);

    // Fewer valid ones than asked for: invalid ones older than the oldest valid one still go.
    write_checkpoint(other.path(), 5);
    fs::create_dir(other.path().join("step-00000009")).unwrap();
    let outcome = prune(other.path(), 3).unwrap();
    let at = |step: u64| other.path().join(checkpoint::step_dir_name(step));
    assert_eq!(outcome.kept, [at(5)]);
    assert_eq!(outcome.removed, [at(1)]);
    assert_eq!(outcome.left_alone, [at(9)]);
    assert_eq!(names_in(other.path()), ["step-00000005", "step-00000009"]);
}

#[test]
fn stale_temp_dirs_are_removed_by_the_next_writer_and_by_prune() {
    let tmp = tempfile::tempdir().unwrap();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let in_an_hour = SystemTime::now() + Duration::from_secs(3600);
    let leave_temp = |step: u64, mtime: SystemTime| {
        let mut writer = CheckpointWriter::begin(tmp.path(), step, 4, JOB).unwrap();
        writer.add_file("weights.safetensors", b"partial").unwrap();
        let path = writer.temp_path().to_path_buf();
        std::mem::forget(writer);
        set_mtime(&path, mtime);
        path
    };

    // The next writer removes what is older than its own start, and leaves what is newer (another
    // writer's, still running).
    // (The newer one first: each `begin` cleans up too.)
    let running = leave_temp(2, in_an_hour);
    let crashed = leave_temp(1, an_hour_ago);
    let (path, log) = with_captured_log(|| write_checkpoint(tmp.path(), 3));
    assert!(!crashed.exists(), "{log}");
    assert!(running.exists());
    assert!(log.contains("removed a stale temporary checkpoint directory"), "{log}");
    assert_eq!(newest_valid(tmp.path()).unwrap().unwrap().path, path);

    // Prune removes what is older than the newest valid checkpoint.
    let crashed = leave_temp(4, an_hour_ago);
    set_mtime(&running, an_hour_ago);
    let outcome = prune(tmp.path(), 3).unwrap();
    let mut removed = outcome.removed_temp_dirs.clone();
    removed.sort();
    let mut expected = vec![crashed, running];
    expected.sort();
    assert_eq!(removed, expected);
    assert_eq!(names_in(tmp.path()), ["step-00000003"]);
}

#[test]
fn the_protocol_environment_round_trips_and_names_bad_variables() {
    let env = ProtocolEnv {
        rank: 1,
        world_size: 2,
        local_rank: 1,
        master_addr: "127.0.0.1".into(),
        master_port: 29_500,
        job_id: JOB.into(),
        checkpoint_dir: "/ckpt/job-7".into(),
        restart_count: 0,
    };
    let pairs: Vec<(&str, OsString)> = env.to_env();
    let lookup = |pairs: &[(&str, OsString)], var: &str| {
        pairs.iter().find(|(k, _)| *k == var).map(|(_, v)| v.clone())
    };
    assert_eq!(ProtocolEnv::from_lookup(|var| lookup(&pairs, var)).unwrap(), env);

    let mut bad = pairs.clone();
    bad.retain(|(k, _)| *k != "FLEETMEND_CHECKPOINT_DIR");
    bad.iter_mut().find(|(k, _)| *k == "WORLD_SIZE").unwrap().1 = "two".into();
    let err = ProtocolEnv::from_lookup(|var| lookup(&bad, var)).unwrap_err().to_string();
    assert!(err.contains("WORLD_SIZE=\"two\" is not a whole number"), "{err}");
    assert!(err.contains("FLEETMEND_CHECKPOINT_DIR is not set"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// A writer killed with SIGKILL. The test binary runs itself as the writer: the environment
// variable below switches the same test function into the child's role.

const CHILD_ROLE: &str = "FLEETMEND_TEST_CHECKPOINT_CHILD";
const CHILD_DIR: &str = "FLEETMEND_TEST_CHECKPOINT_CHILD_DIR";
const CHILD_MARKER: &str = "FLEETMEND_TEST_CHECKPOINT_CHILD_MARKER";
const BIG_FILE_BYTES: usize = 32 * 1024 * 1024;

/// Starts this test binary running only `test` in the child role `role`.
fn spawn_child(test: &str, role: &str, dir: &Path, marker: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, role)
        .env(CHILD_DIR, dir)
        .env(CHILD_MARKER, marker)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Polls `ready` until it holds, failing if the child exits first or the deadline passes.
fn wait_for(child: &mut Child, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child exited ({status}) before {what}");
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kill_9(mut child: Child) {
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status}");
}

/// The child's part: stops for good in the middle of writing a big checkpoint's second file.
fn child_writes_until_killed(dir: &Path, marker: &Path) {
    let mut writer = CheckpointWriter::begin(dir, 2, 4, JOB).unwrap();
    writer
        .add_file("weights.safetensors", &contents(2, "weights.safetensors", BIG_FILE_BYTES))
        .unwrap();
    writer
        .write_file("optimizer.safetensors", |out| {
            let chunk = contents(2, "optimizer.safetensors", 1024 * 1024);
            for _ in 0..8 {
                out.write_all(&chunk)?;
            }
            out.flush()?;
            fs::write(marker, b"mid-write")?;
            // Wait for the SIGKILL; if the parent goes away instead, stdin closes and this fails.
            let mut byte = [0u8];
            let n = std::io::stdin().read(&mut byte)?;
            panic!("the parent went away (read {n} bytes) instead of killing this writer");
        })
        .unwrap();
    unreachable!("the write never finishes");
}

#[test]
fn a_writer_killed_mid_write_leaves_the_previous_checkpoint() {
    const TEST: &str = "a_writer_killed_mid_write_leaves_the_previous_checkpoint";
    if std::env::var_os(CHILD_ROLE).is_some_and(|r| r == "mid-write") {
        let dir = PathBuf::from(std::env::var_os(CHILD_DIR).unwrap());
        let marker = PathBuf::from(std::env::var_os(CHILD_MARKER).unwrap());
        child_writes_until_killed(&dir, &marker);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let marker = tmp.path().join("child-is-mid-write");
    write_checkpoint(&dir, 1);

    let mut child = spawn_child(TEST, "mid-write", &dir, &marker);
    wait_for(&mut child, "the child to be in the middle of its write", || marker.exists());
    kill_9(child);

    // What the kill left: the finished checkpoint and a temporary directory with one whole file
    // and one partial one, no manifest.
    let names = names_in(&dir);
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(names[1], "step-00000001");
    let temp = dir.join(&names[0]);
    assert!(names[0].starts_with(".tmp-step-00000002-"), "{names:?}");
    assert_eq!(
        fs::metadata(temp.join("weights.safetensors")).unwrap().len(),
        BIG_FILE_BYTES as u64
    );
    assert!(temp.join("optimizer.safetensors").exists());
    assert!(!temp.join("manifest.json").exists());

    // Readers get the previous checkpoint; a new writer commits the step the killed one could not.
    assert_is_checkpoint_of(&newest_valid(&dir).unwrap().unwrap(), 1);
    write_checkpoint(&dir, 2);
    assert_is_checkpoint_of(&newest_valid(&dir).unwrap().unwrap(), 2);
}

/// The child's part: writes checkpoints of steps 1, 2, 3, ... as fast as it can, keeping 2, until
/// killed.
fn child_writes_checkpoints_forever(dir: &Path) {
    for step in 1.. {
        let mut writer = CheckpointWriter::begin(dir, step, 4, JOB).unwrap();
        writer
            .add_file("weights.safetensors", &contents(step, "weights.safetensors", 64 * 1024))
            .unwrap();
        writer
            .write_file("optimizer.safetensors", |out| {
                out.write_all(&contents(step, "optimizer.safetensors", 2 * 1024 * 1024))
            })
            .unwrap();
        writer.add_file("state.json", format!("{{\"step\":{step}}}").as_bytes()).unwrap();
        writer.commit().unwrap();
        prune(dir, 2).unwrap();
    }
}

#[test]
fn a_writer_killed_at_an_arbitrary_moment_leaves_only_complete_checkpoints() {
    const TEST: &str = "a_writer_killed_at_an_arbitrary_moment_leaves_only_complete_checkpoints";
    if std::env::var_os(CHILD_ROLE).is_some_and(|r| r == "forever") {
        child_writes_checkpoints_forever(&PathBuf::from(std::env::var_os(CHILD_DIR).unwrap()));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let mut child = spawn_child(TEST, "forever", &dir, &tmp.path().join("unused"));
    wait_for(&mut child, "the child to commit step 5", || {
        step_dirs(&dir).unwrap().first().is_some_and(|d| d.step >= 5)
    });
    kill_9(child);

    // Wherever the kill landed (writing a file, the manifest, renaming, pruning), every step
    // directory is complete, and the newest holds its own step's data.
    let dirs = step_dirs(&dir).unwrap();
    assert!(!dirs.is_empty());
    for d in &dirs {
        let checkpoint = checkpoint::verify(&d.path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            checkpoint.read_file("optimizer.safetensors").unwrap(),
            contents(d.step, "optimizer.safetensors", 2 * 1024 * 1024)
        );
    }
    let newest = newest_valid(&dir).unwrap().unwrap();
    assert_eq!(newest.step, dirs[0].step);
    assert_is_checkpoint_of(&newest, newest.step);
}
