//! What the agents' reports tell the queue: which ranks run, which exited, which outlived their
//! attempt.

use std::collections::BTreeSet;

use fleetmend_proto::{RankKey, RankSignal, RankState, Report, ReportTrigger};

use super::stop::signal_command;
use super::{JobQueue, reindex};
use crate::ports::ReportObserver;

impl JobQueue {
    /// Takes in the ranks a node's agent reports (called with every report, before the reply's
    /// commands are taken, so the queue's commands for the node ride in the same reply).
    pub fn observe_report(&self, report: &Report, now: u64) {
        let mut state = self.lock();
        let seen = state.nodes.entry(report.node.clone()).or_default();
        // Reports of one agent may arrive out of order; an older snapshot of its ranks must not
        // undo a newer one. An agent process restart starts its sequence again.
        let stale = seen.boot_id == report.boot_id
            && report.seq < seen.seq
            && report.trigger != ReportTrigger::Startup;
        if stale {
            return;
        }
        seen.boot_id.clone_from(&report.boot_id);
        seen.seq = report.seq;
        if report.address.is_some() {
            seen.address.clone_from(&report.address);
        }
        let had_live = !seen.live.is_empty();
        seen.live = report
            .ranks
            .iter()
            .filter(|r| r.state == RankState::Running)
            .map(|r| r.key.clone())
            .collect();
        if report.ranks.is_empty() && !had_live && !state.assigned.contains(&report.node) {
            return;
        }
        let mut touched: BTreeSet<String> = BTreeSet::new();
        let mut stale_running: Vec<RankKey> = Vec::new();
        for status in &report.ranks {
            match state.jobs.get_mut(&status.key.job) {
                Some(job) if job.state.is_active() && job.attempt == status.key.attempt => {
                    if let Some(rank) = job.ranks.get_mut(status.key.rank as usize)
                        && rank.node == report.node
                        && rank.status.as_ref() != Some(status)
                    {
                        rank.status = Some(status.clone());
                        touched.insert(job.id.clone());
                    }
                }
                Some(_) if status.state == RankState::Running => {
                    stale_running.push(status.key.clone());
                }
                _ => {}
            }
        }
        if state.assigned.contains(&report.node) {
            // A rank seen running that its node no longer reports is gone: the agent restarted
            // or the node rebooted.
            for job in state.jobs.values_mut().filter(|j| j.state.is_active()) {
                let attempt = job.attempt;
                for rank in job.ranks.iter_mut().filter(|r| r.node == report.node) {
                    let listed = report.ranks.iter().any(|s| {
                        s.key.job == job.id && s.key.attempt == attempt && s.key.rank == rank.rank
                    });
                    if let Some(status) = rank.status.as_mut()
                        && status.state == RankState::Running
                        && !listed
                    {
                        status.state = RankState::Exited;
                        status.message =
                            "no longer in its node's reports (the agent restarted or the node rebooted)"
                                .to_owned();
                        status.finished_at_ms = Some(now);
                        touched.insert(job.id.clone());
                    }
                }
            }
        }
        for key in stale_running {
            let due = state.stale_kills.get(&key).is_none_or(|sent| {
                now.saturating_sub(*sent) >= self.config.stop_grace.as_millis() as u64
            });
            if due {
                tracing::info!(rank = %key, node = %report.node, "killing a rank of an old attempt");
                self.commands.push(&report.node, signal_command(&key, RankSignal::Kill));
                state.stale_kills.insert(key, now);
            }
        }
        for id in &touched {
            if let Some(job) = state.jobs.get_mut(id) {
                self.advance(job, now, None);
                self.save(job);
            }
        }
        if !touched.is_empty() {
            reindex(&mut state);
        }
    }
}

impl ReportObserver for JobQueue {
    fn observe_report(&self, report: &Report, now: u64) {
        JobQueue::observe_report(self, report, now);
    }
}
