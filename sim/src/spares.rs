//! How many hot spares the simulated fleet needed: the nodes out of service (not healthy in the
//! repairer's eyes, or retired and not yet replaced) over time, and the smallest pool that would
//! have kept a job of the rest of the fleet from waiting for nodes, but for a sliver of the run.
//!
//! A job that runs on every node but the spares waits for nodes exactly while more nodes are out
//! than there are spares; so the spares the fleet needs at its failure rate and repair times are
//! a high quantile, over time, of how many nodes are out at once.

use std::collections::BTreeMap;

use serde::Serialize;

/// The share of the run a recommended pool may still leave the job waiting for nodes.
pub const UNCOVERED_SHARE: f64 = 0.001;

/// Nodes out of service over time: how long each count lasted.
#[derive(Debug, Clone, Default)]
pub struct OutOfService {
    /// Since when `out` nodes have been out.
    since_ms: Option<u64>,
    out: u32,
    /// Nodes out → milliseconds that many were.
    lasted: BTreeMap<u32, u64>,
}

impl OutOfService {
    /// From `now_ms` on, `out` nodes are out of service.
    pub fn observe(&mut self, now_ms: u64, out: u32) {
        if let Some(since) = self.since_ms {
            *self.lasted.entry(self.out).or_default() += now_ms.saturating_sub(since);
        }
        self.since_ms = Some(now_ms);
        self.out = out;
    }

    /// The figures up to `end_ms`, and the pool they call for.
    pub fn figures(&self, end_ms: u64) -> SpareFigures {
        let mut lasted = self.lasted.clone();
        if let Some(since) = self.since_ms {
            *lasted.entry(self.out).or_default() += end_ms.saturating_sub(since);
        }
        let total: u64 = lasted.values().sum();
        let covering = |share: f64| {
            // The fewest spares k with the time more than k nodes were out at most `share`.
            let allowed = (total as f64 * share).floor() as u64;
            let mut beyond = total;
            for (&out, &ms) in &lasted {
                beyond -= ms;
                if beyond <= allowed {
                    return out;
                }
            }
            0
        };
        let mean = if total == 0 {
            0.0
        } else {
            lasted.iter().map(|(&out, &ms)| f64::from(out) * ms as f64).sum::<f64>() / total as f64
        };
        SpareFigures {
            out_mean: (mean * 100.0).round() / 100.0,
            out_p99: covering(0.01),
            out_max: lasted.keys().next_back().copied().unwrap_or(0),
            recommended: covering(UNCOVERED_SHARE),
        }
    }
}

/// How many nodes were out of service at once, and the hot spares that would have covered them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpareFigures {
    /// Over the run, time-weighted.
    pub out_mean: f64,
    /// Exceeded for 1 % of the run.
    pub out_p99: u32,
    pub out_max: u32,
    /// The smallest spare pool with which a job of the rest of the fleet waits for nodes no more
    /// than 0.1 % of the run (`UNCOVERED_SHARE`).
    pub recommended: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_covers_all_but_a_sliver_of_the_run() {
        let mut out = OutOfService::default();
        // 0 out for 900 s, 3 out for 99 s, 7 out for 1 s.
        out.observe(0, 0);
        out.observe(900_000, 3);
        out.observe(999_000, 7);
        let figures = out.figures(1_000_000);
        assert_eq!(figures.out_max, 7);
        // More than 3 out: 1 s of 1,000 s, the 0.1 % left uncovered.
        assert_eq!(figures.recommended, 3);
        // More than 0 out: 100 s, past 1 %; more than 3: within it.
        assert_eq!(figures.out_p99, 3);
        assert!((figures.out_mean - (3.0 * 99.0 + 7.0) / 1000.0).abs() < 0.01, "{figures:?}");
    }

    #[test]
    fn a_fleet_never_out_needs_no_spares() {
        let mut out = OutOfService::default();
        out.observe(0, 0);
        assert_eq!(out.figures(5_000), SpareFigures::default());
        assert_eq!(OutOfService::default().figures(5_000), SpareFigures::default());
    }
}
