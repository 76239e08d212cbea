//! `[queue]`: the embedded job queue's settings (used when `scheduler = "embedded"`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::policy::FleetShare;

/// Settings of the embedded job queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// How often the queue places waiting jobs and moves timed steps on (start timeouts, the
    /// checkpoint and stop grace periods).
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// A rank that its node does not report as started within this time failed to start.
    #[serde(with = "humantime_serde")]
    pub start_timeout: Duration,
    /// When a job is stopped (a rank failed, a node drained): how long its ranks have after
    /// SIGUSR1 to report a newer checkpoint before SIGTERM.
    #[serde(with = "humantime_serde")]
    pub checkpoint_grace: Duration,
    /// How long ranks have to exit after SIGTERM before SIGKILL, and after SIGKILL before the
    /// queue gives up on them (a node that stopped answering never reports their exit).
    #[serde(with = "humantime_serde")]
    pub stop_grace: Duration,
    /// Lowest `MASTER_PORT` handed to a job's rank 0.
    pub master_port_min: u16,
    /// Highest `MASTER_PORT` handed to a job's rank 0.
    pub master_port_max: u16,
    /// Base URL ranks post their progress to (`<base>/v1/jobs/<id>/progress`). Default:
    /// `http://<listen address>`, or `http://<this host's name>:<port>` when the repairer listens
    /// on an unspecified address (0.0.0.0), which ranks cannot connect to.
    pub progress_base_url: Option<String>,
    /// The mean time between failures assumed for `--checkpoint-every auto` until failures of
    /// jobs of the same size have been observed.
    #[serde(with = "humantime_serde")]
    pub mtbf_prior: Duration,
    /// Hot spares the queue keeps, a count of nodes (`16`) or a share of the fleet (`"1%"`): a
    /// node fleetmend repaired rejoins the spares (drained with reason `fleetmend: spare`) while
    /// fewer than this many are held, instead of going back to work. A job waiting for nodes takes
    /// the spares it lacks at once. 0: repaired nodes go back to work (spares set aside by hand
    /// are still taken). `fleetmend simulate` recommends a pool for a fleet's failure rate and
    /// repair times (its report's `spares` line).
    pub spare_pool: FleetShare,
    /// A job waiting for nodes longer than this raises a `job-waiting` warning with why.
    #[serde(with = "humantime_serde")]
    pub wait_alert: Duration,
    /// A running job whose step has not advanced for this many of its median step times (and at
    /// least `hang_floor`) is hung: stopped, the ranks that did not arrive named, and restarted
    /// from its newest checkpoint.
    pub hang_factor: f64,
    /// The shortest stall counted as a hang, whatever the step time. Zero: no hang detection.
    #[serde(with = "humantime_serde")]
    pub hang_floor: Duration,
    /// A node named in two hangs within this window gets a `hang_repeated` finding (drain):
    /// its rank, not chance, stops the job.
    #[serde(with = "humantime_serde")]
    pub hang_window: Duration,
    /// Restarts of a job whose loss went NaN or infinite (each from its newest checkpoint)
    /// before the next such loss fails it: a loss that goes bad again after a restart is the
    /// data's or the model's, not a passing fault.
    pub nan_restarts: u32,
    /// A rank whose median step compute time is at least this many times the other ranks'
    /// median is a straggler: a `straggler` finding on its node. Zero: no straggler detection.
    pub straggler_ratio: f64,
    /// Posts with a new step, per rank, that the medians are taken over.
    pub straggler_window: u32,
    /// Posts with a new step, per rank and attempt, left out before its samples count.
    pub straggler_warmup: u32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            tick: Duration::from_secs(1),
            start_timeout: Duration::from_secs(120),
            checkpoint_grace: Duration::from_secs(30),
            stop_grace: Duration::from_secs(30),
            master_port_min: 29500,
            master_port_max: 29999,
            progress_base_url: None,
            mtbf_prior: Duration::from_secs(24 * 3600),
            spare_pool: FleetShare::Percent(1.0),
            wait_alert: Duration::from_secs(60),
            hang_factor: 10.0,
            hang_floor: Duration::from_secs(20),
            hang_window: Duration::from_secs(3600),
            nan_restarts: 1,
            straggler_ratio: 1.5,
            straggler_window: 10,
            straggler_warmup: 5,
        }
    }
}

impl QueueConfig {
    /// Every problem, naming its field under `section`.
    pub fn problems(&self, section: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |field: &str, message: String| {
            problems.push((format!("{section}.{field}"), message));
        };
        for (field, value) in [
            ("tick", self.tick),
            ("start_timeout", self.start_timeout),
            ("stop_grace", self.stop_grace),
            ("mtbf_prior", self.mtbf_prior),
            ("wait_alert", self.wait_alert),
            ("hang_window", self.hang_window),
        ] {
            if value.is_zero() {
                push(field, "must be greater than zero".to_owned());
            }
        }
        if let Some(problem) = self.spare_pool.problem_if_any() {
            push("spare_pool", problem);
        }
        if !(self.hang_factor.is_finite() && self.hang_factor >= 1.0) {
            push("hang_factor", format!("{} must be a number of at least 1", self.hang_factor));
        }
        if !(self.straggler_ratio == 0.0
            || (self.straggler_ratio.is_finite() && self.straggler_ratio > 1.0))
        {
            push(
                "straggler_ratio",
                format!("{} must be more than 1 (or 0: off)", self.straggler_ratio),
            );
        }
        if self.straggler_window < 3 {
            push("straggler_window", "must be at least 3 posts".to_owned());
        }
        if self.master_port_min == 0 {
            push("master_port_min", "must be at least 1".to_owned());
        }
        if self.master_port_max < self.master_port_min {
            push(
                "master_port_max",
                format!("must be at least master_port_min ({})", self.master_port_min),
            );
        }
        if let Some(url) = &self.progress_base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            push("progress_base_url", format!("{url:?} is not an http(s) URL"));
        }
        problems
    }
}

impl QueueConfig {
    /// The URL ranks post their progress to: the configured one, else the address the repairer
    /// listens on (`local`), with `hostname` standing for an unspecified address.
    pub fn progress_base(&self, local: std::net::SocketAddr, hostname: &str) -> String {
        match &self.progress_base_url {
            Some(url) => url.clone(),
            None if local.ip().is_unspecified() => format!("http://{hostname}:{}", local.port()),
            None => format!("http://{local}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_fields_are_named() {
        assert_eq!(QueueConfig::default().problems("queue"), Vec::new());
        let bad = QueueConfig {
            tick: Duration::ZERO,
            master_port_min: 30000,
            master_port_max: 29000,
            progress_base_url: Some("repairer:9830".into()),
            hang_factor: 0.5,
            ..QueueConfig::default()
        };
        let fields: Vec<String> = bad.problems("queue").into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            ["queue.tick", "queue.hang_factor", "queue.master_port_max", "queue.progress_base_url"],
            "{fields:?}"
        );
    }
}
