//! The listener against clients that stall in each phase, on loopback, with short deadlines.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use axum::routing::{get, post};
use fleetmend_listener::{Handshake, ListenerConfig, ListenerStats, PeerAddr, Phase, Plain, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout};

const HEADER: Duration = Duration::from_millis(300);
const BODY: Duration = Duration::from_millis(600);
const IDLE: Duration = Duration::from_millis(1200);
/// Scheduling slack on top of a deadline.
const SLACK: Duration = Duration::from_millis(700);

fn config(max_connections: u32) -> ListenerConfig {
    ListenerConfig {
        header_timeout: HEADER,
        body_timeout: BODY,
        idle_timeout: IDLE,
        max_connections,
    }
}

fn app() -> Router {
    Router::new()
        .route("/peer", get(|Extension(PeerAddr(peer)): Extension<PeerAddr>| async move { peer.ip().to_string() }))
        .route("/echo", post(|body: String| async move { body }))
}

struct Server {
    addr: SocketAddr,
    stats: Arc<ListenerStats>,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start<H: Handshake>(handshake: H, max_connections: u32) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(ListenerStats::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(serve(
        listener,
        app(),
        handshake,
        config(max_connections),
        stats.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    Server { addr, stats, stop: Some(stop), served }
}

fn timeouts(stats: &ListenerStats, phase: Phase) -> u64 {
    stats.timeouts().iter().find(|(p, _)| *p == phase).map_or(0, |(_, n)| *n)
}

/// Reads until the server closes; how long that took from `since`. Fails past `limit`.
async fn closed_after(stream: &mut TcpStream, since: Instant, limit: Duration) -> Duration {
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    timeout(limit, read_all).await.expect("the server did not close the connection in time");
    since.elapsed()
}

/// One keep-alive request's answer: its head and body (content-length framing).
async fn exchange(stream: &mut TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    return text;
                }
            }
        }
    };
    timeout(Duration::from_secs(5), read).await.expect("no answer within 5 s")
}

#[tokio::test]
async fn a_half_sent_head_is_closed_at_the_header_deadline() {
    let server = start(Plain, 16).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let since = Instant::now();
    stream.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let took = closed_after(&mut stream, since, HEADER + SLACK).await;
    assert!(took >= HEADER - Duration::from_millis(50), "closed after {took:?}");
    assert_eq!(timeouts(&server.stats, Phase::Header), 1);
    assert!(open_reaches(&server.stats, 0).await);
}

#[tokio::test]
async fn a_kept_alive_connection_waits_the_idle_time_not_the_header_time() {
    let server = start(Plain, 16).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let answer = exchange(&mut stream, "GET /peer HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("127.0.0.1"), "{answer}");
    let since = Instant::now();
    // Quiet for longer than the header deadline: still open, and a second request is answered.
    let mut byte = [0u8; 1];
    let early = timeout(HEADER * 2, stream.read(&mut byte)).await;
    assert!(early.is_err(), "closed while quiet before the idle deadline: {early:?}");
    let again = exchange(&mut stream, "GET /peer HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    let since_second = Instant::now();
    let took = closed_after(&mut stream, since, IDLE * 2 + SLACK).await;
    assert!(since_second.elapsed() >= IDLE - Duration::from_millis(50), "closed after {took:?}");
    assert_eq!(timeouts(&server.stats, Phase::Idle), 1);
    assert_eq!(timeouts(&server.stats, Phase::Header), 0);
}

#[tokio::test]
async fn the_next_head_on_a_kept_alive_connection_has_the_header_deadline() {
    let server = start(Plain, 16).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    exchange(&mut stream, "GET /peer HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let since = Instant::now();
    stream.write_all(b"GET /peer HTTP/1.1\r\n").await.unwrap();
    let took = closed_after(&mut stream, since, HEADER + SLACK).await;
    assert!(took < IDLE, "closed after {took:?}: the idle deadline, not the header's");
    assert_eq!(timeouts(&server.stats, Phase::Header), 1);
}

#[tokio::test]
async fn a_half_sent_body_is_closed_at_the_body_deadline() {
    let server = start(Plain, 16).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let since = Instant::now();
    let took = closed_after(&mut stream, since, BODY + SLACK).await;
    assert!(took >= BODY - Duration::from_millis(100), "closed after {took:?}");
    assert_eq!(timeouts(&server.stats, Phase::Body), 1);
    // A whole body in time is answered.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let answer =
        exchange(&mut stream, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            .await;
    assert!(answer.ends_with("hello"), "{answer}");
}

#[tokio::test]
async fn connections_past_the_cap_are_shed_and_counted() {
    let server = start(Plain, 2).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream.write_all(b"GET /peer HTTP/1.1\r\n").await.unwrap();
        held.push(stream);
    }
    assert!(open_reaches(&server.stats, 2).await);
    let mut shed = TcpStream::connect(server.addr).await.unwrap();
    let since = Instant::now();
    let took = closed_after(&mut shed, since, HEADER).await;
    assert!(took < HEADER, "the shed connection stayed {took:?}");
    assert_eq!(server.stats.shed(), 1);
    assert_eq!(server.stats.max(), 2);
    // The held ones reach their header deadline; then there is room again.
    for stream in &mut held {
        closed_after(stream, since, HEADER + SLACK).await;
    }
    assert!(open_reaches(&server.stats, 0).await);
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let answer = exchange(&mut stream, "GET /peer HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A handshake that waits for a byte that never comes (a TLS client that connects and says
/// nothing).
struct Silent;

impl Handshake for Silent {
    type Io = TcpStream;

    async fn handshake(
        &self,
        mut stream: TcpStream,
        _peer: SocketAddr,
    ) -> std::io::Result<Option<TcpStream>> {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await?;
        Ok(Some(stream))
    }
}

#[tokio::test]
async fn a_handshake_runs_under_the_header_deadline() {
    let server = start(Silent, 16).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let since = Instant::now();
    closed_after(&mut stream, since, HEADER + SLACK).await;
    assert_eq!(timeouts(&server.stats, Phase::Handshake), 1);
    assert_eq!(timeouts(&server.stats, Phase::Header), 0);
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_returns() {
    let mut server = start(Plain, 16).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    exchange(&mut stream, "GET /peer HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let since = Instant::now();
    let _ = server.stop.take().map(|stop| stop.send(()));
    let took = closed_after(&mut stream, since, IDLE).await;
    assert!(took < IDLE, "{took:?}");
    let served = timeout(Duration::from_secs(5), server.served).await;
    assert!(matches!(served, Ok(Ok(Ok(())))), "{served:?}");
    assert!(TcpStream::connect(server.addr).await.is_err(), "still listening after shutdown");
}

/// Polls (with a deadline) until the open count is `n`.
async fn open_reaches(stats: &ListenerStats, n: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if stats.open() == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}
