//! The repairer's `/metrics`: node states, decisions, repairs, the breaker, time to drain and to
//! repair, alerts and reports. Names in one place; labels from bounded sets only.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram as ProtoHistogram, LabelPair, Metric, MetricFamily,
    MetricType,
};

use crate::alerts::Alerts;
use crate::engine::Engine;

pub const NODES: &str = "fleetmend_nodes";
pub const REPAIRS: &str = "fleetmend_repairs_total";
pub const DECISIONS: &str = "fleetmend_decisions_total";
pub const BREAKER_OPEN: &str = "fleetmend_breaker_open";
pub const TIME_TO_DRAIN: &str = "fleetmend_time_to_drain_seconds";
pub const TIME_TO_REPAIR: &str = "fleetmend_time_to_repair_seconds";
pub const ALERTS_SENT: &str = "fleetmend_alerts_sent_total";
pub const REPORTS_RECEIVED: &str = "fleetmend_reports_received_total";
/// Jobs of the embedded queue by state.
pub const JOBS: &str = "fleetmend_jobs";
pub const JOB_RESTARTS: &str = "fleetmend_job_restarts_total";
pub const JOB_GOODPUT_RATIO: &str = "fleetmend_job_goodput_ratio";
pub const JOB_STEPS_LOST: &str = "fleetmend_job_steps_lost_total";
pub const JOB_RESUME_SECONDS: &str = "fleetmend_job_resume_seconds";
pub const JOB_STEP: &str = "fleetmend_job_step";
pub const JOB_LOSS: &str = "fleetmend_job_loss";
pub const JOB_SAMPLES_PER_SECOND: &str = "fleetmend_job_samples_per_second";
pub const JOB_CHECKPOINT_STEP: &str = "fleetmend_job_checkpoint_step";
pub const JOB_CHECKPOINT_WRITE_SECONDS: &str = "fleetmend_job_checkpoint_write_seconds";
pub const JOB_CHECKPOINT_STALL_SECONDS: &str = "fleetmend_job_checkpoint_stall_seconds";

/// A fixed-bucket histogram (cumulative counts are computed when encoding).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// Seconds from a fault to its drain: sub-second is the goal.
pub const DRAIN_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0];
/// Seconds from a fault to the node back at work: minutes to hours.
pub const REPAIR_BUCKETS: &[f64] =
    &[10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0];

/// Seconds from a job's failure to its first step after the restart: seconds to an hour.
pub const RESUME_BUCKETS: &[f64] =
    &[1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i] += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn proto(&self) -> ProtoHistogram {
        let mut histogram = ProtoHistogram::default();
        let mut cumulative = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(bound, count)| {
                cumulative += count;
                let mut bucket = Bucket::default();
                bucket.set_upper_bound(*bound);
                bucket.set_cumulative_count(cumulative);
                bucket
            })
            .collect();
        histogram.set_bucket(buckets);
        histogram.set_sample_sum(self.sum);
        histogram.set_sample_count(self.count);
        histogram
    }
}

fn family(name: &str, help: &str, kind: MetricType) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_owned());
    family.set_help(help.to_owned());
    family.set_field_type(kind);
    family
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut pair = LabelPair::default();
            pair.set_name((*k).to_owned());
            pair.set_value((*v).to_owned());
            pair
        })
        .collect()
}

fn push_gauge(family: &mut MetricFamily, pairs: &[(&str, &str)], value: f64) {
    let mut metric = Metric::default();
    metric.set_label(labels(pairs));
    let mut gauge = Gauge::default();
    gauge.set_value(value);
    metric.set_gauge(gauge);
    family.mut_metric().push(metric);
}

fn push_counter(family: &mut MetricFamily, pairs: &[(&str, &str)], value: f64) {
    let mut metric = Metric::default();
    metric.set_label(labels(pairs));
    let mut counter = Counter::default();
    counter.set_value(value);
    metric.set_counter(counter);
    family.mut_metric().push(metric);
}

/// The text exposition of the repairer's metrics.
pub fn encode(engine: &Engine, alerts: Option<&Alerts>, reports: &BTreeMap<&str, u64>) -> String {
    let mut families = Vec::new();

    let mut nodes = family(NODES, "Nodes by state.", MetricType::GAUGE);
    for (state, count) in engine.state_counts() {
        push_gauge(&mut nodes, &[("state", state.as_str())], count as f64);
    }
    families.push(nodes);

    let mut decisions = family(
        DECISIONS,
        "Decisions by action and mode (enforce, dry-run, approve, alert, quarantine).",
        MetricType::COUNTER,
    );
    for ((action, mode), count) in
        engine.counters.decisions.lock().unwrap_or_else(PoisonError::into_inner).iter()
    {
        push_counter(&mut decisions, &[("action", action), ("mode", mode)], *count as f64);
    }
    let mut repairs =
        family(REPAIRS, "Finished repairs by action and outcome.", MetricType::COUNTER);
    for ((action, outcome), count) in
        engine.counters.repairs.lock().unwrap_or_else(PoisonError::into_inner).iter()
    {
        push_counter(&mut repairs, &[("action", action), ("outcome", outcome)], *count as f64);
    }
    families.extend([decisions, repairs]);

    let mut breaker =
        family(BREAKER_OPEN, "1 while the breaker stops automatic action.", MetricType::GAUGE);
    push_gauge(&mut breaker, &[], if engine.breaker().open { 1.0 } else { 0.0 });
    families.push(breaker);

    for (name, help, histogram) in [
        (
            TIME_TO_DRAIN,
            "Seconds from a node's first failing finding to its drain.",
            &engine.counters.time_to_drain,
        ),
        (
            TIME_TO_REPAIR,
            "Seconds from a node's first failing finding to the end of its repair.",
            &engine.counters.time_to_repair,
        ),
    ] {
        let mut family = family(name, help, MetricType::HISTOGRAM);
        let mut metric = Metric::default();
        metric.set_histogram(histogram.lock().unwrap_or_else(PoisonError::into_inner).proto());
        family.mut_metric().push(metric);
        families.push(family);
    }

    let mut sent = family(
        ALERTS_SENT,
        "Alert deliveries by sink and outcome (ok, error).",
        MetricType::COUNTER,
    );
    if let Some(alerts) = alerts {
        for (sink, outcome, count) in alerts.sent_totals() {
            push_counter(&mut sent, &[("sink", &sink), ("outcome", outcome)], count as f64);
        }
    }
    let mut received =
        family(REPORTS_RECEIVED, "Agent reports received by outcome.", MetricType::COUNTER);
    for (outcome, count) in reports {
        push_counter(&mut received, &[("outcome", outcome)], *count as f64);
    }
    families.extend([sent, received]);

    if let Some(queue) = engine.queue() {
        families.extend(queue_families(&queue.metrics()));
    }

    families.retain(|f| !f.get_metric().is_empty());
    let mut out = String::new();
    if let Err(err) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
        tracing::error!(error = %err, "encoding metrics failed");
    }
    out
}

/// The embedded queue's metrics. The `job` label is bounded: every unfinished job and the most
/// recently finished ones (see `queue::metrics`).
fn queue_families(queue: &crate::queue::QueueMetrics) -> Vec<MetricFamily> {
    let mut jobs = family(JOBS, "Jobs of the embedded queue by state.", MetricType::GAUGE);
    for (state, count) in &queue.by_state {
        push_gauge(&mut jobs, &[("state", state.as_str())], *count as f64);
    }
    let mut restarts =
        family(JOB_RESTARTS, "Restarts of a job (failures and drains).", MetricType::COUNTER);
    let mut goodput = family(
        JOB_GOODPUT_RATIO,
        "Productive time (stepping past steps done before) over wall time since submission.",
        MetricType::GAUGE,
    );
    let mut lost = family(
        JOB_STEPS_LOST,
        "Steps done again after restarts (last step before minus the step resumed from).",
        MetricType::COUNTER,
    );
    let mut step = family(JOB_STEP, "The newest step a job reported.", MetricType::GAUGE);
    let mut loss = family(JOB_LOSS, "A running job's newest reported loss.", MetricType::GAUGE);
    let mut throughput = family(
        JOB_SAMPLES_PER_SECOND,
        "A running job's newest reported throughput, in samples per second.",
        MetricType::GAUGE,
    );
    let mut checkpoint_step = family(
        JOB_CHECKPOINT_STEP,
        "The step of a running job's newest complete checkpoint.",
        MetricType::GAUGE,
    );
    let mut checkpoint_write = family(
        JOB_CHECKPOINT_WRITE_SECONDS,
        "Seconds a running job's newest checkpoint took to write (in the background).",
        MetricType::GAUGE,
    );
    let mut checkpoint_stall = family(
        JOB_CHECKPOINT_STALL_SECONDS,
        "Seconds training stood still for a running job's newest checkpoint.",
        MetricType::GAUGE,
    );
    for job in &queue.jobs {
        let labels = [("job", job.id.as_str())];
        push_counter(&mut restarts, &labels, f64::from(job.restarts));
        push_gauge(&mut goodput, &labels, job.goodput_ratio);
        push_counter(&mut lost, &labels, job.steps_lost as f64);
        if let Some(s) = job.step {
            push_gauge(&mut step, &labels, s as f64);
        }
        let Some(progress) = &job.progress else { continue };
        if progress.loss.is_finite() {
            push_gauge(&mut loss, &labels, progress.loss);
        }
        push_gauge(&mut throughput, &labels, progress.samples_per_second);
        if let Some(s) = progress.checkpoint_step {
            push_gauge(&mut checkpoint_step, &labels, s as f64);
        }
        if let Some(s) = progress.checkpoint_write_seconds {
            push_gauge(&mut checkpoint_write, &labels, s);
        }
        if let Some(s) = progress.checkpoint_stall_seconds {
            push_gauge(&mut checkpoint_stall, &labels, s);
        }
    }
    let mut resume = family(
        JOB_RESUME_SECONDS,
        "Seconds from a job's failure to its first step after the restart.",
        MetricType::HISTOGRAM,
    );
    let mut metric = Metric::default();
    metric.set_histogram(queue.resume_seconds.proto());
    resume.mut_metric().push(metric);
    vec![
        jobs,
        restarts,
        goodput,
        lost,
        step,
        loss,
        throughput,
        checkpoint_step,
        checkpoint_write,
        checkpoint_stall,
        resume,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::new(DRAIN_BUCKETS);
        for v in [0.05, 0.3, 0.3, 4.0, 1000.0] {
            h.observe(v);
        }
        let proto = h.proto();
        let cumulative: Vec<u64> =
            proto.get_bucket().iter().map(|b| b.cumulative_count()).collect();
        assert_eq!(cumulative[0], 1);
        assert_eq!(cumulative[2], 3);
        assert_eq!(*cumulative.last().unwrap(), 4, "1000 s is above every bound");
        assert_eq!(proto.get_sample_count(), 5);
    }
}
