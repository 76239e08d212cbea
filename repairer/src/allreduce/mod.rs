//! The `allreduce` probe: the repairer has two nodes run the bundled all-reduce with each other
//! (the agent's `allreduce` command) and compares the bus bandwidth they measured with the fleet's
//! median for the same probe, so a node behind a degraded link or NIC shows up against its peers
//! whatever the fabric's absolute speed.
//!
//! A ring of two is as fast as its slower end, so one low measurement implicates both nodes: a
//! node is slow only when it measured low with [`CONFIRMING_PEERS`] different peers, and a peer it
//! measured low with is measured again with someone else. Each node is judged against the median
//! of the measurements it took no part in, and only measurements that passed make it.
//!
//! Two uses ([`prober`]): the deep check of a node under validation runs it with a healthy idle
//! peer (`on_validate`), and idle nodes are measured every `every` (hot spares included), raising
//! an `allreduce_slow` finding on a slow one and clearing it once it measures well again.

mod prober;

pub use self::prober::{ProbeVerdict, Prober, ProberPorts};

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use fleetmend_proto::stats::median;
use serde::{Deserialize, Serialize};

/// Different peers a node must measure low with before it is slow.
pub const CONFIRMING_PEERS: usize = 2;

/// The check and finding of a slow node.
pub const CHECK: &str = "allreduce";
pub const SLOW: &str = "allreduce_slow";

/// Settings of the probe (`[allreduce]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AllreduceConfig {
    /// How often each idle node is measured against a peer. Zero (the default): never.
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    /// The deep check of a node under validation also measures it against a healthy idle peer.
    pub on_validate: bool,
    /// Bytes of `f32` each rank reduces per operation.
    pub bytes: u64,
    /// Timed operations per probe, after one warm-up.
    pub iterations: u32,
    /// A node is slow below this fraction of the fleet's median.
    pub fraction: f64,
    /// Passing measurements needed before any is judged (until then every probe passes).
    pub min_samples: usize,
    /// Measurements the median is taken over, newest first.
    pub window: usize,
    /// The rendezvous port on the peer (rank 0).
    pub port: u16,
    /// One probe, the rendezvous and both agents' answers included.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for AllreduceConfig {
    fn default() -> Self {
        AllreduceConfig {
            every: Duration::ZERO,
            on_validate: false,
            bytes: 64 << 20,
            iterations: 5,
            fraction: 0.5,
            min_samples: 5,
            window: 200,
            port: 29_400,
            timeout: Duration::from_secs(120),
        }
    }
}

impl AllreduceConfig {
    /// Whether the probe runs at all.
    pub fn enabled(&self) -> bool {
        self.on_validate || !self.every.is_zero()
    }

    /// Every problem, naming its field under `section`.
    pub fn problems(&self, section: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: &str, message: String| {
            problems.push((format!("{section}.{field}"), message));
        };
        if self.bytes < 4 || self.bytes > 1 << 30 {
            push("bytes", format!("{} is not between 4 and 1 GiB", self.bytes));
        }
        if self.iterations == 0 {
            push("iterations", "must be at least 1".to_owned());
        }
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            push("fraction", format!("{} is not in (0, 1]", self.fraction));
        }
        if self.min_samples == 0 {
            push("min_samples", "must be at least 1".to_owned());
        }
        if self.window < self.min_samples {
            push("window", format!("must be at least min_samples ({})", self.min_samples));
        }
        if self.port == 0 {
            push("port", "must not be 0".to_owned());
        }
        if self.timeout < Duration::from_secs(1) {
            push("timeout", "must be at least 1s".to_owned());
        }
        problems
    }
}

/// One probe that passed: the two nodes and the bus bandwidth their ring measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub nodes: [String; 2],
    pub busbw_gbps: f64,
}

/// The fleet's recent passing measurements.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    kept: VecDeque<Sample>,
}

impl Samples {
    /// Keeps `sample`, dropping the oldest beyond `window`.
    pub fn push(&mut self, sample: Sample, window: usize) {
        self.kept.push_back(sample);
        while self.kept.len() > window.max(1) {
            self.kept.pop_front();
        }
    }

    /// The median of the measurements `node` took no part in, and how many there were.
    pub fn baseline(&self, node: &str) -> (Option<f64>, usize) {
        let others: Vec<f64> = self
            .kept
            .iter()
            .filter(|s| !s.nodes.iter().any(|n| n == node))
            .map(|s| s.busbw_gbps)
            .collect();
        (median(others.iter().copied()), others.len())
    }

    /// The newest bandwidth `node` measured, with anyone.
    pub fn last_of(&self, node: &str) -> Option<f64> {
        self.kept.iter().rev().find(|s| s.nodes.iter().any(|n| n == node)).map(|s| s.busbw_gbps)
    }

    /// The median over every kept measurement.
    pub fn median(&self) -> Option<f64> {
        median(self.kept.iter().map(|s| s.busbw_gbps))
    }
}

/// What one probe's measurement says of its pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Judgement {
    /// At or above `fraction` × the median (`None`: too few measurements to judge yet).
    Pass { median: Option<f64> },
    /// Below `fraction` × the median.
    Low { median: f64 },
}

/// Judges `busbw_gbps` against `baseline` (median, count).
pub fn judge(
    busbw_gbps: f64,
    baseline: (Option<f64>, usize),
    config: &AllreduceConfig,
) -> Judgement {
    match baseline {
        (Some(median), count) if count >= config.min_samples => {
            if busbw_gbps.is_finite() && busbw_gbps >= config.fraction * median {
                Judgement::Pass { median: Some(median) }
            } else {
                Judgement::Low { median }
            }
        }
        _ => Judgement::Pass { median: None },
    }
}

/// Which nodes measured low with whom, until they measure well again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Suspicions {
    low_with: BTreeMap<String, Vec<String>>,
}

impl Suspicions {
    /// `node` measured low (or failed) with `peer`; true once that makes it slow.
    pub fn low(&mut self, node: &str, peer: &str) -> bool {
        let peers = self.low_with.entry(node.to_owned()).or_default();
        if !peers.iter().any(|p| p == peer) {
            peers.push(peer.to_owned());
        }
        peers.len() >= CONFIRMING_PEERS
    }

    /// `node` measured well: nothing held against it.
    pub fn cleared(&mut self, node: &str) {
        self.low_with.remove(node);
    }

    /// `slow` is slow: measuring low with it says nothing against anyone else.
    pub fn blame(&mut self, slow: &str) {
        for (node, peers) in self.low_with.iter_mut() {
            if node != slow {
                peers.retain(|p| p != slow);
            }
        }
        self.low_with.retain(|_, peers| !peers.is_empty());
    }

    /// The peers `node` measured low with.
    pub fn of(&self, node: &str) -> &[String] {
        self.low_with.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn is_suspect(&self, node: &str) -> bool {
        !self.of(node).is_empty()
    }
}

/// Where peers are picked from: who measured what, and when each node was last measured.
#[derive(Debug, Clone, Copy)]
pub struct PeerChoice<'a> {
    pub suspicions: &'a Suspicions,
    pub samples: &'a Samples,
    pub last_probed: &'a BTreeMap<String, u64>,
    /// A peer whose last measurement was below this is not taken (`fraction` × the median).
    pub floor: Option<f64>,
}

/// The peer to measure `node` with among `idle`: not `node`, not one of `tried`, not suspect
/// itself unless `suspects_too`, not last measured below the floor; of those, the one measured
/// longest ago (then by name), so that measurements spread over the fleet rather than all go
/// through one reference node. A validation takes suspects too: a peer is suspect after
/// measuring low with the very node under test.
pub fn pick_peer<'a>(
    node: &str,
    idle: &'a [String],
    tried: &[String],
    suspects_too: bool,
    choice: &PeerChoice<'_>,
) -> Option<&'a String> {
    idle.iter()
        .filter(|p| p.as_str() != node && !tried.contains(p))
        .filter(|p| suspects_too || !choice.suspicions.is_suspect(p))
        .filter(|p| match (choice.samples.last_of(p), choice.floor) {
            (Some(speed), Some(floor)) => speed >= floor,
            _ => true,
        })
        .min_by_key(|p| (choice.last_probed.get(p.as_str()).copied().unwrap_or(0), p.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(a: &str, b: &str, busbw: f64) -> Sample {
        Sample { nodes: [a.to_owned(), b.to_owned()], busbw_gbps: busbw }
    }

    fn config() -> AllreduceConfig {
        AllreduceConfig { min_samples: 3, ..AllreduceConfig::default() }
    }

    #[test]
    fn the_baseline_leaves_out_the_nodes_own_measurements() {
        let mut samples = Samples::default();
        for (a, b, v) in [("a", "b", 10.0), ("b", "c", 12.0), ("a", "c", 11.0), ("d", "e", 9.0)] {
            samples.push(sample(a, b, v), 10);
        }
        assert_eq!(samples.baseline("c"), (Some(9.5), 2));
        assert_eq!(samples.baseline("e"), (Some(11.0), 3));
        assert_eq!(samples.baseline("x"), (Some(10.5), 4));
        assert_eq!(samples.last_of("c"), Some(11.0));
        samples.push(sample("f", "g", 1.0), 2);
        assert_eq!(samples.median(), Some(5.0), "only the window is kept");
    }

    #[test]
    fn judgements_by_table() {
        let config = config();
        for (busbw, baseline, expected) in [
            (1.0, (Some(10.0), 2), Judgement::Pass { median: None }),
            (1.0, (None, 0), Judgement::Pass { median: None }),
            (5.0, (Some(10.0), 3), Judgement::Pass { median: Some(10.0) }),
            (4.99, (Some(10.0), 3), Judgement::Low { median: 10.0 }),
            (f64::NAN, (Some(10.0), 3), Judgement::Low { median: 10.0 }),
            (50.0, (Some(10.0), 30), Judgement::Pass { median: Some(10.0) }),
        ] {
            assert_eq!(judge(busbw, baseline, &config), expected, "{busbw} against {baseline:?}");
        }
    }

    #[test]
    fn a_node_is_slow_only_when_low_with_two_different_peers() {
        let mut suspicions = Suspicions::default();
        assert!(!suspicions.low("c", "a"));
        assert!(!suspicions.low("c", "a"), "the same peer again proves nothing more");
        assert!(!suspicions.low("b", "c"));
        assert!(!suspicions.low("d", "c"));
        assert!(suspicions.low("c", "b"));
        // c is slow: b and d measured low with it, which says nothing against them.
        suspicions.blame("c");
        assert!(!suspicions.is_suspect("b"));
        assert!(!suspicions.low("d", "e"), "d's low with c no longer counts");
        assert_eq!(suspicions.of("d"), ["e"]);
        assert_eq!(suspicions.of("c"), ["a", "b"]);
        suspicions.cleared("c");
        assert!(!suspicions.is_suspect("c"));
    }

    #[test]
    fn the_peer_is_untried_unsuspected_fast_enough_and_measured_longest_ago() {
        let idle: Vec<String> = ["a", "b", "c", "d", "e"].map(str::to_owned).to_vec();
        let mut samples = Samples::default();
        samples.push(sample("e", "x", 1.0), 10);
        samples.push(sample("b", "x", 9.0), 10);
        let last_probed: BTreeMap<String, u64> =
            [("b", 5), ("c", 9), ("d", 7), ("e", 1)].map(|(n, t)| (n.to_owned(), t)).into();
        let mut suspicions = Suspicions::default();
        let pick = |tried: &[String], suspects_too: bool, suspicions: &Suspicions| {
            let choice = PeerChoice {
                suspicions,
                samples: &samples,
                last_probed: &last_probed,
                floor: Some(5.0),
            };
            pick_peer("a", &idle, tried, suspects_too, &choice).cloned()
        };
        // e was measured longest ago but below the floor; b next.
        assert_eq!(pick(&[], false, &suspicions).as_deref(), Some("b"));
        suspicions.low("a", "b");
        suspicions.low("b", "a");
        let tried = suspicions.of("a").to_vec();
        assert_eq!(pick(&tried, false, &suspicions).as_deref(), Some("d"));
        suspicions.low("d", "x");
        assert_eq!(pick(&tried, false, &suspicions).as_deref(), Some("c"));
        assert_eq!(pick(&tried, true, &suspicions).as_deref(), Some("d"), "a validation");
        let alone = ["a".to_owned()];
        let choice = PeerChoice {
            suspicions: &suspicions,
            samples: &samples,
            last_probed: &last_probed,
            floor: None,
        };
        assert_eq!(pick_peer("a", &alone, &[], true, &choice), None);
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = AllreduceConfig {
            bytes: 2,
            iterations: 0,
            fraction: 1.5,
            min_samples: 0,
            port: 0,
            timeout: Duration::ZERO,
            ..AllreduceConfig::default()
        };
        let fields: Vec<String> = bad.problems("allreduce").into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "allreduce.bytes",
                "allreduce.iterations",
                "allreduce.fraction",
                "allreduce.min_samples",
                "allreduce.port",
                "allreduce.timeout"
            ]
        );
        assert!(AllreduceConfig::default().problems("allreduce").is_empty());
        assert!(!AllreduceConfig::default().enabled());
    }
}
