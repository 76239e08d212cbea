//! The `slurm` provider: reboots through Slurm, `scontrol reboot ASAP nextstate=DOWN
//! reason="..." NODE`, so the node's own `RebootProgram` (slurm.conf) reboots it and Slurm knows
//! the node is rebooting. It reaches Slurm with the `[slurm]` section's settings (`bin_dir`,
//! `slurm_conf`, `node_names`, `command_timeout`, the retries while slurmctld is unreachable) and
//! Slurm's command runner of [`crate::scheduler::slurm`]. No replace.
//!
//! `nextstate=DOWN`, never `RESUME`: fleetmend keeps a rebooted node out of service until its own
//! validation passed and it undrains the node itself. On a real Slurm 22.05 cluster, a node that
//! fleetmend had drained and then rebooted with `nextstate=RESUME` was `IDLE` with no reason about
//! 2 s after slurmd registered: Slurm cleared the drain and would have run jobs on an unvalidated
//! node. With `nextstate=DOWN` it stays `DOWN` with the reboot's reason (plus Slurm's " : reboot
//! issued : reboot complete"), which starts with `fleetmend: `, so the scheduler's undrain
//! (`State=RESUME`, only for fleetmend's reasons) returns it to idle once validated.
//!
//! The reboot's reason is the node's current one when it has one, so an admin's drain stays the
//! admin's through the reboot (fleetmend never undrains it); otherwise [`REBOOT_REASON`].

use serde::Deserialize;

use super::{PowerState, Provider, ProviderError, check_substitutable_node_name};
use crate::scheduler::slurm::{SlurmConfig, SlurmNode, SlurmScheduler, node_error};
use crate::scheduler::{BoxFuture, SchedulerError};

const PROVIDER: &str = "slurm";

/// The reason a reboot gives a node that has none.
pub const REBOOT_REASON: &str = "fleetmend: reboot";

/// What Slurm appends to a rebooted node's reason (" : reboot issued", " : reboot complete").
const SLURM_REBOOT_SUFFIX: &str = " : reboot ";

/// `[provider]` with `kind = "slurm"`: nothing of its own; Slurm is reached with the `[slurm]`
/// section's settings. The nodes need a `RebootProgram` in slurm.conf (`deploy/slurm/reboot.sh`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmProviderConfig {}

/// Reboots nodes with `scontrol reboot`.
#[derive(Debug, Clone)]
pub struct SlurmProvider {
    slurm: SlurmScheduler,
}

impl SlurmProvider {
    pub fn new(config: SlurmConfig) -> SlurmProvider {
        SlurmProvider { slurm: SlurmScheduler::new(config) }
    }

    /// The `scontrol` arguments that reboot fleetmend's `node`, whose Slurm state is `current`.
    pub fn reboot_args(&self, node: &str, current: &SlurmNode) -> Vec<String> {
        fleetmend_slurm::reboot_args(self.slurm.slurm_name(node), &reboot_reason(current))
    }

    fn error(&self, operation: &'static str, node: &str, err: SchedulerError) -> ProviderError {
        match err {
            SchedulerError::Timeout { .. } => ProviderError::Timeout {
                provider: PROVIDER,
                operation,
                node: node.to_owned(),
                seconds: self.slurm.config().command_timeout.as_secs(),
            },
            other => ProviderError::Failed {
                provider: PROVIDER,
                operation,
                node: node.to_owned(),
                message: other.to_string(),
            },
        }
    }

    fn check_name(&self, operation: &'static str, node: &str) -> Result<(), ProviderError> {
        check_substitutable_node_name(node).map_err(|err| ProviderError::Failed {
            provider: PROVIDER,
            operation,
            node: node.to_owned(),
            message: err.to_string(),
        })
    }
}

/// The node's own reason without what Slurm appended after earlier reboots; [`REBOOT_REASON`]
/// when it has none.
fn reboot_reason(current: &SlurmNode) -> String {
    let reason = current.reason.as_deref().map(|r| match r.find(SLURM_REBOOT_SUFFIX) {
        Some(at) => r[..at].trim(),
        None => r.trim(),
    });
    match reason {
        Some(reason) if !reason.is_empty() => reason.to_owned(),
        _ => REBOOT_REASON.to_owned(),
    }
}

/// The power state Slurm's node state implies: a node whose slurmd answers is on; a reboot that
/// was issued is on its way back; a node that does not answer (or whose state Slurm does not
/// know) could be off or hung: unknown.
pub fn power_state_of(node: &SlurmNode) -> PowerState {
    let words: Vec<&str> = node.state_words().collect();
    let has = |flag: &str| words.contains(&flag);
    if has("POWERED_DOWN") {
        PowerState::Off
    } else if has("POWERING_DOWN") || has("POWER_DOWN") {
        PowerState::PoweringOff
    } else if has("REBOOT_ISSUED") || has("POWERING_UP") {
        PowerState::PoweringOn
    } else if has("NOT_RESPONDING")
        || words.first().is_none_or(|base| matches!(*base, "UNKNOWN" | "FUTURE" | ""))
    {
        PowerState::Unknown
    } else {
        // IDLE, ALLOCATED, MIXED, DOWN (set by fleetmend or an admin, slurmd answering), with
        // DRAIN, REBOOT_REQUESTED (still running until it reboots)...
        PowerState::On
    }
}

impl Provider for SlurmProvider {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.check_name("reboot", node)?;
            let current = self
                .slurm
                .show_node_for("reboot", node)
                .await
                .map_err(|err| self.error("reboot", node, err))?;
            let operation = "reboot";
            (self.slurm.commands())
                .reboot(operation, self.slurm.slurm_name(node), &reboot_reason(&current))
                .await
                .map_err(|err| self.error(operation, node, node_error(operation, node)(err)))?;
            tracing::info!(
                node,
                slurm_node = self.slurm.slurm_name(node),
                "reboot requested from Slurm"
            );
            Ok(())
        })
    }

    fn power_state<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<PowerState, ProviderError>> {
        Box::pin(async move {
            self.check_name("power_state", node)?;
            let current = self
                .slurm
                .show_node_for("power_state", node)
                .await
                .map_err(|err| self.error("power_state", node, err))?;
            Ok(power_state_of(&current))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    /// How long a test waits for a fake command.
    const TEST_TIMEOUT: Duration = Duration::from_secs(5);

    fn node(state: &str, reason: Option<&str>) -> SlurmNode {
        SlurmNode { state: state.to_owned(), reason: reason.map(str::to_owned) }
    }

    #[test]
    fn slurm_states_map_to_power_states() {
        for (state, expected) in [
            ("IDLE", PowerState::On),
            ("MIXED+DRAIN", PowerState::On),
            ("IDLE+DRAIN+REBOOT_REQUESTED", PowerState::On),
            ("DOWN", PowerState::On),
            ("DOWN+DRAIN+REBOOT_ISSUED", PowerState::PoweringOn),
            ("IDLE+POWERING_UP", PowerState::PoweringOn),
            ("IDLE+POWERING_DOWN", PowerState::PoweringOff),
            ("IDLE+POWERED_DOWN", PowerState::Off),
            ("DOWN+NOT_RESPONDING", PowerState::Unknown),
            ("UNKNOWN", PowerState::Unknown),
            ("FUTURE", PowerState::Unknown),
        ] {
            assert_eq!(power_state_of(&node(state, None)), expected, "{state}");
        }
    }

    #[test]
    fn a_reboot_keeps_the_node_down_with_its_own_reason() {
        let mut config = SlurmConfig::default();
        config.node_names.insert("gpu-a".to_owned(), "a1".to_owned());
        let provider = SlurmProvider::new(config);
        let drained = node("IDLE+DRAIN", Some("fleetmend: xid 79 [gpu 3]"));
        assert_eq!(
            provider.reboot_args("gpu-a", &drained),
            ["reboot", "ASAP", "nextstate=DOWN", "reason=fleetmend: xid 79 [gpu 3]", "a1"]
        );
        // A second reboot: Slurm's suffixes from the first are not repeated.
        let rebooted = node("DOWN", Some("fleetmend: xid 79 : reboot issued : reboot complete"));
        assert_eq!(provider.reboot_args("node2", &rebooted)[3], "reason=fleetmend: xid 79");
        // An admin's drain keeps the admin's reason; no reason: fleetmend's.
        let admin = node("IDLE+DRAIN", Some("maintenance"));
        assert_eq!(provider.reboot_args("node2", &admin)[3], "reason=maintenance");
        assert_eq!(
            provider.reboot_args("node2", &node("IDLE", None))[3],
            "reason=fleetmend: reboot"
        );
    }

    /// A fake `scontrol` that logs its arguments to `args` and answers `show node` with `state`.
    fn fake_scontrol(dir: &Path, state: &str) {
        use std::os::unix::fs::PermissionsExt;
        let script = format!(
            "#!/bin/sh\necho \"$@\" >> {args}\n\
             if [ \"$1\" = show ]; then echo '   State={state} ThreadsPerCore=1'; \
             echo '   Reason=fleetmend: xid 79 [root@2026-11-29T21:47:09]'; fi\n",
            args = dir.join("args").display()
        );
        let path = dir.join("scontrol");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn provider(dir: &Path) -> SlurmProvider {
        SlurmProvider::new(SlurmConfig {
            bin_dir: Some(dir.to_owned()),
            command_timeout: TEST_TIMEOUT,
            ..SlurmConfig::default()
        })
    }

    #[tokio::test]
    async fn reboot_asks_slurm_with_scontrol_reboot_and_power_state_reads_the_node() {
        let dir = tempfile::tempdir().unwrap();
        fake_scontrol(dir.path(), "IDLE+DRAIN");
        let provider = provider(dir.path());
        provider.reboot("node2").await.unwrap();
        assert_eq!(provider.power_state("node2").await.unwrap(), PowerState::On);
        let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
        assert_eq!(
            args.lines().collect::<Vec<_>>(),
            [
                "show node node2",
                "reboot ASAP nextstate=DOWN reason=fleetmend: xid 79 node2",
                "show node node2"
            ]
        );
    }

    #[tokio::test]
    async fn replace_is_unsupported_and_bad_names_and_failures_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let provider = provider(dir.path());
        let err = provider.replace("node2").await.unwrap_err();
        assert!(matches!(err, ProviderError::Unsupported { operation: "replace", .. }), "{err}");
        assert_eq!(err.to_string(), "slurm: replace of node2 is not supported");

        let err = provider.reboot("node2;reboot").await.unwrap_err().to_string();
        assert!(err.contains("cannot be substituted safely"), "{err}");

        // No scontrol in bin_dir: the error names the command.
        let err = provider.reboot("node2").await.unwrap_err().to_string();
        assert!(err.starts_with("slurm: reboot of node2 failed"), "{err}");
        assert!(err.contains(&dir.path().join("scontrol").display().to_string()), "{err}");

        // A command that hangs is a timeout.
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join("scontrol");
        std::fs::write(&path, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let provider = SlurmProvider::new(SlurmConfig {
            bin_dir: Some(dir.path().to_owned()),
            command_timeout: Duration::from_millis(200),
            ..SlurmConfig::default()
        });
        let err = provider.power_state("node2").await.unwrap_err();
        assert!(matches!(err, ProviderError::Timeout { operation: "power_state", .. }), "{err}");
    }
}
