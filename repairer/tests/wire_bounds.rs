//! Hostile and careless clients: every collection and string of a request body is bounded (a body
//! past a bound is a 400 naming the field, counted, and changes nothing; one just inside every
//! bound is taken), and every error of every route, axum's own refusals included, is the API's
//! `{"error": "..."}` with its status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetmend_proto::bounds::{
    MAX_ADDRESS_BYTES, MAX_ARG_BYTES, MAX_ARGS, MAX_CHECKS, MAX_COMMAND_RESULTS, MAX_ENV,
    MAX_EVIDENCE_ITEMS, MAX_FINDINGS, MAX_ID_BYTES, MAX_JOB_RANKS, MAX_LABEL_KEY_BYTES,
    MAX_LABEL_VALUE_BYTES, MAX_LABELS, MAX_MESSAGE_BYTES, MAX_NAME_BYTES, MAX_RANKS,
    MAX_SUBJECT_BYTES,
};
use fleetmend_proto::jobs::{PROGRESS_TOKEN_VAR, PROGRESS_URL_VAR};
use fleetmend_repairer::config::SchedulerKind;
use fleetmend_repairer::provider::{FakeProvider, Provider};
use fleetmend_repairer::service;
use serde_json::{Value, json};
use support::{Agent, DEADLINE, Harness, http_client, metric, test_config};

fn report_json(node: &str) -> Value {
    json!({
        "wire_version": fleetmend_proto::WIRE_VERSION,
        "node": node,
        "boot_id": "b1",
        "agent_version": "test",
        "seq": 1,
        "sent_at_ms": 1,
        "trigger": "interval",
        "verdict": "unhealthy",
        "checks": [],
        "findings": [finding(0)],
    })
}

/// A failing finding with `labels` labels.
fn finding(labels: usize) -> Value {
    let labels: serde_json::Map<String, Value> =
        (0..labels).map(|i| (format!("k{i:05}"), json!(""))).collect();
    json!({
        "check": "gpu", "finding": "xid", "subject": "0", "status": "fail", "action": "reboot",
        "message": "Xid 79 on GPU 0", "labels": labels,
    })
}

fn rank(job: &str, message: &str) -> Value {
    json!({ "job": job, "attempt": 0, "rank": 0, "state": "running", "message": message, "started_at_ms": 1 })
}

fn command_result(id: &str, message: &str, findings: Vec<Value>) -> Value {
    json!({ "id": id, "kind": "deep-check", "ok": true, "message": message, "findings": findings, "finished_at_ms": 1 })
}

fn check_run(name: &str) -> Value {
    json!({ "check": name, "status": "ok", "duration_seconds": 0.1, "finished_at_ms": 1 })
}

/// `n` bytes of text.
fn text(n: usize) -> String {
    "x".repeat(n)
}

/// The request's status and its body, which must be a JSON error object: its `error`.
async fn json_error(request: reqwest::RequestBuilder) -> (u16, String, reqwest::header::HeaderMap) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let content_type = headers.get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let body = response.text().await.unwrap();
    assert_eq!(content_type.as_deref(), Some("application/json"), "{status}: {body}");
    let json: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{status} with a body that is not JSON ({e}): {body}"));
    let error = json["error"].as_str().unwrap_or_else(|| panic!("no error in {json}")).to_owned();
    (status, error, headers)
}

fn reports_counter(text: &str, outcome: &str) -> Option<f64> {
    metric(text, &format!("fleetmend_reports_received_total{{outcome=\"{outcome}\"}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_past_any_bound_is_refused_naming_the_field_and_changes_nothing() {
    // A body as large as 10,001 findings is, so that the bound refuses it and not the body limit.
    let h = Harness::start(|c| {
        c.max_body_bytes = 4 << 20;
        c.engine.report_interval = Duration::from_secs(3600);
    })
    .await;
    h.agent("n1").report().await;
    let nodes_before = serde_json::to_value(h.nodes().await).unwrap();
    let events_before = h.events().await.len();

    let with = |change: &dyn Fn(&mut Value)| {
        let mut report = report_json("n2");
        change(&mut report);
        report
    };
    let evidence = |items: usize| {
        let mut result = command_result("c1", "", Vec::new());
        let item = json!({ "name": "kernel-log", "source": "/dev/kmsg", "encoding": "text",
            "content": "", "bytes": 0, "truncated": false, "took_ms": 1 });
        result["evidence"] = json!({ "node": "n2", "boot_id": "b1", "collected_at_ms": 1,
            "took_ms": 1, "items": vec![item; items] });
        result
    };
    let cases: Vec<(&str, Value)> = vec![
        (
            "findings[0].labels: 30000 labels is more than 64",
            with(&|r| r["findings"][0] = finding(30_000)),
        ),
        (
            "findings[0].labels.k00000: 1025 bytes is more than 1024",
            with(&|r| {
                r["findings"][0]["labels"]["k00000"] = json!(text(MAX_LABEL_VALUE_BYTES + 1))
            }),
        ),
        (
            "findings[0].labels key",
            with(&|r| r["findings"][0]["labels"][text(MAX_LABEL_KEY_BYTES + 1)] = json!("v")),
        ),
        (
            "findings[0].message: 16385 bytes is more than 16384",
            with(&|r| r["findings"][0]["message"] = json!(text(MAX_MESSAGE_BYTES + 1))),
        ),
        (
            "findings[0].check: 129 bytes is more than 128",
            with(&|r| r["findings"][0]["check"] = json!(text(MAX_NAME_BYTES + 1))),
        ),
        (
            "findings[0].finding: 129 bytes is more than 128",
            with(&|r| r["findings"][0]["finding"] = json!(text(MAX_NAME_BYTES + 1))),
        ),
        (
            "findings[0].subject: 4097 bytes is more than 4096",
            with(&|r| r["findings"][0]["subject"] = json!(text(MAX_SUBJECT_BYTES + 1))),
        ),
        (
            "findings: 10001 findings is more than 10000",
            with(&|r| r["findings"] = json!(vec![finding(0); MAX_FINDINGS + 1])),
        ),
        (
            "checks: 257 checks is more than 256",
            with(&|r| r["checks"] = json!(vec![check_run("gpu"); MAX_CHECKS + 1])),
        ),
        (
            "checks[0].check: 129 bytes",
            with(&|r| r["checks"] = json!([check_run(&text(MAX_NAME_BYTES + 1))])),
        ),
        (
            "ranks: 4097 ranks is more than 4096",
            with(&|r| r["ranks"] = json!(vec![rank("j-1", ""); MAX_RANKS + 1])),
        ),
        (
            "ranks[0].job: 257 bytes",
            with(&|r| r["ranks"] = json!([rank(&text(MAX_ID_BYTES + 1), "")])),
        ),
        (
            "ranks[0].message: 16385 bytes",
            with(&|r| r["ranks"] = json!([rank("j-1", &text(MAX_MESSAGE_BYTES + 1))])),
        ),
        (
            "command_results: 1025 command results is more than 1024",
            with(&|r| {
                r["command_results"] =
                    json!(vec![command_result("c1", "", Vec::new()); MAX_COMMAND_RESULTS + 1])
            }),
        ),
        (
            "command_results[0].message: 16385 bytes",
            with(&|r| {
                r["command_results"] =
                    json!([command_result("c1", &text(MAX_MESSAGE_BYTES + 1), Vec::new())])
            }),
        ),
        (
            "command_results[0].findings[1].labels: 65 labels is more than 64",
            with(&|r| {
                r["command_results"] =
                    json!([command_result("c1", "", vec![finding(1), finding(MAX_LABELS + 1)])])
            }),
        ),
        (
            "command_results[0].evidence.items: 257 items is more than 256",
            with(&|r| r["command_results"] = json!([evidence(MAX_EVIDENCE_ITEMS + 1)])),
        ),
        ("address: 256 bytes", with(&|r| r["address"] = json!(text(MAX_ADDRESS_BYTES + 1)))),
        ("boot_id: 257 bytes", with(&|r| r["boot_id"] = json!(text(MAX_ID_BYTES + 1)))),
        ("agent_version: 257 bytes", with(&|r| r["agent_version"] = json!(text(MAX_ID_BYTES + 1)))),
    ];
    for (want, body) in &cases {
        let request = h.client.post(h.url("/v1/reports")).json(body);
        let (status, error, _) = json_error(request).await;
        assert_eq!(status, 400, "{want}: {error}");
        assert!(error.starts_with(want), "{error:?} does not start with {want:?}");
    }

    let text = h.metrics().await;
    assert_eq!(reports_counter(&text, "malformed"), Some(cases.len() as f64), "{text}");
    assert_eq!(reports_counter(&text, "ok"), Some(1.0), "{text}");
    assert_eq!(serde_json::to_value(h.nodes().await).unwrap(), nodes_before);
    assert_eq!(h.events().await.len(), events_before, "a refused report records nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_just_inside_every_bound_is_taken() {
    let h = Harness::start(|c| {
        c.max_body_bytes = 16 << 20;
        c.engine.report_interval = Duration::from_secs(3600);
    })
    .await;
    let name = text(MAX_NAME_BYTES);
    let mut big = finding(MAX_LABELS - 1);
    big["labels"][text(MAX_LABEL_KEY_BYTES)] = json!(text(MAX_LABEL_VALUE_BYTES));
    big["check"] = json!(name);
    big["finding"] = json!(name);
    big["subject"] = json!(text(MAX_SUBJECT_BYTES));
    big["message"] = json!(text(MAX_MESSAGE_BYTES));
    let mut findings = vec![big];
    findings.extend((1..MAX_FINDINGS).map(|i| {
        let mut small = finding(0);
        small["subject"] = json!(i.to_string());
        small
    }));
    let mut report = report_json("n1");
    report["boot_id"] = json!(text(MAX_ID_BYTES));
    report["agent_version"] = json!(text(MAX_ID_BYTES));
    report["address"] = json!(text(MAX_ADDRESS_BYTES));
    report["checks"] = json!(vec![check_run(&name); MAX_CHECKS]);
    report["findings"] = json!(findings);
    // The first of each list carries the long strings: the body stays a few MB.
    let mut ranks = vec![rank(&text(MAX_ID_BYTES), &text(MAX_MESSAGE_BYTES))];
    ranks.extend(std::iter::repeat_n(rank("j-1", ""), MAX_RANKS - 1));
    report["ranks"] = json!(ranks);
    let mut results =
        vec![command_result(&text(MAX_ID_BYTES), &text(MAX_MESSAGE_BYTES), Vec::new())];
    results
        .extend(std::iter::repeat_n(command_result("c1", "", Vec::new()), MAX_COMMAND_RESULTS - 1));
    report["command_results"] = json!(results);

    let response = h.client.post(h.url("/v1/reports")).json(&report).send().await.unwrap();
    let status = response.status().as_u16();
    assert_eq!(status, 200, "{}", response.text().await.unwrap());
    let node: Value = h.get_json("/v1/nodes/n1").await;
    let shown = node.to_string();
    assert!(shown.contains(&text(MAX_MESSAGE_BYTES)), "the longest message is kept whole");
    let summary = h.nodes().await.into_iter().find(|n| n.name == "n1").unwrap();
    assert_eq!(summary.failing, MAX_FINDINGS, "every finding is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_refusals_are_json_errors_with_their_status() {
    let h = Harness::start(|c| c.engine.report_interval = Duration::from_secs(3600)).await;
    h.agent("n1").report().await;
    let get = |path: &str| h.client.get(h.url(path));
    let post = |path: &str| h.client.post(h.url(path));

    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        ("a query value that is no number", get("/v1/events?limit=abc"), 400, "limit"),
        ("a negative limit", get("/v1/events?limit=-1"), 400, "limit"),
        ("a query of the evidence route", get("/v1/nodes/n1/evidence?limit=x"), 400, "limit"),
        ("a limit out of range", get("/v1/nodes/n1/evidence?limit=0"), 400, "limit"),
        (
            "a repeated query parameter",
            post("/v1/alerts/alertmanager?token=a&token=b").json(&json!({})),
            400,
            "token",
        ),
        ("a path parameter that is not UTF-8", get("/v1/nodes/%FF"), 400, "UTF-8"),
        ("an unknown route", get("/v1/nope"), 404, "no route for GET /v1/nope"),
        ("an unknown route, posted", post("/nope").json(&json!({})), 404, "POST /nope"),
        ("a wrong method", post("/v1/nodes").json(&json!({})), 405, "/v1/nodes does not take POST"),
        (
            "a wrong method on a route with a parameter",
            h.client.delete(h.url("/v1/jobs/j-1")),
            405,
            "DELETE",
        ),
        (
            "a report that is no JSON",
            post("/v1/reports").body("{not json"),
            400,
            "malformed report",
        ),
        (
            "a report of the wrong shape",
            post("/v1/reports").json(&json!({ "node": 5 })),
            400,
            "malformed report",
        ),
        (
            "a report sent as text",
            post("/v1/reports").header("content-type", "text/plain").body("wire_version=1"),
            415,
            "Content-Type: application/json",
        ),
        (
            "a repair sent as a form",
            post("/v1/nodes/n1/repair")
                .header("content-type", "application/x-www-form-urlencoded")
                .body("action=reboot"),
            415,
            "not \"application/x-www-form-urlencoded\"",
        ),
        (
            "a repair with a body of the wrong shape",
            post("/v1/nodes/n1/repair").json(&json!({ "action": 5 })),
            400,
            "action",
        ),
    ];
    for (name, request, want_status, want_error) in cases {
        let (status, error, headers) = json_error(request).await;
        assert_eq!(status, want_status, "{name}: {error}");
        assert!(error.contains(want_error), "{name}: {error:?} does not name {want_error:?}");
        if status == 405 {
            assert!(headers.contains_key("allow"), "{name}: a 405 says what is allowed");
        }
    }
    // A wrong method on a route that takes GET and POST names both.
    let (_, _, headers) = json_error(h.client.delete(h.url("/v1/jobs"))).await;
    let allow = headers["allow"].to_str().unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
}

/// A repairer with the embedded queue, and one agent heartbeating into it.
async fn queue_with_an_agent()
-> (service::Repairer, reqwest::Client, String, Agent, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.scheduler = SchedulerKind::Embedded;
    config.engine.report_interval = Duration::from_secs(1);
    config.queue.tick = Duration::from_millis(50);
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
    let agent = Agent::connect("n1", &base, None, provider);
    agent.set_address("10.0.0.1");
    agent.report().await;
    agent.start_heartbeat();
    (repairer, http_client(), base, agent, dir)
}

fn job_spec() -> Value {
    json!({ "argv": ["fleetmend", "train"], "nodes": 1, "checkpoint_dir": "/shared/ckpt/t" })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_submissions_and_progress_are_bounded() {
    let (_repairer, client, base, agent, _dir) = queue_with_an_agent().await;
    let submit = async |spec: &Value| {
        let response = client.post(format!("{base}/v1/jobs")).json(spec).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    };
    let jobs_before = client.get(format!("{base}/v1/jobs")).send().await.unwrap().text().await;
    let jobs_before = jobs_before.unwrap();

    let with = |change: &dyn Fn(&mut Value)| {
        let mut spec = job_spec();
        change(&mut spec);
        spec
    };
    let env = |n: usize| -> serde_json::Map<String, Value> {
        (0..n).map(|i| (format!("V{i}"), json!("1"))).collect()
    };
    let refused = [
        (
            "argv: 1025 arguments is more than 1024",
            with(&|s| s["argv"] = json!(vec!["a"; MAX_ARGS + 1])),
        ),
        (
            "argv[1]: 131073 bytes is more than 131072",
            with(&|s| s["argv"] = json!(["fleetmend", text(MAX_ARG_BYTES + 1)])),
        ),
        ("env: 257 variables is more than 256", with(&|s| s["env"] = json!(env(MAX_ENV + 1)))),
        ("env.V: 131073 bytes", with(&|s| s["env"] = json!({ "V": text(MAX_ARG_BYTES - 1) }))),
        (
            "checkpoint_dir: 4097 bytes",
            with(&|s| s["checkpoint_dir"] = json!(format!("/{}", text(4096)))),
        ),
    ];
    for (want, spec) in &refused {
        let (status, body) = submit(spec).await;
        assert_eq!(status, 400, "{want}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(want), "{error:?} does not name {want:?}");
    }
    let jobs_after = client.get(format!("{base}/v1/jobs")).send().await.unwrap().text().await;
    assert_eq!(jobs_after.unwrap(), jobs_before, "a refused job is not queued");

    // Just inside every bound: taken.
    let mut argv = vec![json!("fleetmend"); MAX_ARGS - 1];
    argv.push(json!(text(MAX_ARG_BYTES)));
    let mut inside = with(&|s| s["env"] = json!(env(MAX_ENV)));
    inside["argv"] = json!(argv);
    inside["env"]["V0"] = json!(text(MAX_ARG_BYTES - "V0=".len()));
    inside["checkpoint_dir"] = json!(format!("/{}", text(4095)));
    let (status, job) = submit(&inside).await;
    assert_eq!(status, 201, "{job}");
    let job = job["id"].as_str().unwrap().to_owned();

    // Its rank's progress: a list of ranks waited for past the largest job is refused.
    let deadline = Instant::now() + DEADLINE;
    let run = loop {
        if let Some(run) = agent.run_ranks().into_iter().find(|r| r.key.job == job) {
            break run;
        }
        assert!(Instant::now() < deadline, "the job's rank never started");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let progress = |waiting_for: u32| {
        json!({ "job": job, "attempt": run.key.attempt, "rank": run.key.rank, "step": 3,
            "loss": 1.0, "samples_per_second": 1.0, "waiting_for": (0..waiting_for).collect::<Vec<_>>(),
            "at_ms": 1 })
    };
    let post_progress = |body: Value| {
        client
            .post(&run.env[PROGRESS_URL_VAR])
            .bearer_auth(&run.env[PROGRESS_TOKEN_VAR])
            .json(&body)
    };
    let (status, error, _) = json_error(post_progress(progress(MAX_JOB_RANKS + 1))).await;
    assert_eq!(status, 400, "{error}");
    assert!(error.contains("waiting_for: 100001 ranks is more than 100000"), "{error}");
    let shown: Value =
        client.get(format!("{base}/v1/jobs/{job}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(shown["step"], Value::Null, "refused progress changes nothing");
    let response = post_progress(progress(MAX_JOB_RANKS)).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200, "{}", response.text().await.unwrap());
}
