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
//!
//! The reading of sysfs files is in [`sysfs`] (shared with the pcie check), the counter
//! histories in [`counters`], interfaces in [`ethernet`] and ports in [`infiniband`].

mod config;
mod counters;
mod ethernet;
mod infiniband;
mod sysfs;

use std::path::PathBuf;

use fleetmend_proto::{Finding, RecommendedAction, Status};
use regex::Regex;

pub use self::config::NicConfig;
use self::config::parse_ib_requirement;
use self::ethernet::Interfaces;
use self::infiniband::IbPorts;
pub(super) use self::sysfs::{Attr, Unusable, attr, list_dirs, unreadable_finding};
use super::{BuildContext, Check, Observation, RunContext};

pub const NAME: &str = "nic";

/// Interfaces that are not physical links a job depends on: loopback, containers, bridges, CNI
/// plugins.
pub const DEFAULT_IGNORE: &str = r"^(lo|docker.*|veth.*|br-.*|virbr.*|cni.*|flannel.*|cali.*)$";

/// The nic check.
#[derive(Debug)]
pub struct NicCheck {
    config: NicConfig,
    /// The `ignore` pattern's error, when it did not compile (after validation, not expected):
    /// reported as `nic_config`, and nothing is ignored.
    ignore_error: Option<String>,
    interfaces: Interfaces,
    ib_ports: IbPorts,
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
        NicCheck {
            config: config.clone(),
            ignore_error,
            interfaces: Interfaces::new(ignore),
            ib_ports: IbPorts::new(config),
        }
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
        self.interfaces.run(&self.config, &sysfs, ctx.now, &mut out);
        self.ib_ports.run(&self.config, &sysfs, ctx.now, &mut out);
        out
    }
}
