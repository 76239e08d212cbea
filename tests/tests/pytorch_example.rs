//! The PyTorch example (deploy/examples/pytorch/train_ddp.py) and its doc
//! (docs/checkpoint-protocol.md) against fleetmend's own checkpoint code, without torch: the
//! example's protocol part is plain Python, and `--backend fake` runs its training loop with a
//! pure-Python stand-in model.

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
use serde_json::Value;

/// Longest wait for the example to print its next line or exit.
const LIMIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn example() -> PathBuf {
    repo().join("deploy/examples/pytorch/train_ddp.py")
}

/// Runs Python code with the example importable as `train_ddp`; returns stdout and stderr.
fn python(code: &str) -> (String, String) {
    let output = Command::new("python3")
        .arg("-c")
        .arg(code)
        .env("PYTHONPATH", example().parent().unwrap())
        // Nothing written into the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs");
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

    let (stdout, _) = python("import json, train_ddp; print(json.dumps(train_ddp.PROTOCOL_VARS))");
    let in_example: Vec<String> = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(in_example, vars::ALL);
}

#[test]
fn the_example_refuses_a_bad_environment_naming_every_problem() {
    let output = Command::new("python3")
        .arg(example())
        .args(["--backend", "fake"])
        .env_clear()
        .env("RANK", "two")
        .env("WORLD_SIZE", "4")
        .env("MASTER_PORT", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
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
import train_ddp
files = {{
    "weights.bin": bytes(range(256)) * 20000,             # 5 MB, several IO pieces
    "state.json": b'{{"step": 7}}',
    "empty": b"",
    "streamed.bin": lambda out: [out.write(b"xyz" * 1000) for _ in range(500)],
}}
print(train_ddp.write_checkpoint({dir:?}, 7, 4, "job-py", files))
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
        "import train_ddp; step, path, manifest = train_ddp.newest_valid_checkpoint({:?}); \
         print(step, manifest['job_id'])",
        dir.to_str().unwrap()
    ));
    assert_eq!(stdout.trim(), "3 job-rs");
    assert!(stderr.contains("checkpoint refused") && stderr.contains("(corrupted)"), "{stderr}");
    assert!(stderr.contains(&step_dir_name(5)), "{stderr}");
    // fleetmend agrees.
    assert_eq!(newest_valid(&dir).unwrap().unwrap().step, 3);
}

/// The example as a child, with the protocol's environment, its stdout lines on a channel.
struct Rank {
    child: Child,
    lines: Receiver<Value>,
}

impl Rank {
    fn start(checkpoint_dir: &Path, restart_count: u32, steps: u64) -> Rank {
        let mut child = Command::new("python3")
            .arg(example())
            .args(["--backend", "fake", "--checkpoint-every", "0", "--fake-step-seconds", "0.005"])
            .args(["--steps", &steps.to_string()])
            .env("RANK", "0")
            .env("WORLD_SIZE", "1")
            .env("LOCAL_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500")
            .env("FLEETMEND_JOB_ID", "job-fake")
            .env("FLEETMEND_CHECKPOINT_DIR", checkpoint_dir)
            .env("FLEETMEND_RESTART_COUNT", restart_count.to_string())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value: Value = serde_json::from_str(&line).expect("a JSON progress line");
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        Rank { child, lines }
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
    fn finish(mut self) -> (Vec<Value>, Option<i32>) {
        let deadline = Instant::now() + LIMIT;
        let mut rest = Vec::new();
        // The reader thread ends (and drops its sender) when the process closes stdout.
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => rest.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("the example did not exit within {LIMIT:?}");
                }
            }
        }
        let status = self.child.wait().unwrap();
        (rest, status.code())
    }
}

fn step_of(line: &Value) -> u64 {
    line["step"].as_u64().unwrap()
}

#[test]
fn sigusr1_checkpoints_and_trains_on_sigterm_checkpoints_and_exits_0_and_a_restart_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let rank = Rank::start(&dir, 0, 1_000_000);

    rank.line_where("step 5", |l| step_of(l) >= 5);
    rank.signal("USR1");
    let checkpointed = rank.line_where("a checkpoint", |l| l.get("checkpoint_step").is_some());
    let usr1_step = step_of(&checkpointed);
    assert_eq!(checkpointed["checkpoint_step"].as_u64(), Some(usr1_step));
    // It trains on after SIGUSR1.
    rank.line_where("a step after the checkpoint", |l| step_of(l) >= usr1_step + 3);
    let usr1_checkpoint = checkpoint::verify(dir.join(step_dir_name(usr1_step))).unwrap();
    assert_eq!(usr1_checkpoint.manifest.job_id, "job-fake");

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
        serde_json::from_slice(&newest.read_file("trainer_state.json").unwrap()).unwrap();
    assert_eq!(state["step"].as_u64(), Some(term_step));

    // A restart resumes from there and ends with a checkpoint of its last step.
    let rank = Rank::start(&dir, 1, term_step + 3);
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
        "import train_ddp\n\
         p = train_ddp.ProgressPoster({:?}, 'tok')\n\
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
