//! The `agent` provider: the node's own agent runs its configured reboot command. The reboot travels
//! as a [`NodeCommand`] in the reply to the node's next report, so it needs nothing but the
//! agent's outbound HTTP; the workflow learns the node is back from its new boot id.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use fleetmend_proto::{NodeCommand, command_kind};
use serde::Deserialize;

use super::{PowerState, Provider, ProviderError};
use crate::commands::CommandQueue;
use crate::scheduler::BoxFuture;

const PROVIDER: &str = "agent";

/// `[provider]` with `kind = "agent"` (the default): nothing to set, the reboot command lives in
/// each agent's own config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentProviderConfig {}

/// Queues reboots for the nodes' agents.
#[derive(Debug, Clone)]
pub struct AgentProvider {
    commands: Arc<CommandQueue>,
}

impl AgentProvider {
    pub fn new(commands: Arc<CommandQueue>) -> AgentProvider {
        AgentProvider { commands }
    }

    /// Queues a reboot for `node` and returns the command's id (its result comes back in a later
    /// report under that id).
    pub fn queue_reboot(&self, node: &str) -> String {
        // Milliseconds keep two reboots of one node apart; the queue drops a repeated id.
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| since.as_millis())
            .unwrap_or_default();
        let id = format!("reboot-{node}-{unix_ms}");
        self.commands.push(
            node,
            NodeCommand {
                id: id.clone(),
                kind: command_kind::REBOOT.to_owned(),
                args: BTreeMap::new(),
            },
        );
        tracing::info!(node, command = %id, "queued a reboot for the node's agent");
        id
    }
}

impl Provider for AgentProvider {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.queue_reboot(node);
            Ok(())
        })
    }

    fn power_state<'a>(
        &'a self,
        _node: &'a str,
    ) -> BoxFuture<'a, Result<PowerState, ProviderError>> {
        // An agent that answers is on; one that does not cannot say why.
        Box::pin(async move { Ok(PowerState::Unknown) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reboot_queues_a_reboot_command_for_the_node() {
        let queue = Arc::new(CommandQueue::new());
        let provider = AgentProvider::new(queue.clone());
        provider.reboot("n1").await.unwrap();
        let commands = queue.take("n1");
        assert_eq!(commands.len(), 1);
        assert_eq!(commands[0].kind, command_kind::REBOOT);
        assert!(commands[0].id.starts_with("reboot-n1-"), "{}", commands[0].id);
        assert!(queue.take("n2").is_empty());
    }

    #[tokio::test]
    async fn replace_is_unsupported_and_power_is_unknown() {
        let provider = AgentProvider::new(Arc::new(CommandQueue::new()));
        assert!(matches!(
            provider.replace("n1").await,
            Err(ProviderError::Unsupported { provider: "agent", operation: "replace", .. })
        ));
        assert_eq!(provider.power_state("n1").await.unwrap(), PowerState::Unknown);
    }
}
