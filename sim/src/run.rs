//! One simulation: the repairer's own engine, policy, workflows, guard rails and embedded job queue
//! wired as `fleetmend repairer` wires them (an in-memory store instead of a file, no HTTP), on a
//! [`VirtualClock`], against the simulated fleet of `world.rs`.
//!
//! The loop is a discrete-event simulation. Each pass lets every task of the repairer run until
//! none can go on (a single-threaded tokio runtime whose own timer is paused: a timer of the
//! runtime fires only once every task waits, so the loop's own 1 ms sleep returning means the
//! repairer is idle), carries out the provider calls made meanwhile, schedules the heartbeats that
//! pick up waiting commands, and then moves the virtual clock straight to whichever comes first:
//! the earliest sleeper of the repairer (a tick, a workflow's timeout) or the next happening of
//! the world (a fault, a heartbeat, a reboot ending). Nothing waits on the wall clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleetmend_repairer::clock::{Clock, SharedClock, VirtualClock};
use fleetmend_repairer::commands::CommandQueue;
use fleetmend_repairer::engine::{Engine, EngineParts, Nodes};
use fleetmend_repairer::metrics::RepairerMetrics;
use fleetmend_repairer::model::{Event, EventKind, NodeState, RuleAction, Severity};
use fleetmend_repairer::ports::{EventLog, FleetView, ReportObserver};
use fleetmend_repairer::queue::{CheckpointEvery, JobQueue, JobSpec, MAX_RESTARTS, QueuePorts};
use fleetmend_repairer::scheduler::Scheduler;
use fleetmend_repairer::store::Store;

use crate::catalog::FaultCatalog;
use crate::config::{Interval, SchedulerModel, SimConfig};
use crate::failures::{FailureEvent, FailureStream};
use crate::gang::GangScheduler;
use crate::job::SimJob;
use crate::model::EttrModel;
use crate::noise::{FalseAction, NoiseFigures};
use crate::ports::{Presence, SimProvider};
use crate::report::{FailureFigures, RepairFigures, Setting, SimReport};
use crate::spares::{OutOfService, SpareFigures};
use crate::store::MemoryStore;
use crate::world::{FaultSpan, Happening, Parts, SimNode, World};

/// Where the virtual clock starts: 2026-01-01T00:00:00Z (any fixed time would do; a fixed one
/// keeps the event log of a seed the same).
const START_MS: u64 = 1_767_225_600_000;

/// A simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Config(#[from] crate::config::SimConfigError),
    #[error("the failure settings: {0}")]
    Failures(String),
    #[error("building the repairer: {0}")]
    Repairer(String),
    #[error("starting the simulation's runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs one simulation of `config`; `progress` is told the share of simulated time done (0 to 1).
pub fn simulate(
    config: &SimConfig,
    progress: Option<&(dyn Fn(f64) + Sync)>,
) -> Result<SimReport, SimError> {
    simulate_recorded(config, progress).map(|(report, _)| report)
}

/// [`simulate`], with every event the repairer wrote to its audit log, oldest first.
pub fn simulate_recorded(
    config: &SimConfig,
    progress: Option<&(dyn Fn(f64) + Sync)>,
) -> Result<(SimReport, Vec<Event>), SimError> {
    simulate_on(config, progress, Store::from_backend(MemoryStore::new()))
}

/// [`simulate_recorded`] with the repairer writing to `store`.
pub fn simulate_on(
    config: &SimConfig,
    progress: Option<&(dyn Fn(f64) + Sync)>,
    store: Store,
) -> Result<(SimReport, Vec<Event>), SimError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(SimError::Runtime)?;
    // The workflows' retry jitter draws from the thread's generator: seeded, a run repeats.
    fastrand::seed(config.fleet.seed);
    runtime.block_on(run(config.clone(), progress, store))
}

async fn run(
    config: SimConfig,
    progress: Option<&(dyn Fn(f64) + Sync)>,
    store: Store,
) -> Result<(SimReport, Vec<Event>), SimError> {
    let horizon = config.fleet.duration;
    let (catalog, mut stream, lemons) = fault_source(&config)?;
    let clock = VirtualClock::new(START_MS);
    let shared: SharedClock = clock.clone();
    let mut world = build(&config, catalog, shared.clone(), store)?;
    let end = START_MS + horizon.as_millis() as u64;
    for (i, fault) in config.events.iter().enumerate() {
        let category = SimConfig::scripted_category(fault, &world.catalog)
            .map_err(|message| SimError::Failures(format!("event[{i}]: {message}")))?;
        let nodes = fault.nodes.unwrap_or_else(|| {
            (f64::from(config.fleet.nodes) * fault.fraction.unwrap_or(0.0)).round() as u32
        });
        let slots: Vec<u32> = (0..nodes.min(config.fleet.nodes)).collect();
        let at = START_MS + fault.at.as_millis() as u64;
        world.schedule(at, Happening::Fault { slots, category, correlated: true });
    }
    world.join_all();
    submit_jobs(&mut world)?;
    world.start_noise();
    let mut next_failure = stream.next();
    let mut last_told = 0.0;
    let mut out_of_service = OutOfService::default();
    loop {
        while let Some(failure) =
            next_failure.take_if(|f| START_MS + f.at.as_millis() as u64 <= clock.now_ms())
        {
            world.handle(Happening::Fault {
                slots: failure.nodes.clone(),
                category: failure.category,
                correlated: failure.correlated,
            });
            next_failure = stream.next();
        }
        // What a fault or a happening woke runs before the next instant is chosen: the
        // repairer's loops wait for what is due, and a loop woken by new input has not yet said
        // when that is.
        settle(&mut world).await;
        out_of_service.observe(clock.now_ms(), world.out_of_service());
        let failure_at = next_failure.as_ref().map(|f| START_MS + f.at.as_millis() as u64);
        let next = [clock.next_deadline(), world.next_at(), failure_at].into_iter().flatten().min();
        let Some(next) = next.filter(|at| *at < end) else { break };
        clock.advance_to(next.max(clock.now_ms()));
        world.tally.events += 1;
        let now = clock.now_ms();
        while let Some(what) = world.pop_due(now) {
            world.handle(what);
        }
        if let Some(tell) = progress {
            let done = (now - START_MS) as f64 / (end - START_MS) as f64;
            if done - last_told >= 0.001 {
                tell(done);
                last_told = done;
            }
        }
    }
    clock.advance_to(end);
    settle(&mut world).await;
    if let Some(tell) = progress {
        tell(1.0);
    }
    let events = audit_log(&world);
    let mut report = report(&config, &mut world, &lemons, end, &events);
    report.spares = out_of_service.figures(end);
    if config.noise.enabled {
        report.noise = Some(noise_figures(&world, &events, end));
    }
    Ok((report, events))
}

/// Where the faults come from, with the catalog they are drawn from and the lemon nodes: a
/// replayed history (`--replay`, [`crate::replay`]), else the catalog's random failure stream.
fn fault_source(config: &SimConfig) -> Result<(FaultCatalog, Faults, Vec<u32>), SimError> {
    if let Some(replay) = &config.replay {
        let failures = Box::new(replay.failures.clone().into_iter());
        return Ok((replay.catalog.clone(), failures, Vec::new()));
    }
    let catalog = config.catalog()?;
    let failure_config = config.failure_config(&catalog);
    let stream =
        FailureStream::new(&failure_config, &catalog, config.fleet.seed, config.fleet.duration)
            .map_err(|err| SimError::Failures(err.to_string()))?;
    let lemons = stream.lemons();
    Ok((catalog, Box::new(stream), lemons))
}

/// The failures of a run, in time order.
type Faults = Box<dyn Iterator<Item = FailureEvent>>;

/// Every event in the repairer's store, oldest first.
fn audit_log(world: &World) -> Vec<Event> {
    let store = world.engine.store();
    let mut all = Vec::new();
    loop {
        let after = all.last().map_or(0, |e: &Event| e.id);
        match store.events(after, None, 10_000) {
            Ok(events) if !events.is_empty() => all.extend(events),
            _ => return all,
        }
    }
}

/// Lets the repairer's tasks run until every one waits, carrying out what they asked of the
/// world meanwhile.
async fn settle(world: &mut World) {
    loop {
        // The runtime's paused timer fires only once no task can run.
        tokio::time::sleep(Duration::from_millis(1)).await;
        world.provider_calls();
        world.gang_settle();
        world.schedule_heartbeats();
        let now = world.now();
        let mut any = false;
        while let Some(what) = world.pop_due(now) {
            world.handle(what);
            any = true;
        }
        if !any {
            return;
        }
    }
}

fn build(
    config: &SimConfig,
    catalog: crate::catalog::FaultCatalog,
    clock: SharedClock,
    store: Store,
) -> Result<World, SimError> {
    let repairer_err = |err: &dyn std::fmt::Display| SimError::Repairer(err.to_string());
    let store = Arc::new(store);
    let metrics = Arc::new(RepairerMetrics::new());
    let events = Arc::new(EventLog::new(store, metrics.clone()));
    let presence = Presence::new(clock.clone());
    let nodes = Arc::new(
        Nodes::load(events.clone())
            .map_err(|e| repairer_err(&e))?
            .with_heartbeats(presence.clone()),
    );
    let commands = Arc::new(CommandQueue::new());
    let settings = &config.repairer;
    let engine_config = settings.engine.clone();
    let window = engine_config.report_interval.saturating_mul(engine_config.unreachable_after);
    let fleet = nodes.clone() as Arc<dyn FleetView>;
    let (queue, gang, scheduler, observer): (_, _, Arc<dyn Scheduler>, _) =
        match config.job.scheduler {
            SchedulerModel::Queue => {
                let ports = QueuePorts {
                    events: events.clone(),
                    commands: commands.clone(),
                    fleet: fleet.clone(),
                    clock: clock.clone(),
                    // The simulated job reports no step times: no stragglers to raise.
                    findings: None,
                };
                let queue = JobQueue::load(
                    settings.queue.clone(),
                    ports,
                    window,
                    "http://fleetmend-simulated:9830",
                )
                .map_err(|e| repairer_err(&e))?;
                let observer = Some(queue.clone() as Arc<dyn ReportObserver>);
                (Some(queue.clone()), None, queue as Arc<dyn Scheduler>, observer)
            }
            SchedulerModel::Gang => {
                let gang =
                    GangScheduler::new(clock.clone(), fleet.clone(), settings.queue.spare_pool);
                (None, Some(gang.clone()), gang as Arc<dyn Scheduler>, None)
            }
        };
    let provider = SimProvider::new(clock.clone(), presence.clone());
    let engine = Engine::new(EngineParts {
        clock: clock.clone(),
        events,
        nodes,
        metrics,
        policy: settings.policy.clone(),
        config: engine_config,
        scheduler,
        provider: provider.clone(),
        commands: commands.clone(),
        observer,
        tracer: None,
        // The simulated fleet has no links to measure.
        prober: None,
        inventory: None,
    })
    .map_err(|e| repairer_err(&e))?;
    engine.start().map_err(|e| repairer_err(&e))?;
    if let Some(queue) = &queue {
        queue.start();
    }
    Ok(World::new(Parts {
        config: config.clone(),
        catalog,
        clock,
        engine,
        queue,
        gang,
        fleet,
        commands,
        presence,
        provider,
    }))
}

/// Submits the job(s): the fleet less its spares, in equal shares.
fn submit_jobs(world: &mut World) -> Result<(), SimError> {
    let job = world.config.job.clone();
    let fleet = &world.config.fleet;
    let total = fleet.nodes - fleet.spares;
    let share = total / job.jobs;
    let step_s = job.step_time.as_secs_f64();
    let (checkpoint_every, interval_s) = match job.checkpoint_every {
        Interval::Every(every) => {
            let steps = (every.as_secs_f64() / step_s).round().max(1.0) as u64;
            (CheckpointEvery::Steps(steps), every.as_secs_f64())
        }
        // Until the queue's first answer: its prior MTBF's Young/Daly interval.
        Interval::Auto => {
            let prior = world.config.repairer.queue.mtbf_prior.as_secs_f64();
            let w = job.checkpoint_write.as_secs_f64().max(step_s);
            (CheckpointEvery::Auto, (2.0 * w * prior).sqrt())
        }
    };
    let now = world.now();
    for i in 0..job.jobs {
        let id = format!("train-{i}");
        let id = match &world.queue {
            Some(queue) => {
                let spec = JobSpec {
                    name: Some(id),
                    argv: vec!["train".to_owned()],
                    nodes: share,
                    priority: 0,
                    checkpoint_dir: format!("/checkpoints/train-{i}"),
                    // A simulated job restarts as often as the fleet fails under it: the most a
                    // job may ask for.
                    max_restarts: MAX_RESTARTS,
                    checkpoint_every: Some(checkpoint_every),
                    env: BTreeMap::new(),
                };
                let view = queue
                    .submit(spec, "simulate")
                    .map_err(|e| SimError::Repairer(e.to_string()))?;
                view.job.id.clone()
            }
            None => {
                world.submit_gang(&id, share, u64::from(i));
                id
            }
        };
        world.jobs.insert(id.clone(), SimJob::new(&id, share, "", interval_s, now));
    }
    Ok(())
}

fn report(
    config: &SimConfig,
    world: &mut World,
    lemons: &[u32],
    end: u64,
    events: &[Event],
) -> SimReport {
    let held = world.held();
    let wall_s = (end - START_MS) as f64 / 1000.0;
    let mut jobs = Vec::new();
    for job in world.jobs.values_mut() {
        job.accrue(end, held);
        if job.interrupted.is_some() {
            job.account_interruption(end, end, held);
        }
    }
    for job in world.jobs.values() {
        let restarts = match &world.queue {
            Some(queue) => queue.job(&job.id).map_or(0, |v| v.job.restarts),
            None => world.gang_restarts(&job.id).unwrap_or(0),
        };
        jobs.push(job.result(wall_s, restarts, job.interval_s));
    }
    let ettr = if jobs.is_empty() {
        0.0
    } else {
        jobs.iter().map(|j| j.ettr).sum::<f64>() / jobs.len() as f64
    };
    let interruptions: u32 = jobs.iter().map(|j| j.interruptions).sum();
    let catalog = &world.catalog;
    let rate = config.failures.rate_per_node_day.unwrap_or_else(|| catalog.rate_per_node_day());
    let job_nodes = jobs.first().map_or(config.fleet.nodes, |j| j.nodes);
    let interval_s = jobs.first().map_or(1800.0, |j| j.checkpoint_interval_seconds);
    let model = EttrModel {
        nodes: job_nodes,
        failures_per_node_day: rate,
        restart_overhead: config.job.restart,
        checkpoint_interval: Duration::from_secs_f64(interval_s.max(1.0)),
        checkpoint_write: config.job.checkpoint_write,
    };
    let tally = world.tally.clone();
    let repairs = repair_figures(world, lemons, &tally, events);
    let failures = FailureFigures {
        node_failures: tally.node_failures,
        by_category: tally.by_category.clone(),
        correlated_events: tally.correlated_events,
        lemon_nodes: lemons.len() as u32,
        silent_repair_failures: tally.silent_repair_failures,
    };
    SimReport {
        setting: Setting {
            nodes: config.fleet.nodes,
            gpus_per_node: config.fleet.gpus_per_node,
            days: config.fleet.duration.as_secs_f64() / 86_400.0,
            spares: config.fleet.spares,
            seed: config.fleet.seed,
            jobs: config.job.jobs,
            checkpoint_every: config.job.checkpoint_every.to_string(),
            checkpoint_write_seconds: config.job.checkpoint_write.as_secs_f64(),
            restart_seconds: config.job.restart.as_secs_f64(),
            failures_per_node_day: rate,
            catalog: catalog.source.clone(),
        },
        ettr,
        jobs,
        model_ettr: model.expected_ettr().unwrap_or(0.0),
        failures,
        repairs,
        mtbi_hours: (interruptions > 0).then(|| wall_s / 3600.0 / f64::from(interruptions)),
        sim_events: tally.events,
        spares: SpareFigures::default(),
        noise: None,
    }
}

/// What the repairer did, from its own event log.
fn repair_figures(
    world: &World,
    lemons: &[u32],
    tally: &crate::world::Tally,
    events: &[Event],
) -> RepairFigures {
    let mut figures = RepairFigures {
        reboots: tally.reboots,
        replacements: tally.replacements,
        spares_used: tally.spares_used,
        ..RepairFigures::default()
    };
    for event in events {
        match event.kind {
            EventKind::Decision => {
                let action = event.action.map_or("none".to_owned(), |a| a.to_string());
                *figures.decisions.entry(action).or_default() += 1;
            }
            EventKind::ActionHeld => figures.actions_held += 1,
            EventKind::Breaker if event.severity == Severity::Critical => {
                figures.breaker_openings += 1;
            }
            EventKind::RepairFinished => {
                let action = event.action.unwrap_or(RuleAction::Alert).to_string();
                let outcome = if event.reason.contains("escalating") {
                    "escalated"
                } else if event.severity == Severity::Critical {
                    "quarantined"
                } else {
                    "finished"
                };
                *figures
                    .workflows
                    .entry(action)
                    .or_default()
                    .entry(outcome.to_owned())
                    .or_default() += 1;
            }
            _ => {}
        }
    }
    let lemon_slots: std::collections::BTreeSet<u32> = lemons.iter().copied().collect();
    for record in world.engine.nodes() {
        if record.state == NodeState::Quarantined {
            figures.quarantined += 1;
            if world.nodes.get(&record.name).is_some_and(|n| lemon_slots.contains(&n.slot)) {
                figures.quarantined_lemons += 1;
            }
        }
    }
    figures
}

/// What the noise run shows: every drain, reboot, replacement or quarantine a rule decided on a
/// node that carried no fault then (a false action), and every fault asking for an action that
/// no rule acted on before it ended.
fn noise_figures(world: &World, events: &[Event], end: u64) -> NoiseFigures {
    let mut spans: BTreeMap<&str, Vec<&FaultSpan>> = BTreeMap::new();
    for span in &world.spans {
        spans.entry(span.node.as_str()).or_default().push(span);
    }
    let faulted_at = |node: &str, at: u64| {
        spans.get(node).is_some_and(|spans| {
            spans.iter().any(|s| s.since_ms <= at && s.until_ms.is_none_or(|until| at <= until))
        })
    };
    let days = world.config.fleet.duration.as_secs_f64() / 86_400.0;
    let mut figures = NoiseFigures {
        node_days: f64::from(world.config.fleet.nodes) * days,
        injected: world.noise_tally.injected.clone(),
        kernel_lines: world.nodes.values().filter_map(|n| n.noise.as_ref()).map(|n| n.lines).sum(),
        ..NoiseFigures::default()
    };
    let mut acted: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for event in
        events.iter().filter(|e| e.kind == EventKind::Decision && e.actor.0.starts_with("rule:"))
    {
        let (Some(node), Some(action)) = (event.node.as_deref(), event.action) else { continue };
        let acts = action.is_disruptive() || event.severity == Severity::Critical;
        if !acts {
            if !faulted_at(node, event.at_ms) {
                figures.alerts_on_healthy += 1;
                for finding in &event.findings {
                    let name = format!("{}/{}", finding.check, finding.finding);
                    *figures.alerts_by_finding.entry(name).or_default() += 1;
                }
            }
            continue;
        }
        acted.entry(node).or_default().push(event.at_ms);
        if !faulted_at(node, event.at_ms) {
            figures.false_actions.push(FalseAction {
                at_ms: event.at_ms,
                node: node.to_owned(),
                action: action.to_string(),
                rule: event.actor.0.trim_start_matches("rule:").to_owned(),
                reason: event.reason.clone(),
            });
        }
    }
    figures.false_actions_per_1000_node_days =
        figures.false_actions.len() as f64 * 1000.0 / figures.node_days.max(f64::MIN_POSITIVE);
    for span in
        world.spans.iter().filter(|s| SimNode::fault_asks_for_action(&world.catalog, s.category))
    {
        figures.real_faults += 1;
        let until = span.until_ms.unwrap_or(end);
        let found = acted
            .get(span.node.as_str())
            .is_some_and(|ats| ats.iter().any(|at| (span.since_ms..=until).contains(at)));
        if found {
            figures.real_faults_acted_on += 1;
        } else {
            let category = &world.catalog.categories[span.category].name;
            figures
                .real_faults_missed
                .push(format!("{} {category} at {}", span.node, span.since_ms));
        }
    }
    figures
}
