//! Rendezvous through rank 0, then the ring connections.
//!
//! Rank 0 listens on `MASTER_ADDR:MASTER_PORT`. Every other rank connects (retrying with capped,
//! jittered backoff: rank 0 may start after it), and sends a `Join` with its rank, the world size,
//! the run id and the address of its own ring listener. Once all ranks joined, rank 0 answers each
//! with every rank's ring address; if the rendezvous deadline passes first it answers `Abandoned`
//! with the ranks that never came. Then each rank connects to its successor, introduces itself with
//! a `RingHello`, and accepts its predecessor.

use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};
use std::{io, thread};

use fleetmend_proto::backoff::Backoff;

use super::wire::{self, Message, MessageError, PROTOCOL_VERSION};
use super::{CollectiveConfig, Membership, RendezvousError};

/// How long one accepted connection may take to say who it is before it is dropped: a stray client
/// must not hold up the ranks behind it for long.
const JOIN_READ_LIMIT: Duration = Duration::from_secs(5);

/// Longest single connect attempt; the loop around it retries until the rendezvous deadline.
const CONNECT_ATTEMPT_LIMIT: Duration = Duration::from_secs(5);

/// A rank other than 0 waits this much past its own deadline for rank 0's verdict, so that when
/// rank 0 gives up (at its own, possibly later, deadline) the rank still learns which ranks were
/// missing instead of timing out with less to say.
const VERDICT_GRACE: Duration = Duration::from_secs(5);

/// Backoff between connect attempts, jittered so that ranks restarted together do not knock on
/// rank 0 in lockstep.
const CONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// Backoff between failed accepts: errors such as EMFILE repeat at once.
const ACCEPT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));

/// The two ring connections of a rank.
#[derive(Debug)]
pub(super) struct RingStreams {
    /// To rank + 1: this rank only writes to it.
    pub successor: TcpStream,
    /// From rank - 1: this rank only reads from it.
    pub predecessor: TcpStream,
}

/// Runs the rendezvous and connects the ring. `None` for a world of one rank (nobody to meet).
pub(super) fn connect_ring(
    membership: &Membership,
    config: &CollectiveConfig,
) -> Result<Option<RingStreams>, RendezvousError> {
    if membership.world_size == 1 {
        return Ok(None);
    }
    let started = Instant::now();
    let deadline = started + config.rendezvous_timeout;
    let (ring_listener, ring_addrs) = if membership.rank == 0 {
        host_rendezvous(membership, config, started, deadline)?
    } else {
        join_rendezvous(membership, config, started, deadline)?
    };
    let world = membership.world_size;
    let successor_rank = (membership.rank + 1) % world;
    let predecessor_rank = (membership.rank + world - 1) % world;

    // Connect first, then accept: the successor's listener was bound before it joined, so the
    // connection completes in its backlog without waiting for its accept.
    let successor_addr = ring_addrs[successor_rank];
    let mut successor = connect_until(|| Ok(vec![successor_addr]), deadline).map_err(|source| {
        RendezvousError::RingConnect {
            peer: successor_rank,
            addr: successor_addr,
            waited: started.elapsed(),
            source,
        }
    })?;
    let hello = Message::RingHello {
        protocol: PROTOCOL_VERSION,
        run_id: membership.run_id.clone(),
        rank: membership.rank,
    };
    wire::write_message(&mut successor, &hello, deadline).map_err(|e| {
        RendezvousError::RingHandshake { peer: successor_rank, detail: e.to_string() }
    })?;

    let acceptor = Acceptor::start(&ring_listener).map_err(|source| RendezvousError::Socket {
        what: "starting the ring accept loop",
        source,
    })?;
    let predecessor = loop {
        let (mut stream, from) = match acceptor.next_until(deadline) {
            None => {
                return Err(RendezvousError::RingAccept {
                    peer: predecessor_rank,
                    waited: started.elapsed(),
                });
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "accepting a ring connection failed; still waiting");
                continue;
            }
            Some(Ok(accepted)) => accepted,
        };
        let read_deadline = deadline.min(Instant::now() + JOIN_READ_LIMIT);
        match wire::read_message(&mut stream, read_deadline) {
            Ok(Message::RingHello { protocol, run_id, rank })
                if protocol == PROTOCOL_VERSION
                    && run_id == membership.run_id
                    && rank == predecessor_rank =>
            {
                break stream;
            }
            Ok(other) => {
                tracing::warn!(%from, message = ?other, expected_rank = predecessor_rank,
                    "ignoring a ring connection that is not this rank's predecessor in this run");
            }
            Err(error) => {
                tracing::warn!(
                    %from, %error,
                    "ignoring a ring connection that did not introduce itself"
                );
            }
        }
    };
    drop(acceptor);
    for stream in [&successor, &predecessor] {
        stream.set_nodelay(true).map_err(|source| RendezvousError::Socket {
            what: "setting TCP_NODELAY on a ring connection",
            source,
        })?;
    }
    Ok(Some(RingStreams { successor, predecessor }))
}

/// Rank 0: listen, collect every rank's `Join`, answer with the ring addresses.
fn host_rendezvous(
    membership: &Membership,
    config: &CollectiveConfig,
    started: Instant,
    deadline: Instant,
) -> Result<(TcpListener, Vec<SocketAddr>), RendezvousError> {
    let master = resolve(&membership.master_addr, membership.master_port)
        .and_then(|addrs| {
            addrs.into_iter().next().ok_or_else(|| io::Error::other("resolved to no address"))
        })
        .map_err(|source| RendezvousError::Resolve {
            addr: membership.master_endpoint(),
            source,
        })?;
    let bind_ip = config.bind_ip.unwrap_or(if master.ip().is_loopback() {
        master.ip()
    } else {
        unspecified_like(master.ip())
    });
    let listen_addr = SocketAddr::new(bind_ip, membership.master_port);
    let listener = TcpListener::bind(listen_addr).map_err(|source| RendezvousError::Bind {
        what: "rendezvous",
        addr: listen_addr,
        source,
    })?;
    let ring_bind = SocketAddr::new(bind_ip, config.ring_port);
    let ring_listener = TcpListener::bind(ring_bind).map_err(|source| RendezvousError::Bind {
        what: "ring",
        addr: ring_bind,
        source,
    })?;
    let ring_port = local_port(&ring_listener)?;
    // Peers reach rank 0 at the address they were told to meet it at.
    let advertise_ip = config.advertise_ip.unwrap_or(master.ip());

    let world = membership.world_size;
    let mut ring_addrs: Vec<Option<SocketAddr>> = vec![None; world];
    ring_addrs[0] = Some(SocketAddr::new(advertise_ip, ring_port));
    let mut joined: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut arrived = 1;

    let acceptor = Acceptor::start(&listener).map_err(|source| RendezvousError::Socket {
        what: "starting the rendezvous accept loop",
        source,
    })?;
    while arrived < world {
        let (mut stream, from) = match acceptor.next_until(deadline) {
            None => {
                let missing: Vec<usize> = (1..world).filter(|&r| ring_addrs[r].is_none()).collect();
                let waited = started.elapsed();
                let verdict = Message::Abandoned {
                    missing: missing.clone(),
                    waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                };
                for stream in joined.iter_mut().flatten() {
                    let _ = wire::write_message(stream, &verdict, Instant::now() + JOIN_READ_LIMIT);
                }
                return Err(RendezvousError::Incomplete { missing, world_size: world, waited });
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "accepting a rendezvous connection failed; still waiting");
                continue;
            }
            Some(Ok(accepted)) => accepted,
        };
        let read_deadline = deadline.min(Instant::now() + JOIN_READ_LIMIT);
        let join = match wire::read_message(&mut stream, read_deadline) {
            Ok(join) => join,
            Err(error) => {
                tracing::warn!(%from, %error, "ignoring a rendezvous connection that did not join");
                continue;
            }
        };
        let refusal = match join {
            Message::Join { protocol, run_id, rank, world_size, ring_addr } => {
                let joined_alive = joined.get(rank).and_then(Option::as_ref);
                let joined_alive = joined_alive.is_some_and(connection_alive);
                let refusal =
                    join_refusal(membership, protocol, &run_id, rank, world_size, joined_alive);
                if refusal.is_none() {
                    if ring_addrs[rank].is_none() {
                        arrived += 1;
                    } else {
                        tracing::warn!(rank, %from, "a rank rejoined after its connection closed");
                    }
                    ring_addrs[rank] = Some(ring_addr);
                    joined[rank] = Some(stream);
                    continue;
                }
                refusal
            }
            other => Some(format!("expected a join, received {other:?}")),
        };
        if let Some(reason) = refusal {
            tracing::warn!(%from, %reason, "refused a rank at the rendezvous");
            let _ = wire::write_message(
                &mut stream,
                &Message::Refused { reason },
                Instant::now() + JOIN_READ_LIMIT,
            );
        }
    }
    drop(acceptor);
    let ring_addrs: Vec<SocketAddr> = ring_addrs.into_iter().flatten().collect();
    let welcome = Message::Welcome { ring_addrs: ring_addrs.clone() };
    for (rank, stream) in joined.iter_mut().enumerate() {
        let Some(stream) = stream else { continue };
        // A rank that vanished after joining is not rank 0's problem to report here: its ring
        // neighbours fail to connect to it and name it.
        if let Err(error) =
            wire::write_message(stream, &welcome, deadline.max(Instant::now() + JOIN_READ_LIMIT))
        {
            tracing::warn!(rank, %error, "could not send the ring addresses to a rank");
        }
        let _ = stream.shutdown(Shutdown::Write);
    }
    Ok((ring_listener, ring_addrs))
}

/// Why rank 0 refuses a rank's join, if it does (`joined_alive`: that rank already holds a live
/// connection).
fn join_refusal(
    membership: &Membership,
    protocol: u32,
    run_id: &str,
    rank: usize,
    world_size: usize,
    joined_alive: bool,
) -> Option<String> {
    let world = membership.world_size;
    if protocol != PROTOCOL_VERSION {
        Some(format!(
            "it speaks protocol {protocol}, rank 0 speaks {PROTOCOL_VERSION} (mixed fleetmend versions)"
        ))
    } else if run_id != membership.run_id {
        Some(format!(
            "it belongs to run {run_id:?}, this rendezvous is for run {:?}",
            membership.run_id
        ))
    } else if world_size != world {
        Some(format!("it expects {world_size} ranks, rank 0 expects {world}"))
    } else if rank == 0 || rank >= world {
        Some(format!("rank {rank} is not a joining rank of a world of {world}"))
    } else if joined_alive {
        Some(format!("rank {rank} already joined"))
    } else {
        None
    }
}

/// Any rank but 0: reach rank 0, join, wait for the ring addresses.
fn join_rendezvous(
    membership: &Membership,
    config: &CollectiveConfig,
    started: Instant,
    deadline: Instant,
) -> Result<(TcpListener, Vec<SocketAddr>), RendezvousError> {
    let master = membership.master_endpoint();
    let mut stream =
        connect_until(|| resolve(&membership.master_addr, membership.master_port), deadline)
            .map_err(|source| RendezvousError::MasterUnreachable {
                addr: master.clone(),
                waited: started.elapsed(),
                source,
            })?;
    let local_ip = stream
        .local_addr()
        .map_err(|source| RendezvousError::Socket { what: "reading the local address", source })?
        .ip();
    // The interface this rank reached rank 0 through is the one its peers can reach it on.
    let ring_bind = SocketAddr::new(config.bind_ip.unwrap_or(local_ip), config.ring_port);
    let ring_listener = TcpListener::bind(ring_bind).map_err(|source| RendezvousError::Bind {
        what: "ring",
        addr: ring_bind,
        source,
    })?;
    let ring_addr =
        SocketAddr::new(config.advertise_ip.unwrap_or(local_ip), local_port(&ring_listener)?);
    let join = Message::Join {
        protocol: PROTOCOL_VERSION,
        run_id: membership.run_id.clone(),
        rank: membership.rank,
        world_size: membership.world_size,
        ring_addr,
    };
    let exchange_error =
        |e: MessageError| RendezvousError::Exchange { addr: master.clone(), detail: e.to_string() };
    wire::write_message(&mut stream, &join, deadline.max(Instant::now() + JOIN_READ_LIMIT))
        .map_err(exchange_error)?;
    match wire::read_message(&mut stream, deadline + VERDICT_GRACE) {
        Ok(Message::Welcome { ring_addrs }) if ring_addrs.len() == membership.world_size => {
            Ok((ring_listener, ring_addrs))
        }
        Ok(Message::Refused { reason }) => Err(RendezvousError::Refused { addr: master, reason }),
        Ok(Message::Abandoned { missing, waited_ms }) => Err(RendezvousError::Incomplete {
            missing,
            world_size: membership.world_size,
            waited: Duration::from_millis(waited_ms),
        }),
        Ok(other) => Err(exchange_error(MessageError::Malformed(format!(
            "expected the ring addresses of {} ranks, received {other:?}",
            membership.world_size
        )))),
        Err(MessageError::Link(wire::LinkFailure::TimedOut)) => {
            Err(RendezvousError::NoVerdict { addr: master, waited: started.elapsed() })
        }
        Err(MessageError::Link(wire::LinkFailure::Closed | wire::LinkFailure::Reset(_))) => {
            Err(RendezvousError::MasterLost { addr: master })
        }
        Err(other) => Err(exchange_error(other)),
    }
}

fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

fn local_port(listener: &TcpListener) -> Result<u16, RendezvousError> {
    listener.local_addr().map(|addr| addr.port()).map_err(|source| RendezvousError::Socket {
        what: "reading the ring listener's port",
        source,
    })
}

fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// Whether a joined rank's rendezvous connection is still open (a rank that crashed and came back
/// during the rendezvous may take its old place).
fn connection_alive(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let alive = match stream.peek(&mut [0u8; 1]) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    };
    alive && stream.set_nonblocking(false).is_ok()
}

/// Connects to the first address that answers, retrying with capped exponential backoff and
/// jitter until `deadline`; returns the last error if none answered in time.
pub(super) fn connect_until(
    mut addrs: impl FnMut() -> io::Result<Vec<SocketAddr>>,
    deadline: Instant,
) -> io::Result<TcpStream> {
    let mut retry = 0u32;
    let mut last_error =
        io::Error::new(io::ErrorKind::TimedOut, "no connection attempt fit in the deadline");
    loop {
        match addrs() {
            Ok(list) if list.is_empty() => {
                last_error = io::Error::other("the name resolved to no address")
            }
            Ok(list) => {
                for addr in list {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&addr, left.min(CONNECT_ATTEMPT_LIMIT)) {
                        Ok(stream) => return Ok(stream),
                        Err(e) => last_error = e,
                    }
                }
            }
            Err(e) => last_error = e,
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(last_error);
        }
        retry = retry.saturating_add(1);
        thread::sleep(CONNECT_BACKOFF.delay(retry, fastrand::f64()).min(left));
    }
}

/// Blocking `accept` on its own thread, handed over a channel so the caller can wait with a
/// deadline (std has no accept timeout, and polling a non-blocking listener would spin or sleep).
#[derive(Debug)]
struct Acceptor {
    incoming: mpsc::Receiver<io::Result<(TcpStream, SocketAddr)>>,
    stop: Arc<AtomicBool>,
    wake_addr: SocketAddr,
}

impl Acceptor {
    fn start(listener: &TcpListener) -> io::Result<Acceptor> {
        let listener = listener.try_clone()?;
        let mut wake_addr = listener.local_addr()?;
        if wake_addr.ip().is_unspecified() {
            wake_addr.set_ip(match wake_addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let (sender, incoming) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        thread::Builder::new().name("rendezvous-accept".into()).spawn(move || {
            // Errors such as EMFILE repeat at once: back off instead of spinning.
            let mut failures = 0u32;
            loop {
                let accepted = listener.accept();
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                let failed = accepted.is_err();
                if sender.send(accepted).is_err() {
                    return;
                }
                if failed {
                    failures = failures.saturating_add(1);
                    thread::sleep(ACCEPT_BACKOFF.delay(failures, fastrand::f64()));
                }
            }
        })?;
        Ok(Acceptor { incoming, stop, wake_addr })
    }

    /// The next accepted connection, or `None` once `deadline` passed.
    fn next_until(&self, deadline: Instant) -> Option<io::Result<(TcpStream, SocketAddr)>> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.incoming.recv_timeout(left) {
            Ok(accepted) => Some(accepted),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                Some(Err(io::Error::other("the accept thread ended")))
            }
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocked accept so the thread sees the flag and releases its listener.
        let _ = TcpStream::connect_timeout(&self.wake_addr, Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_until_gives_up_at_the_deadline() {
        // A port that was just released: nothing listens there.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let started = Instant::now();
        let error = connect_until(
            || Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))]),
            started + Duration::from_millis(300),
        )
        .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
    }

    #[test]
    fn acceptor_returns_none_at_the_deadline_and_releases_its_port() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = Acceptor::start(&listener).unwrap();
        let started = Instant::now();
        assert!(acceptor.next_until(started + Duration::from_millis(100)).is_none());
        assert!(started.elapsed() >= Duration::from_millis(100));
        let _client = TcpStream::connect(addr).unwrap();
        assert!(matches!(
            acceptor.next_until(Instant::now() + Duration::from_secs(5)),
            Some(Ok(_))
        ));
        drop(acceptor);
        drop(listener);
        // The accept thread let go of its copy of the listener: the port can be bound again.
        let rebind_deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match TcpListener::bind(addr) {
                Ok(_) => break,
                Err(e) if Instant::now() < rebind_deadline => {
                    let _ = e;
                    thread::yield_now();
                }
                Err(e) => panic!("port {addr} still held: {e}"),
            }
        }
    }
}
