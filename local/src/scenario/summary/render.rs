//! The summary for people: a few lines a fault, the targets, the job and its weights.

use std::fmt::Write as _;

use super::{FaultSummary, Summary};

pub(super) fn describe_repair(fault: &FaultSummary) -> String {
    let mut text =
        if fault.actions.is_empty() { "no repair".to_owned() } else { fault.actions.join(" → ") };
    if let Some(outcome) = &fault.outcome {
        text.push_str(&format!(", {outcome}"));
    }
    if let Some(spare) = &fault.replaced_by {
        text.push_str(&format!(" (replaced by {spare})"));
    }
    if let Some(held) = &fault.held {
        text.push_str(&format!("; held: {held}"));
    }
    if fault.breaker_opened {
        text.push_str("; the breaker opened");
    }
    text
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.2} s"))
}

impl Summary {
    /// The summary for people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "scenario {}: {}", self.scenario, self.description);
        for f in &self.faults {
            let persistent = if f.persistent { " (persistent)" } else { "" };
            let _ = write!(out, "fault {}: {}{persistent}", f.number, f.fault);
            if let Some(why) = &f.not_injected {
                let _ = writeln!(out, " on {}: not injected: {why}", f.target);
                continue;
            }
            let rank = f.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
            let _ = writeln!(
                out,
                " on {}{rank} at step {} (+{})",
                f.node.as_deref().unwrap_or("?"),
                f.at_step.map_or("-".to_owned(), |s| s.to_string()),
                secs(f.injected_at_s)
            );
            let _ = writeln!(
                out,
                "  detected after {}, drained after {}",
                secs(f.detect_s),
                secs(f.drain_s)
            );
            if f.job_restarted {
                let _ = writeln!(
                    out,
                    "  job's first step after resume: {} after the fault ({} without {} waiting for nodes); \
                     resumed from step {} (last step before: {}), {} step(s) lost, {} restart(s)",
                    secs(f.resume_total_s),
                    secs(f.resume_s),
                    secs(f.waiting_for_nodes_s),
                    f.resumed_from_step.map_or("-".to_owned(), |s| s.to_string()),
                    f.last_step_before.map_or("-".to_owned(), |s| s.to_string()),
                    f.steps_lost.map_or("-".to_owned(), |s| s.to_string()),
                    f.restarts,
                );
            } else {
                let _ = writeln!(out, "  the job was not restarted for it");
            }
            let _ = write!(out, "  repair: {}", describe_repair(f));
            match (f.expect, f.expectation_met) {
                (Some(expect), Some(met)) => {
                    let _ = writeln!(
                        out,
                        "; expected {}: {}",
                        expect.as_str(),
                        if met { "yes" } else { "NO" }
                    );
                }
                _ => {
                    let _ = writeln!(out);
                }
            }
        }
        let _ = writeln!(
            out,
            "fault → detected: p50 {}, p99 {}; fault → drained: p50 {}, p99 {}",
            secs(self.detect.p50),
            secs(self.detect.p99),
            secs(self.drain.p50),
            secs(self.drain.p99)
        );
        for target in &self.targets {
            let verdict = match target.met {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "not measured",
            };
            let _ = writeln!(
                out,
                "target: {} {}: {} ({verdict})",
                target.name, target.limit, target.measured
            );
        }
        let job = self.job.as_deref().unwrap_or("-");
        let _ = writeln!(
            out,
            "job {job}: {} at step {} of {} after {} restart(s), {} step(s) lost in all",
            self.job_state.as_deref().unwrap_or("-"),
            self.final_step.map_or("-".to_owned(), |s| s.to_string()),
            self.steps,
            self.restarts,
            self.steps_lost_total
        );
        let hash = self.weights_sha256.as_deref().unwrap_or("-");
        match (self.hash_matches, &self.reference_error) {
            (Some(true), _) => {
                let _ = writeln!(out, "weights sha256 {hash}: equal to an uninterrupted run's");
            }
            (Some(false), _) => {
                let _ = writeln!(
                    out,
                    "weights sha256 {hash}: DIFFERS from an uninterrupted run's ({})",
                    self.reference_sha256.as_deref().unwrap_or("-")
                );
            }
            (None, Some(err)) => {
                let _ = writeln!(out, "weights sha256 {hash}: no reference ({err})");
            }
            (None, None) => {
                let _ = writeln!(out, "weights sha256 {hash}: not compared");
            }
        }
        for problem in &self.problems {
            let _ = writeln!(out, "problem: {problem}");
        }
        let _ = writeln!(
            out,
            "scenario {} {} in {:.1} s",
            self.scenario,
            if self.passed { "passed" } else { "FAILED" },
            self.wall_s
        );
        out
    }
}
