//! Reading the kernel log: `/dev/kmsg` (one record per `read()`), or a plain file followed as it
//! grows (tests, or a log copied off another node).
//!
//! Never blocks: the device is opened `O_NONBLOCK` and read until `EAGAIN`; a plain file is read to
//! its current end. Whoever calls decides when to look again (the follower thread polls, a run in
//! once mode reads the backlog and returns).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::stamp::{Joint, Stamp, parse_line};

/// Bytes of one line or record kept for matching; the rest of a longer line is dropped. Kernel
/// records are at most ~8 KiB; a plain file may hold anything (random bytes, no newlines).
pub const MAX_LINE_BYTES: usize = 4096;

/// Read buffer: large enough for any `/dev/kmsg` record (a smaller one makes `read()` fail with
/// `EINVAL`).
const READ_BUFFER: usize = 16 * 1024;

/// One kernel-log message.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The message, without the kmsg, dmesg, journal or syslog prefix; lossy UTF-8, at most
    /// [`MAX_LINE_BYTES`].
    pub text: String,
    /// When it was logged, as the line says.
    pub stamp: Stamp,
    /// Goes on with the message before it (an indented dmesg or journal line).
    pub continued: Option<Joint>,
    /// A `/dev/kmsg` fragment (flag `c`): the next record goes on with this line.
    pub fragment: bool,
    /// False for another program's line in a journal or syslog file: it matches no rule.
    pub kernel: bool,
    /// A `/dev/kmsg` record's sequence number (with the boot id, its identity).
    pub seq: Option<u64>,
}

impl Record {
    /// A kernel message with no time (tests, and lines logged "now").
    pub fn now(text: &str) -> Record {
        Record {
            text: text.to_owned(),
            stamp: Stamp::None,
            continued: None,
            fragment: false,
            kernel: true,
            seq: None,
        }
    }

    /// Microseconds since boot, where the line carried a kmsg or dmesg timestamp.
    pub fn usec(&self) -> Option<u64> {
        match self.stamp {
            Stamp::SinceBoot(usec) => Some(usec),
            _ => None,
        }
    }
}

/// Parses one line or record in any of the formats of [`super::stamp`]. For kmsg records only
/// the first line is the message (continuation lines are ` KEY=value` metadata).
pub fn parse_record(raw: &[u8]) -> Record {
    let raw = &raw[..raw.len().min(MAX_LINE_BYTES)];
    let first = raw.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(first);
    let mut line = line.trim_end_matches(['\r', '\0']);
    // Each invalid byte became a 3-byte replacement character: cut again, at a character.
    if line.len() > MAX_LINE_BYTES {
        let mut cut = MAX_LINE_BYTES;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line = &line[..cut];
    }
    let parsed = parse_line(line);
    Record {
        text: parsed.message.into_owned(),
        stamp: parsed.stamp,
        continued: parsed.continued,
        fragment: parsed.fragment,
        kernel: parsed.kernel,
        seq: parsed.seq,
    }
}

/// Splits a byte stream into lines with bounded memory: a line longer than [`MAX_LINE_BYTES`] is
/// cut there and the rest of it dropped up to its newline.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
    /// Dropping the tail of an over-long line until its newline.
    skipping: bool,
}

impl LineSplitter {
    /// Feeds `bytes`, calling `line` with each complete line (without its newline).
    pub fn push(&mut self, mut bytes: &[u8], line: &mut dyn FnMut(&[u8])) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|b| *b == b'\n');
            let (chunk, rest, ended) = match newline {
                Some(at) => (&bytes[..at], &bytes[at + 1..], true),
                None => (bytes, &bytes[bytes.len()..], false),
            };
            if !self.skipping {
                let room = MAX_LINE_BYTES - self.partial.len();
                self.partial.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if chunk.len() >= room && !ended {
                    // Full and still no newline: use what we have, drop the rest of this line.
                    line(&self.partial);
                    self.partial.clear();
                    self.skipping = true;
                }
            }
            if ended {
                if !self.skipping {
                    line(&self.partial);
                }
                self.partial.clear();
                self.skipping = false;
            }
            bytes = rest;
        }
    }

    /// Hands out a last line that has no newline yet (end of a backlog read in once mode).
    pub fn flush(&mut self, line: &mut dyn FnMut(&[u8])) {
        if !self.partial.is_empty() && !self.skipping {
            line(&self.partial);
        }
        self.partial.clear();
        self.skipping = false;
    }

    fn reset(&mut self) {
        self.partial.clear();
        self.skipping = false;
    }
}

/// Opening or reading the log failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("opening kernel log {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("reading kernel log {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("kernel log {path} is neither a character device nor a regular file")]
    NotALog { path: PathBuf },
}

#[derive(Debug)]
enum Source {
    /// `/dev/kmsg`: every `read()` returns one record.
    Device(File),
    /// A plain file, read from `pos` on; `(dev, ino)` tell a replaced file from a grown one.
    Plain { file: File, pos: u64, dev: u64, ino: u64 },
}

/// How a read went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadProgress {
    /// Records handed out.
    pub records: usize,
    /// Stopped at `max_records` with more to read.
    pub more: bool,
}

/// The kernel log at one path, opened lazily and reopened after it was absent, replaced or cut.
#[derive(Debug)]
pub struct LogReader {
    path: PathBuf,
    source: Option<Source>,
    splitter: LineSplitter,
    /// Start at the end of the log on the next open attempt (only the first: later opens are of a
    /// log that was absent, replaced or cut, so everything in it is new).
    from_end: bool,
    buf: Vec<u8>,
}

impl LogReader {
    /// A reader of `path`; `from_end` skips what the log holds when it is first opened.
    pub fn new(path: &Path, from_end: bool) -> Self {
        LogReader {
            path: path.to_owned(),
            source: None,
            splitter: LineSplitter::default(),
            from_end,
            buf: vec![0; READ_BUFFER],
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the log now if it is not open yet.
    pub fn ensure_open(&mut self) -> Result<(), LogError> {
        if self.source.is_some() {
            return Ok(());
        }
        // Only the first attempt may skip what is there: a log that was absent or unreadable at
        // first holds only records we have not seen.
        let from_end = std::mem::replace(&mut self.from_end, false);
        let open_err = |source| LogError::Open { path: self.path.clone(), source };
        // O_NONBLOCK: /dev/kmsg reads return EAGAIN at the end instead of waiting for the next
        // record; no effect on regular files.
        let mut file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let source = if meta.file_type().is_char_device() {
            if from_end {
                file.seek(SeekFrom::End(0)).map_err(open_err)?;
            }
            Source::Device(file)
        } else if meta.is_file() {
            let pos = if from_end { file.seek(SeekFrom::End(0)).map_err(open_err)? } else { 0 };
            Source::Plain { file, pos, dev: meta.dev(), ino: meta.ino() }
        } else {
            return Err(LogError::NotALog { path: self.path.clone() });
        };
        self.splitter.reset();
        self.source = Some(source);
        Ok(())
    }

    /// Reads what the log holds now, without waiting, handing each record to `on_record`; stops
    /// after `max_records` so the caller can look at its stop flag or deadline. `flush_partial`
    /// hands out a last line without a newline (once mode: the backlog is all there is).
    pub fn read_available(
        &mut self,
        max_records: usize,
        flush_partial: bool,
        on_record: &mut dyn FnMut(Record),
    ) -> Result<ReadProgress, LogError> {
        self.ensure_open()?;
        let result = match self.source.as_mut() {
            Some(Source::Device(file)) => read_device(file, &mut self.buf, max_records, on_record),
            Some(Source::Plain { .. }) => self.read_plain(max_records, flush_partial, on_record),
            None => Ok(ReadProgress { records: 0, more: false }),
        };
        result.map_err(|source| {
            // Start afresh on the next call (the reopen reads from the start: all of it is new).
            self.source = None;
            LogError::Read { path: self.path.clone(), source }
        })
    }

    fn read_plain(
        &mut self,
        max_records: usize,
        flush_partial: bool,
        on_record: &mut dyn FnMut(Record),
    ) -> io::Result<ReadProgress> {
        let Some(Source::Plain { dev, ino, pos, .. }) = &self.source else {
            return Ok(ReadProgress { records: 0, more: false });
        };
        let (dev, ino, pos) = (*dev, *ino, *pos);
        // Look at the path, not the open file: a replaced or cut file starts again from 0.
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.dev() == dev && meta.ino() == ino && meta.len() >= pos => {}
            Ok(_) => {
                self.source = None;
                self.ensure_open().map_err(|err| io::Error::other(err.to_string()))?;
            }
            Err(err) => return Err(err),
        }
        let Some(Source::Plain { file, pos, .. }) = self.source.as_mut() else {
            return Ok(ReadProgress { records: 0, more: false });
        };
        let records = std::cell::Cell::new(0usize);
        let mut emit = |raw: &[u8]| {
            on_record(parse_record(raw));
            records.set(records.get() + 1);
        };
        loop {
            if records.get() >= max_records {
                return Ok(ReadProgress { records: records.get(), more: true });
            }
            // The budget is checked per buffer: at most one buffer of lines beyond it.
            let n = match file.read(&mut self.buf) {
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            if n == 0 {
                if flush_partial {
                    self.splitter.flush(&mut emit);
                }
                return Ok(ReadProgress { records: records.get(), more: false });
            }
            *pos += n as u64;
            self.splitter.push(&self.buf[..n], &mut emit);
        }
    }
}

/// Reads `/dev/kmsg` records until `EAGAIN` or `max_records`.
fn read_device(
    file: &mut File,
    buf: &mut [u8],
    max_records: usize,
    on_record: &mut dyn FnMut(Record),
) -> io::Result<ReadProgress> {
    let mut records = 0usize;
    while records < max_records {
        match file.read(buf) {
            // Nothing more, on a kernel that reports the end as EOF rather than EAGAIN.
            Ok(0) => return Ok(ReadProgress { records, more: false }),
            Ok(n) => {
                on_record(parse_record(&buf[..n]));
                records += 1;
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                return Ok(ReadProgress { records, more: false });
            }
            // EPIPE: records were overwritten before we read them; the next read goes on with the
            // oldest one still there.
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => {}
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(ReadProgress { records, more: true })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_kmsg_dmesg_and_bare_lines() {
        let r =
            parse_record(b"3,1234,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1\n SUBSYSTEM=pci");
        assert_eq!(r.text, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1");
        assert_eq!(r.usec(), Some(5_000_000));
        let r = parse_record(b"6,2,3,c,extra;hello; world");
        assert_eq!((r.text.as_str(), r.usec(), r.fragment), ("hello; world", Some(3), true));
        let r = parse_record(b"[   12.5] mce: [Hardware Error]: x");
        assert_eq!((r.text.as_str(), r.usec()), ("mce: [Hardware Error]: x", Some(12_500_000)));
        let r = parse_record(b"plain; not,a,prefix");
        assert_eq!((r.text.as_str(), r.usec()), ("plain; not,a,prefix", None));
        let r = parse_record(b"[abc] x");
        assert_eq!((r.text.as_str(), r.usec()), ("[abc] x", None));
        let r = parse_record(b"\xff\xfe;\x00\r");
        assert_eq!(r.usec(), None);
        assert!(r.text.contains('\u{fffd}'));
    }

    #[test]
    fn long_records_are_cut() {
        let long = vec![b'a'; MAX_LINE_BYTES * 3];
        assert_eq!(parse_record(&long).text.len(), MAX_LINE_BYTES);
    }

    /// Found by the kernel_log fuzz target's bound (fuzz/regressions/kernel_log/): invalid UTF-8
    /// became replacement characters three times its size, so a record's text reached
    /// 3 × MAX_LINE_BYTES.
    #[test]
    fn invalid_utf8_does_not_grow_a_record_past_the_cap() {
        let text = parse_record(&vec![0xff; MAX_LINE_BYTES]).text;
        assert!(text.len() <= MAX_LINE_BYTES, "{} bytes", text.len());
        assert!(text.len() > MAX_LINE_BYTES - 3 && text.chars().all(|c| c == '\u{fffd}'));
    }

    #[test]
    fn splitter_bounds_lines_and_keeps_partials() {
        let mut lines: Vec<Vec<u8>> = Vec::new();
        let mut s = LineSplitter::default();
        s.push(b"one\ntw", &mut |l| lines.push(l.to_vec()));
        s.push(b"o\n", &mut |l| lines.push(l.to_vec()));
        assert_eq!(lines, [b"one".to_vec(), b"two".to_vec()]);
        lines.clear();
        let mut long = vec![b'x'; MAX_LINE_BYTES + 10];
        long.extend_from_slice(b"\nnext\nlast");
        for chunk in long.chunks(7) {
            s.push(chunk, &mut |l| lines.push(l.to_vec()));
        }
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), MAX_LINE_BYTES);
        assert_eq!(lines[1], b"next");
        s.flush(&mut |l| lines.push(l.to_vec()));
        assert_eq!(lines[2], b"last");
    }

    #[test]
    fn plain_file_is_followed_and_restarted_when_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        std::fs::write(&path, "old line\n").unwrap();
        let mut reader = LogReader::new(&path, true);
        let mut seen = Vec::new();
        reader.read_available(100, false, &mut |r| seen.push(r.text)).unwrap();
        assert!(seen.is_empty(), "{seen:?}");
        std::fs::write(&path, "old line\nnew line\npart").unwrap();
        reader.read_available(100, false, &mut |r| seen.push(r.text)).unwrap();
        assert_eq!(seen, ["new line"]);
        std::fs::write(&path, "cut\n").unwrap();
        reader.read_available(100, false, &mut |r| seen.push(r.text)).unwrap();
        assert_eq!(seen, ["new line", "cut"]);
        let progress = reader.read_available(100, true, &mut |r| seen.push(r.text)).unwrap();
        assert_eq!(progress, ReadProgress { records: 0, more: false });
    }

    #[test]
    fn absent_log_is_an_open_error_naming_the_path() {
        let mut reader = LogReader::new(Path::new("/nonexistent/kmsg"), false);
        let err = reader.read_available(10, true, &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kmsg"), "{err}");
    }
}
