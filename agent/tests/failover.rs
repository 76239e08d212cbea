//! The agent daemon with several repairers, all real HTTP servers on loopback: a closed port is
//! skipped, a standby's 503 naming a configured leader is followed at once (past a failing
//! repairer in between), a leader outside the list is not, and a repairer that takes the reports is
//! kept. No wait comes between the repairers of one round: the backoff here is far longer than the
//! time each test allows for the startup report to land.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use fleetmend_agent::config::{AgentConfig, HostPaths};
use fleetmend_agent::daemon::{self, RunningAgent};
use fleetmend_agent::gpu::GpuBackendSpec;
use fleetmend_proto::{Report, ReportReply, ReportTrigger};
use support::fixture;

/// How long any one condition in these tests may take to come true.
const WITHIN: Duration = Duration::from_secs(10);

/// What a stand-in repairer does with a report.
#[derive(Clone)]
enum Answer {
    Accept,
    /// 503 with `Retry-After` and `Fleetmend-Leader: <url>`.
    Standby(String),
    /// 500.
    Fail,
}

/// A stand-in repairer on loopback that keeps every report it gets.
#[derive(Clone)]
struct Repairer {
    url: String,
    reports: Arc<Mutex<Vec<Report>>>,
}

impl Repairer {
    async fn start(answer: Answer) -> Repairer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let reports = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/reports", post(receive))
            .with_state((answer, Arc::clone(&reports)));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Repairer { url, reports }
    }

    fn reports(&self) -> Vec<Report> {
        self.reports.lock().unwrap().clone()
    }
}

async fn receive(
    State((answer, reports)): State<(Answer, Arc<Mutex<Vec<Report>>>)>,
    Json(report): Json<Report>,
) -> axum::response::Response {
    reports.lock().unwrap().push(report);
    match answer {
        Answer::Accept => Json(ReportReply::default()).into_response(),
        Answer::Fail => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Answer::Standby(leader) => {
            let mut headers = HeaderMap::new();
            headers.insert("retry-after", HeaderValue::from_static("30"));
            headers.insert("fleetmend-leader", HeaderValue::from_str(&leader).unwrap());
            let body = serde_json::json!({
                "error": format!("this repairer is a standby; the leader is {leader}"),
                "leader": leader,
            });
            (StatusCode::SERVICE_UNAVAILABLE, headers, Json(body)).into_response()
        }
    }
}

/// A URL nothing listens on.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// The agent daemon on the healthy fixture reporting to `urls` every 100 ms, with a backoff far
/// longer than [`WITHIN`].
async fn agent(urls: &[&str]) -> RunningAgent {
    let case = fixture("healthy");
    let base = std::fs::read_to_string(case.join("agent.toml")).unwrap();
    let list = urls.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>().join(", ");
    let text = format!(
        "{base}\n[report]\nrepairer = [{list}]\ninterval = \"100ms\"\ntimeout = \"2s\"\n\
         backoff_initial = \"30s\"\nbackoff_max = \"60s\"\n"
    );
    let mut config = AgentConfig::parse(&text).unwrap();
    config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    config.node = Some("failover-node".to_owned());
    config.paths = HostPaths::tree(&case);
    config.checks.gpu.backend = GpuBackendSpec::Fixture(case.join("gpu.json"));
    assert!(config.validate().is_empty(), "{}", config.validate());
    daemon::start(config).await.unwrap()
}

/// Polls `cond` every 10 ms until it holds or [`WITHIN`] passes.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reports_skip_a_dead_repairer_and_follow_a_standby_to_the_leader() {
    let leader = Repairer::start(Answer::Accept).await;
    let standby = Repairer::start(Answer::Standby(format!("{}/", leader.url))).await;
    let failing = Repairer::start(Answer::Fail).await;
    let dead = closed_port();
    let mut agent = agent(&[&dead, &standby.url, &failing.url, &leader.url]).await;

    // The startup report lands at the leader within one round: no backoff on the way.
    assert!(eventually(|| leader.reports().len() >= 5).await, "{:?}", agent.state.repairer());
    let landed = leader.reports();
    assert_eq!(landed[0].trigger, ReportTrigger::Startup);
    // The standby was asked once; the failing repairer was skipped for the named leader.
    assert_eq!(standby.reports().len(), 1);
    assert_eq!(standby.reports()[0].trigger, ReportTrigger::Startup);
    assert!(failing.reports().is_empty());
    // Every later report went to the leader, one after another.
    let seqs: Vec<u64> = landed.iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let (current, switches) = agent.state.repairer();
    assert_eq!(current.as_deref(), Some(leader.url.as_str()));
    assert_eq!(switches, 2, "dead → standby → leader");
    let metrics = fleetmend_agent::metrics::encode(&agent.state.samples());
    assert!(metrics.contains("fleetmend_agent_repairer_switches_total 2"), "{metrics}");
    let info = format!("fleetmend_agent_repairer_info{{url=\"{}\"}} 1", leader.url);
    assert!(metrics.contains(&info), "{metrics}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_outside_the_list_is_not_followed() {
    let outsider = Repairer::start(Answer::Accept).await;
    let standby = Repairer::start(Answer::Standby(outsider.url.clone())).await;
    let second = Repairer::start(Answer::Accept).await;
    let mut agent = agent(&[&standby.url, &second.url]).await;

    assert!(eventually(|| second.reports().len() >= 5).await, "{:?}", agent.state.repairer());
    assert_eq!(second.reports()[0].trigger, ReportTrigger::Startup);
    assert!(outsider.reports().is_empty(), "the token went to a repairer not configured");
    assert_eq!(standby.reports().len(), 1);
    assert_eq!(agent.state.repairer(), (Some(second.url.clone()), 1));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repairer_that_takes_the_reports_is_kept() {
    let first = Repairer::start(Answer::Accept).await;
    let second = Repairer::start(Answer::Accept).await;
    let mut agent = agent(&[&first.url, &second.url]).await;

    assert!(eventually(|| first.reports().len() >= 10).await);
    assert!(second.reports().is_empty(), "no round-robin while healthy");
    assert_eq!(agent.state.repairer(), (Some(first.url.clone()), 0));
    agent.stop().await;
}
