//! Starting, reloading and stopping a gateway.
//!
//! [`Gateway::start`] compiles the config, binds every listener (one `SO_REUSEPORT` socket per
//! worker, or one socket they all accept from), starts the worker threads and the admin
//! thread, and returns a [`Gateway`] handle.
//! Reload builds a new [`Snapshot`] off the request path and swaps it in atomically;
//! an invalid config is rejected and the running one kept. Shutdown is mini-redis style: one
//! `watch` signal, then each worker drains its connections until the drain deadline.

use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::watch;

use crate::access_log::AccessLog;
use crate::downstream::{bind_listener, ListenerCtx};
use crate::filter::{FilterSource, FilterSpec, Reloader};
use crate::metrics::Metrics;
use crate::snapshot::Snapshot;
use crate::tls::ListenerTls;
use crate::upstream::discovery::registry::Listed;
use crate::upstream::discovery::{self, Endpoint, Lists, Source};
use crate::upstream::limits::ClusterStates;
use crate::worker::{self, WorkerSockets};
use keymaster_config::{ClusterConfig, Config, DnsConfig};

/// Where the running config came from, so reloads know what to re-read.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// The embedded default config.
    Embedded,
    /// A TOML file, re-read on every reload.
    File(PathBuf),
    /// A config given in memory (tests, `keymaster proxy`); reload re-applies it.
    Memory,
}

impl ConfigSource {
    pub(crate) fn describe(&self) -> String {
        match self {
            ConfigSource::Embedded => "<embedded default>".into(),
            ConfigSource::File(p) => p.display().to_string(),
            ConfigSource::Memory => "<memory>".into(),
        }
    }
}

/// State shared by every thread of one gateway.
pub(crate) struct Shared {
    pub(crate) snapshot: ArcSwap<Snapshot>,
    pub(crate) metrics: Metrics,
    /// Every cluster's live counts (caps, queue, retry budget), kept across versions.
    cluster_states: ClusterStates,
    pub(crate) access_log: Option<AccessLog>,
    /// `[traces]` on: where sampled requests' spans go.
    pub(crate) traces: Option<crate::proxy::Tracing>,
    pub(crate) draining: AtomicBool,
    /// `POST /healthcheck/fail` on the admin listener: `/ready` answers 503 while requests
    /// are still served (`/healthcheck/ok` undoes it), to leave a load balancer first.
    pub(crate) failing_ready: AtomicBool,
    pub(crate) source: ConfigSource,
    /// Requests in flight in this gateway (load shedding).
    pub(crate) load: Arc<crate::overload::Load>,
    next_version: AtomicU64,
    reload_lock: Mutex<()>,
    /// TLS listeners by name: their certificates are re-read on every reload.
    listener_tls: Vec<(String, Arc<ListenerTls>)>,
    /// Filters registered in code, part of every config version's chain.
    natives: Vec<FilterSpec>,
    /// Filter sets built per version (Lua): asked again on every reload.
    sources: Vec<Arc<dyn FilterSource>>,
    /// Service discovery's current server lists (clusters with `discovery`).
    discovered: Mutex<Lists>,
    /// Wakes the discovery thread after a reload (new clusters, new intervals).
    pub(crate) discovery_wake: tokio::sync::Notify,
    /// The running version's number, sent after each swap: the health-check thread waits
    /// on it to rebuild its probes.
    versions: watch::Sender<u64>,
    /// Settings the last applied config changed that keep their running values until a
    /// restart (`restart_only.rs`).
    pub(crate) restart_required: Mutex<Vec<String>>,
}

impl Shared {
    /// Make `snap` the running version (the caller holds `reload_lock` and built it with
    /// the next version number) and tell the version's followers.
    fn swap_in(&self, snap: Snapshot) {
        let version = snap.version;
        self.next_version.store(version + 1, Ordering::Release);
        self.snapshot.store(Arc::new(snap));
        self.versions.send_replace(version);
    }

    /// Build and swap in a new config version. Routes, clusters and filters change; the
    /// restart-only settings keep their running values and are reported (`restart_only.rs`).
    pub(crate) fn apply(&self, config: Config) -> Result<u64, String> {
        let _serial = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = keymaster_config::validate(&config) {
            self.metrics.reloads.with_label_values(&["rejected"]).inc();
            tracing::error!(error = %e, "reload rejected; keeping the running config");
            return Err(e.to_string());
        }
        // Re-read every TLS listener's files first: a bad certificate rejects the reload.
        let tls = match crate::tls::rebuild(&self.listener_tls, &config.listeners) {
            Ok(t) => t,
            Err(e) => {
                self.metrics.reloads.with_label_values(&["rejected"]).inc();
                tracing::error!(error = %e, "reload rejected; keeping the running config");
                return Err(e);
            }
        };
        let mut config = config;
        let running = &self.snapshot.load().config;
        let restart_required = crate::restart_only::keep_running(running, &mut config);
        if !restart_required.is_empty() {
            tracing::warn!(
                keys = %restart_required.join(", "),
                "reload: these settings keep their running values until a restart"
            );
        }
        // Discovery clusters: unchanged ones keep their current list, others resolve now.
        let lists = {
            let previous = self.discovered.lock().unwrap_or_else(|e| e.into_inner());
            discovery::initial(&config, &previous)
        };
        let lists = match lists {
            Ok(l) => l,
            Err(e) => {
                self.metrics.reloads.with_label_values(&["rejected"]).inc();
                tracing::error!(error = %e, "reload rejected; keeping the running config");
                return Err(e);
            }
        };
        // Serialised by `reload_lock`: a rejected config does not use up a version number.
        let version = self.next_version.load(Ordering::Acquire);
        let built = crate::filter::collect_sources(&config, &self.natives, &self.sources).and_then(
            |filters| {
                Snapshot::build(
                    config,
                    version,
                    &self.metrics,
                    &self.cluster_states,
                    &filters,
                    &lists,
                )
            },
        );
        match built {
            Ok(snap) => {
                self.swap_in(snap);
                *self.discovered.lock().unwrap_or_else(|e| e.into_inner()) = lists;
                self.discovery_wake.notify_one();
                for (listener, settings) in tls {
                    listener.current.store(Arc::new(settings));
                }
                *self
                    .restart_required
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = restart_required;
                self.metrics.config_version.set(version as i64);
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                self.metrics.applied_now();
                tracing::info!(version, "config reloaded");
                Ok(version)
            }
            Err(e) => {
                self.metrics.reloads.with_label_values(&["rejected"]).inc();
                tracing::error!(error = %e, "reload rejected; keeping the running config");
                Err(e)
            }
        }
    }

    /// The Prometheus text of every metric, health gauges refreshed first, then the filter
    /// sources' own (the Lua host's HTTP client).
    pub(crate) fn render_metrics(&self) -> String {
        crate::upstream::health::export_gauges(&self.metrics, &self.snapshot.load().clusters);
        let mut text = self.metrics.render();
        for s in &self.sources {
            text.push_str(&s.metrics_text());
        }
        text
    }

    /// Service discovery resolved `cluster` (as configured with `dns`) to `endpoints`: when
    /// that differs from the running list, build a new version of the running config with it
    /// and swap it in (like a reload; a reload that changed the cluster meanwhile wins).
    /// `listed` (the registry's part) is kept either way, for the next round and reloads.
    pub(crate) fn apply_discovered(
        &self,
        cluster: &ClusterConfig,
        dns: &DnsConfig,
        endpoints: Vec<Endpoint>,
        listed: Option<Listed>,
    ) {
        let _serial = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot.load_full();
        let Some(source) = Source::of(cluster, dns) else {
            return;
        };
        let still = current
            .config
            .clusters
            .iter()
            .find(|c| c.name == cluster.name)
            .and_then(|c| Source::of(c, &current.config.dns));
        if still.as_ref() != Some(&source) {
            return;
        }
        let mut lists = self.discovered.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = lists.get_mut(&cluster.name) {
            if *d.endpoints == endpoints {
                d.listed = listed;
                return;
            }
        }
        let previous = lists.insert(
            cluster.name.clone(),
            discovery::Discovered {
                source,
                endpoints: Arc::new(endpoints),
                listed,
            },
        );
        let version = self.next_version.load(Ordering::Acquire);
        match Snapshot::build(
            current.config.clone(),
            version,
            &self.metrics,
            &self.cluster_states,
            // The running version's filters, sources' included (no source is asked again
            // for a discovery update).
            &current.filter_specs,
            &lists,
        ) {
            Ok(snap) => {
                self.swap_in(snap);
                self.metrics.config_version.set(version as i64);
                self.metrics
                    .discovery_updates
                    .with_label_values(&[&cluster.name])
                    .inc();
                tracing::info!(cluster = %cluster.name, version, "discovery changed the servers");
            }
            Err(e) => {
                // Keep the running list (and version).
                match previous {
                    Some(p) => lists.insert(cluster.name.clone(), p),
                    None => lists.remove(&cluster.name),
                };
                tracing::error!(cluster = %cluster.name, error = %e, "discovered servers rejected");
            }
        }
    }

    /// The settings the last applied config changed that need a restart.
    pub(crate) fn restart_required(&self) -> Vec<String> {
        self.restart_required
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-read the config source and apply it.
    pub(crate) fn reload_from_source(&self) -> Result<u64, String> {
        let config = match &self.source {
            ConfigSource::File(path) => keymaster_config::load_file(path).map_err(|e| {
                self.metrics.reloads.with_label_values(&["rejected"]).inc();
                e.to_string()
            })?,
            ConfigSource::Embedded => {
                keymaster_config::load_str(keymaster_config::DEFAULT_CONFIG, "<embedded default>")
                    .map_err(|e| e.to_string())?
            }
            ConfigSource::Memory => self.snapshot.load().config.clone(),
        };
        self.apply(config)
    }
}

/// Whether the access log's file can be opened for appending, as a start would (a file
/// this check creates is removed again).
fn check_access_log(cfg: &keymaster_config::AccessLogConfig) -> std::io::Result<()> {
    if !cfg.enabled || cfg.path == "-" {
        return Ok(());
    }
    let existed = std::path::Path::new(&cfg.path).exists();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cfg.path)?;
    if !existed {
        std::fs::remove_file(&cfg.path)?;
    }
    Ok(())
}

/// A running gateway.
pub struct Gateway {
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    /// The admin thread stops only after the workers have drained, so `/ready` can answer
    /// 503 (and `/metrics` be scraped) while draining.
    admin_shutdown: watch::Sender<bool>,
    admin_thread: Option<JoinHandle<()>>,
    listeners: Vec<(String, SocketAddr)>,
    admin: Option<SocketAddr>,
}

impl Gateway {
    /// Compile `config`, bind everything and start serving. Errors (bad config, address in
    /// use) are returned before any thread starts serving.
    pub fn start(config: Config, source: ConfigSource) -> Result<Gateway, String> {
        Self::start_with_filters(config, source, Vec::new())
    }

    /// [`Gateway::start`] with native filters registered in code: they join the
    /// `[[filters]]` of every config version (reloads included).
    pub fn start_with_filters(
        config: Config,
        source: ConfigSource,
        natives: Vec<FilterSpec>,
    ) -> Result<Gateway, String> {
        Self::start_with_sources(config, source, natives, Vec::new())
    }

    /// [`Gateway::start_with_filters`] plus filter sources (the Lua host): each is asked for
    /// its filters whenever a config version is built (now and on every reload).
    /// What [`Gateway::start_with_sources`] would refuse in `config`, found without binding
    /// a socket or starting a thread (`keymaster validate`): every problem, in one pass. The
    /// config's own rules were checked when it was loaded; these are the files and the
    /// filters: TLS certificates and keys, the access log's file, server lists and names
    /// (discovery), and every filter source (Lua files compiled, declarations checked).
    pub fn check(
        config: &Config,
        natives: Vec<FilterSpec>,
        sources: Vec<Arc<dyn FilterSource>>,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = check_access_log(&config.access_log) {
            problems.push(format!("access_log.path {}: {e}", config.access_log.path));
        }
        let metrics = Metrics::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let tls = l.tls.as_ref().map(|t| crate::tls::build(i, l.protocol, t));
            if let Some(Err(e)) = &tls {
                problems.push(e.clone());
            }
            if let Err(e) = ListenerCtx::new(l, metrics.listener(&l.name), None) {
                problems.push(e);
            }
        }
        let lists = discovery::initial(config, &Lists::new()).unwrap_or_else(|e| {
            problems.push(e);
            Lists::new()
        });
        match crate::filter::collect_sources(config, &natives, &sources) {
            Ok(filters) => {
                if let Err(e) = Snapshot::build(
                    config.clone(),
                    1,
                    &metrics,
                    &ClusterStates::default(),
                    &filters,
                    &lists,
                ) {
                    problems.push(e);
                }
            }
            Err(e) => problems.push(e),
        }
        problems
    }

    pub fn start_with_sources(
        config: Config,
        source: ConfigSource,
        natives: Vec<FilterSpec>,
        sources: Vec<Arc<dyn FilterSource>>,
    ) -> Result<Gateway, String> {
        let metrics = Metrics::new();
        let workers = match config.server.workers {
            0 => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            n => n,
        };
        crate::descriptors::prepare(&config, workers);
        let drain_timeout = config.server.drain_timeout.get();
        let access_log = if config.access_log.enabled {
            Some(
                AccessLog::open(&config.access_log, metrics.access_log_dropped.clone())
                    .map_err(|e| format!("access_log.path {}: {e}", config.access_log.path))?,
            )
        } else {
            None
        };
        let traces = crate::proxy::Tracing::start(&config.traces, &metrics)?;

        // Bind: the first socket of each listener fixes the port (port 0 works), then one
        // more per extra worker on the same address.
        let mut per_worker: Vec<WorkerSockets> = (0..workers)
            .map(|_| WorkerSockets {
                sockets: Vec::new(),
            })
            .collect();
        let mut listeners = Vec::new();
        let mut listener_tls = Vec::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let tls = match &l.tls {
                Some(t) => {
                    let tls = Arc::new(ListenerTls::new(crate::tls::build(i, l.protocol, t)?));
                    listener_tls.push((l.name.clone(), tls.clone()));
                    Some(tls)
                }
                None => None,
            };
            let first = bind_listener(l.address, l.reuse_port)
                .map_err(|e| format!("listener {}: bind {}: {e}", l.name, l.address))?;
            let addr = first
                .local_addr()
                .map_err(|e| format!("listener {}: {e}", l.name))?;
            let mut ctx = ListenerCtx::new(l, metrics.listener(&l.name), tls)?;
            ctx.bound = Some(addr).filter(|a| !a.ip().is_unspecified());
            let ctx = Arc::new(ctx);
            listeners.push((l.name.clone(), addr));
            for w in per_worker.iter_mut().skip(1) {
                // Each worker its own socket, or its own handle on the one socket.
                let s = if l.reuse_port {
                    bind_listener(addr, true)
                } else {
                    first.try_clone()
                };
                let s = s.map_err(|e| format!("listener {}: bind {addr}: {e}", l.name))?;
                w.sockets.push((ctx.clone(), s));
            }
            per_worker[0].sockets.push((ctx.clone(), first));
        }
        let admin_socket = match config.admin.listen {
            Some(a) => {
                Some(std::net::TcpListener::bind(a).map_err(|e| format!("admin.listen {a}: {e}"))?)
            }
            None => None,
        };
        let admin = admin_socket.as_ref().and_then(|s| s.local_addr().ok());
        let admin_settings = crate::admin::Settings::new(&config.admin);
        let (admin_shutdown, admin_rx) = watch::channel(false);
        let mut admin_thread = None;

        let lists = discovery::initial(&config, &Lists::new())?;
        let filters = crate::filter::collect_sources(&config, &natives, &sources)?;
        let cluster_states = ClusterStates::default();
        let snapshot = Snapshot::build(config, 1, &metrics, &cluster_states, &filters, &lists)?;
        let versions = watch::Sender::new(snapshot.version);
        metrics.config_version.set(1);
        metrics.applied_now();
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snapshot),
            metrics,
            cluster_states,
            access_log,
            traces,
            draining: AtomicBool::new(false),
            failing_ready: AtomicBool::new(false),
            source,
            load: Arc::default(),
            next_version: AtomicU64::new(2),
            reload_lock: Mutex::new(()),
            listener_tls,
            natives,
            sources,
            discovered: Mutex::new(lists),
            discovery_wake: tokio::sync::Notify::new(),
            versions,
            restart_required: Mutex::new(Vec::new()),
        });
        let (shutdown, rx) = watch::channel(false);
        let mut threads = Vec::new();
        for (i, sockets) in per_worker.into_iter().enumerate() {
            let shared = shared.clone();
            let rx = rx.clone();
            let t = std::thread::Builder::new()
                .name(format!("keymaster-worker-{i}"))
                .spawn(move || worker::run(i, shared, sockets, rx, drain_timeout))
                .map_err(|e| format!("cannot start worker thread: {e}"))?;
            threads.push(t);
        }
        // Active health checks: their own thread, stopped with the workers.
        threads.push(
            crate::upstream::checker::start(shared.clone(), rx.clone())
                .map_err(|e| format!("cannot start the health-check thread: {e}"))?,
        );
        threads.push(
            discovery::spawn(shared.clone(), rx.clone())
                .map_err(|e| format!("cannot start the discovery thread: {e}"))?,
        );
        if let Some(sock) = admin_socket {
            let shared = shared.clone();
            let rx = admin_rx;
            let t = crate::runtime_thread::spawn("keymaster-admin", move || async move {
                let _ = sock.set_nonblocking(true);
                match tokio::net::TcpListener::from_std(sock) {
                    Ok(l) => crate::admin::serve(shared, admin_settings, l, rx).await,
                    Err(e) => tracing::error!(error = %e, "cannot start admin listener"),
                }
            })
            .map_err(|e| format!("cannot start admin thread: {e}"))?;
            admin_thread = Some(t);
        }
        Ok(Gateway {
            shared,
            shutdown,
            threads,
            admin_shutdown,
            admin_thread,
            listeners,
            admin,
        })
    }

    /// The bound address of the named listener.
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
    }

    /// Every listener's name and bound address, in config order.
    pub fn listeners(&self) -> &[(String, SocketAddr)] {
        &self.listeners
    }

    /// `"https"` for a TLS listener, else `"http"` (for URLs that name it).
    pub fn listener_scheme(&self, name: &str) -> &'static str {
        if self.shared.listener_tls.iter().any(|(n, _)| n == name) {
            "https"
        } else {
            "http"
        }
    }

    /// The admin listener's bound address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// Swap in a new config; on error the running config stays.
    pub fn reload(&self, config: Config) -> Result<u64, String> {
        self.shared.apply(config)
    }

    /// Re-read the config source (the file given at start) and swap it in.
    pub fn reload_from_source(&self) -> Result<u64, String> {
        self.shared.reload_from_source()
    }

    /// A handle that reloads from another thread (a filter directory watcher).
    pub fn reloader(&self) -> Reloader {
        Reloader::new(Arc::downgrade(&self.shared) as std::sync::Weak<dyn keymaster_filter::Reload>)
    }

    /// The active config version.
    pub fn version(&self) -> u64 {
        self.shared.snapshot.load().version
    }

    /// The Prometheus text of every metric.
    pub fn metrics_text(&self) -> String {
        self.shared.render_metrics()
    }

    /// Stop accepting, drain in-flight requests (up to `server.drain_timeout`), and join
    /// every thread. Blocks.
    pub fn shutdown(self) {
        self.shared.draining.store(true, Ordering::Release);
        let _ = self.shutdown.send(true);
        for t in self.threads {
            let _ = t.join();
        }
        let _ = self.admin_shutdown.send(true);
        if let Some(t) = self.admin_thread {
            let _ = t.join();
        }
    }

    /// Serve until SIGTERM or SIGINT (then drain and return); SIGHUP reloads the config
    /// source; SIGUSR1 reopens the access log file (after logrotate renamed it). `signals` were installed before the gateway started (see [`Signals`]);
    /// `on_ready` runs first (print the banner there). Blocks the calling thread.
    pub fn run_until_signal(
        self,
        signals: Signals,
        on_ready: impl FnOnce(&Gateway),
    ) -> std::io::Result<()> {
        let Signals {
            rt,
            mut term,
            mut int,
            mut hup,
            mut usr1,
        } = signals;
        rt.block_on(async {
            on_ready(&self);
            loop {
                tokio::select! {
                    _ = term.recv() => break,
                    _ = int.recv() => break,
                    _ = usr1.recv() => {
                        // logrotate renamed the file: lines go to a new one at the path.
                        if let Some(log) = &self.shared.access_log {
                            log.reopen();
                            eprintln!("keymaster: SIGUSR1: reopening the access log");
                        }
                    }
                    _ = hup.recv() => {
                        let shared = self.shared.clone();
                        match tokio::task::spawn_blocking(move || shared.reload_from_source()).await {
                            Ok(Ok(v)) => eprintln!("keymaster: SIGHUP: config version {v} active"),
                            Ok(Err(e)) => eprintln!("keymaster: SIGHUP: reload rejected, keeping the running config:\n{e}"),
                            Err(e) => eprintln!("keymaster: SIGHUP: reload failed: {e}"),
                        }
                    }
                }
            }
            Ok::<_, std::io::Error>(())
        })?;
        eprintln!("keymaster: shutting down, draining in-flight requests");
        self.shutdown();
        Ok(())
    }
}

/// SIGTERM, SIGINT, SIGHUP and SIGUSR1 (reopen the access log), taken over from their
/// default actions. Install them before
/// [`Gateway::start`]: the workers serve as soon as they start, and a SIGTERM that arrived
/// before the handlers would kill the process instead of draining it.
pub struct Signals {
    rt: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (term, int, hup, usr1) = {
            let _in_runtime = rt.enter();
            (
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::hangup())?,
                signal(SignalKind::user_defined1())?,
            )
        };
        Ok(Signals {
            rt,
            term,
            int,
            hup,
            usr1,
        })
    }
}

impl keymaster_filter::Reload for Shared {
    fn reload_from_source(&self) -> Result<u64, String> {
        Shared::reload_from_source(self)
    }
}

impl crate::upstream::Host for Shared {
    fn versions(&self) -> watch::Receiver<u64> {
        self.versions.subscribe()
    }
    fn clusters(&self) -> Vec<Arc<crate::upstream::Cluster>> {
        self.snapshot.load().clusters.values().cloned().collect()
    }
    fn discovery_settings(
        &self,
    ) -> (
        Vec<keymaster_config::ClusterConfig>,
        keymaster_config::DnsConfig,
    ) {
        let snap = self.snapshot.load();
        (snap.config.clusters.clone(), snap.config.dns.clone())
    }
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
    fn apply_discovered(
        &self,
        cluster: &keymaster_config::ClusterConfig,
        dns: &keymaster_config::DnsConfig,
        endpoints: Vec<crate::upstream::discovery::Endpoint>,
        listed: Option<crate::upstream::discovery::registry::Listed>,
    ) {
        Shared::apply_discovered(self, cluster, dns, endpoints, listed);
    }
    fn discovered_listed(
        &self,
        cluster: &str,
    ) -> Option<crate::upstream::discovery::registry::Listed> {
        let lists = self.discovered.lock().unwrap_or_else(|e| e.into_inner());
        lists.get(cluster)?.listed.clone()
    }
    fn discovery_wake(&self) -> &tokio::sync::Notify {
        &self.discovery_wake
    }
}
