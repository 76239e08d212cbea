//! What the agents' reports tell the queue: which ranks run, which exited, which outlived their
//! attempt.

use std::collections::BTreeMap;

use fleetmend_proto::{RankKey, RankSignal, RankState, Report, ReportTrigger};

use super::stop::signal_command;
use super::{JobQueue, JobState, reindex};
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
        if report.ranks.is_empty() && !had_live && !state.assigned.contains_key(&report.node) {
            return;
        }
        let mut touched: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut stale_running: Vec<RankKey> = Vec::new();
        for status in &report.ranks {
            match state.jobs.get_mut(&status.key.job) {
                Some(job) if job.state.is_active() && job.attempt == status.key.attempt => {
                    if let Some(rank) = job.ranks.get_mut(status.key.rank as usize)
                        && rank.node == report.node
                        && rank.status.as_ref() != Some(status)
                    {
                        rank.status = Some(status.clone());
                        touched.entry(job.id.clone()).or_default().push(status.key.rank as usize);
                    }
                }
                Some(_) if status.state == RankState::Running => {
                    stale_running.push(status.key.clone());
                }
                _ => {}
            }
        }
        // A rank seen running that its node no longer reports is gone: the agent restarted or
        // the node rebooted. Only this node's ranks are looked at.
        let on_node = state.assigned.get(&report.node).cloned().unwrap_or_default();
        for (id, index) in on_node {
            let Some(job) = state.jobs.get_mut(&id).filter(|j| j.state.is_active()) else {
                continue;
            };
            let attempt = job.attempt;
            let Some(rank) = job.ranks.get_mut(index as usize).filter(|r| r.node == report.node)
            else {
                continue;
            };
            let listed = report
                .ranks
                .iter()
                .any(|s| s.key.job == id && s.key.attempt == attempt && s.key.rank == rank.rank);
            if let Some(status) = rank.status.as_mut()
                && status.state == RankState::Running
                && !listed
            {
                status.state = RankState::Exited;
                status.message =
                    "no longer in its node's reports (the agent restarted or the node rebooted)"
                        .to_owned();
                status.finished_at_ms = Some(now);
                touched.entry(id).or_default().push(index as usize);
            }
        }
        // What moved is the tick's to move on.
        if !touched.is_empty() || !stale_running.is_empty() {
            self.wake();
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
        // A failed rank of a starting or running job stops the job at once; anything else (a
        // rank started, a rank of a stopping job exited) moves its job on at the next tick, once
        // for every report of the tick: each report would otherwise look at every rank of the job.
        let mut stopped = false;
        for (id, ranks) in touched {
            let Some(job) = state.jobs.get_mut(&id) else { continue };
            let failed = matches!(job.state, JobState::Starting | JobState::Running)
                && ranks.iter().any(|&i| job.ranks.get(i).is_some_and(|r| r.failure().is_some()));
            if failed {
                self.advance(job, now, None);
                self.save(job);
                stopped = true;
            } else {
                state.dirty.insert(id.clone());
                state.moved.insert(id);
            }
        }
        if stopped {
            reindex(&mut state);
        }
    }
}

impl ReportObserver for JobQueue {
    fn observe_report(&self, report: &Report, now: u64) {
        JobQueue::observe_report(self, report, now);
    }
}
