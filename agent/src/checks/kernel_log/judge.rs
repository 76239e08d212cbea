//! The check's judgment of kernel-log records handed to it: the same rules, memory, windows,
//! clear lines and Xid bursts as the check, for a caller that holds the records itself rather
//! than a log to read (`fleetmend simulate`'s noise soak runs every simulated node's log
//! through it).

use std::time::{Duration, SystemTime};

use fleetmend_proto::Finding;

use super::rules::{self, Rule};
use super::source::parse_record;
use super::{KernelLogConfig, Ledger};

/// The kernel_log check's rules and ledger over records handed to it.
#[derive(Debug)]
pub struct KernelLogJudge {
    rules: Vec<Rule>,
    ledger: Ledger,
}

impl KernelLogJudge {
    /// The rules of `config` (the built-in ones unless turned off); a rule that does not compile
    /// is an error naming it and why.
    pub fn new(config: &KernelLogConfig) -> Result<KernelLogJudge, String> {
        let mut compiled = Vec::new();
        for rule in rules::effective_rules(config.builtin_rules, &config.rules) {
            match rules::compile(&rule) {
                Ok(rule) => compiled.push(rule),
                Err(problems) => {
                    let why: Vec<String> =
                        problems.iter().map(|(field, msg)| format!("{field}: {msg}")).collect();
                    return Err(format!("rule {}: {}", rule.name, why.join("; ")));
                }
            }
        }
        let ledger = Ledger::new(compiled.len(), config);
        Ok(KernelLogJudge { rules: compiled, ledger })
    }

    /// Takes in one `/dev/kmsg` record (`PRIORITY,SEQ,USEC,FLAGS;text`) read at `now`, when the
    /// node has been up for `uptime`. Returns whether a rule matched it.
    pub fn take_kmsg(&mut self, raw: &str, uptime: Duration, now: SystemTime) -> bool {
        let record = parse_record(raw.as_bytes());
        self.ledger.record(&self.rules, &record, Some(uptime), now)
    }

    /// The rule findings at `now` (those whose window passed are dropped; a subject seen before
    /// is reported ok once it cleared), as the check reports them.
    pub fn findings(&mut self, now: SystemTime) -> Vec<Finding> {
        self.ledger.findings(&self.rules, now)
    }
}
