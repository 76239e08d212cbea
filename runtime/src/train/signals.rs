//! The signals a rank acts on (the checkpoint protocol's SIGTERM and SIGUSR1, and the NaN fault
//! hook's SIGUSR2), as flags the step loop reads at each step.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::TrainError;

/// The signals, as flags the training loop reads at each step.
pub(super) struct Signals {
    /// SIGUSR1 since the last step.
    pub(super) checkpoint: Arc<AtomicBool>,
    /// SIGTERM or SIGINT at any time.
    pub(super) stop: Arc<AtomicBool>,
    /// While set (before training starts: rendezvous, resume), SIGTERM exits at once with 0:
    /// there is no progress to save yet.
    pub(super) starting: Arc<AtomicBool>,
    /// SIGUSR2 since the last step: the fault hook `fleetmend inject NODE nan` uses. The rank's
    /// next gradient gets a NaN, as a bad batch or silent data corruption would give it; the
    /// all-reduce spreads it to every rank's weights and the loss goes NaN from the step after.
    pub(super) poison: Arc<AtomicBool>,
}

impl Signals {
    pub(super) fn register() -> Result<Self, TrainError> {
        use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
        let signals = Signals {
            checkpoint: Arc::new(AtomicBool::new(false)),
            stop: Arc::new(AtomicBool::new(false)),
            starting: Arc::new(AtomicBool::new(true)),
            poison: Arc::new(AtomicBool::new(false)),
        };
        let problem = |e: std::io::Error| TrainError::InvalidSetup {
            problems: vec![format!("registering signal handlers: {e}")],
        };
        for signal in [SIGTERM, SIGINT] {
            signal_hook::flag::register_conditional_shutdown(signal, 0, signals.starting.clone())
                .map_err(problem)?;
            signal_hook::flag::register(signal, signals.stop.clone()).map_err(problem)?;
        }
        signal_hook::flag::register(SIGUSR1, signals.checkpoint.clone()).map_err(problem)?;
        signal_hook::flag::register(SIGUSR2, signals.poison.clone()).map_err(problem)?;
        Ok(signals)
    }
}
