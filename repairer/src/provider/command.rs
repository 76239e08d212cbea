//! The `command` provider: each action runs a command from the config with `{node}` replaced by
//! the node's name (`ipmitool`, a cloud CLI, an in-house script).
//!
//! A command is an argv list (run directly, no shell) or one string run through `sh -c`. It runs in
//! its own process group, so a timeout kills everything it started, not only the first process. Its
//! stdout and stderr are captured, bounded, and the stderr tail goes into the error when it fails.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use fleetmend_process::{ProcessOutput, RunError};
use serde::Deserialize;

use super::config::ConfigProblem;
use super::{PowerState, Provider, ProviderError, check_substitutable_node_name};
use crate::scheduler::BoxFuture;

const PROVIDER: &str = "command";

/// The placeholder replaced by the node's name.
pub const NODE_PLACEHOLDER: &str = "{node}";

/// How much of each of stdout and stderr is kept (the tail: the end of the output says why it
/// failed, and `replace` prints the new name last).
pub const OUTPUT_CAPTURE_BYTES: usize = 64 * 1024;

/// How much of stderr goes into an error message.
const ERROR_STDERR_TAIL_BYTES: usize = 2 * 1024;

/// How long output is still read after the command exited. Something it left running in the
/// background may hold the pipes open; past this it is killed with the group.
const OUTPUT_DRAIN_GRACE: Duration = Duration::from_secs(2);

/// One configured command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CommandTemplate {
    /// Program and arguments, run directly: `["ipmitool", "-H", "{node}-bmc", "chassis", "power",
    /// "cycle"]`.
    Argv(Vec<String>),
    /// A shell line run with `sh -c`: `"cloudctl replace {node} | tail -n1"`.
    Shell(String),
}

impl CommandTemplate {
    /// The program and its arguments for `node` (which must already be checked substitutable).
    fn argv_for(&self, node: &str) -> Vec<String> {
        match self {
            CommandTemplate::Argv(argv) => {
                argv.iter().map(|arg| arg.replace(NODE_PLACEHOLDER, node)).collect()
            }
            CommandTemplate::Shell(line) => {
                vec!["sh".to_owned(), "-c".to_owned(), line.replace(NODE_PLACEHOLDER, node)]
            }
        }
    }

    /// The command for `node`, with `{node}` replaced; refuses names that could change its meaning.
    pub fn render(&self, node: &str) -> Result<Vec<String>, super::UnsafeNodeName> {
        check_substitutable_node_name(node)?;
        Ok(self.argv_for(node))
    }

    fn validate(&self, field: &str, problems: &mut Vec<ConfigProblem>) {
        match self {
            CommandTemplate::Argv(argv) => match argv.first() {
                None => problems.push(ConfigProblem::new(field, "the command list is empty")),
                Some(program) if program.trim().is_empty() => {
                    problems.push(ConfigProblem::new(field, "the program (first element) is empty"))
                }
                Some(_) => {}
            },
            CommandTemplate::Shell(line) if line.trim().is_empty() => {
                problems.push(ConfigProblem::new(field, "the shell command is empty"));
            }
            CommandTemplate::Shell(_) => {}
        }
    }
}

/// `[provider]` with `kind = "command"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandProviderConfig {
    /// Reboots the node; exit 0 means the reboot was accepted.
    pub reboot: CommandTemplate,
    /// Replaces the node; the last non-empty line of its stdout is the new node's name. Without it,
    /// replace is unsupported.
    #[serde(default)]
    pub replace: Option<CommandTemplate>,
    /// Prints the node's power state (`on`, `off`, `powering-on`, `powering-off`, `unknown`; the
    /// last word of the last line counts, so `ipmitool chassis power status` works). Without it the
    /// power state is unknown.
    #[serde(default)]
    pub power_state: Option<CommandTemplate>,
    /// How long the reboot command may run before its process group is killed.
    #[serde(default = "default_reboot_timeout", with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// How long the replace command may run (provisioning a node is slow).
    #[serde(default = "default_replace_timeout", with = "humantime_serde")]
    pub replace_timeout: Duration,
    /// How long the power-state command may run.
    #[serde(default = "default_power_state_timeout", with = "humantime_serde")]
    pub power_state_timeout: Duration,
}

fn default_reboot_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}

fn default_replace_timeout() -> Duration {
    Duration::from_secs(30 * 60)
}

fn default_power_state_timeout() -> Duration {
    Duration::from_secs(30)
}

impl CommandProviderConfig {
    /// A config that runs `reboot` with the default timeouts and nothing else.
    pub fn new(reboot: CommandTemplate) -> CommandProviderConfig {
        CommandProviderConfig {
            reboot,
            replace: None,
            power_state: None,
            reboot_timeout: default_reboot_timeout(),
            replace_timeout: default_replace_timeout(),
            power_state_timeout: default_power_state_timeout(),
        }
    }

    /// Adds every problem, naming fields under `section` (e.g. `provider`).
    pub fn validate(&self, section: &str, problems: &mut Vec<ConfigProblem>) {
        self.reboot.validate(&format!("{section}.reboot"), problems);
        if let Some(replace) = &self.replace {
            replace.validate(&format!("{section}.replace"), problems);
        }
        if let Some(power_state) = &self.power_state {
            power_state.validate(&format!("{section}.power_state"), problems);
        }
        for (field, value) in [
            ("reboot_timeout", self.reboot_timeout),
            ("replace_timeout", self.replace_timeout),
            ("power_state_timeout", self.power_state_timeout),
        ] {
            if value.is_zero() {
                problems.push(ConfigProblem::new(
                    format!("{section}.{field}"),
                    "must be greater than zero",
                ));
            }
        }
    }
}

/// Runs `argv` with a timeout, in its own process group, stdin closed, output captured (the last
/// [`OUTPUT_CAPTURE_BYTES`] of each stream). `env` is added to the inherited environment.
pub async fn run_command(
    argv: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<ProcessOutput, RunError> {
    let program = argv.first().map(String::as_str).unwrap_or_default();
    let mut command = tokio::process::Command::new(program);
    command.args(argv.iter().skip(1)).envs(env.iter().copied());
    let options = fleetmend_process::Options {
        tail_bytes: OUTPUT_CAPTURE_BYTES,
        output_grace: OUTPUT_DRAIN_GRACE,
        // A cancelled or finished workflow must not leave an `ipmitool` behind.
        leftovers: fleetmend_process::Leftovers::Kill,
        ..fleetmend_process::Options::new(timeout)
    };
    fleetmend_process::run(command, &options).await
}

/// "exit code 3" / "killed by signal 9".
fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "an unknown exit status".to_owned(),
    }
}

/// The end of `text`, at most `max` bytes, cut at a character boundary.
fn tail_of(text: &str, max: usize) -> &str {
    let text = text.trim_end();
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The last non-empty line of `stdout`, trimmed.
fn last_line(stdout: &str) -> Option<&str> {
    stdout.lines().map(str::trim).rfind(|line| !line.is_empty())
}

/// Reads a power state from a command's output: the last line, whole or its last word.
pub fn parse_power_state(stdout: &str) -> Option<PowerState> {
    let line = last_line(stdout)?.to_ascii_lowercase();
    let word = line.split_whitespace().last().unwrap_or_default();
    [line.as_str(), word].into_iter().find_map(|candidate| {
        match candidate.replace(['_', ' '], "-").as_str() {
            "on" => Some(PowerState::On),
            "off" => Some(PowerState::Off),
            "powering-on" | "poweringon" => Some(PowerState::PoweringOn),
            "powering-off" | "poweringoff" => Some(PowerState::PoweringOff),
            "unknown" => Some(PowerState::Unknown),
            _ => None,
        }
    })
}

/// Runs templated commands.
#[derive(Debug, Clone)]
pub struct CommandProvider {
    config: CommandProviderConfig,
}

impl CommandProvider {
    pub fn new(config: CommandProviderConfig) -> CommandProvider {
        CommandProvider { config }
    }

    /// Runs `template` for `node`; a non-zero exit is an error naming the exit code and the
    /// stderr tail.
    async fn run(
        &self,
        operation: &'static str,
        template: &CommandTemplate,
        node: &str,
        timeout: Duration,
    ) -> Result<ProcessOutput, ProviderError> {
        let failed = |message: String| ProviderError::Failed {
            provider: PROVIDER,
            operation,
            node: node.to_owned(),
            message,
        };
        let argv = template.render(node).map_err(|unsafe_name| failed(unsafe_name.to_string()))?;
        // Only the program: arguments may carry a BMC password (`ipmitool -P`).
        let program = argv.first().map(String::as_str).unwrap_or_default();
        tracing::info!(node, operation, program, "running the provider command");
        let env = [("FLEETMEND_NODE", node), ("FLEETMEND_OPERATION", operation)];
        let output = match run_command(&argv, &env, timeout).await {
            Ok(output) => output,
            Err(RunError::TimedOut { stderr, .. }) => {
                tracing::warn!(
                    node,
                    operation,
                    stderr = tail_of(&stderr.text(), ERROR_STDERR_TAIL_BYTES),
                    "the provider command timed out; its process group was killed"
                );
                return Err(ProviderError::Timeout {
                    provider: PROVIDER,
                    operation,
                    node: node.to_owned(),
                    seconds: timeout.as_secs(),
                });
            }
            Err(error) => return Err(failed(error.to_string())),
        };
        if !output.status.success() {
            let stderr = output.stderr.text();
            let stderr = tail_of(&stderr, ERROR_STDERR_TAIL_BYTES);
            let stderr = if stderr.is_empty() { "(no stderr)" } else { stderr };
            return Err(failed(format!(
                "{program:?} failed with {}: {stderr}",
                describe_status(output.status)
            )));
        }
        Ok(output)
    }
}

impl Provider for CommandProvider {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.run("reboot", &self.config.reboot, node, self.config.reboot_timeout).await?;
            Ok(())
        })
    }

    fn replace<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<String, ProviderError>> {
        Box::pin(async move {
            let Some(template) = &self.config.replace else {
                return Err(ProviderError::Unsupported {
                    provider: PROVIDER,
                    operation: "replace",
                    node: node.to_owned(),
                });
            };
            let output = self.run("replace", template, node, self.config.replace_timeout).await?;
            let failed = |message: String| ProviderError::Failed {
                provider: PROVIDER,
                operation: "replace",
                node: node.to_owned(),
                message,
            };
            let stdout = output.stdout.text();
            let Some(new_node) = last_line(&stdout) else {
                return Err(failed(
                    "the replace command exited 0 but printed no new node name".to_owned(),
                ));
            };
            // The new name is used in later commands and URLs: hold it to the same rule.
            check_substitutable_node_name(new_node).map_err(|unsafe_name| {
                failed(format!("the replace command printed an unusable node name: {unsafe_name}"))
            })?;
            Ok(new_node.to_owned())
        })
    }

    fn power_state<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<PowerState, ProviderError>> {
        Box::pin(async move {
            let Some(template) = &self.config.power_state else {
                return Ok(PowerState::Unknown);
            };
            let output =
                self.run("power_state", template, node, self.config.power_state_timeout).await?;
            let stdout = output.stdout.text();
            parse_power_state(&stdout).ok_or_else(|| ProviderError::Failed {
                provider: PROVIDER,
                operation: "power_state",
                node: node.to_owned(),
                message: format!(
                    "cannot read a power state (on, off, powering-on, powering-off, unknown) \
                     from the output {:?}",
                    tail_of(&stdout, 200)
                ),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|p| (*p).to_owned()).collect()
    }

    #[test]
    fn node_is_substituted_in_every_argument() {
        let template = CommandTemplate::Argv(argv(&[
            "ipmitool",
            "-H",
            "{node}-bmc",
            "chassis",
            "power",
            "cycle",
            "{node}:{node}",
        ]));
        assert_eq!(
            template.render("gpu7").unwrap(),
            argv(&["ipmitool", "-H", "gpu7-bmc", "chassis", "power", "cycle", "gpu7:gpu7"])
        );
        let shell = CommandTemplate::Shell("cloud replace {node} | awk '{print $2}'".to_owned());
        assert_eq!(
            shell.render("gpu7").unwrap(),
            argv(&["sh", "-c", "cloud replace gpu7 | awk '{print $2}'"])
        );
    }

    #[test]
    fn unsafe_node_names_are_refused_before_anything_runs() {
        let shell = CommandTemplate::Shell("echo {node}".to_owned());
        for node in ["a;reboot", "a b", "$(id)", "-x", "a'b", ""] {
            assert!(shell.render(node).is_err(), "{node:?} was substituted");
        }
    }

    #[test]
    fn templates_parse_as_argv_lists_or_shell_strings() {
        #[derive(Deserialize)]
        struct Doc {
            a: CommandTemplate,
            b: CommandTemplate,
        }
        let doc: Doc = toml::from_str("a = [\"x\", \"{node}\"]\nb = \"x {node}\"").unwrap();
        assert_eq!(doc.a, CommandTemplate::Argv(argv(&["x", "{node}"])));
        assert_eq!(doc.b, CommandTemplate::Shell("x {node}".to_owned()));
    }

    #[test]
    fn validate_names_empty_commands_and_zero_timeouts() {
        let mut config = CommandProviderConfig::new(CommandTemplate::Argv(Vec::new()));
        config.replace = Some(CommandTemplate::Shell("  ".to_owned()));
        config.power_state = Some(CommandTemplate::Argv(argv(&[""])));
        config.replace_timeout = Duration::ZERO;
        let mut problems = Vec::new();
        config.validate("provider", &mut problems);
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "provider.reboot",
                "provider.replace",
                "provider.power_state",
                "provider.replace_timeout"
            ]
        );
    }

    #[test]
    fn power_states_are_read_from_the_last_line() {
        assert_eq!(parse_power_state("on\n"), Some(PowerState::On));
        assert_eq!(parse_power_state("Chassis Power is off\n\n"), Some(PowerState::Off));
        assert_eq!(parse_power_state("noise\nPowering-On"), Some(PowerState::PoweringOn));
        assert_eq!(parse_power_state("powering off"), Some(PowerState::PoweringOff));
        assert_eq!(parse_power_state("UNKNOWN"), Some(PowerState::Unknown));
        assert_eq!(parse_power_state("it is complicated"), None);
        assert_eq!(parse_power_state(""), None);
    }

    #[tokio::test]
    async fn non_zero_exit_names_the_code_and_the_stderr_tail() {
        let mut config = CommandProviderConfig::new(CommandTemplate::Shell(
            "echo 'bmc {node}-bmc unreachable' >&2; exit 3".to_owned(),
        ));
        config.reboot_timeout = Duration::from_secs(20);
        let error = CommandProvider::new(config).reboot("n1").await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains("exit code 3"), "{message}");
        assert!(message.contains("bmc n1-bmc unreachable"), "{message}");
    }

    #[tokio::test]
    async fn replace_returns_the_last_non_empty_line() {
        let mut config = CommandProviderConfig::new(CommandTemplate::Shell("true".to_owned()));
        config.replace =
            Some(CommandTemplate::Shell("echo provisioning {node}; echo n1-new; echo".to_owned()));
        let provider = CommandProvider::new(config);
        assert_eq!(provider.replace("n1").await.unwrap(), "n1-new");
    }

    #[tokio::test]
    async fn unconfigured_actions_are_unsupported_or_unknown() {
        let provider =
            CommandProvider::new(CommandProviderConfig::new(CommandTemplate::Shell("true".into())));
        assert!(matches!(
            provider.replace("n1").await,
            Err(ProviderError::Unsupported { operation: "replace", .. })
        ));
        assert_eq!(provider.power_state("n1").await.unwrap(), PowerState::Unknown);
    }
}
