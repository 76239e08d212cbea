//! The text exposition of the repairer's `/metrics`: the registry's counters and histograms, and
//! the figures that are a view of state (nodes by state, the breaker, alert deliveries, reports,
//! the embedded queue's jobs), built at scrape time from a [`Snapshot`].

use std::collections::BTreeMap;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::alerts::Alerts;
use crate::inventory::InventoryFigures;
use crate::metrics::*;
use crate::model::NodeState;
use crate::queue::QueueMetrics;

/// What a scrape shows, gathered by the API from the engine, the alerts and its own counters.
#[derive(Debug)]
pub struct Snapshot<'a> {
    /// Nodes by state (every state, zeros included).
    pub node_states: BTreeMap<NodeState, u64>,
    pub breaker_open: bool,
    pub metrics: &'a RepairerMetrics,
    pub alerts: Option<&'a Alerts>,
    /// Agent reports received, by outcome.
    pub reports: &'a BTreeMap<&'a str, u64>,
    /// Requests refused for their credential, by status (401, 403; 429 beyond its rate).
    pub refused: &'a [(&'a str, u64)],
    /// The listener's connections: open, the cap, shed, deadlines overrun.
    pub listener: &'a fleetmend_listener::ListenerStats,
    /// The embedded queue's figures, when it runs.
    pub queue: Option<QueueMetrics>,
    /// The inventory's figures, when one is configured.
    pub inventory: Option<InventoryFigures>,
    /// Nodes held as unknown (outside the inventory).
    pub nodes_unknown: u32,
    /// Whether this repairer leads, and the lease's epoch.
    pub leader: crate::leadership::LeaderView,
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
pub fn encode(snapshot: &Snapshot<'_>) -> String {
    let mut families = Vec::new();

    let mut nodes = family(
        NODES,
        "Nodes of the fleet (inventoried, where an inventory is configured) by state.",
        MetricType::GAUGE,
    );
    for (state, count) in &snapshot.node_states {
        push_gauge(&mut nodes, &[("state", state.as_str())], *count as f64);
    }
    let mut unknown = family(
        NODES_UNKNOWN,
        "Nodes held as unknown: reporting from outside the inventory, never counted or acted on.",
        MetricType::GAUGE,
    );
    push_gauge(&mut unknown, &[], f64::from(snapshot.nodes_unknown));
    families.push(unknown);
    if let Some(inventory) = &snapshot.inventory {
        families.extend(inventory_families(inventory));
    }
    let mut breaker =
        family(BREAKER_OPEN, "1 while the breaker stops automatic action.", MetricType::GAUGE);
    push_gauge(&mut breaker, &[], if snapshot.breaker_open { 1.0 } else { 0.0 });
    families.extend([nodes, breaker]);
    let leads = snapshot.leader.role == crate::leadership::Role::Leader;
    let mut leader = family(
        REPAIRER_LEADER,
        "1 on the repairer that leads its store (acts), 0 on a standby (serves reads).",
        MetricType::GAUGE,
    );
    push_gauge(&mut leader, &[], if leads { 1.0 } else { 0.0 });
    let mut epoch = family(
        REPAIRER_LEADER_EPOCH,
        "The leadership lease's epoch: one more each time another repairer took the lead.",
        MetricType::GAUGE,
    );
    push_gauge(&mut epoch, &[], snapshot.leader.epoch as f64);
    families.extend([leader, epoch]);

    families.extend(snapshot.metrics.families());

    let mut sent = family(
        ALERTS_SENT,
        "Alert deliveries by sink and outcome (ok, error).",
        MetricType::COUNTER,
    );
    if let Some(alerts) = snapshot.alerts {
        for (sink, outcome, count) in alerts.sent_totals() {
            push_counter(&mut sent, &[("sink", &sink), ("outcome", outcome)], count as f64);
        }
    }
    let mut received =
        family(REPORTS_RECEIVED, "Agent reports received by outcome.", MetricType::COUNTER);
    for (outcome, count) in snapshot.reports {
        push_counter(&mut received, &[("outcome", outcome)], *count as f64);
    }
    let mut refused = family(
        API_REFUSED,
        "API requests refused for their credential, by status (401 none or unknown, 403 not allowed: requests other than reports; 429 beyond the caller's rate: every request).",
        MetricType::COUNTER,
    );
    for (status, count) in snapshot.refused {
        push_counter(&mut refused, &[("status", status)], *count as f64);
    }
    families.extend([sent, received, refused]);
    families.extend(listener_families(snapshot.listener));

    if let Some(queue) = &snapshot.queue {
        families.extend(queue_families(queue));
    }

    families.retain(|f| !f.get_metric().is_empty());
    let mut out = String::new();
    if let Err(err) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
        tracing::error!(error = %err, "encoding metrics failed");
    }
    out
}

/// The listener's connections (names shared with the agent's `/metrics`).
fn listener_families(stats: &fleetmend_listener::ListenerStats) -> Vec<MetricFamily> {
    let mut open = family(
        CONNECTIONS_OPEN,
        "Connections open on the repairer's listener, TLS handshakes included.",
        MetricType::GAUGE,
    );
    push_gauge(&mut open, &[], stats.open() as f64);
    let mut max = family(
        CONNECTIONS_MAX,
        "The cap on open connections in force ([listener] max_connections, or less where the descriptor limit did not hold it).",
        MetricType::GAUGE,
    );
    push_gauge(&mut max, &[], stats.max() as f64);
    let mut shed = family(
        CONNECTIONS_SHED,
        "Connections closed at accept because the cap was reached.",
        MetricType::COUNTER,
    );
    push_counter(&mut shed, &[], stats.shed() as f64);
    let mut timeouts = family(
        HTTP_TIMEOUTS,
        "Connections closed because the client overran a deadline, by phase (handshake, header, body, idle).",
        MetricType::COUNTER,
    );
    for (phase, count) in stats.timeouts() {
        push_counter(&mut timeouts, &[("phase", phase.as_str())], count as f64);
    }
    vec![open, max, shed, timeouts]
}

/// The inventory's size and the reads of its file and of Slurm's list.
fn inventory_families(inventory: &InventoryFigures) -> Vec<MetricFamily> {
    let mut size = family(INVENTORY_NODES, "Node names in the inventory.", MetricType::GAUGE);
    push_gauge(&mut size, &[], inventory.nodes as f64);
    let mut reads = family(
        INVENTORY_REFRESHES,
        "Reads of the inventory's file (when it changed) and of Slurm's node list, by source and outcome (a failed read keeps the list before).",
        MetricType::COUNTER,
    );
    for (source, outcome, count) in &inventory.refreshes {
        push_counter(&mut reads, &[("source", source), ("outcome", outcome)], *count as f64);
    }
    vec![size, reads]
}

/// The embedded queue's metrics. The `job` label is bounded: every unfinished job and the most
/// recently finished ones (see `queue::metrics`).
fn queue_families(queue: &QueueMetrics) -> Vec<MetricFamily> {
    let mut jobs = family(JOBS, "Jobs of the embedded queue by state.", MetricType::GAUGE);
    for (state, count) in &queue.by_state {
        push_gauge(&mut jobs, &[("state", state.as_str())], *count as f64);
    }
    let mut restarts =
        family(JOB_RESTARTS, "Restarts of a job (failures and drains).", MetricType::COUNTER);
    let mut hangs = family(
        JOB_HANGS,
        "Times a job was found hung (its step stopped advancing) and restarted.",
        MetricType::COUNTER,
    );
    let mut slowest = family(
        JOB_STRAGGLER_RATIO,
        "A running job's slowest rank (label rank): its median compute time per step over the other ranks' median (1: as fast).",
        MetricType::GAUGE,
    );
    let mut lost_seconds = family(
        JOB_LOST_SECONDS,
        "Seconds a job lost by cause: hang (standing at a step until it was declared hung), straggler (the share of its steps' time a flagged straggler rank cost).",
        MetricType::COUNTER,
    );
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
        push_counter(&mut hangs, &labels, f64::from(job.hangs));
        for (cause, seconds) in [("hang", job.hung_seconds), ("straggler", job.straggler_seconds)] {
            push_counter(&mut lost_seconds, &[("job", job.id.as_str()), ("cause", cause)], seconds);
        }
        if let Some((rank, ratio)) = job.slowest_rank {
            let rank = rank.to_string();
            push_gauge(&mut slowest, &[("job", job.id.as_str()), ("rank", rank.as_str())], ratio);
        }
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
    let mut families = vec![
        jobs,
        restarts,
        hangs,
        slowest,
        lost_seconds,
        goodput,
        lost,
        step,
        loss,
        throughput,
        checkpoint_step,
        checkpoint_write,
        checkpoint_stall,
    ];
    families.extend(queue.resume_seconds.families());
    families
}
