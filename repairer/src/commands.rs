//! Commands waiting for nodes: delivered in the reply to the node's next report (an agent needs
//! only outbound HTTP), and their results, which come back in later reports.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Mutex, PoisonError};

use fleetmend_proto::{CommandResult, NodeCommand, command_kind};

/// Results kept at most: one nobody takes (an evidence bundle that came after its time box, a
/// deep check of a workflow that ended) must not stay forever; the oldest go first.
const MAX_RESULTS: usize = 4096;

/// Pending commands per node and the results that came back.
#[derive(Debug, Default)]
pub struct CommandQueue {
    inner: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    pending: BTreeMap<String, VecDeque<NodeCommand>>,
    /// Nodes given a command since `newly_waiting` was last called (at most every node once).
    pushed: BTreeSet<String>,
    /// command id → result
    results: BTreeMap<String, CommandResult>,
}

impl CommandQueue {
    pub fn new() -> CommandQueue {
        CommandQueue::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `command` for `node` unless a command with the same id is already waiting.
    pub fn push(&self, node: &str, command: NodeCommand) {
        let mut guard = self.state();
        let state = &mut *guard;
        let queue = state.pending.entry(node.to_owned()).or_default();
        if !queue.iter().any(|c| c.id == command.id) {
            queue.push_back(command);
            state.pushed.insert(node.to_owned());
        }
    }

    /// The nodes that were given a command since the last call, by name (the fleet simulator
    /// schedules their next heartbeats from it).
    pub fn newly_waiting(&self) -> Vec<String> {
        std::mem::take(&mut self.state().pushed).into_iter().collect()
    }

    /// Takes every command waiting for `node` (they travel in the reply to its report).
    pub fn take(&self, node: &str) -> Vec<NodeCommand> {
        self.state().pending.remove(node).map(Vec::from).unwrap_or_default()
    }

    /// Keeps the results that arrived in a report of the kinds a workflow or the allreduce probe
    /// waits for (deep checks, evidence, allreduce); the queue reads its rank commands' results from the report itself.
    pub fn record_results(&self, results: &[CommandResult]) {
        let mut state = self.state();
        let awaited = |r: &&CommandResult| {
            r.kind == command_kind::DEEP_CHECK
                || r.kind == command_kind::EVIDENCE
                || r.kind == command_kind::ALLREDUCE
        };
        for result in results.iter().filter(awaited) {
            state.results.insert(result.id.clone(), result.clone());
        }
        while state.results.len() > MAX_RESULTS {
            let oldest =
                state.results.values().min_by_key(|r| r.finished_at_ms).map(|r| r.id.clone());
            match oldest {
                Some(id) => state.results.remove(&id),
                None => break,
            };
        }
    }

    /// The result of command `id`, once it came back.
    pub fn result(&self, id: &str) -> Option<CommandResult> {
        self.state().results.get(id).cloned()
    }

    /// Whether the result of command `id` came back.
    pub fn has_result(&self, id: &str) -> bool {
        self.state().results.contains_key(id)
    }

    /// Forgets a result once its workflow used it.
    pub fn forget(&self, id: &str) {
        self.state().results.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(id: &str) -> NodeCommand {
        NodeCommand { id: id.to_owned(), kind: "deep-check".to_owned(), args: BTreeMap::new() }
    }

    #[test]
    fn results_nobody_takes_are_bounded_oldest_first() {
        let queue = CommandQueue::new();
        let result = |i: usize| CommandResult {
            id: format!("r{i}"),
            kind: "evidence".to_owned(),
            ok: true,
            message: String::new(),
            verdict: None,
            findings: Vec::new(),
            evidence: None,
            allreduce: None,
            finished_at_ms: i as u64,
        };
        let mut results: Vec<CommandResult> = (0..MAX_RESULTS + 5).map(result).collect();
        results.push(CommandResult {
            id: "rank".to_owned(),
            kind: "run-rank".to_owned(),
            ..result(0)
        });
        queue.record_results(&results);
        assert!(!queue.has_result("r4") && queue.has_result("r5"));
        assert!(!queue.has_result("rank"), "nobody waits for a rank command's result here");
        assert!(queue.has_result(&format!("r{}", MAX_RESULTS + 4)));
    }

    #[test]
    fn commands_are_taken_once_and_deduplicated() {
        let queue = CommandQueue::new();
        queue.push("n1", command("a"));
        queue.push("n1", command("a"));
        queue.push("n1", command("b"));
        let taken: Vec<String> = queue.take("n1").into_iter().map(|c| c.id).collect();
        assert_eq!(taken, ["a", "b"]);
        assert!(queue.take("n1").is_empty());
    }
}
