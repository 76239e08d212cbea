//! Posting progress to the queue (`FLEETMEND_PROGRESS_URL`) from a background thread.
//!
//! Training never waits on it: the training loop offers the newest [`Progress`] without
//! blocking (a post still in flight makes it drop the older one), each post has a short timeout,
//! and failures are only logged (the first, then at most one line a minute). The queue's reply
//! may carry a checkpoint interval (`--checkpoint-every auto`), handed back through an atomic.
//!
//! While the training loop offers nothing new (a long step, or a collective waiting for a rank
//! that does not come), the thread repeats the newest post every [`HEARTBEAT_EVERY`] with the
//! ranks the collective waits for ([`CollectiveWatch::waiting_for`]): the queue tells a hung
//! job from a slow one by it, and names the rank that did not arrive. A stopped or hung rank
//! posts nothing: its silence names it too.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::thread;
use std::time::{Duration, Instant};

use fleetmend_proto::jobs::{Progress, ProgressReply};

use crate::collective::CollectiveWatch;

/// Connect, write and read limit of one post.
const POST_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest reply read.
const MAX_REPLY_BYTES: u64 = 64 * 1024;
/// Repeated failures are logged at most this often.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// How often the newest post is repeated while training offers nothing newer.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);

/// An `http://host:port/path` URL (the queue speaks plain HTTP on its own network).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `host:port` as given (the port defaults to 80).
    pub authority: String,
    /// Host without the port, for the `Host` header.
    pub host: String,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl HttpUrl {
    /// Parses `url`; only `http://` is supported.
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url:?}: only http:// URLs are supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        let has_port = match authority.rfind(':') {
            Some(i) => !authority[i..].contains(']'),
            None => false,
        };
        let host = if has_port {
            authority[..authority.rfind(':').unwrap_or(authority.len())].to_string()
        } else {
            authority.to_string()
        };
        let authority = if has_port { authority.to_string() } else { format!("{authority}:80") };
        Ok(HttpUrl { authority, host, path: path.to_string() })
    }
}

/// The handle the training loop posts through.
#[derive(Debug)]
pub struct ProgressPoster {
    sender: SyncSender<Progress>,
    /// Disconnects when the posting thread ends.
    finished: mpsc::Receiver<()>,
}

impl ProgressPoster {
    /// Starts the posting thread; a checkpoint interval in a reply is stored in `interval`;
    /// heartbeats say whom `watch` waits for.
    pub fn start(
        url: HttpUrl,
        token: Option<String>,
        interval: Arc<AtomicU64>,
        watch: Option<Arc<CollectiveWatch>>,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::sync_channel::<Progress>(1);
        let (finished_sender, finished) = mpsc::channel::<()>();
        let mut url = url;
        thread::Builder::new().name("progress-post".into()).spawn(move || {
            let _finished = finished_sender;
            let mut last_failure_log: Option<Instant> = None;
            let mut failing = false;
            let mut latest: Option<Progress> = None;
            loop {
                let mut progress = match receiver.recv_timeout(HEARTBEAT_EVERY) {
                    Ok(progress) => progress,
                    Err(RecvTimeoutError::Timeout) => match &latest {
                        Some(latest) => Progress { at_ms: unix_ms(), ..latest.clone() },
                        None => continue,
                    },
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                progress.waiting_for = watch
                    .as_ref()
                    .and_then(|w| w.waiting_for())
                    .map(|rank| vec![rank as u32])
                    .unwrap_or_default();
                latest = Some(progress.clone());
                let mut outcome = post(&url, token.as_deref(), &progress);
                // A standby repairer names the leader: posts go there from now on (once per
                // post, so two repairers that name each other cannot loop).
                if let Err(PostFailure { leader: Some(leader), .. }) = &outcome
                    && let Ok(next) = HttpUrl::parse(&format!("{leader}{}", url.path))
                    && next.authority != url.authority
                {
                    eprintln!(
                        "fleetmend train: progress goes to the leading repairer, http://{}",
                        next.authority
                    );
                    url = next;
                    outcome = post(&url, token.as_deref(), &progress);
                }
                match outcome.map_err(|failure| failure.reason) {
                    Ok(reply) => {
                        if failing {
                            eprintln!("fleetmend train: progress posts to {} work again", url.path);
                            failing = false;
                        }
                        if let Some(every) = reply.checkpoint_every.filter(|&n| n > 0) {
                            interval.store(every, Ordering::Relaxed);
                        }
                    }
                    Err(reason) => {
                        failing = true;
                        if last_failure_log.is_none_or(|at| at.elapsed() >= FAILURE_LOG_INTERVAL) {
                            eprintln!(
                                "fleetmend train: posting progress to http://{}{} failed (training goes on): {reason}",
                                url.authority, url.path
                            );
                            last_failure_log = Some(Instant::now());
                        }
                    }
                }
            }
        })?;
        Ok(ProgressPoster { sender, finished })
    }

    /// Lets the last offered progress (the final step) go out, waiting at most `limit`.
    pub fn finish(self, limit: Duration) {
        let ProgressPoster { sender, finished } = self;
        drop(sender);
        let _ = finished.recv_timeout(limit);
    }

    /// Offers `progress` for posting; never blocks (drops it when a post is still pending).
    pub fn offer(&self, progress: Progress) {
        match self.sender.try_send(progress) {
            Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Why a post failed, and the leader's base URL when a standby repairer named it.
#[derive(Debug)]
struct PostFailure {
    reason: String,
    leader: Option<String>,
}

impl From<String> for PostFailure {
    fn from(reason: String) -> Self {
        PostFailure { reason, leader: None }
    }
}

/// Connects to the first of `authority`'s addresses that answers: a name with one address per
/// repairer reaches whichever is up.
fn connect(authority: &str) -> Result<TcpStream, String> {
    let addresses: Vec<_> =
        authority.to_socket_addrs().map_err(|e| format!("resolving {authority}: {e}"))?.collect();
    let mut failures = Vec::new();
    for address in &addresses {
        match TcpStream::connect_timeout(address, POST_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(err) => failures.push(format!("connecting to {address}: {err}")),
        }
    }
    if failures.is_empty() {
        return Err(format!("{authority} resolves to no address"));
    }
    Err(failures.join("; "))
}

/// One POST with a JSON body; the reply's [`ProgressReply`] (empty when the body has none).
fn post(
    url: &HttpUrl,
    token: Option<&str>,
    progress: &Progress,
) -> Result<ProgressReply, PostFailure> {
    let body = serde_json::to_vec(progress).map_err(|e| e.to_string())?;
    let mut stream = connect(&url.authority)?;
    stream.set_read_timeout(Some(POST_TIMEOUT)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(POST_TIMEOUT)).map_err(|e| e.to_string())?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{auth}Connection: close\r\n\r\n",
        url.path,
        url.host,
        body.len()
    );
    stream.write_all(head.as_bytes()).map_err(|e| format!("sending: {e}"))?;
    stream.write_all(&body).map_err(|e| format!("sending: {e}"))?;
    let mut reply = Vec::new();
    stream
        .take(MAX_REPLY_BYTES)
        .read_to_end(&mut reply)
        .map_err(|e| format!("reading the reply: {e}"))?;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP status in the reply {head:?}"))?;
    if !(200..300).contains(&status) {
        let leader = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            let value = value.trim();
            (name.trim().eq_ignore_ascii_case(fleetmend_proto::repairers::LEADER_HEADER)
                && value.starts_with("http://"))
            .then(|| value.trim_end_matches('/').to_owned())
        });
        return Err(PostFailure { reason: format!("HTTP {status}: {}", body.trim()), leader });
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body) } else { body.to_string() };
    if body.trim().is_empty() {
        return Ok(ProgressReply::default());
    }
    serde_json::from_str(body.trim())
        .map_err(|e| PostFailure::from(format!("reading the reply body: {e}")))
}

/// The data of a chunked body (lenient: stops at anything malformed).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn urls_parse() {
        let url = HttpUrl::parse("http://127.0.0.1:9830/v1/jobs/j/progress").unwrap();
        assert_eq!(url.authority, "127.0.0.1:9830");
        assert_eq!(url.host, "127.0.0.1");
        assert_eq!(url.path, "/v1/jobs/j/progress");
        assert_eq!(HttpUrl::parse("http://queue").unwrap().authority, "queue:80");
        assert!(HttpUrl::parse("https://queue/").is_err());
    }

    #[test]
    fn a_post_carries_the_token_and_the_reply_sets_the_interval() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Read until the JSON body's end.
            while !request.ends_with(b"}") {
                let n = stream.read(&mut buf).unwrap();
                assert!(n > 0);
                request.extend_from_slice(&buf[..n]);
            }
            let body = b"{\"checkpoint_every\":42}";
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(reply.as_bytes()).unwrap();
            stream.write_all(body).unwrap();
            String::from_utf8(request).unwrap()
        });
        let interval = Arc::new(AtomicU64::new(0));
        let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/p")).unwrap();
        let poster =
            ProgressPoster::start(url, Some("tok".into()), interval.clone(), None).unwrap();
        poster.offer(progress(3));
        let request = server.join().unwrap();
        assert!(request.starts_with("POST /p HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("Authorization: Bearer tok\r\n"), "{request}");
        assert!(request.contains("\"step\":3"), "{request}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while interval.load(Ordering::Relaxed) != 42 {
            assert!(Instant::now() < deadline, "interval never set");
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn progress(step: u64) -> Progress {
        Progress {
            job: "j".into(),
            attempt: 0,
            rank: 0,
            step,
            start_step: 0,
            loss: 1.5,
            samples_per_second: 10.0,
            checkpoint_step: None,
            checkpoint_write_seconds: None,
            checkpoint_stall_seconds: None,
            step_seconds: Some(0.01),
            waiting_for: Vec::new(),
            at_ms: 1,
        }
    }

    /// The body of one request accepted on `listener`, answered with an empty 200.
    fn accept_post(listener: &TcpListener) -> Progress {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.ends_with(b"}") {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0);
            request.extend_from_slice(&buf[..n]);
        }
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").unwrap();
        let text = String::from_utf8(request).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn with_nothing_new_the_newest_post_is_repeated_as_a_heartbeat() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/p")).unwrap();
        let poster = ProgressPoster::start(url, None, Arc::new(AtomicU64::new(0)), None).unwrap();
        poster.offer(progress(7));
        let first = accept_post(&listener);
        let started = Instant::now();
        // Nothing more is offered: the same step comes again, newly dated, about
        // HEARTBEAT_EVERY later.
        let second = accept_post(&listener);
        assert!(started.elapsed() >= HEARTBEAT_EVERY / 2, "{:?}", started.elapsed());
        assert_eq!((first.step, second.step), (7, 7));
        assert_eq!(first.at_ms, 1);
        assert!(second.at_ms > 1, "a heartbeat carries its own time");
        assert!(second.waiting_for.is_empty(), "no collective: nobody is waited for");
        poster.finish(Duration::from_secs(5));
    }

    /// A standby repairer answers 503 and names the leader: the same post goes to the leader at
    /// once, and every later one too.
    #[test]
    fn a_standby_s_503_sends_the_posts_to_the_leader_it_names() {
        let standby = TcpListener::bind("127.0.0.1:0").unwrap();
        let leader = TcpListener::bind("127.0.0.1:0").unwrap();
        let leader_url = format!("http://{}", leader.local_addr().unwrap());
        let standby_port = standby.local_addr().unwrap().port();
        let refused = thread::spawn(move || {
            let (mut stream, _) = standby.accept().unwrap();
            let mut buf = [0u8; 4096];
            let mut request = Vec::new();
            while !request.ends_with(b"}") {
                let n = stream.read(&mut buf).unwrap();
                assert!(n > 0);
                request.extend_from_slice(&buf[..n]);
            }
            let reply = format!(
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nFleetmend-Leader: {leader_url}\r\n\
                 Content-Length: 2\r\n\r\n{{}}"
            );
            stream.write_all(reply.as_bytes()).unwrap();
        });
        let url =
            HttpUrl::parse(&format!("http://127.0.0.1:{standby_port}/v1/jobs/j/progress")).unwrap();
        let poster = ProgressPoster::start(url, None, Arc::new(AtomicU64::new(0)), None).unwrap();
        poster.offer(progress(3));
        refused.join().unwrap();
        assert_eq!(accept_post(&leader).step, 3, "the refused post, sent again to the leader");
        poster.offer(progress(4));
        assert_eq!(accept_post(&leader).step, 4, "and the next one");
        poster.finish(Duration::from_secs(5));
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n"), "{\"a\":1}");
    }
}
