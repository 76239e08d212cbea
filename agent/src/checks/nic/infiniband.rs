//! InfiniBand/EFA ports from `{sysfs}/class/infiniband`: state, physical state, rate,
//! `link_downed` flaps and how the error counters move (`ib_port_down`, `ib_port_missing`,
//! `ib_flapping`, `ib_link_downed`, `ib_symbol_errors`, `ib_receive_errors`, `ib_unreadable`).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use fleetmend_proto::{Finding, RecommendedAction, Status};

use super::counters::{CounterHistory, CounterRate, CounterRise, flap_finding};
use super::sysfs::{Unusable, attr, list_dirs, parse_u64, unlisted_finding, unreadable_finding};
use super::{NAME, NicConfig, parse_ib_requirement};
use crate::checks::Observation;
use crate::metrics::{self, Sample};

/// The ports the check requires and what it keeps of each port between runs (forgotten when the
/// port disappears).
#[derive(Debug)]
pub(super) struct IbPorts {
    /// Required IB ports: (device, port or every port), from `required_ib`.
    required: Vec<(String, Option<u32>)>,
    histories: BTreeMap<(String, u32), IbPortHistory>,
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

impl IbPorts {
    pub(super) fn new(config: &NicConfig) -> Self {
        let required = config
            .required_ib
            .iter()
            .filter_map(|entry| parse_ib_requirement(entry))
            .map(|(device, port)| (device.to_owned(), port))
            .collect();
        IbPorts { required, histories: BTreeMap::new() }
    }

    /// Looks at every port of every device, and names the required ports that do not exist.
    pub(super) fn run(
        &mut self,
        config: &NicConfig,
        sysfs: &Path,
        now: SystemTime,
        out: &mut Observation,
    ) {
        let class = sysfs.join("class/infiniband");
        let devices = match list_dirs(&class) {
            Ok(devices) => devices,
            // No IB/EFA hardware (or no driver): nothing to look at, not a fault, unless some
            // port is required, which the loop below reports as missing.
            Err(err) if err.kind() == io::ErrorKind::NotFound => BTreeSet::new(),
            Err(err) => {
                out.findings.push(unlisted_finding("ib_unreadable", "", &class, &err));
                return;
            }
        };
        let mut seen_ports: Vec<(String, u32)> = Vec::new();
        for device in &devices {
            let ports_dir = class.join(device).join("ports");
            let ports = match list_dirs(&ports_dir) {
                Ok(ports) => ports,
                Err(err) => {
                    let finding = unlisted_finding("ib_unreadable", device, &ports_dir, &err);
                    out.findings.push(finding);
                    continue;
                }
            };
            for port in ports.iter().filter_map(|p| p.parse::<u32>().ok()) {
                let required = self.required.is_empty()
                    || self
                        .required
                        .iter()
                        .any(|(d, p)| d == device && p.is_none_or(|p| p == port));
                let history = self.histories.entry((device.clone(), port)).or_default();
                ib_port(
                    config,
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
        self.histories.retain(|key, _| seen_ports.contains(key));
        for (device, port) in &self.required {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_port_states_and_rates() {
        assert_eq!(parse_ib_state("4: ACTIVE", &IB_STATES), Some(4));
        assert_eq!(parse_ib_state("LinkUp", &IB_PHYS_STATES), Some(5));
        assert_eq!(parse_ib_state("abc", &IB_STATES), None);
        assert_eq!(parse_ib_state("x: ACTIVE", &IB_STATES), None);
        assert_eq!(parse_ib_rate("400 Gb/sec (4X NDR)"), Some(5e10));
        assert_eq!(parse_ib_rate("2.5 Gb/sec (1X SDR)"), Some(312_500_000.0));
        assert_eq!(parse_ib_rate("fast"), None);
    }
}
