//! The HTTP listener the agent's `/metrics` and the repairer's API are served on.
//!
//! A client that connects and sends half a request, or nothing, or never reads its answer, holds a
//! descriptor for as long as the server lets it. Here every phase of a connection has a deadline
//! (`[listener]`: the head of a request, its body, the quiet time between requests, the TLS
//! handshake under the head's deadline), and the open connections are capped: one beyond the cap
//! is closed as soon as it is accepted. Each is counted ([`metrics`]), so an attack shows on both
//! processes' `/metrics`.
//!
//! HTTP/1.1 only (what agents, Prometheus and the CLI speak), with hyper driven by this crate's own
//! accept loop (`axum::serve` has no header deadline and no cap).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

pub mod config;
mod connection;
pub mod descriptors;
pub mod metrics;

pub use config::ListenerConfig;
pub use metrics::{ListenerStats, Phase};

/// The peer's address, in every request's extensions (what a handler keys a per-client limit on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Turns an accepted TCP stream into the stream HTTP is spoken on (TLS, or the stream itself).
/// It runs under the header deadline, on the connection's own task.
pub trait Handshake: Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The stream to serve, or `None` when the connection was answered and closed here.
    fn handshake(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> impl Future<Output = io::Result<Option<Self::Io>>> + Send;
}

/// Plain HTTP: the TCP stream as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;

    async fn handshake(
        &self,
        stream: TcpStream,
        _peer: SocketAddr,
    ) -> io::Result<Option<TcpStream>> {
        Ok(Some(stream))
    }
}

/// How often a repeated condition (shedding, failing accepts) is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// The pause after a failed accept (out of descriptors and the like), so it does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets requests in
/// flight finish (idle connections close at once) and returns once every connection is closed.
pub async fn serve<H: Handshake>(
    listener: TcpListener,
    app: axum::Router,
    handshake: H,
    config: ListenerConfig,
    stats: Arc<ListenerStats>,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let cap = descriptors::fit(config.max_connections);
    stats.set_max(u64::from(cap));
    let permits = Arc::new(Semaphore::new(cap as usize));
    let handshake = Arc::new(handshake);
    let (stop, stopped) = watch::channel(false);
    let mut shed = Throttled::default();
    let mut failed = Throttled::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                if let Some(more) = failed.due() {
                    tracing::warn!(error = %err, since_last_line = more, "accepting a connection failed");
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            stats.count_shed();
            drop(stream);
            if let Some(more) = shed.due() {
                tracing::warn!(%peer, max_connections = cap, shed = more, "connection cap reached: shedding new connections");
            }
            continue;
        };
        stats.opened();
        let slot = connection::Slot { _permit: permit, stats: stats.clone() };
        tokio::spawn(connection::run(connection::Accepted {
            stream,
            peer,
            slot,
            app: app.clone(),
            handshake: handshake.clone(),
            config,
            stop: stopped.clone(),
        }));
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a permit until it closes.
    let _all = permits.acquire_many(cap).await;
    Ok(())
}

/// A log line at most every [`LOG_EVERY`], with how many times the condition occurred since.
#[derive(Debug, Default)]
struct Throttled {
    last: Option<Instant>,
    count: u64,
}

impl Throttled {
    /// Counts one occurrence; returns the count when a line is due (and starts counting again).
    fn due(&mut self) -> Option<u64> {
        self.count += 1;
        let now = Instant::now();
        if self.last.is_some_and(|last| now.duration_since(last) < LOG_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}
