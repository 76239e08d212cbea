//! The probe's task: measures nodes asked for by a validation first, then idle nodes that are due,
//! one probe at a time, through the agents' `allreduce` command.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use fleetmend_proto::probes::AllreduceProbe;
use fleetmend_proto::{
    CommandResult, Finding, RecommendedAction, Status, command_kind, jobs::command_with_args,
};
use tokio::sync::Notify;

use super::{
    AllreduceConfig, CHECK, Judgement, PeerChoice, SLOW, Sample, Samples, Suspicions, judge,
    pick_peer,
};
use crate::clock::SharedClock;
use crate::commands::CommandQueue;
use crate::metrics::RepairerMetrics;
use crate::model::NodeState;
use crate::nodes::Nodes;
use crate::ports::{JobFinding, JobFindings};
use crate::scheduler::Scheduler;

/// How often the answers to a probe under way are looked for.
const ANSWER_POLL: Duration = Duration::from_millis(100);
/// How long the task sleeps when nothing is due (a validation's request wakes it at once).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// What the prober needs of the repairer.
pub struct ProberPorts {
    pub clock: SharedClock,
    pub nodes: Arc<Nodes>,
    pub commands: Arc<CommandQueue>,
    pub scheduler: Arc<dyn Scheduler>,
    /// Where slow nodes' findings go (to the engine's ingest, as the repairer's own probe's).
    pub findings: Option<JobFindings>,
    /// A node not heard from for this long is not measured.
    pub unreachable_window: Duration,
    /// Names this repairer process: probe ids must not outlive it.
    pub instance: u64,
    pub metrics: Arc<RepairerMetrics>,
}

impl std::fmt::Debug for ProberPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProberPorts").field("instance", &self.instance).finish_non_exhaustive()
    }
}

/// A validation's probe verdict, folded into its deep check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeVerdict {
    pub ok: bool,
    pub message: String,
}

/// How one probe of a pair ended.
#[derive(Debug, Clone, PartialEq)]
enum Measured {
    Busbw(f64),
    Failed(String),
}

#[derive(Debug, Default)]
struct State {
    samples: Samples,
    suspicions: Suspicions,
    /// When each node was last measured (ms).
    last_probed: BTreeMap<String, u64>,
    /// Validation id → the node it measures, in the order asked.
    requests: BTreeMap<String, String>,
    verdicts: BTreeMap<String, ProbeVerdict>,
    /// Nodes the `allreduce_slow` finding was raised on.
    slow: BTreeSet<String>,
    seq: u64,
}

/// Told the node whose validation's verdict is in.
pub type VerdictIn = Box<dyn Fn(&str) + Send + Sync>;

/// Runs the `allreduce` probe (see the module above).
pub struct Prober {
    config: AllreduceConfig,
    ports: ProberPorts,
    state: Mutex<State>,
    wake: Notify,
    /// Called with the node whose validation's verdict is in: the workflows waiting for one.
    verdict_in: Mutex<Option<VerdictIn>>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Prober {
    pub fn new(config: AllreduceConfig, ports: ProberPorts) -> Arc<Prober> {
        Arc::new(Prober {
            config,
            ports,
            state: Mutex::default(),
            wake: Notify::new(),
            verdict_in: Mutex::new(None),
        })
    }

    /// Calls `verdict_in` with the node whenever a validation's verdict is in.
    pub fn tell_verdicts_to(&self, verdict_in: VerdictIn) {
        *self.verdict_in.lock().unwrap_or_else(PoisonError::into_inner) = Some(verdict_in);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a validation's deep check waits for this probe too.
    pub fn on_validate(&self) -> bool {
        self.config.on_validate
    }

    /// Starts the task, where the probe is enabled.
    pub fn start(self: &Arc<Self>) {
        if self.config.enabled() {
            tokio::spawn(Arc::clone(self).run());
        }
    }

    /// Measure `node` for validation `id` (again: a repeated id is asked once).
    pub fn request(&self, node: &str, id: &str) {
        let mut state = self.state();
        if !state.verdicts.contains_key(id) && !state.requests.contains_key(id) {
            state.requests.insert(id.to_owned(), node.to_owned());
            drop(state);
            self.wake.notify_one();
        }
    }

    /// The verdict for validation `id`, once there is one.
    pub fn verdict(&self, id: &str) -> Option<ProbeVerdict> {
        self.state().verdicts.get(id).cloned()
    }

    /// Forgets validation `id` once its workflow used the verdict.
    pub fn forget(&self, id: &str) {
        let mut state = self.state();
        state.verdicts.remove(id);
        state.requests.remove(id);
    }

    /// The median bus bandwidth of the kept measurements (GB/s).
    pub fn fleet_median(&self) -> Option<f64> {
        self.state().samples.median()
    }

    async fn run(self: Arc<Self>) {
        loop {
            let request = self.state().requests.iter().next().map(|(i, n)| (i.clone(), n.clone()));
            if let Some((id, node)) = request {
                let verdict = self.validate(&node).await;
                tracing::info!(%node, ok = verdict.ok, "allreduce probe for validation: {}", verdict.message);
                let mut state = self.state();
                if state.requests.remove(&id).is_some() {
                    state.verdicts.insert(id, verdict);
                }
                drop(state);
                if let Some(verdict_in) =
                    &*self.verdict_in.lock().unwrap_or_else(PoisonError::into_inner)
                {
                    verdict_in(&node);
                }
                continue;
            }
            if !self.config.every.is_zero() && self.measure_one_due().await {
                continue;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = self.ports.clock.sleep(IDLE_POLL) => {}
            }
        }
    }

    /// Measures `node` against up to two healthy idle peers: it passes with the first that
    /// measures well, fails once it measured low with two.
    async fn validate(&self, node: &str) -> ProbeVerdict {
        let mut lows = Vec::new();
        let mut tried = Vec::new();
        while lows.len() < super::CONFIRMING_PEERS {
            let Some(peer) = self.idle_peer(node, &tried, true).await else {
                let message = match lows.is_empty() {
                    true => {
                        "allreduce: no idle healthy peer to measure against; not judged".to_owned()
                    }
                    false => format!(
                        "allreduce: {}; no other idle peer to confirm it; not judged",
                        lows.join("; ")
                    ),
                };
                return ProbeVerdict { ok: true, message };
            };
            tried.push(peer.clone());
            match self.measure_pair(node, &peer).await {
                (Judgement::Pass { median }, busbw) => {
                    return ProbeVerdict { ok: true, message: passed(&peer, busbw, median) };
                }
                (Judgement::Low { median }, busbw) => lows.push(low(&peer, busbw, median)),
            }
        }
        ProbeVerdict { ok: false, message: format!("allreduce: {}", lows.join("; ")) }
    }

    /// Measures the idle node due first, if any; whether one was.
    async fn measure_one_due(&self) -> bool {
        let now = self.ports.clock.now_ms();
        let every = u64::try_from(self.config.every.as_millis()).unwrap_or(u64::MAX);
        let subjects = self.subjects();
        let due = {
            let state = self.state();
            // A suspect is measured again at once, with another peer; then the longest unmeasured.
            let mut due: Vec<(bool, u64, &String)> = subjects
                .iter()
                .map(|(n, _)| {
                    let last = state.last_probed.get(n).copied();
                    (!state.suspicions.is_suspect(n), last.unwrap_or(0), n)
                })
                .filter(|(fresh, last, _)| {
                    !*fresh || now.saturating_sub(*last) >= every || *last == 0
                })
                .collect();
            due.sort();
            due.into_iter().map(|(_, _, n)| n.clone()).collect::<Vec<_>>()
        };
        for node in due {
            if !self.is_idle(&node).await {
                self.state().last_probed.insert(node, now);
                continue;
            }
            let tried = self.state().suspicions.of(&node).to_vec();
            let Some(peer) = self.idle_peer(&node, &tried, false).await else { continue };
            let (judgement, busbw) = self.measure_pair(&node, &peer).await;
            tracing::info!(%node, %peer, ?judgement, busbw, "allreduce probe");
            return true;
        }
        false
    }

    /// Runs one probe of `node` with `peer` (rank 0), records what it says of both, and raises
    /// or clears their findings; the judgement and the bandwidth (zero for a failed probe).
    async fn measure_pair(&self, node: &str, peer: &str) -> (Judgement, f64) {
        let measured = self.probe(node, peer).await;
        let now = self.ports.clock.now_ms();
        let mut state = self.state();
        state.last_probed.insert(node.to_owned(), now);
        state.last_probed.insert(peer.to_owned(), now);
        // Each node against the fleet without it; the subject's judgement is the probe's.
        let busbw = match &measured {
            Measured::Busbw(busbw) => *busbw,
            Measured::Failed(why) => {
                tracing::warn!(%node, %peer, "allreduce probe failed: {why}");
                0.0
            }
        };
        // A probe that failed (no ring, a timeout) is low whatever the baseline.
        let judged = [node, peer].map(|n| {
            let baseline = state.samples.baseline(n);
            match measured {
                Measured::Busbw(_) => (n, judge(busbw, baseline, &self.config)),
                Measured::Failed(_) => (n, Judgement::Low { median: baseline.0.unwrap_or(0.0) }),
            }
        });
        let judgement = judged[0].1;
        let result = match (&measured, judgement) {
            (Measured::Failed(_), _) => "failed",
            (_, Judgement::Low { .. }) => "low",
            (_, Judgement::Pass { median: None }) => "unjudged",
            (_, Judgement::Pass { .. }) => "pass",
        };
        let mut raise = Vec::new();
        let mut clear = Vec::new();
        if judged.iter().all(|(_, j)| matches!(j, Judgement::Pass { .. })) {
            let sample = Sample { nodes: [node.to_owned(), peer.to_owned()], busbw_gbps: busbw };
            state.samples.push(sample, self.config.window);
        }
        for (n, j) in judged {
            let other = if n == node { peer } else { node };
            match j {
                Judgement::Pass { .. } => {
                    state.suspicions.cleared(n);
                    if state.slow.remove(n) {
                        clear.push(n.to_owned());
                    }
                }
                Judgement::Low { median } => {
                    if state.suspicions.low(n, other) && state.slow.insert(n.to_owned()) {
                        state.suspicions.blame(n);
                        let peers = state.suspicions.of(n).join(" and ");
                        raise.push((
                            n.to_owned(),
                            slow_finding(n, &peers, busbw, median, &self.config),
                        ));
                    }
                }
            }
        }
        let median = state.samples.median();
        drop(state);
        self.ports.metrics.allreduce_probe(result, median);
        self.send(raise, clear, node);
        (judgement, busbw)
    }

    fn send(&self, raise: Vec<(String, Finding)>, clear: Vec<String>, subject: &str) {
        let Some(findings) = &self.ports.findings else { return };
        for (node, finding) in raise {
            let _gone = findings.send(JobFinding { node, finding, firing: true });
        }
        for node in clear {
            let finding = slow_finding(&node, "", 0.0, 0.0, &self.config);
            tracing::info!(node = %node, measured_with = subject, "allreduce: measures well again");
            let _gone = findings.send(JobFinding { node, finding, firing: false });
        }
    }

    /// Sends both ranks their `allreduce` command and waits for both answers.
    async fn probe(&self, node: &str, peer: &str) -> Measured {
        let id = {
            let mut state = self.state();
            state.seq += 1;
            format!("allreduce-{}-{}", self.ports.instance, state.seq)
        };
        let master_addr = self.address_of(peer);
        let timeout_ms = u64::try_from(self.config.timeout.as_millis()).unwrap_or(u64::MAX);
        let ids = [format!("{id}-r0"), format!("{id}-r1")];
        for (rank, target) in [peer, node].into_iter().enumerate() {
            let args = AllreduceProbe {
                probe: id.clone(),
                master_addr: master_addr.clone(),
                master_port: self.config.port,
                rank: rank as u32,
                world_size: 2,
                nodes: vec![peer.to_owned(), node.to_owned()],
                bytes: self.config.bytes,
                iterations: self.config.iterations,
                // The ranks give up first, so their answers say why.
                timeout_ms: timeout_ms.saturating_mul(3) / 4,
            };
            let command = command_with_args(ids[rank].clone(), command_kind::ALLREDUCE, &args);
            self.ports.commands.push(target, command);
        }
        let deadline = self.ports.clock.now_ms().saturating_add(timeout_ms);
        let answers = loop {
            let answers: Vec<Option<CommandResult>> =
                ids.iter().map(|i| self.ports.commands.result(i)).collect();
            if answers.iter().all(Option::is_some) || self.ports.clock.now_ms() >= deadline {
                break answers;
            }
            self.ports.clock.sleep(ANSWER_POLL).await;
        };
        for i in &ids {
            self.ports.commands.forget(i);
        }
        let [first, second] = [&answers[0], &answers[1]];
        match (first, second) {
            (Some(a), Some(b)) => match (a.allreduce.as_ref(), b.allreduce.as_ref()) {
                (Some(x), Some(y)) if a.ok && b.ok => {
                    Measured::Busbw(x.busbw_gbps.min(y.busbw_gbps))
                }
                _ => {
                    let why = [(peer, a), (node, b)]
                        .iter()
                        .filter(|(_, r)| !r.ok)
                        .map(|(n, r)| format!("{n}: {}", r.message))
                        .collect::<Vec<_>>();
                    Measured::Failed(why.join("; "))
                }
            },
            _ => {
                let silent: Vec<&str> = [(peer, first), (node, second)]
                    .iter()
                    .filter(|(_, r)| r.is_none())
                    .map(|(n, _)| *n)
                    .collect();
                Measured::Failed(format!(
                    "no answer from {} within {}",
                    silent.join(" and "),
                    humantime::format_duration(self.config.timeout)
                ))
            }
        }
    }

    fn choice<'a>(&self, state: &'a State) -> PeerChoice<'a> {
        PeerChoice {
            suspicions: &state.suspicions,
            samples: &state.samples,
            last_probed: &state.last_probed,
            floor: state.samples.median().map(|m| m * self.config.fraction),
        }
    }

    fn address_of(&self, node: &str) -> String {
        self.ports
            .nodes
            .get(node)
            .and_then(|n| n.address.filter(|a| !a.is_empty()))
            .unwrap_or_else(|| node.to_owned())
    }

    /// Nodes that may be measured now: in the inventory, healthy (or drained by nothing but this
    /// probe's finding), reporting, out of any workflow and not a person's.
    fn subjects(&self) -> Vec<(String, NodeState)> {
        let now = self.ports.clock.now_ms();
        let window = u64::try_from(self.ports.unreachable_window.as_millis()).unwrap_or(u64::MAX);
        self.ports
            .nodes
            .all()
            .into_iter()
            .filter(|n| now.saturating_sub(n.last_report_ms) <= window)
            .filter(|n| n.workflow.is_none() && !n.drained_by_person && !n.unknown)
            .filter(|n| match n.state {
                NodeState::Healthy => true,
                NodeState::Drained => {
                    !n.findings.is_empty() && n.findings.iter().all(|t| t.finding.check == CHECK)
                }
                _ => false,
            })
            .map(|n| (n.name, n.state))
            .collect()
    }

    /// The peer to measure `node` with: a healthy subject other than `node`, not slow, picked by
    /// [`pick_peer`] (not one of `tried`); only the one picked is asked of the scheduler whether
    /// it is idle, and a busy one is passed over for the next.
    async fn idle_peer(&self, node: &str, tried: &[String], suspects_too: bool) -> Option<String> {
        let candidates: Vec<String> = {
            let slow = &self.state().slow;
            self.subjects()
                .into_iter()
                .filter(|(n, state)| n != node && *state == NodeState::Healthy && !slow.contains(n))
                .map(|(n, _)| n)
                .collect()
        };
        let mut passed_over = tried.to_vec();
        loop {
            let peer = {
                let state = self.state();
                pick_peer(node, &candidates, &passed_over, suspects_too, &self.choice(&state))
                    .cloned()?
            };
            if self.is_idle(&peer).await {
                return Some(peer);
            }
            passed_over.push(peer);
        }
    }

    /// No job runs on `node` (an unanswered scheduler counts as busy).
    async fn is_idle(&self, node: &str) -> bool {
        matches!(self.ports.scheduler.jobs_on(node).await, Ok(jobs) if jobs.is_empty())
    }
}

fn passed(peer: &str, busbw: f64, median: Option<f64>) -> String {
    match median {
        Some(median) => format!(
            "allreduce: {busbw:.3} GB/s with {peer} ({:.2} × the fleet's median {median:.3} GB/s)",
            busbw / median
        ),
        None => {
            format!("allreduce: {busbw:.3} GB/s with {peer} (too few measurements to judge yet)")
        }
    }
}

fn low(peer: &str, busbw: f64, median: f64) -> String {
    if busbw <= 0.0 {
        return format!("the probe with {peer} failed");
    }
    format!(
        "{busbw:.3} GB/s with {peer}, {:.2} × the fleet's median {median:.3} GB/s",
        busbw / median.max(f64::MIN_POSITIVE)
    )
}

/// The `allreduce_slow` finding on `node`, measured low with `peers`.
fn slow_finding(
    node: &str,
    peers: &str,
    busbw: f64,
    median: f64,
    config: &AllreduceConfig,
) -> Finding {
    let ratio = if median > 0.0 { busbw / median } else { 0.0 };
    Finding::new(
        CHECK,
        SLOW,
        "",
        Status::Fail,
        RecommendedAction::Drain,
        format!(
            "{node}'s all-reduce bus bandwidth is {busbw:.3} GB/s with {peers}: {ratio:.2} × the \
             fleet's median {median:.3} GB/s, below {}",
            config.fraction
        ),
    )
    .with_value(ratio)
}
