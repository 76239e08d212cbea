//! How repairers in processes of their own reach the local fleet's nodes.
//!
//! With one repairer, `fleetmend up` runs it in its own process and hands it the [`LocalProvider`]
//! directly. With several (`--repairers N`) each repairer is a `fleetmend repairer` child that
//! can be killed for real, and the nodes' agents stay children of `fleetmend up`, whose
//! [`Supervisor`](super::Supervisor) alone can stop, rebuild and start them. The repairers use the
//! stock `command` provider, whose commands are `fleetmend up-provider --state-dir DIR reboot
//! {node}` (and `replace`, `power-state`); that command asks the running `fleetmend up` over a
//! Unix socket in the state directory ([`SOCKET`]), where the same [`LocalProvider`] acts. So the
//! repairer gains no code path of its own for the local fleet, and whichever repairer leads
//! reaches the nodes the same way.
//!
//! One request per connection: a JSON line `{"operation": "reboot", "node": "node-1"}`, answered
//! with one JSON line `{"ok": true, "value": "..."}` or `{"ok": false, "error": "..."}`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use fleetmend_repairer::provider::{PowerState, Provider};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::provider::LocalProvider;

/// The socket's file name in the state directory.
pub const SOCKET: &str = "provider.sock";

/// Longest wait for a request line from a connected client.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait of `fleetmend up-provider` for its answer (a reboot is answered once under way;
/// a replacement once a spare is chosen).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest request line accepted.
const MAX_LINE: usize = 4096;

/// What the repairer asks of the local fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// Reboot the node (answered once the reboot is under way).
    Reboot,
    /// Replace the node by a spare; prints the spare's name.
    Replace,
    /// Print the node's power state (`on`, `off`, `powering-on`).
    PowerState,
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    operation: Operation,
    node: String,
}

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The flags of `fleetmend up-provider` (the `command` provider's commands of a fleet with
/// several repairers; not for people).
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    /// The state directory of the running `fleetmend up`.
    #[arg(long, value_name = "DIR")]
    pub state_dir: PathBuf,
    #[arg(value_enum)]
    pub operation: Operation,
    /// The node.
    pub node: String,
}

/// Serves requests on `listener` with `provider` until the task is aborted.
pub async fn serve(listener: tokio::net::UnixListener, provider: LocalProvider) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(error = %err, "accepting on the provider socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let provider = provider.clone();
        tokio::spawn(async move {
            if let Err(err) = answer(stream, &provider).await {
                tracing::warn!(error = %err, "a provider request failed");
            }
        });
    }
}

async fn answer(stream: tokio::net::UnixStream, provider: &LocalProvider) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read).take(MAX_LINE as u64);
    tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request line"))??;
    let answer = match serde_json::from_str::<Request>(&line) {
        Ok(request) => act(provider, &request).await,
        Err(err) => Answer { ok: false, value: None, error: Some(format!("bad request: {err}")) },
    };
    let mut text = serde_json::to_string(&answer).map_err(std::io::Error::other)?;
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    write.shutdown().await
}

async fn act(provider: &LocalProvider, request: &Request) -> Answer {
    let node = request.node.as_str();
    let done = match request.operation {
        Operation::Reboot => provider.reboot(node).await.map(|()| None),
        Operation::Replace => provider.replace(node).await.map(Some),
        Operation::PowerState => provider.power_state(node).await.map(|state| {
            Some(
                match state {
                    PowerState::On => "on",
                    PowerState::Off => "off",
                    PowerState::PoweringOn => "powering-on",
                    PowerState::PoweringOff => "powering-off",
                    PowerState::Unknown => "unknown",
                }
                .to_owned(),
            )
        }),
    };
    match done {
        Ok(value) => Answer { ok: true, value, error: None },
        Err(err) => Answer { ok: false, value: None, error: Some(err.to_string()) },
    }
}

/// The answer of the running `fleetmend up` on `state_dir` to `operation` of `node`.
pub fn ask(state_dir: &Path, operation: Operation, node: &str) -> Result<Option<String>, String> {
    let socket = state_dir.join(SOCKET);
    let mut stream = UnixStream::connect(&socket).map_err(|err| {
        format!("reaching fleetmend up at {}: {err} (is it running?)", socket.display())
    })?;
    let io =
        |err: std::io::Error| format!("talking to fleetmend up at {}: {err}", socket.display());
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(io)?;
    let mut line = serde_json::to_string(&Request { operation, node: node.to_owned() })
        .map_err(|err| err.to_string())?;
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(io)?;
    let mut answer = String::new();
    BufReader::new(stream.take(MAX_LINE as u64)).read_line(&mut answer).map_err(io)?;
    let answer: Answer = serde_json::from_str(&answer)
        .map_err(|err| format!("fleetmend up answered {answer:?}: {err}"))?;
    match answer {
        Answer { ok: true, value, .. } => Ok(value),
        Answer { error, .. } => Err(error.unwrap_or_else(|| "refused, saying nothing".to_owned())),
    }
}

/// `fleetmend up-provider`: exit 0 with the answer's value on stdout, or 1 with why on stderr.
pub fn provider_main(args: ProviderArgs) -> ExitCode {
    match ask(&args.state_dir, args.operation, &args.node) {
        Ok(value) => {
            if let Some(value) = value {
                println!("{value}");
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("fleetmend up-provider: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_read_back() {
        let request = Request { operation: Operation::PowerState, node: "node-1".to_owned() };
        let text = serde_json::to_string(&request).unwrap();
        assert_eq!(text, r#"{"operation":"power-state","node":"node-1"}"#);
        let answer: Answer = serde_json::from_str(r#"{"ok":false,"error":"no spare"}"#).unwrap();
        assert_eq!(answer, Answer { ok: false, value: None, error: Some("no spare".to_owned()) });
    }

    #[test]
    fn asking_a_fleet_that_does_not_run_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let err = ask(dir.path(), Operation::Reboot, "node-1").unwrap_err();
        assert!(err.contains("is it running?"), "{err}");
    }
}
