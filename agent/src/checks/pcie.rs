//! The pcie check: how the PCIe links of GPUs and NICs trained, from `{sysfs}/bus/pci/devices`.
//!
//! A link that trained narrower or slower than it can is a silent fault: the kernel logs nothing
//! and jobs only run slower (a x8 GPU link halves host-to-device bandwidth; a Gen3 link caps a
//! 400 Gb/s NIC near 100 Gb/s).
//!
//! Looked at: NVIDIA GPUs (vendor `0x10de`, class `0x0300xx` VGA or `0x0302xx` 3D controller) and
//! NICs (class `0x0200xx` Ethernet or `0x0207xx` InfiniBand) of the vendors in `nic_vendors`.
//! Virtual functions (with a `physfn` link) and conventional PCI devices (none of the
//! `*_link_*` files, e.g. a virtio NIC) are skipped: they have no link of their own. Every other
//! device on the bus is ignored, and a node without `bus/pci/devices` reports nothing.
//!
//! A link's maximum is the lower of the device's own (`max_link_width`, `max_link_speed`) and its
//! port's: the parent directory of the device's real sysfs path, when that has `max_link_*` files.
//! A x16 card in a x8 slot, or a Gen5 card in a Gen4 slot, is not a fault.
//!
//! Findings (subject = PCI address, `0000:3b:00.0`; labels `kind` (`gpu`, `nic`), `current_width`,
//! `max_width`, `current_speed`, `max_speed` (GT/s; the maxima are the link's, port included), and
//! `netdev` / `ib_device` for a NIC that has one):
//! - `pcie_width`: trained narrower than its maximum → `warn` until seen on `debounce` runs in a
//!   row (links retrain by themselves), then `fail`, `reboot`: a boot retrains the link, and a link
//!   that comes up narrow again points at the riser, slot or card, which the repairer's ladder
//!   takes from there.
//! - `pcie_speed`: trained slower than its maximum. NICs: debounced as above, then `fail`,
//!   `reboot`, for the same reasons. GPUs: an idle NVIDIA GPU drops its link to Gen1 to save
//!   power, so its speed says nothing by default (`gpu_speed = "ignore"`: ok, the speeds in the
//!   message); with `gpu_speed = "judge"` a slower link is `warn`, `none` (for GPUs kept busy).
//! - `pcie_unreadable`: a link file of the device or its port that is missing or holds garbage
//!   (or a `class`/`vendor` that does not parse) → `unknown`, naming the file; the width or speed
//!   that needed it is `unknown` too. Subject `""` when `bus/pci/devices` cannot be listed.
//!
//! The kernel writes a speed it cannot name as `Unknown` (a link that is down, or a generation
//! newer than the kernel): such a speed is not judged (`unknown`), and a port whose maximum is
//! `Unknown` does not lower the device's.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use serde::Deserialize;

use super::nic::{Attr, Unusable, attr, list_dirs, unreadable_finding};
use super::{BuildContext, Check, Observation, RunContext};
use crate::config::{ConfigProblems, Schedule};
use crate::metrics::{self, Sample};

pub const NAME: &str = "pcie";

/// NVIDIA's PCI vendor id.
const NVIDIA: u32 = 0x10de;

/// How the link speed of a GPU is judged (`gpu_speed`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuSpeed {
    /// Reported, never judged: idle GPUs lower their link speed to save power.
    #[default]
    Ignore,
    /// A GPU link slower than its maximum warns.
    Judge,
}

/// Settings of the pcie check (`[checks.pcie]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PcieConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// PCI vendor ids of the NICs looked at (`0x15b3`: Mellanox/NVIDIA networking); `"*"` looks at
    /// the NICs of every vendor, an empty list at none. GPUs are NVIDIA's (`0x10de`) always.
    pub nic_vendors: Vec<String>,
    /// `ignore` (default) or `judge` the link speed of GPUs.
    pub gpu_speed: GpuSpeed,
    /// Runs in a row a link must be seen degraded before it fails; it warns before.
    pub debounce: u32,
}

impl Default for PcieConfig {
    fn default() -> Self {
        PcieConfig {
            enabled: true,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            nic_vendors: vec!["0x15b3".to_owned()],
            gpu_speed: GpuSpeed::Ignore,
            debounce: 2,
        }
    }
}

impl PcieConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
        for (i, vendor) in self.nic_vendors.iter().enumerate() {
            if vendor != "*" && parse_vendor(vendor).is_none() {
                problems.push(
                    format!("{section}.nic_vendors[{i}]"),
                    format!("{vendor:?} is neither a PCI vendor id (0x15b3) nor \"*\""),
                );
            }
        }
        if self.debounce == 0 {
            problems.push(format!("{section}.debounce"), "must be at least 1");
        }
    }

    /// The NIC vendors to look at; `None` for every vendor. Entries that do not parse were
    /// reported by `validate`.
    fn vendors(&self) -> Option<BTreeSet<u32>> {
        if self.nic_vendors.iter().any(|v| v == "*") {
            return None;
        }
        Some(self.nic_vendors.iter().filter_map(|v| parse_vendor(v)).collect())
    }
}

/// A vendor id as written in config: `0x15b3` (or `15b3`).
fn parse_vendor(text: &str) -> Option<u32> {
    let hex = text.strip_prefix("0x").unwrap_or(text);
    (!hex.is_empty() && hex.len() <= 4).then(|| u32::from_str_radix(hex, 16).ok()).flatten()
}

/// `0x030200` as sysfs writes `class` and `vendor`.
fn parse_hex(text: &str) -> Option<u32> {
    u32::from_str_radix(text.strip_prefix("0x")?, 16).ok()
}

/// A link width: `16`.
fn parse_width(text: &str) -> Option<u32> {
    text.parse().ok()
}

/// A link speed as sysfs writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Speed {
    /// GT/s per lane.
    Gts(f64),
    /// The kernel's `Unknown`: a link that is down, or a generation it cannot name.
    Unknown,
}

/// `32.0 GT/s PCIe`, `8 GT/s`, `2.5 GT/s`, `Unknown` (older kernels: `Unknown speed`).
fn parse_speed(text: &str) -> Option<Speed> {
    if text == "Unknown" || text == "Unknown speed" {
        return Some(Speed::Unknown);
    }
    let mut words = text.split_whitespace();
    let number: f64 = words.next()?.parse().ok()?;
    let unit_ok = words.next() == Some("GT/s");
    let rest_ok = matches!(words.next(), None | Some("PCIe")) && words.next().is_none();
    (unit_ok && rest_ok && number.is_finite() && number > 0.0).then_some(Speed::Gts(number))
}

/// `16` for 16.0, `2.5`; `unknown`.
fn speed_text(speed: Option<Speed>) -> String {
    match speed {
        Some(Speed::Gts(gts)) => gts.to_string(),
        Some(Speed::Unknown) | None => "unknown".to_owned(),
    }
}

/// What a device is to this check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gpu,
    Nic,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gpu => "gpu",
            Kind::Nic => "nic",
        }
    }
}

/// The two things a link trains to, for the debounce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Dimension {
    Width,
    Speed,
}

/// How one link trained, as read; `None` where a file was missing or garbage.
#[derive(Debug, Clone)]
struct LinkReading {
    width: Option<u32>,
    /// The lower of the device's and its port's maximum width.
    max_width: Option<u32>,
    /// The device's own maximum, when its port lowers it.
    card_max_width: Option<u32>,
    speed: Option<Speed>,
    max_speed: Option<Speed>,
    card_max_speed: Option<Speed>,
    /// The port above the device, when it has link files.
    port: Option<String>,
}

/// The link files of a PCIe device.
const LINK_FILES: [&str; 4] =
    ["current_link_width", "max_link_width", "current_link_speed", "max_link_speed"];

/// A file the device must have: missing counts as unusable, like garbage.
fn required<T>(
    unusable: &mut Unusable,
    dir: &Path,
    name: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Option<T> {
    match attr(dir, name, parse) {
        Attr::Value(value) => Some(value),
        Attr::Absent => {
            unusable.0.push(format!("{name}: missing"));
            None
        }
        Attr::Garbage(why) => {
            unusable.0.push(why);
            None
        }
    }
}

/// The lower of a device's maximum and its port's. `None` (not judged) when the device's is not
/// known or the port's is garbage; a port without the file does not lower it.
fn lower<T: Copy>(own: Option<T>, port: &Attr<T>, min: impl Fn(T, T) -> T) -> Option<T> {
    match port {
        Attr::Value(cap) => own.map(|own| min(own, *cap)),
        Attr::Absent => own,
        Attr::Garbage(_) => None,
    }
}

/// Reads the link of the device at `dir` (as listed in `bus/pci/devices`) and of its port.
fn read_link(dir: &Path, unusable: &mut Unusable) -> LinkReading {
    let width = required(unusable, dir, "current_link_width", parse_width);
    let card_width = required(unusable, dir, "max_link_width", parse_width);
    let speed = required(unusable, dir, "current_link_speed", parse_speed);
    let card_speed = required(unusable, dir, "max_link_speed", parse_speed);

    let (port, port_width, port_speed) = match std::fs::canonicalize(dir) {
        Ok(real) => match real.parent() {
            Some(parent)
                if ["max_link_width", "max_link_speed"].iter().any(|f| parent.join(f).exists()) =>
            {
                let name = parent.file_name().map(|n| n.to_string_lossy().into_owned());
                let port_width = attr(parent, "max_link_width", parse_width);
                let port_speed = match attr(parent, "max_link_speed", parse_speed) {
                    // The kernel cannot name it: it does not lower the device's.
                    Attr::Value(Speed::Unknown) => Attr::Absent,
                    other => other,
                };
                for why in [garbage(&port_width), garbage(&port_speed)].into_iter().flatten() {
                    unusable.0.push(format!("port {}: {why}", name.as_deref().unwrap_or("?")));
                }
                (name, port_width, port_speed)
            }
            _ => (None, Attr::Absent, Attr::Absent),
        },
        Err(err) => {
            unusable.0.push(format!("resolving the sysfs path: {err}"));
            (None, Attr::Garbage(String::new()), Attr::Garbage(String::new()))
        }
    };
    let max_width = lower(card_width, &port_width, u32::min);
    let max_speed = lower(card_speed, &port_speed, |own, cap| match (own, cap) {
        (Speed::Gts(own), Speed::Gts(cap)) => Speed::Gts(own.min(cap)),
        (Speed::Unknown, _) | (_, Speed::Unknown) => own,
    });
    LinkReading {
        width,
        max_width,
        card_max_width: card_width.filter(|&card| Some(card) != max_width),
        speed,
        max_speed,
        card_max_speed: card_speed.filter(|&card| Some(card) != max_speed),
        port,
    }
}

/// Why `attr` is garbage, when it is.
fn garbage<T>(attr: &Attr<T>) -> Option<&str> {
    match attr {
        Attr::Garbage(why) => Some(why),
        Attr::Value(_) | Attr::Absent => None,
    }
}

/// The name of the one directory in `dir` (a NIC's `net/` or `infiniband/`), the first when
/// there are more.
fn first_dir(dir: &Path) -> Option<String> {
    list_dirs(dir).ok()?.into_iter().next()
}

/// The pcie check.
#[derive(Debug)]
pub struct PcieCheck {
    config: PcieConfig,
    /// `None`: every vendor.
    nic_vendors: Option<BTreeSet<u32>>,
    /// Runs in a row a link was seen degraded, by (PCI address, dimension).
    degraded_runs: BTreeMap<(String, Dimension), u32>,
}

impl PcieCheck {
    pub fn new(config: &PcieConfig, _ctx: BuildContext<'_>) -> Self {
        PcieCheck {
            config: config.clone(),
            nic_vendors: config.vendors(),
            degraded_runs: BTreeMap::new(),
        }
    }

    /// What the device at `dir` is to this check; `None` for devices it ignores.
    fn kind(&self, class: u32, vendor: u32) -> Option<Kind> {
        match class >> 8 {
            0x0300 | 0x0302 if vendor == NVIDIA => Some(Kind::Gpu),
            0x0200 | 0x0207 if self.nic_vendors.as_ref().is_none_or(|v| v.contains(&vendor)) => {
                Some(Kind::Nic)
            }
            _ => None,
        }
    }

    /// Counts a degraded run of `key`; forgets it when healthy or not judged. Returns the runs in
    /// a row so far.
    fn debounce(&mut self, key: (String, Dimension), degraded: bool) -> u32 {
        if degraded {
            let runs = self.degraded_runs.entry(key).or_default();
            *runs = runs.saturating_add(1);
            *runs
        } else {
            self.degraded_runs.remove(&key);
            0
        }
    }

    /// Looks at one device; returns whether it was a device this check looks at.
    fn device(&mut self, dir: &Path, address: &str, out: &mut Observation) -> bool {
        let mut unusable = Unusable::default();
        let class = required(&mut unusable, dir, "class", parse_hex);
        let vendor = required(&mut unusable, dir, "vendor", parse_hex);
        let (Some(class), Some(vendor)) = (class, vendor) else {
            out.findings.push(unreadable_finding(NAME, "pcie_unreadable", address, dir, &unusable));
            return true;
        };
        let Some(kind) = self.kind(class, vendor) else { return false };
        // A virtual function has no link of its own; its physical function is looked at.
        if std::fs::symlink_metadata(dir.join("physfn")).is_ok() {
            return false;
        }
        // Conventional PCI (a virtio NIC in a VM): no link to judge. The kernel shows all four
        // files on every PCIe device, so only some of them missing is unusable.
        if !LINK_FILES.iter().any(|file| dir.join(file).exists()) {
            return false;
        }
        let link = read_link(dir, &mut unusable);
        let device = |desc: &'static metrics::MetricDesc, value: f64| {
            Sample::new(desc, value).label("device", address).label("kind", kind.as_str())
        };
        for (desc, value) in [
            (&metrics::PCIE_LINK_WIDTH, link.width.map(f64::from)),
            (&metrics::PCIE_LINK_WIDTH_MAX, link.max_width.map(f64::from)),
        ] {
            if let Some(value) = value {
                out.samples.push(device(desc, value));
            }
        }
        for (desc, speed) in [
            (&metrics::PCIE_LINK_SPEED, link.speed),
            (&metrics::PCIE_LINK_SPEED_MAX, link.max_speed),
        ] {
            if let Some(Speed::Gts(gts)) = speed {
                out.samples.push(device(desc, gts));
            }
        }

        let mut labels: Vec<(&str, String)> = vec![
            ("kind", kind.as_str().to_owned()),
            ("current_speed", speed_text(link.speed)),
            ("max_speed", speed_text(link.max_speed)),
        ];
        labels.extend(link.width.map(|w| ("current_width", w.to_string())));
        labels.extend(link.max_width.map(|w| ("max_width", w.to_string())));
        if kind == Kind::Nic {
            labels.extend(first_dir(&dir.join("net")).map(|name| ("netdev", name)));
            labels.extend(first_dir(&dir.join("infiniband")).map(|name| ("ib_device", name)));
        }
        let label = |finding: Finding| {
            labels.iter().fold(finding, |finding, (key, value)| finding.with_label(key, value))
        };

        let width = self.width_finding(address, &link);
        out.findings.push(label(width));
        let speed = self.speed_finding(address, kind, &link);
        out.findings.push(label(speed));
        out.findings.push(label(unreadable_finding(
            NAME,
            "pcie_unreadable",
            address,
            dir,
            &unusable,
        )));
        true
    }

    fn width_finding(&mut self, address: &str, link: &LinkReading) -> Finding {
        let (Some(width), Some(max)) = (link.width, link.max_width) else {
            self.debounce((address.to_owned(), Dimension::Width), false);
            return Finding::new(
                NAME,
                "pcie_width",
                address,
                Status::Unknown,
                RecommendedAction::None,
                "cannot judge the link width: see pcie_unreadable",
            );
        };
        let slot = match (link.card_max_width, &link.port) {
            (Some(card), Some(port)) => format!(" (the card can do x{card}, port {port} x{max})"),
            _ => String::new(),
        };
        let runs = self.debounce((address.to_owned(), Dimension::Width), width < max);
        let finding = if width >= max {
            Finding::new(
                NAME,
                "pcie_width",
                address,
                Status::Ok,
                RecommendedAction::None,
                format!("PCIe link x{width} of x{max}{slot}"),
            )
        } else {
            self.debounced(
                "pcie_width",
                address,
                runs,
                format!("PCIe link trained at x{width} of x{max}{slot}"),
            )
        };
        finding.with_value(f64::from(width))
    }

    fn speed_finding(&mut self, address: &str, kind: Kind, link: &LinkReading) -> Finding {
        let key = (address.to_owned(), Dimension::Speed);
        let text = |gts: Option<Speed>| match gts {
            Some(Speed::Gts(gts)) => format!("{gts} GT/s"),
            Some(Speed::Unknown) => "Unknown".to_owned(),
            None => "unreadable".to_owned(),
        };
        let slot = match (link.card_max_speed, &link.port) {
            (Some(card), Some(port)) => {
                format!(
                    " (the card can do {}, port {port} {})",
                    text(Some(card)),
                    text(link.max_speed)
                )
            }
            _ => String::new(),
        };
        let speeds = format!("{} of {}{slot}", text(link.speed), text(link.max_speed));
        let new = |status, action, message: String| {
            Finding::new(NAME, "pcie_speed", address, status, action, message)
        };
        if kind == Kind::Gpu && self.config.gpu_speed == GpuSpeed::Ignore {
            self.debounce(key, false);
            return new(
                Status::Ok,
                RecommendedAction::None,
                format!("PCIe link {speeds} (not judged: idle GPUs lower their link speed)"),
            );
        }
        let (Some(Speed::Gts(speed)), Some(Speed::Gts(max))) = (link.speed, link.max_speed) else {
            self.debounce(key, false);
            return new(
                Status::Unknown,
                RecommendedAction::None,
                format!("cannot judge the link speed: {speeds}"),
            );
        };
        let degraded = speed < max;
        let runs = self.debounce(key, degraded);
        let finding = if !degraded {
            new(Status::Ok, RecommendedAction::None, format!("PCIe link {speeds}"))
        } else if kind == Kind::Gpu {
            new(Status::Warn, RecommendedAction::None, format!("PCIe link trained at {speeds}"))
        } else {
            self.debounced("pcie_speed", address, runs, format!("PCIe link trained at {speeds}"))
        };
        finding.with_value(speed)
    }

    /// A degraded link seen on `runs` runs in a row: `warn` until `debounce`, then `fail`,
    /// `reboot`.
    fn debounced(&self, finding: &str, address: &str, runs: u32, what: String) -> Finding {
        let debounce = self.config.debounce.max(1);
        if runs >= debounce {
            Finding::new(
                NAME,
                finding,
                address,
                Status::Fail,
                RecommendedAction::Reboot,
                format!("{what}, on {runs} runs in a row: a reboot retrains it"),
            )
        } else {
            Finding::new(
                NAME,
                finding,
                address,
                Status::Warn,
                RecommendedAction::None,
                format!("{what}, on {runs} of {debounce} runs in a row: waiting for a retrain"),
            )
        }
    }
}

impl Check for PcieCheck {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&mut self, ctx: &RunContext<'_>) -> Observation {
        let mut out = Observation::default();
        let devices_dir: PathBuf = ctx.paths.sysfs.join("bus/pci/devices");
        let addresses = match list_dirs(&devices_dir) {
            Ok(addresses) => addresses,
            // No PCI bus (or no sysfs in a fixture): nothing to look at.
            Err(err) if err.kind() == io::ErrorKind::NotFound => BTreeSet::new(),
            Err(err) => {
                out.findings.push(Finding::new(
                    NAME,
                    "pcie_unreadable",
                    "",
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("cannot list {}: {err}", devices_dir.display()),
                ));
                return out;
            }
        };
        let mut looked_at = BTreeSet::new();
        for address in &addresses {
            if self.device(&devices_dir.join(address), address, &mut out) {
                looked_at.insert(address.clone());
            }
        }
        self.degraded_runs.retain(|(address, _), _| looked_at.contains(address));
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysfs_values() {
        assert_eq!(parse_speed("32.0 GT/s PCIe"), Some(Speed::Gts(32.0)));
        assert_eq!(parse_speed("16.0 GT/s PCIe"), Some(Speed::Gts(16.0)));
        assert_eq!(parse_speed("8 GT/s"), Some(Speed::Gts(8.0)));
        assert_eq!(parse_speed("5.0 GT/s"), Some(Speed::Gts(5.0)));
        assert_eq!(parse_speed("2.5 GT/s"), Some(Speed::Gts(2.5)));
        assert_eq!(parse_speed("Unknown"), Some(Speed::Unknown));
        assert_eq!(parse_speed("Unknown speed"), Some(Speed::Unknown));
        for garbage in ["", "fast", "16.0", "16.0 Gb/s", "-8 GT/s", "NaN GT/s", "8 GT/s PCIe x"] {
            assert_eq!(parse_speed(garbage), None, "{garbage:?}");
        }
        assert_eq!(parse_width("16"), Some(16));
        assert_eq!(parse_width("x16"), None);
        assert_eq!(parse_hex("0x030200"), Some(0x030200));
        assert_eq!(parse_hex("030200"), None);
        assert_eq!(parse_vendor("0x15b3"), Some(0x15b3));
        assert_eq!(parse_vendor("15B3"), Some(0x15b3));
        assert_eq!(parse_vendor("0x15b3f"), None);
        assert_eq!(parse_vendor("mellanox"), None);
        assert_eq!(speed_text(Some(Speed::Gts(16.0))), "16");
        assert_eq!(speed_text(Some(Speed::Gts(2.5))), "2.5");
    }

    #[test]
    fn classes_and_vendors_pick_gpus_and_nics() {
        let ctx_paths = crate::config::HostPaths::default();
        let ctx = BuildContext {
            paths: &ctx_paths,
            node: "n",
            mode: super::super::Mode::Once,
            events: super::super::EventSignal::default(),
        };
        let check = PcieCheck::new(&PcieConfig::default(), ctx.clone());
        assert_eq!(check.kind(0x030200, 0x10de), Some(Kind::Gpu));
        assert_eq!(check.kind(0x030000, 0x10de), Some(Kind::Gpu));
        assert_eq!(check.kind(0x030000, 0x1002), None, "not NVIDIA's");
        assert_eq!(check.kind(0x020700, 0x15b3), Some(Kind::Nic));
        assert_eq!(check.kind(0x020000, 0x15b3), Some(Kind::Nic));
        assert_eq!(check.kind(0x020000, 0x8086), None, "not in nic_vendors");
        assert_eq!(check.kind(0x010802, 0x144d), None, "NVMe");
        assert_eq!(check.kind(0x068000, 0x10de), None, "NVSwitch");
        let all = PcieConfig { nic_vendors: vec!["*".into()], ..PcieConfig::default() };
        assert_eq!(PcieCheck::new(&all, ctx).kind(0x020000, 0x8086), Some(Kind::Nic));
    }

    #[test]
    fn config_problems_name_fields() {
        let config = PcieConfig {
            nic_vendors: vec!["0x15b3".into(), "mlx".into()],
            debounce: 0,
            interval: Duration::ZERO,
            ..PcieConfig::default()
        };
        let mut problems = ConfigProblems::default();
        config.validate("checks.pcie", &mut problems);
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        for field in ["checks.pcie.interval", "checks.pcie.nic_vendors[1]", "checks.pcie.debounce"]
        {
            assert!(fields.contains(&field), "{field} not in {fields:?}");
        }
        let mut problems = ConfigProblems::default();
        PcieConfig::default().validate("checks.pcie", &mut problems);
        assert!(problems.is_empty(), "{problems}");
    }
}
