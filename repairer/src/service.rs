//! `fleetmend repairer`: builds every part from the config and serves until asked to stop.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::alerts::Alerts;
use crate::allreduce::{Prober, ProberPorts};
use crate::api::{self, ApiState};
use crate::clock::{SharedClock, SystemClock};
use crate::commands::CommandQueue;
use crate::config::{RepairerConfig, SchedulerKind};
use crate::engine::{Engine, EngineError, EngineParts, Nodes};
use crate::identity::NodeTokens;
use crate::inventory::Inventory;
use crate::metrics::RepairerMetrics;
use crate::model::FindingSource;
use crate::ports::{EventLog, JobFinding, ReportObserver};
use crate::provider::Provider;
use crate::provider::config::{ProviderDeps, build as build_provider};
use crate::queue::{JobQueue, QueuePorts};
use crate::scheduler::slurm::SlurmScheduler;
use crate::scheduler::slurm::spares::SlurmSpares;
use crate::scheduler::{MemoryScheduler, Scheduler};
use crate::store::Store;
use crate::workflow::trace::WorkflowTracer;

/// The repairer could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] crate::config::RepairerConfigError),
    #[error("opening the store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("building the provider: {0}")]
    Provider(#[from] crate::provider::config::ProviderBuildError),
    #[error("setting up alert sinks: {0}")]
    Alerts(#[from] crate::alerts::AlertsError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("listening on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("serving HTTP: {0}")]
    Serve(std::io::Error),
    #[error("setting up traces: {0}")]
    Telemetry(#[from] crate::workflow::trace::TelemetryError),
    #[error(transparent)]
    Queue(#[from] crate::queue::QueueError),
    #[error("node tokens: {0}")]
    Identity(#[from] crate::identity::IdentityError),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
}

/// A started repairer.
pub struct Repairer {
    pub engine: Arc<Engine>,
    pub scheduler: Arc<dyn Scheduler>,
    pub local_addr: SocketAddr,
    /// Exports the workflows' traces (when `[telemetry] otlp_endpoint` is set).
    pub tracer: Option<Arc<WorkflowTracer>>,
    /// The embedded job queue (`scheduler = "embedded"` and no scheduler given).
    pub queue: Option<Arc<JobQueue>>,
    server: tokio::task::JoinHandle<Result<(), ServiceError>>,
    /// Keeps Slurm's hot spares (`scheduler = "slurm"`); stopped with the server.
    spares: Option<tokio::task::JoinHandle<()>>,
    /// Keeps the inventory current (its file, Slurm's list); stopped with the server.
    inventory_watch: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Repairer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repairer").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

impl Repairer {
    /// Waits until the server stops (SIGTERM, Ctrl-C) or fails.
    pub async fn wait(self) -> Result<(), ServiceError> {
        let result = match self.server.await {
            Ok(result) => result,
            Err(_) => Ok(()),
        };
        for task in [&self.spares, &self.inventory_watch].into_iter().flatten() {
            task.abort();
        }
        // Spans still queued go out before the process ends.
        if let Some(tracer) = &self.tracer
            && let Err(err) = tracer.shutdown().await
        {
            tracing::warn!(error = %err, "exporting the last traces failed");
        }
        result
    }

    /// Exports every ended span now (tests; the stop does it by itself).
    pub async fn flush_traces(&self) -> Result<(), ServiceError> {
        match &self.tracer {
            Some(tracer) => Ok(tracer.flush().await?),
            None => Ok(()),
        }
    }
}

/// Starts the repairer: store, scheduler, provider, engine (resuming open workflows), alert
/// sinks and the HTTP server. `shutdown` ends the server when it completes.
pub async fn start(
    config: RepairerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Repairer, ServiceError> {
    start_with(config, None, None, shutdown).await
}

/// [`start`] with the scheduler and provider given instead of built from the config (tests give
/// fakes that record their calls).
pub async fn start_with(
    config: RepairerConfig,
    scheduler: Option<Arc<dyn Scheduler>>,
    provider: Option<Arc<dyn Provider>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Repairer, ServiceError> {
    let given = Given { scheduler, provider, clock: SystemClock::shared() };
    start_given(config, given, shutdown).await
}

/// What a caller may give the repairer instead of what its config builds.
#[derive(Clone)]
pub struct Given {
    pub scheduler: Option<Arc<dyn Scheduler>>,
    pub provider: Option<Arc<dyn Provider>>,
    /// The clock every part reads (a virtual one in tests and simulations).
    pub clock: SharedClock,
}

impl std::fmt::Debug for Given {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Given").field("clock", &self.clock).finish_non_exhaustive()
    }
}

/// [`start`] with what `given` gives. The parts are built in one pass, each from the ports made
/// before it: store → event log → nodes → scheduler (the queue) → engine → alert sinks → API.
pub async fn start_given(
    config: RepairerConfig,
    given: Given,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Repairer, ServiceError> {
    let tokens = config.tokens()?;
    let node_tokens =
        config.node_tokens_file.as_deref().map(NodeTokens::load).transpose()?.map(Arc::new);
    if let Some(path) = config.store.sqlite_path() {
        make_store_folder(path);
    }
    let clock = given.clock;
    let store = Arc::new(Store::connect(&config.store)?);
    let metrics = Arc::new(RepairerMetrics::new());
    let events = Arc::new(EventLog::new(store.clone(), metrics.clone()));
    let nodes = Arc::new(Nodes::load(events.clone())?);
    let (inventory, inventory_watch) = start_inventory(&config, &events, &nodes, &clock).await?;
    let commands = Arc::new(CommandQueue::new());
    // Bound first: the queue hands its address to the ranks it starts.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServiceError::Listen { addr: config.listen, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| ServiceError::Listen { addr: config.listen, source })?;
    let unreachable_window =
        config.engine.report_interval.saturating_mul(config.engine.unreachable_after);
    let mut slurm_spares = None;
    let mut job_findings = None;
    let (scheduler, queue): (Arc<dyn Scheduler>, Option<Arc<JobQueue>>) =
        match (given.scheduler, config.scheduler) {
            (Some(scheduler), _) => (scheduler, None),
            (None, SchedulerKind::Memory) => (Arc::new(MemoryScheduler::new()), None),
            (None, SchedulerKind::Embedded) => {
                let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
                job_findings = Some(receiver);
                let ports = QueuePorts {
                    events: events.clone(),
                    commands: commands.clone(),
                    fleet: nodes.clone(),
                    clock: clock.clone(),
                    findings: Some(sender),
                };
                let base = config.queue.progress_base(local_addr, &hostname());
                let queue = JobQueue::load(config.queue.clone(), ports, unreachable_window, &base)?;
                (queue.clone(), Some(queue))
            }
            (None, SchedulerKind::Slurm) => {
                let slurm = Arc::new(SlurmScheduler::new(config.slurm.clone()));
                slurm_spares = Some(SlurmSpares {
                    scheduler: slurm.clone(),
                    events: events.clone(),
                    nodes: nodes.clone(),
                    clock: clock.clone(),
                });
                (slurm, None)
            }
        };
    let provider = match given.provider {
        Some(provider) => provider,
        None => build_provider(
            &config.provider,
            &ProviderDeps { commands: commands.clone(), slurm: config.slurm.clone() },
        )?,
    };
    let tracer = WorkflowTracer::from_config(&config.telemetry)?.map(Arc::new);
    let (probe_sender, probe_findings) = tokio::sync::mpsc::unbounded_channel();
    let prober = config.allreduce.enabled().then(|| {
        let ports = ProberPorts {
            clock: clock.clone(),
            nodes: nodes.clone(),
            commands: commands.clone(),
            scheduler: scheduler.clone(),
            findings: Some(probe_sender),
            unreachable_window,
            instance: clock.now_ms(),
            metrics: metrics.clone(),
        };
        Prober::new(config.allreduce.clone(), ports)
    });
    let engine = Engine::new(EngineParts {
        clock: clock.clone(),
        events: events.clone(),
        nodes,
        metrics: metrics.clone(),
        policy: config.policy.clone(),
        config: config.engine.clone(),
        scheduler: scheduler.clone(),
        provider,
        commands,
        observer: queue.clone().map(|q| q as Arc<dyn ReportObserver>),
        tracer: tracer.clone(),
        prober: prober.clone(),
        inventory: inventory.clone(),
    })?;
    let alerts = start_alerts(&config.alerts, &store, &clock, &events)?;
    engine.start()?;
    if let Some(findings) = job_findings {
        tokio::spawn(forward_findings(findings, engine.clone(), FindingSource::Job));
    }
    start_prober(prober, probe_findings, &engine);
    if let Some(queue) = &queue {
        queue.start();
    }
    let spares = slurm_spares.map(|keeper| tokio::spawn(keeper.run()));
    let api =
        ApiParts { engine: engine.clone(), queue: queue.clone(), alerts, tokens, node_tokens };
    let server = serve(listener, api_state(api, &config), &config, shutdown)?;
    Ok(Repairer { engine, scheduler, local_addr, tracer, queue, server, spares, inventory_watch })
}

/// What the API is built from, besides the config.
struct ApiParts {
    engine: Arc<Engine>,
    queue: Option<Arc<JobQueue>>,
    alerts: Option<Arc<Alerts>>,
    tokens: crate::config::Tokens,
    node_tokens: Option<Arc<crate::identity::NodeTokens>>,
}

/// The API's shared state: `parts`, its counters and the rate limits of `config`.
fn api_state(parts: ApiParts, config: &RepairerConfig) -> Arc<ApiState> {
    let ApiParts { engine, queue, alerts, tokens, node_tokens } = parts;
    Arc::new(ApiState {
        engine,
        queue,
        alerts,
        tokens,
        node_tokens,
        inbound: config.inbound.clone(),
        max_body_bytes: config.max_body_bytes,
        reports: Default::default(),
        refused: Default::default(),
        subscriptions: Mutex::new(Vec::new()),
        limits: crate::limits::RateLimits::new(&config.rate_limits),
        listener: Arc::default(),
    })
}

/// Serves the API of `state` on `listener` under `[listener]`'s deadlines and cap, over TLS with
/// `[tls]`'s certificate (read again on SIGHUP and when its files change).
fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ApiState>,
    config: &RepairerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<Result<(), ServiceError>>, ServiceError> {
    let stats = state.listener.clone();
    let app = api::router(state);
    let certificates = match &config.tls {
        Some(tls) => Some(crate::tls::Certificates::load(tls)?),
        None => None,
    };
    let plain_off_loopback = listener.local_addr().is_ok_and(|a| !a.ip().is_loopback());
    if certificates.is_none() && plain_off_loopback {
        tracing::warn!(listen = %config.listen, "insecure: plain HTTP on a non-loopback address, tokens and reports travel in the clear (a lab only)");
    }
    let limits = config.listener;
    // Said before the first connection is served: whoever got an answer finds it in the log.
    let scheme = if certificates.is_some() { "https" } else { "http" };
    let listen = listener.local_addr().unwrap_or(config.listen);
    tracing::info!(%listen, scheme, mode = config.policy.mode.as_str(), store = %config.store, "repairer started");
    Ok(match certificates {
        Some(certificates) => {
            let tls = crate::tls::TlsHandshake::new(certificates.server_config());
            certificates.watch();
            tokio::spawn(async move {
                fleetmend_listener::serve(listener, app, tls, limits, stats, shutdown)
                    .await
                    .map_err(ServiceError::Serve)
            })
        }
        None => tokio::spawn(async move {
            fleetmend_listener::serve(
                listener,
                app,
                fleetmend_listener::Plain,
                limits,
                stats,
                shutdown,
            )
            .await
            .map_err(ServiceError::Serve)
        }),
    })
}

/// The inventory, where one is configured, and the task that keeps it current. Each stored node
/// is marked in or out of it first (the config may have changed since the nodes were stored; with
/// no inventory every node is in).
async fn start_inventory(
    config: &RepairerConfig,
    events: &Arc<EventLog>,
    nodes: &Arc<Nodes>,
    clock: &SharedClock,
) -> Result<(Option<Arc<Inventory>>, Option<tokio::task::JoinHandle<()>>), ServiceError> {
    let inventory = match &config.inventory {
        Some(inventory) => Some(Inventory::load(inventory, &config.slurm, events.clone()).await?),
        None => None,
    };
    let known = |name: &str| inventory.as_ref().is_none_or(|i| i.contains(name));
    let moved = nodes.apply_inventory(known, clock.now_ms()).map_err(EngineError::from)?;
    let Some(inventory) = inventory else { return Ok((None, None)) };
    let unknown = nodes.unknown_count();
    tracing::info!(nodes = inventory.len(), unknown, moved, "inventory read");
    let watch = watch_inventory(inventory.clone(), nodes.clone(), clock.clone());
    Ok((Some(inventory), Some(watch)))
}

/// Keeps the inventory current, marking the nodes in or out of it after each change.
fn watch_inventory(
    inventory: Arc<Inventory>,
    nodes: Arc<Nodes>,
    clock: SharedClock,
) -> tokio::task::JoinHandle<()> {
    let current = inventory.clone();
    let now = clock.clone();
    tokio::spawn(inventory.watch(clock, move || {
        if let Err(err) = nodes.apply_inventory(|name| current.contains(name), now.now_ms()) {
            tracing::error!(error = %err, "marking the nodes in or out of the changed inventory failed");
        }
    }))
}

/// Starts the alerts' delivery, where sinks are configured, woken by every event appended.
fn start_alerts(
    config: &crate::alerts::AlertsConfig,
    store: &Arc<Store>,
    clock: &SharedClock,
    events: &Arc<EventLog>,
) -> Result<Option<Arc<Alerts>>, ServiceError> {
    if config.sinks.is_empty() {
        return Ok(None);
    }
    let alerts = Arc::new(Alerts::with_clock(config.clone(), store.clone(), clock.clone())?);
    tokio::spawn(alerts.clone().run());
    let (wake, notify) = (alerts.clone(), events.appended());
    tokio::spawn(async move {
        loop {
            notify.notified().await;
            wake.wake();
        }
    });
    Ok(Some(alerts))
}

/// Starts the allreduce probe, where it is enabled, with its findings going to `engine`.
fn start_prober(
    prober: Option<Arc<Prober>>,
    findings: tokio::sync::mpsc::UnboundedReceiver<JobFinding>,
    engine: &Arc<Engine>,
) {
    if let Some(prober) = prober {
        tokio::spawn(forward_findings(findings, engine.clone(), FindingSource::Probe));
        prober.start();
    }
}

/// Hands the queue's findings (stragglers, repeated hangs) or the allreduce probe's (slow nodes)
/// to the engine's ingest, as an alert's, from `source`.
async fn forward_findings(
    mut findings: tokio::sync::mpsc::UnboundedReceiver<JobFinding>,
    engine: Arc<Engine>,
    source: FindingSource,
) {
    while let Some(JobFinding { node, finding, firing }) = findings.recv().await {
        if let Err(err) = engine.ingest_external(&node, source, &finding, firing) {
            tracing::warn!(%node, ?source, error = %err, "a finding was not taken in");
        }
    }
}

/// This host's name, for URLs other hosts reach it at (`localhost` when it cannot be read).
fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Makes the folder the store lives in; a failure is only logged (opening the store then says
/// what is wrong with the path).
fn make_store_folder(store: &std::path::Path) {
    if let Some(parent) = store.parent()
        && !parent.as_os_str().is_empty()
        && let Err(err) = std::fs::create_dir_all(parent)
    {
        tracing::warn!(path = %parent.display(), error = %err, "creating the store's folder failed");
    }
}
