//! Slurm's client commands as fleetmend runs them, for the repairer's Slurm scheduler, provider
//! and inventory and for a node's own drain (`fleetmend agent --once --slurm-drain`): every
//! command line fleetmend sends to Slurm is a method of [`Commands`] here, each run with a
//! timeout that kills it, its output bounded, retried with capped exponential backoff and jitter
//! while slurmctld cannot be reached (the command did nothing), and `scontrol show node` parsed.
//! What a failure means to its caller (an unknown node, a scheduler error) is the caller's to say.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetmend_process::RunError;
use fleetmend_proto::backoff::Backoff;
use tokio::time::Instant;

/// Longest stderr kept in an error, in bytes.
const STDERR_LIMIT: usize = 2048;

/// Most output kept of one Slurm command, per stream; a command that prints more fails rather
/// than answer with a cut list.
pub const OUTPUT_LIMIT: usize = 4 * 1024 * 1024;

/// First pause before retrying a command that could not reach slurmctld (doubles up to
/// [`Commands::controller_retry_max_backoff`]).
const FIRST_RETRY_BACKOFF: Duration = Duration::from_millis(250);

/// What Slurm's clients print when slurmctld cannot be reached: the command did nothing.
const CONTROLLER_UNREACHABLE: &str = "Unable to contact slurm controller";

/// A name Slurm's commands take as one node (not a list, not an option, no spaces).
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// What `scontrol show node` says about a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmNode {
    /// `State=`, e.g. `IDLE+DRAIN`.
    pub state: String,
    /// `Reason=` without the `[user@time]` stamp Slurm appends; `None` when it has none.
    pub reason: Option<String>,
}

impl SlurmNode {
    /// The base state and flags, upper case (`IDLE`, `DRAIN`, `NOT_RESPONDING`...).
    pub fn state_words(&self) -> impl Iterator<Item = &str> {
        self.state.split('+')
    }

    /// Drained or draining.
    pub fn is_drained(&self) -> bool {
        self.state_words().any(|w| w == "DRAIN")
    }

    /// Out of scheduling for any reason a drain could have to undo (drained, down, failed).
    pub fn is_out(&self) -> bool {
        self.state_words().any(|w| matches!(w, "DRAIN" | "DOWN" | "FAIL" | "FAILING"))
    }

    /// A reboot asked of Slurm that has not completed, or a node whose slurmd does not answer.
    pub fn is_rebooting(&self) -> bool {
        self.state_words().any(|w| {
            matches!(w, "REBOOT_REQUESTED" | "REBOOT_ISSUED" | "NOT_RESPONDING" | "POWERING_UP")
        }) || self.state.contains('*')
    }
}

/// Parses `scontrol show node NODE` (the multi-line form).
pub fn parse_show_node(text: &str) -> Option<SlurmNode> {
    let mut state = None;
    let mut reason = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(value) = line.strip_prefix("Reason=") {
            // "maintenance now [root@2026-11-29T21:47:06]": the stamp is the last " [".
            let value = match value.rfind(" [") {
                Some(at) if value.ends_with(']') => &value[..at],
                _ => value,
            };
            if !value.is_empty() && value != "(null)" {
                reason = Some(value.to_owned());
            }
            continue;
        }
        for token in line.split_whitespace() {
            if let Some(value) = token.strip_prefix("State=") {
                state = Some(value.to_owned());
            }
        }
    }
    Some(SlurmNode { state: state?, reason })
}

/// A Slurm command that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandError {
    /// It could not be started or waited for (`what`: "starting" or "waiting for").
    Run { line: String, what: &'static str, message: String },
    /// It ran past the timeout and was killed.
    TimedOut { line: String },
    /// It printed more than [`OUTPUT_LIMIT`]: a cut list would read as a shorter one.
    TooMuchOutput { line: String },
    /// It exited non-zero; `stderr` (or stdout, where Slurm answers there) cut to 2 KiB.
    Exit { line: String, status: String, stderr: String },
    /// `scontrol show node` answered without a `State=`.
    NoState { line: String, stdout: String },
}

impl CommandError {
    /// Slurm's "Node X not found" or "Invalid node name".
    pub fn is_unknown_node(&self) -> bool {
        matches!(self, CommandError::Exit { stderr, .. }
            if stderr.contains("not found") || stderr.contains("Invalid node name"))
    }

    /// Slurm's "Invalid job id specified".
    pub fn is_unknown_job(&self) -> bool {
        matches!(self, CommandError::Exit { stderr, .. } if stderr.contains("Invalid job id"))
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::Run { line, what, message } => write!(f, "{what} {line}: {message}"),
            CommandError::TimedOut { line } => write!(f, "{line} timed out"),
            CommandError::TooMuchOutput { line } => {
                write!(f, "{line} printed more than {OUTPUT_LIMIT} bytes")
            }
            CommandError::Exit { line, status, stderr } => write!(f, "{line}: {status}: {stderr}"),
            CommandError::NoState { line, stdout } => write!(f, "{line}: no State= in {stdout:?}"),
        }
    }
}

impl std::error::Error for CommandError {}

/// How Slurm's commands are run: where they are, which `slurm.conf`, how long each may take and
/// how long one that cannot reach slurmctld is retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commands {
    /// Directory of the client commands; `None`: found on `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` for every call; `None`: the caller's environment, else Slurm's default.
    pub slurm_conf: Option<PathBuf>,
    /// Longest one command may take before it is killed.
    pub command_timeout: Duration,
    /// How long a command that could not reach slurmctld is retried; zero: never.
    pub controller_retry_for: Duration,
    /// Longest pause between two retries while slurmctld is unreachable.
    pub controller_retry_max_backoff: Duration,
}

impl Commands {
    fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    /// Runs `program args`; its stdout. While slurmctld cannot be reached (the command did
    /// nothing) it is retried with capped exponential backoff and jitter for
    /// `controller_retry_for`. `operation` names the call in the retry's log line.
    pub async fn run(
        &self,
        operation: &str,
        program: &str,
        args: &[&str],
    ) -> Result<String, CommandError> {
        self.run_in(operation, program, args, None).await
    }

    /// [`Commands::run`] in `context`'s directory with its environment added (sbatch's job
    /// settings).
    async fn run_in(
        &self,
        operation: &str,
        program: &str,
        args: &[&str],
        context: Option<&Context<'_>>,
    ) -> Result<String, CommandError> {
        let deadline = Instant::now() + self.controller_retry_for;
        let backoff = Backoff::new(FIRST_RETRY_BACKOFF, self.controller_retry_max_backoff);
        let mut attempt = 1u32;
        loop {
            match self.run_once(program, args, context).await {
                Err(CommandError::Exit { stderr, line, status })
                    if stderr.contains(CONTROLLER_UNREACHABLE) =>
                {
                    // Jittered, so that retries from many calls spread out.
                    let pause = backoff.delay(attempt, fastrand::f64());
                    if Instant::now() + pause >= deadline {
                        return Err(CommandError::Exit {
                            line,
                            status,
                            stderr: format!(
                                "{stderr} (slurmctld unreachable; gave up after {attempt} attempts)"
                            ),
                        });
                    }
                    tracing::warn!(
                        operation,
                        command = %line,
                        attempt,
                        retry_in = ?pause,
                        "slurmctld unreachable; retrying"
                    );
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Runs one command with the timeout; a non-zero exit is an error with the command line and
    /// its stderr.
    async fn run_once(
        &self,
        program: &str,
        args: &[&str],
        context: Option<&Context<'_>>,
    ) -> Result<String, CommandError> {
        let path = self.program(program);
        let mut command = tokio::process::Command::new(&path);
        command.args(args);
        if let Some(conf) = &self.slurm_conf {
            command.env("SLURM_CONF", conf);
        }
        if let Some(context) = context {
            command.current_dir(context.dir).envs(context.env.iter().map(|(k, v)| (k, v)));
        }
        let line = format!("{} {}", path.display(), args.join(" "));
        let options = fleetmend_process::Options {
            tail_bytes: OUTPUT_LIMIT,
            ..fleetmend_process::Options::new(self.command_timeout)
        };
        let output = match fleetmend_process::run(command, &options).await {
            Ok(output) => output,
            Err(RunError::Spawn { source, .. }) => {
                return Err(CommandError::Run {
                    line,
                    what: "starting",
                    message: source.to_string(),
                });
            }
            Err(RunError::Wait { source, .. }) => {
                let message = source.to_string();
                return Err(CommandError::Run { line, what: "waiting for", message });
            }
            Err(RunError::TimedOut { .. }) => return Err(CommandError::TimedOut { line }),
        };
        if output.stdout.is_truncated() {
            return Err(CommandError::TooMuchOutput { line });
        }
        if output.status.success() {
            return Ok(output.stdout.text());
        }
        let mut stderr = output.stderr.text().trim().to_owned();
        if stderr.len() > STDERR_LIMIT {
            let mut cut = STDERR_LIMIT;
            while !stderr.is_char_boundary(cut) {
                cut -= 1;
            }
            stderr.truncate(cut);
            stderr.push_str("...");
        }
        // Some "not found" answers come on stdout (`scontrol show node`).
        if stderr.is_empty() {
            stderr = output.stdout.text().trim().chars().take(STDERR_LIMIT).collect();
        }
        Err(CommandError::Exit { line, status: output.status.to_string(), stderr })
    }

    /// `scontrol show node NAME`, parsed.
    pub async fn show_node(&self, operation: &str, name: &str) -> Result<SlurmNode, CommandError> {
        let stdout = self.run(operation, "scontrol", &["show", "node", name]).await?;
        parse_show_node(&stdout).ok_or_else(|| CommandError::NoState {
            line: format!("scontrol show node {name}"),
            stdout,
        })
    }

    /// `scontrol update NodeName=NAME State=DRAIN Reason=REASON`.
    pub async fn drain(
        &self,
        operation: &str,
        name: &str,
        reason: &str,
    ) -> Result<(), CommandError> {
        let name_arg = format!("NodeName={name}");
        let reason_arg = format!("Reason={reason}");
        self.run(operation, "scontrol", &["update", &name_arg, "State=DRAIN", &reason_arg])
            .await
            .map(drop)
    }

    /// `scontrol update NodeName=NAME State=RESUME`.
    pub async fn resume(&self, operation: &str, name: &str) -> Result<(), CommandError> {
        let name_arg = format!("NodeName={name}");
        self.run(operation, "scontrol", &["update", &name_arg, "State=RESUME"]).await.map(drop)
    }

    /// `scontrol reboot ASAP nextstate=DOWN reason=REASON NAME`: the node reboots once its jobs
    /// are gone and stays down until it is resumed.
    pub async fn reboot(
        &self,
        operation: &str,
        name: &str,
        reason: &str,
    ) -> Result<(), CommandError> {
        let args = reboot_args(name, reason);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(operation, "scontrol", &args).await.map(drop)
    }

    /// `scontrol -o show nodes`: one line per node.
    pub async fn show_nodes(&self, operation: &str) -> Result<String, CommandError> {
        self.run(operation, "scontrol", &["-o", "show", "nodes"]).await
    }

    /// `scontrol show hostnames LIST`: the node names a node list (`gpu[1-4]`) stands for.
    pub async fn hostnames(
        &self,
        operation: &str,
        list: &str,
    ) -> Result<Vec<String>, CommandError> {
        let stdout = self.run(operation, "scontrol", &["show", "hostnames", list]).await?;
        Ok(non_empty_lines(&stdout).map(str::to_owned).collect())
    }

    /// `sinfo -h -N -o %N|%T|%E`: a line `NAME|STATE|REASON` per node.
    pub async fn node_states(&self, operation: &str) -> Result<String, CommandError> {
        self.run(operation, "sinfo", &["-h", "-N", "-o", "%N|%T|%E"]).await
    }

    /// `squeue -h -t all -j JOB -o %T`: the job's state; `None` where Slurm lists none.
    pub async fn job_state(
        &self,
        operation: &str,
        job: &str,
    ) -> Result<Option<String>, CommandError> {
        let stdout =
            self.run(operation, "squeue", &["-h", "-t", "all", "-j", job, "-o", "%T"]).await?;
        Ok(non_empty_lines(&stdout).next().map(str::to_owned))
    }

    /// `squeue -h -w NAME -t RUNNING,SUSPENDED,CONFIGURING -o %i|%N`: each job running on the
    /// node, with its node list.
    pub async fn jobs_on(
        &self,
        operation: &str,
        name: &str,
    ) -> Result<Vec<(String, String)>, CommandError> {
        let states = "RUNNING,SUSPENDED,CONFIGURING";
        let stdout =
            self.run(operation, "squeue", &["-h", "-w", name, "-t", states, "-o", "%i|%N"]).await?;
        Ok(non_empty_lines(&stdout)
            .filter_map(|line| line.split_once('|'))
            .map(|(id, nodes)| (id.trim().to_owned(), nodes.trim().to_owned()))
            .collect())
    }

    /// `squeue -h -t PD -o %i|%D|%r`: a line `JOB|NODES|REASON` per pending job.
    pub async fn pending_jobs(&self, operation: &str) -> Result<String, CommandError> {
        self.run(operation, "squeue", &["-h", "-t", "PD", "-o", "%i|%D|%r"]).await
    }

    /// `scancel --signal=SIGNAL --full JOB`: `--full` reaches the batch script and every step
    /// (plain `--signal` skips the batch shell).
    pub async fn signal_job(
        &self,
        operation: &str,
        job: &str,
        signal: &str,
    ) -> Result<(), CommandError> {
        let signal_arg = format!("--signal={signal}");
        self.run(operation, "scancel", &[&signal_arg, "--full", job]).await.map(drop)
    }

    /// `scontrol requeue JOB`.
    pub async fn requeue(&self, operation: &str, job: &str) -> Result<(), CommandError> {
        self.run(operation, "scontrol", &["requeue", job]).await.map(drop)
    }

    /// `sinfo -h -N -o %N`: the cluster's node names in sinfo's order, each once (sinfo lists a
    /// node once per partition).
    pub async fn node_names(&self, operation: &str) -> Result<Vec<String>, CommandError> {
        let stdout = self.run(operation, "sinfo", &["-h", "-N", "-o", "%N"]).await?;
        let mut names: Vec<String> = Vec::new();
        for name in non_empty_lines(&stdout) {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// `scontrol show job -o JOB`: the job's record on one line.
    pub async fn show_job(&self, operation: &str, job: &str) -> Result<String, CommandError> {
        self.run(operation, "scontrol", &["show", "job", "-o", job]).await
    }

    /// `scancel JOB`: its steps get SIGTERM (and its checkpoint protocol's chance to write).
    pub async fn cancel(&self, operation: &str, job: &str) -> Result<(), CommandError> {
        self.run(operation, "scancel", &[job]).await.map(drop)
    }

    /// `sbatch --parsable ARGS SCRIPT`, run in `dir` with `env` added to the environment the job
    /// inherits: sbatch's answer (`ID` or `ID;CLUSTER`).
    pub async fn sbatch(
        &self,
        operation: &str,
        args: &[&str],
        script: &Path,
        dir: &Path,
        env: &[(&str, String)],
    ) -> Result<String, CommandError> {
        let script = script.display().to_string();
        let mut all = vec!["--parsable"];
        all.extend_from_slice(args);
        all.push(&script);
        let context = Context { dir, env };
        self.run_in(operation, "sbatch", &all, Some(&context)).await
    }

    /// `scontrol update JobId=JOB StartTime=now`.
    pub async fn start_now(&self, operation: &str, job: &str) -> Result<(), CommandError> {
        let job_arg = format!("JobId={job}");
        self.run(operation, "scontrol", &["update", &job_arg, "StartTime=now"]).await.map(drop)
    }
}

/// Where a command runs and what it adds to its environment.
struct Context<'a> {
    dir: &'a Path,
    env: &'a [(&'a str, String)],
}

/// The `scontrol` arguments that reboot `name` (see [`Commands::reboot`]).
pub fn reboot_args(name: &str, reason: &str) -> Vec<String> {
    ["reboot", "ASAP", "nextstate=DOWN"]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("reason={reason}"), name.to_owned()])
        .collect()
}

fn non_empty_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().map(str::trim).filter(|line| !line.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn plain_names_are_single_slurm_node_names() {
        assert!(is_plain_name("node2"));
        assert!(is_plain_name("gpu-a17.rack3"));
        for bad in ["", "-n", "node[1-4]", "node1,node2", "a b"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }

    const DRAINED: &str = "NodeName=node3 Arch=x86_64 CoresPerSocket=1 \n   CPUAlloc=0 CPUEfctv=2\n   \
        State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n   \
        Partitions=dev \n   Reason=maintenance now [root@2026-11-29T21:47:06]\n\n";

    #[test]
    fn parses_state_and_reason_without_the_stamp() {
        let node = parse_show_node(DRAINED).unwrap();
        assert_eq!(node.state, "IDLE+DRAIN");
        assert_eq!(node.reason.as_deref(), Some("maintenance now"));
        assert!(node.is_drained());
        let ours = parse_show_node(
            "   State=MIXED+DRAIN ThreadsPerCore=1\n   Reason=fleetmend: xid 79 [gpu 3] [root@2026-11-29T21:47:09]\n",
        )
        .unwrap();
        assert_eq!(ours.reason.as_deref(), Some("fleetmend: xid 79 [gpu 3]"));
        let idle = parse_show_node("   State=IDLE ThreadsPerCore=1\n").unwrap();
        assert!(!idle.is_drained() && !idle.is_out());
        assert_eq!(idle.reason, None);
        let down = parse_show_node(
            "   State=DOWN+NOT_RESPONDING x=1\n   Reason=Not responding [slurm@2026]\n",
        )
        .unwrap();
        assert!(down.is_out() && !down.is_drained());
        assert!(down.is_rebooting(), "slurmd does not answer");
        assert!(!ours.is_rebooting() && !idle.is_rebooting());
        let rebooting = parse_show_node(
            "   State=DOWN+DRAIN+REBOOT_ISSUED x=1\n   Reason=fleetmend: reboot [root@2026]\n",
        )
        .unwrap();
        assert!(rebooting.is_rebooting());
        assert_eq!(parse_show_node("nothing here"), None);
    }

    #[test]
    fn a_failure_says_what_slurm_answered() {
        let exit = |stderr: &str| CommandError::Exit {
            line: "scontrol show node node9".to_owned(),
            status: "exit status: 1".to_owned(),
            stderr: stderr.to_owned(),
        };
        assert!(exit("Node node9 not found").is_unknown_node());
        assert!(exit("Invalid node name specified").is_unknown_node());
        assert!(!exit("Unable to contact slurm controller").is_unknown_node());
        assert!(exit("Invalid job id specified").is_unknown_job());
        assert_eq!(
            exit("Node node9 not found").to_string(),
            "scontrol show node node9: exit status: 1: Node node9 not found"
        );
        let timed_out = CommandError::TimedOut { line: "squeue -h".to_owned() };
        assert!(!timed_out.is_unknown_node() && !timed_out.is_unknown_job());
    }
}
