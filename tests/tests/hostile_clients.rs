//! The real repairer and agent against careless or hostile clients on loopback: thousands of
//! connections that send half a request header and wait, and an agent pushed past its node's rate.
//!
//! - 2,000 half-sent requests held open at once, each closed by the server at its header deadline
//!   (2 s here) and not before; each attacker connects again as soon as it is closed, for a few
//!   seconds. Meanwhile a real agent's reports keep landing on the repairer, and a kept-alive
//!   scraper keeps reading the agent's `/metrics`; afterwards each server's open descriptors are
//!   back to their baseline.
//! - A client beyond its credential's rate gets 429 with `Retry-After`; a real agent whose
//!   kernel-log pushes and reports exceed its node's rate waits what it is told and every finding
//!   it meant to send reaches the repairer.
//!
//! Shedding past the connection cap is covered in `listener/tests/deadlines.rs`; here the cap is
//! above the attack, so that every connection is held to the header deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fleetmend_tests::{
    KeepAlive, Running, fixture, fixture_flags, free_port, http_get, open_fds, poll_until,
    raise_fd_limit, repairer_in, sample, start_agent,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Half-sent requests the attack holds open at once.
const ATTACKERS: usize = 2000;
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// The `[listener]` both servers run under here: the cap well above the attack.
const LISTENER: &str = "[listener]\nheader_timeout = \"2s\"\nmax_connections = 4096\n";
/// How long the attackers keep connecting again: each holds about three connections in turn.
const ATTACK: Duration = Duration::from_secs(6);
/// The attackers' first connects are spread over this: 2,000 at once would overflow the
/// listener's accept queue (1,024), and a connection dropped there is accepted only when its
/// handshake is retried a second later, which measures the kernel, not the header deadline.
const RAMP: Duration = Duration::from_millis(500);
/// Scheduling slack on top of the header timeout on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);
const HALF_REQUEST: &[u8] = b"POST /v1/reports HTTP/1.1\r\nHost: x\r\n";

/// What the attack saw.
#[derive(Debug, Default)]
struct Attack {
    /// Half-sent requests the server closed.
    closed: usize,
    /// The shortest a half-sent request stayed open, from the start of its connect (the server's
    /// deadline starts after that, at the accept).
    shortest: Option<Duration>,
    /// The longest a half-sent request stayed open, from the end of its connect.
    longest: Duration,
    /// The most half-sent requests open at once.
    peak: usize,
    /// Connections not made within 10 s.
    connect_failures: usize,
    /// Half-sent requests whose write failed.
    write_failures: usize,
    /// Half-sent requests still open past the header timeout and the slack.
    late: usize,
}

/// `ATTACKERS` clients, each sending half a request header and waiting for the server to close
/// the connection, again and again for `ATTACK`.
async fn attack(target: SocketAddr) -> Attack {
    let until = tokio::time::Instant::now() + ATTACK;
    let open = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    for i in 0..ATTACKERS {
        let (open, peak) = (open.clone(), peak.clone());
        let first = start + RAMP.mul_f64(i as f64 / ATTACKERS as f64);
        tasks.spawn(async move {
            let mut seen = Attack::default();
            tokio::time::sleep_until(first).await;
            while tokio::time::Instant::now() < until {
                let connecting = Instant::now();
                let connect = tokio::net::TcpStream::connect(target);
                let Ok(Ok(mut stream)) =
                    tokio::time::timeout(Duration::from_secs(10), connect).await
                else {
                    seen.connect_failures += 1;
                    continue;
                };
                let connected = Instant::now();
                if stream.write_all(HALF_REQUEST).await.is_err() {
                    seen.write_failures += 1;
                    continue;
                }
                peak.fetch_max(open.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
                let mut buf = [0u8; 512];
                let closed = async {
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                };
                let in_time = tokio::time::timeout(HEADER_TIMEOUT + SLACK, closed).await.is_ok();
                open.fetch_sub(1, Ordering::Relaxed);
                if !in_time {
                    seen.late += 1;
                    continue;
                }
                seen.closed += 1;
                let held = connecting.elapsed();
                seen.shortest = Some(seen.shortest.map_or(held, |s| s.min(held)));
                seen.longest = seen.longest.max(connected.elapsed());
            }
            seen
        });
    }
    let mut total = Attack::default();
    while let Some(seen) = tasks.join_next().await {
        let seen = seen.unwrap();
        total.closed += seen.closed;
        total.shortest = match (total.shortest, seen.shortest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        total.longest = total.longest.max(seen.longest);
        total.connect_failures += seen.connect_failures;
        total.write_failures += seen.write_failures;
        total.late += seen.late;
    }
    total.peak = peak.load(Ordering::Relaxed);
    total
}

/// Every half-sent request was closed at the header deadline: none before (it was held, not shed
/// or refused), none later than the slack allows, and all 2,000 were open at once.
fn assert_each_closed_at_the_header_deadline(seen: &Attack) {
    assert_eq!((seen.connect_failures, seen.write_failures, seen.late), (0, 0, 0), "{seen:?}");
    assert_eq!(seen.peak, ATTACKERS, "the attack never held every connection at once: {seen:?}");
    assert!(seen.closed >= 2 * ATTACKERS, "{seen:?}");
    assert!(seen.shortest.is_some_and(|s| s >= HEADER_TIMEOUT), "closed early: {seen:?}");
    assert!(seen.longest <= HEADER_TIMEOUT + SLACK, "{seen:?}");
}

/// Polls on a thread of its own, every 250 ms while `attacking`, through a kept-alive
/// connection: what `probe` made of each answer, and the descriptors `pid` held at the time.
fn watch<T: Send + 'static>(
    target: SocketAddr,
    path: &'static str,
    pid: u32,
    attacking: Arc<AtomicBool>,
    probe: impl Fn(Option<(u16, String)>) -> T + Send + 'static,
) -> std::thread::JoinHandle<Vec<(T, usize)>> {
    let mut connection = KeepAlive::connect(target);
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while attacking.load(Ordering::Relaxed) {
            seen.push((probe(connection.get(path)), open_fds(pid)));
            std::thread::sleep(Duration::from_millis(250));
        }
        seen
    })
}

/// An agent on the healthy fixture named `node`, its kernel log a copy in `dir`, reporting to
/// `repairer` (if any) every `interval`, with `settings` appended to its config.
fn agent(
    dir: &Path,
    node: &str,
    repairer: Option<SocketAddr>,
    settings: &str,
) -> (SocketAddr, Running, std::path::PathBuf) {
    let case = fixture("healthy");
    let kmsg = dir.join("kmsg");
    std::fs::copy(case.join("kmsg"), &kmsg).unwrap();
    let report = repairer
        .map(|r| {
            format!(
                "[report]\nrepairer = \"http://{r}\"\ninterval = \"500ms\"\nbackoff_initial = \"100ms\"\n\
                 backoff_max = \"5s\"\n"
            )
        })
        .unwrap_or_default();
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n{settings}\n{report}[commands]\nreboot = []\n",
            std::fs::read_to_string(case.join("agent.toml")).unwrap()
        ),
    )
    .unwrap();
    let mut flags = fixture_flags(&case);
    flags.retain(|f| !f.starts_with("--kmsg="));
    flags.push(format!("--kmsg={}", kmsg.display()));
    flags.push(format!("--config={}", config.display()));
    flags.push(format!("--node={node}"));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let running = start_agent(dir, listen, &args);
    (listen, running, kmsg)
}

/// The node's record as the repairer keeps it (`GET /v1/nodes/NODE`), when it knows the node.
fn node_record(repairer: SocketAddr, node: &str) -> Option<serde_json::Value> {
    let (status, body) = http_get(repairer, &format!("/v1/nodes/{node}"))?;
    (status == 200)
        .then(|| serde_json::from_str::<serde_json::Value>(&body).ok())?
        .map(|d| d["node"].clone())
}

/// Waits (with a deadline) until `pid` holds no more descriptors than `baseline` plus a few (a
/// scrape in flight, a store file the repairer opened meanwhile); returns the count it came to.
fn assert_fds_back(pid: u32, baseline: usize, who: &Running) -> usize {
    let back = poll_until(Duration::from_secs(20), || open_fds(pid) <= baseline + 3);
    let now = open_fds(pid);
    assert!(back, "{now} descriptors open, {baseline} before the attack:\n{}", who.stderr());
    now
}

/// The server held a descriptor for each half-sent request at the height of the attack.
fn assert_fds_rose(fds: impl Iterator<Item = usize>, baseline: usize) -> usize {
    let peak = fds.max().unwrap_or(0);
    assert!(
        peak >= baseline + ATTACKERS * 9 / 10,
        "at most {peak} descriptors open during the attack, {baseline} before"
    );
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_at_the_header_timeout_while_an_agent_keeps_reporting() {
    let need = 2 * ATTACKERS as u64 + 512;
    assert!(raise_fd_limit(need) >= need, "the descriptor limit cannot be raised to {need}");
    let dir = tempfile::tempdir().unwrap();
    let (repairer_addr, repairer) = repairer_in(dir.path(), LISTENER);
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let (_, agent, _) = agent(&agent_dir, "n1", Some(repairer_addr), "");
    assert!(
        poll_until(Duration::from_secs(20), || node_record(repairer_addr, "n1").is_some()),
        "the agent's reports never arrived:\n{}\n{}",
        repairer.stderr(),
        agent.stderr()
    );

    let pid = repairer.child.id();
    let attacking = Arc::new(AtomicBool::new(true));
    let reports = watch(repairer_addr, "/v1/nodes/n1", pid, attacking.clone(), |answer| {
        let (status, body) = answer?;
        let detail: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200).then(|| detail["node"]["last_report_ms"].as_u64())?
    });
    let baseline = open_fds(pid);
    let started = Instant::now();
    let seen = attack(repairer_addr).await;
    let took = started.elapsed();
    attacking.store(false, Ordering::Relaxed);
    let reports = reports.join().unwrap();
    let peak = assert_fds_rose(reports.iter().map(|(_, fds)| *fds), baseline);
    let after = assert_fds_back(pid, baseline, &repairer);
    println!(
        "repairer: {seen:?} in {took:?}; descriptors {baseline} before, {peak} at most, {after} after"
    );

    assert_each_closed_at_the_header_deadline(&seen);
    // Throughout the attack the repairer answered on the kept-alive connection and the agent's
    // reports (every 500 ms) kept arriving: its last report advanced again and again.
    assert!(
        reports.iter().all(|(at, _)| at.is_some()),
        "a read during the attack failed: {reports:?}"
    );
    let distinct: std::collections::BTreeSet<u64> =
        reports.iter().filter_map(|(at, _)| *at).collect();
    assert!(
        distinct.len() >= 6,
        "the agent's reports stalled during the attack: {reports:?}\n{}",
        agent.stderr()
    );
    let (_, metrics) = http_get(repairer_addr, "/metrics").unwrap();
    let header = sample(&metrics, r#"fleetmend_http_timeouts_total{phase="header"}"#).unwrap();
    assert!(header >= seen.closed as f64, "header timeouts {header}, {seen:?}");
    assert_eq!(sample(&metrics, "fleetmend_http_connections_shed_total"), Some(0.0));
    assert_eq!(sample(&metrics, "fleetmend_http_connections_max"), Some(4096.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_to_the_agent_are_closed_and_its_metrics_keep_answering() {
    let need = 2 * ATTACKERS as u64 + 512;
    assert!(raise_fd_limit(need) >= need, "the descriptor limit cannot be raised to {need}");
    let dir = tempfile::tempdir().unwrap();
    let (listen, agent, _) = agent(dir.path(), "n2", None, LISTENER);
    let pid = agent.child.id();
    let attacking = Arc::new(AtomicBool::new(true));
    let scrapes = watch(listen, "/metrics", pid, attacking.clone(), |answer| {
        answer.is_some_and(|(status, body)| status == 200 && body.contains("fleetmend_agent_info"))
    });
    let baseline = open_fds(pid);
    let started = Instant::now();
    let seen = attack(listen).await;
    let took = started.elapsed();
    attacking.store(false, Ordering::Relaxed);
    let scrapes = scrapes.join().unwrap();
    let peak = assert_fds_rose(scrapes.iter().map(|(_, fds)| *fds), baseline);
    let after = assert_fds_back(pid, baseline, &agent);
    println!(
        "agent: {seen:?} in {took:?}, {} scrapes; descriptors {baseline} before, {peak} at most, {after} after",
        scrapes.len()
    );

    assert_each_closed_at_the_header_deadline(&seen);
    assert!(
        scrapes.len() >= 10 && scrapes.iter().all(|(ok, _)| *ok),
        "scrapes during the attack: {scrapes:?}"
    );
    let (_, metrics) = http_get(listen, "/metrics").unwrap();
    let header = sample(&metrics, r#"fleetmend_http_timeouts_total{phase="header"}"#).unwrap();
    assert!(header >= seen.closed as f64, "header timeouts {header}, {seen:?}");
    assert_eq!(sample(&metrics, "fleetmend_http_connections_shed_total"), Some(0.0));
    assert_eq!(sample(&metrics, "fleetmend_http_connections_max"), Some(4096.0));
}

/// Each GPU bus of the healthy fixture; an Xid 79 on each is a finding of its own.
const BUSES: [&str; 4] = ["18", "2a", "3a", "5d"];

#[test]
fn an_agent_past_its_nodes_rate_waits_what_it_is_told_and_every_finding_lands() {
    let dir = tempfile::tempdir().unwrap();
    // One report every 2 s, two at once: an agent reporting every 500 ms is far past it.
    let (repairer_addr, repairer) =
        repairer_in(dir.path(), "[rate_limits]\nnode = { per_second = 0.5, burst = 2 }\n");
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let (_, agent, kmsg) = agent(&agent_dir, "n3", Some(repairer_addr), "");
    assert!(
        poll_until(Duration::from_secs(20), || node_record(repairer_addr, "n3").is_some()),
        "{}",
        agent.stderr()
    );

    // A client past the node's rate: 429, Retry-After, the API's error body.
    let refused = poll_until(Duration::from_secs(20), || {
        fleetmend_tests::http_post_json(repairer_addr, "/v1/reports", &minimal_report("n3"))
            .is_some_and(|(status, _)| status == 429)
    });
    assert!(refused, "no 429 past the node's rate:\n{}", repairer.stderr());
    let head = raw_post(repairer_addr, "/v1/reports", &minimal_report("n3"));
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    let retry_after = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse::<u64>().ok());
    assert!(retry_after.is_some_and(|s| (1..=2).contains(&s)), "{head}");
    assert!(head.contains("{\"error\":\"too many requests from node n3"), "{head}");

    // Kernel-log faults pushed faster than the node's rate: an Xid 79 on each GPU, 200 ms apart.
    let mut file = std::fs::OpenOptions::new().append(true).open(&kmsg).unwrap();
    for (i, bus) in BUSES.iter().enumerate() {
        writeln!(
            file,
            "4,{},719950{i}000,-;NVRM: Xid (PCI:0000:{bus}:00): 79, pid=2317, name=python, GPU has fallen off the bus.",
            2201 + i
        )
        .unwrap();
        file.flush().unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(file);
    let xid_subjects = || -> std::collections::BTreeSet<String> {
        let Some(node) = node_record(repairer_addr, "n3") else { return Default::default() };
        node["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["finding"]["finding"] == "xid" || f["finding"] == "xid")
            .filter_map(|f| {
                f["finding"]["subject"].as_str().or(f["subject"].as_str()).map(str::to_owned)
            })
            .collect()
    };
    let landed = poll_until(Duration::from_secs(30), || xid_subjects().len() == BUSES.len());
    assert!(
        landed,
        "findings on the repairer: {:?}\n{}\n{}",
        node_record(repairer_addr, "n3"),
        agent.stderr(),
        repairer.stderr()
    );

    // The agent was refused and waited at least what it was told (1 s or more) each time, not
    // its own 100 ms backoff.
    let (_, metrics) = http_get(repairer_addr, "/metrics").unwrap();
    let throttled = sample(&metrics, r#"fleetmend_api_refused_total{status="429"}"#).unwrap();
    assert!(throttled >= 3.0, "{metrics}");
    let log = agent.stderr();
    let waits: Vec<Duration> = log
        .lines()
        .filter(|l| l.contains("HTTP 429"))
        .filter_map(|l| {
            l.split("retry_in=").nth(1)?.split_whitespace().next().and_then(parse_debug_duration)
        })
        .collect();
    assert!(!waits.is_empty(), "the agent never logged a 429:\n{log}");
    assert!(waits.iter().all(|w| *w >= Duration::from_secs(1)), "{waits:?}");
}

/// A report of `node` as an agent sends it, healthy.
fn minimal_report(node: &str) -> String {
    serde_json::json!({
        "wire_version": fleetmend_proto::WIRE_VERSION,
        "node": node,
        "boot_id": "b",
        "agent_version": "test",
        "seq": 1,
        "sent_at_ms": 1,
        "trigger": "interval",
        "verdict": "healthy",
        "checks": [],
        "findings": [],
    })
    .to_string()
}

/// A POST whose answer's head and body come back as they were sent (headers included).
fn raw_post(addr: SocketAddr, path: &str, json: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// A `Duration`'s `Debug` form (`1.2345s`, `850ms`).
fn parse_debug_duration(text: &str) -> Option<Duration> {
    let text = text.trim_end_matches(',');
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|v| Duration::from_secs_f64(v / 1000.0));
    }
    if text.ends_with("µs") || text.ends_with("ns") {
        return Some(Duration::ZERO);
    }
    text.strip_suffix('s')?.parse::<f64>().ok().map(Duration::from_secs_f64)
}
