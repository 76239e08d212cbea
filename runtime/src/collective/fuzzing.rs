//! Fuzz target bodies for the bytes a peer sends: collective frames on a ring connection
//! ([`check_collective_frames`]) and length-prefixed rendezvous messages
//! ([`check_rendezvous_message`]). Each feeds the bytes through a real loopback TCP connection to
//! the real reader, and compares what it did with a model of the format written here from the
//! format's description.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::wire::{
    self, AbortNotice, FRAME_HEADER_LEN, FrameHeader, FrameKind, MAX_ABORT_PAYLOAD, Message,
    MessageError,
};
use super::{Link, RecvFailure};

/// Nothing here waits for bytes that will not come (the writer closes after `data`); the timeout
/// only bounds a reader that wrongly waits.
const TIMEOUT: Duration = Duration::from_secs(10);

/// "FMC1" as the little-endian `u32` the header starts with.
const FRAME_MAGIC: [u8; 4] = *b"1CMF";
/// The largest rendezvous message a reader accepts (wire.rs's `MAX_MESSAGE_BYTES`).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The frame the receiver waits for: chunk 0 of step 1 of the third operation, 16 bytes.
const EXPECTED: FrameHeader = FrameHeader {
    kind: FrameKind::AllReduce,
    seq: 3,
    step: 1,
    chunk: 0,
    payload_len: 16,
    total: 64,
};

/// Sends `data` to a fresh loopback connection and closes it; `read` gets the receiving end and
/// returns what it read plus whatever the connection still held after it (bytes it left unread).
fn through_socket<T>(data: &[u8], read: impl FnOnce(&mut TcpStream) -> T) -> (T, Vec<u8>) {
    let listener = match TcpListener::bind("127.0.0.1:0") {
        Ok(listener) => listener,
        Err(err) => panic!("binding a loopback listener: {err}"),
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(err) => panic!("reading the listener's address: {err}"),
    };
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || {
            let mut stream = match TcpStream::connect(addr) {
                Ok(stream) => stream,
                Err(err) => panic!("connecting over loopback: {err}"),
            };
            // The reader may stop early and close: a failed write is then expected.
            let _ = stream.write_all(data);
            let _ = stream.shutdown(Shutdown::Write);
        });
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(err) => panic!("accepting over loopback: {err}"),
        };
        let result = read(&mut stream);
        let mut rest = Vec::new();
        let _ = stream.set_read_timeout(Some(TIMEOUT));
        if let Err(err) = stream.read_to_end(&mut rest) {
            panic!("reading what the reader left: {err}");
        }
        if writer.join().is_err() {
            panic!("the loopback writer panicked");
        }
        (result, rest)
    })
}

/// What the model says a receive of [`EXPECTED`] ends with.
#[derive(Debug, PartialEq)]
enum FrameOutcome {
    /// The expected frame's payload.
    Payload(Vec<u8>),
    /// A peer's abort notice.
    Aborted(AbortNotice),
    /// A frame that is not the expected one (or no frame at all).
    OutOfStep,
    /// The bytes ended before the frame did.
    Closed,
}

/// The receive as the wire format describes it, and how many bytes it consumes.
fn model_frames(data: &[u8]) -> (FrameOutcome, usize) {
    let mut at = 0;
    loop {
        let Some(raw) = data.get(at..at + FRAME_HEADER_LEN) else {
            return (FrameOutcome::Closed, data.len());
        };
        at += FRAME_HEADER_LEN;
        let u32_at = |i: usize| u32::from_le_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | u64::from(u32_at(i + 4)) << 32;
        // The magic, a known kind and zero padding: anything else is not a frame this code wrote.
        let padding_is_zero = raw[5..8].iter().chain(&raw[28..32]).all(|b| *b == 0);
        if raw[..4] != FRAME_MAGIC || !(1..=5).contains(&raw[4]) || !padding_is_zero {
            return (FrameOutcome::OutOfStep, at);
        }
        let len = u32_at(24) as usize;
        let payload = |at: usize| data.get(at..at + len);
        match raw[4] {
            4 if len == 0 => continue,
            5 if len <= MAX_ABORT_PAYLOAD => {
                let Some(notice) = payload(at) else { return (FrameOutcome::Closed, data.len()) };
                let outcome = match serde_json::from_slice::<AbortNotice>(notice) {
                    Ok(notice) => FrameOutcome::Aborted(notice),
                    Err(_) => FrameOutcome::OutOfStep,
                };
                return (outcome, at + len);
            }
            _ => {}
        }
        let same = raw[4] == 1
            && u64_at(8) == EXPECTED.seq
            && u32_at(16) == EXPECTED.step
            && u32_at(20) == EXPECTED.chunk
            && len == EXPECTED.payload_len as usize
            && u64_at(32) == EXPECTED.total;
        if !same {
            return (FrameOutcome::OutOfStep, at);
        }
        return match payload(at) {
            Some(bytes) => (FrameOutcome::Payload(bytes.to_vec()), at + len),
            None => (FrameOutcome::Closed, data.len()),
        };
    }
}

/// `data` as what a ring predecessor sends while this rank waits for one all-reduce frame.
///
/// Holds: the receiver does what the model of the format says (keepalives skipped, an abort
/// notice of at most 64 KiB read and reported, anything but the expected header refused, the
/// expected payload returned); it consumes exactly the frames it handles and never reads past
/// them; its buffer never grows beyond the larger of the expected payload and the abort cap; any
/// header it decodes encodes back to the same 40 bytes.
pub fn check_collective_frames(data: &[u8]) {
    if let Some(raw) = data.get(..FRAME_HEADER_LEN) {
        let mut header = [0u8; FRAME_HEADER_LEN];
        header.copy_from_slice(raw);
        if let Ok(decoded) = FrameHeader::decode(&header) {
            assert_eq!(decoded.encode(), header, "{decoded} does not encode back to its bytes");
        }
    }
    let ((outcome, capacity), rest) = through_socket(data, |stream| {
        let stream = match stream.try_clone() {
            Ok(stream) => stream,
            Err(err) => panic!("cloning the connection: {err}"),
        };
        let mut link = Link::new(stream, 1);
        let outcome = match link.recv_expected(EXPECTED, TIMEOUT) {
            Ok(payload) => FrameOutcome::Payload(payload.to_vec()),
            Err(RecvFailure::Aborted(notice)) => FrameOutcome::Aborted(notice),
            Err(RecvFailure::OutOfStep(_)) => FrameOutcome::OutOfStep,
            Err(RecvFailure::Link(wire::LinkFailure::Closed)) => FrameOutcome::Closed,
            Err(RecvFailure::Link(other)) => panic!("the connection failed: {other}"),
        };
        (outcome, link.scratch.capacity())
    });
    let (expected, consumed) = model_frames(data);
    assert_eq!(outcome, expected);
    assert_eq!(rest, data[consumed.min(data.len())..], "the receiver read past what it handled");
    let bound = MAX_ABORT_PAYLOAD.max(EXPECTED.payload_len as usize);
    assert!(capacity <= bound, "a receive buffer of {capacity} bytes");
}

/// `data` as what a peer sends on a rendezvous connection.
///
/// Holds: the reader takes a 4-byte big-endian length and that many bytes of JSON and nothing
/// more; a length over the cap is refused before any body is read; a message it returns
/// serialises and parses back equal; its buffer grows with the bytes that arrived, not with the
/// length announced (at most twice what arrived plus one read piece).
pub fn check_rendezvous_message(data: &[u8]) {
    let ((outcome, capacity), rest) = through_socket(data, |stream| {
        let mut body = Vec::new();
        let outcome = wire::read_message_into(stream, Instant::now() + TIMEOUT, &mut body);
        (outcome, body.capacity())
    });
    let announced = data.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let consumed = match announced {
        Some(len) if len <= MAX_MESSAGE_BYTES => (4 + len).min(data.len()),
        Some(_) => 4,
        None => data.len(),
    };
    let body = announced.and_then(|len| data.get(4..4 + len));
    match (&outcome, announced) {
        (Ok(message), Some(len)) => {
            let body = body.unwrap_or_else(|| panic!("a message from {len} bytes that never came"));
            let parsed: Message = match serde_json::from_slice(body) {
                Ok(parsed) => parsed,
                Err(err) => panic!("read a message the body does not hold: {err}"),
            };
            assert_eq!(&parsed, message);
            let json = match serde_json::to_vec(message) {
                Ok(json) => json,
                Err(err) => panic!("a message does not serialise: {err}"),
            };
            match serde_json::from_slice::<Message>(&json) {
                Ok(again) => assert_eq!(&again, message),
                Err(err) => panic!("a serialised message does not parse back: {err}"),
            }
        }
        (Err(MessageError::Malformed(_)), Some(len)) => {
            let refused = len > MAX_MESSAGE_BYTES
                || body.is_some_and(|b| serde_json::from_slice::<Message>(b).is_err());
            assert!(refused, "a well-formed message of {len} bytes refused");
        }
        (Err(MessageError::Link(wire::LinkFailure::Closed)), _) => {
            assert!(body.is_none(), "the body was all there, yet the reader saw the end");
        }
        (other, _) => panic!("{other:?} from {} bytes", data.len()),
    }
    assert_eq!(rest, data[consumed..], "the reader read past the message");
    let arrived = data.len().saturating_sub(4);
    let bound = 2 * arrived + wire::MESSAGE_PIECE_BYTES;
    assert!(capacity <= bound, "a buffer of {capacity} bytes after {arrived} arrived");
}
