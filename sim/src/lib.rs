//! Building blocks of `fleetmend simulate`, the discrete-event fleet simulator (issue 12).
//!
//! What is here, each complete and tested on its own:
//! - [`catalog`]: the fault catalog as data. Which root causes interrupt a run and how often
//!   (the default is Llama 3 405B pre-training, arXiv 2407.21783, Table 5), what fleetmend's
//!   agent sees of each (check, finding, and the `fleetmend inject` fault that reproduces it),
//!   whether a reboot clears it, and how long a reboot or a replacement takes. Overridable TOML,
//!   validated with every problem named by its field.
//! - [`failures`]: seeded failure processes: per-node exponential or Weibull renewal, lemon nodes
//!   failing several times as often, correlated leaf-switch and driver-rollout failures, as a
//!   time-ordered stream of [`failures::FailureEvent`]s up to a horizon.
//! - [`model`]: the closed-form ETTR model of Kokolis et al. (arXiv 2410.21680) and the Young/Daly
//!   checkpoint interval, the yardstick the simulator's results are checked against.
//!
//! What it does not do yet: there is no simulation loop. Running the repairer's own decision code
//! (policy, engine, workflows, guard rails) on a virtual clock against simulated nodes, a simulated
//! provider and checkpointing jobs; repairs that report success without fixing the node; ETTR and
//! lost-time accounting; the `fleetmend simulate` command and its output all come with issue 12's
//! later steps, on top of these pieces.

pub mod catalog;
pub mod failures;
pub mod model;
