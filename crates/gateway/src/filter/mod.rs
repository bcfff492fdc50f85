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

pub(crate) use body::{
    read_request as read_request_body, read_response as read_response_body,
    set_length as set_body_length,
};
pub use ctx::{CtxState, FilterCtx};
pub(crate) use source::collect as collect_sources;
pub use source::{FilterSource, Reloader};
mod rate_limit_redis;

use futures_util::FutureExt;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use crate::body::ResponseBody;
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
    fn should_filter(&self, _ctx: &FilterCtx) -> bool {
        true
    }
    /// `false` for a filter whose `should_filter` is the default (always `true`): the chain
    /// then does not call it. Filters that override `should_filter` keep the default.
    fn has_should_filter(&self) -> bool {
        true
    }
    /// Do the filter's work. Synchronous filters return [`done`].
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a>;
    /// A `post` or `error` filter that reads the request headers says so: the chain then
    /// keeps a copy of them past the proxy stage (otherwise they are gone: the copy costs
    /// about as much as a small filter). Pass facts from `pre` to `post` in `meta` instead.
    fn needs_request_headers(&self) -> bool {
        false
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

    fn matches(&self, ctx: &FilterCtx) -> bool {
        if self.always {
            return true;
        }
        (self.routes.is_empty() || self.routes.iter().any(|r| **r == *ctx.route))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| ctx.path().starts_with(p))
            && (self.methods.is_empty() || self.methods.contains(&ctx.method))
            && self.headers.iter().all(|h| ctx.headers.contains_key(h))
    }
}

struct Entry {
    name: Arc<str>,
    stage: FilterStage,
    /// [`Filter::has_should_filter`], asked once.
    asks: bool,
    order: i32,
    matcher: Matcher,
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
    pub(crate) fn build(
        config: &keymaster_config::Config,
        natives: &[FilterSpec],
        metrics: &Metrics,
    ) -> Result<FilterChain, String> {
        let mut specs: Vec<FilterSpec> = Vec::new();
        for f in &config.filters {
            specs.extend(
                builtin::compile(f, &config.redis, metrics)
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
            entries.push(Entry {
                metrics: metrics.filter(&s.name),
                name: s.name.as_str().into(),
                stage: s.stage,
                asks: s.filter.has_should_filter(),
                order: s.order,
                matcher,
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
        let outbound = stages[2..]
            .iter()
            .copied()
            .flatten()
            .any(|e| e.filter.needs_request_headers() || !e.matcher.headers.is_empty());
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

    /// Run one stage's filters (or pre and route's, one after the other). `Err` is the first
    /// failure (pre/route/post); the error stage runs every filter whatever happens and
    /// never fails.
    async fn run_stage(&self, entries: &[Entry], ctx: &mut FilterCtx) -> Result<(), Failure> {
        for e in entries {
            let stage = e.stage;
            ctx.stage = stage;
            if matches!(stage, FilterStage::Pre | FilterStage::Route) && ctx.local.is_some() {
                break; // answered: the rest of pre/route is skipped
            }
            let should = e.matcher.matches(ctx)
                && (!e.asks
                    || match std::panic::catch_unwind(AssertUnwindSafe(|| {
                        e.filter.should_filter(ctx)
                    })) {
                        Ok(b) => b,
                        Err(p) => {
                            let f = self.failed(
                                e,
                                stage,
                                format!("should_filter panicked: {}", panic_text(&p)),
                            );
                            if stage == FilterStage::Error {
                                continue;
                            }
                            return Err(f);
                        }
                    });
            if !should {
                e.metrics.skips.inc();
                if let Some(d) = ctx.debug_trace() {
                    d.push(format!("{}:{}=skip", stage.as_str(), e.name));
                }
                continue;
            }
            e.metrics.invocations.inc();
            // The duration histogram samples runs (every one in debug mode): two clock reads
            // and a histogram update per run would cost more than a small filter itself.
            let started = (ctx.debugging() || sample_timing()).then(Instant::now);
            // A panic in `run` itself (synchronous filters) or while its future is polled.
            // A finished future (the common case) is taken as it is, without an await.
            let c = &mut *ctx;
            let r = match std::panic::catch_unwind(AssertUnwindSafe(move || {
                let c = c; // moved in: the closure is FnOnce, so the future may borrow it
                e.filter.run(c)
            })) {
                Ok(FilterFuture(Run::Ready(r))) => {
                    Ok(r.unwrap_or_else(|| Err("filter future polled after completion".into())))
                }
                Ok(f) => AssertUnwindSafe(f).catch_unwind().await,
                Err(p) => Err(p),
            };
            if let Some(started) = started {
                let took = started.elapsed();
                e.metrics.duration.observe(took.as_secs_f64());
                if let Some(d) = ctx.debug_trace() {
                    let what = match &r {
                        Ok(Ok(())) => "ran",
                        _ => "failed",
                    };
                    d.push(format!(
                        "{}:{}={what}/{}us",
                        stage.as_str(),
                        e.name,
                        took.as_micros()
                    ));
                }
            }
            let message = match r {
                Ok(Ok(())) => continue,
                Ok(Err(err)) => err.0,
                Err(p) => format!("panicked: {}", panic_text(&p)),
            };
            let f = self.failed(e, stage, message);
            if stage != FilterStage::Error {
                return Err(f);
            }
        }
        Ok(())
    }

    fn failed(&self, e: &Entry, stage: FilterStage, message: String) -> Failure {
        e.metrics.errors.inc();
        tracing::warn!(filter = %e.name, stage = stage.as_str(), error = %message, "filter failed");
        Failure {
            filter: e.name.clone(),
            stage,
            message,
        }
    }

    /// A filter failed: drop any response it set and run the error stage.
    async fn fail(&self, ctx: &mut FilterCtx, f: Failure) {
        ctx.local = None;
        ctx.extras().failure = Some(f);
        ctx.stage = FilterStage::Error;
        let _ = self.run_stage(self.stage(FilterStage::Error), ctx).await;
    }

    /// Debug mode: when the request carries the secret, trace this request's filters (and
    /// remove the header so it never reaches the origin).
    pub(crate) fn start_debug(&self, ctx: &mut FilterCtx) {
        if let Some((name, secret)) = &self.debug {
            let hit = ctx
                .headers
                .get(name)
                .is_some_and(|v| builtin::constant_time_eq(v.as_bytes(), secret));
            if hit {
                ctx.headers.remove(name);
                ctx.extras().debug = Some(Vec::new());
            }
        }
    }

    /// Debug mode: the trace as the `x-keymaster-filters` response header.
    fn stamp_debug(
        ctx: &mut FilterCtx,
        headers: &mut HeaderMap,
        raw: &mut Option<crate::headers::RawHead>,
    ) {
        if let Some(d) = ctx.extras_mut().and_then(|x| x.debug.take()) {
            if let Some(r) = raw.take() {
                *headers = r.to_map();
            }
            if let Ok(v) = HeaderValue::from_str(&d.join(", ")) {
                headers.insert(HeaderName::from_static("x-keymaster-filters"), v);
            }
        }
    }

    /// Run `pre` then `route`. `true`: proxy the request. `false`: answer it with
    /// [`FilterChain::local_response`] (a filter responded, or one failed).
    pub(crate) async fn inbound(&self, ctx: &mut FilterCtx) -> bool {
        if let Err(f) = self.run_stage(self.pre_and_route(), ctx).await {
            self.fail(ctx, f).await;
            return false;
        }
        ctx.local.is_none()
    }

    /// The request headers to forward after `inbound` (a copy stays for post/error filters).
    pub(crate) fn request_headers(&self, ctx: &mut FilterCtx) -> HeaderMap {
        if self.outbound {
            ctx.headers.clone()
        } else {
            std::mem::take(&mut ctx.headers)
        }
    }

    /// Run `post` over a proxied response head. `Err(response)`: a post filter failed and
    /// this (error-stage or 500) response replaces the origin's.
    /// `raw`: the origin's head in wire form, when kept so (`headers` is then empty); it
    /// comes back as it is, with fields appended, or as `None` with the fields in `headers`.
    pub(crate) async fn outbound(
        &self,
        ctx: &mut FilterCtx,
        status: &mut StatusCode,
        headers: &mut HeaderMap,
        raw: &mut Option<crate::headers::RawHead>,
        failed: impl Fn() -> Response<ResponseBody>,
    ) -> Result<(), Response<ResponseBody>> {
        let post = self.stage(FilterStage::Post);
        if post.is_empty() {
            Self::stamp_debug(ctx, headers, raw);
            return Ok(());
        }
        ctx.response = Some((*status, std::mem::take(headers)));
        ctx.raw_response = raw.take();
        match self.run_stage(post, ctx).await {
            Ok(()) => {
                let (s, h) = ctx.response.take().unwrap_or_default();
                *status = s;
                *headers = h;
                *raw = ctx.raw_response.take();
                ctx.raw_view = std::cell::OnceCell::new();
                Self::stamp_debug(ctx, headers, raw);
                Ok(())
            }
            Err(f) => {
                // The error stage sees the origin's head as a map.
                let _ = ctx.response_headers_mut();
                self.fail(ctx, f).await;
                let mut r = Self::assemble(ctx, &failed).0;
                Self::stamp_debug(ctx, r.headers_mut(), &mut None);
                Err(r)
            }
        }
    }

    /// The response for a request answered by the chain: the filter's response, the error
    /// stage's, or `failed()` (500); then the post filters over it (once: a failing post
    /// filter runs the error stage and its response goes out without another post pass).
    pub(crate) async fn local_response(
        &self,
        ctx: &mut FilterCtx,
        request_id: (&HeaderName, &HeaderValue),
        failed: impl Fn() -> Response<ResponseBody>,
    ) -> (Response<ResponseBody>, bool) {
        let (resp, was_failure) = Self::assemble(ctx, &failed);
        let (mut parts, body) = resp.into_parts();
        if !parts.headers.contains_key(request_id.0) {
            parts
                .headers
                .insert(request_id.0.clone(), request_id.1.clone());
        }
        let mut status = parts.status;
        match self
            .outbound(ctx, &mut status, &mut parts.headers, &mut None, &failed)
            .await
        {
            Ok(()) => {
                parts.status = status;
                (Response::from_parts(parts, body), was_failure)
            }
            Err(resp) => (resp, true),
        }
    }

    /// The proxy stage failed after the pre and route filters ran (502, 504, 413, ...): the
    /// error filters run with `failure()` naming filter `"proxy"` and the error category;
    /// their response, or `resp`, then goes through the post filters.
    pub(crate) async fn proxy_error(
        &self,
        ctx: &mut FilterCtx,
        category: &'static str,
        resp: Response<ResponseBody>,
        failed: &impl Fn() -> Response<ResponseBody>,
    ) -> Response<ResponseBody> {
        let (mut parts, mut body) = resp.into_parts();
        if !self.stage(FilterStage::Error).is_empty() {
            ctx.local = None;
            ctx.extras().failure = Some(Failure {
                filter: "proxy".into(),
                stage: FilterStage::Route,
                message: category.to_string(),
            });
            ctx.stage = FilterStage::Error;
            let _ = self.run_stage(self.stage(FilterStage::Error), ctx).await;
            if let Some(l) = ctx.local.take() {
                // Keep the gateway's own duties (request id, Connection: close) unless the
                // error filter set them.
                let mut headers = l.headers;
                for (name, value) in parts.headers.iter() {
                    if *name != http::header::CONTENT_TYPE && !headers.contains_key(name) {
                        headers.insert(name.clone(), value.clone());
                    }
                }
                parts.status = l.status;
                parts.headers = headers;
                body = ResponseBody::full(l.body);
            }
        }
        let mut status = parts.status;
        match self
            .outbound(ctx, &mut status, &mut parts.headers, &mut None, failed)
            .await
        {
            Ok(()) => {
                parts.status = status;
                Response::from_parts(parts, body)
            }
            Err(r) => r,
        }
    }

    /// `ctx.local` as a response, else `failed()`; the flag says whether it is a failure.
    fn assemble(
        ctx: &mut FilterCtx,
        failed: &impl Fn() -> Response<ResponseBody>,
    ) -> (Response<ResponseBody>, bool) {
        match ctx.local.take() {
            Some(l) => {
                let mut r = Response::new(ResponseBody::full(l.body));
                *r.status_mut() = l.status;
                *r.headers_mut() = l.headers;
                (r, ctx.failure().is_some())
            }
            None => (failed(), true),
        }
    }
}

/// One filter run in this many is timed for `keymaster_filter_duration_seconds`.
pub(crate) const TIMING_SAMPLE: u32 = 16;

thread_local! {
    static TIMING_TICK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether to time this filter run (one in [`TIMING_SAMPLE`], counted per worker thread).
fn sample_timing() -> bool {
    TIMING_TICK.with(|t| {
        let n = t.get().wrapping_add(1);
        t.set(n);
        n % TIMING_SAMPLE == 0
    })
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
