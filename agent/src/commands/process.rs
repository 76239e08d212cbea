//! Running a process for a command (a deep check's probe, the reboot command): no shell, in a
//! process group of its own, bounded in time and in the output kept.

use std::time::Duration;

use tokio::time::Instant;

use super::short_duration;

/// Bytes of a process's output kept for a message: enough for the error, bounded for the report.
const OUTPUT_TAIL_BYTES: usize = 1024;
const _: () = assert!(OUTPUT_TAIL_BYTES < fleetmend_proto::bounds::MAX_MESSAGE_BYTES / 2);
/// After a process ended, how long its output pipes may stay open (a leftover child holding them).
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// How a process run by a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEnd {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it.
    Signalled(i32),
    /// It ran past its timeout; its process group was killed.
    TimedOut,
    /// It could not be started (or waited for): why.
    NotStarted(String),
}

/// One run of a probe or of the reboot command.
#[derive(Debug, Clone)]
pub struct ProcessRun {
    pub end: ProcessEnd,
    /// The timeout for a run that timed out.
    pub duration: Duration,
    /// The end of its stderr, or of its stdout when stderr was empty; trimmed.
    pub output_tail: String,
}

impl ProcessRun {
    /// Exit status 0.
    pub fn passed(&self) -> bool {
        self.end == ProcessEnd::Exited(0)
    }

    /// "exited with status 1 after 2.1s: <output>", "timed out after 10s; ...", ...
    pub fn describe(&self) -> String {
        let took = short_duration(self.duration);
        let mut text = match &self.end {
            ProcessEnd::Exited(code) => format!("exited with status {code} after {took}"),
            ProcessEnd::Signalled(signal) => format!("was killed by signal {signal} after {took}"),
            ProcessEnd::TimedOut => {
                format!("timed out after {took}; its process group was killed")
            }
            ProcessEnd::NotStarted(why) => format!("could not run: {why}"),
        };
        if !self.output_tail.is_empty() {
            text.push_str(": ");
            text.push_str(&self.output_tail);
        }
        text
    }
}

/// Runs `argv` (no shell) in a process group of its own, at most `timeout`; on a timeout the whole
/// group is killed, so a probe's helpers do not outlive it.
pub async fn run_process(argv: &[String], timeout: Duration) -> ProcessRun {
    let started = Instant::now();
    let Some((program, args)) = argv.split_first() else {
        return ProcessRun {
            end: ProcessEnd::NotStarted("no program given".to_owned()),
            duration: Duration::ZERO,
            output_tail: String::new(),
        };
    };
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    let options = fleetmend_process::Options {
        tail_bytes: OUTPUT_TAIL_BYTES,
        output_grace: OUTPUT_GRACE,
        // A reboot command may hand the reboot to a helper that keeps its output open.
        leftovers: fleetmend_process::Leftovers::Leave,
        ..fleetmend_process::Options::new(timeout)
    };
    match fleetmend_process::run(command, &options).await {
        Ok(output) => {
            use std::os::unix::process::ExitStatusExt;
            let end = match (output.status.code(), output.status.signal()) {
                (Some(code), _) => ProcessEnd::Exited(code),
                (None, Some(signal)) => ProcessEnd::Signalled(signal),
                (None, None) => ProcessEnd::NotStarted(format!("ended oddly: {}", output.status)),
            };
            let output_tail = output_tail(&output.stdout, &output.stderr);
            ProcessRun { end, duration: output.duration, output_tail }
        }
        Err(fleetmend_process::RunError::TimedOut { after, stdout, stderr, .. }) => ProcessRun {
            end: ProcessEnd::TimedOut,
            duration: after,
            output_tail: output_tail(&stdout, &stderr),
        },
        Err(err) => ProcessRun {
            end: ProcessEnd::NotStarted(err.to_string()),
            duration: started.elapsed(),
            output_tail: String::new(),
        },
    }
}

/// The end of stderr, or of stdout when stderr was empty; trimmed.
fn output_tail(stdout: &fleetmend_process::Tail, stderr: &fleetmend_process::Tail) -> String {
    let stderr = stderr.text().trim().to_owned();
    if stderr.is_empty() { stdout.text().trim().to_owned() } else { stderr }
}
