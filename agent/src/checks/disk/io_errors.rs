//! `disk_io_errors`: the I/O error counters (`ioerr_cnt`) of block devices under
//! `{sysfs}/block`, warning when one rose since the previous run.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::{NAME, errno_text, findings};
use crate::checks::Observation;
use crate::metrics::{DISK_IO_ERRORS, Sample};

/// Name prefixes of block devices left out of the I/O error watch by default: virtual devices
/// whose errors say nothing about the hardware.
const VIRTUAL_DEVICE_PREFIXES: [&str; 4] = ["loop", "ram", "zram", "dm-"];

/// The block devices watched and their counts of the previous run.
#[derive(Debug)]
pub(super) struct IoErrorWatch {
    /// The devices named in the config; empty: every device but virtual ones.
    devices: Vec<String>,
    /// I/O error counts of the previous run, by device.
    previous: HashMap<String, u64>,
}

impl IoErrorWatch {
    pub(super) fn new(devices: &[String]) -> Self {
        IoErrorWatch { devices: devices.to_vec(), previous: HashMap::new() }
    }

    /// `disk_io_errors` of every watched device, with its metric; a device whose counter cannot
    /// be read is `unknown`.
    pub(super) fn observe(&mut self, sysfs: &Path, out: &mut Observation) {
        let block = sysfs.join("block");
        let devices = if self.devices.is_empty() {
            match list_devices(&block) {
                Ok(devices) => devices,
                // No block directory: no block devices to watch (absent, not failed).
                Err(err) if err.kind() == io::ErrorKind::NotFound => return,
                Err(err) => {
                    out.findings.push(Finding::new(
                        NAME,
                        findings::IO_ERRORS,
                        "",
                        Status::Unknown,
                        RecommendedAction::None,
                        format!("listing {}: {}", block.display(), errno_text(&err)),
                    ));
                    return;
                }
            }
        } else {
            self.devices.clone()
        };
        let explicit = !self.devices.is_empty();
        for device in devices {
            let path = block.join(&device).join("device").join("ioerr_cnt");
            let text = match fs::read_to_string(&path) {
                Ok(text) => text,
                // Only SCSI-like devices count errors here; others are skipped unless named.
                Err(err) if err.kind() == io::ErrorKind::NotFound && !explicit => continue,
                Err(err) => {
                    out.findings.push(Finding::new(
                        NAME,
                        findings::IO_ERRORS,
                        device.as_str(),
                        Status::Unknown,
                        RecommendedAction::None,
                        format!("reading {}: {}", path.display(), errno_text(&err)),
                    ));
                    continue;
                }
            };
            let Some(count) = parse_hex_count(&text) else {
                out.findings.push(Finding::new(
                    NAME,
                    findings::IO_ERRORS,
                    device.as_str(),
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("{} holds {:?}, not a hex count", path.display(), text.trim()),
                ));
                continue;
            };
            out.samples.push(Sample::new(&DISK_IO_ERRORS, count as f64).label("device", &device));
            // A count lower than before means the device was reset or replaced: a new baseline.
            let previous = self.previous.insert(device.clone(), count);
            let finding = match previous {
                Some(previous) if count > previous => Finding::new(
                    NAME,
                    findings::IO_ERRORS,
                    device.as_str(),
                    Status::Warn,
                    RecommendedAction::None,
                    format!(
                        "{} new I/O errors since the last run ({count} in all)",
                        count - previous
                    ),
                )
                .with_value((count - previous) as f64),
                _ => Finding::ok(NAME, findings::IO_ERRORS, device.as_str()).with_value(0.0),
            };
            out.findings.push(finding);
        }
    }
}

/// Every block device under `block` except virtual ones, sorted.
fn list_devices(block: &Path) -> Result<Vec<String>, io::Error> {
    let mut devices = Vec::new();
    for entry in fs::read_dir(block)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !VIRTUAL_DEVICE_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
            devices.push(name);
        }
    }
    devices.sort();
    Ok(devices)
}

/// Parses `ioerr_cnt`: hex with a `0x` prefix (`0x1a`), or without one.
fn parse_hex_count(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    u64::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_counts() {
        assert_eq!(parse_hex_count("0x1a\n"), Some(26));
        assert_eq!(parse_hex_count("ff"), Some(255));
        assert_eq!(parse_hex_count("0x"), None);
        assert_eq!(parse_hex_count("zz"), None);
    }
}
