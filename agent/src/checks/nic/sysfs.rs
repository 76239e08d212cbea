//! Reading sysfs attribute files: a value, absent (not there, or not reported in the current
//! state), or garbage that is named in an `unknown` finding. The pcie check reads its files the
//! same way.

use std::collections::BTreeSet;
use std::io::{self, Read};
use std::path::Path;

use fleetmend_proto::{Finding, RecommendedAction, Status};

/// Most sysfs bytes read from one file; attribute files are a line at most.
const MAX_ATTR_BYTES: u64 = 4096;

/// One sysfs attribute as read (the pcie check reads its files the same way).
#[derive(Debug, Clone, PartialEq)]
pub(in crate::checks) enum Attr<T> {
    Value(T),
    /// Not there, or not reported in the current state (e.g. speed of a down link).
    Absent,
    /// There but unusable: the file name and why.
    Garbage(String),
}

/// The files of one subject that held garbage, as their values are taken.
#[derive(Debug, Default)]
pub(in crate::checks) struct Unusable(pub(in crate::checks) Vec<String>);

impl Unusable {
    /// The value of `attr`, noting garbage; `dir` prefixes the file name (`statistics/`).
    pub(in crate::checks) fn take<T>(&mut self, attr: Attr<T>, dir: &str) -> Option<T> {
        match attr {
            Attr::Value(value) => Some(value),
            Attr::Absent => None,
            Attr::Garbage(why) => {
                self.0.push(format!("{dir}{why}"));
                None
            }
        }
    }
}

/// Reads a sysfs attribute: `Ok(None)` when absent, or when the kernel refuses it with `EINVAL`
/// (what `carrier` and `speed` do on a link that is down).
fn read_attr(path: &Path) -> io::Result<Option<String>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut bytes = Vec::new();
    match file.take(MAX_ATTR_BYTES).read_to_end(&mut bytes) {
        Ok(_) => Ok(Some(String::from_utf8_lossy(&bytes).trim().to_owned())),
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Reads and parses `dir/name`; `parse` returns `None` for garbage.
pub(in crate::checks) fn attr<T>(
    dir: &Path,
    name: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Attr<T> {
    match read_attr(&dir.join(name)) {
        Ok(None) => Attr::Absent,
        Ok(Some(text)) if text.is_empty() => Attr::Garbage(format!("{name}: empty")),
        Ok(Some(text)) => match parse(&text) {
            Some(value) => Attr::Value(value),
            None => {
                let shown: String = text.chars().take(32).collect();
                Attr::Garbage(format!("{name}: unexpected {shown:?}"))
            }
        },
        Err(err) => Attr::Garbage(format!("{name}: {err}")),
    }
}

pub(super) fn parse_u64(text: &str) -> Option<u64> {
    text.parse().ok()
}

/// The names of the directories in `dir` (entries that are links to directories count, as in
/// sysfs; plain files such as `bonding_masters` do not).
pub(in crate::checks) fn list_dirs(dir: &Path) -> io::Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.path().is_dir() {
            names.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(names)
}

/// `unknown`: `dir` could not be listed, so what is in it cannot be told.
pub(super) fn unlisted_finding(
    finding: &str,
    subject: &str,
    dir: &Path,
    err: &io::Error,
) -> Finding {
    Finding::new(
        super::NAME,
        finding,
        subject,
        Status::Unknown,
        RecommendedAction::None,
        format!("cannot list {}: {err}", dir.display()),
    )
}

/// `unknown` naming the sysfs files that were missing or held garbage, ok when there were none
/// (`check`'s `finding` about `subject`; the pcie check uses it too).
pub(in crate::checks) fn unreadable_finding(
    check: &str,
    finding: &str,
    subject: &str,
    dir: &Path,
    unusable: &Unusable,
) -> Finding {
    if unusable.0.is_empty() {
        Finding::ok(check, finding, subject)
    } else {
        Finding::new(
            check,
            finding,
            subject,
            Status::Unknown,
            RecommendedAction::None,
            format!("unusable sysfs files in {}: {}", dir.display(), unusable.0.join("; ")),
        )
    }
}
