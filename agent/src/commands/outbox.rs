//! The outbox of command results: each waits here until a report carrying it is accepted, and
//! its arrival asks the reporter for a report at once.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use fleetmend_proto::CommandResult;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Results of finished commands, waiting for a report to carry them.
#[derive(Debug)]
pub struct CommandOutbox {
    pending: Mutex<Vec<CommandResult>>,
    /// Raised when a result is added: the reporter sends a report at once.
    ready: Notify,
    /// Counts accepted reports that carried results, so a command can wait for its own delivery.
    deliveries: watch::Sender<u64>,
}

impl Default for CommandOutbox {
    fn default() -> Self {
        CommandOutbox {
            pending: Mutex::new(Vec::new()),
            ready: Notify::new(),
            deliveries: watch::Sender::new(0),
        }
    }
}

impl CommandOutbox {
    fn lock(&self) -> MutexGuard<'_, Vec<CommandResult>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a result, cut to the wire's bounds, and asks for a report. Cut here, not when the
    /// report is built, so that the result a report carried is the one [`Self::delivered`] finds.
    pub fn push(&self, mut result: CommandResult) {
        if fleetmend_proto::bounds::fit_command_result(&mut result) > 0 {
            tracing::warn!(id = %result.id, kind = %result.kind, "command result cut to the wire's bounds");
        }
        self.lock().push(result);
        self.ready.notify_one();
    }

    /// Every result not yet delivered, oldest first.
    pub fn pending(&self) -> Vec<CommandResult> {
        self.lock().clone()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// A report carrying `sent` was accepted: those results are done. Results added while it was
    /// on its way stay for the next report.
    pub fn delivered(&self, sent: &[CommandResult]) {
        if sent.is_empty() {
            return;
        }
        let mut pending = self.lock();
        for result in sent {
            if let Some(at) = pending.iter().position(|p| p == result) {
                pending.remove(at);
            }
        }
        drop(pending);
        self.deliveries.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Returns once results are waiting to be sent.
    pub async fn ready(&self) {
        loop {
            self.ready.notified().await;
            // A result that already left with an earlier report leaves its wake-up behind.
            if !self.is_empty() {
                return;
            }
        }
    }

    /// Waits until `result` was delivered, at most `within`; whether it was.
    pub async fn wait_delivered(&self, result: &CommandResult, within: Duration) -> bool {
        // Subscribed before looking, so a delivery between the look and the wait is not missed.
        let mut deliveries = self.deliveries.subscribe();
        let deadline = Instant::now() + within;
        loop {
            if !self.lock().contains(result) {
                return true;
            }
            match tokio::time::timeout_at(deadline, deliveries.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in `self`, so only the deadline ends the wait.
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fleetmend_proto::{Finding, NodeCommand};

    use super::*;
    use crate::commands::result_of;

    fn command(id: &str, kind: &str) -> NodeCommand {
        NodeCommand { id: id.to_owned(), kind: kind.to_owned(), args: Default::default() }
    }

    #[test]
    fn delivered_removes_only_what_was_sent() {
        let outbox = CommandOutbox::default();
        let first = result_of(&command("r1", "reboot"), true, "reboot started");
        outbox.push(first.clone());
        let sent = outbox.pending();
        let second = result_of(&command("r1", "reboot"), false, "reboot command failed");
        outbox.push(second.clone());
        outbox.delivered(&sent);
        assert_eq!(outbox.pending(), [second]);
    }

    #[test]
    fn a_result_past_the_wire_bounds_is_cut_when_queued_and_still_delivered() {
        let outbox = CommandOutbox::default();
        let long = "x".repeat(fleetmend_proto::bounds::MAX_MESSAGE_BYTES + 1);
        let mut result = result_of(&command("p1", "deep-check"), false, long);
        result.findings = vec![Finding::ok("probe", "probe_failed", "p"); 3];
        outbox.push(result);
        let mut report: fleetmend_proto::Report = serde_json::from_str(
            r#"{"wire_version":1,"node":"n1","boot_id":"b","agent_version":"1","seq":1,
                "sent_at_ms":1,"trigger":"command","verdict":"healthy","checks":[],"findings":[]}"#,
        )
        .unwrap();
        report.command_results = outbox.pending();
        assert_eq!(fleetmend_proto::bounds::check_report(&report), Ok(()));
        assert_eq!(fleetmend_proto::bounds::fit_report(&mut report), 0);
        outbox.delivered(&report.command_results);
        assert!(outbox.is_empty(), "the cut result is the one delivered");
    }

    #[tokio::test]
    async fn waiting_for_delivery_ends_on_delivery_or_deadline() {
        let outbox = Arc::new(CommandOutbox::default());
        let result = result_of(&command("r1", "reboot"), true, "reboot started");
        outbox.push(result.clone());
        assert!(!outbox.wait_delivered(&result, Duration::from_millis(20)).await);
        let deliverer = Arc::clone(&outbox);
        let sent = outbox.pending();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            deliverer.delivered(&sent);
        });
        assert!(outbox.wait_delivered(&result, Duration::from_secs(10)).await);
    }
}
