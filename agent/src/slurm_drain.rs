//! A node's own drain: `fleetmend agent --once --slurm-drain`, run by Slurm as the node's
//! HealthCheckProgram or Prolog, drains the node it runs on when it is unhealthy, with an owned
//! reason naming the failing findings (a node someone already drained keeps their reason). Slurm's
//! commands are run as the repairer runs them (`fleetmend_slurm`), within limits short enough for
//! a health check.

use std::fmt;
use std::time::Duration;

use fleetmend_proto::{DRAIN_REASON_PREFIX, Finding};
use fleetmend_slurm::{CommandError, Commands, is_plain_name};

/// Longest drain reason a node gives itself, in characters (`sinfo -R` shows it on one line).
pub const OWN_DRAIN_REASON_MAX_CHARS: usize = 160;

/// `fleetmend: xid 79 on GPU 3; gpu_access on GPU 3; ...`: the failing findings, short, each
/// once, on one line, cut to [`OWN_DRAIN_REASON_MAX_CHARS`].
pub fn own_drain_reason(findings: &[fleetmend_proto::Finding]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for finding in findings.iter().filter(|f| f.status == fleetmend_proto::Status::Fail) {
        let mut part = match finding.labels.get("xid") {
            Some(code) if finding.finding == "xid" => format!("xid {code}"),
            _ => finding.finding.clone(),
        };
        let subject = finding.subject.as_str();
        if finding.check == "gpu"
            && !subject.is_empty()
            && subject.bytes().all(|b| b.is_ascii_digit())
        {
            part.push_str(&format!(" on GPU {subject}"));
        } else if !subject.is_empty() {
            part.push_str(&format!(" on {subject}"));
        }
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    let summary = if parts.is_empty() { "unhealthy".to_owned() } else { parts.join("; ") };
    // One line of plain text: Slurm stores it as given.
    let summary: String = summary.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let reason = format!("{DRAIN_REASON_PREFIX}{summary}");
    if reason.chars().count() <= OWN_DRAIN_REASON_MAX_CHARS {
        return reason;
    }
    let mut cut: String = reason.chars().take(OWN_DRAIN_REASON_MAX_CHARS - 3).collect();
    cut.push_str("...");
    cut
}

/// How long a node's own drain may take. Slurm kills a health check at 60 s, and a Prolog delays
/// the job, so the whole run stays short even when slurmctld does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfDrainLimits {
    /// Longest one Slurm command may take.
    pub command_timeout: Duration,
    /// How long a command that could not reach slurmctld is retried.
    pub controller_retry_for: Duration,
    /// Longest the whole drain may take.
    pub deadline: Duration,
}

impl Default for SelfDrainLimits {
    fn default() -> Self {
        SelfDrainLimits {
            command_timeout: Duration::from_secs(3),
            controller_retry_for: Duration::from_secs(5),
            deadline: Duration::from_secs(8),
        }
    }
}

/// What [`drain_self`] did; its `Display` is the one line a health check prints about it.
#[derive(Debug)]
pub enum SelfDrain {
    /// Drained now, with this reason.
    Drained { node: String, reason: String },
    /// Drained already (by fleetmend or an admin), with this reason if it has one.
    AlreadyDrained { node: String, reason: Option<String> },
    /// The name is not one Slurm takes as a node; nothing was asked of Slurm.
    NotANodeName { node: String },
    /// Slurm does not know the node.
    UnknownNode { node: String },
    /// Slurm refused or could not be reached.
    Failed { node: String, error: CommandError },
    /// The drain did not finish within [`SelfDrainLimits::deadline`].
    TimedOut { node: String, after: Duration },
}

impl SelfDrain {
    /// The node is out of scheduling (drained now or before).
    pub fn is_drained(&self) -> bool {
        matches!(self, SelfDrain::Drained { .. } | SelfDrain::AlreadyDrained { .. })
    }
}

impl fmt::Display for SelfDrain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelfDrain::Drained { node, reason } => write!(f, "drained {node}: {reason}"),
            SelfDrain::AlreadyDrained { node, reason } => {
                write!(f, "{node} already drained: {}", reason.as_deref().unwrap_or("(no reason)"))
            }
            SelfDrain::NotANodeName { node } => write!(
                f,
                "{node:?} is not a Slurm node name; the node is unhealthy and was not drained"
            ),
            SelfDrain::UnknownNode { node } => write!(
                f,
                "{node} is unhealthy but draining it failed: Slurm does not know node {node}"
            ),
            SelfDrain::Failed { node, error } => {
                write!(f, "{node} is unhealthy but draining it failed: {error}")
            }
            SelfDrain::TimedOut { node, after } => {
                write!(f, "{node} is unhealthy but draining it did not finish within {after:?}")
            }
        }
    }
}

/// Drains `node` in Slurm because of the failing `findings`, within `limits`; Slurm's commands
/// come from `PATH` and use `SLURM_CONF`.
pub async fn drain_self(node: &str, findings: &[Finding], limits: SelfDrainLimits) -> SelfDrain {
    if !is_plain_name(node) {
        return SelfDrain::NotANodeName { node: node.to_owned() };
    }
    let reason = own_drain_reason(findings);
    let slurm = Commands {
        bin_dir: None,
        slurm_conf: None,
        command_timeout: limits.command_timeout,
        controller_retry_for: limits.controller_retry_for,
        controller_retry_max_backoff: Duration::from_secs(1),
    };
    let node = node.to_owned();
    let drain = async {
        let current = slurm.show_node("drain_self", &node).await?;
        if current.is_drained() {
            return Ok(Some(current.reason));
        }
        slurm.drain("drain_self", &node, &reason).await.map(|()| None)
    };
    match tokio::time::timeout(limits.deadline, drain).await {
        Ok(Ok(None)) => SelfDrain::Drained { node, reason },
        Ok(Ok(Some(reason))) => SelfDrain::AlreadyDrained { node, reason },
        Ok(Err(error)) if error.is_unknown_node() => SelfDrain::UnknownNode { node },
        Ok(Err(error)) => SelfDrain::Failed { node, error },
        Err(_) => SelfDrain::TimedOut { node, after: limits.deadline },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn failing(check: &str, finding: &str, subject: &str) -> fleetmend_proto::Finding {
        let mut f = fleetmend_proto::Finding::ok(check, finding, subject);
        f.status = fleetmend_proto::Status::Fail;
        f
    }

    #[test]
    fn an_own_drain_reason_names_each_failing_finding_once() {
        let mut xid = failing("gpu", "xid", "3");
        xid.labels.insert("xid".to_owned(), "79".to_owned());
        let findings = [
            xid.clone(),
            xid,
            failing("gpu", "gpu_access", "3"),
            fleetmend_proto::Finding::ok("nic", "nic_down", "eth0"),
            failing("host", "process_missing", "slurmd"),
            failing("host", "memory_low", ""),
        ];
        assert_eq!(
            own_drain_reason(&findings),
            "fleetmend: xid 79 on GPU 3; gpu_access on GPU 3; process_missing on slurmd; memory_low"
        );
    }

    #[test]
    fn an_own_drain_reason_is_one_short_line() {
        let findings: Vec<fleetmend_proto::Finding> =
            (0..40).map(|i| failing("disk", "disk_full", &format!("/mnt/d{i}\nx"))).collect();
        let reason = own_drain_reason(&findings);
        assert_eq!(reason.chars().count(), OWN_DRAIN_REASON_MAX_CHARS, "{reason}");
        assert!(reason.starts_with("fleetmend: disk_full on /mnt/d0 x; "), "{reason}");
        assert!(reason.ends_with("..."), "{reason}");
        assert!(!reason.contains('\n'));
        assert_eq!(own_drain_reason(&[]), "fleetmend: unhealthy");
    }

    #[tokio::test]
    async fn a_name_slurm_does_not_take_is_refused_before_slurm_is_asked() {
        let outcome =
            drain_self("node[1-2]", &[failing("gpu", "xid", "3")], SelfDrainLimits::default())
                .await;
        assert!(matches!(outcome, SelfDrain::NotANodeName { .. }), "{outcome}");
        assert!(!outcome.is_drained());
        assert_eq!(
            outcome.to_string(),
            "\"node[1-2]\" is not a Slurm node name; the node is unhealthy and was not drained"
        );
    }
}
