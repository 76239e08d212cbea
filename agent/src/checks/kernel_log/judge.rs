//! The check's judgment of kernel-log records handed to it: the same rules, memory, windows,
//! clear lines and Xid bursts as the check, for a caller that holds the records itself rather
//! than a log to read (`fleetmend simulate`'s noise soak runs every simulated node's log
//! through it).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fleetmend_proto::Finding;

use super::rules::Rule;
use super::source::parse_record;
use super::{KernelLogConfig, Ledger, compile_rules};

/// The kernel_log check's rules and ledger over records handed to it.
#[derive(Debug)]
pub struct KernelLogJudge {
    /// Compiled once and shared by every judge made with [`KernelLogJudge::fresh`].
    rules: Arc<[Rule]>,
    config: Arc<KernelLogConfig>,
    ledger: Ledger,
}

impl KernelLogJudge {
    /// The rules of `config` (the built-in ones unless turned off); a rule that does not compile
    /// is an error naming it and why.
    pub fn new(config: &KernelLogConfig) -> Result<KernelLogJudge, String> {
        let (compiled, broken) = compile_rules(config);
        if let Some((name, why)) = broken.first() {
            return Err(format!("rule {name}: {why}"));
        }
        let ledger = Ledger::new(compiled.len(), config);
        Ok(KernelLogJudge { rules: compiled.into(), config: Arc::new(config.clone()), ledger })
    }

    /// A judge with the same rules and nothing seen yet (a new agent process): the rules are
    /// shared, not compiled again.
    pub fn fresh(&self) -> KernelLogJudge {
        KernelLogJudge {
            rules: self.rules.clone(),
            config: self.config.clone(),
            ledger: Ledger::new(self.rules.len(), &self.config),
        }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use fleetmend_proto::{KMSG_SEQ_LABEL, RecommendedAction, Status};

    use super::*;

    const BOOT: Duration = Duration::from_secs(3_600);

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    /// Records handed over judge as the check does: a link down and its window, the clear line,
    /// the record's sequence number; a fresh judge has seen nothing and a rule it was not given
    /// is a named error.
    #[test]
    fn records_handed_over_are_judged_as_the_check_judges_them() {
        let mut judge = KernelLogJudge::new(&KernelLogConfig::default()).unwrap();
        let down = "6,41,3600000000,-;mlx5_core 0000:17:00.0 eth0: Link down";
        assert!(judge.take_kmsg(down, BOOT, at(0)));
        let findings = judge.findings(at(1));
        let link = findings.iter().find(|f| f.finding == "link_down").unwrap();
        assert_eq!((link.status, link.action), (Status::Warn, RecommendedAction::None));
        assert_eq!(link.labels.get(KMSG_SEQ_LABEL).map(String::as_str), Some("41"));
        let up = "6,42,3605000000,-;mlx5_core 0000:17:00.0 eth0: Link up";
        judge.take_kmsg(up, BOOT + Duration::from_secs(5), at(5));
        let findings = judge.findings(at(6));
        assert!(findings.iter().all(|f| f.status == Status::Ok), "{findings:?}");

        let mut fresh = judge.fresh();
        assert!(fresh.findings(at(6)).is_empty());
        assert!(Arc::ptr_eq(&fresh.rules, &judge.rules), "the rules are shared");

        let broken = KernelLogConfig {
            rules: vec![super::super::KernelLogRule {
                name: "broken".to_owned(),
                pattern: "(".to_owned(),
                ..super::super::KernelLogRule::default()
            }],
            ..KernelLogConfig::default()
        };
        let err = KernelLogJudge::new(&broken).unwrap_err();
        assert!(err.starts_with("rule broken: "), "{err}");
    }
}
