//! What the fleet's job trains and at what pace: the flags `fleetmend up` adds to the bundled
//! trainer's command line (`fleetmend train`), the same on the embedded queue and on Slurm.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The model the fleet's job trains.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TrainModel {
    /// The trainer's own default (64 wide, 2 blocks, 8 sequences of 64 bytes): about 50 ms of
    /// one core per rank and step in a debug build.
    #[default]
    Default,
    /// 32 wide, 1 block, 4 sequences of 32 bytes: about 4 ms per rank and step. With `pace`,
    /// a fleet that spends its time on faults and repairs rather than on arithmetic, so that
    /// several fleets share one machine's cores.
    Small,
}

impl TrainModel {
    /// The trainer's flags for this model.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            TrainModel::Default => &[],
            TrainModel::Small => {
                &["--model-dim", "32", "--layers", "1", "--batch-size", "4", "--context", "32"]
            }
        }
    }
}

/// The trainer's flags for `model` at `pace` (zero: no pace).
pub fn trainer_args(model: TrainModel, pace: Duration) -> Vec<String> {
    let mut args: Vec<String> = model.args().iter().map(|a| (*a).to_owned()).collect();
    if !pace.is_zero() {
        args.push(PACE_FLAG.to_owned());
        args.push(humantime::format_duration(pace).to_string());
    }
    args
}

/// The trainer's flag that paces its steps.
const PACE_FLAG: &str = "--pace";

/// `argv` without its `--pace` flag: the same job at the speed of its compute. A pace changes no
/// number the job computes, so an uninterrupted reference run need not wait it out.
pub fn unpaced(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut args = argv.iter();
    while let Some(arg) = args.next() {
        if arg == PACE_FLAG {
            args.next();
        } else if !arg.starts_with("--pace=") {
            out.push(arg.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_paced_model_adds_its_flags_and_the_reference_drops_the_pace() {
        let args = trainer_args(TrainModel::Small, Duration::from_millis(125));
        assert_eq!(args[args.len() - 2..], ["--pace", "125ms"]);
        assert!(args.contains(&"--model-dim".to_owned()));
        assert!(trainer_args(TrainModel::Default, Duration::ZERO).is_empty());
        let mut argv = vec!["fleetmend".to_owned(), "train".to_owned()];
        argv.extend(args.clone());
        argv.push("--pace=1s".to_owned());
        let bare = unpaced(&argv);
        assert!(!bare.iter().any(|a| a.starts_with("--pace")), "{bare:?}");
        assert_eq!(bare.len(), 2 + args.len() - 2);
    }
}
