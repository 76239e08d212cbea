//! The repairer's configuration: one TOML file (`fleetmend repairer --config FILE`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use fleetmend_listener::ListenerConfig;
use serde::Deserialize;

use crate::access::{Credential, Role};
use crate::alerts::AlertsConfig;
use crate::allreduce::AllreduceConfig;
use crate::engine::EngineConfig;
use crate::inbound::InboundConfig;
use crate::limits::RateLimitsConfig;
use crate::policy::Policy;
use crate::provider::config::ProviderConfig;
pub use crate::workflow::trace::TelemetryConfig;

/// The whole repairer configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RepairerConfig {
    /// Address of the API, the agents' report endpoint, the alert webhooks and `/metrics`.
    pub listen: SocketAddr,
    /// Deadlines and the connection cap of that listener (`[listener]`).
    #[serde(deserialize_with = "ListenerConfig::repairer")]
    pub listener: ListenerConfig,
    /// Requests a second per credential, and per peer address without one (`[rate_limits]`).
    pub rate_limits: RateLimitsConfig,
    /// Allow listening on a non-loopback address without TLS or tokens (a lab; never
    /// production); said at start. `fleetmend repairer --insecure` sets it.
    pub insecure: bool,
    /// TLS on the listener (`[tls] cert`, `key`): required on a non-loopback address unless
    /// `insecure`.
    pub tls: Option<crate::tls::TlsConfig>,
    /// Where the store lives: a SQLite file path (created if missing; one repairer), or a
    /// PostgreSQL database, `postgres://USER[:PASSWORD]@HOST:PORT/DB` (also `postgresql://` and
    /// key=value conninfo such as `host=H port=P dbname=D user=U`), which several repairers can
    /// share. A password in it is never logged.
    pub store: crate::store::StoreLocation,
    /// Bearer token agents send with reports (or `agent_token_file`).
    pub agent_token: Option<String>,
    pub agent_token_file: Option<PathBuf>,
    /// Per-node identity instead of the one agent token: the SHA-256 of each node's own token,
    /// `NODE = "HEX"` lines (`fleetmend token issue` writes them), read again when the file
    /// changes. A report for node X is then accepted only with X's token.
    pub node_tokens_file: Option<PathBuf>,
    /// Bearer token of the admin API and the CLI (or `admin_token_file`).
    pub admin_token: Option<String>,
    pub admin_token_file: Option<PathBuf>,
    /// People's and tools' named credentials, each with a role (`read`, `operator`, `admin`):
    /// the audit trail names the credential that acted. `admin_token` is one more, named
    /// `admin` (the `x-fleetmend-user` header may name the person using it).
    pub credentials: Vec<crate::access::CredentialConfig>,
    /// Token accepted by the inbound alert webhooks, as a bearer token or as `?token=` (SNS cannot
    /// send headers). Default: the agent token.
    pub alerts_token: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Which scheduler the repairer drives: `embedded` (the default) runs the bundled job queue
    /// (`[queue]`); `slurm` drives a Slurm cluster (`[slurm]`); `memory` is a stand-in that keeps
    /// drains in the repairer's memory only, for dry runs of a policy and tests.
    pub scheduler: SchedulerKind,
    /// The embedded job queue (used when `scheduler = "embedded"`).
    pub queue: crate::queue::QueueConfig,
    /// How to reach Slurm (used when `scheduler = "slurm"`).
    pub slurm: crate::scheduler::slurm::SlurmConfig,
    pub policy: Policy,
    pub engine: EngineConfig,
    pub provider: ProviderConfig,
    pub alerts: AlertsConfig,
    pub inbound: InboundConfig,
    pub telemetry: TelemetryConfig,
    /// The allreduce probe of nodes against the fleet (`[allreduce]`).
    pub allreduce: AllreduceConfig,
    /// Which nodes exist (`[inventory]`): names, hostlist patterns, a file or Slurm's node list.
    /// Absent: every node that reports is in the fleet and counts in the guard rails' shares.
    pub inventory: Option<crate::inventory::InventoryConfig>,
    /// How repairers sharing a PostgreSQL store take turns leading (`[leadership]`).
    pub leadership: crate::leadership::LeadershipConfig,
}

/// The scheduler backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerKind {
    /// A stand-in: drains kept in memory, no jobs (dry runs, tests).
    Memory,
    /// The bundled job queue, inside the repairer.
    #[default]
    Embedded,
    /// A Slurm cluster, through its client commands (`[slurm]`).
    Slurm,
}

impl Default for RepairerConfig {
    fn default() -> Self {
        RepairerConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 9830)),
            listener: ListenerConfig::REPAIRER,
            rate_limits: RateLimitsConfig::default(),
            insecure: false,
            tls: None,
            store: PathBuf::from("/var/lib/fleetmend/repairer.db").into(),
            agent_token: None,
            agent_token_file: None,
            node_tokens_file: None,
            admin_token: None,
            admin_token_file: None,
            credentials: Vec::new(),
            alerts_token: None,
            max_body_bytes: 1 << 20,
            scheduler: SchedulerKind::Embedded,
            queue: crate::queue::QueueConfig::default(),
            slurm: crate::scheduler::slurm::SlurmConfig::default(),
            policy: Policy::default(),
            engine: EngineConfig::default(),
            provider: ProviderConfig::default(),
            alerts: AlertsConfig::default(),
            inbound: InboundConfig::default(),
            telemetry: TelemetryConfig::default(),
            allreduce: AllreduceConfig::default(),
            inventory: None,
            leadership: Default::default(),
        }
    }
}

/// Loading the config failed.
#[derive(Debug, thiserror::Error)]
pub enum RepairerConfigError {
    #[error("reading config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path} has {} problem(s):\n{}", problems.len(), problems.iter().map(|(f, m)| format!("  {f}: {m}")).collect::<Vec<_>>().join("\n"))]
    Invalid { path: PathBuf, problems: Vec<(String, String)> },
}

/// The secrets, read from the config or their files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    pub agent: Option<String>,
    /// `admin_token`, which is also among `people` (named `admin`).
    pub admin: Option<String>,
    pub alerts: Option<String>,
    /// Every person's or tool's credential (`[[credentials]]` and `admin_token`).
    pub people: Vec<crate::access::Credential>,
}

impl RepairerConfig {
    pub fn load(path: &Path) -> Result<RepairerConfig, RepairerConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| RepairerConfigError::Read { path: path.to_owned(), source })?;
        let config = RepairerConfig::parse(&text)
            .map_err(|message| RepairerConfigError::Parse { path: path.to_owned(), message })?;
        config.validated(path)
    }

    pub fn parse(text: &str) -> Result<RepairerConfig, String> {
        toml::from_str(text).map_err(|err| err.to_string().trim_end().to_owned())
    }

    pub fn validated(self, path: &Path) -> Result<RepairerConfig, RepairerConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(RepairerConfigError::Invalid { path: path.to_owned(), problems })
        }
    }

    /// Every problem, naming its field.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push =
            |field: &str, message: &str| problems.push((field.to_owned(), message.to_owned()));
        if self.agent_token.is_some() && self.agent_token_file.is_some() {
            push("agent_token_file", "set either agent_token or agent_token_file, not both");
        }
        if self.admin_token.is_some() && self.admin_token_file.is_some() {
            push("admin_token_file", "set either admin_token or admin_token_file, not both");
        }
        let shared = self.agent_token.is_some() || self.agent_token_file.is_some();
        if shared && self.node_tokens_file.is_some() {
            push(
                "node_tokens_file",
                "set either node_tokens_file (a token per node) or agent_token(_file) (one for all), not both",
            );
        }
        let has_agent = shared || self.node_tokens_file.is_some();
        let has_admin = self.admin_token.is_some()
            || self.admin_token_file.is_some()
            || !self.credentials.is_empty();
        let open_to_the_network = !self.listen.ip().is_loopback() && !self.insecure;
        if open_to_the_network && !(has_agent && has_admin) {
            push(
                "listen",
                "a non-loopback address needs agent tokens and people's credentials (admin_token or [[credentials]]; or `insecure = true` for a lab)",
            );
        }
        if open_to_the_network && self.tls.is_none() {
            push(
                "listen",
                "a non-loopback address needs TLS ([tls] cert and key; or `insecure = true` / --insecure for plain HTTP in a lab)",
            );
        }
        if self.tls.as_ref().is_some_and(|t| t.handshake_timeout.is_some()) {
            push(
                "tls.handshake_timeout",
                "replaced by listener.header_timeout: the handshake and the first request's head now share that deadline",
            );
        }
        if open_to_the_network && self.node_tokens_file.is_some() && self.alerts_token.is_none() {
            push(
                "alerts_token",
                "with node_tokens_file the inbound alert webhooks need a token of their own",
            );
        }
        let mut names = std::collections::BTreeSet::new();
        let mut credential_problems = Vec::new();
        for (i, credential) in self.credentials.iter().enumerate() {
            credential_problems.extend(credential.problems(i));
            let taken = (self.admin_token.is_some() || self.admin_token_file.is_some())
                && credential.name == "admin";
            if !names.insert(credential.name.as_str()) || taken {
                credential_problems.push((
                    format!("credentials[{i}].name"),
                    format!(
                        "{:?} is named twice (admin_token is named \"admin\")",
                        credential.name
                    ),
                ));
            }
        }
        if self.max_body_bytes < 1024 {
            push("max_body_bytes", "must be at least 1024");
        }
        if self.engine.unreachable_after == 0 {
            push("engine.unreachable_after", "must be at least 1");
        }
        if self.engine.report_interval.is_zero() {
            push("engine.report_interval", "must be greater than zero");
        }
        if self.engine.tick.is_zero() {
            push("engine.tick", "must be greater than zero");
        }
        problems.extend(self.listener.problems("listener"));
        problems.extend(self.rate_limits.problems("rate_limits"));
        problems.extend(self.queue.problems("queue"));
        problems.extend(self.allreduce.problems("allreduce"));
        problems.extend(self.slurm.problems("slurm"));
        if let Some(inventory) = &self.inventory {
            let slurm = self.scheduler == SchedulerKind::Slurm;
            problems.extend(inventory.problems("inventory", slurm));
        }
        problems.extend(self.policy.problems("policy"));
        problems.extend(
            self.provider
                .validate("provider")
                .into_iter()
                .map(|p| (p.field.clone(), p.message.clone())),
        );
        self.alerts.validate("alerts", &mut problems);
        problems.extend(self.inbound.validate("inbound"));
        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            problems.push((
                "telemetry.otlp_endpoint".to_owned(),
                format!("{endpoint:?} is not an http(s) URL"),
            ));
        }
        if self.telemetry.service_name.trim().is_empty() {
            problems.push(("telemetry.service_name".to_owned(), "must not be empty".to_owned()));
        }
        if self.telemetry.export_timeout.is_zero() {
            problems.push((
                "telemetry.export_timeout".to_owned(),
                "must be greater than zero".to_owned(),
            ));
        }
        problems.extend(credential_problems);
        problems.extend(self.leadership.problems());
        problems
    }

    /// Reads the tokens (inline or from files).
    pub fn tokens(&self) -> Result<Tokens, RepairerConfigError> {
        let read = |inline: &Option<String>,
                    file: &Option<PathBuf>|
         -> Result<Option<String>, RepairerConfigError> {
            match (inline, file) {
                (Some(token), _) => Ok(Some(token.clone())),
                (None, Some(path)) => std::fs::read_to_string(path)
                    .map(|t| Some(t.trim().to_owned()))
                    .map_err(|source| RepairerConfigError::Read { path: path.clone(), source }),
                (None, None) => Ok(None),
            }
        };
        let agent = read(&self.agent_token, &self.agent_token_file)?;
        let admin = read(&self.admin_token, &self.admin_token_file)?;
        let alerts = self.alerts_token.clone().or_else(|| agent.clone());
        let mut people = Vec::new();
        if let Some(token) = &admin {
            people.push(Credential::from_token("admin", Role::Admin, token));
        }
        for entry in &self.credentials {
            let sha256 = match (&entry.sha256, &entry.token_file) {
                (Some(digest), _) => digest.to_ascii_lowercase(),
                (None, file) => match read(&None, file)? {
                    Some(token) => crate::identity::hash(&token),
                    None => continue,
                },
            };
            people.push(Credential { name: entry.name.clone(), role: entry.role, sha256 });
        }
        Ok(Tokens { agent, admin, alerts, people })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_need_tokens_off_loopback() {
        let config = RepairerConfig::parse("").unwrap();
        let problems = config.problems();
        let fields: Vec<&str> = problems.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(fields, ["listen", "listen"], "{problems:?}");
        assert!(problems[0].1.contains("credentials") && problems[1].1.contains("TLS"));
        let insecure = RepairerConfig::parse("insecure = true").unwrap();
        assert!(insecure.problems().is_empty(), "{:?}", insecure.problems());
        let config = RepairerConfig::parse("listen = \"127.0.0.1:9830\"").unwrap();
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        let config = RepairerConfig::parse(
            "agent_token = \"a\"\nadmin_token = \"b\"\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"",
        )
        .unwrap();
        assert!(config.problems().is_empty(), "{:?}", config.problems());
    }

    #[test]
    fn the_slurm_scheduler_and_its_section_parse_and_validate() {
        let config = RepairerConfig::parse(
            "listen = \"127.0.0.1:9830\"\nscheduler = \"slurm\"\n[slurm]\n\
             slurm_conf = \"/etc/slurm/slurm.conf\"\ncommand_timeout = \"5s\"\n\
             [slurm.node_names]\n\"gpu-a\" = \"a1\"",
        )
        .unwrap();
        assert_eq!(config.scheduler, SchedulerKind::Slurm);
        assert_eq!(config.slurm.command_timeout, std::time::Duration::from_secs(5));
        assert_eq!(config.slurm.node_names.get("gpu-a").map(String::as_str), Some("a1"));
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        let config =
            RepairerConfig::parse("listen = \"127.0.0.1:9830\"\n[slurm]\ncommand_timeout = \"0s\"")
                .unwrap();
        let fields: Vec<String> = config.problems().into_iter().map(|p| p.0).collect();
        assert_eq!(fields, ["slurm.command_timeout"]);
        assert!(RepairerConfig::parse("[slurm]\nbinaries = \"/usr\"").is_err());
    }

    #[test]
    fn the_embedded_queue_is_the_default_and_names_this_host_on_an_unspecified_address() {
        let config = RepairerConfig::parse(
            "agent_token = \"a\"\nadmin_token = \"b\"\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"",
        )
        .unwrap();
        assert_eq!(config.scheduler, SchedulerKind::Embedded);
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        let any: std::net::SocketAddr = "0.0.0.0:9830".parse().unwrap();
        assert_eq!(config.queue.progress_base(any, "repairer-1"), "http://repairer-1:9830");
        let loopback: std::net::SocketAddr = "127.0.0.1:9830".parse().unwrap();
        assert_eq!(config.queue.progress_base(loopback, "repairer-1"), "http://127.0.0.1:9830");
        let config = RepairerConfig::parse(
            "listen = \"127.0.0.1:9830\"\nscheduler = \"embedded\"\n[queue]\nstart_timeout = \"0s\"\nprogress_base_url = \"https://fleet.example:9830\"",
        )
        .unwrap();
        assert_eq!(config.queue.progress_base(any, "repairer-1"), "https://fleet.example:9830");
        let fields: Vec<String> = config.problems().into_iter().map(|p| p.0).collect();
        assert_eq!(fields, ["queue.start_timeout"]);
    }

    #[test]
    fn the_listener_and_rate_limits_have_defaults_for_a_large_fleet_and_name_bad_fields() {
        let config = RepairerConfig::parse("listen = \"127.0.0.1:9830\"").unwrap();
        assert_eq!(config.listener, ListenerConfig::REPAIRER);
        assert_eq!(config.listener.header_timeout, std::time::Duration::from_secs(10));
        assert_eq!(config.listener.max_connections, 16_384);
        assert_eq!(config.rate_limits, RateLimitsConfig::default());
        let config = RepairerConfig::parse(
            "listen = \"127.0.0.1:9830\"\n[listener]\nheader_timeout = \"2s\"\nbody_timeout = \"0s\"\n\
             [rate_limits]\nnode = { per_second = 0.5, burst = 0 }\n\
             [tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nhandshake_timeout = \"5s\"",
        )
        .unwrap();
        assert_eq!(config.listener.header_timeout, std::time::Duration::from_secs(2));
        assert_eq!(config.listener.idle_timeout, std::time::Duration::from_secs(30));
        assert_eq!(config.rate_limits.node.per_second, 0.5);
        assert_eq!(config.rate_limits.person, RateLimitsConfig::default().person);
        let fields: Vec<String> = config.problems().into_iter().map(|p| p.0).collect();
        assert_eq!(
            fields,
            ["tls.handshake_timeout", "listener.body_timeout", "rate_limits.node.burst"]
        );
        let err = RepairerConfig::parse("[rate_limits.node]\nper_second = 1.0\n").unwrap_err();
        assert!(err.contains("burst"), "{err}");
        let err = RepairerConfig::parse("[listener]\nmax_conections = 5\n").unwrap_err();
        assert!(err.contains("max_conections"), "{err}");
    }

    #[test]
    fn the_inventory_is_optional_typed_and_validated_by_field() {
        let config = RepairerConfig::parse("listen = \"127.0.0.1:9830\"").unwrap();
        assert_eq!(config.inventory, None, "no [inventory]: every reporting node is in the fleet");
        let config = RepairerConfig::parse(
            "listen = \"127.0.0.1:9830\"\n[inventory]\nnodes = [\"gpu-[001-128]\", \"cpu[1-3]\"]\n\
             unknown_nodes = \"admit\"\nmax_unknown = 50",
        )
        .unwrap();
        let inventory = config.inventory.as_ref().unwrap();
        assert_eq!(inventory.unknown_nodes, crate::inventory::UnknownNodes::Admit);
        assert_eq!(inventory.max_unknown, 50);
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        let config = RepairerConfig::parse(
            "listen = \"127.0.0.1:9830\"\n[inventory]\nnodes = [\"gpu-[001-\"]\nslurm = true",
        )
        .unwrap();
        let problems = config.problems();
        let fields: Vec<&str> = problems.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(fields, ["inventory.nodes[0]", "inventory.slurm"], "{problems:?}");
        assert!(problems[0].1.contains("position 5"), "{problems:?}");
        let err = RepairerConfig::parse("[inventory]\nnode = [\"a\"]").unwrap_err();
        assert!(err.contains("node"), "{err}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = RepairerConfig::parse("[policy]\nmodee = \"enforce\"").unwrap_err();
        assert!(err.contains("modee"), "{err}");
    }
}
