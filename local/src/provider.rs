//! The `local` provider: reboot and replace for the nodes `fleetmend up` simulates.
//!
//! - reboot: the node's agent is stopped (it stops its ranks), its host tree rebuilt from the
//!   template and its persistent faults (a new boot id; other faults are gone), and the agent
//!   started again after a simulated boot delay. The call returns once the reboot is under way,
//!   as a BMC's would; the repairer awaits the new boot id in the node's reports.
//! - replace: the first spare becomes the node's replacement (its name is returned; it already
//!   reports, drained in the queue as a standby, so the repairer validates it and puts it to work)
//!   and the old node is retired: its agent stopped, its tree unmounted.

use std::sync::Arc;

// Re-exported: a caller of the local provider needs the trait to call it.
pub use fleetmend_repairer::provider::{PowerState, Provider, ProviderError};
use fleetmend_repairer::scheduler::BoxFuture;

use crate::up::supervisor::{AgentState, Supervisor, SupervisorError};

/// The provider's name in errors and events.
const NAME: &str = "local";

/// Reboots and replaces the local fleet's simulated nodes through its [`Supervisor`].
#[derive(Debug, Clone)]
pub struct LocalProvider {
    supervisor: Arc<Supervisor>,
}

impl LocalProvider {
    pub fn new(supervisor: Arc<Supervisor>) -> LocalProvider {
        LocalProvider { supervisor }
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
            let spare = self
                .supervisor
                .take_spare(node)
                .map_err(|err| Self::failed("replace", node, &err))?;
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
