//! Bytes on the wire: collective frame headers, rendezvous messages, and reads and writes that give
//! up at a deadline.

use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Version of both wire formats; a rank speaking another one is refused at the rendezvous.
pub(super) const PROTOCOL_VERSION: u32 = 1;

/// First bytes of every collective frame ("FMC1"): a peer that is not in step, or not a fleetmend
/// rank at all, shows up as a bad magic instead of as numbers summed into a gradient.
const FRAME_MAGIC: u32 = 0x464d_4331;

/// Size of an encoded [`FrameHeader`].
pub(super) const FRAME_HEADER_LEN: usize = 40;

/// Largest abort notice accepted; notices are short texts.
pub(super) const MAX_ABORT_PAYLOAD: usize = 64 * 1024;

/// Largest rendezvous message accepted: a welcome for 100,000 ranks is ~3 MB.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Bytes of a rendezvous message body read at a time (see [`read_message_into`]).
pub(super) const MESSAGE_PIECE_BYTES: usize = 64 * 1024;

/// What a collective frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FrameKind {
    /// A chunk of an all-reduce segment (little-endian `f32`s).
    AllReduce,
    /// An empty barrier token.
    Barrier,
    /// A chunk of a broadcast buffer.
    Broadcast,
    /// "Still here, waiting on my own predecessor": resets the receiver's deadline, carries
    /// nothing.
    Keepalive,
    /// The sender gave up on the operation; the payload is an [`AbortNotice`] as JSON.
    Abort,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::AllReduce => 1,
            FrameKind::Barrier => 2,
            FrameKind::Broadcast => 3,
            FrameKind::Keepalive => 4,
            FrameKind::Abort => 5,
        }
    }

    fn from_code(code: u8) -> Option<FrameKind> {
        Some(match code {
            1 => FrameKind::AllReduce,
            2 => FrameKind::Barrier,
            3 => FrameKind::Broadcast,
            4 => FrameKind::Keepalive,
            5 => FrameKind::Abort,
            _ => return None,
        })
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::AllReduce => "all-reduce",
            FrameKind::Barrier => "barrier",
            FrameKind::Broadcast => "broadcast",
            FrameKind::Keepalive => "keepalive",
            FrameKind::Abort => "abort",
        })
    }
}

/// The fixed header in front of every collective frame. A receiver knows exactly which header comes
/// next and compares the whole of it, so a peer that is out of step is an error, not garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FrameHeader {
    pub kind: FrameKind,
    /// Operation sequence number: the n-th collective this communicator ran.
    pub seq: u64,
    /// Step of the operation (all-reduce: reduce-scatter steps, then all-gather steps).
    pub step: u32,
    /// Chunk within the step.
    pub chunk: u32,
    /// Bytes following the header.
    pub payload_len: u32,
    /// Size of the whole operation's buffer (elements or bytes): differing lengths across ranks are
    /// named as such.
    pub total: u64,
}

impl FrameHeader {
    pub(super) fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut out = [0u8; FRAME_HEADER_LEN];
        out[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        out[4] = self.kind.code();
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.step.to_le_bytes());
        out[20..24].copy_from_slice(&self.chunk.to_le_bytes());
        out[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        out[32..40].copy_from_slice(&self.total.to_le_bytes());
        out
    }

    pub(super) fn decode(bytes: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, String> {
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let magic = u32_at(0);
        if magic != FRAME_MAGIC {
            return Err(format!(
                "received bytes that are not a collective frame (magic {magic:#010x}, expected {FRAME_MAGIC:#010x})"
            ));
        }
        let kind = FrameKind::from_code(bytes[4])
            .ok_or_else(|| format!("received a frame of unknown kind {}", bytes[4]))?;
        // The padding is zero in every frame this code writes: a header that decodes must be the
        // one that was sent, byte for byte, or a peer out of step could pass for one in step.
        if bytes[5..8].iter().chain(&bytes[28..32]).any(|b| *b != 0) {
            return Err(format!(
                "received a frame whose padding is not zero (bytes 5-7 {:02x?}, 28-31 {:02x?})",
                &bytes[5..8],
                &bytes[28..32]
            ));
        }
        Ok(FrameHeader {
            kind,
            seq: u64_at(8),
            step: u32_at(16),
            chunk: u32_at(20),
            payload_len: u32_at(24),
            total: u64_at(32),
        })
    }
}

impl fmt::Display for FrameHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} #{} step {} chunk {} ({} payload bytes, operation size {})",
            self.kind, self.seq, self.step, self.chunk, self.payload_len, self.total
        )
    }
}

/// Why a rank abandoned an operation, passed along the ring so every rank names the same culprit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct AbortNotice {
    /// The rank that saw the failure first.
    pub origin: usize,
    /// The rank the origin blames, where it could tell.
    pub suspect: Option<usize>,
    /// The origin's error.
    pub reason: String,
}

/// How a deadline-bounded read or write on a peer connection failed.
#[derive(Debug)]
pub(super) enum LinkFailure {
    /// The peer closed the connection (end of stream).
    Closed,
    /// The connection was reset or the pipe broke: the peer is gone.
    Reset(io::Error),
    /// The deadline passed without the transfer completing.
    TimedOut,
    /// Any other socket error.
    Io(io::Error),
}

impl fmt::Display for LinkFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkFailure::Closed => f.write_str("the peer closed the connection"),
            LinkFailure::Reset(e) => write!(f, "the connection was reset ({e})"),
            LinkFailure::TimedOut => f.write_str("the peer made no progress before the deadline"),
            LinkFailure::Io(e) => write!(f, "{e}"),
        }
    }
}

fn classify(error: io::Error) -> Option<LinkFailure> {
    match error.kind() {
        io::ErrorKind::Interrupted => None,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Some(LinkFailure::TimedOut),
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::NotConnected => Some(LinkFailure::Reset(error)),
        _ => Some(LinkFailure::Io(error)),
    }
}

/// Fills `buf` from `stream`, giving up at `deadline`. The socket timeout is set before every read
/// to what is left, so a peer trickling bytes cannot stretch the wait past the deadline.
pub(super) fn read_exact_until(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), LinkFailure> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LinkFailure::TimedOut);
        }
        stream.set_read_timeout(Some(left)).map_err(LinkFailure::Io)?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(LinkFailure::Closed),
            Ok(n) => filled += n,
            Err(e) => {
                if let Some(failure) = classify(e) {
                    return Err(failure);
                }
            }
        }
    }
    Ok(())
}

/// Writes all of `buf` to `stream`, giving up at `deadline` (a peer that stops reading fills the
/// socket buffers and blocks the writer; the deadline bounds that too).
pub(super) fn write_all_until(
    stream: &mut TcpStream,
    buf: &[u8],
    deadline: Instant,
) -> Result<(), LinkFailure> {
    let mut written = 0;
    while written < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LinkFailure::TimedOut);
        }
        stream.set_write_timeout(Some(left)).map_err(LinkFailure::Io)?;
        match stream.write(&buf[written..]) {
            Ok(0) => return Err(LinkFailure::Closed),
            Ok(n) => written += n,
            Err(e) => {
                if let Some(failure) = classify(e) {
                    return Err(failure);
                }
            }
        }
    }
    Ok(())
}

/// Writes all of `bufs` to `stream` with as few system calls as the kernel allows (a frame's header
/// and its payload go out in one `writev`, so the payload need not be copied behind the header),
/// giving up at `deadline` as [`write_all_until`] does.
pub(super) fn write_all_vectored_until(
    stream: &mut TcpStream,
    mut bufs: &mut [IoSlice<'_>],
    deadline: Instant,
) -> Result<(), LinkFailure> {
    // Drop leading empty slices: a write of nothing returns 0, which would read as a close.
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LinkFailure::TimedOut);
        }
        stream.set_write_timeout(Some(left)).map_err(LinkFailure::Io)?;
        match stream.write_vectored(bufs) {
            Ok(0) => return Err(LinkFailure::Closed),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) => {
                if let Some(failure) = classify(e) {
                    return Err(failure);
                }
            }
        }
    }
    Ok(())
}

/// A rendezvous message (length-prefixed JSON on the rendezvous and ring-setup connections).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum Message {
    /// A rank announces itself to rank 0.
    Join {
        protocol: u32,
        run_id: String,
        rank: usize,
        world_size: usize,
        /// Where this rank's ring predecessor connects.
        ring_addr: SocketAddr,
    },
    /// Rank 0, once every rank arrived: each rank's ring address, by rank.
    Welcome { ring_addrs: Vec<SocketAddr> },
    /// Rank 0 turned this rank away (another run, a wrong world size, a duplicate rank).
    Refused { reason: String },
    /// Rank 0 gave up waiting: these ranks never arrived.
    Abandoned { missing: Vec<usize>, waited_ms: u64 },
    /// First message on a ring connection, from the predecessor.
    RingHello { protocol: u32, run_id: String, rank: usize },
}

/// Why reading a rendezvous message failed.
#[derive(Debug)]
pub(super) enum MessageError {
    Link(LinkFailure),
    Malformed(String),
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageError::Link(failure) => failure.fmt(f),
            MessageError::Malformed(why) => write!(f, "malformed rendezvous message: {why}"),
        }
    }
}

pub(super) fn write_message(
    stream: &mut TcpStream,
    message: &Message,
    deadline: Instant,
) -> Result<(), MessageError> {
    let body = serde_json::to_vec(message).map_err(|e| MessageError::Malformed(e.to_string()))?;
    let len = u32::try_from(body.len())
        .map_err(|_| MessageError::Malformed(format!("{} bytes is too long", body.len())))?;
    let mut framed = Vec::with_capacity(4 + body.len());
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(&body);
    write_all_until(stream, &framed, deadline).map_err(MessageError::Link)
}

pub(super) fn read_message(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<Message, MessageError> {
    read_message_into(stream, deadline, &mut Vec::new())
}

/// [`read_message`], reading the body into `body`. The body is read a piece at a time and the
/// buffer grows with what arrived: anyone who can connect to the rendezvous port can announce a
/// 64 MiB message, and the memory it costs should be what it sent, not what it announced.
pub(super) fn read_message_into(
    stream: &mut TcpStream,
    deadline: Instant,
    body: &mut Vec<u8>,
) -> Result<Message, MessageError> {
    let mut len = [0u8; 4];
    read_exact_until(stream, &mut len, deadline).map_err(MessageError::Link)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(MessageError::Malformed(format!(
            "announced length {len} exceeds {MAX_MESSAGE_BYTES} bytes"
        )));
    }
    body.clear();
    while body.len() < len {
        let start = body.len();
        body.resize(start + (len - start).min(MESSAGE_PIECE_BYTES), 0);
        read_exact_until(stream, &mut body[start..], deadline).map_err(MessageError::Link)?;
    }
    serde_json::from_slice(body).map_err(|e| MessageError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_header_round_trips() {
        let header = FrameHeader {
            kind: FrameKind::Broadcast,
            seq: u64::MAX - 3,
            step: 7,
            chunk: 0xdead_beef,
            payload_len: 1 << 20,
            total: 1 << 40,
        };
        assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
    }

    #[test]
    fn vectored_writes_deliver_every_slice_in_order_across_partial_writes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut reader, _) = listener.accept().unwrap();
        // Larger than the socket buffers, so the kernel takes it in several partial writes.
        let big: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let expected: Vec<u8> = [&b"head"[..], &[], &big, &[], b"tail"].concat();
        let reading = std::thread::spawn(move || {
            let mut got = vec![0u8; expected.len()];
            let deadline = Instant::now() + std::time::Duration::from_secs(30);
            read_exact_until(&mut reader, &mut got, deadline).unwrap();
            assert!(got == expected, "the bytes arrived changed or out of order");
        });
        let mut bufs = [
            IoSlice::new(&[]),
            IoSlice::new(b"head"),
            IoSlice::new(&[]),
            IoSlice::new(&big),
            IoSlice::new(&[]),
            IoSlice::new(b"tail"),
            IoSlice::new(&[]),
        ];
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        write_all_vectored_until(&mut writer, &mut bufs, deadline).unwrap();
        // Nothing at all to write is done at once, not a close.
        write_all_vectored_until(&mut writer, &mut [IoSlice::new(&[])], deadline).unwrap();
        reading.join().unwrap();
    }

    #[test]
    fn bytes_that_are_not_a_frame_are_named_as_such() {
        let mut bytes = FrameHeader {
            kind: FrameKind::AllReduce,
            seq: 1,
            step: 0,
            chunk: 0,
            payload_len: 0,
            total: 0,
        }
        .encode();
        bytes[0] ^= 0xff;
        let error = FrameHeader::decode(&bytes).unwrap_err();
        assert!(error.contains("not a collective frame"), "{error}");
        bytes[0] ^= 0xff;
        bytes[4] = 99;
        let error = FrameHeader::decode(&bytes).unwrap_err();
        assert!(error.contains("unknown kind 99"), "{error}");
    }

    /// Found by the collective_frames fuzz target (fuzz/regressions/collective_frames/): a header
    /// with non-zero padding decoded as if it were the zero-padded one.
    #[test]
    fn headers_with_nonzero_padding_are_refused() {
        let header = FrameHeader {
            kind: FrameKind::Keepalive,
            seq: 768,
            step: 0,
            chunk: 0,
            payload_len: 0,
            total: 0,
        };
        for at in [5, 6, 7, 28, 29, 30, 31] {
            let mut bytes = header.encode();
            bytes[at] = 1;
            let error = FrameHeader::decode(&bytes).unwrap_err();
            assert!(error.contains("padding is not zero"), "byte {at}: {error}");
        }
        assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
    }
}
