//! Job health on `fleetmend up` (the embedded queue, 4 working nodes and a hot spare, a small model
//! at a GPU's pace): a rank
//! stopped with SIGSTOP (`fleetmend inject NODE hang`) under a 600 s collective timeout, PyTorch's
//! NCCL default, is found hung by the queue from the ranks' progress heartbeats within 30 s, the
//! rank that did not arrive is named, and the job is stopped and restarted from its newest
//! checkpoint; it completes with the uninterrupted run's weights. A NaN put into a rank's gradient
//! (`fleetmend inject NODE nan`) makes the loss NaN: the queue stops the job and it resumes from
//! the newest checkpoint, which the trainer wrote before the NaN reached the weights. A rank whose
//! processes keep half their CPU in a cgroup (`fleetmend inject NODE slow:50`, real CFS throttling)
//! is a straggler within 60 s (2 working nodes training the trainer's own model, every step
//! computed): its node is drained, the hot spare takes its place at the checkpoint, and the job
//! completes with the same weights.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use fleetmend_tests::{Up, fleetmend_bin, poll_until, uninterrupted_hash};

const STEPS: u64 = 150;
const LIMIT: Duration = Duration::from_secs(100);
/// The bound from the hang to the queue's decision.
const HANG_DECIDED_WITHIN: Duration = Duration::from_secs(30);

/// The newest step of the job's line in `up`'s output.
fn newest_step(text: &str) -> Option<u64> {
    text.lines().rev().filter(|l| l.contains("job j-1 running")).find_map(|l| {
        let (_, rest) = l.split_once(", step ")?;
        rest.split('/').next()?.parse().ok()
    })
}

/// How a test's job trains: its ranks, `fleetmend up`'s flags that shape it, and the trainer flags
/// they come to (for the uninterrupted reference run).
struct Shape {
    ranks: u32,
    up: &'static [&'static str],
    train: &'static [&'static str],
}

/// A small model at a GPU's pace: the hang and the NaN are the queue's to find, not the CPU's to
/// compute, and the job leaves the machine's cores to the tests beside it.
fn paced() -> Shape {
    Shape {
        ranks: 4,
        up: &["--model", "small", "--pace", "125ms"],
        train: fleetmend_local::up::TrainModel::Small.args(),
    }
}

/// The uninterrupted run's weights hash for the job `fleetmend up` runs (seed 0).
fn straight_hash(steps: u64, shape: &Shape) -> String {
    let reference = tempfile::tempdir().unwrap();
    let mut argv: Vec<String> = [
        fleetmend_bin().display().to_string(),
        "train".to_owned(),
        "--steps".to_owned(),
        steps.to_string(),
        "--checkpoint-every".to_owned(),
        "10".to_owned(),
        "--seed".to_owned(),
        "0".to_owned(),
    ]
    .into();
    argv.extend(shape.train.iter().map(|a| (*a).to_owned()));
    uninterrupted_hash(reference.path(), argv, shape.ranks, LIMIT)
}

/// `fleetmend up` with a 600 s collective timeout, once its job trains past step 20.
fn up_training(dir: &Path, steps: u64, shape: &Shape) -> Up {
    let steps = steps.to_string();
    let nodes = shape.ranks.to_string();
    let mut args =
        vec!["--steps", &steps, "--checkpoint-every", "10", "--collective-timeout", "600s"];
    args.extend(["--nodes", &nodes]);
    args.extend(shape.up);
    let up = Up::start(dir, &dir.join("state"), &args);
    let training = poll_until(LIMIT, || newest_step(&up.stdout()).is_some_and(|s| s >= 20));
    assert!(training, "the job did not train:\n{}", up.output());
    up
}

/// `fleetmend inject` of `fault` on node-2; what it said.
fn inject(dir: &Path, fault: &str) -> String {
    Up::inject(&dir.join("state"), "node-2", fault)
}

#[test]
fn a_stopped_rank_is_found_hung_long_before_the_collective_timeout_and_the_job_resumes() {
    let straight = straight_hash(STEPS, &paced());
    let dir = tempfile::tempdir().unwrap();
    let mut up = up_training(dir.path(), STEPS, &paced());
    let said = inject(dir.path(), "hang");
    assert!(said.contains("hang: ") && said.contains("SIGSTOP"), "{said}");
    let stopped_at = Instant::now();

    // The queue decides from the heartbeats, not from the collective's 600 s timeout.
    let decided = poll_until(HANG_DECIDED_WITHIN + Duration::from_secs(10), || {
        up.stdout().contains("job-hung")
    });
    let took = stopped_at.elapsed();
    assert!(decided, "no hang decided:\n{}", up.output());
    assert!(took <= HANG_DECIDED_WITHIN, "the hang was decided after {took:?}:\n{}", up.output());
    let text = up.stdout();
    let hung = text.lines().find(|l| l.contains("job-hung")).unwrap_or_default();
    // The stopped rank's successor waits for it and says so; its own posts stopped.
    let named = hung.split_once("did not arrive: ").map(|(_, n)| n).unwrap_or_default();
    assert!(named.starts_with("rank ") && named.ends_with(" on node-2"), "{hung}");
    assert!(!named.contains(','), "only the stopped rank is named: {hung}");

    let text = up.completes_with(
        LIMIT * 2,
        &straight,
        &["restarts 1", "requeued at the front (restart 1 of 10) after: hung"],
    );
    // No collective timed out: the ranks were stopped before it could.
    assert!(!text.contains("made no progress for 10m"), "{}", up.output());
}

#[test]
fn a_nan_loss_stops_the_job_and_it_resumes_from_the_checkpoint_before() {
    let straight = straight_hash(STEPS, &paced());
    let dir = tempfile::tempdir().unwrap();
    let mut up = up_training(dir.path(), STEPS, &paced());
    let said = inject(dir.path(), "nan");
    assert!(said.contains("nan: ") && said.contains("SIGUSR2"), "{said}");
    let seen = poll_until(LIMIT, || up.stdout().contains("job-loss-not-finite"));
    assert!(seen, "no job-loss-not-finite event:\n{}", up.output());
    // The weights hash equals the uninterrupted run's: no NaN reached a checkpoint the job
    // resumed from.
    up.completes_with(
        LIMIT * 2,
        &straight,
        &[
            "the loss was not finite at step",
            "requeued at the front (restart 1 of 10) after: the loss was not finite",
        ],
    );
}

#[test]
fn a_rank_throttled_to_half_its_cpu_is_a_straggler_and_the_spare_takes_its_place() {
    // Long enough for the warm-up and the window (15 posts a rank) to pass after the throttle.
    const SLOW_STEPS: u64 = 600;
    // The trainer's own model, every step computed: a throttle slows only a rank that computes.
    // Two ranks, one core each on a 2-core machine: the throttled one is plainly the slower, and
    // the reference run costs half what four ranks would.
    let shape = Shape { ranks: 2, up: &[], train: &[] };
    let straight = straight_hash(SLOW_STEPS, &shape);
    let dir = tempfile::tempdir().unwrap();
    let mut up = up_training(dir.path(), SLOW_STEPS, &shape);
    let said = inject(dir.path(), "slow:50");
    assert!(said.contains("slow:50: ") && said.contains("throttled"), "{said}");
    let throttled_at = Instant::now();
    let found = poll_until(Duration::from_secs(70), || up.stdout().contains("job-straggler"));
    let took = throttled_at.elapsed();
    assert!(found, "no straggler found:\n{}", up.output());
    assert!(took <= Duration::from_secs(60), "found after {took:?}:\n{}", up.output());
    let text = up.stdout();
    let line = text.lines().find(|l| l.contains("job-straggler")).unwrap_or_default();
    assert!(line.contains("node-2 job-straggler") && line.contains("x slower"), "{line}");
    up.completes_with(
        LIMIT * 2,
        &straight,
        &["node-2 state-changed healthy -> draining", "spare-taken", "restarts 1"],
    );
}
