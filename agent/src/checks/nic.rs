//! The nic check: Ethernet interfaces from `{sysfs}/class/net` and InfiniBand/EFA ports from
//! `{sysfs}/class/infiniband`.
//!
//! Per interface: link state, speed, MTU, carrier flaps within a window and error/drop rates; per
//! IB port: state, physical state, rate and `link_downed` flaps. Flaps and rates need history, so
//! the check keeps a few previous counter samples per subject (bounded; forgotten when the subject
//! disappears).
//!
//! A value the kernel does not report (speed of a link that is down, `carrier` of an interface that
//! is administratively down, counters a driver lacks) is absent, not an error. A file that is there
//! but holds nothing usable (empty, `abc`) is also absent, and named by an `unknown` finding
//! (`nic_unreadable` / `ib_unreadable`); the rest of the subject is still reported.
//!
//! Findings per interface (subject = its name): `nic_down`, `nic_missing` (required and down or
//! absent: `fail`, `drain`), `nic_speed`, `nic_mtu`, `nic_flapping`, `nic_errors` (`warn`),
//! `nic_unreadable`. Per IB port (subject = `device/port`): `ib_port_down`, `ib_port_missing`
//! (required and not ACTIVE/LinkUp or absent: `fail`, `drain`), `ib_flapping` (`warn`),
//! `ib_unreadable`, and three judged by how the port's error counters move, never by their value
//! (a port that went down once a month ago carries that count until the driver reloads; a counter
//! that went down was reset and is a new baseline, not a rate):
//! - `ib_link_downed`: `link_downed` rose since the previous read → `warn`, action `none`, for
//!   `ib_link_downed_window` after the last rise, then ok. The port came back by itself (else
//!   `ib_port_down` says so), but every drop kills the collectives of the jobs across it; whether
//!   that is worth a repair is the repairer's policy (`ib_flapping` counts the drops).
//! - `ib_symbol_errors`: more `symbol_error`s within the last hour than
//!   `ib_symbol_errors_warn_per_hour` → `warn`, `none`: a cable or transceiver going bad, which
//!   neither a reboot nor a reset fixes; a person swaps it.
//! - `ib_receive_errors`: `port_rcv_errors` per second between two reads above
//!   `ib_receive_errors_warn_per_second` → `warn`, `none`, for the same reason.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};
use regex::Regex;
use serde::Deserialize;

use super::{BuildContext, Check, Observation, RunContext};
use crate::config::{ConfigProblems, Schedule};
use crate::metrics::{self, Sample};

pub const NAME: &str = "nic";

/// Interfaces that are not physical links a job depends on: loopback, containers, bridges, CNI
/// plugins.
pub const DEFAULT_IGNORE: &str = r"^(lo|docker.*|veth.*|br-.*|virbr.*|cni.*|flannel.*|cali.*)$";

/// Most sysfs bytes read from one file; attribute files are a line at most.
const MAX_ATTR_BYTES: u64 = 4096;

/// Most counter change points kept per subject for counting within a window (flaps, symbol
/// errors). Each kept point is a change of at least one, so when the cap is hit the count in the
/// window is far above any sane threshold.
const MAX_FLAP_SAMPLES: usize = 256;

/// Shortest time between two samples for a rate: runs triggered close together would otherwise
/// make rates out of noise.
const MIN_RATE_SPAN: Duration = Duration::from_secs(1);

/// Settings of the nic check (`[checks.nic]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NicConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Interfaces that must exist and be up (e.g. `["eth0", "ib0"]`); missing or down → fail.
    /// Looked at even when `ignore` matches them.
    pub required: Vec<String>,
    /// Regex of interface names never looked at (unless required). Empty: look at every interface.
    pub ignore: String,
    /// Expected link speed per interface in Mb/s (e.g. `{ eth0 = 100000 }`); another speed → warn.
    pub expected_speed_mbps: BTreeMap<String, u64>,
    /// Expected MTU per interface in bytes (e.g. `{ eth0 = 9000 }`); another MTU → warn.
    pub expected_mtu: BTreeMap<String, u64>,
    /// Window for counting carrier changes (link flaps) of an interface.
    #[serde(with = "humantime_serde")]
    pub flap_window: Duration,
    /// Carrier changes within `flap_window` at which an interface is flapping (warn).
    pub flap_max: u64,
    /// Receive or transmit errors per second above which an interface warns.
    pub max_errors_per_second: f64,
    /// Receive or transmit drops per second above which an interface warns. Higher than for
    /// errors: many NICs count frames of protocols nobody listens to as dropped.
    pub max_drops_per_second: f64,
    /// InfiniBand/EFA ports that must be ACTIVE and LinkUp: a device (`mlx5_0`: all its ports) or
    /// `device/port` (`mlx5_0/1`). Empty: every port found must be up.
    pub required_ib: Vec<String>,
    /// Window for counting `link_downed` increases of an IB port.
    #[serde(with = "humantime_serde")]
    pub ib_flap_window: Duration,
    /// `link_downed` increases within `ib_flap_window` at which a port is flapping (warn).
    pub ib_flap_max: u64,
    /// How long `ib_link_downed` keeps warning after `link_downed` last rose.
    #[serde(with = "humantime_serde")]
    pub ib_link_downed_window: Duration,
    /// Symbol errors of an IB port within the last hour above which it warns (`ib_symbol_errors`).
    /// A few a day are normal on long copper or optical links; a steady stream is a cable or
    /// transceiver going bad.
    pub ib_symbol_errors_warn_per_hour: f64,
    /// Receive errors (`port_rcv_errors`) per second of an IB port above which it warns
    /// (`ib_receive_errors`).
    pub ib_receive_errors_warn_per_second: f64,
}

impl Default for NicConfig {
    fn default() -> Self {
        NicConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            required: Vec::new(),
            ignore: DEFAULT_IGNORE.to_owned(),
            expected_speed_mbps: BTreeMap::new(),
            expected_mtu: BTreeMap::new(),
            flap_window: Duration::from_secs(24 * 3600),
            flap_max: 5,
            max_errors_per_second: 1.0,
            max_drops_per_second: 100.0,
            required_ib: Vec::new(),
            ib_flap_window: Duration::from_secs(3 * 3600),
            ib_flap_max: 3,
            ib_link_downed_window: Duration::from_secs(15 * 60),
            ib_symbol_errors_warn_per_hour: 10.0,
            ib_receive_errors_warn_per_second: 1.0,
        }
    }
}

impl NicConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
        for (i, name) in self.required.iter().enumerate() {
            if !is_interface_name(name) {
                problems.push(
                    format!("{section}.required[{i}]"),
                    format!("{name:?} is not an interface name"),
                );
            }
        }
        if let Err(err) = Regex::new(&self.ignore) {
            let text = err.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
            problems.push(format!("{section}.ignore"), format!("not a valid regex: {text}"));
        }
        for (name, speed) in &self.expected_speed_mbps {
            if !is_interface_name(name) || *speed == 0 {
                problems.push(
                    format!("{section}.expected_speed_mbps.{name}"),
                    "must name an interface and a speed above zero",
                );
            }
        }
        for (name, mtu) in &self.expected_mtu {
            if !is_interface_name(name) || !(68..=1 << 20).contains(mtu) {
                problems.push(
                    format!("{section}.expected_mtu.{name}"),
                    "must name an interface and an MTU from 68 up",
                );
            }
        }
        for (field, window) in [
            ("flap_window", self.flap_window),
            ("ib_flap_window", self.ib_flap_window),
            ("ib_link_downed_window", self.ib_link_downed_window),
        ] {
            if window.is_zero() {
                problems.push(format!("{section}.{field}"), "must be greater than zero");
            }
        }
        for (field, max) in [("flap_max", self.flap_max), ("ib_flap_max", self.ib_flap_max)] {
            if max == 0 {
                problems.push(format!("{section}.{field}"), "must be at least 1");
            }
        }
        for (field, rate) in [
            ("max_errors_per_second", self.max_errors_per_second),
            ("max_drops_per_second", self.max_drops_per_second),
            ("ib_symbol_errors_warn_per_hour", self.ib_symbol_errors_warn_per_hour),
            ("ib_receive_errors_warn_per_second", self.ib_receive_errors_warn_per_second),
        ] {
            if !rate.is_finite() || rate < 0.0 {
                problems.push(format!("{section}.{field}"), "must be a number of zero or more");
            }
        }
        for (i, entry) in self.required_ib.iter().enumerate() {
            if parse_ib_requirement(entry).is_none() {
                problems.push(
                    format!("{section}.required_ib[{i}]"),
                    format!("{entry:?} is neither a device (mlx5_0) nor device/port (mlx5_0/1)"),
                );
            }
        }
    }
}

/// A name the kernel could give an interface: no path separators, no white space.
fn is_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && !name.chars().any(|c| c == '/' || c.is_whitespace() || c.is_control())
}

/// `mlx5_0` → (`mlx5_0`, None); `mlx5_0/1` → (`mlx5_0`, Some(1)).
fn parse_ib_requirement(entry: &str) -> Option<(&str, Option<u32>)> {
    match entry.split_once('/') {
        None => is_interface_name(entry).then_some((entry, None)),
        Some((device, port)) => {
            let port = port.parse::<u32>().ok()?;
            is_interface_name(device).then_some((device, Some(port)))
        }
    }
}

/// One sysfs attribute as read (the pcie check reads its files the same way).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Attr<T> {
    Value(T),
    /// Not there, or not reported in the current state (e.g. speed of a down link).
    Absent,
    /// There but unusable: the file name and why.
    Garbage(String),
}

/// The files of one subject that held garbage, as their values are taken.
#[derive(Debug, Default)]
pub(super) struct Unusable(pub(super) Vec<String>);

impl Unusable {
    /// The value of `attr`, noting garbage; `dir` prefixes the file name (`statistics/`).
    pub(super) fn take<T>(&mut self, attr: Attr<T>, dir: &str) -> Option<T> {
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
pub(super) fn attr<T>(dir: &Path, name: &str, parse: impl Fn(&str) -> Option<T>) -> Attr<T> {
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

fn parse_u64(text: &str) -> Option<u64> {
    text.parse().ok()
}

/// `speed` in Mb/s; `None` (absent) for the `-1` and `u32::MAX` of a link that is down.
fn parse_speed(text: &str) -> Option<Option<u64>> {
    let speed: i64 = text.parse().ok()?;
    Some((speed > 0 && speed != i64::from(u32::MAX)).then_some(speed as u64))
}

fn parse_carrier(text: &str) -> Option<bool> {
    match text {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// `operstate` as the kernel writes it (RFC 2863 names).
fn parse_operstate(text: &str) -> Option<String> {
    const STATES: [&str; 7] =
        ["up", "down", "dormant", "lowerlayerdown", "notpresent", "testing", "unknown"];
    STATES.contains(&text).then(|| text.to_owned())
}

/// `4: ACTIVE`, `5: LinkUp`: the number (known names without a number are accepted too).
fn parse_ib_state(text: &str, names: &[(u32, &str)]) -> Option<u32> {
    match text.split_once(':') {
        Some((number, _)) => number.trim().parse().ok(),
        None => names.iter().find(|(_, name)| name.eq_ignore_ascii_case(text)).map(|(n, _)| *n),
    }
}

const IB_STATES: [(u32, &str); 5] =
    [(1, "DOWN"), (2, "INIT"), (3, "ARMED"), (4, "ACTIVE"), (5, "ACTIVE_DEFER")];
const IB_PHYS_STATES: [(u32, &str); 7] = [
    (1, "Sleep"),
    (2, "Polling"),
    (3, "Disabled"),
    (4, "PortConfigurationTraining"),
    (5, "LinkUp"),
    (6, "LinkErrorRecovery"),
    (7, "PhyTest"),
];
const IB_ACTIVE: u32 = 4;
const IB_LINK_UP: u32 = 5;

/// `400 Gb/sec (4X NDR)` in bytes per second.
fn parse_ib_rate(text: &str) -> Option<f64> {
    let mut words = text.split_whitespace();
    let number: f64 = words.next()?.parse().ok()?;
    let per_bit = match words.next()? {
        "Gb/sec" | "Gb/s" => 1e9,
        "Mb/sec" | "Mb/s" => 1e6,
        _ => return None,
    };
    (number.is_finite() && number >= 0.0).then_some(number * per_bit / 8.0)
}

/// Change points of a cumulative counter, for "how much did it grow within the window".
#[derive(Debug, Clone, Default)]
struct CounterHistory {
    /// (time first seen at this value, value), oldest first; the first is the baseline.
    points: VecDeque<(SystemTime, u64)>,
}

impl CounterHistory {
    /// Records `value` at `now` and returns its growth within `window` (since the agent first saw
    /// it, when that is later). A counter that went down was reset: it starts again from there.
    fn observe(&mut self, now: SystemTime, value: u64, window: Duration) -> u64 {
        if self.points.back().is_some_and(|(_, last)| value < *last) {
            self.points.clear();
        }
        if self.points.back().map(|(_, last)| *last) != Some(value) {
            self.points.push_back((now, value));
        }
        if let Some(cutoff) = now.checked_sub(window) {
            // Keep the newest point at or before the cutoff: the value when the window began.
            while self.points.len() >= 2 && self.points[1].0 <= cutoff {
                self.points.pop_front();
            }
        }
        while self.points.len() > MAX_FLAP_SAMPLES {
            self.points.pop_front();
        }
        self.points.front().map_or(0, |(_, base)| value.saturating_sub(*base))
    }
}

/// Per-second rate of a cumulative counter between runs.
#[derive(Debug, Clone, Default)]
struct CounterRate {
    previous: Option<(SystemTime, u64)>,
    rate: Option<f64>,
}

impl CounterRate {
    fn observe(&mut self, now: SystemTime, value: u64) -> Option<f64> {
        match self.previous {
            Some((then, before)) => match now.duration_since(then) {
                Ok(span) if span >= MIN_RATE_SPAN => {
                    // A counter that went down was reset; no rate until the next sample.
                    self.rate =
                        (value >= before).then(|| (value - before) as f64 / span.as_secs_f64());
                    self.previous = Some((now, value));
                }
                // Too soon: keep the last rate and the older sample.
                Ok(_) => {}
                // The clock went back: start again.
                Err(_) => {
                    self.rate = None;
                    self.previous = Some((now, value));
                }
            },
            None => self.previous = Some((now, value)),
        }
        self.rate
    }
}

/// The history kept for one interface.
#[derive(Debug, Clone, Default)]
struct InterfaceHistory {
    carrier_changes: CounterHistory,
    /// rx_errors, tx_errors, rx_dropped, tx_dropped.
    rates: [CounterRate; 4],
}

/// The history kept for one InfiniBand port.
#[derive(Debug, Clone, Default)]
struct IbPortHistory {
    /// `link_downed` change points, for `ib_flapping`.
    link_downed_flaps: CounterHistory,
    /// `link_downed` at the previous read and its latest rise, for `ib_link_downed`.
    link_downed: CounterRise,
    /// `symbol_error` change points within [`SYMBOL_ERROR_WINDOW`].
    symbol_errors: CounterHistory,
    /// `port_rcv_errors`.
    receive_errors: CounterRate,
}

/// The window `ib_symbol_errors_warn_per_hour` counts in.
const SYMBOL_ERROR_WINDOW: Duration = Duration::from_secs(3600);

/// A cumulative counter's previous reading and its latest rise.
#[derive(Debug, Clone, Default)]
struct CounterRise {
    previous: Option<u64>,
    /// When it last rose, and by how much.
    latest: Option<(SystemTime, u64)>,
}

impl CounterRise {
    /// Takes a reading and returns the rise since the previous one: zero on the first reading
    /// (what happened before the agent looked is the baseline) and when the counter went down (it
    /// was reset: the new value is the baseline).
    fn observe(&mut self, now: SystemTime, value: u64) -> u64 {
        let rise = self.previous.map_or(0, |before| value.saturating_sub(before));
        self.previous = Some(value);
        if rise > 0 {
            self.latest = Some((now, rise));
        }
        rise
    }

    /// The latest rise and its age, when it is younger than `window`. A clock that went back
    /// counts as "just now".
    fn within(&self, now: SystemTime, window: Duration) -> Option<(u64, Duration)> {
        let (at, rise) = self.latest?;
        match now.duration_since(at) {
            Ok(age) if age < window => Some((rise, age)),
            Ok(_) => None,
            Err(_) => Some((rise, Duration::ZERO)),
        }
    }
}

/// The statistics counters, in [`InterfaceHistory::rates`] order: (file, metric, direction).
const STATISTICS: [(&str, bool, &str); 4] = [
    ("rx_errors", true, "rx"),
    ("tx_errors", true, "tx"),
    ("rx_dropped", false, "rx"),
    ("tx_dropped", false, "tx"),
];

/// The nic check.
#[derive(Debug)]
pub struct NicCheck {
    config: NicConfig,
    /// `None` with an empty `ignore`, or (after validation, not expected) a pattern that did not
    /// compile, reported as `nic_config`.
    ignore: Option<Regex>,
    ignore_error: Option<String>,
    /// Required IB ports: (device, port or every port), from `required_ib`.
    required_ib: Vec<(String, Option<u32>)>,
    interfaces: BTreeMap<String, InterfaceHistory>,
    ib_ports: BTreeMap<(String, u32), IbPortHistory>,
}

impl NicCheck {
    pub fn new(config: &NicConfig, _ctx: BuildContext<'_>) -> Self {
        let (ignore, ignore_error) = if config.ignore.is_empty() {
            (None, None)
        } else {
            match Regex::new(&config.ignore) {
                Ok(regex) => (Some(regex), None),
                Err(err) => (None, Some(err.to_string())),
            }
        };
        let required_ib = config
            .required_ib
            .iter()
            .filter_map(|entry| parse_ib_requirement(entry))
            .map(|(device, port)| (device.to_owned(), port))
            .collect();
        NicCheck {
            config: config.clone(),
            ignore,
            ignore_error,
            required_ib,
            interfaces: BTreeMap::new(),
            ib_ports: BTreeMap::new(),
        }
    }

    fn ignored(&self, name: &str) -> bool {
        self.ignore.as_ref().is_some_and(|regex| regex.is_match(name))
    }

    fn run_interfaces(&mut self, sysfs: &Path, now: SystemTime, out: &mut Observation) {
        let class = sysfs.join("class/net");
        let listed = match list_dirs(&class) {
            Ok(names) => names,
            Err(err) => {
                out.findings.push(Finding::new(
                    NAME,
                    "nic_unreadable",
                    "",
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("cannot list {}: {err}", class.display()),
                ));
                // Without a listing, "missing" cannot be told from "unreadable".
                return;
            }
        };
        let required: BTreeSet<&str> = self.config.required.iter().map(String::as_str).collect();
        for name in &required {
            if !listed.contains(*name) {
                out.findings.push(Finding::new(
                    NAME,
                    "nic_missing",
                    *name,
                    Status::Fail,
                    RecommendedAction::Drain,
                    format!("required interface {name} does not exist"),
                ));
            }
        }
        let looked_at: Vec<String> = listed
            .into_iter()
            .filter(|name| required.contains(name.as_str()) || !self.ignored(name))
            .collect();
        self.interfaces.retain(|name, _| looked_at.contains(name));
        for name in looked_at {
            let is_required = required.contains(name.as_str());
            let history = self.interfaces.entry(name.clone()).or_default();
            interface(&self.config, &class.join(&name), &name, is_required, history, now, out);
        }
    }

    fn run_infiniband(&mut self, sysfs: &Path, now: SystemTime, out: &mut Observation) {
        let class = sysfs.join("class/infiniband");
        let devices = match list_dirs(&class) {
            Ok(devices) => devices,
            // No IB/EFA hardware (or no driver): nothing to look at, not a fault, unless some
            // port is required, which the loop below reports as missing.
            Err(err) if err.kind() == io::ErrorKind::NotFound => BTreeSet::new(),
            Err(err) => {
                out.findings.push(Finding::new(
                    NAME,
                    "ib_unreadable",
                    "",
                    Status::Unknown,
                    RecommendedAction::None,
                    format!("cannot list {}: {err}", class.display()),
                ));
                return;
            }
        };
        let mut seen_ports: Vec<(String, u32)> = Vec::new();
        for device in &devices {
            let ports_dir = class.join(device).join("ports");
            let ports = match list_dirs(&ports_dir) {
                Ok(ports) => ports,
                Err(err) => {
                    out.findings.push(Finding::new(
                        NAME,
                        "ib_unreadable",
                        device.clone(),
                        Status::Unknown,
                        RecommendedAction::None,
                        format!("cannot list {}: {err}", ports_dir.display()),
                    ));
                    continue;
                }
            };
            for port in ports.iter().filter_map(|p| p.parse::<u32>().ok()) {
                let required = self.required_ib.is_empty()
                    || self
                        .required_ib
                        .iter()
                        .any(|(d, p)| d == device && p.is_none_or(|p| p == port));
                let history = self.ib_ports.entry((device.clone(), port)).or_default();
                ib_port(
                    &self.config,
                    &ports_dir.join(port.to_string()),
                    device,
                    port,
                    required,
                    history,
                    now,
                    out,
                );
                seen_ports.push((device.clone(), port));
            }
        }
        self.ib_ports.retain(|key, _| seen_ports.contains(key));
        for (device, port) in &self.required_ib {
            let present =
                seen_ports.iter().any(|(d, p)| d == device && port.is_none_or(|port| port == *p));
            if !present {
                let subject = match port {
                    Some(port) => format!("{device}/{port}"),
                    None => device.clone(),
                };
                out.findings.push(Finding::new(
                    NAME,
                    "ib_port_missing",
                    subject.clone(),
                    Status::Fail,
                    RecommendedAction::Drain,
                    format!("required InfiniBand port {subject} does not exist"),
                ));
            }
        }
    }
}

/// The names of the directories in `dir` (entries that are links to directories count, as in
/// sysfs; plain files such as `bonding_masters` do not).
pub(super) fn list_dirs(dir: &Path) -> io::Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.path().is_dir() {
            names.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(names)
}

/// Whether the link is up, from `operstate` and `carrier`; `None` when they do not tell.
fn link_up(operstate: Option<&str>, carrier: Option<bool>) -> Option<bool> {
    match operstate {
        Some("up") => Some(carrier != Some(false)),
        // Drivers that do not track operational state (loopback, tun, some virtual links) say
        // "unknown"; the carrier decides.
        Some("unknown") | None => carrier,
        Some(_) => Some(false),
    }
}

/// Looks at one interface.
///
/// A required interface that is down fails with `drain`: a down link is nearly always a cable,
/// transceiver or switch-port fault outside the node, which a reboot does not fix, while the node
/// cannot do its part of a multi-node job; stop scheduling on it and let a person or a later rule
/// decide. Flapping, a wrong speed or MTU and error rates warn with no action: the node works,
/// only slower or less reliably, and the repairer's policy may escalate repeated warnings.
fn interface(
    config: &NicConfig,
    dir: &Path,
    name: &str,
    required: bool,
    history: &mut InterfaceHistory,
    now: SystemTime,
    out: &mut Observation,
) {
    let mut unusable = Unusable::default();
    let operstate = unusable.take(attr(dir, "operstate", parse_operstate), "");
    let carrier = unusable.take(attr(dir, "carrier", parse_carrier), "");
    let carrier_changes = unusable.take(attr(dir, "carrier_changes", parse_u64), "");
    let speed = unusable.take(attr(dir, "speed", parse_speed), "").flatten();
    let mtu = unusable.take(attr(dir, "mtu", parse_u64), "");
    let stats_dir = dir.join("statistics");
    let stats: Vec<Option<u64>> = STATISTICS
        .iter()
        .map(|(file, _, _)| unusable.take(attr(&stats_dir, file, parse_u64), "statistics/"))
        .collect();

    let device = |sample: Sample| sample.label("device", name);
    let up = link_up(operstate.as_deref(), carrier);
    if let Some(up) = up {
        out.samples.push(device(Sample::new(&metrics::NIC_UP, f64::from(u8::from(up)))));
    }
    if let Some(changes) = carrier_changes {
        out.samples.push(device(Sample::new(&metrics::NIC_CARRIER_CHANGES, changes as f64)));
    }
    if let Some(speed) = speed {
        // Mb/s to bytes/s.
        out.samples.push(device(Sample::new(&metrics::NIC_SPEED, speed as f64 * 125_000.0)));
    }
    if let Some(mtu) = mtu {
        out.samples.push(device(Sample::new(&metrics::NIC_MTU, mtu as f64)));
    }

    let state_text = format!(
        "operstate={} carrier={}",
        operstate.as_deref().unwrap_or("?"),
        carrier.map_or("?", |c| if c { "1" } else { "0" })
    );
    out.findings.push(match (up, required) {
        (Some(true), _) => Finding::new(
            NAME,
            "nic_down",
            name,
            Status::Ok,
            RecommendedAction::None,
            format!("{name} is up ({state_text})"),
        ),
        (Some(false), true) => Finding::new(
            NAME,
            "nic_down",
            name,
            Status::Fail,
            RecommendedAction::Drain,
            format!("required interface {name} is down ({state_text})"),
        ),
        (None, true) => Finding::new(
            NAME,
            "nic_down",
            name,
            Status::Unknown,
            RecommendedAction::None,
            format!("cannot tell whether required interface {name} is up ({state_text})"),
        ),
        // Many nodes have unused ports; only required ones matter.
        (_, false) => Finding::new(
            NAME,
            "nic_down",
            name,
            Status::Ok,
            RecommendedAction::None,
            format!("{name} is not up and not required ({state_text})"),
        ),
    });
    if required {
        out.findings.push(Finding::ok(NAME, "nic_missing", name));
    }

    if let Some(&expected) = config.expected_speed_mbps.get(name) {
        out.findings.push(match speed {
            Some(speed) if speed == expected => Finding::ok(NAME, "nic_speed", name),
            Some(speed) => Finding::new(
                NAME,
                "nic_speed",
                name,
                Status::Warn,
                RecommendedAction::None,
                format!("{name} runs at {speed} Mb/s, expected {expected} Mb/s"),
            ),
            None => Finding::new(
                NAME,
                "nic_speed",
                name,
                Status::Unknown,
                RecommendedAction::None,
                format!("{name} reports no speed (link down?); expected {expected} Mb/s"),
            ),
        });
    }
    if let Some(&expected) = config.expected_mtu.get(name) {
        out.findings.push(match mtu {
            Some(mtu) if mtu == expected => Finding::ok(NAME, "nic_mtu", name),
            Some(mtu) => Finding::new(
                NAME,
                "nic_mtu",
                name,
                Status::Warn,
                RecommendedAction::None,
                format!("{name} has MTU {mtu}, expected {expected}"),
            ),
            None => Finding::new(
                NAME,
                "nic_mtu",
                name,
                Status::Unknown,
                RecommendedAction::None,
                format!("{name} reports no MTU; expected {expected}"),
            ),
        });
    }

    let flaps =
        carrier_changes.map(|c| history.carrier_changes.observe(now, c, config.flap_window));
    out.findings.push(flap_finding(
        "nic_flapping",
        name,
        flaps,
        config.flap_max,
        config.flap_window,
        "carrier changes",
    ));

    let mut over: Vec<String> = Vec::new();
    let mut worst_ratio = 0.0f64;
    for (i, ((file, is_error, direction), value)) in STATISTICS.iter().zip(&stats).enumerate() {
        let Some(value) = *value else { continue };
        let desc = if *is_error { &metrics::NIC_ERRORS } else { &metrics::NIC_DROPS };
        out.samples.push(device(Sample::new(desc, value as f64)).label("direction", *direction));
        let Some(rate) = history.rates.get_mut(i).and_then(|r| r.observe(now, value)) else {
            continue;
        };
        let max =
            if *is_error { config.max_errors_per_second } else { config.max_drops_per_second };
        if rate > max {
            over.push(format!("{file} {rate:.1}/s (max {max})"));
            worst_ratio = worst_ratio.max(if max > 0.0 { rate / max } else { f64::INFINITY });
        }
    }
    out.findings.push(if over.is_empty() {
        Finding::ok(NAME, "nic_errors", name)
    } else {
        Finding::new(
            NAME,
            "nic_errors",
            name,
            Status::Warn,
            RecommendedAction::None,
            format!("{name}: {}", over.join(", ")),
        )
    });

    out.findings.push(unreadable_finding(NAME, "nic_unreadable", name, dir, &unusable));
}

/// Looks at one InfiniBand/EFA port. A required port that is not ACTIVE/LinkUp fails with `drain`,
/// for the reasons given for interfaces: the fabric side is the usual cause, and a node cut off
/// from the fabric cannot take part in a multi-node job.
#[allow(clippy::too_many_arguments)]
fn ib_port(
    config: &NicConfig,
    dir: &Path,
    device: &str,
    port: u32,
    required: bool,
    history: &mut IbPortHistory,
    now: SystemTime,
    out: &mut Observation,
) {
    let subject = format!("{device}/{port}");
    let mut unusable = Unusable::default();
    let state = unusable.take(attr(dir, "state", |t| parse_ib_state(t, &IB_STATES)), "");
    let phys_state =
        unusable.take(attr(dir, "phys_state", |t| parse_ib_state(t, &IB_PHYS_STATES)), "");
    let rate = unusable.take(attr(dir, "rate", parse_ib_rate), "");
    let counters = dir.join("counters");
    let link_downed = unusable.take(attr(&counters, "link_downed", parse_u64), "counters/");
    let symbol_errors = unusable.take(attr(&counters, "symbol_error", parse_u64), "counters/");
    let receive_errors = unusable.take(attr(&counters, "port_rcv_errors", parse_u64), "counters/");

    let port_label = port.to_string();
    let labelled =
        |sample: Sample| sample.label("device", device).label("port", port_label.clone());
    let up = match (state, phys_state) {
        (Some(state), Some(phys)) => Some(state == IB_ACTIVE && phys == IB_LINK_UP),
        // Either one saying down is enough to know.
        (Some(state), None) if state != IB_ACTIVE => Some(false),
        (None, Some(phys)) if phys != IB_LINK_UP => Some(false),
        _ => None,
    };
    if let Some(up) = up {
        out.samples.push(labelled(Sample::new(&metrics::IB_PORT_UP, f64::from(u8::from(up)))));
    }
    if let Some(rate) = rate {
        out.samples.push(labelled(Sample::new(&metrics::IB_PORT_RATE, rate)));
    }
    for (desc, value) in [
        (&metrics::IB_LINK_DOWNED, link_downed),
        (&metrics::IB_SYMBOL_ERRORS, symbol_errors),
        (&metrics::IB_RECEIVE_ERRORS, receive_errors),
    ] {
        if let Some(value) = value {
            out.samples.push(labelled(Sample::new(desc, value as f64)));
        }
    }

    let state_text = format!(
        "state={} phys_state={}",
        state.map_or("?".to_owned(), |s| s.to_string()),
        phys_state.map_or("?".to_owned(), |s| s.to_string())
    );
    out.findings.push(match (up, required) {
        (Some(true), _) => Finding::new(
            NAME,
            "ib_port_down",
            subject.clone(),
            Status::Ok,
            RecommendedAction::None,
            format!("{subject} is ACTIVE/LinkUp"),
        ),
        (Some(false), true) => Finding::new(
            NAME,
            "ib_port_down",
            subject.clone(),
            Status::Fail,
            RecommendedAction::Drain,
            format!("InfiniBand port {subject} is down ({state_text}; want 4 ACTIVE, 5 LinkUp)"),
        ),
        (None, true) => Finding::new(
            NAME,
            "ib_port_down",
            subject.clone(),
            Status::Unknown,
            RecommendedAction::None,
            format!("cannot tell whether InfiniBand port {subject} is up ({state_text})"),
        ),
        (_, false) => Finding::new(
            NAME,
            "ib_port_down",
            subject.clone(),
            Status::Ok,
            RecommendedAction::None,
            format!("{subject} is not up and not required ({state_text})"),
        ),
    });

    let flaps =
        link_downed.map(|c| history.link_downed_flaps.observe(now, c, config.ib_flap_window));
    out.findings.push(flap_finding(
        "ib_flapping",
        &subject,
        flaps,
        config.ib_flap_max,
        config.ib_flap_window,
        "link_downed increases",
    ));
    let counters = IbCounters { link_downed, symbol_errors, receive_errors };
    out.findings.extend(ib_counter_findings(config, &subject, counters, history, now));
    out.findings.push(unreadable_finding(NAME, "ib_unreadable", &subject, dir, &unusable));
}

/// The error counters of one IB port as read; `None` when not reported or unusable.
#[derive(Debug, Clone, Copy)]
struct IbCounters {
    link_downed: Option<u64>,
    symbol_errors: Option<u64>,
    receive_errors: Option<u64>,
}

/// `ib_link_downed`, `ib_symbol_errors` and `ib_receive_errors` of one port, judged by how the
/// counters moved between reads, never by their value: a port that went down once a month ago
/// carries that count until the driver reloads. A counter that is not reported has nothing to
/// judge (ok); one that went down was reset and starts a new baseline.
fn ib_counter_findings(
    config: &NicConfig,
    subject: &str,
    counters: IbCounters,
    history: &mut IbPortHistory,
    now: SystemTime,
) -> [Finding; 3] {
    let warn = |finding: &str, message: String| {
        Finding::new(NAME, finding, subject, Status::Warn, RecommendedAction::None, message)
    };
    let ok = |finding: &str, message: String| {
        Finding::new(NAME, finding, subject, Status::Ok, RecommendedAction::None, message)
    };

    let window = config.ib_link_downed_window;
    let link_downed = match counters.link_downed {
        None => Finding::ok(NAME, "ib_link_downed", subject),
        Some(value) => {
            let rise = history.link_downed.observe(now, value);
            if rise > 0 {
                warn(
                    "ib_link_downed",
                    format!("{subject}: link went down {rise} time(s) since the last read"),
                )
                .with_value(rise as f64)
            } else if let Some((rise, age)) = history.link_downed.within(now, window) {
                let age = humantime::format_duration(Duration::from_secs(age.as_secs()));
                warn(
                    "ib_link_downed",
                    format!(
                        "{subject}: link went down {rise} time(s) {age} ago (warns for {} after)",
                        humantime::format_duration(window)
                    ),
                )
                .with_value(rise as f64)
            } else {
                ok(
                    "ib_link_downed",
                    format!(
                        "link_downed {value}, no rise within {}",
                        humantime::format_duration(window)
                    ),
                )
                .with_value(0.0)
            }
        }
    };

    let max = config.ib_symbol_errors_warn_per_hour;
    let symbol_errors = match counters.symbol_errors {
        None => Finding::ok(NAME, "ib_symbol_errors", subject),
        Some(value) => {
            let count = history.symbol_errors.observe(now, value, SYMBOL_ERROR_WINDOW);
            let text = format!("{count} symbol error(s) within the last hour (warns above {max})");
            if count as f64 > max {
                warn("ib_symbol_errors", format!("{subject}: {text}"))
            } else {
                ok("ib_symbol_errors", text)
            }
            .with_value(count as f64)
        }
    };

    let max = config.ib_receive_errors_warn_per_second;
    let rate = counters.receive_errors.and_then(|value| history.receive_errors.observe(now, value));
    let receive_errors = match rate {
        None => Finding::ok(NAME, "ib_receive_errors", subject),
        Some(rate) => {
            let text = format!("{rate:.1} receive errors/s (warns above {max})");
            if rate > max {
                warn("ib_receive_errors", format!("{subject}: {text}"))
            } else {
                ok("ib_receive_errors", text)
            }
            .with_value(rate)
        }
    };
    [link_downed, symbol_errors, receive_errors]
}

/// Warns when `flaps` reached `max` within `window`; ok otherwise (also when the counter is not
/// reported: nothing to count).
fn flap_finding(
    finding: &str,
    subject: &str,
    flaps: Option<u64>,
    max: u64,
    window: Duration,
    what: &str,
) -> Finding {
    let window = humantime::format_duration(window);
    match flaps {
        Some(flaps) if flaps >= max => Finding::new(
            NAME,
            finding,
            subject,
            Status::Warn,
            RecommendedAction::None,
            format!("{subject} is flapping: {flaps} {what} within {window} (max {max})"),
        )
        .with_value(flaps as f64),
        Some(flaps) => Finding::ok(NAME, finding, subject).with_value(flaps as f64),
        None => Finding::ok(NAME, finding, subject),
    }
}

/// `unknown` naming the sysfs files that were missing or held garbage, ok when there were none
/// (`check`'s `finding` about `subject`; the pcie check uses it too).
pub(super) fn unreadable_finding(
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

impl Check for NicCheck {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&mut self, ctx: &RunContext<'_>) -> Observation {
        let mut out = Observation::default();
        if let Some(err) = &self.ignore_error {
            out.findings.push(Finding::new(
                NAME,
                "nic_config",
                "",
                Status::Unknown,
                RecommendedAction::None,
                format!("checks.nic.ignore is not a valid regex, nothing ignored: {err}"),
            ));
        }
        let sysfs: PathBuf = ctx.paths.sysfs.clone();
        self.run_interfaces(&sysfs, ctx.now, &mut out);
        self.run_infiniband(&sysfs, ctx.now, &mut out);
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysfs_values() {
        assert_eq!(parse_speed("-1"), Some(None));
        assert_eq!(parse_speed("4294967295"), Some(None));
        assert_eq!(parse_speed("100000"), Some(Some(100_000)));
        assert_eq!(parse_speed("abc"), None);
        assert_eq!(parse_ib_state("4: ACTIVE", &IB_STATES), Some(4));
        assert_eq!(parse_ib_state("LinkUp", &IB_PHYS_STATES), Some(5));
        assert_eq!(parse_ib_state("abc", &IB_STATES), None);
        assert_eq!(parse_ib_state("x: ACTIVE", &IB_STATES), None);
        assert_eq!(parse_ib_rate("400 Gb/sec (4X NDR)"), Some(5e10));
        assert_eq!(parse_ib_rate("2.5 Gb/sec (1X SDR)"), Some(312_500_000.0));
        assert_eq!(parse_ib_rate("fast"), None);
        assert_eq!(parse_operstate("lowerlayerdown").as_deref(), Some("lowerlayerdown"));
        assert_eq!(parse_operstate("sideways"), None);
        assert_eq!(parse_ib_requirement("mlx5_0/1"), Some(("mlx5_0", Some(1))));
        assert_eq!(parse_ib_requirement("mlx5_0"), Some(("mlx5_0", None)));
        assert_eq!(parse_ib_requirement("mlx5_0/x"), None);
    }

    #[test]
    fn link_state_from_operstate_and_carrier() {
        assert_eq!(link_up(Some("up"), Some(true)), Some(true));
        assert_eq!(link_up(Some("up"), None), Some(true));
        assert_eq!(link_up(Some("up"), Some(false)), Some(false));
        assert_eq!(link_up(Some("unknown"), Some(true)), Some(true));
        assert_eq!(link_up(Some("lowerlayerdown"), None), Some(false));
        assert_eq!(link_up(None, None), None);
    }

    #[test]
    fn flaps_count_within_the_window_only() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        let mut h = CounterHistory::default();
        assert_eq!(h.observe(t0, 10, hour), 0, "boot-time changes are the baseline");
        assert_eq!(h.observe(t0 + Duration::from_secs(60), 14, hour), 4);
        assert_eq!(h.observe(t0 + Duration::from_secs(120), 16, hour), 6);
        // An hour after the first change only the later one is inside the window.
        assert_eq!(h.observe(t0 + hour + Duration::from_secs(90), 16, hour), 2);
        assert_eq!(h.observe(t0 + 3 * hour, 16, hour), 0);
        // Reset (driver reload): starts again.
        assert_eq!(h.observe(t0 + 3 * hour + Duration::from_secs(1), 1, hour), 0);
        for i in 0..1000u64 {
            h.observe(t0 + 4 * hour + Duration::from_secs(i), 100 + i, hour);
        }
        assert!(h.points.len() <= MAX_FLAP_SAMPLES);
    }

    #[test]
    fn rates_need_two_samples_a_second_apart() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut r = CounterRate::default();
        assert_eq!(r.observe(t0, 100), None);
        assert_eq!(r.observe(t0 + Duration::from_millis(10), 150), None);
        assert_eq!(r.observe(t0 + Duration::from_secs(10), 200), Some(10.0));
        assert_eq!(r.observe(t0 + Duration::from_secs(20), 50), None, "reset");
        assert_eq!(r.observe(t0 + Duration::from_secs(30), 50), Some(0.0));
    }

    #[test]
    fn rises_are_against_the_previous_read_and_resets_are_baselines() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let window = Duration::from_secs(900);
        let mut r = CounterRise::default();
        assert_eq!(r.observe(at(0), 7), 0, "what came before the agent is the baseline");
        assert_eq!(r.within(at(0), window), None);
        assert_eq!(r.observe(at(10), 9), 2);
        assert_eq!(r.observe(at(20), 9), 0);
        assert_eq!(r.within(at(20), window), Some((2, Duration::from_secs(10))));
        assert_eq!(r.within(at(910), window), None);
        assert_eq!(r.within(at(5), window), Some((2, Duration::ZERO)), "clock went back");
        assert_eq!(r.observe(at(30), 1), 0, "reset");
        assert_eq!(r.observe(at(40), 2), 1);
    }

    #[test]
    fn config_problems_name_fields() {
        let config = NicConfig {
            required: vec!["a/b".into()],
            ignore: "(".into(),
            flap_max: 0,
            max_drops_per_second: -1.0,
            ib_receive_errors_warn_per_second: f64::NAN,
            required_ib: vec!["mlx5_0/one".into()],
            expected_mtu: BTreeMap::from([("eth0".into(), 10)]),
            ..NicConfig::default()
        };
        let mut problems = ConfigProblems::default();
        config.validate("checks.nic", &mut problems);
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        for field in [
            "checks.nic.required[0]",
            "checks.nic.ignore",
            "checks.nic.flap_max",
            "checks.nic.max_drops_per_second",
            "checks.nic.ib_receive_errors_warn_per_second",
            "checks.nic.required_ib[0]",
            "checks.nic.expected_mtu.eth0",
        ] {
            assert!(fields.contains(&field), "{field} not in {fields:?}");
        }
        let mut problems = ConfigProblems::default();
        NicConfig::default().validate("checks.nic", &mut problems);
        assert!(problems.is_empty(), "{problems}");
    }

    #[test]
    fn default_ignore_skips_virtual_interfaces() {
        let regex = Regex::new(DEFAULT_IGNORE).unwrap();
        for name in ["lo", "docker0", "veth1234", "br-abc", "cni0", "cali123", "flannel.1"] {
            assert!(regex.is_match(name), "{name}");
        }
        for name in ["eth0", "ens1f0np0", "ib0", "bond0", "lo0"] {
            assert!(!regex.is_match(name), "{name}");
        }
    }
}
