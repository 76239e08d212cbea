//! Ethernet interfaces from `{sysfs}/class/net`: link state, speed, MTU, carrier flaps within a
//! window and error/drop rates (`nic_down`, `nic_missing`, `nic_speed`, `nic_mtu`,
//! `nic_flapping`, `nic_errors`, `nic_unreadable`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::SystemTime;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use regex::Regex;

use super::counters::{CounterHistory, CounterRate, flap_finding};
use super::sysfs::{Unusable, attr, list_dirs, parse_u64, unlisted_finding, unreadable_finding};
use super::{NAME, NicConfig};
use crate::checks::Observation;
use crate::metrics::{self, Sample};

/// The statistics counters, in [`InterfaceHistory::rates`] order: (file, metric, direction).
const STATISTICS: [(&str, bool, &str); 4] = [
    ("rx_errors", true, "rx"),
    ("tx_errors", true, "tx"),
    ("rx_dropped", false, "rx"),
    ("tx_dropped", false, "tx"),
];

/// The interfaces the check looks at and what it keeps of each between runs (forgotten when the
/// interface disappears).
#[derive(Debug)]
pub(super) struct Interfaces {
    /// `None` with an empty `ignore`, or (after validation, not expected) a pattern that did not
    /// compile, reported as `nic_config`.
    ignore: Option<Regex>,
    histories: BTreeMap<String, InterfaceHistory>,
}

/// The history kept for one interface.
#[derive(Debug, Clone, Default)]
struct InterfaceHistory {
    carrier_changes: CounterHistory,
    /// rx_errors, tx_errors, rx_dropped, tx_dropped.
    rates: [CounterRate; 4],
}

impl Interfaces {
    pub(super) fn new(ignore: Option<Regex>) -> Self {
        Interfaces { ignore, histories: BTreeMap::new() }
    }

    fn ignored(&self, name: &str) -> bool {
        self.ignore.as_ref().is_some_and(|regex| regex.is_match(name))
    }

    /// Looks at every interface that is required or not ignored, and names the required ones
    /// that do not exist.
    pub(super) fn run(
        &mut self,
        config: &NicConfig,
        sysfs: &Path,
        now: SystemTime,
        out: &mut Observation,
    ) {
        let class = sysfs.join("class/net");
        let listed = match list_dirs(&class) {
            Ok(names) => names,
            Err(err) => {
                out.findings.push(unlisted_finding("nic_unreadable", "", &class, &err));
                // Without a listing, "missing" cannot be told from "unreadable".
                return;
            }
        };
        let required: BTreeSet<&str> = config.required.iter().map(String::as_str).collect();
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
        self.histories.retain(|name, _| looked_at.contains(name));
        for name in looked_at {
            let is_required = required.contains(name.as_str());
            let history = self.histories.entry(name.clone()).or_default();
            interface(config, &class.join(&name), &name, is_required, history, now, out);
        }
    }
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

/// The files of one interface as read; a value is `None` when absent or unusable.
#[derive(Debug)]
struct InterfaceReading {
    operstate: Option<String>,
    carrier: Option<bool>,
    carrier_changes: Option<u64>,
    /// Mb/s.
    speed: Option<u64>,
    mtu: Option<u64>,
    /// In [`STATISTICS`] order.
    stats: Vec<Option<u64>>,
    /// The files that held garbage.
    unusable: Unusable,
}

impl InterfaceReading {
    fn read(dir: &Path) -> Self {
        let mut unusable = Unusable::default();
        let operstate = unusable.take(attr(dir, "operstate", parse_operstate), "");
        let carrier = unusable.take(attr(dir, "carrier", parse_carrier), "");
        let carrier_changes = unusable.take(attr(dir, "carrier_changes", parse_u64), "");
        let speed = unusable.take(attr(dir, "speed", parse_speed), "").flatten();
        let mtu = unusable.take(attr(dir, "mtu", parse_u64), "");
        let stats_dir = dir.join("statistics");
        let stats = STATISTICS
            .iter()
            .map(|(file, _, _)| unusable.take(attr(&stats_dir, file, parse_u64), "statistics/"))
            .collect();
        InterfaceReading { operstate, carrier, carrier_changes, speed, mtu, stats, unusable }
    }

    /// Whether the link is up; `None` when the files do not tell.
    fn up(&self) -> Option<bool> {
        link_up(self.operstate.as_deref(), self.carrier)
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
    let reading = InterfaceReading::read(dir);
    let device = |sample: Sample| sample.label("device", name);
    if let Some(up) = reading.up() {
        out.samples.push(device(Sample::new(&metrics::NIC_UP, f64::from(u8::from(up)))));
    }
    if let Some(changes) = reading.carrier_changes {
        out.samples.push(device(Sample::new(&metrics::NIC_CARRIER_CHANGES, changes as f64)));
    }
    if let Some(speed) = reading.speed {
        // Mb/s to bytes/s.
        out.samples.push(device(Sample::new(&metrics::NIC_SPEED, speed as f64 * 125_000.0)));
    }
    if let Some(mtu) = reading.mtu {
        out.samples.push(device(Sample::new(&metrics::NIC_MTU, mtu as f64)));
    }

    out.findings.push(down_finding(name, &reading, required));
    if required {
        out.findings.push(Finding::ok(NAME, "nic_missing", name));
    }
    out.findings.extend(speed_finding(config, name, reading.speed));
    out.findings.extend(mtu_finding(config, name, reading.mtu));

    let flaps = reading
        .carrier_changes
        .map(|c| history.carrier_changes.observe(now, c, config.flap_window));
    out.findings.push(flap_finding(
        "nic_flapping",
        name,
        flaps,
        config.flap_max,
        config.flap_window,
        "carrier changes",
    ));
    observe_error_rates(config, name, &reading.stats, history, now, out);
    out.findings.push(unreadable_finding(NAME, "nic_unreadable", name, dir, &reading.unusable));
}

/// `nic_down`: only a required interface that is down fails; many nodes have unused ports.
fn down_finding(name: &str, reading: &InterfaceReading, required: bool) -> Finding {
    let state_text = format!(
        "operstate={} carrier={}",
        reading.operstate.as_deref().unwrap_or("?"),
        reading.carrier.map_or("?", |c| if c { "1" } else { "0" })
    );
    let (status, action, message) = match (reading.up(), required) {
        (Some(true), _) => {
            (Status::Ok, RecommendedAction::None, format!("{name} is up ({state_text})"))
        }
        (Some(false), true) => (
            Status::Fail,
            RecommendedAction::Drain,
            format!("required interface {name} is down ({state_text})"),
        ),
        (None, true) => (
            Status::Unknown,
            RecommendedAction::None,
            format!("cannot tell whether required interface {name} is up ({state_text})"),
        ),
        (_, false) => (
            Status::Ok,
            RecommendedAction::None,
            format!("{name} is not up and not required ({state_text})"),
        ),
    };
    Finding::new(NAME, "nic_down", name, status, action, message)
}

/// `nic_speed` against `expected_speed_mbps`, where the interface has an expected speed.
fn speed_finding(config: &NicConfig, name: &str, speed: Option<u64>) -> Option<Finding> {
    let &expected = config.expected_speed_mbps.get(name)?;
    Some(match speed {
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
    })
}

/// `nic_mtu` against `expected_mtu`, where the interface has an expected MTU.
fn mtu_finding(config: &NicConfig, name: &str, mtu: Option<u64>) -> Option<Finding> {
    let &expected = config.expected_mtu.get(name)?;
    Some(match mtu {
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
    })
}

/// The error and drop metrics of one interface and `nic_errors`: `warn` naming every counter
/// whose rate is above its limit.
fn observe_error_rates(
    config: &NicConfig,
    name: &str,
    stats: &[Option<u64>],
    history: &mut InterfaceHistory,
    now: SystemTime,
    out: &mut Observation,
) {
    let mut over: Vec<String> = Vec::new();
    for (i, ((file, is_error, direction), value)) in STATISTICS.iter().zip(stats).enumerate() {
        let Some(value) = *value else { continue };
        let desc = if *is_error { &metrics::NIC_ERRORS } else { &metrics::NIC_DROPS };
        out.samples.push(
            Sample::new(desc, value as f64).label("device", name).label("direction", *direction),
        );
        let Some(rate) = history.rates.get_mut(i).and_then(|r| r.observe(now, value)) else {
            continue;
        };
        let max =
            if *is_error { config.max_errors_per_second } else { config.max_drops_per_second };
        if rate > max {
            over.push(format!("{file} {rate:.1}/s (max {max})"));
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::checks::nic::DEFAULT_IGNORE;

    #[test]
    fn parses_sysfs_values() {
        assert_eq!(parse_speed("-1"), Some(None));
        assert_eq!(parse_speed("4294967295"), Some(None));
        assert_eq!(parse_speed("100000"), Some(Some(100_000)));
        assert_eq!(parse_speed("abc"), None);
        assert_eq!(parse_operstate("lowerlayerdown").as_deref(), Some("lowerlayerdown"));
        assert_eq!(parse_operstate("sideways"), None);
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
