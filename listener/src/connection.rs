//! One connection: the handshake, then HTTP/1.1 under the deadline of the phase it is in.
//!
//! hyper's own `header_read_timeout` is not used: it starts when the connection is ready for a
//! request, so on a kept-alive connection it also bounds the wait for the next request, and the
//! idle wait could never be longer than the header deadline. Here the phase is tracked beside
//! hyper instead: the stream notices the first byte of a request, the service its head and the
//! end of its body, and the driver closes the connection when the phase's deadline passes.
//!
//! | phase | from | deadline |
//! |---|---|---|
//! | head | the accept (first request), or the first byte of the next one | `header_timeout` |
//! | body | the head | `body_timeout` |
//! | handler | the end of the body | none (the process's own work) |
//! | quiet | the response, and every byte moved since | `idle_timeout` |

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, watch};
use tokio::time::Instant;

use crate::metrics::{ListenerStats, Phase};
use crate::{Handshake, ListenerConfig, PeerAddr};

const HEAD: u8 = 0;
const BODY: u8 = 1;
const HANDLER: u8 = 2;
const QUIET: u8 = 3;

/// Where a connection is, shared by its stream, its service and its driver (one task polls them
/// all; the atomics only make the sharing safe).
#[derive(Debug)]
struct Tracker {
    origin: Instant,
    phase: AtomicU8,
    /// When the phase began, in ms since `origin`.
    since: AtomicU64,
    /// When a byte last moved either way, in ms since `origin`.
    last_io: AtomicU64,
    /// Woken when the phase changes (its deadline may come sooner).
    changed: Notify,
}

impl Tracker {
    fn new(origin: Instant) -> Tracker {
        Tracker {
            origin,
            phase: AtomicU8::new(HEAD),
            since: AtomicU64::new(0),
            last_io: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn enter(&self, phase: u8) {
        self.since.store(self.now(), Ordering::Relaxed);
        self.phase.store(phase, Ordering::Relaxed);
        self.changed.notify_one();
    }

    /// Bytes came in: in the quiet phase, the next request has begun.
    fn read(&self) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self.phase.compare_exchange(QUIET, HEAD, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.since.store(now, Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    fn wrote(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
    }

    /// The current phase's deadline and what overrunning it is called; none in a handler.
    fn deadline(&self, config: &ListenerConfig) -> Option<(Instant, Phase)> {
        let at = |ms: u64, limit: Duration| self.origin + Duration::from_millis(ms) + limit;
        let since = self.since.load(Ordering::Relaxed);
        match self.phase.load(Ordering::Relaxed) {
            HEAD => Some((at(since, config.header_timeout), Phase::Header)),
            BODY => Some((at(since, config.body_timeout), Phase::Body)),
            QUIET => {
                let last = since.max(self.last_io.load(Ordering::Relaxed));
                Some((at(last, config.idle_timeout), Phase::Idle))
            }
            _ => None,
        }
    }
}

/// The stream hyper reads and writes, telling the tracker when bytes move.
struct Tracked<S> {
    inner: S,
    tracker: Arc<Tracker>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.tracker.read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.tracker.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.tracker.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request's body, telling the tracker when it ended (the handler's time is not the client's).
struct TrackedBody {
    inner: Incoming,
    tracker: Arc<Tracker>,
}

impl TrackedBody {
    fn ended(&self) {
        if self.tracker.phase.load(Ordering::Relaxed) == BODY {
            self.tracker.enter(HANDLER);
        }
    }
}

impl Body for TrackedBody {
    type Data = <Incoming as Body>::Data;
    type Error = <Incoming as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.ended(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.ended(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Holds the connection's place under the cap, and its count, until it closes.
pub(crate) struct Slot {
    pub(crate) _permit: OwnedSemaphorePermit,
    pub(crate) stats: Arc<ListenerStats>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats.closed();
    }
}

/// Everything one connection needs.
pub(crate) struct Accepted<H> {
    pub(crate) stream: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) slot: Slot,
    pub(crate) app: axum::Router,
    pub(crate) handshake: Arc<H>,
    pub(crate) config: ListenerConfig,
    pub(crate) stop: watch::Receiver<bool>,
}

/// Serves one connection until it closes, the client overruns a deadline or the listener stops.
pub(crate) async fn run<H: Handshake>(accepted: Accepted<H>) {
    let Accepted { stream, peer, slot, app, handshake, config, mut stop } = accepted;
    let origin = Instant::now();
    let stats = slot.stats.clone();
    // The handshake and the first request's head share one deadline from the accept.
    let io = match tokio::time::timeout_at(
        origin + config.header_timeout,
        handshake.handshake(stream, peer),
    )
    .await
    {
        Ok(Ok(Some(io))) => io,
        Ok(Ok(None)) => return,
        Ok(Err(err)) => {
            tracing::debug!(%peer, error = %err, "handshake failed");
            return;
        }
        Err(_) => {
            stats.count_timeout(Phase::Handshake);
            tracing::debug!(%peer, "handshake not finished by the header deadline");
            return;
        }
    };
    let tracker = Arc::new(Tracker::new(origin));
    let io = TokioIo::new(Tracked { inner: io, tracker: tracker.clone() });
    let service = {
        let tracker = tracker.clone();
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let tracker = tracker.clone();
            let mut app = app.clone();
            let (mut parts, body) = request.into_parts();
            parts.extensions.insert(PeerAddr(peer));
            tracker.enter(if body.is_end_stream() { HANDLER } else { BODY });
            let body = TrackedBody { inner: body, tracker: tracker.clone() };
            async move {
                let response =
                    tower_service::Service::call(&mut app, Request::from_parts(parts, body)).await;
                tracker.enter(QUIET);
                response
            }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = *stop.borrow();
    if stopping {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        let deadline = tracker.deadline(&config);
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(err) = served {
                    tracing::debug!(%peer, error = %err, "connection ended with an error");
                }
                return;
            }
            () = until(deadline.map(|(at, _)| at)) => {
                // The phase may have moved on (its deadline later) since the sleep began.
                if let Some((at, phase)) = tracker.deadline(&config)
                    && at <= Instant::now()
                {
                    stats.count_timeout(phase);
                    tracing::debug!(%peer, phase = phase.as_str(), "deadline passed: connection closed");
                    return;
                }
            }
            () = tracker.changed.notified() => {}
            _ = stop.changed(), if !stopping => {
                // Told to stop, or the listener is gone: finish the request in flight, if any.
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Sleeps until `deadline`; never without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
