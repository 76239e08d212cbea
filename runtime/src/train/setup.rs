//! What a rank's run is made of, checked from the flags and the environment before anything
//! starts, and the compute threads pinned before that.

use std::path::PathBuf;
use std::time::Duration;

use candle_core::Device;

use super::data::Corpus;
use super::model::{ModelConfig, ParamSpec, VOCAB};
use super::optim::AdamWConfig;
use super::{DeviceKind, TrainArgs, TrainError};
use crate::collective::Membership;

/// Everything a rank's run is made of, settled before the first step.
pub(super) struct Setup {
    pub(super) args: TrainArgs,
    pub(super) membership: Membership,
    pub(super) job_id: String,
    pub(super) attempt: u32,
    pub(super) config: ModelConfig,
    pub(super) specs: Vec<ParamSpec>,
    pub(super) optimizer: AdamWConfig,
    pub(super) corpus: Corpus,
    pub(super) device: Device,
    pub(super) threads: usize,
    pub(super) checkpoint_dir: Option<PathBuf>,
}

/// Set to the thread count once the trainer re-executed itself with it (so it never loops).
const THREADS_PINNED_VAR: &str = "FLEETMEND_TRAIN_THREADS_PINNED";

/// candle sizes its CPU thread pools from `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS` (else the
/// number of cores), read when first used, and its element-wise pool's idle workers spin: four
/// ranks on two cores, each with spinning workers, ran ~5× slower. The environment of a running
/// process cannot be changed safely, so the trainer replaces itself (same pid, so the launcher's
/// signals still reach it) with the variables set. Returns only when no re-exec is needed or it
/// failed (then candle's defaults apply: slower, same results).
pub(super) fn pin_compute_threads(threads: usize) {
    let want = threads.to_string();
    let set = |name: &str| std::env::var(name).is_ok_and(|v| v == want);
    if set("CANDLE_NUM_THREADS") && set("RAYON_NUM_THREADS") {
        return;
    }
    if std::env::var_os(THREADS_PINNED_VAR).is_some() {
        eprintln!(
            "fleetmend train: warning: CANDLE_NUM_THREADS/RAYON_NUM_THREADS differ from --threads {threads} after re-executing; going on with them"
        );
        return;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!(
                "fleetmend train: warning: cannot find this executable to pin {threads} compute threads ({err}); going on with candle's default"
            );
            return;
        }
    };
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env("CANDLE_NUM_THREADS", &want)
        .env("RAYON_NUM_THREADS", &want)
        .env(THREADS_PINNED_VAR, &want)
        .exec();
    eprintln!(
        "fleetmend train: warning: cannot re-execute {} to pin {threads} compute threads ({err}); going on with candle's default",
        exe.display()
    );
}

pub(super) fn setup(args: TrainArgs) -> Result<Setup, TrainError> {
    let config = ModelConfig {
        vocab: VOCAB,
        model_dim: args.model_dim,
        layers: args.layers,
        heads: args.heads,
        context: args.context,
    };
    let mut problems = config.problems();
    if args.batch_size == 0 {
        problems.push("--batch-size: must be at least 1".to_string());
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        problems.push(format!("--lr: {} is not a positive number", args.lr));
    }
    if args.keep == 0 {
        problems.push("--keep: must be at least 1".to_string());
    }
    if args.threads == 0 {
        problems.push("--threads: must be at least 1".to_string());
    }
    if args.collective_timeout < Duration::from_millis(10) {
        problems.push("--collective-timeout: must be at least 10ms".to_string());
    }
    if args.rendezvous_timeout.is_zero() {
        problems.push("--rendezvous-timeout: must be more than 0".to_string());
    }
    // Without RANK and WORLD_SIZE this is a run of one.
    let membership = match Membership::from_env() {
        Ok(membership) => Some(membership),
        Err(err) => {
            problems.extend(err.problems);
            None
        }
    };
    let device = match args.device {
        DeviceKind::Cpu => Some(Device::Cpu),
        DeviceKind::Cuda => cuda_device(&mut problems),
    };
    let corpus = match &args.data {
        None => Some(Corpus::synthetic(args.seed)),
        Some(path) => match Corpus::from_file(path, args.context) {
            Ok(corpus) => Some(corpus),
            Err(err) => {
                problems.push(format!("--data: {err}"));
                None
            }
        },
    };
    let (Some(membership), Some(device), Some(corpus)) = (membership, device, corpus) else {
        return Err(TrainError::InvalidSetup { problems });
    };
    if !problems.is_empty() {
        return Err(TrainError::InvalidSetup { problems });
    }
    let threads = args.threads;
    let job_id = std::env::var("FLEETMEND_JOB_ID")
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| "local".to_string());
    let attempt = std::env::var("FLEETMEND_RESTART_COUNT")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let checkpoint_dir = args.checkpoint_dir.clone().filter(|d| !d.as_os_str().is_empty());
    Ok(Setup {
        optimizer: AdamWConfig::with_lr(args.lr),
        specs: config.param_specs(),
        args,
        membership,
        job_id,
        attempt,
        config,
        corpus,
        device,
        threads,
        checkpoint_dir,
    })
}

#[cfg(feature = "cuda")]
fn cuda_device(problems: &mut Vec<String>) -> Option<Device> {
    let ordinal = std::env::var("LOCAL_RANK").ok().and_then(|n| n.parse().ok()).unwrap_or(0);
    match Device::new_cuda(ordinal) {
        Ok(device) => Some(device),
        Err(err) => {
            problems.push(format!("--device cuda: GPU {ordinal}: {err}"));
            None
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(problems: &mut Vec<String>) -> Option<Device> {
    problems.push(
        "--device cuda: this fleetmend was built without CUDA (rebuild with `--features cuda`)"
            .to_string(),
    );
    None
}
