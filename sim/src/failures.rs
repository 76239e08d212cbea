//! Failure processes: when nodes fail, which nodes, and of what, as a time-ordered stream that the
//! same seed always reproduces.
//!
//! Every node runs its own renewal process (the time to its next failure drawn afresh after each
//! one, from t = 0 for every node): exponential by default, Weibull optional. "Lemon" nodes draw
//! their times `factor` times shorter, so they fail that many times as often. Each independent
//! failure's category is drawn by the catalog's shares. On top run two fleet-wide processes of
//! correlated failures: a leaf switch taking down the contiguous block of nodes behind it, and a
//! bad driver rollout hitting a share of the fleet at once.
//!
//! The stream knows nothing of repairs: a node keeps failing on its own clock whether or not it is
//! up. The simulator decides what a failure of a node that is already down means.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::catalog::FaultCatalog;
use fleetmend_agent::config::ConfigProblems;

const DAY_SECONDS: f64 = 86_400.0;

/// How the failures are drawn.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureConfig {
    /// How many nodes fail (node ids are 0..nodes).
    pub nodes: u32,
    /// The time between two failures of one node that is not a lemon.
    pub inter_failure: InterFailure,
    /// Nodes that fail more often than the rest.
    #[serde(default)]
    pub lemons: Lemons,
    /// Failures that take many nodes at once.
    #[serde(default)]
    pub correlated: CorrelatedFailures,
}

/// The distribution of the time between two failures of one (non-lemon) node.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(tag = "distribution", rename_all = "snake_case", deny_unknown_fields)]
pub enum InterFailure {
    /// Memoryless, with this mean.
    Exponential {
        #[serde(with = "humantime_serde")]
        mean: Duration,
    },
    /// Weibull: shape < 1 is infant mortality (failures cluster early), > 1 wear-out.
    Weibull {
        shape: f64,
        #[serde(with = "humantime_serde")]
        scale: Duration,
    },
}

impl InterFailure {
    /// The mean time between failures, in seconds (Weibull: scale · Γ(1 + 1/shape)).
    pub fn mean_seconds(&self) -> f64 {
        match *self {
            InterFailure::Exponential { mean } => mean.as_secs_f64(),
            InterFailure::Weibull { shape, scale } => {
                scale.as_secs_f64() * gamma(1.0 + 1.0 / shape)
            }
        }
    }

    /// One draw, in seconds, for a node whose times are `speedup` times shorter.
    fn sample_seconds(&self, rng: &mut fastrand::Rng, speedup: f64) -> f64 {
        // 1 - [0, 1) is (0, 1]: the logarithm stays finite.
        let unit = -(1.0 - rng.f64()).ln();
        let seconds = match *self {
            InterFailure::Exponential { mean } => mean.as_secs_f64() * unit,
            InterFailure::Weibull { shape, scale } => scale.as_secs_f64() * unit.powf(1.0 / shape),
        };
        seconds / speedup
    }
}

/// A share of the fleet that fails more often (AIReSim's Table I: 15 % failing 5×).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lemons {
    /// The share of nodes that are lemons, 0 to 1 (rounded to whole nodes, chosen by the seed).
    pub fraction: f64,
    /// How many times as often a lemon fails as another node (1 or more).
    pub factor: f64,
}

impl Default for Lemons {
    fn default() -> Self {
        Lemons { fraction: 0.15, factor: 5.0 }
    }
}

/// Correlated failures; each kind is off unless configured.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrelatedFailures {
    /// A leaf switch fails and every node behind it drops at once.
    #[serde(default)]
    pub leaf_switch: Option<LeafSwitchFailures>,
    /// A bad driver rollout breaks a share of the fleet at once.
    #[serde(default)]
    pub driver_rollout: Option<DriverRollouts>,
}

/// Leaf-switch failures: exponential in time over the whole fleet.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeafSwitchFailures {
    /// The mean time between two leaf-switch failures anywhere in the fleet.
    #[serde(with = "humantime_serde")]
    pub mean_interval: Duration,
    /// The fewest nodes behind one leaf switch.
    pub min_nodes: u32,
    /// The most nodes behind one leaf switch.
    pub max_nodes: u32,
    /// The catalog category the nodes fail with (`network-switch-cable`).
    pub category: String,
}

/// Bad driver rollouts: exponential in time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverRollouts {
    /// The mean time between two bad rollouts.
    #[serde(with = "humantime_serde")]
    pub mean_interval: Duration,
    /// The share of the fleet one bad rollout breaks, above 0 and at most 1.
    pub fraction: f64,
    /// The catalog category the nodes fail with (`software-bug`).
    pub category: String,
}

/// One failure: one node, or many at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureEvent {
    /// When, from the start of the run.
    pub at: Duration,
    /// The nodes that fail, in ascending order.
    pub nodes: Vec<u32>,
    /// The index of the failure's category in the catalog's `categories`.
    pub category: usize,
    /// Whether this is a correlated failure (leaf switch, driver rollout) rather than one node's.
    pub correlated: bool,
}

/// A failure config that cannot be run, with every problem in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failure config has {} problem(s):\n{problems}", problems.len())]
pub struct FailureConfigError {
    pub problems: ConfigProblems,
}

impl FailureConfigError {
    /// Whether a problem names `field`.
    pub fn names(&self, field: &str) -> bool {
        self.problems.names(field)
    }
}

impl FailureConfig {
    /// The catalog's fleet with the default lemons (15 % failing 5×), the exponential mean chosen
    /// so that the fleet expects the catalog's count of failures over its window (419 in 54 days
    /// for Llama 3), and no correlated failures (the catalog has none).
    pub fn from_catalog(catalog: &FaultCatalog) -> FailureConfig {
        let lemons = Lemons::default();
        let fleet_rate = catalog.rate_per_node_day() / DAY_SECONDS;
        // The fleet's mean rate is base · (1 − f + f·k); solve for the base.
        let base_rate = fleet_rate / (1.0 - lemons.fraction + lemons.fraction * lemons.factor);
        let mean = if base_rate > 0.0 {
            Duration::try_from_secs_f64(1.0 / base_rate).unwrap_or(Duration::MAX)
        } else {
            Duration::MAX
        };
        FailureConfig {
            nodes: catalog.nodes,
            inter_failure: InterFailure::Exponential { mean },
            lemons,
            correlated: CorrelatedFailures::default(),
        }
    }

    /// The expected independent failures of the whole fleet per second (correlated ones aside).
    pub fn fleet_rate_per_second(&self) -> f64 {
        let base = 1.0 / self.inter_failure.mean_seconds();
        let lemons = lemon_count(self.nodes, self.lemons.fraction);
        let normal = f64::from(self.nodes - lemons);
        base * (normal + f64::from(lemons) * self.lemons.factor)
    }

    /// Every problem in the config, against the catalog whose categories it names.
    pub fn validate(&self, catalog: &FaultCatalog) -> ConfigProblems {
        let mut problems = ConfigProblems::default();
        let mut push = |field: &str, message: String| problems.push(field, message);
        if self.nodes == 0 {
            push("nodes", "must be greater than zero".to_owned());
        }
        match self.inter_failure {
            InterFailure::Exponential { mean } if mean.is_zero() => {
                push("inter_failure.mean", "must be greater than zero".to_owned());
            }
            InterFailure::Exponential { .. } => {}
            InterFailure::Weibull { shape, scale } => {
                // Below 0.1 the draws span more orders of magnitude than a run can use.
                if !(shape.is_finite() && (0.1..=20.0).contains(&shape)) {
                    push("inter_failure.shape", format!("{shape} is not from 0.1 to 20"));
                }
                if scale.is_zero() {
                    push("inter_failure.scale", "must be greater than zero".to_owned());
                }
            }
        }
        let Lemons { fraction, factor } = self.lemons;
        if !(0.0..=1.0).contains(&fraction) {
            push("lemons.fraction", format!("{fraction} is not from 0 to 1"));
        }
        if !(factor.is_finite() && factor >= 1.0) {
            push("lemons.factor", format!("{factor} is not a finite number of at least 1"));
        }
        if catalog.total_count() == 0 {
            push(
                "catalog",
                "the catalog's counts sum to zero: no category can be drawn".to_owned(),
            );
        }
        let mut category = |field: &str, name: &str| {
            if catalog.index_of(name).is_none() {
                push(field, format!("{name:?} is not a category of the catalog"));
            }
        };
        if let Some(leaf) = &self.correlated.leaf_switch {
            category("correlated.leaf_switch.category", &leaf.category);
        }
        if let Some(rollout) = &self.correlated.driver_rollout {
            category("correlated.driver_rollout.category", &rollout.category);
        }
        if let Some(leaf) = &self.correlated.leaf_switch {
            if leaf.mean_interval.is_zero() {
                push(
                    "correlated.leaf_switch.mean_interval",
                    "must be greater than zero".to_owned(),
                );
            }
            if leaf.min_nodes == 0 {
                push("correlated.leaf_switch.min_nodes", "must be greater than zero".to_owned());
            }
            if leaf.max_nodes < leaf.min_nodes {
                push(
                    "correlated.leaf_switch.max_nodes",
                    format!("{} is less than min_nodes ({})", leaf.max_nodes, leaf.min_nodes),
                );
            }
        }
        if let Some(rollout) = &self.correlated.driver_rollout {
            if rollout.mean_interval.is_zero() {
                push(
                    "correlated.driver_rollout.mean_interval",
                    "must be greater than zero".to_owned(),
                );
            }
            if !(rollout.fraction > 0.0 && rollout.fraction <= 1.0) {
                push(
                    "correlated.driver_rollout.fraction",
                    format!("{} is not above 0 and at most 1", rollout.fraction),
                );
            }
        }
        problems
    }
}

/// Whole lemon nodes for a share of the fleet.
fn lemon_count(nodes: u32, fraction: f64) -> u32 {
    // In range by validation; the clamp keeps a bad value from wrapping.
    (f64::from(nodes) * fraction.clamp(0.0, 1.0)).round() as u32
}

/// A pending failure of one node, ordered earliest first (then by node, for a stable order).
#[derive(Debug, Clone, Copy, PartialEq)]
struct NodeDue {
    at: f64,
    node: u32,
}

impl Eq for NodeDue {}

impl Ord for NodeDue {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap.
        other.at.total_cmp(&self.at).then_with(|| other.node.cmp(&self.node))
    }
}

impl PartialOrd for NodeDue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The leaf-switch process, resolved against the catalog.
#[derive(Debug, Clone)]
struct LeafSwitchProcess {
    mean: f64,
    min_nodes: u32,
    max_nodes: u32,
    category: usize,
    next: f64,
}

/// The driver-rollout process, resolved against the catalog.
#[derive(Debug, Clone)]
struct RolloutProcess {
    mean: f64,
    nodes: u32,
    category: usize,
    next: f64,
}

/// The failures of a fleet up to a horizon, in time order; the same config, catalog and seed give
/// the same stream.
pub struct FailureStream {
    rng: fastrand::Rng,
    inter_failure: InterFailure,
    /// Per node: how many times shorter its times are (the lemon factor, or 1).
    speedup: Vec<f64>,
    due: BinaryHeap<NodeDue>,
    /// The catalog's counts, cumulative, for drawing a category by share.
    cumulative: Vec<u64>,
    leaf_switch: Option<LeafSwitchProcess>,
    rollout: Option<RolloutProcess>,
    fleet_nodes: u32,
    horizon: f64,
}

impl fmt::Debug for FailureStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureStream")
            .field("nodes", &self.fleet_nodes)
            .field("pending", &self.due.len())
            .field("horizon_seconds", &self.horizon)
            .finish_non_exhaustive()
    }
}

impl FailureStream {
    /// A stream of the failures of `config`'s fleet from 0 up to `horizon`, drawn with `seed`.
    pub fn new(
        config: &FailureConfig,
        catalog: &FaultCatalog,
        seed: u64,
        horizon: Duration,
    ) -> Result<FailureStream, FailureConfigError> {
        let mut problems = config.validate(catalog);
        problems.extend_under("catalog.", catalog.validate());
        if !problems.is_empty() {
            return Err(FailureConfigError { problems });
        }
        let mut rng = fastrand::Rng::with_seed(seed);
        let nodes = config.nodes;
        let mut speedup = vec![1.0; nodes as usize];
        let lemons = lemon_count(nodes, config.lemons.fraction);
        for node in sample_nodes(&mut rng, nodes, lemons) {
            speedup[node as usize] = config.lemons.factor;
        }
        let mut due = BinaryHeap::with_capacity(nodes as usize);
        for node in 0..nodes {
            let at = config.inter_failure.sample_seconds(&mut rng, speedup[node as usize]);
            due.push(NodeDue { at, node });
        }
        let mut total = 0;
        let cumulative = catalog
            .categories
            .iter()
            .map(|category| {
                total += u64::from(category.count);
                total
            })
            .collect();
        let leaf_switch = config.correlated.leaf_switch.as_ref().and_then(|leaf| {
            let mean = leaf.mean_interval.as_secs_f64();
            Some(LeafSwitchProcess {
                mean,
                min_nodes: leaf.min_nodes,
                max_nodes: leaf.max_nodes,
                category: catalog.index_of(&leaf.category)?,
                next: exponential(&mut rng, mean),
            })
        });
        let rollout = config.correlated.driver_rollout.as_ref().and_then(|rollout| {
            let mean = rollout.mean_interval.as_secs_f64();
            let hit = (f64::from(nodes) * rollout.fraction).round().max(1.0) as u32;
            Some(RolloutProcess {
                mean,
                nodes: hit.min(nodes),
                category: catalog.index_of(&rollout.category)?,
                next: exponential(&mut rng, mean),
            })
        });
        Ok(FailureStream {
            rng,
            inter_failure: config.inter_failure,
            speedup,
            due,
            cumulative,
            leaf_switch,
            rollout,
            fleet_nodes: nodes,
            horizon: horizon.as_secs_f64(),
        })
    }

    /// Whether `node` is a lemon.
    pub fn is_lemon(&self, node: u32) -> bool {
        self.speedup.get(node as usize).is_some_and(|&speedup| speedup > 1.0)
    }

    /// The lemon nodes, in ascending order.
    pub fn lemons(&self) -> Vec<u32> {
        (0..self.fleet_nodes).filter(|&node| self.is_lemon(node)).collect()
    }

    fn draw_category(&mut self) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(0);
        if total == 0 {
            return 0;
        }
        let pick = self.rng.u64(0..total);
        self.cumulative.partition_point(|&upto| upto <= pick)
    }

    fn leaf_switch_event(&mut self) -> Option<FailureEvent> {
        let leaf = self.leaf_switch.as_mut()?;
        let at = leaf.next;
        leaf.next = at + exponential(&mut self.rng, leaf.mean);
        let size = self.rng.u32(leaf.min_nodes..=leaf.max_nodes).min(self.fleet_nodes);
        // The nodes behind one switch are a contiguous block of ids.
        let first = self.rng.u32(0..=self.fleet_nodes - size);
        Some(FailureEvent {
            at: seconds(at),
            nodes: (first..first + size).collect(),
            category: leaf.category,
            correlated: true,
        })
    }

    fn rollout_event(&mut self) -> Option<FailureEvent> {
        let rollout = self.rollout.as_mut()?;
        let at = rollout.next;
        rollout.next = at + exponential(&mut self.rng, rollout.mean);
        let (hit, category) = (rollout.nodes, rollout.category);
        Some(FailureEvent {
            at: seconds(at),
            nodes: sample_nodes(&mut self.rng, self.fleet_nodes, hit),
            category,
            correlated: true,
        })
    }
}

impl Iterator for FailureStream {
    type Item = FailureEvent;

    fn next(&mut self) -> Option<FailureEvent> {
        let node_at = self.due.peek().map_or(f64::INFINITY, |due| due.at);
        let leaf_at = self.leaf_switch.as_ref().map_or(f64::INFINITY, |leaf| leaf.next);
        let rollout_at = self.rollout.as_ref().map_or(f64::INFINITY, |rollout| rollout.next);
        let earliest = node_at.min(leaf_at).min(rollout_at);
        if !earliest.is_finite() || earliest >= self.horizon {
            return None;
        }
        // Ties go to the single node first, then the switch, then the rollout: a fixed order.
        if node_at <= leaf_at && node_at <= rollout_at {
            let due = self.due.pop()?;
            let speedup = self.speedup[due.node as usize];
            let next = due.at + self.inter_failure.sample_seconds(&mut self.rng, speedup);
            self.due.push(NodeDue { at: next, node: due.node });
            let category = self.draw_category();
            return Some(FailureEvent {
                at: seconds(due.at),
                nodes: vec![due.node],
                category,
                correlated: false,
            });
        }
        if leaf_at <= rollout_at { self.leaf_switch_event() } else { self.rollout_event() }
    }
}

/// `count` distinct nodes of `0..nodes`, in ascending order (a partial Fisher–Yates shuffle).
fn sample_nodes(rng: &mut fastrand::Rng, nodes: u32, count: u32) -> Vec<u32> {
    let count = count.min(nodes) as usize;
    let mut ids: Vec<u32> = (0..nodes).collect();
    for i in 0..count {
        let j = rng.usize(i..ids.len());
        ids.swap(i, j);
    }
    ids.truncate(count);
    ids.sort_unstable();
    ids
}

fn exponential(rng: &mut fastrand::Rng, mean: f64) -> f64 {
    -(1.0 - rng.f64()).ln() * mean
}

/// Seconds (below the horizon, so finite and non-negative) as a Duration.
fn seconds(at: f64) -> Duration {
    Duration::try_from_secs_f64(at).unwrap_or(Duration::MAX)
}

/// Γ(x) for x > 0 (Lanczos, g = 7, nine terms: ~15 significant digits), for the Weibull mean.
pub fn gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)·Γ(1 − x) = π / sin(πx).
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma(1.0 - x));
    }
    let x = x - 1.0;
    let mut sum = COEFFICIENTS[0];
    for (i, coefficient) in COEFFICIENTS.iter().enumerate().skip(1) {
        sum += coefficient / (x + i as f64);
    }
    let t = x + G + 0.5;
    (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * sum
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn catalog() -> FaultCatalog {
        FaultCatalog::builtin().unwrap()
    }

    fn config(nodes: u32, inter_failure: InterFailure, lemons: Lemons) -> FailureConfig {
        FailureConfig { nodes, inter_failure, lemons, correlated: CorrelatedFailures::default() }
    }

    const NO_LEMONS: Lemons = Lemons { fraction: 0.0, factor: 1.0 };

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let catalog = catalog();
        let mut config = FailureConfig::from_catalog(&catalog);
        config.correlated.leaf_switch = Some(LeafSwitchFailures {
            mean_interval: 5 * DAY,
            min_nodes: 16,
            max_nodes: 32,
            category: "network-switch-cable".to_owned(),
        });
        let run = |seed| {
            FailureStream::new(&config, &catalog, seed, 54 * DAY).unwrap().collect::<Vec<_>>()
        };
        let first = run(7);
        assert_eq!(first, run(7));
        assert_ne!(first, run(8));
        assert!(first.windows(2).all(|pair| pair[0].at <= pair[1].at));
        assert!(first.iter().all(|event| event.at < 54 * DAY));
    }

    #[test]
    fn the_catalog_default_expects_the_catalogs_count() {
        let catalog = catalog();
        let config = FailureConfig::from_catalog(&catalog);
        let expected = config.fleet_rate_per_second() * catalog.window.as_secs_f64();
        assert!((expected - 419.0).abs() < 1.0, "{expected}");
        // Over 50 windows the realised count is within 3 % of 50 × 419 (sd ≈ 0.7 %).
        let events = FailureStream::new(&config, &catalog, 1, 50 * catalog.window).unwrap().count();
        let ratio = events as f64 / (50.0 * 419.0);
        assert!((ratio - 1.0).abs() < 0.03, "{events} events, ratio {ratio}");
    }

    fn assert_rate(inter_failure: InterFailure, seed: u64) {
        let catalog = catalog();
        let config = config(1_000, inter_failure, NO_LEMONS);
        let horizon = Duration::from_secs_f64(inter_failure.mean_seconds() * 100.0);
        let events = FailureStream::new(&config, &catalog, seed, horizon).unwrap().count();
        // 100 mean lifetimes on 1,000 nodes: 100,000 expected, sd under 0.5 % (Weibull 0.7 too), and
        // the fresh start at t = 0 biases a renewal count by under 1 % at this length.
        let expected = config.fleet_rate_per_second() * horizon.as_secs_f64();
        let ratio = events as f64 / expected;
        assert!((ratio - 1.0).abs() < 0.03, "{inter_failure:?}: {events} vs {expected}");
    }

    #[test]
    fn the_long_run_rate_is_the_configured_one() {
        assert_rate(InterFailure::Exponential { mean: 100 * DAY }, 3);
        assert_rate(InterFailure::Weibull { shape: 0.7, scale: 100 * DAY }, 4);
        assert_rate(InterFailure::Weibull { shape: 2.0, scale: 100 * DAY }, 5);
    }

    #[test]
    fn gamma_matches_known_values() {
        assert!((gamma(1.0) - 1.0).abs() < 1e-12);
        assert!((gamma(5.0) - 24.0).abs() < 1e-9);
        assert!((gamma(0.5) - std::f64::consts::PI.sqrt()).abs() < 1e-12);
        assert!((gamma(1.5) - std::f64::consts::PI.sqrt() / 2.0).abs() < 1e-12);
    }

    #[test]
    fn lemons_fail_about_five_times_as_often() {
        let catalog = catalog();
        let config = config(
            2_000,
            InterFailure::Exponential { mean: 100 * DAY },
            Lemons { fraction: 0.15, factor: 5.0 },
        );
        let stream = FailureStream::new(&config, &catalog, 11, 2_000 * DAY).unwrap();
        let lemons = stream.lemons();
        assert_eq!(lemons.len(), 300);
        let mut per_node = vec![0u32; 2_000];
        for event in stream {
            per_node[event.nodes[0] as usize] += 1;
        }
        let lemon_total: u32 = lemons.iter().map(|&node| per_node[node as usize]).sum();
        let other_total: u32 = per_node.iter().sum::<u32>() - lemon_total;
        let ratio = (f64::from(lemon_total) / 300.0) / (f64::from(other_total) / 1_700.0);
        assert!((ratio - 5.0).abs() < 0.25, "lemons fail {ratio}× as often");
    }

    #[test]
    fn categories_are_drawn_by_the_catalogs_shares() {
        let catalog = catalog();
        let config = config(2_048, InterFailure::Exponential { mean: 10 * DAY }, NO_LEMONS);
        let mut counts = vec![0u32; catalog.categories.len()];
        let stream = FailureStream::new(&config, &catalog, 5, 500 * DAY).unwrap();
        let mut total = 0u32;
        for event in stream {
            counts[event.category] += 1;
            total += 1;
        }
        for (index, &count) in counts.iter().enumerate() {
            let share = f64::from(count) / f64::from(total);
            // ~100,000 draws: the largest share (0.35) has sd 0.0015.
            assert!((share - catalog.share(index)).abs() < 0.01, "category {index}: {share}");
        }
    }

    #[test]
    fn a_leaf_switch_takes_16_to_32_contiguous_nodes() {
        let catalog = catalog();
        let mut config = config(2_048, InterFailure::Exponential { mean: 1_000 * DAY }, NO_LEMONS);
        config.correlated.leaf_switch = Some(LeafSwitchFailures {
            mean_interval: DAY,
            min_nodes: 16,
            max_nodes: 32,
            category: "network-switch-cable".to_owned(),
        });
        let network = catalog.index_of("network-switch-cable").unwrap();
        let stream = FailureStream::new(&config, &catalog, 9, 365 * DAY).unwrap();
        let switches: Vec<FailureEvent> = stream.filter(|event| event.correlated).collect();
        assert!((300..=430).contains(&switches.len()), "{} switch failures", switches.len());
        let sizes: Vec<usize> = switches.iter().map(|event| event.nodes.len()).collect();
        assert!(sizes.iter().all(|size| (16..=32).contains(size)), "{sizes:?}");
        assert!(sizes.contains(&16) && sizes.contains(&32), "both ends of the range are drawn");
        for event in &switches {
            assert_eq!(event.category, network);
            assert!(event.nodes.windows(2).all(|pair| pair[1] == pair[0] + 1));
            assert!(event.nodes.iter().all(|&node| node < 2_048));
        }
    }

    #[test]
    fn a_driver_rollout_takes_its_share_of_the_fleet() {
        let catalog = catalog();
        let mut config = config(1_000, InterFailure::Exponential { mean: 1_000 * DAY }, NO_LEMONS);
        config.correlated.driver_rollout = Some(DriverRollouts {
            mean_interval: 30 * DAY,
            fraction: 0.3,
            category: "software-bug".to_owned(),
        });
        let stream = FailureStream::new(&config, &catalog, 2, 3_000 * DAY).unwrap();
        let rollouts: Vec<FailureEvent> = stream.filter(|event| event.correlated).collect();
        assert!((70..=130).contains(&rollouts.len()), "{} rollouts", rollouts.len());
        for event in &rollouts {
            assert_eq!(event.nodes.len(), 300);
            assert!(event.nodes.windows(2).all(|pair| pair[0] < pair[1]), "distinct, sorted");
            assert_eq!(event.category, catalog.index_of("software-bug").unwrap());
        }
        assert_ne!(rollouts[0].nodes, rollouts[1].nodes);
    }

    #[test]
    fn a_bad_config_names_every_bad_field() {
        let catalog = catalog();
        let mut config = config(0, InterFailure::Weibull { shape: 0.0, scale: Duration::ZERO }, {
            Lemons { fraction: 1.5, factor: 0.5 }
        });
        config.correlated.leaf_switch = Some(LeafSwitchFailures {
            mean_interval: Duration::ZERO,
            min_nodes: 0,
            max_nodes: 0,
            category: "tornado".to_owned(),
        });
        config.correlated.driver_rollout = Some(DriverRollouts {
            mean_interval: DAY,
            fraction: 0.0,
            category: "software-bug".to_owned(),
        });
        let err = FailureStream::new(&config, &catalog, 1, DAY).unwrap_err();
        for field in [
            "nodes",
            "inter_failure.shape",
            "inter_failure.scale",
            "lemons.fraction",
            "lemons.factor",
            "correlated.leaf_switch.category",
            "correlated.leaf_switch.mean_interval",
            "correlated.leaf_switch.min_nodes",
            "correlated.driver_rollout.fraction",
        ] {
            assert!(err.names(field), "{field} not named in:\n{err}");
        }
        assert_eq!(err.problems.len(), 9, "{err}");
        assert!(err.to_string().contains("\"tornado\" is not a category of the catalog"));
    }

    #[test]
    fn a_config_parses_from_toml() {
        let text = r#"
            nodes = 512
            inter_failure = { distribution = "weibull", shape = 0.8, scale = "300days" }
            lemons = { fraction = 0.05, factor = 3.0 }

            [correlated.leaf_switch]
            mean_interval = "20days"
            min_nodes = 16
            max_nodes = 32
            category = "network-switch-cable"
        "#;
        let config: FailureConfig = toml::from_str(text).unwrap();
        assert_eq!(config.inter_failure, InterFailure::Weibull { shape: 0.8, scale: 300 * DAY });
        assert_eq!(config.lemons, Lemons { fraction: 0.05, factor: 3.0 });
        assert!(config.validate(&catalog()).is_empty());
        let defaults: FailureConfig = toml::from_str(
            "nodes = 8\ninter_failure = { distribution = \"exponential\", mean = \"30days\" }",
        )
        .unwrap();
        assert_eq!(defaults.lemons, Lemons::default());
        assert_eq!(defaults.correlated, CorrelatedFailures::default());
        let unknown = "nodes = 8\nspeed = 1\ninter_failure = { distribution = \"exponential\", mean = \"30days\" }";
        assert!(toml::from_str::<FailureConfig>(unknown).is_err());
        let wrong_field =
            "nodes = 8\ninter_failure = { distribution = \"exponential\", scale = \"30days\" }";
        assert!(toml::from_str::<FailureConfig>(wrong_field).is_err());
    }
}
