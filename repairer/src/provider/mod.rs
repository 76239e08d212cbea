//! Providers repair nodes: reboot, replace (returning the new node's name) and power state.
//! Backends: `agent` (the node's own agent runs its reboot command), `command` (templated shell
//! commands), `redfish` (the node's BMC), `slurm` (`scontrol reboot` and the nodes'
//! `RebootProgram`) and, for local fleets, `local`.

pub mod agent;
pub mod command;
pub mod config;
pub mod redfish;
pub mod slurm;

pub use config::{ConfigProblem, ProviderBuildError, ProviderConfig, ProviderDeps, build};

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
    /// The operation cannot be done now and waiting will not help (no spare left to replace
    /// with): the workflow goes to a person.
    #[error("{provider}: {operation} of {node} is not possible: {message}")]
    Impossible { provider: &'static str, operation: &'static str, node: String, message: String },
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
    /// Replaces `node`; returns the new node's name (it joins by reporting). By default a
    /// backend cannot (a BMC restarts its own machine, an agent cannot provision its successor).
    fn replace<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<String, ProviderError>> {
        Box::pin(async move {
            Err(ProviderError::Unsupported {
                provider: self.name(),
                operation: "replace",
                node: node.to_owned(),
            })
        })
    }
    /// The node's power state.
    fn power_state<'a>(&'a self, node: &'a str)
    -> BoxFuture<'a, Result<PowerState, ProviderError>>;
}

/// Why a node name cannot stand in for `{node}` in a command or a URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node name {node:?} cannot be substituted safely: {reason}")]
pub struct UnsafeNodeName {
    pub node: String,
    pub reason: &'static str,
}

/// The longest node name substituted into a template (a DNS name's limit).
const MAX_SUBSTITUTED_NODE_NAME: usize = 253;

/// Checks that `node` can replace `{node}` in a command line, a `sh -c` string or a URL without
/// changing its meaning: ASCII letters, digits, `-`, `.` and `_`, not starting with `-` (it would
/// read as an option) or `.`. Names come from agents' reports, so they are input, not config.
pub fn check_substitutable_node_name(node: &str) -> Result<(), UnsafeNodeName> {
    let refuse = |reason| Err(UnsafeNodeName { node: node.to_owned(), reason });
    if node.is_empty() {
        return refuse("it is empty");
    }
    if node.len() > MAX_SUBSTITUTED_NODE_NAME {
        return refuse("it is longer than 253 characters");
    }
    if node.starts_with('-') {
        return refuse("it starts with '-' and would read as an option");
    }
    if node.starts_with('.') {
        return refuse("it starts with '.'");
    }
    if !node.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) {
        return refuse(
            "only ASCII letters, digits, '-', '.' and '_' are allowed (no whitespace, quotes, \
             slashes or shell metacharacters)",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_node_names_are_substitutable() {
        for node in ["node1", "gpu-a100-017", "rack3.node_12", "N9"] {
            assert_eq!(check_substitutable_node_name(node), Ok(()), "{node}");
        }
    }

    #[test]
    fn names_that_would_change_a_command_are_refused() {
        for node in [
            "",
            "node 1",
            "node\t1",
            "node;reboot",
            "n$(id)",
            "n`id`",
            "n'1",
            "n\"1",
            "n|x",
            "n&x",
            "n>x",
            "a/b",
            "-rf",
            "..",
            "n?x",
            "n#x",
            "n\u{e9}",
        ] {
            let refused = check_substitutable_node_name(node);
            assert!(refused.is_err(), "{node:?} was accepted");
        }
        assert!(check_substitutable_node_name(&"a".repeat(254)).is_err());
    }
}

/// One call made to a [`FakeProvider`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderCall {
    Reboot(String),
    Replace(String),
    PowerState(String),
}

/// An in-memory provider that records every call (tests): reboots succeed at once, a replacement
/// of `node` is named `node-r1`, `node-r2`, ...
#[derive(Debug, Default)]
pub struct FakeProvider {
    calls: std::sync::Mutex<Vec<ProviderCall>>,
    failing: std::sync::atomic::AtomicBool,
}

impl FakeProvider {
    pub fn new() -> FakeProvider {
        FakeProvider::default()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<ProviderCall> {
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Makes every call fail (or succeed again).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, std::sync::atomic::Ordering::Relaxed);
    }

    fn record(
        &self,
        call: ProviderCall,
        operation: &'static str,
        node: &str,
    ) -> Result<usize, ProviderError> {
        let mut calls = self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        calls.push(call.clone());
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ProviderError::Failed {
                provider: "fake",
                operation,
                node: node.to_owned(),
                message: "injected failure".to_owned(),
            });
        }
        Ok(calls.iter().filter(|c| **c == call).count())
    }
}

impl Provider for FakeProvider {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.record(ProviderCall::Reboot(node.to_owned()), "reboot", node).map(|_| ())
        })
    }

    fn replace<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<String, ProviderError>> {
        Box::pin(async move {
            let n = self.record(ProviderCall::Replace(node.to_owned()), "replace", node)?;
            Ok(format!("{node}-r{n}"))
        })
    }

    fn power_state<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<PowerState, ProviderError>> {
        Box::pin(async move {
            self.record(ProviderCall::PowerState(node.to_owned()), "power_state", node)
                .map(|_| PowerState::On)
        })
    }
}
