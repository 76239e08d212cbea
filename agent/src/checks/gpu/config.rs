//! The gpu check's settings (`[checks.gpu]`) and their validation.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetmend_proto::RecommendedAction;
use serde::Deserialize;

use crate::config::{ConfigProblems, Schedule};
use crate::gpu::GpuBackendSpec;

/// Settings of the gpu check (`[checks.gpu]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Run this check.
    pub enabled: bool,
    /// Time between runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Longest a run may take before it is reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Where GPU state comes from: `nvml`, `nvml:LIBRARY` (an NVML library at that path),
    /// `fixture:PATH` (a JSON snapshot, read on every run) or `none` (report nothing).
    /// `fleetmend agent --gpu` takes the same forms (see [`crate::gpu::parse_backend`]).
    pub backend: GpuBackendSpec,
    /// GPUs this node should have. Unset: the count is reported but not judged.
    pub expected_count: Option<u32>,
    /// Runs in a row the count must be short before it fails (GPUs can show up late after boot).
    pub count_debounce: u32,
    /// A short count does not fail before the node has been up this long.
    #[serde(with = "humantime_serde")]
    pub boot_grace: Duration,
    /// GPU temperature at which the check warns.
    pub temperature_warn_celsius: u32,
    /// How long an Xid keeps its finding after the last time it occurred.
    #[serde(with = "humantime_serde")]
    pub xid_window: Duration,
    /// Actions that override the Xid catalog, by code: `{ "13" = "none", "31" = "drain" }`.
    /// `none` makes the Xid ok, `restart-app` a warning, any other action a failure.
    pub xid_actions: BTreeMap<String, RecommendedAction>,
    /// Retired pages (single- and double-bit together) at which the GPU fails (to be replaced).
    pub retired_pages_fail: u32,
    /// Pages retired for double-bit errors at which the GPU fails (to be replaced).
    pub retired_pages_double_bit_fail: u32,
    /// Rows remapped for uncorrectable errors at which the GPU fails (to be replaced).
    pub remapped_rows_uncorrectable_fail: u32,
    /// PCIe replays per minute above which the check warns. Unset: the vendor's rate per lane for
    /// the link's generation (Gen3 0.48, Gen4 0.96, Gen5 1.92) times its width.
    pub pcie_replays_warn_per_minute: Option<f64>,
    /// NVLink CRC errors per second, per link, above which the check warns.
    pub nvlink_crc_errors_warn_per_second: f64,
    /// How long an NVLink recovery keeps its warning after the recovery count last rose.
    #[serde(with = "humantime_serde")]
    pub nvlink_error_window: Duration,
    /// NVLink links every GPU should have active (18 on an H100 or B200 SXM). Fewer active, links
    /// the driver does not list counted as down, fails `nvlink_down`. Unset: only links listed as
    /// inactive are down.
    pub expected_nvlinks: Option<u32>,
    /// Runs in a row a hardware slowdown (`hw_slowdown`, thermal, power brake) must be seen before
    /// `throttle` fails with `drain`; it warns before. Short slowdowns under load are normal.
    pub throttle_sustained_runs: u32,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            backend: GpuBackendSpec::default(),
            expected_count: None,
            count_debounce: 3,
            boot_grace: Duration::from_secs(10 * 60),
            temperature_warn_celsius: 93,
            xid_window: Duration::from_secs(60 * 60),
            xid_actions: BTreeMap::new(),
            retired_pages_fail: 63,
            retired_pages_double_bit_fail: 15,
            remapped_rows_uncorrectable_fail: 512,
            pcie_replays_warn_per_minute: None,
            nvlink_crc_errors_warn_per_second: 100.0,
            nvlink_error_window: Duration::from_secs(60 * 60),
            expected_nvlinks: None,
            throttle_sustained_runs: 3,
        }
    }
}

impl GpuConfig {
    pub fn schedule(&self) -> Schedule {
        Schedule { enabled: self.enabled, interval: self.interval, timeout: self.timeout }
    }

    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        self.schedule().validate(section, problems);
        let mut at_least_one = |field: &str, value: u32| {
            if value == 0 {
                problems.push(format!("{section}.{field}"), "must be at least 1");
            }
        };
        at_least_one("count_debounce", self.count_debounce);
        at_least_one("throttle_sustained_runs", self.throttle_sustained_runs);
        at_least_one("retired_pages_fail", self.retired_pages_fail);
        at_least_one("retired_pages_double_bit_fail", self.retired_pages_double_bit_fail);
        at_least_one("remapped_rows_uncorrectable_fail", self.remapped_rows_uncorrectable_fail);
        if self.expected_count == Some(0) {
            problems.push(
                format!("{section}.expected_count"),
                "must be at least 1 (leave it out to skip the count check)",
            );
        }
        if self.expected_nvlinks == Some(0) {
            problems.push(
                format!("{section}.expected_nvlinks"),
                "must be at least 1 (leave it out for GPUs without NVLink)",
            );
        }
        if !(1..=150).contains(&self.temperature_warn_celsius) {
            problems.push(format!("{section}.temperature_warn_celsius"), "must be 1 to 150");
        }
        for (field, value) in
            [("xid_window", self.xid_window), ("nvlink_error_window", self.nvlink_error_window)]
        {
            if value.is_zero() {
                problems.push(format!("{section}.{field}"), "must be greater than zero");
            }
        }
        let mut positive = |field: &str, value: f64| {
            if !(value.is_finite() && value > 0.0) {
                problems.push(format!("{section}.{field}"), "must be a number greater than zero");
            }
        };
        if let Some(rate) = self.pcie_replays_warn_per_minute {
            positive("pcie_replays_warn_per_minute", rate);
        }
        positive("nvlink_crc_errors_warn_per_second", self.nvlink_crc_errors_warn_per_second);
        for code in self.xid_actions.keys() {
            if code.parse::<u32>().is_err() {
                problems.push(
                    format!("{section}.xid_actions.{code}"),
                    format!("{code:?} is not an Xid code (a number)"),
                );
            }
        }
    }

    /// `xid_actions` with numeric keys; keys that are not numbers were reported by `validate`.
    pub(super) fn parsed_xid_actions(&self) -> BTreeMap<u32, RecommendedAction> {
        self.xid_actions
            .iter()
            .filter_map(|(code, action)| code.parse().ok().map(|code| (code, *action)))
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;

    fn config_from(toml: &str) -> GpuConfig {
        AgentConfig::parse(toml).unwrap().checks.gpu
    }

    fn problems_of(config: &GpuConfig) -> Vec<String> {
        let mut problems = ConfigProblems::default();
        config.validate("checks.gpu", &mut problems);
        problems.0.into_iter().map(|p| p.field).collect()
    }

    #[test]
    fn defaults_are_valid_and_follow_the_catalog() {
        let config = GpuConfig::default();
        assert!(problems_of(&config).is_empty());
        assert_eq!(config.backend, GpuBackendSpec::Nvml { library: None });
        assert_eq!(config.count_debounce, 3);
        assert_eq!(config.boot_grace, Duration::from_secs(600));
        assert_eq!(config.temperature_warn_celsius, 93);
        assert_eq!(config.retired_pages_fail, 63);
        assert_eq!(config.retired_pages_double_bit_fail, 15);
        assert_eq!(config.remapped_rows_uncorrectable_fail, 512);
    }

    #[test]
    fn config_parses_backend_actions_and_durations() {
        let config = config_from(
            "[checks.gpu]\nbackend = \"fixture:/x/gpu.json\"\nexpected_count = 8\nboot_grace = \"5m\"\n\
             [checks.gpu.xid_actions]\n13 = \"none\"\n79 = \"replace\"\n",
        );
        assert_eq!(config.backend, GpuBackendSpec::Fixture("/x/gpu.json".into()));
        assert_eq!(config.expected_count, Some(8));
        assert_eq!(config.boot_grace, Duration::from_secs(300));
        let actions = config.parsed_xid_actions();
        assert_eq!(actions[&13], RecommendedAction::None);
        assert_eq!(actions[&79], RecommendedAction::Replace);
        assert!(problems_of(&config).is_empty());
    }

    #[test]
    fn config_refuses_bad_backends_and_actions_at_parse() {
        let err = AgentConfig::parse("[checks.gpu]\nbackend = \"dcgm\"\n").unwrap_err();
        assert!(err.contains("expected nvml"), "{err}");
        let err = AgentConfig::parse("[checks.gpu.xid_actions]\n79 = \"rebot\"\n").unwrap_err();
        assert!(err.contains("rebot"), "{err}");
    }

    #[test]
    fn validate_names_every_bad_field() {
        let config = config_from(
            "[checks.gpu]\nexpected_count = 0\ncount_debounce = 0\ntemperature_warn_celsius = 0\n\
             xid_window = \"0s\"\nnvlink_crc_errors_warn_per_second = -1.0\npcie_replays_warn_per_minute = 0.0\n\
             expected_nvlinks = 0\nthrottle_sustained_runs = 0\n\
             [checks.gpu.xid_actions]\nseventy-nine = \"reboot\"\n",
        );
        let fields = problems_of(&config);
        for field in [
            "checks.gpu.expected_count",
            "checks.gpu.count_debounce",
            "checks.gpu.temperature_warn_celsius",
            "checks.gpu.xid_window",
            "checks.gpu.nvlink_crc_errors_warn_per_second",
            "checks.gpu.pcie_replays_warn_per_minute",
            "checks.gpu.xid_actions.seventy-nine",
            "checks.gpu.expected_nvlinks",
            "checks.gpu.throttle_sustained_runs",
        ] {
            assert!(fields.iter().any(|f| f == field), "{field} missing from {fields:?}");
        }
    }
}
