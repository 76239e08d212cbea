//! System tests of the trainer's traces: a real `fleetmend train` process exporting over OTLP/gRPC
//! to an in-process receiver — `checkpoint` spans of a run, the `restore` span of its resumed run —
//! and a run whose collector is not there, which must train exactly as without traces and exit
//! promptly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fake_opentelemetry_collector::{ExportedSpan, FakeCollectorServer};
use fleetmend_tests::fleetmend_bin;
use serde_json::Value;

/// Longest a whole run may take here.
const RUN_LIMIT: Duration = Duration::from_secs(120);
/// How long the receiver is given for spans the trainer exported before it exited.
const RECEIVE_LIMIT: Duration = Duration::from_secs(10);
const JOB: &str = "traced-job";

/// A finished trainer run.
struct Finished {
    status: ExitStatus,
    lines: Vec<String>,
    stderr: String,
    /// From the done line on stdout to the process's exit.
    exit_after_done: Option<Duration>,
}

impl Finished {
    fn events(&self, kind: &str) -> Vec<Value> {
        self.lines
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["event"] == kind)
            .collect()
    }

    fn done_hash(&self) -> String {
        let done = self.events("done");
        assert_eq!(done.len(), 1, "one done line\n{}", self.describe());
        done[0]["weights_sha256"].as_str().unwrap().to_owned()
    }

    fn describe(&self) -> String {
        format!(
            "{:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.lines.join("\n"),
            self.stderr
        )
    }
}

/// Given each stdout line, the signal (`USR1`, `TERM`) to send the trainer then, if any.
type React = Box<dyn FnMut(&str) -> Option<&'static str> + Send>;

/// Runs one rank of `fleetmend train ARGS` to its exit (killed after [`RUN_LIMIT`]): a run of
/// one unless `ranks` gives RANK, WORLD_SIZE and MASTER_ADDR/PORT.
fn run_rank(
    args: &[String],
    restart_count: u32,
    ranks: &[(&str, String)],
    mut react: React,
) -> Finished {
    let mut command = Command::new(fleetmend_bin());
    command.arg("train").args(args).stdin(Stdio::null());
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
        .env_remove("FLEETMEND_CHECKPOINT_DIR")
        .env_remove("FLEETMEND_PROGRESS_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env("FLEETMEND_JOB_ID", JOB)
        .env("FLEETMEND_RESTART_COUNT", restart_count.to_string());
    command.envs(ranks.iter().map(|(k, v)| (k, v)));
    let mut child = command.spawn().expect("spawn fleetmend train");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let done_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stdout = child.stdout.take().unwrap();
    let mut stderr_pipe = child.stderr.take().unwrap();
    let (out, done) = (lines.clone(), done_at.clone());
    let pid = child.id().to_string();
    let stdout_reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(signal) = react(&line) {
                let sent = Command::new("kill").arg(format!("-{signal}")).arg(&pid).status();
                assert!(sent.unwrap().success(), "kill -{signal} {pid}");
            }
            if line.contains(r#""event":"done""#) {
                *done.lock().unwrap() = Some(Instant::now());
            }
            out.lock().unwrap().push(line);
        }
    });
    let stderr_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr_pipe.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + RUN_LIMIT;
    let (status, exited_at) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, Instant::now());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break (child.wait().unwrap(), Instant::now());
        }
        thread::sleep(Duration::from_millis(10));
    };
    stdout_reader.join().unwrap();
    let stderr = stderr_reader.join().unwrap();
    let exit_after_done = done_at.lock().unwrap().map(|at| exited_at.saturating_duration_since(at));
    let lines = lines.lock().unwrap().clone();
    Finished { status, lines, stderr, exit_after_done }
}

fn run_trainer(args: &[String], restart_count: u32) -> Finished {
    run_rank(args, restart_count, &[], Box::new(|_| None))
}

/// Runs `world` ranks of `fleetmend train ARGS` together, each to its exit.
async fn run_world(world: usize, args: Vec<String>, restart_count: u32) -> Vec<Finished> {
    let port = fleetmend_tests::free_port();
    let ranks = (0..world).map(|rank| {
        let args = args.clone();
        tokio::task::spawn_blocking(move || {
            let env = [
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", world.to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_owned()),
                ("MASTER_PORT", port.to_string()),
            ];
            run_rank(&args, restart_count, &env, Box::new(|_| None))
        })
    });
    let mut finished = Vec::new();
    for rank in ranks.collect::<Vec<_>>() {
        finished.push(rank.await.unwrap());
    }
    finished
}

fn train_flags(steps: u64, dir: &Path, every: u64, extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--steps",
        &steps.to_string(),
        "--seed",
        "11",
        "--progress-interval",
        "0s",
        "--checkpoint-dir",
        dir.to_str().unwrap(),
        "--checkpoint-every",
        &every.to_string(),
        "--keep",
        "10",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

/// Runs the trainer on a blocking thread, so the receiver keeps serving meanwhile.
async fn run_async(args: Vec<String>, restart_count: u32) -> Finished {
    tokio::task::spawn_blocking(move || run_trainer(&args, restart_count)).await.unwrap()
}

/// Every span the receiver has, waiting up to [`RECEIVE_LIMIT`] for at least `at_least`.
async fn spans(collector: &mut FakeCollectorServer, at_least: usize) -> Vec<ExportedSpan> {
    collector.exported_spans(at_least, RECEIVE_LIMIT).await
}

/// An attribute's value as the receiver shows it (the protobuf value's Debug form).
fn attribute<'a>(span: &'a ExportedSpan, key: &str) -> &'a str {
    span.attributes
        .get(key)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("{} has no {key}: {:?}", span.name, span.attributes))
}

/// The inner text of an attribute of protobuf kind `kind` (`IntValue`, `DoubleValue`, ...).
fn typed_attribute<'a>(span: &'a ExportedSpan, key: &str, kind: &str) -> &'a str {
    let text = attribute(span, key);
    text.strip_prefix("Some(AnyValue { value: Some(")
        .and_then(|t| t.strip_prefix(kind))
        .and_then(|t| t.strip_prefix('('))
        .and_then(|t| t.strip_suffix(")) })"))
        .unwrap_or_else(|| panic!("{key} of {} is not a {kind}: {text}", span.name))
}

fn int_attribute(span: &ExportedSpan, key: &str) -> i64 {
    typed_attribute(span, key, "IntValue").parse().unwrap()
}

fn double_attribute(span: &ExportedSpan, key: &str) -> f64 {
    typed_attribute(span, key, "DoubleValue").parse().unwrap()
}

fn string_attribute(span: &ExportedSpan, key: &str) -> String {
    serde_json::from_str(typed_attribute(span, key, "StringValue")).unwrap()
}

fn is_root(span: &ExportedSpan) -> bool {
    span.parent_span_id.chars().all(|c| c == '0')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_and_the_resumed_runs_restore_are_exported_as_spans() {
    let mut collector = FakeCollectorServer::start().await.expect("the OTLP receiver starts");
    let endpoint = collector.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");

    // Checkpoints at steps 4, 8 and 12 (interval) and 14 (the end of the run).
    let first =
        run_async(train_flags(14, &checkpoints, 4, &["--otlp-endpoint", &endpoint]), 0).await;
    assert!(first.status.success(), "{}", first.describe());
    let written: Vec<u64> =
        first.events("checkpoint").iter().map(|c| c["step"].as_u64().unwrap()).collect();
    assert_eq!(written, [4, 8, 12, 14], "{}", first.describe());

    let received = spans(&mut collector, written.len()).await;
    let mut checkpoint_spans: Vec<&ExportedSpan> =
        received.iter().filter(|s| s.name == "checkpoint").collect();
    assert!(
        received.iter().all(|s| s.name == "checkpoint"),
        "a fresh run exports checkpoint spans only: {received:#?}"
    );
    checkpoint_spans.sort_by_key(|s| s.start_time_unix_nano);
    let steps: Vec<i64> =
        checkpoint_spans.iter().map(|s| int_attribute(s, "fleetmend.checkpoint.step")).collect();
    assert_eq!(steps, [4, 8, 12, 14], "one span per checkpoint, in step order");
    for (span, event) in checkpoint_spans.iter().zip(first.events("checkpoint")) {
        assert!(is_root(span), "checkpoint spans are roots: {span:?}");
        assert!(
            span.end_time_unix_nano > span.start_time_unix_nano,
            "a positive duration: {span:?}"
        );
        assert_eq!(string_attribute(span, "fleetmend.job.id"), JOB);
        assert_eq!(int_attribute(span, "fleetmend.rank"), 0);
        assert_eq!(int_attribute(span, "fleetmend.attempt"), 0);
        assert_eq!(
            int_attribute(span, "fleetmend.checkpoint.bytes"),
            event["bytes"].as_i64().unwrap()
        );
        assert_eq!(string_attribute(span, "fleetmend.checkpoint.path"), event["path"]);
        assert!(double_attribute(span, "fleetmend.checkpoint.write_seconds") > 0.0);
        assert!(double_attribute(span, "fleetmend.checkpoint.stall_seconds") >= 0.0);
        // The span runs from the stall to the commit: at least the write itself.
        let span_seconds = (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e9;
        assert!(
            span_seconds >= event["write_seconds"].as_f64().unwrap() * 0.99,
            "{span_seconds} s span, write took {}",
            event["write_seconds"]
        );
        assert!(span.status.as_ref().is_none_or(|s| s.code != "STATUS_CODE_ERROR"), "{span:?}");
    }
    let triggers: Vec<String> = checkpoint_spans
        .iter()
        .map(|s| string_attribute(s, "fleetmend.checkpoint.trigger"))
        .collect();
    assert_eq!(triggers, ["interval", "interval", "interval", "final"]);

    // The job restarted: it resumes from the newest checkpoint (14) and goes on to 20.
    let second =
        run_async(train_flags(20, &checkpoints, 4, &["--otlp-endpoint", &endpoint]), 1).await;
    assert!(second.status.success(), "{}", second.describe());
    assert_eq!(second.events("start")[0]["start_step"], 14, "{}", second.describe());
    let received = spans(&mut collector, 3).await;
    let restores: Vec<&ExportedSpan> = received.iter().filter(|s| s.name == "restore").collect();
    assert_eq!(restores.len(), 1, "one restore span: {received:#?}");
    let restore = restores[0];
    assert!(is_root(restore));
    assert_eq!(int_attribute(restore, "fleetmend.restore.step"), 14);
    assert_eq!(
        string_attribute(restore, "fleetmend.restore.path"),
        first.events("checkpoint").last().unwrap()["path"]
    );
    assert_eq!(int_attribute(restore, "fleetmend.restore.skipped"), 0);
    assert!(restore.events.is_empty(), "nothing skipped: {:?}", restore.events);
    assert_eq!(string_attribute(restore, "fleetmend.restore.source"), "checkpoint");
    assert_eq!(string_attribute(restore, "fleetmend.job.id"), JOB);
    assert_eq!(int_attribute(restore, "fleetmend.attempt"), 1);
    assert!(restore.end_time_unix_nano > restore.start_time_unix_nano);
    assert!(double_attribute(restore, "fleetmend.restore.seconds") > 0.0);
    let resumed_steps: Vec<i64> = received
        .iter()
        .filter(|s| s.name == "checkpoint")
        .map(|s| {
            assert_eq!(int_attribute(s, "fleetmend.attempt"), 1);
            int_attribute(s, "fleetmend.checkpoint.step")
        })
        .collect();
    assert_eq!(resumed_steps, [18, 20], "the resumed run's checkpoints");
    assert!(
        restore.end_time_unix_nano
            <= received.iter().map(|s| s.start_time_unix_nano).max().unwrap()
    );
    collector.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_skips_a_damaged_checkpoint_records_why() {
    let mut collector = FakeCollectorServer::start().await.expect("the OTLP receiver starts");
    let endpoint = collector.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let first = run_async(train_flags(8, &checkpoints, 4, &[]), 0).await;
    assert!(first.status.success(), "{}", first.describe());
    let written = first.events("checkpoint");
    let newest = written.last().unwrap()["path"].as_str().unwrap().to_owned();
    // Damage the newest checkpoint's weights: its hash no longer matches the manifest.
    let model = std::fs::read_dir(&newest)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .expect("a safetensors file");
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&model, bytes).unwrap();

    let second =
        run_async(train_flags(12, &checkpoints, 0, &["--otlp-endpoint", &endpoint]), 1).await;
    assert!(second.status.success(), "{}", second.describe());
    assert_eq!(second.events("start")[0]["start_step"], 4, "{}", second.describe());
    let received = spans(&mut collector, 2).await;
    let restore = received.iter().find(|s| s.name == "restore").expect("a restore span");
    assert_eq!(int_attribute(restore, "fleetmend.restore.step"), 4);
    assert_eq!(int_attribute(restore, "fleetmend.restore.skipped"), 1);
    assert_eq!(restore.events.len(), 1, "{:?}", restore.events);
    let skipped = &restore.events[0];
    assert_eq!(skipped.name, "checkpoint skipped");
    let skipped_path = skipped.attributes.get("fleetmend.checkpoint.path").unwrap();
    assert!(skipped_path.contains(&newest), "{skipped_path} names {newest}");
    assert!(skipped.attributes.contains_key("fleetmend.reason"), "{:?}", skipped.attributes);
    collector.abort();
}

#[test]
fn training_with_no_collector_listening_ends_as_without_traces_and_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let plain = run_trainer(&train_flags(12, &dir.path().join("plain"), 4, &[]), 0);
    assert!(plain.status.success(), "{}", plain.describe());

    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let traced = run_trainer(
        &train_flags(12, &dir.path().join("traced"), 4, &["--otlp-endpoint", &endpoint]),
        0,
    );
    assert!(traced.status.success(), "{}", traced.describe());
    assert_eq!(traced.done_hash(), plain.done_hash(), "traces change nothing in training");
    let exit_after_done = traced.exit_after_done.unwrap();
    eprintln!("exited {exit_after_done:?} after its done line");
    assert!(
        exit_after_done < Duration::from_millis(2500),
        "exited {exit_after_done:?} after its done line\n{}",
        traced.describe()
    );
    let reports = traced.stderr.matches("exporting spans to").count();
    assert!(reports <= 1, "export failures are reported once at most\n{}", traced.stderr);

    // A collector that accepts connections and never answers: the export times out, the exit
    // still comes within the bound.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_endpoint = format!("http://{}", silent.local_addr().unwrap());
    let hung = run_trainer(
        &train_flags(12, &dir.path().join("hung"), 4, &["--otlp-endpoint", &silent_endpoint]),
        0,
    );
    assert!(hung.status.success(), "{}", hung.describe());
    assert_eq!(hung.done_hash(), plain.done_hash());
    let exit_after_done = hung.exit_after_done.unwrap();
    eprintln!("with a silent collector: exited {exit_after_done:?} after its done line");
    assert!(
        exit_after_done < Duration::from_millis(2500),
        "exited {exit_after_done:?} after its done line\n{}",
        hung.describe()
    );
    drop(silent);

    // OTEL_EXPORTER_OTLP_ENDPOINT is read when the flag is absent (a malformed one is refused by
    // name), and the flag wins over it.
    let short = |flag: Option<&str>| {
        let mut command = Command::new(fleetmend_bin());
        command
            .args(["train", "--steps", "1"])
            .args(flag.map(|f| ["--otlp-endpoint", f]).iter().flatten());
        command
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4317")
            .env_remove("FLEETMEND_CHECKPOINT_DIR")
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let from_env = short(None);
    assert_eq!(from_env.status.code(), Some(2), "{from_env:?}");
    let stderr = String::from_utf8_lossy(&from_env.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && stderr.contains("127.0.0.1:4317"),
        "{stderr}"
    );
    let flag_wins = short(Some(&endpoint));
    assert!(flag_wins.status.success(), "{flag_wins:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_ranks_rank_0_exports_the_checkpoints_and_each_rank_its_restore() {
    let mut collector = FakeCollectorServer::start().await.expect("the OTLP receiver starts");
    let endpoint = collector.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let flags = |steps| train_flags(steps, &checkpoints, 4, &["--otlp-endpoint", &endpoint]);

    let first = run_world(2, flags(8), 0).await;
    for rank in &first {
        assert!(rank.status.success(), "{}", rank.describe());
    }
    let received = spans(&mut collector, 2).await;
    let names: Vec<(&str, i64)> =
        received.iter().map(|s| (s.name.as_str(), int_attribute(s, "fleetmend.rank"))).collect();
    assert_eq!(names, [("checkpoint", 0), ("checkpoint", 0)], "rank 0 writes, rank 1 exports none");

    let resumed = run_world(2, flags(12), 1).await;
    for rank in &resumed {
        assert!(rank.status.success(), "{}", rank.describe());
    }
    let received = spans(&mut collector, 3).await;
    let mut restores: Vec<&ExportedSpan> =
        received.iter().filter(|s| s.name == "restore").collect();
    restores.sort_by_key(|s| int_attribute(s, "fleetmend.rank"));
    assert_eq!(restores.len(), 2, "a restore span per rank: {received:#?}");
    for (rank, (span, source)) in restores.iter().zip(["checkpoint", "rank 0"]).enumerate() {
        assert_eq!(int_attribute(span, "fleetmend.rank"), rank as i64);
        assert_eq!(int_attribute(span, "fleetmend.world_size"), 2);
        assert_eq!(int_attribute(span, "fleetmend.attempt"), 1);
        assert_eq!(int_attribute(span, "fleetmend.restore.step"), 8, "rank {rank}");
        assert_eq!(string_attribute(span, "fleetmend.restore.source"), source);
    }
    let checkpoint_ranks: Vec<i64> = received
        .iter()
        .filter(|s| s.name == "checkpoint")
        .map(|s| int_attribute(s, "fleetmend.rank"))
        .collect();
    assert_eq!(checkpoint_ranks, [0], "the resumed run's final checkpoint, from rank 0");
    collector.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_span_names_the_signal_that_asked_for_it() {
    let mut collector = FakeCollectorServer::start().await.expect("the OTLP receiver starts");
    let endpoint = collector.endpoint();
    let dir = tempfile::tempdir().unwrap();
    // No interval: SIGUSR1 once training runs, SIGTERM once that checkpoint is written.
    let args = train_flags(100_000, &dir.path().join("ckpt"), 0, &["--otlp-endpoint", &endpoint]);
    let (mut sent_usr1, mut sent_term) = (false, false);
    let react: React = Box::new(move |line| {
        let event: Value = serde_json::from_str(line).ok()?;
        if event["event"] == "progress" && event["step"].as_u64() >= Some(3) && !sent_usr1 {
            sent_usr1 = true;
            return Some("USR1");
        }
        if event["event"] == "checkpoint" && !sent_term {
            sent_term = true;
            return Some("TERM");
        }
        None
    });
    let stopped =
        tokio::task::spawn_blocking(move || run_rank(&args, 0, &[], react)).await.unwrap();
    assert!(stopped.status.success(), "{}", stopped.describe());
    let written: Vec<u64> =
        stopped.events("checkpoint").iter().map(|c| c["step"].as_u64().unwrap()).collect();
    assert_eq!(written.len(), 2, "{}", stopped.describe());
    let mut received = spans(&mut collector, 2).await;
    received.sort_by_key(|s| s.start_time_unix_nano);
    let triggers: Vec<(i64, String)> = received
        .iter()
        .map(|s| {
            let step = int_attribute(s, "fleetmend.checkpoint.step");
            (step, string_attribute(s, "fleetmend.checkpoint.trigger"))
        })
        .collect();
    assert_eq!(
        triggers,
        [(written[0] as i64, "sigusr1".to_owned()), (written[1] as i64, "sigterm".to_owned())]
    );
    collector.abort();
}
