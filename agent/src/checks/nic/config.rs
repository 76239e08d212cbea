//! The nic check's settings (`[checks.nic]`) and their validation.

use std::collections::BTreeMap;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;

use super::DEFAULT_IGNORE;
use crate::config::{ConfigProblems, Schedule};

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
pub(super) fn parse_ib_requirement(entry: &str) -> Option<(&str, Option<u32>)> {
    match entry.split_once('/') {
        None => is_interface_name(entry).then_some((entry, None)),
        Some((device, port)) => {
            let port = port.parse::<u32>().ok()?;
            is_interface_name(device).then_some((device, Some(port)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_requirements_are_a_device_or_device_and_port() {
        assert_eq!(parse_ib_requirement("mlx5_0/1"), Some(("mlx5_0", Some(1))));
        assert_eq!(parse_ib_requirement("mlx5_0"), Some(("mlx5_0", None)));
        assert_eq!(parse_ib_requirement("mlx5_0/x"), None);
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
}
