//! Kernel-log records already acted on. An agent restarted (or upgraded) reads its boot's kernel
//! log again and reports the lines it finds within its lookback: a line the repairer already
//! acted on would come back as a new finding and be acted on twice. A kernel-log finding names
//! its latest line's `/dev/kmsg` sequence number ([`KMSG_SEQ_LABEL`]); with the report's boot id
//! that is the record's identity. The node record keeps the newest record acted on (written to
//! the store with it, so a restarted repairer knows it too), and a finding that is not tracked now
//! and names a record at or before it is not taken in again. A record of a later boot, or a later
//! record of this boot, is new.

use fleetmend_proto::{Finding, KMSG_SEQ_LABEL};
use serde::{Deserialize, Serialize};

use super::NodeRecord;
use crate::model::{FindingKey, FindingSource};

/// The newest kernel-log record acted on: its boot and `/dev/kmsg` sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActedThrough {
    pub boot_id: String,
    pub kmsg_seq: u64,
}

/// The `/dev/kmsg` sequence number of the line a finding was raised on, where it names one.
pub fn kmsg_seq(finding: &Finding) -> Option<u64> {
    finding.labels.get(KMSG_SEQ_LABEL)?.parse().ok()
}

impl NodeRecord {
    /// Whether the agent's `finding` (the node's boot id already the report's) names a record
    /// already acted on and is not tracked now: it is an old line read again.
    pub(crate) fn acted_on_before(&self, finding: &Finding) -> bool {
        let (Some(acted), Some(seq)) = (&self.acted_through, kmsg_seq(finding)) else {
            return false;
        };
        let key = FindingKey::of(finding, FindingSource::Agent);
        acted.boot_id == self.boot_id
            && seq <= acted.kmsg_seq
            && !self.findings.iter().any(|t| t.key() == key)
    }

    /// Remembers the kernel-log records tracked now as acted on (a repair begins or ends).
    pub(crate) fn mark_acted(&mut self) {
        let Some(newest) = self.findings.iter().filter_map(|t| kmsg_seq(&t.finding)).max() else {
            return;
        };
        match &mut self.acted_through {
            Some(acted) if acted.boot_id == self.boot_id => {
                acted.kmsg_seq = acted.kmsg_seq.max(newest);
            }
            _ => {
                self.acted_through =
                    Some(ActedThrough { boot_id: self.boot_id.clone(), kmsg_seq: newest });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use fleetmend_proto::{RecommendedAction, Status};

    use super::*;
    use crate::model::TrackedFinding;

    fn xid(seq: u64) -> Finding {
        let mut finding = Finding::new(
            "kernel_log",
            "xid",
            "0",
            Status::Fail,
            RecommendedAction::Reboot,
            "Xid 79",
        );
        finding.labels.insert("xid".to_owned(), "79".to_owned());
        finding.labels.insert(KMSG_SEQ_LABEL.to_owned(), seq.to_string());
        finding
    }

    fn tracked(finding: Finding) -> TrackedFinding {
        TrackedFinding {
            finding,
            source: FindingSource::Agent,
            first_seen_ms: 0,
            last_seen_ms: 0,
            observations: 1,
            looked_ms: None,
        }
    }

    #[test]
    fn a_record_acted_on_is_old_once_untracked_and_a_later_record_or_boot_is_new() {
        let mut node = NodeRecord::new("node-1", 0);
        node.boot_id = "boot-a".to_owned();
        assert!(!node.acted_on_before(&xid(100)), "nothing acted on yet");
        node.findings.push(tracked(xid(100)));
        node.mark_acted();
        assert_eq!(
            node.acted_through,
            Some(ActedThrough { boot_id: "boot-a".to_owned(), kmsg_seq: 100 })
        );
        assert!(!node.acted_on_before(&xid(100)), "tracked now: a repair follows it");
        node.findings.clear();
        assert!(node.acted_on_before(&xid(100)), "the same record read again");
        assert!(node.acted_on_before(&xid(99)), "an older record of the boot");
        assert!(!node.acted_on_before(&xid(101)), "a later record");
        let mut unlabelled = xid(1);
        unlabelled.labels.remove(KMSG_SEQ_LABEL);
        assert!(!node.acted_on_before(&unlabelled), "no identity: taken in");
        node.boot_id = "boot-b".to_owned();
        assert!(!node.acted_on_before(&xid(100)), "another boot's record 100");
        node.findings.push(tracked(xid(7)));
        node.mark_acted();
        assert_eq!(
            node.acted_through,
            Some(ActedThrough { boot_id: "boot-b".to_owned(), kmsg_seq: 7 }),
            "a new boot starts over"
        );
        // Kept in the node's document: a restarted repairer knows it too.
        let saved = serde_json::to_value(&node).unwrap();
        let loaded: NodeRecord = serde_json::from_value(saved.clone()).unwrap();
        assert_eq!(loaded.acted_through, node.acted_through);
        let mut older = saved;
        older.as_object_mut().unwrap().remove("acted_through");
        let loaded: NodeRecord = serde_json::from_value(older).unwrap();
        assert_eq!(loaded.acted_through, None, "a document from before it loads");
    }
}
