//! `fleetmend allreduce`: one rank of the `allreduce` probe. The agent runs it when the repairer
//! sends an `allreduce` command; it meets the other nodes through `MASTER_ADDR`/`MASTER_PORT`
//! (torchrun's variables, as a job's rank does), runs one warm-up and `--iterations` timed
//! all-reduces of `--bytes` of `f32`, each after a barrier, checks the first against the exact sum,
//! and prints what it measured as one line of JSON ([`AllreduceMeasurement`]).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use fleetmend_proto::probes::AllreduceMeasurement;
use fleetmend_proto::stats::median;

use crate::collective::{CollectiveConfig, Communicator, Membership};

/// Largest buffer one probe reduces.
pub const MAX_BYTES: u64 = 1 << 30;

/// `fleetmend allreduce`.
#[derive(Debug, Clone, clap::Args)]
pub struct AllreduceArgs {
    /// Bytes of `f32` each rank reduces per operation.
    #[arg(long, default_value_t = 64 << 20)]
    pub bytes: u64,
    /// Timed operations, after one warm-up.
    #[arg(long, default_value_t = 5)]
    pub iterations: u32,
    /// The whole probe, the rendezvous included, within this.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// The probe could not run or measure.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Setup(String),
    #[error("the rendezvous: {0}")]
    Rendezvous(#[from] crate::collective::RendezvousError),
    #[error("the all-reduce: {0}")]
    Collective(#[from] crate::collective::CollectiveError),
    #[error("the all-reduce's sum is wrong at element {index}: {got} (expected {expected})")]
    WrongSum { index: usize, got: f32, expected: f32 },
}

pub fn main(args: AllreduceArgs) -> ExitCode {
    let membership = match Membership::from_env() {
        Ok(membership) => membership,
        Err(err) => {
            eprintln!("fleetmend allreduce: {err}");
            return ExitCode::from(2);
        }
    };
    match measure(&membership, &args) {
        Ok(measured) => match serde_json::to_string(&measured) {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("fleetmend allreduce: writing the measurement: {err}");
                ExitCode::FAILURE
            }
        },
        Err(err) => {
            eprintln!("fleetmend allreduce: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the probe as `membership`'s rank.
pub fn measure(
    membership: &Membership,
    args: &AllreduceArgs,
) -> Result<AllreduceMeasurement, ProbeError> {
    if membership.world_size < 2 {
        return Err(ProbeError::Setup("the probe needs WORLD_SIZE of at least 2".to_owned()));
    }
    if args.bytes < 4 || args.bytes > MAX_BYTES {
        return Err(ProbeError::Setup(format!(
            "--bytes: {} is not between 4 and {MAX_BYTES}",
            args.bytes
        )));
    }
    if args.iterations == 0 {
        return Err(ProbeError::Setup("--iterations: must be at least 1".to_owned()));
    }
    let config = CollectiveConfig {
        rendezvous_timeout: args.timeout,
        collective_timeout: args.timeout.min(Duration::from_secs(30)),
        ..CollectiveConfig::default()
    };
    let mut ring = Communicator::connect(membership, &config)?;
    let elements = usize::try_from(args.bytes / 4).unwrap_or(usize::MAX);
    // Rank r's element i is r + 1: every element sums to n(n+1)/2, exact in f32.
    let own = (membership.rank + 1) as f32;
    let expected = (membership.world_size * (membership.world_size + 1) / 2) as f32;
    let mut values = vec![own; elements];
    ring.barrier()?;
    ring.all_reduce_sum(&mut values)?;
    if let Some((index, got)) = values.iter().copied().enumerate().find(|(_, v)| *v != expected) {
        return Err(ProbeError::WrongSum { index, got, expected });
    }
    let mut times = Vec::with_capacity(args.iterations as usize);
    for _ in 0..args.iterations {
        values.fill(own);
        ring.barrier()?;
        let started = Instant::now();
        ring.all_reduce_sum(&mut values)?;
        // The next barrier ends when the slowest rank finished: this rank's time is the ring's.
        ring.barrier()?;
        times.push(started.elapsed().as_secs_f64());
    }
    // Never zero, the bandwidth divides by it; at least one iteration ran (checked above).
    let seconds = median(times).unwrap_or_default().max(f64::MIN_POSITIVE);
    let n = membership.world_size as f64;
    let busbw_gbps = 2.0 * (n - 1.0) / n * args.bytes as f64 / seconds / 1e9;
    Ok(AllreduceMeasurement {
        bytes: args.bytes,
        world_size: membership.world_size as u32,
        seconds,
        busbw_gbps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership(rank: usize, port: u16) -> Membership {
        Membership {
            rank,
            world_size: 2,
            master_addr: "127.0.0.1".to_owned(),
            master_port: port,
            run_id: "probe#0".to_owned(),
        }
    }

    #[test]
    fn two_ranks_measure_the_same_ring() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(29_500);
        let args =
            AllreduceArgs { bytes: 1 << 20, iterations: 3, timeout: Duration::from_secs(30) };
        let other = {
            let args = args.clone();
            std::thread::spawn(move || measure(&membership(1, port), &args))
        };
        let first = measure(&membership(0, port), &args);
        let second = other.join().map_err(|_| "rank 1 panicked");
        let (Ok(first), Ok(Ok(second))) = (first, second) else {
            panic!("a rank failed");
        };
        assert_eq!(first.bytes, 1 << 20);
        assert_eq!(first.world_size, 2);
        assert!(first.busbw_gbps > 0.0 && second.busbw_gbps > 0.0);
    }

    #[test]
    fn a_world_of_one_and_bad_sizes_are_refused_before_any_network() {
        let args = AllreduceArgs { bytes: 1 << 20, iterations: 1, timeout: Duration::from_secs(1) };
        assert!(matches!(measure(&Membership::alone(), &args), Err(ProbeError::Setup(_))));
        let tiny = AllreduceArgs { bytes: 2, ..args.clone() };
        assert!(matches!(measure(&membership(0, 1), &tiny), Err(ProbeError::Setup(_))));
        let none = AllreduceArgs { iterations: 0, ..args };
        assert!(matches!(measure(&membership(0, 1), &none), Err(ProbeError::Setup(_))));
    }
}
