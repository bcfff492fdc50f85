//! The Zuul filter chain: `pre` → (proxy stage) → `post`, with `route` before the proxy
//! stage and `error` when a filter fails. The semantics are defined in `docs/filters.md`.
//!
//! A compiled [`FilterChain`] lives in the [`crate::snapshot::Snapshot`], so a request runs
//! exactly one chain version from its first filter to its last. Filters are `Send + Sync`
//! trait objects shared by every worker; [`Filter::run`] returns a non-`Send` future because
//! it runs on the worker's local runtime (a Lua host can keep one VM per worker behind a
//! thread-local and await coroutines there). Mutable per-filter state (rate-limit buckets,
//! Redis connections) is per worker, in thread-locals: no lock on the request path.

mod body;
mod builtin;
mod jwt;
mod rate_limit_redis;
mod stage;

pub(crate) use body::{
    read_request as read_request_body, read_response as read_response_body,
    set_length as set_body_length,
};
pub(crate) use keymaster_filter::host::{ClusterChoice, FilterState, State};
pub use keymaster_filter::{
    done, Failure, Filter, FilterCtx, FilterError, FilterFuture, FilterMatch, FilterSource,
    FilterSpec, FilterStage, Needs, Reloader, TestRequest,
};
pub(crate) use stage::{staged, Staged};

use http::header::HeaderName;
use http::Method;
use keymaster_config::Config;
use std::sync::Arc;

use crate::metrics::{FilterMetrics, Metrics};

pub(crate) use crate::upstream::Clusters;

/// The status a built-in filter type rejects requests with.
fn rejects_with(kind: keymaster_config::FilterType) -> Option<u16> {
    use keymaster_config::FilterType as T;
    match kind {
        T::ApiKey | T::Jwt => Some(401),
        T::IpFilter => Some(403),
        T::RateLimit => Some(429),
        _ => None,
    }
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
    /// [`Filter::needs`], asked once.
    needs: Needs,
    /// Synchronous and matching every request: the stage loop's short path (asked and run
    /// under one `catch_unwind`, no clock read unless the request is timed).
    plain: bool,
    order: i32,
    /// Boxed: entries this much smaller share cache lines (a request with filters reads
    /// every entry of its stages).
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
            // A `type = "native"` table is built by a filter source under its own name.
            let table = config.filters.iter().find(|f| f.name == n.name);
            if table.is_some_and(|f| f.kind != keymaster_config::FilterType::Native) {
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
            let needs = s.filter.needs();
            let m = metrics.filter(&s.name);
            // The statuses a built-in filter rejects with exist at zero from the start.
            let kind = config
                .filters
                .iter()
                .find(|f| f.name == s.name)
                .map(|f| f.kind);
            if let Some(status) = kind.and_then(rejects_with) {
                m.rejections.expect(status);
            }
            entries.push(Entry {
                metrics: m,
                name: s.name.as_str().into(),
                stage: s.stage,
                plain: needs.contains(Needs::SYNCHRONOUS) && matcher.always,
                needs,
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
        let outbound = after_proxy().any(|e| {
            e.needs.contains(Needs::REQUEST_HEADERS_AFTER_PROXY) || !e.matcher.headers.is_empty()
        });
        let outbound_line = after_proxy()
            .any(|e| e.needs.contains(Needs::REQUEST_LINE) || e.matcher.path_prefix.is_some());
        let request_body = stages[..2]
            .iter()
            .copied()
            .flatten()
            .any(|e| e.needs.contains(Needs::REQUEST_BODY));
        let response_body = stages[2]
            .iter()
            .any(|e| e.needs.contains(Needs::RESPONSE_BODY));
        let reads_request_headers = entries
            .iter()
            .any(|e| e.needs.contains(Needs::REQUEST_HEADERS) || !e.matcher.headers.is_empty());
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

/// Every source's filters for `config`, after the ones registered in code.
pub(crate) fn collect_sources(
    config: &Config,
    natives: &[FilterSpec],
    sources: &[Arc<dyn FilterSource>],
) -> Result<Vec<FilterSpec>, String> {
    let mut all = natives.to_vec();
    for s in sources {
        all.extend(s.build(config)?);
    }
    Ok(all)
}
