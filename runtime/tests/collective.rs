//! Rendezvous and collectives over real TCP on 127.0.0.1: ranks on threads, and one rank as a real
//! process (this test binary, started again in child mode) killed with SIGKILL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_runtime::collective::{
    CollectiveConfig, CollectiveError, CollectiveFailure, CollectiveWatch, Communicator,
    Membership, RendezvousError,
};

/// Set in the environment of the child process that plays one rank.
const CHILD_ENV: &str = "FLEETMEND_COLLECTIVE_TEST_CHILD";

/// How long any test waits for its ranks before declaring them hung.
const RANKS_LIMIT: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn unique_run(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn membership(rank: usize, world_size: usize, port: u16, run_id: &str) -> Membership {
    Membership {
        rank,
        world_size,
        master_addr: "127.0.0.1".to_string(),
        master_port: port,
        run_id: run_id.to_string(),
    }
}

fn config(collective_timeout: Duration, chunk_bytes: usize) -> CollectiveConfig {
    CollectiveConfig {
        rendezvous_timeout: Duration::from_secs(20),
        collective_timeout,
        chunk_bytes,
        ..CollectiveConfig::default()
    }
}

type RankResult<T> = (usize, Result<T, String>);

/// Runs one rank on a thread: connect, then `body`; the outcome (or the panic message) goes to
/// `results`.
fn spawn_rank<T: Send + 'static>(
    results: &Sender<RankResult<T>>,
    membership: Membership,
    config: CollectiveConfig,
    body: impl FnOnce(Result<Communicator, RendezvousError>) -> T + Send + 'static,
) {
    let results = results.clone();
    thread::spawn(move || {
        let rank = membership.rank;
        let outcome =
            catch_unwind(AssertUnwindSafe(|| body(Communicator::connect(&membership, &config))))
                .map_err(|panic| {
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".to_string())
                });
        let _ = results.send((rank, outcome));
    });
}

/// Waits for `count` ranks to report, by rank; fails the test naming the ranks that did not.
fn collect<T>(results: &Receiver<RankResult<T>>, count: usize) -> BTreeMap<usize, T> {
    let deadline = Instant::now() + RANKS_LIMIT;
    let mut done = BTreeMap::new();
    while done.len() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        match results.recv_timeout(left) {
            Ok((rank, Ok(value))) => {
                done.insert(rank, value);
            }
            Ok((rank, Err(panic))) => panic!("rank {rank} failed: {panic}"),
            Err(_) => panic!(
                "only ranks {:?} of {count} reported within {RANKS_LIMIT:?}: the others hang",
                done.keys().collect::<Vec<_>>()
            ),
        }
    }
    done
}

/// Every rank connects and runs `body`; results by rank.
fn run_world<T: Send + 'static>(
    world: usize,
    config: &CollectiveConfig,
    body: impl Fn(usize, &mut Communicator) -> T + Send + Sync + 'static,
) -> BTreeMap<usize, T> {
    let port = free_port();
    let run = unique_run("world");
    let body = Arc::new(body);
    let (sender, results) = mpsc::channel();
    for rank in 0..world {
        let body = Arc::clone(&body);
        spawn_rank(
            &sender,
            membership(rank, world, port, &run),
            config.clone(),
            move |connected| {
                let mut communicator = connected.unwrap();
                body(rank, &mut communicator)
            },
        );
    }
    collect(&results, world)
}

/// Rank `rank`'s gradient-like input: mixed signs and magnitudes, so the order of the sum shows
/// in the bits.
fn input(rank: usize, len: usize) -> Vec<f32> {
    let mut rng = fastrand::Rng::with_seed(0x5eed ^ ((rank as u64) << 32) ^ len as u64);
    (0..len).map(|_| (rng.f32() * 2.0 - 1.0) * 10f32.powi(rng.i32(-4..=4))).collect()
}

/// The documented order, written out independently: the buffer is cut into `world` contiguous
/// segments as equal as possible, the first `len % world` one element longer, and segment `c` is
/// summed from rank `c` onwards around the ring, left to right.
fn fixed_order_sum(inputs: &[Vec<f32>]) -> Vec<f32> {
    let world = inputs.len();
    let len = inputs[0].len();
    let (base, extra) = (len / world, len % world);
    let mut sum = vec![0.0f32; len];
    let mut start = 0;
    for segment in 0..world {
        let end = start + base + usize::from(segment < extra);
        for (i, out) in sum.iter_mut().enumerate().take(end).skip(start) {
            let mut acc = inputs[segment][i];
            for step in 1..world {
                acc += inputs[(segment + step) % world][i];
            }
            *out = acc;
        }
        start = end;
    }
    sum
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn all_reduce_sums_in_the_fixed_order_and_every_rank_gets_the_same_bits() {
    // Prime: divisible neither by any world size nor by the 1024 floats of a frame.
    let len = 10_007;
    for world in 1..=4 {
        let inputs: Vec<Vec<f32>> = (0..world).map(|rank| input(rank, len)).collect();
        let expected_sum = fixed_order_sum(&inputs);
        let expected_mean: Vec<f32> = expected_sum.iter().map(|s| s / world as f32).collect();
        if world >= 3 {
            // The order matters for these inputs: summing in rank order gives other bits, so
            // matching the fixed order below is not an accident.
            let rank_order: Vec<f32> = (0..len)
                .map(|i| inputs.iter().skip(1).fold(inputs[0][i], |acc, x| acc + x[i]))
                .collect();
            assert_ne!(bits(&rank_order), bits(&expected_sum));
        }
        let mut runs = Vec::new();
        for _ in 0..2 {
            let inputs = inputs.clone();
            let results =
                run_world(world, &config(Duration::from_secs(30), 4096), move |rank, comm| {
                    let mut sum = inputs[rank].clone();
                    comm.all_reduce_sum(&mut sum).unwrap();
                    let mut mean = inputs[rank].clone();
                    comm.all_reduce_mean(&mut mean).unwrap();
                    (bits(&sum), bits(&mean))
                });
            for (rank, (sum, mean)) in &results {
                assert!(*sum == bits(&expected_sum), "world {world}: rank {rank}'s sum differs");
                assert!(*mean == bits(&expected_mean), "world {world}: rank {rank}'s mean differs");
            }
            runs.push(results);
        }
        assert_eq!(runs[0], runs[1], "world {world}: two runs differ");
        // And it is a mean: close to the exact one.
        for (i, mean) in expected_mean.iter().enumerate() {
            let exact = inputs.iter().map(|x| f64::from(x[i])).sum::<f64>() / world as f64;
            let scale = inputs.iter().map(|x| f64::from(x[i]).abs()).sum::<f64>();
            assert!((f64::from(*mean) - exact).abs() <= scale * 1e-6, "element {i}");
        }
    }
}

#[test]
fn frame_size_and_awkward_lengths_do_not_change_the_bits() {
    let world = 3;
    // Empty, shorter than the world (empty segments), and not multiples of anything.
    let lengths = [0usize, 1, 2, 5, 1001];
    let mut by_chunk = Vec::new();
    for chunk_bytes in [4, 64, 1 << 20] {
        let results =
            run_world(world, &config(Duration::from_secs(30), chunk_bytes), move |rank, comm| {
                lengths
                    .iter()
                    .map(|&len| {
                        let mut values = input(rank, len);
                        comm.all_reduce_sum(&mut values).unwrap();
                        bits(&values)
                    })
                    .collect::<Vec<_>>()
            });
        for (i, &len) in lengths.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..world).map(|rank| input(rank, len)).collect();
            let expected = bits(&fixed_order_sum(&inputs));
            for (rank, sums) in &results {
                assert!(
                    sums[i] == expected,
                    "chunk {chunk_bytes}, length {len}: rank {rank} differs"
                );
            }
        }
        by_chunk.push(results);
    }
    assert!(by_chunk.windows(2).all(|pair| pair[0] == pair[1]));
}

#[test]
fn broadcast_copies_the_roots_bytes_and_barrier_waits_for_everyone() {
    let world = 3;
    let late_rank_arrived = Arc::new(AtomicBool::new(false));
    let arrived = Arc::clone(&late_rank_arrived);
    let results = run_world(world, &config(Duration::from_secs(30), 8), move |rank, comm| {
        // The resume step, from rank 0.
        let mut step = if rank == 0 { 12_345u64.to_le_bytes() } else { [0u8; 8] };
        comm.broadcast(0, &mut step).unwrap();
        // Several frames, from the last rank.
        let pattern: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(37)).collect();
        let mut big = if rank == 2 { pattern.clone() } else { vec![0u8; 100] };
        comm.broadcast(2, &mut big).unwrap();
        let mut empty = [0u8; 0];
        comm.broadcast(1, &mut empty).unwrap();

        if rank == 1 {
            // Rank 1 reaches the barrier late; nobody may leave it before.
            thread::sleep(Duration::from_millis(300));
            arrived.store(true, Ordering::SeqCst);
        }
        comm.barrier().unwrap();
        let saw_late_rank = arrived.load(Ordering::SeqCst);
        (u64::from_le_bytes(step), big == pattern, saw_late_rank)
    });
    for (rank, (step, big_ok, saw_late_rank)) in results {
        assert_eq!(step, 12_345, "rank {rank}");
        assert!(big_ok, "rank {rank} got other bytes from rank 2");
        assert!(saw_late_rank, "rank {rank} left the barrier before rank 1 entered it");
    }
}

#[test]
fn rank_zero_started_last_still_meets_the_others() {
    let world = 3;
    let port = free_port();
    let run = unique_run("late-master");
    let (sender, results) = mpsc::channel();
    let body = |rank: usize| {
        move |connected: Result<Communicator, RendezvousError>| {
            let mut comm = connected.unwrap();
            let mut values = input(rank, 257);
            comm.all_reduce_sum(&mut values).unwrap();
            bits(&values)
        }
    };
    for rank in [1, 2] {
        spawn_rank(
            &sender,
            membership(rank, world, port, &run),
            config(Duration::from_secs(30), 64),
            body(rank),
        );
    }
    // The scenario, not synchronisation: nobody listens on the port yet, so ranks 1 and 2 are
    // being refused and retrying when rank 0 comes up.
    thread::sleep(Duration::from_millis(500));
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something already listens"
    );
    spawn_rank(
        &sender,
        membership(0, world, port, &run),
        config(Duration::from_secs(30), 64),
        body(0),
    );
    let results = collect(&results, world);
    let expected = bits(&fixed_order_sum(&(0..world).map(|r| input(r, 257)).collect::<Vec<_>>()));
    for (rank, sum) in results {
        assert!(sum == expected, "rank {rank}");
    }
}

#[test]
fn rendezvous_names_the_rank_that_never_arrived() {
    let world = 3;
    let port = free_port();
    let run = unique_run("missing-rank");
    let timeout = Duration::from_secs(1);
    let config = CollectiveConfig { rendezvous_timeout: timeout, ..CollectiveConfig::default() };
    let (sender, results) = mpsc::channel();
    let started = Instant::now();
    // Rank 2 never starts.
    for rank in [0, 1] {
        spawn_rank(
            &sender,
            membership(rank, world, port, &run),
            config.clone(),
            move |connected| {
                let error = connected.expect_err("the rendezvous cannot complete without rank 2");
                (error.missing_ranks().map(<[usize]>::to_vec), error.to_string(), started.elapsed())
            },
        );
    }
    for (rank, (missing, message, elapsed)) in collect(&results, 2) {
        assert_eq!(missing, Some(vec![2]), "rank {rank}: {message}");
        assert!(message.contains("rank(s) 2 of 3 never arrived"), "rank {rank}: {message}");
        assert!(elapsed < timeout + Duration::from_secs(3), "rank {rank} took {elapsed:?}");
    }
}

#[test]
fn a_rank_of_another_run_is_turned_away() {
    let port = free_port();
    let run = unique_run("this-run");
    let (sender, results) = mpsc::channel();
    let config = config(Duration::from_secs(30), 1 << 20);
    spawn_rank(&sender, membership(0, 2, port, &run), config.clone(), |connected| {
        connected.map(|_| ()).map_err(|e| e.to_string())
    });
    // A rank 1 left over from an earlier restart knocks first.
    let (stray_sender, stray_result) = mpsc::channel();
    spawn_rank(&stray_sender, membership(1, 2, port, "earlier-run"), config.clone(), |connected| {
        connected.map(|_| ()).map_err(|e| e.to_string())
    });
    let stray = collect(&stray_result, 1).remove(&1).unwrap();
    let refusal = stray.expect_err("a rank of another run must not join");
    assert!(refusal.contains("refused") && refusal.contains("earlier-run"), "{refusal}");
    spawn_rank(&sender, membership(1, 2, port, &run), config, |connected| {
        connected.map(|_| ()).map_err(|e| e.to_string())
    });
    for (rank, outcome) in collect(&results, 2) {
        assert_eq!(outcome, Ok(()), "rank {rank}");
    }
}

#[test]
fn ranks_out_of_step_are_told_so() {
    let results = run_world(2, &config(Duration::from_secs(30), 1 << 20), |rank, comm| {
        let mut values = vec![1.0f32; 10 + 2 * rank];
        comm.all_reduce_sum(&mut values).unwrap_err()
    });
    for (rank, error) in &results {
        let CollectiveFailure::OutOfStep { peer, detail } = &error.failure else {
            panic!("rank {rank}: {error}");
        };
        assert_eq!(*peer, 1 - rank);
        assert!(detail.contains("buffers of different lengths"), "rank {rank}: {detail}");
    }

    let results = run_world(2, &config(Duration::from_secs(30), 1 << 20), |rank, comm| {
        let mut values = vec![1.0f32; 4];
        let error = if rank == 0 {
            comm.barrier().unwrap_err()
        } else {
            comm.all_reduce_sum(&mut values).unwrap_err()
        };
        // A failed communicator refuses what follows.
        let refused = comm.barrier().unwrap_err();
        assert!(matches!(refused.failure, CollectiveFailure::Broken { .. }), "{refused}");
        error.to_string()
    });
    for (rank, message) in results {
        assert!(message.contains("same collectives in the same order"), "rank {rank}: {message}");
    }
}

/// The outcome of the second operation on a surviving rank: the error and when it came.
type Failure = (CollectiveError, Instant);

#[test]
fn a_rank_that_leaves_fails_the_others_quickly_naming_it() {
    let world = 4;
    let leaver = 2;
    let timeout = Duration::from_secs(2);
    let results = run_world(world, &config(timeout, 4096), move |rank, comm| {
        let mut values = input(rank, 100_000);
        comm.all_reduce_sum(&mut values).unwrap();
        if rank == leaver {
            // Dropping the communicator closes its sockets, as a crashed rank's would be.
            return None;
        }
        let started = Instant::now();
        let error = comm.all_reduce_sum(&mut values).unwrap_err();
        let refused = comm.all_reduce_sum(&mut values).unwrap_err();
        assert!(matches!(refused.failure, CollectiveFailure::Broken { .. }), "{refused}");
        Some((error, started.elapsed()))
    });
    for (rank, outcome) in results {
        let Some((error, elapsed)) = outcome else { continue };
        assert_eq!(error.suspect_rank(), Some(leaver), "rank {rank}: {error}");
        assert!(error.to_string().contains(&format!("rank {leaver}")), "rank {rank}: {error}");
        // A closed connection is noticed at once, not after the timeout.
        assert!(
            !matches!(error.failure, CollectiveFailure::PeerSilent { .. }),
            "rank {rank}: {error}"
        );
        assert!(elapsed < timeout, "rank {rank} took {elapsed:?}: {error}");
    }
}

#[test]
fn a_silent_rank_fails_the_others_after_the_timeout_naming_it() {
    let world = 3;
    let silent = 1;
    let timeout = Duration::from_secs(2);
    // The silent rank holds its connections open until both others have failed.
    let (failed, wait_failed) = mpsc::channel::<usize>();
    let wait_failed = Arc::new(Mutex::new(wait_failed));
    let results = run_world(world, &config(timeout, 4096), move |rank, comm| {
        let mut values = input(rank, 1000);
        comm.all_reduce_sum(&mut values).unwrap();
        if rank == silent {
            // Hung: connections open, never calls the next collective.
            let wait_failed = wait_failed.lock().unwrap();
            for _ in 0..world - 1 {
                let _ = wait_failed.recv_timeout(RANKS_LIMIT);
            }
            return None;
        }
        let started = Instant::now();
        let error = comm.all_reduce_sum(&mut values).unwrap_err();
        let elapsed = started.elapsed();
        failed.send(rank).unwrap();
        Some((error.suspect_rank(), error.to_string(), elapsed))
    });
    for (rank, outcome) in results {
        let Some((suspect, message, elapsed)) = outcome else { continue };
        // Rank 2 reads from the silent rank and times out; rank 0 hears rank 2's keepalives
        // meanwhile, then its abort, so both blame rank 1 and not each other.
        assert_eq!(suspect, Some(silent), "rank {rank}: {message}");
        assert!(message.contains("rank 1"), "rank {rank}: {message}");
        assert!(elapsed >= timeout - Duration::from_millis(100), "rank {rank} took {elapsed:?}");
        assert!(elapsed < timeout + Duration::from_secs(3), "rank {rank} took {elapsed:?}");
    }
}

#[test]
fn a_waiting_rank_names_the_rank_that_has_not_reached_the_collective() {
    let world = 3;
    let late = 1;
    let (watch_sender, watches) = mpsc::channel::<(usize, Arc<CollectiveWatch>)>();
    let watch_sender = Mutex::new(watch_sender);
    let (go_sender, go) = mpsc::channel::<()>();
    let go = Mutex::new(go);
    // Watches the ranks' watches while rank 1 stays out of the collective, then lets it in.
    let observer = thread::spawn(move || {
        let mut by_rank = BTreeMap::new();
        while by_rank.len() < world {
            let (rank, watch) = watches.recv_timeout(RANKS_LIMIT).unwrap();
            by_rank.insert(rank, watch);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while by_rank[&2].waiting_for() != Some(late) {
            assert!(Instant::now() < deadline, "rank 2 never named rank 1");
            thread::sleep(Duration::from_millis(10));
        }
        let others = (by_rank[&0].waiting_for(), by_rank[&1].waiting_for());
        go_sender.send(()).unwrap();
        others
    });
    // A collective timeout far longer than the wait: only the watch can tell.
    let results = run_world(world, &config(Duration::from_secs(30), 4096), move |rank, comm| {
        let watch = comm.watch().expect("a world of three has a ring");
        watch_sender.lock().unwrap().send((rank, watch.clone())).unwrap();
        if rank == late {
            go.lock().unwrap().recv_timeout(RANKS_LIMIT).unwrap();
        }
        let mut values = input(rank, 1000);
        comm.all_reduce_sum(&mut values).unwrap();
        watch.waiting_for()
    });
    let (rank_0, rank_1) = observer.join().unwrap();
    // Rank 0 waits for rank 2, which waits too and sends keepalives: rank 0 names nobody.
    assert_eq!(rank_0, None);
    assert_eq!(rank_1, None, "rank 1 is not in a collective");
    assert!(results.values().all(Option::is_none), "{results:?}: nobody waits after it");
}

/// Kills the child process when the test ends, however it ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const SIGKILL_TEST: &str = "a_rank_killed_with_sigkill_fails_the_others_naming_it";
const SIGKILL_LEN: usize = 50_000;

#[test]
fn a_rank_killed_with_sigkill_fails_the_others_naming_it() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child_rank();
    }
    let world = 3;
    let victim = 1;
    let timeout = Duration::from_secs(5);
    let port = free_port();
    let job = unique_run("sigkill");
    let child = Command::new(std::env::current_exe().unwrap())
        .args([SIGKILL_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("RANK", victim.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("FLEETMEND_JOB_ID", &job)
        .env("FLEETMEND_RESTART_COUNT", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);

    let (first_done, wait_first) = mpsc::channel::<usize>();
    let (sender, results) = mpsc::channel();
    for rank in [0, 2] {
        let first_done = first_done.clone();
        let run_id = format!("{job}#0");
        spawn_rank(
            &sender,
            membership(rank, world, port, &run_id),
            config(timeout, 1 << 20),
            move |connected| {
                let mut comm = connected.unwrap();
                let mut values = input(rank, SIGKILL_LEN);
                comm.all_reduce_sum(&mut values).unwrap();
                first_done.send(rank).unwrap();
                let error = comm.all_reduce_sum(&mut values).unwrap_err();
                (error, Instant::now())
            },
        );
    }
    for _ in 0..2 {
        wait_first
            .recv_timeout(RANKS_LIMIT)
            .expect("the first all-reduce with the child did not finish");
    }
    child.0.kill().unwrap();
    let killed = Instant::now();
    let status = child.0.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "the child ended otherwise: {status}");

    let failures: BTreeMap<usize, Failure> = collect(&results, 2);
    for (rank, (error, failed_at)) in failures {
        assert_eq!(error.suspect_rank(), Some(victim), "rank {rank}: {error}");
        assert!(error.to_string().contains("rank 1"), "rank {rank}: {error}");
        let after_kill = failed_at.saturating_duration_since(killed);
        assert!(after_kill < timeout, "rank {rank} failed {after_kill:?} after the kill: {error}");
    }
}

/// The child process: rank 1 from the launcher's environment; one all-reduce, then it sits in the
/// ring without calling the next one until it is killed (or the parent goes away and its stdin
/// closes).
fn child_rank() {
    let membership = Membership::from_env().unwrap();
    let mut comm =
        Communicator::connect(&membership, &config(Duration::from_secs(5), 1 << 20)).unwrap();
    let mut values = input(membership.rank, SIGKILL_LEN);
    comm.all_reduce_sum(&mut values).unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
