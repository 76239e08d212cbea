//! The agent's configuration: one TOML file, flags on top.
//!
//! Every struct denies unknown fields and every field has a default, so an empty file is a working
//! config. [`AgentConfig::validate`] returns every problem at once, each naming its field.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetmend_listener::ListenerConfig;
use serde::Deserialize;

pub use crate::evidence::{EvidenceCommand, EvidenceConfig};
// The checks, the evidence and the simulator name these as the agent's config's.
pub use fleetmend_proto::config_problem::{ConfigProblem, ConfigProblems};

use crate::checks::{
    disk::DiskConfig, gpu::GpuConfig, host::HostConfig, kernel_log::KernelLogConfig,
    nic::NicConfig, pcie::PcieConfig,
};

/// The whole agent configuration (`fleetmend agent --config FILE`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Node name used in reports and metrics. Default: the host name.
    pub node: Option<String>,
    /// Address for `/metrics`, `/healthz` and `/v1/health`.
    pub listen: SocketAddr,
    /// Deadlines and the connection cap of that listener (`[listener]`).
    #[serde(deserialize_with = "ListenerConfig::agent")]
    pub listener: ListenerConfig,
    /// Where the host's files are; tests point these at fixture trees.
    pub paths: HostPaths,
    /// Reporting to the repairer.
    pub report: ReportConfig,
    /// The checks, each with its own schedule.
    pub checks: ChecksConfig,
    /// Commands the repairer may send: deep checks and reboots.
    pub commands: CommandsConfig,
    /// Running the ranks of jobs the repairer's queue places on this node (`run-rank`).
    pub jobs: JobsConfig,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            node: None,
            listen: SocketAddr::from(([0, 0, 0, 0], 9831)),
            listener: ListenerConfig::AGENT,
            paths: HostPaths::default(),
            report: ReportConfig::default(),
            checks: ChecksConfig::default(),
            commands: CommandsConfig::default(),
            jobs: JobsConfig::default(),
        }
    }
}

/// Host paths, injected so checks run against plain directory trees in tests.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostPaths {
    /// The sysfs mount (`--path.sysfs`).
    pub sysfs: PathBuf,
    /// The procfs mount (`--path.procfs`).
    pub procfs: PathBuf,
    /// The root filesystem (`--path.rootfs`); configured mount points are read below it.
    pub rootfs: PathBuf,
    /// The kernel log to follow (`--kmsg`): `/dev/kmsg`, or a plain file followed as it grows.
    pub kmsg: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            sysfs: PathBuf::from("/sys"),
            procfs: PathBuf::from("/proc"),
            rootfs: PathBuf::from("/"),
            kmsg: PathBuf::from("/dev/kmsg"),
        }
    }
}

impl HostPaths {
    /// The paths of a host laid out as one directory tree: `DIR/sys`, `DIR/proc`, `DIR/root` and
    /// the kernel log `DIR/kmsg` (the layout of the agent's fixture cases and of simulated nodes).
    pub fn tree(dir: &Path) -> HostPaths {
        HostPaths {
            sysfs: dir.join("sys"),
            procfs: dir.join("proc"),
            rootfs: dir.join("root"),
            kmsg: dir.join("kmsg"),
        }
    }

    /// `path` (absolute, as the host sees it) under the configured root filesystem.
    pub fn under_rootfs(&self, path: &Path) -> PathBuf {
        match path.strip_prefix("/") {
            Ok(relative) => self.rootfs.join(relative),
            Err(_) => self.rootfs.join(path),
        }
    }
}

/// Reports to the repairer (`POST {repairer}/v1/reports`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportConfig {
    /// Base URL of the repairer, e.g. `http://repairer:9830`, or a list of the repairers that
    /// share one fleet (`["https://r1:9830", "https://r2:9830"]`): reports go to the first that
    /// takes them, and follow a standby's pointer to the leader when it is one of these. No URL: the
    /// agent only serves metrics.
    pub repairer: Option<RepairerUrls>,
    /// Time between regular reports.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Timeout of one report request.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Bearer token sent with every report.
    pub token: Option<String>,
    /// File holding the bearer token (read at start; surrounding white space ignored).
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA(s) that signed the repairer's certificate, for an `https://` repairer:
    /// trusted instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// First retry delay while the repairer is away; doubles per failure.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    /// Longest retry delay while the repairer is away.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            repairer: None,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            token: None,
            token_file: None,
            ca_file: None,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// `report.repairer`: one base URL or a list of them, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairerUrls {
    One(String),
    Many(Vec<String>),
}

impl RepairerUrls {
    /// The URLs in order.
    pub fn urls(&self) -> &[String] {
        match self {
            RepairerUrls::One(url) => std::slice::from_ref(url),
            RepairerUrls::Many(urls) => urls,
        }
    }

    /// A comma-separated list (`--repairer`, `FLEETMEND_REPAIRER`); one URL stays one.
    pub fn from_list(text: &str) -> RepairerUrls {
        let mut urls = fleetmend_proto::repairers::split_list(text);
        if urls.len() == 1 { RepairerUrls::One(urls.remove(0)) } else { RepairerUrls::Many(urls) }
    }

    /// Adds every problem of the list, naming `field` (`report.repairer`, or `report.repairer[i]`
    /// for an entry of a list).
    pub fn validate(&self, field: &str, problems: &mut ConfigProblems) {
        for (at, message) in fleetmend_proto::repairers::problems(self.urls()) {
            match (self, at) {
                (RepairerUrls::Many(_), Some(i)) => problems.push(format!("{field}[{i}]"), message),
                _ => problems.push(field, message),
            }
        }
    }
}

impl fmt::Display for RepairerUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.urls().join(","))
    }
}

impl<'de> Deserialize<'de> for RepairerUrls {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RepairerUrls;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a repairer base URL or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<RepairerUrls, E> {
                Ok(RepairerUrls::One(url.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RepairerUrls, A::Error> {
                let mut urls = Vec::new();
                while let Some(url) = seq.next_element::<String>()? {
                    urls.push(url);
                }
                Ok(RepairerUrls::Many(urls))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The checks; each can be turned off with `enabled = false`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChecksConfig {
    pub gpu: GpuConfig,
    pub kernel_log: KernelLogConfig,
    pub nic: NicConfig,
    pub pcie: PcieConfig,
    pub disk: DiskConfig,
    pub host: HostConfig,
}

/// How the agent carries out the repairer's commands (`[commands]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CommandsConfig {
    /// What a `reboot` command runs: a program and its arguments, no shell. Empty: reboots are
    /// refused (the repairer gets a failed result saying so).
    pub reboot: Vec<String>,
    /// How long the "reboot started" result may take to reach the repairer before the reboot
    /// command runs (it runs as soon as the report is delivered), so the repairer knows the node
    /// is going down on purpose.
    #[serde(with = "humantime_serde")]
    pub reboot_delay: Duration,
    /// Longest the reboot command may run; `systemctl reboot` returns once the reboot is queued.
    #[serde(with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// Longest a `deep-check` command may take, the checks and every probe together.
    #[serde(with = "humantime_serde")]
    pub deep_check_timeout: Duration,
    /// Active probes a deep check runs after the checks, one at a time in this order (they
    /// usually load the GPUs or the fabric, so never side by side).
    pub deep_check_probes: Vec<ProbeConfig>,
    /// What an `evidence` command gathers before a disruptive repair (`[commands.evidence]`).
    pub evidence: EvidenceConfig,
    /// What an `allreduce` command runs: a program and its arguments, to which the agent adds
    /// `--bytes`, `--iterations` and `--timeout` and the ring's `RANK`, `WORLD_SIZE`,
    /// `MASTER_ADDR` and `MASTER_PORT`; it prints its measurement as one JSON line. Empty (the
    /// default): this agent's own binary, `fleetmend allreduce`.
    pub allreduce: Vec<String>,
}

impl Default for CommandsConfig {
    fn default() -> Self {
        CommandsConfig {
            reboot: vec!["systemctl".to_owned(), "reboot".to_owned()],
            reboot_delay: Duration::from_secs(2),
            reboot_timeout: Duration::from_secs(60),
            deep_check_timeout: Duration::from_secs(600),
            deep_check_probes: Vec::new(),
            evidence: EvidenceConfig::default(),
            allreduce: Vec::new(),
        }
    }
}

/// One active probe of a deep check: a process that passes if and only if it exits 0.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// Names the probe: the `subject` of its `probe_failed` finding.
    pub name: String,
    /// The program and its arguments, no shell (e.g. `["dcgmi", "diag", "-r", "2"]`).
    pub argv: Vec<String>,
    /// Longest the probe may run; then its whole process group is killed and it fails.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl CommandsConfig {
    /// Adds every problem of this section, naming `section` (`commands`).
    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        if self.reboot.first().is_some_and(String::is_empty) {
            problems.push(
                format!("{section}.reboot"),
                "the program (first element) is empty; use an empty list to refuse reboots",
            );
        }
        for (field, value) in [
            ("reboot_delay", self.reboot_delay),
            ("reboot_timeout", self.reboot_timeout),
            ("deep_check_timeout", self.deep_check_timeout),
        ] {
            if value.is_zero() {
                problems.push(format!("{section}.{field}"), "must be greater than zero");
            }
        }
        self.evidence.validate(&format!("{section}.evidence"), problems);
        if self.allreduce.first().is_some_and(String::is_empty) {
            problems.push(
                format!("{section}.allreduce"),
                "the program (first element) is empty; use an empty list for this agent's own binary",
            );
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, probe) in self.deep_check_probes.iter().enumerate() {
            let at = format!("{section}.deep_check_probes[{i}]");
            if probe.name.trim().is_empty() {
                problems.push(format!("{at}.name"), "must not be empty");
            } else if !names.insert(probe.name.as_str()) {
                problems.push(
                    format!("{at}.name"),
                    format!("{:?} names another probe already", probe.name),
                );
            }
            if probe.argv.first().is_none_or(String::is_empty) {
                problems.push(format!("{at}.argv"), "must name a program to run");
            }
            if probe.timeout.is_zero() {
                problems.push(format!("{at}.timeout"), "must be greater than zero");
            }
        }
    }
}

/// Running job ranks on this node (`[jobs]`): `run-rank` starts a program the repairer names, so an
/// agent does it only when its operator turned it on.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Whether `run-rank` and `signal-rank` commands are carried out; off, they are refused (the
    /// repairer gets a failed result saying so) and nothing is started.
    pub enabled: bool,
    /// Each rank gets `<dir>/<job>/attempt-<n>/rank-<r>/` as its working directory (unless the
    /// command names one), with its stdout and stderr appended to `rank.log` there.
    pub dir: PathBuf,
    /// How long a rank that ended keeps appearing in reports.
    #[serde(with = "humantime_serde")]
    pub retain_exited: Duration,
    /// When the agent itself stops, its ranks get SIGTERM, then SIGKILL after this long.
    #[serde(with = "humantime_serde")]
    pub stop_grace: Duration,
    /// The host other nodes reach this node at, sent in every report (a job's rank 0 hosts its
    /// rendezvous there). Default: the host name.
    pub advertise_address: Option<String>,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            enabled: false,
            dir: PathBuf::from("/var/lib/fleetmend/jobs"),
            retain_exited: Duration::from_secs(600),
            stop_grace: Duration::from_secs(30),
            advertise_address: None,
        }
    }
}

impl JobsConfig {
    /// Adds every problem of this section, naming `section` (`jobs`).
    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        if self.dir.as_os_str().is_empty() {
            problems.push(format!("{section}.dir"), "must not be empty");
        }
        for (field, value) in
            [("retain_exited", self.retain_exited), ("stop_grace", self.stop_grace)]
        {
            if value.is_zero() {
                problems.push(format!("{section}.{field}"), "must be greater than zero");
            }
        }
        if let Some(address) = &self.advertise_address
            && (address.is_empty()
                || address.contains('/')
                || address.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            problems.push(
                format!("{section}.advertise_address"),
                format!("{address:?} is not a host name or IP address"),
            );
        }
    }
}

/// When a check runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub enabled: bool,
    pub interval: Duration,
    pub timeout: Duration,
}

impl Schedule {
    /// Adds the problems of an impossible schedule, naming `section` (e.g. `checks.gpu`).
    pub fn validate(&self, section: &str, problems: &mut ConfigProblems) {
        if self.interval.is_zero() {
            problems.push(format!("{section}.interval"), "must be greater than zero");
        }
        if self.timeout.is_zero() {
            problems.push(format!("{section}.timeout"), "must be greater than zero");
        }
        if self.timeout > self.interval && !self.interval.is_zero() {
            problems.push(
                format!("{section}.timeout"),
                format!(
                    "{} is longer than the interval {}",
                    humantime::format_duration(self.timeout),
                    humantime::format_duration(self.interval)
                ),
            );
        }
    }
}

/// Loading a config failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path} has {} problem(s):\n{problems}", problems.0.len())]
    Invalid { path: PathBuf, problems: ConfigProblems },
}

impl AgentConfig {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let config = AgentConfig::parse(&text)
            .map_err(|message| ConfigError::Parse { path: path.to_owned(), message })?;
        config.validated(path)
    }

    /// Parses TOML text without validating it.
    pub fn parse(text: &str) -> Result<AgentConfig, String> {
        toml::from_str(text).map_err(|err| err.to_string().trim_end().to_owned())
    }

    /// `self` when valid, else every problem, attributed to `path`.
    pub fn validated(self, path: &Path) -> Result<AgentConfig, ConfigError> {
        let problems = self.validate();
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(ConfigError::Invalid { path: path.to_owned(), problems })
        }
    }

    /// Every problem with this config.
    pub fn validate(&self) -> ConfigProblems {
        let mut problems = ConfigProblems::default();
        if let Some(node) = &self.node
            && (node.is_empty() || node.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            problems.push("node", format!("{node:?} is not a usable node name"));
        }
        for (field, message) in self.listener.problems("listener") {
            problems.push(field, message);
        }
        let report = &self.report;
        if let Some(urls) = &report.repairer {
            urls.validate("report.repairer", &mut problems);
        }
        if report.token.is_some() && report.token_file.is_some() {
            problems.push(
                "report.token_file",
                "set either report.token or report.token_file, not both",
            );
        }
        for (field, value) in [
            ("report.interval", report.interval),
            ("report.timeout", report.timeout),
            ("report.backoff_initial", report.backoff_initial),
            ("report.backoff_max", report.backoff_max),
        ] {
            if value.is_zero() {
                problems.push(field, "must be greater than zero");
            }
        }
        if report.backoff_initial > report.backoff_max {
            problems.push("report.backoff_initial", "is longer than report.backoff_max");
        }
        let checks = &self.checks;
        checks.gpu.validate("checks.gpu", &mut problems);
        checks.kernel_log.validate("checks.kernel_log", &mut problems);
        checks.nic.validate("checks.nic", &mut problems);
        checks.pcie.validate("checks.pcie", &mut problems);
        checks.disk.validate("checks.disk", &mut problems);
        checks.host.validate("checks.host", &mut problems);
        self.commands.validate("commands", &mut problems);
        self.jobs.validate("jobs", &mut problems);
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_a_valid_config() {
        let config = AgentConfig::parse("").unwrap();
        assert!(config.validate().is_empty(), "{}", config.validate());
        assert_eq!(config.listen.port(), 9831);
        assert_eq!(config.report.interval, Duration::from_secs(10));
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let err = AgentConfig::parse("nodee = \"x\"\n").unwrap_err();
        assert!(err.contains("nodee"), "{err}");
        let err = AgentConfig::parse("[checks.gpu]\nfrobnicate = 1\n").unwrap_err();
        assert!(err.contains("frobnicate"), "{err}");
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let config = AgentConfig::parse(
            "node = \"a b\"\n[report]\nrepairer = \"ftp://x\"\ninterval = \"0s\"\n",
        )
        .unwrap();
        let problems = config.validate();
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert!(fields.contains(&"node"), "{problems}");
        assert!(fields.contains(&"report.repairer"), "{problems}");
        assert!(fields.contains(&"report.interval"), "{problems}");
    }

    #[test]
    fn commands_default_to_systemctl_reboot_and_no_probes() {
        let commands = AgentConfig::parse("").unwrap().commands;
        assert_eq!(commands.reboot, ["systemctl", "reboot"]);
        assert_eq!(commands.reboot_delay, Duration::from_secs(2));
        assert_eq!(commands.deep_check_timeout, Duration::from_secs(600));
        assert!(commands.deep_check_probes.is_empty());
    }

    #[test]
    fn bad_probes_are_refused_naming_the_field() {
        let config = AgentConfig::parse(
            "[commands]\nreboot = [\"\"]\ndeep_check_timeout = \"0s\"\n\
             [[commands.deep_check_probes]]\nname = \"nccl\"\nargv = []\ntimeout = \"0s\"\n\
             [[commands.deep_check_probes]]\nname = \"nccl\"\nargv = [\"true\"]\ntimeout = \"1s\"\n",
        )
        .unwrap();
        let problems = config.validate();
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "commands.reboot",
                "commands.deep_check_timeout",
                "commands.deep_check_probes[0].argv",
                "commands.deep_check_probes[0].timeout",
                "commands.deep_check_probes[1].name",
            ],
            "{problems}"
        );
        let refused = AgentConfig::parse("[commands]\nreboot = []\n").unwrap();
        assert!(refused.validate().is_empty(), "{}", refused.validate());
    }

    #[test]
    fn jobs_are_off_by_default_and_bad_fields_are_named() {
        let jobs = AgentConfig::parse("").unwrap().jobs;
        assert!(!jobs.enabled);
        assert_eq!(jobs.retain_exited, Duration::from_secs(600));
        assert_eq!(jobs.stop_grace, Duration::from_secs(30));
        assert_eq!(jobs.advertise_address, None);
        let config = AgentConfig::parse(
            "[jobs]\nenabled = true\ndir = \"\"\nretain_exited = \"0s\"\nstop_grace = \"0s\"\n\
             advertise_address = \"http://x\"\n",
        )
        .unwrap();
        let problems = config.validate();
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            ["jobs.dir", "jobs.retain_exited", "jobs.stop_grace", "jobs.advertise_address"],
            "{problems}"
        );
        let err = AgentConfig::parse("[jobs]\nenable = true\n").unwrap_err();
        assert!(err.contains("enable"), "{err}");
    }

    #[test]
    fn the_listener_has_the_agents_defaults_and_bad_fields_are_named() {
        let listener = AgentConfig::parse("").unwrap().listener;
        assert_eq!(listener, ListenerConfig::AGENT);
        assert_eq!(listener.header_timeout, Duration::from_secs(10));
        assert_eq!(listener.max_connections, 128);
        let config =
            AgentConfig::parse("[listener]\nidle_timeout = \"0s\"\nmax_connections = 0\n").unwrap();
        assert_eq!(config.listener.header_timeout, Duration::from_secs(10));
        let problems = config.validate();
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["listener.idle_timeout", "listener.max_connections"], "{problems}");
        let err = AgentConfig::parse("[listener]\nheader_timeout = 10\n").unwrap_err();
        assert!(err.contains("header_timeout"), "{err}");
    }

    #[test]
    fn the_repairer_is_one_url_or_a_list() {
        let one = AgentConfig::parse("[report]\nrepairer = \"http://r1:9830\"\n").unwrap();
        assert_eq!(one.report.repairer, Some(RepairerUrls::One("http://r1:9830".into())));
        assert!(one.validate().is_empty(), "{}", one.validate());
        let many = AgentConfig::parse(
            "[report]\nrepairer = [\"https://r1:9830\", \"https://r2:9830/\"]\n",
        )
        .unwrap();
        let urls = many.report.repairer.as_ref().unwrap();
        assert_eq!(urls.urls(), ["https://r1:9830", "https://r2:9830/"]);
        assert_eq!(urls.to_string(), "https://r1:9830,https://r2:9830/");
        assert!(many.validate().is_empty(), "{}", many.validate());
        assert_eq!(AgentConfig::parse("").unwrap().report.repairer, None);
        let err = AgentConfig::parse("[report]\nrepairer = 9830\n").unwrap_err();
        assert!(err.contains("a repairer base URL or a list of them"), "{err}");
        let err = AgentConfig::parse("[report]\nrepairer = [\"http://r1\", 2]\n").unwrap_err();
        assert!(err.contains("repairer"), "{err}");
    }

    #[test]
    fn a_bad_repairer_list_names_each_entry() {
        let config = AgentConfig::parse(
            "[report]\nrepairer = [\"http://r1:9830\", \"ftp://r2\", \"HTTP://R1:9830/\", \"\"]\n",
        )
        .unwrap();
        let problems = config.validate();
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            ["report.repairer[1]", "report.repairer[2]", "report.repairer[3]"],
            "{problems}"
        );
        assert!(problems.0[1].message.contains("same repairer as entry 0"), "{problems}");
        let empty = AgentConfig::parse("[report]\nrepairer = []\n").unwrap();
        let problems = empty.validate();
        assert!(problems.names("report.repairer"), "{problems}");
        let long = (0..17).map(|i| format!("\"http://r{i}:9830\"")).collect::<Vec<_>>().join(",");
        let config = AgentConfig::parse(&format!("[report]\nrepairer = [{long}]\n")).unwrap();
        let problems = config.validate();
        assert!(problems.names("report.repairer"), "{problems}");
        assert_eq!(
            RepairerUrls::from_list("http://a:1, http://b:2"),
            RepairerUrls::Many(vec!["http://a:1".into(), "http://b:2".into()])
        );
        assert_eq!(RepairerUrls::from_list("http://a:1"), RepairerUrls::One("http://a:1".into()));
    }

    #[test]
    fn rootfs_joins_absolute_paths() {
        let paths = HostPaths { rootfs: PathBuf::from("/fx/root"), ..HostPaths::default() };
        assert_eq!(paths.under_rootfs(Path::new("/scratch")), PathBuf::from("/fx/root/scratch"));
    }
}
