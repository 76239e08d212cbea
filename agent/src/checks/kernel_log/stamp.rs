//! The line formats a kernel log comes in, and the time each line carries.
//!
//! - `/dev/kmsg` records: `PRIO,SEQ,USEC,FLAGS[,caller];message` (microseconds since boot; flag
//!   `c` marks a fragment of a line, which the next record goes on with; a newline inside a message is escaped as
//!   `\x0a`, and lines of ` KEY=value` after a record are its metadata);
//! - `dmesg`: `[  12.345678] message` (seconds since boot); a message of several lines goes on in
//!   lines indented with spaces and no stamp;
//! - `dmesg -T`: `[Tue Dec  1 10:00:00 2026] message` (local time);
//! - `dmesg --time-format iso`: `2026-12-01T10:00:00,123456+00:00 message`;
//! - journald and syslog files: `Dec  1 10:00:00 host kernel: message` (local time, no year),
//!   `journalctl -o short-precise` (`Dec 01 10:00:00.123456 host kernel: ...`) and
//!   `-o short-iso` (`2026-12-01T10:00:00+0000 host kernel: ...`); a `[  12.3]` stamp after
//!   `kernel:` is dropped (the line's own time is the wall clock's). Lines of other programs in
//!   such a file (`host sshd[812]: ...`) are not the kernel's and match no rule.
//! - anything else: the line is the message, with no time.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

/// When a line was logged, as the line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// No time in the line: it counts as read now.
    None,
    /// Microseconds since boot (`/dev/kmsg`, `dmesg`).
    SinceBoot(u64),
    /// Wall-clock time (`dmesg -T`, `--time-format iso`, journald, syslog).
    Wall(SystemTime),
}

/// How a line continues the message before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joint {
    /// After a `/dev/kmsg` fragment (flag `c`): the rest of the same line.
    Fragment,
    /// An indented line with no stamp (dmesg, journalctl): the next line of the same message.
    Line,
}

/// One line taken apart: its time, its message, and whether it is the kernel's.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed<'a> {
    pub stamp: Stamp,
    pub message: Cow<'a, str>,
    /// Goes on with the message before it (an indented line; fragments are told by `fragment`).
    pub continued: Option<Joint>,
    /// A `/dev/kmsg` fragment (flag `c`): the next record goes on with this line.
    pub fragment: bool,
    /// False for another program's line in a journal or syslog file, and for kmsg metadata.
    pub kernel: bool,
    /// The kernel's sequence number of a `/dev/kmsg` record: with the boot id, the record's
    /// identity.
    pub seq: Option<u64>,
}

impl<'a> Parsed<'a> {
    fn kernel(stamp: Stamp, message: &'a str) -> Self {
        Parsed {
            stamp,
            message: Cow::Borrowed(message),
            continued: None,
            fragment: false,
            kernel: true,
            seq: None,
        }
    }

    fn other(stamp: Stamp, message: &'a str) -> Self {
        Parsed { kernel: false, ..Parsed::kernel(stamp, message) }
    }
}

/// Takes one line apart (see the module's documentation for the formats).
pub fn parse_line(line: &str) -> Parsed<'_> {
    if let Some(parsed) = kmsg(line) {
        return parsed;
    }
    if line.starts_with([' ', '\t']) {
        let text = line.trim();
        let is_metadata = text.split_once('=').is_some_and(|(key, _)| {
            !key.is_empty() && key.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        });
        if is_metadata || text.is_empty() {
            return Parsed::other(Stamp::None, text);
        }
        return Parsed { continued: Some(Joint::Line), ..Parsed::kernel(Stamp::None, text) };
    }
    if let Some(rest) = line.strip_prefix('[')
        && let Some((stamp, message)) = rest.split_once(']')
    {
        let message = message.strip_prefix(' ').unwrap_or(message).trim_start();
        if let Some(usec) = parse_since_boot(stamp.trim()) {
            return Parsed::kernel(Stamp::SinceBoot(usec), message);
        }
        if let Some(at) = parse_ctime(stamp.trim()) {
            return Parsed::kernel(Stamp::Wall(at), message);
        }
    }
    if let Some((at, rest)) = parse_iso(line) {
        return after_wall_stamp(at, rest, false);
    }
    if let Some((at, rest)) = parse_syslog_stamp(line, SystemTime::now()) {
        return after_wall_stamp(at, rest, true);
    }
    Parsed::kernel(Stamp::None, line)
}

/// `PRIO,SEQ,USEC,FLAGS[,...];message`.
fn kmsg(line: &str) -> Option<Parsed<'_>> {
    let (prefix, message) = line.split_once(';')?;
    let mut fields = prefix.split(',');
    let numeric = |f: Option<&str>| {
        f.filter(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit())).map(str::to_owned)
    };
    let (_prio, seq, usec) = (numeric(fields.next())?, numeric(fields.next())?, fields.next());
    let usec: u64 = numeric(usec)?.parse().ok()?;
    let fragment = fields.next().is_some_and(|flags| flags.contains('c'));
    Some(Parsed {
        stamp: Stamp::SinceBoot(usec),
        message: unescape_kmsg(message),
        continued: None,
        fragment,
        kernel: true,
        seq: seq.parse().ok(),
    })
}

/// `/dev/kmsg` escapes control characters and backslashes as `\xNN`; a message of several lines
/// has `\x0a` between them.
fn unescape_kmsg(message: &str) -> Cow<'_, str> {
    if !message.contains("\\x") {
        return Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("\\x") {
        out.push_str(&rest[..at]);
        let hex = rest.get(at + 2..at + 4).and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) if byte.is_ascii() => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            _ => {
                out.push_str("\\x");
                rest = &rest[at + 2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// What follows a wall-clock stamp: `host kernel: message` (a journal or syslog line), another
/// program's `host tag[pid]: message`, or (dmesg's iso format) the message itself. `syslog` says
/// the stamp was the syslog one, which dmesg never prints: there every line has a host and a tag.
fn after_wall_stamp(at: SystemTime, rest: &str, syslog: bool) -> Parsed<'_> {
    let stamp = Stamp::Wall(at);
    if let Some((host, after)) = rest.split_once(' ')
        && !host.is_empty()
        && !host.contains(':')
    {
        if let Some(message) = after.strip_prefix("kernel: ") {
            // `kernel: [  12.345678] message`: the wall-clock stamp is the better one.
            let message = match message.strip_prefix('[').and_then(|m| m.split_once(']')) {
                Some((since_boot, rest)) if parse_since_boot(since_boot.trim()).is_some() => {
                    rest.trim_start()
                }
                _ => message,
            };
            return Parsed::kernel(stamp, message);
        }
        if syslog || is_program_tag(after) {
            return Parsed::other(stamp, rest);
        }
    }
    Parsed::kernel(stamp, rest)
}

/// `tag[pid]: ...`: a program's line in a journal.
fn is_program_tag(text: &str) -> bool {
    let Some((tag, _)) = text.split_once(": ") else { return false };
    let Some((name, pid)) = tag.split_once('[') else { return false };
    !name.is_empty()
        && !name.contains(' ')
        && pid
            .strip_suffix(']')
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `12.345678` (seconds since boot, as dmesg prints them) in microseconds.
pub fn parse_since_boot(stamp: &str) -> Option<u64> {
    let (secs, frac) = stamp.split_once('.')?;
    if secs.is_empty()
        || frac.is_empty()
        || frac.len() > 9
        || !secs.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let micros: u64 = format!("{frac:0<6}")[..6].parse().ok()?;
    secs.checked_mul(1_000_000)?.checked_add(micros)
}

const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

fn month(name: &str) -> Option<u32> {
    MONTHS.iter().position(|m| *m == name).map(|i| i as u32 + 1)
}

/// `HH:MM:SS` with an optional `.fraction`: (hours, minutes, seconds, nanoseconds).
fn parse_clock(text: &str) -> Option<(u32, u32, u32, u32)> {
    let (clock, frac) = match text.split_once(['.', ',']) {
        Some((clock, frac)) => (clock, Some(frac)),
        None => (text, None),
    };
    let mut parts = clock.split(':');
    let mut field = |max: u32| -> Option<u32> {
        let part = parts.next()?;
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        part.parse().ok().filter(|v| *v <= max)
    };
    let (h, m, s) = (field(23)?, field(59)?, field(60)?);
    if parts.next().is_some() {
        return None;
    }
    let nanos = match frac {
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{f:0<9}").parse().ok()?
        }
        Some(_) => return None,
        None => 0,
    };
    Some((h, m, s, nanos))
}

/// `Tue Dec  1 10:00:00 2026` (dmesg -T, local time).
fn parse_ctime(text: &str) -> Option<SystemTime> {
    let mut words = text.split_whitespace();
    let (_weekday, month_name, day, clock, year) =
        (words.next()?, words.next()?, words.next()?, words.next()?, words.next()?);
    if words.next().is_some() {
        return None;
    }
    let (h, m, s, nanos) = parse_clock(clock)?;
    let date = (year.parse().ok()?, month(month_name)?, day.parse().ok()?);
    local_time(date, (h, m, s)).map(|at| at + Duration::from_nanos(u64::from(nanos)))
}

/// `2026-12-01T10:00:00[,.]fraction(+00:00|+0000|Z)? rest`: the time and the rest of the line.
fn parse_iso(line: &str) -> Option<(SystemTime, &str)> {
    let (stamp, rest) = line.split_once(' ')?;
    let (date, time) = stamp.split_once('T')?;
    let mut parts = date.split('-');
    let year: i64 = parts.next().filter(|y| y.len() == 4)?.parse().ok()?;
    let month: u32 = parts.next().filter(|m| m.len() == 2)?.parse().ok()?;
    let day: u32 = parts.next().filter(|d| d.len() == 2)?.parse().ok()?;
    if parts.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // The zone: `Z`, or a sign after the clock (the clock itself has no `+` or `-`).
    let (clock, offset_secs) = if let Some(clock) = time.strip_suffix('Z') {
        (clock, Some(0))
    } else if let Some(at) = time.find(['+', '-']) {
        (&time[..at], Some(parse_offset(&time[at..])?))
    } else {
        (time, None)
    };
    let (h, m, s, nanos) = parse_clock(clock)?;
    let at = match offset_secs {
        Some(offset) => {
            let days = days_from_civil(year, month, day);
            let secs = days * 86_400 + i64::from(h * 3600 + m * 60 + s) - offset;
            SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(secs).ok()?))?
        }
        None => local_time((year, month, day), (h, m, s))?,
    };
    Some((at + Duration::from_nanos(u64::from(nanos)), rest))
}

/// `+05:30`, `-0800`: seconds east of UTC.
fn parse_offset(text: &str) -> Option<i64> {
    let sign = if text.starts_with('-') { -1 } else { 1 };
    let digits: String = text[1..].chars().filter(|c| *c != ':').collect();
    if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let hours: i64 = digits[..2].parse().ok()?;
    let minutes: i64 = digits[2..].parse().ok()?;
    Some(sign * (hours * 3600 + minutes * 60))
}

/// `Dec  1 10:00:00[.fraction] rest` (syslog, journald's short formats; local time, no year: the
/// year that puts it no later than a day after `now`).
fn parse_syslog_stamp(line: &str, now: SystemTime) -> Option<(SystemTime, &str)> {
    let month = month(line.get(..3)?)?;
    let rest = line.get(3..)?.strip_prefix(' ')?.trim_start();
    let (day, rest) = rest.split_once(' ')?;
    let day: u32 = day.parse().ok().filter(|d| (1..=31).contains(d))?;
    let (clock, rest) = rest.split_once(' ')?;
    let (h, m, s, nanos) = parse_clock(clock)?;
    let this_year = local_year(now)?;
    let mut at = local_time((this_year, month, day), (h, m, s))?;
    if at > now + Duration::from_secs(86_400) {
        at = local_time((this_year - 1, month, day), (h, m, s))?;
    }
    Some((at + Duration::from_nanos(u64::from(nanos)), rest))
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The local time `date` `clock` as a system time (the machine's time zone, as dmesg -T and
/// syslog print it).
fn local_time(
    (year, month, day): (i64, u32, u32),
    (h, m, s): (u32, u32, u32),
) -> Option<SystemTime> {
    let small = |v: u32| i8::try_from(v).ok();
    let civil = jiff::civil::DateTime::new(
        i16::try_from(year).ok()?,
        small(month)?,
        small(day)?,
        small(h)?,
        small(m)?,
        small(s.min(59))?,
        0,
    )
    .ok()?;
    let zoned = civil.to_zoned(jiff::tz::TimeZone::system()).ok()?;
    Some(SystemTime::from(zoned.timestamp()))
}

/// The local calendar year at `now`.
fn local_year(now: SystemTime) -> Option<i64> {
    let at = jiff::Timestamp::try_from(now).ok()?;
    Some(i64::from(at.to_zoned(jiff::tz::TimeZone::system()).year()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn utc(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// 2026-12-01T10:00:00Z.
    const T: u64 = 1_796_119_200;

    #[test]
    fn civil_dates_count_days_from_the_epoch() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 12, 1) * 86_400 + 36_000, T as i64);
    }

    #[test]
    fn kmsg_and_dmesg_stamps_are_since_boot() {
        let p = parse_line("6,339,5140900,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1");
        assert_eq!(p.stamp, Stamp::SinceBoot(5_140_900));
        assert_eq!(p.message, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1");
        assert!(p.continued.is_none() && p.kernel);
        assert!(parse_line("4,340,5140901,c;fragment").fragment);
        let p = parse_line("6,339,5140900,-,caller=T1;a\\x0ab \\x5c \\xzz");
        assert_eq!(p.message, "a\nb \\ \\xzz");
        let p = parse_line("[   12.345678] mce: [Hardware Error]: x");
        assert_eq!(
            (p.stamp, &*p.message),
            (Stamp::SinceBoot(12_345_678), "mce: [Hardware Error]: x")
        );
        assert_eq!(parse_line("plain; not,a,prefix").stamp, Stamp::None);
        assert_eq!(parse_line("[abc] x").message, "[abc] x");
        // dmesg's indented lines go on with the message; kmsg metadata is not a message.
        let p = parse_line("               NVRM: fallen off the bus and is not responding");
        assert_eq!(
            (p.continued, &*p.message),
            (Some(Joint::Line), "NVRM: fallen off the bus and is not responding")
        );
        assert!(!parse_line(" SUBSYSTEM=pci").kernel);
        assert!(!parse_line(" DEVICE=+pci:0000:00:01.0").kernel);
    }

    #[test]
    fn iso_stamps_carry_their_zone() {
        let p = parse_line("2026-12-01T10:00:00,123456+00:00 NVRM: Xid (PCI:0000:3b:00): 79, x");
        assert_eq!(p.stamp, Stamp::Wall(utc(T) + Duration::from_micros(123_456)));
        assert_eq!(p.message, "NVRM: Xid (PCI:0000:3b:00): 79, x");
        let p = parse_line("2026-12-01T11:30:00+0130 gpu-7 kernel: NVRM: Xid x");
        assert_eq!((p.stamp, &*p.message, p.kernel), (Stamp::Wall(utc(T)), "NVRM: Xid x", true));
        let p = parse_line("2026-12-01T10:00:00Z gpu-7 sshd[812]: Accepted publickey");
        assert!(!p.kernel);
        // dmesg's iso format: a driver's message that looks like `word word: ...`.
        let p = parse_line("2026-12-01T10:00:00,000000+00:00 nvme nvme0: I/O 123 QID 4 timeout");
        assert_eq!((&*p.message, p.kernel), ("nvme nvme0: I/O 123 QID 4 timeout", true));
        assert_eq!(parse_line("2026-13-01T10:00:00Z x").stamp, Stamp::None);
    }

    #[test]
    fn local_time_stamps_follow_the_time_zone() {
        // The tests run with the machine's zone; both sides use it.
        let at = local_time((2026, 12, 1), (10, 0, 0)).unwrap();
        let p = parse_line("[Tue Dec  1 10:00:00 2026] NVRM: Xid x");
        assert_eq!((p.stamp, &*p.message), (Stamp::Wall(at), "NVRM: Xid x"));
        let now = at + Duration::from_secs(3600);
        let (stamp, rest) =
            parse_syslog_stamp("Dec  1 10:00:00 gpu-7 kernel: [  12.5] x", now).unwrap();
        assert_eq!(stamp, at);
        let parsed = after_wall_stamp(stamp, rest, true);
        assert_eq!((&*parsed.message, parsed.kernel), ("x", true));
        let (_, rest) =
            parse_syslog_stamp("Dec 01 10:00:00.250000 gpu-7 cron[9]: job", now).unwrap();
        assert!(!after_wall_stamp(stamp, rest, true).kernel);
        // In January, a December line is last year's.
        let january = local_time((2027, 1, 2), (0, 0, 0)).unwrap();
        let (last_year, _) = parse_syslog_stamp("Dec  1 10:00:00 h kernel: x", january).unwrap();
        assert_eq!(last_year, at);
    }
}
