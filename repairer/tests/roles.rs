//! The role matrix: every operation of `/v1/openapi.json`, asked with no credential, a wrong one,
//! a read-only, an operator's, an admin's, an agent's, the alerts token and a rank's progress
//! token. Each answer must be the one the operation's `x-fleetmend-role` promises: a 401 for no
//! credential or an unknown one (a rank's token is known to its job's progress route only), a
//! 403 for a known credential without the right, anything else
//! (the route's own answer) for one with it. The role each operation needs is also written down
//! here, so a change to the document alone cannot pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleetmend_repairer::access::{CredentialConfig, Role};
use fleetmend_repairer::config::SchedulerKind;
use fleetmend_repairer::provider::{FakeProvider, Provider};
use fleetmend_repairer::service;
use support::{Agent, DEADLINE, http_client, test_config};

const AGENT: &str = "agent-token";
const ALERTS: &str = "alerts-token";
const ADMIN: &str = "shared-admin-token";

/// What each operation needs, as this test expects it.
const INTENDED: &[(&str, &str, &str)] = &[
    ("post", "/v1/reports", "agent"),
    ("post", "/v1/alerts/alertmanager", "alerts"),
    ("post", "/v1/alerts/cloudwatch", "alerts"),
    ("get", "/v1/nodes", "read"),
    ("get", "/v1/nodes/{name}", "read"),
    ("get", "/v1/nodes/{name}/evidence", "read"),
    ("post", "/v1/nodes/{name}/drain", "operator"),
    ("post", "/v1/nodes/{name}/undrain", "operator"),
    ("post", "/v1/nodes/{name}/repair", "operator"),
    ("post", "/v1/nodes/{name}/approve", "operator"),
    ("get", "/v1/events", "read"),
    ("get", "/v1/history/faults", "read"),
    ("get", "/v1/breaker", "read"),
    ("post", "/v1/breaker/close", "operator"),
    ("get", "/v1/sd/prometheus", "read"),
    ("get", "/v1/subscriptions", "admin"),
    ("get", "/v1/jobs", "read"),
    ("post", "/v1/jobs", "operator"),
    ("get", "/v1/jobs/{id}", "read"),
    ("post", "/v1/jobs/{id}/cancel", "operator"),
    ("post", "/v1/jobs/{id}/progress", "rank"),
    ("get", "/v1/leader", "none"),
    ("get", "/v1/openapi.json", "none"),
    ("get", "/metrics", "none"),
    ("get", "/healthz", "none"),
];

/// Whether a caller holding `held` may use an operation that needs `need`.
fn allowed(held: &str, need: &str) -> bool {
    let people = ["read", "operator", "admin"];
    match (people.iter().position(|r| *r == held), people.iter().position(|r| *r == need)) {
        (Some(h), Some(n)) => h >= n,
        _ => need == "none" || held == need,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_credential_as_its_role_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.scheduler = SchedulerKind::Embedded;
    config.engine.report_interval = Duration::from_secs(1);
    config.queue.tick = Duration::from_millis(50);
    config.agent_token = Some(AGENT.to_owned());
    config.alerts_token = Some(ALERTS.to_owned());
    config.admin_token = Some(ADMIN.to_owned());
    let credential = |name: &str, role: Role, token: &str| CredentialConfig {
        name: name.to_owned(),
        role,
        sha256: Some(fleetmend_repairer::identity::hash(token)),
        token_file: None,
    };
    config.credentials = vec![
        credential("grafana", Role::Read, "read-token"),
        credential("oncall", Role::Operator, "operator-token"),
        credential("root-of-ops", Role::Admin, "admin-token"),
    ];
    assert!(config.problems().is_empty(), "{:?}", config.problems());
    let provider = Arc::new(FakeProvider::new());
    let repairer = service::start_with(
        config,
        None,
        Some(provider.clone() as Arc<dyn Provider>),
        std::future::pending::<()>(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", repairer.local_addr);
    let client = http_client();

    // A node and a running job on it, so that every path names something that exists.
    let agent = Agent::connect("n1", &base, Some(AGENT.to_owned()), provider.clone());
    agent.report().await;
    agent.start_heartbeat();
    let spec = serde_json::json!({
        "name": "matrix", "argv": ["fleetmend", "train"], "nodes": 1,
        "checkpoint_dir": "/shared/ckpt/matrix",
    });
    let submitted = client
        .post(format!("{base}/v1/jobs"))
        .bearer_auth("admin-token")
        .json(&spec)
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status().as_u16(), 201);
    let job: serde_json::Value = submitted.json().await.unwrap();
    let job = job["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + DEADLINE;
    let run = loop {
        if let Some(run) = agent.run_ranks().into_iter().find(|r| r.key.job == job) {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "the job's rank never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let rank_token = run.env[fleetmend_proto::jobs::PROGRESS_TOKEN_VAR].clone();

    let spec_text = client.get(format!("{base}/v1/openapi.json")).send().await.unwrap();
    let document: serde_json::Value = spec_text.json().await.unwrap();
    let intended: BTreeMap<(String, String), String> =
        INTENDED.iter().map(|(m, p, r)| ((m.to_string(), p.to_string()), r.to_string())).collect();
    let callers: [(&str, Option<&str>); 8] = [
        ("no credential", None),
        ("wrong", Some("not-a-token")),
        ("read", Some("read-token")),
        ("operator", Some("operator-token")),
        ("admin", Some("admin-token")),
        ("agent", Some(AGENT)),
        ("alerts", Some(ALERTS)),
        ("rank", Some(&rank_token)),
    ];
    let mut seen = 0;
    let mut wrong = Vec::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let declared = operation["x-fleetmend-role"].as_str().unwrap_or("<missing>");
            let key = (method.clone(), path.clone());
            assert_eq!(
                intended.get(&key).map(String::as_str),
                Some(declared),
                "{method} {path}: the document says {declared}"
            );
            seen += 1;
            let url = format!("{base}{}", path.replace("{name}", "n1").replace("{id}", &job));
            for (held, token) in callers {
                // Read-only probes and empty bodies: the credential is judged before anything else.
                let mut request = match method.as_str() {
                    "get" => client.get(&url),
                    _ => client.post(&url).header("content-type", "application/json").body("{}"),
                };
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                let body = response.text().await.unwrap();
                let ok = match (held, declared) {
                    (_, "none") => ![401, 403].contains(&status),
                    ("no credential" | "wrong", _) => status == 401,
                    // A rank's token is known to its job only: anywhere else it is no credential.
                    ("rank", need) if need != "rank" => status == 401,
                    (held, need) if allowed(held, need) => ![401, 403].contains(&status),
                    _ => status == 403,
                };
                let documented = operation["responses"].get(status.to_string()).is_some();
                if !ok || !documented {
                    wrong.push(format!(
                        "{method} {path} as {held} (needs {declared}): {status}{} {body}",
                        if documented { "" } else { " (not in the document)" }
                    ));
                }
                if [401, 403].contains(&status) {
                    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                    if json["error"].as_str().is_none_or(str::is_empty) {
                        wrong.push(format!("{method} {path} as {held}: no JSON error: {body}"));
                    }
                }
            }
        }
    }
    assert_eq!(seen, INTENDED.len(), "every intended operation is in the document");
    assert!(
        wrong.is_empty(),
        "{} answers are not the intended ones:\n{}",
        wrong.len(),
        wrong.join("\n")
    );

    // The audit trail names the credential that acted.
    let drained = client
        .post(format!("{base}/v1/nodes/n1/undrain"))
        .bearer_auth("operator-token")
        .send()
        .await
        .unwrap();
    assert!(drained.status().is_success() || drained.status().as_u16() == 409);
    let events: Vec<serde_json::Value> = client
        .get(format!("{base}/v1/events?node=n1"))
        .bearer_auth("read-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let actors: Vec<&str> = events.iter().filter_map(|e| e["actor"].as_str()).collect();
    assert!(actors.contains(&"person:oncall"), "operator actions are oncall's: {actors:?}");
    assert!(!actors.contains(&"person:grafana"), "read-only did nothing: {actors:?}");
    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("fleetmend_api_refused_total{status=\"403\"}"), "{metrics}");
}
