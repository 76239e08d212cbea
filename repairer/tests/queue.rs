//! The embedded job queue end to end: a repairer started in-process with `scheduler =
//! "embedded"` on its own runtime (so a restart ends every task of the old one, as a crash
//! would), scripted agents that run ranks as `run-rank` tells them, answer `signal-rank`, and
//! report their ranks over real HTTP; progress posted to the queue as a trainer would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetmend_proto::{Progress, ProgressReply, RankSignal, RunRank};
use fleetmend_repairer::config::{RepairerConfig, SchedulerKind};
use fleetmend_repairer::model::{Event, EventKind, Severity};
use fleetmend_repairer::provider::{FakeProvider, Provider};
use fleetmend_repairer::queue::{JobState, JobView};
use fleetmend_repairer::scheduler::{DRAIN_REASON_PREFIX, Scheduler, UndrainOutcome};
use fleetmend_repairer::service::{self, Repairer, ServiceError};
use fleetmend_runtime::checkpoint::ProtocolEnv;
use support::{Agent, DEADLINE, Expect, assert_in_order, describe, http_client, test_config};

/// A repairer running the embedded queue on a runtime of its own.
struct Cluster {
    runtime: Option<tokio::runtime::Runtime>,
    repairer: Repairer,
    config: RepairerConfig,
    provider: Arc<FakeProvider>,
    client: reqwest::Client,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn boot(
    config: &RepairerConfig,
    provider: &Arc<FakeProvider>,
) -> (tokio::runtime::Runtime, Repairer) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (config, provider) = (config.clone(), provider.clone());
        let started = runtime
            .spawn(async move {
                service::start_with(
                    config,
                    None,
                    Some(provider as Arc<dyn Provider>),
                    std::future::pending::<()>(),
                )
                .await
            })
            .await
            .unwrap();
        match started {
            Ok(repairer) => return (runtime, repairer),
            // The old process's port may take a moment to be free again.
            Err(ServiceError::Listen { .. }) if Instant::now() < deadline => {
                runtime.shutdown_background();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("starting the repairer: {err}"),
        }
    }
}

impl Cluster {
    async fn start(adjust: impl FnOnce(&mut RepairerConfig)) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path());
        config.scheduler = SchedulerKind::Embedded;
        // Nodes heartbeat every 50 ms: a wide unreachable window keeps a loaded machine from
        // making them look silent (which would stop the jobs on them, as it should).
        config.engine.report_interval = Duration::from_secs(1);
        config.queue.tick = Duration::from_millis(50);
        config.queue.start_timeout = Duration::from_secs(10);
        config.queue.checkpoint_grace = Duration::from_millis(300);
        config.queue.stop_grace = Duration::from_secs(2);
        adjust(&mut config);
        let problems = config.problems();
        assert!(problems.is_empty(), "{problems:?}");
        let provider = Arc::new(FakeProvider::new());
        let (runtime, repairer) = boot(&config, &provider).await;
        let base = format!("http://{}", repairer.local_addr);
        Cluster {
            runtime: Some(runtime),
            repairer,
            config,
            provider,
            client: http_client(),
            base,
            _dir: dir,
        }
    }

    /// Stops the repairer as a crash would (every task of its runtime ends) and starts a new one
    /// on the same store and port.
    async fn restart(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        self.config.listen = self.repairer.local_addr;
        let (runtime, repairer) = boot(&self.config, &self.provider).await;
        self.runtime = Some(runtime);
        self.repairer = repairer;
        // Pooled keep-alive connections went to the crashed server: a request on one of them
        // fails with an incomplete message. Connect afresh, as a new client would.
        self.client = http_client();
    }

    /// Agents for `names`, each reporting `10.0.0.<i>` as its address, then heartbeating.
    async fn fleet(&self, names: &[&str]) -> Vec<Agent> {
        let mut agents = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let agent = Agent::connect(name, &self.base, None, self.provider.clone());
            agent.set_address(&format!("10.0.0.{}", i + 1));
            agent.report().await;
            agent.start_heartbeat();
            agents.push(agent);
        }
        agents
    }

    async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let response = self.client.post(format!("{}{path}", self.base)).json(&body).send().await;
        let response = response.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
    }

    async fn submit(&self, spec: serde_json::Value) -> String {
        let (status, body) = self.post("/v1/jobs", spec).await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    async fn job(&self, id: &str) -> JobView {
        let response = self.client.get(format!("{}/v1/jobs/{id}", self.base)).send().await;
        let text = response.unwrap().text().await.unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    async fn events(&self) -> Vec<Event> {
        let url = format!("{}/v1/events?limit=10000", self.base);
        self.client.get(url).send().await.unwrap().json().await.unwrap()
    }

    /// Waits until `probe` answers `Some`, or fails naming `what` with the event log.
    async fn eventually<T>(&self, what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; events:\n{}", describe(&self.events().await));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn wait_job(&self, id: &str, what: &str, test: impl Fn(&JobView) -> bool) -> JobView {
        self.eventually(&format!("job {id}: {what}"), async || {
            let job = self.job(id).await;
            test(&job).then_some(job)
        })
        .await
    }

    async fn wait_state(&self, id: &str, state: JobState, attempt: u32) -> JobView {
        self.wait_job(id, &format!("{state} in attempt {attempt}"), |j| {
            j.job.state == state && j.job.attempt == attempt
        })
        .await
    }
}

fn spec(name: &str, nodes: u32, priority: i32, max_restarts: u32) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "argv": ["fleetmend", "train", "--steps", "100"],
        "nodes": nodes,
        "priority": priority,
        "checkpoint_dir": format!("/shared/ckpt/{name}"),
        "max_restarts": max_restarts,
        "env": { "TRAIN_SEED": "7" },
    })
}

/// The `run-rank` of `job`'s `attempt` each agent got (one agent per rank, in rank order).
fn runs_of(agents: &[Agent], job: &str, attempt: u32) -> Vec<(String, RunRank)> {
    let mut runs: Vec<(String, RunRank)> = agents
        .iter()
        .flat_map(|a| {
            a.run_ranks()
                .into_iter()
                .filter(|r| r.key.job == job && r.key.attempt == attempt)
                .map(|r| (a.node().to_owned(), r))
                .collect::<Vec<_>>()
        })
        .collect();
    runs.sort_by_key(|(_, r)| r.key.rank);
    runs
}

fn progress(run: &RunRank, step: u64, start_step: u64, checkpoint_step: Option<u64>) -> Progress {
    Progress {
        job: run.key.job.clone(),
        attempt: run.key.attempt,
        rank: run.key.rank,
        step,
        start_step,
        loss: 5.0 - step as f64 / 100.0,
        samples_per_second: 100.0,
        checkpoint_step,
        checkpoint_write_seconds: checkpoint_step.map(|_| 0.5),
        checkpoint_stall_seconds: None,
        step_seconds: None,
        waiting_for: Vec::new(),
        at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    }
}

/// Posts `progress` where the rank's env says, with the token it says (or `token`).
async fn post_progress(
    client: &reqwest::Client,
    run: &RunRank,
    progress: &Progress,
    token: Option<&str>,
) -> (u16, Option<ProgressReply>) {
    let url = &run.env[fleetmend_proto::jobs::PROGRESS_URL_VAR];
    let token = token.unwrap_or(&run.env[fleetmend_proto::jobs::PROGRESS_TOKEN_VAR]);
    let response = client.post(url).bearer_auth(token).json(progress).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.ok())
}

fn job_event(kind: EventKind, job: &str) -> Expect {
    Expect::kind(kind).reason(&format!("job {job} "))
}

/// Every agent's signals to `job`'s `attempt`.
fn signals_of(agents: &[Agent], job: &str, attempt: u32) -> Vec<(String, u32, RankSignal)> {
    agents
        .iter()
        .flat_map(|a| {
            a.signals()
                .into_iter()
                .filter(|s| s.key.job == job && s.key.attempt == attempt)
                .map(|s| (a.node().to_owned(), s.key.rank, s.signal))
                .collect::<Vec<_>>()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_by_priority_on_four_nodes_run_one_after_the_other_with_the_protocol_env() {
    let c = Cluster::start(|_| {}).await;
    // Both wait for nodes: the higher priority goes first although submitted second.
    let low = c.submit(spec("low", 3, 0, 0)).await;
    let high = c.submit(spec("high", 3, 5, 0)).await;
    let agents = c.fleet(&["n1", "n2", "n3", "n4"]).await;

    let running = c.wait_state(&high, JobState::Running, 0).await;
    assert_eq!(running.job.nodes, ["n1", "n2", "n3"]);
    let waiting = c.job(&low).await;
    assert_eq!(waiting.job.state, JobState::Queued);
    assert_eq!(waiting.job.reason, "waits for 3 eligible node(s): 1 free");

    // Every rank got the checkpoint protocol's environment, readable by the runtime.
    let runs = runs_of(&agents, &high, 0);
    assert_eq!(runs.len(), 3);
    let port = running.job.master_port.unwrap();
    for (i, (node, run)) in runs.iter().enumerate() {
        assert_eq!(node, &format!("n{}", i + 1));
        assert_eq!(run.argv, ["fleetmend", "train", "--steps", "100"]);
        let env = ProtocolEnv::from_lookup(|var| run.env.get(var).cloned()).unwrap();
        assert_eq!(env.rank, i as u32);
        assert_eq!(env.world_size, 3);
        assert_eq!(env.local_rank, 0);
        assert_eq!(env.master_addr, "10.0.0.1", "rank 0's node's address");
        assert_eq!(env.master_port, port);
        assert_eq!(env.job_id, high);
        assert_eq!(env.checkpoint_dir, std::path::Path::new("/shared/ckpt/high"));
        assert_eq!(env.restart_count, 0);
        assert_eq!(run.env["TRAIN_SEED"], "7");
        assert_eq!(
            run.env[fleetmend_proto::jobs::PROGRESS_URL_VAR],
            format!("{}/v1/jobs/{high}/progress", c.base)
        );
        assert!(run.env[fleetmend_proto::jobs::PROGRESS_TOKEN_VAR].len() >= 32);
    }
    // The API never shows the token.
    assert!(running.job.progress_token.is_empty());

    // Two ranks exit 0 before the third: the job holds its whole allocation until it ends, so
    // the low one does not start on the two nodes they left.
    for agent in &agents[..2] {
        agent.exit_ranks(&high, 0);
    }
    c.wait_job(&high, "ranks 0 and 1 seen exited", |j| {
        j.job.ranks.iter().filter(|r| r.succeeded()).count() == 2
    })
    .await;
    let window = Instant::now() + c.config.queue.tick * 10;
    while Instant::now() < window {
        let low_now = c.job(&low).await;
        assert_eq!(low_now.job.state, JobState::Queued, "started on a running job's nodes");
        tokio::time::sleep(c.config.queue.tick).await;
    }
    // The last rank exits 0: completed, and the low one gets its nodes.
    agents[2].exit_ranks(&high, 0);
    let done = c.wait_state(&high, JobState::Completed, 0).await;
    assert_eq!(done.job.restarts, 0);
    let low_running = c.wait_state(&low, JobState::Running, 0).await;
    assert_eq!(low_running.job.nodes.len(), 3);
    for agent in &agents {
        agent.exit_ranks(&low, 0);
    }
    c.wait_state(&low, JobState::Completed, 0).await;

    let events = c.events().await;
    assert_in_order(
        &events,
        &[
            job_event(EventKind::JobSubmitted, &low),
            job_event(EventKind::JobSubmitted, &high),
            job_event(EventKind::JobStarted, &high),
            job_event(EventKind::JobCompleted, &high),
            job_event(EventKind::JobStarted, &low),
            job_event(EventKind::JobCompleted, &low),
        ],
    );
    assert!(!events.iter().any(|e| e.kind == EventKind::JobRankFailed), "{}", describe(&events));
    let metrics = c.client.get(format!("{}/metrics", c.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("fleetmend_jobs{state=\"completed\"} 2"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_node_checkpoints_stops_requeues_at_the_front_and_resumes_on_healthy_nodes() {
    // A long checkpoint grace: SIGTERM must follow the newer checkpoint, not the clock.
    let c = Cluster::start(|config| config.queue.checkpoint_grace = Duration::from_secs(60)).await;
    let agents = c.fleet(&["n1", "n2", "n3", "n4", "n5"]).await;
    let job = c.submit(spec("big", 4, 0, 3)).await;
    c.wait_state(&job, JobState::Running, 0).await;
    let next = c.submit(spec("next", 4, 0, 0)).await;
    let runs = runs_of(&agents, &job, 0);
    for (_, run) in &runs {
        let (status, _) = post_progress(&c.client, run, &progress(run, 10, 0, Some(5)), None).await;
        assert_eq!(status, 200);
    }

    // A person drains n2 under the running job. The drain only takes n2 out of placement; the
    // repair workflow asks the job for a checkpoint (SIGUSR1) and requeues it, and the requeue
    // stops it once that checkpoint is written (SIGTERM).
    let (status, body) = c.post("/v1/nodes/n2/drain", serde_json::json!({})).await;
    assert_eq!(status, 200, "{body}");
    c.wait_job(&job, "stopping", |j| j.job.state == JobState::Stopping).await;
    let usr1 = c
        .eventually("SIGUSR1 to every rank", async || {
            let usr1: Vec<_> = signals_of(&agents, &job, 0)
                .into_iter()
                .filter(|(_, _, s)| *s == RankSignal::Usr1)
                .collect();
            (usr1.len() == 4).then_some(usr1)
        })
        .await;
    assert!(usr1.iter().any(|(node, rank, _)| node == "n2" && *rank == 1), "{usr1:?}");
    assert!(
        !signals_of(&agents, &job, 0).iter().any(|(_, _, s)| *s == RankSignal::Term),
        "no SIGTERM before the checkpoint"
    );
    // The ranks write the checkpoint: rank 0 reports step 14, checkpoint 12.
    post_progress(&c.client, &runs[0].1, &progress(&runs[0].1, 14, 0, Some(12)), None).await;

    // SIGTERM, the ranks exit 0, the job is requeued and restarts on the healthy nodes.
    let restarted = c.wait_state(&job, JobState::Running, 1).await;
    assert_eq!(restarted.job.nodes, ["n1", "n3", "n4", "n5"]);
    assert_eq!(restarted.job.restarts, 1);
    let terms: Vec<_> = signals_of(&agents, &job, 0)
        .into_iter()
        .filter(|(_, _, s)| *s == RankSignal::Term)
        .collect();
    assert_eq!(terms.len(), 4, "{terms:?}");
    // Requeued at the front: the job queued behind it still waits.
    assert_eq!(c.job(&next).await.job.state, JobState::Queued);
    let runs = runs_of(&agents, &job, 1);
    assert_eq!(runs.len(), 4);
    for (_, run) in &runs {
        assert_eq!(run.env["FLEETMEND_RESTART_COUNT"], "1");
        assert_eq!(run.env["MASTER_ADDR"], "10.0.0.1");
        assert_eq!(run.env["WORLD_SIZE"], "4");
    }
    assert!(runs.iter().all(|(node, _)| node != "n2"));

    // It resumes from step 12: two steps lost, a resume time measured.
    let (status, _) =
        post_progress(&c.client, &runs[0].1, &progress(&runs[0].1, 13, 12, None), None).await;
    assert_eq!(status, 200);
    let resumed = c
        .wait_job(&job, "the resume measured", |j| {
            j.job.history.get(1).is_some_and(|a| a.resume_seconds.is_some())
        })
        .await;
    assert_eq!(resumed.job.history[1].steps_lost, Some(2));
    assert_eq!(resumed.job.history[1].resumed_from_step, Some(12));
    assert_eq!(resumed.job.goodput.steps_lost_total, 2);
    assert!(resumed.job.history[0].failed);
    assert!(resumed.job.history[0].end_reason.as_deref().unwrap().contains("n2"));

    // The queue holds n2 as drained by fleetmend; fleetmend may undrain it.
    let queue = c.repairer.queue.clone().unwrap();
    assert!(queue.drained()["n2"].reason.starts_with(DRAIN_REASON_PREFIX));

    for agent in &agents {
        agent.exit_ranks(&job, 0);
    }
    c.wait_state(&job, JobState::Completed, 1).await;
    c.wait_state(&next, JobState::Running, 0).await;
    let events = c.events().await;
    assert_in_order(
        &events,
        &[
            job_event(EventKind::JobStarted, &job),
            job_event(EventKind::JobCheckpointRequested, &job).reason("the repairer asked"),
            job_event(EventKind::JobStopping, &job).reason("rank 1 on n2 (drained"),
            job_event(EventKind::JobStopping, &job).reason("checkpoint step 12 written"),
            job_event(EventKind::JobRequeued, &job),
            job_event(EventKind::JobStarted, &job).reason("attempt 1"),
            job_event(EventKind::JobCompleted, &job),
            job_event(EventKind::JobStarted, &next),
        ],
    );
    let metrics = c.client.get(format!("{}/metrics", c.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains(&format!("fleetmend_job_restarts_total{{job=\"{job}\"}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("fleetmend_job_steps_lost_total{{job=\"{job}\"}} 2")),
        "{metrics}"
    );
    assert!(metrics.contains("fleetmend_job_resume_seconds_count 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_rank_restarts_the_job_until_its_restarts_run_out() {
    let c = Cluster::start(|_| {}).await;
    let agents = c.fleet(&["n1", "n2"]).await;
    let job = c.submit(spec("flaky", 2, 0, 1)).await;
    c.wait_state(&job, JobState::Running, 0).await;

    // Rank 1 exits 3: the other rank is asked to checkpoint, then stopped; the job restarts.
    agents[1].exit_ranks(&job, 3);
    let again = c.wait_state(&job, JobState::Running, 1).await;
    assert_eq!(again.job.restarts, 1);
    assert!(again.job.history[0].end_reason.as_deref().unwrap().contains("exited with status 3"));
    let signals = signals_of(&agents, &job, 0);
    assert_eq!(
        signals,
        [("n1".to_owned(), 0, RankSignal::Usr1), ("n1".to_owned(), 0, RankSignal::Term)],
        "only the live rank is signalled, USR1 then TERM after checkpoint_grace"
    );
    let runs = runs_of(&agents, &job, 1);
    assert!(runs.iter().all(|(_, r)| r.env["FLEETMEND_RESTART_COUNT"] == "1"));

    // It fails again: no restart left.
    agents[0].exit_ranks(&job, 4);
    let failed = c.wait_state(&job, JobState::Failed, 1).await;
    assert!(failed.job.reason.contains("restarts exhausted"), "{}", failed.job.reason);
    assert!(
        failed.job.reason.contains("rank 0 on n1 exited with status 4"),
        "{}",
        failed.job.reason
    );
    assert!(failed.job.finished_ms.is_some());
    let events = c.events().await;
    assert_in_order(
        &events,
        &[
            job_event(EventKind::JobRankFailed, &job).node("n2").reason("exited with status 3"),
            job_event(EventKind::JobRequeued, &job),
            job_event(EventKind::JobRankFailed, &job).node("n1").reason("exited with status 4"),
            job_event(EventKind::JobFailed, &job).reason("restarts exhausted"),
        ],
    );
    assert_eq!(c.job(&job).await.job.attempt, 1, "no third attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repairer_restart_keeps_the_job_and_its_running_ranks() {
    let mut c = Cluster::start(|_| {}).await;
    let agents = c.fleet(&["n1", "n2"]).await;
    let job = c.submit(spec("long", 2, 0, 2)).await;
    c.wait_state(&job, JobState::Running, 0).await;
    let runs = runs_of(&agents, &job, 0);
    post_progress(&c.client, &runs[0].1, &progress(&runs[0].1, 20, 0, Some(10)), None).await;
    c.wait_job(&job, "its progress saved", |j| j.step == Some(20)).await;

    c.restart().await;
    // The new process knows the job, running, with the ranks the agents go on reporting.
    let kept = c.job(&job).await;
    assert_eq!(kept.job.state, JobState::Running);
    assert_eq!(kept.job.attempt, 0);
    assert_eq!(kept.job.nodes, ["n1", "n2"]);
    for agent in &agents {
        agent.wait_reports(3).await;
    }
    let kept = c.job(&job).await;
    assert_eq!(kept.job.state, JobState::Running, "{:?}", kept.job.reason);
    assert_eq!(kept.job.restarts, 0);
    // The progress token survived: ranks go on posting.
    let (status, _) =
        post_progress(&c.client, &runs[0].1, &progress(&runs[0].1, 25, 0, Some(10)), None).await;
    assert_eq!(status, 200);
    for agent in &agents {
        assert_eq!(agent.run_ranks().len(), 1, "no rank was started again");
        assert!(agent.signals().is_empty(), "no rank was signalled");
        agent.exit_ranks(&job, 0);
    }
    let done = c.wait_state(&job, JobState::Completed, 0).await;
    assert_eq!(done.job.restarts, 0);
    assert_eq!(done.step, Some(25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_needs_the_jobs_token_and_auto_gets_a_young_daly_interval() {
    let c = Cluster::start(|config| config.queue.mtbf_prior = Duration::from_secs(3600)).await;
    let agents = c.fleet(&["n1"]).await;
    let mut auto = spec("auto", 1, 0, 0);
    auto["checkpoint_every"] = serde_json::json!("auto");
    let job = c.submit(auto).await;
    c.wait_state(&job, JobState::Running, 0).await;
    let runs = runs_of(&agents, &job, 0);
    let run = &runs[0].1;

    let (status, _) =
        post_progress(&c.client, run, &progress(run, 1, 0, None), Some("wrong")).await;
    assert_eq!(status, 401);
    let url = &run.env[fleetmend_proto::jobs::PROGRESS_URL_VAR];
    let response = c.client.post(url).json(&progress(run, 1, 0, None)).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 401, "no token");
    let other = c.submit(spec("other", 1, 0, 0)).await;
    let (status, _) = c
        .post(
            &format!("/v1/jobs/{other}/progress"),
            serde_json::to_value(progress(run, 1, 0, None)).unwrap(),
        )
        .await;
    assert_eq!(status, 401, "another job's post without its token");
    assert_eq!(c.job(&job).await.step, None, "refused posts change nothing");

    // 1 step per second, checkpoints costing 2 s, MTBF 1 h (the prior): √(2·2·3600) = 120 s.
    let mut first = progress(run, 10, 0, None);
    first.at_ms -= 10_000;
    let (status, reply) = post_progress(&c.client, run, &first, None).await;
    assert_eq!(status, 200);
    assert_eq!(reply.unwrap().checkpoint_every, None, "nothing measured yet");
    let mut second = progress(run, 20, 0, Some(20));
    second.checkpoint_write_seconds = Some(2.0);
    let (_, reply) = post_progress(&c.client, run, &second, None).await;
    assert_eq!(reply.unwrap().checkpoint_every, Some(120));
    let shown = c.job(&job).await;
    assert_eq!(shown.job.checkpoint_interval, Some(120));
    assert_eq!(shown.step, Some(20));

    // The newest progress is on /metrics: loss, throughput, the newest checkpoint and its cost.
    let metrics = c.client.get(format!("{}/metrics", c.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    for line in [
        format!("fleetmend_job_step{{job=\"{job}\"}} 20"),
        format!("fleetmend_job_loss{{job=\"{job}\"}} 4.8"),
        format!("fleetmend_job_samples_per_second{{job=\"{job}\"}} 100"),
        format!("fleetmend_job_checkpoint_step{{job=\"{job}\"}} 20"),
        format!("fleetmend_job_checkpoint_write_seconds{{job=\"{job}\"}} 2"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in:\n{metrics}");
    }
    assert!(!metrics.contains("fleetmend_job_checkpoint_stall_seconds{"), "none reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_are_validated_and_cancel_stops_a_running_job() {
    let c = Cluster::start(|_| {}).await;
    let mut bad = spec("bad", 0, 0, 0);
    let (status, body) = c.post("/v1/jobs", bad.clone()).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("nodes"), "{body}");
    bad["nodes"] = 1.into();
    bad["checkpoint_dir"] = "relative/dir".into();
    let (status, body) = c.post("/v1/jobs", bad.clone()).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("checkpoint_dir"), "{body}");
    bad["checkpoint_dir"] = "/abs".into();
    bad["argv"] = serde_json::json!([]);
    let (status, body) = c.post("/v1/jobs", bad.clone()).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("argv"), "{body}");
    bad.as_object_mut().unwrap().remove("argv");
    let (status, body) = c.post("/v1/jobs", bad).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("argv"), "{body}");

    let agents = c.fleet(&["n1", "n2"]).await;
    agents[1].set_term_exit(None);
    let job = c.submit(spec("stop-me", 2, 0, 5)).await;
    c.wait_state(&job, JobState::Running, 0).await;
    let (status, body) = c.post(&format!("/v1/jobs/{job}/cancel"), serde_json::json!({})).await;
    assert_eq!(status, 200, "{body}");
    // n2's rank ignores SIGTERM: SIGKILL after stop_grace.
    let cancelled = c.wait_state(&job, JobState::Cancelled, 0).await;
    assert_eq!(cancelled.job.restarts, 0, "a cancel is no restart");
    let signals = signals_of(&agents, &job, 0);
    assert!(signals.contains(&("n1".to_owned(), 0, RankSignal::Term)), "{signals:?}");
    assert!(signals.contains(&("n2".to_owned(), 1, RankSignal::Term)), "{signals:?}");
    assert!(signals.contains(&("n2".to_owned(), 1, RankSignal::Kill)), "{signals:?}");
    assert!(!signals.iter().any(|(_, _, s)| *s == RankSignal::Usr1), "{signals:?}");
    let (status, _) = c.post(&format!("/v1/jobs/{job}/cancel"), serde_json::json!({})).await;
    assert_eq!(status, 409);
    let (status, _) = c.post("/v1/jobs/j-999/cancel", serde_json::json!({})).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_drain_is_kept_apart_from_fleetmends_own() {
    // No hot spares kept: a repaired node goes back to work, not to the pool.
    let c = Cluster::start(|config| {
        config.queue.spare_pool = fleetmend_repairer::policy::FleetShare::Nodes(0);
    })
    .await;
    let queue = c.repairer.queue.clone().unwrap();
    queue.admin_drain("n7", "maintenance window").unwrap();
    // A fleetmend drain of the same node does not take it over.
    queue.drain("n7", &format!("{DRAIN_REASON_PREFIX}xid 79")).await.unwrap();
    queue.drain("n8", &format!("{DRAIN_REASON_PREFIX}xid 79")).await.unwrap();
    assert_eq!(
        queue.undrain("n7").await.unwrap(),
        UndrainOutcome::DrainedByOther("maintenance window".to_owned())
    );
    assert_eq!(queue.undrain("n8").await.unwrap(), UndrainOutcome::Undrained);
    assert_eq!(queue.undrain("n8").await.unwrap(), UndrainOutcome::NotDrained);
    // Kept in the store: a restarted repairer still knows n7 is the admin's.
    let mut c = c;
    c.restart().await;
    let queue = c.repairer.queue.clone().unwrap();
    assert_eq!(
        queue.drained().into_keys().collect::<Vec<_>>(),
        ["n7"],
        "only the admin's drain is left"
    );
}

/// The repair workflow is the one owner of stopping a job for a drain (a checkpoint, then the
/// requeue): the queue's drain, fleetmend's or a person's, only takes the node out of placement,
/// as Slurm's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_alone_stops_no_job_it_only_takes_the_node_out_of_placement() {
    let c = Cluster::start(|config| {
        config.queue.wait_alert = Duration::from_millis(400);
        config.queue.spare_pool = fleetmend_repairer::policy::FleetShare::Nodes(0);
    })
    .await;
    let queue = c.repairer.queue.clone().unwrap();
    let agents = c.fleet(&["n1", "n2", "n3"]).await;
    let job = c.submit(spec("long", 2, 0, 0)).await;
    let running = c.wait_state(&job, JobState::Running, 0).await;
    let [first, second] = [running.job.nodes[0].clone(), running.job.nodes[1].clone()];
    let free = ["n1", "n2", "n3"].into_iter().find(|n| !running.job.nodes.iter().any(|m| m == n));
    queue.drain(&first, &format!("{DRAIN_REASON_PREFIX}xid 79")).await.unwrap();
    queue.admin_drain(&second, "a person's drain").unwrap();
    queue.admin_drain(free.unwrap(), "maintenance window").unwrap();

    // A job submitted after the drains waits and names the free node out: the queue has looked
    // at its nodes since.
    let next = c.submit(spec("next", 1, 0, 0)).await;
    let waiting = c.wait_job(&next, "the wait named", |j| j.job.reason.contains("; out: ")).await;
    assert!(waiting.job.reason.contains("maintenance window"), "{}", waiting.job.reason);
    let view = c.job(&job).await;
    assert_eq!(view.job.state, JobState::Running, "{:?}", view.job.reason);
    assert_eq!(view.job.attempt, 0);
    assert!(signals_of(&agents, &job, 0).is_empty(), "{:?}", signals_of(&agents, &job, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_short_of_free_nodes_takes_a_hot_spare_and_a_long_wait_names_the_nodes_out() {
    let c = Cluster::start(|config| {
        config.queue.wait_alert = Duration::from_millis(400);
        config.queue.spare_pool = fleetmend_repairer::policy::FleetShare::Nodes(1);
    })
    .await;
    let queue = c.repairer.queue.clone().unwrap();
    let _agents = c.fleet(&["n1", "n2", "n3", "s1"]).await;
    queue.admin_drain("s1", "fleetmend: spare (set aside by the test)").unwrap();
    queue.admin_drain("n3", "a person's drain").unwrap();

    // Two free nodes and a spare: a job of three takes the spare at once.
    let job = c.submit(spec("big", 3, 0, 0)).await;
    let running = c.wait_state(&job, JobState::Running, 0).await;
    assert_eq!(running.job.nodes, ["n1", "n2", "s1"]);
    assert!(!queue.drained().contains_key("s1"), "the spare is still held out");
    let events = c.events().await;
    assert_in_order(
        &events,
        &[
            Expect::kind(EventKind::SpareTaken)
                .node("s1")
                .reason("the job needs 3 node(s), 2 free"),
            job_event(EventKind::JobStarted, &job),
        ],
    );

    // Nothing is left for a second job: after wait_alert it says why, once, naming the node out.
    let next = c.submit(spec("next", 1, 0, 0)).await;
    let waiting = c.wait_job(&next, "the wait named", |j| j.job.reason.contains("; out: ")).await;
    assert!(
        waiting.job.reason.starts_with(
            "waits for 1 eligible node(s): 0 free; out: n3 (drained: a person's drain)"
        ),
        "{}",
        waiting.job.reason
    );
    let alerts: Vec<Event> =
        c.events().await.into_iter().filter(|e| e.kind == EventKind::JobWaiting).collect();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0].severity, Severity::Warning);
    assert!(alerts[0].reason.contains(&format!("job {next} ")), "{}", alerts[0].reason);
    assert!(
        alerts[0].reason.contains("for nodes: waits for 1 eligible node(s)"),
        "{}",
        alerts[0].reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_lost_to_a_straggler_and_to_a_hang_is_split_from_productive_time() {
    let c = Cluster::start(|config| {
        config.queue.hang_floor = Duration::from_secs(5);
        config.queue.straggler_window = 3;
        config.queue.straggler_warmup = 1;
    })
    .await;
    // Two nodes and no spare: the straggler is a warning, its rank stays in place.
    let agents = c.fleet(&["n1", "n2"]).await;
    let job = c.submit(spec("slowed", 2, 0, 2)).await;
    c.wait_state(&job, JobState::Running, 0).await;
    let runs = runs_of(&agents, &job, 0);
    let (lead, slow) = (&runs[0].1, &runs[1].1);

    // Five steps 200 ms apart on the lead's clock; rank 1 computes each in twice rank 0's time.
    let base = progress(lead, 0, 0, None).at_ms;
    let post = async |run: &RunRank, step: u64, at_ms: u64, seconds: f64| {
        let mut p = progress(run, step, 0, None);
        p.at_ms = at_ms;
        p.step_seconds = Some(seconds);
        let (status, _) = post_progress(&c.client, run, &p, None).await;
        assert_eq!(status, 200);
    };
    for step in 1..=5 {
        post(lead, step, base + step * 200, 0.1).await;
        post(slow, step, base + step * 200, 0.2).await;
    }
    let flagged = c
        .wait_job(&job, "rank 1 flagged a straggler", |j| j.job.health.straggler_ratio.is_some())
        .await;
    assert_eq!(flagged.job.health.straggler_ratio, Some(2.0));
    assert_eq!(flagged.job.goodput.productive_ms, 800, "steps 1 to 5, before the flag");
    assert_eq!(flagged.job.goodput.straggler_ms, 0);

    // 10 s more for one step at half pace: 5 s of it was work, 5 s the straggler's.
    post(lead, 6, base + 11_000, 0.1).await;
    let slowed = c.wait_job(&job, "step 6 accounted", |j| j.step == Some(6)).await;
    assert_eq!(slowed.job.goodput.productive_ms, 800 + 5_000);
    assert_eq!(slowed.job.goodput.straggler_ms, 5_000);

    // No rank posts again: past the 5 s floor the job is hung and restarted; the time it stood
    // at step 6 is the hang's.
    let restarted = c.wait_state(&job, JobState::Running, 1).await;
    assert_eq!(restarted.job.health.hangs, 1);
    let hung_ms = restarted.job.goodput.hung_ms;
    assert!((5_000..DEADLINE.as_millis() as u64).contains(&hung_ms), "hung {hung_ms} ms");
    assert_eq!(restarted.job.goodput.productive_ms, 800 + 5_000, "the hang was no work");
    assert_eq!(restarted.job.health.straggler_ratio, None, "a new attempt is judged afresh");

    let metrics = c.client.get(format!("{}/metrics", c.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let hung = format!("{}", hung_ms as f64 / 1000.0);
    for (cause, seconds) in [("straggler", "5"), ("hang", hung.as_str())] {
        let line = format!(
            "fleetmend_job_lost_seconds_total{{job=\"{job}\",cause=\"{cause}\"}} {seconds}"
        );
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ranks_token_posts_for_that_rank_alone() {
    let c = Cluster::start(|_| {}).await;
    let agents = c.fleet(&["n1", "n2"]).await;
    let job = c.submit(spec("pair", 2, 0, 0)).await;
    c.wait_state(&job, JobState::Running, 0).await;
    let runs = runs_of(&agents, &job, 0);
    let (rank0, rank1) = (&runs[0].1, &runs[1].1);
    let token = |run: &RunRank| run.env[fleetmend_proto::jobs::PROGRESS_TOKEN_VAR].clone();
    assert_ne!(token(rank0), token(rank1), "each rank has a token of its own");

    // Rank 0's token (on n1) posting rank 1's progress (n2's rank): refused, nothing changed.
    let response = c
        .client
        .post(&rank1.env[fleetmend_proto::jobs::PROGRESS_URL_VAR])
        .bearer_auth(token(rank0))
        .json(&progress(rank1, 7, 0, None))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let error = response.text().await.unwrap();
    assert!(error.contains("rank 0's") && error.contains("for rank 1"), "{error}");
    let ranks = c.job(&job).await.job.ranks;
    assert!(ranks.iter().all(|r| r.progress.is_none()), "a refused post changes nothing");
    // The same rank of a later attempt (placed anew) is another rank too.
    let mut later = progress(rank0, 7, 0, None);
    later.attempt = 1;
    assert_eq!(post_progress(&c.client, rank0, &later, None).await.0, 403);

    for run in [rank0, rank1] {
        assert_eq!(post_progress(&c.client, run, &progress(run, 7, 0, None), None).await.0, 200);
    }
    assert_eq!(c.job(&job).await.step, Some(7));
    let metrics = c.client.get(format!("{}/metrics", c.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("fleetmend_api_refused_total{status=\"403\"} 2"), "{metrics}");
}
