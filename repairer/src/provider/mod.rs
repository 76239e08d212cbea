//! Providers repair nodes: reboot, replace (returning the new node's name) and power state.
//! Backends: `agent` (the node's own agent runs its reboot command), `command` (templated shell
//! commands), `redfish` (the node's BMC) and, for local fleets, `local`.

use crate::scheduler::BoxFuture;

/// A node's power as its provider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    /// The provider cannot tell (the `agent` provider, a BMC that does not say).
    Unknown,
}

/// A provider call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{provider}: {operation} of {node} is not supported")]
    Unsupported { provider: &'static str, operation: &'static str, node: String },
    #[error("{provider}: {operation} of {node} failed: {message}")]
    Failed { provider: &'static str, operation: &'static str, node: String, message: String },
    #[error("{provider}: {operation} of {node} timed out after {seconds} s")]
    Timeout { provider: &'static str, operation: &'static str, node: String, seconds: u64 },
}

/// What the repairer needs from whatever can reboot and replace nodes.
pub trait Provider: Send + Sync {
    fn name(&self) -> &'static str;
    /// Starts a reboot of `node`; returns once the provider accepted it (not when the node is back).
    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Replaces `node`; returns the new node's name (it joins by reporting).
    fn replace<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<String, ProviderError>>;
    /// The node's power state.
    fn power_state<'a>(&'a self, node: &'a str)
    -> BoxFuture<'a, Result<PowerState, ProviderError>>;
}
