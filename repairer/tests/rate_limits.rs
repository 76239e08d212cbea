//! Rates per caller: each credential (and each node with the shared agent token) has a bucket of
//! its own; beyond it a request is answered 429 with `Retry-After` and the API's JSON error body,
//! changes nothing, and is counted in `fleetmend_api_refused_total{status="429"}`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fleetmend_repairer::access::{CredentialConfig, Role};
use fleetmend_repairer::limits::Rate;
use support::{Harness, metric};

const AGENT: &str = "agent-token";
const ALERTS: &str = "alerts-token";
const BURST: u32 = 3;

async fn harness() -> Harness {
    Harness::start(|config| {
        config.agent_token = Some(AGENT.to_owned());
        config.alerts_token = Some(ALERTS.to_owned());
        config.admin_token = Some("admin-token".to_owned());
        let credential = |name: &str, token: &str| CredentialConfig {
            name: name.to_owned(),
            role: Role::Read,
            sha256: Some(fleetmend_repairer::identity::hash(token)),
            token_file: None,
        };
        config.credentials =
            vec![credential("grafana", "grafana-token"), credential("oncall", "oncall-token")];
        // One request every 100 s: past the burst, nothing refills during the test.
        let slow = Rate { per_second: 0.01, burst: BURST };
        config.rate_limits.node = slow;
        config.rate_limits.person = slow;
        config.rate_limits.alerts = slow;
    })
    .await
}

/// Status, `Retry-After` and body of `request`.
async fn send(request: reqwest::RequestBuilder) -> (u16, Option<u64>, String) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().expect("Retry-After in whole seconds"));
    (status, retry_after, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_beyond_the_rate_gets_429_with_retry_after_and_others_do_not() {
    let h = harness().await;
    let client = reqwest::Client::new();
    let nodes = |token: &'static str| client.get(h.url("/v1/nodes")).bearer_auth(token);
    for _ in 0..BURST {
        assert_eq!(send(nodes("grafana-token")).await.0, 200);
    }
    let (status, retry_after, body) = send(nodes("grafana-token")).await;
    assert_eq!(status, 429, "{body}");
    // One request per 100 s: the next is due in about that long.
    assert!(retry_after.is_some_and(|s| (90..=100).contains(&s)), "{retry_after:?}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("credential grafana"), "{error}");
    // Another credential has its own bucket.
    assert_eq!(send(nodes("oncall-token")).await.0, 200);
    let metrics = h.metrics().await;
    assert_eq!(metric(&metrics, r#"fleetmend_api_refused_total{status="429"}"#), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_with_the_shared_agent_token_are_counted_per_node() {
    let h = harness().await;
    let a = h.agent("node-a");
    for _ in 0..BURST {
        a.report().await;
    }
    let refused = a.try_report().await.unwrap_err();
    assert!(refused.contains("429"), "{refused}");
    // node-b shares the agent token, not node-a's bucket.
    let b = h.agent("node-b");
    b.report().await;
    let metrics = h.metrics().await;
    assert_eq!(metric(&metrics, r#"fleetmend_api_refused_total{status="429"}"#), Some(1.0));
    // The refused report changed nothing: node-a's record holds the last accepted one.
    assert_eq!(metric(&metrics, r#"fleetmend_reports_received_total{outcome="ok"}"#), Some(4.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alerts_token_in_the_query_is_one_bucket() {
    let h = harness().await;
    let client = reqwest::Client::new();
    let post = || {
        client
            .post(h.url(&format!("/v1/alerts/alertmanager?token={ALERTS}")))
            .header("content-type", "application/json")
            .body(r#"{"version":"4","status":"firing","alerts":[]}"#)
    };
    for _ in 0..BURST {
        let (status, _, body) = send(post()).await;
        assert_ne!(status, 429, "{body}");
    }
    let (status, retry_after, _) = send(post()).await;
    assert_eq!(status, 429);
    assert!(retry_after.is_some());
    // Without a credential, from loopback: not limited.
    for _ in 0..BURST * 2 {
        assert_eq!(send(client.get(h.url("/healthz"))).await.0, 200);
    }
}
