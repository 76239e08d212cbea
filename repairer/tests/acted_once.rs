//! Nothing is acted on twice: an agent restarted after a kernel-log line was acted on reads its
//! boot's log again and reports the same line (the same boot id, the same `/dev/kmsg` sequence
//! number). The repairer takes it as the record it already acted on, not as a new fault; a later
//! line of the same boot is a new fault.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fleetmend_proto::{Finding, KMSG_SEQ_LABEL, RecommendedAction, Status};
use fleetmend_repairer::model::{EventKind, NodeState, RuleAction};
use support::{Expect, Harness, assert_transitions, count, describe, names};

use NodeState::{Drained, Draining, Healthy, Suspect};

/// A block I/O error line the kernel logged as record `seq`: the agent recommends a drain.
fn io_error(seq: u64) -> Finding {
    Finding::new(
        "kernel_log",
        "block_io_error",
        "nvme0n1",
        Status::Fail,
        RecommendedAction::Drain,
        "blk_update_request: I/O error, dev nvme0n1, sector 2048",
    )
    .with_label(KMSG_SEQ_LABEL, seq.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_log_record_read_again_by_a_restarted_agent_is_not_acted_on_twice() {
    let h = Harness::start(|_| {}).await;
    let fleet = names("n", 5);
    let agents = h.fleet(&fleet).await;
    let n1 = &agents[0];

    // Record 100: drained, and back once the line's window passed.
    n1.set_findings(vec![io_error(100)]);
    h.wait_state("n1", Drained).await;
    n1.set_findings(Vec::new());
    h.wait_event(Some("n1"), &Expect::transition("n1", Drained, Healthy)).await;
    let cycle = [(Healthy, Suspect), (Suspect, Draining), (Draining, Drained), (Drained, Healthy)];
    assert_transitions(&h.events().await, "n1", &cycle);

    // The agent restarts and reports record 100 again, report after report: nothing happens.
    n1.set_findings(vec![io_error(100)]);
    h.wait_more_reports(25.0).await;
    let events = h.events().await;
    assert_transitions(&events, "n1", &cycle);
    let decisions = Expect::kind(EventKind::Decision).node("n1");
    assert_eq!(count(&events, &decisions), 1, "{}", describe(&events));
    assert_eq!(h.state("n1").await, Some(Healthy));

    // A later line of the same boot is a new fault.
    n1.set_findings(vec![io_error(101)]);
    h.wait_state("n1", Drained).await;
    let events = h.events().await;
    assert_eq!(count(&events, &decisions.clone().action(RuleAction::Drain)), 2);
    drop(agents);
}
