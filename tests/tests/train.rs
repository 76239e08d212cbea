//! System tests of `fleetmend train`: real trainer processes on 127.0.0.1, ranks meeting through
//! MASTER_ADDR/MASTER_PORT, killed and signalled for real; resumed runs must end with the same
//! weights hash, bit for bit, as uninterrupted ones.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_tests::{fleetmend_bin, free_port, poll_until};
use serde_json::Value;

/// Steps of the 4-rank runs: long enough to interrupt in the middle, short enough for a debug
/// build on two cores.
const STEPS: u64 = 24;
/// A dead peer must be noticed within this (the runs use it as --collective-timeout).
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a whole run may take here.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// One trainer process, its stdout lines and stderr collected on threads.
struct Rank {
    rank: usize,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<thread::JoinHandle<()>>,
}

impl Rank {
    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        self.lines()
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["event"] == kind)
            .collect()
    }

    /// The newest step this rank reported progress for.
    fn progress_step(&self) -> u64 {
        self.events("progress").last().and_then(|p| p["step"].as_u64()).unwrap_or(0)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.pid()).status();
        assert!(status.unwrap().success(), "kill -{signal} rank {}", self.rank);
    }

    /// Waits for the exit (killing it after `limit`), then for the output readers.
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(20));
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        status
    }

    fn describe(&self) -> String {
        format!(
            "rank {}:\n--- stdout\n{}\n--- stderr\n{}",
            self.rank,
            self.lines().join("\n"),
            self.stderr()
        )
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `world` ranks of `fleetmend train ARGS` meeting on a fresh port.
fn start_ranks(world: usize, args: &[String]) -> Vec<Rank> {
    let port = free_port();
    (0..world)
        .map(|rank| {
            let mut command = Command::new(fleetmend_bin());
            command.arg("train").args(args).stdin(Stdio::null());
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
            command.env_remove("FLEETMEND_CHECKPOINT_DIR").env_remove("FLEETMEND_PROGRESS_URL");
            if world > 1 {
                command
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", world.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string());
            } else {
                command.env_remove("RANK").env_remove("WORLD_SIZE");
            }
            let mut child = command.spawn().expect("spawn fleetmend train");
            let lines = Arc::new(Mutex::new(Vec::new()));
            let stderr = Arc::new(Mutex::new(String::new()));
            let stdout_pipe = child.stdout.take().unwrap();
            let stderr_pipe = child.stderr.take().unwrap();
            let out = lines.clone();
            let err = stderr.clone();
            let readers = vec![
                thread::spawn(move || {
                    for line in BufReader::new(stdout_pipe).lines().map_while(Result::ok) {
                        out.lock().unwrap().push(line);
                    }
                }),
                thread::spawn(move || {
                    let mut text = String::new();
                    let mut pipe = stderr_pipe;
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = pipe.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        text.push_str(&String::from_utf8_lossy(&buf[..n]));
                        *err.lock().unwrap() = text.clone();
                    }
                }),
            ];
            Rank { rank, child, lines, stderr, readers }
        })
        .collect()
}

/// Runs `world` ranks to completion; every rank must exit 0 and print the same done line, whose
/// weights hash is returned.
fn run_to_done(world: usize, args: &[String]) -> String {
    let mut ranks = start_ranks(world, args);
    let mut hashes = Vec::new();
    for rank in &mut ranks {
        let status = rank.wait(RUN_LIMIT);
        assert!(status.is_some_and(|s| s.success()), "{status:?}\n{}", rank.describe());
        hashes.push(done_hash(rank));
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "ranks disagree: {hashes:?}");
    hashes.remove(0)
}

/// The weights hash of the rank's last line, which must be the done line.
fn done_hash(rank: &Rank) -> String {
    let lines = rank.lines();
    let last: Value = lines
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no output\n{}", rank.describe()));
    assert_eq!(last["event"], "done", "last line is not the done line\n{}", rank.describe());
    last["weights_sha256"].as_str().unwrap().to_string()
}

fn flags(steps: u64, extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> =
        ["--steps", &steps.to_string(), "--seed", "7", "--progress-interval", "0s"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    flags.push(format!("--collective-timeout={}s", COLLECTIVE_TIMEOUT.as_secs()));
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

fn checkpoint_flags(steps: u64, dir: &Path, every: u64) -> Vec<String> {
    flags(
        steps,
        &["--checkpoint-dir", dir.to_str().unwrap(), "--checkpoint-every", &every.to_string()],
    )
}

/// A step in `range` that differs from run to run (printed, to reproduce a failure).
fn random_step(range: std::ops::Range<u64>) -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    let step = range.start + nanos % (range.end - range.start);
    eprintln!("interrupting at step {step}");
    step
}

fn step_dirs(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut dirs: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    fleetmend_runtime::checkpoint::parse_step_dir_name(&name)
                        .map(|step| (step, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

#[test]
fn a_rank_killed_at_a_random_step_fails_the_others_and_the_resumed_run_is_bit_exact() {
    let straight = run_to_done(4, &flags(STEPS, &[]));
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let args = checkpoint_flags(STEPS, &checkpoints, 4);

    let kill_at = random_step(9..STEPS - 4);
    let victim = (kill_at % 4) as usize;
    let mut ranks = start_ranks(4, &args);
    let reached = poll_until(RUN_LIMIT, || ranks[victim].progress_step() >= kill_at);
    assert!(reached, "never reached step {kill_at}\n{}", ranks[victim].describe());
    ranks[victim].signal("KILL");
    let killed_at = Instant::now();
    let _ = ranks[victim].wait(Duration::from_secs(10));
    for rank in ranks.iter_mut().filter(|r| r.rank != victim) {
        let status = rank.wait(COLLECTIVE_TIMEOUT + Duration::from_secs(15));
        assert!(status.is_some(), "rank {} still running after its peer died", rank.rank);
        assert!(!status.unwrap().success(), "rank {} exited 0\n{}", rank.rank, rank.describe());
        assert!(
            rank.stderr().contains("all-reduce") && rank.stderr().contains("failed"),
            "no clear error\n{}",
            rank.describe()
        );
    }
    let detected = killed_at.elapsed();
    assert!(
        detected < COLLECTIVE_TIMEOUT + Duration::from_secs(10),
        "took {detected:?} to notice the dead peer"
    );
    drop(ranks);
    let newest = step_dirs(&checkpoints).last().map(|(step, _)| *step);
    assert!(newest.is_some_and(|s| s > 0 && s < STEPS), "checkpoints: {newest:?}");

    let mut resumed = start_ranks(4, &args);
    let mut hashes = Vec::new();
    for rank in &mut resumed {
        let status = rank.wait(RUN_LIMIT);
        assert!(status.is_some_and(|s| s.success()), "{}", rank.describe());
        let start = rank.events("start");
        assert_eq!(start[0]["start_step"].as_u64(), newest, "{}", rank.describe());
        hashes.push(done_hash(rank));
    }
    assert!(hashes.iter().all(|h| *h == straight), "resumed {hashes:?} != straight {straight}");
}

#[test]
fn sigterm_to_one_rank_stops_every_rank_at_one_step_with_a_checkpoint_and_resume_is_bit_exact() {
    let straight = run_to_done(4, &flags(STEPS, &[]));
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    // No scheduled checkpoints: the one at the stop must come from the SIGTERM.
    let args = checkpoint_flags(STEPS, &checkpoints, 0);

    let stop_at = random_step(4..STEPS - 4);
    let target = 2;
    let mut ranks = start_ranks(4, &args);
    let reached = poll_until(RUN_LIMIT, || ranks[target].progress_step() >= stop_at);
    assert!(reached, "never reached step {stop_at}\n{}", ranks[target].describe());
    ranks[target].signal("TERM");
    let mut stopped_steps = Vec::new();
    for rank in &mut ranks {
        let status = rank.wait(Duration::from_secs(60));
        assert!(status.is_some_and(|s| s.success()), "{status:?}\n{}", rank.describe());
        let stopped = rank.events("stopped");
        assert_eq!(stopped.len(), 1, "{}", rank.describe());
        assert!(rank.events("done").is_empty(), "{}", rank.describe());
        stopped_steps.push(stopped[0]["step"].as_u64().unwrap());
    }
    let step = stopped_steps[0];
    assert!(stopped_steps.iter().all(|s| *s == step), "stopped at {stopped_steps:?}");
    assert!(step >= stop_at && step < STEPS, "stopped at {step}");
    let dirs = step_dirs(&checkpoints);
    assert_eq!(dirs.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![step]);
    let valid = fleetmend_runtime::checkpoint::verify(&dirs[0].1).unwrap();
    assert_eq!(valid.world_size(), 4);
    drop(ranks);

    let resumed = run_to_done(4, &args);
    assert_eq!(resumed, straight);
}

#[test]
fn sigusr1_mid_run_writes_a_complete_checkpoint_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let steps = 40u64;
    let args = checkpoint_flags(steps, &checkpoints, 0);
    let mut ranks = start_ranks(2, &args);
    let reached = poll_until(RUN_LIMIT, || ranks[1].progress_step() >= 5);
    assert!(reached, "{}", ranks[1].describe());
    // To rank 1: the request travels to rank 0 (the writer) in the all-reduce.
    ranks[1].signal("USR1");
    let written = poll_until(Duration::from_secs(60), || !ranks[0].events("checkpoint").is_empty());
    assert!(written, "no checkpoint after SIGUSR1\n{}", ranks[0].describe());
    let event = ranks[0].events("checkpoint").remove(0);
    let step = event["step"].as_u64().unwrap();
    assert!((5..steps).contains(&step), "{event}");
    let path = PathBuf::from(event["path"].as_str().unwrap());
    let valid = fleetmend_runtime::checkpoint::verify(&path).unwrap();
    assert_eq!(valid.step, step);
    let names: Vec<&str> = valid.file_names().collect();
    for name in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        assert!(names.contains(&name), "{names:?}");
    }
    let state: Value = serde_json::from_slice(&valid.read_file("state.json").unwrap()).unwrap();
    assert_eq!(state["step"].as_u64(), Some(step));
    assert_eq!(state["data_cursor"].as_u64(), Some(step));
    assert_eq!(state["world_size"].as_u64(), Some(2));
    // The stall (the in-memory copy) is reported with the write time.
    assert!(event["stall_seconds"].as_f64().unwrap() < event["write_seconds"].as_f64().unwrap());
    // Training went on to the end.
    for rank in &mut ranks {
        let status = rank.wait(RUN_LIMIT);
        assert!(status.is_some_and(|s| s.success()), "{}", rank.describe());
        let lines = rank.lines();
        let last: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(last["event"], "done");
        assert_eq!(last["step"].as_u64(), Some(steps));
    }
    let mut steps_written: Vec<u64> = step_dirs(&checkpoints).iter().map(|(s, _)| *s).collect();
    steps_written.dedup();
    assert_eq!(steps_written, vec![step, steps], "the SIGUSR1 checkpoint and the final one");
}

/// Corrupts the checkpoint of `step` in one of the ways disks and people do.
fn corrupt(checkpoints: &Path, step: u64, how: &str) {
    let path = checkpoints.join(fleetmend_runtime::checkpoint::step_dir_name(step));
    match how {
        "truncate" => {
            let file = path.join("model.safetensors");
            let len = std::fs::metadata(&file).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len / 2).unwrap();
        }
        "remove-manifest" => std::fs::remove_file(path.join("manifest.json")).unwrap(),
        "flip-byte" => {
            let file = path.join("optimizer.safetensors");
            let mut bytes = std::fs::read(&file).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            std::fs::File::create(&file).unwrap().write_all(&bytes).unwrap();
        }
        other => panic!("unknown corruption {other}"),
    }
}

#[test]
fn corrupted_checkpoints_are_skipped_with_the_reason_for_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let mut args = checkpoint_flags(STEPS, &checkpoints, 4);
    args.extend(["--keep".to_string(), "6".to_string()]);
    // One rank: the corruption handling is rank 0's alone.
    let straight = run_to_done(1, &args);
    let steps: Vec<u64> = step_dirs(&checkpoints).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, vec![4, 8, 12, 16, 20, 24]);

    // A truncated file in the newest: the previous one (20) is used.
    corrupt(&checkpoints, 24, "truncate");
    let mut ranks = start_ranks(1, &args);
    let status = ranks[0].wait(RUN_LIMIT);
    assert!(status.is_some_and(|s| s.success()), "{}", ranks[0].describe());
    let stderr = ranks[0].stderr();
    assert!(stderr.contains("step-00000024") && stderr.contains("refused"), "{stderr}");
    assert!(stderr.contains("resuming from") && stderr.contains("step-00000020"), "{stderr}");
    assert_eq!(ranks[0].events("start")[0]["start_step"].as_u64(), Some(20));
    assert_eq!(done_hash(&ranks[0]), straight);

    // The run rewrote 24. Now a missing manifest there and a flipped byte in 20: back to 16.
    corrupt(&checkpoints, 24, "remove-manifest");
    corrupt(&checkpoints, 20, "flip-byte");
    let mut ranks = start_ranks(1, &args);
    let status = ranks[0].wait(RUN_LIMIT);
    assert!(status.is_some_and(|s| s.success()), "{}", ranks[0].describe());
    let stderr = ranks[0].stderr();
    assert!(stderr.contains("manifest.json"), "missing manifest not named: {stderr}");
    assert!(stderr.contains("step-00000020") && stderr.contains("sha256"), "{stderr}");
    assert_eq!(ranks[0].events("start")[0]["start_step"].as_u64(), Some(16));
    assert_eq!(done_hash(&ranks[0]), straight);

    // A run that finds a checkpoint at --steps is done at once, with the same hash.
    let mut ranks = start_ranks(1, &args);
    let status = ranks[0].wait(RUN_LIMIT);
    assert!(status.is_some_and(|s| s.success()), "{}", ranks[0].describe());
    assert!(ranks[0].events("progress").is_empty(), "{}", ranks[0].describe());
    assert_eq!(done_hash(&ranks[0]), straight);
}

#[test]
fn a_checkpoint_of_another_model_is_refused_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let mut args = checkpoint_flags(2, &checkpoints, 0);
    run_to_done(1, &args);
    args.extend(["--model-dim".to_string(), "32".to_string()]);
    let mut ranks = start_ranks(1, &args);
    let status = ranks[0].wait(RUN_LIMIT).unwrap();
    assert_eq!(status.code(), Some(2), "{}", ranks[0].describe());
    let stderr = ranks[0].stderr();
    assert!(stderr.contains("another model") && stderr.contains("--model-dim 64"), "{stderr}");
}

#[test]
fn the_default_model_learns() {
    // Measured (seeds 0..3, 150 steps): loss 5.57–5.59 at step 1, 1.81–1.86 at step 150, ~1.9
    // from step 75 on. The bounds leave a wide margin.
    let mut ranks =
        start_ranks(1, &["--steps", "100", "--progress-interval", "0s"].map(String::from));
    let status = ranks[0].wait(RUN_LIMIT);
    assert!(status.is_some_and(|s| s.success()), "{}", ranks[0].describe());
    let losses: Vec<f64> =
        ranks[0].events("progress").iter().map(|p| p["loss"].as_f64().unwrap()).collect();
    assert_eq!(losses.len(), 100);
    let first = losses[0];
    let last10 = losses[90..].iter().sum::<f64>() / 10.0;
    assert!(first > 5.3, "initial loss {first} (≈ ln 256 = 5.55 expected)");
    assert!(last10 < 2.4, "loss over the last 10 steps {last10}, from {first}");
}

#[test]
fn progress_is_posted_and_the_queue_sets_the_checkpoint_interval() {
    // A stand-in for the queue: answers every post with checkpoint_every = 3.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/progress", listener.local_addr().unwrap());
    let posts = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = posts.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            while !request.ends_with(b"}") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            seen.lock().unwrap().push(String::from_utf8_lossy(&request).to_string());
            let body = br#"{"checkpoint_every":3}"#;
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let mut command = Command::new(fleetmend_bin());
    command
        .args(["train", "--steps", "30", "--checkpoint-every", "auto", "--keep", "20"])
        .args(["--progress-interval", "0s", "--checkpoint-dir", checkpoints.to_str().unwrap()])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env("FLEETMEND_PROGRESS_URL", &url)
        .env("FLEETMEND_PROGRESS_TOKEN", "secret-token")
        .env("FLEETMEND_JOB_ID", "job-7");
    let output = fleetmend_tests::run_with_timeout(&mut command, RUN_LIMIT);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let posts = posts.lock().unwrap().clone();
    assert!(!posts.is_empty(), "nothing posted");
    assert!(posts[0].starts_with("POST /v1/progress HTTP/1.1"), "{}", posts[0]);
    assert!(posts[0].contains("Authorization: Bearer secret-token"), "{}", posts[0]);
    assert!(posts[0].contains(r#""job":"job-7""#), "{}", posts[0]);
    // The fallback interval of auto is 100 steps: every checkpoint but the final one comes from
    // the queue's interval of 3.
    let steps: Vec<u64> = step_dirs(&checkpoints).iter().map(|(s, _)| *s).collect();
    assert!(steps.len() >= 5, "checkpoints at {steps:?}");
    assert!(steps.windows(2).all(|w| w[1] - w[0] <= 3), "checkpoints at {steps:?}");
}

#[test]
fn a_dead_progress_url_does_not_stop_training() {
    let port = free_port();
    let mut command = Command::new(fleetmend_bin());
    command
        .args(["train", "--steps", "5", "--progress-interval", "0s"])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("FLEETMEND_CHECKPOINT_DIR")
        .env("FLEETMEND_PROGRESS_URL", format!("http://127.0.0.1:{port}/v1/progress"));
    let output = fleetmend_tests::run_with_timeout(&mut command, RUN_LIMIT);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "done");
    assert!(stderr.contains("posting progress") && stderr.contains("training goes on"), "{stderr}");
}

/// `--pace`: two ranks of `fleetmend up`'s small model at 100 ms a step take at least that long
/// a step, and end with the weights the same job computes without the pace (the reference run of
/// a scenario drops the pace).
#[test]
fn a_paced_run_takes_its_pace_and_computes_what_an_unpaced_run_does() {
    const STEPS: u64 = 12;
    let model: Vec<&str> = fleetmend_local::up::TrainModel::Small.args().to_vec();
    let mut paced = model.clone();
    paced.extend(["--pace", "100ms"]);
    let started = Instant::now();
    let with_pace = run_to_done(2, &flags(STEPS, &paced));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(100 * STEPS), "{STEPS} steps at 100 ms took {took:?}");
    let without = run_to_done(2, &flags(STEPS, &model));
    assert_eq!(with_pace, without, "the pace changed the weights");
}
