//! `[provider]`: which backend repairs nodes, and building it.
//!
//! ```toml
//! [provider]
//! kind = "command"
//! reboot = ["ipmitool", "-I", "lanplus", "-H", "{node}-bmc", "chassis", "power", "cycle"]
//! replace = "cloudctl replace {node} | tail -n1"
//! ```
//!
//! `kind = "slurm"` has no fields: it reboots with `scontrol reboot` using the `[slurm]` section.

use std::sync::Arc;

use serde::Deserialize;

use super::Provider;
use super::agent::{AgentProvider, AgentProviderConfig};
use super::command::{CommandProvider, CommandProviderConfig};
use super::redfish::{RedfishProvider, RedfishProviderConfig, RedfishSetupError};
use super::slurm::{SlurmProvider, SlurmProviderConfig};
use crate::commands::CommandQueue;
use crate::scheduler::slurm::SlurmConfig;

// The backends' validations (command, redfish) name it as this module's.
pub use fleetmend_proto::config_problem::ConfigProblem;

/// The provider backend and its settings, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ProviderConfig {
    /// The node's own agent runs its configured reboot command (no replace).
    Agent(AgentProviderConfig),
    /// Templated commands per action (`ipmitool`, a cloud CLI, a script).
    Command(CommandProviderConfig),
    /// The node's BMC over Redfish (no replace).
    Redfish(RedfishProviderConfig),
    /// Slurm's `scontrol reboot` and the nodes' `RebootProgram`, with the `[slurm]` section's
    /// settings (no replace).
    Slurm(SlurmProviderConfig),
}

impl Default for ProviderConfig {
    /// The agent backend: it needs no setup and works wherever agents report.
    fn default() -> ProviderConfig {
        ProviderConfig::Agent(AgentProviderConfig::default())
    }
}

impl ProviderConfig {
    /// The backend's name, as in `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderConfig::Agent(_) => "agent",
            ProviderConfig::Command(_) => "command",
            ProviderConfig::Redfish(_) => "redfish",
            ProviderConfig::Slurm(_) => "slurm",
        }
    }

    /// Every problem, naming fields under `section` (the table the config sits in, e.g.
    /// `provider`).
    pub fn validate(&self, section: &str) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        match self {
            // The slurm provider's settings are `[slurm]`'s, validated with that section.
            ProviderConfig::Agent(_) | ProviderConfig::Slurm(_) => {}
            ProviderConfig::Command(config) => config.validate(section, &mut problems),
            ProviderConfig::Redfish(config) => config.validate(section, &mut problems),
        }
        problems
    }
}

/// What the backends need from the rest of the repairer.
#[derive(Debug, Clone)]
pub struct ProviderDeps {
    /// Where the `agent` backend queues reboots for the nodes' next report replies.
    pub commands: Arc<CommandQueue>,
    /// How the `slurm` backend reaches Slurm (the `[slurm]` section).
    pub slurm: SlurmConfig,
}

impl ProviderDeps {
    /// Deps with `commands` and the default `[slurm]` settings.
    pub fn new(commands: Arc<CommandQueue>) -> ProviderDeps {
        ProviderDeps { commands, slurm: SlurmConfig::default() }
    }
}

/// Building the configured provider failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderBuildError {
    #[error("the {kind} provider's config has {} problem(s): {}", problems.len(), join(problems))]
    Invalid { kind: &'static str, problems: Vec<ConfigProblem> },
    #[error("setting up the redfish provider: {0}")]
    Redfish(#[from] RedfishSetupError),
}

fn join(problems: &[ConfigProblem]) -> String {
    problems.iter().map(ConfigProblem::to_string).collect::<Vec<_>>().join("; ")
}

/// Builds the configured provider (validating its config first, under the section `provider`).
pub fn build(
    config: &ProviderConfig,
    deps: &ProviderDeps,
) -> Result<Arc<dyn Provider>, ProviderBuildError> {
    let problems = config.validate("provider");
    if !problems.is_empty() {
        return Err(ProviderBuildError::Invalid { kind: config.kind(), problems });
    }
    Ok(match config {
        ProviderConfig::Agent(_) => Arc::new(AgentProvider::new(deps.commands.clone())),
        ProviderConfig::Command(config) => Arc::new(CommandProvider::new(config.clone())),
        ProviderConfig::Redfish(config) => Arc::new(RedfishProvider::new(config.clone())?),
        ProviderConfig::Slurm(_) => Arc::new(SlurmProvider::new(deps.slurm.clone())),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::provider::command::CommandTemplate;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        provider: ProviderConfig,
    }

    fn parse(text: &str) -> Result<ProviderConfig, toml::de::Error> {
        toml::from_str::<Doc>(text).map(|doc| doc.provider)
    }

    fn deps() -> ProviderDeps {
        ProviderDeps::new(Arc::new(CommandQueue::new()))
    }

    #[test]
    fn the_agent_backend_is_the_default() {
        assert_eq!(parse("").unwrap(), ProviderConfig::default());
        assert_eq!(parse("[provider]\nkind = \"agent\"").unwrap().kind(), "agent");
        assert_eq!(build(&ProviderConfig::default(), &deps()).unwrap().name(), "agent");
    }

    #[test]
    fn each_kind_reads_its_own_fields() {
        let command = parse(
            r#"
            [provider]
            kind = "command"
            reboot = ["ipmitool", "-H", "{node}-bmc", "chassis", "power", "cycle"]
            replace = "cloudctl replace {node}"
            reboot_timeout = "2m"
            "#,
        )
        .unwrap();
        let ProviderConfig::Command(config) = &command else { panic!("{command:?}") };
        assert_eq!(config.reboot_timeout, Duration::from_secs(120));
        assert_eq!(config.replace, Some(CommandTemplate::Shell("cloudctl replace {node}".into())));
        assert_eq!(build(&command, &deps()).unwrap().name(), "command");

        let redfish = parse(
            r#"
            [provider]
            kind = "redfish"
            system_url = "https://{node}-bmc/redfish/v1/Systems/1"
            user = "admin"
            password = "secret"
            insecure_tls = true
            "#,
        )
        .unwrap();
        assert_eq!(redfish.kind(), "redfish");
        assert_eq!(build(&redfish, &deps()).unwrap().name(), "redfish");

        let slurm = parse("[provider]\nkind = \"slurm\"").unwrap();
        assert_eq!(slurm, ProviderConfig::Slurm(SlurmProviderConfig {}));
        assert_eq!(build(&slurm, &deps()).unwrap().name(), "slurm");
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        for text in [
            "[provider]\nkind = \"agent\"\nreboot = \"x\"",
            "[provider]\nkind = \"command\"\nreboot = \"x\"\nreboot_timout = \"1s\"",
            "[provider]\nkind = \"redfish\"\nsystem_url = \"http://{node}/\"\nuser_name = \"a\"",
            "[provider]\nkind = \"local\"",
            "[provider]\nkind = \"slurm\"\nslurm_conf = \"/etc/slurm/slurm.conf\"",
            "[provider]\nkind = \"command\"",
        ] {
            assert!(parse(text).is_err(), "accepted {text:?}");
        }
    }

    #[test]
    fn build_refuses_an_invalid_config_naming_the_fields() {
        let config =
            parse("[provider]\nkind = \"command\"\nreboot = []\npower_state_timeout = \"0s\"")
                .unwrap();
        let error = build(&config, &deps()).err().unwrap();
        let message = error.to_string();
        assert!(message.contains("provider.reboot:"), "{message}");
        assert!(message.contains("provider.power_state_timeout:"), "{message}");
    }
}
