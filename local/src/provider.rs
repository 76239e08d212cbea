//! The `local` provider: reboot and replace for the nodes `fleetmend up` simulates.
//!
//! - reboot: the node's agent is stopped (it stops its ranks), its host tree rebuilt from the
//!   template and its persistent faults (a new boot id; other faults are gone), and the agent
//!   started again after a simulated boot delay. The call returns once the reboot is under way,
//!   as a BMC's would; the repairer awaits the new boot id in the node's reports.
//! - replace: the first hot spare the scheduler still holds becomes the node's replacement (its
//!   name is returned; it already reports, drained as a spare, so the repairer validates it and
//!   puts it to work) and the old node is retired: its agent stopped, its tree unmounted. With no
//!   spare left the replacement is impossible: the repairer quarantines the node for a person.

use std::sync::Arc;

// Re-exported: a caller of the local provider needs the trait to call it.
pub use fleetmend_repairer::provider::{PowerState, Provider, ProviderError};
use fleetmend_repairer::scheduler::BoxFuture;

use crate::up::supervisor::{AgentState, Supervisor, SupervisorError};

/// The provider's name in errors and events.
const NAME: &str = "local";

/// The nodes the scheduler holds as hot spares now.
pub type Standby = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// Reboots and replaces the local fleet's simulated nodes through its [`Supervisor`].
#[derive(Clone)]
pub struct LocalProvider {
    supervisor: Arc<Supervisor>,
    /// Set once the scheduler exists (the provider is made before the repairer that makes it).
    standby: Arc<std::sync::OnceLock<Standby>>,
}

impl std::fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProvider").finish_non_exhaustive()
    }
}

impl LocalProvider {
    pub fn new(supervisor: Arc<Supervisor>) -> LocalProvider {
        LocalProvider { supervisor, standby: Arc::new(std::sync::OnceLock::new()) }
    }

    /// Replacements come from the nodes `standby` names (the scheduler's hot spares), not from
    /// the spares set aside at start: a spare a waiting job took is at work, and must not be
    /// taken away from it again. Set once.
    pub fn set_standby(&self, standby: Standby) {
        let _already = self.standby.set(standby);
    }

    fn failed(operation: &'static str, node: &str, err: &SupervisorError) -> ProviderError {
        ProviderError::Failed {
            provider: NAME,
            operation,
            node: node.to_owned(),
            message: err.to_string(),
        }
    }
}

impl Provider for LocalProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.supervisor
                .check_rebootable(node)
                .map_err(|err| Self::failed("reboot", node, &err))?;
            let supervisor = self.supervisor.clone();
            let name = node.to_owned();
            // Accepted now, done in the background: the workflow awaits the new boot id.
            tokio::spawn(async move {
                if let Err(err) = supervisor.reboot(&name).await {
                    supervisor.record(&name, format!("reboot failed: {err}"));
                }
            });
            Ok(())
        })
    }

    fn replace<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<String, ProviderError>> {
        Box::pin(async move {
            let standby = self.standby.get().map(|standby| standby());
            let spare =
                self.supervisor.take_spare(node, standby.as_deref()).map_err(|err| match err {
                    SupervisorError::NoSpare { .. } => ProviderError::Impossible {
                        provider: NAME,
                        operation: "replace",
                        node: node.to_owned(),
                        message: err.to_string(),
                    },
                    other => Self::failed("replace", node, &other),
                })?;
            let supervisor = self.supervisor.clone();
            let old = node.to_owned();
            tokio::spawn(async move {
                if let Err(err) = supervisor.retire(&old).await {
                    supervisor.record(&old, format!("retiring failed: {err}"));
                }
            });
            Ok(spare)
        })
    }

    fn power_state<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<PowerState, ProviderError>> {
        Box::pin(async move {
            match self.supervisor.agent_state(node) {
                Some(AgentState::Running) => Ok(PowerState::On),
                Some(AgentState::Booting) => Ok(PowerState::PoweringOn),
                Some(AgentState::Stopped) => Ok(PowerState::Off),
                // A dead agent on a powered machine: the node is on but says nothing.
                Some(AgentState::Dead) => Ok(PowerState::On),
                None => Err(Self::failed(
                    "power_state",
                    node,
                    &SupervisorError::UnknownNode { node: node.to_owned() },
                )),
            }
        })
    }
}
