//! `fleetmend repairer`: builds every part from the config and serves until asked to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;

use crate::alerts::Alerts;
use crate::allreduce::{Prober, ProberPorts};
use crate::api::{self, ApiState};
use crate::clock::{SharedClock, SystemClock};
use crate::commands::CommandQueue;
use crate::config::{RepairerConfig, SchedulerKind};
use crate::engine::{Engine, EngineError, EngineParts, Nodes};
use crate::identity::NodeTokens;
use crate::inventory::Inventory;
use crate::leadership::{Leadership, LostLeadership, Role};
use crate::metrics::RepairerMetrics;
use crate::model::{Actor, Event, EventKind, FindingSource, Severity};
use crate::ports::{EventLog, JobFinding, ReportObserver};
use crate::provider::Provider;
use crate::provider::config::{ProviderDeps, build as build_provider};
use crate::queue::{JobQueue, QueuePorts};
use crate::scheduler::slurm::SlurmScheduler;
use crate::scheduler::slurm::spares::SlurmSpares;
use crate::scheduler::{MemoryScheduler, Scheduler};
use crate::store::{Lease, Store};
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
    #[error("this repairer no longer leads: {0}")]
    LostLeadership(LostLeadership),
}

impl ServiceError {
    /// The exit status of `fleetmend repairer` for this error: 75 (EX_TEMPFAIL) when it stopped
    /// because another repairer leads — a supervisor starts it again, as a standby.
    pub fn exit_status(&self) -> u8 {
        match self {
            ServiceError::LostLeadership(_) => 75,
            _ => 2,
        }
    }
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
    /// What keeps Slurm's hot spares and the inventory current, and forwards findings; stopped
    /// with the server.
    background: Vec<tokio::task::JoinHandle<()>>,
    /// On a shared store: the wait for the lease and the keeping of it.
    election: Option<tokio::task::JoinHandle<()>>,
    leadership: Option<Arc<Leadership>>,
    switch: Arc<Switch>,
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
        for task in self.background.iter().chain(&self.election) {
            task.abort();
        }
        let result = match (result, self.switch.lost()) {
            (Ok(()), Some(why)) => Err(ServiceError::LostLeadership(why)),
            (result, _) => result,
        };
        // A clean stop hands the lead over at once rather than when the lease lapses.
        if result.is_ok()
            && let Some(leadership) = self.leadership.clone()
        {
            let _ = tokio::task::spawn_blocking(move || leadership.release()).await;
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
///
/// On a store shared by several repairers (PostgreSQL) this repairer leads only while it holds
/// the store's lease ([`crate::leadership`]): until then it is a standby whose parts are built
/// from the store again each time it changes, never started, and whose API answers reads and
/// sends writes to the leader; once it takes the lease it builds them afresh and starts them, as
/// a repairer starting on its own store does.
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
    let store = Arc::new(Store::connect(&config.store)?);
    // Bound first: the queue hands its address to the ranks it starts.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServiceError::Listen { addr: config.listen, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| ServiceError::Listen { addr: config.listen, source })?;
    let leadership = config.store.sqlite_path().is_none().then(|| {
        let this = advertised_url(&config, local_addr);
        Leadership::new((*store).clone(), config.leadership.clone(), this)
    });
    let metrics = Arc::new(RepairerMetrics::new());
    let events = Arc::new(EventLog::new(store.clone(), metrics.clone()));
    let shared = Shared::new(&config, given, events, metrics, local_addr, tokens, node_tokens)?;
    let inventory = load_inventory(&config, &shared.events).await?;
    let switch = Arc::new(Switch::default());
    let parts = match &leadership {
        None => Led::start(&config, &shared, inventory.clone(), None).await?,
        Some(leadership) => match leadership.try_lead().await {
            Ok(Some(taken)) => Led::start(&config, &shared, inventory.clone(), Some(taken)).await?,
            Ok(None) => Led::standby(&config, &shared, inventory.clone())?,
            Err(err) => {
                tracing::warn!(error = %err, "reading the leadership lease failed: starting as a standby");
                Led::standby(&config, &shared, inventory.clone())?
            }
        },
    };
    switch.set(api::router(api_state(&parts, &shared, leadership.clone())));
    let Led { engine, scheduler, queue, tasks } = parts;
    let tracer = shared.tracer.clone();
    let stats = shared.api.listener.clone();
    let server = serve(listener, switch.router(), stats, &config, switch.stopped_or(shutdown))?;
    let (background, election) = match &leadership {
        None => (tasks.handles, None),
        Some(leadership) => {
            let context = Election {
                config: config.clone(),
                shared,
                inventory,
                switch: switch.clone(),
                tasks,
            };
            (Vec::new(), Some(tokio::spawn(context.run(leadership.clone()))))
        }
    };
    Ok(Repairer {
        engine,
        scheduler,
        local_addr,
        tracer,
        queue,
        server,
        background,
        election,
        leadership,
        switch,
    })
}

/// What every build of the parts shares: made once per process.
struct Shared {
    clock: SharedClock,
    events: Arc<EventLog>,
    metrics: Arc<RepairerMetrics>,
    commands: Arc<CommandQueue>,
    provider: Arc<dyn Provider>,
    /// The scheduler the caller gave (tests); else each build makes the config's.
    scheduler: Option<Arc<dyn Scheduler>>,
    tracer: Option<Arc<WorkflowTracer>>,
    local_addr: SocketAddr,
    /// The API's counters and rate limits, kept across builds.
    api: api::ApiShared,
}

impl Shared {
    fn new(
        config: &RepairerConfig,
        given: Given,
        events: Arc<EventLog>,
        metrics: Arc<RepairerMetrics>,
        local_addr: SocketAddr,
        tokens: crate::config::Tokens,
        node_tokens: Option<Arc<NodeTokens>>,
    ) -> Result<Shared, ServiceError> {
        let commands = Arc::new(CommandQueue::new());
        let provider = match given.provider {
            Some(provider) => provider,
            None => build_provider(
                &config.provider,
                &ProviderDeps { commands: commands.clone(), slurm: config.slurm.clone() },
            )?,
        };
        Ok(Shared {
            clock: given.clock,
            events,
            metrics,
            commands,
            provider,
            scheduler: given.scheduler,
            tracer: WorkflowTracer::from_config(&config.telemetry)?.map(Arc::new),
            local_addr,
            api: api::ApiShared::new(config, tokens, node_tokens),
        })
    }
}

/// The parts built from the store: what the leader runs, or a standby reads.
struct Led {
    engine: Arc<Engine>,
    scheduler: Arc<dyn Scheduler>,
    queue: Option<Arc<JobQueue>>,
    /// Background work started with them (none on a standby).
    tasks: Started,
}

/// What a leader started besides the engine's and the queue's own ticks.
#[derive(Default)]
struct Started {
    alerts: Option<Arc<Alerts>>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

/// The parts before they are started, with the channels their findings come on.
struct Built {
    nodes: Arc<Nodes>,
    engine: Arc<Engine>,
    scheduler: Arc<dyn Scheduler>,
    queue: Option<Arc<JobQueue>>,
    prober: Option<Arc<Prober>>,
    job_findings: Option<tokio::sync::mpsc::UnboundedReceiver<JobFinding>>,
    probe_findings: tokio::sync::mpsc::UnboundedReceiver<JobFinding>,
    slurm_spares: Option<SlurmSpares>,
}

impl Led {
    /// Builds the parts from the store and starts them: this repairer leads (`taken`: the lease
    /// it took and the one before, on a shared store).
    async fn start(
        config: &RepairerConfig,
        shared: &Shared,
        inventory: Option<Arc<Inventory>>,
        taken: Option<(Lease, Option<Lease>)>,
    ) -> Result<Led, ServiceError> {
        if let Some((lease, previous)) = &taken {
            record_leadership(&shared.events, shared.clock.now_ms(), lease, previous.as_ref())?;
        }
        let built = build(config, shared, inventory.clone())?;
        let mut handles = Vec::new();
        if let Some(inventory) = inventory {
            let nodes = built.nodes.clone();
            let known = |name: &str| inventory.contains(name);
            let moved =
                nodes.apply_inventory(known, shared.clock.now_ms()).map_err(EngineError::from)?;
            tracing::info!(
                nodes = inventory.len(),
                unknown = nodes.unknown_count(),
                moved,
                "inventory read"
            );
            handles.push(watch_inventory(inventory, nodes, shared.clock.clone()));
        }
        let Built {
            engine,
            scheduler,
            queue,
            prober,
            job_findings,
            probe_findings,
            slurm_spares,
            ..
        } = built;
        let alerts = start_alerts(&config.alerts, engine.store(), &shared.clock, &shared.events)?;
        engine.start()?;
        if let Some(findings) = job_findings {
            handles.push(tokio::spawn(forward_findings(
                findings,
                engine.clone(),
                FindingSource::Job,
            )));
        }
        handles.extend(start_prober(prober, probe_findings, &engine));
        if let Some(queue) = &queue {
            queue.start();
        }
        handles.extend(slurm_spares.map(|keeper| tokio::spawn(keeper.run())));
        Ok(Led { engine, scheduler, queue, tasks: Started { alerts, handles } })
    }

    /// Builds the parts from the store for reading only: this repairer is a standby.
    fn standby(
        config: &RepairerConfig,
        shared: &Shared,
        inventory: Option<Arc<Inventory>>,
    ) -> Result<Led, ServiceError> {
        let Built { engine, scheduler, queue, .. } = build(config, shared, inventory)?;
        Ok(Led { engine, scheduler, queue, tasks: Started::default() })
    }
}

/// Builds every part from the store, starting none.
fn build(
    config: &RepairerConfig,
    shared: &Shared,
    inventory: Option<Arc<Inventory>>,
) -> Result<Built, ServiceError> {
    let Shared { clock, events, metrics, commands, .. } = shared;
    let nodes = Arc::new(Nodes::load(events.clone())?);
    let unreachable_window =
        config.engine.report_interval.saturating_mul(config.engine.unreachable_after);
    let mut slurm_spares = None;
    let mut job_findings = None;
    let (scheduler, queue): (Arc<dyn Scheduler>, Option<Arc<JobQueue>>) =
        match (shared.scheduler.clone(), config.scheduler) {
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
                let base = config.queue.progress_base(shared.local_addr, &hostname());
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
        nodes: nodes.clone(),
        metrics: metrics.clone(),
        policy: config.policy.clone(),
        config: config.engine.clone(),
        scheduler: scheduler.clone(),
        provider: shared.provider.clone(),
        commands: commands.clone(),
        observer: queue.clone().map(|q| q as Arc<dyn ReportObserver>),
        tracer: shared.tracer.clone(),
        prober: prober.clone(),
        inventory,
    })?;
    Ok(Built {
        nodes,
        engine,
        scheduler,
        queue,
        prober,
        job_findings,
        probe_findings,
        slurm_spares,
    })
}

/// Writes the audit event of this repairer taking the lead: a warning when the previous leader's
/// lease lapsed (it died, stopped or was cut off), info after a clean hand-over or at first.
fn record_leadership(
    events: &EventLog,
    now_ms: u64,
    lease: &Lease,
    previous: Option<&Lease>,
) -> Result<(), ServiceError> {
    let this = crate::leadership::holder_url(&lease.holder);
    let (severity, reason) = match previous {
        Some(previous) if previous.holder != lease.holder => (
            Severity::Warning,
            format!(
                "{this} leads at epoch {}: the lease of {} (epoch {}) lapsed unrenewed",
                lease.epoch,
                crate::leadership::holder_url(&previous.holder),
                previous.epoch
            ),
        ),
        _ => (Severity::Info, format!("{this} leads at epoch {}", lease.epoch)),
    };
    let event =
        Event::new(EventKind::LeaderChanged, severity, None, Actor::repairer(), reason, now_ms);
    events.record(&event).map_err(EngineError::from)?;
    Ok(())
}

/// A standby's wait for the lease, and the leader's keeping of it.
struct Election {
    config: RepairerConfig,
    shared: Shared,
    inventory: Option<Arc<Inventory>>,
    switch: Arc<Switch>,
    tasks: Started,
}

/// A standby reads the store again at least this often, changed or not.
const STANDBY_REBUILD: Duration = Duration::from_secs(10);

impl Election {
    /// Waits as a standby (rebuilding its read-only parts as the store changes) until it takes
    /// the lease, leads until it loses it, then stops the server with the reason.
    async fn run(self, leadership: Arc<Leadership>) {
        let Election { config, shared, inventory, switch, tasks } = self;
        let mut tasks = tasks;
        if leadership.role() == Role::Standby {
            let mut seen = shared.events.store().newest_event_id().unwrap_or(0);
            let clock = shared.clock.clone();
            let mut built_at = clock.now_ms();
            loop {
                clock.sleep(config.leadership.poll).await;
                match leadership.try_lead().await {
                    Ok(Some(taken)) => {
                        match Led::start(&config, &shared, inventory.clone(), Some(taken)).await {
                            Ok(led) => {
                                tracing::info!(epoch = leadership.epoch(), "this repairer leads");
                                let state = api_state(&led, &shared, Some(leadership.clone()));
                                switch.set(api::router(state));
                                tasks = led.tasks;
                            }
                            Err(err) => leadership.step_down(LostLeadership::NotRenewed(format!(
                                "starting as the leader failed: {err}"
                            ))),
                        }
                        break;
                    }
                    Ok(None) => {}
                    Err(err) => tracing::warn!(error = %err, "reading the leadership lease failed"),
                }
                let newest = shared.events.store().newest_event_id().unwrap_or(seen);
                let stale =
                    clock.now_ms().saturating_sub(built_at) >= STANDBY_REBUILD.as_millis() as u64;
                if newest != seen || stale {
                    match Led::standby(&config, &shared, inventory.clone()) {
                        Ok(led) => {
                            let state = api_state(&led, &shared, Some(leadership.clone()));
                            switch.set(api::router(state));
                            (seen, built_at) = (newest, clock.now_ms());
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "reading the store for a standby's answers failed")
                        }
                    }
                }
            }
        }
        if leadership.role() == Role::Leader {
            tokio::spawn(leadership.clone().keep());
        }
        let why = leadership.lost().await;
        for task in tasks.handles {
            task.abort();
        }
        switch.stop(why);
    }
}

/// The API's state over `led`'s parts.
fn api_state(led: &Led, shared: &Shared, leadership: Option<Arc<Leadership>>) -> Arc<ApiState> {
    Arc::new(ApiState {
        engine: led.engine.clone(),
        queue: led.queue.clone(),
        alerts: led.tasks.alerts.clone(),
        leadership,
        shared: shared.api.clone(),
    })
}

/// Serves `app` on `listener` under `[listener]`'s deadlines and cap, over TLS with `[tls]`'s
/// certificate (read again on SIGHUP and when its files change).
fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stats: Arc<fleetmend_listener::ListenerStats>,
    config: &RepairerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<Result<(), ServiceError>>, ServiceError> {
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

/// The API in use: a standby's, then the leader's once this repairer takes the lead. The server
/// serves whichever is current; a lost lead stops it.
#[derive(Default)]
struct Switch {
    current: std::sync::RwLock<Option<axum::Router>>,
    lost: tokio::sync::watch::Sender<Option<LostLeadership>>,
}

impl Switch {
    fn set(&self, router: axum::Router) {
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(router);
    }

    /// The router the server runs: each request goes to the current API.
    fn router(self: &Arc<Self>) -> axum::Router {
        let switch = self.clone();
        axum::Router::new().fallback(move |request: axum::extract::Request| {
            let current =
                switch.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            async move {
                match current {
                    Some(mut router) => {
                        use tower_service::Service;
                        match router.call(request).await {
                            Ok(response) => response,
                            Err(never) => match never {},
                        }
                    }
                    None => axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
                }
            }
        })
    }

    /// Stops the server: this repairer no longer leads.
    fn stop(&self, why: LostLeadership) {
        self.lost.send_if_modified(|lost| lost.is_none() && lost.replace(why).is_none());
    }

    fn lost(&self) -> Option<LostLeadership> {
        self.lost.borrow().clone()
    }

    /// `shutdown`, or this repairer losing the lead, whichever comes first.
    fn stopped_or(
        self: &Arc<Self>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut lost = self.lost.subscribe();
        async move {
            tokio::select! {
                () = shutdown => {}
                _ = lost.wait_for(Option::is_some) => {}
            }
        }
    }
}

/// The URL this repairer is reached at: `[leadership] advertise`, else its scheme, the host's
/// name (or the listen address when it names one) and port.
fn advertised_url(config: &RepairerConfig, local_addr: SocketAddr) -> String {
    if let Some(url) = &config.leadership.advertise {
        return fleetmend_proto::repairers::normalise(url).unwrap_or_else(|_| url.clone());
    }
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let host =
        if local_addr.ip().is_unspecified() { hostname() } else { local_addr.ip().to_string() };
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    format!("{scheme}://{host}:{}", local_addr.port())
}

/// The inventory, where one is configured (marked on the nodes when this repairer leads).
async fn load_inventory(
    config: &RepairerConfig,
    events: &Arc<EventLog>,
) -> Result<Option<Arc<Inventory>>, ServiceError> {
    Ok(match &config.inventory {
        Some(inventory) => Some(Inventory::load(inventory, &config.slurm, events.clone()).await?),
        None => None,
    })
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
) -> Option<tokio::task::JoinHandle<()>> {
    let prober = prober?;
    let forward = tokio::spawn(forward_findings(findings, engine.clone(), FindingSource::Probe));
    prober.start();
    Some(forward)
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
