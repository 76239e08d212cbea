//! `fleetmend simulate`: a discrete-event simulation of a fleet's failures and fleetmend's repairs
//! on the repairer's own decision code, in virtual time.
//!
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
//! - [`run`]: the simulation: the repairer's own engine, policy, workflows, guard rails and
//!   embedded job queue on a [`fleetmend_repairer::clock::VirtualClock`], driven as a
//!   discrete-event simulation against [`world`] (the simulated nodes and their agents, the
//!   provider's reboots and replacements, people fixing what the repairer leaves to them) and the
//!   simulated training jobs of [`job`], which follow the checkpoint protocol.
//! - [`gang`]: the scheduler of `job.scheduler = "gang"` (the default): the jobs' ranks moved as
//!   one per attempt, by the queue's rules and placement, a restart a few events rather than
//!   several per rank; `"queue"` runs the repairer's embedded job queue rank by rank instead.
//! - [`config`], [`report`], [`cli`] and [`plot`]: the settings (one TOML document, every field
//!   overridable by its dotted path), the results (text and deterministic JSON), the
//!   `fleetmend simulate` command with its sweep (one key, or two as a grid), and the SVG chart.
//! - [`spares`]: the nodes out of service over the run and the hot spares that would have
//!   covered them (the report's recommended spare pool).
//! - [`replications`] and [`stats`]: one setting run under several seeds (`--seeds N`), its mean
//!   ETTR with a Student's t confidence interval and the means of the other headline figures.
//! - [`inputs`], [`recorded`] and [`replay`]: an operator's own inputs: a real repairer config's
//!   policy, engine and queue (`--repairer-config`), the fleet's inventory (`--inventory`), and a
//!   failure history exported from a running repairer, made ready to strike ([`recorded`]),
//!   struck again instead of the random failures and its decisions compared node by node
//!   (`--replay`).
//!
//! What the simulation does not send: the heartbeats of nodes with nothing new to say (2,048
//! nodes every 10 s for 54 days would be ~955 million reports that change nothing). A node reports
//! when something changes, sends its heartbeats in full while a fault is new (the policy debounces
//! by observations), takes the commands waiting for it at its heartbeat times, and is otherwise
//! heard from through [`ports::Presence`], the repairer's `Heartbeats` port.

pub mod catalog;
pub mod cli;
pub mod config;
pub mod failures;
pub mod gang;
pub mod inputs;
pub mod job;
pub mod model;
pub mod noise;
pub mod plot;
pub mod ports;
pub mod recorded;
pub mod replay;
pub mod replications;
pub mod report;
pub mod run;
pub mod spares;
pub mod stats;
pub mod store;
pub mod world;
