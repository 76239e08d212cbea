//! The `allreduce` command: this node's rank of the repairer's bandwidth probe. It runs the
//! configured program (`commands.allreduce`, by default this binary's `fleetmend allreduce`) with
//! the ring's environment, on a task of its own (the peer's rank is waiting at the rendezvous, so
//! it must not queue behind a deep check), one at a time, and answers with what it measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleetmend_proto::NodeCommand;
use fleetmend_proto::probes::{AllreduceMeasurement, AllreduceProbe};

use crate::commands::{CommandOutbox, result_of, short_duration};

/// Bytes of output kept: the measurement is one short line.
const OUTPUT_BYTES: usize = 16 * 1024;
/// Longest probe the agent runs, whatever the command asks.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `allreduce` commands, one at a time.
#[derive(Debug)]
pub struct AllreduceRunner {
    argv: Vec<String>,
    busy: Arc<AtomicBool>,
}

impl AllreduceRunner {
    /// `argv` as configured (`commands.allreduce`); empty: this binary's `allreduce`.
    pub fn new(argv: Vec<String>) -> AllreduceRunner {
        AllreduceRunner { argv, busy: Arc::new(AtomicBool::new(false)) }
    }

    /// Starts `command` on a task of its own; its result goes to `outbox`. A second probe while
    /// one runs is refused at once (the ring it belongs to then fails and is tried again later).
    pub fn start(&self, command: NodeCommand, outbox: Arc<CommandOutbox>) {
        let refuse = |message: String| {
            tracing::warn!(id = %command.id, "{message}");
            outbox.push(result_of(&command, false, message));
        };
        let probe = match command.args_as::<AllreduceProbe>() {
            Ok(probe) => probe,
            Err(err) => return refuse(format!("refused: {err}")),
        };
        let argv = match self.argv() {
            Ok(argv) => argv,
            Err(why) => return refuse(format!("refused: {why}")),
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return refuse("refused: no runtime to run the probe on".to_owned());
        };
        if self.busy.swap(true, Ordering::AcqRel) {
            return refuse(
                "refused: an allreduce probe is already running on this node".to_owned(),
            );
        }
        let busy = Arc::clone(&self.busy);
        runtime.spawn(async move {
            let (ok, message, measured) = run(&argv, &probe).await;
            busy.store(false, Ordering::Release);
            tracing::info!(id = %command.id, ok, "allreduce probe: {message}");
            outbox.push(fleetmend_proto::CommandResult {
                allreduce: measured,
                ..result_of(&command, ok, message)
            });
        });
    }

    fn argv(&self) -> Result<Vec<String>, String> {
        if !self.argv.is_empty() {
            return Ok(self.argv.clone());
        }
        let exe = std::env::current_exe()
            .map_err(|err| format!("finding this agent's own binary for the probe: {err}"))?;
        // The lean `fleetmend-agent` has no collective in it: the probe is the `fleetmend`
        // installed beside it (the package puts both in /usr/bin).
        let exe = match exe.file_name().and_then(|n| n.to_str()) {
            Some("fleetmend-agent") => exe.with_file_name("fleetmend"),
            _ => exe,
        };
        Ok(vec![exe.display().to_string(), "allreduce".to_owned()])
    }
}

/// Runs the probe's rank; whether it measured, what to say, and the measurement.
async fn run(
    argv: &[String],
    probe: &AllreduceProbe,
) -> (bool, String, Option<AllreduceMeasurement>) {
    let Some((program, args)) = argv.split_first() else {
        return (false, "no program to run".to_owned(), None);
    };
    let timeout = Duration::from_millis(probe.timeout_ms).min(MAX_TIMEOUT);
    let peers = probe.nodes.join(", ");
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .arg(format!("--bytes={}", probe.bytes))
        .arg(format!("--iterations={}", probe.iterations))
        .arg(format!("--timeout={}ms", probe.timeout_ms))
        .env("RANK", probe.rank.to_string())
        .env("WORLD_SIZE", probe.world_size.to_string())
        .env("MASTER_ADDR", &probe.master_addr)
        .env("MASTER_PORT", probe.master_port.to_string())
        .env("FLEETMEND_JOB_ID", &probe.probe)
        .env("FLEETMEND_RESTART_COUNT", "0");
    // A little past the probe's own timeout: it says why it gave up before it is killed.
    let options = fleetmend_process::Options {
        tail_bytes: OUTPUT_BYTES,
        ..fleetmend_process::Options::new(timeout + Duration::from_secs(5))
    };
    let output = match fleetmend_process::run(command, &options).await {
        Ok(output) => output,
        Err(err) => return (false, format!("the probe with {peers}: {err}"), None),
    };
    let took = short_duration(output.duration);
    if !output.status.success() {
        let why = output.stderr.text();
        let why = why.trim();
        return (
            false,
            format!("the probe with {peers} failed ({}) after {took}: {why}", output.status),
            None,
        );
    }
    let stdout = output.stdout.text();
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    match serde_json::from_str::<AllreduceMeasurement>(line) {
        Ok(measured) => (
            true,
            format!(
                "{:.3} GB/s bus bandwidth with {peers} ({} bytes, {:.1} ms per all-reduce)",
                measured.busbw_gbps,
                measured.bytes,
                measured.seconds * 1000.0
            ),
            Some(measured),
        ),
        Err(err) => (
            false,
            format!("the probe with {peers} printed no measurement ({err}): {line:?}"),
            None,
        ),
    }
}
