//! Runs one subprocess the way every fleetmend caller needs it: stdin closed, in a process group
//! of its own, with a timeout that kills the whole group (a probe's helpers, the `ipmitool` a
//! script started), reaped within a bounded wait, and the end of its stdout and stderr kept,
//! bounded (the end of the output says why it failed).
//!
//! The agent's probes and reboot command, the `command` provider, the Slurm backend and `fleetmend
//! up --scheduler slurm` all run their processes through [`run`].

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Bytes kept of each of stdout and stderr unless [`Options::tail_bytes`] says otherwise.
pub const DEFAULT_TAIL_BYTES: usize = 64 * 1024;

/// How long output is still read after the process exited, by default. Something it left running
/// in the background may hold the pipes open.
pub const DEFAULT_OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// How long reaping a killed process may take by default before it is left to tokio's orphan
/// reaper: SIGKILL cannot be ignored, but a process in uninterruptible sleep (a hung driver call)
/// goes only when that call returns.
pub const DEFAULT_REAP_GRACE: Duration = Duration::from_secs(5);

/// What becomes of processes still holding the output pipes when [`Options::output_grace`] after
/// the leader's exit is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftovers {
    /// The whole process group is killed: nothing the command started outlives it.
    Kill,
    /// They are left running and their output is no longer read (a reboot command may hand the
    /// reboot to a helper in the background).
    Leave,
}

/// How [`run`] runs a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Longest the process may run before its process group is killed.
    pub timeout: Duration,
    /// Bytes kept of each of stdout and stderr: the end of each.
    pub tail_bytes: usize,
    /// How long output is still read after the process exited.
    pub output_grace: Duration,
    /// How long the wait for a killed process may take.
    pub reap_grace: Duration,
    /// What becomes of processes holding the output past `output_grace`.
    pub leftovers: Leftovers,
}

impl Options {
    /// `timeout`, with the default tail, graces, and leftovers killed.
    pub fn new(timeout: Duration) -> Options {
        Options {
            timeout,
            tail_bytes: DEFAULT_TAIL_BYTES,
            output_grace: DEFAULT_OUTPUT_GRACE,
            reap_grace: DEFAULT_REAP_GRACE,
            leftovers: Leftovers::Kill,
        }
    }
}

/// The end of one output stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tail {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Tail {
    /// The bytes kept.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes kept as text (lossy UTF-8: the cut may fall inside a character).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// More was printed than was kept.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A process that exited by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessOutput {
    pub status: ExitStatus,
    pub stdout: Tail,
    pub stderr: Tail,
    /// From the start to the exit.
    pub duration: Duration,
}

/// Running a process failed before it could exit by itself.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("starting {program:?}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("waiting for {program:?}: {source}")]
    Wait { program: String, source: std::io::Error },
    /// It ran past its timeout and its process group was killed; what it printed until then.
    #[error("{program:?} ran longer than {after:?}; its process group was killed")]
    TimedOut { program: String, after: Duration, stdout: Tail, stderr: Tail },
}

impl RunError {
    /// The program that failed to run.
    pub fn program(&self) -> &str {
        match self {
            RunError::Spawn { program, .. }
            | RunError::Wait { program, .. }
            | RunError::TimedOut { program, .. } => program,
        }
    }
}

/// Runs `command` (program, arguments, environment and directory as the caller set them) with
/// stdin closed, in a process group of its own, at most `options.timeout`.
///
/// On a timeout the whole group is killed; so it is when the returned future is dropped before
/// the process exited (a cancelled caller leaves nothing behind).
pub async fn run(mut command: Command, options: &Options) -> Result<ProcessOutput, RunError> {
    let program = command.as_std().get_program().to_string_lossy().into_owned();
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so killing the group reaches everything it started.
        .process_group(0)
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child =
        command.spawn().map_err(|source| RunError::Spawn { program: program.clone(), source })?;
    let mut group = ProcessGroup::of(child.id());
    let stdout = SharedTail::new(options.tail_bytes);
    let stderr = SharedTail::new(options.tail_bytes);
    let readers: Vec<JoinHandle<()>> =
        [read_into(child.stdout.take(), &stdout), read_into(child.stderr.take(), &stderr)]
            .into_iter()
            .flatten()
            .collect();

    match tokio::time::timeout_at(started + options.timeout, child.wait()).await {
        Ok(Ok(status)) => {
            let duration = started.elapsed();
            finish_reading(readers, options.output_grace, &group, options.leftovers).await;
            // The leader is reaped and its pipes are closed or given up on: nothing of the group
            // is ours to kill any more, and its id may be reused.
            group.disarm();
            Ok(ProcessOutput {
                status,
                stdout: stdout.snapshot(),
                stderr: stderr.snapshot(),
                duration,
            })
        }
        Ok(Err(source)) => {
            group.kill();
            readers.iter().for_each(JoinHandle::abort);
            Err(RunError::Wait { program, source })
        }
        Err(_elapsed) => {
            group.kill();
            if tokio::time::timeout(options.reap_grace, child.wait()).await.is_err() {
                tracing::warn!(
                    program,
                    reap_grace = ?options.reap_grace,
                    "a killed process was not reaped in time; left to the orphan reaper"
                );
            }
            // Its group is dead; what still holds a pipe left the group (setsid): stop reading.
            finish_reading(readers, options.output_grace, &group, Leftovers::Leave).await;
            group.disarm();
            Err(RunError::TimedOut {
                program,
                after: options.timeout,
                stdout: stdout.snapshot(),
                stderr: stderr.snapshot(),
            })
        }
    }
}

/// Waits `grace` for the readers to reach the end of their pipes; past it, `leftovers` says
/// whether the group holding them is killed. What was read is kept either way.
async fn finish_reading(
    readers: Vec<JoinHandle<()>>,
    grace: Duration,
    group: &ProcessGroup,
    leftovers: Leftovers,
) {
    let deadline = Instant::now() + grace;
    for reader in readers {
        let abort = reader.abort_handle();
        if tokio::time::timeout_at(deadline, reader).await.is_err() {
            if leftovers == Leftovers::Kill {
                group.kill();
            }
            abort.abort();
        }
    }
}

/// Kills a process group when told to, or when dropped still armed (a cancelled run).
#[derive(Debug)]
struct ProcessGroup {
    pgid: Option<nix::unistd::Pid>,
}

impl ProcessGroup {
    /// The group the process `pid` leads (none: it was reaped already).
    fn of(pid: Option<u32>) -> ProcessGroup {
        let pgid = pid.and_then(|pid| i32::try_from(pid).ok()).map(nix::unistd::Pid::from_raw);
        ProcessGroup { pgid }
    }

    fn kill(&self) {
        let Some(pgid) = self.pgid else { return };
        // ESRCH (the group is gone already) is the outcome wanted.
        if let Err(err) = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL)
            && err != nix::errno::Errno::ESRCH
        {
            tracing::warn!(pgid = %pgid, error = %err, "cannot kill a process group");
        }
    }

    /// Nothing of the group is left to kill.
    fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The end of a stream, filled by its reader while the caller may look at it (after a timeout).
#[derive(Debug, Clone)]
struct SharedTail(Arc<Mutex<TailBuffer>>);

impl SharedTail {
    fn new(limit: usize) -> SharedTail {
        SharedTail(Arc::new(Mutex::new(TailBuffer { limit, bytes: Vec::new(), dropped: false })))
    }

    fn lock(&self) -> MutexGuard<'_, TailBuffer> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn snapshot(&self) -> Tail {
        self.lock().snapshot()
    }
}

/// Keeps the last `limit` bytes pushed.
#[derive(Debug)]
struct TailBuffer {
    limit: usize,
    bytes: Vec<u8>,
    dropped: bool,
}

impl TailBuffer {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        // Trimmed in batches, so a chatty process costs amortised O(1) per byte.
        if self.bytes.len() > 2 * self.limit {
            let excess = self.bytes.len() - self.limit;
            self.bytes.drain(..excess);
            self.dropped = true;
        }
    }

    fn snapshot(&self) -> Tail {
        let start = self.bytes.len().saturating_sub(self.limit);
        Tail { bytes: self.bytes[start..].to_vec(), truncated: self.dropped || start > 0 }
    }
}

/// Reads `pipe` to its end into `tail`, on a task of its own.
fn read_into<R>(pipe: Option<R>, tail: &SharedTail) -> Option<JoinHandle<()>>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let mut pipe = pipe?;
    let tail = tail.clone();
    Some(tokio::spawn(async move {
        let mut chunk = vec![0_u8; 8192];
        loop {
            match pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => tail.lock().push(&chunk[..n]),
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        command
    }

    /// Whether `pid` runs (a zombie waiting for its reaper does not).
    fn process_alive(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
            Err(_) => false,
        }
    }

    /// Polls until `pid` is gone, at most `within`; whether it went.
    async fn gone_within(pid: i32, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while process_alive(pid) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    fn read_pid(path: &std::path::Path) -> i32 {
        std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
    }

    #[test]
    fn the_tail_keeps_the_end() {
        let mut buffer = TailBuffer { limit: 1000, bytes: Vec::new(), dropped: false };
        for _ in 0..10 {
            buffer.push(&[b'a'; 700]);
        }
        buffer.push(b"the end");
        let tail = buffer.snapshot();
        assert!(tail.is_truncated());
        assert_eq!(tail.bytes().len(), 1000);
        assert!(tail.text().ends_with("the end"), "{}", tail.text());

        let mut short = TailBuffer { limit: 1000, bytes: Vec::new(), dropped: false };
        short.push(b"all of it");
        assert_eq!(
            (short.snapshot().text().as_str(), short.snapshot().is_truncated()),
            ("all of it", false)
        );
    }

    #[tokio::test]
    async fn output_is_captured_bounded_with_the_exit_code() {
        let script = "printf 'first\\nsecond\\n'; head -c 200000 /dev/zero | tr '\\0' x >&2; \
                      echo last-words >&2; exit 3";
        let options = Options { tail_bytes: 4096, ..Options::new(Duration::from_secs(20)) };
        let output = run(sh(script), &options).await.unwrap();
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(output.stdout.text(), "first\nsecond\n");
        assert!(!output.stdout.is_truncated());
        assert!(output.stderr.is_truncated());
        assert_eq!(output.stderr.bytes().len(), 4096);
        assert!(output.stderr.text().ends_with("xxlast-words\n"));
        assert!(output.duration < Duration::from_secs(20));
    }

    #[tokio::test]
    async fn the_callers_environment_is_kept() {
        let mut command = sh("echo $FLEETMEND_NODE");
        command.env("FLEETMEND_NODE", "n1");
        let output = run(command, &Options::new(Duration::from_secs(20))).await.unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout.text(), "n1\n");
    }

    #[tokio::test]
    async fn a_spawn_failure_names_the_program() {
        let command = Command::new("/nonexistent/dcgmi");
        let error = run(command, &Options::new(Duration::from_secs(20))).await.unwrap_err();
        assert!(matches!(error, RunError::Spawn { .. }), "{error:?}");
        assert_eq!(error.program(), "/nonexistent/dcgmi");
        assert!(error.to_string().starts_with("starting \"/nonexistent/dcgmi\": "), "{error}");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group_and_keeps_the_output() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        // The shell starts a grandchild that would outlive a kill of the shell alone.
        let script = format!(
            "sleep 600 & echo $! > {}; echo 'waiting for the fabric' >&2; wait",
            pid_file.display()
        );
        let started = std::time::Instant::now();
        let error = run(sh(&script), &Options::new(Duration::from_millis(700))).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        let RunError::TimedOut { program, after, stderr, .. } = &error else {
            panic!("not a timeout: {error:?}");
        };
        assert_eq!((program.as_str(), *after), ("sh", Duration::from_millis(700)));
        assert_eq!(stderr.text(), "waiting for the fabric\n");
        assert!(error.to_string().contains("ran longer than 700ms"), "{error}");
        let pid = read_pid(&pid_file);
        assert!(gone_within(pid, Duration::from_secs(5)).await, "grandchild {pid} survived");
    }

    #[tokio::test]
    async fn leftovers_holding_the_output_are_killed_or_left_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("leftover.pid");
        // The shell exits at once; its background child keeps stdout open.
        let script = format!("sleep 600 & echo $! > {}; echo done", pid_file.display());
        let options = Options {
            output_grace: Duration::from_millis(300),
            ..Options::new(Duration::from_secs(20))
        };

        let output = run(sh(&script), &options).await.unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout.text(), "done\n");
        let pid = read_pid(&pid_file);
        assert!(gone_within(pid, Duration::from_secs(5)).await, "leftover {pid} survived");

        let left = Options { leftovers: Leftovers::Leave, ..options };
        let output = run(sh(&script), &left).await.unwrap();
        assert_eq!(output.stdout.text(), "done\n");
        let pid = read_pid(&pid_file);
        assert!(process_alive(pid), "leftover {pid} was killed");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
            .unwrap();
    }

    #[tokio::test]
    async fn a_dropped_run_kills_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
        let options = Options::new(Duration::from_secs(600));
        let mut running = Box::pin(run(sh(&script), &options));
        // Runs it until the grandchild is there, then drops the run.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pid_file.exists() || std::fs::read_to_string(&pid_file).unwrap().trim().is_empty() {
            assert!(Instant::now() < deadline, "the script did not start");
            tokio::select! {
                result = &mut running => panic!("the run ended: {result:?}"),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        drop(running);
        let pid = read_pid(&pid_file);
        assert!(gone_within(pid, Duration::from_secs(5)).await, "grandchild {pid} survived");
    }
}
