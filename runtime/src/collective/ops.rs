//! The operations on the ring: all-reduce (reduce-scatter, then all-gather), barrier and
//! broadcast, each a sequence of steps in which every rank sends to its successor while it
//! receives from its predecessor.

use std::ops::Range;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use super::failure::{CollectiveFailure, RingLink};
use super::link::{Link, RecvFailure, Ring, frame_len};
use super::watch::keepalive_every;
use super::wire::{FrameHeader, FrameKind, LinkFailure};

/// The contiguous segments a buffer of `len` elements is cut into for a ring of `world_size`
/// ranks: as equal as possible, the first `len % world_size` one element longer. Segment `c` is
/// summed starting at rank `c` (see the module documentation).
pub fn ring_segments(len: usize, world_size: usize) -> Vec<Range<usize>> {
    let world = world_size.max(1);
    let (base, extra) = (len / world, len % world);
    let mut start = 0;
    (0..world)
        .map(|segment| {
            let end = start + base + usize::from(segment < extra);
            let range = start..end;
            start = end;
            range
        })
        .collect()
}

/// What one operation needs to know.
#[derive(Debug)]
pub(super) struct OpContext {
    pub(super) seq: u64,
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) timeout: Duration,
    pub(super) chunk_bytes: usize,
}

impl OpContext {
    fn keepalive_every(&self) -> Duration {
        keepalive_every(self.timeout)
    }
}

/// Why one step of an operation failed, and whether the successor can still be told.
#[derive(Debug)]
pub(super) struct StepError {
    pub(super) failure: CollectiveFailure,
    pub(super) successor_usable: bool,
}

/// Number of frames for `len` items at most `per_frame` per frame; at least one, so that every step
/// of every operation exchanges a frame and the ranks stay in lockstep even on empty buffers.
fn frame_count(len: usize, per_frame: usize) -> usize {
    len.div_ceil(per_frame).max(1)
}

fn frame_range(frame: usize, per_frame: usize, len: usize) -> Range<usize> {
    (frame * per_frame).min(len)..((frame + 1) * per_frame).min(len)
}

/// One step: send to the successor on a helper thread while receiving from the predecessor here.
/// After its own frames the sender keeps the successor informed with keepalives until the receive
/// is done. The two directions run together because with every rank writing before reading, large
/// frames would fill the socket buffers all around the ring and deadlock it.
fn exchange<S, R>(ring: &mut Ring, op: &OpContext, send: S, recv: R) -> Result<(), StepError>
where
    S: FnOnce(&mut Link) -> Result<(), LinkFailure> + Send,
    R: FnOnce(&mut Link) -> Result<(), RecvFailure>,
{
    let Ring { successor, predecessor } = ring;
    let (successor_rank, predecessor_rank) = (successor.peer, predecessor.peer);
    let (seq, timeout, keepalive_every) = (op.seq, op.timeout, op.keepalive_every());
    let outcome = thread::scope(|scope| {
        let (done, wait_done) = mpsc::channel::<()>();
        let sender = thread::Builder::new().name("collective-send".into()).spawn_scoped(
            scope,
            move || -> Result<(), LinkFailure> {
                send(&mut *successor)?;
                loop {
                    match wait_done.recv_timeout(keepalive_every) {
                        Err(RecvTimeoutError::Timeout) => successor.send_keepalive(seq, timeout)?,
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return Ok(()),
                    }
                }
            },
        )?;
        let received = recv(predecessor);
        drop(done);
        let sent = sender.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Ok((sent, received))
    });
    let (sent, received) = outcome.map_err(|error| StepError {
        failure: CollectiveFailure::Thread(error),
        successor_usable: false,
    })?;
    match (received, sent) {
        (Ok(()), Ok(())) => Ok(()),
        // What this rank saw itself comes first; an abort from upstream only when nothing else
        // went wrong here.
        (Err(failure @ (RecvFailure::Link(_) | RecvFailure::OutOfStep(_))), sent) => {
            Err(StepError {
                failure: failure.blame(predecessor_rank, timeout),
                successor_usable: sent.is_ok(),
            })
        }
        (_, Err(failure)) => Err(StepError {
            failure: CollectiveFailure::from_link(
                failure,
                successor_rank,
                RingLink::Successor,
                timeout,
            ),
            successor_usable: false,
        }),
        (Err(aborted), Ok(())) => Err(StepError {
            failure: aborted.blame(predecessor_rank, timeout),
            successor_usable: true,
        }),
    }
}

/// Whether a received segment is added to the local one (reduce-scatter) or replaces it
/// (all-gather).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Combine {
    Add,
    Copy,
}

pub(super) fn ring_all_reduce(
    ring: &mut Ring,
    op: &OpContext,
    values: &mut [f32],
) -> Result<(), StepError> {
    let (rank, world) = (op.rank, op.world_size);
    let segments = ring_segments(values.len(), world);
    let per_frame = op.chunk_bytes / 4;
    // In every header, so that ranks passing buffers of different lengths are told so.
    let total = values.len() as u64;
    for step in 0..2 * (world - 1) {
        // Reduce-scatter: pass on the segment finished one step ago, add the arriving one, so
        // segment c travels c → c+1 → … and rank c−1 ends with all of it. All-gather: pass on the
        // finished segment, copy the arriving one.
        let (send_segment, recv_segment, combine) = if step < world - 1 {
            ((rank + world - step) % world, (rank + 2 * world - step - 1) % world, Combine::Add)
        } else {
            let step = step - (world - 1);
            ((rank + 1 + world - step) % world, (rank + world - step) % world, Combine::Copy)
        };
        let (outgoing, incoming) = disjoint_segments(
            values,
            segments[send_segment].clone(),
            segments[recv_segment].clone(),
        );
        let header = FrameHeader {
            kind: FrameKind::AllReduce,
            seq: op.seq,
            step: step as u32,
            chunk: 0,
            payload_len: 0,
            total,
        };
        exchange(
            ring,
            op,
            |successor| {
                for frame in 0..frame_count(outgoing.len(), per_frame) {
                    let part = &outgoing[frame_range(frame, per_frame, outgoing.len())];
                    let header = FrameHeader {
                        chunk: frame as u32,
                        payload_len: frame_len(part.len() * 4),
                        ..header
                    };
                    successor.send_f32s(header, part, op.timeout)?;
                }
                Ok(())
            },
            |predecessor| {
                let len = incoming.len();
                for frame in 0..frame_count(len, per_frame) {
                    let part = &mut incoming[frame_range(frame, per_frame, len)];
                    let expected = FrameHeader {
                        chunk: frame as u32,
                        payload_len: frame_len(part.len() * 4),
                        ..header
                    };
                    match combine {
                        Combine::Add => predecessor.recv_f32s_add(expected, part, op.timeout)?,
                        // Straight from the socket into the buffer.
                        Combine::Copy => predecessor.recv_f32s_into(expected, part, op.timeout)?,
                    }
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// The segment to send (shared) and the one to receive into (mutable), from one buffer.
fn disjoint_segments(
    values: &mut [f32],
    outgoing: Range<usize>,
    incoming: Range<usize>,
) -> (&[f32], &mut [f32]) {
    if outgoing.end <= incoming.start {
        let (before, after) = values.split_at_mut(incoming.start);
        (&before[outgoing], &mut after[..incoming.end - incoming.start])
    } else {
        let (before, after) = values.split_at_mut(outgoing.start);
        (&after[..outgoing.end - outgoing.start], &mut before[incoming])
    }
}

/// `world_size − 1` token passes: the token a rank receives in the last step left rank + 1 after
/// that rank entered the barrier, and by induction every rank did.
pub(super) fn ring_barrier(ring: &mut Ring, op: &OpContext) -> Result<(), StepError> {
    for step in 0..op.world_size - 1 {
        let token = FrameHeader {
            kind: FrameKind::Barrier,
            seq: op.seq,
            step: step as u32,
            chunk: 0,
            payload_len: 0,
            total: 0,
        };
        exchange(
            ring,
            op,
            |successor| successor.send_frame(token, &[], op.timeout),
            |predecessor| predecessor.recv_expected(token, op.timeout).map(|_| ()),
        )?;
    }
    Ok(())
}

/// A pipeline along the ring from `root`: each rank stores every frame it receives and forwards it
/// to its successor, except the last rank before `root`.
pub(super) fn ring_broadcast(
    ring: &mut Ring,
    op: &OpContext,
    root: usize,
    bytes: &mut [u8],
) -> Result<(), StepError> {
    let world = op.world_size;
    let distance = (op.rank + world - root) % world;
    let len = bytes.len();
    let per_frame = op.chunk_bytes;
    let frames = frame_count(len, per_frame);
    let header = |frame: usize| FrameHeader {
        kind: FrameKind::Broadcast,
        seq: op.seq,
        step: 0,
        chunk: frame as u32,
        payload_len: frame_len(frame_range(frame, per_frame, len).len()),
        total: len as u64,
    };
    if distance == 0 {
        let bytes = &*bytes;
        return exchange(
            ring,
            op,
            |successor| {
                (0..frames).try_for_each(|frame| {
                    let part = &bytes[frame_range(frame, per_frame, len)];
                    successor.send_frame(header(frame), part, op.timeout)
                })
            },
            |_| Ok(()),
        );
    }
    let forward = distance < world - 1;
    let (to_forward, forwarded) = mpsc::channel::<(usize, Vec<u8>)>();
    let keepalive_every = op.keepalive_every();
    exchange(
        ring,
        op,
        move |successor| {
            if !forward {
                return Ok(());
            }
            loop {
                match forwarded.recv_timeout(keepalive_every) {
                    Ok((frame, part)) => successor.send_frame(header(frame), &part, op.timeout)?,
                    Err(RecvTimeoutError::Timeout) => {
                        successor.send_keepalive(op.seq, op.timeout)?
                    }
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
        },
        move |predecessor| {
            for frame in 0..frames {
                let part = &mut bytes[frame_range(frame, per_frame, len)];
                predecessor.recv_into(header(frame), part, op.timeout)?;
                if forward {
                    // The sender thread only stops early when its link failed; that error wins.
                    let _ = to_forward.send((frame, part.to_vec()));
                }
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer_and_differ_by_at_most_one() {
        for (len, world) in [(0, 1), (0, 3), (2, 4), (10, 3), (10_007, 4), (12, 4)] {
            let segments = ring_segments(len, world);
            assert_eq!(segments.len(), world);
            assert_eq!(segments.first().map(|s| s.start), Some(0));
            assert_eq!(segments.last().map(|s| s.end), Some(len));
            for pair in segments.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(pair[0].len() == pair[1].len() || pair[0].len() == pair[1].len() + 1);
            }
        }
        assert_eq!(ring_segments(10, 3), vec![0..4, 4..7, 7..10]);
    }

    #[test]
    fn disjoint_segments_handles_empty_segments_either_side() {
        let mut values: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let (out, inc) = disjoint_segments(&mut values, 0..2, 2..6);
        assert_eq!((out.len(), inc.len()), (2, 4));
        let (out, inc) = disjoint_segments(&mut values, 4..6, 0..4);
        assert_eq!((out, inc.len()), (&[4.0, 5.0][..], 4));
        // An empty segment sits at the start of the next one.
        let (out, inc) = disjoint_segments(&mut values, 3..3, 3..6);
        assert_eq!((out.len(), inc.len()), (0, 3));
        let (out, inc) = disjoint_segments(&mut values, 3..6, 3..3);
        assert_eq!((out.len(), inc.len()), (3, 0));
        let (out, inc) = disjoint_segments(&mut values, 6..6, 6..6);
        assert_eq!((out.len(), inc.len()), (0, 0));
    }

    #[test]
    fn frames_cover_each_segment_and_empty_ones_still_get_one() {
        assert_eq!(frame_count(0, 4), 1);
        assert_eq!(frame_count(9, 4), 3);
        assert_eq!(frame_range(2, 4, 9), 8..9);
        assert_eq!(frame_range(0, 4, 0), 0..0);
    }
}
