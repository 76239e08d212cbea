//! The `fleetmend` Python package (python/), its PyTorch example
//! (deploy/examples/pytorch/train_ddp.py) and the doc (docs/checkpoint-protocol.md) against
//! fleetmend's own checkpoint code, with real torch: the package's plain part
//! (`fleetmend.protocol`) with python3, the example under torch (CPU, gloo) from the venv
//! `scripts/test` installs (`FLEETMEND_TORCH_PYTHON`), a world of one run directly and two ranks
//! under torchrun.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use fleetmend_runtime::checkpoint::{
    self, CheckpointWriter, MANIFEST_FILE, newest_valid, step_dir_name, vars,
};
use fleetmend_tests::torch_python;
use serde_json::Value;

/// Longest wait for the example to print its next line or exit.
const LIMIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn example() -> PathBuf {
    repo().join("deploy/examples/pytorch/train_ddp.py")
}

/// The package importable, nothing written into the source tree.
fn with_package(command: &mut Command) -> &mut Command {
    command.env("PYTHONPATH", repo().join("python")).env("PYTHONDONTWRITEBYTECODE", "1")
}

/// Runs Python code with the package's plain part importable as `fm`; returns stdout and stderr.
fn python(code: &str) -> (String, String) {
    let code = format!("import fleetmend.protocol as fm\n{code}");
    let output =
        with_package(Command::new("python3").arg("-c").arg(code)).output().expect("python3 runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(output.status.success(), "python failed: {stderr}");
    (stdout, stderr)
}

#[test]
fn the_example_compiles() {
    let tmp = tempfile::tempdir().unwrap();
    let compiled = tmp.path().join("train_ddp.pyc");
    let status = Command::new("python3")
        .args(["-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"])
        .arg(example())
        .arg(&compiled)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(compiled.is_file());
}

#[test]
fn the_doc_and_the_example_name_exactly_the_protocol_variables() {
    let doc = std::fs::read_to_string(repo().join("docs/checkpoint-protocol.md")).unwrap();
    let table = doc
        .split_once("<!-- protocol-env:begin -->")
        .and_then(|(_, rest)| rest.split_once("<!-- protocol-env:end -->"))
        .expect("the doc marks its environment table")
        .0;
    let documented: Vec<&str> = table
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split_once('`').map(|(name, _)| name))
        .collect();
    assert_eq!(documented, vars::ALL);

    let (stdout, _) = python("import json; print(json.dumps(fm.PROTOCOL_VARS))");
    let in_example: Vec<String> = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(in_example, vars::ALL);
}

#[test]
fn the_example_refuses_a_bad_environment_naming_every_problem() {
    let output = with_package(Command::new(torch_python()).arg(example()).env_clear())
        .env("RANK", "two")
        .env("WORLD_SIZE", "4")
        .env("MASTER_PORT", "0")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for var in [
        "RANK='two'",
        "LOCAL_RANK is not set",
        "MASTER_ADDR is not set",
        "MASTER_PORT='0'",
        "FLEETMEND_JOB_ID is not set",
        "FLEETMEND_CHECKPOINT_DIR is not set",
        "FLEETMEND_RESTART_COUNT is not set",
    ] {
        assert!(stderr.contains(var), "{var} not named in: {stderr}");
    }
}

#[test]
fn checkpoints_the_example_writes_verify_with_fleetmends_reader_and_match_its_format() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    python(&format!(
        r#"
files = {{
    "weights.bin": bytes(range(256)) * 20000,             # 5 MB, several IO pieces
    "state.json": b'{{"step": 7}}',
    "empty": b"",
    "streamed.bin": lambda out: [out.write(b"xyz" * 1000) for _ in range(500)],
}}
print(fm.write_checkpoint({dir:?}, 7, 4, "job-py", files))
"#,
        dir = dir.to_str().unwrap()
    ));
    let path = dir.join(step_dir_name(7));
    let valid = checkpoint::verify(&path).unwrap();
    assert_eq!((valid.step, valid.world_size()), (7, 4));
    assert_eq!(valid.manifest.job_id, "job-py");
    let names: Vec<&str> = valid.file_names().collect();
    assert_eq!(names, ["empty", "state.json", "streamed.bin", "weights.bin"]);

    let loaded = checkpoint::load(&path).unwrap();
    let weights: Vec<u8> = (0..20000).flat_map(|_| 0..=255u8).collect();
    assert!(loaded.file("weights.bin") == Some(&weights[..]), "weights.bin differs");
    assert_eq!(loaded.file("state.json"), Some(&br#"{"step": 7}"#[..]));
    assert_eq!(loaded.file("empty"), Some(&b""[..]));
    assert_eq!(loaded.file("streamed.bin").map(<[u8]>::len), Some(1_500_000));

    // The manifest is byte for byte what fleetmend itself would write for this content.
    let text = std::fs::read_to_string(path.join(MANIFEST_FILE)).unwrap();
    let mut ours = serde_json::to_string_pretty(&valid.manifest).unwrap();
    ours.push('\n');
    assert_eq!(text, ours);
    // And nothing else was left behind: no temporary directory.
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(entries, [step_dir_name(7)]);
}

#[test]
fn the_example_resumes_from_fleetmend_checkpoints_skipping_a_corrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    for step in [3u64, 5] {
        let mut writer = CheckpointWriter::begin(&dir, step, 2, "job-rs").unwrap();
        writer.add_file("weights.bin", &vec![step as u8; 100_000]).unwrap();
        writer.commit().unwrap();
    }
    // Same size, one byte changed: only the hash tells.
    let corrupted = dir.join(step_dir_name(5)).join("weights.bin");
    let mut bytes = std::fs::read(&corrupted).unwrap();
    bytes[50_000] ^= 0xff;
    std::fs::write(&corrupted, bytes).unwrap();

    let (stdout, stderr) = python(&format!(
        "step, path, manifest = fm.newest_valid_checkpoint({:?}); \
         print(step, manifest['job_id'])",
        dir.to_str().unwrap()
    ));
    assert_eq!(stdout.trim(), "3 job-rs");
    assert!(stderr.contains("checkpoint refused") && stderr.contains("(corrupted)"), "{stderr}");
    assert!(stderr.contains(&step_dir_name(5)), "{stderr}");
    // fleetmend agrees.
    assert_eq!(newest_valid(&dir).unwrap().unwrap().step, 3);
}

/// The example as a child, with the protocol's environment, its stdout lines on a channel and
/// its stderr (the package's log lines, torchrun's) in a file.
struct Rank {
    child: Child,
    lines: Receiver<Value>,
    log: tempfile::NamedTempFile,
}

/// A port free on loopback now (for a process group's rendezvous).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Rank {
    /// The example as a world of one (`ranks` 1, the protocol's environment set here) or as
    /// `ranks` ranks under torchrun (which sets the ranks' part of it), stepping `steps`.
    fn start(checkpoint_dir: &Path, restart_count: u32, ranks: u32, args: &[&str]) -> Rank {
        let mut command = Command::new(torch_python());
        let log = tempfile::NamedTempFile::new().unwrap();
        let port = free_port().to_string();
        if ranks > 1 {
            let nproc = ranks.to_string();
            command.args(["-m", "torch.distributed.run", "--nproc-per-node", &nproc]);
            command.args(["--master-addr", "127.0.0.1", "--master-port", &port]);
        } else {
            command.env("RANK", "0").env("WORLD_SIZE", "1").env("LOCAL_RANK", "0");
            command.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", &port);
        }
        let mut child = with_package(command.arg(example()).args(args))
            .env("FLEETMEND_JOB_ID", "job-torch")
            .env("FLEETMEND_CHECKPOINT_DIR", checkpoint_dir)
            .env("FLEETMEND_RESTART_COUNT", restart_count.to_string())
            .env("OMP_NUM_THREADS", "1")
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // torchrun's own lines go to stderr; a rank's stdout is its JSON lines.
                let Ok(value) = serde_json::from_str::<Value>(&line) else { continue };
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        Rank { child, lines, log }
    }

    /// What it wrote to stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// The next progress line that satisfies `want`; fails the test past the limit.
    fn line_where(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no progress line with {what} within {LIMIT:?}"));
            if want(&line) {
                return line;
            }
        }
    }

    fn signal(&self, name: &str) {
        let status =
            Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status();
        assert!(status.unwrap().success(), "kill -{name}");
    }

    /// Every remaining line and the exit code, once it exited; fails the test past the limit.
    fn finish(self) -> (Vec<Value>, Option<i32>) {
        let (rest, code, _) = self.finish_with_log();
        (rest, code)
    }

    /// [`Rank::finish`], with what it wrote to stderr.
    fn finish_with_log(mut self) -> (Vec<Value>, Option<i32>, String) {
        let deadline = Instant::now() + LIMIT;
        let mut rest = Vec::new();
        // The reader thread ends (and drops its sender) when the process closes stdout.
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => rest.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("the example did not exit within {LIMIT:?}: {}", self.log());
                }
            }
        }
        let status = self.child.wait().unwrap();
        (rest, status.code(), self.log())
    }
}

fn step_of(line: &Value) -> u64 {
    line["step"].as_u64().unwrap()
}

#[test]
fn sigusr1_checkpoints_and_trains_on_sigterm_checkpoints_and_exits_0_and_a_restart_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let rank = Rank::start(
        &dir,
        0,
        1,
        &["--steps", "1000000", "--checkpoint-every", "0", "--step-seconds", "0.005"],
    );

    rank.line_where("step 5", |l| step_of(l) >= 5);
    rank.signal("USR1");
    let checkpointed = rank.line_where("a checkpoint", |l| l.get("checkpoint_step").is_some());
    let usr1_step = step_of(&checkpointed);
    assert_eq!(checkpointed["checkpoint_step"].as_u64(), Some(usr1_step));
    // It trains on after SIGUSR1.
    rank.line_where("a step after the checkpoint", |l| step_of(l) >= usr1_step + 3);
    let usr1_checkpoint = checkpoint::verify(dir.join(step_dir_name(usr1_step))).unwrap();
    assert_eq!(usr1_checkpoint.manifest.job_id, "job-torch");

    rank.signal("TERM");
    let (rest, code) = rank.finish();
    assert_eq!(code, Some(0), "exit after SIGTERM");
    let last = rest.last().expect("at least the SIGTERM step's line");
    let term_step = step_of(last);
    assert!(term_step > usr1_step);
    assert_eq!(last["checkpoint_step"].as_u64(), Some(term_step), "{last}");
    let newest = newest_valid(&dir).unwrap().unwrap();
    assert_eq!(newest.step, term_step);
    let state: Value =
        serde_json::from_slice(&newest.read_file("job_state.json").unwrap()).unwrap();
    assert_eq!(state["step"].as_u64(), Some(term_step));

    // A restart resumes from there and ends with a checkpoint of its last step.
    let steps = (term_step + 3).to_string();
    let rank = Rank::start(&dir, 1, 1, &["--steps", &steps, "--checkpoint-every", "0"]);
    let first = rank.line_where("the first step", |_| true);
    assert_eq!(first["start_step"].as_u64(), Some(term_step));
    assert_eq!(first["attempt"].as_u64(), Some(1));
    assert_eq!(step_of(&first), term_step + 1);
    let (_, code) = rank.finish();
    assert_eq!(code, Some(0));
    assert_eq!(newest_valid(&dir).unwrap().unwrap().step, term_step + 3);
}

/// Takes one HTTP request on `listener`, answers it `response`; returns the request line and body.
fn answer_one(listener: &std::net::TcpListener, response: &str) -> (String, String) {
    use std::io::{Read, Write};
    let (mut stream, _) = listener.accept().unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    let (head, body) = loop {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the connection closed before a whole request");
        request.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&request).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .map_or(0, |v| v.parse::<usize>().unwrap());
            if body.len() >= length {
                break (head.to_owned(), body.to_owned());
            }
        }
    };
    stream.write_all(response.as_bytes()).unwrap();
    (head.lines().next().unwrap().to_owned(), body)
}

#[test]
fn a_standby_s_503_sends_the_example_s_progress_to_the_leader_it_names() {
    use std::net::TcpListener;
    let standby = TcpListener::bind("127.0.0.1:0").unwrap();
    let leader = TcpListener::bind("127.0.0.1:0").unwrap();
    let leader_url = format!("http://{}", leader.local_addr().unwrap());
    let standby_url = format!("http://{}", standby.local_addr().unwrap());
    let leader_base = leader_url.clone();
    let served = thread::spawn(move || {
        let refused = "{\"error\":\"this repairer is a standby\"}";
        let to_standby = answer_one(
            &standby,
            &format!(
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nFleetmend-Leader: {leader_url}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{refused}",
                refused.len()
            ),
        );
        let accepted = "{\"checkpoint_every\":7}";
        let to_leader = answer_one(
            &leader,
            &format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{accepted}",
                accepted.len()
            ),
        );
        (to_standby, to_leader)
    });
    let (stdout, stderr) = python(&format!(
        "p = fm.ProgressPoster({:?}, 'tok')\n\
         print(p.post({{'step': 3}}))\n\
         print(p.url)\n",
        format!("{standby_url}/v1/jobs/job-py/progress")
    ));
    let ((standby_line, standby_body), (leader_line, leader_body)) = served.join().unwrap();
    assert_eq!(standby_line, "POST /v1/jobs/job-py/progress HTTP/1.1");
    assert_eq!(leader_line, standby_line, "the same post, to the leader");
    assert_eq!(serde_json::from_str::<Value>(&leader_body).unwrap()["step"], 3);
    assert_eq!(leader_body, standby_body);
    let printed: Vec<&str> = stdout.lines().collect();
    assert_eq!(printed[0], "7", "the leader's answer is the post's: {stdout}");
    assert_eq!(printed[1], format!("{leader_base}/v1/jobs/job-py/progress"), "later posts too");
    assert!(stderr.contains("progress goes to the leading repairer"), "{stderr}");
}

/// Runs the example to its end under `ranks` ranks; returns the final weights' digest every
/// rank printed in its `done` line (they agree), the first step line and the log.
fn run_to_end(dir: &Path, restart_count: u32, ranks: u32, steps: u64) -> (String, Value, String) {
    let steps = steps.to_string();
    let rank =
        Rank::start(dir, restart_count, ranks, &["--steps", &steps, "--checkpoint-every", "10"]);
    let first = rank.line_where("the first step", |l| l.get("step").is_some());
    let (rest, code, log) = rank.finish_with_log();
    assert_eq!(code, Some(0), "{log}");
    let digests: Vec<&str> = rest
        .iter()
        .filter(|l| l["event"] == "done")
        .filter_map(|l| l["weights_sha256"].as_str())
        .collect();
    assert_eq!(digests.len(), ranks as usize, "a done line per rank: {rest:?}\n{log}");
    assert!(digests.iter().all(|d| *d == digests[0]), "the ranks disagree: {digests:?}");
    (digests[0].to_owned(), first, log)
}

#[test]
fn a_two_rank_torchrun_job_stopped_and_resumed_ends_with_the_weights_of_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, _, _) = run_to_end(&tmp.path().join("whole"), 0, 2, 40);
    let dir = tmp.path().join("stopped");
    let (at_25, _, _) = run_to_end(&dir, 0, 2, 25);
    assert_ne!(at_25, whole);
    let (resumed, first, log) = run_to_end(&dir, 1, 2, 40);
    assert_eq!(first["start_step"].as_u64(), Some(25), "{log}");
    assert_eq!(first["attempt"].as_u64(), Some(1));
    assert_eq!(resumed, whole, "the resumed run's weights differ from the uninterrupted run's");
    // Every rank wrote its own part, and fleetmend's own reader verifies the checkpoint.
    let newest = newest_valid(&dir).unwrap().unwrap();
    assert_eq!((newest.step, newest.world_size()), (40, 2));
    let names: Vec<&str> = newest.file_names().collect();
    assert_eq!(names, ["__0_0.distcp", "__1_0.distcp", "dcp.metadata", "job_state.json"]);
}

#[test]
fn a_truncated_part_of_the_newest_checkpoint_is_refused_and_named_and_the_one_before_used() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, _, _) = run_to_end(&tmp.path().join("whole"), 0, 2, 40);
    let dir = tmp.path().join("ckpt");
    run_to_end(&dir, 0, 2, 25);
    let part = dir.join(step_dir_name(25)).join("__1_0.distcp");
    let bytes = std::fs::read(&part).unwrap();
    std::fs::write(&part, &bytes[..bytes.len() / 2]).unwrap();
    let (resumed, first, log) = run_to_end(&dir, 1, 2, 40);
    assert_eq!(first["start_step"].as_u64(), Some(20), "{log}");
    assert!(log.contains("checkpoint refused") && log.contains(&step_dir_name(25)), "{log}");
    assert!(log.contains("'__1_0.distcp'") && log.contains("truncated"), "{log}");
    assert_eq!(resumed, whole);
}

#[test]
fn a_rank_killed_with_sigkill_is_resumed_from_the_last_periodic_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, _, _) = run_to_end(&tmp.path().join("whole"), 0, 2, 60);
    let dir = tmp.path().join("ckpt");
    let args = ["--steps", "60", "--checkpoint-every", "10", "--step-seconds", "0.05"];
    let run = Rank::start(&dir, 0, 2, &args);
    run.line_where("the checkpoint of step 20", |l| {
        l.get("checkpoint_step").and_then(Value::as_u64).is_some_and(|s| s >= 20)
    });
    // One of torchrun's two ranks, killed outright.
    let ranks = Command::new("pgrep").arg("-P").arg(run.child.id().to_string()).output().unwrap();
    let pids = String::from_utf8_lossy(&ranks.stdout).into_owned();
    let victim = pids.split_whitespace().last().unwrap_or_else(|| panic!("no rank processes"));
    assert!(Command::new("kill").args(["-KILL", victim]).status().unwrap().success());
    let (_, code, log) = run.finish_with_log();
    assert_ne!(code, Some(0), "torchrun exits non-zero when a rank was killed");
    let last = newest_valid(&dir).unwrap().unwrap().step;
    assert!(
        last >= 20 && last.is_multiple_of(10) && last < 60,
        "newest {last}: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    let (resumed, first, log) = run_to_end(&dir, 1, 2, 60);
    assert_eq!(first["start_step"].as_u64(), Some(last), "{log}");
    assert_eq!(resumed, whole);
}

/// The package's own tests (python/tests, the standard library's unittest) pass.
#[test]
fn the_package_s_own_tests_pass() {
    let output = with_package(&mut Command::new("python3"))
        .args(["-m", "unittest", "discover", "-s"])
        .arg(repo().join("python/tests"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("OK"), "{stderr}");
}

/// `pip install ./python` installs it: the package and its type marker, importable from where
/// it went.
#[test]
fn pip_installs_the_package_with_its_type_marker() {
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("src");
    // A copy, so the build's files stay out of the source tree.
    let copied =
        Command::new("cp").arg("-r").arg(repo().join("python")).arg(&source).status().unwrap();
    assert!(copied.success());
    let target = tmp.path().join("installed");
    let output = Command::new(torch_python())
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(["--no-build-isolation", "--no-deps", "--target"])
        .arg(&target)
        .arg(&source)
        .env("PIP_NO_INPUT", "1")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(target.join("fleetmend/py.typed").is_file());
    let imported = Command::new(torch_python())
        .args(["-c", "import fleetmend, fleetmend.torch; print(fleetmend.torch.__file__)"])
        .env("PYTHONPATH", &target)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&imported.stdout);
    assert!(imported.status.success(), "{}", String::from_utf8_lossy(&imported.stderr));
    assert!(printed.trim().starts_with(target.to_str().unwrap()), "{printed}");
}
