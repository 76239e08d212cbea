//! The repairer's `/metrics`: node states, decisions, repairs, store errors, the breaker, time to
//! drain and to repair, alerts, reports and the embedded queue. Names in one place; labels from
//! bounded sets only.
//!
//! Counters and histograms are the prometheus crate's own, in a registry per [`RepairerMetrics`];
//! figures that are a view of state (nodes by state, the breaker, the queue's jobs) are built at
//! scrape time (`crate::exposition`), as the agent builds its samples.

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use crate::model::RuleAction;

pub const NODES: &str = "fleetmend_nodes";
/// Nodes held as unknown (reporting from outside the inventory).
pub const NODES_UNKNOWN: &str = "fleetmend_nodes_unknown";
/// Node names in the inventory.
pub const INVENTORY_NODES: &str = "fleetmend_inventory_nodes";
/// Reads of the inventory's file and of Slurm's node list, by source and outcome.
pub const INVENTORY_REFRESHES: &str = "fleetmend_inventory_refreshes_total";
pub const REPAIRS: &str = "fleetmend_repairs_total";
pub const DECISIONS: &str = "fleetmend_decisions_total";
pub const STORE_ERRORS: &str = "fleetmend_store_errors_total";
pub const BREAKER_OPEN: &str = "fleetmend_breaker_open";
pub const REPAIRER_LEADER: &str = "fleetmend_repairer_leader";
pub const REPAIRER_LEADER_EPOCH: &str = "fleetmend_repairer_leader_epoch";
pub const TIME_TO_DRAIN: &str = "fleetmend_time_to_drain_seconds";
pub const TIME_TO_REPAIR: &str = "fleetmend_time_to_repair_seconds";
pub const ALERTS_SENT: &str = "fleetmend_alerts_sent_total";
pub const REPORTS_RECEIVED: &str = "fleetmend_reports_received_total";
pub const API_REFUSED: &str = "fleetmend_api_refused_total";
/// The listener's series, named where the agent's are too.
pub use fleetmend_listener::metrics::{
    CONNECTIONS_MAX, CONNECTIONS_OPEN, CONNECTIONS_SHED, TIMEOUTS as HTTP_TIMEOUTS,
};
/// Jobs of the embedded queue by state.
pub const JOBS: &str = "fleetmend_jobs";
pub const JOB_RESTARTS: &str = "fleetmend_job_restarts_total";
pub const JOB_HANGS: &str = "fleetmend_job_hangs_total";
pub const JOB_STRAGGLER_RATIO: &str = "fleetmend_job_straggler_ratio";
/// Time a job lost by cause: `hang` or `straggler`.
pub const JOB_LOST_SECONDS: &str = "fleetmend_job_lost_seconds_total";
pub const JOB_GOODPUT_RATIO: &str = "fleetmend_job_goodput_ratio";
pub const JOB_STEPS_LOST: &str = "fleetmend_job_steps_lost_total";
pub const JOB_RESUME_SECONDS: &str = "fleetmend_job_resume_seconds";
pub const JOB_STEP: &str = "fleetmend_job_step";
pub const JOB_LOSS: &str = "fleetmend_job_loss";
pub const JOB_SAMPLES_PER_SECOND: &str = "fleetmend_job_samples_per_second";
pub const JOB_CHECKPOINT_STEP: &str = "fleetmend_job_checkpoint_step";
pub const JOB_CHECKPOINT_WRITE_SECONDS: &str = "fleetmend_job_checkpoint_write_seconds";
pub const JOB_CHECKPOINT_STALL_SECONDS: &str = "fleetmend_job_checkpoint_stall_seconds";
pub const ALLREDUCE_PROBES: &str = "fleetmend_allreduce_probes_total";
pub const ALLREDUCE_MEDIAN: &str = "fleetmend_allreduce_fleet_busbw_gbps";
/// The `result` label of [`ALLREDUCE_PROBES`]; all exported from the start, at 0.
pub const ALLREDUCE_RESULTS: &[&str] = &["pass", "unjudged", "low", "failed"];

/// Seconds from a fault to its drain: sub-second is the goal.
pub const DRAIN_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0];
/// Seconds from a fault to the node back at work: minutes to hours.
pub const REPAIR_BUCKETS: &[f64] =
    &[10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0];
/// Seconds from a job's failure to its first step after the restart: seconds to an hour.
pub const RESUME_BUCKETS: &[f64] =
    &[1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

/// The store operations whose failures [`STORE_ERRORS`] counts (its `operation` label). Every one
/// is exported from the start, at 0, so a rule can alert on an increase.
pub const STORE_OPERATIONS: &[&str] =
    &["append_event", "put_node", "insert_workflow", "update_workflow", "put_setting", "put_job"];

/// The repairer's counters and histograms, in a registry of their own (one per engine: tests and
/// several repairers in one process never share series).
///
/// Names, labels and buckets are constants, so building the collectors cannot fail (the unit tests
/// build them); were it to, the repairer logs it and runs without these series rather than
/// refusing to start.
#[derive(Debug)]
pub struct RepairerMetrics {
    registry: Registry,
    collectors: Option<Collectors>,
}

#[derive(Debug)]
struct Collectors {
    decisions: IntCounterVec,
    repairs: IntCounterVec,
    store_errors: IntCounterVec,
    time_to_drain: Histogram,
    time_to_repair: Histogram,
    allreduce_probes: IntCounterVec,
    allreduce_median: Gauge,
    /// Reports the engine took in. Not registered: `/metrics` shows the API's
    /// [`REPORTS_RECEIVED`] by outcome, whose `ok` counts the same reports.
    reports_ok: IntCounter,
}

impl Collectors {
    fn register(registry: &Registry) -> Result<Collectors, prometheus::Error> {
        let decisions = IntCounterVec::new(
            Opts::new(
                DECISIONS,
                "Decisions by action and mode (enforce, dry-run, approve, alert, quarantine).",
            ),
            &["action", "mode"],
        )?;
        let repairs = IntCounterVec::new(
            Opts::new(REPAIRS, "Finished repairs by action and outcome."),
            &["action", "outcome"],
        )?;
        let store_errors = IntCounterVec::new(
            Opts::new(STORE_ERRORS, "Failed writes to the repairer's store, by operation."),
            &["operation"],
        )?;
        for operation in STORE_OPERATIONS {
            store_errors.get_metric_with_label_values(&[*operation])?;
        }
        let time_to_drain = histogram(
            TIME_TO_DRAIN,
            "Seconds from a node's first failing finding to its drain.",
            DRAIN_BUCKETS,
        )?;
        let time_to_repair = histogram(
            TIME_TO_REPAIR,
            "Seconds from a node's first failing finding to the end of its repair.",
            REPAIR_BUCKETS,
        )?;
        let reports_ok =
            IntCounter::new("fleetmend_engine_reports_ok_total", "Reports the engine took in.")?;
        let allreduce_probes = IntCounterVec::new(
            Opts::new(
                ALLREDUCE_PROBES,
                "Allreduce probes of node pairs by result (pass, unjudged: too few measurements \
                 yet, low: below the fraction of the fleet's median, failed).",
            ),
            &["result"],
        )?;
        for result in ALLREDUCE_RESULTS {
            allreduce_probes.get_metric_with_label_values(&[*result])?;
        }
        let allreduce_median = Gauge::new(
            ALLREDUCE_MEDIAN,
            "Median all-reduce bus bandwidth (GB/s) of the fleet's recent passing probes.",
        )?;
        registry.register(Box::new(allreduce_probes.clone()))?;
        registry.register(Box::new(allreduce_median.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(repairs.clone()))?;
        registry.register(Box::new(store_errors.clone()))?;
        registry.register(Box::new(time_to_drain.clone()))?;
        registry.register(Box::new(time_to_repair.clone()))?;
        Ok(Collectors {
            decisions,
            repairs,
            store_errors,
            time_to_drain,
            time_to_repair,
            allreduce_probes,
            allreduce_median,
            reports_ok,
        })
    }
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Result<Histogram, prometheus::Error> {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
}

/// Adds one to the series of `values` (their number is fixed where the vector is built).
fn inc(vec: &IntCounterVec, values: &[&str]) {
    match vec.get_metric_with_label_values(values) {
        Ok(counter) => counter.inc(),
        Err(err) => tracing::error!(error = %err, ?values, "counting a metric failed"),
    }
}

impl Default for RepairerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RepairerMetrics {
    pub fn new() -> RepairerMetrics {
        let registry = Registry::new();
        let collectors = Collectors::register(&registry)
            .inspect_err(|err| {
                tracing::error!(
                    error = %err,
                    "building the repairer's metrics failed: /metrics shows no decisions, \
                     repairs, store errors or times to drain and repair"
                );
            })
            .ok();
        RepairerMetrics { registry, collectors }
    }

    /// A decision of the policy, in `mode` (enforce, dry-run, approve, alert, quarantine).
    pub fn decision(&self, action: RuleAction, mode: &str) {
        if let Some(c) = &self.collectors {
            inc(&c.decisions, &[action.as_str(), mode]);
        }
    }

    /// Exports, at zero, the series the fleet dashboard's panels read before anything happened:
    /// the disruptive decisions in the policy's `mode`, the repairs that end `repaired`. A healthy
    /// fleet's "Decisions" and "Repairs" panels then say 0, not No data, and `increase()` counts
    /// the first one (a series born at 1 has no increase).
    pub fn expect_decisions(&self, mode: &str) {
        let Some(c) = &self.collectors else { return };
        for action in [RuleAction::Drain, RuleAction::Reboot, RuleAction::Replace] {
            let _ = c.decisions.get_metric_with_label_values(&[action.as_str(), mode]);
        }
        for action in [RuleAction::Reboot, RuleAction::Replace] {
            let _ = c.repairs.get_metric_with_label_values(&[action.as_str(), "repaired"]);
        }
    }

    /// A finished repair and its outcome.
    pub fn repair(&self, action: RuleAction, outcome: &str) {
        if let Some(c) = &self.collectors {
            inc(&c.repairs, &[action.as_str(), outcome]);
        }
    }

    /// Seconds from a node's first failing finding to its drain.
    pub fn time_to_drain(&self, seconds: f64) {
        if let Some(c) = &self.collectors {
            c.time_to_drain.observe(seconds);
        }
    }

    /// Seconds from a node's first failing finding to the end of its repair.
    pub fn time_to_repair(&self, seconds: f64) {
        if let Some(c) = &self.collectors {
            c.time_to_repair.observe(seconds);
        }
    }

    /// An allreduce probe's `result` (one of [`ALLREDUCE_RESULTS`]) and the fleet's median after it.
    pub fn allreduce_probe(&self, result: &'static str, median_gbps: Option<f64>) {
        debug_assert!(ALLREDUCE_RESULTS.contains(&result), "{result} is not listed");
        if let Some(c) = &self.collectors {
            inc(&c.allreduce_probes, &[result]);
            if let Some(median) = median_gbps {
                c.allreduce_median.set(median);
            }
        }
    }

    /// A report the engine took in.
    pub fn report_ok(&self) {
        if let Some(c) = &self.collectors {
            c.reports_ok.inc();
        }
    }

    /// Reports the engine took in since it started.
    pub fn reports_ok(&self) -> u64 {
        self.collectors.as_ref().map_or(0, |c| c.reports_ok.get())
    }

    /// A failed store write; `operation` is one of [`STORE_OPERATIONS`].
    pub fn store_error(&self, operation: &'static str) {
        debug_assert!(STORE_OPERATIONS.contains(&operation), "{operation} is not listed");
        if let Some(c) = &self.collectors {
            inc(&c.store_errors, &[operation]);
        }
    }

    pub(crate) fn families(&self) -> Vec<MetricFamily> {
        self.registry.gather()
    }
}

/// The embedded queue's seconds from a job's failure to its first step after the restart
/// ([`JOB_RESUME_SECONDS`]). Clones share the histogram.
#[derive(Debug, Clone)]
pub struct ResumeSeconds(Option<Histogram>);

impl Default for ResumeSeconds {
    fn default() -> Self {
        Self::new()
    }
}

impl ResumeSeconds {
    /// Cannot fail for the same reason as [`RepairerMetrics::new`]; logs if it does.
    pub fn new() -> ResumeSeconds {
        let histogram = histogram(
            JOB_RESUME_SECONDS,
            "Seconds from a job's failure to its first step after the restart.",
            RESUME_BUCKETS,
        );
        ResumeSeconds(
            histogram
                .inspect_err(|err| {
                    tracing::error!(error = %err, "building the job resume histogram failed");
                })
                .ok(),
        )
    }

    pub fn observe(&self, seconds: f64) {
        if let Some(h) = &self.0 {
            h.observe(seconds);
        }
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0.as_ref().map_or(0, Histogram::get_sample_count)
    }

    pub(crate) fn families(&self) -> Vec<MetricFamily> {
        self.0.as_ref().map(Collector::collect).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::exposition::{Snapshot, encode};
    use crate::model::NodeState;

    fn exposition(metrics: &RepairerMetrics) -> String {
        let reports = BTreeMap::from([("ok", 3), ("malformed", 1)]);
        encode(&Snapshot {
            node_states: NodeState::ALL.iter().map(|s| (*s, 0)).collect(),
            breaker_open: false,
            metrics,
            alerts: None,
            reports: &reports,
            refused: &[("401", 2)],
            queue: None,
            listener: &fleetmend_listener::ListenerStats::default(),
            inventory: None,
            nodes_unknown: 0,
            leader: crate::leadership::LeaderView::alone(String::new()),
        })
    }

    #[test]
    fn the_inventory_and_the_unknown_nodes_are_exported() {
        let metrics = RepairerMetrics::new();
        let reports = BTreeMap::from([("ok", 1), ("unknown_refused", 5000)]);
        let text = encode(&Snapshot {
            node_states: NodeState::ALL.iter().map(|s| (*s, 0)).collect(),
            breaker_open: false,
            metrics: &metrics,
            alerts: None,
            reports: &reports,
            refused: &[],
            queue: None,
            inventory: Some(crate::inventory::InventoryFigures {
                nodes: 128,
                refreshes: vec![("slurm", "error", 2), ("slurm", "ok", 7)],
            }),
            nodes_unknown: 3,
            leader: crate::leadership::LeaderView::alone(String::new()),
            listener: &fleetmend_listener::ListenerStats::default(),
        });
        for (series, value) in [
            ("fleetmend_inventory_nodes", 128.0),
            ("fleetmend_nodes_unknown", 3.0),
            (r#"fleetmend_inventory_refreshes_total{source="slurm",outcome="error"}"#, 2.0),
            (r#"fleetmend_inventory_refreshes_total{source="slurm",outcome="ok"}"#, 7.0),
            (r#"fleetmend_reports_received_total{outcome="unknown_refused"}"#, 5000.0),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
        }
        let without = exposition(&metrics);
        assert!(!without.contains(INVENTORY_NODES), "no inventory, no size: {without}");
        assert_eq!(sample(&without, NODES_UNKNOWN), Some(0.0), "{without}");
    }

    /// The value of the sample written exactly `series` (name and labels) in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let metrics = RepairerMetrics::new();
        for v in [0.05, 0.3, 0.3, 4.0, 1000.0] {
            metrics.time_to_drain(v);
        }
        let text = exposition(&metrics);
        let bucket = |le: &str| sample(&text, &format!("{TIME_TO_DRAIN}_bucket{{le=\"{le}\"}}"));
        assert_eq!(bucket("0.1"), Some(1.0), "{text}");
        assert_eq!(bucket("0.5"), Some(3.0), "{text}");
        assert_eq!(bucket("300"), Some(4.0), "1000 s is above every bound: {text}");
        assert_eq!(bucket("+Inf"), Some(5.0), "{text}");
        assert_eq!(sample(&text, &format!("{TIME_TO_DRAIN}_count")), Some(5.0), "{text}");
        let bounds = text.lines().filter(|l| l.starts_with(&format!("{TIME_TO_DRAIN}_bucket")));
        assert_eq!(bounds.count(), DRAIN_BUCKETS.len() + 1, "every bound and +Inf: {text}");
    }

    #[test]
    fn a_fresh_registry_builds_and_exports_every_series_it_was_given() {
        let metrics = RepairerMetrics::new();
        assert!(metrics.collectors.is_some(), "the constant names and buckets are valid");
        metrics.expect_decisions("enforce");
        metrics.decision(RuleAction::Reboot, "enforce");
        metrics.decision(RuleAction::Reboot, "enforce");
        metrics.decision(RuleAction::Replace, "dry-run");
        metrics.repair(RuleAction::Reboot, "repaired");
        metrics.time_to_repair(42.0);
        metrics.store_error("append_event");
        metrics.report_ok();
        assert_eq!(metrics.reports_ok(), 1);
        let text = exposition(&metrics);

        for (series, value) in [
            (r#"fleetmend_decisions_total{action="reboot",mode="enforce"}"#, 2.0),
            (r#"fleetmend_decisions_total{action="replace",mode="dry-run"}"#, 1.0),
            (r#"fleetmend_repairs_total{action="reboot",outcome="repaired"}"#, 1.0),
            // The series the dashboards read are there at zero before the first decision.
            (r#"fleetmend_decisions_total{action="drain",mode="enforce"}"#, 0.0),
            (r#"fleetmend_repairs_total{action="replace",outcome="repaired"}"#, 0.0),
            (r#"fleetmend_store_errors_total{operation="append_event"}"#, 1.0),
            // Known operations are exported before their first error.
            (r#"fleetmend_store_errors_total{operation="put_node"}"#, 0.0),
            ("fleetmend_time_to_repair_seconds_count", 1.0),
            ("fleetmend_time_to_repair_seconds_sum", 42.0),
            (r#"fleetmend_time_to_repair_seconds_bucket{le="60"}"#, 1.0),
            ("fleetmend_time_to_drain_seconds_count", 0.0),
            (r#"fleetmend_nodes{state="healthy"}"#, 0.0),
            ("fleetmend_breaker_open", 0.0),
            (r#"fleetmend_reports_received_total{outcome="ok"}"#, 3.0),
            // The listener's series, every phase from the start.
            ("fleetmend_http_connections_open", 0.0),
            ("fleetmend_http_connections_shed_total", 0.0),
            (r#"fleetmend_http_timeouts_total{phase="header"}"#, 0.0),
            (r#"fleetmend_http_timeouts_total{phase="handshake"}"#, 0.0),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
        }
        for operation in STORE_OPERATIONS {
            let series = format!("{STORE_ERRORS}{{operation=\"{operation}\"}}");
            assert!(sample(&text, &series).is_some(), "{series} in:\n{text}");
        }
        for (name, kind) in [
            (DECISIONS, "counter"),
            (REPAIRS, "counter"),
            (STORE_ERRORS, "counter"),
            (TIME_TO_DRAIN, "histogram"),
            (TIME_TO_REPAIR, "histogram"),
            (NODES, "gauge"),
            (NODES_UNKNOWN, "gauge"),
            (BREAKER_OPEN, "gauge"),
            (REPAIRER_LEADER, "gauge"),
            (REPAIRER_LEADER_EPOCH, "gauge"),
            (REPORTS_RECEIVED, "counter"),
            (ALLREDUCE_PROBES, "counter"),
            (ALLREDUCE_MEDIAN, "gauge"),
            (CONNECTIONS_OPEN, "gauge"),
            (CONNECTIONS_MAX, "gauge"),
            (CONNECTIONS_SHED, "counter"),
            (HTTP_TIMEOUTS, "counter"),
        ] {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name} in:\n{text}");
        }
        for result in ALLREDUCE_RESULTS {
            let series = format!("{ALLREDUCE_PROBES}{{result=\"{result}\"}}");
            assert!(sample(&text, &series).is_some(), "{series} in:\n{text}");
        }
        // Each family once: the registry's and the scrape-time ones never overlap.
        assert_eq!(text.matches("# TYPE ").count(), 18, "{text}");
        // Reports the engine took in are counted by the API's outcome series, not twice.
        assert!(!text.contains("fleetmend_engine_reports_ok_total"), "{text}");

        // promtool's linter, where it is installed (CI installs it; `scripts/test` too).
        let Ok(mut child) = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        else {
            return;
        };
        use std::io::Write;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    fn resume_seconds_clones_share_one_histogram() {
        let resume = ResumeSeconds::new();
        resume.clone().observe(3.0);
        assert_eq!(resume.count(), 1);
        let families = resume.families();
        assert_eq!(families.len(), 1);
        assert_eq!(families[0].name(), JOB_RESUME_SECONDS);
        let buckets = families[0].get_metric()[0].get_histogram().get_bucket();
        let bounds: Vec<f64> = buckets.iter().map(|b| b.upper_bound()).collect();
        assert_eq!(bounds, RESUME_BUCKETS);
        assert_eq!(buckets[1].cumulative_count(), 0, "3 s is above 2.5 s");
        assert_eq!(buckets[2].cumulative_count(), 1, "and within 5 s");
    }
}
