//! A rank's two ring connections: frames sent and received with a deadline (straight between
//! the socket and the caller's buffer where the byte order allows), keepalives and abort notices
//! skipped or surfaced on receipt, and the wind-down after a failure.

use std::io::{self, IoSlice, Read};
use std::net::Shutdown;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::failure::{CollectiveFailure, RingLink};
use super::watch::CollectiveWatch;
use super::wire::{self, AbortNotice, FrameHeader, FrameKind, LinkFailure, MAX_ABORT_PAYLOAD};

/// Longest wait for sending an abort frame to a successor that is no longer reading.
const ABORT_SEND_LIMIT: Duration = Duration::from_secs(5);

/// Why receiving from the predecessor failed.
#[derive(Debug)]
pub(super) enum RecvFailure {
    Link(LinkFailure),
    OutOfStep(String),
    Aborted(AbortNotice),
}

impl RecvFailure {
    pub(super) fn blame(self, peer: usize, timeout: Duration) -> CollectiveFailure {
        match self {
            RecvFailure::Link(failure) => {
                CollectiveFailure::from_link(failure, peer, RingLink::Predecessor, timeout)
            }
            RecvFailure::OutOfStep(detail) => CollectiveFailure::OutOfStep { peer, detail },
            RecvFailure::Aborted(AbortNotice { origin, suspect, reason }) => {
                CollectiveFailure::PeerAborted { peer, origin, suspect, reason }
            }
        }
    }
}

/// A rank's two ring connections.
#[derive(Debug)]
pub(super) struct Ring {
    pub(super) successor: Link,
    pub(super) predecessor: Link,
}

impl Ring {
    /// After a failure: tell the successor (when it can still be reached), then keep reading from
    /// the predecessor in the background until it closes or a timeout passed, so the predecessor's
    /// writes do not fail before the abort travelling the ring reaches it (it would blame this
    /// rank instead of the culprit).
    pub(super) fn abandon(self, notice: Option<AbortNotice>, seq: u64, timeout: Duration) {
        let Ring { mut successor, predecessor } = self;
        if let Some(notice) = notice
            && let Err(error) = successor.send_abort(seq, &notice, timeout.min(ABORT_SEND_LIMIT))
        {
            tracing::debug!(%error, peer = successor.peer, "could not pass the abort on");
        }
        let _ = successor.stream.shutdown(Shutdown::Write);
        drop(successor);
        let drain = thread::Builder::new()
            .name("collective-drain".into())
            .spawn(move || predecessor.drain(timeout));
        if let Err(error) = drain {
            tracing::debug!(%error, "could not start draining the ring predecessor");
        }
    }
}

/// One ring connection.
#[derive(Debug)]
pub(super) struct Link {
    stream: std::net::TcpStream,
    pub(super) peer: usize,
    /// Payloads that cannot go straight between the socket and the caller's buffer (abort
    /// notices, big-endian conversions), reused across frames.
    pub(super) scratch: Vec<u8>,
    /// Arriving all-reduce frames that are added to the buffer rather than stored in it, reused
    /// across frames and operations.
    arrivals: Vec<f32>,
    /// Told of every frame that arrives (the predecessor link).
    watch: Option<Arc<CollectiveWatch>>,
}

/// The wire carries `f32`s little-endian; on a little-endian target that is their memory layout,
/// so frames go between the socket and the buffer without a conversion (or any copy of ours).
const NATIVE_IS_WIRE_ORDER: bool = cfg!(target_endian = "little");

impl Link {
    pub(super) fn new(stream: std::net::TcpStream, peer: usize) -> Link {
        Link { stream, peer, scratch: Vec::new(), arrivals: Vec::new(), watch: None }
    }

    pub(super) fn watched(self, watch: Arc<CollectiveWatch>) -> Link {
        Link { watch: Some(watch), ..self }
    }

    pub(super) fn send_frame(
        &mut self,
        header: FrameHeader,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), LinkFailure> {
        let head = header.encode();
        let mut bufs = [IoSlice::new(&head), IoSlice::new(payload)];
        wire::write_all_vectored_until(&mut self.stream, &mut bufs, Instant::now() + timeout)
    }

    pub(super) fn send_f32s(
        &mut self,
        header: FrameHeader,
        values: &[f32],
        timeout: Duration,
    ) -> Result<(), LinkFailure> {
        if NATIVE_IS_WIRE_ORDER {
            return self.send_frame(header, bytemuck::cast_slice(values), timeout);
        }
        let mut payload = std::mem::take(&mut self.scratch);
        f32s_to_le_bytes(values, &mut payload);
        let sent = self.send_frame(header, &payload, timeout);
        self.scratch = payload;
        sent
    }

    pub(super) fn send_keepalive(
        &mut self,
        seq: u64,
        timeout: Duration,
    ) -> Result<(), LinkFailure> {
        let header = FrameHeader {
            kind: FrameKind::Keepalive,
            seq,
            step: 0,
            chunk: 0,
            payload_len: 0,
            total: 0,
        };
        self.send_frame(header, &[], timeout)
    }

    fn send_abort(
        &mut self,
        seq: u64,
        notice: &AbortNotice,
        timeout: Duration,
    ) -> Result<(), LinkFailure> {
        let payload =
            serde_json::to_vec(notice).map_err(|e| LinkFailure::Io(io::Error::other(e)))?;
        let header = FrameHeader {
            kind: FrameKind::Abort,
            seq,
            step: 0,
            chunk: 0,
            payload_len: frame_len(payload.len()),
            total: 0,
        };
        self.send_frame(header, &payload, timeout)
    }

    /// Reads the next frame's header, which must be `expected` (keepalives are skipped); its
    /// payload, `expected.payload_len` bytes, is next on the stream.
    fn recv_header(&mut self, expected: FrameHeader, timeout: Duration) -> Result<(), RecvFailure> {
        loop {
            let mut raw = [0u8; wire::FRAME_HEADER_LEN];
            wire::read_exact_until(&mut self.stream, &mut raw, Instant::now() + timeout)
                .map_err(RecvFailure::Link)?;
            if let Some(watch) = &self.watch {
                watch.heard();
            }
            let header = FrameHeader::decode(&raw).map_err(RecvFailure::OutOfStep)?;
            let len = header.payload_len as usize;
            match header.kind {
                FrameKind::Keepalive if len == 0 => continue,
                FrameKind::Abort if len <= MAX_ABORT_PAYLOAD => {
                    self.read_payload(len, timeout)?;
                    let notice = serde_json::from_slice(&self.scratch).map_err(|e| {
                        RecvFailure::OutOfStep(format!("received an unreadable abort notice: {e}"))
                    })?;
                    return Err(RecvFailure::Aborted(notice));
                }
                _ if header == expected => return Ok(()),
                _ => return Err(RecvFailure::OutOfStep(describe_mismatch(&expected, &header))),
            }
        }
    }

    /// Reads the next frame, which must carry `expected`'s header, and returns its payload.
    pub(super) fn recv_expected(
        &mut self,
        expected: FrameHeader,
        timeout: Duration,
    ) -> Result<&[u8], RecvFailure> {
        self.recv_header(expected, timeout)?;
        self.read_payload(expected.payload_len as usize, timeout)?;
        Ok(&self.scratch)
    }

    /// Reads the next frame, which must carry `expected`'s header, straight into `into`: exactly
    /// its payload length (the caller built `expected` from it).
    pub(super) fn recv_into(
        &mut self,
        expected: FrameHeader,
        into: &mut [u8],
        timeout: Duration,
    ) -> Result<(), RecvFailure> {
        debug_assert_eq!(into.len(), expected.payload_len as usize);
        self.recv_header(expected, timeout)?;
        wire::read_exact_until(&mut self.stream, into, Instant::now() + timeout)
            .map_err(RecvFailure::Link)
    }

    /// [`recv_into`](Link::recv_into) for a frame of little-endian `f32`s.
    pub(super) fn recv_f32s_into(
        &mut self,
        expected: FrameHeader,
        into: &mut [f32],
        timeout: Duration,
    ) -> Result<(), RecvFailure> {
        if NATIVE_IS_WIRE_ORDER {
            return self.recv_into(expected, bytemuck::cast_slice_mut(into), timeout);
        }
        let payload = self.recv_expected(expected, timeout)?;
        f32s_from_le_bytes(payload, into);
        Ok(())
    }

    /// Reads the next frame of `f32`s, which must carry `expected`'s header, and adds it into
    /// `part` with the arriving value on the left (the documented summation order).
    pub(super) fn recv_f32s_add(
        &mut self,
        expected: FrameHeader,
        part: &mut [f32],
        timeout: Duration,
    ) -> Result<(), RecvFailure> {
        let mut arrivals = std::mem::take(&mut self.arrivals);
        arrivals.resize(part.len(), 0.0);
        let received = self.recv_f32s_into(expected, &mut arrivals, timeout);
        if received.is_ok() {
            part.iter_mut().zip(&arrivals).for_each(|(value, arrived)| {
                // Not `+=`: the upstream sum stays the left operand.
                let sum = *arrived + *value;
                *value = sum;
            });
        }
        self.arrivals = arrivals;
        received
    }

    fn read_payload(&mut self, len: usize, timeout: Duration) -> Result<(), RecvFailure> {
        self.scratch.resize(len, 0);
        wire::read_exact_until(&mut self.stream, &mut self.scratch, Instant::now() + timeout)
            .map_err(RecvFailure::Link)
    }

    /// Reads and discards until the peer closes, or `limit` passed.
    fn drain(mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut sink = vec![0u8; 64 * 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stream.set_read_timeout(Some(left)).is_err() {
                return;
            }
            match self.stream.read(&mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

fn describe_mismatch(expected: &FrameHeader, got: &FrameHeader) -> String {
    let why = if expected.kind != got.kind || expected.seq != got.seq {
        "the ranks are not calling the same collectives in the same order"
    } else if expected.total != got.total {
        "the ranks passed buffers of different lengths"
    } else {
        "the ranks disagree on the frame layout (different chunk_bytes?)"
    };
    format!("expected {expected}, received {got}: {why}")
}

/// `values` as the wire's little-endian bytes, into `out` (for targets whose memory order is not
/// the wire's). A sized buffer filled in fixed-size chunks compiles to a vectorised loop.
fn f32s_to_le_bytes(values: &[f32], out: &mut Vec<u8>) {
    out.resize(values.len() * 4, 0);
    for (bytes, value) in out.chunks_exact_mut(4).zip(values) {
        bytes.copy_from_slice(&value.to_le_bytes());
    }
}

/// The wire's little-endian bytes back into `f32`s (the other direction of [`f32s_to_le_bytes`]).
fn f32s_from_le_bytes(bytes: &[u8], out: &mut [f32]) {
    for (value, bytes) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *value = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
}

/// Frame payload lengths fit in `u32`: [`CollectiveConfig::validate`] caps `chunk_bytes`.
pub(super) fn frame_len(bytes: usize) -> u32 {
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_order_conversion_round_trips_every_bit_pattern_kind() {
        let values = [1.5f32, -0.0, f32::NAN, f32::INFINITY, f32::MIN_POSITIVE / 2.0, -3.25e-7];
        let mut bytes = Vec::new();
        f32s_to_le_bytes(&values, &mut bytes);
        let expected: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(bytes, expected);
        if NATIVE_IS_WIRE_ORDER {
            // What the zero-copy path sends is what the conversion would have produced.
            assert_eq!(bytemuck::cast_slice::<f32, u8>(&values), &expected[..]);
        }
        let mut back = [0f32; 6];
        f32s_from_le_bytes(&bytes, &mut back);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&values));
    }
}
