//! The uninterrupted reference run: the job's own command, as many ranks as the job has, started
//! by hand with the checkpoint protocol's environment and never disturbed, so its final weights
//! hash is what the interrupted, resumed job must end with.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fleetmend_repairer::queue::JobSpec;

use super::ScenarioError;

/// Runs `spec`'s command uninterrupted with `spec.nodes` ranks on this machine (logs and
/// checkpoints under `dir`) and returns the weights hash every rank agrees on. Every rank is
/// killed if it takes longer than `timeout`.
pub async fn uninterrupted_hash(
    job: &str,
    spec: &JobSpec,
    dir: &Path,
    timeout: Duration,
) -> Result<String, ScenarioError> {
    let fail = |message: String| ScenarioError::Reference { job: job.to_owned(), message };
    // The job's own pace only waits: the reference computes the same numbers without it.
    let argv = crate::up::trainer::unpaced(&spec.argv);
    let Some((program, args)) = argv.split_first() else {
        return Err(fail("the job has no command".to_owned()));
    };
    std::fs::create_dir_all(dir)
        .map_err(|err| fail(format!("creating {}: {err}", dir.display())))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|err| fail(format!("finding a free port for the rendezvous: {err}")))?;
    let checkpoints = dir.join("checkpoints");
    let deadline = Instant::now() + timeout;
    let mut ranks = Vec::new();
    for rank in 0..spec.nodes {
        let out_path = dir.join(format!("rank-{rank}.out"));
        let err_path = dir.join(format!("rank-{rank}.err"));
        let create = |path: &Path| {
            std::fs::File::create(path)
                .map_err(|err| fail(format!("creating {}: {err}", path.display())))
        };
        // Output to files: a rank blocked on a full pipe would stall the ring.
        let (stdout, stderr) = (create(&out_path)?, create(&err_path)?);
        let child = tokio::process::Command::new(program)
            .args(args)
            .envs(&spec.env)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", spec.nodes.to_string())
            .env("LOCAL_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("FLEETMEND_JOB_ID", format!("{job}-reference"))
            .env("FLEETMEND_CHECKPOINT_DIR", &checkpoints)
            .env("FLEETMEND_RESTART_COUNT", "0")
            .env_remove(fleetmend_proto::jobs::PROGRESS_URL_VAR)
            .env_remove(fleetmend_proto::jobs::PROGRESS_TOKEN_VAR)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // A rank left behind by a timeout or an error is killed with its handle.
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| fail(format!("starting rank {rank} ({program}): {err}")))?;
        ranks.push((rank, child, out_path, err_path));
    }
    let mut hashes = Vec::new();
    for (rank, child, out_path, err_path) in &mut ranks {
        let left = deadline.saturating_duration_since(Instant::now());
        let status = match tokio::time::timeout(left, child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(err)) => return Err(fail(format!("waiting for rank {rank}: {err}"))),
            Err(_) => {
                return Err(fail(format!(
                    "rank {rank} did not finish within {}",
                    humantime::format_duration(timeout)
                )));
            }
        };
        if !status.success() {
            return Err(fail(format!(
                "rank {rank} ended with {status}; its stderr ends:\n{}",
                tail(err_path, 10)
            )));
        }
        let output = std::fs::read_to_string(&*out_path)
            .map_err(|err| fail(format!("reading {}: {err}", out_path.display())))?;
        let hash = done_hash(&output).ok_or_else(|| {
            fail(format!(
                "rank {rank} printed no done line with a weights hash ({})",
                out_path.display()
            ))
        })?;
        hashes.push(hash);
    }
    // The checkpoints were only a by-product; the logs stay for whoever wants to look.
    let _ = std::fs::remove_dir_all(&checkpoints);
    match hashes.split_first() {
        Some((first, rest)) if rest.iter().all(|h| h == first) => Ok(first.clone()),
        Some(_) => Err(fail(format!("the ranks disagree on the weights: {hashes:?}"))),
        None => Err(fail("the job has no ranks".to_owned())),
    }
}

/// The weights hash of the trainer's last `done` line.
pub(crate) fn done_hash(output: &str) -> Option<String> {
    output.lines().rev().find_map(|line| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        if value["event"] != "done" {
            return None;
        }
        value["weights_sha256"].as_str().map(str::to_owned)
    })
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_done_line_gives_the_hash() {
        let output = "{\"event\":\"step\",\"step\":1}\n{\"event\":\"done\",\"step\":2,\"weights_sha256\":\"ab12\"}\n";
        assert_eq!(done_hash(output).as_deref(), Some("ab12"));
        assert_eq!(done_hash("{\"event\":\"step\"}\nnot json\n"), None);
    }
}
