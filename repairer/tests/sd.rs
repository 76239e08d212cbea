//! Prometheus HTTP service discovery (`GET /v1/sd/prometheus`): scripted agents tell their metrics
//! port in their reports; the repairer serves one target group per such node with its current
//! state, plus itself at the address the request was sent to, behind the admin token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fleetmend_repairer::api::TargetGroup;
use fleetmend_repairer::model::NodeState;
use serde_json::json;
use support::Harness;

/// The target groups, ordered by target so the assertions do not depend on map order.
async fn groups(h: &Harness) -> Vec<(String, Vec<(String, String)>)> {
    let groups: Vec<TargetGroup> = h.get_json("/v1/sd/prometheus").await;
    let mut out: Vec<(String, Vec<(String, String)>)> = groups
        .into_iter()
        .map(|g| {
            assert_eq!(g.targets.len(), 1, "one target per group: {:?}", g.targets);
            (g.targets[0].clone(), g.labels.into_iter().collect())
        })
        .collect();
    out.sort();
    out
}

fn agent_labels(node: &str, state: &str) -> Vec<(String, String)> {
    vec![
        ("component".to_owned(), "agent".to_owned()),
        ("node".to_owned(), node.to_owned()),
        ("state".to_owned(), state.to_owned()),
    ]
}

fn repairer_labels() -> Vec<(String, String)> {
    vec![("component".to_owned(), "repairer".to_owned())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_that_tells_its_port_and_the_repairer_are_targets_with_their_state() {
    let h = Harness::start(|_| {}).await;
    // With an address: the target is that address. Without: the node name (its host name).
    let with_address = h.agent("gpu-a");
    with_address.set_address("10.0.0.1");
    with_address.set_metrics_port(9101);
    with_address.report().await;
    let by_name = h.agent("gpu-b");
    by_name.set_metrics_port(9102);
    by_name.report().await;
    // An agent older than the field tells no port: it is known, but not a target.
    let old = h.agent("gpu-c");
    old.report().await;
    assert_eq!(h.nodes().await.len(), 3);
    // Heartbeats keep every node reachable however slow the machine: the states asserted below
    // are the ones this test causes, never "unreachable".
    for agent in [&with_address, &by_name, &old] {
        agent.start_heartbeat();
    }

    let repairer = h.base.trim_start_matches("http://").to_owned();
    assert_eq!(
        groups(&h).await,
        [
            ("10.0.0.1:9101".to_owned(), agent_labels("gpu-a", "healthy")),
            (repairer.clone(), repairer_labels()),
            ("gpu-b:9102".to_owned(), agent_labels("gpu-b", "healthy")),
        ]
    );

    // The state label follows the node; an agent restarted on another port moves its target.
    let (status, body) = h.post_admin("/v1/nodes/gpu-a/drain", json!({})).await;
    assert_eq!(status, 200, "{body}");
    h.wait_state("gpu-a", NodeState::Drained).await;
    by_name.set_metrics_port(9202);
    by_name.report().await;
    assert_eq!(
        groups(&h).await,
        [
            ("10.0.0.1:9101".to_owned(), agent_labels("gpu-a", "drained")),
            (repairer, repairer_labels()),
            ("gpu-b:9202".to_owned(), agent_labels("gpu-b", "healthy")),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_discovery_needs_the_admin_token() {
    let h = Harness::start(|config| config.admin_token = Some("admin-secret".to_owned())).await;
    let url = h.url("/v1/sd/prometheus");
    let anonymous = h.client.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let wrong = h.client.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    // With the token (as Prometheus sends it from `authorization.credentials_file`).
    let groups: Vec<TargetGroup> = h.get_json("/v1/sd/prometheus").await;
    assert_eq!(groups.len(), 1, "only the repairer: no agent reported");
    assert_eq!(groups[0].labels.get("component").map(String::as_str), Some("repairer"));
}
