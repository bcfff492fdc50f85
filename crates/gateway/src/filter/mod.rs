//! The Zuul filter chain: `pre` → (proxy stage) → `post`, with `route` before the proxy
//! stage and `error` when a filter fails. The semantics are defined in `docs/filters.md`.
//!
//! A compiled [`FilterChain`] lives in the [`crate::snapshot::Snapshot`], so a request runs
//! exactly one chain version from its first filter to its last. Filters are `Send + Sync`
//! trait objects shared by every worker; [`Filter::run`] returns a non-`Send` future because
//! it runs on the worker's `LocalSet` (a Lua host can keep one VM per worker behind a
//! thread-local and await coroutines there). Mutable per-filter state (rate-limit buckets,
//! Redis connections) is per worker, in thread-locals: no lock on the request path.

mod body;
mod builtin;
mod ctx;
mod jwt;
mod source;
mod stage;

pub(crate) use body::{
    read_request as read_request_body, read_response as read_response_body,
    set_length as set_body_length,
};
pub(crate) use ctx::{ClusterChoice, FilterState, State};
pub use ctx::{FilterCtx, TestRequest};
pub(crate) use source::collect as collect_sources;
pub use source::{FilterSource, Reloader};
pub(crate) use stage::{staged, Staged};
mod rate_limit_redis;

use http::header::HeaderName;
use http::Method;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::metrics::{FilterMetrics, Metrics};
pub use keymaster_config::{FilterMatch, FilterStage};

/// What a filter's `run` returns: a future polled on the worker thread (not `Send`).
/// [`done`] makes a finished one without allocating (synchronous filters, the common case);
/// [`FilterFuture::new`] boxes an `async` block.
pub struct FilterFuture<'a>(Run<'a>);

enum Run<'a> {
    Ready(Option<Result<(), FilterError>>),
    Boxed(Pin<Box<dyn Future<Output = Result<(), FilterError>> + 'a>>),
}

impl<'a> FilterFuture<'a> {
    /// An asynchronous filter run (boxed).
    pub fn new(f: impl Future<Output = Result<(), FilterError>> + 'a) -> Self {
        FilterFuture(Run::Boxed(Box::pin(f)))
    }
}

impl Future for FilterFuture<'_> {
    type Output = Result<(), FilterError>;
    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Run::Ready(r) => std::task::Poll::Ready(
                r.take()
                    .unwrap_or_else(|| Err("filter future polled after completion".into())),
            ),
            Run::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

/// A filter failed: the chain runs the `error` stage, then answers 500 unless an error
/// filter set a response. The message goes to the log, never to the client.
#[derive(Debug, Clone)]
pub struct FilterError(pub String);

impl<T: Into<String>> From<T> for FilterError {
    fn from(s: T) -> Self {
        FilterError(s.into())
    }
}

/// A filter: native (Rust) or, later, a host for scripted filters.
///
/// `should_filter` is checked after the declarative match of its [`FilterSpec`]; `run`
/// does the work. Both may panic: the chain catches it and treats it as a failure.
pub trait Filter: Send + Sync + 'static {
    /// Whether to run for this request (default: always).
    fn should_filter(&self, _ctx: &FilterCtx<'_>) -> bool {
        true
    }
    /// `false` for a filter whose `should_filter` is the default (always `true`): the chain
    /// then does not call it. Filters that override `should_filter` keep the default.
    fn has_should_filter(&self) -> bool {
        true
    }
    /// Do the filter's work. Synchronous filters return [`done`].
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a>;
    /// `true` for a filter whose `run` always finishes without awaiting anything: it returns
    /// [`done`] (the built-ins and Lua files that cannot suspend say so). The chain runs such
    /// filters in a plain loop, without an async frame; a future one returns anyway is
    /// polled once and the filter fails if it is not finished then. The default, `false`,
    /// is right for any filter.
    fn synchronous(&self) -> bool {
        false
    }
    /// A `post` or `error` filter that reads the request headers says so: the chain then
    /// keeps a copy of them past the proxy stage (otherwise they are gone: the copy costs
    /// about as much as a small filter). Pass facts from `pre` to `post` in `meta` instead.
    fn needs_request_headers(&self) -> bool {
        false
    }
    /// Whether a `post` or `error` filter may read the request's path or query
    /// ([`FilterCtx::path`], [`FilterCtx::query`]). Say `false` only for filters that never
    /// do: when no filter of those stages reads them and none matches on a path, the chain
    /// keeps no copy of the request target past the proxy stage (they read as empty there).
    fn reads_request_line(&self) -> bool {
        true
    }
    /// Whether the filter may read the request headers (through
    /// [`FilterCtx::request_headers`], also in `should_filter`). Say `false` only for filters
    /// that never do: when no filter of a chain reads them and no declarative match names a
    /// header, a request id the gateway generates is not put in the map for filters to see
    /// (it is added on the way to the origin, which saves a map insert per request).
    fn reads_request_headers(&self) -> bool {
        true
    }
    /// A `pre` or `route` filter that reads or replaces the request body says so: for requests
    /// it matches (declaratively), the body is buffered before the `pre` stage, up to
    /// `[filter_body] max_request` (413 past it). See [`FilterCtx::request_body`].
    fn needs_request_body(&self) -> bool {
        false
    }
    /// A `post` filter that reads or replaces the response body says so: for requests it
    /// matches, the origin's body is buffered before the `post` stage, up to
    /// `[filter_body] max_response` (502 past it). See [`FilterCtx::response_body`].
    fn needs_response_body(&self) -> bool {
        false
    }
}

/// A finished [`FilterFuture`] for filters that do not await anything (no allocation).
pub fn done<'a>(result: Result<(), FilterError>) -> FilterFuture<'a> {
    FilterFuture(Run::Ready(Some(result)))
}

/// A filter registered in code, added to every config version's chain (see
/// [`crate::Gateway::start_with_filters`]).
#[derive(Clone)]
pub struct FilterSpec {
    /// Unique among all filters (config ones included); the metrics label.
    pub name: String,
    pub stage: FilterStage,
    /// Lower first; ties broken by name.
    pub order: i32,
    /// Declarative match, checked before `should_filter`.
    pub matches: FilterMatch,
    pub filter: Arc<dyn Filter>,
}

impl FilterSpec {
    pub fn new(
        name: impl Into<String>,
        stage: FilterStage,
        order: i32,
        filter: impl Filter,
    ) -> FilterSpec {
        FilterSpec {
            name: name.into(),
            stage,
            order,
            matches: FilterMatch::default(),
            filter: Arc::new(filter),
        }
    }
    /// With a declarative match.
    pub fn with_match(mut self, m: FilterMatch) -> FilterSpec {
        self.matches = m;
        self
    }
}

/// Which filter failed, in which stage, and why (seen by `error` filters).
#[derive(Debug, Clone)]
pub struct Failure {
    pub filter: Arc<str>,
    pub stage: FilterStage,
    pub message: String,
}

/// A config version's clusters by name.
pub(crate) type Clusters = rustc_hash::FxHashMap<String, Arc<crate::upstream::Cluster>>;

/// A declarative match compiled.
struct Matcher {
    /// Nothing to check: every request matches.
    always: bool,
    routes: Vec<String>,
    path_prefix: Option<String>,
    methods: Vec<Method>,
    headers: Vec<HeaderName>,
}

impl Matcher {
    fn compile(m: &FilterMatch) -> Result<Matcher, String> {
        Ok(Matcher {
            always: m.routes.is_empty()
                && m.path_prefix.is_none()
                && m.methods.is_empty()
                && m.headers.is_empty(),
            routes: m.routes.clone(),
            path_prefix: m.path_prefix.clone(),
            methods: m
                .methods
                .iter()
                .map(|s| Method::from_bytes(s.as_bytes()).map_err(|e| format!("{s}: {e}")))
                .collect::<Result<_, _>>()?,
            headers: m
                .headers
                .iter()
                .map(|s| HeaderName::from_bytes(s.as_bytes()).map_err(|e| format!("{s}: {e}")))
                .collect::<Result<_, _>>()?,
        })
    }

    #[inline(always)]
    fn matches(&self, ctx: &FilterCtx<'_>) -> bool {
        self.always || self.check(ctx)
    }

    /// Every condition given holds.
    fn check(&self, ctx: &FilterCtx<'_>) -> bool {
        (self.routes.is_empty() || self.routes.iter().any(|r| **r == *ctx.route()))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| ctx.path().starts_with(p))
            && (self.methods.is_empty() || self.methods.contains(ctx.method()))
            && self
                .headers
                .iter()
                .all(|h| ctx.request_header(h.as_str()).is_some())
    }
}

struct Entry {
    name: Arc<str>,
    stage: FilterStage,
    /// [`Filter::has_should_filter`], asked once.
    asks: bool,
    /// [`Filter::synchronous`], asked once.
    synchronous: bool,
    /// Synchronous, matching every request, no `should_filter`: nothing to decide before
    /// running it (the stage loop's short path).
    plain: bool,
    order: i32,
    /// Boxed: the stage loop's short path never reads it, and entries this much smaller
    /// share cache lines (a request with filters reads every entry of its stages).
    matcher: Box<Matcher>,
    filter: Arc<dyn Filter>,
    metrics: FilterMetrics,
}

/// One config version's filters, sorted per stage by (order, name).
pub(crate) struct FilterChain {
    /// Every filter, in run order: pre, route, post, error; each stage sorted by (order,
    /// name). Stage `i` is `entries[bounds[i]..bounds[i + 1]]`, so pre and route together
    /// are one slice, run by one loop.
    entries: Vec<Entry>,
    bounds: [usize; 5],
    /// Debug mode: the header and the secret it must carry.
    debug: Option<(HeaderName, Vec<u8>)>,
    empty: bool,
    /// Post or error filters read request headers: they get a copy.
    outbound: bool,
    /// Post or error filters may read the request target: they get a copy.
    outbound_line: bool,
    /// Some filter reads the request headers (or a match names one): a generated request
    /// id goes into the map for filters to see.
    reads_request_headers: bool,
    /// Some pre/route filter reads the request body; some post filter the response body.
    request_body: bool,
    response_body: bool,
}

fn idx(stage: FilterStage) -> usize {
    match stage {
        FilterStage::Pre => 0,
        FilterStage::Route => 1,
        FilterStage::Post => 2,
        FilterStage::Error => 3,
    }
}

impl FilterChain {
    /// Compile the config's `[[filters]]` plus the filters registered in code.
    /// `clusters`: the config version's, for filters that choose one by name.
    pub(crate) fn build(
        config: &keymaster_config::Config,
        natives: &[FilterSpec],
        metrics: &Metrics,
        clusters: &Clusters,
    ) -> Result<FilterChain, String> {
        let mut specs: Vec<FilterSpec> = Vec::new();
        for f in &config.filters {
            specs.extend(
                builtin::compile(f, &config.redis, metrics, clusters)
                    .map_err(|e| format!("filter {}: {e}", f.name))?,
            );
        }
        for n in natives {
            if config.filters.iter().any(|f| f.name == n.name) {
                return Err(format!(
                    "filter {}: the name is used by a native filter and a [[filters]] table",
                    n.name
                ));
            }
            specs.push(n.clone());
        }
        let mut entries = Vec::with_capacity(specs.len());
        for s in specs {
            let matcher =
                Matcher::compile(&s.matches).map_err(|e| format!("filter {}: {e}", s.name))?;
            let (asks, synchronous) = (s.filter.has_should_filter(), s.filter.synchronous());
            entries.push(Entry {
                metrics: metrics.filter(&s.name),
                name: s.name.as_str().into(),
                stage: s.stage,
                asks,
                synchronous,
                plain: synchronous && !asks && matcher.always,
                order: s.order,
                matcher: Box::new(matcher),
                filter: s.filter,
            });
        }
        entries.sort_by(|a, b| {
            (idx(a.stage), a.order)
                .cmp(&(idx(b.stage), b.order))
                .then_with(|| a.name.cmp(&b.name))
        });
        let mut bounds = [0; 5];
        for (i, b) in bounds.iter_mut().enumerate() {
            *b = entries.iter().filter(|e| idx(e.stage) < i).count();
        }
        let stages: [&[Entry]; 4] = std::array::from_fn(|i| &entries[bounds[i]..bounds[i + 1]]);
        let d = &config.filter_debug;
        let debug = match &d.secret {
            Some(secret) => Some((
                HeaderName::from_bytes(d.header.as_bytes()).map_err(|e| e.to_string())?,
                secret.as_bytes().to_vec(),
            )),
            None => None,
        };
        // The post and error filters: what they read of the request is kept for them.
        let after_proxy = || stages[2..].iter().copied().flatten();
        let outbound = after_proxy()
            .any(|e| e.filter.needs_request_headers() || !e.matcher.headers.is_empty());
        let outbound_line =
            after_proxy().any(|e| e.filter.reads_request_line() || e.matcher.path_prefix.is_some());
        let request_body = stages[..2]
            .iter()
            .copied()
            .flatten()
            .any(|e| e.filter.needs_request_body());
        let response_body = stages[2].iter().any(|e| e.filter.needs_response_body());
        let reads_request_headers = entries
            .iter()
            .any(|e| e.filter.reads_request_headers() || !e.matcher.headers.is_empty());
        Ok(FilterChain {
            reads_request_headers,
            request_body,
            response_body,
            debug,
            empty: entries.is_empty(),
            outbound,
            outbound_line,
            entries,
            bounds,
        })
    }

    /// No filters at all: the request path skips the chain entirely.
    pub(crate) fn is_empty(&self) -> bool {
        self.empty
    }

    /// Whether a generated request id goes into the request map before the filters run
    /// (some filter may read the request headers), rather than being added on the way out.
    pub(crate) fn wants_request_id_in_map(&self) -> bool {
        self.reads_request_headers // false for an empty chain
    }

    /// The filter names of a stage in run order (for tests and docs).
    #[allow(dead_code)]
    pub(crate) fn names(&self, stage: FilterStage) -> Vec<&str> {
        self.stage(stage).iter().map(|e| &*e.name).collect()
    }

    /// The pre filters then the route filters, in run order.
    fn pre_and_route(&self) -> &[Entry] {
        &self.entries[..self.bounds[2]]
    }

    /// One stage's filters, in run order.
    fn stage(&self, stage: FilterStage) -> &[Entry] {
        let i = idx(stage);
        &self.entries[self.bounds[i]..self.bounds[i + 1]]
    }
}
