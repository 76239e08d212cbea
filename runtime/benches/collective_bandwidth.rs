//! All-reduce bus bandwidth over loopback against loopback TCP bandwidth, in one run of one binary
//! (`scripts/bench-runtime`; a bench target so that `cargo test` never builds it).
//!
//! Every rank is a child process (this binary started again in a child role), as ranks are in a
//! real job: separate address spaces, scheduled by the kernel like any other process. For each
//! world size and repetition:
//!
//! 1. *TCP*: a receiver and a sender process stream the bytes one rank of the all-reduce sends
//!    (2(n−1)/n × the buffer) over 127.0.0.1 with the ring's socket settings (`TCP_NODELAY`, the
//!    kernel's default buffer sizes), 1 MiB per write and read. Bandwidth = bytes / time.
//! 2. *All-reduce*: `n` rank processes meet through the rendezvous and run
//!    [`Communicator::all_reduce_sum`] on a 64 MiB `f32` buffer each (default chunk size). Each
//!    timed operation starts after a barrier; its time is the slowest rank's. Bus bandwidth =
//!    2(n−1)/n × bytes / time (NCCL's definition: what each rank moves over its link).
//!
//! Both are repeated `--reps` times, interleaved, each process pair or world doing one warm-up and
//! `--iters` timed operations; the summary gives medians and their ratio. The first result of
//! every all-reduce is checked against the exact sum.
//!
//! Usage: `collective_bandwidth [--mib 64] [--ranks 2,4] [--reps 5] [--iters 3] [--json FILE]`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_proto::stats::median;
use fleetmend_runtime::collective::{
    CollectiveConfig, Communicator, DEFAULT_CHUNK_BYTES, Membership,
};
use serde_json::{Value, json};

/// The child role of this process (`rank`, `tcp-recv`, `tcp-send`); unset in the parent.
const ROLE_ENV: &str = "FLEETMEND_BENCH_ROLE";
/// Elements per rank, iterations and warm-ups, for a child.
const ELEMS_ENV: &str = "FLEETMEND_BENCH_ELEMS";
const BYTES_ENV: &str = "FLEETMEND_BENCH_BYTES";
const ITERS_ENV: &str = "FLEETMEND_BENCH_ITERS";
const PORT_ENV: &str = "FLEETMEND_BENCH_PORT";
const CHUNK_ENV: &str = "FLEETMEND_BENCH_CHUNK_BYTES";
/// One launch of a world or a TCP pair may take this long before it is killed.
const LAUNCH_LIMIT: Duration = Duration::from_secs(300);
/// Launches of a world or a TCP pair before giving up.
const LAUNCH_ATTEMPTS: usize = 3;
/// The socket I/O size of the TCP baseline: the collective's default frame payload.
const IO_BYTES: usize = 1 << 20;

fn main() {
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("rank") => child_rank(),
        Ok("tcp-recv") => child_tcp_recv(),
        Ok("tcp-send") => child_tcp_send(),
        Ok("tcp-ring") => child_tcp_ring(),
        Ok(other) => panic!("unknown {ROLE_ENV}={other}"),
        Err(_) => parent(),
    }
}

#[derive(Debug)]
struct Args {
    mib: usize,
    ranks: Vec<usize>,
    reps: usize,
    iters: usize,
    chunk_kib: usize,
    json: Option<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        mib: 64,
        ranks: vec![2, 4],
        reps: 5,
        iters: 3,
        chunk_kib: DEFAULT_CHUNK_BYTES / 1024,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--mib" => args.mib = value().parse().expect("--mib: a number"),
            "--ranks" => {
                args.ranks = value()
                    .split(',')
                    .map(|n| n.trim().parse().expect("--ranks: numbers like 2,4"))
                    .collect()
            }
            "--reps" => args.reps = value().parse().expect("--reps: a number"),
            "--iters" => args.iters = value().parse().expect("--iters: a number"),
            "--chunk-kib" => args.chunk_kib = value().parse().expect("--chunk-kib: a number"),
            "--json" => args.json = Some(value()),
            // cargo bench passes --bench to harness-less targets.
            "--bench" => {}
            other => panic!("unknown argument {other:?} (see the file's doc comment)"),
        }
    }
    assert!(args.ranks.iter().all(|n| *n >= 2), "--ranks: world sizes of at least 2");
    assert!(args.reps >= 1 && args.iters >= 1 && args.mib >= 1);
    args
}

// ---------------------------------------------------------------------------------------------
// Parent

/// One timed operation: wall time (the slowest process's) and the CPU time of all its processes.
#[derive(Debug, Clone, Copy)]
struct Sample {
    secs: f64,
    cpu: f64,
}

/// The samples of one kind of measurement at one world size.
#[derive(Debug, Default)]
struct Series {
    /// Bytes per sample that the bandwidth is computed from.
    bytes: f64,
    samples: Vec<Sample>,
}

impl Series {
    fn bandwidths(&self) -> Vec<f64> {
        self.samples.iter().map(|s| self.bytes / s.secs).collect()
    }

    fn median_bandwidth(&self) -> f64 {
        median(self.bandwidths()).unwrap_or(f64::NAN)
    }

    /// The cores kept busy during the operations: CPU seconds over wall seconds.
    fn cores(&self) -> f64 {
        // Totals, not a median: CPU times come in 10 ms ticks, too coarse for one operation.
        let cpu: f64 = self.samples.iter().map(|s| s.cpu).sum();
        let secs: f64 = self.samples.iter().map(|s| s.secs).sum();
        cpu / secs
    }

    fn last(&self, count: usize) -> String {
        let all = self.bandwidths();
        gbs_list(&all[all.len().saturating_sub(count)..])
    }
}

fn parent() {
    let args = parse_args();
    let elems = args.mib * (1 << 20) / 4;
    let bytes = elems * 4;
    let cpu_before = machine_cpu();
    let started = Instant::now();
    // Per world size: single TCP stream, TCP ring (the all-reduce's traffic alone), all-reduce.
    let mut results: Vec<(usize, [Series; 3])> = args
        .ranks
        .iter()
        .map(|&world| {
            let link = ring_bytes_per_rank(bytes, world) as f64;
            let series = || Series { bytes: link, samples: Vec::new() };
            (world, [series(), series(), series()])
        })
        .collect();
    for rep in 1..=args.reps {
        for (world, [tcp, ring, bus]) in &mut results {
            let link_bytes = ring_bytes_per_rank(bytes, *world);
            tcp.samples.extend(with_retries("tcp stream", || tcp_stream(link_bytes, args.iters)));
            ring.samples
                .extend(with_retries("tcp ring", || tcp_ring(*world, link_bytes, args.iters)));
            bus.samples.extend(with_retries("all-reduce", || {
                all_reduce(*world, elems, args.iters, args.chunk_kib * 1024)
            }));
            eprintln!(
                "rep {rep}/{}: {world} ranks GB/s: tcp stream {} | tcp ring {} | all-reduce bus {}",
                args.reps,
                tcp.last(args.iters),
                ring.last(args.iters),
                bus.last(args.iters),
            );
        }
    }
    let busy = machine_cpu().busy_fraction_since(&cpu_before);
    println!(
        "\nall-reduce of {} MiB per rank (f32, frames of {} KiB), ranks as processes on 127.0.0.1; \
         medians of {} reps x {} ops",
        args.mib, args.chunk_kib, args.reps, args.iters
    );
    println!(
        "| ranks | TCP stream GB/s (cores) | TCP ring GB/s (cores) | all-reduce bus GB/s (cores) | bus / stream | bus / ring |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (world, [tcp, ring, bus]) in &results {
        let (tcp_bw, ring_bw, bus_bw) =
            (tcp.median_bandwidth(), ring.median_bandwidth(), bus.median_bandwidth());
        println!(
            "| {world} | {:.2} ({:.1}) | {:.2} ({:.1}) | {:.2} ({:.1}) | {:.2} | {:.2} |",
            tcp_bw / 1e9,
            tcp.cores(),
            ring_bw / 1e9,
            ring.cores(),
            bus_bw / 1e9,
            bus.cores(),
            bus_bw / tcp_bw,
            bus_bw / ring_bw,
        );
        let gbs = |series: &Series| series.bandwidths().iter().map(|b| b / 1e9).collect::<Vec<_>>();
        rows.push(json!({
            "ranks": world,
            "bytes_per_rank": ring_bytes_per_rank(bytes, *world),
            "tcp_stream_gbs_median": tcp_bw / 1e9,
            "tcp_ring_gbs_median": ring_bw / 1e9,
            "bus_gbs_median": bus_bw / 1e9,
            "ratio_bus_to_stream": bus_bw / tcp_bw,
            "ratio_bus_to_ring": bus_bw / ring_bw,
            "cores_tcp_stream": tcp.cores(),
            "cores_tcp_ring": ring.cores(),
            "cores_all_reduce": bus.cores(),
            "tcp_stream_gbs": gbs(tcp),
            "tcp_ring_gbs": gbs(ring),
            "bus_gbs": gbs(bus),
        }));
    }
    println!(
        "(cores: CPU seconds of the processes over wall seconds, per operation; \
         machine CPU busy over the run: {:.0}% of {} cores, {:.0} s)",
        busy * 100.0,
        cores(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        let report = json!({
            "bench": "collective_bandwidth",
            "mib_per_rank": args.mib,
            "chunk_kib": args.chunk_kib,
            "reps": args.reps,
            "iters": args.iters,
            "cores": cores(),
            "machine_cpu_busy": busy,
            "results": rows,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
    }
}

/// Bytes one rank of an `n`-rank ring all-reduce sends (and receives): 2(n−1)/n of the buffer.
fn ring_bytes_per_rank(bytes: usize, world: usize) -> usize {
    2 * (world - 1) * bytes / world
}

fn gbs_list(values: &[f64]) -> String {
    values.iter().map(|v| format!("{:.2}", v / 1e9)).collect::<Vec<_>>().join(" ")
}

fn cores() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// Aggregate CPU times from `/proc/stat` (jiffies), to say how busy the machine was.
struct MachineCpu {
    busy: u64,
    total: u64,
}

impl MachineCpu {
    fn busy_fraction_since(&self, before: &MachineCpu) -> f64 {
        let total = self.total.saturating_sub(before.total);
        if total == 0 { 0.0 } else { self.busy.saturating_sub(before.busy) as f64 / total as f64 }
    }
}

fn machine_cpu() -> MachineCpu {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    MachineCpu { busy: total - idle, total }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn child(role: &str, envs: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .env(ROLE_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (key, value) in envs {
        command.env(key, value);
    }
    command.spawn().unwrap()
}

/// Collects the JSON lines each child prints until it exits; kills them all past the limit. An
/// error names the children that failed.
fn wait_children(mut children: Vec<Child>) -> Result<Vec<Vec<Value>>, String> {
    let (lines, received) = mpsc::channel();
    for (index, child) in children.iter_mut().enumerate() {
        let stdout = child.stdout.take().unwrap();
        let lines = lines.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("child {index} printed {line:?}: {e}"));
                let _ = lines.send((index, Some(value)));
            }
            let _ = lines.send((index, None));
        });
    }
    drop(lines);
    let deadline = Instant::now() + LAUNCH_LIMIT;
    let mut outputs = vec![Vec::new(); children.len()];
    let mut open = children.len();
    while open > 0 {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((index, Some(value))) => outputs[index].push(value),
            Ok((_, None)) => open -= 1,
            Err(_) => {
                for child in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                panic!("children still running after {LAUNCH_LIMIT:?}; killed");
            }
        }
    }
    let mut failed = Vec::new();
    for (index, child) in children.iter_mut().enumerate() {
        let status = child.wait().unwrap();
        if !status.success() {
            failed.push(format!("child {index}: {status}"));
        }
    }
    if failed.is_empty() { Ok(outputs) } else { Err(failed.join(", ")) }
}

/// Runs one launch (a world or a TCP pair) again when it failed: the ports are picked free and
/// then released, and another process on the machine can take one in between.
fn with_retries(
    what: &str,
    mut launch: impl FnMut() -> Result<Vec<Sample>, String>,
) -> Vec<Sample> {
    for attempt in 1..=LAUNCH_ATTEMPTS {
        match launch() {
            Ok(samples) => return samples,
            Err(error) if attempt < LAUNCH_ATTEMPTS => {
                eprintln!("{what}: launch {attempt} failed ({error}); trying again");
            }
            Err(error) => panic!("{what}: {LAUNCH_ATTEMPTS} launches failed, the last: {error}"),
        }
    }
    unreachable!("the loop returns or panics")
}

/// Per timed operation: the slowest process's seconds and the CPU seconds of all of them, from
/// the `{"iter", "secs", "cpu"}` lines the processes printed.
fn samples(outputs: &[Vec<Value>], iters: usize) -> Vec<Sample> {
    (0..iters)
        .map(|iter| {
            let lines: Vec<&Value> = outputs
                .iter()
                .map(|lines| {
                    lines
                        .iter()
                        .find(|v| v["iter"].as_u64() == Some(iter as u64))
                        .expect("every process reports every iteration")
                })
                .collect();
            Sample {
                secs: lines.iter().filter_map(|v| v["secs"].as_f64()).fold(0.0, f64::max),
                cpu: lines.iter().filter_map(|v| v["cpu"].as_f64()).sum(),
            }
        })
        .collect()
}

/// One sender and one receiver process stream `bytes`, `iters` times.
fn tcp_stream(bytes: usize, iters: usize) -> Result<Vec<Sample>, String> {
    let port = free_port();
    let envs = [
        (BYTES_ENV, bytes.to_string()),
        (ITERS_ENV, iters.to_string()),
        (PORT_ENV, port.to_string()),
    ];
    // The receiver listens before the sender starts: it prints a line once bound.
    let mut receiver = child("tcp-recv", &envs);
    let mut first = String::new();
    BufReader::new(receiver.stdout.as_mut().unwrap()).read_line(&mut first).unwrap();
    if !first.contains("listening") {
        let _ = receiver.kill();
        let _ = receiver.wait();
        return Err(format!("the receiver said {first:?}"));
    }
    let sender = child("tcp-send", &envs);
    Ok(samples(&wait_children(vec![receiver, sender])?, iters))
}

/// `world` processes in a ring each send `bytes` to the next while receiving `bytes` from the
/// previous: the all-reduce's traffic without the reduction, `iters` times.
fn tcp_ring(world: usize, bytes: usize, iters: usize) -> Result<Vec<Sample>, String> {
    let ports: Vec<String> = (0..world).map(|_| free_port().to_string()).collect();
    let children = (0..world)
        .map(|rank| {
            child(
                "tcp-ring",
                &[
                    ("RANK", rank.to_string()),
                    (BYTES_ENV, bytes.to_string()),
                    (ITERS_ENV, iters.to_string()),
                    (PORT_ENV, ports.join(",")),
                ],
            )
        })
        .collect();
    Ok(samples(&wait_children(children)?, iters))
}

/// `world` rank processes meet and run `iters` timed all-reduces of `elems` floats each.
fn all_reduce(
    world: usize,
    elems: usize,
    iters: usize,
    chunk_bytes: usize,
) -> Result<Vec<Sample>, String> {
    let port = free_port();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let children = (0..world)
        .map(|rank| {
            child(
                "rank",
                &[
                    ("RANK", rank.to_string()),
                    ("WORLD_SIZE", world.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".to_string()),
                    ("MASTER_PORT", port.to_string()),
                    ("FLEETMEND_JOB_ID", format!("bench-{nanos}")),
                    (ELEMS_ENV, elems.to_string()),
                    (ITERS_ENV, iters.to_string()),
                    (CHUNK_ENV, chunk_bytes.to_string()),
                ],
            )
        })
        .collect();
    Ok(samples(&wait_children(children)?, iters))
}

// ---------------------------------------------------------------------------------------------
// Children

/// This process's CPU time so far (user + system, all threads), from `/proc/self/stat`.
fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at field 3, "state".
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the state (which
    // does not parse as a number and is skipped).
    let ticks = fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0);
    ticks as f64 / CLOCK_TICKS_PER_SEC
}

/// `sysconf(_SC_CLK_TCK)` on Linux everywhere this runs (the kernel's USER_HZ).
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

fn env_number(name: &str) -> usize {
    std::env::var(name).unwrap().parse().unwrap()
}

/// Rank `rank`'s input: small whole numbers, so the sum over ranks is exact in any order.
fn fill(values: &mut [f32], rank: usize) {
    for (i, value) in values.iter_mut().enumerate() {
        *value = ((i & 1023) * (rank + 1)) as f32;
    }
}

fn child_rank() {
    let membership = Membership::from_env().unwrap();
    let (rank, world) = (membership.rank, membership.world_size);
    let elems = env_number(ELEMS_ENV);
    let iters = env_number(ITERS_ENV);
    let config = CollectiveConfig {
        rendezvous_timeout: Duration::from_secs(60),
        chunk_bytes: env_number(CHUNK_ENV),
        ..CollectiveConfig::default()
    };
    let mut communicator = Communicator::connect(&membership, &config).unwrap();
    let mut values = vec![0f32; elems];
    // Iteration 0 is the warm-up (and the correctness check).
    for iter in 0..=iters {
        fill(&mut values, rank);
        communicator.barrier().unwrap();
        let (started, cpu) = (Instant::now(), process_cpu_secs());
        communicator.all_reduce_sum(&mut values).unwrap();
        let (secs, cpu) = (started.elapsed().as_secs_f64(), process_cpu_secs() - cpu);
        if iter == 0 {
            let factor = (world * (world + 1) / 2) as f32;
            for (i, value) in values.iter().enumerate() {
                assert_eq!(*value, (i & 1023) as f32 * factor, "rank {rank}: element {i}");
            }
        } else {
            println!("{}", json!({"rank": rank, "iter": iter - 1, "secs": secs, "cpu": cpu}));
        }
    }
    communicator.barrier().unwrap();
}

fn child_tcp_recv() {
    let bytes = env_number(BYTES_ENV);
    let iters = env_number(ITERS_ENV);
    let port = env_number(PORT_ENV) as u16;
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    println!("{}", json!({"listening": port}));
    std::io::stdout().flush().unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    stream.set_nodelay(true).unwrap();
    let mut buffer = vec![0u8; IO_BYTES];
    for iter in 0..=iters {
        // "Go": the sender starts now, so the time covers the stream and one round trip.
        let (started, cpu) = (Instant::now(), process_cpu_secs());
        stream.write_all(&[1]).unwrap();
        read_bytes(&mut stream, &mut buffer, bytes);
        let (secs, cpu) = (started.elapsed().as_secs_f64(), process_cpu_secs() - cpu);
        if iter > 0 {
            println!("{}", json!({"iter": iter - 1, "secs": secs, "cpu": cpu}));
        }
    }
}

fn child_tcp_send() {
    let bytes = env_number(BYTES_ENV);
    let iters = env_number(ITERS_ENV);
    let port = env_number(PORT_ENV) as u16;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_nodelay(true).unwrap();
    // Non-zero data, as a gradient would be (the kernel does not care, but be fair).
    let buffer: Vec<u8> = (0..IO_BYTES).map(|i| (i % 251) as u8).collect();
    for iter in 0..=iters {
        let mut go = [0u8];
        stream.read_exact(&mut go).unwrap();
        let cpu = process_cpu_secs();
        write_bytes(&mut stream, &buffer, bytes);
        // Wall time is the receiver's; the sender adds its CPU.
        if iter > 0 {
            println!("{}", json!({"iter": iter - 1, "cpu": process_cpu_secs() - cpu}));
        }
    }
}

fn write_bytes(stream: &mut TcpStream, buffer: &[u8], bytes: usize) {
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer.len());
        stream.write_all(&buffer[..n]).unwrap();
        left -= n;
    }
}

fn read_bytes(stream: &mut TcpStream, buffer: &mut [u8], bytes: usize) {
    let mut left = bytes;
    while left > 0 {
        let want = left.min(buffer.len());
        let n = stream.read(&mut buffer[..want]).unwrap();
        assert!(n > 0, "the sender closed early");
        left -= n;
    }
}

fn child_tcp_ring() {
    let rank = env_number("RANK");
    let bytes = env_number(BYTES_ENV);
    let iters = env_number(ITERS_ENV);
    let ports: Vec<u16> =
        std::env::var(PORT_ENV).unwrap().split(',').map(|p| p.parse().unwrap()).collect();
    let world = ports.len();
    let listener = TcpListener::bind(("127.0.0.1", ports[rank])).unwrap();
    let successor_port = ports[(rank + 1) % world];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut successor = loop {
        match TcpStream::connect(("127.0.0.1", successor_port)) {
            Ok(stream) => break stream,
            // The successor has not bound yet: retry until the deadline (a bench, not a test).
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("connecting to the ring successor: {e}"),
        }
    };
    let (mut predecessor, _) = listener.accept().unwrap();
    for stream in [&successor, &predecessor] {
        stream.set_nodelay(true).unwrap();
    }
    let out: Vec<u8> = (0..IO_BYTES).map(|i| (i % 251) as u8).collect();
    let mut buffer = vec![0u8; IO_BYTES];
    for iter in 0..=iters {
        // A token around the ring, twice, so that everyone started before anyone is timed.
        for _ in 0..2 {
            successor.write_all(&[1]).unwrap();
            predecessor.read_exact(&mut [0u8]).unwrap();
        }
        let (started, cpu) = (Instant::now(), process_cpu_secs());
        thread::scope(|scope| {
            let sending = scope.spawn(|| write_bytes(&mut successor, &out, bytes));
            read_bytes(&mut predecessor, &mut buffer, bytes);
            sending.join().unwrap();
        });
        let (secs, cpu) = (started.elapsed().as_secs_f64(), process_cpu_secs() - cpu);
        if iter > 0 {
            println!("{}", json!({"rank": rank, "iter": iter - 1, "secs": secs, "cpu": cpu}));
        }
    }
}
