//! The `command` provider: each action runs a command from the config with `{node}` replaced by
//! the node's name (`ipmitool`, a cloud CLI, an in-house script).
//!
//! A command is an argv list (run directly, no shell) or one string run through `sh -c`. It runs in
//! its own process group, so a timeout kills everything it started, not only the first process. Its
//! stdout and stderr are captured, bounded, and the stderr tail goes into the error when it fails.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

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

/// How long reaping a SIGKILLed process may take before it is left to tokio's orphan reaper.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

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

/// What a finished command printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    pub status: ExitStatus,
    /// The last [`OUTPUT_CAPTURE_BYTES`] of stdout (lossy UTF-8).
    pub stdout: String,
    /// The last [`OUTPUT_CAPTURE_BYTES`] of stderr (lossy UTF-8).
    pub stderr: String,
    /// More was printed than was kept.
    pub truncated: bool,
}

/// Running one command failed before it could finish on its own.
#[derive(Debug, thiserror::Error)]
pub enum RunCommandError {
    #[error("starting {program:?}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("waiting for {program:?}: {source}")]
    Wait { program: String, source: std::io::Error },
    /// It ran past its timeout and its process group was killed; what it printed until then.
    #[error("{program:?} ran longer than {timeout:?} and was killed")]
    TimedOut { program: String, timeout: Duration, stdout: String, stderr: String },
}

/// Keeps the tail of a stream.
#[derive(Debug, Default)]
struct OutputTail {
    bytes: Vec<u8>,
    dropped: bool,
}

impl OutputTail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        // Trim in batches so a chatty command costs amortised O(1) per byte.
        if self.bytes.len() > 2 * OUTPUT_CAPTURE_BYTES {
            let excess = self.bytes.len() - OUTPUT_CAPTURE_BYTES;
            self.bytes.drain(..excess);
            self.dropped = true;
        }
    }

    fn snapshot(&self) -> (String, bool) {
        let start = self.bytes.len().saturating_sub(OUTPUT_CAPTURE_BYTES);
        (String::from_utf8_lossy(&self.bytes[start..]).into_owned(), self.dropped || start > 0)
    }
}

type SharedTail = Arc<Mutex<OutputTail>>;

fn lock(tail: &SharedTail) -> std::sync::MutexGuard<'_, OutputTail> {
    tail.lock().unwrap_or_else(PoisonError::into_inner)
}

fn spawn_reader<R>(pipe: Option<R>, tail: SharedTail) -> Option<JoinHandle<()>>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let mut pipe = pipe?;
    Some(tokio::spawn(async move {
        let mut buffer = vec![0_u8; 8192];
        loop {
            match pipe.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => lock(&tail).push(&buffer[..n]),
            }
        }
    }))
}

/// Kills the command's whole process group unless disarmed: on timeout, and when the future running
/// the command is dropped (a cancelled workflow must not leave an `ipmitool` behind).
#[derive(Debug)]
struct ProcessGroup {
    pgid: Option<nix::unistd::Pid>,
}

impl ProcessGroup {
    fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // ESRCH (the group is gone already) is the outcome we want.
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits for the readers until `deadline`, then kills what still holds the pipes and keeps what
/// was read.
async fn drain_readers(readers: Vec<JoinHandle<()>>, deadline: Instant, group: &ProcessGroup) {
    for reader in readers {
        let abort = reader.abort_handle();
        if tokio::time::timeout_at(deadline, reader).await.is_err() {
            // Something the command started is still holding its stdout or stderr.
            group.kill();
            abort.abort();
        }
    }
}

/// Runs `argv` with a timeout, in its own process group, stdin closed, output captured.
/// `env` is added to the inherited environment.
pub async fn run_command(
    argv: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<CommandOutput, RunCommandError> {
    let program = argv.first().cloned().unwrap_or_default();
    let mut command = tokio::process::Command::new(&program);
    command
        .args(argv.iter().skip(1))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so killing the group reaches everything it started.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|source| RunCommandError::Spawn { program: program.clone(), source })?;
    let mut group = ProcessGroup {
        pgid: child.id().and_then(|id| i32::try_from(id).ok()).map(nix::unistd::Pid::from_raw),
    };
    let stdout_tail = SharedTail::default();
    let stderr_tail = SharedTail::default();
    let readers: Vec<JoinHandle<()>> = [
        spawn_reader(child.stdout.take(), stdout_tail.clone()),
        spawn_reader(child.stderr.take(), stderr_tail.clone()),
    ]
    .into_iter()
    .flatten()
    .collect();

    let deadline = Instant::now() + timeout;
    let status = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(source)) => {
            group.kill();
            return Err(RunCommandError::Wait { program, source });
        }
        Err(_elapsed) => {
            group.kill();
            let _ = tokio::time::timeout(REAP_TIMEOUT, child.wait()).await;
            drain_readers(readers, Instant::now() + OUTPUT_DRAIN_GRACE, &group).await;
            group.disarm();
            return Err(RunCommandError::TimedOut {
                program,
                timeout,
                stdout: lock(&stdout_tail).snapshot().0,
                stderr: lock(&stderr_tail).snapshot().0,
            });
        }
    };
    drain_readers(readers, Instant::now() + OUTPUT_DRAIN_GRACE, &group).await;
    // The leader is reaped and its pipes are closed or their holders killed: nothing of the
    // group is left to kill, and its id may be reused.
    group.disarm();
    let (stdout, stdout_truncated) = lock(&stdout_tail).snapshot();
    let (stderr, stderr_truncated) = lock(&stderr_tail).snapshot();
    Ok(CommandOutput { status, stdout, stderr, truncated: stdout_truncated || stderr_truncated })
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
    ) -> Result<CommandOutput, ProviderError> {
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
            Err(RunCommandError::TimedOut { stderr, .. }) => {
                tracing::warn!(
                    node,
                    operation,
                    stderr = tail_of(&stderr, ERROR_STDERR_TAIL_BYTES),
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
            let stderr = tail_of(&output.stderr, ERROR_STDERR_TAIL_BYTES);
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
            let Some(new_node) = last_line(&output.stdout) else {
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
            parse_power_state(&output.stdout).ok_or_else(|| ProviderError::Failed {
                provider: PROVIDER,
                operation: "power_state",
                node: node.to_owned(),
                message: format!(
                    "cannot read a power state (on, off, powering-on, powering-off, unknown) \
                     from the output {:?}",
                    tail_of(&output.stdout, 200)
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

    #[test]
    fn output_tail_keeps_the_end() {
        let mut tail = OutputTail::default();
        for _ in 0..10 {
            tail.push(&[b'a'; 20_000]);
        }
        tail.push(b"the end");
        let (text, truncated) = tail.snapshot();
        assert!(truncated);
        assert_eq!(text.len(), OUTPUT_CAPTURE_BYTES);
        assert!(text.ends_with("the end"));
    }

    #[tokio::test]
    async fn output_is_captured_and_bounded() {
        let script = "printf 'first\\nsecond\\n'; echo oops >&2; \
                      head -c 200000 /dev/zero | tr '\\0' x >&2; echo last-words >&2";
        let output =
            run_command(&argv(&["sh", "-c", script]), &[], Duration::from_secs(20)).await.unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout, "first\nsecond\n");
        assert!(output.truncated);
        assert_eq!(output.stderr.len(), OUTPUT_CAPTURE_BYTES);
        assert!(output.stderr.ends_with("last-words\n"), "{}", tail_of(&output.stderr, 40));
    }

    #[tokio::test]
    async fn environment_names_the_node() {
        let output = run_command(
            &argv(&["sh", "-c", "echo $FLEETMEND_NODE"]),
            &[("FLEETMEND_NODE", "n1")],
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        assert_eq!(output.stdout, "n1\n");
    }

    fn process_alive(pid: i32) -> bool {
        // Signal 0 checks existence; a zombie still counts, so look at its state too.
        if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
            return false;
        }
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                let state = stat.rsplit(')').next().unwrap_or_default().trim_start();
                !state.starts_with('Z')
            })
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        // The shell starts a grandchild that would outlive a kill of the shell alone.
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
        let started = std::time::Instant::now();
        let error = run_command(&argv(&["sh", "-c", &script]), &[], Duration::from_millis(700))
            .await
            .unwrap_err();
        assert!(matches!(error, RunCommandError::TimedOut { .. }), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while process_alive(pid) {
            assert!(std::time::Instant::now() < deadline, "grandchild {pid} survived the timeout");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
