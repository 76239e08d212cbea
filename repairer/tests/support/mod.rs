//! Test support for end-to-end scenarios: a repairer started in-process on 127.0.0.1 with a
//! [`MemoryScheduler`] and a [`FakeProvider`], scripted agents that talk to it over real HTTP, and
//! helpers to read its event log and `/metrics`. Every wait polls with a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetmend_proto::{
    CheckRun, CommandResult, EvidenceBundle, EvidenceItem, Finding, RankKey, RankSignal, RankState,
    RankStatus, RecommendedAction, Report, ReportReply, ReportTrigger, RunRank, SignalRank, Status,
    Verdict, WIRE_VERSION, command_kind,
};
use fleetmend_repairer::clock::{SharedClock, SystemClock};
use fleetmend_repairer::config::RepairerConfig;
use fleetmend_repairer::engine::{BreakerState, NodeSummary};
use fleetmend_repairer::model::{Event, EventKind, NodeState};
use fleetmend_repairer::provider::{FakeProvider, Provider, ProviderCall};
use fleetmend_repairer::scheduler::{MemoryScheduler, Scheduler};
use fleetmend_repairer::service::{self, Repairer};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a scenario waits for anything: generous, the machine is shared and loaded.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(25);
/// How often a heartbeating agent reports: well inside the repairer's report interval (200 ms, 3
/// missed make a node unreachable) so a busy machine does not make a node look silent.
pub const HEARTBEAT: Duration = Duration::from_millis(50);

/// The config every scenario starts from: short timings, loopback, no tokens, store in `dir`.
pub fn test_config(dir: &std::path::Path) -> RepairerConfig {
    let text = format!(
        r#"
listen = "127.0.0.1:0"
store = "{store}"

[engine]
tick = "50ms"
report_interval = "200ms"
unreachable_after = 3

[engine.workflow]
call_timeout = "5s"
checkpoint_grace = "0s"
reboot_timeout = "5s"
replace_timeout = "10s"
validate_timeout = "5s"
retry_initial = "50ms"
retry_max = "500ms"

[policy.guard_rails]
settle = "0s"
cooldown = "1s"

# Heartbeating agents here report every 50 ms, 20 a second: far beyond a real agent's rate.
[rate_limits]
node = {{ per_second = 1000.0, burst = 1000 }}
"#,
        store = dir.join("repairer.db").display()
    );
    let config = RepairerConfig::parse(&text).expect("test config parses");
    config.validated(std::path::Path::new("test")).expect("test config is valid")
}

/// An HTTP client for the tests (plain HTTP, but reqwest wants a TLS provider installed).
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap()
}

/// A repairer running in-process with fakes, and its temp dir.
pub struct Harness {
    pub repairer: Repairer,
    pub scheduler: Arc<MemoryScheduler>,
    pub provider: Arc<FakeProvider>,
    pub client: reqwest::Client,
    pub base: String,
    pub agent_token: Option<String>,
    pub admin_token: Option<String>,
    shutdown: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").field("base", &self.base).finish_non_exhaustive()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

impl Harness {
    /// Starts a repairer with [`test_config`] changed by `adjust`.
    pub async fn start(adjust: impl FnOnce(&mut RepairerConfig)) -> Harness {
        Harness::start_on(SystemClock::shared(), adjust).await
    }

    /// [`Harness::start`] with every part of the repairer on `clock` (a virtual one moves only when
    /// the test advances it).
    pub async fn start_on(clock: SharedClock, adjust: impl FnOnce(&mut RepairerConfig)) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path());
        adjust(&mut config);
        let problems = config.problems();
        assert!(problems.is_empty(), "adjusted test config is invalid: {problems:?}");
        let agent_token = config.agent_token.clone();
        let admin_token = config.admin_token.clone();
        let scheduler = Arc::new(MemoryScheduler::new());
        let provider = Arc::new(FakeProvider::new());
        let (shutdown, stopped) = oneshot::channel::<()>();
        let given = service::Given {
            scheduler: Some(scheduler.clone() as Arc<dyn Scheduler>),
            provider: Some(provider.clone() as Arc<dyn Provider>),
            clock,
        };
        let repairer = service::start_given(config, given, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        let base = format!("http://{}", repairer.local_addr);
        Harness {
            repairer,
            scheduler,
            provider,
            client: http_client(),
            base,
            agent_token,
            admin_token,
            shutdown: Some(shutdown),
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A scripted agent for `node`, not reporting yet.
    pub fn agent(&self, node: &str) -> Agent {
        Agent::new(node, &self.base, self.agent_token.clone(), self.provider.clone())
    }

    /// An agent per name, each reporting healthy once (so the node is known) and then heartbeating.
    pub async fn fleet(&self, names: &[String]) -> Vec<Agent> {
        let mut agents = Vec::new();
        for name in names {
            let agent = self.agent(name);
            agent.report().await;
            agent.start_heartbeat();
            agents.push(agent);
        }
        agents
    }

    fn admin(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.admin_token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        let response = self.admin(self.client.get(self.url(path))).send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "GET {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"))
    }

    /// POSTs `body` as the admin; returns the status and the body.
    pub async fn post_admin(&self, path: &str, body: serde_json::Value) -> (u16, String) {
        let response =
            self.admin(self.client.post(self.url(path))).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// The whole event log, oldest first (`GET /v1/events`, paged).
    pub async fn events(&self) -> Vec<Event> {
        let mut all: Vec<Event> = Vec::new();
        loop {
            let after = all.last().map(|e| e.id).unwrap_or(0);
            let page: Vec<Event> =
                self.get_json(&format!("/v1/events?after={after}&limit=1000")).await;
            if page.is_empty() {
                return all;
            }
            all.extend(page);
        }
    }

    /// The events about `node`, oldest first.
    pub async fn events_of(&self, node: &str) -> Vec<Event> {
        self.get_json(&format!("/v1/events?node={node}&limit=10000")).await
    }

    pub async fn nodes(&self) -> Vec<NodeSummary> {
        self.get_json("/v1/nodes").await
    }

    pub async fn state(&self, node: &str) -> Option<NodeState> {
        self.nodes().await.into_iter().find(|n| n.name == node).map(|n| n.state)
    }

    pub async fn breaker(&self) -> BreakerState {
        self.get_json("/v1/breaker").await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let response = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert!(response.status().is_success());
        response.text().await.unwrap()
    }

    /// Waits until `probe` answers `Some`, or fails naming `what` with the event log.
    pub async fn eventually<T>(&self, what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            if Instant::now() > deadline {
                let log = describe(&self.events().await);
                panic!(
                    "timed out after {DEADLINE:?} waiting for {what}\nscheduler: {:?}\nprovider: \
                     {:?}\nevents:\n{log}",
                    self.scheduler.calls(),
                    self.provider.calls()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `node` is in `state`.
    pub async fn wait_state(&self, node: &str, state: NodeState) {
        self.eventually(&format!("{node} to be {state}"), async || {
            (self.state(node).await == Some(state)).then_some(())
        })
        .await;
    }

    /// Waits until an event about `node` matches `expect`; returns it.
    pub async fn wait_event(&self, node: Option<&str>, expect: &Expect) -> Event {
        self.eventually(&format!("an event {expect:?}"), async || {
            let events = match node {
                Some(node) => self.events_of(node).await,
                None => self.events().await,
            };
            events.into_iter().find(|e| expect.matches(e))
        })
        .await
    }

    /// Waits until the repairer took at least `n` more good reports than now: every report
    /// goes through the same ingest, so whatever those reports could have triggered has been
    /// decided by then (used before asserting that something did not happen).
    pub async fn wait_more_reports(&self, n: f64) {
        let before = self.reports_ok().await;
        self.eventually(&format!("{n} more reports"), async || {
            (self.reports_ok().await >= before + n).then_some(())
        })
        .await;
    }

    async fn reports_ok(&self) -> f64 {
        metric(&self.metrics().await, "fleetmend_reports_received_total{outcome=\"ok\"}")
            .unwrap_or(0.0)
    }

    /// Provider calls about `node`.
    pub fn provider_calls_of(&self, node: &str) -> Vec<ProviderCall> {
        self.provider
            .calls()
            .into_iter()
            .filter(|c| match c {
                ProviderCall::Reboot(n)
                | ProviderCall::Replace(n)
                | ProviderCall::PowerState(n) => n == node,
            })
            .collect()
    }
}

/// The value of one series (`name{labels}` exactly as exposed) in a `/metrics` text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// Node names `prefix1..=prefixN`, zero-padded to the width of `n`.
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    let width = n.to_string().len();
    (1..=n).map(|i| format!("{prefix}{i:0width$}")).collect()
}

/// One line per event, for failure messages.
pub fn describe(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| {
            let states = match (e.from_state, e.to_state) {
                (Some(from), Some(to)) => format!(" {from}->{to}"),
                _ => String::new(),
            };
            let action = e.action.map(|a| format!(" [{a}]")).unwrap_or_default();
            format!(
                "  #{} {} {:?} {}{states}{action} ({}) {}",
                e.id,
                e.kind.as_str(),
                e.severity,
                e.node.as_deref().unwrap_or("-"),
                e.actor,
                e.reason
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The state transitions of `node` in `events`, in order.
pub fn transitions(events: &[Event], node: &str) -> Vec<(NodeState, NodeState)> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::StateChanged && e.node.as_deref() == Some(node))
        .filter_map(|e| Some((e.from_state?, e.to_state?)))
        .collect()
}

/// Asserts that `node` went exactly through `expected`, in order.
pub fn assert_transitions(events: &[Event], node: &str, expected: &[(NodeState, NodeState)]) {
    let got = transitions(events, node);
    assert_eq!(got, expected, "transitions of {node}; events:\n{}", describe(events));
}

/// What one expected event looks like; unset parts match anything.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    pub kind: Option<EventKind>,
    pub node: Option<String>,
    pub transition: Option<(NodeState, NodeState)>,
    pub reason: Option<String>,
    pub action: Option<fleetmend_repairer::model::RuleAction>,
    pub severity: Option<fleetmend_repairer::model::Severity>,
}

impl Expect {
    pub fn kind(kind: EventKind) -> Expect {
        Expect { kind: Some(kind), ..Expect::default() }
    }

    /// A state change of `node` from `from` to `to`.
    pub fn transition(node: &str, from: NodeState, to: NodeState) -> Expect {
        Expect {
            kind: Some(EventKind::StateChanged),
            node: Some(node.to_owned()),
            transition: Some((from, to)),
            ..Expect::default()
        }
    }

    pub fn node(mut self, node: &str) -> Expect {
        self.node = Some(node.to_owned());
        self
    }

    /// The reason contains `text`.
    pub fn reason(mut self, text: &str) -> Expect {
        self.reason = Some(text.to_owned());
        self
    }

    pub fn action(mut self, action: fleetmend_repairer::model::RuleAction) -> Expect {
        self.action = Some(action);
        self
    }

    pub fn severity(mut self, severity: fleetmend_repairer::model::Severity) -> Expect {
        self.severity = Some(severity);
        self
    }

    pub fn matches(&self, event: &Event) -> bool {
        self.kind.is_none_or(|k| k == event.kind)
            && self.node.as_deref().is_none_or(|n| event.node.as_deref() == Some(n))
            && self.transition.is_none_or(|(from, to)| {
                event.from_state == Some(from) && event.to_state == Some(to)
            })
            && self.reason.as_deref().is_none_or(|r| event.reason.contains(r))
            && self.action.is_none_or(|a| event.action == Some(a))
            && self.severity.is_none_or(|s| event.severity == s)
    }
}

/// Asserts that `expected` occur in `events` in this order (other events may come between).
pub fn assert_in_order(events: &[Event], expected: &[Expect]) {
    let mut rest = events.iter();
    for (i, expect) in expected.iter().enumerate() {
        if !rest.any(|e| expect.matches(e)) {
            panic!(
                "expected event #{i} {expect:?} after the ones before it; events:\n{}",
                describe(events)
            );
        }
    }
}

/// How many events match `expect`.
pub fn count(events: &[Event], expect: &Expect) -> usize {
    events.iter().filter(|e| expect.matches(e)).count()
}

// --- findings ---------------------------------------------------------------------------------

/// A fatal Xid on GPU 0, as the agent's GPU check reports it.
pub fn xid(code: &str) -> Finding {
    Finding::new(
        "gpu",
        "xid",
        "0",
        Status::Fail,
        RecommendedAction::Reboot,
        format!("Xid {code} on GPU 0"),
    )
    .with_label("xid", code)
}

/// A NIC with no carrier: the agent recommends a drain.
pub fn nic_down(interface: &str) -> Finding {
    Finding::new(
        "nic",
        "nic_down",
        interface,
        Status::Fail,
        RecommendedAction::Drain,
        format!("{interface} has no carrier"),
    )
}

// --- the scripted agent -----------------------------------------------------------------------

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[derive(Debug)]
struct AgentState {
    boot: u32,
    boot_id: String,
    seq: u64,
    trigger: ReportTrigger,
    /// Non-ok findings the node has now.
    findings: Vec<Finding>,
    /// A simulated reboot leaves the findings in place.
    fault_persists: bool,
    /// Deep checks fail even with no failing finding.
    deep_check_fails: bool,
    /// What this node's rank of an allreduce probe measures (GB/s).
    allreduce_gbps: f64,
    /// What it measures after its next reboot.
    allreduce_gbps_after_reboot: Option<f64>,
    /// A reboot does not bring the node back: it never reports again.
    stays_down_after_reboot: bool,
    down: bool,
    /// Reboots of this node recorded by the provider that the agent has lived through.
    reboots_seen: usize,
    /// Results waiting to be delivered.
    results: Vec<CommandResult>,
    /// Results delivered since the last boot.
    delivered: Vec<CommandResult>,
    /// Keep sending delivered results with every report.
    resend_delivered: bool,
    /// Reports accepted by the repairer.
    reports_sent: u64,
    /// Command ids run (an agent runs an id once).
    ran: BTreeSet<String>,
    /// Every command received, in order.
    commands: Vec<fleetmend_proto::NodeCommand>,
    /// Ranks of jobs this node runs or ran (from `run-rank`), reported with every report.
    ranks: std::collections::BTreeMap<RankKey, RankStatus>,
    /// Every `run-rank` received, in order (one per rank: an agent starts a rank once).
    run_ranks: Vec<RunRank>,
    /// Every `signal-rank` received, in order.
    signals: Vec<SignalRank>,
    /// The exit status of a rank sent SIGTERM (as the checkpoint protocol asks: 0); `None`: it
    /// ignores SIGTERM and only SIGKILL ends it.
    term_exit: Option<i32>,
    /// The address the node reports.
    address: Option<String>,
    /// The metrics port the node reports (for Prometheus service discovery).
    metrics_port: Option<u16>,
    /// When the checks last ran, where fixed: reports carry that run again (as a real agent's
    /// report sent for an event carries its checks' latest results); none: a new run each report.
    checks_ran_at: Option<u64>,
}

/// The node boots: a new boot id, and the agent's first report follows; a reboot ends every
/// process the agent ran.
fn boot(node: &str, state: &mut AgentState) {
    state.boot += 1;
    state.boot_id = format!("{node}-boot-{}", state.boot);
    state.seq = 0;
    state.trigger = ReportTrigger::Startup;
    state.results.clear();
    state.delivered.clear();
    state.ranks.clear();
}

#[derive(Debug)]
struct AgentInner {
    node: String,
    url: String,
    token: Option<String>,
    client: reqwest::Client,
    provider: Arc<FakeProvider>,
    state: Mutex<AgentState>,
}

/// A scripted agent: posts reports with the findings it is given, runs deep checks it is sent
/// (answering in its next report), and reboots when the fake provider rebooted its node.
#[derive(Debug)]
pub struct Agent {
    inner: Arc<AgentInner>,
    heartbeat: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(task) = self.heartbeat.lock().unwrap().take() {
            task.abort();
        }
    }
}

impl Agent {
    /// A scripted agent for `node` reporting to the repairer at `base` (for repairers started
    /// outside [`Harness`]).
    pub fn connect(
        node: &str,
        base: &str,
        token: Option<String>,
        provider: Arc<FakeProvider>,
    ) -> Agent {
        Agent::new(node, base, token, provider)
    }

    /// Every `run-rank` command received, in order.
    pub fn run_ranks(&self) -> Vec<RunRank> {
        self.inner.state.lock().unwrap().run_ranks.clone()
    }

    /// Every `signal-rank` command received, in order.
    pub fn signals(&self) -> Vec<SignalRank> {
        self.inner.state.lock().unwrap().signals.clone()
    }

    /// The ranks this node runs now.
    pub fn running_ranks(&self) -> Vec<RankKey> {
        let state = self.inner.state.lock().unwrap();
        state
            .ranks
            .values()
            .filter(|r| r.state == RankState::Running)
            .map(|r| r.key.clone())
            .collect()
    }

    /// Ends every running rank of `job` on this node with exit status `code` (reported next).
    pub fn exit_ranks(&self, job: &str, code: i32) {
        let mut state = self.inner.state.lock().unwrap();
        for rank in state.ranks.values_mut() {
            if rank.key.job == job && rank.state == RankState::Running {
                rank.state = RankState::Exited;
                rank.exit_code = Some(code);
                rank.finished_at_ms = Some(now_ms());
            }
        }
        state.trigger = ReportTrigger::RankExit;
    }

    /// What a rank does on SIGTERM: exit with this status (`None`: ignore it).
    pub fn set_term_exit(&self, code: Option<i32>) {
        self.inner.state.lock().unwrap().term_exit = code;
    }

    /// The address the node reports (for `MASTER_ADDR`).
    pub fn set_address(&self, address: &str) {
        self.inner.state.lock().unwrap().address = Some(address.to_owned());
    }

    /// The port the node reports its `/metrics` on (for Prometheus service discovery).
    pub fn set_metrics_port(&self, port: u16) {
        self.inner.state.lock().unwrap().metrics_port = Some(port);
    }

    /// Its checks' results stand as of their run at `at`: every report carries that run again,
    /// as a real agent's report sent for a kernel line or a command's result carries its checks'
    /// latest results; none: each report is a new run.
    pub fn set_checks_ran_at(&self, at: Option<u64>) {
        self.inner.state.lock().unwrap().checks_ran_at = at;
    }

    /// The node boots with a new boot id, as a reboot a person makes outside fleetmend; its
    /// findings stay as they were set.
    pub fn reboot_by_hand(&self) {
        let mut state = self.inner.state.lock().unwrap();
        boot(&self.inner.node, &mut state);
    }

    /// Waits until the repairer accepted `n` more reports of this agent.
    pub async fn wait_reports(&self, n: u64) {
        let target = self.reports_sent() + n;
        let deadline = Instant::now() + DEADLINE;
        while self.reports_sent() < target {
            assert!(Instant::now() < deadline, "{}: {n} more reports did not arrive", self.node());
            tokio::time::sleep(POLL).await;
        }
    }

    /// Forgets every rank, as an agent restarted or a node rebooted would.
    pub fn forget_ranks(&self) {
        self.inner.state.lock().unwrap().ranks.clear();
    }

    fn new(node: &str, base: &str, token: Option<String>, provider: Arc<FakeProvider>) -> Agent {
        let state = AgentState {
            boot: 1,
            boot_id: format!("{node}-boot-1"),
            seq: 0,
            trigger: ReportTrigger::Startup,
            findings: Vec::new(),
            fault_persists: false,
            deep_check_fails: false,
            allreduce_gbps: 10.0,
            allreduce_gbps_after_reboot: None,
            stays_down_after_reboot: false,
            down: false,
            reboots_seen: 0,
            results: Vec::new(),
            delivered: Vec::new(),
            resend_delivered: false,
            reports_sent: 0,
            ran: BTreeSet::new(),
            commands: Vec::new(),
            ranks: std::collections::BTreeMap::new(),
            run_ranks: Vec::new(),
            signals: Vec::new(),
            term_exit: Some(0),
            address: None,
            metrics_port: None,
            checks_ran_at: None,
        };
        Agent {
            inner: Arc::new(AgentInner {
                node: node.to_owned(),
                url: format!("{base}/v1/reports"),
                token,
                client: http_client(),
                provider,
                state: Mutex::new(state),
            }),
            heartbeat: Mutex::new(None),
        }
    }

    pub fn node(&self) -> &str {
        &self.inner.node
    }

    pub fn boot_id(&self) -> String {
        self.inner.state.lock().unwrap().boot_id.clone()
    }

    /// The node's current non-ok findings (sent with every report).
    pub fn set_findings(&self, findings: Vec<Finding>) {
        self.inner.state.lock().unwrap().findings = findings;
    }

    /// Whether a reboot clears the findings (false) or leaves them (true).
    pub fn set_fault_persists(&self, persists: bool) {
        self.inner.state.lock().unwrap().fault_persists = persists;
    }

    /// Makes deep checks fail even with no failing finding.
    pub fn set_deep_check_fails(&self, fails: bool) {
        self.inner.state.lock().unwrap().deep_check_fails = fails;
    }

    /// What this node's rank of an allreduce probe measures from now on (GB/s).
    pub fn set_allreduce_gbps(&self, gbps: f64) {
        self.inner.state.lock().unwrap().allreduce_gbps = gbps;
    }

    /// What this node's rank of an allreduce probe measures once it rebooted (GB/s).
    pub fn set_allreduce_gbps_after_reboot(&self, gbps: f64) {
        self.inner.state.lock().unwrap().allreduce_gbps_after_reboot = Some(gbps);
    }

    /// Makes the next reboot the node's last: it never reports again.
    pub fn set_stays_down_after_reboot(&self, stays_down: bool) {
        self.inner.state.lock().unwrap().stays_down_after_reboot = stays_down;
    }

    /// Keeps sending command results the repairer already accepted, with every report, as an
    /// agent does that never learns its reports arrived (the replies are lost on the way back):
    /// results are at-least-once.
    pub fn set_resend_delivered_results(&self, resend: bool) {
        self.inner.state.lock().unwrap().resend_delivered = resend;
    }

    /// Reports the repairer accepted so far.
    pub fn reports_sent(&self) -> u64 {
        self.inner.state.lock().unwrap().reports_sent
    }

    /// Every command the repairer sent, in order.
    pub fn commands(&self) -> Vec<fleetmend_proto::NodeCommand> {
        self.inner.state.lock().unwrap().commands.clone()
    }

    /// Sends one report now; returns the reply.
    pub async fn report(&self) -> ReportReply {
        self.inner.report().await.unwrap_or_else(|e| panic!("report of {}: {e}", self.inner.node))
    }

    /// Sends one report now; the reply, or the refusal (`STATUS: body`).
    pub async fn try_report(&self) -> Result<ReportReply, String> {
        self.inner.report().await
    }

    /// Reports every [`HEARTBEAT`] (and at once after a command finished) until stopped.
    pub fn start_heartbeat(&self) {
        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            loop {
                let more = match inner.report().await {
                    Ok(_) => {
                        let state = inner.state.lock().unwrap();
                        state.results.is_empty()
                    }
                    // A refused or failed report is retried at the next beat.
                    Err(_) => true,
                };
                if more {
                    tokio::time::sleep(HEARTBEAT).await;
                }
            }
        });
        if let Some(old) = self.heartbeat.lock().unwrap().replace(task) {
            old.abort();
        }
    }

    /// Stops reporting (the node went silent).
    pub fn stop_heartbeat(&self) {
        if let Some(task) = self.heartbeat.lock().unwrap().take() {
            task.abort();
        }
    }
}

impl AgentInner {
    /// Starts a rank for `run-rank` (once per rank) and acts on `signal-rank`: SIGUSR1 changes
    /// nothing, SIGTERM ends it with `term_exit`, SIGKILL by signal 9.
    fn run_rank_commands(state: &mut AgentState, command: &fleetmend_proto::NodeCommand) {
        if command.kind == command_kind::RUN_RANK {
            let run: RunRank = command.args_as().unwrap();
            if !state.ranks.contains_key(&run.key) {
                state.ranks.insert(
                    run.key.clone(),
                    RankStatus {
                        key: run.key.clone(),
                        state: RankState::Running,
                        pid: Some(1000 + run.key.rank),
                        exit_code: None,
                        signal: None,
                        message: String::new(),
                        started_at_ms: now_ms(),
                        finished_at_ms: None,
                    },
                );
                state.run_ranks.push(run);
            }
        } else if command.kind == command_kind::SIGNAL_RANK {
            let signal: SignalRank = command.args_as().unwrap();
            let term_exit = state.term_exit;
            if let Some(rank) = state.ranks.get_mut(&signal.key)
                && rank.state == RankState::Running
            {
                match signal.signal {
                    RankSignal::Usr1 => {}
                    RankSignal::Term => {
                        if let Some(code) = term_exit {
                            rank.state = RankState::Exited;
                            rank.exit_code = Some(code);
                            rank.finished_at_ms = Some(now_ms());
                        }
                    }
                    RankSignal::Kill => {
                        rank.state = RankState::Exited;
                        rank.signal = Some(9);
                        rank.finished_at_ms = Some(now_ms());
                    }
                }
            }
            state.signals.push(signal);
        }
    }

    /// Lives through reboots the provider made since the last report.
    fn notice_reboots(&self, state: &mut AgentState) {
        let reboots = self
            .provider
            .calls()
            .iter()
            .filter(|c| matches!(c, ProviderCall::Reboot(n) if *n == self.node))
            .count();
        if reboots > state.reboots_seen {
            state.reboots_seen = reboots;
            state.down |= state.stays_down_after_reboot;
            boot(&self.node, state);
            if let Some(gbps) = state.allreduce_gbps_after_reboot.take() {
                state.allreduce_gbps = gbps;
            }
            if !state.fault_persists {
                state.findings.clear();
            }
        }
    }

    /// The next report, or `None` while the node is down.
    fn build(&self) -> Option<Report> {
        let mut state = self.state.lock().unwrap();
        self.notice_reboots(&mut state);
        if state.down {
            return None;
        }
        state.seq += 1;
        let now = now_ms();
        let mut findings = vec![Finding::ok("gpu", "gpu", "0"), Finding::ok("nic", "nic", "eth0")];
        findings.extend(state.findings.iter().cloned());
        let checks = ["gpu", "nic"]
            .iter()
            .map(|check| CheckRun {
                check: (*check).to_owned(),
                status: findings
                    .iter()
                    .filter(|f| f.check == *check)
                    .fold(Status::Ok, |worst, f| worst.worst(f.status)),
                duration_seconds: 0.01,
                timed_out: false,
                finished_at_ms: state.checks_ran_at.unwrap_or(now),
            })
            .collect();
        let mut command_results = state.results.clone();
        if state.resend_delivered {
            command_results.extend(state.delivered.iter().cloned());
        }
        let trigger = if state.results.is_empty() { state.trigger } else { ReportTrigger::Command };
        Some(Report {
            wire_version: WIRE_VERSION,
            node: self.node.clone(),
            boot_id: state.boot_id.clone(),
            agent_version: "scripted".to_owned(),
            seq: state.seq,
            sent_at_ms: now,
            trigger,
            verdict: Verdict::of(&findings),
            checks,
            findings,
            command_results,
            address: state.address.clone(),
            ranks: state.ranks.values().cloned().collect(),
            metrics_port: state.metrics_port,
        })
    }

    async fn report(&self) -> Result<ReportReply, String> {
        let report = self.build().ok_or_else(|| "the node is down".to_owned())?;
        let mut request = self.client.post(&self.url).json(&report);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{status}: {text}"));
        }
        let reply: ReportReply = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let mut state = self.state.lock().unwrap();
        // Delivered: these results are not sent again.
        let delivered: BTreeSet<String> =
            report.command_results.iter().map(|r| r.id.clone()).collect();
        state.reports_sent += 1;
        let newly: Vec<CommandResult> =
            state.results.iter().filter(|r| delivered.contains(&r.id)).cloned().collect();
        state.delivered.extend(newly);
        state.results.retain(|r| !delivered.contains(&r.id));
        state.trigger = ReportTrigger::Interval;
        for command in &reply.commands {
            state.commands.push(command.clone());
            Self::run_rank_commands(&mut state, command);
            if command.kind == command_kind::EVIDENCE && state.ran.insert(command.id.clone()) {
                let bundle = EvidenceBundle {
                    node: self.node.clone(),
                    boot_id: report.boot_id.clone(),
                    collected_at_ms: now_ms(),
                    took_ms: 1,
                    items: vec![EvidenceItem::text(
                        "findings",
                        "fake agent",
                        format!("{:?}", state.findings),
                    )],
                };
                state.results.push(CommandResult::evidence(&command.id, bundle, now_ms()));
                continue;
            }
            if command.kind == command_kind::ALLREDUCE && state.ran.insert(command.id.clone()) {
                let gbps = state.allreduce_gbps;
                let measured = fleetmend_proto::probes::AllreduceMeasurement {
                    bytes: 1 << 20,
                    world_size: 2,
                    seconds: 0.001,
                    busbw_gbps: gbps,
                };
                state.results.push(CommandResult {
                    id: command.id.clone(),
                    kind: command.kind.clone(),
                    ok: true,
                    message: format!("{gbps} GB/s"),
                    verdict: None,
                    findings: Vec::new(),
                    evidence: None,
                    allreduce: Some(measured),
                    finished_at_ms: now_ms(),
                });
                continue;
            }
            if command.kind != command_kind::DEEP_CHECK || !state.ran.insert(command.id.clone()) {
                continue;
            }
            let failing: Vec<Finding> =
                state.findings.iter().filter(|f| f.status == Status::Fail).cloned().collect();
            let ok = failing.is_empty() && !state.deep_check_fails;
            state.results.push(CommandResult {
                id: command.id.clone(),
                kind: command.kind.clone(),
                ok,
                message: if ok {
                    "healthy".to_owned()
                } else if failing.is_empty() {
                    "the active GPU probe failed".to_owned()
                } else {
                    format!("{} failing finding(s)", failing.len())
                },
                verdict: Some(if ok { Verdict::Healthy } else { Verdict::Unhealthy }),
                findings: failing,
                evidence: None,
                allreduce: None,
                finished_at_ms: now_ms(),
            });
        }
        Ok(reply)
    }
}
