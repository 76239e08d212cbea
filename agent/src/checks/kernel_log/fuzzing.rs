//! The kernel-log fuzz target's body ([`check_kernel_log`]), beside the private parts it drives.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use super::rules::{self, MAX_LINES, Rule};
use super::source::{LineSplitter, MAX_LINE_BYTES, parse_record};
use super::stamp::parse_line;
use super::{KernelLogConfig, Ledger, MAX_MESSAGE_CHARS, MAX_SUBJECTS, NAME};

/// Longest subject and label value a finding may carry (the rules' own caps).
const MAX_SUBJECT_CHARS: usize = 128;
const MAX_LABEL_CHARS: usize = 64;

fn builtin() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        rules::builtin_rules().iter().filter_map(|r| rules::compile(r).ok()).collect()
    })
}

fn lines_of(pieces: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    let mut splitter = LineSplitter::default();
    for piece in pieces {
        splitter.push(piece, &mut |line| lines.push(line.to_vec()));
    }
    splitter.flush(&mut |line| lines.push(line.to_vec()));
    lines
}

/// `data` as a kernel log: one `/dev/kmsg` record, and a plain file of lines in any format the agent
/// reads (kmsg, dmesg, dmesg -T, iso, journald, syslog), every line through the built-in rules.
///
/// Holds, beyond not panicking: lines come out the same however the bytes were cut into reads;
/// no line, record or message is longer than its cap ([`MAX_LINE_BYTES`]; twice that for a
/// message joined from continuations); a message is never longer than its line; the ledger keeps
/// at most [`MAX_LINES`] recent messages and [`MAX_SUBJECTS`] subjects; every finding is the
/// check's own with its message, subject and labels within their caps.
pub fn check_kernel_log(data: &[u8]) {
    let whole = parse_record(data);
    assert!(whole.text.len() <= MAX_LINE_BYTES, "record text of {} bytes", whole.text.len());

    // The same bytes read in one piece and cut at an arbitrary point (the first byte says where).
    let cut = data.first().map_or(0, |b| usize::from(*b) * data.len() / 256);
    let (head, tail) = data.split_at(cut.min(data.len()));
    let lines = lines_of(&[data]);
    let in_pieces = lines_of(&[head, tail]);
    assert_eq!(lines, in_pieces, "lines depend on where the reads ended");

    let rules = builtin();
    let mut ledger = Ledger::new(rules.len(), &KernelLogConfig::default());
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let uptime = Some(Duration::from_secs(86_400));
    for raw in &lines {
        assert!(raw.len() <= MAX_LINE_BYTES, "a line of {} bytes", raw.len());
        let line = String::from_utf8_lossy(raw);
        let parsed = parse_line(&line);
        assert!(parsed.message.len() <= line.len(), "the message is longer than its line");
        let record = parse_record(raw);
        assert!(record.text.len() <= MAX_LINE_BYTES, "record text of {} bytes", record.text.len());
        ledger.record(rules, &record, uptime, now);
        assert!(ledger.recent.len() <= MAX_LINES, "{} recent messages", ledger.recent.len());
        for message in &ledger.recent {
            assert!(message.len() <= 2 * MAX_LINE_BYTES, "a joined message of {}", message.len());
        }
        assert!(ledger.entries.len() <= MAX_SUBJECTS, "{} subjects", ledger.entries.len());
    }
    assert_eq!(ledger.lines, lines.len() as u64);
    for finding in ledger.findings(rules, now + Duration::from_secs(1)) {
        let chars = |text: &str| text.chars().count();
        assert_eq!(finding.check, NAME, "{finding:?}");
        assert!(!finding.finding.is_empty(), "{finding:?}");
        assert!(chars(&finding.message) <= MAX_MESSAGE_CHARS, "{finding:?}");
        assert!(chars(&finding.subject) <= MAX_SUBJECT_CHARS, "{finding:?}");
        for (key, value) in &finding.labels {
            assert!(key == "rule" || chars(value) <= MAX_LABEL_CHARS, "{key}={value:?}");
        }
    }
}

/// Lines that raise the built-in rules, Xid bursts included (six Xid 13 incidents a minute apart).
const SAMPLE_LOG: &str = "\
4,901,100000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=777, GPU has fallen off the bus.
4,902,100000100,-;NVRM: Xid (PCI:0000:bb:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)
4,903,110000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception: ESR 0x50 (GPC 0, TPC 1, SM 0)
4,904,170000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception: ESR 0x50 (GPC 0, TPC 1, SM 0)
4,905,230000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception: ESR 0x50 (GPC 0, TPC 1, SM 0)
4,906,290000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception: ESR 0x50 (GPC 0, TPC 1, SM 0)
4,907,350000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception: ESR 0x50 (GPC 0, TPC 1, SM 0)
4,908,410000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception: ESR 0x50 (GPC 0, TPC 1, SM 0)
3,909,420000000,-;EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0
4,910,430000000,-;mce: [Hardware Error]: Machine check events logged
";

/// A kernel_log section that validated, run: its rules compile, and the sample log through them
/// and its Xid bursts gives findings at times from now to far beyond every window without
/// panicking (durations from a config can be as long as humantime parses).
pub fn check_valid_config(config: &KernelLogConfig) {
    let effective = rules::effective_rules(config.builtin_rules, &config.rules);
    let compiled: Vec<Rule> = effective
        .iter()
        .map(|rule| match rules::compile(rule) {
            Ok(rule) => rule,
            Err(problems) => {
                panic!("rule {:?} validated but does not compile: {problems:?}", rule.name)
            }
        })
        .collect();
    let mut ledger = Ledger::new(compiled.len(), config);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    for line in SAMPLE_LOG.lines() {
        ledger.record(
            &compiled,
            &parse_record(line.as_bytes()),
            Some(Duration::from_secs(500)),
            now,
        );
    }
    for later in [0, 60, 3600, 86_400, 400 * 86_400, u64::from(u32::MAX)] {
        ledger.findings(&compiled, now + Duration::from_secs(later));
    }
}
